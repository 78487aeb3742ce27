"""test_state_races.py -- calls racing a hibernate, wake, pause or resume of their sandbox: each
either waits for the state change and is served, or answers 409 (conflict, sandbox_paused); never
500 or a 502 from a guest that was only being checkpointed or restored. Bounded: a few workers for
a fixed number of state changes."""

import collections
import os
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
import moatd  # noqa: E402

CYCLES = 8
WORKERS = 4


class StateRaceTest(unittest.TestCase):
    def setUp(self):
        self.d = moatd.MoatDaemon(pool=1)
        self.addCleanup(self.d.stop)
        self.d.start()
        self.c = self.d.client
        ck = self.c.healthz().get("checkpoints") or {}
        if not ck.get("available"):
            self.skipTest("checkpoints unavailable on this host: %s" % ck.get("criu"))

    def hammer(self, sid, change):
        """Runs WORKERS threads of exec / file calls on sid while change() runs in this thread; returns
        {(route, status, code): count} of the workers' answers."""
        seen = collections.Counter()
        bad = []
        stop = threading.Event()
        lock = threading.Lock()
        client = moatd.Client(self.d.port, self.c.key, timeout=120)

        def call(route, method, path, **kw):
            try:
                st, body = client.request(method, path, expect=tuple(range(100, 600)), **kw)
            except Exception as e:  # a broken connection is a failure too
                st, body = 0, {"code": type(e).__name__, "message": str(e)[:200]}
            code = body.get("code") if isinstance(body, dict) else None
            with lock:
                seen[(route, st, code)] += 1
                if (st >= 500 or st == 0) and len(bad) < 20:
                    bad.append((route, st, body))

        def worker(i):
            n = 0
            while not stop.is_set():
                n += 1
                call("exec", "POST", "/v1/sandboxes/%s/exec" % sid, body={"argv": ["echo", "ok"]})
                if i == 0:  # a call still running inside when the state changes
                    call("exec-long", "POST", "/v1/sandboxes/%s/exec" % sid, body={"cmd": "sleep 0.3; echo ok"})
                call("put", "PUT", "/v1/sandboxes/%s/files" % sid, raw=b"x" * 100,
                     query={"path": "/tmp/w%d-%d" % (i, n % 4)}, headers={"Content-Type": "application/octet-stream"})
                call("get", "GET", "/v1/sandboxes/%s/files" % sid, query={"path": "/etc/hostname"})
                call("list", "GET", "/v1/sandboxes/%s/files/list" % sid, query={"path": "/tmp"})
        ts = [threading.Thread(target=worker, args=(i,)) for i in range(WORKERS)]
        for t in ts:
            t.start()
        try:
            change()
        finally:
            stop.set()
            for t in ts:
                t.join(120)
        return seen, bad

    def post(self, sid, what, expect=200):
        return self.c.request("POST", "/v1/sandboxes/%s/%s" % (sid, what), body={}, expect=expect, timeout=120)[1]

    def report(self, what, seen):
        sys.stderr.write("[%s: %s] " % (what, ", ".join("%s %d%s x%d" % (r, s, " " + c if c else "", n)
                                                        for (r, s, c), n in sorted(seen.items()))))

    def test_calls_racing_hibernate_and_wake(self):
        sid = self.c.create(ttl_seconds=900)["id"]

        def change():
            for _ in range(CYCLES):
                self.assertEqual(self.post(sid, "hibernate")["state"], "hibernated")
                time.sleep(0.05)
                self.assertEqual(self.post(sid, "wake")["state"], "running")
                time.sleep(0.05)
        seen, bad = self.hammer(sid, change)
        self.report("hibernate/wake", seen)
        self.assertEqual(bad, [], "5xx (or a broken connection) from calls racing hibernate/wake")
        self.assertEqual(self.c.sh(sid, "echo ok"), "ok\n")
        self.c.delete(sid)

    def test_calls_racing_pause_and_resume(self):
        sid = self.c.create(ttl_seconds=900)["id"]

        def change():
            for _ in range(CYCLES * 3):
                self.assertEqual(self.post(sid, "pause")["state"], "paused")
                time.sleep(0.02)
                self.assertEqual(self.post(sid, "resume")["state"], "running")
                time.sleep(0.02)
        seen, bad = self.hammer(sid, change)
        self.report("pause/resume", seen)
        self.assertEqual(bad, [], "5xx (or a broken connection) from calls racing pause/resume")
        self.c.delete(sid)

    def test_calls_racing_snapshot_and_fork(self):
        sid = self.c.create(ttl_seconds=900)["id"]

        def change():
            for _ in range(CYCLES // 2):
                snap = self.post(sid, "snapshots", expect=201)
                self.c.request("DELETE", "/v1/snapshots/" + snap["id"], expect=204)
                kids = self.post(sid, "fork", expect=(200, 201))["sandboxes"]
                for k in kids:
                    self.c.delete(k["id"])
        seen, bad = self.hammer(sid, change)
        self.report("snapshot/fork", seen)
        self.assertEqual(bad, [], "5xx (or a broken connection) from calls racing snapshot/fork")
        self.c.delete(sid)

    def test_hibernate_waits_for_a_running_exec_then_409(self):
        """An exec running when a hibernate comes is not cut (it used to be: 502 sandbox_unreachable):
        the hibernate waits for it, and after its bound (5 s) answers 409 conflict, changing nothing."""
        sid = self.c.create(ttl_seconds=900)["id"]
        res = {}

        def long_exec():
            res["r"] = self.c.request("POST", "/v1/sandboxes/%s/exec" % sid,
                                      body={"cmd": "sleep 8; echo done"}, expect=(200, 409, 502), timeout=60)
        t = threading.Thread(target=long_exec)
        t.start()
        time.sleep(0.5)
        t0 = time.time()
        st, body = self.c.request("POST", "/v1/sandboxes/%s/hibernate" % sid, body={}, expect=(200, 409), timeout=60)
        waited = time.time() - t0
        t.join(60)
        self.assertEqual(res["r"][0], 200, "the exec running during the hibernate: %r" % (res["r"],))
        self.assertEqual(res["r"][1]["stdout"], "done\n")
        self.assertEqual((st, body.get("code")), (409, "conflict"), body)
        self.assertIn("exec call", body["message"])
        self.assertLess(waited, 30, "the hibernate waited unbounded")
        self.assertEqual(self.c.get(sid)["state"], "running")
        # once it ended, the hibernate goes through
        self.assertEqual(self.post(sid, "hibernate")["state"], "hibernated")
        self.assertEqual(self.c.sh(sid, "echo ok"), "ok\n")
        self.c.delete(sid)

"""test_crash.py -- kill -9 of moatd, then a restart on the same data dir: live sandboxes are adopted,
dead ones are marked killed (host_restart), and after deleting everything nothing is left on the host:
no cgroup dirs, processes, mounts, loop devices or net namespaces."""

import os
import re
import sys
import threading
import time
import unittest
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
import moatd  # noqa: E402
import probe  # noqa: E402


def pid_alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


class CrashTest(unittest.TestCase):
    def setUp(self):
        self.d = moatd.MoatDaemon(pool=2)
        self.addCleanup(self.d.stop)
        self.d.start()
        self.c = self.d.client

    def start_marker(self, sid, tag):
        """Starts a detached sleeper tagged `tag` in sandbox sid; returns (inner pid, host pid)."""
        probe.install(self.c, sid)
        r = probe.run(self.c, sid, "sleepd", 3600, tag)
        self.assertTrue(r.ok, r)
        inner = int(r.fields["pid"])
        deadline = time.time() + 5
        host = []
        while time.time() < deadline and not host:
            host = moatd.find_pids_by_cmdline(tag)
            time.sleep(0.05)
        self.assertEqual(len(host), 1, "host pid of marker %s: %r" % (tag, host))
        return inner, host[0]

    def test_kill9_adopt_and_reconcile(self):
        tag = "moat-crash-" + uuid.uuid4().hex[:10]
        live = self.c.create(ttl_seconds=3600)["id"]
        dead = self.c.create(ttl_seconds=3600)["id"]
        pers = self.c.create(persistent=True)["id"]
        markers = {}
        netns = set()
        for name, sid in (("live", live), ("dead", dead), ("pers", pers)):
            inner, host = self.start_marker(sid, "%s-%s" % (tag, name))
            markers[name] = (inner, host)
            netns.add(os.stat("/proc/%d/ns/net" % host).st_ino)
        self.assertEqual(len(netns), 3, "sandboxes share a net namespace")
        self.assertNotIn(os.stat("/proc/self/ns/net").st_ino, netns)
        self.c.put_file(live, "/root/state.txt", b"kept across the crash")

        self.d.kill9()
        time.sleep(0.3)
        # the sandboxes outlive moatd
        for name, (_, host) in markers.items():
            self.assertTrue(pid_alive(host), "%s sandbox died with moatd" % name)
        self.assertFalse(pid_alive(self.d.proc.pid))
        self.assertEqual(self.d.stray_children(), [], "forked moatd children outlived moatd")

        # kill every process of `dead` while moatd is down
        dead_host = markers["dead"][1]
        slot_dirs = [d for d in moatd.pid_cgroup_dirs(dead_host) if "/slot-" in d]
        self.assertTrue(slot_dirs, "no slot cgroup for pid %d: %r" % (dead_host, moatd.pid_cgroup_dirs(dead_host)))
        slot = re.match(r"(.*/slot-[^/]+)", slot_dirs[0]).group(1)
        self.assertTrue(moatd.kill_cgroup_tree(slot))
        deadline = time.time() + 5
        while pid_alive(dead_host) and time.time() < deadline:
            time.sleep(0.05)
        self.assertFalse(pid_alive(dead_host))

        self.d.start()
        self.c = self.d.client
        g = self.c.get(live)
        self.assertEqual(g["state"], "running", g)
        r = self.c.exec(live, argv=["cat", "/root/state.txt"])
        self.assertEqual(r["stdout"], "kept across the crash")
        r = probe.run(self.c, live, "kill", markers["live"][0], 0)
        self.assertTrue(r.ok, "marker process of the adopted sandbox is gone: %r" % r)
        self.assertTrue(pid_alive(markers["live"][1]))
        self.assertEqual(self.c.get(pers)["state"], "running")
        self.assertEqual(self.c.exec(pers, argv=["true"])["exit_code"], 0)

        st, k = self.c.request("GET", "/v1/sandboxes/" + dead, expect=(200, 404))
        if st == 404:
            k = [s for s in self.c.list(state="killed") if s["id"] == dead]
            self.assertTrue(k, "dead sandbox not listed as killed")
            k = k[0]
        self.assertEqual(k["state"], "killed")
        self.assertEqual(k["killed_reason"], "host_restart")
        self.assertNotIn(dead, [s["id"] for s in self.c.list(state="running")])

        # the restarted daemon still creates
        fresh = self.c.create()["id"]
        self.assertEqual(self.c.exec(fresh, argv=["true"])["exit_code"], 0)

        for sid in (live, pers, fresh):
            self.c.delete(sid)
        self.assertEqual(self.c.list(), [])
        deadline = time.time() + 10  # teardown may finish off the request path
        while time.time() < deadline and any(pid_alive(h) for _, h in markers.values()):
            time.sleep(0.05)
        for name, (_, host) in markers.items():
            self.assertFalse(pid_alive(host), "%s sandbox process %d survived DELETE by 10 s" % (name, host))
        rc = self.d.terminate()
        self.assertEqual(rc, 0, "moatd did not exit cleanly on SIGTERM: %s" % self.d.log_tail())
        left = self.d.leftovers(netns=netns)
        self.assertEqual(left, {}, "leftovers after delete + stop")

    def test_kill9_during_creates(self):
        """kill -9 while creates are in flight; after a restart and deleting all, nothing leaks."""
        errs = []
        quick = moatd.Client(self.d.port, self.c.key, timeout=20)

        def create():
            try:
                quick.create()
            except Exception as e:  # the connection dies with moatd: expected
                errs.append(e)
        ts = [threading.Thread(target=create) for _ in range(6)]
        for t in ts:
            t.start()
        time.sleep(0.02)
        self.d.kill9()
        for t in ts:
            t.join(30)
        hung = [e for e in errs if "timed out" in str(e)]
        self.assertEqual(hung, [], "client connections outlived moatd (a forked child holds them): %s"
                         % moatd.find_pids_by_cmdline("--data-dir\0" + self.d.data_dir + "\0"))
        self.d.start()
        self.c = self.d.client
        for s in self.c.list():
            self.assertEqual(s["state"], "running", s)
            self.assertEqual(self.c.exec(s["id"], argv=["true"])["exit_code"], 0)
            self.c.delete(s["id"])
        self.d.kill9()  # a second crash with the warm pool populated
        self.d.start()
        self.c = self.d.client
        self.assertEqual(self.c.list(), [])
        rc = self.d.terminate()
        self.assertEqual(rc, 0)
        self.assertEqual(self.d.leftovers(), {}, "leftovers after crash during create")


HOLDER = r"""
import os, sys, time
secret, n = os.urandom(8).hex(), 0
blob = bytearray(int(sys.argv[1]) * 1048576)
for i in range(0, len(blob), 4096):
    blob[i] = 1
while True:
    n += 1
    with open("/root/state.tmp", "w") as f:
        f.write("%s %d" % (secret, n))
    os.rename("/root/state.tmp", "/root/state")
    time.sleep(0.05)
"""

# Where a checkpoint can be cut short (src/common/crashpoint.h; the names are the code's).
CHECKPOINT_POINTS = ("checkpoint.frozen", "criu.dump", "checkpoint.dumped", "checkpoint.written")


class CrashPointTest(unittest.TestCase):
    """moatd dies (SIGKILL at a named point, MOAT_CRASH_AT) in the middle of a hibernate, snapshot, fork
    or wake; after a restart on the same data dir no sandbox that was running is lost: it runs on, or
    is paused or hibernated with a complete image that wakes with its memory, and nothing is recorded
    killed (host_restart). Only what was never acknowledged (a fork's child, a snapshot) may be absent.
    A Python process keeps a random secret and a counter in memory only: memory survived when the
    secret is the same and the counter goes on."""

    def setUp(self):
        self.d = moatd.MoatDaemon(pool=0)
        self.addCleanup(self.d.stop)
        self.d.start()
        self.c = self.d.client
        ck = self.c.healthz().get("checkpoints") or {}
        if not ck.get("available"):
            self.skipTest("checkpoints unavailable on this host: %s" % ck.get("criu"))
        self.outcomes = {}

    def tearDown(self):
        if self.outcomes:
            sys.stderr.write("[%s] " % ", ".join("%s: %s" % kv for kv in self.outcomes.items()))

    # -- helpers --
    def holder(self, mb=0):
        sid = self.c.create(ttl_seconds=3600)["id"]
        self.c.put_file(sid, "/root/holder.py", HOLDER.encode())
        self.c.exec(sid, cmd="python3 /root/holder.py %d" % mb, background=True, expect=(200, 201))
        self.wait_state(sid, lambda s: s[1] >= 3)
        return sid

    def state(self, sid):
        secret, n = self.c.sh(sid, "cat /root/state").split()
        return secret, int(n)

    def wait_state(self, sid, pred, timeout=20):
        deadline = time.time() + timeout
        last = None
        while time.time() < deadline:
            try:
                last = self.state(sid)
                if pred(last):
                    return last
            except (ValueError, AssertionError, moatd.HTTPError):
                pass
            time.sleep(0.1)
        self.fail("state of %s never matched (last %r)" % (sid, last))

    def assertContinues(self, sid, secret, n0, what):
        s = self.wait_state(sid, lambda s: s[1] > n0 + 2)
        self.assertEqual(s[0], secret, "%s: the memory of %s was lost (new secret)" % (what, sid))

    def post(self, sid, what, body=None, expect=200):
        return self.c.request("POST", "/v1/sandboxes/%s/%s" % (sid, what), body=body or {}, expect=expect,
                              timeout=120)[1]

    @staticmethod
    def chosen(points):
        """The points to try: all, or those named in MOAT_TEST_CRASH_POINTS (comma-separated; for
        running one point while debugging)."""
        only = os.environ.get("MOAT_TEST_CRASH_POINTS")
        return [p for p in points if not only or (p[0] if isinstance(p, tuple) else p) in only.split(",")]

    def crash_at(self, point, method, path, body=None):
        """Restarts moatd with MOAT_CRASH_AT=point, sends the request, asserts that moatd died at the
        point, and starts it again (without the point). Returns the reply, or the client's error."""
        self.d.terminate()
        self.d.env["MOAT_CRASH_AT"] = point
        self.d.start()
        self.c = self.d.client
        before = self.d.log_tail(100000).count("crash point " + point)
        try:
            reply = self.c.request(method, path, body=body if body is not None else {}, timeout=120)
        except Exception as e:  # the daemon dies under it
            reply = e
        rc = self.d.proc.wait(60)
        del self.d.env["MOAT_CRASH_AT"]
        self.assertEqual(rc, -9, "moatd did not die at %s: exit %r, reply %r" % (point, rc, reply))
        # threads of one request (a fork's children) may reach the point together
        self.assertGreater(self.d.log_tail(100000).count("crash point " + point), before,
                           "moatd died, but not at %s" % point)
        self.d.start()
        self.c = self.d.client
        return reply

    def assertNothingKilled(self, what):
        killed = [(s["id"], s.get("killed_reason")) for s in self.c.list(state="killed")]
        self.assertEqual(killed, [], "%s: sandboxes recorded killed" % what)

    def image_complete(self, sid):
        return os.path.exists(os.path.join(self.d.data_dir, "hibernate", sid, "moat-checkpoint"))

    def assertKept(self, sid, secret, n0, what, allowed=("running", "hibernated")):
        """sid is in an allowed state and, woken or resumed, goes on with its memory. Returns the
        state found after the restart."""
        self.assertNothingKilled(what)
        st = self.c.get(sid)["state"]
        self.assertIn(st, allowed, "%s: %s is %s after the restart" % (what, sid, st))
        if st == "hibernated":
            self.assertTrue(self.image_complete(sid), "%s: hibernated without a complete image" % what)
            self.assertEqual(self.post(sid, "wake")["state"], "running")
        elif st == "paused":
            self.assertEqual(self.post(sid, "resume")["state"], "running")
        self.assertContinues(sid, secret, n0, what)
        return st

    def finish(self):
        for s in self.c.list():
            self.c.delete(s["id"])
        self.assertEqual(self.c.list(), [])
        self.assertEqual(self.d.terminate(), 0, "moatd did not exit cleanly on SIGTERM: %s" % self.d.log_tail())
        self.assertEqual(self.d.leftovers(), {}, "leftovers after the crashes, delete and stop")

    # -- the tests --
    def test_kill9_during_hibernate(self):
        sid = self.holder()
        points = [(p, False) for p in CHECKPOINT_POINTS + ("hibernate.renamed", "hibernate.recorded")]
        points += [("criu.dump", True), ("checkpoint.written", True)]  # a paused sandbox's hibernate
        for point, paused in self.chosen(points):
            what = "hibernate%s at %s" % (" of a paused sandbox" if paused else "", point)
            secret, n0 = self.state(sid)
            if paused:
                self.post(sid, "pause")
            self.crash_at(point, "POST", "/v1/sandboxes/%s/hibernate" % sid)
            self.outcomes[what] = self.assertKept(sid, secret, n0, what,
                                                  ("paused", "hibernated") if paused else ("running", "hibernated"))
        self.finish()

    def test_kill9_during_wake(self):
        sid = self.holder()
        for point in self.chosen(("criu.restore", "wake.restored", "wake.recorded")):
            what = "wake at %s" % point
            secret, n0 = self.state(sid)
            self.assertEqual(self.post(sid, "hibernate")["state"], "hibernated")
            self.crash_at(point, "POST", "/v1/sandboxes/%s/wake" % sid)
            self.outcomes[what] = self.assertKept(sid, secret, n0, what)
        self.finish()

    def test_kill9_during_snapshot(self):
        sid = self.holder()
        for point in self.chosen(CHECKPOINT_POINTS + ("snapshot.renamed",)):
            what = "snapshot at %s" % point
            secret, n0 = self.state(sid)
            self.crash_at(point, "POST", "/v1/sandboxes/%s/snapshots" % sid)
            self.outcomes[what] = self.assertKept(sid, secret, n0, what, ("running",))
            dirs = os.listdir(os.path.join(self.d.data_dir, "snapshots"))
            listed = self.c.request("GET", "/v1/snapshots")[1]["snapshots"]
            self.assertEqual(sorted(s["id"] for s in listed), sorted(dirs), "%s: snapshot dirs %r" % (what, dirs))
            for s in listed:  # never acknowledged, so it may be absent; if listed it is complete
                child = self.c.create(from_snapshot=s["id"], ttl_seconds=600)["id"]
                self.assertEqual(self.c.sh(child, "echo ok"), "ok\n")
                self.c.delete(child)
                self.c.request("DELETE", "/v1/snapshots/" + s["id"], expect=204)
        self.finish()

    def test_kill9_during_fork(self):
        sid = self.holder()
        for point in self.chosen(CHECKPOINT_POINTS[:2] + ("fork.checkpointed", "criu.restore", "create.started",
                                                          "create.recorded")):
            what = "fork at %s" % point
            secret, n0 = self.state(sid)
            self.crash_at(point, "POST", "/v1/sandboxes/%s/fork" % sid, {"count": 2})
            st = self.assertKept(sid, secret, n0, what, ("running",))
            kept = 0
            for s in self.c.list():
                if s["id"] == sid:
                    continue
                # a child never handed out: absent, or running from the parent's memory
                self.assertEqual(s.get("forked_from"), sid, s)
                self.assertEqual(s["state"], "running", "%s: child %r" % (what, s))
                self.assertContinues(s["id"], secret, n0, what + " (child)")
                self.c.delete(s["id"])
                kept += 1
            self.outcomes[what] = "%s, %d of 2 children" % (st, kept)
        self.finish()

    def test_kill9_at_times_during_hibernate(self):
        """Plain kill -9 at spread delays while a hibernate of a sandbox holding 64 MiB is in flight
        (the fault tests' way: the kill lands wherever the hibernate is)."""
        sid = self.holder(mb=64)
        for delay in (0.005, 0.02, 0.04, 0.07, 0.1, 0.15):
            what = "hibernate killed after %.3f s" % delay
            secret, n0 = self.state(sid)
            res = {}

            def hib():
                try:
                    res["r"] = self.c.request("POST", "/v1/sandboxes/%s/hibernate" % sid, body={}, timeout=120)
                except Exception as e:  # the daemon dies under it
                    res["e"] = e
            t = threading.Thread(target=hib)
            t.start()
            time.sleep(delay)
            self.d.kill9()
            t.join(120)
            self.d.start()
            self.c = self.d.client
            self.outcomes[what] = "%s (%s)" % (self.assertKept(sid, secret, n0, what),
                                               "answered" if "r" in res else "cut off")
        self.finish()

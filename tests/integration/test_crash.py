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

"""test_cross.py -- sandbox B tries to reach sandbox A: its files, its processes (see and signal them),
a port A listens on, and the uid it runs as on the host."""

import os
import sys
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
import moatd  # noqa: E402
from moattest import DaemonTest  # noqa: E402


def host_uid(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("Uid:"):
                return int(line.split()[1])
    return None


class CrossSandboxTest(DaemonTest):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        import probe
        cls.tag = uuid.uuid4().hex[:10]
        cls.a = cls.c.create(ttl_seconds=3600, metadata={"who": "A"})["id"]
        cls.b = cls.c.create(ttl_seconds=3600, metadata={"who": "B"})["id"]
        for sid in (cls.a, cls.b):
            probe.install(cls.c, sid)
        cls.c.sh(cls.a, "echo only-in-A > /root/secretA-%s" % cls.tag)
        r = probe.run(cls.c, cls.a, "sleepd", 600, "markerA-" + cls.tag)
        assert r.ok, r
        cls.a_sleeper = int(r.fields["pid"])
        r = probe.run(cls.c, cls.a, "listen", 8080)
        assert r.ok, r
        cls.a_listener = int(r.fields["pid"])

    def a_alive(self, pid):
        return self.probe(self.a, "kill", pid, 0).ok

    def test_files_of_a_invisible_to_b(self):
        out = self.c.exec(self.b, cmd="find / -name 'secretA-*' 2>/dev/null; "
                                      "grep -rl only-in-A /root /tmp /home 2>/dev/null; true", timeout_ms=120000)
        self.assertEqual(out["stdout"].strip(), "")
        self.assertApiError(404, "not_found", self.c.get_file, self.b, "/root/secretA-%s" % self.tag)
        # through B's /proc: A's pids are not there
        r = self.probe(self.b, "read", "/proc/%d/root/root/secretA-%s" % (self.a_sleeper, self.tag))
        self.assertEqual(r.errno, "ENOENT", r)
        self.assertEqual(self.c.get_file(self.a, "/root/secretA-%s" % self.tag), b"only-in-A\n")

    def test_processes_of_a_invisible_and_unsignalable(self):
        out = self.c.sh(self.b, "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '; echo")
        self.assertNotIn("markerA-" + self.tag, out)
        # One shell with builtins only (no process is created between the check and the kill), so a
        # pid number that B itself uses at that moment is told apart from one that is A's.
        script = ("for p in %d %d; do if [ -e /proc/$p ]; then echo \"$p own $(tr '\\0' ' ' < /proc/$p/cmdline)\"; "
                  "elif kill -9 $p 2>/dev/null; then echo \"$p killed\"; else echo \"$p ESRCH\"; fi; done"
                  % (self.a_sleeper, self.a_listener))
        results = {}
        for line in self.c.sh(self.b, script).splitlines():
            num, verdict, *cmd = line.split(None, 2)
            results[num] = (verdict, cmd[0] if cmd else "")
        for pid in (self.a_sleeper, self.a_listener):
            with self.subTest(pid=pid):
                verdict, cmd = results.get(str(pid), ("missing", ""))
                self.assertIn(verdict, ("ESRCH", "own"), results)
                self.assertNotIn("markerA-" + self.tag, cmd, "B sees A's process as its own")
        # a blanket kill from B reaches only B
        # (kill -1 may take the guest's own helper for this exec with it: 502 is then fair)
        self.c.exec(self.b, cmd="kill -9 -1 2>/dev/null; true", expect=(200, 502))
        self.assertAlive(self.b)
        self.assertTrue(self.a_alive(self.a_sleeper))
        self.assertTrue(self.a_alive(self.a_listener))

    def test_port_of_a_unreachable_from_b(self):
        r = self.probe(self.a, "connect", "127.0.0.1", 8080)
        self.assertTrue(r.ok, r)
        r = self.probe(self.b, "connect", "127.0.0.1", 8080)
        self.assertEqual(r.errno, "ECONNREFUSED", r)
        # nor from the host's loopback
        import socket
        s = socket.socket()
        s.settimeout(2)
        try:
            rc = s.connect_ex(("127.0.0.1", 8080))
            if rc == 0:
                banner = s.recv(64)
                self.assertNotEqual(banner, b"moat-probe\n", "sandbox port reachable from the host loopback")
        finally:
            s.close()

    def test_distinct_unprivileged_host_uids(self):
        ta = "uidA-" + self.tag
        tb = "uidB-" + self.tag
        self.assertTrue(self.probe(self.a, "sleepd", 60, ta).ok)
        self.assertTrue(self.probe(self.b, "sleepd", 60, tb).ok)
        time.sleep(0.2)
        pa, pb = moatd.find_pids_by_cmdline(ta), moatd.find_pids_by_cmdline(tb)
        self.assertEqual((len(pa), len(pb)), (1, 1))
        ua, ub = host_uid(pa[0]), host_uid(pb[0])
        self.assertNotEqual(ua, 0, "sandbox root is host root")
        self.assertNotEqual(ub, 0, "sandbox root is host root")
        self.assertNotEqual(ua, ub, "two sandboxes share a host uid")
        self.assertNotEqual(os.stat("/proc/%d/ns/net" % pa[0]).st_ino, os.stat("/proc/%d/ns/net" % pb[0]).st_ino)
        self.assertNotEqual(os.stat("/proc/%d/ns/pid" % pa[0]).st_ino, os.stat("/proc/%d/ns/pid" % pb[0]).st_ino)
        self.assertNotEqual(os.stat("/proc/%d/ns/mnt" % pa[0]).st_ino, os.stat("/proc/%d/ns/mnt" % pb[0]).st_ino)
        # and the host's capabilities are gone: CapEff of the sandbox root as the host sees it
        with open("/proc/%d/status" % pa[0]) as f:
            st = f.read()
        self.assertNotEqual(os.stat("/proc/%d/ns/user" % pa[0]).st_ino, os.stat("/proc/self/ns/user").st_ino)
        self.assertIn("Seccomp:\t2", st)

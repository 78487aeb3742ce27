"""test_guest.py -- attacks on a sandbox's PID 1 (moat-guest) and on the channel moatd reaches it by.

Root inside a sandbox tries every way into moat-guest (its memory, fds, environment, root and cwd,
ptrace); a PID 1 that is already compromised (the host plays that part: it makes PID 1 chroot into
a tree the sandbox built, with a symlink to another org's guest channel, and hang) must not lead
moatd anywhere else; a guest that stops answering (SIGSTOP, a hang) costs its callers a bounded
wait, never the daemon, and is killed and reported; a PID 1 that dies takes its sandbox with it,
reported. (That a quiet command or a paused sandbox is not taken for a hung guest:
integration/test_guest_timeout.py, which need not run alone.)
"""

import os
import signal
import sys
import threading
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
import guest_attack  # noqa: E402
import moatd  # noqa: E402
from moattest import DaemonTest  # noqa: E402

GUEST_TIMEOUT_S = 9  # the daemon's --guest-timeout below: the least moatd accepts (default 15 s)
HEALTH_CHECK_S = 5    # control/health.c: PID 1 gets this long to answer once more
DENIED = {"EACCES", "EPERM"}


def guest_pids_inside(client, sid):
    """The pids (inside) of every moat-guest process of the sandbox: PID 1 and its workers."""
    out = client.sh(sid, "for p in /proc/[0-9]*; do [ \"$(cat $p/comm 2>/dev/null)\" = moat-guest ] && "
                         "echo ${p#/proc/}; done; true")
    return sorted(int(x) for x in out.split())


class GuestTest(DaemonTest):
    daemon_args = ("--guest-timeout", str(GUEST_TIMEOUT_S * 1000))

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.key_b = cls.daemon.new_org_key("org-b-%s" % uuid.uuid4().hex[:8])
        cls.cb = cls.c.with_key(cls.key_b)

    def wait_killed(self, client, sid, within_s):
        deadline = time.time() + within_s
        while time.time() < deadline:
            st = client.get(sid)
            if st["state"] == "killed":
                return st
            time.sleep(0.2)
        return client.get(sid)

    def assert_pid1_out_of_reach(self, sid):
        guest_attack.install(self.c, sid)
        pids = guest_pids_inside(self.c, sid)
        self.assertIn(1, pids)
        for pid in pids:
            ways = guest_attack.reach(self.c, sid, pid)
            self.assertGreaterEqual(len(ways), 16, ways)
            # a worker that served a request may be gone by now (ENOENT), or have exited unreaped, its
            # memory gone (ESRCH: its maps read empty): not reached either
            allowed = DENIED | ({"ENOENT", "ESRCH"} if pid != 1 else set())
            for way, verdict in ways.items():
                with self.subTest(pid=pid, way=way):
                    self.assertIn(verdict, allowed, "root inside reached moat-guest (pid %d) through %s" % (pid, way))
        # signals: init ignores what it does not handle, and the host's quiesce signal from inside
        self.c.sh(sid, "kill -STOP 1; kill -TERM 1; kill -USR2 1; kill -INT 1; true")
        self.assertEqual(self.c.sh(sid, "echo alive"), "alive\n")

    def test_pid1_out_of_reach_of_root_inside(self):
        sb = self.sandbox()
        self.assert_pid1_out_of_reach(sb["id"])

    def test_restored_pid1_out_of_reach_and_checkpointable(self):
        if not self.c.healthz().get("checkpoints", {}).get("available"):
            self.skipTest("no working CRIU on this host")
        sb = self.sandbox()
        self.c.sh(sb["id"], "sleep 600 >/dev/null 2>&1 &")
        kids = self.c.request("POST", "/v1/sandboxes/%s/fork" % sb["id"], body={"count": 1})[1]["sandboxes"]
        kid = kids[0]["id"]
        self.addCleanup(self._delete_quietly, self.c, kid)
        self.assert_pid1_out_of_reach(kid)
        # and CRIU can still take it: a snapshot of the child, and a fork of the fork
        self.c.request("POST", "/v1/sandboxes/%s/snapshots" % kid, body={}, expect=201)
        grand = self.c.request("POST", "/v1/sandboxes/%s/fork" % kid, body={"count": 1})[1]["sandboxes"][0]["id"]
        self.addCleanup(self._delete_quietly, self.c, grand)
        self.assertEqual(self.c.sh(grand, "echo grandchild"), "grandchild\n")

    def test_channel_cannot_be_touched_from_inside(self):
        sid = self.sandbox()["id"]
        host = self.daemon.sandbox_host(sid)
        out = self.c.sh(sid, "rm -rf /run/moat/.sock/guest.sock; mv /run/moat/.sock /run/moat/x; "
                             "umount -l /run/moat/.sock; mount -t tmpfs none /run/moat/.sock; "
                             "ln -s / /run/moat/.sock/evil; ls -a /run/moat/.sock 2>&1; true")
        self.assertIn("Permission denied", out)
        st = os.lstat(os.path.join(host["chan"], "guest.sock"))
        import stat as st_mod
        self.assertTrue(st_mod.S_ISSOCK(st.st_mode))
        self.assertEqual(sorted(os.listdir(host["chan"])), ["guest.sock"])
        dst = os.stat(host["chan"])
        self.assertEqual((dst.st_uid, dst.st_mode & 0o777), (0, 0o700))
        self.assertEqual(self.c.sh(sid, "echo still"), "still\n")

    def test_compromised_pid1_cannot_redirect_moatd(self):
        # org A: the victim, with a marker; org B: the attacker, whose PID 1 is (by the host, standing
        # for any way in) made to chroot into a tree of B's own that points at A's guest channel.
        a = self.sandbox()["id"]
        self.c.sh(a, "echo victim > /victim-marker")
        a_host = self.daemon.sandbox_host(a)
        b = self.sandbox(client=self.cb)["id"]
        b_host = self.daemon.sandbox_host(b)
        self.cb.sh(b, "mkdir -p /tmp/evil/run/moat /tmp/evil/tmp && ln -s %s /tmp/evil/run/moat/.sock && "
                      "ln -s %s/guest.sock /tmp/evil/tmp/guest.sock && echo ready" % (a_host["chan"], a_host["chan"]))
        line = guest_attack.host_hijack(b_host["pid"], "/tmp/evil")
        self.assertTrue(line.startswith("OK"), line)
        # wake PID 1 from its poll (SIGCHLD arrives through its signalfd): it runs the code
        os.kill(b_host["pid"], signal.SIGCHLD)
        deadline = time.time() + 5
        while os.readlink("/proc/%d/root" % b_host["pid"]) != "/tmp/evil" and time.time() < deadline:
            time.sleep(0.05)
        self.assertEqual(os.readlink("/proc/%d/root" % b_host["pid"]), "/tmp/evil", "the hijack did not take")
        t0 = time.time()
        with self.assertRaises(moatd.HTTPError) as cm:
            self.cb.request("POST", "/v1/sandboxes/%s/exec" % b, body={"cmd": "echo pwned > /tmp/pwned; cat /victim-marker"},
                            timeout=GUEST_TIMEOUT_S + 30)
        took = time.time() - t0
        self.assertEqual((cm.exception.status, cm.exception.code), (502, "sandbox_unreachable"), cm.exception.body)
        self.assertLess(took, GUEST_TIMEOUT_S + 5)
        # nothing of it reached A, and A still answers
        self.assertEqual(self.c.sh(a, "cat /victim-marker; ls /tmp"), "victim\n")
        self.assertEqual(self.c.healthz()["status"], "ok")
        st = self.wait_killed(self.cb, b, HEALTH_CHECK_S + 10)
        self.assertEqual((st["state"], st.get("killed_reason")), ("killed", "guest_unresponsive"), st)
        self.assertEqual(self.c.sh(a, "echo a-fine"), "a-fine\n")

    def test_hung_guest_costs_a_bounded_wait(self):
        c_sid = self.sandbox()["id"]
        d_sid = self.sandbox()["id"]
        pid = self.daemon.sandbox_host(c_sid)["pid"]
        os.kill(pid, signal.SIGSTOP)
        self.addCleanup(lambda: os.kill(pid, signal.SIGCONT) if os.path.exists("/proc/%d" % pid) else None)
        results = {}

        def hung_call(i):
            t0 = time.time()
            try:
                self.c.exec(c_sid, cmd="echo hi")
                results[i] = ("answered", time.time() - t0)
            except moatd.HTTPError as e:
                results[i] = ((e.status, e.code), time.time() - t0)

        threads = [threading.Thread(target=hung_call, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        time.sleep(1)
        # while eight calls wait on the hung guest, everything else is served at once
        t0 = time.time()
        self.assertEqual(self.c.healthz()["status"], "ok")
        self.assertEqual(self.c.sh(d_sid, "echo other"), "other\n")
        self.assertIsInstance(self.cb.list(), list)
        self.assertLess(time.time() - t0, 5)
        for t in threads:
            t.join(GUEST_TIMEOUT_S + 15)
        self.assertEqual(len(results), 8, results)
        for i, (verdict, took) in results.items():
            self.assertEqual(verdict, (502, "sandbox_unreachable"), results)
            self.assertLess(took, GUEST_TIMEOUT_S + 5, results)
        st = self.wait_killed(self.c, c_sid, HEALTH_CHECK_S + 10)
        self.assertEqual((st["state"], st.get("killed_reason")), ("killed", "guest_unresponsive"), st)
        self.assertEqual(self.c.sh(d_sid, "echo still-other"), "still-other\n")

    def test_pid1_crash_kills_and_reports(self):
        sid = self.sandbox()["id"]
        host = self.daemon.sandbox_host(sid)
        os.kill(host["pid"], signal.SIGKILL)
        st = self.wait_killed(self.c, sid, 10)
        self.assertEqual((st["state"], st.get("killed_reason")), ("killed", "guest_exited"), st)
        deadline = time.time() + 10
        while os.path.exists(host["chan"]) and time.time() < deadline:
            time.sleep(0.2)
        self.assertFalse(os.path.exists(host["chan"]), "the dead sandbox's channel dir is left behind")
        self.assertApiError(404, "not_found", self.c.exec, sid, cmd="true")

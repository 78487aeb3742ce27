"""test_signals.py -- every process started in a sandbox begins with default signal dispositions and an
empty signal mask, whatever moatd inherited: a moatd started with SIGINT and SIGQUIT ignored (as a shell's
`moatd &` leaves them, and as scripts/run.sh starts it) runs exec'd, background, PTY and context processes
whose /proc/self/status shows SigIgn and SigBlk zero; Ctrl-C (0x03) on the PTY WebSocket stops `sleep 100`
in the shell; `signal INT` stops a background `sleep 100`; Python and bash contexts interrupted at their
timeout keep their state and answer the next run."""

import os
import signal
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
import moatd  # noqa: E402
import sse  # noqa: E402
import ws  # noqa: E402
from moattest import DaemonTest  # noqa: E402

INHERITED = (signal.SIGINT, signal.SIGQUIT, 32)  # 32: glibc's reserved SIGCANCEL, reset by raw syscall only
# CPython ignores SIGPIPE and SIGXFSZ for itself (and restores both for the processes it starts).
CPYTHON_IGN = (1 << (signal.SIGPIPE - 1)) | (1 << (signal.SIGXFSZ - 1))


def sig_fields(status_text):
    """{"SigIgn": int, "SigBlk": int, ...} from the text of a /proc/PID/status."""
    out = {}
    for line in status_text.splitlines():
        k, _, v = line.partition(":")
        if k in ("SigIgn", "SigBlk", "SigCgt"):
            out[k] = int(v.strip(), 16)
    return out


class SignalsTest(DaemonTest):
    @classmethod
    def setUpClass(cls):
        cls.daemon = moatd.MoatDaemon(pool=1, ignore_signals=INHERITED)
        try:
            cls.daemon.start()
        except Exception:
            cls.daemon.stop()
            raise
        cls.c = cls.daemon.client
        cls.sid = cls.c.create(ttl_seconds=900)["id"]

    def url(self, *parts):
        return "/v1/sandboxes/%s/%s" % (self.sid, "/".join(str(p) for p in parts))

    def assertClean(self, status_text, what, allow_ign=0):
        f = sig_fields(status_text)
        self.assertIn("SigIgn", f, "%s: no SigIgn in %r" % (what, status_text[:300]))
        self.assertEqual(f["SigIgn"] & ~allow_ign, 0, "%s ignores signals: SigIgn %#x" % (what, f["SigIgn"]))
        self.assertEqual(f["SigBlk"], 0, "%s blocks signals: SigBlk %#x" % (what, f["SigBlk"]))

    def test_setup_moatd_ignores_int_and_quit(self):
        # What the rest relies on: moatd itself really runs with SIGINT and SIGQUIT ignored.
        with open("/proc/%d/status" % self.daemon.proc.pid) as f:
            ign = sig_fields(f.read())["SigIgn"]
        for s in INHERITED:
            self.assertTrue(ign & (1 << (s - 1)), "moatd does not ignore %s: SigIgn %#x" % (getattr(s, "name", s), ign))

    def test_exec_background_pty_start_clean(self):
        r = self.c.exec(self.sid, argv=["cat", "/proc/self/status"])
        self.assertEqual(r["exit_code"], 0, r)
        self.assertClean(r["stdout"], "exec")
        r = self.c.exec(self.sid, argv=["cat", "/proc/self/status"], user="user")
        self.assertClean(r["stdout"], "exec as user")
        # a shell's child: nothing the shell passes on either
        self.assertClean(self.c.sh(self.sid, "cat /proc/self/status"), "sh -c child")

        pid = self.c.request("POST", self.url("exec"), body={"argv": ["cat", "/proc/self/status"],
                                                             "background": True}, expect=201)[1]["pid"]
        evs = sse.open(self.c, "GET", self.url("processes", pid, "stream")).all(30)
        self.assertEqual(evs[-1].name, "exit", evs[-3:])
        self.assertClean(sse.output(evs).decode(), "background")

        w = ws.connect(self.c, self.url("pty"), query={"cmd": "cat /proc/self/status"})
        self.addCleanup(w.sock.close)
        out = b""
        with self.assertRaises(ws.Closed):
            while True:
                out += w.recv(10)[1]
        self.assertClean(out.decode(errors="replace").replace("\r\n", "\n"), "pty")

    def test_context_processes_start_clean(self):
        ctx = self.c.request("POST", self.url("contexts"), body={"language": "python"}, expect=201)[1]
        r = self.c.request("POST", self.url("contexts", ctx["id"], "run"), expect=200, body={
            "code": "import subprocess\n"
                    "print(open('/proc/self/status').read())\n"
                    "print('CHILD')\n"
                    "print(subprocess.run(['cat', '/proc/self/status'], capture_output=True, text=True).stdout)"})[1]
        self.assertIsNone(r["error"], r)
        own, _, child = r["stdout"].partition("CHILD")
        self.assertClean(own, "python kernel", allow_ign=CPYTHON_IGN)
        self.assertClean(child, "python kernel's child")
        ctx = self.c.request("POST", self.url("contexts"), body={"language": "bash"}, expect=201)[1]
        r = self.c.request("POST", self.url("contexts", ctx["id"], "run"), expect=200,
                           body={"code": "cat /proc/self/status"})[1]
        self.assertClean(r["stdout"], "bash kernel's child")

    def test_ctrl_c_on_pty_stops_sleep(self):
        w = ws.connect(self.c, self.url("pty"))
        self.addCleanup(w.sock.close)
        w.send_binary(b"echo go$((1+1)); sleep 100\r")
        w.read_until(lambda b: b"go2" in b)
        time.sleep(0.3)  # sleep is running in the foreground (it would also be stopped if not yet)
        w.send_binary(b"\x03")
        w.send_binary(b"echo back$((2+3))\r")
        w.read_until(lambda b: b"back5" in b, timeout=15)
        ps = self.c.sh(self.sid, "ps -eo args")
        self.assertNotIn("sleep 100", ps)
        w.send_binary(b"exit\r")

    def test_signal_int_stops_background_sleep(self):
        pid = self.c.request("POST", self.url("exec"), body={"argv": ["sleep", "100"], "background": True},
                             expect=201)[1]["pid"]
        self.addCleanup(self.c.request, "POST", self.url("processes", pid, "signal"), body={"signal": "KILL"},
                        expect=(204, 404, 409))
        s = sse.open(self.c, "GET", self.url("processes", pid, "stream"))
        self.addCleanup(s.close)
        self.assertEqual(s.next(10).name, "process")
        self.c.request("POST", self.url("processes", pid, "signal"), body={"signal": "INT"}, expect=204)
        ev = s.next(15)
        self.assertEqual(ev.name, "exit", ev)
        self.assertEqual((ev.data["exit_code"], ev.data["signal"]), (-1, signal.SIGINT))

    def run_ctx(self, cid, code, **kw):
        kw["code"] = code
        return self.c.request("POST", self.url("contexts", cid, "run"), body=kw, expect=200, timeout=60)[1]

    def test_contexts_interrupted_at_timeout_live_on(self):
        cid = self.c.request("POST", self.url("contexts"), body={"language": "python"}, expect=201)[1]["id"]
        self.run_ctx(cid, "keep = 41")
        r = self.run_ctx(cid, "import time\ntime.sleep(100)", timeout_ms=1000)
        self.assertTrue(r["timed_out"], r)
        self.assertFalse(r["restarted"], r)
        self.assertEqual(r["error"]["name"], "KeyboardInterrupt", r)
        r = self.run_ctx(cid, "print(keep + 1)")
        self.assertEqual((r["error"], r["stdout"]), (None, "42\n"), r)

        cid = self.c.request("POST", self.url("contexts"), body={"language": "bash"}, expect=201)[1]["id"]
        self.run_ctx(cid, "KEEP=41")
        r = self.run_ctx(cid, "sleep 100", timeout_ms=1000)
        self.assertTrue(r["timed_out"], r)
        self.assertFalse(r["restarted"], r)
        self.assertEqual(self.run_ctx(cid, "echo $((KEEP+1))")["stdout"], "42\n")

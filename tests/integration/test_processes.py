"""test_processes.py -- background exec and /v1/sandboxes/{id}/processes: a shell loop started in the
background, listed, reattached with replay, its stdin written and closed, signalled by pid and by tag,
its exit recorded; resize of a pty process; bad input (unknown pid/tag, stdin to a finished process,
bad signal, resize out of bounds, a tag in use)."""

import os
import re
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
import sse  # noqa: E402
from moattest import DaemonTest  # noqa: E402

output = sse.output

RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


class ProcessesTest(DaemonTest):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.sid = cls.c.create(ttl_seconds=3600)["id"]

    def url(self, *parts):
        return "/v1/sandboxes/%s/%s" % (self.sid, "/".join(str(p) for p in parts))

    def bg(self, expect=201, **body):
        body["background"] = True
        return self.c.request("POST", self.url("exec"), body=body, expect=expect)[1]

    def procs(self):
        return self.c.request("GET", self.url("processes"))[1]["processes"]

    def proc(self, pid):
        p = [x for x in self.procs() if x["pid"] == pid]
        return p[0] if p else None

    def wait_exit(self, pid, timeout=10):
        deadline = time.time() + timeout
        while time.time() < deadline:
            p = self.proc(pid)
            if p and not p["running"]:
                return p
            time.sleep(0.1)
        self.fail("process %d still running after %ss: %r" % (pid, timeout, self.proc(pid)))

    def post(self, ref, action, body, expect=204):
        return self.c.request("POST", self.url("processes", ref, action), body=body, expect=expect)

    def attach(self, ref, replay=True):
        return sse.open(self.c, "GET", self.url("processes", ref, "stream"),
                        query={"replay": "true" if replay else "false"})

    def test_background_loop_listed_reattached_killed(self):
        t0 = time.time()
        r = self.bg(cmd="i=0; while true; do echo tick $i; i=$((i+1)); sleep 0.2; done", tag="ticker")
        self.assertLess(time.time() - t0, 2.0, "background exec did not answer at once")
        self.assertEqual(r["tag"], "ticker")
        pid = r["pid"]
        self.assertIsInstance(pid, int)
        p = self.proc(pid)
        self.assertIsNotNone(p, self.procs())
        self.assertTrue(p["running"])
        self.assertEqual(p["tag"], "ticker")
        self.assertTrue(p["background"])
        self.assertFalse(p["pty"])
        self.assertIn("while true", p["cmd"])
        self.assertEqual(p["argv"][:2], ["/bin/sh", "-c"])
        self.assertRegex(p["started_at"], RFC3339)
        self.assertIsNone(p["exit_code"])
        time.sleep(0.7)
        # reattach by tag: the process event, then the replayed ticks from the start, then live ones
        s = self.attach("ticker")
        ev = s.next(10)
        self.assertEqual(ev.name, "process")
        self.assertEqual(ev.data["pid"], pid)
        got = b""
        while b"tick 6\n" not in got:
            ev = s.next(10)
            self.assertIn(ev.name, ("stdout", "dropped"), ev)
            if ev.name == "stdout":
                got += ev.data["data"].encode()
        self.assertTrue(got.startswith(b"tick 0\ntick 1\n"), got[:100])
        s.close()
        # without replay only live output comes
        s = self.attach(pid, replay=False)
        self.assertEqual(s.next(10).name, "process")
        ev = s.next(10)
        self.assertEqual(ev.name, "stdout")
        self.assertNotIn("tick 0\n", ev.data["data"])
        s.close()
        self.assertTrue(self.proc(pid)["running"], "closing an attach killed the process")
        self.post("ticker", "signal", {"signal": "TERM"})
        p = self.wait_exit(pid)
        self.assertEqual((p["exit_code"], p["signal"]), (-1, 15))
        # attaching to a finished process replays and ends with its exit
        evs = self.attach(pid).all()
        self.assertEqual(evs[0].name, "process")
        self.assertFalse(evs[0].data["running"])
        self.assertEqual(evs[-1].name, "exit")
        self.assertEqual(evs[-1].data["signal"], 15)

    def test_stdin_written_and_closed(self):
        pid = self.bg(cmd='while read l; do echo "got:$l"; done; echo eof; exit 7')["pid"]
        self.post(pid, "stdin", {"data": "one\n"})
        self.post(pid, "stdin", {"data_b64": "dHdvCg=="})  # "two\n"
        self.post(pid, "stdin", {"data": "three\n", "close": True})
        p = self.wait_exit(pid)
        self.assertEqual((p["exit_code"], p["signal"]), (7, 0))
        evs = self.attach(pid).all()
        self.assertEqual(output(evs), b"got:one\ngot:two\ngot:three\neof\n")
        self.assertEqual(evs[-1].data["exit_code"], 7)
        e = self.assertApiError(409, "stdin_closed", self.post, pid, "stdin", {"data": "late\n"})
        self.assertIn("message", e.body)

    def test_replay_ring_overflow_reports_dropped(self):
        n = 3 * 1000 * 1000
        pid = self.bg(cmd="head -c %d /dev/zero | tr '\\0' a; echo; echo end" % n)["pid"]
        self.wait_exit(pid, 30)
        evs = self.attach(pid).all()
        self.assertEqual(evs[0].name, "process")
        self.assertEqual(evs[1].name, "dropped", evs[:3])
        out = output(evs)
        self.assertTrue(out.endswith(b"a\nend\n"), out[-20:])
        self.assertLessEqual(len(out), 1 << 20)
        self.assertEqual(evs[1].data["bytes"] + len(out), n + 5, "dropped + replayed != written")
        self.assertEqual(evs[-1].name, "exit")

    def test_signal_by_pid(self):
        pid = self.bg(argv=["sleep", "100"])["pid"]
        s = self.attach(pid)
        self.assertEqual(s.next(10).name, "process")
        self.post(pid, "signal", {"signal": "KILL"})
        ev = s.next(10)
        self.assertEqual(ev.name, "exit")
        self.assertEqual((ev.data["exit_code"], ev.data["signal"]), (-1, 9))
        s.close()
        self.assertFalse(self.proc(pid)["running"])

    def test_stop_and_cont(self):
        pid = self.bg(cmd="while true; do date +%s%N; sleep 0.05; done", tag="stopper")["pid"]

        def state_becomes(pred):
            deadline = time.time() + 5
            while time.time() < deadline:
                st = self.c.sh(self.sid, "ps -o stat= -p %d" % pid).strip()[:1]
                if pred(st):
                    return st
                time.sleep(0.1)
            self.fail("process state stayed %r" % st)

        # The signal goes to the whole process group: when it lands while the shell waits on a
        # vfork'd child (dash spawns with vfork), the child stops before its exec and the shell
        # stays in that wait ('D'), stopped all the same.
        self.post("stopper", "signal", {"signal": "STOP"})
        state_becomes(lambda st: st in ("T", "D"))
        time.sleep(0.3)
        self.assertIn(self.c.sh(self.sid, "ps -o stat= -p %d" % pid).strip()[:1], ("T", "D"),
                      "it did not stay stopped")
        self.post("stopper", "signal", {"signal": "SIGCONT"})
        state_becomes(lambda st: st not in ("T", ""))
        self.post(pid, "signal", {"signal": "KILL"})
        self.wait_exit(pid)

    def test_pty_process_resize(self):
        # The shell waits for a line before each `stty size`, so the first size is printed before
        # the resize and the second after it, whatever the scheduling.
        pid = self.bg(cmd="read a; stty size; read x; stty size; sleep 30", pty={"cols": 100, "rows": 30},
                      tag="tty1")["pid"]
        p = self.proc(pid)
        self.assertTrue(p["pty"])
        s = self.attach("tty1")
        self.assertEqual(s.next(10).name, "process")
        got = b""

        def read_until(want):
            nonlocal got
            while want not in got:
                ev = s.next(10)
                self.assertEqual(ev.name, "stdout", ev)
                got += ev.data["data"].encode()

        self.post(pid, "stdin", {"data": "\n"})
        read_until(b"30 100")
        self.post("tty1", "resize", {"cols": 120, "rows": 40})
        self.post(pid, "stdin", {"data": "\n"})
        read_until(b"40 120")
        s.close()
        self.post(pid, "signal", {"signal": "KILL"})

    def test_bad_input(self):
        for action, body in (("stdin", {"data": "x"}), ("signal", {"signal": "TERM"}),
                             ("resize", {"cols": 80, "rows": 24})):
            self.assertApiError(404, "process_not_found", self.post, 999999, action, body)
            self.assertApiError(404, "process_not_found", self.post, "no-such-tag", action, body)
        self.assertApiError(404, "process_not_found", self.attach, 999999)
        self.assertApiError(404, "not_found", self.post, "bad%21tag", "signal", {})
        self.assertApiError(404, "not_found", self.post, 0, "signal", {})
        pid = self.bg(argv=["sleep", "100"], tag="victim")["pid"]
        for bad in ("FOO", "9", 9, "", None, "kill"):
            self.assertApiError(400, "invalid_request", self.post, pid, "signal", {"signal": bad})
        self.assertApiError(400, "invalid_request", self.post, pid, "signal", {"signal": "TERM", "x": 1})
        for cols, rows in ((0, 24), (100000, 24), (80, 0), (80, 100000), (80, None), ("80", 24), (1.5, 24)):
            self.assertApiError(400, "invalid_request", self.post, pid, "resize", {"cols": cols, "rows": rows})
        self.assertApiError(400, "not_a_tty", self.post, pid, "resize", {"cols": 80, "rows": 24})
        self.assertApiError(400, "invalid_request", self.post, pid, "stdin", {})
        self.assertApiError(400, "invalid_request", self.post, pid, "stdin", {"data": "a", "data_b64": "YQ=="})
        self.assertApiError(400, "invalid_request", self.post, pid, "stdin", {"data_b64": "!!"})
        self.assertApiError(400, "invalid_request", self.post, pid, "stdin", {"data": 5})
        self.assertApiError(400, "invalid_request", self.post, pid, "stdin", {"close": "yes"})
        self.assertApiError(400, "invalid_request", self.c.request, "GET", self.url("processes", pid, "stream"),
                            query={"replay": "maybe"})
        self.assertApiError(400, "invalid_request", self.c.request, "GET", self.url("processes"),
                            query={"x": "1"})
        # a tag in use by a running process
        self.assertApiError(409, "tag_in_use", self.bg, argv=["true"], tag="victim")
        self.assertApiError(400, "invalid_request", self.bg, argv=["true"], tag="12345")
        self.assertApiError(400, "invalid_request", self.c.request, "POST", self.url("exec"),
                            body={"argv": ["true"], "tag": "x"})
        self.post("victim", "signal", {"signal": "KILL"})
        self.wait_exit(pid)
        self.assertAlive(self.sid)

    def test_unknown_sandbox(self):
        self.assertApiError(404, "not_found", self.c.request, "GET",
                            "/v1/sandboxes/sb-0123456789abcdefg/processes")

"""test_stream.py -- POST /v1/sandboxes/{id}/exec/stream (SSE): bytes arrive as written, 50 MB complete
and in order, stderr apart, non-UTF-8 as base64 (and UTF-8 split across writes kept whole), a client
that disconnects leaves the process running unless kill_on_disconnect, bad input answered as JSON."""

import hashlib
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
import sse  # noqa: E402
from moattest import DaemonTest  # noqa: E402

output = sse.output


class StreamTest(DaemonTest):
    daemon_args = ("--stream-keepalive-ms", "1000")  # default 15 s: the silence tests wait less

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.sid = cls.c.create(ttl_seconds=3600)["id"]

    def stream(self, **body):
        return sse.open(self.c, "POST", "/v1/sandboxes/%s/exec/stream" % self.sid, body=body)

    def procs(self):
        return self.c.request("GET", "/v1/sandboxes/%s/processes" % self.sid)[1]["processes"]

    def test_events_and_exit(self):
        s = self.stream(cmd="echo out; echo err >&2; exit 3")
        self.assertEqual(s.headers.get("Content-Type"), "text/event-stream")
        evs = s.all()
        s.close()
        self.assertEqual(evs[0].name, "start")
        self.assertIsInstance(evs[0].data["pid"], int)
        self.assertEqual(evs[-1].name, "exit")
        self.assertEqual(evs[-1].data, {"exit_code": 3, "signal": 0, "timed_out": False, "oom_killed": False})
        self.assertEqual(output(evs), b"out\n")
        self.assertEqual(output(evs, "stderr"), b"err\n")
        for ev in evs:
            if ev.name in ("stdout", "stderr"):
                self.assertEqual(ev.data["encoding"], "utf8", ev)

    def test_first_byte_before_exit(self):
        t0 = time.time()
        s = self.stream(cmd="echo a; sleep 2; echo b")
        first = s.next(10)
        self.assertEqual(first.name, "start")
        ev = s.next(10)
        self.assertEqual((ev.name, ev.data["data"]), ("stdout", "a\n"))
        self.assertLess(ev.at - t0, 1.0, "the first output came %.2fs after the request" % (ev.at - t0))
        ev2 = s.next(10)
        self.assertEqual((ev2.name, ev2.data["data"]), ("stdout", "b\n"))
        self.assertGreater(ev2.at - ev.at, 1.5, "b arrived with a: the output was buffered")
        self.assertEqual(s.next(10).name, "exit")
        self.assertIsNone(s.next(10))
        s.close()

    def test_stderr_separate_and_ordered(self):
        s = self.stream(cmd="for i in 1 2 3 4 5; do echo o$i; echo e$i >&2; done")
        evs = s.all()
        s.close()
        self.assertEqual(output(evs), b"o1\no2\no3\no4\no5\n")
        self.assertEqual(output(evs, "stderr"), b"e1\ne2\ne3\ne4\ne5\n")

    def test_50mb_complete_and_ordered(self):
        n = 6500000
        want = "".join("%d\n" % i for i in range(1, n + 1)).encode()
        self.assertGreater(len(want), 50 * 1000 * 1000)
        s = self.stream(cmd="seq 1 %d" % n)
        h = hashlib.sha256()
        size = 0
        last = None
        while True:
            ev = s.next(120)
            if ev is None:
                break
            last = ev
            if ev.name == "stdout":
                self.assertEqual(ev.data["encoding"], "utf8")
                b = ev.data["data"].encode()
                h.update(b)
                size += len(b)
        s.close()
        self.assertEqual(last.name, "exit", last)
        self.assertEqual(last.data["exit_code"], 0)
        self.assertEqual(size, len(want))
        self.assertEqual(h.hexdigest(), hashlib.sha256(want).hexdigest())

    def test_invalid_utf8_is_base64(self):
        s = self.stream(cmd=r"printf 'ok\377\376\n'")
        evs = s.all()
        s.close()
        outs = [e for e in evs if e.name == "stdout"]
        self.assertTrue(any(e.data["encoding"] == "base64" for e in outs), evs)
        self.assertEqual(output(evs), b"ok\xff\xfe\n")

    def test_utf8_split_across_writes_stays_text(self):
        # e-acute (C3 A9) and the euro sign (E2 82 AC) written in pieces with pauses between them
        s = self.stream(cmd=r"printf 'x\303'; sleep 0.4; printf '\251\342'; sleep 0.4; printf '\202'; "
                            r"sleep 0.4; printf '\254\n'")
        evs = s.all()
        s.close()
        outs = [e for e in evs if e.name == "stdout"]
        self.assertGreaterEqual(len(outs), 2, evs)
        for e in outs:
            self.assertEqual(e.data["encoding"], "utf8", evs)
        self.assertEqual(output(evs).decode(), "x\u00e9\u20ac\n")

    def test_truncated_utf8_at_exit_is_base64(self):
        s = self.stream(cmd=r"printf 'a\342\202'")
        evs = s.all()
        s.close()
        self.assertEqual(output(evs), b"a\xe2\x82")

    def test_timeout_and_signal(self):
        evs = self.stream(argv=["sleep", "30"], timeout_ms=300).all()
        self.assertTrue(evs[-1].data["timed_out"], evs)
        evs = self.stream(cmd="kill -9 $$").all()
        self.assertEqual((evs[-1].data["exit_code"], evs[-1].data["signal"]), (-1, 9))

    def test_stdin_in_body(self):
        evs = self.stream(argv=["cat"], stdin="from body\n").all()
        self.assertEqual(output(evs), b"from body\n")

    def _wait_running(self, pid, want, timeout=10):
        deadline = time.time() + timeout
        while True:
            p = [x for x in self.procs() if x["pid"] == pid]
            running = bool(p) and p[0]["running"]
            if running == want or time.time() > deadline:
                return running
            time.sleep(0.2)

    def test_disconnect_keeps_process(self):
        s = self.stream(cmd="sleep 60", tag="keepme")
        pid = s.next(10).data["pid"]
        s.close()
        time.sleep(1.5)
        p = [x for x in self.procs() if x["pid"] == pid]
        self.assertTrue(p and p[0]["running"], "the process died with its stream: %r" % p)
        self.assertEqual(p[0]["tag"], "keepme")
        self.c.request("POST", "/v1/sandboxes/%s/processes/keepme/signal" % self.sid, body={"signal": "KILL"},
                       expect=204)
        self.assertFalse(self._wait_running(pid, False))

    def test_disconnect_kills_when_asked(self):
        s = self.stream(cmd="sleep 60", kill_on_disconnect=True)
        pid = s.next(10).data["pid"]
        self.assertTrue(self._wait_running(pid, True, 2))
        s.close()
        self.assertFalse(self._wait_running(pid, False), "kill_on_disconnect left the process running")

    def test_bad_input_is_json(self):
        path = "/v1/sandboxes/%s/exec/stream" % self.sid
        self.assertApiError(400, "invalid_request", sse.open, self.c, "POST", path, body={})
        self.assertApiError(400, "invalid_request", sse.open, self.c, "POST", path,
                            body={"cmd": "x", "background": True})
        self.assertApiError(400, "invalid_request", sse.open, self.c, "POST", path,
                            body={"cmd": "x", "kill_on_disconnect": "yes"})
        self.assertApiError(400, "invalid_request", sse.open, self.c, "POST", path,
                            body={"cmd": "x", "pty": {"cols": 0, "rows": 5}})
        self.assertApiError(400, "invalid_request", sse.open, self.c, "POST", path, body={"cmd": "x", "user": "nobody-here"})
        self.assertApiError(400, "invalid_json", sse.open, self.c, "POST", path, body="{")
        self.assertApiError(404, "not_found", sse.open, self.c, "POST",
                            "/v1/sandboxes/sb-0123456789abcdefg/exec/stream", body={"cmd": "true"})
        self.assertApiError(405, "method_not_allowed", sse.open, self.c, "GET", path)
        r = self.stream(argv=["no-such-command-here"]).all()
        self.assertEqual(r[-1].data["exit_code"], 127)
        self.assertAlive(self.sid)

    def test_keepalive_comment_in_silence(self):
        s = self.stream(cmd="sleep 3; echo done")
        self.assertEqual(s.next(10).name, "start")
        ev = s.next(30)
        self.assertEqual((ev.name, ev.data["data"]), ("stdout", "done\n"))
        self.assertIn("keep-alive", s.comments, "no keep-alive comment in 3 s of silence (--stream-keepalive-ms 1000)")
        s.close()

    def test_sandbox_deleted_mid_stream(self):
        sid = self.sandbox()["id"]
        s = sse.open(self.c, "POST", "/v1/sandboxes/%s/exec/stream" % sid, body={"cmd": "echo up; sleep 60"})
        self.assertEqual(s.next(10).name, "start")
        self.assertEqual(s.next(10).data["data"], "up\n")
        self.c.delete(sid)
        t0 = time.time()
        evs = s.all(timeout=30)
        s.close()
        self.assertLess(time.time() - t0, 30)
        self.assertTrue(evs, "the stream ended without a last event")
        self.assertIn(evs[-1].name, ("error", "exit"), evs)
        if evs[-1].name == "error":
            self.assertIsInstance(evs[-1].data["code"], str)
        else:
            self.assertNotEqual(evs[-1].data["signal"], 0, evs)
        self.c.healthz()

    def test_pty_stream(self):
        evs = self.stream(cmd="tty; stty size", pty={"cols": 91, "rows": 27}).all()
        out = output(evs)
        self.assertIn(b"/dev/pts/", out)
        self.assertIn(b"27 91", out)

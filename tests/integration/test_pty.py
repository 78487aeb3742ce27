"""test_pty.py -- GET /v1/sandboxes/{id}/pty over WebSocket (RFC 6455): a real tty, typed input echoed,
resize by text frame, text frames as input (xterm.js attach addon), close 1000 at exit, attach to a pty
process started by exec, handshake errors as JSON, garbage frames and a client that never reads close
the connection while the daemon and the sandbox carry on."""

import json
import os
import socket
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
import ws  # noqa: E402
from moattest import DaemonTest  # noqa: E402


class PtyTest(DaemonTest):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.sid = cls.c.create(ttl_seconds=3600)["id"]

    def path(self):
        return "/v1/sandboxes/%s/pty" % self.sid

    def open(self, **query):
        w = ws.connect(self.c, self.path(), query={k: str(v) for k, v in query.items()})
        self.addCleanup(w.sock.close)
        return w

    def procs(self):
        return self.c.request("GET", "/v1/sandboxes/%s/processes" % self.sid)[1]["processes"]

    def test_tty_and_close_at_exit(self):
        w = self.open(cmd="tty; stty size", cols=100, rows=30)
        out = b""
        with self.assertRaises(ws.Closed) as cm:
            while True:
                op, p = w.recv(10)
                self.assertEqual(op, ws.BINARY)
                out += p
        self.assertEqual(cm.exception.code, 1000)
        self.assertIn(b"/dev/pts/", out)
        self.assertIn(b"30 100", out)

    def test_shell_echo_resize_text_input(self):
        w = self.open()
        w.send_binary(b"echo hi$((40+2))\r")
        w.read_until(lambda b: b"hi42" in b)
        w.send_json({"type": "resize", "cols": 123, "rows": 45})
        w.send_binary(b"stty size\r")
        w.read_until(lambda b: b"45 123" in b)
        # the attach addon sends typed text as text frames: input, not control
        w.send_text("echo t$((2+3))\r")
        w.read_until(lambda b: b"t5" in b)
        w.send_text('{"not":"a control message"}\r')
        w.read_until(lambda b: b"not" in b)
        # a bad resize: an error text frame, and the terminal goes on
        w.send_json({"type": "resize", "cols": 0, "rows": 45})
        deadline = time.time() + 10
        while True:
            op, p = w.recv(max(0.1, deadline - time.time()))
            if op == ws.TEXT:
                msg = json.loads(p)
                self.assertEqual(msg["type"], "error")
                self.assertIn("cols", msg["message"])
                break
        w.send_json({"type": "resize", "cols": 100000, "rows": 45})
        w.send_binary(b"echo still$((1+1))\r")
        w.read_until(lambda b: b"still2" in b)
        w.send_binary(b"exit\r")
        with self.assertRaises(ws.Closed) as cm:
            while True:
                w.recv(10)
        self.assertEqual(cm.exception.code, 1000)

    def test_ping(self):
        w = self.open(cmd="sleep 5")
        w.send(ws.PING, b"are you there")
        fin, op, p = w._frame(time.time() + 5)
        self.assertEqual((op, p), (ws.PONG, b"are you there"))

    def test_disconnect_kills_started_shell(self):
        w = self.open(cmd="sleep 4242")
        deadline = time.time() + 10
        mine = []
        while not mine and time.time() < deadline:
            mine = [p for p in self.procs() if p["running"] and "sleep 4242" in p["cmd"]]
            time.sleep(0.1)
        self.assertTrue(mine, self.procs())
        self.assertTrue(mine[0]["pty"])
        w.sock.close()
        deadline = time.time() + 10
        while time.time() < deadline:
            p = [x for x in self.procs() if x["pid"] == mine[0]["pid"]]
            if not p or not p[0]["running"]:
                break
            time.sleep(0.2)
        else:
            self.fail("the shell outlived its WebSocket")

    def test_attach_to_exec_pty(self):
        r = self.c.request("POST", "/v1/sandboxes/%s/exec" % self.sid,
                           body={"argv": ["cat"], "background": True, "pty": {"cols": 80, "rows": 24},
                                 "tag": "catpty"}, expect=201)[1]
        pid = r["pid"]
        w = self.open(tag="catpty")
        w.send_binary(b"hello pty\r")
        w.read_until(lambda b: b"hello pty" in b)
        w.close()
        time.sleep(1)
        p = [x for x in self.procs() if x["pid"] == pid]
        self.assertTrue(p and p[0]["running"], "closing an attach killed the process: %r" % p)
        w = self.open(pid=pid)
        w.read_until(lambda b: b"hello pty" in b)  # replayed
        w.close()
        self.c.request("POST", "/v1/sandboxes/%s/processes/%d/signal" % (self.sid, pid), body={"signal": "KILL"},
                       expect=204)

    def test_key_in_query_for_browsers(self):
        """A browser's WebSocket (xterm.js attach addon) cannot send headers: ?api_key= works
        for the PTY route and a wrong one is refused."""
        w = ws.connect(self.c, self.path(), query={"cmd": "tty", "api_key": self.c.key},
                       headers={"Authorization": None})
        out = b""
        with self.assertRaises(ws.Closed):
            while True:
                op, p = w.recv(10)
                out += p
        self.assertIn(b"/dev/pts/", out)
        self.assertApiError(401, "unauthorized", ws.connect, self.c, self.path(),
                            query={"cmd": "tty", "api_key": "moat_wrong"}, headers={"Authorization": None})

    def test_handshake_errors(self):
        p = self.path()
        self.assertApiError(400, "invalid_request", ws.connect, self.c, p, headers={"Sec-WebSocket-Key": None})
        self.assertApiError(400, "invalid_request", ws.connect, self.c, p, headers={"Sec-WebSocket-Key": "short"})
        self.assertApiError(400, "invalid_request", ws.connect, self.c, p, headers={"Sec-WebSocket-Version": "8"})
        self.assertApiError(400, "invalid_request", ws.connect, self.c, p, headers={"Upgrade": None})
        self.assertApiError(400, "invalid_request", self.c.request, "GET", p)  # plain HTTP
        self.assertApiError(401, "unauthorized", ws.connect, self.c, p, headers={"Authorization": None})
        for q in ({"cols": "0"}, {"rows": "100000"}, {"cols": "x"}, {"pid": "1", "cmd": "sh"}, {"pid": "-1"},
                  {"tag": "a/b"}, {"nope": "1"}):
            self.assertApiError(400, "invalid_request", ws.connect, self.c, p, query=q)
        self.assertApiError(404, "process_not_found", ws.connect, self.c, p, query={"pid": "999999"})
        self.assertApiError(404, "not_found", ws.connect, self.c, "/v1/sandboxes/sb-0123456789abcdefg/pty")
        self.assertAlive(self.sid)

    def _assert_closed_soon(self, w, timeout=10):
        deadline = time.time() + timeout
        try:
            while time.time() < deadline:
                w.recv(max(0.1, deadline - time.time()))
        except ws.Closed as e:
            return e.code
        except (ConnectionError, socket.timeout, TimeoutError) as e:
            self.fail("not closed: %r" % e)
        self.fail("the connection stayed open")

    def test_garbage_frames_close(self):
        w = self.open(cmd="sleep 60")
        w.send_raw(b"\xff\xff\xff\xff garbage garbage garbage" * 10)
        self.assertIn(self._assert_closed_soon(w), (1002, 1007, 1009, None))
        w = self.open(cmd="sleep 60")
        w.send(ws.BINARY, b"unmasked", mask=False)  # clients must mask
        self.assertIn(self._assert_closed_soon(w), (1002, None))
        w = self.open(cmd="sleep 60")
        try:
            w.send(ws.BINARY, b"x" * (2 << 20))  # over the 1 MiB message bound
        except (ConnectionResetError, BrokenPipeError):
            pass  # the server closed while the frame was still being sent: closed, as it should
        else:
            self.assertIn(self._assert_closed_soon(w), (1009, None))
        self.assertAlive(self.sid)

    def test_client_that_never_reads(self):
        w = ws.connect(self.c, self.path(), query={"cmd": "yes pty-flood"})
        w.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        time.sleep(2)  # the guest writes as fast as it can; nobody reads
        t0 = time.time()
        self.c.healthz()
        r = self.c.exec(self.sid, argv=["echo", "ok"])
        self.assertEqual(r["stdout"], "ok\n")
        self.assertLess(time.time() - t0, 10)
        w.sock.close()
        deadline = time.time() + 15
        while time.time() < deadline:
            if not [p for p in self.procs() if p["running"] and "pty-flood" in p["cmd"]]:
                break
            time.sleep(0.2)
        else:
            self.fail("the flooding shell outlived its WebSocket")
        self.assertAlive(self.sid)

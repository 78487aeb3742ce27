"""test_fairness.py -- one org cannot starve another: org A holds its maximum of streams (SSE event streams)
and of requests in flight (execs of a command that blocks), per sandbox and per org, and hoards idle
keep-alive connections; meanwhile org B's healthz, list, exec, create and streams are answered within bounded
time, A's request over a cap is 429 too_many_requests naming the cap (with Retry-After, its connection
closed), and A's idle connections beyond --max-idle-per-org are closed while B's are kept. moatd runs with
small caps so that the counts stay small."""

import http.client
import json
import os
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
import sse  # noqa: E402
from moatd import HTTPError  # noqa: E402
from moattest import DaemonTest  # noqa: E402
import moatd  # noqa: E402

REQ_ORG, STREAM_ORG, REQ_SB, STREAM_SB, IDLE_ORG = 6, 6, 4, 4, 4
BOUND_S = 10  # what "answered within bounded time" means here


def events_path(sid):
    return "/v1/sandboxes/%s/events" % sid


class FairnessTest(DaemonTest):
    pool = 2

    @classmethod
    def setUpClass(cls):
        cls.daemon = moatd.MoatDaemon(pool=cls.pool, extra_args=[
            "--max-requests-per-org", str(REQ_ORG), "--max-streams-per-org", str(STREAM_ORG),
            "--max-requests-per-sandbox", str(REQ_SB), "--max-streams-per-sandbox", str(STREAM_SB),
            "--max-idle-per-org", str(IDLE_ORG)])
        try:
            cls.daemon.start()
            cls.a = cls.daemon.client
            cls.c = cls.a
            cls.b = cls.a.with_key(cls.daemon.new_org_key("fair-b"))
            cls.a1 = cls.a.create(ttl_seconds=900)["id"]
            cls.a2 = cls.a.create(ttl_seconds=900)["id"]
            cls.b1 = cls.b.create(ttl_seconds=900)["id"]
        except Exception:
            cls.daemon.stop()
            raise

    def setUp(self):
        self.streams = []
        self.addCleanup(self.close_streams)

    def close_streams(self):
        for s in self.streams:
            s.close()
        self.streams = []

    def assert_b_served(self):
        """Org B is answered, each call within BOUND_S: healthz, list, exec, create + delete, a stream."""
        for what, fn in (("healthz", lambda: self.b.healthz()),
                         ("list", lambda: self.b.list()),
                         ("exec", lambda: self.assertEqual(self.b.exec(self.b1, argv=["echo", "b"],
                                                                       timeout=BOUND_S)["stdout"], "b\n")),
                         ("create", lambda: self.b.delete(self.b.create(ttl_seconds=60)["id"])),
                         ("stream", lambda: sse.open(self.b, "GET", events_path(self.b1), timeout=BOUND_S).close())):
            t0 = time.time()
            fn()
            dt = time.time() - t0
            self.assertLess(dt, BOUND_S, "org B's %s took %.1f s while org A is at its caps" % (what, dt))

    def assert_429(self, fn, flag):
        with self.assertRaises(HTTPError) as cm:
            fn()
        e = cm.exception
        self.assertEqual(e.status, 429, e.body)
        self.assertEqual(e.code, "too_many_requests", e.body)
        self.assertIn(flag, e.body["message"])

    def raw_429(self, method, path, body=None, key=None):
        """The same over a socket of our own: the headers of a 429 (Retry-After, Connection: close) and the
        connection closed after it."""
        data = json.dumps(body).encode() if body is not None else b""
        s = socket.create_connection(("127.0.0.1", self.daemon.port), timeout=BOUND_S)
        try:
            s.sendall(b"%s %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n%s" % (method.encode(), path.encode(), (key or self.a.key).encode(),
                                                         len(data), data))
            buf = b""
            while True:  # up to the close
                d = s.recv(65536)
                if not d:
                    break
                buf += d
        finally:
            s.close()
        head = buf.partition(b"\r\n\r\n")[0].decode().lower()
        self.assertTrue(head.startswith("http/1.1 429"), buf[:200])
        self.assertIn("\r\nretry-after: 1", head)
        self.assertIn("\r\nconnection: close", head)

    def open_stream(self, client, sid):
        s = sse.open(client, "GET", events_path(sid), timeout=BOUND_S)
        self.streams.append(s)
        return s

    def hold_stream(self, client, sid):
        """open_stream, waiting for the slots of streams an earlier test closed to come back."""
        deadline = time.time() + BOUND_S
        while True:
            try:
                return self.open_stream(client, sid)
            except HTTPError as e:
                if e.status != 429 or time.time() > deadline:
                    raise
                time.sleep(0.1)

    def test_streams_per_sandbox_and_per_org(self):
        for _ in range(STREAM_SB):
            self.hold_stream(self.a, self.a1)
        self.assert_429(lambda: self.open_stream(self.a, self.a1), "--max-streams-per-sandbox")
        for _ in range(STREAM_ORG - STREAM_SB):
            self.hold_stream(self.a, self.a2)  # another sandbox of A still has room
        self.assert_429(lambda: self.open_stream(self.a, self.a2), "--max-streams-per-org")
        self.raw_429("GET", events_path(self.a2))
        # other work of A is not a stream: still served
        self.assertEqual(self.a.exec(self.a1, argv=["true"], timeout=BOUND_S)["exit_code"], 0)
        self.assert_b_served()
        # the streams A holds still deliver
        self.a.request("POST", "/v1/sandboxes/%s/pause" % self.a1, body={}, expect=200)
        self.a.request("POST", "/v1/sandboxes/%s/resume" % self.a1, body={}, expect=200)
        got = self.streams[0].next(timeout=BOUND_S)
        self.assertIsNotNone(got)

    def test_requests_per_sandbox_and_per_org(self):
        errors = []
        tag = "hold-%d-%d" % (os.getpid(), int(time.time() * 1000))
        threads = []

        def hold(sid, mine):
            try:
                self.a.exec(sid, argv=["sh", "-c", "sleep 8", mine], timeout=60)
            except Exception as e:  # noqa: BLE001 -- reported below
                errors.append(e)

        def start(sid, n):
            """n execs that block, each running for sure once this returns (its shell seen on the host)."""
            mine = []
            for _ in range(n):
                mine.append("%s-%d\0" % (tag, len(threads)))
                t = threading.Thread(target=hold, args=(sid, mine[-1][:-1]))
                t.start()
                threads.append(t)
            deadline = time.time() + BOUND_S
            while not all(moatd.find_pids_by_cmdline(m) for m in mine):
                self.assertLess(time.time(), deadline, "the blocking execs did not start: %r" % errors)
                time.sleep(0.05)

        try:
            start(self.a1, REQ_SB)
            self.assert_429(lambda: self.a.exec(self.a1, argv=["true"]), "--max-requests-per-sandbox")
            start(self.a2, REQ_ORG - REQ_SB)
            self.assert_429(lambda: self.a.list(), "--max-requests-per-org")
            self.raw_429("POST", "/v1/sandboxes/%s/exec" % self.a2, body={"argv": ["true"]})
            # a stream is another budget: A can still open one
            self.hold_stream(self.a, self.a2)
            self.assert_b_served()
        finally:
            for t in threads:
                t.join(60)
        self.assertEqual(errors, [])
        # the slots came back
        self.assertEqual(self.a.exec(self.a1, argv=["true"], timeout=BOUND_S)["exit_code"], 0)

    def keepalive(self, client, n):
        """n connections of client's, each left idle after one answered list. A 429 (the request slots of
        an earlier test's calls come back once moatd has finished them, not once the client has read
        their answers) is retried on a new connection for up to BOUND_S."""
        conns = []
        deadline = time.time() + BOUND_S
        while len(conns) < n:
            s = socket.create_connection(("127.0.0.1", self.daemon.port), timeout=BOUND_S)
            self.addCleanup(s.close)
            s.sendall(b"GET /v1/sandboxes HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n" % client.key.encode())
            buf = b""
            while b"\r\n\r\n" not in buf:
                d = s.recv(65536)
                self.assertTrue(d, "moatd closed the connection before answering: %r" % buf)
                buf += d
            head, _, body = buf.partition(b"\r\n\r\n")
            n_body = int([ln.split(b":")[1] for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")][0])
            while len(body) < n_body:
                body += s.recv(65536)
            if buf.startswith(b"HTTP/1.1 429") and time.time() < deadline:
                s.close()
                time.sleep(0.1)
                continue
            self.assertTrue(buf.startswith(b"HTTP/1.1 200"), head + b"\n" + body)
            conns.append(s)
        return conns

    @staticmethod
    def is_closed(s):
        s.settimeout(0.05)
        try:
            return s.recv(1) == b""
        except socket.timeout:
            return False
        except ConnectionError:
            return True

    def test_recently_used_connections_are_kept(self):
        """Over --max-idle-per-org, a connection idle for less than 5 s is not closed: a client may be
        sending its next request on it at that moment (a POST lost so is not sent again)."""
        conns = self.keepalive(self.a, 3 * IDLE_ORG)
        time.sleep(1)  # five passes of the watchdog
        closed = [i for i, s in enumerate(conns) if self.is_closed(s)]
        self.assertEqual(closed, [], "connections idle 1 s were closed")

    def test_idle_keepalive_connections_per_org(self):
        b_conns = self.keepalive(self.b, IDLE_ORG - 1)
        a_conns = self.keepalive(self.a, 3 * IDLE_ORG)
        deadline = time.time() + BOUND_S
        while time.time() < deadline:
            open_a = [s for s in a_conns if not self.is_closed(s)]
            if len(open_a) <= IDLE_ORG:
                break
            time.sleep(0.2)
        self.assertLessEqual(len(open_a), IDLE_ORG, "org A keeps %d idle connections" % len(open_a))
        # the newest of A's stay, B's are untouched and still serve
        self.assertFalse(self.is_closed(a_conns[-1]))
        for s in b_conns:
            self.assertFalse(self.is_closed(s), "org B's idle connection was closed")
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            s.settimeout(BOUND_S)
            self.assertTrue(s.recv(65536).startswith(b"HTTP/1.1 200"))

    def test_e2b_streaming_rpc_counts(self):
        """E2B's streaming RPCs (envd process Start) count as streams of the org and sandbox."""
        for _ in range(STREAM_SB):
            self.hold_stream(self.a, self.a1)
        conn = http.client.HTTPConnection("127.0.0.1", self.daemon.port, timeout=BOUND_S)
        try:
            body = b'\x00\x00\x00\x00\x02{}'
            conn.request("POST", "/process.Process/Start", body=body, headers={
                "X-API-KEY": self.a.key, "E2b-Sandbox-Id": self.a1, "E2b-Sandbox-Port": "49983",
                "Content-Type": "application/connect+json", "Connect-Protocol-Version": "1"})
            r = conn.getresponse()
            payload = json.loads(r.read())
        finally:
            conn.close()
        self.assertEqual(r.status, 429, payload)
        self.assertEqual(payload["code"], "resource_exhausted", payload)
        self.assertIn("--max-streams-per-sandbox", payload["message"])

"""test_http_framing.py -- request framing and connection deadlines, over raw sockets, on the API listener
and on the exposed-ports proxy listener: ambiguous framing (Content-Length with Transfer-Encoding, two
different Content-Lengths, a coding other than chunked, whitespace before a colon) is a JSON 400 with the
connection closed and the request never run; a chunk size of 2^64-1 is a JSON 400 at once; a request head
trickled a byte at a time (slowloris), a connection that never sends a request and an idle keep-alive
connection are closed after --header-timeout / --idle-timeout, while a connection in use is not."""

import json
import os
import socket
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
import moatd  # noqa: E402
from moattest import DaemonTest  # noqa: E402

HEADER_TIMEOUT_S = 2
IDLE_TIMEOUT_S = 3


def read_response(sock, timeout):
    """One HTTP response from sock: (status, headers, body bytes), or None when the connection closed
    (or reset) before a status line."""
    sock.settimeout(timeout)
    buf = b""
    try:
        while b"\r\n\r\n" not in buf:
            chunk = sock.recv(65536)
            if not chunk:
                break
            buf += chunk
    except ConnectionResetError:
        pass
    if b"\r\n\r\n" not in buf:
        return None
    head, _, body = buf.partition(b"\r\n\r\n")
    lines = head.decode(errors="replace").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for ln in lines[1:]:
        k, _, v = ln.partition(":")
        headers[k.strip().lower()] = v.strip()
    n = int(headers.get("content-length", "0"))
    try:
        while len(body) < n:
            chunk = sock.recv(65536)
            if not chunk:
                break
            body += chunk
    except (socket.timeout, ConnectionResetError):
        pass
    rest = body[n:]
    return status, headers, body[:n], rest


def closed_within(sock, timeout):
    """True when the peer closes (EOF or reset) within timeout seconds; data read meanwhile is dropped."""
    sock.settimeout(timeout)
    deadline = time.time() + timeout
    try:
        while time.time() < deadline:
            sock.settimeout(max(0.05, deadline - time.time()))
            if not sock.recv(65536):
                return True
    except socket.timeout:
        return False
    except (ConnectionResetError, BrokenPipeError):
        return True
    return False


class FramingTest(DaemonTest):
    pool = 1

    @classmethod
    def setUpClass(cls):
        cls.proxy_port = moatd.free_port()
        cls.daemon = moatd.MoatDaemon(pool=cls.pool, extra_args=[
            "--header-timeout", str(HEADER_TIMEOUT_S), "--idle-timeout", str(IDLE_TIMEOUT_S),
            "--proxy-listen", "127.0.0.1:%d" % cls.proxy_port])
        try:
            cls.daemon.start()
        except Exception:
            cls.daemon.stop()
            raise
        cls.c = cls.daemon.client
        cls.key = cls.c.key.encode()
        cls.sid = cls.c.create(ttl_seconds=600, metadata={"suite": "framing"})["id"]

    def tearDown(self):
        self.c.healthz()  # whatever a test sent, the daemon still answers

    def connect(self, port=None):
        s = socket.create_connection(("127.0.0.1", port or self.daemon.port), timeout=10)
        self.addCleanup(s.close)
        return s

    def count_sandboxes(self):
        return len(self.c.list(metadata={"suite": "framing"}))

    def assert_rejected(self, raw, port=None, want_in_message=None, status=400):
        """raw is answered `status` with a JSON {code, message} and the connection is closed."""
        s = self.connect(port)
        s.sendall(raw)
        r = read_response(s, 10)
        self.assertIsNotNone(r, "connection closed without an answer to %r" % raw[:120])
        st, headers, body, _ = r
        self.assertEqual(st, status, (raw[:120], body))
        self.assertIn("json", headers.get("content-type", ""), body)
        j = json.loads(body)
        self.assertEqual(j["code"], "invalid_request", j)
        if want_in_message:
            self.assertIn(want_in_message, j["message"])
        self.assertEqual(headers.get("connection", "").lower(), "close", headers)
        self.assertTrue(closed_within(s, 5), "connection left open after a framing error")
        return j

    def create_head(self, *extra):
        return (b"POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
                b"Content-Type: application/json\r\n" % self.key) + b"".join(e + b"\r\n" for e in extra) + b"\r\n"

    BODY = b'{"metadata":{"suite":"framing"}}'

    def test_content_length_with_transfer_encoding(self):
        before = self.count_sandboxes()
        chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(self.BODY), self.BODY)
        for extra in ((b"Content-Length: %d" % len(chunked), b"Transfer-Encoding: chunked"),
                      (b"Transfer-Encoding: chunked", b"Content-Length: %d" % len(self.BODY))):
            with self.subTest(order=extra):
                self.assert_rejected(self.create_head(*extra) + chunked,
                                     want_in_message="both Content-Length and Transfer-Encoding")
        self.assertEqual(self.count_sandboxes(), before, "a request with ambiguous framing was run")

    def test_conflicting_content_lengths(self):
        before = self.count_sandboxes()
        self.assert_rejected(self.create_head(b"Content-Length: %d" % len(self.BODY), b"Content-Length: 5") +
                             self.BODY, want_in_message="differ")
        self.assertEqual(self.count_sandboxes(), before)
        # the same value twice is one length
        s = self.connect()
        s.sendall(self.create_head(b"Content-Length: %d" % len(self.BODY),
                                   b"Content-Length: %d" % len(self.BODY)) + self.BODY)
        st, _, body, _ = read_response(s, 60)
        self.assertEqual(st, 201, body)
        self.c.delete(json.loads(body)["id"])

    def test_other_framing_faults(self):
        cases = [
            (self.create_head(b"Transfer-Encoding: gzip") + self.BODY, "gzip"),
            (self.create_head(b"Transfer-Encoding: chunked", b"Transfer-Encoding: chunked") + b"0\r\n\r\n",
             "more than once"),
            (self.create_head(b"Content-Length : %d" % len(self.BODY)) + self.BODY, "whitespace"),
            (self.create_head(b"Content-Length: -1"), "decimal"),
            (self.create_head(b"X-Folded: a", b" b"), "folding"),
            (b"POST /v1/sandboxes HTTP/1.0\r\nAuthorization: Bearer %s\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
             % self.key, "HTTP/1.0"),
        ]
        before = self.count_sandboxes()
        for raw, want in cases:
            with self.subTest(want=want):
                self.assert_rejected(raw, want_in_message=want)
        self.assertEqual(self.count_sandboxes(), before)

    def test_chunk_size_overflow(self):
        before = self.count_sandboxes()
        t0 = time.time()
        j = self.assert_rejected(self.create_head(b"Transfer-Encoding: chunked") +
                                 b"FFFFFFFFFFFFFFFF\r\n" + self.BODY + b"\r\n0\r\n\r\n", want_in_message="chunk size")
        self.assertLess(time.time() - t0, 8, "the overflowing chunk was not answered at once: %r" % j)
        # a chunk size that is not hexadecimal
        self.assert_rejected(self.create_head(b"Transfer-Encoding: chunked") + b"-1\r\n", want_in_message="chunk")
        self.assertEqual(self.count_sandboxes(), before)

    def test_pipelined_bad_request_after_good_one(self):
        s = self.connect()
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" +
                  b"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab")
        st, _, body, rest = read_response(s, 10)
        self.assertEqual(st, 200, body)
        # the second answer may already sit in rest
        s2 = _Prefixed(s, rest)
        st, headers, body, _ = read_response(s2, 10)
        self.assertEqual(st, 400, body)
        self.assertIn("differ", json.loads(body)["message"])
        self.assertTrue(closed_within(s, 5))

    def test_good_chunked_requests_still_work(self):
        s = self.connect()
        chunks = b"".join(b"%x\r\n%s\r\n" % (1, self.BODY[i:i + 1]) for i in range(len(self.BODY)))
        s.sendall(self.create_head(b"Transfer-Encoding: chunked") + chunks + b"0\r\nX-Trailer: 1\r\n\r\n")
        st, _, body, _ = read_response(s, 60)
        self.assertEqual(st, 201, body)
        self.c.delete(json.loads(body)["id"])
        # a 3 MiB upload in 64 KiB chunks, then a second request on the same connection
        data = os.urandom(3 << 20)
        head = (b"PUT /v1/sandboxes/%s/files?path=/root/up.bin HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n" % (self.sid.encode(), self.key))
        body = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(data[i:i + 65536]), data[i:i + 65536])
                        for i in range(0, len(data), 65536)) + b"0\r\n\r\n"
        s.sendall(head + body)
        st, _, rbody, _ = read_response(s, 60)
        self.assertEqual(st, 200, rbody)
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        st, _, _, _ = read_response(s, 10)
        self.assertEqual(st, 200)
        self.assertEqual(self.c.get_file(self.sid, "/root/up.bin"), data)

    def test_slowloris_header_closed(self):
        s = self.connect()
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        t0 = time.time()
        got = b""
        closed = False
        # a byte every 0.5 s: never idle long enough for an inactivity timeout
        while time.time() - t0 < HEADER_TIMEOUT_S + 8:
            try:
                s.sendall(b"X")
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            s.settimeout(0.5)
            try:
                d = s.recv(65536)
                if not d:
                    closed = True
                    break
                got += d
            except socket.timeout:
                pass
            except ConnectionResetError:
                closed = True
                break
        dt = time.time() - t0
        self.assertTrue(closed, "a head trickled a byte every 0.5 s was still open after %.1f s" % dt)
        self.assertLess(dt, HEADER_TIMEOUT_S + 3)
        if got:  # the 408 may be lost to a reset; if it came, it is JSON
            self.assertTrue(got.startswith(b"HTTP/1.1 408"), got[:200])
            self.assertIn(b'"code":"request_timeout"', got)

    def test_connection_without_request_closed(self):
        s = self.connect()
        t0 = time.time()
        self.assertTrue(closed_within(s, HEADER_TIMEOUT_S + 5), "a connection that sent nothing stayed open")
        self.assertGreaterEqual(time.time() - t0, HEADER_TIMEOUT_S - 0.5)

    def test_idle_keepalive_closed_busy_kept(self):
        s = self.connect()
        # used every second for longer than the idle timeout: kept
        t0 = time.time()
        while time.time() - t0 < IDLE_TIMEOUT_S + 2:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            r = read_response(s, 10)
            self.assertIsNotNone(r, "a keep-alive connection in use was closed")
            self.assertEqual(r[0], 200)
            time.sleep(1)
        # then idle: closed after the idle timeout
        t1 = time.time()
        self.assertTrue(closed_within(s, IDLE_TIMEOUT_S + 5), "an idle keep-alive connection stayed open")
        self.assertGreaterEqual(time.time() - t1, IDLE_TIMEOUT_S - 1.5)

    def test_slow_but_complete_head_is_served(self):
        s = self.connect()
        head = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
        for i in range(0, len(head), 8):  # well within the header timeout
            s.sendall(head[i:i + 8])
            time.sleep(0.05)
        r = read_response(s, 10)
        self.assertIsNotNone(r)
        self.assertEqual(r[0], 200)

    def test_port_proxy_listener(self):
        host = b"8080-%s.localhost" % self.sid.encode()
        self.assert_rejected(b"POST / HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Length: 4\r\n"
                             b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n" % (host, self.key),
                             port=self.proxy_port, want_in_message="both Content-Length and Transfer-Encoding")
        self.assert_rejected(b"POST / HTTP/1.1\r\nHost: %s\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab" % host,
                             port=self.proxy_port, want_in_message="differ")
        self.assert_rejected(b"POST / HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\n"
                             b"Transfer-Encoding: chunked\r\n\r\nFFFFFFFFFFFFFFFF\r\nab\r\n0\r\n\r\n" % (host, self.key),
                             port=self.proxy_port, want_in_message="chunk size")
        # slowloris on the proxy listener, and on the path proxy of the API listener
        for port, head in ((self.proxy_port, b"GET / HTTP/1.1\r\nHost: %s\r\n" % host),
                           (self.daemon.port, b"GET /v1/sandboxes/%s/ports/8080/ HTTP/1.1\r\n" % self.sid.encode())):
            with self.subTest(port=port):
                s = self.connect(port)
                s.sendall(head)
                t0 = time.time()
                closed = False
                while time.time() - t0 < HEADER_TIMEOUT_S + 8 and not closed:
                    try:
                        s.sendall(b"X")
                        s.settimeout(0.5)
                        closed = s.recv(65536) == b"" or closed
                    except socket.timeout:
                        pass
                    except (BrokenPipeError, ConnectionResetError):
                        closed = True
                self.assertTrue(closed, "slowloris connection on port %d never closed" % port)
        # the same framing faults on the path proxy
        self.assert_rejected(b"POST /v1/sandboxes/%s/ports/8080/ HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
                             b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
                             % (self.sid.encode(), self.key), want_in_message="both")


class _Prefixed:
    """A socket whose first bytes were already read (pipelined answers)."""

    def __init__(self, sock, prefix):
        self.sock, self.prefix = sock, prefix

    def settimeout(self, t):
        self.sock.settimeout(t)

    def recv(self, n):
        if self.prefix:
            p, self.prefix = self.prefix[:n], self.prefix[n:]
            return p
        return self.sock.recv(n)


class ConnectionLimitTest(DaemonTest):
    """--max-conns-per-ip is libmicrohttpd's limit: a connection beyond it is closed unanswered, and moatd
    serves that address again once some close."""
    pool = 0
    PER_IP = 3

    @classmethod
    def setUpClass(cls):
        cls.daemon = moatd.MoatDaemon(pool=0, extra_args=["--max-conns-per-ip", str(cls.PER_IP)])
        try:
            cls.daemon.start()
        except Exception:
            cls.daemon.stop()
            raise
        cls.c = cls.daemon.client

    def test_per_address_limit(self):
        held = []
        try:
            # Each held connection is one moatd has served (a request answered on it, kept alive), so
            # the extra one is over the limit however slowly moatd notices earlier connections closing.
            deadline = time.time() + 10
            while len(held) < self.PER_IP:
                s = socket.create_connection(("127.0.0.1", self.daemon.port), timeout=10)
                try:
                    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                    served = read_response(s, 10)
                except (BrokenPipeError, ConnectionResetError):
                    served = None
                if served and served[0] == 200:
                    held.append(s)
                    continue
                s.close()  # refused: a connection from before this test has not been released yet
                self.assertLess(time.time(), deadline, "moatd did not serve %d connections" % self.PER_IP)
                time.sleep(0.1)
            extra = socket.create_connection(("127.0.0.1", self.daemon.port), timeout=10)
            try:
                extra.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                self.assertIsNone(read_response(extra, 10), "a connection over --max-conns-per-ip was served")
            except (BrokenPipeError, ConnectionResetError):
                pass
            finally:
                extra.close()
        finally:
            for s in held:
                s.close()
        deadline = time.time() + 10
        while True:
            try:
                self.c.healthz()
                break
            except Exception:  # noqa: BLE001 -- the held connections are still being torn down
                self.assertLess(time.time(), deadline)
                time.sleep(0.1)

"""test_badinput.py -- malformed and hostile requests each get a JSON error with the right status, and
leave the daemon and every other sandbox untouched."""

import json
import os
import select
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
from moattest import DaemonTest  # noqa: E402


def read_http_response(sock, timeout):
    """Reads one HTTP response (status, headers dict, body bytes) from sock."""
    sock.settimeout(timeout)
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            break
        buf += chunk
    head, _, body = buf.partition(b"\r\n\r\n")
    lines = head.decode(errors="replace").split("\r\n")
    status = int(lines[0].split()[1]) if lines and len(lines[0].split()) > 1 else 0
    headers = {}
    for ln in lines[1:]:
        if ":" in ln:
            k, v = ln.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    n = int(headers.get("content-length", "-1"))
    try:
        while n < 0 or len(body) < n:
            chunk = sock.recv(65536)
            if not chunk:
                break
            body += chunk
    except socket.timeout:
        pass
    return status, headers, body[:n] if n >= 0 else body


class BadInputTest(DaemonTest):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.bystander = cls.c.create(ttl_seconds=3600)["id"]

    def tearDown(self):
        # whatever the test sent, the daemon and the bystander sandbox are fine
        self.assertAlive(self.bystander)

    def post_raw(self, path, data):
        return self.c.request("POST", path, body=data, expect=None)

    def test_malformed_json(self):
        for body in (b"{", b"{\"template\": }", b"not json", b"\xff\xfe", b"{\"a\":1}}", b"[1,2"):
            with self.subTest(body=body):
                self.assertApiError(400, "invalid_json", self.post_raw, "/v1/sandboxes", body)
        for body in (b"[]", b"\"str\"", b"42", b"null"):
            with self.subTest(body=body):
                self.assertApiError(400, ("invalid_json", "invalid_request"), self.post_raw, "/v1/sandboxes", body)
        self.assertApiError(400, "invalid_json", self.post_raw, "/v1/sandboxes/%s/exec" % self.bystander, b"{")

    def test_wrong_types_and_unknown_fields(self):
        cases = [
            {"template": 5}, {"ttl_seconds": "10"}, {"ttl_seconds": True}, {"persistent": "yes"},
            {"metadata": "x"}, {"metadata": {"k": 1}}, {"metadata": ["a"]}, {"env": []}, {"env": {"K": 1}},
            {"env": {"1BAD": "x"}}, {"env": {"A=B": "x"}}, {"cpu": "2"}, {"memory_mb": "64"}, {"pids": None},
            {"disk_mb": [1]}, {"bogus_field": 1},
        ]
        for spec in cases:
            with self.subTest(spec=spec):
                e = self.assertApiError(400, "invalid_request", self.c.create, **spec)
                field = list(spec)[0]
                self.assertIn(field, e.body["message"])
        self.assertApiError(400, "invalid_request", self.c.create, metadata={"k%d" % i: "v" for i in range(65)})
        self.assertApiError(400, "invalid_request", self.c.create, metadata={"k" * 129: "v"})
        self.assertApiError(400, "invalid_request", self.c.create, metadata={"k": "v" * 1025})

    def test_unknown_template(self):
        e = self.assertApiError(400, "invalid_request", self.c.create, template="no-such-template")
        self.assertIn("unknown template 'no-such-template'", e.body["message"])
        self.assertApiError(400, "invalid_request", self.c.create, template="../../etc")
        self.assertApiError(400, "invalid_request", self.c.create, template="")

    def test_bad_limits(self):
        cases = [
            {"memory_mb": -1}, {"memory_mb": 0}, {"memory_mb": 15}, {"memory_mb": 10 ** 12}, {"memory_mb": 64.5},
            {"cpu": -1}, {"cpu": 0}, {"cpu": 0.01}, {"cpu": 65}, {"cpu": 1e300},
            {"pids": -5}, {"pids": 7}, {"pids": 10 ** 9}, {"pids": 10.5},
            {"disk_mb": -1}, {"disk_mb": 10 ** 15}, {"disk_mb": 100.25},
            {"ttl_seconds": -1}, {"ttl_seconds": 0}, {"ttl_seconds": 10 ** 10}, {"ttl_seconds": 1.5},
        ]
        for spec in cases:
            with self.subTest(spec=spec):
                e = self.assertApiError(400, "invalid_request", self.c.create, **spec)
                self.assertIn(list(spec)[0], e.body["message"])
        # an integer beyond 64 bits
        self.assertApiError(400, ("invalid_json", "invalid_request"), self.post_raw, "/v1/sandboxes",
                            b'{"memory_mb": 123456789012345678901234567890}')
        self.assertEqual(self.c.list(state="creating"), [])

    def test_bad_exec_bodies(self):
        sid = self.bystander
        for body in ({}, {"cmd": "true", "argv": ["true"]}, {"argv": []}, {"argv": [1]}, {"argv": "true"},
                     {"cmd": 5}, {"cmd": "true", "timeout_ms": 0}, {"cmd": "true", "timeout_ms": -1},
                     {"cmd": "true", "timeout_ms": 10 ** 12}, {"cmd": "true", "env": {"K": 1}},
                     {"cmd": "true", "cwd": 3}, {"cmd": "true", "nope": 1}, {"cmd": "true", "stdin_b64": "!!!"}):
            with self.subTest(body=body):
                self.assertApiError(400, "invalid_request", self.c.request, "POST",
                                    "/v1/sandboxes/%s/exec" % sid, body=body)

    def test_nul_and_long_paths(self):
        sid = self.bystander
        base = "/v1/sandboxes/%s/files" % sid
        for route in ("", "/stat", "/list"):
            with self.subTest(route=route):
                self.assertApiError(400, None, self.c.request, "GET", base + route + "?path=/etc/hostname%00.txt")
        self.assertApiError(400, None, self.c.request, "PUT", base + "?path=/tmp/a%00b", raw=b"x")
        self.assertApiError(400, None, self.c.request, "POST", base + "/mkdir", body={"path": "/tmp/a\u0000b"})
        self.assertApiError(400, None, self.c.request, "POST", base + "/move",
                            body={"from": "/etc/hostname", "to": "/tmp/x\u0000y"})
        long_path = "/tmp/" + "a" * 4100
        self.assertApiError((400, 414), None, self.c.get_file, sid, long_path)
        self.assertApiError((400, 414), None, self.c.put_file, sid, long_path, b"x")
        self.assertApiError(400, None, self.c.mkdir, sid, long_path)
        self.assertApiError(400, "invalid_request", self.c.request, "GET", base)  # no path
        self.assertApiError(400, "invalid_json", self.c.request, "POST", base + "/mkdir", body=b"{")

    def test_methods(self):
        self.assertApiError(405, "method_not_allowed", self.c.request, "PUT", "/v1/sandboxes")
        self.assertApiError(405, "method_not_allowed", self.c.request, "POST", "/v1/sandboxes/%s" % self.bystander)

    def test_json_body_over_1mib(self):
        big = json.dumps({"metadata": {"k": "v" * (2 << 20)}}).encode()
        self.assertApiError(413, "payload_too_large", self.post_raw, "/v1/sandboxes", big)

    def stream_body(self, path, declared, body_chunks, limit_s=30):
        """Sends a request declaring `declared` bytes and streams body_chunks (an iterator) while
        watching for an early answer. Returns (status, body, bytes sent, seconds)."""
        s = socket.create_connection(("127.0.0.1", self.daemon.port), timeout=30)
        try:
            head = ("POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\n"
                    "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (path, self.c.key, declared))
            s.sendall(head.encode())
            sent = 0
            t0 = time.time()
            s.setblocking(False)
            pending = b""
            while time.time() - t0 < limit_s:
                if not pending:
                    pending = next(body_chunks, b"")
                    if not pending:
                        break
                r, w, _ = select.select([s], [s], [], 1.0)
                if r:
                    break
                if w:
                    try:
                        n = s.send(pending)
                        sent += n
                        pending = pending[n:]
                    except (BlockingIOError, InterruptedError):
                        pass
                    except (BrokenPipeError, ConnectionResetError):
                        break
            s.setblocking(True)
            status, headers, body = read_http_response(s, 10)
            return status, body, sent, time.time() - t0
        finally:
            s.close()

    def test_json_body_over_1mib(self):
        big = json.dumps({"metadata": {"k": "v" * (2 << 20)}}).encode()
        chunks = iter([big[i:i + 65536] for i in range(0, len(big), 65536)])
        status, body, sent, dt = self.stream_body("/v1/sandboxes", len(big), chunks)
        self.assertEqual(status, 413, body)
        self.assertEqual(json.loads(body)["code"], "payload_too_large")

    def test_2gib_body_rejected_fast(self):
        """Declares a 2 GiB body and streams it: the daemon must answer 413 without reading it all."""
        chunk = b" " * (256 << 10)

        def gen():
            while True:
                yield chunk
        status, body, sent, dt = self.stream_body("/v1/sandboxes", 2 << 30, gen())
        self.assertEqual(status, 413, body)
        self.assertEqual(json.loads(body)["code"], "payload_too_large")
        self.assertLess(sent, 256 << 20, "daemon read %d bytes of a 2 GiB body" % sent)
        self.assertLess(dt, 10)

    def test_slow_clients(self):
        """Half-sent requests held open do not stall anyone else."""
        socks = []
        try:
            for i in range(12):
                s = socket.create_connection(("127.0.0.1", self.daemon.port), timeout=30)
                if i % 3 == 0:
                    s.sendall(b"POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\nContent-Len")
                elif i % 3 == 1:
                    s.sendall(b"POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
                              b"Content-Length: 100\r\n\r\n{\"ttl_" % self.c.key.encode())
                socks.append(s)
            time.sleep(0.3)
            worst = 0.0
            for _ in range(10):
                t0 = time.time()
                self.c.healthz()
                self.c.list()
                r = self.c.exec(self.bystander, argv=["true"])
                self.assertEqual(r["exit_code"], 0)
                worst = max(worst, time.time() - t0)
            self.assertLess(worst, 2.0, "requests stalled behind slow clients")
            # work that creates also goes through
            sb = self.sandbox()
            self.assertAlive(sb["id"])
        finally:
            for s in socks:
                s.close()

    def test_many_connections_opened_and_dropped(self):
        def hammer():
            for _ in range(50):
                try:
                    s = socket.create_connection(("127.0.0.1", self.daemon.port), timeout=5)
                    s.sendall(b"GET /v1/sandboxes HTTP/1.1\r\nHost: x\r\n")
                    s.close()
                except OSError:
                    pass
        ts = [threading.Thread(target=hammer) for _ in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        self.c.healthz()

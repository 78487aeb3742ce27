"""test_ports.py -- exposed ports: servers started INSIDE a sandbox (tests/lib/port_servers.py:
an HTTP/1.1 server and a WebSocket echo server on 127.0.0.1 of the sandbox's own namespace) reached through
moatd by path (/v1/sandboxes/ID/ports/P/... on the API listener) and by host name (P-ID.moat.test on the
proxy listener, --proxy-listen): GET/POST with a 5 MB body (sized and chunked), chunked and close-delimited
responses, keep-alive, WebSocket echo, the per-port access token, errors (port not listening 502, bad
port 400, other org 404, paused 409), and a sandbox killed in the middle of a streamed response."""

import hashlib
import http.client
import json
import os
import socket
import sys
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
import moatd  # noqa: E402
import ws  # noqa: E402
from moattest import DaemonTest  # noqa: E402
from nettest import NetDaemonTest, skip_unless_root  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SERVERS = os.path.join(os.path.dirname(HERE), "lib", "port_servers.py")
DOMAIN = "moat.test"
HTTP_PORT, WS_PORT, DEAD_PORT, EVIL_PORT = 8000, 8001, 8002, 8003
PATTERN = bytes(range(256)) * 256


def pattern(n):
    out = PATTERN * (n // len(PATTERN) + 1)
    return out[:n]


class _Target:
    """What ws.connect needs of a client: where to connect and the key it puts in Authorization."""

    def __init__(self, host, port, key):
        self.host, self.port, self.key = host, port, key


def start_servers(c, sid):
    with open(SERVERS, "rb") as f:
        c.put_file(sid, "/tmp/port_servers.py", f.read())
    c.request("POST", "/v1/sandboxes/%s/exec" % sid, expect=201,
              body={"argv": ["python3", "/tmp/port_servers.py", str(HTTP_PORT), str(WS_PORT), str(EVIL_PORT)],
                    "background": True,
                    "tag": "port-servers"})
    deadline = time.time() + 30
    while time.time() < deadline:
        st, _ = c.request("GET", "/v1/sandboxes/%s/ports/%d/hello" % (sid, HTTP_PORT), expect=(200, 502))
        if st == 200:
            return
        time.sleep(0.1)
    raise AssertionError("the servers in %s did not come up" % sid)


class PortsTest(DaemonTest):
    @classmethod
    def setUpClass(cls):
        cls.proxy_port = moatd.free_port()
        cls.daemon = moatd.MoatDaemon(pool=1, extra_args=["--proxy-listen", "127.0.0.1:%d" % cls.proxy_port,
                                                          "--proxy-domain", DOMAIN])
        try:
            cls.daemon.start()
            cls.c = cls.daemon.client
            cls.sid = cls.c.create(template="code-interpreter", ttl_seconds=3600)["id"]
            start_servers(cls.c, cls.sid)
        except Exception:
            cls.daemon.stop()
            raise

    # -- helpers --
    def path(self, port, rest="", sid=None):
        return "/v1/sandboxes/%s/ports/%d/%s" % (sid or self.sid, port, rest)

    def host(self, port, sid=None):
        return "%d-%s.%s" % (port, sid or self.sid, DOMAIN)

    def api_conn(self):
        return http.client.HTTPConnection("127.0.0.1", self.daemon.port, timeout=60)

    def proxy_conn(self):
        return http.client.HTTPConnection("127.0.0.1", self.proxy_port, timeout=60)

    def call(self, routing, method, rest, port=HTTP_PORT, body=None, headers=None, key=True, sid=None,
             chunked=False):
        """One request by "path" (API listener) or "host" (proxy listener); returns (status, headers, body)."""
        h = dict(headers or {})
        if key:
            h.setdefault("Authorization", "Bearer " + self.c.key)
        if routing == "path":
            conn, target = self.api_conn(), self.path(port, rest, sid)
        else:
            conn, target = self.proxy_conn(), "/" + rest
            h["Host"] = self.host(port, sid)
        try:
            if chunked:
                conn.request(method, target, body=iter(body), headers=h, encode_chunked=True)
            else:
                conn.request(method, target, body=body, headers=h)
            r = conn.getresponse()
            data = r.read()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, data
        finally:
            conn.close()

    def json_call(self, *a, **kw):
        st, h, data = self.call(*a, **kw)
        return st, json.loads(data) if data else None

    # -- HTTP --
    def test_get_both_routings(self):
        for routing in ("path", "host"):
            st, h, data = self.call(routing, "GET", "hello")
            self.assertEqual((st, data), (200, b"hello"), routing)
            self.assertEqual(h.get("content-length"), "5")

    def test_request_as_sent_and_moat_headers_removed(self):
        st, j = self.json_call("path", "GET", "echo?a=1&b=x%2Fy&moat_token=zzz&c",
                               headers={"X-Custom": "v1", "X-API-Key": "nope"})
        self.assertEqual(st, 200)
        self.assertEqual(j["method"], "GET")
        self.assertEqual(j["path"], "/echo?a=1&b=x%2Fy&c")
        hdrs = {k.lower(): v for k, v in j["headers"].items()}
        self.assertEqual(hdrs.get("x-custom"), "v1")
        self.assertNotIn("authorization", hdrs, "moat's API key reached the sandbox")
        self.assertNotIn("x-api-key", hdrs)
        self.assertEqual(hdrs.get("x-forwarded-prefix"), "/v1/sandboxes/%s/ports/%d" % (self.sid, HTTP_PORT))
        self.assertEqual(hdrs.get("x-forwarded-for"), "127.0.0.1")
        st, j = self.json_call("host", "GET", "echo?q=%20")
        self.assertEqual((st, j["path"]), (200, "/echo?q=%20"))
        hdrs = {k.lower(): v for k, v in j["headers"].items()}
        self.assertEqual(hdrs.get("host"), self.host(HTTP_PORT))
        self.assertNotIn("authorization", hdrs)

    def test_post_5mb(self):
        body = pattern(5 << 20)
        want = hashlib.sha256(body).hexdigest()
        for routing in ("path", "host"):
            st, j = self.json_call(routing, "POST", "echo", body=body,
                                   headers={"Content-Type": "application/octet-stream"})
            self.assertEqual((st, j["body_len"], j["body_sha256"]), (200, len(body), want), routing)
            # the same body sent chunked by the client goes on chunked
            pieces = [body[i:i + 300000] for i in range(0, len(body), 300000)]
            st, j = self.json_call(routing, "PUT", "echo", body=pieces, chunked=True)
            self.assertEqual((st, j["method"], j["body_len"], j["body_sha256"]), (200, "PUT", len(body), want),
                             routing)

    def test_responses_chunked_sized_and_close_delimited(self):
        want = b"".join(b"chunk-%d\n" % i for i in range(200))
        for routing in ("path", "host"):
            st, h, data = self.call(routing, "GET", "chunked?n=200")
            self.assertEqual((st, data), (200, want), routing)
            st, h, data = self.call(routing, "GET", "big?n=%d" % (8 << 20))
            self.assertEqual(st, 200)
            self.assertEqual(hashlib.sha256(data).hexdigest(), hashlib.sha256(pattern(8 << 20)).hexdigest())
            st, h, data = self.call(routing, "GET", "close?n=%d" % (1 << 20))
            self.assertEqual((st, len(data)), (200, 1 << 20))
            self.assertEqual(data, pattern(1 << 20))
            st, h, data = self.call(routing, "HEAD", "hello")
            self.assertEqual((st, data, h.get("content-length")), (200, b"", "5"), routing)
            st, h, data = self.call(routing, "GET", "status/204")
            self.assertEqual((st, data), (204, b""))
            st, h, data = self.call(routing, "GET", "status/418")
            self.assertEqual(st, 418)
            st, h, data = self.call(routing, "GET", "nothing-here")
            self.assertEqual((st, data), (404, b"no such page"))

    def _raw(self, req):
        s = socket.create_connection(("127.0.0.1", self.proxy_port), timeout=30)
        try:
            s.sendall(req)
            out = b""
            while b"\r\n\r\n" not in out:
                d = s.recv(65536)
                if not d:
                    break
                out += d
            head, _, body = out.partition(b"\r\n\r\n")
            n = int([ln.split(b":")[1] for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length:")][0])
            while len(body) < n:
                d = s.recv(65536)
                if not d:
                    break
                body += d
            return int(head.split()[1]), json.loads(body)
        finally:
            s.close()

    def test_framing_is_the_proxys_own(self):
        auth = "Authorization: Bearer %s\r\n" % self.c.key
        host = "Host: %s\r\n" % self.host(HTTP_PORT)
        # Content-Length next to chunked: refused before the server sees anything (no smuggling)
        st, j = self._raw(("POST /echo HTTP/1.1\r\n%s%sContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
                           "3\r\nabc\r\n0\r\n\r\n" % (host, auth)).encode())
        self.assertEqual((st, j["code"]), (400, "invalid_request"), j)
        # chunked alone: the server gets the body re-framed, without a length it was not sent
        st, j = self._raw(("POST /echo HTTP/1.1\r\n%s%sTransfer-Encoding: chunked\r\n\r\n"
                           "3\r\nabc\r\n0\r\n\r\n" % (host, auth)).encode())
        self.assertEqual((st, j["body_len"]), (200, 3))
        self.assertNotIn("content-length", {k.lower() for k in j["headers"]})
        # a space in the request target is refused, not passed on
        st, j = self._raw(("GET /a b HTTP/1.1\r\n%s%s\r\n" % (host, auth)).encode())
        self.assertEqual((st, j["code"]), (400, "invalid_request"))

    def test_hostile_server_responses(self):
        """Broken answers from a server in the sandbox: 502 before the head, a cut connection after it; moatd
        stays up and serves the next request."""
        import port_servers
        for routing in ("path", "host"):
            for n in range(len(port_servers.EVIL)):
                t0 = time.time()
                try:
                    st, h, data = self.call(routing, "GET", str(n), port=EVIL_PORT)
                except (http.client.HTTPException, ConnectionError) as e:
                    st, h, data = None, {}, repr(e).encode()
                if n in (0, 1, 4, 6, 7, 8, 11, 16, 17):  # no usable head: 502 from moatd
                    self.assertEqual(st, 502, (routing, n, data[:200]))
                    self.assertEqual(json.loads(data)["code"], "bad_gateway", (routing, n))
                elif n in (2, 3, 5, 12, 14, 15):  # the head was passed, the body broke: the client sees the break
                    self.assertTrue(st is None or st == 200, (routing, n, st))
                    if st == 200:
                        self.assertNotEqual(data, b"abc", (routing, n))
                elif n == 9:
                    self.assertEqual((st, data), (200, b"ok"), (routing, n))
                elif n == 10:  # a bare CR inside a header is not passed as a header break
                    self.assertEqual(st, 200, (routing, n))
                    self.assertNotIn("injected", h)
                elif n == 13:
                    self.assertEqual((st, data), (200, b"until close"), (routing, n))
                if n in port_servers.EVIL_HOLD:  # answered (or cut) at once, not when the server lets go
                    self.assertLess(time.time() - t0, 30, (routing, n))
            st, _, data = self.call(routing, "GET", "hello")
            self.assertEqual((st, data), (200, b"hello"))

    def test_keep_alive(self):
        for routing in ("path", "host"):
            conn = self.api_conn() if routing == "path" else self.proxy_conn()
            try:
                sock = None
                for i in range(20):
                    h = {"Authorization": "Bearer " + self.c.key}
                    if routing == "path":
                        target = self.path(HTTP_PORT, "echo?i=%d" % i)
                    else:
                        target, h["Host"] = "/echo?i=%d" % i, self.host(HTTP_PORT)
                    conn.request("POST" if i % 2 else "GET", target, body=b"x" * i if i % 2 else None, headers=h)
                    r = conn.getresponse()
                    j = json.loads(r.read())
                    self.assertEqual((r.status, j["path"]), (200, "/echo?i=%d" % i))
                    self.assertFalse(r.will_close, "moatd closed a keep-alive connection")
                    if sock is None:
                        sock = conn.sock
                    self.assertIs(conn.sock, sock, "the connection was not kept alive")
            finally:
                conn.close()

    def test_backend_connections_reused_and_server_closes(self):
        for routing in ("path", "host"):
            peers = [self.json_call(routing, "GET", "echo")[1]["peer_port"] for _ in range(5)]
            self.assertEqual(len(set(peers)), 1, "%s: moatd did not keep its connection to the server: %r"
                             % (routing, peers))
            # the server closes a connection after answering: the next request still gets through, on a new
            # one (found closed in the pool, or sent again once)
            for i in range(10):
                st, _, data = self.call(routing, "GET", "bye")
                self.assertEqual((st, data), (200, b"bye"), routing)
                st, j = self.json_call(routing, "GET", "echo?after-bye=%d" % i)
                self.assertEqual(st, 200, routing)
            # a close-delimited answer is not reused either
            st, _, data = self.call(routing, "GET", "close?n=10")
            self.assertEqual((st, len(data)), (200, 10))
            st, j = self.json_call(routing, "POST", "echo", body=b"after close")
            self.assertEqual((st, j["body_len"]), (200, 11))

    def test_concurrent_requests(self):
        import threading
        errors = []

        def worker(routing, n):
            try:
                for i in range(n):
                    body = os.urandom(1000 + i)
                    st, j = self.json_call(routing, "POST", "echo?w=%d" % i, body=body)
                    if st != 200 or j["body_sha256"] != hashlib.sha256(body).hexdigest():
                        errors.append((routing, i, st))
                    st, _, data = self.call(routing, "GET", "chunked?n=20")
                    if st != 200 or data.count(b"chunk-") != 20:
                        errors.append((routing, i, st, data[:50]))
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append((routing, repr(e)))

        ts = [threading.Thread(target=worker, args=(("path", "host")[k % 2], 15)) for k in range(12)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(120)
        self.assertEqual(errors, [])

    # -- WebSocket --
    def _ws_echo(self, w):
        w.send_text("hello")
        self.assertEqual(w.recv(timeout=10), (ws.TEXT, b"hello"))
        big = os.urandom(200000)
        w.send_binary(big)
        self.assertEqual(w.recv(timeout=10), (ws.BINARY, big))
        for i in range(50):
            w.send_text("m%d" % i)
        for i in range(50):
            self.assertEqual(w.recv(timeout=10), (ws.TEXT, b"m%d" % i))

    def test_websocket_both_routings(self):
        w = ws.connect(_Target("127.0.0.1", self.daemon.port, self.c.key), self.path(WS_PORT, "ws/x?y=1"))
        try:
            self._ws_echo(w)
        finally:
            w.close()
        w = ws.connect(_Target("127.0.0.1", self.proxy_port, self.c.key), "/ws/host",
                       headers={"Host": self.host(WS_PORT)})
        try:
            self._ws_echo(w)
        finally:
            w.close()

    def test_websocket_ends_when_sandbox_killed(self):
        sb = self.sandbox(template="code-interpreter")
        start_servers(self.c, sb["id"])
        w = ws.connect(_Target("127.0.0.1", self.proxy_port, self.c.key), "/ws",
                       headers={"Host": self.host(WS_PORT, sb["id"])})
        try:
            w.send_text("before")
            self.assertEqual(w.recv(timeout=10), (ws.TEXT, b"before"))
            t0 = time.time()
            self.c.delete(sb["id"])
            try:
                got = w.recv(timeout=15)
                self.fail("a message after the sandbox was killed: %r" % (got,))
            except TimeoutError:
                self.fail("the WebSocket stayed open after the sandbox was killed")
            except (ws.Closed, ConnectionError):
                pass
            self.assertLess(time.time() - t0, 15)
        finally:
            w.close()

    # -- access --
    def _ends(self, w, why):
        """w (a WebSocket) is closed by moatd within 10 s, nothing more delivered."""
        t0 = time.time()
        try:
            got = w.recv(timeout=10)
            self.fail("a message after %s: %r" % (why, got))
        except TimeoutError:
            self.fail("the WebSocket stayed open after %s" % why)
        except (ws.Closed, ConnectionError):
            pass
        self.assertLess(time.time() - t0, 10, why)

    def test_connections_end_with_their_access(self):
        """What let a connection in is looked at again while it lasts: an upgraded connection ends when
        its API key is revoked, when the port's token changes and when a public port turns private; a
        streaming response ends when its key is revoked. Other connections go on."""
        url = "/v1/sandboxes/%s/ports/%d" % (self.sid, WS_PORT)
        self.addCleanup(self.c.request, "DELETE", url, expect=(204, 404))
        _, k = self.c.request("POST", "/v1/keys", body={"name": "port-revoke", "role": "member"})
        for routing in ("path", "host"):
            if routing == "path":
                w = ws.connect(_Target("127.0.0.1", self.daemon.port, k["key"]), self.path(WS_PORT, "ws"))
            else:
                w = ws.connect(_Target("127.0.0.1", self.proxy_port, k["key"]), "/ws", headers={"Host": self.host(WS_PORT)})
            self.addCleanup(w.close)
            w.send_text("up")
            self.assertEqual(w.recv(timeout=10), (ws.TEXT, b"up"))
            setattr(self, "w_" + routing, w)
        other = ws.connect(_Target("127.0.0.1", self.daemon.port, self.c.key), self.path(WS_PORT, "ws"))
        self.addCleanup(other.close)
        s = socket.create_connection(("127.0.0.1", self.proxy_port), timeout=30)
        self.addCleanup(s.close)
        s.sendall(("GET /stream HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\n\r\n"
                   % (self.host(HTTP_PORT), k["key"])).encode())
        got = b""
        while got.count(b"tick-") < 2:
            d = s.recv(65536)
            self.assertTrue(d, "the stream ended early")
            got += d
        self.c.request("DELETE", "/v1/keys/" + k["id"], expect=204)
        self._ends(self.w_path, "its key was revoked (path routing)")
        self._ends(self.w_host, "its key was revoked (host routing)")
        s.settimeout(10)
        t0 = time.time()
        while True:
            try:
                d = s.recv(65536)
            except (ConnectionResetError, socket.timeout):
                break
            if not d:
                break
        self.assertLess(time.time() - t0, 10, "the streaming response went on after its key was revoked")
        other.send_text("still")
        self.assertEqual(other.recv(timeout=10), (ws.TEXT, b"still"))  # another key's goes on
        # a token's connection ends when the port's token changes
        self.c.request("POST", url, body={"token": "first-token-0123456789"})
        w = ws.connect(_Target("127.0.0.1", self.proxy_port, "moat_none"), "/ws",
                       headers={"Host": self.host(WS_PORT), "X-Moat-Port-Token": "first-token-0123456789"})
        self.addCleanup(w.close)
        w.send_text("t")
        self.assertEqual(w.recv(timeout=10), (ws.TEXT, b"t"))
        self.c.request("POST", url, body={"token": "second-token-0123456789"})
        self._ends(w, "the port's token changed")
        # a public port's connection ends when it turns private
        self.c.request("POST", url, body={"public": True})
        w = ws.connect(_Target("127.0.0.1", self.proxy_port, "moat_none"), "/ws", headers={"Host": self.host(WS_PORT)})
        self.addCleanup(w.close)
        w.send_text("p")
        self.assertEqual(w.recv(timeout=10), (ws.TEXT, b"p"))
        self.c.request("POST", url, body={"public": False})
        self._ends(w, "the port turned private")
        other.send_text("still")
        self.assertEqual(other.recv(timeout=10), (ws.TEXT, b"still"))

    def test_access_token_and_public(self):
        url = "/v1/sandboxes/%s/ports/%d" % (self.sid, HTTP_PORT)
        self.addCleanup(self.c.request, "DELETE", url, expect=(204, 404))
        _, d = self.c.request("GET", url)
        self.assertEqual((d["port"], d["public"], d["token"]), (HTTP_PORT, False, None))
        self.assertEqual(d["path"], url + "/")
        self.assertEqual(d["url"], "http://%s:%d/" % (self.host(HTTP_PORT), self.proxy_port))
        # nothing presented: 401 on both routings
        for routing in ("path", "host"):
            st, j = self.json_call(routing, "GET", "hello", key=False)
            self.assertEqual((st, j["code"]), (401, "unauthorized"), routing)
        _, d = self.c.request("POST", url, body={})
        tok = d["token"]
        self.assertTrue(tok.startswith("mpt_") and len(tok) > 20, d)
        self.assertFalse(d["public"])
        for routing in ("path", "host"):
            st, j = self.json_call(routing, "GET", "hello", key=False)
            self.assertEqual(st, 401, routing)
            st, j = self.json_call(routing, "GET", "hello", key=False, headers={"X-Moat-Port-Token": "wrong" * 4})
            self.assertEqual((st, j["code"]), (403, "forbidden"), routing)
            st, h, data = self.call(routing, "GET", "hello", key=False, headers={"X-Moat-Port-Token": tok})
            self.assertEqual((st, data), (200, b"hello"), routing)
            st, j = self.json_call(routing, "GET", "echo?moat_token=%s&z=1" % tok, key=False)
            self.assertEqual((st, j["path"]), (200, "/echo?z=1"), routing)
            hdrs = {k.lower() for k in j["headers"]}
            self.assertNotIn("x-moat-port-token", hdrs)
            # the token opens this port only
            st, j = self.json_call(routing, "GET", "", port=WS_PORT, key=False, headers={"X-Moat-Port-Token": tok})
            self.assertEqual(st, 403, routing)
            # the API key still works; a bad API key without a token is 401
            st, _, _ = self.call(routing, "GET", "hello")
            self.assertEqual(st, 200)
            st, _, _ = self.call(routing, "GET", "hello", key=False, headers={"Authorization": "Bearer moat_bad"})
            self.assertEqual(st, 401, routing)
        # a token given in the URL is kept in a cookie (HttpOnly, the port's own path), which then opens the
        # port for the pages that follow; moat's cookie is not forwarded, the app's are
        for routing in ("path", "host"):
            st, h, _ = self.call(routing, "GET", "hello?moat_token=" + tok, key=False)
            self.assertEqual(st, 200, routing)
            path = "/v1/sandboxes/%s/ports/%d/" % (self.sid, HTTP_PORT) if routing == "path" else "/"
            self.assertEqual(h.get("set-cookie"), "moat_port_token=%s; Path=%s; HttpOnly; SameSite=Lax" % (tok, path))
            st, j = self.json_call(routing, "GET", "echo", key=False,
                                   headers={"Cookie": "a=1; moat_port_token=%s; b=2" % tok})
            self.assertEqual(st, 200, routing)
            self.assertEqual({k.lower(): v for k, v in j["headers"].items()}.get("cookie"), "a=1; b=2")
            st, h, _ = self.call(routing, "GET", "hello", key=False, headers={"X-Moat-Port-Token": tok})
            self.assertNotIn("set-cookie", h)  # only a token from the URL is turned into a cookie
            st, _, _ = self.call(routing, "GET", "hello", key=False,
                                 headers={"Cookie": "moat_port_token=nope-nope-nope-1"})
            self.assertEqual(st, 403, routing)
        # a token of our choosing; the old one stops working
        _, d = self.c.request("POST", url, body={"public": False, "token": "my-token-0123456789"})
        self.assertEqual(d["token"], "my-token-0123456789")
        st, _, _ = self.call("host", "GET", "hello", key=False, headers={"X-Moat-Port-Token": tok})
        self.assertEqual(st, 403)
        st, _, _ = self.call("host", "GET", "hello", key=False, headers={"X-Moat-Port-Token": "my-token-0123456789"})
        self.assertEqual(st, 200)
        # public: no credentials needed; the app's own Authorization header goes through
        _, d = self.c.request("POST", url, body={"public": True})
        self.assertEqual((d["public"], d["token"]), (True, None))
        for routing in ("path", "host"):
            st, j = self.json_call(routing, "GET", "echo", key=False, headers={"Authorization": "Bearer app-token"})
            self.assertEqual(st, 200, routing)
            self.assertEqual({k.lower(): v for k, v in j["headers"].items()}.get("authorization"),
                             "Bearer app-token")
        _, lst = self.c.request("GET", "/v1/sandboxes/%s/ports" % self.sid)
        self.assertEqual([p["port"] for p in lst["ports"]], [HTTP_PORT])
        self.c.request("DELETE", url, expect=204)
        st, _, _ = self.call("host", "GET", "hello", key=False)
        self.assertEqual(st, 401)
        _, lst = self.c.request("GET", "/v1/sandboxes/%s/ports" % self.sid)
        self.assertEqual(lst["ports"], [])

    def test_settings_bad_input(self):
        url = "/v1/sandboxes/%s/ports/" % self.sid
        for body, what in (({"public": "yes"}, "public"), ({"token": "short"}, "token"),
                           ({"token": "bad token with spaces!"}, "token"),
                           ({"public": True, "token": "x" * 20}, "public"),
                           ({"other": 1}, "other")):
            self.assertApiError(400, "invalid_request", self.c.request, "POST", url + "8000", body=body)
        self.assertApiError(400, "invalid_json", self.c.request, "POST", url + "8000", raw=b"{nope",
                            headers={"Content-Type": "application/json"})
        for bad in ("0", "65536", "99999", "abc", "80a"):
            self.assertApiError(400, "invalid_request", self.c.request, "POST", url + bad, body={})
        for bad in ("0", "65536", "abc"):
            self.assertApiError(400, "invalid_request", self.c.request, "GET",
                                "/v1/sandboxes/%s/ports/%s/hello" % (self.sid, bad))
        self.assertApiError(404, "not_found", self.c.request, "POST", "/v1/sandboxes/sb-0123456789abcdefg/ports/80",
                            body={})
        self.assertApiError(405, "method_not_allowed", self.c.request, "PUT", url + "8000", body={})
        self.c.request("TRACE", self.path(HTTP_PORT, "hello"), expect=(405,))

    # -- errors --
    def test_not_listening_bad_port_unknown_sandbox_other_org(self):
        for routing in ("path", "host"):
            st, j = self.json_call(routing, "GET", "x", port=DEAD_PORT)
            self.assertEqual((st, j["code"]), (502, "port_not_listening"), routing)
            st, j = self.json_call(routing, "GET", "x", sid="sb-0123456789abcdefg")
            self.assertEqual((st, j["code"]), (404, "not_found"), routing)
        other = self.c.with_key(self.daemon.new_org_key("ports-other-org"))
        other.request("GET", self.path(HTTP_PORT, "hello"), expect=(404,))
        conn = self.proxy_conn()
        try:
            conn.request("GET", "/hello",
                         headers={"Host": self.host(HTTP_PORT), "Authorization": "Bearer " + other.key})
            self.assertEqual(conn.getresponse().status, 404)
        finally:
            conn.close()
        # the proxy listener: a Host that names no sandbox port, or another domain
        for host in ("moat.test", "8000-sb-0123.moat.test", "%d-%s.other.test" % (HTTP_PORT, self.sid), "0-%s.%s"
                     % (self.sid, DOMAIN)):
            conn = self.proxy_conn()
            try:
                conn.request("GET", "/hello", headers={"Host": host, "Authorization": "Bearer " + self.c.key})
                r = conn.getresponse()
                self.assertEqual((r.status, json.loads(r.read())["code"]), (404, "not_found"), host)
            finally:
                conn.close()

    def test_paused_sandbox_409(self):
        sb = self.sandbox(template="code-interpreter")
        start_servers(self.c, sb["id"])
        self.c.request("POST", "/v1/sandboxes/%s/pause" % sb["id"], body={})
        try:
            for routing in ("path", "host"):
                st, j = self.json_call(routing, "GET", "hello", sid=sb["id"])
                self.assertEqual((st, j["code"]), (409, "sandbox_paused"), routing)
        finally:
            self.c.request("POST", "/v1/sandboxes/%s/resume" % sb["id"], body={})
        st, _, data = self.call("host", "GET", "hello", sid=sb["id"])
        self.assertEqual((st, data), (200, b"hello"))

    def test_hibernated_sandbox_is_woken(self):
        ck = self.c.request("GET", "/healthz", auth=False)[1].get("checkpoints") or {}
        if not ck.get("available"):
            self.skipTest("checkpoints unavailable on this host: %s" % ck.get("criu"))
        sb = self.sandbox(template="code-interpreter", persistent=True)
        start_servers(self.c, sb["id"])
        url = "/v1/sandboxes/%s/ports/%d" % (sb["id"], HTTP_PORT)
        tok = self.c.request("POST", url, body={})[1]["token"]
        self.assertEqual(self.call("host", "GET", "hello", sid=sb["id"])[2], b"hello")
        # moatd closes its idle connection to the server within 1 s (CRIU does not dump established TCP
        # connections); a checkpoint right after proxied traffic would fail
        time.sleep(1.6)
        self.c.request("POST", "/v1/sandboxes/%s/hibernate" % sb["id"], body={}, timeout=300)
        self.assertEqual(self.c.get(sb["id"])["state"], "hibernated")
        # the port token outlives hibernation; the request wakes the sandbox and reaches the restored server
        st, _, data = self.call("host", "GET", "hello", sid=sb["id"], key=False, headers={"X-Moat-Port-Token": tok})
        self.assertEqual((st, data), (200, b"hello"))
        self.assertEqual(self.c.get(sb["id"])["state"], "running")
        st, _, data = self.call("path", "GET", "hello", sid=sb["id"])
        self.assertEqual((st, data), (200, b"hello"))

    def test_killed_mid_stream_ends_connection(self):
        for routing in ("path", "host"):
            sb = self.sandbox(template="code-interpreter")
            start_servers(self.c, sb["id"])
            if routing == "path":
                s = socket.create_connection(("127.0.0.1", self.daemon.port), timeout=30)
                s.sendall(("GET %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n"
                           % (self.path(HTTP_PORT, "stream", sb["id"]), self.c.key)).encode())
            else:
                s = socket.create_connection(("127.0.0.1", self.proxy_port), timeout=30)
                s.sendall(("GET /stream HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\n\r\n"
                           % (self.host(HTTP_PORT, sb["id"]), self.c.key)).encode())
            try:
                got = b""
                while got.count(b"tick-") < 3:
                    d = s.recv(65536)
                    self.assertTrue(d, "the stream ended early")
                    got += d
                self.assertTrue(got.startswith(b"HTTP/1.1 200"), got[:100])
                t0 = time.time()
                self.c.delete(sb["id"])
                s.settimeout(15)
                while True:
                    try:
                        d = s.recv(65536)
                    except ConnectionResetError:
                        break
                    if not d:
                        break
                self.assertLess(time.time() - t0, 15, routing)
            finally:
                s.close()


@skip_unless_root()
class PortsWithNetworkTest(NetDaemonTest):
    """The same routes when sandboxes have their own veth, address and nftables rules (moatd --net-uplink
    to a fake internet of the test's own): moatd still reaches the server through the sandbox's loopback."""
    proxy_port = moatd.free_port()
    extra = ("--proxy-listen", "127.0.0.1:%d" % proxy_port, "--proxy-domain", DOMAIN)

    def test_both_routings_with_networking(self):
        sid = self.sandbox(template="code-interpreter")["id"]
        self.assertTrue(self.network(sid)["address"], "the sandbox has no network slot")
        start_servers(self.c, sid)
        st, data = self.c.request("GET", "/v1/sandboxes/%s/ports/%d/hello" % (sid, HTTP_PORT))
        self.assertEqual((st, data), (200, b"hello"))
        conn = http.client.HTTPConnection("127.0.0.1", self.proxy_port, timeout=60)
        try:
            conn.request("GET", "/hello", headers={"Host": "%d-%s.%s" % (HTTP_PORT, sid, DOMAIN),
                                                   "Authorization": "Bearer " + self.c.key})
            r = conn.getresponse()
            self.assertEqual((r.status, r.read()), (200, b"hello"))
        finally:
            conn.close()
        w = ws.connect(_Target("127.0.0.1", self.proxy_port, self.c.key), "/",
                       headers={"Host": "%d-%s.%s" % (WS_PORT, sid, DOMAIN)})
        try:
            w.send_text("over veths")
            self.assertEqual(w.recv(timeout=10), (ws.TEXT, b"over veths"))
        finally:
            w.close()


if __name__ == "__main__":
    unittest.main()

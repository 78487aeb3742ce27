"""port_servers.py -- servers that tests/integration/test_ports.py and bench/ports.py run INSIDE a sandbox
(stdlib only; copied into the sandbox and started with `python3 port_servers.py HTTP_PORT WS_PORT`).

HTTP (HTTP/1.1, keep-alive, one thread per connection) on HTTP_PORT:
  GET  /hello            200 "hello" (Content-Length)
  ANY  /echo[?...]       200 JSON {method, path, headers, body_len, body_sha256, peer_port} (reads Content-Length or
                         chunked bodies)
  GET  /chunked?n=N      N chunks "chunk-I\n" with Transfer-Encoding: chunked
  GET  /big?n=BYTES      BYTES bytes of a repeating pattern, Content-Length
  GET  /close?n=BYTES    BYTES bytes without Content-Length, ended by closing the connection
  GET  /stream           a chunk every 100 ms, forever (for a sandbox killed mid-stream)
  GET  /bye              200 "bye", then the server closes the (keep-alive) connection
  GET  /status/CODE      an empty answer with that status
WebSocket (RFC 6455, text and binary echo; close answered) on WS_PORT, any path.
With a third port EVIL_PORT: a raw TCP server that answers GET /N with the canned, broken response EVIL[N]
and closes (what a hostile server in a sandbox may send moatd).
"""

import base64
import hashlib
import http.server
import json
import socket
import socketserver
import struct
import sys
import threading
import time
import urllib.parse

PATTERN = bytes(range(256)) * 256


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # the head and the body are separate writes: no delayed-ACK stalls

    def log_message(self, *a):
        pass

    def _body(self):
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            out = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return bytes(out)
                out += self.rfile.read(size)
                self.rfile.readline()
        n = int(self.headers.get("Content-Length") or 0)
        h = hashlib.sha256()
        got = 0
        while got < n:
            d = self.rfile.read(min(65536, n - got))
            if not d:
                break
            h.update(d)
            got += len(d)
        return (got, h.hexdigest())

    def _send(self, code, body, ctype="text/plain", extra=None):
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _any(self):
        u = urllib.parse.urlsplit(self.path)
        q = urllib.parse.parse_qs(u.query)
        if u.path == "/hello":
            return self._send(200, b"hello")
        if u.path == "/echo":
            b = self._body()
            if isinstance(b, bytes):
                n, sha = len(b), hashlib.sha256(b).hexdigest()
            else:
                n, sha = b
            out = {"method": self.command, "path": self.path, "headers": dict(self.headers.items()),
                   "body_len": n, "body_sha256": sha, "peer_port": self.client_address[1]}
            return self._send(200, json.dumps(out).encode(), "application/json")
        if u.path == "/chunked":
            n = int(q.get("n", ["5"])[0])
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(n):
                c = b"chunk-%d\n" % i
                self.wfile.write(b"%x\r\n%s\r\n" % (len(c), c))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            return
        if u.path == "/big":
            n = int(q.get("n", ["0"])[0])
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(n))
            self.end_headers()
            sent = 0
            while sent < n:
                d = PATTERN[: min(len(PATTERN), n - sent)]
                self.wfile.write(d)
                sent += len(d)
            return
        if u.path == "/close":
            n = int(q.get("n", ["0"])[0])
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            sent = 0
            while sent < n:
                d = PATTERN[: min(len(PATTERN), n - sent)]
                self.wfile.write(d)
                sent += len(d)
            self.close_connection = True
            return
        if u.path == "/stream":
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            i = 0
            while True:
                c = b"tick-%d\n" % i
                self.wfile.write(b"%x\r\n%s\r\n" % (len(c), c))
                self.wfile.flush()
                i += 1
                time.sleep(0.1)
        if u.path == "/bye":
            # a sized answer without "Connection: close", then the server closes the connection anyway
            # (as servers do with idle keep-alive connections)
            self.close_connection = True
            return self._send(200, b"bye")
        if u.path.startswith("/status/"):
            code = int(u.path.split("/")[2])
            self.send_response(code)
            if code not in (204, 304):
                self.send_header("Content-Length", "0")
            self.end_headers()
            return
        return self._send(404, b"no such page")

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_HEAD = _any


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # socketserver's default listen backlog is 5: a dozen concurrent connections overflow it and
    # the kernel drops SYNs, each retried a second or more later.
    request_queue_size = 128


GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def _read(sock, n):
    out = b""
    while len(out) < n:
        d = sock.recv(n - len(out))
        if not d:
            raise EOFError
        out += d
    return out


class WsHandler(socketserver.BaseRequestHandler):
    def handle(self):
        s = self.request
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        data = b""
        while b"\r\n\r\n" not in data:
            d = s.recv(4096)
            if not d:
                return
            data += d
        head = data.split(b"\r\n\r\n", 1)[0].decode()
        hdrs = {}
        for line in head.split("\r\n")[1:]:
            k, _, v = line.partition(":")
            hdrs[k.strip().lower()] = v.strip()
        key = hdrs.get("sec-websocket-key", "")
        acc = base64.b64encode(hashlib.sha1((key + GUID).encode()).digest()).decode()
        s.sendall(("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                   "Sec-WebSocket-Accept: %s\r\nX-Ws-Path: %s\r\n\r\n" % (acc, head.split(" ")[1])).encode())
        try:
            while True:
                b0, b1 = _read(s, 2)
                op = b0 & 0x0F
                n = b1 & 0x7F
                if n == 126:
                    n = struct.unpack(">H", _read(s, 2))[0]
                elif n == 127:
                    n = struct.unpack(">Q", _read(s, 8))[0]
                mask = _read(s, 4) if b1 & 0x80 else b"\0\0\0\0"
                payload = bytearray(_read(s, n))
                for i in range(len(payload)):
                    payload[i] ^= mask[i % 4]
                if op == 8:
                    s.sendall(b"\x88\x02\x03\xe8")
                    return
                if op == 9:
                    op = 10
                hdr = bytes([0x80 | op])
                if len(payload) < 126:
                    hdr += bytes([len(payload)])
                elif len(payload) < 65536:
                    hdr += bytes([126]) + struct.pack(">H", len(payload))
                else:
                    hdr += bytes([127]) + struct.pack(">Q", len(payload))
                s.sendall(hdr + bytes(payload))
        except (EOFError, OSError):
            return


class WsServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128


EVIL = [
    b"garbage\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 70000 + b"\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffffffffffff\r\nabc",
    b"HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\nabc",
    b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort",
    b"HTTP/1.1 999 Weird\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nBad Header Line\r\n\r\n",
    b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: Upgrade\r\n\r\n",
    b"HTTP/1.1 100 Continue\r\n\r\n" * 2000 + b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
    b"HTTP/1.1 200 OK\r\nX-A: 1\rInjected: yes\r\nContent-Length: 2\r\n\r\nok",
    b"",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nokXX3\r\n",
    b"HTTP/1.0 200 OK\r\n\r\nuntil close",
    # 14-17: the server keeps its connection open after these (EVIL_HOLD): a chunk size that fits 64 bits
    # but not 63, a negative one, Content-Length with Transfer-Encoding, two different Content-Lengths
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nFFFFFFFFFFFFFFFF\r\nabc",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-1\r\nabc",
    b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 5\r\n\r\nokabc",
]
EVIL_HOLD = (14, 15, 16, 17)


class EvilHandler(socketserver.BaseRequestHandler):
    def handle(self):
        data = b""
        while b"\r\n\r\n" not in data:
            d = self.request.recv(4096)
            if not d:
                return
            data += d
        n = int(data.split(b" ")[1].strip(b"/") or 0)
        self.request.sendall(EVIL[n])
        if n in EVIL_HOLD:
            time.sleep(60)


def main():
    http_port, ws_port = int(sys.argv[1]), int(sys.argv[2])
    ws = WsServer(("127.0.0.1", ws_port), WsHandler)
    threading.Thread(target=ws.serve_forever, daemon=True).start()
    if len(sys.argv) > 3:
        evil = WsServer(("127.0.0.1", int(sys.argv[3])), EvilHandler)
        threading.Thread(target=evil.serve_forever, daemon=True).start()
    srv = Server(("127.0.0.1", http_port), Handler)
    print("ready", flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()

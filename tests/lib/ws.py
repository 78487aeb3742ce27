"""ws.py -- a minimal RFC 6455 WebSocket client (stdlib only) for the tests.

    w = ws.connect(client, "/v1/sandboxes/ID/pty", query={"cols": 80})
    w.send_binary(b"echo hi\\r"); w.send_text('{"type":"resize","cols":100,"rows":40}')
    op, payload = w.recv(timeout=5)      # data frames reassembled; pings answered
    w.close()

Client frames are masked as the RFC requires; send_raw writes arbitrary bytes (garbage frames).
connect() raises moatd.HTTPError when the server answers anything but 101.
"""

import base64
import hashlib
import json
import os
import socket
import struct
import time
import urllib.parse

from moatd import HTTPError

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
CONT, TEXT, BINARY, CLOSE, PING, PONG = 0, 1, 2, 8, 9, 10


class Closed(Exception):
    """The server closed the WebSocket: code (None when no close frame) and reason."""

    def __init__(self, code, reason=""):
        super().__init__("closed %s %s" % (code, reason))
        self.code = code
        self.reason = reason


class WebSocket:
    def __init__(self, sock, leftover):
        self.sock = sock
        self.buf = leftover
        self.close_code = None

    def _read(self, n, deadline):
        while len(self.buf) < n:
            left = deadline - time.time()
            if left <= 0:
                raise TimeoutError("WebSocket read timed out")
            self.sock.settimeout(left)
            try:
                d = self.sock.recv(65536)
            except ConnectionResetError:
                d = b""
            if not d:
                raise Closed(None, "connection closed without a close frame")
            self.buf += d
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def _frame(self, deadline):
        b0, b1 = self._read(2, deadline)
        fin, op, masked, n = b0 & 0x80, b0 & 0x0F, b1 & 0x80, b1 & 0x7F
        if n == 126:
            n = struct.unpack(">H", self._read(2, deadline))[0]
        elif n == 127:
            n = struct.unpack(">Q", self._read(8, deadline))[0]
        mask = self._read(4, deadline) if masked else None
        payload = self._read(n, deadline)
        if mask:
            payload = bytes(c ^ mask[i % 4] for i, c in enumerate(payload))
        return bool(fin), op, payload

    def recv(self, timeout=10):
        """The next message as (opcode, bytes). Pings are answered; a close frame raises Closed."""
        deadline = time.time() + timeout
        parts, first = [], None
        while True:
            fin, op, payload = self._frame(deadline)
            if op == PING:
                self.send(PONG, payload)
                continue
            if op == PONG:
                continue
            if op == CLOSE:
                code = struct.unpack(">H", payload[:2])[0] if len(payload) >= 2 else None
                self.close_code = code
                try:
                    self.send(CLOSE, payload[:2])
                except OSError:
                    pass
                raise Closed(code, payload[2:].decode(errors="replace"))
            if op != CONT:
                first = op
            parts.append(payload)
            if fin:
                return first, b"".join(parts)

    def read_until(self, predicate, timeout=10):
        """Collects binary/text payloads until predicate(all bytes so far) is true; returns them."""
        deadline = time.time() + timeout
        out = b""
        while not predicate(out):
            left = deadline - time.time()
            if left <= 0:
                raise TimeoutError("want more output, have %r" % out[-500:])
            _, p = self.recv(left)
            out += p
        return out

    def send(self, op, payload=b"", fin=True, mask=True):
        if isinstance(payload, str):
            payload = payload.encode()
        head = bytes([(0x80 if fin else 0) | op])
        n = len(payload)
        mbit = 0x80 if mask else 0
        if n < 126:
            head += bytes([mbit | n])
        elif n < 65536:
            head += bytes([mbit | 126]) + struct.pack(">H", n)
        else:
            head += bytes([mbit | 127]) + struct.pack(">Q", n)
        if mask:
            key = os.urandom(4)
            head += key
            payload = bytes(c ^ key[i % 4] for i, c in enumerate(payload))
        self.sock.sendall(head + payload)

    def send_text(self, s):
        self.send(TEXT, s)

    def send_binary(self, b):
        self.send(BINARY, b)

    def send_json(self, obj):
        self.send(TEXT, json.dumps(obj))

    def send_raw(self, data):
        self.sock.sendall(data)

    def close(self, code=1000):
        try:
            self.send(CLOSE, struct.pack(">H", code))
        except OSError:
            pass
        self.sock.close()


def handshake_request(client, path, query=None, headers=None, key=None):
    if query:
        path += "?" + urllib.parse.urlencode(query, quote_via=urllib.parse.quote)
    key = key or base64.b64encode(os.urandom(16)).decode()
    h = {
        "Host": "%s:%d" % (client.host, client.port),
        "Upgrade": "websocket",
        "Connection": "Upgrade",
        "Sec-WebSocket-Key": key,
        "Sec-WebSocket-Version": "13",
        "Authorization": "Bearer " + client.key,
    }
    if headers is not None:
        h.update(headers)
    h = {k: v for k, v in h.items() if v is not None}
    req = "GET %s HTTP/1.1\r\n" % path + "".join("%s: %s\r\n" % kv for kv in h.items()) + "\r\n"
    return req.encode(), key


def connect(client, path, query=None, headers=None, timeout=30):
    req, key = handshake_request(client, path, query, headers)
    sock = socket.create_connection((client.host, client.port), timeout=timeout)
    sock.sendall(req)
    data = b""
    while b"\r\n\r\n" not in data:
        d = sock.recv(65536)
        if not d:
            break
        data += d
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode(errors="replace").split("\r\n")
    status = int(lines[0].split()[1]) if lines and len(lines[0].split()) > 1 else 0
    hdrs = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        hdrs[k.strip().lower()] = v.strip()
    if status != 101:
        n = int(hdrs.get("content-length", "0") or 0)
        while len(rest) < n:
            d = sock.recv(65536)
            if not d:
                break
            rest += d
        sock.close()
        try:
            body = json.loads(rest)
        except ValueError:
            body = rest
        raise HTTPError("GET", path, status, body)
    want = base64.b64encode(hashlib.sha1((key + GUID).encode()).digest()).decode()
    if hdrs.get("sec-websocket-accept") != want:
        sock.close()
        raise AssertionError("bad Sec-WebSocket-Accept %r (want %r)" % (hdrs.get("sec-websocket-accept"), want))
    if hdrs.get("upgrade", "").lower() != "websocket" or "upgrade" not in hdrs.get("connection", "").lower():
        sock.close()
        raise AssertionError("bad upgrade headers %r" % hdrs)
    return WebSocket(sock, rest)

"""_ws.py -- a minimal RFC 6455 WebSocket client (standard library only) for the PTY route.

Frames are parsed only once wholly received, so a read that times out loses nothing; client frames
are masked as the RFC requires; pings are answered.
"""

import base64
import hashlib
import json
import os
import socket
import ssl
import struct
import time
from typing import Any, Dict, Optional, Tuple

from . import errors

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
CONT, TEXT, BINARY, CLOSE, PING, PONG = 0, 1, 2, 8, 9, 10


def _mask(payload: bytes, key: bytes) -> bytes:
    if not payload:
        return payload
    n = len(payload)
    k = (key * (n // 4 + 1))[:n]
    return (int.from_bytes(payload, "little") ^ int.from_bytes(k, "little")).to_bytes(n, "little")


class WebSocket:
    """One client WebSocket. recv() returns (opcode, payload) of each whole message; a close frame
    from the server sets close_code and returns (CLOSE, reason bytes)."""

    def __init__(self, sock: socket.socket, leftover: bytes, what: str):
        self.sock = sock
        self.buf = leftover
        self.what = what
        self.close_code: Optional[int] = None
        self.closed = False
        self._parts: list = []
        self._first = 0

    @classmethod
    def connect(cls, scheme: str, host: str, port: int, path: str, headers: Dict[str, str],
                connect_timeout: float, timeout: Optional[float]) -> "WebSocket":
        try:
            sock = socket.create_connection((host, port), timeout=connect_timeout)
            if scheme == "https":
                sock = ssl.create_default_context().wrap_socket(sock, server_hostname=host)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError as e:
            raise errors.ConnectionError("cannot connect to %s:%d: %s" % (host, port, e),
                                         code="connection_error") from e
        key = base64.b64encode(os.urandom(16)).decode()
        h = {"Host": "%s:%d" % (host, port), "Upgrade": "websocket", "Connection": "Upgrade",
             "Sec-WebSocket-Key": key, "Sec-WebSocket-Version": "13"}
        h.update(headers)
        req = "GET %s HTTP/1.1\r\n" % path + "".join("%s: %s\r\n" % kv for kv in h.items()) + "\r\n"
        data = b""
        try:
            sock.settimeout(timeout)
            sock.sendall(req.encode())
            while b"\r\n\r\n" not in data:
                d = sock.recv(65536)
                if not d:
                    break
                data += d
            head, _, rest = data.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            parts = lines[0].split() if lines else []
            status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
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
                    body: Any = json.loads(rest)
                except ValueError:
                    body = rest
                if status == 0:
                    raise errors.ConnectionError("GET %s: no HTTP answer" % path, code="connection_error")
                raise errors.error_from_response(status, body, "GET %s -> HTTP %d" % (path, status))
        except socket.timeout as e:
            sock.close()
            raise errors.TimeoutError("GET %s: no WebSocket handshake within %ss" % (path, timeout),
                                      code="client_timeout") from e
        except OSError as e:
            sock.close()
            raise errors.ConnectionError("GET %s: %s" % (path, e), code="connection_error") from e
        want = base64.b64encode(hashlib.sha1((key + GUID).encode()).digest()).decode()
        if hdrs.get("sec-websocket-accept") != want:
            sock.close()
            raise errors.ConnectionError("GET %s: bad Sec-WebSocket-Accept" % path, code="connection_error")
        return cls(sock, rest, "GET " + path)

    def _parse(self) -> Optional[Tuple[bool, int, bytes]]:
        """One whole frame off the buffer, or None while it is incomplete."""
        b = self.buf
        if len(b) < 2:
            return None
        fin, op, masked, n = b[0] & 0x80, b[0] & 0x0F, b[1] & 0x80, b[1] & 0x7F
        i = 2
        if n == 126:
            if len(b) < 4:
                return None
            n, i = struct.unpack(">H", b[2:4])[0], 4
        elif n == 127:
            if len(b) < 10:
                return None
            n, i = struct.unpack(">Q", b[2:10])[0], 10
        key = b""
        if masked:
            if len(b) < i + 4:
                return None
            key, i = b[i:i + 4], i + 4
        if len(b) < i + n:
            return None
        payload, self.buf = b[i:i + n], b[i + n:]
        if masked:
            payload = _mask(payload, key)
        return bool(fin), op, payload

    def recv(self, timeout: Optional[float]) -> Tuple[int, bytes]:
        """The next whole message. Raises moat.TimeoutError past timeout (nothing is lost) and
        moat.ConnectionError when the connection ends without a close frame."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            f = self._parse()
            if f is None:
                if self.closed:
                    raise errors.ConnectionError("%s: WebSocket closed" % self.what, code="connection_error")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise errors.TimeoutError("%s: no output within %ss" % (self.what, timeout), code="client_timeout")
                self.sock.settimeout(left)
                try:
                    d = self.sock.recv(65536)
                except socket.timeout:
                    continue
                except OSError as e:
                    d = b""
                    if self.closed:
                        raise errors.ConnectionError("%s: WebSocket closed" % self.what,
                                                     code="connection_error") from e
                if not d:
                    self.closed = True
                    raise errors.ConnectionError("%s: connection closed without a close frame" % self.what,
                                                 code="connection_error")
                self.buf += d
                continue
            fin, op, payload = f
            if op == PING:
                self.send(PONG, payload)
                continue
            if op == PONG:
                continue
            if op == CLOSE:
                self.close_code = struct.unpack(">H", payload[:2])[0] if len(payload) >= 2 else 1005
                try:
                    self.send(CLOSE, payload[:2])
                except OSError:
                    pass
                self._shutdown()
                return CLOSE, payload[2:]
            if op != CONT:
                self._first = op
            self._parts.append(payload)
            if fin:
                msg, self._parts = b"".join(self._parts), []
                return self._first, msg

    def send(self, op: int, payload: bytes = b"") -> None:
        head = bytes([0x80 | op])
        n = len(payload)
        if n < 126:
            head += bytes([0x80 | n])
        elif n < 65536:
            head += bytes([0x80 | 126]) + struct.pack(">H", n)
        else:
            head += bytes([0x80 | 127]) + struct.pack(">Q", n)
        key = os.urandom(4)
        try:
            self.sock.sendall(head + key + _mask(payload, key))
        except OSError as e:
            raise errors.ConnectionError("%s: send failed: %s" % (self.what, e), code="connection_error") from e

    def _shutdown(self) -> None:
        self.closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()

    def close(self, code: int = 1000) -> None:
        if self.closed:
            return
        try:
            self.send(CLOSE, struct.pack(">H", code))
        except errors.ConnectionError:
            pass
        self._shutdown()

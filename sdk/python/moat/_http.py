"""_http.py -- the SDK's HTTP transport: kept-alive http.client connections (one per thread),
JSON requests with typed errors, and a Server-Sent Events reader that notices a dropped connection.

Timeouts are explicit. Ordinary calls use the client's ``request_timeout``. A call that may run
long (exec) passes its own: its ``timeout`` plus a margin, or ``None`` (no limit) when the command
has none. Streams have no overall limit; moatd sends a ``: keep-alive`` comment after 15 s of
silence, so a stream that stays silent for ``stream_idle_timeout`` seconds (default 45: three
missed keep-alives) is a dropped connection and raises ``moat.ConnectionError``. Every socket also
has TCP keep-alive on, so a peer that vanished without a FIN is noticed on calls with no limit.
"""

import base64
import http.client
import json
import socket
import threading
import time
import urllib.parse
from typing import Any, Dict, Iterator, Optional, Tuple

from . import errors

USER_AGENT = "moat-python/0.1"


def _tune(sock: Optional[socket.socket]) -> None:
    if sock is None:
        return
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        if hasattr(socket, "TCP_KEEPIDLE"):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 15)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 5)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 4)
    except OSError:
        pass


class Transport:
    """One moatd endpoint and API key; thread-safe (each thread keeps its own connection)."""

    def __init__(self, api_url: str, api_key: Optional[str], request_timeout: Optional[float],
                 connect_timeout: float, stream_idle_timeout: float):
        u = urllib.parse.urlsplit(api_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError("api_url must be an http:// or https:// URL, got %r" % (api_url,))
        self.api_url = api_url
        self.scheme = u.scheme
        self.host = u.hostname
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.prefix = u.path.rstrip("/")
        self.api_key = api_key
        self.request_timeout = request_timeout
        self.connect_timeout = connect_timeout
        self.stream_idle_timeout = stream_idle_timeout
        self._local = threading.local()

    # -- connections --
    def _new_conn(self) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
        conn = cls(self.host, self.port, timeout=self.connect_timeout)
        try:
            conn.connect()
        except socket.timeout as e:
            raise errors.ConnectionError("cannot connect to %s: timed out after %ss" % (self.api_url, self.connect_timeout),
                                         code="connection_error") from e
        except OSError as e:
            raise errors.ConnectionError("cannot connect to %s: %s" % (self.api_url, e.strerror or e),
                                         code="connection_error") from e
        _tune(conn.sock)
        return conn

    def _pooled(self) -> Tuple[http.client.HTTPConnection, bool]:
        conn = getattr(self._local, "conn", None)
        if conn is not None and conn.sock is not None:
            return conn, True
        conn = self._new_conn()
        self._local.conn = conn
        return conn, False

    def _drop(self) -> None:
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            conn.close()

    def close(self) -> None:
        """Closes this thread's kept-alive connection (others close when their thread ends)."""
        self._drop()

    def headers(self, extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
        h = {"User-Agent": USER_AGENT}
        if self.api_key:
            h["Authorization"] = "Bearer " + self.api_key
        if extra:
            h.update(extra)
        return h

    def path(self, path: str, query: Optional[Dict[str, Any]] = None) -> str:
        p = self.prefix + path
        if query:
            q = {k: v for k, v in query.items() if v is not None}
            if q:
                p += "?" + urllib.parse.urlencode(q, quote_via=urllib.parse.quote)
        return p

    # -- plain requests --
    def request(self, method: str, path: str, *, json_body: Any = None, body: Any = None,
                query: Optional[Dict[str, Any]] = None, headers: Optional[Dict[str, str]] = None,
                timeout: Any = "default", raw: bool = False) -> Tuple[int, Any]:
        """Sends one request on this thread's kept-alive connection and returns (status, body):
        body is the decoded JSON (None when empty), or bytes when raw. A non-2xx answer raises the
        typed MoatError. timeout: seconds, None for no limit, "default" for request_timeout."""
        if timeout == "default":
            timeout = self.request_timeout
        url = self.path(path, query)
        h = self.headers(headers)
        if json_body is not None:
            body = json.dumps(json_body, separators=(",", ":")).encode()
            h["Content-Type"] = "application/json"
        rewindable = body is None or isinstance(body, (bytes, bytearray, str))
        for attempt in (0, 1):
            conn, reused = self._pooled()
            conn.sock.settimeout(timeout)  # type: ignore[union-attr]
            sent = False
            try:
                conn.request(method, url, body=body, headers=h)
                sent = True
                resp = conn.getresponse()
                data = resp.read()
            except socket.timeout as e:
                self._drop()
                raise errors.TimeoutError("%s %s: no answer within %ss (client timeout)" % (method, path, timeout),
                                          code="client_timeout") from e
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as e:
                self._drop()
                # A kept-alive connection the server had already closed: send once more on a new one.
                stale = reused and (not sent or isinstance(e, http.client.RemoteDisconnected))
                if attempt == 0 and stale and rewindable:
                    continue
                raise errors.ConnectionError("%s %s: connection lost: %s" % (method, path, e),
                                             code="connection_error") from e
            except (OSError, http.client.HTTPException) as e:
                self._drop()
                raise errors.ConnectionError("%s %s: %s" % (method, path, e), code="connection_error") from e
            if resp.will_close:
                self._drop()
            status = resp.status
            ctype = resp.getheader("Content-Type", "") or ""
            break
        if 200 <= status < 300 and raw:
            return status, data
        parsed: Any = data
        if "json" in ctype or (data[:1] == b"{" and "octet" not in ctype):
            try:
                parsed = json.loads(data) if data else None
            except ValueError:
                parsed = data
        elif not data:
            parsed = None
        if not 200 <= status < 300:
            raise errors.error_from_response(status, parsed, "%s %s -> HTTP %d" % (method, path, status))
        return status, parsed

    # -- streams --
    def stream(self, method: str, path: str, *, json_body: Any = None,
               query: Optional[Dict[str, Any]] = None, ready_comment: Optional[str] = None) -> "SSEStream":
        """Opens a Server-Sent Events stream on a connection of its own. A non-2xx answer raises the
        typed MoatError. With ready_comment, returns only once that comment line has arrived."""
        url = self.path(path, query)
        h = self.headers({"Accept": "text/event-stream"})
        body = None
        if json_body is not None:
            body = json.dumps(json_body, separators=(",", ":")).encode()
            h["Content-Type"] = "application/json"
        conn = self._new_conn()
        try:
            conn.sock.settimeout(self.request_timeout)  # type: ignore[union-attr]
            conn.request(method, url, body=body, headers=h)
            resp = conn.getresponse()
        except socket.timeout as e:
            conn.close()
            raise errors.TimeoutError("%s %s: no answer within %ss (client timeout)" % (method, path,
                                                                                       self.request_timeout),
                                      code="client_timeout") from e
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise errors.ConnectionError("%s %s: %s" % (method, path, e), code="connection_error") from e
        if not 200 <= resp.status < 300:
            try:
                data = resp.read()
            except (OSError, http.client.HTTPException):
                data = b""
            conn.close()
            try:
                parsed: Any = json.loads(data)
            except ValueError:
                parsed = data
            raise errors.error_from_response(resp.status, parsed, "%s %s -> HTTP %d" % (method, path, resp.status))
        s = SSEStream(conn, resp, "%s %s" % (method, path), self.stream_idle_timeout)
        if ready_comment is not None:
            s.wait_comment(ready_comment)
        return s


class Event:
    """One SSE event: its name and its JSON-decoded data."""
    __slots__ = ("name", "data")

    def __init__(self, name: str, data: Any):
        self.name = name
        self.data = data

    def __repr__(self) -> str:
        return "Event(%r, %.200r)" % (self.name, self.data)


class SSEStream:
    """Reads events from an open text/event-stream answer. A stream that ends without the caller
    having seen its last event, or stays silent past the idle limit, raises moat.ConnectionError."""

    def __init__(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse, what: str,
                 idle_timeout: Optional[float]):
        self.conn = conn
        self.resp = resp
        self.what = what
        self.closed = False
        self.comments = []  # type: list
        if conn.sock is not None:
            conn.sock.settimeout(idle_timeout)
        self.idle_timeout = idle_timeout
        #: time.monotonic() by which the caller wants the stream over (None: no limit); past it,
        #: reading raises moat.TimeoutError and closes the stream.
        self.deadline = None  # type: Optional[float]

    def _line(self) -> Optional[bytes]:
        if self.deadline is not None and self.conn.sock is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                self.close()
                raise errors.TimeoutError("%s: not finished within the caller's timeout" % self.what,
                                          code="client_timeout")
            self.conn.sock.settimeout(left if self.idle_timeout is None else min(left, self.idle_timeout))
        try:
            line = self.resp.readline(1 << 26)
        except socket.timeout as e:
            self.close()
            if self.deadline is not None and time.monotonic() >= self.deadline - 0.01:
                raise errors.TimeoutError("%s: not finished within the caller's timeout" % self.what,
                                          code="client_timeout") from e
            raise errors.ConnectionError("%s: stream silent for %ss (no keep-alive): connection presumed dropped"
                                         % (self.what, self.idle_timeout), code="connection_error") from e
        except Exception as e:
            if self.closed:  # close() from another thread while this one was reading
                return None
            if not isinstance(e, (OSError, http.client.HTTPException, ValueError)):
                raise
            self.close()
            raise errors.ConnectionError("%s: stream connection lost: %s" % (self.what, e),
                                         code="connection_error") from e
        if not line:
            return None
        return line

    def next(self) -> Optional[Event]:
        """The next event, or None when the server ended the stream cleanly (or close() was called)."""
        name, data = "message", []
        while True:
            if self.closed:
                return None
            line = self._line()
            if line is None:
                self.close()
                return None
            line = line.rstrip(b"\r\n")
            if not line:
                if data:
                    raw = b"\n".join(data)
                    try:
                        payload: Any = json.loads(raw)
                    except ValueError:
                        payload = raw.decode("utf-8", "replace")
                    return Event(name, payload)
                name = "message"
                continue
            if line.startswith(b":"):
                self.comments.append(line[1:].strip().decode("utf-8", "replace"))
            elif line.startswith(b"event:"):
                name = line[6:].strip().decode("utf-8", "replace")
            elif line.startswith(b"data:"):
                d = line[5:]
                data.append(d[1:] if d.startswith(b" ") else d)

    def wait_comment(self, text: str) -> None:
        """Reads until a comment line `: text` (before any event); raises ConnectionError at EOF."""
        while text not in self.comments:
            line = self._line()
            if line is None:
                self.close()
                raise errors.ConnectionError("%s: stream ended before it was ready" % self.what,
                                             code="connection_error")
            line = line.rstrip(b"\r\n")
            if line.startswith(b":"):
                self.comments.append(line[1:].strip().decode("utf-8", "replace"))

    def lost(self, what: str = "the last event") -> errors.ConnectionError:
        """The error for a stream that ended before `what`."""
        return errors.ConnectionError("%s: stream ended before %s (connection dropped)" % (self.what, what),
                                      code="connection_error")

    def __iter__(self) -> Iterator[Event]:
        while True:
            ev = self.next()
            if ev is None:
                return
            yield ev

    def close(self) -> None:
        """Drops the connection at once (the server notices within about a second)."""
        if self.closed:
            return
        self.closed = True
        try:
            if self.conn.sock is not None:
                self.conn.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.conn.close()


def output_bytes(data: Any) -> bytes:
    """The bytes of a stdout/stderr event's data ({"data", "encoding"})."""
    if not isinstance(data, dict):
        return b""
    d = data.get("data", "")
    if data.get("encoding") == "base64":
        return base64.b64decode(d)
    return d.encode("utf-8")

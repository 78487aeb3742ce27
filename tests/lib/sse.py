"""sse.py -- a streaming Server-Sent Events client over http.client (stdlib only) for the tests.

    s = sse.open(client, "POST", "/v1/sandboxes/ID/exec/stream", body={...})
    for ev in s:            # Event(name, data, raw); data is the JSON-decoded payload
        ...
    s.close()               # drops the connection at once (a client that goes away)

Bytes are read with read1() as they arrive (chunked transfer decoded by http.client), so the
time an event is received is the time the server sent it. A non-2xx answer raises
moatd.HTTPError with the JSON error body.
"""

import base64
import http.client
import json
import time
import urllib.parse

from moatd import HTTPError


class Event:
    __slots__ = ("name", "data", "raw", "at")

    def __init__(self, name, raw, at):
        self.name = name
        self.raw = raw
        self.at = at
        try:
            self.data = json.loads(raw) if raw else None
        except ValueError:
            self.data = raw

    def __repr__(self):
        return "Event(%s, %.200r)" % (self.name, self.raw)


class Stream:
    def __init__(self, conn, resp):
        self.conn = conn
        self.resp = resp
        self.status = resp.status
        self.headers = resp.headers
        self.buf = b""
        self.comments = []  # comment lines (": keep-alive"), in order
        self.eof = False

    def _fill(self, timeout):
        if timeout is not None:
            self.conn.sock.settimeout(timeout)
        try:
            data = self.resp.read1(65536)
        except (ConnectionError, http.client.IncompleteRead):
            data = b""
        if not data:
            self.eof = True
        self.buf += data

    def next(self, timeout=60):
        """The next event, or None at the end of the stream. Raises socket.timeout (TimeoutError)."""
        deadline = None if timeout is None else time.time() + timeout
        while True:
            i = self.buf.find(b"\n\n")
            if i >= 0:
                block, self.buf = self.buf[:i], self.buf[i + 2:]
                name, data = "message", []
                for line in block.split(b"\n"):
                    if line.startswith(b":"):
                        self.comments.append(line[1:].strip().decode())
                    elif line.startswith(b"event:"):
                        name = line[6:].strip().decode()
                    elif line.startswith(b"data:"):
                        d = line[5:]
                        data.append(d[1:] if d.startswith(b" ") else d)
                if not data and name == "message":
                    continue  # a comment-only block
                return Event(name, b"\n".join(data).decode(), time.time())
            if self.eof:
                return None
            left = None if deadline is None else max(0.01, deadline - time.time())
            if deadline is not None and time.time() >= deadline:
                raise TimeoutError("no SSE event within %ss" % timeout)
            self._fill(left)

    def __iter__(self):
        while True:
            ev = self.next()
            if ev is None:
                return
            yield ev

    def all(self, timeout=120):
        out = []
        while True:
            ev = self.next(timeout)
            if ev is None:
                return out
            out.append(ev)

    def close(self):
        try:
            self.conn.sock.close()
        except Exception:
            pass
        self.conn.close()


def open(client, method, path, body=None, query=None, timeout=60, headers=None):
    """Starts a request and returns a Stream once the response headers are in."""
    if query:
        path += "?" + urllib.parse.urlencode(query, quote_via=urllib.parse.quote)
    h = {"Authorization": "Bearer " + client.key, "Accept": "text/event-stream"}
    data = None
    if body is not None:
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        h["Content-Type"] = "application/json"
    if headers:
        h.update(headers)
    conn = http.client.HTTPConnection(client.host, client.port, timeout=timeout)
    conn.request(method, path, body=data, headers=h)
    resp = conn.getresponse()
    if not (200 <= resp.status < 300):
        payload = resp.read()
        conn.close()
        try:
            payload = json.loads(payload)
        except ValueError:
            pass
        raise HTTPError(method, path, resp.status, payload)
    return Stream(conn, resp)


def output(events, name="stdout"):
    """The bytes of all `name` events (stdout/stderr), decoded per their encoding."""
    out = b""
    for ev in events:
        if ev.name == name:
            d = ev.data
            out += base64.b64decode(d["data"]) if d["encoding"] == "base64" else d["data"].encode()
    return out

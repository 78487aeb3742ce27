"""interactive.py -- the issue-3 measurements of bench.py, each side by side with its peer in the same run:

(e) time to first byte of POST .../exec/stream {"argv": ["echo", "x"]} (request sent -> first stdout
    event read) vs the plain exec round trip of the same command;
(f) PTY keystroke echo: one byte sent over the pty WebSocket to `cat` on a raw pty, time until it
    comes back, vs the same through a local pty (pty.fork) with `cat` on the host;
(g) code context `1+1` round trip (POST .../contexts/{cid}/run) vs `python3 -c '1+1'` spawned fresh
    via exec in the same sandbox (template code-interpreter);
(h) streaming throughput: `moat exec --stream ID -- cat` of a 1 GiB file to /dev/null (the C CLI
    decoding every event) vs `cat` of a 1 GiB file to /dev/null on the host.
A route or template that is missing is reported as missing with the reason; nothing is estimated.
"""

import base64
import http.client
import json
import os
import pty
import select
import socket
import struct
import subprocess
import time
import urllib.parse


class Missing(Exception):
    pass


def _post(port, key, path, body, timeout=300):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request("POST", path, body=json.dumps(body).encode(),
              headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data


def _check_route(status, data, what):
    if status in (404, 405, 501):
        try:
            msg = json.loads(data).get("message", "")
        except ValueError:
            msg = data[:120].decode(errors="replace")
        raise Missing("%s -> %d %s" % (what, status, msg))
    if status >= 300:
        raise RuntimeError("%s -> %d %r" % (what, status, data[:300]))


# ---- (e) time to first byte of a streamed exec ----

def stream_ttfb(port, key, sid):
    """Seconds from sending the request to reading the first stdout event; the stream is read to its end."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    body = json.dumps({"argv": ["echo", "x"]}).encode()
    t0 = time.perf_counter()
    c.request("POST", "/v1/sandboxes/%s/exec/stream" % sid, body=body,
              headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        data = r.read()
        c.close()
        _check_route(r.status, data, "POST exec/stream")
    first, event, got_exit = None, None, False
    while True:
        line = r.fp.readline()
        if not line:
            break
        line = line.rstrip(b"\r\n")
        if line.startswith(b"event:"):
            event = line[6:].strip()
            if event == b"stdout" and first is None:
                pass
        elif line.startswith(b"data:") and event == b"stdout" and first is None:
            first = time.perf_counter() - t0
        elif line.startswith(b"data:") and event == b"exit":
            got_exit = True
            break
    c.close()
    if first is None or not got_exit:
        raise RuntimeError("exec/stream gave no stdout event or no exit")
    return first


def bench_stream_ttfb(daemon, n):
    key, port = daemon.client.key, daemon.port
    sid = daemon.client.create()["id"]
    try:
        for _ in range(5):
            stream_ttfb(port, key, sid)
        ttfb = [stream_ttfb(port, key, sid) * 1000 for _ in range(n)]
        plain = []
        for _ in range(n):
            t0 = time.perf_counter()
            st, _ = _post(port, key, "/v1/sandboxes/%s/exec" % sid, {"argv": ["echo", "x"]})
            plain.append((time.perf_counter() - t0) * 1000)
        return ttfb, plain
    finally:
        daemon.client.request("DELETE", "/v1/sandboxes/" + sid, expect=(204, 404))


# ---- (f) PTY keystroke echo over the WebSocket ----

class WS:
    """A minimal RFC 6455 client: masked frames out, unmasked frames in."""

    def __init__(self, port, key, path):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        nonce = base64.b64encode(os.urandom(16)).decode()
        req = ("GET %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
               "Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\nAuthorization: Bearer %s\r\n\r\n"
               % (path, port, nonce, key))
        self.s.sendall(req.encode())
        buf = b""
        while b"\r\n\r\n" not in buf:
            d = self.s.recv(4096)
            if not d:
                raise RuntimeError("pty: connection closed during the upgrade")
            buf += d
        head, self.buf = buf.split(b"\r\n\r\n", 1)
        status = int(head.split(b" ", 2)[1])
        if status != 101:
            self.s.settimeout(2)
            try:
                rest = self.s.recv(65536)
            except OSError:
                rest = b""
            _check_route(status, self.buf + rest, "GET pty")

    def send(self, data, opcode=2):
        mask = os.urandom(4)
        n = len(data)
        hdr = bytes([0x80 | opcode])
        if n < 126:
            hdr += bytes([0x80 | n])
        elif n < 65536:
            hdr += bytes([0x80 | 126]) + struct.pack(">H", n)
        else:
            hdr += bytes([0x80 | 127]) + struct.pack(">Q", n)
        self.s.sendall(hdr + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))

    def _need(self, n):
        while len(self.buf) < n:
            d = self.s.recv(65536)
            if not d:
                raise EOFError
            self.buf += d

    def recv(self):
        """(opcode, payload) of the next frame."""
        self._need(2)
        b0, b1 = self.buf[0], self.buf[1]
        n, off = b1 & 0x7F, 2
        if n == 126:
            self._need(4)
            n, off = struct.unpack(">H", self.buf[2:4])[0], 4
        elif n == 127:
            self._need(10)
            n, off = struct.unpack(">Q", self.buf[2:10])[0], 10
        self._need(off + n)
        payload, self.buf = self.buf[off:off + n], self.buf[off + n:]
        return b0 & 0x0F, payload

    def read_until(self, want, timeout=10):
        got = b""
        deadline = time.time() + timeout
        while want not in got:
            if time.time() > deadline:
                raise RuntimeError("pty: %r did not come back (got %r)" % (want, got[-200:]))
            op, p = self.recv()
            if op == 2:
                got += p
            elif op == 8:
                raise RuntimeError("pty closed: %r" % p)
        return got

    def close(self):
        try:
            self.send(struct.pack(">H", 1000), opcode=8)
        except OSError:
            pass
        self.s.close()


RAW_CAT = "stty raw -echo; echo READY; exec cat"


def bench_pty_echo(daemon, n):
    sid = daemon.client.create()["id"]
    try:
        q = urllib.parse.urlencode({"cols": 80, "rows": 24, "cmd": RAW_CAT})
        ws = WS(daemon.port, daemon.client.key, "/v1/sandboxes/%s/pty?%s" % (sid, q))
        try:
            ws.read_until(b"READY")
            times = []
            for i in range(n + 5):
                b = bytes([0x61 + i % 26])
                t0 = time.perf_counter()
                ws.send(b)
                ws.read_until(b)
                if i >= 5:
                    times.append((time.perf_counter() - t0) * 1000)
            return times
        finally:
            ws.close()
    finally:
        daemon.client.request("DELETE", "/v1/sandboxes/" + sid, expect=(204, 404))


def local_pty_echo(n):
    """The same keystroke round trip through a local pty and `cat` on the host."""
    pid, fd = pty.fork()
    if pid == 0:
        os.execvp("sh", ["sh", "-c", RAW_CAT])
    try:
        buf = b""
        while b"READY" not in buf:
            buf += os.read(fd, 4096)
        times = []
        for i in range(n + 5):
            b = bytes([0x61 + i % 26])
            t0 = time.perf_counter()
            os.write(fd, b)
            got = b""
            while b not in got:
                select.select([fd], [], [], 10)
                got += os.read(fd, 4096)
            if i >= 5:
                times.append((time.perf_counter() - t0) * 1000)
        return times
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        os.close(fd)


# ---- (g) code context vs a fresh python3 ----

def bench_context(daemon, n):
    c = daemon.client
    st, sb = c.request("POST", "/v1/sandboxes", body={"template": "code-interpreter"}, expect=None, timeout=1800)
    if st != 201:
        raise Missing("create with template code-interpreter -> %d %s" % (st, sb.get("message", sb) if isinstance(sb, dict) else sb))
    sid = sb["id"]
    try:
        st, data = _post(daemon.port, c.key, "/v1/sandboxes/%s/contexts" % sid, {"language": "python"})
        _check_route(st, data, "POST contexts")
        cid = json.loads(data)["id"]
        path = "/v1/sandboxes/%s/contexts/%s/run" % (sid, cid)
        ctx_t = []
        for i in range(n + 5):
            t0 = time.perf_counter()
            st, data = _post(daemon.port, c.key, path, {"code": "1+1"})
            dt = (time.perf_counter() - t0) * 1000
            _check_route(st, data, "POST contexts/run")
            res = json.loads(data)
            texts = [r.get("text") for r in res.get("results", [])]
            if "2" not in texts:
                raise RuntimeError("context 1+1 answered %r" % res)
            if i >= 5:
                ctx_t.append(dt)
        fresh = []
        for i in range(n + 5):
            t0 = time.perf_counter()
            st, data = _post(daemon.port, c.key, "/v1/sandboxes/%s/exec" % sid, {"argv": ["python3", "-c", "1+1"]})
            dt = (time.perf_counter() - t0) * 1000
            if st != 200 or json.loads(data)["exit_code"] != 0:
                raise RuntimeError("exec python3 -> %d %r" % (st, data[:300]))
            if i >= 5:
                fresh.append(dt)
        return ctx_t, fresh
    finally:
        c.request("DELETE", "/v1/sandboxes/" + sid, expect=(204, 404))


# ---- (h) streaming throughput ----

GIB = 1 << 30
LINE = "moat streaming throughput 0123456789 abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ\n"


def bench_throughput(daemon, moat_bin, runs=3, size=GIB):
    c = daemon.client
    sid = c.create(disk_mb=4096)["id"]
    host_file = "/var/tmp/moat-bench-%d.txt" % os.getpid()
    env = dict(os.environ, MOAT_API_URL="http://127.0.0.1:%d" % daemon.port, MOAT_API_KEY=c.key)
    try:
        p = subprocess.run([moat_bin, "exec", "--stream", sid, "--", "true"], stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, env=env, timeout=60)
        if p.returncode != 0:  # the route first, before making 2 GiB of files
            raise Missing("moat exec --stream: " + p.stderr.decode(errors="replace").strip())
        # the same text (printable, so events carry it as UTF-8, not base64) inside and on the host
        gen = "yes '%s' | head -c %d > /root/big.txt" % (LINE.rstrip("\n"), size)
        r = c.exec(sid, cmd=gen, timeout=600)
        if r["exit_code"] != 0:
            raise RuntimeError("making the file: %r" % r)
        subprocess.run(["sh", "-c", "yes '%s' | head -c %d > %s" % (LINE.rstrip("\n"), size, host_file)], check=True)
        c.exec(sid, cmd="cat /root/big.txt > /dev/null")  # page cache, like the host's file
        subprocess.run(["sh", "-c", "cat %s > /dev/null" % host_file], check=True)
        sandbox_s, host_s = [], []
        for _ in range(runs):
            t0 = time.perf_counter()
            p = subprocess.run([moat_bin, "exec", "--stream", sid, "--", "cat", "/root/big.txt"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, timeout=900)
            dt = time.perf_counter() - t0
            if p.returncode != 0:
                err = p.stderr.decode(errors="replace").strip()
                if "not_implemented" in err or "not_found" in err or "(404)" in err:
                    raise Missing("moat exec --stream: " + err)
                raise RuntimeError("moat exec --stream cat exited %d: %s" % (p.returncode, err))
            sandbox_s.append(dt)
            t0 = time.perf_counter()
            subprocess.run(["sh", "-c", "cat %s > /dev/null" % host_file], check=True)
            host_s.append(time.perf_counter() - t0)
        # one more, counting the bytes that come out, so the figure is for a complete stream
        p = subprocess.Popen([moat_bin, "exec", "--stream", sid, "--", "cat", "/root/big.txt"],
                             stdout=subprocess.PIPE, env=env)
        total = 0
        while True:
            b = p.stdout.read(1 << 20)
            if not b:
                break
            total += len(b)
        if p.wait() != 0 or total != size:
            raise RuntimeError("streamed %d of %d bytes (exit %s)" % (total, size, p.returncode))
        mib = size / (1 << 20)
        return [mib / s for s in sandbox_s], [mib / s for s in host_s]
    finally:
        try:
            os.unlink(host_file)
        except OSError:
            pass
        c.request("DELETE", "/v1/sandboxes/" + sid, expect=(204, 404))

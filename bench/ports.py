#!/usr/bin/env python3
"""ports.py -- what moatd's exposed-port proxy costs, in one run against one moatd (issue 5 item 5).

An HTTP/1.1 server (tests/lib/port_servers.py) runs inside a code-interpreter sandbox on 127.0.0.1. The
same client (http.client, one kept-alive connection each) times GET /hello three ways, interleaved in
blocks of 10 so that drift hits all alike:
  direct  a socket made inside the sandbox's own network namespace (setns from a helper thread of this
          process, found through the server's pid), straight to the server: the peer;
  path    through moatd's API listener: /v1/sandboxes/ID/ports/P/hello with the API key;
  host    through moatd's proxy listener: Host P-ID.bench.test with the port's access token.
Then the throughput of a 64 MiB response each way (best of 3). Needs root (setns) like moatd.

  MOAT_BUILD=build python3 bench/ports.py [--requests 1000] [--mib 64]
"""

import argparse
import ctypes
import http.client
import os
import random
import socket
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "lib"))
import moatd  # noqa: E402

CLONE_NEWNET = 0x40000000
DOMAIN = "bench.test"


def pct(xs, p):
    s = sorted(xs)
    k = max(0, min(len(s) - 1, int(round(p / 100.0 * len(s) + 0.5)) - 1))
    return s[k]


def socket_in_netns(pid, port):
    """A TCP socket connected to 127.0.0.1:port inside the network namespace of pid."""
    libc = ctypes.CDLL(None, use_errno=True)
    out = {}

    def run():
        own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        fd = os.open("/proc/%d/ns/net" % pid, os.O_RDONLY)
        try:
            if libc.setns(fd, CLONE_NEWNET) != 0:
                out["err"] = OSError(ctypes.get_errno(), "setns")
                return
            try:
                s = socket.socket()
            finally:
                if libc.setns(own, CLONE_NEWNET) != 0:
                    os._exit(70)  # never go on in the sandbox's namespace
            s.connect(("127.0.0.1", port))
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            out["sock"] = s
        finally:
            os.close(fd)
            os.close(own)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if "err" in out:
        raise out["err"]
    return out["sock"]


def find_pid(marker):
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % p, "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if any(a.endswith(b"port_servers.py") for a in argv) and marker.encode() in argv:
            return int(p)
    raise RuntimeError("the server's pid was not found")


class Way:
    def __init__(self, name, conn, target, headers):
        self.name, self.conn, self.target, self.headers = name, conn, target, headers
        self.ms = []
        self.sock = None

    def get(self, target=None):
        self.conn.request("GET", target or self.target, headers=self.headers)
        r = self.conn.getresponse()
        data = r.read()
        if r.status != 200:
            raise RuntimeError("%s: %d %r" % (self.name, r.status, data[:200]))
        if self.sock is None:
            self.sock = self.conn.sock
        elif self.conn.sock is not self.sock:
            raise RuntimeError("%s: the connection was not kept alive" % self.name)
        return data


def row(name, xs, base=None):
    ratio = " %5.2fx" % (pct(xs, 50) / pct(base, 50)) if base else "      -"
    return "| %-32s | %7.3f | %7.3f | %7.3f | %5d | %s |" % (name, pct(xs, 50), pct(xs, 95), pct(xs, 99), len(xs),
                                                             ratio)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--mib", type=int, default=64)
    a = ap.parse_args()
    moatd.ensure_template("code-interpreter")
    proxy_port = moatd.free_port()
    d = moatd.MoatDaemon(pool=1, extra_args=["--proxy-listen", "127.0.0.1:%d" % proxy_port, "--proxy-domain", DOMAIN])
    try:
        d.start()
        c = d.client
        sid = c.create(template="code-interpreter", ttl_seconds=3600)["id"]
        port = random.randint(20000, 29999)
        with open(os.path.join(REPO, "tests", "lib", "port_servers.py"), "rb") as f:
            c.put_file(sid, "/tmp/port_servers.py", f.read())
        c.request("POST", "/v1/sandboxes/%s/exec" % sid, expect=201,
                  body={"argv": ["python3", "/tmp/port_servers.py", str(port), str(port + 1)], "background": True})
        deadline = time.time() + 30
        while c.request("GET", "/v1/sandboxes/%s/ports/%d/hello" % (sid, port), expect=(200, 502))[0] != 200:
            if time.time() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.1)
        tok = c.request("POST", "/v1/sandboxes/%s/ports/%d" % (sid, port), body={})[1]["token"]
        pid = find_pid(str(port))

        direct = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        direct.sock = socket_in_netns(pid, port)
        path = http.client.HTTPConnection("127.0.0.1", d.port, timeout=60)
        path.connect()
        path.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        host = http.client.HTTPConnection("127.0.0.1", proxy_port, timeout=60)
        host.connect()
        host.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        ways = [
            Way("direct (in the sandbox's netns)", direct, "/hello", {}),
            Way("path  /v1/sandboxes/ID/ports/P/", path, "/v1/sandboxes/%s/ports/%d/hello" % (sid, port),
                {"Authorization": "Bearer " + c.key}),
            Way("host  P-ID.%s (token)" % DOMAIN, host, "/hello",
                {"Host": "%d-%s.%s" % (port, sid, DOMAIN), "X-Moat-Port-Token": tok}),
        ]
        for w in ways:  # warm-up
            for _ in range(50):
                w.get()
        while len(ways[0].ms) < a.requests:
            for w in ways:
                for _ in range(10):
                    t0 = time.perf_counter()
                    body = w.get()
                    w.ms.append((time.perf_counter() - t0) * 1000)
                    assert body == b"hello"
        print("\nGET /hello (5-byte answer), kept-alive connection, %d requests each way, ms:\n" % a.requests)
        print("| way                              |     p50 |     p95 |     p99 |     n | vs direct |")
        print("|----------------------------------|---------|---------|---------|-------|-----------|")
        for w in ways:
            print(row(w.name, w.ms, None if w is ways[0] else ways[0].ms))

        n = a.mib << 20
        print("\nGET /big (%d MiB), best of 3, MiB/s:\n" % a.mib)
        print("| way                              |   MiB/s | vs direct |")
        print("|----------------------------------|---------|-----------|")
        best = {}
        for w in ways:
            b = 0.0
            for _ in range(3):
                t0 = time.perf_counter()
                data = w.get(w.target.replace("/hello", "/big?n=%d" % n))
                dt = time.perf_counter() - t0
                assert len(data) == n
                b = max(b, a.mib / dt)
            best[w.name] = b
            ratio = "%8.2fx" % (b / best[ways[0].name]) if w is not ways[0] else "        -"
            print("| %-32s | %7.0f | %s |" % (w.name, b, ratio))
        for w in ways:
            w.conn.close()
        c.delete(sid)
    finally:
        d.stop()


if __name__ == "__main__":
    main()

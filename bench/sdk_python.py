#!/usr/bin/env python3
"""sdk_python.py -- what the Python SDK (sdk/python, package `moat`) costs over raw HTTP, in one run
against one moatd:

(i)  exec `true`: ``sb.exec(["true"])`` against the same request made by hand (one kept-alive
     http.client connection, the same JSON body encoded with json.dumps, the answer decoded with
     json.loads), interleaved in blocks of 10 so that drift hits both alike; p50/p95/p99 of each and
     the ratio (target: SDK p50 <= 1.2x raw);
(ii) create to first exec result: ``Sandbox.create()`` then ``sb.exec(["true"])``, against the same
     two requests by hand; each sandbox deleted after its timing, off the timed path.

  MOAT_BUILD=build python3 bench/sdk_python.py [--execs 400] [--creates 40] [--pool 4]
"""

import argparse
import http.client
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "lib"))
sys.path.insert(0, os.path.join(REPO, "sdk", "python"))
import moatd  # noqa: E402

import moat  # noqa: E402


def pct(xs, p):
    s = sorted(xs)
    k = max(0, min(len(s) - 1, int(round(p / 100.0 * len(s) + 0.5)) - 1))
    return s[k]


class Raw:
    """The hand-written peer: one kept-alive connection, json.dumps / json.loads."""

    def __init__(self, port, key):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        self.h = {"Authorization": "Bearer " + key, "Content-Type": "application/json"}

    def call(self, method, path, body=None):
        self.conn.request(method, path, body=json.dumps(body).encode() if body is not None else None, headers=self.h)
        r = self.conn.getresponse()
        data = r.read()
        if r.status >= 300:
            raise RuntimeError("%s %s -> %d %r" % (method, path, r.status, data[:200]))
        return json.loads(data) if data else None


def row(name, xs):
    return "| %-34s | %8.3f | %8.3f | %8.3f | %5d |" % (name, pct(xs, 50), pct(xs, 95), pct(xs, 99), len(xs))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--execs", type=int, default=400)
    ap.add_argument("--creates", type=int, default=40)
    ap.add_argument("--pool", type=int, default=4)
    a = ap.parse_args()
    moatd.ensure_template("base")
    d = moatd.MoatDaemon(pool=a.pool)
    try:
        d.start()
        client = moat.Client("http://127.0.0.1:%d" % d.port, d.client.key)
        raw = Raw(d.port, d.client.key)
        sb = moat.Sandbox.create(client=client)
        path = "/v1/sandboxes/%s/exec" % sb.id
        for _ in range(20):  # warm-up of both paths
            sb.exec(["true"])
            raw.call("POST", path, {"argv": ["true"]})
        sdk_ms, raw_ms = [], []
        while len(sdk_ms) < a.execs:
            for _ in range(10):
                t0 = time.perf_counter()
                r = raw.call("POST", path, {"argv": ["true"]})
                raw_ms.append((time.perf_counter() - t0) * 1000)
                assert r["exit_code"] == 0
            for _ in range(10):
                t0 = time.perf_counter()
                r = sb.exec(["true"])
                sdk_ms.append((time.perf_counter() - t0) * 1000)
                assert r.exit_code == 0
        sb.kill()

        time.sleep(1)  # let the pool refill
        sdk_first, raw_first = [], []
        for i in range(a.creates):
            if i % 2 == 0:
                t0 = time.perf_counter()
                s = moat.Sandbox.create(client=client)
                r = s.exec(["true"])
                sdk_first.append((time.perf_counter() - t0) * 1000)
                assert r.exit_code == 0
                s.kill()
            else:
                t0 = time.perf_counter()
                info = raw.call("POST", "/v1/sandboxes", {})
                r = raw.call("POST", "/v1/sandboxes/%s/exec" % info["id"], {"argv": ["true"]})
                raw_first.append((time.perf_counter() - t0) * 1000)
                assert r["exit_code"] == 0
                raw.call("DELETE", "/v1/sandboxes/" + info["id"])
            time.sleep(0.25)  # pace: the warm pool refills between creates
    finally:
        d.stop()

    ratio = pct(sdk_ms, 50) / pct(raw_ms, 50)
    ratio_first = pct(sdk_first, 50) / pct(raw_first, 50)
    print("## Python SDK overhead (bench/sdk_python.py)\n")
    print("| measurement (ms)                   |      p50 |      p95 |      p99 |     n |")
    print("|------------------------------------|----------|----------|----------|-------|")
    print(row("(i) exec true, raw http.client", raw_ms))
    print(row("(i) exec true, moat SDK", sdk_ms))
    print(row("(ii) create+first exec, raw", raw_first))
    print(row("(ii) create+first exec, moat SDK", sdk_first))
    print()
    print("(i) SDK / raw p50: %.3fx (target <= 1.2x: %s); p95 %.3fx; p99 %.3fx"
          % (ratio, "met" if ratio <= 1.2 else "MISSED", pct(sdk_ms, 95) / pct(raw_ms, 95),
             pct(sdk_ms, 99) / pct(raw_ms, 99)))
    print("(ii) Sandbox.create -> first exec result p50 %.2f ms (raw %.2f ms, %.3fx)"
          % (pct(sdk_first, 50), pct(raw_first, 50), ratio_first))
    return 0


if __name__ == "__main__":
    sys.exit(main())

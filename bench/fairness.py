#!/usr/bin/env python3
"""fairness.py -- another org's exec latency while one org holds all it may, against idle.

  MOAT_BUILD=build python3 bench/fairness.py [--execs 1000] [--out FILE]

One moatd with the default caps (docs/CONTRACT.md, Limits and fairness). Org B runs `exec ["true"]` in its
sandbox over a kept-alive connection, --execs times after 10 warm-ups: first with nothing else running
(idle), then while org A holds its maximum: --max-requests-per-org execs of `sleep` in flight (spread over
sandboxes so that no per-sandbox cap stops them first) and --max-streams-per-org SSE event streams open,
with A's next exec and next stream checked to be refused 429. Prints p50/p95/p99 of both and the ratio
held/idle (target: <= 2x).
"""

import argparse
import http.client
import json
import os
import socket
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "lib"))
import moatd  # noqa: E402

REQ_ORG, STREAM_ORG, REQ_SB, STREAM_SB = 256, 256, 64, 64  # moatd's defaults (src/api/api.h)


def pct(xs, p):
    s = sorted(xs)
    k = max(0, min(len(s) - 1, int(round(p / 100.0 * len(s) + 0.5)) - 1))
    return s[k]


def exec_times(port, key, sid, n):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    body = json.dumps({"argv": ["true"]}).encode()
    h = {"Authorization": "Bearer " + key, "Content-Type": "application/json"}
    out = []
    for i in range(n + 10):
        t0 = time.perf_counter()
        conn.request("POST", "/v1/sandboxes/%s/exec" % sid, body=body, headers=h)
        r = conn.getresponse()
        payload = r.read()
        dt = time.perf_counter() - t0
        if r.status != 200 or json.loads(payload)["exit_code"] != 0:
            raise SystemExit("exec failed: %d %r" % (r.status, payload[:200]))
        if i >= 10:
            out.append(dt * 1000)
    conn.close()
    return out


def status_of(port, key, method, path):
    """The status of one request (a stream is closed once its head is in)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    try:
        s.sendall(b"%s %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n"
                  % (method.encode(), path.encode(), key.encode()))
        return int(s.recv(64).split()[1])
    finally:
        s.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--execs", type=int, default=1000)
    ap.add_argument("--out")
    args = ap.parse_args()
    d = moatd.MoatDaemon(pool=2)
    d.start()
    holders, streams = [], []
    try:
        a = d.client
        b = a.with_key(d.new_org_key("bench-fair-b"))
        nsb = max((REQ_ORG + REQ_SB - 1) // REQ_SB, (STREAM_ORG + STREAM_SB - 1) // STREAM_SB)
        asb = [a.create(ttl_seconds=1800)["id"] for _ in range(nsb)]
        bsb = b.create(ttl_seconds=1800)["id"]
        idle = exec_times(d.port, b.key, bsb, args.execs)

        def hold(sid):
            try:
                a.exec(sid, argv=["sleep", "600"], timeout=900)
            except Exception:  # noqa: BLE001 -- ended by the sandbox's deletion
                pass

        for i in range(REQ_ORG):
            t = threading.Thread(target=hold, args=(asb[i // REQ_SB],), daemon=True)
            t.start()
            holders.append(t)
        for i in range(STREAM_ORG):
            s = socket.create_connection(("127.0.0.1", d.port), timeout=30)
            s.sendall(b"GET /v1/sandboxes/%s/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n"
                      % (asb[i // STREAM_SB].encode(), a.key.encode()))
            if not s.recv(64).startswith(b"HTTP/1.1 200"):
                raise SystemExit("org A's stream %d was refused" % i)
            streams.append(s)
        deadline = time.time() + 60
        while status_of(d.port, a.key, "GET", "/v1/sandboxes") != 429:
            if time.time() > deadline:
                raise SystemExit("org A's execs did not all start")
            time.sleep(0.2)
        st = status_of(d.port, a.key, "GET", "/v1/sandboxes/%s/events" % asb[0])
        if st != 429:
            raise SystemExit("org A's stream over its cap answered %d" % st)
        held = exec_times(d.port, b.key, bsb, args.execs)
    finally:
        for s in streams:
            s.close()
        d.stop()
    rows = [("idle", idle), ("org A at its caps (%d execs in flight, %d streams)" % (REQ_ORG, STREAM_ORG), held)]
    lines = ["| org B exec `true` round trip (ms) | n | p50 | p95 | p99 |", "|---|---|---|---|---|"]
    for name, xs in rows:
        lines.append("| %s | %d | %.3f | %.3f | %.3f |" % (name, len(xs), pct(xs, 50), pct(xs, 95), pct(xs, 99)))
    ratio = [pct(held, p) / pct(idle, p) for p in (50, 95, 99)]
    lines.append("")
    lines.append("ratio held/idle: p50 %.2fx, p95 %.2fx, p99 %.2fx (target <= 2x at p50 and p99: %s)" % (
        ratio[0], ratio[1], ratio[2], "met" if ratio[0] <= 2 and ratio[2] <= 2 else "NOT met"))
    text = "\n".join(lines)
    print(text)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()

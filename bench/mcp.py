#!/usr/bin/env python3
"""mcp.py -- what a command costs through moatd's MCP endpoint against the plain v1 exec route, in one run
against one moatd:

(a) REST:  POST /v1/sandboxes/{id}/exec {"cmd": "true"} on one kept-alive http.client connection;
(b) MCP:   POST /v1/sandboxes/{id}/mcp tools/call shell {"command": "true"} (JSON-RPC, Mcp-Session-Id, the
           same connection kind), interleaved with (a) in blocks of 10 so that drift hits both alike;
(c) SDK:   the official @modelcontextprotocol/sdk Client.callTool("shell", {command: "true"}) in node
           (tests/node/mcp_bench.mjs), timed there with performance.now();
(d) initialize + notifications/initialized + tools/list: opening a session, by hand.
Both (a) and (b) run `/bin/sh -c true`. Prints p50/p95/p99 in ms.

  MOAT_BUILD=build python3 bench/mcp.py [--calls 400]
"""

import argparse
import http.client
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "lib"))
import moatd  # noqa: E402


def pct(xs, p):
    s = sorted(xs)
    k = max(0, min(len(s) - 1, int(round(p / 100.0 * len(s) + 0.5)) - 1))
    return s[k]


def row(name, xs):
    return "| %-40s | %8.3f | %8.3f | %8.3f | %5d |" % (name, pct(xs, 50), pct(xs, 95), pct(xs, 99), len(xs))


class Conn:
    def __init__(self, port, key):
        self.c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        self.h = {"Authorization": "Bearer " + key, "Content-Type": "application/json",
                  "Accept": "application/json, text/event-stream"}

    def post(self, path, body, extra=None):
        h = dict(self.h, **(extra or {}))
        self.c.request("POST", path, body=json.dumps(body).encode(), headers=h)
        r = self.c.getresponse()
        data = r.read()
        if r.status >= 300:
            raise RuntimeError("%s -> %d %r" % (path, r.status, data[:200]))
        return r, (json.loads(data) if data else None)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--pool", type=int, default=2)
    args = ap.parse_args()
    d = moatd.MoatDaemon(pool=args.pool)
    d.start()
    try:
        c = d.client
        sid = c.create(ttl_seconds=3600)["id"]
        mcp_path = "/v1/sandboxes/%s/mcp" % sid
        conn = Conn(d.port, c.key)

        def open_session():
            r, _ = conn.post(mcp_path, {"jsonrpc": "2.0", "id": 0, "method": "initialize",
                                        "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                                                   "clientInfo": {"name": "bench", "version": "1"}}})
            s = r.getheader("Mcp-Session-Id")
            hv = {"Mcp-Session-Id": s, "MCP-Protocol-Version": "2025-11-25"}
            conn.post(mcp_path, {"jsonrpc": "2.0", "method": "notifications/initialized"}, hv)
            conn.post(mcp_path, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, hv)
            return hv

        hv = open_session()
        rest, mcp, opens = [], [], []
        call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                "params": {"name": "shell", "arguments": {"command": "true"}}}

        def one_rest():
            t = time.perf_counter()
            _, b = conn.post("/v1/sandboxes/%s/exec" % sid, {"cmd": "true"})
            dt = time.perf_counter() - t
            assert b["exit_code"] == 0, b
            return dt * 1000

        def one_mcp():
            t = time.perf_counter()
            _, b = conn.post(mcp_path, call, hv)
            dt = time.perf_counter() - t
            assert b["result"]["isError"] is False and b["result"]["content"][0]["text"].startswith("exit_code: 0"), b
            return dt * 1000

        for _ in range(20):
            one_rest(), one_mcp()
        while len(rest) < args.calls:
            for _ in range(10):
                rest.append(one_rest())
            for _ in range(10):
                mcp.append(one_mcp())
        for _ in range(min(100, args.calls)):
            t = time.perf_counter()
            open_session()
            opens.append((time.perf_counter() - t) * 1000)

        sdk = []
        node_dir = os.path.join(REPO, "tests", "node")
        env = dict(os.environ, MOAT_URL="http://127.0.0.1:%d" % d.port, MOAT_KEY=c.key, MOAT_SANDBOX=sid,
                   MOAT_CALLS=str(args.calls))
        r = subprocess.run(["node", "mcp_bench.mjs"], cwd=node_dir, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=600)
        if r.returncode == 0:
            sdk = json.loads(r.stdout.decode().strip().splitlines()[-1])["ms"]
        else:
            sys.stderr.write("node SDK bench failed: %s\n" % r.stdout.decode(errors="replace")[-2000:])

        print("| measurement (ms)                         |      p50 |      p95 |      p99 |     n |")
        print("|------------------------------------------|----------|----------|----------|-------|")
        print(row("(a) REST exec `sh -c true`", rest))
        print(row("(b) MCP tools/call shell `true`, by hand", mcp))
        if sdk:
            print(row("(c) MCP via @modelcontextprotocol/sdk", sdk))
        print(row("(d) MCP open session (3 POSTs)", opens))
        print("\n(b) / (a): p50 %.2fx, p95 %.2fx, p99 %.2fx" % (pct(mcp, 50) / pct(rest, 50), pct(mcp, 95) / pct(rest, 95),
                                                            pct(mcp, 99) / pct(rest, 99)))
        if sdk:
            print("(c) / (a): p50 %.2fx" % (pct(sdk, 50) / pct(rest, 50)))
    finally:
        d.stop()


if __name__ == "__main__":
    main()

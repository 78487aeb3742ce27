#!/usr/bin/env python3
"""templates.py -- what templates from a Dockerfile cost (docs/benchmarks.md).

  MOAT_BUILD=build python3 bench/templates.py [--rounds 5]

(a) build time of the test Dockerfile (tests/integration/test_template_build.py: every instruction,
    two RUNs, a COPY of a directory, an ADD of a .tar.gz) cold (no step cached: the template was
    deleted, so its images went) and cached (the same again: every step CACHED), from the POST to
    the log's end event; and the peer: the same two RUN commands run in a fresh sandbox of base by
    exec (what a build at least costs: a sandbox and the commands);
(b) create-to-ready, client round trip of POST /v1/sandboxes, from a template whose start command is
    a Python HTTP server with a HEALTHCHECK: restored from its baked start state (the server already
    listening) against started at create (a create with env, which the baked state does not serve),
    and a plain create of base for scale.
Each figure is p50 / p95 / p99 over --rounds rounds (b: 3x as many).
"""

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "lib"))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "integration"))
sys.path.insert(0, HERE)
import moatd  # noqa: E402
from bench import summary  # noqa: E402
from test_template_build import BAKE_DOCKERFILE, SERVER, build, context, follow, tar_of  # noqa: E402


def fmt(xs, unit):
    s = summary(xs)
    return "p50 %.1f / p95 %.1f / p99 %.1f %s" % (s["p50"], s["p95"], s["p99"], unit)


def timed_build(c, name, ctx):
    t0 = time.perf_counter()
    t = build(c, name, ctx)
    logs, end = follow(c, name, t["build_id"])
    dt = time.perf_counter() - t0
    assert end and end["state"] == "ready", (end, logs[-5:])
    return dt, sum(1 for r in logs if r["text"].startswith("CACHED "))


def timed_create(c, **spec):
    t0 = time.perf_counter()
    sb = c.create(**spec)
    dt = (time.perf_counter() - t0) * 1000
    r = c.exec(sb["id"], argv=["curl", "-fsS", "http://127.0.0.1:8080/health"])
    assert r["exit_code"] == 0, r
    c.delete(sb["id"])
    return dt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    d = moatd.MoatDaemon(pool=0)
    try:
        d.start()
        c = d.client
        cold, cached, peer = [], [], []
        for _ in range(a.rounds):
            dt, n = timed_build(c, "bench", context())
            assert n == 0, "a cold build found %d cached steps" % n
            cold.append(dt)
            dt, n = timed_build(c, "bench", context())
            assert n == 6, "a cached build found %d cached steps" % n
            cached.append(dt)
            c.request("DELETE", "/v1/templates/bench", expect=204)
            t0 = time.perf_counter()
            sid = c.create()["id"]
            c.exec(sid, argv=["sh", "-c", 'echo "hello from $(whoami)" > /tmp/greeting.txt && echo built-line-1'])
            c.exec(sid, argv=["/bin/sh", "-c", "mkdir -p /srv/run && echo exec-form > /srv/run/form"])
            peer.append((time.perf_counter() - t0) * 1000)
            c.delete(sid)
        print("build of the test Dockerfile (12 instructions, 6 file-system steps), %d rounds:" % a.rounds)
        print("  cold %s; cached %s" % (fmt(cold, "s"), fmt(cached, "s")))
        print("  peer: a base sandbox and the two RUN commands by exec %s" % fmt(peer, "ms"))

        ctx = tar_of({"Dockerfile": BAKE_DOCKERFILE.encode(), "server.py": SERVER.encode()})
        timed_build(c, "server", ctx)
        first = timed_create(c, template="server")  # bakes the start state
        baked, started, plain = [], [], []
        for i in range(a.rounds * 3):
            baked.append(timed_create(c, template="server"))
            started.append(timed_create(c, template="server", env={"ROUND": str(i)}))
            t0 = time.perf_counter()
            sid = c.create()["id"]
            plain.append((time.perf_counter() - t0) * 1000)
            c.delete(sid)
        print("create-to-ready of a template serving HTTP (python3 http.server + HEALTHCHECK), %d rounds:"
              % (a.rounds * 3))
        print("  restored from the baked start state %s" % fmt(baked, "ms"))
        print("  started at create (create with env) %s" % fmt(started, "ms"))
        print("  the first create (starts it, then bakes) %.1f ms; a plain create of base %s" % (first, fmt(plain, "ms")))
    finally:
        d.stop()


if __name__ == "__main__":
    main()

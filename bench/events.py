#!/usr/bin/env python3
"""events.py -- how soon a state change reaches GET /v1/sandboxes/{id}/events (docs/benchmarks.md).

A real moatd; one sandbox with its event stream open; --rounds times a pause and a resume through the
API. For each: the time from sending the request to the stream's event for it (the `paused` or
`resumed` state event), against the request's own round trip (the peer: the change is recorded before
the answer, so an event can come no sooner than about that). p50/p95/p99 ms.

  MOAT_BUILD=build python3 bench/events.py [--rounds 50]
"""

import argparse
import os
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "lib"))
sys.path.insert(0, HERE)
import moatd  # noqa: E402
import sse  # noqa: E402
from bench import summary  # noqa: E402


def fmt(xs):
    s = summary(xs)
    return "%7.2f | %7.2f | %7.2f | %4d" % (s["p50"], s["p95"], s["p99"], len(xs))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=50)
    a = ap.parse_args()
    d = moatd.MoatDaemon(pool=1)
    try:
        d.start()
        c = d.client
        sid = c.create()["id"]
        stream = sse.open(c, "GET", "/v1/sandboxes/%s/events" % sid)
        arrived = {}
        cond = threading.Condition()

        def reader():
            while True:
                try:
                    ev = stream.next(timeout=600)
                except (OSError, AttributeError, ValueError):
                    return  # the stream closed under it at the end
                if ev is None:
                    return
                if ev.name == "state":
                    with cond:
                        arrived.setdefault(ev.data["event"], []).append(time.perf_counter())
                        cond.notify_all()

        t = threading.Thread(target=reader, daemon=True)
        t.start()
        lag, rtt = [], []
        for _ in range(a.rounds):
            for op, name in (("pause", "paused"), ("resume", "resumed")):
                with cond:
                    n = len(arrived.get(name, []))
                t0 = time.perf_counter()
                c.request("POST", "/v1/sandboxes/%s/%s" % (sid, op))
                rtt.append((time.perf_counter() - t0) * 1000)
                with cond:
                    cond.wait_for(lambda: len(arrived.get(name, [])) > n, timeout=10)
                    lag.append((arrived[name][n] - t0) * 1000)
        print("a state change to its event on GET /v1/sandboxes/{id}/events (pause and resume, ms):")
        print("| measure | p50 | p95 | p99 | n |")
        print("|---|---|---|---|---|")
        print("| request sent -> its state event received | %s |" % fmt(lag))
        print("| the request's round trip (peer) | %s |" % fmt(rtt))
        stream.close()
        c.delete(sid)
    finally:
        d.stop()


if __name__ == "__main__":
    main()

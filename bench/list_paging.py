#!/usr/bin/env python3
"""list_paging.py -- GET /v1/sandboxes over --sandboxes live sandboxes of one org: the whole list in one
answer against pages of 50 (the first, one deep in the list by cursor, and one under a metadata filter),
in the same run (docs/benchmarks.md).

Starts a real moatd, creates the sandboxes concurrently through the API (timed), then times the
requests over a kept-alive connection, the kinds interleaved round by round so that the host's noise
falls on all of them alike. p50/p95/p99 ms and the answer's size.

  MOAT_BUILD=build python3 bench/list_paging.py [--sandboxes 1000] [--rounds 100] [--workers 16]
"""

import argparse
import concurrent.futures
import os
import sys
import time
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "lib"))
sys.path.insert(0, HERE)
import moatd  # noqa: E402
from bench import KeepAlive, summary  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sandboxes", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--workers", type=int, default=16)
    a = ap.parse_args()
    d = moatd.MoatDaemon(pool=4)
    ids = []
    try:
        d.start()
        t0 = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(a.workers) as ex:
            futs = [ex.submit(d.client.create, metadata={"bench": "list", "par": str(i % 2)}, ttl_seconds=3600)
                    for i in range(a.sandboxes)]
            for f in futs:
                ids.append(f.result()["id"])
        made = time.monotonic() - t0
        c = KeepAlive(d.port, d.client.key)
        # the cursor of the page that starts halfway through the list
        st, body, _ = c.call("GET", "/v1/sandboxes?limit=%d" % (a.sandboxes // 2))
        mid = body["next"]
        kinds = [
            ("unpaged (every sandbox in one answer)", "/v1/sandboxes"),
            ("limit=50, first page", "/v1/sandboxes?limit=50"),
            ("limit=50, the page at the middle (cursor)", "/v1/sandboxes?limit=50&cursor=" + urllib.parse.quote(mid)),
            ("limit=50, metadata.par=1, first page", "/v1/sandboxes?limit=50&metadata.par=1"),
        ]
        times = {k: [] for k, _ in kinds}
        sizes = {}
        for _ in range(3):  # warm
            for _, path in kinds:
                c.call("GET", path)
        for r in range(a.rounds):
            for k, path in kinds[r % len(kinds):] + kinds[:r % len(kinds)]:  # each kind in each place in turn
                st, body, dt = c.call("GET", path)
                if st != 200:
                    raise RuntimeError("%s: %d %r" % (path, st, body))
                times[k].append(dt * 1000)
                sizes[k] = (len(body["sandboxes"]), body["total"])
        load = os.getloadavg()[0]
        print("%d live sandboxes in one org, created %d at a time in %.1f s (%.1f ms each); %d rounds, "
              "load average %.1f\n" % (a.sandboxes, a.workers, made, made * 1000 / a.sandboxes, a.rounds, load))
        print("| GET /v1/sandboxes (ms) | p50 | p95 | p99 | n | rows (of total) |")
        print("|---|---|---|---|---|---|")
        for k, _ in kinds:
            s = summary(times[k])
            print("| %s | %.2f | %.2f | %.2f | %d | %d (of %d) |" % (k, s["p50"], s["p95"], s["p99"], s["n"],
                                                                    sizes[k][0], sizes[k][1]))
    finally:
        t0 = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(a.workers) as ex:
            list(ex.map(lambda sid: d.client.request("DELETE", "/v1/sandboxes/" + sid, expect=(204, 404)), ids))
        sys.stderr.write("killed %d in %.1f s\n" % (len(ids), time.monotonic() - t0))
        d.stop()


if __name__ == "__main__":
    main()

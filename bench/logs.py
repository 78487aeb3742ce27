#!/usr/bin/env python3
"""logs.py -- what the sandbox output log (GET /v1/sandboxes/ID/logs) costs a command that writes fast.

Two moatds, one with the log on (the default, --log-max-mb 16) and one with it off (--log-max-mb 0),
each with one base sandbox. In each, a command writes N MiB to stdout (head -c ... /dev/zero): through
POST .../exec (the guest reads all of it, the answer keeps 16 MiB; its duration_ms is the time the process
ran) and through POST .../exec/stream with the client reading every byte (request to exit event). Runs alternate between the two daemons (drift hits both alike); the median of R runs
each is printed, with how much of the output the log kept and how much it reported dropped.

  MOAT_BUILD=build python3 bench/logs.py [--mib 100] [--runs 5]
"""

import argparse
import base64
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "lib"))
import moatd  # noqa: E402
import sse  # noqa: E402


def stream_run(c, sid, mib):
    t0 = time.monotonic()
    s = sse.open(c, "POST", "/v1/sandboxes/%s/exec/stream" % sid,
                 body={"argv": ["head", "-c", str(mib << 20), "/dev/zero"]})
    got = 0
    try:
        for ev in s:
            if ev.name == "stdout":
                d = ev.data["data"]
                got += len(base64.b64decode(d)) if ev.data.get("encoding") == "base64" else len(d.encode())
            elif ev.name == "exit":
                break
    finally:
        s.close()
    dt = time.monotonic() - t0
    if got != mib << 20:
        raise SystemExit("read %d bytes of %d" % (got, mib << 20))
    return dt


def exec_run(c, sid, mib):
    """POST .../exec: the answer keeps 16 MiB of stdout; the guest reads (and logs) all of it."""
    r = c.request("POST", "/v1/sandboxes/%s/exec" % sid, timeout=600,
                  body={"argv": ["head", "-c", str(mib << 20), "/dev/zero"]})[1]
    if r["exit_code"] != 0:
        raise SystemExit("exec failed: %r" % (r,))
    return r["duration_ms"] / 1000.0


def log_bytes(c, sid):
    es = c.request("GET", "/v1/sandboxes/%s/logs" % sid, headers={"Accept": "application/json"})[1]["entries"]
    kept = sum(len(base64.b64decode(e["data"])) if e["encoding"] == "base64" else len(e["data"].encode())
               for e in es if e["type"] == "output")
    dropped = sum(e["bytes"] for e in es if e["type"] == "dropped")
    return kept, dropped


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=100)
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    ds = {"log on": moatd.MoatDaemon(pool=1), "log off": moatd.MoatDaemon(pool=1, extra_args=["--log-max-mb", "0"])}
    try:
        sids = {}
        for k, d in ds.items():
            d.start()
            sids[k] = d.client.create(template="base")["id"]
            stream_run(d.client, sids[k], 8)  # warm-up
        print("| a process writing %d MiB to stdout | median s | MiB/s | runs (s) |" % a.mib)
        print("|---|---|---|---|")
        for what, fn in (("exec (duration_ms)", exec_run), ("exec/stream, client reads all", stream_run)):
            times = {k: [] for k in ds}
            for _ in range(a.runs):
                for k, d in ds.items():
                    times[k].append(fn(d.client, sids[k], a.mib))
            for k in ds:
                m = statistics.median(times[k])
                print("| %s, %s | %.3f | %.0f | %s |" % (what, k, m, a.mib / m, " ".join("%.3f" % t for t in times[k])))
        time.sleep(1.5)  # the logger takes what is left of the last run
        kept, dropped = log_bytes(ds["log on"].client, sids["log on"])
        print("\nlog on: the log holds %.1f MiB of output (bound 16 MiB), reports %.1f MiB dropped over %d MiB written"
              % (kept / 1048576.0, dropped / 1048576.0, (2 * a.runs * a.mib + 8)))
    finally:
        for d in ds.values():
            d.stop()


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""tenancy.py -- what recording costs on create and exec: moatd as shipped (audit and metering on)
against the same binary with them off (docs/benchmarks.md), with them off: --audit off --sample-interval-ms 0.

Two real moatds side by side, one per variant, each with a warm pool; --rounds times, alternating
between them so that drift in the machine's load falls on both: create a sandbox (POST
/v1/sandboxes, answered from the pool), exec `true` in it (POST .../exec), kill it. Client-side
round trips over a kept-alive connection, p50/p95/p99 ms, and each variant's p50 as a ratio of the
"off" one (the target: within 5 %).

  MOAT_BUILD=build python3 bench/tenancy.py [--rounds 300]
"""

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "lib"))
sys.path.insert(0, HERE)
import moatd  # noqa: E402
from bench import KeepAlive, summary  # noqa: E402


# What turns recording off: the audit log, and the metering sampler (its period 0).
OFF_FLAGS = ("--audit", "off", "--sample-interval-ms", "0")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=300)
    a = ap.parse_args()
    variants = [("on (as shipped)", ()), ("off (%s)" % " ".join(OFF_FLAGS), OFF_FLAGS)]
    daemons, conns, times = [], [], []
    try:
        for _, flags in variants:
            d = moatd.MoatDaemon(pool=4, extra_args=flags)
            d.start()
            daemons.append(d)
            conns.append(KeepAlive(d.port, d.client.key))
            times.append({"create": [], "exec": [], "kill": []})
        for r in range(a.rounds + 10):
            for i, k in enumerate(conns):
                st, sb, dc = k.call("POST", "/v1/sandboxes", {})
                assert st == 201, (st, sb)
                st, ex, de = k.call("POST", "/v1/sandboxes/%s/exec" % sb["id"], {"cmd": "true"})
                assert st == 200 and ex["exit_code"] == 0, (st, ex)
                st, _, dk = k.call("DELETE", "/v1/sandboxes/" + sb["id"])
                assert st == 204, st
                if r >= 10:  # the first rounds warm both up
                    times[i]["create"].append(dc * 1000)
                    times[i]["exec"].append(de * 1000)
                    times[i]["kill"].append(dk * 1000)
            # let the pools refill at the same pace for both
            time.sleep(0.01)
        print("create, exec `true` and kill through the API, audit and metering on vs off (ms, %d rounds):" % a.rounds)
        print("| call | variant | p50 | p95 | p99 | p50 vs off |")
        print("|---|---|---|---|---|---|")
        for call in ("create", "exec", "kill"):
            base = summary(times[1][call])["p50"]
            for (name, _), t in zip(variants, times):
                s = summary(t[call])
                print("| %s | %s | %.3f | %.3f | %.3f | %.2fx |" % (call, name, s["p50"], s["p95"], s["p99"],
                                                                  s["p50"] / base if base else 0))
    finally:
        for d in daemons:
            d.stop()


if __name__ == "__main__":
    main()

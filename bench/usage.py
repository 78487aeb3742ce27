#!/usr/bin/env python3
"""usage.py -- GET /v1/usage over 1,000 sandboxes x 24 h of 10 s samples, and what metering costs a
create + exec + kill (docs/benchmarks.md).

Part 1 seeds the store of a real moatd: it starts moatd once (which makes the schema and the org's
key), stops it, writes --sandboxes x 24 h of 10 s samples (8,640 per sandbox) and their hourly totals
straight into DATA/moat.db with SQLite (the rows moatd's sampler writes, src/store/sqlite_meter.c),
starts moatd on that data dir again and times the real route over a kept-alive connection:
group_by sandbox, org and metadata.team, over the last 24 h and over a range whose ends fall inside
hours (the part that reads raw samples). p50/p95/p99 ms.

Part 2 times --rounds of create + exec `true` + kill with the sampler on (the default 10 s, and
every 100 ms) and off (hidden flag --sample-interval-ms 0).

  MOAT_BUILD=build python3 bench/usage.py [--sandboxes 1000] [--rounds 30] [--queries 50]
"""

import argparse
import os
import sqlite3
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "lib"))
sys.path.insert(0, HERE)
import moatd  # noqa: E402
from bench import KeepAlive, summary  # noqa: E402

ORG = "bench-usage"
HOUR = 3600000


def fmt(xs):
    s = summary(xs)
    return "%7.2f | %7.2f | %7.2f | %4d" % (s["p50"], s["p95"], s["p99"], len(xs))


def seed(db_path, n, now_ms):
    t0 = now_ms - 24 * HOUR
    db = sqlite3.connect(db_path, timeout=60)
    db.execute("PRAGMA synchronous=OFF")
    t = time.perf_counter()
    db.execute(
        "WITH RECURSIVE s(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM s WHERE i < ?1 - 1), "
        "k(j) AS (SELECT 0 UNION ALL SELECT j + 1 FROM k WHERE j < 8639) "
        "INSERT INTO meter_samples SELECT printf('sb-bench%09d', i), ?2 + j * 10000, ?3, 0, (j + 1) * 100000000, "
        "(j + 1) * 100000000, (j + 1) * 5.0, (j + 1) * 10000, 10.0, 1, 536870912, 1073741824, 1000, 2000, "
        "NULL, NULL FROM s, k", (n, t0, ORG))
    db.execute("INSERT INTO meter_hourly SELECT sandbox_id, at_ms - at_ms % 3600000, org, max(cpu_ns), "
               "max(mem_gib_s), max(alive_ms) FROM meter_samples WHERE org = ?1 "
               "GROUP BY sandbox_id, at_ms - at_ms % 3600000", (ORG,))
    # the sandboxes' rows, for group_by metadata.team (ten teams)
    db.execute(
        "WITH RECURSIVE s(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM s WHERE i < ?1 - 1) "
        "INSERT INTO sandboxes (id, org, template, state, created_at_ms, ttl_seconds, metadata, cpu, memory_mb, "
        "pids, disk_mb, killed_reason, killed_at_ms, updated_at_ms) SELECT printf('sb-bench%09d', i), ?2, 'base', "
        "'killed', ?3, 3600, json_object('team', 'team-' || (i % 10)), 1, 1024, 256, 1024, 'bench', ?4, ?4 FROM s",
        (n, ORG, t0, now_ms))
    db.commit()
    rows = db.execute("SELECT count(*) FROM meter_samples").fetchone()[0]
    hours = db.execute("SELECT count(*) FROM meter_hourly").fetchone()[0]
    db.close()
    return rows, hours, time.perf_counter() - t


def query_bench(a):
    d = moatd.MoatDaemon(pool=0)
    try:
        d.start()
        key = d.new_org_key(ORG)
        d.stop(keep_data=True)
        now = int(time.time() * 1000)
        rows, hours, secs = seed(os.path.join(d.data_dir, "moat.db"), a.sandboxes, now)
        size = os.path.getsize(os.path.join(d.data_dir, "moat.db"))
        print("seeded %d samples and %d hourly rows for %d sandboxes in %.1f s (moat.db %.0f MiB)\n" % (
            rows, hours, a.sandboxes, secs, size / 2**20))
        d.start()
        c = KeepAlive(d.port, key)
        now = int(time.time() * 1000)
        mid = now - 24 * HOUR + 1234567  # both ends inside an hour
        cases = [("group_by=sandbox, last 24 h", "group_by=sandbox"),
                 ("group_by=org, last 24 h", "group_by=org"),
                 ("group_by=metadata.team, last 24 h", "group_by=metadata.team"),
                 ("group_by=sandbox, from/to inside hours (23 h)", "group_by=sandbox&from=%d&to=%d" % (mid, now - 1800000)),
                 # the dashboard's chart: a series per group
                 ("group_by=metadata.team, last 24 h, bucket=3600", "group_by=metadata.team&bucket=3600"),
                 ("group_by=metadata.team, last 1 h, bucket=300", "group_by=metadata.team&bucket=300&from=%d" % (now - HOUR)),
                 ("group_by=sandbox, last 24 h, bucket=3600", "group_by=sandbox&bucket=3600")]
        print("GET /v1/usage, %d sandboxes x 24 h of 10 s samples (ms):" % a.sandboxes)
        print("| query | p50 | p95 | p99 | n |")
        print("|---|---|---|---|---|")
        for name, q in cases:
            xs = []
            st, body, _ = c.call("GET", "/v1/usage?" + q)
            assert st == 200, (st, body)
            for _ in range(a.queries):
                t = time.perf_counter()
                st, body, _ = c.call("GET", "/v1/usage?" + q)
                xs.append((time.perf_counter() - t) * 1000)
                assert st == 200, (st, body)
            print("| %s (%d rows) | %s |" % (name, len(body), fmt(xs)))
        print()
    finally:
        d.stop()


def lifecycle_bench(a):
    print("create + exec `true` + kill with the sampler on and off (ms):")
    print("| moatd | p50 | p95 | p99 | n |")
    print("|---|---|---|---|---|")
    for name, args in (("metering off (--sample-interval-ms 0)", ["--sample-interval-ms", "0"]),
                       ("metering on, every 10 s (default)", []),
                       ("metering on, every 100 ms", ["--sample-interval-ms", "100"])):
        d = moatd.MoatDaemon(pool=2, extra_args=args)
        try:
            d.start()
            c = KeepAlive(d.port, d.client.key)
            # idle sandboxes for the sampler to read meanwhile
            idle = [d.client.create()["id"] for _ in range(5)]
            xs = []
            for i in range(a.rounds + 3):
                t = time.perf_counter()
                st, sb, _ = c.call("POST", "/v1/sandboxes", {"template": "base"})
                assert st == 201, (st, sb)
                st, r, _ = c.call("POST", "/v1/sandboxes/%s/exec" % sb["id"], {"argv": ["true"]})
                assert st == 200, (st, r)
                st, _, _ = c.call("DELETE", "/v1/sandboxes/" + sb["id"])
                assert st == 204, st
                if i >= 3:
                    xs.append((time.perf_counter() - t) * 1000)
            for sid in idle:
                d.client.delete(sid)
            print("| %s | %s |" % (name, fmt(xs)))
        finally:
            d.stop()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sandboxes", type=int, default=1000)
    ap.add_argument("--queries", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--skip-lifecycle", action="store_true")
    a = ap.parse_args()
    query_bench(a)
    if not a.skip_lifecycle:
        lifecycle_bench(a)


if __name__ == "__main__":
    main()

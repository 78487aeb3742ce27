#!/usr/bin/env python3
"""pg_proxy.py -- what the database proxy (api/pg, moatd --db-listen) costs a PostgreSQL client.

A real PostgreSQL 15 (tests/lib/pgtest.py: scram-sha-256, fsync off) and the proxy in
tests/lib/pg_harness routing "alice" to it. Two measures, each through the proxy and direct to the
server, interleaved in blocks of 20 so that drift hits both alike:
  connect+select  a new libpq connection (SCRAM included), SELECT 1, close: p50/p95/p99 ms;
  select          SELECT 1 on one open connection: p50/p95/p99 ms.
Then pgbench (-S select-only and the default TPC-B-like, -c 8 -j 2, --time each) through vs direct.
Needs root (PostgreSQL runs as the postgres user).

  MOAT_BUILD=build python3 bench/pg_proxy.py [--connects 400] [--selects 4000] [--time 10]
"""

import argparse
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "lib"))
import pgtest  # noqa: E402

PGBENCH = os.path.join(pgtest.PG_BIN, "pgbench")


def pct(xs, p):
    s = sorted(xs)
    k = max(0, min(len(s) - 1, int(round(p / 100.0 * len(s) + 0.5)) - 1))
    return s[k]


def row(name, xs, base=None):
    p50 = pct(xs, 50)
    ratio = "%.2fx" % (p50 / pct(base, 50)) if base else "peer"
    return "| %-22s | %7.3f | %7.3f | %7.3f | %5d | %7s |" % (name, p50, pct(xs, 95), pct(xs, 99), len(xs), ratio)


def pgbench(port, args, secs, pw):
    r = subprocess.run([PGBENCH, "-h", "127.0.0.1", "-p", str(port), "-U", "alice", "-n", "-c", "8", "-j", "2",
                        "-T", str(secs)] + args + ["alice"],
                       env=dict(os.environ, PGPASSWORD=pw, PGSSLMODE="disable"), capture_output=True, timeout=secs + 120)
    m = re.search(rb"tps = ([0-9.]+) \(without initial connection time\)", r.stdout)
    if not m:
        raise RuntimeError("pgbench: %s %s" % (r.stdout[-500:], r.stderr[-500:]))
    return float(m.group(1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--connects", type=int, default=400)
    ap.add_argument("--selects", type=int, default=4000)
    ap.add_argument("--time", type=int, default=10)
    a = ap.parse_args()
    why = pgtest.available()
    if why:
        print("pg_proxy: skipped: %s" % why)
        return 0
    pg = pgtest.PostgresServer(max_connections=100).start()
    proxy = pgtest.ProxyHarness(pg.port, "alice").start()
    try:
        pq = pgtest.Libpq()
        dsn = "host=127.0.0.1 port=%d user=alice dbname=alice password=alice-secret sslmode=disable"
        ports = {"direct": pg.port, "proxy": proxy.port}
        conn_ms = {"direct": [], "proxy": []}
        sel_ms = {"direct": [], "proxy": []}
        open_c = {k: pq.connect(dsn % p) for k, p in ports.items()}
        for _ in range(max(1, a.connects // 20)):
            for k, p in ports.items():
                for _ in range(20):
                    t0 = time.perf_counter()
                    c = pq.connect(dsn % p)
                    c.query("select 1")
                    c.close()
                    conn_ms[k].append((time.perf_counter() - t0) * 1000)
        for _ in range(max(1, a.selects // 20)):
            for k in ports:
                c = open_c[k]
                for _ in range(20):
                    t0 = time.perf_counter()
                    c.query("select 1")
                    sel_ms[k].append((time.perf_counter() - t0) * 1000)
        for c in open_c.values():
            c.close()
        print("| %-22s | %7s | %7s | %7s | %5s | %7s |" % ("pg proxy (ms)", "p50", "p95", "p99", "n", "vs peer"))
        print("|%s|" % "|".join("-" * w for w in (24, 9, 9, 9, 7, 9)))
        print(row("connect+select direct", conn_ms["direct"]))
        print(row("connect+select proxy", conn_ms["proxy"], conn_ms["direct"]))
        print(row("select direct", sel_ms["direct"]))
        print(row("select proxy", sel_ms["proxy"], sel_ms["direct"]))
        if os.access(PGBENCH, os.X_OK):
            r = subprocess.run([PGBENCH, "-h", "127.0.0.1", "-p", str(pg.port), "-U", "alice", "-i", "-s", "4",
                                "-q", "alice"], env=dict(os.environ, PGPASSWORD="alice-secret"), capture_output=True,
                               timeout=600)
            if r.returncode != 0:
                raise RuntimeError("pgbench -i: %s" % r.stderr[-500:])
            print()
            print("| %-30s | %9s | %9s | %6s |" % ("pgbench -c 8 -j 2 (tps)", "direct", "proxy", "ratio"))
            print("|%s|" % "|".join("-" * w for w in (32, 11, 11, 8)))
            for name, args in (("select-only (-S)", ["-S"]), ("tpcb-like (default)", [])):
                d = pgbench(pg.port, args, a.time, "alice-secret")
                x = pgbench(proxy.port, args, a.time, "alice-secret")
                d2 = pgbench(pg.port, args, a.time, "alice-secret")
                d = (d + d2) / 2  # direct before and after, against drift
                print("| %-30s | %9.0f | %9.0f | %5.2fx |" % (name, d, x, x / d))
        else:
            print("pgbench: not found at %s" % PGBENCH)
    finally:
        proxy.stop()
        pg.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

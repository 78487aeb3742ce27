#!/usr/bin/env python3
"""databases.py -- what moat's databases (POST /v1/databases) cost a client (docs/benchmarks.md).

A real moatd and its PostgreSQL proxy; the client is the machine's libpq (tests/lib/pgtest.py,
ctypes), as psycopg would be.
(a) connect+SELECT 1 through the proxy to a database that is awake (the floor), woken from idle
    hibernation (idle_seconds=1, waited until the database shows "hibernated"), and restarted cold
    (its server killed in its sandbox: the next connection starts PostgreSQL again, as a platform
    without hibernation would): p50/p95/p99 ms, --rounds each;
(b) branch (POST /v1/databases/{id}/branch, until it answers 201 with the branch accepting
    connections) of a database holding --mb MiB of rows, against the host's `cp --sparse=always` of
    the source's volume image (the copy alone), --branches rounds; the branches are deleted;
(c) pgbench TPS (-S select-only, -c 4 -j 2, --time s) through moatd's proxy to the database.

  MOAT_BUILD=build python3 bench/databases.py [--rounds 20] [--branches 5] [--mb 100] [--time 10]
"""

import argparse
import glob
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "lib"))
sys.path.insert(0, HERE)
import moatd  # noqa: E402
import pgtest  # noqa: E402
from bench import summary  # noqa: E402

PGBENCH = os.path.join(pgtest.PG_BIN, "pgbench")


def fmt(xs):
    s = summary(xs)
    return "%8.1f | %8.1f | %8.1f | %3d" % (s["p50"], s["p95"], s["p99"], len(xs))


def conninfo(d):
    c = d["connection"]
    return "host=%s port=%d user=%s password=%s dbname=%s sslmode=disable connect_timeout=60" % (
        c["host"], c["port"], c["user"], c["password"], c["database"])


def connect_select(pq, d):
    t0 = time.perf_counter()
    conn = pgtest.PGConn(pq, conninfo(d))
    try:
        assert conn.query("SELECT 1") == [["1"]]
    finally:
        conn.close()
    return (time.perf_counter() - t0) * 1000


def state(c, d):
    return c.request("GET", "/v1/databases/" + d["id"])[1]["state"]


def wait_state(c, d, want, timeout=120):
    deadline = time.time() + timeout
    while state(c, d) != want:
        if time.time() > deadline:
            raise RuntimeError("database %s not %s" % (d["id"], want))
        time.sleep(0.1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--branches", type=int, default=5)
    ap.add_argument("--mb", type=int, default=100)
    ap.add_argument("--time", type=int, default=10)
    a = ap.parse_args()
    pq = pgtest.Libpq()
    daemon = moatd.MoatDaemon(pool=0)
    try:
        daemon.start()
        c = daemon.client
        _, d = c.request("POST", "/v1/databases", body={"name": "bench", "size_mb": max(512, a.mb * 4),
                                                       "idle_seconds": 1}, expect=201, timeout=900)
        awake, woken, cold = [], [], []
        for _ in range(a.rounds):
            wait_state(c, d, "hibernated")
            woken.append(connect_select(pq, d))
            # awake: right after a connection, before the idle second is over
            awake.append(connect_select(pq, d))
            sid = c.request("GET", "/v1/databases/" + d["id"])[1]["sandbox_id"]
            r = c.exec(sid, argv=["sh", "-c", "pkill -KILL -x postgres; while pgrep -x postgres >/dev/null; "
                                  "do sleep 0.01; done"], timeout=60)
            assert r["exit_code"] == 0, r
            cold.append(connect_select(pq, d))
        print("connect + SELECT 1 through moatd's proxy (libpq, SCRAM), ms:")
        print("| case | p50 | p95 | p99 | n |")
        print("|---|---|---|---|---|")
        print("| awake (the floor) | %s |" % fmt(awake))
        print("| woken from idle hibernation | %s |" % fmt(woken))
        print("| server restarted cold (peer) | %s |" % fmt(cold))
        print("woken / cold p50: %.2fx; woken / awake p50: %.1fx" % (
            summary(woken)["p50"] / summary(cold)["p50"], summary(woken)["p50"] / summary(awake)["p50"]))

        # (b) branch time of a database holding a.mb MiB (one that stays awake)
        c.request("DELETE", "/v1/databases/" + d["id"], expect=204, timeout=300)
        vol_dir = os.path.join(daemon.data_dir, "host", "volumes")
        before = set(glob.glob(os.path.join(vol_dir, "v-*.img")))
        _, d = c.request("POST", "/v1/databases", body={"name": "bench-branch", "size_mb": max(512, a.mb * 4),
                                                       "idle_seconds": 3600}, expect=201, timeout=900)
        made = sorted(set(glob.glob(os.path.join(vol_dir, "v-*.img"))) - before)
        img = made[0] if len(made) == 1 else None
        conn = pgtest.PGConn(pq, conninfo(d))
        try:
            conn.query("CREATE TABLE fill (id int, pad text)")
            rows = a.mb * 1024 * 1024 // 1100
            for off in range(0, rows, 20000):
                conn.query("INSERT INTO fill SELECT g, repeat(md5(g::text), 31) FROM generate_series(%d, %d) g" % (
                    off, min(rows, off + 20000) - 1))
            size = int(conn.query("SELECT pg_database_size(current_database())")[0][0])
        finally:
            conn.close()
        br, cp = [], []
        for i in range(a.branches):
            t0 = time.perf_counter()
            _, b = c.request("POST", "/v1/databases/%s/branch" % d["id"], body={"name": "bench-br-%d" % i},
                             expect=201, timeout=900)
            connect_select(pq, b)
            br.append((time.perf_counter() - t0) * 1000)
            c.request("DELETE", "/v1/databases/" + b["id"], expect=204, timeout=300)
            if img:
                with tempfile.TemporaryDirectory(dir=os.path.dirname(img)) as tmp:
                    t0 = time.perf_counter()
                    subprocess.run(["cp", "--sparse=always", img, os.path.join(tmp, "copy.img")], check=True)
                    subprocess.run(["sync", "-f", tmp], check=True)
                    cp.append((time.perf_counter() - t0) * 1000)
        print()
        print("branch of a database of %.0f MiB (pg_database_size), ms:" % (size / 2 ** 20))
        print("| case | p50 | p95 | p99 | n |")
        print("|---|---|---|---|---|")
        print("| POST .../branch until the branch answers | %s |" % fmt(br))
        if cp:
            print("| cp --sparse=always of its volume image + sync (peer) | %s |" % fmt(cp))
            print("branch / copy p50: %.2fx" % (summary(br)["p50"] / summary(cp)["p50"]))

        # (c) pgbench through the proxy
        conn_ = d["connection"]
        env = dict(os.environ, PGPASSWORD=conn_["password"], PGSSLMODE="disable")
        base = [PGBENCH, "-h", conn_["host"], "-p", str(conn_["port"]), "-U", conn_["user"]]
        subprocess.run(base + ["-i", "-s", "4", "-q", conn_["database"]], env=env, check=True, capture_output=True)
        r = subprocess.run(base + ["-n", "-S", "-c", "4", "-j", "2", "-T", str(a.time), conn_["database"]], env=env,
                           capture_output=True, timeout=a.time + 120)
        m = re.search(rb"tps = ([0-9.]+) \(without initial connection time\)", r.stdout)
        print()
        print("pgbench -S -c 4 -j 2 -T %d through moatd's proxy: %s tps" % (a.time, m.group(1).decode() if m else "?"))
        c.request("DELETE", "/v1/databases/" + d["id"], expect=204, timeout=300)
    finally:
        daemon.stop()


if __name__ == "__main__":
    main()

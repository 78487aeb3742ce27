#!/usr/bin/env python3
"""volumes.py -- what a volume costs against the sandbox's own disk (docs/benchmarks.md).

  MOAT_BUILD=build python3 bench/volumes.py [--mb 128] [--rounds 7]

(a) inside one sandbox with a volume at /data: dd of --mb MiB with O_DIRECT (no page cache: the
    loop device's speed, not memory's), written then read, to the volume and to the sandbox's own
    disk (/root, the overlay's upper layer on its own loop-mounted image), in MiB/s;
(b) the volume's files API with no sandbox (PUT then GET of --mb MiB) against the sandbox files API
    (PUT/GET through the guest) of the same bytes, in MiB/s;
(c) a create with one volume attached against one without (server-side ready_us, ms).
Each figure is p50 / p95 / p99 over --rounds rounds.
"""

import argparse
import http.client
import os
import re
import sys
import time
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "lib"))
sys.path.insert(0, HERE)
import moatd  # noqa: E402
from bench import summary  # noqa: E402


def fmt(xs, unit):
    s = summary(xs)
    return "p50 %.1f / p95 %.1f / p99 %.1f %s" % (s["p50"], s["p95"], s["p99"], unit)


def dd_rate(c, sid, cmd):
    r = c.exec(sid, cmd=cmd + " 2>&1")
    m = re.search(r"copied, ([0-9.]+) s", r["stdout"])
    assert r["exit_code"] == 0 and m, r
    return float(m.group(1))


def transfer(port, key, method, path, query, body=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    h = {"Authorization": "Bearer " + key}
    if body is not None:
        h["Content-Type"] = "application/octet-stream"
    t0 = time.perf_counter()
    conn.request(method, path + "?" + urllib.parse.urlencode(query), body=body, headers=h)
    r = conn.getresponse()
    data = r.read()
    dt = time.perf_counter() - t0
    conn.close()
    assert 200 <= r.status < 300, (r.status, data[:200])
    return dt, data


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    d = moatd.MoatDaemon(pool=0)
    try:
        d.start()
        c = d.client
        c.request("POST", "/v1/volumes", body={"name": "bench", "size_mb": a.mb * 2 + 64}, expect=201)
        sid = c.create(volumes=[{"name": "bench", "path": "/data"}], disk_mb=a.mb * 2 + 64)["id"]
        rates = {k: [] for k in ("vol_w", "vol_r", "disk_w", "disk_r")}
        for _ in range(a.rounds):
            for where, key in (("/data", "vol"), ("/root", "disk")):
                f = where + "/bench.bin"
                w = dd_rate(c, sid, "dd if=/dev/zero of=%s bs=1M count=%d oflag=direct conv=fsync" % (f, a.mb))
                r = dd_rate(c, sid, "dd if=%s of=/dev/null bs=1M iflag=direct" % f)
                rates[key + "_w"].append(a.mb / w)
                rates[key + "_r"].append(a.mb / r)
                c.sh(sid, "rm -f " + f)
        print("volume vs sandbox disk, dd %d MiB O_DIRECT, %d rounds (MiB/s):" % (a.mb, a.rounds))
        print("  write: volume %s; sandbox disk %s" % (fmt(rates["vol_w"], "MiB/s"), fmt(rates["disk_w"], "MiB/s")))
        print("  read:  volume %s; sandbox disk %s" % (fmt(rates["vol_r"], "MiB/s"), fmt(rates["disk_r"], "MiB/s")))

        blob = os.urandom(a.mb << 20)
        api = {k: [] for k in ("vol_put", "vol_get", "sb_put", "sb_get")}
        for _ in range(a.rounds):
            dt, _ = transfer(d.port, c.key, "PUT", "/v1/volumes/bench/files", {"path": "/api.bin"}, blob)
            api["vol_put"].append(a.mb / dt)
            dt, data = transfer(d.port, c.key, "GET", "/v1/volumes/bench/files", {"path": "/api.bin"})
            assert len(data) == len(blob)
            api["vol_get"].append(a.mb / dt)
            dt, _ = transfer(d.port, c.key, "PUT", "/v1/sandboxes/%s/files" % sid, {"path": "/root/api.bin"}, blob)
            api["sb_put"].append(a.mb / dt)
            dt, data = transfer(d.port, c.key, "GET", "/v1/sandboxes/%s/files" % sid, {"path": "/root/api.bin"})
            assert len(data) == len(blob)
            api["sb_get"].append(a.mb / dt)
        print("files API, %d MiB, %d rounds (MiB/s):" % (a.mb, a.rounds))
        print("  PUT: volume (no sandbox) %s; sandbox (guest) %s" % (fmt(api["vol_put"], "MiB/s"),
                                                                      fmt(api["sb_put"], "MiB/s")))
        print("  GET: volume (no sandbox) %s; sandbox (guest) %s" % (fmt(api["vol_get"], "MiB/s"),
                                                                      fmt(api["sb_get"], "MiB/s")))
        c.delete(sid)

        with_v, without = [], []
        for _ in range(a.rounds * 3):
            sb = c.create(volumes=[{"name": "bench", "path": "/data", "read_only": True}])
            with_v.append(sb["ready_us"] / 1000.0)
            c.delete(sb["id"])
            sb = c.create()
            without.append(sb["ready_us"] / 1000.0)
            c.delete(sb["id"])
        print("create (cold, server-side ready): with a volume %s; without %s" % (fmt(with_v, "ms"),
                                                                                 fmt(without, "ms")))
    finally:
        d.stop()


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""own_computer.py -- what a sandbox's own view of its computer costs (docs/benchmarks.md).

  MOAT_BUILD=build python3 bench/own_computer.py [--creates 60] [--execs 300] [--reads 20000]

(a) a cold create (no warm pool: the shell is built on the request path, cgroup view and
    cpu/online bind included), server-side ready_us and client-side latency;
(b) exec `true` (an OOM-kill count is read before and after each command);
(c) reading /sys/devices/system/cpu/online and the memory limit inside a sandbox (bind mounts of
    the host's file and cgroup dirs) against the host's own read of the same sysfs file (the peer);
(d) with lxcfs installed: a private `lxcfs -l` and a moatd --lxcfs on it: cold create, and a read of
    /proc/meminfo inside (answered by lxcfs) against the host's own read of /proc/meminfo (the peer).
Run it against two builds (main's and this one) to see what changed.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "lib"))
sys.path.insert(0, HERE)
import moatd  # noqa: E402
from bench import KeepAlive, summary  # noqa: E402

READ_LOOP = """
import sys, time
p, n = sys.argv[1], int(sys.argv[2])
t = []
for _ in range(n):
    t0 = time.perf_counter_ns()
    with open(p, "rb", buffering=0) as f:
        f.read()
    t.append(time.perf_counter_ns() - t0)
t.sort()
print(" ".join(str(t[int(len(t) * q) - 1] / 1000) for q in (0.5, 0.95, 0.99)))
"""


def fmt(s):
    return "p50 %.3f / p95 %.3f / p99 %.3f" % (s["p50"], s["p95"], s["p99"])


def creates(ka, n):
    server, client = [], []
    for _ in range(n):
        st, sb, dt = ka.call("POST", "/v1/sandboxes", {"cpu": 1, "memory_mb": 512})
        assert st == 201, (st, sb)
        client.append(dt * 1000)
        server.append(sb["ready_us"] / 1000.0)
        ka.call("DELETE", "/v1/sandboxes/" + sb["id"])
        time.sleep(0.02)
    return "server %s; client %s" % (fmt(summary(server)), fmt(summary(client)))


def read_inside(d, sid, p, n):
    r = d.client.exec(sid, argv=["python3", "/root/readloop.py", p, str(n)], timeout=300)
    return r["stdout"].strip().replace(" ", " / ") if r["exit_code"] == 0 else r["stderr"].strip()


def read_host(p, n):
    out = subprocess.run([sys.executable, "-c", READ_LOOP, p, str(n)], capture_output=True, text=True, check=True)
    return out.stdout.strip().replace(" ", " / ")


def bench_lxcfs(a):
    if not shutil.which("lxcfs") or not os.path.exists("/dev/fuse"):
        print("(d) skipped: no lxcfs or /dev/fuse")
        return
    lx = tempfile.mkdtemp(prefix="moat-bench-lxcfs-")
    p = subprocess.Popen(["lxcfs", "-f", "-l", "-p", lx + ".pid", lx], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 20
        while not os.path.exists(os.path.join(lx, "proc", "meminfo")) and time.time() < deadline:
            time.sleep(0.05)
        d = moatd.MoatDaemon(pool=0, extra_args=("--lxcfs", lx))
        d.start()
        try:
            ka = KeepAlive(d.port, d.client.key)
            print("(d) cold create with --lxcfs, ms: %s" % creates(ka, a.creates))
            sid = d.client.create(cpu=1, memory_mb=512)["id"]
            d.client.put_file(sid, "/root/readloop.py", READ_LOOP.encode())
            print("(d) read /proc/meminfo inside (lxcfs), us: p50/p95/p99 %s" % read_inside(d, sid, "/proc/meminfo",
                                                                                            a.reads // 4))
            print("(d) peer: the host reads /proc/meminfo, us: p50/p95/p99 %s" % read_host("/proc/meminfo", a.reads))
        finally:
            d.stop()
    finally:
        p.terminate()
        p.wait(10)
        if os.path.ismount(lx):
            subprocess.run(["umount", "-l", lx], stderr=subprocess.DEVNULL)
        try:
            os.rmdir(lx)
            os.unlink(lx + ".pid")
        except OSError:
            pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--creates", type=int, default=60)
    ap.add_argument("--execs", type=int, default=300)
    ap.add_argument("--reads", type=int, default=20000)
    a = ap.parse_args()
    d = moatd.MoatDaemon(pool=0)
    d.start()
    try:
        ka = KeepAlive(d.port, d.client.key)
        print("(a) cold create, ms: %s" % creates(ka, a.creates))
        st, sb, _ = ka.call("POST", "/v1/sandboxes", {"cpu": 1, "memory_mb": 512})
        sid = sb["id"]
        for _ in range(10):
            ka.call("POST", "/v1/sandboxes/%s/exec" % sid, {"argv": ["true"]})
        ex = []
        for _ in range(a.execs):
            st, r, dt = ka.call("POST", "/v1/sandboxes/%s/exec" % sid, {"argv": ["true"]})
            assert st == 200 and r["exit_code"] == 0, r
            ex.append(dt * 1000)
        print("(b) exec true, ms: %s" % fmt(summary(ex)))
        d.client.put_file(sid, "/root/readloop.py", READ_LOOP.encode())
        paths = ["/sys/devices/system/cpu/online", "/sys/fs/cgroup/memory/memory.limit_in_bytes"
                 if os.path.isdir("/sys/fs/cgroup/memory") else "/sys/fs/cgroup/memory.max"]
        for p in paths:
            print("(c) read %s inside, us: p50/p95/p99 %s" % (p, read_inside(d, sid, p, a.reads)))
        print("(c) peer: the host reads %s, us: p50/p95/p99 %s" % (paths[0], read_host(paths[0], a.reads)))
        ka.call("DELETE", "/v1/sandboxes/" + sid)
    finally:
        d.stop()
    bench_lxcfs(a)


if __name__ == "__main__":
    main()

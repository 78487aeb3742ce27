#!/usr/bin/env python3
"""timetravel.py -- issue 4's benchmark: pause/resume, snapshot, fork, hibernate/wake, side by side
with the plain CRIU CLI, for an idle shell sandbox and a 64 MiB one.

  MOAT_BUILD=build python3 bench/timetravel.py [--pauses 200] [--ckpts 5] [--out FILE]

(i)   pause and resume: round trip of POST .../pause and .../resume over a kept-alive connection
      (moatd freezes the sandbox's v2 cgroup and waits for "frozen 1", records the state in SQLite);
      peer: the kernel floor, writing cgroup.freeze of a plain cgroup holding a sleep and polling
      cgroup.events until it settles.
(ii)  when /healthz says checkpoints are available: snapshot (POST .../snapshots), fork of 1 child
      (time to the first child ready) and of 8 children (all ready), hibernate and wake (explicit),
      for an idle shell and a sandbox with a Python process holding 64 MiB; memory used by 8 forks
      (sum of their memory cgroups) against 8x the parent's;
      peer: the plain criu CLI (the binary moatd uses) dumping with --leave-running and restoring
      (-d) the same Python holder in its own pid+uts+ipc namespaces on the host (no user, mount or
      net namespace and no overlay: less than a sandbox carries).
Prints p50/p95/p99 in milliseconds; --out writes the same as Markdown.
"""

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "lib"))
sys.path.insert(0, HERE)
import moatd  # noqa: E402
from bench import KeepAlive, summary  # noqa: E402

CRIU = os.environ.get("MOAT_CRIU", "/var/lib/moat/criu/criu")

HOLDER = r"""
import os, sys, time
os.closerange(0, 4096)  # CRIU cannot dump fds inherited from outside (the peer's case)
blob = bytearray(int(sys.argv[1]) * 1048576)
for i in range(0, len(blob), 4096):
    blob[i] = 1
n = 0
while True:
    n += 1
    time.sleep(0.05)
"""

lines = []


def out(s=""):
    print(s, flush=True)
    lines.append(s)


def row(name, xs, note=""):
    s = summary(xs)
    out("| %-44s | %4d | %9.3f | %9.3f | %9.3f | %s |" % (name, s["n"], s["p50"], s["p95"], s["p99"], note))
    return s


def header(title):
    out()
    out("### " + title)
    out()
    out("| %-44s | %4s | %9s | %9s | %9s | %s |" % ("what (ms)", "n", "p50", "p95", "p99", "note"))
    out("|" + "-" * 46 + "|------|-----------|-----------|-----------|------|")


class Api:
    def __init__(self, daemon):
        self.ka = KeepAlive(daemon.port, daemon.client.key)

    def call(self, method, path, body=None, want=(200, 201, 204)):
        st, b, dt = self.ka.call(method, path, body)
        if st not in want:
            raise RuntimeError("%s %s -> %d %r" % (method, path, st, b))
        return b, dt * 1000.0

    def post(self, sid, what, body=None):
        return self.call("POST", "/v1/sandboxes/%s/%s" % (sid, what), body if body is not None else {})


def put_holder(daemon, sid, mb):
    daemon.client.put_file(sid, "/root/holder.py", HOLDER.encode())
    daemon.client.exec(sid, cmd="python3 /root/holder.py %d" % mb, background=True, expect=(200, 201))
    # wait until its memory is touched
    deadline = time.time() + 60
    while time.time() < deadline:
        r = daemon.client.exec(sid, cmd="cat /proc/[0-9]*/status 2>/dev/null | awk '/VmRSS/ {s+=$2} END {print s}'")
        if int(r["stdout"].strip() or 0) >= mb * 1024:
            return
        time.sleep(0.2)


def sandbox(daemon, mb):
    """A sandbox: idle shell (mb None) or one with the Python holder of mb MiB."""
    sb = daemon.client.create(ttl_seconds=3600, memory_mb=512)
    if mb is not None:
        put_holder(daemon, sb["id"], mb)
    return sb["id"]


# ---- (i) pause / resume ----

def bench_pause(daemon, api, n):
    header("pause / resume (round trip of the API call)")
    for label, mb in (("idle shell", None), ("64 MiB", 64)):
        sid = sandbox(daemon, mb)
        ps, rs = [], []
        for _ in range(n):
            b, dt = api.post(sid, "pause")
            assert b["state"] == "paused", b
            ps.append(dt)
            b, dt = api.post(sid, "resume")
            assert b["state"] == "running", b
            rs.append(dt)
        row("moat pause, %s" % label, ps, "target < 1 ms")
        row("moat resume, %s" % label, rs, "target < 1 ms")
        api.call("DELETE", "/v1/sandboxes/" + sid)
    # peer: the kernel's cgroup freeze on a plain cgroup
    cg = None
    mounts = moatd._cgroup_mounts()
    for d in moatd.self_cgroup_dirs():
        if mounts.get("") and d.startswith(mounts[""]):  # the v2 tree (root lacks cgroup.freeze; children have it)
            cg = os.path.join(d, "moat-bench-freeze-%d" % os.getpid())
    if cg is None:
        out("(no v2 cgroup to measure the kernel floor)")
        return
    os.mkdir(cg)
    p = subprocess.Popen(["sleep", "3600"])
    try:
        with open(os.path.join(cg, "cgroup.procs"), "w") as f:
            f.write(str(p.pid))
        fz, th = [], []
        for _ in range(n):
            for val, acc in (("1", fz), ("0", th)):
                t0 = time.perf_counter()
                with open(os.path.join(cg, "cgroup.freeze"), "w") as f:
                    f.write(val)
                while True:
                    with open(os.path.join(cg, "cgroup.events")) as f:
                        if ("frozen %s" % val) in f.read():
                            break
                acc.append((time.perf_counter() - t0) * 1000)
        row("peer: cgroup.freeze write + settle", fz, "kernel floor")
        row("peer: cgroup thaw write + settle", th, "kernel floor")
    finally:
        p.kill()
        p.wait()
        time.sleep(0.1)
        os.rmdir(cg)


# ---- (ii) checkpoints ----

def memory_of_slots(daemon, before):
    """Sum of memory usage of slot cgroups made since `before` (v1 memory or v2)."""
    total = 0
    for top in daemon.cgroups:
        for root, dirs, _ in os.walk(top):
            for d in dirs:
                p = os.path.join(root, d)
                if not d.startswith("slot-") or p in before:
                    continue
                for fn in ("memory.usage_in_bytes", "memory.current"):
                    try:
                        with open(os.path.join(p, fn)) as f:
                            total += int(f.read())
                        break
                    except OSError:
                        pass
    return total


def slot_dirs(daemon):
    s = set()
    for top in daemon.cgroups:
        for root, dirs, _ in os.walk(top):
            s |= {os.path.join(root, d) for d in dirs if d.startswith("slot-")}
    return s


def bench_ckpt(daemon, api, n):
    header("snapshot, fork, hibernate/wake (round trip of the API call)")
    results = {}
    for label, mb in (("idle shell", None), ("64 MiB", 64)):
        try:
            results[label] = bench_ckpt_one(daemon, api, n, label, mb)
        except (RuntimeError, OSError) as e:  # a hung or failed call: say so, go on with the rest
            out("| %-44s | failed: %s |" % ("moat checkpoints, %s" % label, str(e)[:200]))
            api.ka.conn = None
    return results


def bench_ckpt_one(daemon, api, n, label, mb):
    if True:
        sid = sandbox(daemon, mb)
        snaps, f1, f8, hib, wake = [], [], [], [], []
        mem_note = ""
        for i in range(n):
            b, dt = api.post(sid, "snapshots")
            snaps.append(dt)
            api.call("DELETE", "/v1/snapshots/" + b["id"])
            b, dt = api.post(sid, "fork", {"count": 1})
            f1.append(dt)
            for k in b["sandboxes"]:
                api.call("DELETE", "/v1/sandboxes/" + k["id"])
            before = slot_dirs(daemon)
            b, dt = api.post(sid, "fork", {"count": 8})
            f8.append(dt)
            if i == 0:
                time.sleep(1)
                kids = memory_of_slots(daemon, before)
                parent = memory_of_slots(daemon, set()) - kids
                mem_note = "8 children use %.1f MiB (parent and others %.1f MiB)" % (kids / 2**20, parent / 2**20)
            for k in b["sandboxes"]:
                api.call("DELETE", "/v1/sandboxes/" + k["id"])
            b, dt = api.post(sid, "hibernate")
            hib.append(dt)
            b, dt = api.post(sid, "wake")
            wake.append(dt)
        # a paused parent: its first fork's image serves the next forks
        api.post(sid, "pause")
        b, _ = api.post(sid, "fork", {"count": 1})
        for k in b["sandboxes"]:
            api.call("DELETE", "/v1/sandboxes/" + k["id"])
        fp = []
        for i in range(n):
            b, dt = api.post(sid, "fork", {"count": 1})
            fp.append(dt)
            for k in b["sandboxes"]:
                api.call("DELETE", "/v1/sandboxes/" + k["id"])
        api.post(sid, "resume")
        results = {
            "snapshot": row("moat snapshot, %s" % label, snaps),
            "fork1": row("moat fork: first child ready, %s" % label, f1),
            "fork8": row("moat fork: 8 children ready, %s" % label, f8, mem_note),
            "hibernate": row("moat hibernate, %s" % label, hib),
            "wake": row("moat wake, %s" % label, wake, "target idle shell p50 < 150 ms" if mb is None else ""),
        }
        row("moat fork of a paused sandbox (image reused), %s" % label, fp, "first child ready")
        api.call("DELETE", "/v1/sandboxes/" + sid)
    return results


def bench_criu_peer(n):
    header("peer: plain criu CLI (%s), holder in pid+uts+ipc namespaces" % CRIU)
    if not os.path.exists(CRIU):
        out("(no CRIU at %s: run scripts/criu.sh)" % CRIU)
        return {}
    res = {}
    tmp = tempfile.mkdtemp(prefix="moat-bench-criu-")
    holder = os.path.join(tmp, "holder.py")
    with open(holder, "w") as f:
        f.write(HOLDER)
    try:
        for label, mb in (("idle", 0), ("64 MiB", 64)):
            p = subprocess.Popen(["unshare", "--pid", "--uts", "--ipc", "--fork", "setsid", "python3", holder,
                                  str(mb)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, start_new_session=True)
            time.sleep(1.0 + mb / 64.0)
            kids = subprocess.run(["pgrep", "-P", str(p.pid)], stdout=subprocess.PIPE).stdout.split()
            if not kids:
                out("(peer holder did not start)")
                p.kill()
                continue
            pid = int(kids[0])
            dumps, restores = [], []
            for i in range(n):
                img = os.path.join(tmp, "img%d" % i)
                os.mkdir(img)
                t0 = time.perf_counter()
                r = subprocess.run([CRIU, "dump", "-t", str(pid), "--leave-running", "-D", img, "-o", "dump.log"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                dumps.append((time.perf_counter() - t0) * 1000)
                if r.returncode != 0:
                    out("(criu dump failed: see %s/dump.log)" % img)
                    break
                t0 = time.perf_counter()
                pidfile = os.path.join(img, "restored.pid")
                r = subprocess.run([CRIU, "restore", "-D", img, "-d", "-o", "restore.log", "--pidfile", pidfile],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                restores.append((time.perf_counter() - t0) * 1000)
                if r.returncode != 0:
                    out("(criu restore failed: see %s/restore.log)" % img)
                    break
                with open(pidfile) as f:
                    os.kill(int(f.read()), 9)
                shutil.rmtree(img, ignore_errors=True)
            if dumps:
                res[label] = {"dump": row("criu dump --leave-running, %s" % label, dumps)}
            if restores:
                res[label]["restore"] = row("criu restore -d, %s" % label, restores)
            try:
                os.kill(pid, 9)  # the holder ran setsid: not in unshare's process group
            except OSError:
                pass
            os.killpg(p.pid, 9)
            p.wait()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pauses", type=int, default=200)
    ap.add_argument("--ckpts", type=int, default=5)
    ap.add_argument("--out")
    args = ap.parse_args()
    out("## Time travel (bench/timetravel.py), %s, %s, %d CPUs" % (time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                                                    platform.release(), os.cpu_count()))
    daemon = moatd.MoatDaemon(pool=2)
    try:
        daemon.start()
        api = Api(daemon)
        h, _ = api.call("GET", "/healthz")
        ck = h.get("checkpoints", {})
        out()
        out("checkpoints: available=%s, %s" % (ck.get("available"), ck.get("criu")))
        bench_pause(daemon, api, args.pauses)
        if ck.get("available"):
            try:
                moat = bench_ckpt(daemon, api, args.ckpts)
            except RuntimeError as e:
                out()
                out("(checkpoint benchmark failed: %s)" % e)
                moat = {}
            peer = bench_criu_peer(args.ckpts)
            out()
            for label, plabel in (("idle shell", "idle"), ("64 MiB", "64 MiB")):
                if label in moat and plabel in peer and "restore" in peer[plabel]:
                    ratio = moat[label]["fork1"]["p50"] / peer[plabel]["restore"]["p50"]
                    out("- fork first child / plain criu restore, %s: %.2fx (target <= 0.5x)" % (label, ratio))
        else:
            out()
            out("(snapshot, fork, hibernate and wake not measured: checkpoints unavailable here)")
    finally:
        daemon.stop()
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

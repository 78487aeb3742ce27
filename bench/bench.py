#!/usr/bin/env python3
"""bench.py -- moat side by side with its peers, in one run on the same template rootfs.

  MOAT_BUILD=build python3 bench/bench.py [--creates 200] [--execs 200] [--idle 500] [--out FILE]

(a) create-to-ready: server-side (`ready_us` in the create response) and client-side (round trip of
    POST /v1/sandboxes over a kept-alive connection), each sandbox deleted after, off the timed path;
    with the warm pool (daemon default) and, for reference, cold (--pool 0);
(b) bwrap --unshare-all --ro-bind ROOTFS / --proc /proc --dev /dev /bin/true (spawn+wait);
(c) moat exec of argv ["true"] round trip vs posix_spawn+wait of /bin/true on the host;
(d) N idle sandboxes alive at once: host memory per sandbox (MemAvailable delta / N, and the sum of
    the sandboxes' memory cgroup usage / N).
(e)-(h) streaming, PTY, code contexts and throughput: see bench/interactive.py.
Prints p50/p95/p99 and the ratios against the targets; writes the same as Markdown to --out.
bench/spawn_time (built by scripts/bench.sh) does the spawn+wait timing of (b) and (c).
"""

import argparse
import http.client
import json
import os
import platform
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "lib"))
import moatd  # noqa: E402

sys.path.insert(0, HERE)
import interactive  # noqa: E402


def pct(xs, p):
    s = sorted(xs)
    if not s:
        return float("nan")
    k = max(0, min(len(s) - 1, int(round(p / 100.0 * len(s) + 0.5)) - 1))
    return s[k]


def summary(xs):
    return {"n": len(xs), "p50": pct(xs, 50), "p95": pct(xs, 95), "p99": pct(xs, 99), "min": min(xs), "max": max(xs)}


class KeepAlive:
    """One kept-alive HTTP/1.1 connection to moatd (reconnects if the server closes it)."""

    def __init__(self, port, key):
        self.port, self.key = port, key
        self.conn = None

    def call(self, method, path, body=None):
        for attempt in (0, 1):
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
            try:
                data = json.dumps(body).encode() if body is not None else None
                h = {"Authorization": "Bearer " + self.key}
                if data is not None:
                    h["Content-Type"] = "application/json"
                t0 = time.perf_counter()
                self.conn.request(method, path, body=data, headers=h)
                r = self.conn.getresponse()
                payload = r.read()
                dt = time.perf_counter() - t0
                if r.getheader("Connection", "").lower() == "close":
                    self.conn.close()
                    self.conn = None
                return r.status, (json.loads(payload) if payload else None), dt
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                self.conn.close()
                self.conn = None
                if attempt:
                    raise


def spawn_times(spawn_time, n, argv):
    out = subprocess.run([spawn_time, str(n)] + argv, stdout=subprocess.PIPE, check=True, timeout=1800)
    return [float(x) / 1000.0 for x in out.stdout.split()]  # ms


def meminfo(key="MemAvailable"):
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def cgroup_memory_of_slots(daemon):
    total, n = 0, 0
    for d in daemon.cgroups:
        if "/memory/" not in d:
            continue
        for sub in moatd.cgroup_walk(d):
            if os.path.basename(sub).startswith("slot-"):
                try:
                    with open(os.path.join(sub, "memory.usage_in_bytes")) as f:
                        total += int(f.read())
                    n += 1
                except OSError:
                    pass
    if n == 0:  # pure v2
        for d in daemon.cgroups:
            for sub in moatd.cgroup_walk(d):
                if os.path.basename(sub).startswith("slot-") and os.path.exists(os.path.join(sub, "memory.current")):
                    with open(os.path.join(sub, "memory.current")) as f:
                        total += int(f.read())
                    n += 1
    return total, n


def bench_creates(daemon, n, pace_s):
    ka = KeepAlive(daemon.port, daemon.client.key)
    server, client, pooled = [], [], 0
    for _ in range(n):
        st, sb, dt = ka.call("POST", "/v1/sandboxes", {})
        if st != 201:
            raise RuntimeError("create -> %d %r" % (st, sb))
        client.append(dt * 1000)
        server.append(sb["ready_us"] / 1000.0)
        st, _, _ = ka.call("DELETE", "/v1/sandboxes/" + sb["id"])
        if st != 204:
            raise RuntimeError("delete -> %d" % st)
        time.sleep(pace_s)
    return server, client


def bench_execs(daemon, n):
    ka = KeepAlive(daemon.port, daemon.client.key)
    st, sb, _ = ka.call("POST", "/v1/sandboxes", {})
    sid = sb["id"]
    for _ in range(5):
        ka.call("POST", "/v1/sandboxes/%s/exec" % sid, {"argv": ["true"]})
    times = []
    for _ in range(n):
        st, r, dt = ka.call("POST", "/v1/sandboxes/%s/exec" % sid, {"argv": ["true"]})
        if st != 200 or r["exit_code"] != 0:
            raise RuntimeError("exec -> %d %r" % (st, r))
        times.append(dt * 1000)
    ka.call("DELETE", "/v1/sandboxes/" + sid)
    return times


def bench_idle(daemon, n, threads=4):
    time.sleep(2)
    before = meminfo()
    ids, errs = [], []
    lock = threading.Lock()

    def worker(count):
        ka = KeepAlive(daemon.port, daemon.client.key)
        for _ in range(count):
            try:
                st, sb, _ = ka.call("POST", "/v1/sandboxes", {})
                if st != 201:
                    raise RuntimeError("create -> %d %r" % (st, sb))
                with lock:
                    ids.append(sb["id"])
            except Exception as e:
                with lock:
                    errs.append(str(e))
    t0 = time.time()
    ts = [threading.Thread(target=worker, args=(n // threads + (1 if i < n % threads else 0),)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    create_s = time.time() - t0
    time.sleep(5)  # let the pool refill and the page cache settle
    after = meminfo()
    cg_total, cg_n = cgroup_memory_of_slots(daemon)
    alive = len(ids)
    # delete them all
    ka = KeepAlive(daemon.port, daemon.client.key)
    for sid in ids:
        ka.call("DELETE", "/v1/sandboxes/" + sid)
    return {"requested": n, "alive": alive, "errors": errs[:3], "n_errors": len(errs), "create_s": create_s,
            "memavail_delta": before - after, "cg_total": cg_total, "cg_n": cg_n}


def fmt(s):
    return "%8.3f %8.3f %8.3f" % (s["p50"], s["p95"], s["p99"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--creates", type=int, default=200)
    ap.add_argument("--cold-creates", type=int, default=100)
    ap.add_argument("--execs", type=int, default=200)
    ap.add_argument("--spawns", type=int, default=200)
    ap.add_argument("--idle", type=int, default=500)
    ap.add_argument("--pool", type=int, default=4)
    ap.add_argument("--pace-ms", type=float, default=20.0)
    ap.add_argument("--spawn-time", default=os.path.join(REPO, "build", "bench", "spawn_time"))
    ap.add_argument("--out", default=os.path.join(REPO, "build", "bench", "results.md"))
    ap.add_argument("--streams", type=int, default=200, help="(e) streamed execs")
    ap.add_argument("--keys", type=int, default=200, help="(f) pty keystrokes")
    ap.add_argument("--runs", type=int, default=100, help="(g) context runs and fresh python3 execs")
    ap.add_argument("--throughput-runs", type=int, default=3, help="(h) 1 GiB streams")
    ap.add_argument("--only", default="", help="comma-separated subset of a,b,c,d,e,f,g,h (default all)")
    a = ap.parse_args()
    only = set(a.only.split(",")) if a.only else set("abcdefgh")

    moatd.ensure_template("base")
    rootfs = os.path.join(moatd.TEMPLATE_DIR, "base", "rootfs")
    res = {}

    missing = {}
    if "b" in only:
        print("(b) bwrap --unshare-all on %s, %d runs" % (rootfs, a.spawns), flush=True)
        bwrap = ["bwrap", "--unshare-all", "--ro-bind", rootfs, "/", "--proc", "/proc", "--dev", "/dev", "/bin/true"]
        res["bwrap"] = summary(spawn_times(a.spawn_time, a.spawns, bwrap))
    if "c" in only:
        print("(c) local posix_spawn+wait of /bin/true, %d runs" % a.spawns, flush=True)
        res["spawn"] = summary(spawn_times(a.spawn_time, a.spawns, ["/bin/true"]))

    d = moatd.MoatDaemon(pool=a.pool)
    try:
        d.start()
        d.client.delete(d.client.create()["id"])  # first create warms caches
        time.sleep(1)
        if "a" in only:
            print("(a) %d creates with the warm pool (--pool %d), %.0f ms apart" % (a.creates, a.pool, a.pace_ms),
                  flush=True)
            srv, cli = bench_creates(d, a.creates, a.pace_ms / 1000.0)
            res["create_server"], res["create_client"] = summary(srv), summary(cli)
        if "c" in only:
            print("(c) %d execs of true" % a.execs, flush=True)
            res["exec"] = summary(bench_execs(d, a.execs))
            ka = KeepAlive(d.port, d.client.key)
            res["healthz"] = summary([ka.call("GET", "/healthz")[2] * 1000 for _ in range(a.execs)])
        run_interactive(d, a, only, res, missing)
        if "d" in only:
            print("(d) %d idle sandboxes" % a.idle, flush=True)
            res["idle"] = bench_idle(d, a.idle)
    finally:
        d.stop()
    if a.cold_creates and "a" in only:
        d = moatd.MoatDaemon(pool=0)
        try:
            d.start()
            d.client.delete(d.client.create()["id"])
            print("(a') %d cold creates (--pool 0)" % a.cold_creates, flush=True)
            srv, cli = bench_creates(d, a.cold_creates, 0.0)
            res["cold_server"], res["cold_client"] = summary(srv), summary(cli)
        finally:
            d.stop()

    lines = []
    lines.append("host: %s, %d CPUs, kernel %s; %s" % (platform.node(), os.cpu_count(), platform.release(),
                                                       time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())))
    lines.append("")
    lines.append("| measurement (ms) | n | p50 | p95 | p99 |")
    lines.append("|---|---|---|---|---|")
    rows = [("(a) moat create-to-ready, server-side (`ready_us`), warm pool", "create_server"),
            ("(a) moat create, client-side POST round trip, warm pool", "create_client"),
            ("(a') moat create-to-ready, server-side, cold (--pool 0)", "cold_server"),
            ("(a') moat create, client-side, cold (--pool 0)", "cold_client"),
            ("(b) bwrap --unshare-all ... /bin/true (spawn+wait)", "bwrap"),
            ("(c) moat exec argv [\"true\"], client round trip", "exec"),
            ("(c) local posix_spawn+wait /bin/true", "spawn"),
            ("HTTP floor of this client: GET /healthz round trip", "healthz"),
            ("(e) exec/stream `echo x`: request to first stdout event", "ttfb"),
            ("(e) plain exec `echo x` round trip (for reference)", "ttfb_plain"),
            ("(f) pty keystroke echo over the WebSocket (`cat`, raw)", "pty"),
            ("(f) local pty keystroke echo on the host (`cat`, raw)", "pty_local"),
            ("(g) code context `1+1` round trip", "ctx"),
            ("(g) exec `python3 -c '1+1'` (fresh interpreter), same sandbox", "ctx_fresh")]
    for label, k in rows:
        if k in res:
            s = res[k]
            lines.append("| %s | %d | %.3f | %.3f | %.3f |" % (label, s["n"], s["p50"], s["p95"], s["p99"]))
    if "tput" in res:
        lines.append("")
        lines.append("| (h) throughput (MiB/s) | n | p50 | min | max |")
        lines.append("|---|---|---|---|---|")
        for label, k in (("`moat exec --stream ID -- cat` 1 GiB file > /dev/null", "tput"),
                         ("host `cat` 1 GiB file > /dev/null", "tput_host")):
            s = res[k]
            lines.append("| %s | %d | %.0f | %.0f | %.0f |" % (label, s["n"], s["p50"], s["min"], s["max"]))
    for k, why in sorted(missing.items()):
        lines.append("")
        lines.append("(%s) **missing**: %s" % (k, why))
    if "idle" in res:
        idle = res["idle"]
        mib_memavail = idle["memavail_delta"] / max(1, idle["alive"]) / (1 << 20)
        mib_cg = idle["cg_total"] / max(1, idle["cg_n"]) / (1 << 20) if idle["cg_n"] else float("nan")
        lines.append("")
        lines.append("(d) %d idle sandboxes alive (%d created in %.1f s, %d errors%s): MemAvailable fell by %.1f MiB = "
                     "**%.2f MiB per sandbox**; the sandboxes' memory cgroups hold %.1f MiB in all = %.2f MiB each "
                     "(%d cgroups)"
                     % (idle["alive"], idle["alive"], idle["create_s"], idle["n_errors"],
                        (": " + "; ".join(idle["errors"])) if idle["errors"] else "",
                        idle["memavail_delta"] / (1 << 20), mib_memavail, idle["cg_total"] / (1 << 20), mib_cg,
                        idle["cg_n"]))
    lines.append("")
    lines.append("| ratio | value | target | |")
    lines.append("|---|---|---|---|")

    def ratio(label, num, den, target, ok):
        if num in res and den in res:
            v = res[num]["p50"] / res[den]["p50"]
            lines.append("| %s | %.3f | %s | %s |" % (label, v, target, "" if ok is None else ("met" if ok(v) else "MISSED")))

    ratio("create p50 (server) / bwrap p50", "create_server", "bwrap", "<= 0.25", lambda v: v <= 0.25)
    ratio("create p50 (client) / bwrap p50", "create_client", "bwrap", "(for reference)", None)
    ratio("exec p50 / spawn p50", "exec", "spawn", "<= 1.5", lambda v: v <= 1.5)
    if "idle" in res:
        lines.append("| MiB per idle sandbox (MemAvailable) | %.2f | <= 2 | %s |" % (mib_memavail, "met" if mib_memavail <= 2 else "MISSED"))
    ratio("pty echo p50 / local pty echo p50", "pty", "pty_local", "(for reference)", None)
    if "ctx" in res and "ctx_fresh" in res:
        v = res["ctx_fresh"]["p50"] / res["ctx"]["p50"]
        lines.append("| fresh python3 p50 / context `1+1` p50 (speed-up) | %.1f | >= 10 | %s |" % (v, "met" if v >= 10 else "MISSED"))
    if "tput" in res and "tput_host" in res:
        v = res["tput"]["p50"] / res["tput_host"]["p50"]
        lines.append("| stream throughput p50 / host cat p50 | %.3f | >= 0.5 | %s |" % (v, "met" if v >= 0.5 else "MISSED"))
    text = "\n".join(lines)
    print()
    print(text)
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        f.write("command: `%s`\n\n" % " ".join(["MOAT_BUILD=" + os.path.relpath(moatd.BUILD, REPO), "python3",
                                                 "bench/bench.py"] + sys.argv[1:]))
        f.write(text + "\n")
        f.write("\n```json\n%s\n```\n" % json.dumps(dict(res, missing=missing), indent=1, default=str))
    print("\nwritten to %s" % a.out)


def run_interactive(d, a, only, res, missing):
    """(e)-(h); a missing route or template is recorded in missing, never estimated."""
    def attempt(letter, what, fn):
        if letter not in only:
            return
        print("(%s) %s" % (letter, what), flush=True)
        try:
            fn()
        except interactive.Missing as e:
            missing[letter] = str(e)
            print("    missing: %s" % e, flush=True)
        except Exception as e:  # a failure is reported as such, not as a figure
            missing[letter] = "failed: %s" % e
            print("    FAILED: %s" % e, flush=True)

    def e():
        ttfb, plain = interactive.bench_stream_ttfb(d, a.streams)
        res["ttfb"], res["ttfb_plain"] = summary(ttfb), summary(plain)

    def f():
        res["pty"] = summary(interactive.bench_pty_echo(d, a.keys))
        res["pty_local"] = summary(interactive.local_pty_echo(a.keys))

    def g():
        try:
            moatd.ensure_template("code-interpreter")
        except Exception as ex:
            raise interactive.Missing("template code-interpreter could not be built: %s" % str(ex)[:300])
        ctx, fresh = interactive.bench_context(d, a.runs)
        res["ctx"], res["ctx_fresh"] = summary(ctx), summary(fresh)

    def h():
        sb, host = interactive.bench_throughput(d, os.path.join(moatd.BUILD, "moat"), a.throughput_runs)
        res["tput"], res["tput_host"] = summary(sb), summary(host)

    attempt("e", "%d streamed execs of echo x (time to first byte) and %d plain ones" % (a.streams, a.streams), e)
    attempt("f", "%d pty keystrokes over the WebSocket and %d on a local pty" % (a.keys, a.keys), f)
    attempt("g", "%d code-context runs of 1+1 and %d fresh python3 -c 1+1" % (a.runs, a.runs), g)
    attempt("h", "%d x 1 GiB through exec/stream and host cat" % a.throughput_runs, h)


if __name__ == "__main__":
    main()

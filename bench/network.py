#!/usr/bin/env python3
"""network.py -- issue 5's benchmark: sandbox networking against a fake internet (tests/lib/fakenet.py).

  MOAT_BUILD=build python3 bench/network.py [--creates 200] [--idle 1000] [--connects 300] [--mb 200] [--out FILE]
                                            [--create-only]

(i)   create-to-ready (POST /v1/sandboxes until 201, then DELETE) on a moatd with an uplink (each
      sandbox gets eth0, a /30, resolv.conf, a default policy bound in nftables) vs a moatd without
      (loopback only), same pool size, same pace, alternating, in the same run; and on the moatd
      with an uplink, creates with network {internet: false} in the same rotation. Target: p50
      within 1 ms each. --create-only stops after (i).
(ii)  slot build rate: a moatd told to keep 512 slots prepared (--net-warm 512), time until the routing
      namespace holds them; teardown rate: 200 sandboxes with networking deleted at once, time until
      their veths are gone.
(iii) TCP from a sandbox to a test host in the fake internet (through veth, the routing namespace,
      nftables with its sets and NAT) vs from a "host side" netns joined to the same fake internet by
      a plain veth (no firewall, no NAT): connect latency (a fresh connection, one byte each way) and
      throughput (--mb MiB sent). Same client code and interpreter (Debian's python3). Target >= 0.8x.
(iv)  --idle sandboxes with networking alive at once: MemAvailable per sandbox, beside the same number
      without networking.
Prints p50/p95/p99 in milliseconds; --out writes the same as Markdown. Sends packets only into
namespaces it makes.
"""

import argparse
import json
import os
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "lib"))
sys.path.insert(0, HERE)
import fakenet  # noqa: E402
import moatd  # noqa: E402
from bench import KeepAlive, meminfo, summary  # noqa: E402

lines = []
DEB_PY = "/usr/bin/python3"

CLIENT = r"""
import json, socket, sys, time
host, port, n, mb = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
lat = []
for _ in range(n):
    t0 = time.perf_counter()
    s = socket.create_connection((host, port), 5)
    s.sendall(b"ping")
    s.recv(1)
    lat.append((time.perf_counter() - t0) * 1000)
    s.close()
buf = b"\0" * (1 << 20)
s = socket.create_connection((host, port), 5)
t0 = time.perf_counter()
for _ in range(mb):
    s.sendall(buf)
s.shutdown(socket.SHUT_WR)
got = int(s.recv(64) or 0)
dt = time.perf_counter() - t0
print(json.dumps({"lat": lat, "mbps": mb * 8 * 1.048576 / dt, "bytes": got}))
"""


def out(s=""):
    print(s, flush=True)
    lines.append(s)


def row(name, xs, note=""):
    s = summary(xs)
    out("| %-46s | %5d | %8.3f | %8.3f | %8.3f | %s |" % (name, s["n"], s["p50"], s["p95"], s["p99"], note))
    return s


def header():
    out("| measurement (ms)                               |     n |      p50 |      p95 |      p99 | note |")
    out("|------------------------------------------------|------:|---------:|---------:|---------:|------|")


def daemon(fi, pool, extra=()):
    args = list(extra)
    if fi:
        args += ["--net-uplink", "netns:" + fi.path, "--net-dns-upstream", fakenet.DNS]
    d = moatd.MoatDaemon(pool=pool, extra_args=args)
    d.start()
    return d


def stop(d):
    if d:
        try:
            d.stop(keep_data=True)
            fakenet.remove_routing_ns(d.data_dir)
        finally:
            d.force_cleanup()


POLICY = {"egress": "deny", "allow": ["allowed.test", "*.wild.test", "198.51.100.0/28", "203.0.113.7"],
          "deny": ["denied.test", "198.51.100.11"]}


def creates(d, n, pace, body=None):
    ka = KeepAlive(d.port, d.client.key)
    xs = []
    for _ in range(n):
        st, sb, dt = ka.call("POST", "/v1/sandboxes", body or {})
        if st != 201:
            raise RuntimeError("create: %s %s" % (st, sb))
        xs.append(dt * 1000)
        ka.call("DELETE", "/v1/sandboxes/" + sb["id"])
        time.sleep(pace)
    return xs


def count_links(d, prefix):
    return sum(1 for n in fakenet.routing_links(d.data_dir) if n.startswith(prefix))


def host_side_ns(fi):
    """A netns standing for the host, joined to the fake internet by a plain veth (no NAT, no firewall)."""
    name = fi.name + "-h"
    fakenet.run("ip", "netns", "add", name)
    fakenet.run("ip", "link", "add", "mbh0", "netns", name, "type", "veth", "peer", "name", "mbh1", "netns", fi.name)
    fakenet.run("ip", "-n", name, "addr", "add", "192.0.2.66/30", "dev", "mbh0")
    fakenet.run("ip", "-n", fi.name, "addr", "add", "192.0.2.65/30", "dev", "mbh1")
    for ns, dev in ((name, "mbh0"), (fi.name, "mbh1"), (name, "lo")):
        fakenet.run("ip", "-n", ns, "link", "set", dev, "up")
    fakenet.run("ip", "-n", name, "route", "add", "default", "via", "192.0.2.65")
    return name


def idle(d, n, threads=4):
    """Creates n sandboxes with 4 client threads; returns (seconds, errors, MiB MemAvailable fell by)."""
    before = meminfo()
    errs = []
    ids = []
    lock = threading.Lock()

    def work(k):
        ka = KeepAlive(d.port, d.client.key)
        for _ in range(k):
            st, sb, _ = ka.call("POST", "/v1/sandboxes", {"ttl_seconds": 3600})
            with lock:
                (ids.append(sb["id"]) if st == 201 else errs.append((st, sb)))

    t0 = time.time()
    ts = [threading.Thread(target=work, args=(n // threads + (1 if i < n % threads else 0),)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    dt = time.time() - t0
    time.sleep(2)
    after = meminfo()
    return dt, errs, (before - after) / 1048576.0, ids


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--creates", type=int, default=200)
    ap.add_argument("--pace", type=float, default=0.08, help="seconds between creates (the pool refills)")
    ap.add_argument("--idle", type=int, default=1000)
    ap.add_argument("--connects", type=int, default=300)
    ap.add_argument("--mb", type=int, default=200)
    ap.add_argument("--out")
    ap.add_argument("--create-only", action="store_true", help="section (i) only")
    a = ap.parse_args()

    fi = fakenet.FakeInternet().start()
    dn = d0 = None
    hns = None
    try:
        out("## network (bench/network.py)")
        out()
        out("%s UTC, %d CPUs; fake internet netns %s" % (time.strftime("%Y-%m-%d %H:%M"), os.cpu_count(), fi.name))
        out()
        header()
        # (i) create with vs without networking
        dn = daemon(fi, pool=4)
        d0 = daemon(None, pool=4)
        creates(dn, 10, a.pace)
        creates(d0, 10, a.pace)
        xn, x0, xp, xf = [], [], [], []
        for i in range(a.creates // 2):  # one with, one without, alternating: drift hits both alike
            xn += creates(dn, 1, a.pace)
            x0 += creates(d0, 1, a.pace)
            xf += creates(dn, 1, a.pace, {"network": {"internet": False}})
            if i % 2:
                xp += creates(dn, 1, a.pace, {"network": POLICY})
        sn = row("create-to-ready, networking (warm shell)", xn)
        sf = row("create-to-ready, networking, internet: false", xf, "same moatd, same warm pool")
        row("create-to-ready, networking + a 6-entry policy", xp, "egress deny, names, wildcard, CIDRs")
        s0 = row("peer: create-to-ready, loopback only", x0)
        diff = sn["p50"] - s0["p50"]
        row_note = "target within 1 ms: %s" % ("met" if diff <= 1.0 else "missed")
        out("| %-46s |       | %+8.3f |          |          | %s |" % ("difference at p50", diff, row_note))
        difff = sf["p50"] - sn["p50"]
        out("| %-46s |       | %+8.3f |          |          | internet: false vs true; target within 1 ms: %s |" %
            ("difference at p50 (internet: false)", difff, "met" if difff <= 1.0 else "missed"))
        stop(d0)
        d0 = None
        if a.create_only:
            return

        # (iii) TCP from a sandbox vs from the host side
        sid = dn.client.create(template="code-interpreter")["id"]  # base has python3-minimal (no json)
        dn.client.put_file(sid, "/tmp/client.py", CLIENT.encode())
        r = dn.client.exec(sid, argv=["python3", "/tmp/client.py", fakenet.SINK, "5001", str(a.connects), str(a.mb)],
                           timeout_ms=600000)
        if r["exit_code"] != 0:
            raise RuntimeError("sandbox client: %r" % r)
        sb = json.loads(r["stdout"])
        hns = host_side_ns(fi)
        open("/tmp/moat-bench-client.py", "w").write(CLIENT)
        hb = json.loads(fakenet.run("ip", "netns", "exec", hns, DEB_PY, "/tmp/moat-bench-client.py", fakenet.SINK,
                                    "5001", str(a.connects), str(a.mb)))
        ls = row("TCP connect+1 byte RTT, sandbox -> test host", sb["lat"])
        lh = row("peer: same from the host-side netns", hb["lat"])
        out("| %-46s |       | %8.2fx |          |          | target >= 0.8x (rate = 1/latency) |" %
            ("connect rate ratio sandbox/host", lh["p50"] / ls["p50"]))
        ratio = sb["mbps"] / hb["mbps"]
        out("| %-46s | %5d | %8.0f |          |          | Mbit/s |" % ("TCP throughput, sandbox -> test host", a.mb, sb["mbps"]))
        out("| %-46s | %5d | %8.0f |          |          | Mbit/s |" % ("peer: from the host-side netns", a.mb, hb["mbps"]))
        out("| %-46s |       | %8.2fx |          |          | target >= 0.8x: %s |" %
            ("throughput ratio sandbox/host", ratio, "met" if ratio >= 0.8 else "missed"))
        dn.client.delete(sid)
        stop(dn)
        dn = None

        # (ii) slot build rate and teardown rate
        dn = daemon(fi, pool=0, extra=["--net-warm", "512"])
        t0 = time.time()
        while count_links(dn, "mp") < 512 and time.time() - t0 < 300:
            time.sleep(0.05)
        built = count_links(dn, "mp")
        bt = time.time() - t0
        out("| %-46s | %5d | %8.3f |          |          | %.0f slots/s (veth pair, address, up) |" %
            ("slot build, ms each (512 prepared ahead)", built, bt * 1000 / max(built, 1), built / bt))
        ids = [dn.client.create()["id"] for _ in range(200)]
        before = count_links(dn, "mv")
        t0 = time.time()
        for i in ids:
            dn.client.delete(i)
        td = time.time() - t0
        while count_links(dn, "mv") > before - 200 and time.time() - t0 < 300:
            time.sleep(0.05)
        tt = time.time() - t0
        out("| %-46s | %5d | %8.3f |          |          | %.0f slots/s off the request path; DELETE itself %.2f ms each |" %
            ("slot teardown, ms each (200 deleted at once)", 200, tt * 1000 / 200, 200 / tt, td * 1000 / 200))
        stop(dn)
        dn = None

        # (iv) idle sandboxes alive at once
        if a.idle:
            dn = daemon(fi, pool=0)
            dt, errs, mib, ids = idle(dn, a.idle)
            out("| %-46s | %5d | %8.3f |          |          | created in %.1f s, %d errors |" %
                ("MiB per idle sandbox with networking", len(ids), mib / max(len(ids), 1), dt, len(errs)))
            stop(dn)
            dn = None
            time.sleep(3)
            d0 = daemon(None, pool=0)
            dt, errs, mib, ids = idle(d0, a.idle)
            out("| %-46s | %5d | %8.3f |          |          | created in %.1f s, %d errors |" %
                ("peer: MiB per idle sandbox, loopback only", len(ids), mib / max(len(ids), 1), dt, len(errs)))
            stop(d0)
            d0 = None
    finally:
        for d in (dn, d0):
            stop(d)
        if hns:
            subprocess.run(["ip", "netns", "del", hns], stderr=subprocess.DEVNULL)
        fi.stop()
        if a.out:
            with open(a.out, "w") as f:
                f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

"""fakenet.py -- a fake internet in a network namespace of the test's own, for moatd's uplink
(--net-uplink netns:PATH). Nothing here sends a packet anywhere but into namespaces it made.

FakeInternet() makes netns moat-fi-PID-N with lo up and the test addresses on lo:
  DNS 198.51.100.53, web hosts 198.51.100.10..19, a fake cloud metadata service at 169.254.169.254,
  a "mining pool" listener on 198.51.100.20:3333, a throughput/latency sink on 198.51.100.30:5001;
and runs fakenet_servers.py inside it. moatd adds its uplink link to it (10.200.0.5/30 by
default). stop() kills the servers and deletes the namespace (its veths go with it).
"""
import itertools
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DNS = "198.51.100.53"
WEB = "198.51.100.10"
METADATA = "169.254.169.254"
MINER = "198.51.100.20"
SINK = "198.51.100.30"
ZONE = {
    "allowed.test": ["198.51.100.10"],
    "denied.test": ["198.51.100.11"],
    "api.wild.test": ["198.51.100.12"],
    "deep.api.wild.test": ["198.51.100.12"],
    "wild.test": ["198.51.100.14"],
    "other.test": ["198.51.100.13"],
    "meta.test": ["169.254.169.254"],
    # what a name server of the sandbox's owner answers for a name that reads as allowed.test up to
    # a NUL byte in a label (test_net_isolation: moatd must not take it for allowed.test)
    "allowed.test\x00.evil.test": ["198.51.100.13"],
    # a name whose first label is the byte 0xff (the server reads it as U+FFFD)
    "\ufffd.evil.test": ["198.51.100.14"],
}
_counter = itertools.count()


def run(*argv, check=True):
    r = subprocess.run(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
    if check and r.returncode != 0:
        raise RuntimeError("%s: %s" % (" ".join(argv), r.stderr.decode(errors="replace")))
    return r.stdout.decode()


def routing_ns_path(data_dir):
    """moatd's routing namespace for data_dir (FNV-1a of the data dir's real path, as linux_driver.c)."""
    x = 1469598103934665603
    for b in os.path.realpath(data_dir).encode():
        x ^= b
        x = (x * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return "/run/moat/net/%016x" % x


def remove_routing_ns(data_dir):
    """Removes moatd's routing namespace of data_dir if a crashed test left it (with its veths)."""
    p = routing_ns_path(data_dir)
    if os.path.exists(p):
        subprocess.run(["umount", "-l", p], stderr=subprocess.DEVNULL)
        for f in (p, p + ".owner"):
            try:
                os.unlink(f)
            except OSError:
                pass


NFT_LIST = r"""
import ctypes, sys
l = ctypes.CDLL("libnftables.so.1")
l.nft_ctx_new.restype = ctypes.c_void_p
l.nft_ctx_get_output_buffer.restype = ctypes.c_char_p
ctx = ctypes.c_void_p(l.nft_ctx_new(0))
l.nft_ctx_buffer_output(ctx)
l.nft_ctx_buffer_error(ctx)
rc = l.nft_run_cmd_from_buffer(ctx, sys.argv[1].encode())
sys.stdout.write(l.nft_ctx_get_output_buffer(ctx).decode())
sys.exit(rc)
"""


def nft_list(data_dir, what="table inet moat"):
    """`nft list WHAT` in moatd's routing namespace of data_dir (read only), through libnftables."""
    r = subprocess.run(["nsenter", "--net=" + routing_ns_path(data_dir), sys.executable, "-c", NFT_LIST, "list " + what],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30)
    return r.stdout.decode()


def routing_links(data_dir):
    """{name: ifindex} of the links in moatd's routing namespace."""
    out = subprocess.run(["nsenter", "--net=" + routing_ns_path(data_dir), "ip", "-o", "link"],
                         stdout=subprocess.PIPE, timeout=30).stdout.decode()
    links = {}
    for ln in out.splitlines():
        idx, name = ln.split(":")[0:2]
        links[name.strip().split("@")[0]] = int(idx)
    return links


class FakeInternet:
    def __init__(self, zone=None, ttl=300):
        self.name = "moat-fi-%d-%d" % (os.getpid(), next(_counter))
        self.zone = zone or ZONE
        self.ttl = ttl
        self.proc = None

    @property
    def path(self):
        return "/run/netns/" + self.name

    def exec(self, *argv, **kw):
        return run("ip", "netns", "exec", self.name, *argv, **kw)

    def start(self):
        run("ip", "netns", "add", self.name)
        try:
            run("ip", "-n", self.name, "link", "set", "lo", "up")
            addrs = [DNS, METADATA, MINER, SINK] + ["198.51.100.%d" % i for i in range(10, 20)]
            for a in addrs:
                run("ip", "-n", self.name, "addr", "add", a + "/32", "dev", "lo")
            cfg = {"dns": DNS, "zone": self.zone, "ttl": self.ttl,
                   "http": ["198.51.100.%d" % i for i in range(10, 15)] + [METADATA],
                   "tcp": [[MINER, 3333], [WEB, 8080]], "sink": [SINK, 5001]}
            self.proc = subprocess.Popen(["ip", "netns", "exec", self.name, sys.executable,
                                          os.path.join(HERE, "fakenet_servers.py"), json.dumps(cfg)],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            line = self.proc.stdout.readline()
            if line.strip() != b"ready":
                raise RuntimeError("fake internet servers did not start")
        except Exception:
            self.stop()
            raise
        return self

    def stop(self):
        if self.proc:
            try:
                self.proc.kill()
                self.proc.wait(10)
            except Exception:
                pass
            self.proc = None
        subprocess.run(["ip", "netns", "del", self.name], stderr=subprocess.DEVNULL)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

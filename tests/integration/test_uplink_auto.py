"""test_uplink_auto.py -- moatd's default uplink (--net-uplink auto: the interface of the IPv4
default route) for real, with nothing leaving the machine.

The test builds a host of its own: network namespace H (moat-uh-PID-N) whose default route leads,
over a veth pair, to a fake internet (fakenet.FakeInternet: web servers on 198.51.100.10..14, a fake
cloud metadata service on 169.254.169.254):

    H: lo, eth0 203.0.113.2/30, default via 203.0.113.1      FI: up0 203.0.113.1/30, lo 198.51.100.x ...

In H run a DNS server on 127.0.0.53 (a loopback stub resolver like systemd-resolved's, reachable from
H only) answering a zone of its own (*.fake), and a "host service" on 203.0.113.2:8081. moatd runs in
H with its default flags (no --net-uplink) and /etc/resolv.conf naming 127.0.0.53 (bind-mounted in a
mount namespace of moatd's own). The test talks to moatd through sockets it opens in H.

Checked: a sandbox reaches the fake internet by IP and by name (its DNS goes to moatd, which forwards
to the stub as H's resolv.conf says; the deny policy still applies to forwarded names); internet:
false reaches nothing; the metadata address, moatd's API port and the host service on H's address
and another sandbox's listener are out of reach of a sandbox (each reachable from H itself or from
inside that sandbox, so the check can fail); forwarding is
on for the uplink only, never host-wide. With a dead resolver named first, lookups fail over to the
next; a rewritten resolv.conf is followed. And a host with no default route: moatd starts, /healthz
says uplink none, sandboxes have loopback only.
"""
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))

import fakenet  # noqa: E402
import moatd  # noqa: E402
from moattest import DaemonTest  # noqa: E402
from nettest import NetDaemonTest  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
H_ADDR, FI_ADDR = "203.0.113.2", "203.0.113.1"
STUB = "127.0.0.53"
HOST_SERVICE_PORT = 8081
STUB_ZONE = {
    "web.fake": ["198.51.100.10"],
    "other.fake": ["198.51.100.13"],
    "denied.fake": ["198.51.100.11"],
}
_counter = itertools.count()
PY_LISTEN = ("import socket; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
             "s.bind(('0.0.0.0', 8099)); s.listen(8)\n"
             "while True:\n c,_=s.accept(); c.sendall(b'b'); c.close()")


def run(*argv):
    return fakenet.run(*argv)


class TestHost:
    """Network namespace H of the test's own, optionally with a default route into fi."""

    def __init__(self, fi=None, nameservers=(STUB,)):
        self.name = "moat-uh-%d-%d" % (os.getpid(), next(_counter))
        self.fi = fi
        self.nameservers = nameservers
        self.stub = None
        self.resolv = None

    @property
    def path(self):
        return "/run/netns/" + self.name

    def start(self):
        run("ip", "netns", "add", self.name)
        try:
            run("ip", "-n", self.name, "link", "set", "lo", "up")
            if self.fi:
                run("ip", "-n", self.fi.name, "link", "add", "up0", "type", "veth", "peer", "name", "eth0", "netns",
                    self.name)
                run("ip", "-n", self.fi.name, "addr", "add", FI_ADDR + "/30", "dev", "up0")
                run("ip", "-n", self.fi.name, "link", "set", "up0", "up")
                run("ip", "-n", self.name, "addr", "add", H_ADDR + "/30", "dev", "eth0")
                run("ip", "-n", self.name, "link", "set", "eth0", "up")
                run("ip", "-n", self.name, "route", "add", "default", "via", FI_ADDR)
                cfg = {"dns": STUB, "zone": STUB_ZONE, "tcp": [[H_ADDR, HOST_SERVICE_PORT]]}
                self.stub = subprocess.Popen(["ip", "netns", "exec", self.name, sys.executable,
                                              os.path.join(HERE, "..", "lib", "fakenet_servers.py"), json.dumps(cfg)],
                                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
                if self.stub.stdout.readline().strip() != b"ready":
                    raise RuntimeError("the stub resolver in %s did not start" % self.name)
            fd, self.resolv = tempfile.mkstemp(prefix="moat-uh-resolv-", dir="/var/tmp")
            os.close(fd)
            os.chmod(self.resolv, 0o644)
            self.set_nameservers(self.nameservers)
        except Exception:
            self.stop()
            raise
        return self

    def set_nameservers(self, addrs):
        """Rewrites the resolv.conf moatd sees, in place (the bind mount shows the same file)."""
        with open(self.resolv, "w") as f:
            f.write("# the test host's resolvers\n" + "".join("nameserver %s\n" % a for a in addrs) +
                    "options edns0\n")

    def connects(self, host, port):
        """True when a TCP connection from H itself to host:port is established within 2 s."""
        code = "import socket,sys\ntry:\n socket.create_connection((%r,%d),2)\nexcept OSError:\n sys.exit(1)" % (
            host, port)
        return subprocess.run(["nsenter", "--net=" + self.path, sys.executable, "-c", code], timeout=30).returncode == 0

    def sysctl(self, path):
        return subprocess.run(["nsenter", "--net=" + self.path, "cat", "/proc/sys/net/ipv4/" + path],
                              stdout=subprocess.PIPE, timeout=30).stdout.decode().strip()

    def stop(self):
        if self.stub:
            self.stub.kill()
            self.stub.wait(10)
            self.stub = None
        subprocess.run(["ip", "netns", "del", self.name], stderr=subprocess.DEVNULL)
        if self.resolv:
            try:
                os.unlink(self.resolv)
            except OSError:
                pass
            self.resolv = None


class UplinkAutoTest(NetDaemonTest):
    pool = 2
    nameservers = (STUB,)

    @classmethod
    def setUpClass(cls):
        cls.daemon = None
        cls.fi = fakenet.FakeInternet()
        cls.fi.start()
        cls.h = TestHost(cls.fi, cls.nameservers)
        try:
            cls.h.start()
            # default flags: no --net-uplink, no --net-dns-upstream
            cls.daemon = moatd.MoatDaemon(pool=cls.pool, netns=cls.h.path, resolv_conf=cls.h.resolv)
            # on every address of H, so that H's own address serves the API (a sandbox must not reach it)
            cls.daemon.extra_args += ["--listen", "0.0.0.0:%d" % cls.daemon.port]
            cls.daemon.start()
        except Exception:
            cls.cleanup_net()
            raise
        cls.c = cls.daemon.client

    @classmethod
    def cleanup_net(cls):
        try:
            super().cleanup_net()
        finally:
            cls.h.stop()

    def test_healthz_and_forwarding(self):
        h = self.c.request("GET", "/healthz", auth=False)[1]
        self.assertEqual(h["network"], {"internet": True, "uplink": "auto"}, h)
        self.assertIn("uplink auto: eth0", self.daemon.log_tail(200))
        self.assertEqual(self.h.sysctl("conf/eth0/forwarding"), "1", "the uplink forwards")
        self.assertEqual(self.h.sysctl("conf/all/forwarding"), "0", "forwarding is never turned on host-wide")
        self.assertEqual(self.h.sysctl("conf/lo/forwarding"), "0")

    def test_reaches_the_internet_by_ip_and_by_name(self):
        sid = self.sandbox()["id"]
        self.assertEqual((self.http_get(sid, "198.51.100.10") or "").strip(), "hello from 198.51.100.10")
        # the sandbox's resolver is moatd's, which forwards to H's stub (127.0.0.53 in H, which the
        # sandbox itself cannot reach: its own loopback has no such server)
        r = self.bash(sid, "cat /etc/resolv.conf")
        self.assertNotIn(STUB, r["stdout"], r)
        self.assertEqual(self.resolve(sid, "web.fake"), ["198.51.100.10"])
        self.assertEqual((self.http_get(sid, "web.fake") or "").strip(), "hello from 198.51.100.10")
        self.assertEqual(self.resolve(sid, "allowed.test"), [], "only the zone H's resolver answers")
        self.assertEqual(self.c.request("GET", "/v1/sandboxes/%s/network" % sid)[1]["policy"]["internet"], True)

    def test_policy_applies_to_forwarded_names(self):
        sid = self.sandbox(network={"deny": ["denied.fake"]})["id"]
        self.assertEqual(self.resolve(sid, "denied.fake"), [])
        self.assertEqual(self.resolve(sid, "other.fake"), ["198.51.100.13"])
        sid2 = self.sandbox(network={"egress": "deny", "allow": ["web.fake"]})["id"]
        self.assertFalse(self.connects(sid2, "198.51.100.13"))
        self.assertEqual(self.resolve(sid2, "web.fake"), ["198.51.100.10"])
        self.assertTrue(self.connects(sid2, "198.51.100.10"))

    def test_internet_false_reaches_nothing(self):
        sid = self.sandbox(network={"internet": False})["id"]
        self.assertFalse(self.connects(sid, "198.51.100.10"))
        self.assertEqual(self.resolve(sid, "web.fake"), [])
        self.assertFalse(self.connects(sid, fakenet.METADATA, 80))
        # and eth0 loses its carrier (set by moatd's network worker, after the create answered)
        deadline, carrier = time.time() + 10, None
        while time.time() < deadline:
            carrier = self.bash(sid, "cat /sys/class/net/eth0/carrier 2>/dev/null || echo gone")["stdout"].strip()
            if carrier in ("0", "gone"):
                break
            time.sleep(0.2)
        self.assertIn(carrier, ("0", "gone"))

    def test_host_side_addresses_out_of_reach(self):
        # each is reachable from H itself: the sandbox's failure to reach it is moat's doing
        self.assertTrue(self.h.connects(fakenet.METADATA, 80))
        self.assertTrue(self.h.connects(H_ADDR, HOST_SERVICE_PORT))
        self.assertTrue(self.h.connects(H_ADDR, self.daemon.port))
        sid = self.sandbox()["id"]
        self.assertTrue(self.connects(sid, "198.51.100.10"), "the sandbox has the internet")
        self.assertFalse(self.connects(sid, fakenet.METADATA, 80), "cloud metadata")
        self.assertFalse(self.connects(sid, H_ADDR, HOST_SERVICE_PORT), "a service on the host's address")
        self.assertFalse(self.connects(sid, H_ADDR, self.daemon.port), "moatd's API on the host's address")
        # another sandbox, whose listener answers on its own loopback
        b = self.listening_sandbox()
        self.assertFalse(self.connects(sid, self.network(b)["address"], 8099), "another sandbox")

    def listening_sandbox(self):
        b = self.sandbox()["id"]
        self.c.put_file(b, "/tmp/listen.py", PY_LISTEN.encode())
        self.c.exec(b, argv=["bash", "-c", "nohup python3 /tmp/listen.py >/dev/null 2>&1 &"])
        deadline = time.time() + 10
        while not self.connects(b, "127.0.0.1", 8099) and time.time() < deadline:
            time.sleep(0.2)
        self.assertTrue(self.connects(b, "127.0.0.1", 8099), "control: the sandbox's listener runs")
        return b

    def from_internet(self, host, port):
        """True when a TCP connection from the fake internet to host:port is established within 2 s."""
        code = "import socket,sys\ntry:\n socket.create_connection((%r,%d),2)\nexcept OSError:\n sys.exit(1)" % (
            host, port)
        r = subprocess.run(["nsenter", "--net=" + self.fi.path, sys.executable, "-c", code], timeout=30)
        self.assertIn(r.returncode, (0, 1))
        return r.returncode == 0

    def test_nothing_comes_in_from_the_internet(self):
        """The fake internet routes moat's pool to H: no new flow through the uplink reaches a
        sandbox or moat's routing namespace (the host does not become a router into them)."""
        b = self.listening_sandbox()
        addr = self.network(b)["address"]
        self.assertTrue(self.connects(b, "198.51.100.10"), "b has the internet")
        dns = self.network(b)["dns"]
        self.assertTrue(self.connects(b, dns, 53), "control: b reaches moatd's DNS over TCP")
        fakenet.run("ip", "-n", self.fi.name, "route", "replace", "10.200.0.0/16", "via", H_ADDR)
        try:
            self.assertTrue(self.from_internet(H_ADDR, self.daemon.port), "control: the fake internet reaches H")
            self.assertFalse(self.from_internet(addr, 8099), "the fake internet reached sandbox %s" % b)
            self.assertFalse(self.from_internet(dns, 53), "the fake internet reached moat's routing namespace")
        finally:
            fakenet.run("ip", "-n", self.fi.name, "route", "del", "10.200.0.0/16", check=False)
        self.assertTrue(self.connects(b, "198.51.100.10"), "b still has the internet")

    def test_host_does_not_become_a_router_for_its_lan(self):
        """H has a LAN (netns L behind lan0) and forwarded nothing before moatd: with forwarding on
        for the uplink, a new flow from the fake internet towards the LAN is still dropped."""
        self.assertEqual(self.h.sysctl("conf/all/forwarding"), "0")
        lan = "moat-ul-%d-%d" % (os.getpid(), next(_counter))
        fakenet.run("ip", "netns", "add", lan)
        self.addCleanup(subprocess.run, ["ip", "netns", "del", lan], stderr=subprocess.DEVNULL)
        fakenet.run("ip", "-n", self.h.name, "link", "add", "lan0", "type", "veth", "peer", "name", "lan1", "netns", lan)
        self.addCleanup(subprocess.run, ["ip", "-n", self.h.name, "link", "del", "lan0"], stderr=subprocess.DEVNULL)
        fakenet.run("ip", "-n", self.h.name, "addr", "add", "192.0.2.1/30", "dev", "lan0")
        fakenet.run("ip", "-n", self.h.name, "link", "set", "lan0", "up")
        fakenet.run("ip", "-n", lan, "addr", "add", "192.0.2.2/30", "dev", "lan1")
        fakenet.run("ip", "-n", lan, "link", "set", "lan1", "up")
        fakenet.run("ip", "-n", lan, "link", "set", "lo", "up")
        fakenet.run("ip", "-n", lan, "route", "add", "default", "via", "192.0.2.1")
        # a UDP receiver in L appends every datagram to a file: one-way packets count (L's replies
        # would not be forwarded back by H, lan0 forwards nothing: a TCP handshake proves nothing)
        fd, got = tempfile.mkstemp(prefix="moat-ul-got-", dir="/var/tmp")
        os.close(fd)
        self.addCleanup(os.unlink, got)
        rx = ("import socket\ns=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(('192.0.2.2', 8099))\n"
              "while True:\n d,_=s.recvfrom(100)\n f=open(%r,'ab'); f.write(d+b'\\n'); f.close()" % got)
        srv = subprocess.Popen(["nsenter", "--net=/run/netns/" + lan, sys.executable, "-c", rx])
        self.addCleanup(srv.wait, 10)
        self.addCleanup(srv.kill)

        def send(ns_path, tag):
            code = ("import socket,time\ns=socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
                    "for _ in range(5):\n s.sendto(%r, ('192.0.2.2', 8099)); time.sleep(0.1)" % tag.encode())
            subprocess.run(["nsenter", "--net=" + ns_path, sys.executable, "-c", code], timeout=30, check=True)

        def received():
            with open(got, "rb") as f:
                return f.read().split()

        deadline = time.time() + 10
        while b"from-h" not in received() and time.time() < deadline:
            send(self.h.path, "from-h")
        self.assertIn(b"from-h", received(), "control: H reaches its LAN")
        fakenet.run("ip", "-n", self.fi.name, "route", "replace", "192.0.2.0/30", "via", H_ADDR)
        self.addCleanup(fakenet.run, "ip", "-n", self.fi.name, "route", "del", "192.0.2.0/30", check=False)
        self.assertTrue(self.from_internet(H_ADDR, self.daemon.port), "control: the fake internet reaches H")
        send(self.fi.path, "from-internet")
        time.sleep(0.5)
        self.assertNotIn(b"from-internet", received(), "the fake internet reached H's LAN through H")


class UplinkDnsUpstreamsTest(UplinkAutoTest):
    """resolv.conf names a dead resolver first, then the stub; later it is rewritten."""
    nameservers = ("127.0.0.9", STUB)  # nothing listens on 127.0.0.9 in H

    def test_failover_and_reread(self):
        sid = self.sandbox()["id"]
        # the first query goes to 127.0.0.9 and is lost; 2 s later moatd moves to the stub, which
        # answers the sandbox resolver's retry
        self.assertEqual(self.resolve(sid, "web.fake"), ["198.51.100.10"])
        self.assertIn("upstream 127.0.0.9:53 did not answer", self.daemon.log_tail(200))
        self.assertEqual(self.resolve(sid, "allowed.test"), [], "the stub does not know the fake internet's zone")
        # the host's resolver changes (DHCP, a VPN): now the fake internet's own DNS server
        self.h.set_nameservers([fakenet.DNS])
        deadline = time.time() + 20
        got = []
        while time.time() < deadline:
            got = self.resolve(sid, "allowed.test")
            if got:
                break
            time.sleep(0.5)
        self.assertEqual(got, ["198.51.100.10"], "moatd re-reads resolv.conf when it changes")
        self.assertIn("upstreams from /etc/resolv.conf: %s:53" % fakenet.DNS, self.daemon.log_tail(200))

    # the parent's tests need the stub first: not repeated here
    test_healthz_and_forwarding = test_reaches_the_internet_by_ip_and_by_name = None
    test_policy_applies_to_forwarded_names = test_internet_false_reaches_nothing = None
    test_host_side_addresses_out_of_reach = test_nothing_comes_in_from_the_internet = None
    test_host_does_not_become_a_router_for_its_lan = None


class UplinkForwardingFlagTest(unittest.TestCase):
    """moatd turns the uplink's forwarding flag off again when it stops with no sandbox left, but
    only if it turned it on: a flag the host had on stays on."""

    def setUp(self):
        self.fi = fakenet.FakeInternet().start()
        self.addCleanup(self.fi.stop)
        self.h = TestHost(self.fi).start()
        self.addCleanup(self.h.stop)

    def run_moatd(self):
        d = moatd.MoatDaemon(pool=0, netns=self.h.path, resolv_conf=self.h.resolv)
        try:
            d.start()
            on = self.h.sysctl("conf/eth0/forwarding")
        finally:
            d.stop(keep_data=True)
            fakenet.remove_routing_ns(d.data_dir)
            d.force_cleanup()
        return on

    def test_flag_restored(self):
        self.assertEqual(self.h.sysctl("conf/eth0/forwarding"), "0")
        self.assertEqual(self.run_moatd(), "1")
        self.assertEqual(self.h.sysctl("conf/eth0/forwarding"), "0", "moatd turned its own flag off again")
        subprocess.run(["nsenter", "--net=" + self.h.path, "sh", "-c", "echo 1 > /proc/sys/net/ipv4/conf/eth0/forwarding"],
                       check=True, timeout=30)
        self.assertEqual(self.run_moatd(), "1")
        self.assertEqual(self.h.sysctl("conf/eth0/forwarding"), "1", "a flag the host had on stays on")
        self.assertEqual(self.h.sysctl("conf/all/forwarding"), "0")


class UplinkAutoNoRouteTest(DaemonTest):
    """A host with no IPv4 default route: auto starts with no uplink and says so."""
    pool = 0

    @classmethod
    def setUpClass(cls):
        cls.daemon = None
        cls.h = TestHost()
        try:
            cls.h.start()
            cls.daemon = moatd.MoatDaemon(pool=cls.pool, netns=cls.h.path)
            cls.daemon.start()
        except Exception:
            cls.tearDownClass()
            raise
        cls.c = cls.daemon.client

    @classmethod
    def tearDownClass(cls):
        try:
            if cls.daemon is not None:
                cls.daemon.stop()
        finally:
            cls.h.stop()

    def test_starts_without_uplink(self):
        h = self.c.request("GET", "/healthz", auth=False)[1]
        self.assertEqual(h["network"], {"internet": False, "uplink": "none"}, h)
        self.assertIn("no IPv4 default route", self.daemon.log_tail(200))
        e = self.assertApiError(400, "invalid_request", self.c.create, network={"internet": True})
        self.assertIn("no IPv4 default route", e.body["message"])
        sid = self.sandbox()["id"]
        r = self.c.exec(sid, argv=["cat", "/proc/net/dev"])
        self.assertEqual([ln.split(":")[0].strip() for ln in r["stdout"].splitlines()[2:]], ["lo"])


if __name__ == "__main__":
    unittest.main()

"""test_network.py -- sandbox networking against a fake internet in a test netns: default
egress and DNS through moatd, domain and CIDR policy (deny names, wildcards, default deny with one
allowed name), a run-time PUT taking effect on new connections, the connection log naming the right
sandbox, byte counts, internet: false, validation, a sandbox that is gone, moatd without an uplink,
and reconcile after kill -9."""

import os
import re
import sys
import time
import unittest
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
import fakenet  # noqa: E402
import moatd  # noqa: E402
from moattest import DaemonTest  # noqa: E402
from nettest import NetDaemonTest  # noqa: E402


class NetworkTest(NetDaemonTest):
    def test_default_egress_dns_and_state(self):
        sid = self.sandbox()["id"]
        self.assertEqual(self.resolve(sid, "allowed.test"), ["198.51.100.10"])
        self.assertEqual(self.http_get(sid, "allowed.test"), "hello from 198.51.100.10\n")
        net = self.network(sid)
        self.assertTrue(net["address"].startswith("10.200."), net)
        self.assertEqual(net["policy"], {"internet": True, "egress": "allow", "allow": [], "deny": []})
        r = self.bash(sid, "cat /etc/resolv.conf")
        self.assertIn("nameserver " + net["dns"], r["stdout"])
        # an unknown name is NXDOMAIN from the upstream, relayed
        self.assertEqual(self.resolve(sid, "nosuch.test"), [])

    def test_denied_name_not_resolvable_nor_reachable_by_ip(self):
        sid = self.sandbox(network={"deny": ["denied.test"]})["id"]
        self.assertEqual(self.resolve(sid, "denied.test"), [])
        # moatd learned its address when asked (upstream answer kept from the sandbox): the raw IP is dropped
        time.sleep(0.3)
        self.assertFalse(self.connects(sid, "198.51.100.11"))
        log = self.wait_log(sid, lambda e: e["destination"] == "198.51.100.11")
        hits = [e for e in log if e["destination"] == "198.51.100.11"]
        self.assertTrue(hits, log)
        self.assertEqual((hits[0]["verdict"], hits[0]["reason"], hits[0]["name"]), ("denied", "name", "denied.test"))
        # others still work
        self.assertEqual(self.http_get(sid, "allowed.test"), "hello from 198.51.100.10\n")

    def test_dns_over_tcp(self):
        """Resolvers retry truncated answers over TCP: moatd's DNS applies the same policy there."""
        sid = self.sandbox(template="code-interpreter", network={"egress": "deny", "allow": ["allowed.test"]})["id"]
        q = (
            "import socket, struct, sys\n"
            "ns = [l.split()[1] for l in open('/etc/resolv.conf') if l.startswith('nameserver')][0]\n"
            "def ask(name):\n"
            "    qn = b''.join(bytes([len(p)]) + p.encode() for p in name.split('.')) + b'\\0'\n"
            "    m = struct.pack('!HHHHHH', 9, 256, 1, 0, 0, 0) + qn + struct.pack('!HH', 1, 1)\n"
            "    s = socket.create_connection((ns, 53), 5)\n"
            "    s.sendall(struct.pack('!H', len(m)) + m)\n"
            "    n = struct.unpack('!H', s.recv(2))[0]\n"
            "    r = b''\n"
            "    while len(r) < n: r += s.recv(n - len(r))\n"
            "    rcode, an = r[3] & 15, struct.unpack('!H', r[6:8])[0]\n"
            "    ip = socket.inet_ntoa(r[-4:]) if an else '-'\n"
            "    print(name, rcode, ip)\n"
            "ask('allowed.test'); ask('other.test')\n")
        self.c.put_file(sid, "/tmp/tcpdns.py", q.encode())
        r = self.c.exec(sid, argv=["python3", "/tmp/tcpdns.py"], timeout_ms=20000)
        self.assertEqual(r["stdout"].split("\n")[:2], ["allowed.test 0 198.51.100.10", "other.test 3 -"], r)
        self.assertTrue(self.connects(sid, "198.51.100.10"), "the address learned over TCP is opened")

    def test_wildcard_with_default_deny(self):
        sid = self.sandbox(network={"egress": "deny", "allow": ["*.wild.test"]})["id"]
        self.assertEqual(self.resolve(sid, "api.wild.test"), ["198.51.100.12"])
        self.assertEqual(self.resolve(sid, "deep.api.wild.test"), ["198.51.100.12"])
        self.assertEqual(self.http_get(sid, "api.wild.test"), "hello from 198.51.100.12\n")
        self.assertEqual(self.resolve(sid, "wild.test"), [], "*.wild.test must not match wild.test")
        self.assertEqual(self.resolve(sid, "allowed.test"), [])
        self.assertFalse(self.connects(sid, "198.51.100.10"), "default deny: an unlisted address")

    def test_default_deny_one_allowed_name(self):
        sid = self.sandbox(network={"egress": "deny", "allow": ["allowed.test"]})["id"]
        self.assertEqual(self.http_get(sid, "allowed.test"), "hello from 198.51.100.10\n")
        self.assertEqual(self.resolve(sid, "other.test"), [])
        self.assertFalse(self.connects(sid, "198.51.100.13"))
        log = self.wait_log(sid, lambda e: e["destination"] == "198.51.100.13")
        verdicts = {(e["destination"], e["verdict"], e["reason"]) for e in log}
        self.assertIn(("198.51.100.10", "allowed", "name"), verdicts)
        self.assertIn(("198.51.100.13", "denied", "default"), verdicts)

    def test_cidr_rules_and_runtime_change(self):
        sid = self.sandbox()["id"]
        self.assertTrue(self.connects(sid, "198.51.100.12"))
        st = self.put_network(sid, {"deny": ["198.51.100.12/31"]})
        self.assertEqual(st["policy"]["deny"], ["198.51.100.12/31"])
        self.assertFalse(self.connects(sid, "198.51.100.12"), "new connections follow the PUT")
        self.assertFalse(self.connects(sid, "198.51.100.13"))
        self.assertTrue(self.connects(sid, "198.51.100.14"))
        self.put_network(sid, {"egress": "deny", "allow": ["198.51.100.12", "198.51.100.0/24"]})
        self.assertTrue(self.connects(sid, "198.51.100.12"))
        self.assertTrue(self.connects(sid, "198.51.100.13"))
        self.put_network(sid, {})
        self.assertTrue(self.connects(sid, "198.51.100.12"))
        self.assertEqual(self.network(sid)["policy"]["egress"], "allow")

    def test_log_names_the_right_sandbox(self):
        a = self.sandbox()["id"]
        b = self.sandbox()["id"]
        self.assertIsNotNone(self.http_get(a, "allowed.test"))
        self.assertIsNotNone(self.http_get(b, "198.51.100.13"))
        la = self.wait_log(a, lambda e: e["destination"] == "198.51.100.10")
        lb = self.wait_log(b, lambda e: e["destination"] == "198.51.100.13")
        ea = [e for e in la if e["destination"] == "198.51.100.10"]
        self.assertTrue(ea, la)
        self.assertEqual((ea[0]["sandbox_id"], ea[0]["org"], ea[0]["port"], ea[0]["protocol"], ea[0]["name"],
                          ea[0]["verdict"]), (a, "default", 80, "tcp", "allowed.test", "allowed"))
        self.assertFalse([e for e in la if e["destination"] == "198.51.100.13"], la)
        self.assertTrue(all(e["sandbox_id"] == b for e in lb), lb)
        self.assertTrue([e for e in lb if e["destination"] == "198.51.100.13" and e["name"] is None], lb)
        # since= pages on
        last = la[-1]["seq"]
        self.assertEqual(self.net_log(a, since=last), [])
        self.assertEqual(self.network(a)["connections"] >= 1, True)

    def test_bytes_counted(self):
        sid = self.sandbox()["id"]
        before = self.network(sid)
        r = self.bash(sid, "head -c 2000000 /dev/zero > /dev/tcp/%s/5001 && echo sent" % fakenet.SINK)
        self.assertIn("sent", r["stdout"], r)
        for _ in range(3):
            self.assertIsNotNone(self.http_get(sid, "allowed.test"))
        after = self.network(sid)
        self.assertGreaterEqual(after["bytes_out"] - before["bytes_out"], 2000000, after)
        self.assertGreater(after["bytes_in"], before["bytes_in"], after)

    def test_internet_false_is_loopback_only(self):
        sid = self.sandbox(network={"internet": False})["id"]
        self.assertFalse(self.connects(sid, "198.51.100.10"))
        self.assertEqual(self.resolve(sid, "allowed.test"), [])
        r = self.bash(sid, "cat /sys/class/net/eth0/carrier 2>/dev/null || echo none; "
                           "exec 3<>/dev/tcp/127.0.0.1/1 2>/dev/null; echo lo")
        self.assertIn(r["stdout"].split()[0], ("0", "none"), r)
        self.assertFalse(self.network(sid)["policy"]["internet"])
        # and back on at run time
        self.put_network(sid, {"internet": True})
        deadline = time.time() + 5
        while not self.connects(sid, "198.51.100.10") and time.time() < deadline:
            time.sleep(0.2)
        self.assertTrue(self.connects(sid, "198.51.100.10"))

    def test_bad_input(self):
        bad = [
            {"allow": ["10.0.0.0/33"]}, {"allow": ["300.1.1.1/8"]}, {"deny": ["10.0.0/8"]}, {"deny": ["10.0.0.1/8"]},
            {"allow": ["1.2.3.4/"]}, {"allow": ["exa mple.com"]}, {"allow": ["*.*.com"]}, {"allow": ["a*.com"]},
            {"allow": [""]}, {"allow": [7]}, {"allow": "x.com"}, {"deny": ["fe80::/10"]}, {"egress": "maybe"},
            {"internet": "yes"}, {"colour": "red"}, {"allow": ["a" * 64 + ".com"]}, "nope",
            {"allow": ["d%d.example.com" % i for i in range(10000)]},
        ]
        for policy in bad:
            e = self.assertApiError(400, "invalid_request", self.c.create, network=policy)
            self.assertTrue(e.body["message"].startswith("network") or "network" in e.body["message"], e.body)
        sid = self.sandbox()["id"]
        for policy in bad[:4]:
            self.assertApiError(400, "invalid_request", self.put_network, sid, policy)
        # 1,024 entries are within bounds
        self.put_network(sid, {"deny": ["d%d.example.com" % i for i in range(1000)] + ["203.0.113.%d" % i for i in range(24)]})
        gone = self.c.create()["id"]
        self.c.delete(gone)
        self.assertApiError(404, "not_found", self.put_network, gone, {"internet": False})
        self.assertApiError(404, "not_found", self.network, gone)
        self.assertApiError(404, "not_found", self.net_log, "sb-" + "0" * 17)
        self.assertApiError(400, "invalid_request", self.c.request, "GET", "/v1/sandboxes/%s/network/log" % sid,
                            query={"limit": "0"})

    def test_fork_and_wake_keep_network_and_policy(self):
        ck = self.c.request("GET", "/healthz", auth=False)[1].get("checkpoints") or {}
        if not ck.get("available"):
            self.skipTest("checkpoints unavailable on this host: %s" % ck.get("criu"))
        sid = self.sandbox(persistent=True, network={"deny": ["198.51.100.13"]})["id"]
        addr = self.network(sid)["address"]
        kids = self.c.request("POST", "/v1/sandboxes/%s/fork" % sid, body={"count": 1}, expect=201)[1]["sandboxes"]
        kid = kids[0]["id"]
        self.addCleanup(self._delete_quietly, self.c, kid)
        kn = self.network(kid)
        self.assertNotEqual(kn["address"], addr, "a fork gets its own slot")
        self.assertEqual(kn["policy"]["deny"], ["198.51.100.13"], "a fork takes its parent's policy")
        self.assertTrue(self.connects(kid, "198.51.100.10"))
        self.assertFalse(self.connects(kid, "198.51.100.13"))
        self.c.request("POST", "/v1/sandboxes/%s/hibernate" % sid, body={})
        self.c.request("POST", "/v1/sandboxes/%s/wake" % sid, body={})
        wn = self.network(sid)
        self.assertEqual(wn["policy"]["deny"], ["198.51.100.13"], "a woken sandbox keeps its policy")
        self.assertTrue(self.connects(sid, "198.51.100.10"))
        self.assertFalse(self.connects(sid, "198.51.100.13"))
        self.assertEqual(self.resolve(sid, "allowed.test"), ["198.51.100.10"], "DNS after a restore")

    def test_fork_inherits_nothing_it_should_not(self):
        """Two sandboxes never share an address; slots come back after delete."""
        addrs = set()
        for _ in range(4):
            sb = self.c.create()
            addrs.add(self.network(sb["id"])["address"])
            self.c.delete(sb["id"])
        self.assertEqual(len(addrs), 4)


class NoUplinkTest(DaemonTest):
    pool = 0

    def test_without_uplink_loopback_only(self):
        self.assertApiError(400, "invalid_request", self.c.create, network={"egress": "deny"})
        sid = self.sandbox(network={"internet": False})["id"]
        net = self.c.request("GET", "/v1/sandboxes/%s/network" % sid)[1]
        self.assertFalse(net["policy"]["internet"])
        self.assertIsNone(net["address"])
        sid2 = self.sandbox()["id"]
        r = self.c.exec(sid2, argv=["cat", "/proc/net/dev"])
        ifaces = [ln.split(":")[0].strip() for ln in r["stdout"].splitlines()[2:]]
        self.assertEqual(ifaces, ["lo"])


class NetworkReconcileTest(unittest.TestCase):
    def setUp(self):
        self.fi = fakenet.FakeInternet().start()
        self.addCleanup(self.fi.stop)
        self.d = moatd.MoatDaemon(pool=1, extra_args=NetDaemonTest.net_args(self.fi))
        self.addCleanup(lambda: fakenet.remove_routing_ns(self.d.data_dir))
        self.addCleanup(self.d.stop)
        self.d.start()
        self.c = self.d.client

    def test_kill9_reconcile_removes_orphans(self):
        live = self.c.create(network={"deny": ["198.51.100.13"]})["id"]
        dead = self.c.create(network={"deny": ["198.51.100.12"]})["id"]
        slot = {}
        for sid in (live, dead):
            a = self.c.request("GET", "/v1/sandboxes/%s/network" % sid)[1]["address"]
            slot[sid] = (int(a.split(".")[2]) * 256 + int(a.split(".")[3])) // 4
        tag = "moat-net-" + uuid.uuid4().hex[:10]
        self.c.exec(dead, argv=["bash", "-c", "nohup bash -c 'exec -a %s sleep 3600' >/dev/null 2>&1 &" % tag])
        deadline = time.time() + 5
        host = []
        while not host and time.time() < deadline:
            host = moatd.find_pids_by_cmdline(tag)
            time.sleep(0.05)
        self.assertEqual(len(host), 1)
        before = fakenet.routing_links(self.d.data_dir)
        self.assertIn("mv%d" % slot[dead], before)
        self.assertIn("198.51.100.12", fakenet.nft_list(self.d.data_dir, "set inet moat deny_net"))
        self.d.kill9()
        slot_dirs = [d for d in moatd.pid_cgroup_dirs(host[0]) if "/slot-" in d]
        self.assertTrue(slot_dirs)
        self.assertTrue(moatd.kill_cgroup_tree(re.match(r"(.*/slot-[^/]+)", slot_dirs[0]).group(1)))
        # moatd is down; the dead sandbox's veth goes with its namespace, but the warm slots the
        # crashed moatd prepared (both ends in the routing namespace) are orphans only reconcile removes
        orphans = {n: i for n, i in before.items() if n.startswith("mp")}
        self.assertTrue(orphans, before)
        self.d.start()
        self.c = self.d.client
        after = fakenet.routing_links(self.d.data_dir)
        kept = {n for n, i in orphans.items() if after.get(n) == i}
        self.assertEqual(kept, set(), "orphaned veths of the crashed moatd; log:\n" + self.d.log_tail(20))
        self.assertEqual(after.get("mv%d" % slot[live]), before["mv%d" % slot[live]], "the live sandbox's veth stays")
        sets = fakenet.nft_list(self.d.data_dir, "set inet moat deny_net")
        self.assertNotIn("198.51.100.12", sets, "the dead sandbox's nft elements are reconciled away")
        self.assertIn("198.51.100.13", sets)
        sd = os.path.join(self.d.data_dir, "host", "net")
        state = {f: open(os.path.join(sd, f)).read() for f in os.listdir(sd) if f.isdigit()}
        self.assertFalse([f for f, t in state.items() if dead in t], state)
        self.assertIn(live, state.get(str(slot[live]), ""))
        # the adopted sandbox keeps its network and its policy
        r = self.c.exec(live, argv=["bash", "-c", "timeout 2 bash -c 'exec 3<>/dev/tcp/198.51.100.10/80' && echo OPEN"])
        self.assertIn("OPEN", r["stdout"])
        r = self.c.exec(live, argv=["bash", "-c", "timeout 2 bash -c 'exec 3<>/dev/tcp/198.51.100.13/80' || echo CLOSED"])
        self.assertIn("CLOSED", r["stdout"])
        self.assertEqual(self.c.request("GET", "/v1/sandboxes/%s/network" % live)[1]["policy"]["deny"], ["198.51.100.13"])


if __name__ == "__main__":
    unittest.main()

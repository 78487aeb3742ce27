"""test_net_isolation.py -- from inside a sandbox, try to reach what the network must keep out of
reach: the cloud metadata address (also through a name resolving to it), another sandbox,
moatd's API and the host's own addresses, mining-pool ports, and DNS that bypasses moatd's policy.
Each attack has a control showing the target is really there, so a pass means moat's firewall
blocked it. Only namespaces the test made get packets (fakenet.py)."""

import os
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
import fakenet  # noqa: E402
from nettest import NetDaemonTest  # noqa: E402

PY_LISTEN = ("import socket,sys; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
             "s.bind(('0.0.0.0', 8099)); s.listen(8)\n"
             "while True:\n c,_=s.accept(); c.sendall(b'secret-of-b'); c.close()")


def host_ipv4_addresses():
    out = subprocess.run(["ip", "-o", "-4", "addr", "show"], stdout=subprocess.PIPE, timeout=30).stdout.decode()
    addrs = []
    for ln in out.split("\n"):
        f = ln.split()
        if len(f) > 3 and f[2] == "inet":
            a = f[3].split("/")[0]
            if not a.startswith("127."):
                addrs.append(a)
    return addrs


class NetIsolationTest(NetDaemonTest):
    def test_metadata_unreachable(self):
        # control: the fake metadata service answers inside the fake internet
        out = self.fi.exec(sys.executable, "-c", "import urllib.request;print(urllib.request.urlopen("
                           "'http://169.254.169.254/', timeout=5).read().decode())")
        self.assertIn("hello from 169.254.169.254", out)
        sid = self.sandbox()["id"]
        self.assertFalse(self.connects(sid, "169.254.169.254"))
        self.assertIsNone(self.http_get(sid, "169.254.169.254"))
        # a name resolving to it does not help
        self.assertEqual(self.resolve(sid, "meta.test"), ["169.254.169.254"])
        self.assertIsNone(self.http_get(sid, "meta.test"))
        # nor does an explicit allow rule
        self.put_network(sid, {"allow": ["169.254.0.0/16"]})
        self.assertFalse(self.connects(sid, "169.254.169.254"))
        log = self.wait_log(sid, lambda e: e["destination"] == "169.254.169.254")
        self.assertTrue(log)
        self.assertTrue(all(e["verdict"] == "denied" and e["reason"] == "link-local"
                            for e in log if e["destination"] == "169.254.169.254"), log)

    def test_other_sandbox_unreachable(self):
        a = self.sandbox()["id"]
        b = self.sandbox()["id"]
        self.c.put_file(b, "/tmp/listen.py", PY_LISTEN.encode())
        self.c.exec(b, argv=["bash", "-c", "nohup python3 /tmp/listen.py >/dev/null 2>&1 &"])
        deadline = time.time() + 10
        while not self.connects(b, "127.0.0.1", 8099) and time.time() < deadline:
            time.sleep(0.2)
        self.assertTrue(self.connects(b, "127.0.0.1", 8099), "control: b's listener runs")
        nb = self.network(b)
        self.assertFalse(self.connects(a, nb["address"], 8099), "a reached b's address")
        router_b = nb["address"].rsplit(".", 1)[0] + "." + str(int(nb["address"].rsplit(".", 1)[1]) - 1)
        self.assertFalse(self.connects(a, router_b, 8099), "a reached b's router side")
        # even with b's address explicitly allowed
        self.put_network(a, {"allow": [nb["address"]]})
        self.assertFalse(self.connects(a, nb["address"], 8099))
        log = self.wait_log(a, lambda e: e["destination"] == nb["address"])
        self.assertTrue([e for e in log if e["destination"] == nb["address"] and e["reason"] == "sandbox"], log)

    def test_moatd_api_and_host_addresses_unreachable(self):
        sid = self.sandbox()["id"]
        port = self.daemon.port
        net = self.network(sid)
        targets = host_ipv4_addresses() + [net["dns"], "10.200.0.5", "10.200.0.6"]
        self.assertTrue(targets)
        # the database proxy: its host listener nowhere; its sandbox listener (5432) on the DNS
        # address only (test_db_network.py); moatd's own loopback is not the sandbox's
        probes = [(a, p) for a in targets
                  for p in (port, self.daemon.db_port, 22, 80) + (() if a == net["dns"] else (5432,))]
        probes += [("127.0.0.1", port), ("127.0.0.1", self.daemon.db_port)]
        self.assertEqual(self.connected(sid, probes, wait_s=1), [])
        # control: the same probe does see what is open (the DNS address's database listener)
        self.assertEqual(self.connected(sid, probes + [(net["dns"], 5432)], wait_s=2), [(net["dns"], 5432)])
        # the DNS address answers DNS and the database proxy's sandbox listener only
        self.assertEqual(self.resolve(sid, "allowed.test"), ["198.51.100.10"])
        self.assertTrue(self.connects(sid, net["dns"], 5432, wait_s=2))

    def test_mining_ports_blocked(self):
        out = self.fi.exec(sys.executable, "-c", "import socket;s=socket.create_connection(('198.51.100.20',3333),5);"
                           "print(s.recv(100).decode())")
        self.assertIn("open 198.51.100.20 3333", out, "control: the pool port listens in the fake internet")
        sid = self.sandbox()["id"]
        self.assertFalse(self.connects(sid, fakenet.MINER, 3333))
        self.put_network(sid, {"egress": "deny", "allow": [fakenet.MINER, fakenet.WEB]})
        self.assertFalse(self.connects(sid, fakenet.MINER, 3333), "an allow rule does not open a blocked port")
        self.assertTrue(self.connects(sid, fakenet.WEB, 8080), "control: another port of an allowed host")

    def test_dns_bypass_does_not_widen_policy(self):
        sid = self.sandbox(network={"egress": "deny", "allow": ["allowed.test"]})["id"]
        # asking the upstream resolver directly: its address is not allowed
        q = ("import socket,struct;s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM);s.settimeout(2);"
             "s.sendto(struct.pack('!HHHHHH',7,256,1,0,0,0)+b'\\x05other\\x04test\\x00\\x00\\x01\\x00\\x01',"
             "('%s',53))\ntry:\n print(len(s.recv(512)))\nexcept Exception as e:\n print('blocked')" % fakenet.DNS)
        r = self.c.exec(sid, argv=["python3", "-c", q])
        self.assertEqual(r["stdout"].strip(), "blocked", r)
        self.assertFalse(self.connects(sid, "198.51.100.13"))
        self.assertEqual(self.http_get(sid, "allowed.test"), "hello from 198.51.100.10\n")

    def test_dns_label_with_nul_or_dot_is_refused(self):
        """A name whose labels hold a NUL or a dot reads as another name to moatd's policy (a C
        string) than to the upstream resolver: the labels allowed, test<NUL>, evil, test are
        allowed.test up to the NUL, and a name under evil.test (whose owner answers what they like)
        to the upstream. moatd answers FORMERR, forwards nothing, and opens no address for it."""
        sid = self.sandbox(network={"egress": "deny", "allow": ["allowed.test"]})["id"]
        q = ("import socket,struct,sys\n"
             "ns=[l.split()[1] for l in open('/etc/resolv.conf') if l.startswith('nameserver')][0]\n"
             "def ask(labels):\n"
             " s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM);s.settimeout(3)\n"
             " qn=b''.join(bytes([len(l)])+l for l in labels)+b'\\0'\n"
             " s.sendto(struct.pack('!HHHHHH',7,256,1,0,0,0)+qn+b'\\0\\1\\0\\1',(ns,53))\n"
             " r=s.recv(512);an=struct.unpack('!H',r[6:8])[0]\n"
             " print(r[3]&15, socket.inet_ntoa(r[-4:]) if an else '-')\n"
             "ask([b'allowed',b'test\\0',b'evil',b'test'])\n"
             "ask([b'allowed.test'])\n"
             "ask([b'allowed',b'test'])\n")
        r = self.c.exec(sid, argv=["python3", "-c", q], timeout_ms=20000)
        self.assertEqual(r["stdout"].split("\n")[:3], ["1 -", "1 -", "0 198.51.100.10"], r)
        self.assertFalse(self.connects(sid, "198.51.100.13"), "an address answered for the NUL name was opened")

    def test_connection_log_keeps_odd_names(self):
        """A sandbox that resolves an address through a name holding bytes that are not UTF-8 (any
        name under a domain its owner serves) and connects there is still in its connection log:
        the name is logged escaped, not dropped with the entry."""
        sid = self.sandbox()["id"]
        q = ("import socket,struct\n"
             "ns=[l.split()[1] for l in open('/etc/resolv.conf') if l.startswith('nameserver')][0]\n"
             "s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM);s.settimeout(3)\n"
             "s.sendto(struct.pack('!HHHHHH',7,256,1,0,0,0)+b'\\1\\xff\\4evil\\4test\\0\\0\\1\\0\\1',(ns,53))\n"
             "r=s.recv(512);print(r[3]&15, socket.inet_ntoa(r[-4:]))\n")
        r = self.c.exec(sid, argv=["python3", "-c", q], timeout_ms=20000)
        self.assertEqual(r["stdout"].strip(), "0 198.51.100.14", r)
        self.assertTrue(self.connects(sid, "198.51.100.14"))
        log = self.wait_log(sid, lambda e: e["destination"] == "198.51.100.14")
        hits = [e for e in log if e["destination"] == "198.51.100.14"]
        self.assertTrue(hits, "the connection is missing from the log: %r" % log)
        self.assertEqual(hits[0]["name"], "\\255.evil.test")

"""test_exhaustion.py -- a sandbox exhausts a per-user kernel resource and holds it: inotify
instances and watches, PTYs, POSIX message queue bytes, pending signals, locked (SHM_LOCK) memory,
threads. Outside the attacker, host root (a process this test starts on the host as root) and
other sandboxes -- a fresh one and, where checkpoints are available, one restored by CRIU (a fork)
-- still get theirs. The kernel charges these per user (ucounts), and charges everything in a
user namespace to the namespace's owner as well: each sandbox's user namespace must be owned by
its own host uid, never host root.

Every attacker is a sandbox of its own, deleted after its test: deleting it releases what it
held (queues and segments live as long as its IPC namespace). Counts are bounded (max= of the
probe, the kernel's own limits) and holders sleep at most HOLD_S."""

import os
import subprocess
import sys
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
import moatd  # noqa: E402
import probe  # noqa: E402
import sse  # noqa: E402
from moattest import DaemonTest  # noqa: E402

HOLD_S = 120
NS_GET_OWNER_UID = 0xB704
# What each sandbox gets for itself (docs/CONTRACT.md, src/host/linux/userns.h)
SANDBOX_PTYS = 64  # devpts max=
SANDBOX_SIGPENDING = 16384
SANDBOX_MSGQUEUE = 819200  # bytes
SANDBOX_MEMLOCK_MIB = 8


def sysctl(name):
    with open("/proc/sys/" + name.replace(".", "/")) as f:
        return int(f.read().split()[0])


def host_uid(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("Uid:"):
                return int(line.split()[1])
    return None


def userns_owner(pid):
    import fcntl
    import struct
    fd = os.open("/proc/%d/ns/user" % pid, os.O_RDONLY)
    try:
        buf = bytearray(4)
        fcntl.ioctl(fd, NS_GET_OWNER_UID, buf)
        return struct.unpack("I", buf)[0]
    finally:
        os.close(fd)


def host_try(res):
    """One unit of res taken (and given back) by a fresh root process on the host."""
    probe.build()
    r = subprocess.run([probe.host_path(), "try", res], capture_output=True, text=True, timeout=60)
    return probe.Result({"stdout": r.stdout, "stderr": r.stderr, "exit_code": r.returncode})


def checkpoints(client):
    ck = client.request("GET", "/healthz")[1].get("checkpoints") or {}
    return bool(ck.get("available")), ck.get("criu", "no checkpoints field in /healthz")


class ExhaustionTest(DaemonTest):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.tag = uuid.uuid4().hex[:10]
        cls.victims = []
        b = cls.c.create(ttl_seconds=3600, metadata={"who": "victim"})["id"]
        probe.install(cls.c, b)
        cls.victims.append(("sandbox", b))
        cls.can_ckpt, cls.criu = checkpoints(cls.c)
        if cls.can_ckpt:
            f = cls.c.request("POST", "/v1/sandboxes/%s/fork" % b, body={"count": 1}, expect=201)[1]["sandboxes"][0]
            cls.victims.append(("forked sandbox", f["id"]))

    # -- helpers --
    def attacker(self, **spec):
        return self.with_probe(ttl_seconds=900, **spec)

    def hold(self, sid, res, max_units):
        """Runs a holder of res in sid; returns (count, errno name). It is killed at cleanup."""
        tag = "hold-%s-%s" % (res, uuid.uuid4().hex[:8])
        r = self.probe(sid, "hold", res, max_units, HOLD_S, tag, timeout_ms=120000)
        self.assertTrue(r.ok, r)
        # 503: the sandbox still holds every pid it may have, so the kill cannot start; the holder
        # then ends with the sandbox, deleted by the cleanup self.sandbox() registered
        self.addCleanup(self.c.exec, sid, argv=[probe.SANDBOX_PATH, "kill", r.fields["pid"], "9"],
                        expect=(200, 404, 409, 502, 503))
        return int(r.fields["count"]), r.fields["errno"]

    def assertSandboxShares(self, sid, res):
        """The sandbox's other uids draw on the same budget: user (uid 1000) gets none either."""
        r = probe.run(self.c, sid, "try", res, user="user")
        self.assertFalse(r.ok, "a second uid of the sandbox got more %s: %r" % (res, r))

    def assertOthersGet(self, res):
        """Host root and every victim sandbox still take one unit of res."""
        r = host_try(res)
        self.assertTrue(r.ok, "host root cannot take %s while a sandbox holds them: %r" % (res, r))
        for what, sid in self.victims:
            r = self.probe(sid, "try", res)
            self.assertTrue(r.ok, "another %s (%s) cannot take %s: %r" % (what, sid, res, r))

    # -- the resources --
    def test_inotify_instances(self):
        a = self.attacker()
        n, e = self.hold(a, "inotify", 100000)
        self.assertEqual(e, "EMFILE", (n, e))
        self.assertLessEqual(n, sysctl("fs.inotify.max_user_instances"))
        self.assertSandboxShares(a, "inotify")
        self.assertOthersGet("inotify")
        # and the files/watch route of another sandbox (moat-guest's inotify)
        for what, sid in self.victims:
            self.c.mkdir(sid, "/tmp/ex-watch", parents=True)
            s = sse.open(self.c, "GET", "/v1/sandboxes/%s/files/watch" % sid, query={"path": "/tmp/ex-watch"})
            try:
                self.c.sh(sid, "touch /tmp/ex-watch/f-%s" % self.tag)
                ev = s.next(10)
                self.assertIsNotNone(ev, "%s: files/watch gave no event" % what)
                self.assertTrue(ev.data.get("path", "").endswith("f-" + self.tag), ev)
            finally:
                s.close()

    def test_inotify_watches(self):
        a = self.attacker()
        n, e = self.hold(a, "watches", 10 ** 7)
        self.assertEqual(e, "ENOSPC", (n, e))
        self.assertLessEqual(n, sysctl("fs.inotify.max_user_watches"))
        self.assertSandboxShares(a, "watches")
        self.assertOthersGet("watches")

    def test_ptys(self):
        a = self.attacker()
        n, e = self.hold(a, "pty", 100000)
        self.assertEqual((n, e), (SANDBOX_PTYS, "ENOSPC"), "a sandbox's devpts holds %d PTYs" % n)
        self.assertOthersGet("pty")
        for what, sid in self.victims:  # moat's own PTY exec in another sandbox
            r = self.c.request("POST", "/v1/sandboxes/%s/exec" % sid,
                               body={"argv": ["sleep", "30"], "background": True, "pty": {"cols": 80, "rows": 24}},
                               expect=(201, 500, 502))
            self.assertEqual(r[0], 201, "%s: PTY exec failed: %r" % (what, r))
            self.c.request("POST", "/v1/sandboxes/%s/processes/%d/signal" % (sid, r[1]["pid"]),
                           body={"signal": "SIGKILL"}, expect=(200, 204, 404))

    def test_message_queues(self):
        a = self.attacker()
        n, e = self.hold(a, "mqueue", 10000)
        self.assertEqual(e, "EMFILE", (n, e))  # RLIMIT_MSGQUEUE, not the namespace's queues_max
        self.assertLessEqual(n * 10 * 8192, SANDBOX_MSGQUEUE, "%d queues of 80 KiB" % n)
        self.assertSandboxShares(a, "mqueue")
        self.assertOthersGet("mqueue")

    def test_pending_signals(self):
        a = self.attacker()
        n, e = self.hold(a, "sigpending", 10 ** 6)
        self.assertEqual(e, "EAGAIN", (n, e))
        self.assertLessEqual(n, SANDBOX_SIGPENDING)
        self.assertSandboxShares(a, "sigpending")
        self.assertOthersGet("sigpending")

    def test_locked_memory(self):
        a = self.attacker()
        n, e = self.hold(a, "memlock", 4096)  # MiB
        self.assertIn(e, ("ENOMEM", "EPERM"), (n, e))
        self.assertLessEqual(n, SANDBOX_MEMLOCK_MIB, "a sandbox's root locked %d MiB" % n)
        self.assertOthersGet("memlock")

    def test_threads(self):
        """pids.max bounds a sandbox below the host's pid and thread space, whatever pids asks."""
        cap = min(sysctl("kernel.pid_max"), sysctl("kernel.threads-max")) // 4
        self.assertApiError(400, "invalid_request", self.c.create, pids=cap + 1)
        a = self.attacker(pids=cap, memory_mb=2048)
        n, e = self.hold(a, "threads", cap + 100)
        self.assertEqual(e, "EAGAIN", (n, e))
        self.assertLess(n, cap)
        self.assertOthersGet("threads")

    def test_sandbox_rlimits(self):
        """What the sandbox's processes start with (its init's limits, soft = hard); processes
        are bounded by the pids cgroup, never first by RLIMIT_NPROC."""
        cap = min(sysctl("kernel.pid_max"), sysctl("kernel.threads-max")) // 4
        sid = self.attacker(pids=cap)
        out = self.c.exec(sid, argv=["cat", "/proc/self/limits"])["stdout"]
        want = {"Max pending signals": SANDBOX_SIGPENDING, "Max msgqueue size": SANDBOX_MSGQUEUE,
                "Max locked memory": SANDBOX_MEMLOCK_MIB << 20, "Max processes": None}
        seen = set()
        for line in out.splitlines():
            for name, v in want.items():
                if line.startswith(name):
                    soft, hard = line[len(name):].split()[:2]
                    self.assertEqual(soft, hard, line)
                    if v is None:
                        self.assertTrue(soft == "unlimited" or int(soft) >= cap, line)
                    else:
                        self.assertEqual(soft, str(v), line)
                    seen.add(name)
        self.assertEqual(seen, set(want), out)

    # -- whose uid is charged --
    def test_user_namespaces_owned_by_the_sandbox(self):
        """Every sandbox's user namespace is owned by its own root's host uid (ucounts of all it
        holds are charged there); no sandbox can make another user namespace."""
        sids = [("sandbox", self.attacker())] + self.victims
        owners = {}
        for what, sid in sids:
            tag = "owner-" + uuid.uuid4().hex[:8]
            self.assertTrue(self.probe(sid, "sleepd", 60, tag).ok)
            pids = moatd.find_pids_by_cmdline(tag)
            self.assertEqual(len(pids), 1, pids)
            uid, owner = host_uid(pids[0]), userns_owner(pids[0])
            self.assertNotEqual(owner, 0, "%s %s: its user namespace is owned by host root" % (what, sid))
            self.assertEqual(owner, uid, "%s %s: owner %d, its root is %d" % (what, sid, owner, uid))
            owners[sid] = owner
            r = self.probe(sid, "unshare", "user")
            self.assertEqual(r.errno, "EPERM", r)
        self.assertEqual(len(set(owners.values())), len(owners), owners)

    def test_restored_attacker(self):
        """A sandbox restored by CRIU (a fork) is charged to its own uid as well."""
        if not self.can_ckpt:
            self.skipTest("checkpoints unavailable on this host: %s" % self.criu)
        src = self.attacker()
        f = self.c.request("POST", "/v1/sandboxes/%s/fork" % src, body={"count": 1}, expect=201)[1]["sandboxes"][0]
        self.addCleanup(self._delete_quietly, self.c, f["id"])
        for res, want in (("inotify", "EMFILE"), ("mqueue", "EMFILE"), ("sigpending", "EAGAIN")):
            with self.subTest(res=res):
                n, e = self.hold(f["id"], res, 10 ** 6)
                self.assertEqual(e, want, (n, e))
                r = host_try(res)
                self.assertTrue(r.ok, "host root cannot take %s while a restored sandbox holds them: %r" % (res, r))
                r = self.probe(self.victims[0][1], "try", res)
                self.assertTrue(r.ok, "another sandbox cannot take %s: %r" % (res, r))


# -- moatd's DNS: one sandbox's flood leaves the others their lookups --
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
import nettest  # noqa: E402

DNS_CLIENT = r"""
import socket, struct, sys, time
ns = [l.split()[1] for l in open('/etc/resolv.conf') if l.startswith('nameserver')][0]
def query(name, qid=7):
    qn = b''.join(bytes([len(p)]) + p.encode() for p in name.split('.')) + b'\0'
    return struct.pack('!HHHHHH', qid, 256, 1, 0, 0, 0) + qn + struct.pack('!HH', 1, 1)
def answer(r):
    rcode, an = r[3] & 15, struct.unpack('!H', r[6:8])[0]
    return '%d %s' % (rcode, socket.inet_ntoa(r[-4:]) if an else '-')
def ask_tcp(name):
    try:
        s = socket.create_connection((ns, 53), 3)
        s.settimeout(3)
        m = query(name)
        s.sendall(struct.pack('!H', len(m)) + m)
        h = s.recv(2)
        if len(h) < 2:
            return 'closed'
        n = struct.unpack('!H', h)[0]
        r = b''
        while len(r) < n:
            d = s.recv(n - len(r))
            if not d:
                return 'closed'
            r += d
        return answer(r)
    except OSError as e:
        return type(e).__name__
def ask_udp(name):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(3)
    s.sendto(query(name, 9), (ns, 53))
    try:
        return answer(s.recvfrom(4096)[0])
    except OSError as e:
        return type(e).__name__
def hold_tcp(n, secs):
    # n connections to the resolver, each reopened as soon as it closes, for secs
    conns, end = [], time.time() + secs
    while time.time() < end:
        conns = [c for c in conns if c.fileno() >= 0]
        while len(conns) < n:
            try:
                conns.append(socket.create_connection((ns, 53), 1))
            except OSError:
                break
        for c in list(conns):
            c.setblocking(False)
            try:
                if c.recv(1) == b'':
                    c.close()
            except BlockingIOError:
                pass
            except OSError:
                c.close()
        time.sleep(0.05)
def flood_udp(per_round, secs):
    # queries that the upstream never answers, as fast as the socket takes them, for secs
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    end, i = time.time() + secs, 0
    while time.time() < end:
        for _ in range(per_round):
            i += 1
            s.sendto(query('q%d.blackhole.test' % i, i & 0xffff), (ns, 53))
        time.sleep(0.2)
op = sys.argv[1]
if op == 'ask':
    f = ask_tcp if sys.argv[2] == 'tcp' else ask_udp
    print(' | '.join(f('allowed.test') for _ in range(int(sys.argv[3]))))
elif op == 'hold_tcp':
    hold_tcp(int(sys.argv[2]), float(sys.argv[3]))
elif op == 'flood_udp':
    flood_udp(int(sys.argv[2]), float(sys.argv[3]))
"""


@nettest.skip_unless_root()
class DnsExhaustionTest(nettest.NetDaemonTest):
    FLOOD_S = 60

    def dns_sandbox(self):
        sid = self.sandbox(ttl_seconds=900)["id"]
        self.c.put_file(sid, "/tmp/dnsc.py", DNS_CLIENT.encode())
        return sid

    def start_flood(self, sid, *args):
        tag = uuid.uuid4().hex[:8]
        self.bash(sid, "nohup python3 /tmp/dnsc.py %s >/dev/null 2>&1 & echo $! > /tmp/flood-%s.pid"
                  % (" ".join(str(a) for a in args), tag))
        self.addCleanup(self.c.exec, sid, argv=["bash", "-c", "kill -9 $(cat /tmp/flood-%s.pid)" % tag],
                        expect=(200, 404, 409, 502))

    def victims_ask(self, victims, proto, n=5):
        for sid in victims:
            r = self.c.exec(sid, argv=["python3", "/tmp/dnsc.py", "ask", proto, str(n)], timeout_ms=60000)
            got = r["stdout"].strip().split(" | ")
            self.assertEqual(got, ["0 198.51.100.10"] * n, "another sandbox's %s lookups: %r" % (proto, r))

    def test_tcp_connections(self):
        a, b, c = self.dns_sandbox(), self.dns_sandbox(), self.dns_sandbox()
        self.victims_ask([b], "tcp", 1)  # works before the flood
        self.start_flood(a, "hold_tcp", 100, self.FLOOD_S)
        time.sleep(3)
        self.victims_ask([b, c], "tcp")

    def test_udp_pending_queries(self):
        a, b, c = self.dns_sandbox(), self.dns_sandbox(), self.dns_sandbox()
        self.victims_ask([b], "udp", 1)
        self.start_flood(a, "flood_udp", 600, self.FLOOD_S)
        time.sleep(3)
        self.victims_ask([b, c], "udp")

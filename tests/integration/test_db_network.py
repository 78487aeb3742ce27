"""test_db_network.py -- databases reached from inside sandboxes: moatd's PostgreSQL proxy listens
on the sandboxes' service address (their DNS server's, in moatd's routing namespace) at port 5432,
and maps each connection's source address to the sandbox that holds it and so to its org.

A real moatd whose uplink is a fake internet of the test's own (nettest.py), real databases on the
postgres template, clients in sandboxes of the postgres template (psql) or of the base one (python):
- a sandbox of the database's org gets DATABASE_URL naming the service address and port 5432 (the
  database's connection.sandbox_url; connection.url stays the host's), writes a row with psql and the
  host sees it through its own listener;
- a sandbox of a second org with the first org's full, right credentials is refused with exactly the
  ErrorResponse an unknown database gets (3D000, "no such database: ..."), as is a connection from an
  address of the routing namespace that no sandbox holds;
- a sandbox whose egress policy denies everything still reaches its database (it is moatd's own
  service, as DNS is); one with internet: false has the same DATABASE_URL and reaches nothing until
  its network is turned on at run time;
- 1,000 connections from one sandbox: its per-address cap (256) held, 64 refused with 53300, the rest
  closed at once; meanwhile another org's sandbox and the host are served;
- after a kill -9 and a restart of moatd, the adopted sandbox reaches its database with the same URL.
"""

import json
import os
import shutil
import subprocess
import sys
import threading
import time
import unittest
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fakenet  # noqa: E402
from nettest import NetDaemonTest, skip_unless_root  # noqa: E402
from test_databases import DatabaseMixin  # noqa: E402

PER_IP = 256  # moatd's default --db-max-conns-per-ip
REJECTERS = 64  # PG_MAX_REJECTERS: refusals answered at once; beyond them a connection is closed

# Sends one startup packet to HOST:PORT and prints the ErrorResponse's SQLSTATE and message as JSON
# ({"C": ..., "M": ...}; {"first": B} when the answer is no ErrorResponse, {} when closed silently).
STARTUP_PY = r"""
import json, socket, struct, sys
host, port, user, db = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
body = struct.pack("!I", 196608) + b"user\0" + user.encode() + b"\0database\0" + db.encode() + b"\0\0"
s = socket.create_connection((host, port), 10)
s.sendall(struct.pack("!I", len(body) + 4) + body)
data = b""
s.settimeout(10)
while data[:1] != b"R":  # the server's authentication request: routed
    try:
        b = s.recv(65536)
    except (ConnectionResetError, socket.timeout):
        break
    if not b:
        break
    data += b
out = {}
if data[:1] == b"E":
    for part in data[5:].split(b"\0"):
        if part:
            out[chr(part[0])] = part[1:].decode(errors="replace")
elif data:
    out = {"first": data[:1].decode()}
print(json.dumps({"C": out.get("C"), "M": out.get("M")} if "C" in out else out))
"""

# Opens N connections to HOST:PORT and holds them without a byte sent; counts those the proxy
# closes at once; writes /tmp/held; waits for /tmp/release (at most HOLD_S after the first
# connect: the proxy's startup deadline is 10 s); then sends each connection still open a startup
# naming no database and tallies the SQLSTATEs of the answers.
FLOOD_PY = r"""
import json, os, resource, select, socket, struct, sys, time
host, port, n, hold = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, n + 64)), hard))
t0 = time.time()
socks = []
for i in range(n):
    s = socket.socket()
    s.settimeout(10)
    s.connect((host, port))
    socks.append(s)
opened = time.time() - t0
time.sleep(0.7)
def closed(s):
    r, _, _ = select.select([s], [], [], 0)
    if not r:
        return False
    try:
        return s.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True
gone = [s for s in socks if closed(s)]
live = [s for s in socks if s not in gone]
open("/tmp/held", "w").write(str(len(live)))
while not os.path.exists("/tmp/release") and time.time() - t0 < hold:
    time.sleep(0.05)
late = not os.path.exists("/tmp/release")
sent_at = time.time() - t0
body = struct.pack("!I", 196608) + b"user\0db_nosuch_flood\0\0"
pkt = struct.pack("!I", len(body) + 4) + body
for s in live:
    try:
        s.sendall(pkt)
    except OSError:
        pass
codes = {}
for s in live:
    data = b""
    try:
        while True:
            b = s.recv(4096)
            if not b:
                break
            data += b
    except OSError:
        pass
    code = "closed"
    if data[:1] == b"E":
        for part in data[5:].split(b"\0"):
            if part[:1] == b"C":
                code = part[1:].decode()
    codes[code] = codes.get(code, 0) + 1
    s.close()
print(json.dumps({"opened_s": round(opened, 2), "closed_at_once": len(gone), "held": len(live),
                  "codes": codes, "late": late, "sent_at_s": round(sent_at, 2)}))
"""


@skip_unless_root()
class DatabaseFromSandboxTest(DatabaseMixin, NetDaemonTest):
    pool = 0

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.other = cls.c.with_key(cls.daemon.new_org_key("org-" + uuid.uuid4().hex[:8]))

    # -- helpers --
    def client_sandbox(self, client=None, template="postgres", **spec):
        return self.sandbox(client=client, template=template, **spec)["id"]

    def sandbox_psql(self, sid, sql, url="$DATABASE_URL", client=None, timeout_s=30):
        """psql URL -Atc sql inside sid: the exec's result."""
        return (client or self.c).exec(sid, argv=[
            "bash", "-c", 'PGCONNECT_TIMEOUT=10 timeout %d psql -X "%s" -v ON_ERROR_STOP=1 -Atc "$0"' % (timeout_s, url),
            sql], timeout_ms=(timeout_s + 10) * 1000)

    def startup(self, sid, user, db=None, client=None, host=None, port=5432):
        """The proxy's answer to one startup sent from inside sid (STARTUP_PY)."""
        client = client or self.c
        client.put_file(sid, "/tmp/startup.py", STARTUP_PY.encode())
        r = client.exec(sid, argv=["python3", "/tmp/startup.py", host or self.service_addr(sid, client), str(port), user,
                                   db or user], timeout_ms=30000)
        self.assertEqual(r["exit_code"], 0, r)
        return json.loads(r["stdout"])

    def service_addr(self, sid, client=None):
        return (client or self.c).request("GET", "/v1/sandboxes/%s/network" % sid)[1]["dns"]

    def host_sees(self, d, sql):
        if shutil.which("psql"):
            return self.host_psql(d, sql).stdout
        return self.psql(d, sql)

    # -- tests --
    def test_explore_branches_write_their_own_rows(self):
        """explore with databases: "branch": each branch writes its own row into its own branch of
        the parent's database through the in-sandbox listener; the winner's branch keeps the
        winner's row only, the losers' branches go, and the parent's database has none of them."""
        d = self.database()
        self.host_psql(d, "CREATE TABLE t AS SELECT 1 AS n")
        sb = self.sandbox(template="postgres", databases=[{"id": d["id"], "env": "DATABASE_URL"}])
        branches = [{"cmd": "psql -X \"$DATABASE_URL\" -v ON_ERROR_STOP=1 -c 'INSERT INTO t VALUES (%d)' && exit %d"
                            % (10 + i, i)} for i in range(3)]
        _, r = self.c.request("POST", "/v1/sandboxes/%s/explore" % sb["id"],
                              body={"branches": branches, "databases": "branch"}, timeout=600)
        winner = r["winner"]
        self.assertTrue(winner, r)
        self.addCleanup(self._delete_quietly, self.c, winner)
        self.assertEqual({o["sandbox_id"]: o["exit_code"] for o in r["outcomes"]}[winner], 0, r)
        deadline = time.time() + 60
        while True:
            _, lst = self.c.request("GET", "/v1/databases")
            mine = [x for x in lst["databases"] if x["metadata"].get("moat.branch_of") == d["id"]]
            if len(mine) == 1:
                break
            self.assertLess(time.time(), deadline, "losers' branches still there: %r" % mine)
            time.sleep(0.3)
        self.assertEqual(self.host_psql(mine[0], "SELECT string_agg(n::text, ',' ORDER BY n) FROM t").stdout, "1,10\n")
        self.assertEqual(self.host_psql(d, "SELECT string_agg(n::text, ',' ORDER BY n) FROM t").stdout, "1\n")

    def test_same_org_writes_the_host_reads(self):
        d = self.database()
        conn = d["connection"]
        sid = self.client_sandbox(databases=[{"id": d["id"]}])
        addr = self.service_addr(sid)
        want = "postgresql://%s:%s@%s:5432/%s?sslmode=disable" % (conn["user"], conn["password"], addr,
                                                                  conn["database"])
        self.assertEqual(conn["sandbox_url"], want)
        # the host view is unchanged
        self.assertEqual(conn["url"], "postgresql://%s:%s@127.0.0.1:%d/%s?sslmode=disable" % (
            conn["user"], conn["password"], self.daemon.db_port, conn["database"]))
        self.assertEqual(self.c.sh(sid, 'printf %s "$DATABASE_URL"'), want)
        r = self.sandbox_psql(sid, "CREATE TABLE notes (body text); INSERT INTO notes VALUES ('from the sandbox')")
        self.assertEqual(r["exit_code"], 0, r)
        self.assertEqual(self.host_sees(d, "SELECT body FROM notes"), "from the sandbox\n")
        # and back: what the host writes, the sandbox reads
        self.host_sees(d, "INSERT INTO notes VALUES ('from the host')")
        r = self.sandbox_psql(sid, "SELECT body FROM notes ORDER BY body")
        self.assertEqual((r["exit_code"], r["stdout"]), (0, "from the host\nfrom the sandbox\n"), r)
        # the host's URL names the sandbox's own loopback: nothing there
        r = self.sandbox_psql(sid, "SELECT 1", url=conn["url"])
        self.assertNotEqual(r["exit_code"], 0, r)
        # a wrong password is the server's refusal (SCRAM end to end)
        r = self.sandbox_psql(sid, "SELECT 1", url=want.replace(conn["password"], "z" * 32))
        self.assertIn("password authentication failed", r["stderr"])
        # listed and read with the same connection object
        self.assertEqual(self.dget(d["id"])["connection"]["sandbox_url"], want)

    def test_another_org_is_refused_as_unknown(self):
        d = self.database()
        conn = d["connection"]
        mine = self.client_sandbox()
        theirs = self.client_sandbox(client=self.other)
        role = conn["user"]
        nosuch = "db_" + "q" * 17
        unknown = {"C": "3D000", "M": 'no such database: user "%s", database "%s"' % (nosuch, nosuch)}
        # the first org's own sandbox: its database answers (AuthenticationSASL), an unknown one 3D000
        self.assertEqual(self.startup(mine, role), {"first": "R"})
        self.assertEqual(self.startup(mine, nosuch), unknown)
        # the second org's sandbox: the first org's database is as unknown as one that does not exist
        self.assertEqual(self.startup(theirs, nosuch, client=self.other), unknown)
        self.assertEqual(self.startup(theirs, role, client=self.other),
                         {"C": "3D000", "M": 'no such database: user "%s", database "%s"' % (role, role)})
        # with psql and the full, right credentials: the same refusal
        r = self.sandbox_psql(theirs, "SELECT 1", url=conn["sandbox_url"], client=self.other)
        self.assertNotEqual(r["exit_code"], 0, r)
        self.assertIn('no such database: user "%s", database "%s"' % (role, role), r["stderr"])
        self.assertNotIn("password", r["stderr"])
        # naming the role of one and the database of another does not cross either
        self.assertEqual(self.startup(theirs, nosuch, role, client=self.other),
                         {"C": "3D000", "M": 'no such database: user "%s", database "%s"' % (nosuch, role)})
        # the database is untouched and its org still served
        r = self.sandbox_psql(mine, "SELECT 1", url=conn["sandbox_url"])
        self.assertEqual((r["exit_code"], r["stdout"]), (0, "1\n"), r)

    def test_an_address_no_sandbox_holds_is_refused(self):
        """From the routing namespace's own address (no sandbox's): every database is unknown."""
        d = self.database()
        role = d["connection"]["user"]
        sid = self.client_sandbox(template="base")
        addr = self.service_addr(sid)
        ns = fakenet.routing_ns_path(self.daemon.data_dir)
        r = subprocess.run(["nsenter", "--net=" + ns, sys.executable, "-c", STARTUP_PY, addr, "5432", role, role],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(json.loads(r.stdout),
                         {"C": "3D000", "M": 'no such database: user "%s", database "%s"' % (role, role)})
        self.assertIn("maps to no org", self.daemon.log_tail(200000))

    def test_deny_all_egress_still_reaches_its_database(self):
        d = self.database()
        sid = self.client_sandbox(network={"egress": "deny"}, databases=[{"id": d["id"]}])
        self.assertFalse(self.connects(sid, fakenet.WEB), "egress deny lets nothing else out")
        r = self.sandbox_psql(sid, "CREATE TABLE t (x int); INSERT INTO t VALUES (42)")
        self.assertEqual(r["exit_code"], 0, r)
        r = self.sandbox_psql(sid, "SELECT x FROM t")
        self.assertEqual((r["exit_code"], r["stdout"]), (0, "42\n"), r)
        self.assertEqual(self.host_sees(d, "SELECT x FROM t"), "42\n")
        # nothing else of the routing namespace opens with it: its DNS over TCP is the only other port
        self.assertFalse(self.connects(sid, self.service_addr(sid), port=5433))

    def test_internet_false_has_the_url_and_no_route(self):
        d = self.database()
        sid = self.client_sandbox(network={"internet": False}, databases=[{"id": d["id"]}])
        self.assertEqual(self.c.sh(sid, 'printf %s "$DATABASE_URL"'), d["connection"]["sandbox_url"])
        r = self.sandbox_psql(sid, "SELECT 1", timeout_s=8)
        self.assertNotEqual(r["exit_code"], 0, r)
        # its network turned on at run time: the same URL works
        self.put_network(sid, {"internet": True})
        deadline = time.time() + 15
        while True:
            r = self.sandbox_psql(sid, "SELECT 7")
            if r["exit_code"] == 0 or time.time() > deadline:
                break
            time.sleep(0.3)
        self.assertEqual((r["exit_code"], r["stdout"]), (0, "7\n"), r)

    def test_1000_connections_from_one_sandbox(self):
        a = self.database()
        b = self.database(client=self.other)
        flood = self.client_sandbox(template="base")
        addr = self.service_addr(flood)
        served = self.client_sandbox(client=self.other, databases=[{"id": b["id"]}])
        self.c.put_file(flood, "/tmp/flood.py", FLOOD_PY.encode())
        out = {}

        def run():
            out["r"] = self.c.exec(flood, argv=["python3", "/tmp/flood.py", addr, "5432", "1000", "8"],
                                   timeout_ms=90000)

        t = threading.Thread(target=run)
        t.start()
        try:
            deadline = time.time() + 30
            while self.c.exec(flood, argv=["test", "-f", "/tmp/held"])["exit_code"] != 0:
                self.assertLess(time.time(), deadline, "the flood did not get going: %r" % out)
                time.sleep(0.05)
            # while the flood holds its cap: the flooding sandbox's next connection is refused
            got = self.startup(flood, a["connection"]["user"])
            self.assertIn(got, ({}, {"C": "53300", "M": got.get("M")}), got)
            if got:
                self.assertIn("too many connections", got["M"])
            # another org's sandbox reaches its own database, and the host the flooded one
            r = self.sandbox_psql(served, "SELECT 'served'", client=self.other, timeout_s=10)
            self.assertEqual((r["exit_code"], r["stdout"]), (0, "served\n"), r)
            self.assertEqual(self.host_sees(a, "SELECT 'host'"), "host\n")
        finally:
            self.c.exec(flood, argv=["touch", "/tmp/release"])
            t.join(120)
        r = out["r"]
        self.assertEqual(r["exit_code"], 0, r)
        res = json.loads(r["stdout"])
        self.assertFalse(res["late"], "the checks outlasted the hold (the proxy's startup deadline): %r" % res)
        self.assertEqual(res["held"], PER_IP + REJECTERS, res)
        self.assertEqual(res["closed_at_once"], 1000 - PER_IP - REJECTERS, res)
        self.assertEqual(res["codes"], {"3D000": PER_IP, "53300": REJECTERS}, res)
        # the cap is given back: the flooding sandbox is served again
        deadline = time.time() + 20
        while True:
            got = self.startup(flood, a["connection"]["user"])
            if got == {"first": "R"} or time.time() > deadline:
                break
            time.sleep(0.3)
        self.assertEqual(got, {"first": "R"})

    def test_kill9_and_restart_keep_it(self):
        """A moatd killed with -9 and started again: the adopted sandbox reaches its database with
        the same URL (the listener and its firewall port are made again, the address maps to the
        adopted sandbox), and another org's sandbox is still refused."""
        d = self.database()
        sid = self.client_sandbox(databases=[{"id": d["id"]}])
        theirs = self.client_sandbox(client=self.other)
        r = self.sandbox_psql(sid, "CREATE TABLE t (x int); INSERT INTO t VALUES (1)")
        self.assertEqual(r["exit_code"], 0, r)
        self.daemon.kill9()
        self.daemon.start()
        r = self.sandbox_psql(sid, "INSERT INTO t VALUES (2)")
        self.assertEqual(r["exit_code"], 0, r)
        r = self.sandbox_psql(sid, "SELECT sum(x) FROM t")
        self.assertEqual((r["exit_code"], r["stdout"]), (0, "3\n"), r)
        role = d["connection"]["user"]
        self.assertEqual(self.startup(theirs, role, client=self.other),
                         {"C": "3D000", "M": 'no such database: user "%s", database "%s"' % (role, role)})


if __name__ == "__main__":
    unittest.main()

"""test_databases.py -- PostgreSQL databases (POST /v1/databases): created running with their own role
and password, written and read with psql inside the database's own sandbox (the server listens on that
sandbox's loopback only), committed rows survive a moatd restart, a kill -9 of moatd and idle
hibernation; delete removes the sandbox and the volume; another org's key gets 404 everywhere; bad
input is 400; a moatd killed in the middle of a create or a delete leaves nothing half-made; a sandbox
created with databases: [{id, env}] gets the connection URL in its env."""

import os
import shutil
import subprocess
import sys
import time
import unittest
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
import moatd  # noqa: E402
from moattest import DaemonTest  # noqa: E402

CREATE_TIMEOUT = 900  # the first create builds the postgres template when tests/run.py has not


def dbname():
    return "db-" + uuid.uuid4().hex[:10]


class DatabaseMixin:
    def database(self, client=None, **spec):
        """Creates a database (201 asserted), deleted when the test ends."""
        client = client or self.c
        spec.setdefault("name", dbname())
        spec.setdefault("size_mb", 64)
        _, d = client.request("POST", "/v1/databases", body=spec, expect=201, timeout=CREATE_TIMEOUT)
        self.addCleanup(self._delete_db_quietly, client is not self.c and client, d["id"])
        return d

    def _delete_db_quietly(self, client, did):
        """client False: self.c as it is then (a test that restarts moatd replaces it)."""
        try:
            (client or self.c).request("DELETE", "/v1/databases/" + did, expect=(204, 404), timeout=120)
        except Exception:
            pass

    def dget(self, did, client=None, expect=200):
        return (client or self.c).request("GET", "/v1/databases/" + did, expect=expect)[1]

    def psql(self, d, sql, client=None):
        """Runs sql with psql inside the database's own sandbox, as its role over TCP on 127.0.0.1
        (SCRAM), and returns psql's unaligned output."""
        conn = d["connection"]
        r = (client or self.c).exec(d["sandbox_id"], argv=[
            "psql", "-X", "-h", "127.0.0.1", "-p", "5432", "-U", conn["user"], "-d", conn["database"],
            "-v", "ON_ERROR_STOP=1", "-Atc", sql], env={"PGPASSWORD": conn["password"]}, timeout=120)
        self.assertEqual(r["exit_code"], 0, r)
        return r["stdout"]

    def host_psql(self, d, sql, url=None, check=True):
        """Runs the host's psql through moatd's PostgreSQL proxy with the database's URL."""
        r = subprocess.run(["psql", "-X", url or d["connection"]["url"], "-v", "ON_ERROR_STOP=1", "-Atc", sql],
                           capture_output=True, text=True, timeout=120, env=dict(os.environ, PGCONNECT_TIMEOUT="60"))
        if check:
            self.assertEqual(r.returncode, 0, r.stderr)
        return r

    def db_volumes(self, client=None):
        _, v = (client or self.c).request("GET", "/v1/volumes")
        return sorted(x["name"] for x in v["volumes"] if x["name"].startswith("db-"))

    def db_sandboxes(self, client=None):
        """Live sandboxes made for a database (their metadata names it)."""
        return [s["id"] for s in (client or self.c).list() if "moat.database" in s.get("metadata", {})]


class DatabaseTest(DatabaseMixin, DaemonTest):
    pool = 0

    def test_create_write_read(self):
        d = self.database(metadata={"team": "a"}, idle_seconds=600)
        self.assertTrue(d["id"].startswith("db-"), d)
        self.assertEqual(d["state"], "running")
        self.assertEqual((d["size_mb"], d["idle_seconds"], d["metadata"]), (64, 600, {"team": "a"}))
        conn = d["connection"]
        role = d["id"].replace("-", "_")
        self.assertEqual((conn["user"], conn["database"]), (role, role))
        self.assertEqual(len(conn["password"]), 32)
        # the proxy's address (moatd --db-listen; the tests' daemons listen on a port of their own)
        port = self.daemon.db_port
        self.assertEqual((conn["host"], conn["port"]), ("127.0.0.1", port))
        self.assertEqual(conn["url"], "postgresql://%s:%s@127.0.0.1:%d/%s?sslmode=disable" % (
            role, conn["password"], port, role))
        self.psql(d, "CREATE TABLE notes (id serial PRIMARY KEY, body text NOT NULL)")
        self.psql(d, "INSERT INTO notes (body) VALUES ('first'), ('second')")
        self.assertEqual(self.psql(d, "SELECT body FROM notes ORDER BY id"), "first\nsecond\n")
        # the role is the org's, not a superuser; fsync is on; the server listens on loopback only
        self.assertEqual(self.psql(d, "SELECT rolsuper, rolcreaterole, rolcreatedb FROM pg_roles "
                                      "WHERE rolname = current_user"), "f|f|f\n")
        self.assertEqual(self.psql(d, "SHOW fsync"), "on\n")
        self.assertEqual(self.psql(d, "SHOW listen_addresses"), "127.0.0.1\n")
        # its sandbox has loopback only
        _, net = self.c.request("GET", "/v1/sandboxes/%s/network" % d["sandbox_id"])
        self.assertIs(net["policy"]["internet"], False, net)
        # the role may not read server files or settings beyond its own
        r = self.c.exec(d["sandbox_id"], argv=["psql", "-X", "-h", "127.0.0.1", "-U", role, "-d", role, "-Atc",
                                               "SELECT pg_read_file('PG_VERSION')"],
                        env={"PGPASSWORD": conn["password"]})
        self.assertNotEqual(r["exit_code"], 0, r)
        self.assertIn("permission denied", r["stderr"])
        # the cluster is on the volume
        self.assertEqual(self.c.sh(d["sandbox_id"], "findmnt -no TARGET -T /var/lib/postgresql/data/pgdata; "
                                   "cat /var/lib/postgresql/data/pgdata/PG_VERSION"),
                         "/var/lib/postgresql/data\n15\n")
        # a wrong password is refused (SCRAM)
        bad = dict(d, connection=dict(conn, password="x" * 32))
        r = self.c.exec(d["sandbox_id"], argv=["psql", "-X", "-h", "127.0.0.1", "-U", role, "-d", role, "-Atc",
                                               "SELECT 1"], env={"PGPASSWORD": bad["connection"]["password"]})
        self.assertNotEqual(r["exit_code"], 0, r)
        self.assertIn("password authentication failed", r["stderr"])
        # listed, readable, and its volume is the org's
        self.assertEqual(self.dget(d["id"])["name"], d["name"])
        _, lst = self.c.request("GET", "/v1/databases")
        self.assertIn(d["id"], [x["id"] for x in lst["databases"]])
        self.assertIn(d["volume"], self.db_volumes())
        _, vol = self.c.request("GET", "/v1/volumes/" + d["volume"])
        self.assertEqual(vol["attached"], [{"sandbox": d["sandbox_id"], "path": "/var/lib/postgresql/data",
                                            "read_only": False}])
        # its volume cannot be deleted from under it
        self.assertApiError(409, "volume_in_use", self.c.request, "DELETE", "/v1/volumes/" + d["volume"])

    def test_delete_removes_sandbox_and_volume(self):
        d = self.database()
        self.psql(d, "CREATE TABLE t (x int)")
        self.c.request("DELETE", "/v1/databases/" + d["id"], expect=204, timeout=120)
        self.dget(d["id"], expect=404)
        self.assertNotIn(d["volume"], self.db_volumes())
        self.assertEqual(self.c.get(d["sandbox_id"])["state"], "killed")
        self.c.request("DELETE", "/v1/databases/" + d["id"], expect=404)
        # a database whose sandbox was deleted through the sandbox API is "stopped"; its delete still
        # removes the volume
        d3 = self.database()
        self.c.delete(d3["sandbox_id"])
        self.assertEqual(self.dget(d3["id"])["state"], "stopped")
        self.c.request("DELETE", "/v1/databases/" + d3["id"], expect=204, timeout=120)
        self.assertNotIn(d3["volume"], self.db_volumes())
        # the name is free again
        d2 = self.database(name=d["name"])
        self.assertNotEqual(d2["id"], d["id"])
        self.assertEqual(self.psql(d2, "SELECT count(*) FROM pg_tables WHERE tablename = 't'"), "0\n")

    def test_another_org_gets_404(self):
        d = self.database()
        other = self.c.with_key(self.daemon.new_org_key("org-" + uuid.uuid4().hex[:8]))
        for method in ("GET", "DELETE"):
            e = self.assertApiError(404, "not_found", other.request, method, "/v1/databases/" + d["id"])
            self.assertNotIn(d["connection"]["password"], str(e.body))
        _, lst = other.request("GET", "/v1/databases")
        self.assertEqual(lst["databases"], [])
        self.assertApiError(404, "not_found", other.create, databases=[{"id": d["id"]}])
        # the same name in another org is its own database
        mine = self.database(client=other, name=d["name"])
        self.assertNotEqual(mine["id"], d["id"])
        # and the first is untouched
        self.assertEqual(self.dget(d["id"])["state"], "running")
        self.assertEqual(self.psql(d, "SELECT 1"), "1\n")

    def test_bad_input(self):
        post = lambda body: self.c.request("POST", "/v1/databases", body=body)  # noqa: E731
        for name in ("a'b", 'a"b', "a b", " a", "A", "-a", "_a", "a;drop", "", "x" * 64, "a.b", "é"):
            self.assertApiError(400, "invalid_request", post, {"name": name})
        for body in ({}, {"name": 7}, {"name": "ok", "size_mb": 0}, {"name": "ok", "size_mb": -1},
                     {"name": "ok", "size_mb": "64"}, {"name": "ok", "size_mb": 1.5},
                     {"name": "ok", "size_mb": 1 << 40}, {"name": "ok", "idle_seconds": 0},
                     {"name": "ok", "metadata": {"a": 1}}, {"name": "ok", "metadata": []},
                     {"name": "ok", "branch": True}, {"name": "ok", "password": "mine"}):
            self.assertApiError(400, "invalid_request", post, body)
        # beyond the data dir's file system: 400 naming the limit
        e = self.assertApiError(400, "invalid_request", post, {"name": "ok", "size_mb": 8 * 1024 * 1024})
        self.assertIn("size_mb", e.body["message"])
        self.assertApiError(400, None, self.c.request, "POST", "/v1/databases", raw=b"[1]",
                            headers={"Content-Type": "application/json"})
        for bad in ("db-nope", "sb-aaaaaaaaaaaaaaaaa", "db-" + "a" * 17, "x"):
            self.assertApiError(404, "not_found", self.dget, bad)
        self.assertApiError(404, "not_found", self.c.create, databases=[{"id": "db-" + "a" * 17}])
        for dbs in ("x", [{"env": "X"}], [{"id": "db-x", "env": "1A"}], [{"id": "db-x", "extra": 1}], [7]):
            self.assertApiError(400, "invalid_request", self.c.create, databases=dbs)
        # nothing was made by any of them
        _, lst = self.c.request("GET", "/v1/databases")
        self.assertEqual(lst["databases"], [])
        self.assertEqual(self.db_volumes(), [])
        # a name twice is 409
        d = self.database()
        self.assertApiError(409, "already_exists", post, {"name": d["name"]})

    def test_attach_puts_the_url_in_env(self):
        a, b = self.database(), self.database()
        sid = self.sandbox(databases=[{"id": a["id"]}, {"id": b["id"], "env": "MEMORY_URL"}],
                           env={"OTHER": "1"})["id"]
        out = self.c.sh(sid, 'printf "%s\\n%s\\n%s\\n" "$DATABASE_URL" "$MEMORY_URL" "$OTHER"')
        # this moatd has no sandbox networking (--net-uplink none): no in-sandbox URL, the variable is the
        # host's (test_db_network.py has the in-sandbox one)
        self.assertIsNone(a["connection"]["sandbox_url"])
        self.assertEqual(out, "%s\n%s\n1\n" % (a["connection"]["url"], b["connection"]["url"]))

    def test_idle_hibernation(self):
        if not self.c.healthz()["checkpoints"]["available"]:
            self.skipTest("no working CRIU on this host")
        d = self.database(idle_seconds=2)
        self.psql(d, "CREATE TABLE t (x int); INSERT INTO t VALUES (1)")
        deadline = time.time() + 60
        while self.dget(d["id"])["state"] != "hibernated":
            self.assertLess(time.time(), deadline, "not hibernated: %r" % self.dget(d["id"]))
            time.sleep(0.5)
        self.assertEqual(self.c.get(d["sandbox_id"])["state"], "hibernated")
        # an exec wakes it; the committed row is there and the server takes writes again
        self.assertEqual(self.psql(d, "SELECT sum(x) FROM t"), "1\n")
        self.psql(d, "INSERT INTO t VALUES (2)")
        self.assertEqual(self.psql(d, "SELECT sum(x) FROM t"), "3\n")
        self.assertEqual(self.dget(d["id"])["state"], "running")


@unittest.skipUnless(shutil.which("psql"), "no psql on the host (Debian's postgresql-client)")
class DatabaseProxyTest(DatabaseMixin, DaemonTest):
    """Through moatd's PostgreSQL proxy (--db-listen) with the host's psql: the proxy reaches the
    server through moat_control_database_connect, which wakes a hibernated database, starts the
    server again when it died in its sandbox, and a new sandbox on the same volume when the sandbox
    is gone; committed rows survive all three."""
    pool = 0

    def test_write_and_read_through_the_proxy(self):
        d = self.database()
        self.host_psql(d, "CREATE TABLE t (x int); INSERT INTO t VALUES (1), (2)")
        self.assertEqual(self.host_psql(d, "SELECT sum(x) FROM t").stdout, "3\n")
        # what the proxy wrote is what the server has
        self.assertEqual(self.psql(d, "SELECT sum(x) FROM t"), "3\n")
        # a wrong password is the server's refusal (SCRAM end to end); an unknown role is the proxy's
        url = d["connection"]["url"].replace(d["connection"]["password"], "y" * 32)
        r = self.host_psql(d, "SELECT 1", url=url, check=False)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("password authentication failed", r.stderr)
        url = d["connection"]["url"].replace(d["connection"]["user"], "db_nosuchdatabase0000")
        r = self.host_psql(d, "SELECT 1", url=url.replace("/" + d["connection"]["database"] + "?", "/db_nosuch?"),
                           check=False)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn('no such database: user "db_nosuchdatabase0000", database "db_nosuchdatabase0000"', r.stderr)

    def test_connect_wakes_a_hibernated_database(self):
        if not self.c.healthz()["checkpoints"]["available"]:
            self.skipTest("no working CRIU on this host")
        d = self.database(idle_seconds=2)
        self.host_psql(d, "CREATE TABLE t (x int); INSERT INTO t VALUES (7)")
        deadline = time.time() + 60
        while self.dget(d["id"])["state"] != "hibernated":
            self.assertLess(time.time(), deadline, "not hibernated: %r" % self.dget(d["id"]))
            time.sleep(0.5)
        # the connection is held until the server is back, with its rows
        self.assertEqual(self.host_psql(d, "SELECT x FROM t").stdout, "7\n")
        self.assertEqual(self.dget(d["id"])["state"], "running")

    def test_an_open_connection_keeps_it_awake(self):
        """A connection the proxy reports open (conn_event) keeps the database from hibernating past
        its idle_seconds: the query outlasts them three times and ends well."""
        if not self.c.healthz()["checkpoints"]["available"]:
            self.skipTest("no working CRIU on this host")
        d = self.database(idle_seconds=2)
        p = subprocess.Popen(["psql", "-X", d["connection"]["url"], "-Atc", "SELECT pg_sleep(6)"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.addCleanup(p.kill)
        time.sleep(1)
        self.assertEqual(self.dget(d["id"])["connections"], 1)
        out, err = p.communicate(timeout=60)
        self.assertEqual(p.returncode, 0, err)
        self.assertEqual(self.dget(d["id"])["state"], "running")
        # the reaper did not even try (a checkpoint of a server with a client connection fails)
        log = self.daemon.log_tail(100000)
        self.assertNotIn("database %s: hibernate" % d["id"], log)
        self.assertNotIn("database %s: no connection" % d["id"], log)
        deadline = time.time() + 10  # the proxy reports the close once it has seen both ends go
        while self.dget(d["id"])["connections"] != 0:
            self.assertLess(time.time(), deadline, "connection still counted: %r" % self.dget(d["id"]))
            time.sleep(0.1)

    def test_server_killed_in_its_sandbox(self):
        d = self.database()
        self.host_psql(d, "CREATE TABLE t (x int); INSERT INTO t SELECT generate_series(1, 100)")
        # kill -9 of the postmaster (and so its backends): the next connection starts it again,
        # which recovers from its WAL
        self.c.sh(d["sandbox_id"], "kill -9 $(head -1 /var/lib/postgresql/data/pgdata/postmaster.pid)")
        self.assertEqual(self.host_psql(d, "SELECT count(*) FROM t").stdout, "100\n")

    def test_restarts_after_wake_and_kill(self):
        """A server killed after its sandbox was hibernated and woken (CRIU restores its pids, and the
        killed postmaster's pid in postmaster.pid soon names another process) starts again."""
        d = self.database(idle_seconds=1)
        self.host_psql(d, "CREATE TABLE t AS SELECT 7 AS n")
        for _ in range(3):
            deadline = time.time() + 120
            while self.dget(d["id"])["state"] != "hibernated":
                self.assertLess(time.time(), deadline)
                time.sleep(0.2)
            self.host_psql(d, "SELECT 1")  # woken
            self.c.sh(d["sandbox_id"], "pkill -KILL -x postgres; while pgrep -x postgres >/dev/null; do sleep 0.01; done")
            self.assertEqual(self.host_psql(d, "SELECT n FROM t").stdout, "7\n")

    def test_a_server_that_cannot_start_says_why(self):
        """A server that exits at start fails the connection at once with its own words, not after
        the 60 s start deadline; once fixed, the next connection starts it."""
        d = self.database()
        conf = "/var/lib/postgresql/data/pgdata/postgresql.conf"
        self.c.sh(d["sandbox_id"], "cp %s /tmp/conf.bak && echo 'shared_buffers = nonsense' >> %s && "
                  "kill -9 $(head -1 /var/lib/postgresql/data/pgdata/postmaster.pid)" % (conf, conf))
        t0 = time.time()
        r = self.host_psql(d, "SELECT 1", check=False)
        self.assertNotEqual(r.returncode, 0)
        self.assertLess(time.time() - t0, 30, r.stderr)
        self.assertIn("shared_buffers", r.stderr)
        self.c.sh(d["sandbox_id"], "cp /tmp/conf.bak %s" % conf)
        self.assertEqual(self.host_psql(d, "SELECT 1").stdout, "1\n")

    def test_kill9_of_its_sandbox(self):
        """kill -9 from the host of the database's sandbox's init (every process in it dies at once,
        mid-write): the next connection starts a new sandbox on the volume, and every row whose
        commit was acknowledged is there."""
        d = self.database()
        self.host_psql(d, "CREATE TABLE t (n int PRIMARY KEY)")
        acked = 0
        p = subprocess.Popen(["psql", "-X", d["connection"]["url"], "-v", "ON_ERROR_STOP=1"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)
        try:
            for n in range(1, 301):
                p.stdin.write("INSERT INTO t VALUES (%d);\n" % n)
                p.stdin.flush()
                if p.stdout.readline().strip() != "INSERT 0 1":
                    break
                acked = n
                if n == 200:
                    os.kill(self.daemon.sandbox_host(d["sandbox_id"])["pid"], 9)
        finally:
            p.kill()
            p.wait(30)
        self.assertGreaterEqual(acked, 200)
        got = self.host_psql(d, "SELECT count(*), max(n) FROM t").stdout.strip().split("|")
        self.assertGreaterEqual(int(got[1]), acked)
        self.assertEqual(int(got[0]), int(got[1]))
        self.assertNotEqual(self.dget(d["id"])["sandbox_id"], d["sandbox_id"])

    def test_sandbox_gone(self):
        d = self.database()
        self.host_psql(d, "CREATE TABLE t (x int); INSERT INTO t VALUES (5)")
        self.c.delete(d["sandbox_id"])
        self.assertEqual(self.dget(d["id"])["state"], "stopped")
        # a new sandbox on the same volume, the data as committed
        self.assertEqual(self.host_psql(d, "SELECT x FROM t").stdout, "5\n")
        now = self.dget(d["id"])
        self.assertEqual(now["state"], "running")
        self.assertNotEqual(now["sandbox_id"], d["sandbox_id"])
        self.assertEqual(len(self.db_sandboxes()), 1)


class DatabaseRestartTest(DatabaseMixin, DaemonTest):
    """Committed rows survive a moatd restart and a kill -9 of moatd (the server's sandbox is
    persistent and runs on; its data is on the volume with fsync on)."""
    pool = 0

    def restart(self, kill9):
        if kill9:
            self.daemon.kill9()
        else:
            self.daemon.terminate()
        self.daemon.start()
        self.c = self.daemon.client

    def check(self, kill9):
        d = self.database()
        self.psql(d, "CREATE TABLE t (n int PRIMARY KEY)")
        self.psql(d, "INSERT INTO t SELECT generate_series(1, 1000)")
        self.restart(kill9)
        self.assertEqual(self.dget(d["id"])["state"], "running")
        self.assertEqual(self.psql(d, "SELECT count(*), sum(n) FROM t"), "1000|500500\n")
        self.psql(d, "INSERT INTO t VALUES (1001)")
        self.restart(kill9)
        self.assertEqual(self.psql(d, "SELECT max(n) FROM t"), "1001\n")
        self.c.request("DELETE", "/v1/databases/" + d["id"], expect=204, timeout=120)
        self.assertEqual(self.db_volumes(), [])

    def test_restart(self):
        self.check(kill9=False)

    def test_kill9(self):
        self.check(kill9=True)


class DatabaseCrashTest(DatabaseMixin, unittest.TestCase):
    """moatd dies (SIGKILL at a named point, MOAT_CRASH_AT) in the middle of a create or a delete; the
    next moatd removes what was made: no database row, no volume, no live sandbox for it."""

    def setUp(self):
        self.d = moatd.MoatDaemon(pool=0)
        self.addCleanup(self.d.stop)
        self.d.start()
        self.c = self.d.client

    def crash_at(self, point, method, path, body=None):
        self.d.terminate()
        self.d.env["MOAT_CRASH_AT"] = point
        self.d.start()
        self.c = self.d.client
        try:
            reply = self.c.request(method, path, body=body, timeout=CREATE_TIMEOUT)
        except Exception as e:  # the daemon dies under it
            reply = e
        rc = self.d.proc.wait(60)
        del self.d.env["MOAT_CRASH_AT"]
        self.assertEqual(rc, -9, "moatd did not die at %s: exit %r, reply %r" % (point, rc, reply))
        self.assertIn("crash point " + point, self.d.log_tail(100000))
        self.d.start()
        self.c = self.d.client

    def assertNothingLeft(self, point):
        _, lst = self.c.request("GET", "/v1/databases")
        self.assertEqual(lst["databases"], [], point)
        self.assertEqual(self.db_volumes(), [], point)
        self.assertEqual(self.db_sandboxes(), [], point)

    def test_crash_in_create(self):
        for point in ("db_volume_made", "db_sandbox_made", "db_initdb_done"):
            with self.subTest(point=point):
                self.crash_at(point, "POST", "/v1/databases", {"name": "crash", "size_mb": 64})
                self.assertNothingLeft(point)
        # the name is usable afterwards and the database works
        d = self.database(name="crash")
        self.psql(d, "CREATE TABLE t (x int)")

    def test_crash_in_delete(self):
        d = self.database()
        self.crash_at("db_delete_killed", "DELETE", "/v1/databases/" + d["id"])
        self.assertNothingLeft("db_delete_killed")


if __name__ == "__main__":
    unittest.main()

"""test_database_branch.py -- branches of PostgreSQL databases (POST /v1/databases/{id}/branch) and
fork/explore with databases: "branch".

A branch holds its source's data as of the call (every row committed before it), under its own role,
password and volume, and diverges from there: rows written to one are not in the other, and neither's
credentials open the other. A hibernated source is branched without being woken. Under a writer
committing all the while, the branch holds every row acknowledged before the call. Each child of a
fork or explore with databases: "branch" gets its own branch (its env's URL names it), deleted once
the child is killed; explore's losers' branches go, the winner's stays. moatd killed at each step of a
branch leaves no branch, no volume, and the source running (not frozen). Bad input: 400/404/409."""

import os
import subprocess
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
import moatd  # noqa: E402
from moattest import DaemonTest  # noqa: E402
from test_databases import CREATE_TIMEOUT, DatabaseMixin, dbname  # noqa: E402


def in_sandbox(d):
    """The URL a sandbox given d has in its env."""
    return d["connection"].get("sandbox_url") or d["connection"]["url"]


class BranchMixin(DatabaseMixin):
    def branch(self, d, client=None, expect=201, **spec):
        client = client or self.c
        spec.setdefault("name", dbname())
        _, b = client.request("POST", "/v1/databases/%s/branch" % d["id"], body=spec, expect=expect,
                              timeout=CREATE_TIMEOUT)
        if expect == 201:
            self.addCleanup(self._delete_db_quietly, client is not self.c and client, b["id"])
        return b

    def wait_gone(self, did, timeout=60):
        deadline = time.time() + timeout
        while True:
            st, _ = self.c.request("GET", "/v1/databases/" + did, expect=(200, 404))
            if st == 404:
                return
            self.assertLess(time.time(), deadline, "database %s still there" % did)
            time.sleep(0.2)


class DatabaseBranchTest(BranchMixin, DaemonTest):
    pool = 0

    def test_branch_diverges(self):
        d = self.database(metadata={"team": "a"})
        self.host_psql(d, "CREATE TABLE notes (id int PRIMARY KEY, body text NOT NULL)")
        self.host_psql(d, "INSERT INTO notes SELECT g, 'row ' || g FROM generate_series(1, 1000) g")
        b = self.branch(d, metadata={"run": "1"})
        self.assertNotEqual(b["id"], d["id"])
        self.assertEqual((b["state"], b["size_mb"], b["metadata"], b["idle_seconds"]),
                         ("running", d["size_mb"], {"run": "1"}, d["idle_seconds"]))
        bc, dc = b["connection"], d["connection"]
        self.assertEqual((bc["user"], bc["database"]), (b["id"].replace("-", "_"),) * 2)
        self.assertNotEqual(bc["password"], dc["password"])
        self.assertNotEqual(b["volume"], d["volume"])
        self.assertNotEqual(b["sandbox_id"], d["sandbox_id"])
        # the source's data, under the branch's own names
        self.assertEqual(self.host_psql(b, "SELECT count(*), sum(id) FROM notes").stdout, "1000|500500\n")
        self.assertEqual(self.host_psql(b, "SELECT current_user, current_database()").stdout,
                         "%s|%s\n" % (bc["user"], bc["database"]))
        self.assertEqual(self.host_psql(b, "SELECT tableowner FROM pg_tables WHERE tablename = 'notes'").stdout,
                         bc["user"] + "\n")
        # diverging
        self.host_psql(b, "INSERT INTO notes VALUES (1001, 'branch only')")
        self.host_psql(d, "DELETE FROM notes WHERE id <= 10")
        self.assertEqual(self.host_psql(b, "SELECT count(*) FROM notes").stdout, "1001\n")
        self.assertEqual(self.host_psql(d, "SELECT count(*) FROM notes").stdout, "990\n")
        # neither's password opens the other; the source's role is gone from the branch
        url = bc["url"].replace(bc["password"], dc["password"])
        r = self.host_psql(b, "SELECT 1", url=url, check=False)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("password authentication failed", r.stderr)
        self.assertEqual(self.host_psql(b, "SELECT count(*) FROM pg_roles WHERE rolname = '%s'" % dc["user"]).stdout,
                         "0\n")
        # both listed; the source deleted, the branch lives on
        _, lst = self.c.request("GET", "/v1/databases")
        self.assertLessEqual({d["id"], b["id"]}, {x["id"] for x in lst["databases"]})
        self.c.request("DELETE", "/v1/databases/" + d["id"], expect=204, timeout=120)
        self.assertEqual(self.host_psql(b, "SELECT max(id) FROM notes").stdout, "1001\n")

    def test_branch_of_a_hibernated_database(self):
        d = self.database(idle_seconds=1)
        self.host_psql(d, "CREATE TABLE t AS SELECT 42 AS answer")
        deadline = time.time() + 120
        while self.dget(d["id"])["state"] != "hibernated":
            self.assertLess(time.time(), deadline, "not hibernated: %r" % self.dget(d["id"]))
            time.sleep(0.5)
        b = self.branch(d)
        # copied without waking its source
        self.assertEqual(self.dget(d["id"])["state"], "hibernated")
        self.assertEqual(self.host_psql(b, "SELECT answer FROM t").stdout, "42\n")
        self.assertEqual(self.host_psql(d, "SELECT answer FROM t").stdout, "42\n")

    def test_branch_under_a_committing_writer(self):
        """Every row whose COMMIT was acknowledged before the branch call is in the branch; the
        source goes on after (frozen only for the copy)."""
        d = self.database()
        self.host_psql(d, "CREATE TABLE w (n int PRIMARY KEY)")
        acked = []
        stop = threading.Event()
        errors = []

        def writer():
            # one psql session, one committed INSERT per line, each acknowledged ("INSERT 0 1")
            p = subprocess.Popen(["psql", "-X", d["connection"]["url"], "-v", "ON_ERROR_STOP=1"],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 bufsize=1)
            n = 0
            try:
                while not stop.is_set():
                    n += 1
                    p.stdin.write("INSERT INTO w VALUES (%d);\n" % n)
                    p.stdin.flush()
                    line = p.stdout.readline()
                    if line.strip() != "INSERT 0 1":
                        errors.append(line + p.stderr.read())
                        return
                    acked.append(n)
            finally:
                p.stdin.close()
                p.wait(60)

        t = threading.Thread(target=writer)
        t.start()
        try:
            while len(acked) < 200:
                time.sleep(0.05)
                self.assertFalse(errors, errors)
            before = acked[-1]
            b = self.branch(d)
            after = acked[-1]
        finally:
            stop.set()
            t.join(120)
        self.assertFalse(errors, errors)
        got = self.host_psql(b, "SELECT count(*), min(n), max(n) FROM w").stdout.strip().split("|")
        count, lo, hi = int(got[0]), int(got[1]), int(got[2])
        # 1..before are all there (each was committed before the call), nothing past what the
        # writer sent, and no gap
        self.assertEqual(lo, 1)
        self.assertGreaterEqual(hi, before)
        self.assertLessEqual(hi, after + 1)
        self.assertEqual(count, hi)
        self.assertGreater(int(self.host_psql(d, "SELECT max(n) FROM w").stdout), after - 1)
        self.assertEqual(self.c.get(d["sandbox_id"])["state"], "running")

    def test_bad_input(self):
        d = self.database()
        self.assertApiError(404, "not_found", self.c.request, "POST", "/v1/databases/db-nosuchdatabase00/branch",
                            body={"name": "x"})
        self.assertApiError(404, "not_found", self.c.request, "POST", "/v1/databases/nonsense/branch",
                            body={"name": "x"})
        for body in ({}, {"name": "has space"}, {"name": "quo'te"}, {"name": "x" * 64}, {"name": "x", "size_mb": 1},
                     {"name": "x", "size_mb": d["size_mb"] + 64}, {"name": "x", "metadata": []},
                     {"name": "x", "idle_seconds": 0}, {"name": "x", "other": 1}):
            with self.subTest(body=body):
                self.assertApiError(400, "invalid_request", self.c.request, "POST",
                                    "/v1/databases/%s/branch" % d["id"], body=body)
        self.assertApiError(409, None, self.c.request, "POST", "/v1/databases/%s/branch" % d["id"],
                            body={"name": d["name"]})
        # another org: as if it did not exist
        other = self.daemon.client.with_key(self.daemon.new_org_key("other-" + dbname()))
        self.assertApiError(404, "not_found", other.request, "POST", "/v1/databases/%s/branch" % d["id"],
                            body={"name": "mine"})
        # nothing was made by any of these
        _, lst = self.c.request("GET", "/v1/databases")
        self.assertEqual([x["id"] for x in lst["databases"] if x["id"] != d["id"]], [])
        self.assertEqual(self.db_volumes(), [d["volume"]])


class ForkBranchTest(BranchMixin, DaemonTest):
    pool = 0

    def parent_with(self, d, **spec):
        sb = self.sandbox(databases=[{"id": d["id"], "env": "DATABASE_URL"}], **spec)
        self.assertEqual(self.c.sh(sb["id"], "printenv DATABASE_URL").strip(), in_sandbox(d))
        return sb

    def child_dbs(self, parent_db):
        _, lst = self.c.request("GET", "/v1/databases")
        return [x for x in lst["databases"] if x["metadata"].get("moat.branch_of") == parent_db["id"]]

    def test_fork_gives_each_child_a_branch(self):
        d = self.database()
        self.host_psql(d, "CREATE TABLE t AS SELECT 1 AS n")
        sb = self.parent_with(d)
        _, r = self.c.request("POST", "/v1/sandboxes/%s/fork" % sb["id"], body={"count": 2, "databases": "branch"},
                              expect=201, timeout=CREATE_TIMEOUT)
        kids = [k["id"] for k in r["sandboxes"]]
        for k in kids:
            self.addCleanup(self._delete_quietly, self.c, k)
        branches = self.child_dbs(d)
        self.assertEqual(len(branches), 2, branches)
        self.assertEqual({b["metadata"]["moat.forked_from"] for b in branches}, {sb["id"]})
        urls = {in_sandbox(b): b for b in branches}
        seen = {}
        for k in kids:
            url = self.c.sh(k, "printenv DATABASE_URL").strip()
            self.assertIn(url, urls, "child %s has %s" % (k, url))
            seen[k] = urls[url]
        self.assertEqual(len({b["id"] for b in seen.values()}), 2)
        # each branch diverges on its own; the parent's database is untouched
        for i, k in enumerate(kids):
            self.host_psql(seen[k], "INSERT INTO t VALUES (%d)" % (100 + i))
        for i, k in enumerate(kids):
            self.assertEqual(self.host_psql(seen[k], "SELECT string_agg(n::text, ',' ORDER BY n) FROM t").stdout,
                             "1,%d\n" % (100 + i))
        self.assertEqual(self.host_psql(d, "SELECT count(*) FROM t").stdout, "1\n")
        # a plain fork's children share the parent's database
        _, r2 = self.c.request("POST", "/v1/sandboxes/%s/fork" % sb["id"], body={"count": 1}, expect=201,
                               timeout=CREATE_TIMEOUT)
        plain = r2["sandboxes"][0]["id"]
        self.addCleanup(self._delete_quietly, self.c, plain)
        self.assertEqual(self.c.sh(plain, "printenv DATABASE_URL").strip(), in_sandbox(d))
        # a killed child's branch goes; the other's stays
        self.c.delete(kids[0])
        self.wait_gone(seen[kids[0]]["id"])
        self.assertEqual(self.dget(seen[kids[1]]["id"])["state"], "running")
        # a child of a child branches from its own branch
        _, r3 = self.c.request("POST", "/v1/sandboxes/%s/fork" % kids[1], body={"databases": "branch"}, expect=201,
                               timeout=CREATE_TIMEOUT)
        grandchild = r3["sandboxes"][0]["id"]
        self.addCleanup(self._delete_quietly, self.c, grandchild)
        gb = self.child_dbs(seen[kids[1]])
        self.assertEqual(len(gb), 1)
        self.assertEqual(self.host_psql(gb[0], "SELECT string_agg(n::text, ',' ORDER BY n) FROM t").stdout, "1,101\n")

    def test_explore_keeps_the_winners_branch(self):
        d = self.database()
        self.host_psql(d, "CREATE TABLE t AS SELECT 1 AS n")
        sb = self.parent_with(d)
        # branch i exits i: the one that exits 0 wins (test_db_network has them write through the
        # proxy's in-sandbox listener)
        branches = [{"cmd": "printenv DATABASE_URL; exit %d" % i} for i in range(3)]
        _, r = self.c.request("POST", "/v1/sandboxes/%s/explore" % sb["id"],
                              body={"branches": branches, "databases": "branch"}, timeout=CREATE_TIMEOUT)
        winner = r["winner"]
        self.assertTrue(winner, r)
        self.addCleanup(self._delete_quietly, self.c, winner)
        out = {o["sandbox_id"]: o for o in r["outcomes"]}
        self.assertEqual(out[winner]["exit_code"], 0, r)
        winner_url = self.c.sh(winner, "printenv DATABASE_URL").strip()
        self.assertNotEqual(winner_url, in_sandbox(d))
        # the losers' branches go; the winner's stays and holds the parent's data
        deadline = time.time() + 60
        while len(self.child_dbs(d)) != 1:
            self.assertLess(time.time(), deadline, "losers' branches still there: %r" % self.child_dbs(d))
            time.sleep(0.3)
        (kept,) = self.child_dbs(d)
        self.assertEqual(in_sandbox(kept), winner_url)
        self.assertEqual(self.host_psql(kept, "SELECT n FROM t").stdout, "1\n")

    def test_bad_input(self):
        sb = self.sandbox()
        for body in ({"databases": "copy"}, {"databases": True}, {"databases": ["branch"]}):
            with self.subTest(body=body):
                self.assertApiError(400, "invalid_request", self.c.request, "POST",
                                    "/v1/sandboxes/%s/fork" % sb["id"], body=body)
        self.assertApiError(400, "invalid_request", self.c.request, "POST", "/v1/sandboxes/%s/explore" % sb["id"],
                            body={"branches": [{"cmd": "true"}], "databases": "copy"})
        # a sandbox given no database has nothing to branch
        e = self.assertApiError(400, "invalid_request", self.c.request, "POST", "/v1/sandboxes/%s/fork" % sb["id"],
                                body={"databases": "branch"})
        self.assertIn("no database", e.body["message"])
        self.assertEqual([s["id"] for s in self.c.list() if s.get("forked_from") == sb["id"]], [])


class BranchCrashTest(BranchMixin, unittest.TestCase):
    """moatd dies (SIGKILL at a named point) in the middle of a branch: the next moatd removes the
    branch's row, volume and sandbox, and the source runs (resumed when the branch had frozen it)
    with every row it had."""

    def setUp(self):
        self.d = moatd.MoatDaemon(pool=0)
        self.addCleanup(self.d.stop)
        self.d.start()
        self.c = self.d.client

    def test_crash_in_branch(self):
        d = self.database(name="source")
        self.host_psql(d, "CREATE TABLE t AS SELECT generate_series(1, 100) AS n")
        for point in ("db_branch_frozen", "db_branch_copied", "db_branch_renamed"):
            with self.subTest(point=point):
                self.d.terminate()
                self.d.env["MOAT_CRASH_AT"] = point
                self.d.start()
                self.c = self.d.client
                try:
                    reply = self.c.request("POST", "/v1/databases/%s/branch" % d["id"], body={"name": "br"},
                                           timeout=CREATE_TIMEOUT)
                except Exception as e:  # the daemon dies under it
                    reply = e
                rc = self.d.proc.wait(60)
                del self.d.env["MOAT_CRASH_AT"]
                self.assertEqual(rc, -9, "moatd did not die at %s: exit %r, reply %r" % (point, rc, reply))
                self.d.start()
                self.c = self.d.client
                _, lst = self.c.request("GET", "/v1/databases")
                self.assertEqual([x["id"] for x in lst["databases"]], [d["id"]], point)
                self.assertEqual(self.db_volumes(), [d["volume"]], point)
                self.assertEqual(self.db_sandboxes(), [d["sandbox_id"]], point)
                self.assertEqual(self.c.get(d["sandbox_id"])["state"], "running", point)
                self.assertEqual(self.host_psql(d, "SELECT count(*) FROM t").stdout, "100\n", point)
        b = self.branch(d, name="br")
        self.assertEqual(self.host_psql(b, "SELECT sum(n) FROM t").stdout, "5050\n")


if __name__ == "__main__":
    unittest.main()

"""test_sdk_python_databases.py -- the Python SDK's databases (moat.Database, client.databases,
Sandbox.create(databases=...), fork/explore databases="branch") against a real moatd, connecting with
the host's psql through moatd's PostgreSQL proxy; argument checks that send nothing (a counting server).

SdkDatabaseBranchTest needs POST /v1/databases/{id}/branch and fork/explore's databases: "branch"."""

import os
import shutil
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tests", "lib"))
sys.path.insert(0, os.path.join(REPO, "sdk", "python"))
sys.path.insert(0, HERE)
from moattest import DaemonTest  # noqa: E402
from test_databases import CREATE_TIMEOUT, DatabaseMixin, dbname  # noqa: E402
from test_sdk_python import FakeServer  # noqa: E402

import moat  # noqa: E402
from moat import Database, Sandbox  # noqa: E402

MISSING = "db-" + "a" * 17
DB_JSON = {"id": "db-bbbbbbbbbbbbbbbbb", "name": "n", "state": "running", "size_mb": 64, "idle_seconds": 300,
           "metadata": {}, "created_at": "2026-01-01T00:00:00.000Z", "volume": "db-bbbbbbbbbbbbbbbbb",
           "sandbox_id": None, "connections": 0,
           "connection": {"host": "127.0.0.1", "port": 7432, "user": "db_b", "password": "p" * 32, "database": "db_b",
                          "url": "postgresql://db_b:%s@127.0.0.1:7432/db_b?sslmode=disable" % ("p" * 32)}}


class DatabaseValidationTest(unittest.TestCase):
    """Wrong types and values fail before any request (the counting server sees none)."""

    def setUp(self):
        self.srv = FakeServer("count")
        self.addCleanup(self.srv.close)
        self.client = moat.Client(self.srv.url, "k", request_timeout=5)
        self.addCleanup(self.client.close)

    def test_bad_arguments_send_nothing(self):
        c = self.client
        db = Database._from_json(DB_JSON, c)
        sb = Sandbox({"id": "sb-bbbbbbbbbbbbbbbbb", "state": "running", "template": "base"}, c)
        cases = [
            (TypeError, lambda: Database.create(3, client=c)),
            (TypeError, lambda: Database.create(None, client=c)),
            (ValueError, lambda: Database.create("", client=c)),
            (ValueError, lambda: Database.create("a", size_mb=32, client=c)),
            (TypeError, lambda: Database.create("a", size_mb="64", client=c)),
            (TypeError, lambda: Database.create("a", size_mb=True, client=c)),
            (ValueError, lambda: Database.create("a", idle_seconds=0, client=c)),
            (ValueError, lambda: Database.create("a", idle_seconds=2592001, client=c)),
            (TypeError, lambda: Database.create("a", metadata={"a": 1}, client=c)),
            (TypeError, lambda: c.databases.create("a", metadata=["a"])),
            (TypeError, lambda: Database.get(None, client=c)),
            (ValueError, lambda: c.databases.get("")),
            (TypeError, lambda: db.branch(3)),
            (ValueError, lambda: db.branch("")),
            (TypeError, lambda: db.branch("b", metadata={"k": 2})),
            (ValueError, lambda: db.branch("b", idle_seconds=-1)),
            (ValueError, lambda: Database._from_json(DB_JSON, None).delete()),
            (ValueError, lambda: Database._from_json(DB_JSON, None).branch("b")),
            (TypeError, lambda: Sandbox.create(databases="db-x", client=c)),
            (TypeError, lambda: Sandbox.create(databases=db, client=c)),
            (TypeError, lambda: Sandbox.create(databases={"id": "db-x"}, client=c)),
            (TypeError, lambda: Sandbox.create(databases=[3], client=c)),
            (TypeError, lambda: Sandbox.create(databases=[("db-x",)], client=c)),
            (TypeError, lambda: Sandbox.create(databases=[(db, "A", "B")], client=c)),
            (ValueError, lambda: Sandbox.create(databases=[(db, "1A")], client=c)),
            (ValueError, lambda: Sandbox.create(databases=[{"id": "db-x", "extra": 1}], client=c)),
            (TypeError, lambda: Sandbox.create(databases=[{"env": "X"}], client=c)),
            (ValueError, lambda: Sandbox.create(databases=[""], client=c)),
            (TypeError, lambda: sb.fork(databases=True)),
            (TypeError, lambda: sb.explore(["true"], databases=1)),
        ]
        for i, (exc, fn) in enumerate(cases):
            with self.subTest(case=i):
                with self.assertRaises(exc) as cm:
                    fn()
                self.assertTrue(str(cm.exception), "empty message")
        self.assertEqual(self.srv.requests, 0, "a bad call reached the server")
        # the password is not in a repr
        self.assertNotIn("p" * 32, repr(db))
        self.assertEqual(db.url, DB_JSON["connection"]["url"])
        # a good call reaches the server (and its 500 is SandboxError)
        with self.assertRaises(moat.SandboxError):
            db.refresh()
        self.assertEqual(self.srv.requests, 1)


class SdkDatabaseMixin(DatabaseMixin):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.client = moat.Client("http://127.0.0.1:%d" % cls.daemon.port, cls.c.key, lifecycle_timeout=CREATE_TIMEOUT)

    def sdk_database(self, name=None, **kw):
        db = self.client.databases.create(name or dbname(), size_mb=kw.pop("size_mb", 64), **kw)
        self.addCleanup(self._delete_db_quietly, False, db.id)
        return db


@unittest.skipUnless(shutil.which("psql"), "no psql on the host (Debian's postgresql-client)")
class SdkDatabaseTest(SdkDatabaseMixin, DaemonTest):
    pool = 0

    def test_create_get_list_refresh_delete(self):
        name = dbname()
        db = self.sdk_database(name, idle_seconds=600, metadata={"team": "a"})
        self.assertIsInstance(db, Database)
        api = self.dget(db.id)
        self.assertEqual((db.id, db.name, db.state, db.size_mb, db.idle_seconds, db.metadata, db.created_at,
                          db.volume, db.sandbox_id),
                         (api["id"], name, "running", 64, 600, {"team": "a"}, api["created_at"], api["volume"],
                          api["sandbox_id"]))
        conn = api["connection"]
        self.assertEqual((db.connection.host, db.connection.port, db.connection.user, db.connection.password,
                          db.connection.database, db.url),
                         (conn["host"], conn["port"], conn["user"], conn["password"], conn["database"], conn["url"]))
        self.assertEqual(db.raw, api)
        self.assertNotIn(conn["password"], repr(db))
        # it works: the host's psql through the proxy with db.url
        self.host_psql(api, "create table t (x int); insert into t values (1), (2)", url=db.url)
        self.assertEqual(self.host_psql(api, "select sum(x) from t", url=db.url).stdout, "3\n")
        # get and list, as classmethods (client=) and through client.databases
        self.assertEqual(Database.get(db.id, client=self.client).url, db.url)
        self.assertEqual(self.client.databases.get(db.id).name, name)
        other = Database.create(dbname(), size_mb=64, client=self.client)
        self.addCleanup(self._delete_db_quietly, False, other.id)
        self.assertEqual([d.id for d in self.client.databases.list()], [db.id, other.id])
        self.assertEqual([d.id for d in Database.list(client=self.client)], [db.id, other.id])
        # refresh reads the state again: a sandbox deleted under it is "stopped"
        self.c.delete(db.sandbox_id)
        self.assertIs(db.refresh(), db)
        self.assertEqual((db.state, db.connections), ("stopped", 0))
        self.assertEqual(self.host_psql(api, "select sum(x) from t", url=db.url).stdout, "3\n")  # started again
        self.assertEqual(db.refresh().state, "running")
        self.assertNotEqual(db.sandbox_id, api["sandbox_id"])
        # delete: gone, NotFoundError after
        db.delete()
        with self.assertRaises(moat.NotFoundError) as cm:
            self.client.databases.get(db.id)
        self.assertEqual((cm.exception.status, cm.exception.code), (404, "not_found"))
        with self.assertRaises(moat.NotFoundError):
            db.delete()
        self.assertEqual([d.id for d in self.client.databases.list()], [other.id])
        self.assertEqual(self.db_volumes(), [other.volume])

    def test_sandbox_databases(self):
        a, b = self.sdk_database(), self.sdk_database()
        forms = ([a, (b, "MEMORY_URL")], [a.id, {"id": b.id, "env": "MEMORY_URL"}], [{"id": a}, (b.id, "MEMORY_URL")])
        for dbs in forms:
            with self.subTest(databases=repr(dbs)):
                with Sandbox.create(databases=dbs, env={"OTHER": "1"}, client=self.client) as sb:
                    out = sb.exec('printf "%s\\n%s\\n%s\\n" "$DATABASE_URL" "$MEMORY_URL" "$OTHER"').stdout
                    self.assertEqual(out, "%s\n%s\n1\n" % (a.url, b.url))

    def test_typed_errors(self):
        db = self.sdk_database()
        with self.assertRaises(moat.ConflictError) as cm:
            self.client.databases.create(db.name, size_mb=64)
        self.assertEqual(cm.exception.code, "already_exists")
        for name in ("Bad Name", "_a", "a.b"):
            with self.assertRaises(moat.InvalidRequestError) as cm:
                self.client.databases.create(name)
            e = self.assertApiError(400, "invalid_request", self.c.request, "POST", "/v1/databases", body={"name": name})
            self.assertEqual(cm.exception.message, e.body["message"])
        with self.assertRaises(moat.InvalidRequestError) as cm:
            self.client.databases.create("ok", size_mb=1 << 40)
        self.assertIn("size_mb", cm.exception.message)
        for bad in (MISSING, "db-nope"):
            with self.assertRaises(moat.NotFoundError):
                Database.get(bad, client=self.client)
        with self.assertRaises(moat.NotFoundError):
            Sandbox.create(databases=[MISSING], client=self.client)
        with self.assertRaises(moat.InvalidRequestError):
            Sandbox.create(databases=[db, (db, "DATABASE_URL")], client=self.client)  # a variable twice
        self.assertEqual([d.id for d in self.client.databases.list()], [db.id])


@unittest.skipUnless(shutil.which("psql"), "no psql on the host (Debian's postgresql-client)")
class SdkDatabaseBranchTest(SdkDatabaseMixin, DaemonTest):
    """Database.branch and fork/explore(databases="branch") (the branch routes)."""
    pool = 0

    def sql(self, db, q):
        return self.host_psql(db.raw, q, url=db.url).stdout

    def test_branch(self):
        src = self.sdk_database(metadata={"role": "main"})
        self.sql(src, "create table t (x int); insert into t values (1), (2)")
        name = dbname()
        br = src.branch(name, metadata={"role": "trial"}, idle_seconds=900)
        self.addCleanup(self._delete_db_quietly, False, br.id)
        self.assertIsInstance(br, Database)
        self.assertNotEqual((br.id, br.url, br.volume), (src.id, src.url, src.volume))
        self.assertEqual((br.name, br.state, br.metadata, br.idle_seconds), (name, "running", {"role": "trial"}, 900))
        self.assertIs(br.client, src.client)
        self.assertEqual(self.sql(br, "select sum(x) from t"), "3\n")
        self.sql(br, "insert into t values (10)")
        self.assertEqual((self.sql(src, "select sum(x) from t"), self.sql(br, "select sum(x) from t")), ("3\n", "13\n"))
        with self.assertRaises(moat.ConflictError):
            src.branch(name)
        with self.assertRaises(moat.InvalidRequestError):
            src.branch("Bad Name")
        br.delete()
        with self.assertRaises(moat.NotFoundError):
            br.branch(dbname())
        self.assertEqual(self.sql(src, "select sum(x) from t"), "3\n")

    def test_fork_and_explore_with_database_branches(self):
        if not self.c.healthz()["checkpoints"]["available"]:
            self.skipTest("no working CRIU on this host")
        src = self.sdk_database()
        self.sql(src, "create table t (x int); insert into t values (7)")
        with Sandbox.create(databases=[src], client=self.client) as parent:
            before = {d.id for d in self.client.databases.list()}
            kids = parent.fork(2, databases="branch")
            for k in kids:
                self.addCleanup(self._delete_quietly, self.c, k.id)
            made = [d for d in self.client.databases.list() if d.id not in before]
            for d in made:
                self.addCleanup(self._delete_db_quietly, False, d.id)
            self.assertEqual(len(made), 2)
            self.assertEqual({k.exec('printf %s "$DATABASE_URL"').stdout for k in kids}, {d.url for d in made})
            for d in made:
                self.assertEqual(self.sql(d, "select x from t"), "7\n")
            self.assertEqual(parent.exec('printf %s "$DATABASE_URL"').stdout, src.url)
            # explore: each branch runs with its own database (keep="best": all stay until chosen)
            before = {d.id for d in self.client.databases.list()}
            res = parent.explore(['printf %s "$DATABASE_URL"'] * 2, keep="best", databases="branch")
            for o in res.outcomes:
                if o.sandbox_id:
                    self.addCleanup(self._delete_quietly, self.c, o.sandbox_id)
            made = [d for d in self.client.databases.list() if d.id not in before]
            for d in made:
                self.addCleanup(self._delete_db_quietly, False, d.id)
            self.assertEqual(len(made), 2)
            self.assertEqual(sorted(o.stdout_tail for o in res.outcomes), sorted(d.url for d in made))
            for d in made:
                self.assertEqual(self.sql(d, "select x from t"), "7\n")
            with self.assertRaises(moat.InvalidRequestError):
                parent.fork(1, databases="bogus")


if __name__ == "__main__":
    unittest.main()

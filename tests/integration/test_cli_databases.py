"""test_cli_databases.py -- the moat CLI's databases (moat db ..., moat create --database, moat fork
--databases branch) against a real moatd and the host's real psql: create, ls, get, url, psql through
moatd's PostgreSQL proxy (with the password kept off psql's command line), a sandbox whose env has the
URL, rm; bad input answers the API's own message with exit 1, bad usage exit 2, a missing psql 127.

DatabaseCliBranchTest needs POST /v1/databases/{id}/branch and fork's databases: "branch"."""

import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "lib"))
sys.path.insert(0, HERE)
import moatd  # noqa: E402
from moattest import DaemonTest  # noqa: E402
from test_databases import CREATE_TIMEOUT, DatabaseMixin, dbname  # noqa: E402

MISSING = "db-" + "a" * 17  # well formed, nobody's


class CliMixin(DatabaseMixin):
    def moat(self, *args, env=None, timeout=CREATE_TIMEOUT, check=None, input=""):
        """Runs build/moat against this class's moatd with input as its stdin; check=N asserts exit
        code N (stderr shown)."""
        e = dict(os.environ, MOAT_API_URL="http://127.0.0.1:%d" % self.daemon.port, MOAT_API_KEY=self.c.key,
                 PGCONNECT_TIMEOUT="60")
        e.update(env or {})
        r = subprocess.run([os.path.join(moatd.BUILD, "moat")] + list(args), env=e, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=timeout, text=True, input=input)
        if check is not None:
            self.assertEqual(r.returncode, check, "moat %s: %s" % (" ".join(args), r.stderr))
        return r

    def cli_database(self, *args):
        """moat db create NAME ARGS... (exit 0 asserted); returns the id, deleted when the test ends."""
        r = self.moat("db", "create", *args, check=0)
        did = r.stdout.strip()
        self.assertRegex(did, r"^db-[a-z0-9]{17}$")
        self.assertEqual(r.stdout, did + "\n")
        self.addCleanup(self._delete_db_quietly, False, did)
        return did

    def api_error(self, status, method, path, body=None):
        """The API's own {code, message} for a request that fails with status."""
        e = self.assertApiError(status, None, self.c.request, method, path, body=body)
        return e.body

    def assertCliError(self, r, err):
        """moat exited 1 printing the API's message and code."""
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("moat: %s (%s)\n" % (err["message"], err["code"]), r.stderr)


@unittest.skipUnless(shutil.which("psql"), "no psql on the host (Debian's postgresql-client)")
class DatabaseCliTest(CliMixin, DaemonTest):
    pool = 0

    def test_create_ls_get_url_psql_rm(self):
        name = dbname()
        did = self.cli_database(name, "--size-mb", "64", "--idle-seconds", "600", "--meta", "team=a",
                                "--meta", "env=test")
        d = self.dget(did)
        self.assertEqual((d["name"], d["state"], d["size_mb"], d["idle_seconds"], d["metadata"]),
                         (name, "running", 64, 600, {"team": "a", "env": "test"}))
        # get: the API's JSON
        import json
        got = json.loads(self.moat("db", "get", did, check=0).stdout)
        self.assertEqual({k: v for k, v in got.items() if k != "connections"},
                         {k: v for k, v in self.dget(did).items() if k != "connections"})
        # ls: a row per database, and --json the API's list
        other = self.cli_database(dbname())
        out = self.moat("db", "ls", check=0).stdout.splitlines()
        self.assertEqual(out[0].split(), ["ID", "NAME", "STATE", "SIZE", "CONNS", "CREATED", "METADATA"])
        rows = {ln.split()[0]: ln.split() for ln in out[1:]}
        self.assertEqual(set(rows), {did, other})
        self.assertEqual(rows[did][1:5], [name, "running", "64M", "0"])
        self.assertEqual(sorted(rows[did][6].split(",")), ["env=test", "team=a"])
        self.assertEqual(rows[other][4:], ["0", self.dget(other)["created_at"], "-"])
        listed = json.loads(self.moat("db", "ls", "--json", check=0).stdout)
        self.assertEqual([x["id"] for x in listed], [did, other])
        # url: the connection URL the API gives
        self.assertEqual(self.moat("db", "url", did, check=0).stdout, d["connection"]["url"] + "\n")
        # psql through the proxy, its arguments after ID (with or without --)
        self.assertEqual(self.moat("db", "psql", did, "-X", "-Atc", "select 1", check=0).stdout, "1\n")
        self.moat("db", "psql", did, "--", "-X", "-v", "ON_ERROR_STOP=1", "-c",
                  "create table t (x int); insert into t values (41), (1)", check=0)
        self.assertEqual(self.host_psql(d, "select sum(x) from t").stdout, "42\n")
        self.assertEqual(self.moat("db", "psql", did, "-X", "-Atc", "select current_user", check=0).stdout,
                         d["connection"]["user"] + "\n")
        # psql reads moat's stdin, and its exit code is moat's (3: a script error under ON_ERROR_STOP)
        r = self.moat("db", "psql", did, "-X", "-At", "-v", "ON_ERROR_STOP=1", input="select 5;\nselect nope;\n")
        self.assertEqual((r.returncode, r.stdout), (3, "5\n"), r.stderr)
        self.assertIn('column "nope" does not exist', r.stderr)
        # rm: gone from the API, its volume too
        self.moat("db", "rm", did, other, check=0)
        self.dget(did, expect=404)
        self.dget(other, expect=404)
        self.assertEqual(self.db_volumes(), [])
        self.assertEqual(self.moat("db", "ls", check=0).stdout.splitlines()[1:], [])

    def test_password_is_not_on_psqls_command_line(self):
        did = self.cli_database(dbname())
        d = self.dget(did)
        e = dict(os.environ, MOAT_API_URL="http://127.0.0.1:%d" % self.daemon.port, MOAT_API_KEY=self.c.key)
        p = subprocess.Popen([os.path.join(moatd.BUILD, "moat"), "db", "psql", did, "-X", "-Atc",
                              "select pg_sleep(3), 'slept'"], env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
        self.addCleanup(p.kill)
        deadline = time.time() + 30
        argv = []
        while time.time() < deadline:  # moat execs psql in place: the same pid
            with open("/proc/%d/cmdline" % p.pid, "rb") as f:
                argv = f.read().split(b"\0")[:-1]
            if argv and os.path.basename(argv[0]) == b"psql":
                break
            time.sleep(0.05)
        self.assertEqual(os.path.basename(argv[0]), b"psql", argv)
        conn = d["connection"]
        self.assertEqual(argv[1].decode(), "postgresql://%s@%s:%d/%s?sslmode=disable" % (
            conn["user"], conn["host"], conn["port"], conn["database"]))
        self.assertNotIn(conn["password"].encode(), b"\0".join(argv))
        out, err = p.communicate(timeout=60)
        self.assertEqual((p.returncode, out), (0, "|slept\n"), err)

    def test_sandbox_with_database_env(self):
        a = self.cli_database(dbname())
        b = self.cli_database(dbname())
        r = self.moat("create", "--database", a, "--database", b + ":MEMORY_URL", "--env", "OTHER=1", check=0)
        sid = r.stdout.strip()
        self.addCleanup(self._delete_quietly, self.c, sid)
        out = self.c.sh(sid, 'printf "%s\\n%s\\n%s\\n" "$DATABASE_URL" "$MEMORY_URL" "$OTHER"')
        self.assertEqual(out, "%s\n%s\n1\n" % (self.dget(a)["connection"]["url"], self.dget(b)["connection"]["url"]))
        # moat run takes it too
        r = self.moat("run", "--database", a + ":DB", "--", "sh", "-c", 'echo "$DB"', check=0)
        self.assertEqual(r.stdout, self.dget(a)["connection"]["url"] + "\n")

    def test_missing_psql(self):
        did = self.cli_database(dbname())
        empty = tempfile.mkdtemp(prefix="moat-nopsql-")
        self.addCleanup(os.rmdir, empty)
        r = self.moat("db", "psql", did, "-c", "select 1", env={"PATH": empty})
        self.assertEqual(r.returncode, 127, r.stderr)
        self.assertIn("moat: psql not found on PATH", r.stderr)
        self.assertIn("moat db url %s" % did, r.stderr)
        self.assertEqual(r.stdout, "")

    def test_bad_input(self):
        # the API's messages, exit 1
        for name in ("Bad Name", "_a", "a.b", "x" * 64):
            with self.subTest(name=name):
                err = self.api_error(400, "POST", "/v1/databases", {"name": name})
                self.assertCliError(self.moat("db", "create", name), err)
        err = self.api_error(400, "POST", "/v1/databases", {"name": "ok", "size_mb": 0})
        self.assertCliError(self.moat("db", "create", "ok", "--size-mb", "0"), err)
        err = self.api_error(400, "POST", "/v1/databases", {"name": "ok", "idle_seconds": 0})
        self.assertCliError(self.moat("db", "create", "ok", "--idle-seconds", "0"), err)
        for bad in (MISSING, "db-nope", "sb-aaaaaaaaaaaaaaaaa"):
            with self.subTest(id=bad):
                err = self.api_error(404, "GET", "/v1/databases/" + bad)
                self.assertEqual(err["code"], "not_found")
                for sub in ("get", "url", "psql"):
                    self.assertCliError(self.moat("db", sub, bad), err)
                err = self.api_error(404, "DELETE", "/v1/databases/" + bad)
                r = self.moat("db", "rm", bad)
                self.assertCliError(r, err)
                self.assertIn("(while removing %s)" % bad, r.stderr)
        err = self.api_error(404, "POST", "/v1/sandboxes", {"databases": [{"id": MISSING}]})
        self.assertCliError(self.moat("create", "--database", MISSING), err)
        err = self.api_error(400, "POST", "/v1/sandboxes", {"databases": [{"id": MISSING, "env": "1A"}]})
        self.assertCliError(self.moat("create", "--database", MISSING + ":1A"), err)
        # a name twice: 409 with the API's message
        name = dbname()
        self.cli_database(name)
        err = self.api_error(409, "POST", "/v1/databases", {"name": name})
        self.assertEqual(err["code"], "already_exists")
        self.assertCliError(self.moat("db", "create", name), err)
        # bad usage: exit 2, nothing sent
        for args in (("db",), ("db", "create"), ("db", "create", "-a"), ("db", "create", "a", "b"), ("db", "create", "a", "--size-mb", "x"),
                     ("db", "create", "a", "--meta", "novalue"), ("db", "frob"), ("db", "ls", "extra"),
                     ("db", "ls", "--size-mb", "64"), ("db", "get"), ("db", "get", MISSING, MISSING),
                     ("db", "url", MISSING, "--json"), ("db", "rm"), ("db", "psql"), ("db", "psql", "-X"),
                     ("db", "branch", MISSING), ("db", "branch", MISSING, "n", "--size-mb", "64"),
                     ("create", "--database", ":X"), ("create", "--database", MISSING + ":")):
            with self.subTest(args=args):
                r = self.moat(*args)
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertIn("usage: ", r.stderr)
        self.assertEqual([x["name"] for x in self.c.request("GET", "/v1/databases")[1]["databases"]], [name])
        # help: exit 0 on stdout
        for args in (("db", "--help"), ("db", "psql", "--help"), ("help",)):
            r = self.moat(*args, check=0)
            self.assertIn("moat db create NAME" if args != ("help",) else "  db ", r.stdout)


@unittest.skipUnless(shutil.which("psql"), "no psql on the host (Debian's postgresql-client)")
class DatabaseCliBranchTest(CliMixin, DaemonTest):
    """moat db branch and moat fork/explore --databases branch (the branch routes)."""
    pool = 0

    def test_branch(self):
        src = self.cli_database(dbname())
        self.moat("db", "psql", src, "-X", "-v", "ON_ERROR_STOP=1", "-c",
                  "create table t (x int); insert into t values (1), (2)", check=0)
        name = dbname()
        r = self.moat("db", "branch", src, name, "--meta", "kind=branch", "--idle-seconds", "900", check=0)
        br = r.stdout.strip()
        self.addCleanup(self._delete_db_quietly, False, br)
        self.assertRegex(br, r"^db-[a-z0-9]{17}$")
        self.assertNotEqual(br, src)
        d = self.dget(br)
        self.assertEqual((d["name"], d["state"], d["metadata"], d["idle_seconds"]),
                         (name, "running", {"kind": "branch"}, 900))
        # the branch has the source's rows; the two change apart
        self.assertEqual(self.moat("db", "psql", br, "-X", "-Atc", "select sum(x) from t", check=0).stdout, "3\n")
        self.moat("db", "psql", br, "-X", "-c", "insert into t values (10)", check=0)
        self.assertEqual(self.moat("db", "psql", src, "-X", "-Atc", "select sum(x) from t", check=0).stdout, "3\n")
        self.assertEqual(self.moat("db", "psql", br, "-X", "-Atc", "select sum(x) from t", check=0).stdout, "13\n")
        # errors are the API's
        err = self.api_error(404, "POST", "/v1/databases/%s/branch" % MISSING, {"name": dbname()})
        self.assertCliError(self.moat("db", "branch", MISSING, dbname()), err)
        err = self.api_error(409, "POST", "/v1/databases/%s/branch" % src, {"name": name})
        self.assertCliError(self.moat("db", "branch", src, name), err)
        err = self.api_error(400, "POST", "/v1/databases/%s/branch" % src, {"name": "Bad Name"})
        self.assertCliError(self.moat("db", "branch", src, "Bad Name"), err)

    def test_fork_with_database_branches(self):
        if not self.c.healthz()["checkpoints"]["available"]:
            self.skipTest("no working CRIU on this host")
        src = self.cli_database(dbname())
        self.moat("db", "psql", src, "-X", "-c", "create table t (x int); insert into t values (7)", check=0)
        r = self.moat("create", "--database", src, check=0)
        parent = r.stdout.strip()
        self.addCleanup(self._delete_quietly, self.c, parent)
        before = {x["id"] for x in self.c.request("GET", "/v1/databases")[1]["databases"]}
        r = self.moat("fork", parent, "--count", "2", "--databases", "branch", check=0)
        kids = r.stdout.split()
        self.assertEqual(len(kids), 2, r.stdout)
        for k in kids:
            self.addCleanup(self._delete_quietly, self.c, k)
        after = {x["id"]: x for x in self.c.request("GET", "/v1/databases")[1]["databases"]}
        made = sorted(set(after) - before)
        for did in made:
            self.addCleanup(self._delete_db_quietly, False, did)
        self.assertEqual(len(made), 2, after)
        urls = {self.c.sh(k, 'printf %s "$DATABASE_URL"') for k in kids}
        self.assertEqual(urls, {after[did]["connection"]["url"] for did in made})
        for did in made:
            self.assertEqual(self.moat("db", "psql", did, "-X", "-Atc", "select x from t", check=0).stdout, "7\n")
        self.assertEqual(self.c.sh(parent, 'printf %s "$DATABASE_URL"'), self.dget(src)["connection"]["url"])
        err = self.api_error(400, "POST", "/v1/sandboxes/%s/fork" % parent, {"count": 1, "databases": "bogus"})
        self.assertCliError(self.moat("fork", parent, "--databases", "bogus"), err)


if __name__ == "__main__":
    unittest.main()

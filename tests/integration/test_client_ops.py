"""test_client_ops.py -- the SDK methods and CLI commands added for ports, network, events, metrics,
TTL, keys/me, audit, contexts, files, process stdin/resize, volumes' files and snapshots, each driven
against a real moatd (with a fake internet in a test netns, so no packet leaves the machine).

Python: moat.Sandbox.{ports, port, expose_port, unexpose_port, network, set_network, network_log,
events, metrics, set_timeout, get_snapshot}, moat.Process.resize, moat.Keys, moat.Audit.
TypeScript: sdk/typescript/test/ops.test.mjs (the same calls), run with node --test.
CLI: moat port, network, events, metrics, update, keys, me, audit, context, fs, stdin, resize, volume
get/read/write/rmfile, snapshots get."""

import http.client
import json
import os
import re
import subprocess
import sys
import time
import unittest
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "lib"))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "sdk", "python"))
import moat  # noqa: E402
import moatd  # noqa: E402
from nettest import NetDaemonTest  # noqa: E402
from test_databases import DatabaseMixin  # noqa: E402
from test_sdk_typescript import SDK, build_sdk, tap_counts  # noqa: E402

NOWHERE = 8123  # a port nothing listens on inside the sandboxes


class ClientOpsBase(NetDaemonTest):
    pool = 2

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.client = moat.Client("http://127.0.0.1:%d" % cls.daemon.port, cls.c.key)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        super().tearDownClass()

    def sdk_sandbox(self, **kw):
        sb = moat.Sandbox.create(client=self.client, ttl_seconds=600, **kw)
        self.addCleanup(self._delete_quietly, self.c, sb.id)
        return sb

    def proxy_status(self, sid, port, headers):
        """The status of GET /v1/sandboxes/SID/ports/PORT/ with these headers (no API key unless given)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.daemon.port, timeout=30)
        try:
            conn.request("GET", "/v1/sandboxes/%s/ports/%d/" % (sid, port), headers=headers)
            r = conn.getresponse()
            r.read()
            return r.status
        finally:
            conn.close()

    def moat(self, *args, check=0, input="", key=None, timeout=120):
        e = dict(os.environ, MOAT_API_URL="http://127.0.0.1:%d" % self.daemon.port, MOAT_API_KEY=key or self.c.key)
        r = subprocess.run([os.path.join(moatd.BUILD, "moat")] + list(args), env=e, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=timeout, text=True, input=input)
        if check is not None:
            self.assertEqual(r.returncode, check, "moat %s: %s%s" % (" ".join(args), r.stdout[-2000:], r.stderr))
        return r

    def moat_json(self, *args, **kw):
        return json.loads(self.moat(*args, **kw).stdout)


class PythonOpsTest(ClientOpsBase):
    def test_ports(self):
        sb = self.sdk_sandbox()
        self.assertEqual(sb.ports(), [])
        never = sb.port(NOWHERE)
        self.assertEqual((never["public"], never["token"]), (False, None))
        # without the API key nor a token: 401; with the port's token the proxy lets the request through
        # to a port where nothing listens (502)
        self.assertEqual(self.proxy_status(sb.id, NOWHERE, {}), 401)
        a = sb.expose_port(NOWHERE)
        self.assertTrue(a["token"].startswith("mpt_"), a)
        self.assertEqual(a["path"], "/v1/sandboxes/%s/ports/%d/" % (sb.id, NOWHERE))
        self.assertEqual(self.proxy_status(sb.id, NOWHERE, {"X-Moat-Port-Token": a["token"]}), 502)
        self.assertEqual([p["port"] for p in sb.ports()], [NOWHERE])
        mine = sb.expose_port(NOWHERE, token="t" * 20)
        self.assertEqual(mine["token"], "t" * 20)
        self.assertEqual(self.proxy_status(sb.id, NOWHERE, {"X-Moat-Port-Token": a["token"]}), 403)
        pub = sb.expose_port(NOWHERE, public=True)
        self.assertTrue(pub["public"])
        self.assertEqual(self.proxy_status(sb.id, NOWHERE, {}), 502)
        sb.unexpose_port(NOWHERE)
        self.assertEqual(sb.ports(), [])
        self.assertEqual(self.proxy_status(sb.id, NOWHERE, {}), 401)
        self.assertTrue(sb.port_path(NOWHERE, "/a b").endswith("/ports/%d/a%%20b" % NOWHERE))
        with self.assertRaises(ValueError):
            sb.expose_port(NOWHERE, public=True, token="t" * 20)
        with self.assertRaises(ValueError):
            sb.port(0)
        with self.assertRaises(moat.InvalidRequestError):
            sb.expose_port(NOWHERE, token="short")

    def test_network_policy_and_log(self):
        sb = self.sdk_sandbox()
        net = sb.network()
        self.assertEqual(net["policy"], {"internet": True, "egress": "allow", "allow": [], "deny": []})
        r = sb.exec(["bash", "-c", "exec 3<>/dev/tcp/198.51.100.10/80 && echo open"], timeout=10)
        self.assertIn("open", r.stdout, r)
        deadline = time.time() + 10
        while True:  # the log is written as moatd sees the connection, a moment after it
            log = sb.network_log()
            ok = [e for e in log if e["destination"] == "198.51.100.10"]
            if ok or time.time() > deadline:
                break
            time.sleep(0.2)
        self.assertTrue(ok and ok[0]["verdict"] == "allowed", log)
        got = sb.set_network(egress="deny", allow=["allowed.test"])
        self.assertEqual(got["policy"]["egress"], "deny")
        self.assertEqual(sb.network()["policy"]["allow"], ["allowed.test"])
        r = sb.exec(["bash", "-c", "timeout 3 bash -c 'exec 3<>/dev/tcp/198.51.100.13/80' && echo open || echo shut"],
                    timeout=10)
        self.assertIn("shut", r.stdout, r)
        deadline = time.time() + 10
        while time.time() < deadline:
            later = sb.network_log(since=ok[0]["seq"])
            if any(e["destination"] == "198.51.100.13" for e in later):
                break
            time.sleep(0.2)
        self.assertTrue(all(e["seq"] > ok[0]["seq"] for e in later), later)
        dropped = [e for e in later if e["destination"] == "198.51.100.13"]
        self.assertTrue(dropped and dropped[0]["verdict"] != "allowed", later)
        self.assertEqual(len(sb.network_log(limit=1)), 1)
        self.assertEqual(sb.set_network(internet=False)["policy"]["internet"], False)
        with self.assertRaises(moat.InvalidRequestError):
            sb.set_network(egress="sideways")

    def test_events(self):
        sb = self.sdk_sandbox()
        with sb.events(replay=True) as ev:
            first = ev.next(timeout=30)
            self.assertEqual((first.name, first.data["event"]), ("state", "created"), first)
            seen = [first.data["event"]]
            while "running" not in seen:
                seen.append(ev.next(timeout=30).data["event"])
            sb.pause()
            e = ev.next(timeout=30)
            while e.name != "state":
                e = ev.next(timeout=30)
            self.assertEqual((e.data["event"], e.data["state"]), ("paused", "paused"), e)
            sb.resume()
        with sb.events() as live:  # no replay: the next event is the kill
            sb.kill()
            e = live.next(timeout=30)
            while e is not None and e.name != "state":
                e = live.next(timeout=30)
            self.assertEqual(e.data["state"], "killed", e)

    def test_metrics_and_set_timeout(self):
        sb = self.sdk_sandbox()
        sb.exec("head -c 30000000 /dev/zero > /tmp/fill && sync")
        m = sb.metrics()
        self.assertEqual((m["sandbox_id"], m["state"], m["sampled"]), (sb.id, "running", True), m)
        self.assertGreater(m["memory"]["used_bytes"], 0, m)
        self.assertGreater(m["memory"]["limit_bytes"], m["memory"]["used_bytes"], m)
        before = self.c.get(sb.id)["expires_at"]
        info = sb.set_timeout(120)
        self.assertEqual(info.ttl_seconds, 120)
        self.assertNotEqual(info.expires_at, before)
        self.assertEqual(self.c.get(sb.id)["ttl_seconds"], 120)
        with self.assertRaises(ValueError):
            sb.set_timeout(0)

    def test_keys_me_and_audit(self):
        me = moat.Keys.me(client=self.client)
        self.assertEqual(me["key"]["role"], "admin", me)
        before = [k["id"] for k in moat.Keys.list(client=self.client)]
        self.assertIn(me["key"]["id"], before)
        name = "sdk-" + uuid.uuid4().hex[:8]
        k = moat.Keys.create(name, role="readonly", client=self.client)
        self.assertTrue(k["key"].startswith("moat_"), k)
        ro = moat.Client("http://127.0.0.1:%d" % self.daemon.port, k["key"])
        try:
            self.assertEqual(moat.Keys.me(client=ro)["key"]["name"], name)
            with self.assertRaises(moat.MoatError) as cm:
                moat.Keys.create("nope", client=ro)
            self.assertEqual(cm.exception.status, 403)
            self.assertIn(k["id"], [x["id"] for x in moat.Keys.list(client=self.client)])
            moat.Keys.delete(k["id"], client=self.client)
            with self.assertRaises(moat.AuthenticationError):
                moat.Keys.me(client=ro)
        finally:
            ro.close()
        page = moat.Audit.list(target=k["id"], client=self.client)
        methods = sorted(e["method"] for e in page["entries"])
        self.assertEqual(methods, ["DELETE"], page)  # the create's target is the new key's id only afterwards
        everything = list(moat.Audit.iter(client=self.client))
        self.assertTrue(any(e["method"] == "POST" and e["path"] == "/v1/keys" and e["status"] == 201 for e in everything))
        one = moat.Audit.list(limit=1, client=self.client)
        self.assertEqual(len(one["entries"]), 1)
        if one["next"]:
            two = moat.Audit.list(limit=1, cursor=one["next"], client=self.client)
            self.assertGreater(two["entries"][0]["seq"], one["entries"][0]["seq"])
        with self.assertRaises(ValueError):
            moat.Keys.create("x", role="root", client=self.client)

    def test_process_resize_and_get_snapshot(self):
        sb = self.sdk_sandbox()
        r = self.c.exec(sb.id, argv=["bash", "-c", "sleep 2; stty size"], background=True, pty={"cols": 80, "rows": 24},
                        expect=201)
        p = moat.Process(sb, r["pid"])
        p.resize(101, 41)
        out = []
        self.assertEqual(p.stream(on_stdout=out.append, timeout=30), 0)
        self.assertIn("41 101", "".join(out))
        with self.assertRaises(ValueError):
            p.resize(0, 10)
        with self.assertRaises(moat.NotFoundError):
            moat.Sandbox.get_snapshot("snap-" + "0" * 17, client=self.client)


class SnapshotGetTest(ClientOpsBase):
    def test_get_snapshot_python_and_cli(self):
        if not self.c.healthz().get("checkpoints", {}).get("available"):
            self.skipTest("moatd has no working CRIU here: no snapshot to read")
        sb = self.sdk_sandbox()
        snap = sb.snapshot(metadata={"k": "v"})
        self.addCleanup(lambda: sb.delete_snapshot(snap.id))
        got = moat.Sandbox.get_snapshot(snap.id, client=self.client)
        self.assertEqual((got.id, got.sandbox_id, got.metadata), (snap.id, sb.id, {"k": "v"}))
        j = self.moat_json("snapshots", "get", snap.id)
        self.assertEqual(j["id"], snap.id)


class CliOpsTest(ClientOpsBase):
    def test_cli_port(self):
        sid = self.sandbox()["id"]
        self.assertEqual(self.moat_json("port", "ls", sid)["ports"], [])
        a = self.moat_json("port", "expose", sid, str(NOWHERE))
        self.assertEqual(self.proxy_status(sid, NOWHERE, {"X-Moat-Port-Token": a["token"]}), 502)
        self.assertTrue(self.moat_json("port", "expose", sid, str(NOWHERE), "--public")["public"])
        self.assertTrue(self.moat_json("port", "get", sid, str(NOWHERE))["public"])
        self.moat("port", "rm", sid, str(NOWHERE))
        self.assertEqual(self.proxy_status(sid, NOWHERE, {}), 401)
        self.moat("port", "get", sid, "70000", check=2)
        self.moat("port", "expose", sid, "80", "--public", "--token", "t" * 20, check=2)
        r = self.moat("port", "expose", sid, "80", "--token", "bad", check=1)
        self.assertIn("invalid_request", r.stderr)

    def test_cli_network(self):
        sid = self.sandbox()["id"]
        self.assertEqual(self.moat_json("network", "get", sid)["policy"]["egress"], "allow")
        got = self.moat_json("network", "set", sid, "--egress", "deny", "--allow", "allowed.test", "--deny",
                             "10.9.0.0/16")
        self.assertEqual((got["policy"]["egress"], got["policy"]["allow"], got["policy"]["deny"]),
                         ("deny", ["allowed.test"], ["10.9.0.0/16"]))
        self.c.exec(sid, argv=["bash", "-c", "timeout 3 bash -c 'exec 3<>/dev/tcp/198.51.100.13/80' || true"])
        deadline = time.time() + 10
        while True:
            log = self.moat_json("network", "log", sid)
            if any(e["destination"] == "198.51.100.13" for e in log) or time.time() > deadline:
                break
            time.sleep(0.2)
        self.assertTrue(any(e["destination"] == "198.51.100.13" for e in log), log)
        self.assertEqual(self.moat_json("network", "log", sid, "--since", str(log[-1]["seq"])), [])
        self.moat("network", "set", sid, "--internet", "maybe", check=2)
        self.moat("network", "get", sid, "--allow", "x", check=2)

    def test_cli_events_metrics_update(self):
        sid = self.sandbox()["id"]
        self.c.request("POST", "/v1/sandboxes/%s/pause" % sid, body={})
        self.c.request("POST", "/v1/sandboxes/%s/resume" % sid, body={})
        r = self.moat("events", sid, "--replay", "--count", "4", timeout=60)
        lines = [json.loads(x) for x in r.stdout.splitlines()]
        states = [x["data"]["event"] for x in lines if x["event"] == "state"]
        self.assertEqual(states[:2], ["created", "running"], lines)
        self.assertEqual(len(lines), 4)
        m = self.moat_json("metrics", sid)
        self.assertEqual((m["sandbox_id"], m["sampled"]), (sid, True))
        u = self.moat_json("update", sid, "--ttl", "300", "--meta", "team=blue")
        self.assertEqual(u["metadata"], {"team": "blue"})
        self.assertTrue(self.moat_json("update", sid, "--persistent")["persistent"])
        self.moat("update", sid, check=2)
        self.moat("metrics", "sb-nosuch", check=1)

    def test_cli_keys_me_audit(self):
        me = self.moat_json("me")
        self.assertEqual(me["key"]["role"], "admin")
        k = self.moat_json("keys", "create", "cli-" + uuid.uuid4().hex[:8], "--role", "member")
        self.assertTrue(k["key"].startswith("moat_"))
        self.assertEqual(self.moat_json("me", key=k["key"])["key"]["id"], k["id"])
        self.assertIn(k["id"], [x["id"] for x in self.moat_json("keys", "ls")])
        self.moat("keys", "rm", k["id"])
        self.assertNotIn(k["id"], [x["id"] for x in self.moat_json("keys", "ls")])
        self.moat("me", key=k["key"], check=1)
        r = self.moat("audit", "--target", k["id"])
        entries = [json.loads(x) for x in r.stdout.splitlines()]
        self.assertEqual([e["method"] for e in entries], ["DELETE"], entries)
        one = self.moat("audit", "--limit", "1")
        self.assertEqual(len(one.stdout.splitlines()), 1)
        self.assertIn("next: ", one.stderr)
        every = self.moat("audit", "--all", "--limit", "1")
        self.assertGreater(len(every.stdout.splitlines()), 1)
        self.moat("keys", "create", "x", "--role", "root", check=2)

    def test_cli_context(self):
        sid = self.sandbox(template="code-interpreter")["id"]
        cid = self.moat("context", "create", sid, "--language", "python").stdout.strip()
        self.assertTrue(cid)
        self.assertIn(cid, [c["id"] for c in self.moat_json("context", "ls", sid)])
        self.moat("context", "run", sid, cid, "x = 41")
        self.assertEqual(self.moat("context", "run", sid, cid, "-", input="print(x + 1)\n").stdout, "42\n")
        r = self.moat("context", "run", sid, cid, "1/0", check=1)
        self.assertIn("ZeroDivisionError", r.stderr)
        self.moat("context", "restart", sid, cid)
        r = self.moat("context", "run", sid, cid, "x", check=1)
        self.assertIn("NameError", r.stderr)
        self.moat("context", "rm", sid, cid)
        self.assertEqual(self.moat_json("context", "ls", sid), [])
        self.moat("context", "create", sid, "--language", "cobol", check=2)

    def test_cli_fs_stdin_resize(self):
        sid = self.sandbox()["id"]
        self.assertEqual(self.moat_json("fs", "mkdir", sid, "/tmp/a/b")["type"], "dir")
        self.c.put_file(sid, "/tmp/a/b/f.txt", b"hello")
        self.assertEqual(self.moat_json("fs", "stat", sid, "/tmp/a/b/f.txt")["size"], 5)
        names = [e["name"] for e in self.moat_json("fs", "ls", sid, "/tmp/a", "--depth", "2")]
        self.assertEqual(sorted(names), ["b", "f.txt"])
        self.moat("fs", "mv", sid, "/tmp/a/b/f.txt", "/tmp/a/g.txt")
        self.assertEqual(self.c.get_file(sid, "/tmp/a/g.txt"), b"hello")
        self.moat("fs", "rm", sid, "/tmp/a", check=1)  # not empty
        watch = subprocess.Popen([os.path.join(moatd.BUILD, "moat"), "fs", "watch", sid, "/tmp/a", "--count", "1"],
                                 env=dict(os.environ, MOAT_API_URL="http://127.0.0.1:%d" % self.daemon.port,
                                          MOAT_API_KEY=self.c.key), stdout=subprocess.PIPE, text=True)
        try:
            deadline = time.time() + 30
            while watch.poll() is None and time.time() < deadline:
                self.c.put_file(sid, "/tmp/a/new-%d" % int(time.time() * 1000), b"x")
                time.sleep(0.5)
            out, _ = watch.communicate(timeout=10)
        finally:
            if watch.poll() is None:
                watch.kill()
                watch.wait()
        self.assertEqual(watch.returncode, 0)
        self.assertTrue(json.loads(out.splitlines()[0])["path"].startswith("/tmp/a/"), out)
        self.moat("fs", "rm", sid, "/tmp/a", "-r")
        self.c.request("GET", "/v1/sandboxes/%s/files/stat" % sid, query={"path": "/tmp/a"}, expect=404)
        # stdin: a background cat gets both writes, then EOF
        p = self.c.exec(sid, argv=["bash", "-c", "cat > /tmp/in.txt"], background=True, expect=201)
        self.moat("stdin", sid, str(p["pid"]), "one ")
        self.moat("stdin", sid, str(p["pid"]), "--close", input="two\x00bytes")
        deadline = time.time() + 10
        while time.time() < deadline:
            if not any(x["pid"] == p["pid"] and x["running"]
                       for x in self.c.request("GET", "/v1/sandboxes/%s/processes" % sid)[1]["processes"]):
                break  # cat saw EOF and exited
            time.sleep(0.2)
        self.assertEqual(self.c.get_file(sid, "/tmp/in.txt"), b"one two\x00bytes")
        # resize
        q = self.c.exec(sid, argv=["bash", "-c", "sleep 2; stty size"], background=True, pty={"cols": 80, "rows": 24},
                        expect=201)
        self.moat("resize", sid, str(q["pid"]), "120", "50")
        r = self.moat("attach", sid, str(q["pid"]), timeout=60)
        self.assertIn("50 120", r.stdout)
        self.moat("resize", sid, str(q["pid"]), "wide", "50", check=2)

    def test_cli_volume_files_and_snapshot_get(self):
        name = "vol-" + uuid.uuid4().hex[:8]
        self.moat("volume", "create", name, "--size", "16")
        self.addCleanup(lambda: self.moat("volume", "rm", name, check=None))
        self.assertEqual(self.moat_json("volume", "get", name)["name"], name)
        self.moat("volume", "write", name, "/d.bin", input="payload\n")
        self.assertEqual(self.moat("volume", "read", name, "/d.bin").stdout, "payload\n")
        self.moat("volume", "rmfile", name, "/d.bin")
        self.moat("volume", "read", name, "/d.bin", check=1)
        r = self.moat("snapshots", "get", "snap-" + "0" * 17, check=1)
        self.assertIn("not_found", r.stderr)


class DatabaseEventsTest(DatabaseMixin, ClientOpsBase):
    def test_python_events_then_deleted(self):
        d = self.database()
        db = moat.Database.get(d["id"], client=self.client)
        events = db.events()
        first = next(events)
        self.assertEqual((first.name, first.data["database_id"]), ("state", d["id"]), first)
        self.c.request("DELETE", "/v1/databases/" + d["id"], expect=204, timeout=120)
        names = [e.name for e in events]  # the generator ends after deleted
        self.assertEqual(names[-1:], ["deleted"], names)

    def test_cli_db_events(self):
        d = self.database()
        r = self.moat("db", "events", d["id"], "--count", "1", timeout=60)
        line = json.loads(r.stdout.splitlines()[0])
        self.assertEqual((line["event"], line["data"]["database_id"]), ("state", d["id"]), r.stdout)
        self.moat("db", "events", "db-" + "a" * 17, check=1)
        self.moat("db", "events", d["id"], "--count", "0", check=2)

    def test_template_rebuild_unknown_recipe(self):
        with self.assertRaises(moat.NotFoundError):
            self.client.templates.rebuild("no-such-recipe")


class TypeScriptOpsTest(ClientOpsBase):
    @classmethod
    def setUpClass(cls):
        build_sdk()
        super().setUpClass()

    def test_ops(self):
        env = dict(os.environ, MOAT_API_URL="http://127.0.0.1:%d" % self.daemon.port, MOAT_API_KEY=self.c.key)
        r = subprocess.run(["node", "--test", "--test-reporter=tap", os.path.join("test", "ops.test.mjs")], cwd=SDK,
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
        out = r.stdout.decode(errors="replace")
        c = tap_counts(out)
        self.assertEqual(r.returncode, 0, out[-8000:])
        self.assertEqual((c["fail"], c["cancelled"]), (0, 0), out[-8000:])
        self.assertGreaterEqual(c["pass"], 5, out[-4000:])


if __name__ == "__main__":
    unittest.main()

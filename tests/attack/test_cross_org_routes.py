"""test_cross_org_routes.py -- a second org's admin key against every v1 route of docs/openapi.yaml.

Org A holds one of everything: a sandbox (a secret file, a background process, a code context, an
exposed port), a snapshot, a volume, a database, a second key and a template of its own. Org B, with
an admin key, then calls every operation the API document lists, with A's ids in the path and a
body that would be valid for A. Every call on one of A's resources must be refused as if it did not
exist (404; 403 where the route is not for org keys at all), no answer of any route may carry A's
secret or an id of A's that B did not send, and afterwards -- checked as A, and from the host --
every one of A's resources is as it was. The routes come from the API document, so a route added
later is attacked too: one with a path parameter this test cannot fill fails here until it can.
"""

import io
import json
import os
import sys
import tarfile
import time
import urllib.parse
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
import moatd  # noqa: E402
from moattest import DaemonTest  # noqa: E402

OPENAPI = os.path.join(moatd.REPO, "docs", "openapi.yaml")
PORT = 8080


def tar_of(files):
    b = io.BytesIO()
    with tarfile.open(fileobj=b, mode="w") as t:
        for name, data in files.items():
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            t.addfile(ti, io.BytesIO(data))
    return b.getvalue()


def operations():
    with open(OPENAPI) as f:
        doc = json.load(f)
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            if isinstance(op, dict) and "x-route" in op:
                yield method.upper(), path, op


class CrossOrgRoutesTest(DaemonTest):
    pool = 1

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        c = cls.c
        cls.tag = "secret" + uuid.uuid4().hex[:12]
        t = cls.tag
        cls.me = c.request("GET", "/v1/me")[1]
        cls.sid = c.create(persistent=True, metadata={"owner": t})["id"]
        c.sh(cls.sid, "echo %s > /root/%s" % (t, t))
        c.request("POST", "/v1/sandboxes/%s/exec" % cls.sid, expect=201,
                  body={"cmd": "sleep 3600", "background": True, "tag": "bg-" + t})
        cls.pid = [p for p in c.request("GET", "/v1/sandboxes/%s/processes" % cls.sid)[1]["processes"]
                   if p.get("tag") == "bg-" + t][0]["pid"]
        cls.cid = c.request("POST", "/v1/sandboxes/%s/contexts" % cls.sid, body={"language": "python"},
                            expect=201)[1]["id"]
        c.request("POST", "/v1/sandboxes/%s/ports/%d" % (cls.sid, PORT), body={}, expect=(200, 201))
        cls.snap = c.request("POST", "/v1/sandboxes/%s/snapshots" % cls.sid, body={"metadata": {"o": t}},
                             expect=201, timeout=120)[1]["id"]
        cls.vol = c.request("POST", "/v1/volumes", body={"name": "v" + t[6:], "size_mb": 16}, expect=201)[1]["name"]
        c.request("PUT", "/v1/volumes/%s/files" % cls.vol, query={"path": "/f"}, raw=t.encode(),
                  headers={"Content-Type": "application/octet-stream"})
        cls.db = c.request("POST", "/v1/databases", body={"name": "d" + t[6:]}, expect=201, timeout=180)[1]["id"]
        cls.kid = c.request("POST", "/v1/keys", body={"name": "k" + t, "role": "member"}, expect=201)[1]
        cls.tpl = "t" + t[6:]
        st, b = c.request("POST", "/v1/templates/%s" % cls.tpl,
                          raw=tar_of({"Dockerfile": ("FROM base\nENV OWNER=%s\n" % t).encode()}),
                          headers={"Content-Type": "application/x-tar"}, expect=(200, 201, 202), timeout=300)
        cls.build = b.get("build_id") or b.get("build", {}).get("id")
        deadline = time.time() + 300
        while c.request("GET", "/v1/templates/" + cls.tpl)[1]["state"] not in ("ready", "failed"):
            if time.time() > deadline:
                raise AssertionError("template build did not end")
            time.sleep(0.3)
        cls.org_b = cls.daemon.new_org_key("org-b-%s" % uuid.uuid4().hex[:8])
        cls.b = c.with_key(cls.org_b)
        # (A's org id is not among them: make's org is "default", a word any answer may hold.)
        cls.a_ids = {cls.sid, cls.snap, cls.vol, cls.db, cls.kid["id"], cls.cid, cls.tpl}

    @classmethod
    def tearDownClass(cls):
        try:
            cls.c.request("DELETE", "/v1/databases/" + cls.db, expect=(204, 404), timeout=120)
            cls.c.request("DELETE", "/v1/sandboxes/" + cls.sid, expect=(204, 404), timeout=120)
            cls.c.request("DELETE", "/v1/snapshots/" + cls.snap, expect=(204, 404), timeout=120)
            cls.c.request("DELETE", "/v1/volumes/" + cls.vol, expect=(204, 404, 409), timeout=120)
        finally:
            super().tearDownClass()

    # -- filling in a route --

    def fill(self, path):
        """path with A's ids in its parameters; raises KeyError naming a parameter it cannot fill."""
        def one(param, before):
            if param == "id":
                if before.startswith("/v1/sandboxes"):
                    return self.sid
                if before.startswith("/v1/databases"):
                    return self.db
                if before.startswith("/v1/orgs"):
                    return self.org_id()
            if param == "sid":
                return self.build if "/builds/" in before else self.snap
            if param == "name":
                return self.tpl if before.startswith("/v1/templates") else self.vol
            table = {"kid": self.kid["id"], "cid": self.cid, "ref": str(self.pid), "port": str(PORT),
                     "path": "x"}
            if param in table:
                return table[param]
            raise KeyError("no resource of org A for {%s} in %s" % (param, path))

        out, rest = "", path
        while "{" in rest:
            pre, _, tail = rest.partition("{")
            param, _, rest = tail.partition("}")
            out += pre
            out += urllib.parse.quote(one(param, out), safe="")
        return out + rest

    def org_id(self):
        org = self.me.get("org")
        return org["id"] if isinstance(org, dict) else org

    def body_for(self, route, method):
        """(json body or None, raw bytes or None, content type, query) valid for A on that route."""
        t = self.tag
        bodies = {
            "sandbox.patch": {"ttl_seconds": 5},
            "exec": {"cmd": "cat /root/" + t},
            "exec.stream": {"cmd": "cat /root/" + t},
            "files.mkdir": {"path": "/root/b-was-here"},
            "files.move": {"from": "/root/" + t, "to": "/root/moved"},
            "process.stdin": {"data": "x", "close": True},
            "process.signal": {"signal": "KILL"},
            "process.resize": {"cols": 80, "rows": 24},
            "contexts.create": {"language": "python"},
            "contexts.run": {"code": "open('/root/%s').read()" % t},
            "sandbox.fork": {"count": 1},
            "sandbox.explore": {"branches": [{"cmd": "cat /root/" + t}, {"cmd": "true"}]},
            "sandbox.rollback": {"snapshot_id": self.snap},
            "snapshots.create": {},
            "sandbox.network.put": {"internet": False},
            "database.branch": {"name": "stolen"},
            "port.expose": {"public": True},
            "mcp.sandbox": {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                            "params": {"name": "exec", "arguments": {"cmd": "cat /root/" + t}}},
        }
        query = {"files.get": {"path": "/root/" + t}, "files.put": {"path": "/root/" + t},
                 "files.delete": {"path": "/root/" + t}, "files.list": {"path": "/root"},
                 "files.stat": {"path": "/root/" + t}, "files.watch": {"path": "/root"},
                 "volume.files.get": {"path": "/f"}, "volume.files.put": {"path": "/f"},
                 "volume.files.delete": {"path": "/f"}}.get(route)
        if route in ("files.put", "volume.files.put"):
            return None, b"overwritten by B", "application/octet-stream", query
        if route in ("template.create", "template.import", "templates.build"):
            return None, tar_of({"Dockerfile": b"FROM base\n"}), "application/x-tar", query
        if method in ("POST", "PUT", "PATCH"):
            return bodies.get(route, {}), None, "application/json", query
        return None, None, None, query

    def call_as_b(self, method, path, route):
        body, raw, ctype, query = self.body_for(route, method)
        headers = {"Content-Type": ctype} if ctype else {}
        if route == "pty":
            headers.update({"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13",
                            "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="})
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        return self.b.request(method, path, raw=data, query=query, headers=headers, expect=tuple(range(100, 600)), timeout=60)

    def assertNoLeak(self, what, body, sent):
        text = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.assertNotIn(self.tag.encode(), text, "%s: answer carries A's secret: %r" % (what, text[:400]))
        for a in self.a_ids:
            if a not in sent:
                self.assertNotIn(a.encode(), text, "%s: answer names A's %s: %r" % (what, a, text[:400]))

    # -- the attack --

    def lists_as_b(self, skip=()):
        """Every GET without a path parameter, as B: none may name what is A's."""
        n = 0
        for method, path, op in operations():
            route = op["x-route"]
            if method != "GET" or "{" in path or route in skip or not (path.startswith("/v1/") or path == "/metrics"):
                continue
            st, body = self.call_as_b(method, path, route)
            self.assertNoLeak("%s %s (%s)" % (method, path, route), body, "")
            n += 1
        return n

    def test_every_route_with_a_second_orgs_key(self):
        # MCP's workspace endpoint needs a session: test_mcp attacks it with a second org.
        lists = self.lists_as_b(skip=("mcp.workspace",))
        refused, problems, b_owns_tpl = 0, [], False
        # The destructive ones last, so that every other route meets A's resources still there.
        last = ("sandbox.delete", "snapshot.delete", "volume.delete", "database.delete", "key.delete",
                "template.delete")
        ops = sorted(operations(), key=lambda o: o[2]["x-route"] in last)
        for method, path, op in ops:
            route = op["x-route"]
            if "{" not in path or not path.startswith("/v1/"):
                continue  # lists: above; creating B's own things is B's right
            what = "%s %s (%s)" % (method, path, route)
            try:
                target = self.fill(path)
            except KeyError as e:
                problems.append(str(e))
                continue
            st, body = self.call_as_b(method, target, route)
            self.assertNoLeak(what, body, target + json.dumps(self.body_for(route, method)[0]))
            if route in ("templates.build", "template.create", "template.import"):
                # Template names are the org's own: B building "its" template of that name is B's
                # template, not A's (A's is checked unchanged below). Its build ends before going on.
                if st < 300:
                    b_owns_tpl = True
                    deadline = time.time() + 120
                    while self.b.request("GET", "/v1/templates/" + self.tpl)[1]["state"] == "building":
                        self.assertLess(time.time(), deadline, "B's own template build did not end")
                        time.sleep(0.2)
                continue
            if route == "template.delete" and b_owns_tpl and st == 204:
                refused += 1  # B deleted its own template of that name; A's is checked below
                continue
            if st not in (403, 404):
                problems.append("%s -> %d %r" % (what, st, body if not isinstance(body, bytes) else body[:200]))
            else:
                refused += 1
        self.assertEqual(problems, [])
        self.assertGreater(refused, 50)
        self.assertGreater(lists, 5)
        # B's audit log names what B sent: not a leak, so not listed again.
        self.lists_as_b(skip=("mcp.workspace", "audit"))
        self.check_a_untouched()

    def check_a_untouched(self):
        c, t = self.c, self.tag
        sb = c.get(self.sid)
        self.assertEqual(sb["state"], "running", sb)
        self.assertIsNone(sb.get("expires_at"), "B's PATCH changed A's TTL")
        self.assertEqual(c.sh(self.sid, "cat /root/%s; ls /root" % t).split(), [t, t])
        self.assertTrue(os.path.exists("/proc/%d" % self.daemon.sandbox_host(self.sid)["pid"]))
        procs = c.request("GET", "/v1/sandboxes/%s/processes" % self.sid)[1]["processes"]
        self.assertIn("bg-" + t, [p.get("tag") for p in procs], "B's signal reached A's process")
        self.assertIn(self.cid, [x["id"] for x in c.request("GET", "/v1/sandboxes/%s/contexts" % self.sid)[1]
                                 ["contexts"]])
        self.assertEqual(c.request("GET", "/v1/sandboxes/%s/ports/%d" % (self.sid, PORT))[0], 200)
        net = c.request("GET", "/v1/sandboxes/%s/network" % self.sid)[1]
        self.assertNotEqual(net.get("internet"), False, net)
        self.assertEqual(c.request("GET", "/v1/snapshots/" + self.snap)[0], 200)
        self.assertEqual(c.request("GET", "/v1/volumes/%s/files" % self.vol, query={"path": "/f"})[1], t.encode())
        dbs = c.request("GET", "/v1/databases")[1]["databases"]
        self.assertEqual([d["id"] for d in dbs], [self.db], "B branched or removed A's database")
        self.assertEqual(c.with_key(self.kid["key"]).request("GET", "/v1/me")[0], 200, "B revoked A's key")
        tpl = c.request("GET", "/v1/templates/" + self.tpl)[1]
        self.assertEqual(tpl["state"], "ready", tpl)
        ids = [s["id"] for s in c.list() if "moat.database" not in s["metadata"]]  # not the database's own
        self.assertEqual(ids, [self.sid], "B made sandboxes in A's org (fork/explore) or removed A's: %r" % c.list())
        self.assertEqual([s["id"] for s in self.b.list()], [], "B got a fork of A's sandbox")

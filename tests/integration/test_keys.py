"""test_keys.py -- API keys an org manages over the API (/v1/me, /v1/keys) and their roles (admin,
member, readonly) enforced on every route, against a real moatd with two orgs."""

import json
import os
import re
import sqlite3
import subprocess
import sys
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
import moatd  # noqa: E402
from moattest import DaemonTest  # noqa: E402

KEY_RE = re.compile(r"^moat_[0-9a-f]{64}$")
ID_RE = re.compile(r"^key-[0-9a-z]{16}$")


def rfc3339(t):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


class KeysTest(DaemonTest):
    pool = 1

    def setUp(self):
        # each test's admin: a key of an org of its own, made by `moatd key create`
        self.org = "org-" + uuid.uuid4().hex[:8]
        self.admin = self.c.with_key(self.daemon.new_org_key(self.org))

    def make_key(self, role=None, client=None, name=None, expect=201, **extra):
        body = {"name": name or ("k-" + uuid.uuid4().hex[:6])}
        if role is not None:
            body["role"] = role
        body.update(extra)
        _, k = (client or self.admin).request("POST", "/v1/keys", body=body, expect=expect)
        return k

    def assertForbidden(self, role, fn, *args, **kw):
        with self.assertRaises(moatd.HTTPError) as cm:
            fn(*args, **kw)
        self.assertEqual(cm.exception.status, 403, cm.exception.body)
        self.assertEqual(cm.exception.code, "forbidden", cm.exception.body)
        self.assertIn(role, cm.exception.body["message"])

    def test_create_each_role_and_me(self):
        _, me = self.admin.request("GET", "/v1/me")
        self.assertEqual(me["org"], {"id": self.org})
        self.assertEqual(me["key"]["role"], "admin", me)  # moatd key create makes admins
        self.assertTrue(ID_RE.match(me["key"]["id"]), me)
        self.assertIsNone(me["key"]["expires_at"])
        for role in ("admin", "member", "readonly", None):
            k = self.make_key(role)
            self.assertEqual(k["role"], role or "member", k)
            self.assertTrue(KEY_RE.match(k["key"]), k)
            self.assertTrue(ID_RE.match(k["id"]), k)
            self.assertTrue(k["created_at"].endswith("Z"), k)
            self.assertIsNone(k["expires_at"])
            _, me = self.c.with_key(k["key"]).request("GET", "/v1/me")
            self.assertEqual(me["key"]["id"], k["id"])
            self.assertEqual(me["key"]["name"], k["name"])
            self.assertEqual(me["key"]["role"], role or "member")
            self.assertEqual(me["org"]["id"], self.org)
            # the E2B form of the same key is the same key
            e2b = self.c.with_key("e2b_" + k["key"][5:])
            self.assertEqual(e2b.request("GET", "/v1/me")[1]["key"]["id"], k["id"])

    def test_list_never_shows_secrets(self):
        made = [self.make_key(r) for r in ("admin", "member", "readonly")]
        _, body = self.admin.request("GET", "/v1/keys")
        ids = [k["id"] for k in body["keys"]]
        for k in made:
            self.assertIn(k["id"], ids)
        self.assertEqual(len(body["keys"]), 4, body)  # the three and the admin's own
        db = sqlite3.connect("file:%s?mode=ro" % os.path.join(self.daemon.data_dir, "moat.db"), uri=True,
                             timeout=30)
        try:
            hashes = [r[0] for r in db.execute("SELECT key_hash FROM api_keys WHERE org = ?", (self.org,))]
        finally:
            db.close()
        self.assertEqual(len(hashes), 4)
        text = repr(body)
        for k in made:
            self.assertNotIn(k["key"], text)
            self.assertNotIn(k["key"][5:], text)
            # the store holds only the hash
            self.assertIn(__import__("hashlib").sha256(k["key"].encode()).hexdigest(), hashes)
        for h in hashes:
            self.assertNotIn(h, text)
        for k in body["keys"]:
            self.assertEqual(set(k), {"id", "name", "role", "created_at", "expires_at", "last_used_at"}, k)

    def test_readonly_refused_on_mutations(self):
        ro = self.c.with_key(self.make_key("readonly")["key"])
        st, body = ro.request("GET", "/v1/sandboxes")
        self.assertEqual(st, 200)
        self.assertIn("sandboxes", body)
        self.assertForbidden("readonly", ro.create)
        sb = self.sandbox(client=self.admin)
        self.assertForbidden("readonly", ro.exec, sb["id"], argv=["true"])
        self.assertForbidden("readonly", ro.delete, sb["id"])
        self.assertForbidden("readonly", ro.request, "POST", "/v1/volumes", body={"name": "v", "size_mb": 32})
        self.assertForbidden("readonly", ro.request, "POST", "/v1/keys", body={"name": "x"})
        # reads still work, and the sandbox is untouched
        self.assertEqual(ro.get(sb["id"])["state"], "running")
        self.assertEqual(ro.request("GET", "/v1/sandboxes/%s/files/stat" % sb["id"], query={"path": "/"})[0], 200)
        # the E2B front end refuses its mutating calls too, and lists
        e2b_ro = {"X-API-KEY": "e2b_" + ro.key[5:]}
        st, _ = ro.request("GET", "/sandboxes", auth=False, headers=e2b_ro)
        self.assertEqual(st, 200)
        for method, path in (("POST", "/sandboxes"), ("DELETE", "/sandboxes/" + sb["id"]),
                             ("POST", "/sandboxes/%s/pause" % sb["id"])):
            st, body = ro.request(method, path, body={} if method == "POST" else None, auth=False,
                                  headers=e2b_ro, expect=403)
            self.assertIn("readonly", body["message"])
        self.assertEqual(self.admin.get(sb["id"])["state"], "running")
        # E2B's sandbox detail carries the envd access token (it runs commands): not for a readonly key
        _, detail = ro.request("GET", "/sandboxes/" + sb["id"], auth=False, headers=e2b_ro)
        self.assertEqual(detail["sandboxID"], sb["id"])
        self.assertNotIn("envdAccessToken", detail)
        self.assertNotIn("trafficAccessToken", detail)
        _, detail = self.admin.request("GET", "/sandboxes/" + sb["id"], auth=False,
                                       headers={"X-API-KEY": self.admin.key})
        self.assertTrue(detail["envdAccessToken"])

    def test_readonly_port_proxy(self):
        """The port proxy passes a readonly key's GET to the sandbox's server and refuses its POST."""
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from test_ports import HTTP_PORT, start_servers
        sb = self.sandbox(client=self.admin)
        start_servers(self.admin, sb["id"])
        ro = self.c.with_key(self.make_key("readonly")["key"])
        echo = "/v1/sandboxes/%s/ports/%d/echo" % (sb["id"], HTTP_PORT)
        st, body = ro.request("GET", echo)
        self.assertEqual((st, body["method"]), (200, "GET"))
        st, body = ro.request("POST", echo, raw=b"x", headers={"Content-Type": "application/octet-stream"},
                              expect=403)
        self.assertEqual(body["code"], "forbidden")
        self.assertIn("readonly", body["message"])
        member = self.c.with_key(self.make_key("member")["key"])
        st, body = member.request("POST", echo, raw=b"x", headers={"Content-Type": "application/octet-stream"})
        self.assertEqual((st, body["method"], body["body_len"]), (200, "POST", 1))
        # a port's access token passes any method: a readonly key is not shown it
        settings = "/v1/sandboxes/%s/ports/%d" % (sb["id"], HTTP_PORT)
        _, rule = self.admin.request("POST", settings, body={"token": "t" * 32})
        token = rule["token"]
        self.assertTrue(token)
        self.assertEqual(self.admin.request("GET", settings)[1]["token"], token)
        self.assertIsNone(ro.request("GET", settings)[1]["token"])
        listed = ro.request("GET", "/v1/sandboxes/%s/ports" % sb["id"])[1]["ports"]
        self.assertEqual([p["token"] for p in listed if p["port"] == HTTP_PORT], [None])
        self.assertNotIn(token, repr(listed))

    def mcp(self, client, path, method, params=None, session=None):
        h = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
        if session:
            h["Mcp-Session-Id"] = session
        msg = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params or {}}
        import http.client
        import json
        conn = http.client.HTTPConnection("127.0.0.1", self.daemon.port, timeout=120)
        try:
            h["Authorization"] = "Bearer " + client.key
            conn.request("POST", path, body=json.dumps(msg), headers=h)
            resp = conn.getresponse()
            body = json.loads(resp.read())
            self.assertEqual(resp.status, 200, body)
            return body, resp.getheader("Mcp-Session-Id")
        finally:
            conn.close()

    def test_readonly_mcp_tools(self):
        """Over MCP a readonly key may call the tools that read, and the others are refused."""
        ro = self.c.with_key(self.make_key("readonly")["key"])
        sb = self.sandbox(client=self.admin)
        self.admin.put_file(sb["id"], "/root/ro.txt", b"hello from admin")
        init = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
        for path, reads, writes in (
                ("/v1/mcp", ("list_sandboxes", {}), ("create_sandbox", {})),
                ("/v1/mcp", ("database_list", {}), ("kill_sandbox", {"sandbox_id": sb["id"]})),
                ("/v1/sandboxes/%s/mcp" % sb["id"], ("read_file", {"path": "/root/ro.txt"}),
                 ("write_file", {"path": "/root/ro.txt", "content": "x"})),
                ("/v1/sandboxes/%s/mcp" % sb["id"], ("list_dir", {"path": "/root"}),
                 ("shell", {"command": "touch /root/made"}))):
            _, sid = self.mcp(ro, path, "initialize", init)
            listed, _ = self.mcp(ro, path, "tools/list", {}, sid)
            names = [t["name"] for t in listed["result"]["tools"]]
            self.assertIn(reads[0], names)
            self.assertNotIn(writes[0], names, "tools/list offers a readonly key a tool it may not call")
            self.assertTrue(all(t["annotations"]["readOnlyHint"] for t in listed["result"]["tools"]), listed)
            _, asid = self.mcp(self.admin, path, "initialize", init)
            listed, _ = self.mcp(self.admin, path, "tools/list", {}, asid)
            hints = {t["name"]: t["annotations"]["readOnlyHint"] for t in listed["result"]["tools"]}
            self.assertEqual((hints[reads[0]], hints[writes[0]]), (True, False), hints)
            body, _ = self.mcp(ro, path, "tools/call", {"name": reads[0], "arguments": reads[1]}, sid)
            self.assertFalse(body["result"]["isError"], body)
            body, _ = self.mcp(ro, path, "tools/call", {"name": writes[0], "arguments": writes[1]}, sid)
            self.assertTrue(body["result"]["isError"], body)
            text = body["result"]["content"][0]["text"]
            self.assertIn("forbidden", text)
            self.assertIn("readonly", text)
        self.assertEqual(self.admin.get_file(sb["id"], "/root/ro.txt"), b"hello from admin")
        self.admin.stat(sb["id"], "/root/made", expect=404)
        self.assertEqual(self.admin.get(sb["id"])["state"], "running")
        self.assertEqual(len(self.admin.list()), 1)
        # a member key's tool call that writes goes through
        member = self.c.with_key(self.make_key("member")["key"])
        path = "/v1/sandboxes/%s/mcp" % sb["id"]
        _, sid = self.mcp(member, path, "initialize", init)
        body, _ = self.mcp(member, path, "tools/call", {"name": "shell", "arguments": {"command": "touch /root/made"}},
                           sid)
        self.assertFalse(body["result"]["isError"], body)
        self.assertEqual(self.admin.stat(sb["id"], "/root/made")["type"], "file")

    def test_readonly_is_not_shown_database_passwords(self):
        _, d = self.admin.request("POST", "/v1/databases", body={"name": "ro-" + uuid.uuid4().hex[:6], "size_mb": 64},
                                  expect=201, timeout=900)
        self.addCleanup(lambda: self.admin.request("DELETE", "/v1/databases/" + d["id"], expect=(204, 404), timeout=120))
        self.assertTrue(d["connection"]["password"])
        ro = self.c.with_key(self.make_key("readonly")["key"])
        for got in (ro.request("GET", "/v1/databases/" + d["id"])[1],
                    [x for x in ro.request("GET", "/v1/databases")[1]["databases"] if x["id"] == d["id"]][0]):
            conn = got["connection"]
            self.assertEqual((conn["password"], conn["url"], conn["sandbox_url"]), (None, None, None), got)
            self.assertEqual(conn["user"], d["connection"]["user"])
            self.assertNotIn(d["connection"]["password"], json.dumps(got))
        # a member sees it
        member = self.c.with_key(self.make_key("member")["key"])
        self.assertEqual(member.request("GET", "/v1/databases/" + d["id"])[1]["connection"]["password"],
                         d["connection"]["password"])

    def test_member_cannot_manage_keys(self):
        member = self.c.with_key(self.make_key("member")["key"])
        self.assertForbidden("member", member.request, "POST", "/v1/keys", body={"name": "x"})
        self.assertForbidden("member", member.request, "GET", "/v1/keys")
        other = self.make_key("readonly")
        self.assertForbidden("member", member.request, "DELETE", "/v1/keys/" + other["id"])
        # but it may use everything else
        sb = self.sandbox(client=member)
        self.assertEqual(member.exec(sb["id"], argv=["true"])["exit_code"], 0)

    def test_delete_key_then_401(self):
        k = self.make_key("member")
        cli = self.c.with_key(k["key"])
        self.assertEqual(cli.request("GET", "/v1/me")[0], 200)
        self.admin.request("DELETE", "/v1/keys/" + k["id"], expect=204)
        with self.assertRaises(moatd.HTTPError) as cm:
            cli.request("GET", "/v1/me")
        self.assertEqual((cm.exception.status, cm.exception.code), (401, "unauthorized"))
        self.admin.request("DELETE", "/v1/keys/" + k["id"], expect=404)
        ids = [x["id"] for x in self.admin.request("GET", "/v1/keys")[1]["keys"]]
        self.assertNotIn(k["id"], ids)
        # a key may delete itself, whatever its role but readonly
        m = self.make_key("member")
        mc = self.c.with_key(m["key"])
        mc.request("DELETE", "/v1/keys/" + m["id"], expect=204)
        self.assertEqual(mc.request("GET", "/v1/me", expect=401)[0], 401)

    def test_expired_key_401(self):
        k = self.make_key("member", expires_at=rfc3339(time.time() + 3))
        self.assertTrue(k["expires_at"].endswith("Z"), k)
        cli = self.c.with_key(k["key"])
        _, me = cli.request("GET", "/v1/me")
        self.assertEqual(me["key"]["expires_at"], k["expires_at"])
        deadline = time.time() + 15
        while time.time() < deadline:
            st, body = cli.request("GET", "/v1/me", expect=(200, 401))
            if st == 401:
                break
            time.sleep(0.5)
        self.assertEqual(st, 401)
        self.assertEqual(body["code"], "unauthorized")
        self.assertIn("expired", body["message"])
        self.assertEqual(cli.request("GET", "/v1/sandboxes", expect=401)[1]["code"], "unauthorized")

    def test_other_org(self):
        other_org = "org-" + uuid.uuid4().hex[:8]
        other_admin = self.c.with_key(self.daemon.new_org_key(other_org))
        theirs = self.make_key("member", client=other_admin)
        mine = self.make_key("member")
        self.assertEqual(self.admin.request("DELETE", "/v1/keys/" + theirs["id"], expect=404)[1]["code"],
                         "not_found")
        ids = [x["id"] for x in self.admin.request("GET", "/v1/keys")[1]["keys"]]
        self.assertNotIn(theirs["id"], ids)
        self.assertIn(mine["id"], ids)
        other_ids = [x["id"] for x in other_admin.request("GET", "/v1/keys")[1]["keys"]]
        self.assertNotIn(mine["id"], other_ids)
        # theirs still works
        self.assertEqual(self.c.with_key(theirs["key"]).request("GET", "/v1/me")[1]["org"]["id"], other_org)

    def test_bad_input(self):
        cases = [
            {"name": "x", "role": "root"},
            {"name": "x", "role": 1},
            {"name": "x", "expires_at": rfc3339(time.time() - 60)},
            {"name": "x", "expires_at": "tomorrow"},
            {"name": "x", "expires_at": "1893456000000"},
            {"name": "x", "expires_at": 5},
            {"name": "n" * 65},
            {"name": ""},
            {"name": "tab\there"},
            {"role": "member"},
            {"name": "x", "color": "blue"},
        ]
        for body in cases:
            _, r = self.admin.request("POST", "/v1/keys", body=body, expect=400)
            self.assertEqual(r["code"], "invalid_request", (body, r))
        self.assertEqual(self.admin.request("POST", "/v1/keys", raw=b"[1]", headers={
            "Content-Type": "application/json"}, expect=400)[1]["code"], "invalid_request")
        self.assertEqual(self.admin.request("DELETE", "/v1/keys/not-a-key", expect=404)[1]["code"], "not_found")
        self.assertEqual(self.admin.request("GET", "/v1/keys", query={"x": "1"}, expect=400)[1]["code"],
                         "invalid_request")
        # nothing was made
        self.assertEqual(len(self.admin.request("GET", "/v1/keys")[1]["keys"]), 1)

    def test_key_create_cli_roles(self):
        def cli(*args):
            return subprocess.run([moatd.moatd_bin(), "key", "create", "--data-dir", self.daemon.data_dir,
                                   "--org", self.org] + list(args), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, timeout=60)
        r = cli("--role", "readonly", "--name", "ci-reader")
        self.assertEqual(r.returncode, 0, r.stderr)
        key = r.stdout.decode().strip()
        self.assertTrue(KEY_RE.match(key), key)
        _, me = self.c.with_key(key).request("GET", "/v1/me")
        self.assertEqual((me["key"]["role"], me["key"]["name"], me["org"]["id"]), ("readonly", "ci-reader", self.org))
        r = cli("--role", "root")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn(b"role", r.stderr)
        # the data dir's own key is the default org's admin
        _, me = self.c.request("GET", "/v1/me")
        self.assertEqual((me["key"]["role"], me["org"]["id"]), ("admin", "default"))


if __name__ == "__main__":
    import unittest
    unittest.main()

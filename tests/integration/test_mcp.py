"""test_mcp.py -- the MCP endpoints (POST /v1/sandboxes/{id}/mcp and /v1/mcp): the official MCP TypeScript
client (tests/node/mcp_client.mjs, @modelcontextprotocol/sdk unmodified) and raw HTTP checks of the
streamable HTTP transport and JSON-RPC edge cases."""

import json
import os
import shutil
import subprocess
import sys
import unittest
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from moattest import DaemonTest  # noqa: E402
from test_databases import DatabaseMixin  # noqa: E402

NODE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "node")
NODE_TIMEOUT_S = 180


def node_ready():
    return shutil.which("node") and os.path.isdir(os.path.join(NODE_DIR, "node_modules", "@modelcontextprotocol"))


def run_scenario(tc, scenario, key, **env):
    """Runs mcp_client.mjs SCENARIO against tc's moatd (skips without node); asserts it passed."""
    if not node_ready():
        tc.skipTest("node or tests/node/node_modules (npm packages) missing")
    e = dict(os.environ, MOAT_URL="http://127.0.0.1:%d" % tc.daemon.port, MOAT_KEY=key)
    e.update(env)
    r = subprocess.run(["node", "mcp_client.mjs", scenario], cwd=NODE_DIR, env=e, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=NODE_TIMEOUT_S)
    out = r.stdout.decode(errors="replace")
    tc.assertEqual(r.returncode, 0, "node scenario %s failed:\n%s" % (scenario, out))
    tc.assertIn("ok " + scenario, out)


class MCPTest(DaemonTest):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        sb = cls.c.create(ttl_seconds=1800, metadata={"who": "mcp"})
        cls.sid = sb["id"]
        cls.url = "http://127.0.0.1:%d" % cls.daemon.port

    # ---- helpers ----

    def node(self, scenario, **env):
        run_scenario(self, scenario, self.c.key, MOAT_SANDBOX=self.sid, **env)

    def post(self, path, msg, session=None, headers=None, key=None, raw=None, expect=None):
        h = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
        if session:
            h["Mcp-Session-Id"] = session
        if headers:
            h.update(headers)
        c = self.c if key is None else self.c.with_key(key)
        data = raw if raw is not None else json.dumps(msg).encode()
        return c.request("POST", path, raw=data, headers=h, expect=expect or (200, 202, 400, 403, 404, 406, 415),
                         timeout=120)

    def initialize(self, path, version="2025-11-25"):
        """Opens a session the way a client does; returns its id."""
        import http.client
        conn = http.client.HTTPConnection("127.0.0.1", self.daemon.port, timeout=60)
        try:
            conn.request("POST", path, body=json.dumps({
                "jsonrpc": "2.0", "id": 0, "method": "initialize",
                "params": {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}),
                headers={"Authorization": "Bearer " + self.c.key, "Content-Type": "application/json",
                         "Accept": "application/json, text/event-stream"})
            resp = conn.getresponse()
            body = json.loads(resp.read())
            self.assertEqual(resp.status, 200, body)
            self.assertEqual(resp.getheader("Content-Type"), "application/json")
            sid = resp.getheader("Mcp-Session-Id")
        finally:
            conn.close()
        self.assertRegex(sid, r"^[0-9a-f]{32}$")
        self.assertEqual(body["id"], 0)
        st, _ = self.post(path, {"jsonrpc": "2.0", "method": "notifications/initialized"}, session=sid)
        self.assertEqual(st, 202)
        return sid, body["result"]

    @property
    def path(self):
        return "/v1/sandboxes/%s/mcp" % self.sid

    # ---- the official client ----

    def test_client_initialize_and_list_tools(self):
        self.node("sandbox_initialize")

    def test_client_shell_and_files(self):
        self.node("sandbox_roundtrip")

    def test_client_workspace_create_exec_kill(self):
        run = "mcp-" + uuid.uuid4().hex[:8]
        try:
            self.node("workspace", MOAT_RUN=run)
        finally:
            for s in self.c.list(metadata={"run": run}):
                self.c.request("DELETE", "/v1/sandboxes/" + s["id"], expect=(204, 404))
        self.assertEqual(self.c.list(metadata={"run": run}), [])

    def test_client_workspace_fork_and_hibernate(self):
        run = "mcp-" + uuid.uuid4().hex[:8]
        try:
            self.node("workspace_time_travel", MOAT_RUN=run)
        finally:
            for state in (None, "hibernated", "paused"):
                for s in self.c.list(state=state, metadata={"run": run}):
                    self.c.request("DELETE", "/v1/sandboxes/" + s["id"], expect=(204, 404))

    def test_client_errors(self):
        self.node("errors")

    def test_client_refusals(self):
        self.node("refusals")

    # ---- raw HTTP ----

    def test_negotiation(self):
        for want, got in (("2025-06-18", "2025-06-18"), ("2024-11-05", "2024-11-05"), ("1999-01-01", "2025-11-25")):
            sid, res = self.initialize(self.path, want)
            self.assertEqual(res["protocolVersion"], got)
            self.assertEqual(res["serverInfo"]["name"], "moat")
            self.assertEqual(res["capabilities"], {"tools": {"listChanged": False}})
        st, body = self.post(self.path, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}})
        self.assertEqual((st, body["error"]["code"]), (200, -32602))

    def test_notification_only_is_202(self):
        sid, _ = self.initialize(self.path)
        st, body = self.post(self.path, {"jsonrpc": "2.0", "method": "notifications/cancelled",
                                         "params": {"requestId": 7}}, session=sid)
        self.assertEqual((st, body), (202, b""))
        st, body = self.post(self.path, [{"jsonrpc": "2.0", "method": "notifications/x"},
                                         {"jsonrpc": "2.0", "id": 9, "result": {}}], session=sid)
        self.assertEqual((st, body), (202, b""))

    def test_batch(self):
        sid, _ = self.initialize(self.path)
        st, body = self.post(self.path, [
            {"jsonrpc": "2.0", "id": "a", "method": "ping"},
            {"jsonrpc": "2.0", "method": "notifications/initialized"},
            {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
             "params": {"name": "shell", "arguments": {"command": "echo batched"}}},
            {"jsonrpc": "2.0", "id": 3, "method": "nope"},
            {"jsonrpc": "1.0", "id": 4, "method": "ping"},
            42,
            {"jsonrpc": "2.0", "id": 5, "method": "initialize", "params": {"protocolVersion": "2025-06-18"}},
        ], session=sid)
        self.assertEqual(st, 200)
        self.assertIsInstance(body, list)
        by_id = {json.dumps(m["id"]): m for m in body}
        self.assertEqual(len(body), 6)  # the notification gets no response
        self.assertEqual(by_id['"a"']["result"], {})
        self.assertIn("batched", by_id["2"]["result"]["content"][0]["text"])
        self.assertFalse(by_id["2"]["result"]["isError"])
        self.assertEqual(by_id["3"]["error"]["code"], -32601)
        self.assertEqual(by_id["4"]["error"]["code"], -32600)
        self.assertEqual(by_id["null"]["error"]["code"], -32600)
        self.assertEqual(by_id["5"]["error"]["code"], -32600)
        st, body = self.post(self.path, [], session=sid)
        self.assertEqual((st, body["error"]["code"], body["id"]), (400, -32600, None))

    def test_malformed_json_is_parse_error(self):
        sid, _ = self.initialize(self.path)
        for raw in (b'{"jsonrpc": "2.0", "id": 1, "method": ', b"", b"\xff\xfe"):
            st, body = self.post(self.path, None, session=sid, raw=raw)
            self.assertEqual(st, 400, raw)
            self.assertEqual(body["jsonrpc"], "2.0")
            self.assertIsNone(body["id"])
            self.assertEqual(body["error"]["code"], -32700)
        st, body = self.post(self.path, None, session=sid, raw=b'"just a string"')
        self.assertEqual((st, body["error"]["code"]), (400, -32600))
        st, body = self.post(self.path, {"jsonrpc": "2.0", "id": 1.5, "method": "ping"}, session=sid)
        self.assertEqual((st, body["error"]["code"]), (400, -32600))

    def test_invalid_params(self):
        # Before 2025-11-25, arguments that fail the input schema are JSON-RPC -32602.
        sid, _ = self.initialize(self.path, "2025-06-18")
        calls = [({"name": "shell", "arguments": {}}, -32602), ({"name": "shell", "arguments": "x"}, -32602),
                 ({"arguments": {}}, -32602), ({"name": "nope"}, -32602),
                 ({"name": "list_dir", "arguments": {"path": "/", "depth": 99}}, -32602)]
        for params, code in calls:
            st, body = self.post(self.path, {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params},
                                 session=sid, headers={"MCP-Protocol-Version": "2025-06-18"})
            self.assertEqual(st, 200)
            self.assertEqual(body["error"]["code"], code, (params, body))
        st, body = self.post(self.path, {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": [1]}, session=sid)
        self.assertEqual(body["error"]["code"], -32602)
        st, body = self.post(self.path, {"jsonrpc": "2.0", "id": 1, "method": "tools/list",
                                         "params": {"cursor": "x"}}, session=sid)
        self.assertEqual(body["error"]["code"], -32602)
        # From 2025-11-25 they are tool execution errors the model can correct.
        sid, _ = self.initialize(self.path, "2025-11-25")
        st, body = self.post(self.path, {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                                         "params": {"name": "shell", "arguments": {}}}, session=sid)
        self.assertTrue(body["result"]["isError"])
        self.assertIn("'command' is required", body["result"]["content"][0]["text"])

    def test_session_required_and_checked(self):
        ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
        st, body = self.post(self.path, ping)
        self.assertEqual((st, body["code"]), (400, "invalid_request"))
        self.assertIn("Mcp-Session-Id", body["message"])
        st, body = self.post(self.path, ping, session="0" * 32)
        self.assertEqual((st, body["code"]), (404, "session_not_found"))
        sid, _ = self.initialize(self.path)
        st, body = self.post(self.path, ping, session=sid)
        self.assertEqual((st, body), (200, {"jsonrpc": "2.0", "id": 1, "result": {}}))
        # a session belongs to its endpoint and sandbox
        st, body = self.post("/v1/mcp", ping, session=sid)
        self.assertEqual(st, 404)
        other = self.c.create(ttl_seconds=300)
        try:
            st, body = self.post("/v1/sandboxes/%s/mcp" % other["id"], ping, session=sid)
            self.assertEqual(st, 404)
        finally:
            self.c.delete(other["id"])
        # ... and to its org
        key2 = self.daemon.new_org_key("mcp-other")
        wsid, _ = self.initialize("/v1/mcp")
        st, body = self.post("/v1/mcp", ping, session=wsid, key=key2)
        self.assertEqual((st, body["code"]), (404, "session_not_found"))
        # protocol version header
        st, body = self.post(self.path, ping, session=sid, headers={"MCP-Protocol-Version": "2024-01-01"})
        self.assertEqual((st, body["code"]), (400, "invalid_request"))
        st, body = self.post(self.path, ping, session=sid, headers={"MCP-Protocol-Version": "2025-03-26"})
        self.assertEqual(st, 200)
        # DELETE ends it
        h = {"Mcp-Session-Id": sid}
        self.assertEqual(self.c.request("DELETE", self.path, headers=h, expect=204)[0], 204)
        self.assertEqual(self.c.request("DELETE", self.path, headers=h, expect=404)[1]["code"], "session_not_found")
        self.assertEqual(self.c.request("DELETE", self.path, expect=400)[1]["code"], "invalid_request")
        st, body = self.post(self.path, ping, session=sid)
        self.assertEqual(st, 404)

    def test_http_refusals(self):
        init = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": "2025-06-18"}}
        st, body = self.post(self.path, init, key="moat_wrong", expect=401)
        self.assertEqual(body["code"], "unauthorized")
        key2 = self.daemon.new_org_key("mcp-stranger")
        st, body = self.post(self.path, init, key=key2, expect=404)
        self.assertEqual(body["code"], "not_found")
        st, body = self.post("/v1/sandboxes/sb-00000000000000000/mcp", init, expect=404)
        self.assertEqual(body["code"], "not_found")
        st, body = self.post(self.path, init, headers={"Content-Type": "text/plain"})
        self.assertEqual((st, body["code"]), (415, "unsupported_media_type"))
        st, body = self.post(self.path, init, headers={"Accept": "text/html"})
        self.assertEqual((st, body["code"]), (406, "not_acceptable"))
        st, body = self.post(self.path, init, headers={"Origin": "http://evil.example"})
        self.assertEqual((st, body["code"]), (403, "forbidden"))
        st, body = self.post(self.path, init, headers={"Origin": "http://127.0.0.1:%d" % self.daemon.port})
        self.assertEqual(st, 200)
        st, body = self.c.request("GET", self.path, headers={"Accept": "text/event-stream"}, expect=405)
        self.assertEqual(body["code"], "method_not_allowed")
        st, body = self.c.request("PUT", "/v1/mcp", raw=b"{}", expect=405)
        self.assertEqual(body["code"], "method_not_allowed")
        st, body = self.post(self.path + "?x=1", init, expect=400)
        self.assertEqual(body["code"], "invalid_request")

    def test_concurrent_calls_on_one_session(self):
        import threading
        import time
        sid, _ = self.initialize(self.path)
        out, errs = {}, []

        def call(i):
            try:
                st, body = self.post(self.path, {"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {
                    "name": "shell", "arguments": {"command": "sleep 1; echo call-%d" % i}}}, session=sid)
                out[i] = (st, body)
            except Exception as e:  # reported below
                errs.append(e)
        t0 = time.time()
        ts = [threading.Thread(target=call, args=(i,)) for i in range(6)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)
        took = time.time() - t0
        self.assertEqual(errs, [])
        for i in range(6):
            st, body = out[i]
            self.assertEqual((st, body["id"]), (200, i))
            self.assertIn("call-%d\n" % i, body["result"]["content"][0]["text"])
        self.assertLess(took, 5.0, "six 1 s calls on one session took %.1f s: they ran one after another" % took)

    def test_sessions_per_org_are_bounded(self):
        # An org holds at most 64 sessions: opening one more ends its least recently used one.
        key = self.daemon.new_org_key("mcp-bound")
        saved, self.c = self.c, self.c.with_key(key)
        try:
            sids = [self.initialize("/v1/mcp")[0] for _ in range(65)]
            ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
            st, body = self.post("/v1/mcp", ping, session=sids[0])
            self.assertEqual((st, body["code"]), (404, "session_not_found"))
            for sid in (sids[1], sids[64]):
                st, body = self.post("/v1/mcp", ping, session=sid)
                self.assertEqual(st, 200, body)
        finally:
            self.c = saved
        # another org's sessions were not touched by that
        sid, _ = self.initialize("/v1/mcp")
        st, _ = self.post("/v1/mcp", {"jsonrpc": "2.0", "id": 1, "method": "ping"}, session=sid)
        self.assertEqual(st, 200)

    def test_paused_sandbox_is_a_tool_error(self):
        sb = self.c.create(ttl_seconds=300)
        path = "/v1/sandboxes/%s/mcp" % sb["id"]
        try:
            sid, _ = self.initialize(path)
            st, body = self.c.request("POST", "/v1/sandboxes/%s/pause" % sb["id"], body={}, expect=(200, 501, 503))
            if st != 200:
                self.skipTest("pause is not available here: %r" % (body,))
            call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                    "params": {"name": "shell", "arguments": {"command": "echo hi"}}}
            st, body = self.post(path, call, session=sid)
            self.assertEqual(st, 200)
            self.assertTrue(body["result"]["isError"])
            self.assertIn("error (sandbox_paused)", body["result"]["content"][0]["text"])
            self.c.request("POST", "/v1/sandboxes/%s/resume" % sb["id"], body={}, expect=200)
            st, body = self.post(path, call, session=sid)
            self.assertFalse(body["result"]["isError"], body)
            self.assertIn("hi", body["result"]["content"][0]["text"])
        finally:
            self.c.request("DELETE", "/v1/sandboxes/" + sb["id"], expect=(204, 404))

    def test_killed_sandbox_is_404(self):
        sb = self.c.create(ttl_seconds=300)
        path = "/v1/sandboxes/%s/mcp" % sb["id"]
        sid, _ = self.initialize(path)
        self.c.delete(sb["id"])
        st, body = self.post(path, {"jsonrpc": "2.0", "id": 1, "method": "ping"}, session=sid, expect=404)
        self.assertEqual(body["code"], "not_found")


class MCPIdleTest(DaemonTest):
    """A session unused for MOAT_MCP_SESSION_IDLE_S seconds is forgotten; using it keeps it alive."""
    pool = 0

    @classmethod
    def setUpClass(cls):
        old = os.environ.get("MOAT_MCP_SESSION_IDLE_S")
        os.environ["MOAT_MCP_SESSION_IDLE_S"] = "2"
        try:
            super().setUpClass()
        finally:
            if old is None:
                del os.environ["MOAT_MCP_SESSION_IDLE_S"]
            else:
                os.environ["MOAT_MCP_SESSION_IDLE_S"] = old

    def test_idle_session_expires(self):
        import time
        h = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        init = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": "2025-06-18"}}
        ping = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"}).encode()
        import http.client
        conn = http.client.HTTPConnection("127.0.0.1", self.daemon.port, timeout=30)
        conn.request("POST", "/v1/mcp", body=json.dumps(init), headers=dict(h, Authorization="Bearer " + self.c.key))
        resp = conn.getresponse()
        resp.read()
        sid = resp.getheader("Mcp-Session-Id")
        conn.close()
        hs = dict(h, **{"Mcp-Session-Id": sid})
        for _ in range(3):  # used every second: stays
            time.sleep(1.0)
            st, body = self.c.request("POST", "/v1/mcp", raw=ping, headers=hs, expect=(200, 404))
            self.assertEqual(st, 200, body)
        time.sleep(3.0)
        st, body = self.c.request("POST", "/v1/mcp", raw=ping, headers=hs, expect=(200, 404))
        self.assertEqual((st, body["code"]), (404, "session_not_found"))


@unittest.skipUnless(shutil.which("psql"), "no psql on the host (Debian's postgresql-client)")
class MCPDatabaseTest(DatabaseMixin, DaemonTest):
    """The workspace endpoint's database tools through the official client (the postgres template)."""
    pool = 0

    def run_databases(self, scenario):
        run = "mcp-" + uuid.uuid4().hex[:8]
        try:
            run_scenario(self, scenario, self.c.key, MOAT_RUN=run)
        finally:
            for d in self.c.request("GET", "/v1/databases")[1]["databases"]:
                if d["metadata"].get("run") == run or d["name"].startswith(run):
                    self._delete_db_quietly(self.c, d["id"])
        left = [d["id"] for d in self.c.request("GET", "/v1/databases")[1]["databases"]]
        self.assertEqual(left, [], "the scenario left databases")

    def test_client_databases(self):
        self.run_databases("databases")

    def test_client_database_branch(self):
        self.run_databases("database_branch")


if __name__ == "__main__":
    unittest.main()

"""test_e2b.py -- the unmodified npm E2B SDKs (`e2b` 2.51 and 2.45, `@e2b/code-interpreter`) against a real moatd.

Each test runs one scenario of a Node script in tests/node/ (e2b_control.mjs: control plane;
e2b_interp.mjs: the code interpreter; e2b_245.mjs: npm e2b 2.45, which checks the key's shape)
with the environment an E2B user would set to switch to moat: E2B_API_URL and E2B_SANDBOX_URL =
moatd's own listener, E2B_API_KEY = moatd's API key in E2B form (e2b_ + its hex). A scenario
prints "ok NAME" and exits 0; it kills every sandbox it made, also when it fails. Each run has a
timeout, so a hang is a failure.
"""

import http.client
import json
import os
import shutil
import subprocess
import sys
import time
import unittest
import urllib.parse

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
import moatd  # noqa: E402
from moattest import DaemonTest  # noqa: E402

NODE_DIR = os.path.join(moatd.REPO, "tests", "node")
NODE = shutil.which("node")
HAVE_SDK = os.path.isdir(os.path.join(NODE_DIR, "node_modules", "e2b")) and os.path.isdir(
    os.path.join(NODE_DIR, "node_modules", "@e2b", "code-interpreter"))
SCENARIO_TIMEOUT_S = 180


@unittest.skipUnless(NODE and HAVE_SDK, "node or the E2B npm packages (tests/node/node_modules) are missing; "
                     "scripts/deps.sh installs them")
class E2BTest(DaemonTest):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        moatd.ensure_template("code-interpreter")

    def scenario(self, script, name, env=None):
        url = "http://127.0.0.1:%d" % self.daemon.port
        e = dict(os.environ)
        for k in list(e):
            if k.startswith("E2B_"):
                del e[k]
        e.update({"E2B_API_URL": url, "E2B_SANDBOX_URL": url, "E2B_API_KEY": "e2b_" + self.c.key[5:], "MOAT_URL": url})
        e.update(env or {})
        try:
            p = subprocess.run([NODE, os.path.join(NODE_DIR, script), name], cwd=NODE_DIR, env=e,
                               capture_output=True, text=True, timeout=SCENARIO_TIMEOUT_S)
        except subprocess.TimeoutExpired as x:
            self.fail("%s %s hung for %d s\nstdout: %s\nstderr: %s\nmoatd log:\n%s" % (
                script, name, SCENARIO_TIMEOUT_S, x.stdout, x.stderr, self.daemon.log_tail(40)))
        if p.returncode == 0 and p.stdout.startswith("skip "):
            self.skipTest(p.stdout[5:].strip())
        if p.returncode != 0 or ("ok " + name) not in p.stdout:
            self.fail("%s %s exited %d\nstdout: %s\nstderr: %s\nmoatd log:\n%s" % (
                script, name, p.returncode, p.stdout, p.stderr[-6000:], self.daemon.log_tail(40)))

    # control plane (e2b_control.mjs)
    def test_create_info(self):
        self.scenario("e2b_control.mjs", "create_info")

    def test_list_paging(self):
        self.scenario("e2b_control.mjs", "list_paging")

    def test_set_timeout(self):
        self.scenario("e2b_control.mjs", "set_timeout")

    def test_kill(self):
        self.scenario("e2b_control.mjs", "kill")

    def test_connect(self):
        self.scenario("e2b_control.mjs", "connect")

    def test_pause_connect(self):
        self.scenario("e2b_control.mjs", "pause_connect")

    def test_bad_input(self):
        self.scenario("e2b_control.mjs", "bad_input")

    def test_envd_version_gates(self):
        self.scenario("e2b_control.mjs", "envd_version_gates")

    def test_sdk_245_keys_and_lifecycle(self):
        if not os.path.isdir(os.path.join(NODE_DIR, "node_modules", "e2b-245")):
            self.skipTest("npm e2b 2.45 (e2b-245) is missing; scripts/deps.sh installs it")
        self.scenario("e2b_245.mjs", "keys_and_lifecycle")

    # code interpreter (e2b_interp.mjs)
    def test_interp_state_and_png(self):
        self.scenario("e2b_interp.mjs", "state_and_png")

    def test_interp_kernel_compat(self):
        self.scenario("e2b_interp.mjs", "kernel_compat")

    def test_interp_error(self):
        self.scenario("e2b_interp.mjs", "error")

    def test_interp_contexts(self):
        self.scenario("e2b_interp.mjs", "contexts")

    def test_interp_bad_input(self):
        self.scenario("e2b_interp.mjs", "bad_input")

    def test_snapshot_fork(self):
        self.scenario("e2b_control.mjs", "snapshot_fork")

    # by hand: routing by Host (a TLS proxy in front), tokens, error shapes
    def e2b_create(self, **body):
        st, sb = self.c.request("POST", "/v2/sandboxes", body=dict({"templateID": "base"}, **body), auth=False,
                                headers={"X-API-KEY": self.c.key}, expect=201)
        self.addCleanup(self._delete_quietly, self.c, sb["sandboxID"])
        return sb

    def test_host_routing_and_tokens(self):
        sb = self.e2b_create(timeout=120)
        sid, tok = sb["sandboxID"], sb["envdAccessToken"]
        self.assertEqual(sb["trafficAccessToken"], tok)
        self.assertRegex(sb["envdVersion"], r"^0\.6\.\d+$")
        host = {"Host": "49983-%s.moat.example:443" % sid}
        st, _ = self.c.request("GET", "/health", auth=False, headers=dict(host, **{"X-Access-Token": tok}),
                               expect=204)
        # the interpreter port, by Host too (a base sandbox has python3)
        st, ctxs = self.c.request("GET", "/contexts", auth=False, expect=200, headers={
            "Host": "49999-%s.moat.example" % sid, "E2B-Traffic-Access-Token": tok})
        # the default contexts E2B's server starts at boot (base has python3, no node)
        self.assertEqual([(x["id"], x["language"]) for x in ctxs], [("e2bdefaultpython", "python")])
        # no token, a token of another sandbox, a forged one: 401 {"code": 401, "message"}
        other = self.e2b_create()
        for bad in (None, other["envdAccessToken"], tok[:-1] + ("0" if tok[-1] != "0" else "1"), "e2b1__00"):
            h = dict(host)
            if bad:
                h["X-Access-Token"] = bad
            with self.assertRaises(moatd.HTTPError) as cm:
                self.c.request("GET", "/health", auth=False, headers=h)
            self.assertEqual(cm.exception.status, 401)
            self.assertEqual(cm.exception.body["code"], 401)
            self.assertIsInstance(cm.exception.body["message"], str)
        # the org's API key also opens the sandbox's ports
        self.c.request("GET", "/health", auth=False, headers=dict(host, **{"X-API-KEY": self.c.key}), expect=204)
        # an unknown sandbox (the org's key; a token is only good for its own sandbox), a port
        # nothing listens on: the proxy's 502
        for h in ({"Host": "49983-sb-0000000000000000x.moat.example", "X-API-KEY": self.c.key},
                  {"Host": "3000-%s.moat.example" % sid, "X-Access-Token": tok}):
            with self.assertRaises(moatd.HTTPError) as cm:
                self.c.request("GET", "/health", auth=False, headers=h)
            self.assertEqual(cm.exception.status, 502, cm.exception.body)
            self.assertEqual(cm.exception.body["code"], 502)
        # GET /sandboxes/{id} hands out the same token; v1 shows the same sandbox
        st, info = self.c.request("GET", "/sandboxes/" + sid, auth=False, headers={"X-API-KEY": self.c.key})
        self.assertEqual(info["envdAccessToken"], tok)
        self.assertEqual(self.c.get(sid)["state"], "running")

    def test_user_port_get_host(self):
        """Sandbox.getHost(port): a server the user starts on port 8000 answers through moatd, routed
        by the E2b-Sandbox-* headers and by Host; a POST body reaches it; a port nothing listens on
        is E2B's 502."""
        sb = self.e2b_create(templateID="code-interpreter-v1", timeout=120)
        sid, tok = sb["sandboxID"], sb["envdAccessToken"]
        self.c.put_file(sid, "/tmp/www/hello.txt", b"hello from the sandbox\n")
        server = ("import http.server as h\n"
                  "class H(h.SimpleHTTPRequestHandler):\n"
                  "    def do_POST(self):\n"
                  "        n = int(self.headers['Content-Length']); b = self.rfile.read(n)\n"
                  "        self.send_response(200); self.send_header('Content-Length', str(len(b))); self.end_headers()\n"
                  "        self.wfile.write(b[::-1])\n"
                  "h.ThreadingHTTPServer(('127.0.0.1', 8000), lambda *a: H(*a, directory='/tmp/www')).serve_forever()\n")
        self.c.put_file(sid, "/tmp/server.py", server.encode())
        self.c.request("POST", "/v1/sandboxes/%s/exec" % sid, body={"argv": ["python3", "/tmp/server.py"],
                                                                      "background": True}, expect=201)
        by_header = {"E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": "8000", "X-Access-Token": tok}
        by_host = {"Host": "8000-%s.moat.example" % sid, "X-Access-Token": tok}
        deadline = time.time() + 20
        while True:
            try:
                st, body = self.c.request("GET", "/hello.txt", auth=False, headers=by_header)
                break
            except moatd.HTTPError as x:
                if x.status != 502 or time.time() > deadline:
                    raise
                time.sleep(0.1)
        self.assertEqual(body, b"hello from the sandbox\n")
        st, body = self.c.request("GET", "/hello.txt", auth=False, headers=by_host, expect=200)
        self.assertEqual(body, b"hello from the sandbox\n")
        payload = os.urandom(300000)
        st, body = self.c.request("POST", "/echo", raw=payload, auth=False,
                                  headers=dict(by_header, **{"Content-Type": "application/octet-stream"}), expect=200)
        self.assertEqual(body, payload[::-1])
        with self.assertRaises(moatd.HTTPError) as cm:
            self.c.request("GET", "/", auth=False, headers=dict(by_header, **{"E2b-Sandbox-Port": "8001"}))
        self.assertEqual(cm.exception.status, 502)
        self.assertEqual(cm.exception.body["code"], 502)
        with self.assertRaises(moatd.HTTPError) as cm:
            self.c.request("GET", "/hello.txt", auth=False, headers={"E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": "8000"})
        self.assertEqual(cm.exception.status, 401)

    def test_unversioned_routes_and_paging(self):
        """POST /sandboxes and POST /sandboxes/{id}/connect (E2B's OpenAPI has both beside /v2);
        lists newest first, nextToken pages on without repeats or gaps, the state filter."""
        key = {"X-API-KEY": "e2b_" + self.c.key[5:]}
        tag = "pg-%d" % os.getpid()
        ids = []
        for i in range(3):
            st, sb = self.c.request("POST", "/sandboxes", body={"templateID": "base", "timeout": 120,
                                                                "metadata": {"suite": tag}},
                                    auth=False, headers=key, expect=201)
            self.addCleanup(self._delete_quietly, self.c, sb["sandboxID"])
            ids.append(sb["sandboxID"])
        st, info = self.c.request("POST", "/sandboxes/%s/connect" % ids[0], body={"timeout": 300}, auth=False,
                                  headers=key, expect=200)
        self.assertEqual(info["sandboxID"], ids[0])
        got, token = [], None
        for _ in range(4):
            q = {"metadata": "suite=" + tag, "limit": "1", "state": "running"}
            if token:
                q["nextToken"] = token
            conn = http.client.HTTPConnection("127.0.0.1", self.daemon.port, timeout=60)
            conn.request("GET", "/v2/sandboxes?" + urllib.parse.urlencode(q), headers=key)
            resp = conn.getresponse()
            page = json.loads(resp.read())
            token = resp.getheader("x-next-token")
            conn.close()
            self.assertEqual(resp.status, 200, page)
            got += [s["sandboxID"] for s in page]
            if not token:
                break
        self.assertEqual(got, ids[::-1])

        def lst(**q):
            q.setdefault("metadata", "suite=" + tag)
            return [s["sandboxID"] for s in self.c.request("GET", "/v2/sandboxes", query=q, auth=False,
                                                           headers=key, expect=200)[1]]
        # order=asc pages oldest first, with the token of asc
        conn = http.client.HTTPConnection("127.0.0.1", self.daemon.port, timeout=60)
        conn.request("GET", "/v2/sandboxes?" + urllib.parse.urlencode(
            {"metadata": "suite=" + tag, "limit": "2", "order": "asc"}), headers=key)
        resp = conn.getresponse()
        first = [s["sandboxID"] for s in json.loads(resp.read())]
        tok = resp.getheader("x-next-token")
        conn.close()
        self.assertEqual(first, ids[:2])
        self.assertEqual(lst(order="asc", nextToken=tok), ids[2:])
        self.assertEqual(lst(order="desc"), ids[::-1])
        # template: E2B's name or moat's; startedAfter: at or after
        self.assertEqual(lst(template="base"), ids[::-1])
        self.assertEqual(lst(template="code-interpreter-v1"), [])
        st, info = self.c.request("GET", "/sandboxes/" + ids[1], auth=False, headers=key, expect=200)
        self.assertEqual(lst(startedAfter=info["startedAt"]), [ids[2], ids[1]])
        self.assertEqual(lst(startedAfter="2999-01-01T00:00:00Z"), [])
        st, paused = self.c.request("GET", "/sandboxes", query={"metadata": "suite=" + tag, "state": "paused"},
                                    auth=False, headers=key, expect=200)
        self.assertEqual(paused, [])

    def test_control_errors(self):
        key = {"X-API-KEY": self.c.key}
        cases = [
            ("POST", "/v2/sandboxes", {"templateID": "base", "timeout": 0}, 400),
            ("POST", "/v2/sandboxes", {"templateID": "base", "autoPause": True}, 400),
            ("POST", "/v2/sandboxes", {"templateID": "base", "bogus": 1}, 400),
            ("POST", "/v2/sandboxes", {"templateID": 7}, 400),
            ("POST", "/v2/sandboxes", {"templateID": "nope"}, 404),
            ("POST", "/v2/sandboxes", {"templateID": "base", "envVars": {"1BAD": "x"}}, 400),
            ("GET", "/v2/sandboxes?state=dead", None, 400),
            ("GET", "/v2/sandboxes?limit=0", None, 400),
            ("GET", "/v2/sandboxes?nextToken=zzz", None, 400),
            ("GET", "/sandboxes?nextToken=zzz", None, 400),
            ("GET", "/v2/sandboxes?nextToken=", None, 400),
            ("GET", "/v2/sandboxes?nextToken=12.", None, 400),
            ("GET", "/v2/sandboxes?nextToken=.sb-0000000000000000x", None, 400),
            ("GET", "/v2/sandboxes?nextToken=-1.sb-0000000000000000x", None, 400),
            ("GET", "/v2/sandboxes?nextToken=99999999999999999999999.sb-0000000000000000x", None, 400),
            ("GET", "/v2/sandboxes?nextToken=1.../../etc", None, 400),
            ("GET", "/v2/sandboxes?limit=abc", None, 400),
            ("GET", "/v2/sandboxes?order=up", None, 400),
            ("GET", "/v2/sandboxes?startedAfter=yesterday", None, 400),
            ("GET", "/v2/sandboxes?startedAfter=2026-13-01T00:00:00Z", None, 400),
            ("GET", "/v2/sandboxes?limit=-1", None, 400),
            ("POST", "/sandboxes/sb-0000000000000000x/connect", {}, 404),
            ("POST", "/sandboxes", {"templateID": "base", "allow_internet_access": "yes"}, 400),
            ("GET", "/sandboxes/sb-0000000000000000x", None, 404),
            ("DELETE", "/sandboxes/sb-0000000000000000x", None, 404),
            ("POST", "/sandboxes/sb-0000000000000000x/timeout", {"timeout": 10}, 404),
            ("POST", "/v2/sandboxes/sb-0000000000000000x/connect", {}, 404),
            ("GET", "/sandboxes/sb-0000000000000000x/metrics", None, 404),
            ("POST", "/sandboxes/sb-0000000000000000x/metrics", None, 405),
            ("GET", "/sandboxes/sb-0000000000000000x/logs", None, 501),
            ("PUT", "/sandboxes/sb-0000000000000000x", None, 405),
            ("GET", "/secrets", None, 501),
            ("GET", "/templates", None, 501),
            ("POST", "/v3/templates", {"name": "Not A Name"}, 400),
            ("GET", "/volumes", None, 501),
            ("GET", "/v2/nothing-here", None, None),
        ]
        for method, path, body, status in cases:
            raw = None if body is None else json.dumps(body).encode()
            if status is None:  # not an E2B path: the v1 router's 404
                self.c.request(method, path, auth=False, headers=key, expect=404)
                continue
            with self.assertRaises(moatd.HTTPError, msg=(method, path)) as cm:
                self.c.request(method, path, raw=raw, auth=False,
                               headers=dict(key, **{"Content-Type": "application/json"}))
            e = cm.exception
            self.assertEqual(e.status, status, (method, path, e.body))
            self.assertEqual(e.body.get("code"), status, (method, path, e.body))
            self.assertIsInstance(e.body.get("message"), str)
        # malformed JSON and a wrong key
        with self.assertRaises(moatd.HTTPError) as cm:
            self.c.request("POST", "/v2/sandboxes", raw=b"{nope", auth=False, headers=key)
        self.assertEqual((cm.exception.status, cm.exception.body["code"]), (400, 400))
        with self.assertRaises(moatd.HTTPError) as cm:
            self.c.request("GET", "/v2/sandboxes", auth=False, headers={"X-API-KEY": "moat_" + "0" * 64})
        self.assertEqual((cm.exception.status, cm.exception.body["code"]), (401, 401))


@unittest.skipUnless(NODE and HAVE_SDK, "node or the E2B npm packages are missing")
class E2BRestartTest(DaemonTest):
    def test_token_survives_restart(self):
        st, sb = self.c.request("POST", "/v2/sandboxes", body={"templateID": "base"}, auth=False,
                                headers={"X-API-KEY": self.c.key}, expect=201)
        sid, tok = sb["sandboxID"], sb["envdAccessToken"]
        self.addCleanup(self._delete_quietly, self.c, sid)
        h = {"Host": "49983-%s.moat.example" % sid, "X-Access-Token": tok}
        self.c.request("GET", "/health", auth=False, headers=h, expect=204)
        secret = os.path.join(self.daemon.data_dir, "e2b-secret")
        self.assertEqual(os.stat(secret).st_mode & 0o777, 0o600)
        self.daemon.kill9()
        self.daemon.start()
        self.c = self.daemon.client
        self.c.request("GET", "/health", auth=False, headers=h, expect=204)
        st, info = self.c.request("GET", "/sandboxes/" + sid, auth=False, headers={"X-API-KEY": self.c.key})
        self.assertEqual(info["envdAccessToken"], tok)


if __name__ == "__main__":
    unittest.main()

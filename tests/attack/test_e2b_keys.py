"""test_e2b_keys.py -- the E2B-shaped form of an API key ("e2b_" + the moat key's 64 hex digits,
what E2B's SDKs accept) reaches its own org only. Org B, holding its own key in E2B shape, goes
after org A's sandbox through every E2B route (control plane, unversioned and /v2), the envd
proxy (files, directory listing, process start) and v1; afterwards A's sandbox runs on, its file
is intact and B's marker file was never written. Malformed or unregistered keys in E2B shape are
401 everywhere."""

import json
import os
import struct
import sys
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
import moatd  # noqa: E402
from moattest import DaemonTest  # noqa: E402


def e2b_form(key):
    assert key.startswith("moat_") and len(key) == 69, key
    return "e2b_" + key[5:]


class E2BKeyTest(DaemonTest):
    pool = 1

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.tag = uuid.uuid4().hex[:10]
        cls.key_a = e2b_form(cls.c.key)
        cls.key_b = e2b_form(cls.daemon.new_org_key("org-b-" + cls.tag))

    def e2b(self, method, path, key, body=None, headers=None, expect=None):
        h = {"X-API-KEY": key}
        h.update(headers or {})
        return self.c.request(method, path, body=body, auth=False, headers=h, expect=expect)

    def status(self, method, path, key, body=None, headers=None, raw=None):
        h = {"X-API-KEY": key} if key else {}
        h.update(headers or {})
        try:
            st, body = self.c.request(method, path, body=body, raw=raw, auth=False, headers=h)
            return st, body
        except moatd.HTTPError as e:
            return e.status, e.body

    def create_a(self):
        st, sb = self.e2b("POST", "/sandboxes", self.key_a, body={"templateID": "base", "timeout": 300}, expect=201)
        self.addCleanup(self._delete_quietly, self.c, sb["sandboxID"])
        return sb["sandboxID"]

    def test_e2b_form_is_the_key_of_its_org(self):
        sid = self.create_a()
        # the same sandbox through v1 with the moat form and with the E2B form
        self.assertEqual(self.c.get(sid)["state"], "running")
        st, v1 = self.c.request("GET", "/v1/sandboxes/" + sid, auth=False,
                                headers={"Authorization": "Bearer " + self.key_a})
        self.assertEqual(v1["id"], sid)
        st, info = self.e2b("GET", "/sandboxes/" + sid, self.key_a, expect=200)
        self.assertEqual(info["sandboxID"], sid)

    def test_malformed_e2b_keys_are_401(self):
        hexpart = self.key_a[4:]
        bad = ["e2b_" + hexpart.upper(), "e2b_" + hexpart[:-1], "e2b_" + hexpart + "0", "e2b_",
               "e2b_" + ("0" * 64), "E2B_" + hexpart, "e2b_moat_" + hexpart, "e2b_" + hexpart[:-1] + "g"]
        for k in bad:
            for method, path in (("GET", "/v2/sandboxes"), ("POST", "/sandboxes"), ("GET", "/v1/sandboxes")):
                h = {"X-API-KEY": k} if not path.startswith("/v1") else {"Authorization": "Bearer " + k}
                st, body = self.status(method, path, None, body={"templateID": "base"} if method == "POST" else None,
                                       headers=h)
                self.assertEqual(st, 401, (k, path, body))
                self.assertEqual(body["code"], "unauthorized" if path.startswith("/v1") else 401, body)

    def test_other_org_e2b_key_cannot_reach_the_sandbox(self):
        sid = self.create_a()
        self.c.put_file(sid, "/root/secret-" + self.tag, b"only-in-A\n")
        kb = self.key_b
        # control plane: not found for B, unversioned and /v2
        for method, path, body in (
                ("GET", "/sandboxes/" + sid, None),
                ("POST", "/sandboxes/%s/connect" % sid, {"timeout": 60}),
                ("POST", "/v2/sandboxes/%s/connect" % sid, {"timeout": 60}),
                ("POST", "/sandboxes/%s/timeout" % sid, {"timeout": 1}),
                ("POST", "/sandboxes/%s/pause" % sid, None),
                ("POST", "/sandboxes/%s/snapshots" % sid, {}),
                ("POST", "/sandboxes/%s/fork" % sid, {}),
                ("GET", "/sandboxes/%s/metrics" % sid, None),
                ("DELETE", "/sandboxes/" + sid, None)):
            st, rb = self.status(method, path, kb, body=body)
            self.assertIn(st, (400, 404), (method, path, st, rb))
        for path in ("/sandboxes", "/v2/sandboxes", "/v2/sandboxes?state=running,paused"):
            st, lst = self.e2b("GET", path, kb, expect=200)
            self.assertNotIn(sid, [s["sandboxID"] for s in lst])
        # v1 with B's key in E2B shape
        st, rb = self.status("GET", "/v1/sandboxes/" + sid, None, headers={"Authorization": "Bearer " + kb})
        self.assertEqual(st, 404, rb)
        st, rb = self.status("POST", "/v1/sandboxes/%s/exec" % sid, None, body={"cmd": "touch /tmp/pwned"},
                             headers={"Authorization": "Bearer " + kb})
        self.assertEqual(st, 404, rb)
        # the envd proxy (E2B_SANDBOX_URL, routed by header and by Host): files, listing, process
        marker = "/root/pwned-" + self.tag
        route = {"E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": "49983"}
        host = {"Host": "49983-%s.moat.example" % sid}
        for hdr in (route, host):
            st, rb = self.status("GET", "/files?path=/root/secret-" + self.tag, kb, headers=hdr)
            self.assertGreaterEqual(st, 400, (hdr, rb))
            self.assertNotIn(b"only-in-A", rb if isinstance(rb, bytes) else json.dumps(rb).encode())
            boundary = "xx" + self.tag
            form = ("--%s\r\nContent-Disposition: form-data; name=\"file\"; filename=\"f\"\r\n"
                    "Content-Type: application/octet-stream\r\n\r\npwned\r\n--%s--\r\n" % (boundary, boundary))
            st, rb = self.status("POST", "/files?path=" + marker, kb, raw=form.encode(),
                                 headers=dict(hdr, **{"Content-Type": "multipart/form-data; boundary=" + boundary}))
            self.assertGreaterEqual(st, 400, (hdr, rb))
            st, rb = self.status("POST", "/filesystem.Filesystem/ListDir", kb, raw=json.dumps({"path": "/root"}).encode(),
                                 headers=dict(hdr, **{"Content-Type": "application/json"}))
            self.assertGreaterEqual(st, 400, (hdr, rb))
            self.assertNotIn("secret-", json.dumps(rb) if not isinstance(rb, bytes) else rb.decode(errors="replace"))
            msg = json.dumps({"process": {"cmd": "/bin/sh", "args": ["-c", "echo x > %s.p" % marker]}}).encode()
            st, rb = self.status("POST", "/process.Process/Start", kb, raw=struct.pack(">BI", 0, len(msg)) + msg,
                                 headers=dict(hdr, **{"Content-Type": "application/connect+json",
                                                      "Connect-Protocol-Version": "1"}))
            # Connect streams answer 200 with an error end-of-stream, or the proxy answers 4xx/5xx
            if st == 200:
                self.assertNotIn(b'"pid"', rb if isinstance(rb, bytes) else json.dumps(rb).encode())
        # the effect, from outside B: A runs, its file is intact, nothing of B's was written
        self.assertEqual(self.c.get(sid)["state"], "running")
        self.assertEqual(self.c.get_file(sid, "/root/secret-" + self.tag), b"only-in-A\n")
        r = self.c.exec(sid, cmd="ls /root")
        self.assertNotIn("pwned", r["stdout"], r)
        st, info = self.e2b("GET", "/sandboxes/" + sid, self.key_a, expect=200)
        left = info.get("endAt")
        self.assertTrue(left, info)

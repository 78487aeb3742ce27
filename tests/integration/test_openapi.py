"""test_openapi.py -- docs/openapi.yaml is a well-formed OpenAPI 3.1 document, docs/api.md is what
scripts/openapi_md.py makes of it, and a real moatd serves every documented operation (and refuses the
methods a documented path does not list). tests/unit/test_openapi_routes.c checks the other direction:
every route kind the router has is documented."""

import http.client
import json
import os
import re
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "lib"))
from moattest import DaemonTest  # noqa: E402

DOC = os.path.join(REPO, "docs", "openapi.yaml")
METHODS = ("get", "put", "post", "delete", "patch")
SAMPLES = {"id": "sb-0123456789abcdefg", "ref": "4242", "cid": "ctx-1", "sid": "snap-0123456789abcdefg",
           "name": "base"}


def load():
    with open(DOC, encoding="utf-8") as f:
        return json.load(f)  # JSON-compatible YAML by design


def operations(doc):
    for path, item in doc["paths"].items():
        for m in METHODS:
            if m in item:
                yield path, m, item[m]


class OpenAPIDocumentTest(unittest.TestCase):
    def setUp(self):
        self.doc = load()

    def test_shape(self):
        d = self.doc
        self.assertEqual(d["openapi"], "3.1.0")
        for k in ("title", "version"):
            self.assertIn(k, d["info"])
        self.assertEqual(set(d["components"]["securitySchemes"]), {"bearerAuth", "apiKey"})
        ids = set()
        for path, m, op in operations(d):
            where = "%s %s" % (m.upper(), path)
            self.assertTrue(path == "/healthz" or path.startswith("/v1/"), where)
            self.assertNotIn(op["operationId"], ids, where)
            ids.add(op["operationId"])
            for k in ("x-route", "summary", "tags", "responses"):
                self.assertIn(k, op, where)
            # path parameters: each {p} is declared, and nothing else is
            declared = set()
            for p in op.get("parameters", []):
                p = self.resolve(p["$ref"]) if "$ref" in p else p
                if p["in"] == "path":
                    declared.add(p["name"])
                    self.assertTrue(p.get("required"), where)
            self.assertEqual(declared, set(re.findall(r"\{(\w+)\}", path)), where)
            for code, r in op["responses"].items():
                self.assertRegex(code, r"^[1-5]\d\d$", where)
                if int(code) >= 400:
                    r = self.resolve(r["$ref"]) if "$ref" in r else r
                    self.assertEqual(r["content"]["application/json"]["schema"], {"$ref": "#/components/schemas/Error"},
                                     "%s %s" % (where, code))
            self.assertTrue(any(c.startswith(("1", "2")) for c in op["responses"]) or m == "get" and "mcp" in path,
                            where)
            if op.get("security") != []:
                self.assertIn("401", op["responses"], where)

    def resolve(self, ref):
        node = self.doc
        for part in ref.lstrip("#/").split("/"):
            self.assertIn(part, node, ref)
            node = node[part]
        return node

    def test_every_ref_resolves(self):
        refs = []

        def walk(n):
            if isinstance(n, dict):
                for k, v in n.items():
                    if k == "$ref":
                        refs.append(v)
                    else:
                        walk(v)
            elif isinstance(n, list):
                for v in n:
                    walk(v)
        walk(self.doc)
        self.assertGreater(len(refs), 100)
        for r in refs:
            self.assertTrue(r.startswith("#/components/"), r)
            self.resolve(r)

    def test_reference_is_current(self):
        r = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "openapi_md.py"), "--check"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
        self.assertEqual(r.returncode, 0, r.stdout.decode(errors="replace")[-3000:])


class OpenAPIServedTest(DaemonTest):
    """moatd answers every documented operation as a route (401 without a key, not 404) and 405 for the
    methods a documented path does not list."""
    pool = 0

    def raw(self, method, path, headers=None):
        conn = http.client.HTTPConnection("127.0.0.1", self.daemon.port, timeout=60)
        try:
            conn.request(method, path, body=b"" if method in ("POST", "PUT", "PATCH") else None, headers=headers or {})
            resp = conn.getresponse()
            body = resp.read()
            return resp.status, body
        finally:
            conn.close()

    def test_documented_operations_are_served(self):
        doc = load()
        n = 0
        for path, m, op in operations(doc):
            url = re.sub(r"\{(\w+)\}", lambda g: SAMPLES[g.group(1)], path)
            st, body = self.raw(m.upper(), url)
            if op.get("security") == []:
                self.assertEqual(st, 200, "%s %s -> %d %r" % (m.upper(), url, st, body[:200]))
            else:
                self.assertEqual(st, 401, "%s %s -> %d %r" % (m.upper(), url, st, body[:200]))
                self.assertEqual(json.loads(body)["code"], "unauthorized")
            n += 1
            for other in METHODS:
                if other in doc["paths"][path]:
                    continue
                st, body = self.raw(other.upper(), url)
                self.assertEqual(st, 405, "%s %s (undocumented) -> %d %r" % (other.upper(), url, st, body[:200]))
        self.assertGreater(n, 40)


if __name__ == "__main__":
    unittest.main()

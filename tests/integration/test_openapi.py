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
           "kid": "key-0123456789abcdef",
           "name": "base", "port": "8080", "path": "static/app.js"}


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
        self.assertEqual(set(d["components"]["securitySchemes"]), {"bearerAuth", "apiKey", "portToken", "portTokenQuery"})
        ids = set()
        for path, m, op in operations(d):
            where = "%s %s" % (m.upper(), path)
            self.assertTrue(path in ("/healthz", "/metrics", "/ui") or path.startswith(("/v1/", "/ui/")), where)
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
            self.assertTrue(any(c.startswith(("1", "2")) for c in op["responses"]) or m == "get" and "mcp" in path
                            or path == "/ui" and "308" in op["responses"],
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
            if op.get("security") == [] and (path == "/ui" or path.startswith("/ui/")):
                # the dashboard's routes: a bare request gets one of their documented answers (a
                # redirect, 403 without X-Moat-UI, 401 without a session, 404 for a file not built)
                self.assertIn(str(st), op["responses"], "%s %s -> %d %r" % (m.upper(), url, st, body[:200]))
            elif op.get("security") == []:
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


class Validator:
    """Checks a JSON value against the subset of JSON Schema docs/openapi.yaml uses: $ref, oneOf, type
    (also a list), enum, const, required, properties, additionalProperties, items, pattern, minimum,
    maximum. Returns a list of problems (empty: valid)."""

    TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}

    def __init__(self, doc):
        self.doc = doc

    def is_type(self, v, t):
        if t == "integer":
            return isinstance(v, int) and not isinstance(v, bool)
        if t == "number":
            return isinstance(v, (int, float)) and not isinstance(v, bool)
        return isinstance(v, self.TYPES[t])

    def check(self, v, sch, where="$"):
        if "$ref" in sch:
            node = self.doc
            for part in sch["$ref"].lstrip("#/").split("/"):
                node = node[part]
            return self.check(v, node, where)
        if "oneOf" in sch:
            results = [self.check(v, alt, where) for alt in sch["oneOf"]]
            if sum(1 for r in results if not r) != 1:
                return ["%s: matches %d of oneOf (%s)" % (where, sum(1 for r in results if not r),
                                                         "; ".join(p for r in results for p in r[:2]))]
            return []
        errs = []
        t = sch.get("type")
        if t is not None:
            ts = t if isinstance(t, list) else [t]
            if not any(self.is_type(v, x) for x in ts):
                return ["%s: %r is not %s" % (where, v, t)]
        if "const" in sch and v != sch["const"]:
            errs.append("%s: %r is not %r" % (where, v, sch["const"]))
        if "enum" in sch and v not in sch["enum"]:
            errs.append("%s: %r not in %r" % (where, v, sch["enum"]))
        if isinstance(v, str) and "pattern" in sch and not re.search(sch["pattern"], v):
            errs.append("%s: %r does not match %s" % (where, v, sch["pattern"]))
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            if "minimum" in sch and v < sch["minimum"] or "maximum" in sch and v > sch["maximum"]:
                errs.append("%s: %r out of range" % (where, v))
        if isinstance(v, dict):
            props = sch.get("properties", {})
            for k in sch.get("required", []):
                if k not in v:
                    errs.append("%s: missing %s" % (where, k))
            addl = sch.get("additionalProperties", True)
            for k, x in v.items():
                if k in props:
                    errs += self.check(x, props[k], "%s.%s" % (where, k))
                elif addl is False:
                    errs.append("%s: undocumented field %s" % (where, k))
                elif isinstance(addl, dict):
                    errs += self.check(x, addl, "%s.%s" % (where, k))
        if isinstance(v, list) and "items" in sch:
            for i, x in enumerate(v):
                errs += self.check(x, sch["items"], "%s[%d]" % (where, i))
        return errs


class OpenAPIResponsesTest(DaemonTest):
    """Live answers of moatd match the schemas the document gives them."""

    def setUp(self):
        self.doc = load()
        self.v = Validator(self.doc)

    def schema_of(self, path, method, status, ctype="application/json"):
        r = self.doc["paths"][path][method]["responses"][str(status)]
        if "$ref" in r:
            r = self.v.doc["components"]["responses"][r["$ref"].rsplit("/", 1)[1]]
        return r["content"][ctype]["schema"]

    def conforms(self, value, path, method, status):
        problems = self.v.check(value, self.schema_of(path, method, status))
        self.assertEqual(problems, [], "%s %s %s: %r" % (method.upper(), path, status, value))

    def test_live_contexts_match_the_schemas(self):
        c = self.c
        sid = self.sandbox(template="code-interpreter", ttl_seconds=600)["id"]
        P = "/v1/sandboxes/{id}/contexts"
        base = "/v1/sandboxes/%s/contexts" % sid
        st, ctx = c.request("POST", base, body={"language": "python"}, expect=201)
        self.conforms(ctx, P, "post", 201)
        self.conforms(c.request("GET", base)[1], P, "get", 200)
        for code in ("x = 41\nprint('out')\nx + 1", "1/0"):
            st, ex = c.request("POST", "%s/%s/run" % (base, ctx["id"]), body={"code": code})
            self.conforms(ex, P + "/{cid}/run", "post", 200)
        st, ctx2 = c.request("POST", base, body={"language": "bash"}, expect=201)
        st, ex = c.request("POST", "%s/%s/run" % (base, ctx2["id"]), body={"code": "echo hi; false"})
        self.conforms(ex, P + "/{cid}/run", "post", 200)
        self.conforms(c.request("POST", "%s/%s/restart" % (base, ctx["id"]), body={})[1], P + "/{cid}/restart", "post",
                      200)
        st, err = c.request("POST", "%s/nope/run" % base, body={"code": "1"}, expect=404)
        self.conforms(err, P + "/{cid}/run", "post", 404)

    def test_validator_rejects(self):
        sb = {"$ref": "#/components/schemas/Sandbox"}
        self.assertTrue(self.v.check({"id": "sb-x"}, sb))
        self.assertTrue(self.v.check({"code": 1, "message": "m"}, {"$ref": "#/components/schemas/Error"}))
        self.assertTrue(self.v.check({"code": "a", "message": "m", "extra": 1}, {"$ref": "#/components/schemas/Error"}))
        self.assertEqual(self.v.check({"code": "a", "message": "m"}, {"$ref": "#/components/schemas/Error"}), [])

    def test_live_answers_match_the_schemas(self):
        c = self.c
        self.conforms(c.healthz(), "/healthz", "get", 200)
        sb = self.sandbox(ttl_seconds=600, metadata={"who": "openapi"})
        sid = sb["id"]
        P = "/v1/sandboxes/{id}"
        self.conforms(sb, "/v1/sandboxes", "post", 201)
        self.conforms(c.get(sid), P, "get", 200)
        self.conforms(c.request("GET", "/v1/sandboxes")[1], "/v1/sandboxes", "get", 200)
        self.conforms(c.request("GET", "/v1/sandboxes", query={"limit": 1})[1], "/v1/sandboxes", "get", 200)
        self.conforms(c.patch(sid, ttl_seconds=900), P, "patch", 200)
        self.conforms(c.exec(sid, cmd="echo hi; printf '\\377' >&2"), P + "/exec", "post", 200)
        st, bg = c.request("POST", "/v1/sandboxes/%s/exec" % sid, body={"cmd": "sleep 1", "background": True,
                                                                           "tag": "oa"}, expect=201)
        self.conforms(bg, P + "/exec", "post", 201)
        self.conforms(c.request("GET", "/v1/sandboxes/%s/processes" % sid)[1], P + "/processes", "get", 200)
        self.conforms(c.put_file(sid, "/root/oa/a.txt", b"abc"), P + "/files", "put", 200)
        self.conforms(c.stat(sid, "/root/oa/a.txt"), P + "/files/stat", "get", 200)
        self.conforms(c.list_files(sid, "/root/oa"), P + "/files/list", "get", 200)
        self.conforms(c.mkdir(sid, "/root/oa/d"), P + "/files/mkdir", "post", 201)
        self.conforms(c.move(sid, "/root/oa/a.txt", "/root/oa/b.txt"), P + "/files/move", "post", 200)
        self.conforms(c.request("GET", "/v1/templates")[1], "/v1/templates", "get", 200)
        self.conforms(c.request("GET", "/v1/snapshots")[1], "/v1/snapshots", "get", 200)
        st, body = c.request("POST", "/v1/sandboxes/%s/pause" % sid, body={}, expect=(200, 501, 503))
        if st == 200:
            self.conforms(body, P + "/pause", "post", 200)
            self.conforms(c.request("POST", "/v1/sandboxes/%s/resume" % sid, body={})[1], P + "/resume", "post", 200)
        # MCP: initialize and a tool call answer JSON-RPC responses
        h = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        st, init = c.request("POST", "/v1/mcp", raw=json.dumps({
            "jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "t", "version": "1"}}}).encode(), headers=h)
        self.conforms(init, "/v1/mcp", "post", 200)
        # errors are Error objects
        for status, fn in ((404, lambda: c.get("sb-00000000000000000", expect=404)),
                           (400, lambda: c.request("POST", "/v1/sandboxes", body={"ttl_seconds": -1}, expect=400)[1]),
                           (401, lambda: c.with_key("wrong").request("GET", "/v1/sandboxes", expect=401)[1])):
            self.conforms(fn(), "/v1/sandboxes/{id}" if status == 404 else "/v1/sandboxes",
                          "get" if status != 400 else "post", status)


if __name__ == "__main__":
    unittest.main()

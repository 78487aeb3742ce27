"""test_client_coverage.py -- every /v1/ operation of docs/openapi.yaml names its clients, and they exist.

Each operation carries "x-moat-clients": {"python": "Class.method", "typescript": "Class.method",
"cli": "moat words ..."}; a value may be {"none": "reason"} where the route cannot sensibly have that
client. This test fails for an operation without the field, with a client key missing or malformed, or
naming a client that is not there:
  - python: getattr(moat.<Class>, method) on sdk/python's moat, and it must be callable (or a property);
  - typescript: the SDK built with the pinned tsc (as test_sdk_typescript does), then one node script
    checks <Class> is exported by its index and <method> is on the class's prototype (or inherited)
    or a static;
  - cli: `build/moat help <words>` exits 0, prints a usage, and every word after the command appears
    in it (so `moat fs watch` needs a usage that mentions watch).
No moatd is needed: this checks the clients' surface, their behaviour is tested by the test_sdk_* and
test_cli_* modules."""

import importlib
import json
import os
import re
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "lib"))
sys.path.insert(0, HERE)
import moatd  # noqa: E402
from test_sdk_typescript import SDK, build_sdk  # noqa: E402

OPENAPI = os.path.join(REPO, "docs", "openapi.yaml")
METHODS = ("get", "put", "post", "delete", "patch")
CLIENTS = ("python", "typescript", "cli")


def operations():
    """[(label, operation dict)] for every operation under /v1/."""
    with open(OPENAPI) as f:
        d = json.load(f)
    out = []
    for path, item in d["paths"].items():
        if not path.startswith("/v1/"):
            continue
        for m in METHODS:
            if m in item:
                out.append(("%s %s (%s)" % (m.upper(), path, item[m].get("operationId")), item[m]))
    return out


def named(ops, client):
    """{label: value} of the operations whose client is named (not {"none": ...})."""
    return {label: o["x-moat-clients"][client] for label, o in ops
            if isinstance(o.get("x-moat-clients"), dict) and isinstance(o["x-moat-clients"].get(client), str)}


NODE_CHECK = r"""
const [index, arg] = process.argv.slice(-2);
const m = await import(new URL('file://' + index).href);
const wanted = JSON.parse(arg);
const bad = {};
for (const [label, ref] of Object.entries(wanted)) {
  const [cls, meth] = ref.split('.');
  const C = m[cls];
  if (typeof C !== 'function') { bad[label] = `${cls} is not a class exported by the SDK`; continue; }
  let found = typeof C[meth] === 'function';
  for (let p = C.prototype; !found && p; p = Object.getPrototypeOf(p)) {
    const d = Object.getOwnPropertyDescriptor(p, meth);
    if (d && (typeof d.value === 'function' || d.get)) found = true;
  }
  if (!found) bad[label] = `${cls} has no method or static ${meth}`;
}
console.log(JSON.stringify(bad));
"""


class ClientCoverageTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.ops = operations()

    def test_every_operation_has_the_field(self):
        self.assertGreater(len(self.ops), 50, "docs/openapi.yaml lists too few /v1/ operations")
        bad = []
        for label, o in self.ops:
            x = o.get("x-moat-clients")
            if not isinstance(x, dict):
                bad.append("%s: no x-moat-clients" % label)
                continue
            for c in CLIENTS:
                v = x.get(c)
                if isinstance(v, str):
                    ok = v.startswith("moat ") if c == "cli" else (v.count(".") == 1 and all(v.split(".")))
                    if not ok:
                        bad.append("%s: %s %r is not %s" % (label, c, v, "moat WORDS" if c == "cli" else "Class.method"))
                elif not (isinstance(v, dict) and set(v) == {"none"} and isinstance(v["none"], str) and v["none"]):
                    bad.append("%s: %s must be a string or {\"none\": reason}, got %r" % (label, c, v))
            extra = set(x) - set(CLIENTS)
            if extra:
                bad.append("%s: unknown client keys %s" % (label, sorted(extra)))
        self.assertEqual(bad, [], "\n".join(bad))

    def test_python_clients_exist(self):
        sys.path.insert(0, os.path.join(REPO, "sdk", "python"))
        try:
            moat = importlib.import_module("moat")
        finally:
            sys.path.pop(0)
        self.assertTrue(moat.__file__.startswith(os.path.join(REPO, "sdk", "python")), moat.__file__)
        bad = []
        for label, ref in sorted(named(self.ops, "python").items()):
            cls, meth = ref.split(".")
            C = getattr(moat, cls, None)
            if not isinstance(C, type):
                bad.append("%s: moat.%s is not a class" % (label, cls))
                continue
            a = getattr(C, meth, None)
            if not (callable(a) or isinstance(a, property)):
                bad.append("%s: moat.%s has no method %s" % (label, cls, meth))
        self.assertEqual(bad, [], "\n".join(bad))

    def test_typescript_clients_exist(self):
        build_sdk()
        wanted = named(self.ops, "typescript")
        self.assertTrue(wanted)
        r = subprocess.run(["node", "--input-type=module", "-e", NODE_CHECK,
                            os.path.join(SDK, "dist", "index.js"), json.dumps(wanted)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        bad = json.loads(r.stdout.strip().splitlines()[-1])
        self.assertEqual(bad, {}, "\n".join("%s: %s" % kv for kv in sorted(bad.items())))

    def test_cli_commands_exist(self):
        moat = os.path.join(moatd.BUILD, "moat")
        self.assertTrue(os.access(moat, os.X_OK), "%s is missing: make" % moat)
        bad = []
        checked = {}
        for label, cmd in sorted(named(self.ops, "cli").items()):
            words = cmd.split()[1:]
            if not words:
                bad.append("%s: %r names no command" % (label, cmd))
                continue
            key = tuple(words)
            if key not in checked:
                r = subprocess.run([moat, "help"] + words, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, timeout=30, env=dict(os.environ, MOAT_API_URL="http://127.0.0.1:9"))
                out = r.stdout
                why = None
                if r.returncode != 0:
                    why = "exit %d: %s" % (r.returncode, r.stderr.strip()[:200])
                elif "usage" not in out.lower():
                    why = "printed no usage"
                else:
                    lost = [w for w in words[1:] if not re.search(r"(?<![\w-])%s(?![\w-])" % re.escape(w), out)]
                    if lost:
                        why = "its usage does not mention %s" % " ".join(lost)
                checked[key] = why
            if checked[key]:
                bad.append("%s: moat help %s: %s" % (label, " ".join(words), checked[key]))
        self.assertEqual(bad, [], "\n".join(bad))


if __name__ == "__main__":
    unittest.main()

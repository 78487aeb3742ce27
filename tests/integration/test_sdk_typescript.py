"""test_sdk_typescript.py -- the TypeScript SDK (sdk/typescript, @moat/sdk) and its examples against a real moatd.

setUpClass compiles the SDK with the pinned TypeScript in tests/node (sdk/typescript/node_modules is
made a link to tests/node/node_modules, as `npm install` would provide it), then each test runs one
node test file (sdk/typescript/test/NAME.test.mjs) with `node --test` against this class's moatd
(MOAT_API_URL / MOAT_API_KEY) and reads the runner's TAP summary. Any node failure, cancellation or a
non-zero exit fails the Python test, with the node output. A file whose every test skipped (only the
time-travel file may, where the host has no working CRIU) is a skip with the node test's reason.

test_examples compiles examples/typescript with tsc against the built SDK and runs each example, whose
model decisions are a fixed list of tool calls (the examples say so).
"""

import os
import re
import shutil
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
from moattest import DaemonTest  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SDK = os.path.join(REPO, "sdk", "typescript")
EXAMPLES = os.path.join(REPO, "examples", "typescript")
NODE_MODULES = os.path.join(REPO, "tests", "node", "node_modules")
TSC = os.path.join(NODE_MODULES, ".bin", "tsc")
NODE_TIMEOUT_S = 600


def link(path, target):
    """Makes path a symlink to target (relative), replacing a stale link; leaves a real dir alone."""
    rel = os.path.relpath(target, os.path.dirname(path))
    if os.path.islink(path):
        if os.readlink(path) == rel:
            return
        os.unlink(path)
    elif os.path.exists(path):
        return
    os.symlink(rel, path)


def tap_counts(out):
    counts = {}
    for k in ("tests", "pass", "fail", "cancelled", "skipped", "todo"):
        m = re.findall(r"^# %s (\d+)$" % k, out, re.M)
        counts[k] = int(m[-1]) if m else None
    return counts


def build_sdk():
    if not shutil.which("node"):
        raise unittest.SkipTest("node is missing (scripts/deps.sh installs Debian's nodejs)")
    if not os.path.exists(TSC):
        raise unittest.SkipTest("tests/node/node_modules has no tsc: run scripts/deps.sh (npm ci in tests/node)")
    link(os.path.join(SDK, "node_modules"), NODE_MODULES)
    r = subprocess.run([TSC, "-p", SDK], cwd=SDK, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
    if r.returncode != 0:
        raise AssertionError("tsc -p sdk/typescript failed:\n" + r.stdout.decode(errors="replace"))


class TypeScriptSDKTest(DaemonTest):
    pool = 2

    @classmethod
    def setUpClass(cls):
        build_sdk()
        super().setUpClass()

    def node_env(self):
        env = dict(os.environ)
        env["MOAT_API_URL"] = "http://127.0.0.1:%d" % self.daemon.port
        env["MOAT_API_KEY"] = self.c.key
        return env

    def run_node_file(self, name):
        path = os.path.join("test", name + ".test.mjs")
        try:
            r = subprocess.run(["node", "--test", "--test-reporter=tap", path], cwd=SDK, env=self.node_env(),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=NODE_TIMEOUT_S)
        except subprocess.TimeoutExpired as e:
            self.fail("node --test %s ran past %d s:\n%s" % (path, NODE_TIMEOUT_S,
                                                              (e.stdout or b"").decode(errors="replace")[-6000:]))
        out = r.stdout.decode(errors="replace")
        c = tap_counts(out)
        sys.stderr.write("    node %s: %s\n" % (path, ", ".join("%s %s" % (k, v) for k, v in c.items() if v)))
        self.assertEqual(r.returncode, 0, "node --test %s exited %d:\n%s" % (path, r.returncode, out[-8000:]))
        self.assertIsNotNone(c["tests"], "no TAP summary from node:\n" + out[-4000:])
        self.assertEqual((c["fail"], c["cancelled"]), (0, 0), out[-8000:])
        self.assertGreater(c["tests"], 0, out[-4000:])
        if c["skipped"] and c["skipped"] == c["tests"]:
            reasons = sorted(set(re.findall(r"# SKIP (.*)$", out, re.M)))
            self.skipTest("every node test skipped: " + "; ".join(reasons))
        self.assertEqual(c["pass"] + (c["skipped"] or 0) + (c["todo"] or 0), c["tests"], out[-4000:])

    def test_sandbox(self):
        self.run_node_file("sandbox")

    def test_streams(self):
        self.run_node_file("streams")

    def test_files(self):
        self.run_node_file("files")

    def test_contexts(self):
        self.run_node_file("contexts")

    def test_pty(self):
        self.run_node_file("pty")

    def test_dispose(self):
        self.run_node_file("dispose")

    def test_volumes(self):
        self.run_node_file("volumes")

    def test_databases(self):
        self.run_node_file("databases")

    def test_database_branch(self):
        """Needs POST /v1/databases/{id}/branch and fork/explore's databases: "branch"."""
        self.run_node_file("database_branch")

    def test_timetravel(self):
        self.run_node_file("timetravel")

    def test_templates(self):
        self.run_node_file("templates")

    def test_usage(self):
        self.run_node_file("usage")

    def test_examples(self):
        mods = os.path.join(EXAMPLES, "node_modules")
        os.makedirs(os.path.join(mods, "@moat"), exist_ok=True)
        link(os.path.join(mods, "@moat", "sdk"), SDK)
        link(os.path.join(mods, "@types"), os.path.join(NODE_MODULES, "@types"))
        r = subprocess.run([TSC, "-p", EXAMPLES], cwd=EXAMPLES, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=300)
        self.assertEqual(r.returncode, 0, "tsc -p examples/typescript:\n" + r.stdout.decode(errors="replace"))
        names = sorted(f[:-3] for f in os.listdir(EXAMPLES) if f.endswith(".ts") and not f.endswith(".d.ts"))
        self.assertEqual(names, ["best_of_n", "run_code_tool"])
        for name in names:
            with self.subTest(example=name):
                r = subprocess.run(["node", os.path.join("dist", name + ".js")], cwd=EXAMPLES, env=self.node_env(),
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=NODE_TIMEOUT_S)
                out = r.stdout.decode(errors="replace")
                if r.returncode == 77:
                    self.skipTest("%s: %s" % (name, out.strip().splitlines()[-1]))
                self.assertEqual(r.returncode, 0, "%s exited %d:\n%s" % (name, r.returncode, out[-6000:]))
                self.assertIn("example passed", out)
                # the examples kill what they made (await using)
                left = [s for s in self.c.list() if s.get("metadata", {}).get("example") == name]
                self.assertEqual(left, [], "%s left sandboxes running" % name)

    def test_every_node_file_is_run(self):
        # run by other modules: ops.test.mjs needs a fake internet (test_client_ops.TypeScriptOpsTest),
        # logs.test.mjs a moatd with a small log bound (test_logs_clients)
        elsewhere = {"ops.test.mjs": "test_client_ops.py", "logs.test.mjs": "test_logs_clients.py"}
        for f, module in elsewhere.items():
            with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), module)) as m:
                self.assertIn(f, m.read(), "%s is to run %s" % (module, f))
        files = sorted(f[:-len(".test.mjs")] for f in os.listdir(os.path.join(SDK, "test"))
                       if f.endswith(".test.mjs") and f not in elsewhere)
        mine = sorted(n[len("test_"):] for n in dir(self) if n.startswith("test_") and n not in
                      ("test_every_node_file_is_run", "test_examples"))
        self.assertEqual(files, mine)


if __name__ == "__main__":
    unittest.main()

"""test_framework_examples.py -- the framework examples run on the real frameworks, against a real moatd:
examples/python/langgraph_tool_node.py (langgraph + langchain-core), openai_agents_tool.py
(openai-agents), mcp_client_session.py (the official `mcp` SDK against POST /v1/mcp) and
examples/mastra/mastra_agent.mjs (@mastra/core with the `ai` package's MockLanguageModelV2).

The packages are the pinned ones of examples/python/requirements.txt and examples/mastra's
package-lock.json, installed once into a venv / node_modules under /var/tmp (tests/lib/depcache.py);
an install that fails (registry unreachable) skips the test with the installer's reason. Every
model is scripted inside its example; nothing is sent to an LLM provider (and the frameworks'
telemetry is off).

Each test runs its example twice:
- in a sandbox the test made (MOAT_SANDBOX_ID), into which the test wrote a random token in the file
  the example's tool reads: the final answer must carry that token and the sandbox's hostname (as
  `hostname` in it prints), so the tool's output came from that sandbox through the framework;
- on its own: the example makes a sandbox, writes its own input, answers, and kills what it made.
"""

import os
import re
import secrets
import socket
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "lib"))
sys.path.insert(0, HERE)
import depcache  # noqa: E402
import moatd  # noqa: E402
from moattest import DaemonTest  # noqa: E402

PY_EXAMPLES = os.path.join(moatd.REPO, "examples", "python")
MASTRA = os.path.join(moatd.REPO, "examples", "mastra")
INPUT_PATH = "/root/moat-example-input.txt"
RUN_TIMEOUT_S = 120


_unavailable = {}  # what could not be installed in this process, and why: tried once, not per test


def cached(what, install):
    if what not in _unavailable:
        try:
            return install()
        except depcache.Unavailable as e:
            _unavailable[what] = str(e)
    raise unittest.SkipTest(_unavailable[what])


def python():
    return cached("python", lambda: depcache.python_venv(os.path.join(PY_EXAMPLES, "requirements.txt"),
                                                         "moat-examples-py"))


def mastra_modules():
    """examples/mastra/node_modules: links to the cached npm ci's packages, plus @moat/sdk -> sdk/typescript
    (built by test_sdk_typescript.build_sdk). A node_modules that a user made by hand is left alone."""
    cache = cached("mastra", lambda: depcache.node_modules(MASTRA, "moat-examples-mastra"))
    import test_sdk_typescript
    test_sdk_typescript.build_sdk()
    mods = os.path.join(MASTRA, "node_modules")
    marker = os.path.join(mods, ".moat-test-links")
    if os.path.isdir(mods) and not os.path.exists(marker):
        return mods
    os.makedirs(os.path.join(mods, "@moat"), exist_ok=True)
    with open(marker, "w") as f:
        f.write(cache + "\n")
    for name in os.listdir(mods):  # links to an older cache go first
        if os.path.islink(os.path.join(mods, name)):
            os.unlink(os.path.join(mods, name))
    for name in os.listdir(cache):
        if not name.startswith("."):
            os.symlink(os.path.join(cache, name), os.path.join(mods, name))
    sdk = os.path.join(mods, "@moat", "sdk")
    if os.path.islink(sdk):
        os.unlink(sdk)
    os.symlink(os.path.join(moatd.REPO, "sdk", "typescript"), sdk)
    return mods


class FrameworkExamplesTest(DaemonTest):
    def env(self, sandbox_id=None):
        env = dict(os.environ, MOAT_API_URL="http://127.0.0.1:%d" % self.daemon.port, MOAT_API_KEY=self.c.key,
                   OPENAI_AGENTS_DISABLE_TRACING="1", MASTRA_TELEMETRY_DISABLED="1")
        for k in ("PYTHONPATH", "MOAT_SANDBOX_ID", "OPENAI_API_KEY", "OPENAI_BASE_URL", "LANGSMITH_TRACING",
                  "LANGCHAIN_TRACING_V2", "LANGSMITH_API_KEY"):
            env.pop(k, None)
        if sandbox_id:
            env["MOAT_SANDBOX_ID"] = sandbox_id
        return env

    def run_argv(self, argv, cwd, sandbox_id=None):
        try:
            r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=self.env(sandbox_id),
                               cwd=cwd, timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired as e:
            self.fail("%s ran past %d s:\n%s" % (argv, RUN_TIMEOUT_S, (e.stdout or b"").decode(errors="replace")))
        return r.returncode, r.stdout.decode(errors="replace")

    def answer(self, out):
        """The final answer: what the example printed between "--- answer ---" and its last line, "example ok"."""
        m = re.search(r"\n--- answer ---\n(.*)\nexample ok\n?$", "\n" + out, re.S)
        self.assertIsNotNone(m, "no answer block ending in 'example ok':\n" + out)
        return m.group(1)

    def check(self, argv, cwd):
        # 1. in the test's sandbox: the answer carries what only that sandbox holds
        sb = self.sandbox()
        token = "token-" + secrets.token_hex(8)
        self.c.put_file(sb["id"], INPUT_PATH, token.encode() + b"\n")
        hostname = self.c.sh(sb["id"], "hostname").strip()
        self.assertTrue(hostname)
        self.assertNotEqual(hostname, socket.gethostname(), "the sandbox's hostname must tell it from the host")
        rc, out = self.run_argv(argv, cwd, sandbox_id=sb["id"])
        self.assertEqual(rc, 0, out)
        self.assertIn(token + "\nhost=" + hostname + "\n", self.answer(out) + "\n")
        self.assertEqual([s["id"] for s in self.c.list()], [sb["id"]], "the example made or lost sandboxes")
        self.assertEqual(self.c.get(sb["id"])["state"], "running")
        self.c.delete(sb["id"])
        # 2. on its own: its own sandbox and input, and nothing left behind
        rc, out = self.run_argv(argv, cwd)
        self.assertEqual(rc, 0, out)
        self.assertRegex(self.answer(out) + "\n", r"hello from the moat sandbox\nhost=\S+\n")
        self.assertNotIn(token, out)
        self.assertEqual(self.c.list(), [], "the example left sandboxes behind")

    def test_langgraph(self):
        self.check([python(), os.path.join(PY_EXAMPLES, "langgraph_tool_node.py")], "/")

    def test_openai_agents(self):
        self.check([python(), os.path.join(PY_EXAMPLES, "openai_agents_tool.py")], "/")

    def test_mcp_python_sdk(self):
        self.check([python(), os.path.join(PY_EXAMPLES, "mcp_client_session.py")], "/")

    def test_mastra(self):
        mastra_modules()
        self.check(["node", "mastra_agent.mjs"], MASTRA)

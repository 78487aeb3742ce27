"""test_e2b.py -- the unmodified npm E2B SDKs (`e2b`, `@e2b/code-interpreter`) against a real moatd.

Each test runs one scenario of a Node script in tests/node/ (e2b_control.mjs: control plane;
e2b_interp.mjs: the code interpreter) with the environment an E2B user would set to switch to moat:
E2B_API_URL and E2B_SANDBOX_URL = moatd's own listener, E2B_API_KEY = moatd's API key. A scenario
prints "ok NAME" and exits 0; it kills every sandbox it made, also when it fails. Each run has a
timeout, so a hang is a failure.
"""

import os
import shutil
import subprocess
import sys
import unittest

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
        e.update({"E2B_API_URL": url, "E2B_SANDBOX_URL": url, "E2B_API_KEY": self.c.key, "MOAT_URL": url})
        e.update(env or {})
        try:
            p = subprocess.run([NODE, os.path.join(NODE_DIR, script), name], cwd=NODE_DIR, env=e,
                               capture_output=True, text=True, timeout=SCENARIO_TIMEOUT_S)
        except subprocess.TimeoutExpired as x:
            self.fail("%s %s hung for %d s\nstdout: %s\nstderr: %s\nmoatd log:\n%s" % (
                script, name, SCENARIO_TIMEOUT_S, x.stdout, x.stderr, self.daemon.log_tail(40)))
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

    # code interpreter (e2b_interp.mjs)
    def test_interp_state_and_png(self):
        self.scenario("e2b_interp.mjs", "state_and_png")

    def test_interp_error(self):
        self.scenario("e2b_interp.mjs", "error")

    def test_interp_contexts(self):
        self.scenario("e2b_interp.mjs", "contexts")

    def test_interp_bad_input(self):
        self.scenario("e2b_interp.mjs", "bad_input")


if __name__ == "__main__":
    unittest.main()

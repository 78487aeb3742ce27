"""test_e2b_python.py -- the unmodified Python E2B SDKs (PyPI `e2b` and `e2b-code-interpreter`,
pinned in tests/e2b_py/requirements.txt, installed once into a cached venv by tests/e2b_py/pyvenv.py)
against a real moatd, with only E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY (the key in E2B
form) set. Each test runs one scenario of tests/e2b_py/e2b_scenarios.py in the venv's python; a
scenario that hangs past its timeout fails."""

import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
import moatd  # noqa: E402
from moattest import DaemonTest  # noqa: E402

PY_DIR = os.path.join(moatd.REPO, "tests", "e2b_py")
sys.path.insert(0, PY_DIR)
import pyvenv as e2b_venv  # noqa: E402

SCENARIO_TIMEOUT_S = 180


class E2BPythonTest(DaemonTest):
    @classmethod
    def setUpClass(cls):
        try:
            cls.py = e2b_venv.ensure()
        except (e2b_venv.Unavailable, subprocess.TimeoutExpired) as e:
            raise unittest.SkipTest("the Python E2B SDKs cannot be installed here: %s" % e)
        super().setUpClass()
        moatd.ensure_template("code-interpreter")

    def scenario(self, name):
        url = "http://127.0.0.1:%d" % self.daemon.port
        e = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
        e.update({"E2B_API_URL": url, "E2B_SANDBOX_URL": url, "E2B_API_KEY": "e2b_" + self.c.key[5:], "MOAT_URL": url})
        try:
            p = subprocess.run([self.py, os.path.join(PY_DIR, "e2b_scenarios.py"), name], cwd=PY_DIR, env=e,
                               capture_output=True, text=True, timeout=SCENARIO_TIMEOUT_S)
        except subprocess.TimeoutExpired as x:
            self.fail("%s hung for %d s\nstdout: %s\nstderr: %s\nmoatd log:\n%s" % (
                name, SCENARIO_TIMEOUT_S, x.stdout, x.stderr, self.daemon.log_tail(40)))
        if p.returncode != 0 or ("ok " + name) not in p.stdout:
            self.fail("%s exited %d\nstdout: %s\nstderr: %s\nmoatd log:\n%s" % (
                name, p.returncode, p.stdout, p.stderr[-6000:], self.daemon.log_tail(40)))

    def test_control(self):
        self.scenario("control")

    def test_envd(self):
        self.scenario("envd")

    def test_interp(self):
        self.scenario("interp")

    def test_interp_async(self):
        self.scenario("interp_async")


if __name__ == "__main__":
    unittest.main()

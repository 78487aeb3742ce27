"""test_e2b_template.py -- the unmodified npm E2B SDK's template builder (`Template.build`,
`Template.exists`, build status and logs, tags) against a real moatd: templates built from the SDK's
steps and files, sandboxes made from them by name, the errors of what moat cannot do (an image from
a registry) and of what fails, and a second org that sees none of it.

Each test runs one scenario of tests/node/e2b_template.mjs (see test_e2b.py for the protocol): the
scenario prints "ok NAME" and exits 0; it kills its sandboxes and deletes its templates, also when it
fails.
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
HAVE_SDK = os.path.isdir(os.path.join(NODE_DIR, "node_modules", "e2b"))
SCENARIO_TIMEOUT_S = 600


@unittest.skipUnless(NODE and HAVE_SDK, "node or the E2B npm packages (tests/node/node_modules) are missing; "
                     "scripts/deps.sh installs them")
class E2BTemplateTest(DaemonTest):
    def scenario(self, name, env=None):
        url = "http://127.0.0.1:%d" % self.daemon.port
        e = dict(os.environ)
        for k in list(e):
            if k.startswith("E2B_"):
                del e[k]
        e.update({"E2B_API_URL": url, "E2B_SANDBOX_URL": url, "E2B_API_KEY": "e2b_" + self.c.key[5:]})
        e.update(env or {})
        try:
            p = subprocess.run([NODE, os.path.join(NODE_DIR, "e2b_template.mjs"), name], cwd=NODE_DIR, env=e,
                               capture_output=True, text=True, timeout=SCENARIO_TIMEOUT_S)
        except subprocess.TimeoutExpired as x:
            self.fail("e2b_template.mjs %s hung for %d s\nstdout: %s\nstderr: %s\nmoatd log:\n%s" % (
                name, SCENARIO_TIMEOUT_S, x.stdout, x.stderr, self.daemon.log_tail(40)))
        if p.returncode != 0 or ("ok " + name) not in p.stdout:
            self.fail("e2b_template.mjs %s exited %d\nstdout: %s\nstderr: %s\nmoatd log:\n%s" % (
                name, p.returncode, p.stdout, p.stderr[-6000:], self.daemon.log_tail(40)))

    def test_build_and_create(self):
        self.scenario("build_and_create")

    def test_bad_input(self):
        self.scenario("bad_input")

    def test_other_org_sees_nothing(self):
        other = self.daemon.new_org_key("e2b-template-other")
        self.scenario("other_org", {"OTHER_KEY": "e2b_" + other[5:]})

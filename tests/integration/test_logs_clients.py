"""test_logs_clients.py -- the log's clients against a real moatd: the Python SDK's Sandbox.logs
(iterator, since, follow), the CLI's `moat logs ID [-f] [--since] [--json]`, and the TypeScript SDK's
Sandbox.logs (sdk/typescript/test/logs.test.mjs)."""

import json
import os
import subprocess
import sys
import threading
import time
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tests", "lib"))
sys.path.insert(0, os.path.join(REPO, "sdk", "python"))
sys.path.insert(0, os.path.join(REPO, "tests", "integration"))
import moatd  # noqa: E402
from moattest import DaemonTest  # noqa: E402

import moat  # noqa: E402
from moat import Sandbox  # noqa: E402
import test_sdk_typescript as tsdk  # noqa: E402


class LogsClientsTest(DaemonTest):
    pool = 1

    def setUp(self):
        self.url = "http://127.0.0.1:%d" % self.daemon.port
        self.client = moat.Client(self.url, self.c.key)
        self.sb = Sandbox.create(client=self.client)
        self.addCleanup(self._delete_quietly, self.c, self.sb.id)

    def wait_text(self, want, **kw):
        deadline = time.time() + 20
        while True:
            es = list(self.sb.logs(**kw))
            text = "".join(e.text for e in es if e.type == "output")
            if want in text or time.time() > deadline:
                return es
            time.sleep(0.2)

    def cli(self, *args, timeout=60):
        env = dict(os.environ, MOAT_API_URL=self.url, MOAT_API_KEY=self.c.key)
        return subprocess.run([os.path.join(moatd.BUILD, "moat")] + list(args), env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, timeout=timeout)

    def test_python_sdk_logs(self):
        r = self.sb.exec("echo py-out; echo py-err >&2")
        es = self.wait_text("py-err")
        outs = [e for e in es if e.type == "output"]
        self.assertEqual([(e.stream, e.text) for e in outs], [("stdout", "py-out\n"), ("stderr", "py-err\n")], es)
        starts = [e for e in es if e.type == "process" and e.event == "start"]
        self.assertEqual({e.pid for e in outs}, {starts[0].pid})
        self.assertEqual(r.exit_code, 0)
        self.assertEqual([e.event for e in es if e.type == "lifecycle"][:2], ["created", "running"])
        mark = int(time.time() * 1000) + 50
        time.sleep(0.1)
        got = []
        with self.sb.logs(follow=True, since=mark) as stream:
            threading.Timer(0.5, lambda: self.sb.exec("echo py-live")).start()
            for e in stream:
                got.append(e)
                if e.type == "output" and "py-live" in e.text:
                    break
        self.assertTrue(all(e.at_ms is None or e.at_ms >= mark for e in got), got)
        self.assertNotIn("py-out", "".join(e.text for e in got if e.type == "output"))
        with self.assertRaises(moat.InvalidRequestError):
            list(self.sb.logs(since="yesterday"))

    def test_cli_logs(self):
        self.sb.exec("echo cli-out; echo cli-err >&2")
        self.wait_text("cli-err")
        r = self.cli("logs", self.sb.id)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout, b"cli-out\n")
        self.assertIn(b"cli-err\n", r.stderr)
        self.assertIn(b"sandbox created", r.stderr)
        j = self.cli("logs", self.sb.id, "--json")
        entries = [json.loads(line) for line in j.stdout.splitlines()]
        self.assertIn("output", {e["type"] for e in entries})
        later = self.cli("logs", self.sb.id, "--since", str(int(time.time() * 1000) + 60000))
        self.assertEqual(later.stdout, b"")
        bad = self.cli("logs", self.sb.id, "--since", "yesterday")
        self.assertEqual(bad.returncode, 1)
        self.assertIn(b"invalid_request", bad.stderr)
        # -f goes on until the sandbox is killed
        env = dict(os.environ, MOAT_API_URL=self.url, MOAT_API_KEY=self.c.key)
        p = subprocess.Popen([os.path.join(moatd.BUILD, "moat"), "logs", self.sb.id, "-f"], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            time.sleep(0.5)
            self.sb.exec("echo cli-live")
            time.sleep(1.5)
            self.sb.kill()
            out, err = p.communicate(timeout=30)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        self.assertEqual(p.returncode, 0, err)
        self.assertIn(b"cli-live\n", out)
        self.assertIn(b"sandbox killed", err)

    def test_typescript_sdk_logs(self):
        tsdk.build_sdk()
        t = tsdk.TypeScriptSDKTest("run_node_file")
        t.daemon, t.c = self.daemon, self.c
        t.run_node_file("logs")


if __name__ == "__main__":
    unittest.main()

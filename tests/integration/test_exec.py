"""test_exec.py -- POST /v1/sandboxes/{id}/exec: streams, exit codes, stdin, cwd, env, user, timeout,
output caps, non-UTF-8 output, missing commands."""

import base64
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
from moattest import DaemonTest  # noqa: E402


class ExecTest(DaemonTest):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        sb = cls.c.create(env={"FOO": "sandbox-foo", "BAR": "sandbox-bar"}, ttl_seconds=3600)
        cls.sid = sb["id"]

    def test_streams_and_exit_codes(self):
        r = self.c.exec(self.sid, cmd="echo out1; echo err1 >&2; echo out2; exit 0")
        self.assertEqual(r["stdout"], "out1\nout2\n")
        self.assertEqual(r["stderr"], "err1\n")
        self.assertEqual(r["exit_code"], 0)
        self.assertFalse(r["timed_out"])
        self.assertFalse(r["truncated"])
        self.assertIsInstance(r["duration_ms"], int)
        self.assertIsInstance(r["pid"], int)
        for code in (1, 42, 255):
            r = self.c.exec(self.sid, cmd="exit %d" % code)
            self.assertEqual(r["exit_code"], code)
            self.assertEqual(r.get("signal", 0), 0)
        r = self.c.exec(self.sid, argv=["false"])
        self.assertEqual(r["exit_code"], 1)

    def test_argv_is_not_a_shell(self):
        r = self.c.exec(self.sid, argv=["echo", "a  b", "$HOME", ";", "exit 3"])
        self.assertEqual((r["stdout"], r["exit_code"]), ("a  b $HOME ; exit 3\n", 0))

    def test_killed_by_signal(self):
        r = self.c.exec(self.sid, cmd="kill -9 $$")
        self.assertEqual(r["exit_code"], -1)
        self.assertEqual(r["signal"], 9)

    def test_stdin(self):
        r = self.c.exec(self.sid, argv=["cat"], stdin="hello\nworld\n")
        self.assertEqual(r["stdout"], "hello\nworld\n")
        data = bytes(range(256)) * 4
        r = self.c.exec(self.sid, cmd="sha256sum | cut -d' ' -f1", stdin_b64=base64.b64encode(data).decode())
        import hashlib
        self.assertEqual(r["stdout"].strip(), hashlib.sha256(data).hexdigest())
        r = self.c.exec(self.sid, argv=["cat"])  # no stdin: EOF at once, no hang
        self.assertEqual((r["stdout"], r["exit_code"]), ("", 0))

    def test_cwd(self):
        self.assertEqual(self.c.sh(self.sid, "pwd", cwd="/tmp"), "/tmp\n")
        self.assertEqual(self.c.sh(self.sid, "pwd"), "/root\n")
        r = self.c.exec(self.sid, cmd="pwd", cwd="/no/such/dir", expect=(200, 400))
        if "exit_code" in r:
            self.assertNotEqual(r["exit_code"], 0)

    def test_env(self):
        self.assertEqual(self.c.sh(self.sid, 'echo "$FOO $BAR"'), "sandbox-foo sandbox-bar\n")
        out = self.c.sh(self.sid, 'echo "$FOO $BAR $BAZ"', env={"BAR": "exec-bar", "BAZ": "exec-baz"})
        self.assertEqual(out, "sandbox-foo exec-bar exec-baz\n")
        # the per-exec env does not stick
        self.assertEqual(self.c.sh(self.sid, 'echo "$BAR ${BAZ:-unset}"'), "sandbox-bar unset\n")
        self.assertIn("PATH=", self.c.sh(self.sid, "env"))

    def test_user(self):
        self.assertEqual(self.c.sh(self.sid, "id -u"), "0\n")
        self.assertEqual(self.c.sh(self.sid, "id -u", user="root"), "0\n")
        self.assertEqual(self.c.sh(self.sid, "id -u", user="user"), "1000\n")
        self.assertEqual(self.c.sh(self.sid, 'echo "$HOME"; pwd', user="user"), "/home/user\n/home/user\n")
        # the unprivileged user cannot write root's files
        r = self.c.exec(self.sid, cmd="echo x > /root/by-user", user="user")
        self.assertNotEqual(r["exit_code"], 0)
        r = self.c.exec(self.sid, cmd="true", user="nosuchuser", expect=400)
        self.assertEqual(r.get("code"), "invalid_request")

    def test_timeout_kills_process_group(self):
        t0 = time.time()
        r = self.c.exec(self.sid, argv=["sh", "-c", "sleep 100 & sleep 100"], timeout_ms=1000)
        dt = time.time() - t0
        self.assertTrue(r["timed_out"], r)
        self.assertLess(dt, 15)
        self.assertGreaterEqual(r["duration_ms"], 900)
        self.assertNotEqual(r["exit_code"], 0)
        # neither sleep survived
        time.sleep(0.5)
        out = self.c.sh(self.sid, "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '; echo")
        self.assertNotIn("sleep 100", out)

    def test_output_truncated_at_16mib(self):
        r = self.c.exec(self.sid, cmd="head -c 20971520 /dev/zero | tr '\\0' a; echo done >&2", timeout_ms=120000)
        self.assertFalse(r["timed_out"])
        self.assertTrue(r["truncated"])
        self.assertTrue(r["stdout_truncated"])
        self.assertFalse(r["stderr_truncated"])
        self.assertEqual(len(r["stdout"]), 16 << 20)
        self.assertEqual(r["stdout"], "a" * (16 << 20))
        self.assertEqual(r["stderr"], "done\n")
        self.assertAlive(self.sid)

    def test_invalid_utf8(self):
        r = self.c.exec(self.sid, cmd="printf '\\377\\376ok'; printf '\\300' >&2")
        self.assertEqual(base64.b64decode(r["stdout_b64"]), b"\xff\xfeok")
        self.assertEqual(base64.b64decode(r["stderr_b64"]), b"\xc0")
        self.assertIn("\ufffd", r["stdout"])
        self.assertTrue(r["stdout"].endswith("ok"))
        r = self.c.exec(self.sid, cmd="printf 'h\\303\\251'")  # valid UTF-8: no _b64
        self.assertEqual(r["stdout"], "h\u00e9")
        self.assertNotIn("stdout_b64", r)

    def test_command_not_found(self):
        r = self.c.exec(self.sid, argv=["no-such-command-xyz"])
        self.assertEqual(r["exit_code"], 127)
        r = self.c.exec(self.sid, cmd="no-such-command-xyz")
        self.assertEqual(r["exit_code"], 127)
        r = self.c.exec(self.sid, argv=["/no/such/path"])
        self.assertEqual(r["exit_code"], 127)

    def test_parallel_execs_one_sandbox(self):
        import threading
        results = {}

        def one(i):
            try:
                results[i] = self.c.exec(self.sid, cmd="sleep 0.3; echo %d" % i)
            except Exception as e:  # reported below
                results[i] = e
        ts = [threading.Thread(target=one, args=(i,)) for i in range(8)]
        t0 = time.time()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        for i in range(8):
            self.assertIsInstance(results[i], dict, results[i])
            self.assertEqual(results[i]["stdout"], "%d\n" % i)
        self.assertLess(time.time() - t0, 2.2, "execs on one sandbox were serialised")

"""test_cli_interactive.py -- the CLI's issue-3 commands against a real moatd: exec --stream (output as
it arrives, binary bytes, exit code), exec --background / ps / attach / kill (tags, replay, detach),
shell in a real terminal (tmux: typing, the pty's size and SIGWINCH resizes, exit, the local terminal
restored after the end and after a SIGTERM) and run --python."""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
import moatd  # noqa: E402
from moattest import DaemonTest  # noqa: E402

MOAT = os.path.join(moatd.BUILD, "moat")


class CliTest(DaemonTest):
    pool = 1

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.env = dict(os.environ, MOAT_API_URL="http://127.0.0.1:%d" % cls.daemon.port, MOAT_API_KEY=cls.c.key)

    def moat(self, *args, timeout=60, input=None):
        return subprocess.run([MOAT] + list(args), env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              timeout=timeout, input=input)

    def popen(self, *args):
        p = subprocess.Popen([MOAT] + list(args), env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.addCleanup(lambda: (p.poll() is None and p.kill(), p.wait()))
        return p

    # ---- exec --stream ----

    def test_stream_output_as_it_arrives_and_exit_code(self):
        sid = self.sandbox()["id"]
        p = self.popen("exec", "--stream", sid, "--", "sh", "-c", "echo one; sleep 2; echo two >&2; echo three; exit 7")
        t0 = time.time()
        first = p.stdout.readline()
        t_first = time.time() - t0
        self.assertEqual(first, b"one\n")
        self.assertLess(t_first, 1.8, "the first line came only at the end")
        self.assertIsNone(p.poll(), "moat ended before the command")
        out, err = p.communicate(timeout=30)
        self.assertEqual((p.returncode, out, err), (7, b"three\n", b"two\n"))

    def test_stream_binary_and_large_output(self):
        sid = self.sandbox()["id"]
        r = self.moat("exec", "--stream", sid, "--", "sh", "-c", r"printf 'a\377\000b\n'; head -c 3000000 /dev/zero | tr '\0' x")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout[:5], b"a\xff\x00b\n")
        self.assertEqual(r.stdout[5:], b"x" * 3000000)
        # control characters and quotes (JSON escapes) and multi-byte UTF-8 come back as the same bytes
        r = self.moat("exec", "--stream", sid, "--", "printf", r'q"b\\s\001\t\r\n\303\251\360\237\230\200/')
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout, b'q"b\\s\x01\t\r\n\xc3\xa9\xf0\x9f\x98\x80/')

    def test_plain_exec_passes_nul_bytes(self):
        """NUL is valid UTF-8: moatd sends it as \\u0000 in the JSON string, the CLI writes it back."""
        sid = self.sandbox()["id"]
        r = self.moat("exec", sid, "--", "printf", r"a\000b\n")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout, b"a\x00b\n")

    def test_stream_interrupt_ends_the_command(self):
        sid = self.sandbox()["id"]
        p = self.popen("exec", "--stream", sid, "--", "sh", "-c", "echo up; exec sleep 300")
        self.assertEqual(p.stdout.readline(), b"up\n")
        p.send_signal(signal.SIGINT)
        p.communicate(timeout=20)
        self.assertEqual(p.returncode, 128 + signal.SIGINT)
        deadline = time.time() + 10
        while time.time() < deadline:
            rows = [ln.split() for ln in self.moat("ps", sid).stdout.decode().splitlines()[1:]]
            if rows and all(r[2] != "running" for r in rows):
                break
            time.sleep(0.2)
        self.assertTrue(rows and all(r[2] != "running" for r in rows), rows)

    def test_stream_errors(self):
        r = self.moat("exec", "--stream", "sb-doesnotexist000", "--", "true")
        self.assertEqual(r.returncode, 1)
        self.assertIn(b"not_found", r.stderr)
        r = self.moat("exec", "--stream", "--background", "x", "--", "true")
        self.assertEqual(r.returncode, 2)

    # ---- background processes ----

    def test_background_ps_attach_kill(self):
        sid = self.sandbox()["id"]
        r = self.moat("exec", "--background", "--tag", "web", sid, "--", "sh", "-c", "echo started; exec sleep 300")
        self.assertEqual(r.returncode, 0, r.stderr)
        pid = int(r.stdout.strip())
        time.sleep(0.3)
        ps = self.moat("ps", sid)
        self.assertEqual(ps.returncode, 0, ps.stderr)
        rows = [ln.split() for ln in ps.stdout.decode().splitlines()]
        self.assertEqual(rows[0][:4], ["PID", "TAG", "STATE", "STARTED"])
        row = [x for x in rows[1:] if x[0] == str(pid)]
        self.assertEqual(len(row), 1, ps.stdout)
        self.assertEqual(row[0][1:3], ["web", "running"])

        # attach replays what was written since the start; Ctrl-C detaches and the process lives on
        a = self.popen("attach", sid, "web")
        self.assertEqual(a.stdout.readline(), b"started\n")
        a.send_signal(signal.SIGINT)
        out, err = a.communicate(timeout=10)
        self.assertEqual(a.returncode, 0, err)
        self.assertIn(b"detached", err)
        ps = self.moat("ps", sid).stdout.decode()
        self.assertIn("running", [ln.split()[2] for ln in ps.splitlines() if ln.split()[0] == str(pid)])

        # attach again (by pid), then kill by tag: attach exits with 128+SIGTERM
        a = self.popen("attach", sid, str(pid))
        self.assertEqual(a.stdout.readline(), b"started\n")
        k = self.moat("kill", sid, "web")
        self.assertEqual(k.returncode, 0, k.stderr)
        a.communicate(timeout=20)
        self.assertEqual(a.returncode, 128 + signal.SIGTERM)
        ps = self.moat("ps", sid).stdout.decode()
        self.assertIn("killed:15", [ln.split()[2] for ln in ps.splitlines() if ln.split()[0] == str(pid)])

    def test_kill_signal_and_errors(self):
        sid = self.sandbox()["id"]
        pid = self.moat("exec", "--background", sid, "--", "sleep", "300").stdout.strip().decode()
        k = self.moat("kill", sid, pid, "--signal", "KILL")
        self.assertEqual(k.returncode, 0, k.stderr)
        a = self.moat("attach", sid, pid, timeout=20)
        self.assertEqual(a.returncode, 128 + 9, a.stderr)
        r = self.moat("kill", sid, "999999")
        self.assertEqual(r.returncode, 1)
        self.assertIn(b"(", r.stderr)  # moat: <message> (<code>)
        r = self.moat("attach", sid, "no-such-tag")
        self.assertEqual(r.returncode, 1)
        r = self.moat("kill", sid, pid, "--signal", "BOGUS")
        self.assertEqual(r.returncode, 1)


class RunPythonTest(DaemonTest):
    """moat run --python: a throwaway code-interpreter sandbox, one context, its output and figures."""
    pool = 0

    @classmethod
    def setUpClass(cls):
        moatd.ensure_template("code-interpreter")
        super().setUpClass()
        cls.env = dict(os.environ, MOAT_API_URL="http://127.0.0.1:%d" % cls.daemon.port, MOAT_API_KEY=cls.c.key)

    def run_py(self, code, cwd):
        return subprocess.run([MOAT, "run", "--python", code], env=self.env, cwd=cwd, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, timeout=120)

    def test_output_value_figure_error_and_cleanup(self):
        d = tempfile.mkdtemp(prefix="moat-run-py-")
        self.addCleanup(shutil.rmtree, d, True)
        r = self.run_py('import sys\nprint("out")\nprint("err", file=sys.stderr)\nx = 6 * 7\nx', d)
        self.assertEqual((r.returncode, r.stdout, r.stderr), (0, b"out\n42\n", b"err\n"))
        plot = ('import matplotlib\nmatplotlib.use("Agg")\nimport matplotlib.pyplot as plt\n'
                'plt.plot([1, 2, 3], [1, 4, 9])\nplt.show()')
        for n in (1, 2):  # a second figure never overwrites the first
            r = self.run_py(plot, d)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn(b"moat-result-%d.png" % n, r.stderr)
            with open(os.path.join(d, "moat-result-%d.png" % n), "rb") as f:
                self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
        r = self.run_py("def f():\n    return 1 / 0\nf()", d)
        self.assertEqual(r.returncode, 1)
        self.assertIn(b"Traceback", r.stderr)
        self.assertIn(b"ZeroDivisionError", r.stderr)
        self.assertEqual(self.c.list(), [], "run --python left a sandbox behind")
        r = subprocess.run([MOAT, "run", "--python", "1", "--", "ls"], env=self.env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=30)
        self.assertEqual(r.returncode, 2)


@unittest.skipUnless(shutil.which("tmux"), "tmux is not installed")
class ShellTest(DaemonTest):
    """moat shell in a real terminal: a tmux session on its own socket."""
    pool = 1

    def setUp(self):
        self.sid = self.sandbox()["id"]
        self.dir = tempfile.mkdtemp(prefix="moat-shell-test-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.sock = os.path.join(self.dir, "tmux.sock")
        self.addCleanup(lambda: subprocess.run(["tmux", "-S", self.sock, "kill-server"], stderr=subprocess.DEVNULL))

    def tmux(self, *args):
        return subprocess.run(["tmux", "-S", self.sock] + list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              timeout=20)

    def start(self, script):
        env = "MOAT_API_URL=http://127.0.0.1:%d MOAT_API_KEY=%s" % (self.daemon.port, self.c.key)
        r = self.tmux("-f", "/dev/null", "new-session", "-d", "-x", "100", "-y", "30", "-s", "t",
                      "env %s sh -c '%s'" % (env, script))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.tmux("set-option", "-t", "t", "remain-on-exit", "on")

    def pane(self):
        return self.tmux("capture-pane", "-p", "-t", "t").stdout.decode(errors="replace")

    def wait_pane(self, text, timeout=15):
        deadline = time.time() + timeout
        while time.time() < deadline:
            p = self.pane()
            if text in p:
                return p
            time.sleep(0.1)
        self.fail("%r never appeared; pane:\n%s" % (text, self.pane()))

    def wait_file(self, path, timeout=15):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if os.path.exists(path) and os.path.getsize(path) > 0:
                time.sleep(0.2)
                with open(path) as f:
                    return f.read()
            time.sleep(0.1)
        self.fail("%s never written; pane:\n%s" % (path, self.pane()))

    def test_typing_size_resize_exit_and_tty_restored(self):
        after = os.path.join(self.dir, "after")
        self.start("%s shell %s; echo rc=$? > %s.rc; stty -a > %s" % (MOAT, self.sid, after, after))
        self.wait_pane("#")  # root's prompt
        self.tmux("send-keys", "-t", "t", "echo $((6*7))moat", "Enter")
        self.wait_pane("42moat")
        self.tmux("send-keys", "-t", "t", "stty size", "Enter")
        self.wait_pane("30 100")
        self.tmux("resize-window", "-t", "t", "-x", "120", "-y", "40")
        time.sleep(0.5)
        self.tmux("send-keys", "-t", "t", "clear; stty size", "Enter")
        self.wait_pane("40 120")
        self.tmux("send-keys", "-t", "t", "exit 3", "Enter")
        stty = self.wait_file(after)
        self.assertRegex(stty, r"(^|\s)icanon(\s|$)", "the terminal was left raw")
        self.assertRegex(stty, r"(^|\s)echo(\s|$)")
        with open(after + ".rc") as f:
            self.assertIn(f.read().strip(), ("rc=0", "rc=3"))

    def test_sigterm_restores_the_terminal(self):
        after = os.path.join(self.dir, "after")
        self.start("%s shell %s; stty -a > %s" % (MOAT, self.sid, after))
        self.wait_pane("#")
        pids = [p for p in moatd.find_pids_by_cmdline("shell\0" + self.sid + "\0")]
        self.assertEqual(len(pids), 1, pids)
        os.kill(pids[0], signal.SIGTERM)
        stty = self.wait_file(after)
        self.assertRegex(stty, r"(^|\s)icanon(\s|$)", "SIGTERM left the terminal raw")

    def test_cmd_and_refusal(self):
        env = dict(os.environ, MOAT_API_URL="http://127.0.0.1:%d" % self.daemon.port, MOAT_API_KEY=self.c.key)
        # without a terminal: bytes relayed as they are, the session ends with the command
        r = subprocess.run([MOAT, "shell", self.sid, "--cmd", "echo via-pty; stty size"], env=env,
                           stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(b"via-pty\r\n", r.stdout)
        self.assertIn(b"24 80", r.stdout)
        # short sessions end with their output, not before it (the close frame once overtook the
        # last output frames in about a third of these)
        for i in range(12):
            r = subprocess.run([MOAT, "shell", self.sid, "--cmd", "echo short-%d; stty size" % i], env=env,
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               timeout=30)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn(b"short-%d\r\n24 80" % i, r.stdout)
        r = subprocess.run([MOAT, "shell", "sb-doesnotexist000"], env=env, stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30)
        self.assertEqual(r.returncode, 1)
        self.assertIn(b"not_found", r.stderr)
        bad = dict(env, MOAT_API_KEY="wrong")
        r = subprocess.run([MOAT, "shell", self.sid], env=bad, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=30)
        self.assertEqual(r.returncode, 1)
        self.assertIn(b"unauthorized", r.stderr)


if __name__ == "__main__":
    unittest.main()

"""test_cli_interactive.py -- the CLI's issue-3 commands against a real moatd: exec --stream (output as
it arrives, binary bytes, exit code), exec --background / ps / attach / kill (tags, replay, detach),
shell in a real terminal (tmux: typing, the pty's size and SIGWINCH resizes, exit, the local terminal
restored after the end and after a SIGTERM), run --python, and `moat template` (a build from a
directory with a .dockerignore and a link, its live log and exit status, a failed build, a link out
of the context refused rather than followed, -f from outside the context with --build-arg, Ctrl-C
leaving the build running, logs, get, ls, import of a hand-made OCI archive, rm)."""

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
import oci_archive  # noqa: E402
from moattest import DaemonTest, HTTPError  # noqa: E402

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

    # ---- the CLI itself ----

    def test_version_help_and_unknown_ids(self):
        r = self.moat("--version")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertRegex(r.stdout.decode(), r"^moat \d+\.\d+\.\d+\n$")
        r = self.moat("help", "exec")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(b"usage: moat exec ID", r.stdout)
        r = self.moat("help", "nosuch")
        self.assertEqual(r.returncode, 2)
        self.assertIn(b"unknown command 'nosuch'", r.stderr)
        for args in (["get", "sb-0123456789abcdefg"], ["exec", "sb-0123456789abcdefg", "true"], ["get", "nonsense"],
                     ["cp", "sb-0123456789abcdefg:/etc/hostname", "-"]):
            with self.subTest(args=args):
                r = self.moat(*args)
                self.assertEqual(r.returncode, 1, r.stderr)
                self.assertIn(("moat: sandbox %s not found\n" % args[1].split(":")[0]).encode(), r.stderr)
        # a missing file inside a sandbox that exists keeps its own message
        sid = self.sandbox()["id"]
        r = self.moat("cp", sid + ":/no/such/file", "-")
        self.assertNotEqual(r.returncode, 0)
        self.assertNotIn(b"sandbox %s not found" % sid.encode(), r.stderr)

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
        self.assertIn(b"sandbox sb-doesnotexist000 not found", r.stderr)
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


WEB_DOCKERFILE = """FROM base
COPY site/ /srv/site/
RUN echo "built by $(whoami)" > /srv/site/built.txt && echo step-output-line
WORKDIR /srv/site
HEALTHCHECK --interval=1s CMD curl -fsS http://127.0.0.1:8000/index.html
CMD ["python3", "-m", "http.server", "8000", "--bind", "127.0.0.1"]
"""


class TemplateCliTest(DaemonTest):
    """moat template build|logs|get|ls|import|rm against a real moatd building real templates."""
    pool = 0

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.env = dict(os.environ, MOAT_API_URL="http://127.0.0.1:%d" % cls.daemon.port, MOAT_API_KEY=cls.c.key)

    def moat(self, *args, timeout=600, cwd=None):
        return subprocess.run([MOAT] + list(args), env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              timeout=timeout, cwd=cwd)

    def tmpdir(self):
        d = tempfile.mkdtemp(prefix="moat-cli-tpl-")
        self.addCleanup(shutil.rmtree, d, True)
        return d

    def write(self, d, files):
        for name, data in files.items():
            p = os.path.join(d, name)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "wb") as f:
                f.write(data if isinstance(data, bytes) else data.encode())

    def forget(self, name):
        def rm():
            try:
                self.c.request("DELETE", "/v1/templates/" + name, expect=(204, 404))
            except Exception:
                pass
        self.addCleanup(rm)

    def test_build_serve_logs_get_ls_rm(self):
        d = self.tmpdir()
        self.write(d, {"Dockerfile": WEB_DOCKERFILE, "site/index.html": "<h1>from the cli</h1>\n",
                       "site/secret.key": "must not be sent\n", "site/logs/a.log": "x",
                       ".dockerignore": "# comments and blank lines are skipped\n\nsite/*.key\nsite/logs\n"})
        os.symlink("index.html", os.path.join(d, "site", "home.html"))  # a link inside the context
        self.forget("cliweb")
        r = self.moat("template", "build", "cliweb", d)
        out, err = r.stdout.decode(), r.stderr.decode()
        self.assertEqual(r.returncode, 0, (out, err))
        lines = out.splitlines()
        self.assertRegex(lines[0], r"^building template cliweb: build bd-\S+$")
        build_id = lines[0].rsplit(" ", 1)[1]
        self.assertIn("#1 FROM base", lines)
        self.assertIn("#3 | step-output-line", lines, out)
        self.assertRegex(lines[-1], r"^template cliweb ready \(build %s, [0-9.]+ MiB\)$" % build_id)
        self.assertIn("sending the build context: 3 files", err)  # Dockerfile, .dockerignore, index.html

        sid = self.sandbox(template="cliweb")["id"]
        got = self.c.exec(sid, argv=["curl", "-fsS", "http://127.0.0.1:8000/home.html"])
        self.assertEqual(got["stdout"], "<h1>from the cli</h1>\n", got)
        got = self.c.exec(sid, argv=["sh", "-c", "cat /srv/site/built.txt; ls /srv/site; readlink /srv/site/home.html"])
        self.assertEqual(got["stdout"], "built by root\nbuilt.txt\nhome.html\nindex.html\nindex.html\n", got)

        r = self.moat("template", "logs", "cliweb", build_id)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(b"#3 | step-output-line\n", r.stdout)
        self.assertIn(b"template cliweb ready", r.stdout)
        r = self.moat("template", "logs", "cliweb", "bd-nope")
        self.assertEqual(r.returncode, 1)
        r = self.moat("template", "get", "cliweb")
        self.assertEqual(r.returncode, 0, r.stderr)
        import json
        t = json.loads(r.stdout)
        self.assertEqual((t["state"], t["source"], t["build_id"], t["from"]), ("ready", "dockerfile", build_id, "base"))
        r = self.moat("template", "ls")
        row = [x for x in r.stdout.decode().splitlines() if x.startswith("cliweb ")]
        self.assertEqual(len(row), 1, r.stdout)
        self.assertEqual(row[0].split()[1:3], ["dockerfile", "ready"])
        r = self.moat("template", "ls", "--json")
        self.assertIn("cliweb", [x["name"] for x in json.loads(r.stdout)])

        r = self.moat("template", "rm", "cliweb")
        self.assertEqual((r.returncode, r.stdout, r.stderr), (0, b"", b""))
        r = self.moat("template", "get", "cliweb")
        self.assertEqual(r.returncode, 1)
        self.assertIn(b"not_found", r.stderr)
        r = self.moat("template", "rm", "base")
        self.assertEqual(r.returncode, 1)
        self.assertIn(b"forbidden", r.stderr)
        # the sandbox made from it keeps serving
        got = self.c.exec(sid, argv=["curl", "-fsS", "http://127.0.0.1:8000/index.html"])
        self.assertEqual(got["exit_code"], 0, got)

    def test_failed_build_and_refused_context(self):
        d = self.tmpdir()
        self.write(d, {"Dockerfile": "FROM base\nRUN echo first\nRUN echo about-to-fail; exit 3\n"})
        self.forget("clifail")
        r = self.moat("template", "build", "clifail", d)
        self.assertEqual(r.returncode, 1, (r.stdout, r.stderr))
        self.assertIn(b"#3 | about-to-fail\n", r.stdout)
        self.assertIn(b"clifail: build bd-", r.stderr)
        self.assertIn(b"failed", r.stderr)
        self.assertIn(b"exited 3", r.stderr)
        self.assertNotIn(b"ready", r.stdout)

        # a syntax error: 400 naming the line, no build
        self.write(d, {"Dockerfile": "FROM base\nFROBNICATE x\n"})
        r = self.moat("template", "build", "clibad", d)
        self.assertEqual(r.returncode, 1)
        self.assertIn(b"line 2", r.stderr)

        # a link out of the context is sent as a link (moatd refuses it), never as what it points to
        outside = self.tmpdir()
        self.write(outside, {"secret": "host secret\n"})
        ctx = self.tmpdir()
        self.write(ctx, {"Dockerfile": "FROM base\nCOPY leak /leak\n"})
        os.symlink(os.path.join(outside, "secret"), os.path.join(ctx, "leak"))
        self.forget("clileak")
        r = self.moat("template", "build", "clileak", ctx)
        self.assertEqual(r.returncode, 1, (r.stdout, r.stderr))
        self.assertIn(b"invalid_request", r.stderr)
        with self.assertRaises(HTTPError) as cm:
            self.c.request("GET", "/v1/templates/clileak")
        self.assertEqual(cm.exception.status, 404)

        # usage errors
        self.assertEqual(self.moat("template", "build").returncode, 2)
        self.assertEqual(self.moat("template", "build", "base", d).returncode, 2)  # a recipe takes no DIR
        self.assertEqual(self.moat("template", "build", "x", "--build-arg", "NOEQ", d).returncode, 2)
        self.assertEqual(self.moat("template", "ls", "--follow").returncode, 2)
        self.assertEqual(self.moat("template", "build", "x", os.path.join(d, "missing")).returncode, 1)

    def test_dockerfile_outside_build_args_and_interrupt(self):
        ctx, elsewhere = self.tmpdir(), self.tmpdir()
        self.write(ctx, {"data.txt": "context data\n"})
        self.write(elsewhere, {"web.Dockerfile": "FROM base\nARG WHO=nobody\nCOPY data.txt /data.txt\n"
                                                 "RUN echo \"hello $WHO\" > /who && sleep 4 && echo slept\n"})
        self.forget("cliargs")
        p = subprocess.Popen([MOAT, "template", "build", "cliargs", "-f", os.path.join(elsewhere, "web.Dockerfile"),
                              "--build-arg", "WHO=cli user", ctx], env=self.env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
        self.addCleanup(lambda: (p.poll() is None and p.kill(), p.wait()))
        seen = b""
        deadline = time.time() + 120
        while b"#4 RUN" not in seen and time.time() < deadline:
            line = p.stdout.readline()
            if not line:
                break
            seen += line
        self.assertIn(b"#4 RUN", seen, p.stderr.read() if p.poll() is not None else b"")
        build_id = seen.splitlines()[0].rsplit(b" ", 1)[1].decode()
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
        self.assertEqual(p.returncode, 128 + signal.SIGINT, (out, err))
        self.assertIn(b"the build goes on", err)
        self.assertIn(("moat template logs cliargs %s --follow" % build_id).encode(), err)
        # the build went on: following it again sees its end
        r = self.moat("template", "logs", "cliargs", build_id, "--follow")
        self.assertEqual(r.returncode, 0, (r.stdout, r.stderr))
        self.assertIn(b"#4 | slept\n", r.stdout)
        sid = self.sandbox(template="cliargs")["id"]
        got = self.c.exec(sid, argv=["cat", "/who", "/data.txt"])
        self.assertEqual(got["stdout"], "hello cli user\ncontext data\n", got)

    def test_import_oci_archive(self):
        d = self.tmpdir()
        path = os.path.join(d, "image.tar")
        with open(path, "wb") as f:
            f.write(oci_archive.make({"srv/hello.txt": b"from the oci layer\n"}, env=["GREETING=oci"],
                                     workdir="/srv"))
        self.forget("clioci")
        r = self.moat("template", "import", "clioci", path)
        self.assertEqual(r.returncode, 0, r.stderr)
        row = r.stdout.decode().splitlines()[1].split()
        self.assertEqual(row[:3], ["clioci", "oci", "ready"], r.stdout)
        t = self.c.request("GET", "/v1/templates/clioci")[1]
        self.assertEqual((t["source"], t["config"]["workdir"]), ("oci", "/srv"), t)
        self.assertIn("GREETING=oci", t["config"]["env"])
        sid = self.sandbox(template="clioci")["id"]
        self.assertEqual(self.c.get_file(sid, "/srv/hello.txt"), b"from the oci layer\n")
        # not an archive: the API's error, exit 1
        bad = os.path.join(d, "bad.tar")
        with open(bad, "wb") as f:
            f.write(b"not an archive" * 100)
        r = self.moat("template", "import", "clibadoci", bad)
        self.assertEqual(r.returncode, 1)
        self.assertIn(b"invalid_request", r.stderr)
        self.assertEqual(self.moat("template", "import", "x", os.path.join(d, "missing.tar")).returncode, 1)
        r = self.moat("template", "rm", "clioci")
        self.assertEqual(r.returncode, 0, r.stderr)


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

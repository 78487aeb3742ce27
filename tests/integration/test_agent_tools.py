"""test_agent_tools.py -- the templates carry what agents reach for first. `base`: git, curl, wget, unzip,
ps, sudo without a password for `user` (a root-owned 0440 drop-in), python3 -m venv with pip inside, and
Debian's PEP 668 marker honoured by plain pip. `code-interpreter`: `pip install` of a wheel the test builds
(from a file as root, into /usr/local; by name from an index served inside the sandbox as user, into
~/.local; nothing comes from the internet), node and npm (a package packed and installed offline)."""

import base64
import hashlib
import io
import os
import sys
import zipfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
import moatd  # noqa: E402
from moattest import DaemonTest  # noqa: E402

WHEEL = "moat_hello-0.1-py3-none-any.whl"


def tiny_wheel():
    """The bytes of a pure-Python wheel (PEP 427) for a module moat_hello with greet()."""
    files = {
        "moat_hello/__init__.py": b"def greet():\n    return 'hello from a wheel'\n",
        "moat_hello-0.1.dist-info/METADATA": b"Metadata-Version: 2.1\nName: moat-hello\nVersion: 0.1\n",
        "moat_hello-0.1.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: moat-test\nRoot-Is-Purelib: true\n"
                                          b"Tag: py3-none-any\n",
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append("%s,sha256=%s,%d" % (name, digest, len(data)))
    record.append("moat_hello-0.1.dist-info/RECORD,,")
    files["moat_hello-0.1.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            z.writestr(name, data)
    return buf.getvalue()


class AgentToolsTest(DaemonTest):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        moatd.ensure_template("code-interpreter")

    def run_ok(self, sid, cmd, **kw):
        r = self.c.exec(sid, cmd=cmd, timeout_ms=120000, timeout=180, **kw)
        self.assertEqual(r["exit_code"], 0, "%s: %r" % (cmd, r))
        return r

    def test_base_tools(self):
        sid = self.sandbox(ttl_seconds=600)["id"]
        self.assertRegex(self.run_ok(sid, "git --version")["stdout"], r"^git version 2\.")
        self.assertRegex(self.run_ok(sid, "curl --version")["stdout"], r"^curl 7\.")
        self.assertRegex(self.run_ok(sid, "wget --version")["stdout"], r"^GNU Wget ")
        self.assertIn("UnZip", self.run_ok(sid, "unzip -v")["stdout"])
        self.assertRegex(self.run_ok(sid, "python --version")["stdout"], r"^Python 3\.")  # as user too
        self.assertRegex(self.run_ok(sid, "python -c 'import sys; print(sys.executable)'", user="user")["stdout"],
                         r"^/usr/bin/python\n$")
        self.assertIn("ps", self.run_ok(sid, "ps -o comm= -p $$; pgrep -x sh >/dev/null && echo ps")["stdout"])
        # a repository made and committed to as user, then read by root
        self.run_ok(sid, "cd && git init -q r && cd r && echo x > f && git add f && "
                         "git -c user.email=u@e -c user.name=u commit -qm one", user="user")
        self.assertEqual(self.run_ok(sid, "git -C /home/user/r log --format=%s")["stdout"], "one\n")
        self.assertEqual(self.run_ok(sid, "git -C /home/user/r branch --show-current")["stdout"], "main\n")

    def test_base_sudo_without_password(self):
        sid = self.sandbox(ttl_seconds=600)["id"]
        r = self.run_ok(sid, "sudo -n true", user="user")
        self.assertEqual(r["stderr"], "")
        self.assertEqual(self.run_ok(sid, "sudo -n id -u", user="user")["stdout"], "0\n")
        self.assertEqual(self.run_ok(sid, "id -u", user="user")["stdout"], "1000\n")
        st = self.c.stat(sid, "/etc/sudoers.d/user")
        self.assertEqual((st["mode"], st["uid"], st["gid"]), ("0440", 0, 0), st)

    def test_base_python_venv_pip(self):
        sid = self.sandbox(ttl_seconds=600)["id"]
        r = self.run_ok(sid, "python3 -m venv /tmp/v && /tmp/v/bin/pip --version", user="user")
        self.assertRegex(r["stdout"], r"^pip \d+\.\d+.* from /tmp/v/lib/python3\.\d+/site-packages/pip ")
        self.assertRegex(self.run_ok(sid, "pip --version")["stdout"], r"^pip \d+\.")
        # plain pip keeps to Debian's PEP 668 marker in base (code-interpreter lifts it)
        r = self.c.exec(sid, cmd="pip install --no-index /nonexistent.whl", timeout_ms=60000)
        self.assertNotEqual(r["exit_code"], 0, r)
        self.assertIn("externally-managed-environment", r["stderr"])
        self.run_ok(sid, "test -s /usr/share/doc/python3.11/README.venv")  # what that error points at

    def test_code_interpreter_pip_install(self):
        sid = self.sandbox(template="code-interpreter", ttl_seconds=600)["id"]
        whl = tiny_wheel()
        self.c.put_file(sid, "/tmp/" + WHEEL, whl)
        # as root, from a file: into /usr/local, importable by every user
        r = self.run_ok(sid, "pip install --no-index /tmp/" + WHEEL)
        self.assertIn("Successfully installed moat-hello-0.1", r["stdout"])
        self.assertNotIn("WARNING", r["stderr"])
        r = self.run_ok(sid, "python3 -c 'import moat_hello; print(moat_hello.__file__, moat_hello.greet())'",
                        user="user")
        self.assertEqual(r["stdout"], "/usr/local/lib/python3.11/dist-packages/moat_hello/__init__.py "
                                      "hello from a wheel\n")
        self.run_ok(sid, "pip uninstall -y moat-hello")

        # as user, by name from an index (PEP 503 simple) served inside the sandbox: into ~/.local
        self.c.put_file(sid, "/tmp/index/moat-hello/" + WHEEL, whl)
        self.c.put_file(sid, "/tmp/index/moat-hello/index.html",
                        ('<a href="%s">%s</a>\n' % (WHEEL, WHEEL)).encode())
        srv = self.c.request("POST", "/v1/sandboxes/%s/exec" % sid, expect=201, body={
            "argv": ["python3", "-m", "http.server", "--bind", "127.0.0.1", "--directory", "/tmp/index", "8765"],
            "background": True, "user": "user"})[1]
        self.addCleanup(self.c.request, "POST", "/v1/sandboxes/%s/processes/%d/signal" % (sid, srv["pid"]),
                        body={"signal": "KILL"}, expect=(204, 404, 409))
        self.run_ok(sid, "for i in $(seq 100); do curl -sf -o /dev/null http://127.0.0.1:8765/ && exit 0; "
                         "sleep 0.1; done; exit 1")
        r = self.run_ok(sid, "pip install --index-url http://127.0.0.1:8765/ moat-hello", user="user")
        self.assertIn("Successfully installed moat-hello-0.1", r["stdout"])
        r = self.run_ok(sid, "python3 -c 'import moat_hello; print(moat_hello.__file__)'", user="user")
        self.assertEqual(r["stdout"], "/home/user/.local/lib/python3.11/site-packages/moat_hello/__init__.py\n")
        # a venv works here too
        r = self.run_ok(sid, "python3 -m venv /tmp/v && /tmp/v/bin/pip install -q --no-index /tmp/%s && "
                             "/tmp/v/bin/python -c 'import moat_hello; print(moat_hello.greet())'" % WHEEL)
        self.assertEqual(r["stdout"], "hello from a wheel\n")

    def test_code_interpreter_node_npm(self):
        sid = self.sandbox(template="code-interpreter", ttl_seconds=600)["id"]
        self.assertEqual(self.run_ok(sid, "node -e 'console.log(6 * 7)'")["stdout"], "42\n")
        self.assertRegex(self.run_ok(sid, "npm --version")["stdout"], r"^\d+\.\d+\.\d+\n$")
        # a package packed and installed offline, then required
        self.c.put_file(sid, "/tmp/pkg/package.json", b'{"name": "moat-hello", "version": "0.1.0", "main": "i.js"}')
        self.c.put_file(sid, "/tmp/pkg/i.js", b"module.exports = () => 'hello from npm';\n")
        r = self.run_ok(sid, "cd /tmp && npm pack --silent ./pkg && mkdir app && cd app && "
                             "npm install --offline --no-audit --no-fund --silent ../moat-hello-0.1.0.tgz && "
                             "node -e \"console.log(require('moat-hello')())\"", user="user")
        self.assertTrue(r["stdout"].endswith("hello from npm\n"), r)

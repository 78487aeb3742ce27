"""test_sdk_python.py -- the Python SDK (sdk/python, package `moat`) against a real moatd: sandboxes,
exec, streams, background processes, files and watch, code contexts, typed errors, the context
manager, time travel (skipped while moatd answers 501), argument checks that send nothing (a
counting server), streams whose connection drops (local servers that drop or go silent), and
`pip install` (and `pip install -e`) of the package into venvs with no package index."""

import io
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tests", "lib"))
sys.path.insert(0, os.path.join(REPO, "sdk", "python"))
import moatd  # noqa: E402
import oci_archive  # noqa: E402
from moattest import DaemonTest  # noqa: E402

import moat  # noqa: E402
from moat import Sandbox  # noqa: E402


class FakeServer:
    """A loopback TCP server for client-side failure tests. mode:
    'count'  -- answers 500 {"code":"internal"} to every request and counts them;
    'drop'   -- answers an SSE stream with one stdout event, then closes the socket;
    'silent' -- answers an SSE stream with one stdout event, then sends nothing more;
    'hang'   -- reads the request and never answers;
    'once'   -- answers one request with a sandbox (keep-alive), then closes the connection silently,
                as a server does with an idle kept-alive connection."""

    def __init__(self, mode):
        self.mode = mode
        self.requests = 0
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.url = "http://127.0.0.1:%d" % self.port
        self.conns = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _read_request(self, c):
        buf = b""
        while b"\r\n\r\n" not in buf:
            d = c.recv(65536)
            if not d:
                return False
            buf += d
        head, rest = buf.split(b"\r\n\r\n", 1)
        n = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                n = int(line.split(b":")[1])
        while len(rest) < n:
            d = c.recv(65536)
            if not d:
                break
            rest += d
        self.requests += 1
        return True

    def _serve(self):
        while not self.stop.is_set():
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(c)
            threading.Thread(target=self._conn, args=(c,), daemon=True).start()

    def _conn(self, c):
        try:
            while self._read_request(c):
                if self.mode == "count":
                    body = b'{"code":"internal","message":"counting server"}'
                    c.sendall(b"HTTP/1.1 500 Internal\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                              % len(body) + body)
                    continue
                if self.mode == "once":
                    body = b'{"id":"abcdefghijklmnop","state":"running","template":"base"}'
                    c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                              % len(body) + body)
                    time.sleep(0.1)
                    c.close()
                    return
                if self.mode == "hang":
                    self.stop.wait(30)
                    return
                ev = b'event: stdout\ndata: {"data":"partial\\n","encoding":"utf8"}\n\n'
                c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                          + b"%x\r\n" % len(ev) + ev + b"\r\n")
                if self.mode == "drop":
                    time.sleep(0.2)
                    c.shutdown(socket.SHUT_RDWR)
                    c.close()
                    return
                self.stop.wait(30)
                return
        except OSError:
            pass

    def close(self):
        self.stop.set()
        self.sock.close()
        for c in self.conns:
            try:
                c.close()
            except OSError:
                pass


class ValidationTest(unittest.TestCase):
    """Wrong types and values fail before any request (the counting server sees none)."""

    def setUp(self):
        self.srv = FakeServer("count")
        self.addCleanup(self.srv.close)
        self.client = moat.Client(self.srv.url, "k", request_timeout=5)
        self.addCleanup(self.client.close)
        self.sb = Sandbox({"id": "abcdefghijklmnop", "state": "running", "template": "base"}, self.client)

    def test_bad_arguments_send_nothing(self):
        sb, c = self.sb, self.client
        cases = [
            (TypeError, lambda: Sandbox.create(3, client=c)),
            (TypeError, lambda: Sandbox.create(ttl_seconds="10", client=c)),
            (ValueError, lambda: Sandbox.create(ttl_seconds=0, client=c)),
            (TypeError, lambda: Sandbox.create(persistent="yes", client=c)),
            (TypeError, lambda: Sandbox.create(metadata={"a": 1}, client=c)),
            (TypeError, lambda: Sandbox.create(metadata=["a"], client=c)),
            (ValueError, lambda: Sandbox.create(env={"1BAD": "x"}, client=c)),
            (TypeError, lambda: Sandbox.create(cpu="2", client=c)),
            (ValueError, lambda: Sandbox.create(cpu=0, client=c)),
            (TypeError, lambda: Sandbox.create(memory_mb=True, client=c)),
            (TypeError, lambda: Sandbox.create(network=["x"], client=c)),
            (ValueError, lambda: Sandbox.create(hibernate_after_seconds=60, client=c)),
            (TypeError, lambda: Sandbox.create(persistent=True, hibernate_after_seconds=1.5, client=c)),
            (TypeError, lambda: Sandbox.create(client="http://x")),
            (TypeError, lambda: Sandbox.connect(None, client=c)),
            (TypeError, lambda: Sandbox.connect(123, client=c)),
            (ValueError, lambda: Sandbox.connect("", client=c)),
            (TypeError, lambda: Sandbox.list(metadata=[("a", "b")], client=c)),
            (ValueError, lambda: Sandbox.list(state="sleeping", client=c)),
            (ValueError, lambda: Sandbox.list(limit=0, client=c)),
            (ValueError, lambda: Sandbox.list(limit=1001, client=c)),
            (TypeError, lambda: Sandbox.list(limit="5", client=c)),
            (ValueError, lambda: Sandbox.list(cursor="", client=c)),
            (TypeError, lambda: Sandbox.list(cursor=5, client=c)),
            (ValueError, lambda: Sandbox.iter(page_size=0, client=c)),
            (TypeError, lambda: sb.exec(None)),
            (TypeError, lambda: sb.exec(123)),
            (ValueError, lambda: sb.exec("")),
            (ValueError, lambda: sb.exec([])),
            (TypeError, lambda: sb.exec(["ls", 3])),
            (ValueError, lambda: sb.exec("ls", timeout=-1)),
            (ValueError, lambda: sb.exec("ls", timeout=0)),
            (TypeError, lambda: sb.exec("ls", timeout="5")),
            (TypeError, lambda: sb.exec("ls", env={"A": 1})),
            (TypeError, lambda: sb.exec("ls", stdin=123)),
            (TypeError, lambda: sb.exec("ls", cwd=5)),
            (ValueError, lambda: sb.exec("ls", tag="t")),
            (TypeError, lambda: sb.exec("ls", background="yes")),
            (TypeError, lambda: sb.exec_stream("ls", on_stdout="print")),
            (TypeError, lambda: sb.exec_stream(None)),
            (TypeError, lambda: sb.files.read(None)),
            (TypeError, lambda: sb.files.read_bytes(7)),
            (TypeError, lambda: sb.files.write("/x", 123)),
            (ValueError, lambda: sb.files.write("/x", "a", mode="999")),
            (TypeError, lambda: sb.files.write("/x", "a", mode=True)),
            (ValueError, lambda: sb.files.list("/", depth=0)),
            (TypeError, lambda: sb.files.remove("/x", recursive="yes")),
            (TypeError, lambda: sb.files.move(None, "/y")),
            (TypeError, lambda: sb.files.mkdir("/x", parents=1)),
            (TypeError, lambda: sb.files.watch("/x", recursive=None)),
            (ValueError, lambda: sb.create_code_context("cobol")),
            (TypeError, lambda: sb.create_code_context(None)),
            (TypeError, lambda: moat.CodeContext(sb, {"id": "c1"}).run_code(123)),
            (ValueError, lambda: moat.CodeContext(sb, {"id": "c1"}).run_code("1", timeout=-2)),
            (ValueError, lambda: sb.fork(0)),
            (TypeError, lambda: sb.fork("2")),
            (ValueError, lambda: sb.explore([])),
            (TypeError, lambda: sb.explore("echo hi")),
            (TypeError, lambda: sb.explore(["a", 1])),
            (ValueError, lambda: sb.explore(["true"], keep="worst")),
            (TypeError, lambda: sb.explore(["true"], score_fn=5)),
            (TypeError, lambda: sb.rollback(None)),
            (ValueError, lambda: sb.update()),
            (ValueError, lambda: sb.process(0)),
            (TypeError, lambda: sb.process(1.5)),
            (ValueError, lambda: sb.process("a/b")),
            (ValueError, lambda: sb.process("123")),
            (ValueError, lambda: sb.exec("sleep 1", background=True, tag="x" * 65)),
            (ValueError, lambda: sb.process(1).signal("BOGUS")),
            (TypeError, lambda: sb.process(1).stdin.write(5)),
            (TypeError, lambda: sb.process(1).stream(on_stdout=3)),
            (ValueError, lambda: sb.pty(cols=0)),
            (TypeError, lambda: sb.pty(rows="24")),
            (TypeError, lambda: sb.pty(["bash"])),
            (TypeError, lambda: c.templates.build(3)),
            (TypeError, lambda: c.templates.build("t", build_args=["A=1"])),
            (TypeError, lambda: c.templates.build("t", build_args={"A": 1})),
            (TypeError, lambda: c.templates.build("t", on_log="print")),
            (ValueError, lambda: c.templates.build("t", path="/nonexistent-moat-dir")),
            (TypeError, lambda: c.templates.import_image("t", 42)),
            (TypeError, lambda: c.templates.logs("t", "bd-1", follow="yes")),
            (ValueError, lambda: c.templates.get("")),
        ]
        for i, (exc, fn) in enumerate(cases):
            with self.subTest(case=i):
                with self.assertRaises(exc) as cm:
                    fn()
                self.assertTrue(str(cm.exception), "empty message")
        self.assertEqual(self.srv.requests, 0, "a bad call reached the server")
        # the server is there: a good call does reach it (and 500 becomes SandboxError)
        with self.assertRaises(moat.SandboxError) as cm:
            sb.refresh()
        self.assertEqual((cm.exception.status, cm.exception.code), (500, "internal"))
        self.assertEqual(self.srv.requests, 1)

    def test_annotations_resolve(self):
        # the public surface is typed: every annotation of every public callable resolves
        import inspect
        import typing
        n = 0
        for name in moat.__all__:
            obj = getattr(moat, name)
            targets = [obj]
            if inspect.isclass(obj):
                targets = [v for k, v in vars(obj).items() if not k.startswith("_") or k == "__init__"]
            for t in targets:
                fn = t.__func__ if isinstance(t, (classmethod, staticmethod)) else t
                if inspect.isfunction(fn):
                    typing.get_type_hints(fn)
                    n += 1
        self.assertGreater(n, 50)
        self.assertTrue(os.path.exists(os.path.join(os.path.dirname(moat.__file__), "py.typed")))

    def test_client_arguments(self):
        env = dict(os.environ)
        try:
            os.environ.pop("MOAT_API_KEY", None)
            with self.assertRaises(ValueError) as cm:
                moat.Client("http://127.0.0.1:1")
            self.assertIn("MOAT_API_KEY", str(cm.exception))
            with self.assertRaises(ValueError):
                moat.Client("ftp://127.0.0.1", "k")
            with self.assertRaises(TypeError):
                moat.Client("http://127.0.0.1:1", "k", request_timeout="60")
            os.environ["MOAT_API_URL"] = self.srv.url
            os.environ["MOAT_API_KEY"] = "from-env"
            c = moat.Client()
            self.assertEqual(c.api_url, self.srv.url)
            self.assertEqual(c._t.api_key, "from-env")
        finally:
            os.environ.clear()
            os.environ.update(env)


class DropTest(unittest.TestCase):
    """Streams whose connection drops or goes silent raise moat.ConnectionError, never hang."""

    def sandbox(self, mode, **kw):
        srv = FakeServer(mode)
        self.addCleanup(srv.close)
        c = moat.Client(srv.url, "k", **kw)
        return Sandbox({"id": "abcdefghijklmnop", "state": "running"}, c)

    def test_dropped_mid_stream_raises(self):
        sb = self.sandbox("drop")
        got = []
        t0 = time.monotonic()
        with self.assertRaises(moat.ConnectionError) as cm:
            sb.exec_stream("sleep 100", on_stdout=got.append)
        self.assertLess(time.monotonic() - t0, 5)
        self.assertEqual(got, ["partial\n"])
        self.assertIsInstance(cm.exception, ConnectionError)  # the built-in, too
        with self.assertRaises(moat.ConnectionError):
            sb.process("ticker").wait()
        with self.assertRaises(moat.ConnectionError):
            moat.CodeContext(sb, {"id": "c1"}).run_code("1", on_stdout=print)

    def test_silent_stream_raises_after_idle_limit(self):
        sb = self.sandbox("silent", stream_idle_timeout=1.0)
        t0 = time.monotonic()
        with self.assertRaises(moat.ConnectionError) as cm:
            sb.exec_stream("sleep 100")
        self.assertLess(time.monotonic() - t0, 5)
        self.assertIn("silent", str(cm.exception))

    def test_stale_kept_alive_connection_is_replaced(self):
        srv = FakeServer("once")
        self.addCleanup(srv.close)
        sb = Sandbox({"id": "abcdefghijklmnop", "state": "running"}, moat.Client(srv.url, "k"))
        for _ in range(3):
            time.sleep(0.3)  # the server has closed the connection by now
            self.assertEqual(sb.refresh().state, "running")
        self.assertEqual((srv.requests, len(srv.conns)), (3, 3))

    def test_request_timeout_and_unreachable(self):
        sb = self.sandbox("hang", request_timeout=0.5)
        t0 = time.monotonic()
        with self.assertRaises(moat.TimeoutError) as cm:
            sb.refresh()
        self.assertLess(time.monotonic() - t0, 5)
        self.assertIsInstance(cm.exception, TimeoutError)
        self.assertEqual(cm.exception.code, "client_timeout")
        # life-cycle calls have their own limit
        slow = self.sandbox("hang", request_timeout=30, lifecycle_timeout=0.5)
        t0 = time.monotonic()
        with self.assertRaises(moat.TimeoutError):
            Sandbox.create(client=slow.client)
        with self.assertRaises(moat.TimeoutError):
            slow.kill()
        self.assertLess(time.monotonic() - t0, 5)
        port = moatd.free_port()  # nothing listens there
        c = moat.Client("http://127.0.0.1:%d" % port, "k")
        with self.assertRaises(moat.ConnectionError):
            Sandbox.connect("abcdefghijklmnop", client=c)


class SdkTest(DaemonTest):
    daemon_args = ("--stream-keepalive-ms", "1000")  # default 15 s: the silent-stream test waits less

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.url = "http://127.0.0.1:%d" % cls.daemon.port
        cls.client = moat.Client(cls.url, cls.c.key)
        cls.sb = Sandbox.create(client=cls.client, env={"FOO": "foo"}, metadata={"suite": "sdk"})

    def make(self, **kw):
        sb = Sandbox.create(client=self.client, **kw)
        self.addCleanup(self._delete_quietly, self.c, sb.id)
        return sb

    # -- sandboxes --
    def test_create_connect_list_update_kill(self):
        sb = self.make(ttl_seconds=600, metadata={"who": "sdk-test", "n": "1"}, cpu=0.5, memory_mb=256)
        self.assertEqual(sb.state, "running")
        self.assertEqual(sb.info.metadata, {"who": "sdk-test", "n": "1"})
        self.assertEqual((sb.info.cpu, sb.info.memory_mb, sb.info.ttl_seconds), (0.5, 256, 600))
        same = Sandbox.connect(sb.id, client=self.client)
        self.assertEqual(same.id, sb.id)
        self.assertEqual(same, sb)
        ids = [s.id for s in Sandbox.list(metadata={"who": "sdk-test"}, client=self.client)]
        self.assertEqual(ids, [sb.id])
        self.assertIn(sb.id, [s.id for s in Sandbox.list(state="running", client=self.client)])
        info = sb.update(metadata={"who": "renamed"})
        self.assertEqual(info.metadata, {"who": "renamed"})
        self.assertEqual(sb.refresh().metadata, {"who": "renamed"})
        sb.kill()
        self.assertEqual(sb.state, "killed")
        self.assertNotIn(sb.id, [s.id for s in Sandbox.list(client=self.client)])
        with self.assertRaises(moat.NotFoundError):
            sb.exec("true")

    def test_list_pages_and_iter(self):
        tag = "pages-%d" % os.getpid()
        made = [self.make(metadata={"suite": tag, "odd": str(i % 2)}).id for i in range(5)]
        whole = Sandbox.list(metadata={"suite": tag}, client=self.client)
        self.assertEqual(sorted(s.id for s in whole), sorted(made))
        self.assertEqual((whole.next, whole.total), (None, 5))
        first = Sandbox.list(metadata={"suite": tag}, limit=2, client=self.client)
        self.assertIsInstance(first, moat.SandboxList)
        self.assertEqual(([s.id for s in first], first.total), ([s.id for s in whole][:2], 5))
        self.assertIsInstance(first.next, str)
        second = Sandbox.list(metadata={"suite": tag}, limit=2, cursor=first.next, client=self.client)
        self.assertEqual([s.id for s in second], [s.id for s in whole][2:4])
        last = Sandbox.list(metadata={"suite": tag}, limit=2, cursor=second.next, client=self.client)
        self.assertEqual(([s.id for s in last], last.next), ([s.id for s in whole][4:], None))
        walked = Sandbox.iter(metadata={"suite": tag}, page_size=2, client=self.client)
        self.assertEqual([s.id for s in walked], [s.id for s in whole])
        odd = [s.id for s in Sandbox.iter(metadata={"suite": tag, "odd": "1"}, page_size=1, client=self.client)]
        self.assertEqual(odd, [s.id for s in whole if s.info.metadata["odd"] == "1"])
        self.assertEqual(list(Sandbox.iter(metadata={"suite": tag + "-none"}, client=self.client)), [])
        self.assertEqual([s.id for s in Sandbox.iter(metadata={"suite": tag}, template="base", client=self.client)],
                         [s.id for s in whole])
        self.assertEqual(Sandbox.list(metadata={"suite": tag}, template="code-interpreter", client=self.client).total, 0)
        with self.assertRaises(moat.InvalidRequestError):
            Sandbox.list(cursor="not-a-cursor", client=self.client)

    def test_environment_variables(self):
        env = dict(os.environ)
        try:
            os.environ["MOAT_API_URL"] = self.url
            os.environ["MOAT_API_KEY"] = self.c.key
            sb = Sandbox.connect(self.sb.id)
            self.assertEqual(sb.exec("echo $FOO").stdout, "foo\n")
        finally:
            os.environ.clear()
            os.environ.update(env)

    def test_context_manager_kills(self):
        with Sandbox.create(client=self.client) as sb:
            self.addCleanup(self._delete_quietly, self.c, sb.id)
            self.assertEqual(sb.exec("echo in").stdout, "in\n")
        self.assertNotIn(sb.id, [s.id for s in Sandbox.list(client=self.client)])
        with self.assertRaises(RuntimeError):
            with Sandbox.create(client=self.client) as sb2:
                self.addCleanup(self._delete_quietly, self.c, sb2.id)
                raise RuntimeError("boom")
        self.assertNotIn(sb2.id, [s.id for s in Sandbox.list(client=self.client)])
        with Sandbox.create(client=self.client, persistent=True) as keep:
            self.addCleanup(self._delete_quietly, self.c, keep.id)
        self.assertEqual(Sandbox.connect(keep.id, client=self.client).state, "running")

    # -- exec --
    def test_exec(self):
        r = self.sb.exec("echo out; echo err >&2; exit 3")
        self.assertIsInstance(r, moat.ExecResult)
        self.assertEqual((r.stdout, r.stderr, r.exit_code, r.timed_out, r.truncated), ("out\n", "err\n", 3, False, False))
        self.assertFalse(r.ok)
        self.assertIsInstance(r.duration_ms, int)
        r = self.sb.exec(["echo", "a  b", "$HOME"])
        self.assertEqual(r.stdout, "a  b $HOME\n")
        self.assertEqual(self.sb.exec("pwd", cwd="/tmp").stdout, "/tmp\n")
        self.assertEqual(self.sb.exec("echo $FOO $BAR", env={"BAR": "bar"}).stdout, "foo bar\n")
        self.assertEqual(self.sb.exec("id -u", user="user").stdout, "1000\n")
        self.assertEqual(self.sb.exec(["cat"], stdin="in put").stdout, "in put")
        r = self.sb.exec("head -c 4 | od -An -tx1", stdin=b"\x00\xff\x01\x80")
        self.assertEqual(r.stdout.split(), ["00", "ff", "01", "80"])
        r = self.sb.exec("printf 'a\\377b'")
        self.assertEqual(r.stdout_bytes, b"a\xffb")
        self.assertEqual(r.stdout, "a\ufffdb")
        t0 = time.monotonic()
        r = self.sb.exec("sleep 10", timeout=0.5)
        self.assertTrue(r.timed_out)
        self.assertEqual(r.exit_code, -1)
        self.assertLess(time.monotonic() - t0, 5)
        with self.assertRaises(moat.InvalidRequestError) as cm:
            self.sb.exec("true", user="nosuchuser")
        self.assertEqual((cm.exception.status, cm.exception.code), (400, "invalid_request"))

    def test_exec_outlives_request_timeout(self):
        # request_timeout is for ordinary calls only: a long exec without a timeout is never cut
        c = moat.Client(self.url, self.c.key, request_timeout=1)
        sb = Sandbox.connect(self.sb.id, client=c)
        r = sb.exec("sleep 2.5; echo done")
        self.assertEqual((r.stdout, r.exit_code), ("done\n", 0))
        self.assertEqual(sb.exec_stream("sleep 2; echo streamed", on_stdout=lambda s: None), 0)

    def test_silent_command_kept_alive(self):
        # moatd's keep-alive comments (every second here, --stream-keepalive-ms) keep a stream silent
        # for longer than the SDK's idle limit alive
        c = moat.Client(self.url, self.c.key, stream_idle_timeout=2.5)
        sb = Sandbox.connect(self.sb.id, client=c)
        out = []
        self.assertEqual(sb.exec_stream("sleep 5; echo done", on_stdout=out.append), 0)
        self.assertEqual(out, ["done\n"])

    def test_exec_from_threads(self):
        out, errs = {}, []

        def work(i):
            try:
                for j in range(5):
                    out[(i, j)] = self.sb.exec(["echo", "%d-%d" % (i, j)]).stdout
            except Exception as e:  # reported below
                errs.append(e)
        ts = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)
        self.assertEqual(errs, [])
        self.assertEqual(out, {(i, j): "%d-%d\n" % (i, j) for i in range(4) for j in range(5)})

    def test_exec_stream(self):
        out, err = [], []
        code = self.sb.exec_stream("for i in 1 2 3; do echo o$i; echo e$i >&2; sleep 0.05; done; exit 7",
                                   on_stdout=out.append, on_stderr=err.append)
        self.assertEqual(code, 7)
        self.assertEqual("".join(out), "o1\no2\no3\n")
        self.assertEqual("".join(err), "e1\ne2\ne3\n")
        raw = []
        self.assertEqual(self.sb.exec_stream("printf 'x\\377y'", on_stdout=raw.append, binary=True), 0)
        self.assertEqual(b"".join(raw), b"x\xffy")
        text = []
        self.sb.exec_stream("printf 'x\\377y'", on_stdout=text.append)
        self.assertEqual("".join(text), "x\ufffdy")
        self.assertEqual(self.sb.exec_stream("sleep 5", timeout=0.3), -1)
        with self.assertRaises(moat.InvalidRequestError):
            self.sb.exec_stream("true", user="nosuchuser")

    def test_exec_stream_callback_error_kills_command(self):
        def boom(_):
            raise KeyError("stop")
        with self.assertRaises(KeyError):
            self.sb.exec_stream("echo go; sleep 30; echo never", on_stdout=boom)
        deadline = time.time() + 10
        while time.time() < deadline:
            if not [p for p in self.sb.processes() if p.running and "sleep 30" in p.cmd]:
                break
            time.sleep(0.2)
        else:
            self.fail("kill_on_disconnect did not stop the command")

    def test_stream_raises_when_sandbox_dies(self):
        sb = self.make()
        threading.Timer(1.0, lambda: self._delete_quietly(self.c, sb.id)).start()
        t0 = time.monotonic()
        with self.assertRaises(moat.MoatError):
            sb.exec_stream("echo started; sleep 600", on_stdout=lambda s: None)
        self.assertLess(time.monotonic() - t0, 60)  # usually ~1 s; a loaded host's teardown takes longer

    # -- background processes --
    def test_background_process(self):
        p = self.sb.exec("i=0; while true; do echo tick $i; i=$((i+1)); sleep 0.1; done", background=True,
                         tag="sdk-ticker")
        self.assertIsInstance(p, moat.Process)
        self.assertEqual(p.tag, "sdk-ticker")
        self.assertGreater(p.pid, 0)
        info = p.info()
        self.assertTrue(info.running)
        self.assertIn(p.pid, [x.pid for x in self.sb.processes()])
        with self.assertRaises(moat.ConflictError) as cm:
            self.sb.exec("sleep 1", background=True, tag="sdk-ticker")
        self.assertEqual(cm.exception.code, "tag_in_use")
        with self.assertRaises(moat.TimeoutError):
            p.wait(timeout=0.5)
        seen = []
        threading.Timer(0.6, p.kill).start()
        code = p.stream(on_stdout=seen.append)
        self.assertEqual(code, -1)
        self.assertIn("tick 0\n", "".join(seen))
        self.assertFalse(p.info().running)
        self.assertEqual(p.info().signal, 9)

    def test_background_stdin_and_wait(self):
        p = self.sb.exec(["sh", "-c", "cat > /tmp/sdk-stdin; wc -c < /tmp/sdk-stdin; exit 5"], background=True)
        p.stdin.write("hello ")
        p.stdin.write(b"\x00\x01")
        p.stdin.close()
        self.assertEqual(p.wait(timeout=20), 5)
        out = []
        self.assertEqual(p.stream(on_stdout=out.append), 5)  # replay of a finished process
        self.assertEqual("".join(out).strip(), "8")
        with self.assertRaises(moat.ConflictError) as cm:
            p.stdin.write("late")
        self.assertEqual(cm.exception.code, "stdin_closed")
        q = self.sb.exec("sleep 30", background=True)
        q.signal("SIGTERM")
        self.assertEqual(q.wait(timeout=20), -1)
        self.assertEqual(q.info().signal, 15)
        with self.assertRaises(moat.NotFoundError) as cm:
            self.sb.process("no-such-tag").kill()
        self.assertEqual((cm.exception.status, cm.exception.code), (404, "process_not_found"))

    # -- pty --
    def test_pty(self):
        with self.sb.pty(cols=100, rows=30) as t:
            self.assertIsInstance(t, moat.Pty)
            t.send("stty size; echo MARK$((40+2))\r")
            out = t.read_until("MARK42", timeout=20)
            self.assertIn(b"30 100", out)
            t.resize(120, 40)
            t.send("stty size; echo MARK$((40+3))\r")
            self.assertIn(b"40 120", t.read_until("MARK43", timeout=20))
            t.send("exit\r")
            t.read_all(timeout=20)
            self.assertTrue(t.exited)
            self.assertEqual(t.recv(), b"")
        with self.sb.pty("echo hello; tty; echo $TERM") as t:
            out = t.read_all(timeout=20)
        self.assertIn(b"hello", out)
        self.assertIn(b"/dev/pts/", out)
        self.assertIn(b"xterm-256color", out)
        with self.sb.pty("sleep 60") as t:
            with self.assertRaises(moat.TimeoutError):
                t.recv(timeout=0.3)
        deadline = time.time() + 10  # closing the pty killed its process
        while any(p.running and p.cmd.endswith("sleep 60") for p in self.sb.processes()):
            self.assertLess(time.time(), deadline, "the pty's process outlived the pty")
            time.sleep(0.2)
        with self.assertRaises(moat.InvalidRequestError):
            self.sb.pty("true", user="nosuchuser")
        with self.assertRaises(moat.NotFoundError):
            Sandbox({"id": "zzzzzzzzzzzzzzzz", "state": "running"}, self.client).pty()

    # -- files --
    def test_files(self):
        f = self.sb.files
        w = f.write("/tmp/sdk/a/b.txt", "héllo\n")
        self.assertEqual((w.path, w.size), ("/tmp/sdk/a/b.txt", 7))
        self.assertEqual(f.read("/tmp/sdk/a/b.txt"), "héllo\n")
        data = bytes(range(256)) * 100
        f.write("/tmp/sdk/bin", data, mode=0o600)
        self.assertEqual(f.read_bytes("/tmp/sdk/bin"), data)
        st = f.stat("/tmp/sdk/bin")
        self.assertEqual((st.type, st.size, st.mode, st.name), ("file", len(data), "0600", "bin"))
        with tempfile.TemporaryFile() as tf:
            tf.write(b"from a file object\n" * 1000)
            tf.seek(0)
            self.assertEqual(f.write("/tmp/sdk/fobj", tf, mode="0755").size, 19000)
        self.assertEqual(f.stat("/tmp/sdk/fobj").mode, "0755")
        self.assertEqual(f.write("/tmp/sdk/bio", io.BytesIO(b"x" * 5000)).size, 5000)
        self.assertEqual(f.read("/tmp/sdk/bio"), "x" * 5000)
        names = sorted(e.name for e in f.list("/tmp/sdk"))
        self.assertEqual(names, ["a", "bin", "bio", "fobj"])
        deep = sorted(e.path for e in f.list("/tmp/sdk", depth=2))
        self.assertIn("/tmp/sdk/a/b.txt", deep)
        d = f.mkdir("/tmp/sdk/x/y")
        self.assertEqual(d.type, "dir")
        with self.assertRaises(moat.ConflictError) as cm:
            f.mkdir("/tmp/sdk/x/y", parents=False)
        self.assertEqual((cm.exception.status, cm.exception.code), (409, "already_exists"))
        m = f.move("/tmp/sdk/bin", "/tmp/sdk/x/moved")
        self.assertEqual(m.path, "/tmp/sdk/x/moved")
        self.assertFalse(f.exists("/tmp/sdk/bin"))
        self.assertTrue(f.exists("/tmp/sdk/x/moved"))
        f.write("rel.txt", "relative")
        self.assertEqual(f.read("/root/rel.txt"), "relative")
        f.write("mine.txt", "user's", user="user")
        self.assertEqual(f.stat("/home/user/mine.txt").uid, 1000)
        with self.assertRaises(moat.NotFoundError) as cm:
            f.read("/tmp/sdk/none")
        self.assertEqual((cm.exception.status, cm.exception.code), (404, "not_found"))
        with self.assertRaises(moat.InvalidRequestError):
            f.remove("/tmp/sdk/x")  # not empty
        f.remove("/tmp/sdk", recursive=True)
        self.assertFalse(f.exists("/tmp/sdk"))

    def test_watch(self):
        self.sb.files.mkdir("/tmp/sdkw")
        with self.sb.files.watch("/tmp/sdkw") as w:
            self.sb.files.write("/tmp/sdkw/new.txt", "x")
            seen = []
            # an upload is written beside the target and renamed over it
            while not any(e.path2 == "/tmp/sdkw/new.txt" for e in seen):
                ev = w.next(timeout=10)
                self.assertIsNotNone(ev)
                self.assertIsInstance(ev, moat.FilesystemEvent)
                seen.append(ev)
            self.assertEqual(seen[-1].event, "rename")
            self.sb.exec("touch /tmp/sdkw/t.txt")
            while not any(e.event == "create" and e.path == "/tmp/sdkw/t.txt" for e in seen):
                seen.append(w.next(timeout=10))
        self.assertIsNone(w.next())  # closed
        # closing from another thread ends a blocked iteration
        w2 = self.sb.files.watch("/tmp/sdkw")
        threading.Timer(0.5, w2.close).start()
        t0 = time.monotonic()
        self.assertEqual(list(w2), [])
        self.assertLess(time.monotonic() - t0, 5)
        with self.assertRaises(moat.NotFoundError):
            self.sb.files.watch("/tmp/no-such-dir")
        with self.assertRaises(moat.InvalidRequestError):
            self.sb.files.watch("/etc/hostname")

    # -- errors --
    def test_typed_errors(self):
        with self.assertRaises(moat.NotFoundError) as cm:
            Sandbox.connect("zzzzzzzzzzzzzzzz", client=self.client)
        e = cm.exception
        self.assertEqual((e.status, e.code), (404, "not_found"))
        self.assertTrue(e.message)
        self.assertIsInstance(e, moat.MoatError)
        bad = moat.Client(self.url, "wrong-key")
        with self.assertRaises(moat.AuthenticationError) as cm:
            Sandbox.list(client=bad)
        self.assertEqual((cm.exception.status, cm.exception.code), (401, "unauthorized"))
        with self.assertRaises(moat.InvalidRequestError) as cm:
            Sandbox.create("no-such-template", client=self.client)
        self.assertEqual((cm.exception.status, cm.exception.code), (400, "invalid_request"))
        self.assertIn("unknown template", cm.exception.message)
        with self.assertRaises(moat.InvalidRequestError) as cm:
            Sandbox.create(memory_mb=1 << 40, client=self.client)
        self.assertIn("memory_mb", cm.exception.message)
        self.assertEqual(self.client.health()["status"], "ok")
        # network: passed through; a moatd without egress policy answers 501 -> NotSupportedError
        try:
            sb = Sandbox.create(client=self.client, network={"egress": "deny"})
            self.addCleanup(self._delete_quietly, self.c, sb.id)
        except moat.NotSupportedError as e:
            self.assertEqual((e.status, e.code), (501, "not_implemented"))
        except moat.InvalidRequestError as e:
            self.assertIn("network", e.message)


WEB_DOCKERFILE = """FROM base
ARG MSG=default
COPY site/ /srv/site/
RUN echo "$MSG" > /srv/site/msg.txt && echo sdk-build-output
HEALTHCHECK --interval=1s CMD curl -fsS http://127.0.0.1:8000/index.html
CMD ["python3", "-m", "http.server", "8000", "--bind", "127.0.0.1", "--directory", "/srv/site"]
"""


class SdkTemplateTest(DaemonTest):
    """client.templates: build (log callback, build args, .dockerignore, links kept as links),
    a failed build (BuildError), typed errors, logs, import_image of a hand-made OCI archive, delete."""
    pool = 0

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.client = moat.Client("http://127.0.0.1:%d" % cls.daemon.port, cls.c.key)

    def ctx(self, files, links=()):
        d = tempfile.mkdtemp(prefix="moat-sdk-tpl-")
        self.addCleanup(shutil.rmtree, d, True)
        for name, data in files.items():
            p = os.path.join(d, name)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "w") as f:
                f.write(data)
        for name, target in links:
            os.symlink(target, os.path.join(d, name))
        return d

    def forget(self, name):
        def rm():
            try:
                self.client.templates.delete(name)
            except moat.MoatError:
                pass
        self.addCleanup(rm)

    def test_build_serve_logs_delete(self):
        d = self.ctx({"Dockerfile": WEB_DOCKERFILE, "site/index.html": "<p>from the sdk</p>\n",
                      "site/private.pem": "secret\n", ".dockerignore": "**/*.pem\n"},
                     links=[("site/alias.html", "index.html")])
        self.forget("sdkweb")
        seen = []
        t = self.client.templates.build("sdkweb", path=d, build_args={"MSG": "hi from args"}, on_log=seen.append)
        self.assertIsInstance(t, moat.Template)
        self.assertEqual((t.name, t.state, t.source, t.usable, t.from_), ("sdkweb", "ready", "dockerfile", True, "base"))
        self.assertTrue(t.build_id.startswith("bd-"), t)
        self.assertEqual(t.config["start"][:3], ["python3", "-m", "http.server"])
        self.assertTrue(all(isinstance(x, moat.BuildLogLine) for x in seen))
        self.assertIn((4, "stdout", "sdk-build-output"), [(x.step, x.stream, x.text) for x in seen])
        self.assertEqual(seen[0].step, 1)

        with Sandbox.create("sdkweb", client=self.client) as sb:
            r = sb.exec(["curl", "-fsS", "http://127.0.0.1:8000/alias.html"])
            self.assertEqual(r.stdout, "<p>from the sdk</p>\n", r)
            r = sb.exec("cat /srv/site/msg.txt; ls /srv/site; readlink /srv/site/alias.html")
            self.assertEqual(r.stdout, "hi from args\nalias.html\nindex.html\nmsg.txt\nindex.html\n", r)

        with self.client.templates.logs("sdkweb", t.build_id) as logs:
            lines = list(logs)
        self.assertIn("sdk-build-output", [x.text for x in lines])
        self.assertEqual((logs.end.state, logs.end.error), ("ready", None))
        self.assertIn("sdkweb", [x.name for x in self.client.templates.list()])
        self.assertEqual(self.client.templates.get("sdkweb").build_id, t.build_id)
        base = [x for x in self.client.templates.list() if x.name == "base"][0]
        self.assertEqual((base.source, base.usable), ("builtin", True))

        # wait=False: 202 at once, then follow the log
        t2 = self.client.templates.build("sdkweb", path=d, build_args={"MSG": "second"}, wait=False)
        self.assertEqual(t2.state, "building")
        self.assertNotEqual(t2.build_id, t.build_id)
        with self.assertRaises(moat.ConflictError) as cm:  # one build of a name at a time
            self.client.templates.build("sdkweb", path=d, wait=False)
        self.assertEqual(cm.exception.code, "template_building")
        with self.client.templates.logs("sdkweb", t2.build_id, follow=True) as logs:
            for _ in logs:
                pass
        self.assertEqual(logs.end.state, "ready")

        self.client.templates.delete("sdkweb")
        with self.assertRaises(moat.NotFoundError):
            self.client.templates.get("sdkweb")
        with self.assertRaises(moat.NotFoundError):
            self.client.templates.logs("sdkweb", t.build_id)

    def test_failed_build_and_bad_context(self):
        d = self.ctx({"Dockerfile": "FROM base\nRUN echo doomed; exit 4\n"})
        self.forget("sdkfail")
        with self.assertRaises(moat.BuildError) as cm:
            self.client.templates.build("sdkfail", path=d)
        e = cm.exception
        self.assertEqual((e.code, e.template), ("build_failed", "sdkfail"))
        self.assertTrue(e.build_id.startswith("bd-"))
        self.assertIn("exited 4", e.error)
        self.assertIn("doomed", e.error)
        self.assertEqual(self.client.templates.get("sdkfail").state, "failed")

        d = self.ctx({"Dockerfile": "FROM base\nBOGUS\n"})
        with self.assertRaises(moat.InvalidRequestError) as cm:
            self.client.templates.build("sdkbad", path=d)
        self.assertIn("line 2", cm.exception.message)
        d = self.ctx({"Dockerfile": "FROM nowhere:1\n"})
        with self.assertRaises(moat.InvalidRequestError):
            self.client.templates.build("sdkbad", path=d)
        # a link out of the context is sent as a link, so moatd refuses it (it is never followed)
        outside = self.ctx({"secret": "host secret\n"})
        d = self.ctx({"Dockerfile": "FROM base\nCOPY leak /leak\n"}, links=[("leak", os.path.join(outside, "secret"))])
        with self.assertRaises(moat.InvalidRequestError):
            self.client.templates.build("sdkbad", path=d)
        d = self.ctx({"Dockerfile": "FROM base\n"})
        with self.assertRaises(moat.ConflictError) as cm:
            self.client.templates.build("base", path=d)
        self.assertEqual(cm.exception.code, "already_exists")
        with self.assertRaises(moat.SandboxError) as cm:
            self.client.templates.delete("base")
        self.assertEqual(cm.exception.status, 403)
        with self.assertRaises(moat.NotFoundError):
            self.client.templates.get("sdkbad")

    def test_import_image(self):
        self.forget("sdkoci")
        data = oci_archive.make({"opt/app/hello.txt": b"from the oci layer\n"}, env=["WHO=oci"], workdir="/opt/app")
        t = self.client.templates.import_image("sdkoci", io.BytesIO(data))
        self.assertEqual((t.name, t.source, t.state), ("sdkoci", "oci", "ready"))
        self.assertEqual(t.config["workdir"], "/opt/app")
        self.assertIn("WHO=oci", t.config["env"])
        with Sandbox.create("sdkoci", client=self.client) as sb:
            self.assertEqual(sb.files.read("/opt/app/hello.txt"), "from the oci layer\n")
        d = self.ctx({})
        path = os.path.join(d, "image.tar")
        with open(path, "wb") as f:
            f.write(data)
        self.forget("sdkoci2")
        self.assertEqual(self.client.templates.import_image("sdkoci2", path).source, "oci")
        with self.assertRaises(moat.InvalidRequestError):
            self.client.templates.import_image("sdkoci3", io.BytesIO(b"not an image" * 50))
        self.client.templates.delete("sdkoci")
        self.client.templates.delete("sdkoci2")
        self.assertNotIn("sdkoci", [x.name for x in self.client.templates.list()])


class SdkCodeTest(DaemonTest):
    """Code contexts in a code-interpreter sandbox."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        moatd.ensure_template("code-interpreter")
        cls.client = moat.Client("http://127.0.0.1:%d" % cls.daemon.port, cls.c.key)
        cls.sb = Sandbox.create("code-interpreter", client=cls.client)

    def test_run_code(self):
        ctx = self.sb.create_code_context()
        self.assertEqual(ctx.language, "python")
        ex = ctx.run_code("x = 21\nprint('side')\nx * 2")
        self.assertIsInstance(ex, moat.Execution)
        self.assertEqual((ex.text, ex.stdout, ex.error), ("42", "side\n", None))
        self.assertTrue(ex.results[0].is_main_result)
        ex = ctx.run_code("x + 1")
        self.assertEqual(ex.text, "22")
        ex = ctx.run_code("1/0")
        self.assertIsNotNone(ex.error)
        self.assertEqual(ex.error.name, "ZeroDivisionError")
        self.assertIn("ZeroDivisionError", ex.error.traceback)
        self.assertIsNone(ex.text)
        got = []
        ex = ctx.run_code("import sys\nfor i in range(3): print(i)\nprint('e', file=sys.stderr)\n'done'",
                          on_stdout=got.append)
        self.assertEqual("".join(got), "0\n1\n2\n")
        self.assertEqual((ex.stdout, ex.stderr, ex.text), ("0\n1\n2\n", "e\n", "'done'"))
        ex = ctx.run_code("import time\ntime.sleep(10)", timeout=0.5)
        self.assertTrue(ex.timed_out)
        self.assertEqual(ctx.run_code("x").text, "21")  # survived the interrupt
        ctx.restart()
        self.assertEqual(ctx.run_code("x").error.name, "NameError")
        self.assertIn(ctx.id, [c.id for c in self.sb.code_contexts()])
        ctx.delete()
        self.assertNotIn(ctx.id, [c.id for c in self.sb.code_contexts()])
        with self.assertRaises(moat.NotFoundError) as cm:
            ctx.run_code("1")
        self.assertEqual(cm.exception.code, "context_not_found")

    def test_other_languages_and_default_context(self):
        self.assertEqual(self.sb.run_code("y = 5").error, None)
        self.assertEqual(self.sb.run_code("y * 3").text, "15")
        node = self.sb.create_code_context("node")
        self.addCleanup(node.delete)
        self.assertEqual(node.run_code("let z = 4; z * 10").text, "40")
        sh = self.sb.create_code_context("bash")
        self.addCleanup(sh.delete)
        sh.run_code("cd /tmp && V=kept")
        ex = sh.run_code("echo $V $PWD; exit 3")
        self.assertEqual(ex.stdout, "kept /tmp\n")


class SdkTimeTravelTest(DaemonTest):
    """pause/resume, hibernate/wake, snapshot/rollback, fork and explore through the SDK. The calls
    that need checkpoints are skipped, with the reason, where /healthz says checkpoints.available
    is false (no working CRIU on the host)."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.client = moat.Client("http://127.0.0.1:%d" % cls.daemon.port, cls.c.key)
        cls.health = cls.client.health()

    def make(self, **kw):
        sb = Sandbox.create(client=self.client, **kw)
        self.addCleanup(self._delete_quietly, self.c, sb.id)
        return sb

    def need_checkpoints(self):
        cp = self.health.get("checkpoints")
        if not isinstance(cp, dict) or not cp.get("available"):
            self.skipTest("this host cannot checkpoint (/healthz checkpoints: %r)" % (cp,))

    def track(self, res):
        for o in res.outcomes:
            if o.sandbox_id:
                self.addCleanup(self._delete_quietly, self.c, o.sandbox_id)

    def test_pause_resume(self):
        sb = self.make()
        p = sb.exec("while true; do date +%s%N >> /tmp/ticks; sleep 0.05; done", background=True)
        sb.pause()
        self.assertEqual(sb.state, "paused")
        self.assertEqual(sb.refresh().state, "paused")
        with self.assertRaises(moat.ConflictError) as cm:
            sb.exec("true")
        self.assertEqual((cm.exception.status, cm.exception.code), (409, "sandbox_paused"))
        sb.pause()  # pausing a paused sandbox is a no-op
        self.assertEqual(sb.state, "paused")
        sb.resume()
        self.assertEqual(sb.state, "running")
        self.assertTrue(p.info().running)
        self.assertEqual(sb.exec("echo back").stdout, "back\n")

    def test_idle_hibernation_setting(self):
        sb = self.make(persistent=True, hibernate_after_seconds=3600)
        self.assertEqual(sb.info.raw.get("idle"), {"hibernate_after_seconds": 3600})

    def test_hibernate_wake(self):
        self.need_checkpoints()
        sb = self.make()
        sb.files.write("/root/keep", "kept")
        sb.exec("sleep 600", background=True, tag="survivor")
        sb.hibernate()
        self.assertEqual(sb.state, "hibernated")
        sb.wake()
        self.assertEqual(sb.refresh().state, "running")
        self.assertEqual(sb.files.read("/root/keep"), "kept")
        self.assertTrue(sb.process("survivor").info().running)

    def test_snapshot_rollback_from_snapshot(self):
        self.need_checkpoints()
        sb = self.make()
        sb.files.write("/root/f", "one")
        snap = sb.snapshot(metadata={"step": "1"})
        self.addCleanup(self._delete_snapshot_quietly, sb, snap)
        self.assertIsInstance(snap, moat.Snapshot)
        self.assertEqual((snap.sandbox_id, snap.metadata), (sb.id, {"step": "1"}))
        self.assertIn(snap.id, [x.id for x in sb.snapshots()])
        sb.files.write("/root/f", "two")
        sb.rollback(snap)
        self.assertEqual(sb.files.read("/root/f"), "one")
        twin = self.make(from_snapshot=snap)
        self.assertEqual(twin.info.from_snapshot, snap.id)
        self.assertEqual(twin.files.read("/root/f"), "one")
        sb.delete_snapshot(snap)
        self.assertNotIn(snap.id, [x.id for x in sb.snapshots()])
        with self.assertRaises(moat.NotFoundError):
            sb.rollback(snap)

    @staticmethod
    def _delete_snapshot_quietly(sb, snap):
        try:
            sb.delete_snapshot(snap)
        except moat.MoatError:
            pass

    def test_fork(self):
        self.need_checkpoints()
        sb = self.make()
        sb.files.write("/root/f", "parent")
        kids = sb.fork(2)
        for k in kids:
            self.addCleanup(self._delete_quietly, self.c, k.id)
        self.assertEqual(len(kids), 2)
        self.assertEqual(len({k.id for k in kids} | {sb.id}), 3)
        for k in kids:
            self.assertEqual(k.info.forked_from, sb.id)
            self.assertEqual(k.files.read("/root/f"), "parent")
            k.files.write("/root/f", k.id)
        self.assertEqual(sb.files.read("/root/f"), "parent")

    def test_explore(self):
        self.need_checkpoints()
        sb = self.make()
        res = sb.explore(["exit 1", "echo win > /root/r; exit 0"])
        self.track(res)
        # first_success kills the losers as soon as one branch passes: a loser still running then
        # (a slow host) reports no exit code, only that it was stopped
        self.assertIn(res.outcomes[0].exit_code, (1, None))
        if res.outcomes[0].exit_code is None:
            self.assertTrue(res.outcomes[0].error)
        self.assertFalse(res.outcomes[0].alive)
        self.assertEqual(res.outcomes[1].exit_code, 0)
        self.assertIsNotNone(res.winner)
        self.assertEqual(res.winner.id, res.outcomes[1].sandbox_id)
        self.assertEqual(res.winner.files.read("/root/r"), "win\n")
        self.assertFalse(sb.files.exists("/root/r"))
        # score_fn: the SDK scores each branch and keeps the best through moatd's choose step
        scored = sb.explore(["echo 1", "echo 333", "echo 22"], score_fn=lambda o: len(o.stdout_tail))
        self.track(scored)
        self.assertEqual([o.score for o in scored.outcomes], [2.0, 4.0, 3.0])
        self.assertEqual(scored.winner.id, scored.outcomes[1].sandbox_id)
        self.assertEqual(scored.winner.exec("true").exit_code, 0)
        alive = {s.id for s in Sandbox.list(client=self.client)}
        self.assertNotIn(scored.outcomes[0].sandbox_id, alive)
        self.assertNotIn(scored.outcomes[2].sandbox_id, alive)
        # keep="best" without score_fn: the caller decides
        manual = sb.explore(["echo a", "echo b"], keep="best")
        self.track(manual)
        self.assertIsNone(manual.winner)
        self.assertTrue(manual.explore_id)
        kept = manual.keep(manual.outcomes[0])
        self.assertEqual(kept.id, manual.outcomes[0].sandbox_id)
        with self.assertRaises(moat.NotFoundError):
            manual.keep(manual.outcomes[1])


class DaemonGoneTest(DaemonTest):
    """moatd itself dies (SIGKILL) in the middle of a stream and of a long exec: both raise
    moat.ConnectionError at once instead of hanging."""
    pool = 1

    def test_moatd_killed_mid_stream(self):
        c = moat.Client("http://127.0.0.1:%d" % self.daemon.port, self.c.key)
        sb = Sandbox.create(client=c)
        w = sb.files.watch("/tmp")
        got = []
        threading.Timer(1.5, self.daemon.kill9).start()
        t0 = time.monotonic()
        with self.assertRaises(moat.ConnectionError):
            sb.exec_stream("echo first; sleep 60", on_stdout=got.append)
        self.assertLess(time.monotonic() - t0, 10)
        self.assertEqual(got, ["first\n"])
        with self.assertRaises(moat.ConnectionError):
            w.next(timeout=10)
        with self.assertRaises(moat.ConnectionError):
            sb.exec("true")


class PipInstallTest(DaemonTest):
    """pip install ./sdk/python into fresh venvs with no package index: the in-tree build backend needs
    nothing from one. Once with this interpreter, once with the system's python3 when it differs."""
    pool = 1

    def test_pip_install_into_venv(self):
        pythons = [sys.executable]
        if os.path.exists("/usr/bin/python3") and os.path.realpath("/usr/bin/python3") != os.path.realpath(sys.executable):
            pythons.append("/usr/bin/python3")
        for n, python in enumerate(pythons):
            with self.subTest(python=python):
                r = subprocess.run([python, "-c", "import venv, ensurepip"], stderr=subprocess.PIPE)
                if r.returncode != 0:
                    if n == 0:
                        self.skipTest("%s has no venv/ensurepip (Debian: apt-get install python3-venv)" % python)
                    continue
                self.install_and_use(python, editable=(n == 1))

    def install_and_use(self, python, editable):
        tmp = tempfile.mkdtemp(prefix="moat-sdk-venv-")
        self.addCleanup(shutil.rmtree, tmp, True)
        src = os.path.join(tmp, "src")
        shutil.copytree(os.path.join(REPO, "sdk", "python"), src, ignore=shutil.ignore_patterns("__pycache__"))
        venv = os.path.join(tmp, "venv")
        env = dict(os.environ, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
        env.pop("PYTHONPATH", None)
        subprocess.run([python, "-m", "venv", venv], check=True, timeout=120)
        py = os.path.join(venv, "bin", "python")
        argv = [py, "-m", "pip", "install", "--no-index"] + (["-e"] if editable else []) + [src]
        r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, timeout=300, cwd=tmp)
        self.assertEqual(r.returncode, 0, r.stdout.decode(errors="replace"))
        where = src if editable else venv
        check = ("import moat, os, sys, importlib.metadata as md\n"
                 "assert os.path.realpath(moat.__file__).startswith(os.path.realpath(%r)), moat.__file__\n"
                 "assert os.path.exists(os.path.join(os.path.dirname(moat.__file__), 'py.typed'))\n"
                 "assert md.version('moat') == moat.__version__, (md.version('moat'), moat.__version__)\n"
                 "with moat.Sandbox.create() as sb:\n"
                 "    print(sb.exec('echo installed').stdout, end='')\n" % where)
        env.update(MOAT_API_URL="http://127.0.0.1:%d" % self.daemon.port, MOAT_API_KEY=self.c.key)
        r = subprocess.run([py, "-c", check], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                           timeout=120, cwd=tmp)
        self.assertEqual((r.returncode, r.stdout.decode(errors="replace")), (0, "installed\n"))
        self.assertEqual(sorted(os.listdir(src)), ["README.md", "_build", "moat", "pyproject.toml"],
                         "the build left files in the source tree")


if __name__ == "__main__":
    unittest.main()

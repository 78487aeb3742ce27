# kernel.py -- moat's Python code-context kernel: runs cells sent as JSON lines, answers in framed JSON lines
#
# Protocol (see src/control/contexts.c): one request per line on stdin, {"id": ID, "code": CODE}.
# Every answer is one line "\x1e" + JSON + "\n" on the real stdout:
#   {"id","type":"stdout"|"stderr","text"}
#   {"id","type":"result","data":{"text/plain","text/html","application/json","image/png"},"is_main_result"}
#   {"id","type":"error","name","value","traceback":[...]}
#   {"id","type":"end","execution_count":N}     (also written, framed, on the real stderr)
# The user's sys.stdout/sys.stderr become message writers, and fds 1 and 2 become pipes drained
# into messages, so neither prints nor subprocesses can corrupt the framing. SIGINT raises
# KeyboardInterrupt inside a running cell only; between cells it is ignored.
# Runs on python3-minimal (no json module there): a small JSON codec stands in.
import ast
import os
import signal
import sys
import threading
import traceback

try:
    import json as _json
except ImportError:
    _json = None

_ESC = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f"}


def _enc(v):
    if v is None:
        return "null"
    if v is True:
        return "true"
    if v is False:
        return "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v) if v == v and v not in (float("inf"), float("-inf")) else "null"
    if isinstance(v, str):
        out = []
        for c in v:
            if c in _ESC:
                out.append(_ESC[c])
            elif ord(c) < 0x20:
                out.append("\\u%04x" % ord(c))
            else:
                out.append(c)
        return '"' + "".join(out) + '"'
    if isinstance(v, dict):
        return "{" + ",".join(_enc(str(k)) + ":" + _enc(x) for k, x in v.items()) + "}"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_enc(x) for x in v) + "]"
    return _enc(str(v))


def _dec(s):
    """Decodes one JSON value (objects, arrays, strings, numbers, literals)."""
    pos = [0]

    def ws():
        while pos[0] < len(s) and s[pos[0]] in " \t\r\n":
            pos[0] += 1

    def val():
        ws()
        c = s[pos[0]]
        if c == "{":
            pos[0] += 1
            d = {}
            ws()
            if s[pos[0]] == "}":
                pos[0] += 1
                return d
            while True:
                ws()
                k = val()
                ws()
                if s[pos[0]] != ":":
                    raise ValueError("expected ':'")
                pos[0] += 1
                d[k] = val()
                ws()
                c = s[pos[0]]
                pos[0] += 1
                if c == "}":
                    return d
                if c != ",":
                    raise ValueError("expected ','")
        if c == "[":
            pos[0] += 1
            a = []
            ws()
            if s[pos[0]] == "]":
                pos[0] += 1
                return a
            while True:
                a.append(val())
                ws()
                c = s[pos[0]]
                pos[0] += 1
                if c == "]":
                    return a
                if c != ",":
                    raise ValueError("expected ','")
        if c == '"':
            pos[0] += 1
            out = []
            while True:
                c = s[pos[0]]
                pos[0] += 1
                if c == '"':
                    return "".join(out)
                if c != "\\":
                    out.append(c)
                    continue
                e = s[pos[0]]
                pos[0] += 1
                if e == "u":
                    cp = int(s[pos[0]:pos[0] + 4], 16)
                    pos[0] += 4
                    if 0xD800 <= cp < 0xDC00 and s[pos[0]:pos[0] + 2] == "\\u":
                        lo = int(s[pos[0] + 2:pos[0] + 6], 16)
                        if 0xDC00 <= lo < 0xE000:
                            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00)
                            pos[0] += 6
                    out.append(chr(cp))
                else:
                    out.append({"n": "\n", "r": "\r", "t": "\t", "b": "\b", "f": "\f"}.get(e, e))
        for lit, v in (("true", True), ("false", False), ("null", None)):
            if s.startswith(lit, pos[0]):
                pos[0] += len(lit)
                return v
        start = pos[0]
        while pos[0] < len(s) and s[pos[0]] in "+-0123456789.eE":
            pos[0] += 1
        num = s[start:pos[0]]
        if not num:
            raise ValueError("unexpected %r" % c)
        return float(num) if any(ch in num for ch in ".eE") else int(num)

    return val()


def dumps(v):
    if _json:
        return _json.dumps(v, ensure_ascii=False)
    return _enc(v)


def loads(s):
    if _json:
        return _json.loads(s)
    return _dec(s)


def _shell(cmd, capture=False):
    """`!cmd` in a cell (as IPython): runs cmd with /bin/sh, its output on fds 1 and 2; with
    `x = !cmd`, returns its stdout as a list of lines. The exit status goes to _exit_code."""
    import subprocess
    sys.stdout.flush()
    if capture:
        p = subprocess.run(cmd, shell=True, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
        rc, out = p.returncode, p.stdout.decode("utf-8", "replace").splitlines()
    else:
        rc, out = subprocess.call(cmd, shell=True, stdin=subprocess.DEVNULL), None
    for ns in _USER_NS:
        ns["_exit_code"] = rc
    return out


_ASSIGN_SH = None
_USER_NS = []


def transform_cell(code):
    """IPython's cell transforms that E2B's users rely on: leading blank lines dropped, the first
    line's indentation removed from every line (leading_indent), and `!cmd` / `x = !cmd` shell
    escapes outside multi-line strings. Anything else is Python as is."""
    global _ASSIGN_SH
    import re
    if _ASSIGN_SH is None:
        _ASSIGN_SH = re.compile(r"^(\s*)([A-Za-z_][\w.]*(?:\s*,\s*[A-Za-z_][\w.]*)*)\s*=\s*!(.*)$")
    lines = code.splitlines(True)
    while lines and not lines[0].strip():
        lines.pop(0)
    if lines:
        first = lines[0]
        indent = first[:len(first) - len(first.lstrip(" \t"))]
        if indent:
            lines = [ln[len(indent):] if ln.startswith(indent) else ln for ln in lines]
    out, quote = [], None
    for ln in lines:
        if quote is None:
            body = ln.rstrip("\r\n")
            eol = ln[len(body):]
            st = body.lstrip(" \t")
            ind = body[:len(body) - len(st)]
            m = _ASSIGN_SH.match(body)
            if st.startswith("!") and not st.startswith("!="):
                ln = "%s_moat_shell(%r)%s" % (ind, st[1:], eol)
            elif m:
                ln = "%s%s = _moat_shell(%r, capture=True)%s" % (m.group(1), m.group(2), m.group(3), eol)
        for q in ('"""', "'''"):
            n = ln.count(q)
            if quote in (None, q) and n % 2 == 1:
                quote = q if quote is None else None
        out.append(ln)
    return "".join(out)


class _AfterImport:
    """A meta path finder that runs patch(module) once module `name` is imported (by whichever finder
    finds it), so that a library is adapted without importing it before the user does."""

    def __init__(self, name, patch):
        self.name, self.patch = name, patch

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        for f in sys.meta_path:
            if f is self or not hasattr(f, "find_spec"):
                continue
            spec = f.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                break
        else:
            return None
        loader, patch = spec.loader, self.patch

        class Loader:
            def create_module(self, s):
                return loader.create_module(s)

            def exec_module(self, module):
                loader.exec_module(module)
                patch(module)

        spec.loader = Loader()
        return spec


class Kernel:
    def __init__(self):
        # Private copies of the real channels; fds 0, 1 and 2 are then replaced.
        self.proto_in = os.fdopen(os.dup(0), "rb", buffering=0)
        self.proto_out = os.dup(1)
        self.proto_err = os.dup(2)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        self.lock = threading.Lock()
        self.in_emit = False
        self.pending_int = False
        self.running = False
        self.cur_id = None
        self.count = 0
        self.ns = {"__name__": "__main__", "__builtins__": __builtins__, "_moat_shell": _shell,
                   "display": self.display}
        _USER_NS.append(self.ns)
        sys.meta_path.insert(0, _AfterImport("PIL.Image", self.adapt_pil))
        self.drained = {}
        self.pipes = {}
        for fd, kind in ((1, "stdout"), (2, "stderr")):
            r, w = os.pipe()
            os.dup2(w, fd)
            os.close(w)
            self.drained[kind] = threading.Event()
            t = threading.Thread(target=self.drain, args=(r, kind), daemon=True)
            t.start()
        sys.stdout = Writer(self, "stdout")
        sys.stderr = Writer(self, "stderr")
        sys.stdin = open(os.devnull)
        signal.signal(signal.SIGINT, self.on_sigint)

    def on_sigint(self, signum, frame):
        if not self.running:
            return
        if self.in_emit:
            self.pending_int = True
            return
        raise KeyboardInterrupt()

    def send(self, msg, fd=None):
        line = ("\x1e" + dumps(msg) + "\n").encode("utf-8", "replace")
        with self.lock:
            self.in_emit = True
            try:
                view = memoryview(line)
                while view:
                    n = os.write(self.proto_out if fd is None else fd, view)
                    view = view[n:]
            finally:
                self.in_emit = False
        if self.pending_int and self.running and threading.current_thread() is threading.main_thread():
            self.pending_int = False
            raise KeyboardInterrupt()

    def out(self, kind, text):
        if text:
            self.send({"id": self.cur_id, "type": kind, "text": text})

    MARK = b"\x00moat-drain\x00"

    def drain(self, rfd, kind):
        """Forwards what subprocesses write on fd 1/2 as messages; MARK says 'caught up'."""
        buf = b""
        while True:
            data = os.read(rfd, 65536)
            if not data:
                return
            buf += data
            while True:
                i = buf.find(self.MARK)
                if i < 0:
                    break
                if i:
                    self.out(kind, buf[:i].decode("utf-8", "replace"))
                buf = buf[i + len(self.MARK):]
                self.drained[kind].set()
            # Keep a possible partial MARK and an incomplete UTF-8 sequence for the next read.
            keep = 0
            for k in range(1, len(self.MARK)):
                if buf.endswith(self.MARK[:k]):
                    keep = k
            head = buf[:len(buf) - keep] if keep else buf
            cut = len(head)
            for back in range(1, min(4, len(head)) + 1):
                b = head[len(head) - back]
                if b & 0xC0 == 0x80:
                    continue
                if b >= 0xC0 and (2 if b < 0xE0 else 3 if b < 0xF0 else 4) > back:
                    cut = len(head) - back
                break
            if cut:
                self.out(kind, head[:cut].decode("utf-8", "replace"))
            buf = buf[cut:]

    def sync_fds(self):
        """Waits (briefly) until what was written on fds 1 and 2 so far has been forwarded."""
        for fd, kind in ((1, "stdout"), (2, "stderr")):
            self.drained[kind].clear()
            try:
                os.write(fd, self.MARK)
            except OSError:
                continue
        for kind in ("stdout", "stderr"):
            self.drained[kind].wait(2.0)

    def result_data(self, value):
        data = {"text/plain": repr(value)}
        for meth, mime in (("_repr_html_", "text/html"), ("_repr_json_", "application/json"),
                           ("_repr_png_", "image/png")):
            f = getattr(value, meth, None)
            if f is None or not callable(f):
                continue
            try:
                v = f()
            except Exception:
                continue
            if v is None:
                continue
            if isinstance(v, tuple):
                v = v[0]
            if mime == "image/png" and isinstance(v, (bytes, bytearray)):
                import base64
                v = base64.b64encode(bytes(v)).decode("ascii")
            data[mime] = v
        return data

    def display(self, *objs, **kwargs):
        """IPython's display(): each object's representations (text, HTML, JSON, PNG) as a result of
        the running cell, beside its main one."""
        for obj in objs:
            self.send({"id": self.cur_id, "type": "result", "is_main_result": False, "data": self.result_data(obj)})

    def adapt_pil(self, module):
        """PIL as in E2B's code interpreter (and Jupyter): Image.show() displays the image instead of
        starting a viewer, and Image.save() to a path displays it too."""
        image = getattr(module, "Image", None)
        if image is None:
            return
        kernel, save = self, image.save

        def show(img, *args, **kwargs):
            kernel.display(img)

        def save_and_display(img, fp, format=None, **params):
            if isinstance(fp, (str, os.PathLike)):
                kernel.display(img)
            return save(img, fp, format, **params)

        image.show = show
        image.save = save_and_display

    def figures(self):
        plt = sys.modules.get("matplotlib.pyplot")
        if plt is None:
            return
        try:
            import base64
            import io
            for num in plt.get_fignums():
                fig = plt.figure(num)
                buf = io.BytesIO()
                fig.savefig(buf, format="png", bbox_inches="tight")
                self.send({"id": self.cur_id, "type": "result", "is_main_result": False,
                           "data": {"text/plain": repr(fig),
                                    "image/png": base64.b64encode(buf.getvalue()).decode("ascii")}})
        finally:
            plt.close("all")

    def error(self, etype, value, tb):
        # Drop the kernel's own frames (its run loop above the cell, its SIGINT handler below).
        if issubclass(etype, SyntaxError):
            lines = traceback.format_exception_only(etype, value)
        else:
            te = traceback.TracebackException(etype, value, tb)
            te.stack = traceback.StackSummary.from_list([f for f in te.stack if f.filename != __file__])
            lines = list(te.format())
        self.send({"id": self.cur_id, "type": "error", "name": etype.__name__, "value": str(value),
                   "traceback": "".join(lines).rstrip("\n").split("\n")})

    def run(self, code):
        self.count += 1
        fname = "<cell-%d>" % self.count
        import linecache
        linecache.cache[fname] = (len(code), None, code.splitlines(True), fname)
        self.running = True
        try:
            try:
                code = transform_cell(code)
                linecache.cache[fname] = (len(code), None, code.splitlines(True), fname)
                tree = ast.parse(code, fname, "exec")
                last = None
                if tree.body and isinstance(tree.body[-1], ast.Expr):
                    last = ast.Expression(tree.body.pop().value)
                exec(compile(tree, fname, "exec"), self.ns)
                if last is not None:
                    value = eval(compile(last, fname, "eval"), self.ns)
                    if value is not None:
                        self.ns["_"] = value
                        self.send({"id": self.cur_id, "type": "result", "is_main_result": True,
                                   "data": self.result_data(value)})
                self.figures()
            except BaseException:
                etype, value, tb = sys.exc_info()
                if etype is SystemExit:
                    raise
                try:
                    self.figures()
                except BaseException:
                    pass
                self.error(etype, value, tb)
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            except BaseException:
                pass
        finally:
            self.running = False
            self.pending_int = False

    def serve(self):
        while True:
            try:
                line = self.proto_in.readline()
            except KeyboardInterrupt:
                continue
            if not line:
                return
            line = line.strip()
            if not line:
                continue
            try:
                req = loads(line.decode("utf-8", "replace"))
                rid, code = req["id"], req["code"]
            except Exception as e:
                self.send({"id": None, "type": "error", "name": "ProtocolError", "value": str(e), "traceback": []})
                continue
            self.cur_id = rid
            # Optional "env": {name: value} for this cell only (E2B's runCode envs).
            env = req.get("env") if isinstance(req.get("env"), dict) else {}
            saved = dict((k, os.environ.get(k)) for k in env)
            try:
                os.environ.update(dict((str(k), str(v)) for k, v in env.items()))
                self.run(code)
            except SystemExit as e:
                self.send({"id": rid, "type": "error", "name": "SystemExit", "value": str(e.code), "traceback": []})
            except KeyboardInterrupt:
                # Arrived after the cell ended, while its answers were being sent.
                pass
            finally:
                for k, old in saved.items():
                    if old is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = old
            while True:
                try:
                    self.sync_fds()
                    end = {"id": rid, "type": "end", "execution_count": self.count}
                    self.send(end, self.proto_err)
                    self.send(end)
                    break
                except KeyboardInterrupt:
                    continue
            self.cur_id = None


class Writer:
    """sys.stdout / sys.stderr of user code: each write becomes a message."""

    def __init__(self, k, kind):
        self.k, self.kind = k, kind
        self.encoding = "utf-8"
        self.errors = "replace"

    def write(self, s):
        if not isinstance(s, str):
            raise TypeError("write() argument must be str, not %s" % type(s).__name__)
        self.k.out(self.kind, s)
        return len(s)

    def writelines(self, lines):
        for s in lines:
            self.write(s)

    def flush(self):
        pass

    def isatty(self):
        return False

    def fileno(self):
        return 1 if self.kind == "stdout" else 2

    def writable(self):
        return True

    def readable(self):
        return False


if __name__ == "__main__":
    os.environ.setdefault("MPLBACKEND", "Agg")
    if len(sys.argv) > 1:
        try:
            os.chdir(sys.argv[1])
        except OSError as e:
            sys.stderr.write("kernel: cwd %s: %s\n" % (sys.argv[1], e))
            sys.exit(2)
    sys.argv = [""]
    Kernel().serve()

"""sandbox.py -- Sandbox: one moat sandbox and everything a program does with it."""

import base64
import json
import os
import time
from typing import Any, Callable, Dict, Iterator, List, Literal, Mapping, Optional, Sequence, Union, overload

from . import _check, errors
from . import _ws
from . import database as _database
from ._http import SSEStream, Transport, output_bytes
from .sandbox_ops import SandboxOps
from .client import TIMEOUT_MARGIN, _UNSET, Client, resolve
from .models import (EntryInfo, Execution, ExecutionError, ExecResult, ExploreOutcome, FilesystemEvent, ProcessInfo,
                     Result, SandboxInfo, Snapshot, WriteInfo)

Command = Union[str, Sequence[str]]
OutputCallback = Callable[[Any], Any]

_SIGNALS = ("TERM", "KILL", "INT", "HUP", "QUIT", "USR1", "USR2", "STOP", "CONT")


def _exec_body(cmd: Command, env: Any, cwd: Any, timeout: Any, stdin: Any, user: Any) -> Dict[str, Any]:
    body: Dict[str, Any] = dict(_check.command(cmd))
    e = _check.str_map("env", env, env=True)
    if e is not None:
        body["env"] = e
    if _check.string("cwd", cwd, optional=True) is not None:
        body["cwd"] = cwd
    if _check.string("user", user, optional=True) is not None:
        body["user"] = user
    ms = _check.timeout_ms("timeout", timeout)
    if ms is not None:
        body["timeout_ms"] = ms
    if stdin is not None:
        if isinstance(stdin, str):
            body["stdin"] = stdin
        elif isinstance(stdin, (bytes, bytearray, memoryview)):
            body["stdin_b64"] = base64.b64encode(bytes(stdin)).decode()
        else:
            raise TypeError("stdin must be str or bytes, got %s" % type(stdin).__name__)
    return body


def _http_timeout(ms: Optional[int]) -> Optional[float]:
    """The HTTP read timeout of a call that runs a command for at most ms milliseconds."""
    return None if ms is None else ms / 1000.0 + TIMEOUT_MARGIN


def _emit(cb: Optional[OutputCallback], data: Any, binary: bool) -> None:
    if cb is None:
        return
    b = output_bytes(data)
    if binary:
        cb(b)
    elif isinstance(data, dict) and data.get("encoding") != "base64":
        cb(data.get("data", ""))
    else:
        cb(b.decode("utf-8", "replace"))


def _pump_output(s: SSEStream, on_stdout: Optional[OutputCallback], on_stderr: Optional[OutputCallback],
                 binary: bool, what: str, on_event: Optional[Callable[[str, Any], None]] = None) -> Dict[str, Any]:
    """Reads an exec-shaped stream to its `exit` event, handing output to the callbacks; returns
    the exit event's data. An `error` event or a stream that ends without `exit` raises."""
    try:
        while True:
            ev = s.next()
            if ev is None:
                raise s.lost("its exit event")
            if ev.name == "stdout":
                _emit(on_stdout, ev.data, binary)
            elif ev.name == "stderr":
                _emit(on_stderr, ev.data, binary)
            elif ev.name == "exit":
                return ev.data if isinstance(ev.data, dict) else {}
            elif ev.name == "error":
                raise errors.error_from_event(ev.data, what)
            elif on_event is not None:
                on_event(ev.name, ev.data)
    finally:
        s.close()


class ProcessStdin:
    """The standard input of a background process."""

    def __init__(self, proc: "Process"):
        self._p = proc

    def write(self, data: Union[str, bytes]) -> None:
        """Sends data (str as UTF-8, or bytes) to the process's stdin.
        Raises ConflictError (stdin_closed) once stdin is closed or the process has ended."""
        if isinstance(data, str):
            body: Dict[str, Any] = {"data": data}
        elif isinstance(data, (bytes, bytearray, memoryview)):
            body = {"data_b64": base64.b64encode(bytes(data)).decode()}
        else:
            raise TypeError("data must be str or bytes, got %s" % type(data).__name__)
        self._p._post("stdin", body)

    def close(self) -> None:
        """Closes the process's stdin (it reads EOF)."""
        self._p._post("stdin", {"close": True})


class Process:
    """A background process started by ``Sandbox.exec(..., background=True)``."""

    def __init__(self, sandbox: "Sandbox", pid: int, tag: Optional[str] = None):
        self.sandbox = sandbox
        self.pid = pid
        self.tag = tag
        self.stdin = ProcessStdin(self)

    def __repr__(self) -> str:
        return "Process(pid=%d, tag=%r)" % (self.pid, self.tag)

    @property
    def _ref(self) -> str:
        # the pid when known (a tag may be reused by a later process once this one has ended)
        return str(self.pid) if self.pid else str(self.tag)

    def _post(self, action: str, body: Dict[str, Any]) -> None:
        self.sandbox._t.request("POST", "%s/processes/%s/%s" % (self.sandbox._path, self._ref, action), json_body=body)

    def resize(self, cols: int, rows: int) -> None:
        """Resizes the terminal of a process started with a pty."""
        _check.integer("cols", cols, 1, 1000, optional=False)
        _check.integer("rows", rows, 1, 1000, optional=False)
        self._post("resize", {"cols": cols, "rows": rows})

    def signal(self, sig: str = "TERM") -> None:
        """Sends a signal (TERM, KILL, INT, HUP, QUIT, USR1, USR2, STOP, CONT; a SIG prefix is
        accepted) to the process's group."""
        _check.string("sig", sig)
        name = sig[3:] if sig.upper().startswith("SIG") else sig
        if name.upper() not in _SIGNALS:
            raise ValueError("sig must be one of %s, got %r" % (", ".join(_SIGNALS), sig))
        self._post("signal", {"signal": name.upper()})

    def kill(self) -> None:
        """SIGKILL to the process group."""
        self.signal("KILL")

    def info(self) -> ProcessInfo:
        """The process as moatd lists it now (NotFoundError once the guest has forgotten it)."""
        for p in self.sandbox.processes():
            if (p.pid == self.pid) if self.pid else (p.tag == self.tag and p.tag is not None):
                if not self.pid:
                    self.pid = p.pid
                return p
        raise errors.NotFoundError("process %s not found" % self._ref, code="process_not_found")

    def stream(self, on_stdout: Optional[OutputCallback] = None, on_stderr: Optional[OutputCallback] = None, *,
               replay: bool = True, binary: bool = False, timeout: Optional[float] = None) -> int:
        """Follows the process's output until it exits and returns its exit code (-1 when killed by a
        signal). With replay (default) the output it kept (up to 1 MiB per stream) comes first.
        Callbacks get str, or bytes with binary=True. timeout: seconds to wait at most (then
        moat.TimeoutError; the process keeps running). Closing the stream never kills the process."""
        _check.callback("on_stdout", on_stdout)
        _check.callback("on_stderr", on_stderr)
        _check.boolean("replay", replay, optional=False)
        _check.boolean("binary", binary, optional=False)
        ms = _check.timeout_ms("timeout", timeout)
        s = self.sandbox._t.stream("GET", "%s/processes/%s/stream" % (self.sandbox._path, self._ref),
                                   query={"replay": "true" if replay else "false"})
        if ms is not None:
            s.deadline = time.monotonic() + ms / 1000.0
        ex = _pump_output(s, on_stdout, on_stderr, binary, "process %s" % self._ref)
        return int(ex.get("exit_code", -1))

    def wait(self, timeout: Optional[float] = None) -> int:
        """Waits for the process to exit and returns its exit code (-1 when killed by a signal).
        timeout: seconds (moat.TimeoutError past it; the process keeps running)."""
        return self.stream(replay=False, timeout=timeout)


class WatchHandle:
    """An open ``files.watch``: iterate it for FilesystemEvent values; close() ends it (from any
    thread). A connection that drops raises moat.ConnectionError from the iteration."""

    def __init__(self, stream: SSEStream, path: str):
        self._s = stream
        self.path = path

    def __iter__(self) -> Iterator[FilesystemEvent]:
        while True:
            ev = self.next()
            if ev is None:
                return
            yield ev

    def next(self, timeout: Optional[float] = None) -> Optional[FilesystemEvent]:
        """The next event; None once closed. timeout: seconds, past which moat.TimeoutError is
        raised and the watch is closed."""
        if timeout is not None:
            self._s.deadline = time.monotonic() + timeout
        try:
            while True:
                ev = self._s.next()
                if ev is None:
                    if self._s.closed and not self._eof_unexpected():
                        return None
                    raise self._s.lost("close()")
                if ev.name == "error":
                    self._s.close()
                    raise errors.error_from_event(ev.data, "watch %s" % self.path)
                d = ev.data if isinstance(ev.data, dict) else {}
                return FilesystemEvent(event=d.get("event", ev.name), path=d.get("path", ""), path2=d.get("path2"))
        finally:
            self._s.deadline = None

    def _eof_unexpected(self) -> bool:
        return not getattr(self, "_closed_by_us", False)

    def close(self) -> None:
        self._closed_by_us = True
        self._s.close()

    def __enter__(self) -> "WatchHandle":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _volume_mount(v: Any) -> Dict[str, Any]:
    """{name, path, read_only} of a volumes= entry: (name, path[, read_only]) or a dict."""
    if isinstance(v, Mapping):
        name, path, ro = v.get("name"), v.get("path"), v.get("read_only", False)
    elif isinstance(v, (tuple, list)) and len(v) in (2, 3):
        name, path, ro = v[0], v[1], (v[2] if len(v) == 3 else False)
    else:
        raise TypeError("each volume must be (name, path[, read_only]) or a dict, got %r" % (v,))
    if hasattr(name, "name") and not isinstance(name, str):
        name = name.name  # a Volume
    _check.string("volume name", name)
    _check.string("volume path", path)
    _check.boolean("read_only", ro)
    return {"name": name, "path": path, "read_only": bool(ro)}


def _mode(mode: Any) -> Optional[str]:
    if mode is None:
        return None
    if isinstance(mode, bool):
        raise TypeError("mode must be an int (0o644) or an octal str ('0644'), got bool")
    if isinstance(mode, int):
        if not 0 <= mode <= 0o7777:
            raise ValueError("mode must be within 0..0o7777, got %o" % mode)
        return "%04o" % mode
    if isinstance(mode, str):
        if not mode or any(c not in "01234567" for c in mode) or int(mode, 8) > 0o7777:
            raise ValueError("mode must be octal digits such as '0644', got %r" % mode)
        return mode
    raise TypeError("mode must be an int (0o644) or an octal str ('0644'), got %s" % type(mode).__name__)


class Files:
    """The sandbox's file system (``sb.files``). Relative paths resolve against the user's home
    (``/root`` for root); every call takes ``user=`` (default root)."""

    def __init__(self, sandbox: "Sandbox"):
        self._sb = sandbox

    def _q(self, path: Any, user: Any, **extra: Any) -> Dict[str, Any]:
        _check.string("path", path)
        q = {"path": path, "user": _check.string("user", user, optional=True)}
        q.update(extra)
        return q

    def read_bytes(self, path: str, *, user: Optional[str] = None, timeout: Any = "default") -> bytes:
        """The file's bytes."""
        return self._sb._t.request("GET", self._sb._path + "/files", query=self._q(path, user), raw=True,
                                   timeout=timeout)[1]

    def read(self, path: str, *, user: Optional[str] = None, encoding: str = "utf-8",
             timeout: Any = "default") -> str:
        """The file's text (decoded with encoding, strictly: UnicodeDecodeError on bad bytes)."""
        _check.string("encoding", encoding)
        return self.read_bytes(path, user=user, timeout=timeout).decode(encoding)

    def write(self, path: str, data: Any, *, mode: Union[int, str, None] = None, user: Optional[str] = None,
              timeout: Any = "default") -> WriteInfo:
        """Writes data (str as UTF-8, bytes, or a binary file object read to its end) to path,
        creating parent directories. mode: 0o755 or "0755" (default: the replaced file's mode, or
        0644). The upload replaces the file atomically."""
        q = self._q(path, user, mode=_mode(mode))
        headers = {"Content-Type": "application/octet-stream"}
        if isinstance(data, str):
            body: Any = data.encode("utf-8")
        elif isinstance(data, (bytes, bytearray, memoryview)):
            body = bytes(data)
        elif hasattr(data, "read"):
            body = data
            try:
                size = os.fstat(data.fileno()).st_size - data.tell()
                headers["Content-Length"] = str(size)
            except (AttributeError, OSError, ValueError):
                pass  # http.client sends it chunked
        else:
            raise TypeError("data must be str, bytes or a binary file object, got %s" % type(data).__name__)
        r = self._sb._t.request("PUT", self._sb._path + "/files", query=q, body=body, headers=headers,
                                timeout=timeout)[1]
        return WriteInfo(path=r.get("path", path), size=int(r.get("size", 0)))

    def list(self, path: str = ".", *, depth: int = 1, user: Optional[str] = None) -> List[EntryInfo]:
        """The entries under directory path, down to depth levels (1: its direct children)."""
        _check.integer("depth", depth, lo=1, optional=False)
        r = self._sb._t.request("GET", self._sb._path + "/files/list", query=self._q(path, user, depth=depth))[1]
        return [EntryInfo.from_json(e) for e in r.get("entries", [])]

    def stat(self, path: str, *, user: Optional[str] = None) -> EntryInfo:
        """The entry at path (a symlink itself, not its target). NotFoundError if missing."""
        return EntryInfo.from_json(self._sb._t.request("GET", self._sb._path + "/files/stat",
                                                       query=self._q(path, user))[1])

    def exists(self, path: str, *, user: Optional[str] = None) -> bool:
        """True when something exists at path."""
        try:
            self.stat(path, user=user)
            return True
        except errors.NotFoundError:
            return False

    def remove(self, path: str, *, recursive: bool = False, user: Optional[str] = None) -> None:
        """Removes a file, or a directory (recursive=True for one that is not empty)."""
        _check.boolean("recursive", recursive, optional=False)
        self._sb._t.request("DELETE", self._sb._path + "/files",
                            query=self._q(path, user, recursive="true" if recursive else None))

    def mkdir(self, path: str, *, parents: bool = True, user: Optional[str] = None) -> EntryInfo:
        """Creates a directory (and its parents unless parents=False). ConflictError
        (already_exists) when something is already there."""
        _check.string("path", path)
        _check.boolean("parents", parents, optional=False)
        body: Dict[str, Any] = {"path": path, "parents": parents}
        if _check.string("user", user, optional=True):
            body["user"] = user
        return EntryInfo.from_json(self._sb._t.request("POST", self._sb._path + "/files/mkdir", json_body=body)[1])

    def move(self, src: str, dst: str, *, user: Optional[str] = None) -> EntryInfo:
        """Renames src to dst; returns the entry at dst."""
        _check.string("src", src)
        _check.string("dst", dst)
        body: Dict[str, Any] = {"from": src, "to": dst}
        if _check.string("user", user, optional=True):
            body["user"] = user
        return EntryInfo.from_json(self._sb._t.request("POST", self._sb._path + "/files/move", json_body=body)[1])

    def watch(self, path: str, *, recursive: bool = False, user: Optional[str] = None) -> WatchHandle:
        """Watches directory path for changes; returns once the watch is in place, so every change
        made after this call is reported. Iterate the handle; close it when done."""
        _check.boolean("recursive", recursive, optional=False)
        s = self._sb._t.stream("GET", self._sb._path + "/files/watch",
                               query=self._q(path, user, recursive="true" if recursive else "false"),
                               ready_comment="watching")
        return WatchHandle(s, path)


class CodeContext:
    """A persistent interpreter in the sandbox (``Sandbox.create_code_context``): variables,
    imports and the working directory survive from one ``run_code`` to the next."""

    def __init__(self, sandbox: "Sandbox", d: Dict[str, Any]):
        self.sandbox = sandbox
        self.id: str = d["id"]
        self.language: str = d.get("language", "python")
        self.cwd: Optional[str] = d.get("cwd")

    def __repr__(self) -> str:
        return "CodeContext(id=%r, language=%r)" % (self.id, self.language)

    @property
    def _path(self) -> str:
        return "%s/contexts/%s" % (self.sandbox._path, self.id)

    def run_code(self, code: str, *, timeout: Optional[float] = None,
                 on_stdout: Optional[Callable[[str], Any]] = None, on_stderr: Optional[Callable[[str], Any]] = None,
                 on_result: Optional[Callable[[Result], Any]] = None) -> Execution:
        """Runs code as one cell and returns its Execution (stdout, stderr, results, error: the
        cell's exception with its traceback, or None). timeout: seconds (moatd's default 60); a
        cell past it is interrupted (KeyboardInterrupt; variables survive). With callbacks the
        output streams to them as it comes (and is also collected in the Execution)."""
        _check.string("code", code, empty=True)
        ms = _check.timeout_ms("timeout", timeout)
        for n, cb in (("on_stdout", on_stdout), ("on_stderr", on_stderr), ("on_result", on_result)):
            _check.callback(n, cb)
        body: Dict[str, Any] = {"code": code}
        if ms is not None:
            body["timeout_ms"] = ms
        http_timeout = (ms if ms is not None else 60000) / 1000.0 + TIMEOUT_MARGIN
        if on_stdout is None and on_stderr is None and on_result is None:
            r = self.sandbox._t.request("POST", self._path + "/run", json_body=body, timeout=http_timeout)[1]
            err = r.get("error")
            return Execution(stdout=r.get("stdout") or "", stderr=r.get("stderr") or "",
                             results=[Result.from_json(x) for x in r.get("results") or []],
                             error=ExecutionError.from_json(err) if isinstance(err, dict) else None,
                             execution_count=r.get("execution_count"), timed_out=bool(r.get("timed_out")),
                             restarted=bool(r.get("restarted")), exit_code=r.get("exit_code"))
        body["stream"] = True
        s = self.sandbox._t.stream("POST", self._path + "/run", json_body=body)
        s.deadline = time.monotonic() + http_timeout
        out: List[str] = []
        errs: List[str] = []
        ex = Execution(stdout="", stderr="", results=[], error=None)
        try:
            while True:
                ev = s.next()
                if ev is None:
                    raise s.lost("its end event")
                d = ev.data if isinstance(ev.data, dict) else {}
                if ev.name in ("stdout", "stderr"):
                    text = d.get("text", "")
                    (out if ev.name == "stdout" else errs).append(text)
                    cb = on_stdout if ev.name == "stdout" else on_stderr
                    if cb is not None:
                        cb(text)
                elif ev.name == "result":
                    res = Result.from_json(d)
                    ex.results.append(res)
                    if on_result is not None:
                        on_result(res)
                elif ev.name == "error":
                    if "code" in d and "traceback" not in d:
                        raise errors.error_from_event(d, "run_code in context %s" % self.id)
                    ex.error = ExecutionError.from_json(d)
                elif ev.name == "end":
                    ex.execution_count = d.get("execution_count")
                    ex.timed_out = bool(d.get("timed_out"))
                    ex.restarted = bool(d.get("restarted"))
                    ex.exit_code = d.get("exit_code")
                    break
        finally:
            s.close()
        ex.stdout, ex.stderr = "".join(out), "".join(errs)
        return ex

    def restart(self) -> None:
        """Restarts the interpreter (its state is lost)."""
        self.sandbox._t.request("POST", self._path + "/restart", json_body={},
                                timeout=self.sandbox.client.lifecycle_timeout)

    def delete(self) -> None:
        """Stops the interpreter and forgets the context."""
        self.sandbox._t.request("DELETE", self._path)


class Pty:
    """An interactive terminal in the sandbox (``Sandbox.pty``): a process on a pseudo-terminal,
    driven over a WebSocket. The process is killed when the Pty is closed."""

    def __init__(self, ws: "_ws.WebSocket"):
        self._ws = ws
        self.exited = False

    def send(self, data: Union[str, bytes]) -> None:
        """Types data into the terminal (str as UTF-8); "\\r" is Enter, "\\x03" is Ctrl-C."""
        if isinstance(data, str):
            data = data.encode("utf-8")
        elif not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError("data must be str or bytes, got %s" % type(data).__name__)
        self._ws.send(_ws.BINARY, bytes(data))

    def resize(self, cols: int, rows: int) -> None:
        """Changes the terminal's size (each 1..1000)."""
        _check.integer("cols", cols, 1, 1000, optional=False)
        _check.integer("rows", rows, 1, 1000, optional=False)
        self._ws.send(_ws.TEXT, json.dumps({"type": "resize", "cols": cols, "rows": rows}).encode())

    def recv(self, timeout: Optional[float] = None) -> bytes:
        """The next chunk of terminal output; b"" once the process has exited (after its last
        output). timeout: seconds (moat.TimeoutError past it; nothing is lost)."""
        _check.number("timeout", timeout, lo=0)
        if self.exited:
            return b""
        while True:
            op, payload = self._ws.recv(timeout)
            if op == _ws.CLOSE:
                self.exited = True
                if self._ws.close_code not in (1000, 1005):
                    raise errors.ConnectionError("pty closed with code %s: %s" % (
                        self._ws.close_code, payload.decode("utf-8", "replace")), code="connection_error")
                return b""
            if op == _ws.TEXT:
                try:
                    msg = json.loads(payload)
                except ValueError:
                    return payload
                if isinstance(msg, dict) and msg.get("type") == "error":
                    raise errors.InvalidRequestError("pty: %s" % msg.get("message"), code="invalid_request")
                continue
            return payload

    def read_until(self, marker: Union[str, bytes], timeout: float = 30) -> bytes:
        """Reads output until marker appears; returns everything read (marker included).
        moat.TimeoutError past timeout; moat.ConnectionError if the process exits first."""
        m = marker.encode("utf-8") if isinstance(marker, str) else marker
        deadline = time.monotonic() + timeout
        out = b""
        while m not in out:
            chunk = self.recv(max(0.0, deadline - time.monotonic()))
            if chunk == b"" and self.exited:
                raise errors.ConnectionError("pty: the process exited before %r appeared (output: %r)"
                                             % (marker, out[-300:]), code="connection_error")
            out += chunk
        return out

    def read_all(self, timeout: float = 30) -> bytes:
        """Reads output until the process exits; returns all of it."""
        deadline = time.monotonic() + timeout
        out = b""
        while True:
            chunk = self.recv(max(0.0, deadline - time.monotonic()))
            if not chunk and self.exited:
                return out
            out += chunk

    def close(self) -> None:
        """Closes the terminal; moatd kills its process."""
        self._ws.close()

    def __enter__(self) -> "Pty":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class ExploreResult:
    """The outcome of ``Sandbox.explore``: each branch's outcome (in the order of the commands) and
    the winner, a Sandbox (None when no branch qualified).

    With keep="best" and no score_fn, every branch stays alive until ``expires_at`` (moatd kills
    the unkept ones then) and the caller decides with ``keep(outcome)``."""

    def __init__(self, parent: "Sandbox", winner: Optional["Sandbox"], outcomes: List[ExploreOutcome],
                 raw: Dict[str, Any]):
        self._parent = parent
        self.winner = winner
        self.outcomes = outcomes
        self.keep_mode: str = raw.get("keep") or "first_success"
        self.explore_id: Optional[str] = raw.get("explore_id")
        self.expires_at: Optional[str] = raw.get("expires_at")
        self.raw = raw

    def __repr__(self) -> str:
        return "ExploreResult(winner=%r, outcomes=%d)" % (self.winner.id if self.winner else None, len(self.outcomes))

    def keep(self, outcome: Union[ExploreOutcome, str]) -> "Sandbox":
        """keep="best": makes the branch of outcome (or a branch's sandbox id) an independent
        sandbox with the parent's lifetime, kills the other branches and returns the kept one
        (also as .winner). Only once: a second call raises NotFoundError."""
        sid = outcome.sandbox_id if isinstance(outcome, ExploreOutcome) else outcome
        _check.string("outcome", sid)
        if not self.explore_id:
            raise ValueError("keep() is for an explore with keep='best' (this one kept %r)" % self.keep_mode)
        r = self._parent._t.request("POST", self._parent._path + "/explore",
                                    json_body={"choose": {"explore_id": self.explore_id, "sandbox_id": sid}})[1]
        self.winner = Sandbox(r["sandbox"], self._parent.client)
        return self.winner


class SandboxList(List["Sandbox"]):
    """A page of Sandbox.list(): a list of sandboxes, with next (the cursor of the following page,
    None on the last) and total (every sandbox matching the filters)."""

    def __init__(self, items: Sequence["Sandbox"], next: Optional[str], total: int) -> None:
        super().__init__(items)
        self.next = next
        self.total = total


class Sandbox(SandboxOps):
    """One moat sandbox. Make one with ``Sandbox.create(...)`` or ``Sandbox.connect(id)``.

    As a context manager it kills the sandbox when the block ends, unless it is persistent::

        with Sandbox.create() as sb:
            print(sb.exec("echo hi").stdout)
    """

    def __init__(self, info: Union[Dict[str, Any], SandboxInfo], client: Client):
        if not isinstance(client, Client):
            raise TypeError("client must be a moat.Client, got %s" % type(client).__name__)
        self.info = info if isinstance(info, SandboxInfo) else SandboxInfo.from_json(info)
        self.id = self.info.id
        self.client = client
        self._t: Transport = client._t
        self._path = "/v1/sandboxes/" + self.id
        self.files = Files(self)
        self._contexts: Dict[str, CodeContext] = {}

    def __repr__(self) -> str:
        return "Sandbox(id=%r, template=%r, state=%r)" % (self.id, self.info.template, self.info.state)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sandbox) and other.id == self.id and other.client is self.client

    def __hash__(self) -> int:
        return hash(self.id)

    # ---- life cycle ----
    @classmethod
    def create(cls, template: str = "base", *, ttl_seconds: Optional[int] = None, persistent: Optional[bool] = None,
               metadata: Optional[Mapping[str, str]] = None, env: Optional[Mapping[str, str]] = None,
               cpu: Optional[float] = None, memory_mb: Optional[int] = None, pids: Optional[int] = None,
               disk_mb: Optional[int] = None, network: Optional[Mapping[str, Any]] = None,
               from_snapshot: Union[Snapshot, str, None] = None, hibernate_after_seconds: Optional[int] = None,
               volumes: Optional[Sequence[Any]] = None, databases: Optional[Sequence[Any]] = None,
               client: Optional[Client] = None,
               api_url: Optional[str] = None, api_key: Optional[str] = None,
               request_timeout: Any = _UNSET) -> "Sandbox":
        """Creates a sandbox from template (default "base"; "code-interpreter" has python3 with its
        data libraries and nodejs) and returns it running. ttl_seconds: lifetime (default 3600);
        persistent: never expires and is not killed by a with block; metadata: str->str labels
        to find it by; env: environment of every command; cpu (cores), memory_mb, pids, disk_mb:
        limits; network: egress policy (NotSupportedError where moatd lacks it); from_snapshot: a
        Snapshot (or its id) to start from, with its memory, processes and disk;
        hibernate_after_seconds (persistent sandboxes only): moatd hibernates the sandbox after
        that long without API calls and with its CPU idle. volumes: volumes to mount, each
        (name, path) or (name, path, read_only) or a dict {name, path, read_only} (at most 8).
        databases: databases whose connection URL goes into the environment, each a Database (or
        its id), a tuple (database, env) or a dict {id, env}; env defaults to DATABASE_URL (at
        most 8, no variable twice; NotFoundError for an id that is not the organisation's)."""
        _check.string("template", template)
        body: Dict[str, Any] = {"template": template}
        if _check.integer("ttl_seconds", ttl_seconds, 1, 2592000) is not None:
            body["ttl_seconds"] = ttl_seconds
        if _check.boolean("persistent", persistent) is not None:
            body["persistent"] = persistent
        for name, val, is_env in (("metadata", metadata, False), ("env", env, True)):
            m = _check.str_map(name, val, env=is_env)
            if m is not None:
                body[name] = m
        if _check.number("cpu", cpu, 0.05, 64) is not None:
            body["cpu"] = cpu
        for name, val, lo, hi in (("memory_mb", memory_mb, 16, None), ("pids", pids, 8, 1000000),
                                  ("disk_mb", disk_mb, 16, None)):
            if _check.integer(name, val, lo, hi) is not None:
                body[name] = val
        if network is not None:
            if not isinstance(network, Mapping):
                raise TypeError("network must be a dict, got %s" % type(network).__name__)
            body["network"] = dict(network)
        if isinstance(from_snapshot, Snapshot):
            from_snapshot = from_snapshot.id
        if _check.string("from_snapshot", from_snapshot, optional=True) is not None:
            body["from_snapshot"] = from_snapshot
        if _check.integer("hibernate_after_seconds", hibernate_after_seconds, 1, 2592000) is not None:
            if persistent is not True:
                raise ValueError("hibernate_after_seconds needs persistent=True")
            body["idle"] = {"hibernate_after_seconds": hibernate_after_seconds}
        if volumes is not None:
            body["volumes"] = [_volume_mount(v) for v in volumes]
        if databases is not None:
            if isinstance(databases, (str, bytes, Mapping)) or not isinstance(databases, Sequence):
                raise TypeError("databases must be a list (of Database, id, (database, env) or {id, env}), got %s"
                                % type(databases).__name__)
            body["databases"] = [_database.attachment(d) for d in databases]
        c = resolve(client, api_url, api_key, request_timeout)
        return cls(c._t.request("POST", "/v1/sandboxes", json_body=body, timeout=c.lifecycle_timeout)[1], c)

    @classmethod
    def connect(cls, sandbox_id: str, *, client: Optional[Client] = None, api_url: Optional[str] = None,
                api_key: Optional[str] = None, request_timeout: Any = _UNSET) -> "Sandbox":
        """A handle on an existing sandbox (NotFoundError if there is none with this id)."""
        _check.string("sandbox_id", sandbox_id)
        c = resolve(client, api_url, api_key, request_timeout)
        return cls(c._t.request("GET", "/v1/sandboxes/" + sandbox_id)[1], c)

    @classmethod
    def list(cls, *, metadata: Optional[Mapping[str, str]] = None, state: Optional[str] = None,
             template: Optional[str] = None, limit: Optional[int] = None, cursor: Optional[str] = None,
             client: Optional[Client] = None, api_url: Optional[str] = None, api_key: Optional[str] = None,
             request_timeout: Any = _UNSET) -> "SandboxList":
        """The sandboxes of this API key's organisation, oldest first, optionally those whose metadata
        has every given key=value, whose state is state (killed ones only with state="killed") and
        whose template is template. Without limit, every match; with limit (1..1000), one page of at most limit: the list's .next
        is the cursor of the following page (None on the last) and .total counts every match."""
        m = _check.str_map("metadata", metadata) or {}
        if _check.string("state", state, optional=True) is not None and \
                state not in ("creating", "running", "paused", "hibernated", "killed"):
            raise ValueError("state must be creating, running, paused, hibernated or killed, got %r" % state)
        q: Dict[str, Any] = {"state": state, "template": _check.string("template", template, optional=True)}
        for k, v in m.items():
            q["metadata." + k] = v
        if _check.integer("limit", limit, 1, 1000) is not None:
            q["limit"] = str(limit)
        if _check.string("cursor", cursor, optional=True) is not None:
            if not cursor:
                raise ValueError("cursor must not be empty")
            q["cursor"] = cursor
        c = resolve(client, api_url, api_key, request_timeout)
        r = c._t.request("GET", "/v1/sandboxes", query=q)[1]
        page = [cls(d, c) for d in r.get("sandboxes", [])]
        return SandboxList(page, r.get("next"), r.get("total", len(page)))

    @classmethod
    def iter(cls, *, metadata: Optional[Mapping[str, str]] = None, state: Optional[str] = None,
             template: Optional[str] = None, page_size: int = 100, client: Optional[Client] = None, api_url: Optional[str] = None,
             api_key: Optional[str] = None, request_timeout: Any = _UNSET) -> Iterator["Sandbox"]:
        """Every sandbox list() would return, fetched page_size (1..1000) at a time: the first page
        now (so that bad arguments raise here), the others as the iteration reaches them; each
        sandbox once, even while others are created or killed."""
        _check.integer("page_size", page_size, 1, 1000, optional=False)
        c = resolve(client, api_url, api_key, request_timeout)
        first = cls.list(metadata=metadata, state=state, template=template, limit=page_size, client=c)

        def walk() -> Iterator["Sandbox"]:
            page = first
            while True:
                yield from page
                if not page.next:
                    return
                page = cls.list(metadata=metadata, state=state, template=template, limit=page_size,
                                cursor=page.next, client=c)
        return walk()

    def metrics(self, from_: Any = None, to: Any = None, limit: Optional[int] = None) -> Dict[str, Any]:
        """GET /v1/sandboxes/{id}/metrics: without from_/to/limit the sample of now (cpu, memory,
        pids, disk, network); with them the recorded history {sandbox_id, from, to, samples: [...]}
        (times: Unix ms, RFC 3339 or datetime)."""
        from .usage import metrics
        return metrics(self._t, self._path, from_, to, limit)

    def refresh(self) -> SandboxInfo:
        """Fetches the sandbox's current description into .info and returns it."""
        self.info = SandboxInfo.from_json(self._t.request("GET", self._path)[1])
        return self.info

    @property
    def state(self) -> str:
        """The state as of the last call that described the sandbox (refresh() to update)."""
        return self.info.state

    def update(self, *, ttl_seconds: Optional[int] = None, persistent: Optional[bool] = None,
               metadata: Optional[Mapping[str, str]] = None) -> SandboxInfo:
        """Changes the lifetime (from now), persistence or metadata."""
        body: Dict[str, Any] = {}
        if _check.integer("ttl_seconds", ttl_seconds, 1, 2592000) is not None:
            body["ttl_seconds"] = ttl_seconds
        if _check.boolean("persistent", persistent) is not None:
            body["persistent"] = persistent
        m = _check.str_map("metadata", metadata)
        if m is not None:
            body["metadata"] = m
        if not body:
            raise ValueError("update needs at least one of ttl_seconds, persistent, metadata")
        self.info = SandboxInfo.from_json(self._t.request("PATCH", self._path, json_body=body)[1])
        return self.info

    def kill(self) -> None:
        """Destroys the sandbox and everything in it."""
        self._t.request("DELETE", self._path, timeout=self.client.lifecycle_timeout)
        self.info.state = "killed"

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self.info.persistent:
            return
        try:
            self.kill()
        except errors.NotFoundError:
            pass
        except errors.MoatError:
            if exc_type is None:
                raise

    # ---- commands ----
    @overload
    def exec(self, cmd: Command, *, env: Optional[Mapping[str, str]] = ..., cwd: Optional[str] = ...,
             timeout: Optional[float] = ..., stdin: Union[str, bytes, None] = ..., user: Optional[str] = ...,
             background: Literal[False] = ..., tag: None = ...) -> ExecResult: ...

    @overload
    def exec(self, cmd: Command, *, env: Optional[Mapping[str, str]] = ..., cwd: Optional[str] = ...,
             timeout: Optional[float] = ..., stdin: Union[str, bytes, None] = ..., user: Optional[str] = ...,
             background: Literal[True], tag: Optional[str] = ...) -> Process: ...

    def exec(self, cmd: Command, *, env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None,
             timeout: Optional[float] = None, stdin: Union[str, bytes, None] = None, user: Optional[str] = None,
             background: bool = False, tag: Optional[str] = None) -> Any:
        """Runs cmd (a shell string for /bin/sh -c, or an argv list) and waits for it: returns an
        ExecResult (a non-zero exit is not an error). timeout: seconds, after which the command is
        killed (timed_out=True); without one the call waits as long as the command runs.
        env/cwd/user (default root)/stdin (str or bytes) apply to this command only.
        background=True returns a Process at once instead (tag: a name to find it by)."""
        body = _exec_body(cmd, env, cwd, timeout, stdin, user)
        _check.boolean("background", background, optional=False)
        if background:
            if _check.tag("tag", tag) is not None:
                body["tag"] = tag
            body["background"] = True
            r = self._t.request("POST", self._path + "/exec", json_body=body)[1]
            return Process(self, int(r["pid"]), r.get("tag"))
        if tag is not None:
            raise ValueError("tag needs background=True")
        r = self._t.request("POST", self._path + "/exec", json_body=body,
                            timeout=_http_timeout(body.get("timeout_ms")))[1]
        return ExecResult.from_json(r)

    def exec_stream(self, cmd: Command, *, on_stdout: Optional[OutputCallback] = None,
                    on_stderr: Optional[OutputCallback] = None, env: Optional[Mapping[str, str]] = None,
                    cwd: Optional[str] = None, timeout: Optional[float] = None,
                    stdin: Union[str, bytes, None] = None, user: Optional[str] = None, binary: bool = False,
                    kill_on_disconnect: bool = True) -> int:
        """Runs cmd like exec but hands its output to on_stdout/on_stderr as it comes (str, or bytes
        with binary=True) and returns the exit code (-1 when killed by a signal). No client timeout
        cuts it; a connection that drops raises moat.ConnectionError. kill_on_disconnect (default
        True): if this client goes away (an exception in a callback, Ctrl-C), the command is killed."""
        body = _exec_body(cmd, env, cwd, timeout, stdin, user)
        _check.callback("on_stdout", on_stdout)
        _check.callback("on_stderr", on_stderr)
        _check.boolean("binary", binary, optional=False)
        body["kill_on_disconnect"] = _check.boolean("kill_on_disconnect", kill_on_disconnect, optional=False)
        s = self._t.stream("POST", self._path + "/exec/stream", json_body=body)
        ex = _pump_output(s, on_stdout, on_stderr, binary, "exec_stream in %s" % self.id)
        return int(ex.get("exit_code", -1))

    def logs(self, follow: bool = False, since: Any = None) -> Any:
        """The sandbox's log (``moat.logs.LogStream``, iterate for ``LogEntry`` s): every process's
        output (stdout, stderr, pty) with its pid, starts and exits, and lifecycle lines; since (a
        datetime, Unix ms or RFC 3339) keeps the entries at or after it; follow=True goes on with new
        ones until the sandbox is killed."""
        from .logs import open_logs
        return open_logs(self, follow=follow, since=since)

    def processes(self) -> List[ProcessInfo]:
        """Running processes and the last finished ones moatd keeps."""
        r = self._t.request("GET", self._path + "/processes")[1]
        return [ProcessInfo.from_json(p) for p in r.get("processes", [])]

    def process(self, ref: Union[int, str]) -> Process:
        """A handle on a background process by pid or tag (no request is made)."""
        if isinstance(ref, bool) or not isinstance(ref, (int, str)):
            raise TypeError("ref must be a pid (int) or a tag (str), got %s" % type(ref).__name__)
        if isinstance(ref, int):
            _check.integer("pid", ref, 1, 999999999)
            return Process(self, ref)
        _check.tag("tag", ref)
        return Process(self, 0, ref)

    def pty(self, cmd: Optional[str] = None, *, cols: int = 80, rows: int = 24,
            user: Optional[str] = None) -> Pty:
        """Starts cmd (default: a login shell) on a pseudo-terminal of cols x rows with
        TERM=xterm-256color and returns a Pty to type into and read from. Closing it kills the
        process."""
        _check.string("cmd", cmd, optional=True)
        _check.integer("cols", cols, 1, 1000, optional=False)
        _check.integer("rows", rows, 1, 1000, optional=False)
        _check.string("user", user, optional=True)
        t = self._t
        path = t.path(self._path + "/pty", {"cols": cols, "rows": rows, "cmd": cmd, "user": user})
        ws = _ws.WebSocket.connect(t.scheme, t.host, t.port, path, t.headers(), t.connect_timeout,
                                   self.client.lifecycle_timeout)
        return Pty(ws)

    # ---- code contexts ----
    def create_code_context(self, language: str = "python", *, cwd: Optional[str] = None) -> CodeContext:
        """Starts a persistent interpreter: "python" (default), "node" or "bash". Needs a template
        that has it (InvalidRequestError otherwise; use template "code-interpreter")."""
        _check.string("language", language)
        if language not in ("python", "node", "bash"):
            raise ValueError("language must be python, node or bash, got %r" % language)
        body: Dict[str, Any] = {"language": language}
        if _check.string("cwd", cwd, optional=True) is not None:
            body["cwd"] = cwd
        return CodeContext(self, self._t.request("POST", self._path + "/contexts", json_body=body,
                                                 timeout=self.client.lifecycle_timeout)[1])

    def code_contexts(self) -> List[CodeContext]:
        """The sandbox's code contexts."""
        r = self._t.request("GET", self._path + "/contexts")[1]
        return [CodeContext(self, d) for d in r.get("contexts", [])]

    def run_code(self, code: str, *, language: str = "python", timeout: Optional[float] = None,
                 on_stdout: Optional[Callable[[str], Any]] = None,
                 on_stderr: Optional[Callable[[str], Any]] = None) -> Execution:
        """Runs code in this Sandbox object's default context for language (made on first use)."""
        _check.string("language", language)
        ctx = self._contexts.get(language)
        if ctx is None:
            ctx = self.create_code_context(language)
            self._contexts[language] = ctx
        return ctx.run_code(code, timeout=timeout, on_stdout=on_stdout, on_stderr=on_stderr)

    # ---- time travel (issue 4) ----
    def _state_call(self, action: str) -> None:
        r = self._t.request("POST", "%s/%s" % (self._path, action), json_body={},
                            timeout=self.client.lifecycle_timeout)[1]
        if isinstance(r, dict) and "id" in r and "state" in r:
            self.info = SandboxInfo.from_json(r)
        else:
            self.refresh()

    def pause(self) -> None:
        """Freezes every process in the sandbox (its memory stays in place)."""
        self._state_call("pause")

    def resume(self) -> None:
        """Thaws a paused sandbox."""
        self._state_call("resume")

    def hibernate(self) -> None:
        """Checkpoints the sandbox to disk and releases its memory; wake() (or any request) brings it back."""
        self._state_call("hibernate")

    def wake(self) -> None:
        """Restores a hibernated sandbox."""
        self._state_call("wake")

    def snapshot(self, *, metadata: Optional[Mapping[str, str]] = None) -> Snapshot:
        """Checkpoints the sandbox (memory, processes and disk; it keeps running) and returns the
        snapshot. NotSupportedError (checkpoints_unavailable) where the host has no working CRIU."""
        body: Dict[str, Any] = {}
        m = _check.str_map("metadata", metadata)
        if m is not None:
            body["metadata"] = m
        return Snapshot.from_json(self._t.request("POST", self._path + "/snapshots", json_body=body,
                                                  timeout=self.client.lifecycle_timeout)[1])

    def snapshots(self) -> List[Snapshot]:
        """The snapshots taken of this sandbox."""
        r = self._t.request("GET", "/v1/snapshots", query={"sandbox_id": self.id})[1]
        return [Snapshot.from_json(d) for d in r.get("snapshots", [])]

    @classmethod
    def get_snapshot(cls, snapshot_id: str, *, client: Optional[Client] = None, api_url: Optional[str] = None,
                     api_key: Optional[str] = None) -> Snapshot:
        """One snapshot of the organisation (NotFoundError when there is none of that id)."""
        _check.string("snapshot_id", snapshot_id)
        c = resolve(client, api_url, api_key, _UNSET)
        return Snapshot.from_json(c._t.request("GET", "/v1/snapshots/" + snapshot_id)[1])

    def delete_snapshot(self, snapshot: Union[Snapshot, str]) -> None:
        """Deletes a snapshot."""
        sid = snapshot.id if isinstance(snapshot, Snapshot) else snapshot
        _check.string("snapshot", sid)
        self._t.request("DELETE", "/v1/snapshots/" + sid)

    def rollback(self, snapshot: Union[Snapshot, str]) -> None:
        """Restores the sandbox in place to a snapshot of it (memory, processes and disk)."""
        sid = snapshot.id if isinstance(snapshot, Snapshot) else snapshot
        _check.string("snapshot", sid)
        r = self._t.request("POST", self._path + "/rollback", json_body={"snapshot_id": sid},
                            timeout=self.client.lifecycle_timeout)[1]
        if isinstance(r, dict) and "id" in r and "state" in r:
            self.info = SandboxInfo.from_json(r)

    def fork(self, count: int = 1, *, databases: Optional[str] = None) -> List["Sandbox"]:
        """count (1..16) copies of this sandbox as it is now, running processes and their memory
        included, each a new Sandbox. databases="branch": each child gets its own branch of every
        database attached to this sandbox (its DATABASE_URL names the branch)."""
        _check.integer("count", count, 1, 16, optional=False)
        body: Dict[str, Any] = {"count": count}
        if _check.string("databases", databases, optional=True) is not None:
            body["databases"] = databases
        r = self._t.request("POST", self._path + "/fork", json_body=body,
                            timeout=self.client.lifecycle_timeout)[1]
        return [Sandbox(d, self.client) for d in r.get("sandboxes", [])]

    def explore(self, commands: Sequence[str], *, score_fn: Optional[Callable[[ExploreOutcome], float]] = None,
                keep: Optional[str] = None, timeout: Optional[float] = None,
                databases: Optional[str] = None) -> ExploreResult:
        """Best-of-N: forks this sandbox once per command (1..16), runs each command (sh -c) in its
        fork concurrently and keeps one fork as an independent sandbox.

        - keep="first_success" (the default without score_fn): the first branch to exit 0 wins;
          every other branch is killed (all of them when none succeeds).
        - with score_fn (keep="best"): the SDK calls score_fn(outcome) -> float for each branch that
          ran, keeps the highest (the first on a tie), and moatd kills the others.
        - keep="best" without score_fn: all branches stay alive; call result.keep(outcome).

        timeout: seconds each command may run (moatd's default: 10 minutes). databases="branch":
        each branch gets its own branch of every database attached to this sandbox. This sandbox
        is left as it was."""
        cmds = _check.str_list("commands", commands)
        if not 1 <= len(cmds) <= 16:
            raise ValueError("commands must hold 1 to 16 commands, got %d" % len(cmds))
        for i, c in enumerate(cmds):
            if not c.strip():
                raise ValueError("commands[%d] must not be empty" % i)
            if "\0" in c:
                raise ValueError("commands[%d] must not contain NUL characters" % i)
        _check.callback("score_fn", score_fn)
        if keep is not None and keep not in ("first_success", "best"):
            raise ValueError("keep must be 'first_success' or 'best', got %r" % (keep,))
        if score_fn is not None and keep == "first_success":
            raise ValueError("score_fn needs keep='best' (or no keep)")
        ms = _check.timeout_ms("timeout", timeout)
        _check.string("databases", databases, optional=True)
        if keep is None:
            keep = "best" if score_fn is not None else "first_success"
        branches: List[Dict[str, Any]] = []
        for c in cmds:
            b: Dict[str, Any] = {"cmd": c}
            if ms is not None:
                b["timeout_ms"] = ms
            branches.append(b)
        body: Dict[str, Any] = {"branches": branches, "keep": keep}
        if databases is not None:
            body["databases"] = databases
        r = self._t.request("POST", self._path + "/explore", json_body=body, timeout=None)[1]
        outcomes = [ExploreOutcome.from_json(o) for o in r.get("outcomes", [])]
        for i, o in enumerate(outcomes):
            if o.cmd is None and i < len(cmds):
                o.cmd = cmds[i]
        winner_id = r.get("winner")
        res = ExploreResult(self, Sandbox.connect(winner_id, client=self.client) if isinstance(winner_id, str)
                            else None, outcomes, r)
        if score_fn is not None:
            scored: List[ExploreOutcome] = []
            for o in outcomes:
                if o.sandbox_id and o.alive and o.error is None:
                    o.score = float(score_fn(o))
                    scored.append(o)
            if scored:
                best = max(scored, key=lambda o: o.score)  # the first of equal scores
                res.keep(best)
        return res

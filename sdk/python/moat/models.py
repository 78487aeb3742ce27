"""models.py -- the typed values the SDK returns (plain dataclasses built from moatd's JSON)."""

import base64
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional


def _b(d: Dict[str, Any], text_key: str) -> bytes:
    b64 = d.get(text_key + "_b64")
    if isinstance(b64, str):
        return base64.b64decode(b64)
    return (d.get(text_key) or "").encode("utf-8")


@dataclass
class ExecResult:
    """The result of ``Sandbox.exec``. ``stdout``/``stderr`` are text (bytes that were not UTF-8
    shown as U+FFFD); ``stdout_bytes``/``stderr_bytes`` are the exact bytes. ``exit_code`` is -1 and
    ``signal`` non-zero when the command was killed by a signal (``timed_out`` says if by its
    timeout). ``truncated``: a stream passed moatd's 16 MiB cap. ``oom_killed``: the kernel
    killed the command for want of memory (the sandbox's ``memory_mb``)."""
    stdout: str
    stderr: str
    exit_code: int
    duration_ms: int
    timed_out: bool
    truncated: bool
    signal: int = 0
    pid: Optional[int] = None
    stdout_bytes: bytes = b""
    stderr_bytes: bytes = b""
    oom_killed: bool = False

    @property
    def ok(self) -> bool:
        """True when the command exited 0."""
        return self.exit_code == 0

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "ExecResult":
        return cls(stdout=d.get("stdout") or "", stderr=d.get("stderr") or "", exit_code=int(d.get("exit_code", -1)),
                   duration_ms=int(d.get("duration_ms") or 0), timed_out=bool(d.get("timed_out")),
                   truncated=bool(d.get("truncated")), signal=int(d.get("signal") or 0), pid=d.get("pid"),
                   stdout_bytes=_b(d, "stdout"), stderr_bytes=_b(d, "stderr"),
                   oom_killed=bool(d.get("oom_killed")))


@dataclass
class SandboxInfo:
    """A sandbox as moatd describes it (``GET /v1/sandboxes/{id}``); ``raw`` holds every field."""
    id: str
    template: str
    state: str
    created_at: Optional[str]
    expires_at: Optional[str]
    ttl_seconds: Optional[int]
    persistent: bool
    metadata: Dict[str, str]
    cpu: Optional[float]
    memory_mb: Optional[int]
    paused_at: Optional[str] = None
    forked_from: Optional[str] = None
    from_snapshot: Optional[str] = None
    killed_reason: Optional[str] = None
    #: the volumes it mounts: [{"name", "path", "read_only"}] ([] when none, and once killed)
    volumes: List[Dict[str, Any]] = field(default_factory=list)
    raw: Dict[str, Any] = field(repr=False, default_factory=dict)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "SandboxInfo":
        return cls(id=d["id"], template=d.get("template", ""), state=d.get("state", ""),
                   created_at=d.get("created_at"), expires_at=d.get("expires_at"), ttl_seconds=d.get("ttl_seconds"),
                   persistent=bool(d.get("persistent")), metadata=dict(d.get("metadata") or {}), cpu=d.get("cpu"),
                   memory_mb=d.get("memory_mb"), paused_at=d.get("paused_at"), forked_from=d.get("forked_from"),
                   from_snapshot=d.get("from_snapshot"), killed_reason=d.get("killed_reason"),
                   volumes=[dict(v) for v in d.get("volumes") or []], raw=d)


@dataclass
class EntryInfo:
    """A file-system entry (``files.stat``, ``files.list``); ``type`` is file, dir, symlink or other
    and ``mode`` an octal string such as ``"0644"``."""
    name: str
    path: str
    type: str
    size: int
    mode: str
    mtime: Optional[str]
    uid: Optional[int] = None
    gid: Optional[int] = None
    symlink_target: Optional[str] = None

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "EntryInfo":
        return cls(name=d.get("name", ""), path=d.get("path", ""), type=d.get("type", ""), size=int(d.get("size") or 0),
                   mode=d.get("mode", ""), mtime=d.get("mtime"), uid=d.get("uid"), gid=d.get("gid"),
                   symlink_target=d.get("symlink_target"))


@dataclass
class WriteInfo:
    """What ``files.write`` wrote."""
    path: str
    size: int


@dataclass
class FilesystemEvent:
    """One event of ``files.watch``: ``event`` is create, write, remove, rename or overflow;
    ``path2`` is a rename's destination when known."""
    event: str
    path: str
    path2: Optional[str] = None


@dataclass
class ProcessInfo:
    """A process in the sandbox (``Sandbox.processes``); ``exit_code``/``signal`` are None while it runs."""
    pid: int
    tag: Optional[str]
    cmd: str
    argv: List[str]
    started_at: Optional[str]
    running: bool
    exit_code: Optional[int]
    signal: Optional[int]
    pty: bool
    background: bool

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "ProcessInfo":
        return cls(pid=int(d["pid"]), tag=d.get("tag"), cmd=d.get("cmd", ""), argv=list(d.get("argv") or []),
                   started_at=d.get("started_at"), running=bool(d.get("running")), exit_code=d.get("exit_code"),
                   signal=d.get("signal"), pty=bool(d.get("pty")), background=bool(d.get("background")))


@dataclass
class Result:
    """One result of a code cell: its text/plain form and, when the value has them, PNG (base64),
    HTML and JSON forms. ``is_main_result``: the cell's last expression."""
    text: Optional[str]
    png: Optional[str] = None
    html: Optional[str] = None
    json: Any = None
    is_main_result: bool = False

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Result":
        return cls(text=d.get("text"), png=d.get("png"), html=d.get("html"), json=d.get("json"),
                   is_main_result=bool(d.get("is_main_result")))


@dataclass
class ExecutionError:
    """An exception a code cell raised: its class name, value and formatted traceback."""
    name: str
    value: str
    traceback: str

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "ExecutionError":
        tb = d.get("traceback") or []
        return cls(name=d.get("name") or "", value=d.get("value") or "",
                   traceback="\n".join(tb) if isinstance(tb, list) else str(tb))


@dataclass
class Execution:
    """The outcome of ``CodeContext.run_code``. ``text`` is the main result's text (the value of
    the cell's last expression), or None; ``error`` is None when the cell raised nothing."""
    stdout: str
    stderr: str
    results: List[Result]
    error: Optional[ExecutionError]
    execution_count: Optional[int] = None
    timed_out: bool = False
    restarted: bool = False
    exit_code: Optional[int] = None

    @property
    def text(self) -> Optional[str]:
        for r in self.results:
            if r.is_main_result:
                return r.text
        return None


@dataclass
class Snapshot:
    """A snapshot of a sandbox (``Sandbox.snapshot``): its memory, processes and disk at one
    moment. Start new sandboxes from it (``Sandbox.create(from_snapshot=snap.id)``) or roll its
    sandbox back to it (``Sandbox.rollback``)."""
    id: str
    sandbox_id: Optional[str] = None
    created_at: Optional[str] = None
    memory_bytes: Optional[int] = None
    disk_bytes: Optional[int] = None
    metadata: Dict[str, str] = field(default_factory=dict)
    raw: Dict[str, Any] = field(repr=False, default_factory=dict)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Snapshot":
        return cls(id=d.get("snapshot_id") or d["id"], sandbox_id=d.get("sandbox_id"), created_at=d.get("created_at"),
                   memory_bytes=d.get("memory_bytes"), disk_bytes=d.get("disk_bytes"),
                   metadata=dict(d.get("metadata") or {}), raw=d)


@dataclass
class ExploreOutcome:
    """One branch of ``Sandbox.explore``: the command, the fork it ran in (``sandbox_id``), its
    exit code (None when the branch could not run: see ``error``), the last 4 KiB of its output,
    the paths it changed, and ``score`` when a score_fn scored it. ``alive``: the branch sandbox
    still exists after the call."""
    sandbox_id: Optional[str]
    cmd: Optional[str]
    exit_code: Optional[int]
    stdout_tail: str
    stderr_tail: str
    files_changed: List[str]
    duration_ms: Optional[int]
    timed_out: bool = False
    alive: bool = False
    error: Optional[str] = None
    score: Optional[float] = None
    raw: Dict[str, Any] = field(repr=False, default_factory=dict)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "ExploreOutcome":
        return cls(sandbox_id=d.get("sandbox_id"), cmd=d.get("cmd"), exit_code=d.get("exit_code"),
                   stdout_tail=d.get("stdout_tail") or "", stderr_tail=d.get("stderr_tail") or "",
                   files_changed=list(d.get("files_changed") or []), duration_ms=d.get("duration_ms"),
                   timed_out=bool(d.get("timed_out")), alive=bool(d.get("alive")), error=d.get("error"), raw=d)

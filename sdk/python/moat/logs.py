"""logs.py -- a sandbox's output log (``Sandbox.logs``): every process's start, output and exit,
and the sandbox's lifecycle transitions, in time order (GET /v1/sandboxes/{id}/logs)."""

import base64
import datetime
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Union

from . import _check, errors
from ._http import SSEStream

Since = Union[None, int, float, str, datetime.datetime]


@dataclass
class LogEntry:
    """One entry of a sandbox's log. ``type``: "output" (``stream`` stdout, stderr or pty;
    ``data`` the bytes), "process" (``event`` start or exit: ``argv``, ``exit_code``, ...),
    "lifecycle" (``event`` created, paused, resumed, hibernated, woken, killed, ...; ``reason``),
    "oom" (the kernel OOM-killed in the sandbox) or "dropped" (``bytes`` lost: ``reason`` "bound"
    when the log's size bound dropped the oldest entries, "unread" when output went by faster than
    moatd took it). ``at_ms``: Unix milliseconds (None for a bound's marker). ``raw``: the JSON."""

    type: str
    at_ms: Optional[int] = None
    stream: Optional[str] = None
    pid: Optional[int] = None
    tag: Optional[str] = None
    data: bytes = b""
    event: Optional[str] = None
    reason: Optional[str] = None
    bytes: int = 0
    raw: Dict[str, Any] = field(default_factory=dict)

    @property
    def text(self) -> str:
        return self.data.decode("utf-8", "replace")

    @classmethod
    def from_json(cls, j: Dict[str, Any]) -> "LogEntry":
        data = b""
        if j.get("type") == "output":
            d = j.get("data") or ""
            data = base64.b64decode(d) if j.get("encoding") == "base64" else d.encode()
        return cls(type=str(j.get("type")), at_ms=j.get("at_ms"), stream=j.get("stream"), pid=j.get("pid"),
                   tag=j.get("tag"), data=data, event=j.get("event"), reason=j.get("reason"),
                   bytes=int(j.get("bytes") or 0), raw=j)


class LogStream:
    """Iterate for ``LogEntry`` s: what is stored, then (with follow) new entries as they come,
    until the sandbox is killed. Close it (or use ``with``) to stop early."""

    def __init__(self, stream: SSEStream):
        self._s = stream

    def __iter__(self) -> Iterator[LogEntry]:
        try:
            while True:
                ev = self._s.next()
                if ev is None:
                    return
                if ev.name == "error":
                    raise errors.error_from_event(ev.data, "logs")
                if isinstance(ev.data, dict):
                    yield LogEntry.from_json(ev.data)
        finally:
            self._s.close()

    def close(self) -> None:
        self._s.close()

    def __enter__(self) -> "LogStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def since_param(since: Since) -> Optional[str]:
    if since is None:
        return None
    if isinstance(since, datetime.datetime):
        if since.tzinfo is None:
            since = since.replace(tzinfo=datetime.timezone.utc)
        return str(int(since.timestamp() * 1000))
    if isinstance(since, bool):
        raise TypeError("since must be a datetime, Unix milliseconds or an RFC 3339 string")
    if isinstance(since, (int, float)):
        return str(int(since))
    if isinstance(since, str):
        return since
    raise TypeError("since must be a datetime, Unix milliseconds or an RFC 3339 string")


def open_logs(sandbox: Any, follow: bool = False, since: Since = None) -> LogStream:
    _check.boolean("follow", follow, optional=False)
    q: Dict[str, str] = {}
    if follow:
        q["follow"] = "true"
    s = since_param(since)
    if s is not None:
        q["since"] = s
    return LogStream(sandbox._t.stream("GET", sandbox._path + "/logs", query=q or None))


def list_logs(sandbox: Any, since: Since = None) -> List[LogEntry]:
    return list(open_logs(sandbox, False, since))

"""moat -- Python client of moatd, the sandbox daemon for AI agents (standard library only).

    from moat import Sandbox

    with Sandbox.create() as sb:            # MOAT_API_URL / MOAT_API_KEY from the environment
        r = sb.exec("echo hello")
        print(r.stdout, r.exit_code)

See docs/quickstart-python.md in the moat repository.
"""

from .admin import Admin
from .client import (DEFAULT_API_URL, DEFAULT_CONNECT_TIMEOUT, DEFAULT_LIFECYCLE_TIMEOUT, DEFAULT_REQUEST_TIMEOUT,
                     DEFAULT_STREAM_IDLE_TIMEOUT, TIMEOUT_MARGIN, Client)
from .logs import LogEntry, LogStream
from .database import Database, DatabaseConnection, Databases
from .errors import (AuthenticationError, BuildError, ConflictError, ConnectionError, InvalidRequestError, MoatError,
                     NotFoundError, NotSupportedError, SandboxError, TimeoutError)
from .models import (EntryInfo, Execution, ExecutionError, ExecResult, ExploreOutcome, FilesystemEvent, ProcessInfo,
                     Result, SandboxInfo, Snapshot, WriteInfo)
from .sandbox import CodeContext, ExploreResult, Files, Process, ProcessStdin, Pty, Sandbox, SandboxList, WatchHandle
from .template import BuildEnd, BuildLogLine, BuildLogs, Template, Templates
from .volume import Volume, VolumeAttachment
from .account import Audit, Keys
from .sandbox_ops import EventStream

__version__ = "0.1.0"

__all__ = [
    "Admin", "Sandbox", "SandboxList", "Client", "Volume", "VolumeAttachment", "Database", "DatabaseConnection", "Databases", "Template", "Templates", "BuildLogLine", "BuildEnd",
    "BuildLogs", "BuildError", "Files", "Process", "ProcessStdin", "Pty", "CodeContext", "WatchHandle", "ExploreResult",
    "ExecResult", "SandboxInfo", "EntryInfo", "WriteInfo", "FilesystemEvent", "ProcessInfo", "Execution", "Result",
    "ExecutionError", "Snapshot", "ExploreOutcome", "LogEntry", "LogStream",
    "MoatError", "InvalidRequestError", "AuthenticationError", "NotFoundError", "ConflictError", "TimeoutError",
    "ConnectionError", "SandboxError", "NotSupportedError",
    "DEFAULT_API_URL", "DEFAULT_REQUEST_TIMEOUT", "DEFAULT_LIFECYCLE_TIMEOUT", "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_STREAM_IDLE_TIMEOUT", "TIMEOUT_MARGIN", "__version__",
    "Keys", "Audit", "EventStream",
]

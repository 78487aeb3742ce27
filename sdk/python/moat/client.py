"""client.py -- Client: where moatd is (MOAT_API_URL), the API key (MOAT_API_KEY) and the timeouts."""

import os
import threading
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from . import _check
from ._http import Transport
from .template import Templates

if TYPE_CHECKING:
    from .database import Databases

DEFAULT_API_URL = "http://127.0.0.1:7070"
#: Seconds an ordinary call (create, files, list, ...) may take before moat.TimeoutError.
DEFAULT_REQUEST_TIMEOUT = 60.0
#: Seconds a sandbox life-cycle call (create, kill, pause/resume, hibernate/wake, snapshot, rollback,
#: fork) may take: these build or tear down namespaces, disks and checkpoints.
DEFAULT_LIFECYCLE_TIMEOUT = 300.0
#: Seconds to open a TCP connection to moatd.
DEFAULT_CONNECT_TIMEOUT = 10.0
#: Seconds of silence after which a stream counts as dropped (moatd sends a keep-alive every 15 s).
DEFAULT_STREAM_IDLE_TIMEOUT = 45.0
#: Added to a command's own timeout to get the HTTP timeout of exec and run_code.
TIMEOUT_MARGIN = 30.0

_UNSET: Any = object()


class Client:
    """A connection to one moatd with one API key. Thread-safe: each thread keeps one kept-alive
    HTTP connection. Arguments left out come from the environment:

    - ``api_url``: ``MOAT_API_URL``, else ``http://127.0.0.1:7070``;
    - ``api_key``: ``MOAT_API_KEY`` (required);
    - ``request_timeout``: seconds for ordinary calls: files, processes, listing (default 60;
      ``None`` = no limit);
    - ``lifecycle_timeout``: seconds for create, kill, pause/resume, hibernate/wake, snapshot,
      rollback and fork (default 300; ``None`` = no limit).

    ``exec`` and ``run_code`` use neither: they wait for their own ``timeout`` plus 30 s, or without
    limit when the command has none; ``explore`` waits for its branches (each bounded by its
    ``timeout``, moatd's default 10 minutes). Streams have no overall limit but raise
    ``moat.ConnectionError`` after ``stream_idle_timeout`` seconds (default 45) without even a
    keep-alive from moatd. A client-side timeout raises ``moat.TimeoutError``.
    """

    def __init__(self, api_url: Optional[str] = None, api_key: Optional[str] = None, *,
                 request_timeout: Optional[float] = DEFAULT_REQUEST_TIMEOUT,
                 lifecycle_timeout: Optional[float] = DEFAULT_LIFECYCLE_TIMEOUT,
                 connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
                 stream_idle_timeout: float = DEFAULT_STREAM_IDLE_TIMEOUT):
        _check.string("api_url", api_url, optional=True)
        _check.string("api_key", api_key, optional=True)
        _check.number("request_timeout", request_timeout, lo=0)
        _check.number("lifecycle_timeout", lifecycle_timeout, lo=0)
        _check.number("connect_timeout", connect_timeout, lo=0, optional=False)
        _check.number("stream_idle_timeout", stream_idle_timeout, lo=0, optional=False)
        url = api_url or os.environ.get("MOAT_API_URL") or DEFAULT_API_URL
        key = api_key or os.environ.get("MOAT_API_KEY")
        if not key:
            raise ValueError("no API key: pass api_key= or set MOAT_API_KEY (moatd writes it to DATA_DIR/api-key)")
        if request_timeout is not None and request_timeout <= 0:
            raise ValueError("request_timeout must be > 0 seconds or None, got %s" % request_timeout)
        if lifecycle_timeout is not None and lifecycle_timeout <= 0:
            raise ValueError("lifecycle_timeout must be > 0 seconds or None, got %s" % lifecycle_timeout)
        self.api_url = url
        self.request_timeout = request_timeout
        self.lifecycle_timeout = lifecycle_timeout
        self._t = Transport(url, key, request_timeout, connect_timeout, stream_idle_timeout)

    def __repr__(self) -> str:
        return "Client(%r)" % self.api_url

    @property
    def templates(self) -> "Templates":
        """The organisation's templates: build (from a Dockerfile), import_image (an OCI archive),
        get, list, delete, logs."""
        t = self.__dict__.get("_templates")
        if t is None:
            t = self.__dict__["_templates"] = Templates(self)
        return t

    @property
    def databases(self) -> "Databases":
        """The organisation's PostgreSQL databases: create, get, list (``moat.Database``)."""
        d = self.__dict__.get("_databases")
        if d is None:
            from .database import Databases
            d = self.__dict__["_databases"] = Databases(self)
        return d

    def usage(self, from_: Any = None, to: Any = None, group_by: Optional[str] = None,
              bucket: Optional[int] = None) -> List[Dict[str, Any]]:
        """GET /v1/usage: the org's metered use over [from_, to) (Unix ms, RFC 3339 or datetime;
        default the last 24 h) grouped by "sandbox" (default), "org", "template" or "metadata.KEY":
        [{key, cpu_seconds, memory_gib_seconds, sandbox_seconds}], the largest CPU first. With
        bucket (seconds, 60..86400) each row also has "series": [{start, cpu_seconds,
        memory_gib_seconds, sandbox_seconds}] per bucket aligned to multiples of the width since the
        Unix epoch, oldest first, the buckets without use left out, summing to the row's totals."""
        from .usage import usage
        return usage(self._t, from_, to, group_by, bucket)

    def host(self) -> Dict[str, Any]:
        """GET /v1/host: {version, scope, capacity {cpus, memory_mb, disk_mb, pids_max}, load,
        sandboxes {live, by_state, committed_vcpus, committed_memory_mb}, checkpoints, network}.
        An org's key sees its own org's sandboxes and load None; the platform admin key (scope
        "host") every org's, and load {average [1, 5, 15 min], memory_available_mb, disk_free_mb,
        uptime_seconds}."""
        return self._t.request("GET", "/v1/host")[1]

    def health(self) -> Dict[str, Any]:
        """GET /healthz (no authentication needed): {"status": "ok", "version", ...}."""
        return self._t.request("GET", "/healthz")[1]

    def close(self) -> None:
        """Closes the calling thread's kept-alive connection."""
        self._t.close()


_default_lock = threading.Lock()
_defaults: Dict[Tuple[Any, ...], Client] = {}


def resolve(client: Optional[Client], api_url: Optional[str], api_key: Optional[str],
            request_timeout: Any) -> Client:
    """The client to use: the one given, else a shared one per (url, key, timeout) so that
    Sandbox objects made from the environment share kept-alive connections."""
    if client is not None:
        if not isinstance(client, Client):
            raise TypeError("client must be a moat.Client, got %s" % type(client).__name__)
        if api_url is not None or api_key is not None or request_timeout is not _UNSET:
            raise ValueError("pass either client= or api_url=/api_key=/request_timeout=, not both")
        return client
    rt = DEFAULT_REQUEST_TIMEOUT if request_timeout is _UNSET else request_timeout
    _check.string("api_url", api_url, optional=True)
    _check.string("api_key", api_key, optional=True)
    key = (api_url or os.environ.get("MOAT_API_URL") or DEFAULT_API_URL, api_key or os.environ.get("MOAT_API_KEY"), rt)
    with _default_lock:
        c = _defaults.get(key)
        if c is None:
            c = Client(api_url, api_key, request_timeout=rt)
            _defaults[key] = c
        return c

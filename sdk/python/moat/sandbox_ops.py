"""Sandbox calls about what surrounds the sandbox's processes: exposed ports, the egress policy and
its connection log, the event stream, resource metrics and the lifetime (a mixin of moat.Sandbox)."""

import time
from typing import Any, Dict, Iterator, List, Optional, Sequence, Union
from urllib.parse import quote

from . import _check
from ._http import Event, SSEStream, Transport
from .models import SandboxInfo


class EventStream:
    """GET /v1/sandboxes/{id}/events: iterate for Event(name, data) (names: state, connection,
    dropped, oom); next(timeout) waits at most timeout seconds; close() ends it. A context manager."""

    def __init__(self, s: SSEStream):
        self._s = s

    def next(self, timeout: Optional[float] = None) -> Optional[Event]:
        """The next event; None when the stream ended. timeout: seconds (moat.TimeoutError past it)."""
        if timeout is not None:
            self._s.deadline = time.monotonic() + timeout
        try:
            return self._s.next()
        finally:
            self._s.deadline = None

    def __iter__(self) -> Iterator[Event]:
        return iter(self._s)

    def close(self) -> None:
        self._s.close()

    def __enter__(self) -> "EventStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _port(port: Any) -> int:
    _check.integer("port", port, 1, 65535, optional=False)
    return int(port)


def _entries(name: str, v: Optional[Sequence[str]]) -> Optional[List[str]]:
    if v is None:
        return None
    return _check.str_list(name, v)


class SandboxOps:
    """Mixed into moat.Sandbox (which sets self._t and self._path)."""

    _t: Transport
    _path: str

    # ---- exposed ports ----
    def ports(self) -> List[Dict[str, Any]]:
        """The ports whose access was set (expose_port): each {port, public, token, url, path}."""
        return self._t.request("GET", self._path + "/ports")[1].get("ports", [])

    def port(self, port: int) -> Dict[str, Any]:
        """One port's access {port, public, token, url, path} (never set: public false, token null)."""
        return self._t.request("GET", "%s/ports/%d" % (self._path, _port(port)))[1]

    def expose_port(self, port: int, *, public: bool = False, token: Optional[str] = None) -> Dict[str, Any]:
        """Sets the access of port: public=True lets anyone through; else a token (the one given,
        or a new random one) is needed besides the API key. Returns {port, public, token, url, path}."""
        body: Dict[str, Any] = {}
        if _check.boolean("public", public) and token is not None:
            raise ValueError("a public port takes no token")
        if public:
            body["public"] = True
        if _check.string("token", token, optional=True) is not None:
            body["token"] = token
        return self._t.request("POST", "%s/ports/%d" % (self._path, _port(port)), json_body=body)[1]

    def unexpose_port(self, port: int) -> None:
        """Forgets the port's token and public flag: the API key alone reaches it again."""
        self._t.request("DELETE", "%s/ports/%d" % (self._path, _port(port)))

    def port_path(self, port: int, path: str = "/") -> str:
        """The API path that proxies to port inside the sandbox (send it with the API key or token)."""
        return "%s/ports/%d/%s" % (self._path, _port(port), quote(path.lstrip("/"), safe="/"))

    # ---- network ----
    def network(self) -> Dict[str, Any]:
        """{address, dns, policy, bytes_in, bytes_out, connections}."""
        return self._t.request("GET", self._path + "/network")[1]

    def set_network(self, *, internet: Optional[bool] = None, egress: Optional[str] = None,
                    allow: Optional[Sequence[str]] = None, deny: Optional[Sequence[str]] = None,
                    **policy: Any) -> Dict[str, Any]:
        """Replaces the egress policy (see NetworkPolicy in docs/openapi.yaml): internet=False cuts
        egress; egress "allow"/"deny" is the default for what allow/deny (IPv4, CIDR, name,
        *.name) do not name. Returns the network as network() does."""
        body: Dict[str, Any] = dict(policy)
        if _check.boolean("internet", internet) is not None:
            body["internet"] = internet
        if _check.string("egress", egress, optional=True) is not None:
            body["egress"] = egress
        for name, v in (("allow", allow), ("deny", deny)):
            e = _entries(name, v)
            if e is not None:
                body[name] = e
        return self._t.request("PUT", self._path + "/network", json_body=body)[1]

    def network_log(self, *, since: Optional[int] = None, limit: Optional[int] = None) -> List[Dict[str, Any]]:
        """Outbound connections (and dropped attempts), oldest first: {seq, time_ms, sandbox_id,
        org, protocol, destination, port, name, verdict (allowed/denied), reason}; since: only seq
        greater than this."""
        q: Dict[str, Any] = {}
        if _check.integer("since", since, 0) is not None:
            q["since"] = since
        if _check.integer("limit", limit, 1, 1024) is not None:
            q["limit"] = limit
        return self._t.request("GET", self._path + "/network/log", query=q)[1].get("connections", [])

    # ---- events, metrics, lifetime ----
    def events(self, *, replay: bool = False, since: Union[str, int, None] = None) -> EventStream:
        """Subscribes to the sandbox's events (state transitions, connections, OOM kills); replay:
        the recorded ones first; since: from this time (RFC 3339 or Unix ms). Returns once
        subscribed, so nothing after the call is missed."""
        q: Dict[str, Any] = {}
        if _check.boolean("replay", replay):
            q["replay"] = "true"
        if since is not None:
            if not isinstance(since, (str, int)) or isinstance(since, bool):
                raise TypeError("since must be an RFC 3339 string or Unix milliseconds")
            q["since"] = str(since)
        return EventStream(self._t.stream("GET", self._path + "/events", query=q, ready_comment="subscribed"))

    def set_timeout(self, seconds: int) -> SandboxInfo:
        """The sandbox is killed `seconds` from now (unless API activity refreshes it); returns the
        new SandboxInfo."""
        _check.integer("seconds", seconds, 1, 2592000, optional=False)
        return self.update(ttl_seconds=seconds)  # type: ignore[attr-defined]

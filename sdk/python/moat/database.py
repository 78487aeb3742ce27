"""database.py -- Database: an organisation's PostgreSQL 15 database whose data outlives its sandboxes.

    from moat import Database, Sandbox

    db = Database.create("app", size_mb=256)           # or client.databases.create("app")
    print(db.url)                                      # postgresql://db_...:...@127.0.0.1:7432/db_...?sslmode=disable
    with Sandbox.create(databases=[db]) as sb:         # $DATABASE_URL is db.url in every command
        print(sb.exec('echo "$DATABASE_URL"').stdout)   # db.url (a client on the host reaches it)
    trial = db.branch("app-trial")                     # a new database with db's data
    trial.delete()
"""

from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Mapping, Optional
from urllib.parse import quote

from . import _check
from .client import _UNSET, Client, resolve


@dataclass
class DatabaseConnection:
    """How to reach the database: through moatd's PostgreSQL proxy (``moatd --db-listen``) at
    host:port, as user (a login role that owns its database and is no superuser) with password
    (SCRAM). ``url`` is ``postgresql://user:password@host:port/database?sslmode=disable``, for clients
    on the host; ``sandbox_url`` is the URL a sandbox reaches it at (the proxy's listener on the
    sandboxes' service address, port 5432), None when moatd gives sandboxes no network."""
    host: str
    port: int
    user: str
    password: str = field(repr=False)
    database: str
    url: str = field(repr=False)
    sandbox_url: Optional[str] = field(default=None, repr=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "DatabaseConnection":
        return cls(host=d.get("host", ""), port=int(d.get("port") or 0), user=d.get("user", ""),
                   password=d.get("password", ""), database=d.get("database", ""), url=d.get("url", ""),
                   sandbox_url=d.get("sandbox_url"))


@dataclass
class Database:
    """A database (``Database.create``, ``Database.get``, ``Database.list``, or the same through
    ``client.databases``). ``state`` is creating, running, hibernated (no connection for
    ``idle_seconds``: it costs no compute and the next connection wakes it), paused, stopped (its
    sandbox is gone; the next connection starts one on the same data) or deleting, as of the last
    call that described it (``refresh()`` to update). Its data lives on ``volume``; its server runs
    in sandbox ``sandbox_id``. Attach it to a sandbox with ``Sandbox.create(databases=[db])``."""
    id: str
    name: str
    state: str
    size_mb: int
    idle_seconds: int
    metadata: Dict[str, str]
    connection: DatabaseConnection
    created_at: Optional[str] = None
    volume: Optional[str] = None
    sandbox_id: Optional[str] = None
    connections: int = 0
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    client: Optional[Client] = field(default=None, repr=False, compare=False)

    @classmethod
    def _from_json(cls, d: Dict[str, Any], c: Client) -> "Database":
        return cls(id=d["id"], name=d.get("name", ""), state=d.get("state", ""), size_mb=int(d.get("size_mb") or 0),
                   idle_seconds=int(d.get("idle_seconds") or 0), metadata=dict(d.get("metadata") or {}),
                   connection=DatabaseConnection.from_json(d.get("connection") or {}), created_at=d.get("created_at"),
                   volume=d.get("volume"), sandbox_id=d.get("sandbox_id"), connections=int(d.get("connections") or 0),
                   raw=d, client=c)

    @property
    def url(self) -> str:
        """The connection URL for the host (it holds the password). A sandbox created with
        ``databases=[this]`` gets ``connection.sandbox_url`` as ``DATABASE_URL`` instead (when moatd
        gives sandboxes a network)."""
        return self.connection.url

    @property
    def _path(self) -> str:
        return "/v1/databases/" + quote(self.id, safe="")

    @classmethod
    def create(cls, name: str, *, size_mb: Optional[int] = None, idle_seconds: Optional[int] = None,
               metadata: Optional[Mapping[str, str]] = None, client: Optional[Client] = None,
               api_url: Optional[str] = None, api_key: Optional[str] = None,
               request_timeout: Any = _UNSET) -> "Database":
        """Creates database name (``[a-z0-9][a-z0-9_-]{0,62}``, unique in the organisation:
        ConflictError ``already_exists``) and returns it once its server accepts connections.
        size_mb: its data volume (default 1024, at least 64; SandboxError ``insufficient_storage``
        when moatd cannot back it); idle_seconds: hibernate after so long with no connection
        (default 300, at most 30 days); metadata: str->str labels."""
        _check.string("name", name)
        body: Dict[str, Any] = {"name": name}
        if _check.integer("size_mb", size_mb, 64, None) is not None:
            body["size_mb"] = size_mb
        if _check.integer("idle_seconds", idle_seconds, 1, 2592000) is not None:
            body["idle_seconds"] = idle_seconds
        m = _check.str_map("metadata", metadata)
        if m is not None:
            body["metadata"] = m
        c = resolve(client, api_url, api_key, request_timeout)
        return cls._from_json(c._t.request("POST", "/v1/databases", json_body=body, timeout=c.lifecycle_timeout)[1],
                              c)

    @classmethod
    def get(cls, database_id: str, *, client: Optional[Client] = None, api_url: Optional[str] = None,
            api_key: Optional[str] = None, request_timeout: Any = _UNSET) -> "Database":
        """The database (NotFoundError when the organisation has none with this id)."""
        _check.string("database_id", database_id)
        c = resolve(client, api_url, api_key, request_timeout)
        return cls._from_json(c._t.request("GET", "/v1/databases/" + quote(database_id, safe=""))[1], c)

    @classmethod
    def list(cls, *, client: Optional[Client] = None, api_url: Optional[str] = None, api_key: Optional[str] = None,
             request_timeout: Any = _UNSET) -> List["Database"]:
        """The organisation's databases, oldest first."""
        c = resolve(client, api_url, api_key, request_timeout)
        return [cls._from_json(d, c) for d in c._t.request("GET", "/v1/databases")[1].get("databases", [])]

    def _c(self) -> Client:
        if self.client is None:
            raise ValueError("this Database has no client: get it with Database.get or Database.create")
        return self.client

    def refresh(self) -> "Database":
        """Reads the database's state, sandbox and connection count again; returns self."""
        d = Database.get(self.id, client=self._c())
        for f in ("name", "state", "size_mb", "idle_seconds", "metadata", "connection", "created_at", "volume",
                  "sandbox_id", "connections", "raw"):
            setattr(self, f, getattr(d, f))
        return self

    def branch(self, name: str, *, metadata: Optional[Mapping[str, str]] = None,
               idle_seconds: Optional[int] = None) -> "Database":
        """A new database named name with this one's data as it is now (its own role, password
        and volume of this one's size); the two change independently from then on."""
        _check.string("name", name)
        body: Dict[str, Any] = {"name": name}
        m = _check.str_map("metadata", metadata)
        if m is not None:
            body["metadata"] = m
        if _check.integer("idle_seconds", idle_seconds, 1, 2592000) is not None:
            body["idle_seconds"] = idle_seconds
        c = self._c()
        return Database._from_json(c._t.request("POST", self._path + "/branch", json_body=body,
                                                timeout=c.lifecycle_timeout)[1], c)

    def events(self) -> Iterator[Any]:
        """The database's events as Event(name, data): first ``state``, then connection, hibernated,
        woken, restarted, branched, created as they happen; the stream ends after ``deleted``. Stop
        iterating (close the generator) to end the request."""
        s = self._c()._t.stream("GET", self._path + "/events")
        try:
            for ev in s:
                yield ev
                if ev.name == "deleted":
                    return
        finally:
            s.close()

    def delete(self) -> None:
        """Deletes the database: its sandbox is killed and its data removed (ConflictError while
        it is being created)."""
        c = self._c()
        c._t.request("DELETE", self._path, timeout=c.lifecycle_timeout)


class Databases:
    """``client.databases``: create, get and list the organisation's databases with this client."""

    def __init__(self, client: Client):
        self._c = client

    def create(self, name: str, *, size_mb: Optional[int] = None, idle_seconds: Optional[int] = None,
               metadata: Optional[Mapping[str, str]] = None) -> Database:
        """As ``Database.create``."""
        return Database.create(name, size_mb=size_mb, idle_seconds=idle_seconds, metadata=metadata, client=self._c)

    def get(self, database_id: str) -> Database:
        """As ``Database.get``."""
        return Database.get(database_id, client=self._c)

    def list(self) -> List[Database]:
        """As ``Database.list``."""
        return Database.list(client=self._c)


def attachment(v: Any) -> Dict[str, Any]:
    """{id[, env]} of a ``databases=`` entry of ``Sandbox.create``: a Database, its id, a tuple
    (database or id, env) or a dict {id, env}; without env moatd uses ``DATABASE_URL``."""
    env: Any = None
    if isinstance(v, Mapping):
        unknown = set(v) - {"id", "env"}
        if unknown:
            raise ValueError("a databases entry has only id and env, got %s" % ", ".join(sorted(map(str, unknown))))
        db, env = v.get("id"), v.get("env")
    elif isinstance(v, (tuple, list)):
        if len(v) != 2:
            raise TypeError("a databases entry as a tuple is (database, env), got %r" % (v,))
        db, env = v
    else:
        db = v
    if isinstance(db, Database):
        db = db.id
    if not isinstance(db, str):
        raise TypeError("each database must be a Database, its id, (database, env) or {id, env}, got %s"
                        % type(db).__name__)
    _check.string("database id", db)
    out: Dict[str, Any] = {"id": db}
    if _check.string("database env", env, optional=True) is not None:
        if not _check._ENV_KEY.match(env):
            raise ValueError("database env %r is not a valid environment variable name" % env)
        out["env"] = env
    return out

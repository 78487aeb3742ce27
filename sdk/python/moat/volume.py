"""volume.py -- Volume: an organisation's file system that outlives its sandboxes.

    from moat import Sandbox, Volume

    vol = Volume.create("datasets", size_mb=512)
    with Sandbox.create(volumes=[("datasets", "/data")]) as sb:   # ("datasets", "/data", True): read-only
        sb.exec("echo kept > /data/note")
    print(vol.read("/note"))                                       # no sandbox needed
"""

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional
from urllib.parse import quote

from . import _check
from .client import _UNSET, Client, resolve
from .models import EntryInfo, WriteInfo


@dataclass
class VolumeAttachment:
    """A live sandbox that mounts the volume."""
    sandbox_id: str
    path: str
    read_only: bool


@dataclass
class Volume:
    """A volume (``Volume.create``, ``Volume.get``, ``Volume.list``). ``size_mb`` is a hard limit
    (a write past it fails with ENOSPC inside); ``attached``: the live sandboxes that mount it (at
    most one read-write, any number read-only). Mount it with ``Sandbox.create(volumes=[...])``;
    read and write its files with no sandbox with ``read``/``write``/``remove``/``list_files``.
    A volume is not part of a snapshot: a hibernated or rolled back sandbox mounts it again as it
    is then; a fork's children mount it read-only (``ConflictError`` ``volume_attached`` when a
    process of the parent holds a file of it open for writing)."""
    name: str
    size_mb: int
    used_bytes: int = 0
    created_at: Optional[str] = None
    attached: List[VolumeAttachment] = field(default_factory=list)
    client: Optional[Client] = field(default=None, repr=False, compare=False)

    @classmethod
    def _from_json(cls, d: Dict[str, Any], c: Client) -> "Volume":
        return cls(name=d["name"], size_mb=int(d.get("size_mb") or 0), used_bytes=int(d.get("used_bytes") or 0),
                   created_at=d.get("created_at"),
                   attached=[VolumeAttachment(a["sandbox"], a["path"], bool(a["read_only"]))
                             for a in d.get("attached") or []], client=c)

    @property
    def _path(self) -> str:
        return "/v1/volumes/" + quote(self.name, safe="")

    @classmethod
    def create(cls, name: str, size_mb: int, *, client: Optional[Client] = None, api_url: Optional[str] = None,
               api_key: Optional[str] = None, request_timeout: Any = _UNSET) -> "Volume":
        """Creates volume name ([a-z0-9][a-z0-9_.-]{0,62}) of size_mb MiB (at least 16).
        ConflictError when the organisation has one of that name."""
        _check.string("name", name)
        _check.integer("size_mb", size_mb, 16, None, optional=False)
        c = resolve(client, api_url, api_key, request_timeout)
        body = {"name": name, "size_mb": size_mb}
        return cls._from_json(c._t.request("POST", "/v1/volumes", json_body=body, timeout=c.lifecycle_timeout)[1], c)

    @classmethod
    def get(cls, name: str, *, client: Optional[Client] = None, api_url: Optional[str] = None,
            api_key: Optional[str] = None, request_timeout: Any = _UNSET) -> "Volume":
        """The volume (NotFoundError when the organisation has none of that name)."""
        _check.string("name", name)
        c = resolve(client, api_url, api_key, request_timeout)
        return cls._from_json(c._t.request("GET", "/v1/volumes/" + quote(name, safe=""))[1], c)

    @classmethod
    def list(cls, *, client: Optional[Client] = None, api_url: Optional[str] = None, api_key: Optional[str] = None,
             request_timeout: Any = _UNSET) -> List["Volume"]:
        """The organisation's volumes, oldest first."""
        c = resolve(client, api_url, api_key, request_timeout)
        return [cls._from_json(v, c) for v in c._t.request("GET", "/v1/volumes")[1].get("volumes", [])]

    def _c(self) -> Client:
        if self.client is None:
            raise ValueError("this Volume has no client: get it with Volume.get or Volume.create")
        return self.client

    def refresh(self) -> "Volume":
        """Reads size, use and attachments again; returns self."""
        v = Volume.get(self.name, client=self._c())
        self.size_mb, self.used_bytes, self.created_at, self.attached = v.size_mb, v.used_bytes, v.created_at, v.attached
        return self

    def delete(self) -> None:
        """Deletes the volume and its data (ConflictError ``volume_in_use`` while a sandbox mounts it)."""
        self._c()._t.request("DELETE", self._path, timeout=self._c().lifecycle_timeout)

    def read(self, path: str, *, timeout: Any = "default") -> bytes:
        """The bytes of the file at path (relative to the volume's root). A symbolic link on the way
        is never followed (InvalidRequestError)."""
        _check.string("path", path)
        return self._c()._t.request("GET", self._path + "/files", query={"path": path}, raw=True, timeout=timeout)[1]

    def write(self, path: str, data: Any, *, mode: Optional[int] = None, timeout: Any = "default") -> WriteInfo:
        """Writes data (str as UTF-8, or bytes) to path, making parent directories; the upload
        replaces the file atomically. Files written here are root's in every sandbox."""
        _check.string("path", path)
        if isinstance(data, str):
            data = data.encode("utf-8")
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError("data must be str or bytes, got %s" % type(data).__name__)
        q: Dict[str, Any] = {"path": path}
        if _check.integer("mode", mode, 0, 0o7777) is not None:
            q["mode"] = "%o" % mode
        r = self._c()._t.request("PUT", self._path + "/files", query=q, body=bytes(data),
                                 headers={"Content-Type": "application/octet-stream"}, timeout=timeout)[1]
        return WriteInfo(path=r.get("path", path), size=int(r.get("size", 0)))

    def remove(self, path: str) -> None:
        """Removes the file, link or empty directory at path."""
        _check.string("path", path)
        self._c()._t.request("DELETE", self._path + "/files", query={"path": path})

    def list_files(self, path: str = "/") -> List[EntryInfo]:
        """The entries of the directory at path (links are listed, not followed)."""
        _check.string("path", path)
        r = self._c()._t.request("GET", self._path + "/files", query={"path": path})[1]
        return [EntryInfo.from_json(e) for e in r.get("entries", [])]

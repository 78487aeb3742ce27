"""The organisation's API keys (GET/POST /v1/keys, DELETE /v1/keys/{kid}), the calling key
(GET /v1/me) and the audit log (GET /v1/audit)."""

from typing import Any, Dict, Iterator, List, Optional, Union
from urllib.parse import quote

from . import _check
from .client import _UNSET, Client, resolve


def _client(client: Optional[Client], api_url: Optional[str], api_key: Optional[str]) -> Client:
    return resolve(client, api_url, api_key, _UNSET)


def _when(name: str, v: Union[str, int, None]) -> Optional[str]:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (str, int)):
        raise TypeError("%s must be an RFC 3339 string or Unix milliseconds" % name)
    return str(v)


class Keys:
    """API keys. Listing, creating and deleting need an admin key; me() works with any key."""

    @staticmethod
    def me(*, client: Optional[Client] = None, api_url: Optional[str] = None,
           api_key: Optional[str] = None) -> Dict[str, Any]:
        """The calling key and its org: {key: {id, name, role, expires_at}, org: {id}}."""
        return _client(client, api_url, api_key)._t.request("GET", "/v1/me")[1]

    @staticmethod
    def list(*, client: Optional[Client] = None, api_url: Optional[str] = None,
             api_key: Optional[str] = None) -> List[Dict[str, Any]]:
        """The org's keys, oldest first (no secrets)."""
        return _client(client, api_url, api_key)._t.request("GET", "/v1/keys")[1].get("keys", [])

    @staticmethod
    def create(name: str, *, role: Optional[str] = None, expires_at: Optional[str] = None,
               client: Optional[Client] = None, api_url: Optional[str] = None,
               api_key: Optional[str] = None) -> Dict[str, Any]:
        """A new key {id, name, role, created_at, expires_at, key}: `key` is the secret, answered
        this once. role: admin, member (default) or readonly; expires_at: RFC 3339, in the future."""
        _check.string("name", name)
        body: Dict[str, Any] = {"name": name}
        if _check.string("role", role, optional=True) is not None:
            if role not in ("admin", "member", "readonly"):
                raise ValueError("role must be admin, member or readonly, got %r" % role)
            body["role"] = role
        if _check.string("expires_at", expires_at, optional=True) is not None:
            body["expires_at"] = expires_at
        return _client(client, api_url, api_key)._t.request("POST", "/v1/keys", json_body=body)[1]

    @staticmethod
    def delete(key_id: str, *, client: Optional[Client] = None, api_url: Optional[str] = None,
               api_key: Optional[str] = None) -> None:
        """Revokes a key: its next request is 401."""
        _check.string("key_id", key_id)
        _client(client, api_url, api_key)._t.request("DELETE", "/v1/keys/" + quote(key_id, safe=""))


class Audit:
    """The org's audit log: every mutating call, once answered."""

    @staticmethod
    def list(*, start: Union[str, int, None] = None, end: Union[str, int, None] = None,
             target: Optional[str] = None, key: Optional[str] = None, limit: Optional[int] = None,
             cursor: Optional[str] = None, client: Optional[Client] = None, api_url: Optional[str] = None,
             api_key: Optional[str] = None) -> Dict[str, Any]:
        """One page {entries, next}: entries {seq, at, at_ms, key_id, method, route, path, target,
        status} oldest first; pass next as cursor for the following page (None on the last).
        start/end: RFC 3339 or Unix ms (end exclusive); target: an id or name; key: a key id."""
        q: Dict[str, Any] = {"from": _when("start", start), "to": _when("end", end)}
        for name, v in (("target", target), ("key", key), ("cursor", cursor)):
            if _check.string(name, v, optional=True) is not None:
                q[name] = v
        if _check.integer("limit", limit, 1, 1000) is not None:
            q["limit"] = str(limit)
        q = {k: v for k, v in q.items() if v is not None}
        return _client(client, api_url, api_key)._t.request("GET", "/v1/audit", query=q)[1]

    @staticmethod
    def iter(*, start: Union[str, int, None] = None, end: Union[str, int, None] = None,
             target: Optional[str] = None, key: Optional[str] = None, client: Optional[Client] = None,
             api_url: Optional[str] = None, api_key: Optional[str] = None) -> Iterator[Dict[str, Any]]:
        """Every entry matching, following the pages."""
        cursor = None
        while True:
            page = Audit.list(start=start, end=end, target=target, key=key, limit=1000, cursor=cursor,
                              client=client, api_url=api_url, api_key=api_key)
            yield from page.get("entries", [])
            cursor = page.get("next")
            if not cursor:
                return

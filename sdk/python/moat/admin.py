"""admin.py -- Admin: orgs and their quotas, with the platform admin key (`moatd key create --admin`).

    from moat import Admin

    admin = Admin(api_key=open(".moat/admin-key").read().strip())
    org = admin.create_org("acme")                 # org["admin_key"]["key"]: its first admin key, once
    admin.set_quotas("acme", max_sandboxes=50, creates_per_hour=500)
    print(admin.usage_now("acme")["max_sandboxes"])  # {"use": 0, "limit": 50}
    admin.delete_org("acme", force=True)           # kills and deletes everything it has

get_quotas and usage_now also work with a key of the org itself. A call over a quota raises a
MoatError with code "quota_exceeded" (HTTP 429); its body names the quota, the limit and the use.
"""

from typing import Any, Dict, List, Optional
from urllib.parse import quote

from . import _check
from .client import _UNSET, Client, resolve

QUOTAS = ("max_sandboxes", "creates_per_hour", "max_vcpus", "max_memory_mb", "max_ttl_seconds",
          "max_snapshot_bytes", "max_volumes", "max_volume_bytes", "max_databases", "max_database_bytes")


class Admin:
    """The platform admin's calls. Pass client=, or api_url=/api_key= (default: MOAT_API_URL and
    MOAT_API_KEY, which must then be the platform admin key for the org routes)."""

    def __init__(self, *, client: Optional[Client] = None, api_url: Optional[str] = None,
                 api_key: Optional[str] = None, request_timeout: Any = _UNSET):
        self.client = resolve(client, api_url, api_key, request_timeout)

    @staticmethod
    def _org(org_id: str) -> str:
        _check.string("org_id", org_id)
        return "/v1/orgs/" + quote(org_id, safe="")

    def create_org(self, name: str) -> Dict[str, Any]:
        """Creates org name ([a-z0-9][a-z0-9_.-]{0,62}) and its first admin key: the org as a dict
        with "admin_key" {"id", "name", "role", "key"} (the secret, answered this once)."""
        _check.string("name", name)
        return self.client._t.request("POST", "/v1/orgs", json_body={"name": name})[1]

    def list_orgs(self, *, limit: Optional[int] = None) -> List[Dict[str, Any]]:
        """Every org (paged through; limit: the page size, 1..1000)."""
        _check.integer("limit", limit, 1, 1000, optional=True)
        out: List[Dict[str, Any]] = []
        cursor = None
        while True:
            q: Dict[str, Any] = {}
            if limit is not None:
                q["limit"] = str(limit)
            if cursor:
                q["cursor"] = cursor
            page = self.client._t.request("GET", "/v1/orgs", query=q or None)[1]
            out.extend(page.get("orgs", []))
            cursor = page.get("next")
            if not cursor:
                return out

    def get_org(self, org_id: str) -> Dict[str, Any]:
        """The org (NotFoundError when there is none of that id)."""
        return self.client._t.request("GET", self._org(org_id))[1]

    def delete_org(self, org_id: str, *, force: bool = False) -> None:
        """Deletes the org and revokes its keys. Without force, ConflictError (org_not_empty) while it
        has live sandboxes, volumes, databases or snapshots; with force they are killed and deleted."""
        _check.boolean("force", force)
        q = {"force": "true"} if force else None
        self.client._t.request("DELETE", self._org(org_id), query=q, timeout=self.client.lifecycle_timeout)

    def get_quotas(self, org_id: str) -> Dict[str, Optional[int]]:
        """Every quota of the org (None: unlimited)."""
        return self.client._t.request("GET", self._org(org_id) + "/quotas")[1]

    def set_quotas(self, org_id: str, quotas: Optional[Dict[str, Optional[int]]] = None,
                   **kw: Optional[int]) -> Dict[str, Optional[int]]:
        """Replaces the org's quotas (a dict and/or keywords: max_sandboxes=50, ...; absent or None:
        unlimited) and returns them."""
        body: Dict[str, Any] = dict(quotas or {})
        body.update(kw)
        for k, v in body.items():
            if k not in QUOTAS:
                raise ValueError("unknown quota %r (%s)" % (k, ", ".join(QUOTAS)))
            _check.integer(k, v, 0, 2 ** 53, optional=True)
        return self.client._t.request("PUT", self._org(org_id) + "/quotas", json_body=body)[1]

    def usage_now(self, org_id: str) -> Dict[str, Dict[str, Optional[int]]]:
        """The org's use against each quota now: {quota: {"use": n, "limit": n or None}}."""
        return self.client._t.request("GET", self._org(org_id) + "/usage/now")[1]["usage"]

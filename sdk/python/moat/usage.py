"""moat.usage -- metering: the organisation's use (GET /v1/usage) and a sandbox's metrics, now or
as its recorded history (GET /v1/sandboxes/{id}/metrics). ``Client.usage`` and
``Sandbox.metrics`` call these."""

import datetime
from typing import Any, Dict, List, Optional, Union

from . import _check
from ._http import Transport

TimeArg = Union[None, int, str, datetime.datetime]

GROUPS = ("sandbox", "org", "template")


def time_param(name: str, v: TimeArg) -> Optional[str]:
    """A time as moatd takes it: Unix ms (int), RFC 3339 (str) or a datetime (naive = UTC)."""
    if v is None:
        return None
    if isinstance(v, bool):
        raise TypeError("%s must be Unix ms, an RFC 3339 string or a datetime" % name)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, datetime.datetime):
        if v.tzinfo is None:
            v = v.replace(tzinfo=datetime.timezone.utc)
        return str(int(v.timestamp() * 1000))
    if isinstance(v, str):
        return v
    raise TypeError("%s must be Unix ms, an RFC 3339 string or a datetime, got %s" % (name, type(v).__name__))


def usage(t: Transport, from_: TimeArg = None, to: TimeArg = None, group_by: Optional[str] = None,
          bucket: Optional[int] = None) -> List[Dict[str, Any]]:
    _check.string("group_by", group_by, optional=True)
    if group_by is not None and group_by not in GROUPS and not group_by.startswith("metadata."):
        raise ValueError("group_by must be sandbox, org, template or metadata.KEY, got %r" % group_by)
    _check.integer("bucket", bucket, lo=60, hi=86400)
    q = {k: v for k, v in (("from", time_param("from_", from_)), ("to", time_param("to", to)),
                           ("group_by", group_by), ("bucket", None if bucket is None else str(bucket)))
         if v is not None}
    return t.request("GET", "/v1/usage", query=q or None)[1]


def metrics(t: Transport, path: str, from_: TimeArg = None, to: TimeArg = None,
            limit: Optional[int] = None) -> Dict[str, Any]:
    _check.integer("limit", limit, lo=1, hi=10000)
    q = {k: v for k, v in (("from", time_param("from_", from_)), ("to", time_param("to", to)),
                           ("limit", None if limit is None else str(limit))) if v is not None}
    return t.request("GET", path + "/metrics", query=q or None)[1]

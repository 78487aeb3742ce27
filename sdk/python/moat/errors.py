"""errors.py -- the exceptions the SDK raises.

Every error moatd answers (a JSON body ``{"code", "message"}`` with an HTTP status) reaches the
caller as one of these classes, carrying the server's ``code``, ``message`` and ``status``:

====================  ========================================================
400, 413, 414         InvalidRequestError
401                   AuthenticationError
404                   NotFoundError (also another organisation's sandbox)
409                   ConflictError (state, ``already_exists``, ``tag_in_use``,
                      ``stdin_closed``, ``context_busy``)
501                   NotSupportedError (a route or field this moatd lacks;
                      also 503 checkpoints_unavailable)
504                   TimeoutError
anything else         SandboxError (403, 500, 502 ``sandbox_unreachable``, 503, 507)
====================  ========================================================

A template build that fails raises ``BuildError`` (code ``build_failed``, no status).

Client-side failures: ``ConnectionError`` (moatd unreachable, or a connection that dropped,
also in the middle of a stream) and ``TimeoutError`` (the client's own timeout ran out).
Both also derive from Python's built-in exception of the same name, so ``except TimeoutError``
written against the built-ins catches them too. Wrong argument types and values raise Python's
``TypeError`` / ``ValueError`` before any request is sent.
"""

import builtins
from typing import Any, Optional


class MoatError(Exception):
    """Base class of every error the SDK raises for a failed call (not for bad arguments).

    ``code`` is moatd's snake_case error code (``"not_found"``, ``"invalid_request"``, ...) or a
    client-side one (``"connection_error"``, ``"client_timeout"``); ``status`` is the HTTP status
    (``None`` when no answer came); ``message`` is the server's message."""

    def __init__(self, message: str, code: str = "error", status: Optional[int] = None, body: Any = None):
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status
        self.body = body

    def __str__(self) -> str:
        if self.status is not None:
            return "%s (%s, HTTP %d)" % (self.message, self.code, self.status)
        return "%s (%s)" % (self.message, self.code)


class InvalidRequestError(MoatError):
    """The server rejected the request's content (HTTP 400, 413, 414)."""


class AuthenticationError(MoatError):
    """The API key is missing or wrong (HTTP 401)."""


class NotFoundError(MoatError):
    """The sandbox, file, process or context does not exist (HTTP 404)."""


class ConflictError(MoatError):
    """The call conflicts with the current state (HTTP 409)."""


class TimeoutError(MoatError, builtins.TimeoutError):  # noqa: A001 - deliberately the same name
    """A server-side timeout (HTTP 504) or the client's own timeout ran out (status None)."""


class ConnectionError(MoatError, builtins.ConnectionError):  # noqa: A001
    """moatd could not be reached, or the connection dropped before the answer was complete."""


class SandboxError(MoatError):
    """Any other server error: 403 forbidden, 500, 502 sandbox_unreachable, 503, 507."""


class NotSupportedError(SandboxError):
    """This moatd does not support the route or field yet (HTTP 501 not_implemented), or its host
    cannot do it (HTTP 503 checkpoints_unavailable: no working CRIU for snapshots, fork, explore,
    hibernate)."""


class BuildError(MoatError):
    """A template build that ended failed (code ``build_failed``): ``error`` is moatd's account
    (the step, how its command ended and its last output lines), ``template`` and ``build_id`` the
    build's (its whole log: ``client.templates.logs(template, build_id)``)."""

    def __init__(self, message: str, *, template: str, build_id: Optional[str], error: Optional[str]):
        super().__init__(message, code="build_failed", status=None, body=None)
        self.template = template
        self.build_id = build_id
        self.error = error


def error_from_response(status: int, body: Any, fallback: str) -> MoatError:
    """Builds the typed exception for a non-2xx answer; body is the parsed JSON (or raw bytes)."""
    code, message = "http_%d" % status, fallback
    if isinstance(body, dict):
        if isinstance(body.get("code"), str):
            code = body["code"]
        if isinstance(body.get("message"), str):
            message = body["message"]
    elif isinstance(body, (bytes, bytearray)) and body:
        message = "%s: %s" % (fallback, bytes(body[:200]).decode("utf-8", "replace"))
    cls: type = SandboxError
    if status in (400, 413, 414):
        cls = InvalidRequestError
    elif status == 401:
        cls = AuthenticationError
    elif status == 404:
        cls = NotFoundError
    elif status == 409:
        cls = ConflictError
    elif status == 501 or code == "checkpoints_unavailable":
        cls = NotSupportedError
    elif status == 504:
        cls = TimeoutError
    return cls(message, code=code, status=status, body=body)


_BY_CODE = {
    "invalid_request": InvalidRequestError, "invalid_json": InvalidRequestError,
    "payload_too_large": InvalidRequestError, "unauthorized": AuthenticationError,
    "not_found": NotFoundError, "process_not_found": NotFoundError, "context_not_found": NotFoundError,
    "conflict": ConflictError, "already_exists": ConflictError, "context_busy": ConflictError,
    "not_implemented": NotSupportedError, "checkpoints_unavailable": NotSupportedError, "timeout": TimeoutError,
}


def error_from_event(data: Any, what: str) -> MoatError:
    """The typed exception for an `error` event that ended a stream ({"code", "message"})."""
    code = data.get("code") if isinstance(data, dict) else None
    message = data.get("message") if isinstance(data, dict) else None
    code = code if isinstance(code, str) else "stream_error"
    cls = _BY_CODE.get(code, SandboxError)
    return cls("%s: %s" % (what, message if isinstance(message, str) else code), code=code, status=None, body=data)

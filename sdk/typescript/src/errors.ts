// errors.ts -- the typed errors every SDK call rejects with.
//
// A server error ({"code", "message"} with an HTTP status) becomes the subclass for its status,
// carrying the server's code and message unchanged. Errors that never reached the server
// (connection refused, dropped mid-stream, client-side timeout) have status 0.

/** Any error from moatd or from talking to it. `code` is the server's snake_case code. */
export class MoatError extends Error {
  /** The server's error code (`not_found`, `invalid_request`, ...), or a client-side one
   *  (`connection_error`, `client_timeout`, `stream_ended`). */
  readonly code: string;
  /** The HTTP status, or 0 when no answer came. */
  readonly status: number;

  constructor(message: string, code: string, status: number, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
    this.code = code;
    this.status = status;
  }
}

/** 400: a field has the wrong type, is missing, out of range or unknown (the message names it). */
export class InvalidRequestError extends MoatError {}
/** 401: no API key, or a wrong one. */
export class AuthenticationError extends MoatError {}
/** 403: the sandbox's user may not do that (e.g. write a file it does not own). */
export class ForbiddenError extends MoatError {}
/** 404: no such sandbox (or another org's), file, process, context or snapshot. */
export class NotFoundError extends MoatError {}
/** 409: the sandbox's state does not allow it, the path exists, the tag is in use, the stdin is closed. */
export class ConflictError extends MoatError {}
/** 504 from moatd, or the client's own request timeout (code `client_timeout`, status 0). */
export class TimeoutError extends MoatError {}
/** 501: a route or field this moatd does not support yet. */
export class NotImplementedError extends MoatError {}
/** 502/503: the sandbox's guest did not answer, or moatd is stopping. */
export class SandboxUnavailableError extends MoatError {}
/** 503 checkpoints_unavailable: the host has no working CRIU (snapshots, fork, explore, hibernate, wake, rollback). */
export class CheckpointsUnavailableError extends SandboxUnavailableError {}
/** No answer: connection refused or reset, or a stream dropped or went silent before its end. */
export class ConnectionError extends MoatError {}

/** The typed error for an HTTP error answer. `body` is the parsed JSON body, if any. */
export function errorFromResponse(status: number, body: unknown, fallback: string): MoatError {
  let code = 'http_' + status;
  let message = fallback;
  if (body && typeof body === 'object') {
    const b = body as { code?: unknown; message?: unknown };
    if (typeof b.code === 'string') code = b.code;
    if (typeof b.message === 'string') message = b.message;
  }
  switch (status) {
    case 400:
    case 413:
    case 414:
      return new InvalidRequestError(message, code, status);
    case 401:
      return new AuthenticationError(message, code, status);
    case 403:
      return new ForbiddenError(message, code, status);
    case 404:
      return new NotFoundError(message, code, status);
    case 409:
      return new ConflictError(message, code, status);
    case 408:
    case 504:
      return new TimeoutError(message, code, status);
    case 501:
      return new NotImplementedError(message, code, status);
    case 502:
    case 503:
      if (code === 'checkpoints_unavailable') return new CheckpointsUnavailableError(message, code, status);
      return new SandboxUnavailableError(message, code, status);
    default:
      return new MoatError(message, code, status);
  }
}

/** The typed error for an `error` event inside a stream ({code, message}; no HTTP status). */
export function errorFromEvent(data: unknown): MoatError {
  const d = (data && typeof data === 'object' ? data : {}) as { code?: unknown; message?: unknown };
  const code = typeof d.code === 'string' ? d.code : 'stream_error';
  const message = typeof d.message === 'string' ? d.message : 'the stream reported an error';
  const status =
    code === 'sandbox_unreachable' ? 502 : code === 'unavailable' ? 503 : code === 'timeout' ? 504 : code === 'not_found' ? 404 : 0;
  return status ? errorFromResponse(status, { code, message }, message) : new MoatError(message, code, 0);
}

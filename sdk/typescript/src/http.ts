// http.ts -- one connection to moatd: base URL, API key, JSON requests, typed errors, timeouts.
//
// Requests go through Node's global fetch (undici) with a keep-alive agent of its own whose header
// and body timeouts are switched off: undici's defaults (300 s each) would cut off a long exec or a
// quiet stream. The SDK's timeouts are explicit instead: a per-request `timeoutMs`, exec's own
// deadline plus a margin, and an idle limit on streams (moatd sends a keep-alive every 15 s).

import { ConnectionError, MoatError, TimeoutError, errorFromResponse } from './errors.js';
import { fail, int, str } from './validate.js';

export const DEFAULT_API_URL = 'http://127.0.0.1:7070';

/** Where moatd is and how to authenticate. Each field falls back to the environment. */
export interface ConnectionOptions {
  /** moatd's base URL; default `MOAT_API_URL`, else http://127.0.0.1:7070. */
  apiUrl?: string;
  /** The API key; default `MOAT_API_KEY`. Required one way or the other. */
  apiKey?: string;
  /** Client-side limit for every non-streaming request that has no deadline of its own, in ms.
   *  Default: none (a create may wait for a template build). */
  requestTimeoutMs?: number;
}

export const CONNECTION_KEYS = ['apiUrl', 'apiKey', 'requestTimeoutMs'] as const;

type Query = Record<string, string | number | boolean | undefined>;

export interface RequestOptions {
  query?: Query | URLSearchParams;
  json?: unknown;
  /** A stream or async iterable is sent as it is read (chunked). */
  body?: Uint8Array | string | ReadableStream<Uint8Array> | AsyncIterable<Uint8Array>;
  headers?: Record<string, string>;
  /** Client-side limit in ms for this request (headers and body); null: none. Default: the connection's. */
  timeoutMs?: number | null;
  signal?: AbortSignal | undefined;
}

let dispatcherPromise: Promise<object | undefined> | undefined;

/** The keep-alive agent the SDK's requests use (an undici Agent with header/body timeouts off), or
 *  undefined where the runtime's fetch has none to offer (then fetch's defaults apply). */
export function sdkDispatcher(): Promise<object | undefined> {
  dispatcherPromise ??= (async () => {
    try {
      // Node creates its global undici agent on the first fetch; a data: URL does that locally.
      await (await fetch('data:,')).arrayBuffer();
      const g = (globalThis as Record<symbol, unknown>)[Symbol.for('undici.globalDispatcher.1')] as
        | { constructor?: new (o: object) => object }
        | undefined;
      const Agent = g?.constructor;
      if (typeof Agent === 'function' && Agent.name === 'Agent') {
        return new Agent({ headersTimeout: 0, bodyTimeout: 0, keepAliveTimeout: 10_000 });
      }
    } catch {
      /* fall back to fetch's own agent */
    }
    return undefined;
  })();
  return dispatcherPromise;
}

export class Connection {
  readonly apiUrl: string;
  readonly apiKey: string;
  readonly requestTimeoutMs: number | undefined;

  constructor(where: string, opts: ConnectionOptions = {}) {
    const url = opts.apiUrl ?? process.env.MOAT_API_URL ?? DEFAULT_API_URL;
    str(where, 'apiUrl', url);
    let u: URL;
    try {
      u = new URL(url);
    } catch {
      fail(where, `apiUrl is not a URL: ${JSON.stringify(url)}`);
    }
    if (u.protocol !== 'http:' && u.protocol !== 'https:') fail(where, `apiUrl must be http(s), got ${JSON.stringify(url)}`);
    this.apiUrl = url.replace(/\/+$/, '');
    const key = opts.apiKey ?? process.env.MOAT_API_KEY;
    if (key === undefined || key === '') fail(where, 'no API key: pass apiKey or set MOAT_API_KEY');
    this.apiKey = str(where, 'apiKey', key) as string;
    this.requestTimeoutMs = int(where, 'requestTimeoutMs', opts.requestTimeoutMs, 1, 2 ** 31 - 1);
  }

  url(path: string, query?: Query | URLSearchParams): string {
    let qs = '';
    if (query instanceof URLSearchParams) qs = query.toString();
    else if (query) {
      const p = new URLSearchParams();
      for (const [k, v] of Object.entries(query)) if (v !== undefined) p.append(k, String(v));
      qs = p.toString();
    }
    return this.apiUrl + path + (qs ? '?' + qs : '');
  }

  headers(extra?: Record<string, string>): Record<string, string> {
    return { Authorization: 'Bearer ' + this.apiKey, ...extra };
  }

  /** Sends a request and returns the response once its headers are in, or rejects with the typed
   *  error for a non-2xx answer. `done()` must be called when the caller has finished with the
   *  body (it clears the timeout). */
  async send(method: string, path: string, o: RequestOptions = {}): Promise<{ res: Response; done: () => void; ctl: AbortController }> {
    const ctl = new AbortController();
    const timeoutMs = o.timeoutMs === undefined ? this.requestTimeoutMs : o.timeoutMs ?? undefined;
    let timedOut = false;
    const timer =
      timeoutMs !== undefined
        ? setTimeout(() => {
            timedOut = true;
            ctl.abort(new TimeoutError(`${method} ${path}: no answer within ${timeoutMs} ms`, 'client_timeout', 0));
          }, timeoutMs)
        : undefined;
    const onAbort = () => ctl.abort(o.signal!.reason);
    if (o.signal) {
      if (o.signal.aborted) ctl.abort(o.signal.reason);
      else o.signal.addEventListener('abort', onAbort, { once: true });
    }
    const done = () => {
      if (timer) clearTimeout(timer);
      o.signal?.removeEventListener('abort', onAbort);
    };
    const headers = this.headers(o.headers);
    let body: RequestOptions['body'];
    if (o.json !== undefined) {
      headers['Content-Type'] = 'application/json';
      body = JSON.stringify(o.json);
    } else if (o.body !== undefined) {
      headers['Content-Type'] ??= 'application/octet-stream';
      body = o.body;
    }
    const init: Record<string, unknown> = { method, headers, body, signal: ctl.signal };
    if (body !== undefined && typeof body !== 'string' && !(body instanceof Uint8Array)) init.duplex = 'half';
    const dispatcher = await sdkDispatcher();
    if (dispatcher) init.dispatcher = dispatcher; // undici's (Node's fetch) own option
    let res: Response;
    try {
      res = await fetch(this.url(path, o.query), init as RequestInit);
    } catch (e) {
      done();
      throw this.wrap(e, method, path, ctl, timedOut);
    }
    if (!res.ok) {
      let text = '';
      try {
        text = await res.text();
      } catch (e) {
        done();
        throw this.wrap(e, method, path, ctl, timedOut);
      }
      done();
      let parsed: unknown;
      try {
        parsed = JSON.parse(text);
      } catch {
        parsed = undefined;
      }
      throw errorFromResponse(res.status, parsed, `${method} ${path}: HTTP ${res.status} ${text.slice(0, 200)}`);
    }
    return { res, done, ctl };
  }

  /** A request whose answer is JSON (or empty: 204 gives undefined). */
  async json<T = unknown>(method: string, path: string, o: RequestOptions = {}): Promise<T> {
    const { res, done, ctl } = await this.send(method, path, o);
    try {
      if (res.status === 204) {
        await res.body?.cancel();
        return undefined as T;
      }
      const text = await res.text();
      return (text ? JSON.parse(text) : undefined) as T;
    } catch (e) {
      throw this.wrap(e, method, path, ctl, false);
    } finally {
      done();
    }
  }

  /** A request whose answer is raw bytes. */
  async bytes(method: string, path: string, o: RequestOptions = {}): Promise<Uint8Array> {
    const { res, done, ctl } = await this.send(method, path, o);
    try {
      return new Uint8Array(await res.arrayBuffer());
    } catch (e) {
      throw this.wrap(e, method, path, ctl, false);
    } finally {
      done();
    }
  }

  /** Turns what fetch threw into a MoatError (or the caller's own abort reason). */
  wrap(e: unknown, method: string, path: string, ctl: AbortController, timedOut: boolean): unknown {
    if (e instanceof MoatError) return e;
    if (ctl.signal.aborted) {
      const r = ctl.signal.reason;
      if (r instanceof MoatError || timedOut) return r;
      return r ?? e; // the caller's AbortSignal: hand its reason back unchanged
    }
    const cause = (e as { cause?: { code?: string; message?: string } })?.cause;
    const why = cause?.code ?? cause?.message ?? (e as Error)?.message ?? String(e);
    return new ConnectionError(`${method} ${path}: connection to ${this.apiUrl} failed: ${why}`, 'connection_error', 0, { cause: e });
  }
}

export function seg(s: string | number): string {
  return encodeURIComponent(String(s));
}

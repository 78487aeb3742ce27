// pty.ts -- an interactive terminal in a sandbox over WebSocket (GET .../pty).
//
// Binary frames carry bytes both ways; the client sends `{"type":"resize","cols","rows"}` as a
// text frame; the server answers a bad resize with `{"type":"error","message"}` and closes with
// 1000 after the process's last output. Uses the `ws` package (an optional peer dependency) so the
// API key travels in a header; without it, a runtime's global WebSocket with `?api_key=`.

import { ConnectionError, MoatError, errorFromResponse } from './errors.js';
import { Connection, seg } from './http.js';
import * as v from './validate.js';

export interface PtyOptions {
  cols?: number;
  rows?: number;
  /** Command to run (`/bin/sh -c CMD`); default a login shell. */
  cmd?: string;
  user?: string;
  /** Attach to an existing process (its kept output is replayed first) instead of starting one. */
  pid?: number;
  tag?: string;
  /** Data arriving before the first onData() listener is kept and handed to it. */
  onData?: (data: Uint8Array) => void;
  /** A `ws`-compatible WebSocket class to use instead of importing `ws`. */
  WebSocket?: unknown;
  /** Limit for the handshake, in ms (default 30000). */
  timeoutMs?: number;
}

export interface PtyExit {
  /** The WebSocket close code: 1000 when the process ended, 1001 moatd stopping, 1006 no close frame. */
  code: number;
  reason: string;
}

/** A live terminal. */
export interface Pty {
  /** Sends input (a string is sent as UTF-8). */
  write(data: string | Uint8Array): void;
  resize(cols: number, rows: number): void;
  /** Registers a listener for output; returns a function that removes it. */
  onData(cb: (data: Uint8Array) => void): () => void;
  /** Errors the server reports in-band (e.g. a bad resize); the terminal stays open. */
  onError(cb: (message: string) => void): () => void;
  /** Resolves when the terminal closes (the process ended, or close() was called). */
  readonly exited: Promise<PtyExit>;
  /** Closes the WebSocket; a process the pty started is killed by the server. */
  close(): void;
}

type WsLike = {
  binaryType: string;
  readyState: number;
  send(d: unknown): void;
  close(code?: number, reason?: string): void;
  on?: (ev: string, cb: (...a: any[]) => void) => void;
  addEventListener?: (ev: string, cb: (e: any) => void) => void;
};

async function loadWs(explicit: unknown): Promise<{ ctor: any; node: boolean }> {
  if (explicit !== undefined) {
    if (typeof explicit !== 'function') v.fail('sandbox.pty', 'WebSocket must be a WebSocket class');
    return { ctor: explicit, node: true };
  }
  try {
    const mod: any = await import('ws');
    return { ctor: mod.WebSocket ?? mod.default, node: true };
  } catch {
    const g = (globalThis as any).WebSocket;
    if (typeof g === 'function') return { ctor: g, node: false };
    throw new MoatError('sandbox.pty needs the `ws` package (npm install ws) or a global WebSocket', 'missing_dependency', 0);
  }
}

export async function openPty(conn: Connection, sandboxId: string, opts?: PtyOptions): Promise<Pty> {
  const where = 'sandbox.pty';
  const o = v.options<PtyOptions>(where, opts, ['cols', 'rows', 'cmd', 'user', 'pid', 'tag', 'onData', 'WebSocket', 'timeoutMs']);
  const query: Record<string, string> = {};
  const cols = v.int(where, 'cols', o.cols, 1, 1000);
  const rows = v.int(where, 'rows', o.rows, 1, 1000);
  if (cols !== undefined) query.cols = String(cols);
  if (rows !== undefined) query.rows = String(rows);
  if (v.str(where, 'cmd', o.cmd, { optional: true }) !== undefined) query.cmd = o.cmd!;
  if (v.str(where, 'user', o.user, { optional: true }) !== undefined) query.user = o.user!;
  if (v.int(where, 'pid', o.pid, 1, 999_999_999) !== undefined) query.pid = String(o.pid);
  if (v.str(where, 'tag', o.tag, { optional: true }) !== undefined) query.tag = o.tag!;
  if ([o.cmd, o.pid, o.tag].filter((x) => x !== undefined).length > 1) v.fail(where, 'give at most one of cmd, pid, tag');
  const first = v.fn<(d: Uint8Array) => void>(where, 'onData', o.onData);
  const timeoutMs = v.int(where, 'timeoutMs', o.timeoutMs, 1, 2 ** 31 - 1) ?? 30_000;
  const { ctor, node } = await loadWs(o.WebSocket);

  const wsUrl = new URL(conn.url(`/v1/sandboxes/${seg(sandboxId)}/pty`, query));
  wsUrl.protocol = wsUrl.protocol === 'https:' ? 'wss:' : 'ws:';
  if (!node) wsUrl.searchParams.set('api_key', conn.apiKey);
  const ws: WsLike = node ? new ctor(wsUrl.toString(), { headers: conn.headers(), perMessageDeflate: false }) : new ctor(wsUrl.toString());
  ws.binaryType = node ? 'nodebuffer' : 'arraybuffer';

  const dataCbs = new Set<(d: Uint8Array) => void>();
  const errCbs = new Set<(m: string) => void>();
  if (first) dataCbs.add(first);
  const early: Uint8Array[] = [];
  let resolveExit!: (e: PtyExit) => void;
  const exited = new Promise<PtyExit>((r) => (resolveExit = r));
  const on = (ev: string, cb: (...a: any[]) => void) => {
    if (node && ws.on) ws.on(ev, cb);
    else ws.addEventListener!(ev, cb);
  };
  const deliver = (d: Uint8Array) => {
    if (dataCbs.size === 0) early.push(d);
    else for (const cb of dataCbs) cb(d);
  };

  await new Promise<void>((resolve, reject) => {
    let settled = false;
    const timer = setTimeout(() => {
      if (settled) return;
      settled = true;
      try {
        ws.close();
      } catch {
        /* not open yet */
      }
      reject(new ConnectionError(`${where}: no WebSocket handshake within ${timeoutMs} ms`, 'client_timeout', 0));
    }, timeoutMs);
    const settle = (err?: unknown) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      if (err) reject(err);
      else resolve();
    };
    on('open', () => settle());
    if (node) {
      // ws: a non-101 answer; read moatd's JSON error for the typed error.
      on('unexpected-response', (req: any, res: any) => {
        let text = '';
        const sock = res.socket; // Node's keep-alive agent would keep it (and the process) alive
        res.setEncoding('utf8');
        res.on('data', (c: string) => (text += c));
        res.on('end', () => {
          let body: unknown;
          try {
            body = JSON.parse(text);
          } catch {
            body = undefined;
          }
          req.destroy(); // ws leaves the refused request to us
          sock?.destroy();
          settle(errorFromResponse(res.statusCode, body, `${where}: HTTP ${res.statusCode}`));
          resolveExit({ code: 1006, reason: 'handshake refused' });
        });
        res.on('error', (e: Error) => settle(new ConnectionError(`${where}: ${e.message}`, 'connection_error', 0, { cause: e })));
      });
    }
    on('error', (e: any) => {
      const err = e?.error ?? e;
      settle(new ConnectionError(`${where}: ${err?.message ?? 'WebSocket error'}`, 'connection_error', 0, { cause: err }));
    });
    on('message', (a: any, isBinary?: boolean) => {
      // ws: (data, isBinary); DOM: MessageEvent
      let data: unknown = a;
      let binary = isBinary;
      if (!node) {
        data = a.data;
        binary = typeof data !== 'string';
      }
      if (binary) {
        const u8 = data instanceof ArrayBuffer ? new Uint8Array(data) : new Uint8Array((data as Buffer).buffer, (data as Buffer).byteOffset, (data as Buffer).byteLength);
        deliver(u8);
        return;
      }
      const text = typeof data === 'string' ? data : new TextDecoder().decode(data as Uint8Array);
      try {
        const j = JSON.parse(text);
        if (j && j.type === 'error') {
          for (const cb of errCbs) cb(String(j.message));
          return;
        }
      } catch {
        /* plain text output */
      }
      deliver(new TextEncoder().encode(text));
    });
    on('close', (a: any, b?: any) => {
      const code = node ? (a as number) : a.code;
      const reason = node ? String(b ?? '') : String(a.reason ?? '');
      settle(new ConnectionError(`${where}: closed during the handshake (${code})`, 'connection_error', 0));
      resolveExit({ code, reason });
    });
  });

  const OPEN = 1;
  return {
    write(data: string | Uint8Array) {
      const d = v.bytesLike('pty.write', 'data', data);
      if (ws.readyState !== OPEN) throw new ConnectionError('pty.write: the terminal is closed', 'stream_closed', 0);
      ws.send(typeof d === 'string' ? new TextEncoder().encode(d) : d);
    },
    resize(c: number, r: number) {
      v.int('pty.resize', 'cols', c, 1, 1000, false);
      v.int('pty.resize', 'rows', r, 1, 1000, false);
      if (ws.readyState !== OPEN) throw new ConnectionError('pty.resize: the terminal is closed', 'stream_closed', 0);
      ws.send(JSON.stringify({ type: 'resize', cols: c, rows: r }));
    },
    onData(cb: (d: Uint8Array) => void) {
      v.fn('pty.onData', 'callback', cb);
      if (cb === undefined) v.fail('pty.onData', 'callback is required');
      dataCbs.add(cb);
      for (const d of early.splice(0)) cb(d);
      return () => dataCbs.delete(cb);
    },
    onError(cb: (m: string) => void) {
      v.fn('pty.onError', 'callback', cb);
      if (cb === undefined) v.fail('pty.onError', 'callback is required');
      errCbs.add(cb);
      return () => errCbs.delete(cb);
    },
    exited,
    close() {
      try {
        ws.close(1000);
      } catch {
        /* already closed */
      }
    },
  };
}

// logs.ts -- a sandbox's output log (Sandbox.logs): every process's start, output and exit, and
// the sandbox's lifecycle transitions, in time order (GET /v1/sandboxes/{id}/logs).

import { MoatError } from './errors.js';
import { Connection, seg } from './http.js';
import { DEFAULT_IDLE_TIMEOUT_MS, eventJson, outputChunk, readSse } from './sse.js';
import * as v from './validate.js';

/** One entry. type: 'output' (stream stdout|stderr|pty, pid, tag, data/text), 'process' (event
 *  start|exit: argv, exit_code, ...), 'lifecycle' (event created|paused|resumed|hibernated|woken|
 *  killed|...; reason), 'oom', or 'dropped' (bytes lost; reason 'bound' when the log's size bound
 *  dropped its oldest entries, 'unread' when output went by faster than moatd took it). atMs:
 *  Unix milliseconds (undefined for a bound's marker); raw: the JSON entry. */
export interface LogEntry {
  type: string;
  atMs?: number;
  stream?: 'stdout' | 'stderr' | 'pty';
  pid?: number;
  tag?: string;
  event?: string;
  reason?: string;
  bytes?: number;
  data?: Uint8Array;
  text?: string;
  raw: Record<string, unknown>;
}

export interface LogsOptions {
  /** Go on with new entries as they come, until the sandbox is killed (default false). */
  follow?: boolean;
  /** Only entries at or after this time: a Date, Unix milliseconds or an RFC 3339 string. */
  since?: Date | number | string;
  signal?: AbortSignal;
}

function entry(where: string, d: Record<string, unknown>): LogEntry {
  const e: LogEntry = { type: String(d.type), raw: d };
  if (typeof d.at_ms === 'number') e.atMs = d.at_ms;
  if (typeof d.stream === 'string') e.stream = d.stream as LogEntry['stream'];
  if (typeof d.pid === 'number') e.pid = d.pid;
  if (typeof d.tag === 'string') e.tag = d.tag;
  if (typeof d.event === 'string') e.event = d.event;
  if (typeof d.reason === 'string') e.reason = d.reason;
  if (typeof d.bytes === 'number') e.bytes = d.bytes;
  if (e.type === 'output') {
    const c = outputChunk(where, d);
    e.data = c.bytes;
    e.text = c.text;
  }
  return e;
}

function sinceParam(where: string, since: unknown): string | undefined {
  if (since === undefined) return undefined;
  if (since instanceof Date) return String(since.getTime());
  if (typeof since === 'number' && Number.isFinite(since)) return String(Math.trunc(since));
  if (typeof since === 'string') return since;
  throw new MoatError(`${where}: since must be a Date, Unix milliseconds or an RFC 3339 string`, 'invalid_argument', 0);
}

/** The log of sandbox id through conn: an async iterable of entries. */
export async function* sandboxLogs(conn: Connection, id: string, opts?: LogsOptions): AsyncGenerator<LogEntry> {
  const where = 'Sandbox.logs';
  const o = v.options<LogsOptions>(where, opts, ['follow', 'since', 'signal']);
  const follow = v.bool(where, 'follow', o.follow) ?? false;
  const query: Record<string, string> = {};
  if (follow) query.follow = 'true';
  const since = sinceParam(where, o.since);
  if (since !== undefined) query.since = since;
  const src = await conn.send('GET', `/v1/sandboxes/${seg(id)}/logs`, {
    query,
    headers: { Accept: 'text/event-stream' },
    timeoutMs: null,
    signal: v.signalOpt(where, o.signal),
  });
  for await (const item of readSse(src, where, DEFAULT_IDLE_TIMEOUT_MS)) {
    if (item.kind !== 'event') continue;
    const d = eventJson(where, item);
    if (item.event === 'error') throw new MoatError(`${where}: ${String(d.message)}`, String(d.code ?? 'error'), 0);
    yield entry(where, d);
  }
}

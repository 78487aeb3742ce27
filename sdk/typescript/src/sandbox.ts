// sandbox.ts -- the Sandbox class: create/connect/list, exec (blocking, streamed, background),
// files, code contexts, PTY, time travel and kill.

import { metricsHistory } from './usage.js';
import type { MetricsRange, MetricsSample } from './usage.js';
import { NotFoundError } from './errors.js';
import { CONNECTION_KEYS, Connection, ConnectionOptions, seg } from './http.js';
import { CodeContext, Language } from './context.js';
import { Files } from './files.js';
import { ExitInfo, OutputCallback, ProcessInfo, SandboxProcess, consumeOutput, processInfo } from './process.js';
import { Pty, PtyOptions, openPty } from './pty.js';
import { DEFAULT_IDLE_TIMEOUT_MS, readSse } from './sse.js';
import * as v from './validate.js';
import type { VolumeMount } from './volume.js';
import { DatabaseAttachment, databaseAttachment } from './database.js';
import { LogEntry, LogsOptions, sandboxLogs } from './logs.js';

export type SandboxState = 'creating' | 'running' | 'paused' | 'hibernated' | 'killed';

/** A sandbox as moatd describes it. */
export interface SandboxInfo {
  id: string;
  template: string;
  state: SandboxState;
  createdAt: string;
  /** null when persistent. */
  expiresAt: string | null;
  ttlSeconds: number;
  persistent: boolean;
  metadata: Record<string, string>;
  cpu: number;
  memoryMb: number;
  pids: number;
  diskMb: number;
  killedReason: string | null;
  killedAt: string | null;
  pausedAt: string | null;
  /** The parent's id, for a fork. */
  forkedFrom: string | null;
  /** The snapshot it was started from (or rolled back to). */
  fromSnapshot: string | null;
  /** Idle hibernation, when set. */
  idle: { hibernateAfterSeconds: number } | null;
  /** The volumes it mounts ([] when none, and once killed). */
  volumes: { name: string; path: string; readOnly: boolean }[];
  /** Every field moatd sent, as sent (snake_case). */
  raw: Record<string, unknown>;
}

export interface CreateOptions extends ConnectionOptions {
  /** Template name (default "base"; "code-interpreter" has python3 with its data libraries, and node). */
  template?: string;
  /** Lifetime in seconds, 1..2592000 (default 3600). */
  ttlSeconds?: number;
  /** Survives its TTL and is not killed when an `await using` block ends. */
  persistent?: boolean;
  metadata?: Record<string, string>;
  /** Environment for every command. */
  env?: Record<string, string>;
  cpu?: number;
  memoryMb?: number;
  pids?: number;
  diskMb?: number;
  /** Network policy object, passed to moatd as is (501 until moatd supports it). */
  network?: Record<string, unknown>;
  /** Start from a snapshot: its memory, processes and files (a new id). */
  fromSnapshot?: string;
  /** Persistent sandboxes: hibernate after this long without API calls or CPU use. */
  idle?: { hibernateAfterSeconds: number };
  /** Volumes to mount (at most 8; not with fromSnapshot). */
  volumes?: VolumeMount[];
  /** Databases whose connection URL goes into the environment of every command: a Database, its id, or
   *  {id, env} (env defaults to DATABASE_URL; at most 8, no variable twice). */
  databases?: DatabaseAttachment[];
}

/** A snapshot of a sandbox: memory, processes and disk. */
export interface SnapshotInfo {
  id: string;
  sandboxId: string;
  template: string;
  createdAt: string;
  memoryBytes: number;
  diskBytes: number;
  metadata: Record<string, string>;
  raw: Record<string, unknown>;
}

function snapshotInfo(j: Record<string, unknown>): SnapshotInfo {
  return {
    id: (j.id ?? j.snapshot_id) as string,
    sandboxId: j.sandbox_id as string,
    template: j.template as string,
    createdAt: j.created_at as string,
    memoryBytes: j.memory_bytes as number,
    diskBytes: j.disk_bytes as number,
    metadata: (j.metadata as Record<string, string>) ?? {},
    raw: j,
  };
}

export interface ListOptions extends ConnectionOptions {
  metadata?: Record<string, string>;
  state?: SandboxState;
  /** Only sandboxes of this template. */
  template?: string;
  /** 1..1000: one page of at most this many (absent: every match). */
  limit?: number;
  /** The `next` of the page before. */
  cursor?: string;
}

/** What Sandbox.list() answers: the sandboxes, with `next` (the cursor of the following page, null on
 *  the last, always null without a limit) and `total` (every sandbox matching the filters). */
export type SandboxPage = Sandbox[] & { next: string | null; total: number };

export interface ExecOptions {
  env?: Record<string, string>;
  cwd?: string;
  /** Run as this user (default root). */
  user?: string;
  /** Data for the command's stdin (a string is sent as UTF-8). Without it stdin is empty. */
  stdin?: string | Uint8Array;
  /** Kill the command after this long; the result then has timedOut true. Default: no limit. */
  timeoutMs?: number;
  /** Client-side limit for the whole request, in ms. Default: timeoutMs + 30 s when timeoutMs is
   *  set, else the connection's requestTimeoutMs, else none. */
  requestTimeoutMs?: number;
  signal?: AbortSignal;
}

export interface BackgroundExecOptions extends Omit<ExecOptions, 'requestTimeoutMs' | 'signal'> {
  background: true;
  /** A name to find the process by ([A-Za-z0-9_.-]{1,64}, not all digits). */
  tag?: string;
  /** Run on a pseudo-terminal of this size. */
  pty?: { cols?: number; rows?: number };
}

export interface ExecResult {
  stdout: string;
  stderr: string;
  /** -1 when killed by a signal (see `signal`). */
  exitCode: number;
  signal: number;
  durationMs: number;
  timedOut: boolean;
  /** The kernel killed the command because the sandbox ran out of memory (its memoryMb). */
  oomKilled: boolean;
  /** Some output was dropped (each stream keeps its first 16 MiB). */
  truncated: boolean;
  pid: number;
  /** The raw bytes, present only when the output was not valid UTF-8 (stdout/stderr then hold U+FFFD). */
  stdoutBytes?: Uint8Array;
  stderrBytes?: Uint8Array;
}

export interface ExecStreamOptions extends Omit<ExecOptions, 'requestTimeoutMs'> {
  onStdout?: OutputCallback;
  onStderr?: OutputCallback;
  /** Called with the pid once the process has started. */
  onStart?: (pid: number) => void;
  /** Kill the process when the stream goes away (signal aborted, connection lost). Default true. */
  killOnDisconnect?: boolean;
  tag?: string;
  pty?: { cols?: number; rows?: number };
  /** Reject when the stream is silent this long (moatd sends keep-alives every 15 s). Default 60000. */
  idleTimeoutMs?: number;
}

export interface ExploreBranch {
  cmd: string;
  timeoutMs?: number;
}

export interface ExploreOutcome {
  sandboxId: string;
  /** null when the branch's command could not run (see error). */
  exitCode: number | null;
  timedOut: boolean;
  /** The last 4 KiB of each stream. */
  stdoutTail: string;
  stderrTail: string;
  /** Files whose data or inode changed while the branch ran (deletions not listed). */
  filesChanged: string[];
  durationMs: number;
  /** Whether the branch's sandbox still exists. */
  alive: boolean;
  error: { code?: string; message?: string } | null;
  raw: Record<string, unknown>;
}

export interface ExploreResult {
  /** The promoted sandbox, or null when no branch won (or keep "best" awaits a choice). */
  winner: Sandbox | null;
  outcomes: ExploreOutcome[];
  keep: string;
  /** keep "best": pass to chooseExploreBranch() before expiresAt. */
  exploreId: string | null;
  expiresAt: string | null;
  raw: Record<string, unknown>;
}

const EXEC_KEYS = ['env', 'cwd', 'user', 'stdin', 'timeoutMs', 'requestTimeoutMs', 'signal', 'background', 'tag', 'pty'];
const STREAM_KEYS = ['env', 'cwd', 'user', 'stdin', 'timeoutMs', 'signal', 'onStdout', 'onStderr', 'onStart', 'killOnDisconnect', 'tag', 'pty', 'idleTimeoutMs'];
const CREATE_KEYS = [...CONNECTION_KEYS, 'template', 'ttlSeconds', 'persistent', 'metadata', 'env', 'cpu', 'memoryMb', 'pids', 'diskMb', 'network', 'fromSnapshot', 'idle', 'volumes', 'databases'];
const TAG_RE = /^(?![0-9]+$)[A-Za-z0-9_.-]{1,64}$/;
/** Extra time the client waits beyond an exec's own deadline (the kill and the answer). */
const EXEC_MARGIN_MS = 30_000;

export function sandboxInfo(j: Record<string, unknown>): SandboxInfo {
  return {
    id: j.id as string,
    template: j.template as string,
    state: j.state as SandboxState,
    createdAt: j.created_at as string,
    expiresAt: (j.expires_at as string | null) ?? null,
    ttlSeconds: j.ttl_seconds as number,
    persistent: Boolean(j.persistent),
    metadata: (j.metadata as Record<string, string>) ?? {},
    cpu: j.cpu as number,
    memoryMb: j.memory_mb as number,
    pids: j.pids as number,
    diskMb: j.disk_mb as number,
    killedReason: (j.killed_reason as string | null) ?? null,
    killedAt: (j.killed_at as string | null) ?? null,
    pausedAt: (j.paused_at as string | null) ?? null,
    forkedFrom: (j.forked_from as string | null) ?? null,
    fromSnapshot: (j.from_snapshot as string | null) ?? null,
    idle:
      j.idle && typeof j.idle === 'object'
        ? { hibernateAfterSeconds: (j.idle as Record<string, unknown>).hibernate_after_seconds as number }
        : null,
    volumes: ((j.volumes as Record<string, unknown>[] | undefined) ?? []).map((m) => ({
      name: m.name as string,
      path: m.path as string,
      readOnly: Boolean(m.read_only),
    })),
    raw: j,
  };
}

function connOpts(o: Partial<ConnectionOptions>): ConnectionOptions {
  const c: ConnectionOptions = {};
  if (o.apiUrl !== undefined) c.apiUrl = o.apiUrl;
  if (o.apiKey !== undefined) c.apiKey = o.apiKey;
  if (o.requestTimeoutMs !== undefined) c.requestTimeoutMs = o.requestTimeoutMs;
  return c;
}

function command(where: string, cmd: unknown): { cmd: string } | { argv: string[] } {
  if (typeof cmd === 'string') {
    if (cmd.length === 0) v.fail(where, 'cmd must not be empty');
    return { cmd };
  }
  if (Array.isArray(cmd)) {
    if (cmd.length === 0) v.fail(where, 'argv must not be empty');
    cmd.forEach((a, i) => {
      if (typeof a !== 'string') v.fail(where, `argv[${i}] must be a string, got ${v.describe(a)}`);
    });
    return { argv: cmd as string[] };
  }
  v.fail(where, `cmd must be a shell command string or an argv array of strings, got ${v.describe(cmd)}`);
}

/** The body fields exec, exec/stream and background exec share. */
function execBody(where: string, cmd: unknown, o: Partial<ExecStreamOptions & BackgroundExecOptions>): Record<string, unknown> {
  const body: Record<string, unknown> = command(where, cmd);
  const env = v.stringMap(where, 'env', o.env);
  if (env) body.env = env;
  if (v.str(where, 'cwd', o.cwd, { optional: true }) !== undefined) body.cwd = o.cwd;
  if (v.str(where, 'user', o.user, { optional: true }) !== undefined) body.user = o.user;
  if (o.stdin !== undefined) {
    const s = v.bytesLike(where, 'stdin', o.stdin);
    if (typeof s === 'string') body.stdin = s;
    else body.stdin_b64 = v.toBase64(s);
  }
  const t = v.int(where, 'timeoutMs', o.timeoutMs, 1, 86_400_000);
  if (t !== undefined) body.timeout_ms = t;
  if (o.tag !== undefined) {
    v.str(where, 'tag', o.tag);
    if (!TAG_RE.test(o.tag)) v.fail(where, `tag must match [A-Za-z0-9_.-]{1,64} and not be all digits, got ${JSON.stringify(o.tag)}`);
    body.tag = o.tag;
  }
  if (o.pty !== undefined) {
    const p = v.options<{ cols?: number; rows?: number }>(where + ' pty', o.pty, ['cols', 'rows']);
    const pty: Record<string, number> = {};
    if (v.int(where, 'pty.cols', p.cols, 1, 1000) !== undefined) pty.cols = p.cols!;
    if (v.int(where, 'pty.rows', p.rows, 1, 1000) !== undefined) pty.rows = p.rows!;
    body.pty = pty;
  }
  return body;
}

export class Sandbox {
  readonly id: string;
  /** What moatd said about the sandbox when this object last heard (refresh with getInfo()). */
  info: SandboxInfo;
  readonly files: Files;
  /** The connection this sandbox's calls use (apiUrl, apiKey). */
  readonly connection: Connection;

  private constructor(conn: Connection, info: SandboxInfo) {
    this.connection = conn;
    this.id = info.id;
    this.info = info;
    this.files = new Files(conn, info.id);
  }

  private p(sub = ''): string {
    return `/v1/sandboxes/${seg(this.id)}${sub}`;
  }

  /** Creates a sandbox and resolves once it runs. */
  static async create(opts?: CreateOptions): Promise<Sandbox> {
    const where = 'Sandbox.create';
    const o = v.options<CreateOptions>(where, opts, CREATE_KEYS);
    const conn = new Connection(where, connOpts(o));
    const body: Record<string, unknown> = {};
    if (v.str(where, 'template', o.template, { optional: true }) !== undefined) body.template = o.template;
    if (v.int(where, 'ttlSeconds', o.ttlSeconds, 1, 2_592_000) !== undefined) body.ttl_seconds = o.ttlSeconds;
    if (v.bool(where, 'persistent', o.persistent) !== undefined) body.persistent = o.persistent;
    if (v.stringMap(where, 'metadata', o.metadata)) body.metadata = o.metadata;
    if (v.stringMap(where, 'env', o.env)) body.env = o.env;
    if (v.num(where, 'cpu', o.cpu, 0.05, 64) !== undefined) body.cpu = o.cpu;
    if (v.int(where, 'memoryMb', o.memoryMb, 16, 2 ** 31 - 1) !== undefined) body.memory_mb = o.memoryMb;
    if (v.int(where, 'pids', o.pids, 8, 1_000_000) !== undefined) body.pids = o.pids;
    if (v.int(where, 'diskMb', o.diskMb, 16, 2 ** 31 - 1) !== undefined) body.disk_mb = o.diskMb;
    if (o.network !== undefined) {
      if (o.network === null || typeof o.network !== 'object' || Array.isArray(o.network)) v.fail(where, `network must be an object, got ${v.describe(o.network)}`);
      body.network = o.network;
    }
    if (v.str(where, 'fromSnapshot', o.fromSnapshot, { optional: true }) !== undefined) body.from_snapshot = o.fromSnapshot;
    if (o.idle !== undefined) {
      const idle = v.options<{ hibernateAfterSeconds: number }>(where + ' idle', o.idle, ['hibernateAfterSeconds']);
      body.idle = { hibernate_after_seconds: v.int(where, 'idle.hibernateAfterSeconds', idle.hibernateAfterSeconds, 1, 2_592_000, false) };
    }
    if (o.volumes !== undefined) {
      if (!Array.isArray(o.volumes)) v.fail(where, `volumes must be an array, got ${v.describe(o.volumes)}`);
      body.volumes = o.volumes.map((m, i) => {
        const mo = v.options<VolumeMount>(`${where} volumes[${i}]`, m, ['name', 'path', 'readOnly']);
        return {
          name: v.str(where, `volumes[${i}].name`, mo.name),
          path: v.str(where, `volumes[${i}].path`, mo.path),
          read_only: v.bool(where, `volumes[${i}].readOnly`, mo.readOnly) ?? false,
        };
      });
    }
    if (o.databases !== undefined) {
      if (!Array.isArray(o.databases)) v.fail(where, `databases must be an array, got ${v.describe(o.databases)}`);
      body.databases = o.databases.map((d, i) => databaseAttachment(where, i, d));
    }
    const j = await conn.json<Record<string, unknown>>('POST', '/v1/sandboxes', { json: body });
    return new Sandbox(conn, sandboxInfo(j));
  }

  /** An existing sandbox by id (rejects with NotFoundError if there is none; a killed one resolves with
   *  `info.state` "killed", and its calls then reject with NotFoundError). */
  static async connect(id: string, opts?: ConnectionOptions): Promise<Sandbox> {
    const where = 'Sandbox.connect';
    v.str(where, 'id', id);
    const o = v.options<ConnectionOptions>(where, opts, CONNECTION_KEYS);
    const conn = new Connection(where, connOpts(o));
    const j = await conn.json<Record<string, unknown>>('GET', `/v1/sandboxes/${seg(id)}`);
    return new Sandbox(conn, sandboxInfo(j));
  }

  /** The sandboxes this key can see, oldest first, filtered by metadata and state (killed ones only with
   *  state "killed"); with `limit`, one page: pass its `next` as `cursor` for the following one. */
  static async list(opts?: ListOptions): Promise<SandboxPage> {
    const where = 'Sandbox.list';
    const o = v.options<ListOptions>(where, opts, [...CONNECTION_KEYS, 'metadata', 'state', 'template', 'limit', 'cursor']);
    const conn = new Connection(where, connOpts(o));
    const q = new URLSearchParams();
    if (o.state !== undefined) {
      if (!['creating', 'running', 'paused', 'hibernated', 'killed'].includes(o.state as string)) {
        v.fail(where, `state must be one of creating, running, paused, hibernated, killed, got ${v.describe(o.state)}`);
      }
      q.append('state', o.state);
    }
    for (const [k, val] of Object.entries(v.stringMap(where, 'metadata', o.metadata) ?? {})) q.append('metadata.' + k, val);
    const template = v.str(where, 'template', o.template, { optional: true, nonEmpty: true });
    if (template !== undefined) q.append('template', template);
    const limit = v.int(where, 'limit', o.limit, 1, 1000);
    if (limit !== undefined) q.append('limit', String(limit));
    const cursor = v.str(where, 'cursor', o.cursor, { optional: true, nonEmpty: true });
    if (cursor !== undefined) q.append('cursor', cursor);
    const j = await conn.json<{ sandboxes: Record<string, unknown>[]; next?: string | null; total?: number }>('GET', '/v1/sandboxes', { query: q });
    const page = j.sandboxes.map((s) => new Sandbox(conn, sandboxInfo(s)));
    // not enumerable: the answer still compares, spreads and serialises as the plain array it was
    return Object.defineProperties(page, {
      next: { value: j.next ?? null, enumerable: false },
      total: { value: j.total ?? page.length, enumerable: false },
    }) as SandboxPage;
  }

  /** Every sandbox list() would return, fetched `pageSize` (1..1000, default 100) at a time as the
   *  iteration goes (`for await`); each one once, even while others are created or killed. */
  static async *all(opts?: Omit<ListOptions, 'limit' | 'cursor'> & { pageSize?: number }): AsyncGenerator<Sandbox> {
    const where = 'Sandbox.all';
    const { pageSize, ...rest } = v.options<Omit<ListOptions, 'limit' | 'cursor'> & { pageSize?: number }>(
      where, opts, [...CONNECTION_KEYS, 'metadata', 'state', 'template', 'pageSize']);
    const limit = v.int(where, 'pageSize', pageSize, 1, 1000) ?? 100;
    let cursor: string | null = null;
    do {
      const page: SandboxPage = await Sandbox.list({ ...rest, limit, ...(cursor ? { cursor } : {}) });
      yield* page;
      cursor = page.next;
    } while (cursor);
  }

  /** Fetches the sandbox's current description (and updates `info`). */
  /** GET /v1/sandboxes/{id}/metrics: without a range the sample of now (moatd's JSON); with one
   * ({from, to, limit}; `{}`: the whole retention) the recorded history, oldest first. */
  async metrics(): Promise<Record<string, unknown>>;
  async metrics(range: MetricsRange): Promise<MetricsSample[]>;
  async metrics(range?: MetricsRange): Promise<Record<string, unknown> | MetricsSample[]> {
    if (range === undefined) return this.connection.json<Record<string, unknown>>('GET', this.p('/metrics'));
    return metricsHistory(this.connection, this.id, range);
  }

  async getInfo(): Promise<SandboxInfo> {
    this.info = sandboxInfo(await this.connection.json('GET', this.p()));
    return this.info;
  }

  /** Changes the TTL (counted from now), persistence or metadata. */
  async update(opts: { ttlSeconds?: number; persistent?: boolean; metadata?: Record<string, string> }): Promise<SandboxInfo> {
    const where = 'sandbox.update';
    if (opts === undefined) v.fail(where, 'options are required');
    const o = v.options<{ ttlSeconds?: number; persistent?: boolean; metadata?: Record<string, string> }>(where, opts, ['ttlSeconds', 'persistent', 'metadata']);
    const body: Record<string, unknown> = {};
    if (v.int(where, 'ttlSeconds', o.ttlSeconds, 1, 2_592_000) !== undefined) body.ttl_seconds = o.ttlSeconds;
    if (v.bool(where, 'persistent', o.persistent) !== undefined) body.persistent = o.persistent;
    if (v.stringMap(where, 'metadata', o.metadata)) body.metadata = o.metadata;
    if (Object.keys(body).length === 0) v.fail(where, 'give at least one of ttlSeconds, persistent, metadata');
    this.info = sandboxInfo(await this.connection.json('PATCH', this.p(), { json: body }));
    return this.info;
  }

  /** Runs a command to its end: `cmd` as a shell string (`/bin/sh -c`) or an argv array.
   *  With `background: true` it returns at once with a process handle instead. */
  exec(cmd: string | string[], opts?: ExecOptions): Promise<ExecResult>;
  exec(cmd: string | string[], opts: BackgroundExecOptions): Promise<SandboxProcess>;
  async exec(cmd: string | string[], opts?: ExecOptions | BackgroundExecOptions): Promise<ExecResult | SandboxProcess> {
    const where = 'sandbox.exec';
    const o = v.options<ExecOptions & BackgroundExecOptions>(where, opts, EXEC_KEYS);
    const background = v.bool(where, 'background', o.background as unknown) ?? false;
    if (!background && (o.tag !== undefined || o.pty !== undefined)) v.fail(where, 'tag and pty need background: true (or use execStream)');
    if (background && (o.requestTimeoutMs !== undefined || o.signal !== undefined)) v.fail(where, 'requestTimeoutMs and signal do not apply to background: true');
    const body = execBody(where, cmd, o);
    if (background) {
      body.background = true;
      const j = await this.connection.json<{ pid: number; tag: string | null }>('POST', this.p('/exec'), { json: body });
      return new SandboxProcess(this.connection, this.id, j.pid, j.tag ?? null);
    }
    const rt = v.int(where, 'requestTimeoutMs', o.requestTimeoutMs, 1, 2 ** 31 - 1);
    const timeoutMs = rt ?? (o.timeoutMs !== undefined ? o.timeoutMs + EXEC_MARGIN_MS : undefined);
    const j = await this.connection.json<Record<string, unknown>>('POST', this.p('/exec'), {
      json: body,
      timeoutMs: timeoutMs ?? (this.connection.requestTimeoutMs !== undefined ? this.connection.requestTimeoutMs : null),
      signal: v.signalOpt(where, o.signal),
    });
    const r: ExecResult = {
      stdout: j.stdout as string,
      stderr: j.stderr as string,
      exitCode: j.exit_code as number,
      signal: (j.signal as number) ?? 0,
      durationMs: j.duration_ms as number,
      timedOut: Boolean(j.timed_out),
      oomKilled: Boolean(j.oom_killed),
      truncated: Boolean(j.truncated),
      pid: j.pid as number,
    };
    if (typeof j.stdout_b64 === 'string') r.stdoutBytes = v.fromBase64(j.stdout_b64);
    if (typeof j.stderr_b64 === 'string') r.stderrBytes = v.fromBase64(j.stderr_b64);
    return r;
  }

  /** Runs a command and hands its output to the callbacks as it arrives; resolves with the exit
   *  code (-1 when a signal killed it; see execStreamFull for the details). */
  async execStream(cmd: string | string[], opts?: ExecStreamOptions): Promise<number> {
    return (await this.execStreamFull(cmd, opts)).exitCode;
  }

  /** execStream, resolving with the exit code, the signal and whether the deadline fired. */
  async execStreamFull(cmd: string | string[], opts?: ExecStreamOptions): Promise<ExitInfo> {
    const where = 'sandbox.execStream';
    const o = v.options<ExecStreamOptions>(where, opts, STREAM_KEYS);
    const body = execBody(where, cmd, o);
    body.kill_on_disconnect = v.bool(where, 'killOnDisconnect', o.killOnDisconnect) ?? true;
    const hooks = {
      onStdout: v.fn<OutputCallback>(where, 'onStdout', o.onStdout),
      onStderr: v.fn<OutputCallback>(where, 'onStderr', o.onStderr),
      onStart: v.fn<(pid: number) => void>(where, 'onStart', o.onStart),
    };
    const idle = v.int(where, 'idleTimeoutMs', o.idleTimeoutMs, 1, 2 ** 31 - 1) ?? DEFAULT_IDLE_TIMEOUT_MS;
    const src = await this.connection.send('POST', this.p('/exec/stream'), {
      json: body,
      headers: { Accept: 'text/event-stream' },
      timeoutMs: null,
      signal: v.signalOpt(where, o.signal),
    });
    return consumeOutput(readSse(src, where, idle), where, hooks);
  }

  /** Running processes, and the last finished ones the sandbox keeps. */
  /** The sandbox's log: every process's output (stdout, stderr, pty) with its pid, starts and exits,
   *  and lifecycle lines, oldest first; with follow, new entries as they come until the kill. */
  logs(opts?: LogsOptions): AsyncGenerator<LogEntry> {
    return sandboxLogs(this.connection, this.id, opts);
  }

  async processes(): Promise<(ProcessInfo & { handle: SandboxProcess })[]> {
    const j = await this.connection.json<{ processes: Record<string, unknown>[] }>('GET', this.p('/processes'));
    return j.processes.map((p) => {
      const info = processInfo(p);
      return { ...info, handle: new SandboxProcess(this.connection, this.id, info.pid, info.tag) };
    });
  }

  /** A handle on a process by pid (no network call). */
  process(pid: number): SandboxProcess {
    v.int('sandbox.process', 'pid', pid, 1, 999_999_999, false);
    return new SandboxProcess(this.connection, this.id, pid, null);
  }

  /** Starts a persistent interpreter (python by default; use the code-interpreter template). */
  async createCodeContext(opts?: { language?: Language; cwd?: string }): Promise<CodeContext> {
    const where = 'sandbox.createCodeContext';
    const o = v.options<{ language?: Language; cwd?: string }>(where, opts, ['language', 'cwd']);
    if (o.language !== undefined && !['python', 'node', 'bash'].includes(o.language as string)) {
      v.fail(where, `language must be python, node or bash, got ${v.describe(o.language)}`);
    }
    const body: Record<string, unknown> = {};
    if (o.language !== undefined) body.language = o.language;
    if (v.str(where, 'cwd', o.cwd, { optional: true }) !== undefined) body.cwd = o.cwd;
    const j = await this.connection.json<Record<string, unknown>>('POST', this.p('/contexts'), { json: body });
    return new CodeContext(this.connection, this.id, j);
  }

  async listCodeContexts(): Promise<CodeContext[]> {
    const j = await this.connection.json<{ contexts: Record<string, unknown>[] }>('GET', this.p('/contexts'));
    return j.contexts.map((c) => new CodeContext(this.connection, this.id, c));
  }

  /** An interactive terminal over WebSocket (needs the `ws` package or a global WebSocket). */
  pty(opts?: PtyOptions): Promise<Pty> {
    return openPty(this.connection, this.id, opts);
  }

  // ---- time travel (issue 4): thin calls; a moatd without them answers 501 (NotImplementedError) ----

  private async transition(name: string): Promise<void> {
    const j = await this.connection.json<Record<string, unknown> | undefined>('POST', this.p('/' + name), { json: {} });
    if (j && typeof j === 'object' && j.id === this.id && typeof j.state === 'string') this.info = sandboxInfo(j);
  }

  /** Freezes every process (no CPU; memory kept; the TTL clock stops). */
  pause(): Promise<void> {
    return this.transition('pause');
  }
  resume(): Promise<void> {
    return this.transition('resume');
  }
  /** Writes memory and disk state to moatd's data dir and releases the memory; any request wakes it. */
  hibernate(): Promise<void> {
    return this.transition('hibernate');
  }
  wake(): Promise<void> {
    return this.transition('wake');
  }

  /** Captures memory, processes and disk while the sandbox keeps running. */
  async snapshot(opts?: { metadata?: Record<string, string> }): Promise<SnapshotInfo> {
    const o = v.options<{ metadata?: Record<string, string> }>('sandbox.snapshot', opts, ['metadata']);
    const body: Record<string, unknown> = {};
    if (v.stringMap('sandbox.snapshot', 'metadata', o.metadata)) body.metadata = o.metadata;
    return snapshotInfo(await this.connection.json<Record<string, unknown>>('POST', this.p('/snapshots'), { json: body }));
  }

  /** The org's snapshots (oldest first), or one sandbox's. */
  static async listSnapshots(opts?: ConnectionOptions & { sandboxId?: string }): Promise<SnapshotInfo[]> {
    const where = 'Sandbox.listSnapshots';
    const o = v.options<ConnectionOptions & { sandboxId?: string }>(where, opts, [...CONNECTION_KEYS, 'sandboxId']);
    const conn = new Connection(where, connOpts(o));
    const j = await conn.json<{ snapshots: Record<string, unknown>[] }>('GET', '/v1/snapshots', {
      query: { sandbox_id: v.str(where, 'sandboxId', o.sandboxId, { optional: true }) },
    });
    return j.snapshots.map(snapshotInfo);
  }

  /** One snapshot (NotFoundError when the org has none of that id). */
  static async getSnapshot(snapshotId: string, opts?: ConnectionOptions): Promise<SnapshotInfo> {
    const where = 'Sandbox.getSnapshot';
    v.str(where, 'snapshotId', snapshotId);
    const o = v.options<ConnectionOptions>(where, opts, CONNECTION_KEYS);
    return snapshotInfo(await new Connection(where, connOpts(o)).json('GET', `/v1/snapshots/${seg(snapshotId)}`));
  }

  /** Deletes a snapshot (snapshots outlive their sandbox). */
  static async deleteSnapshot(snapshotId: string, opts?: ConnectionOptions): Promise<void> {
    const where = 'Sandbox.deleteSnapshot';
    v.str(where, 'snapshotId', snapshotId);
    const o = v.options<ConnectionOptions>(where, opts, CONNECTION_KEYS);
    await new Connection(where, connOpts(o)).json('DELETE', `/v1/snapshots/${seg(snapshotId)}`);
  }

  /** Returns the sandbox, in place, to an earlier snapshot of itself. */
  async rollback(snapshotId: string): Promise<void> {
    v.str('sandbox.rollback', 'snapshotId', snapshotId);
    await this.transition2('rollback', { snapshot_id: snapshotId });
  }

  private async transition2(name: string, body: Record<string, unknown>): Promise<void> {
    const j = await this.connection.json<Record<string, unknown> | undefined>('POST', this.p('/' + name), { json: body });
    if (j && typeof j === 'object' && j.id === this.id && typeof j.state === 'string') this.info = sandboxInfo(j);
  }

  /** Creates `count` children (1..16) that start with this sandbox's memory, processes and disk. With
   *  databases "branch" each child gets its own branch of every database attached to this sandbox. */
  async forkTree(opts: { count: number; memory?: boolean; databases?: 'branch' }): Promise<Sandbox[]> {
    const where = 'sandbox.forkTree';
    if (opts === undefined) v.fail(where, 'options {count} are required');
    const o = v.options<{ count: number; memory?: boolean; databases?: string }>(where, opts, ['count', 'memory', 'databases']);
    const body: Record<string, unknown> = { count: v.int(where, 'count', o.count, 1, 16, false) };
    if (v.bool(where, 'memory', o.memory) !== undefined) body.memory = o.memory;
    if (v.str(where, 'databases', o.databases, { optional: true }) !== undefined) body.databases = o.databases;
    const j = await this.connection.json<{ sandboxes: Record<string, unknown>[] }>('POST', this.p('/fork'), { json: body });
    return j.sandboxes.map((s) => new Sandbox(this.connection, sandboxInfo(s)));
  }

  /** Forks once per branch, runs each branch's command concurrently and keeps one branch as an
   *  independent sandbox. Default keep "first_success": the first branch to exit 0 wins and the
   *  others are killed. With `score`, every branch is scored here (higher is better; a branch whose
   *  command could not run is never chosen), the best is chosen on the server and the rest are
   *  killed. keep "best" without `score` returns with every branch alive: choose one with
   *  chooseExploreBranch() before `expiresAt`. With databases "branch" each branch gets its own branch of
   *  every database attached to this sandbox. */
  async explore(opts: {
    branches: (string | ExploreBranch)[];
    keep?: 'first_success' | 'best';
    score?: (o: ExploreOutcome) => number | Promise<number>;
    databases?: 'branch';
  }): Promise<ExploreResult> {
    const where = 'sandbox.explore';
    if (opts === undefined) v.fail(where, 'options {branches} are required');
    const o = v.options<{ branches: (string | ExploreBranch)[]; keep?: string; score?: unknown; databases?: string }>(
      where, opts, ['branches', 'keep', 'score', 'databases']);
    if (!Array.isArray(o.branches) || o.branches.length === 0 || o.branches.length > 16) {
      v.fail(where, `branches must be an array of 1 to 16 commands, got ${v.describe(o.branches)}`);
    }
    const branches = o.branches.map((b, i) => {
      if (typeof b === 'string') return { cmd: v.str(where, `branches[${i}]`, b) };
      const bo = v.options<ExploreBranch>(where, b, ['cmd', 'timeoutMs']);
      const out: Record<string, unknown> = { cmd: v.str(where, `branches[${i}].cmd`, bo.cmd) };
      if (v.int(where, `branches[${i}].timeoutMs`, bo.timeoutMs, 1, 86_400_000) !== undefined) out.timeout_ms = bo.timeoutMs;
      return out;
    });
    const score = v.fn<(o: ExploreOutcome) => number | Promise<number>>(where, 'score', o.score);
    if (o.keep !== undefined && o.keep !== 'first_success' && o.keep !== 'best') {
      v.fail(where, `keep must be "first_success" or "best", got ${v.describe(o.keep)}`);
    }
    if (score && o.keep === 'first_success') v.fail(where, 'score needs keep "best" (or no keep)');
    const keep = score ? 'best' : o.keep;
    const body: Record<string, unknown> = { branches };
    if (keep !== undefined) body.keep = keep;
    if (v.str(where, 'databases', o.databases, { optional: true }) !== undefined) body.databases = o.databases;
    const j = await this.connection.json<Record<string, unknown>>('POST', this.p('/explore'), { json: body });
    const res = await this.exploreResult(j);
    if (!score) return res;
    let best: ExploreOutcome | undefined;
    let bestScore = -Infinity;
    for (const oc of res.outcomes) {
      if (oc.exitCode === null || oc.alive === false) continue;
      const sc = await score(oc);
      if (typeof sc !== 'number' || Number.isNaN(sc)) v.fail(where, `score must return a number, got ${v.describe(sc)}`);
      if (best === undefined || sc > bestScore) {
        best = oc;
        bestScore = sc;
      }
    }
    if (!best) return res; // nothing ran: the branches expire with the explore's TTL
    const chosen = await this.chooseExploreBranch(res.exploreId as string, best.sandboxId);
    return { ...res, winner: chosen };
  }

  /** keep "best": promotes one branch (the others are killed) and returns it. */
  async chooseExploreBranch(exploreId: string, sandboxId: string): Promise<Sandbox> {
    const where = 'sandbox.chooseExploreBranch';
    v.str(where, 'exploreId', exploreId);
    v.str(where, 'sandboxId', sandboxId);
    const j = await this.connection.json<Record<string, unknown>>('POST', this.p('/explore'), {
      json: { choose: { explore_id: exploreId, sandbox_id: sandboxId } },
    });
    const sbj = (j.sandbox ?? null) as Record<string, unknown> | null;
    if (sbj && typeof sbj.id === 'string') return new Sandbox(this.connection, sandboxInfo(sbj));
    const id = typeof j.winner === 'string' ? j.winner : sandboxId;
    return new Sandbox(this.connection, sandboxInfo(await this.connection.json('GET', `/v1/sandboxes/${seg(id)}`)));
  }

  private async exploreResult(j: Record<string, unknown>): Promise<ExploreResult> {
    const outcomes: ExploreOutcome[] = ((j.outcomes as Record<string, unknown>[]) ?? []).map((x) => ({
      sandboxId: x.sandbox_id as string,
      exitCode: (x.exit_code as number | null) ?? null,
      timedOut: Boolean(x.timed_out),
      stdoutTail: (x.stdout_tail as string) ?? '',
      stderrTail: (x.stderr_tail as string) ?? '',
      filesChanged: (x.files_changed as string[]) ?? [],
      durationMs: x.duration_ms as number,
      alive: x.alive === undefined ? true : Boolean(x.alive),
      error: (x.error as ExploreOutcome['error']) ?? null,
      raw: x,
    }));
    let winner: Sandbox | null = null;
    const w = j.winner;
    if (w && typeof w === 'object' && typeof (w as Record<string, unknown>).id === 'string') {
      winner = new Sandbox(this.connection, sandboxInfo(w as Record<string, unknown>));
    } else if (typeof w === 'string') {
      winner = new Sandbox(this.connection, sandboxInfo(await this.connection.json('GET', `/v1/sandboxes/${seg(w)}`)));
    }
    return {
      winner,
      outcomes,
      keep: (j.keep as string) ?? 'first_success',
      exploreId: (j.explore_id as string | null) ?? null,
      expiresAt: (j.expires_at as string | null) ?? null,
      raw: j,
    };
  }

  /** Kills the sandbox. Resolves true, or false when it was already gone. */
  async kill(): Promise<boolean> {
    try {
      await this.connection.json('DELETE', this.p());
      return true;
    } catch (e) {
      if (e instanceof NotFoundError) return false;
      throw e;
    }
  }

  /** `await using sb = await Sandbox.create()`: kills the sandbox at the block's end unless persistent. */
  async [Symbol.asyncDispose](): Promise<void> {
    if (!this.info.persistent) await this.kill();
  }
}

// process.ts -- processes in a sandbox: background commands, their stdin, signals and output streams.

import { ConnectionError, errorFromEvent } from './errors.js';
import { Connection, seg } from './http.js';
import { DEFAULT_IDLE_TIMEOUT_MS, SseItem, eventJson, outputChunk, readSse } from './sse.js';
import * as v from './validate.js';

/** Called with each chunk of output as it arrives: its text (UTF-8; ill-formed bytes replaced) and its raw bytes. */
export type OutputCallback = (text: string, bytes: Uint8Array) => void;

/** How a process ended. `exitCode` is -1 and `signal` > 0 when a signal killed it. */
export interface ExitInfo {
  exitCode: number;
  signal: number;
  timedOut: boolean;
}

/** A process as `GET .../processes` lists it. */
export interface ProcessInfo {
  pid: number;
  tag: string | null;
  cmd: string;
  argv: string[];
  startedAt: string;
  running: boolean;
  exitCode: number | null;
  signal: number | null;
  pty: boolean;
  background: boolean;
}

export const SIGNALS = ['TERM', 'KILL', 'INT', 'HUP', 'QUIT', 'USR1', 'USR2', 'STOP', 'CONT'] as const;
export type SignalName = (typeof SIGNALS)[number];

export interface StreamOptions {
  onStdout?: OutputCallback;
  onStderr?: OutputCallback;
  /** Replay the output the sandbox kept since the process started (default true). */
  replay?: boolean;
  signal?: AbortSignal;
  /** Reject when the stream is silent this long (moatd sends keep-alives every 15 s). Default 60000. */
  idleTimeoutMs?: number;
}

export function processInfo(j: Record<string, unknown>): ProcessInfo {
  return {
    pid: j.pid as number,
    tag: (j.tag as string | null) ?? null,
    cmd: j.cmd as string,
    argv: (j.argv as string[]) ?? [],
    startedAt: j.started_at as string,
    running: Boolean(j.running),
    exitCode: (j.exit_code as number | null) ?? null,
    signal: (j.signal as number | null) ?? null,
    pty: Boolean(j.pty),
    background: Boolean(j.background),
  };
}

export interface ConsumeHooks {
  onStdout?: OutputCallback | undefined;
  onStderr?: OutputCallback | undefined;
  onStart?: ((pid: number) => void) | undefined;
  onProcess?: ((p: ProcessInfo) => void) | undefined;
}

/** Reads an output stream (start/process, stdout, stderr, dropped, exit, error) to its `exit` event.
 *  Rejects with the stream's error event, or ConnectionError if it ends before `exit`. */
export async function consumeOutput(items: AsyncGenerator<SseItem>, where: string, h: ConsumeHooks): Promise<ExitInfo> {
  for await (const it of items) {
    if (it.kind !== 'event') continue;
    switch (it.event) {
      case 'stdout':
      case 'stderr': {
        const c = outputChunk(where, eventJson(where, it));
        const cb = it.event === 'stdout' ? h.onStdout : h.onStderr;
        if (cb) cb(c.text, c.bytes);
        break;
      }
      case 'start':
        h.onStart?.(eventJson(where, it).pid as number);
        break;
      case 'process':
        h.onProcess?.(processInfo(eventJson(where, it)));
        break;
      case 'exit': {
        const d = eventJson(where, it);
        await items.return(undefined);
        return { exitCode: d.exit_code as number, signal: (d.signal as number) ?? 0, timedOut: Boolean(d.timed_out) };
      }
      case 'error':
        throw errorFromEvent(eventJson(where, it));
      default:
        break; // `dropped` and future events
    }
  }
  throw new ConnectionError(`${where}: the stream ended before the process's exit`, 'stream_ended', 0);
}

/** A process started in a sandbox (background exec), or found in `sb.processes()`. */
export class SandboxProcess {
  readonly pid: number;
  readonly tag: string | null;
  readonly sandboxId: string;
  private readonly conn: Connection;

  constructor(conn: Connection, sandboxId: string, pid: number, tag: string | null) {
    this.conn = conn;
    this.sandboxId = sandboxId;
    this.pid = pid;
    this.tag = tag;
  }

  private path(sub: string): string {
    return `/v1/sandboxes/${seg(this.sandboxId)}/processes/${this.pid}/${sub}`;
  }

  /** Writes to the process's stdin (a string is sent as UTF-8). */
  async sendStdin(data: string | Uint8Array): Promise<void> {
    const d = v.bytesLike('process.sendStdin', 'data', data);
    const body = typeof d === 'string' ? { data: d } : { data_b64: v.toBase64(d) };
    await this.conn.json('POST', this.path('stdin'), { json: body });
  }

  /** Closes the process's stdin (it reads EOF). */
  async closeStdin(): Promise<void> {
    await this.conn.json('POST', this.path('stdin'), { json: { close: true } });
  }

  /** Sends a signal to the process's group (default TERM). */
  async signal(sig: SignalName = 'TERM'): Promise<void> {
    const s = String(sig).replace(/^SIG/, '');
    if (typeof sig !== 'string' || !(SIGNALS as readonly string[]).includes(s)) {
      v.fail('process.signal', `signal must be one of ${SIGNALS.join(', ')}, got ${v.describe(sig)}`);
    }
    await this.conn.json('POST', this.path('signal'), { json: { signal: s } });
  }

  /** SIGKILL to the process's group. */
  kill(): Promise<void> {
    return this.signal('KILL');
  }

  /** Resizes the process's pseudo-terminal (started with `pty`). */
  async resize(cols: number, rows: number): Promise<void> {
    v.int('process.resize', 'cols', cols, 1, 1000, false);
    v.int('process.resize', 'rows', rows, 1, 1000, false);
    await this.conn.json('POST', this.path('resize'), { json: { cols, rows } });
  }

  /** Follows the process's output (by default from its start) until it exits. Leaving early (the
   *  signal) never kills the process. */
  async stream(opts?: StreamOptions): Promise<ExitInfo> {
    const where = 'process.stream';
    const o = v.options<StreamOptions>(where, opts, ['onStdout', 'onStderr', 'replay', 'signal', 'idleTimeoutMs']);
    const hooks: ConsumeHooks = {
      onStdout: v.fn<OutputCallback>(where, 'onStdout', o.onStdout),
      onStderr: v.fn<OutputCallback>(where, 'onStderr', o.onStderr),
    };
    const replay = v.bool(where, 'replay', o.replay) ?? true;
    const idle = v.int(where, 'idleTimeoutMs', o.idleTimeoutMs, 1, 2 ** 31 - 1) ?? DEFAULT_IDLE_TIMEOUT_MS;
    const src = await this.conn.send('GET', `/v1/sandboxes/${seg(this.sandboxId)}/processes/${this.pid}/stream`, {
      query: { replay: replay ? 'true' : 'false' },
      headers: { Accept: 'text/event-stream' },
      timeoutMs: null,
      signal: v.signalOpt(where, o.signal),
    });
    return consumeOutput(readSse(src, where, idle), where, hooks);
  }

  /** Waits for the process to exit (at once if it has). */
  wait(opts?: { signal?: AbortSignal; idleTimeoutMs?: number }): Promise<ExitInfo> {
    const o = v.options<{ signal?: AbortSignal; idleTimeoutMs?: number }>('process.wait', opts, ['signal', 'idleTimeoutMs']);
    return this.stream({ replay: false, ...o });
  }
}

// context.ts -- code contexts: persistent interpreters (python, node, bash) inside a sandbox.

import { ConnectionError, errorFromEvent } from './errors.js';
import { Connection, seg } from './http.js';
import { DEFAULT_IDLE_TIMEOUT_MS, eventJson, readSse } from './sse.js';
import * as v from './validate.js';

export type Language = 'python' | 'node' | 'bash';

/** One rich result of a cell: its text form and, when the kernel made them, PNG (base64), HTML, JSON. */
export interface Result {
  text?: string;
  png?: string;
  html?: string;
  json?: unknown;
  /** True for the value of the cell's last expression. */
  isMainResult: boolean;
}

/** An exception the code raised: `traceback` is what a model needs to fix its code. */
export interface ExecutionError {
  name: string;
  value: string;
  /** The formatted traceback, lines joined with newlines. */
  traceback: string;
}

export interface Execution {
  /** The text of the main result (the last expression's value), if any. */
  text: string | undefined;
  stdout: string;
  stderr: string;
  results: Result[];
  error: ExecutionError | null;
  executionCount: number;
  timedOut: boolean;
  restarted: boolean;
  /** bash contexts: the command's exit code. */
  exitCode?: number;
}

export interface RunCodeOptions {
  /** Interrupt the cell after this long (default 60000 on the server). */
  timeoutMs?: number;
  /** Streaming: called with output as the cell writes it. */
  onStdout?: (text: string) => void;
  onStderr?: (text: string) => void;
  onResult?: (r: Result) => void;
  signal?: AbortSignal;
}

function result(j: Record<string, unknown>): Result {
  const r: Result = { isMainResult: Boolean(j.is_main_result) };
  for (const k of ['text', 'png', 'html'] as const) if (typeof j[k] === 'string') r[k] = j[k] as string;
  if (j.json !== undefined && j.json !== null) r.json = j.json;
  return r;
}

function execError(e: unknown): ExecutionError | null {
  if (!e || typeof e !== 'object') return null;
  const x = e as Record<string, unknown>;
  // moatd sends the traceback as a list of lines (E2B's shape) or a string.
  const tb = Array.isArray(x.traceback) ? x.traceback.map(String).join('\n') : String(x.traceback ?? '');
  return { name: String(x.name ?? ''), value: String(x.value ?? ''), traceback: tb };
}

function mainText(results: Result[]): string | undefined {
  return results.find((r) => r.isMainResult)?.text;
}

export class CodeContext {
  readonly id: string;
  readonly language: Language;
  readonly cwd: string;
  readonly sandboxId: string;
  private readonly conn: Connection;

  constructor(conn: Connection, sandboxId: string, j: Record<string, unknown>) {
    this.conn = conn;
    this.sandboxId = sandboxId;
    this.id = j.id as string;
    this.language = j.language as Language;
    this.cwd = j.cwd as string;
  }

  private path(sub = ''): string {
    return `/v1/sandboxes/${seg(this.sandboxId)}/contexts/${seg(this.id)}${sub}`;
  }

  /** Runs code in the context; variables persist between runs. An exception in the code is not a
   *  rejection: it is `execution.error` (with the traceback). */
  async runCode(code: string, opts?: RunCodeOptions): Promise<Execution> {
    const where = 'context.runCode';
    const o = v.options<RunCodeOptions>(where, opts, ['timeoutMs', 'onStdout', 'onStderr', 'onResult', 'signal']);
    v.str(where, 'code', code, { nonEmpty: false });
    const timeoutMs = v.int(where, 'timeoutMs', o.timeoutMs, 1, 86_400_000);
    const onStdout = v.fn<(t: string) => void>(where, 'onStdout', o.onStdout);
    const onStderr = v.fn<(t: string) => void>(where, 'onStderr', o.onStderr);
    const onResult = v.fn<(r: Result) => void>(where, 'onResult', o.onResult);
    const signal = v.signalOpt(where, o.signal);
    const body: Record<string, unknown> = { code };
    if (timeoutMs !== undefined) body.timeout_ms = timeoutMs;
    // The server interrupts the cell at its deadline (60 s by default) and restarts a kernel that
    // does not stop within 2 s more: allow for that before giving up on the answer.
    const clientTimeout = (timeoutMs ?? 60_000) + 30_000;
    if (!onStdout && !onStderr && !onResult) {
      const j = await this.conn.json<Record<string, unknown>>('POST', this.path('/run'), { json: body, timeoutMs: clientTimeout, signal });
      const results = ((j.results as Record<string, unknown>[]) ?? []).map(result);
      const ex: Execution = {
        text: mainText(results),
        stdout: (j.stdout as string) ?? '',
        stderr: (j.stderr as string) ?? '',
        results,
        error: execError(j.error),
        executionCount: (j.execution_count as number) ?? 0,
        timedOut: Boolean(j.timed_out),
        restarted: Boolean(j.restarted),
      };
      if (typeof j.exit_code === 'number') ex.exitCode = j.exit_code;
      return ex;
    }
    body.stream = true;
    const src = await this.conn.send('POST', this.path('/run'), {
      json: body,
      headers: { Accept: 'text/event-stream' },
      timeoutMs: null,
      signal,
    });
    const ex: Execution = { text: undefined, stdout: '', stderr: '', results: [], error: null, executionCount: 0, timedOut: false, restarted: false };
    for await (const it of readSse(src, where, DEFAULT_IDLE_TIMEOUT_MS)) {
      if (it.kind !== 'event') continue;
      const d = eventJson(where, it);
      switch (it.event) {
        case 'stdout':
          ex.stdout += d.text as string;
          onStdout?.(d.text as string);
          break;
        case 'stderr':
          ex.stderr += d.text as string;
          onStderr?.(d.text as string);
          break;
        case 'result': {
          const r = result(d);
          ex.results.push(r);
          onResult?.(r);
          break;
        }
        case 'error':
          if (typeof d.code === 'string' && d.traceback === undefined) throw errorFromEvent(d); // the stream broke
          ex.error = execError(d);
          break;
        case 'end':
          ex.executionCount = (d.execution_count as number) ?? 0;
          ex.timedOut = Boolean(d.timed_out);
          ex.restarted = Boolean(d.restarted);
          if (typeof d.exit_code === 'number') ex.exitCode = d.exit_code;
          ex.text = mainText(ex.results);
          return ex;
      }
    }
    throw new ConnectionError(`${where}: the stream ended before the cell did`, 'stream_ended', 0);
  }

  /** Restarts the interpreter (its variables are lost). */
  async restart(): Promise<void> {
    await this.conn.json('POST', this.path('/restart'));
  }

  /** Deletes the context and stops its interpreter. */
  async delete(): Promise<void> {
    await this.conn.json('DELETE', this.path());
  }
}

// files.ts -- sb.files: read, write, list, stat, remove, mkdir, move and watch files in a sandbox.

import { ConnectionError, MoatError, NotFoundError, errorFromEvent } from './errors.js';
import { Connection, seg } from './http.js';
import { DEFAULT_IDLE_TIMEOUT_MS, SseItem, eventJson, readSse } from './sse.js';
import * as v from './validate.js';

/** A file-system entry. `mode` is an octal string ("0644"). */
export interface EntryInfo {
  name: string;
  path: string;
  type: 'file' | 'dir' | 'symlink' | 'other';
  size: number;
  mode: string;
  mtime: string;
  uid: number;
  gid: number;
  symlinkTarget: string | null;
}

export interface FsEvent {
  event: 'create' | 'write' | 'remove' | 'rename' | 'overflow';
  path: string;
  /** The rename's destination, when known. */
  path2?: string;
}

/** What sb.files.watch() returns: an async iterator of events, closable. */
export interface Watcher extends AsyncIterable<FsEvent> {
  /** Stops watching; a pending iteration ends (done). */
  close(): void;
}

export function entry(j: Record<string, unknown>): EntryInfo {
  return {
    name: j.name as string,
    path: j.path as string,
    type: j.type as EntryInfo['type'],
    size: j.size as number,
    mode: j.mode as string,
    mtime: j.mtime as string,
    uid: j.uid as number,
    gid: j.gid as number,
    symlinkTarget: (j.symlink_target as string | null) ?? null,
  };
}

function modeString(where: string, m: unknown): string | undefined {
  if (m === undefined) return undefined;
  if (typeof m === 'number' && Number.isInteger(m) && m >= 0 && m <= 0o7777) return '0' + m.toString(8);
  if (typeof m === 'string' && /^[0-7]{1,4}$/.test(m)) return m;
  v.fail(where, `mode must be an octal string like "0644" or a number like 0o644, got ${v.describe(m)}`);
}

export class Files {
  private readonly conn: Connection;
  private readonly sandboxId: string;

  constructor(conn: Connection, sandboxId: string) {
    this.conn = conn;
    this.sandboxId = sandboxId;
  }

  private p(sub = ''): string {
    return `/v1/sandboxes/${seg(this.sandboxId)}/files${sub}`;
  }

  /** The file's bytes. */
  async read(path: string, opts?: { user?: string; signal?: AbortSignal }): Promise<Uint8Array> {
    const o = v.options<{ user?: string; signal?: AbortSignal }>('files.read', opts, ['user', 'signal']);
    v.str('files.read', 'path', path);
    return this.conn.bytes('GET', this.p(), {
      query: { path, user: v.str('files.read', 'user', o.user, { optional: true }) },
      signal: v.signalOpt('files.read', o.signal),
    });
  }

  /** The file's bytes as a stream, read as they arrive (for files too large to hold in memory). */
  async readStream(path: string, opts?: { user?: string; signal?: AbortSignal }): Promise<ReadableStream<Uint8Array>> {
    const where = 'files.readStream';
    const o = v.options<{ user?: string; signal?: AbortSignal }>(where, opts, ['user', 'signal']);
    v.str(where, 'path', path);
    const { res, done } = await this.conn.send('GET', this.p(), {
      query: { path, user: v.str(where, 'user', o.user, { optional: true }) },
      timeoutMs: null,
      signal: v.signalOpt(where, o.signal),
    });
    const body = res.body;
    if (!body) {
      done();
      return new ReadableStream({ start: (c) => c.close() });
    }
    const reader = body.getReader();
    // A connection that breaks mid-body errors the stream (fetch's reader rejects); it never just ends short.
    return new ReadableStream<Uint8Array>({
      async pull(c) {
        try {
          const r = await reader.read();
          if (r.done) {
            done();
            c.close();
          } else c.enqueue(r.value);
        } catch (e) {
          done();
          c.error(new ConnectionError(`${where}: the download broke: ${(e as Error)?.message ?? e}`, 'connection_error', 0, { cause: e }));
        }
      },
      cancel(reason) {
        done();
        return reader.cancel(reason);
      },
    });
  }

  /** The file's content decoded as UTF-8. */
  async readText(path: string, opts?: { user?: string; signal?: AbortSignal }): Promise<string> {
    return new TextDecoder().decode(await this.read(path, opts));
  }

  /** Writes (creates or replaces) a file; parents are created. A string is written as UTF-8. */
  async write(
    path: string,
    data: string | Uint8Array | ArrayBuffer | ReadableStream<Uint8Array> | AsyncIterable<Uint8Array>,
    opts?: { mode?: string | number; user?: string; signal?: AbortSignal },
  ): Promise<{ path: string; size: number }> {
    const where = 'files.write';
    const o = v.options<{ mode?: string | number; user?: string; signal?: AbortSignal }>(where, opts, ['mode', 'user', 'signal']);
    v.str(where, 'path', path);
    // A stream (web ReadableStream, or an async iterable of bytes such as fs.createReadStream()) is
    // uploaded as it is read: files of any size pass without being held in memory.
    const streaming =
      data instanceof ReadableStream ||
      (data !== null && typeof data === 'object' && !(data instanceof Uint8Array) && typeof (data as AsyncIterable<Uint8Array>)[Symbol.asyncIterator] === 'function');
    const body = streaming ? (data as ReadableStream<Uint8Array> | AsyncIterable<Uint8Array>) : v.bytesLike(where, 'data', data);
    const r = await this.conn.json<{ path: string; size: number }>('PUT', this.p(), {
      query: { path, mode: modeString(where, o.mode), user: v.str(where, 'user', o.user, { optional: true }) },
      body,
      signal: v.signalOpt(where, o.signal),
    });
    return { path: r.path, size: r.size };
  }

  /** The entries of a directory (depth 1 by default). */
  async list(path: string, opts?: { depth?: number; user?: string }): Promise<EntryInfo[]> {
    const o = v.options<{ depth?: number; user?: string }>('files.list', opts, ['depth', 'user']);
    v.str('files.list', 'path', path);
    const r = await this.conn.json<{ entries: Record<string, unknown>[] }>('GET', this.p('/list'), {
      query: { path, depth: v.int('files.list', 'depth', o.depth, 1, 1 << 20), user: v.str('files.list', 'user', o.user, { optional: true }) },
    });
    return r.entries.map(entry);
  }

  async stat(path: string, opts?: { user?: string }): Promise<EntryInfo> {
    const o = v.options<{ user?: string }>('files.stat', opts, ['user']);
    v.str('files.stat', 'path', path);
    return entry(
      await this.conn.json('GET', this.p('/stat'), { query: { path, user: v.str('files.stat', 'user', o.user, { optional: true }) } }),
    );
  }

  /** Whether the path exists (stat answers 404 when it does not). */
  async exists(path: string, opts?: { user?: string }): Promise<boolean> {
    try {
      await this.stat(path, opts);
      return true;
    } catch (e) {
      if (e instanceof NotFoundError) return false;
      throw e;
    }
  }

  /** Removes a file, or a directory tree with `recursive: true`. */
  async remove(path: string, opts?: { recursive?: boolean; user?: string }): Promise<void> {
    const o = v.options<{ recursive?: boolean; user?: string }>('files.remove', opts, ['recursive', 'user']);
    v.str('files.remove', 'path', path);
    await this.conn.json('DELETE', this.p(), {
      query: {
        path,
        recursive: v.bool('files.remove', 'recursive', o.recursive) ? 'true' : undefined,
        user: v.str('files.remove', 'user', o.user, { optional: true }),
      },
    });
  }

  /** Creates a directory (with its parents unless `parents: false`). */
  async mkdir(path: string, opts?: { parents?: boolean; user?: string }): Promise<EntryInfo> {
    const o = v.options<{ parents?: boolean; user?: string }>('files.mkdir', opts, ['parents', 'user']);
    v.str('files.mkdir', 'path', path);
    const body: Record<string, unknown> = { path };
    if (v.bool('files.mkdir', 'parents', o.parents) !== undefined) body.parents = o.parents;
    if (v.str('files.mkdir', 'user', o.user, { optional: true }) !== undefined) body.user = o.user;
    return entry(await this.conn.json('POST', this.p('/mkdir'), { json: body }));
  }

  /** Renames `from` to `to`. */
  async move(from: string, to: string, opts?: { user?: string }): Promise<EntryInfo> {
    const o = v.options<{ user?: string }>('files.move', opts, ['user']);
    v.str('files.move', 'from', from);
    v.str('files.move', 'to', to);
    const body: Record<string, unknown> = { from, to };
    if (v.str('files.move', 'user', o.user, { optional: true }) !== undefined) body.user = o.user;
    return entry(await this.conn.json('POST', this.p('/move'), { json: body }));
  }

  /** Watches a directory. Resolves once the watch is in place (events from then on are seen);
   *  iterate the result with `for await`, and close() it (or break) to stop. A dropped connection
   *  makes the iteration reject. */
  async watch(path: string, opts?: { recursive?: boolean; user?: string; signal?: AbortSignal; idleTimeoutMs?: number }): Promise<Watcher> {
    const where = 'files.watch';
    const o = v.options<{ recursive?: boolean; user?: string; signal?: AbortSignal; idleTimeoutMs?: number }>(where, opts, [
      'recursive',
      'user',
      'signal',
      'idleTimeoutMs',
    ]);
    v.str(where, 'path', path);
    const idle = v.int(where, 'idleTimeoutMs', o.idleTimeoutMs, 1, 2 ** 31 - 1) ?? DEFAULT_IDLE_TIMEOUT_MS;
    const src = await this.conn.send('GET', this.p('/watch'), {
      query: {
        path,
        recursive: v.bool(where, 'recursive', o.recursive) ? 'true' : 'false',
        user: v.str(where, 'user', o.user, { optional: true }),
      },
      headers: { Accept: 'text/event-stream' },
      timeoutMs: null,
      signal: v.signalOpt(where, o.signal),
    });
    const items = readSse(src, where, idle);
    // Wait for ": watching" so that the caller's next file change is seen.
    const pending: SseItem[] = [];
    for (;;) {
      const n = await items.next();
      if (n.done) throw new ConnectionError(`${where}: the stream ended before the watch was in place`, 'stream_ended', 0);
      if (n.value.kind === 'comment' && n.value.text === 'watching') break;
      if (n.value.kind === 'event') pending.push(n.value);
    }
    let closed = false;
    const close = () => {
      if (closed) return;
      closed = true;
      src.ctl.abort(new ConnectionError(`${where}: closed`, 'stream_closed', 0));
    };
    async function* events(): AsyncGenerator<FsEvent> {
      try {
        const handle = (it: SseItem): FsEvent | undefined => {
          if (it.kind !== 'event') return undefined;
          const d = eventJson(where, it);
          if (it.event === 'error') throw errorFromEvent(d);
          const ev: FsEvent = { event: d.event as FsEvent['event'], path: d.path as string };
          if (typeof d.path2 === 'string') ev.path2 = d.path2;
          return ev;
        };
        for (const it of pending.splice(0)) {
          const ev = handle(it);
          if (ev) yield ev;
        }
        for (;;) {
          let n: IteratorResult<SseItem>;
          try {
            n = await items.next();
          } catch (e) {
            if (closed && e instanceof MoatError && e.code === 'stream_closed') return;
            throw e;
          }
          if (n.done) {
            if (closed) return;
            throw new ConnectionError(`${where}: the stream ended`, 'stream_ended', 0);
          }
          const ev = handle(n.value);
          if (ev) yield ev;
        }
      } finally {
        close();
        await items.return(undefined).catch(() => {});
      }
    }
    const it = events();
    return {
      close,
      [Symbol.asyncIterator]: () => it,
    };
  }
}

// template.ts -- an org's templates: built from a Dockerfile and a build context (a directory sent as a
// tar), or imported from an OCI image archive (POST /v1/templates/{name}, .../import, GET/DELETE, build logs).

import { constants as fsc, promises as fsp } from 'node:fs';
import * as nodePath from 'node:path';

import { CONNECTION_KEYS, Connection, ConnectionOptions, seg } from './http.js';
import { MoatError, errorFromEvent } from './errors.js';
import { DEFAULT_IDLE_TIMEOUT_MS, SseItem, eventJson, readSse } from './sse.js';
import * as v from './validate.js';

/** A template. `source`: "builtin" (moatd's own), "dockerfile" or "oci". `usable`: a create can use it (some build
 *  was ready; a rebuild keeps serving the previous one). `buildId`: its last build (Template.logs). `from`: its
 *  FROM, or the imported image's reference. `config`: env, workdir, user, start, ready, exposed, labels,
 *  entrypoint, cmd, stopsignal. */
export interface TemplateData {
  name: string;
  source: string;
  state: string;
  usable: boolean;
  buildId: string | null;
  from: string | null;
  error: string | null;
  sizeBytes: number;
  createdAt: string | null;
  updatedAt: string | null;
  builtAt: string | null;
  config: Record<string, unknown>;
  raw: Record<string, unknown>;
}

/** One line of a build's log: its step (1 = FROM) and Dockerfile line, the instruction, `stream` (stdout or stderr
 *  of a RUN, or "moat" for the builder's own lines such as `CACHED ...`), the text and ms since the build began. */
export interface BuildLogLine {
  step: number;
  line: number;
  instruction: string;
  stream: string;
  text: string;
  timeMs: number | null;
}

/** How a build ended: `state` ready or failed (then `error` names the step, how it ended and its last lines). */
export interface BuildEnd {
  state: string;
  error: string | null;
  image: string | null;
  sizeBytes: number | null;
}

export interface BuildOptions extends ConnectionOptions {
  /** The build context directory (default "."): sent as a tar; links are sent as links, never followed. */
  path?: string;
  /** The Dockerfile's path inside `path` (default "Dockerfile"). */
  dockerfile?: string;
  /** Values for the Dockerfile's ARGs. */
  buildArgs?: Record<string, string>;
  /** Called with each line of the build's log as it arrives (with wait). */
  onLog?: (line: BuildLogLine) => void;
  /** Default true: resolve once the build is ready (BuildError when it failed); false: at once, state "building". */
  wait?: boolean;
  /** Cancels the wait (the build goes on in moatd). */
  signal?: AbortSignal;
}

const BUILD_KEYS = [...CONNECTION_KEYS, 'path', 'dockerfile', 'buildArgs', 'onLog', 'wait', 'signal'] as const;

/** A build that ended failed (code `build_failed`, status 0). */
export class BuildError extends MoatError {
  readonly template: string;
  readonly buildId: string;
  /** moatd's account: the step, how its command ended and its last output lines. */
  readonly error: string | null;

  constructor(template: string, buildId: string, error: string | null) {
    super(`template ${template}: build ${buildId} failed: ${error ?? 'no error given'}`, 'build_failed', 0);
    this.template = template;
    this.buildId = buildId;
    this.error = error;
  }
}

function templateData(j: Record<string, unknown>): TemplateData {
  const usable = j.usable === undefined ? j.state === 'ready' : Boolean(j.usable);
  return {
    name: j.name as string,
    source: (j.source as string) ?? '',
    state: (j.state as string) ?? '',
    usable,
    buildId: (j.build_id as string | null) ?? null,
    from: (j.from as string | null) ?? null,
    error: (j.error as string | null) ?? null,
    sizeBytes: (j.size_bytes as number) ?? 0,
    createdAt: (j.created_at as string | null) ?? null,
    updatedAt: (j.updated_at as string | null) ?? null,
    builtAt: (j.built_at as string | null) ?? null,
    config: (j.config as Record<string, unknown>) ?? {},
    raw: j,
  };
}

function logLine(d: Record<string, unknown>): BuildLogLine {
  return {
    step: Number(d.step ?? 0),
    line: Number(d.line ?? 0),
    instruction: String(d.instruction ?? ''),
    stream: String(d.stream ?? ''),
    text: String(d.text ?? ''),
    timeMs: typeof d.time_ms === 'number' ? d.time_ms : null,
  };
}

/** The log of one build (Template.logs): iterate with `for await` for its lines; `end` is set once the stream
 *  passed the build's end (null while it runs, or when not followed to the end). Breaking out stops reading;
 *  the build goes on. */
export class BuildLogs implements AsyncIterable<BuildLogLine> {
  end: BuildEnd | null = null;
  private items: AsyncGenerator<SseItem>;
  private follow: boolean;
  private where: string;

  constructor(items: AsyncGenerator<SseItem>, follow: boolean, where: string) {
    this.items = items;
    this.follow = follow;
    this.where = where;
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<BuildLogLine> {
    try {
      for await (const it of this.items) {
        if (it.kind !== 'event') continue;
        if (it.event === 'log') yield logLine(eventJson(this.where, it));
        else if (it.event === 'error') throw errorFromEvent(eventJson(this.where, it));
        else if (it.event === 'end') {
          const d = eventJson(this.where, it);
          this.end = {
            state: String(d.state ?? ''),
            error: (d.error as string | null) ?? null,
            image: (d.image as string | null) ?? null,
            sizeBytes: (d.size_bytes as number | null) ?? null,
          };
          return;
        }
      }
      if (this.follow) throw new MoatError(`${this.where}: the stream ended before the build did`, 'stream_ended', 0);
    } finally {
      await this.items.return(undefined);
    }
  }

  /** Stops reading (the build goes on). */
  async close(): Promise<void> {
    await this.items.return(undefined);
  }
}

// ---- the build context as a tar ----

const IGNORE_MAX_BYTES = 1 << 20;

/** A .dockerignore pattern as a regex: '*' and '?' stop at '/', except in a pattern with "**", where every '*'
 *  crosses directories (as the CLI's and the Python SDK's); [...] is a class ([!...] negated). */
function ignorePattern(p: string): RegExp {
  const star = p.includes('**') ? '.*' : '[^/]*';
  let out = '';
  for (let i = 0; i < p.length; i++) {
    const c = p[i]!;
    if (c === '*') {
      while (p[i + 1] === '*') i++;
      out += star;
    } else if (c === '?') out += '[^/]';
    else if (c === '[' && p.indexOf(']', i + 2) > 0) {
      const j = p.indexOf(']', i + 2);
      let body = p.slice(i + 1, j);
      if (body.startsWith('!')) body = '^' + body.slice(1);
      out += '[' + body.replace(/\\/g, '\\\\') + ']';
      i = j;
    } else if (c === '\\' && i + 1 < p.length) {
      i++;
      out += p[i]!.replace(/[.*+?^${}()|[\]\\/]/g, '\\$&');
    } else out += c.replace(/[.*+?^${}()|[\]\\/]/g, '\\$&');
  }
  return new RegExp('^(?:' + out + ')$', 's');
}

async function ignoreRules(root: string): Promise<{ rx: RegExp; negate: boolean }[]> {
  let fh: fsp.FileHandle;
  try {
    fh = await fsp.open(nodePath.join(root, '.dockerignore'), fsc.O_RDONLY | fsc.O_NOFOLLOW);
  } catch (e) {
    if ((e as { code?: string }).code === 'ENOENT') return [];
    throw e;
  }
  let text: string;
  try {
    const st = await fh.stat();
    if (st.size > IGNORE_MAX_BYTES) throw new TypeError(`Template.build: .dockerignore is over ${IGNORE_MAX_BYTES} bytes`);
    text = await fh.readFile('utf8');
  } finally {
    await fh.close();
  }
  const rules: { rx: RegExp; negate: boolean }[] = [];
  for (const raw of text.split('\n')) {
    let p = raw.trim();
    if (!p || p.startsWith('#')) continue;
    const negate = p.startsWith('!');
    if (negate) p = p.slice(1);
    while (p.startsWith('/') || p.startsWith('./')) p = p.slice(p.startsWith('/') ? 1 : 2);
    p = p.replace(/\/+$/, '');
    if (p) rules.push({ rx: ignorePattern(p), negate });
  }
  return rules;
}

function excluded(rules: { rx: RegExp; negate: boolean }[], rel: string): boolean {
  const parts = rel.split('/');
  const prefixes: string[] = [];
  for (let i = parts.length; i > 0; i--) prefixes.push(parts.slice(0, i).join('/'));
  let out = false;
  for (const r of rules) if (prefixes.some((x) => r.rx.test(x))) out = !r.negate; // the last match decides
  return out;
}

const enc = new TextEncoder();

function octal(buf: Uint8Array, off: number, len: number, n: number): void {
  const s = n.toString(8).padStart(len - 1, '0');
  buf.set(enc.encode(s.slice(-(len - 1))), off);
}

/** One 512-byte ustar header; names too long for it go in a PAX header before it. */
function tarHeader(name: string, type: string, mode: number, size: number, mtime: number, link = ''): Uint8Array[] {
  const out: Uint8Array[] = [];
  const nameB = enc.encode(name);
  const linkB = enc.encode(link);
  if (nameB.length > 100 || linkB.length > 100) {
    let recs = '';
    const rec = (k: string, val: string) => {
      const body = ` ${k}=${val}\n`; // "<length> <k>=<v>\n", the length counting its own digits
      const bl = enc.encode(body).length;
      let n = bl + String(bl).length;
      while (String(n).length + bl !== n) n = String(n).length + bl;
      recs += n + body;
    };
    if (nameB.length > 100) rec('path', name);
    if (linkB.length > 100) rec('linkpath', link);
    const data = enc.encode(recs);
    out.push(...tarHeader('././@PaxHeader', 'x', 0o644, data.length, mtime), data, pad(data.length));
  }
  const h = new Uint8Array(512);
  h.set(nameB.subarray(0, 100), 0);
  octal(h, 100, 8, mode);
  octal(h, 108, 8, 0);
  octal(h, 116, 8, 0);
  octal(h, 124, 12, size);
  octal(h, 136, 12, Math.max(0, Math.floor(mtime)));
  h.fill(0x20, 148, 156);
  h[156] = type.charCodeAt(0);
  h.set(linkB.subarray(0, 100), 157);
  h.set(enc.encode('ustar\u000000'), 257);
  let sum = 0;
  for (const b of h) sum += b;
  h.set(enc.encode(sum.toString(8).padStart(6, '0') + '\u0000 '), 148);
  out.push(h);
  return out;
}

function pad(n: number): Uint8Array {
  return new Uint8Array((512 - (n % 512)) % 512);
}

/** The directory `root` as a tar, in chunks: files, directories and links (a link as a link, never followed; a
 *  file opened without following links and checked to be the one listed), sorted by name, owned by 0:0. What
 *  root's .dockerignore excludes is left out (one pattern a line, '#' comments, '!' re-includes, the last
 *  matching line decides, a directory's pattern excludes what lies beneath), except `keep` and .dockerignore. */
export async function* contextTar(root: string, keep: string[] = ['Dockerfile']): AsyncGenerator<Uint8Array> {
  const st0 = await fsp.stat(root).catch(() => null);
  if (!st0?.isDirectory()) throw new TypeError(`Template.build: path ${JSON.stringify(root)} is not a directory`);
  const rules = await ignoreRules(root);
  const kept = new Set([...keep, '.dockerignore']);
  const anyNegate = rules.some((r) => r.negate);
  async function* walk(dir: string, rel: string): AsyncGenerator<Uint8Array> {
    const names = (await fsp.readdir(dir)).sort();
    for (const name of names) {
      const full = nodePath.join(dir, name);
      const child = rel ? `${rel}/${name}` : name;
      const st = await fsp.lstat(full);
      const skip = !kept.has(child) && excluded(rules, child);
      const mtime = st.mtimeMs / 1000;
      if (st.isDirectory()) {
        if (skip && !anyNegate && ![...kept].some((k) => k.startsWith(child + '/'))) continue;
        if (!skip) yield* tarHeader(child + '/', '5', st.mode & 0o7777, 0, mtime);
        yield* walk(full, child);
      } else if (skip) {
        continue;
      } else if (st.isFile()) {
        const fh = await fsp.open(full, fsc.O_RDONLY | fsc.O_NOFOLLOW | fsc.O_NONBLOCK);
        try {
          const fst = await fh.stat();
          if (!fst.isFile() || fst.ino !== st.ino || fst.dev !== st.dev) throw new TypeError(`Template.build: ${child} changed while it was read`);
          yield* tarHeader(child, '0', fst.mode & 0o7777, fst.size, fst.mtimeMs / 1000);
          let left = fst.size;
          while (left > 0) {
            const buf = new Uint8Array(Math.min(left, 1 << 16));
            const { bytesRead } = await fh.read(buf, 0, buf.length, null);
            if (bytesRead === 0) throw new TypeError(`Template.build: ${child} shrank while it was read`);
            yield buf.subarray(0, bytesRead);
            left -= bytesRead;
          }
          yield pad(fst.size);
        } finally {
          await fh.close();
        }
      } else if (st.isSymbolicLink()) {
        yield* tarHeader(child, '2', 0o777, 0, mtime, await fsp.readlink(full));
      }
    }
  }
  yield* walk(root, '');
  yield new Uint8Array(1024);
}

function connOpts(o: Partial<ConnectionOptions>): ConnectionOptions {
  const c: ConnectionOptions = {};
  if (o.apiUrl !== undefined) c.apiUrl = o.apiUrl;
  if (o.apiKey !== undefined) c.apiKey = o.apiKey;
  if (o.requestTimeoutMs !== undefined) c.requestTimeoutMs = o.requestTimeoutMs;
  return c;
}

/** The org's templates (and moatd's own): `Template.build` from a Dockerfile, `Template.importImage` from an OCI
 *  archive, `get`, `list`, `delete`, `logs`. Errors are the SDK's typed ones with moatd's code: InvalidRequestError
 *  for a Dockerfile syntax error (naming the line), an unknown FROM, a missing COPY source, a context with ..,
 *  absolute paths or links out of it, or over moatd's limit (413); ConflictError `template_building` while a build
 *  of that name runs, `already_exists` for one of moatd's own names; NotFoundError for one the org lacks. */
export class Template implements TemplateData {
  name!: string;
  source!: string;
  state!: string;
  usable!: boolean;
  buildId!: string | null;
  from!: string | null;
  error!: string | null;
  sizeBytes!: number;
  createdAt!: string | null;
  updatedAt!: string | null;
  builtAt!: string | null;
  config!: Record<string, unknown>;
  raw!: Record<string, unknown>;

  private constructor(j: Record<string, unknown>) {
    Object.assign(this, templateData(j));
  }

  private static path(name: string, suffix = ''): string {
    return `/v1/templates/${seg(name)}${suffix}`;
  }

  /** Builds template name ([a-z0-9][a-z0-9._-]{0,62}) from the directory `path` and its Dockerfile. With `wait`
   *  (default), follows the log (onLog per line) and resolves with the ready template, or rejects with BuildError. */
  static async build(name: string, opts?: BuildOptions): Promise<Template> {
    const where = 'Template.build';
    v.str(where, 'name', name);
    const o = v.options<BuildOptions>(where, opts, BUILD_KEYS);
    const dir = v.str(where, 'path', o.path, { optional: true }) ?? '.';
    const dockerfile = v.str(where, 'dockerfile', o.dockerfile, { optional: true });
    const buildArgs = v.stringMap(where, 'buildArgs', o.buildArgs);
    const onLog = v.fn<(l: BuildLogLine) => void>(where, 'onLog', o.onLog);
    const wait = v.bool(where, 'wait', o.wait) ?? true;
    const signal = v.signalOpt(where, o.signal);
    const conn = new Connection(where, connOpts(o));
    const query = new URLSearchParams();
    if (dockerfile !== undefined) query.append('dockerfile', dockerfile);
    for (const [k, val] of Object.entries(buildArgs ?? {})) query.append('build_arg.' + k, val);
    // Fails here, before any request, for a path that is not a directory.
    const st = await fsp.stat(dir).catch(() => null);
    if (!st?.isDirectory()) v.fail(where, `path ${JSON.stringify(dir)} is not a directory`);
    const body = contextTar(dir, [dockerfile ?? 'Dockerfile']);
    const j = await conn.json<Record<string, unknown>>('POST', Template.path(name), {
      query,
      body,
      headers: { 'Content-Type': 'application/x-tar' },
      timeoutMs: null,
      signal,
    });
    const t = new Template(j);
    if (!wait) return t;
    const logs = await Template.openLogs(conn, name, t.buildId ?? '', true, signal);
    for await (const line of logs) onLog?.(line);
    if (logs.end?.state !== 'ready') throw new BuildError(name, t.buildId ?? '', logs.end?.error ?? null);
    return new Template(await conn.json('GET', Template.path(name)));
  }

  /** Imports an OCI image archive (oci-archive, or `docker save`'s tar) from a file path or bytes as template
   *  name: its layers in order with whiteouts, its config's Env, WorkingDir, User and Entrypoint/Cmd. */
  static async importImage(name: string, pathOrBytes: string | Uint8Array | ArrayBuffer, opts?: ConnectionOptions): Promise<Template> {
    const where = 'Template.importImage';
    v.str(where, 'name', name);
    let body: Uint8Array;
    if (typeof pathOrBytes === 'string') body = new Uint8Array(await fsp.readFile(pathOrBytes));
    else if (pathOrBytes instanceof Uint8Array) body = pathOrBytes;
    else if (pathOrBytes instanceof ArrayBuffer) body = new Uint8Array(pathOrBytes);
    else v.fail(where, `pathOrBytes must be a path, a Uint8Array or an ArrayBuffer, got ${v.describe(pathOrBytes)}`);
    const conn = new Connection(where, connOpts(v.options<ConnectionOptions>(where, opts, CONNECTION_KEYS)));
    return new Template(
      await conn.json('POST', Template.path(name, '/import'), { body, headers: { 'Content-Type': 'application/x-tar' }, timeoutMs: null }),
    );
  }

  /** Rebuilds one of moatd's own templates (base, code-interpreter) from its recipe; resolves once built. */
  static async rebuild(name: string, opts?: ConnectionOptions): Promise<Template> {
    const where = 'Template.rebuild';
    v.str(where, 'name', name);
    const conn = new Connection(where, connOpts(v.options<ConnectionOptions>(where, opts, CONNECTION_KEYS)));
    return new Template(await conn.json('POST', Template.path(name, '/build'), { timeoutMs: null }));
  }

  /** The template (NotFoundError when none of that name). */
  static async get(name: string, opts?: ConnectionOptions): Promise<Template> {
    const where = 'Template.get';
    v.str(where, 'name', name);
    const conn = new Connection(where, connOpts(v.options<ConnectionOptions>(where, opts, CONNECTION_KEYS)));
    return new Template(await conn.json('GET', Template.path(name)));
  }

  /** moatd's own templates, then the org's. */
  static async list(opts?: ConnectionOptions): Promise<Template[]> {
    const where = 'Template.list';
    const conn = new Connection(where, connOpts(v.options<ConnectionOptions>(where, opts, CONNECTION_KEYS)));
    const j = await conn.json<{ templates: Record<string, unknown>[] }>('GET', '/v1/templates');
    return j.templates.map((x) => new Template(x));
  }

  /** Deletes the org's template; sandboxes made from it keep running (ForbiddenError for moatd's own,
   *  ConflictError template_building while it builds). */
  static async delete(name: string, opts?: ConnectionOptions): Promise<void> {
    const where = 'Template.delete';
    v.str(where, 'name', name);
    const conn = new Connection(where, connOpts(v.options<ConnectionOptions>(where, opts, CONNECTION_KEYS)));
    await conn.json('DELETE', Template.path(name));
  }

  /** The log of build buildId of template name: what it has so far, or with `follow` up to the build's end
   *  (then `logs.end` says how it ended). NotFoundError for a build that is not this template's. */
  static async logs(
    name: string,
    buildId: string,
    opts?: ConnectionOptions & { follow?: boolean; signal?: AbortSignal },
  ): Promise<BuildLogs> {
    const where = 'Template.logs';
    v.str(where, 'name', name);
    v.str(where, 'buildId', buildId);
    const o = v.options<ConnectionOptions & { follow?: boolean; signal?: AbortSignal }>(where, opts, [
      ...CONNECTION_KEYS,
      'follow',
      'signal',
    ]);
    const follow = v.bool(where, 'follow', o.follow) ?? false;
    const conn = new Connection(where, connOpts(o));
    return Template.openLogs(conn, name, buildId, follow, v.signalOpt(where, o.signal));
  }

  private static async openLogs(conn: Connection, name: string, buildId: string, follow: boolean, signal?: AbortSignal): Promise<BuildLogs> {
    const where = `template ${name} build ${buildId} log`;
    const src = await conn.send('GET', Template.path(name, `/builds/${seg(buildId)}/logs`), {
      query: follow ? { follow: 'true' } : {},
      headers: { Accept: 'text/event-stream' },
      timeoutMs: null,
      signal,
    });
    return new BuildLogs(readSse(src, where, DEFAULT_IDLE_TIMEOUT_MS), follow, where);
  }
}

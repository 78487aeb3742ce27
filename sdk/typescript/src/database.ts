// database.ts -- Database: an org's PostgreSQL 15 database whose data outlives its sandboxes (POST/GET/DELETE
// /v1/databases, POST /v1/databases/{id}/branch). Attach one with Sandbox.create({ databases: [db] }): its
// connection URL is then DATABASE_URL (or the env you name) in every command.

import { CONNECTION_KEYS, Connection, ConnectionOptions, seg } from './http.js';
import { DEFAULT_IDLE_TIMEOUT_MS, eventJson, readSse } from './sse.js';
import * as v from './validate.js';

export type DatabaseState = 'creating' | 'running' | 'hibernated' | 'paused' | 'stopped' | 'deleting';

/** How to reach a database: moatd's PostgreSQL proxy (`moatd --db-listen`) at host:port, as `user` (a login
 *  role that owns its database and is no superuser) with `password` (SCRAM). `url` holds all of it:
 *  postgresql://user:password@host:port/database?sslmode=disable. */
export interface DatabaseConnection {
  host: string;
  port: number;
  user: string;
  password: string;
  database: string;
  /** For clients on the host (through moatd --db-listen). */
  url: string;
  /** What a sandbox reaches it at (the proxy on the sandboxes' service address, port 5432): DATABASE_URL in
   *  a sandbox it is attached to; null when moatd gives sandboxes no network. */
  sandbox_url: string | null;
}

export interface DatabaseCreateOptions extends ConnectionOptions {
  /** The data volume's size in MiB (default 1024, at least 64). */
  sizeMb?: number;
  /** Hibernate after this many seconds with no connection (default 300, at most 30 days). */
  idleSeconds?: number;
  metadata?: Record<string, string>;
}

export interface DatabaseBranchOptions {
  idleSeconds?: number;
  metadata?: Record<string, string>;
}

/** A database to attach at `Sandbox.create({ databases })`: a Database, its id, or {id, env} (env defaults
 *  to DATABASE_URL). */
export type DatabaseAttachment = Database | string | { id: string | Database; env?: string };

const ENV_RE = /^[A-Za-z_][A-Za-z0-9_]*$/;
const CREATE_KEYS = [...CONNECTION_KEYS, 'sizeMb', 'idleSeconds', 'metadata'];
const MAX_IDLE_S = 2_592_000;

function connOpts(o: Partial<ConnectionOptions>): ConnectionOptions {
  const c: ConnectionOptions = {};
  if (o.apiUrl !== undefined) c.apiUrl = o.apiUrl;
  if (o.apiKey !== undefined) c.apiKey = o.apiKey;
  if (o.requestTimeoutMs !== undefined) c.requestTimeoutMs = o.requestTimeoutMs;
  return c;
}

function nameArg(where: string, name: unknown): string {
  return v.str(where, 'name', name) as string; /* its pattern is moatd's to check (InvalidRequestError) */
}

/** A database. `state` is as of the last call that described it (`refresh()` to update): hibernated means no
 *  connection for `idleSeconds` (it costs no compute; the next connection wakes it), stopped that its sandbox
 *  is gone (the next connection starts one on the same data). Its data lives on volume `volume`; its server
 *  runs in sandbox `sandboxId`. */
export class Database {
  id: string;
  name: string;
  state: DatabaseState;
  sizeMb: number;
  idleSeconds: number;
  metadata: Record<string, string>;
  createdAt: string;
  volume: string;
  sandboxId: string | null;
  /** Client connections open through the proxy now. */
  connections: number;
  connection: DatabaseConnection;
  /** Every field moatd sent, as sent (snake_case). */
  raw: Record<string, unknown>;
  private conn: Connection;

  private constructor(conn: Connection, j: Record<string, unknown>) {
    this.conn = conn;
    const c = (j.connection as Record<string, unknown>) ?? {};
    this.id = j.id as string;
    this.name = j.name as string;
    this.state = j.state as DatabaseState;
    this.sizeMb = j.size_mb as number;
    this.idleSeconds = j.idle_seconds as number;
    this.metadata = (j.metadata as Record<string, string>) ?? {};
    this.createdAt = j.created_at as string;
    this.volume = j.volume as string;
    this.sandboxId = (j.sandbox_id as string | null) ?? null;
    this.connections = (j.connections as number) ?? 0;
    this.connection = {
      host: c.host as string,
      port: c.port as number,
      user: c.user as string,
      password: c.password as string,
      database: c.database as string,
      url: c.url as string,
      sandbox_url: (c.sandbox_url as string | null) ?? null,
    };
    this.raw = j;
  }

  /** The connection URL for the host (it holds the password); a sandbox it is attached to gets
   *  connection.sandbox_url as DATABASE_URL instead, when moatd gives sandboxes a network. */
  get url(): string {
    return this.connection.url;
  }

  private get path(): string {
    return `/v1/databases/${seg(this.id)}`;
  }

  /** Creates database name ([a-z0-9][a-z0-9_-]{0,62}, unique in the org: ConflictError already_exists) and
   *  resolves once its server accepts connections. */
  static async create(name: string, opts?: DatabaseCreateOptions): Promise<Database> {
    const where = 'Database.create';
    const body: Record<string, unknown> = { name: nameArg(where, name) };
    const o = v.options<DatabaseCreateOptions>(where, opts, CREATE_KEYS);
    if (v.int(where, 'sizeMb', o.sizeMb, 64, 2 ** 31 - 1) !== undefined) body.size_mb = o.sizeMb;
    if (v.int(where, 'idleSeconds', o.idleSeconds, 1, MAX_IDLE_S) !== undefined) body.idle_seconds = o.idleSeconds;
    if (v.stringMap(where, 'metadata', o.metadata)) body.metadata = o.metadata;
    const conn = new Connection(where, connOpts(o));
    return new Database(conn, await conn.json('POST', '/v1/databases', { json: body }));
  }

  /** The org's database with this id (NotFoundError when none). */
  static async get(id: string, opts?: ConnectionOptions): Promise<Database> {
    const where = 'Database.get';
    v.str(where, 'id', id);
    const conn = new Connection(where, connOpts(v.options<ConnectionOptions>(where, opts, CONNECTION_KEYS)));
    return new Database(conn, await conn.json('GET', `/v1/databases/${seg(id)}`));
  }

  /** The org's databases, oldest first. */
  static async list(opts?: ConnectionOptions): Promise<Database[]> {
    const where = 'Database.list';
    const conn = new Connection(where, connOpts(v.options<ConnectionOptions>(where, opts, CONNECTION_KEYS)));
    const j = await conn.json<{ databases: Record<string, unknown>[] }>('GET', '/v1/databases');
    return j.databases.map((x) => new Database(conn, x));
  }

  /** Reads state, sandbox and connection count again. */
  async refresh(): Promise<this> {
    const d = new Database(this.conn, await this.conn.json<Record<string, unknown>>('GET', this.path));
    this.name = d.name;
    this.state = d.state;
    this.sizeMb = d.sizeMb;
    this.idleSeconds = d.idleSeconds;
    this.metadata = d.metadata;
    this.volume = d.volume;
    this.sandboxId = d.sandboxId;
    this.connections = d.connections;
    this.connection = d.connection;
    this.raw = d.raw;
    return this;
  }

  /** A new database named name with this one's data as it is now (its own role, password and volume); the
   *  two change independently from then on. */
  async branch(name: string, opts?: DatabaseBranchOptions): Promise<Database> {
    const where = 'database.branch';
    const body: Record<string, unknown> = { name: nameArg(where, name) };
    const o = v.options<DatabaseBranchOptions>(where, opts, ['idleSeconds', 'metadata']);
    if (v.int(where, 'idleSeconds', o.idleSeconds, 1, MAX_IDLE_S) !== undefined) body.idle_seconds = o.idleSeconds;
    if (v.stringMap(where, 'metadata', o.metadata)) body.metadata = o.metadata;
    return new Database(this.conn, await this.conn.json('POST', this.path + '/branch', { json: body }));
  }

  /** The database's events: first `state`, then connection, hibernated, woken, restarted, branched, created
   *  as they happen; the stream ends after `deleted`. Closing the iterator (break) ends the request. */
  async *events(opts?: { signal?: AbortSignal }): AsyncGenerator<{ event: string; data: Record<string, unknown> }> {
    const where = 'database.events';
    const o = v.options<{ signal?: AbortSignal }>(where, opts, ['signal']);
    const src = await this.conn.send('GET', this.path + '/events', {
      headers: { Accept: 'text/event-stream' },
      timeoutMs: null,
      signal: v.signalOpt(where, o.signal),
    });
    for await (const it of readSse(src, `database ${this.id} events`, DEFAULT_IDLE_TIMEOUT_MS)) {
      if (it.kind !== 'event') continue;
      yield { event: it.event, data: eventJson(where, it) };
      if (it.event === 'deleted') return;
    }
  }

  /** Deletes the database: its sandbox is killed and its data removed (ConflictError while it is created). */
  async delete(): Promise<void> {
    await this.conn.json('DELETE', this.path);
  }
}

/** The {id, env?} entry of a create body for one attachment. */
export function databaseAttachment(where: string, i: number, a: unknown): { id: string; env?: string } {
  let id: unknown = a;
  let env: unknown;
  if (a !== null && typeof a === 'object' && !(a instanceof Database)) {
    const o = v.options<{ id: unknown; env?: unknown }>(`${where} databases[${i}]`, a, ['id', 'env']);
    id = o.id;
    env = o.env;
  }
  if (id instanceof Database) id = id.id;
  if (typeof id !== 'string' || id === '') v.fail(where, `databases[${i}] must be a Database, its id or {id, env}, got ${v.describe(a)}`);
  const out: { id: string; env?: string } = { id };
  if (env !== undefined) {
    v.str(where, `databases[${i}].env`, env);
    if (!ENV_RE.test(env as string)) v.fail(where, `databases[${i}].env is not a variable name: ${v.describe(env)}`);
    out.env = env as string;
  }
  return out;
}

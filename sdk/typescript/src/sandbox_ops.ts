// Sandbox calls about what surrounds its processes: exposed ports, the egress policy and its
// connection log, the event stream, and the lifetime. They are added to Sandbox's
// prototype when this module loads (index.ts imports it), and typed by the declaration below.
import { Sandbox } from './sandbox.js';
import type { SandboxInfo } from './sandbox.js';
import { seg } from './http.js';
import { DEFAULT_IDLE_TIMEOUT_MS, SseItem, eventJson, readSse } from './sse.js';
import * as v from './validate.js';

/** A port's access: public, or its token (besides the API key); url on moatd's proxy listener (or null), path on the API. */
export interface PortAccess {
  port: number;
  public: boolean;
  token: string | null;
  url: string | null;
  path: string;
}

/** The egress policy (NetworkPolicy in docs/openapi.yaml). */
export interface NetworkPolicy {
  internet?: boolean;
  egress?: 'allow' | 'deny';
  allow?: string[];
  deny?: string[];
}

export interface NetworkState {
  address: string | null;
  dns?: string;
  policy: NetworkPolicy;
  bytes_in: number;
  bytes_out: number;
  connections: number;
}

export interface NetworkLogEntry {
  seq: number;
  time_ms: number;
  sandbox_id: string;
  org: string;
  protocol: 'tcp' | 'udp' | 'icmp' | 'other';
  destination: string;
  port: number;
  name: string | null;
  verdict: 'allowed' | 'denied';
  reason: string;
}

/** One event of GET .../events: name state, connection, dropped or oom, and its JSON data. */
export interface SandboxEvent {
  event: string;
  data: Record<string, unknown>;
}

/** The open event stream: iterate it; close() ends it. */
export class SandboxEvents implements AsyncIterable<SandboxEvent> {
  private readonly items: AsyncGenerator<SseItem>;
  private readonly where: string;

  constructor(items: AsyncGenerator<SseItem>, where: string) {
    this.items = items;
    this.where = where;
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<SandboxEvent> {
    for await (const it of this.items) {
      if (it.kind !== 'event') continue;
      yield { event: it.event, data: eventJson(this.where, it) };
    }
  }

  async close(): Promise<void> {
    await this.items.return(undefined);
  }
}

declare module './sandbox.js' {
  interface Sandbox {
    /** The ports whose access was set with exposePort. */
    listPorts(): Promise<PortAccess[]>;
    /** One port's access (never set: public false, token null). */
    getPort(port: number): Promise<PortAccess>;
    /** Sets a port's access: public, or a token (the one given, else a new random one). */
    exposePort(port: number, opts?: { public?: boolean; token?: string }): Promise<PortAccess>;
    /** Forgets the port's token and public flag: the API key alone reaches it again. */
    unexposePort(port: number): Promise<void>;
    getNetwork(): Promise<NetworkState>;
    /** Replaces the egress policy; new connections follow it at once. */
    setNetwork(policy: NetworkPolicy): Promise<NetworkState>;
    /** Outbound connections (and dropped attempts), oldest first; since: only seq greater than this. */
    networkLog(opts?: { since?: number; limit?: number }): Promise<NetworkLogEntry[]>;
    /** Subscribes to the sandbox's events; resolves once subscribed. replay: the recorded ones first. */
    events(opts?: { replay?: boolean; since?: string | number; signal?: AbortSignal }): Promise<SandboxEvents>;
    /** The sandbox is killed `seconds` from now (unless API activity refreshes it). */
    setTimeout(seconds: number): Promise<SandboxInfo>;
  }
}

function portNo(where: string, port: unknown): number {
  return v.int(where, 'port', port, 1, 65535, false) as number;
}

function path(sb: Sandbox, sub: string): string {
  return `/v1/sandboxes/${seg(sb.id)}${sub}`;
}

Sandbox.prototype.listPorts = async function (this: Sandbox): Promise<PortAccess[]> {
  const j = await this.connection.json<{ ports: PortAccess[] }>('GET', path(this, '/ports'));
  return j.ports;
};

Sandbox.prototype.getPort = async function (this: Sandbox, port: number): Promise<PortAccess> {
  return this.connection.json<PortAccess>('GET', path(this, `/ports/${portNo('Sandbox.getPort', port)}`));
};

Sandbox.prototype.exposePort = async function (this: Sandbox, port: number, opts?: { public?: boolean; token?: string }): Promise<PortAccess> {
  const where = 'Sandbox.exposePort';
  const n = portNo(where, port);
  const o = v.options<{ public?: boolean; token?: string }>(where, opts, ['public', 'token']);
  const body: Record<string, unknown> = {};
  if (v.bool(where, 'public', o.public)) body.public = true;
  const token = v.str(where, 'token', o.token, { optional: true, nonEmpty: true });
  if (token !== undefined) {
    if (body.public) v.fail(where, 'a public port takes no token');
    body.token = token;
  }
  return this.connection.json<PortAccess>('POST', path(this, `/ports/${n}`), { json: body });
};

Sandbox.prototype.unexposePort = async function (this: Sandbox, port: number): Promise<void> {
  await this.connection.json('DELETE', path(this, `/ports/${portNo('Sandbox.unexposePort', port)}`));
};

Sandbox.prototype.getNetwork = async function (this: Sandbox): Promise<NetworkState> {
  return this.connection.json<NetworkState>('GET', path(this, '/network'));
};

Sandbox.prototype.setNetwork = async function (this: Sandbox, policy: NetworkPolicy): Promise<NetworkState> {
  const where = 'Sandbox.setNetwork';
  const o = v.options<NetworkPolicy>(where, policy, ['internet', 'egress', 'allow', 'deny']);
  const body: Record<string, unknown> = {};
  const internet = v.bool(where, 'internet', o.internet);
  if (internet !== undefined) body.internet = internet;
  if (o.egress !== undefined) {
    if (o.egress !== 'allow' && o.egress !== 'deny') v.fail(where, `egress must be 'allow' or 'deny', got ${v.describe(o.egress)}`);
    body.egress = o.egress;
  }
  for (const k of ['allow', 'deny'] as const) {
    const list = o[k];
    if (list === undefined) continue;
    if (!Array.isArray(list) || list.some((e) => typeof e !== 'string')) v.fail(where, `${k} must be an array of strings`);
    body[k] = list;
  }
  return this.connection.json<NetworkState>('PUT', path(this, '/network'), { json: body });
};

Sandbox.prototype.networkLog = async function (this: Sandbox, opts?: { since?: number; limit?: number }): Promise<NetworkLogEntry[]> {
  const where = 'Sandbox.networkLog';
  const o = v.options<{ since?: number; limit?: number }>(where, opts, ['since', 'limit']);
  const q: Record<string, number | undefined> = {
    since: v.int(where, 'since', o.since, 0, Number.MAX_SAFE_INTEGER),
    limit: v.int(where, 'limit', o.limit, 1, 1024),
  };
  const j = await this.connection.json<{ connections: NetworkLogEntry[] }>('GET', path(this, '/network/log'), { query: q });
  return j.connections;
};

Sandbox.prototype.events = async function (
  this: Sandbox,
  opts?: { replay?: boolean; since?: string | number; signal?: AbortSignal },
): Promise<SandboxEvents> {
  const where = 'Sandbox.events';
  const o = v.options<{ replay?: boolean; since?: string | number; signal?: AbortSignal }>(where, opts, ['replay', 'since', 'signal']);
  const q: Record<string, string> = {};
  if (v.bool(where, 'replay', o.replay)) q.replay = 'true';
  if (o.since !== undefined) {
    if (typeof o.since !== 'string' && typeof o.since !== 'number') v.fail(where, 'since must be an RFC 3339 string or Unix ms');
    q.since = String(o.since);
  }
  const src = await this.connection.send('GET', path(this, '/events'), {
    query: q,
    headers: { Accept: 'text/event-stream' },
    timeoutMs: null,
    signal: v.signalOpt(where, o.signal),
  });
  const items = readSse(src, `sandbox ${this.id} events`, DEFAULT_IDLE_TIMEOUT_MS);
  // moatd's first line is the comment ": subscribed": past it, no event is missed.
  for (;;) {
    const first = await items.next();
    if (first.done) v.fail(where, 'the event stream ended before it was subscribed');
    if (first.value.kind === 'comment' && first.value.text.trim() === 'subscribed') break;
  }
  return new SandboxEvents(items, `sandbox ${this.id} events`);
};

Sandbox.prototype.setTimeout = async function (this: Sandbox, seconds: number): Promise<SandboxInfo> {
  v.int('Sandbox.setTimeout', 'seconds', seconds, 1, 2592000, false);
  return this.update({ ttlSeconds: seconds });
};

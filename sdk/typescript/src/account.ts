// The org's API keys (GET/POST /v1/keys, DELETE /v1/keys/{kid}), the calling key (GET /v1/me) and
// the audit log (GET /v1/audit).
import { CONNECTION_KEYS, Connection, ConnectionOptions, seg } from './http.js';
import * as v from './validate.js';

export type KeyRole = 'admin' | 'member' | 'readonly';

export interface KeyInfo {
  id: string;
  name: string;
  role: KeyRole;
  created_at?: string;
  expires_at: string | null;
}

export interface Me {
  key: { id: string; name: string; role: KeyRole; expires_at: string | null };
  org: { id: string };
}

export interface AuditEntry {
  seq: number;
  at: string;
  at_ms: number;
  key_id: string;
  method: string;
  route: string;
  path: string;
  target: string | null;
  status: number;
}

export interface AuditQuery {
  from?: string | number;
  to?: string | number;
  target?: string;
  key?: string;
  limit?: number;
  cursor?: string;
}

function conn(where: string, opts: unknown, extra: readonly string[] = []): { c: Connection; o: Record<string, unknown> } {
  const o = v.options<Record<string, unknown>>(where, opts, [...CONNECTION_KEYS, ...extra]);
  const co: ConnectionOptions = {};
  if (o.apiUrl !== undefined) co.apiUrl = o.apiUrl as string;
  if (o.apiKey !== undefined) co.apiKey = o.apiKey as string;
  if (o.requestTimeoutMs !== undefined) co.requestTimeoutMs = o.requestTimeoutMs as number;
  return { c: new Connection(where, co), o };
}

/** API keys: list, create and delete need an admin key; me works with any. */
export class Keys {
  /** The calling key and its org. */
  static async me(opts?: ConnectionOptions): Promise<Me> {
    return conn('Keys.me', opts).c.json<Me>('GET', '/v1/me');
  }

  /** The org's keys, oldest first (no secrets). */
  static async list(opts?: ConnectionOptions): Promise<KeyInfo[]> {
    const j = await conn('Keys.list', opts).c.json<{ keys: KeyInfo[] }>('GET', '/v1/keys');
    return j.keys;
  }

  /** A new key; `key` is its secret, answered this once. */
  static async create(name: string, opts?: ConnectionOptions & { role?: KeyRole; expiresAt?: string }): Promise<KeyInfo & { key: string }> {
    const where = 'Keys.create';
    v.str(where, 'name', name, { nonEmpty: true });
    const { c, o } = conn(where, opts, ['role', 'expiresAt']);
    const body: Record<string, unknown> = { name };
    if (o.role !== undefined) {
      if (o.role !== 'admin' && o.role !== 'member' && o.role !== 'readonly') v.fail(where, `role must be admin, member or readonly, got ${v.describe(o.role)}`);
      body.role = o.role;
    }
    const exp = v.str(where, 'expiresAt', o.expiresAt, { optional: true, nonEmpty: true });
    if (exp !== undefined) body.expires_at = exp;
    return c.json<KeyInfo & { key: string }>('POST', '/v1/keys', { json: body });
  }

  /** Revokes a key: its next request is 401. */
  static async delete(keyId: string, opts?: ConnectionOptions): Promise<void> {
    v.str('Keys.delete', 'keyId', keyId, { nonEmpty: true });
    await conn('Keys.delete', opts).c.json('DELETE', `/v1/keys/${seg(keyId)}`);
  }
}

/** The org's audit log: every mutating call, once answered, oldest first. */
export class Audit {
  /** One page; pass `next` as cursor for the following one (null on the last). */
  static async list(opts?: ConnectionOptions & AuditQuery): Promise<{ entries: AuditEntry[]; next: string | null }> {
    const where = 'Audit.list';
    const { c, o } = conn(where, opts, ['from', 'to', 'target', 'key', 'limit', 'cursor']);
    const q: Record<string, string> = {};
    for (const k of ['from', 'to'] as const) {
      const x = o[k];
      if (x === undefined) continue;
      if (typeof x !== 'string' && typeof x !== 'number') v.fail(where, `${k} must be an RFC 3339 string or Unix ms`);
      q[k] = String(x);
    }
    for (const k of ['target', 'key', 'cursor'] as const) {
      const x = v.str(where, k, o[k], { optional: true, nonEmpty: true });
      if (x !== undefined) q[k] = x;
    }
    const limit = v.int(where, 'limit', o.limit, 1, 1000);
    if (limit !== undefined) q.limit = String(limit);
    return c.json<{ entries: AuditEntry[]; next: string | null }>('GET', '/v1/audit', { query: q });
  }

  /** Every entry matching, following the pages. */
  static async *all(opts?: ConnectionOptions & Omit<AuditQuery, 'cursor' | 'limit'>): AsyncGenerator<AuditEntry> {
    let cursor: string | null = null;
    do {
      const page: { entries: AuditEntry[]; next: string | null } = await Audit.list({ ...(opts ?? {}), limit: 1000, ...(cursor ? { cursor } : {}) });
      yield* page.entries;
      cursor = page.next;
    } while (cursor);
  }
}

// orgs.ts -- Admin: orgs and their quotas, with the platform admin key (`moatd key create --admin`).
// getQuotas and usageNow also work with a key of the org itself. A call over a quota rejects with a
// MoatError of code 'quota_exceeded' (HTTP 429) whose body names the quota, the limit and the use.

import { CONNECTION_KEYS, Connection, ConnectionOptions, seg } from './http.js';
import * as v from './validate.js';

export const QUOTA_NAMES = [
  'max_sandboxes',
  'creates_per_hour',
  'max_vcpus',
  'max_memory_mb',
  'max_ttl_seconds',
  'max_snapshot_bytes',
  'max_volumes',
  'max_volume_bytes',
  'max_databases',
  'max_database_bytes',
] as const;
export type QuotaName = (typeof QUOTA_NAMES)[number];
/** null or absent: unlimited. */
export type Quotas = Partial<Record<QuotaName, number | null>>;

export interface OrgInfo {
  id: string;
  name: string;
  createdAt: string;
  state: 'active' | 'deleting';
  quotas: Quotas;
}

export interface OrgCreated extends OrgInfo {
  /** The org's first admin key; its secret is answered this once. */
  adminKey: { id: string; name: string; role: string; key: string };
}

export type QuotaUsage = Record<QuotaName, { use: number; limit: number | null }>;

function org(j: Record<string, unknown>): OrgInfo {
  return {
    id: j.id as string,
    name: j.name as string,
    createdAt: j.created_at as string,
    state: j.state as OrgInfo['state'],
    quotas: (j.quotas as Quotas) ?? {},
  };
}

export class Admin {
  private readonly conn: Connection;

  /** opts: apiUrl, apiKey (default MOAT_API_URL, MOAT_API_KEY: the platform admin key), requestTimeoutMs. */
  constructor(opts?: ConnectionOptions) {
    const o = v.options<ConnectionOptions>('Admin', opts, CONNECTION_KEYS);
    this.conn = new Connection('Admin', o);
  }

  private static path(orgId: string): string {
    v.str('Admin', 'orgId', orgId, { nonEmpty: true });
    return `/v1/orgs/${seg(orgId)}`;
  }

  /** Creates org name ([a-z0-9][a-z0-9_.-]{0,62}) and its first admin key. */
  async createOrg(name: string): Promise<OrgCreated> {
    v.str('createOrg', 'name', name, { nonEmpty: true });
    const j = await this.conn.json<Record<string, unknown>>('POST', '/v1/orgs', { json: { name } });
    return { ...org(j), adminKey: j.admin_key as OrgCreated['adminKey'] };
  }

  /** Every org, paged through (limit: the page size, 1..1000). */
  async listOrgs(opts?: { limit?: number }): Promise<OrgInfo[]> {
    const o = v.options<{ limit?: number }>('listOrgs', opts, ['limit']);
    const limit = v.int('listOrgs', 'limit', o.limit, 1, 1000);
    const out: OrgInfo[] = [];
    let cursor: string | null = null;
    for (;;) {
      const query: Record<string, string> = {};
      if (limit !== undefined) query.limit = String(limit);
      if (cursor) query.cursor = cursor;
      const page: { orgs: Record<string, unknown>[]; next: string | null } = await this.conn.json('GET', '/v1/orgs', {
        query,
      });
      out.push(...page.orgs.map(org));
      cursor = page.next;
      if (!cursor) return out;
    }
  }

  async getOrg(orgId: string): Promise<OrgInfo> {
    return org(await this.conn.json('GET', Admin.path(orgId)));
  }

  /** Deletes the org and revokes its keys; without force a ConflictError (org_not_empty) while it has
   *  live sandboxes, volumes, databases or snapshots; with force they are killed and deleted. */
  async deleteOrg(orgId: string, opts?: { force?: boolean }): Promise<void> {
    const o = v.options<{ force?: boolean }>('deleteOrg', opts, ['force']);
    const force = v.bool('deleteOrg', 'force', o.force) ?? false;
    await this.conn.json('DELETE', Admin.path(orgId), { query: force ? { force: 'true' } : undefined, timeoutMs: null });
  }

  async getQuotas(orgId: string): Promise<Quotas> {
    return this.conn.json<Quotas>('GET', `${Admin.path(orgId)}/quotas`);
  }

  /** Replaces the org's quotas (absent or null: unlimited) and returns them. */
  async setQuotas(orgId: string, quotas: Quotas): Promise<Quotas> {
    const q = v.options<Quotas>('setQuotas', quotas, QUOTA_NAMES);
    for (const [k, x] of Object.entries(q)) if (x !== null) v.int('setQuotas', k, x, 0, 2 ** 53);
    return this.conn.json<Quotas>('PUT', `${Admin.path(orgId)}/quotas`, { json: q });
  }

  /** The org's use against each quota now. */
  async usageNow(orgId: string): Promise<QuotaUsage> {
    const j = await this.conn.json<{ usage: QuotaUsage }>('GET', `${Admin.path(orgId)}/usage/now`);
    return j.usage;
  }
}

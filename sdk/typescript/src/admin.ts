// admin.ts -- the calls that are about moatd rather than one sandbox: health and templates.

import { CONNECTION_KEYS, Connection, ConnectionOptions, DEFAULT_API_URL, seg } from './http.js';
import * as v from './validate.js';

export interface Health {
  status: string;
  version: string;
  /** Whether snapshots, fork, explore, hibernate/wake and rollback work on this host, and which CRIU. */
  checkpoints: { available: boolean; criu: string } | null;
  raw: Record<string, unknown>;
}

export interface TemplateInfo {
  name: string;
  state: 'missing' | 'building' | 'ready' | 'failed';
  error: string | null;
  builtAt: string | null;
  sizeBytes: number | null;
}

function template(j: Record<string, unknown>): TemplateInfo {
  return {
    name: j.name as string,
    state: j.state as TemplateInfo['state'],
    error: (j.error as string | null) ?? null,
    builtAt: (j.built_at as string | null) ?? null,
    sizeBytes: (j.size_bytes as number | null) ?? null,
  };
}

/** GET /healthz (needs no API key). */
export async function health(opts?: { apiUrl?: string; timeoutMs?: number }): Promise<Health> {
  const where = 'health';
  const o = v.options<{ apiUrl?: string; timeoutMs?: number }>(where, opts, ['apiUrl', 'timeoutMs']);
  const url = (v.str(where, 'apiUrl', o.apiUrl, { optional: true }) ?? process.env.MOAT_API_URL ?? DEFAULT_API_URL).replace(/\/+$/, '');
  const timeoutMs = v.int(where, 'timeoutMs', o.timeoutMs, 1, 2 ** 31 - 1) ?? 10_000;
  // A throwaway key: /healthz ignores it, and Connection insists on one.
  const conn = new Connection(where, { apiUrl: url, apiKey: 'unused' });
  const j = await conn.json<Record<string, unknown>>('GET', '/healthz', { timeoutMs });
  const c = j.checkpoints as Record<string, unknown> | undefined;
  return {
    status: j.status as string,
    version: j.version as string,
    checkpoints: c ? { available: Boolean(c.available), criu: String(c.criu ?? '') } : null,
    raw: j,
  };
}

/** The templates moatd knows and their state. */
export async function listTemplates(opts?: ConnectionOptions): Promise<TemplateInfo[]> {
  const o = v.options<ConnectionOptions>('listTemplates', opts, CONNECTION_KEYS);
  const conn = new Connection('listTemplates', o);
  const j = await conn.json<{ templates: Record<string, unknown>[] }>('GET', '/v1/templates');
  return j.templates.map(template);
}

/** Builds a template from its recipe and resolves when the build is done (it can take minutes). */
export async function buildTemplate(name: string, opts?: ConnectionOptions): Promise<TemplateInfo> {
  v.str('buildTemplate', 'name', name);
  const o = v.options<ConnectionOptions>('buildTemplate', opts, CONNECTION_KEYS);
  const conn = new Connection('buildTemplate', o);
  return template(await conn.json('POST', `/v1/templates/${seg(name)}/build`));
}

// usage.ts -- metering: the org's use over a range (GET /v1/usage, `Usage.query`) and a sandbox's
// metrics now or as its recorded history (GET /v1/sandboxes/{id}/metrics, `Sandbox#metrics`).

import { CONNECTION_KEYS, Connection, ConnectionOptions, seg } from './http.js';
import * as v from './validate.js';

/** A time as moatd takes it: a Date, Unix milliseconds or an RFC 3339 string. */
export type TimeArg = Date | number | string;

export interface UsageRow {
  /** The sandbox id, org, template or metadata value; null: the sandboxes without that metadata key. */
  key: string | null;
  cpuSeconds: number;
  memoryGibSeconds: number;
  sandboxSeconds: number;
  /** With `bucket` only: the group's use per bucket, oldest first; buckets without use are left out. */
  series?: UsagePoint[];
}

/** A group's use in one bucket: [start, start + bucket) as far as it lies in [from, to). */
export interface UsagePoint {
  /** A multiple of the bucket width since the Unix epoch. */
  start: Date;
  cpuSeconds: number;
  memoryGibSeconds: number;
  sandboxSeconds: number;
}

export interface UsageOptions extends ConnectionOptions {
  from?: TimeArg;
  to?: TimeArg;
  /** 'sandbox' (default), 'org', 'template' or 'metadata.KEY'. */
  groupBy?: string;
  /** Bucket width in seconds (60..86400): adds `series` to every row; at most 2,000 buckets in the range. */
  bucket?: number;
}

export interface MetricsSample {
  timestamp: Date;
  cpuUsedPct: number;
  cpuCount: number;
  memoryUsedBytes: number;
  memoryLimitBytes: number;
  diskUsedBytes: number | null;
  diskTotalBytes: number | null;
  networkRxBytes: number | null;
  networkTxBytes: number | null;
  /** The sandbox's running totals at this sample. */
  cpuSeconds: number;
  memoryGibSeconds: number;
}

export interface MetricsRange {
  from?: TimeArg;
  to?: TimeArg;
  limit?: number;
}

export function timeParam(where: string, name: string, t: unknown): string | undefined {
  if (t === undefined || t === null) return undefined;
  if (t instanceof Date) {
    if (isNaN(t.getTime())) throw new TypeError(`${where}: ${name} is an invalid Date`);
    return String(t.getTime());
  }
  if (typeof t === 'number' && Number.isInteger(t)) return String(t);
  if (typeof t === 'string' && t.length > 0) return t;
  throw new TypeError(`${where}: ${name} must be a Date, Unix milliseconds or an RFC 3339 string`);
}

function connOpts(o: Partial<ConnectionOptions>): ConnectionOptions {
  const c: ConnectionOptions = {};
  if (o.apiUrl !== undefined) c.apiUrl = o.apiUrl;
  if (o.apiKey !== undefined) c.apiKey = o.apiKey;
  if (o.requestTimeoutMs !== undefined) c.requestTimeoutMs = o.requestTimeoutMs;
  return c;
}

/** The org's metered use: CPU-seconds (from the cgroups' counters), working-set GiB-seconds and seconds alive. */
export class Usage {
  private constructor() {}

  /** GET /v1/usage over [from, to) (default the last 24 h), grouped; the largest CPU first. */
  static async query(opts?: UsageOptions): Promise<UsageRow[]> {
    const where = 'Usage.query';
    const o = v.options<UsageOptions>(where, opts, [...CONNECTION_KEYS, 'from', 'to', 'groupBy', 'bucket']);
    const g = v.str(where, 'groupBy', o.groupBy, { optional: true });
    if (g !== undefined && !['sandbox', 'org', 'template'].includes(g) && !g.startsWith('metadata.'))
      throw new TypeError(`${where}: groupBy must be sandbox, org, template or metadata.KEY`);
    const bucket = v.int(where, 'bucket', o.bucket, 60, 86400);
    const conn = new Connection(where, connOpts(o));
    const rows = await conn.json<Record<string, unknown>[]>('GET', '/v1/usage', {
      query: {
        from: timeParam(where, 'from', o.from),
        to: timeParam(where, 'to', o.to),
        group_by: g,
        bucket: bucket === undefined ? undefined : String(bucket),
      },
    });
    return rows.map((r) => {
      const row: UsageRow = {
        key: (r.key as string | null) ?? null,
        cpuSeconds: r.cpu_seconds as number,
        memoryGibSeconds: r.memory_gib_seconds as number,
        sandboxSeconds: r.sandbox_seconds as number,
      };
      if (Array.isArray(r.series))
        row.series = (r.series as Record<string, unknown>[]).map((p) => ({
          start: new Date(p.start as string),
          cpuSeconds: p.cpu_seconds as number,
          memoryGibSeconds: p.memory_gib_seconds as number,
          sandboxSeconds: p.sandbox_seconds as number,
        }));
      return row;
    });
  }
}

/** The recorded samples of sandbox id in [from, to), oldest first. */
export async function metricsHistory(conn: Connection, id: string, r: MetricsRange): Promise<MetricsSample[]> {
  const where = 'Sandbox.metrics';
  const o = v.options<MetricsRange>(where, r, ['from', 'to', 'limit']);
  const limit = v.int(where, 'limit', o.limit, 1, 10000);
  const j = await conn.json<{ samples: Record<string, unknown>[] }>('GET', `/v1/sandboxes/${seg(id)}/metrics`, {
    query: {
      from: timeParam(where, 'from', o.from) ?? (o.to === undefined && limit === undefined ? '0' : undefined),
      to: timeParam(where, 'to', o.to),
      limit: limit === undefined ? undefined : String(limit),
    },
  });
  return j.samples.map((s) => ({
    timestamp: new Date(s.timestamp as string),
    cpuUsedPct: s.cpu_used_pct as number,
    cpuCount: s.cpu_count as number,
    memoryUsedBytes: s.memory_used_bytes as number,
    memoryLimitBytes: s.memory_limit_bytes as number,
    diskUsedBytes: (s.disk_used_bytes as number | null) ?? null,
    diskTotalBytes: (s.disk_total_bytes as number | null) ?? null,
    networkRxBytes: (s.network_rx_bytes as number | null) ?? null,
    networkTxBytes: (s.network_tx_bytes as number | null) ?? null,
    cpuSeconds: s.cpu_seconds as number,
    memoryGibSeconds: s.memory_gib_seconds as number,
  }));
}

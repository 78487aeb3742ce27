// GET /v1/host: the host's capacity, checkpoints and network; with the platform admin key also its
// load and every org's sandboxes (an org's key sees its own, and `load` null).
import { CONNECTION_KEYS, Connection, ConnectionOptions } from './http.js';
import * as v from './validate.js';

export interface HostInfo {
  version: string;
  /** 'org': the sandboxes counted are the calling org's; 'host': every org's (platform admin key). */
  scope: 'org' | 'host';
  capacity: { cpus: number; memory_mb: number; disk_mb: number; pids_max: number };
  /** null for an org's key. average: load averages over 1, 5 and 15 minutes. */
  load: { average: [number, number, number]; memory_available_mb: number; disk_free_mb: number; uptime_seconds: number } | null;
  sandboxes: { live: number; by_state: Record<string, number>; committed_vcpus: number; committed_memory_mb: number };
  checkpoints: { available: boolean; criu: string };
  network: Record<string, unknown>;
}

export class Host {
  private constructor() {}

  /** The host now (GET /v1/host). */
  static async info(opts?: ConnectionOptions): Promise<HostInfo> {
    const o = v.options<ConnectionOptions>('Host.info', opts, CONNECTION_KEYS);
    return new Connection('Host.info', o).json<HostInfo>('GET', '/v1/host');
  }
}

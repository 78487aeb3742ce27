// volume.ts -- Volume: an org's file system that outlives its sandboxes (POST/GET/DELETE /v1/volumes and
// /v1/volumes/{name}/files). Mount one with Sandbox.create({ volumes: [{ name, path, readOnly }] }).

import { CONNECTION_KEYS, Connection, ConnectionOptions, seg } from './http.js';
import { EntryInfo, entry } from './files.js';
import * as v from './validate.js';

export interface VolumeAttachment {
  sandboxId: string;
  path: string;
  readOnly: boolean;
}

/** A volume to mount at create (`Sandbox.create({ volumes })`). */
export interface VolumeMount {
  name: string;
  /** Absolute; not /, nor under /proc, /sys, /dev or /run/moat. */
  path: string;
  /** Default false. At most one live sandbox mounts a volume read-write (else ConflictError volume_in_use). */
  readOnly?: boolean;
}

function connOpts(o: Partial<ConnectionOptions>): ConnectionOptions {
  const c: ConnectionOptions = {};
  if (o.apiUrl !== undefined) c.apiUrl = o.apiUrl;
  if (o.apiKey !== undefined) c.apiKey = o.apiKey;
  if (o.requestTimeoutMs !== undefined) c.requestTimeoutMs = o.requestTimeoutMs;
  return c;
}

/** A volume: `sizeMb` is a hard limit (ENOSPC inside); `attached`: the live sandboxes that mount it. Not part of
 *  a snapshot: a hibernated or rolled back sandbox mounts it again as it is then; a fork's children mount it
 *  read-only (ConflictError volume_attached when a process of the parent holds a file of it open for writing). */
export class Volume {
  name: string;
  sizeMb: number;
  usedBytes: number;
  createdAt: string;
  attached: VolumeAttachment[];
  private conn: Connection;

  private constructor(conn: Connection, j: Record<string, unknown>) {
    this.conn = conn;
    this.name = j.name as string;
    this.sizeMb = j.size_mb as number;
    this.usedBytes = j.used_bytes as number;
    this.createdAt = j.created_at as string;
    this.attached = ((j.attached as Record<string, unknown>[]) ?? []).map((a) => ({
      sandboxId: a.sandbox as string,
      path: a.path as string,
      readOnly: Boolean(a.read_only),
    }));
  }

  private get path(): string {
    return `/v1/volumes/${seg(this.name)}`;
  }

  /** Creates volume name ([a-z0-9][a-z0-9_.-]{0,62}) of sizeMb MiB (at least 16). */
  static async create(name: string, sizeMb: number, opts?: ConnectionOptions): Promise<Volume> {
    const where = 'Volume.create';
    v.str(where, 'name', name);
    v.int(where, 'sizeMb', sizeMb, 16, 2 ** 31 - 1, false);
    const conn = new Connection(where, connOpts(v.options<ConnectionOptions>(where, opts, CONNECTION_KEYS)));
    return new Volume(conn, await conn.json('POST', '/v1/volumes', { json: { name, size_mb: sizeMb } }));
  }

  /** The org's volume of that name (NotFoundError when none). */
  static async get(name: string, opts?: ConnectionOptions): Promise<Volume> {
    const where = 'Volume.get';
    v.str(where, 'name', name);
    const conn = new Connection(where, connOpts(v.options<ConnectionOptions>(where, opts, CONNECTION_KEYS)));
    return new Volume(conn, await conn.json('GET', `/v1/volumes/${seg(name)}`));
  }

  /** The org's volumes, oldest first. */
  static async list(opts?: ConnectionOptions): Promise<Volume[]> {
    const where = 'Volume.list';
    const conn = new Connection(where, connOpts(v.options<ConnectionOptions>(where, opts, CONNECTION_KEYS)));
    const j = await conn.json<{ volumes: Record<string, unknown>[] }>('GET', '/v1/volumes');
    return j.volumes.map((x) => new Volume(conn, x));
  }

  /** Reads size, use and attachments again. */
  async refresh(): Promise<this> {
    const j = await this.conn.json<Record<string, unknown>>('GET', this.path);
    const fresh = new Volume(this.conn, j);
    this.sizeMb = fresh.sizeMb;
    this.usedBytes = fresh.usedBytes;
    this.attached = fresh.attached;
    return this;
  }

  /** Deletes the volume and its data (ConflictError volume_in_use while a sandbox mounts it). */
  async delete(): Promise<void> {
    await this.conn.json('DELETE', this.path);
  }

  /** The bytes of the file at path (relative to the volume's root); a link on the way is never followed. */
  async read(path: string): Promise<Uint8Array> {
    v.str('volume.read', 'path', path);
    return this.conn.bytes('GET', this.path + '/files', { query: { path } });
  }

  async readText(path: string): Promise<string> {
    return new TextDecoder('utf-8', { fatal: true }).decode(await this.read(path));
  }

  /** Writes data to path (parents made; replaced atomically). Files written here are root's in every sandbox. */
  async write(path: string, data: string | Uint8Array | ArrayBuffer): Promise<{ path: string; size: number }> {
    const where = 'volume.write';
    v.str(where, 'path', path);
    const body = v.bytesLike(where, 'data', data);
    return this.conn.json('PUT', this.path + '/files', { query: { path }, body, headers: { 'Content-Type': 'application/octet-stream' } });
  }

  /** Removes the file, link or empty directory at path. */
  async remove(path: string): Promise<void> {
    v.str('volume.remove', 'path', path);
    await this.conn.json('DELETE', this.path + '/files', { query: { path } });
  }

  /** The entries of the directory at path (links listed, not followed). */
  async listFiles(path = '/'): Promise<EntryInfo[]> {
    v.str('volume.listFiles', 'path', path);
    const j = await this.conn.json<{ entries: Record<string, unknown>[] }>('GET', this.path + '/files', { query: { path } });
    return j.entries.map(entry);
  }
}

// helpers.mjs -- shared by the SDK's node tests: the built SDK, the daemon's address, cleanup, local fake servers.
import http from 'node:http';
import { after } from 'node:test';

export * from '../dist/index.js';
import { Database, Sandbox } from '../dist/index.js';
import { spawnSync } from 'node:child_process';

if (!process.env.MOAT_API_URL || !process.env.MOAT_API_KEY) {
  throw new Error('set MOAT_API_URL and MOAT_API_KEY (tests/integration/test_sdk_typescript.py does)');
}
export const API_URL = process.env.MOAT_API_URL;
export const API_KEY = process.env.MOAT_API_KEY;

const made = [];
/** Sandbox.create, with a kill registered for the end of the file (even when a test fails). */
export async function sandbox(opts = {}) {
  const sb = await Sandbox.create({ ttlSeconds: 600, ...opts });
  made.push(sb);
  return sb;
}
export function track(sb) {
  made.push(sb);
  return sb;
}
const madeDbs = [];
/** Database.create (64 MiB unless given), with a delete registered for the end of the file. */
export async function database(name, opts = {}) {
  return trackDb(await Database.create(name ?? dbName(), { sizeMb: 64, ...opts }));
}
export function trackDb(db) {
  madeDbs.push(db);
  return db;
}
export const dbName = () => 'db-ts-' + Math.random().toString(36).slice(2, 10);
after(async () => {
  await Promise.all(made.map((sb) => sb.kill().catch(() => {})));
  await Promise.all(madeDbs.map((db) => db.delete().catch(() => {})));
});

/** The host's psql (-X -At, ON_ERROR_STOP) on url: {status, stdout, stderr}; null when there is no psql. */
export function psql(url, sql) {
  const r = spawnSync('psql', ['-X', url, '-v', 'ON_ERROR_STOP=1', '-Atc', sql], {
    encoding: 'utf8',
    env: { ...process.env, PGCONNECT_TIMEOUT: '60' },
    timeout: 120_000,
  });
  if (r.error && r.error.code === 'ENOENT') return null;
  if (r.error) throw r.error;
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

/** GET /healthz (no auth). */
export async function health() {
  const r = await fetch(API_URL + '/healthz');
  return r.json();
}

/** A local HTTP server on 127.0.0.1 whose handler is `handler(req, res)`; counts requests. */
export async function localServer(handler) {
  const srv = http.createServer((req, res) => {
    srv.requests = (srv.requests || 0) + 1;
    handler(req, res);
  });
  srv.requests = 0;
  await new Promise((r) => srv.listen(0, '127.0.0.1', r));
  srv.url = `http://127.0.0.1:${srv.address().port}`;
  srv.stop = () =>
    new Promise((r) => {
      srv.closeAllConnections?.();
      srv.close(() => r());
    });
  return srv;
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
export const text = (u8) => Buffer.from(u8).toString('utf8');

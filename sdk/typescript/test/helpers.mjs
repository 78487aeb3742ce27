// helpers.mjs -- shared by the SDK's node tests: the built SDK, the daemon's address, cleanup, local fake servers.
import http from 'node:http';
import { after } from 'node:test';

export * from '../dist/index.js';
import { Sandbox } from '../dist/index.js';

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
after(async () => {
  await Promise.all(made.map((sb) => sb.kill().catch(() => {})));
});

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

// sdk_ts.mjs -- the TypeScript SDK's cost (issue 7): per-call overhead of @moat/sdk over raw fetch for
// exec `true`, and the time from Sandbox.create to the first exec result, each side by side with
// the same requests made with raw fetch in the same run (same undici keep-alive agent, same JSON).
//
//   node bench/sdk_ts.mjs [--execs N] [--creates N]
//
// With MOAT_API_URL/MOAT_API_KEY set it uses that moatd; otherwise it starts one with
// tests/lib/moatd.py (MOAT_BUILD, default build/) and stops it at the end. Builds the SDK with
// tests/node's tsc when sdk/typescript/dist is missing.
import { execFileSync, spawn } from 'node:child_process';
import { existsSync, symlinkSync, lstatSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createInterface } from 'node:readline';

const REPO = join(dirname(fileURLToPath(import.meta.url)), '..');
const SDK = join(REPO, 'sdk', 'typescript');
const args = process.argv.slice(2);
const arg = (name, def) => {
  const i = args.indexOf(name);
  return i >= 0 ? Number(args[i + 1]) : def;
};
const EXECS = arg('--execs', 500);
const CREATES = arg('--creates', 30);

function buildSdk() {
  const nm = join(SDK, 'node_modules');
  if (!existsSync(nm) && !(() => { try { return lstatSync(nm).isSymbolicLink(); } catch { return false; } })()) {
    symlinkSync('../../tests/node/node_modules', nm);
  }
  execFileSync(join(REPO, 'tests', 'node', 'node_modules', '.bin', 'tsc'), ['-p', SDK], { stdio: 'inherit' });
}

async function startDaemon() {
  const py = [
    'import sys, os',
    'sys.path.insert(0, os.path.join(os.getcwd(), "tests", "lib"))',
    'import moatd',
    'moatd.ensure_template("base")',
    'd = moatd.MoatDaemon(pool=4)',
    'try:',
    '    d.start()',
    '    print("http://127.0.0.1:%d %s" % (d.port, d.client.key), flush=True)',
    '    sys.stdin.read()',
    'finally:',
    '    d.stop()',
  ].join('\n');
  const child = spawn('python3', ['-c', py], { cwd: REPO, stdio: ['pipe', 'pipe', 'inherit'] });
  const line = await new Promise((resolve, reject) => {
    const rl = createInterface({ input: child.stdout });
    rl.once('line', resolve);
    child.once('exit', (c) => reject(new Error('moatd helper exited ' + c)));
  });
  const [url, key] = line.trim().split(' ');
  return {
    url,
    key,
    stop: () =>
      new Promise((r) => {
        child.once('exit', r);
        child.stdin.end();
      }),
  };
}

function pct(xs, p) {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))];
}
const ms = (x) => x.toFixed(3);
function row(name, xs) {
  return `| ${name} | ${xs.length} | ${ms(pct(xs, 50))} | ${ms(pct(xs, 95))} | ${ms(pct(xs, 99))} |`;
}

async function main() {
  if (!existsSync(join(SDK, 'dist', 'index.js'))) buildSdk();
  let daemon;
  if (!process.env.MOAT_API_URL || !process.env.MOAT_API_KEY) {
    daemon = await startDaemon();
    process.env.MOAT_API_URL = daemon.url;
    process.env.MOAT_API_KEY = daemon.key;
  }
  const { Sandbox, sdkDispatcher } = await import(join(SDK, 'dist', 'index.js'));
  const URL_ = process.env.MOAT_API_URL;
  const KEY = process.env.MOAT_API_KEY;
  const dispatcher = await sdkDispatcher();
  const headers = { Authorization: 'Bearer ' + KEY, 'Content-Type': 'application/json' };
  const raw = async (method, path, body) => {
    const r = await fetch(URL_ + path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body), dispatcher });
    const t = await r.text();
    if (!r.ok) throw new Error(`${method} ${path}: ${r.status} ${t}`);
    return t ? JSON.parse(t) : undefined;
  };
  const out = [];
  try {
    // (1) exec `true`: SDK vs raw fetch, interleaved on one sandbox.
    const sb = await Sandbox.create({ ttlSeconds: 900, metadata: { bench: 'sdk_ts' } });
    const path = `/v1/sandboxes/${sb.id}/exec`;
    for (let i = 0; i < 50; i++) {
      await sb.exec(['true']);
      await raw('POST', path, { argv: ['true'] });
    }
    const tSdk = [];
    const tRaw = [];
    for (let i = 0; i < EXECS; i++) {
      const sdkFirst = i % 2 === 0;
      for (const which of sdkFirst ? ['sdk', 'raw'] : ['raw', 'sdk']) {
        const t0 = performance.now();
        const r = which === 'sdk' ? await sb.exec(['true']) : await raw('POST', path, { argv: ['true'] });
        const dt = performance.now() - t0;
        if ((which === 'sdk' ? r.exitCode : r.exit_code) !== 0) throw new Error('exec true failed');
        (which === 'sdk' ? tSdk : tRaw).push(dt);
      }
    }
    await sb.kill();

    // (2) Sandbox.create -> first exec result, SDK vs raw fetch (kills not timed).
    const cSdk = [];
    const cRaw = [];
    for (let i = 0; i < CREATES; i++) {
      for (const which of i % 2 === 0 ? ['sdk', 'raw'] : ['raw', 'sdk']) {
        const t0 = performance.now();
        let id;
        if (which === 'sdk') {
          const s = await Sandbox.create({ ttlSeconds: 300, metadata: { bench: 'sdk_ts' } });
          id = s.id;
          await s.exec(['true']);
        } else {
          const s = await raw('POST', '/v1/sandboxes', { ttl_seconds: 300, metadata: { bench: 'sdk_ts' } });
          id = s.id;
          await raw('POST', `/v1/sandboxes/${id}/exec`, { argv: ['true'] });
        }
        (which === 'sdk' ? cSdk : cRaw).push(performance.now() - t0);
        await raw('DELETE', `/v1/sandboxes/${id}`);
        await new Promise((r) => setTimeout(r, 20)); // let the pool refill between creates
      }
    }

    out.push('## TypeScript SDK (bench/sdk_ts.mjs)', '', `node ${process.version}, moatd at ${URL_}`, '');
    out.push('| measure (ms) | n | p50 | p95 | p99 |', '|---|---|---|---|---|');
    out.push(row('exec `true`, raw fetch', tRaw), row('exec `true`, @moat/sdk', tSdk));
    out.push(row('create -> first exec, raw fetch', cRaw), row('create -> first exec, @moat/sdk', cSdk), '');
    const ratio = pct(tSdk, 50) / pct(tRaw, 50);
    const mean = (xs) => xs.reduce((a, b) => a + b, 0) / xs.length;
    out.push(
      `exec overhead: SDK p50 / raw p50 = ${ratio.toFixed(3)} (target <= 1.2: ${ratio <= 1.2 ? 'met' : 'MISSED'}); ` +
        `p99 ratio ${(pct(tSdk, 99) / pct(tRaw, 99)).toFixed(3)}; mean difference ${((mean(tSdk) - mean(tRaw)) * 1000).toFixed(0)} us per call`,
    );
    out.push(`create -> first exec: SDK p50 / raw p50 = ${(pct(cSdk, 50) / pct(cRaw, 50)).toFixed(3)}`);
    console.log(out.join('\n'));
  } finally {
    for (const s of await Sandbox.list({ metadata: { bench: 'sdk_ts' } }).catch(() => [])) await s.kill().catch(() => {});
    if (daemon) await daemon.stop();
  }
}

await main();

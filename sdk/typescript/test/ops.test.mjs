// ops.test.mjs -- exposed ports, network policy and log, the event stream, metrics, setTimeout,
// snapshots by id, Keys (me/list/create/delete), Audit (list/all) and Database-free process resize,
// against a real moatd (tests/integration/test_client_ops.py runs it, with a fake internet).
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { Sandbox, Template, Keys, Audit, database, NotFoundError, InvalidRequestError, AuthenticationError, API_URL, API_KEY, sandbox } from './helpers.mjs';

const NOWHERE = 8123;

async function proxyStatus(sb, port, headers) {
  const r = await fetch(`${API_URL}/v1/sandboxes/${sb.id}/ports/${port}/`, { headers });
  await r.arrayBuffer();
  return r.status;
}

async function nextState(iter) {
  for (;;) {
    const r = await iter.next();
    if (r.done) return null;
    if (r.value.event === 'state') return r.value.data;
  }
}

describe('sandbox ops', () => {
  it('exposePort, getPort, listPorts, unexposePort', async () => {
    const sb = await sandbox();
    assert.deepEqual(await sb.listPorts(), []);
    assert.equal((await sb.getPort(NOWHERE)).token, null);
    assert.equal(await proxyStatus(sb, NOWHERE, {}), 401);
    const a = await sb.exposePort(NOWHERE);
    assert.match(a.token, /^mpt_/);
    assert.equal(await proxyStatus(sb, NOWHERE, { 'X-Moat-Port-Token': a.token }), 502);
    assert.deepEqual((await sb.listPorts()).map((p) => p.port), [NOWHERE]);
    assert.equal((await sb.exposePort(NOWHERE, { public: true })).public, true);
    assert.equal(await proxyStatus(sb, NOWHERE, {}), 502);
    await sb.unexposePort(NOWHERE);
    assert.equal(await proxyStatus(sb, NOWHERE, {}), 401);
    await assert.rejects(sb.exposePort(NOWHERE, { public: true, token: 't'.repeat(20) }), /public port takes no token/);
    await assert.rejects(sb.getPort(0), /port/);
    await assert.rejects(sb.exposePort(NOWHERE, { token: 'short' }), InvalidRequestError);
  });

  it('getNetwork, setNetwork, networkLog', async () => {
    const sb = await sandbox();
    assert.deepEqual((await sb.getNetwork()).policy, { internet: true, egress: 'allow', allow: [], deny: [] });
    const r = await sb.exec(['bash', '-c', 'exec 3<>/dev/tcp/198.51.100.10/80 && echo open'], { timeoutMs: 10000 });
    assert.match(r.stdout, /open/);
    let log = [];
    let ok;
    for (let i = 0; i < 50 && !ok; i++) {
      // the log is written as moatd sees the connection, a moment after it
      log = await sb.networkLog();
      ok = log.find((e) => e.destination === '198.51.100.10');
      if (!ok) await new Promise((res) => setTimeout(res, 200));
    }
    assert.equal(ok?.verdict, 'allowed', JSON.stringify(log));
    const st = await sb.setNetwork({ egress: 'deny', allow: ['allowed.test'] });
    assert.equal(st.policy.egress, 'deny');
    await sb.exec(['bash', '-c', "timeout 3 bash -c 'exec 3<>/dev/tcp/198.51.100.13/80' || true"], { timeoutMs: 10000 });
    let later = [];
    for (let i = 0; i < 50 && !later.some((e) => e.destination === '198.51.100.13'); i++) {
      later = await sb.networkLog({ since: ok.seq });
      await new Promise((res) => setTimeout(res, 200));
    }
    assert.ok(later.every((e) => e.seq > ok.seq));
    assert.equal(later.find((e) => e.destination === '198.51.100.13')?.verdict, 'denied', JSON.stringify(later));
    assert.equal((await sb.networkLog({ limit: 1 })).length, 1);
    await assert.rejects(sb.setNetwork({ egress: 'sideways' }), /egress/);
  });

  it('events (replay, then live), metrics, setTimeout', async () => {
    const sb = await sandbox();
    const ev = await sb.events({ replay: true });
    const it = ev[Symbol.asyncIterator]();
    assert.equal((await nextState(it)).event, 'created');
    assert.equal((await nextState(it)).event, 'running');
    await sb.pause();
    assert.equal((await nextState(it)).state, 'paused');
    await sb.resume();
    assert.equal((await nextState(it)).event, 'resumed');
    await ev.close();
    const m = await sb.metrics();
    assert.equal(m.sandbox_id, sb.id);
    assert.ok(m.memory.used_bytes > 0);
    const info = await sb.setTimeout(90);
    assert.equal(info.ttlSeconds, 90);
    await assert.rejects(sb.setTimeout(0), /seconds/);
  });

  it('process resize reaches the pty; getSnapshot of an unknown id is NotFoundError', async () => {
    const sb = await sandbox();
    const res = await fetch(`${API_URL}/v1/sandboxes/${sb.id}/exec`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${API_KEY}`, 'Content-Type': 'application/json' },
      body: JSON.stringify({ argv: ['bash', '-c', 'sleep 2; stty size'], background: true, pty: { cols: 80, rows: 24 } }),
    });
    const { pid } = await res.json();
    const p = sb.process(pid);
    await p.resize(99, 33);
    let out = '';
    const exit = await p.stream({ onStdout: (t) => (out += t) });
    assert.equal(exit.exitCode, 0);
    assert.match(out, /33 99/);
    await assert.rejects(Sandbox.getSnapshot('snap-' + '0'.repeat(17)), NotFoundError);
  });
});

describe('keys and audit', () => {
  it('Keys.me, list, create, delete; Audit.list and all', async () => {
    const me = await Keys.me();
    assert.equal(me.key.role, 'admin');
    const name = 'ts-' + Date.now();
    const k = await Keys.create(name, { role: 'readonly' });
    assert.match(k.key, /^moat_/);
    assert.equal((await Keys.me({ apiKey: k.key })).key.name, name);
    assert.ok((await Keys.list()).some((x) => x.id === k.id));
    await Keys.delete(k.id);
    await assert.rejects(Keys.me({ apiKey: k.key }), AuthenticationError);
    const page = await Audit.list({ target: k.id });
    assert.deepEqual(page.entries.map((e) => e.method), ['DELETE']);
    const all = [];
    for await (const e of Audit.all()) all.push(e);
    assert.ok(all.some((e) => e.method === 'POST' && e.path === '/v1/keys' && e.status === 201));
    const one = await Audit.list({ limit: 1 });
    assert.equal(one.entries.length, 1);
    await assert.rejects(Keys.create('x', { role: 'root' }), /role/);
  });
});

describe('database events, template rebuild', () => {
  it('Database.events: state first, deleted last', async () => {
    const db = await database();
    const it = db.events()[Symbol.asyncIterator]();
    const first = await it.next();
    assert.equal(first.value.event, 'state');
    assert.equal(first.value.data.database_id, db.id);
    await db.delete();
    const names = [];
    for (let r = await it.next(); !r.done; r = await it.next()) names.push(r.value.event);
    assert.equal(names.at(-1), 'deleted', JSON.stringify(names));
  });

  it('Template.rebuild of a name without a recipe is NotFoundError', async () => {
    await assert.rejects(Template.rebuild('no-such-recipe'), NotFoundError);
  });
});

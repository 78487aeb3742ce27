// sandbox.test.mjs -- create/connect/list/update/kill, exec (cmd, argv, env, cwd, user, stdin,
// timeouts, binary output), typed errors from a real moatd, and argument checks before the network.
import assert from 'node:assert/strict';
import { describe, it, before, after } from 'node:test';
import {
  Sandbox, MoatError, NotFoundError, AuthenticationError, InvalidRequestError, ConflictError, TimeoutError,
  ConnectionError, API_URL, sandbox, localServer, health, listTemplates, buildTemplate,
} from './helpers.mjs';

describe('sandbox lifecycle', () => {
  it('create, getInfo, connect, list by metadata, update, kill', async () => {
    const tag = 'ts-' + process.pid + '-' + Date.now();
    const sb = await sandbox({ metadata: { suite: tag, k: 'v' }, env: { GREETING: 'hej' }, cpu: 1, memoryMb: 256 });
    assert.match(sb.id, /^sb-/);
    assert.equal(sb.info.state, 'running');
    assert.equal(sb.info.template, 'base');
    assert.deepEqual(sb.info.metadata, { suite: tag, k: 'v' });
    assert.equal(sb.info.cpu, 1);
    assert.equal(sb.info.memoryMb, 256);
    assert.equal(sb.info.ttlSeconds, 600);
    assert.equal(sb.info.persistent, false);
    assert.equal((await sb.exec('echo $GREETING')).stdout, 'hej\n');

    const again = await Sandbox.connect(sb.id);
    assert.equal(again.id, sb.id);
    assert.equal((await again.exec(['echo', 'via connect'])).stdout, 'via connect\n');

    const listed = await Sandbox.list({ metadata: { suite: tag } });
    assert.deepEqual(listed.map((s) => s.id), [sb.id]);
    assert.deepEqual(await Sandbox.list({ metadata: { suite: tag + '-none' } }), []);
    assert.ok((await Sandbox.list({ state: 'running' })).some((s) => s.id === sb.id));

    const info = await sb.update({ ttlSeconds: 1200, metadata: { suite: tag, k: 'w' } });
    assert.equal(info.ttlSeconds, 1200);
    assert.equal(sb.info.metadata.k, 'w');
    assert.equal((await sb.getInfo()).metadata.k, 'w');

    assert.equal(await sb.kill(), true);
    assert.equal(await sb.kill(), false, 'a second kill finds nothing');
    assert.equal((await Sandbox.connect(sb.id)).info.state, 'killed');
    await assert.rejects(sb.exec('true'), NotFoundError);
    const killed = await Sandbox.list({ state: 'killed', metadata: { suite: tag } });
    assert.deepEqual(killed.map((s) => s.id), [sb.id]);
  });
});

describe('sandbox list pages', () => {
  it('list with limit and cursor, and Sandbox.all over the pages', async () => {
    const tag = 'ts-pages-' + process.pid + '-' + Date.now();
    const made = [];
    for (let i = 0; i < 5; i++) made.push((await sandbox({ metadata: { suite: tag, odd: String(i % 2) } })).id);
    const whole = await Sandbox.list({ metadata: { suite: tag } });
    assert.deepEqual([...whole.map((s) => s.id)].sort(), [...made].sort());
    assert.equal(whole.next, null);
    assert.equal(whole.total, 5);
    const ids = whole.map((s) => s.id);
    const first = await Sandbox.list({ metadata: { suite: tag }, limit: 2 });
    assert.deepEqual(first.map((s) => s.id), ids.slice(0, 2));
    assert.equal(first.total, 5);
    assert.equal(typeof first.next, 'string');
    const second = await Sandbox.list({ metadata: { suite: tag }, limit: 2, cursor: first.next });
    assert.deepEqual(second.map((s) => s.id), ids.slice(2, 4));
    const last = await Sandbox.list({ metadata: { suite: tag }, limit: 2, cursor: second.next });
    assert.deepEqual(last.map((s) => s.id), ids.slice(4));
    assert.equal(last.next, null);
    const walked = [];
    for await (const s of Sandbox.all({ metadata: { suite: tag }, pageSize: 2 })) walked.push(s.id);
    assert.deepEqual(walked, ids);
    const odd = [];
    for await (const s of Sandbox.all({ metadata: { suite: tag, odd: '1' }, pageSize: 1 })) odd.push(s.id);
    assert.deepEqual(odd, whole.filter((s) => s.info.metadata.odd === '1').map((s) => s.id));
    await assert.rejects(Sandbox.list({ cursor: 'not-a-cursor' }), InvalidRequestError);
  });
});

describe('moatd: health and templates', () => {
  it('health needs no key and reports checkpoints', async () => {
    const h = await health();
    assert.equal(h.status, 'ok');
    assert.equal(typeof h.version, 'string');
    assert.equal(typeof h.checkpoints.available, 'boolean');
    assert.equal(typeof h.checkpoints.criu, 'string');
  });

  it('listTemplates and buildTemplate', async () => {
    const ts = await listTemplates();
    const base = ts.find((t) => t.name === 'base');
    assert.equal(base.state, 'ready');
    assert.equal(typeof base.sizeBytes, 'number');
    await assert.rejects(buildTemplate('no-such-recipe'), (e) => e instanceof NotFoundError && /no template recipe/.test(e.message));
    await assert.rejects(async () => buildTemplate(5), TypeError);
  });
});

describe('exec', () => {
  let sb;
  before(async () => {
    sb = await sandbox({ env: { FOO: 'sandbox-foo' } });
  });

  it('returns stdout, stderr, exit code and timing', async () => {
    const r = await sb.exec('echo out; echo err >&2; exit 7');
    assert.equal(r.stdout, 'out\n');
    assert.equal(r.stderr, 'err\n');
    assert.equal(r.exitCode, 7);
    assert.equal(r.timedOut, false);
    assert.equal(r.truncated, false);
    assert.equal(typeof r.durationMs, 'number');
    assert.equal(typeof r.pid, 'number');
  });

  it('argv is not a shell', async () => {
    const r = await sb.exec(['echo', 'a  b', '$HOME', ';']);
    assert.equal(r.stdout, 'a  b $HOME ;\n');
  });

  it('env, cwd, user, stdin (text and bytes)', async () => {
    assert.equal((await sb.exec('echo "$FOO $BAR"', { env: { BAR: 'x' } })).stdout, 'sandbox-foo x\n');
    assert.equal((await sb.exec('pwd', { cwd: '/tmp' })).stdout, '/tmp\n');
    assert.equal((await sb.exec('id -u', { user: 'user' })).stdout, '1000\n');
    assert.equal((await sb.exec(['cat'], { stdin: 'hello\n' })).stdout, 'hello\n');
    const bytes = new Uint8Array(256).map((_, i) => i);
    const r = await sb.exec('od -An -tx1 | tr -d " \\n"', { stdin: bytes });
    assert.equal(r.stdout, Buffer.from(bytes).toString('hex'));
  });

  it('killed by a signal, command not found, timeout', async () => {
    const k = await sb.exec('kill -9 $$');
    assert.equal(k.exitCode, -1);
    assert.equal(k.signal, 9);
    assert.equal(k.oomKilled, false);
    assert.equal((await sb.exec('no-such-command-xyz')).exitCode, 127);
    const t0 = Date.now();
    const t = await sb.exec('sleep 30', { timeoutMs: 300 });
    assert.equal(t.timedOut, true);
    assert.ok(Date.now() - t0 < 10_000);
  });

  it('an OOM kill is reported', async () => {
    const small = await sandbox({ memoryMb: 512, cpu: 1 });
    const r = await small.exec(['python3', '-c', "b = b'x' * (700 << 20); print(len(b))"]);
    assert.equal(r.oomKilled, true, JSON.stringify(r));
    assert.equal(r.signal, 9);
    assert.equal((await small.exec('true')).oomKilled, false);
  });

  it('concurrent calls on one sandbox', async () => {
    const rs = await Promise.all(Array.from({ length: 24 }, (_, i) => sb.exec(['sh', '-c', `echo ${i}`])));
    assert.deepEqual(rs.map((r) => r.stdout), Array.from({ length: 24 }, (_, i) => `${i}\n`));
  });

  it('a long exec is not cut off by a client default', async () => {
    const r = await sb.exec('sleep 2; echo done');
    assert.equal(r.stdout, 'done\n');
  });

  it('binary output comes back as bytes too', async () => {
    const r = await sb.exec("printf 'a\\377b'");
    assert.equal(r.stdout, 'a\uFFFDb');
    assert.deepEqual([...r.stdoutBytes], [0x61, 0xff, 0x62]);
  });

  it('requestTimeoutMs rejects with TimeoutError (client side)', async () => {
    await assert.rejects(sb.exec('sleep 5', { requestTimeoutMs: 200 }), (e) => e instanceof TimeoutError && e.code === 'client_timeout' && e.status === 0);
  });

  it('an AbortSignal ends the call with its reason', async () => {
    const ac = new AbortController();
    setTimeout(() => ac.abort(new Error('stop now')), 100);
    await assert.rejects(sb.exec('sleep 5', { signal: ac.signal }), /stop now/);
  });
});

describe('typed errors from moatd', () => {
  let sb;
  before(async () => {
    sb = await sandbox();
  });

  it('404 NotFoundError with the server code and message', async () => {
    const e = await Sandbox.connect('sb-doesnotexist0000').catch((x) => x);
    assert.ok(e instanceof NotFoundError && e instanceof MoatError);
    assert.equal(e.status, 404);
    assert.equal(e.code, 'not_found');
    assert.ok(e.message.length > 0);
    await assert.rejects(sb.files.read('/no/such/file'), (x) => x instanceof NotFoundError && x.code === 'not_found');
    await assert.rejects(sb.process(999999).sendStdin('x'), (x) => x instanceof NotFoundError && x.code === 'process_not_found');
  });

  it('401 AuthenticationError for a wrong key', async () => {
    const e = await Sandbox.list({ apiKey: 'moat_wrong' }).catch((x) => x);
    assert.ok(e instanceof AuthenticationError, String(e));
    assert.equal(e.status, 401);
    assert.equal(e.code, 'unauthorized');
  });

  it('400 InvalidRequestError (unknown template, unknown user)', async () => {
    const e = await Sandbox.create({ template: 'no-such-template' }).catch((x) => x);
    assert.ok(e instanceof InvalidRequestError, String(e));
    assert.equal(e.code, 'invalid_request');
    assert.match(e.message, /unknown template 'no-such-template'/);
    await assert.rejects(sb.exec('true', { user: 'nosuchuser' }), InvalidRequestError);
  });

  it('409 ConflictError (tag in use, path exists, stdin closed)', async () => {
    const p = await sb.exec('sleep 30', { background: true, tag: 'dup' });
    try {
      await assert.rejects(sb.exec('sleep 30', { background: true, tag: 'dup' }), (x) => x instanceof ConflictError && x.code === 'tag_in_use');
      await sb.files.mkdir('/tmp/exists');
      await assert.rejects(sb.files.mkdir('/tmp/exists', { parents: false }), (x) => x instanceof ConflictError && x.code === 'already_exists');
      await p.closeStdin();
      await assert.rejects(p.sendStdin('late'), (x) => x instanceof ConflictError && x.code === 'stdin_closed');
    } finally {
      await p.kill();
    }
  });

  it('no moatd listening: ConnectionError, not a hang', async () => {
    const srv = await localServer(() => {});
    const url = srv.url;
    await srv.stop();
    const e = await Sandbox.list({ apiUrl: url }).catch((x) => x);
    assert.ok(e instanceof ConnectionError, String(e));
    assert.equal(e.status, 0);
  });
});

describe('arguments are checked before the network', () => {
  let srv;
  let sb;
  before(async () => {
    sb = await sandbox();
    srv = await localServer((req, res) => {
      res.writeHead(500).end();
    });
  });
  after(() => srv.stop());

  it('wrong types and missing arguments throw TypeError and send nothing', async () => {
    const api = { apiUrl: srv.url, apiKey: 'k' };
    const bad = [
      () => Sandbox.create({ ...api, ttlSeconds: '60' }),
      () => Sandbox.create({ ...api, ttlSeconds: 0 }),
      () => Sandbox.create({ ...api, ttl: 60 }),
      () => Sandbox.create({ ...api, metadata: { a: 1 } }),
      () => Sandbox.create({ ...api, cpu: 'two' }),
      () => Sandbox.create({ ...api, persistent: 'yes' }),
      () => Sandbox.create('base'),
      () => Sandbox.create({ apiUrl: srv.url, apiKey: '' }),
      () => Sandbox.create({ apiUrl: 'not a url', apiKey: 'k' }),
      () => Sandbox.connect(),
      () => Sandbox.connect(42, api),
      () => Sandbox.list({ ...api, state: 'sleeping' }),
      () => Sandbox.list({ ...api, limit: 0 }),
      () => Sandbox.list({ ...api, limit: 1001 }),
      () => Sandbox.list({ ...api, limit: '5' }),
      () => Sandbox.list({ ...api, cursor: '' }),
      () => Sandbox.all({ ...api, pageSize: 0 }).next(),
      () => Sandbox.all({ ...api, limit: 5 }).next(),
    ];
    for (const f of bad) {
      await assert.rejects(f, TypeError);
    }
    assert.equal(srv.requests, 0);
  });

  it('method arguments of a live sandbox', async () => {
    const before = srv.requests;
    const bad = [
      () => sb.exec(),
      () => sb.exec(42),
      () => sb.exec([]),
      () => sb.exec(['ls', 1]),
      () => sb.exec('true', { timeoutMs: -1 }),
      () => sb.exec('true', { env: { A: 1 } }),
      () => sb.exec('true', { stdin: 5 }),
      () => sb.exec('true', { tag: 'x' }),
      () => sb.exec('true', { background: true, tag: 'bad tag' }),
      () => sb.exec('true', { wat: 1 }),
      () => sb.execStream('true', { onStdout: 'no' }),
      () => sb.files.read(),
      () => sb.files.write('/x'),
      () => sb.files.write('/x', 5),
      () => sb.files.write('/x', 'y', { mode: 'rwx' }),
      () => sb.files.list(7),
      () => sb.files.move('/a'),
      () => sb.files.watch(),
      () => sb.createCodeContext({ language: 'cobol' }),
      () => sb.forkTree(),
      () => sb.forkTree({ count: 0 }),
      () => sb.forkTree({ count: 17 }),
      () => sb.explore({ branches: [] }),
      () => sb.explore({ branches: [{ cmd: 1 }] }),
      () => sb.rollback(),
      () => sb.update({}),
      () => sb.pty({ cols: 0 }),
      () => sb.process('12').signal(),
    ];
    for (const f of bad) {
      await assert.rejects(async () => f(), TypeError, String(f));
    }
    await assert.rejects(async () => sb.process(1).signal('NOPE'), /signal must be one of/);
    assert.equal(srv.requests, before);
  });
});

// streams.test.mjs -- execStream (SSE), background processes, and streams that break: a server
// that drops the connection mid-stream, one that goes silent, one that ends without `exit`.
import assert from 'node:assert/strict';
import { describe, it, before } from 'node:test';
import { Sandbox, ConnectionError, NotFoundError, sandbox, localServer, sleep } from './helpers.mjs';

describe('execStream', () => {
  let sb;
  before(async () => {
    sb = await sandbox();
  });

  it('hands output to the callbacks as it arrives and resolves with the exit code', async () => {
    const out = [];
    const err = [];
    const stamps = [];
    let pid;
    const code = await sb.execStream('for i in 1 2 3; do echo o$i; echo e$i >&2; sleep 0.2; done; exit 4', {
      onStdout: (t) => {
        out.push(t);
        stamps.push(Date.now());
      },
      onStderr: (t) => err.push(t),
      onStart: (p) => (pid = p),
    });
    assert.equal(code, 4);
    assert.equal(out.join(''), 'o1\no2\no3\n');
    assert.equal(err.join(''), 'e1\ne2\ne3\n');
    assert.equal(typeof pid, 'number');
    assert.ok(stamps.at(-1) - stamps[0] >= 300, 'chunks arrived over time, not at the end');
  });

  it('bytes that are not UTF-8 arrive intact', async () => {
    const chunks = [];
    await sb.execStream("printf 'x\\377\\376y'", { onStdout: (_t, b) => chunks.push(Buffer.from(b)) });
    assert.deepEqual([...Buffer.concat(chunks)], [0x78, 0xff, 0xfe, 0x79]);
  });

  it('execStreamFull reports signal and timeout', async () => {
    const k = await sb.execStreamFull('kill -9 $$');
    assert.deepEqual(k, { exitCode: -1, signal: 9, timedOut: false });
    const t = await sb.execStreamFull('sleep 20', { timeoutMs: 300 });
    assert.equal(t.timedOut, true);
  });

  it('stdin, env, cwd and a pty', async () => {
    let out = '';
    await sb.execStream('cat; echo "$A"; pwd', { stdin: 'in\n', env: { A: 'aa' }, cwd: '/tmp', onStdout: (t) => (out += t) });
    assert.equal(out, 'in\naa\n/tmp\n');
    let tty = '';
    await sb.execStream('stty size', { pty: { cols: 100, rows: 30 }, onStdout: (t) => (tty += t) });
    assert.match(tty, /30 100/);
  });

  it('aborting kills the process (killOnDisconnect defaults to true)', async () => {
    const ac = new AbortController();
    let pid;
    const p = sb.execStream('sleep 60', { tag: 'abortme', signal: ac.signal, onStart: (x) => (pid = x) });
    while (pid === undefined) await sleep(20);
    ac.abort(new Error('enough'));
    await assert.rejects(p, /enough/);
    for (let i = 0; i < 50; i++) {
      const ps = await sb.processes();
      const me = ps.find((x) => x.pid === pid);
      if (!me || !me.running) return;
      await sleep(100);
    }
    assert.fail('the process still runs after the stream was aborted');
  });

  it('a stream on a missing sandbox rejects with NotFoundError before it starts', async () => {
    const gone = await Sandbox.create({ ttlSeconds: 60 });
    await gone.kill();
    await assert.rejects(gone.execStream('echo x'), NotFoundError);
  });
});

describe('background processes', () => {
  let sb;
  before(async () => {
    sb = await sandbox();
  });

  it('start, stdin, stream with replay, wait, list', async () => {
    const p = await sb.exec('cat', { background: true, tag: 'catter' });
    assert.equal(p.tag, 'catter');
    assert.equal(typeof p.pid, 'number');
    await p.sendStdin('line1\n');
    await p.sendStdin(new Uint8Array([0x6c, 0x32, 0x0a]));
    let listed = await sb.processes();
    const mine = listed.find((x) => x.pid === p.pid);
    assert.equal(mine.running, true);
    assert.equal(mine.tag, 'catter');
    assert.equal(mine.background, true);
    await p.closeStdin();
    let out = '';
    const exit = await p.stream({ onStdout: (t) => (out += t) });
    assert.equal(out, 'line1\nl2\n');
    assert.equal(exit.exitCode, 0);
    assert.deepEqual(await p.wait(), { exitCode: 0, signal: 0, timedOut: false });
    listed = await sb.processes();
    assert.equal(listed.find((x) => x.pid === p.pid).running, false);
  });

  it('signals and kill', async () => {
    const p = await sb.exec('trap "echo got-term; exit 3" TERM; while :; do sleep 0.05; done', { background: true });
    await sleep(200);
    await p.signal('TERM');
    let out = '';
    const e = await p.stream({ onStdout: (t) => (out += t) });
    assert.equal(e.exitCode, 3);
    assert.equal(out, 'got-term\n');
    const q = await sb.exec('sleep 60', { background: true });
    await q.kill();
    const w = await q.wait();
    assert.equal(w.signal, 9);
  });

  it('a pty process can be resized', async () => {
    const p = await sb.exec('sleep 0.5; stty size', { background: true, pty: { cols: 80, rows: 24 } });
    await p.resize(120, 40);
    let out = '';
    await p.stream({ onStdout: (t) => (out += t) });
    assert.match(out, /40 120/);
  });
});

describe('broken streams reject, never hang', () => {
  const apiKey = 'k';
  // A fake moatd: /v1/sandboxes/sb-x answers a sandbox; exec/stream starts and then misbehaves.
  async function fake(mode) {
    return localServer((req, res) => {
      if (req.url.startsWith('/v1/sandboxes/sb-x/exec/stream')) {
        res.writeHead(200, { 'Content-Type': 'text/event-stream' });
        res.write('event: start\ndata: {"pid": 5}\n\nevent: stdout\ndata: {"data":"partial\\n","encoding":"utf8"}\n\n');
        if (mode === 'drop') setTimeout(() => res.socket.destroy(), 100);
        if (mode === 'end') setTimeout(() => res.end(), 100);
        return; // 'silent': nothing more, connection kept open
      }
      if (req.url.startsWith('/v1/sandboxes/sb-x')) {
        res.writeHead(200, { 'Content-Type': 'application/json' });
        res.end(JSON.stringify({ id: 'sb-x', state: 'running', template: 'base', metadata: {}, persistent: false }));
        return;
      }
      res.writeHead(404, { 'Content-Type': 'application/json' }).end('{"code":"not_found","message":"no"}');
    });
  }

  for (const [mode, code] of [['drop', 'connection_error'], ['end', 'stream_ended'], ['silent', 'stream_idle']]) {
    it(`server ${mode}s mid-stream -> ConnectionError ${code}`, async () => {
      const srv = await fake(mode);
      try {
        const sb = await Sandbox.connect('sb-x', { apiUrl: srv.url, apiKey });
        let out = '';
        const t0 = Date.now();
        const e = await sb.execStream('x', { onStdout: (t) => (out += t), idleTimeoutMs: 1000 }).catch((x) => x);
        assert.ok(e instanceof ConnectionError, String(e));
        assert.equal(e.code, code);
        assert.equal(out, 'partial\n', 'output before the break was delivered');
        assert.ok(Date.now() - t0 < 5000);
      } finally {
        await srv.stop();
      }
    });
  }

  it('a download that breaks short of its Content-Length rejects', async () => {
    const srv = await localServer((req, res) => {
      if (req.url.includes('/files')) {
        res.writeHead(200, { 'Content-Type': 'application/octet-stream', 'Content-Length': '100000' });
        res.write(Buffer.alloc(1000, 1));
        setTimeout(() => res.socket.destroy(), 100);
        return;
      }
      res.writeHead(200, { 'Content-Type': 'application/json' });
      res.end(JSON.stringify({ id: 'sb-x', state: 'running', metadata: {} }));
    });
    try {
      const sb = await Sandbox.connect('sb-x', { apiUrl: srv.url, apiKey });
      await assert.rejects(sb.files.read('/f'), ConnectionError);
      let got = 0;
      await assert.rejects(
        (async () => {
          for await (const c of await sb.files.readStream('/f')) got += c.length;
        })(),
        ConnectionError,
      );
      assert.equal(got, 1000);
    } finally {
      await srv.stop();
    }
  });

  it('a process stream and a watch that drop reject too', async () => {
    const srv = await localServer((req, res) => {
      if (req.url.includes('/processes/') || req.url.includes('/files/watch')) {
        res.writeHead(200, { 'Content-Type': 'text/event-stream' });
        res.write(req.url.includes('watch') ? ': watching\n\n' : 'event: process\ndata: {"pid":5}\n\n');
        setTimeout(() => res.socket.destroy(), 100);
        return;
      }
      res.writeHead(200, { 'Content-Type': 'application/json' });
      res.end(JSON.stringify({ id: 'sb-x', state: 'running', metadata: {} }));
    });
    try {
      const sb = await Sandbox.connect('sb-x', { apiUrl: srv.url, apiKey });
      await assert.rejects(sb.process(5).wait(), ConnectionError);
      const w = await sb.files.watch('/tmp');
      await assert.rejects(
        (async () => {
          for await (const _ of w) {
            /* nothing arrives */
          }
        })(),
        ConnectionError,
      );
    } finally {
      await srv.stop();
    }
  });
});

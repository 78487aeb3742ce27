// pty.test.mjs -- sb.pty(): a terminal over WebSocket (ws): input, output, resize, in-band errors,
// close, attach to a running process, and a refused handshake as a typed error.
import assert from 'node:assert/strict';
import { describe, it, before } from 'node:test';
import { Connection, NotFoundError, AuthenticationError, sandbox, sleep, text, API_URL } from './helpers.mjs';
import { openPty } from '../dist/pty.js';

async function until(get, pred, ms = 10000) {
  const t0 = Date.now();
  while (!pred(get())) {
    if (Date.now() - t0 > ms) throw new Error('timed out; have ' + JSON.stringify(get()));
    await sleep(20);
  }
}

describe('pty', () => {
  let sb;
  before(async () => {
    sb = await sandbox();
  });

  it('round trip through a shell, resize, exit', async () => {
    const pty = await sb.pty({ cols: 80, rows: 24, cmd: '/bin/sh' });
    let out = '';
    pty.onData((d) => (out += text(d)));
    pty.write('stty size\n');
    await until(() => out, (o) => o.includes('24 80'));
    pty.resize(132, 50);
    await sleep(100);
    pty.write(new TextEncoder().encode('stty size; echo mark-$((6*7))\n'));
    await until(() => out, (o) => o.includes('50 132') && o.includes('mark-42'));
    pty.write('exit\n');
    const ex = await pty.exited;
    assert.equal(ex.code, 1000);
    assert.throws(() => pty.write('x'), /closed/);
  });

  it('close() ends the process the pty started', async () => {
    const pty = await sb.pty({ cmd: 'sleep 300' });
    await sleep(200);
    const running = async () => (await sb.processes()).filter((p) => p.running && p.cmd.includes('sleep 300')).length;
    assert.equal(await running(), 1);
    pty.close();
    await pty.exited;
    for (let i = 0; i < 50 && (await running()) > 0; i++) await sleep(100);
    assert.equal(await running(), 0);
  });

  it('attach to a background process by tag and replay its output', async () => {
    const p = await sb.exec('echo before; cat', { background: true, tag: 'ptycat', pty: { cols: 80, rows: 24 } });
    let out = '';
    const pty = await sb.pty({ tag: 'ptycat', onData: (d) => (out += text(d)) });
    await until(() => out, (o) => o.includes('before'));
    pty.write('typed\n');
    await until(() => out, (o) => o.includes('typed'));
    pty.close();
    await pty.exited;
    const ps = await sb.processes();
    assert.equal(ps.find((x) => x.pid === p.pid).running, true, 'attaching never kills');
    await p.kill();
  });

  it('in-band error frames reach onError and the terminal stays open (local ws server)', async () => {
    // moatd answers a resize out of bounds with {"type":"error"}; the SDK refuses to send one, so a
    // local WebSocket server plays that part here.
    const { WebSocketServer } = await import('ws');
    const wss = new WebSocketServer({ host: '127.0.0.1', port: 0 });
    await new Promise((r) => wss.on('listening', r));
    let auth;
    wss.on('connection', (ws, req) => {
      auth = req.headers.authorization;
      ws.on('message', (m, isBinary) => {
        if (!isBinary) ws.send(JSON.stringify({ type: 'error', message: 'not a tty' }));
        else {
          ws.send(Buffer.concat([Buffer.from('echo:'), m]), { binary: true });
          ws.close(1000);
        }
      });
    });
    try {
      const conn = new Connection('t', { apiUrl: `http://127.0.0.1:${wss.address().port}`, apiKey: 'kk' });
      const pty = await openPty(conn, 'sb-x', {});
      const errors = [];
      let out = '';
      pty.onError((m) => errors.push(m));
      pty.onData((d) => (out += text(d)));
      pty.resize(10, 10);
      await until(() => errors, (e) => e.length === 1);
      assert.deepEqual(errors, ['not a tty']);
      pty.write('x');
      assert.deepEqual(await pty.exited, { code: 1000, reason: '' });
      assert.equal(out, 'echo:x');
      assert.equal(auth, 'Bearer kk');
    } finally {
      wss.close();
    }
  });

  it('a refused handshake is a typed error', async () => {
    await assert.rejects(sb.pty({ tag: 'no-such-tag' }), NotFoundError);
    // The same sandbox through a connection with a wrong key (connect itself would 401 first).
    const conn = new Connection('t', { apiUrl: API_URL, apiKey: 'moat_wrong' });
    await assert.rejects(openPty(conn, sb.id, {}), AuthenticationError);
  });
});

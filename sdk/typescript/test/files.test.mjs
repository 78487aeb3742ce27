// files.test.mjs -- sb.files: read/readText/write/list/stat/exists/remove/mkdir/move/watch.
import assert from 'node:assert/strict';
import { describe, it, before } from 'node:test';
import { createHash } from 'node:crypto';
import { createReadStream, writeFileSync, unlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { NotFoundError, ForbiddenError, sandbox, text } from './helpers.mjs';

describe('files', () => {
  let sb;
  before(async () => {
    sb = await sandbox();
  });

  it('write and read text and bytes; mode', async () => {
    const w = await sb.files.write('/tmp/d/hello.txt', 'héllo\n');
    assert.deepEqual(w, { path: '/tmp/d/hello.txt', size: 7 });
    assert.equal(await sb.files.readText('/tmp/d/hello.txt'), 'héllo\n');
    const bytes = new Uint8Array(70000).map((_, i) => (i * 7) % 256);
    await sb.files.write('/tmp/d/bin', bytes, { mode: '0600' });
    const back = await sb.files.read('/tmp/d/bin');
    assert.ok(back instanceof Uint8Array);
    assert.deepEqual(Buffer.from(back), Buffer.from(bytes));
    assert.equal((await sb.files.stat('/tmp/d/bin')).mode, '0600');
    await sb.files.write('/tmp/d/x.sh', '#!/bin/sh\necho run\n', { mode: 0o755 });
    assert.equal((await sb.exec('/tmp/d/x.sh')).stdout, 'run\n');
    await sb.files.write('/tmp/d/ab', new Uint8Array([1, 2]).buffer);
    assert.equal((await sb.files.stat('/tmp/d/ab')).size, 2);
  });

  it('list, stat, exists, mkdir, move, remove', async () => {
    const e = await sb.files.mkdir('/tmp/m/a/b');
    assert.equal(e.type, 'dir');
    assert.equal(e.path, '/tmp/m/a/b');
    await sb.files.write('/tmp/m/f1', '1');
    const names = (await sb.files.list('/tmp/m')).map((x) => `${x.name}:${x.type}`).sort();
    assert.deepEqual(names, ['a:dir', 'f1:file']);
    const deep = (await sb.files.list('/tmp/m', { depth: 3 })).map((x) => x.path).sort();
    assert.ok(deep.includes('/tmp/m/a/b'), deep.join(','));
    const st = await sb.files.stat('/tmp/m/f1');
    assert.equal(st.size, 1);
    assert.equal(st.name, 'f1');
    assert.equal(typeof st.mtime, 'string');
    assert.equal(await sb.files.exists('/tmp/m/f1'), true);
    assert.equal(await sb.files.exists('/tmp/m/nope'), false);
    const mv = await sb.files.move('/tmp/m/f1', '/tmp/m/f2');
    assert.equal(mv.path, '/tmp/m/f2');
    assert.equal(await sb.files.exists('/tmp/m/f1'), false);
    await sb.files.remove('/tmp/m/f2');
    await assert.rejects(sb.files.stat('/tmp/m/f2'), NotFoundError);
    await sb.files.remove('/tmp/m', { recursive: true });
    assert.equal(await sb.files.exists('/tmp/m'), false);
  });

  it('user: files as the unprivileged user', async () => {
    await sb.files.write('notes.txt', 'mine', { user: 'user' });
    const st = await sb.files.stat('/home/user/notes.txt');
    assert.equal(st.uid, 1000);
    await assert.rejects(sb.files.write('/root/x', 'no', { user: 'user' }), ForbiddenError);
    assert.equal(text(await sb.files.read('notes.txt', { user: 'user' })), 'mine');
  });

  it('streaming upload and download (32 MiB, never held whole)', async () => {
    const MiB = 1 << 20;
    const h = createHash('sha256');
    async function* gen() {
      for (let i = 0; i < 32; i++) {
        const chunk = new Uint8Array(MiB).fill(i);
        chunk[0] = 255 - i;
        h.update(chunk);
        yield chunk;
      }
    }
    const w = await sb.files.write('/tmp/big.bin', gen());
    assert.equal(w.size, 32 * MiB);
    const want = h.digest('hex');
    assert.equal((await sb.exec('sha256sum /tmp/big.bin | cut -d" " -f1')).stdout.trim(), want);
    const back = createHash('sha256');
    let n = 0;
    for await (const c of await sb.files.readStream('/tmp/big.bin')) {
      back.update(c);
      n += c.length;
    }
    assert.equal(n, 32 * MiB);
    assert.equal(back.digest('hex'), want);

    // a web ReadableStream, and a Node file stream
    const rs = new ReadableStream({ start(c) { c.enqueue(new TextEncoder().encode('web ')); c.enqueue(new TextEncoder().encode('stream')); c.close(); } });
    await sb.files.write('/tmp/web.txt', rs);
    assert.equal(await sb.files.readText('/tmp/web.txt'), 'web stream');
    const local = join(tmpdir(), `moat-sdk-${process.pid}.txt`);
    writeFileSync(local, 'from disk\n');
    try {
      await sb.files.write('/tmp/disk.txt', createReadStream(local));
    } finally {
      unlinkSync(local);
    }
    assert.equal(await sb.files.readText('/tmp/disk.txt'), 'from disk\n');
    await assert.rejects(sb.files.readStream('/tmp/nope'), NotFoundError);
  });

  it('watch sees changes and closes', async () => {
    await sb.files.mkdir('/tmp/w');
    const w = await sb.files.watch('/tmp/w');
    const seen = [];
    const done = (async () => {
      for await (const ev of w) {
        seen.push(ev);
        if (ev.event === 'remove') break;
      }
    })();
    await sb.exec('echo a > /tmp/w/f; rm /tmp/w/f');
    await done;
    assert.ok(seen.some((e) => e.event === 'create' && e.path === '/tmp/w/f'), JSON.stringify(seen));
    assert.ok(seen.some((e) => e.event === 'remove' && e.path === '/tmp/w/f'), JSON.stringify(seen));

    const w2 = await sb.files.watch('/tmp/w', { recursive: true });
    const it2 = w2[Symbol.asyncIterator]();
    const pending = it2.next();
    w2.close();
    assert.deepEqual(await pending, { done: true, value: undefined });
    await assert.rejects(sb.files.watch('/tmp/no-such-dir'), NotFoundError);
  });
});

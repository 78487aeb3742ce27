// timetravel.test.mjs -- pause/resume, hibernate/wake, snapshots, fork, explore, rollback through
// the SDK. pause/resume need no CRIU; the rest skip (with the host's reason from /healthz) where
// moatd reports checkpoints unavailable, and a route this moatd lacks (501) skips with that reason.
import assert from 'node:assert/strict';
import { describe, it, before } from 'node:test';
import { Sandbox, ConflictError, NotImplementedError, sandbox, track, health } from './helpers.mjs';

let ckpt = { available: false, criu: 'unknown' };
// A checkpoint call that hangs fails its test after this long (instead of holding the file until the
// harness's timeout); every sandbox below is made with it.
const LIMIT = { requestTimeoutMs: 120_000 };

/** Runs fn, turning a 501 into a skip with moatd's message. */
async function orSkip(t, fn) {
  try {
    return await fn();
  } catch (e) {
    if (e instanceof NotImplementedError) {
      t.skip('moatd: ' + e.message);
      return undefined;
    }
    throw e;
  }
}

function needCheckpoints(t) {
  if (!ckpt.available) {
    t.skip('checkpoints unavailable on this host: ' + ckpt.criu);
    return false;
  }
  return true;
}

describe('time travel', () => {
  before(async () => {
    ckpt = (await health()).checkpoints ?? { available: false, criu: 'this moatd reports no checkpoints field' };
  });

  it('pause and resume', async (t) => {
    const sb = await sandbox(LIMIT);
    await orSkip(t, async () => {
      await sb.exec('echo kept > /tmp/f');
      await sb.pause();
      assert.equal(sb.info.state, 'paused');
      assert.equal(typeof sb.info.pausedAt, 'string');
      await assert.rejects(sb.exec('true'), (e) => e instanceof ConflictError && e.code === 'sandbox_paused');
      await sb.pause(); // a no-op
      await sb.resume();
      assert.equal(sb.info.state, 'running');
      assert.equal((await sb.exec('cat /tmp/f')).stdout, 'kept\n');
    });
  });

  it('hibernate and wake keep memory and files', async (t) => {
    if (!needCheckpoints(t)) return;
    const sb = await sandbox(LIMIT);
    const p = await sb.exec('i=0; while :; do i=$((i+1)); echo $i > /tmp/count; sleep 0.05; done', { background: true, tag: 'counter' });
    await sb.files.write('/tmp/file', 'before');
    await sb.hibernate();
    assert.equal(sb.info.state, 'hibernated');
    await sb.wake();
    assert.equal(sb.info.state, 'running');
    assert.equal(await sb.files.readText('/tmp/file'), 'before');
    const a = Number((await sb.exec('cat /tmp/count')).stdout);
    await new Promise((r) => setTimeout(r, 300));
    const b = Number((await sb.exec('cat /tmp/count')).stdout);
    assert.ok(b > a, `the counter process runs on after wake (${a} -> ${b})`);
    await p.kill();
    await sb.hibernate();
    assert.equal((await sb.exec('cat /tmp/file')).stdout, 'before', 'any call wakes a hibernated sandbox');
    assert.equal((await sb.getInfo()).state, 'running');
  });

  it('snapshot, list, create from it, rollback, delete', async (t) => {
    if (!needCheckpoints(t)) return;
    const sb = await sandbox(LIMIT);
    await sb.files.write('/tmp/state', 'v1');
    const snap = await sb.snapshot({ metadata: { step: 'one' } });
    assert.equal(typeof snap.id, 'string');
    assert.equal(snap.sandboxId, sb.id);
    assert.deepEqual(snap.metadata, { step: 'one' });
    const mine = await Sandbox.listSnapshots({ sandboxId: sb.id });
    assert.deepEqual(mine.map((s) => s.id), [snap.id]);

    const copy = track(await Sandbox.create({ fromSnapshot: snap.id, ...LIMIT }));
    assert.notEqual(copy.id, sb.id);
    assert.equal(copy.info.fromSnapshot, snap.id);
    assert.equal(await copy.files.readText('/tmp/state'), 'v1');

    await sb.files.write('/tmp/state', 'v2');
    await sb.rollback(snap.id);
    assert.equal(sb.info.fromSnapshot, snap.id);
    assert.equal(await sb.files.readText('/tmp/state'), 'v1');

    await Sandbox.deleteSnapshot(snap.id);
    assert.deepEqual(await Sandbox.listSnapshots({ sandboxId: sb.id }), []);
  });

  it('forkTree returns independent children', async (t) => {
    if (!needCheckpoints(t)) return;
    const sb = await sandbox(LIMIT);
    await sb.files.write('/tmp/who', 'parent');
    const kids = await sb.forkTree({ count: 3 });
    kids.forEach(track);
    assert.equal(kids.length, 3);
    assert.equal(new Set(kids.map((k) => k.id)).size, 3);
    for (const k of kids) {
      assert.ok(k instanceof Sandbox);
      assert.equal(k.info.forkedFrom, sb.id);
      assert.equal(await k.files.readText('/tmp/who'), 'parent');
    }
    await Promise.all(kids.map((k, i) => k.files.write('/tmp/who', 'kid' + i)));
    for (const [i, k] of kids.entries()) assert.equal(await k.files.readText('/tmp/who'), 'kid' + i);
    assert.equal(await sb.files.readText('/tmp/who'), 'parent');
  });

  it('explore keeps the first success; with a score it keeps the best', async (t) => {
    if (!needCheckpoints(t)) return;
    const sb = await sandbox(LIMIT);
    await sb.files.write('/tmp/base', 'x');
    const r = await sb.explore({ branches: ['exit 1', 'echo win > /tmp/out', { cmd: 'exit 2', timeoutMs: 60000 }] });
    assert.ok(r.winner, JSON.stringify(r.raw));
    track(r.winner);
    assert.equal(r.outcomes.length, 3);
    const won = r.outcomes.find((o) => o.sandboxId === r.winner.id);
    assert.equal(won.exitCode, 0);
    assert.ok(won.filesChanged.includes('/tmp/out'), JSON.stringify(won.filesChanged));
    assert.equal(await r.winner.files.readText('/tmp/out'), 'win\n');
    for (const o of r.outcomes.filter((x) => x.sandboxId !== r.winner.id)) {
      assert.equal((await Sandbox.connect(o.sandboxId)).info.state, 'killed');
    }

    const open = await sb.explore({ branches: ['echo a', 'echo b'], keep: 'best' });
    assert.equal(open.winner, null);
    assert.equal(typeof open.exploreId, 'string');
    assert.equal(typeof open.expiresAt, 'string');
    open.outcomes.forEach((o) => track({ kill: () => Sandbox.connect(o.sandboxId).then((s) => s.kill()) }));
    const pick = open.outcomes.find((o) => o.stdoutTail === 'b\n');
    const chosen = track(await sb.chooseExploreBranch(open.exploreId, pick.sandboxId));
    assert.equal(chosen.id, pick.sandboxId);
    assert.equal((await chosen.exec('true')).exitCode, 0);
    const other = open.outcomes.find((o) => o.sandboxId !== pick.sandboxId);
    assert.equal((await Sandbox.connect(other.sandboxId)).info.state, 'killed');

    const scored = await sb.explore({
      branches: ['echo 3', 'echo 9', 'echo 5'],
      score: (o) => Number(o.stdoutTail.trim()),
    });
    track(scored.winner);
    assert.equal((await scored.winner.exec('true')).exitCode, 0);
    const best = scored.outcomes.find((o) => o.sandboxId === scored.winner.id);
    assert.equal(best.stdoutTail, '9\n');
    for (const o of scored.outcomes.filter((x) => x.sandboxId !== scored.winner.id)) {
      assert.equal((await Sandbox.connect(o.sandboxId)).info.state, 'killed');
    }
  });
});

// logs.test.mjs -- Sandbox.logs: the stored output with its stream and pid, since, follow (live).
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { sandbox } from './helpers.mjs';

async function collect(it) {
  const out = [];
  for await (const e of it) out.push(e);
  return out;
}

async function waitFor(sb, pred, opts = {}) {
  const end = Date.now() + 20_000;
  for (;;) {
    const got = await collect(sb.logs(opts));
    if (pred(got) || Date.now() > end) return got;
    await new Promise((r) => setTimeout(r, 200));
  }
}

const text = (es, stream) => es.filter((e) => e.type === 'output' && (!stream || e.stream === stream)).map((e) => e.text).join('');

describe('Sandbox.logs', () => {
  it('has every stream with its pid, lifecycle lines, since and follow', async () => {
    const sb = await sandbox();
    await sb.exec(['sh', '-c', 'echo ts-out; echo ts-err >&2']);
    const got = await waitFor(sb, (es) => text(es).includes('ts-err'));
    assert.equal(text(got, 'stdout'), 'ts-out\n');
    assert.equal(text(got, 'stderr'), 'ts-err\n');
    const start = got.find((e) => e.type === 'process' && e.event === 'start');
    assert.ok(start && got.filter((e) => e.type === 'output').every((e) => e.pid === start.pid));
    assert.deepEqual(got.filter((e) => e.type === 'lifecycle').map((e) => e.event).slice(0, 2), ['created', 'running']);
    const mark = Date.now() + 50;
    await new Promise((r) => setTimeout(r, 100));
    const follow = sb.logs({ follow: true, since: new Date(mark) });
    await sb.exec(['sh', '-c', 'echo ts-live']);
    let seen = '';
    for await (const e of follow) {
      assert.ok(e.atMs === undefined || e.atMs >= mark);
      if (e.type === 'output') seen += e.text;
      if (seen.includes('ts-live')) break;
    }
    assert.ok(!seen.includes('ts-out'));
    await assert.rejects(collect(sb.logs({ since: 'yesterday' })), (e) => e.code === 'invalid_request');
  });
});

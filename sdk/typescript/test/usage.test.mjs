// usage.test.mjs -- Usage.query (GET /v1/usage) and Sandbox#metrics, now and as history. A kill
// takes the sandbox's last sample, so its use is there at once whatever moatd's sampling period.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { InvalidRequestError, NotFoundError, Sandbox, Usage, sandbox } from './helpers.mjs';

describe('usage', () => {
  it('a killed sandbox has its CPU, memory and history; groups; bad input', async () => {
    const team = 'ts-' + Math.random().toString(36).slice(2, 8);
    const sb = await sandbox({ metadata: { team } });
    const now = await sb.metrics();
    assert.equal(now.sandbox_id, sb.id);
    assert.ok(now.cpu && now.memory, JSON.stringify(now));
    await sb.exec("timeout 1 sh -c 'while :; do :; done'; true");
    await sb.kill();
    const rows = await Usage.query({ groupBy: 'sandbox', to: new Date(Date.now() + 1000) });
    const mine = rows.find((r) => r.key === sb.id);
    assert.ok(mine, JSON.stringify(rows));
    assert.ok(mine.cpuSeconds > 0.1, JSON.stringify(mine));
    assert.ok(mine.memoryGibSeconds > 0 && mine.sandboxSeconds > 0.5, JSON.stringify(mine));
    const byTeam = await Usage.query({ groupBy: 'metadata.team', from: Date.now() - 3_600_000 });
    const t = byTeam.find((r) => r.key === team);
    assert.ok(t, JSON.stringify(byTeam));
    assert.ok(Math.abs(t.cpuSeconds - mine.cpuSeconds) < 0.01, JSON.stringify([t, mine]));
    // per bucket: aligned Dates, oldest first, summing to the row's totals
    const series = await Usage.query({ groupBy: 'metadata.team', from: Date.now() - 3_600_000, bucket: 300 });
    const ts = series.find((r) => r.key === team);
    assert.ok(ts && ts.series && ts.series.length >= 1, JSON.stringify(series));
    for (const p of ts.series) assert.ok(p.start instanceof Date && p.start.getTime() % 300_000 === 0, JSON.stringify(p));
    const starts = ts.series.map((p) => p.start.getTime());
    assert.deepEqual(starts, [...starts].sort((a, b) => a - b));
    const sum = ts.series.reduce((a, p) => a + p.cpuSeconds, 0);
    assert.ok(Math.abs(sum - ts.cpuSeconds) < 0.01, JSON.stringify(ts));
    assert.equal(t.series, undefined);
    await assert.rejects(Usage.query({ bucket: 59 }), /bucket/);
    await assert.rejects(Usage.query({ bucket: 60, from: Date.now() - 30 * 86_400_000 }), (e) => e instanceof InvalidRequestError);
    const hist = await sb.metrics({ from: new Date(Date.now() - 3_600_000) });
    assert.ok(hist.length >= 1, JSON.stringify(hist));
    const last = hist[hist.length - 1];
    assert.ok(last.timestamp instanceof Date && last.memoryLimitBytes > 0, JSON.stringify(last));
    assert.ok(Math.abs(last.cpuSeconds - mine.cpuSeconds) < 0.01, JSON.stringify([last, mine]));
    assert.deepEqual(await sb.metrics({ from: 0, to: 1000 }), []);
    await assert.rejects(Usage.query({ groupBy: 'bogus' }), /groupBy/);
    await assert.rejects(Usage.query({ from: 'yesterday' }), (e) => e instanceof InvalidRequestError);
    await assert.rejects(Usage.query({ from: '2026-01-02T00:00:00Z', to: '2026-01-01T00:00:00Z' }), (e) => e instanceof InvalidRequestError);
    const other = await Sandbox.connect(sb.id).catch((e) => e);
    assert.ok(other instanceof NotFoundError || other instanceof Sandbox);
  });
});

// e2b_metrics.mjs -- the unmodified npm `e2b` SDK's getMetrics against moatd.
//
// Usage: node e2b_metrics.mjs SCENARIO, with E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY pointing
// at moatd (tests/integration/test_metrics.py sets them). Prints "ok SCENARIO" and exits 0, or
// prints the failure and exits 1. Every sandbox a scenario creates is killed in a finally block.
import assert from 'node:assert/strict'
import { Sandbox, NotFoundError } from 'e2b'

const made = []

const scenarios = {
  // getMetrics (instance and static): one current sample with E2B's fields; a range in the past is
  // empty; a missing sandbox is NotFoundError.
  async get_metrics() {
    const sbx = await Sandbox.create('base', { timeoutMs: 120_000 })
    made.push(sbx.sandboxId)
    const list = await sbx.getMetrics()
    // the recorded samples (metering's history), oldest first, then the sample of now
    assert.ok(list.length >= 1, JSON.stringify(list))
    const m = list[list.length - 1]
    for (let i = 1; i < list.length; i++) assert.ok(list[i - 1].timestamp <= list[i].timestamp)
    assert.ok(m.timestamp instanceof Date && !isNaN(m.timestamp), String(m.timestamp))
    assert.ok(Math.abs(m.timestamp.getTime() - Date.now()) < 10_000, m.timestamp.toISOString())
    assert.ok(Number.isInteger(m.cpuCount) && m.cpuCount >= 1, JSON.stringify(m))
    assert.ok(typeof m.cpuUsedPct === 'number' && m.cpuUsedPct >= 0 && m.cpuUsedPct <= 100, JSON.stringify(m))
    assert.ok(m.memUsed > 0 && m.memTotal >= m.memUsed, JSON.stringify(m))
    assert.ok(m.diskTotal > 0 && m.diskUsed > 0 && m.diskUsed <= m.diskTotal, JSON.stringify(m))
    const info = await sbx.getInfo()
    assert.equal(m.memTotal, info.memoryMB * 1024 * 1024)
    assert.equal(m.cpuCount, info.cpuCount)

    const now = Date.now()
    const inRange = await Sandbox.getMetrics(sbx.sandboxId, { start: new Date(now - 60_000), end: new Date(now + 60_000) })
    assert.ok(inRange.length >= 1)
    const past = await Sandbox.getMetrics(sbx.sandboxId, { start: new Date(now - 3_600_000), end: new Date(now - 3_000_000) })
    assert.deepEqual(past, [])

    await assert.rejects(Sandbox.getMetrics('sb-00000000000000000'), NotFoundError)
  },
}

const name = process.argv[2]
if (!scenarios[name]) {
  console.error('unknown scenario ' + name)
  process.exit(2)
}
try {
  await scenarios[name]()
  console.log('ok ' + name)
} catch (e) {
  console.error(e)
  process.exitCode = 1
} finally {
  for (const id of made) {
    try {
      await Sandbox.kill(id)
    } catch {}
  }
}

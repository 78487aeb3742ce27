// e2b_245.mjs -- the unmodified npm `e2b` 2.45 (installed as `e2b-245`), the wire generation whose
// SDK checks the key's shape (^e2b_[0-9a-f]+$) before sending, against moatd.
//
// Usage: node e2b_245.mjs SCENARIO, with E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY (the key in
// E2B form) pointing at moatd (tests/integration/test_e2b.py sets them). Prints "ok SCENARIO" and
// exits 0, or the failure and exits 1. Every sandbox it creates is killed in a finally block.
import assert from 'node:assert/strict'
import { Sandbox, AuthenticationError, NotFoundError, CommandExitError } from 'e2b-245'

const made = []
async function create(opts = {}) {
  const sbx = await Sandbox.create('base', opts)
  made.push(sbx.sandboxId)
  return sbx
}

const scenarios = {
  // The key in moat form is refused by the SDK itself; in E2B form it works end to end.
  async keys_and_lifecycle() {
    const moatForm = 'moat_' + process.env.E2B_API_KEY.slice(4)
    await assert.rejects(Sandbox.create('base', { apiKey: moatForm }), AuthenticationError)
    const tag = 'g245-' + Math.random().toString(36).slice(2)
    const a = await create({ metadata: { suite: tag }, timeoutMs: 120_000 })
    const b = await create({ metadata: { suite: tag }, allowInternetAccess: false })
    const info = await a.getInfo()
    assert.equal(info.sandboxId, a.sandboxId)
    const pager = Sandbox.list({ query: { metadata: { suite: tag } }, limit: 1 })
    const ids = []
    while (pager.hasNext) ids.push(...(await pager.nextItems()).map((s) => s.sandboxId))
    assert.deepEqual(ids, [b.sandboxId, a.sandboxId])
    const c = await Sandbox.connect(a.sandboxId)
    assert.equal((await c.commands.run('echo hi; id -un')).stdout, 'hi\nuser\n')
    await assert.rejects(c.commands.run('exit 4'), (e) => e instanceof CommandExitError && e.exitCode === 4)
    await c.files.write('/home/user/new/dir/f.txt', 'from 2.45')
    assert.equal(await c.files.read('/home/user/new/dir/f.txt'), 'from 2.45')
    assert.equal(await Sandbox.kill(b.sandboxId), true)
    await assert.rejects(Sandbox.connect(b.sandboxId), NotFoundError)
    // a well-shaped key that is not moatd's: the server's 401
    await assert.rejects(Sandbox.list({ apiKey: 'e2b_' + '0'.repeat(64) }).nextItems(), AuthenticationError)
  },
}

const name = process.argv[2]
try {
  await scenarios[name]()
  console.log('ok ' + name)
} catch (e) {
  console.error(`FAIL ${name}:`, e)
  process.exitCode = 1
} finally {
  for (const id of made) await Sandbox.kill(id).catch(() => {})
}

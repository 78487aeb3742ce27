// e2b_control.mjs -- the unmodified npm `e2b` SDK's control plane against moatd.
//
// Usage: node e2b_control.mjs SCENARIO, with E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY
// pointing at moatd (tests/integration/test_e2b.py sets them; MOAT_URL is moatd's v1 base URL for
// cross-checks). Prints "ok SCENARIO" and exits 0, or prints the failure and exits 1. Every
// sandbox a scenario creates is killed in a finally block.
import assert from 'node:assert/strict'
import { Sandbox, NotFoundError, AuthenticationError, SandboxError, TemplateError } from 'e2b'

const V1 = process.env.MOAT_URL
const KEY = process.env.E2B_API_KEY

async function v1(method, path, body) {
  const res = await fetch(V1 + path, {
    method,
    headers: { Authorization: 'Bearer ' + KEY, 'Content-Type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  })
  const text = await res.text()
  return { status: res.status, body: text ? JSON.parse(text) : null }
}

const made = []
async function create(opts = {}) {
  const sbx = await Sandbox.create('base', opts)
  made.push(sbx.sandboxId)
  return sbx
}

async function sh(id, cmd) {
  const r = await v1('POST', `/v1/sandboxes/${id}/exec`, { cmd })
  assert.equal(r.status, 200, JSON.stringify(r.body))
  return r.body
}

async function rejects(p, cls, what) {
  const t0 = Date.now()
  try {
    await p
  } catch (e) {
    assert.ok(e instanceof cls, `${what}: want ${cls.name}, got ${e?.constructor?.name}: ${e?.message}`)
    assert.ok(Date.now() - t0 < 20000, `${what}: took ${Date.now() - t0} ms`)
    return e
  }
  assert.fail(`${what}: no error`)
}

const scenarios = {
  // Create with metadata and envs; getInfo; the same sandbox through the v1 API; env inside.
  async create_info() {
    const sbx = await create({ metadata: { owner: 'e2b-test', 'x y': 'a&b=c' }, envs: { GREETING: 'hello e2b' }, timeoutMs: 120_000 })
    assert.match(sbx.sandboxId, /^sb-[a-z0-9]{17}$/)
    const info = await sbx.getInfo()
    assert.equal(info.sandboxId, sbx.sandboxId)
    assert.equal(info.templateId, 'base')
    assert.equal(info.state, 'running')
    assert.deepEqual(info.metadata, { owner: 'e2b-test', 'x y': 'a&b=c' })
    const left = info.endAt.getTime() - Date.now()
    assert.ok(left > 100_000 && left <= 121_000, `endAt ${info.endAt.toISOString()}`)
    assert.ok(info.cpuCount >= 1 && info.memoryMB >= 16, JSON.stringify(info))
    assert.match(info.envdVersion, /^0\.6\.\d+$/)
    const native = await v1('GET', `/v1/sandboxes/${sbx.sandboxId}`)
    assert.equal(native.status, 200)
    assert.equal(native.body.template, 'base')
    assert.equal(native.body.metadata.owner, 'e2b-test')
    const out = await sh(sbx.sandboxId, 'printf %s "$GREETING"')
    assert.equal(out.stdout, 'hello e2b')
    const run = await sbx.commands.run('printf %s "$GREETING"')
    assert.equal(run.stdout, 'hello e2b')
    assert.equal(run.exitCode, 0)
    // made through v1, seen through E2B
    const r = await v1('POST', '/v1/sandboxes', { template: 'base', metadata: { via: 'v1' } })
    assert.equal(r.status, 201)
    made.push(r.body.id)
    const info2 = await Sandbox.getInfo(r.body.id)
    assert.equal(info2.metadata.via, 'v1')
    assert.equal(await Sandbox.kill(r.body.id), true)
  },

  // list with a metadata filter (keys and values needing encoding) and paging.
  async list_paging() {
    const tag = 'run-' + Math.random().toString(36).slice(2)
    for (let i = 0; i < 3; i++) await create({ metadata: { suite: tag, 'odd key': 'v=1&2', i: String(i) } })
    await create({ metadata: { suite: 'other' } })
    const pager = Sandbox.list({ query: { metadata: { suite: tag, 'odd key': 'v=1&2' } }, limit: 2 })
    const page1 = await pager.nextItems()
    assert.equal(page1.length, 2)
    assert.ok(pager.hasNext)
    const page2 = await pager.nextItems()
    assert.equal(page2.length, 1)
    assert.ok(!pager.hasNext)
    // newest first, as E2B lists
    const ids = [...page1, ...page2].map((s) => s.sandboxId)
    assert.deepEqual(ids, made.slice(0, 3).reverse())
    for (const s of [...page1, ...page2]) {
      assert.equal(s.metadata.suite, tag)
      assert.equal(s.state, 'running')
    }
    const paused = await Sandbox.list({ query: { metadata: { suite: tag }, state: ['paused'] } }).nextItems()
    assert.equal(paused.length, 0)
    const none = await Sandbox.list({ query: { metadata: { suite: 'no-such-' + tag } } }).nextItems()
    assert.equal(none.length, 0)
  },

  // setTimeout moves endAt, and the sandbox dies when it passes.
  async set_timeout() {
    const sbx = await create({ timeoutMs: 600_000 })
    await sbx.setTimeout(3_000)
    const info = await sbx.getInfo()
    const left = info.endAt.getTime() - Date.now()
    assert.ok(left > 0 && left <= 3_500, `endAt in ${left} ms`)
    const deadline = Date.now() + 30_000
    for (;;) {
      try {
        await sbx.getInfo()
      } catch (e) {
        assert.ok(e instanceof NotFoundError, e.message)
        break
      }
      assert.ok(Date.now() < deadline, 'the sandbox outlived its timeout by 27 s')
      await new Promise((r) => setTimeout(r, 250))
    }
    assert.equal(await sbx.isRunning(), false)
  },

  // kill: true once, then false; the sandbox is gone for both APIs.
  async kill() {
    const sbx = await create()
    assert.equal(await sbx.isRunning(), true)
    assert.equal(await sbx.kill(), true)
    assert.equal(await Sandbox.kill(sbx.sandboxId), false)
    await rejects(Sandbox.getInfo(sbx.sandboxId), NotFoundError, 'getInfo after kill')
    const native = await v1('GET', `/v1/sandboxes/${sbx.sandboxId}`)
    assert.equal(native.body.state, 'killed')
    assert.equal(await sbx.isRunning(), false)
  },

  // connect to a running sandbox: a new handle whose token works; the timeout can only grow.
  async connect() {
    const sbx = await create({ timeoutMs: 60_000 })
    const again = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 300_000 })
    assert.equal(again.sandboxId, sbx.sandboxId)
    assert.equal(await again.isRunning(), true)
    const left = (await again.getInfo()).endAt.getTime() - Date.now()
    assert.ok(left > 250_000, `endAt in ${left} ms after connect with 300 s`)
    await rejects(Sandbox.connect('sb-0000000000000000x'), NotFoundError, 'connect to an unknown sandbox')
  },

  // pause, then connect resumes it with its files and processes intact.
  async pause_connect() {
    const sbx = await create()
    await sh(sbx.sandboxId, 'echo kept > /tmp/kept; (sleep 1000 & echo $! > /tmp/sleeper)')
    const pid = (await sh(sbx.sandboxId, 'cat /tmp/sleeper')).stdout.trim()
    await sbx.files.write('/home/user/notes.txt', 'through envd')
    const bg = await sbx.commands.run('sleep 1000', { background: true })
    assert.equal(await sbx.pause(), true)
    assert.equal((await sbx.getInfo()).state, 'paused')
    assert.equal(await Sandbox.pause(sbx.sandboxId), false) // already paused
    const listed = await Sandbox.list({ query: { state: ['paused'] } }).nextItems()
    assert.ok(listed.some((s) => s.sandboxId === sbx.sandboxId))
    assert.equal(await sbx.isRunning(), false)
    const back = await Sandbox.connect(sbx.sandboxId)
    assert.equal((await back.getInfo()).state, 'running')
    assert.equal((await sh(sbx.sandboxId, 'cat /tmp/kept')).stdout, 'kept\n')
    assert.equal((await sh(sbx.sandboxId, `kill -0 ${pid} && echo alive`)).stdout, 'alive\n')
    assert.equal(await back.files.read('/home/user/notes.txt'), 'through envd')
    const procs = await back.commands.list()
    assert.ok(procs.some((p) => p.pid === bg.pid), JSON.stringify(procs))
    assert.equal(await back.isRunning(), true)
  },

  // Snapshots (createSnapshot, listSnapshots, create from one, deleteSnapshot) and fork.
  async snapshot_fork() {
    const sbx = await create({ metadata: { role: 'parent' } })
    await sbx.files.write('/home/user/state.txt', 'before snapshot')
    let snap
    try {
      snap = await sbx.createSnapshot({ name: 'e2b-test-snap' })
    } catch (e) {
      if (e instanceof SandboxError && /^501: /.test(e.message)) {
        console.log('skip checkpoints are not available on this host: ' + e.message)
        return
      }
      throw e
    }
    assert.match(snap.snapshotId, /^snap-/)
    assert.deepEqual(snap.names, ['e2b-test-snap'])
    await sbx.files.write('/home/user/state.txt', 'after snapshot')
    const listed = await sbx.listSnapshots().nextItems()
    assert.deepEqual(listed.map((x) => x.snapshotId), [snap.snapshotId])
    const byName = await Sandbox.listSnapshots({ name: 'e2b-test-snap' }).nextItems()
    assert.ok(byName.some((x) => x.snapshotId === snap.snapshotId))
    const restored = await Sandbox.create(snap.snapshotId)
    made.push(restored.sandboxId)
    assert.equal(await restored.files.read('/home/user/state.txt'), 'before snapshot')
    const kids = await sbx.fork({ count: 2 })
    assert.equal(kids.length, 2)
    for (const k of kids) {
      assert.ok(!(k instanceof Error), String(k))
      made.push(k.sandboxId)
      assert.notEqual(k.sandboxId, sbx.sandboxId)
      assert.equal(await k.files.read('/home/user/state.txt'), 'after snapshot')
      assert.equal((await k.getInfo()).metadata.role, 'parent')
    }
    await kids[0].files.write('/home/user/state.txt', 'child 0')
    assert.equal(await kids[1].files.read('/home/user/state.txt'), 'after snapshot')
    assert.equal(await sbx.files.read('/home/user/state.txt'), 'after snapshot')
    assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true)
    assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), false)
    await rejects(Sandbox.create(snap.snapshotId), SandboxError, 'create from a deleted snapshot')
    await rejects(Sandbox.fork('sb-0000000000000000x'), NotFoundError, 'fork unknown')
  },

  // What the envdVersion we announce turns on in the SDK: watch includeEntry works; watching network
  // mounts is refused by the SDK itself.
  async envd_version_gates() {
    const sbx = await create()
    assert.equal((await sbx.getInfo()).envdVersion, '0.6.3')
    const events = []
    const h = await sbx.files.watchDir('/home/user', (e) => events.push(e), { includeEntry: true })
    await sbx.files.write('/home/user/watched.txt', 'hello')
    const deadline = Date.now() + 10_000
    while (!events.some((e) => e.name === 'watched.txt' && e.entry) && Date.now() < deadline)
      await new Promise((r) => setTimeout(r, 50))
    await h.stop()
    const ev = events.find((e) => e.name === 'watched.txt' && e.entry)
    assert.ok(ev, JSON.stringify(events))
    assert.equal(ev.entry.path, '/home/user/watched.txt')
    await assert.rejects(sbx.files.watchDir('/home/user', () => {}, { allowNetworkMounts: true }),
      (e) => e instanceof TemplateError)
  },

  // Bad input gets the SDK's own errors, fast.
  async bad_input() {
    await rejects(Sandbox.getInfo('sb-0000000000000000x'), NotFoundError, 'getInfo unknown')
    await rejects(Sandbox.getInfo('not-an-id'), NotFoundError, 'getInfo malformed id')
    await rejects(Sandbox.setTimeout('sb-0000000000000000x', 10_000), NotFoundError, 'setTimeout unknown')
    assert.equal(await Sandbox.kill('sb-0000000000000000x'), false)
    await rejects(Sandbox.create('base', { apiKey: 'moat_wrong' }), AuthenticationError, 'bad key')
    await rejects(Sandbox.list({ apiKey: 'moat_wrong' }).nextItems(), AuthenticationError, 'bad key list')
    const e = await rejects(Sandbox.create('no-such-template'), SandboxError, 'bad template')
    assert.match(e.message, /no-such-template/)
    // allowInternetAccess is honoured (without an uplink: loopback only, still created)
    const sbx = await create({ allowInternetAccess: true })
    await rejects(sbx.setTimeout(0), SandboxError, 'timeout 0')
    // a sandbox call with a wrong access token
    const forged = new Sandbox({ sandboxId: sbx.sandboxId, envdAccessToken: 'e2b1_00_00', envdVersion: '0.6.3' })
    await rejects(forged.isRunning(), AuthenticationError, 'forged token')
  },
}

const name = process.argv[2]
if (!scenarios[name]) {
  console.error(`unknown scenario ${name}; one of ${Object.keys(scenarios).join(' ')}`)
  process.exit(2)
}
try {
  await scenarios[name]()
  console.log('ok ' + name)
} catch (e) {
  console.error(`FAIL ${name}:`, e)
  process.exitCode = 1
} finally {
  for (const id of made) await Sandbox.kill(id).catch(() => {})
}
// runCode leaves its request timer (requestTimeoutMs, 60 s) running when the server answers an
// error, which would keep Node alive for a minute: exit now that everything is cleaned up.
process.exit(process.exitCode ?? 0)

// e2b.mjs -- the agent loop of issue 6 through the unmodified E2B SDK against moatd, with moat's own
// v1 API (plain fetch) as the peer measured in the same run.
//
//   node bench/e2b.mjs [--loops N] [--pace MS]
//
// One loop = create (`base`), 10 commands, 3 file writes (1 KiB), kill. E2B loops and v1 loops
// alternate, --pace ms apart (the warm pool refills). The E2B loop goes through
// Sandbox.create / sbx.commands.run / sbx.files.write / sbx.kill; the v1 loop does the same work:
// POST /v1/sandboxes, POST .../exec {argv: [/bin/bash, -l, -c, CMD], user: "user"} (what envd runs
// for commands.run), PUT .../files?path=&user=user, DELETE. Prints p50/p95/p99 per call kind and
// per loop, and the E2B / v1 ratios. Then, on one code-interpreter sandbox, --runs runCode('1 + 1')
// calls (@e2b/code-interpreter) against the same cell on moat's v1 contexts API, alternating.
//
// Without E2B_API_URL it starts its own moatd through tests/lib/moatd.py (MOAT_BUILD, default build).
import { spawn } from 'node:child_process'
import { createRequire } from 'node:module'
import path from 'node:path'
import { fileURLToPath } from 'node:url'
import { performance } from 'node:perf_hooks'

const REPO = path.dirname(path.dirname(fileURLToPath(import.meta.url)))
const require = createRequire(path.join(REPO, 'tests', 'node', 'package.json'))
const { Sandbox } = await import(require.resolve('e2b'))
const CI = await import(require.resolve('@e2b/code-interpreter'))

const args = process.argv.slice(2)
const opt = (name, def) => {
  const i = args.indexOf(name)
  return i >= 0 ? Number(args[i + 1]) : def
}
const LOOPS = opt('--loops', 30)
const PACE = opt('--pace', 250)
const RUNS = opt('--runs', 200)

async function startDaemon() {
  const py = `
import os, sys
sys.path.insert(0, os.path.join(${JSON.stringify(REPO)}, "tests", "lib"))
import moatd
d = moatd.MoatDaemon(pool=2)
try:
    d.start()
    print(d.port, d.client.key, flush=True)
    sys.stdin.read()
finally:
    d.stop()
`
  const p = spawn('python3', ['-c', py], { stdio: ['pipe', 'pipe', 'inherit'], env: process.env })
  const line = await new Promise((resolve, reject) => {
    let buf = ''
    p.stdout.on('data', (d) => {
      buf += d
      if (buf.includes('\n')) resolve(buf.split('\n')[0])
    })
    p.on('exit', (c) => reject(new Error(`moatd helper exited ${c}`)))
  })
  const [port, key] = line.trim().split(' ')
  return {
    url: `http://127.0.0.1:${port}`,
    key,
    stop: () => new Promise((r) => { p.on('exit', r); p.stdin.end() }),
  }
}

let daemon = null
if (!process.env.E2B_API_URL) {
  daemon = await startDaemon()
  process.env.E2B_API_URL = daemon.url
  process.env.E2B_SANDBOX_URL = daemon.url
  process.env.E2B_API_KEY = daemon.key
}
const URL_ = process.env.E2B_API_URL
const KEY = process.env.E2B_API_KEY

const samples = {}
const add = (k, ms) => (samples[k] ??= []).push(ms)
async function timed(k, f) {
  const t0 = performance.now()
  const v = await f()
  add(k, performance.now() - t0)
  return v
}

const content = 'x'.repeat(1023) + '\n'

async function e2bLoop() {
  const t0 = performance.now()
  const sbx = await timed('e2b create', () => Sandbox.create('base'))
  try {
    for (let i = 0; i < 10; i++) {
      const r = await timed('e2b command', () => sbx.commands.run(`echo step ${i}`))
      if (r.stdout !== `step ${i}\n`) throw new Error(`unexpected output ${JSON.stringify(r.stdout)}`)
    }
    for (let i = 0; i < 3; i++) await timed('e2b file write', () => sbx.files.write(`/home/user/f${i}.txt`, content))
  } finally {
    await timed('e2b kill', () => sbx.kill())
  }
  add('e2b loop', performance.now() - t0)
}

async function v1(method, p, body, raw) {
  const res = await fetch(URL_ + p, {
    method,
    headers: { Authorization: 'Bearer ' + KEY, 'Content-Type': raw ? 'application/octet-stream' : 'application/json' },
    body: raw ?? (body === undefined ? undefined : JSON.stringify(body)),
  })
  const text = await res.text()
  if (!res.ok) throw new Error(`${method} ${p}: ${res.status} ${text}`)
  return text ? JSON.parse(text) : null
}

async function v1Loop() {
  const t0 = performance.now()
  const sb = await timed('v1 create', () => v1('POST', '/v1/sandboxes', { template: 'base' }))
  try {
    for (let i = 0; i < 10; i++) {
      const r = await timed('v1 command', () =>
        v1('POST', `/v1/sandboxes/${sb.id}/exec`, { argv: ['/bin/bash', '-l', '-c', `echo step ${i}`], user: 'user' }))
      if (r.stdout !== `step ${i}\n`) throw new Error(`unexpected output ${JSON.stringify(r.stdout)}`)
    }
    for (let i = 0; i < 3; i++)
      await timed('v1 file write', () =>
        v1('PUT', `/v1/sandboxes/${sb.id}/files?path=/home/user/f${i}.txt&user=user`, undefined, content))
  } finally {
    await timed('v1 kill', () => v1('DELETE', `/v1/sandboxes/${sb.id}`))
  }
  add('v1 loop', performance.now() - t0)
}

const pct = (xs, p) => {
  const s = [...xs].sort((a, b) => a - b)
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))]
}

try {
  await e2bLoop() // warm-up (connections, code paths)
  await v1Loop()
  for (const k of Object.keys(samples)) samples[k] = []
  for (let i = 0; i < LOOPS; i++) {
    await new Promise((r) => setTimeout(r, PACE))
    if (i % 2) {
      await v1Loop()
      await new Promise((r) => setTimeout(r, PACE))
      await e2bLoop()
    } else {
      await e2bLoop()
      await new Promise((r) => setTimeout(r, PACE))
      await v1Loop()
    }
  }
  // the code interpreter: runCode against v1 contexts/{cid}/run on one sandbox
  const ci = await CI.Sandbox.create({ timeoutMs: 600_000 })
  try {
    const ctx = await v1('POST', `/v1/sandboxes/${ci.sandboxId}/contexts`, { language: 'python' })
    for (let i = 0; i < 10; i++) {
      await ci.runCode('1 + 1')
      await v1('POST', `/v1/sandboxes/${ci.sandboxId}/contexts/${ctx.id}/run`, { code: '1 + 1' })
    }
    for (let i = 0; i < RUNS; i++) {
      const e = await timed('e2b runCode', () => ci.runCode('1 + 1'))
      if (e.text !== '2') throw new Error(`runCode gave ${e.text}`)
      const r = await timed('v1 context run', () =>
        v1('POST', `/v1/sandboxes/${ci.sandboxId}/contexts/${ctx.id}/run`, { code: '1 + 1' }))
      if (r.results[0].text !== '2') throw new Error(`v1 run gave ${JSON.stringify(r)}`)
    }
  } finally {
    await ci.kill()
  }
  const kinds = ['create', 'command', 'file write', 'kill', 'loop']
  console.log(`E2B SDK agent loop (create, 10 commands, 3 file writes, kill) vs moat v1, ${LOOPS} loops each`)
  console.log('| measurement (ms)          |      p50 |      p95 |      p99 |     n |')
  console.log('|---------------------------|----------|----------|----------|-------|')
  for (const k of kinds) {
    for (const side of ['e2b', 'v1']) {
      const xs = samples[`${side} ${k}`]
      const f = (p) => pct(xs, p).toFixed(3).padStart(8)
      console.log(`| ${`${side === 'e2b' ? 'E2B SDK' : 'v1 fetch'} ${k}`.padEnd(25)} | ${f(50)} | ${f(95)} | ${f(99)} | ${String(xs.length).padStart(5)} |`)
    }
  }
  for (const [a, b] of [['e2b runCode', 'E2B runCode 1+1'], ['v1 context run', 'v1 context run 1+1']]) {
    const xs = samples[a]
    const f = (p) => pct(xs, p).toFixed(3).padStart(8)
    console.log(`| ${b.padEnd(25)} | ${f(50)} | ${f(95)} | ${f(99)} | ${String(xs.length).padStart(5)} |`)
  }
  {
    const a = samples['e2b runCode'], b = samples['v1 context run']
    console.log(`runCode: E2B / v1 p50 ${(pct(a, 50) / pct(b, 50)).toFixed(2)}x, p95 ${(pct(a, 95) / pct(b, 95)).toFixed(2)}x`)
  }
  for (const k of kinds) {
    const a = samples[`e2b ${k}`], b = samples[`v1 ${k}`]
    console.log(`${k}: E2B / v1 p50 ${(pct(a, 50) / pct(b, 50)).toFixed(2)}x, p95 ${(pct(a, 95) / pct(b, 95)).toFixed(2)}x`)
  }
} finally {
  if (daemon) await daemon.stop()
}
process.exit(0)

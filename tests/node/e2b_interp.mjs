// e2b_interp.mjs -- the unmodified @e2b/code-interpreter SDK (Sandbox.runCode, contexts) against moatd.
//
// Usage: node e2b_interp.mjs SCENARIO with E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY set (see
// tests/integration/test_e2b.py). Prints "ok SCENARIO" or the failure (exit 1); the sandbox is
// killed in every case.
import assert from 'node:assert/strict'
import { Sandbox, NotFoundError, SandboxError, TimeoutError } from '@e2b/code-interpreter'

let sbx = null

const scenarios = {
  // State kept across calls in the default context; output callbacks; a matplotlib PNG.
  async state_and_png() {
    sbx = await Sandbox.create({ timeoutMs: 300_000 })
    assert.equal((await sbx.getInfo()).templateId, 'code-interpreter-v1')
    const a = await sbx.runCode('x = 41\nprint("set", x)')
    assert.equal(a.error, undefined)
    assert.deepEqual(a.logs.stdout, ['set 41\n'])
    const lines = []
    const b = await sbx.runCode('import sys\nprint("out"); print("err", file=sys.stderr)\nx + 1', {
      onStdout: (m) => lines.push(['out', m.line]),
      onStderr: (m) => lines.push(['err', m.line]),
    })
    assert.equal(b.text, '42')
    assert.ok(b.executionCount >= 2, `executionCount ${b.executionCount}`)
    assert.deepEqual(lines.sort(), [['err', 'err\n'], ['out', 'out\n']])
    const c = await sbx.runCode(
      'import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.title("squares")\nplt.show()')
    assert.equal(c.error, undefined, JSON.stringify(c.error))
    const pngs = c.results.filter((r) => r.png)
    assert.equal(pngs.length, 1, JSON.stringify(c.results.map((r) => r.formats())))
    const bytes = Buffer.from(pngs[0].png, 'base64')
    assert.equal(bytes.subarray(1, 4).toString(), 'PNG')
    assert.ok(bytes.length > 1000, `png of ${bytes.length} bytes`)
    // streaming: the first line arrives before the cell ends
    const t0 = Date.now()
    let first = 0
    await sbx.runCode('import time\nprint("early", flush=True)\ntime.sleep(1.5)\nprint("late")', {
      onStdout: () => { if (!first) first = Date.now() - t0 },
    })
    const total = Date.now() - t0
    assert.ok(first > 0 && first < total - 1000, `first output after ${first} ms of ${total} ms`)
    // concurrent runs in one context wait for each other (E2B's kernel queues them)
    const [p, q] = await Promise.all([sbx.runCode('import time\ntime.sleep(0.5)\n"first"'), sbx.runCode('"second"')])
    assert.deepEqual([p.text, q.text, p.error, q.error], ['first', 'second', undefined, undefined])
  },

  // What E2B's Jupyter kernels take: an indented cell (IPython dedents it), `!cmd` and `x = !cmd`
  // shell escapes, a str result shown without its quotes; in JavaScript ESM imports and
  // top-level await, names kept for the next cell.
  async kernel_compat() {
    sbx = await Sandbox.create({ timeoutMs: 300_000 })
    const ind = await sbx.runCode('\n    x = 20\n    if x:\n        y = x + 1\n    x + y\n  ')
    assert.equal(ind.error, undefined, JSON.stringify(ind.error))
    assert.equal(ind.text, '41')
    const sh = await sbx.runCode('!echo from-shell $((6 * 7))')
    assert.equal(sh.error, undefined, JSON.stringify(sh.error))
    assert.deepEqual(sh.logs.stdout, ['from-shell 42\n'])
    const cap = await sbx.runCode('files = !printf "a\\nb\\n"\nlen(files), files[1]')
    assert.equal(cap.text, "(2, 'b')")
    const pwd = await sbx.runCode('!pwd')
    assert.deepEqual(pwd.logs.stdout, ['/home/user\n'])
    const st = await sbx.runCode('import os; os.getenv("HOME")')
    assert.equal(st.text, '/home/user')
    // a string inside a multi-line string literal is not a shell escape
    const lit = await sbx.runCode('s = """\n!not-a-command\n"""\ns.strip()')
    assert.equal(lit.text, '!not-a-command')
    const js = await sbx.createCodeContext({ language: 'javascript' })
    const imp = await sbx.runCode("\n    import { readFileSync } from 'fs'\n    import * as path from 'node:path'\n    console.log(typeof readFileSync, path.join('a', 'b'))\n    ", { context: js })
    assert.equal(imp.error, undefined, JSON.stringify(imp.error))
    assert.deepEqual(imp.logs.stdout, ['function a/b\n'])
    const tla = await sbx.runCode("\n    await Promise.resolve('Hello World!')\n    ", { context: js })
    assert.equal(tla.error, undefined, JSON.stringify(tla.error))
    assert.equal(tla.text, 'Hello World!')
    const decl = await sbx.runCode('const v = await Promise.resolve(20)\nfunction twice(n) { return n * 2 }\ntwice(v) + 2', { context: js })
    assert.equal(decl.text, '42')
    const later = await sbx.runCode('v + twice(1)', { context: js })
    assert.equal(later.text, '22')
    const bad = await sbx.runCode("import { nope } from 'no-such-module-here'", { context: js })
    assert.ok(bad.error, 'a missing module is an error')
  },

  // An exception becomes execution.error with its traceback; the context survives it.
  async error() {
    sbx = await Sandbox.create({ timeoutMs: 300_000 })
    let seen = null
    const e = await sbx.runCode('def f():\n    return 1 / 0\nf()', { onError: (x) => { seen = x } })
    assert.ok(e.error, 'no error')
    assert.equal(e.error.name, 'ZeroDivisionError')
    assert.match(e.error.value, /division by zero/)
    assert.equal(typeof e.error.traceback, 'string')
    assert.match(e.error.traceback, /f\(\)/)
    assert.equal(seen?.name, 'ZeroDivisionError')
    const ok = await sbx.runCode('"still here"')
    assert.equal(ok.text, 'still here') // E2B strips the quotes of a str's repr
    const s = await sbx.runCode('raise ValueError("bad " + "value")')
    assert.equal(s.error.name, 'ValueError')
    assert.equal(s.error.value, 'bad value')
  },

  // Contexts: create (python, javascript, bash), run in one, list, restart (state gone), remove.
  async contexts() {
    sbx = await Sandbox.create({ timeoutMs: 300_000 })
    const py = await sbx.createCodeContext({ language: 'python', cwd: '/tmp' })
    assert.match(py.id, /^[a-z0-9]{16}$/)
    assert.equal(py.cwd, '/tmp')
    const r1 = await sbx.runCode('import os\ny = 7\nos.getcwd()', { context: py })
    assert.equal(r1.text, '/tmp')
    // a cwd only root can enter (E2B's Jupyter runs as root): the context runs as root there
    const rootCtx = await sbx.createCodeContext({ language: 'python', cwd: '/root' })
    assert.equal(rootCtx.cwd, '/root')
    assert.equal((await sbx.runCode('import os\nos.getcwd()', { context: rootCtx })).text, '/root')
    const listed1 = await sbx.listCodeContexts()
    assert.equal(listed1[listed1.length - 1].id, rootCtx.id, 'the newest context is listed last')
    assert.equal(listed1[listed1.length - 1].cwd, '/root')
    await sbx.removeCodeContext(rootCtx.id)
    const r2 = await sbx.runCode('y * 6', { context: py })
    assert.equal(r2.text, '42')
    // the default context does not see y
    const d = await sbx.runCode('y')
    assert.equal(d.error?.name, 'NameError')
    const js = await sbx.createCodeContext({ language: 'javascript' })
    const j = await sbx.runCode('const z = 20; z * 2 + 2', { context: js })
    assert.equal(j.error, undefined, JSON.stringify(j.error))
    assert.match(j.text, /42/)
    const b = await sbx.runCode('echo from-bash $((6 * 7))', { language: 'bash' })
    assert.deepEqual(b.logs.stdout.join(''), 'from-bash 42\n')
    // envs for one run only, in each language (HOME is set in the sandbox and comes back after)
    const envs = { E2B_RUN_VAR: "it's 42", HOME: '/elsewhere' }
    const pe = await sbx.runCode('import os\n(os.environ["E2B_RUN_VAR"], os.environ["HOME"])', { envs })
    assert.equal(pe.text, `("it's 42", '/elsewhere')`)
    const pa = await sbx.runCode('import os\n(os.environ.get("E2B_RUN_VAR"), os.environ["HOME"])')
    assert.equal(pa.text, "(None, '/home/user')")
    const je = await sbx.runCode('process.env.E2B_RUN_VAR + " " + process.env.HOME', { context: js, envs })
    assert.equal(je.text, "it's 42 /elsewhere")
    const ja = await sbx.runCode('String(process.env.E2B_RUN_VAR) + " " + process.env.HOME', { context: js })
    assert.equal(ja.text, 'undefined /home/user')
    const be = await sbx.runCode('echo "$E2B_RUN_VAR $HOME"; sh -c \'echo "child $E2B_RUN_VAR"\'', { language: 'bash', envs })
    assert.equal(be.logs.stdout.join(''), "it's 42 /elsewhere\nchild it's 42\n")
    const ba = await sbx.runCode('echo "${E2B_RUN_VAR-unset} $HOME"', { language: 'bash' })
    assert.equal(ba.logs.stdout.join(''), 'unset /home/user\n')
    const all = await sbx.listCodeContexts()
    // E2B's default python and javascript contexts are listed (started at boot there)
    assert.ok(['python', 'javascript'].every((l) => all.some((c) => c.language === l)), JSON.stringify(all))
    const listed = all.map((c) => c.id)
    assert.ok(listed.includes(py.id) && listed.includes(js.id), JSON.stringify(listed))
    assert.equal(all.find((c) => c.id === js.id).language, 'javascript')
    // code runs as "user", as E2B's does: what it writes, sbx.files (user too) can change
    const who = await sbx.runCode('import getpass, os\nopen("/home/user/from_code.txt", "w").write("code")\n(getpass.getuser(), os.getcwd())')
    assert.equal(who.text, "('user', '/home/user')")
    await sbx.files.write('/home/user/from_code.txt', 'files')
    assert.equal((await sbx.runCode('open("/home/user/from_code.txt").read()')).text, 'files')
    await sbx.restartCodeContext(py)
    const r3 = await sbx.runCode('y', { context: py })
    assert.equal(r3.error?.name, 'NameError')
    await sbx.removeCodeContext(py.id)
    assert.ok(!(await sbx.listCodeContexts()).map((c) => c.id).includes(py.id))
    try {
      await sbx.runCode('1', { context: py })
      assert.fail('ran in a removed context')
    } catch (e) {
      assert.ok(e instanceof NotFoundError, `${e.constructor.name}: ${e.message}`)
    }
  },

  // Bad input: both context and language, an unknown language, per-run envs (not supported), a
  // killed sandbox: errors, never a hang.
  async bad_input() {
    sbx = await Sandbox.create({ timeoutMs: 300_000 })
    const ctx = await sbx.createCodeContext()
    await assert.rejects(sbx.runCode('1', { context: ctx, language: 'python' }), /context or language/)
    await assert.rejects(sbx.runCode('1', { language: 'cobol' }), (e) => e instanceof SandboxError && /400/.test(e.message))
    await assert.rejects(sbx.runCode('1', { envs: { '1A': 'b' } }), (e) => e instanceof SandboxError && /400/.test(e.message))
    // killed while a cell runs: the connection drops and the SDK, finding the sandbox gone, says so
    const running = sbx.runCode('import time; time.sleep(300)', { timeoutMs: 300_000 })
    const outcome = running.then(() => 'resolved', (e) => e)
    await new Promise((res) => setTimeout(res, 1500))
    await sbx.kill()
    const e = await outcome
    assert.ok(e instanceof TimeoutError, `runCode on a killed sandbox: ${e?.constructor?.name}: ${e?.message ?? e}`)
    assert.match(e.message, /sandbox was killed while the request was in progress/)
    const t0 = Date.now()
    await assert.rejects(sbx.runCode('1'), (e) => e instanceof Error)
    assert.ok(Date.now() - t0 < 20000)
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
  if (sbx) await sbx.kill().catch(() => {})
}
// runCode leaves its request timer (requestTimeoutMs, 60 s) running when the server answers an
// error, which would keep Node alive for a minute: exit now that everything is cleaned up.
process.exit(process.exitCode ?? 0)

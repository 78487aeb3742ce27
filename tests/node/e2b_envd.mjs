// e2b_envd.mjs -- the unmodified npm `e2b` SDK's sandbox calls (commands, files, watch: E2B's
// envd protocol on port 49983) against moatd.
//
// Usage: node e2b_envd.mjs SCENARIO, with E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY pointing
// at moatd (tests/integration/test_e2b_envd.py sets them). Prints "ok SCENARIO" and exits 0, or
// prints the failure and exits 1. Every sandbox a scenario creates is killed in a finally block.
import assert from 'node:assert/strict'
import { createHash } from 'node:crypto'
import {
  Sandbox, CommandExitError, NotFoundError, FileNotFoundError, InvalidArgumentError, TimeoutError, SandboxError,
  AuthenticationError,
} from 'e2b'

const made = []
async function create(opts = {}) {
  const sbx = await Sandbox.create('base', { timeoutMs: 300_000, ...opts })
  made.push(sbx)
  return sbx
}

// Awaits p, which must fail with cls within `within` ms; returns the error.
async function rejects(p, cls, what, within = 20000) {
  const t0 = Date.now()
  try {
    await p
  } catch (e) {
    assert.ok(e instanceof cls, `${what}: want ${cls.name}, got ${e?.constructor?.name}: ${e?.message}`)
    assert.ok(Date.now() - t0 < within, `${what}: took ${Date.now() - t0} ms`)
    return e
  }
  assert.fail(`${what}: no error`)
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

const scenarios = {
  // Foreground commands: output, streaming callbacks, the user, unicode and binary-ish output.
  async run_foreground() {
    const sbx = await create()
    const outs = [], errs = []
    const r = await sbx.commands.run('echo hello; echo oops >&2; printf "caf\\xc3\\xa9\\n"', {
      onStdout: (d) => outs.push(d), onStderr: (d) => errs.push(d),
    })
    assert.equal(r.exitCode, 0)
    assert.equal(r.stdout, 'hello\ncafé\n')
    assert.equal(r.stderr, 'oops\n')
    assert.equal(outs.join(''), 'hello\ncafé\n')
    assert.equal(errs.join(''), 'oops\n')
    assert.equal((await sbx.commands.run('whoami')).stdout, 'user\n')
    assert.equal((await sbx.commands.run('whoami', { user: 'root' })).stdout, 'root\n')
    // Streaming: the first line arrives while the command still runs.
    const t0 = Date.now()
    let first = 0
    await sbx.commands.run('echo one; sleep 1.5; echo two', { onStdout: () => { if (!first) first = Date.now() - t0 } })
    assert.ok(first > 0 && first < 1200, `first chunk after ${first} ms`)
    // A larger output arrives whole.
    const big = await sbx.commands.run('head -c 3000000 /dev/zero | tr "\\0" a')
    assert.equal(big.stdout.length, 3000000)
  },

  // Non-zero exit -> CommandExitError with the result; a missing command is 127.
  async exit_error() {
    const sbx = await create()
    const e = await rejects(sbx.commands.run('echo partial; echo bad >&2; exit 3'), CommandExitError, 'exit 3')
    assert.equal(e.exitCode, 3)
    assert.equal(e.stdout, 'partial\n')
    assert.equal(e.stderr, 'bad\n')
    assert.match(e.error, /exit status 3/)
    const e2 = await rejects(sbx.commands.run('no-such-command-xyz'), CommandExitError, 'missing command')
    assert.equal(e2.exitCode, 127)
    assert.match(e2.stderr, /not found/)
  },

  // envs and cwd per command, the sandbox's envs from create, the default cwd (the user's home).
  async envs_cwd() {
    const sbx = await create({ envs: { FROM_CREATE: 'c1' } })
    const r = await sbx.commands.run('echo "$FOO|$FROM_CREATE|$(pwd)"', { envs: { FOO: 'bar baz' }, cwd: '/tmp' })
    assert.equal(r.stdout, 'bar baz|c1|/tmp\n')
    assert.equal((await sbx.commands.run('pwd')).stdout, '/home/user\n')
    assert.equal((await sbx.commands.run('pwd', { user: 'root' })).stdout, '/root\n')
    await rejects(sbx.commands.run('pwd', { cwd: '/no/such/dir' }), SandboxError, 'missing cwd')
  },

  // Background + wait, list, connect from a second handle, disconnect keeps the process.
  async background() {
    const sbx = await create()
    const h = await sbx.commands.run('echo start; sleep 1; echo done', { background: true })
    assert.ok(h.pid > 0)
    const procs = await sbx.commands.list()
    const p = procs.find((x) => x.pid === h.pid)
    assert.ok(p, `pid ${h.pid} not in ${JSON.stringify(procs)}`)
    assert.equal(p.cmd, '/bin/bash')
    assert.deepEqual(p.args.slice(0, 2), ['-l', '-c'])
    const r = await h.wait()
    assert.equal(r.stdout, 'start\ndone\n')
    assert.equal(r.exitCode, 0)
    // disconnect, then connect again by pid: the process ran on and its later output arrives.
    const h2 = await sbx.commands.run('sleep 1; echo later; sleep 0.5', { background: true })
    await h2.disconnect()
    const h3 = await sbx.commands.connect(h2.pid)
    const r3 = await h3.wait()
    assert.equal(r3.stdout, 'later\n')
    await rejects(sbx.commands.connect(999999), NotFoundError, 'connect to an unknown pid')
  },

  // stdin: sendStdin + closeStdin on a command started with stdin: true; without it, EOF at once.
  async stdin() {
    const sbx = await create()
    const h = await sbx.commands.run('cat; echo end', { background: true, stdin: true })
    await sbx.commands.sendStdin(h.pid, 'abc\n')
    await h.sendStdin('def\n')
    await h.closeStdin()
    const r = await h.wait()
    assert.equal(r.stdout, 'abc\ndef\nend\n')
    const r2 = await sbx.commands.run('cat; echo eof', { timeoutMs: 10000 })
    assert.equal(r2.stdout, 'eof\n')
    await rejects(sbx.commands.sendStdin(999999, 'x'), NotFoundError, 'stdin to an unknown pid')
  },

  // kill: the handle's and by pid; an unknown pid is false; the killed command ends.
  async kill() {
    const sbx = await create()
    const h = await sbx.commands.run('sleep 60', { background: true })
    const t0 = Date.now()
    assert.equal(await h.kill(), true)
    const e = await rejects(h.wait(), CommandExitError, 'wait after kill', 10000)
    assert.equal(e.exitCode, -1)
    assert.match(e.error, /signal: killed/)
    assert.ok(Date.now() - t0 < 5000)
    const h2 = await sbx.commands.run('sleep 60', { background: true })
    assert.equal(await sbx.commands.kill(h2.pid), true)
    await rejects(h2.wait(), CommandExitError, 'wait after kill by pid', 10000)
    assert.equal(await sbx.commands.kill(999999), false)
    const left = (await sbx.commands.list()).filter((p) => p.pid === h.pid || p.pid === h2.pid)
    assert.deepEqual(left, [])
  },

  // timeoutMs: the command is killed and the SDK raises TimeoutError, promptly.
  async timeout() {
    const sbx = await create()
    await rejects(sbx.commands.run('sleep 30', { timeoutMs: 1500 }), TimeoutError, 'timeoutMs', 8000)
    await sleep(500)
    const r = await sbx.commands.run('pgrep -x sleep || echo none')
    assert.equal(r.stdout, 'none\n')
  },

  // Files: write/read (text, bytes, several at once, a stream), list, exists, makeDir, rename,
  // remove, getInfo.
  async files() {
    const sbx = await create()
    const w = await sbx.files.write('/home/user/dir/a.txt', 'hello files')
    assert.equal(w.path, '/home/user/dir/a.txt')
    assert.equal(w.name, 'a.txt')
    assert.equal(await sbx.files.read('/home/user/dir/a.txt'), 'hello files')
    assert.equal(await sbx.files.read('dir/a.txt'), 'hello files') // relative to the user's home
    const bin = new Uint8Array(70000).map((_, i) => (i * 7) & 255)
    await sbx.files.write('dir/b.bin', bin)
    assert.deepEqual(await sbx.files.read('dir/b.bin', { format: 'bytes' }), bin)
    await sbx.files.write('dir/empty', '')
    assert.equal(await sbx.files.read('dir/empty'), '')
    const many = await sbx.files.write([{ path: '/tmp/m1', data: 'one' }, { path: '/tmp/m2', data: 'two' }])
    assert.deepEqual(many.map((f) => f.path).sort(), ['/tmp/m1', '/tmp/m2'])
    assert.equal(await sbx.files.read('/tmp/m2'), 'two')
    // A streamed upload (octet-stream) of 8 MiB, read back.
    const chunk = Buffer.alloc(1 << 20, 'z')
    const stream = new ReadableStream({
      i: 0,
      pull(c) { if (this.i++ < 8) c.enqueue(new Uint8Array(chunk)); else c.close() },
    })
    await sbx.files.write('/tmp/big', stream)
    const back = await sbx.files.read('/tmp/big', { format: 'bytes' })
    assert.equal(back.length, 8 << 20)
    assert.equal(createHash('sha256').update(back).digest('hex'),
      createHash('sha256').update(Buffer.alloc(8 << 20, 'z')).digest('hex'))
    // gzip: true (octet-stream with Content-Encoding: gzip), inflated on the way in
    const text = 'compressible line\n'.repeat(200000)
    await sbx.files.write('/tmp/gz.txt', text, { gzip: true })
    assert.equal(await sbx.files.read('/tmp/gz.txt', { gzip: true }), text)
    // owner: files written as the default user belong to it
    const info = await sbx.files.getInfo('dir/a.txt')
    assert.equal(info.type, 'file')
    assert.equal(info.size, 11)
    assert.equal(info.owner, 'user')
    assert.equal(info.path, '/home/user/dir/a.txt')
    assert.match(info.permissions, /^-rw/)
    assert.ok(info.modifiedTime instanceof Date && Math.abs(info.modifiedTime - Date.now()) < 120000)
    const ls = await sbx.files.list('/home/user/dir')
    assert.deepEqual(ls.map((e) => e.name).sort(), ['a.txt', 'b.bin', 'empty'])
    assert.ok(ls.every((e) => e.type === 'file'))
    await sbx.commands.run('ln -s /tmp/m1 /home/user/dir/link')
    const link = (await sbx.files.list('dir')).find((e) => e.name === 'link')
    assert.equal(link.type, 'symlink', JSON.stringify(link))
    assert.equal(link.symlinkTarget, '/tmp/m1')
    // writing as the default user where parents are missing, even under /: E2B's envd (root)
    // makes them and hands them to the user; an existing directory of root's stays closed
    const infos = await sbx.files.write([{ path: '/e2bnew/a/b.txt', data: 'deep' }, { path: '/home/user/dir/c.txt', data: 'c' }])
    assert.deepEqual(infos.map((i) => i.path), ['/e2bnew/a/b.txt', '/home/user/dir/c.txt'])
    assert.equal(await sbx.files.read('/e2bnew/a/b.txt'), 'deep')
    assert.equal((await sbx.commands.run('stat -c %U /e2bnew /e2bnew/a /e2bnew/a/b.txt')).stdout, 'user\nuser\nuser\n')
    await rejects(sbx.files.write('/etc/e2b-not-yours.txt', 'x'), SandboxError, 'write into /etc as user')
    assert.equal((await sbx.commands.run('test -e /etc/e2b-not-yours.txt || echo absent')).stdout, 'absent\n')
    await sbx.commands.run('rm -rf /e2bnew /home/user/dir/c.txt', { user: 'root' })
    // a relative target is reported absolute, as E2B's envd does
    await sbx.commands.run('ln -s a.txt /home/user/dir/rel && ln -s ../dir/./a.txt /home/user/dir/up')
    const rel = await sbx.files.getInfo('dir/rel')
    assert.equal(rel.symlinkTarget, '/home/user/dir/a.txt')
    assert.equal(rel.type, 'file', 'getInfo gives the type of what a link points to, as E2B')
    await sbx.commands.run('ln -s /nowhere /home/user/dir/dangling')
    assert.equal((await sbx.files.getInfo('dir/dangling')).type, 'symlink')
    await sbx.commands.run('rm /home/user/dir/dangling')
    assert.equal((await sbx.files.getInfo('dir/up')).symlinkTarget, '/home/user/dir/a.txt')
    await sbx.commands.run('rm /home/user/dir/rel /home/user/dir/up')
    assert.equal(await sbx.files.read('dir/link'), 'one')
    await sbx.files.remove('dir/link')
    assert.equal(await sbx.files.exists('dir/a.txt'), true)
    assert.equal(await sbx.files.exists('dir/nope'), false)
    assert.equal(await sbx.files.makeDir('dir/sub/deep'), true)
    assert.equal(await sbx.files.makeDir('dir/sub/deep'), false)
    const deep = await sbx.files.list('dir', { depth: 3 })
    assert.ok(deep.some((e) => e.path === '/home/user/dir/sub/deep' && e.type === 'dir'), JSON.stringify(deep))
    const mv = await sbx.files.rename('dir/a.txt', 'dir/sub/renamed.txt')
    assert.equal(mv.path, '/home/user/dir/sub/renamed.txt')
    assert.equal(await sbx.files.exists('dir/a.txt'), false)
    assert.equal(await sbx.files.read('dir/sub/renamed.txt'), 'hello files')
    await sbx.files.remove('dir/sub')
    assert.equal(await sbx.files.exists('dir/sub'), false)
    // root's files as root
    await sbx.files.write('/root/r.txt', 'root only', { user: 'root' })
    assert.equal((await sbx.files.getInfo('/root/r.txt', { user: 'root' })).owner, 'root')
    // the same files through commands
    assert.equal((await sbx.commands.run('cat /tmp/m1')).stdout, 'one')
  },

  // watchDir: create / write / remove / rename events with names relative to the directory.
  async watch() {
    const sbx = await create()
    await sbx.files.makeDir('/home/user/w')
    const events = []
    const h = await sbx.files.watchDir('/home/user/w', (ev) => events.push(ev))
    await sbx.files.write('/home/user/w/f1', 'x')
    for (let i = 0; i < 50 && !events.some((e) => e.type === 'write'); i++) await sleep(100)
    // files.write reads as envd's direct write (open O_CREAT, chown to the user, write): create,
    // chmod and write of f1, no temporary names
    assert.deepEqual(events.map((e) => `${e.type}:${e.name}`), ['create:f1', 'chmod:f1', 'write:f1'])
    await sbx.commands.run('echo more >> /home/user/w/f1; mv /home/user/w/f1 /home/user/w/f2; rm /home/user/w/f2')
    for (let i = 0; i < 50 && !events.some((e) => e.type === 'remove'); i++) await sleep(100)
    await h.stop()
    const seen = events.map((e) => `${e.type}:${e.name}`)
    for (const want of ['create:f1', 'write:f1', 'rename:f1', 'create:f2', 'remove:f2'])
      assert.ok(seen.includes(want), `${want} not in ${JSON.stringify(seen)}`)
    // recursive: names relative to the watched directory, in new subdirectories too
    const rev = []
    const rh = await sbx.files.watchDir('/home/user/w', (ev) => rev.push(ev), { recursive: true })
    await sbx.files.makeDir('/home/user/w/sub')
    await sleep(200)
    await sbx.files.write('/home/user/w/sub/deep.txt', 'd')
    for (let i = 0; i < 50 && !rev.some((e) => e.name === 'sub/deep.txt'); i++) await sleep(100)
    await rh.stop()
    assert.ok(rev.some((e) => e.type === 'create' && e.name === 'sub'), JSON.stringify(rev))
    assert.ok(rev.some((e) => e.name === 'sub/deep.txt'), JSON.stringify(rev))
    // includeEntry (envd >= 0.6.3): events carry the entry
    const iev = []
    const ih = await sbx.files.watchDir('/home/user/w', (ev) => iev.push(ev), { includeEntry: true })
    await sbx.files.write('/home/user/w/inc.txt', 'twelve bytes')
    for (let i = 0; i < 50 && !iev.some((e) => e.entry && e.name === 'inc.txt'); i++) await sleep(100)
    await ih.stop()
    const ie = iev.find((e) => e.entry && e.name === 'inc.txt')
    assert.ok(ie, JSON.stringify(iev))
    assert.equal(ie.entry.path, '/home/user/w/inc.txt')
    assert.equal(ie.entry.type, 'file')
    assert.equal(ie.entry.size, 12)
    await rejects(sbx.files.watchDir('/home/user/nope', () => {}), FileNotFoundError, 'watch a missing dir')
  },

  // A second client (Sandbox.connect) sees the first one's files and processes and can drive them.
  async reconnect() {
    const sbx = await create()
    await sbx.files.write('/home/user/shared.txt', 'from the first client')
    const h = await sbx.commands.run('echo ready; sleep 60', { background: true })
    const other = await Sandbox.connect(sbx.sandboxId)
    assert.equal(await other.files.read('/home/user/shared.txt'), 'from the first client')
    assert.ok((await other.commands.list()).some((p) => p.pid === h.pid))
    const h2 = await other.commands.connect(h.pid)
    assert.equal(await other.commands.kill(h.pid), true)
    await rejects(h2.wait(), CommandExitError, 'second handle after kill', 10000)
    const e = await rejects(h.wait(), CommandExitError, 'first handle after kill', 10000)
    assert.equal(e.stdout, 'ready\n')
  },

  // The sandbox killed under a running command and a watch: both end at once with an error.
  async sandbox_killed() {
    const sbx = await Sandbox.create('base', { timeoutMs: 300_000 })
    let exited = null
    await sbx.files.watchDir('/tmp', () => {}, { onExit: (e) => { exited = e ?? 'clean' } })
    const h = await sbx.commands.run('sleep 120', { background: true })
    const t0 = Date.now()
    await Sandbox.kill(sbx.sandboxId)
    const e = await rejects(h.wait(), TimeoutError, 'wait on a killed sandbox', 10000)
    assert.match(e.message, /sandbox was killed or reached its end of life/)
    for (let i = 0; i < 100 && exited === null; i++) await sleep(100)
    assert.ok(exited instanceof Error, `watch onExit: ${exited}`)
    assert.ok(Date.now() - t0 < 10000)
    assert.equal(await sbx.isRunning(), false)
    await rejects(sbx.commands.run('true'), SandboxError, 'run on a killed sandbox', 10000)
  },

  // Many calls at once on one sandbox: 40 commands, 40 writes then reads, 10 watches, all right.
  async concurrent() {
    const sbx = await create()
    const n = 40
    const runs = await Promise.all([...Array(n).keys()].map((i) =>
      sbx.commands.run(`echo out$i; echo err$i >&2; exit $(( $i % 3 ))`.replaceAll('$i', String(i))).catch((e) => e)))
    runs.forEach((r, i) => {
      assert.equal(r.stdout, `out${i}\n`)
      assert.equal(r.stderr, `err${i}\n`)
      assert.equal(r.exitCode, i % 3)
      assert.equal(r instanceof CommandExitError, i % 3 !== 0)
    })
    await Promise.all([...Array(n).keys()].map((i) => sbx.files.write(`/tmp/c/${i}.txt`, `content ${i}`.repeat(100))))
    const back = await Promise.all([...Array(n).keys()].map((i) => sbx.files.read(`/tmp/c/${i}.txt`)))
    back.forEach((t, i) => assert.equal(t, `content ${i}`.repeat(100)))
    const watches = await Promise.all([...Array(10).keys()].map(() => sbx.files.watchDir('/tmp/c', () => {})))
    await Promise.all(watches.map((w) => w.stop()))
    assert.equal((await sbx.files.list('/tmp/c')).length, n)
  },

  // sbx.pty: an interactive bash on a terminal, input, resize, kill.
  async pty() {
    const sbx = await create()
    const dec = new TextDecoder()
    let out = ''
    const h = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => { out += dec.decode(d, { stream: true }) } })
    assert.ok(h.pid > 0)
    await sbx.pty.sendInput(h.pid, new TextEncoder().encode('stty size; echo "tty:$(tty)"; echo $TERM\n'))
    for (let i = 0; i < 50 && !/xterm-256color\r?\n/.test(out); i++) await sleep(100)
    assert.match(out, /24 80/)
    assert.match(out, /tty:\/dev\/pts\//)
    await sbx.pty.resize(h.pid, { cols: 100, rows: 30 })
    await sbx.pty.sendInput(h.pid, new TextEncoder().encode('stty size\n'))
    for (let i = 0; i < 50 && !/30 100/.test(out); i++) await sleep(100)
    assert.match(out, /30 100/)
    assert.equal(await sbx.pty.kill(h.pid), true)
    await rejects(h.wait(), CommandExitError, 'pty wait after kill', 10000)
    // a pty outlives its stream: disconnect, let moatd notice, connect again; the shell is alive
    // and its input open (no end-of-input, no ^D), as in envd
    const t = await sbx.pty.create({ cols: 80, rows: 24, envs: { FOO: 'bar' }, onData: () => {} })
    await sbx.pty.sendInput(t.pid, new TextEncoder().encode('echo $FOO\n'))
    await t.disconnect()
    await sleep(1500)
    let again = ''
    const r = await sbx.pty.connect(t.pid, { onData: (d) => { again += dec.decode(d, { stream: true }) } })
    await sbx.pty.sendInput(t.pid, new TextEncoder().encode('echo again-$FOO\nexit\n'))
    const end = await r.wait()
    assert.equal(end.exitCode, 0)
    assert.match(again, /again-bar/)
  },

  // A command silent for longer than moatd's connection timeout (--idle-timeout, 60 s by default;
  // MOAT_SILENCE_S is set past the one the test gave moatd): the stream stays up (keepalive
  // messages every Keepalive-Ping-Interval) and the output arrives.
  async long_silence() {
    const silence = Number(process.env.MOAT_SILENCE_S || 70)
    const sbx = await create()
    const r = await sbx.commands.run(`sleep ${silence}; echo woke`, { timeoutMs: 0 })
    assert.equal(r.stdout, 'woke\n')
  },

  // Bad input gets the SDK's errors, fast.
  async bad_input() {
    const sbx = await create()
    await rejects(sbx.files.read('/home/user/missing.txt'), FileNotFoundError, 'read missing')
    await rejects(sbx.files.list('/home/user/missing'), FileNotFoundError, 'list missing')
    await rejects(sbx.files.getInfo('/nope/nope'), FileNotFoundError, 'getInfo missing')
    await rejects(sbx.files.rename('/home/user/missing', '/tmp/x'), FileNotFoundError, 'rename missing')
    await sbx.files.write('/home/user/plain', 'p')
    await rejects(sbx.files.list('/home/user/plain'), InvalidArgumentError, 'list a file')
    await rejects(sbx.files.makeDir('/home/user/plain'), InvalidArgumentError, 'makeDir over a file')
    await rejects(sbx.files.read('/home/user'), InvalidArgumentError, 'read a directory')
    // ".." cannot leave the sandbox: it resolves inside the sandbox's own root.
    const up = await sbx.files.list('/home/user/../../../../..')
    assert.ok(up.some((e) => e.name === 'home') && up.some((e) => e.name === 'etc'), JSON.stringify(up.map((e) => e.name)))
    const passwd = await sbx.files.read('../../../../../../etc/passwd')
    assert.match(passwd, /^user:x:1000:/m)
    // The default user cannot read root's files.
    await sbx.files.write('/root/secret', 's', { user: 'root' })
    await rejects(sbx.files.read('/root/secret'), SandboxError, 'read root file as user')
    // An unknown user is envd's "invalid username" (unauthenticated): AuthenticationError.
    await rejects(sbx.commands.run('true', { user: 'nobody-here' }), AuthenticationError, 'run as an unknown user')
    await rejects(sbx.files.read('/etc/hostname', { user: 'nobody-here' }), AuthenticationError, 'read as an unknown user')
    await rejects(sbx.files.list('/', { user: 'nobody-here' }), AuthenticationError, 'list as an unknown user')
    await rejects(sbx.commands.sendStdin(4000000, 'x'), NotFoundError, 'stdin to an unknown pid')
    assert.equal(await sbx.commands.kill(4000000), false)
    await sbx.files.remove('/home/user/never-existed') // envd: removing a missing path is fine
    // A refused upload is answered once its body is in: the SDK gets the error, not a reset.
    const big = 'b'.repeat(8 << 20)
    for (let i = 0; i < 3; i++) {
      const e = await rejects(sbx.files.write('/root/forbidden.bin', big), SandboxError, 'upload into /root as user')
      assert.match(e.message, /^403: /)
    }
    // File metadata (envd >= 0.6.2) is refused, not dropped silently.
    await rejects(sbx.files.write('/tmp/meta.txt', 'm', { metadata: { owner: 'x' } }), InvalidArgumentError, 'file metadata')
    assert.equal(await sbx.files.exists('/tmp/meta.txt'), false)
  },
}

const name = process.argv[2]
const fn = scenarios[name]
if (!fn) {
  console.error(`unknown scenario ${name}; one of ${Object.keys(scenarios).join(' ')}`)
  process.exit(2)
}
let rc = 0
try {
  await fn()
  console.log(`ok ${name}`)
} catch (e) {
  console.error(`FAIL ${name}:`, e)
  rc = 1
} finally {
  for (const s of made) await s.kill().catch(() => {})
}
process.exit(rc)

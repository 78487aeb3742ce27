// e2b_template.mjs -- the unmodified npm `e2b` SDK's template builder (Template) against moatd.
//
// Usage: node e2b_template.mjs SCENARIO, with E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY pointing
// at moatd (tests/integration/test_e2b_template.py sets them; OTHER_KEY: a key of a second org).
// Prints "ok SCENARIO" and exits 0, or prints the failure and exits 1. Every sandbox a scenario
// creates is killed in a finally block, every template it builds deleted.
import assert from 'node:assert/strict'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { Sandbox, Template, BuildError } from 'e2b'

const made = []
const built = []
const api = process.env.E2B_API_URL
const key = process.env.E2B_API_KEY

async function call(method, p, body, k = key) {
  const res = await fetch(api + p, {
    method,
    headers: { 'X-API-KEY': k, 'Content-Type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  })
  const text = await res.text()
  return { status: res.status, body: text ? JSON.parse(text) : null }
}

function context() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'moat-e2b-tmpl-'))
  fs.mkdirSync(path.join(dir, 'site'))
  fs.writeFileSync(path.join(dir, 'site', 'hello.txt'), 'hello from the context\n')
  fs.writeFileSync(path.join(dir, 'site', 'run.sh'), '#!/bin/sh\necho ran\n')
  fs.symlinkSync('hello.txt', path.join(dir, 'site', 'alias.txt'))
  return dir
}

const scenarios = {
  // A template from base with every builder call; the build's status and logs; a sandbox made from
  // it by name (and by name:tag) runs the start command as "user" and has the files, env, workdir.
  async build_and_create() {
    const dir = context()
    const name = 'e2b-tmpl-' + Math.random().toString(36).slice(2, 8)
    built.push(name)
    const logs = []
    try {
      const t = Template({ fileContextPath: dir })
        .fromTemplate('base')
        .copy('site', '/home/user/site')
        .copy('site/run.sh', '/opt/run.sh', { mode: 0o755, user: 'root' })
        .setEnvs({ GREETING: 'hi there', SECOND: 'x"y' })
        .runCmd('echo "built as $(whoami) with $GREETING" > /home/user/built.txt')
        .runCmd('id -un > /root-made.txt', { user: 'root' })
        .setWorkdir('/home/user/site')
        .runCmd('pwd > /home/user/pwd.txt && echo to-stdout && echo to-stderr >&2')
        .setStartCmd(
          'python3 -m http.server 8000 --bind 127.0.0.1',
          'python3 -c "import urllib.request; urllib.request.urlopen(\'http://127.0.0.1:8000/hello.txt\')"'
        )
      const info = await Template.build(t, name + ':v1', { onBuildLogs: (e) => logs.push(e) })
      assert.equal(info.templateId, name)
      assert.match(info.buildId, /^[0-9a-f-]{36}$/)
      assert.ok(logs.some((e) => e.message.includes('to-stdout')), logs.map(String).join('\n'))
      assert.ok(logs.some((e) => e.message.includes('to-stderr') && e.level === 'warn'), logs.map(String).join('\n'))
      const st = await Template.getBuildStatus(info)
      assert.equal(st.status, 'ready')
      assert.equal(await Template.exists(name), true)
      assert.equal(await Template.exists(name + ':v1'), true)
      assert.equal(await Template.exists(name + ':nope'), false)

      const sbx = await Sandbox.create(name + ':v1', { timeoutMs: 120_000 })
      made.push(sbx.sandboxId)
      const r = await sbx.commands.run(
        'cat /home/user/built.txt /root-made.txt /home/user/pwd.txt /home/user/site/hello.txt; ' +
          'readlink /home/user/site/alias.txt; stat -c "%U %a" /opt/run.sh /home/user/site/hello.txt; ' +
          'echo "$GREETING|$SECOND"; /opt/run.sh; ' +
          'python3 -c "import urllib.request; print(urllib.request.urlopen(\'http://127.0.0.1:8000/hello.txt\').read().decode())"'
      )
      assert.equal(
        r.stdout,
        'built as user with hi there\nroot\n/home/user/site\nhello from the context\n' +
          'hello.txt\nroot 755\nuser 644\nhi there|x"y\nran\nhello from the context\n\n'
      )
      const ps = await sbx.commands.run('ps -o user=,args= -C python3')
      assert.match(ps.stdout, /user .*http\.server 8000/)

      // tags
      const assigned = await Template.assignTags(name + ':v1', ['prod', 'stable'])
      assert.equal(assigned.buildId, info.buildId)
      const tags = (await Template.getTags(name)).map((x) => x.tag).sort()
      assert.deepEqual(tags, ['prod', 'stable', 'v1'])
      await Template.removeTags(name, ['stable'])
      assert.deepEqual((await Template.getTags(name)).map((x) => x.tag).sort(), ['prod', 'v1'])
      await assert.rejects(Template.assignTags(name + ':v1', ':bad'))
      await assert.rejects(Template.assignTags(name + ':v1', name + ':'))
      await assert.rejects(Sandbox.create(name + ':stable'), /not found/)

      // a second build from the first: inherits its user and files; a glob's matches are copied
      // (a matched symlink as the file it points to, as Docker's COPY does)
      const logs2 = []
      await Template.build(
        Template({ fileContextPath: dir }).fromTemplate(name).copy('site/*', '/home/user/glob/').runCmd('test -f /home/user/built.txt && test -f /home/user/glob/hello.txt && test -f /home/user/glob/run.sh && test -f /home/user/glob/alias.txt'),
        name + '-child',
        { onBuildLogs: (e) => logs2.push(e) }
      )
      built.push(name + '-child')
    } finally {
      fs.rmSync(dir, { recursive: true, force: true })
    }
  },

  // What fails says why: an image from a registry, a failing step (its output and step), unknown
  // names; a build from a Dockerfile whose FROM is a moat template works.
  async bad_input() {
    await assert.rejects(
      Template.build(Template().fromImage('ubuntu:22.04').runCmd('true'), 'e2b-tmpl-registry'),
      (e) => e instanceof BuildError && /registry/.test(e.message)
    )
    await assert.rejects(
      Template.build(Template().fromTemplate('no-such-template'), 'e2b-tmpl-nofrom'),
      (e) => e instanceof BuildError && /no-such-template/.test(e.message)
    )
    built.push('e2b-tmpl-fail')
    await assert.rejects(
      Template.build(Template().fromTemplate('base').runCmd('echo the-last-words; exit 3'), 'e2b-tmpl-fail'),
      (e) => e instanceof BuildError && /exit/.test(e.message)
    )
    await assert.rejects(Template.build(Template().fromTemplate('base'), 'Bad_Name'), BuildError)
    await assert.rejects(Template.build(Template().fromTemplate('base'), 'base'), BuildError)
    assert.equal(await Template.exists('e2b-tmpl-never-built'), false)
    assert.equal(await Template.exists('base'), true)
    built.push('e2b-tmpl-df')
    await Template.build(Template().fromDockerfile('FROM base\nRUN echo from-dockerfile > /df.txt\nENV A=b\n'), 'e2b-tmpl-df')
    const sbx = await Sandbox.create('e2b-tmpl-df', { timeoutMs: 60_000 })
    made.push(sbx.sandboxId)
    assert.equal((await sbx.commands.run('cat /df.txt; echo $A')).stdout, 'from-dockerfile\nb\n')
    // raw wire: unknown build, bad status query, a tampered upload URL
    assert.equal((await call('GET', '/templates/e2b-tmpl-df/builds/00000000-0000-4000-8000-000000000000/status')).status, 404)
    assert.equal((await call('GET', '/templates/e2b-tmpl-df/files/xyz')).status, 400)
    const link = await call('GET', '/templates/e2b-tmpl-df/files/' + 'a'.repeat(64))
    assert.equal(link.status, 201)
    assert.equal(link.body.present, false)
    const bad = link.body.url.replace(/sig=[0-9a-f]{4}/, 'sig=0000')
    assert.equal((await fetch(bad, { method: 'PUT', body: 'x' })).status, 403)
  },

  // A second org sees nothing of the first's builds: not its template, tags, builds or uploads.
  async other_org() {
    const other = process.env.OTHER_KEY
    const dir = context()
    const name = 'e2b-tmpl-mine'
    built.push(name)
    try {
      const info = await Template.build(Template({ fileContextPath: dir }).fromTemplate('base').copy('site/hello.txt', '/h.txt'), name)
      const opts = { apiKey: other }
      assert.equal(await Template.exists(name, opts), false)
      await assert.rejects(Sandbox.create(name, opts), /not found/)
      await assert.rejects(Template.getBuildStatus(info, opts), /not found/)
      await assert.rejects(Template.getTags(name, opts))
      await assert.rejects(Template.assignTags(name + ':default', 'x', opts))
      const st = await call('GET', `/templates/${name}/builds/${info.buildId}/status`, undefined, other)
      assert.equal(st.status, 404)
      assert.equal((await call('DELETE', '/templates/' + name, undefined, other)).status, 404)
      // the upload the first org made is not "present" for the second, and its URL is the second's
      const st1 = await call('POST', '/v3/templates', { name: 'e2b-tmpl-probe' }, other)
      assert.equal(st1.status, 202)
      built.push('e2b-tmpl-probe')
      // the first org's hash, from its own build's trigger: ask for every hash the first org has
      const mine = await call('GET', `/templates/${name}/files/${'b'.repeat(64)}`)
      assert.equal(mine.status, 201)
      await fetch(mine.body.url, { method: 'PUT', body: 'first org bytes' })
      const theirs = await call('GET', `/templates/e2b-tmpl-probe/files/${'b'.repeat(64)}`, undefined, other)
      assert.equal(theirs.body.present, false)
      // the first org's upload URL does not let the second org's build use the file
      const trig = await call('POST', `/v2/templates/e2b-tmpl-probe/builds/${st1.body.buildID}`,
        { fromTemplate: 'base', steps: [{ type: 'COPY', args: ['x', '/x', '', ''], filesHash: 'b'.repeat(64) }] }, other)
      assert.equal(trig.status, 400, JSON.stringify(trig.body))
      assert.match(trig.body.message, /not uploaded/)
      assert.equal(await Template.exists(name), true)
    } finally {
      fs.rmSync(dir, { recursive: true, force: true })
    }
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
  for (const t of built) {
    try {
      await call('DELETE', '/templates/' + t)
    } catch {}
  }
}

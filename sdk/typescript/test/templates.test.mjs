// templates.test.mjs -- Template.build (log callback, build args, .dockerignore, links kept as links), a failed
// build (BuildError), typed errors, logs, importImage of an OCI archive made here, get/list/delete.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { mkdtempSync, mkdirSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, describe, it } from 'node:test';
import { gzipSync } from 'node:zlib';
import {
  BuildError,
  ConflictError,
  ForbiddenError,
  InvalidRequestError,
  NotFoundError,
  Template,
  contextTar,
  sandbox,
} from './helpers.mjs';

const dirs = [];
function ctx(files, links = []) {
  const d = mkdtempSync(path.join(os.tmpdir(), 'moat-ts-tpl-'));
  dirs.push(d);
  for (const [name, data] of Object.entries(files)) {
    mkdirSync(path.dirname(path.join(d, name)), { recursive: true });
    if (name.endsWith('/')) mkdirSync(path.join(d, name), { recursive: true });
    else writeFileSync(path.join(d, name), data);
  }
  for (const [name, target] of links) symlinkSync(target, path.join(d, name));
  return d;
}
const made = new Set();
after(async () => {
  for (const n of made) await Template.delete(n).catch(() => {});
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

async function tarOf(dir) {
  const parts = [];
  for await (const c of contextTar(dir, [])) parts.push(Buffer.from(c));
  return Buffer.concat(parts);
}

const sha = (b) => createHash('sha256').update(b).digest('hex');

/** An OCI image archive made by hand: oci-layout, index.json, a manifest, a config, one tar.gz layer. */
async function ociArchive(files, config) {
  const layerTar = await tarOf(ctx(files)); // no /proc, /dev, ... of its own: moatd makes its mount points
  const layer = gzipSync(layerTar);
  const layout = {};
  const blob = (data, mediaType) => {
    const d = sha(data);
    layout[`blobs/sha256/${d}`] = data;
    return { mediaType, digest: `sha256:${d}`, size: data.length };
  };
  const arch = { x64: 'amd64', arm64: 'arm64' }[process.arch] ?? process.arch;
  const ld = blob(layer, 'application/vnd.oci.image.layer.v1.tar+gzip');
  const cfg = { architecture: arch, os: 'linux', config, rootfs: { type: 'layers', diff_ids: [`sha256:${sha(layerTar)}`] } };
  const cd = blob(Buffer.from(JSON.stringify(cfg)), 'application/vnd.oci.image.config.v1+json');
  const man = { schemaVersion: 2, mediaType: 'application/vnd.oci.image.manifest.v1+json', config: cd, layers: [ld] };
  const md = blob(Buffer.from(JSON.stringify(man)), 'application/vnd.oci.image.manifest.v1+json');
  md.annotations = { 'org.opencontainers.image.ref.name': 'latest' };
  layout['oci-layout'] = '{"imageLayoutVersion":"1.0.0"}';
  layout['index.json'] = JSON.stringify({ schemaVersion: 2, manifests: [md] });
  return tarOf(ctx(layout));
}

const WEB = `FROM base
ARG MSG=default
COPY site/ /srv/site/
RUN echo "$MSG" > /srv/site/msg.txt && echo ts-build-output
HEALTHCHECK --interval=1s CMD curl -fsS http://127.0.0.1:8000/index.html
CMD ["python3", "-m", "http.server", "8000", "--bind", "127.0.0.1", "--directory", "/srv/site"]
`;

describe('templates', () => {
  it('build, serve, logs, list, delete', async () => {
    const long = 'n'.repeat(120) + '.txt'; // past ustar's 100-byte name: a PAX header
    const d = ctx(
      { Dockerfile: WEB, 'site/index.html': '<p>from ts</p>\n', [`site/${long}`]: 'long name\n', 'site/x.pem': 'secret', '.dockerignore': 'site/*.pem\n' },
      [['site/alias.html', 'index.html']],
    );
    made.add('tsweb');
    const seen = [];
    const t = await Template.build('tsweb', { path: d, buildArgs: { MSG: 'hi from ts' }, onLog: (l) => seen.push(l) });
    assert.ok(t instanceof Template);
    assert.deepEqual([t.name, t.state, t.source, t.usable, t.from], ['tsweb', 'ready', 'dockerfile', true, 'base']);
    assert.match(t.buildId, /^bd-/);
    assert.ok(seen.some((l) => l.step === 4 && l.stream === 'stdout' && l.text === 'ts-build-output'), JSON.stringify(seen));
    const sb = await sandbox({ template: 'tsweb' });
    assert.equal((await sb.exec(['curl', '-fsS', 'http://127.0.0.1:8000/alias.html'])).stdout, '<p>from ts</p>\n');
    const r = await sb.exec(`cat /srv/site/msg.txt /srv/site/${long}; ls /srv/site; readlink /srv/site/alias.html`);
    assert.equal(r.stdout, `hi from ts\nlong name\nalias.html\nindex.html\nmsg.txt\n${long}\nindex.html\n`);
    await sb.kill();

    const logs = await Template.logs('tsweb', t.buildId);
    const lines = [];
    for await (const l of logs) lines.push(l.text);
    assert.ok(lines.includes('ts-build-output'));
    assert.equal(logs.end?.state, 'ready');
    assert.ok((await Template.list()).some((x) => x.name === 'tsweb'));
    const base = (await Template.list()).find((x) => x.name === 'base');
    assert.deepEqual([base.source, base.usable], ['builtin', true]);

    const t2 = await Template.build('tsweb', { path: d, wait: false });
    assert.equal(t2.state, 'building');
    await assert.rejects(Template.build('tsweb', { path: d, wait: false }), (e) => e instanceof ConflictError && e.code === 'template_building');
    const l2 = await Template.logs('tsweb', t2.buildId, { follow: true });
    for await (const _ of l2);
    assert.equal(l2.end?.state, 'ready');

    await Template.delete('tsweb');
    await assert.rejects(Template.get('tsweb'), (e) => e instanceof NotFoundError);
    await assert.rejects(Template.logs('tsweb', t.buildId), (e) => e instanceof NotFoundError);
  });

  it('a failed build, bad input', async () => {
    made.add('tsfail');
    await assert.rejects(
      Template.build('tsfail', { path: ctx({ Dockerfile: 'FROM base\nRUN echo doomed; exit 5\n' }) }),
      (e) => e instanceof BuildError && e.code === 'build_failed' && /exited 5/.test(e.error) && /doomed/.test(e.error) && /^bd-/.test(e.buildId),
    );
    assert.equal((await Template.get('tsfail')).state, 'failed');
    await assert.rejects(
      Template.build('tsbad', { path: ctx({ Dockerfile: 'FROM base\nBOGUS\n' }) }),
      (e) => e instanceof InvalidRequestError && /line 2/.test(e.message),
    );
    const outside = ctx({ secret: 'host secret\n' });
    await assert.rejects(
      Template.build('tsbad', { path: ctx({ Dockerfile: 'FROM base\nCOPY leak /leak\n' }, [['leak', path.join(outside, 'secret')]]) }),
      (e) => e instanceof InvalidRequestError,
    );
    await assert.rejects(Template.build('base', { path: ctx({ Dockerfile: 'FROM base\n' }) }), (e) => e instanceof ConflictError && e.code === 'already_exists');
    await assert.rejects(Template.delete('base'), (e) => e instanceof ForbiddenError);
    await assert.rejects(Template.get('tsbad'), (e) => e instanceof NotFoundError);
    await assert.rejects(Template.build('x', { path: '/nonexistent-moat-dir' }), TypeError);
    await assert.rejects(Template.build('x', { buildArgs: { A: 1 } }), TypeError);
    await assert.rejects(Template.build('x', { bogus: 1 }), TypeError);
    await assert.rejects(Template.importImage('x', 42), TypeError);
  });

  it('importImage of an OCI archive made here', async () => {
    made.add('tsoci');
    const data = await ociArchive({ 'opt/app/hello.txt': 'from the oci layer\n' }, { Env: ['WHO=oci'], WorkingDir: '/opt/app' });
    const t = await Template.importImage('tsoci', new Uint8Array(data));
    assert.deepEqual([t.name, t.source, t.state], ['tsoci', 'oci', 'ready']);
    assert.equal(t.config.workdir, '/opt/app');
    assert.ok(t.config.env.includes('WHO=oci'));
    const sb = await sandbox({ template: 'tsoci' });
    assert.equal(await sb.files.readText('/opt/app/hello.txt'), 'from the oci layer\n');
    await sb.kill();
    const file = path.join(ctx({}), 'image.tar');
    writeFileSync(file, data);
    made.add('tsoci2');
    assert.equal((await Template.importImage('tsoci2', file)).source, 'oci');
    await assert.rejects(Template.importImage('tsoci3', new TextEncoder().encode('not an image'.repeat(50))), (e) => e instanceof InvalidRequestError);
    await Template.delete('tsoci');
    await Template.delete('tsoci2');
  });
});

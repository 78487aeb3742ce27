// database_branch.test.mjs -- database.branch() and forkTree/explore({ databases: 'branch' }) (the branch routes).
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { ConflictError, Database, NotFoundError, Sandbox, database, dbName, health, psql, sandbox, track, trackDb } from './helpers.mjs';

const sql = (db, q) => {
  const r = psql(db.url, q);
  assert.equal(r.status, 0, r.stderr);
  return r.stdout;
};

describe('database branches', () => {
  it('branch: a new database with the data, changed apart', async (t) => {
    if (psql('postgresql://x@127.0.0.1:1/x', 'select 1') === null) return t.skip('no psql on the host');
    const src = await database();
    sql(src, 'create table t (x int); insert into t values (1), (2)');
    const name = dbName();
    const br = trackDb(await src.branch(name, { metadata: { role: 'trial' }, idleSeconds: 900 }));
    assert.ok(br instanceof Database);
    assert.notEqual(br.id, src.id);
    assert.notEqual(br.url, src.url);
    assert.deepEqual([br.name, br.state, br.metadata, br.idleSeconds], [name, 'running', { role: 'trial' }, 900]);
    assert.equal(sql(br, 'select sum(x) from t'), '3\n');
    sql(br, 'insert into t values (10)');
    assert.deepEqual([sql(src, 'select sum(x) from t'), sql(br, 'select sum(x) from t')], ['3\n', '13\n']);
    await assert.rejects(src.branch(name), (e) => e instanceof ConflictError);
    await br.delete();
    await assert.rejects(br.branch(dbName()), (e) => e instanceof NotFoundError);
  });

  it('forkTree and explore with databases: "branch"', async (t) => {
    if (psql('postgresql://x@127.0.0.1:1/x', 'select 1') === null) return t.skip('no psql on the host');
    const ck = (await health()).checkpoints;
    if (!ck?.available) return t.skip('checkpoints unavailable on this host: ' + ck?.criu);
    const src = await database();
    sql(src, 'create table t (x int); insert into t values (7)');
    const parent = await sandbox({ databases: [src] });
    let before = new Set((await Database.list()).map((d) => d.id));
    const kids = (await parent.forkTree({ count: 2, databases: 'branch' })).map(track);
    let made = (await Database.list()).filter((d) => !before.has(d.id)).map(trackDb);
    assert.equal(made.length, 2);
    const urls = await Promise.all(kids.map(async (k) => (await k.exec('printf %s "$DATABASE_URL"')).stdout));
    assert.deepEqual(urls.sort(), made.map((d) => d.url).sort());
    for (const d of made) assert.equal(sql(d, 'select x from t'), '7\n');
    assert.equal((await parent.exec('printf %s "$DATABASE_URL"')).stdout, src.url);
    before = new Set((await Database.list()).map((d) => d.id));
    const res = await parent.explore({ branches: ['printf %s "$DATABASE_URL"', 'printf %s "$DATABASE_URL"'], keep: 'best', databases: 'branch' });
    made = (await Database.list()).filter((d) => !before.has(d.id)).map(trackDb);
    assert.equal(made.length, 2);
    assert.deepEqual(res.outcomes.map((o) => o.stdoutTail).sort(), made.map((d) => d.url).sort());
    await Promise.all(res.outcomes.map(async (o) => (await Sandbox.connect(o.sandboxId)).kill().catch(() => {})));
    await assert.rejects(parent.forkTree({ count: 1, databases: 'bogus' }), (e) => e.status === 400);
    assert.equal(sql(src, 'select x from t'), '7\n');
  });
});

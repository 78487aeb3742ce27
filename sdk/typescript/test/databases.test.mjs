// databases.test.mjs -- Database (create/get/list/refresh/delete, url) and Sandbox.create({ databases }), with the
// host's psql through moatd's PostgreSQL proxy.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import {
  ConflictError, Database, InvalidRequestError, NotFoundError, API_KEY, API_URL, database, dbName, psql, sandbox, trackDb,
} from './helpers.mjs';

const MISSING = 'db-' + 'a'.repeat(17);
const api = async (path) => (await fetch(API_URL + path, { headers: { Authorization: `Bearer ${API_KEY}` } })).json();

describe('databases', () => {
  it('create, url, get, list, refresh, delete', async (t) => {
    if (psql('postgresql://x@127.0.0.1:1/x', 'select 1') === null) return t.skip('no psql on the host');
    const name = dbName();
    const db = await database(name, { idleSeconds: 600, metadata: { team: 'a' } });
    assert.ok(db instanceof Database);
    const j = await api(`/v1/databases/${db.id}`);
    assert.deepEqual(
      [db.id, db.name, db.state, db.sizeMb, db.idleSeconds, db.metadata, db.createdAt, db.volume, db.sandboxId],
      [j.id, name, 'running', 64, 600, { team: 'a' }, j.created_at, j.volume, j.sandbox_id]);
    assert.deepEqual(db.connection, j.connection);
    assert.equal(db.url, j.connection.url);
    assert.match(db.url, /^postgresql:\/\/db_[a-z0-9]{17}:[a-z0-9]{32}@127\.0\.0\.1:\d+\/db_[a-z0-9]{17}\?sslmode=disable$/);
    // the URL works
    let r = psql(db.url, 'create table t (x int); insert into t values (20), (22)');
    assert.equal(r.status, 0, r.stderr);
    r = psql(db.url, 'select sum(x) from t');
    assert.deepEqual([r.status, r.stdout], [0, '42\n'], r.stderr);
    // get and list
    assert.equal((await Database.get(db.id)).url, db.url);
    const other = await database();
    const mine = async () => (await Database.list()).map((d) => d.id).filter((id) => id === db.id || id === other.id);
    assert.deepEqual(await mine(), [db.id, other.id]); // oldest first
    // refresh: a sandbox deleted under it is stopped; the next connection starts one on the same data
    await fetch(`${API_URL}/v1/sandboxes/${db.sandboxId}`, { method: 'DELETE', headers: { Authorization: `Bearer ${API_KEY}` } });
    assert.equal(await db.refresh(), db);
    assert.equal(db.state, 'stopped');
    r = psql(db.url, 'select sum(x) from t');
    assert.deepEqual([r.status, r.stdout], [0, '42\n'], r.stderr);
    assert.equal((await db.refresh()).state, 'running');
    assert.notEqual(db.sandboxId, j.sandbox_id);
    await db.delete();
    await assert.rejects(Database.get(db.id), (e) => e instanceof NotFoundError && e.code === 'not_found');
    await assert.rejects(db.delete(), (e) => e instanceof NotFoundError);
    assert.deepEqual(await mine(), [other.id]);
  });

  it('Sandbox.create({ databases }) sets the URLs in env', async () => {
    const a = await database();
    const b = await database();
    for (const dbs of [[a, { id: b, env: 'MEMORY_URL' }], [a.id, { id: b.id, env: 'MEMORY_URL' }]]) {
      const sb = await sandbox({ databases: dbs, env: { OTHER: '1' } });
      const out = (await sb.exec('printf "%s\\n%s\\n%s\\n" "$DATABASE_URL" "$MEMORY_URL" "$OTHER"')).stdout;
      assert.equal(out, `${a.url}\n${b.url}\n1\n`);
      await sb.kill();
    }
  });

  it('errors: typed from moatd, argument checks before any request', async () => {
    const db = await database();
    const count = (await Database.list()).length;
    await assert.rejects(Database.create(db.name, { sizeMb: 64 }), (e) => e instanceof ConflictError && e.code === 'already_exists');
    for (const bad of ['Bad Name', '_a', 'a.b']) {
      await assert.rejects(trackDbOnSuccess(Database.create(bad)), (e) => e instanceof InvalidRequestError && /name/.test(e.message));
    }
    await assert.rejects(Database.create('ok', { sizeMb: 2 ** 30 }), (e) => e instanceof InvalidRequestError && /size_mb/.test(e.message));
    await assert.rejects(Database.get(MISSING), (e) => e instanceof NotFoundError);
    await assert.rejects(sandbox({ databases: [MISSING] }), (e) => e instanceof NotFoundError);
    await assert.rejects(sandbox({ databases: [db, { id: db, env: 'DATABASE_URL' }] }), (e) => e instanceof InvalidRequestError);
    // checked here: TypeError naming the argument
    const local = [
      [() => Database.create(3), /name must be a string/],
      [() => Database.create(''), /name must not be empty/],
      [() => Database.create('a', { sizeMb: 32 }), /sizeMb must be from 64/],
      [() => Database.create('a', { sizeMb: '64' }), /sizeMb must be an integer/],
      [() => Database.create('a', { idleSeconds: 0 }), /idleSeconds/],
      [() => Database.create('a', { metadata: { k: 1 } }), /metadata\.k/],
      [() => Database.create('a', { size_mb: 64 }), /unknown option 'size_mb'/],
      [() => Database.get(7), /id must be a string/],
      [() => db.branch(''), /name must not be empty/],
      [() => db.branch('b', { sizeMb: 64 }), /unknown option 'sizeMb'/],
      [() => sandbox({ databases: 'db-x' }), /databases must be an array/],
      [() => sandbox({ databases: [3] }), /databases\[0\] must be a Database/],
      [() => sandbox({ databases: [{ id: 'db-x', env: '1A' }] }), /not a variable name/],
      [() => sandbox({ databases: [{ id: 'db-x', extra: 1 }] }), /unknown option 'extra'/],
    ];
    for (const [fn, re] of local) await assert.rejects(fn(), (e) => e instanceof TypeError && re.test(e.message));
    assert.equal((await Database.list()).length, count, 'a refused create made a database');
  });
});

/** A create that was meant to fail but did not is deleted at the end all the same. */
async function trackDbOnSuccess(p) {
  return trackDb(await p);
}

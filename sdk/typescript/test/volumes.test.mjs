// volumes.test.mjs -- Volume (create/get/list/refresh/delete, files with no sandbox) and Sandbox.create({ volumes }).
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { ConflictError, NotFoundError, Volume, sandbox } from './helpers.mjs';

const vname = () => 'vol-ts-' + Math.random().toString(36).slice(2, 10);

describe('volumes', () => {
  it('create, files, mount read-write and read-only, delete', async () => {
    const name = vname();
    const vol = await Volume.create(name, 24);
    try {
      assert.equal(vol.sizeMb, 24);
      assert.deepEqual(vol.attached, []);
      await assert.rejects(Volume.create(name, 24), (e) => e instanceof ConflictError);
      await assert.rejects(Volume.create(name, 0), /sizeMb/);
      assert.deepEqual(await vol.write('/in/a.txt', 'from ts'), { path: '/in/a.txt', size: 7 });
      assert.equal(await vol.readText('in/a.txt'), 'from ts');
      assert.deepEqual((await vol.listFiles('/in')).map((e) => e.name), ['a.txt']);
      const w = await sandbox({ volumes: [{ name, path: '/data' }] });
      assert.equal((await w.exec('cat /data/in/a.txt')).stdout, 'from ts');
      await w.exec('echo from-sandbox > /data/b');
      await assert.rejects(sandbox({ volumes: [{ name, path: '/data' }] }), (e) => e instanceof ConflictError && e.code === 'volume_in_use');
      const r = await sandbox({ volumes: [{ name, path: '/ro', readOnly: true }] });
      assert.notEqual((await r.exec('touch /ro/x')).exitCode, 0);
      assert.deepEqual((await r.getInfo()).volumes, [{ name, path: '/ro', readOnly: true }]);
      assert.deepEqual((await w.getInfo()).volumes, [{ name, path: '/data', readOnly: false }]);
      assert.equal((await vol.refresh()).attached.length, 2);
      await assert.rejects(vol.delete(), (e) => e instanceof ConflictError && e.code === 'volume_in_use');
      await w.kill();
      await r.kill();
      assert.equal(await vol.readText('/b'), 'from-sandbox\n');
      await vol.remove('/b');
      await assert.rejects(vol.read('/b'), (e) => e instanceof NotFoundError);
      assert.ok((await Volume.list()).some((x) => x.name === name));
    } finally {
      await vol.delete().catch(() => {});
    }
    await assert.rejects(Volume.get(name), (e) => e instanceof NotFoundError && e.code === 'volume_not_found');
  });
});

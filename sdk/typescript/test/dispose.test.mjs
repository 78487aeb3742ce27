// dispose.test.mjs -- Symbol.asyncDispose (`await using`): a non-persistent sandbox is killed at the
// block's end, a persistent one is kept. (Node 20 cannot parse `await using`; tsc compiles it to a
// call of this method, which examples/typescript exercises.)
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { Sandbox, sandbox, track } from './helpers.mjs';

describe('asyncDispose', () => {
  it('kills a non-persistent sandbox, even when the block throws', async () => {
    const sb = await Sandbox.create({ ttlSeconds: 300 });
    track(sb);
    assert.equal(typeof sb[Symbol.asyncDispose], 'function');
    try {
      try {
        await sb.exec('true');
        throw new Error('body failed');
      } finally {
        await sb[Symbol.asyncDispose]();
      }
    } catch (e) {
      assert.equal(e.message, 'body failed');
    }
    assert.equal((await sb.getInfo()).state, 'killed');
    await sb[Symbol.asyncDispose](); // twice is fine
  });

  it('keeps a persistent sandbox', async () => {
    const sb = await sandbox({ persistent: true });
    await sb[Symbol.asyncDispose]();
    assert.equal((await sb.getInfo()).state, 'running');
  });
});

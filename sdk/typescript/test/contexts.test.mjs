// contexts.test.mjs -- code contexts on the code-interpreter template: state across runs, results,
// errors with tracebacks, streaming callbacks, node and bash, restart and delete.
import assert from 'node:assert/strict';
import { describe, it, before } from 'node:test';
import { NotFoundError, sandbox } from './helpers.mjs';

describe('code contexts', () => {
  let sb;
  before(async () => {
    sb = await sandbox({ template: 'code-interpreter' });
  });

  it('python: state persists, last value, stdout, error with traceback', async () => {
    const ctx = await sb.createCodeContext();
    assert.equal(ctx.language, 'python');
    const a = await ctx.runCode('x = 20\nprint("hi")\nx + 22');
    assert.equal(a.text, '42');
    assert.equal(a.stdout, 'hi\n');
    assert.equal(a.error, null);
    assert.ok(a.results.some((r) => r.isMainResult && r.text === '42'));
    const b = await ctx.runCode('x * 2');
    assert.equal(b.text, '40');
    const c = await ctx.runCode('1/0');
    assert.equal(c.error.name, 'ZeroDivisionError');
    assert.match(c.error.traceback, /ZeroDivisionError/);
    assert.match(c.error.traceback, /^Traceback \(most recent call last\):\n/, 'one line per line');
    assert.equal(c.text, undefined);
    const t = await ctx.runCode('import time\ntime.sleep(30)', { timeoutMs: 500 });
    assert.equal(t.timedOut, true);
    assert.equal((await ctx.runCode('x')).text, '20', 'variables survive an interrupt');
    await ctx.restart();
    const d = await ctx.runCode('x');
    assert.equal(d.error.name, 'NameError');
    const listed = await sb.listCodeContexts();
    assert.ok(listed.some((c2) => c2.id === ctx.id));
    await ctx.delete();
    await assert.rejects(ctx.runCode('1'), NotFoundError);
  });

  it('streaming callbacks and a figure', async () => {
    const ctx = await sb.createCodeContext({ language: 'python' });
    const outs = [];
    const results = [];
    const ex = await ctx.runCode(
      'import sys, time\nfor i in range(3):\n    print(i, flush=True); time.sleep(0.1)\nprint("e", file=sys.stderr)\n' +
        'import matplotlib\nmatplotlib.use("Agg")\nimport matplotlib.pyplot as plt\nplt.plot([1,2,3])\nplt.show()\n"done"',
      { onStdout: (t) => outs.push(t), onResult: (r) => results.push(r) },
    );
    assert.equal(outs.join(''), '0\n1\n2\n');
    assert.equal(ex.stdout, '0\n1\n2\n');
    assert.equal(ex.stderr, 'e\n');
    assert.equal(ex.text, "'done'");
    assert.ok(ex.results.some((r) => typeof r.png === 'string' && r.png.length > 100), 'a PNG result');
    assert.equal(results.length, ex.results.length);
    const err = await ctx.runCode('raise ValueError("bad")', { onStdout: () => {} });
    assert.equal(err.error.name, 'ValueError');
    await ctx.delete();
  });

  it('node and bash contexts', async () => {
    const js = await sb.createCodeContext({ language: 'node' });
    await js.runCode('let n = 5');
    assert.equal((await js.runCode('n * 3')).text, '15');
    const sh = await sb.createCodeContext({ language: 'bash' });
    await sh.runCode('V=7');
    const r = await sh.runCode('echo $V; false');
    assert.equal(r.stdout, '7\n');
    assert.equal(r.exitCode, 1);
  });
});

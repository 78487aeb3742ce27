// run_code_tool.ts -- the "run the model's code" tool in the Mastra shape, on @moat/sdk.
//
// A Mastra tool is an object made by createTool({id, description, inputSchema, outputSchema,
// execute}); the agent hands the model's arguments to execute({context}). This file is built
// WITHOUT installing Mastra: `createTool` below is a local stand-in with the same shape that checks
// the input against a small JSON-Schema-like description (examples/mastra/mastra_agent.mjs is an
// agent on the real @mastra/core). With Mastra, replace it by
//   import { createTool } from '@mastra/core/tools';  import { z } from 'zod';
// and inputSchema by z.object({ code: z.string() }); `execute` stays as it is.
//
// The model is stubbed: MODEL_TOOL_CALLS is a fixed list of the tool calls a model would make
// (first a buggy program, then, after reading the traceback, the fixed one). Everything else is
// real: each call runs in a moat sandbox (code-interpreter template) through the SDK, and the
// sandbox is killed when the `await using` block ends.
//
//   MOAT_API_URL=http://127.0.0.1:7070 MOAT_API_KEY=... node dist/run_code_tool.js

import { Sandbox, type CodeContext } from '@moat/sdk';

type Schema = { type: 'object'; properties: Record<string, { type: 'string'; description: string }>; required: string[] };

interface Tool<I, O> {
  id: string;
  description: string;
  inputSchema: Schema;
  execute: (args: { context: I }) => Promise<O>;
}

/** Local stand-in for Mastra's createTool (same fields); validates the model's arguments. */
function createTool<I extends Record<string, unknown>, O>(t: Tool<I, O>): Tool<I, O> {
  return {
    ...t,
    execute: async ({ context }) => {
      for (const k of t.inputSchema.required) {
        if (typeof context?.[k] !== 'string') throw new TypeError(`${t.id}: argument '${k}' must be a string`);
      }
      return t.execute({ context });
    },
  };
}

/** What the model sees after a call: stdout and the last value, or the traceback to fix. */
interface RunCodeOutput {
  ok: boolean;
  stdout: string;
  result?: string;
  traceback?: string;
}

/** The tool: runs Python code in a persistent interpreter of one sandbox (variables survive between calls). */
export function runCodeTool(ctx: CodeContext) {
  return createTool<{ code: string }, RunCodeOutput>({
    id: 'run-python',
    description:
      'Run Python 3 code in an isolated Linux sandbox with numpy, pandas and matplotlib. Variables persist between ' +
      'calls. Returns stdout and the value of the last expression, or the traceback if the code raised.',
    inputSchema: {
      type: 'object',
      properties: { code: { type: 'string', description: 'Python source to run' } },
      required: ['code'],
    },
    execute: async ({ context }) => {
      const ex = await ctx.runCode(context.code, { timeoutMs: 30_000 });
      if (ex.error) return { ok: false, stdout: ex.stdout, traceback: ex.error.traceback };
      return { ok: true, stdout: ex.stdout, result: ex.text };
    },
  });
}

/** The stubbed model: the tool calls it makes, in order. */
const MODEL_TOOL_CALLS: { code: string }[] = [
  { code: 'import statistics\nrows = [3, 1, 4, 1, 5, 9, 2, 6]\nprint("median:", statistics.median(row))' },
  { code: 'print("median:", statistics.median(rows))\nsum(rows) / len(rows)' },
];

async function main(): Promise<number> {
  await using sb = await Sandbox.create({ template: 'code-interpreter', ttlSeconds: 600, metadata: { example: 'run_code_tool' } });
  const tool = runCodeTool(await sb.createCodeContext({ language: 'python' }));
  const transcript: RunCodeOutput[] = [];
  for (const call of MODEL_TOOL_CALLS) {
    console.log(`model -> ${tool.id}(${JSON.stringify(call.code)})`);
    const out = await tool.execute({ context: call });
    console.log('tool  ->', JSON.stringify(out));
    transcript.push(out);
  }
  // What a model would have seen: the first program failed with a NameError it can fix, the second worked.
  const [first, second] = transcript;
  const pass =
    first.ok === false &&
    /NameError/.test(first.traceback ?? '') &&
    second.ok === true &&
    second.stdout === 'median: 3.5\n' &&
    second.result === '3.875';
  console.log(pass ? 'example passed' : 'example FAILED');
  return pass ? 0 : 1;
}

process.exitCode = await main();

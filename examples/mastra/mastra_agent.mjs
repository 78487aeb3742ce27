// mastra_agent.mjs -- a Mastra agent (@mastra/core from npm) whose tool runs shell commands in a moat
// sandbox through @moat/sdk.
//
// The agent and its tool loop are Mastra's own: `new Agent({ model, tools })`, a tool made by
// `createTool` with a zod input schema, and `agent.generate(...)`.
//
// THE MODEL IS SCRIPTED: no LLM is called. The model is the `ai` package's MockLanguageModelV2
// (from 'ai/test'), whose stream answers with a `run-shell` tool call while the prompt holds no tool
// result, and once it does with text quoting that result, as a model would. For a real model, put
// e.g. `openai('gpt-4o')` from @ai-sdk/openai in its place. Mastra's telemetry is turned off.
//
//   (cd sdk/typescript && npm install && npm run build)
//   cd examples/mastra && npm ci && mkdir -p node_modules/@moat && ln -sfn ../../../../sdk/typescript node_modules/@moat/sdk
//   MOAT_API_URL=http://127.0.0.1:7070 MOAT_API_KEY=$(cat ../../.moat/api-key) node mastra_agent.mjs
//
// The tool works in the sandbox named by MOAT_SANDBOX_ID (left running), or else in one it makes,
// puts an input file in, and kills at the end. Prints the agent's answer after "--- answer ---"; exits
// 0 when the tool's output reached it.
process.env.MASTRA_TELEMETRY_DISABLED ??= '1';

import { Agent } from '@mastra/core/agent';
import { createTool } from '@mastra/core/tools';
import { MockLanguageModelV2, simulateReadableStream } from 'ai/test';
import { z } from 'zod';
import { Sandbox } from '@moat/sdk';

const INPUT_PATH = '/root/moat-example-input.txt';
const COMMAND = `cat ${INPUT_PATH}; echo host=$(hostname)`;

/** The tool: one shell command in the sandbox; the model sees its exit code, stdout and stderr. */
function shellTool(sandbox) {
  return createTool({
    id: 'run-shell',
    description: 'Run a shell command in an isolated Linux sandbox; returns its exit code, stdout and stderr.',
    inputSchema: z.object({ command: z.string().describe('the command line, run by /bin/sh') }),
    outputSchema: z.object({ exitCode: z.number(), stdout: z.string(), stderr: z.string() }),
    execute: async ({ command }) => {
      const r = await sandbox.exec(command, { timeoutMs: 60_000 });
      return { exitCode: r.exitCode, stdout: r.stdout, stderr: r.stderr };
    },
  });
}

const usage = { inputTokens: 10, outputTokens: 10, totalTokens: 20 };

/** The scripted model's next turn (LanguageModelV2 content) from the prompt Mastra built. */
function nextTurn(prompt) {
  const results = prompt.filter((m) => m.role === 'tool').flatMap((m) => m.content)
    .filter((p) => p.type === 'tool-result');
  if (results.length === 0) {
    const input = JSON.stringify({ command: COMMAND });
    return { finishReason: 'tool-calls', content: [{ type: 'tool-call', toolCallId: 'call_1', toolName: 'run-shell', input }] };
  }
  const out = results[results.length - 1].output;
  const v = out.type === 'json' ? out.value : { stdout: String(out.value) };
  return { finishReason: 'stop', content: [{ type: 'text', text: `The sandbox said (exit code ${v.exitCode}):\n${v.stdout}` }] };
}

/** The same turn as the stream parts of doStream. */
function streamParts({ finishReason, content }) {
  const parts = [{ type: 'stream-start', warnings: [] }];
  for (const c of content) {
    if (c.type !== 'text') parts.push(c);
    else parts.push({ type: 'text-start', id: 't1' }, { type: 'text-delta', id: 't1', delta: c.text }, { type: 'text-end', id: 't1' });
  }
  parts.push({ type: 'finish', finishReason, usage });
  return parts;
}

const model = new MockLanguageModelV2({
  provider: 'scripted',
  modelId: 'scripted-model',
  doGenerate: async ({ prompt }) => ({ ...nextTurn(prompt), usage, warnings: [] }),
  doStream: async ({ prompt }) => ({ stream: simulateReadableStream({ chunks: streamParts(nextTurn(prompt)) }) }),
});

async function main() {
  const given = process.env.MOAT_SANDBOX_ID;
  const sandbox = given ? await Sandbox.connect(given) : await Sandbox.create({ ttlSeconds: 600, metadata: { example: 'mastra' } });
  let answer;
  try {
    if (!given) await sandbox.files.write(INPUT_PATH, 'hello from the moat sandbox\n');
    const agent = new Agent({
      id: 'sandbox-agent',
      name: 'sandbox-agent',
      instructions: 'Use run-shell to look at the sandbox files.',
      model,
      tools: { 'run-shell': shellTool(sandbox) },
    });
    const res = await agent.generate(`What does ${INPUT_PATH} say, and what is the sandbox's hostname?`, { maxSteps: 3 });
    answer = res.text;
    const calls = res.steps.flatMap((s) => s.toolCalls ?? []);
    console.log(`steps ${res.steps.length}, tool calls ${calls.length}`);
  } finally {
    if (!given) await sandbox.kill();
  }
  console.log(`--- answer ---\n${answer.replace(/\n+$/, '')}`);
  const ok = answer.startsWith('The sandbox said (exit code 0):\n') && answer.includes('host=');
  console.log(ok ? 'example ok' : 'example FAILED');
  process.exit(ok ? 0 : 1);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});

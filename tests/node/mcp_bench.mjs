// mcp_bench.mjs -- times Client.callTool("shell", {command: "true"}) of the official MCP SDK against moatd
// (bench/mcp.py runs it). Prints one JSON line {"ms": [...]} with one duration per call.
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

const url = new URL(`${process.env.MOAT_URL}/v1/sandboxes/${process.env.MOAT_SANDBOX}/mcp`);
const transport = new StreamableHTTPClientTransport(url, {
  requestInit: { headers: { Authorization: `Bearer ${process.env.MOAT_KEY}` } },
});
const client = new Client({ name: 'moat-bench', version: '1.0.0' });
await client.connect(transport);
const n = Number(process.env.MOAT_CALLS || 400);
const ms = [];
for (let i = 0; i < 20 + n; i++) {
  const t = performance.now();
  const r = await client.callTool({ name: 'shell', arguments: { command: 'true' } });
  const dt = performance.now() - t;
  if (r.isError || !r.content[0].text.startsWith('exit_code: 0')) throw new Error(JSON.stringify(r));
  if (i >= 20) ms.push(dt);
}
await transport.terminateSession();
await client.close();
console.log(JSON.stringify({ ms }));

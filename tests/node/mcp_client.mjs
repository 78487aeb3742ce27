// mcp_client.mjs -- drives moatd's MCP endpoints with the official MCP TypeScript SDK client, unmodified.
//
//   MOAT_URL=http://127.0.0.1:PORT MOAT_KEY=KEY [MOAT_SANDBOX=sb-...] [MOAT_RUN=tag] node mcp_client.mjs SCENARIO
//
// Each scenario asserts with node:assert and exits 0 when all holds; on failure it prints the
// assertion and exits 1. tests/integration/test_mcp.py runs one scenario per unittest.
import assert from 'node:assert/strict';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { McpError } from '@modelcontextprotocol/sdk/types.js';

const BASE = process.env.MOAT_URL;
const KEY = process.env.MOAT_KEY;
const SANDBOX = process.env.MOAT_SANDBOX;
const RUN = process.env.MOAT_RUN || 'mcp-test';

async function connect(path, key = KEY) {
  const transport = new StreamableHTTPClientTransport(new URL(BASE + path), {
    requestInit: { headers: { Authorization: `Bearer ${key}` } },
  });
  const client = new Client({ name: 'moat-mcp-test', version: '1.0.0' });
  await client.connect(transport);
  return { client, transport };
}

const text = (res) => res.content.filter((c) => c.type === 'text').map((c) => c.text).join('\n');

async function call(client, name, args) {
  const res = await client.callTool({ name, arguments: args });
  assert.ok(Array.isArray(res.content), `${name}: content is an array`);
  for (const c of res.content) assert.equal(c.type, 'text');
  return res;
}

const scenarios = {
  // initialize (negotiation, session id, server info) and tools/list of the sandbox endpoint
  async sandbox_initialize() {
    const { client, transport } = await connect(`/v1/sandboxes/${SANDBOX}/mcp`);
    assert.equal(client.getServerVersion().name, 'moat');
    assert.ok(client.getServerVersion().version);
    assert.deepEqual(client.getServerCapabilities().tools, { listChanged: false });
    assert.match(transport.sessionId, /^[0-9a-f]{32}$/);
    assert.equal(transport.protocolVersion, '2025-11-25');
    assert.match(client.getInstructions(), new RegExp(SANDBOX));
    const { tools } = await client.listTools();
    assert.deepEqual(tools.map((t) => t.name).sort(), ['list_dir', 'read_file', 'shell', 'write_file']);
    for (const t of tools) {
      assert.equal(t.inputSchema.type, 'object');
      assert.ok(t.description.length > 10);
      assert.equal(t.inputSchema.additionalProperties, false);
    }
    const shell = tools.find((t) => t.name === 'shell');
    assert.deepEqual(shell.inputSchema.required, ['command']);
    assert.equal(shell.inputSchema.properties.timeout_ms.type, 'integer');
    await client.ping();
    await transport.terminateSession();
    await client.close();
  },

  // shell, write_file, read_file, list_dir against one sandbox
  async sandbox_roundtrip() {
    const { client } = await connect(`/v1/sandboxes/${SANDBOX}/mcp`);
    let r = await call(client, 'shell', { command: 'echo out; echo err >&2; exit 3' });
    assert.equal(r.isError, false);
    assert.match(text(r), /^exit_code: 3\n--- stdout ---\nout\n--- stderr ---\nerr\n$/);
    r = await call(client, 'shell', { command: 'pwd; id -u', cwd: '/tmp' });
    assert.match(text(r), /exit_code: 0\n--- stdout ---\n\/tmp\n0\n/);
    r = await call(client, 'shell', { command: 'sleep 5', timeout_ms: 300 });
    assert.match(text(r), /^timed out after 300 ms/);

    const body = 'héllo from mcp\nline 2\n';
    r = await call(client, 'write_file', { path: '/root/mcp/dir/a.txt', content: body });
    assert.equal(r.isError, false, text(r));
    assert.equal(text(r), `wrote ${Buffer.byteLength(body)} bytes to /root/mcp/dir/a.txt`);
    r = await call(client, 'write_file', { path: 'mcp/rel.txt', content: '' });
    assert.equal(text(r), 'wrote 0 bytes to /root/mcp/rel.txt');
    r = await call(client, 'read_file', { path: '/root/mcp/dir/a.txt' });
    assert.equal(r.isError, false);
    assert.equal(text(r), body);
    r = await call(client, 'shell', { command: 'cat /root/mcp/dir/a.txt | wc -c' });
    assert.match(text(r), new RegExp(`--- stdout ---\\n${Buffer.byteLength(body)}\\n`));

    r = await call(client, 'list_dir', { path: '/root/mcp' });
    assert.equal(r.isError, false);
    assert.match(text(r), /^dir \d+ 0\d{3} \/root\/mcp\/dir\/$/m);
    assert.match(text(r), /^file 0 0644 \/root\/mcp\/rel.txt$/m);
    assert.doesNotMatch(text(r), /a\.txt/);
    r = await call(client, 'list_dir', { path: '/root/mcp', depth: 2 });
    assert.match(text(r), new RegExp(`^file ${Buffer.byteLength(body)} 0644 /root/mcp/dir/a.txt$`, 'm'));

    await call(client, 'shell', { command: "printf 'a\\000b\\377' > /root/mcp/bin" });
    r = await call(client, 'read_file', { path: '/root/mcp/bin' });
    assert.equal(r.isError, false);
    assert.match(text(r), /binary file \(4 bytes/);

    await call(client, 'shell', { command: 'yes 0123456789abcde | head -c 1600000 > /root/mcp/big.txt' });
    r = await call(client, 'read_file', { path: '/root/mcp/big.txt' });
    assert.equal(r.isError, false);
    assert.equal(r.content.length, 2);
    assert.equal(r.content[0].text.length, 1048576);
    assert.ok(r.content[0].text.startsWith('0123456789abcde\n'));
    assert.match(r.content[1].text, /truncated: the first 1048576 of 1600000 bytes/);

    r = await call(client, 'read_file', { path: '/proc/version' }); // stat says 0 bytes
    assert.equal(r.isError, false);
    assert.match(text(r), /^Linux version /);

    r = await call(client, 'read_file', { path: '/root/mcp/none' });
    assert.equal(r.isError, true);
    assert.match(text(r), /not_found/);
    r = await call(client, 'list_dir', { path: '/root/mcp/dir/a.txt' });
    assert.equal(r.isError, true);
    r = await call(client, 'write_file', { path: '/root/mcp/dir/a.txt/x', content: 'x' });
    assert.equal(r.isError, true);
    await client.close();
  },

  // the workspace endpoint: create -> exec -> list -> kill
  async workspace() {
    const { client } = await connect('/v1/mcp');
    const { tools } = await client.listTools();
    assert.deepEqual(tools.map((t) => t.name).sort(),
      ['create_sandbox', 'database_branch', 'database_create', 'database_delete', 'database_list', 'exec', 'fork_sandbox',
        'hibernate_sandbox', 'kill_sandbox', 'list_sandboxes']);
    let r = await call(client, 'create_sandbox', { ttl_seconds: 600, metadata: { run: RUN } });
    assert.equal(r.isError, false, text(r));
    const sb = JSON.parse(text(r));
    assert.match(sb.id, /^sb-[a-z0-9]{17}$/);
    assert.equal(sb.state, 'running');
    assert.equal(sb.template, 'base');
    assert.deepEqual(sb.metadata, { run: RUN });

    r = await call(client, 'exec', { sandbox_id: sb.id, command: 'echo hi-$((6*7))' });
    assert.equal(r.isError, false, text(r));
    assert.match(text(r), /^exit_code: 0\n--- stdout ---\nhi-42\n/);

    r = await call(client, 'list_sandboxes', { metadata: { run: RUN } });
    assert.deepEqual(JSON.parse(text(r)).sandboxes.map((s) => s.id), [sb.id]);

    r = await call(client, 'kill_sandbox', { sandbox_id: sb.id });
    assert.equal(r.isError, false, text(r));
    r = await call(client, 'exec', { sandbox_id: sb.id, command: 'true' });
    assert.equal(r.isError, true);
    assert.match(text(r), /not_found/);
    r = await call(client, 'kill_sandbox', { sandbox_id: sb.id });
    assert.equal(r.isError, true);
    r = await call(client, 'create_sandbox', { template: 'no-such-template' });
    assert.equal(r.isError, true);
    assert.match(text(r), /unknown template/);
    r = await call(client, 'exec', { sandbox_id: 'sb-nope', command: 'true' });
    assert.equal(r.isError, true);
    await client.close();
  },

  // fork_sandbox and hibernate_sandbox do what the v1 routes do: the same success, or an isError result
  // carrying the same error code (e.g. checkpoints_unavailable on a host without working CRIU)
  async workspace_time_travel() {
    const { client } = await connect('/v1/mcp');
    const make = async () => {
      const r = await call(client, 'create_sandbox', { ttl_seconds: 600, metadata: { run: RUN } });
      assert.equal(r.isError, false, text(r));
      return JSON.parse(text(r)).id;
    };
    const rest = async (path, body) => {
      const res = await fetch(BASE + path, {
        method: 'POST', body: JSON.stringify(body),
        headers: { Authorization: `Bearer ${KEY}`, 'Content-Type': 'application/json' },
      });
      return { status: res.status, body: await res.json() };
    };
    const a = await make(), b = await make();
    const viaRest = await rest(`/v1/sandboxes/${a}/fork`, { count: 1 });
    let r = await call(client, 'fork_sandbox', { sandbox_id: b, count: 1 });
    console.log(`fork: REST ${viaRest.status} ${viaRest.body.code || ''}; MCP isError=${r.isError}`);
    if (viaRest.status === 201) {
      assert.equal(r.isError, false, text(r));
      const kids = JSON.parse(text(r)).sandboxes;
      assert.equal(kids.length, 1);
      assert.notEqual(kids[0].id, b);
      r = await call(client, 'exec', { sandbox_id: kids[0].id, command: 'echo child' });
      assert.match(text(r), /child/);
    } else {
      assert.equal(r.isError, true);
      assert.match(text(r), new RegExp(`^error \\(${viaRest.body.code}\\): fork_sandbox: `));
    }
    const hib = await rest(`/v1/sandboxes/${a}/hibernate`, {});
    r = await call(client, 'hibernate_sandbox', { sandbox_id: b });
    console.log(`hibernate: REST ${hib.status} ${hib.body.code || ''}; MCP isError=${r.isError}`);
    if (hib.status === 200) {
      assert.equal(r.isError, false, text(r));
      // the next exec wakes it: through MCP as through REST (restore may fail on this host)
      const ex = await rest(`/v1/sandboxes/${a}/exec`, { cmd: 'echo awake' });
      r = await call(client, 'exec', { sandbox_id: b, command: 'echo awake' });
      console.log(`exec after hibernate: REST ${ex.status} ${ex.body.code || ''}; MCP isError=${r.isError}`);
      if (ex.status === 200) {
        assert.match(text(r), /^exit_code: 0\n--- stdout ---\nawake\n/);
      } else {
        assert.equal(r.isError, true);
        assert.match(text(r), new RegExp(`^error \\(${ex.body.code}\\): could not run the command: `));
      }
    } else {
      assert.equal(r.isError, true);
      assert.match(text(r), new RegExp(`^error \\(${hib.body.code}\\): hibernate_sandbox: `));
    }
    r = await call(client, 'fork_sandbox', { sandbox_id: b, count: 17 });
    assert.equal(r.isError, true);
    assert.match(text(r), /'count' must be an integer from 1 to 16/);
    await client.close();
  },

  // database_create -> the URL works with the host's psql -> database_list -> database_delete; errors as
  // the v1 routes answer them, arguments checked against the published schemas
  async databases() {
    const { client } = await connect('/v1/mcp');
    const { tools } = await client.listTools();
    const schema = Object.fromEntries(tools.map((t) => [t.name, t.inputSchema]));
    assert.deepEqual(schema.database_create.required, ['name']);
    assert.deepEqual(Object.keys(schema.database_create.properties).sort(), ['idle_seconds', 'metadata', 'name', 'size_mb']);
    assert.deepEqual(schema.database_delete.required, ['database_id']);
    assert.deepEqual(schema.database_list.properties, {});
    const rest = async (method, path) => {
      const res = await fetch(BASE + path, { method, headers: { Authorization: `Bearer ${KEY}` } });
      return { status: res.status, body: res.status === 204 ? null : await res.json() };
    };
    const name = RUN;
    let r = await call(client, 'database_create', { name, size_mb: 64, idle_seconds: 600, metadata: { run: RUN } });
    assert.equal(r.isError, false, text(r));
    const db = JSON.parse(text(r));
    assert.match(db.id, /^db-[a-z0-9]{17}$/);
    assert.deepEqual([db.name, db.state, db.size_mb, db.idle_seconds, db.metadata], [name, 'running', 64, 600, { run: RUN }]);
    const got = await rest('GET', `/v1/databases/${db.id}`);
    assert.equal(got.status, 200);
    assert.deepEqual(db.connection, got.body.connection);
    const { spawnSync } = await import('node:child_process');
    const q = spawnSync('psql', ['-X', db.connection.url, '-Atc', 'select 40 + 2'], { encoding: 'utf8', timeout: 120_000 });
    assert.deepEqual([q.status, q.stdout], [0, '42\n'], q.stderr);

    r = await call(client, 'database_list', {});
    assert.equal(r.isError, false, text(r));
    const listed = JSON.parse(text(r)).databases;
    assert.deepEqual(listed.map((d) => d.id), (await rest('GET', '/v1/databases')).body.databases.map((d) => d.id));
    assert.ok(listed.some((d) => d.id === db.id && d.connection.url === db.connection.url));

    // moatd's refusals are isError results with the v1 code
    r = await call(client, 'database_create', { name });
    assert.equal(r.isError, true);
    assert.match(text(r), /^error \(already_exists\): database_create: /);
    r = await call(client, 'database_create', { name: 'Bad Name' });
    assert.equal(r.isError, true);
    assert.match(text(r), /^error \(invalid_request\): database_create: .*name/);
    // arguments outside the schema
    r = await call(client, 'database_create', {});
    assert.match(text(r), /invalid arguments: 'name' is required/);
    r = await call(client, 'database_create', { name: 'ok', size_mb: 10 });
    assert.match(text(r), /invalid arguments: 'size_mb' must be an integer from 64/);
    r = await call(client, 'database_create', { name: 'ok', idle_seconds: 0 });
    assert.match(text(r), /invalid arguments: 'idle_seconds' must be an integer from 1 to 2592000/);
    r = await call(client, 'database_create', { name: 'ok', password: 'mine' });
    assert.match(text(r), /unknown argument 'password'/);
    r = await call(client, 'database_list', { all: true });
    assert.match(text(r), /unknown argument 'all'/);
    assert.equal((await rest('GET', '/v1/databases')).body.databases.length, listed.length, 'a refused call made a database');

    r = await call(client, 'database_delete', { database_id: db.id });
    assert.equal(r.isError, false, text(r));
    assert.equal(text(r), `database ${db.id} is deleted, with its data`);
    assert.equal((await rest('GET', `/v1/databases/${db.id}`)).status, 404);
    r = await call(client, 'database_delete', { database_id: db.id });
    assert.equal(r.isError, true);
    assert.match(text(r), /^error \(not_found\): database_delete: /);
    r = await call(client, 'database_delete', { database_id: 'db-nope' });
    assert.equal(r.isError, true);
    assert.match(text(r), /^error \(not_found\): no database 'db-nope'/);
    r = await call(client, 'database_delete', {});
    assert.match(text(r), /invalid arguments: 'database_id' is required/);
    await client.close();
  },

  // database_branch: a new database with the source's rows, changed apart; errors as the v1 route answers them
  async database_branch() {
    const { client } = await connect('/v1/mcp');
    const { tools } = await client.listTools();
    const schema = tools.find((t) => t.name === 'database_branch').inputSchema;
    assert.deepEqual(schema.required, ['database_id', 'name']);
    assert.deepEqual(Object.keys(schema.properties).sort(), ['database_id', 'idle_seconds', 'metadata', 'name']);
    const { spawnSync } = await import('node:child_process');
    const sql = (url, q) => {
      const r = spawnSync('psql', ['-X', url, '-v', 'ON_ERROR_STOP=1', '-Atc', q], { encoding: 'utf8', timeout: 120_000 });
      assert.equal(r.status, 0, r.stderr);
      return r.stdout;
    };
    let r = await call(client, 'database_create', { name: RUN, size_mb: 64, metadata: { run: RUN } });
    assert.equal(r.isError, false, text(r));
    const src = JSON.parse(text(r));
    sql(src.connection.url, 'create table t (x int)');
    sql(src.connection.url, 'insert into t values (1), (2)');
    r = await call(client, 'database_branch', { database_id: src.id, name: RUN + '-b', idle_seconds: 900, metadata: { run: RUN } });
    assert.equal(r.isError, false, text(r));
    const br = JSON.parse(text(r));
    assert.match(br.id, /^db-[a-z0-9]{17}$/);
    assert.notEqual(br.id, src.id);
    assert.notEqual(br.connection.url, src.connection.url);
    assert.deepEqual([br.name, br.state, br.idle_seconds, br.metadata], [RUN + '-b', 'running', 900, { run: RUN }]);
    assert.equal(sql(br.connection.url, 'select sum(x) from t'), '3\n');
    sql(br.connection.url, 'insert into t values (10)');
    assert.equal(sql(src.connection.url, 'select sum(x) from t'), '3\n');
    assert.equal(sql(br.connection.url, 'select sum(x) from t'), '13\n');

    r = await call(client, 'database_branch', { database_id: src.id, name: RUN + '-b' });
    assert.equal(r.isError, true);
    assert.match(text(r), /^error \(already_exists\): database_branch: /);
    r = await call(client, 'database_branch', { database_id: 'db-' + 'a'.repeat(17), name: RUN + '-c' });
    assert.equal(r.isError, true);
    assert.match(text(r), /^error \(not_found\): database_branch: /);
    r = await call(client, 'database_branch', { database_id: src.id, name: 'Bad Name' });
    assert.match(text(r), /^error \(invalid_request\): database_branch: .*name/);
    r = await call(client, 'database_branch', { database_id: src.id });
    assert.match(text(r), /invalid arguments: 'name' is required/);
    r = await call(client, 'database_branch', { database_id: src.id, name: 'x', size_mb: 64 });
    assert.match(text(r), /unknown argument 'size_mb'/);
    for (const id of [br.id, src.id]) {
      r = await call(client, 'database_delete', { database_id: id });
      assert.equal(r.isError, false, text(r));
    }
    await client.close();
  },

  // protocol errors and tool argument errors as protocol 2025-11-25 says
  async errors() {
    const { client } = await connect(`/v1/sandboxes/${SANDBOX}/mcp`);
    await assert.rejects(client.callTool({ name: 'no_such_tool', arguments: {} }), (e) => {
      assert.ok(e instanceof McpError);
      assert.equal(e.code, -32602);
      assert.match(e.message, /Unknown tool: no_such_tool/);
      return true;
    });
    // 2025-11-25 (SEP-1303): input validation errors are tool execution errors
    let r = await call(client, 'shell', {});
    assert.equal(r.isError, true);
    assert.match(text(r), /invalid arguments: 'command' is required/);
    r = await call(client, 'shell', { command: 'true', timeout_ms: 'soon' });
    assert.equal(r.isError, true);
    assert.match(text(r), /'timeout_ms' must be an integer/);
    r = await call(client, 'read_file', { path: '/etc/hostname', extra: 1 });
    assert.match(text(r), /unknown argument 'extra'/);
    await assert.rejects(client.request({ method: 'resources/list', params: {} },
      (await import('@modelcontextprotocol/sdk/types.js')).ListResourcesResultSchema), (e) => {
      assert.equal(e.code, -32601);
      return true;
    });
    await client.close();
  },

  // HTTP-level refusals seen through the client: wrong key 401, unknown sandbox 404, ended session 404
  async refusals() {
    await assert.rejects(connect(`/v1/sandboxes/${SANDBOX}/mcp`, 'moat_wrong'), (e) => {
      assert.equal(e.code, 401, String(e));
      return true;
    });
    await assert.rejects(connect('/v1/sandboxes/sb-00000000000000000/mcp'), (e) => {
      assert.equal(e.code, 404, String(e));
      return true;
    });
    const { client, transport } = await connect(`/v1/sandboxes/${SANDBOX}/mcp`);
    const sid = transport.sessionId;
    await transport.terminateSession();
    // a client that keeps using an ended session gets 404
    const stale = new StreamableHTTPClientTransport(new URL(`${BASE}/v1/sandboxes/${SANDBOX}/mcp`), {
      requestInit: { headers: { Authorization: `Bearer ${KEY}` } }, sessionId: sid,
    });
    await assert.rejects(stale.send({ jsonrpc: '2.0', id: 1, method: 'ping' }), (e) => {
      assert.equal(e.code, 404, String(e));
      return true;
    });
    await client.close();
  },
};

const name = process.argv[2];
if (!scenarios[name]) {
  console.error(`unknown scenario ${name}; one of ${Object.keys(scenarios).join(' ')}`);
  process.exit(2);
}
try {
  await scenarios[name]();
  console.log(`ok ${name}`);
  process.exit(0);
} catch (e) {
  console.error(`FAIL ${name}:`, e);
  process.exit(1);
}

// kernel.js -- moat's Node.js code-context kernel: cells run in one persistent vm context
//
// Requests, one per line on stdin: {"id","code"}. Answers are framed lines "\x1e" + JSON + "\n"
// (the same messages as kernel.py: stdout, stderr, result, error, end; end also on stderr).
// console.* and process.stdout/stderr.write of user code become messages; raw writes of child
// processes on fd 1 reach the host unframed and count as stdout. The value of the last expression
// is the main result (util.inspect); a Promise is awaited. SIGINT interrupts a running cell
// (vm breakOnSigint) and is ignored between cells.
'use strict';
const vm = require('vm');
const util = require('util');
const readline = require('readline');

const realOut = process.stdout.write.bind(process.stdout);
const realErr = process.stderr.write.bind(process.stderr);
let curId = null;
let count = 0;

function send(msg, both) {
  const line = '\x1e' + JSON.stringify(msg) + '\n';
  if (both) realErr(line);
  realOut(line);
}
function out(kind, text) {
  if (text) send({ id: curId, type: kind, text: String(text) });
}
process.stdout.write = (chunk, enc, cb) => { out('stdout', Buffer.isBuffer(chunk) ? chunk.toString() : chunk); if (typeof enc === 'function') enc(); else if (cb) cb(); return true; };
process.stderr.write = (chunk, enc, cb) => { out('stderr', Buffer.isBuffer(chunk) ? chunk.toString() : chunk); if (typeof enc === 'function') enc(); else if (cb) cb(); return true; };
process.on('SIGINT', () => {});

const sandbox = { require, process, Buffer, console, setTimeout, clearTimeout, setInterval, clearInterval,
  setImmediate, clearImmediate, queueMicrotask, URL, URLSearchParams, TextEncoder, TextDecoder };
sandbox.global = sandbox;
sandbox.globalThis = sandbox;
const ctx = vm.createContext(sandbox);

function errorMsg(e) {
  let name = 'Error', value = String(e), tb = [];
  if (e && typeof e === 'object') {
    name = e.name || (e.constructor && e.constructor.name) || 'Error';
    value = e.message !== undefined ? String(e.message) : String(e);
    if (typeof e.stack === 'string') tb = e.stack.split('\n').filter((l) => !l.includes(__filename) && !l.includes('node:vm'));
    if (/interrupted by .?SIGINT/.test(value)) name = 'KeyboardInterrupt';
  }
  send({ id: curId, type: 'error', name, value, traceback: tb });
}

async function run(code) {
  count++;
  try {
    let v = vm.runInContext(code, ctx, { filename: '<cell-' + count + '>', breakOnSigint: true });
    if (v && typeof v.then === 'function') v = await v;
    if (v !== undefined) {
      const data = { 'text/plain': util.inspect(v, { colors: false, depth: 4 }) };
      if (v !== null && typeof v === 'object') {
        try { data['application/json'] = JSON.parse(JSON.stringify(v)); } catch (e) { /* not JSON */ }
      }
      send({ id: curId, type: 'result', is_main_result: true, data });
    }
  } catch (e) {
    errorMsg(e);
  }
  send({ id: curId, type: 'end', execution_count: count }, true);
}

if (process.argv[2]) process.chdir(process.argv[2]);
const rl = readline.createInterface({ input: process.stdin, terminal: false });
let queue = Promise.resolve();
rl.on('line', (line) => {
  if (!line.trim()) return;
  let req;
  try { req = JSON.parse(line); } catch (e) { send({ id: null, type: 'error', name: 'ProtocolError', value: String(e), traceback: [] }); return; }
  // Optional "env": {name: value} for this cell only (E2B's runCode envs).
  const env = req.env && typeof req.env === 'object' ? req.env : {};
  queue = queue.then(async () => {
    curId = req.id;
    const saved = {};
    for (const k of Object.keys(env)) { saved[k] = process.env[k]; process.env[k] = String(env[k]); }
    try {
      return await run(String(req.code));
    } finally {
      for (const k of Object.keys(saved)) { if (saved[k] === undefined) delete process.env[k]; else process.env[k] = saved[k]; }
    }
  });
});

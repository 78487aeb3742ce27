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

// import() from the kernel itself (the main context), resolved from the cell's cwd: the ESM
// imports and top-level await of a cell are rewritten to use it.
const { createRequire } = require('module');
const { pathToFileURL } = require('url');
sandbox.__moat_import = (spec) => {
  if (spec.startsWith('node:') || require('module').builtinModules.includes(spec)) return import(spec);
  let target = spec;
  try { target = pathToFileURL(createRequire(process.cwd() + '/').resolve(spec)).href; } catch (e) { /* import() says why */ }
  return import(target);
};

// Top-level statements of a cell: [start, end) offsets, split at newlines and semicolons outside
// brackets, strings, template literals and comments.
function statements(code) {
  const out = [];
  let depth = 0, start = 0, i = 0;
  const cut = (end) => { if (code.slice(start, end).trim()) out.push([start, end]); start = end + 1; };
  while (i < code.length) {
    const c = code[i];
    if (c === '/' && code[i + 1] === '/') { while (i < code.length && code[i] !== '\n') i++; continue; }
    if (c === '/' && code[i + 1] === '*') { const j = code.indexOf('*/', i + 2); i = j < 0 ? code.length : j + 2; continue; }
    if (c === '"' || c === "'" || c === '`') {
      i++;
      while (i < code.length && code[i] !== c) { if (code[i] === '\\') i++; i++; }
      i++;
      continue;
    }
    if ('([{'.includes(c)) depth++;
    else if (')]}'.includes(c)) depth--;
    else if (depth === 0 && (c === ';' || c === '\n')) {
      // a line that continues the statement (operator or dot at either side) is not a cut
      const before = code.slice(start, i).trimEnd(), after = code.slice(i + 1).trimStart();
      if (c === ';' || !(/[-+*/%&|^<>=,.?:!]$/.test(before) || /^[-+*/%&|^<>=,.?:)\]}]/.test(after))) { cut(i); }
    }
    i++;
  }
  cut(code.length);
  return out;
}

const IMPORT_RE = /^import\s+(?:(\*\s+as\s+[\w$]+)|([\w$]+)?\s*,?\s*(\{[^}]*\})?)\s*(?:from\s*)?(['"][^'"]+['"])\s*$/;

// One top-level statement rewritten for the async wrapper: an import becomes assignments from
// __moat_import; a const/let/var/function/class declaration becomes a global of the context (so
// later cells see it, as they see the names of a plain cell).
function rewrite(st, names) {
  const m = IMPORT_RE.exec(st.replace(/\s+/g, ' ').trim());
  if (m) {
    const mod = `(await __moat_import(${m[4]}))`;
    if (m[1]) return `globalThis.${m[1].split(/\s+/).pop()} = ${mod}`;
    const parts = [];
    parts.push(`const __m = ${mod}`);
    if (m[2]) parts.push(`globalThis.${m[2]} = __m.default !== undefined ? __m.default : __m`);
    if (m[3]) {
      for (const item of m[3].slice(1, -1).split(',').map((x) => x.trim()).filter(Boolean)) {
        const [from, to] = item.split(/\s+as\s+/);
        parts.push(`globalThis.${(to || from).trim()} = __m[${JSON.stringify(from.trim())}]`);
      }
    }
    return '{ ' + parts.join('; ') + ' }';
  }
  const d = /^(const|let|var)\s+([\w$]+)\s*=/.exec(st);
  if (d) return `globalThis.${d[2]} =` + st.slice(d[0].length);
  const f = /^(?:async\s+)?(?:function\s*\*?|class)\s+([\w$]+)/.exec(st);
  if (f) names.push(f[1]);
  return st;
}

const STMT_KW = /^(const|let|var|function|async\s+function|class|if|for|while|do|try|switch|return|throw|import|export|break|continue)\b|^[{};]/;

// A cell with ESM imports or top-level await, as an async function: the value of its last
// statement, when that is an expression, is returned. Null when the cell needs no rewriting.
function asyncCell(code) {
  const hasImport = /^\s*import\s+[\w${*'"]/m.test(code);
  if (!hasImport && !/\bawait\b/.test(code)) return null;
  if (!hasImport) {
    try { new vm.Script(code); return null; } catch (e) { /* needs the wrapper */ }
  }
  const stmts = statements(code).map(([a, b]) => code.slice(a, b).trim());
  const names = [];
  const body = stmts.map((st, i) => {
    const r = rewrite(st, names);
    return i === stmts.length - 1 && !STMT_KW.test(st) ? `return (${r.replace(/;\s*$/, '')})` : r;
  });
  const tail = names.map((n) => `globalThis.${n} = ${n};`).join(' ');
  if (tail) {
    const last = body.length - 1;
    if (last >= 0 && body[last].startsWith('return (')) body[last] = `{ const __v = ${body[last].slice(7)}; ${tail} return __v }`;
    else body.push(tail);
  }
  return '(async () => {\n' + body.join(';\n') + '\n})()';
}

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
    const wrapped = asyncCell(code);
    let v = vm.runInContext(wrapped || code, ctx, { filename: '<cell-' + count + '>', breakOnSigint: true });
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

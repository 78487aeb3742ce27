// templates.js -- #/templates: the templates the org can create from (moatd's own and the org's), a
// build from a Dockerfile (admin and member keys) with its log followed live, and #/templates/NAME: a
// template's fields, its last build's log and, for the org's own, Delete and a sandbox made from it.
import { api, h, showError, fmtTime, fmtBytes, ApiError } from './api.js';
import { readEvents } from './sse.js';

const POLL_MS = 3000;
const NAME_RE = '[a-z0-9][a-z0-9._\\-]{0,62}';
const enc = (s) => encodeURIComponent(s);

// A ustar archive of [{name, bytes}] (regular files, mode 0644): the build context POST
// /v1/templates/{name} takes. Names longer than 100 bytes go into the prefix field at a '/'.
export function tarOf(files) {
  const te = new TextEncoder();
  const blocks = [];
  let total = 0;
  const put = (hdr, off, len, s) => {
    const b = te.encode(s);
    if (b.length > len) throw new Error(`tar: ${s} does not fit`);
    hdr.set(b, off);
  };
  const octal = (n, len) => n.toString(8).padStart(len - 1, '0');
  for (const f of files) {
    let name = te.encode(f.name);
    let prefix = '';
    if (name.length > 100) {
      const i = f.name.lastIndexOf('/', 155);
      if (i <= 0 || te.encode(f.name.slice(i + 1)).length > 100) throw new Error(`the file name ${f.name} is too long for the context`);
      prefix = f.name.slice(0, i);
      name = te.encode(f.name.slice(i + 1));
    }
    const hdr = new Uint8Array(512);
    hdr.set(name, 0);
    put(hdr, 100, 8, octal(0o644, 8));
    put(hdr, 108, 8, octal(0, 8));
    put(hdr, 116, 8, octal(0, 8));
    put(hdr, 124, 12, octal(f.bytes.length, 12));
    put(hdr, 136, 12, octal(Math.floor(Date.now() / 1000), 12));
    hdr.fill(0x20, 148, 156);
    hdr[156] = 0x30; // '0': a regular file
    put(hdr, 257, 6, 'ustar');
    put(hdr, 263, 2, '00');
    put(hdr, 345, 155, prefix);
    let sum = 0;
    for (const b of hdr) sum += b;
    put(hdr, 148, 8, `${sum.toString(8).padStart(6, '0')}\0 `);
    const pad = (512 - (f.bytes.length % 512)) % 512;
    blocks.push(hdr, f.bytes, new Uint8Array(pad));
    total += 512 + f.bytes.length + pad;
  }
  blocks.push(new Uint8Array(1024));
  total += 1024;
  const out = new Uint8Array(total);
  let off = 0;
  for (const b of blocks) {
    out.set(b, off);
    off += b.length;
  }
  return out;
}

// POST of raw bytes (the api() helper sends JSON): the parsed answer, or an ApiError with the API's
// {code, message}.
async function postBytes(path, bytes, type) {
  const res = await fetch(path, { method: 'POST', credentials: 'same-origin', body: bytes,
    headers: { 'X-Moat-UI': '1', 'Content-Type': type } });
  let data = null;
  try {
    data = await res.json();
  } catch (e) {
    data = null;
  }
  if (!res.ok) throw new ApiError(res.status, data && data.code, data && data.message ? data.message : `HTTP ${res.status}`);
  return data;
}

// A build log view: lines grouped under their step's instruction, each line carrying its step and
// stream (data-step, data-stream) for whoever reads the page.
function logView(id) {
  const box = h('div', { class: 'logs build-log', id, role: 'log', 'aria-live': 'polite', tabindex: 0 });
  let step = null;
  return {
    el: box,
    clear() { box.replaceChildren(); step = null; },
    add(rec) {
      if (rec.step !== step) {
        step = rec.step;
        box.append(h('div', { class: 'step-head' }, `step ${rec.step}`));
      }
      const atEnd = box.scrollTop + box.clientHeight >= box.scrollHeight - 4;
      box.append(h('div', { class: `line stream-${rec.stream}`, dataset: { step: String(rec.step), stream: rec.stream } }, rec.text));
      if (atEnd) box.scrollTop = box.scrollHeight;
    },
  };
}

// Follows a build's log into view: resolves to the end record (state ready|failed, error), or null
// when the stream ended (or was aborted) before it.
async function followBuild(name, buildId, view, signal, follow = true) {
  let end = null;
  await readEvents(`/v1/templates/${enc(name)}/builds/${enc(buildId)}/logs${follow ? '?follow=true' : ''}`, (ev) => {
    if (ev.name === 'log') view.add(ev.data);
    else if (ev.name === 'end') end = ev.data;
    else if (ev.name === 'error') throw new ApiError(0, ev.data && ev.data.code, (ev.data && ev.data.message) || String(ev.data));
  }, signal);
  return end;
}

// moatd's own templates carry no usable: one is usable once it is ready
const usable = (t) => (t.usable !== undefined ? t.usable : t.state === 'ready');
const stateBadge = (s) => h('span', { class: `state state-${s}` }, s);

export function templatesPage(root, me) {
  const canWrite = me.role !== 'readonly';
  const abort = new AbortController();
  let stopped = false;
  const cols = ['Name', 'Source', 'State', 'Usable', 'Size', 'Updated', 'Error'];
  const tbody = h('tbody', { id: 'rows' });
  const table = h('table', { class: 'list', id: 'list-templates' },
    h('thead', {}, h('tr', {}, cols.map((t) => h('th', { scope: 'col' }, t)))), tbody);

  const name = h('input', { id: 'tpl-name', required: true, placeholder: 'my-template', size: 20, pattern: NAME_RE,
    autocomplete: 'off', 'aria-describedby': 'tpl-name-help' });
  const dockerfile = h('textarea', { id: 'tpl-dockerfile', required: true, rows: 6, spellcheck: 'false', class: 'mono' });
  dockerfile.value = 'FROM base\nRUN echo hello > /hello.txt\n';
  const files = h('input', { id: 'tpl-files', type: 'file', multiple: true });
  const buildBtn = h('button', { type: 'submit', id: 'tpl-build' }, 'Build');
  const form = h('form', { class: 'tpl-form', id: 'tpl-form' },
    h('h2', {}, 'Build from a Dockerfile'),
    h('div', { class: 'toolbar' }, h('label', { for: 'tpl-name' }, 'Name'), name,
      h('span', { class: 'status', id: 'tpl-name-help' }, 'a–z, 0–9, . _ -')),
    h('label', { for: 'tpl-dockerfile' }, 'Dockerfile'), dockerfile,
    h('div', { class: 'toolbar' }, h('label', { for: 'tpl-files' }, 'Context files (optional)'), files),
    h('div', { class: 'toolbar' }, buildBtn));
  // Enter in the name field submits; in the textarea it is a new line (Ctrl+Enter submits)
  dockerfile.addEventListener('keydown', (ev) => {
    if (ev.key === 'Enter' && (ev.ctrlKey || ev.metaKey)) {
      ev.preventDefault();
      form.requestSubmit();
    }
  });

  const state = h('span', { id: 'tpl-build-state', class: 'state', role: 'status' });
  const elapsed = h('span', { id: 'tpl-build-elapsed', class: 'status' });
  const heading = h('h2', {}, 'Build');
  const view = logView('tpl-build-log');
  const panel = h('section', { id: 'tpl-build-panel', class: 'build-panel', hidden: true, 'aria-label': 'Build log' },
    heading, h('div', { class: 'toolbar' }, state, elapsed), view.el);

  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    showError(null);
    buildBtn.disabled = true;
    let tick = null;
    const started = Date.now();
    const setState = (s) => {
      state.textContent = s;
      state.className = `state state-${s}`;
      panel.dataset.state = s;
    };
    try {
      const ctx = [];
      for (const f of files.files) {
        if (f.name === 'Dockerfile') throw new Error('a context file is named Dockerfile: the text above is the Dockerfile');
        ctx.push({ name: f.name, bytes: new Uint8Array(await f.arrayBuffer()) });
      }
      ctx.unshift({ name: 'Dockerfile', bytes: new TextEncoder().encode(dockerfile.value) });
      const tname = name.value;
      const t = await postBytes(`/v1/templates/${enc(tname)}`, tarOf(ctx), 'application/x-tar');
      view.clear();
      heading.textContent = `Build of ${t.name}`;
      panel.dataset.template = t.name;
      panel.dataset.build = t.build_id;
      panel.hidden = false;
      setState(t.state || 'building');
      const show = () => { elapsed.textContent = `${Math.round((Date.now() - started) / 1000)} s`; };
      show();
      tick = setInterval(show, 500);
      load();
      const end = await followBuild(t.name, t.build_id, view, abort.signal);
      if (stopped) return;
      show();
      if (!end) {
        setState('unknown');
        showError(new Error(`the log of build ${t.build_id} ended before the build did`));
      } else {
        setState(end.state);
        if (end.state === 'failed') showError(new Error(end.error || 'the build failed'));
      }
      await load();
    } catch (e) {
      if (!stopped) showError(e);
    } finally {
      clearInterval(tick);
      buildBtn.disabled = false;
    }
  });

  root.replaceChildren(h('h1', {}, 'Templates'), canWrite ? form : null, panel, h('div', { class: 'scroll' }, table));

  // while a template builds (from here or elsewhere) the list is read again every 3 s
  let timer = null;
  async function load() {
    clearTimeout(timer);
    try {
      const res = await api('GET', '/v1/templates');
      if (stopped) return;
      const items = res.templates || [];
      const rows = items.map((t) => h('tr', { dataset: { id: t.name, state: t.state } },
        h('td', {}, h('a', { href: `#/templates/${enc(t.name)}`, class: 'tpl-link' }, t.name)),
        h('td', {}, t.source || ''), h('td', {}, stateBadge(t.state)), h('td', {}, usable(t) ? 'yes' : 'no'),
        h('td', {}, fmtBytes(t.size_bytes)), h('td', {}, fmtTime(t.updated_at || t.built_at)),
        h('td', { class: 'meta' }, t.error ? t.error.split('\n')[0] : '')));
      tbody.replaceChildren(...(rows.length ? rows : [h('tr', {}, h('td', { colspan: cols.length, class: 'empty' }, 'None.'))]));
      table.dataset.loaded = '1';
      if (items.some((t) => t.state === 'building')) timer = setTimeout(load, POLL_MS);
    } catch (e) {
      showError(e);
      table.dataset.loaded = 'error';
    }
  }
  load();
  return { stop() { stopped = true; clearTimeout(timer); abort.abort(); } };
}

// #/templates/NAME
export function templatePage(root, me, name) {
  const canWrite = me.role !== 'readonly';
  const abort = new AbortController();
  let stopped = false;
  const dl = h('dl', { id: 'tpl-details', class: 'details' });
  const actions = h('div', { class: 'actions', id: 'tpl-actions' });
  const status = h('span', { class: 'status', role: 'status', 'aria-live': 'polite', id: 'tpl-status' });
  const view = logView('tpl-log');
  const logSection = h('section', { id: 'tpl-log-section', hidden: true }, h('h2', {}, 'Last build'), view.el);
  root.replaceChildren(h('p', {}, h('a', { href: '#/templates' }, '← Templates')), h('h1', {}, `Template ${name}`),
    dl, h('div', { class: 'toolbar' }, actions, status), logSection);

  async function remove(btn) {
    btn.disabled = true;
    showError(null);
    status.textContent = `deleting ${name}…`;
    try {
      await api('DELETE', `/v1/templates/${enc(name)}`);
      status.textContent = `deleted ${name}`;
      location.hash = '#/templates';
    } catch (e) {
      status.textContent = '';
      showError(e);
      btn.disabled = false;
    }
  }

  async function newSandbox(btn) {
    btn.disabled = true;
    showError(null);
    status.textContent = `creating a sandbox from ${name}…`;
    try {
      const sb = await api('POST', '/v1/sandboxes', { template: name, metadata: { created_by: 'dashboard' } });
      status.dataset.sandbox = sb.id;
      location.hash = `#/sandboxes/${enc(sb.id)}`;
    } catch (e) {
      status.textContent = '';
      showError(e);
      btn.disabled = false;
    }
  }

  function render(t) {
    const cfg = t.config || {};
    const facts = [['name', t.name], ['source', t.source || '—'], ['state', t.state], ['usable', usable(t) ? 'yes' : 'no'],
      ['from', t.from || '—'], ['size', fmtBytes(t.size_bytes)], ['built', fmtTime(t.built_at)], ['created', fmtTime(t.created_at)],
      ['updated', fmtTime(t.updated_at)], ['build', t.build_id || '—'], ['workdir', cfg.workdir || '—'], ['user', cfg.user || '—'],
      ['start', (cfg.start || []).join(' ') || '—'], ['env', (cfg.env || []).join(' ') || '—'],
      ['exposed', (cfg.exposed || []).join(' ') || '—']];
    dl.replaceChildren(...facts.filter(([k]) => k !== 'built' || t.built_at !== undefined).flatMap(([k, v]) => [h('dt', {}, k), h('dd', { dataset: { fact: k } }, String(v))]));
    if (t.error) dl.append(h('dt', {}, 'error'), h('dd', { dataset: { fact: 'error' } }, h('pre', { class: 'tpl-error' }, t.error)));
    dl.dataset.state = t.state;
    const own = t.source && t.source !== 'builtin';
    actions.replaceChildren(
      canWrite && usable(t)
        ? h('button', { type: 'button', id: 'tpl-new-sandbox', onclick: (ev) => newSandbox(ev.currentTarget) }, 'New sandbox') : null,
      canWrite && own ? h('button', { type: 'button', class: 'danger', id: 'tpl-delete', 'aria-label': `Delete ${t.name}`,
        onclick: (ev) => remove(ev.currentTarget) }, 'Delete') : null);
  }

  (async () => {
    try {
      const t = await api('GET', `/v1/templates/${enc(name)}`);
      if (stopped) return;
      render(t);
      dl.dataset.loaded = '1';
      if (t.build_id) {
        logSection.hidden = false;
        const building = t.state === 'building';
        const end = await followBuild(name, t.build_id, view, abort.signal, building);
        if (stopped) return;
        view.el.dataset.loaded = '1';
        if (building && end) render(await api('GET', `/v1/templates/${enc(name)}`));
      }
    } catch (e) {
      if (stopped) return;
      showError(e);
      if (!dl.dataset.loaded) dl.dataset.loaded = 'error';
      view.el.dataset.loaded = 'error';
    }
  })();
  return { stop() { stopped = true; abort.abort(); } };
}

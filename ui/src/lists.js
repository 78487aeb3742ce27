// lists.js -- the navigation's pages and the read-mostly ones among them: snapshots, volumes, API keys,
// audit. Each is one table of what its GET returns; audit pages on with the API's cursor. An entry
// with page: true has its own module (templates.js).
import { api, h, showError, fmtTime, fmtBytes } from './api.js';

const meta = (m) => Object.entries(m || {}).map(([k, v]) => `${k}=${v}`).join(' ');
const sandboxLink = (id) => (id ? h('a', { href: `#/sandboxes/${id}`, class: 'mono' }, id) : '—');

export const PAGES = {
  // its own page (build, detail, delete): templates.js; listed here for the navigation
  templates: { title: 'Templates', page: true },
  snapshots: {
    title: 'Snapshots', path: '/v1/snapshots', key: 'snapshots', id: (s) => s.id,
    cols: [['ID', (s) => h('span', { class: 'mono' }, s.id)], ['Sandbox', (s) => sandboxLink(s.sandbox_id)],
      ['Template', (s) => s.template], ['Created', (s) => fmtTime(s.created_at)],
      ['Memory', (s) => fmtBytes(s.memory_bytes)], ['Disk', (s) => fmtBytes(s.disk_bytes)], ['Metadata', (s) => meta(s.metadata)]],
  },
  volumes: {
    title: 'Volumes', path: '/v1/volumes', key: 'volumes', id: (v) => v.name,
    cols: [['Name', (v) => v.name], ['Size', (v) => `${v.size_mb} MiB`], ['Used', (v) => fmtBytes(v.used_bytes)],
      ['Created', (v) => fmtTime(v.created_at)], ['Attached', (v) => (v.attached || []).map((a) => a.sandbox_id || a).join(' ')]],
  },
  keys: {
    title: 'API keys', path: '/v1/keys', key: 'keys', id: (k) => k.id, admin: true,
    cols: [['ID', (k) => h('span', { class: 'mono' }, k.id)], ['Name', (k) => k.name], ['Role', (k) => k.role],
      ['Created', (k) => fmtTime(k.created_at)], ['Expires', (k) => (k.expires_at ? fmtTime(k.expires_at) : 'never')],
      ['Last used', (k) => fmtTime(k.last_used_at)]],
  },
  audit: {
    title: 'Audit', path: '/v1/audit?limit=100', key: 'entries', id: (e) => String(e.seq), cursor: true,
    cols: [['Time', (e) => fmtTime(e.at)], ['Key', (e) => h('span', { class: 'mono' }, e.key_id)],
      ['Request', (e) => `${e.method} ${e.path}`], ['Route', (e) => e.route], ['Target', (e) => e.target || ''],
      ['Status', (e) => e.status]],
  },
};

export function listPage(root, me, name) {
  const def = PAGES[name];
  const tbody = h('tbody', { id: 'rows' });
  const more = h('button', { type: 'button', id: 'more', hidden: true }, 'Load more');
  const table = h('table', { class: 'list', id: `list-${name}` },
    h('thead', {}, h('tr', {}, def.cols.map(([t]) => h('th', { scope: 'col' }, t)))), tbody);
  root.replaceChildren(h('h1', {}, def.title), h('div', { class: 'scroll' }, table), more);
  let next = null;
  let stopped = false;
  async function load(append) {
    try {
      const sep = def.path.includes('?') ? '&' : '?';
      const res = await api('GET', append && next ? `${def.path}${sep}cursor=${encodeURIComponent(next)}` : def.path);
      if (stopped) return;
      const items = res[def.key] || [];
      const rows = items.map((it) => h('tr', { dataset: { id: def.id(it) } }, def.cols.map(([, f]) => h('td', {}, f(it)))));
      if (append) tbody.append(...rows);
      else tbody.replaceChildren(...(rows.length ? rows : [h('tr', {}, h('td', { colspan: def.cols.length, class: 'empty' }, 'None.'))]));
      next = def.cursor ? res.next : null;
      more.hidden = !next;
      table.dataset.loaded = '1';
    } catch (e) {
      showError(e);
      table.dataset.loaded = 'error';
    }
  }
  more.addEventListener('click', () => load(true));
  load(false);
  return { stop() { stopped = true; } };
}

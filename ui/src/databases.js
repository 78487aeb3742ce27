// databases.js -- #/databases: the org's PostgreSQL databases (list, create, delete), refreshed every
// 3 s. The connection URL is shown as the API gives it: with its password to admin and member keys; a
// readonly key's reads carry none, and the page then shows no URL.
import { api, h, showError, fmtTime } from './api.js';

const POLL_MS = 3000;

export function databasesPage(root, me) {
  const canWrite = me.role !== 'readonly';
  let timer = null;
  let stopped = false;
  const status = h('span', { class: 'status', role: 'status', 'aria-live': 'polite' });
  const tbody = h('tbody', { id: 'rows' });
  const cols = ['Name', 'ID', 'State', 'Size', 'Connections', 'Created', 'Connection URL', ''];
  const table = h('table', { class: 'list', id: 'list-databases' },
    h('thead', {}, h('tr', {}, cols.map((t) => h('th', { scope: 'col' }, t)))), tbody);
  const name = h('input', { id: 'db-name', 'aria-label': 'Database name', placeholder: 'name', size: 16,
    pattern: '[a-z0-9][a-z0-9_\\-]{0,62}' });
  const size = h('input', { id: 'db-size', 'aria-label': 'Size (MiB)', type: 'number', min: 64, value: 256, size: 6 });
  const createBtn = h('button', { type: 'submit', id: 'db-create' }, 'Create database');
  const form = h('form', { class: 'toolbar', id: 'db-form' },
    h('label', { for: 'db-name' }, 'Name'), name, h('label', { for: 'db-size' }, 'MiB'), size, createBtn);
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    createBtn.disabled = true;
    showError(null);
    const started = Date.now();
    const tick = setInterval(() => { status.textContent = `creating ${name.value}… ${Math.round((Date.now() - started) / 1000)} s`; }, 500);
    status.textContent = `creating ${name.value}…`;
    try {
      const db = await api('POST', '/v1/databases', { name: name.value, size_mb: Number(size.value) });
      status.textContent = `created ${db.name}`;
      status.dataset.database = db.id;
      name.value = '';
      await refresh();
    } catch (e) {
      status.textContent = '';
      showError(e);
    } finally {
      clearInterval(tick);
      createBtn.disabled = false;
    }
  });
  root.replaceChildren(h('h1', {}, 'Databases'), canWrite ? form : null, h('div', { class: 'toolbar' }, status),
    h('div', { class: 'scroll' }, table));

  async function remove(db, btn) {
    btn.disabled = true;
    showError(null);
    status.textContent = `deleting ${db.name}…`;
    try {
      await api('DELETE', `/v1/databases/${encodeURIComponent(db.id)}`);
      status.textContent = `deleted ${db.name}`;
      await refresh();
    } catch (e) {
      status.textContent = '';
      showError(e);
      btn.disabled = false;
    }
  }

  function row(db) {
    const url = db.connection && db.connection.password ? db.connection.url : null;
    return h('tr', { dataset: { id: db.id, name: db.name, state: db.state } },
      h('td', {}, db.name),
      h('td', {}, h('span', { class: 'mono' }, db.id)),
      h('td', {}, h('span', { class: `state state-${db.state}` }, db.state)),
      h('td', {}, `${db.size_mb} MiB`),
      h('td', {}, db.connections ?? 0),
      h('td', {}, fmtTime(db.created_at)),
      h('td', { class: 'mono url' }, url ? h('code', { class: 'db-url' }, url) : '—'),
      h('td', {}, canWrite && db.state !== 'deleting'
        ? h('button', { type: 'button', class: 'danger delete', 'aria-label': `Delete ${db.name}`, onclick: (ev) => remove(db, ev.currentTarget) }, 'Delete')
        : null));
  }

  async function refresh() {
    clearTimeout(timer);
    try {
      const res = await api('GET', '/v1/databases');
      if (stopped) return;
      const list = res.databases || [];
      tbody.replaceChildren(...(list.length ? list.map(row) : [h('tr', {}, h('td', { colspan: cols.length, class: 'empty' }, 'No databases.'))]));
      table.dataset.loaded = '1';
    } catch (e) {
      showError(e);
      table.dataset.loaded = 'error';
    }
    if (!stopped) timer = setTimeout(refresh, POLL_MS);
  }
  refresh();
  return { stop() { stopped = true; clearTimeout(timer); } };
}

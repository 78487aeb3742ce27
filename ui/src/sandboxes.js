// sandboxes.js -- #/sandboxes: the org's sandboxes by state, refreshed every 2 s; create and kill.
import { api, h, showError, fmtTime } from './api.js';

const STATES = ['', 'running', 'paused', 'hibernated', 'creating', 'killed'];
const POLL_MS = 2000;

export function sandboxesPage(root, me) {
  const canWrite = me.role !== 'readonly';
  let filter = sessionStorage.getItem('moat.filter') || '';
  let timer = null;
  let stopped = false;

  const select = h('select', { id: 'state-filter', 'aria-label': 'State' },
    STATES.map((s) => h('option', { value: s, selected: s === filter }, s || 'all live')));
  select.addEventListener('change', () => {
    filter = select.value;
    sessionStorage.setItem('moat.filter', filter);
    refresh();
  });
  const template = h('select', { id: 'create-template', 'aria-label': 'Template' }, h('option', { value: 'base' }, 'base'));
  const createBtn = h('button', { id: 'create', type: 'button' }, 'Create sandbox');
  createBtn.addEventListener('click', async () => {
    createBtn.disabled = true;
    showError(null);
    try {
      const sb = await api('POST', '/v1/sandboxes', { template: template.value, metadata: { created_by: 'dashboard' } });
      status.textContent = `created ${sb.id}`;
      await refresh();
    } catch (e) {
      showError(e);
    } finally {
      createBtn.disabled = false;
    }
  });
  const status = h('span', { class: 'status', role: 'status', 'aria-live': 'polite' });
  const tbody = h('tbody', { id: 'sandbox-rows' });
  const table = h('table', { class: 'list', id: 'sandboxes' },
    h('thead', {}, h('tr', {}, ['ID', 'Template', 'State', 'Created', 'CPU', 'Memory', 'Metadata', ''].map((t) => h('th', { scope: 'col' }, t)))),
    tbody);
  root.replaceChildren(
    h('h1', {}, 'Sandboxes'),
    h('div', { class: 'toolbar' },
      h('label', { for: 'state-filter' }, 'State'), select,
      canWrite ? [h('label', { for: 'create-template' }, 'Template'), template, createBtn] : null,
      status),
    h('div', { class: 'scroll' }, table));

  if (canWrite) {
    api('GET', '/v1/templates').then((t) => {
      const names = (t.templates || []).filter((x) => x.usable !== false).map((x) => x.name);
      if (names.length) template.replaceChildren(...names.map((n) => h('option', { value: n, selected: n === 'base' }, n)));
    }).catch(() => {});
  }

  async function kill(id, btn) {
    btn.disabled = true;
    showError(null);
    try {
      await api('DELETE', `/v1/sandboxes/${encodeURIComponent(id)}`);
      status.textContent = `killed ${id}`;
      await refresh();
    } catch (e) {
      showError(e);
      btn.disabled = false;
    }
  }

  function row(sb) {
    const meta = Object.entries(sb.metadata || {}).map(([k, v]) => `${k}=${v}`).join(' ');
    const killBtn = canWrite && sb.state !== 'killed'
      ? h('button', { type: 'button', class: 'danger kill', 'aria-label': `Kill ${sb.id}`, onclick: (ev) => kill(sb.id, ev.currentTarget) }, 'Kill')
      : null;
    return h('tr', { dataset: { id: sb.id, state: sb.state } },
      h('td', {}, h('a', { href: `#/sandboxes/${sb.id}`, class: 'mono' }, sb.id)),
      h('td', {}, sb.template),
      h('td', {}, h('span', { class: `state state-${sb.state}` }, sb.state)),
      h('td', {}, fmtTime(sb.created_at)),
      h('td', {}, sb.cpu),
      h('td', {}, `${sb.memory_mb} MiB`),
      h('td', { class: 'meta' }, meta),
      h('td', {}, killBtn));
  }

  async function refresh() {
    clearTimeout(timer);
    try {
      const q = filter ? `?state=${encodeURIComponent(filter)}` : '';
      const res = await api('GET', `/v1/sandboxes${q}`);
      if (stopped) return;
      const list = res.sandboxes || [];
      tbody.replaceChildren(...(list.length ? list.map(row) : [h('tr', {}, h('td', { colspan: 8, class: 'empty' }, 'No sandboxes.'))]));
      table.dataset.loaded = '1';
    } catch (e) {
      showError(e);
    }
    if (!stopped) timer = setTimeout(refresh, POLL_MS);
  }
  refresh();
  return { stop() { stopped = true; clearTimeout(timer); } };
}

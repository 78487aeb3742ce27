// sandboxes.js -- #/sandboxes: the org's sandboxes by state, template and metadata, refreshed every 2 s;
// create, kill, and kill the selected ones.
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
  const meta = h('input', { id: 'meta-filter', 'aria-label': 'Metadata filter', placeholder: 'key=value', size: 18 });
  meta.addEventListener('change', () => refresh());
  const tplFilter = h('select', { id: 'template-filter', 'aria-label': 'Template filter' }, h('option', { value: '' }, 'any template'));
  tplFilter.addEventListener('change', () => refresh());
  const selected = new Set();
  const bulk = h('button', { type: 'button', id: 'kill-selected', class: 'danger', disabled: true }, 'Kill selected');
  const syncBulk = () => {
    bulk.disabled = selected.size === 0;
    bulk.textContent = selected.size ? `Kill selected (${selected.size})` : 'Kill selected';
  };
  bulk.addEventListener('click', async () => {
    const ids = [...selected];
    bulk.disabled = true;
    showError(null);
    let done = 0;
    const failed = [];
    for (const id of ids) {
      status.textContent = `killing ${done + 1} of ${ids.length}…`;
      try {
        await api('DELETE', `/v1/sandboxes/${encodeURIComponent(id)}`);
        selected.delete(id);
      } catch (e) {
        failed.push(`${id}: ${e.message}`);
      }
      done++;
    }
    status.textContent = `killed ${ids.length - failed.length} of ${ids.length}`;
    if (failed.length) showError(new Error(failed.join('; ')));
    syncBulk();
    await refresh();
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
    h('thead', {}, h('tr', {}, [canWrite ? 'Select' : '', 'ID', 'Template', 'State', 'Created', 'CPU', 'Memory', 'Metadata', ''].map((t) => h('th', { scope: 'col' }, t)))),
    tbody);
  root.replaceChildren(
    h('h1', {}, 'Sandboxes'),
    h('div', { class: 'toolbar' },
      h('label', { for: 'state-filter' }, 'State'), select,
      h('label', { for: 'template-filter' }, 'Template'), tplFilter,
      h('label', { for: 'meta-filter' }, 'Metadata'), meta),
    canWrite ? h('div', { class: 'toolbar' },
      h('label', { for: 'create-template' }, 'New from'), template, createBtn, bulk) : null,
    h('div', { class: 'toolbar' }, status),
    h('div', { class: 'scroll' }, table));

  api('GET', '/v1/templates').then((t) => {
    const all = (t.templates || []).map((x) => x.name);
    tplFilter.append(...all.map((n) => h('option', { value: n }, n)));
    const names = (t.templates || []).filter((x) => x.usable !== false).map((x) => x.name);
    if (names.length) template.replaceChildren(...names.map((n) => h('option', { value: n, selected: n === 'base' }, n)));
  }).catch(() => {});

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
    const box = canWrite && sb.state !== 'killed'
      ? h('input', { type: 'checkbox', class: 'select', 'aria-label': `Select ${sb.id}`, checked: selected.has(sb.id),
        onchange: (ev) => { if (ev.currentTarget.checked) selected.add(sb.id); else selected.delete(sb.id); syncBulk(); } })
      : null;
    return h('tr', { dataset: { id: sb.id, state: sb.state } },
      h('td', {}, box),
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
      const q = new URLSearchParams();
      if (filter) q.set('state', filter);
      const m = meta.value.trim().match(/^([^=\s]+)=(.*)$/);
      if (m) q.set(`metadata.${m[1]}`, m[2]);
      const qs = q.toString();
      const res = await api('GET', `/v1/sandboxes${qs ? '?' + qs : ''}`);
      if (stopped) return;
      const list = (res.sandboxes || []).filter((sb) => !tplFilter.value || sb.template === tplFilter.value);
      const ids = new Set(list.map((sb) => sb.id));
      for (const id of [...selected]) if (!ids.has(id)) selected.delete(id);
      syncBulk();
      tbody.replaceChildren(...(list.length ? list.map(row) : [h('tr', {}, h('td', { colspan: 9, class: 'empty' }, 'No sandboxes.'))]));
      table.dataset.loaded = '1';
    } catch (e) {
      showError(e);
    }
    if (!stopped) timer = setTimeout(refresh, POLL_MS);
  }
  refresh();
  return { stop() { stopped = true; clearTimeout(timer); } };
}

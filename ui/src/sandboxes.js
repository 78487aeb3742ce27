// sandboxes.js -- #/sandboxes: the org's sandboxes by state, template and metadata, refreshed every 2 s;
// create, kill, and kill the selected ones. The server pages the list: one request of 50 for the page
// shown (Previous goes back through the cursors walked; the count shows the server's total), and a poll
// re-requests that page and re-renders only the rows whose shown fields changed, keeping the others' DOM
// nodes as they are. A selection outlives paging; it drops a sandbox once it is gone from the page that
// showed it, and a change of filter keeps only the selected ones the new first page shows.
import { api, h, showError, fmtTime } from './api.js';

const STATES = ['', 'running', 'paused', 'hibernated', 'creating', 'killed'];
const POLL_MS = 2000;
const PAGE = 50;

export function sandboxesPage(root, me) {
  const canWrite = me.role !== 'readonly';
  let filter = sessionStorage.getItem('moat.filter') || '';
  let timer = null;
  let stopped = false;

  const select = h('select', { id: 'state-filter', 'aria-label': 'State' },
    STATES.map((s) => h('option', { value: s, selected: s === filter }, s || 'all live')));
  let pageNo = 0;
  let cursors = [null]; // cursors[i]: where page i starts (null: the beginning)
  let nextCursor = null; // the shown page's next, null on the last
  let filtered = false; // a filter changed since the last draw
  const firstPage = () => { pageNo = 0; cursors = [null]; filtered = true; };
  select.addEventListener('change', () => {
    firstPage();
    filter = select.value;
    sessionStorage.setItem('moat.filter', filter);
    refresh();
  });
  const meta = h('input', { id: 'meta-filter', 'aria-label': 'Metadata filter', placeholder: 'key=value', size: 18 });
  meta.addEventListener('change', () => { firstPage(); refresh(); });
  const tplFilter = h('select', { id: 'template-filter', 'aria-label': 'Template filter' }, h('option', { value: '' }, 'any template'));
  tplFilter.addEventListener('change', () => { firstPage(); refresh(); });
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
        // one selected on another page may have gone meanwhile: gone is what was asked
        if (e.status === 404) selected.delete(id);
        else failed.push(`${id}: ${e.message}`);
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
  const emptyRow = h('tr', {}, h('td', { colspan: 9, class: 'empty' }, 'No sandboxes.'));
  const rows = new Map(); // id -> { sig, tr }: the rows drawn, reused while what they show is unchanged
  const prev = h('button', { type: 'button', id: 'page-prev', disabled: true, onclick: () => {
    if (pageNo === 0) return;
    pageNo--;
    cursors.length = pageNo + 1;
    refresh();
  } }, 'Previous');
  const next = h('button', { type: 'button', id: 'page-next', disabled: true, onclick: () => {
    if (!nextCursor) return;
    cursors.length = pageNo + 1;
    cursors.push(nextCursor);
    pageNo++;
    refresh();
  } }, 'Next');
  const count = h('span', { id: 'page-count', 'aria-live': 'polite' });
  const pager = h('div', { class: 'toolbar pager' }, prev, count, next);
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
    h('div', { class: 'scroll' }, table),
    pager);

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

  let seq = 0; // the latest request: an older answer arriving after it is dropped
  let drawn = { key: null, ids: new Set() }; // what the last draw showed, and of which page

  async function refresh() {
    clearTimeout(timer);
    const mine = ++seq;
    try {
      const q = new URLSearchParams();
      if (filter) q.set('state', filter);
      if (tplFilter.value) q.set('template', tplFilter.value);
      const m = meta.value.trim().match(/^([^=\s]+)=(.*)$/);
      if (m) q.set(`metadata.${m[1]}`, m[2]);
      q.set('limit', String(PAGE));
      const at = cursors[pageNo];
      if (at) q.set('cursor', at);
      const res = await api('GET', `/v1/sandboxes?${q}`);
      if (stopped || mine !== seq) return;
      const shown = res.sandboxes || [];
      if (!shown.length && pageNo > 0) {
        // everything from here on has gone: show the page before
        pageNo--;
        cursors.length = pageNo + 1;
        return refresh();
      }
      nextCursor = res.next || null;
      const total = res.total ?? shown.length;
      const ids = new Set(shown.map((sb) => sb.id));
      const key = q.toString();
      for (const id of [...selected]) {
        if (filtered ? !ids.has(id) : (drawn.key === key && drawn.ids.has(id) && !ids.has(id))) selected.delete(id);
      }
      filtered = false;
      drawn = { key, ids };
      syncBulk();
      const want = [];
      const keep = new Set();
      for (const sb of shown) {
        const sig = JSON.stringify([sb.template, sb.state, sb.created_at, sb.cpu, sb.memory_mb, sb.metadata]);
        let r = rows.get(sb.id);
        if (!r || r.sig !== sig) {
          r = { sig, tr: row(sb) };
          rows.set(sb.id, r);
        }
        keep.add(sb.id);
        want.push(r.tr);
      }
      for (const id of [...rows.keys()]) if (!keep.has(id)) rows.delete(id);
      if (!want.length) want.push(emptyRow);
      // move only what is out of place: an unchanged page makes no DOM mutation at all
      let node = tbody.firstChild;
      for (const tr of want) {
        if (tr === node) node = node.nextSibling;
        else tbody.insertBefore(tr, node);
      }
      while (node) {
        const n = node.nextSibling;
        node.remove();
        node = n;
      }
      prev.disabled = pageNo === 0;
      next.disabled = !nextCursor;
      count.textContent = shown.length
        ? `${pageNo * PAGE + 1}–${pageNo * PAGE + shown.length} of ${total}` : `0 of ${total}`;
      table.dataset.page = String(pageNo + 1);
      table.dataset.loaded = '1';
    } catch (e) {
      if (mine !== seq) return;
      showError(e);
    }
    if (!stopped) timer = setTimeout(refresh, POLL_MS);
  }
  refresh();
  return { stop() { stopped = true; clearTimeout(timer); } };
}

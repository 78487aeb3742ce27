// databases.js -- #/databases: the org's PostgreSQL databases (list, create, branch, delete), refreshed
// every 3 s and at each event of the database whose events panel is open (its SSE stream, shown as the
// events come). The connection URL is shown as the API gives it: with its password to admin and member
// keys; a readonly key's reads carry none, and the page then shows no URL.
import { api, h, showError, fmtTime } from './api.js';
import { readEvents } from './sse.js';

const POLL_MS = 3000;

export function databasesPage(root, me) {
  const canWrite = me.role !== 'readonly';
  let timer = null;
  let stopped = false;
  const status = h('span', { class: 'status', role: 'status', 'aria-live': 'polite' });
  // A long operation's progress: label() in the status every 500 ms until the returned stop is called.
  const ticking = (label) => {
    const t = setInterval(() => { status.textContent = label(); }, 500);
    return () => clearInterval(t);
  };
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
    const stopTick = ticking(() => `creating ${name.value}… ${Math.round((Date.now() - started) / 1000)} s`);
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
      stopTick();
      createBtn.disabled = false;
    }
  });
  // Branch: a name for the new database, asked in a form under the create form
  let branchOf = null;
  const branchName = h('input', { id: 'db-branch-name', required: true, placeholder: 'name', size: 16,
    pattern: '[a-z0-9][a-z0-9_\\-]{0,62}' });
  const branchLabel = h('label', { for: 'db-branch-name' }, 'Branch name');
  const branchBtn = h('button', { type: 'submit', id: 'db-branch-create' }, 'Create branch');
  const branchCancel = h('button', { type: 'button', id: 'db-branch-cancel' }, 'Cancel');
  const branchForm = h('form', { class: 'toolbar', id: 'db-branch-form', hidden: true },
    branchLabel, branchName, branchBtn, branchCancel);
  branchCancel.addEventListener('click', () => { branchForm.hidden = true; branchOf = null; });
  branchForm.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    if (!branchOf) return;
    const src = branchOf;
    branchBtn.disabled = true;
    showError(null);
    const started = Date.now();
    const label = () => `branching ${src.name} into ${branchName.value}… ${Math.round((Date.now() - started) / 1000)} s`;
    status.textContent = label();
    const stopTick = ticking(label);
    try {
      const db = await api('POST', `/v1/databases/${encodeURIComponent(src.id)}/branch`, { name: branchName.value });
      status.textContent = `branched ${src.name} into ${db.name}`;
      status.dataset.branch = db.id;
      branchName.value = '';
      branchForm.hidden = true;
      branchOf = null;
      await refresh();
    } catch (e) {
      status.textContent = '';
      showError(e);
    } finally {
      stopTick();
      branchBtn.disabled = false;
    }
  });
  function openBranch(db) {
    branchOf = db;
    branchLabel.textContent = `Branch of ${db.name}: name`;
    branchForm.dataset.source = db.id;
    branchForm.hidden = false;
    branchName.focus();
  }

  // Events: one database's stream at a time
  let events = null;
  const evTitle = h('h2', {}, 'Events');
  const evLog = h('div', { class: 'logs db-events-log', id: 'db-events-log', role: 'log', 'aria-live': 'polite', tabindex: 0 });
  const evState = h('span', { class: 'status', id: 'db-events-state' });
  const evClose = h('button', { type: 'button', id: 'db-events-close' }, 'Close');
  const evPanel = h('section', { id: 'db-events', hidden: true, 'aria-label': 'Database events' },
    evTitle, h('div', { class: 'toolbar' }, evState, evClose), evLog);
  evClose.addEventListener('click', () => closeEvents());
  function closeEvents() {
    if (events) events.abort();
    events = null;
    evPanel.hidden = true;
    delete evPanel.dataset.database;
  }
  // what an event says beyond its name
  function describe(name, d) {
    switch (name) {
      case 'state': return `${d.state}, ${d.connections ?? 0} connections`;
      case 'connection': return `${d.opened ? 'opened' : 'closed'} (${d.connections} open)`;
      case 'woken': return `in ${Math.round(d.wake_ms ?? 0)} ms`;
      case 'restarted': return d.reason || '';
      case 'branched': return `into ${d.branch_id}`;
      case 'created': return d.branch_of ? `as a branch of ${d.branch_of}` : '';
      default: return '';
    }
  }
  function openEvents(db) {
    closeEvents();
    const ctl = new AbortController();
    events = ctl;
    evTitle.textContent = `Events of ${db.name}`;
    evPanel.dataset.database = db.id;
    evLog.replaceChildren();
    evState.textContent = 'connecting…';
    evPanel.hidden = false;
    readEvents(`/v1/databases/${encodeURIComponent(db.id)}/events`, (ev) => {
      if (ctl.signal.aborted) return;
      const d = ev.data && typeof ev.data === 'object' ? ev.data : {};
      evState.textContent = 'following';
      const at = d.at_ms ? new Date(d.at_ms).toLocaleTimeString() : new Date().toLocaleTimeString();
      evLog.append(h('div', { class: 'event', dataset: { type: ev.name, state: d.state || '' } },
        h('span', { class: 'mono' }, at), ' ', h('strong', {}, ev.name), ' ', describe(ev.name, d)));
      evLog.scrollTop = evLog.scrollHeight;
      // the list shows a state change at once, not at the next poll
      if (ev.name !== 'state') setTimeout(() => { if (!stopped) refresh(); }, 0);
    }, ctl.signal).then((ended) => {
      if (ended && events === ctl) evState.textContent = 'the stream ended';
    }, (e) => {
      if (events !== ctl) return;
      evState.textContent = '';
      showError(e);
    });
  }

  root.replaceChildren(h('h1', {}, 'Databases'), canWrite ? form : null, canWrite ? branchForm : null,
    h('div', { class: 'toolbar' }, status), h('div', { class: 'scroll' }, table), evPanel);

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
      h('td', { class: 'row-actions' },
        h('button', { type: 'button', class: 'events', 'aria-label': `Events of ${db.name}`, onclick: () => openEvents(db) }, 'Events'),
        canWrite && (db.state === 'running' || db.state === 'hibernated')
          ? h('button', { type: 'button', class: 'branch', 'aria-label': `Branch ${db.name}`, onclick: () => openBranch(db) }, 'Branch')
          : null,
        canWrite && db.state !== 'deleting'
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
  return { stop() { stopped = true; clearTimeout(timer); closeEvents(); } };
}

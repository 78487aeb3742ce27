// admin.js -- the pages about the host and the orgs rather than one org's things:
//   #/quotas  an org's use against each quota (any key of the org; read only)
//   #/orgs    the orgs (the platform admin key): create (its first admin key shown once), delete
//             (force: with what it holds), and each org's quotas edited beside its use now
//   #/host    GET /v1/host: capacity, checkpoints, network, the sandboxes counted and, for the
//             platform admin key, the host's load
import { api, h, showError, fmtTime } from './api.js';

const POLL_MS = 3000;

function limitText(lim) {
  return lim === null || lim === undefined ? 'unlimited' : String(lim);
}

function quotaRows(usage, editable) {
  return Object.entries(usage || {}).map(([q, u]) => {
    const lim = u.limit === null || u.limit === undefined ? null : u.limit;
    const pct = lim ? Math.min(100, Math.round((100 * u.use) / lim)) : null;
    const limitCell = editable
      ? h('input', { type: 'number', min: 0, step: 1, size: 10, value: lim === null ? '' : lim, placeholder: 'unlimited',
        'aria-label': `${q} limit`, dataset: { quota: q } })
      : limitText(lim);
    return h('tr', { dataset: { id: q, use: String(u.use), limit: lim === null ? '' : String(lim) } },
      h('td', { class: 'mono' }, q), h('td', {}, u.use), h('td', {}, limitCell),
      h('td', {}, pct === null ? '' : h('meter', { min: 0, max: 100, value: pct, 'aria-label': `${q} ${pct}%` })));
  });
}

function quotaTable(id) {
  const tbody = h('tbody', { id: 'rows' });
  const table = h('table', { class: 'list', id },
    h('thead', {}, h('tr', {}, ['Quota', 'Use', 'Limit', ''].map((t) => h('th', { scope: 'col' }, t)))), tbody);
  return { table, tbody };
}

export function quotasPage(root, me) {
  const { table, tbody } = quotaTable('list-quotas');
  root.replaceChildren(h('h1', {}, `Quotas of ${me.org}`),
    h('p', { class: 'muted' }, 'The platform admin sets them (sign in with the platform admin key, or moat quota set).'),
    h('div', { class: 'scroll' }, table));
  let stopped = false;
  api('GET', `/v1/orgs/${encodeURIComponent(me.org)}/usage/now`).then((res) => {
    if (stopped) return;
    tbody.replaceChildren(...quotaRows(res.usage, false));
    table.dataset.loaded = '1';
  }).catch((e) => { showError(e); table.dataset.loaded = 'error'; });
  return { stop() { stopped = true; } };
}

// One org's quotas, editable: an empty field is unlimited. Saving PUTs every quota shown.
function quotaEditor(org, onDone) {
  const { table, tbody } = quotaTable('edit-quotas');
  const status = h('span', { class: 'status', role: 'status', 'aria-live': 'polite' });
  const save = h('button', { type: 'submit', id: 'quotas-save' }, 'Save quotas');
  const close = h('button', { type: 'button', id: 'quotas-close' }, 'Close');
  const form = h('form', { id: 'quota-editor', class: 'panel', 'aria-label': `Quotas of ${org.name}` },
    h('h2', {}, `Quotas of ${org.name} `, h('span', { class: 'mono muted' }, org.id)),
    h('div', { class: 'scroll' }, table), h('div', { class: 'toolbar' }, save, close, status));
  async function load() {
    const res = await api('GET', `/v1/orgs/${encodeURIComponent(org.id)}/usage/now`);
    tbody.replaceChildren(...quotaRows(res.usage, true));
    table.dataset.loaded = '1';
  }
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    showError(null);
    const body = {};
    for (const input of form.querySelectorAll('input[data-quota]')) {
      const v = input.value.trim();
      body[input.dataset.quota] = v === '' ? null : Number(v);
    }
    save.disabled = true;
    status.textContent = 'saving…';
    try {
      await api('PUT', `/v1/orgs/${encodeURIComponent(org.id)}/quotas`, body);
      status.textContent = 'saved';
      form.dataset.saved = String(Number(form.dataset.saved || 0) + 1);
      await load();
    } catch (e) {
      status.textContent = '';
      showError(e);
    } finally {
      save.disabled = false;
    }
  });
  close.addEventListener('click', onDone);
  load().catch((e) => { showError(e); table.dataset.loaded = 'error'; });
  return form;
}

export function orgsPage(root) {
  let stopped = false;
  let timer = null;
  const status = h('span', { class: 'status', role: 'status', 'aria-live': 'polite' });
  const tbody = h('tbody', { id: 'rows' });
  const table = h('table', { class: 'list', id: 'list-orgs' },
    h('thead', {}, h('tr', {}, ['Name', 'ID', 'State', 'Created', ''].map((t) => h('th', { scope: 'col' }, t)))), tbody);
  const name = h('input', { id: 'org-name', 'aria-label': 'Org name', placeholder: 'name', size: 18, required: true });
  const createBtn = h('button', { type: 'submit', id: 'org-create' }, 'Create org');
  const form = h('form', { class: 'toolbar', id: 'org-form' }, h('label', { for: 'org-name' }, 'Name'), name, createBtn, status);
  const secret = h('div', { id: 'org-secret', hidden: true, class: 'panel' });
  const editor = h('div', { id: 'org-editor' });
  root.replaceChildren(h('h1', {}, 'Orgs'), form, secret, h('div', { class: 'scroll' }, table), editor);

  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    showError(null);
    createBtn.disabled = true;
    try {
      const o = await api('POST', '/v1/orgs', { name: name.value.trim() });
      name.value = '';
      status.textContent = `created ${o.name}`;
      // the org's first admin key: answered this once
      secret.replaceChildren(h('p', {}, `The admin key of ${o.name} (shown this once: copy it now):`),
        h('code', { class: 'mono', id: 'org-key' }, o.admin_key.key));
      secret.hidden = false;
      secret.dataset.org = o.id;
      await refresh();
    } catch (e) {
      showError(e);
    } finally {
      createBtn.disabled = false;
    }
  });

  function openEditor(o) {
    editor.replaceChildren(quotaEditor(o, () => editor.replaceChildren()));
    editor.querySelector('input')?.focus();
  }

  async function remove(o, force) {
    showError(null);
    status.textContent = `deleting ${o.name}…`;
    try {
      await api('DELETE', `/v1/orgs/${encodeURIComponent(o.id)}${force ? '?force=true' : ''}`);
      status.textContent = `deleted ${o.name}`;
      if (editor.querySelector('#quota-editor')) editor.replaceChildren();
    } catch (e) {
      status.textContent = '';
      showError(e);
    }
    await refresh();
  }

  let shown = '';
  async function refresh() {
    try {
      const res = await api('GET', '/v1/orgs');
      if (stopped) return;
      const orgs = res.orgs || [];
      const sig = JSON.stringify(orgs.map((o) => [o.id, o.state]));
      if (sig !== shown) {
        shown = sig;
        tbody.replaceChildren(...orgs.map((o) => {
          const force = h('input', { type: 'checkbox', 'aria-label': `Force delete ${o.name}`, dataset: { force: o.id } });
          return h('tr', { dataset: { id: o.id, name: o.name } },
            h('td', {}, o.name), h('td', { class: 'mono' }, o.id), h('td', {}, o.state), h('td', {}, fmtTime(o.created_at)),
            h('td', { class: 'actions' },
              h('button', { type: 'button', dataset: { act: 'quotas' }, onclick: () => openEditor(o) }, 'Quotas'),
              h('label', {}, force, ' with what it holds'),
              h('button', { type: 'button', class: 'danger', dataset: { act: 'delete' }, onclick: () => remove(o, force.checked) }, 'Delete')));
        }));
      }
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

const fmtMb = (mb) => (mb >= 1024 ? `${(mb / 1024).toFixed(1)} GiB` : `${mb} MiB`);

export function hostPage(root) {
  const dl = h('dl', { id: 'host', class: 'details' });
  const note = h('p', { class: 'muted', id: 'host-scope' });
  root.replaceChildren(h('h1', {}, 'Host'), note, dl);
  let stopped = false;
  let timer = null;
  async function load() {
    try {
      const r = await api('GET', '/v1/host');
      if (stopped) return;
      const c = r.capacity;
      const s = r.sandboxes;
      const facts = [['version', r.version],
        ['cpus', c.cpus], ['memory', fmtMb(c.memory_mb)], ['disk', fmtMb(c.disk_mb)],
        ['checkpoints', r.checkpoints.available ? 'available' : 'unavailable'], ['criu', r.checkpoints.criu],
        ['internet', r.network && r.network.internet ? 'yes' : 'no'], ['uplink', r.network ? r.network.uplink : '—'],
        ['sandboxes', `${s.live} live: ` + Object.entries(s.by_state).filter(([, n]) => n).map(([k, n]) => `${n} ${k}`).join(', ')],
        ['committed', `${s.committed_vcpus} vCPU of ${c.cpus}, ${fmtMb(s.committed_memory_mb)} of ${fmtMb(c.memory_mb)}`]];
      if (r.load) {
        const l = r.load;
        facts.push(['load', l.average.map((x) => x.toFixed(2)).join(' ')],
          ['memory available', fmtMb(l.memory_available_mb)], ['disk free', fmtMb(l.disk_free_mb)],
          ['uptime', `${Math.floor(l.uptime_seconds / 86400)} d ${Math.floor((l.uptime_seconds % 86400) / 3600)} h`]);
      }
      note.textContent = r.scope === 'host'
        ? 'Every org\u2019s sandboxes, and the host\u2019s load.'
        : 'Your org\u2019s sandboxes. The host\u2019s load is the platform admin\u2019s to see.';
      dl.replaceChildren(...facts.flatMap(([k, v]) => [h('dt', {}, k), h('dd', { dataset: { fact: k } }, String(v))]));
      dl.dataset.loaded = '1';
      dl.dataset.scope = r.scope;
    } catch (e) {
      showError(e);
      dl.dataset.loaded = 'error';
    }
    if (!stopped) timer = setTimeout(load, POLL_MS);
  }
  load();
  return { stop() { stopped = true; clearTimeout(timer); } };
}

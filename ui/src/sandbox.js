// sandbox.js -- #/sandboxes/ID: a sandbox's details and actions, its CPU and memory history, a
// terminal and its log as it grows.
import { api, h, showError, fmtTime, fmtBytes } from './api.js';
import { lineChart } from './chart.js';
import { openTerminal } from './terminal.js';
import { fileBrowser } from './files.js';

const ACTIONS = [
  // [label, API verb, states it applies to]
  ['Pause', 'pause', ['running']],
  ['Resume', 'resume', ['paused']],
  ['Hibernate', 'hibernate', ['running', 'paused']],
  ['Wake', 'wake', ['hibernated']],
];
const POLL_MS = 3000;
const HISTORY_MS = 3600 * 1000;
const LOG_MAX_CHARS = 64 * 1024;

export function sandboxPage(root, me, id) {
  const canWrite = me.role !== 'readonly';
  const base = `/v1/sandboxes/${encodeURIComponent(id)}`;
  let stopped = false;
  let timer = null;
  let term = null;
  let logs = null;

  const title = h('h1', {}, h('span', { class: 'mono' }, id));
  const details = h('dl', { class: 'details', id: 'details' });
  const actions = h('div', { class: 'actions', id: 'actions' });
  const busy = h('span', { class: 'status', role: 'status', 'aria-live': 'polite' });
  const chartBox = h('div', { id: 'chart', class: 'chart-box' }, 'Loading history…');
  const termBox = h('div', { id: 'terminal', class: 'terminal' });
  const termStatus = h('span', { id: 'terminal-status', class: 'status' }, '');
  const termBtn = h('button', { type: 'button', id: 'open-terminal' }, 'Open terminal');
  const files = fileBrowser(base, canWrite);
  const logPre = h('pre', { id: 'logs', class: 'logs', tabindex: 0, 'aria-label': 'Log' });

  root.replaceChildren(
    h('p', {}, h('a', { href: '#/sandboxes' }, '← Sandboxes')),
    title,
    h('section', {}, details, actions, busy),
    h('section', {}, h('h2', {}, 'CPU and memory'), chartBox),
    canWrite ? h('section', {}, h('h2', {}, 'Terminal'), h('div', { class: 'toolbar' }, termBtn, termStatus), termBox) : null,
    files.el,
    h('section', {}, h('h2', {}, 'Log'), logPre));

  termBtn.addEventListener('click', () => {
    if (term) return;
    termBtn.disabled = true;
    term = openTerminal(termBox, id, (s) => { termStatus.textContent = s; });
  });

  const rollbackTo = h('select', { id: 'rollback-to', 'aria-label': 'Snapshot to roll back to' });
  async function loadSnapshots() {
    try {
      const res = await api('GET', `/v1/snapshots?sandbox_id=${encodeURIComponent(id)}`);
      const snaps = res.snapshots || [];
      const keep = rollbackTo.value;
      rollbackTo.replaceChildren(...snaps.map((x) => h('option', { value: x.id, selected: x.id === keep }, `${x.id} (${fmtTime(x.created_at)})`)));
    } catch (e) { /* the list is a convenience: the action reports its own errors */ }
  }

  // One action at a time: the buttons wait while it runs, and the status counts its seconds (a
  // snapshot, fork or hibernate of a large sandbox takes a while).
  async function act(verb, label) {
    showError(null);
    const t0 = Date.now();
    const secs = () => ((Date.now() - t0) / 1000).toFixed(1);
    busy.textContent = `${label}…`;
    busy.dataset.running = verb;
    const tick = setInterval(() => { busy.textContent = `${label}… ${secs()} s`; }, 250);
    const buttons = [...actions.querySelectorAll('button')];
    for (const b of buttons) b.disabled = true;
    const done = (text) => { clearInterval(tick); busy.textContent = `${text} (${secs()} s)`; };
    try {
      if (verb === 'kill') {
        await api('DELETE', base);
        done(`${label}: done`);
      } else if (verb === 'snapshots') {
        const snap = await api('POST', `${base}/snapshots`, {});
        done(`snapshot ${snap.id}`);
        busy.dataset.snapshot = snap.id;
        await loadSnapshots();
      } else if (verb === 'fork') {
        const res = await api('POST', `${base}/fork`, {});
        const child = res.sandboxes[0].id;
        done(`forked ${child}`);
        location.hash = `#/sandboxes/${child}`;
        return;
      } else if (verb === 'rollback') {
        if (!rollbackTo.value) throw new Error('no snapshot of this sandbox to roll back to');
        await api('POST', `${base}/rollback`, { snapshot_id: rollbackTo.value });
        done(`rolled back to ${rollbackTo.value}`);
      } else {
        await api('POST', `${base}/${verb}`, {});
        done(`${label}: done`);
      }
    } catch (e) {
      clearInterval(tick);
      busy.textContent = '';
      showError(e);
    } finally {
      clearInterval(tick);
      delete busy.dataset.running;
      for (const b of buttons) b.disabled = false;
    }
    await refresh();
  }

  function render(sb) {
    const meta = Object.entries(sb.metadata || {}).map(([k, v]) => `${k}=${v}`).join(', ') || '—';
    const rows = [
      ['State', h('span', { class: `state state-${sb.state}`, id: 'state' }, sb.state)],
      ['Template', sb.template],
      ['Created', fmtTime(sb.created_at)],
      ['Expires', sb.persistent ? 'never (persistent)' : fmtTime(sb.expires_at)],
      ['CPU', `${sb.cpu}`],
      ['Memory', `${sb.memory_mb} MiB`],
      ['Processes', `${sb.pids}`],
      ['Disk', `${sb.disk_mb} MiB`],
      ['Metadata', meta],
    ];
    if (sb.killed_reason) rows.push(['Killed', `${sb.killed_reason} at ${fmtTime(sb.killed_at)}`]);
    details.replaceChildren(...rows.flatMap(([k, v]) => [h('dt', {}, k), h('dd', {}, v)]));
    if (!canWrite || sb.state === 'killed') {
      actions.replaceChildren();
      return;
    }
    const focused = document.activeElement && actions.contains(document.activeElement) ? document.activeElement.dataset.action : null;
    actions.replaceChildren(
      ...ACTIONS.filter(([, , st]) => st.includes(sb.state)).map(([label, verb]) =>
        h('button', { type: 'button', 'data-action': verb, onclick: () => act(verb, label) }, label)),
      ...(sb.state === 'running' ? [
        h('button', { type: 'button', 'data-action': 'snapshots', onclick: () => act('snapshots', 'Snapshot') }, 'Snapshot'),
        h('button', { type: 'button', 'data-action': 'fork', onclick: () => act('fork', 'Fork') }, 'Fork'),
        rollbackTo,
        h('button', { type: 'button', 'data-action': 'rollback', onclick: () => act('rollback', 'Roll back') }, 'Roll back'),
      ] : []),
      h('button', { type: 'button', class: 'danger', 'data-action': 'kill', onclick: () => act('kill', 'Kill') }, 'Kill'));
    // a re-render keeps keyboard focus on the same action
    if (focused) actions.querySelector(`[data-action="${focused}"]`)?.focus();
  }

  async function drawChart() {
    try {
      const from = Date.now() - HISTORY_MS;
      const res = await api('GET', `${base}/metrics?from=${from}`);
      const samples = res.samples || [];
      if (!samples.length) {
        chartBox.replaceChildren('No samples recorded yet.');
        return;
      }
      const cpu = samples.map((s) => [s.timestamp_ms, s.cpu_used_pct || 0]);
      const mem = samples.map((s) => [s.timestamp_ms, s.memory_limit_bytes ? (100 * s.memory_used_bytes) / s.memory_limit_bytes : 0]);
      const last = samples[samples.length - 1];
      chartBox.replaceChildren(
        lineChart([{ name: 'cpu', cls: 'cpu', points: cpu }, { name: 'memory', cls: 'mem', points: mem }],
          { label: `CPU and memory, ${samples.length} samples` }),
        h('p', { class: 'legend' },
          h('span', { class: 'key cpu' }, `CPU ${last.cpu_used_pct.toFixed(1)}% of its limit`), ' ',
          h('span', { class: 'key mem' }, `memory ${fmtBytes(last.memory_used_bytes)} of ${fmtBytes(last.memory_limit_bytes)}`)));
      chartBox.dataset.samples = samples.length;
    } catch (e) {
      chartBox.replaceChildren(`No history: ${e.message}`);
    }
  }

  // Output chunks join into lines as a terminal would show them (escape sequences and CRs dropped);
  // every other entry is a line of its own. The last LOG_MAX_CHARS are kept.
  let logText = '';
  function logAppend(text) {
    logText = (logText + text).slice(-LOG_MAX_CHARS);
    logPre.textContent = logText;
    logPre.scrollTop = logPre.scrollHeight;
  }
  function logLine(text) {
    logAppend(`${logText && !logText.endsWith('\n') ? '\n' : ''}${text}\n`);
  }
  let lastStream = '';
  function logOutput(e) {
    const who = `${e.stream} ${e.tag || e.pid}`;
    const text = decode(e).replace(/\x1b\[[0-9;?]*[ -\/]*[@-~]|\x1b\][^\x07]*\x07|\r/g, '');
    if (who !== lastStream || !logText || logText.endsWith('\n')) logAppend(`${logText && !logText.endsWith('\n') ? '\n' : ''}[${who}] `);
    lastStream = who;
    logAppend(text.replace(/\n(?=.)/g, `\n[${who}] `));
  }

  function decode(e) {
    if (e.encoding === 'base64') {
      try {
        return new TextDecoder().decode(Uint8Array.from(atob(e.data), (c) => c.charCodeAt(0)));
      } catch (x) {
        return '[binary]';
      }
    }
    return e.data;
  }

  function openLogs() {
    logs = new EventSource(`${base}/logs?follow=true`);
    const on = (type, fmt) => logs.addEventListener(type, (ev) => {
      try { logLine(fmt(JSON.parse(ev.data))); } catch (x) { logLine(ev.data); }
    });
    logs.addEventListener('output', (ev) => {
      try { logOutput(JSON.parse(ev.data)); } catch (x) { logLine(ev.data); }
    });
    const line = (f) => (e) => { lastStream = ''; return f(e); };
    on('process', line((e) => e.event === 'start' ? `[start ${e.pid}] ${(e.argv || []).join(' ')}` : `[exit ${e.pid}] code ${e.exit_code}${e.signal ? ' signal ' + e.signal : ''}`));
    on('lifecycle', (e) => {
      // a state change shows at once, not at the next poll
      setTimeout(() => { if (!stopped) refresh(); }, 0);
      return `[${e.event}] ${e.state}${e.reason ? ' (' + e.reason + ')' : ''}`;
    });
    on('oom', (e) => `[oom] ${e.cmd || ''} killed`);
    on('dropped', (e) => `[dropped ${e.bytes} bytes: ${e.reason}]`);
    logs.addEventListener('error', () => { if (logs.readyState === EventSource.CLOSED) logLine('[log stream ended]'); });
  }

  async function refresh() {
    clearTimeout(timer);
    try {
      const sb = await api('GET', base);
      if (stopped) return;
      render(sb);
      if (!logs) {
        openLogs();
        loadSnapshots();
        if (sb.state === 'running') files.open();
      }
    } catch (e) {
      if (stopped) return;
      showError(e);
      details.replaceChildren();
      actions.replaceChildren();
      if (e.status === 404) return;
    }
    if (!stopped) timer = setTimeout(refresh, POLL_MS);
  }
  refresh().then(() => { if (!stopped && details.childElementCount) drawChart(); });
  const chartTimer = setInterval(() => { if (details.childElementCount) drawChart(); }, 10000);

  return {
    stop() {
      stopped = true;
      clearTimeout(timer);
      clearInterval(chartTimer);
      if (term) term.close();
      if (logs) logs.close();
    },
  };
}

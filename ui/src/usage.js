// usage.js -- #/usage: the org's metered use over a range (GET /v1/usage), grouped by sandbox,
// template or a metadata key; each row's CPU share drawn as a bar.
import { api, h, showError } from './api.js';

const RANGES = [['1 hour', 3600e3], ['24 hours', 86400e3], ['7 days', 7 * 86400e3], ['30 days', 30 * 86400e3]];

export function usagePage(root) {
  const group = h('input', { id: 'usage-group', 'aria-label': 'Group by', value: 'template', size: 22, list: 'usage-groups' });
  const groups = h('datalist', { id: 'usage-groups' }, ['sandbox', 'template', 'metadata.'].map((g) => h('option', { value: g })));
  const range = h('select', { id: 'usage-range', 'aria-label': 'Range' },
    RANGES.map(([l, ms], i) => h('option', { value: ms, selected: i === 1 }, l)));
  const go = h('button', { type: 'button', id: 'usage-go' }, 'Show');
  const tbody = h('tbody', { id: 'rows' });
  const table = h('table', { class: 'list', id: 'list-usage' },
    h('thead', {}, h('tr', {}, ['Group', 'CPU seconds', 'Memory GiB·s', 'Sandbox seconds', 'CPU share'].map((t) => h('th', { scope: 'col' }, t)))),
    tbody);
  root.replaceChildren(h('h1', {}, 'Usage'),
    h('div', { class: 'toolbar' }, h('label', { for: 'usage-group' }, 'Group by'), group, groups,
      h('label', { for: 'usage-range' }, 'Over the last'), range, go),
    h('div', { class: 'scroll' }, table));
  let stopped = false;
  async function load() {
    showError(null);
    try {
      const to = Date.now();
      const from = to - Number(range.value);
      const q = new URLSearchParams({ from: String(from), to: String(to), group_by: group.value.trim() || 'sandbox' });
      const rows = await api('GET', `/v1/usage?${q}`);
      if (stopped) return;
      const total = rows.reduce((a, r) => a + r.cpu_seconds, 0) || 1;
      tbody.replaceChildren(...(rows.length ? rows.map((r) => {
        const key = r.key === null ? '(none)' : r.key;
        const pct = (100 * r.cpu_seconds) / total;
        return h('tr', { dataset: { id: key, cpu: r.cpu_seconds } },
          h('td', {}, key), h('td', {}, r.cpu_seconds.toFixed(2)), h('td', {}, r.memory_gib_seconds.toFixed(3)),
          h('td', {}, r.sandbox_seconds.toFixed(0)),
          h('td', {}, h('span', { class: 'bar', style: `width:${pct.toFixed(1)}%`, 'aria-label': `${pct.toFixed(0)}%` })));
      }) : [h('tr', {}, h('td', { colspan: 5, class: 'empty' }, 'No use in this range.'))]));
      table.dataset.loaded = '1';
    } catch (e) {
      showError(e);
      table.dataset.loaded = 'error';
    }
  }
  go.addEventListener('click', load);
  group.addEventListener('keydown', (ev) => { if (ev.key === 'Enter') load(); });
  range.addEventListener('change', load);
  load();
  return { stop() { stopped = true; } };
}

// usage.js -- #/usage: the org's metered use over a range (GET /v1/usage?bucket=), grouped by
// sandbox, template or a metadata key: a chart of each group's use per bucket (one line per group,
// the bucket width matched to the range, times in UTC) above a table of the totals, each row's CPU
// share drawn as a bar.
import { api, h, showError } from './api.js';
import { fmtAxis, lineChart } from './chart.js';

// [label, range ms, bucket s]: about 12 to 31 points a line
const RANGES = [['1 hour', 3600e3, 300], ['24 hours', 86400e3, 3600], ['7 days', 7 * 86400e3, 21600], ['30 days', 30 * 86400e3, 86400]];
const METRICS = [['cpu_seconds', 'CPU seconds'], ['memory_gib_seconds', 'Memory GiB·s'], ['sandbox_seconds', 'Sandbox seconds']];
const COLORS = ['#0a58ca', '#d55e00', '#2f855a', '#cc79a7', '#b7791f', '#0987a0', '#6f42c1', '#57606a'];
const MAX_LINES = COLORS.length;

const keyName = (k) => (k === null ? '(none)' : k);

function bucketName(s) {
  return s % 86400 === 0 ? `${s / 86400} day` : s % 3600 === 0 ? `${s / 3600} h` : `${s / 60} min`;
}

// An axis label in UTC, as the buckets are aligned: the time of day, with the date once buckets
// or the range pass a day.
function timeLabel(t, bucketS, rangeMs) {
  const d = new Date(t);
  if (bucketS >= 86400) return d.toLocaleDateString(undefined, { timeZone: 'UTC', month: 'short', day: 'numeric' });
  const hm = d.toLocaleTimeString(undefined, { timeZone: 'UTC', hour: '2-digit', minute: '2-digit', hour12: false });
  if (rangeMs <= 86400e3) return hm;
  return `${d.toLocaleDateString(undefined, { timeZone: 'UTC', month: 'short', day: 'numeric' })} ${hm}`;
}

// The buckets of [from, to) in bucketS wide buckets aligned to multiples of the width since the
// Unix epoch (as moatd aligns them): their starts, oldest first.
export function bucketStarts(from, to, bucketS) {
  const w = bucketS * 1000;
  const starts = [];
  for (let t = Math.floor(from / w) * w; t < to; t += w) starts.push(t);
  return starts;
}

export function usagePage(root) {
  const group = h('input', { id: 'usage-group', 'aria-label': 'Group by', value: 'template', size: 22, list: 'usage-groups' });
  const groups = h('datalist', { id: 'usage-groups' }, ['sandbox', 'template', 'metadata.'].map((g) => h('option', { value: g })));
  const range = h('select', { id: 'usage-range', 'aria-label': 'Range' },
    RANGES.map(([l, ms], i) => h('option', { value: ms, selected: i === 1 }, l)));
  const metric = h('select', { id: 'usage-metric', 'aria-label': 'Metric' }, METRICS.map(([v, l]) => h('option', { value: v }, l)));
  const go = h('button', { type: 'button', id: 'usage-go' }, 'Show');
  const chartBox = h('div', { id: 'usage-chart', class: 'usage-chart' });
  const tbody = h('tbody', { id: 'rows' });
  const table = h('table', { class: 'list', id: 'list-usage' },
    h('thead', {}, h('tr', {}, ['Group', 'CPU seconds', 'Memory GiB·s', 'Sandbox seconds', 'CPU share'].map((t) => h('th', { scope: 'col' }, t)))),
    tbody);
  root.replaceChildren(h('h1', {}, 'Usage'),
    h('div', { class: 'toolbar' }, h('label', { for: 'usage-group' }, 'Group by'), group, groups,
      h('label', { for: 'usage-range' }, 'Over the last'), range,
      h('label', { for: 'usage-metric' }, 'Chart'), metric, go),
    chartBox,
    h('div', { class: 'scroll' }, table));
  let stopped = false;
  let seq = 0;
  let last = null; // {rows, from, to, bucket, group}
  let drawnWidth = 0;

  function draw() {
    if (!last) return;
    const { rows, from, to, bucket } = last;
    const m = metric.value;
    const mLabel = METRICS.find(([v]) => v === m)[1];
    const starts = bucketStarts(from, to, bucket);
    const w = bucket * 1000;
    Object.assign(chartBox.dataset, { from, to, bucket, group: last.group, metric: m, buckets: starts.length });
    if (!rows.length) {
      chartBox.replaceChildren(h('p', { class: 'empty' }, 'No use in this range.'));
      chartBox.dataset.lines = 0;
      chartBox.dataset.loaded = '1';
      return;
    }
    const shown = [...rows].sort((a, b) => b[m] - a[m]).slice(0, MAX_LINES);
    // the buckets the API leaves out (nothing used) are zeros; a point sits mid-bucket
    const series = shown.map((r, i) => {
      const by = new Map(r.series.map((p) => [Date.parse(p.start), p[m]]));
      return { name: keyName(r.key), color: COLORS[i], points: starts.map((t) => [t + w / 2, by.get(t) || 0]) };
    });
    const width = Math.max(300, Math.round(chartBox.clientWidth || 640));
    const step = Math.max(1, Math.ceil(starts.length / Math.max(2, Math.floor(width / 90))));
    const ticks = starts.filter((t) => Math.round(t / w) % step === 0);
    const rangeMs = to - from;
    const span = `${timeLabel(from, 60, 2 * 86400e3)} to ${timeLabel(to, 60, 2 * 86400e3)} UTC`;
    const svg = lineChart(series, {
      width, height: width < 500 ? 200 : 240, max: 'auto', t0: starts[0], t1: starts[starts.length - 1] + w, ticks, dots: true,
      tickFormat: (t) => timeLabel(t, bucket, rangeMs), yTitle: `${mLabel} per ${bucketName(bucket)}`, xTitle: 'Time (UTC)',
      label: `${mLabel} per ${bucketName(bucket)} bucket, ${series.length} group${series.length === 1 ? '' : 's'}, ${span}`,
    });
    svg.setAttribute('tabindex', '0');
    svg.id = 'usage-svg';
    const legend = h('ul', { class: 'legend usage-legend', id: 'usage-legend', 'aria-label': 'Groups' },
      series.map((s, i) => h('li', { dataset: { series: s.name } },
        h('span', { class: 'swatch', style: `background:${s.color}`, 'aria-hidden': 'true' }), s.name,
        h('span', { class: 'status' }, ` ${fmtAxis(shown[i][m])}`))));
    const more = rows.length > shown.length ? h('p', { class: 'status' }, `The ${MAX_LINES} largest of ${rows.length} groups; all are in the table.`) : null;
    chartBox.replaceChildren(...[svg, legend, more].filter(Boolean));
    chartBox.dataset.lines = series.length;
    chartBox.dataset.loaded = '1';
    drawnWidth = chartBox.clientWidth;
  }

  async function load() {
    showError(null);
    const mine = ++seq;
    chartBox.dataset.loaded = '0';
    try {
      const to = Date.now();
      const [, rangeMs, bucket] = RANGES.find(([, ms]) => String(ms) === range.value) || RANGES[1];
      const from = to - rangeMs;
      const g = group.value.trim() || 'sandbox';
      const q = new URLSearchParams({ from: String(from), to: String(to), group_by: g, bucket: String(bucket) });
      const rows = await api('GET', `/v1/usage?${q}`);
      if (stopped || mine !== seq) return;
      last = { rows, from, to, bucket, group: g };
      const total = rows.reduce((a, r) => a + r.cpu_seconds, 0) || 1;
      tbody.replaceChildren(...(rows.length ? rows.map((r) => {
        const key = keyName(r.key);
        const pct = (100 * r.cpu_seconds) / total;
        return h('tr', { dataset: { id: key, cpu: r.cpu_seconds } },
          h('td', {}, key), h('td', {}, r.cpu_seconds.toFixed(2)), h('td', {}, r.memory_gib_seconds.toFixed(3)),
          h('td', {}, r.sandbox_seconds.toFixed(0)),
          h('td', {}, h('span', { class: 'bar', style: `width:${pct.toFixed(1)}%`, 'aria-label': `${pct.toFixed(0)}%` })));
      }) : [h('tr', {}, h('td', { colspan: 5, class: 'empty' }, 'No use in this range.'))]));
      table.dataset.loaded = '1';
      draw();
    } catch (e) {
      if (mine !== seq) return;
      showError(e);
      table.dataset.loaded = 'error';
      chartBox.dataset.loaded = 'error';
    }
  }
  function onResize() {
    if (last && Math.abs(chartBox.clientWidth - drawnWidth) > 8) draw();
  }
  go.addEventListener('click', load);
  group.addEventListener('keydown', (ev) => { if (ev.key === 'Enter') load(); });
  range.addEventListener('change', load);
  metric.addEventListener('change', draw);
  window.addEventListener('resize', onResize);
  load();
  return { stop() { stopped = true; window.removeEventListener('resize', onResize); } };
}

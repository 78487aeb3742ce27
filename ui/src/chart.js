// chart.js -- a line chart of time series as SVG (drawn here: no chart library).
const NS = 'http://www.w3.org/2000/svg';

function el(tag, attrs, text) {
  const e = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
  if (text !== undefined) e.textContent = text;
  return e;
}

// The smallest of 1, 2, 2.5, 5 times a power of ten that is at least v (v > 0).
export function niceCeil(v) {
  const p = 10 ** Math.floor(Math.log10(v));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p;
  return 10 * p;
}

// A number for an axis: 0, 0.25, 12, 1.5k, 2M.
export function fmtAxis(v) {
  const a = Math.abs(v);
  if (a >= 1e6) return `${+(v / 1e6).toFixed(1)}M`;
  if (a >= 1e4) return `${+(v / 1e3).toFixed(1)}k`;
  if (a >= 100) return String(Math.round(v));
  return String(+v.toPrecision(3));
}

// series: [{name, cls, color, points: [[t_ms, value]]}]; returns an <svg> with one polyline each
// (data-series: the name, data-points: how many, data-times and data-values: the points).
// Options: width, height, label (the accessible name); max: the y axis's top (default 100, shown
// as percent) or 'auto' (a round number above the largest value, shown with yFormat); t0, t1: the
// x axis's span (default the points'); ticks: [t_ms] labelled on the x axis with tickFormat
// (default: the last time only); yTitle, xTitle: axis titles; dots: a marker at every point.
export function lineChart(series, opts = {}) {
  const { width = 640, height = 180, label = 'chart', max = 100, ticks = null, dots = false } = opts;
  const auto = max === 'auto';
  const yFormat = opts.yFormat || (auto ? fmtAxis : (v) => `${v}%`);
  const pad = { l: opts.yTitle ? 52 : 36, r: ticks ? 22 : 8, t: 8, b: (ticks ? 22 : 20) + (opts.xTitle ? 14 : 0) };
  const svg = el('svg', { viewBox: `0 0 ${width} ${height}`, class: 'chart', role: 'img', 'aria-label': label });
  const all = series.flatMap((s) => s.points);
  const t0 = opts.t0 ?? Math.min(...all.map((p) => p[0]));
  const t1 = opts.t1 ?? Math.max(...all.map((p) => p[0]));
  const span = t1 > t0 ? t1 - t0 : 1;
  const top = auto ? niceCeil(Math.max(...all.map((p) => p[1]), 0) || 1) : max;
  const x = (t) => pad.l + ((t - t0) / span) * (width - pad.l - pad.r);
  const y = (v) => pad.t + (1 - Math.min(Math.max(v, 0), top) / top) * (height - pad.t - pad.b);
  for (const v of [0, top / 2, top]) {
    svg.append(el('line', { x1: pad.l, x2: width - pad.r, y1: y(v), y2: y(v), class: 'grid' }));
    svg.append(el('text', { x: pad.l - 4, y: y(v) + 4, 'text-anchor': 'end', class: 'axis' }, yFormat(v)));
  }
  if (opts.yTitle) {
    const cy = (pad.t + height - pad.b) / 2;
    svg.append(el('text', { x: 10, y: cy, transform: `rotate(-90 10 ${cy})`, 'text-anchor': 'middle', class: 'axis title' }, opts.yTitle));
  }
  for (const s of series) {
    if (!s.points.length) continue;
    const pts = s.points.map(([t, v]) => `${x(t).toFixed(1)},${y(v).toFixed(1)}`).join(' ');
    const style = s.color ? `stroke:${s.color}` : '';
    const line = el('polyline', {
      points: pts, class: `line ${s.cls || ''}`.trim(), style, 'data-series': s.name, 'data-points': s.points.length,
      'data-times': s.points.map((p) => p[0]).join(','), 'data-values': s.points.map((p) => p[1]).join(','),
    });
    line.append(el('title', {}, s.name));
    svg.append(line);
    if (dots)
      for (const [t, v] of s.points)
        svg.append(el('circle', { cx: x(t).toFixed(1), cy: y(v).toFixed(1), r: 2.5, class: 'dot', style: s.color ? `fill:${s.color}` : '' }));
  }
  const base = height - pad.b;
  if (ticks) {
    const fmt = opts.tickFormat || ((t) => new Date(t).toLocaleTimeString());
    for (const t of ticks) {
      svg.append(el('line', { x1: x(t), x2: x(t), y1: base, y2: base + 4, class: 'tick' }));
      svg.append(el('text', { x: x(t), y: base + 15, 'text-anchor': 'middle', class: 'axis' }, fmt(t)));
    }
  } else {
    svg.append(el('text', { x: width - pad.r, y: height - 4, 'text-anchor': 'end', class: 'axis' },
      all.length ? new Date(t1).toLocaleTimeString() : ''));
  }
  if (opts.xTitle)
    svg.append(el('text', { x: (pad.l + width - pad.r) / 2, y: height - 3, 'text-anchor': 'middle', class: 'axis title' }, opts.xTitle));
  return svg;
}

// chart.js -- a line chart of metric samples as SVG (drawn here: no chart library).
const NS = 'http://www.w3.org/2000/svg';

function el(tag, attrs) {
  const e = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
  return e;
}

// series: [{name, cls, points: [[t_ms, value 0..100]]}]; returns an <svg> with one polyline each.
export function lineChart(series, { width = 640, height = 180, label = 'chart' } = {}) {
  const pad = { l: 36, r: 8, t: 8, b: 20 };
  const svg = el('svg', { viewBox: `0 0 ${width} ${height}`, class: 'chart', role: 'img', 'aria-label': label });
  const all = series.flatMap((s) => s.points);
  const t0 = Math.min(...all.map((p) => p[0]));
  const t1 = Math.max(...all.map((p) => p[0]));
  const span = t1 > t0 ? t1 - t0 : 1;
  const x = (t) => pad.l + ((t - t0) / span) * (width - pad.l - pad.r);
  const y = (v) => pad.t + (1 - Math.min(Math.max(v, 0), 100) / 100) * (height - pad.t - pad.b);
  for (const v of [0, 50, 100]) {
    svg.append(el('line', { x1: pad.l, x2: width - pad.r, y1: y(v), y2: y(v), class: 'grid' }));
    const t = el('text', { x: pad.l - 4, y: y(v) + 4, 'text-anchor': 'end', class: 'axis' });
    t.textContent = `${v}%`;
    svg.append(t);
  }
  for (const s of series) {
    if (!s.points.length) continue;
    const pts = s.points.map(([t, v]) => `${x(t).toFixed(1)},${y(v).toFixed(1)}`).join(' ');
    svg.append(el('polyline', { points: pts, class: `line ${s.cls}`, 'data-series': s.name, 'data-points': s.points.length }));
  }
  const t = el('text', { x: width - pad.r, y: height - 4, 'text-anchor': 'end', class: 'axis' });
  t.textContent = all.length ? new Date(t1).toLocaleTimeString() : '';
  svg.append(t);
  return svg;
}

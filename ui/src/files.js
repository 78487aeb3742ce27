// files.js -- a sandbox's file browser: a directory's entries (GET .../files/list), download by link
// (GET .../files, the cookie authenticates), upload (PUT .../files with the raw bytes).
import { api, h, showError, fmtTime, fmtBytes, ApiError } from './api.js';

export function fileBrowser(base, canWrite) {
  let dir = '/root';
  const pathInput = h('input', { id: 'files-path', 'aria-label': 'Directory', value: dir, size: 40 });
  const go = h('button', { type: 'button', id: 'files-go' }, 'Open');
  const up = h('button', { type: 'button', id: 'files-up' }, 'Up');
  const upload = h('input', { type: 'file', id: 'files-upload', 'aria-label': 'Upload a file', multiple: true });
  const status = h('span', { class: 'status', id: 'files-status', role: 'status', 'aria-live': 'polite' });
  const tbody = h('tbody', { id: 'files-rows' });
  const table = h('table', { class: 'list', id: 'files' },
    h('thead', {}, h('tr', {}, ['Name', 'Type', 'Size', 'Modified', ''].map((t) => h('th', { scope: 'col' }, t)))), tbody);

  const join = (d, n) => (d.endsWith('/') ? d + n : `${d}/${n}`);
  const parent = (d) => (d.replace(/\/+$/, '').replace(/\/[^/]*$/, '') || '/');

  async function open(d) {
    showError(null);
    try {
      const res = await api('GET', `${base}/files/list?path=${encodeURIComponent(d)}&depth=1`);
      dir = d;
      pathInput.value = d;
      const entries = (res.entries || []).sort((a, b) => (b.type === 'dir') - (a.type === 'dir') || a.name.localeCompare(b.name));
      tbody.replaceChildren(...entries.map((e) => {
        const p = e.path || join(d, e.name);
        const name = e.type === 'dir'
          ? h('a', { href: '#', onclick: (ev) => { ev.preventDefault(); open(p); } }, `${e.name}/`)
          : e.name;
        const dl = e.type === 'file'
          ? h('a', { href: `${base}/files?path=${encodeURIComponent(p)}`, download: e.name, class: 'download', 'data-path': p }, 'Download')
          : null;
        return h('tr', { dataset: { name: e.name } }, h('td', {}, name), h('td', {}, e.type), h('td', {}, fmtBytes(e.size)),
          h('td', {}, fmtTime(e.mtime)), h('td', {}, dl));
      }));
      table.dataset.dir = d;
    } catch (e) {
      showError(e);
    }
  }

  async function put(file) {
    const path = join(dir, file.name);
    const res = await fetch(`${base}/files?path=${encodeURIComponent(path)}`, {
      method: 'PUT', headers: { 'X-Moat-UI': '1', 'Content-Type': 'application/octet-stream' }, body: file,
    });
    if (!res.ok) {
      let msg = `HTTP ${res.status}`;
      try { msg = (await res.json()).message || msg; } catch (x) { /* not JSON */ }
      throw new ApiError(res.status, null, msg);
    }
  }

  upload.addEventListener('change', async () => {
    showError(null);
    try {
      for (const f of upload.files) {
        status.textContent = `uploading ${f.name} (${fmtBytes(f.size)})…`;
        await put(f);
      }
      status.textContent = `uploaded ${upload.files.length} file(s)`;
      upload.value = '';
      await open(dir);
    } catch (e) {
      status.textContent = '';
      showError(e);
    }
  });
  go.addEventListener('click', () => open(pathInput.value || '/'));
  pathInput.addEventListener('keydown', (ev) => { if (ev.key === 'Enter') open(pathInput.value || '/'); });
  up.addEventListener('click', () => open(parent(dir)));

  const el = h('section', {}, h('h2', {}, 'Files'),
    h('div', { class: 'toolbar' }, pathInput, go, up,
      canWrite ? [h('label', { for: 'files-upload' }, 'Upload'), upload] : null, status),
    h('div', { class: 'scroll' }, table));
  return { el, open: () => open(dir) };
}

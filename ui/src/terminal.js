// terminal.js -- xterm.js over GET /v1/sandboxes/{id}/pty: binary frames carry bytes both ways, a
// text frame {type: resize, cols, rows} follows the terminal's size (the session cookie authenticates).
import { Terminal } from './vendor/xterm.mjs';
import { FitAddon } from './vendor/addon-fit.mjs';

export function openTerminal(container, sandboxId, onStatus) {
  const term = new Terminal({ convertEol: false, cursorBlink: true, fontSize: 13, scrollback: 2000 });
  const fit = new FitAddon();
  term.loadAddon(fit);
  term.open(container);
  try { fit.fit(); } catch (e) { /* not laid out yet */ }
  const proto = location.protocol === 'https:' ? 'wss:' : 'ws:';
  const url = `${proto}//${location.host}/v1/sandboxes/${encodeURIComponent(sandboxId)}/pty?cols=${term.cols}&rows=${term.rows}`;
  const ws = new WebSocket(url);
  ws.binaryType = 'arraybuffer';
  const enc = new TextEncoder();
  ws.onopen = () => { onStatus('connected'); term.focus(); };
  ws.onmessage = (ev) => {
    if (typeof ev.data === 'string') {
      try {
        const m = JSON.parse(ev.data);
        if (m.type === 'error') onStatus(`error: ${m.message}`);
      } catch (e) { term.write(ev.data); }
    } else {
      term.write(new Uint8Array(ev.data));
    }
  };
  ws.onclose = (ev) => onStatus(`closed (${ev.code})`);
  ws.onerror = () => onStatus('connection failed');
  term.onData((d) => { if (ws.readyState === WebSocket.OPEN) ws.send(enc.encode(d)); });
  term.onBinary((d) => {
    if (ws.readyState !== WebSocket.OPEN) return;
    const b = new Uint8Array(d.length);
    for (let i = 0; i < d.length; i++) b[i] = d.charCodeAt(i) & 0xff;
    ws.send(b);
  });
  term.onResize(({ cols, rows }) => {
    container.dataset.cols = cols;
    container.dataset.rows = rows;
    if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ type: 'resize', cols, rows }));
  });
  container.dataset.cols = term.cols;
  container.dataset.rows = term.rows;
  const onWin = () => { try { fit.fit(); } catch (e) { /* hidden */ } };
  window.addEventListener('resize', onWin);
  const ro = new ResizeObserver(onWin);
  ro.observe(container);
  return {
    close() {
      window.removeEventListener('resize', onWin);
      ro.disconnect();
      ws.close();
      term.dispose();
    },
  };
}

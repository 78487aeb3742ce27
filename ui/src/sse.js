// sse.js -- a Server-Sent Events stream of the v1 API read with fetch (the session cookie
// authenticates): each event as {name, data} (data parsed as JSON when it is), until the stream ends
// or the signal aborts. Unlike EventSource it never reconnects, so a stream that ends (a build's
// log) is read once.
import { ApiError } from './api.js';

// Resolves when the stream ends (false when aborted first); rejects with an ApiError when moatd
// refuses the request (its {code, message}) or with the network's error.
export async function readEvents(path, onEvent, signal) {
  let res;
  try {
    res = await fetch(path, { headers: { Accept: 'text/event-stream' }, credentials: 'same-origin', signal });
  } catch (e) {
    if (signal && signal.aborted) return false;
    throw e;
  }
  if (!res.ok) {
    let data = null;
    try {
      data = await res.json();
    } catch (e) {
      data = null;
    }
    throw new ApiError(res.status, data && data.code, data && data.message ? data.message : `HTTP ${res.status}`);
  }
  const reader = res.body.getReader();
  const dec = new TextDecoder();
  let buf = '';
  const dispatch = (block) => {
    let name = 'message';
    const data = [];
    for (const line of block.split('\n')) {
      if (!line || line.startsWith(':')) continue;
      const i = line.indexOf(':');
      const field = i < 0 ? line : line.slice(0, i);
      const value = i < 0 ? '' : line.slice(i + 1).replace(/^ /, '');
      if (field === 'event') name = value;
      else if (field === 'data') data.push(value);
    }
    if (!data.length) return;
    const text = data.join('\n');
    let parsed = text;
    try {
      parsed = JSON.parse(text);
    } catch (e) {
      parsed = text;
    }
    onEvent({ name, data: parsed });
  };
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += dec.decode(value, { stream: true }).replace(/\r\n?/g, '\n');
      let end;
      while ((end = buf.indexOf('\n\n')) >= 0) {
        const block = buf.slice(0, end);
        buf = buf.slice(end + 2);
        dispatch(block);
      }
    }
  } catch (e) {
    if (signal && signal.aborted) return false;
    throw e;
  }
  if (buf.trim()) dispatch(buf);
  return true;
}

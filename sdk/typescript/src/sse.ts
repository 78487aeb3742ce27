// sse.ts -- reads server-sent events from a fetch response body.
//
// moatd's streams (exec/stream, process streams, file watches, code runs) are text/event-stream:
// `event: NAME\ndata: JSON\n\n` per event and `: comment` lines (`: keep-alive` after 15 s of
// silence, `: watching` when a watch is in place). The reader never hangs: a connection that drops
// rejects at once, and one that stays silent for longer than idleTimeoutMs (no event, no
// keep-alive) is aborted and rejects with ConnectionError.

import { ConnectionError, MoatError } from './errors.js';

/** Default idle limit for streams: four of moatd's 15 s keep-alive periods. */
export const DEFAULT_IDLE_TIMEOUT_MS = 60_000;

export type SseItem = { kind: 'event'; event: string; data: string } | { kind: 'comment'; text: string };

export interface SseSource {
  res: Response;
  ctl: AbortController;
  done: () => void;
}

/** Yields the stream's events and comments in order; returns at a clean end of the body. Closing
 *  the iterator early (break, return()) aborts the request. */
export async function* readSse(src: SseSource, where: string, idleTimeoutMs: number = DEFAULT_IDLE_TIMEOUT_MS): AsyncGenerator<SseItem> {
  const body = src.res.body;
  if (!body) {
    src.done();
    throw new ConnectionError(`${where}: the answer has no body`, 'stream_ended', 0);
  }
  const reader = body.getReader();
  const dec = new TextDecoder();
  let buf = '';
  let event = '';
  let data: string[] = [];
  let finished = false;
  try {
    for (;;) {
      let timer: ReturnType<typeof setTimeout> | undefined;
      let chunk: { done: boolean; value?: Uint8Array };
      try {
        chunk = await Promise.race([
          reader.read(),
          new Promise<never>((_, reject) => {
            timer = setTimeout(
              () => reject(new ConnectionError(`${where}: no data for ${idleTimeoutMs} ms (connection lost?)`, 'stream_idle', 0)),
              idleTimeoutMs,
            );
          }),
        ]);
      } catch (e) {
        if (e instanceof MoatError) throw e;
        if (src.ctl.signal.aborted) throw src.ctl.signal.reason ?? e;
        const cause = (e as { cause?: { code?: string } })?.cause;
        throw new ConnectionError(`${where}: the stream broke: ${cause?.code ?? (e as Error)?.message ?? String(e)}`, 'connection_error', 0, {
          cause: e,
        });
      } finally {
        clearTimeout(timer);
      }
      if (chunk.done) {
        finished = true;
        return;
      }
      buf += dec.decode(chunk.value!, { stream: true });
      let pos = 0; // lines before pos are consumed; buf is cut once per chunk, not once per line
      let nl: number;
      while ((nl = buf.indexOf('\n', pos)) >= 0) {
        let line = buf.slice(pos, nl);
        pos = nl + 1;
        if (line.endsWith('\r')) line = line.slice(0, -1);
        if (line === '') {
          if (data.length > 0 || event) {
            const item: SseItem = { kind: 'event', event: event || 'message', data: data.join('\n') };
            event = '';
            data = [];
            yield item;
          }
          continue;
        }
        if (line.startsWith(':')) {
          yield { kind: 'comment', text: line.slice(1).trim() };
          continue;
        }
        const colon = line.indexOf(':');
        const field = colon < 0 ? line : line.slice(0, colon);
        let value = colon < 0 ? '' : line.slice(colon + 1);
        if (value.startsWith(' ')) value = value.slice(1);
        if (field === 'event') event = value;
        else if (field === 'data') data.push(value);
      }
      buf = buf.slice(pos);
    }
  } finally {
    src.done();
    if (!finished) {
      src.ctl.abort(new ConnectionError(`${where}: stream closed by the client`, 'stream_closed', 0));
      reader.cancel().catch(() => {});
    }
  }
}

/** Parses an event's JSON data; a malformed one is a protocol error. */
export function eventJson(where: string, item: { event: string; data: string }): Record<string, unknown> {
  try {
    const v = JSON.parse(item.data);
    if (v && typeof v === 'object') return v as Record<string, unknown>;
  } catch {
    /* below */
  }
  throw new MoatError(`${where}: malformed '${item.event}' event: ${item.data.slice(0, 200)}`, 'protocol_error', 0);
}

/** The bytes of an output event {data, encoding: "utf8"|"base64"}, and its text. */
export function outputChunk(where: string, d: Record<string, unknown>): { text: string; bytes: Uint8Array } {
  const s = typeof d.data === 'string' ? d.data : '';
  if (d.encoding === 'base64') {
    const b = Buffer.from(s, 'base64');
    const bytes = new Uint8Array(b.buffer, b.byteOffset, b.byteLength);
    return { text: new TextDecoder().decode(bytes), bytes };
  }
  if (d.encoding !== undefined && d.encoding !== 'utf8') {
    throw new MoatError(`${where}: unknown output encoding ${JSON.stringify(d.encoding)}`, 'protocol_error', 0);
  }
  return { text: s, bytes: new TextEncoder().encode(s) };
}

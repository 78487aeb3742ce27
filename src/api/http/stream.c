/* stream.c -- a response that lasts as long as its source has records: SSE and NDJSON streams
 *
 * Each stream is an MHD callback response of unknown size (chunked): the callback runs on the
 * connection's own thread (one thread per connection), asks the source for its next records with a
 * short wait and returns them, so that MHD writes every record as its own chunk as soon as it
 * exists. Between asks it checks the client socket for a hang-up (noticed within the source's poll
 * interval) and sends the source's keep-alive after --stream-keepalive-ms (default 15 s) of silence; when
 * moatd stops, the source writes its last record. The free callback runs once MHD is done with the response.
 */
#include <microhttpd.h>
#include <stdlib.h>
#include <string.h>

#include "../../common/buf.h"
#include "http.h"

#define STREAM_BLOCK (64 * 1024)
#define STREAM_POLL_MS 500
static unsigned stream_keepalive_ms = API_DEFAULT_STREAM_KEEPALIVE_MS;

void api_stream_set_keepalive_ms(unsigned ms) {
  __atomic_store_n(&stream_keepalive_ms, ms ? ms : API_DEFAULT_STREAM_KEEPALIVE_MS, __ATOMIC_RELAXED);
}

struct stream {
  struct moat_api *api;
  int client_fd; /* not owned: MHD's socket */
  struct api_stream_source src;
  struct moat_buf out; /* records not yet handed to MHD */
  size_t out_pos;
  bool done; /* the last record is in out */
  uint64_t last_ns;
  struct api_key_watch key; /* the stream ends once its key is revoked */
  bool sse;
};

void api_sse_format(struct moat_buf *out, const char *name, json_t *data) {
  char *js = json_dumps(data, JSON_COMPACT | JSON_ENCODE_ANY);
  json_decref(data);
  if (!js)
    abort(); /* only on out-of-memory: jansson dumps any value it built */
  moat_buf_append(out, "event: ", 7);
  moat_buf_append(out, name, strlen(name));
  moat_buf_append(out, "\ndata: ", 7);
  moat_buf_append(out, js, strlen(js));
  moat_buf_append(out, "\n\n", 2);
  free(js);
}

static ssize_t stream_cb(void *cls, uint64_t pos, char *buf, size_t max) {
  struct stream *s = cls;
  for (;;) {
    if (s->out_pos < s->out.len) {
      size_t n = s->out.len - s->out_pos;
      if (n > max)
        n = max;
      memcpy(buf, s->out.p + s->out_pos, n);
      s->out_pos += n;
      s->last_ns = now_ns();
      return (ssize_t)n;
    }
    s->out.len = s->out_pos = 0;
    if (s->src.aborted && s->src.aborted(s->src.ctx))
      return MHD_CONTENT_READER_END_WITH_ERROR;
    if (s->done)
      return MHD_CONTENT_READER_END_OF_STREAM;
    if (api_key_watch_revoked(&s->key)) {
      if (!s->sse)
        return MHD_CONTENT_READER_END_WITH_ERROR;
      api_sse_format(&s->out, "error",
                     api_error_json("unauthorized", "the API key of this stream was revoked"));
      s->done = true;
      continue;
    }
    if (api_stopping(s->api)) {
      if (s->src.stopping)
        s->src.stopping(s->src.ctx, &s->out);
      else
        api_sse_format(&s->out, "error", api_error_json("unavailable", "moatd is stopping"));
      s->done = true;
      continue;
    }
    if (api_client_gone(s->client_fd)) {
      if (s->src.gone)
        s->src.gone(s->src.ctx);
      return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    if (now_ns() - s->last_ns >= __atomic_load_n(&stream_keepalive_ms, __ATOMIC_RELAXED) * 1000000ULL) {
      const char *k = s->src.keepalive ? s->src.keepalive : ": keep-alive\n\n";
      moat_buf_append(&s->out, k, strlen(k));
      continue;
    }
    s->src.next(s->src.ctx, &s->out, s->src.poll_ms ? s->src.poll_ms : STREAM_POLL_MS, &s->done);
  }
}

static void stream_free(void *cls) {
  struct stream *s = cls;
  if (s->src.free)
    s->src.free(s->src.ctx);
  free(s->out.p);
  free(s);
}

int api_stream_reply(struct api_req *r, const struct api_stream_source *src, const char *content_type,
                     const char *first) {
  struct stream *s = xcalloc(1, sizeof(*s));
  s->api = r->api;
  s->client_fd = api_conn_fd(r);
  s->last_ns = now_ns();
  s->src = *src;
  api_key_watch_init(&s->key, r);
  s->sse = strstr(content_type, "event-stream") != NULL;
  if (first)
    moat_buf_append(&s->out, first, strlen(first));
  struct MHD_Response *resp =
      MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, STREAM_BLOCK, stream_cb, s, stream_free);
  if (!resp) {
    stream_free(s);
    return api_reply_error(r, 500, "internal", "could not create a response");
  }
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
  MHD_add_response_header(resp, "X-Accel-Buffering", "no");
  int ret = api_reply_response(r, 200, resp);
  MHD_destroy_response(resp); /* MHD keeps its own reference; stream_free runs when it is done */
  return ret;
}

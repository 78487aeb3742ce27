/* stream.c -- Server-Sent Events: POST .../exec/stream, GET .../processes/{p}/stream, GET .../files/watch
 *
 * Each stream is an MHD callback response of unknown size (chunked): the callback runs on the
 * connection's own thread (one thread per connection), pulls the next guest event with a short
 * timeout, formats it as "event: NAME\ndata: JSON\n\n" and returns it, so that MHD writes every
 * event as its own chunk as soon as it exists. Between pulls it checks the client socket for a
 * hang-up (noticed within SSE_POLL_MS) and sends a keep-alive comment after SSE_KEEPALIVE_MS of
 * silence. The free callback closes the guest side; for an exec/stream without
 * kill_on_disconnect the guest keeps the process.
 */
#include <errno.h>
#include <microhttpd.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>

#include "../../common/buf.h"
#include "../../common/log.h"
#include "../api_internal.h"

#define SSE_BLOCK (64 * 1024)
#define SSE_POLL_MS 500
#define SSE_KEEPALIVE_MS 15000

struct sse {
  struct moat_api *api;
  int client_fd; /* not owned: MHD's socket */
  struct moat_proc_stream *ps;
  struct moat_watch *w;
  struct moat_buf out; /* formatted events not yet handed to MHD */
  size_t out_pos;
  char carry[2][4]; /* stdout, stderr: a UTF-8 sequence cut by the end of the last chunk */
  size_t carry_len[2];
  bool done; /* the last event is in out */
  uint64_t last_ns;
  char *desc;
  void *stdin_data; /* exec/stream: the stream's stdin feeder reads it until the stream closes */
  struct api_sse_source src; /* a stream of another file (src.next non-NULL), e.g. api_events.c */
};

static void out_add(struct sse *s, const char *p, size_t n) { moat_buf_append(&s->out, p, n); }

void api_sse_format(struct moat_buf *out, const char *name, json_t *data) {
  char *js = json_dumps(data, JSON_COMPACT | JSON_ENCODE_ANY);
  json_decref(data);
  if (!js)
    abort();
  moat_buf_append(out, "event: ", 7);
  moat_buf_append(out, name, strlen(name));
  moat_buf_append(out, "\ndata: ", 7);
  moat_buf_append(out, js, strlen(js));
  moat_buf_append(out, "\n\n", 2);
  free(js);
}

/* Appends one event; data is consumed. */
static void sse_event(struct sse *s, const char *name, json_t *data) { api_sse_format(&s->out, name, data); }

static void sse_error(struct sse *s, const char *code, const char *msg) {
  sse_event(s, "error", api_error_json(code, msg));
  s->done = true;
}

static void sse_moat_error(struct sse *s, moat_error **err) {
  const char *code;
  api_errno_http(*err ? (*err)->status : 0, &code);
  log_warn("stream %s: %s", s->desc, moat_error_msg(*err));
  sse_error(s, code, moat_error_msg(*err));
  moat_error_free(err);
}

/* Appends p as the body of a JSON string: valid UTF-8 passes through, '"', '\\' and control
 * characters are escaped. This is the hot path of a stream (jansson's json_dumps of each chunk
 * cost moatd most of a core at ~120 MiB/s). */
static void out_json_chars(struct sse *s, const char *p, size_t n) {
  static const char hex[] = "0123456789abcdef";
  size_t start = 0;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)p[i];
    if (c >= 0x20 && c != '"' && c != '\\')
      continue;
    out_add(s, p + start, i - start);
    char esc[6] = {'\\', 0};
    size_t el = 2;
    switch (c) {
    case '"': esc[1] = '"'; break;
    case '\\': esc[1] = '\\'; break;
    case '\n': esc[1] = 'n'; break;
    case '\r': esc[1] = 'r'; break;
    case '\t': esc[1] = 't'; break;
    case '\b': esc[1] = 'b'; break;
    case '\f': esc[1] = 'f'; break;
    default:
      esc[1] = 'u';
      esc[2] = '0';
      esc[3] = '0';
      esc[4] = hex[c >> 4];
      esc[5] = hex[c & 15];
      el = 6;
    }
    out_add(s, esc, el);
    start = i + 1;
  }
  out_add(s, p + start, n - start);
}

#define OUT_LIT(s, lit) out_add((s), (lit), sizeof(lit) - 1)

static void emit_bytes(struct sse *s, const char *name, const char *p, size_t n, bool utf8) {
  OUT_LIT(s, "event: ");
  out_add(s, name, strlen(name));
  OUT_LIT(s, "\ndata: {\"data\":\"");
  if (utf8) {
    out_json_chars(s, p, n);
    OUT_LIT(s, "\",\"encoding\":\"utf8\"}\n\n");
  } else {
    size_t bl;
    char *b = moat_base64_encode(p, n, &bl);
    out_add(s, b, bl);
    free(b);
    OUT_LIT(s, "\",\"encoding\":\"base64\"}\n\n");
  }
}

/* stdout/stderr bytes: valid UTF-8 goes as text, with a cut-off trailing sequence carried over to
 * the next chunk; a chunk with ill-formed bytes goes whole as base64. */
static void emit_output(struct sse *s, int which, const char *data, size_t len) {
  const char *name = which == 0 ? "stdout" : "stderr";
  size_t cl = s->carry_len[which], n = cl + len;
  char *buf = xmalloc(n ? n : 1);
  memcpy(buf, s->carry[which], cl);
  memcpy(buf + cl, data, len);
  bool valid;
  size_t cut = api_utf8_stream_split(buf, n, &valid);
  s->carry_len[which] = 0;
  if (!valid) {
    emit_bytes(s, name, buf, n, false);
  } else {
    if (cut > 0)
      emit_bytes(s, name, buf, cut, true);
    memcpy(s->carry[which], buf + cut, n - cut); /* < 4 bytes by api_utf8_stream_split */
    s->carry_len[which] = n - cut;
  }
  free(buf);
}

static void flush_carry(struct sse *s) {
  for (int i = 0; i < 2; i++) {
    if (s->carry_len[i])
      emit_bytes(s, i == 0 ? "stdout" : "stderr", s->carry[i], s->carry_len[i], false);
    s->carry_len[i] = 0;
  }
}

/* Pulls one guest event (waiting up to timeout_ms) into out. */
static void pull(struct sse *s, int timeout_ms) {
  moat_error *err = NULL;
  if (s->src.next) {
    s->src.next(s->src.ctx, &s->out, timeout_ms, &s->done);
    return;
  }
  if (s->w) {
    struct moat_watch_event ev;
    int rc = moat_watch_next(s->w, &ev, timeout_ms, &err);
    if (rc < 0 && err && err->status == ETIMEDOUT) {
      moat_error_free(&err);
      return;
    }
    if (rc < 0)
      return sse_moat_error(s, &err);
    if (rc == 0)
      return sse_error(s, "sandbox_unreachable", "the watch ended (the sandbox went away)");
    json_t *d = json_pack("{s:s, s:o}", "event", ev.event, "path", api_str_json(ev.path));
    if (ev.path2)
      json_object_set_new(d, "path2", api_str_json(ev.path2));
    sse_event(s, ev.event, d);
    return;
  }
  struct moat_proc_event ev;
  int rc = moat_proc_stream_next(s->ps, &ev, timeout_ms, &err);
  if (rc < 0 && err && err->status == ETIMEDOUT) {
    moat_error_free(&err);
    return;
  }
  if (rc < 0) {
    flush_carry(s);
    return sse_moat_error(s, &err);
  }
  if (rc == 0) {
    flush_carry(s);
    return sse_error(s, "sandbox_unreachable", "the process stream ended without an exit status");
  }
  switch (ev.type) {
  case MOAT_PROC_STDOUT:
  case MOAT_PROC_STDERR:
    emit_output(s, ev.type == MOAT_PROC_STDOUT ? 0 : 1, ev.data, ev.len);
    break;
  case MOAT_PROC_DROPPED:
    sse_event(s, "dropped", json_pack("{s:I}", "bytes", (json_int_t)ev.dropped));
    break;
  case MOAT_PROC_EXIT:
    flush_carry(s);
    sse_event(s, "exit",
              json_pack("{s:i, s:i, s:b}", "exit_code", ev.exit_code, "signal", ev.signal, "timed_out",
                        ev.timed_out));
    s->done = true;
    break;
  }
}


static ssize_t sse_cb(void *cls, uint64_t pos, char *buf, size_t max) {
  struct sse *s = cls;
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
    if (s->done)
      return MHD_CONTENT_READER_END_OF_STREAM;
    if (api_stopping(s->api)) {
      flush_carry(s);
      sse_error(s, "unavailable", "moatd is stopping");
      continue;
    }
    if (api_client_gone(s->client_fd))
      return MHD_CONTENT_READER_END_WITH_ERROR;
    if (now_ns() - s->last_ns >= SSE_KEEPALIVE_MS * 1000000ULL) {
      out_add(s, ": keep-alive\n\n", 14);
      continue;
    }
    pull(s, SSE_POLL_MS);
  }
}

static void sse_free(void *cls) {
  struct sse *s = cls;
  if (s->ps)
    moat_proc_stream_close(s->ps);
  if (s->w)
    moat_watch_close(s->w);
  if (s->src.free)
    s->src.free(s->src.ctx);
  free(s->stdin_data);
  free(s->out.p);
  free(s->desc);
  free(s);
}

static struct sse *sse_new(struct api_req *r) {
  struct sse *s = xcalloc(1, sizeof(*s));
  s->api = r->api;
  s->client_fd = api_conn_fd(r);
  s->last_ns = now_ns();
  s->desc = xasprintf("%s %.200s", r->route.id, api_route_name(&r->route));
  return s;
}

/* Queues the SSE response of s (which it then owns, also on failure). */
static int sse_reply(struct api_req *r, struct sse *s) {
  struct MHD_Response *resp =
      MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, SSE_BLOCK, sse_cb, s, sse_free);
  if (!resp) {
    sse_free(s);
    return api_reply_error(r, 500, "internal", "could not create a response");
  }
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
  MHD_add_response_header(resp, "X-Accel-Buffering", "no");
  int ret = api_reply_response(r, 200, resp);
  MHD_destroy_response(resp); /* MHD keeps its own reference; sse_free runs when it is done */
  return ret;
}

int api_h_exec_stream(struct api_req *r, json_t *body) {
  static const char *const none[] = {NULL};
  moat_error *err = NULL;
  struct moat_exec_req req;
  struct api_exec_extra x;
  if (api_args_check(&r->args, none, &err) < 0)
    return api_reply_moat_error(r, &err);
  if (api_parse_exec_ex(body, API_EXEC_STREAM, &req, &x, &err) < 0)
    return api_reply_moat_error(r, &err);
  _cleanup_strv_ char **senv = NULL;
  _cleanup_free_ struct moat_guest_ep *sock = api_guest_sock(r, &senv, &err);
  if (!sock) {
    api_exec_req_clear(&req);
    return api_reply_moat_error(r, &err);
  }
  _cleanup_strv_ char **env = strv_concat(senv, req.env);
  struct moat_exec_req rq = req;
  rq.env = env;
  rq.max_output = UINT64_MAX; /* a stream has no cap: the client consumes it as it comes */
  struct moat_exec_opts opts = {
      .tag = x.tag,
      .pty_cols = x.pty_cols,
      .pty_rows = x.pty_rows,
      .keep_on_disconnect = !x.kill_on_disconnect,
  };
  struct moat_proc_stream *ps = NULL;
  int pid = 0;
  int rc = moat_guest_exec_start(sock, &rq, &opts, &ps, &pid, &err);
  if (rc < 0) {
    api_exec_req_clear(&req);
    api_exec_enoent(r, err);
    return api_reply_proc_error(r, &err);
  }
  struct sse *s = sse_new(r);
  s->ps = ps;
  s->stdin_data = (void *)req.stdin_data; /* borrowed by the stream until it closes */
  req.stdin_data = NULL;
  api_exec_req_clear(&req);
  sse_event(s, "start", json_pack("{s:i}", "pid", pid));
  return sse_reply(r, s);
}

int api_h_proc_stream(struct api_req *r, json_t *body) {
  static const char *const allowed[] = {"replay", NULL};
  moat_error *err = NULL;
  bool replay;
  if (api_args_check(&r->args, allowed, &err) < 0 ||
      api_arg_bool(&r->args, "replay", true, &replay, &err) < 0)
    return api_reply_moat_error(r, &err);
  _cleanup_free_ struct moat_guest_ep *sock = api_guest_sock(r, NULL, &err);
  if (!sock)
    return api_reply_moat_error(r, &err);
  struct moat_proc_stream *ps = NULL;
  struct moat_proc_info info;
  memset(&info, 0, sizeof(info));
  if (moat_guest_attach(sock, r->route.pid, r->route.tag[0] ? r->route.tag : NULL, replay, &ps, &info, &err) <
      0)
    return api_reply_proc_error(r, &err);
  struct sse *s = sse_new(r);
  s->ps = ps;
  sse_event(s, "process", api_proc_info_json(&info));
  moat_proc_info_clear(&info);
  return sse_reply(r, s);
}

int api_h_files_watch(struct api_req *r, json_t *body) {
  static const char *const allowed[] = {"path", "recursive", "user", NULL};
  moat_error *err = NULL;
  const char *path, *user;
  bool recursive;
  if (api_args_check(&r->args, allowed, &err) < 0 || api_arg_path(&r->args, "path", &path, &err) < 0 ||
      api_arg_user(&r->args, &user, &err) < 0 ||
      api_arg_bool(&r->args, "recursive", false, &recursive, &err) < 0)
    return api_reply_moat_error(r, &err);
  _cleanup_free_ struct moat_guest_ep *sock = api_guest_sock(r, NULL, &err);
  if (!sock)
    return api_reply_moat_error(r, &err);
  struct moat_watch *w = NULL;
  if (moat_guest_watch(sock, path, user, recursive, &w, &err) < 0)
    return api_reply_moat_error(r, &err);
  struct sse *s = sse_new(r);
  s->w = w;
  /* A comment first, so that the client sees the headers and knows the watch is in place. */
  out_add(s, ": watching\n\n", 12);
  return sse_reply(r, s);
}

int api_sse_reply_source(struct api_req *r, const struct api_sse_source *src, const char *first) {
  struct sse *s = sse_new(r);
  s->src = *src;
  if (first)
    out_add(s, first, strlen(first));
  return sse_reply(r, s);
}

/* stream.c -- Server-Sent Events of the guest: POST .../exec/stream, GET .../processes/{p}/stream,
 * GET .../files/watch
 *
 * Each is a source of the transport's streamed response (http/stream.c): it pulls the next guest
 * event with a short wait and formats it as "event: NAME\ndata: JSON\n\n". Freeing it closes the
 * guest side; for an exec/stream without kill_on_disconnect the guest keeps the process.
 */
#include <errno.h>
#include <microhttpd.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>

#include "../../common/buf.h"
#include "../../common/log.h"
#include "v1.h"

struct sse {
  struct moat_proc_stream *ps;
  struct moat_watch *w;
  char carry[2][4]; /* stdout, stderr: a UTF-8 sequence cut by the end of the last chunk */
  size_t carry_len[2];
  char *desc;
  void *stdin_data; /* exec/stream: the stream's stdin feeder reads it until the stream closes */
  /* exec/stream: what the end event's oom_killed needs (control.h, OOM kills) */
  struct moat_control *ctl;
  char *org, *id, *tag;
  char **argv;
  int pid;
  uint64_t oom_before;
  /* while sse_next runs: the transport's buffer and its end flag */
  struct moat_buf *out;
  bool *done;
};

static void out_add(struct sse *s, const char *p, size_t n) { moat_buf_append(s->out, p, n); }

/* Appends one event; data is consumed. */
static void sse_event(struct sse *s, const char *name, json_t *data) { api_sse_format(s->out, name, data); }

static void sse_error(struct sse *s, const char *code, const char *msg) {
  sse_event(s, "error", api_error_json(code, msg));
  *s->done = true;
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
    case '"':
      esc[1] = '"';
      break;
    case '\\':
      esc[1] = '\\';
      break;
    case '\n':
      esc[1] = 'n';
      break;
    case '\r':
      esc[1] = 'r';
      break;
    case '\t':
      esc[1] = 't';
      break;
    case '\b':
      esc[1] = 'b';
      break;
    case '\f':
      esc[1] = 'f';
      break;
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
  case MOAT_PROC_EXIT: {
    flush_carry(s);
    json_t *d = json_pack("{s:i, s:i, s:b}", "exit_code", ev.exit_code, "signal", ev.signal, "timed_out",
                          ev.timed_out);
    if (s->ctl) { /* an exec/stream: the command ran from start to end under this stream */
      struct moat_oom_proc p = {.pid = s->pid, .argv = s->argv, .tag = s->tag};
      bool oom = moat_control_oom_ended(s->ctl, s->org, s->id, s->oom_before, &p, ev.exit_code, ev.signal);
      json_object_set_new(d, "oom_killed", json_boolean(oom));
    }
    sse_event(s, "exit", d);
    *s->done = true;
    break;
  }
  }
}

static void sse_next(void *ctx, struct moat_buf *out, int timeout_ms, bool *done) {
  struct sse *s = ctx;
  s->out = out;
  s->done = done;
  pull(s, timeout_ms);
}

static void sse_stopping(void *ctx, struct moat_buf *out) {
  struct sse *s = ctx;
  bool done;
  s->out = out;
  s->done = &done;
  flush_carry(s);
  sse_error(s, "unavailable", "moatd is stopping");
}

static void sse_free(void *ctx) {
  struct sse *s = ctx;
  if (s->ps)
    moat_proc_stream_close(s->ps);
  if (s->w)
    moat_watch_close(s->w);
  free(s->stdin_data);
  free(s->desc);
  free(s->org);
  free(s->id);
  free(s->tag);
  strv_free(s->argv);
  free(s);
}

static struct sse *sse_new(struct api_req *r) {
  struct sse *s = xcalloc(1, sizeof(*s));
  s->desc = xasprintf("%s %.200s", r->route.id, api_route_name(&r->route));
  return s;
}

/* Queues the SSE response of s (which it then owns, also on failure); first goes out at once. */
static int sse_reply(struct api_req *r, struct sse *s, const char *first) {
  struct api_stream_source src = {.next = sse_next, .stopping = sse_stopping, .free = sse_free, .ctx = s};
  return api_stream_reply(r, &src, "text/event-stream", first);
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
  uint64_t oom_before = moat_control_oom_count(api_control(r), r->org, r->route.id);
  int rc = moat_guest_exec_start(sock, &rq, &opts, &ps, &pid, &err);
  if (rc < 0) {
    api_exec_req_clear(&req);
    api_exec_enoent(r, err);
    return api_reply_proc_error(r, &err);
  }
  struct sse *s = sse_new(r);
  s->ps = ps;
  s->ctl = api_control(r);
  s->org = xstrdup(r->org);
  s->id = xstrdup(r->route.id);
  s->tag = x.tag ? xstrdup(x.tag) : NULL;
  s->argv = strv_dup(req.argv);
  s->pid = pid;
  s->oom_before = oom_before;
  s->stdin_data = (void *)req.stdin_data; /* borrowed by the stream until it closes */
  req.stdin_data = NULL;
  api_exec_req_clear(&req);
  struct moat_buf first = {0};
  api_sse_format(&first, "start", json_pack("{s:i}", "pid", pid));
  moat_buf_append(&first, "", 1);
  int ret = sse_reply(r, s, first.p);
  free(first.p);
  return ret;
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
  struct moat_buf first = {0};
  api_sse_format(&first, "process", api_proc_info_json(&info));
  moat_buf_append(&first, "", 1);
  moat_proc_info_clear(&info);
  int ret = sse_reply(r, s, first.p);
  free(first.p);
  return ret;
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
  return sse_reply(r, s, ": watching\n\n");
}

/* contexts.c -- v1 routes of code contexts (control/contexts.c): create, list, delete, restart, run
 *
 * A run answers one JSON object once the cell ended {execution_count, timed_out, restarted,
 * [exit_code,] stdout, stderr, results, error[, truncated]}, or, with "stream": true or
 * Accept: text/event-stream, SSE events stdout/stderr {text}, result {...}, error {...} and end
 * {execution_count, timed_out, restarted[, exit_code]}. A client that leaves interrupts the cell.
 * A second run while one is in progress is answered 409 context_busy at once.
 */
#include <errno.h>
#include <microhttpd.h>
#include <stdlib.h>
#include <string.h>

#include "../../common/buf.h"
#include "v1.h"

#define CTX_DEFAULT_TIMEOUT_MS 60000
#define CTX_POLL_MS 500
#define CTX_MAX_OUTPUT (16u << 20) /* per stream kept in a whole reply */

/* Replies to a failed context call (an ENOENT of the guest is a missing cwd: 400). Frees *err. */
static int reply_ctx_error(struct api_req *r, moat_error **err) {
  api_exec_enoent(r, *err);
  return api_reply_moat_error(r, err);
}

static json_t *ctx_json(const struct moat_ctx *x) {
  return json_pack("{s:s, s:s, s:s, s:o}", "id", x->id, "language", x->language, "cwd", x->cwd ? x->cwd : "",
                   "created_at", api_time_json(x->created_at_ms, false));
}

int api_h_ctx_create(struct api_req *r, json_t *body) {
  moat_error *err = NULL;
  const char *lname = "python", *cwd = "/root";
  const char *key;
  json_t *v;
  json_object_foreach(body, key, v) {
    if (strcmp(key, "language") == 0) {
      if (!json_is_string(v))
        return api_reply_error(r, 400, "invalid_request", "'language' must be a string");
      lname = json_string_value(v);
    } else if (strcmp(key, "cwd") == 0) {
      if (!json_is_string(v))
        return api_reply_error(r, 400, "invalid_request", "'cwd' must be a string");
      cwd = json_string_value(v);
      if (api_check_path("cwd", cwd, json_string_length(v), &err) < 0)
        return api_reply_moat_error(r, &err);
      if (cwd[0] != '/')
        return api_reply_error(r, 400, "invalid_request", "'cwd' must be an absolute path");
    } else {
      return api_reply_error(r, 400, "invalid_request", "unknown field '%.128s'", key);
    }
  }
  if (!moat_ctx_language_known(lname))
    return api_reply_error(r, 400, "invalid_request", "'language' must be python, node or bash, not '%.64s'",
                           lname);
  struct moat_ctx x;
  if (moat_ctx_create(api_control(r), r->org, r->route.id, lname, cwd, NULL, &x, &err) < 0)
    return reply_ctx_error(r, &err);
  int ret = api_reply_json(r, 201, ctx_json(&x));
  moat_ctx_clear(&x);
  return ret;
}

int api_h_ctx_list(struct api_req *r, json_t *body) {
  (void)body;
  moat_error *err = NULL;
  struct moat_ctx *v = NULL;
  size_t n = 0;
  if (moat_ctx_list(api_control(r), r->org, r->route.id, &v, &n, &err) < 0)
    return api_reply_moat_error(r, &err);
  json_t *arr = json_array();
  for (size_t i = 0; i < n; i++)
    json_array_append_new(arr, ctx_json(&v[i]));
  moat_ctxs_free(v, n);
  return api_reply_json(r, 200, json_pack("{s:o}", "contexts", arr));
}

int api_h_ctx_delete(struct api_req *r, json_t *body) {
  (void)body;
  moat_error *err = NULL;
  if (moat_ctx_delete(api_control(r), r->org, r->route.id, r->route.cid, &err) < 0)
    return api_reply_moat_error(r, &err);
  return api_reply_empty(r, 204);
}

int api_h_ctx_restart(struct api_req *r, json_t *body) {
  moat_error *err = NULL;
  if (json_object_size(body) > 0)
    return api_reply_error(r, 400, "invalid_request", "unknown field '%.128s'",
                           json_object_iter_key(json_object_iter(body)));
  struct moat_ctx x;
  if (moat_ctx_restart(api_control(r), r->org, r->route.id, r->route.cid, &x, &err) < 0)
    return reply_ctx_error(r, &err);
  int ret = api_reply_json(r, 200, ctx_json(&x));
  moat_ctx_clear(&x);
  return ret;
}

/* ---- runs ---- */

static json_t *end_json(const struct moat_ctx_outcome *o) {
  json_t *j = json_pack("{s:i, s:b, s:b}", "execution_count", o->execution_count, "timed_out", o->timed_out,
                        "restarted", o->restarted);
  if (o->has_exit_code)
    json_object_set_new(j, "exit_code", json_integer(o->exit_code));
  return j;
}

static json_t *text_json(const char *p, size_t n) {
  size_t sl;
  _cleanup_free_ char *s = api_utf8_sanitize(p ? p : "", n, &sl, NULL);
  return json_stringn(s, sl);
}

static const char *const stream_names[2] = {"stdout", "stderr"};

/* SSE: the run's events as they come. */
static void sse_next(void *ctx, struct moat_buf *out, int timeout_ms, bool *done) {
  struct moat_ctx_run *u = ctx;
  struct moat_ctx_event ev;
  for (int wait = timeout_ms; moat_ctx_run_next(u, &ev, wait) == 1; wait = 0) {
    if (ev.type == MOAT_CTX_STDOUT || ev.type == MOAT_CTX_STDERR) {
      api_sse_format(out, stream_names[ev.type == MOAT_CTX_STDERR],
                     json_pack("{s:o}", "text", text_json(ev.text, ev.len)));
    } else if (ev.type == MOAT_CTX_RESULT) {
      api_sse_format(out, "result", json_incref(ev.result));
    } else {
      const struct moat_ctx_outcome *o = moat_ctx_run_outcome(u);
      if (o->error)
        api_sse_format(out, "error", json_incref(o->error));
      api_sse_format(out, "end", end_json(o));
      *done = true;
      return;
    }
    if (out->len >= 64 * 1024)
      return;
  }
}

static void sse_gone(void *ctx) { moat_ctx_run_interrupt(ctx); } /* frees the context for the next run */
static void sse_free(void *ctx) { moat_ctx_run_close(ctx); }

/* The whole reply once the cell ended. */
static int run_whole(struct api_req *r, struct moat_ctx_run *u) {
  struct moat_buf text[2] = {{0}, {0}};
  bool trunc = false;
  json_t *results = json_array();
  struct moat_ctx_event ev;
  bool ended = false;
  struct api_key_watch key;
  api_key_watch_init(&key, r);
  while (!ended && !api_stopping(r->api) && !api_key_watch_revoked(&key)) {
    if (moat_ctx_run_next(u, &ev, CTX_POLL_MS) != 1)
      continue;
    if (ev.type == MOAT_CTX_STDOUT || ev.type == MOAT_CTX_STDERR) {
      struct moat_buf *b = &text[ev.type == MOAT_CTX_STDERR];
      size_t n = ev.len;
      if (b->len + n > CTX_MAX_OUTPUT) {
        n = CTX_MAX_OUTPUT - b->len;
        trunc = true;
      }
      moat_buf_append(b, ev.text, n);
    } else if (ev.type == MOAT_CTX_RESULT) {
      json_array_append(results, ev.result);
    } else {
      ended = true;
    }
  }
  int ret;
  if (!ended) {
    ret = api_reply_error(r, 503, "unavailable", "moatd is stopping");
  } else {
    const struct moat_ctx_outcome *o = moat_ctx_run_outcome(u);
    json_t *j = end_json(o);
    json_object_set_new(j, "stdout", text_json(text[0].p, text[0].len));
    json_object_set_new(j, "stderr", text_json(text[1].p, text[1].len));
    json_object_set(j, "results", results);
    json_object_set(j, "error", o->error ? o->error : json_null());
    if (trunc)
      json_object_set_new(j, "truncated", json_true());
    ret = api_reply_json(r, 200, j);
  }
  free(text[0].p);
  free(text[1].p);
  json_decref(results);
  moat_ctx_run_close(u);
  return ret;
}

static bool wants_sse(struct api_req *r) {
  const char *a = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_ACCEPT);
  return a && strstr(a, "text/event-stream");
}

int api_h_ctx_run(struct api_req *r, json_t *body) {
  const char *code = NULL;
  size_t code_len = 0;
  uint32_t timeout_ms = CTX_DEFAULT_TIMEOUT_MS;
  bool sse = wants_sse(r);
  const char *key;
  json_t *v;
  json_object_foreach(body, key, v) {
    if (strcmp(key, "code") == 0) {
      if (!json_is_string(v))
        return api_reply_error(r, 400, "invalid_request", "'code' must be a string");
      code = json_string_value(v);
      code_len = json_string_length(v);
    } else if (strcmp(key, "timeout_ms") == 0) {
      if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > API_MAX_TIMEOUT_MS)
        return api_reply_error(r, 400, "invalid_request", "'timeout_ms' must be an integer from 1 to %lld",
                               API_MAX_TIMEOUT_MS);
      timeout_ms = (uint32_t)json_integer_value(v);
    } else if (strcmp(key, "stream") == 0) {
      if (!json_is_boolean(v))
        return api_reply_error(r, 400, "invalid_request", "'stream' must be true or false");
      sse = sse || json_is_true(v);
    } else {
      return api_reply_error(r, 400, "invalid_request", "unknown field '%.128s'", key);
    }
  }
  if (!code)
    return api_reply_error(r, 400, "invalid_request", "'code' is required");
  moat_error *err = NULL;
  struct moat_ctx_run *u = NULL;
  struct moat_ctx_run_opts opts = {.timeout_ms = timeout_ms};
  if (moat_ctx_run_start(api_control(r), r->org, r->route.id, r->route.cid, code, code_len, &opts, &u, &err) <
      0)
    return reply_ctx_error(r, &err);
  if (!sse)
    return run_whole(r, u);
  struct api_stream_source src = {.next = sse_next, .gone = sse_gone, .free = sse_free, .ctx = u};
  return api_stream_reply(r, &src, "text/event-stream", NULL);
}

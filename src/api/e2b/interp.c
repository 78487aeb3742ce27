/* interp.c -- E2B's code interpreter (sandbox port 49999) on moat's code contexts
 *
 * What @e2b/code-interpreter 2.8.0 calls (dist/index.mjs):
 *   POST /execute {code, context_id?, language?, env_vars?} -> newline-delimited JSON, streamed:
 *        stdout/stderr {text}, result {text, png, html, json, is_main_result}, error {name, value,
 *        traceback}, number_of_executions {execution_count}, end_of_execution
 *   POST /contexts {language?, cwd?} -> {id, language, cwd}; GET /contexts -> [...]
 *   DELETE /contexts/{id}; POST /contexts/{id}/restart
 * e2b.c has authenticated the call and set r->org and r->route.id to the sandbox's. Runs go to
 * moat's code contexts (control/contexts.c): without context_id, the language's default context
 * ("e2bdefault<lang>", started on first use in /home/user) keeps state across calls as E2B's does.
 * The SDK applies its own timeout (it closes the connection, and a closed connection interrupts the
 * cell); the server-side limit is API_MAX_TIMEOUT_MS.
 */
#include <errno.h>
#include <stdarg.h>
#include <time.h>
#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../common/buf.h"
#include "e2b_internal.h"

#define E2B_DEFAULT_CWD "/home/user"
#define E2B_CODE_USER "user" /* E2B's Jupyter runs code as "user": files it writes are user's */
#define E2B_GATHER_MS 50     /* output text is gathered this long into one line, as Jupyter does */

/* E2B language names -> moat context language and default context id (16 of [a-z0-9]). */
static const struct {
  const char *e2b, *moat, *cid;
} languages[] = {
    {"python", "python", "e2bdefaultpython"}, {"python3", "python", "e2bdefaultpython"},
    {"js", "node", "e2bdefaultnode00"},       {"javascript", "node", "e2bdefaultnode00"},
    {"node", "node", "e2bdefaultnode00"},     {"bash", "bash", "e2bdefaultbash00"},
};

static int lang_index(const char *name) {
  for (size_t i = 0; i < ARRAY_SIZE(languages); i++)
    if (strcmp(languages[i].e2b, name) == 0)
      return (int)i;
  return -1;
}

/* An error reply that also closes the connection: the SDK reads the body of a 404 or 502 only, and
 * Node's fetch holds a connection whose body nobody read (keeping the agent's process alive until
 * the server's idle timeout); closing it lets the client finish. */
static int interp_error(struct api_req *r, unsigned status, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int interp_error(struct api_req *r, unsigned status, const char *code, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  json_t *j = api_error_json(code, msg);
  char *s = json_dumps(j, JSON_COMPACT);
  json_decref(j);
  if (!s)
    abort();
  struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(s), s, MHD_RESPMEM_MUST_FREE);
  if (!resp) {
    free(s);
    return -1;
  }
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
  int ret = api_reply_response(r, status, resp);
  MHD_destroy_response(resp);
  return ret;
}

static int unsupported_lang(struct api_req *r, const char *name) {
  return interp_error(
      r, 400, "invalid_request",
      "language '%.64s' is not supported by moat's code interpreter (python, javascript, bash)", name);
}

bool e2b_interp_begin(struct api_req *r, struct e2b_req *e, const char *url, const char *method) {
  (void)e, (void)method;
  moat_error *err = NULL;
  if (strcmp(url, "/execute") == 0 && api_req_stream(r, &err) < 0) {
    api_reply_moat_error(r, &err);
    return true;
  }
  const char *cl = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
  uint64_t n;
  if (cl && parse_u64(cl, &n) == 0 && n > API_MAX_BODY) {
    interp_error(r, 413, "payload_too_large", "request body is larger than %d bytes", API_MAX_BODY);
    return true;
  }
  return false;
}

int e2b_interp_body(struct api_req *r, struct e2b_req *e, const char *data, size_t len, moat_error **err) {
  (void)e;
  if (len > API_MAX_BODY - r->body_len)
    return moat_error_set(err, EMSGSIZE, "request body is larger than %d bytes", API_MAX_BODY);
  if (r->body_len + len + 1 > r->body_cap) {
    size_t cap = r->body_cap ? r->body_cap : 4096;
    while (cap < r->body_len + len + 1)
      cap *= 2;
    r->body = xrealloc(r->body, cap);
    r->body_cap = cap;
  }
  memcpy(r->body + r->body_len, data, len);
  r->body_len += len;
  r->body[r->body_len] = '\0';
  return 0;
}

/* Sets r->route.cid; a 404 reply and -1 when id cannot be a context id. */
static int set_cid(struct api_req *r, const char *id) {
  size_t n = strlen(id);
  bool ok = n == 16;
  for (size_t i = 0; ok && i < n; i++)
    ok = (id[i] >= 'a' && id[i] <= 'z') || (id[i] >= '0' && id[i] <= '9');
  if (!ok) {
    api_reply_error(r, 404, "context_not_found", "Context %.64s not found", id);
    return -1;
  }
  memcpy(r->route.cid, id, n + 1);
  return 0;
}

static bool null_or_empty(json_t *v) {
  return !v || json_is_null(v) || (json_is_object(v) && json_object_size(v) == 0);
}

/* ---- /execute: a run as E2B's code interpreter streams it ----
 *
 * One JSON object per line, "type" first read by @e2b/code-interpreter's parseOutput: stdout/stderr
 * {text}, result {text, png, html, json, is_main_result} (absent formats left out), error {name,
 * value, traceback (one string)}, number_of_executions {execution_count} and end_of_execution at
 * the end. A print() arrives as several kernel messages: text is gathered into one line per
 * newline, or after E2B_GATHER_MS. */

struct e2b_run {
  struct moat_ctx_run *u;
  struct moat_control *ctl;
  char *org;
  char id[MOAT_ID_LEN + 1];
  bool cut;                /* the sandbox is gone: drop the connection as E2B's proxy would */
  struct moat_buf pend[2]; /* output text not yet written as a line */
  uint64_t pend_ns[2];     /* when pend[i] became non-empty */
  bool ended;
};

static const char *const stream_names[2] = {"stdout", "stderr"};

static void line_add(struct moat_buf *out, json_t *j) {
  char *js = json_dumps(j, JSON_COMPACT);
  json_decref(j);
  if (!js)
    abort(); /* only on out-of-memory */
  moat_buf_append(out, js, strlen(js));
  moat_buf_append(out, "\n", 1);
  free(js);
}

/* Writes gathered output text as stdout/stderr lines: all of it when all is true, else the text up
 * to the last newline, or all of it once it waited E2B_GATHER_MS (complete UTF-8 characters). */
static void flush_text(struct e2b_run *x, struct moat_buf *out, bool all) {
  for (int w = 0; w < 2; w++) {
    struct moat_buf *b = &x->pend[w];
    if (b->len == 0)
      continue;
    bool valid;
    size_t n = b->len;
    if (!all && now_ns() - x->pend_ns[w] < E2B_GATHER_MS * 1000000ULL) {
      const char *nl = memrchr(b->p, '\n', b->len);
      n = nl ? (size_t)(nl - b->p) + 1 : 0;
    }
    if (n > 0 && n == b->len && !x->ended) {
      n = api_utf8_stream_split(b->p, b->len, &valid);
      if (!valid)
        n = b->len;
    }
    if (n == 0)
      continue;
    size_t sl;
    char *s = api_utf8_sanitize(b->p, n, &sl, NULL);
    /* timestamp: as E2B's server (the Jupyter message's date); the Python SDK reads it */
    line_add(out, json_pack("{s:s, s:s%, s:o}", "type", stream_names[w], "text", s, sl, "timestamp",
                            api_time_json(now_unix_ms(), false)));
    free(s);
    memmove(b->p, b->p + n, b->len - n);
    b->len -= n;
    x->pend_ns[w] = now_ns();
  }
}

/* An error line from {name, value, traceback: [lines]} (or a stream error {code, message}). */
static void error_line(struct moat_buf *out, json_t *e) {
  struct moat_buf b = {0};
  size_t i;
  json_t *line;
  json_array_foreach(json_object_get(e, "traceback"), i, line) {
    if (i)
      moat_buf_append(&b, "\n", 1);
    if (json_is_string(line))
      moat_buf_append(&b, json_string_value(line), json_string_length(line));
  }
  json_t *nm = json_object_get(e, "name"), *val = json_object_get(e, "value");
  if (!nm)
    nm = json_object_get(e, "code"), val = json_object_get(e, "message");
  line_add(out, json_pack("{s:s, s:o, s:o, s:s%}", "type", "error", "name",
                          json_is_string(nm) ? json_incref(nm) : json_string("Error"), "value",
                          json_is_string(val) ? json_incref(val) : json_string(""), "traceback",
                          b.p ? b.p : "", b.len));
  free(b.p);
}

#define E2B_GONE_WAIT_MS 2000
bool e2b_sandbox_gone(struct moat_control *ctl, const char *org, const char *id) {
  for (int waited = 0;; waited += 100) {
    struct moat_sandbox_info info;
    memset(&info, 0, sizeof(info));
    moat_error *err = NULL;
    int rc = moat_control_get(ctl, org, id, &info, &err);
    bool gone = rc < 0 ? err && err->status == ENOENT : info.state == MOAT_SB_KILLED;
    bool running = rc == 0 && info.state == MOAT_SB_RUNNING;
    moat_error_free(&err);
    if (rc == 0)
      moat_sandbox_info_clear(&info);
    if (gone)
      return true;
    if (waited >= E2B_GONE_WAIT_MS || !running)
      return false;
    struct timespec ts = {0, 100 * 1000000L};
    nanosleep(&ts, NULL);
  }
}

static bool run_aborted(void *ctx) { return ((struct e2b_run *)ctx)->cut; }

static void run_next(void *ctx, struct moat_buf *out, int timeout_ms, bool *done) {
  struct e2b_run *x = ctx;
  struct moat_ctx_event ev;
  int wait = x->pend[0].len || x->pend[1].len ? E2B_GATHER_MS / 2 : timeout_ms;
  for (; moat_ctx_run_next(x->u, &ev, wait) == 1; wait = 0) {
    if (ev.type == MOAT_CTX_STDOUT || ev.type == MOAT_CTX_STDERR) {
      struct moat_buf *b = &x->pend[ev.type == MOAT_CTX_STDERR];
      if (b->len == 0)
        x->pend_ns[ev.type == MOAT_CTX_STDERR] = now_ns();
      moat_buf_append(b, ev.text, ev.len);
    } else if (ev.type == MOAT_CTX_RESULT) {
      flush_text(x, out, true);
      json_t *j = json_pack("{s:s}", "type", "result");
      const char *k;
      json_t *v;
      json_object_foreach(ev.result, k, v) {
        if (json_is_null(v))
          continue;
        const char *t = json_string_value(v);
        size_t tl = json_string_length(v);
        if (strcmp(k, "text") == 0 && t && tl >= 2 && (t[0] == '\'' || t[0] == '"') && t[tl - 1] == t[0])
          /* E2B's server strips the quotes of a str's repr: 'x' is shown as x */
          json_object_set_new(j, k, json_stringn(t + 1, tl - 2));
        else
          json_object_set(j, k, v);
      }
      line_add(out, j);
    } else {
      x->ended = true;
      flush_text(x, out, true);
      const struct moat_ctx_outcome *o = moat_ctx_run_outcome(x->u);
      if ((o->error || o->restarted) && e2b_sandbox_gone(x->ctl, x->org, x->id)) {
        x->cut = true;
        *done = true;
        return;
      }
      if (o->error)
        error_line(out, o->error);
      line_add(out, json_pack("{s:s, s:i}", "type", "number_of_executions", "execution_count",
                              o->execution_count));
      line_add(out, json_pack("{s:s}", "type", "end_of_execution"));
      *done = true;
      return;
    }
  }
  flush_text(x, out, false);
}

static void run_stopping(void *ctx, struct moat_buf *out) {
  struct e2b_run *x = ctx;
  flush_text(x, out, true);
  json_t *e = api_error_json("unavailable", "moatd is stopping");
  error_line(out, e);
  json_decref(e);
}

static void run_gone(void *ctx) { moat_ctx_run_interrupt(((struct e2b_run *)ctx)->u); }

static void run_free(void *ctx) {
  struct e2b_run *x = ctx;
  moat_ctx_run_close(x->u);
  free(x->org);
  free(x->pend[0].p);
  free(x->pend[1].p);
  free(x);
}

/* E2B's Jupyter queues executions of one kernel: a run waits for the context while its client is
 * there. */
static bool wait_for_context(void *arg) {
  struct api_req *r = arg;
  return !api_stopping(r->api) && !api_client_gone(api_conn_fd(r));
}

static int run_code(struct api_req *r, const char *cid, json_t *code, json_t *env) {
  moat_error *err = NULL;
  struct moat_ctx_run_opts opts = {
      .timeout_ms = (uint32_t)API_MAX_TIMEOUT_MS, .env = env, .wait = wait_for_context, .wait_arg = r};
  struct moat_ctx_run *u = NULL;
  if (moat_ctx_run_start(api_control(r), r->org, r->route.id, cid, json_string_value(code),
                         json_string_length(code), &opts, &u, &err) < 0) {
    api_exec_enoent(r, err);
    return api_reply_moat_error(r, &err);
  }
  struct e2b_run *x = xcalloc(1, sizeof(*x));
  x->u = u;
  x->ctl = api_control(r);
  x->org = xstrdup(r->org);
  snprintf(x->id, sizeof(x->id), "%s", r->route.id);
  struct api_stream_source src = {.next = run_next,
                                  .gone = run_gone,
                                  .stopping = run_stopping,
                                  .free = run_free,
                                  .aborted = run_aborted,
                                  .ctx = x,
                                  .keepalive = "{\"type\":\"keepalive\"}\n", /* a type parseOutput skips */
                                  .poll_ms = 500};
  return api_stream_reply(r, &src, "application/x-ndjson", NULL);
}

static int h_execute(struct api_req *r, json_t *body) {
  json_t *code = NULL, *ctx = NULL, *lang = NULL, *envs = NULL;
  const char *key;
  json_t *v;
  json_object_foreach(body, key, v) {
    if (strcmp(key, "code") == 0)
      code = v;
    else if (strcmp(key, "context_id") == 0)
      ctx = v;
    else if (strcmp(key, "language") == 0)
      lang = v;
    else if (strcmp(key, "env_vars") == 0)
      envs = v;
    else
      return interp_error(r, 400, "invalid_request", "unknown field '%.128s'", key);
  }
  if (!json_is_string(code))
    return interp_error(r, 400, "invalid_request", "'code' must be a string");
  if (ctx && !json_is_null(ctx) && !json_is_string(ctx))
    return interp_error(r, 400, "invalid_request", "'context_id' must be a string");
  if (lang && !json_is_null(lang) && !json_is_string(lang))
    return interp_error(r, 400, "invalid_request", "'language' must be a string");
  if (json_is_string(ctx) && json_is_string(lang))
    return interp_error(r, 400, "invalid_request", "give context_id or language, not both");
  if (null_or_empty(envs)) {
    envs = NULL;
  } else {
    if (!json_is_object(envs) || json_object_size(envs) > API_MAX_ENV_KEYS)
      return interp_error(r, 400, "invalid_request", "'env_vars' must be an object of at most %d names",
                          API_MAX_ENV_KEYS);
    const char *k;
    json_t *ev;
    json_object_foreach(envs, k, ev) {
      if (!api_valid_env_name(k) || strlen(k) > API_MAX_ENV_KEY)
        return interp_error(r, 400, "invalid_request", "env_vars: '%.64s' is not a valid variable name", k);
      if (!json_is_string(ev) || json_string_length(ev) > API_MAX_ENV_VALUE ||
          strlen(json_string_value(ev)) != json_string_length(ev))
        return interp_error(r, 400, "invalid_request",
                            "env_vars: the value of '%.64s' must be a string without NUL", k);
    }
  }
  if (json_is_string(ctx)) {
    if (set_cid(r, json_string_value(ctx)) < 0)
      return -1;
  } else {
    const char *ln = json_is_string(lang) ? json_string_value(lang) : "python";
    int li = lang_index(ln);
    if (li < 0)
      return unsupported_lang(r, ln);
    moat_error *err = NULL;
    if (moat_ctx_ensure(api_control(r), r->org, r->route.id, languages[li].cid, languages[li].moat,
                        E2B_DEFAULT_CWD, E2B_CODE_USER, &err) < 0) {
      api_exec_enoent(r, err);
      return api_reply_moat_error(r, &err);
    }
    memcpy(r->route.cid, languages[li].cid, 17);
  }
  return run_code(r, r->route.cid, code, envs);
}

static int h_ctx_create(struct api_req *r, json_t *body) {
  const char *ln = "python", *cwd = E2B_DEFAULT_CWD;
  const char *key;
  json_t *v;
  json_object_foreach(body, key, v) {
    if (json_is_null(v))
      continue;
    if (strcmp(key, "language") == 0 && json_is_string(v))
      ln = json_string_value(v);
    else if (strcmp(key, "cwd") == 0 && json_is_string(v))
      cwd = json_string_value(v);
    else
      return interp_error(r, 400, "invalid_request", "'%.64s' is not a field of a context (language, cwd)",
                          key);
  }
  int li = lang_index(ln);
  if (li < 0)
    return unsupported_lang(r, ln);
  moat_error *err = NULL;
  if (api_check_path("cwd", cwd, strlen(cwd), &err) < 0)
    return api_reply_moat_error(r, &err);
  if (cwd[0] != '/')
    return interp_error(r, 400, "invalid_request", "'cwd' must be an absolute path");
  char cid[17];
  random_id(cid, 16);
  int rc =
      moat_ctx_ensure(api_control(r), r->org, r->route.id, cid, languages[li].moat, cwd, E2B_CODE_USER, &err);
  if (rc < 0 && err && (err->status == EACCES || err->status == EPERM)) {
    /* E2B's Jupyter runs as root, so any cwd works there: a cwd the default user cannot enter
     * (E2B's own tests use /root) gets a context running as root */
    moat_error_free(&err);
    rc = moat_ctx_ensure(api_control(r), r->org, r->route.id, cid, languages[li].moat, cwd, "root", &err);
  }
  if (rc < 0) {
    api_exec_enoent(r, err);
    return api_reply_moat_error(r, &err);
  }
  return api_reply_json(r, 200, json_pack("{s:s, s:s, s:s}", "id", cid, "language", ln, "cwd", cwd));
}

static int h_ctx_list(struct api_req *r) {
  moat_error *err = NULL;
  struct moat_ctx *v = NULL;
  size_t n = 0;
  /* E2B's server starts its default python and javascript contexts at boot, so a list shows
   * them: moat starts them here if runCode has not yet (languages[0] and [2]); one the template
   * cannot run (no node in base) is left out */
  for (size_t i = 0; i <= 2; i += 2) {
    if (moat_ctx_ensure(api_control(r), r->org, r->route.id, languages[i].cid, languages[i].moat,
                        E2B_DEFAULT_CWD, E2B_CODE_USER, &err) < 0)
      moat_error_free(&err);
  }
  if (moat_ctx_list(api_control(r), r->org, r->route.id, &v, &n, &err) < 0)
    return api_reply_moat_error(r, &err);
  /* the default ones first (E2B's exist from boot), then the others as moat lists them */
  json_t *arr = json_array();
  for (int pass = 0; pass < 2; pass++)
    for (size_t i = 0; i < n; i++) {
      if ((strncmp(v[i].id, "e2bdefault", 10) == 0) != (pass == 0))
        continue;
      /* "javascript": E2B's name for moat's node contexts */
      json_array_append_new(arr, json_pack("{s:s, s:s, s:s, s:o}", "id", v[i].id, "language",
                                           strcmp(v[i].language, "node") == 0 ? "javascript" : v[i].language,
                                           "cwd", v[i].cwd, "created_at",
                                           api_time_json(v[i].created_at_ms, false)));
    }
  moat_ctxs_free(v, n);
  return api_reply_json(r, 200, arr);
}

static int h_ctx_delete(struct api_req *r) {
  moat_error *err = NULL;
  if (moat_ctx_delete(api_control(r), r->org, r->route.id, r->route.cid, &err) < 0)
    return api_reply_moat_error(r, &err);
  return api_reply_empty(r, 204);
}

static int h_ctx_restart(struct api_req *r) {
  moat_error *err = NULL;
  struct moat_ctx x;
  if (moat_ctx_restart(api_control(r), r->org, r->route.id, r->route.cid, &x, &err) < 0) {
    api_exec_enoent(r, err);
    return api_reply_moat_error(r, &err);
  }
  moat_ctx_clear(&x);
  return api_reply_empty(r, 204);
}

void e2b_interp_dispatch(struct api_req *r, struct e2b_req *e) {
  (void)e;
  const char *m = r->method, *p = r->path;
  json_t *body = NULL;
  moat_error *err = NULL;
  bool post = strcmp(m, "POST") == 0, get = strcmp(m, "GET") == 0, del = strcmp(m, "DELETE") == 0;
  if (post && api_body_parse(r->body ? r->body : "", r->body_len, true, &body, &err) < 0) {
    api_reply_moat_error(r, &err);
    return;
  }
  if (strcmp(p, "/health") == 0) {
    get ? api_reply_json(r, 200, json_pack("{s:s}", "status", "ok"))
        : interp_error(r, 405, "method_not_allowed", "use GET");
  } else if (strcmp(p, "/execute") == 0) {
    post ? h_execute(r, body) : interp_error(r, 405, "method_not_allowed", "use POST");
  } else if (strcmp(p, "/contexts") == 0) {
    if (post)
      h_ctx_create(r, body);
    else if (get)
      h_ctx_list(r);
    else
      interp_error(r, 405, "method_not_allowed", "use GET or POST");
  } else if (strncmp(p, "/contexts/", 10) == 0) {
    char id[64];
    const char *rest = p + 10, *slash = strchr(rest, '/');
    size_t n = slash ? (size_t)(slash - rest) : strlen(rest);
    if (n >= sizeof(id)) {
      api_reply_error(r, 404, "context_not_found", "no such context");
    } else {
      memcpy(id, rest, n);
      id[n] = '\0';
      if (!slash && del) {
        if (set_cid(r, id) == 0)
          h_ctx_delete(r);
      } else if (slash && strcmp(slash, "/restart") == 0 && post) {
        if (set_cid(r, id) == 0)
          h_ctx_restart(r);
      } else {
        api_reply_error(r, 404, "not_found", "no such route: %s %.256s", m, p);
      }
    }
  } else {
    api_reply_error(r, 404, "not_found", "no such route on the code interpreter: %s %.256s", m, p);
  }
  json_decref(body);
}

/* contexts.c -- code contexts: persistent python/node/bash interpreters ("kernels") in a sandbox
 *
 * A context is a background process of the guest tagged "ctx-<cid>" (cid: 16 base-36 chars)
 * running one of the kernels embedded below (src/api/v1/kernels/), written to /run/moat/ at
 * creation. moatd keeps no state about contexts: the list is the guest's process table, the
 * language and cwd are read back from the kernel's argv {interpreter, kernel file, cwd}.
 *
 * A run attaches to the kernel's output (no replay) before writing one request line
 * {"id","code"[,"code_b64"]} to its stdin, then reads framed messages "\x1e" JSON "\n" from both
 * output streams until the "end" message of that id arrived on both (bytes outside frames are raw
 * output of the cell). At timeout_ms the kernel's process group gets SIGINT; a kernel that has
 * not ended the run CTX_GRACE_MS later (or that died) is killed and started again, and the
 * reply says restarted: true. One run at a time per context: a second concurrent run is
 * answered 409 context_busy.
 */
#include <errno.h>
#include <microhttpd.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../../common/buf.h"
#include "../../common/log.h"
#include "../api_internal.h"
#include "../e2b/e2b_internal.h"

/* The kernels, embedded at build time (the Makefile makes this object depend on them). */
#define EMBED(sym, path)                                                                                     \
  __asm__(".section .rodata\n.global " #sym "\n.balign 16\n" #sym ":\n.incbin \"" path "\"\n"                \
          ".global " #sym "_end\n" #sym "_end:\n.byte 0\n.previous\n")
EMBED(moat_kernel_py, "src/api/v1/kernels/kernel.py");
EMBED(moat_kernel_js, "src/api/v1/kernels/kernel.js");
EMBED(moat_kernel_sh, "src/api/v1/kernels/kernel.sh");
extern const char moat_kernel_py[], moat_kernel_py_end[];
extern const char moat_kernel_js[], moat_kernel_js_end[];
extern const char moat_kernel_sh[], moat_kernel_sh_end[];

#define CTX_ID_LEN 16
#define CTX_TAG_PREFIX "ctx-"
#define CTX_DEFAULT_TIMEOUT_MS 60000
#define CTX_GRACE_MS 2000 /* after SIGINT, before kill and restart */
#define CTX_EXIT_WAIT_MS 5000
#define CTX_POLL_MS 500
#define CTX_MAX_OUTPUT (16u << 20) /* per stream kept in a whole reply */
#define CTX_KEEPALIVE_MS 15000
#define CTX_MAX_FRAME (64u << 20) /* a kernel message (a PNG can be large) */

struct lang {
  const char *name;
  const char *interp;
  const char *kernel_path;
  const char *start, *end;
  const char *hint;
};

static const struct lang langs[] = {
    {"python", "python3", "/run/moat/kernel.py", moat_kernel_py, moat_kernel_py_end,
     "python3 (every template has it)"},
    {"node", "node", "/run/moat/kernel.js", moat_kernel_js, moat_kernel_js_end,
     "nodejs (the code-interpreter template has it)"},
    {"bash", "bash", "/run/moat/kernel.sh", moat_kernel_sh, moat_kernel_sh_end, "bash"},
};

static const struct lang *lang_by_name(const char *n) {
  for (size_t i = 0; i < ARRAY_SIZE(langs); i++)
    if (strcmp(langs[i].name, n) == 0)
      return &langs[i];
  return NULL;
}

static const struct lang *lang_by_kernel(const char *path) {
  for (size_t i = 0; i < ARRAY_SIZE(langs); i++)
    if (path && strcmp(langs[i].kernel_path, path) == 0)
      return &langs[i];
  return NULL;
}

static int64_t wall_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static bool valid_cid(const char *s) {
  size_t i;
  for (i = 0; s[i]; i++)
    if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9')))
      return false;
  return i == CTX_ID_LEN;
}

/* ---- one run at a time per context ---- */

static pthread_mutex_t busy_mu = PTHREAD_MUTEX_INITIALIZER;
struct busy {
  char key[MOAT_ID_LEN + CTX_ID_LEN + 2];
  struct busy *next;
};
static struct busy *busy_list;

/* Marks sandbox/cid busy; false when it already was. */
static bool busy_take(const char *sid, const char *cid) {
  char key[sizeof(((struct busy *)0)->key)];
  snprintf(key, sizeof(key), "%s/%s", sid, cid);
  pthread_mutex_lock(&busy_mu);
  for (struct busy *b = busy_list; b; b = b->next) {
    if (strcmp(b->key, key) == 0) {
      pthread_mutex_unlock(&busy_mu);
      return false;
    }
  }
  struct busy *b = xcalloc(1, sizeof(*b));
  memcpy(b->key, key, sizeof(key));
  b->next = busy_list;
  busy_list = b;
  pthread_mutex_unlock(&busy_mu);
  return true;
}

static void busy_give(const char *sid, const char *cid) {
  char key[sizeof(((struct busy *)0)->key)];
  snprintf(key, sizeof(key), "%s/%s", sid, cid);
  pthread_mutex_lock(&busy_mu);
  for (struct busy **p = &busy_list; *p; p = &(*p)->next) {
    if (strcmp((*p)->key, key) == 0) {
      struct busy *b = *p;
      *p = b->next;
      free(b);
      break;
    }
  }
  pthread_mutex_unlock(&busy_mu);
}

/* ---- kernels: find, start, stop ---- */

struct ctx_info {
  int pid;
  const struct lang *lang;
  char *cwd;
  char *user; /* NULL = root; else argv[3] of the kernel (E2B's contexts run as "user") */
  int64_t started_at_ms;
};

static void ctx_info_clear(struct ctx_info *c) {
  free(c->cwd);
  free(c->user);
  memset(c, 0, sizeof(*c));
}

static bool ctx_from_proc(const struct moat_proc_info *p, struct ctx_info *out) {
  if (!p->running || !p->tag || strncmp(p->tag, CTX_TAG_PREFIX, strlen(CTX_TAG_PREFIX)) != 0 || !p->argv ||
      !p->argv[0] || !p->argv[1])
    return false;
  const struct lang *l = lang_by_kernel(p->argv[1]);
  if (!l)
    return false;
  out->pid = p->pid;
  out->lang = l;
  out->cwd = xstrdup(p->argv[2] ? p->argv[2] : "");
  out->user = p->argv[2] && p->argv[3] ? xstrdup(p->argv[3]) : NULL;
  out->started_at_ms = p->started_at_ms;
  return true;
}

static json_t *ctx_json(const char *cid, const struct ctx_info *c) {
  return json_pack("{s:s, s:s, s:s, s:o}", "id", cid, "language", c->lang->name, "cwd", c->cwd, "created_at",
                   api_time_json(c->started_at_ms, false));
}

/* Finds the running context cid. 1 found, 0 not found, -1 error. */
static int ctx_find(const struct moat_guest_ep *sock, const char *cid, struct ctx_info *out, moat_error **err) {
  struct moat_proc_info *v = NULL;
  size_t n = 0;
  if (moat_guest_procs(sock, &v, &n, err) < 0)
    return -1;
  _cleanup_free_ char *tag = xasprintf(CTX_TAG_PREFIX "%s", cid);
  int found = 0;
  for (size_t i = 0; i < n && !found; i++)
    if (v[i].tag && strcmp(v[i].tag, tag) == 0 && ctx_from_proc(&v[i], out))
      found = 1;
  moat_proc_infos_free(v, n);
  return found;
}

/* Kills the kernel pid (its process group) and waits up to CTX_EXIT_WAIT_MS for its exit, so
 * that its tag is free again. */
static int ctx_kill(const struct moat_guest_ep *sock, int pid, moat_error **err) {
  struct moat_proc_stream *s = NULL;
  struct moat_proc_info info;
  memset(&info, 0, sizeof(info));
  if (moat_guest_attach(sock, pid, NULL, false, &s, &info, err) < 0) {
    if (*err && (*err)->status == ESRCH) {
      moat_error_free(err);
      return 0;
    }
    return -1;
  }
  bool running = info.running;
  moat_proc_info_clear(&info);
  if (running && moat_guest_proc_signal(sock, pid, NULL, SIGKILL, err) < 0) {
    if (!*err || (*err)->status != ESRCH) {
      moat_proc_stream_close(s);
      return -1;
    }
    moat_error_free(err);
  }
  uint64_t deadline = now_ns() + CTX_EXIT_WAIT_MS * 1000000ULL;
  while (running) {
    struct moat_proc_event ev;
    int64_t left = (int64_t)(deadline - now_ns()) / 1000000;
    if (left <= 0) {
      moat_proc_stream_close(s);
      return moat_error_set(err, ETIMEDOUT, "context process %d did not exit after SIGKILL", pid);
    }
    int rc = moat_proc_stream_next(s, &ev, (int)left, err);
    if (rc < 0) {
      moat_proc_stream_close(s);
      return -1;
    }
    if (rc == 0 || ev.type == MOAT_PROC_EXIT)
      break;
  }
  moat_proc_stream_close(s);
  return 0;
}

/* Writes the kernel file of l into the sandbox. */
static int kernel_install(const struct moat_guest_ep *sock, const struct lang *l, moat_error **err) {
  struct moat_guest_writer *w = NULL;
  if (moat_guest_write_open(sock, l->kernel_path, NULL, 0644, &w, err) < 0)
    return moat_error_wrap(err, "write %s", l->kernel_path);
  int rc = moat_guest_write_chunk(w, l->start, (size_t)(l->end - l->start), err);
  if (rc == 0)
    rc = moat_guest_write_finish(w, NULL, err);
  moat_guest_writer_close(w);
  return rc < 0 ? moat_error_wrap(err, "write %s", l->kernel_path) : 0;
}

/* Starts the kernel of l for cid in cwd. Returns the pid or -1: EINVAL when the interpreter is
 * missing from the sandbox or cwd is not a directory. */
static int ctx_start(const struct moat_guest_ep *sock, char *const *senv, const char *cid, const struct lang *l,
                     const char *cwd, const char *user, moat_error **err) {
  /* Is the interpreter there? (Starting it would only report "not found" on its stderr.) */
  _cleanup_free_ char *probe = xasprintf("command -v %s >/dev/null", l->interp);
  char *pargv[] = {"/bin/sh", "-c", probe, NULL};
  struct moat_exec_req pr = {.argv = pargv, .timeout_ms = 10000};
  struct moat_exec_result res;
  memset(&res, 0, sizeof(res));
  if (moat_guest_exec(sock, &pr, &res, err) < 0)
    return -1;
  int code = res.exit_code;
  moat_exec_result_free(&res);
  if (code != 0)
    return moat_error_set(err, EINVAL,
                          "language '%s' needs %s, which this sandbox's template does not have; create the "
                          "sandbox from the code-interpreter template",
                          l->name, l->hint);
  if (kernel_install(sock, l, err) < 0)
    return -1;
  /* The kernels read their cwd only; a user (other than root) rides along as argv[3] so that a
   * restart can start the kernel as the same user. */
  char *argv[] = {(char *)l->interp, (char *)l->kernel_path, (char *)cwd, (char *)user, NULL};
  char *extra[] = {"MPLBACKEND=Agg", "PYTHONUNBUFFERED=1", "PYTHONDONTWRITEBYTECODE=1", NULL};
  _cleanup_strv_ char **env = strv_concat(senv, extra);
  _cleanup_free_ char *tag = xasprintf(CTX_TAG_PREFIX "%s", cid);
  struct moat_exec_req req = {.argv = argv, .env = env, .cwd = cwd, .user = user};
  struct moat_exec_opts opts = {.background = true, .tag = tag, .keep_on_disconnect = true};
  int pid = 0;
  if (moat_guest_exec_start(sock, &req, &opts, NULL, &pid, err) < 0)
    return -1;
  return pid;
}

/* Replies to a failed context operation: ESRCH -> 404 context_not_found. Frees *err. */
static int reply_ctx_error(struct api_req *r, moat_error **err) {
  if (*err && (*err)->status == ESRCH) {
    int ret = api_reply_error(r, 404, "context_not_found", "%s", moat_error_msg(*err));
    moat_error_free(err);
    return ret;
  }
  api_exec_enoent(r, *err);
  return api_reply_moat_error(r, err);
}

static int reply_no_ctx(struct api_req *r) {
  return api_reply_error(r, 404, "context_not_found", "no context '%.64s' in sandbox %s", r->route.cid,
                         r->route.id);
}

/* ---- routes: create, list, delete, restart ---- */

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
  const struct lang *l = lang_by_name(lname);
  if (!l)
    return api_reply_error(r, 400, "invalid_request", "'language' must be python, node or bash, not '%.64s'",
                           lname);
  _cleanup_strv_ char **senv = NULL;
  _cleanup_free_ struct moat_guest_ep *sock = api_guest_sock(r, &senv, &err);
  if (!sock)
    return api_reply_moat_error(r, &err);
  char cid[CTX_ID_LEN + 1];
  random_id(cid, CTX_ID_LEN);
  int pid = ctx_start(sock, senv, cid, l, cwd, NULL, &err);
  if (pid < 0)
    return reply_ctx_error(r, &err);
  struct ctx_info c = {.pid = pid, .lang = l, .cwd = xstrdup(cwd), .started_at_ms = wall_ms()};
  int ret = api_reply_json(r, 201, ctx_json(cid, &c));
  ctx_info_clear(&c);
  return ret;
}

int api_h_ctx_list(struct api_req *r, json_t *body) {
  moat_error *err = NULL;
  _cleanup_free_ struct moat_guest_ep *sock = api_guest_sock(r, NULL, &err);
  if (!sock)
    return api_reply_moat_error(r, &err);
  struct moat_proc_info *v = NULL;
  size_t n = 0;
  if (moat_guest_procs(sock, &v, &n, &err) < 0)
    return api_reply_moat_error(r, &err);
  json_t *arr = json_array();
  for (size_t i = 0; i < n; i++) {
    struct ctx_info c;
    memset(&c, 0, sizeof(c));
    if (ctx_from_proc(&v[i], &c))
      json_array_append_new(arr, ctx_json(v[i].tag + strlen(CTX_TAG_PREFIX), &c));
    ctx_info_clear(&c);
  }
  moat_proc_infos_free(v, n);
  return api_reply_json(r, 200, json_pack("{s:o}", "contexts", arr));
}

/* Looks up the route's context; replies (404 or an error) and returns <= 0 when there is none. */
static int route_ctx(struct api_req *r, struct moat_guest_ep **sock, char ***senv, struct ctx_info *c) {
  moat_error *err = NULL;
  *sock = api_guest_sock(r, senv, &err);
  if (!*sock) {
    api_reply_moat_error(r, &err);
    return -1;
  }
  if (!valid_cid(r->route.cid)) {
    reply_no_ctx(r);
    return 0;
  }
  int rc = ctx_find(*sock, r->route.cid, c, &err);
  if (rc < 0)
    api_reply_moat_error(r, &err);
  else if (rc == 0)
    reply_no_ctx(r);
  return rc;
}

int api_h_ctx_delete(struct api_req *r, json_t *body) {
  moat_error *err = NULL;
  _cleanup_free_ struct moat_guest_ep *sock = NULL;
  struct ctx_info c;
  memset(&c, 0, sizeof(c));
  if (route_ctx(r, &sock, NULL, &c) <= 0)
    return 0;
  int rc = ctx_kill(sock, c.pid, &err);
  ctx_info_clear(&c);
  if (rc < 0)
    return api_reply_moat_error(r, &err);
  return api_reply_empty(r, 204);
}

/* Kills and starts again the kernel of cid (same language and cwd). New pid or -1. */
static int ctx_restart(const struct moat_guest_ep *sock, char *const *senv, const char *cid, struct ctx_info *c,
                       moat_error **err) {
  if (ctx_kill(sock, c->pid, err) < 0)
    return -1;
  int pid = ctx_start(sock, senv, cid, c->lang, c->cwd, c->user, err);
  if (pid > 0) {
    c->pid = pid;
    c->started_at_ms = wall_ms();
  }
  return pid;
}

int api_h_ctx_restart(struct api_req *r, json_t *body) {
  moat_error *err = NULL;
  if (json_object_size(body) > 0)
    return api_reply_error(r, 400, "invalid_request", "unknown field '%.128s'",
                           json_object_iter_key(json_object_iter(body)));
  _cleanup_free_ struct moat_guest_ep *sock = NULL;
  _cleanup_strv_ char **senv = NULL;
  struct ctx_info c;
  memset(&c, 0, sizeof(c));
  if (route_ctx(r, &sock, &senv, &c) <= 0)
    return 0;
  if (!busy_take(r->route.id, r->route.cid)) {
    ctx_info_clear(&c);
    return api_reply_error(r, 409, "context_busy", "context %s is running code", r->route.cid);
  }
  int pid = ctx_restart(sock, senv, r->route.cid, &c, &err);
  busy_give(r->route.id, r->route.cid);
  int ret = pid < 0 ? reply_ctx_error(r, &err) : api_reply_json(r, 200, ctx_json(r->route.cid, &c));
  ctx_info_clear(&c);
  return ret;
}

/* ---- for the E2B code interpreter (e2b_interp.c) ---- */

int api_ctx_list_json(struct api_req *r, json_t **out, moat_error **err) {
  _cleanup_free_ struct moat_guest_ep *sock = api_guest_sock(r, NULL, err);
  if (!sock)
    return -1;
  struct moat_proc_info *v = NULL;
  size_t n = 0;
  if (moat_guest_procs(sock, &v, &n, err) < 0)
    return -1;
  *out = json_array();
  for (size_t i = 0; i < n; i++) {
    struct ctx_info c;
    memset(&c, 0, sizeof(c));
    if (ctx_from_proc(&v[i], &c))
      json_array_append_new(*out, ctx_json(v[i].tag + strlen(CTX_TAG_PREFIX), &c));
    ctx_info_clear(&c);
  }
  moat_proc_infos_free(v, n);
  return 0;
}

int api_ctx_ensure(struct api_req *r, const char *cid, const char *lname, const char *cwd, const char *user,
                   moat_error **err) {
  const struct lang *l = lang_by_name(lname);
  if (!l || !valid_cid(cid))
    return moat_error_set(err, EINVAL, "no such language '%.64s' or context id '%.64s'", lname, cid);
  _cleanup_strv_ char **senv = NULL;
  _cleanup_free_ struct moat_guest_ep *sock = api_guest_sock(r, &senv, err);
  if (!sock)
    return -1;
  for (int attempt = 0; attempt < 2; attempt++) {
    struct ctx_info c;
    memset(&c, 0, sizeof(c));
    int rc = ctx_find(sock, cid, &c, err);
    ctx_info_clear(&c);
    if (rc != 0)
      return rc;
    if (ctx_start(sock, senv, cid, l, cwd, user, err) > 0)
      return 0;
    /* Another request started it at the same moment (the guest refuses a second kernel with the
     * same tag): find that one. */
    if (attempt > 0 || !*err || (*err)->status != EEXIST)
      return -1;
    moat_error_free(err);
  }
  return -1;
}

int api_ctx_restart_e2b(struct api_req *r) {
  moat_error *err = NULL;
  _cleanup_free_ struct moat_guest_ep *sock = NULL;
  _cleanup_strv_ char **senv = NULL;
  struct ctx_info c;
  memset(&c, 0, sizeof(c));
  if (route_ctx(r, &sock, &senv, &c) <= 0)
    return 0;
  if (!busy_take(r->route.id, r->route.cid)) {
    ctx_info_clear(&c);
    return api_reply_error(r, 409, "context_busy", "context %s is running code", r->route.cid);
  }
  int pid = ctx_restart(sock, senv, r->route.cid, &c, &err);
  busy_give(r->route.id, r->route.cid);
  ctx_info_clear(&c);
  return pid < 0 ? reply_ctx_error(r, &err) : api_reply_empty(r, 204);
}

/* ---- runs ---- */


/* A run in progress, for a whole reply or an SSE stream. */
struct run {
  struct moat_api *api;
  char sid[MOAT_ID_LEN + 1];
  char cid[CTX_ID_LEN + 1];
  char rid[17];
  struct moat_guest_ep *sock;
  char **senv;
  struct ctx_info ctx;
  struct moat_proc_stream *ps;
  uint32_t timeout_ms;
  uint64_t deadline_ns;
  bool interrupted, restarted, finished;
  bool end_seen[2];    /* stdout, stderr */
  struct moat_buf frame[2]; /* a frame being read, per stream */
  bool in_frame[2];
  int execution_count;
  json_t *error;
  int exit_code; /* bash: the cell's status */
  bool has_exit_code;
  /* whole reply */
  bool sse;
  bool e2b; /* the stream is E2B's /execute NDJSON instead of SSE (e2b_interp.c) */
  struct moat_buf pend[2]; /* e2b: output text not yet written as a line */
  uint64_t pend_ns[2];      /* when pend[i] became non-empty */
  struct moat_buf text[2];
  bool text_trunc[2];
  json_t *results;
  /* SSE */
  int client_fd;
  struct moat_buf out;
  size_t out_pos;
  uint64_t last_ns;
  bool done;
};

static void run_free(struct run *u) {
  if (!u)
    return;
  if (u->ps)
    moat_proc_stream_close(u->ps);
  busy_give(u->sid, u->cid);
  free(u->sock);
  strv_free(u->senv);
  ctx_info_clear(&u->ctx);
  for (int i = 0; i < 2; i++) {
    free(u->frame[i].p);
    free(u->text[i].p);
    free(u->pend[i].p);
  }
  json_decref(u->error);
  json_decref(u->results);
  free(u->out.p);
  free(u);
}

static void e2b_line(struct run *u, const char *name, json_t *data);

static void sse_add(struct run *u, const char *name, json_t *data) {
  if (u->e2b) {
    e2b_line(u, name, data);
    return;
  }
  char *js = json_dumps(data, JSON_COMPACT);
  json_decref(data);
  if (!js)
    abort();
  moat_buf_append(&u->out, "event: ", 7);
  moat_buf_append(&u->out, name, strlen(name));
  moat_buf_append(&u->out, "\ndata: ", 7);
  moat_buf_append(&u->out, js, strlen(js));
  moat_buf_append(&u->out, "\n\n", 2);
  free(js);
}

static const char *const stream_names[2] = {"stdout", "stderr"};

static void line_add(struct run *u, json_t *j) {
  char *js = json_dumps(j, JSON_COMPACT);
  json_decref(j);
  if (!js)
    abort();
  moat_buf_append(&u->out, js, strlen(js));
  moat_buf_append(&u->out, "\n", 1);
  free(js);
}

/* One event of a run as E2B's code interpreter writes it (one JSON object per line, "type" first
 * read by @e2b/code-interpreter's parseOutput): stdout/stderr {text}, result {text, png, html,
 * json, is_main_result} (absent formats left out), error {name, value, traceback (one string)},
 * number_of_executions {execution_count} and end_of_execution at the end. Consumes data. */
#define E2B_GATHER_MS 50

/* Writes gathered output text as stdout/stderr lines: all of it when all is true, else the text up
 * to the last newline, or all of it once it waited E2B_GATHER_MS (complete UTF-8 characters). */
static void e2b_flush_some(struct run *u, bool all) {
  for (int w = 0; w < 2; w++) {
    struct moat_buf *b = &u->pend[w];
    if (b->len == 0)
      continue;
    bool valid;
    size_t n = b->len;
    if (!all && now_ns() - u->pend_ns[w] < E2B_GATHER_MS * 1000000ULL) {
      const char *nl = memrchr(b->p, '\n', b->len);
      n = nl ? (size_t)(nl - b->p) + 1 : 0;
    }
    if (n > 0 && n == b->len && !u->finished) {
      n = api_utf8_stream_split(b->p, b->len, &valid);
      if (!valid)
        n = b->len;
    }
    if (n == 0)
      continue;
    size_t sl;
    char *s = api_utf8_sanitize(b->p, n, &sl, NULL);
    line_add(u, json_pack("{s:s, s:s%}", "type", stream_names[w], "text", s, sl));
    free(s);
    memmove(b->p, b->p + n, b->len - n);
    b->len -= n;
    u->pend_ns[w] = now_ns();
  }
}

static void e2b_flush(struct run *u) { e2b_flush_some(u, true); }

static void e2b_line(struct run *u, const char *name, json_t *data) {
  if (strcmp(name, "stdout") != 0 && strcmp(name, "stderr") != 0)
    e2b_flush(u);
  json_t *j = json_pack("{s:s}", "type", name);
  if (strcmp(name, "stdout") == 0 || strcmp(name, "stderr") == 0) {
    json_object_set(j, "text", json_object_get(data, "text"));
  } else if (strcmp(name, "result") == 0) {
    const char *k;
    json_t *v;
    json_object_foreach(data, k, v) {
      if (!json_is_null(v))
        json_object_set(j, k, v);
    }
  } else if (strcmp(name, "error") == 0) {
    json_t *tb = json_object_get(data, "traceback");
    struct moat_buf b = {0};
    size_t i;
    json_t *line;
    json_array_foreach(tb, i, line) {
      if (i)
        moat_buf_append(&b, "\n", 1);
      if (json_is_string(line))
        moat_buf_append(&b, json_string_value(line), json_string_length(line));
    }
    json_t *nm = json_object_get(data, "name"), *val = json_object_get(data, "value");
    if (!nm) /* a stream error {code, message} */
      nm = json_object_get(data, "code"), val = json_object_get(data, "message");
    json_object_set_new(j, "name", json_is_string(nm) ? json_incref(nm) : json_string("Error"));
    json_object_set_new(j, "value", json_is_string(val) ? json_incref(val) : json_string(""));
    json_object_set_new(j, "traceback", json_stringn(b.p ? b.p : "", b.len));
    free(b.p);
  } else if (strcmp(name, "end") == 0) {
    json_object_set_new(j, "type", json_string("number_of_executions"));
    json_object_set(j, "execution_count", json_object_get(data, "execution_count"));
    line_add(u, j);
    j = json_pack("{s:s}", "type", "end_of_execution");
  }
  json_decref(data);
  line_add(u, j);
}

/* Output text of the cell on stream which (0 stdout, 1 stderr). */
static void emit_text(struct run *u, int which, const char *p, size_t n) {
  if (n == 0)
    return;
  if (u->e2b) { /* a print() arrives as several kernel messages: gathered as Jupyter does */
    if (u->pend[which].len == 0)
      u->pend_ns[which] = now_ns();
    moat_buf_append(&u->pend[which], p, n);
    return;
  }
  if (u->sse) {
    size_t sl;
    _cleanup_free_ char *s = api_utf8_sanitize(p, n, &sl, NULL);
    sse_add(u, stream_names[which], json_pack("{s:s%}", "text", s, sl));
    return;
  }
  if (u->text[which].len + n > CTX_MAX_OUTPUT) {
    n = CTX_MAX_OUTPUT - u->text[which].len;
    u->text_trunc[which] = true;
  }
  moat_buf_append(&u->text[which], p, n);
}

static json_t *str_or_null(json_t *v) {
  if (json_is_string(v))
    return json_incref(v);
  return json_null();
}

/* One kernel message of this run. */
static void on_message(struct run *u, int which, json_t *m) {
  json_t *id = json_object_get(m, "id");
  const char *type = json_string_value(json_object_get(m, "type"));
  if (!type || !json_is_string(id) || strcmp(json_string_value(id), u->rid) != 0)
    return; /* another run's late message, or noise */
  if (strcmp(type, "stdout") == 0 || strcmp(type, "stderr") == 0) {
    json_t *t = json_object_get(m, "text");
    if (json_is_string(t))
      emit_text(u, type[3] == 'o' ? 0 : 1, json_string_value(t), json_string_length(t));
  } else if (strcmp(type, "result") == 0) {
    json_t *d = json_object_get(m, "data");
    json_t *json = json_object_get(d, "application/json");
    json_t *res =
        json_pack("{s:o, s:o, s:o, s:O, s:b}", "text", str_or_null(json_object_get(d, "text/plain")), "png",
                  str_or_null(json_object_get(d, "image/png")), "html",
                  str_or_null(json_object_get(d, "text/html")), "json", json ? json : json_null(),
                  "is_main_result", json_is_true(json_object_get(m, "is_main_result")));
    if (u->sse)
      sse_add(u, "result", res);
    else
      json_array_append_new(u->results, res);
  } else if (strcmp(type, "error") == 0) {
    json_t *tb = json_object_get(m, "traceback");
    json_decref(u->error);
    u->error = json_pack("{s:o, s:o, s:O}", "name", str_or_null(json_object_get(m, "name")), "value",
                         str_or_null(json_object_get(m, "value")), "traceback",
                         json_is_array(tb) ? tb : json_array());
  } else if (strcmp(type, "end") == 0) {
    u->end_seen[which] = true;
    json_t *ec = json_object_get(m, "execution_count");
    if (json_is_integer(ec))
      u->execution_count = (int)json_integer_value(ec);
    json_t *xc = json_object_get(m, "exit_code");
    if (json_is_integer(xc)) {
      u->exit_code = (int)json_integer_value(xc);
      u->has_exit_code = true;
    }
  }
}

/* Splits output bytes of one stream into raw text and framed messages. */
static void on_bytes(struct run *u, int which, const char *p, size_t n) {
  while (n > 0) {
    if (!u->in_frame[which]) {
      const char *rs = memchr(p, '\x1e', n);
      size_t raw = rs ? (size_t)(rs - p) : n;
      emit_text(u, which, p, raw);
      if (!rs)
        return;
      u->in_frame[which] = true;
      u->frame[which].len = 0;
      p = rs + 1;
      n -= raw + 1;
      continue;
    }
    const char *nl = memchr(p, '\n', n);
    size_t take = nl ? (size_t)(nl - p) : n;
    if (u->frame[which].len + take <= CTX_MAX_FRAME)
      moat_buf_append(&u->frame[which], p, take);
    if (!nl)
      return;
    u->in_frame[which] = false;
    json_error_t je;
    json_t *m = json_loadb(u->frame[which].p ? u->frame[which].p : "", u->frame[which].len, 0, &je);
    if (json_is_object(m))
      on_message(u, which, m);
    else /* not a message after all: it was output */
      emit_text(u, which, u->frame[which].p ? u->frame[which].p : "", u->frame[which].len);
    json_decref(m);
    p = nl + 1;
    n -= take + 1;
  }
}

static void set_error(struct run *u, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_error(struct run *u, const char *name, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  json_decref(u->error);
  u->error = json_pack("{s:s, s:s, s:[]}", "name", name, "value", msg, "traceback");
}

/* The kernel died or hung: kill it, start it again, and record why. */
static void run_restart(struct run *u, const char *name, const char *why) {
  moat_error *err = NULL;
  if (u->ps) {
    moat_proc_stream_close(u->ps);
    u->ps = NULL;
  }
  u->restarted = true;
  if (ctx_restart(u->sock, u->senv, u->cid, &u->ctx, &err) < 0) {
    set_error(u, name, "%s; restarting the context failed: %s", why, moat_error_msg(err));
    moat_error_free(&err);
  } else {
    set_error(u, name, "%s; the context was restarted (its variables are gone)", why);
  }
  u->finished = true;
}

/* Pulls one event (waiting up to timeout_ms) and handles deadlines. Sets u->finished at the end. */
static void run_step(struct run *u, int timeout_ms) {
  moat_error *err = NULL;
  uint64_t now = now_ns();
  if (now >= u->deadline_ns) {
    if (!u->interrupted) {
      u->interrupted = true;
      u->deadline_ns = now + CTX_GRACE_MS * 1000000ULL;
      if (moat_guest_proc_signal(u->sock, u->ctx.pid, NULL, SIGINT, &err) < 0)
        moat_error_free(&err);
    } else {
      char why[160];
      snprintf(why, sizeof(why), "the run did not stop within %d ms of SIGINT at its timeout of %u ms",
               CTX_GRACE_MS, u->timeout_ms);
      run_restart(u, "TimeoutError", why);
      return;
    }
    now = now_ns();
  }
  int64_t left = (int64_t)(u->deadline_ns - now) / 1000000 + 1;
  if (left < timeout_ms)
    timeout_ms = (int)left;
  struct moat_proc_event ev;
  int rc = moat_proc_stream_next(u->ps, &ev, timeout_ms, &err);
  if (rc < 0 && err && err->status == ETIMEDOUT) {
    moat_error_free(&err);
    return;
  }
  if (rc < 0) {
    char why[400];
    snprintf(why, sizeof(why), "lost the context's output: %s", moat_error_msg(err));
    moat_error_free(&err);
    run_restart(u, "ContextError", why);
    return;
  }
  if (rc == 0 || ev.type == MOAT_PROC_EXIT) {
    char why[160];
    if (rc == 1 && ev.signal)
      snprintf(why, sizeof(why), "the context's interpreter was killed by signal %d", ev.signal);
    else if (rc == 1)
      snprintf(why, sizeof(why), "the context's interpreter exited with code %d", ev.exit_code);
    else
      snprintf(why, sizeof(why), "the context's output stream ended");
    run_restart(u, "ContextExited", why);
    return;
  }
  if (ev.type == MOAT_PROC_STDOUT || ev.type == MOAT_PROC_STDERR)
    on_bytes(u, ev.type == MOAT_PROC_STDOUT ? 0 : 1, ev.data, ev.len);
  if (u->end_seen[0] && u->end_seen[1])
    u->finished = true;
}

static void run_finish_error(struct run *u) {
  if (u->interrupted && !u->restarted) {
    if (!u->error)
      set_error(u, "TimeoutError", "interrupted at its timeout of %u ms", u->timeout_ms);
  }
}

static json_t *end_json(struct run *u) {
  json_t *j = json_pack("{s:i, s:b, s:b}", "execution_count", u->execution_count, "timed_out", u->interrupted,
                        "restarted", u->restarted);
  if (u->has_exit_code)
    json_object_set_new(j, "exit_code", json_integer(u->exit_code));
  return j;
}

static json_t *text_json(struct moat_buf *b) {
  size_t sl;
  _cleanup_free_ char *s = api_utf8_sanitize(b->p ? b->p : "", b->len, &sl, NULL);
  return json_stringn(s, sl);
}

static ssize_t run_sse_cb(void *cls, uint64_t pos, char *buf, size_t max) {
  struct run *u = cls;
  for (;;) {
    if (u->out_pos < u->out.len) {
      size_t n = u->out.len - u->out_pos;
      if (n > max)
        n = max;
      memcpy(buf, u->out.p + u->out_pos, n);
      u->out_pos += n;
      u->last_ns = now_ns();
      return (ssize_t)n;
    }
    u->out.len = u->out_pos = 0;
    if (u->done)
      return MHD_CONTENT_READER_END_OF_STREAM;
    if (u->finished) {
      run_finish_error(u);
      if (u->error)
        sse_add(u, "error", json_incref(u->error));
      sse_add(u, "end", end_json(u));
      u->done = true;
      continue;
    }
    if (api_stopping(u->api)) {
      sse_add(u, "error", api_error_json("unavailable", "moatd is stopping"));
      u->done = true;
      continue;
    }
    if (u->client_fd >= 0) {
      struct pollfd p = {.fd = u->client_fd, .events = POLLIN | POLLRDHUP};
      if (poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL))) {
        /* The client left: interrupt the cell so the context is free for the next run. */
        moat_error *err = NULL;
        if (moat_guest_proc_signal(u->sock, u->ctx.pid, NULL, SIGINT, &err) < 0)
          moat_error_free(&err);
        return MHD_CONTENT_READER_END_WITH_ERROR;
      }
    }
    if (now_ns() - u->last_ns >= CTX_KEEPALIVE_MS * 1000000ULL) {
      if (u->e2b) /* a line of a type the SDK's parseOutput skips */
        moat_buf_append(&u->out, "{\"type\":\"keepalive\"}\n", 21);
      else
        moat_buf_append(&u->out, ": keep-alive\n\n", 14);
      continue;
    }
    run_step(u, u->e2b && (u->pend[0].len || u->pend[1].len) ? E2B_GATHER_MS / 2 : CTX_POLL_MS);
    if (u->e2b && !u->finished)
      e2b_flush_some(u, false);
  }
}

static void run_sse_free(void *cls) { run_free(cls); }

static bool wants_sse(struct api_req *r) {
  const char *a = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_ACCEPT);
  return a && strstr(a, "text/event-stream");
}

enum run_mode { RUN_WHOLE, RUN_SSE, RUN_E2B };
static int run_start(struct api_req *r, const char *code, size_t code_len, uint32_t timeout_ms,
                     enum run_mode mode, json_t *env);

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
  return run_start(r, code, code_len, timeout_ms, sse ? RUN_SSE : RUN_WHOLE, NULL);
}

int api_ctx_run_e2b(struct api_req *r, const char *code, size_t code_len, uint32_t timeout_ms, json_t *env) {
  return run_start(r, code, code_len, timeout_ms, RUN_E2B, env);
}

/* Single-quotes s for bash. */
static void sh_quote(struct moat_buf *b, const char *s) {
  moat_buf_append(b, "'", 1);
  for (; *s; s++) {
    if (*s == '\'')
      moat_buf_append(b, "'\\''", 4);
    else
      moat_buf_append(b, s, 1);
  }
  moat_buf_append(b, "'", 1);
}

/* bash: env for one cell as two scripts the kernel evals around it (kernel.sh): the first saves
 * each variable's state and exports the new value, the second puts the old state back. Names were
 * checked by the caller ([A-Za-z_][A-Za-z0-9_]*). */
static void bash_env_scripts(json_t *env, json_t *line) {
  struct moat_buf set = {0}, unset = {0};
  const char *k;
  json_t *v;
  json_object_foreach(env, k, v) {
    char *t = xasprintf("__moat_s_%s=${%s+x}; __moat_o_%s=${%s-}; export %s=", k, k, k, k, k);
    moat_buf_append(&set, t, strlen(t));
    free(t);
    sh_quote(&set, json_string_value(v));
    moat_buf_append(&set, "\n", 1);
    t = xasprintf("if [ -n \"$__moat_s_%s\" ]; then %s=$__moat_o_%s; else unset %s; fi; unset __moat_s_%s "
                  "__moat_o_%s\n",
                  k, k, k, k, k, k);
    moat_buf_append(&unset, t, strlen(t));
    free(t);
  }
  size_t n;
  char *b = moat_base64_encode(set.p ? set.p : "", set.len, &n);
  json_object_set_new(line, "env_b64", json_stringn(b, n));
  free(b);
  b = moat_base64_encode(unset.p ? unset.p : "", unset.len, &n);
  json_object_set_new(line, "unenv_b64", json_stringn(b, n));
  free(b);
  free(set.p);
  free(unset.p);
}

static int run_start(struct api_req *r, const char *code, size_t code_len, uint32_t timeout_ms,
                     enum run_mode mode, json_t *env) {
  moat_error *err = NULL;
  bool sse = mode != RUN_WHOLE;
  if (memchr(code, '\0', code_len))
    return api_reply_error(r, 400, "invalid_request", "'code' contains a NUL character");

  struct run *u = xcalloc(1, sizeof(*u));
  u->api = r->api;
  snprintf(u->sid, sizeof(u->sid), "%s", r->route.id);
  snprintf(u->cid, sizeof(u->cid), "%.16s", r->route.cid);
  if (route_ctx(r, &u->sock, &u->senv, &u->ctx) <= 0) {
    u->cid[0] = '\0'; /* not taken */
    run_free(u);
    return 0;
  }
  /* E2B's Jupyter queues executions of one kernel: an E2B run waits for the context while its
   * client is there; the v1 API answers 409 at once. */
  while (!busy_take(u->sid, u->cid)) {
    if (mode != RUN_E2B || api_stopping(r->api) || api_client_gone(api_conn_fd(r))) {
      u->cid[0] = '\0';
      run_free(u);
      return api_reply_error(r, 409, "context_busy",
                             "context %s is running code; runs in one context do not overlap", r->route.cid);
    }
    usleep(20000);
  }
  random_id(u->rid, 16);
  u->timeout_ms = timeout_ms;
  u->sse = sse;
  u->e2b = mode == RUN_E2B;
  u->results = json_array();
  u->client_fd = api_conn_fd(r);
  u->last_ns = now_ns();
  /* Attach first, so that nothing the kernel writes for this run is missed. */
  if (moat_guest_attach(u->sock, u->ctx.pid, NULL, false, &u->ps, NULL, &err) < 0) {
    run_free(u);
    return reply_ctx_error(r, &err);
  }
  json_t *line = json_pack("{s:s, s:s%}", "id", u->rid, "code", code, code_len);
  bool bash = strcmp(u->ctx.lang->name, "bash") == 0;
  if (env && json_object_size(env) > 0) { /* for this cell only (E2B's runCode envs) */
    if (bash)
      bash_env_scripts(env, line);
    else
      json_object_set(line, "env", env);
  }
  if (bash) {
    size_t bl;
    _cleanup_free_ char *b64 = moat_base64_encode(code, code_len, &bl);
    json_object_set_new(line, "code_b64", json_stringn(b64, bl));
  }
  char *ls = json_dumps(line, JSON_COMPACT);
  json_decref(line);
  if (!ls)
    abort();
  size_t ll = strlen(ls);
  ls = xrealloc(ls, ll + 2);
  ls[ll++] = '\n';
  int rc = moat_guest_proc_stdin(u->sock, u->ctx.pid, NULL, ls, ll, false, &err);
  free(ls);
  if (rc < 0) {
    run_free(u);
    return reply_ctx_error(r, &err);
  }
  u->deadline_ns = now_ns() + (uint64_t)timeout_ms * 1000000ULL;

  if (sse) {
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 64 * 1024, run_sse_cb, u, run_sse_free);
    if (!resp) {
      run_free(u);
      return api_reply_error(r, 500, "internal", "could not create a response");
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE,
                            u->e2b ? "application/x-ndjson" : "text/event-stream");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(resp, "X-Accel-Buffering", "no");
    int ret = api_reply_response(r, 200, resp);
    MHD_destroy_response(resp);
    return ret;
  }

  while (!u->finished && !api_stopping(u->api))
    run_step(u, CTX_POLL_MS);
  if (!u->finished) {
    run_free(u);
    return api_reply_error(r, 503, "unavailable", "moatd is stopping");
  }
  run_finish_error(u);
  json_t *j = end_json(u);
  json_object_set_new(j, "stdout", text_json(&u->text[0]));
  json_object_set_new(j, "stderr", text_json(&u->text[1]));
  json_object_set(j, "results", u->results);
  json_object_set(j, "error", u->error ? u->error : json_null());
  if (u->text_trunc[0] || u->text_trunc[1])
    json_object_set_new(j, "truncated", json_true());
  run_free(u);
  return api_reply_json(r, 200, j);
}

/* contexts.c -- code contexts: persistent python/node/bash interpreters ("kernels") in a sandbox
 *
 * A context is a background process of the guest tagged "ctx-<cid>" (cid: 16 base-36 chars)
 * running one of the kernels embedded below (src/control/kernels/), written to /run/moat/ at
 * creation. Nothing about contexts is kept here but which runs are in progress: the list is the
 * guest's process table, the language and cwd are read back from the kernel's argv {interpreter,
 * kernel file, cwd[, user]}.
 *
 * A run attaches to the kernel's output (no replay) before writing one request line
 * {"id","code"[,"code_b64"][,"env"...]} to its stdin, then reads framed messages "\x1e" JSON "\n"
 * from both output streams until the "end" message of that id arrived on both (bytes outside frames
 * are raw output of the cell). At the run's timeout the kernel's process group gets SIGINT; a kernel
 * that has not ended the run CTX_GRACE_MS later (or that died) is killed and started again, and the
 * outcome says restarted. One run at a time per context.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../common/buf.h"
#include "../common/codec.h"
#include "../common/util.h"
#include "control_internal.h"

/* The kernels, embedded at build time (the Makefile makes this object depend on them). */
#define EMBED(sym, path)                                                                                     \
  __asm__(".section .rodata\n.global " #sym "\n.balign 16\n" #sym ":\n.incbin \"" path "\"\n"                \
          ".global " #sym "_end\n" #sym "_end:\n.byte 0\n.previous\n")
EMBED(moat_kernel_py, "src/control/kernels/kernel.py");
EMBED(moat_kernel_js, "src/control/kernels/kernel.js");
EMBED(moat_kernel_sh, "src/control/kernels/kernel.sh");
extern const char moat_kernel_py[], moat_kernel_py_end[];
extern const char moat_kernel_js[], moat_kernel_js_end[];
extern const char moat_kernel_sh[], moat_kernel_sh_end[];

#define CTX_TAG_PREFIX "ctx-"
#define CTX_GRACE_MS 2000 /* after SIGINT, before kill and restart */
#define CTX_EXIT_WAIT_MS 5000
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
    if (n && strcmp(langs[i].name, n) == 0)
      return &langs[i];
  return NULL;
}

static const struct lang *lang_by_kernel(const char *path) {
  for (size_t i = 0; i < ARRAY_SIZE(langs); i++)
    if (path && strcmp(langs[i].kernel_path, path) == 0)
      return &langs[i];
  return NULL;
}

bool moat_ctx_language_known(const char *name) { return lang_by_name(name) != NULL; }

static int64_t wall_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

bool moat_ctx_valid_id(const char *s) {
  size_t i;
  for (i = 0; s[i]; i++)
    if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9')))
      return false;
  return i == MOAT_CTX_ID_LEN;
}

/* ---- one run at a time per context ---- */

struct ctl_ctx_busy {
  char key[MOAT_ID_LEN + MOAT_CTX_ID_LEN + 2];
  struct ctl_ctx_busy *next;
};

/* Marks sandbox/cid busy; false when it already was. */
static bool busy_take(struct moat_control *c, const char *sid, const char *cid) {
  char key[sizeof(((struct ctl_ctx_busy *)0)->key)];
  snprintf(key, sizeof(key), "%s/%s", sid, cid);
  pthread_mutex_lock(&c->ctx_lock);
  for (struct ctl_ctx_busy *b = c->ctx_busy; b; b = b->next) {
    if (strcmp(b->key, key) == 0) {
      pthread_mutex_unlock(&c->ctx_lock);
      return false;
    }
  }
  struct ctl_ctx_busy *b = xcalloc(1, sizeof(*b));
  memcpy(b->key, key, sizeof(key));
  b->next = c->ctx_busy;
  c->ctx_busy = b;
  pthread_mutex_unlock(&c->ctx_lock);
  return true;
}

static void busy_give(struct moat_control *c, const char *sid, const char *cid) {
  char key[sizeof(((struct ctl_ctx_busy *)0)->key)];
  snprintf(key, sizeof(key), "%s/%s", sid, cid);
  pthread_mutex_lock(&c->ctx_lock);
  for (struct ctl_ctx_busy **p = &c->ctx_busy; *p; p = &(*p)->next) {
    if (strcmp((*p)->key, key) == 0) {
      struct ctl_ctx_busy *b = *p;
      *p = b->next;
      free(b);
      break;
    }
  }
  pthread_mutex_unlock(&c->ctx_lock);
}

void ctl_ctx_close(struct moat_control *c) {
  while (c->ctx_busy) {
    struct ctl_ctx_busy *b = c->ctx_busy;
    c->ctx_busy = b->next;
    free(b);
  }
}

/* ---- kernels: find, start, stop ---- */

void moat_ctx_clear(struct moat_ctx *x) {
  free(x->cwd);
  free(x->user);
  memset(x, 0, sizeof(*x));
}

void moat_ctxs_free(struct moat_ctx *v, size_t n) {
  for (size_t i = 0; v && i < n; i++)
    moat_ctx_clear(&v[i]);
  free(v);
}

static bool ctx_from_proc(const struct moat_proc_info *p, struct moat_ctx *out) {
  if (!p->running || !p->tag || strncmp(p->tag, CTX_TAG_PREFIX, strlen(CTX_TAG_PREFIX)) != 0 || !p->argv ||
      !p->argv[0] || !p->argv[1])
    return false;
  const struct lang *l = lang_by_kernel(p->argv[1]);
  if (!l)
    return false;
  memset(out, 0, sizeof(*out));
  snprintf(out->id, sizeof(out->id), "%.16s", p->tag + strlen(CTX_TAG_PREFIX));
  out->pid = p->pid;
  out->language = l->name;
  out->cwd = xstrdup(p->argv[2] ? p->argv[2] : "");
  out->user = p->argv[2] && p->argv[3] ? xstrdup(p->argv[3]) : NULL;
  out->created_at_ms = p->started_at_ms;
  return true;
}

/* Finds the running context cid. 1 found, 0 not found, -1 error. */
static int ctx_find(const struct moat_guest_ep *g, const char *cid, struct moat_ctx *out, moat_error **err) {
  struct moat_proc_info *v = NULL;
  size_t n = 0;
  if (moat_guest_procs(g, &v, &n, err) < 0)
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
static int ctx_kill(const struct moat_guest_ep *g, int pid, moat_error **err) {
  struct moat_proc_stream *s = NULL;
  struct moat_proc_info info;
  memset(&info, 0, sizeof(info));
  if (moat_guest_attach(g, pid, NULL, false, &s, &info, err) < 0) {
    if (*err && (*err)->status == ESRCH) {
      moat_error_free(err);
      return 0;
    }
    return -1;
  }
  bool running = info.running;
  moat_proc_info_clear(&info);
  if (running && moat_guest_proc_signal(g, pid, NULL, SIGKILL, err) < 0) {
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
static int kernel_install(const struct moat_guest_ep *g, const struct lang *l, moat_error **err) {
  struct moat_guest_writer *w = NULL;
  if (moat_guest_write_open(g, l->kernel_path, NULL, 0644, &w, err) < 0)
    return moat_error_wrap(err, "write %s", l->kernel_path);
  int rc = moat_guest_write_chunk(w, l->start, (size_t)(l->end - l->start), err);
  if (rc == 0)
    rc = moat_guest_write_finish(w, NULL, err);
  moat_guest_writer_close(w);
  return rc < 0 ? moat_error_wrap(err, "write %s", l->kernel_path) : 0;
}

/* Starts the kernel of l for cid in cwd. Returns the pid or -1: EINVAL when the interpreter is
 * missing from the sandbox (or cwd is not a directory: ENOENT from the guest). */
static int ctx_start(const struct moat_guest_ep *g, char *const *senv, const char *cid, const struct lang *l,
                     const char *cwd, const char *user, moat_error **err) {
  /* Is the interpreter there? (Starting it would only report "not found" on its stderr.) */
  _cleanup_free_ char *probe = xasprintf("command -v %s >/dev/null", l->interp);
  char *pargv[] = {"/bin/sh", "-c", probe, NULL};
  struct moat_exec_req pr = {.argv = pargv, .timeout_ms = 10000};
  struct moat_exec_result res;
  memset(&res, 0, sizeof(res));
  if (moat_guest_exec(g, &pr, &res, err) < 0)
    return -1;
  int code = res.exit_code;
  moat_exec_result_free(&res);
  if (code != 0)
    return moat_error_set(err, EINVAL,
                          "language '%s' needs %s, which this sandbox's template does not have; create the "
                          "sandbox from the code-interpreter template",
                          l->name, l->hint);
  if (kernel_install(g, l, err) < 0)
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
  if (moat_guest_exec_start(g, &req, &opts, NULL, &pid, err) < 0)
    return -1;
  return pid;
}

/* Kills and starts again the kernel of x (same language, cwd and user). New pid or -1. */
static int ctx_restart(const struct moat_guest_ep *g, char *const *senv, struct moat_ctx *x,
                       moat_error **err) {
  if (ctx_kill(g, x->pid, err) < 0)
    return -1;
  int pid = ctx_start(g, senv, x->id, lang_by_name(x->language), x->cwd, x->user, err);
  if (pid > 0) {
    x->pid = pid;
    x->created_at_ms = wall_ms();
  }
  return pid;
}

/* The guest of org's running sandbox sid, and its env when senv is not NULL. */
static struct moat_guest_ep *guest(struct moat_control *c, const char *org, const char *sid, char ***senv,
                                   moat_error **err) {
  struct moat_guest_ep *g = NULL;
  if (moat_control_guest(c, org, sid, &g, senv, err) < 0)
    return NULL;
  return g;
}

/* Finds context cid of the sandbox: 0, or -1 (MOAT_E_NO_CONTEXT when there is none). */
static int find_context(const struct moat_guest_ep *g, const char *sid, const char *cid, struct moat_ctx *out,
                        moat_error **err) {
  if (!moat_ctx_valid_id(cid))
    return moat_error_set(err, MOAT_E_NO_CONTEXT, "no context '%.64s' in sandbox %s", cid, sid);
  int rc = ctx_find(g, cid, out, err);
  if (rc == 0)
    return moat_error_set(err, MOAT_E_NO_CONTEXT, "no context '%.64s' in sandbox %s", cid, sid);
  return rc < 0 ? -1 : 0;
}

int moat_ctx_create(struct moat_control *c, const char *org, const char *sid, const char *language,
                    const char *cwd, const char *user, struct moat_ctx *out, moat_error **err) {
  memset(out, 0, sizeof(*out));
  const struct lang *l = lang_by_name(language);
  if (!l)
    return moat_error_set(err, EINVAL, "'language' must be python, node or bash, not '%.64s'", language);
  _cleanup_strv_ char **senv = NULL;
  _cleanup_free_ struct moat_guest_ep *g = guest(c, org, sid, &senv, err);
  if (!g)
    return -1;
  char cid[MOAT_CTX_ID_LEN + 1];
  random_id(cid, MOAT_CTX_ID_LEN);
  int pid = ctx_start(g, senv, cid, l, cwd, user, err);
  if (pid < 0)
    return -1;
  memcpy(out->id, cid, sizeof(cid));
  out->pid = pid;
  out->language = l->name;
  out->cwd = xstrdup(cwd);
  out->user = user ? xstrdup(user) : NULL;
  out->created_at_ms = wall_ms();
  return 0;
}

int moat_ctx_list(struct moat_control *c, const char *org, const char *sid, struct moat_ctx **out, size_t *n,
                  moat_error **err) {
  *out = NULL;
  *n = 0;
  _cleanup_free_ struct moat_guest_ep *g = guest(c, org, sid, NULL, err);
  if (!g)
    return -1;
  struct moat_proc_info *v = NULL;
  size_t np = 0;
  if (moat_guest_procs(g, &v, &np, err) < 0)
    return -1;
  struct moat_ctx *cv = xcalloc(np ? np : 1, sizeof(*cv));
  size_t k = 0;
  for (size_t i = 0; i < np; i++)
    if (ctx_from_proc(&v[i], &cv[k]))
      k++;
  moat_proc_infos_free(v, np);
  *out = cv;
  *n = k;
  return 0;
}

int moat_ctx_delete(struct moat_control *c, const char *org, const char *sid, const char *cid,
                    moat_error **err) {
  _cleanup_free_ struct moat_guest_ep *g = guest(c, org, sid, NULL, err);
  if (!g)
    return -1;
  struct moat_ctx x;
  if (find_context(g, sid, cid, &x, err) < 0)
    return -1;
  int rc = ctx_kill(g, x.pid, err);
  moat_ctx_clear(&x);
  return rc;
}

int moat_ctx_restart(struct moat_control *c, const char *org, const char *sid, const char *cid,
                     struct moat_ctx *out, moat_error **err) {
  memset(out, 0, sizeof(*out));
  _cleanup_strv_ char **senv = NULL;
  _cleanup_free_ struct moat_guest_ep *g = guest(c, org, sid, &senv, err);
  if (!g)
    return -1;
  if (find_context(g, sid, cid, out, err) < 0)
    return -1;
  if (!busy_take(c, sid, cid)) {
    moat_ctx_clear(out);
    return moat_error_set(err, MOAT_E_CTX_BUSY, "context %s is running code", cid);
  }
  int pid = ctx_restart(g, senv, out, err);
  busy_give(c, sid, cid);
  if (pid < 0) {
    moat_ctx_clear(out);
    return -1;
  }
  return 0;
}

int moat_ctx_ensure(struct moat_control *c, const char *org, const char *sid, const char *cid,
                    const char *language, const char *cwd, const char *user, moat_error **err) {
  const struct lang *l = lang_by_name(language);
  if (!l || !moat_ctx_valid_id(cid))
    return moat_error_set(err, EINVAL, "no such language '%.64s' or context id '%.64s'", language, cid);
  _cleanup_strv_ char **senv = NULL;
  _cleanup_free_ struct moat_guest_ep *g = guest(c, org, sid, &senv, err);
  if (!g)
    return -1;
  for (int attempt = 0; attempt < 2; attempt++) {
    struct moat_ctx x;
    memset(&x, 0, sizeof(x));
    int rc = ctx_find(g, cid, &x, err);
    moat_ctx_clear(&x);
    if (rc != 0)
      return rc < 0 ? -1 : 0;
    if (ctx_start(g, senv, cid, l, cwd, user, err) > 0)
      return 0;
    /* Another request started it at the same moment (the guest refuses a second kernel with the
     * same tag): find that one. */
    if (attempt > 0 || !*err || (*err)->status != EEXIST)
      return -1;
    moat_error_free(err);
  }
  return -1;
}

/* ---- runs ---- */

struct ev {
  enum moat_ctx_event_type type;
  char *text; /* STDOUT/STDERR bytes */
  size_t len;
  json_t *result;
};

struct moat_ctx_run {
  struct moat_control *c;
  char sid[MOAT_ID_LEN + 1];
  char cid[MOAT_CTX_ID_LEN + 1];
  char rid[17];
  struct moat_guest_ep *g;
  char **senv;
  struct moat_ctx ctx;
  struct moat_proc_stream *ps;
  uint32_t timeout_ms;
  uint64_t deadline_ns;
  bool busy;                /* holds the context's run slot */
  bool finished;            /* no more events come from the kernel */
  bool end_delivered;       /* the END event was handed out */
  bool end_seen[2];         /* stdout, stderr */
  struct moat_buf frame[2]; /* a frame being read, per stream */
  bool in_frame[2];
  struct moat_ctx_outcome outcome;
  struct ev *q; /* events pulled from the kernel, not yet handed out */
  size_t qn, qcap, qpos;
  struct ev cur; /* the event last handed out (freed at the next call) */
};

static void ev_clear(struct ev *e) {
  free(e->text);
  json_decref(e->result);
  memset(e, 0, sizeof(*e));
}

void moat_ctx_run_close(struct moat_ctx_run *u) {
  if (!u)
    return;
  if (u->ps)
    moat_proc_stream_close(u->ps);
  if (u->busy)
    busy_give(u->c, u->sid, u->cid);
  free(u->g);
  strv_free(u->senv);
  moat_ctx_clear(&u->ctx);
  for (int i = 0; i < 2; i++)
    free(u->frame[i].p);
  for (size_t i = u->qpos; i < u->qn; i++)
    ev_clear(&u->q[i]);
  free(u->q);
  ev_clear(&u->cur);
  json_decref(u->outcome.error);
  free(u);
}

static void push(struct moat_ctx_run *u, struct ev e) {
  if (u->qpos > 0 && u->qpos == u->qn)
    u->qpos = u->qn = 0;
  if (u->qn == u->qcap) {
    u->qcap = u->qcap ? u->qcap * 2 : 16;
    u->q = xrealloc(u->q, u->qcap * sizeof(*u->q));
  }
  u->q[u->qn++] = e;
}

/* Output text of the cell on stream which (0 stdout, 1 stderr). */
static void emit_text(struct moat_ctx_run *u, int which, const char *p, size_t n) {
  if (n == 0)
    return;
  struct ev e = {.type = which ? MOAT_CTX_STDERR : MOAT_CTX_STDOUT, .text = xmalloc(n), .len = n};
  memcpy(e.text, p, n);
  push(u, e);
}

static json_t *str_or_null(json_t *v) { return json_is_string(v) ? json_incref(v) : json_null(); }

/* One kernel message of this run. */
static void on_message(struct moat_ctx_run *u, int which, json_t *m) {
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
    push(u, (struct ev){.type = MOAT_CTX_RESULT, .result = res});
  } else if (strcmp(type, "error") == 0) {
    json_t *tb = json_object_get(m, "traceback");
    json_decref(u->outcome.error);
    u->outcome.error = json_pack("{s:o, s:o, s:O}", "name", str_or_null(json_object_get(m, "name")), "value",
                                 str_or_null(json_object_get(m, "value")), "traceback",
                                 json_is_array(tb) ? tb : json_array());
  } else if (strcmp(type, "end") == 0) {
    u->end_seen[which] = true;
    json_t *ec = json_object_get(m, "execution_count");
    if (json_is_integer(ec))
      u->outcome.execution_count = (int)json_integer_value(ec);
    json_t *xc = json_object_get(m, "exit_code");
    if (json_is_integer(xc)) {
      u->outcome.exit_code = (int)json_integer_value(xc);
      u->outcome.has_exit_code = true;
    }
  }
}

/* Splits output bytes of one stream into raw text and framed messages. */
static void on_bytes(struct moat_ctx_run *u, int which, const char *p, size_t n) {
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

static void set_error(struct moat_ctx_run *u, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_error(struct moat_ctx_run *u, const char *name, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  json_decref(u->outcome.error);
  u->outcome.error = json_pack("{s:s, s:s, s:[]}", "name", name, "value", msg, "traceback");
}

/* The kernel died or hung: kill it, start it again, and record why. */
static void run_restart(struct moat_ctx_run *u, const char *name, const char *why) {
  moat_error *err = NULL;
  if (u->ps) {
    moat_proc_stream_close(u->ps);
    u->ps = NULL;
  }
  u->outcome.restarted = true;
  if (ctx_restart(u->g, u->senv, &u->ctx, &err) < 0) {
    set_error(u, name, "%s; restarting the context failed: %s", why, moat_error_msg(err));
    moat_error_free(&err);
  } else {
    set_error(u, name, "%s; the context was restarted (its variables are gone)", why);
  }
  u->finished = true;
}

/* Pulls one kernel event (waiting up to timeout_ms) and handles deadlines. Sets u->finished at the
 * end. */
static void run_step(struct moat_ctx_run *u, int timeout_ms) {
  moat_error *err = NULL;
  uint64_t now = now_ns();
  if (now >= u->deadline_ns) {
    if (!u->outcome.timed_out) {
      u->outcome.timed_out = true;
      u->deadline_ns = now + CTX_GRACE_MS * 1000000ULL;
      if (moat_guest_proc_signal(u->g, u->ctx.pid, NULL, SIGINT, &err) < 0)
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

int moat_ctx_run_next(struct moat_ctx_run *u, struct moat_ctx_event *out, int timeout_ms) {
  memset(out, 0, sizeof(*out));
  ev_clear(&u->cur);
  uint64_t until = now_ns() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0) * 1000000ULL;
  for (;;) {
    if (u->qpos < u->qn) {
      u->cur = u->q[u->qpos++];
      out->type = u->cur.type;
      out->text = u->cur.text;
      out->len = u->cur.len;
      out->result = u->cur.result;
      return 1;
    }
    if (u->finished) {
      if (u->end_delivered)
        return 0;
      if (u->outcome.timed_out && !u->outcome.restarted && !u->outcome.error)
        set_error(u, "TimeoutError", "interrupted at its timeout of %u ms", u->timeout_ms);
      u->end_delivered = true;
      /* the kernel is done with this run: the next may start now, not once the caller has closed
       * this one (a client that got the end may send its next run before the stream is freed) */
      if (u->busy) {
        busy_give(u->c, u->sid, u->cid);
        u->busy = false;
      }
      out->type = MOAT_CTX_END;
      return 1;
    }
    uint64_t now = now_ns();
    if (now >= until && timeout_ms >= 0 && u->qpos == u->qn)
      return 0;
    run_step(u, timeout_ms < 0 ? 500 : (int)((until - now) / 1000000) + 1);
    if (timeout_ms == 0 && u->qpos == u->qn && !u->finished)
      return 0;
  }
}

const struct moat_ctx_outcome *moat_ctx_run_outcome(const struct moat_ctx_run *u) { return &u->outcome; }

void moat_ctx_run_interrupt(struct moat_ctx_run *u) {
  moat_error *err = NULL;
  if (!u->finished && moat_guest_proc_signal(u->g, u->ctx.pid, NULL, SIGINT, &err) < 0)
    moat_error_free(&err);
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

int moat_ctx_run_start(struct moat_control *c, const char *org, const char *sid, const char *cid,
                       const char *code, size_t code_len, const struct moat_ctx_run_opts *opts,
                       struct moat_ctx_run **out, moat_error **err) {
  *out = NULL;
  if (memchr(code, '\0', code_len))
    return moat_error_set(err, EINVAL, "'code' contains a NUL character");
  struct moat_ctx_run *u = xcalloc(1, sizeof(*u));
  u->c = c;
  snprintf(u->sid, sizeof(u->sid), "%s", sid);
  snprintf(u->cid, sizeof(u->cid), "%.16s", cid);
  u->g = guest(c, org, sid, &u->senv, err);
  if (!u->g || find_context(u->g, sid, cid, &u->ctx, err) < 0) {
    moat_ctx_run_close(u);
    return -1;
  }
  /* Runs of one context do not overlap: the caller may wait for its turn (E2B's Jupyter queues
   * executions of a kernel) or hear EBUSY at once. */
  while (!(u->busy = busy_take(c, sid, cid))) {
    if (!opts->wait || !opts->wait(opts->wait_arg)) {
      moat_ctx_run_close(u);
      return moat_error_set(err, MOAT_E_CTX_BUSY,
                            "context %s is running code; runs in one context do not overlap", cid);
    }
    usleep(20000);
  }
  random_id(u->rid, 16);
  u->timeout_ms = opts->timeout_ms;
  /* Attach first, so that nothing the kernel writes for this run is missed. */
  if (moat_guest_attach(u->g, u->ctx.pid, NULL, false, &u->ps, NULL, err) < 0) {
    if (*err && (*err)->status == ESRCH) /* the kernel exited just now */
      (*err)->status = MOAT_E_NO_CONTEXT;
    moat_ctx_run_close(u);
    return -1;
  }
  json_t *line = json_pack("{s:s, s:s%}", "id", u->rid, "code", code, code_len);
  bool bash = strcmp(u->ctx.language, "bash") == 0;
  if (opts->env && json_object_size(opts->env) > 0) { /* for this cell only */
    if (bash)
      bash_env_scripts(opts->env, line);
    else
      json_object_set(line, "env", opts->env);
  }
  if (bash) {
    size_t bl;
    _cleanup_free_ char *b64 = moat_base64_encode(code, code_len, &bl);
    json_object_set_new(line, "code_b64", json_stringn(b64, bl));
  }
  char *ls = json_dumps(line, JSON_COMPACT);
  json_decref(line);
  if (!ls)
    abort(); /* only on out-of-memory: jansson dumps any value it built */
  size_t ll = strlen(ls);
  ls = xrealloc(ls, ll + 2);
  ls[ll++] = '\n';
  int rc = moat_guest_proc_stdin(u->g, u->ctx.pid, NULL, ls, ll, false, err);
  free(ls);
  if (rc < 0) {
    if (*err && (*err)->status == ESRCH)
      (*err)->status = MOAT_E_NO_CONTEXT;
    moat_ctx_run_close(u);
    return -1;
  }
  u->deadline_ns = now_ns() + (uint64_t)opts->timeout_ms * 1000000ULL;
  *out = u;
  return 0;
}

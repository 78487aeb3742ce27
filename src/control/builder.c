/* builder.c -- builds an org's template from a Dockerfile and a build context
 *
 * A build is checked when it is submitted (context, Dockerfile, FROM) and runs in a thread of its
 * own. Every step that changes the file system makes an image of its own, "s-" and the first 24 hex
 * digits of the step's cache key (dockerfile.h: the parent's key, the step's text, and the content
 * of what it copies; the FROM's key covers the org and the base image, so one org's cache never
 * answers another's): a step whose image exists is not run again. A RUN runs in a sandbox of the
 * org made from the parent image (metadata moat.build = the build id), with the sandbox defaults
 * (internet included); once it exits 0 the sandbox is paused, its writable layer exported and the
 * sandbox killed, and the image is the parent's tree (hard links) with that layer applied. COPY and
 * ADD write into such a copy of the parent directly (build_context.c resolves every path inside it).
 * Images are made as IMAGE.tmp-XXXXXX and renamed into place once complete, so a crash leaves no
 * half image under an image's name. A build's log is DATA/builds/BUILD_ID.log, one JSON object per
 * line, the last one its end ({state, error}).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../common/buf.h"
#include "../common/log.h"
#include "../common/sha256.h"
#include "../common/util.h"
#include "../host/build_context.h"
#include "../host/dockerfile.h"
#include "../host/image_tree.h"
#include "../host/images.h"
#include "../host/oci_import.h"
#include "control_internal.h"
#include "spec.h"

#define MAX_BUILDS_RUNNING 2
#define CONTEXT_MAX_ENTRIES 200000
#define RUN_TIMEOUT_MS (3600u * 1000)
#define LAST_LINES 12
#define LOG_LINE_MAX 4096

struct ctl_build {
  char id[24];
  char *org, *name;
  struct moat_control *c;
  struct moat_build_context *ctx;
  struct moat_df_plan *plan;
  char *from_column; /* the FROM's template column: "base", or "NAME@IMAGE" */
  json_t *base;      /* the FROM's image config (an object; empty for a recipe) */
  json_t *layers;    /* the images this build's steps made or reused, in order */
  char **images;     /* build_lock: images it holds (the FROM's and its steps') */
  size_t n_images, cap_images;
  int log_fd;
  char *work_dir;                  /* DATA/builds/BUILD_ID: the context and exported layers */
  struct moat_store_template prev; /* the row before this build (image, layers, config kept on failure) */
  char last[LAST_LINES][256];      /* the current step's last output lines */
  unsigned n_last;
  pthread_t thread;
  struct ctl_build *next;
};

/* ---- the log ---- */

static void log_put(struct ctl_build *b, json_t *rec) {
  json_object_set_new(rec, "time_ms", json_integer(now_unix_ms()));
  char *line = json_dumps(rec, JSON_COMPACT);
  json_decref(rec);
  if (!line)
    return;
  size_t n = strlen(line);
  line = xrealloc(line, n + 2);
  line[n++] = '\n';
  if (write_all(b->log_fd, line, n) < 0)
    log_warn("build %s: write its log: %s", b->id, strerror(errno));
  free(line);
}

static void step_say(struct ctl_build *b, size_t i, const char *stream, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void step_say(struct ctl_build *b, size_t i, const char *stream, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *text = NULL;
  if (vasprintf(&text, fmt, ap) < 0)
    abort();
  va_end(ap);
  const struct moat_df_step *st = &b->plan->steps[i];
  log_put(b, json_pack("{s:I, s:I, s:s, s:s, s:s}", "step", (json_int_t)(i + 1), "line", (json_int_t)st->line,
                       "instruction", st->source, "stream", stream, "text", text));
  free(text);
}

/* An output line of step i's command. */
static void step_output(struct ctl_build *b, size_t i, const char *stream, const char *line, size_t len) {
  if (len > LOG_LINE_MAX)
    len = LOG_LINE_MAX;
  _cleanup_free_ char *text = xstrndup(line, len);
  snprintf(b->last[b->n_last % LAST_LINES], sizeof(b->last[0]), "%s", text);
  b->n_last++;
  json_t *s = json_stringn(text, len);
  if (!s)
    s = json_string("(a line that is not UTF-8)");
  const struct moat_df_step *st = &b->plan->steps[i];
  log_put(b, json_pack("{s:I, s:I, s:s, s:s, s:o}", "step", (json_int_t)(i + 1), "line", (json_int_t)st->line,
                       "instruction", st->source, "stream", stream, "text", s));
}

/* The current step's last output lines, each after a newline ("" when there were none). */
static char *last_lines(struct ctl_build *b) {
  struct moat_buf out = {0};
  unsigned n = b->n_last < LAST_LINES ? b->n_last : LAST_LINES;
  for (unsigned k = b->n_last - n; k < b->n_last; k++) {
    moat_buf_append(&out, "\n", 1);
    moat_buf_append(&out, b->last[k % LAST_LINES], strlen(b->last[k % LAST_LINES]));
  }
  return out.p ? out.p : xstrdup("");
}

/* ---- images ---- */

static void hold_image(struct ctl_build *b, const char *image) {
  pthread_mutex_lock(&b->c->build_lock);
  if (b->n_images + 1 >= b->cap_images) {
    b->cap_images = b->cap_images ? b->cap_images * 2 : 16;
    b->images = xrealloc(b->images, b->cap_images * sizeof(char *));
  }
  b->images[b->n_images++] = xstrdup(image);
  b->images[b->n_images] = NULL;
  pthread_mutex_unlock(&b->c->build_lock);
}

bool ctl_build_uses(struct moat_control *c, const char *image) {
  bool used = false;
  pthread_mutex_lock(&c->build_lock);
  for (struct ctl_build *b = c->builds; b && !used; b = b->next)
    for (size_t i = 0; i < b->n_images && !used; i++)
      used = strcmp(b->images[i], image) == 0;
  pthread_mutex_unlock(&c->build_lock);
  return used;
}

bool ctl_build_running(struct moat_control *c, const char *org, const char *name) {
  bool running = false;
  pthread_mutex_lock(&c->build_lock);
  for (struct ctl_build *b = c->builds; b && !running; b = b->next)
    running = strcmp(b->org, org) == 0 && strcmp(b->name, name) == 0;
  pthread_mutex_unlock(&c->build_lock);
  return running;
}

static bool image_ready(struct moat_control *c, const char *image) {
  _cleanup_free_ char *ready = xasprintf("%s/%s/ready", ctl_image_dir(c, image), image);
  return access(ready, F_OK) == 0;
}

/* A directory made as IMAGE.tmp-XXXXXX, its rootfs a hard-link copy of parent's. *tmp: its path. */
static int image_begin(struct moat_control *c, const char *image, const char *parent, char **tmp,
                       moat_error **err) {
  *tmp = xasprintf("%s/%s.tmp-XXXXXX", c->images_dir, image);
  if (!mkdtemp(*tmp))
    return moat_error_errno(err, "mkdtemp %s", *tmp);
  chmod(*tmp, 0755);
  _cleanup_free_ char *pdir = xasprintf("%s/%s", ctl_image_dir(c, parent), parent);
  _cleanup_close_ int pfd = open(pdir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  _cleanup_close_ int tfd = open(*tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (pfd < 0 || tfd < 0)
    return moat_error_errno(err, "open %s", pfd < 0 ? pdir : *tmp);
  if (moat_image_tree_clone(pfd, tfd, "rootfs", err) < 0)
    return moat_error_wrap(err, "copy image %s", parent);
  return 0;
}

/* Writes size and ready (the key) into tmp and renames it to IMAGE. */
static int image_commit(struct moat_control *c, const char *tmp, const char *image, const char *key,
                        moat_error **err) {
  _cleanup_free_ char *rootfs = xasprintf("%s/rootfs", tmp);
  _cleanup_close_ int rfd = open(rootfs, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  unsigned long long size = rfd >= 0 ? moat_image_tree_size(rfd) : 0;
  _cleanup_free_ char *size_text = xasprintf("%llu\n", size);
  _cleanup_free_ char *ready_text = xasprintf("%s\n", key);
  _cleanup_free_ char *size_path = xasprintf("%s/size", tmp);
  _cleanup_free_ char *ready_path = xasprintf("%s/ready", tmp);
  _cleanup_close_ int sfd = open(size_path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  _cleanup_close_ int kfd = open(ready_path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (sfd < 0 || kfd < 0 || write_all(sfd, size_text, strlen(size_text)) < 0 ||
      write_all(kfd, ready_text, strlen(ready_text)) < 0)
    return moat_error_errno(err, "write %s", ready_path);
  _cleanup_close_ int dfd = open(tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0 || syncfs(dfd) < 0)
    return moat_error_errno(err, "sync %s", tmp);
  _cleanup_free_ char *final = xasprintf("%s/%s", c->images_dir, image);
  if (rename(tmp, final) < 0) {
    if (errno != ENOTEMPTY && errno != EEXIST)
      return moat_error_errno(err, "rename %s to %s", tmp, final);
    moat_error *e = NULL; /* another build made the same image meanwhile: the same content */
    if (rm_rf(tmp, &e) < 0)
      moat_error_free(&e);
  }
  return 0;
}

static void image_abandon(const char *tmp) {
  moat_error *e = NULL;
  if (tmp && rm_rf(tmp, &e) < 0) {
    log_warn("build: remove %s: %s", tmp, moat_error_msg(e));
    moat_error_free(&e);
  }
}

/* ---- steps ---- */

/* The environment a RUN gets: the base image's env, then the step's (ENV and ARGs in scope). */
static char **run_env(struct ctl_build *b, const struct moat_df_step *st) {
  json_t *env = ctl_template_env(b->base, NULL);
  for (char **e = st->env; e && *e; e++)
    ctl_env_set_kv(env, *e);
  char **v = moat_env_merge(env, NULL);
  json_decref(env);
  return v;
}

/* Splits a stream's bytes into lines for the log; *pending holds an unfinished line. */
static void feed_lines(struct ctl_build *b, size_t i, const char *stream, struct moat_buf *pending,
                       const char *data, size_t len) {
  for (size_t k = 0; k < len; k++) {
    if (data[k] == '\n' || data[k] == '\r' || pending->len >= LOG_LINE_MAX) {
      if (pending->len)
        step_output(b, i, stream, pending->p, pending->len);
      pending->len = 0;
      if (data[k] == '\n' || data[k] == '\r')
        continue;
    }
    moat_buf_append(pending, &data[k], 1);
  }
}

/* The sandbox's writable layer into dst_fd/name (it is paused). */
static int export_layer(struct moat_control *c, const char *id, int dst_fd, const char *name,
                        moat_error **err) {
  struct live *e = live_get(c, id);
  if (!e)
    return moat_error_set(err, ENOENT, "build sandbox %s is gone", id);
  pthread_mutex_lock(&e->m);
  int rc = e->slot >= 0 && e->state != MOAT_SB_KILLED
               ? moat_host_export_layer(c->host, e->slot, dst_fd, name, err)
               : moat_error_set(err, ENOENT, "build sandbox %s holds no slot", id);
  pthread_mutex_unlock(&e->m);
  live_put(c, e);
  return rc;
}

static void kill_quietly(struct moat_control *c, const char *org, const char *id) {
  moat_error *e = NULL;
  if (moat_control_kill(c, org, id, "api", &e) < 0) {
    log_warn("build: kill sandbox %s: %s", id, moat_error_msg(e));
    moat_error_free(&e);
  }
}

/* Runs RUN step i in a sandbox of parent and leaves its changes as the layer work_dir/NAME. */
static int run_step(struct ctl_build *b, size_t i, const char *parent_column, const char *layer_name,
                    moat_error **err) {
  struct moat_control *c = b->c;
  const struct moat_df_step *st = &b->plan->steps[i];
  struct moat_sandbox_spec spec = {0};
  struct ctl_new n = {.template_name = parent_column};
  if (moat_spec_resolve(&spec, &c->bounds, &n.limits, &n.ttl_seconds, err) < 0)
    return -1;
  _cleanup_json_ json_t *meta = json_pack("{s:s}", "moat.build", b->id);
  n.metadata = meta;
  char id[MOAT_ID_LEN + 1];
  pthread_rwlock_rdlock(&c->images_lock);
  int rc = ctl_create(c, b->org, &n, id, NULL, err);
  pthread_rwlock_unlock(&c->images_lock);
  if (rc < 0)
    return moat_error_wrap(err, "build sandbox");
  step_say(b, i, "moat", "running in sandbox %s", id);
  _cleanup_free_ struct moat_guest_ep *ep = NULL;
  _cleanup_strv_ char **env = run_env(b, st);
  const char *user_spec = st->user ? st->user : json_string_value(json_object_get(b->base, "user"));
  /* "user[:group]", a name or a uid: the guest takes the user, with its own groups */
  _cleanup_free_ char *user = user_spec && user_spec[0] ? xstrndup(user_spec, strcspn(user_spec, ":")) : NULL;
  struct moat_proc_stream *ps = NULL;
  int pid = 0, exit_code = -1, sig = 0;
  bool timed_out = false;
  struct moat_exec_req req = {
      .argv = st->argv, .env = env, .cwd = st->workdir, .user = user, .timeout_ms = RUN_TIMEOUT_MS};
  struct moat_exec_opts opts = {0};
  if (moat_control_guest(c, b->org, id, &ep, NULL, err) < 0 ||
      moat_guest_exec_start(ep, &req, &opts, &ps, &pid, err) < 0) {
    kill_quietly(c, b->org, id);
    return moat_error_wrap(err, "start %s", st->argv[0]);
  }
  struct moat_buf out_line = {0}, err_line = {0};
  b->n_last = 0;
  for (;;) {
    struct moat_proc_event ev;
    if (moat_proc_stream_next(ps, &ev, 1000, err) < 0) {
      if (err && *err && (*err)->status == ETIMEDOUT && !__atomic_load_n(&c->stop, __ATOMIC_RELAXED)) {
        moat_error_free(err);
        continue;
      }
      break;
    }
    if (ev.type == MOAT_PROC_STDOUT)
      feed_lines(b, i, "stdout", &out_line, ev.data, ev.len);
    else if (ev.type == MOAT_PROC_STDERR)
      feed_lines(b, i, "stderr", &err_line, ev.data, ev.len);
    else if (ev.type == MOAT_PROC_EXIT) {
      exit_code = ev.exit_code;
      sig = ev.signal;
      timed_out = ev.timed_out;
      rc = 1;
      break;
    }
  }
  if (out_line.len)
    step_output(b, i, "stdout", out_line.p, out_line.len);
  if (err_line.len)
    step_output(b, i, "stderr", err_line.p, err_line.len);
  free(out_line.p);
  free(err_line.p);
  moat_proc_stream_close(ps);
  if (rc != 1) {
    kill_quietly(c, b->org, id);
    return moat_error_wrap(err, "step %zu (%s)", i + 1, st->source);
  }
  if (exit_code != 0 || sig || timed_out) {
    kill_quietly(c, b->org, id);
    _cleanup_free_ char *tail = last_lines(b);
    if (timed_out)
      return moat_error_set(err, EINVAL, "step %zu (%s) ran longer than %u s%s", i + 1, st->source,
                            RUN_TIMEOUT_MS / 1000, tail);
    if (sig)
      return moat_error_set(err, EINVAL, "step %zu (%s) was killed by signal %d%s", i + 1, st->source, sig,
                            tail);
    return moat_error_set(err, EINVAL, "step %zu (%s) exited %d%s", i + 1, st->source, exit_code, tail);
  }
  _cleanup_close_ int wfd = open(b->work_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (wfd < 0)
    rc = moat_error_errno(err, "open %s", b->work_dir);
  else if ((rc = moat_control_pause(c, b->org, id, err)) == 0)
    rc = export_layer(c, id, wfd, layer_name, err);
  kill_quietly(c, b->org, id);
  return rc < 0 ? moat_error_wrap(err, "step %zu: its changes", i + 1) : 0;
}

/* Makes image (the result of FS step i) from parent; nothing is left under its name on failure. */
static int make_image(struct ctl_build *b, size_t i, const char *parent, const char *parent_column,
                      const char *image, moat_error **err) {
  struct moat_control *c = b->c;
  const struct moat_df_step *st = &b->plan->steps[i];
  _cleanup_free_ char *layer = NULL;
  if (st->kind == MOAT_DF_RUN) {
    layer = xasprintf("layer-%zu", i + 1);
    if (run_step(b, i, parent_column, layer, err) < 0)
      return -1;
  }
  _cleanup_free_ char *tmp = NULL;
  int rc = image_begin(c, image, parent, &tmp, err);
  _cleanup_free_ char *rootfs = tmp ? xasprintf("%s/rootfs", tmp) : NULL;
  if (rc == 0 && st->kind == MOAT_DF_RUN) {
    _cleanup_close_ int tfd = open(tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    _cleanup_close_ int wfd = open(b->work_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (tfd < 0 || wfd < 0)
      rc = moat_error_errno(err, "open %s", tfd < 0 ? tmp : b->work_dir);
    else
      rc = moat_image_tree_apply(tfd, "rootfs", wfd, layer, err);
  } else if (rc == 0) {
    _cleanup_close_ int root = open(rootfs, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (root < 0) {
      rc = moat_error_errno(err, "open %s", rootfs);
    } else if (st->kind == MOAT_DF_WORKDIR) {
      rc = moat_image_mkdirs(root, st->argv[0], err);
    } else {
      _cleanup_strv_ char **expanded = NULL;
      struct moat_copy_opts o = {.dest = st->argv[st->argc - 1],
                                 .workdir = st->workdir,
                                 .chown = st->chown,
                                 .chmod = st->chmod,
                                 .add = st->kind == MOAT_DF_ADD};
      rc = moat_build_context_expand(b->ctx, st->argv, st->argc - 1, &expanded, err);
      if (rc == 0)
        rc = moat_build_context_copy(b->ctx, root, expanded, strv_len(expanded), &o, err);
    }
  }
  if (layer) {
    _cleanup_free_ char *lp = xasprintf("%s/%s", b->work_dir, layer);
    image_abandon(lp);
  }
  if (rc == 0)
    rc = image_commit(c, tmp, image, st->key_hex, err);
  if (rc < 0) {
    image_abandon(tmp);
    return moat_error_wrap(err, "step %zu (%s)", i + 1, st->source);
  }
  return 0;
}

/* The digest of FROM: the org (no cache crosses orgs), the base image and what it was built from. */
static void from_digest(struct ctl_build *b, uint8_t out[MOAT_SHA256_LEN]) {
  const char *image = ctl_image_of(b->from_column);
  _cleanup_free_ char *ready_path = xasprintf("%s/%s/ready", ctl_image_dir(b->c, image), image);
  _cleanup_free_ char *ready = NULL;
  moat_error *e = NULL;
  if (read_file(ready_path, &ready, NULL, &e) < 0)
    moat_error_free(&e);
  struct moat_sha256 s;
  moat_sha256_init(&s);
  moat_sha256_update(&s, b->org, strlen(b->org) + 1);
  moat_sha256_update(&s, image, strlen(image) + 1);
  if (ready)
    moat_sha256_update(&s, ready, strlen(ready));
  moat_sha256_final(&s, out);
}

/* Sets the digest of every step that takes one; the COPY/ADD sources are expanded and hashed. */
static int set_digests(struct ctl_build *b, moat_error **err) {
  uint8_t d[MOAT_SHA256_LEN];
  from_digest(b, d);
  if (moat_dockerfile_plan_set_digest(b->plan, 0, d, err) < 0)
    return -1;
  for (size_t i = 1; i < b->plan->n_steps; i++) {
    const struct moat_df_step *st = &b->plan->steps[i];
    if (st->kind != MOAT_DF_COPY && st->kind != MOAT_DF_ADD)
      continue;
    _cleanup_strv_ char **expanded = NULL;
    struct moat_copy_opts o = {.dest = st->argv[st->argc - 1],
                               .workdir = st->workdir,
                               .chown = st->chown,
                               .chmod = st->chmod,
                               .add = st->kind == MOAT_DF_ADD};
    if (moat_build_context_expand(b->ctx, st->argv, st->argc - 1, &expanded, err) < 0 ||
        moat_build_context_digest(b->ctx, expanded, strv_len(expanded), &o, d, err) < 0 ||
        moat_dockerfile_plan_set_digest(b->plan, i, d, err) < 0)
      return moat_error_wrap(err, "line %u (%s)", st->line, st->source);
  }
  return 0;
}

/* ---- the image config ---- */

static json_t *strv_json(char *const *v) {
  json_t *a = json_array();
  for (; v && *v; v++)
    json_array_append_new(a, json_string(*v));
  return a;
}

/* The config the template's image gets: the base image's with this Dockerfile's over it. */
static json_t *image_config(struct ctl_build *b) {
  const struct moat_df_config *dc = &b->plan->config;
  json_t *base = b->base;
  json_t *cfg = json_object();
  /* env: the base's, a later value of the same name replacing */
  json_t *env_obj = json_object(), *order = json_array();
  json_t *lists[2] = {json_object_get(base, "env"), strv_json(dc->env)};
  for (int l = 0; l < 2; l++) {
    size_t i;
    json_t *kv;
    json_array_foreach(lists[l], i, kv) {
      const char *s = json_string_value(kv), *eq = s ? strchr(s, '=') : NULL;
      if (!eq || eq == s)
        continue;
      _cleanup_free_ char *k = xstrndup(s, (size_t)(eq - s));
      if (!json_object_get(env_obj, k))
        json_array_append_new(order, json_string(k));
      json_object_set_new(env_obj, k, json_string(s));
    }
  }
  json_decref(lists[1]);
  json_t *env = json_array();
  size_t i;
  json_t *k;
  json_array_foreach(order, i, k) json_array_append(env, json_object_get(env_obj, json_string_value(k)));
  json_decref(order);
  json_decref(env_obj);
  json_object_set_new(cfg, "env", env);
  const char *workdir = dc->workdir ? dc->workdir : json_string_value(json_object_get(base, "workdir"));
  const char *user = dc->user ? dc->user : json_string_value(json_object_get(base, "user"));
  json_object_set_new(cfg, "workdir", workdir ? json_string(workdir) : json_null());
  json_object_set_new(cfg, "user", user ? json_string(user) : json_null());
  /* entrypoint and cmd as Docker keeps them for an image built FROM this one, and the start command */
  _cleanup_strv_ char **bep = ctl_json_strv(json_object_get(base, "entrypoint"), false);
  _cleanup_strv_ char **bcmd = ctl_json_strv(json_object_get(base, "cmd"), false);
  json_t *ep =
      dc->entrypoint_set ? strv_json(dc->entrypoint) : json_incref(json_object_get(base, "entrypoint"));
  json_t *cmd = dc->cmd_set          ? strv_json(dc->cmd)
                : dc->entrypoint_set ? json_null()
                                     : json_incref(json_object_get(base, "cmd"));
  json_object_set_new(cfg, "entrypoint", ep ? ep : json_null());
  json_object_set_new(cfg, "cmd", cmd ? cmd : json_null());
  _cleanup_strv_ char **start = moat_dockerfile_start_argv(dc, bep, bcmd);
  json_object_set_new(cfg, "start", start ? strv_json(start) : json_null());
  /* readiness: this Dockerfile's HEALTHCHECK (NONE: none), else the base's */
  if (dc->health.set && !dc->health.none && dc->health.test && dc->health.test[0]) {
    json_object_set_new(cfg, "ready",
                        json_pack("{s:o, s:I, s:I, s:I, s:I}", "argv", strv_json(dc->health.test),
                                  "interval_ms", (json_int_t)dc->health.interval_ms, "timeout_ms",
                                  (json_int_t)dc->health.timeout_ms, "start_period_ms",
                                  (json_int_t)dc->health.start_period_ms, "retries",
                                  (json_int_t)dc->health.retries));
  } else if (dc->health.set) {
    json_object_set_new(cfg, "ready", json_null());
  } else {
    json_t *r = json_object_get(base, "ready");
    json_object_set_new(cfg, "ready", r ? json_incref(r) : json_null());
  }
  /* exposed ports and labels: the base's and this Dockerfile's */
  json_t *exposed = json_array();
  json_t *bexp = json_object_get(base, "exposed");
  json_array_foreach(bexp, i, k) json_array_append(exposed, k);
  for (char **p = dc->exposed; p && *p; p++) {
    bool seen = false;
    json_array_foreach(exposed, i, k) seen = seen || strcmp(json_string_value(k), *p) == 0;
    if (!seen)
      json_array_append_new(exposed, json_string(*p));
  }
  json_object_set_new(cfg, "exposed", exposed);
  json_t *labels =
      json_object_get(base, "labels") ? json_deep_copy(json_object_get(base, "labels")) : json_object();
  for (size_t l = 0; l < dc->n_labels; l++)
    json_object_set_new(labels, dc->labels[l].key,
                        json_string(dc->labels[l].value ? dc->labels[l].value : ""));
  json_object_set_new(cfg, "labels", labels);
  const char *stopsig =
      dc->stopsignal ? dc->stopsignal : json_string_value(json_object_get(base, "stopsignal"));
  json_object_set_new(cfg, "stopsignal", stopsig ? json_string(stopsig) : json_null());
  return cfg;
}

/* ---- a build's record ---- */

/* A name an org may give a template of its own. */
static int new_template_name(struct moat_control *c, const char *name, moat_error **err) {
  if (!ctl_template_name_valid(name))
    return moat_error_set(err, EINVAL, "template name '%s': must match ^[a-z0-9][a-z0-9._-]{0,62}$", name);
  if (moat_template_exists(c->templates, name))
    return moat_error_set(err, EEXIST, "'%s' is a template of moatd's own; choose another name", name);
  return 0;
}

static struct ctl_build *build_new(struct moat_control *c, const char *org, const char *name,
                                   const char *prefix) {
  struct ctl_build *b = xcalloc(1, sizeof(*b));
  b->log_fd = -1;
  b->c = c;
  b->org = xstrdup(org);
  b->name = xstrdup(name);
  memcpy(b->id, prefix, 3);
  random_id(b->id + 3, 17);
  b->layers = json_array();
  return b;
}

/* Adds b to the running builds unless one of its org and name runs (build_lock held). */
static bool build_register_locked(struct moat_control *c, struct ctl_build *b) {
  for (struct ctl_build *o = c->builds; o; o = o->next)
    if (strcmp(o->org, b->org) == 0 && strcmp(o->name, b->name) == 0)
      return false;
  b->next = c->builds;
  c->builds = b;
  return true;
}

static void build_unregister_locked(struct moat_control *c, struct ctl_build *b) {
  for (struct ctl_build **p = &c->builds; *p; p = &(*p)->next)
    if (*p == b) {
      *p = b->next;
      break;
    }
}

/* ---- the build ---- */

static void row_finish(struct ctl_build *b, const char *image, json_t *config, uint64_t size,
                       const char *error) {
  struct moat_store_template r = b->prev; /* borrowed strings */
  _cleanup_free_ char *layers = NULL, *cfg = NULL;
  r.org = b->org;
  r.name = b->name;
  r.build_id = b->id;
  r.source = (char *)"dockerfile";
  r.from_ref = b->plan->config.from;
  r.updated_at_ms = now_unix_ms();
  if (!error) {
    layers = json_dumps(b->layers, JSON_COMPACT);
    cfg = json_dumps(config, JSON_COMPACT | JSON_SORT_KEYS);
    r.state = (char *)"ready";
    r.image = (char *)image;
    r.layers_json = layers;
    r.config_json = cfg;
    r.size_bytes = size;
    r.error = NULL;
  } else {
    r.state = (char *)"failed";
    r.error = (char *)error;
  }
  moat_error *e = NULL;
  if (moat_store_template_put(b->c->store, &r, &e) < 0) {
    log_error("build %s: record its end: %s", b->id, moat_error_msg(e));
    moat_error_free(&e);
  }
}

static int build_steps(struct ctl_build *b, char **image_out, moat_error **err) {
  struct moat_control *c = b->c;
  _cleanup_free_ char *parent = xstrdup(ctl_image_of(b->from_column));
  _cleanup_free_ char *parent_column = xstrdup(b->from_column);
  step_say(b, 0, "moat", "FROM %s", parent);
  for (size_t i = 1; i < b->plan->n_steps; i++) {
    const struct moat_df_step *st = &b->plan->steps[i];
    if (__atomic_load_n(&c->stop, __ATOMIC_RELAXED))
      return moat_error_set(err, ECANCELED, "moatd is stopping");
    if (!st->changes_fs)
      continue;
    if (st->kind == MOAT_DF_WORKDIR) { /* a layer only when the directory is not there yet */
      _cleanup_free_ char *root = xasprintf("%s/%s/rootfs", ctl_image_dir(c, parent), parent);
      _cleanup_close_ int rfd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      if (rfd >= 0 && moat_image_has_dir(rfd, st->argv[0]))
        continue;
    }
    char image[27];
    snprintf(image, sizeof(image), "s-%.24s", st->key_hex);
    hold_image(b, image);
    uint64_t t0 = now_ns();
    if (image_ready(c, image)) {
      step_say(b, i, "moat", "CACHED %s", image);
    } else {
      step_say(b, i, "moat", "%s", st->source);
      if (make_image(b, i, parent, parent_column, image, err) < 0)
        return -1;
      step_say(b, i, "moat", "done in %.2f s: %s", (double)(now_ns() - t0) / 1e9, image);
    }
    json_array_append_new(b->layers, json_string(image));
    free(parent);
    parent = xstrdup(image);
    free(parent_column);
    parent_column = xasprintf("%s.build@%s", b->name, image);
  }
  *image_out = steal_pointer(&parent);
  return 0;
}

static void build_free(struct ctl_build *b) {
  if (!b)
    return;
  moat_build_context_free(b->ctx);
  moat_dockerfile_plan_free(b->plan);
  free(b->from_column);
  json_decref(b->base);
  json_decref(b->layers);
  strv_free(b->images);
  if (b->log_fd >= 0)
    close(b->log_fd);
  if (b->work_dir) {
    moat_error *e = NULL;
    if (rm_rf(b->work_dir, &e) < 0)
      moat_error_free(&e);
  }
  free(b->work_dir);
  moat_store_template_clear(&b->prev);
  free(b->org);
  free(b->name);
  free(b);
}

static void *build_main(void *arg) {
  struct ctl_build *b = arg;
  struct moat_control *c = b->c;
  pthread_mutex_lock(&c->build_lock);
  if (c->builds_running >= MAX_BUILDS_RUNNING)
    log_put(b, json_pack("{s:s}", "text", "queued: other builds run"));
  while (c->builds_running >= MAX_BUILDS_RUNNING && !__atomic_load_n(&c->stop, __ATOMIC_RELAXED))
    pthread_cond_wait(&c->build_cond, &c->build_lock);
  c->builds_running++;
  pthread_mutex_unlock(&c->build_lock);

  uint64_t t0 = now_ns();
  moat_error *err = NULL;
  _cleanup_free_ char *image = NULL;
  int rc = build_steps(b, &image, &err);
  _cleanup_json_ json_t *config = rc == 0 ? image_config(b) : NULL;
  uint64_t size = 0;
  if (rc == 0) {
    _cleanup_free_ char *root = xasprintf("%s/%s/rootfs", ctl_image_dir(c, image), image);
    _cleanup_close_ int rfd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    size = rfd >= 0 ? moat_image_tree_size(rfd) : 0;
    row_finish(b, image, config, size, NULL);
    log_put(b, json_pack("{s:s, s:n, s:s, s:I}", "state", "ready", "error", "image", image, "size_bytes",
                         (json_int_t)size));
    log_info("template %s of %s built in %.1f s: image %s", b->name, b->org, (double)(now_ns() - t0) / 1e9,
             image);
  } else {
    row_finish(b, NULL, NULL, 0, moat_error_msg(err));
    log_put(b, json_pack("{s:s, s:s}", "state", "failed", "error", moat_error_msg(err)));
    log_info("template %s of %s: build %s failed: %s", b->name, b->org, b->id, moat_error_msg(err));
  }
  moat_error_free(&err);

  pthread_mutex_lock(&c->build_lock);
  c->builds_running--;
  build_unregister_locked(c, b);
  pthread_cond_broadcast(&c->build_cond);
  pthread_mutex_unlock(&c->build_lock);
  build_free(b);
  ctl_images_gc(c);
  pthread_mutex_lock(&c->build_lock);
  c->builds_detached--;
  pthread_cond_broadcast(&c->build_cond);
  pthread_mutex_unlock(&c->build_lock);
  return NULL;
}

/* Parses "K=V" build args. */
static struct moat_df_kv *build_args(const struct moat_template_build_req *req, moat_error **err) {
  struct moat_df_kv *v = xcalloc(req->n_build_args + 1, sizeof(*v));
  for (size_t i = 0; i < req->n_build_args; i++) {
    const char *eq = strchr(req->build_args[i], '=');
    if (!eq || eq == req->build_args[i]) {
      for (size_t k = 0; k < i; k++) {
        free(v[k].key);
        free(v[k].value);
      }
      free(v);
      moat_error_set(err, EINVAL, "build arg '%s': must be NAME=VALUE", req->build_args[i]);
      return NULL;
    }
    v[i].key = xstrndup(req->build_args[i], (size_t)(eq - req->build_args[i]));
    v[i].value = xstrdup(eq + 1);
  }
  return v;
}

int moat_control_template_submit(struct moat_control *c, const char *org,
                                 const struct moat_template_build_req *req, struct moat_user_template *out,
                                 moat_error **err) {
  const char *name = req->name;
  if (new_template_name(c, name, err) < 0)
    return -1;
  if (ctl_build_running(c, org, name))
    return moat_error_set(err, MOAT_E_TEMPLATE_BUILDING, "template '%s' is building already", name);
  if (mkdir_p(c->builds_dir, 0700, err) < 0)
    return -1;

  struct ctl_build *b = build_new(c, org, name, "bd-");
  b->work_dir = xasprintf("%s/%s", c->builds_dir, b->id);
  int rc = -1;
  _cleanup_free_ char *text = NULL, *log_path = NULL;
  size_t len = 0;
  unsigned line = 0;
  const char *df = req->dockerfile ? req->dockerfile : "Dockerfile";
  struct moat_df_kv *args = NULL;
  moat_error *e = NULL;
  if (mkdir(b->work_dir, 0700) < 0) {
    moat_error_errno(err, "mkdir %s", b->work_dir);
    free(b->work_dir);
    b->work_dir = NULL;
    goto out;
  }
  if (moat_build_context_open(&b->ctx, req->context_fd, b->work_dir, c->build_context_max_bytes,
                              CONTEXT_MAX_ENTRIES, err) < 0) {
    moat_error_wrap(err, "build context");
    goto out;
  }
  if (moat_build_context_read(b->ctx, df, &text, &len, MOAT_DF_MAX_SIZE, err) < 0) {
    if ((*err)->status == ENOENT)
      (*err)->status = EINVAL;
    moat_error_wrap(err, "Dockerfile '%s'", df);
    goto out;
  }
  if (!(args = build_args(req, err)))
    goto out;
  b->plan = moat_dockerfile_parse(text, len, args, req->n_build_args, &line, err);
  for (size_t i = 0; i < req->n_build_args; i++) {
    free(args[i].key);
    free(args[i].value);
  }
  free(args);
  if (!b->plan) {
    moat_error_wrap(err, "%s", df);
    goto out;
  }
  const char *from = b->plan->config.from;
  if (strcmp(from, name) == 0) {
    moat_error_set(err, EINVAL, "line %u: FROM %s: a template cannot be built FROM itself",
                   b->plan->steps[0].line, from);
    goto out;
  }
  pthread_rwlock_rdlock(&c->images_lock);
  rc = ctl_template_resolve(c, org, from, &b->from_column, &b->base, err);
  if (rc == 0)
    hold_image(b, ctl_image_of(b->from_column));
  pthread_rwlock_unlock(&c->images_lock);
  if (rc < 0) {
    if ((*err)->status == EINVAL)
      moat_error_set(&e, EINVAL,
                     "line %u: FROM %s: not a template here (FROM takes a template of moatd's own, such as "
                     "base or code-interpreter, or one of yours; registries are not reached: import an "
                     "image with POST /v1/templates/NAME/import)",
                     b->plan->steps[0].line, from);
    if (e) {
      moat_error_free(err);
      *err = e;
    }
    goto out;
  }
  rc = -1;
  if (!b->base)
    b->base = json_object();
  if (set_digests(b, err) < 0) { /* a COPY source the context lacks is the request's fault */
    if ((*err)->status == ENOENT)
      (*err)->status = EINVAL;
    goto out;
  }
  if (moat_store_template_get(c->store, org, name, &b->prev, &e) < 0) {
    if (e->status != ENOENT) {
      *err = e;
      goto out;
    }
    moat_error_free(&e);
    b->prev.created_at_ms = now_unix_ms();
  }
  log_path = xasprintf("%s/%s.log", c->builds_dir, b->id);
  b->log_fd = open(log_path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0600);
  if (b->log_fd < 0) {
    moat_error_errno(err, "open %s", log_path);
    goto out;
  }
  struct moat_store_template r = b->prev;
  r.org = b->org;
  r.name = b->name;
  r.state = (char *)"building";
  r.build_id = b->id;
  r.source = (char *)"dockerfile";
  r.from_ref = (char *)from;
  r.error = NULL;
  r.updated_at_ms = now_unix_ms();
  pthread_mutex_lock(&c->build_lock);
  if (!build_register_locked(c, b)) {
    pthread_mutex_unlock(&c->build_lock);
    moat_error_set(err, MOAT_E_TEMPLATE_BUILDING, "template '%s' is building already", name);
    unlink(log_path);
    goto out;
  }
  if (moat_store_template_put(c->store, &r, err) < 0) {
    build_unregister_locked(c, b);
    pthread_mutex_unlock(&c->build_lock);
    unlink(log_path);
    goto out;
  }
  c->builds_detached++;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  int perr = pthread_create(&b->thread, &attr, build_main, b);
  pthread_attr_destroy(&attr);
  if (perr != 0) {
    build_unregister_locked(c, b);
    c->builds_detached--;
    pthread_mutex_unlock(&c->build_lock);
    row_finish(b, NULL, NULL, 0, "could not start the build thread");
    moat_error_set(err, EAGAIN, "start a build thread: %s", strerror(perr));
    goto out;
  }
  log_info("template %s of %s: build %s started (FROM %s, %zu steps)", name, org, b->id, from,
           b->plan->n_steps);
  pthread_mutex_unlock(&c->build_lock);
  if (out)
    return moat_control_user_template_get(c, org, name, out, err);
  return 0;
out:
  build_free(b);
  return -1;
}

int moat_control_build_log_read(struct moat_control *c, const char *org, const char *name,
                                const char *build_id, uint64_t *offset, json_t *lines, bool *ended,
                                moat_error **err) {
  struct moat_store_template r = {0};
  if (!ctl_template_name_valid(name) || moat_store_template_get(c->store, org, name, &r, err) < 0)
    return moat_error_set(err, ENOENT, "no template '%s'", name);
  bool same = strcmp(r.build_id, build_id) == 0;
  moat_store_template_clear(&r);
  if (!same)
    return moat_error_set(err, ENOENT, "no build '%s' of template '%s' (only its last build's log is kept)",
                          build_id, name);
  _cleanup_free_ char *path = xasprintf("%s/%s.log", c->builds_dir, build_id);
  _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return moat_error_errno(err, "build log of %s", build_id);
  char buf[65536];
  *ended = false;
  for (;;) {
    ssize_t n = pread(fd, buf, sizeof(buf), (off_t)*offset);
    if (n < 0)
      return moat_error_errno(err, "read %s", path);
    size_t used = 0;
    for (size_t k = 0; k < (size_t)n; k++) {
      if (buf[k] != '\n')
        continue;
      json_t *rec = json_loadb(buf + used, k - used, 0, NULL);
      if (rec) {
        if (json_object_get(rec, "state"))
          *ended = true;
        json_array_append_new(lines, rec);
      }
      used = k + 1;
    }
    *offset += used;
    if (used == 0 || (size_t)n < sizeof(buf) || json_array_size(lines) >= 1000)
      break;
  }
  return 0;
}

int moat_control_upload_spool(struct moat_control *c, moat_error **err) {
  if (mkdir_p(c->builds_dir, 0700, err) < 0)
    return -1;
  int fd = open(c->builds_dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd >= 0)
    return fd;
  if (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL) /* else a file system without O_TMPFILE */
    return moat_error_errno(err, "a temporary file in %s", c->builds_dir);
  _cleanup_free_ char *path = xasprintf("%s/upload.tmp-XXXXXX", c->builds_dir);
  fd = mkostemp(path, O_CLOEXEC);
  if (fd < 0)
    return moat_error_errno(err, "a temporary file in %s", c->builds_dir);
  unlink(path);
  return fd;
}

/* A tar of many small files is mostly headers: room for them beside the file data. */
uint64_t moat_control_upload_max(const struct moat_control *c) {
  return c->build_context_max_bytes * 2 + (64ull << 20);
}

int ctl_builder_open(struct moat_control *c, moat_error **err) {
  if (moat_store_templates_fail_building(c->store, "moatd stopped during the build", err) < 0)
    return -1;
  if (mkdir_p(c->builds_dir, 0700, err) < 0)
    return -1;
  /* the sandboxes of builds cut short (adopted by the recovery before this) */
  struct moat_store_filter f = {0};
  struct moat_store_sandbox *sbs = NULL;
  size_t nsb = 0;
  if (moat_store_sandbox_list(c->store, &f, &sbs, &nsb, err) < 0)
    return -1;
  for (size_t i = 0; i < nsb; i++) {
    _cleanup_json_ json_t *meta = parse_object(sbs[i].metadata_json);
    if (!json_object_get(meta, "moat.build"))
      continue;
    moat_error *e = NULL;
    if (moat_control_kill(c, sbs[i].org, sbs[i].id, "host_restart", &e) < 0) {
      log_warn("build sandbox %s: %s", sbs[i].id, moat_error_msg(e));
      moat_error_free(&e);
    }
  }
  moat_store_sandboxes_free(sbs, nsb);
  /* the work dirs of builds cut short, and logs of builds no template names */
  struct moat_store_template *rows = NULL;
  size_t n = 0;
  if (moat_store_template_list(c->store, NULL, &rows, &n, err) < 0)
    return -1;
  DIR *d = opendir(c->builds_dir);
  struct dirent *de;
  while (d && (de = readdir(d))) {
    if (de->d_name[0] == '.')
      continue;
    bool keep = false;
    for (size_t i = 0; i < n && !keep; i++) {
      _cleanup_free_ char *logname = xasprintf("%s.log", rows[i].build_id);
      keep = strcmp(de->d_name, logname) == 0;
    }
    if (keep)
      continue;
    _cleanup_free_ char *p = xasprintf("%s/%s", c->builds_dir, de->d_name);
    moat_error *e = NULL;
    if (rm_rf(p, &e) < 0)
      moat_error_free(&e);
  }
  if (d)
    closedir(d);
  moat_store_templates_free(rows, n);
  /* start states a crash left half baked */
  d = opendir(c->baked_dir);
  while (d && (de = readdir(d))) {
    if (!strstr(de->d_name, ".partial-"))
      continue;
    _cleanup_free_ char *p = xasprintf("%s/%s", c->baked_dir, de->d_name);
    moat_image_dir_remove(p);
  }
  if (d)
    closedir(d);
  /* images a crash left half made (DATA/images is moatd's alone) */
  if (mkdir_p(c->images_dir, 0755, err) < 0)
    return -1;
  d = opendir(c->images_dir);
  while (d && (de = readdir(d))) {
    if (!strstr(de->d_name, ".tmp-"))
      continue;
    _cleanup_free_ char *p = xasprintf("%s/%s", c->images_dir, de->d_name);
    moat_error *e = NULL;
    if (rm_rf(p, &e) < 0)
      moat_error_free(&e);
  }
  if (d)
    closedir(d);
  return 0;
}

void ctl_builder_close(struct moat_control *c) {
  pthread_mutex_lock(&c->build_lock);
  pthread_cond_broadcast(&c->build_cond);
  while (c->builds_detached > 0)
    pthread_cond_wait(&c->build_cond, &c->build_lock);
  pthread_mutex_unlock(&c->build_lock);
}

/* ---- imports ---- */

static json_t *oci_config_json(const struct moat_oci_config *o) {
  json_t *cfg = json_object();
  json_object_set_new(cfg, "env", strv_json(o->env));
  json_object_set_new(cfg, "workdir", o->workdir && o->workdir[0] ? json_string(o->workdir) : json_null());
  json_object_set_new(cfg, "user", o->user && o->user[0] ? json_string(o->user) : json_null());
  json_object_set_new(cfg, "entrypoint", o->entrypoint ? strv_json(o->entrypoint) : json_null());
  json_object_set_new(cfg, "cmd", o->cmd ? strv_json(o->cmd) : json_null());
  _cleanup_strv_ char **start = strv_concat(o->entrypoint, o->cmd);
  json_object_set_new(cfg, "start", start && start[0] ? strv_json(start) : json_null());
  json_object_set_new(cfg, "ready", json_null());
  json_object_set_new(cfg, "exposed", strv_json(o->exposed));
  json_object_set_new(cfg, "labels", o->labels ? json_deep_copy(o->labels) : json_object());
  json_object_set_new(cfg, "stopsignal", o->stopsignal ? json_string(o->stopsignal) : json_null());
  return cfg;
}

/* /proc, /sys, /dev and /run, where every sandbox mounts its own: made when the image has none,
 * refused when the image has something else there (a symbolic link would lead the mount astray). */
static int oci_mountpoints(const char *rootfs, moat_error **err) {
  static const char *const dirs[] = {"proc", "sys", "dev", "run", "tmp"};
  _cleanup_close_ int rfd = open(rootfs, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (rfd < 0)
    return moat_error_errno(err, "open %s", rootfs);
  for (size_t i = 0; i < ARRAY_SIZE(dirs); i++) {
    struct stat st;
    if (fstatat(rfd, dirs[i], &st, AT_SYMLINK_NOFOLLOW) == 0) {
      if (!S_ISDIR(st.st_mode) && i < 4)
        return moat_error_set(err, EINVAL,
                              "import image: its /%s is not a directory (%s): every sandbox mounts "
                              "its own /%s there",
                              dirs[i], S_ISLNK(st.st_mode) ? "a symbolic link" : "a file", dirs[i]);
      continue;
    }
    if (errno != ENOENT || mkdirat(rfd, dirs[i], i == 4 ? 01777 : 0755) < 0 ||
        (i == 4 && fchmodat(rfd, dirs[i], 01777, 0) < 0))
      return moat_error_errno(err, "import image: make its /%s", dirs[i]);
  }
  return 0;
}

int moat_control_template_import(struct moat_control *c, const char *org, const char *name, int archive_fd,
                                 struct moat_user_template *out, moat_error **err) {
  if (new_template_name(c, name, err) < 0)
    return -1;
  if (mkdir_p(c->builds_dir, 0700, err) < 0 || mkdir_p(c->images_dir, 0755, err) < 0)
    return -1;
  struct ctl_build *b = build_new(c, org, name, "im-");
  pthread_mutex_lock(&c->build_lock);
  bool registered = build_register_locked(c, b);
  pthread_mutex_unlock(&c->build_lock);
  if (!registered) {
    build_free(b);
    return moat_error_set(err, MOAT_E_TEMPLATE_BUILDING, "template '%s' is building already", name);
  }
  uint64_t t0 = now_ns();
  struct moat_oci_config oc = {0};
  _cleanup_free_ char *tmp = xasprintf("%s/import.tmp-XXXXXX", c->images_dir);
  _cleanup_free_ char *rootfs = NULL, *from = NULL, *root = NULL, *layers = NULL, *cfg = NULL;
  _cleanup_json_ json_t *config = NULL;
  _cleanup_close_ int rfd = -1;
  char image[27] = "";
  int rc = -1;
  if (!mkdtemp(tmp)) {
    moat_error_errno(err, "mkdtemp %s", tmp);
    free(tmp);
    tmp = NULL;
    goto out;
  }
  chmod(tmp, 0755);
  rootfs = xasprintf("%s/rootfs", tmp);
  if (mkdir(rootfs, 0755) < 0) {
    moat_error_errno(err, "mkdir %s", rootfs);
    goto out;
  }
  if (moat_oci_import(archive_fd, NULL, c->builds_dir, rootfs, c->build_context_max_bytes * 4,
                      CONTEXT_MAX_ENTRIES, &oc, err) < 0) {
    moat_error_wrap(err, "import");
    goto out;
  }
  if (oci_mountpoints(rootfs, err) < 0)
    goto out;
  /* the image's name: the org and the manifest's digest (one org's import is never another's) */
  struct moat_sha256 sh;
  uint8_t d[MOAT_SHA256_LEN];
  char hex[2 * MOAT_SHA256_LEN + 1], manifest[2 * MOAT_SHA256_LEN + 1];
  moat_sha256_init(&sh);
  moat_sha256_update(&sh, "oci\0", 4);
  moat_sha256_update(&sh, org, strlen(org) + 1);
  moat_sha256_update(&sh, oc.digest, sizeof(oc.digest));
  moat_sha256_final(&sh, d);
  for (size_t i = 0; i < MOAT_SHA256_LEN; i++) {
    snprintf(hex + 2 * i, 3, "%02x", d[i]);
    snprintf(manifest + 2 * i, 3, "%02x", oc.digest[i]);
  }
  snprintf(image, sizeof(image), "i-%.24s", hex);
  hold_image(b, image);
  if (image_ready(c, image)) {
    image_abandon(tmp);
  } else if (image_commit(c, tmp, image, hex, err) < 0) {
    goto out;
  }
  free(tmp);
  tmp = NULL;
  json_array_append_new(b->layers, json_string(image));
  config = oci_config_json(&oc);
  from = xasprintf("sha256:%s", manifest);
  root = xasprintf("%s/%s/rootfs", c->images_dir, image);
  rfd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  uint64_t size = rfd >= 0 ? moat_image_tree_size(rfd) : 0;
  layers = json_dumps(b->layers, JSON_COMPACT);
  cfg = json_dumps(config, JSON_COMPACT | JSON_SORT_KEYS);
  struct moat_store_template prev = {0};
  moat_error *e = NULL;
  if (moat_store_template_get(c->store, org, name, &prev, &e) < 0)
    moat_error_free(&e);
  struct moat_store_template r = {.org = (char *)org,
                                  .name = (char *)name,
                                  .state = (char *)"ready",
                                  .build_id = b->id,
                                  .image = image,
                                  .layers_json = layers,
                                  .source = (char *)"oci",
                                  .from_ref = from,
                                  .config_json = cfg,
                                  .size_bytes = size,
                                  .created_at_ms = prev.created_at_ms ? prev.created_at_ms : now_unix_ms(),
                                  .updated_at_ms = now_unix_ms()};
  rc = moat_store_template_put(c->store, &r, err);
  moat_store_template_clear(&prev);
  if (rc == 0)
    log_info("template %s of %s imported in %.1f s: image %s (%s), %.1f MiB", name, org,
             (double)(now_ns() - t0) / 1e9, image, from, (double)size / (1024.0 * 1024.0));
out:
  if (tmp)
    image_abandon(tmp);
  moat_oci_config_clear(&oc);
  pthread_mutex_lock(&c->build_lock);
  build_unregister_locked(c, b);
  pthread_mutex_unlock(&c->build_lock);
  build_free(b);
  ctl_images_gc(c);
  if (rc < 0)
    return -1;
  return out ? moat_control_user_template_get(c, org, name, out, err) : 0;
}

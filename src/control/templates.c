/* templates.c -- the templates an org builds or imports: names, what a create from one uses and
 * starts, and the images on the host that nothing uses any more
 *
 * Images live in DATA/images, as IMAGE/{rootfs,ready,size}, IMAGE being "s-" (a Dockerfile step)
 * or "i-" (an imported archive) and 24 hex digits (moat_host_image_name), never reused for other
 * content; the recipes' stay in the template dir. A sandbox or snapshot row names "NAME@IMAGE" in its
 * template column: the driver is handed IMAGE, the API shows NAME. Images go when no template row, running
 * build, live sandbox or snapshot names them (ctl_images_gc); images_lock keeps a create's choice of image
 * and the row that names it together against that.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../common/log.h"
#include "../common/sha256.h"
#include "../common/util.h"
#include "../host/images.h"
#include "control_internal.h"

#define READY_POLL_MS 100
#define READY_TIMEOUT_MS 60000
#define BAKE_ATTEMPTS 5
#define BAKE_RETRY_MS 100

void moat_user_template_clear(struct moat_user_template *t) {
  if (!t)
    return;
  free(t->name);
  free(t->state);
  free(t->source);
  free(t->build_id);
  free(t->from);
  free(t->error);
  json_decref(t->config);
  memset(t, 0, sizeof(*t));
}

void moat_user_templates_free(struct moat_user_template *v, size_t n) {
  for (size_t i = 0; v && i < n; i++)
    moat_user_template_clear(&v[i]);
  free(v);
}

bool ctl_template_name_valid(const char *name) {
  size_t n = strlen(name);
  if (n < 1 || n > 63)
    return false;
  for (size_t i = 0; i < n; i++) {
    char ch = name[i];
    bool alnum = (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9');
    if (!alnum && (i == 0 || (ch != '.' && ch != '_' && ch != '-')))
      return false;
  }
  return true;
}

const char *ctl_image_dir(const struct moat_control *c, const char *image) {
  return moat_host_image_name(image) ? c->images_dir : c->template_dir;
}

const char *ctl_image_of(const char *column) {
  const char *at = strchr(column, '@');
  return at ? at + 1 : column;
}

char *ctl_template_display(const char *column) {
  const char *at = strchr(column, '@');
  return at ? xstrndup(column, (size_t)(at - column)) : xstrdup(column);
}

void ctl_user_template_from_row(const struct moat_store_template *r, struct moat_user_template *out) {
  memset(out, 0, sizeof(*out));
  out->name = xstrdup(r->name);
  out->state = xstrdup(r->state);
  out->source = xstrdup(r->source);
  out->build_id = xstrdup(r->build_id);
  out->from = xstrdup(r->from_ref);
  out->error = r->error ? xstrdup(r->error) : NULL;
  out->usable = r->image != NULL;
  out->size_bytes = r->size_bytes;
  out->created_at_ms = r->created_at_ms;
  out->updated_at_ms = r->updated_at_ms;
  out->config = parse_object(r->config_json);
}

int moat_control_user_template_get(struct moat_control *c, const char *org, const char *name,
                                   struct moat_user_template *out, moat_error **err) {
  struct moat_store_template r = {0};
  if (!ctl_template_name_valid(name))
    return moat_error_set(err, ENOENT, "no template '%s'", name);
  if (moat_store_template_get(c->store, org, name, &r, err) < 0)
    return -1;
  ctl_user_template_from_row(&r, out);
  moat_store_template_clear(&r);
  return 0;
}

int moat_control_user_template_list(struct moat_control *c, const char *org, struct moat_user_template **out,
                                    size_t *n, moat_error **err) {
  struct moat_store_template *rows = NULL;
  size_t nr = 0;
  if (moat_store_template_list(c->store, org, &rows, &nr, err) < 0)
    return -1;
  struct moat_user_template *v = xcalloc(nr + 1, sizeof(*v));
  for (size_t i = 0; i < nr; i++)
    ctl_user_template_from_row(&rows[i], &v[i]);
  moat_store_templates_free(rows, nr);
  *out = v;
  *n = nr;
  return 0;
}

int moat_control_user_template_delete(struct moat_control *c, const char *org, const char *name,
                                      moat_error **err) {
  if (!ctl_template_name_valid(name))
    return moat_error_set(err, ENOENT, "no template '%s'", name);
  if (ctl_build_running(c, org, name))
    return moat_error_set(err, MOAT_E_TEMPLATE_BUILDING,
                          "template '%s' is building; delete it once the build ends", name);
  if (moat_store_template_delete(c->store, org, name, err) < 0)
    return -1;
  log_info("template %s of %s deleted", name, org);
  ctl_images_gc(c);
  return 0;
}

bool moat_control_template_known(struct moat_control *c, const char *org, const char *name) {
  if (moat_template_exists(c->templates, name))
    return true;
  struct moat_store_template r = {0};
  moat_error *e = NULL;
  if (!ctl_template_name_valid(name) || moat_store_template_get(c->store, org, name, &r, &e) < 0) {
    moat_error_free(&e);
    return false;
  }
  moat_store_template_clear(&r);
  return true;
}

int ctl_template_resolve(struct moat_control *c, const char *org, const char *name, char **column,
                         json_t **config, moat_error **err) {
  *column = NULL;
  *config = NULL;
  if (moat_template_exists(c->templates, name)) {
    if (moat_template_ensure(c->templates, name, err) < 0)
      return moat_error_wrap(err, "template %s", name);
    *column = xstrdup(name);
    return 0;
  }
  struct moat_store_template r = {0};
  moat_error *e = NULL;
  if (!ctl_template_name_valid(name) || moat_store_template_get(c->store, org, name, &r, &e) < 0) {
    if (e && e->status != ENOENT) {
      *err = e;
      return -1;
    }
    moat_error_free(&e);
    return moat_error_set(err, EINVAL, "unknown template '%s'", name);
  }
  int ret = 0;
  if (!r.image)
    ret = moat_error_set(err, MOAT_E_TEMPLATE_NOT_READY, "template '%s' has no ready build yet (%s%s%s)",
                         name, r.state, r.error ? ": " : "", r.error ? r.error : "");
  else {
    *column = xasprintf("%s@%s", name, r.image);
    *config = parse_object(r.config_json);
  }
  moat_store_template_clear(&r);
  return ret;
}

void ctl_env_set_kv(json_t *env, const char *kv) {
  const char *eq = kv ? strchr(kv, '=') : NULL;
  if (!eq || eq == kv)
    return;
  _cleanup_free_ char *k = xstrndup(kv, (size_t)(eq - kv));
  json_object_set_new(env, k, json_string(eq + 1));
}

/* "K=V" entries of the image config's env under the create's own (an object, or NULL). */
json_t *ctl_template_env(json_t *config, json_t *env) {
  json_t *out = json_object();
  size_t i;
  json_t *kv;
  json_array_foreach(json_object_get(config, "env"), i, kv) ctl_env_set_kv(out, json_string_value(kv));
  if (env)
    json_object_update(out, env);
  return out;
}

char **ctl_json_strv(json_t *a, bool empty_is_null) {
  if (!json_is_array(a) || (empty_is_null && json_array_size(a) == 0))
    return NULL;
  char **v = xcalloc(json_array_size(a) + 1, sizeof(char *));
  size_t i;
  json_t *s;
  json_array_foreach(a, i, s) v[i] = xstrdup(json_string_value(s) ? json_string_value(s) : "");
  return v;
}

static void sleep_ms(unsigned ms) {
  struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* The image's exposed TCP ports ("PORT/tcp" or "PORT"), at most max of them; how many. */
static size_t tcp_ports(json_t *config, unsigned *ports, size_t max) {
  size_t n = 0, i;
  json_t *p;
  json_array_foreach(json_object_get(config, "exposed"), i, p) {
    const char *s = json_string_value(p);
    char *end = NULL;
    unsigned long v = s ? strtoul(s, &end, 10) : 0;
    if (n < max && v > 0 && v < 65536 && end && (strcmp(end, "/tcp") == 0 || *end == '\0'))
      ports[n++] = (unsigned)v;
  }
  return n;
}

int ctl_template_start(struct moat_control *c, const char *org, const char *id, json_t *config,
                       moat_error **err) {
  _cleanup_strv_ char **start = ctl_json_strv(json_object_get(config, "start"), true);
  json_t *ready = json_object_get(config, "ready");
  _cleanup_strv_ char **check = ctl_json_strv(json_object_get(ready, "argv"), true);
  /* USER is "user[:group]" (a name or a uid): the guest takes the user, with its own groups */
  const char *user_spec = json_string_value(json_object_get(config, "user"));
  _cleanup_free_ char *user = user_spec && user_spec[0] ? xstrndup(user_spec, strcspn(user_spec, ":")) : NULL;
  const char *workdir = json_string_value(json_object_get(config, "workdir"));
  if (!start && !user && !workdir)
    return 0;
  _cleanup_free_ struct moat_guest_ep *ep = NULL;
  _cleanup_strv_ char **env = NULL;
  if (moat_control_guest(c, org, id, &ep, &env, err) < 0)
    return moat_error_wrap(err, "start command");
  /* the image's USER and WORKDIR are what an exec naming neither gets, as docker exec does */
  if ((user || workdir) && moat_guest_set_defaults(ep, user, workdir, err) < 0)
    return -1;
  if (!start)
    return 0;
  struct moat_exec_req req = {.argv = start, .env = env, .cwd = workdir, .user = user};
  struct moat_exec_opts opts = {.background = true, .tag = "start"};
  struct moat_proc_stream *ps = NULL;
  int pid = 0;
  if (moat_guest_exec_start(ep, &req, &opts, &ps, &pid, err) < 0)
    return moat_error_wrap(err, "start command %s", start[0]);
  moat_proc_stream_close(ps);
  unsigned ports[16];
  size_t n_ports = check ? 0 : tcp_ports(config, ports, ARRAY_SIZE(ports));
  if (!check && !n_ports)
    return 0;
  uint64_t start_period = (uint64_t)json_integer_value(json_object_get(ready, "start_period_ms"));
  uint64_t timeout = (uint64_t)json_integer_value(json_object_get(ready, "timeout_ms"));
  uint64_t deadline = now_ns() + (READY_TIMEOUT_MS + start_period) * 1000000ull;
  _cleanup_free_ char *last = NULL;
  for (;;) {
    moat_error *e = NULL;
    if (check) {
      struct moat_exec_req creq = {.argv = check,
                                   .env = env,
                                   .cwd = workdir,
                                   .user = user,
                                   .timeout_ms = (uint32_t)(timeout ? timeout : 30000),
                                   .max_output = 4096};
      struct moat_exec_result res = {0};
      int rc = moat_guest_exec(ep, &creq, &res, &e);
      if (rc == 0 && res.exit_code == 0 && !res.timed_out) {
        moat_exec_result_free(&res);
        return 0;
      }
      free(last);
      last = rc < 0 ? xstrdup(moat_error_msg(e))
                    : xasprintf("exit %d%s%.*s", res.exit_code, res.err_len ? ": " : "",
                                (int)(res.err_len > 200 ? 200 : res.err_len), res.err ? res.err : "");
      moat_exec_result_free(&res);
    } else {
      for (size_t k = 0; k < n_ports; k++) { /* one of them accepting will do */
        int fd = moat_control_port_connect(c, org, id, ports[k], 1000, &e);
        if (fd >= 0) {
          close(fd);
          return 0;
        }
        free(last);
        last = xasprintf("port %u: %s", ports[k], moat_error_msg(e));
        moat_error_free(&e);
      }
    }
    moat_error_free(&e);
    if (now_ns() >= deadline)
      return moat_error_set(
          err, ETIMEDOUT, "the template's readiness check did not pass within %llu s (last: %s)",
          (unsigned long long)((READY_TIMEOUT_MS + start_period) / 1000), last ? last : "-");
    sleep_ms(READY_POLL_MS);
  }
}

/* ---- the baked start state: DATA/baked/KEY/, KEY a hash of the org, the image and its config;
 * its file "image" names the image (for the removal of unused ones) ---- */

char *ctl_template_bake_path(struct moat_control *c, const char *org, const char *column, json_t *config) {
  if (!json_is_array(json_object_get(config, "start")) || !moat_host_can_checkpoint(c->host))
    return NULL;
  _cleanup_free_ char *cfg = json_dumps(config, JSON_COMPACT | JSON_SORT_KEYS);
  const char *image = ctl_image_of(column);
  struct moat_sha256 s;
  uint8_t d[MOAT_SHA256_LEN];
  moat_sha256_init(&s);
  moat_sha256_update(&s, org, strlen(org) + 1);
  moat_sha256_update(&s, image, strlen(image) + 1);
  moat_sha256_update(&s, cfg ? cfg : "", cfg ? strlen(cfg) : 0);
  moat_sha256_final(&s, d);
  char hex[25];
  for (size_t i = 0; i < 12; i++)
    snprintf(hex + 2 * i, 3, "%02x", d[i]);
  return xasprintf("%s/%s", c->baked_dir, hex);
}

void ctl_template_bake(struct moat_control *c, const char *org, const char *id, const char *column,
                       const char *path) {
  char suffix[9];
  random_id(suffix, 8);
  _cleanup_free_ char *part = xasprintf("%s.partial-%s", path, suffix);
  moat_error *err = NULL;
  uint64_t t0 = now_ns();
  if (mkdir_p(c->baked_dir, 0700, &err) < 0) {
    log_warn("template %s: bake its start state: %s", column, moat_error_msg(err));
    moat_error_free(&err);
    return;
  }
  /* A server can still hold the readiness check's connection for a moment (a handler thread closing
   * it): CRIU does not dump an established TCP connection, so the dump is tried again shortly. */
  for (int attempt = 1;; attempt++) {
    if (tt_checkpoint_running(c, org, id, part, &err) == 0)
      break;
    if (attempt == BAKE_ATTEMPTS || (err && err->status == MOAT_E_NO_CHECKPOINTS)) {
      log_warn("template %s: bake its start state from %s (%d attempts): %s", column, id, attempt,
               moat_error_msg(err));
      moat_error_free(&err);
      return;
    }
    moat_error_free(&err);
    sleep_ms(BAKE_RETRY_MS);
  }
  _cleanup_free_ char *image_file = xasprintf("%s/image", part);
  _cleanup_close_ int fd = open(image_file, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  const char *image = ctl_image_of(column);
  if (fd < 0 || write_all(fd, image, strlen(image)) < 0) {
    log_warn("template %s: write %s: %s", column, image_file, strerror(errno));
    moat_image_dir_remove(part);
    return;
  }
  pthread_rwlock_rdlock(&c->images_lock); /* against the removal of unused images */
  if (moat_image_dir_commit(part, path, &err) < 0) {
    log_warn("template %s: keep its start state: %s", column, moat_error_msg(err));
    moat_error_free(&err);
  } else {
    log_info("template %s: start state baked from %s in %.0f ms at %s", column, id,
             (double)(now_ns() - t0) / 1e6, path);
  }
  pthread_rwlock_unlock(&c->images_lock);
}

/* The baked states whose image is gone; images_lock held for writing, keep: the images kept. */
static void bakes_gc(struct moat_control *c, char **keep) {
  DIR *d = opendir(c->baked_dir);
  struct dirent *de;
  while (d && (de = readdir(d))) {
    if (de->d_name[0] == '.')
      continue;
    _cleanup_free_ char *path = xasprintf("%s/%s", c->baked_dir, de->d_name);
    _cleanup_free_ char *image_file = xasprintf("%s/image", path);
    _cleanup_free_ char *image = NULL;
    moat_error *err = NULL;
    bool partial = strstr(de->d_name, ".partial-") != NULL;
    if (partial)
      continue; /* a bake running now; a crash's leftovers go at the next start */
    if (read_file(image_file, &image, NULL, &err) < 0)
      moat_error_free(&err);
    bool kept = false;
    for (char **k = keep; image && *k && !kept; k++)
      kept = strcmp(*k, image) == 0;
    if (image && !moat_host_image_name(image))
      kept = true; /* a recipe's image */
    if (!kept)
      moat_image_dir_remove(path);
  }
  if (d)
    closedir(d);
}

void ctl_images_gc(struct moat_control *c) {
  _cleanup_strv_ char **keep = NULL;
  moat_error *err = NULL;
  pthread_rwlock_wrlock(&c->images_lock);
  if (moat_store_images_in_use(c->store, &keep, &err) < 0) {
    pthread_rwlock_unlock(&c->images_lock);
    log_warn("templates: images in use: %s; removing none", moat_error_msg(err));
    moat_error_free(&err);
    return;
  }
  DIR *d = opendir(c->images_dir);
  if (!d) {
    pthread_rwlock_unlock(&c->images_lock);
    return;
  }
  struct dirent *de;
  while ((de = readdir(d))) {
    bool kept = false;
    for (char **k = keep; *k && !kept; k++)
      kept = strcmp(*k, de->d_name) == 0;
    if (kept || !moat_host_image_name(de->d_name) || ctl_build_uses(c, de->d_name))
      continue;
    _cleanup_free_ char *path = xasprintf("%s/%s", c->images_dir, de->d_name);
    if (rm_rf(path, &err) < 0) {
      log_warn("templates: remove unused image %s: %s", path, moat_error_msg(err));
      moat_error_free(&err);
    } else {
      log_info("templates: removed unused image %s", de->d_name);
    }
  }
  closedir(d);
  bakes_gc(c, keep);
  pthread_rwlock_unlock(&c->images_lock);
}

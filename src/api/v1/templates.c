/* templates.c -- /v1/templates: moatd's own templates (recipes) and the ones an org builds from a
 * Dockerfile (POST /v1/templates/{name} with the build context) or imports; build logs as SSE */
#include <errno.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../../common/buf.h"
#include "../../common/util.h"
#include "v1.h"

#define LOG_POLL_MS 200
#define MAX_BUILD_ARGS 128 /* as many as a Dockerfile's plan takes */

static json_t *recipe_json(const struct moat_template_info *t) {
  json_t *o = json_object();
  json_object_set_new(o, "name", json_string(t->name ? t->name : ""));
  json_object_set_new(o, "source", json_string("builtin"));
  json_object_set_new(o, "state", json_string(moat_template_state_name(t->state)));
  json_object_set_new(o, "error", api_str_json(t->error));
  json_object_set_new(o, "built_at", api_time_json((int64_t)t->built_at * 1000, true));
  json_object_set_new(o, "created_at", api_time_json((int64_t)t->built_at * 1000, true));
  json_object_set_new(o, "size_bytes", json_integer((json_int_t)t->size_bytes));
  json_object_set_new(o, "from", json_null());
  return o;
}

static json_t *user_json(const struct moat_user_template *t) {
  json_t *o = json_object();
  json_object_set_new(o, "name", json_string(t->name));
  json_object_set_new(o, "source", json_string(t->source));
  json_object_set_new(o, "state", json_string(t->state));
  json_object_set_new(o, "usable", json_boolean(t->usable));
  json_object_set_new(o, "build_id", json_string(t->build_id));
  json_object_set_new(o, "from", api_str_json(t->from));
  json_object_set_new(o, "error", api_str_json(t->error));
  json_object_set_new(o, "size_bytes", json_integer((json_int_t)t->size_bytes));
  json_object_set_new(o, "created_at", api_time_json(t->created_at_ms, false));
  json_object_set_new(o, "updated_at", api_time_json(t->updated_at_ms, false));
  json_object_set_new(o, "config", t->config ? json_incref(t->config) : json_object());
  return o;
}

int api_h_templates_list(struct api_req *r, json_t *body) {
  if (api_args_none(r) < 0)
    return -1;
  moat_error *err = NULL;
  struct moat_template_info *v = NULL;
  size_t n = 0;
  if (moat_control_template_list(api_control(r), &v, &n, &err) < 0)
    return api_reply_moat_error(r, &err);
  json_t *arr = json_array();
  for (size_t i = 0; i < n; i++)
    json_array_append_new(arr, recipe_json(&v[i]));
  moat_template_infos_free(v, n);
  struct moat_user_template *u = NULL;
  if (moat_control_user_template_list(api_control(r), r->org, &u, &n, &err) < 0) {
    json_decref(arr);
    return api_reply_moat_error(r, &err);
  }
  for (size_t i = 0; i < n; i++)
    json_array_append_new(arr, user_json(&u[i]));
  moat_user_templates_free(u, n);
  return api_reply_json(r, 200, json_pack("{s:o}", "templates", arr));
}

/* moatd's own template name, or NULL. */
static json_t *recipe_get(struct api_req *r, moat_error **err) {
  struct moat_template_info *v = NULL;
  size_t n = 0;
  if (moat_control_template_list(api_control(r), &v, &n, err) < 0)
    return NULL;
  json_t *found = NULL;
  for (size_t i = 0; i < n && !found; i++)
    if (v[i].name && strcmp(v[i].name, r->route.name) == 0)
      found = recipe_json(&v[i]);
  moat_template_infos_free(v, n);
  return found;
}

int api_h_template_build(struct api_req *r, json_t *body) {
  if (api_args_none(r) < 0)
    return -1;
  moat_error *err = NULL;
  /* Blocks until built (or until another thread's build of it ends). */
  if (moat_control_template_build(api_control(r), r->route.name, &err) < 0)
    return api_reply_moat_error(r, &err);
  json_t *found = recipe_get(r, &err);
  if (!found)
    return err ? api_reply_moat_error(r, &err)
               : api_reply_error(r, 404, "not_found", "no template recipe '%s'", r->route.name);
  return api_reply_json(r, 200, found);
}

int api_h_template_get(struct api_req *r, json_t *body) {
  if (api_args_none(r) < 0)
    return -1;
  moat_error *err = NULL;
  json_t *found = recipe_get(r, &err);
  if (found)
    return api_reply_json(r, 200, found);
  moat_error_free(&err);
  struct moat_user_template t = {0};
  if (moat_control_user_template_get(api_control(r), r->org, r->route.name, &t, &err) < 0)
    return api_reply_moat_error(r, &err);
  json_t *o = user_json(&t);
  moat_user_template_clear(&t);
  return api_reply_json(r, 200, o);
}

int api_h_template_delete(struct api_req *r, json_t *body) {
  if (api_args_none(r) < 0)
    return -1;
  moat_error *err = NULL;
  if (moat_control_template_exists(api_control(r), r->route.name))
    return api_reply_error(r, 403, "forbidden", "'%s' is a template of moatd's own: it cannot be deleted",
                           r->route.name);
  if (moat_control_user_template_delete(api_control(r), r->org, r->route.name, &err) < 0)
    return api_reply_moat_error(r, &err);
  return api_reply_empty(r, 204);
}

/* ---- POST /v1/templates/{name} (a build) and .../import: the body is spooled first ---- */

struct upload {
  int fd; /* the spool, -1 once failed */
  uint64_t size, max;
};

static void upload_free(void *p) {
  struct upload *u = p;
  if (u->fd >= 0)
    close(u->fd);
  free(u);
}

static bool upload_open(struct api_req *r, const char *const *allowed) {
  struct upload *u = xcalloc(1, sizeof(*u));
  u->fd = -1;
  r->front = u;
  r->front_free = upload_free;
  moat_error *err = NULL;
  if (api_args_check(&r->args, allowed, &err) < 0)
    return api_reply_moat_error(r, &err), true;
  u->max = moat_control_upload_max(api_control(r));
  if ((u->fd = moat_control_upload_spool(api_control(r), &err)) < 0)
    return api_reply_moat_error(r, &err), true;
  return false;
}

static const char *const build_args_allowed[] = {"dockerfile", "build_arg.", NULL};
static const char *const import_args_allowed[] = {NULL};

bool api_template_build_open(struct api_req *r) { return upload_open(r, build_args_allowed); }
bool api_template_import_open(struct api_req *r) { return upload_open(r, import_args_allowed); }

int api_template_upload_chunk(struct api_req *r, const char *data, size_t len, moat_error **err) {
  struct upload *u = r->front;
  if (u->fd < 0)
    return moat_error_set(err, EIO, "upload already failed");
  if (u->size + len > u->max) {
    close(u->fd);
    u->fd = -1;
    return moat_error_set(err, EFBIG, "the upload is over %llu bytes (moatd --build-context-max-mb)",
                          (unsigned long long)u->max);
  }
  if (write_all(u->fd, data, len) < 0) {
    int e = errno;
    close(u->fd);
    u->fd = -1;
    errno = e;
    return moat_error_errno(err, "spool the upload");
  }
  u->size += len;
  return 0;
}

static int upload_rewind(struct api_req *r, struct upload *u) {
  if (!u || u->fd < 0)
    return api_reply_error(r, 500, "internal", "upload is not open");
  if (lseek(u->fd, 0, SEEK_SET) < 0)
    return api_reply_error(r, 500, "internal", "rewind the upload: %s", strerror(errno));
  return 0;
}

int api_template_build_finish(struct api_req *r) {
  struct upload *u = r->front;
  if (upload_rewind(r, u) < 0)
    return -1;
  const char *args[MAX_BUILD_ARGS];
  char *joined[MAX_BUILD_ARGS] = {0};
  size_t n_args = 0;
  for (size_t i = 0; i < r->args.n; i++) {
    const char *k = r->args.v[i].key;
    if (strncmp(k, "build_arg.", 10) != 0)
      continue;
    if (n_args == MAX_BUILD_ARGS) {
      for (size_t j = 0; j < n_args; j++)
        free(joined[j]);
      return api_reply_error(r, 400, "invalid_request", "more than %d build args", MAX_BUILD_ARGS);
    }
    joined[n_args] = xasprintf("%s=%s", k + 10, r->args.v[i].value ? r->args.v[i].value : "");
    args[n_args] = joined[n_args];
    n_args++;
  }
  struct moat_template_build_req req = {.name = r->route.name,
                                        .context_fd = u->fd,
                                        .dockerfile = api_arg_get(&r->args, "dockerfile"),
                                        .build_args = args,
                                        .n_build_args = n_args};
  struct moat_user_template t = {0};
  moat_error *err = NULL;
  int rc = moat_control_template_submit(api_control(r), r->org, &req, &t, &err);
  for (size_t j = 0; j < n_args; j++)
    free(joined[j]);
  if (rc < 0)
    return api_reply_moat_error(r, &err);
  json_t *o = user_json(&t);
  moat_user_template_clear(&t);
  return api_reply_json(r, 202, o);
}

int api_template_import_finish(struct api_req *r) {
  struct upload *u = r->front;
  if (upload_rewind(r, u) < 0)
    return -1;
  struct moat_user_template t = {0};
  moat_error *err = NULL;
  if (moat_control_template_import(api_control(r), r->org, r->route.name, u->fd, &t, &err) < 0)
    return api_reply_moat_error(r, &err);
  json_t *o = user_json(&t);
  moat_user_template_clear(&t);
  return api_reply_json(r, 201, o);
}

/* ---- GET /v1/templates/{name}/builds/{build_id}/logs: SSE ---- */

struct logsrc {
  struct moat_control *ctl;
  char *org, *name, *build_id;
  uint64_t offset;
  bool follow;
};

static void log_free(void *p) {
  struct logsrc *l = p;
  free(l->org);
  free(l->name);
  free(l->build_id);
  free(l);
}

static void log_next(void *ctx, struct moat_buf *out, int timeout_ms, bool *done) {
  struct logsrc *l = ctx;
  moat_error *err = NULL;
  json_t *lines = json_array();
  bool ended = false;
  if (moat_control_build_log_read(l->ctl, l->org, l->name, l->build_id, &l->offset, lines, &ended, &err) <
      0) {
    const char *code;
    api_errno_http(err ? err->status : 0, &code);
    api_sse_format(out, "error", api_error_json(code, moat_error_msg(err)));
    moat_error_free(&err);
    json_decref(lines);
    *done = true;
    return;
  }
  size_t i;
  json_t *rec;
  json_array_foreach(lines, i, rec)
      api_sse_format(out, json_object_get(rec, "state") ? "end" : "log", json_incref(rec));
  json_decref(lines);
  if (ended || !l->follow) {
    *done = true;
    return;
  }
  if (!i) {
    struct timespec ts = {0, (long)(timeout_ms < LOG_POLL_MS ? timeout_ms : LOG_POLL_MS) * 1000000L};
    nanosleep(&ts, NULL);
  }
}

int api_h_template_build_logs(struct api_req *r, json_t *body) {
  static const char *const allowed[] = {"follow", NULL};
  moat_error *err = NULL;
  bool follow;
  if (api_args_check(&r->args, allowed, &err) < 0 ||
      api_arg_bool(&r->args, "follow", false, &follow, &err) < 0)
    return api_reply_moat_error(r, &err);
  struct logsrc *l = xcalloc(1, sizeof(*l));
  l->ctl = api_control(r);
  l->org = xstrdup(r->org);
  l->name = xstrdup(r->route.name);
  l->build_id = xstrdup(r->route.sid);
  l->follow = follow;
  json_t *probe = json_array();
  uint64_t off = 0;
  bool ended;
  /* an unknown build is a 404 before the stream starts */
  if (moat_control_build_log_read(l->ctl, l->org, l->name, l->build_id, &off, probe, &ended, &err) < 0) {
    json_decref(probe);
    log_free(l);
    return api_reply_moat_error(r, &err);
  }
  json_decref(probe);
  struct api_stream_source src = {.next = log_next, .free = log_free, .ctx = l, .poll_ms = LOG_POLL_MS};
  return api_stream_reply(r, &src, "text/event-stream", ": build log\n\n");
}

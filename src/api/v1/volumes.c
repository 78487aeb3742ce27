/* volumes.c -- /v1/volumes: create, list, get, delete, and their files with no sandbox
 * (control's volume file calls: nothing inside a volume is followed) */
#include <errno.h>
#include <microhttpd.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "v1.h"

static json_t *volume_json(const struct moat_volume_info *v) {
  json_t *att = json_array();
  for (size_t i = 0; i < v->n_attached; i++)
    json_array_append_new(att, json_pack("{s:s, s:o, s:b}", "sandbox", v->attached[i].sandbox_id, "path",
                                         api_str_json(v->attached[i].path), "read_only",
                                         v->attached[i].read_only));
  json_t *o = json_object();
  json_object_set_new(o, "name", json_string(v->name));
  json_object_set_new(o, "size_mb", json_integer((json_int_t)v->size_mb));
  json_object_set_new(o, "used_bytes", json_integer((json_int_t)v->used_bytes));
  json_object_set_new(o, "created_at", api_time_json(v->created_at_ms, false));
  json_object_set_new(o, "attached", att);
  return o;
}

int api_h_volumes_create(struct api_req *r, json_t *body) {
  if (api_args_none(r) < 0)
    return -1;
  const char *k;
  json_t *v;
  const char *name = NULL;
  json_int_t size = 0;
  bool has_size = false;
  json_object_foreach(body, k, v) {
    if (strcmp(k, "name") == 0) {
      if (!json_is_string(v))
        return api_reply_error(r, 400, "invalid_request", "field 'name' must be a string");
      name = json_string_value(v);
    } else if (strcmp(k, "size_mb") == 0) {
      if (!json_is_integer(v))
        return api_reply_error(r, 400, "invalid_request", "field 'size_mb' must be an integer");
      size = json_integer_value(v);
      has_size = true;
    } else {
      return api_reply_error(r, 400, "invalid_request", "unknown field '%.64s' (name, size_mb)", k);
    }
  }
  if (!name || !moat_volume_name_valid(name))
    return api_reply_error(r, 400, "invalid_request", "field 'name' must match [a-z0-9][a-z0-9_.-]{0,62}");
  if (!has_size || size < MOAT_MIN_VOLUME_MB)
    return api_reply_error(r, 400, "invalid_request", "field 'size_mb' must be an integer of at least %d",
                           MOAT_MIN_VOLUME_MB);
  moat_error *err = NULL;
  struct moat_volume_info info;
  bool held = false;
  if (moat_control_quota_storage_begin(api_control(r), r->org, MOAT_Q_VOLUMES, size * 1048576LL, &held,
                                       &err) < 0)
    return api_reply_moat_error(r, &err);
  int rc = moat_control_volume_create(api_control(r), r->org, name, (uint64_t)size, &info, &err);
  moat_control_quota_storage_end(api_control(r), held);
  if (rc < 0)
    return api_reply_moat_error(r, &err);
  int ret = api_reply_json(r, 201, volume_json(&info));
  moat_volume_info_clear(&info);
  return ret;
}

int api_h_volumes_list(struct api_req *r, json_t *body) {
  if (api_args_none(r) < 0)
    return -1;
  moat_error *err = NULL;
  struct moat_volume_info *v = NULL;
  size_t n = 0;
  if (moat_control_volume_list(api_control(r), r->org, &v, &n, &err) < 0)
    return api_reply_moat_error(r, &err);
  json_t *arr = json_array();
  for (size_t i = 0; i < n; i++)
    json_array_append_new(arr, volume_json(&v[i]));
  moat_volume_infos_free(v, n);
  return api_reply_json(r, 200, json_pack("{s:o}", "volumes", arr));
}

int api_h_volume_get(struct api_req *r, json_t *body) {
  if (api_args_none(r) < 0)
    return -1;
  moat_error *err = NULL;
  struct moat_volume_info info;
  if (moat_control_volume_get(api_control(r), r->org, r->route.name, &info, &err) < 0)
    return api_reply_moat_error(r, &err);
  int ret = api_reply_json(r, 200, volume_json(&info));
  moat_volume_info_clear(&info);
  return ret;
}

int api_h_volume_delete(struct api_req *r, json_t *body) {
  if (api_args_none(r) < 0)
    return -1;
  moat_error *err = NULL;
  if (moat_control_volume_delete(api_control(r), r->org, r->route.name, &err) < 0)
    return api_reply_moat_error(r, &err);
  return api_reply_empty(r, 204);
}

/* ---- files ---- */

/* The path argument (required unless optional: then "/" when absent), checked. */
static int vol_path(struct api_req *r, const char *const *allowed, bool optional, const char **path) {
  moat_error *err = NULL;
  if (api_args_check(&r->args, allowed, &err) < 0)
    return api_reply_moat_error(r, &err), -1;
  *path = api_arg_get(&r->args, "path");
  if (!*path && optional)
    *path = "/";
  if (!*path)
    return api_reply_error(r, 400, "invalid_request", "query parameter 'path' is required"), -1;
  if (moat_control_volume_path_check(*path, &err) < 0)
    return api_reply_moat_error(r, &err), -1;
  return 0;
}

int api_h_volume_files_get(struct api_req *r, json_t *body) {
  static const char *const allowed[] = {"path", NULL};
  const char *path;
  if (vol_path(r, allowed, true, &path) < 0)
    return -1;
  moat_error *err = NULL;
  int fd = -1;
  bool is_dir = false;
  uint64_t size = 0;
  if (moat_control_volume_open(api_control(r), r->org, r->route.name, path, &fd, &is_dir, &size, &err) < 0)
    return api_reply_moat_error(r, &err);
  if (is_dir) {
    struct moat_file_entry *v = NULL;
    size_t n = 0;
    int rc = moat_control_volume_list_dir(fd, path, &v, &n, &err);
    close(fd);
    if (rc < 0)
      return api_reply_moat_error(r, &err);
    json_t *arr = json_array();
    for (size_t i = 0; i < n; i++)
      json_array_append_new(arr, api_file_entry_json(&v[i]));
    moat_file_entries_free(v, n);
    return api_reply_json(r, 200, json_pack("{s:s, s:o}", "path", path, "entries", arr));
  }
  struct MHD_Response *resp = MHD_create_response_from_fd64(size, fd); /* takes fd */
  if (!resp) {
    close(fd);
    return api_reply_error(r, 500, "internal", "could not create a response");
  }
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/octet-stream");
  int ret = api_reply_response(r, 200, resp);
  MHD_destroy_response(resp);
  return ret;
}

int api_h_volume_files_delete(struct api_req *r, json_t *body) {
  static const char *const allowed[] = {"path", NULL};
  const char *path;
  if (vol_path(r, allowed, false, &path) < 0)
    return -1;
  moat_error *err = NULL;
  if (moat_control_volume_remove(api_control(r), r->org, r->route.name, path, &err) < 0)
    return api_reply_moat_error(r, &err);
  return api_reply_empty(r, 204);
}

/* PUT: the temporary file opens before the body is read; each chunk is written to it. */
struct vol_put {
  struct moat_vfile_writer *w; /* NULL once finished or failed */
  const char *path;            /* borrowed from r->args */
};

static void vol_put_free(void *p) {
  struct vol_put *u = p;
  moat_control_volume_write_close(u->w);
  free(u);
}

bool api_volume_put_open(struct api_req *r) {
  static const char *const allowed[] = {"path", "mode", NULL};
  struct vol_put *u = xcalloc(1, sizeof(*u));
  r->front = u;
  r->front_free = vol_put_free;
  if (vol_path(r, allowed, false, &u->path) < 0)
    return true;
  moat_error *err = NULL;
  uint32_t mode = 0;
  if (api_arg_mode(&r->args, &mode, &err) < 0)
    return api_reply_moat_error(r, &err), true;
  if (moat_control_volume_write_open(api_control(r), r->org, r->route.name, u->path, mode, &u->w, &err) < 0) {
    u->w = NULL;
    return api_reply_moat_error(r, &err), true;
  }
  return false;
}

int api_volume_put_chunk(struct api_req *r, const char *data, size_t len, moat_error **err) {
  struct vol_put *u = r->front;
  if (!u->w)
    return moat_error_set(err, EIO, "upload already failed");
  if (moat_control_volume_write(u->w, data, len, err) < 0) {
    moat_control_volume_write_close(u->w); /* the partial file goes; what was at path stays */
    u->w = NULL;
    return -1;
  }
  return 0;
}

int api_volume_put_finish(struct api_req *r) {
  struct vol_put *u = r->front;
  moat_error *err = NULL;
  uint64_t written = 0;
  if (!u || !u->w)
    return api_reply_error(r, 500, "internal", "upload is not open");
  int rc = moat_control_volume_write_finish(u->w, &written, &err);
  moat_control_volume_write_close(u->w);
  u->w = NULL;
  if (rc < 0)
    return api_reply_moat_error(r, &err);
  return api_reply_json(r, 200,
                        json_pack("{s:o, s:I}", "path", api_str_json(u->path), "size", (json_int_t)written));
}

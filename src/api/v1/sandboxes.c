/* sandboxes.c -- /v1/sandboxes: create, list (state, template and metadata filters, paged), get, patch,
 * delete */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../common/log.h"
#include "v1.h"

int api_args_list_filter(const struct api_args *a, bool *has_state, enum moat_sandbox_state *state,
                         json_t **meta, moat_error **err) {
  static const char *const allowed[] = {"state", "template", "metadata.", "limit", "cursor", NULL};
  *has_state = false;
  *meta = NULL;
  if (api_args_check(a, allowed, err) < 0)
    return -1;
  const char *st = api_arg_get(a, "state");
  if (st) {
    if (moat_sandbox_state_parse(st, state) < 0)
      return moat_error_set(
          err, EINVAL,
          "query parameter 'state' must be one of creating, running, paused, hibernated, killed");
    *has_state = true;
  }
  for (size_t i = 0; i < a->n; i++) {
    if (strncmp(a->v[i].key, "metadata.", 9) != 0)
      continue;
    const char *k = a->v[i].key + 9;
    if (strlen(k) > API_MAX_META_KEY || strlen(a->v[i].value) > API_MAX_META_VALUE) {
      json_decref(*meta);
      *meta = NULL;
      return moat_error_set(err, EINVAL, "metadata filter '%.64s' is too long", k);
    }
    if (!api_utf8_valid(k, strlen(k)) || !api_utf8_valid(a->v[i].value, strlen(a->v[i].value))) {
      json_decref(*meta);
      *meta = NULL;
      return moat_error_set(err, EINVAL, "metadata filters must be UTF-8");
    }
    if (!*meta)
      *meta = json_object();
    if (json_object_size(*meta) == API_MAX_META_KEYS) {
      json_decref(*meta);
      *meta = NULL;
      return moat_error_set(err, EINVAL, "at most %d metadata filters", API_MAX_META_KEYS);
    }
    json_object_set_new(*meta, k, json_string(a->v[i].value));
  }
  return 0;
}

int api_h_sandboxes_create(struct api_req *r, json_t *body) {
  moat_error *err = NULL;
  struct moat_sandbox_spec spec;
  if (api_args_none(r) < 0)
    return -1;
  if (api_parse_create(body, moat_control_host_memory_mb(api_control(r)), &spec, &err) < 0)
    return api_reply_moat_error(r, &err);
  const char *tname = spec.template_name ? spec.template_name : "base";
  if (!api_valid_template_name(tname) || !moat_control_template_known(api_control(r), r->org, tname))
    return api_reply_error(r, 400, "invalid_request", "unknown template '%.64s'", tname);
  struct moat_sandbox_info info;
  memset(&info, 0, sizeof(info));
  if (moat_control_create(api_control(r), r->org, &spec, &info, &err) < 0)
    return api_reply_moat_error(r, &err);
  int ret = api_reply_json(r, 201, api_sandbox_json(&info));
  moat_sandbox_info_clear(&info);
  return ret;
}

#define LIST_MAX_LIMIT 1000

/* The page the list's limit and cursor arguments ask for into *pg (its after_id points into id_buf):
 * 0, or -1 with the reply sent. The cursor is "c", the last row's created_at_ms, "." and its id:
 * opaque to clients. */
static int list_page_args(struct api_req *r, struct moat_store_page *pg, char *id_buf, size_t id_size) {
  memset(pg, 0, sizeof(*pg));
  const char *lim = api_arg_get(&r->args, "limit");
  if (lim) {
    char *end = NULL;
    long v = strtol(lim, &end, 10);
    if (lim[0] < '0' || lim[0] > '9' || *end || v < 1 || v > LIST_MAX_LIMIT)
      return api_reply_error(r, 400, "invalid_request", "'limit' must be an integer from 1 to %d",
                             LIST_MAX_LIMIT),
             -1;
    pg->limit = (size_t)v;
  }
  const char *cur = api_arg_get(&r->args, "cursor");
  if (cur) {
    const char *dot = strchr(cur, '.');
    char *end = NULL;
    unsigned long long ms =
        cur[0] == 'c' && cur[1] >= '0' && cur[1] <= '9' && dot ? strtoull(cur + 1, &end, 10) : 0;
    if (!dot || end != dot || ms > INT64_MAX || strlen(dot + 1) >= id_size || !api_valid_sandbox_id(dot + 1))
      return api_reply_error(r, 400, "invalid_request", "'cursor' is not one this API gave"), -1;
    snprintf(id_buf, id_size, "%s", dot + 1);
    pg->after_id = id_buf;
    pg->after_created_ms = (int64_t)ms;
  }
  return 0;
}

int api_h_sandboxes_list(struct api_req *r, json_t *body) {
  moat_error *err = NULL;
  bool has_state;
  enum moat_sandbox_state state;
  json_t *meta = NULL;
  if (api_args_list_filter(&r->args, &has_state, &state, &meta, &err) < 0)
    return api_reply_moat_error(r, &err);
  const char *tmpl = api_arg_get(&r->args, "template");
  if (tmpl && !api_valid_template_name(tmpl)) {
    json_decref(meta);
    return api_reply_error(r, 400, "invalid_request", "query parameter 'template' is not a template name");
  }
  struct moat_store_page pg;
  char after_id[MOAT_ID_LEN + 1];
  if (list_page_args(r, &pg, after_id, sizeof(after_id)) < 0) {
    json_decref(meta);
    return -1;
  }
  struct moat_sandbox_info *v = NULL;
  size_t n = 0, total = 0;
  bool more = false;
  int rc = moat_control_list_page(api_control(r), r->org, has_state ? &state : NULL, meta, tmpl, &pg, &v, &n,
                                  &total, &more, &err);
  json_decref(meta);
  if (rc < 0)
    return api_reply_moat_error(r, &err);
  json_t *arr = json_array();
  for (size_t i = 0; i < n; i++)
    json_array_append_new(arr, api_sandbox_json(&v[i]));
  json_t *next = json_null();
  if (more && n) {
    char buf[32 + MOAT_ID_LEN];
    snprintf(buf, sizeof(buf), "c%" PRId64 ".%s", v[n - 1].created_at_ms, v[n - 1].id);
    next = json_string(buf);
  }
  moat_sandbox_infos_free(v, n);
  return api_reply_json(
      r, 200, json_pack("{s:o, s:o, s:I}", "sandboxes", arr, "next", next, "total", (json_int_t)total));
}

int api_h_sandbox_get(struct api_req *r, json_t *body) {
  moat_error *err = NULL;
  if (api_args_none(r) < 0)
    return -1;
  struct moat_sandbox_info info;
  memset(&info, 0, sizeof(info));
  if (moat_control_get(api_control(r), r->org, r->route.id, &info, &err) < 0)
    return api_reply_moat_error(r, &err);
  int ret = api_reply_json(r, 200, api_sandbox_json(&info));
  moat_sandbox_info_clear(&info);
  return ret;
}

int api_h_sandbox_patch(struct api_req *r, json_t *body) {
  moat_error *err = NULL;
  struct moat_sandbox_patch patch;
  if (api_args_none(r) < 0)
    return -1;
  if (api_parse_patch(body, &patch, &err) < 0)
    return api_reply_moat_error(r, &err);
  struct moat_sandbox_info info;
  memset(&info, 0, sizeof(info));
  if (moat_control_update(api_control(r), r->org, r->route.id, &patch, &info, &err) < 0)
    return api_reply_moat_error(r, &err);
  int ret = api_reply_json(r, 200, api_sandbox_json(&info));
  moat_sandbox_info_clear(&info);
  return ret;
}

int api_h_sandbox_delete(struct api_req *r, json_t *body) {
  moat_error *err = NULL;
  if (api_args_none(r) < 0)
    return -1;
  if (moat_control_kill(api_control(r), r->org, r->route.id, "api", &err) < 0)
    return api_reply_moat_error(r, &err);
  return api_reply_empty(r, 204);
}

/* sandboxes.c -- /v1/sandboxes: create, list (state and metadata filters), get, patch, delete */
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "../../common/log.h"
#include "v1.h"

int api_args_list_filter(const struct api_args *a, bool *has_state, enum moat_sandbox_state *state,
                         json_t **meta, moat_error **err) {
  static const char *const allowed[] = {"state", "metadata.", NULL};
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

int api_h_sandboxes_list(struct api_req *r, json_t *body) {
  moat_error *err = NULL;
  bool has_state;
  enum moat_sandbox_state state;
  json_t *meta = NULL;
  if (api_args_list_filter(&r->args, &has_state, &state, &meta, &err) < 0)
    return api_reply_moat_error(r, &err);
  struct moat_sandbox_info *v = NULL;
  size_t n = 0;
  int rc = moat_control_list(api_control(r), r->org, has_state ? &state : NULL, meta, &v, &n, &err);
  json_decref(meta);
  if (rc < 0)
    return api_reply_moat_error(r, &err);
  json_t *arr = json_array();
  for (size_t i = 0; i < n; i++)
    json_array_append_new(arr, api_sandbox_json(&v[i]));
  moat_sandbox_infos_free(v, n);
  return api_reply_json(r, 200, json_pack("{s:o}", "sandboxes", arr));
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

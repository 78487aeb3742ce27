/* templates.c -- GET /v1/templates and POST /v1/templates/{name}/build */
#include <errno.h>
#include <string.h>

#include "v1.h"

static json_t *template_json(const struct moat_template_info *t) {
  json_t *o = json_object();
  json_object_set_new(o, "name", json_string(t->name ? t->name : ""));
  json_object_set_new(o, "state", json_string(moat_template_state_name(t->state)));
  json_object_set_new(o, "error", api_str_json(t->error));
  json_object_set_new(o, "built_at", api_time_json((int64_t)t->built_at * 1000, true));
  json_object_set_new(o, "size_bytes", json_integer((json_int_t)t->size_bytes));
  return o;
}

int api_h_templates_list(struct api_req *r, json_t *body) {
  static const char *const none[] = {NULL};
  moat_error *err = NULL;
  if (api_args_check(&r->args, none, &err) < 0)
    return api_reply_moat_error(r, &err);
  struct moat_template_info *v = NULL;
  size_t n = 0;
  if (moat_control_template_list(api_control(r), &v, &n, &err) < 0)
    return api_reply_moat_error(r, &err);
  json_t *arr = json_array();
  for (size_t i = 0; i < n; i++)
    json_array_append_new(arr, template_json(&v[i]));
  moat_template_infos_free(v, n);
  return api_reply_json(r, 200, json_pack("{s:o}", "templates", arr));
}

int api_h_template_build(struct api_req *r, json_t *body) {
  static const char *const none[] = {NULL};
  moat_error *err = NULL;
  if (api_args_check(&r->args, none, &err) < 0)
    return api_reply_moat_error(r, &err);
  /* Blocks until built (or until another thread's build of it ends). */
  if (moat_control_template_build(api_control(r), r->route.name, &err) < 0)
    return api_reply_moat_error(r, &err);
  struct moat_template_info *v = NULL;
  size_t n = 0;
  if (moat_control_template_list(api_control(r), &v, &n, &err) < 0)
    return api_reply_moat_error(r, &err);
  json_t *found = NULL;
  for (size_t i = 0; i < n; i++)
    if (v[i].name && strcmp(v[i].name, r->route.name) == 0)
      found = template_json(&v[i]);
  moat_template_infos_free(v, n);
  if (!found)
    return api_reply_error(r, 404, "not_found", "no template recipe '%s'", r->route.name);
  return api_reply_json(r, 200, found);
}

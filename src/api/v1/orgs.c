/* orgs.c -- /v1/orgs: the orgs the platform admin key manages, their quotas and their use now.
 * Who may call what is the routing's (server.c, api_req_authorize: API_RT_PLATFORM, API_RT_ORG):
 * a tenant's key reaches only its own org's quotas and usage, and another org is a 404. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "v1.h"

#define ORGS_DEFAULT_LIMIT 100
#define ORGS_MAX_LIMIT 1000

static json_t *org_json(const struct moat_org_info *o) {
  return json_pack("{s:s, s:s, s:o, s:s, s:o}", "id", o->id, "name", o->id, "created_at",
                   api_time_json(o->created_at_ms, false), "state", o->deleting ? "deleting" : "active",
                   "quotas", moat_quotas_json(&o->quotas));
}

static int org_error(struct api_req *r, moat_error **err) {
  if (*err && (*err)->status == ENOENT) {
    int ret = api_reply_error(r, 404, "not_found", "%s", moat_error_msg(*err));
    moat_error_free(err);
    return ret;
  }
  return api_reply_moat_error(r, err);
}

int api_h_orgs_create(struct api_req *r, json_t *body) {
  if (api_args_none(r) < 0)
    return -1;
  const char *k, *name = NULL;
  json_t *v;
  json_object_foreach(body, k, v) {
    if (strcmp(k, "name") != 0)
      return api_reply_error(r, 400, "invalid_request", "unknown field '%.64s' (name)", k);
    if (!json_is_string(v))
      return api_reply_error(r, 400, "invalid_request", "field 'name' must be a string");
    name = json_string_value(v);
  }
  if (!name)
    return api_reply_error(r, 400, "invalid_request", "field 'name' is required");
  moat_error *err = NULL;
  struct moat_org_info info;
  struct moat_key_info key;
  char *secret = NULL;
  if (moat_control_org_create(api_control(r), name, &info, &key, &secret, &err) < 0)
    return api_reply_moat_error(r, &err);
  json_t *o = org_json(&info);
  json_object_set_new(o, "admin_key",
                      json_pack("{s:s, s:s, s:s, s:s}", "id", key.id, "name", key.name, "role",
                                moat_key_role_name(key.role), "key", secret));
  explicit_bzero(secret, strlen(secret));
  free(secret);
  moat_org_info_clear(&info);
  return api_reply_json(r, 201, o);
}

int api_h_orgs_list(struct api_req *r, json_t *body) {
  static const char *const allowed[] = {"limit", "cursor", NULL};
  moat_error *err = NULL;
  if (api_args_check(&r->args, allowed, &err) < 0)
    return api_reply_moat_error(r, &err);
  unsigned limit = ORGS_DEFAULT_LIMIT;
  const char *lim = api_arg_get(&r->args, "limit");
  if (lim) {
    char *end = NULL;
    long n = strtol(lim, &end, 10);
    if (!*lim || *end || n < 1 || n > ORGS_MAX_LIMIT)
      return api_reply_error(r, 400, "invalid_request", "'limit' must be an integer from 1 to %d",
                             ORGS_MAX_LIMIT);
    limit = (unsigned)n;
  }
  /* the cursor is the last org's id (ids are unique and listed in order) */
  const char *cur = api_arg_get(&r->args, "cursor");
  if (cur && !moat_org_id_valid(cur))
    return api_reply_error(r, 400, "invalid_request", "'cursor' is not one this API gave");
  struct moat_org_info *v = NULL;
  size_t n = 0;
  if (moat_control_org_list(api_control(r), cur, limit, &v, &n, &err) < 0)
    return api_reply_moat_error(r, &err);
  json_t *arr = json_array();
  for (size_t i = 0; i < n; i++)
    json_array_append_new(arr, org_json(&v[i]));
  json_t *next = n == limit ? json_string(v[n - 1].id) : json_null();
  moat_org_infos_free(v, n);
  return api_reply_json(r, 200, json_pack("{s:o, s:o}", "orgs", arr, "next", next));
}

int api_h_org_get(struct api_req *r, json_t *body) {
  if (api_args_none(r) < 0)
    return -1;
  moat_error *err = NULL;
  struct moat_org_info info;
  if (moat_control_org_get(api_control(r), r->route.sid, &info, &err) < 0)
    return org_error(r, &err);
  json_t *o = org_json(&info);
  moat_org_info_clear(&info);
  return api_reply_json(r, 200, o);
}

int api_h_org_delete(struct api_req *r, json_t *body) {
  static const char *const allowed[] = {"force", NULL};
  moat_error *err = NULL;
  bool force = false;
  if (api_args_check(&r->args, allowed, &err) < 0 || api_arg_bool(&r->args, "force", false, &force, &err) < 0)
    return api_reply_moat_error(r, &err);
  if (moat_control_org_delete(api_control(r), r->route.sid, force, &err) < 0) {
    if (err && err->status == EBUSY) {
      int ret = api_reply_error(r, 409, "org_not_empty", "%s", moat_error_msg(err));
      moat_error_free(&err);
      return ret;
    }
    return org_error(r, &err);
  }
  return api_reply_empty(r, 204);
}

int api_h_org_quotas_get(struct api_req *r, json_t *body) {
  if (api_args_none(r) < 0)
    return -1;
  moat_error *err = NULL;
  struct moat_org_info info;
  if (moat_control_org_get(api_control(r), r->route.sid, &info, &err) < 0)
    return org_error(r, &err);
  json_t *o = moat_quotas_json(&info.quotas);
  moat_org_info_clear(&info);
  return api_reply_json(r, 200, o);
}

int api_h_org_quotas_put(struct api_req *r, json_t *body) {
  if (api_args_none(r) < 0)
    return -1;
  moat_error *err = NULL;
  struct moat_quotas q;
  if (moat_quotas_parse(body, &q, &err) < 0 ||
      moat_control_org_quotas_set(api_control(r), r->route.sid, &q, &err) < 0)
    return org_error(r, &err);
  return api_reply_json(r, 200, moat_quotas_json(&q));
}

int api_h_org_usage(struct api_req *r, json_t *body) {
  if (api_args_none(r) < 0)
    return -1;
  moat_error *err = NULL;
  struct moat_org_info info;
  if (moat_control_org_get(api_control(r), r->route.sid, &info, &err) < 0)
    return org_error(r, &err);
  moat_org_info_clear(&info);
  struct moat_quotas q;
  int64_t use[MOAT_Q_N];
  if (moat_control_org_usage(api_control(r), r->route.sid, &q, use, &err) < 0)
    return api_reply_moat_error(r, &err);
  json_t *usage = json_object();
  for (int i = 0; i < MOAT_Q_N; i++)
    json_object_set_new(usage, moat_quota_name((enum moat_quota)i),
                        json_pack("{s:I, s:o}", "use", (json_int_t)use[i], "limit",
                                  q.v[i] < 0 ? json_null() : json_integer(q.v[i])));
  return api_reply_json(r, 200, json_pack("{s:s, s:o}", "org", r->route.sid, "usage", usage));
}

/* keys.c -- /v1/me and /v1/keys: who the calling key is, and the API keys an admin manages for its
 * org. A key's secret is answered once, by the POST that makes it; the store keeps only its hash.
 * Roles are enforced by the routing (server.c, api_req_authorize), not here. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "v1.h"

static json_t *key_json(const struct moat_key_info *k) {
  json_t *o = json_object();
  json_object_set_new(o, "id", json_string(k->id));
  json_object_set_new(o, "name", api_str_json(k->name));
  json_object_set_new(o, "role", json_string(moat_key_role_name(k->role)));
  json_object_set_new(o, "created_at", api_time_json(k->created_at_ms, false));
  json_object_set_new(o, "expires_at", api_time_json(k->expires_at_ms, true));
  json_object_set_new(o, "last_used_at", api_time_json(k->last_used_at_ms, true));
  return o;
}

int api_h_me(struct api_req *r, json_t *body) {
  if (api_args_none(r) < 0)
    return -1;
  json_t *key = json_object();
  json_object_set_new(key, "id", json_string(r->key.id));
  json_object_set_new(key, "name", api_str_json(r->key.name));
  json_object_set_new(key, "role", json_string(moat_key_role_name(r->key.role)));
  json_object_set_new(key, "expires_at", api_time_json(r->key.expires_at_ms, true));
  return api_reply_json(r, 200, json_pack("{s:o, s:{s:o}}", "key", key, "org", "id", api_str_json(r->org)));
}

int api_h_keys_create(struct api_req *r, json_t *body) {
  if (api_args_none(r) < 0)
    return -1;
  const char *k, *name = NULL;
  json_t *v;
  enum moat_key_role role = MOAT_ROLE_MEMBER;
  int64_t expires = 0;
  json_object_foreach(body, k, v) {
    if (strcmp(k, "name") == 0) {
      if (!json_is_string(v))
        return api_reply_error(r, 400, "invalid_request", "field 'name' must be a string");
      name = json_string_value(v);
    } else if (strcmp(k, "role") == 0) {
      if (!json_is_string(v) || moat_key_role_parse(json_string_value(v), &role) < 0)
        return api_reply_error(r, 400, "invalid_request", "field 'role' must be admin, member or readonly");
    } else if (strcmp(k, "expires_at") == 0) {
      if (json_is_null(v))
        continue;
      const char *t = json_is_string(v) ? json_string_value(v) : NULL;
      /* RFC 3339 only: api_parse_time_ms also takes Unix milliseconds, which have no 'T' */
      if (!t || !strchr(t, 'T') || api_parse_time_ms(t, &expires) < 0)
        return api_reply_error(r, 400, "invalid_request",
                               "field 'expires_at' must be an RFC 3339 time (2026-01-02T03:04:05Z)");
      if (expires <= now_unix_ms())
        return api_reply_error(r, 400, "invalid_request", "field 'expires_at' must be in the future");
    } else {
      return api_reply_error(r, 400, "invalid_request", "unknown field '%.64s' (name, role, expires_at)", k);
    }
  }
  if (!name)
    return api_reply_error(r, 400, "invalid_request", "field 'name' is required");
  if (!moat_key_name_valid(name))
    return api_reply_error(r, 400, "invalid_request", "field 'name' must be 1 to %d bytes of printable ASCII",
                           MOAT_KEY_NAME_MAX);
  moat_error *err = NULL;
  struct moat_key_info info;
  char *secret = NULL;
  if (moat_control_keys_create(api_control(r), r->org, name, role, expires, &info, &secret, &err) < 0)
    return api_reply_moat_error(r, &err);
  json_t *o = key_json(&info);
  json_object_del(o, "last_used_at");
  json_object_set_new(o, "key", json_string(secret));
  explicit_bzero(secret, strlen(secret));
  free(secret);
  return api_reply_json(r, 201, o);
}

int api_h_keys_list(struct api_req *r, json_t *body) {
  if (api_args_none(r) < 0)
    return -1;
  moat_error *err = NULL;
  struct moat_key_info *v = NULL;
  size_t n = 0;
  if (moat_control_keys_list(api_control(r), r->org, &v, &n, &err) < 0)
    return api_reply_moat_error(r, &err);
  json_t *arr = json_array();
  for (size_t i = 0; i < n; i++)
    json_array_append_new(arr, key_json(&v[i]));
  free(v);
  return api_reply_json(r, 200, json_pack("{s:o}", "keys", arr));
}

int api_h_key_delete(struct api_req *r, json_t *body) {
  if (api_args_none(r) < 0)
    return -1;
  moat_error *err = NULL;
  if (moat_control_keys_delete(api_control(r), r->org, r->route.kid, &err) < 0) {
    if (err && err->status == ENOENT) {
      moat_error_free(&err);
      return api_reply_error(r, 404, "not_found", "no API key '%.64s'", r->route.kid);
    }
    return api_reply_moat_error(r, &err);
  }
  return api_reply_empty(r, 204);
}

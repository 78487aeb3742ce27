/* databases.c -- /v1/databases: an org's PostgreSQL databases (create, list, get, delete) */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "v1.h"

/* A database as CONTRACT.md's Databases section shows it: the password is the org's to see. */
static json_t *database_json(struct api_req *r, const struct moat_database_info *d) {
  return api_database_json(api_control(r), d);
}

/* The {sid} segment as a database id, else 404 as for an unknown one. */
static const char *db_id(struct api_req *r) {
  const char *id = r->route.sid;
  if (strncmp(id, "db-", 3) != 0 || strlen(id) != MOAT_DB_ID_LEN) {
    api_reply_error(r, 404, "not_found", "no database %.64s", id);
    return NULL;
  }
  return id;
}

int api_h_databases_create(struct api_req *r, json_t *body) {
  if (api_args_none(r) < 0)
    return -1;
  struct moat_database_spec spec;
  moat_error *err = NULL;
  if (api_parse_database_create(body, &spec, &err) < 0)
    return api_reply_moat_error(r, &err);
  struct moat_database_info d;
  if (moat_control_database_create(api_control(r), r->org, &spec, &d, &err) < 0)
    return api_reply_moat_error(r, &err);
  int ret = api_reply_json(r, 201, database_json(r, &d));
  moat_database_info_clear(&d);
  return ret;
}

int api_h_databases_list(struct api_req *r, json_t *body) {
  if (api_args_none(r) < 0)
    return -1;
  moat_error *err = NULL;
  struct moat_database_info *v = NULL;
  size_t n = 0;
  if (moat_control_database_list(api_control(r), r->org, &v, &n, &err) < 0)
    return api_reply_moat_error(r, &err);
  json_t *arr = json_array();
  for (size_t i = 0; i < n; i++)
    json_array_append_new(arr, database_json(r, &v[i]));
  moat_database_infos_free(v, n);
  return api_reply_json(r, 200, json_pack("{s:o}", "databases", arr));
}

int api_h_database_get(struct api_req *r, json_t *body) {
  if (api_args_none(r) < 0)
    return -1;
  const char *id = db_id(r);
  if (!id)
    return -1;
  moat_error *err = NULL;
  struct moat_database_info d;
  if (moat_control_database_get(api_control(r), r->org, id, &d, &err) < 0)
    return api_reply_moat_error(r, &err);
  int ret = api_reply_json(r, 200, database_json(r, &d));
  moat_database_info_clear(&d);
  return ret;
}

int api_h_database_delete(struct api_req *r, json_t *body) {
  if (api_args_none(r) < 0)
    return -1;
  const char *id = db_id(r);
  if (!id)
    return -1;
  moat_error *err = NULL;
  if (moat_control_database_delete(api_control(r), r->org, id, &err) < 0)
    return api_reply_moat_error(r, &err);
  return api_reply_empty(r, 204);
}

/* databases.c -- /v1/databases: an org's PostgreSQL databases (create, list, get, branch, delete) */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../common/buf.h"
#include "v1.h"

#define DB_EV_POLL_MS 200 /* latency of a live event */

/* The {sid} segment as a database id of a request with no query arguments, else NULL with the reply
 * sent (404 as for an unknown one). */
static const char *db_id(struct api_req *r) {
  if (api_args_none(r) < 0)
    return NULL;
  const char *id = r->route.sid;
  if (strncmp(id, "db-", 3) != 0 || strlen(id) != MOAT_DB_ID_LEN) {
    api_reply_error(r, 404, "not_found", "no database %.64s", id);
    return NULL;
  }
  return id;
}

/* Replies status with d (cleared). */
static int reply_database(struct api_req *r, int status, struct moat_database_info *d) {
  int ret = api_reply_json(r, status, api_database_json(r, d));
  moat_database_info_clear(d);
  return ret;
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
  return reply_database(r, 201, &d);
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
    json_array_append_new(arr, api_database_json(r, &v[i]));
  moat_database_infos_free(v, n);
  return api_reply_json(r, 200, json_pack("{s:o}", "databases", arr));
}

int api_h_database_get(struct api_req *r, json_t *body) {
  const char *id = db_id(r);
  if (!id)
    return -1;
  moat_error *err = NULL;
  struct moat_database_info d;
  if (moat_control_database_get(api_control(r), r->org, id, &d, &err) < 0)
    return api_reply_moat_error(r, &err);
  return reply_database(r, 200, &d);
}

int api_h_database_delete(struct api_req *r, json_t *body) {
  const char *id = db_id(r);
  if (!id)
    return -1;
  moat_error *err = NULL;
  if (moat_control_database_delete(api_control(r), r->org, id, &err) < 0)
    return api_reply_moat_error(r, &err);
  return api_reply_empty(r, 204);
}

/* POST /v1/databases/{id}/branch {name, size_mb, idle_seconds, metadata}: as a create's body. */
int api_h_database_branch(struct api_req *r, json_t *body) {
  const char *id = db_id(r);
  if (!id)
    return -1;
  struct moat_database_spec spec;
  moat_error *err = NULL;
  if (api_parse_database_create(body, &spec, &err) < 0)
    return api_reply_moat_error(r, &err);
  struct moat_database_info d;
  if (moat_control_database_branch(api_control(r), r->org, id, &spec, &d, &err) < 0)
    return api_reply_moat_error(r, &err);
  return reply_database(r, 201, &d);
}

/* ---- GET /v1/databases/{id}/events ---- */

/* The stream: first a "state" event (the database as GET shows it), then each event as control
 * records it (moat_control_database_events) under its type's name; it ends with "deleted" once the
 * database is gone. */
struct dbev {
  struct moat_control *ctl;
  char *org, *id;
  uint64_t seq; /* the last event sent */
};

static void dbev_free(void *ctx) {
  struct dbev *e = ctx;
  free(e->org);
  free(e->id);
  free(e);
}

static void dbev_next(void *ctx, struct moat_buf *out, int timeout_ms, bool *done) {
  struct dbev *e = ctx;
  moat_error *err = NULL;
  json_t *evs = moat_control_database_events(e->ctl, e->org, e->id, e->seq, &err);
  if (!evs) {
    if (err && err->status == ENOENT)
      api_sse_format(out, "deleted", json_pack("{s:s}", "database_id", e->id));
    else {
      const char *code;
      api_errno_http(err ? err->status : 0, &code);
      api_sse_format(out, "error", api_error_json(code, moat_error_msg(err)));
    }
    moat_error_free(&err);
    *done = true;
    return;
  }
  size_t i;
  json_t *ev;
  json_array_foreach(evs, i, ev) {
    e->seq = (uint64_t)json_integer_value(json_object_get(ev, "seq"));
    api_sse_format(out, json_string_value(json_object_get(ev, "type")), json_incref(ev));
  }
  size_t n = json_array_size(evs);
  json_decref(evs);
  if (n == 0) {
    struct timespec ts = {0, (long)(timeout_ms < DB_EV_POLL_MS ? timeout_ms : DB_EV_POLL_MS) * 1000000L};
    nanosleep(&ts, NULL);
  }
}

int api_h_database_events(struct api_req *r, json_t *body) {
  const char *id = db_id(r);
  if (!id)
    return -1;
  struct moat_control *c = api_control(r);
  moat_error *err = NULL;
  struct moat_database_info d;
  if (moat_control_database_get(c, r->org, id, &d, &err) < 0)
    return api_reply_moat_error(r, &err);
  /* what is there now is history: the stream starts after it, with the state */
  json_t *past = moat_control_database_events(c, r->org, id, 0, &err);
  if (!past) {
    moat_database_info_clear(&d);
    return api_reply_moat_error(r, &err);
  }
  struct dbev *e = xcalloc(1, sizeof(*e));
  e->ctl = c;
  e->org = xstrdup(r->org);
  e->id = xstrdup(id);
  size_t n = json_array_size(past);
  if (n)
    e->seq = (uint64_t)json_integer_value(json_object_get(json_array_get(past, n - 1), "seq"));
  json_decref(past);
  struct moat_buf first = {0};
  api_sse_format(&first, "state",
                 json_pack("{s:s, s:s, s:i, s:s?}", "database_id", d.id, "state", d.state, "connections",
                           d.connections, "sandbox_id", d.sandbox_id));
  moat_database_info_clear(&d);
  struct api_stream_source src = {.next = dbev_next, .free = dbev_free, .ctx = e, .poll_ms = DB_EV_POLL_MS};
  int ret = api_stream_reply(r, &src, "text/event-stream", first.p);
  free(first.p);
  return ret;
}

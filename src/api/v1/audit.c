/* audit.c -- GET /v1/audit: the org's audit log of mutating calls, paged (control.h, "audit") */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "v1.h"

#define AUDIT_MAX_LIMIT 1000
#define AUDIT_DEFAULT_LIMIT 100
#define AUDIT_MAX_RANGE_MS (366LL * 86400000LL)

/* A time argument (RFC 3339 or Unix ms) into *ms; absent: def. -1 with the reply sent. */
static int time_arg(struct api_req *r, const char *name, int64_t def, int64_t *ms) {
  const char *s = api_arg_get(&r->args, name);
  *ms = def;
  if (s && api_parse_time_ms(s, ms) < 0) {
    api_reply_error(r, 400, "invalid_request",
                    "query parameter '%s' must be an RFC 3339 time or Unix milliseconds", name);
    return -1;
  }
  return 0;
}

static json_t *entry_json(const struct moat_store_audit *a) {
  char at[64];
  return json_pack("{s:I, s:s, s:I, s:s?, s:s, s:s, s:s, s:s?, s:i}", "seq", (json_int_t)a->seq, "at",
                   api_rfc3339_ms(a->at_ms, at, sizeof(at)), "at_ms", (json_int_t)a->at_ms, "key_id",
                   a->key_id, "method", a->method, "route", a->route, "path", a->path, "target", a->target,
                   "status", a->status);
}

int api_h_audit(struct api_req *r, json_t *body) {
  static const char *const allowed[] = {"from", "to", "target", "key", "limit", "cursor", NULL};
  moat_error *err = NULL;
  if (api_args_check(&r->args, allowed, &err) < 0)
    return api_reply_moat_error(r, &err);
  struct moat_control *c = api_control(r);
  int64_t now = now_unix_ms();
  struct moat_store_audit_query q = {.org = r->org, .limit = AUDIT_DEFAULT_LIMIT};
  if (time_arg(r, "to", now + 1, &q.to_ms) < 0 ||
      time_arg(r, "from", q.to_ms - moat_control_audit_retention_ms(c), &q.from_ms) < 0)
    return -1;
  if (q.from_ms > q.to_ms)
    return api_reply_error(r, 400, "invalid_request", "'from' is after 'to'");
  if (q.to_ms - q.from_ms > AUDIT_MAX_RANGE_MS)
    return api_reply_error(r, 400, "invalid_request",
                           "the range from 'from' to 'to' is longer than 366 days");
  q.target = api_arg_get(&r->args, "target");
  q.key_id = api_arg_get(&r->args, "key");
  if ((q.target && (!*q.target || strlen(q.target) > 128)) ||
      (q.key_id && (!*q.key_id || strlen(q.key_id) > 64)))
    return api_reply_error(r, 400, "invalid_request",
                           "'target' (1..128 characters) or 'key' (1..64) is malformed");
  const char *lim = api_arg_get(&r->args, "limit");
  if (lim) {
    char *end = NULL;
    long v = strtol(lim, &end, 10);
    if (!*lim || *end || v < 1 || v > AUDIT_MAX_LIMIT)
      return api_reply_error(r, 400, "invalid_request", "'limit' must be an integer from 1 to %d",
                             AUDIT_MAX_LIMIT);
    q.limit = (unsigned)v;
  }
  const char *cur = api_arg_get(&r->args, "cursor");
  if (cur) {
    /* the cursor is "a" and the last entry's seq: opaque to clients */
    char *end = NULL;
    unsigned long long v = cur[0] == 'a' && cur[1] >= '0' && cur[1] <= '9' ? strtoull(cur + 1, &end, 10) : 0;
    if (!v || !end || *end || v > INT64_MAX)
      return api_reply_error(r, 400, "invalid_request", "'cursor' is not one this API gave");
    q.after = v;
  }
  struct moat_store_audit *v = NULL;
  size_t n = 0;
  if (moat_control_audit_list(c, &q, &v, &n, &err) < 0)
    return api_reply_moat_error(r, &err);
  json_t *arr = json_array();
  for (size_t i = 0; i < n; i++)
    json_array_append_new(arr, entry_json(&v[i]));
  json_t *next = json_null();
  if (n == q.limit) {
    char buf[32];
    snprintf(buf, sizeof(buf), "a%" PRIu64, v[n - 1].seq);
    next = json_string(buf);
  }
  moat_store_audit_free(v, n);
  return api_reply_json(r, 200, json_pack("{s:o, s:o}", "entries", arr, "next", next));
}

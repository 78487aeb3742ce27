/* usage.c -- GET /v1/usage (the org's metered use over a range, grouped, and per time bucket) and the history
 * form of GET /v1/sandboxes/{id}/metrics (?from=&to=: the sandbox's samples); control.h, "metering" */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "v1.h"

#define USAGE_DEFAULT_RANGE_MS (24LL * 3600000LL)
#define USAGE_MAX_RANGE_MS (366LL * 86400000LL)
#define SERIES_MAX_LIMIT 10000
#define SERIES_DEFAULT_LIMIT 10000
#define META_KEY_MAX 256
#define BUCKET_MIN_S 60
#define BUCKET_MAX_S 86400
#define BUCKETS_MAX 2000

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

/* from/to with their defaults (to: now; from: to less def_range), checked (capped: at most 366 days
 * apart). -1 with the reply sent. */
static int range_args(struct api_req *r, int64_t def_range, bool capped, int64_t *from, int64_t *to) {
  if (time_arg(r, "to", now_unix_ms() + 1, to) < 0 || time_arg(r, "from", *to - def_range, from) < 0)
    return -1;
  if (*from > *to) {
    api_reply_error(r, 400, "invalid_request", "'from' is after 'to'");
    return -1;
  }
  if (capped && *to - *from > USAGE_MAX_RANGE_MS) {
    api_reply_error(r, 400, "invalid_request", "the range from 'from' to 'to' is longer than 366 days");
    return -1;
  }
  return 0;
}

static double round3(double x) { return (double)(long long)(x * 1000 + (x >= 0 ? 0.5 : -0.5)) / 1000; }

/* The bucket argument (seconds) into *ms, 0 when absent, checked against the range [from, to): its
 * buckets (aligned to multiples of the width since the Unix epoch) are at most BUCKETS_MAX. -1 with
 * the reply sent. */
static int bucket_arg(struct api_req *r, int64_t from, int64_t to, int64_t *ms) {
  const char *b = api_arg_get(&r->args, "bucket");
  *ms = 0;
  if (!b)
    return 0;
  char *end = NULL;
  long x = strtol(b, &end, 10);
  if (!*b || *end || x < BUCKET_MIN_S || x > BUCKET_MAX_S) {
    api_reply_error(r, 400, "invalid_request", "'bucket' must be a whole number of seconds from %d to %d",
                    BUCKET_MIN_S, BUCKET_MAX_S);
    return -1;
  }
  int64_t w = (int64_t)x * 1000;
  int64_t origin = from - ((from % w) + w) % w;
  int64_t n = to > from ? (to - origin + w - 1) / w : 0;
  if (n > BUCKETS_MAX) {
    api_reply_error(r, 400, "invalid_request",
                    "'from' to 'to' in buckets of 'bucket' = %ld s makes %lld buckets; at most %d", x,
                    (long long)n, BUCKETS_MAX);
    return -1;
  }
  *ms = w;
  return 0;
}

static json_t *series_json(const struct moat_usage_row *row) {
  json_t *a = json_array();
  for (size_t i = 0; i < row->n_series; i++) {
    const struct moat_usage_point *p = &row->series[i];
    json_array_append_new(a, json_pack("{s:o, s:f, s:f, s:f}", "start", api_time_json(p->start_ms, false),
                                       "cpu_seconds", round3(p->cpu_seconds), "memory_gib_seconds",
                                       round3(p->memory_gib_seconds), "sandbox_seconds",
                                       round3(p->sandbox_seconds)));
  }
  return a;
}

int api_h_usage(struct api_req *r, json_t *body) {
  static const char *const allowed[] = {"from", "to", "group_by", "bucket", NULL};
  moat_error *err = NULL;
  if (api_args_check(&r->args, allowed, &err) < 0)
    return api_reply_moat_error(r, &err);
  int64_t from, to;
  if (range_args(r, USAGE_DEFAULT_RANGE_MS, true, &from, &to) < 0)
    return -1;
  int64_t bucket_ms;
  if (bucket_arg(r, from, to, &bucket_ms) < 0)
    return -1;
  const char *gb = api_arg_get(&r->args, "group_by");
  enum moat_usage_group g = MOAT_USAGE_BY_SANDBOX;
  const char *key = NULL;
  if (!gb || strcmp(gb, "sandbox") == 0) {
    g = MOAT_USAGE_BY_SANDBOX;
  } else if (strcmp(gb, "org") == 0) {
    g = MOAT_USAGE_BY_ORG;
  } else if (strcmp(gb, "template") == 0) {
    g = MOAT_USAGE_BY_TEMPLATE;
  } else if (strncmp(gb, "metadata.", 9) == 0) {
    g = MOAT_USAGE_BY_METADATA;
    key = gb + 9;
    bool ok = *key && strlen(key) <= META_KEY_MAX;
    for (const char *p = key; ok && *p; p++)
      ok = (unsigned char)*p >= 0x20 && *p != 0x7f;
    if (!ok)
      return api_reply_error(r, 400, "invalid_request",
                             "'group_by' metadata.KEY needs a key of 1..%d printable characters",
                             META_KEY_MAX);
  } else {
    return api_reply_error(r, 400, "invalid_request",
                           "'group_by' must be org, sandbox, template or metadata.KEY");
  }
  struct moat_usage_row *v = NULL;
  size_t n = 0;
  if (moat_control_usage_query(api_control(r), r->org, from, to, g, key, bucket_ms, &v, &n, &err) < 0)
    return api_reply_moat_error(r, &err);
  json_t *arr = json_array();
  for (size_t i = 0; i < n; i++) {
    json_t *row = json_pack("{s:s?, s:f, s:f, s:f}", "key", v[i].key, "cpu_seconds", round3(v[i].cpu_seconds),
                            "memory_gib_seconds", round3(v[i].memory_gib_seconds), "sandbox_seconds",
                            round3(v[i].sandbox_seconds));
    if (bucket_ms > 0)
      json_object_set_new(row, "series", series_json(&v[i]));
    json_array_append_new(arr, row);
  }
  moat_usage_rows_free(v, n);
  return api_reply_json(r, 200, arr);
}

static json_t *opt_int(int64_t v) { return v < 0 ? json_null() : json_integer(v); }

/* GET /v1/sandboxes/{id}/metrics?from=&to=&limit= (metrics.c hands it here when from or to is
 * given): the sandbox's samples, oldest first. */
int api_sandbox_metrics_series(struct api_req *r) {
  static const char *const allowed[] = {"from", "to", "limit", NULL};
  moat_error *err = NULL;
  if (api_args_check(&r->args, allowed, &err) < 0)
    return api_reply_moat_error(r, &err);
  struct moat_control *c = api_control(r);
  int64_t from, to;
  if (range_args(r, moat_control_metrics_retention_ms(c), false, &from, &to) < 0)
    return -1;
  unsigned limit = SERIES_DEFAULT_LIMIT;
  const char *lim = api_arg_get(&r->args, "limit");
  if (lim) {
    char *end = NULL;
    long x = strtol(lim, &end, 10);
    if (!*lim || *end || x < 1 || x > SERIES_MAX_LIMIT)
      return api_reply_error(r, 400, "invalid_request", "'limit' must be an integer from 1 to %d",
                             SERIES_MAX_LIMIT);
    limit = (unsigned)x;
  }
  struct moat_store_meter_sample *v = NULL;
  size_t n = 0;
  if (moat_control_metrics_series(c, r->org, r->route.id, from, to, limit, &v, &n, &err) < 0)
    return api_reply_moat_error(r, &err);
  json_t *arr = json_array();
  for (size_t i = 0; i < n; i++) {
    const struct moat_store_meter_sample *s = &v[i];
    json_array_append_new(
        arr,
        json_pack("{s:o, s:I, s:f, s:f, s:I, s:I, s:o, s:o, s:o, s:o, s:f, s:f}", "timestamp",
                  api_time_json(s->at_ms, false), "timestamp_ms", (json_int_t)s->at_ms, "cpu_used_pct",
                  round3(s->cpu_pct), "cpu_count", s->cpu_count, "memory_used_bytes", (json_int_t)s->mem_used,
                  "memory_limit_bytes", (json_int_t)s->mem_limit, "disk_used_bytes", opt_int(s->disk_used),
                  "disk_total_bytes", opt_int(s->disk_total), "network_rx_bytes", opt_int(s->net_rx),
                  "network_tx_bytes", opt_int(s->net_tx), "cpu_seconds", round3((double)s->cpu_ns / 1e9),
                  "memory_gib_seconds", round3(s->mem_gib_s)));
  }
  moat_store_meter_samples_free(v, n);
  return api_reply_json(r, 200,
                        json_pack("{s:s, s:o, s:o, s:o}", "sandbox_id", r->route.id, "from",
                                  api_time_json(from, false), "to", api_time_json(to, false), "samples",
                                  arr));
}

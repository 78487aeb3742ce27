/* cmd_usage.c -- moat usage [--from T] [--to T] [--group-by G] [--bucket S] (GET /v1/usage) and
 * moat metrics ID [--from T] [--to T] [--limit N] (GET /v1/sandboxes/{id}/metrics: the sample of
 * now, or with a range the recorded history) */
#include <stdlib.h>
#include <string.h>

#include "../common/util.h"
#include "cli.h"

static const char usage_usage[] =
    "moat usage [--from T] [--to T] [--group-by sandbox|org|template|metadata.KEY] [--bucket S]\n"
    "           [--json]\n"
    "    the org's metered use over [from, to) (RFC 3339 or Unix ms; default the last 24 h):\n"
    "    CPU-seconds, working-set GiB-seconds and seconds alive per group, the largest CPU first;\n"
    "    with --bucket S (seconds, 60..86400) also each group's use per bucket of S seconds\n"
    "    (aligned to multiples of S since the Unix epoch; buckets without use are not shown)\n"
    "moat usage now ORG\n"
    "    the org's use against each of its quotas now\n";

static const char metrics_usage[] =
    "moat metrics ID [--from T] [--to T] [--limit N] [--json]\n"
    "    without a range: the sandbox's resource use now (JSON); with --from/--to/--limit: its\n"
    "    recorded samples (every 10 s, kept moatd --metrics-retention-hours), oldest first\n";

enum { U_FROM = 1, U_TO, U_GROUP, U_LIMIT, U_BUCKET, U_JSON };
static const struct cli_opt usage_opts[] = {
    {"from", true, U_FROM},   {"to", true, U_TO},         {"group-by", true, U_GROUP},
    {"limit", true, U_LIMIT}, {"bucket", true, U_BUCKET}, {"json", false, U_JSON},
    {NULL, false, 0}};

struct usage_ctx {
  const char *from, *to, *group, *limit, *bucket;
  bool json;
};

static int on_usage_opt(int id, const char *value, void *ctx) {
  struct usage_ctx *u = ctx;
  switch (id) {
  case U_FROM:
    u->from = value;
    break;
  case U_TO:
    u->to = value;
    break;
  case U_GROUP:
    u->group = value;
    break;
  case U_LIMIT:
    u->limit = value;
    break;
  case U_BUCKET:
    u->bucket = value;
    break;
  default:
    u->json = true;
  }
  return 0;
}

/* Appends "&name=escaped(value)" (the first one with '?') to q when value is set. */
static void add_query(char **q, const char *name, const char *value) {
  if (!value)
    return;
  _cleanup_free_ char *e = cli_escape(value);
  char *n = xasprintf("%s%s%s=%s", *q, strchr(*q, '?') ? "&" : "?", name, e);
  free(*q);
  *q = n;
}

static double num(json_t *o, const char *k) { return json_number_value(json_object_get(o, k)); }

int cmd_usage(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "now") == 0)
    return cmd_usage_now(argc, argv);
  struct usage_ctx u = {0};
  struct cli_args a;
  int r = cli_parse(argc, argv, usage_opts, 0, false, on_usage_opt, &u, &a);
  free(a.pos);
  free(a.rest);
  if (r == 1) {
    printf("usage: %s", usage_usage);
    return 0;
  }
  if (r < 0 || u.limit)
    return cli_usage_error(usage_usage, "%s", r < 0 ? "" : "usage takes no --limit");
  char *path = xstrdup("/v1/usage");
  add_query(&path, "from", u.from);
  add_query(&path, "to", u.to);
  add_query(&path, "group_by", u.group);
  add_query(&path, "bucket", u.bucket);
  struct cli_resp resp;
  r = cli_request("GET", path, NULL, &resp);
  free(path);
  if (r < 0)
    return EXIT_API;
  if (u.json) {
    json_dumpf(resp.json, stdout, JSON_INDENT(2));
    printf("\n");
  } else {
    printf("%-28s %14s %18s %14s\n", "KEY", "CPU_SECONDS", "MEMORY_GIB_SECONDS", "SANDBOX_SECONDS");
    size_t i;
    json_t *x;
    json_array_foreach(resp.json, i, x) {
      const char *k = json_string_value(json_object_get(x, "key"));
      printf("%-28s %14.3f %18.3f %14.1f\n", k ? k : "-", num(x, "cpu_seconds"), num(x, "memory_gib_seconds"),
             num(x, "sandbox_seconds"));
      size_t j;
      json_t *p;
      json_array_foreach(json_object_get(x, "series"), j, p) {
        const char *t = json_string_value(json_object_get(p, "start"));
        printf("  %-26s %14.3f %18.3f %14.1f\n", t ? t : "-", num(p, "cpu_seconds"),
               num(p, "memory_gib_seconds"), num(p, "sandbox_seconds"));
      }
    }
  }
  json_decref(resp.json);
  return 0;
}

int cmd_metrics(int argc, char **argv) {
  struct usage_ctx u = {0};
  struct cli_args a;
  int r = cli_parse(argc, argv, usage_opts, 1, false, on_usage_opt, &u, &a);
  _cleanup_free_ char **pos = a.pos;
  free(a.rest);
  if (r == 1) {
    printf("usage: %s", metrics_usage);
    return 0;
  }
  if (r < 0 || a.npos != 1 || u.group || u.bucket)
    return cli_usage_error(metrics_usage, "%s",
                           r < 0 ? "" : "metrics takes one sandbox ID (and no --group-by or --bucket)");
  _cleanup_free_ char *id = cli_escape(pos[0]);
  char *path = xasprintf("/v1/sandboxes/%s/metrics", id);
  bool history = u.from || u.to || u.limit;
  add_query(&path, "from", u.from);
  add_query(&path, "to", u.to);
  add_query(&path, "limit", u.limit);
  struct cli_resp resp;
  r = cli_request("GET", path, NULL, &resp);
  free(path);
  if (r < 0)
    return EXIT_API;
  if (u.json || !history) {
    json_dumpf(resp.json, stdout, JSON_INDENT(2));
    printf("\n");
  } else {
    printf("%-24s %7s %5s %12s %12s %12s %12s %12s\n", "TIMESTAMP", "CPU%", "CPUS", "MEM_USED", "MEM_LIMIT",
           "DISK_USED", "NET_RX", "NET_TX");
    size_t i;
    json_t *x;
    json_array_foreach(json_object_get(resp.json, "samples"), i, x) {
      const char *t = json_string_value(json_object_get(x, "timestamp"));
      printf("%-24s %7.2f %5g %12lld %12lld %12lld %12lld %12lld\n", t ? t : "-", num(x, "cpu_used_pct"),
             num(x, "cpu_count"), (long long)json_integer_value(json_object_get(x, "memory_used_bytes")),
             (long long)json_integer_value(json_object_get(x, "memory_limit_bytes")),
             (long long)json_integer_value(json_object_get(x, "disk_used_bytes")),
             (long long)json_integer_value(json_object_get(x, "network_rx_bytes")),
             (long long)json_integer_value(json_object_get(x, "network_tx_bytes")));
    }
  }
  json_decref(resp.json);
  return 0;
}

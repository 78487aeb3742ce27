/* cmd_timetravel.c -- moat pause, resume, hibernate, wake, snapshot, snapshots, fork, rollback, explore */
#include <stdlib.h>
#include <string.h>

#include "../common/util.h"
#include "cli.h"

static const struct cli_opt no_opts[] = {{NULL, false, 0}};
static int no_opt(int id, const char *value, void *ctx) { return -1; }

/* POST /v1/sandboxes/ID/WHAT with body (borrowed, may be NULL: {}). 0 and *out (caller decrefs), or -1. */
static int post(const char *id, const char *what, json_t *body, json_t **out) {
  _cleanup_free_ char *eid = cli_escape(id);
  _cleanup_free_ char *path = xasprintf("/v1/sandboxes/%s/%s", eid, what);
  _cleanup_json_ json_t *empty = body ? NULL : json_object();
  struct cli_resp resp;
  if (cli_request("POST", path, body ? body : empty, &resp) < 0)
    return -1;
  if (out)
    *out = resp.json;
  else
    json_decref(resp.json);
  return 0;
}

/* moat pause|resume|hibernate|wake ID...: prints "ID STATE" per sandbox. */
static int transition(int argc, char **argv, const char *what) {
  char usage[64];
  snprintf(usage, sizeof(usage), "moat %s ID...\n", what);
  struct cli_args a;
  int r = cli_parse(argc, argv, no_opts, -1, false, no_opt, NULL, &a);
  _cleanup_free_ char **pos = a.pos;
  free(a.rest);
  if (r == 1) {
    printf("usage: %s", usage);
    return 0;
  }
  if (r < 0 || a.npos < 1)
    return cli_usage_error(usage, "%s", r < 0 ? "" : "give at least one sandbox id");
  int ret = 0;
  for (int i = 0; i < a.npos; i++) {
    _cleanup_json_ json_t *sb = NULL;
    if (post(pos[i], what, NULL, &sb) < 0) {
      fprintf(stderr, "moat: (while trying to %s %s)\n", what, pos[i]);
      ret = EXIT_API;
      continue;
    }
    printf("%s %s\n", pos[i], json_string_value(json_object_get(sb, "state")) ?: "?");
  }
  return ret;
}

int cmd_pause(int argc, char **argv) { return transition(argc, argv, "pause"); }
int cmd_resume(int argc, char **argv) { return transition(argc, argv, "resume"); }
int cmd_hibernate(int argc, char **argv) { return transition(argc, argv, "hibernate"); }
int cmd_wake(int argc, char **argv) { return transition(argc, argv, "wake"); }

/* ---- snapshots ---- */

enum { O_META = 1, O_SANDBOX, O_COUNT, O_KEEP, O_TIMEOUT, O_CHOOSE, O_JSON, O_DATABASES };

static int on_meta(int id, const char *value, void *ctx) {
  json_t *body = ctx;
  json_t *m = json_object_get(body, "metadata");
  if (!m) {
    m = json_object();
    json_object_set_new(body, "metadata", m);
  }
  return id == O_META ? cli_kv_set(m, value, "--meta") : -1;
}

int cmd_snapshot(int argc, char **argv) {
  static const char usage[] = "moat snapshot ID [--meta K=V]...\n"
                              "  prints the new snapshot's id; the sandbox keeps running\n";
  static const struct cli_opt opts[] = {{"meta", true, O_META}, {NULL, false, 0}};
  _cleanup_json_ json_t *body = json_object();
  struct cli_args a;
  int r = cli_parse(argc, argv, opts, 1, false, on_meta, body, &a);
  _cleanup_free_ char **pos = a.pos;
  free(a.rest);
  if (r == 1) {
    printf("usage: %s", usage);
    return 0;
  }
  if (r < 0 || a.npos != 1)
    return cli_usage_error(usage, "%s", r < 0 ? "" : "snapshot takes one sandbox id");
  _cleanup_json_ json_t *s = NULL;
  if (post(pos[0], "snapshots", body, &s) < 0)
    return EXIT_API;
  printf("%s\n", json_string_value(json_object_get(s, "id")) ?: "?");
  return 0;
}

static int on_sandbox(int id, const char *value, void *ctx) {
  if (id != O_SANDBOX)
    return -1;
  *(const char **)ctx = value;
  return 0;
}

static int snapshots_ls(int argc, char **argv) {
  static const char usage[] = "moat snapshots ls [--sandbox ID]\n";
  static const struct cli_opt opts[] = {{"sandbox", true, O_SANDBOX}, {NULL, false, 0}};
  const char *sb = NULL;
  struct cli_args a;
  int r = cli_parse(argc, argv, opts, 0, false, on_sandbox, &sb, &a);
  free(a.pos);
  free(a.rest);
  if (r == 1) {
    printf("usage: %s", usage);
    return 0;
  }
  if (r < 0)
    return cli_usage_error(usage, "%s", "");
  _cleanup_free_ char *q = sb ? cli_escape(sb) : NULL;
  _cleanup_free_ char *path = q ? xasprintf("/v1/snapshots?sandbox_id=%s", q) : xstrdup("/v1/snapshots");
  struct cli_resp resp;
  if (cli_request("GET", path, NULL, &resp) < 0)
    return EXIT_API;
  printf("%-22s  %-20s  %-24s  %12s  %12s\n", "SNAPSHOT", "SANDBOX", "CREATED", "MEMORY", "DISK");
  size_t i;
  json_t *s;
  json_array_foreach(json_object_get(resp.json, "snapshots"), i, s) {
    printf("%-22s  %-20s  %-24s  %12lld  %12lld\n", json_string_value(json_object_get(s, "id")) ?: "",
           json_string_value(json_object_get(s, "sandbox_id")) ?: "",
           json_string_value(json_object_get(s, "created_at")) ?: "",
           (long long)json_integer_value(json_object_get(s, "memory_bytes")),
           (long long)json_integer_value(json_object_get(s, "disk_bytes")));
  }
  json_decref(resp.json);
  return 0;
}

int cmd_snapshots(int argc, char **argv) {
  static const char usage[] = "moat snapshots [ls [--sandbox ID]] | get SID | rm SID...\n";
  if (argc < 2 || strcmp(argv[1], "ls") == 0)
    return snapshots_ls(argc < 2 ? argc : argc - 1, argc < 2 ? argv : argv + 1);
  if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
    printf("usage: %s", usage);
    return 0;
  }
  bool get = strcmp(argv[1], "get") == 0, rm = strcmp(argv[1], "rm") == 0;
  if (!get && !rm)
    return cli_usage_error(usage, "unknown snapshots subcommand '%s'", argv[1]);
  struct cli_args a;
  int r = cli_parse(argc - 1, argv + 1, no_opts, -1, false, no_opt, NULL, &a);
  _cleanup_free_ char **pos = a.pos;
  free(a.rest);
  if (r == 1) {
    printf("usage: %s", usage);
    return 0;
  }
  if (r < 0 || a.npos < 1 || (get && a.npos != 1))
    return cli_usage_error(usage, "%s", r < 0 ? "" : "give snapshot id(s)");
  int ret = 0;
  for (int i = 0; i < a.npos; i++) {
    _cleanup_free_ char *sid = cli_escape(pos[i]);
    _cleanup_free_ char *path = xasprintf("/v1/snapshots/%s", sid);
    struct cli_resp resp;
    if (cli_request(get ? "GET" : "DELETE", path, NULL, &resp) < 0) {
      ret = EXIT_API;
      continue;
    }
    if (get) {
      json_dumpf(resp.json, stdout, JSON_INDENT(2));
      fputc('\n', stdout);
    }
    json_decref(resp.json);
  }
  return ret;
}

/* ---- fork, rollback ---- */

struct fork_opts {
  long long count;
  const char *databases;
};

static int on_fork(int id, const char *value, void *ctx) {
  struct fork_opts *o = ctx;
  if (id == O_DATABASES) {
    o->databases = value;
    return 0;
  }
  return id == O_COUNT ? cli_parse_ll(value, "--count", &o->count) : -1;
}

int cmd_fork(int argc, char **argv) {
  static const char usage[] =
      "moat fork ID [--count N] [--databases branch]\n"
      "  N children (1..16, default 1) with the parent's memory, processes and files;\n"
      "  prints their ids, one a line; the parent keeps running\n"
      "  --databases branch: each child gets its own branch of every database attached to the parent\n";
  static const struct cli_opt opts[] = {
      {"count", true, O_COUNT}, {"databases", true, O_DATABASES}, {NULL, false, 0}};
  struct fork_opts o = {.count = 1};
  struct cli_args a;
  int r = cli_parse(argc, argv, opts, 1, false, on_fork, &o, &a);
  _cleanup_free_ char **pos = a.pos;
  free(a.rest);
  if (r == 1) {
    printf("usage: %s", usage);
    return 0;
  }
  if (r < 0 || a.npos != 1)
    return cli_usage_error(usage, "%s", r < 0 ? "" : "fork takes one sandbox id");
  _cleanup_json_ json_t *body = json_pack("{s:I, s:b}", "count", (json_int_t)o.count, "memory", 1);
  if (o.databases)
    json_object_set_new(body, "databases", json_string(o.databases));
  _cleanup_json_ json_t *out = NULL;
  if (post(pos[0], "fork", body, &out) < 0)
    return EXIT_API;
  size_t i;
  json_t *sb;
  json_array_foreach(json_object_get(out, "sandboxes"), i, sb)
      printf("%s\n", json_string_value(json_object_get(sb, "id")) ?: "?");
  return 0;
}

int cmd_rollback(int argc, char **argv) {
  static const char usage[] = "moat rollback ID SNAPSHOT_ID\n";
  struct cli_args a;
  int r = cli_parse(argc, argv, no_opts, 2, false, no_opt, NULL, &a);
  _cleanup_free_ char **pos = a.pos;
  free(a.rest);
  if (r == 1) {
    printf("usage: %s", usage);
    return 0;
  }
  if (r < 0 || a.npos != 2)
    return cli_usage_error(usage, "%s", r < 0 ? "" : "rollback takes a sandbox id and a snapshot id");
  _cleanup_json_ json_t *body = json_pack("{s:s}", "snapshot_id", pos[1]);
  _cleanup_json_ json_t *out = NULL;
  if (post(pos[0], "rollback", body, &out) < 0)
    return EXIT_API;
  printf("%s %s\n", pos[0], json_string_value(json_object_get(out, "state")) ?: "?");
  return 0;
}

/* ---- explore ---- */

struct explore_opts {
  const char *keep, *choose, *databases;
  long long timeout_ms;
};

static int on_explore(int id, const char *value, void *ctx) {
  struct explore_opts *o = ctx;
  switch (id) {
  case O_KEEP:
    o->keep = value;
    return 0;
  case O_TIMEOUT:
    return cli_parse_ll(value, "--timeout-ms", &o->timeout_ms);
  case O_CHOOSE:
    o->choose = value;
    return 0;
  case O_DATABASES:
    o->databases = value;
    return 0;
  }
  return -1;
}

int cmd_explore(int argc, char **argv) {
  static const char usage[] =
      "moat explore ID [--keep first_success|best] [--timeout-ms MS] [--databases branch] CMD...\n"
      "  forks ID once per CMD (1..16 shell commands), runs them concurrently and prints the outcomes as\n"
      "  JSON; first_success keeps the first branch to exit 0, best keeps all until you choose;\n"
      "  --databases branch gives each branch its own branch of every database attached to ID:\n"
      "moat explore ID --choose EXPLORE_ID BRANCH_ID\n";
  static const struct cli_opt opts[] = {{"keep", true, O_KEEP},
                                        {"timeout-ms", true, O_TIMEOUT},
                                        {"choose", true, O_CHOOSE},
                                        {"databases", true, O_DATABASES},
                                        {NULL, false, 0}};
  struct explore_opts o = {0};
  struct cli_args a;
  int r = cli_parse(argc, argv, opts, -1, false, on_explore, &o, &a);
  _cleanup_free_ char **pos = a.pos;
  free(a.rest);
  if (r == 1) {
    printf("usage: %s", usage);
    return 0;
  }
  if (r < 0 || a.npos < 2)
    return cli_usage_error(usage, "%s", r < 0 ? "" : "give a sandbox id and at least one command");
  _cleanup_json_ json_t *body = NULL;
  if (o.choose) {
    if (a.npos != 2 || o.databases)
      return cli_usage_error(usage,
                             "--choose takes the explore id and one branch sandbox id (no --databases)");
    body = json_pack("{s:{s:s, s:s}}", "choose", "explore_id", o.choose, "sandbox_id", pos[1]);
  } else {
    json_t *br = json_array();
    for (int i = 1; i < a.npos; i++) {
      json_t *b = json_pack("{s:s}", "cmd", pos[i]);
      if (o.timeout_ms > 0)
        json_object_set_new(b, "timeout_ms", json_integer(o.timeout_ms));
      json_array_append_new(br, b);
    }
    body = json_pack("{s:o, s:s}", "branches", br, "keep", o.keep ? o.keep : "first_success");
    if (o.databases)
      json_object_set_new(body, "databases", json_string(o.databases));
  }
  _cleanup_json_ json_t *out = NULL;
  if (post(pos[0], "explore", body, &out) < 0)
    return EXIT_API;
  json_dumpf(out, stdout, JSON_INDENT(2));
  fputc('\n', stdout);
  return 0;
}

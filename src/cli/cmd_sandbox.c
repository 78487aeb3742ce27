/* cmd_sandbox.c -- moat create, ls, get, rm */
#include <stdlib.h>
#include <string.h>

#include "../common/util.h"
#include "cli.h"

enum {
  O_TEMPLATE = 1,
  O_TTL,
  O_PERSISTENT,
  O_META,
  O_ENV,
  O_CPU,
  O_MEMORY,
  O_PIDS,
  O_DISK,
  O_FROM_SNAPSHOT,
  O_HIBERNATE_AFTER,
  O_VOLUME,
  O_DATABASE
};

const struct cli_opt cli_create_opts[] = {{"template", true, O_TEMPLATE},
                                          {"ttl", true, O_TTL},
                                          {"persistent", false, O_PERSISTENT},
                                          {"meta", true, O_META},
                                          {"env", true, O_ENV},
                                          {"cpu", true, O_CPU},
                                          {"memory", true, O_MEMORY},
                                          {"pids", true, O_PIDS},
                                          {"disk", true, O_DISK},
                                          {"from-snapshot", true, O_FROM_SNAPSHOT},
                                          {"hibernate-after", true, O_HIBERNATE_AFTER},
                                          {"volume", true, O_VOLUME},
                                          {"database", true, O_DATABASE},
                                          {NULL, false, 0}};
const size_t cli_create_nopts = sizeof(cli_create_opts) / sizeof(cli_create_opts[0]) - 1;

static json_t *object_field(json_t *body, const char *key) {
  json_t *o = json_object_get(body, key);
  if (!o) {
    o = json_object();
    json_object_set_new(body, key, o);
  }
  return o;
}

int cli_create_opt(int id, const char *value, struct create_opts *c) {
  long long n;
  double d;
  switch (id) {
  case O_TEMPLATE:
    json_object_set_new(c->body, "template", json_string(value));
    return 0;
  case O_TTL:
    if (cli_parse_ll(value, "--ttl", &n) < 0)
      return -1;
    json_object_set_new(c->body, "ttl_seconds", json_integer(n));
    return 0;
  case O_PERSISTENT:
    json_object_set_new(c->body, "persistent", json_true());
    return 0;
  case O_META:
    return cli_kv_set(object_field(c->body, "metadata"), value, "--meta");
  case O_ENV:
    return cli_kv_set(object_field(c->body, "env"), value, "--env");
  case O_CPU:
    if (cli_parse_double(value, "--cpu", &d) < 0)
      return -1;
    json_object_set_new(c->body, "cpu", json_real(d));
    return 0;
  case O_MEMORY:
  case O_PIDS:
  case O_DISK: {
    const char *flag = id == O_MEMORY ? "--memory" : id == O_PIDS ? "--pids" : "--disk";
    const char *field = id == O_MEMORY ? "memory_mb" : id == O_PIDS ? "pids" : "disk_mb";
    if (cli_parse_ll(value, flag, &n) < 0)
      return -1;
    json_object_set_new(c->body, field, json_integer(n));
    return 0;
  }
  case O_FROM_SNAPSHOT:
    json_object_set_new(c->body, "from_snapshot", json_string(value));
    return 0;
  case O_HIBERNATE_AFTER:
    if (cli_parse_ll(value, "--hibernate-after", &n) < 0)
      return -1;
    json_object_set_new(c->body, "idle", json_pack("{s:I}", "hibernate_after_seconds", (json_int_t)n));
    return 0;
  case O_VOLUME: {
    /* NAME:PATH or NAME:PATH:ro (a path holding ':' is not expressible here; the API takes it) */
    const char *colon = strchr(value, ':');
    if (!colon || colon == value || !colon[1]) {
      cli_errorf("--volume '%s' is not NAME:PATH[:ro]", value);
      return -1;
    }
    _cleanup_free_ char *name = xstrndup(value, (size_t)(colon - value));
    _cleanup_free_ char *path = xstrdup(colon + 1);
    bool ro = false;
    size_t pl = strlen(path);
    if (pl > 3 && strcmp(path + pl - 3, ":ro") == 0) {
      path[pl - 3] = '\0';
      ro = true;
    } else if (pl > 3 && strcmp(path + pl - 3, ":rw") == 0) {
      path[pl - 3] = '\0';
    }
    json_t *arr = json_object_get(c->body, "volumes");
    if (!arr) {
      arr = json_array();
      json_object_set_new(c->body, "volumes", arr);
    }
    json_array_append_new(arr, json_pack("{s:s, s:s, s:b}", "name", name, "path", path, "read_only", ro));
    return 0;
  }
  case O_DATABASE: {
    /* ID or ID:ENV; without ENV the API's default (DATABASE_URL) applies */
    const char *colon = strchr(value, ':');
    if (colon == value || (colon && !colon[1])) {
      cli_errorf("--database '%s' is not ID[:ENV]", value);
      return -1;
    }
    _cleanup_free_ char *db = colon ? xstrndup(value, (size_t)(colon - value)) : xstrdup(value);
    json_t *arr = json_object_get(c->body, "databases");
    if (!arr) {
      arr = json_array();
      json_object_set_new(c->body, "databases", arr);
    }
    json_t *entry = json_pack("{s:s}", "id", db);
    if (colon)
      json_object_set_new(entry, "env", json_string(colon + 1));
    json_array_append_new(arr, entry);
    return 0;
  }
  }
  return -1;
}

static int on_create_opt(int id, const char *value, void *ctx) { return cli_create_opt(id, value, ctx); }

static const char create_usage[] = "moat create [OPTIONS]\n" CREATE_USAGE;

int cmd_create(int argc, char **argv) {
  struct create_opts c = {.body = json_object()};
  struct cli_args a;
  int r = cli_parse(argc, argv, cli_create_opts, 0, false, on_create_opt, &c, &a);
  free(a.pos);
  free(a.rest);
  if (r != 0) {
    json_decref(c.body);
    if (r == 1) {
      printf("usage: %s", create_usage);
      return 0;
    }
    fprintf(stderr, "usage: %s", create_usage);
    return EXIT_USAGE;
  }
  struct cli_resp resp;
  r = cli_request("POST", "/v1/sandboxes", c.body, &resp);
  json_decref(c.body);
  if (r < 0)
    return EXIT_API;
  const char *id = json_string_value(json_object_get(resp.json, "id"));
  if (id)
    printf("%s\n", id);
  json_decref(resp.json);
  if (!id) {
    cli_errorf("the answer has no sandbox id");
    return EXIT_API;
  }
  return 0;
}

/* ---- ls ---- */

enum { L_STATE = 1, L_META, L_JSON, L_LIMIT, L_CURSOR, L_ALL, L_TEMPLATE };
static const struct cli_opt ls_opts[] = {{"state", true, L_STATE},       {"meta", true, L_META},
                                         {"json", false, L_JSON},        {"limit", true, L_LIMIT},
                                         {"cursor", true, L_CURSOR},     {"all", false, L_ALL},
                                         {"template", true, L_TEMPLATE}, {NULL, false, 0}};
static const char ls_usage[] =
    "moat ls [--state S] [--template T] [--meta K=V]... [--limit N] [--cursor C] [--all] [--json]\n"
    "  the org's sandboxes, oldest first. Without --limit: all of them (read 1000 a request);\n"
    "  with --limit N (1..1000): one page of N, then \"next: CURSOR\" on stderr when there are more\n"
    "  (--cursor CURSOR shows the following page); --all follows the pages to the end\n";

#define LS_PAGE 1000

struct ls_ctx {
  char *query; /* grows: "?a=b&c=d" */
  bool json, all;
  const char *limit, *cursor;
};

static void query_add(struct ls_ctx *l, const char *key, const char *value) {
  _cleanup_free_ char *k = cli_escape(key);
  _cleanup_free_ char *v = cli_escape(value);
  char *q = xasprintf("%s%c%s=%s", l->query ? l->query : "", l->query ? '&' : '?', k, v);
  free(l->query);
  l->query = q;
}

static int on_ls_opt(int id, const char *value, void *ctx) {
  struct ls_ctx *l = ctx;
  if (id == L_STATE) {
    query_add(l, "state", value);
  } else if (id == L_TEMPLATE) {
    query_add(l, "template", value);
  } else if (id == L_META) {
    const char *eq = strchr(value, '=');
    if (!eq || eq == value) {
      cli_errorf("--meta '%s' is not KEY=VALUE", value);
      return -1;
    }
    _cleanup_free_ char *key = xasprintf("metadata.%.*s", (int)(eq - value), value);
    query_add(l, key, eq + 1);
  } else if (id == L_LIMIT) {
    char *end = NULL;
    long n = strtol(value, &end, 10);
    if (value[0] < '0' || value[0] > '9' || *end || n < 1 || n > LS_PAGE) {
      cli_errorf("--limit '%s' is not a number from 1 to %d", value, LS_PAGE);
      return -1;
    }
    l->limit = value;
  } else if (id == L_CURSOR) {
    l->cursor = value;
  } else if (id == L_ALL) {
    l->all = true;
  } else {
    l->json = true;
  }
  return 0;
}

static void print_meta(json_t *meta) {
  const char *k;
  json_t *v;
  bool first = true;
  json_object_foreach(meta, k, v) {
    printf("%s%s=%s", first ? "" : ",", k, json_string_value(v) ? json_string_value(v) : "");
    first = false;
  }
  if (first)
    fputs("-", stdout);
}

static const char *str_or_dash(json_t *o, const char *key) {
  const char *s = json_string_value(json_object_get(o, key));
  return s && *s ? s : "-";
}

static void print_rows(json_t *list) {
  size_t i;
  json_t *s;
  json_array_foreach(list, i, s) {
    printf("%-26s %-16s %-10s %-24s %-24s ", str_or_dash(s, "id"), str_or_dash(s, "template"),
           str_or_dash(s, "state"), str_or_dash(s, "created_at"), str_or_dash(s, "expires_at"));
    print_meta(json_object_get(s, "metadata"));
    fputc('\n', stdout);
  }
}

/* Reads the pages of the list from l->cursor (to the end when walk) and prints them: the table as each
 * page comes, or with --json one object {sandboxes, next, total} once read. 0, or an exit status. */
static int ls_pages(struct ls_ctx *l, const char *limit, bool walk) {
  _cleanup_free_ char *cursor = l->cursor ? xstrdup(l->cursor) : NULL;
  json_t *all = json_array();
  json_t *total = NULL;
  if (!l->json)
    printf("%-26s %-16s %-10s %-24s %-24s %s\n", "ID", "TEMPLATE", "STATE", "CREATED", "EXPIRES", "METADATA");
  for (;;) {
    _cleanup_free_ char *lim = cli_escape(limit);
    _cleanup_free_ char *cur = cursor ? cli_escape(cursor) : NULL;
    _cleanup_free_ char *path = xasprintf("/v1/sandboxes%s%climit=%s%s%s", l->query ? l->query : "",
                                          l->query ? '&' : '?', lim, cur ? "&cursor=" : "", cur ? cur : "");
    struct cli_resp resp;
    if (cli_request("GET", path, NULL, &resp) < 0) {
      json_decref(all);
      json_decref(total);
      return EXIT_API;
    }
    json_t *list = json_object_get(resp.json, "sandboxes");
    if (l->json)
      json_array_extend(all, list);
    else
      print_rows(list);
    fflush(stdout);
    json_decref(total);
    total = json_incref(json_object_get(resp.json, "total"));
    const char *next = json_string_value(json_object_get(resp.json, "next"));
    free(cursor);
    cursor = next ? xstrdup(next) : NULL;
    json_decref(resp.json);
    if (!cursor || !walk)
      break;
  }
  if (l->json) {
    json_t *o =
        json_pack("{s:o, s:s?, s:o}", "sandboxes", all, "next", cursor, "total", total ? total : json_null());
    json_dumpf(o, stdout, JSON_INDENT(2));
    fputc('\n', stdout);
    json_decref(o);
  } else {
    json_decref(all);
    json_decref(total);
  }
  if (cursor)
    fprintf(stderr, "next: %s\n", cursor);
  return 0;
}

int cmd_ls(int argc, char **argv) {
  struct ls_ctx l = {0};
  struct cli_args a;
  int r = cli_parse(argc, argv, ls_opts, 0, false, on_ls_opt, &l, &a);
  free(a.pos);
  free(a.rest);
  if (r != 0) {
    free(l.query);
    if (r == 1) {
      printf("usage: %s", ls_usage);
      return 0;
    }
    fprintf(stderr, "usage: %s", ls_usage);
    return EXIT_USAGE;
  }
  char page[16];
  snprintf(page, sizeof(page), "%d", LS_PAGE);
  int ret = ls_pages(&l, l.limit ? l.limit : page, l.all || !l.limit);
  free(l.query);
  return ret;
}

/* ---- get, rm ---- */

static const struct cli_opt no_opts[] = {{NULL, false, 0}};
static int no_opt(int id, const char *value, void *ctx) { return -1; }

int cmd_get(int argc, char **argv) {
  static const char usage[] = "moat get ID\n";
  struct cli_args a;
  int r = cli_parse(argc, argv, no_opts, 1, false, no_opt, NULL, &a);
  _cleanup_free_ char **pos = a.pos;
  free(a.rest);
  if (r == 1) {
    printf("usage: %s", usage);
    return 0;
  }
  if (r < 0 || a.npos != 1)
    return cli_usage_error(usage, "%s", r < 0 ? "" : "get takes one sandbox id");
  _cleanup_free_ char *id = cli_escape(pos[0]);
  _cleanup_free_ char *path = xasprintf("/v1/sandboxes/%s", id);
  struct cli_resp resp;
  if (cli_request("GET", path, NULL, &resp) < 0)
    return EXIT_API;
  json_dumpf(resp.json, stdout, JSON_INDENT(2));
  fputc('\n', stdout);
  json_decref(resp.json);
  return 0;
}

int cmd_rm(int argc, char **argv) {
  static const char usage[] = "moat rm ID...\n";
  struct cli_args a;
  int r = cli_parse(argc, argv, no_opts, -1, false, no_opt, NULL, &a);
  _cleanup_free_ char **pos = a.pos;
  free(a.rest);
  if (r == 1) {
    printf("usage: %s", usage);
    return 0;
  }
  if (r < 0 || a.npos < 1)
    return cli_usage_error(usage, "%s", r < 0 ? "" : "rm takes at least one sandbox id");
  int ret = 0;
  for (int i = 0; i < a.npos; i++) {
    _cleanup_free_ char *id = cli_escape(pos[i]);
    _cleanup_free_ char *path = xasprintf("/v1/sandboxes/%s", id);
    struct cli_resp resp;
    if (cli_request("DELETE", path, NULL, &resp) < 0) {
      fprintf(stderr, "moat: (while removing %s)\n", pos[i]);
      ret = EXIT_API;
      continue;
    }
    json_decref(resp.json);
  }
  return ret;
}

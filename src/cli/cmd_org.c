/* cmd_org.c -- orgs and their quotas, with the platform admin key (MOAT_API_KEY):
 * moat org create|ls|get|rm, moat quota get|set, moat usage now. */
#include <stdlib.h>
#include <string.h>

#include "../common/util.h"
#include "cli.h"

static const char org_usage[] =
    "moat org create NAME        make an org; prints its first admin key (shown this once)\n"
    "moat org ls [--json]        list orgs\n"
    "moat org get ID             show an org as JSON\n"
    "moat org rm ID... [--force] delete orgs (--force: kill and delete what they have)\n"
    "(these need the platform admin key: moatd key create --admin)\n";

static const char quota_usage[] =
    "moat quota get ORG                    an org's quotas as JSON (null: unlimited)\n"
    "moat quota set ORG [NAME=VALUE...]    replace them: max_sandboxes=50 creates_per_hour=500 ...\n"
    "                                      (VALUE null or absent: unlimited; platform admin key)\n";

static const char usage_usage[] = "moat usage now ORG   the org's use against each quota now\n";

enum { O_FORCE = 1, O_JSON };
static const struct cli_opt org_opts[] = {
    {"force", false, O_FORCE}, {"json", false, O_JSON}, {NULL, false, 0}};

struct org_ctx {
  bool force, json;
};

static int on_org_opt(int id, const char *value, void *ctx) {
  struct org_ctx *o = ctx;
  if (id == O_FORCE)
    o->force = true;
  else
    o->json = true;
  return 0;
}

static void print_json(json_t *j) {
  json_dumpf(j, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
  printf("\n");
}

static char *org_path(const char *id, const char *tail) {
  _cleanup_free_ char *e = cli_escape(id);
  return xasprintf("/v1/orgs/%s%s", e, tail);
}

static int org_ls(bool json) {
  _cleanup_json_ json_t *all = json_array();
  _cleanup_free_ char *cursor = NULL;
  for (;;) {
    _cleanup_free_ char *esc = cursor ? cli_escape(cursor) : NULL;
    _cleanup_free_ char *path = esc ? xasprintf("/v1/orgs?cursor=%s", esc) : xstrdup("/v1/orgs");
    struct cli_resp resp;
    if (cli_request("GET", path, NULL, &resp) < 0)
      return EXIT_API;
    json_array_extend(all, json_object_get(resp.json, "orgs"));
    const char *next = json_string_value(json_object_get(resp.json, "next"));
    free(cursor);
    cursor = next ? xstrdup(next) : NULL;
    json_decref(resp.json);
    if (!cursor)
      break;
  }
  if (json) {
    print_json(all);
    return 0;
  }
  printf("%-32s %-9s %s\n", "ID", "STATE", "CREATED");
  size_t i;
  json_t *o;
  json_array_foreach(all, i, o) {
    const char *id = json_string_value(json_object_get(o, "id"));
    const char *st = json_string_value(json_object_get(o, "state"));
    const char *at = json_string_value(json_object_get(o, "created_at"));
    printf("%-32s %-9s %s\n", id ? id : "-", st ? st : "-", at ? at : "-");
  }
  return 0;
}

int cmd_org(int argc, char **argv) {
  struct org_ctx o = {0};
  struct cli_args a;
  int r = cli_parse(argc, argv, org_opts, 64, false, on_org_opt, &o, &a);
  _cleanup_free_ char **pos = a.pos;
  free(a.rest);
  if (r == 1) {
    printf("usage: %s", org_usage);
    return 0;
  }
  if (r < 0 || a.npos < 1)
    return cli_usage_error(org_usage, "%s", r < 0 ? "" : "org needs a subcommand");
  struct cli_resp resp;
  if (strcmp(pos[0], "create") == 0) {
    if (a.npos != 2)
      return cli_usage_error(org_usage, "org create takes one NAME");
    json_t *body = json_pack("{s:s}", "name", pos[1]);
    r = cli_request("POST", "/v1/orgs", body, &resp);
    json_decref(body);
    if (r < 0)
      return EXIT_API;
    json_t *k = json_object_get(resp.json, "admin_key");
    if (o.json)
      print_json(resp.json);
    else
      printf("%s\n", json_string_value(json_object_get(k, "key")));
    fprintf(stderr, "moat: org %s made; the line above is its admin key (%s), shown this once\n",
            json_string_value(json_object_get(resp.json, "id")), json_string_value(json_object_get(k, "id")));
    json_decref(resp.json);
    return 0;
  }
  if (strcmp(pos[0], "ls") == 0) {
    if (a.npos != 1)
      return cli_usage_error(org_usage, "org ls takes no arguments");
    return org_ls(o.json);
  }
  if (strcmp(pos[0], "get") == 0) {
    if (a.npos != 2)
      return cli_usage_error(org_usage, "org get takes one ID");
    _cleanup_free_ char *path = org_path(pos[1], "");
    if (cli_request("GET", path, NULL, &resp) < 0)
      return EXIT_API;
    print_json(resp.json);
    json_decref(resp.json);
    return 0;
  }
  if (strcmp(pos[0], "rm") == 0) {
    if (a.npos < 2)
      return cli_usage_error(org_usage, "org rm takes one ID or more");
    int ret = 0;
    for (int i = 1; i < a.npos; i++) {
      _cleanup_free_ char *path = org_path(pos[i], o.force ? "?force=true" : "");
      if (cli_request("DELETE", path, NULL, &resp) < 0) {
        ret = EXIT_API;
        continue;
      }
      json_decref(resp.json);
    }
    return ret;
  }
  return cli_usage_error(org_usage, "unknown org subcommand '%s'", pos[0]);
}

int cmd_quota(int argc, char **argv) {
  struct org_ctx o = {0};
  struct cli_args a;
  int r = cli_parse(argc, argv, org_opts, 64, false, on_org_opt, &o, &a);
  _cleanup_free_ char **pos = a.pos;
  free(a.rest);
  if (r == 1) {
    printf("usage: %s", quota_usage);
    return 0;
  }
  if (r < 0 || a.npos < 2)
    return cli_usage_error(quota_usage, "%s", r < 0 ? "" : "quota needs a subcommand and an ORG");
  struct cli_resp resp;
  _cleanup_free_ char *path = org_path(pos[1], "/quotas");
  if (strcmp(pos[0], "get") == 0) {
    if (a.npos != 2)
      return cli_usage_error(quota_usage, "quota get takes one ORG");
    if (cli_request("GET", path, NULL, &resp) < 0)
      return EXIT_API;
  } else if (strcmp(pos[0], "set") == 0) {
    _cleanup_json_ json_t *body = json_object();
    for (int i = 2; i < a.npos; i++) {
      const char *eq = strchr(pos[i], '=');
      if (!eq || eq == pos[i])
        return cli_usage_error(quota_usage, "'%s' is not NAME=VALUE", pos[i]);
      _cleanup_free_ char *name = xstrndup(pos[i], (size_t)(eq - pos[i]));
      long long n;
      if (strcmp(eq + 1, "null") == 0 || strcmp(eq + 1, "unlimited") == 0 || !eq[1])
        json_object_set_new(body, name, json_null());
      else if (cli_parse_ll(eq + 1, name, &n) < 0)
        return EXIT_USAGE;
      else
        json_object_set_new(body, name, json_integer(n));
    }
    if (cli_request("PUT", path, body, &resp) < 0)
      return EXIT_API;
  } else {
    return cli_usage_error(quota_usage, "unknown quota subcommand '%s'", pos[0]);
  }
  print_json(resp.json);
  json_decref(resp.json);
  return 0;
}

int cmd_usage_now(int argc, char **argv) {
  struct org_ctx o = {0};
  struct cli_args a;
  int r = cli_parse(argc, argv, org_opts, 2, false, on_org_opt, &o, &a);
  _cleanup_free_ char **pos = a.pos;
  free(a.rest);
  if (r == 1) {
    printf("usage: %s", usage_usage);
    return 0;
  }
  if (r < 0 || a.npos != 2 || strcmp(pos[0], "now") != 0)
    return cli_usage_error(usage_usage, "%s", r < 0 ? "" : "usage now takes one ORG");
  _cleanup_free_ char *path = org_path(pos[1], "/usage/now");
  struct cli_resp resp;
  if (cli_request("GET", path, NULL, &resp) < 0)
    return EXIT_API;
  if (o.json) {
    print_json(json_object_get(resp.json, "usage"));
  } else {
    printf("%-20s %20s %20s\n", "QUOTA", "USE", "LIMIT");
    const char *k;
    json_t *v;
    json_object_foreach(json_object_get(resp.json, "usage"), k, v) {
      json_t *lim = json_object_get(v, "limit");
      char lb[32];
      if (json_is_integer(lim))
        snprintf(lb, sizeof(lb), "%lld", (long long)json_integer_value(lim));
      else
        snprintf(lb, sizeof(lb), "unlimited");
      printf("%-20s %20lld %20s\n", k, (long long)json_integer_value(json_object_get(v, "use")), lb);
    }
  }
  json_decref(resp.json);
  return 0;
}

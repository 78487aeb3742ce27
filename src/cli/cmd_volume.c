/* cmd_volume.c -- moat volume create NAME --size MB, moat volume ls, moat volume rm NAME... */
#include <stdlib.h>
#include <string.h>

#include "../common/util.h"
#include "cli.h"

static const char volume_usage[] =
    "moat volume create NAME --size MB   make a volume of MB MiB (a hard limit)\n"
    "moat volume ls [--json]            list volumes and who mounts them\n"
    "moat volume rm NAME...             delete volumes and their data\n";

enum { V_SIZE = 1, V_JSON };
static const struct cli_opt volume_opts[] = {
    {"size", true, V_SIZE}, {"json", false, V_JSON}, {NULL, false, 0}};

struct volume_ctx {
  long long size;
  bool has_size, json;
};

static int on_volume_opt(int id, const char *value, void *ctx) {
  struct volume_ctx *v = ctx;
  if (id == V_SIZE) {
    v->has_size = true;
    return cli_parse_ll(value, "--size", &v->size);
  }
  v->json = true;
  return 0;
}

static void print_row(json_t *v) {
  const char *name = json_string_value(json_object_get(v, "name"));
  json_int_t size = json_integer_value(json_object_get(v, "size_mb"));
  json_int_t used = json_integer_value(json_object_get(v, "used_bytes"));
  printf("%-24s %8lldM %9.1fM  ", name ? name : "-", (long long)size, (double)used / (1024.0 * 1024.0));
  size_t i;
  json_t *a;
  bool any = false;
  json_array_foreach(json_object_get(v, "attached"), i, a) {
    const char *sb = json_string_value(json_object_get(a, "sandbox"));
    const char *path = json_string_value(json_object_get(a, "path"));
    printf("%s%s:%s%s", any ? "," : "", sb ? sb : "?", path ? path : "?",
           json_is_true(json_object_get(a, "read_only")) ? ":ro" : "");
    any = true;
  }
  printf("%s\n", any ? "" : "-");
}

int cmd_volume(int argc, char **argv) {
  static const char *const extra[] = {"get", "read", "write", "rmfile"};
  for (size_t i = 0; argc >= 2 && i < sizeof(extra) / sizeof(extra[0]); i++)
    if (strcmp(argv[1], extra[i]) == 0)
      return cli_volume_extra(argc, argv);
  struct volume_ctx v = {0};
  struct cli_args a;
  int r = cli_parse(argc, argv, volume_opts, 64, false, on_volume_opt, &v, &a);
  _cleanup_free_ char **pos = a.pos;
  free(a.rest);
  if (r == 1) {
    printf("usage: %s%s", volume_usage, cli_volume_extra_usage);
    return 0;
  }
  if (r < 0 || a.npos < 1)
    return cli_usage_error(volume_usage, "%s", r < 0 ? "" : "volume needs a subcommand");
  struct cli_resp resp;
  if (strcmp(pos[0], "create") == 0) {
    if (a.npos != 2 || !v.has_size)
      return cli_usage_error(volume_usage, "volume create takes one NAME and --size MB");
    json_t *body = json_pack("{s:s, s:I}", "name", pos[1], "size_mb", (json_int_t)v.size);
    r = cli_request("POST", "/v1/volumes", body, &resp);
    json_decref(body);
    if (r < 0)
      return EXIT_API;
    printf("%s\n", json_string_value(json_object_get(resp.json, "name")));
    json_decref(resp.json);
    return 0;
  }
  if (strcmp(pos[0], "ls") == 0) {
    if (a.npos != 1)
      return cli_usage_error(volume_usage, "volume ls takes no arguments");
    if (cli_request("GET", "/v1/volumes", NULL, &resp) < 0)
      return EXIT_API;
    if (v.json) {
      json_dumpf(json_object_get(resp.json, "volumes"), stdout, JSON_INDENT(2));
      printf("\n");
    } else {
      printf("%-24s %9s %10s  %s\n", "NAME", "SIZE", "USED", "ATTACHED");
      size_t i;
      json_t *x;
      json_array_foreach(json_object_get(resp.json, "volumes"), i, x) print_row(x);
    }
    json_decref(resp.json);
    return 0;
  }
  if (strcmp(pos[0], "rm") == 0) {
    if (a.npos < 2)
      return cli_usage_error(volume_usage, "volume rm takes one NAME or more");
    int ret = 0;
    for (int i = 1; i < a.npos; i++) {
      _cleanup_free_ char *name = cli_escape(pos[i]);
      _cleanup_free_ char *path = xasprintf("/v1/volumes/%s", name);
      if (cli_request("DELETE", path, NULL, &resp) < 0) {
        ret = EXIT_API;
        continue;
      }
      json_decref(resp.json);
    }
    return ret;
  }
  return cli_usage_error(volume_usage, "unknown volume subcommand '%s'", pos[0]);
}

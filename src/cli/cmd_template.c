/* cmd_template.c -- moat template build NAME, moat template ls */
#include <stdlib.h>
#include <string.h>

#include "../common/util.h"
#include "cli.h"

static const char template_usage[] =
    "moat template build NAME   build (or rebuild) a template; waits for it\n"
    "moat template ls           list templates and their state\n";

static void print_header(void) {
  printf("%-20s %-9s %-10s %-24s %s\n", "NAME", "STATE", "SIZE", "BUILT", "ERROR");
}

static void print_row(json_t *t) {
  const char *name = json_string_value(json_object_get(t, "name"));
  const char *state = json_string_value(json_object_get(t, "state"));
  json_t *size = json_object_get(t, "size_bytes");
  json_t *built = json_object_get(t, "built_at");
  const char *err = json_string_value(json_object_get(t, "error"));
  char sizebuf[32] = "-";
  if (json_is_integer(size) && json_integer_value(size) > 0)
    snprintf(sizebuf, sizeof(sizebuf), "%.1fM", (double)json_integer_value(size) / (1024.0 * 1024.0));
  char builtbuf[64] = "-";
  if (json_is_string(built))
    snprintf(builtbuf, sizeof(builtbuf), "%s", json_string_value(built));
  else if (json_is_integer(built) && json_integer_value(built) > 0)
    snprintf(builtbuf, sizeof(builtbuf), "%lld", (long long)json_integer_value(built));
  printf("%-20s %-9s %-10s %-24s %s\n", name ? name : "-", state ? state : "-", sizebuf, builtbuf,
         err ? err : "");
}

static const struct cli_opt no_opts[] = {{NULL, false, 0}};
static int no_opt(int id, const char *value, void *ctx) { return -1; }

int cmd_template(int argc, char **argv) {
  struct cli_args a;
  int r = cli_parse(argc, argv, no_opts, 2, false, no_opt, NULL, &a);
  _cleanup_free_ char **pos = a.pos;
  free(a.rest);
  if (r == 1) {
    printf("usage: %s", template_usage);
    return 0;
  }
  if (r < 0 || a.npos < 1)
    return cli_usage_error(template_usage, "%s", r < 0 ? "" : "template needs a subcommand");
  struct cli_resp resp;
  if (strcmp(pos[0], "ls") == 0) {
    if (a.npos != 1)
      return cli_usage_error(template_usage, "template ls takes no arguments");
    if (cli_request("GET", "/v1/templates", NULL, &resp) < 0)
      return EXIT_API;
    print_header();
    size_t i;
    json_t *t;
    json_array_foreach(json_object_get(resp.json, "templates"), i, t) print_row(t);
    json_decref(resp.json);
    return 0;
  }
  if (strcmp(pos[0], "build") == 0) {
    if (a.npos != 2)
      return cli_usage_error(template_usage, "template build takes one NAME");
    fprintf(stderr, "moat: building template '%s' (waits for the build; progress in moatd's log)\n", pos[1]);
    _cleanup_free_ char *name = cli_escape(pos[1]);
    _cleanup_free_ char *path = xasprintf("/v1/templates/%s/build", name);
    if (cli_request("POST", path, NULL, &resp) < 0)
      return EXIT_API;
    print_header();
    print_row(resp.json);
    json_decref(resp.json);
    return 0;
  }
  return cli_usage_error(template_usage, "unknown template subcommand '%s'", pos[0]);
}

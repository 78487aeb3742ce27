/* cmd_context.c -- moat context create|ls|run|restart|rm: a sandbox's code contexts (a Python, Node
 * or bash interpreter whose state lasts from one run to the next) */
#include <stdlib.h>
#include <string.h>

#include "../common/util.h"
#include "cli.h"

static const char context_usage[] =
    "moat context create ID [--language python|node|bash] [--cwd DIR]   start one, print its id\n"
    "moat context ls ID                       the sandbox's contexts (JSON)\n"
    "moat context run ID CID CODE [--timeout S]\n"
    "                                         run CODE (- reads it from stdin) in context CID: its\n"
    "                                         output, the last value; exit 1 when the code raised\n"
    "moat context restart ID CID              a fresh interpreter, the same id\n"
    "moat context rm ID CID...                stop contexts\n";

enum { C_LANGUAGE = 1, C_CWD, C_TIMEOUT };
static const struct cli_opt context_opts[] = {
    {"language", true, C_LANGUAGE}, {"cwd", true, C_CWD}, {"timeout", true, C_TIMEOUT}, {NULL, false, 0}};
struct context_ctx {
  const char *language, *cwd;
  double timeout;
  bool has_timeout;
};
static int on_context_opt(int id, const char *value, void *ctx) {
  struct context_ctx *c = ctx;
  if (id == C_LANGUAGE) {
    if (strcmp(value, "python") != 0 && strcmp(value, "node") != 0 && strcmp(value, "bash") != 0) {
      cli_errorf("--language takes python, node or bash, got '%s'", value);
      return -1;
    }
    c->language = value;
    return 0;
  }
  if (id == C_CWD) {
    c->cwd = value;
    return 0;
  }
  c->has_timeout = true;
  if (cli_parse_double(value, "--timeout", &c->timeout) < 0)
    return -1;
  if (c->timeout <= 0 || c->timeout > 86400) {
    cli_errorf("--timeout must be in (0, 86400] seconds");
    return -1;
  }
  return 0;
}

/* Reads all of stdin into a NUL-terminated string; NULL (printed) on a read error. */
static char *read_stdin(void) {
  size_t cap = 4096, len = 0;
  char *buf = xmalloc(cap);
  for (;;) {
    if (len + 1 >= cap) {
      cap *= 2;
      buf = xrealloc(buf, cap);
    }
    size_t n = fread(buf + len, 1, cap - len - 1, stdin);
    len += n;
    if (n == 0) {
      if (ferror(stdin)) {
        free(buf);
        cli_errorf("reading the code from stdin failed");
        return NULL;
      }
      break;
    }
  }
  buf[len] = '\0';
  return buf;
}

int cmd_context(int argc, char **argv) {
  struct context_ctx c = {0};
  struct cli_args a;
  int r = cli_parse(argc, argv, context_opts, 64, false, on_context_opt, &c, &a);
  _cleanup_free_ char **pos = a.pos;
  free(a.rest);
  if (r == 1) {
    printf("usage: %s", context_usage);
    return 0;
  }
  if (r < 0 || a.npos < 2)
    return cli_usage_error(context_usage, "%s", r < 0 ? "" : "context needs a subcommand and a sandbox ID");
  const char *sub = pos[0];
  bool create = strcmp(sub, "create") == 0, run = strcmp(sub, "run") == 0;
  if (!create && (c.language || c.cwd))
    return cli_usage_error(context_usage, "--language and --cwd go with context create");
  if (!run && c.has_timeout)
    return cli_usage_error(context_usage, "--timeout goes with context run");
  _cleanup_free_ char *eid = cli_escape(pos[1]);
  _cleanup_free_ char *base = xasprintf("/v1/sandboxes/%s/contexts", eid);
  struct cli_resp resp;
  if (create) {
    if (a.npos != 2)
      return cli_usage_error(context_usage, "context create takes one sandbox ID");
    _cleanup_json_ json_t *body = json_object();
    if (c.language)
      json_object_set_new(body, "language", json_string(c.language));
    if (c.cwd)
      json_object_set_new(body, "cwd", json_string(c.cwd));
    if (cli_request("POST", base, body, &resp) < 0)
      return EXIT_API;
    const char *id = json_string_value(json_object_get(resp.json, "id"));
    r = id ? 0 : EXIT_API;
    if (id)
      printf("%s\n", id);
    else
      cli_errorf("the answer has no context id");
    json_decref(resp.json);
    return r;
  }
  if (strcmp(sub, "ls") == 0) {
    if (a.npos != 2)
      return cli_usage_error(context_usage, "context ls takes one sandbox ID");
    if (cli_request("GET", base, NULL, &resp) < 0)
      return EXIT_API;
    r = cli_print_json(json_object_get(resp.json, "contexts")) < 0 ? EXIT_API : 0;
    json_decref(resp.json);
    return r;
  }
  if (run) {
    if (a.npos != 4)
      return cli_usage_error(context_usage, "context run takes ID, CID and CODE");
    _cleanup_free_ char *stdin_code = strcmp(pos[3], "-") == 0 ? read_stdin() : NULL;
    if (strcmp(pos[3], "-") == 0 && !stdin_code)
      return EXIT_API;
    _cleanup_free_ char *ecid = cli_escape(pos[2]);
    _cleanup_free_ char *path = xasprintf("%s/%s/run", base, ecid);
    _cleanup_json_ json_t *body = json_pack("{s:s}", "code", stdin_code ? stdin_code : pos[3]);
    if (c.has_timeout)
      json_object_set_new(body, "timeout_ms", json_integer((json_int_t)(c.timeout * 1000)));
    cli_trap_signals();
    if (cli_request("POST", path, body, &resp) < 0)
      return cli_interrupted ? 128 + cli_interrupted : EXIT_API;
    r = cli_print_run(resp.json);
    json_decref(resp.json);
    return r;
  }
  bool restart = strcmp(sub, "restart") == 0;
  if (!restart && strcmp(sub, "rm") != 0)
    return cli_usage_error(context_usage, "unknown context subcommand '%s'", sub);
  if (restart ? a.npos != 3 : a.npos < 3)
    return cli_usage_error(context_usage,
                           restart ? "context restart takes ID and CID" : "context rm takes ID and CID...");
  int ret = 0;
  for (int i = 2; i < a.npos; i++) {
    _cleanup_free_ char *ecid = cli_escape(pos[i]);
    _cleanup_free_ char *path = xasprintf("%s/%s%s", base, ecid, restart ? "/restart" : "");
    _cleanup_json_ json_t *empty = json_object();
    if (cli_request(restart ? "POST" : "DELETE", path, restart ? empty : NULL, &resp) < 0) {
      ret = EXIT_API;
      continue;
    }
    json_decref(resp.json);
  }
  return ret;
}

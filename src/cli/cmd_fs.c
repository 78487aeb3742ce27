/* cmd_fs.c -- moat fs ls|stat|mkdir|mv|rm|watch (a sandbox's files, besides moat cp), moat stdin and
 * moat resize (a background process's input and terminal size) */
#include <stdlib.h>
#include <string.h>

#include "../common/buf.h"
#include "../common/util.h"
#include "cli.h"

static const char fs_usage[] =
    "moat fs ls ID PATH [--depth N]          a directory's entries (JSON)\n"
    "moat fs stat ID PATH                    one entry (JSON)\n"
    "moat fs mkdir ID PATH [--no-parents]    make a directory (and its parents)\n"
    "moat fs mv ID FROM TO                   move or rename\n"
    "moat fs rm ID PATH [-r|--recursive]     remove a file (a directory with -r)\n"
    "moat fs watch ID PATH [--recursive] [--count N]\n"
    "                                        print file system events under PATH as JSON lines\n"
    "  --user U   act as U (default: the sandbox's default user)\n";

enum { F_DEPTH = 1, F_NO_PARENTS, F_RECURSIVE, F_COUNT, F_USER };
static const struct cli_opt fs_opts[] = {{"depth", true, F_DEPTH},
                                         {"no-parents", false, F_NO_PARENTS},
                                         {"recursive", false, F_RECURSIVE},
                                         {"r", false, F_RECURSIVE},
                                         {"count", true, F_COUNT},
                                         {"user", true, F_USER},
                                         {NULL, false, 0}};
struct fs_ctx {
  long long depth, count, seen;
  bool has_depth, no_parents, recursive;
  const char *user;
};
static int on_fs_opt(int id, const char *value, void *ctx) {
  struct fs_ctx *f = ctx;
  switch (id) {
  case F_DEPTH:
    f->has_depth = true;
    return cli_parse_ll(value, "--depth", &f->depth);
  case F_NO_PARENTS:
    f->no_parents = true;
    return 0;
  case F_RECURSIVE:
    f->recursive = true;
    return 0;
  case F_COUNT:
    if (cli_parse_ll(value, "--count", &f->count) < 0)
      return -1;
    if (f->count < 1) {
      cli_errorf("--count must be at least 1");
      return -1;
    }
    return 0;
  default:
    f->user = value;
    return 0;
  }
}

static int on_fs_event(const char *event, const char *data, size_t len, void *ctx) {
  struct fs_ctx *f = ctx;
  if (strcmp(event, "error") == 0) {
    cli_errorf("watch: %.*s", (int)len, data);
    return -1;
  }
  fwrite(data, 1, len, stdout);
  fputc('\n', stdout);
  fflush(stdout);
  return f->count && ++f->seen >= f->count ? 1 : 0;
}

int cmd_fs(int argc, char **argv) {
  struct fs_ctx f = {0};
  struct cli_args a;
  int r = cli_parse(argc, argv, fs_opts, 4, false, on_fs_opt, &f, &a);
  _cleanup_free_ char **pos = a.pos;
  free(a.rest);
  if (r == 1) {
    printf("usage: %s", fs_usage);
    return 0;
  }
  if (r < 0 || a.npos < 3)
    return cli_usage_error(fs_usage, "%s", r < 0 ? "" : "fs needs a subcommand, a sandbox ID and a PATH");
  const char *sub = pos[0];
  bool ls = strcmp(sub, "ls") == 0, mkdir = strcmp(sub, "mkdir") == 0, rm = strcmp(sub, "rm") == 0;
  bool watch = strcmp(sub, "watch") == 0, mv = strcmp(sub, "mv") == 0, stat = strcmp(sub, "stat") == 0;
  if (!ls && !mkdir && !rm && !watch && !mv && !stat)
    return cli_usage_error(fs_usage, "unknown fs subcommand '%s'", sub);
  if (!ls && f.has_depth)
    return cli_usage_error(fs_usage, "--depth goes with fs ls");
  if (!mkdir && f.no_parents)
    return cli_usage_error(fs_usage, "--no-parents goes with fs mkdir");
  if (!rm && !watch && f.recursive)
    return cli_usage_error(fs_usage, "--recursive goes with fs rm and fs watch");
  if (!watch && f.count)
    return cli_usage_error(fs_usage, "--count goes with fs watch");
  if (a.npos != (mv ? 4 : 3))
    return cli_usage_error(fs_usage, mv ? "fs mv takes ID, FROM and TO" : "fs %s takes ID and PATH", sub);
  _cleanup_free_ char *eid = cli_escape(pos[1]);
  _cleanup_free_ char *user = f.user ? cli_escape(f.user) : NULL;
  _cleanup_free_ char *uq = user ? xasprintf("&user=%s", user) : xstrdup("");
  if (mkdir || mv) {
    _cleanup_json_ json_t *body = mkdir ? json_pack("{s:s, s:b}", "path", pos[2], "parents", !f.no_parents)
                                        : json_pack("{s:s, s:s}", "from", pos[2], "to", pos[3]);
    if (f.user)
      json_object_set_new(body, "user", json_string(f.user));
    _cleanup_free_ char *path = xasprintf("/v1/sandboxes/%s/files/%s", eid, mkdir ? "mkdir" : "move");
    return cli_call_print("POST", path, body);
  }
  _cleanup_free_ char *ep = cli_escape(pos[2]);
  if (ls) {
    _cleanup_free_ char *path = xasprintf("/v1/sandboxes/%s/files/list?path=%s&depth=%lld%s", eid, ep,
                                          f.has_depth ? f.depth : 1LL, uq);
    struct cli_resp resp;
    if (cli_request("GET", path, NULL, &resp) < 0)
      return EXIT_API;
    r = cli_print_json(json_object_get(resp.json, "entries")) < 0 ? EXIT_API : 0;
    json_decref(resp.json);
    return r;
  }
  if (stat) {
    _cleanup_free_ char *path = xasprintf("/v1/sandboxes/%s/files/stat?path=%s%s", eid, ep, uq);
    return cli_call_print("GET", path, NULL);
  }
  if (rm) {
    _cleanup_free_ char *path =
        xasprintf("/v1/sandboxes/%s/files?path=%s%s%s", eid, ep, f.recursive ? "&recursive=true" : "", uq);
    return cli_call_print("DELETE", path, NULL);
  }
  _cleanup_free_ char *path = xasprintf("/v1/sandboxes/%s/files/watch?path=%s%s%s", eid, ep,
                                        f.recursive ? "&recursive=true" : "", uq);
  cli_trap_signals();
  r = cli_sse("GET", path, NULL, on_fs_event, &f);
  if (r < 0)
    return cli_interrupted ? 128 + cli_interrupted : EXIT_API;
  return 0;
}

/* ---- moat stdin, moat resize ---- */
static const char stdin_usage[] =
    "moat stdin ID PID|TAG [DATA] [--close]\n"
    "  send DATA (without DATA: all of this CLI's stdin) to a background process's stdin;\n"
    "  --close closes it afterwards (the process reads EOF)\n";

static int on_close_opt(int id, const char *value, void *ctx) {
  *(bool *)ctx = true;
  return 0;
}

int cmd_stdin(int argc, char **argv) {
  static const struct cli_opt opts[] = {{"close", false, 1}, {NULL, false, 0}};
  bool close_it = false;
  struct cli_args a;
  int r = cli_parse(argc, argv, opts, 3, false, on_close_opt, &close_it, &a);
  _cleanup_free_ char **pos = a.pos;
  free(a.rest);
  if (r == 1) {
    printf("usage: %s", stdin_usage);
    return 0;
  }
  if (r < 0 || a.npos < 2 || a.npos > 3)
    return cli_usage_error(stdin_usage, "%s", r < 0 ? "" : "stdin takes ID, PID|TAG and maybe DATA");
  struct moat_buf in = {0};
  if (a.npos == 2) {
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), stdin)) > 0)
      moat_buf_append(&in, buf, n);
    if (ferror(stdin)) {
      free(in.p);
      cli_errorf("reading stdin failed");
      return EXIT_API;
    }
  }
  _cleanup_json_ json_t *body = json_object();
  if (a.npos == 3) {
    json_object_set_new(body, "data", json_string(pos[2]));
  } else if (in.len) {
    char *b64 = moat_base64_encode(in.p, in.len, NULL);
    json_object_set_new(body, "data_b64", json_string(b64));
    free(b64);
  }
  free(in.p);
  if (close_it)
    json_object_set_new(body, "close", json_true());
  if (json_object_size(body) == 0)
    return 0; /* nothing to send */
  _cleanup_free_ char *eid = cli_escape(pos[0]);
  _cleanup_free_ char *eref = cli_escape(pos[1]);
  _cleanup_free_ char *path = xasprintf("/v1/sandboxes/%s/processes/%s/stdin", eid, eref);
  return cli_call_print("POST", path, body);
}

static const char resize_usage[] = "moat resize ID PID|TAG COLS ROWS\n"
                                   "  resize the terminal of a background process started with a pty\n";

static int no_opt(int id, const char *value, void *ctx) { return -1; }

int cmd_resize(int argc, char **argv) {
  static const struct cli_opt opts[] = {{NULL, false, 0}};
  struct cli_args a;
  int r = cli_parse(argc, argv, opts, 4, false, no_opt, NULL, &a);
  _cleanup_free_ char **pos = a.pos;
  free(a.rest);
  if (r == 1) {
    printf("usage: %s", resize_usage);
    return 0;
  }
  if (r < 0 || a.npos != 4)
    return cli_usage_error(resize_usage, "%s", r < 0 ? "" : "resize takes ID, PID|TAG, COLS and ROWS");
  long long cols, rows;
  if (cli_parse_ll(pos[2], "COLS", &cols) < 0 || cli_parse_ll(pos[3], "ROWS", &rows) < 0)
    return EXIT_USAGE;
  _cleanup_free_ char *eid = cli_escape(pos[0]);
  _cleanup_free_ char *eref = cli_escape(pos[1]);
  _cleanup_free_ char *path = xasprintf("/v1/sandboxes/%s/processes/%s/resize", eid, eref);
  _cleanup_json_ json_t *body = json_pack("{s:I, s:I}", "cols", (json_int_t)cols, "rows", (json_int_t)rows);
  return cli_call_print("POST", path, body);
}

/* cmd_account.c -- moat keys (the org's API keys), moat me (the calling key) and moat audit (the
 * org's audit log) */
#include <stdlib.h>
#include <string.h>

#include "../common/util.h"
#include "cli.h"

static const struct cli_opt no_opts[] = {{NULL, false, 0}};
static int no_opt(int id, const char *value, void *ctx) { return -1; }

/* ---- moat keys ---- */
static const char keys_usage[] =
    "moat keys ls                                    the org's keys (JSON, no secrets; admin key)\n"
    "moat keys create NAME [--role R] [--expires T]  a new key (R: admin, member (default), readonly;\n"
    "                                                T: RFC 3339); prints it as JSON with its secret,\n"
    "                                                shown this once\n"
    "moat keys rm KID...                             revoke keys\n";

enum { K_ROLE = 1, K_EXPIRES };
static const struct cli_opt keys_opts[] = {
    {"role", true, K_ROLE}, {"expires", true, K_EXPIRES}, {NULL, false, 0}};
struct keys_ctx {
  const char *role, *expires;
};
static int on_keys_opt(int id, const char *value, void *ctx) {
  struct keys_ctx *k = ctx;
  if (id == K_ROLE) {
    if (strcmp(value, "admin") != 0 && strcmp(value, "member") != 0 && strcmp(value, "readonly") != 0) {
      cli_errorf("--role takes admin, member or readonly, got '%s'", value);
      return -1;
    }
    k->role = value;
  } else {
    k->expires = value;
  }
  return 0;
}

int cmd_keys(int argc, char **argv) {
  struct keys_ctx k = {0};
  struct cli_args a;
  int r = cli_parse(argc, argv, keys_opts, 64, false, on_keys_opt, &k, &a);
  _cleanup_free_ char **pos = a.pos;
  free(a.rest);
  if (r == 1) {
    printf("usage: %s", keys_usage);
    return 0;
  }
  if (r < 0 || a.npos < 1)
    return cli_usage_error(keys_usage, "%s", r < 0 ? "" : "keys needs a subcommand");
  const char *sub = pos[0];
  bool create = strcmp(sub, "create") == 0;
  if (!create && (k.role || k.expires))
    return cli_usage_error(keys_usage, "--role and --expires go with keys create");
  if (strcmp(sub, "ls") == 0) {
    if (a.npos != 1)
      return cli_usage_error(keys_usage, "keys ls takes no arguments");
    struct cli_resp resp;
    if (cli_request("GET", "/v1/keys", NULL, &resp) < 0)
      return EXIT_API;
    r = cli_print_json(json_object_get(resp.json, "keys")) < 0 ? EXIT_API : 0;
    json_decref(resp.json);
    return r;
  }
  if (create) {
    if (a.npos != 2)
      return cli_usage_error(keys_usage, "keys create takes one NAME");
    _cleanup_json_ json_t *body = json_pack("{s:s}", "name", pos[1]);
    if (k.role)
      json_object_set_new(body, "role", json_string(k.role));
    if (k.expires)
      json_object_set_new(body, "expires_at", json_string(k.expires));
    return cli_call_print("POST", "/v1/keys", body);
  }
  if (strcmp(sub, "rm") == 0) {
    if (a.npos < 2)
      return cli_usage_error(keys_usage, "keys rm takes one KID or more");
    int ret = 0;
    for (int i = 1; i < a.npos; i++) {
      _cleanup_free_ char *e = cli_escape(pos[i]);
      _cleanup_free_ char *path = xasprintf("/v1/keys/%s", e);
      if (cli_call_print("DELETE", path, NULL) != 0)
        ret = EXIT_API;
    }
    return ret;
  }
  return cli_usage_error(keys_usage, "unknown keys subcommand '%s'", sub);
}

/* A command without arguments that prints the answer of GET path: --help prints usage. */
static int get_without_args(int argc, char **argv, const char *usage, const char *path) {
  struct cli_args a;
  int r = cli_parse(argc, argv, no_opts, 0, false, no_opt, NULL, &a);
  free(a.pos);
  free(a.rest);
  if (r == 1) {
    printf("usage: %s", usage);
    return 0;
  }
  if (r < 0)
    return cli_usage_error(usage, "%s", "");
  return cli_call_print("GET", path, NULL);
}

/* ---- moat host ---- */
static const char host_usage[] =
    "moat host\n  the host as JSON: capacity, checkpoints, network and the sandboxes counted (the org's;\n"
    "  with the platform admin key every org's, and the host's load)\n";

int cmd_host(int argc, char **argv) { return get_without_args(argc, argv, host_usage, "/v1/host"); }

/* ---- moat me ---- */
static const char me_usage[] =
    "moat me\n  the calling API key (id, name, role, expiry) and its org, as JSON\n";

int cmd_me(int argc, char **argv) { return get_without_args(argc, argv, me_usage, "/v1/me"); }

/* ---- moat audit ---- */
static const char audit_usage[] =
    "moat audit [--from T] [--to T] [--target ID] [--key KID] [--limit N] [--cursor C] [--all]\n"
    "  the org's audit log (every mutating call, oldest first), one JSON entry a line;\n"
    "  T: RFC 3339 or Unix ms (--to exclusive). Without --all: one page of --limit entries\n"
    "  (default 100), then \"next: CURSOR\" on stderr when there are more; --all follows the pages\n";

enum { A_FROM = 1, A_TO, A_TARGET, A_KEY, A_LIMIT, A_CURSOR, A_ALL };
static const struct cli_opt audit_opts[] = {
    {"from", true, A_FROM},   {"to", true, A_TO},         {"target", true, A_TARGET}, {"key", true, A_KEY},
    {"limit", true, A_LIMIT}, {"cursor", true, A_CURSOR}, {"all", false, A_ALL},      {NULL, false, 0}};
static const char *const audit_names[] = {NULL, "from", "to", "target", "key", "limit", "cursor"};
struct audit_ctx {
  const char *v[A_ALL];
  bool all;
};
static int on_audit_opt(int id, const char *value, void *ctx) {
  struct audit_ctx *c = ctx;
  if (id == A_ALL)
    c->all = true;
  else
    c->v[id] = value;
  return 0;
}

int cmd_audit(int argc, char **argv) {
  struct audit_ctx c = {0};
  struct cli_args a;
  int r = cli_parse(argc, argv, audit_opts, 0, false, on_audit_opt, &c, &a);
  free(a.pos);
  free(a.rest);
  if (r == 1) {
    printf("usage: %s", audit_usage);
    return 0;
  }
  if (r < 0)
    return cli_usage_error(audit_usage, "%s", "");
  _cleanup_free_ char *cursor = c.v[A_CURSOR] ? xstrdup(c.v[A_CURSOR]) : NULL;
  for (;;) {
    _cleanup_free_ char *q = xstrdup("");
    for (int i = A_FROM; i < A_ALL; i++) {
      const char *val = i == A_CURSOR ? cursor : c.v[i];
      if (!val)
        continue;
      _cleanup_free_ char *e = cli_escape(val);
      char *n = xasprintf("%s%s%s=%s", q, q[0] ? "&" : "?", audit_names[i], e);
      free(q);
      q = n;
    }
    _cleanup_free_ char *path = xasprintf("/v1/audit%s", q);
    struct cli_resp resp;
    if (cli_request("GET", path, NULL, &resp) < 0)
      return EXIT_API;
    size_t i;
    json_t *x;
    json_array_foreach(json_object_get(resp.json, "entries"), i, x) {
      json_dumpf(x, stdout, JSON_COMPACT);
      fputc('\n', stdout);
    }
    const char *next = json_string_value(json_object_get(resp.json, "next"));
    free(cursor);
    cursor = next ? xstrdup(next) : NULL;
    json_decref(resp.json);
    if (!cursor)
      return 0;
    if (!c.all) {
      fprintf(stderr, "next: %s\n", cursor);
      return 0;
    }
  }
}

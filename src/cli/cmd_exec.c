/* cmd_exec.c -- moat exec and moat run: run a command in a sandbox, relay output and exit code */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../common/util.h"
#include "cli.h"

/* ---- relaying a result ---- */

/* Writes the stream `name` of an exec result to f: NAME_b64 when present (the raw bytes), else the
 * UTF-8 string. */
static int relay_stream(json_t *res, const char *name, FILE *f) {
  _cleanup_free_ char *bname = xasprintf("%s_b64", name);
  json_t *enc = json_object_get(res, bname);
  if (json_is_string(enc)) {
    unsigned char *raw;
    size_t len;
    if (moat_base64_decode(json_string_value(enc), json_string_length(enc), &raw, &len) < 0) {
      cli_errorf("the answer's %s is not base64", bname);
      return -1;
    }
    size_t w = fwrite(raw, 1, len, f);
    free(raw);
    return w == len ? 0 : -1;
  }
  json_t *s = json_object_get(res, name);
  if (!json_is_string(s))
    return 0;
  size_t len = json_string_length(s);
  return fwrite(json_string_value(s), 1, len, f) == len ? 0 : -1;
}

int cli_exec_relay(const char *id, json_t *body) {
  _cleanup_free_ char *eid = cli_escape(id);
  _cleanup_free_ char *path = xasprintf("/v1/sandboxes/%s/exec", eid);
  struct cli_resp resp;
  if (cli_request("POST", path, body, &resp) < 0)
    return -1;
  json_t *res = resp.json;
  relay_stream(res, "stdout", stdout);
  fflush(stdout);
  relay_stream(res, "stderr", stderr);
  if (json_is_true(json_object_get(res, "truncated")))
    cli_errorf("output truncated (each stream keeps its first 16 MiB)");
  int code;
  json_int_t sig = json_integer_value(json_object_get(res, "signal"));
  json_t *ec = json_object_get(res, "exit_code");
  if (json_is_true(json_object_get(res, "timed_out")))
    code = 124;
  else if (sig > 0)
    code = 128 + (int)(sig & 127);
  else if (json_is_integer(ec) && json_integer_value(ec) >= 0)
    code = (int)(json_integer_value(ec) & 255);
  else {
    cli_errorf("the answer has no exit_code");
    code = EXIT_API;
  }
  json_decref(res);
  return code;
}

/* ---- options ---- */

enum { E_ENV = 100, E_CWD, E_USER, E_TIMEOUT, E_STDIN, E_STREAM, E_BACKGROUND, E_TAG, E_PYTHON };

struct exec_ctx {
  json_t *exec;              /* the exec body */
  struct create_opts create; /* run only */
  bool stdin_in;
  bool stream, background; /* exec only */
  const char *tag;         /* exec --background only */
  const char *python;      /* run only */
};

static int on_exec_opt(int id, const char *value, void *ctx) {
  struct exec_ctx *e = ctx;
  long long n;
  switch (id) {
  case E_ENV: {
    json_t *env = json_object_get(e->exec, "env");
    if (!env) {
      env = json_object();
      json_object_set_new(e->exec, "env", env);
    }
    return cli_kv_set(env, value, "--env");
  }
  case E_CWD:
    json_object_set_new(e->exec, "cwd", json_string(value));
    return 0;
  case E_USER:
    json_object_set_new(e->exec, "user", json_string(value));
    return 0;
  case E_TIMEOUT:
    if (cli_parse_ll(value, "--timeout", &n) < 0)
      return -1;
    json_object_set_new(e->exec, "timeout_ms", json_integer(n));
    return 0;
  case E_STDIN:
    e->stdin_in = true;
    return 0;
  case E_STREAM:
    e->stream = true;
    return 0;
  case E_BACKGROUND:
    e->background = true;
    return 0;
  case E_TAG:
    e->tag = value;
    return 0;
  case E_PYTHON:
    e->python = value;
    return 0;
  }
  return cli_create_opt(id, value, &e->create);
}

#define EXEC_OPTS                                                                                            \
  {"env", true, E_ENV}, {"cwd", true, E_CWD}, {"user", true, E_USER}, {"timeout", true, E_TIMEOUT}, {        \
    "stdin", false, E_STDIN                                                                                  \
  }
#define EXEC_USAGE                                                                                           \
  "  --env K=V         environment variable (repeatable)\n"                                                  \
  "  --cwd DIR         working directory (default: the user's home)\n"                                       \
  "  --user U          root (default) or user\n"                                                             \
  "  --timeout MS      kill the command after MS milliseconds (exit code 124)\n"                             \
  "  --stdin           send this program's stdin to the command\n"                                           \
  "Exit code: the command's, 128+N when killed by signal N, 124 on timeout, 1 on an API error.\n"

static const struct cli_opt exec_opts[] = {EXEC_OPTS,
                                           {"stream", false, E_STREAM},
                                           {"background", false, E_BACKGROUND},
                                           {"tag", true, E_TAG},
                                           {NULL, false, 0}};
static const char exec_usage[] =
    "moat exec ID [OPTIONS] [--] CMD [ARG...]\n"
    "  --stream          print output as it arrives (server-sent events); Ctrl-C ends the command\n"
    "  --background      start CMD and print its pid at once (see moat ps, attach, kill)\n"
    "  --tag T           with --background: a name to address the process by\n" EXEC_USAGE;
static const char run_usage[] =
    "moat run [OPTIONS] [--] CMD [ARG...]   (create a sandbox, run CMD, kill the "
    "sandbox)\n"
    "moat run --python CODE [OPTIONS]        (the same with CODE in a Python context; "
    "template code-interpreter)\n" CREATE_USAGE_COMMON EXEC_USAGE
    "  --python CODE     run CODE in a Python context: prints stdout, stderr and the "
    "value of the last\n"
    "                    expression, saves figures as ./moat-result-N.png; exit 1 on an "
    "exception\n";

/* Reads all of stdin into body.stdin_b64. */
static int add_stdin(json_t *body) {
  size_t cap = 65536, n = 0;
  _cleanup_free_ unsigned char *buf = xmalloc(cap);
  for (;;) {
    if (n == cap) {
      cap *= 2;
      buf = xrealloc(buf, cap);
    }
    size_t r = fread(buf + n, 1, cap - n, stdin);
    n += r;
    if (r == 0) {
      if (ferror(stdin)) {
        cli_errorf("read stdin failed");
        return -1;
      }
      break;
    }
  }
  _cleanup_free_ char *enc = moat_base64_encode(buf, n, NULL);
  json_object_set_new(body, "stdin_b64", json_string(enc));
  return 0;
}

static void set_argv(json_t *body, struct cli_args *a) {
  json_t *arr = json_array();
  for (int i = 0; i < a->nrest; i++)
    json_array_append_new(arr, json_string(a->rest[i]));
  json_object_set_new(body, "argv", arr);
}

int cmd_exec(int argc, char **argv) {
  _cleanup_json_ json_t *exec = json_object();
  struct exec_ctx e = {.exec = exec};
  struct cli_args a;
  int r = cli_parse(argc, argv, exec_opts, 1, true, on_exec_opt, &e, &a);
  _cleanup_free_ char **pos = a.pos;
  _cleanup_free_ char **rest = a.rest;
  if (r == 1) {
    printf("usage: %s", exec_usage);
    return 0;
  }
  if (r < 0 || a.npos != 1 || a.nrest < 1)
    return cli_usage_error(exec_usage, "%s", r < 0 ? "" : "exec needs a sandbox id and a command");
  if (e.stream && e.background)
    return cli_usage_error(exec_usage, "--stream and --background exclude each other");
  if (e.tag && !e.background)
    return cli_usage_error(exec_usage, "--tag needs --background");
  set_argv(e.exec, &a);
  if (e.stdin_in && add_stdin(e.exec) < 0)
    return EXIT_API;
  if (e.tag)
    json_object_set_new(e.exec, "tag", json_string(e.tag));
  int code = e.stream       ? cli_exec_stream(pos[0], e.exec)
             : e.background ? cli_exec_background(pos[0], e.exec)
                            : cli_exec_relay(pos[0], e.exec);
  return code < 0 ? EXIT_API : code;
}

void cli_kill_sandbox(const char *id) {
  _cleanup_free_ char *eid = cli_escape(id);
  _cleanup_free_ char *path = xasprintf("/v1/sandboxes/%s", eid);
  struct cli_resp resp;
  if (cli_request("DELETE", path, NULL, &resp) < 0)
    fprintf(stderr, "moat: sandbox %s may still be running (its TTL will end it)\n", id);
  else
    json_decref(resp.json);
}

int cmd_run(int argc, char **argv) {
  static const struct cli_opt run_opts_tmpl[] = {EXEC_OPTS, {"python", true, E_PYTHON}};
  size_t n_exec = sizeof(run_opts_tmpl) / sizeof(run_opts_tmpl[0]);
  struct cli_opt *opts = xcalloc(n_exec + cli_create_nopts + 1, sizeof(*opts));
  memcpy(opts, run_opts_tmpl, sizeof(run_opts_tmpl));
  memcpy(opts + n_exec, cli_create_opts, cli_create_nopts * sizeof(*opts));
  /* --env appears twice; the first (the exec's) wins: run has one exec, create's env would do the same. */
  _cleanup_json_ json_t *exec = json_object();
  _cleanup_json_ json_t *create = json_object();
  struct exec_ctx e = {.exec = exec, .create = {.body = create}};
  struct cli_args a;
  int r = cli_parse(argc, argv, opts, 0, true, on_exec_opt, &e, &a);
  free(opts);
  _cleanup_free_ char **pos = a.pos;
  _cleanup_free_ char **rest = a.rest;
  if (r != 0 || (a.nrest < 1 && !e.python) || (a.nrest > 0 && e.python)) {
    if (r == 1) {
      printf("usage: %s", run_usage);
      return 0;
    }
    return cli_usage_error(run_usage, "%s",
                           r < 0      ? ""
                           : e.python ? "--python takes no command"
                                      : "run needs a command");
  }
  if (e.python)
    return cli_run_python(e.python, moat_steal_json(&create));
  set_argv(e.exec, &a);
  if (e.stdin_in && add_stdin(e.exec) < 0)
    return EXIT_API;

  cli_trap_signals();
  struct cli_resp resp;
  r = cli_request("POST", "/v1/sandboxes", e.create.body, &resp);
  if (r < 0)
    return cli_interrupted ? 128 + cli_interrupted : EXIT_API;
  const char *sid = json_string_value(json_object_get(resp.json, "id"));
  _cleanup_free_ char *id = sid ? xstrdup(sid) : NULL;
  json_decref(resp.json);
  if (!id) {
    cli_errorf("the answer has no sandbox id");
    return EXIT_API;
  }
  int code = cli_interrupted ? -1 : cli_exec_relay(id, e.exec);
  int sig = cli_interrupted;
  cli_interrupted = 0;
  cli_kill_sandbox(id);
  if (sig)
    return 128 + sig;
  return code < 0 ? EXIT_API : code;
}

/* cmd_template.c -- moat template build|import|logs|get|ls|rm: templates from a Dockerfile and a
 * build context, from an OCI image archive, and moatd's own recipes */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../common/util.h"
#include "cli.h"
#include "context_tar.h"

#define MAX_BUILD_ARGS 128
/* The name a Dockerfile from outside the context directory is sent under. */
#define OUTSIDE_DOCKERFILE ".moat-cli.Dockerfile"

static const char template_usage[] =
    "moat template build NAME [-f DOCKERFILE] [--build-arg K=V]... [DIR]\n"
    "                             build NAME from DIR (default .) and its Dockerfile, showing the log;\n"
    "                             exit 0 when ready, 1 when the build failed. Ctrl-C leaves it running.\n"
    "                             DIR's .dockerignore is honoured; links are sent as links.\n"
    "                             For one of moatd's own templates (base, code-interpreter): rebuild\n"
    "                             it from its recipe and wait.\n"
    "moat template import NAME FILE   NAME from an OCI image archive (oci-archive or docker save)\n"
    "moat template logs NAME BUILD_ID [--follow]   a build's log (--follow: until it ends; exit as build)\n"
    "moat template get NAME     the template as JSON\n"
    "moat template ls [--json]  list templates and their state\n"
    "moat template rm NAME...   delete templates (sandboxes made from them keep running)\n";

enum { T_FILE = 1, T_BUILD_ARG, T_FOLLOW, T_JSON };
static const struct cli_opt template_opts[] = {
    {"f", true, T_FILE},         {"file", true, T_FILE},  {"build-arg", true, T_BUILD_ARG},
    {"follow", false, T_FOLLOW}, {"json", false, T_JSON}, {NULL, false, 0}};

struct template_ctx {
  const char *dockerfile;
  const char *build_args[MAX_BUILD_ARGS];
  size_t n_build_args;
  bool follow, json;
};

static int on_template_opt(int id, const char *value, void *ctx) {
  struct template_ctx *t = ctx;
  switch (id) {
  case T_FILE:
    t->dockerfile = value;
    return 0;
  case T_BUILD_ARG: {
    const char *eq = strchr(value, '=');
    if (!eq || eq == value) {
      cli_errorf("--build-arg '%s' is not KEY=VALUE", value);
      return -1;
    }
    if (t->n_build_args == MAX_BUILD_ARGS) {
      cli_errorf("more than %d --build-arg", MAX_BUILD_ARGS);
      return -1;
    }
    t->build_args[t->n_build_args++] = value;
    return 0;
  }
  case T_FOLLOW:
    t->follow = true;
    return 0;
  default:
    t->json = true;
    return 0;
  }
}

static void print_header(void) {
  printf("%-24s %-10s %-9s %-10s %-24s %s\n", "NAME", "SOURCE", "STATE", "SIZE", "UPDATED", "ERROR");
}

static void print_row(json_t *t) {
  const char *name = json_string_value(json_object_get(t, "name"));
  const char *source = json_string_value(json_object_get(t, "source"));
  const char *state = json_string_value(json_object_get(t, "state"));
  json_t *size = json_object_get(t, "size_bytes");
  json_t *when = json_object_get(t, "updated_at");
  if (!json_is_string(when) && !json_is_integer(when))
    when = json_object_get(t, "built_at");
  const char *err = json_string_value(json_object_get(t, "error"));
  char sizebuf[32] = "-";
  if (json_is_integer(size) && json_integer_value(size) > 0)
    snprintf(sizebuf, sizeof(sizebuf), "%.1fM", (double)json_integer_value(size) / (1024.0 * 1024.0));
  char whenbuf[64] = "-";
  if (json_is_string(when))
    snprintf(whenbuf, sizeof(whenbuf), "%s", json_string_value(when));
  else if (json_is_integer(when) && json_integer_value(when) > 0)
    snprintf(whenbuf, sizeof(whenbuf), "%lld", (long long)json_integer_value(when));
  /* one line per template: an error's first line only */
  int errlen = err ? (int)strcspn(err, "\n") : 0;
  printf("%-24s %-10s %-9s %-10s %-24s %.*s\n", name ? name : "-", source ? source : "-", state ? state : "-",
         sizebuf, whenbuf, errlen, err ? err : "");
}

static char *template_path(const char *name, const char *suffix) {
  _cleanup_free_ char *e = cli_escape(name);
  return xasprintf("/v1/templates/%s%s", e, suffix);
}

/* ---- the build log ---- */

struct log_follow {
  const char *name, *build_id;
  int last_step;
  bool ended;
  bool ready;
};

static int on_log_event(const char *event, const char *data, size_t len, void *ctx) {
  struct log_follow *f = ctx;
  json_error_t jerr;
  _cleanup_json_ json_t *j = json_loadb(data, len, 0, &jerr);
  if (strcmp(event, "error") == 0) {
    const char *msg = json_string_value(json_object_get(j, "message"));
    const char *code = json_string_value(json_object_get(j, "code"));
    cli_errorf("build log: %s (%s)", msg ? msg : data, code ? code : "error");
    return -1;
  }
  if (!j)
    return 0; /* a keep-alive or a record this CLI does not know */
  if (strcmp(event, "end") == 0) {
    const char *state = json_string_value(json_object_get(j, "state"));
    f->ended = true;
    f->ready = state && strcmp(state, "ready") == 0;
    if (f->ready) {
      json_int_t size = json_integer_value(json_object_get(j, "size_bytes"));
      printf("template %s ready (build %s, %.1f MiB)\n", f->name, f->build_id,
             (double)size / (1024.0 * 1024.0));
    } else {
      const char *err = json_string_value(json_object_get(j, "error"));
      fflush(stdout);
      cli_errorf("template %s: build %s %s: %s", f->name, f->build_id, state ? state : "ended",
                 err ? err : "no error given");
    }
    fflush(stdout);
    return 1;
  }
  if (strcmp(event, "log") != 0)
    return 0;
  int step = (int)json_integer_value(json_object_get(j, "step"));
  const char *stream = json_string_value(json_object_get(j, "stream"));
  const char *text = json_string_value(json_object_get(j, "text"));
  if (!text)
    text = "";
  if (stream && strcmp(stream, "moat") == 0) {
    printf("#%d %s\n", step, text);
  } else {
    bool err = stream && strcmp(stream, "stderr") == 0;
    printf("#%d %s %s\n", step, err ? "!" : "|", text);
  }
  f->last_step = step;
  fflush(stdout);
  return 0;
}

/* Streams build_id's log (following it to its end when follow). Returns the exit code: 0 (ready,
 * or the log so far without follow), 1 (failed, or an error: printed), 128+signal on an interrupt
 * (the build goes on: said so). */
static int show_log(const char *name, const char *build_id, bool follow) {
  _cleanup_free_ char *ename = cli_escape(name);
  _cleanup_free_ char *eid = cli_escape(build_id);
  _cleanup_free_ char *path =
      xasprintf("/v1/templates/%s/builds/%s/logs%s", ename, eid, follow ? "?follow=true" : "");
  struct log_follow f = {.name = name, .build_id = build_id};
  int r = cli_sse("GET", path, NULL, on_log_event, &f);
  if (r < 0 && cli_interrupted) {
    int sig = cli_interrupted;
    fprintf(stderr,
            "moat: stopped following; the build goes on in moatd "
            "(moat template logs %s %s --follow; moat template get %s)\n",
            name, build_id, name);
    return 128 + sig;
  }
  if (r < 0)
    return EXIT_API;
  if (f.ended)
    return f.ready ? 0 : EXIT_API;
  if (follow) {
    cli_errorf("the build log of %s ended before the build did (moat template get %s)", build_id, name);
    return EXIT_API;
  }
  return 0;
}

/* ---- build ---- */

/* Whether name is one of moatd's own templates (a recipe). -1 when the list failed (printed). */
static int is_builtin(const char *name) {
  struct cli_resp resp;
  if (cli_request("GET", "/v1/templates", NULL, &resp) < 0)
    return -1;
  int found = 0;
  size_t i;
  json_t *t;
  json_array_foreach(json_object_get(resp.json, "templates"), i, t) {
    const char *n = json_string_value(json_object_get(t, "name"));
    const char *s = json_string_value(json_object_get(t, "source"));
    if (n && s && strcmp(n, name) == 0 && strcmp(s, "builtin") == 0)
      found = 1;
  }
  json_decref(resp.json);
  return found;
}

static int build_recipe(const char *name) {
  fprintf(stderr, "moat: rebuilding moatd's template '%s' from its recipe (waits; progress in moatd's log)\n",
          name);
  _cleanup_free_ char *path = template_path(name, "/build");
  struct cli_resp resp;
  if (cli_request("POST", path, NULL, &resp) < 0)
    return EXIT_API;
  print_header();
  print_row(resp.json);
  json_decref(resp.json);
  return 0;
}

/* The path of dockerfile relative to dir when it lies inside (caller frees), else NULL. */
static char *inside(const char *dir, const char *dockerfile) {
  char rdir[PATH_MAX], rfile[PATH_MAX];
  if (!realpath(dir, rdir) || !realpath(dockerfile, rfile))
    return NULL;
  size_t l = strlen(rdir);
  if (strcmp(rdir, "/") == 0)
    return xstrdup(rfile + 1);
  if (strncmp(rfile, rdir, l) != 0 || rfile[l] != '/')
    return NULL;
  return xstrdup(rfile + l + 1);
}

static int build_dockerfile(const char *name, const char *dir, const struct template_ctx *t) {
  _cleanup_free_ char *rel = NULL;
  _cleanup_fclose_ FILE *outside = NULL;
  if (t->dockerfile) {
    /* -f is relative to the working directory, as docker build's */
    struct stat st;
    if (stat(t->dockerfile, &st) < 0) {
      cli_errorf("%s: %s", t->dockerfile, strerror(errno));
      return EXIT_API;
    }
    if (!S_ISREG(st.st_mode)) {
      cli_errorf("%s: not a regular file", t->dockerfile);
      return EXIT_API;
    }
    rel = inside(dir, t->dockerfile);
    if (!rel) {
      if (!(outside = fopen(t->dockerfile, "rbe"))) {
        cli_errorf("%s: %s", t->dockerfile, strerror(errno));
        return EXIT_API;
      }
      rel = xstrdup(OUTSIDE_DOCKERFILE);
    }
  }
  _cleanup_fclose_ FILE *tar = tmpfile();
  if (!tar) {
    cli_errorf("a temporary file for the build context: %s", strerror(errno));
    return EXIT_API;
  }
  struct cli_tar_stats stats;
  if (cli_context_tar(dir, rel ? rel : "Dockerfile", OUTSIDE_DOCKERFILE, outside, tar, &stats) < 0)
    return EXIT_API;
  if (fflush(tar) != 0) {
    cli_errorf("write the build context: %s", strerror(errno));
    return EXIT_API;
  }
  long long size = ftello(tar);
  rewind(tar);

  _cleanup_free_ char *query = xstrdup(""); /* "&k=v" per argument */
  if (rel) {
    _cleanup_free_ char *e = cli_escape(rel);
    char *n = xasprintf("%s&dockerfile=%s", query, e);
    free(query);
    query = n;
  }
  for (size_t i = 0; i < t->n_build_args; i++) {
    const char *kv = t->build_args[i];
    const char *eq = strchr(kv, '=');
    _cleanup_free_ char *k = xstrndup(kv, (size_t)(eq - kv));
    _cleanup_free_ char *ek = cli_escape(k);
    _cleanup_free_ char *ev = cli_escape(eq + 1);
    char *n = xasprintf("%s&build_arg.%s=%s", query, ek, ev);
    free(query);
    query = n;
  }
  _cleanup_free_ char *ename = cli_escape(name);
  _cleanup_free_ char *path =
      xasprintf("/v1/templates/%s%s%s", ename, query[0] ? "?" : "", query[0] ? query + 1 : "");
  fprintf(stderr, "moat: sending the build context: %llu files, %.1f MiB (%.1f MiB of tar)\n",
          (unsigned long long)stats.files, (double)stats.bytes / (1024.0 * 1024.0),
          (double)size / (1024.0 * 1024.0));

  cli_trap_signals();
  struct cli_resp resp;
  if (cli_upload_as("POST", path, "application/x-tar", tar, size, &resp) < 0) {
    if (cli_interrupted) {
      fprintf(stderr, "moat: interrupted before moatd had the context: no build started\n");
      return 128 + cli_interrupted;
    }
    return EXIT_API;
  }
  const char *build_id = json_string_value(json_object_get(resp.json, "build_id"));
  if (!build_id) {
    cli_errorf("moatd answered no build_id");
    json_decref(resp.json);
    return EXIT_API;
  }
  _cleanup_free_ char *id = xstrdup(build_id);
  json_decref(resp.json);
  printf("building template %s: build %s\n", name, id);
  fflush(stdout);
  return show_log(name, id, true);
}

static int cmd_build(char **pos, int npos, const struct template_ctx *t) {
  if (npos < 2 || npos > 3)
    return cli_usage_error(template_usage, "template build takes NAME and at most one DIR");
  int builtin = is_builtin(pos[1]);
  if (builtin < 0)
    return EXIT_API;
  if (builtin) {
    if (npos == 3 || t->dockerfile || t->n_build_args)
      return cli_usage_error(template_usage, "'%s' is moatd's own template: it builds from its recipe only",
                             pos[1]);
    return build_recipe(pos[1]);
  }
  return build_dockerfile(pos[1], npos == 3 ? pos[2] : ".", t);
}

static int cmd_import(const char *name, const char *file) {
  _cleanup_fclose_ FILE *in = fopen(file, "rbe");
  struct stat st;
  if (!in || fstat(fileno(in), &st) < 0) {
    cli_errorf("%s: %s", file, strerror(errno));
    return EXIT_API;
  }
  if (!S_ISREG(st.st_mode)) {
    cli_errorf("%s: not a regular file", file);
    return EXIT_API;
  }
  _cleanup_free_ char *path = template_path(name, "/import");
  struct cli_resp resp;
  if (cli_upload_as("POST", path, "application/x-tar", in, (long long)st.st_size, &resp) < 0)
    return EXIT_API;
  print_header();
  print_row(resp.json);
  json_decref(resp.json);
  return 0;
}

int cmd_template(int argc, char **argv) {
  struct template_ctx t = {0};
  struct cli_args a;
  int r = cli_parse(argc, argv, template_opts, 64, false, on_template_opt, &t, &a);
  _cleanup_free_ char **pos = a.pos;
  free(a.rest);
  if (r == 1) {
    printf("usage: %s", template_usage);
    return 0;
  }
  if (r < 0 || a.npos < 1)
    return cli_usage_error(template_usage, "%s", r < 0 ? "" : "template needs a subcommand");
  const char *sub = pos[0];
  bool build = strcmp(sub, "build") == 0, logs = strcmp(sub, "logs") == 0, ls = strcmp(sub, "ls") == 0;
  if (!build && (t.dockerfile || t.n_build_args))
    return cli_usage_error(template_usage, "-f and --build-arg go with template build");
  if (!logs && t.follow)
    return cli_usage_error(template_usage, "--follow goes with template logs");
  if (!ls && t.json)
    return cli_usage_error(template_usage, "--json goes with template ls (template get prints JSON)");
  struct cli_resp resp;
  if (ls) {
    if (a.npos != 1)
      return cli_usage_error(template_usage, "template ls takes no arguments");
    if (cli_request("GET", "/v1/templates", NULL, &resp) < 0)
      return EXIT_API;
    if (t.json) {
      json_dumpf(json_object_get(resp.json, "templates"), stdout, JSON_INDENT(2));
      printf("\n");
    } else {
      print_header();
      size_t i;
      json_t *x;
      json_array_foreach(json_object_get(resp.json, "templates"), i, x) print_row(x);
    }
    json_decref(resp.json);
    return 0;
  }
  if (build)
    return cmd_build(pos, a.npos, &t);
  if (strcmp(sub, "import") == 0) {
    if (a.npos != 3)
      return cli_usage_error(template_usage, "template import takes NAME and FILE");
    return cmd_import(pos[1], pos[2]);
  }
  if (logs) {
    if (a.npos != 3)
      return cli_usage_error(template_usage, "template logs takes NAME and BUILD_ID");
    if (t.follow)
      cli_trap_signals();
    return show_log(pos[1], pos[2], t.follow);
  }
  if (strcmp(sub, "get") == 0) {
    if (a.npos != 2)
      return cli_usage_error(template_usage, "template get takes one NAME");
    _cleanup_free_ char *path = template_path(pos[1], "");
    if (cli_request("GET", path, NULL, &resp) < 0)
      return EXIT_API;
    json_dumpf(resp.json, stdout, JSON_INDENT(2));
    printf("\n");
    json_decref(resp.json);
    return 0;
  }
  if (strcmp(sub, "rm") == 0) {
    if (a.npos < 2)
      return cli_usage_error(template_usage, "template rm takes one NAME or more");
    int ret = 0;
    for (int i = 1; i < a.npos; i++) {
      _cleanup_free_ char *path = template_path(pos[i], "");
      if (cli_request("DELETE", path, NULL, &resp) < 0) {
        ret = EXIT_API;
        continue;
      }
      json_decref(resp.json);
    }
    return ret;
  }
  return cli_usage_error(template_usage, "unknown template subcommand '%s'", sub);
}

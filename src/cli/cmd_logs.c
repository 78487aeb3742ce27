/* cmd_logs.c -- moat logs ID [-f] [--since T] [--json]: a sandbox's log (GET /v1/sandboxes/ID/logs)
 *
 * Output bytes go to stdout (stdout and pty streams) or stderr (stderr), as the process wrote
 * them; process starts and exits, lifecycle lines, OOM kills and drop markers go to stderr as
 * "moat: AT ..." lines. --json prints every entry as one JSON line on stdout instead. */
#include <stdlib.h>
#include <string.h>

#include "../common/util.h"
#include "cli.h"

static const char logs_usage[] =
    "moat logs ID [-f|--follow] [--since T] [--json]\n"
    "  -f, --follow   go on with new entries until the sandbox is killed (Ctrl-C stops)\n"
    "  --since T      entries at or after T: RFC 3339 (2026-12-02T10:00:00Z) or Unix milliseconds\n"
    "  --json         one JSON entry per line on stdout ({type, stream, pid, data, encoding, at, ...})\n";

struct logs_opts {
  bool follow, json;
  const char *since;
};

static int on_logs_opt(int id, const char *value, void *ctx) {
  struct logs_opts *o = ctx;
  if (id == 1)
    o->follow = true;
  else if (id == 2)
    o->since = value;
  else if (id == 3)
    o->json = true;
  return 0;
}

static const char *str(json_t *j, const char *k) {
  const char *s = json_string_value(json_object_get(j, k));
  return s ? s : "";
}

static int on_entry(const char *event, const char *data, size_t len, void *ctx) {
  const struct logs_opts *o = ctx;
  if (strcmp(event, "error") == 0) {
    json_auto_t *e = json_loadb(data, len, 0, NULL);
    cli_errorf("%s (%s)", str(e, "message"), str(e, "code"));
    return -1;
  }
  if (o->json) {
    fwrite(data, 1, len, stdout);
    fputc('\n', stdout);
    fflush(stdout);
    return 0;
  }
  json_auto_t *j = json_loadb(data, len, 0, NULL);
  if (!j)
    return 0;
  const char *type = str(j, "type");
  if (strcmp(type, "output") == 0) {
    const char *d = str(j, "data");
    FILE *f = strcmp(str(j, "stream"), "stderr") == 0 ? stderr : stdout;
    if (strcmp(str(j, "encoding"), "base64") == 0) {
      unsigned char *raw = NULL;
      size_t n = 0;
      if (moat_base64_decode(d, strlen(d), &raw, &n) == 0)
        fwrite(raw, 1, n, f);
      free(raw);
    } else {
      fwrite(d, 1, json_string_length(json_object_get(j, "data")), f);
    }
    fflush(f);
    return 0;
  }
  fflush(stdout);
  if (strcmp(type, "process") == 0) {
    if (strcmp(str(j, "event"), "start") == 0) {
      _cleanup_free_ char *argv = json_dumps(json_object_get(j, "argv"), JSON_COMPACT);
      fprintf(stderr, "moat: %s process %lld started%s%s: %s\n", str(j, "at"),
              (long long)json_integer_value(json_object_get(j, "pid")),
              json_object_get(j, "tag") ? " tag " : "", str(j, "tag"), argv ? argv : "[]");
    } else {
      fprintf(stderr, "moat: %s process %lld exited %lld (signal %lld)\n", str(j, "at"),
              (long long)json_integer_value(json_object_get(j, "pid")),
              (long long)json_integer_value(json_object_get(j, "exit_code")),
              (long long)json_integer_value(json_object_get(j, "signal")));
    }
  } else if (strcmp(type, "lifecycle") == 0) {
    fprintf(stderr, "moat: %s sandbox %s (%s)\n", str(j, "at"), str(j, "event"), str(j, "reason"));
  } else if (strcmp(type, "dropped") == 0) {
    fprintf(stderr, "moat: %lld bytes dropped (%s)\n",
            (long long)json_integer_value(json_object_get(j, "bytes")), str(j, "reason"));
  } else if (strcmp(type, "oom") == 0) {
    fprintf(stderr, "moat: %s the kernel OOM-killed %lld process(es)\n", str(j, "at"),
            (long long)json_integer_value(json_object_get(j, "kills")));
  }
  return 0;
}

int cmd_logs(int argc, char **argv) {
  static const struct cli_opt opts[] = {
      {"follow", false, 1}, {"f", false, 1}, {"since", true, 2}, {"json", false, 3}, {NULL, false, 0}};
  struct logs_opts o = {0};
  struct cli_args a;
  int r = cli_parse(argc, argv, opts, 1, false, on_logs_opt, &o, &a);
  _cleanup_free_ char **pos = a.pos;
  _cleanup_free_ char **rest = a.rest;
  if (r == 1) {
    printf("usage: %s", logs_usage);
    return 0;
  }
  if (r < 0 || a.npos != 1)
    return cli_usage_error(logs_usage, "%s", r < 0 ? "" : "logs needs a sandbox id");
  _cleanup_free_ char *eid = cli_escape(pos[0]);
  _cleanup_free_ char *esince = o.since ? cli_escape(o.since) : NULL;
  _cleanup_free_ char *path =
      xasprintf("/v1/sandboxes/%s/logs?follow=%s%s%s", eid, o.follow ? "true" : "false",
                esince ? "&since=" : "", esince ? esince : "");
  if (o.follow)
    cli_trap_signals();
  int s = cli_sse("GET", path, NULL, on_entry, &o);
  if (s < 0 && cli_interrupted)
    return 0;
  return s < 0 ? EXIT_API : 0;
}

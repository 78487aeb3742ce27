/* cmd_volextra.c -- moat volume get|read|write|rmfile (one volume, its files) and moat db events (a
 * database's event stream); cmd_volume and cmd_db hand these subcommands here */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../common/util.h"
#include "cli.h"

static int no_opt(int id, const char *value, void *ctx) { return -1; }

const char cli_volume_extra_usage[] =
    "moat volume get NAME                 one volume as JSON\n"
    "moat volume read NAME PATH           a volume's file to stdout\n"
    "moat volume write NAME PATH [FILE]   FILE (default stdin) into the volume at PATH\n"
    "moat volume rmfile NAME PATH         remove a file of the volume\n";

int cli_volume_extra(int argc, char **argv) {
  static const struct cli_opt opts[] = {{NULL, false, 0}};
  struct cli_args a;
  int r = cli_parse(argc, argv, opts, 4, false, no_opt, NULL, &a);
  _cleanup_free_ char **pos = a.pos;
  free(a.rest);
  if (r == 1) {
    printf("usage: %s", cli_volume_extra_usage);
    return 0;
  }
  const char *sub = a.npos ? pos[0] : "";
  bool get = strcmp(sub, "get") == 0, write = strcmp(sub, "write") == 0;
  int want = get ? 2 : 3;
  if (r < 0 || !(a.npos == want || (write && a.npos == 4)))
    return cli_usage_error(cli_volume_extra_usage, "%s", r < 0 ? "" : "wrong arguments");
  _cleanup_free_ char *ename = cli_escape(pos[1]);
  if (get) {
    _cleanup_free_ char *path = xasprintf("/v1/volumes/%s", ename);
    return cli_call_print("GET", path, NULL);
  }
  _cleanup_free_ char *ep = cli_escape(pos[2]);
  _cleanup_free_ char *path = xasprintf("/v1/volumes/%s/files?path=%s", ename, ep);
  if (strcmp(sub, "read") == 0)
    return cli_download(path, stdout) < 0 ? EXIT_API : 0;
  if (strcmp(sub, "rmfile") == 0)
    return cli_call_print("DELETE", path, NULL);
  FILE *in = stdin;
  long long size = -1;
  if (a.npos == 4 && strcmp(pos[3], "-") != 0) {
    in = fopen(pos[3], "rbe");
    if (!in) {
      cli_errorf("cannot open %s", pos[3]);
      return EXIT_API;
    }
    struct stat st;
    if (fstat(fileno(in), &st) == 0 && S_ISREG(st.st_mode))
      size = (long long)st.st_size;
  }
  struct cli_resp resp;
  r = cli_upload(path, in, size, &resp);
  if (in != stdin)
    fclose(in);
  if (r < 0)
    return EXIT_API;
  json_decref(resp.json);
  return 0;
}

/* ---- moat db events ---- */
const char cli_db_events_usage[] =
    "moat db events ID [--count N]\n"
    "  the database's events as JSON lines {event, data}: first its state, then connection,\n"
    "  hibernated, woken, restarted, branched, created as they happen; ends after deleted\n";

static int on_count(int id, const char *value, void *ctx) {
  long long *n = ctx;
  if (cli_parse_ll(value, "--count", n) < 0)
    return -1;
  if (*n < 1) {
    cli_errorf("--count must be at least 1");
    return -1;
  }
  return 0;
}

struct db_events {
  long long count, seen;
};

static int on_db_event(const char *event, const char *data, size_t len, void *ctx) {
  struct db_events *e = ctx;
  json_error_t jerr;
  json_t *d = json_loadb(data, len, 0, &jerr);
  _cleanup_json_ json_t *line =
      json_pack("{s:s, s:o}", "event", event, "data", d ? d : json_stringn(data, len));
  if (!line || json_dumpf(line, stdout, JSON_COMPACT) < 0)
    return -1;
  fputc('\n', stdout);
  fflush(stdout);
  if (strcmp(event, "deleted") == 0)
    return 1;
  return e->count && ++e->seen >= e->count ? 1 : 0;
}

int cli_db_events(int argc, char **argv) {
  static const struct cli_opt opts[] = {{"count", true, 1}, {NULL, false, 0}};
  struct db_events e = {0};
  struct cli_args a;
  int r = cli_parse(argc, argv, opts, 2, false, on_count, &e.count, &a);
  _cleanup_free_ char **pos = a.pos;
  free(a.rest);
  if (r == 1) {
    printf("usage: %s", cli_db_events_usage);
    return 0;
  }
  if (r < 0 || a.npos != 2)
    return cli_usage_error(cli_db_events_usage, "%s", r < 0 ? "" : "db events takes one ID");
  _cleanup_free_ char *eid = cli_escape(pos[1]);
  _cleanup_free_ char *path = xasprintf("/v1/databases/%s/events", eid);
  cli_trap_signals();
  r = cli_sse("GET", path, NULL, on_db_event, &e);
  if (r < 0)
    return cli_interrupted ? 128 + cli_interrupted : EXIT_API;
  return 0;
}

/* cmd_db.c -- moat db create|ls|get|branch|rm|url|psql: an org's PostgreSQL databases */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../common/util.h"
#include "cli.h"

/* As a shell answers for a command it cannot find (127) or cannot run (126). */
#define EXIT_NO_PSQL 127
#define EXIT_PSQL_NOEXEC 126

static const char db_usage[] =
    "moat db create NAME [--size-mb N] [--idle-seconds N] [--meta K=V]...\n"
    "                                  make a PostgreSQL database, print its id\n"
    "moat db ls [--json]               list databases\n"
    "moat db get ID                    show one database as JSON (its password included)\n"
    "moat db branch ID NAME [--idle-seconds N] [--meta K=V]...\n"
    "                                  a new database with ID's data, print its id\n"
    "moat db rm ID...                  delete databases and their data\n"
    "moat db url ID                    print the connection URL (postgresql://...)\n"
    "moat db psql ID [--] [PSQL_ARGS...]\n"
    "                                  run the host's psql connected to the database (its exit code)\n"
    "  NAME: ^[a-z0-9][a-z0-9_-]{0,62}$; --size-mb: the data volume's size (default 1024, at least 64);\n"
    "  --idle-seconds: hibernate after so long with no connection (default 300)\n";

enum { D_SIZE = 1, D_IDLE, D_META, D_JSON };
static const struct cli_opt db_opts[] = {{"size-mb", true, D_SIZE},
                                         {"idle-seconds", true, D_IDLE},
                                         {"meta", true, D_META},
                                         {"json", false, D_JSON},
                                         {NULL, false, 0}};

struct db_ctx {
  json_t *body; /* the create or branch body the options fill */
  bool has_size, has_idle, has_meta, json;
};

static int on_db_opt(int id, const char *value, void *ctx) {
  struct db_ctx *d = ctx;
  long long n;
  switch (id) {
  case D_SIZE:
  case D_IDLE:
    if (cli_parse_ll(value, id == D_SIZE ? "--size-mb" : "--idle-seconds", &n) < 0)
      return -1;
    json_object_set_new(d->body, id == D_SIZE ? "size_mb" : "idle_seconds", json_integer(n));
    *(id == D_SIZE ? &d->has_size : &d->has_idle) = true;
    return 0;
  case D_META: {
    json_t *m = json_object_get(d->body, "metadata");
    if (!m) {
      m = json_object();
      json_object_set_new(d->body, "metadata", m);
    }
    d->has_meta = true;
    return cli_kv_set(m, value, "--meta");
  }
  case D_JSON:
    d->json = true;
    return 0;
  }
  return -1;
}

/* GET or DELETE /v1/databases/ID (what: NULL) or POST .../ID/what with body. 0 and *out (caller
 * decrefs; may be NULL), or -1 (printed). */
static int db_call(const char *method, const char *id, const char *what, json_t *body, json_t **out) {
  _cleanup_free_ char *eid = cli_escape(id);
  _cleanup_free_ char *path =
      what ? xasprintf("/v1/databases/%s/%s", eid, what) : xasprintf("/v1/databases/%s", eid);
  struct cli_resp resp;
  if (cli_request(method, path, body, &resp) < 0)
    return -1;
  if (out)
    *out = resp.json;
  else
    json_decref(resp.json);
  return 0;
}

/* Prints the new database's id; EXIT_API when the answer has none. */
static int print_id(json_t *d) {
  const char *id = json_string_value(json_object_get(d, "id"));
  if (!id) {
    cli_errorf("the answer has no database id");
    return EXIT_API;
  }
  printf("%s\n", id);
  return 0;
}

static const char *str_or_dash(json_t *o, const char *key) {
  const char *s = json_string_value(json_object_get(o, key));
  return s && *s ? s : "-";
}

static void print_row(json_t *d) {
  printf("%-20s  %-24s  %-10s  %7lldM  %5lld  %-24s  ", str_or_dash(d, "id"), str_or_dash(d, "name"),
         str_or_dash(d, "state"), (long long)json_integer_value(json_object_get(d, "size_mb")),
         (long long)json_integer_value(json_object_get(d, "connections")), str_or_dash(d, "created_at"));
  const char *k;
  json_t *v;
  bool first = true;
  json_object_foreach(json_object_get(d, "metadata"), k, v) {
    printf("%s%s=%s", first ? "" : ",", k, json_string_value(v) ? json_string_value(v) : "");
    first = false;
  }
  printf("%s\n", first ? "-" : "");
}

/* moat db psql: replaces this process with `psql URL ARGS...`. The URL carries no password (a
 * command line is visible to every user of the host): psql reads it from PGPASSWORD, which only
 * this user can see. Returns only on failure. */
static int db_psql(const char *id, char **args, int nargs) {
  _cleanup_json_ json_t *d = NULL;
  if (db_call("GET", id, NULL, NULL, &d) < 0)
    return EXIT_API;
  json_t *conn = json_object_get(d, "connection");
  const char *host = json_string_value(json_object_get(conn, "host"));
  json_int_t port = json_integer_value(json_object_get(conn, "port"));
  const char *user = json_string_value(json_object_get(conn, "user"));
  const char *pass = json_string_value(json_object_get(conn, "password"));
  const char *dbname = json_string_value(json_object_get(conn, "database"));
  if (!host || !user || !pass || !dbname || port <= 0 || port > 65535) {
    cli_errorf("the answer has no complete connection for database %s", id);
    return EXIT_API;
  }
  /* roles, databases and the proxy's host are plain ([a-z0-9_], an address); an IPv6 one is bracketed */
  bool v6 = strchr(host, ':') != NULL;
  _cleanup_free_ char *url = xasprintf("postgresql://%s@%s%s%s:%lld/%s?sslmode=disable", user, v6 ? "[" : "",
                                       host, v6 ? "]" : "", (long long)port, dbname);
  char **argv = xcalloc((size_t)nargs + 3, sizeof(char *));
  argv[0] = "psql";
  argv[1] = url;
  for (int i = 0; i < nargs; i++)
    argv[i + 2] = args[i];
  if (setenv("PGPASSWORD", pass, 1) < 0) {
    cli_errorf("setenv PGPASSWORD: %s", strerror(errno));
    free(argv);
    return EXIT_API;
  }
  fflush(stdout);
  execvp("psql", argv);
  int e = errno;
  free(argv);
  unsetenv("PGPASSWORD");
  if (e == ENOENT) {
    cli_errorf(
        "psql not found on PATH: install PostgreSQL's client (Debian: apt-get install postgresql-client), "
        "or connect with the URL `moat db url %s` prints",
        id);
    return EXIT_NO_PSQL;
  }
  cli_errorf("cannot run psql: %s", strerror(e));
  return EXIT_PSQL_NOEXEC;
}

int cmd_db(int argc, char **argv) {
  if (argc >= 2 && strcmp(argv[1], "events") == 0)
    return cli_db_events(argc, argv);
  if (argc >= 2 && strcmp(argv[1], "psql") == 0) {
    /* moat db psql ID [--] ARGS...: every word after ID is psql's, options included */
    if (argc >= 3 && (strcmp(argv[2], "-h") == 0 || strcmp(argv[2], "--help") == 0)) {
      printf("usage: %s", db_usage);
      return 0;
    }
    if (argc < 3 || argv[2][0] == '-')
      return cli_usage_error(db_usage, "db psql takes a database ID first");
    int skip = argc >= 4 && strcmp(argv[3], "--") == 0 ? 4 : 3;
    return db_psql(argv[2], argv + skip, argc - skip);
  }
  _cleanup_json_ json_t *body = json_object();
  struct db_ctx d = {.body = body};
  struct cli_args a;
  int r = cli_parse(argc, argv, db_opts, 64, false, on_db_opt, &d, &a);
  _cleanup_free_ char **pos = a.pos;
  free(a.rest);
  if (r == 1) {
    printf("usage: %s%s", db_usage, cli_db_events_usage);
    return 0;
  }
  if (r < 0 || a.npos < 1)
    return cli_usage_error(db_usage, "%s", r < 0 ? "" : "db needs a subcommand");
  const char *sub = pos[0];
  bool create = strcmp(sub, "create") == 0, branch = strcmp(sub, "branch") == 0;
  bool ls = strcmp(sub, "ls") == 0;
  if (!create && !branch && !ls && strcmp(sub, "get") != 0 && strcmp(sub, "rm") != 0 &&
      strcmp(sub, "url") != 0)
    return cli_usage_error(db_usage, "unknown db subcommand '%s'", sub);
  if ((d.has_size && !create) || ((d.has_idle || d.has_meta) && !create && !branch) || (d.json && !ls))
    return cli_usage_error(db_usage, "that option does not apply to db %s", sub);

  if (create) {
    if (a.npos != 2)
      return cli_usage_error(db_usage, "db create takes one NAME");
    json_object_set_new(body, "name", json_string(pos[1]));
    struct cli_resp resp;
    if (cli_request("POST", "/v1/databases", body, &resp) < 0)
      return EXIT_API;
    r = print_id(resp.json);
    json_decref(resp.json);
    return r;
  }
  if (branch) {
    if (a.npos != 3)
      return cli_usage_error(db_usage, "db branch takes a database ID and the new database's NAME");
    json_object_set_new(body, "name", json_string(pos[2]));
    _cleanup_json_ json_t *out = NULL;
    if (db_call("POST", pos[1], "branch", body, &out) < 0)
      return EXIT_API;
    return print_id(out);
  }
  if (ls) {
    if (a.npos != 1)
      return cli_usage_error(db_usage, "db ls takes no arguments");
    struct cli_resp resp;
    if (cli_request("GET", "/v1/databases", NULL, &resp) < 0)
      return EXIT_API;
    json_t *list = json_object_get(resp.json, "databases");
    if (d.json) {
      json_dumpf(list, stdout, JSON_INDENT(2));
      fputc('\n', stdout);
    } else {
      printf("%-20s  %-24s  %-10s  %8s  %5s  %-24s  %s\n", "ID", "NAME", "STATE", "SIZE", "CONNS", "CREATED",
             "METADATA");
      size_t i;
      json_t *x;
      json_array_foreach(list, i, x) print_row(x);
    }
    json_decref(resp.json);
    return 0;
  }
  if (strcmp(sub, "rm") == 0) {
    if (a.npos < 2)
      return cli_usage_error(db_usage, "db rm takes one database ID or more");
    int ret = 0;
    for (int i = 1; i < a.npos; i++) {
      if (db_call("DELETE", pos[i], NULL, NULL, NULL) < 0) {
        fprintf(stderr, "moat: (while removing %s)\n", pos[i]);
        ret = EXIT_API;
      }
    }
    return ret;
  }
  if (a.npos != 2)
    return cli_usage_error(db_usage, "db %s takes one database ID", sub);
  _cleanup_json_ json_t *out = NULL;
  if (db_call("GET", pos[1], NULL, NULL, &out) < 0)
    return EXIT_API;
  if (strcmp(sub, "url") == 0) {
    const char *url = json_string_value(json_object_get(json_object_get(out, "connection"), "url"));
    if (!url) {
      cli_errorf("the answer has no connection URL");
      return EXIT_API;
    }
    printf("%s\n", url);
    return 0;
  }
  json_dumpf(out, stdout, JSON_INDENT(2));
  fputc('\n', stdout);
  return 0;
}

/* cli.h -- the moat CLI's shared pieces: argument parsing, the HTTP client, errors and exit codes */
#ifndef MOAT_CLI_H
#define MOAT_CLI_H

#include <jansson.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>

#include "../common/codec.h"
#include "../common/json_cleanup.h"

/* Exit codes: 0 ok, 1 an error (API, network, local file), 2 bad usage. exec/run pass the command's
 * own code through (128+signal when killed, 124 on timeout). */
#define EXIT_API 1
#define EXIT_USAGE 2

/* ---- argument parsing ----
 * Options are long (--name VALUE or --name=VALUE), "-x VALUE" for an option named by the one letter
 * x, plus -h/--help. Options and positionals may
 * mix; "--" ends the options; once a command takes a trailing argv (rest_ok) and max_pos positionals
 * have been seen, the next non-option word starts that argv, so `moat exec ID ls -la` works. */
struct cli_opt {
  const char *name; /* without the leading "--" */
  bool has_arg;
  int id;
};

struct cli_args {
  char **pos; /* positionals before the trailing argv (borrowed from argv) */
  int npos;
  char **rest; /* the trailing argv, NULL-terminated (borrowed) */
  int nrest;
};

/* Calls on_opt(id, value, ctx) for each option (value NULL when it takes none); on_opt returns 0 or
 * -1 (it printed why). Returns 0, 1 when -h/--help was given (usage printed by the caller), or -1
 * after printing the problem to stderr. Caller frees a->pos and a->rest with free(). */
int cli_parse(int argc, char **argv, const struct cli_opt *opts, int max_pos, bool rest_ok,
              int (*on_opt)(int id, const char *value, void *ctx), void *ctx, struct cli_args *a);

/* Prints "moat: <fmt>\n" to stderr. */
void cli_errorf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Prints "moat: <fmt>" (nothing when it formats to "") and the usage; returns EXIT_USAGE. */
int cli_usage_error(const char *usage, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Splits "K=V" into a new reference in obj; -1 (printed) when there is no '='. */
int cli_kv_set(json_t *obj, const char *kv, const char *what);
/* Parses a decimal integer / number argument; -1 (printed) when it is not one. */
int cli_parse_ll(const char *s, const char *what, long long *out);
int cli_parse_double(const char *s, const char *what, double *out);

/* ---- the HTTP client ---- */

/* The signal number once SIGINT/SIGTERM/SIGHUP arrived after cli_trap_signals(); while it is
 * non-zero, transfers in flight abort. Clear it to make a clean-up request after an interrupt. */
extern volatile sig_atomic_t cli_interrupted;
void cli_trap_signals(void);

/* Reads MOAT_API_URL (default http://127.0.0.1:7070) and MOAT_API_KEY (else ./.moat/api-key). */
void cli_client_init(void);
void cli_client_cleanup(void);

/* A response: HTTP status (0 when the request never completed) and the parsed JSON body (NULL when
 * empty or not JSON). */
struct cli_resp {
  long status;
  json_t *json;
};

/* Sends METHOD path_and_query with an optional JSON body (borrowed). Returns 0 when the server
 * answered 2xx (resp filled, caller json_decref's resp->json); otherwise prints
 * "moat: <message> (<code>)" (or the transport error) and returns -1. */
int cli_request(const char *method, const char *path, json_t *body, struct cli_resp *resp);

/* Streams the local stream `in` (size, or -1 when unknown: chunked) as the body of PUT path.
 * Returns 0 on 2xx, else prints the error and returns -1. */
int cli_upload(const char *path, FILE *in, long long size, struct cli_resp *resp);

/* The same with another method (POST) and Content-Type (NULL: application/octet-stream). */
int cli_upload_as(const char *method, const char *path, const char *content_type, FILE *in, long long size,
                  struct cli_resp *resp);

/* GETs path, streaming the body into `out` only when the answer is 2xx. Returns 0 or -1 (printed). */
int cli_download(const char *path, FILE *out);

/* Server-sent events: fn(event, data, len, ctx) is called for each event as it arrives (data: the
 * event's data lines joined by '\n', NUL-terminated, borrowed). fn returns 0 to go on, 1 to end the stream
 * (cli_sse returns 0) or -1 after printing an error (cli_sse returns -1). cli_sse returns 1 when the
 * server ended the stream before fn asked to stop, -1 when the request failed (printed; also on an
 * interrupt, cli_interrupted set). body may be NULL (a GET). */
typedef int (*cli_sse_fn)(const char *event, const char *data, size_t len, void *ctx);
int cli_sse(const char *method, const char *path, json_t *body, cli_sse_fn fn, void *ctx);

/* MOAT_API_URL (no trailing '/') and the API key (NULL when none), after cli_client_init(). */
const char *cli_api_url(void);
const char *cli_api_key(void);

/* Percent-encodes s for a query string; caller frees. */
char *cli_escape(const char *s);

/* ---- commands ---- */
int cmd_create(int argc, char **argv);
int cmd_ls(int argc, char **argv);
int cmd_get(int argc, char **argv);
int cmd_rm(int argc, char **argv);
int cmd_exec(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_cp(int argc, char **argv);
int cmd_template(int argc, char **argv);
int cmd_volume(int argc, char **argv);
/* orgs and quotas (cmd_org.c) */
int cmd_org(int argc, char **argv);
int cmd_quota(int argc, char **argv);
int cmd_usage_now(int argc, char **argv); /* `moat usage now ORG`, from cmd_usage */
int cmd_usage(int argc, char **argv);     /* cmd_usage.c */
int cmd_metrics(int argc, char **argv);   /* cmd_usage.c */
int cmd_db(int argc, char **argv);
int cmd_ps(int argc, char **argv);
int cmd_attach(int argc, char **argv);
int cmd_kill(int argc, char **argv);
int cmd_shell(int argc, char **argv);
int cmd_logs(int argc, char **argv); /* cmd_logs.c */
/* time travel (cmd_timetravel.c) */
int cmd_pause(int argc, char **argv);
int cmd_resume(int argc, char **argv);
int cmd_hibernate(int argc, char **argv);
int cmd_wake(int argc, char **argv);
int cmd_snapshot(int argc, char **argv);
int cmd_snapshots(int argc, char **argv);
int cmd_fork(int argc, char **argv);
int cmd_rollback(int argc, char **argv);
int cmd_explore(int argc, char **argv);
/* ports, network, events, update (cmd_net.c); keys, me, audit (cmd_account.c); contexts */
int cmd_port(int argc, char **argv);
int cmd_network(int argc, char **argv);
int cmd_events(int argc, char **argv);
int cmd_update(int argc, char **argv);
int cmd_keys(int argc, char **argv);
int cmd_me(int argc, char **argv);
int cmd_host(int argc, char **argv); /* cmd_account.c */
int cmd_audit(int argc, char **argv);
int cmd_context(int argc, char **argv);
int cmd_fs(int argc, char **argv);
int cmd_stdin(int argc, char **argv);
int cmd_resize(int argc, char **argv);
/* moat volume get|read|write|rmfile and moat db events (cmd_volextra.c), given the command's whole argv */
extern const char cli_volume_extra_usage[];
int cli_volume_extra(int argc, char **argv);
extern const char cli_db_events_usage[];
int cli_db_events(int argc, char **argv);

/* moat cp -r (cmd_cptree.c): the local directory into the sandbox's rdir (made if missing), or the
 * sandbox's rdir into the new local directory; one tar stream each way. Return the exit code. */
int cli_cp_tree_up(const char *local, const char *id, const char *rdir);
int cli_cp_tree_down(const char *id, const char *rdir, const char *local);

/* Prints j as indented JSON and a newline; -1 on a write error. */
int cli_print_json(json_t *j);
/* Sends the request and prints the answer's JSON (nothing when empty): 0, or EXIT_API (printed). */
int cli_call_print(const char *method, const char *path, json_t *body);
/* Prints a code context run's answer (output, results, figures saved as ./moat-result-N.png, the
 * error's traceback); returns 0, or 1 when the code raised. */
int cli_print_run(json_t *res);

/* Builds the JSON body of POST /v1/sandboxes from create-style options; shared by create and run.
 * Returns the option ids it handles through cli_create_opt(). */
struct create_opts {
  json_t *body;
};
extern const struct cli_opt cli_create_opts[];
extern const size_t cli_create_nopts;
int cli_create_opt(int id, const char *value, struct create_opts *c);
#define CREATE_USAGE_COMMON                                                                                  \
  "  --template T      template name (default base)\n"                                                       \
  "  --ttl S           seconds until it is killed (default 3600; refreshed by API activity)\n"               \
  "  --persistent      no TTL\n"                                                                             \
  "  --meta K=V        metadata (repeatable)\n"                                                              \
  "  --cpu N           vCPUs (default 2)\n"                                                                  \
  "  --memory MB       memory limit (default 2048)\n"                                                        \
  "  --pids N          process limit (default 4096)\n"                                                       \
  "  --disk MB         writable layer size (default 10240)\n"                                                \
  "  --from-snapshot SID  start from a snapshot (its memory, processes and files)\n"                         \
  "  --hibernate-after S  with --persistent: hibernate after S seconds idle (no API use, no CPU)\n"          \
  "  --volume NAME:PATH[:ro]  mount volume NAME at PATH, read-only with :ro (repeatable, at most 8)\n"       \
  "  --database ID[:ENV]  set ENV (default DATABASE_URL) to database ID's connection URL (repeatable)\n"
#define CREATE_USAGE CREATE_USAGE_COMMON "  --env K=V         environment for every exec (repeatable)\n"

/* Runs argv in sandbox id (exec options already in body) and relays its output; returns the exit
 * code to pass through, or -1 when the request failed (printed). */
int cli_exec_relay(const char *id, json_t *body);
/* The same over POST .../exec/stream (with kill_on_disconnect): output is written as it arrives.
 * Returns the exit code, 128+signal when this CLI was interrupted, or -1 (printed). */
int cli_exec_stream(const char *id, json_t *body);
/* POST .../exec with background: true; prints the pid. Returns 0 or -1 (printed). */
int cli_exec_background(const char *id, json_t *body);
/* Deletes sandbox id; says so on stderr when that failed. Call with cli_interrupted cleared. */
void cli_kill_sandbox(const char *id);
/* moat run --python: create a sandbox, run code in a python context, kill it. Returns the exit code. */
int cli_run_python(const char *code, json_t *create_body);

#endif

/* api_internal.h -- what the files of src/api share: routes, request state, validators, codecs, replies
 *
 * Pure helpers (routing, body validation, UTF-8/RFC 3339, errno -> HTTP mapping, listen
 * address parsing) live in router.c, api_json.c and api_codec.c and use nothing of control/ or
 * host/ beyond their headers, so unit tests and the fuzz target can link them alone.
 */
#ifndef MOAT_API_INTERNAL_H
#define MOAT_API_INTERNAL_H

#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "../common/codec.h"
#include "../common/error.h"
#include "../common/util.h"
#include "../control/control.h"
#include "../host/guest_client.h"
#include "api.h"

#define API_MAX_BODY (1024 * 1024)  /* JSON bodies; larger -> 413 */
#define API_MAX_PATH 4096           /* file paths inside a sandbox */
#define API_FILE_BLOCK (256 * 1024) /* GET files response block */
#define API_MAX_QUERY_ARGS 64
#define API_MAX_META_KEYS 64
#define API_MAX_META_KEY 128
#define API_MAX_META_VALUE 1024
#define API_MAX_ENV_KEYS 1024
#define API_MAX_ENV_KEY 256
#define API_MAX_ENV_VALUE (128 * 1024)
#define API_MAX_ARGV 4096
#define API_MAX_TIMEOUT_MS 86400000LL
#define API_MAX_USER 64
#define API_MAX_DEPTH 16
#define API_MAX_TAG 64
#define API_MAX_PTY 1000 /* pty columns and rows: 1..API_MAX_PTY */
/* The errno-like status of a request over a per-org or per-sandbox cap (fair.c): 429
 * too_many_requests, answered with Retry-After and the connection closed. */
#define API_E_TOO_MANY EUSERS
#define API_RETRY_AFTER_S "1"

/* ---- routes (router.c) ---- */

enum api_route_kind {
  API_R_NONE = 0,
  API_R_HEALTHZ,
  API_R_SANDBOXES_LIST,
  API_R_SANDBOXES_CREATE,
  API_R_SANDBOX_GET,
  API_R_SANDBOX_PATCH,
  API_R_SANDBOX_DELETE,
  API_R_EXEC,
  API_R_FILES_GET,
  API_R_FILES_PUT,
  API_R_FILES_DELETE,
  API_R_FILES_LIST,
  API_R_FILES_STAT,
  API_R_FILES_MKDIR,
  API_R_FILES_MOVE,
  API_R_TEMPLATES_LIST,
  API_R_TEMPLATE_BUILD,
  /* issue 3: streams, processes, pty, watch (api_stream.c, api_procs.c, ws.c) */
  API_R_EXEC_STREAM,
  API_R_PROCS_LIST,
  API_R_PROC_STDIN,
  API_R_PROC_SIGNAL,
  API_R_PROC_RESIZE,
  API_R_PROC_STREAM,
  API_R_PTY,
  API_R_FILES_WATCH,
  /* code contexts (api_contexts.c) */
  API_R_CTX_CREATE,
  API_R_CTX_LIST,
  API_R_CTX_DELETE,
  API_R_CTX_RESTART,
  API_R_CTX_RUN,
  /* issue 4: time travel (api_timetravel.c) */
  API_R_PAUSE,
  API_R_RESUME,
  API_R_HIBERNATE,
  API_R_WAKE,
  API_R_SNAPSHOT_CREATE,
  API_R_FORK,
  API_R_EXPLORE,
  API_R_ROLLBACK,
  API_R_SNAPSHOTS_LIST,
  API_R_SNAPSHOT_GET,
  API_R_SNAPSHOT_DELETE,
  /* issue 5: exposed ports (ports.c) */
  API_R_PORTS_LIST,
  API_R_PORT_GET,
  API_R_PORT_EXPOSE,
  API_R_PORT_UNEXPOSE,
  API_R_PORT_PROXY, /* any method under .../ports/P/: api_port_proxy_begin authenticates, the body streams */
  /* issue 7: MCP over streamable HTTP (api_mcp.c); the body is JSON-RPC (object or batch array),
   * read raw: the handler parses it */
  API_R_MCP_SANDBOX,
  API_R_MCP_WORKSPACE,
  /* issue 5: network policy, state and connection log (api_network.c) */
  API_R_NETWORK_GET,
  API_R_NETWORK_PUT,
  API_R_NETWORK_LOG,
  /* metrics (api_metrics.c): GET /metrics (Prometheus text) and GET .../metrics (JSON) */
  API_R_METRICS,
  API_R_SANDBOX_METRICS,
  /* lifecycle and connection events as SSE (api_events.c) */
  API_R_EVENTS,
};

enum api_match {
  API_MATCH_OK = 0,
  API_MATCH_NOT_FOUND,       /* 404: no such path (or an id that cannot exist) */
  API_MATCH_BAD_METHOD,      /* 405: path known, method not; allow says which */
  API_MATCH_NOT_IMPLEMENTED, /* 501: a DESIGN.md route whose issue has not landed */
};

struct api_route {
  enum api_route_kind kind;
  char id[MOAT_ID_LEN + 1]; /* sandbox routes */
  char name[64];            /* template routes */
  int pid;                  /* process routes: the pid, or 0 when addressed by tag */
  char tag[API_MAX_TAG + 1]; /* process routes addressed by tag */
  char cid[64];              /* context routes: the context id as given (checked by the handler) */
  char sid[64];              /* snapshot routes: the snapshot id as given (checked by the handler) */
  unsigned port;             /* port routes: 1..65535, or 0 when the path's port is not one */
  const char *allow;        /* BAD_METHOD: value of the Allow header (static) */
  bool json_body;           /* the route reads a JSON body */
  bool needs_auth;
};

/* Matches method + decoded path. Returns an api_match and fills r (kind, id, allow...). Pure. */
enum api_match api_route_match(const char *method, const char *path, struct api_route *r);
/* True when s matches ^sb-[a-z0-9]{17}$. */
bool api_valid_sandbox_id(const char *s);
/* True when s matches ^[a-z0-9][a-z0-9._-]{0,62}$. */
bool api_valid_template_name(const char *s);
const char *api_route_name(enum api_route_kind k);
/* True when s is a process tag: [A-Za-z0-9_.-]{1,64}, not all digits (that reads as a pid). */
bool api_valid_tag(const char *s);
/* Signal number of "TERM" "KILL" "INT" "HUP" "QUIT" "USR1" "USR2" "STOP" "CONT" (an optional
 * "SIG" prefix allowed), or 0 for anything else. Pure. */
int api_signal_parse(const char *name);

/* ---- errors ---- */

/* Maps an errno-like status (from moat_error) to an HTTP status and an error code. Pure.
 * EBADMSG is reserved for invalid JSON, ENOSYS for not-implemented, EMSGSIZE for too large. */
unsigned api_errno_http(int status, const char **code);

/* ---- query arguments (http.c collects them; router/handlers read them) ---- */

struct api_arg {
  char *key;
  char *value;
};
struct api_args {
  struct api_arg v[API_MAX_QUERY_ARGS];
  size_t n;
};
/* The value of key, or NULL. */
const char *api_arg_get(const struct api_args *a, const char *key);
/* Fails (EINVAL, message naming the parameter) when an argument is not one of allowed[] (NULL
 * terminated; an entry ending in '.' allows any key with that prefix) or is repeated. */
int api_args_check(const struct api_args *a, const char *const *allowed, moat_error **err);
/* Query parameter parsers: 0 and *out, or -1 EINVAL naming the parameter. */
int api_arg_bool(const struct api_args *a, const char *key, bool def, bool *out, moat_error **err);
int api_arg_path(const struct api_args *a, const char *key, const char **out, moat_error **err);
int api_arg_user(const struct api_args *a, const char **out, moat_error **err);
int api_arg_depth(const struct api_args *a, uint32_t *out, moat_error **err);
int api_arg_mode(const struct api_args *a, uint32_t *out, moat_error **err);
/* Sandboxes list: state (NULL = any) and metadata.KEY=VALUE filters into *meta (owned, or NULL). */
int api_args_list_filter(const struct api_args *a, bool *has_state, enum moat_sandbox_state *state,
                         json_t **meta, moat_error **err);

/* ---- JSON bodies (api_json.c) ---- */

/* Parses a request body. Empty body -> empty object when empty_ok, else EINVAL. Malformed JSON ->
 * EBADMSG with jansson's text, line, column and position; not an object -> EINVAL. */
int api_body_parse(const char *buf, size_t len, bool empty_ok, json_t **out, moat_error **err);

/* POST /v1/sandboxes. On success spec's borrowed pointers point into body (keep it alive). */
int api_parse_create(json_t *body, uint64_t host_memory_mb, struct moat_sandbox_spec *spec, moat_error **err);
/* PATCH /v1/sandboxes/{id}. */
int api_parse_patch(json_t *body, struct moat_sandbox_patch *patch, moat_error **err);

/* POST .../exec. req's argv, env and stdin are owned by the result: free with api_exec_req_clear. */
int api_parse_exec(json_t *body, struct moat_exec_req *req, moat_error **err);
void api_exec_req_clear(struct moat_exec_req *req);

/* The issue-3 fields of an exec body, on top of api_parse_exec's. */
enum {
  API_EXEC_BACKGROUND = 1, /* POST .../exec: background, tag, pty (tag and pty need background) */
  API_EXEC_STREAM = 2,     /* POST .../exec/stream: kill_on_disconnect, tag, pty */
};
struct api_exec_extra {
  bool background;
  bool kill_on_disconnect; /* default false */
  const char *tag;         /* borrowed from body, or NULL */
  uint32_t pty_cols, pty_rows; /* both 0 = no pty */
};
/* api_parse_exec plus the extra fields that allow (API_EXEC_*) admits; x may be NULL when allow
 * is 0. Other fields are 400 as before. */
int api_parse_exec_ex(json_t *body, unsigned allow, struct moat_exec_req *req, struct api_exec_extra *x,
                      moat_error **err);
/* {pid, tag, cmd, argv, started_at, running, exit_code, signal, pty, background} */
json_t *api_proc_info_json(const struct moat_proc_info *p);

struct api_mkdir_req {
  const char *path; /* borrowed from body */
  const char *user; /* NULL = root */
  bool parents;
};
int api_parse_mkdir(json_t *body, const char *query_user, struct api_mkdir_req *out, moat_error **err);
struct api_move_req {
  const char *from, *to, *user;
};
int api_parse_move(json_t *body, const char *query_user, struct api_move_req *out, moat_error **err);

/* Checks a sandbox file path: non-empty, <= API_MAX_PATH bytes, no NUL (len is the real length). */
int api_check_path(const char *what, const char *p, size_t len, moat_error **err);
/* Checks a user name: 1..API_MAX_USER bytes of [A-Za-z0-9._-], not starting with '-'. */
int api_check_user(const char *what, const char *u, moat_error **err);
/* ^[A-Za-z_][A-Za-z0-9_]*$ */
bool api_valid_env_name(const char *s);

/* Output JSON. */
json_t *api_error_json(const char *code, const char *message);
json_t *api_exec_result_json(const struct moat_exec_result *res);
json_t *api_file_entry_json(const struct moat_file_entry *e);
/* A JSON string of s with invalid UTF-8 repaired, or null when s is NULL. */
json_t *api_str_json(const char *s);
/* "file" "dir" "symlink" "other" for 'f' 'd' 'l' anything else. */
const char *api_file_type_name(char t);

/* ---- codecs (api_codec.c) ---- */

/* Returns a NUL-terminated UTF-8 copy of buf where each maximal invalid subsequence is replaced
 * by U+FFFD (caller frees); *out_len its length (it may contain NUL bytes from the input);
 * *was_valid true when no replacement happened. */
char *api_utf8_sanitize(const char *buf, size_t len, size_t *out_len, bool *was_valid);
/* True when buf is valid UTF-8 (no overlongs, surrogates or code points > U+10FFFF). */
bool api_utf8_valid(const char *buf, size_t len);

/* For output streamed in chunks: returns the length of the longest prefix of buf that is
 * valid UTF-8 such that the rest (at most 3 bytes) is a sequence cut short by the end of buf,
 * to be carried over to the next chunk. *valid is false when buf holds an ill-formed sequence
 * (the caller then sends all of it as base64). */
size_t api_utf8_stream_split(const char *buf, size_t len, bool *valid);


/* Formats ms since the epoch as "YYYY-MM-DDTHH:MM:SS.mmmZ" into buf (>= 32 bytes). Returns buf. */
char *api_rfc3339_ms(int64_t ms, char *buf, size_t size);
/* The same as a JSON string; NULL JSON when ms <= 0 and null_if_zero. */
json_t *api_time_json(int64_t ms, bool null_if_zero);

/* "HOST:PORT" / "[V6]:PORT" / "localhost:PORT" into a socket address. 0 or -1 (EINVAL). */
int api_parse_listen(const char *listen, struct sockaddr_storage *ss, socklen_t *len, moat_error **err);
/* A listening TCP socket (SO_REUSEADDR, dual stack on "::", backlog 1024) bound to listen_addr
 * ("HOST:PORT"). Returns the fd with *port (the port bound, for PORT 0) and *ipv6 set, or -1. */
int api_listen_socket(const char *listen_addr, unsigned *port, bool *ipv6, moat_error **err);

/* Sets the caps of fair.h and starts the gate (gate.h) for one more listener: 0 or -1. The
 * listener stops the gate (api_gate_stop) when it stops. */
int api_limits_apply(const struct moat_api_limits *lim, moat_error **err);

/* ---- requests (http.c) ---- */

struct MHD_Connection;
struct moat_api;

/* One HTTP request in flight; lives from the first access-handler call to request completion. */
struct api_req {
  struct moat_api *api;
  struct MHD_Connection *conn;
  uint64_t start_ns;
  char method[16];
  char *path; /* decoded request path, owned */
  struct api_route route;
  struct api_args args;
  char *org;       /* authenticated org, owned */
  unsigned status; /* status queued, for the access log */
  bool responded;  /* a response was queued (or written) */
  char *raw_uri;   /* the request target as received (path and query, not decoded), owned */
  /* JSON body */
  char *body;
  size_t body_len, body_cap;
  /* PUT files */
  struct moat_guest_writer *writer;
  struct moat_guest_ep *sock_path;
  const char *file_path; /* borrowed from args */
  const char *file_user;
  bool write_failed;
  /* GET pty: the WebSocket state until the upgrade takes it (freed with the request otherwise) */
  void *upgrade;
  void (*upgrade_free)(void *);
  /* Its slot under the per-org and per-sandbox caps (fair.c), from auth to the request's end (a
   * WebSocket takes it along: api_req_take_ticket). */
  struct api_ticket *ticket;
  /* A request of another front end on the same listener (E2B, e2b.c): claimed in req_begin
   * before v1 routing; its state is freed with the request. */
  bool e2b;
  void *front;
  void (*front_free)(void *);
};

/* Admits the request (org authenticated; sandbox: the one it names, or NULL) under the caps of
 * fair.h as a request or a stream. 0, or -1 with *err (API_E_TOO_MANY): the caller answers it. */
struct api_ticket;
int api_req_admit(struct api_req *r, const char *org, const char *sandbox, bool stream, moat_error **err);
/* The request turns into a long-lived stream (see fair.h): 0, or -1 with *err (API_E_TOO_MANY). */
int api_req_stream(struct api_req *r, moat_error **err);
/* Hands the request's ticket to the caller (a thread that outlives the request gives it back with
 * api_fair_release); NULL when it holds none. */
struct api_ticket *api_req_take_ticket(struct api_req *r);

struct moat_control *api_control(const struct api_req *r);
const char *api_version(const struct api_req *r);

/* Queue a reply. body is consumed (json_decref'd). Return 0 or -1 when MHD refused. */
int api_reply_json(struct api_req *r, unsigned status, json_t *body);
int api_reply_empty(struct api_req *r, unsigned status);
int api_reply_error(struct api_req *r, unsigned status, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Maps err (status) to HTTP and queues {"code","message"}; frees *err. */
int api_reply_moat_error(struct api_req *r, moat_error **err);
/* Queue an already-built MHD response (takes a reference; the caller destroys its own). */
struct MHD_Response;
int api_reply_response(struct api_req *r, unsigned status, struct MHD_Response *resp);

/* Handlers: called once the whole body is in; each queues exactly one reply. */
int api_h_healthz(struct api_req *r);
int api_h_sandboxes_list(struct api_req *r);
int api_h_sandboxes_create(struct api_req *r, json_t *body);
int api_h_sandbox_get(struct api_req *r);
int api_h_sandbox_patch(struct api_req *r, json_t *body);
int api_h_sandbox_delete(struct api_req *r);
int api_h_exec(struct api_req *r, json_t *body);
int api_h_files_get(struct api_req *r);
int api_h_files_delete(struct api_req *r);
int api_h_files_list(struct api_req *r);
int api_h_files_stat(struct api_req *r);
int api_h_files_mkdir(struct api_req *r, json_t *body);
int api_h_files_move(struct api_req *r, json_t *body);
int api_h_templates_list(struct api_req *r);
int api_h_template_build(struct api_req *r);

/* PUT files, streamed: open at the first call (-1 after queueing an error reply), push each chunk
 * (-1 with *err set: the caller aborts the connection with that error), finish at the end. */
int api_files_put_open(struct api_req *r);
int api_files_put_chunk(struct api_req *r, const char *data, size_t len, moat_error **err);
int api_files_put_finish(struct api_req *r);
/* Releases what a PUT left open (discarding an unfinished upload). */
void api_files_put_release(struct api_req *r);

/* Issue 3 (api_stream.c, api_procs.c, ws.c). */
int api_h_exec_stream(struct api_req *r, json_t *body);
int api_h_procs_list(struct api_req *r);
int api_h_proc_stdin(struct api_req *r, json_t *body);
int api_h_proc_signal(struct api_req *r, json_t *body);
int api_h_proc_resize(struct api_req *r, json_t *body);
int api_h_proc_stream(struct api_req *r);
int api_h_pty(struct api_req *r);
int api_h_files_watch(struct api_req *r);
/* SSE sources of other files, run by api_stream.c's writer (keep-alive, hang-up check, stop):
 * next appends whole events to out (waiting up to about timeout_ms when it has none) and sets
 * *done once the last is in out; free releases ctx (also when the client went away). */
struct moat_buf;
struct api_sse_source {
  void (*next)(void *ctx, struct moat_buf *out, int timeout_ms, bool *done);
  void (*free)(void *ctx);
  void *ctx;
};
/* "event: NAME\ndata: JSON\n\n" appended to out; data is consumed. */
void api_sse_format(struct moat_buf *out, const char *name, json_t *data);
/* Queues the stream (src->ctx is then owned by it, also on failure); first: text sent at once,
 * or NULL. */
int api_sse_reply_source(struct api_req *r, const struct api_sse_source *src, const char *first);
/* GET .../events (api_events.c) */
int api_h_events(struct api_req *r);
/* Turns an ENOENT of an exec into EINVAL when the sandbox is alive (a missing cwd). */
void api_exec_enoent(struct api_req *r, moat_error *err);
/* POST .../exec with background: true -> 201 {pid, tag}. body was parsed into req and x. */
int api_exec_background(struct api_req *r, struct moat_exec_req *req, const struct api_exec_extra *x);
/* The guest socket of the request's sandbox (caller frees) after control's org/state checks;
 * with env non-NULL also the sandbox env ("K=V", strv_free). NULL and *err on failure. */
struct moat_guest_ep *api_guest_sock(struct api_req *r, char ***env, moat_error **err);
/* sandbox env followed by req_env (the guest lets later entries win); caller strv_frees. */
char **api_env_concat(char *const *sandbox_env, char *const *req_env);
/* Replies to a failed process operation: ESRCH 404 process_not_found, ENOTTY 400 not_a_tty,
 * EEXIST 409 tag_in_use, others as api_reply_moat_error. Frees *err. */
int api_reply_proc_error(struct api_req *r, moat_error **err);
/* Streams (SSE, WebSocket) check this to end when moatd stops; threads that outlive their
 * request (WebSocket) hold the api while they run. */
bool api_stopping(const struct moat_api *a);
void api_hold(struct moat_api *a);
void api_release(struct moat_api *a);
/* The client socket of the request (for disconnect checks), or -1. */
int api_conn_fd(const struct api_req *r);
/* True when the client on fd (from api_conn_fd; -1: never) hung up or its socket failed. */
bool api_client_gone(int fd);
/* A response of size bytes streamed from rd in API_FILE_BLOCK pieces (GET .../files and E2B's
 * GET /files). rd is owned by the response from here on, also when NULL (out of memory) is
 * returned; desc names the file in logs. */
struct MHD_Response *api_file_response(struct moat_guest_reader *rd, uint64_t size, const char *desc);

/* Time travel (api_timetravel.c, issue 4). */
int api_h_pause(struct api_req *r, json_t *body);
int api_h_resume(struct api_req *r, json_t *body);
int api_h_hibernate(struct api_req *r, json_t *body);
int api_h_wake(struct api_req *r, json_t *body);
int api_h_snapshot_create(struct api_req *r, json_t *body);
int api_h_fork(struct api_req *r, json_t *body);
int api_h_explore(struct api_req *r, json_t *body);
int api_h_rollback(struct api_req *r, json_t *body);
int api_h_snapshots_list(struct api_req *r);
/* issue 5 (api_network.c) */
int api_h_network_get(struct api_req *r);
int api_h_network_put(struct api_req *r, json_t *body);
int api_h_network_log(struct api_req *r);
int api_h_snapshot_get(struct api_req *r);
int api_h_snapshot_delete(struct api_req *r);

/* Exposed ports (ports.c, issue 5). The proxy route: begin from req_begin (true when a reply was
 * queued), body chunks (-1 with *err: abort), then api_h_port_proxy once the body is in. */
int api_h_ports_list(struct api_req *r);
int api_h_port_get(struct api_req *r);
int api_h_port_expose(struct api_req *r, json_t *body);
int api_h_port_unexpose(struct api_req *r);
bool api_port_proxy_begin(struct api_req *r);
int api_port_proxy_body(struct api_req *r, const char *data, size_t len, moat_error **err);
int api_h_port_proxy(struct api_req *r);
/* "PORT-ID.DOMAIN[:P]" (a Host header) -> port (1..65535) and id; *domain (may be NULL) points at
 * DOMAIN[:P] in host. Pure; shared by the E2B front end and the proxy listener. */
bool api_parse_port_host(const char *host, unsigned *port, char id[MOAT_ID_LEN + 1], const char **domain);

/* MCP (api_mcp.c, issue 7): r->body / r->body_len hold the raw request body. */
int api_h_mcp_sandbox(struct api_req *r);
int api_h_mcp_workspace(struct api_req *r);

/* The E2B front end (e2b*.c, issue 6). */
/* Called first for every request, before v1 routing: true when the request belongs to the E2B
 * front end (its control-plane paths, or a sandbox call routed by the E2b-Sandbox-Id header or a
 * "PORT-ID.DOMAIN" Host). Sets r->e2b then. */
bool api_e2b_claims(struct api_req *r, const char *url, const char *method);
/* First call of a claimed request: auth, routing, early errors. True when a reply was queued
 * already (the body is then not read). */
bool api_e2b_begin(struct api_req *r, const char *url, const char *method);
/* Body bytes of a claimed request: 0, or -1 with *err set (the connection is then aborted with
 * that error). */
int api_e2b_body(struct api_req *r, const char *data, size_t len, moat_error **err);
/* Body complete: queues exactly one response. */
void api_e2b_dispatch(struct api_req *r);

/* Code contexts (api_contexts.c). */
int api_h_ctx_create(struct api_req *r, json_t *body);
int api_h_ctx_list(struct api_req *r);
int api_h_ctx_delete(struct api_req *r);
int api_h_ctx_restart(struct api_req *r, json_t *body);
int api_h_ctx_run(struct api_req *r, json_t *body);

/* Metrics (api_metrics.c). */
int api_h_metrics(struct api_req *r);
int api_h_sandbox_metrics(struct api_req *r);
/* E2B's GET /sandboxes/{id}/metrics (r->org authenticated): a list with the current sample. */
int api_e2b_metrics(struct api_req *r, const char *id);

/* Sandbox JSON per CONTRACT.md (api_sandboxes.c). */
json_t *api_sandbox_json(const struct moat_sandbox_info *s);

#endif

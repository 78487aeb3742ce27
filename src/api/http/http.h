/* http.h -- the HTTP transport every front end is served by, and what front ends share: the route
 * table, request state, query and body validation, codecs, replies and streams
 *
 * Pure helpers (routing, body validation, UTF-8/RFC 3339, errno -> HTTP mapping, listen address
 * parsing) live in route.c, args.c, json.c, codec.c and errors.c and use nothing of control/
 * beyond its header, so unit tests and fuzz targets can link them alone. The transport
 * (server.c) knows no front end: it serves the routes and claimers api.c hands it.
 */
#ifndef MOAT_API_HTTP_H
#define MOAT_API_HTTP_H

#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "../../common/codec.h"
#include "../../common/error.h"
#include "../../common/util.h"
#include "../../control/control.h"
#include "../../proto/client/guest_client.h"
#include "../api.h"

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

/* ---- routes (http/route.c) ---- */

enum api_match {
  API_MATCH_OK = 0,
  API_MATCH_NOT_FOUND,  /* 404: no such path (or an id that cannot exist) */
  API_MATCH_BAD_METHOD, /* 405: path known, method not; allow says which */
};

struct api_req;

/* What a route's request does besides having its handler called with the whole body. */
enum api_route_flag {
  API_RT_JSON = 1u << 0,   /* the body is a JSON object (empty: {}), parsed before the handler */
  API_RT_PUBLIC = 1u << 1, /* no API key needed */
  API_RT_STREAM = 1u << 2, /* a long-lived stream: admitted under the stream caps (fair.h) */
  API_RT_KEY_IN_QUERY =
      1u << 3,            /* the key may also come as ?api_key= (a browser's WebSocket has no headers) */
  API_RT_ADMIN = 1u << 4, /* admin keys only (managing keys) */
  API_RT_SELF = 1u << 5,  /* with API_RT_ADMIN: also the key {kid} names, when it is the caller's */
  /* a readonly key may send it with any method: the front end refuses the calls that change things
   * itself (MCP over POST: each tool says whether it only reads) */
  API_RT_ROLE_RPC = 1u << 6,
  API_RT_PLATFORM = 1u << 7, /* the platform admin key only (managing orgs) */
  API_RT_ORG = 1u << 8,      /* the platform admin key, or a key of the org {sid} names (else 404) */
  API_RT_ANY_KEY = 1u << 9,  /* also the platform admin key (GET /v1/me) */
};
/* Roles, checked where a request is routed (server.c) before any handler: a readonly key may call
 * GET and HEAD routes only; a route with API_RT_ADMIN needs an admin key. Refusals are 403
 * forbidden naming the role. */

/* A route (or a whole front end) that takes its request over: the body streams through body()
 * instead of being collected, finish() answers once it is in, release() frees what begin() made
 * (also when the request ends early). With own_auth, begin() runs before the transport's auth and
 * caps and does its own; else after them. Any may be NULL. */
struct api_route_hooks {
  bool own_auth;
  bool (*begin)(struct api_req *r); /* true: a reply was queued (the body is then not read) */
  int (*body)(struct api_req *r, const char *data, size_t len, moat_error **err); /* -1: abort with *err */
  int (*finish)(struct api_req *r);
};

/* One line of a front end's route table. */
struct api_route_def {
  const char *method;                              /* "GET", "POST", ... */
  const char *pattern;                             /* "/v1/sandboxes/{id}/exec" (see route.c) */
  const char *name;                                /* "exec": the access log, docs/openapi.yaml's x-route */
  int (*handler)(struct api_req *r, json_t *body); /* body: the parsed object with API_RT_JSON, else NULL */
  unsigned flags;                                  /* API_RT_* */
  const struct api_route_hooks *hooks;             /* NULL for a plain route */
};

/* A request's route and what its path named. */
struct api_route {
  const struct api_route_def *def; /* NULL unless matched */
  char id[MOAT_ID_LEN + 1];        /* {id} */
  char name[64];                   /* {name} */
  int pid;                         /* {proc}: the pid, or 0 when addressed by tag */
  char tag[API_MAX_TAG + 1];       /* {proc} addressed by tag */
  char cid[64];                    /* {cid} as given (checked by the handler) */
  char sid[64];                    /* {sid} as given (checked by the handler) */
  char kid[64];                    /* {kid} an API key id as given (checked by the handler) */
  unsigned port;                   /* {port}: 1..65535, or 0 when the segment is not one */
  char allow[96];                  /* BAD_METHOD: the Allow header's value */
};

/* The routes of every front end, in the order they were added (the first match wins). */
struct api_router;
struct api_router *api_router_new(void);
void api_router_free(struct api_router *rt);
/* Adds n routes; defs must outlive the router (front ends' tables are static). */
void api_router_add(struct api_router *rt, const struct api_route_def *defs, size_t n);
size_t api_router_count(const struct api_router *rt);
const struct api_route_def *api_router_at(const struct api_router *rt, size_t i);
/* Matches method + decoded path. Returns an api_match and fills r. Pure. */
enum api_match api_router_match(const struct api_router *rt, const char *method, const char *path,
                                struct api_route *r);
/* The matched route's name, or "none". */
const char *api_route_name(const struct api_route *r);
/* True when s matches ^sb-[a-z0-9]{17}$. */
bool api_valid_sandbox_id(const char *s);
/* True when s matches ^[a-z0-9][a-z0-9._-]{0,62}$. */
bool api_valid_template_name(const char *s);
/* True when s is a process tag: [A-Za-z0-9_.-]{1,64}, not all digits (that reads as a pid). */
bool api_valid_tag(const char *s);
/* Signal number of "TERM" "KILL" "INT" "HUP" "QUIT" "USR1" "USR2" "STOP" "CONT" (an optional
 * "SIG" prefix allowed), or 0 for anything else. Pure. */
int api_signal_parse(const char *name);

/* A front end that claims requests before routing (E2B's, which routes by host and headers too). */
struct api_claimer {
  bool (*claims)(struct api_req *r); /* true: the request is this front end's (r->path, r->method set) */
  const struct api_route_hooks *hooks;
};

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
/* For a route that takes no query parameters: 0, or -1 after answering 400 naming the first. */
int api_args_none(struct api_req *r);
/* Query parameter parsers: 0 and *out, or -1 EINVAL naming the parameter. */
int api_arg_bool(const struct api_args *a, const char *key, bool def, bool *out, moat_error **err);
/* A time as RFC 3339 ("2026-01-02T03:04:05.678Z", "+01:00" offsets) or Unix milliseconds -> *ms.
 * 0, or -1 when it is neither. */
int api_parse_time_ms(const char *s, int64_t *ms);
int api_arg_path(const struct api_args *a, const char *key, const char **out, moat_error **err);
int api_arg_user(const struct api_args *a, const char **out, moat_error **err);
int api_arg_depth(const struct api_args *a, uint32_t *out, moat_error **err);
int api_arg_mode(const struct api_args *a, uint32_t *out, moat_error **err);

/* ---- JSON bodies (json.c) ---- */

/* Parses a request body. Empty body -> empty object when empty_ok, else EINVAL. Malformed JSON ->
 * EBADMSG with jansson's text, line, column and position; not an object -> EINVAL. */
int api_body_parse(const char *buf, size_t len, bool empty_ok, json_t **out, moat_error **err);

/* POST /v1/sandboxes. On success spec's borrowed pointers point into body (keep it alive). */
int api_parse_create(json_t *body, uint64_t host_memory_mb, struct moat_sandbox_spec *spec, moat_error **err);
/* POST /v1/databases: {name, size_mb, idle_seconds, metadata}; spec borrows from body. EINVAL naming
 * the field (an unknown one too). */
int api_parse_database_create(json_t *body, struct moat_database_spec *spec, moat_error **err);
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
  bool kill_on_disconnect;     /* default false */
  const char *tag;             /* borrowed from body, or NULL */
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

/* ---- codecs (codec.c) ---- */

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

/* Starts the gate (gate.h) with lim's timeouts for one more listener: 0 or -1. The listener
 * stops the gate (api_gate_stop) when it stops. */
int api_limits_apply(const struct moat_api_limits *lim, moat_error **err);
/* The silence after which an SSE stream gets its source's keep-alive (stream.c; set once at start). */
void api_stream_set_keepalive_ms(unsigned ms);

/* ---- the transport (http/server.c) ---- */

struct moat_api;

/* A front end as the transport serves it (api.c lists them): its routes, the requests it claims
 * before routing, and its state. open makes the state before the listener starts (a failure stops
 * the start), close frees it after the listener stopped and every request ended; handlers reach it
 * with api_front_state. Any member may be NULL. */
struct api_front {
  const char *name;
  void (*routes)(struct api_router *rt);
  const struct api_claimer *claimer;
  int (*open)(struct moat_api *a, const struct moat_api_config *cfg, void **state, moat_error **err);
  void (*close)(void *state);
};
/* The state f's open made for a (NULL when f has none or is not served by a). */
void *api_front_state(const struct moat_api *a, const struct api_front *f);
/* What a front end's state may borrow from its api for as long as the api runs. */
struct moat_control *api_control_of(const struct moat_api *a);
struct api_fair *api_fair_of(const struct moat_api *a); /* the caps of fair.h */

/* Starts the listener of cfg serving the front ends (static, borrowed; routes matched in their
 * order). 0 or -1. */
int api_http_start(struct moat_api **out, struct moat_control *control, const struct moat_api_config *cfg,
                   const struct api_front *const *fronts, size_t n_fronts, moat_error **err);

/* ---- requests (http/server.c) ---- */

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
  char *org;    /* authenticated org, owned */
  bool has_key; /* key: the API key that authenticated the request */
  struct moat_key_info key;
  unsigned status; /* status queued, for the access log */
  bool responded;  /* a response was queued (or written) */
  char *raw_uri;   /* the request target as received (path and query, not decoded), owned */
  /* the body, collected for routes whose hooks do not take it (NUL-terminated) */
  char *body;
  size_t body_len, body_cap;
  /* the route's or the claiming front end's hooks (route.h), or NULL */
  const struct api_route_hooks *hooks;
  /* GET pty: the WebSocket state until the upgrade takes it (freed with the request otherwise) */
  void *upgrade;
  void (*upgrade_free)(void *);
  /* Its slot under the per-org and per-sandbox caps (fair.c), from auth to the request's end (a
   * WebSocket takes it along: api_req_take_ticket). */
  struct api_ticket *ticket;
  /* The front end's own state for this request (a claimed E2B call, a streamed upload, a proxied
   * request), freed with the request. */
  void *front;
  void (*front_free)(void *);
};

/* Whether the request's key may call a route of flags with method: 0, or -1 after answering 403
 * forbidden naming the key's role. */
int api_req_authorize(struct api_req *r, const char *method, unsigned flags);
/* True when the request's key is readonly: a reply then leaves out secrets that would let it do more
 * (a port's access token, E2B's envd access token). */
bool api_req_readonly(const struct api_req *r);
/* The answer to a failed auth: 401 unauthorized, saying when the key expired (EKEYEXPIRED). */
int api_reply_unauthorized(struct api_req *r, const moat_error *err, const char *hint);

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

/* A streamed response (http/stream.c): the transport asks the source for records until it is done,
 * sends keep-alives while it is quiet, and notices a client that left and a moatd that stops.
 * next appends whole records to out (waiting up to about timeout_ms when it has none) and sets
 * *done once the last is in out; gone (may be NULL) is told the client left before the end;
 * stopping (NULL: an SSE error event "unavailable") appends the last record when moatd stops;
 * free releases ctx once the response is done with (also when the client went away). */
struct moat_buf;
struct api_stream_source {
  void (*next)(void *ctx, struct moat_buf *out, int timeout_ms, bool *done);
  void (*gone)(void *ctx);
  void (*stopping)(void *ctx, struct moat_buf *out);
  void (*free)(void *ctx);
  /* May be NULL. True: once what next wrote is sent, the connection is cut without the stream's
   * end (as a proxy in front of a sandbox that vanished would), instead of ending it cleanly. */
  bool (*aborted)(void *ctx);
  void *ctx;
  const char *keepalive; /* written after 15 s of silence; NULL: an SSE comment */
  int poll_ms;           /* the longest next may wait; 0: 500 */
};
/* Queues the stream (src->ctx is then owned by it, also on failure) with content_type; first:
 * text sent at once, or NULL. */
int api_stream_reply(struct api_req *r, const struct api_stream_source *src, const char *content_type,
                     const char *first);
/* "event: NAME\ndata: JSON\n\n" appended to out; data is consumed. */
void api_sse_format(struct moat_buf *out, const char *name, json_t *data);
/* A quota error's message ("... over quota Q: limit L, use U ...") -> its parts (pure). */
bool api_quota_detail(const char *msg, char quota[32], long long *limit, long long *use);
/* {code: "quota_exceeded", message, quota, limit, use} for a MOAT_E_QUOTA message. */
json_t *api_quota_error_json(const char *msg);
/* Turns an ENOENT of an exec into EINVAL when the sandbox is alive (a missing cwd). */
void api_exec_enoent(struct api_req *r, moat_error *err);
/* A long-lived request's key: streams end once it is revoked (a key delete, its org's delete).
 * init takes the request's key (none: never revoked); revoked is cheap while no key was revoked
 * anywhere (one atomic read) and asks the store only when one was. */
struct api_key_watch {
  struct moat_control *c;
  char id[MOAT_KEY_ID_LEN + 1]; /* "" for a request without a key */
  uint64_t gen;
  bool revoked;
};
void api_key_watch_init(struct api_key_watch *w, const struct api_req *r);
/* The same for key key_id ("" or NULL: never revoked) of control c. */
void api_key_watch_init_key(struct api_key_watch *w, struct moat_control *c, const char *key_id);
bool api_key_watch_revoked(struct api_key_watch *w);
/* Streams (SSE, WebSocket) check this to end when moatd stops; threads that outlive their
 * request (WebSocket) hold the api while they run. */
bool api_stopping(const struct moat_api *a);
void api_hold(struct moat_api *a);
void api_release(struct moat_api *a);
/* The client socket of the request (for disconnect checks), or -1. */
int api_conn_fd(const struct api_req *r);
/* True when the client on fd (from api_conn_fd; -1: never) hung up or its socket failed. */
bool api_client_gone(int fd);
/* Resets the TCP connection on fd (from api_conn_fd; -1: nothing) now: an RST, not a FIN, so
 * that a response cut short reads as a dropped connection, as an HTTP/2 stream reset does, not as
 * a body that ended early. Bytes not yet sent are lost; the fd stays the server's to close. */
void api_conn_reset(int fd);
/* A response of size bytes streamed from rd in API_FILE_BLOCK pieces (GET .../files and E2B's
 * GET /files). rd is owned by the response from here on, also when NULL (out of memory) is
 * returned; desc names the file in logs. */
struct MHD_Response *api_file_response(struct moat_guest_reader *rd, uint64_t size, const char *desc);

/* "PORT-ID.DOMAIN[:P]" (a Host header) -> port (1..65535) and id; *domain (may be NULL) points at
 * DOMAIN[:P] in host. Pure; shared by the E2B front end and the proxy listener. */
bool api_parse_port_host(const char *host, unsigned *port, char id[MOAT_ID_LEN + 1], const char **domain);

/* Sandbox JSON per CONTRACT.md (json.c): v1 and MCP answer with it. */
json_t *api_sandbox_json(const struct moat_sandbox_info *s);
/* Database JSON per CONTRACT.md's Databases section, its connection (password included: the org's
 * to see) at c's proxy address: v1 and MCP answer with it. */
/* A database as CONTRACT.md shows it to the key of r: a readonly key is not shown its password (nor
 * the URLs, which hold it). */
json_t *api_database_json(struct api_req *r, const struct moat_database_info *d);

#endif

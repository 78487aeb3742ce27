/* mcp.c -- the Model Context Protocol over streamable HTTP: sessions, JSON-RPC 2.0, initialize
 *
 * Two endpoints speak MCP: POST /v1/sandboxes/{id}/mcp (tools that act inside one sandbox) and
 * POST /v1/mcp (tools that run a fleet of the org's sandboxes); the tools live in
 * tools.c. Transport (MCP "Streamable HTTP", revisions 2024-11-05 .. 2025-11-25):
 *  - POST carries one JSON-RPC message or a batch (array). Requests are answered with
 *    Content-Type application/json: one response object, or an array for a batch. A POST of only
 *    notifications / responses is answered 202 with no body. This server never answers with SSE.
 *  - initialize opens a session: the response carries Mcp-Session-Id; every later request of the
 *    session must send it (400 without, 404 when unknown, expired or ended). Sessions belong to
 *    the org of the API key and to the endpoint (and sandbox) that opened them, are bounded in
 *    number and expire after MCP_SESSION_IDLE_S without use.
 *  - GET (the server-initiated SSE stream) is 405: this server sends no requests or
 *    notifications of its own. DELETE with Mcp-Session-Id ends the session (204).
 *  - MCP-Protocol-Version, when present, must be a revision this server supports (else 400).
 *    An Origin header must name the host the request was sent to (else 403), against DNS
 *    rebinding.
 * Errors of the HTTP layer (auth, unknown sandbox, session, headers) are moat's JSON errors
 * {code, message}; errors of the JSON-RPC layer are JSON-RPC error objects (-32700 parse error and
 * -32600 invalid request with HTTP 400 when the POST held that single message).
 */
#include <errno.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../common/log.h"
#include "mcp.h"

#define MCP_SESSION_IDLE_S 1800     /* a session unused this long is forgotten ($MOAT_MCP_SESSION_IDLE_S) */
#define MCP_MAX_SESSIONS_PER_ORG 64 /* opening one more ends the org's least recently used */
#define MCP_MAX_SESSIONS 4096       /* all orgs together; beyond: 503 */
#define MCP_SESSION_ID_BYTES 16     /* 32 hex digits */
#define MCP_SEP1303_SINCE "2025-11-25" /* tool argument errors are isError results from this revision on */

/* ---- sessions ---- */

struct mcp_session {
  char id[MCP_SESSION_ID_BYTES * 2 + 1];
  char *org;
  char sandbox[MOAT_ID_LEN + 1]; /* "" for the workspace endpoint */
  char version[16];
  uint64_t last_ns;
  bool initialized; /* notifications/initialized seen */
};

/* The MCP front end's state: its sessions. */
struct mcp_sessions {
  pthread_mutex_t mu; /* guards the rest */
  struct mcp_session *v;
  size_t n, cap;
  uint64_t idle_limit_ns;
};

static void session_drop_locked(struct mcp_sessions *ss, size_t i) {
  free(ss->v[i].org);
  ss->v[i] = ss->v[--ss->n];
}

/* No sessions yet; they expire after MCP_SESSION_IDLE_S idle, or $MOAT_MCP_SESSION_IDLE_S (1..86400
 * seconds) when set. */
static int mcp_open(struct moat_api *a, const struct moat_api_config *cfg, void **state, moat_error **err) {
  struct mcp_sessions *ss = xcalloc(1, sizeof(*ss));
  pthread_mutex_init(&ss->mu, NULL);
  uint64_t sec = MCP_SESSION_IDLE_S, v;
  const char *e = getenv("MOAT_MCP_SESSION_IDLE_S");
  if (e && parse_u64(e, &v) == 0 && v >= 1 && v <= 86400)
    sec = v;
  else if (e)
    log_warn("MOAT_MCP_SESSION_IDLE_S='%s' is not 1..86400: sessions expire after %d s", e,
             MCP_SESSION_IDLE_S);
  ss->idle_limit_ns = sec * 1000000000ULL;
  *state = ss;
  return 0;
}

static void mcp_close(void *state) {
  struct mcp_sessions *ss = state;
  while (ss->n > 0)
    session_drop_locked(ss, 0);
  free(ss->v);
  pthread_mutex_destroy(&ss->mu);
  free(ss);
}

static void sessions_expire_locked(struct mcp_sessions *ss, uint64_t now) {
  for (size_t i = 0; i < ss->n;) {
    if (now - ss->v[i].last_ns > ss->idle_limit_ns)
      session_drop_locked(ss, i);
    else
      i++;
  }
}

/* Opens a session for org on sandbox (NULL: workspace) speaking version; writes its id into id.
 * 0, or -1 with EAGAIN when the server holds MCP_MAX_SESSIONS live sessions. */
static int session_open(struct mcp_sessions *ss, const char *org, const char *sandbox, const char *version,
                        char id[MCP_SESSION_ID_BYTES * 2 + 1], moat_error **err) {
  unsigned char raw[MCP_SESSION_ID_BYTES];
  random_bytes(raw, sizeof(raw));
  for (size_t i = 0; i < sizeof(raw); i++)
    snprintf(id + 2 * i, 3, "%02x", raw[i]);
  uint64_t now = now_ns();
  pthread_mutex_lock(&ss->mu);
  sessions_expire_locked(ss, now);
  size_t mine = 0, lru = SIZE_MAX;
  for (size_t i = 0; i < ss->n; i++) {
    if (strcmp(ss->v[i].org, org) != 0)
      continue;
    mine++;
    if (lru == SIZE_MAX || ss->v[i].last_ns < ss->v[lru].last_ns)
      lru = i;
  }
  if (mine >= MCP_MAX_SESSIONS_PER_ORG)
    session_drop_locked(ss, lru);
  else if (ss->n >= MCP_MAX_SESSIONS) {
    pthread_mutex_unlock(&ss->mu);
    return moat_error_set(err, EAGAIN,
                          "too many MCP sessions on this server; end some (DELETE) or retry later");
  }
  if (ss->n == ss->cap) {
    ss->cap = ss->cap ? ss->cap * 2 : 16;
    ss->v = xrealloc(ss->v, ss->cap * sizeof(*ss->v));
  }
  struct mcp_session *s = &ss->v[ss->n++];
  memset(s, 0, sizeof(*s));
  memcpy(s->id, id, sizeof(s->id));
  s->org = xstrdup(org);
  snprintf(s->sandbox, sizeof(s->sandbox), "%s", sandbox ? sandbox : "");
  snprintf(s->version, sizeof(s->version), "%s", version);
  s->last_ns = now;
  pthread_mutex_unlock(&ss->mu);
  return 0;
}

/* Finds session id of org on sandbox (NULL: workspace), refreshes it and copies its protocol
 * version into version. With end, removes it. initialized: mark it initialized. 0 or -1 (not
 * found: unknown, expired, ended, another org's or another endpoint's). */
static int session_use(struct mcp_sessions *ss, const char *id, const char *org, const char *sandbox,
                       char version[16], bool end, bool initialized) {
  int ret = -1;
  uint64_t now = now_ns();
  pthread_mutex_lock(&ss->mu);
  sessions_expire_locked(ss, now);
  for (size_t i = 0; i < ss->n; i++) {
    struct mcp_session *s = &ss->v[i];
    if (strcmp(s->id, id) != 0)
      continue;
    if (strcmp(s->org, org) == 0 && strcmp(s->sandbox, sandbox ? sandbox : "") == 0) {
      if (version)
        memcpy(version, s->version, 16);
      s->last_ns = now;
      if (initialized)
        s->initialized = true;
      if (end)
        session_drop_locked(ss, i);
      ret = 0;
    }
    break;
  }
  pthread_mutex_unlock(&ss->mu);
  return ret;
}

/* ---- replies ---- */

/* Queues status with body (consumed; NULL = no body) as application/json, plus Mcp-Session-Id
 * and Allow when given. */
static int mcp_reply(struct api_req *r, unsigned status, json_t *body, const char *session_id,
                     const char *allow) {
  char *s = NULL;
  size_t n = 0;
  if (body) {
    s = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    if (!s)
      abort(); /* out of memory */
    n = strlen(s);
    s = xrealloc(s, n + 2);
    s[n++] = '\n';
    s[n] = '\0';
  }
  struct MHD_Response *resp = s ? MHD_create_response_from_buffer(n, s, MHD_RESPMEM_MUST_FREE)
                                : MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
  if (!resp) {
    free(s);
    return -1;
  }
  if (s)
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
  if (session_id)
    MHD_add_response_header(resp, "Mcp-Session-Id", session_id);
  if (allow)
    MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, allow);
  int ret = api_reply_response(r, status, resp);
  MHD_destroy_response(resp);
  return ret;
}

static int mcp_error(struct api_req *r, unsigned status, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int mcp_error(struct api_req *r, unsigned status, const char *code, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  return mcp_reply(r, status, api_error_json(code, msg), NULL, NULL);
}

/* A JSON-RPC error response. id is borrowed (NULL or an invalid id: null). */
static json_t *rpc_error(json_t *id, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static json_t *rpc_error(json_t *id, int code, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  return json_pack("{s:s, s:O, s:{s:i, s:s}}", "jsonrpc", "2.0", "id", id ? id : json_null(), "error", "code",
                   code, "message", msg);
}

static json_t *rpc_result(json_t *id, json_t *result) {
  return json_pack("{s:s, s:O, s:o}", "jsonrpc", "2.0", "id", id, "result", result);
}

/* ---- JSON-RPC messages ---- */

/* What the request is about, for the tools and for answers. */
struct mcp_ctx {
  struct api_req *r;
  struct mcp_sessions *ss;
  enum mcp_endpoint ep;
  const char *session_id;
  char version[16];
};

static const char *sandbox_of(const struct mcp_ctx *c) {
  return c->ep == MCP_EP_SANDBOX ? c->r->route.id : NULL;
}

static json_t *instructions(const struct mcp_ctx *c) {
  if (c->ep == MCP_EP_SANDBOX)
    return json_sprintf(
        "Tools act inside the moat sandbox %s, an isolated Linux machine: run shell commands "
        "(as root, /bin/sh -c) and read, write and list its files. Relative paths are against "
        "/root.",
        c->r->route.id);
  return json_string(
      "Tools create and run isolated Linux sandboxes (moat): create_sandbox returns an id; "
      "exec runs a shell command in one; fork_sandbox copies a running one; hibernate_sandbox "
      "frees its memory until the next exec; kill_sandbox ends it. Sandboxes die at their TTL.");
}

/* tools/call params -> result, or a JSON-RPC error. */
static json_t *do_tools_call(const struct mcp_ctx *c, json_t *id, json_t *params) {
  json_t *name = json_object_get(params, "name");
  if (!json_is_string(name))
    return rpc_error(id, -32602, "tools/call needs \"name\" (a string)");
  json_t *args = json_object_get(params, "arguments");
  json_t *empty = NULL;
  if (!args || json_is_null(args))
    args = empty = json_object();
  else if (!json_is_object(args))
    return rpc_error(id, -32602, "tools/call \"arguments\" must be an object");
  struct mcp_call call = {
      .r = c->r, .ep = c->ep, .bad_args_as_result = strcmp(c->version, MCP_SEP1303_SINCE) >= 0};
  int code = 0;
  char *msg = NULL;
  json_t *res = mcp_tool_call(&call, json_string_value(name), args, &code, &msg);
  json_decref(empty);
  if (!res) {
    json_t *e = rpc_error(id, code, "%s", msg ? msg : "tool call failed");
    free(msg);
    return e;
  }
  return rpc_result(id, res);
}

/* Answers one request of an open session (never initialize). */
static json_t *do_request(const struct mcp_ctx *c, json_t *m, json_t *id) {
  const char *method = json_string_value(json_object_get(m, "method"));
  json_t *params = json_object_get(m, "params");
  if (params && !json_is_object(params))
    return rpc_error(id, -32602, "\"params\" must be an object");
  if (strcmp(method, "initialize") == 0)
    return rpc_error(id, -32600, "initialize must be sent alone, as the first message of a new session");
  if (strcmp(method, "ping") == 0)
    return rpc_result(id, json_object());
  if (strcmp(method, "tools/list") == 0) {
    json_t *cursor = params ? json_object_get(params, "cursor") : NULL;
    if (cursor && !json_is_null(cursor))
      return rpc_error(id, -32602, "invalid cursor: this server lists all tools on one page");
    bool reads_only = c->r && c->r->has_key && c->r->key.role == MOAT_ROLE_READONLY;
    return rpc_result(id, json_pack("{s:o}", "tools", mcp_tools_list(c->ep, reads_only)));
  }
  if (strcmp(method, "tools/call") == 0) {
    if (!params)
      return rpc_error(id, -32602, "tools/call needs params {name, arguments}");
    return do_tools_call(c, id, params);
  }
  return rpc_error(id, -32601, "Method not found: %.128s", method);
}

/* Handles one message of an open session: a response to send (new reference), or NULL for a
 * notification or a client's response. *request tells whether m was a request. */
static json_t *do_message(const struct mcp_ctx *c, json_t *m, bool *request) {
  json_t *id;
  const char *why = NULL;
  *request = false;
  switch (mcp_classify(m, &id, &why)) {
  case MCP_MSG_INVALID:
    *request = true;
    return rpc_error(id, -32600, "Invalid Request: %s", why);
  case MCP_MSG_RESPONSE:
    return NULL; /* this server sends no requests; nothing waits for an answer */
  case MCP_MSG_NOTIFICATION: {
    const char *method = json_string_value(json_object_get(m, "method"));
    if (strcmp(method, "notifications/initialized") == 0)
      session_use(c->ss, c->session_id, c->r->org, sandbox_of(c), NULL, false, true);
    /* notifications/cancelled and others are accepted and ignored: a tool call already running
     * (in another POST) is not interrupted; its command ends by itself or at its timeout_ms
     * (moat_control_exec offers no way to stop it early, and it keeps the sandbox marked busy). */
    return NULL;
  }
  case MCP_MSG_REQUEST:
    *request = true;
    return do_request(c, m, id);
  }
  return NULL;
}

/* initialize (a single request without a session): negotiates, opens the session. */
static int do_initialize(struct mcp_ctx *c, json_t *m, json_t *id) {
  json_t *params = json_object_get(m, "params");
  json_t *pv = json_is_object(params) ? json_object_get(params, "protocolVersion") : NULL;
  if (!json_is_string(pv))
    return mcp_reply(c->r, 200, rpc_error(id, -32602, "initialize needs params.protocolVersion (a string)"),
                     NULL, NULL);
  json_t *caps = json_object_get(params, "capabilities");
  json_t *info = json_object_get(params, "clientInfo");
  if ((caps && !json_is_object(caps)) || (info && !json_is_object(info)))
    return mcp_reply(c->r, 200,
                     rpc_error(id, -32602, "initialize: capabilities and clientInfo must be objects"), NULL,
                     NULL);
  const char *want = json_string_value(pv);
  snprintf(c->version, sizeof(c->version), "%s", mcp_version_supported(want) ? want : MCP_LATEST_VERSION);
  char sid[MCP_SESSION_ID_BYTES * 2 + 1];
  moat_error *err = NULL;
  if (session_open(c->ss, c->r->org, sandbox_of(c), c->version, sid, &err) < 0) {
    int ret = mcp_error(c->r, 503, "unavailable", "%s", moat_error_msg(err));
    moat_error_free(&err);
    return ret;
  }
  json_t *res = json_pack("{s:s, s:{s:{s:b}}, s:{s:s, s:s, s:s}, s:o}", "protocolVersion", c->version,
                          "capabilities", "tools", "listChanged", 0, "serverInfo", "name", "moat", "title",
                          c->ep == MCP_EP_SANDBOX ? "moat sandbox" : "moat workspace", "version",
                          api_version(c->r), "instructions", instructions(c));
  return mcp_reply(c->r, 200, rpc_result(id, res), sid, NULL);
}

static const char *header(struct api_req *r, const char *name) {
  return MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, name);
}

/* Checks the session headers of a request that is not initialize. Replies and returns -1 on a
 * bad one; else fills c->session_id and c->version. */
static int session_headers(struct mcp_ctx *c, bool end) {
  const char *sid = header(c->r, "Mcp-Session-Id");
  if (!sid || !*sid)
    return mcp_error(c->r, 400, "invalid_request",
                     "the Mcp-Session-Id header is required (send initialize first to open a session)"),
           -1;
  const char *pv = header(c->r, "MCP-Protocol-Version");
  if (pv && !mcp_version_supported(pv))
    return mcp_error(
               c->r, 400, "invalid_request",
               "unsupported MCP-Protocol-Version '%.32s' (supported: 2025-11-25, 2025-06-18, 2025-03-26, "
               "2024-11-05)",
               pv),
           -1;
  if (session_use(c->ss, sid, c->r->org, sandbox_of(c), c->version, end, false) < 0)
    return mcp_error(c->r, 404, "session_not_found",
                     "no MCP session '%.64s' here (ended or expired): initialize a new one", sid),
           -1;
  c->session_id = sid;
  return 0;
}

static int mcp_post(struct mcp_ctx *c) {
  struct api_req *r = c->r;
  const char *ct = header(r, MHD_HTTP_HEADER_CONTENT_TYPE);
  if (!ct || !mcp_media_has(ct, "application/json"))
    return mcp_error(r, 415, "unsupported_media_type",
                     "MCP messages are POSTed as Content-Type: application/json");
  const char *accept = header(r, MHD_HTTP_HEADER_ACCEPT);
  if (accept && !mcp_media_has(accept, "application/json") && !mcp_media_has(accept, "application/*") &&
      !mcp_media_has(accept, "*/*"))
    return mcp_error(r, 406, "not_acceptable", "this server answers with application/json: Accept it");

  json_error_t je;
  json_t *msg = json_loadb(r->body ? r->body : "", r->body_len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
  if (!msg)
    return mcp_reply(
        r, 400, rpc_error(NULL, -32700, "Parse error: %s (line %d, column %d)", je.text, je.line, je.column),
        NULL, NULL);
  int ret;
  bool batch = json_is_array(msg);
  if (batch && json_array_size(msg) == 0) {
    ret = mcp_reply(r, 400, rpc_error(NULL, -32600, "Invalid Request: an empty batch"), NULL, NULL);
    goto out;
  }
  if (!batch) {
    json_t *id;
    const char *why;
    enum mcp_msg_kind k = mcp_classify(msg, &id, &why);
    if (k == MCP_MSG_INVALID) {
      ret = mcp_reply(r, 400, rpc_error(id, -32600, "Invalid Request: %s", why), NULL, NULL);
      goto out;
    }
    if (k == MCP_MSG_REQUEST &&
        strcmp(json_string_value(json_object_get(msg, "method")), "initialize") == 0) {
      ret = do_initialize(c, msg, id);
      goto out;
    }
  }
  if (session_headers(c, false) < 0) {
    ret = -1;
    goto out;
  }
  json_t *out = json_array();
  bool any_request = false;
  size_t n = batch ? json_array_size(msg) : 1;
  for (size_t i = 0; i < n; i++) {
    bool request;
    json_t *resp = do_message(c, batch ? json_array_get(msg, i) : msg, &request);
    any_request |= request;
    if (resp)
      json_array_append_new(out, resp);
  }
  if (!any_request) {
    json_decref(out);
    ret = mcp_reply(r, 202, NULL, NULL, NULL);
  } else if (!batch) {
    json_t *one = json_incref(json_array_get(out, 0));
    json_decref(out);
    ret = mcp_reply(r, 200, one, NULL, NULL);
  } else {
    ret = mcp_reply(r, 200, out, NULL, NULL);
  }
out:
  json_decref(msg);
  return ret;
}

static int mcp_handle(struct api_req *r, enum mcp_endpoint ep) {
  static const char *const none[] = {NULL};
  moat_error *err = NULL;
  if (api_args_check(&r->args, none, &err) < 0)
    return api_reply_moat_error(r, &err);
  if (ep == MCP_EP_SANDBOX) {
    /* Another org's sandbox, a missing or a killed one: 404 before any MCP. */
    struct moat_sandbox_info info;
    memset(&info, 0, sizeof(info));
    if (moat_control_get(api_control(r), r->org, r->route.id, &info, &err) < 0)
      return api_reply_moat_error(r, &err);
    bool killed = info.state == MOAT_SB_KILLED;
    moat_sandbox_info_clear(&info);
    if (killed)
      return mcp_error(r, 404, "not_found", "sandbox %s was killed", r->route.id);
  }
  if (!mcp_origin_matches(header(r, "Origin"), header(r, MHD_HTTP_HEADER_HOST)))
    return mcp_error(r, 403, "forbidden",
                     "the Origin header does not match the Host this request was sent to");
  struct mcp_ctx c = {.r = r, .ss = api_front_state(r->api, &api_front_mcp), .ep = ep};
  if (strcmp(r->method, "POST") == 0)
    return mcp_post(&c);
  if (strcmp(r->method, "DELETE") == 0) {
    if (session_headers(&c, true) < 0)
      return -1;
    return mcp_reply(r, 204, NULL, NULL, NULL);
  }
  /* GET: no server-initiated stream (this server sends no requests or notifications). */
  return mcp_reply(
      r, 405,
      api_error_json("method_not_allowed",
                     "this MCP server offers no server-initiated SSE stream; POST messages instead"),
      NULL, "POST, DELETE");
}

static int mcp_sandbox(struct api_req *r, json_t *body) { return mcp_handle(r, MCP_EP_SANDBOX); }
static int mcp_workspace(struct api_req *r, json_t *body) { return mcp_handle(r, MCP_EP_WORKSPACE); }

/* Streamable HTTP: POST carries JSON-RPC (read raw: the handler parses it, an object or a batch);
 * GET (the server's stream) and DELETE (end of session) are answered by the handler. */
static const struct api_route_def mcp_routes[] = {
    {"POST", "/v1/sandboxes/{id}/mcp", "mcp.sandbox", mcp_sandbox, API_RT_ROLE_RPC, NULL},
    {"GET", "/v1/sandboxes/{id}/mcp", "mcp.sandbox", mcp_sandbox, 0, NULL},
    {"DELETE", "/v1/sandboxes/{id}/mcp", "mcp.sandbox", mcp_sandbox, API_RT_ROLE_RPC, NULL},
    {"POST", "/v1/mcp", "mcp.workspace", mcp_workspace, API_RT_ROLE_RPC, NULL},
    {"GET", "/v1/mcp", "mcp.workspace", mcp_workspace, 0, NULL},
    {"DELETE", "/v1/mcp", "mcp.workspace", mcp_workspace, API_RT_ROLE_RPC, NULL},
};

static void mcp_routes_add(struct api_router *rt) { api_router_add(rt, mcp_routes, ARRAY_SIZE(mcp_routes)); }

const struct api_front api_front_mcp = {
    .name = "mcp", .routes = mcp_routes_add, .open = mcp_open, .close = mcp_close};

/* server.c -- moatd's HTTP server: libmicrohttpd set-up, request lifecycle, auth, bodies, replies, access log
 *
 * Threading: one thread per connection (MHD_USE_THREAD_PER_CONNECTION), so handlers may block
 * (exec runs for seconds, file transfers stream from the guest). A request's state (struct
 * api_req) is created at the first access-handler call and freed in the NOTIFY_COMPLETED
 * callback, which MHD calls however the request ends (answered, client gone, timeout).
 *
 * Bodies: JSON routes accumulate up to API_MAX_BODY; a larger Content-Length is answered 413
 * before the body is read. libmicrohttpd 0.9.75 refuses MHD_queue_response() while upload data
 * remains (it accepts a response only before the body or after all of it), so a body that grows
 * past the limit without announcing it (chunked) is answered by writing the 413 on the socket
 * ourselves and closing the connection (abort_with_error): nothing else writes to that socket
 * while its own thread runs our callback. PUT .../files streams every chunk to the guest.
 *
 * Front door: every connection is registered with the gate (gate.h: request framing judged on the raw
 * bytes, header and idle deadlines, idle connections per org), and every authenticated request holds a
 * ticket under the per-org and per-sandbox caps (fair.h) from its authentication to its end.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../../common/log.h"
#include "../../common/util.h"
#include "http.h"
#include "fair.h"
#include "gate.h"
#include "../ui/ui.h"

struct moat_api {
  struct MHD_Daemon *daemon;
  struct moat_control *control;
  struct api_router *router;             /* every front end's routes */
  const struct api_front *const *fronts; /* in the order their routes and claims are tried */
  void **states;                         /* fronts[i]'s state */
  struct api_fair *fair;                 /* the caps of fair.h, shared with the proxy listener */
  size_t n_fronts;
  char *version;
  unsigned port;
  int inflight;  /* requests between their first access-handler call and completion (atomic) */
  int holds;     /* WebSocket threads running (atomic) */
  bool stopping; /* set first by moat_api_stop: streams end (atomic) */
};

#define API_STOP_WAIT_S 30 /* moat_api_stop waits this long for in-flight requests */

struct moat_control *api_control(const struct api_req *r) {
  return r->api->control;
}
struct moat_control *api_control_of(const struct moat_api *a) {
  return a->control;
}
struct api_fair *api_fair_of(const struct moat_api *a) {
  return a->fair;
}

void *api_front_state(const struct moat_api *a, const struct api_front *f) {
  for (size_t i = 0; a && i < a->n_fronts; i++)
    if (a->fronts[i] == f)
      return a->states[i];
  return NULL;
}
const char *api_version(const struct api_req *r) { return r->api->version ? r->api->version : "dev"; }

bool api_stopping(const struct moat_api *a) { return __atomic_load_n(&a->stopping, __ATOMIC_SEQ_CST); }
void api_hold(struct moat_api *a) { __atomic_add_fetch(&a->holds, 1, __ATOMIC_SEQ_CST); }
void api_release(struct moat_api *a) { __atomic_sub_fetch(&a->holds, 1, __ATOMIC_SEQ_CST); }

int api_conn_fd(const struct api_req *r) {
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
  return ci ? ci->connect_fd : -1;
}

/* Set by the unescape callback when a %00 decodes into a NUL in the request line; read and
 * cleared at the request's first access-handler call, which runs on the same connection thread
 * right after the request line and headers were parsed. */
static __thread bool t_url_nul;

/* The request target as received (MHD's URI log callback runs on the connection's thread just
 * before the first access-handler call of each request): the port proxy forwards it undecoded. */
static __thread char *t_raw_uri;

static void *uri_cb(void *cls, const char *uri, struct MHD_Connection *c) {
  free(t_raw_uri);
  t_raw_uri = xstrdup(uri);
  return NULL;
}

static size_t unescape_cb(void *cls, struct MHD_Connection *c, char *s) {
  size_t n = MHD_http_unescape(s);
  if (strlen(s) != n)
    t_url_nul = true;
  return n;
}

/* ---- replies ---- */

int api_reply_response(struct api_req *r, unsigned status, struct MHD_Response *resp) {
  if (r->responded)
    return -1;
  if (MHD_queue_response(r->conn, status, resp) != MHD_YES) {
    log_warn("%s %s: could not queue a %u response", r->method, r->path ? r->path : "?", status);
    return -1;
  }
  r->responded = true;
  r->status = status;
  return 0;
}

/* Queues body (consumed) as JSON, with one extra header when hname is non-NULL. */
static int reply_json_hdr(struct api_req *r, unsigned status, json_t *body, const char *hname,
                          const char *hval) {
  char *s = json_dumps(body, JSON_COMPACT);
  json_decref(body);
  if (!s)
    abort(); /* only on out-of-memory: jansson dumps any value it built */
  size_t n = strlen(s);
  s = xrealloc(s, n + 2);
  s[n++] = '\n';
  s[n] = '\0';
  struct MHD_Response *resp = MHD_create_response_from_buffer(n, s, MHD_RESPMEM_MUST_FREE);
  if (!resp) {
    free(s);
    return -1;
  }
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
  if (hname)
    MHD_add_response_header(resp, hname, hval);
  if (status == 429) {
    /* Over a cap: the client is to come back later, on a new connection (a refused client does
     * not keep a connection of moatd's). */
    MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, API_RETRY_AFTER_S);
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
  }
  int ret = api_reply_response(r, status, resp);
  MHD_destroy_response(resp);
  return ret;
}

int api_reply_json(struct api_req *r, unsigned status, json_t *body) {
  return reply_json_hdr(r, status, body, NULL, NULL);
}

int api_reply_empty(struct api_req *r, unsigned status) {
  struct MHD_Response *resp = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
  if (!resp)
    return -1;
  int ret = api_reply_response(r, status, resp);
  MHD_destroy_response(resp);
  return ret;
}

int api_reply_error(struct api_req *r, unsigned status, const char *code, const char *fmt, ...) {
  va_list ap;
  char msg[1024];
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  return api_reply_json(r, status, api_error_json(code, msg));
}

int api_reply_moat_error(struct api_req *r, moat_error **err) {
  const char *code;
  unsigned status = api_errno_http(*err ? (*err)->status : 0, &code);
  if (status >= 500)
    log_warn("%s %s: %s", r->method, r->path ? r->path : "?", moat_error_msg(*err));
  json_t *body = *err && (*err)->status == MOAT_E_QUOTA ? api_quota_error_json(moat_error_msg(*err))
                                                        : api_error_json(code, moat_error_msg(*err));
  int ret = api_reply_json(r, status, body);
  moat_error_free(err);
  return ret;
}

/* send(2) of all of buf on a (possibly non-blocking) socket, within about two seconds. */
static int send_all(int fd, const char *buf, size_t len) {
  uint64_t deadline = now_ns() + 2000000000ULL;
  while (len > 0) {
    ssize_t n = send(fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      buf += n;
      len -= (size_t)n;
      continue;
    }
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && now_ns() < deadline) {
      struct pollfd p = {.fd = fd, .events = POLLOUT};
      poll(&p, 1, 100);
      continue;
    }
    return -1;
  }
  return 0;
}

static const char *reason_phrase(unsigned status) {
  const char *p = MHD_get_reason_phrase_for(status);
  return p && *p ? p : "Error";
}

/* For errors found while a body is still arriving: writes a complete error response on the
 * socket, stops writing, drains what the client still sends for a moment (so that closing does
 * not reset the connection before the client reads the answer), and returns MHD_NO so that MHD
 * closes the connection. */
static enum MHD_Result abort_with_error(struct api_req *r, moat_error **err) {
  const char *code;
  unsigned status = api_errno_http(*err ? (*err)->status : 0, &code);
  json_t *j = api_error_json(code, moat_error_msg(*err));
  moat_error_free(err);
  char *body = json_dumps(j, JSON_COMPACT);
  json_decref(j);
  if (!body)
    abort();
  char *resp = xasprintf("HTTP/1.1 %u %s\r\nConnection: close\r\nContent-Type: application/json\r\n"
                         "Content-Length: %zu\r\n\r\n%s\n",
                         status, reason_phrase(status), strlen(body) + 1, body);
  free(body);
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
  if (ci && !r->responded) {
    int fd = ci->connect_fd;
    api_gate_release(r->conn); /* the bytes drained below are not the framing's business */
    if (send_all(fd, resp, strlen(resp)) == 0) {
      shutdown(fd, SHUT_WR);
      char buf[16384];
      size_t drained = 0;
      uint64_t deadline = now_ns() + 2000000000ULL;
      for (;;) {
        uint64_t now = now_ns();
        if (now >= deadline || drained > (64u << 20))
          break;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, (int)((deadline - now) / 1000000) + 1) <= 0)
          break;
        ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (n <= 0)
          break;
        drained += (size_t)n;
      }
    }
    r->responded = true;
    r->status = status;
  }
  free(resp);
  return MHD_NO;
}

/* ---- helpers for front ends ---- */

bool api_client_gone(int fd) {
  if (fd < 0)
    return false;
  struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
  if (poll(&p, 1, 0) <= 0)
    return false;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

void api_conn_reset(int fd) {
  if (fd < 0)
    return;
  /* connect(AF_UNSPEC) disconnects an established TCP socket with an RST (tcp_disconnect);
   * libmicrohttpd's shutdown(SHUT_WR) on close would send a FIN first */
  struct sockaddr sa = {.sa_family = AF_UNSPEC};
  (void)connect(fd, &sa, sizeof(sa));
}

/* A guest file, streamed as the response body. */
struct read_state {
  struct moat_guest_reader *reader;
  uint64_t size, pos;
  char *desc; /* "sb-...:path" for logs */
};

static ssize_t read_cb(void *cls, uint64_t pos, char *buf, size_t max) {
  struct read_state *st = cls;
  if (st->pos >= st->size)
    return MHD_CONTENT_READER_END_OF_STREAM;
  size_t cap = max;
  if ((uint64_t)cap > st->size - st->pos)
    cap = (size_t)(st->size - st->pos);
  moat_error *err = NULL;
  ssize_t n = moat_guest_read_chunk(st->reader, buf, cap, &err);
  if (n <= 0) {
    /* The file shrank or the guest went away after the headers were sent: the client sees a
     * short body and a closed connection. */
    log_warn("files GET %s: stopped at %llu of %llu bytes: %s", st->desc, (unsigned long long)st->pos,
             (unsigned long long)st->size, n == 0 ? "file shrank" : moat_error_msg(err));
    moat_error_free(&err);
    return MHD_CONTENT_READER_END_WITH_ERROR;
  }
  st->pos += (uint64_t)n;
  return n;
}

static void read_free(void *cls) {
  struct read_state *st = cls;
  moat_guest_reader_close(st->reader);
  free(st->desc);
  free(st);
}

struct MHD_Response *api_file_response(struct moat_guest_reader *rd, uint64_t size, const char *desc) {
  struct read_state *st = xcalloc(1, sizeof(*st));
  st->reader = rd;
  st->size = size;
  st->desc = xstrdup(desc);
  struct MHD_Response *resp = MHD_create_response_from_callback(size, API_FILE_BLOCK, read_cb, st, read_free);
  if (!resp)
    read_free(st);
  return resp;
}

/* ---- request state ---- */

struct args_ctx {
  struct api_args *args;
  bool nul, too_many;
};

static enum MHD_Result collect_arg(void *cls, enum MHD_ValueKind kind, const char *key, size_t key_size,
                                   const char *value, size_t value_size) {
  struct args_ctx *c = cls;
  if (strlen(key) != key_size || (value && strlen(value) != value_size)) {
    c->nul = true;
    return MHD_NO;
  }
  if (c->args->n >= API_MAX_QUERY_ARGS) {
    c->too_many = true;
    return MHD_NO;
  }
  struct api_arg *a = &c->args->v[c->args->n++];
  a->key = xstrdup(key);
  a->value = xstrdup(value ? value : "");
  return MHD_YES;
}

static void req_free(struct api_req *r) {
  if (!r)
    return;
  api_fair_release(r->ticket);
  if (r->upgrade && r->upgrade_free)
    r->upgrade_free(r->upgrade);
  if (r->front && r->front_free)
    r->front_free(r->front);
  for (size_t i = 0; i < r->args.n; i++) {
    free(r->args.v[i].key);
    free(r->args.v[i].value);
  }
  free(r->path);
  free(r->org);
  free(r->raw_uri);
  free(r->body);
  free(r);
}

/* The API key from "Authorization: Bearer K" or "X-API-Key: K", or NULL. */
static const char *api_key(struct MHD_Connection *c) {
  const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
  if (h && strncasecmp(h, "Bearer ", 7) == 0) {
    h += 7;
    while (*h == ' ')
      h++;
    if (*h)
      return h;
  }
  h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-API-Key");
  return h && *h ? h : NULL;
}

int api_req_admit(struct api_req *r, const char *org, const char *sandbox, bool stream, moat_error **err) {
  if (r->ticket)
    return stream ? api_req_stream(r, err) : 0;
  r->ticket = api_fair_admit(r->api->fair, org, sandbox, stream, err);
  if (!r->ticket)
    return -1;
  api_gate_attribute(r->conn, api_fair_org(r->ticket));
  return 0;
}

int api_req_stream(struct api_req *r, moat_error **err) { return api_fair_to_stream(r->ticket, err); }

struct api_ticket *api_req_take_ticket(struct api_req *r) {
  struct api_ticket *t = r->ticket;
  r->ticket = NULL;
  return t;
}

/* A request authenticated by the dashboard's cookie, which a browser attaches to requests other sites'
 * pages make too: a method that changes things must carry UI_CSRF_HEADER (a page of another origin
 * cannot set it without CORS, which moatd never grants), and a request that names its Origin (every
 * WebSocket does) must come from moatd's own. 0, or -1 after 403. */
static int ui_cookie_guard(struct api_req *r, const char *method) {
  const char *origin = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Origin");
  const char *host = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST);
  if (origin) {
    const char *o = strncmp(origin, "http://", 7) == 0    ? origin + 7
                    : strncmp(origin, "https://", 8) == 0 ? origin + 8
                                                          : NULL;
    if (!o || !host || strcmp(o, host) != 0)
      return api_reply_error(r, 403, "forbidden",
                             "a request from another origin (%.100s) cannot use the dashboard's session",
                             origin),
             -1;
  }
  bool reads = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
  const char *h = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, UI_CSRF_HEADER);
  if (!reads && !(h && strcmp(h, "1") == 0))
    return api_reply_error(r, 403, "forbidden",
                           "a %s authenticated by the dashboard's session cookie must carry the header %s: 1 "
                           "(CSRF protection)",
                           method, UI_CSRF_HEADER),
           -1;
  return 0;
}

/* First call of a request: route, arguments, auth, size checks. Returns true when a response
 * was queued already (the body, if any, is then not read). */
static bool req_begin(struct api_req *r, const char *url, const char *method) {
  moat_error *err = NULL;
  bool url_nul = t_url_nul;
  t_url_nul = false;
  snprintf(r->method, sizeof(r->method), "%s", method);
  r->path = xstrdup(url);
  r->raw_uri = t_raw_uri;
  t_raw_uri = NULL;
  api_gate_request(r->conn);
  if (url_nul) {
    api_reply_error(r, 400, "invalid_request", "the request URL contains a NUL byte (%%00)");
    return true;
  }
  struct args_ctx ac = {.args = &r->args};
  MHD_get_connection_values_n(r->conn, MHD_GET_ARGUMENT_KIND, collect_arg, &ac);
  if (ac.nul) {
    api_reply_error(r, 400, "invalid_request", "a query parameter contains a NUL byte");
    return true;
  }
  if (ac.too_many) {
    api_reply_error(r, 400, "invalid_request", "more than %d query parameters", API_MAX_QUERY_ARGS);
    return true;
  }

  for (size_t i = 0; i < r->api->n_fronts; i++)
    if (r->api->fronts[i]->claimer && r->api->fronts[i]->claimer->claims(r)) {
      r->hooks = r->api->fronts[i]->claimer->hooks;
      return r->hooks->begin ? r->hooks->begin(r) : false;
    }

  switch (api_router_match(r->api->router, method, url, &r->route)) {
  case API_MATCH_OK:
    break;
  case API_MATCH_NOT_FOUND:
    api_reply_error(r, 404, "not_found", "no such resource: %s %.256s", method, url);
    return true;
  case API_MATCH_BAD_METHOD: {
    char msg[160];
    snprintf(msg, sizeof(msg), "method %s is not allowed here; allowed: %s", method, r->route.allow);
    reply_json_hdr(r, 405, api_error_json("method_not_allowed", msg), MHD_HTTP_HEADER_ALLOW, r->route.allow);
    return true;
  }
  }
  const struct api_route_def *d = r->route.def;
  r->hooks = d->hooks;
  if (r->hooks && r->hooks->own_auth)
    return r->hooks->begin ? r->hooks->begin(r) : false;

  if (!(d->flags & API_RT_PUBLIC)) {
    const char *key = api_key(r->conn);
    /* A browser cannot put headers on a WebSocket (xterm.js's attach addon): such routes also
     * take the key as ?api_key=. */
    if (!key && (d->flags & API_RT_KEY_IN_QUERY)) {
      key = MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, "api_key");
      if (key && !*key)
        key = NULL;
    }
    /* The dashboard's session cookie stands for a key (ui.h); a key sent along wins. */
    const char *session = key ? NULL : MHD_lookup_connection_value(r->conn, MHD_COOKIE_KIND, UI_COOKIE);
    _cleanup_free_ char *session_key = session ? api_ui_session_key(r->api, session) : NULL;
    if (session && !session_key) {
      api_reply_error(r, 401, "unauthorized", "the dashboard session expired or was ended: sign in again");
      return true;
    }
    if (session_key)
      key = session_key;
    int auth = key ? moat_control_auth_key(r->api->control, key, &r->key, &err) : -1;
    if (session_key)
      explicit_bzero(session_key, strlen(session_key));
    if (auth < 0) {
      if (session_key)
        api_ui_session_end(r->api, session);
      api_reply_unauthorized(r, err,
                             "a valid API key is required (Authorization: Bearer KEY or X-API-Key: KEY)");
      moat_error_free(&err);
      return true;
    }
    r->has_key = true;
    r->org = xstrdup(r->key.org);
    if (session_key && ui_cookie_guard(r, method) < 0)
      return true;
    if (api_req_authorize(r, method, d->flags) < 0)
      return true;
    const char *sb = r->route.id[0] ? r->route.id : NULL;
    if (api_req_admit(r, r->org, sb, (d->flags & API_RT_STREAM) != 0, &err) < 0) {
      api_reply_moat_error(r, &err);
      return true;
    }
  }

  if (r->hooks && r->hooks->body)
    /* The body streams through the route (errors such as EISDIR or a missing sandbox are
     * answered before it is read). */
    return r->hooks->begin ? r->hooks->begin(r) : false;
  const char *cl = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
  uint64_t n;
  if (cl && parse_u64(cl, &n) == 0 && n > API_MAX_BODY) {
    api_reply_error(r, 413, "payload_too_large", "request body is larger than %d bytes", API_MAX_BODY);
    return true;
  }
  return r->hooks && r->hooks->begin ? r->hooks->begin(r) : false;
}

int api_req_authorize(struct api_req *r, const char *method, unsigned flags) {
  if (!r->has_key)
    return 0;
  const char *role = moat_key_role_name(r->key.role);
  bool reads = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
  if (r->key.role == MOAT_ROLE_READONLY && !reads && !(flags & API_RT_ROLE_RPC))
    return api_reply_error(r, 403, "forbidden",
                           "this API key's role is readonly: it may only read (GET), not %s %.200s", method,
                           r->path),
           -1;
  /* the platform admin's key manages orgs and nothing of a tenant's; no tenant key manages orgs */
  bool platform = r->key.role == MOAT_ROLE_PLATFORM;
  if (platform && !(flags & (API_RT_PLATFORM | API_RT_ORG | API_RT_ANY_KEY)))
    return api_reply_error(
               r, 403, "forbidden",
               "this is the platform admin key: it manages orgs (/v1/orgs) and nothing of an org's"),
           -1;
  if ((flags & API_RT_PLATFORM) && !platform)
    return api_reply_error(r, 403, "forbidden",
                           "managing orgs needs the platform admin key (moatd key create --admin)"),
           -1;
  if ((flags & API_RT_ORG) && !platform && strcmp(r->route.sid, r->key.org) != 0)
    return api_reply_error(r, 404, "not_found", "no org '%.64s'", r->route.sid), -1;
  if ((flags & API_RT_ADMIN) && r->key.role != MOAT_ROLE_ADMIN &&
      !((flags & API_RT_SELF) && strcmp(r->route.kid, r->key.id) == 0))
    return api_reply_error(r, 403, "forbidden",
                           "this API key's role is %s: managing API keys needs an admin key", role),
           -1;
  return 0;
}

void api_key_watch_init_key(struct api_key_watch *w, struct moat_control *c, const char *key_id) {
  memset(w, 0, sizeof(*w));
  w->c = c;
  if (key_id)
    snprintf(w->id, sizeof(w->id), "%s", key_id);
  w->gen = moat_control_keys_gen(w->c);
}

void api_key_watch_init(struct api_key_watch *w, const struct api_req *r) {
  api_key_watch_init_key(w, r->api->control, r->has_key ? r->key.id : NULL);
}

bool api_key_watch_revoked(struct api_key_watch *w) {
  if (w->revoked)
    return true;
  if (!w->id[0] || !w->c)
    return false;
  uint64_t g = moat_control_keys_gen(w->c);
  if (g == w->gen)
    return false;
  moat_error *err = NULL;
  int alive = moat_control_key_alive(w->c, w->id, &err);
  if (alive < 0) { /* a store error: looked at again on the next revocation */
    moat_error_free(&err);
    return false;
  }
  w->gen = g;
  w->revoked = alive == 0;
  return w->revoked;
}

bool api_req_readonly(const struct api_req *r) { return r->has_key && r->key.role == MOAT_ROLE_READONLY; }

int api_reply_unauthorized(struct api_req *r, const moat_error *err, const char *hint) {
  if (err && err->status == EKEYEXPIRED)
    return api_reply_error(r, 401, "unauthorized", "%s", moat_error_msg(err));
  return api_reply_error(r, 401, "unauthorized", "%s", hint);
}

/* Runs the route's handler once the body is complete; queues exactly one response. */
static void req_dispatch(struct api_req *r) {
  if (r->hooks && r->hooks->finish) {
    r->hooks->finish(r);
  } else if (r->route.def && r->route.def->handler) {
    json_t *body = NULL;
    moat_error *err = NULL;
    if ((r->route.def->flags & API_RT_JSON) &&
        api_body_parse(r->body ? r->body : "", r->body_len, true, &body, &err) < 0) {
      api_reply_moat_error(r, &err);
      return;
    }
    r->route.def->handler(r, body);
    json_decref(body);
  }
  if (!r->responded)
    api_reply_error(r, 500, "internal", "the handler produced no response");
}

static enum MHD_Result access_cb(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                 const char *version, const char *upload_data, size_t *upload_data_size,
                                 void **con_cls) {
  struct moat_api *api = cls;
  struct api_req *r = *con_cls;
  if (!r) {
    r = xcalloc(1, sizeof(*r));
    r->api = api;
    r->conn = conn;
    r->start_ns = now_ns();
    *con_cls = r;
    __atomic_add_fetch(&api->inflight, 1, __ATOMIC_SEQ_CST);
    req_begin(r, url, method);
    return MHD_YES;
  }
  if (*upload_data_size > 0) {
    size_t n = *upload_data_size;
    *upload_data_size = 0;
    if (r->responded) /* answered early; MHD reads no body then, but be safe */
      return MHD_YES;
    if (r->hooks && r->hooks->body) {
      moat_error *err = NULL;
      if (r->hooks->body(r, upload_data, n, &err) < 0)
        return abort_with_error(r, &err);
      return MHD_YES;
    }
    if (n > API_MAX_BODY - r->body_len) {
      moat_error *err = NULL;
      moat_error_set(&err, EMSGSIZE, "request body is larger than %d bytes", API_MAX_BODY);
      return abort_with_error(r, &err);
    }
    if (r->body_len + n + 1 > r->body_cap) {
      size_t cap = r->body_cap ? r->body_cap : 4096;
      while (cap < r->body_len + n + 1)
        cap *= 2;
      r->body = xrealloc(r->body, cap);
      r->body_cap = cap;
    }
    memcpy(r->body + r->body_len, upload_data, n);
    r->body_len += n;
    r->body[r->body_len] = '\0';
    return MHD_YES;
  }
  if (!r->responded)
    req_dispatch(r);
  return MHD_YES;
}

/* A mutating call of an authenticated org goes into the audit log once answered (its path without
 * the query, which may carry a key). */
static void audit(struct api_req *r) {
  if (!r->org || !r->method[0] || strcmp(r->method, "GET") == 0 || strcmp(r->method, "HEAD") == 0 ||
      strcmp(r->method, "OPTIONS") == 0)
    return;
  const struct api_route *rt = &r->route;
  const char *target = rt->id[0]     ? rt->id
                       : rt->sid[0]  ? rt->sid
                       : rt->kid[0]  ? rt->kid
                       : rt->name[0] ? rt->name
                       : rt->cid[0]  ? rt->cid
                                     : NULL;
  char path[512];
  const char *p = r->path ? r->path : "?";
  snprintf(path, sizeof(path), "%.*s", (int)strcspn(p, "?"), p);
  struct moat_audit_entry a = {.org = r->org,
                               .key_id = r->has_key ? r->key.id : NULL,
                               .method = r->method,
                               .route = rt->def ? rt->def->name : NULL,
                               .path = path,
                               .target = target,
                               .status = (int)r->status};
  moat_control_audit_record(api_control(r), &a);
}

static void completed_cb(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
  struct api_req *r = *con_cls;
  t_url_nul = false;
  api_gate_request_done(conn);
  if (!r)
    return;
  if (!r->status)
    r->status = api_gate_answered(conn);
  double ms = (double)(now_ns() - r->start_ns) / 1e6;
  const char *how = "";
  if (toe == MHD_REQUEST_TERMINATED_TIMEOUT_REACHED)
    how = " (timeout)";
  else if (toe == MHD_REQUEST_TERMINATED_CLIENT_ABORT)
    how = " (client gone)";
  else if (toe == MHD_REQUEST_TERMINATED_WITH_ERROR)
    how = " (aborted)";
  log_info("%s %s %u %.1fms%s", r->method, r->path ? r->path : "?", r->status, ms, how);
  audit(r);
  struct moat_api *api = r->api;
  req_free(r);
  *con_cls = NULL;
  __atomic_sub_fetch(&api->inflight, 1, __ATOMIC_SEQ_CST);
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
  char msg[512];
  vsnprintf(msg, sizeof(msg), fmt, ap);
  size_t n = strlen(msg);
  while (n > 0 && (msg[n - 1] == '\n' || msg[n - 1] == ' '))
    msg[--n] = '\0';
  /* We close connections on purpose after abort_with_error; that is not worth a warning. */
  if (strstr(msg, "Application reported internal error"))
    return;
  log_debug("http: %s", msg);
}

/* ---- start / stop ---- */

int api_listen_socket(const char *listen_addr, unsigned *port, bool *ipv6, moat_error **err) {
  struct sockaddr_storage ss;
  socklen_t sl;
  if (api_parse_listen(listen_addr, &ss, &sl, err) < 0)
    return -1;
  _cleanup_close_ int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return moat_error_errno(err, "listen on %s: socket", listen_addr);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (ss.ss_family == AF_INET6) {
    int zero = 0; /* dual stack when listening on "::" */
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
  }
  if (bind(fd, (struct sockaddr *)&ss, sl) < 0)
    return moat_error_errno(err, "listen on %s: bind", listen_addr);
  if (listen(fd, 1024) < 0)
    return moat_error_errno(err, "listen on %s", listen_addr);
  struct sockaddr_storage bound;
  socklen_t bl = sizeof(bound);
  if (getsockname(fd, (struct sockaddr *)&bound, &bl) < 0)
    return moat_error_errno(err, "listen on %s: getsockname", listen_addr);
  *port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                            : ((struct sockaddr_in *)&bound)->sin_port);
  *ipv6 = ss.ss_family == AF_INET6;
  int ret = fd;
  fd = -1;
  return ret;
}

/* Frees what api_http_start made before (or after) the listener: every front end's state, in
 * reverse order, the router and a. */
static void api_free(struct moat_api *a) {
  for (size_t i = a->n_fronts; i-- > 0;)
    if (a->states[i] && a->fronts[i]->close)
      a->fronts[i]->close(a->states[i]);
  free(a->states);
  api_fair_free(a->fair);
  api_router_free(a->router);
  free(a->version);
  free(a);
}

int api_http_start(struct moat_api **out, struct moat_control *control, const struct moat_api_config *cfg,
                   const struct api_front *const *fronts, size_t n_fronts, moat_error **err) {
  unsigned port;
  bool ipv6;
  _cleanup_close_ int fd = api_listen_socket(cfg->listen, &port, &ipv6, err);
  if (fd < 0)
    return -1;

  struct moat_api *a = xcalloc(1, sizeof(*a));
  a->control = control;
  a->router = api_router_new();
  a->fronts = fronts;
  a->states = xcalloc(n_fronts ? n_fronts : 1, sizeof(*a->states));
  a->version = xstrdup(cfg->version ? cfg->version : "dev");
  a->port = port;
  struct moat_api_limits lim = moat_api_limits_resolve(cfg->limits);
  struct api_fair_config fc = {
      .requests_per_org = lim.requests_per_org,
      .streams_per_org = lim.streams_per_org,
      .requests_per_sandbox = lim.requests_per_sandbox,
      .streams_per_sandbox = lim.streams_per_sandbox,
  };
  a->fair = api_fair_new(&fc);
  for (size_t i = 0; i < n_fronts; i++) {
    if (fronts[i]->routes)
      fronts[i]->routes(a->router);
    a->n_fronts = i + 1;
    if (fronts[i]->open && fronts[i]->open(a, cfg, &a->states[i], err) < 0) {
      a->n_fronts = i;
      api_free(a);
      return moat_error_wrap(err, "the %s front end", fronts[i]->name);
    }
  }
  unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG |
                   MHD_USE_POLL | MHD_ALLOW_UPGRADE;
  if (ipv6)
    flags |= MHD_USE_DUAL_STACK;
  unsigned timeout = cfg->conn_timeout_s ? cfg->conn_timeout_s : 60;
  if (api_limits_apply(&lim, err) < 0) {
    api_free(a);
    return -1;
  }
  a->daemon = MHD_start_daemon(flags, 0, NULL, NULL, access_cb, a, MHD_OPTION_LISTEN_SOCKET, (MHD_socket)fd,
                               MHD_OPTION_CONNECTION_TIMEOUT, timeout, MHD_OPTION_NOTIFY_COMPLETED,
                               completed_cb, NULL, MHD_OPTION_NOTIFY_CONNECTION, api_gate_notify, NULL,
                               MHD_OPTION_UNESCAPE_CALLBACK, unescape_cb, NULL, MHD_OPTION_URI_LOG_CALLBACK,
                               uri_cb, NULL, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
                               MHD_OPTION_CONNECTION_LIMIT, lim.max_connections,
                               MHD_OPTION_PER_IP_CONNECTION_LIMIT, lim.max_conns_per_ip, MHD_OPTION_END);
  if (!a->daemon) {
    api_gate_stop();
    api_free(a);
    return moat_error_set(err, EIO, "listen on %s: libmicrohttpd failed to start", cfg->listen);
  }
  fd = -1; /* MHD owns the listening socket now */
  log_info("api listening on %s (port %u)", cfg->listen, port);
  *out = a;
  return 0;
}

unsigned moat_api_port(const struct moat_api *a) { return a ? a->port : 0; }

void moat_api_stop(struct moat_api *a) {
  if (!a)
    return;
  /* Stop accepting, end streams (SSE, WebSocket threads), let requests in flight finish and
   * send their responses (up to API_STOP_WAIT_S), then close every connection and join its
   * thread. */
  __atomic_store_n(&a->stopping, true, __ATOMIC_SEQ_CST);
  MHD_socket lfd = MHD_quiesce_daemon(a->daemon);
  if (lfd != MHD_INVALID_SOCKET)
    close(lfd);
  uint64_t deadline = now_ns() + API_STOP_WAIT_S * 1000000000ULL;
  int n = __atomic_load_n(&a->inflight, __ATOMIC_SEQ_CST);
  if (n > 0)
    log_info("api: waiting for %d request(s) in flight", n);
  while (__atomic_load_n(&a->inflight, __ATOMIC_SEQ_CST) > 0 && now_ns() < deadline)
    usleep(20000);
  /* WebSocket threads notice `stopping` within their poll interval and close their upgraded
   * connections; MHD_stop_daemon must not run before they have. */
  while (__atomic_load_n(&a->holds, __ATOMIC_SEQ_CST) > 0)
    usleep(20000);
  MHD_stop_daemon(a->daemon);
  api_gate_stop();
  api_free(a);
}

/* ---- limits ---- */

struct moat_api_limits moat_api_limits_resolve(const struct moat_api_limits *lim) {
  struct moat_api_limits l = lim ? *lim : (struct moat_api_limits){0};
#define DEF(f, v)                                                                                            \
  if (!l.f)                                                                                                  \
  l.f = v
  DEF(max_connections, API_DEFAULT_MAX_CONNECTIONS);
  DEF(header_timeout_s, API_DEFAULT_HEADER_TIMEOUT_S);
  DEF(idle_timeout_s, API_DEFAULT_IDLE_TIMEOUT_S);
  DEF(requests_per_org, API_DEFAULT_REQUESTS_PER_ORG);
  DEF(streams_per_org, API_DEFAULT_STREAMS_PER_ORG);
  DEF(requests_per_sandbox, API_DEFAULT_REQUESTS_PER_SANDBOX);
  DEF(streams_per_sandbox, API_DEFAULT_STREAMS_PER_SANDBOX);
  DEF(idle_per_org, API_DEFAULT_IDLE_PER_ORG);
  DEF(stream_keepalive_ms, API_DEFAULT_STREAM_KEEPALIVE_MS);
#undef DEF
  return l;
}

int api_limits_apply(const struct moat_api_limits *lim, moat_error **err) {
  struct api_gate_config gc = {
      .header_timeout_s = lim->header_timeout_s,
      .idle_timeout_s = lim->idle_timeout_s,
      .max_idle_per_org = lim->idle_per_org,
  };
  api_stream_set_keepalive_ms(lim->stream_keepalive_ms);
  return api_gate_start(&gc, err);
}

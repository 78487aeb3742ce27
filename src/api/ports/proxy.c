/* proxy.c -- moatd's proxy listener: "Host: P-ID.DOMAIN" -> port P inside sandbox ID
 *
 * A libmicrohttpd daemon of its own (thread per connection, upgrades allowed), apart from the API
 * listener so that pages served from sandboxes never share an origin with moat's API. Every
 * request's Host names the sandbox and port (api_parse_port_host, shared with the E2B front end);
 * with --proxy-domain the DOMAIN must match. The request target goes to the server unchanged
 * except for a moat_token query parameter; access is decided by ports_authorize (API key, port
 * token or a public port). Errors are JSON {"code","message"} like the API's. The same gate (gate.h) and
 * caps (fair.h, counted against the sandbox's org) as the API listener's apply.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../../common/log.h"
#include "../http/fair.h"
#include "../http/gate.h"
#include "ports.h"

struct moat_proxy {
  struct MHD_Daemon *daemon;
  struct moat_control *control; /* the api's */
  struct api_fair *fair;        /* the api's caps */
  struct ports_state *ps;       /* port settings and idle connections */
  char *domain;                 /* NULL = any */
  unsigned port;
  int inflight;  /* atomic */
  int holds;     /* upgraded connections (atomic) */
  bool stopping; /* atomic */
};

struct preq {
  struct moat_proxy *p;
  struct port_fwd *f;
  char *uri; /* raw request target */
  char *org;
  char desc[96];
  uint64_t start_ns;
  unsigned status;
  bool responded;
  struct api_ticket *ticket; /* the request's slot under the caps (fair.h) */
};

static __thread char *t_uri;

static void *uri_cb(void *cls, const char *uri, struct MHD_Connection *c) {
  free(t_uri);
  t_uri = xstrdup(uri);
  return NULL;
}

static bool env_stopping(void *a) {
  return __atomic_load_n(&((struct moat_proxy *)a)->stopping, __ATOMIC_SEQ_CST);
}
static void env_hold(void *a) { __atomic_add_fetch(&((struct moat_proxy *)a)->holds, 1, __ATOMIC_SEQ_CST); }
static void env_release(void *a) {
  __atomic_sub_fetch(&((struct moat_proxy *)a)->holds, 1, __ATOMIC_SEQ_CST);
}

static const char *hdr(struct MHD_Connection *c, const char *k) {
  const char *v = MHD_lookup_connection_value(c, MHD_HEADER_KIND, k);
  return v && *v ? v : NULL;
}

static void fail(struct preq *q, struct MHD_Connection *c, int status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void fail(struct preq *q, struct MHD_Connection *c, int status, const char *fmt, ...) {
  moat_error *err = NULL;
  va_list ap;
  va_start(ap, fmt);
  char msg[512];
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  moat_error_set(&err, status, "%s", msg);
  const char *code;
  q->status = port_error_http(status, &code);
  q->responded = port_reply_error(c, &err) == 0;
}

static void fail_err(struct preq *q, struct MHD_Connection *c, moat_error **err) {
  const char *code;
  q->status = port_error_http(*err ? (*err)->status : 0, &code);
  q->responded = port_reply_error(c, err) == 0;
}

/* Domain part of a Host (after "P-ID.") without its ":PORT" equals d, case-insensitively. */
static bool domain_matches(const char *dom, const char *d) {
  size_t n = strlen(d);
  return strncasecmp(dom, d, n) == 0 && (dom[n] == '\0' || dom[n] == ':');
}

static void begin(struct preq *q, struct MHD_Connection *c, const char *method) {
  moat_error *err = NULL;
  api_gate_request(c);
  unsigned port;
  char id[MOAT_ID_LEN + 1];
  const char *dom = NULL;
  const char *host = hdr(c, MHD_HTTP_HEADER_HOST);
  if (!api_parse_port_host(host, &port, id, &dom) || (q->p->domain && !domain_matches(dom, q->p->domain))) {
    fail(q, c, ENOENT, "the Host header must be PORT-SANDBOXID.%s", q->p->domain ? q->p->domain : "DOMAIN");
    return;
  }
  snprintf(q->desc, sizeof(q->desc), "%s %u-%s", method, port, id);
  if (!q->uri || q->uri[0] != '/') {
    fail(q, c, EINVAL, "the request target must be a path");
    return;
  }
  const char *xkey = hdr(c, "X-API-Key"), *bearer = NULL;
  enum port_auth how;
  const char *a = hdr(c, MHD_HTTP_HEADER_AUTHORIZATION);
  if (a && strncasecmp(a, "Bearer ", 7) == 0 && a[7])
    bearer = a + 7;
  bool from_query;
  const char *token = ports_request_token(c, &from_query);
  struct port_grant *grant = NULL;
  if (ports_authorize(q->p->ps, q->p->control, method, id, port, xkey, bearer, token, &q->org, &how, &grant,
                      &err) < 0) {
    fail_err(q, c, &err);
    return;
  }
  q->ticket = api_fair_admit(q->p->fair, q->org, id, hdr(c, MHD_HTTP_HEADER_UPGRADE) != NULL, &err);
  if (!q->ticket) {
    port_grant_free(grant);
    fail_err(q, c, &err);
    return;
  }
  api_gate_attribute(c, api_fair_org(q->ticket));
  _cleanup_free_ char *target = ports_strip_token(q->uri);
  _cleanup_free_ char *cookie = how == PORT_AUTH_TOKEN && from_query ? ports_token_cookie(token, "/") : NULL;
  struct port_fwd_req fr = {
      .conn = c,
      .method = method,
      .target = target,
      .drop_authorization = how == PORT_AUTH_BEARER,
      .set_cookie = cookie,
      .env = {.stopping = env_stopping, .hold = env_hold, .release = env_release, .arg = q->p},
      .ticket = &q->ticket,
      .grant = grant,
  };
  q->f = port_fwd_open(ports_pool(q->p->ps), q->p->control, q->org, id, port, &fr, &err);
  if (!q->f)
    fail_err(q, c, &err);
}

static enum MHD_Result access_cb(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                 const char *version, const char *upload_data, size_t *upload_data_size,
                                 void **con_cls) {
  struct moat_proxy *p = cls;
  struct preq *q = *con_cls;
  if (!q) {
    q = xcalloc(1, sizeof(*q));
    q->p = p;
    q->start_ns = now_ns();
    q->uri = t_uri;
    t_uri = NULL;
    snprintf(q->desc, sizeof(q->desc), "%s ?", method);
    *con_cls = q;
    __atomic_add_fetch(&p->inflight, 1, __ATOMIC_SEQ_CST);
    begin(q, c, method);
    return MHD_YES;
  }
  if (*upload_data_size > 0) {
    size_t n = *upload_data_size;
    *upload_data_size = 0;
    if (q->responded || !q->f)
      return MHD_YES;
    moat_error *err = NULL;
    if (port_fwd_body(q->f, upload_data, n, &err) < 0) {
      /* libmicrohttpd takes no response while a body is still arriving: the connection ends */
      api_gate_release(c);
      log_info("proxy %s: %s", q->desc, moat_error_msg(err));
      moat_error_free(&err);
      return MHD_NO;
    }
    return MHD_YES;
  }
  if (q->responded || !q->f)
    return MHD_YES;
  moat_error *err = NULL;
  unsigned status = 0;
  struct MHD_Response *resp = port_fwd_respond(q->f, &status, &err);
  if (!resp) {
    fail_err(q, c, &err);
    return MHD_YES;
  }
  q->responded = MHD_queue_response(c, status, resp) == MHD_YES;
  q->status = status;
  MHD_destroy_response(resp);
  return q->responded ? MHD_YES : MHD_NO;
}

static void completed_cb(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
  struct preq *q = *con_cls;
  api_gate_request_done(c);
  if (!q)
    return;
  if (!q->status)
    q->status = api_gate_answered(c);
  double ms = (double)(now_ns() - q->start_ns) / 1e6;
  log_info("proxy %s %u %.1fms%s", q->desc, q->status, ms,
           toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? "" : " (ended early)");
  struct moat_proxy *p = q->p;
  port_fwd_free(q->f);
  api_fair_release(q->ticket);
  free(q->uri);
  free(q->org);
  free(q);
  *con_cls = NULL;
  __atomic_sub_fetch(&p->inflight, 1, __ATOMIC_SEQ_CST);
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
  char msg[512];
  vsnprintf(msg, sizeof(msg), fmt, ap);
  size_t n = strlen(msg);
  while (n > 0 && (msg[n - 1] == '\n' || msg[n - 1] == ' '))
    msg[--n] = '\0';
  log_debug("proxy http: %s", msg);
}

int ports_proxy_start(struct moat_proxy **out, struct moat_api *api, struct ports_state *ps,
                      const struct moat_api_config *cfg, moat_error **err) {
  unsigned port;
  bool ipv6;
  _cleanup_close_ int fd = api_listen_socket(cfg->proxy_listen, &port, &ipv6, err);
  if (fd < 0)
    return moat_error_wrap(err, "--proxy-listen");
  struct moat_proxy *p = xcalloc(1, sizeof(*p));
  p->control = api_control_of(api);
  p->fair = api_fair_of(api);
  p->ps = ps;
  p->domain = cfg->proxy_domain && *cfg->proxy_domain ? xstrdup(cfg->proxy_domain) : NULL;
  p->port = port;
  unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG |
                   MHD_USE_POLL | MHD_ALLOW_UPGRADE;
  if (ipv6)
    flags |= MHD_USE_DUAL_STACK;
  unsigned timeout = cfg->conn_timeout_s ? cfg->conn_timeout_s : 60;
  struct moat_api_limits lim = moat_api_limits_resolve(cfg->limits);
  if (api_limits_apply(&lim, err) < 0) {
    free(p->domain);
    free(p);
    return -1;
  }
  p->daemon = MHD_start_daemon(flags, 0, NULL, NULL, access_cb, p, MHD_OPTION_LISTEN_SOCKET, (MHD_socket)fd,
                               MHD_OPTION_CONNECTION_TIMEOUT, timeout, MHD_OPTION_NOTIFY_COMPLETED,
                               completed_cb, NULL, MHD_OPTION_NOTIFY_CONNECTION, api_gate_notify, NULL,
                               MHD_OPTION_URI_LOG_CALLBACK, uri_cb, NULL, MHD_OPTION_EXTERNAL_LOGGER, mhd_log,
                               NULL, MHD_OPTION_CONNECTION_LIMIT, lim.max_connections,
                               MHD_OPTION_PER_IP_CONNECTION_LIMIT, lim.max_conns_per_ip, MHD_OPTION_END);
  if (!p->daemon) {
    api_gate_stop();
    free(p->domain);
    free(p);
    return moat_error_set(err, EIO, "proxy listen on %s: libmicrohttpd failed to start", cfg->proxy_listen);
  }
  fd = -1;
  log_info("port proxy listening on %s (port %u, hosts PORT-ID.%s)", cfg->proxy_listen, port,
           p->domain ? p->domain : "*");
  *out = p;
  return 0;
}

unsigned ports_proxy_port(const struct moat_proxy *p) { return p ? p->port : 0; }

void ports_proxy_stop(struct moat_proxy *p) {
  if (!p)
    return;
  __atomic_store_n(&p->stopping, true, __ATOMIC_SEQ_CST);
  MHD_socket lfd = MHD_quiesce_daemon(p->daemon);
  if (lfd != MHD_INVALID_SOCKET)
    close(lfd);
  uint64_t deadline = now_ns() + 30 * 1000000000ULL;
  while (__atomic_load_n(&p->inflight, __ATOMIC_SEQ_CST) > 0 && now_ns() < deadline)
    usleep(20000);
  while (__atomic_load_n(&p->holds, __ATOMIC_SEQ_CST) > 0)
    usleep(20000);
  MHD_stop_daemon(p->daemon);
  api_gate_stop();
  free(p->domain);
  free(p);
}

/* ports.c -- exposed ports on the API listener: access settings, their routes and the path proxy
 *
 *   GET    /v1/sandboxes/ID/ports        the ports whose access was set
 *   POST   /v1/sandboxes/ID/ports/P      {public?: bool, token?: string} -> {port, public, token, url, path}
 *   GET    /v1/sandboxes/ID/ports/P      the same object (defaults for a port never set)
 *   DELETE /v1/sandboxes/ID/ports/P      back to the default (API key only)
 *   ANY    /v1/sandboxes/ID/ports/P/...  proxied to the server on port P inside the sandbox
 *
 * Settings live in this process only (a table guarded by one mutex). A private port with no token
 * given gets a random one ("mpt_" + 48 hex digits). Tokens are compared in constant time.
 */
#include <errno.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "../../common/buf.h"
#include "../../common/log.h"
#include "ports.h"

struct port_rule {
  char id[MOAT_ID_LEN + 1];
  unsigned port;
  char *org;
  bool public_;
  char *token; /* NULL when public */
  int64_t updated_ms;
  struct port_rule *next;
};

/* The ports front end's state. */
struct ports_state {
  pthread_mutex_t lock; /* guards rules; a leaf */
  struct port_rule *rules;
  char *domain;             /* the proxy listener's hosts' DOMAIN ("localhost": any), or NULL */
  unsigned proxy_port;      /* set at open, read-only after */
  struct port_pool *pool;   /* idle connections to servers in sandboxes (forward.c) */
  struct moat_proxy *proxy; /* the proxy listener, or NULL */
};

static bool token_eq(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);
  unsigned char d = la != lb;
  for (size_t i = 0; i < la; i++)
    d |= (unsigned char)(a[i] ^ b[i % (lb ? lb : 1)]);
  return d == 0;
}

static struct port_rule **find_locked(struct ports_state *ps, const char *id, unsigned port) {
  for (struct port_rule **p = &ps->rules; *p; p = &(*p)->next)
    if ((*p)->port == port && strcmp((*p)->id, id) == 0)
      return p;
  return NULL;
}

static void rule_free(struct port_rule *r) {
  free(r->org);
  free(r->token);
  free(r);
}

struct port_grant {
  struct ports_state *ps; /* lives as long as the api, which a connection holds */
  enum port_auth how;
  struct api_key_watch key; /* PORT_AUTH_KEY, PORT_AUTH_BEARER */
  char *token;              /* PORT_AUTH_TOKEN: the token presented */
  char id[MOAT_ID_LEN + 1];
  unsigned port;
};

bool port_grant_valid(struct port_grant *g) {
  if (!g)
    return true;
  if (g->how == PORT_AUTH_KEY || g->how == PORT_AUTH_BEARER)
    return !api_key_watch_revoked(&g->key);
  pthread_mutex_lock(&g->ps->lock);
  struct port_rule **p = find_locked(g->ps, g->id, g->port);
  struct port_rule *r = p ? *p : NULL;
  bool ok = r && (r->public_ || (g->how == PORT_AUTH_TOKEN && r->token && token_eq(g->token, r->token)));
  pthread_mutex_unlock(&g->ps->lock);
  return ok;
}

void port_grant_free(struct port_grant *g) {
  if (!g)
    return;
  if (g->token) {
    explicit_bzero(g->token, strlen(g->token));
    free(g->token);
  }
  free(g);
}

static struct port_grant *grant_new(struct ports_state *ps, struct moat_control *c, enum port_auth how,
                                    const char *key_id, const char *token, const char *id, unsigned port) {
  struct port_grant *g = xcalloc(1, sizeof(*g));
  g->ps = ps;
  g->how = how;
  api_key_watch_init_key(&g->key, c, how == PORT_AUTH_KEY || how == PORT_AUTH_BEARER ? key_id : NULL);
  g->token = how == PORT_AUTH_TOKEN && token ? xstrdup(token) : NULL;
  snprintf(g->id, sizeof(g->id), "%s", id);
  g->port = port;
  return g;
}

struct port_grant *port_grant_key(struct moat_control *c, const char *key_id) {
  return grant_new(NULL, c, PORT_AUTH_KEY, key_id, NULL, "", 0);
}

int ports_authorize(struct ports_state *ps, struct moat_control *c, const char *method, const char *id,
                    unsigned port, const char *xkey, const char *bearer, const char *token, char **org,
                    enum port_auth *how, struct port_grant **grant, moat_error **err) {
  *how = PORT_AUTH_KEY;
  pthread_mutex_lock(&ps->lock);
  struct port_rule **p = find_locked(ps, id, port);
  struct port_rule *r = p ? *p : NULL;
  bool pub = r && r->public_;
  char *rule_org = r ? xstrdup(r->org) : NULL;
  bool token_ok = token && r && r->token && token_eq(token, r->token);
  pthread_mutex_unlock(&ps->lock);
  int rc = 0;
  struct moat_key_info key;
  bool by_key = false;
  if (xkey && moat_control_auth_key(c, xkey, &key, NULL) == 0) {
    by_key = true;
  } else if (bearer && moat_control_auth_key(c, bearer, &key, NULL) == 0) {
    by_key = true;
    *how = PORT_AUTH_BEARER;
  } else if (token) {
    *how = PORT_AUTH_TOKEN;
    if (token_ok)
      *org = steal_pointer(&rule_org);
    else
      rc = moat_error_set(err, EPERM, "the port access token is not valid for port %u of %s", port, id);
  } else if (pub) {
    *how = PORT_AUTH_PUBLIC;
    *org = steal_pointer(&rule_org);
  } else {
    rc = moat_error_set(
        err, EACCES,
        "port %u of %s needs an API key (Authorization: Bearer KEY or X-API-Key) or its access "
        "token (" PORT_TOKEN_HEADER " header or ?" PORT_TOKEN_ARG "=)",
        port, id);
  }
  if (by_key) {
    if (key.role == MOAT_ROLE_READONLY && strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
      rc = moat_error_set(err, EPERM, "this API key's role is readonly: it may only read (GET), not %s",
                          method);
    else
      *org = xstrdup(key.org);
  }
  free(rule_org);
  if (rc == 0 && grant)
    *grant = grant_new(ps, c, *how, by_key ? key.id : NULL, token, id, port);
  return rc;
}

const char *ports_request_token(struct MHD_Connection *c, bool *from_query) {
  *from_query = false;
  const char *t = MHD_lookup_connection_value(c, MHD_HEADER_KIND, PORT_TOKEN_HEADER);
  if (t && *t)
    return t;
  t = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, PORT_TOKEN_ARG);
  if (t && *t) {
    *from_query = true;
    return t;
  }
  t = MHD_lookup_connection_value(c, MHD_COOKIE_KIND, PORT_TOKEN_COOKIE);
  return t && *t ? t : NULL;
}

char *ports_token_cookie(const char *token, const char *path) {
  return xasprintf(PORT_TOKEN_COOKIE "=%s; Path=%s; HttpOnly; SameSite=Lax", token, path);
}

char *ports_strip_token(const char *target) {
  const char *q = strchr(target, '?');
  if (!q)
    return xstrdup(target);
  struct moat_buf b = {0};
  moat_buf_append(&b, target, (size_t)(q - target));
  bool first = true;
  const char *p = q + 1;
  size_t klen = strlen(PORT_TOKEN_ARG);
  while (*p) {
    const char *e = strchr(p, '&');
    size_t n = e ? (size_t)(e - p) : strlen(p);
    bool ours = n >= klen && strncmp(p, PORT_TOKEN_ARG, klen) == 0 && (n == klen || p[klen] == '=');
    if (!ours && n > 0) {
      moat_buf_append(&b, first ? "?" : "&", 1);
      moat_buf_append(&b, p, n);
      first = false;
    }
    p += n;
    if (*p == '&')
      p++;
  }
  if (!b.p)
    moat_buf_append(&b, "", 0);
  return b.p;
}

/* ---- settings routes ---- */

/* The port's settings; a readonly key (ask) sees its token as null: the token passes any method. */
static json_t *rule_json(const struct ports_state *ps, const struct api_req *ask, const char *id,
                         unsigned port, const struct port_rule *r) {
  json_t *url = json_null();
  if (ps->domain) {
    char hostport[16] = "";
    if (ps->proxy_port && ps->proxy_port != 80)
      snprintf(hostport, sizeof(hostport), ":%u", ps->proxy_port);
    url = json_sprintf("http://%u-%s.%s%s/", port, id, ps->domain, hostport);
  }
  return json_pack("{s:I, s:b, s:o, s:o, s:o}", "port", (json_int_t)port, "public", r && r->public_, "token",
                   r && r->token && !api_req_readonly(ask) ? json_string(r->token) : json_null(), "url", url,
                   "path", json_sprintf("/v1/sandboxes/%s/ports/%u/", id, port));
}

/* 404 unless org's sandbox id exists and is not killed. */
static int check_sandbox(struct api_req *r) {
  struct moat_sandbox_info info = {0};
  moat_error *err = NULL;
  if (moat_control_get(api_control(r), r->org, r->route.id, &info, &err) < 0) {
    api_reply_moat_error(r, &err);
    return -1;
  }
  bool killed = info.state == MOAT_SB_KILLED;
  moat_sandbox_info_clear(&info);
  if (killed) {
    api_reply_error(r, 404, "not_found", "sandbox %s was killed", r->route.id);
    return -1;
  }
  return 0;
}

static int bad_port(struct api_req *r) {
  return api_reply_error(r, 400, "invalid_request", "the port must be a number from 1 to 65535");
}

int api_h_ports_list(struct api_req *r, json_t *body) {
  struct ports_state *ps = api_front_state(r->api, &api_front_ports);
  if (check_sandbox(r) < 0)
    return 0;
  json_t *arr = json_array();
  pthread_mutex_lock(&ps->lock);
  for (struct port_rule *p = ps->rules; p; p = p->next)
    if (strcmp(p->id, r->route.id) == 0 && strcmp(p->org, r->org) == 0)
      json_array_append_new(arr, rule_json(ps, r, p->id, p->port, p));
  pthread_mutex_unlock(&ps->lock);
  return api_reply_json(r, 200, json_pack("{s:o}", "ports", arr));
}

int api_h_port_get(struct api_req *r, json_t *body) {
  struct ports_state *ps = api_front_state(r->api, &api_front_ports);
  if (r->route.port == 0)
    return bad_port(r);
  if (check_sandbox(r) < 0)
    return 0;
  pthread_mutex_lock(&ps->lock);
  struct port_rule **p = find_locked(ps, r->route.id, r->route.port);
  json_t *j = rule_json(ps, r, r->route.id, r->route.port, p ? *p : NULL);
  pthread_mutex_unlock(&ps->lock);
  return api_reply_json(r, 200, j);
}

static bool valid_token(const char *t) {
  size_t n = strlen(t);
  if (n < PORT_TOKEN_MIN || n > PORT_TOKEN_MAX)
    return false;
  for (size_t i = 0; i < n; i++) {
    char c = t[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
          c == '_' || c == '.' || c == '~'))
      return false;
  }
  return true;
}

int api_h_port_expose(struct api_req *r, json_t *body) {
  struct ports_state *ps = api_front_state(r->api, &api_front_ports);
  if (r->route.port == 0)
    return bad_port(r);
  const char *key;
  json_t *v;
  bool pub = false;
  const char *token = NULL;
  json_object_foreach(body, key, v) {
    if (strcmp(key, "public") == 0) {
      if (!json_is_boolean(v))
        return api_reply_error(r, 400, "invalid_request", "public must be a boolean");
      pub = json_is_true(v);
    } else if (strcmp(key, "token") == 0) {
      if (json_is_null(v))
        continue;
      if (!json_is_string(v) || !valid_token(json_string_value(v)))
        return api_reply_error(r, 400, "invalid_request",
                               "token must be a string of %d to %d characters of [A-Za-z0-9._~-]",
                               PORT_TOKEN_MIN, PORT_TOKEN_MAX);
      token = json_string_value(v);
    } else {
      return api_reply_error(r, 400, "invalid_request", "unknown field '%.64s' (allowed: public, token)",
                             key);
    }
  }
  if (pub && token)
    return api_reply_error(r, 400, "invalid_request", "a public port takes no token");
  if (check_sandbox(r) < 0)
    return 0;
  char gen[4 + 48 + 1];
  if (!pub && !token) {
    uint8_t raw[24];
    random_bytes(raw, sizeof(raw));
    memcpy(gen, "mpt_", 4);
    for (size_t i = 0; i < sizeof(raw); i++)
      snprintf(gen + 4 + 2 * i, 3, "%02x", raw[i]);
    token = gen;
  }
  pthread_mutex_lock(&ps->lock);
  struct port_rule **p = find_locked(ps, r->route.id, r->route.port);
  struct port_rule *rule = p ? *p : NULL;
  if (!rule) {
    size_t n = 0;
    for (struct port_rule *q = ps->rules; q; q = q->next)
      n += strcmp(q->id, r->route.id) == 0;
    if (n >= PORTS_MAX_PER_SANDBOX) {
      pthread_mutex_unlock(&ps->lock);
      return api_reply_error(r, 400, "invalid_request", "at most %d ports of a sandbox have access settings",
                             PORTS_MAX_PER_SANDBOX);
    }
    rule = xcalloc(1, sizeof(*rule));
    snprintf(rule->id, sizeof(rule->id), "%s", r->route.id);
    rule->port = r->route.port;
    rule->next = ps->rules;
    ps->rules = rule;
  }
  free(rule->org);
  rule->org = xstrdup(r->org);
  free(rule->token);
  rule->token = token ? xstrdup(token) : NULL;
  rule->public_ = pub;
  rule->updated_ms = now_unix_ms();
  json_t *j = rule_json(ps, r, r->route.id, r->route.port, rule);
  pthread_mutex_unlock(&ps->lock);
  log_info("ports: %s port %u is %s", r->route.id, r->route.port, pub ? "public" : "token-protected");
  return api_reply_json(r, 200, j);
}

int api_h_port_unexpose(struct api_req *r, json_t *body) {
  struct ports_state *ps = api_front_state(r->api, &api_front_ports);
  if (r->route.port == 0)
    return bad_port(r);
  if (check_sandbox(r) < 0)
    return 0;
  pthread_mutex_lock(&ps->lock);
  struct port_rule **p = find_locked(ps, r->route.id, r->route.port);
  if (p) {
    struct port_rule *dead = *p;
    *p = dead->next;
    rule_free(dead);
  }
  pthread_mutex_unlock(&ps->lock);
  return api_reply_empty(r, 204);
}

/* ---- the path proxy ---- */

static bool env_stopping(void *a) { return api_stopping(a); }
static void env_hold(void *a) { api_hold(a); }
static void env_release(void *a) { api_release(a); }

static const char *hdr(struct api_req *r, const char *k) {
  const char *v = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, k);
  return v && *v ? v : NULL;
}

/* Queues the error of a proxied request. */
static bool proxy_error(struct api_req *r, moat_error **err) {
  const char *code;
  unsigned st = port_error_http(*err ? (*err)->status : 0, &code);
  if (st >= 500 && st != 502)
    log_warn("%s %s: %s", r->method, r->path, moat_error_msg(*err));
  api_reply_json(r, st, api_error_json(code, moat_error_msg(*err)));
  moat_error_free(err);
  return true;
}

static bool port_proxy_begin(struct api_req *r) {
  struct ports_state *ps = api_front_state(r->api, &api_front_ports);
  moat_error *err = NULL;
  if (r->route.port == 0) {
    bad_port(r);
    return true;
  }
  /* The raw request target: everything after "/v1/sandboxes/ID/ports/P" goes to the server as it
   * came (its percent-encoding untouched). */
  char prefix[96];
  snprintf(prefix, sizeof(prefix), "/v1/sandboxes/%s/ports/%u", r->route.id, r->route.port);
  size_t pl = strlen(prefix);
  const char *raw = r->raw_uri;
  if (!raw || strncmp(raw, prefix, pl) != 0 || raw[pl] != '/') {
    api_reply_error(r, 400, "invalid_request", "write the path as %s/... without percent-encoding", prefix);
    return true;
  }
  const char *xkey = hdr(r, "X-API-Key"), *bearer = NULL;
  enum port_auth how;
  const char *a = hdr(r, MHD_HTTP_HEADER_AUTHORIZATION);
  if (a && strncasecmp(a, "Bearer ", 7) == 0 && a[7])
    bearer = a + 7;
  bool from_query;
  const char *token = ports_request_token(r->conn, &from_query);
  struct port_grant *grant = NULL;
  if (ports_authorize(ps, api_control(r), r->method, r->route.id, r->route.port, xkey, bearer, token, &r->org,
                      &how, &grant, &err) < 0)
    return proxy_error(r, &err);
  if (api_req_admit(r, r->org, r->route.id, hdr(r, MHD_HTTP_HEADER_UPGRADE) != NULL, &err) < 0) {
    port_grant_free(grant);
    return proxy_error(r, &err);
  }
  _cleanup_free_ char *target = ports_strip_token(raw + pl);
  _cleanup_free_ char *cookie_path = xasprintf("%s/", prefix);
  _cleanup_free_ char *cookie =
      how == PORT_AUTH_TOKEN && from_query ? ports_token_cookie(token, cookie_path) : NULL;
  struct port_fwd_req fr = {
      .conn = r->conn,
      .method = r->method,
      .target = target,
      .prefix = prefix,
      .drop_authorization = how == PORT_AUTH_BEARER,
      .set_cookie = cookie,
      .env = {.stopping = env_stopping, .hold = env_hold, .release = env_release, .arg = r->api},
      .ticket = &r->ticket,
      .grant = grant,
  };
  struct port_fwd *f = port_fwd_open(ps->pool, api_control(r), r->org, r->route.id, r->route.port, &fr, &err);
  if (!f)
    return proxy_error(r, &err);
  r->front = f;
  r->front_free = port_fwd_free;
  return false;
}

static int port_proxy_body(struct api_req *r, const char *data, size_t len, moat_error **err) {
  return port_fwd_body(r->front, data, len, err);
}

static int port_proxy_finish(struct api_req *r) {
  moat_error *err = NULL;
  unsigned status = 0;
  struct MHD_Response *resp = port_fwd_respond(r->front, &status, &err);
  if (!resp) {
    proxy_error(r, &err);
    return 0;
  }
  int rc = api_reply_response(r, status, resp);
  MHD_destroy_response(resp);
  return rc;
}

/* ---- routes ---- */

/* A proxied request authenticates itself (API key, the port's token, or a public port) and streams
 * its body to the sandbox's server. */
static const struct api_route_hooks port_proxy = {
    .own_auth = true, .begin = port_proxy_begin, .body = port_proxy_body, .finish = port_proxy_finish};

#define PORTS "/v1/sandboxes/{id}/ports"
#define PROXIED(m)                                                                                           \
  { m, PORTS "/{port}/{*}", "port.proxy", NULL, 0, &port_proxy }

static const struct api_route_def ports_routes[] = {
    {"GET", PORTS, "ports.list", api_h_ports_list, 0, NULL},
    {"GET", PORTS "/{port}", "port.get", api_h_port_get, 0, NULL},
    {"POST", PORTS "/{port}", "port.expose", api_h_port_expose, API_RT_JSON, NULL},
    {"DELETE", PORTS "/{port}", "port.unexpose", api_h_port_unexpose, 0, NULL},
    PROXIED("GET"),
    PROXIED("HEAD"),
    PROXIED("POST"),
    PROXIED("PUT"),
    PROXIED("PATCH"),
    PROXIED("DELETE"),
    PROXIED("OPTIONS"),
};

static void ports_routes_add(struct api_router *rt) {
  api_router_add(rt, ports_routes, ARRAY_SIZE(ports_routes));
}

static void ports_close(void *state) {
  struct ports_state *ps = state;
  ports_proxy_stop(ps->proxy);
  port_pool_free(ps->pool);
  while (ps->rules) {
    struct port_rule *r = ps->rules;
    ps->rules = r->next;
    rule_free(r);
  }
  free(ps->domain);
  pthread_mutex_destroy(&ps->lock);
  free(ps);
}

/* The proxy listener starts with the api when its config names one. */
static int ports_open(struct moat_api *a, const struct moat_api_config *cfg, void **state, moat_error **err) {
  struct ports_state *ps = xcalloc(1, sizeof(*ps));
  pthread_mutex_init(&ps->lock, NULL);
  ps->pool = port_pool_new();
  if (cfg->proxy_listen) {
    if (ports_proxy_start(&ps->proxy, a, ps, cfg, err) < 0) {
      ports_close(ps);
      return -1;
    }
    ps->domain = xstrdup(cfg->proxy_domain && *cfg->proxy_domain ? cfg->proxy_domain : "localhost");
    ps->proxy_port = ports_proxy_port(ps->proxy);
  }
  *state = ps;
  return 0;
}

struct port_pool *ports_pool(const struct ports_state *ps) {
  return ps->pool;
}
struct port_pool *ports_pool_of(const struct moat_api *a) {
  struct ports_state *ps = api_front_state(a, &api_front_ports);
  return ps ? ps->pool : NULL;
}

const struct api_front api_front_ports = {
    .name = "ports", .routes = ports_routes_add, .open = ports_open, .close = ports_close};

unsigned moat_api_proxy_port(const struct moat_api *a) {
  struct ports_state *ps = api_front_state(a, &api_front_ports);
  return ps && ps->proxy ? ps->proxy_port : 0;
}

/* ui.c -- GET /ui/... (the dashboard's built assets) and POST/DELETE /ui/session (sign in and out)
 *
 * Assets: DIR/MANIFEST lists the built files, one relative path a line ([A-Za-z0-9._-] segments split
 * by '/', none starting with '.'); they are read into memory at start. A request path is looked up in
 * that list and nothing else: a path not listed (a "..", a "%2e%2e", an absolute one) is 404, and the
 * file system is never consulted after start. Without a manifest every /ui/ request is 503.
 *
 * Sessions (sessions.h): a table in memory (moatd's restart signs everybody out) of token -> API key
 * and expiry. The token is 32 random bytes in hex, compared in constant time.
 */
#include "ui.h"

#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../common/log.h"
#include "../../common/util.h"
#include "sessions.h"

#define UI_MAX_ASSETS 256
/* Every asset answer: only moatd's own scripts, styles (xterm.js sets element styles) and
 * connections; never framed; no sniffing. */
#define UI_CSP                                                                                               \
  "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; connect-src 'self'; "         \
  "frame-ancestors 'none'; base-uri 'none'; form-action 'none'; object-src 'none'"

struct ui_asset {
  char *name; /* as listed in the manifest */
  char *data;
  size_t len;
  const char *type;
};

struct ui_state {
  char *dir; /* NULL: no dashboard was built */
  char *why; /* why there are no assets */
  struct ui_asset assets[UI_MAX_ASSETS];
  size_t n_assets;
  struct ui_sessions *sessions;
};

/* ---- assets ---- */

static const char *content_type(const char *name) {
  const char *dot = strrchr(name, '.');
  static const struct {
    const char *ext, *type;
  } types[] = {
      {".html", "text/html; charset=utf-8"},
      {".js", "text/javascript; charset=utf-8"},
      {".mjs", "text/javascript; charset=utf-8"},
      {".css", "text/css; charset=utf-8"},
      {".svg", "image/svg+xml"},
      {".png", "image/png"},
      {".json", "application/json"},
      {".txt", "text/plain; charset=utf-8"},
      {".ico", "image/x-icon"},
  };
  for (size_t i = 0; dot && i < ARRAY_SIZE(types); i++)
    if (strcmp(dot, types[i].ext) == 0)
      return types[i].type;
  return NULL;
}

/* True when name is a manifest path: segments of [A-Za-z0-9._-], none empty or starting with '.'. */
bool api_ui_asset_name_ok(const char *name) {
  size_t n = strlen(name);
  if (n == 0 || n > 200)
    return false;
  bool seg_start = true;
  for (size_t i = 0; i < n; i++) {
    char c = name[i];
    if (c == '/') {
      if (seg_start)
        return false;
      seg_start = true;
      continue;
    }
    if (seg_start && c == '.')
      return false;
    seg_start = false;
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
          c == '_' || c == '-'))
      return false;
  }
  return !seg_start;
}

static int load_assets(struct ui_state *s, moat_error **err) {
  _cleanup_free_ char *manifest = xasprintf("%s/MANIFEST", s->dir);
  _cleanup_free_ char *text = NULL;
  size_t len;
  if (read_file(manifest, &text, &len, err) < 0)
    return -1;
  for (char *line = text, *next; line && *line; line = next) {
    next = strchr(line, '\n');
    if (next)
      *next++ = '\0';
    if (!*line)
      continue;
    if (!api_ui_asset_name_ok(line) || !content_type(line))
      return moat_error_set(err, EINVAL, "%s: '%.200s' is not a servable asset name", manifest, line);
    if (s->n_assets == UI_MAX_ASSETS)
      return moat_error_set(err, EINVAL, "%s: more than %d assets", manifest, UI_MAX_ASSETS);
    struct ui_asset *a = &s->assets[s->n_assets];
    _cleanup_free_ char *path = xasprintf("%s/%s", s->dir, line);
    if (read_file(path, &a->data, &a->len, err) < 0)
      return -1;
    a->name = xstrdup(line);
    a->type = content_type(line);
    s->n_assets++;
  }
  if (!s->n_assets)
    return moat_error_set(err, EINVAL, "%s lists no assets", manifest);
  return 0;
}

static const struct ui_asset *asset_find(const struct ui_state *s, const char *name) {
  for (size_t i = 0; i < s->n_assets; i++)
    if (strcmp(s->assets[i].name, name) == 0)
      return &s->assets[i];
  return NULL;
}

static void add_security_headers(struct MHD_Response *resp) {
  MHD_add_response_header(resp, "Content-Security-Policy", UI_CSP);
  MHD_add_response_header(resp, "X-Frame-Options", "DENY");
  MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff");
  MHD_add_response_header(resp, "Referrer-Policy", "no-referrer");
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
}

static struct ui_state *state_of(const struct api_req *r) { return api_front_state(r->api, &api_front_ui); }

/* 503 when the dashboard was not built: 0 when it was. */
static int need_assets(struct api_req *r, const struct ui_state *s) {
  if (s && s->n_assets)
    return 0;
  api_reply_error(r, 503, "unavailable",
                  "the web dashboard is not installed: %s (build it with `make` where node and npm are "
                  "installed, or pass moatd --ui-dir DIR)",
                  s && s->why ? s->why : "no assets");
  return -1;
}

static int h_ui_redirect(struct api_req *r, json_t *body) {
  if (api_args_none(r) < 0)
    return 0;
  struct MHD_Response *resp = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
  if (!resp)
    return -1;
  MHD_add_response_header(resp, MHD_HTTP_HEADER_LOCATION, "/ui/");
  int ret = api_reply_response(r, 308, resp);
  MHD_destroy_response(resp);
  return ret;
}

static int h_ui_asset(struct api_req *r, json_t *body) {
  struct ui_state *s = state_of(r);
  if (need_assets(r, s) < 0)
    return 0;
  const char *name = r->path + strlen("/ui/");
  if (!*name)
    name = "index.html";
  const struct ui_asset *a = api_ui_asset_name_ok(name) ? asset_find(s, name) : NULL;
  if (!a)
    return api_reply_error(r, 404, "not_found", "no such dashboard file: %.200s", r->path), 0;
  struct MHD_Response *resp = MHD_create_response_from_buffer(a->len, a->data, MHD_RESPMEM_PERSISTENT);
  if (!resp)
    return -1;
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, a->type);
  add_security_headers(resp);
  int ret = api_reply_response(r, 200, resp);
  MHD_destroy_response(resp);
  return ret;
}

/* ---- sessions ---- */

char *api_ui_session_key(const struct moat_api *a, const char *token) {
  struct ui_state *s = api_front_state(a, &api_front_ui);
  return s && token ? ui_sessions_key(s->sessions, token, now_unix_ms(), NULL) : NULL;
}

void api_ui_session_end(const struct moat_api *a, const char *token) {
  struct ui_state *s = api_front_state(a, &api_front_ui);
  if (s && token)
    ui_sessions_end(s->sessions, token);
}

/* A mutation of the session must come from the dashboard's own script: 0, or -1 after 403. */
static int need_csrf_header(struct api_req *r) {
  const char *h = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, UI_CSRF_HEADER);
  if (h && strcmp(h, "1") == 0)
    return 0;
  api_reply_error(r, 403, "forbidden", "this request must carry the header %s: 1 (the dashboard sends it)",
                  UI_CSRF_HEADER);
  return -1;
}

static int reply_cookie(struct api_req *r, unsigned status, json_t *body, const char *cookie) {
  char *s = json_dumps(body, JSON_COMPACT);
  json_decref(body);
  if (!s)
    abort();
  struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(s), s, MHD_RESPMEM_MUST_FREE);
  if (!resp) {
    free(s);
    return -1;
  }
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
  MHD_add_response_header(resp, MHD_HTTP_HEADER_SET_COOKIE, cookie);
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
  int ret = api_reply_response(r, status, resp);
  MHD_destroy_response(resp);
  return ret;
}

static int h_session_create(struct api_req *r, json_t *body) {
  struct ui_state *s = state_of(r);
  moat_error *err = NULL;
  if (api_args_none(r) < 0 || need_csrf_header(r) < 0)
    return 0;
  const char *k;
  json_t *v;
  json_object_foreach(body, k, v) {
    if (strcmp(k, "key") != 0)
      return api_reply_error(r, 400, "invalid_request",
                             "unknown field '%.64s' (the body is {\"key\": \"moat_...\"})", k),
             0;
  }
  const char *key = json_string_value(json_object_get(body, "key"));
  if (!key || !*key || strlen(key) > 512)
    return api_reply_error(r, 400, "invalid_request", "key: an API key string is required"), 0;
  struct moat_key_info info;
  if (moat_control_auth_key(api_control(r), key, &info, &err) < 0) {
    api_reply_unauthorized(r, err, "that API key is not valid");
    moat_error_free(&err);
    return 0;
  }
  int64_t now = now_unix_ms();
  int64_t expires = now + (int64_t)UI_SESSION_TTL_S * 1000;
  if (info.expires_at_ms && info.expires_at_ms < expires)
    expires = info.expires_at_ms;
  char token[UI_TOKEN_HEX + 1];
  ui_sessions_add(s->sessions, key, expires, now, token);
  char cookie[256];
  snprintf(cookie, sizeof(cookie), "%s=%s; Path=/; Max-Age=%lld; HttpOnly; SameSite=Strict", UI_COOKIE, token,
           (long long)((expires - now) / 1000));
  json_t *out = json_pack("{s:s, s:s, s:s, s:s, s:I}", "org", info.org, "key_id", info.id, "name", info.name,
                          "role", moat_key_role_name(info.role), "expires_at_ms", (json_int_t)expires);
  return reply_cookie(r, 201, out, cookie);
}

/* The session the cookie names: who it signs in as, until when. */
static int h_session_get(struct api_req *r, json_t *body) {
  struct ui_state *s = state_of(r);
  moat_error *err = NULL;
  if (api_args_none(r) < 0)
    return 0;
  const char *tok = MHD_lookup_connection_value(r->conn, MHD_COOKIE_KIND, UI_COOKIE);
  _cleanup_free_ char *key = NULL;
  int64_t expires = 0;
  if (tok)
    key = ui_sessions_key(s->sessions, tok, now_unix_ms(), &expires);
  if (!key)
    return api_reply_error(r, 401, "unauthorized", "not signed in to the dashboard (POST /ui/session)"), 0;
  struct moat_key_info info;
  int rc = moat_control_auth_key(api_control(r), key, &info, &err);
  explicit_bzero(key, strlen(key));
  if (rc < 0) {
    api_ui_session_end(r->api, tok);
    api_reply_unauthorized(r, err, "the session's API key is no longer valid: sign in again");
    moat_error_free(&err);
    return 0;
  }
  return api_reply_json(r, 200,
                        json_pack("{s:s, s:s, s:s, s:s, s:I}", "org", info.org, "key_id", info.id, "name",
                                  info.name, "role", moat_key_role_name(info.role), "expires_at_ms",
                                  (json_int_t)expires));
}

static int h_session_delete(struct api_req *r, json_t *body) {
  if (api_args_none(r) < 0 || need_csrf_header(r) < 0)
    return 0;
  const char *tok = MHD_lookup_connection_value(r->conn, MHD_COOKIE_KIND, UI_COOKIE);
  api_ui_session_end(r->api, tok);
  return reply_cookie(r, 200, json_pack("{s:b}", "signed_out", 1),
                      UI_COOKIE "=; Path=/; Max-Age=0; HttpOnly; SameSite=Strict");
}

/* ---- the front end ---- */

static const struct api_route_def ui_routes[] = {
    {"GET", "/ui", "ui.index", h_ui_redirect, API_RT_PUBLIC, NULL},
    {"POST", "/ui/session", "ui.session.create", h_session_create, API_RT_PUBLIC | API_RT_JSON, NULL},
    {"GET", "/ui/session", "ui.session.get", h_session_get, API_RT_PUBLIC, NULL},
    {"DELETE", "/ui/session", "ui.session.delete", h_session_delete, API_RT_PUBLIC, NULL},
    {"GET", "/ui/{*}", "ui.asset", h_ui_asset, API_RT_PUBLIC, NULL},
};

static void ui_routes_add(struct api_router *rt) { api_router_add(rt, ui_routes, ARRAY_SIZE(ui_routes)); }

static void ui_close(void *state) {
  struct ui_state *s = state;
  if (!s)
    return;
  for (size_t i = 0; i < s->n_assets; i++) {
    free(s->assets[i].name);
    free(s->assets[i].data);
  }
  ui_sessions_free(s->sessions);
  free(s->dir);
  free(s->why);
  free(s);
}

static int ui_open(struct moat_api *a, const struct moat_api_config *cfg, void **state, moat_error **err) {
  struct ui_state *s = xcalloc(1, sizeof(*s));
  s->sessions = ui_sessions_new(UI_MAX_SESSIONS);
  if (cfg->ui_dir) {
    s->dir = xstrdup(cfg->ui_dir);
    moat_error *e = NULL;
    if (load_assets(s, &e) < 0) {
      s->why = xstrdup(moat_error_msg(e));
      log_warn("the web dashboard is not served: %s", s->why);
      moat_error_free(&e);
      for (size_t i = 0; i < s->n_assets; i++) {
        free(s->assets[i].name);
        free(s->assets[i].data);
      }
      s->n_assets = 0;
    } else {
      log_info("the web dashboard: %zu files from %s at /ui/", s->n_assets, s->dir);
    }
  } else {
    s->why = xstrdup("it was not built (node and npm were missing at make time)");
  }
  *state = s;
  return 0;
}

const struct api_front api_front_ui = {
    .name = "ui", .routes = ui_routes_add, .open = ui_open, .close = ui_close};

/* e2b.c -- the E2B wire protocol on moatd's listener: claiming, auth, the control plane
 *
 * What the SDK sends (read from npm e2b 2.51.0, dist/index.mjs; see docs/e2b-compat.md):
 * - control plane to E2B_API_URL, key in "X-API-KEY": /v2/sandboxes, /sandboxes/{id}[/...],
 *   /snapshots, DELETE /templates/{id}. Errors are {"code": <int HTTP status>, "message"}.
 * - sandbox calls to E2B_SANDBOX_URL (one URL, routed by "E2b-Sandbox-Id" and "E2b-Sandbox-Port"),
 *   or to https://{port}-{id}.{domain} (Host routing, for a TLS proxy in front). The envd access
 *   token comes in "X-Access-Token" (envd, runCode) or "E2B-Traffic-Access-Token" (the code
 *   interpreter's context calls send only that one, and only when create returned a
 *   trafficAccessToken: we return the same token under both names).
 *
 * Sandboxes are moat sandboxes (same ids): one made through either API is visible through the
 * other. E2B template ids map onto moat templates (base -> base, code-interpreter-v1 ->
 * code-interpreter); E2B's timeout (seconds) is moat's TTL.
 *
 * The envd access token: "e2b1_" HEX(org) "_" HEX(HMAC-SHA256(secret, "envd\0" org "\0" id)). The
 * org is in the token because a sandbox call carries no API key and control needs the org; the
 * HMAC makes it unforgeable. The secret comes in the api's config (moatd keeps it in DATA/e2b-secret,
 * so tokens survive a restart); without one, the front end makes a random one for its lifetime.
 */
#include <errno.h>
#include <microhttpd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../common/log.h"
#include "../../common/sha256.h"
#include "e2b_internal.h"
#include "../ports/ports.h"

#define E2B_DEFAULT_TIMEOUT_S 300 /* the SDK's default (DEFAULT_SANDBOX_TIMEOUT_MS) */
#define E2B_LIST_DEFAULT_LIMIT 100
#define E2B_LIST_MAX_LIMIT 100

/* ---- secret and tokens ---- */

void e2b_hmac(const uint8_t *key, size_t klen, const void *msg, size_t mlen, uint8_t out[32]) {
  uint8_t k[64] = {0}, pad[64], inner[32];
  if (klen > 64) {
    moat_sha256(key, klen, k);
  } else {
    memcpy(k, key, klen);
  }
  struct moat_sha256 s;
  for (int i = 0; i < 64; i++)
    pad[i] = k[i] ^ 0x36;
  moat_sha256_init(&s);
  moat_sha256_update(&s, pad, 64);
  moat_sha256_update(&s, msg, mlen);
  moat_sha256_final(&s, inner);
  for (int i = 0; i < 64; i++)
    pad[i] = k[i] ^ 0x5c;
  moat_sha256_init(&s);
  moat_sha256_update(&s, pad, 64);
  moat_sha256_update(&s, inner, 32);
  moat_sha256_final(&s, out);
}

static void hex_into(char *out, const uint8_t *p, size_t n) {
  static const char h[] = "0123456789abcdef";
  for (size_t i = 0; i < n; i++) {
    out[2 * i] = h[p[i] >> 4];
    out[2 * i + 1] = h[p[i] & 15];
  }
  out[2 * n] = '\0';
}

char *e2b_access_token(const struct api_req *r, const char *org, const char *sandbox_id) {
  const struct e2b_state *st = e2b_state(r);
  size_t ol = strlen(org), il = strlen(sandbox_id);
  _cleanup_free_ char *msg = xmalloc(5 + ol + 1 + il);
  memcpy(msg, "envd\0", 5);
  memcpy(msg + 5, org, ol);
  msg[5 + ol] = '\0';
  memcpy(msg + 6 + ol, sandbox_id, il);
  uint8_t mac[32];
  e2b_hmac(st->secret, sizeof(st->secret), msg, 6 + ol + il, mac);
  _cleanup_free_ char *oh = xmalloc(2 * ol + 1);
  hex_into(oh, (const uint8_t *)org, ol);
  char mh[65];
  hex_into(mh, mac, 32);
  return xasprintf("e2b1_%s_%s", oh, mh);
}

static int unhex(char c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  return -1;
}

/* The org a token was minted for when it is valid for sandbox_id, else NULL (caller frees). */
static char *token_org(const struct api_req *r, const char *token, const char *sandbox_id) {
  if (strncmp(token, "e2b1_", 5) != 0)
    return NULL;
  const char *oh = token + 5, *us = strchr(oh, '_');
  if (!us || us == oh || (us - oh) % 2 != 0 || (us - oh) / 2 > 256)
    return NULL;
  size_t ol = (size_t)(us - oh) / 2;
  char *org = xmalloc(ol + 1);
  for (size_t i = 0; i < ol; i++) {
    int a = unhex(oh[2 * i]), b = unhex(oh[2 * i + 1]);
    if (a < 0 || b < 0 || (a == 0 && b == 0)) {
      free(org);
      return NULL;
    }
    org[i] = (char)(a << 4 | b);
  }
  org[ol] = '\0';
  _cleanup_free_ char *want = e2b_access_token(r, org, sandbox_id);
  size_t wl = strlen(want), tl = strlen(token);
  unsigned diff = wl != tl;
  for (size_t i = 0; i < wl && i < tl; i++)
    diff |= (unsigned)(want[i] ^ token[i]);
  if (diff) {
    free(org);
    return NULL;
  }
  return org;
}

/* ---- replies ---- */

/* {"code": status, "message"} as the SDK reads it (handleApiError: body.code, body.message). */
int e2b_error(struct api_req *r, unsigned status, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  return api_reply_json(r, status, json_pack("{s:i, s:s}", "code", (int)status, "message", msg));
}

int e2b_moat_error(struct api_req *r, moat_error **err) {
  const char *code;
  unsigned status = api_errno_http(*err ? (*err)->status : 0, &code);
  if (*err && (*err)->status == MOAT_E_NO_CHECKPOINTS)
    status = 501;
  int ret = e2b_error(r, status, "%s", moat_error_msg(*err));
  moat_error_free(err);
  return ret;
}

/* JSON body with one extra header (x-next-token). */
static int reply_json_header(struct api_req *r, unsigned status, json_t *body, const char *h, const char *v) {
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
  if (h && v)
    MHD_add_response_header(resp, h, v);
  int ret = api_reply_response(r, status, resp);
  MHD_destroy_response(resp);
  return ret;
}

/* ---- claiming ---- */

static const char *header(struct api_req *r, const char *name) {
  return MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, name);
}

static bool has_prefix_seg(const char *url, const char *p) {
  size_t n = strlen(p);
  return strncmp(url, p, n) == 0 && (url[n] == '\0' || url[n] == '/');
}

static bool control_path(const char *url) {
  static const char *const prefixes[] = {
      "/sandboxes",    "/v2/sandboxes", "/snapshots",     "/templates", "/v2/templates",
      "/v3/templates", "/volumes",      "/volumecontent", "/secrets",   NULL};
  for (size_t i = 0; prefixes[i]; i++)
    if (has_prefix_seg(url, prefixes[i]))
      return true;
  return false;
}

/* "PORT-ID.DOMAIN[:P]" -> port and id (router.c; the port proxy listener parses Hosts the same way). */
static bool parse_host(const char *host, unsigned *port, char id[MOAT_ID_LEN + 1]) {
  return api_parse_port_host(host, port, id, NULL);
}

static void e2b_req_free(void *p) {
  struct e2b_req *e = p;
  if (!e)
    return;
  if (e->sub && e->sub_free)
    e->sub_free(e->sub);
  free(e->org);
  free(e);
}

static bool e2b_claims(struct api_req *r) {
  const char *url = r->path;
  bool sandbox = header(r, "E2b-Sandbox-Id") != NULL;
  unsigned port;
  char id[MOAT_ID_LEN + 1];
  if (!sandbox)
    sandbox = parse_host(header(r, MHD_HTTP_HEADER_HOST), &port, id);
  if (!sandbox && !control_path(url))
    return false;
  struct e2b_req *e = xcalloc(1, sizeof(*e));
  r->front = e;
  r->front_free = e2b_req_free;
  e->port = sandbox ? 1 : 0; /* resolved in e2b_begin */
  return true;
}

/* ---- sandbox calls ---- */

static const char *api_key_of(struct api_req *r) {
  const char *h = header(r, "X-API-KEY");
  if (h && *h)
    return h;
  h = header(r, MHD_HTTP_HEADER_AUTHORIZATION);
  if (h && strncasecmp(h, "Bearer ", 7) == 0 && h[7])
    return h + 7;
  return NULL;
}

/* The E2B proxy's answer for a sandbox it cannot reach: 502 {"code":502,"message","sandboxId"}
 * (the SDK maps it to TimeoutError / SandboxNotFoundError, and isRunning() to false). */
static bool sandbox_gone(struct api_req *r, const char *id, const char *why) {
  api_reply_json(r, 502,
                 json_pack("{s:i, s:s, s:s}", "code", 502, "message", why, "sandboxId", id ? id : ""));
  return true;
}

static bool env_stopping(void *a) { return api_stopping(a); }
static void env_hold(void *a) { api_hold(a); }
static void env_release(void *a) { api_release(a); }

/* Any other port (Sandbox.getHost(port)): the request goes as it came to the server listening on
 * that port inside the sandbox, through the exposed-ports forwarder (forward.c). A port nothing
 * listens on is E2B's 502 "port is not open". */
static bool user_port_begin(struct api_req *r, struct e2b_req *e) {
  moat_error *err = NULL;
  if (header(r, MHD_HTTP_HEADER_UPGRADE) && api_req_stream(r, &err) < 0)
    return e2b_moat_error(r, &err), true;
  struct port_fwd_req fr = {
      .conn = r->conn,
      .method = r->method,
      .target = r->raw_uri ? r->raw_uri : "/",
      .env = {.stopping = env_stopping, .hold = env_hold, .release = env_release, .arg = r->api},
      .ticket = &r->ticket,
      /* a key's request ends with the key; a sandbox access token lasts as long as its sandbox */
      .grant = r->has_key ? port_grant_key(api_control(r), r->key.id) : NULL,
  };
  struct port_fwd *f =
      port_fwd_open(ports_pool_of(r->api), api_control(r), e->org, e->sandbox_id, e->port, &fr, &err);
  if (!f) {
    bool refused = err && err->status == ECONNREFUSED;
    if (refused) {
      moat_error_free(&err);
      return sandbox_gone(r, e->sandbox_id, "The sandbox is running but port is not open");
    }
    const char *code;
    unsigned st = port_error_http(err ? err->status : 0, &code);
    e2b_error(r, st, "%s", moat_error_msg(err));
    moat_error_free(&err);
    return true;
  }
  e->sub = f;
  e->sub_free = port_fwd_free;
  return false;
}

static void user_port_dispatch(struct api_req *r, struct e2b_req *e) {
  moat_error *err = NULL;
  unsigned status = 0;
  struct MHD_Response *resp = port_fwd_respond(e->sub, &status, &err);
  if (!resp) {
    const char *code;
    unsigned st = port_error_http(err ? err->status : 0, &code);
    e2b_error(r, st, "%s", moat_error_msg(err));
    moat_error_free(&err);
    return;
  }
  api_reply_response(r, status, resp);
  MHD_destroy_response(resp);
}

/* A readonly key may make GET and HEAD calls only: true after answering 403 to another. */
/* Also refuses the platform admin key: it manages orgs (/v1/orgs), it is no tenant's key. */
static bool e2b_refuse_readonly(struct api_req *r, const char *method) {
  if (r->has_key && r->key.role == MOAT_ROLE_PLATFORM) {
    e2b_error(r, 403, "this is the platform admin key: it manages orgs (/v1/orgs) and nothing of an org's");
    return true;
  }
  if (!r->has_key || r->key.role != MOAT_ROLE_READONLY || strcmp(method, "GET") == 0 ||
      strcmp(method, "HEAD") == 0)
    return false;
  e2b_error(r, 403, "this API key's role is readonly: it may only read (GET), not %s", method);
  return true;
}

static bool sandbox_begin(struct api_req *r, struct e2b_req *e, const char *url, const char *method) {
  const char *hid = header(r, "E2b-Sandbox-Id");
  if (hid) {
    const char *hp = header(r, "E2b-Sandbox-Port");
    uint64_t p;
    if (!hp || parse_u64(hp, &p) < 0 || p == 0 || p > 65535)
      return e2b_error(r, 400, "E2b-Sandbox-Port must be a port number next to E2b-Sandbox-Id"), true;
    if (!api_valid_sandbox_id(hid))
      return sandbox_gone(r, hid, "The sandbox was not found");
    e->port = (unsigned)p;
    snprintf(e->sandbox_id, sizeof(e->sandbox_id), "%s", hid);
  } else if (!parse_host(header(r, MHD_HTTP_HEADER_HOST), &e->port, e->sandbox_id)) {
    return e2b_error(r, 400, "no sandbox addressed"), true;
  }
  /* Auth: the sandbox's access token, or an API key of its org. */
  const char *tok = header(r, "X-Access-Token");
  if (!tok || !*tok)
    tok = header(r, "E2B-Traffic-Access-Token");
  if (tok && *tok) {
    e->org = token_org(r, tok, e->sandbox_id);
  } else {
    const char *key = api_key_of(r);
    moat_error *err = NULL;
    if (key && moat_control_auth_key(api_control(r), key, &r->key, &err) < 0)
      moat_error_free(&err);
    else if (key) {
      r->has_key = true;
      if (e2b_refuse_readonly(r, method))
        return true;
      e->org = xstrdup(r->key.org);
    }
  }
  if (!e->org)
    return e2b_error(r, 401, "a valid access token for sandbox %s is required (X-Access-Token)",
                     e->sandbox_id),
           true;
  r->org = xstrdup(e->org);
  snprintf(r->route.id, sizeof(r->route.id), "%s", e->sandbox_id);
  struct moat_sandbox_info info;
  memset(&info, 0, sizeof(info));
  moat_error *err = NULL;
  if (api_req_admit(r, e->org, e->sandbox_id, false, &err) < 0)
    return e2b_moat_error(r, &err), true;
  if (moat_control_get(api_control(r), e->org, e->sandbox_id, &info, &err) < 0) {
    bool gone = err && err->status == ENOENT;
    if (!gone) {
      e2b_moat_error(r, &err);
      return true;
    }
    moat_error_free(&err);
    return sandbox_gone(r, e->sandbox_id, "The sandbox was not found");
  }
  enum moat_sandbox_state st = info.state;
  moat_sandbox_info_clear(&info);
  if (st == MOAT_SB_KILLED)
    return sandbox_gone(r, e->sandbox_id, "The sandbox was not found");
  if (st == MOAT_SB_PAUSED)
    return sandbox_gone(r, e->sandbox_id, "The sandbox is paused; Sandbox.connect() resumes it");
  if (e->port == E2B_INTERP_PORT)
    return e2b_interp_begin(r, e, url, method);
  if (e->port == E2B_ENVD_PORT)
    return e2b_envd_begin(r, e, url, method);
  return user_port_begin(r, e);
}

/* ---- control plane: sandbox JSON ---- */

static const char *moat_template_of(const char *e2b) {
  if (strcmp(e2b, "code-interpreter-v1") == 0 || strcmp(e2b, "code-interpreter-beta") == 0)
    return "code-interpreter";
  return e2b;
}

static const char *e2b_template_of(const char *moat) {
  if (moat && strcmp(moat, "code-interpreter") == 0)
    return "code-interpreter-v1";
  return moat ? moat : "";
}

static bool is_e2b_running(enum moat_sandbox_state s) {
  return s == MOAT_SB_RUNNING || s == MOAT_SB_CREATING;
}
static bool is_e2b_paused(enum moat_sandbox_state s) {
  return s == MOAT_SB_PAUSED || s == MOAT_SB_HIBERNATED;
}

/* ListedSandbox / SandboxDetail; with_token adds envdAccessToken and domain. */
static json_t *sandbox_json(const struct api_req *r, const struct moat_sandbox_info *s, bool with_token) {
  json_t *o = json_object();
  json_object_set_new(o, "sandboxID", json_string(s->id));
  json_object_set_new(o, "templateID", json_string(e2b_template_of(s->template_name)));
  json_object_set_new(o, "clientID", json_string("moat"));
  json_object_set_new(o, "startedAt", api_time_json(s->created_at_ms, false));
  json_object_set_new(o, "endAt", s->persistent ? json_null() : api_time_json(s->expires_at_ms, true));
  json_object_set_new(o, "cpuCount", json_integer((json_int_t)(s->limits.cpu + 0.999)));
  json_object_set_new(o, "memoryMB", json_integer((json_int_t)s->limits.memory_mb));
  json_object_set_new(o, "diskSizeMB", json_integer((json_int_t)s->limits.disk_mb));
  json_object_set_new(o, "metadata", s->metadata ? json_incref(s->metadata) : json_object());
  json_object_set_new(o, "state", json_string(is_e2b_paused(s->state) ? "paused" : "running"));
  json_object_set_new(o, "envdVersion", json_string(E2B_ENVD_VERSION));
  json_object_set_new(o, "volumeMounts", json_array());
  if (with_token) {
    char *tok = e2b_access_token(r, s->org ? s->org : "", s->id);
    json_object_set_new(o, "envdAccessToken", json_string(tok));
    json_object_set_new(o, "trafficAccessToken", json_string(tok));
    free(tok);
    json_object_set_new(o, "domain", json_null());
    /* the network's policy now (v1's network state): false without an uplink or network */
    moat_error *nerr = NULL;
    json_t *net = moat_control_network_get(api_control(r), r->org, s->id, &nerr);
    moat_error_free(&nerr);
    json_t *pol = net ? json_object_get(net, "policy") : NULL;
    json_object_set_new(o, "allowInternetAccess",
                        json_boolean(pol && json_is_true(json_object_get(pol, "internet"))));
    json_decref(net);
  }
  return o;
}

/* The create / connect answer (model "Sandbox"). */
static json_t *sandbox_created_json(const struct api_req *r, const struct moat_sandbox_info *s) {
  char *tok = e2b_access_token(r, r->org, s->id);
  json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:n}", "sandboxID", s->id, "templateID",
                        e2b_template_of(s->template_name), "clientID", "moat", "envdVersion",
                        E2B_ENVD_VERSION, "envdAccessToken", tok, "trafficAccessToken", tok, "domain");
  free(tok);
  return o;
}

/* ---- control plane: handlers ---- */

static int read_body(struct api_req *r, bool empty_ok, json_t **out) {
  moat_error *err = NULL;
  if (api_body_parse(r->body ? r->body : "", r->body_len, empty_ok, out, &err) < 0)
    return e2b_moat_error(r, &err), -1;
  return 0;
}

/* timeout (seconds) -> *ttl; 400 reply and -1 when out of range. */
static int timeout_field(struct api_req *r, json_t *v, int64_t *ttl) {
  if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > MOAT_MAX_TTL_S) {
    e2b_error(r, 400, "'timeout' must be an integer number of seconds from 1 to %lld",
              (long long)MOAT_MAX_TTL_S);
    return -1;
  }
  *ttl = json_integer_value(v);
  return 0;
}

static bool falsy(json_t *v) { return json_is_null(v) || json_is_false(v); }

static int h_create(struct api_req *r) {
  json_t *body = NULL;
  if (read_body(r, false, &body) < 0)
    return -1;
  json_t *v1 = json_object();
  const char *tmpl = "base";
  int64_t ttl = E2B_DEFAULT_TIMEOUT_S;
  const char *key;
  json_t *v;
  int ret = 0;
  json_object_foreach(body, key, v) {
    if (strcmp(key, "templateID") == 0) {
      if (!json_is_string(v)) {
        ret = e2b_error(r, 400, "'templateID' must be a string");
        goto out;
      }
      tmpl = json_string_value(v);
    } else if (strcmp(key, "metadata") == 0) {
      if (!json_is_null(v))
        json_object_set(v1, "metadata", v);
    } else if (strcmp(key, "envVars") == 0) {
      if (!json_is_null(v))
        json_object_set(v1, "env", v);
    } else if (strcmp(key, "timeout") == 0) {
      if (timeout_field(r, v, &ttl) < 0)
        goto out;
    } else if (strcmp(key, "allow_internet_access") == 0) {
      /* true or absent: the sandbox gets what a v1 create without 'network' gets (the internet
       * through moatd's uplink; loopback only when the operator runs moatd without one). false:
       * v1's network {internet: false}, loopback only. */
      if (!json_is_boolean(v) && !json_is_null(v)) {
        ret = e2b_error(r, 400, "'allow_internet_access' must be a boolean");
        goto out;
      }
      if (json_is_false(v))
        json_object_set_new(v1, "network", json_pack("{s:b}", "internet", 0));
    } else if (strcmp(key, "autoPause") == 0 || strcmp(key, "secure") == 0 ||
               strcmp(key, "autoPauseMemory") == 0) {
      /* secure: every moat sandbox gets an access token. The others must be absent or false:
       * moat has no pause-on-timeout. */
      if (strcmp(key, "secure") == 0 ? !json_is_boolean(v) && !json_is_null(v) : !falsy(v)) {
        ret = e2b_error(r, 400, "'%s' is not supported by moat (see docs/e2b-compat.md)", key);
        goto out;
      }
    } else if (strcmp(key, "autoResume") == 0) {
      if (!json_is_null(v) && !falsy(json_object_get(v, "enabled"))) {
        ret = e2b_error(r, 400, "'autoResume' is not supported by moat (see docs/e2b-compat.md)");
        goto out;
      }
    } else if (strcmp(key, "network") == 0 && json_is_object(v) &&
               json_object_size(v) == (size_t)(json_object_get(v, "allowPublicTraffic") != NULL) &&
               falsy(json_object_get(v, "allowPublicTraffic"))) {
      /* {allowPublicTraffic: false}: moat's sandbox URLs always need the access token */
    } else if (strcmp(key, "network") == 0 || strcmp(key, "mcp") == 0 || strcmp(key, "volumeMounts") == 0 ||
               strcmp(key, "iam") == 0) {
      if (!json_is_null(v) && !(json_is_object(v) && json_object_size(v) == 0) &&
          !(json_is_array(v) && json_array_size(v) == 0)) {
        ret = e2b_error(r, 400, "'%s' is not supported by moat (see docs/e2b-compat.md)", key);
        goto out;
      }
    } else {
      ret = e2b_error(r, 400, "unknown field '%.128s'", key);
      goto out;
    }
  }
  char tmpl_buf[64];
  bool tag_missing = false;
  tmpl = moat_template_of(e2b_template_resolve(r, tmpl, tmpl_buf, sizeof(tmpl_buf), &tag_missing));
  bool snap = strncmp(tmpl, "snap-", 5) == 0;
  if (!snap && (tag_missing || !api_valid_template_name(tmpl) ||
                !moat_control_template_known(api_control(r), r->org, tmpl))) {
    ret = e2b_error(r, 404,
                    "template '%.64s' not found (moat has base, code-interpreter-v1 and the templates you "
                    "built or imported)",
                    tmpl);
    goto out;
  }
  if (!snap)
    json_object_set_new(v1, "template", json_string(tmpl));
  json_object_set_new(v1, "ttl_seconds", json_integer(ttl));
  struct moat_sandbox_spec spec;
  moat_error *err = NULL;
  if (api_parse_create(v1, 0, &spec, &err) < 0) {
    ret = e2b_moat_error(r, &err);
    goto out;
  }
  if (snap) /* Sandbox.create(snapshotId): a snapshot is E2B's template */
    spec.from_snapshot = tmpl;
  struct moat_sandbox_info info;
  memset(&info, 0, sizeof(info));
  if (moat_control_create(api_control(r), r->org, &spec, &info, &err) < 0) {
    if (snap && err && err->status == ENOENT) {
      moat_error_free(&err);
      ret = e2b_error(r, 404, "template '%.64s' not found (no such snapshot)", tmpl);
    } else {
      ret = e2b_moat_error(r, &err);
    }
    goto out;
  }
  ret = api_reply_json(r, 201, sandbox_created_json(r, &info));
  moat_sandbox_info_clear(&info);
out:
  json_decref(v1);
  json_decref(body);
  return ret;
}

/* GET /sandboxes/{id}: killed ones are gone for E2B. */
static int get_live(struct api_req *r, const char *id, struct moat_sandbox_info *info) {
  moat_error *err = NULL;
  if (moat_control_get(api_control(r), r->org, id, info, &err) < 0) {
    if (err && err->status == ENOENT) {
      moat_error_free(&err);
      return e2b_error(r, 404, "sandbox \"%s\" not found", id), -1;
    }
    return e2b_moat_error(r, &err), -1;
  }
  if (info->state == MOAT_SB_KILLED) {
    moat_sandbox_info_clear(info);
    return e2b_error(r, 404, "sandbox \"%s\" not found", id), -1;
  }
  return 0;
}

static int h_get(struct api_req *r, const char *id) {
  struct moat_sandbox_info info;
  memset(&info, 0, sizeof(info));
  if (get_live(r, id, &info) < 0)
    return -1;
  /* the envd access token would let a readonly key run commands and write files */
  int ret = api_reply_json(r, 200, sandbox_json(r, &info, !api_req_readonly(r)));
  moat_sandbox_info_clear(&info);
  return ret;
}

static int h_delete(struct api_req *r, const char *id) {
  moat_error *err = NULL;
  if (moat_control_kill(api_control(r), r->org, id, "api", &err) < 0) {
    if (err && err->status == ENOENT) {
      moat_error_free(&err);
      return e2b_error(r, 404, "sandbox \"%s\" not found", id);
    }
    return e2b_moat_error(r, &err);
  }
  return api_reply_empty(r, 204);
}

static int h_timeout(struct api_req *r, const char *id) {
  json_t *body = NULL;
  if (read_body(r, false, &body) < 0)
    return -1;
  int64_t ttl = 0;
  json_t *t = json_object_get(body, "timeout");
  int ret;
  if (!t) {
    ret = e2b_error(r, 400, "'timeout' is required");
  } else if (json_object_size(body) != 1) {
    ret = e2b_error(r, 400, "only 'timeout' may be set here");
  } else if (timeout_field(r, t, &ttl) < 0) {
    ret = -1;
  } else {
    struct moat_sandbox_patch p = {.has_ttl = true, .ttl_seconds = ttl};
    struct moat_sandbox_info info;
    memset(&info, 0, sizeof(info));
    moat_error *err = NULL;
    if (moat_control_update(api_control(r), r->org, id, &p, &info, &err) < 0) {
      if (err && err->status == ENOENT) {
        moat_error_free(&err);
        ret = e2b_error(r, 404, "sandbox \"%s\" not found", id);
      } else {
        ret = e2b_moat_error(r, &err);
      }
    } else {
      moat_sandbox_info_clear(&info);
      ret = api_reply_empty(r, 204);
    }
  }
  json_decref(body);
  return ret;
}

/* POST [/v2]/sandboxes/{id}/connect {timeout}: a running sandbox answers 200, a paused one would be
 * resumed (201); its TTL is raised to timeout when that is later than its current end. */
static int h_connect(struct api_req *r, const char *id, bool legacy_resume) {
  json_t *body = NULL;
  if (read_body(r, true, &body) < 0)
    return -1;
  int64_t ttl = 0;
  int ret = -1;
  const char *key;
  json_t *v;
  json_object_foreach(body, key, v) {
    if (strcmp(key, "timeout") == 0) {
      if (!json_is_null(v) && timeout_field(r, v, &ttl) < 0)
        goto out;
    } else if (strcmp(key, "memory") == 0 || strcmp(key, "autoPause") == 0) {
      if (!json_is_null(v) && !json_is_true(v) && strcmp(key, "memory") == 0) {
        ret = e2b_error(r, 400, "resuming without memory (onResume: 'reboot') is not supported by moat");
        goto out;
      }
      if (strcmp(key, "autoPause") == 0 && !falsy(v)) {
        ret = e2b_error(r, 400, "'autoPause' is not supported by moat (see docs/e2b-compat.md)");
        goto out;
      }
    } else {
      ret = e2b_error(r, 400, "unknown field '%.128s'", key);
      goto out;
    }
  }
  struct moat_sandbox_info info;
  memset(&info, 0, sizeof(info));
  if (get_live(r, id, &info) < 0)
    goto out;
  bool paused = is_e2b_paused(info.state);
  moat_error *err = NULL;
  if (!paused && legacy_resume) {
    moat_sandbox_info_clear(&info);
    ret = e2b_error(r, 409, "sandbox %s is already running", id);
    goto out;
  }
  if (paused) {
    int rc = info.state == MOAT_SB_HIBERNATED ? moat_control_wake(api_control(r), r->org, id, &err)
                                              : moat_control_resume(api_control(r), r->org, id, &err);
    moat_sandbox_info_clear(&info);
    if (rc < 0 || moat_control_get(api_control(r), r->org, id, &info, &err) < 0) {
      ret = e2b_moat_error(r, &err);
      goto out;
    }
  }
  if (ttl > 0 && !info.persistent && info.expires_at_ms < now_unix_ms() + ttl * 1000) {
    struct moat_sandbox_patch p = {.has_ttl = true, .ttl_seconds = ttl};
    moat_sandbox_info_clear(&info);
    if (moat_control_update(api_control(r), r->org, id, &p, &info, &err) < 0) {
      ret = e2b_moat_error(r, &err);
      goto out;
    }
  }
  ret = api_reply_json(r, paused ? 201 : 200, sandbox_created_json(r, &info));
  moat_sandbox_info_clear(&info);
out:
  json_decref(body);
  return ret;
}

/* POST /sandboxes/{id}/pause {memory}: 204, or 409 when paused already (the SDK returns false). */
static int h_pause(struct api_req *r, const char *id) {
  json_t *body = NULL;
  if (read_body(r, true, &body) < 0)
    return -1;
  json_t *mem = json_object_get(body, "memory");
  int ret;
  struct moat_sandbox_info info;
  memset(&info, 0, sizeof(info));
  moat_error *err = NULL;
  if (mem && !json_is_null(mem) && !json_is_true(mem)) {
    ret = e2b_error(r, 400, "pausing without memory (keepMemory: false) is not supported by moat");
  } else if (json_object_size(body) > (mem ? 1u : 0u)) {
    ret = e2b_error(r, 400, "only 'memory' may be set here");
  } else if (get_live(r, id, &info) < 0) {
    ret = -1;
  } else if (is_e2b_paused(info.state)) {
    ret = e2b_error(r, 409, "sandbox %s is already paused", id);
  } else if (moat_control_pause(api_control(r), r->org, id, &err) < 0) {
    ret = e2b_moat_error(r, &err);
  } else {
    ret = api_reply_empty(r, 204);
  }
  moat_sandbox_info_clear(&info);
  json_decref(body);
  return ret;
}

static json_t *snapshot_json(const struct moat_snapshot_info *s) {
  json_t *names = json_array();
  json_t *n = json_object_get(s->metadata, "e2b.name");
  if (json_is_string(n))
    json_array_append(names, n);
  return json_pack("{s:s, s:o, s:s, s:o}", "snapshotID", s->id, "names", names, "sandboxID", s->sandbox_id,
                   "createdAt", api_time_json(s->created_at_ms, false));
}

/* POST /sandboxes/{id}/snapshots {name?} -> 201 {snapshotID, names}. */
static int h_snapshot(struct api_req *r, const char *id) {
  json_t *body = NULL;
  if (read_body(r, true, &body) < 0)
    return -1;
  json_t *name = json_object_get(body, "name");
  int ret;
  if (json_object_size(body) > (name ? 1u : 0u)) {
    ret = e2b_error(r, 400, "only 'name' may be set here");
  } else if (name && !json_is_null(name) && (!json_is_string(name) || json_string_length(name) > 256)) {
    ret = e2b_error(r, 400, "'name' must be a string of at most 256 bytes");
  } else {
    json_t *meta = json_object();
    if (json_is_string(name))
      json_object_set(meta, "e2b.name", name);
    struct moat_snapshot_info si;
    memset(&si, 0, sizeof(si));
    moat_error *err = NULL;
    if (moat_control_snapshot_create(api_control(r), r->org, id, meta, &si, &err) < 0) {
      if (err && err->status == ENOENT) {
        moat_error_free(&err);
        ret = e2b_error(r, 404, "sandbox \"%s\" not found", id);
      } else {
        ret = e2b_moat_error(r, &err);
      }
    } else {
      ret = api_reply_json(r, 201, snapshot_json(&si));
      moat_snapshot_info_clear(&si);
    }
    json_decref(meta);
  }
  json_decref(body);
  return ret;
}

/* GET /snapshots?sandboxID=&name=&limit=&nextToken= (nextToken: the last snapshot id seen). */
static int h_snapshots_list(struct api_req *r) {
  const char *sid = NULL, *name = NULL, *after = NULL;
  long limit = E2B_LIST_DEFAULT_LIMIT;
  for (size_t i = 0; i < r->args.n; i++) {
    const char *k = r->args.v[i].key, *val = r->args.v[i].value;
    if (strcmp(k, "sandboxID") == 0) {
      sid = val;
    } else if (strcmp(k, "name") == 0) {
      name = val;
    } else if (strcmp(k, "nextToken") == 0) {
      after = val;
    } else if (strcmp(k, "limit") == 0) {
      uint64_t n;
      if (parse_u64(val, &n) < 0 || n < 1 || n > E2B_LIST_MAX_LIMIT)
        return e2b_error(r, 400, "'limit' must be an integer from 1 to %d", E2B_LIST_MAX_LIMIT);
      limit = (long)n;
    } else {
      return e2b_error(r, 400, "unknown query parameter '%.64s'", k);
    }
  }
  if (sid && !api_valid_sandbox_id(sid))
    return reply_json_header(r, 200, json_array(), NULL, NULL);
  struct moat_snapshot_info *v = NULL;
  size_t n = 0;
  moat_error *err = NULL;
  if (moat_control_snapshot_list(api_control(r), r->org, sid, &v, &n, &err) < 0)
    return e2b_moat_error(r, &err);
  json_t *arr = json_array();
  bool skipping = after != NULL;
  const char *last = NULL;
  char next[64] = "";
  for (size_t i = 0; i < n; i++) {
    if (skipping) {
      skipping = strcmp(v[i].id, after) != 0;
      continue;
    }
    json_t *nm = json_object_get(v[i].metadata, "e2b.name");
    if (name && !(json_is_string(nm) && strcmp(json_string_value(nm), name) == 0))
      continue;
    if ((long)json_array_size(arr) == limit) {
      snprintf(next, sizeof(next), "%s", last);
      break;
    }
    json_array_append_new(arr, snapshot_json(&v[i]));
    last = v[i].id;
  }
  moat_snapshot_infos_free(v, n);
  return reply_json_header(r, 200, arr, next[0] ? "x-next-token" : NULL, next);
}

/* DELETE /templates/{id}: the SDK's deleteSnapshot. */
static int h_snapshot_delete(struct api_req *r, const char *sid) {
  moat_error *err = NULL;
  if (strncmp(sid, "snap-", 5) != 0)
    return e2b_error(r, 404, "snapshot '%.64s' not found (moat deletes snapshots only, not templates)", sid);
  if (moat_control_snapshot_delete(api_control(r), r->org, sid, &err) < 0) {
    if (err && err->status == ENOENT) {
      moat_error_free(&err);
      return e2b_error(r, 404, "snapshot '%.64s' not found", sid);
    }
    return e2b_moat_error(r, &err);
  }
  return api_reply_empty(r, 204);
}

/* POST /sandboxes/{id}/fork {timeout, count} -> 201 [{sandbox: {...}}]. */
static int h_fork(struct api_req *r, const char *id) {
  json_t *body = NULL;
  if (read_body(r, true, &body) < 0)
    return -1;
  int64_t ttl = 0, count = 1;
  int ret = -1;
  const char *key;
  json_t *v;
  json_object_foreach(body, key, v) {
    if (json_is_null(v))
      continue;
    if (strcmp(key, "timeout") == 0) {
      if (timeout_field(r, v, &ttl) < 0)
        goto out;
    } else if (strcmp(key, "count") == 0) {
      if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 16) {
        ret = e2b_error(r, 400, "'count' must be an integer from 1 to 16");
        goto out;
      }
      count = json_integer_value(v);
    } else {
      ret = e2b_error(r, 400, "unknown field '%.128s'", key);
      goto out;
    }
  }
  struct moat_sandbox_info *kids = NULL;
  moat_error *err = NULL;
  if (moat_control_fork(api_control(r), r->org, id, (unsigned)count, false, &kids, &err) < 0) {
    if (err && err->status == ENOENT) {
      moat_error_free(&err);
      ret = e2b_error(r, 404, "sandbox \"%s\" not found", id);
    } else {
      ret = e2b_moat_error(r, &err);
    }
    goto out;
  }
  json_t *arr = json_array();
  for (int64_t i = 0; i < count; i++) {
    if (ttl > 0) {
      struct moat_sandbox_patch p = {.has_ttl = true, .ttl_seconds = ttl};
      struct moat_sandbox_info upd;
      memset(&upd, 0, sizeof(upd));
      if (moat_control_update(api_control(r), r->org, kids[i].id, &p, &upd, &err) < 0) {
        const char *code;
        unsigned st = api_errno_http(err ? err->status : 0, &code);
        json_array_append_new(
            arr, json_pack("{s:{s:i, s:s}}", "error", "code", (int)st, "message", moat_error_msg(err)));
        moat_error_free(&err);
        continue;
      }
      moat_sandbox_info_clear(&upd);
    }
    json_array_append_new(arr, json_pack("{s:o}", "sandbox", sandbox_created_json(r, &kids[i])));
  }
  moat_sandbox_infos_free(kids, (size_t)count);
  ret = api_reply_json(r, 201, arr);
out:
  json_decref(body);
  return ret;
}

static int hexval(char c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

/* Percent-decodes s[0..n) ('+' as space when plus) into a new string; NULL on a NUL byte. */
static char *pct_decode(const char *s, size_t n, bool plus) {
  char *o = xmalloc(n + 1);
  size_t j = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i] == '%' && i + 2 < n && hexval(s[i + 1]) >= 0 && hexval(s[i + 2]) >= 0) {
      o[j++] = (char)(hexval(s[i + 1]) << 4 | hexval(s[i + 2]));
      i += 2;
    } else if (plus && s[i] == '+') {
      o[j++] = ' ';
    } else {
      o[j++] = s[i];
    }
  }
  o[j] = '\0';
  if (strlen(o) != j) {
    free(o);
    return NULL;
  }
  return o;
}

/* metadata=k=v&k2=v2 (each key and value percent-encoded once more, as the SDK and E2B's API do)
 * -> object, or NULL after a 400 reply. */
static json_t *parse_meta_filter(struct api_req *r, const char *q) {
  json_t *m = json_object();
  const char *p = q;
  while (*p) {
    const char *amp = strchr(p, '&');
    size_t n = amp ? (size_t)(amp - p) : strlen(p);
    if (n > 0) {
      const char *eq = memchr(p, '=', n);
      if (!eq) {
        json_decref(m);
        e2b_error(r, 400, "'metadata' must be key=value pairs joined by '&'");
        return NULL;
      }
      _cleanup_free_ char *k1 = pct_decode(p, (size_t)(eq - p), true);
      _cleanup_free_ char *v1 = pct_decode(eq + 1, n - (size_t)(eq - p) - 1, true);
      _cleanup_free_ char *k = k1 ? pct_decode(k1, strlen(k1), false) : NULL;
      _cleanup_free_ char *v = v1 ? pct_decode(v1, strlen(v1), false) : NULL;
      if (!k || !v || !*k || !api_utf8_valid(k, strlen(k)) || !api_utf8_valid(v, strlen(v))) {
        json_decref(m);
        e2b_error(r, 400, "'metadata' holds an invalid key or value");
        return NULL;
      }
      json_object_set_new(m, k, json_string(v));
    }
    p += n;
    if (*p == '&')
      p++;
  }
  return m;
}

/* GET /v2/sandboxes?metadata=&state=running,paused&template=&startedAfter=&order=&limit=&nextToken=
 * (also GET /sandboxes). order=desc (the default: newest first, ties by id descending) or asc;
 * template: E2B's or moat's name; startedAfter: RFC 3339, started at or after it. nextToken is
 * "CREATED_MS.ID" of the last sandbox of the page before. */
static int h_list(struct api_req *r) {
  bool want_running = true, want_paused = true;
  long limit = E2B_LIST_DEFAULT_LIMIT;
  int64_t after_ms = -1;
  char after_id[MOAT_ID_LEN + 1] = "";
  json_t *meta = NULL;
  bool asc = false;
  int64_t started_after = INT64_MIN;
  const char *want_template = NULL;
  int ret;
  for (size_t i = 0; i < r->args.n; i++) {
    const char *k = r->args.v[i].key, *val = r->args.v[i].value;
    if (strcmp(k, "metadata") == 0 || strcmp(k, "query") == 0) {
      json_decref(meta);
      if (!(meta = parse_meta_filter(r, val)))
        return -1;
    } else if (strcmp(k, "state") == 0) {
      want_running = want_paused = false;
      _cleanup_free_ char *s = xstrdup(val);
      char *save = NULL;
      for (char *t = strtok_r(s, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (strcmp(t, "running") == 0)
          want_running = true;
        else if (strcmp(t, "paused") == 0)
          want_paused = true;
        else {
          json_decref(meta);
          return e2b_error(r, 400, "'state' must be running, paused or both (comma-separated), not '%.32s'",
                           t);
        }
      }
    } else if (strcmp(k, "limit") == 0) {
      uint64_t n;
      if (parse_u64(val, &n) < 0 || n < 1 || n > E2B_LIST_MAX_LIMIT) {
        json_decref(meta);
        return e2b_error(r, 400, "'limit' must be an integer from 1 to %d", E2B_LIST_MAX_LIMIT);
      }
      limit = (long)n;
    } else if (strcmp(k, "nextToken") == 0) {
      char *dot = strchr(val, '.');
      uint64_t ms;
      _cleanup_free_ char *num = dot ? xstrndup(val, (size_t)(dot - val)) : NULL;
      if (!dot || parse_u64(num, &ms) < 0 || !api_valid_sandbox_id(dot + 1)) {
        json_decref(meta);
        return e2b_error(r, 400, "'nextToken' is not a token this API handed out");
      }
      after_ms = (int64_t)ms;
      snprintf(after_id, sizeof(after_id), "%s", dot + 1);
    } else if (strcmp(k, "order") == 0) {
      if (strcmp(val, "asc") != 0 && strcmp(val, "desc") != 0) {
        json_decref(meta);
        return e2b_error(r, 400, "'order' must be asc or desc, not '%.32s'", val);
      }
      asc = strcmp(val, "asc") == 0;
    } else if (strcmp(k, "startedAfter") == 0) {
      if (api_parse_time_ms(val, &started_after) < 0) {
        json_decref(meta);
        return e2b_error(r, 400, "'startedAfter' must be an RFC 3339 time, not '%.40s'", val);
      }
    } else if (strcmp(k, "template") == 0) {
      want_template = *val ? val : NULL;
    } else {
      json_decref(meta);
      return e2b_error(r, 400, "unknown query parameter '%.64s'", k);
    }
  }
  /* the store's pages in the order asked, from the token on, limit + 1 rows at a time, until the page
   * is full and one more match shows that another page follows */
  struct moat_store_page pg = {.limit = (size_t)limit + 1, .desc = !asc};
  if (after_ms >= 0) {
    pg.after_id = after_id;
    pg.after_created_ms = after_ms;
  }
  char seek_id[MOAT_ID_LEN + 1], last_id[MOAT_ID_LEN + 1] = "";
  int64_t last_ms = 0;
  json_t *arr = json_array();
  char next[64] = "";
  bool done = false;
  while (!done) {
    struct moat_sandbox_info *v = NULL;
    size_t n = 0;
    bool more = false;
    moat_error *err = NULL;
    if (moat_control_list_page(api_control(r), r->org, NULL, meta, NULL, &pg, &v, &n, NULL, &more, &err) <
        0) {
      json_decref(arr);
      json_decref(meta);
      return e2b_moat_error(r, &err);
    }
    for (size_t i = 0; i < n && !done; i++) {
      const struct moat_sandbox_info *s = &v[i];
      if (s->created_at_ms < started_after) {
        done = !asc; /* newest first: all that follow started earlier still */
        continue;
      }
      if (!(is_e2b_running(s->state) ? want_running : is_e2b_paused(s->state) ? want_paused : false))
        continue;
      if (want_template && strcmp(want_template, e2b_template_of(s->template_name)) != 0 &&
          strcmp(want_template, s->template_name ? s->template_name : "base") != 0)
        continue;
      if ((long)json_array_size(arr) == limit) {
        snprintf(next, sizeof(next), "%lld.%s", (long long)last_ms, last_id);
        done = true;
        break;
      }
      json_array_append_new(arr, sandbox_json(r, s, false));
      last_ms = s->created_at_ms;
      snprintf(last_id, sizeof(last_id), "%s", s->id);
    }
    if (!done && more && n) {
      snprintf(seek_id, sizeof(seek_id), "%s", v[n - 1].id);
      pg.after_id = seek_id;
      pg.after_created_ms = v[n - 1].created_at_ms;
    }
    done = done || !more;
    moat_sandbox_infos_free(v, n);
  }
  json_decref(meta);
  ret = reply_json_header(r, 200, arr, next[0] ? "x-next-token" : NULL, next);
  return ret;
}

/* ---- dispatch ---- */

/* A control-plane path split into segments: /sandboxes/{id}/timeout -> "sandboxes" ID "timeout". */
struct cpath {
  bool v2;
  const char *seg[4];
  size_t n;
  char buf[512];
};

static bool split_path(const char *url, struct cpath *p) {
  memset(p, 0, sizeof(*p));
  if (strlen(url) >= sizeof(p->buf))
    return false;
  snprintf(p->buf, sizeof(p->buf), "%s", url);
  char *s = p->buf;
  if (strncmp(s, "/v2/", 4) == 0) {
    p->v2 = true;
    s += 3;
  }
  char *save = NULL;
  for (char *t = strtok_r(s, "/", &save); t; t = strtok_r(NULL, "/", &save)) {
    if (p->n == 4)
      return false;
    p->seg[p->n++] = t;
  }
  return p->n > 0;
}

static int method_not_allowed(struct api_req *r) {
  return e2b_error(r, 405, "method %s is not allowed on %.256s", r->method, r->path);
}

/* x >= 0 rounded to `scale` (100: two decimals); libm is not linked. */
static double round_to(double x, double scale) { return (double)(long long)(x * scale + 0.5) / scale; }

/* ---- E2B: GET /sandboxes/{id}/metrics?start=S&end=E ---- */

static int metrics_err(struct api_req *r, unsigned status, const char *msg) {
  return api_reply_json(r, status, json_pack("{s:i, s:s}", "code", (int)status, "message", msg));
}

static int e2b_metrics(struct api_req *r, const char *id) {
  /* start and end: unix seconds (the SDK rounds Dates), either may be left out: the recorded
   * samples in [start, end] (metering's history, oldest first), then the current sample when now
   * lies in the range. */
  static const char *const allowed[] = {"start", "end", NULL};
  moat_error *err = NULL;
  if (api_args_check(&r->args, allowed, &err) < 0) {
    int ret = metrics_err(r, 400, moat_error_msg(err));
    moat_error_free(&err);
    return ret;
  }
  uint64_t start = 0, end = UINT64_MAX;
  const char *s = api_arg_get(&r->args, "start"), *e = api_arg_get(&r->args, "end");
  if (s && parse_u64(s, &start) < 0)
    return metrics_err(r, 400, "start must be unix seconds");
  if (e && parse_u64(e, &end) < 0)
    return metrics_err(r, 400, "end must be unix seconds");
  if (start > end)
    return metrics_err(r, 400, "start is after end");
  struct moat_sandbox_usage u;
  struct moat_cpu_pct pct;
  if (moat_control_usage_cpu(api_control(r), r->org, id, &u, &pct, &err) < 0) {
    const char *code;
    unsigned st = api_errno_http(err->status, &code);
    int ret = metrics_err(r, st, moat_error_msg(err));
    moat_error_free(&err);
    return ret;
  }
  json_t *list = json_array();
  struct moat_store_meter_sample *hist = NULL;
  size_t nh = 0;
  int64_t h_from = start > (uint64_t)(INT64_MAX / 1000) ? INT64_MAX : (int64_t)start * 1000;
  int64_t h_to = end >= (uint64_t)(INT64_MAX / 1000) ? INT64_MAX : (int64_t)(end + 1) * 1000;
  if (moat_control_metrics_series(api_control(r), r->org, id, h_from, h_to, 10000, &hist, &nh, &err) < 0)
    moat_error_free(&err); /* the current sample still answers */
  for (size_t i = 0; i < nh; i++) {
    const struct moat_store_meter_sample *h = &hist[i];
    double cpus = h->cpu_count;
    json_array_append_new(
        list,
        json_pack("{s:o, s:I, s:i, s:i, s:f, s:I, s:I, s:I, s:I}", "timestamp",
                  api_time_json(h->at_ms, false), "timestampUnix", (json_int_t)(h->at_ms / 1000), "memCache",
                  0, "cpuCount", (int)cpus + (cpus > (int)cpus), "cpuUsedPct", round_to(h->cpu_pct, 100),
                  "memUsed", (json_int_t)h->mem_used, "memTotal", (json_int_t)h->mem_limit, "diskUsed",
                  (json_int_t)(h->disk_used > 0 ? h->disk_used : 0), "diskTotal",
                  (json_int_t)(h->disk_total > 0 ? h->disk_total : (int64_t)(u.limits.disk_mb << 20))));
  }
  moat_store_meter_samples_free(hist, nh);
  uint64_t now_s = (uint64_t)(u.at_ms / 1000);
  /* The SDK rounds start/end to whole seconds: a window ending this second includes now. */
  if (now_s + 1 >= start && now_s <= end) {
    json_t *m =
        json_pack("{s:o, s:I, s:i, s:i, s:f, s:I, s:I, s:I, s:I}", "timestamp", api_time_json(u.at_ms, false),
                  "timestampUnix", (json_int_t)now_s, "memCache", 0, /* not sampled: memUsed includes it */
                  "cpuCount", (int)u.limits.cpu + (u.limits.cpu > (int)u.limits.cpu), "cpuUsedPct",
                  round_to(pct.pct, 100), "memUsed", (json_int_t)u.u.memory_bytes, "memTotal",
                  (json_int_t)(u.limits.memory_mb << 20), "diskUsed", (json_int_t)u.disk_used_bytes,
                  "diskTotal", (json_int_t)(u.has_disk ? u.disk_total_bytes : u.limits.disk_mb << 20));
    json_array_append_new(list, m);
  }
  return api_reply_json(r, 200, list);
}

static void control_dispatch(struct api_req *r) {
  struct cpath p;
  const char *m = r->method;
  if (e2b_template_dispatch(r))
    return;
  if (!split_path(r->path, &p)) {
    e2b_error(r, 404, "no such E2B route: %s %.256s", m, r->path);
    return;
  }
  bool get = strcmp(m, "GET") == 0, post = strcmp(m, "POST") == 0, del = strcmp(m, "DELETE") == 0;
  if (strcmp(p.seg[0], "sandboxes") == 0) {
    if (p.n == 1) {
      if (post)
        h_create(r);
      else if (get)
        h_list(r);
      else
        method_not_allowed(r);
      return;
    }
    const char *id = p.seg[1];
    if (!api_valid_sandbox_id(id)) {
      e2b_error(r, 404, "sandbox \"%.64s\" not found", id);
      return;
    }
    if (p.n == 2 && !p.v2) {
      if (get)
        h_get(r, id);
      else if (del)
        h_delete(r, id);
      else
        method_not_allowed(r);
      return;
    }
    if (p.n == 3) {
      const char *what = p.seg[2];
      if (strcmp(what, "connect") == 0) {
        post ? h_connect(r, id, false) : method_not_allowed(r);
        return;
      }
      if (!p.v2 && strcmp(what, "resume") == 0) {
        post ? h_connect(r, id, true) : method_not_allowed(r);
        return;
      }
      if (!p.v2 && strcmp(what, "timeout") == 0) {
        post ? h_timeout(r, id) : method_not_allowed(r);
        return;
      }
      if (!p.v2 && strcmp(what, "pause") == 0) {
        post ? h_pause(r, id) : method_not_allowed(r);
        return;
      }
      if (!p.v2 && strcmp(what, "snapshots") == 0) {
        post ? h_snapshot(r, id) : method_not_allowed(r);
        return;
      }
      if (!p.v2 && strcmp(what, "fork") == 0) {
        post ? h_fork(r, id) : method_not_allowed(r);
        return;
      }
      if (!p.v2 && strcmp(what, "metrics") == 0) {
        get ? e2b_metrics(r, id) : method_not_allowed(r);
        return;
      }
      if (!p.v2 &&
          (strcmp(what, "logs") == 0 || strcmp(what, "network") == 0 || strcmp(what, "refreshes") == 0)) {
        e2b_error(r, 501, "%s is not supported by moat (see docs/e2b-compat.md)", what);
        return;
      }
    }
  } else if (strcmp(p.seg[0], "snapshots") == 0 && !p.v2 && p.n == 1) {
    get ? h_snapshots_list(r) : method_not_allowed(r);
    return;
  } else if (strcmp(p.seg[0], "templates") == 0 && !p.v2 && p.n == 2 && del) {
    h_snapshot_delete(r, p.seg[1]);
    return;
  } else if (strcmp(p.seg[0], "templates") == 0) {
    e2b_error(r, 501, "%s %.200s is not supported by moat (see docs/e2b-compat.md)", m, r->path);
    return;
  } else if (strcmp(p.seg[0], "volumes") == 0 || strcmp(p.seg[0], "volumecontent") == 0 ||
             strcmp(p.seg[0], "secrets") == 0) {
    e2b_error(r, 501, "E2B %s are not supported by moat (see docs/e2b-compat.md)", p.seg[0]);
    return;
  }
  e2b_error(r, 404, "no such E2B route: %s %.256s", m, r->path);
}

static bool e2b_begin(struct api_req *r) {
  const char *url = r->path, *method = r->method;
  struct e2b_req *e = r->front;
  if (e->port) /* a sandbox call */
    return sandbox_begin(r, e, url, method);
  if (e2b_template_upload_begin(r, e))
    return true;
  if (e->upload)
    return false;
  const char *key = api_key_of(r);
  moat_error *err = NULL;
  if (!key || moat_control_auth_key(api_control(r), key, &r->key, &err) < 0) {
    bool expired = err && err->status == EKEYEXPIRED;
    moat_error_free(&err);
    return e2b_error(r, 401, "%s",
                     expired ? "the API key expired"
                             : "a valid API key is required (X-API-KEY: the moatd API key)"),
           true;
  }
  r->has_key = true;
  r->org = xstrdup(r->key.org);
  if (e2b_refuse_readonly(r, method))
    return true;
  e->org = xstrdup(r->org);
  if (api_req_admit(r, r->org, NULL, false, &err) < 0)
    return e2b_moat_error(r, &err), true;
  const char *cl = header(r, MHD_HTTP_HEADER_CONTENT_LENGTH);
  uint64_t n;
  if (cl && parse_u64(cl, &n) == 0 && n > API_MAX_BODY)
    return e2b_error(r, 413, "request body is larger than %d bytes", API_MAX_BODY), true;
  return false;
}

static int e2b_body(struct api_req *r, const char *data, size_t len, moat_error **err) {
  struct e2b_req *e = r->front;
  if (e->upload)
    return e2b_template_upload_body(r, e, data, len, err);
  if (e->port == E2B_INTERP_PORT)
    return e2b_interp_body(r, e, data, len, err);
  if (e->port == E2B_ENVD_PORT)
    return e2b_envd_body(r, e, data, len, err);
  if (e->port != 0)
    return port_fwd_body(e->sub, data, len, err);
  if (len > API_MAX_BODY - r->body_len)
    return moat_error_set(err, EMSGSIZE, "request body is larger than %d bytes", API_MAX_BODY);
  if (r->body_len + len + 1 > r->body_cap) {
    size_t cap = r->body_cap ? r->body_cap : 4096;
    while (cap < r->body_len + len + 1)
      cap *= 2;
    r->body = xrealloc(r->body, cap);
    r->body_cap = cap;
  }
  memcpy(r->body + r->body_len, data, len);
  r->body_len += len;
  r->body[r->body_len] = '\0';
  return 0;
}

static int e2b_finish(struct api_req *r) {
  struct e2b_req *e = r->front;
  if (e->upload)
    e2b_template_upload_finish(r, e);
  else if (e->port == E2B_INTERP_PORT)
    e2b_interp_dispatch(r, e);
  else if (e->port == E2B_ENVD_PORT)
    e2b_envd_dispatch(r, e);
  else if (e->port == 0)
    control_dispatch(r);
  else
    user_port_dispatch(r, e);
  if (!r->responded)
    e2b_error(r, 500, "the handler produced no response");
  return 0;
}

static const struct api_route_hooks e2b_hooks = {
    .own_auth = true, .begin = e2b_begin, .body = e2b_body, .finish = e2b_finish};
static const struct api_claimer e2b_claimer = {.claims = e2b_claims, .hooks = &e2b_hooks};

static int e2b_open(struct moat_api *a, const struct moat_api_config *cfg, void **state, moat_error **err) {
  struct e2b_state *st = xcalloc(1, sizeof(*st));
  if (cfg->token_secret && cfg->token_secret_len == sizeof(st->secret)) {
    memcpy(st->secret, cfg->token_secret, sizeof(st->secret));
  } else {
    random_bytes(st->secret, sizeof(st->secret));
    log_warn("e2b: no token secret configured; E2B access tokens will not survive a restart");
  }
  st->fs = envd_fs_state_new();
  *state = st;
  return 0;
}

static void e2b_close(void *state) {
  struct e2b_state *st = state;
  envd_fs_state_free(st->fs);
  explicit_bzero(st->secret, sizeof(st->secret));
  free(st);
}

struct e2b_state *e2b_state(const struct api_req *r) {
  return api_front_state(r->api, &api_front_e2b);
}

const struct api_front api_front_e2b = {
    .name = "e2b", .claimer = &e2b_claimer, .open = e2b_open, .close = e2b_close};

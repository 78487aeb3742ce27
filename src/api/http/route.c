/* route.c -- the route table: front ends register {method, pattern, name, handler, flags}; a request's
 * method and path pick one (pure)
 *
 * A pattern is "/"-separated segments, each a literal or a placeholder that checks and keeps its
 * segment: {id} a sandbox id, {name} a template name, {sid} a snapshot id as given, {kid} an API key id
 * as given, {cid} a context id,
 * {proc} a pid or a process tag, {port} a port number (0 when the segment is not one), and a last {*}
 * that takes the rest of the path, slashes and nothing included. A path that no pattern matches is
 * 404; one that some pattern matches under other methods only is 405 with those methods in Allow.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http.h"

struct api_router {
  const struct api_route_def **defs;
  size_t n, cap;
};

struct api_router *api_router_new(void) {
  return xcalloc(1, sizeof(struct api_router));
}

void api_router_free(struct api_router *rt) {
  if (!rt)
    return;
  free(rt->defs);
  free(rt);
}

void api_router_add(struct api_router *rt, const struct api_route_def *defs, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (rt->n == rt->cap) {
      rt->cap = rt->cap ? rt->cap * 2 : 64;
      rt->defs = xrealloc(rt->defs, rt->cap * sizeof(*rt->defs));
    }
    rt->defs[rt->n++] = &defs[i];
  }
}

size_t api_router_count(const struct api_router *rt) { return rt->n; }
const struct api_route_def *api_router_at(const struct api_router *rt, size_t i) {
  return i < rt->n ? rt->defs[i] : NULL;
}

bool api_valid_sandbox_id(const char *s) {
  if (strncmp(s, "sb-", 3) != 0)
    return false;
  size_t i;
  for (i = 3; s[i]; i++) {
    char c = s[i];
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')))
      return false;
  }
  return i == MOAT_ID_LEN;
}

bool api_valid_template_name(const char *s) {
  size_t i;
  if (!((s[0] >= 'a' && s[0] <= 'z') || (s[0] >= '0' && s[0] <= '9')))
    return false;
  for (i = 1; s[i]; i++) {
    char c = s[i];
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-'))
      return false;
  }
  return i <= 63;
}

static bool name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' ||
         c == '-';
}

bool api_valid_tag(const char *s) {
  size_t i;
  bool digits = true;
  for (i = 0; s[i]; i++) {
    if (!name_char(s[i]))
      return false;
    if (s[i] < '0' || s[i] > '9')
      digits = false;
  }
  return i >= 1 && i <= API_MAX_TAG && !digits;
}

bool api_parse_port_host(const char *host, unsigned *port, char id[MOAT_ID_LEN + 1], const char **domain) {
  if (!host)
    return false;
  const char *dash = strchr(host, '-');
  if (!dash || dash == host || dash - host > 5)
    return false;
  unsigned p = 0;
  for (const char *c = host; c < dash; c++) {
    if (*c < '0' || *c > '9')
      return false;
    p = p * 10 + (unsigned)(*c - '0');
  }
  const char *dot = strchr(dash + 1, '.');
  if (!dot || dot - dash - 1 != MOAT_ID_LEN)
    return false;
  char buf[MOAT_ID_LEN + 1];
  memcpy(buf, dash + 1, MOAT_ID_LEN);
  buf[MOAT_ID_LEN] = '\0';
  if (!api_valid_sandbox_id(buf) || p == 0 || p > 65535)
    return false;
  *port = p;
  memcpy(id, buf, sizeof(buf));
  if (domain)
    *domain = dot + 1;
  return true;
}

/* Checks segment s (n bytes) against placeholder ph ("id", "name", ...) and keeps it in r. */
static bool take(const char *ph, size_t phn, const char *s, size_t n, struct api_route *r) {
  char buf[API_MAX_TAG + 1];
#define PH(lit) (phn == sizeof(lit) - 1 && memcmp(ph, lit, phn) == 0)
  if (PH("id")) {
    if (n != MOAT_ID_LEN)
      return false;
    memcpy(r->id, s, n);
    r->id[n] = '\0';
    return api_valid_sandbox_id(r->id);
  }
  if (PH("name")) {
    if (n == 0 || n >= sizeof(r->name))
      return false;
    memcpy(r->name, s, n);
    r->name[n] = '\0';
    return api_valid_template_name(r->name);
  }
  if (PH("sid")) { /* kept as given: the handler answers an unknown one */
    if (n == 0 || n >= sizeof(r->sid))
      return false;
    memcpy(r->sid, s, n);
    r->sid[n] = '\0';
    return true;
  }
  if (PH("kid")) { /* kept as given: the handler answers an unknown one */
    if (n == 0 || n >= sizeof(r->kid))
      return false;
    memcpy(r->kid, s, n);
    r->kid[n] = '\0';
    return true;
  }
  if (PH("cid")) {
    if (n == 0 || n >= sizeof(r->cid))
      return false;
    for (size_t i = 0; i < n; i++)
      if (!name_char(s[i]))
        return false;
    memcpy(r->cid, s, n);
    r->cid[n] = '\0';
    return true;
  }
  if (PH("proc")) { /* a pid (1..999999999, no leading 0) or a tag */
    if (n == 0 || n > API_MAX_TAG)
      return false;
    memcpy(buf, s, n);
    buf[n] = '\0';
    if (strspn(buf, "0123456789") == n) {
      if (n > 9 || buf[0] == '0')
        return false;
      r->pid = atoi(buf);
      return true;
    }
    if (!api_valid_tag(buf))
      return false;
    memcpy(r->tag, buf, n + 1);
    return true;
  }
  if (PH("port")) { /* any segment; 0 when it is not a port number (the handler answers 400) */
    if (n == 0)
      return false;
    unsigned port = 0;
    for (size_t i = 0; i < n; i++) {
      if (s[i] < '0' || s[i] > '9' || i >= 5) {
        port = 0;
        break;
      }
      port = port * 10 + (unsigned)(s[i] - '0');
    }
    r->port = port <= 65535 ? port : 0;
    return true;
  }
#undef PH
  return false;
}

/* True when path matches pattern; fills r's path fields. */
static bool path_matches(const char *pattern, const char *path, struct api_route *r) {
  if (pattern[0] != '/' || path[0] != '/')
    return false;
  const char *p = pattern + 1, *s = path + 1;
  for (;;) {
    const char *pe = strchrnul(p, '/');
    size_t pn = (size_t)(pe - p);
    if (pn == 3 && memcmp(p, "{*}", 3) == 0) /* the rest, whatever it is */
      return *pe == '\0';
    const char *se = strchrnul(s, '/');
    size_t sn = (size_t)(se - s);
    if (pn >= 2 && p[0] == '{' && p[pn - 1] == '}') {
      if (!take(p + 1, pn - 2, s, sn, r))
        return false;
    } else if (pn != sn || memcmp(p, s, sn) != 0) {
      return false;
    }
    if (*pe == '\0' || *se == '\0')
      return *pe == '\0' && *se == '\0';
    p = pe + 1;
    s = se + 1;
  }
}

/* True when the Allow list ("GET, POST") names method. */
static bool allow_has(const char *allow, const char *method) {
  size_t ml = strlen(method);
  for (const char *a = allow; *a;) {
    size_t n = strcspn(a, ",");
    if (n == ml && strncmp(a, method, ml) == 0)
      return true;
    a += n;
    while (*a == ',' || *a == ' ')
      a++;
  }
  return false;
}

enum api_match api_router_match(const struct api_router *rt, const char *method, const char *path,
                                struct api_route *r) {
  char allow[sizeof(r->allow)] = "";
  size_t allow_len = 0;
  for (size_t i = 0; i < rt->n; i++) {
    const struct api_route_def *d = rt->defs[i];
    memset(r, 0, sizeof(*r));
    if (!path_matches(d->pattern, path, r))
      continue;
    if (strcmp(d->method, method) == 0) {
      r->def = d;
      return API_MATCH_OK;
    }
    /* the path is known under another method: it goes into Allow, once */
    size_t ml = strlen(d->method);
    if (!allow_has(allow, d->method) && allow_len + ml + 3 < sizeof(allow)) {
      allow_len += (size_t)snprintf(allow + allow_len, sizeof(allow) - allow_len, "%s%s",
                                    allow_len ? ", " : "", d->method);
    }
  }
  memset(r, 0, sizeof(*r));
  if (!allow_len)
    return API_MATCH_NOT_FOUND;
  memcpy(r->allow, allow, sizeof(allow));
  return API_MATCH_BAD_METHOD;
}

const char *api_route_name(const struct api_route *r) { return r && r->def ? r->def->name : "none"; }

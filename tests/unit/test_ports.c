/* test_ports.c -- the pure parts of exposed ports: the routes under /v1/sandboxes/{id}/ports, the
 * "PORT-ID.DOMAIN" Host parser shared with the E2B front end, and the removal of moat_token from a
 * request target. */
#include <stdlib.h>
#include <string.h>

#include "api/ports/ports.h"
#include "tap.h"

#define SB "sb-0123456789abcdefg"

/* moatd's routes, as api.c serves them */
static struct api_router *g_router;

static enum api_match api_route_match(const char *method, const char *path, struct api_route *r) {
  return api_router_match(g_router, method, path, r);
}

#define JSON_BODY(r) ((r).def && ((r).def->flags & API_RT_JSON))
#define NEEDS_AUTH(r) ((r).def && !((r).def->flags & API_RT_PUBLIC))

static void routes(void) {
  struct api_route r;
  OK(api_route_match("GET", "/v1/sandboxes/" SB "/ports", &r) == API_MATCH_OK &&
         strcmp(api_route_name(&r), "ports.list") == 0 && NEEDS_AUTH(r),
     "GET .../ports lists, with auth");
  OK(api_route_match("POST", "/v1/sandboxes/" SB "/ports", &r) == API_MATCH_BAD_METHOD,
     "POST .../ports: 405");
  OK(api_route_match("POST", "/v1/sandboxes/" SB "/ports/8080", &r) == API_MATCH_OK &&
         strcmp(api_route_name(&r), "port.expose") == 0 && r.port == 8080 && JSON_BODY(r) && NEEDS_AUTH(r),
     "POST .../ports/8080 sets access (JSON body, auth)");
  OK(api_route_match("GET", "/v1/sandboxes/" SB "/ports/1", &r) == API_MATCH_OK &&
         strcmp(api_route_name(&r), "port.get") == 0 && r.port == 1,
     "GET .../ports/1");
  OK(api_route_match("DELETE", "/v1/sandboxes/" SB "/ports/65535", &r) == API_MATCH_OK &&
         strcmp(api_route_name(&r), "port.unexpose") == 0 && r.port == 65535,
     "DELETE .../ports/65535");
  OK(api_route_match("PUT", "/v1/sandboxes/" SB "/ports/80", &r) == API_MATCH_BAD_METHOD &&
         strcmp(r.allow, "GET, POST, DELETE") == 0,
     "PUT .../ports/80: 405 with Allow");
  static const char *const methods[] = {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"};
  for (size_t i = 0; i < ARRAY_SIZE(methods); i++)
    OK(api_route_match(methods[i], "/v1/sandboxes/" SB "/ports/3000/a/b.js", &r) == API_MATCH_OK &&
           strcmp(api_route_name(&r), "port.proxy") == 0 && r.port == 3000 && NEEDS_AUTH(r) &&
           !JSON_BODY(r) && strcmp(r.id, SB) == 0,
       "%s .../ports/3000/a/b.js is proxied (auth: checked by api_port_proxy_begin)", methods[i]);
  OK(api_route_match("GET", "/v1/sandboxes/" SB "/ports/3000/", &r) == API_MATCH_OK &&
         strcmp(api_route_name(&r), "port.proxy") == 0,
     "the root of a port is proxied");
  OK(api_route_match("TRACE", "/v1/sandboxes/" SB "/ports/3000/x", &r) == API_MATCH_BAD_METHOD, "TRACE: 405");
  OK(api_route_match("CONNECT", "/v1/sandboxes/" SB "/ports/3000/x", &r) == API_MATCH_BAD_METHOD,
     "CONNECT: 405");
  static const char *const bad[] = {"0", "65536", "99999", "123456", "abc", "80a", "-1", "+80"};
  for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
    char path[128];
    snprintf(path, sizeof(path), "/v1/sandboxes/" SB "/ports/%s/x", bad[i]);
    OK(api_route_match("GET", path, &r) == API_MATCH_OK && r.port == 0, "port %s: matched with port 0 (400)",
       bad[i]);
    snprintf(path, sizeof(path), "/v1/sandboxes/" SB "/ports/%s", bad[i]);
    OK(api_route_match("POST", path, &r) == API_MATCH_OK && r.port == 0, "POST port %s: port 0 (400)",
       bad[i]);
  }
  OK(api_route_match("GET", "/v1/sandboxes/" SB "/ports/", &r) == API_MATCH_NOT_FOUND, ".../ports/: 404");
  OK(api_route_match("GET", "/v1/sandboxes/" SB "/portsx", &r) == API_MATCH_NOT_FOUND, ".../portsx: 404");
  OK(api_route_match("GET", "/v1/sandboxes/sb-short/ports/80/x", &r) == API_MATCH_NOT_FOUND, "bad id: 404");
}

static void hosts(void) {
  unsigned port = 0;
  char id[MOAT_ID_LEN + 1] = "";
  const char *dom = NULL;
  OK(api_parse_port_host("8080-" SB ".moat.test", &port, id, &dom) && port == 8080 && strcmp(id, SB) == 0 &&
         strcmp(dom, "moat.test") == 0,
     "8080-ID.moat.test");
  OK(api_parse_port_host("1-" SB ".localhost:7071", &port, id, &dom) && port == 1 &&
         strcmp(dom, "localhost:7071") == 0,
     "with a :port");
  OK(api_parse_port_host("49983-" SB ".e2b.local", &port, id, NULL) && port == 49983, "domain not asked for");
  static const char *const bad[] = {
      "moat.test",
      "8080.moat.test",
      "-" SB ".x",
      "0-" SB ".x",
      "65536-" SB ".x",
      "123456-" SB ".x",
      "80a-" SB ".x",
      "8080-" SB,
      "8080-sb-0123.x",
      "8080-" SB "x.y",
      "8080-SB-0123456789ABCDEFG.x",
      "",
  };
  for (size_t i = 0; i < ARRAY_SIZE(bad); i++)
    OK(!api_parse_port_host(bad[i], &port, id, &dom), "not a port host: '%s'", bad[i]);
  OK(!api_parse_port_host(NULL, &port, id, &dom), "no Host");
}

static void strip(const char *in, const char *want) {
  char *got = ports_strip_token(in);
  OK(strcmp(got, want) == 0, "strip '%s' -> '%s' (got '%s')", in, want, got);
  free(got);
}

static void tokens(void) {
  strip("/", "/");
  strip("/a?b=1", "/a?b=1");
  strip("/a?moat_token=x", "/a");
  strip("/a?moat_token=x&b=2", "/a?b=2");
  strip("/a?b=2&moat_token=x", "/a?b=2");
  strip("/a?b=2&moat_token=x&c", "/a?b=2&c");
  strip("/a?moat_token", "/a");
  strip("/a?moat_tokens=1&xmoat_token=2", "/a?moat_tokens=1&xmoat_token=2");
  strip("/a?&&b=1&&", "/a?b=1");
  strip("/a?", "/a");
  strip("/p%2Fq?x=%20&moat_token=t", "/p%2Fq?x=%20");
}

int main(void) {
  g_router = api_router_new();
  api_front_ends(g_router);
  routes();
  hosts();
  tokens();
  api_router_free(g_router);
  return tap_done();
}

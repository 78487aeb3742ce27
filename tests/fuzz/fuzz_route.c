/* fuzz_route.c -- libFuzzer target: route matching (api http/route.c's api_router_match over every
 * front end's table, as api.c serves them), which reads the method and decoded path of every request
 * before any authentication.
 *
 * Input: u8 picking the method, then the path. Checks: a match (or a wrong method) names its route
 * and fills only NUL-terminated, valid ids (a sandbox id is sb-[a-z0-9]{17}, a template name a valid name, a
 * port 1..65535 or 0); a wrong method says which are allowed, and the asked one is not among them; matching
 * twice gives the same answer. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "api/http/http.h"
#include "common/util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const methods[] = {"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS", "get"};

static struct api_router *rt;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!rt) {
    rt = api_router_new();
    api_front_ends(rt);
  }
  if (size < 1)
    return 0;
  const char *method = methods[data[0] % ARRAY_SIZE(methods)];
  _cleanup_free_ char *path = xstrndup((const char *)data + 1, size - 1);
  struct api_route r, again;
  memset(&r, 0, sizeof(r));
  memset(&again, 0, sizeof(again));
  enum api_match m = api_router_match(rt, method, path, &r);
  if (api_router_match(rt, method, path, &again) != m || memcmp(&r, &again, sizeof(r)) != 0)
    abort();
  if (!memchr(r.id, '\0', sizeof(r.id)) || !memchr(r.name, '\0', sizeof(r.name)) ||
      !memchr(r.tag, '\0', sizeof(r.tag)) || !memchr(r.cid, '\0', sizeof(r.cid)) ||
      !memchr(r.sid, '\0', sizeof(r.sid)))
    abort();
  if (m == API_MATCH_NOT_FOUND)
    return 0; /* r holds what was read before the path was found wanting: not used */
  if (r.id[0] && !api_valid_sandbox_id(r.id))
    abort();
  if (r.name[0] && !api_valid_template_name(r.name))
    abort();
  if (r.port > 65535)
    abort();
  if (m == API_MATCH_OK && (!r.def || !r.def->name || (!r.def->handler && !r.def->hooks)))
    abort(); /* a match names its route and has a handler or hooks */
  if (m == API_MATCH_BAD_METHOD) {
    if (!memchr(r.allow, '\0', sizeof(r.allow)) || !r.allow[0])
      abort();
    size_t ml = strlen(method);
    for (const char *a = r.allow; (a = strstr(a, method)); a += ml)
      if ((a == r.allow || a[-1] == ' ' || a[-1] == ',') && (a[ml] == '\0' || a[ml] == ',' || a[ml] == ' '))
        abort(); /* 405 for a method the Allow header lists */
  }
  return 0;
}

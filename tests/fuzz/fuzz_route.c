/* fuzz_route.c -- libFuzzer target: route matching (api router.c's api_route_match), which reads
 * the method and decoded path of every request before any authentication.
 *
 * Input: u8 picking the method, then the path. Checks: a match (or a wrong method) names its route
 * and fills only NUL-terminated, valid ids (a sandbox id is sb-[a-z0-9]{17}, a template name a valid name, a port
 * 1..65535 or 0); a wrong method says which are allowed, and the asked one is not among them;
 * matching twice gives the same answer. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "api/api_internal.h"
#include "common/util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const methods[] = {"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS", "get"};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  const char *method = methods[data[0] % ARRAY_SIZE(methods)];
  _cleanup_free_ char *path = xstrndup((const char *)data + 1, size - 1);
  struct api_route r, again;
  enum api_match m = api_route_match(method, path, &r);
  if (api_route_match(method, path, &again) != m || memcmp(&r, &again, sizeof(r)) != 0)
    abort();
  if (!memchr(r.id, '\0', sizeof(r.id)) || !memchr(r.name, '\0', sizeof(r.name)) ||
      !memchr(r.tag, '\0', sizeof(r.tag)) || !memchr(r.cid, '\0', sizeof(r.cid)) || !memchr(r.sid, '\0', sizeof(r.sid)))
    abort();
  if (m == API_MATCH_NOT_FOUND)
    return 0; /* r holds what was read before the path was found wanting: not used */
  if (r.id[0] && !api_valid_sandbox_id(r.id))
    abort();
  if (r.name[0] && !api_valid_template_name(r.name))
    abort();
  if (r.port > 65535)
    abort();
  if (m == API_MATCH_OK && !api_route_name(r.kind))
    abort();
  if (m == API_MATCH_BAD_METHOD) {
    if (!r.allow || !r.allow[0])
      abort();
    size_t ml = strlen(method);
    for (const char *a = r.allow; (a = strstr(a, method)); a += ml)
      if ((a == r.allow || a[-1] == ' ' || a[-1] == ',') && (a[ml] == '\0' || a[ml] == ',' || a[ml] == ' '))
        abort(); /* 405 for a method the Allow header lists */
  }
  return 0;
}

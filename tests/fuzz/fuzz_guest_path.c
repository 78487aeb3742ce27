/* fuzz_guest_path.c -- libFuzzer target: guest_path_resolve (guest conn.c), which turns the path a
 * client names for a file, a directory or a working directory into the one moat-guest uses.
 *
 * Input: a home directory, a NUL byte, the path. Checks: a result is absolute, has no empty, "."
 * or ".." component and no trailing slash (but "/"), fits GUEST_PATH_MAX, does not depend on home
 * for an absolute path, and resolves to itself again; a refusal says why with EINVAL. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "guest/guest.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_clean(const char *p) {
  size_t n = strlen(p);
  if (p[0] != '/' || n > GUEST_PATH_MAX || (n > 1 && p[n - 1] == '/') || strstr(p, "//"))
    abort();
  for (const char *s = p; (s = strchr(s, '/'));) {
    s++;
    if ((s[0] == '.' && (s[1] == '/' || s[1] == '\0')) ||
        (s[0] == '.' && s[1] == '.' && (s[2] == '/' || s[2] == '\0')))
      abort();
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const uint8_t *nul = memchr(data, '\0', size);
  if (!nul)
    return 0;
  _cleanup_free_ char *home = xstrndup((const char *)data, (size_t)(nul - data));
  _cleanup_free_ char *path = xstrndup((const char *)nul + 1, size - (size_t)(nul - data) - 1);
  moat_error *err = NULL;
  _cleanup_free_ char *r = guest_path_resolve(home[0] ? home : NULL, path, &err);
  if (!r) {
    if (!err || err->status != EINVAL || !err->msg)
      abort();
    moat_error_free(&err);
    return 0;
  }
  check_clean(r);
  _cleanup_free_ char *again = guest_path_resolve("/elsewhere", r, &err);
  if (!again || strcmp(again, r) != 0)
    abort(); /* a resolved path is a fixed point, whatever the home */
  if (path[0] == '/') {
    _cleanup_free_ char *other = guest_path_resolve("/other/home", path, &err);
    if (!other || strcmp(other, r) != 0)
      abort();
  }
  return 0;
}

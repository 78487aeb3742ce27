/* fuzz_e2b_connect.c -- libFuzzer target: the Connect protocol's envelopes for E2B's envd
 * (api e2b/connect.c): cx_unwrap reads the one enveloped JSON message a streaming request's body
 * holds (bytes the client sends), cx_frame writes the envelopes moatd answers with.
 *
 * Checks: a body is accepted only when it is one uncompressed envelope whose length is the rest of
 * the body and whose JSON is an object; a refusal says why with EINVAL; an accepted message framed
 * again is 5 + its compact JSON's bytes with flags and length in front, and unwraps to an equal
 * message. */
#include <errno.h>
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "api/e2b/envd.h"
#include "common/buf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  json_t *m = NULL;
  moat_error *err = NULL;
  if (cx_unwrap((const char *)data, size, &m, &err) < 0) {
    if (!err || err->status != EINVAL || !err->msg || m)
      abort();
    moat_error_free(&err);
    return 0;
  }
  if (size < 5 || data[0] != 0 || !json_is_object(m) ||
      ((size_t)data[1] << 24 | (size_t)data[2] << 16 | (size_t)data[3] << 8 | data[4]) != size - 5)
    abort();
  struct moat_buf b = {0};
  cx_frame(&b, 0x02, json_incref(m));
  char *js = json_dumps(m, JSON_COMPACT);
  size_t n = strlen(js);
  const unsigned char *h = (const unsigned char *)b.p;
  if (b.len != 5 + n || h[0] != 0x02 ||
      ((size_t)h[1] << 24 | (size_t)h[2] << 16 | (size_t)h[3] << 8 | h[4]) != n ||
      memcmp(b.p + 5, js, n) != 0)
    abort();
  b.p[0] = 0; /* as a request body */
  json_t *back = NULL;
  if (cx_unwrap(b.p, b.len, &back, &err) < 0 || !json_equal(back, m))
    abort();
  json_decref(back);
  free(js);
  free(b.p);
  json_decref(m);
  return 0;
}

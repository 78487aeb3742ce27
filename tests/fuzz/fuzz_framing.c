/* fuzz_framing.c -- libFuzzer target: the request-framing judge (api/framing.c). The input's first
 * byte picks a piece size; the rest is fed whole and in pieces of that size, and both must give the
 * same verdict, head count, bad head and message (the judge cannot depend on how the network split
 * the stream), with bad_at inside the piece that completed the bad head. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "api/http/framing.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

struct out {
  enum api_fr_result res;
  uint64_t heads, bad_head;
  bool in_head;
  char why[192];
};

static struct out run(const char *buf, size_t len, size_t step) {
  struct api_framing f;
  api_framing_init(&f);
  struct out o = {API_FR_OK, 0, 0, false, ""};
  for (size_t i = 0; i < len;) {
    size_t n = step && len - i > step ? step : len - i;
    o.res = api_framing_feed(&f, buf + i, n);
    if (o.res == API_FR_BAD_HEAD && (f.bad_at >= n || buf[i + f.bad_at] != '\n'))
      abort();
    i += n;
    if (o.res != API_FR_OK)
      break;
  }
  o.heads = f.heads;
  o.bad_head = f.bad_head;
  o.in_head = f.in_head;
  memcpy(o.why, f.why, sizeof(o.why));
  return o;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  size_t step = data[0] % 17;
  const char *buf = (const char *)data + 1;
  struct out a = run(buf, size - 1, 0), b = run(buf, size - 1, step ? step : 1);
  if (a.res != b.res || a.heads != b.heads || a.bad_head != b.bad_head || a.in_head != b.in_head ||
      strcmp(a.why, b.why) != 0)
    abort();
  return 0;
}

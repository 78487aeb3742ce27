/* fuzz_proto.c -- libFuzzer target: guest protocol frame parsing and every field getter */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "proto/proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  struct moat_msg m;
  moat_msg_init(&m, 0);
  moat_error *err = NULL;
  int r = moat_msg_parse(data, size, &m, &err);
  if (r < 0) {
    if (!err || !err->msg)
      abort(); /* a failure always explains itself */
    moat_error_free(&err);
    moat_msg_free(&m);
    return 0;
  }
  /* Fields tile the payload exactly: iteration consumes all of it. */
  size_t off = 0, n = 0;
  struct moat_field f;
  while (moat_msg_next(&m, &off, &f)) {
    if (f.data < m.buf || f.data + f.len > m.buf + m.len)
      abort();
    n++;
  }
  if (off != m.len)
    abort();
  for (uint16_t tag = 0; tag <= 32; tag++) {
    uint32_t u32;
    int32_t i32;
    uint64_t u64;
    int64_t i64;
    (void)moat_msg_get_u32(&m, tag, &u32);
    (void)moat_msg_get_i32(&m, tag, &i32);
    (void)moat_msg_get_u64(&m, tag, &u64);
    (void)moat_msg_get_i64(&m, tag, &i64);
    char *s = moat_msg_get_str(&m, tag);
    if (s && memchr(s, '\0', strlen(s)))
      abort();
    free(s);
    char **v = moat_msg_get_strv(&m, tag);
    strv_free(v);
  }
  /* Re-encoding the fields gives back the same payload. */
  struct moat_msg e;
  moat_msg_init(&e, m.type);
  off = 0;
  while (moat_msg_next(&m, &off, &f))
    moat_msg_put(&e, f.tag, f.data, f.len);
  if (e.len != m.len || (m.len && memcmp(e.buf, m.buf, m.len) != 0))
    abort();
  (void)n;
  moat_msg_free(&e);
  moat_msg_free(&m);
  return 0;
}

/* buf.c -- a growable byte buffer */
#include "buf.h"

#include <stdint.h>
#include <string.h>

#include "assert.h"
#include "util.h"

void moat_buf_append(struct moat_buf *b, const void *data, size_t n) {
  moat_assert(n < SIZE_MAX / 2 - b->len, "moat_buf_append of %zu bytes to %zu", n, b->len);
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 1024;
    while (cap < b->len + n + 1)
      cap *= 2;
    b->p = xrealloc(b->p, cap);
    b->cap = cap;
  }
  if (n)
    memcpy(b->p + b->len, data, n);
  b->len += n;
  b->p[b->len] = '\0';
}

/* buf.h -- a growable byte buffer, kept NUL-terminated for convenience (it may hold NULs) */
#ifndef MOAT_BUF_H
#define MOAT_BUF_H

#include <stddef.h>

struct moat_buf {
  char *p; /* owned; NULL until the first append */
  size_t len, cap;
};

/* Appends n bytes (aborts on out-of-memory); p[len] is '\0' afterwards. */
void moat_buf_append(struct moat_buf *b, const void *data, size_t n);

#endif

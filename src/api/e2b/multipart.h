/* multipart.h -- a streaming multipart/form-data parser (RFC 7578) for E2B's POST /files
 *
 * Pure (no I/O): bytes go in as they arrive, in chunks of any size; parts come out through
 * callbacks (begin with the Content-Disposition name and filename, data in pieces, end). Memory
 * stays below one chunk plus the boundary plus MP_MAX_HEADERS, whatever the body's size.
 */
#ifndef MOAT_E2B_MULTIPART_H
#define MOAT_E2B_MULTIPART_H

#include <stdbool.h>
#include <stddef.h>

#include "../../common/buf.h"
#include "../../common/error.h"

#define MP_MAX_HEADERS (16 * 1024) /* one part's header block */

struct mp_callbacks {
  /* A part starts; name and filename (from Content-Disposition) may be NULL. */
  int (*begin)(void *ctx, const char *name, const char *filename, moat_error **err);
  int (*data)(void *ctx, const char *p, size_t n, moat_error **err);
  int (*end)(void *ctx, moat_error **err);
};

struct mp_parser {
  char delim[80]; /* "\r\n--BOUNDARY" */
  size_t dlen;
  int state;
  struct moat_buf pend; /* bytes not yet consumed, from pend_off */
  size_t pend_off;
};

/* Reads the boundary from a Content-Type value ("multipart/form-data; boundary=..."): 0, or -1
 * EINVAL when it is missing or not 1 to 70 characters. */
int mp_init(struct mp_parser *m, const char *content_type, moat_error **err);
/* Feeds len bytes; callbacks run for what they complete. -1 with *err on a malformed body or when
 * a callback fails (its error). */
int mp_feed(struct mp_parser *m, const char *data, size_t len, const struct mp_callbacks *cb, void *ctx,
            moat_error **err);
/* True once the closing boundary was seen (what follows it is ignored). */
bool mp_done(const struct mp_parser *m);
void mp_free(struct mp_parser *m);

#endif

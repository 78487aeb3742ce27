/* multipart.c -- the streaming multipart/form-data parser of E2B's POST /files (see the header)
 *
 * The body is read as if it began with "\r\n": every boundary, the first included, is then the
 * delimiter "\r\n--BOUNDARY". While looking for it the parser hands on all bytes but the last
 * dlen-1 (which might start a delimiter split across chunks).
 */
#include "multipart.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "../../common/util.h"

enum { MP_PREAMBLE, MP_HEADERS, MP_DATA, MP_AFTER_DELIM, MP_DONE };

int mp_init(struct mp_parser *m, const char *ct, moat_error **err) {
  memset(m, 0, sizeof(*m));
  const char *b = ct ? strcasestr(ct, "boundary=") : NULL;
  if (!b)
    return moat_error_set(err, EINVAL, "multipart/form-data without a boundary");
  b += 9;
  size_t bl;
  if (*b == '"') {
    b++;
    const char *e = strchr(b, '"');
    bl = e ? (size_t)(e - b) : 0;
  } else {
    bl = strcspn(b, "; \t");
  }
  if (bl == 0 || bl > 70)
    return moat_error_set(err, EINVAL, "the multipart boundary must be 1 to 70 characters");
  m->dlen = (size_t)snprintf(m->delim, sizeof(m->delim), "\r\n--%.*s", (int)bl, b);
  moat_buf_append(&m->pend, "\r\n", 2);
  m->state = MP_PREAMBLE;
  return 0;
}

bool mp_done(const struct mp_parser *m) { return m->state == MP_DONE; }

void mp_free(struct mp_parser *m) {
  free(m->pend.p);
  m->pend.p = NULL;
  m->pend.len = m->pend.cap = 0;
}

/* The value of param (name="..." / filename=...) in a Content-Disposition value, or NULL. */
static char *disposition_param(const char *h, size_t hl, const char *param) {
  size_t pl = strlen(param);
  for (size_t i = 0; i + pl + 1 <= hl; i++) {
    if ((i == 0 || h[i - 1] == ' ' || h[i - 1] == ';' || h[i - 1] == '\t') &&
        strncasecmp(h + i, param, pl) == 0 && h[i + pl] == '=') {
      const char *v = h + i + pl + 1, *end = h + hl;
      if (v < end && *v == '"') {
        v++;
        const char *q = memchr(v, '"', (size_t)(end - v));
        return q ? xstrndup(v, (size_t)(q - v)) : NULL;
      }
      const char *q = v;
      while (q < end && *q != ';' && *q != ' ' && *q != '\t')
        q++;
      return xstrndup(v, (size_t)(q - v));
    }
  }
  return NULL;
}

/* A part's header block h[0..hl) (without the blank line) is complete. */
static int part_headers(const char *h, size_t hl, const struct mp_callbacks *cb, void *ctx,
                        moat_error **err) {
  _cleanup_free_ char *name = NULL, *filename = NULL;
  for (const char *l = h; l < h + hl;) {
    const char *e = memmem(l, (size_t)(h + hl - l), "\r\n", 2);
    size_t ll = e ? (size_t)(e - l) : (size_t)(h + hl - l);
    if (ll > 20 && strncasecmp(l, "Content-Disposition:", 20) == 0) {
      free(name);
      free(filename);
      name = disposition_param(l + 20, ll - 20, "name");
      filename = disposition_param(l + 20, ll - 20, "filename");
    }
    l = e ? e + 2 : h + hl;
  }
  return cb->begin(ctx, name, filename, err);
}

static int feed(struct mp_parser *m, const struct mp_callbacks *cb, void *ctx, moat_error **err) {
  for (;;) {
    const char *p = m->pend.p + m->pend_off;
    size_t n = m->pend.len - m->pend_off;
    switch (m->state) {
    case MP_PREAMBLE:
    case MP_DATA: {
      const char *d = memmem(p, n, m->delim, m->dlen);
      size_t take = d ? (size_t)(d - p) : (n >= m->dlen ? n - (m->dlen - 1) : 0);
      if (m->state == MP_DATA && take > 0 && cb->data(ctx, p, take, err) < 0)
        return -1;
      m->pend_off += take;
      if (!d)
        return 0;
      if (m->state == MP_DATA && cb->end(ctx, err) < 0)
        return -1;
      m->pend_off += m->dlen;
      m->state = MP_AFTER_DELIM;
      break;
    }
    case MP_AFTER_DELIM:
      if (n < 2)
        return 0;
      if (p[0] == '-' && p[1] == '-') {
        m->state = MP_DONE;
        break;
      }
      if (p[0] != '\r' || p[1] != '\n')
        return moat_error_set(err, EINVAL, "malformed multipart body (no CRLF after a boundary)");
      m->pend_off += 2;
      m->state = MP_HEADERS;
      break;
    case MP_HEADERS: {
      size_t hl, skip;
      if (n >= 2 && p[0] == '\r' && p[1] == '\n') { /* no headers: the blank line at once */
        hl = 0;
        skip = 2;
      } else {
        const char *e = memmem(p, n, "\r\n\r\n", 4);
        if (!e) {
          if (n > MP_MAX_HEADERS)
            return moat_error_set(err, EINVAL, "multipart part headers longer than %d bytes", MP_MAX_HEADERS);
          return 0;
        }
        hl = (size_t)(e - p);
        skip = hl + 4;
      }
      if (hl > MP_MAX_HEADERS)
        return moat_error_set(err, EINVAL, "multipart part headers longer than %d bytes", MP_MAX_HEADERS);
      if (part_headers(p, hl, cb, ctx, err) < 0)
        return -1;
      m->pend_off += skip;
      m->state = MP_DATA;
      break;
    }
    case MP_DONE:
      m->pend_off = m->pend.len; /* the epilogue is ignored */
      return 0;
    }
  }
}

int mp_feed(struct mp_parser *m, const char *data, size_t len, const struct mp_callbacks *cb, void *ctx,
            moat_error **err) {
  if (m->state == MP_DONE)
    return 0;
  /* Drop what was consumed, then append: pend stays below one chunk plus a delimiter (or one
   * header block). */
  if (m->pend_off > 0) {
    memmove(m->pend.p, m->pend.p + m->pend_off, m->pend.len - m->pend_off);
    m->pend.len -= m->pend_off;
    m->pend_off = 0;
  }
  moat_buf_append(&m->pend, data, len);
  return feed(m, cb, ctx, err);
}

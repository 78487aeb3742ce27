/* proto.c -- encoding, decoding and blocking I/O of guest protocol frames */
#include "proto.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "../common/assert.h"
#include "../common/util.h"

static void put_le32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
  p[2] = (uint8_t)(v >> 16);
  p[3] = (uint8_t)(v >> 24);
}

static uint32_t get_le32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get_le64(const uint8_t *p) { return (uint64_t)get_le32(p) | (uint64_t)get_le32(p + 4) << 32; }

void moat_msg_init(struct moat_msg *m, uint8_t type) {
  memset(m, 0, sizeof(*m));
  m->type = type;
}

void moat_msg_reset(struct moat_msg *m, uint8_t type) {
  m->type = type;
  m->len = 0;
}

void moat_msg_free(struct moat_msg *m) {
  free(m->buf);
  memset(m, 0, sizeof(*m));
}

static void reserve(struct moat_msg *m, size_t extra) {
  if (m->len + extra <= m->cap)
    return;
  size_t cap = m->cap ? m->cap : 256;
  while (cap < m->len + extra)
    cap *= 2;
  m->buf = xrealloc(m->buf, cap);
  m->cap = cap;
}

void moat_msg_put(struct moat_msg *m, uint16_t tag, const void *data, size_t len) {
  moat_assert(len <= UINT32_MAX - 6, "guest protocol field %u of %zu bytes", tag, len); /* le32 length */
  reserve(m, 6 + len);
  uint8_t *p = m->buf + m->len;
  p[0] = (uint8_t)tag;
  p[1] = (uint8_t)(tag >> 8);
  put_le32(p + 2, (uint32_t)len);
  if (len)
    memcpy(p + 6, data, len);
  m->len += 6 + len;
}

void moat_msg_put_str(struct moat_msg *m, uint16_t tag, const char *s) { moat_msg_put(m, tag, s, strlen(s)); }

void moat_msg_put_u32(struct moat_msg *m, uint16_t tag, uint32_t v) {
  uint8_t b[4];
  put_le32(b, v);
  moat_msg_put(m, tag, b, 4);
}

void moat_msg_put_i32(struct moat_msg *m, uint16_t tag, int32_t v) { moat_msg_put_u32(m, tag, (uint32_t)v); }

void moat_msg_put_u64(struct moat_msg *m, uint16_t tag, uint64_t v) {
  uint8_t b[8];
  put_le32(b, (uint32_t)v);
  put_le32(b + 4, (uint32_t)(v >> 32));
  moat_msg_put(m, tag, b, 8);
}

void moat_msg_put_i64(struct moat_msg *m, uint16_t tag, int64_t v) { moat_msg_put_u64(m, tag, (uint64_t)v); }

/* Writes the iovecs in full. With wait NULL the socket blocks; otherwise each write is
 * MSG_DONTWAIT and wait(ctx) decides what happens when the socket is full. */
static int send_iov(int fd, struct iovec *iov, int n, int (*wait)(void *), void *ctx) {
  while (n > 0) {
    struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)n};
    ssize_t w = sendmsg(fd, &mh, MSG_NOSIGNAL | (wait ? MSG_DONTWAIT : 0));
    if (w < 0 && errno == ENOTSOCK)
      w = writev(fd, iov, n);
    if (w < 0) {
      if (errno == EINTR)
        continue;
      if (wait && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        if (wait(ctx) < 0)
          return -1;
        continue;
      }
      return -1;
    }
    while (n > 0 && (size_t)w >= iov->iov_len) {
      w -= (ssize_t)iov->iov_len;
      iov++;
      n--;
    }
    if (n > 0) {
      iov->iov_base = (char *)iov->iov_base + w;
      iov->iov_len -= (size_t)w;
    }
  }
  return 0;
}

int moat_msg_send_wait(int fd, const struct moat_msg *m, int (*wait)(void *), void *ctx) {
  uint8_t hdr[5];
  put_le32(hdr, (uint32_t)(m->len + 1));
  hdr[4] = m->type;
  struct iovec iov[2] = {{hdr, 5}, {m->buf, m->len}};
  return send_iov(fd, iov, m->len ? 2 : 1, wait, ctx);
}

int moat_msg_send(int fd, const struct moat_msg *m) { return moat_msg_send_wait(fd, m, NULL, NULL); }

int moat_msg_send_empty(int fd, uint8_t type) {
  struct moat_msg m;
  moat_msg_init(&m, type);
  return moat_msg_send(fd, &m);
}

int moat_msg_send_data_wait(int fd, uint8_t type, const void *data, size_t len, int (*wait)(void *),
                            void *ctx) {
  uint8_t hdr[11];
  put_le32(hdr, (uint32_t)(len + 7));
  hdr[4] = type;
  hdr[5] = (uint8_t)MOAT_T_DATA;
  hdr[6] = 0;
  put_le32(hdr + 7, (uint32_t)len);
  struct iovec iov[2] = {{hdr, sizeof(hdr)}, {(void *)data, len}};
  return send_iov(fd, iov, len ? 2 : 1, wait, ctx);
}

int moat_msg_send_data(int fd, uint8_t type, const void *data, size_t len) {
  return moat_msg_send_data_wait(fd, type, data, len, NULL, NULL);
}

int moat_msg_send_alive(int fd) {
  uint8_t frame[5];
  put_le32(frame, 1);
  frame[4] = MOAT_REP_ALIVE;
  return send(fd, frame, sizeof(frame), MSG_NOSIGNAL | MSG_DONTWAIT) == (ssize_t)sizeof(frame) ? 0 : -1;
}

int moat_msg_send_error(int fd, int errnum, const char *fmt, ...) {
  char text[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof(text), fmt, ap);
  va_end(ap);
  struct moat_msg m;
  moat_msg_init(&m, MOAT_REP_ERROR);
  moat_msg_put_i32(&m, MOAT_T_ERRNO, errnum);
  moat_msg_put_str(&m, MOAT_T_MESSAGE, text);
  int r = moat_msg_send(fd, &m);
  moat_msg_free(&m);
  return r;
}

static int validate_fields(const uint8_t *p, size_t len, moat_error **err) {
  size_t off = 0;
  while (off < len) {
    if (len - off < 6)
      return moat_error_set(err, EPROTO, "guest protocol: truncated field header");
    uint32_t flen = get_le32(p + off + 2);
    if (flen > len - off - 6)
      return moat_error_set(err, EPROTO, "guest protocol: field length %u past frame end", flen);
    off += 6 + flen;
  }
  return 0;
}

int moat_msg_parse(const uint8_t *frame, size_t len, struct moat_msg *m, moat_error **err) {
  if (len < 5)
    return moat_error_set(err, EPROTO, "guest protocol: frame shorter than its header");
  uint32_t flen = get_le32(frame);
  if (flen < 1 || flen > MOAT_PROTO_MAX_FRAME || (size_t)flen != len - 4)
    return moat_error_set(err, EPROTO, "guest protocol: bad frame length %u", flen);
  if (validate_fields(frame + 5, len - 5, err) < 0)
    return -1;
  m->type = frame[4];
  m->len = 0;
  reserve(m, len - 5);
  if (len > 5) /* m->buf may still be NULL for a frame without fields */
    memcpy(m->buf, frame + 5, len - 5);
  m->len = len - 5;
  return 1;
}

int moat_msg_recv(int fd, struct moat_msg *m, moat_error **err) {
  uint8_t hdr[5];
  ssize_t r = read_all(fd, hdr, 5);
  if (r < 0)
    return moat_error_errno(err, "guest protocol: read");
  if (r == 0)
    return 0;
  if (r < 5)
    return moat_error_set(err, EPROTO, "guest protocol: connection closed inside a frame header");
  uint32_t flen = get_le32(hdr);
  if (flen < 1 || flen > MOAT_PROTO_MAX_FRAME)
    return moat_error_set(err, EPROTO, "guest protocol: bad frame length %u", flen);
  m->type = hdr[4];
  m->len = 0;
  reserve(m, flen - 1);
  r = read_all(fd, m->buf, flen - 1);
  if (r < 0)
    return moat_error_errno(err, "guest protocol: read");
  if ((size_t)r != flen - 1)
    return moat_error_set(err, EPROTO, "guest protocol: connection closed inside a frame");
  m->len = flen - 1;
  if (validate_fields(m->buf, m->len, err) < 0)
    return -1;
  return 1;
}

bool moat_msg_next(const struct moat_msg *m, size_t *off, struct moat_field *f) {
  if (*off + 6 > m->len)
    return false;
  const uint8_t *p = m->buf + *off;
  f->tag = (uint16_t)(p[0] | p[1] << 8);
  f->len = get_le32(p + 2);
  if (f->len > m->len - *off - 6)
    return false;
  f->data = p + 6;
  *off += 6 + f->len;
  return true;
}

bool moat_msg_find(const struct moat_msg *m, uint16_t tag, struct moat_field *f) {
  size_t off = 0;
  while (moat_msg_next(m, &off, f))
    if (f->tag == tag)
      return true;
  return false;
}

int moat_msg_get_u32(const struct moat_msg *m, uint16_t tag, uint32_t *v) {
  struct moat_field f;
  if (!moat_msg_find(m, tag, &f) || f.len != 4)
    return -1;
  *v = get_le32(f.data);
  return 0;
}

int moat_msg_get_i32(const struct moat_msg *m, uint16_t tag, int32_t *v) {
  uint32_t u;
  if (moat_msg_get_u32(m, tag, &u) < 0)
    return -1;
  *v = (int32_t)u;
  return 0;
}

int moat_msg_get_u64(const struct moat_msg *m, uint16_t tag, uint64_t *v) {
  struct moat_field f;
  if (!moat_msg_find(m, tag, &f) || f.len != 8)
    return -1;
  *v = get_le64(f.data);
  return 0;
}

int moat_msg_get_i64(const struct moat_msg *m, uint16_t tag, int64_t *v) {
  uint64_t u;
  if (moat_msg_get_u64(m, tag, &u) < 0)
    return -1;
  *v = (int64_t)u;
  return 0;
}

char *moat_msg_get_str(const struct moat_msg *m, uint16_t tag) {
  struct moat_field f;
  if (!moat_msg_find(m, tag, &f) || memchr(f.data, '\0', f.len))
    return NULL;
  return xstrndup((const char *)f.data, f.len);
}

char **moat_msg_get_strv(const struct moat_msg *m, uint16_t tag) {
  size_t n = 0, off = 0;
  struct moat_field f;
  while (moat_msg_next(m, &off, &f))
    if (f.tag == tag) {
      if (memchr(f.data, '\0', f.len))
        return NULL;
      n++;
    }
  char **v = xcalloc(n + 1, sizeof(char *));
  size_t i = 0;
  off = 0;
  while (moat_msg_next(m, &off, &f))
    if (f.tag == tag)
      v[i++] = xstrndup((const char *)f.data, f.len);
  return v;
}

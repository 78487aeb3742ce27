/* conn.c -- one guest connection in a worker: peek at the request, serve it or hand it to PID 1; paths */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>

#include "../common/util.h"
#include "guest.h"

/* How long a fresh connection may take to send its request before the worker gives up. */
#define REQUEST_TIMEOUT_S 60

char *guest_path_resolve(const char *home, const char *path, moat_error **err) {
  if (!path || !path[0])
    return moat_error_set(err, EINVAL, "empty path"), NULL;
  if (strlen(path) > GUEST_PATH_MAX)
    return moat_error_set(err, EINVAL, "path longer than %d bytes", GUEST_PATH_MAX), NULL;
  _cleanup_free_ char *full = path[0] == '/' ? xstrdup(path) : xasprintf("%s/%s", home ? home : "/", path);
  size_t n = strlen(full);
  char *out = xmalloc(n + 2);
  size_t len = 0; /* out holds "" for "/", else "/a/b" */
  const char *p = full;
  while (*p) {
    while (*p == '/')
      p++;
    const char *s = p;
    while (*p && *p != '/')
      p++;
    size_t cl = (size_t)(p - s);
    if (cl == 0 || (cl == 1 && s[0] == '.'))
      continue;
    if (cl == 2 && s[0] == '.' && s[1] == '.') {
      while (len > 0 && out[len - 1] != '/')
        len--;
      if (len > 0)
        len--; /* drop the slash too */
      continue;
    }
    out[len++] = '/';
    memcpy(out + len, s, cl);
    len += cl;
  }
  if (len == 0)
    out[len++] = '/';
  out[len] = '\0';
  if (len > GUEST_PATH_MAX) {
    free(out);
    return moat_error_set(err, EINVAL, "path longer than %d bytes", GUEST_PATH_MAX), NULL;
  }
  return out;
}

static void set_rcvtimeo(int fd, int seconds) {
  struct timeval tv = {.tv_sec = seconds};
  (void)setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
}

static bool pid1_request(uint8_t type) {
  return type == MOAT_REQ_EXEC || type == MOAT_REQ_ATTACH || type == MOAT_REQ_STDIN ||
         type == MOAT_REQ_SIGNAL || type == MOAT_REQ_RESIZE || type == MOAT_REQ_PROCS ||
         type == MOAT_REQ_RENEW || type == MOAT_REQ_DEFAULTS || type == MOAT_REQ_LOGS;
}

/* Peeks at the frame header (length, type) without consuming it, waiting up to timeout_ms.
 * 1 when 5 bytes are there, 0 when not (yet, or EOF / error). */
static int peek_header(int fd, uint8_t hdr[5], int timeout_ms) {
  uint64_t end = now_ns() + (uint64_t)timeout_ms * 1000000ull;
  for (;;) {
    ssize_t r = recv(fd, hdr, 5, MSG_PEEK | MSG_DONTWAIT);
    if (r == 5)
      return 1;
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
      return 0;
    uint64_t now = now_ns();
    if (now >= end)
      return 0;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int left = (int)((end - now) / 1000000) + 1;
    if (r > 0) /* part of the header: wait a little for the rest */
      left = left > 10 ? 10 : left;
    if (poll(&p, 1, left) < 0 && errno != EINTR)
      return 0;
  }
}

int guest_serve(int fd, const char *etc_dir, void (*busy)(void *), void *arg) {
  uint8_t hdr[5] = {0};
  bool told = false;
  int have = peek_header(fd, hdr, 0);
  if (!have) {
    if (busy)
      busy(arg);
    told = true;
    have = peek_header(fd, hdr, REQUEST_TIMEOUT_S * 1000);
  }
  uint32_t flen = (uint32_t)hdr[0] | (uint32_t)hdr[1] << 8 | (uint32_t)hdr[2] << 16 | (uint32_t)hdr[3] << 24;
  if (have && flen >= 1 && flen <= MOAT_PROTO_MAX_FRAME && pid1_request(hdr[4]))
    return 1; /* PID 1 reads the request itself */
  if (!told && busy)
    busy(arg);
  struct moat_msg req;
  moat_msg_init(&req, 0);
  moat_error *err = NULL;
  set_rcvtimeo(fd, REQUEST_TIMEOUT_S);
  int r = moat_msg_recv(fd, &req, &err);
  set_rcvtimeo(fd, 0);
  if (r < 0) {
    int st = err->status == EAGAIN || err->status == EWOULDBLOCK ? ETIMEDOUT : EPROTO;
    moat_msg_send_error(fd, st, "%s", moat_error_msg(err));
    moat_error_free(&err);
  } else if (r > 0) {
    switch (req.type) {
    case MOAT_REQ_PING:
      moat_msg_send_empty(fd, MOAT_REP_OK);
      break;
    case MOAT_REQ_READ:
    case MOAT_REQ_WRITE:
    case MOAT_REQ_REMOVE:
    case MOAT_REQ_LIST:
    case MOAT_REQ_STAT:
    case MOAT_REQ_MKDIR:
    case MOAT_REQ_MOVE:
    case MOAT_REQ_WATCH:
      guest_file_op(fd, &req, etc_dir);
      break;
    default:
      moat_msg_send_error(fd, EPROTO, "guest protocol: unknown request type %u", req.type);
      break;
    }
  }
  moat_msg_free(&req);
  return 0;
}

/* conn.c -- one guest connection: read the request, dispatch it; path normalisation */
#include <errno.h>
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

void guest_serve(int fd, const char *etc_dir) {
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
    case MOAT_REQ_EXEC:
      guest_exec(fd, &req, etc_dir);
      break;
    case MOAT_REQ_READ:
    case MOAT_REQ_WRITE:
    case MOAT_REQ_REMOVE:
    case MOAT_REQ_LIST:
    case MOAT_REQ_STAT:
    case MOAT_REQ_MKDIR:
    case MOAT_REQ_MOVE:
      guest_file_op(fd, &req, etc_dir);
      break;
    default:
      moat_msg_send_error(fd, EPROTO, "guest protocol: unknown request type %u", req.type);
      break;
    }
  }
  moat_msg_free(&req);
}

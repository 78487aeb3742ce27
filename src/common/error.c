/* error.c -- moat_error construction and wrapping */
#include "error.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

static char *vformat(const char *fmt, va_list ap) {
  char *s = NULL;
  if (vasprintf(&s, fmt, ap) < 0)
    abort();
  return s;
}

int moat_error_set(moat_error **err, int status, const char *fmt, ...) {
  if (err == NULL || *err != NULL)
    return -1;
  va_list ap;
  va_start(ap, fmt);
  moat_error *e = xmalloc(sizeof(*e));
  e->status = status;
  e->msg = vformat(fmt, ap);
  va_end(ap);
  *err = e;
  return -1;
}

int moat_error_errno(moat_error **err, const char *fmt, ...) {
  int saved = errno;
  if (err == NULL || *err != NULL)
    return -1;
  va_list ap;
  va_start(ap, fmt);
  _cleanup_free_ char *prefix = vformat(fmt, ap);
  va_end(ap);
  moat_error *e = xmalloc(sizeof(*e));
  e->status = saved;
  if (asprintf(&e->msg, "%s: %s", prefix, strerror(saved)) < 0)
    abort();
  *err = e;
  errno = saved;
  return -1;
}

int moat_error_wrap(moat_error **err, const char *fmt, ...) {
  if (err == NULL || *err == NULL)
    return -1;
  va_list ap;
  va_start(ap, fmt);
  _cleanup_free_ char *prefix = vformat(fmt, ap);
  va_end(ap);
  char *msg = NULL;
  if (asprintf(&msg, "%s: %s", prefix, (*err)->msg) < 0)
    abort();
  free((*err)->msg);
  (*err)->msg = msg;
  return -1;
}

void moat_error_free(moat_error **err) {
  if (err == NULL || *err == NULL)
    return;
  free((*err)->msg);
  free(*err);
  *err = NULL;
}

const char *moat_error_msg(const moat_error *err) { return err && err->msg ? err->msg : "unknown error"; }

/* error.h -- moat_error: an errno-like status plus a message, wrapped with context as it rises */
#ifndef MOAT_ERROR_H
#define MOAT_ERROR_H

#include <stdarg.h>

typedef struct moat_error {
  int status; /* errno value (ENOENT, EINVAL, ...), 0 when not errno-like */
  char *msg;  /* owned, "context: context: cause" */
} moat_error;

/* Sets *err (if err and *err is NULL) to a new error with errno-like status and a formatted
 * message. Always returns -1 so callers can `return moat_error_set(err, ...)`. */
int moat_error_set(moat_error **err, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Like moat_error_set, with ": strerror(errno)" appended and status = errno. Reads errno first. */
int moat_error_errno(moat_error **err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prefixes the message of *err with "context: ". No-op if err or *err is NULL. Returns -1. */
int moat_error_wrap(moat_error **err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Frees the error and sets *err to NULL. */
void moat_error_free(moat_error **err);

/* The message or "unknown error". */
const char *moat_error_msg(const moat_error *err);

#endif

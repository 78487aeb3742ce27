/* assert.c -- the failure ends of moat_assert and of the allocators: a message, then abort */
#include "assert.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* One write(2) of a line built on the stack: no allocation (the heap may be what is broken). */
static void say(const char *line, int len, size_t size) {
  if (len < 0)
    return;
  if ((size_t)len >= size)
    len = (int)size - 1;
  (void)!write(STDERR_FILENO, line, (size_t)len);
}

void moat_assert_fail(const char *file, int line, const char *expr, const char *fmt, ...) {
  char buf[1024];
  int n = snprintf(buf, sizeof(buf), "moat: %s:%d: assertion `%s' failed: ", file, line, expr);
  if (n > 0 && (size_t)n < sizeof(buf) - 2) {
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(buf + n, sizeof(buf) - (size_t)n - 1, fmt, ap);
    va_end(ap);
    n += m > 0 ? m : 0;
    if ((size_t)n > sizeof(buf) - 2)
      n = (int)sizeof(buf) - 2;
    buf[n++] = '\n';
  }
  say(buf, n, sizeof(buf));
  abort();
}

void moat_oom(const char *what, size_t n, const char *file, int line) {
  char buf[256];
  int len =
      file ? snprintf(buf, sizeof(buf), "moat: %s:%d: out of memory: %s of %zu bytes\n", file, line, what, n)
           : snprintf(buf, sizeof(buf), "moat: out of memory: %s of %zu bytes\n", what, n);
  say(buf, len, sizeof(buf));
  abort();
}

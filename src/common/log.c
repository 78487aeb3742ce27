/* log.c -- leveled logging to stderr, one line per call, safe across threads */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <time.h>

static enum moat_log_level min_level = MOAT_LOG_INFO;

void moat_log_set_level(enum moat_log_level level) { min_level = level; }

void moat_log(enum moat_log_level level, const char *fmt, ...) {
  static const char *names[] = {"debug", "info", "warn", "error"};
  if (level < min_level)
    return;
  char line[4096];
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  struct tm tm;
  gmtime_r(&ts.tv_sec, &tm);
  int n = snprintf(line, sizeof(line), "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %-5s ", tm.tm_year + 1900,
                   tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000,
                   names[level]);
  va_list ap;
  va_start(ap, fmt);
  int m = vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
  va_end(ap);
  size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
  if (len > sizeof(line) - 2)
    len = sizeof(line) - 2;
  line[len++] = '\n';
  fwrite(line, 1, len, stderr); /* one fwrite: stdio locks the stream, lines do not interleave */
}

/* tap.h -- the TAP helpers every unit test shares: numbered ok / not ok lines, skips, plan and summary */
#ifndef MOAT_TEST_TAP_H
#define MOAT_TEST_TAP_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>

/* Tests run so far, and how many passed, failed and were skipped. Not thread-safe: call the helpers
 * from the main thread only. */
static int tap_n, tap_pass, tap_fail, tap_skipped;

/* Prints "ok N - <message>" or "not ok N - <message>" and counts it; returns cond. */
static bool tap_ok(bool cond, const char *fmt, ...) __attribute__((format(printf, 2, 3), unused));
static bool tap_ok(bool cond, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  printf("%s %d - ", cond ? "ok" : "not ok", ++tap_n);
  vprintf(fmt, ap);
  printf("\n");
  va_end(ap);
  fflush(stdout);
  if (cond)
    tap_pass++;
  else
    tap_fail++;
  return cond;
}

/* OK(cond, fmt, ...) and CHECK(cond, fmt, ...): tap_ok, with cond evaluated completely before the
 * message's arguments (so a message may show what the condition just computed). Expressions: bool. */
#define OK(cond, ...)                                                                                        \
  ({                                                                                                         \
    bool tap_cond_ = (cond);                                                                                 \
    tap_ok(tap_cond_, __VA_ARGS__);                                                                          \
  })
#define CHECK(cond, ...) OK(cond, __VA_ARGS__)

/* Prints "ok N # SKIP <reason>" and counts it as skipped (not as passed). */
static void tap_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2), unused));
static void tap_skip(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  printf("ok %d # SKIP ", ++tap_n);
  vprintf(fmt, ap);
  printf("\n");
  va_end(ap);
  fflush(stdout);
  tap_skipped++;
}

/* Prints the plan "1..N" and the summary "N passed, N failed, N skipped"; returns the exit status
 * for main (1 when anything failed, else 0). */
static int tap_done(void) __attribute__((unused));
static int tap_done(void) {
  printf("1..%d\n%d passed, %d failed, %d skipped\n", tap_n, tap_pass, tap_fail, tap_skipped);
  fflush(stdout);
  return tap_fail ? 1 : 0;
}

#endif

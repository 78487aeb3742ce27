/* test_api_tap.h -- minimal TAP helpers for the api unit tests */
#ifndef MOAT_TEST_API_TAP_H
#define MOAT_TEST_API_TAP_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>

static int tap_n, tap_pass, tap_fail;

static bool tap_ok(bool cond, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
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
#define OK(cond, ...) tap_ok((cond), __VA_ARGS__)

/* Prints the plan and the summary line; the exit status for main. */
static int tap_done(void) {
  printf("1..%d\n", tap_n);
  printf("%d passed, %d failed\n", tap_pass, tap_fail);
  return tap_fail ? 1 : 0;
}

#endif

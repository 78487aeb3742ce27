/* test_common_assert.c -- moat_assert and the allocators' aborts: each runs in a child, which must
 * die of SIGABRT having written the message that names where and what (file:line, the condition,
 * the size that could not be had) */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/assert.h"
#include "common/fault.h"
#include "common/util.h"
#include "tap.h"

/* Under ASan and TSan, a failed malloc returns NULL (as it does without them) instead of their own
 * report. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }
const char *__tsan_default_options(void);
const char *__tsan_default_options(void) { return "allocator_may_return_null=1"; }

/* Runs fn in a child with stderr captured; returns its wait status and its stderr in out. */
static int in_child(void (*fn)(void), char *out, size_t size) {
  int p[2];
  if (pipe(p) < 0)
    return -1;
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(p[1], 2);
    close(p[0]);
    close(p[1]);
    fn();
    _exit(0);
  }
  close(p[1]);
  size_t n = 0;
  ssize_t r;
  while (n + 1 < size && (r = read(p[0], out + n, size - n - 1)) > 0)
    n += (size_t)r;
  out[n] = '\0';
  for (char *c = out; *c; c++) /* one TAP line */
    if (*c == '\n')
      *c = ' ';
  close(p[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  return st;
}

static bool aborted_saying(int st, const char *out, const char *want) {
  return WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT && strstr(out, want) != NULL;
}

/* The children say on which line they fail ("at N"), then fail there. */
static void fail_assert(void) {
  int refs = 0;
  fprintf(stderr, "at %d\n", __LINE__ + 1);
  moat_assert(refs > 0, "refs %d of %s", refs, "sb1");
}
static void pass_assert(void) { moat_assert(1 + 1 == 2, "arithmetic"); }

static volatile size_t huge = SIZE_MAX / 2; /* volatile: the compiler cannot prove malloc fails */
static void big_malloc(void) { free(xmalloc(huge)); }
static void big_calloc(void) { free(xcalloc(huge, 4)); }
static void big_realloc(void) { free(xrealloc(NULL, huge)); }
static void null_strdup(void) {
  const char *volatile s = NULL;
  fprintf(stderr, "at %d\n", __LINE__ + 1);
  free(xstrdup(s));
}

/* The second allocation from now fails (fault injection): xmalloc aborts as on a real failure. */
static void injected_alloc(void) {
  moat_fault_set(MOAT_FAULT_ALLOC, 2);
  free(xmalloc(10));
  free(xmalloc(20));
}

static int line_said(const char *out) { return strncmp(out, "at ", 3) == 0 ? atoi(out + 3) : -1; }

int main(void) {
  char out[2048], want[256];
  int st = in_child(fail_assert, out, sizeof(out));
  snprintf(want, sizeof(want), "test_common_assert.c:%d: assertion `refs > 0' failed: refs 0 of sb1",
           line_said(out));
  OK(aborted_saying(st, out, want), "a failed moat_assert aborts naming file:line, condition and message: %s",
     out);
  st = in_child(pass_assert, out, sizeof(out));
  OK(WIFEXITED(st) && WEXITSTATUS(st) == 0 && out[0] == '\0', "a true moat_assert does nothing");

  snprintf(want, sizeof(want), "out of memory: malloc of %zu bytes", (size_t)huge);
  st = in_child(big_malloc, out, sizeof(out));
  OK(aborted_saying(st, out, want), "xmalloc names the size it could not get: %s", out);
  snprintf(want, sizeof(want), "out of memory: calloc of %zu bytes", (size_t)SIZE_MAX);
  st = in_child(big_calloc, out, sizeof(out));
  OK(aborted_saying(st, out, want), "xcalloc of a product that overflows names SIZE_MAX: %s", out);
  snprintf(want, sizeof(want), "out of memory: realloc of %zu bytes", (size_t)huge);
  st = in_child(big_realloc, out, sizeof(out));
  OK(aborted_saying(st, out, want), "xrealloc names the size: %s", out);

  st = in_child(null_strdup, out, sizeof(out));
  snprintf(want, sizeof(want), "test_common_assert.c:%d: assertion `s != NULL' failed: xstrdup(NULL)",
           line_said(out));
  OK(aborted_saying(st, out, want), "xstrdup(NULL) aborts naming its caller: %s", out);
  st = in_child(injected_alloc, out, sizeof(out));
  OK(aborted_saying(st, out, "fault: alloc call 2 fails") && strstr(out, "out of memory: malloc of 20 bytes"),
     "an injected allocation failure aborts at the call asked, naming its size: %s", out);
  char *e = xstrdup("");
  OK(e && e[0] == '\0', "xstrdup(\"\") is still an empty string");
  free(e);
  return tap_done();
}

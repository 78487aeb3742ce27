/* spawn_time.c -- times posix_spawn + waitpid of a command, the local baseline for `make bench`
 *
 *   spawn_time N PROG [ARGS...]
 *
 * Runs PROG N times (after 5 untimed warm-up runs), one after the other, and prints the wall time
 * of each spawn+wait in microseconds, one per line. Exits 1 if a run fails to start or exits
 * non-zero, so that a broken baseline is never reported as a fast one.
 */
#define _GNU_SOURCE
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

extern char **environ;

static long long now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int run_once(char **argv, long long *ns) {
  long long t0 = now_ns();
  pid_t pid;
  int rc = posix_spawnp(&pid, argv[0], NULL, NULL, argv, environ);
  if (rc != 0) {
    fprintf(stderr, "spawn %s: %s\n", argv[0], strerror(rc));
    return -1;
  }
  int st;
  if (waitpid(pid, &st, 0) < 0) {
    perror("waitpid");
    return -1;
  }
  *ns = now_ns() - t0;
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    fprintf(stderr, "%s exited with status 0x%x\n", argv[0], st);
    return -1;
  }
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: spawn_time N PROG [ARGS...]\n");
    return 2;
  }
  long n = atol(argv[1]);
  long long ns;
  for (int i = 0; i < 5; i++)
    if (run_once(argv + 2, &ns) < 0)
      return 1;
  for (long i = 0; i < n; i++) {
    if (run_once(argv + 2, &ns) < 0)
      return 1;
    printf("%.1f\n", ns / 1000.0);
  }
  return 0;
}

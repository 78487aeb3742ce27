/* crashpoint.c -- named points at which a test makes moatd die as a kill -9 would */
#include "crashpoint.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static pthread_once_t once = PTHREAD_ONCE_INIT;
static const char *names; /* MOAT_CRASH_AT, or NULL */

static void load(void) {
  const char *v = getenv("MOAT_CRASH_AT");
  names = v && *v ? v : NULL;
}

void moat_crash_point(const char *name) {
  pthread_once(&once, load);
  if (!names)
    return;
  size_t n = strlen(name);
  for (const char *p = names; p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL) {
    if (strncmp(p, name, n) == 0 && (p[n] == ',' || p[n] == '\0')) {
      char line[160];
      int len = snprintf(line, sizeof(line), "crash point %s\n", name);
      if (len > 0)
        (void)!write(2, line, (size_t)len < sizeof(line) ? (size_t)len : sizeof(line) - 1);
      kill(getpid(), SIGKILL);
      pause();
    }
  }
}

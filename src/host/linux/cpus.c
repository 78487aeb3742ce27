/* cpus.c -- the CPUs a sandbox's processes may run on: as many as its cpu limit rounded up, so that
 * nproc, os.cpu_count() and sched_getaffinity inside report its own count */
#include "cpus.h"

#include <errno.h>
#include <sched.h>

int moat_cpus_apply(pid_t pid, int slot, double cpu, moat_error **err) {
  cpu_set_t own, want;
  if (sched_getaffinity(0, sizeof(own), &own) < 0)
    return moat_error_errno(err, "moatd's own CPUs");
  int count = CPU_COUNT(&own);
  int n = (int)cpu;
  if (cpu > (double)n + 1e-9)
    n++;
  if (n < 1)
    n = 1;
  if (n >= count)
    n = count; /* all of moatd's */
  /* Sandboxes of one CPU each start at different CPUs, round robin by slot. */
  int allowed[CPU_SETSIZE], k = 0;
  for (int i = 0; i < CPU_SETSIZE && k < count; i++)
    if (CPU_ISSET(i, &own))
      allowed[k++] = i;
  CPU_ZERO(&want);
  int first = (int)(((unsigned)slot * (unsigned)n) % (unsigned)count);
  for (int i = 0; i < n; i++)
    CPU_SET(allowed[(first + i) % count], &want);
  if (sched_setaffinity(pid, sizeof(want), &want) < 0)
    return moat_error_errno(err, "set the CPUs of pid %d", (int)pid);
  return 0;
}

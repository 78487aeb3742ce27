/* cpus.c -- the CPUs a sandbox's processes may run on: as many as its cpu limit rounded up, so that
 * nproc, os.cpu_count() and sched_getaffinity inside report its own count */
#include "cpus.h"

#include <errno.h>
#include <sched.h>
#include <stdio.h>

int moat_cpus_pick(int slot, double cpu, cpu_set_t *out, moat_error **err) {
  cpu_set_t own;
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
  CPU_ZERO(out);
  int first = (int)(((unsigned)slot * (unsigned)n) % (unsigned)count);
  for (int i = 0; i < n; i++)
    CPU_SET(allowed[(first + i) % count], out);
  return 0;
}

void moat_cpus_format(const cpu_set_t *set, char *buf, size_t size) {
  size_t len = 0;
  buf[0] = '\0';
  for (int i = 0; i < CPU_SETSIZE; i++) {
    if (!CPU_ISSET(i, set))
      continue;
    int j = i;
    while (j + 1 < CPU_SETSIZE && CPU_ISSET(j + 1, set))
      j++;
    int w = j == i ? snprintf(buf + len, size - len, "%s%d", len ? "," : "", i)
                   : snprintf(buf + len, size - len, "%s%d-%d", len ? "," : "", i, j);
    if (w < 0 || (size_t)w >= size - len)
      return; /* truncated: a cpuset write then fails and says so */
    len += (size_t)w;
    i = j;
  }
}

int moat_cpus_apply(pid_t pid, int slot, double cpu, moat_error **err) {
  cpu_set_t want;
  if (moat_cpus_pick(slot, cpu, &want, err) < 0)
    return -1;
  if (sched_setaffinity(pid, sizeof(want), &want) < 0)
    return moat_error_errno(err, "set the CPUs of pid %d", (int)pid);
  return 0;
}

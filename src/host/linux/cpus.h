/* cpus.h -- a sandbox's CPU affinity (its view of how many CPUs it has) */
#ifndef MOAT_LINUX_CPUS_H
#define MOAT_LINUX_CPUS_H

#include <sys/types.h>

#include "../../common/error.h"

#include <sched.h>
#include <stddef.h>

/* The CPUs of a sandbox in slot with limit cpu: ceil(cpu) of the CPUs moatd may use (all of them
 * when cpu asks as many or more), chosen round robin by slot. 0 or -1. */
int moat_cpus_pick(int slot, double cpu, cpu_set_t *out, moat_error **err);
/* set as a cpuset list ("0", "0-1", "1,3"), NUL-terminated in buf. */
void moat_cpus_format(const cpu_set_t *set, char *buf, size_t size);
/* Pins pid (the sandbox's init, before or while its processes start: children inherit it) to
 * moat_cpus_pick's CPUs. The cfs quota stays the limit; this sizes what the sandbox sees (nproc,
 * sched_getaffinity); where moatd has a cpuset controller, the slot's cpuset holds the same CPUs
 * (cgroup.h), so a process inside cannot widen its mask beyond them. 0 or -1. */
int moat_cpus_apply(pid_t pid, int slot, double cpu, moat_error **err);

#endif

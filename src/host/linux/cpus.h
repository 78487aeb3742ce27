/* cpus.h -- a sandbox's CPU affinity (its view of how many CPUs it has) */
#ifndef MOAT_LINUX_CPUS_H
#define MOAT_LINUX_CPUS_H

#include <sys/types.h>

#include "../../common/error.h"

/* Pins pid (the sandbox's init, before or while its processes start: children inherit it) to
 * ceil(cpu) of the CPUs moatd may use (all of them when cpu asks as many or more), chosen round
 * robin by slot. The cfs quota stays the limit; this only sizes what the sandbox sees (nproc,
 * sched_getaffinity); a process inside may widen its own mask. 0 or -1. */
int moat_cpus_apply(pid_t pid, int slot, double cpu, moat_error **err);

#endif

/* view.h -- the sandbox's own view of its computer: files of the slot dir bound read-only over
 * the machine's: /sys/devices/system/cpu/online (glibc's get_nprocs, os.cpu_count(),
 * sysconf(_SC_NPROCESSORS_ONLN) count its cpu limit rounded up), /proc/cpuinfo (that many
 * processors) and /proc/swaps (none: a sandbox's memory limit covers swap too) */
#ifndef MOAT_LINUX_VIEW_H
#define MOAT_LINUX_VIEW_H

#include "../../common/error.h"
#include "../driver.h"

/* The first view file, by name (slot dir), path inside and checkpoint key. */
#define MOAT_VIEW_CPU_ONLINE "cpu-online"
#define MOAT_VIEW_CPU_ONLINE_INSIDE "/sys/devices/system/cpu/online"
#define MOAT_VIEW_CPU_ONLINE_KEY "moat-cpu-online"
#define MOAT_VIEW_FILES 3

struct moat_view_file {
  const char *name;   /* in the slot dir, written by the host (root's, 0444) */
  const char *inside; /* the path it covers inside the sandbox */
  const char *key;    /* the external-mount key a checkpoint names it by */
};
/* Terminated by a NULL name. */
extern const struct moat_view_file moat_view_files[];

/* Writes the view files of slot_dir for limits l: before the shell's child binds them, and again
 * (in place, visible through the binds) when the slot's limits change. Opens nothing the sandbox
 * can reach: slot_dir is the host's. 0 or -1. */
int moat_view_write(const char *slot_dir, const struct moat_limits *l, moat_error **err);

#endif

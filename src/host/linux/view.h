/* view.h -- the sandbox's own view of its computer: files of the slot dir bound read-only over
 * the machine's: /sys/devices/system/cpu/online (glibc's get_nprocs, os.cpu_count(),
 * sysconf(_SC_NPROCESSORS_ONLN) count its cpu limit rounded up), /proc/cpuinfo (that many
 * processors) and /proc/swaps (none: a sandbox's memory limit covers swap too) */
#ifndef MOAT_LINUX_VIEW_H
#define MOAT_LINUX_VIEW_H

#include <stdbool.h>
#include <sys/types.h>

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

/* The lxcfs files a sandbox sees as its own when moatd has an lxcfs mount (driver.h): each
 * LXCFS/proc/NAME bound read-only over /proc/NAME; a checkpoint names them moat-lxcfs-NAME. */
#define MOAT_LXCFS_FILES 4
extern const char *const moat_lxcfs_files[MOAT_LXCFS_FILES + 1]; /* NULL-terminated */
/* dir is an lxcfs (FUSE) mount with proc/meminfo that others than root may read. 0 or -1. */
int moat_view_lxcfs_check(const char *dir, moat_error **err);
/* True when the sandbox whose init is pid has lxcfs files bound (its mountinfo says fuse.lxcfs). */
bool moat_view_has_lxcfs(pid_t pid);

/* Writes the view files of slot_dir for limits l: before the shell's child binds them, and again
 * (in place, visible through the binds) when the slot's limits change. Opens nothing the sandbox
 * can reach: slot_dir is the host's. 0 or -1. */
int moat_view_write(const char *slot_dir, const struct moat_limits *l, moat_error **err);

#endif

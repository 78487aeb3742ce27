/* view.h -- the sandbox's own view of its computer: files of moatd's share (share.h) bound
 * read-only over the machine's, for the sandbox's whole CPUs: /sys/devices/system/cpu/online (glibc's
 * get_nprocs, os.cpu_count(), sysconf(_SC_NPROCESSORS_ONLN) count its cpu limit rounded up), /proc/cpuinfo
 * (that many processors) and /proc/swaps (none: a sandbox's memory limit covers swap too) */
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
  const char *name;   /* in the share (root's, 0444): NAME-N for N CPUs when per_cpu, else NAME */
  const char *inside; /* the path it covers inside the sandbox */
  const char *key;    /* the external-mount key a checkpoint names it by */
  bool per_cpu;
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

/* The whole CPUs a sandbox with limits l has: its cpu rounded up, at least 1, at most the host's. */
unsigned moat_view_cpus(const struct moat_limits *l);
/* The name in the share of file f for a sandbox of cpus whole CPUs (no malloc: the shell's child
 * calls it). */
void moat_view_name(const struct moat_view_file *f, unsigned cpus, char *buf, size_t size);
/* Writes every view file for each count of CPUs from 1 to host_cpus into the directory dfd (the
 * share being made), where none is yet. 0 or -1. */
int moat_view_fill(int dfd, unsigned host_cpus, moat_error **err);

#endif

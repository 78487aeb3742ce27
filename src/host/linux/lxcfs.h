/* lxcfs.h -- the machine's lxcfs for moatd --lxcfs auto: found where Debian's service or an
 * earlier moatd mounted it, or started once for the machine and left running */
#ifndef MOAT_HOST_LINUX_LXCFS_H
#define MOAT_HOST_LINUX_LXCFS_H

/* The lxcfs moatd starts: its mount (sandboxes bind from it, so not under a data dir, which is
 * root's alone), pid file, log, and the lock that keeps two moatds from starting two. */
#define MOAT_LXCFS_HOME "/run/moat/lxcfs.d"
#define MOAT_LXCFS_DIR MOAT_LXCFS_HOME "/mnt"

/* An lxcfs mount that passes moat_view_lxcfs_check: Debian's lxcfs service's (/var/lib/lxcfs),
 * else MOAT_LXCFS_DIR's, else one this call starts at MOAT_LXCFS_DIR (`lxcfs -f -l --enable-cfs`
 * in a session of its own, signals at their defaults; it outlives moatd, as a system service
 * does, and the next moatd adopts it). Waits up to 5 s for the mount. Returns the directory
 * (caller frees), or NULL with *why set (caller frees): no lxcfs binary, no /dev/fuse, or it did
 * not come up. Never fails moatd's start-up: sandboxes then see the machine's files. */
char *moat_lxcfs_auto(char **why);

#endif

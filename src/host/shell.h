/* shell.h -- building one sandbox "shell": namespaces, uid map, root filesystem, cgroups, guest */
#ifndef MOAT_SHELL_H
#define MOAT_SHELL_H

#include <linux/filter.h>
#include <stdint.h>
#include <sys/types.h>

#include "../common/error.h"
#include "cgroup.h"
#include "driver.h"

#define MOAT_UID_RANGE 65536u
/* Where the guest listens inside the sandbox; SLOT_DIR/guest.sock is a symlink to it through
 * /proc/PID/root (moat_shell_link_sock). Its dir is a mount point (a bind of itself) owned by
 * the host's root (unmapped inside), so the sandbox can neither move it away nor replace the
 * socket with a symlink that moatd would follow on the host. */
#define MOAT_GUEST_SOCK_DIR "/run/moat/.sock"
#define MOAT_GUEST_SOCK_INSIDE MOAT_GUEST_SOCK_DIR "/guest.sock"

struct moat_shell_spec {
  int slot;
  uid_t uid_base;         /* root inside maps to uid_base outside; MOAT_UID_RANGE ids */
  const char *slot_dir;   /* host dir: lower/ disk/ root/ mount points, guest.sock */
  const char *rootfs;     /* template root image (read-only, root-owned) */
  const char *guest_path; /* static moat-guest binary */
  int disk_fd;            /* detached mount of the writable layer (disk.h); consumed */
  const struct sock_fprog *seccomp;
  struct moat_cgroups *cgroups;
  const struct moat_limits *limits;
};

struct moat_shell {
  pid_t pid; /* host pid of the guest (the sandbox's init) */
  int pidfd; /* owned */
  uint64_t start_time;
  uint64_t build_ns;
  int disk_fd; /* owned dup of spec->disk_fd's mount, kept to read the writable layer */
};

/* Creates the cgroups, clones the sandbox's init into all seven namespaces, maps its uid range,
 * hands it the idmapped template and the writable layer, and waits until moat-guest says it is
 * ready. On failure everything created is undone (cgroups removed, process killed and reaped)
 * and -1 returned. The guest listens inside the sandbox; SLOT_DIR/guest.sock links to it. */
int moat_shell_create(const struct moat_shell_spec *spec, struct moat_shell *out, moat_error **err);

/* Points SLOT_DIR/guest.sock at the guest socket inside the sandbox whose init is pid
 * (/proc/PID/root/run/moat/guest.sock), replacing any earlier link. 0 or -1. */
int moat_shell_link_sock(const char *slot_dir, pid_t pid, moat_error **err);

/* Checks that the sandbox of init pid has a socket at MOAT_GUEST_SOCK_INSIDE (resolved inside its
 * root, no symlinks) and gives MOAT_GUEST_SOCK_DIR to the host's root, 0755: the sandbox's root
 * (whose capabilities cover only its own range) can then neither remove the socket nor put
 * anything in its place. Call before anything of the sandbox runs but the guest (create) or
 * right after a restore. 0 or -1. */
int moat_shell_lock_sock(pid_t pid, moat_error **err);

/* Start time of pid (field 22 of /proc/PID/stat), or 0 when it does not exist. */
uint64_t moat_proc_start_time(pid_t pid);

#endif

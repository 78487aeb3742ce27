/* shell.h -- building one sandbox "shell": namespaces, uid map, root filesystem, cgroups, guest */
#ifndef MOAT_SHELL_H
#define MOAT_SHELL_H

#include <linux/filter.h>
#include <stdint.h>
#include <sys/types.h>

#include "../../common/error.h"
#include "cgroup.h"
#include "../driver.h"
#include "../../proto/client/guest_client.h"

#define MOAT_UID_RANGE 65536u
/* The guest channel. A host directory of the slot's, MOAT_CHAN_ROOT/INSTANCE/SLOT (every
 * component root's and 0711, so that the sandbox's root -- and CRIU restoring it -- can reach it;
 * moat_share_chan_base says which root),
 * is bind-mounted at MOAT_GUEST_SOCK_DIR inside; the guest binds guest.sock there as the sandbox's
 * root, after which moatd gives the directory to the host's root (unmapped inside, 0700): the
 * sandbox can neither move the mount, nor remove, rename or replace the socket, and moatd connects
 * to CHAN_DIR/guest.sock on the host without resolving anything inside the sandbox. CRIU dumps the
 * mount as external (MOAT_CHAN_EXT_KEY) and a restore binds it to the new slot's channel dir. */
#define MOAT_CHAN_ROOT "/run/moat/channels" /* a tmpfs (share.h) */
#define MOAT_CHAN_ROOT_LEGACY "/run/moat/chan"
#define MOAT_GUEST_SOCK_DIR "/run/moat/.sock"
#define MOAT_GUEST_SOCK_INSIDE MOAT_GUEST_SOCK_DIR "/guest.sock"
#define MOAT_CHAN_EXT_KEY "moat-chan"

struct moat_shell_spec {
  int slot;
  uid_t uid_base;        /* root inside maps to uid_base outside; MOAT_UID_RANGE ids */
  const char *slot_dir;  /* host dir: lower/ disk/ root/ mount points */
  const char *chan_dir;  /* host dir of the guest channel (MOAT_CHAN_ROOT/INSTANCE/SLOT) */
  const char *rootfs;    /* template root image (read-only, root-owned) */
  int share_fd;          /* moatd's share (share.h), cloned for the sandbox; not consumed */
  unsigned view_cpus;    /* the view files' CPU count (moat_view_cpus of limits) */
  const char *lxcfs_dir; /* an lxcfs mount (view.h), or NULL */
  int disk_fd;           /* detached mount of the writable layer (disk.h); consumed */
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
 * and -1 returned. The guest listens on CHAN_DIR/guest.sock (moat_shell_chan_ep). */
int moat_shell_create(const struct moat_shell_spec *spec, struct moat_shell *out, moat_error **err);

/* Makes the channel dir afresh (anything there before is removed; its parent must exist), empty,
 * owned by uid_base (the sandbox's root binds the socket in it), 0700. 0 or -1. */
int moat_shell_chan_prepare(const char *chan_dir, uid_t uid_base, moat_error **err);

/* Checks that CHAN_DIR/guest.sock is a socket and gives CHAN_DIR to the host's root, 0700. Call
 * once the guest is ready (create) or restored, before anything else of the sandbox runs or right
 * after a restore. 0 or -1. */
int moat_shell_chan_lock(const char *chan_dir, moat_error **err);

/* The endpoint (on channel ch) of the guest whose init is pid, listening in chan_dir. */
void moat_shell_chan_ep(const struct moat_guest_channel *ch, const char *chan_dir, pid_t pid, uid_t uid_base,
                        const char *frozen_path, struct moat_guest_ep *out);
/* The channel's ops (guest_channel.c): connect to CHAN_DIR/guest.sock proven by SO_PEERCRED, frozen
 * from the cgroup's events file. */
extern const struct moat_guest_channel_ops moat_linux_guest_channel_ops;

/* Rebinds the view files (view.h) of the sandbox whose init is pid to the share's for cpus
 * whole CPUs. Only for a pooled shell that has run nothing but moat-guest: it resolves the view
 * files' paths in the sandbox's mount namespace. 0 or -1. */
int moat_shell_view_rebind(pid_t pid, int share_fd, unsigned cpus, moat_error **err);
/* A detached, idmapped, read-only (nodev) clone of the template rootfs for the user namespace of
 * pid. Returns its fd (the caller closes it), or -1. */
int moat_shell_idmapped_template(const char *rootfs, pid_t pid, moat_error **err);
/* Opens the slot's cgroup view (cgroup.h) and makes its mount points, SLOT_DIR/cgroup[/NAME]. 0 or
 * -1 (nothing left open). */
int moat_shell_cgroup_view(const char *slot_dir, struct moat_cgroups *cg, int slot,
                           struct moat_cgroup_view *out, moat_error **err);

/* The guest binary's mount point inside a sandbox; a checkpoint names it by the external-mount
 * key MOAT_GUEST_MOUNT_KEY, which a restore maps to the share's copy (so CRIU never looks it up by
 * a host path). */
#define MOAT_GUEST_MOUNT_INSIDE "/run/moat/moat-guest"
#define MOAT_GUEST_MOUNT_KEY "moat-guest"

/* Start time of pid (field 22 of /proc/PID/stat), or 0 when it does not exist. */
uint64_t moat_proc_start_time(pid_t pid);

#endif

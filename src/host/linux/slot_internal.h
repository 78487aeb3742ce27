/* slot_internal.h -- what checkpoint.c may do with the linux driver's slots (linux_driver.c) */
#ifndef MOAT_SLOT_INTERNAL_H
#define MOAT_SLOT_INTERNAL_H

#include <stdint.h>
#include <sys/types.h>

#include "../../common/error.h"
#include "cgroup.h"
#include "../driver.h"

struct moat_slot_view {
  pid_t pid;       /* host pid of the sandbox's init (0 for a reserved slot) */
  uid_t uid_base;  /* root inside maps to this host uid; MOAT_UID_RANGE ids */
  int disk_fd;     /* owned dup of the writable layer's mount, or -1 (adopted after a restart) */
  char *slot_dir;  /* owned */
  char *chan_dir;  /* owned: the guest channel's host dir (shell.h) */
  char template_name[64];
  struct moat_limits limits;
  struct moat_cgroups *cgroups; /* the host's, not owned */
  const char *disks_dir;                  /* the host's, not owned */
  const char *template_dir, *guest_path; /* the host's (reserve only), not owned */
};

/* A running (assigned) sandbox's slot. 0, or -1 (ENOENT when the slot holds no sandbox). The
 * caller closes out->disk_fd and frees out->slot_dir and out->chan_dir. */
int moat_host_slot_view(struct moat_host *h, int slot, struct moat_slot_view *out, moat_error **err);

/* Claims a fresh slot (its own uid range) for a restore, in state building. Returns the slot
 * number and fills out (caller frees out->slot_dir and out->chan_dir), or -1. Finish with commit or abort. */
int moat_host_slot_reserve(struct moat_host *h, const char *template_name, const struct moat_limits *limits,
                           struct moat_slot_view *out, moat_error **err);

/* The restore into slot succeeded: its init is pid (not moatd's child); pidfd and disk_fd are
 * taken over. The slot is then an assigned sandbox like any created one. */
void moat_host_slot_commit(struct moat_host *h, int slot, pid_t pid, int pidfd, uint64_t start_time, int disk_fd);

/* The restore into slot failed: kills whatever runs in its cgroups, removes cgroups, slot dir and
 * range claim, frees the slot. */
void moat_host_slot_abort(struct moat_host *h, int slot);

/* (checkpoint.c) At adopt: when a checkpoint of the slot was interrupted by moatd's death, waits
 * for its CRIU to finish and thaws the sandbox unless it was paused before. */
void moat_checkpoint_recover(struct moat_cgroups *cg, int slot, const char *slot_dir);

/* The writable layer for a restore: the image at img_path admitted and allocated as a create's
 * (unless --disk-overcommit), made by moat_disk_create. The mount fd, or -1 (ENOSPC when the data
 * dir cannot back size_mb). */
int moat_host_slot_disk(struct moat_host *h, const char *img_path, uint64_t size_mb, uid_t owner, moat_error **err);

/* Fills out for an assigned slot as moat_host_create does. */
void moat_host_fill_instance(struct moat_host *h, int slot, struct moat_instance *out);

#endif

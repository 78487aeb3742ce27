/* linux_internal.h -- what the linux driver's files share: its handle, the slot views
 * checkpoint.c and export.c work on (linux_driver.c) and the ops those files implement */
#ifndef MOAT_LINUX_INTERNAL_H
#define MOAT_LINUX_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "../../common/error.h"
#include "../driver.h"
#include "cgroup.h"

/* The linux driver's handle (linux_driver.c); begins with struct moat_host (driver.h). */
struct moat_linux;

/* The linux driver's handle of a host handle it made. */
static inline struct moat_linux *moat_linux_of(struct moat_host *h) { return (struct moat_linux *)h; }
static inline struct moat_host *moat_linux_base(struct moat_linux *h) { return (struct moat_host *)h; }

struct moat_slot_view {
  pid_t pid;      /* host pid of the sandbox's init (0 for a reserved slot) */
  uid_t uid_base; /* root inside maps to this host uid; MOAT_UID_RANGE ids */
  int disk_fd;    /* owned dup of the writable layer's mount, or -1 (adopted after a restart) */
  char *slot_dir; /* owned */
  char *chan_dir; /* owned: the guest channel's host dir (shell.h) */
  char template_name[64];
  struct moat_limits limits;
  struct moat_cgroups *cgroups; /* the host's, not owned */
  const char *disks_dir;        /* the host's, not owned */
  const char *criu_net_script;  /* the host's CRIU action script (reserve only), not owned */
  const char *template_dir;     /* the dir of the slot's template image (reserve only), not owned */
  int share_fd;                 /* the host's share (share.h; reserve only), not owned */
  const char *lxcfs_dir;        /* the host's (reserve only), not owned; NULL: none */
};

/* A running (assigned) sandbox's slot. 0, or -1 (ENOENT when the slot holds no sandbox). The
 * caller closes out->disk_fd and frees out->slot_dir and out->chan_dir. */
int moat_linux_slot_view(struct moat_linux *h, int slot, struct moat_slot_view *out, moat_error **err);

/* Claims a fresh slot (its own uid range) for a restore, in state building. Returns the slot
 * number and fills out (caller frees out->slot_dir and out->chan_dir), or -1. Finish with commit
 * or abort. */
int moat_linux_slot_reserve(struct moat_linux *h, const char *template_name, const struct moat_limits *limits,
                            struct moat_slot_view *out, moat_error **err);

/* The restore into slot (reserved by moat_linux_slot_reserve, still building) succeeded: its init
 * is pid (not moatd's child); pidfd and disk_fd are taken over (closed on failure too). The slot
 * gets a network slot and is then an assigned sandbox like any created one. 0, or -1 (EINVAL)
 * when slot is not a reserved slot still building: then nothing else changes. */
int moat_linux_slot_commit(struct moat_linux *h, int slot, pid_t pid, int pidfd, uint64_t start_time,
                           int disk_fd, moat_error **err);

/* The restore into slot (reserved, still building) failed: kills whatever runs in its cgroups,
 * removes cgroups, slot dir and range claim, frees the slot. A slot that is not a reserved slot
 * still building is left alone (and the call logged). */
void moat_linux_slot_abort(struct moat_linux *h, int slot);

/* (checkpoint.c) Writes the action script a restore gives CRIU (brings the empty net namespace's
 * lo up) at path, through a temporary file renamed into place. Once, at open: a restore
 * hard-links it into its slot dir, so that no file is open for writing -- and so inherited by a
 * concurrent fork of another thread -- while CRIU executes it (which would fail ETXTBSY). */
int moat_checkpoint_write_net_script(const char *path, moat_error **err);

/* (checkpoint.c) At adopt: when a checkpoint of the slot was interrupted by moatd's death, waits
 * for its CRIU to finish and thaws the sandbox unless it was paused before. */
void moat_checkpoint_recover(struct moat_cgroups *cg, int slot, const char *slot_dir);

/* The writable layer for a restore: the image at img_path admitted and allocated as a create's
 * (unless --disk-overcommit), made by moat_disk_create. The mount fd, or -1 (ENOSPC when the data
 * dir cannot back size_mb). */
int moat_linux_slot_disk(struct moat_linux *h, const char *img_path, uint64_t size_mb, uid_t owner,
                         moat_error **err);

/* Fills out for an assigned slot as create does. */
void moat_linux_fill_instance(struct moat_linux *h, int slot, struct moat_instance *out);

/* At most one CRIU restore per CPU runs at once: a fork of 8 on 2 CPUs then has its first child
 * ready after about one restore's time instead of after all eight, interleaved, and the last no
 * later. begin waits for a turn; end gives it back. */
void moat_linux_restore_begin(struct moat_linux *h);
void moat_linux_restore_end(struct moat_linux *h);

/* ---- volume.c: the driver's volumes (driver.h has the ops' contracts) ---- */
struct moat_volumes;
/* The volumes under dir (made if missing); overcommit: images stay sparse. NULL on error. */
struct moat_volumes *moat_volumes_open(const char *dir, bool overcommit, moat_error **err);
void moat_volumes_free(struct moat_volumes *v); /* closes moatd's mounts; sandboxes keep theirs */
struct moat_volumes *moat_linux_volumes(struct moat_linux *h);
int moat_linux_volume_create(struct moat_host *h, const char *vid, uint64_t size_mb, moat_error **err);
int moat_linux_volume_remove(struct moat_host *h, const char *vid, moat_error **err);
int moat_linux_volume_root(struct moat_host *h, const char *vid, moat_error **err);
int moat_linux_volume_copy(struct moat_host *h, const char *src_vid, const char *dst_vid, moat_error **err);
int moat_linux_volume_attach(struct moat_host *h, int slot, const char *vid, const char *path, bool read_only,
                             moat_error **err);
int moat_linux_volume_usage(struct moat_host *h, const char *vid, struct moat_disk_usage *out,
                            moat_error **err);
int moat_linux_volume_gc(struct moat_host *h, const char *const *keep, size_t n, moat_error **err);

/* The volumes a slot mounts, recorded in SLOT/volumes (one "VID RO PATH" line each, PATH
 * normalised) as they are attached; a checkpoint copies the file into its dir, and a restore mounts
 * them again, in the new slot's user namespace (CRIU dumps them as external mounts). */
#define MOAT_SLOT_VOLUMES_FILE "volumes"
#define MOAT_SLOT_MAX_VOLUMES 8
struct moat_slot_volume {
  char vid[48];
  bool read_only;
  char path[1100];
};
/* The volumes recorded in dir/volumes (a slot or checkpoint dir), at most MOAT_SLOT_MAX_VOLUMES:
 * how many (0 when there is no file), or -1 for a file that does not parse. */
int moat_volume_slot_list(const char *dir, struct moat_slot_volume *out);
/* Copies src_dir/volumes to dst_dir/volumes (nothing when there is none), every one read-only with
 * all_ro. 0 or -1. */
int moat_volume_slot_copy(const char *src_dir, const char *dst_dir, bool all_ro, moat_error **err);
/* An idmapped clone of volume vid's mount for the user namespace of pid (read-only when ro),
 * detached: the caller attaches or closes it. */
int moat_linux_volume_clone(struct moat_linux *h, const char *vid, pid_t pid, bool ro, moat_error **err);

/* ---- checkpoint.c: the driver's time-travel ops (driver.h has their contracts) ---- */
int moat_linux_checkpoint(struct moat_host *h, int slot, const char *dir, bool leave_running,
                          struct moat_checkpoint_info *info, moat_error **err);
int moat_linux_restore(struct moat_host *h, const char *dir, const char *template_name,
                       const struct moat_limits *limits, unsigned flags, struct moat_instance *out,
                       moat_error **err);
int moat_linux_checkpoint_volumes(struct moat_host *h, const char *dir, moat_error **err);
const char *moat_linux_checkpoint_status(struct moat_host *h);
bool moat_linux_can_checkpoint(struct moat_host *h);
int moat_linux_guest_sessions(struct moat_host *h, int slot);
/* After a moatd restart a slot keeps no fd of its writable layer: finds it again (SLOT/fs under
 * project quotas, or the loop device of DISKS/N.img, mounted again, detached). A dir fd of the
 * layer (holding upper/ and work/; the caller closes it), or -1. */
int moat_linux_reattach_disk(const char *slot_dir, const char *disks_dir, int slot, moat_error **err);

/* ---- export.c: the driver's export_layer op (driver.h has its contract) ---- */
int moat_linux_export_layer(struct moat_host *h, int slot, int dst_dir, const char *name, moat_error **err);

#endif

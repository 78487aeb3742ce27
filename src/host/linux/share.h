/* share.h -- one read-only tmpfs of moatd's that every sandbox takes its device nodes, view files
 * and guest binary from
 *
 * moatd makes it at driver init (fsopen/fsmount) and never attaches it in the host's mount
 * namespace: each sandbox gets a clone at SLOT/MOAT_SHARE_DIR in its own mount namespace, from
 * which its init binds /dev/{null,zero,full,random,urandom,tty}, the masks of /proc files, the
 * view files (view.h) and /run/moat/moat-guest. The tmpfs is mounted size=0 (no block limit), so
 * that statfs reports f_blocks 0 and df lists none of its binds; that costs nothing because its
 * superblock is read-only from the end of moat_share_make on: nobody, moatd included, can write a
 * byte to it again. Its mountinfo source is MOAT_SHARE_SOURCE and its root paths the names below,
 * never a path of the host's.
 */
#ifndef MOAT_LINUX_SHARE_H
#define MOAT_LINUX_SHARE_H

#include "../../common/error.h"

#define MOAT_SHARE_DIR "share"           /* its mount point in a slot dir */
#define MOAT_SHARE_SOURCE "moat-share"   /* its source in mountinfo */
#define MOAT_SHARE_GUEST "moat-guest"    /* the guest binary's name in it */
#define MOAT_SHARE_NULL "null"           /* the node the /proc masks bind */
#define MOAT_SHARE_DEV_KEY "moat-share-" /* checkpoint key of a bind of node NAME: moat-share-NAME */
#define MOAT_SHARE_DEVS 6
/* The character devices in it, each as the host's /dev/NAME: NULL-terminated. */
extern const char *const moat_share_devs[MOAT_SHARE_DEVS + 1];

/* Makes the share: the device nodes, the view files for every whole-CPU count from 1 to the
 * host's (view.h) and a copy of guest_path; then read-only (nosuid). Returns the fd of its
 * detached mount (the caller keeps it for moat_share_clone and closes it), or -1. */
int moat_share_make(const char *guest_path, moat_error **err);

/* A detached clone of the share (share_fd from moat_share_make), for move_mount onto
 * SLOT/MOAT_SHARE_DIR in a sandbox's mount namespace. Returns its fd (the caller closes it), or -1. */
int moat_share_clone(int share_fd, moat_error **err);

/* The dir of this moatd instance's guest channel dirs (shell.h), made 0711 if it is not there;
 * the caller frees it. MOAT_CHAN_ROOT/INSTANCE, MOAT_CHAN_ROOT being a tmpfs of the machine's,
 * size=0 (df inside lists no bind of it), that the first moatd in the host's mount namespace
 * mounts there and nobody unmounts: moatds started later (after a kill -9 too) find it. The
 * legacy root's MOAT_CHAN_ROOT_LEGACY/INSTANCE while that holds channel dirs of sandboxes still
 * alive (made before the tmpfs), or when no tmpfs could be had (moatd in a mount namespace of
 * its own, or MOAT_CHAN_ROOT full of dirs of the host's filesystem). NULL on failure. */
char *moat_share_chan_base(const char *instance, moat_error **err);

#endif

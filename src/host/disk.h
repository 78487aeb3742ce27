/* disk.h -- a sandbox's writable layer: a sparse ext4 image on a loop device, mounted detached */
#ifndef MOAT_DISK_H
#define MOAT_DISK_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "../common/error.h"

/* Makes a sparse image of size_mb at img_path (a copy of the data extents of a golden image
 * formatted once per size, DIR/golden-SIZE.img, ext4 without journal), attaches it to a
 * free loop device with autoclear, unlinks the image path (the loop device holds the file, so a
 * crash leaks no file) and mounts it detached (fsmount: in no mount namespace). Creates upper/
 * and work/ owned by owner:owner. Returns the mount fd, or -1. Closing the fd while it is
 * attached nowhere frees the filesystem, the loop device and the image's blocks. */
int moat_disk_create(const char *img_path, uint64_t size_mb, uid_t owner, moat_error **err);

/* True when dir's file system enforces project quotas (XFS or ext4 mounted with prjquota; the
 * kernel needs CONFIG_QUOTA / CONFIG_XFS_QUOTA): then moat_disk_create_prjquota replaces the
 * loop-mounted image. */
bool moat_disk_prjquota_available(const char *dir);

/* Makes dir (on a project-quota file system) the root of a writable layer limited to size_mb:
 * project id projid with inheritance, a hard block limit, upper/ and work/ owned by owner.
 * Returns a detached bind mount of dir (open_tree clone), or -1. Writes past the limit fail with
 * ENOSPC. moat_disk_prjquota_release clears the limit once dir has been removed. */
int moat_disk_create_prjquota(const char *dir, uint32_t projid, uint64_t size_mb, uid_t owner, moat_error **err);
void moat_disk_prjquota_release(const char *fs_dir, uint32_t projid);

#endif

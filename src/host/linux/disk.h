/* disk.h -- a sandbox's writable layer: a sparse ext4 image on a loop device, mounted detached */
#ifndef MOAT_DISK_H
#define MOAT_DISK_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "../../common/error.h"

/* Makes a sparse image of size_mb at img_path (a copy of the data extents of a golden image
 * formatted once per size, DIR/golden-SIZE.img, ext4 without journal), attaches it to a
 * free loop device with autoclear and direct I/O, unlinks the image path (the loop device holds
 * the file, so a crash leaks no file) and mounts it detached (fsmount: in no mount namespace)
 * with errors=remount-ro: a write the host cannot store (its file system full) fails at the
 * writer's fsync, and once metadata could not be written the layer turns read-only (EROFS), so
 * no later write is acknowledged on a damaged layer. Creates upper/ and work/ owned by
 * owner:owner. Returns the mount fd, or -1; with img_fd, also an fd of the image (the caller's,
 * for moat_disk_reserve). Closing the fds while the mount is attached nowhere frees the
 * filesystem, the loop device and the image's blocks. */
int moat_disk_create(const char *img_path, uint64_t size_mb, uid_t owner, int *img_fd, moat_error **err);

/* Allocates every block of the image of size_mb that img_fd (from moat_disk_create) holds, so
 * that the host's file system can never lack room for what the sandbox writes (fallocate: fast,
 * no data written). 0, or -1 with ENOSPC when the file system cannot hold it (the image stays
 * sparse, as it was). */
int moat_disk_reserve(int img_fd, uint64_t size_mb, moat_error **err);

/* A volume's image: a sparse ext4 image of size_mb at img_path (written as img_path.tmp, renamed
 * into place), every block allocated when reserve (ENOSPC when the file system cannot hold it).
 * Files in it are owned by ids 0..65535 as a sandbox sees them (idmapped mounts map them). 0, or -1
 * with nothing left at img_path. */
int moat_disk_image_make(const char *img_path, uint64_t size_mb, bool reserve, moat_error **err);

/* Copies the image at src_img to dst_img (written as dst_img.tmp, renamed into place, fsynced): a
 * reflink where the file system can, else its data extents (holes stay holes); an image whose
 * blocks were all allocated gets them all allocated (ENOSPC when they do not fit). The caller makes
 * src_img quiescent first (nothing writing to it, what was written synced). 0, or -1 with nothing
 * left at dst_img. */
int moat_disk_image_copy(const char *src_img, const char *dst_img, moat_error **err);

/* Mounts the image at img_path (absolute) detached, through the loop device that backs it already
 * when it is still mounted somewhere (so there is one superblock per image), else a new autoclear
 * loop device. The mount fd (caller closes; the loop device goes once no mount holds it), or -1. */
int moat_disk_image_mount(const char *img_path, moat_error **err);

/* True when dir's file system enforces project quotas (XFS or ext4 mounted with prjquota; the
 * kernel needs CONFIG_QUOTA / CONFIG_XFS_QUOTA): then moat_disk_create_prjquota replaces the
 * loop-mounted image. */
bool moat_disk_prjquota_available(const char *dir);

/* Makes dir (on a project-quota file system) the root of a writable layer limited to size_mb:
 * project id projid with inheritance, a hard block limit, upper/ and work/ owned by owner.
 * Returns a detached bind mount of dir (open_tree clone), or -1. Writes past the limit fail with
 * ENOSPC. moat_disk_prjquota_release clears the limit once dir has been removed. */
int moat_disk_create_prjquota(const char *dir, uint32_t projid, uint64_t size_mb, uid_t owner,
                              moat_error **err);
void moat_disk_prjquota_release(const char *fs_dir, uint32_t projid);

#endif

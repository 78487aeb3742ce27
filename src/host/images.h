/* images.h -- checkpoint images on disk: one directory per image beneath a parent (the data dir's
 * snapshots/, hibernate/, checkpoints-tmp/), written as NAME.partial and renamed into place, so
 * that a crash leaves either the whole image or a leftover the next start sweeps away. The image's
 * contents are the driver's (moat_host_checkpoint writes them); these only place and remove them.
 */
#ifndef MOAT_HOST_IMAGES_H
#define MOAT_HOST_IMAGES_H

#include <stdbool.h>

#include "../common/error.h"

/* Makes dir (and its parents) 0700 when missing. 0 or -1. */
int moat_image_parent_open(const char *dir, moat_error **err);
/* Makes dir empty and 0700 (removing what was there) for an image to be written into. 0 or -1. */
int moat_image_dir_fresh(const char *dir, moat_error **err);
/* Puts the image written into part in place as dir (replacing one there) and makes the rename
 * durable (dir's parent is fsynced). 0, or -1 (part is then removed). */
int moat_image_dir_commit(const char *part, const char *dir, moat_error **err);
/* Removes dir and everything in it; a failure is logged. */
void moat_image_dir_remove(const char *dir);
bool moat_image_dir_exists(const char *dir);
/* Removes the entries of parent that keep(name, arg) rejects (keep NULL: every entry). An entry that
 * cannot be removed within 2 s (a CRIU of a moatd that died may still write into it: it outlives
 * moatd) is moved into stale_dir (itself swept at the next start) so that it is never taken for an
 * image. */
void moat_image_dirs_sweep(const char *parent, bool (*keep)(const char *name, void *arg), void *arg,
                           const char *stale_dir);

#endif

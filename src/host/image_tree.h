/* image_tree.h -- template images as trees of hard links: cloning one, applying an overlay upper
 * layer onto one, measuring one
 *
 * An image is a directory (TEMPLATE_DIR/REF/rootfs) whose files belong to the image's own ids
 * (host uid 0 = the image's root). Images made from one another share their regular files as hard
 * links, so a file of an image is never written in place: a change makes a new inode at its path.
 * Every function here runs as the host's root on trees that hostile code wrote (a sandbox's layer,
 * images built from its RUN steps): each path is reached from a directory fd with O_NOFOLLOW, so no
 * symbolic link in either tree is ever followed.
 */
#ifndef MOAT_IMAGE_TREE_H
#define MOAT_IMAGE_TREE_H

#include "../common/error.h"

/* Deepest directory nesting a clone or an apply walks; deeper trees fail with ELOOP. */
#define MOAT_IMAGE_TREE_MAX_DEPTH 512

/* Makes dst_dir/name (must not exist) a copy of src_dir/name in which every regular file is a hard
 * link to the source's (directories, symlinks, fifos, sockets and devices are made anew with the
 * same mode, owner, times and user.* / trusted.* xattrs). A regular file whose inode has as many
 * links as its file system allows (EMLINK) is copied instead (reflinked where it can be), once:
 * its other names in the clone are hard links to that copy. All walking is by dir fd with
 * O_NOFOLLOW: a symlink is recreated, never followed. Returns 0 or -1 (dst_dir/name may then be
 * partial: the caller removes it). */
int moat_image_tree_clone(int src_dir, int dst_dir, const char *name, moat_error **err);

/* Applies an overlay upper layer (layer_dir/layer_name, a directory tree exported from a sandbox:
 * owners already the image's) onto the image root root_dir/root_name (a directory), as overlayfs
 * would show upper over lower:
 *  - a 0/0 character device (a whiteout) deletes the entry at its path (a whole tree);
 *  - a directory marked opaque (user.overlay.opaque = "y") replaces the directory at its path
 *    (what was there is removed first);
 *  - a directory over a non-directory replaces it; a directory over a directory merges (mode,
 *    owner, times and the user.* / trusted.* xattrs other than *.overlay.* become the layer's);
 *  - anything else replaces what is at its path.
 * Non-directories are MOVED (renameat) from the layer into the root, which consumes the layer:
 * hard links inside the layer stay hard links and no data is copied. An existing file of the root
 * is never written in place (only replaced by a rename or removed); directories of the root
 * (never shared between images) are updated in place. A symbolic link in the root where the layer
 * has a directory is replaced, never followed. No user.overlay.* or trusted.overlay.* xattr
 * reaches the root. Before anything changes, the layer is checked: a redirect, metacopy or
 * xattr-whiteout marker (*.overlay.redirect, *.overlay.metacopy, *.overlay.whiteout), features
 * this builder does not apply, fails with EINVAL naming the path (then the root is untouched).
 * Returns 0 or -1 (after the check passed, the root may then be half applied and the layer half
 * consumed: the caller discards both). */
int moat_image_tree_apply(int root_dir, const char *root_name, int layer_dir, const char *layer_name,
                          moat_error **err);

/* Bytes in the tree beneath dir_fd (not taken over: the caller still closes it): the sizes of its
 * regular files and symlinks, each inode counted once however many of its names the tree holds
 * (links from other trees do not count against it). Entries that cannot be read count 0. */
unsigned long long moat_image_tree_size(int dir_fd);

#endif

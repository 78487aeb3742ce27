/* layer_copy.h -- copying a sandbox's overlay upper dir (its writable layer) for checkpoints and
 * image builds */
#ifndef MOAT_LAYER_COPY_H
#define MOAT_LAYER_COPY_H

#include <stdint.h>
#include <sys/types.h>

#include "../../common/error.h"

/* Copies the tree src_dir/name to dst_dir/name (which must not exist): directories,
 * regular files (reflinked when the file system can, else copied; holes kept), symlinks,
 * device nodes (overlay whiteouts are 0/0 character devices), fifos, hard links, modes,
 * times and the user.* / trusted.* xattrs of files and directories (overlay's opaque and
 * redirect markers). Owners in [from_base, from_base + 65536) become to_base + the same offset;
 * others are kept. Sockets are skipped. Adds the bytes of file data copied to *bytes.
 * Returns 0 or -1 (dst may then be partial: the caller removes it). */
int moat_layer_copy(int src_dir, int dst_dir, const char *name, uid_t from_base, uid_t to_base,
                    uint64_t *bytes, moat_error **err);

/* Like moat_layer_copy, from src_dir/src_name to dst_dir/dst_name (which must not exist), for an
 * image: owners in [from_base, from_base + 65536) become the same offset from 0 (the image's own
 * ids), and any other owner becomes 65534, the overflow id the sandbox itself saw such a file
 * owned by (nothing outside the sandbox's range turns into an id of the image's, root least). */
int moat_layer_export(int src_dir, const char *src_name, int dst_dir, const char *dst_name, uid_t from_base,
                      uint64_t *bytes, moat_error **err);

#endif

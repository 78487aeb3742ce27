/* vfiles.h -- the host's file operations beneath a directory fd it does not trust (a volume's
 * root): every path is resolved with openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
 * RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV), so a symbolic link anywhere on it fails (ELOOP) and
 * nothing outside the tree is ever reached, read or written
 *
 * Paths are relative to the root ("/a/b" and "a/b" are the same; "", "/" the root itself); a "."
 * or ".." component is EINVAL. Errors: ENOENT, ELOOP (a link on the way), ENOTDIR, EISDIR,
 * ENOTEMPTY, ENOSPC (the volume is full), EINVAL.
 */
#ifndef MOAT_HOST_VFILES_H
#define MOAT_HOST_VFILES_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "../common/error.h"
#include "../proto/client/guest_client.h"

/* 0 when path is one vfiles accepts (else EINVAL naming it). Pure. */
int moat_vfile_check_path(const char *path, moat_error **err);

/* Opens path for reading: *fd (caller closes) of a regular file (*size its size) or of a directory
 * (*is_dir). Anything else (a FIFO, a socket, a device) is EINVAL. */
int moat_vfile_open(int root, const char *path, int *fd, bool *is_dir, uint64_t *size, moat_error **err);

/* The entries of the directory dir_fd (from moat_vfile_open) named as children of path, sorted by
 * name; symbolic links are reported (link_target read), never followed. Free with
 * moat_file_entries_free. */
int moat_vfile_list(int dir_fd, const char *path, struct moat_file_entry **out, size_t *n, moat_error **err);

/* Removes the file, link or empty directory at path (not the root). */
int moat_vfile_remove(int root, const char *path, moat_error **err);

/* An upload: written to a temporary file beside path (missing parent directories are made) and
 * renamed over path at finish, so a failed upload leaves what was there. */
struct moat_vfile_writer;
int moat_vfile_write_open(int root, const char *path, mode_t mode, struct moat_vfile_writer **out,
                          moat_error **err);
int moat_vfile_write(struct moat_vfile_writer *w, const char *data, size_t len, moat_error **err);
/* fsync and rename into place; *written: the bytes written. */
int moat_vfile_write_finish(struct moat_vfile_writer *w, uint64_t *written, moat_error **err);
/* Frees w; an unfinished upload's temporary file is removed. NULL: nothing. */
void moat_vfile_writer_close(struct moat_vfile_writer *w);

#endif

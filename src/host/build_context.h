/* build_context.h -- a template build's context: the client's tar unpacked into a private directory
 * under rules that keep every entry inside it, read, globbed and hashed as Docker's COPY/ADD do, and
 * copied into an image's rootfs with every path resolved inside that rootfs.
 *
 * Inside the context every path is resolved with openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS |
 * RESOLVE_NO_XDEV) from its directory (a source that is a symbolic link is followed, within the
 * context); while unpacking, an entry's parent is resolved with RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS,
 * so an entry beneath a symbolic link of the same tar is refused (EINVAL) and the tree on disk is the
 * tar's names, never deeper.
 */
#ifndef MOAT_HOST_BUILD_CONTEXT_H
#define MOAT_HOST_BUILD_CONTEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../common/error.h"

/* Longest entry name (and link target) a context's tar may hold, in bytes. */
#define MOAT_BUILD_CONTEXT_MAX_NAME 4096

struct moat_build_context;

struct moat_copy_opts {
  const char *dest;    /* as written: absolute, or relative to workdir; a trailing '/' means a dir */
  const char *workdir; /* absolute, cleaned (NULL: "/") */
  const char *chown;   /* "user[:group]" names or numbers, or NULL (root:root); names resolved in the image */
  const char *chmod;   /* octal like "0755", or NULL (keep modes) */
  bool add;            /* ADD: a local source that is a tar archive (any compression libarchive reads)
                        * is unpacked into dest (a directory) instead of copied */
};

/* Unpacks the tar read from tar_fd (plain, gzip, bzip2, xz or zstd; an empty input is an empty
 * context) into a new private directory (mode 0700) made under work_dir. Refuses with EINVAL and a
 * message naming the entry: an absolute path, a '..' component, a symlink whose target is absolute,
 * empty or climbs above the context root (resolved lexically from the link's own directory), a hard
 * link to a path outside the context or not yet extracted (or to a directory), an entry beneath a
 * symlink, device nodes, fifos, sockets; an entry name or link target over MOAT_BUILD_CONTEXT_MAX_NAME
 * bytes; a directory entry where a file was, or the reverse; more than max_entries entries (EINVAL)
 * or more than max_bytes of file data in total (EFBIG: the sizes headers declare count, checked
 * before the data is read, and the bytes read are counted as they come). Owners from the tar are
 * ignored (files are owned by the process, uid 0 in moatd); modes are kept, setuid/setgid/sticky
 * bits for regular files and directories only. A later entry of the same name replaces an earlier
 * non-directory. Missing parent directories are made 0755. On failure nothing is left under
 * work_dir and *out is NULL. tar_fd is read, not closed. */
int moat_build_context_open(struct moat_build_context **out, int tar_fd, const char *work_dir,
                            uint64_t max_bytes, size_t max_entries, moat_error **err);
/* Removes the context's directory and frees c. NULL: nothing. */
void moat_build_context_free(struct moat_build_context *c);
/* The context's directory (owned by c). */
const char *moat_build_context_dir(const struct moat_build_context *c);

/* Reads a regular file of the context (e.g. the Dockerfile at ?dockerfile=PATH; the path is cleaned
 * lexically and resolved inside the context, never outside) into a NUL-terminated string the caller
 * frees (*len: its length, without the NUL; len may be NULL). ENOENT when missing, EINVAL when not a
 * regular file, EFBIG over max bytes. 0 or -1. */
int moat_build_context_read(struct moat_build_context *c, const char *path, char **text, size_t *len,
                            size_t max, moat_error **err);

/* Docker's source resolution of COPY/ADD: each src is a path in the context ("/x" and "../x" mean the
 * context's x, cleaned lexically and never leaving the root), with wildcards (* ? [..] and '\'
 * escapes: fnmatch per component, no special case for a leading '.'; the matches of one src sorted
 * by name at each level). A source that matches nothing is ENOENT naming it; more matches in all
 * than the context's max_entries is EINVAL. *out: a new NULL-terminated vector (strv_free) of
 * context-relative paths ("." for the root), the sources' matches in the order of srcs. 0 or -1. */
int moat_build_context_expand(struct moat_build_context *c, char *const *srcs, size_t n, char ***out,
                              moat_error **err);

/* SHA-256 over the expanded sources: for each (in the order given), its relative path and, walking
 * directories in sorted order, every entry's relative name, type, mode, size, content and link
 * target (not times, not owners), plus o's dest, workdir, chown, chmod and add (o may be NULL: none).
 * A source that is a symlink is hashed as what it points to (as copy follows it). Fields are length
 * prefixed, so no two different trees hash alike by shifting bytes between fields. Used as a COPY
 * step's cache key. 0 or -1. */
int moat_build_context_digest(struct moat_build_context *c, char *const *expanded, size_t n,
                              const struct moat_copy_opts *o, uint8_t out[32], moat_error **err);

/* Applies COPY/ADD of the expanded sources into an image being built: root_fd is a directory fd of
 * its rootfs (host uid 0 = the image's root; it may hold any symlink). Every path inside the image is
 * resolved with openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV) from root_fd, and
 * the last component of what is written is never followed, so nothing outside root_fd is opened.
 *
 * Docker's semantics: more than one source (n > 1) needs dest to end in '/' or be an existing
 * directory (else EINVAL); a directory source copies its contents (not itself) into dest (made when
 * missing; ENOTDIR when dest is not a directory); a file source goes to dest/basename when dest ends
 * in '/' or is a directory (following the image's symlinks), else to dest itself; a source that is a
 * symlink is followed within the context (as BuildKit does), the symlinks inside a directory source
 * are copied as symlinks. Missing parent directories are made (0755, owned like the copy when --chown
 * is given, else root); the image's symlinks to directories on the way (bin -> usr/bin) are followed
 * in-root, also for the directories inside a directory source. An existing non-directory at a file's
 * or symlink's destination is replaced (unlink, then create with O_EXCL: never written in place,
 * since image files may be hard links shared with other images); an existing directory where a file
 * must go is EISDIR; an existing non-directory where a directory must go is ENOTDIR. Existing
 * directories keep their mode and owner; what is created gets the source's mode (07777), or chmod's,
 * and mtime. Hard links in the context are copied as separate files.
 *
 * Owners: chown's "user[:group]": a number is that id; a user name is looked up in the image's
 * /etc/passwd (read in-root), giving its uid and, without a group, its primary gid; a number without
 * a group gives the same gid; a group name is looked up in /etc/group. An unknown name is EINVAL
 * naming it. Without chown: 0:0.
 *
 * ADD (o->add) of a source that is a regular file libarchive reads as a tar (plain, gzip, bzip2, xz,
 * zstd) unpacks it into dest as a directory, entry by entry under the context's rules (refusing ..,
 * absolute names, absolute or climbing symlinks, hard links to entries not unpacked before, devices,
 * fifos, sockets; at most the context's max_entries entries and max_bytes of data, EFBIG beyond),
 * each resolved in-root as above; its entries keep the tar's modes and numeric owners unless chown is
 * given (then chown's); chmod does not apply to them. Other sources are copied as COPY does.
 *
 * Returns 0 or -1 with *err naming the source and destination; on failure what was written so far
 * stays in the rootfs (the builder discards its copy). */
int moat_build_context_copy(struct moat_build_context *c, int root_fd, char *const *expanded, size_t n,
                            const struct moat_copy_opts *o, moat_error **err);

/* WORKDIR in an image being built: whether the absolute path is a directory in the image at root_fd,
 * and making it (each missing directory 0755, root's), every component resolved inside the image as
 * COPY resolves them. mkdirs: 0, or -1 (ENOTDIR when a non-directory is in the way). */
bool moat_image_has_dir(int root_fd, const char *path);
int moat_image_mkdirs(int root_fd, const char *path, moat_error **err);

#endif

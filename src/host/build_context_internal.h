/* build_context_internal.h -- what build_context.c (the context: unpack, read, expand, digest) and
 * build_copy.c (COPY/ADD into an image) share: lexical paths, openat2 in a root, making directories
 * and replacing files beneath a resolved parent, the tar unpacker and the tree walker */
#ifndef MOAT_HOST_BUILD_CONTEXT_INTERNAL_H
#define MOAT_HOST_BUILD_CONTEXT_INTERNAL_H

#include <linux/openat2.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "build_context.h"

struct archive;

/* Following symlinks, but only within the root. */
#define MOAT_BC_IN_ROOT (RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV)
/* Never following a symlink, never leaving the directory. */
#define MOAT_BC_BENEATH (RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV)

struct moat_build_context {
  char *dir;
  int root;           /* O_PATH of dir */
  uint64_t max_bytes; /* also bounds an ADD's unpacked data */
  size_t max_entries; /* also bounds an ADD's entries and expand's matches */
  dev_t root_dev;     /* the directory's, to know it when a walk starts there */
  ino_t root_ino;
  mode_t root_mode; /* the tar's "./" entry's mode, else 0755: the context root's as copied and hashed */
};

/* The mode to copy and hash for a walk's top st: c's root_mode when st is the context root. */
mode_t moat_bc_top_mode(const struct moat_build_context *c, const struct stat *st);

/* openat2(dir, path, flags | O_CLOEXEC, resolve), retrying EAGAIN/EINTR; -1 with errno. */
int moat_bc_openat2(int dir, const char *path, int flags, uint64_t resolve);

/* path cleaned lexically as a path inside a root: '/'-separated components without "", "." and
 * "..", a ".." at the top dropped; "." for the root itself. Never NULL (xmalloc). */
char *moat_bc_clean(const char *path);
/* a "/" b, where either "." is nothing ("." when both are). */
char *moat_bc_join(const char *a, const char *b);
/* Splits a clean path into its parent ("." at the top) and its last component (both new). */
void moat_bc_split(const char *path, char **parent, char **name);

struct moat_bc_owner {
  bool set; /* false: leave what the process creates as it is */
  uid_t uid;
  gid_t gid;
};

/* Resolves the clean path from root with resolve, making each missing directory (0755, owned by
 * own) beneath the last one that resolved; *out: an O_PATH fd of the directory. ENOTDIR naming the
 * path when something other than a directory is in the way. 0 or -1. */
int moat_bc_mkdirs(int root, const char *path, uint64_t resolve, const struct moat_bc_owner *own, int *out,
                   moat_error **err);
/* Makes room for a non-directory named name in the directory dir: nothing there is fine, a
 * non-directory is unlinked (never opened), a directory is EISDIR naming shown. 0 or -1. */
int moat_bc_make_room(int dir, const char *name, const char *shown, moat_error **err);

/* A reader of tars (plain or compressed with gzip, bzip2, xz or zstd; empty input too when
 * allow_empty) opened on fd (read from its current offset; not closed). NULL with *err. */
struct archive *moat_bc_reader(int fd, bool allow_empty, moat_error **err);

struct moat_bc_untar {
  int root;                  /* what paths are resolved from */
  const char *base;          /* clean path beneath root the tar's names are relative to */
  uint64_t resolve;          /* how parents are resolved: MOAT_BC_BENEATH or MOAT_BC_IN_ROOT */
  struct moat_bc_owner dirs; /* owner of missing parents */
  bool keep_owner;           /* entries keep the tar's numeric owner, unless entries.set */
  struct moat_bc_owner entries;
  uint64_t max_bytes;
  size_t max_entries;
  const char *what;  /* "build context", "ADD x" */
  mode_t *root_mode; /* when not NULL: set to the mode of a "./" entry */
};
/* Unpacks every entry of a into root/base under the rules of moat_build_context_open. 0 or -1. */
int moat_bc_untar(struct archive *a, const struct moat_bc_untar *u, moat_error **err);

/* One node of a walked tree: rel is its path relative to the walk's top ("" for the top itself);
 * fd an O_RDONLY fd of a regular file or directory (-1 for a symlink), st its lstat, target a
 * symlink's target. */
struct moat_bc_node {
  const char *rel;
  int fd;
  const struct stat *st;
  const char *target;
};
/* Walks the tree at top (an O_RDONLY fd of a regular file or directory; the top's own symlink was
 * followed), visiting a directory before its entries and the entries of each directory sorted by
 * name; beneath top nothing is followed (MOAT_BC_BENEATH). A node other than a regular file,
 * directory or symlink is EINVAL. visit returns 0 or -1 (stopping the walk). 0 or -1. */
int moat_bc_walk(int top, int (*visit)(void *arg, const struct moat_bc_node *node, moat_error **err),
                 void *arg, moat_error **err);

#endif

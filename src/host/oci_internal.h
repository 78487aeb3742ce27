/* oci_internal.h -- what oci_import.c (the archive, its index, manifests and config) and
 * oci_unpack.c (applying one layer tar to the rootfs) share; nothing else includes it */
#ifndef MOAT_HOST_OCI_INTERNAL_H
#define MOAT_HOST_OCI_INTERNAL_H

#include <archive.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../common/error.h"

/* Deepest entry name accepted (components). */
#define OCI_MAX_DEPTH 128

/* The paths one layer has made so far (normalised, "a/b/c"), with their ancestors: a whiteout of
 * the layer removes only what is not in here. */
struct oci_pathset {
  char **slot;
  size_t cap, n;
};

struct oci_unpack {
  int root; /* O_PATH|O_DIRECTORY of the rootfs, owned */
  dev_t root_dev;
  uint64_t max_bytes, bytes;
  size_t max_entries, entries;
  bool skipped_logged; /* one log line per import for skipped device nodes / sockets */
  bool as_root;        /* geteuid() == 0: owners applied (else EPERM from chown is ignored) */
  struct oci_pathset made;
};

/* Opens rootfs_dir for unpacking into. 0 or -1. */
int oci_unpack_init(struct oci_unpack *u, const char *rootfs_dir, uint64_t max_bytes, size_t max_entries,
                    moat_error **err);
void oci_unpack_fini(struct oci_unpack *u);
/* Applies the layer tar a (opened by the caller, its filters and format set) to the rootfs; label
 * names the layer in errors. 0 or -1 (the rootfs then holds part of the layer). */
int oci_unpack_layer(struct oci_unpack *u, struct archive *a, const char *label, moat_error **err);

/* The errno for libarchive's last error on a: an I/O or memory errno as it is, anything else
 * (a malformed archive, whatever code libarchive gives it) EINVAL. */
int oci_archive_status(struct archive *a);

/* Normalises an entry name: "./a//b/./c/" -> "a/b/c" ("" for the root). NULL (why set) when name is
 * absolute, has a ".." component or more than OCI_MAX_DEPTH components. Caller frees. */
char *oci_norm_name(const char *name, const char **why);

#endif

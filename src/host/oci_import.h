/* oci_import.h -- template images from OCI image archives: an oci-archive (an OCI image layout in a
 * tar) or a `docker save` tarball, unpacked layer by layer into a template's rootfs directory */
#ifndef MOAT_HOST_OCI_IMPORT_H
#define MOAT_HOST_OCI_IMPORT_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "../common/error.h"
#include "../common/sha256.h"

/* The image config's "config" object. Every field may be NULL (the image did not set it). */
struct moat_oci_config {
  char **env; /* "K=V", NULL-terminated */
  char *workdir, *user;
  char **entrypoint, **cmd; /* NULL-terminated */
  char **exposed;           /* "80/tcp", sorted */
  json_t *labels;           /* object (string values as the image has them), owned */
  char *stopsignal;
  char *architecture, *os; /* the image's (always set after a successful import) */
  /* sha256 of the image's manifest (the blob the index's descriptor names); for a `docker save`
   * archive without an OCI index, which holds no manifest, the config's digest (Docker's image ID). */
  uint8_t digest[MOAT_SHA256_LEN];
};
/* Frees what c holds and zeroes it (c itself is the caller's). Safe on a zeroed struct. */
void moat_oci_config_clear(struct moat_oci_config *c);

/* Reads the image archive archive_fd and unpacks one image of it into rootfs_dir (an existing,
 * empty directory), filling *out (which the caller clears; zeroed here first).
 *
 * archive_fd: a regular file is read from offset 0 with pread (its offset is neither used nor
 * moved); anything else (a pipe, a socket) is read to EOF into a temporary file made in work_dir
 * (O_TMPFILE, or a mkstemp name unlinked at once), gone when this returns. Not closed here. The
 * archive is a tar, plain, gzip or zstd: either an OCI image layout ("oci-layout", "index.json",
 * "blobs/sha256/HEX") or a `docker save` tarball ("manifest.json" with "Config"/"Layers" paths;
 * "ID/layer.tar" or "blobs/sha256/HEX" layers); an archive holding both is read as OCI.
 *
 * The image: the one whose org.opencontainers.image.ref.name or io.containerd.image.name annotation
 * (OCI) or RepoTags entry (docker) is ref, when ref is given; else the only one; an index (nested
 * ones too) resolves to the manifest for linux and this machine's architecture. The image's config
 * must say os "linux" and this machine's architecture (uname's, in Go's names: amd64, arm64, ...).
 *
 * Every blob is checked against its descriptor: size and sha256 (the manifest, the config, each
 * layer as stored, compressed or not); a docker-save legacy layer against the config's diff_id,
 * its config against its file name.
 *
 * Layers are applied in order, each a tar (plain, gzip or zstd): OCI whiteouts (".wh.NAME" removes
 * NAME, ".wh..wh..opq" empties its directory) remove only what the layers below made, whatever their
 * place in the tar; owners and modes (setuid/setgid kept) as the layer writes them (host uid = image
 * uid), regular files (sparse ones with holes), directories, symlinks (targets stored as written),
 * hard links to paths in the rootfs, fifos; device nodes and sockets are skipped (one log line per
 * import), extended attributes are not applied (never trusted.overlay.* into an overlay lower). An
 * entry name that is absolute or has a ".." component, or a hard link target that is, fails with
 * EINVAL naming the layer and the entry. Every path is resolved beneath rootfs_dir
 * (openat2 RESOLVE_IN_ROOT|RESOLVE_NO_MAGICLINKS|RESOLVE_NO_XDEV; the last component never
 * followed), so that an entry beneath a symlink a layer planted ("etc -> /", then "etc/x") lands
 * inside the rootfs (rootfs_dir/x), as Docker does, and nothing outside rootfs_dir is ever opened
 * for writing, created, removed or linked to.
 *
 * Limits: max_bytes of entry data over all layers (the sizes the layers' entries declare, so that
 * what is read is bounded too) and max_entries entries over all layers (EFBIG, naming the layer and
 * the entry); entries at most 128 components deep, JSON blobs at most 4 MiB, at most 256 layers
 * (EINVAL); at most 16,384 members in the archive and a spooled stream at most 4 * max_bytes +
 * 64 MiB (EFBIG).
 *
 * Returns 0, or -1 with *err: EINVAL for a malformed or hostile archive, a digest mismatch, no
 * image (or no ref) matching, an image for another os or architecture; EFBIG over a limit; an
 * errno for I/O. On failure rootfs_dir may hold part of the image: the caller removes it. */
int moat_oci_import(int archive_fd, const char *ref, const char *work_dir, const char *rootfs_dir,
                    uint64_t max_bytes, size_t max_entries, struct moat_oci_config *out, moat_error **err);

#endif

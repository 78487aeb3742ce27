/* criu_images.h -- a per-restore view of a checkpoint's CRIU images */
#ifndef MOAT_CRIU_IMAGES_H
#define MOAT_CRIU_IMAGES_H

#include <sys/types.h>

#include "../../common/error.h"

/* Makes dst_dir (new, 0711, owned by owner) CRIU's images dir for one restore run by CRIU inside
 * the sandbox's new user namespace (whose root is owner on the host): hard links to every image
 * of src_dir (read only, shared by concurrent restores) but the logs, the user namespace's image
 * (userns-*.img) and inventory.img, which is rewritten to say that the dumped tree shares the
 * restoring CRIU's user and UTS namespaces (root_ids.user_ns_id and uts_ns_id become the init
 * task's, ids-1.img's): CRIU then restores the tree into the namespaces it runs in instead of
 * making them (CRIU inside a user namespace cannot set a hostname through /proc/sys: the caller
 * makes the UTS namespace, moat_criu_images_uts). The new inventory is 0644, like the linked
 * images (the restored root task opens some of them from inside its namespace). Anything
 * unexpected in the images read fails with EPROTO. With ro_ext, the mount images (mountpoints-*.img)
 * are rewritten instead of linked, MS_RDONLY added to the external mounts whose key starts with
 * ro_ext, of which there must be n_ro (else EPROTO): CRIU mounts them read-only. 0 or -1. */
int moat_criu_images_link(const char *src_dir, const char *dst_dir, uid_t owner, const char *ro_ext, int n_ro,
                          moat_error **err);

/* The dumped tree's hostname and domain name (its utsns image) into nodename and domainname,
 * n bytes each. 0 or -1. */
int moat_criu_images_uts(const char *src_dir, char *nodename, char *domainname, size_t n, moat_error **err);

/* Writes into buf (len bytes) the text for /proc/PID/timens_offsets of a fresh time namespace in
 * which CLOCK_MONOTONIC and CLOCK_BOOTTIME go on from where the dumped tree of src_dir saw them
 * (its timens image: the init task's, else timens-0.img), as CRIU does itself when it makes the
 * time namespace. Returns 1 when written, 0 when the images hold no clocks, -1 on error. */
int moat_criu_images_timens_offsets(const char *src_dir, char *buf, size_t len, moat_error **err);

#endif

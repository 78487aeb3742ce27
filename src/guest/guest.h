/* guest.h -- internal interfaces of moat-guest: users, path resolution, one connection's work */
#ifndef MOAT_GUEST_H
#define MOAT_GUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "../common/error.h"
#include "../proto/proto.h"

#define GUEST_PATH_MAX 4096
#define GUEST_MAX_GROUPS 256

/* A user of the sandbox, as its /etc/passwd and /etc/group describe it. */
struct guest_user {
  char *name, *home, *shell;
  uid_t uid;
  gid_t gid;
  gid_t groups[GUEST_MAX_GROUPS]; /* supplementary groups, primary gid first */
  size_t ngroups;
};

/* Looks name up in ETC_DIR/passwd and collects its groups from ETC_DIR/group (as initgroups
 * does: the primary gid plus every group that lists the name). name NULL or "" means root
 * (uid 0; when passwd has no uid 0 line, root with home /root and shell /bin/sh). Returns 0, or -1
 * with err: EINVAL "user 'x' does not exist", or the errno of reading passwd. Free u with
 * guest_user_clear. */
int guest_user_lookup(const char *etc_dir, const char *name, struct guest_user *u, moat_error **err);
void guest_user_clear(struct guest_user *u);

/* Resolves path (absolute, or relative to home) to a normalised absolute path: no "//", "." or
 * ".." components (".." is resolved lexically; at "/" it stays "/"), no trailing slash. Returns
 * a new string, or NULL with err EINVAL (empty, longer than GUEST_PATH_MAX). */
char *guest_path_resolve(const char *home, const char *path, moat_error **err);

/* Handles one connection: reads the request frame and serves it. Does not close fd. Never
 * returns an error: failures are reported to the peer as REP_ERROR. */
void guest_serve(int fd, const char *etc_dir);
/* Touches the pages a worker writes while serving (stacks, heap), so that a spare worker pays
 * its copy-on-write faults before a request arrives rather than during it. */
void guest_prefault(void);

/* The operations, given the request already received. fd is the connection. */
void guest_exec(int fd, const struct moat_msg *req, const char *etc_dir);
void guest_file_op(int fd, const struct moat_msg *req, const char *etc_dir);

#endif

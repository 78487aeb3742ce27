/* criu.h -- finding and running the CRIU binary that scripts/criu.sh chose for this host */
#ifndef MOAT_CRIU_H
#define MOAT_CRIU_H

#include <stdbool.h>
#include <sys/types.h>

#include "../../common/error.h"

/* Where scripts/criu.sh installs the chosen CRIU (a link to the system's or to the private
 * trixie build) and its CHOICE line; MOAT_CRIU overrides the binary. */
#define MOAT_CRIU_DEFAULT "/var/lib/moat/criu/criu"
#define MOAT_CRIU_CHOICE "/var/lib/moat/criu/CHOICE"

/* Finds CRIU and runs `criu check` (the first call does the work). While the check fails, a
 * thread runs it again after 1, 2, 4 ... s, at most 60 s apart, until it passes; from then on the
 * answer is true for good. Returns true when CRIU works; *status (static storage: copy it at once)
 * says which CRIU and why, or why none is usable and when the next probe runs. Thread-safe. */
bool moat_criu_available(const char **status);

/* The CRIU binary moat_criu_available found (NULL when none). */
const char *moat_criu_path(void);

/* Hook run in the forked child just before exec (syscalls only: the parent is multi-threaded).
 * Returns 0, or -1 with errno set to abort the exec. */
typedef int (*moat_criu_child_fn)(void *arg);

/* For a child hook: enters a private mount namespace (a copy of the host's, propagation private)
 * and mounts a small tmpfs on /run (mode 1777) holding, when a kernel-feature cache was made, a
 * world-readable /run/criu.kdat, where CRIU looks (CRIU then skips ~40 ms of probing). Syscalls
 * only. 0 or -1. */
int moat_criu_child_setup(void);

/* Hook run in the parent once the child exists and before it runs child_fn (move it into
 * cgroups, ...). 0 or -1 (the child is then killed). */
typedef int (*moat_criu_parent_fn)(void *arg, pid_t child, moat_error **err);

/* Runs CRIU with argv (argv[0] is replaced by the binary's path) and waits for it. stdout and
 * stderr go to /dev/null; CRIU writes its own log (-o LOG -D/-W); its environment is moatd's with
 * XDG_RUNTIME_DIR=/run. In order: the parent runs
 * parent_fn, the child child_fn, then execs CRIU (either hook may be NULL). Returns 0 when CRIU
 * exits 0; otherwise -1 with the CRIU error lines of log_path (when given) in the message. */
int moat_criu_run(char **argv, moat_criu_parent_fn parent_fn, moat_criu_child_fn child_fn, void *arg,
                  const char *log_path, moat_error **err);

#endif

/* userns.h -- user namespaces owned by the sandbox's own host uid, and the per-user kernel limits
 * that follow from it */
#ifndef MOAT_USERNS_H
#define MOAT_USERNS_H

#include <linux/sched.h>
#include <stdint.h>
#include <sys/types.h>

#include "../../common/error.h"

/* The kernel counts per-user resources (ucounts: inotify instances and watches, pending signals,
 * POSIX message queue bytes, SHM_LOCK'ed memory, processes, namespaces) at every level of the
 * user-namespace chain: a process in a sandbox is charged to its own uid inside and to the owner
 * of the sandbox's user namespace (the euid of whoever created it) in the initial namespace. A
 * namespace moatd made as host root would charge every sandbox to host root's one budget. */

/* What each sandbox gets for itself: its init's soft and hard rlimits, and (moatd holds its own
 * soft limits at these values) the ceiling of its whole user namespace; moat_userns_set_rlimits
 * says which are per uid. */
#define MOAT_SANDBOX_SIGPENDING 16384
#define MOAT_SANDBOX_MSGQUEUE (800 * 1024)
#define MOAT_SANDBOX_MEMLOCK (8 * 1024 * 1024)
/* PTYs of a sandbox's devpts (its max=). Every devpts but the host's shares kernel.pty.max minus
 * kernel.pty.reserve (3,072 by default) between them. */
#define MOAT_SANDBOX_PTYS 64

/* Lowers moatd's own soft RLIMIT_SIGPENDING, RLIMIT_MSGQUEUE and RLIMIT_MEMLOCK to the sandbox
 * values above (never above the hard limit): a user namespace takes its creator's soft limits as
 * the ceiling of everything inside it. Call once at start, before any sandbox exists. Best
 * effort: returns 0, or -1 if a limit could not be read or set. */
int moat_userns_limits_init(moat_error **err);

/* clone3(args) from the calling thread with its effective uid set to owner and its filesystem
 * uid left as it was, capabilities kept (SECBIT_NO_SETUID_FIXUP), so that a CLONE_NEWUSER in
 * args makes a namespace that owner owns while permission checks (paths, CLONE_INTO_CGROUP) see
 * the caller. Only this thread's credentials change (raw syscalls, not glibc's set*id, which
 * broadcast to every thread), and they are restored before returning in the parent; the child
 * starts with the switched ones, and with no audit login uid (moat_userns_drop_loginuid). Returns
 * the child's pid (0 in the child), or -1 with errno. */
pid_t moat_userns_clone3(struct clone_args *args, uid_t owner);

/* Clears the calling thread's audit login uid (inherited from whoever started moatd, when that
 * was a login session) if it has one: a sandbox started from the thread would carry it, and a
 * CRIU restoring inside the sandbox's user namespace cannot set it back (that takes
 * CAP_AUDIT_CONTROL of the host). Best effort, syscalls only: 0, or -1 with errno. */
int moat_userns_drop_loginuid(void);

/* Makes the calling process owner in all its user and group ids (no supplementary groups) while
 * it keeps every capability it has, also across exec (they are raised into the ambient set). As
 * the owner of a sandbox's user namespace it then holds every capability in that namespace,
 * CAP_SYS_RESOURCE included, which host root may lack (it holds them there only as its owner).
 * Syscalls only: for a child between fork and exec. 0, or -1 with errno. */
int moat_userns_become_owner(uid_t owner);

/* Sets the calling process's RLIMIT_SIGPENDING, RLIMIT_MSGQUEUE, RLIMIT_MEMLOCK to the sandbox
 * values (soft and hard; a hard limit already lower stays) and raises RLIMIT_NPROC's soft limit
 * to its hard one: the sandbox's pids cgroup bounds its tasks, whatever uid runs them, and a
 * sandbox taken from the warm pool gets its pids limit after its init started. Syscalls only:
 * safe between fork and exec. 0, or -1 with errno.
 *
 * Per uid inside, the kernel checks each process's own limits; for the whole sandbox, its user
 * namespace's ceiling (moatd's soft limits when it was made, moat_userns_limits_init): pending
 * signals and message queue bytes are shared by all the sandbox's uids. RLIMIT_MEMLOCK's
 * namespace ceiling is compared with a count of pages (6.x): it binds nothing, so locked memory
 * is 8 MiB per uid, all of it within the sandbox's memory limit (locked pages are charged to its
 * memory cgroup). */
int moat_userns_set_rlimits(void);

#endif

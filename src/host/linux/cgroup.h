/* cgroup.h -- per-slot cgroups on cgroup v2 or hybrid v1+v2 hosts, beneath moatd's own cgroups
 *
 * Layout: for every hierarchy moat uses, OWN/moat-INSTANCE/slot-N where OWN is the cgroup moatd
 * was started in (from /proc/self/cgroup). On a pure v2 host the limits live in the v2 dir; on
 * a hybrid host they live in the v1 memory, cpu and pids hierarchies while freeze and kill use
 * the v2 dir (the unified tree has no controllers there).
 */
#ifndef MOAT_CGROUP_H
#define MOAT_CGROUP_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "../../common/error.h"
#include "../driver.h"

struct moat_cgroups;

/* Finds the hierarchies and creates OWN/moat-INSTANCE in each. 0 or -1. */
int moat_cgroups_open(struct moat_cgroups **out, const char *instance, moat_error **err);
void moat_cgroups_close(struct moat_cgroups *cg);

/* Creates slot-N everywhere and writes limits. Returns an O_DIRECTORY fd of the v2 dir (for
 * clone3's CLONE_INTO_CGROUP; the caller closes it) or -1. */
int moat_cgroup_create(struct moat_cgroups *cg, int slot, const struct moat_limits *limits, moat_error **err);
int moat_cgroup_set_limits(struct moat_cgroups *cg, int slot, const struct moat_limits *limits,
                           moat_error **err);
/* Moves pid into the slot's v1 cgroups (a no-op on pure v2 hosts). */
int moat_cgroup_attach_v1(struct moat_cgroups *cg, int slot, pid_t pid, moat_error **err);
/* Kills every process in the slot (cgroup.kill) and waits up to timeout_ms for it to empty. */
int moat_cgroup_kill(struct moat_cgroups *cg, int slot, int timeout_ms, moat_error **err);
/* Removes slot-N from every hierarchy; tolerates missing dirs. Fails with EBUSY if populated. */
int moat_cgroup_remove(struct moat_cgroups *cg, int slot, moat_error **err);
/* Freezes (frozen true) or thaws the slot through its v2 cgroup.freeze and waits up to timeout_ms
 * until cgroup.events reports the new state (a freeze completes once every task has stopped).
 * Idempotent. ENOENT when the slot has no v2 cgroup, ETIMEDOUT when the state did not settle
 * (the request stays written: the kernel finishes it on its own). 0 or -1. */
int moat_cgroup_freeze(struct moat_cgroups *cg, int slot, bool frozen, int timeout_ms, moat_error **err);
/* Path of the slot's v2 cgroup.events ("frozen 0|1"); caller frees. */
char *moat_cgroup_events_path(struct moat_cgroups *cg, int slot);
/* True when the slot's v2 cgroup reports frozen. */
bool moat_cgroup_frozen(struct moat_cgroups *cg, int slot);
/* True when slot-N exists in the v2 tree and holds processes. */
bool moat_cgroup_populated(struct moat_cgroups *cg, int slot);
int moat_cgroup_usage(struct moat_cgroups *cg, int slot, struct moat_usage *out, moat_error **err);
/* The sandbox's /sys/fs/cgroup: read-only clones of its own cgroup dirs, one per hierarchy. On a
 * hybrid host each v1 hierarchy moat uses under its controller's name (memory, cpu, pids, cpuacct, cpuset)
 * and the v2 tree as "unified", beneath a tmpfs, as the host lays them out; on a v2 host the slot's
 * v2 dir alone, named "" (mounted at /sys/fs/cgroup itself). With the sandbox's cgroup namespace
 * rooted at the slot, /proc/self/cgroup and mountinfo inside name "/" for each. */
#define MOAT_CGROUP_VIEW_MAX 6
struct moat_cgroup_view {
  int n;
  const char *name[MOAT_CGROUP_VIEW_MAX];   /* static strings */
  const char *key[MOAT_CGROUP_VIEW_MAX];    /* the external-mount key a checkpoint names it by */
  const char *inside[MOAT_CGROUP_VIEW_MAX]; /* its path inside */
  int fd[MOAT_CGROUP_VIEW_MAX]; /* detached mounts (open_tree), read-only, nosuid, nodev, noexec */
};
/* Opens the view of slot (its cgroups exist). 0, or -1 with nothing left open. */
int moat_cgroup_view_open(struct moat_cgroups *cg, int slot, struct moat_cgroup_view *out, moat_error **err);
/* The names and keys alone (fds -1), for a checkpoint's dump. */
void moat_cgroup_view_names(struct moat_cgroups *cg, struct moat_cgroup_view *out);
void moat_cgroup_view_close(struct moat_cgroup_view *v);
/* The slot's OOM-kill count alone (v2 memory.events, v1 memory.oom_control: oom_kill). */
int moat_cgroup_oom_kills(struct moat_cgroups *cg, int slot, uint64_t *out, moat_error **err);
/* Slot numbers that have a cgroup dir in any hierarchy (for reconcile). Caller frees *slots. */
int moat_cgroup_list_slots(struct moat_cgroups *cg, int **slots, size_t *n, moat_error **err);

#endif

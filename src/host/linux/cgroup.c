/* cgroup.c -- per-slot cgroups: v2 for freeze/kill everywhere, limits in v2 or in v1 (hybrid hosts) */
#include "cgroup.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../common/log.h"
#include "../../common/util.h"
#include "cpus.h"

enum { V1_MEMORY, V1_CPU, V1_PIDS, V1_CPUACCT, V1_CPUSET, V1_COUNT };
static const char *v1_names[V1_COUNT] = {"memory", "cpu", "pids", "cpuacct", "cpuset"};

struct moat_cgroups {
  bool hybrid;
  bool v2_cpuset;     /* pure v2 with the cpuset controller delegated to the slots */
  char *v2;           /* OWN/moat-INSTANCE in the v2 tree */
  char *v1[V1_COUNT]; /* OWN/moat-INSTANCE in each v1 hierarchy (hybrid only; NULL if absent) */
};

/* Finds the mount point of the v2 tree and of each v1 controller from mountinfo. */
static int find_mounts(char **v2_mnt, char *v1_mnt[V1_COUNT], moat_error **err) {
  _cleanup_fclose_ FILE *f = fopen("/proc/self/mountinfo", "re");
  if (!f)
    return moat_error_errno(err, "open /proc/self/mountinfo");
  char *line = NULL;
  size_t cap = 0;
  while (getline(&line, &cap, f) > 0) {
    /* id parent maj:min root mountpoint opts [optional...] - fstype source superopts */
    char *sep = strstr(line, " - ");
    if (!sep)
      continue;
    char mnt[4096], fstype[64], superopts[1024];
    if (sscanf(line, "%*s %*s %*s %*s %4095s", mnt) != 1)
      continue;
    if (sscanf(sep + 3, "%63s %*s %1023s", fstype, superopts) != 2)
      continue;
    if (strcmp(fstype, "cgroup2") == 0 && !*v2_mnt) {
      *v2_mnt = xstrdup(mnt);
    } else if (strcmp(fstype, "cgroup") == 0) {
      char *save = NULL;
      for (char *tok = strtok_r(superopts, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
        for (int i = 0; i < V1_COUNT; i++)
          if (strcmp(tok, v1_names[i]) == 0 && !v1_mnt[i])
            v1_mnt[i] = xstrdup(mnt);
    }
  }
  free(line);
  if (!*v2_mnt)
    return moat_error_set(err, ENOTSUP, "no cgroup2 hierarchy is mounted");
  return 0;
}

/* Reads moatd's own cgroup paths from /proc/self/cgroup. */
static int find_own(char **v2_own, char *v1_own[V1_COUNT], moat_error **err) {
  _cleanup_fclose_ FILE *f = fopen("/proc/self/cgroup", "re");
  if (!f)
    return moat_error_errno(err, "open /proc/self/cgroup");
  char *line = NULL;
  size_t cap = 0;
  while (getline(&line, &cap, f) > 0) {
    line[strcspn(line, "\n")] = '\0';
    char *c1 = strchr(line, ':');
    char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
    if (!c2)
      continue;
    *c2 = '\0';
    const char *ctrls = c1 + 1, *path = c2 + 1;
    if (c1 == line + 1 && line[0] == '0' && *ctrls == '\0') { /* "0::/path": the v2 tree */
      free(*v2_own);
      *v2_own = xstrdup(path);
      continue;
    }
    _cleanup_free_ char *copy = xstrdup(ctrls);
    char *save = NULL;
    for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
      for (int i = 0; i < V1_COUNT; i++)
        if (strcmp(tok, v1_names[i]) == 0 && !v1_own[i])
          v1_own[i] = xstrdup(path);
  }
  free(line);
  if (!*v2_own)
    *v2_own = xstrdup("/");
  return 0;
}

static char *join(const char *mnt, const char *own, const char *instance) {
  return xasprintf("%s%s%s/moat-%s", mnt, strcmp(own, "/") == 0 ? "" : own, "", instance);
}

/* Pure v2: the instance dir needs memory, cpu and pids delegated to it. If OWN holds processes
 * (the no-internal-process rule), move moatd into OWN/moatd-supervisor first, as a Delegate=yes
 * service does. */
static int enable_v2_controllers(const char *v2_mnt, const char *own, const char *inst, moat_error **err) {
  _cleanup_free_ char *own_dir = xasprintf("%s%s", v2_mnt, strcmp(own, "/") == 0 ? "" : own);
  _cleanup_free_ char *ctl = xasprintf("%s/cgroup.subtree_control", own_dir);
  moat_error *e = NULL;
  if (write_file(ctl, "+memory +cpu +pids", &e) < 0) {
    if (e->status != EBUSY) {
      moat_error_free(&e);
      return moat_error_errno(err, "enable controllers in %s", own_dir);
    }
    moat_error_free(&e);
    _cleanup_free_ char *sup = xasprintf("%s/moatd-supervisor", own_dir);
    if (mkdir(sup, 0755) < 0 && errno != EEXIST)
      return moat_error_errno(err, "mkdir %s", sup);
    _cleanup_free_ char *procs = xasprintf("%s/cgroup.procs", sup);
    _cleanup_free_ char *pid = xasprintf("%d", getpid());
    if (write_file(procs, pid, err) < 0)
      return moat_error_wrap(err, "move moatd into %s", sup);
    if (write_file(ctl, "+memory +cpu +pids", err) < 0)
      return moat_error_wrap(err, "enable controllers in %s", own_dir);
  }
  _cleanup_free_ char *inst_ctl = xasprintf("%s/cgroup.subtree_control", inst);
  if (write_file(inst_ctl, "+memory +cpu +pids", err) < 0)
    return moat_error_wrap(err, "enable controllers in %s", inst);
  return 0;
}

/* Pure v2: cpuset for the slots too, where OWN may delegate it (optional: affinity alone then
 * sizes what a sandbox sees). */
static bool enable_v2_cpuset(const char *v2_mnt, const char *own, const char *inst) {
  _cleanup_free_ char *ctl =
      xasprintf("%s%s/cgroup.subtree_control", v2_mnt, strcmp(own, "/") == 0 ? "" : own);
  _cleanup_free_ char *inst_ctl = xasprintf("%s/cgroup.subtree_control", inst);
  return write_file(ctl, "+cpuset", NULL) == 0 && write_file(inst_ctl, "+cpuset", NULL) == 0;
}

/* A v1 cpuset cgroup starts with no CPUs and no memory nodes (no task may join it): dir takes
 * those of parent where it has none. */
static int cpuset_inherit(const char *parent, const char *dir, moat_error **err) {
  static const char *files[] = {"cpuset.cpus", "cpuset.mems"};
  for (size_t i = 0; i < ARRAY_SIZE(files); i++) {
    _cleanup_free_ char *mine = xasprintf("%s/%s", dir, files[i]),
                        *theirs = xasprintf("%s/%s", parent, files[i]);
    _cleanup_free_ char *have = NULL, *want = NULL;
    if (read_file(mine, &have, NULL, err) < 0 || read_file(theirs, &want, NULL, err) < 0)
      return -1;
    if (have[strspn(have, " \n")] == '\0' && write_file(mine, want, err) < 0)
      return moat_error_wrap(err, "cpuset of %s", dir);
  }
  return 0;
}

static char *parent_dir(const char *dir) {
  char *p = xstrdup(dir);
  char *slash = strrchr(p, '/');
  if (slash && slash != p)
    *slash = '\0';
  return p;
}

int moat_cgroups_open(struct moat_cgroups **out, const char *instance, moat_error **err) {
  _cleanup_free_ char *v2_mnt = NULL, *v2_own = NULL;
  char *v1_mnt[V1_COUNT] = {0}, *v1_own[V1_COUNT] = {0};
  struct moat_cgroups *cg = xcalloc(1, sizeof(*cg));
  int ret = -1;
  if (find_mounts(&v2_mnt, v1_mnt, err) < 0 || find_own(&v2_own, v1_own, err) < 0)
    goto out;
  cg->hybrid = v1_mnt[V1_MEMORY] != NULL;
  cg->v2 = join(v2_mnt, v2_own, instance);
  if (mkdir(cg->v2, 0755) < 0 && errno != EEXIST) {
    moat_error_errno(err, "mkdir %s", cg->v2);
    goto out;
  }
  if (cg->hybrid) {
    for (int i = 0; i < V1_COUNT; i++) {
      if (!v1_mnt[i])
        continue;
      cg->v1[i] = join(v1_mnt[i], v1_own[i] ? v1_own[i] : "/", instance);
      if (mkdir(cg->v1[i], 0755) < 0 && errno != EEXIST) {
        moat_error_errno(err, "mkdir %s", cg->v1[i]);
        goto out;
      }
      _cleanup_free_ char *parent = parent_dir(cg->v1[i]);
      if (i == V1_CPUSET && cpuset_inherit(parent, cg->v1[i], err) < 0)
        goto out;
    }
    if (!cg->v1[V1_CPU] || !cg->v1[V1_PIDS]) {
      moat_error_set(err, ENOTSUP, "hybrid cgroups without the v1 cpu or pids controller");
      goto out;
    }
  } else if (enable_v2_controllers(v2_mnt, v2_own, cg->v2, err) < 0) {
    goto out;
  } else {
    cg->v2_cpuset = enable_v2_cpuset(v2_mnt, v2_own, cg->v2);
  }
  log_info("cgroups: %s, sandboxes beneath %s%s%s", cg->hybrid ? "hybrid v1+v2" : "v2", cg->v2,
           cg->hybrid ? " and " : "", cg->hybrid ? cg->v1[V1_MEMORY] : "");
  *out = steal_pointer(&cg);
  ret = 0;
out:
  for (int i = 0; i < V1_COUNT; i++) {
    free(v1_mnt[i]);
    free(v1_own[i]);
  }
  if (cg)
    moat_cgroups_close(cg);
  return ret;
}

void moat_cgroups_close(struct moat_cgroups *cg) {
  if (!cg)
    return;
  /* The instance dirs are removed when empty; leftovers are harmless and reused. */
  rmdir(cg->v2);
  free(cg->v2);
  for (int i = 0; i < V1_COUNT; i++) {
    if (cg->v1[i])
      rmdir(cg->v1[i]);
    free(cg->v1[i]);
  }
  free(cg);
}

static char *slot_dir(const char *base, int slot) { return xasprintf("%s/slot-%d", base, slot); }

static int write_at(const char *dir, const char *file, const char *value, moat_error **err) {
  _cleanup_free_ char *p = xasprintf("%s/%s", dir, file);
  return write_file(p, value, err);
}

/* The slot's cpuset holds the CPUs moat_cpus_apply pins it to (where moatd has a cpuset). */
static int set_cpuset(struct moat_cgroups *cg, int slot, double cpu, moat_error **err) {
  const char *base = cg->hybrid ? cg->v1[V1_CPUSET] : cg->v2_cpuset ? cg->v2 : NULL;
  if (!base)
    return 0;
  cpu_set_t set;
  char list[1024];
  if (moat_cpus_pick(slot, cpu, &set, err) < 0)
    return -1;
  moat_cpus_format(&set, list, sizeof(list));
  _cleanup_free_ char *d = slot_dir(base, slot);
  return write_at(d, "cpuset.cpus", list, err);
}

int moat_cgroup_set_limits(struct moat_cgroups *cg, int slot, const struct moat_limits *l, moat_error **err) {
  char mem[32], cpu[64], pids[32];
  if (set_cpuset(cg, slot, l->cpu, err) < 0)
    return moat_error_wrap(err, "set the CPUs of slot %d", slot);
  uint64_t quota = (uint64_t)(l->cpu * 100000.0 + 0.5);
  if (quota < 1000)
    quota = 1000;
  snprintf(mem, sizeof(mem), "%" PRIu64, l->memory_mb << 20);
  snprintf(pids, sizeof(pids), "%" PRIu64, l->pids);
  if (!cg->hybrid) {
    _cleanup_free_ char *d = slot_dir(cg->v2, slot);
    snprintf(cpu, sizeof(cpu), "%" PRIu64 " 100000", quota);
    if (write_at(d, "memory.max", mem, err) < 0 || write_at(d, "cpu.max", cpu, err) < 0 ||
        write_at(d, "pids.max", pids, err) < 0)
      return moat_error_wrap(err, "set limits of slot %d", slot);
    write_at(d, "memory.swap.max", "0", NULL); /* absent without swap accounting */
    return 0;
  }
  _cleanup_free_ char *dm = slot_dir(cg->v1[V1_MEMORY], slot);
  _cleanup_free_ char *dc = slot_dir(cg->v1[V1_CPU], slot);
  _cleanup_free_ char *dp = slot_dir(cg->v1[V1_PIDS], slot);
  snprintf(cpu, sizeof(cpu), "%" PRIu64, quota);
  if (write_at(dm, "memory.limit_in_bytes", mem, err) < 0 ||
      write_at(dc, "cpu.cfs_period_us", "100000", err) < 0 ||
      write_at(dc, "cpu.cfs_quota_us", cpu, err) < 0 || write_at(dp, "pids.max", pids, err) < 0)
    return moat_error_wrap(err, "set limits of slot %d", slot);
  /* Where swap accounting exists, the limit covers memory+swap too (ignore if absent). */
  _cleanup_free_ char *memsw = xasprintf("%s/memory.memsw.limit_in_bytes", dm);
  if (access(memsw, F_OK) == 0)
    write_file(memsw, mem, NULL);
  return 0;
}

int moat_cgroup_create(struct moat_cgroups *cg, int slot, const struct moat_limits *limits,
                       moat_error **err) {
  _cleanup_free_ char *d2 = slot_dir(cg->v2, slot);
  if (mkdir(d2, 0755) < 0 && errno != EEXIST)
    return moat_error_errno(err, "mkdir %s", d2);
  if (cg->hybrid)
    for (int i = 0; i < V1_COUNT; i++) {
      if (!cg->v1[i])
        continue;
      _cleanup_free_ char *d = slot_dir(cg->v1[i], slot);
      if (mkdir(d, 0755) < 0 && errno != EEXIST)
        return moat_error_errno(err, "mkdir %s", d);
      if (i == V1_CPUSET && cpuset_inherit(cg->v1[i], d, err) < 0)
        return -1;
    }
  if (moat_cgroup_set_limits(cg, slot, limits, err) < 0)
    return -1;
  int fd = open(d2, O_DIRECTORY | O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return moat_error_errno(err, "open %s", d2);
  return fd;
}

int moat_cgroup_attach_v1(struct moat_cgroups *cg, int slot, pid_t pid, moat_error **err) {
  if (!cg->hybrid)
    return 0;
  char p[32];
  snprintf(p, sizeof(p), "%d", pid);
  for (int i = 0; i < V1_COUNT; i++) {
    if (!cg->v1[i])
      continue;
    _cleanup_free_ char *d = slot_dir(cg->v1[i], slot);
    if (write_at(d, "cgroup.procs", p, err) < 0)
      return moat_error_wrap(err, "attach pid %d to slot %d", pid, slot);
  }
  return 0;
}

static bool v2_populated(const char *dir) {
  _cleanup_free_ char *p = xasprintf("%s/cgroup.events", dir);
  _cleanup_free_ char *s = NULL;
  if (read_file(p, &s, NULL, NULL) < 0)
    return false;
  return strstr(s, "populated 1") != NULL;
}

bool moat_cgroup_populated(struct moat_cgroups *cg, int slot) {
  _cleanup_free_ char *d = slot_dir(cg->v2, slot);
  return v2_populated(d);
}

static bool v2_frozen(const char *dir) {
  _cleanup_free_ char *p = xasprintf("%s/cgroup.events", dir);
  _cleanup_free_ char *s = NULL;
  if (read_file(p, &s, NULL, NULL) < 0)
    return false;
  return strstr(s, "frozen 1") != NULL;
}

char *moat_cgroup_events_path(struct moat_cgroups *cg, int slot) {
  return xasprintf("%s/slot-%d/cgroup.events", cg->v2, slot);
}

bool moat_cgroup_frozen(struct moat_cgroups *cg, int slot) {
  _cleanup_free_ char *d = slot_dir(cg->v2, slot);
  return v2_frozen(d);
}

int moat_cgroup_freeze(struct moat_cgroups *cg, int slot, bool frozen, int timeout_ms, moat_error **err) {
  _cleanup_free_ char *d = slot_dir(cg->v2, slot);
  if (access(d, F_OK) < 0)
    return moat_error_errno(err, "slot %d has no cgroup %s", slot, d);
  if (write_at(d, "cgroup.freeze", frozen ? "1" : "0", err) < 0)
    return moat_error_wrap(err, "%s slot %d", frozen ? "freeze" : "thaw", slot);
  _cleanup_free_ char *ev = xasprintf("%s/cgroup.events", d);
  _cleanup_close_ int fd = open(ev, O_RDONLY | O_CLOEXEC);
  uint64_t deadline = now_ns() + (uint64_t)timeout_ms * 1000000ull;
  /* cgroup.events notifies (POLLPRI) on every change of "frozen"; poll in short steps as well
   * in case a notification raced the first read. */
  while (v2_frozen(d) != frozen) {
    uint64_t now = now_ns();
    if (now >= deadline)
      return moat_error_set(err, ETIMEDOUT, "slot %d: not %s %d ms after writing cgroup.freeze", slot,
                            frozen ? "frozen" : "thawed", timeout_ms);
    if (fd >= 0) {
      struct pollfd pfd = {.fd = fd, .events = POLLPRI};
      poll(&pfd, 1, 5);
    } else {
      usleep(200);
    }
  }
  return 0;
}

int moat_cgroup_kill(struct moat_cgroups *cg, int slot, int timeout_ms, moat_error **err) {
  _cleanup_free_ char *d = slot_dir(cg->v2, slot);
  if (access(d, F_OK) < 0)
    return 0;
  /* Thaw first: a frozen cgroup's processes cannot die. */
  write_at(d, "cgroup.freeze", "0", NULL);
  if (write_at(d, "cgroup.kill", "1", err) < 0)
    return moat_error_wrap(err, "kill slot %d", slot);
  _cleanup_free_ char *ev = xasprintf("%s/cgroup.events", d);
  _cleanup_close_ int fd = open(ev, O_RDONLY | O_CLOEXEC);
  uint64_t deadline = now_ns() + (uint64_t)timeout_ms * 1000000ull;
  while (v2_populated(d)) {
    uint64_t now = now_ns();
    if (now >= deadline)
      return moat_error_set(err, ETIMEDOUT, "slot %d: processes still alive %d ms after cgroup.kill", slot,
                            timeout_ms);
    if (fd >= 0) {
      struct pollfd pfd = {.fd = fd, .events = POLLPRI};
      int left = (int)((deadline - now) / 1000000ull) + 1;
      poll(&pfd, 1, left < 20 ? left : 20);
    } else {
      usleep(1000);
    }
  }
  return 0;
}

static int rmdir_slot(const char *base, int slot, moat_error **err) {
  _cleanup_free_ char *d = slot_dir(base, slot);
  for (int tries = 0; rmdir(d) < 0; tries++) {
    if (errno == ENOENT)
      return 0;
    /* v1 memory cgroups may stay busy briefly while the last task's exit finishes. */
    if (errno != EBUSY || tries >= 200)
      return moat_error_errno(err, "rmdir %s", d);
    usleep(1000);
  }
  return 0;
}

int moat_cgroup_remove(struct moat_cgroups *cg, int slot, moat_error **err) {
  if (cg->hybrid)
    for (int i = 0; i < V1_COUNT; i++)
      if (cg->v1[i] && rmdir_slot(cg->v1[i], slot, err) < 0)
        return -1;
  return rmdir_slot(cg->v2, slot, err);
}

static uint64_t read_u64_at(const char *dir, int slot, const char *file) {
  _cleanup_free_ char *d = slot_dir(dir, slot);
  _cleanup_free_ char *p = xasprintf("%s/%s", d, file);
  _cleanup_free_ char *s = NULL;
  if (read_file(p, &s, NULL, NULL) < 0)
    return 0;
  return strtoull(s, NULL, 10);
}

static uint64_t read_keyed(const char *dir, int slot, const char *file, const char *key) {
  _cleanup_free_ char *d = slot_dir(dir, slot);
  _cleanup_free_ char *p = xasprintf("%s/%s", d, file);
  _cleanup_free_ char *s = NULL;
  if (read_file(p, &s, NULL, NULL) < 0)
    return 0;
  size_t kl = strlen(key);
  for (char *line = s; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL)
    if (strncmp(line, key, kl) == 0 && line[kl] == ' ')
      return strtoull(line + kl + 1, NULL, 10);
  return 0;
}

int moat_cgroup_usage(struct moat_cgroups *cg, int slot, struct moat_usage *out, moat_error **err) {
  memset(out, 0, sizeof(*out));
  if (!cg->hybrid) {
    out->memory_bytes = read_u64_at(cg->v2, slot, "memory.current");
    out->cpu_usage_ns = read_keyed(cg->v2, slot, "cpu.stat", "usage_usec") * 1000;
    out->pids = read_u64_at(cg->v2, slot, "pids.current");
    out->oom_kills = read_keyed(cg->v2, slot, "memory.events", "oom_kill");
    uint64_t inactive = read_keyed(cg->v2, slot, "memory.stat", "inactive_file");
    out->working_set_bytes = out->memory_bytes > inactive ? out->memory_bytes - inactive : 0;
    return 0;
  }
  out->memory_bytes = read_u64_at(cg->v1[V1_MEMORY], slot, "memory.usage_in_bytes");
  if (cg->v1[V1_CPUACCT])
    out->cpu_usage_ns = read_u64_at(cg->v1[V1_CPUACCT], slot, "cpuacct.usage");
  out->pids = read_u64_at(cg->v1[V1_PIDS], slot, "pids.current");
  out->oom_kills = read_keyed(cg->v1[V1_MEMORY], slot, "memory.oom_control", "oom_kill");
  uint64_t inactive = read_keyed(cg->v1[V1_MEMORY], slot, "memory.stat", "total_inactive_file");
  out->working_set_bytes = out->memory_bytes > inactive ? out->memory_bytes - inactive : 0;
  return 0;
}

void moat_cgroup_view_names(struct moat_cgroups *cg, struct moat_cgroup_view *out) {
  static const char *keys[V1_COUNT] = {"moat-cg-memory", "moat-cg-cpu", "moat-cg-pids", "moat-cg-cpuacct",
                                       "moat-cg-cpuset"};
  static const char *insides[V1_COUNT] = {"/sys/fs/cgroup/memory", "/sys/fs/cgroup/cpu",
                                          "/sys/fs/cgroup/pids", "/sys/fs/cgroup/cpuacct",
                                          "/sys/fs/cgroup/cpuset"};
  memset(out, 0, sizeof(*out));
  for (int i = 0; i < MOAT_CGROUP_VIEW_MAX; i++)
    out->fd[i] = -1;
  if (!cg->hybrid) {
    out->name[0] = "";
    out->key[0] = "moat-cg";
    out->inside[0] = "/sys/fs/cgroup";
    out->n = 1;
    return;
  }
  for (int i = 0; i < V1_COUNT; i++)
    if (cg->v1[i]) {
      out->name[out->n] = v1_names[i];
      out->key[out->n] = keys[i];
      out->inside[out->n++] = insides[i];
    }
  out->name[out->n] = "unified";
  out->key[out->n] = "moat-cg-unified";
  out->inside[out->n++] = "/sys/fs/cgroup/unified";
}

void moat_cgroup_view_close(struct moat_cgroup_view *v) {
  for (int i = 0; i < v->n; i++)
    if (v->fd[i] >= 0) {
      close(v->fd[i]);
      v->fd[i] = -1;
    }
}

int moat_cgroup_view_open(struct moat_cgroups *cg, int slot, struct moat_cgroup_view *out, moat_error **err) {
  moat_cgroup_view_names(cg, out);
  for (int i = 0; i < out->n; i++) {
    const char *base = cg->v2;
    for (int k = 0; cg->hybrid && k < V1_COUNT; k++)
      if (cg->v1[k] && strcmp(out->name[i], v1_names[k]) == 0)
        base = cg->v1[k];
    _cleanup_free_ char *d = slot_dir(base, slot);
    /* moat's own cgroup dirs: nothing of the sandbox's is resolved */
    out->fd[i] = open_tree(AT_FDCWD, d, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_SYMLINK_NOFOLLOW);
    struct mount_attr attr = {.attr_set = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV |
                                          MOUNT_ATTR_NOEXEC};
    if (out->fd[i] < 0 || mount_setattr(out->fd[i], "", AT_EMPTY_PATH, &attr, sizeof(attr)) < 0) {
      moat_error_errno(err, "a read-only clone of %s", d);
      moat_cgroup_view_close(out);
      return -1;
    }
  }
  return 0;
}

int moat_cgroup_oom_kills(struct moat_cgroups *cg, int slot, uint64_t *out, moat_error **err) {
  const char *base = cg->hybrid ? cg->v1[V1_MEMORY] : cg->v2;
  const char *file = cg->hybrid ? "memory.oom_control" : "memory.events";
  _cleanup_free_ char *p = xasprintf("%s/slot-%d/%s", base, slot, file);
  _cleanup_free_ char *s = NULL;
  if (read_file(p, &s, NULL, err) < 0)
    return moat_error_wrap(err, "OOM kills of slot %d", slot);
  *out = 0;
  for (char *line = s; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL)
    if (strncmp(line, "oom_kill ", 9) == 0)
      *out = strtoull(line + 9, NULL, 10);
  return 0;
}

static void collect(const char *base, int **slots, size_t *n, size_t *cap) {
  DIR *d = opendir(base);
  if (!d)
    return;
  struct dirent *de;
  while ((de = readdir(d)) != NULL) {
    uint64_t v;
    if (strncmp(de->d_name, "slot-", 5) != 0 || parse_u64(de->d_name + 5, &v) < 0 || v > INT32_MAX)
      continue;
    bool seen = false;
    for (size_t i = 0; i < *n; i++)
      seen |= (*slots)[i] == (int)v;
    if (seen)
      continue;
    if (*n == *cap) {
      *cap = *cap ? *cap * 2 : 16;
      *slots = xrealloc(*slots, *cap * sizeof(int));
    }
    (*slots)[(*n)++] = (int)v;
  }
  closedir(d);
}

int moat_cgroup_list_slots(struct moat_cgroups *cg, int **slots, size_t *n, moat_error **err) {
  size_t cap = 0;
  *slots = NULL;
  *n = 0;
  collect(cg->v2, slots, n, &cap);
  for (int i = 0; i < V1_COUNT; i++)
    if (cg->v1[i])
      collect(cg->v1[i], slots, n, &cap);
  return 0;
}

/* linux_driver.c -- the linux isolation driver (moat_linux_driver, driver.h's ops table): slots,
 * uid-range claims, the warm pool, teardown, adoption after a restart and reconcile of leftovers;
 * checkpoint.c adds checkpoint and restore
 *
 * A slot number is also the index of a host-wide uid range: root in slot N's sandbox is
 * MOAT_UID_BASE + N * 65536 on the host. Several moatd instances (each with its own data dir)
 * share the range space through claim files RANGES_DIR/N created with O_EXCL.
 */
#include "../driver.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/sysinfo.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../common/log.h"
#include "../../common/util.h"
#include "../drivers.h"
#include "../net/net.h"
#include "cgroup.h"
#include "disk.h"
#include "cpus.h"
#include "lxcfs.h"
#include "share.h"
#include "view.h"
#include "linux_internal.h"
#include "seccomp.h"
#include "shell.h"
#include "userns.h"

#define MOAT_UID_BASE 0x40000000u
#define MOAT_MAX_RANGES 49150
#define RANGES_DIR "/run/moat/ranges"
#define POOL_DISK_MB 10240
#define MAX_BUILDS 4

enum slot_state { SLOT_BUILDING = 1, SLOT_POOLED, SLOT_ASSIGNED, SLOT_TEARDOWN };

struct slot {
  int index;
  enum slot_state state;
  pid_t pid;
  int pidfd;
  uint64_t start_time;
  bool own_child;            /* moatd is the parent: reap it after killing */
  int disk_fd;               /* the writable layer's mount (checkpoints copy its upper/); -1 after adopt */
  int img_fd;                /* its image while not yet reserved (a warm shell's, or queued), else -1 */
  uint64_t reserve_mb;       /* queued for reservation: counted in disk_pending_mb */
  struct slot *next_reserve; /* the reservation queue */
  char template_name[64];
  ino_t template_ino; /* the inode of TEMPLATE/ready it was built from: a rebuild makes a new one */
  uint64_t disk_mb;
  struct moat_limits limits;
  int net; /* network slot (net.h), or -1 */
  struct slot *next_teardown;
};

struct moat_linux {
  struct moat_host base; /* first (driver.h) */
  char *data_dir, *slots_dir, *disks_dir, *template_dir, *images_dir, *guest_path, *pool_template;
  char *criu_net_script; /* written once at open: restores link it into their slot dir */
  char *chan_base;       /* the slots' guest channel dirs (moat_share_chan_base) */
  int share_fd;          /* the share's detached mount (share.h) */
  char *lxcfs_dir;       /* driver.h's lxcfs_dir, checked; NULL: none */
  char instance[17];
  unsigned pool_size, max_slots;
  bool prjquota;             /* the data dir's fs enforces project quotas: no loop images */
  bool disk_overcommit;      /* sparse images, no admission by free space */
  uint64_t disk_pending_mb;  /* admitted but not yet allocated (h->lock) */
  struct slot *reserve_head; /* handed-out warm shells whose images the worker allocates */
  struct moat_cgroups *cgroups;
  struct sock_fprog seccomp;
  struct moat_net *net; /* NULL: loopback only */
  struct moat_volumes *volumes;

  /* lock guards slots[] and every struct slot's state and fields, live, pooled, building,
   * disk_pending_mb, the reservation and teardown queues and stopping. It is a leaf: nothing else
   * (net's locks, restore_lock) is taken while it is held, and it is held for memory only (a
   * poll or fd dup at most), never across a file-system, cgroup, netlink or process round trip:
   * those run on a slot the lock has marked (building, teardown) or reserved for the caller. */
  pthread_mutex_t lock;
  struct slot **slots; /* by index, MOAT_MAX_RANGES entries */
  unsigned live;       /* slots in any state */
  unsigned pooled;
  bool stopping;
  pthread_cond_t wake;       /* with lock: the pool filler and teardown worker wait for work */
  unsigned building;         /* shell builds in progress */
  pthread_cond_t build_slot; /* with lock: signalled when a build finishes */
  struct slot *teardown_head;
  pthread_t filler, reaper; /* pool filler, teardown worker */
  bool threads_started;

  pthread_mutex_t restore_lock; /* restoring (a leaf: nothing is taken inside) */
  pthread_cond_t restore_turn;
  int restoring, restore_max; /* CRIU restores running, and at most (one per CPU, at least 2) */
};

static const struct moat_limits default_limits = {
    .cpu = 2.0, .memory_mb = 2048, .pids = 4096, .disk_mb = POOL_DISK_MB};

static uid_t slot_uid_base(int index) { return MOAT_UID_BASE + (uid_t)index * MOAT_UID_RANGE; }

static char *slot_path(struct moat_linux *h, int index) { return xasprintf("%s/%d", h->slots_dir, index); }
static char *chan_path(struct moat_linux *h, int index) { return xasprintf("%s/%d", h->chan_base, index); }

/* FNV-1a of the data dir's real path names this instance's cgroups. */
static void instance_name(const char *data_dir, char out[17]) {
  uint64_t x = 1469598103934665603ull;
  for (const char *p = data_dir; *p; p++) {
    x ^= (unsigned char)*p;
    x *= 1099511628211ull;
  }
  snprintf(out, 17, "%016llx", (unsigned long long)x);
}

/* Claims host-wide range n: creates RANGES_DIR/N (O_EXCL) holding our data dir. 1 when claimed,
 * 0 when another moatd holds it, -1 on error. Makes syscalls: call without h->lock. */
static int claim_range(struct moat_linux *h, int n, moat_error **err) {
  char path[64];
  snprintf(path, sizeof(path), RANGES_DIR "/%d", n);
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0)
    return errno == EEXIST ? 0 : moat_error_errno(err, "claim uid range %s", path);
  int w = write_all(fd, h->data_dir, strlen(h->data_dir));
  close(fd);
  if (w < 0) {
    moat_error_errno(err, "write %s", path);
    unlink(path);
    return -1;
  }
  return 1;
}

/* True when RANGES_DIR/N names our data dir. */
static bool range_is_ours(struct moat_linux *h, int n) {
  char path[64];
  snprintf(path, sizeof(path), RANGES_DIR "/%d", n);
  _cleanup_free_ char *s = NULL;
  if (read_file(path, &s, NULL, NULL) < 0)
    return false;
  return strcmp(s, h->data_dir) == 0;
}

static void release_range(struct moat_linux *h, int n) {
  char path[64];
  snprintf(path, sizeof(path), RANGES_DIR "/%d", n);
  if (range_is_ours(h, n))
    unlink(path);
}

/* Removes everything of slot n on the host: processes, cgroups, slot dir, range claim. */
static int cleanup_slot(struct moat_linux *h, int n, struct slot *s, moat_error **err) {
  int ret = 0;
  if (moat_cgroup_kill(h->cgroups, n, 5000, err) < 0)
    ret = -1;
  if (s && s->net >= 0) {
    moat_net_release(h->net, s->net); /* its veth goes in net's worker */
    s->net = -1;
  }
  if (s && s->pidfd >= 0) {
    if (s->own_child)
      while (waitid(P_PIDFD, (id_t)s->pidfd, NULL, WEXITED | __WALL) < 0 && errno == EINTR)
        ;
    close(s->pidfd);
    s->pidfd = -1;
  }
  if (s && s->disk_fd >= 0) {
    close(s->disk_fd);
    s->disk_fd = -1;
  }
  if (s && s->img_fd >= 0) {
    close(s->img_fd);
    s->img_fd = -1;
  }
  if (ret == 0 && moat_cgroup_remove(h->cgroups, n, err) < 0)
    ret = -1;
  _cleanup_free_ char *dir = slot_path(h, n);
  _cleanup_free_ char *chan = chan_path(h, n);
  if (ret == 0 && (rm_rf(dir, err) < 0 || rm_rf(chan, err) < 0))
    ret = -1;
  if (ret == 0 && h->prjquota)
    moat_disk_prjquota_release(h->slots_dir, (uint32_t)n + 1);
  if (ret == 0)
    release_range(h, n);
  return ret;
}

static struct slot *slot_new(int index, enum slot_state state) {
  struct slot *s = xcalloc(1, sizeof(*s));
  s->index = index;
  s->state = state;
  s->pidfd = -1;
  s->disk_fd = -1;
  s->img_fd = -1;
  s->net = -1;
  return s;
}

/* ---- disk admission and reservation ----
 * Unless the operator allows overcommit (--disk-overcommit), a sandbox's writable layer is backed
 * by the data dir's file system: its image is allocated in full (moat_disk_reserve), so a write
 * inside never finds the host out of room. A sandbox is admitted when the file system's free
 * space, less what admitted sandboxes have still to allocate, holds its disk_mb; otherwise its
 * create (or restore) fails with ENOSPC (API 507). A warm shell's image stays sparse (the pool
 * holds no space); when a create takes the shell its allocation is queued to the worker thread,
 * off the request path, and counted as pending until done. On project quotas (no image) the
 * admission compares with the free space only. */

/* Admits disk_mb: adds it to disk_pending_mb (disk_settle takes it off). 0, or -1 with ENOSPC. */
static int disk_admit(struct moat_linux *h, uint64_t disk_mb, moat_error **err) {
  if (h->disk_overcommit)
    return 0;
  struct statvfs sv;
  if (statvfs(h->disks_dir, &sv) < 0)
    return moat_error_errno(err, "statvfs %s", h->disks_dir);
  uint64_t free_mb = (uint64_t)sv.f_bavail * (uint64_t)sv.f_frsize >> 20;
  pthread_mutex_lock(&h->lock);
  uint64_t pending = h->disk_pending_mb;
  bool ok = free_mb >= pending && free_mb - pending >= disk_mb;
  if (ok)
    h->disk_pending_mb += disk_mb;
  pthread_mutex_unlock(&h->lock);
  if (!ok)
    return moat_error_set(
        err, ENOSPC,
        "the data dir's file system has %llu MiB free (%llu promised to sandboxes being set up): "
        "it cannot back disk_mb %llu (moatd --disk-overcommit allows it)",
        (unsigned long long)free_mb, (unsigned long long)pending, (unsigned long long)disk_mb);
  return 0;
}

static void disk_settle(struct moat_linux *h, uint64_t disk_mb) {
  if (h->disk_overcommit)
    return;
  pthread_mutex_lock(&h->lock);
  h->disk_pending_mb -= disk_mb < h->disk_pending_mb ? disk_mb : h->disk_pending_mb;
  pthread_mutex_unlock(&h->lock);
}

/* Takes s off the reservation queue if it is on it (h->lock held); its pending amount goes. */
static void reserve_unqueue_locked(struct moat_linux *h, struct slot *s) {
  for (struct slot **pp = &h->reserve_head; *pp; pp = &(*pp)->next_reserve)
    if (*pp == s) {
      *pp = s->next_reserve;
      s->next_reserve = NULL;
      h->disk_pending_mb -= s->reserve_mb < h->disk_pending_mb ? s->reserve_mb : h->disk_pending_mb;
      s->reserve_mb = 0;
      return;
    }
}

/* The worker: allocates the queued images. */
static void run_reserves(struct moat_linux *h) {
  for (;;) {
    pthread_mutex_lock(&h->lock);
    struct slot *s = h->reserve_head;
    int fd = -1;
    uint64_t mb = 0;
    if (s) {
      h->reserve_head = s->next_reserve;
      s->next_reserve = NULL;
      fd = s->img_fd;
      s->img_fd = -1;
      mb = s->reserve_mb;
    }
    pthread_mutex_unlock(&h->lock);
    if (!s)
      return;
    moat_error *e = NULL;
    if (fd >= 0 && moat_disk_reserve(fd, mb, &e) < 0) {
      log_warn("slot %d: %s: its disk stays sparse (overcommitted)", s->index, moat_error_msg(e));
      moat_error_free(&e);
    }
    if (fd >= 0)
      close(fd);
    pthread_mutex_lock(&h->lock);
    h->disk_pending_mb -= mb < h->disk_pending_mb ? mb : h->disk_pending_mb;
    s->reserve_mb = 0;
    pthread_mutex_unlock(&h->lock);
  }
}

int moat_linux_slot_disk(struct moat_linux *h, const char *img_path, uint64_t size_mb, uid_t owner,
                         moat_error **err) {
  if (disk_admit(h, size_mb, err) < 0)
    return -1;
  int img = -1;
  int mnt = moat_disk_create(img_path, size_mb, owner, h->disk_overcommit ? NULL : &img, err);
  if (mnt >= 0 && img >= 0 && moat_disk_reserve(img, size_mb, err) < 0) {
    close(mnt);
    mnt = -1;
  }
  if (img >= 0)
    close(img);
  disk_settle(h, size_mb);
  return mnt;
}

/* Gives the sandbox in slot s (init pid) a network slot and records it in SLOT/net for adoption. */
static int attach_net(struct moat_linux *h, struct slot *s, pid_t pid, bool fresh, moat_error **err) {
  if (!h->net)
    return 0;
  int ns = moat_net_attach(h->net, pid, fresh, slot_uid_base(s->index), err);
  if (ns < 0)
    return -1;
  s->net = ns;
  _cleanup_free_ char *path = xasprintf("%s/%d/net", h->slots_dir, s->index);
  char num[16];
  snprintf(num, sizeof(num), "%d", ns);
  return moat_net_put_file(path, num, err);
}

/* The directory holding template name's image: an org's image (moat_host_image_name) is in
 * images_dir, a recipe's in template_dir. */
static const char *image_base(const struct moat_linux *h, const char *name) {
  return moat_host_image_name(name) ? h->images_dir : h->template_dir;
}

/* Claims a uid range and records a new slot in state BUILDING for template_name and limits.
 * Returns the slot, or NULL (EAGAIN when the host is full). Each candidate index is taken in the
 * slot table under h->lock (no other thread tries it), then claimed host-wide without the lock
 * (an open per index another moatd holds, up to MOAT_MAX_RANGES of them), and given back to the
 * table when the claim fails. */
static struct slot *reserve_slot(struct moat_linux *h, const char *template_name,
                                 const struct moat_limits *limits, moat_error **err) {
  pthread_mutex_lock(&h->lock);
  if (h->live >= h->max_slots) {
    pthread_mutex_unlock(&h->lock);
    moat_error_set(err, EAGAIN, "host is full: %u sandboxes", h->max_slots);
    return NULL;
  }
  h->live++;
  pthread_mutex_unlock(&h->lock);
  struct slot *s = slot_new(-1, SLOT_BUILDING);
  snprintf(s->template_name, sizeof(s->template_name), "%s", template_name);
  s->disk_mb = limits->disk_mb;
  s->limits = *limits;
  unsigned start;
  random_bytes(&start, sizeof(start));
  start %= MOAT_MAX_RANGES;
  int r = 0;
  for (unsigned i = 0; i < MOAT_MAX_RANGES && r == 0; i++) {
    int n = (int)((start + i) % MOAT_MAX_RANGES);
    pthread_mutex_lock(&h->lock);
    bool taken = h->slots[n] != NULL;
    if (!taken) {
      s->index = n;
      h->slots[n] = s;
    }
    pthread_mutex_unlock(&h->lock);
    if (taken)
      continue;
    r = claim_range(h, n, err);
    if (r == 1)
      return s;
    pthread_mutex_lock(&h->lock);
    h->slots[n] = NULL;
    pthread_mutex_unlock(&h->lock);
  }
  pthread_mutex_lock(&h->lock);
  h->live--;
  pthread_mutex_unlock(&h->lock);
  free(s);
  if (r == 0)
    moat_error_set(err, EAGAIN, "no free uid range on this host");
  return NULL;
}

/* Builds a running shell in a freshly claimed slot. Called without h->lock. */
static int build_shell(struct moat_linux *h, const char *template_name, const struct moat_limits *limits,
                       enum slot_state final_state, struct slot **out, moat_error **err) {
  _cleanup_free_ char *rootfs = xasprintf("%s/%s/rootfs", image_base(h, template_name), template_name);
  _cleanup_free_ char *ready = xasprintf("%s/%s/ready", image_base(h, template_name), template_name);
  /* before the rootfs is opened: a rebuild in between leaves the shell marked stale, never the
   * other way round */
  struct stat ready_st;
  if (stat(ready, &ready_st) < 0)
    return moat_error_set(err, ENOENT, "template %s is not built", template_name);
  /* a shell built for a create is admitted and its disk reserved; a warm shell holds no space */
  bool admit = final_state == SLOT_ASSIGNED && !h->disk_overcommit;
  if (admit && disk_admit(h, limits->disk_mb, err) < 0)
    return moat_error_wrap(err, "build sandbox");
  struct slot *s = reserve_slot(h, template_name, limits, err);
  if (!s) {
    if (admit)
      disk_settle(h, limits->disk_mb);
    return -1;
  }
  int n = s->index;

  /* At most MAX_BUILDS shells are built at once: on a small host, twenty parallel builds each
   * forking, formatting and mounting thrash instead of finishing. */
  pthread_mutex_lock(&h->lock);
  while (h->building >= MAX_BUILDS)
    pthread_cond_wait(&h->build_slot, &h->lock);
  h->building++;
  pthread_mutex_unlock(&h->lock);
  _cleanup_free_ char *dir = slot_path(h, n);
  _cleanup_free_ char *img = xasprintf("%s/%d.img", h->disks_dir, n);
  int ret = -1;
  static const char *sub[] = {"lower", "disk", "root", MOAT_SHARE_DIR};
  _cleanup_free_ char *fs_dir = xasprintf("%s/fs", dir);
  _cleanup_free_ char *chan_dir = chan_path(h, n);
  if (mkdir(dir, 0711) < 0 && errno != EEXIST) {
    moat_error_errno(err, "mkdir %s", dir);
    goto out;
  }
  for (size_t i = 0; i < ARRAY_SIZE(sub); i++) {
    _cleanup_free_ char *p = xasprintf("%s/%s", dir, sub[i]);
    if (mkdir(p, 0755) < 0 && errno != EEXIST) {
      moat_error_errno(err, "mkdir %s", p);
      goto out;
    }
  }
  int img_fd = -1;
  int disk = h->prjquota
                 ? moat_disk_create_prjquota(fs_dir, (uint32_t)n + 1, limits->disk_mb, slot_uid_base(n), err)
                 : moat_disk_create(img, limits->disk_mb, slot_uid_base(n),
                                    h->disk_overcommit ? NULL : &img_fd, err);
  if (disk < 0)
    goto out;
  s->img_fd = img_fd; /* closed by cleanup_slot on failure */
  if (admit && img_fd >= 0) {
    if (moat_disk_reserve(img_fd, limits->disk_mb, err) < 0) {
      close(disk);
      goto out;
    }
    close(img_fd);
    s->img_fd = -1;
  }
  struct moat_shell_spec spec = {.slot = n,
                                 .uid_base = slot_uid_base(n),
                                 .slot_dir = dir,
                                 .chan_dir = chan_dir,
                                 .rootfs = rootfs,
                                 .share_fd = h->share_fd,
                                 .view_cpus = moat_view_cpus(limits),
                                 .lxcfs_dir = h->lxcfs_dir,
                                 .disk_fd = disk,
                                 .seccomp = &h->seccomp,
                                 .cgroups = h->cgroups,
                                 .limits = limits};
  struct moat_shell shell;
  if (moat_shell_create(&spec, &shell, err) < 0)
    goto out;
  s->pid = shell.pid;
  s->pidfd = shell.pidfd;
  s->template_ino = ready_st.st_ino;
  s->start_time = shell.start_time;
  s->disk_fd = shell.disk_fd;
  s->own_child = true;
  if (attach_net(h, s, shell.pid, true, err) < 0)
    goto out;
  log_debug("slot %d: shell built in %.2f ms", n, (double)shell.build_ns / 1e6);
  ret = 0;
out:
  if (admit)
    disk_settle(h, limits->disk_mb);
  pthread_mutex_lock(&h->lock);
  h->building--;
  pthread_cond_signal(&h->build_slot);
  if (ret < 0) {
    h->slots[n] = NULL;
    h->live--;
    pthread_mutex_unlock(&h->lock);
    moat_error *e2 = NULL;
    if (cleanup_slot(h, n, s, &e2) < 0) {
      log_warn("slot %d: cleanup after failed create: %s", n, moat_error_msg(e2));
      moat_error_free(&e2);
    }
    free(s);
    return moat_error_wrap(err, "build sandbox");
  }
  s->state = final_state;
  if (final_state == SLOT_POOLED)
    h->pooled++;
  pthread_mutex_unlock(&h->lock);
  *out = s;
  return 0;
}

static void fill_instance(struct moat_linux *h, struct slot *s, struct moat_instance *out) {
  memset(out, 0, sizeof(*out));
  out->slot = s->index;
  out->pid = s->pid;
  out->start_time = s->start_time;
  _cleanup_free_ char *dir = chan_path(h, s->index);
  _cleanup_free_ char *events = moat_cgroup_events_path(h->cgroups, s->index);
  moat_shell_chan_ep(&h->base.guest_channel, dir, s->pid, slot_uid_base(s->index), events, &out->guest);
}

static bool limits_equal(const struct moat_limits *a, const struct moat_limits *b) {
  return a->cpu == b->cpu && a->memory_mb == b->memory_mb && a->pids == b->pids;
}

static int linux_destroy(struct moat_host *base, int slot, moat_error **err);

/* The inode of TEMPLATE/ready now (0: not built). */
static ino_t template_ino(struct moat_linux *h, const char *name) {
  _cleanup_free_ char *ready = xasprintf("%s/%s/ready", image_base(h, name), name);
  struct stat st;
  return stat(ready, &st) == 0 ? st.st_ino : 0;
}

static int linux_create(struct moat_host *base, const char *template_name, const struct moat_limits *limits,
                        struct moat_instance *out, moat_error **err) {
  struct moat_linux *h = moat_linux_of(base);
  uint64_t t0 = now_ns();
  struct slot *s = NULL;
  ino_t current =
      h->pool_template && strcmp(template_name, h->pool_template) == 0 ? template_ino(h, template_name) : 0;
  pthread_mutex_lock(&h->lock);
  if (h->pool_template && strcmp(template_name, h->pool_template) == 0 && limits->disk_mb == POOL_DISK_MB) {
    for (int i = 0; i < MOAT_MAX_RANGES && h->pooled > 0; i++) {
      struct slot *c = h->slots[i];
      if (c && c->state == SLOT_POOLED) {
        s = c;
        s->state = SLOT_ASSIGNED;
        h->pooled--;
        break;
      }
    }
  }
  pthread_cond_broadcast(&h->wake); /* the filler replaces what we took */
  pthread_mutex_unlock(&h->lock);
  if (s) {
    /* A pooled shell may have died (OOM, killed by hand) while it waited, or be of an image its
     * template has since replaced: then build one. */
    struct pollfd p = {.fd = s->pidfd, .events = POLLIN};
    if (poll(&p, 1, 0) != 0 || s->template_ino != current) {
      if (s->template_ino != current)
        log_info("pool: slot %d holds the image template %s replaced; building a new shell", s->index,
                 template_name);
      linux_destroy(&h->base, s->index, NULL);
      s = NULL;
    }
  }
  if (s && !h->disk_overcommit) {
    /* admitted now; its image is allocated by the worker (pending until then) */
    if (disk_admit(h, s->disk_mb, err) < 0) {
      pthread_mutex_lock(&h->lock);
      s->state = SLOT_POOLED; /* back to the pool: it is fine, the data dir is full */
      h->pooled++;
      pthread_mutex_unlock(&h->lock);
      return moat_error_wrap(err, "create sandbox");
    }
    pthread_mutex_lock(&h->lock);
    if (s->img_fd >= 0) {
      s->reserve_mb = s->disk_mb;
      s->next_reserve = h->reserve_head;
      h->reserve_head = s;
      pthread_cond_broadcast(&h->wake);
    } else {
      h->disk_pending_mb -= s->disk_mb < h->disk_pending_mb ? s->disk_mb : h->disk_pending_mb;
    }
    pthread_mutex_unlock(&h->lock);
  }
  if (s && !limits_equal(&s->limits, limits)) {
    _cleanup_free_ char *dir = slot_path(h, s->index);
    unsigned cpus = moat_view_cpus(limits);
    if (moat_cgroup_set_limits(h->cgroups, s->index, limits, err) < 0 ||
        (cpus != moat_view_cpus(&s->limits) && moat_shell_view_rebind(s->pid, h->share_fd, cpus, err) < 0)) {
      linux_destroy(&h->base, s->index, NULL);
      return moat_error_wrap(err, "create sandbox");
    }
    s->limits = *limits;
  }
  bool from_pool = s != NULL;
  if (!s && build_shell(h, template_name, limits, SLOT_ASSIGNED, &s, err) < 0)
    return -1;
  moat_error *ce = NULL;
  if (moat_cpus_apply(s->pid, s->index, limits->cpu, &ce) < 0) { /* only what nproc says: go on */
    log_warn("slot %d: %s", s->index, moat_error_msg(ce));
    moat_error_free(&ce);
  }
  fill_instance(h, s, out);
  out->from_pool = from_pool;
  out->ready_ns = now_ns() - t0;
  return 0;
}

/* Detaches slot n for teardown by the worker thread. */
static int linux_destroy(struct moat_host *base, int slot, moat_error **err) {
  struct moat_linux *h = moat_linux_of(base);
  if (slot < 0 || slot >= MOAT_MAX_RANGES)
    return moat_error_set(err, EINVAL, "slot %d out of range", slot);
  pthread_mutex_lock(&h->lock);
  struct slot *s = h->slots[slot];
  if (!s || s->state == SLOT_TEARDOWN || s->state == SLOT_BUILDING) {
    pthread_mutex_unlock(&h->lock);
    return 0;
  }
  if (s->state == SLOT_POOLED)
    h->pooled--;
  s->state = SLOT_TEARDOWN;
  s->next_teardown = h->teardown_head;
  h->teardown_head = s;
  pthread_cond_broadcast(&h->wake);
  pthread_mutex_unlock(&h->lock);
  /* Kill now, on the request path: a killed sandbox must stop running at once. The slower
   * removal of cgroups and dirs happens in the teardown worker. */
  if (moat_cgroup_kill(h->cgroups, slot, 0 /* do not wait */, NULL) < 0) {
    /* ETIMEDOUT with 0 ms is expected: processes are dying. */
  }
  return 0;
}

/* Tears down the first queued slot. False when none was queued. */
static bool teardown_one(struct moat_linux *h) {
  pthread_mutex_lock(&h->lock);
  struct slot *s = h->teardown_head;
  if (s) {
    h->teardown_head = s->next_teardown;
    reserve_unqueue_locked(h, s);
  }
  pthread_mutex_unlock(&h->lock);
  if (!s)
    return false;
  moat_error *e = NULL;
  if (cleanup_slot(h, s->index, s, &e) < 0) {
    log_warn("slot %d: teardown: %s (reconciled at next start)", s->index, moat_error_msg(e));
    moat_error_free(&e);
  }
  pthread_mutex_lock(&h->lock);
  h->slots[s->index] = NULL;
  h->live--;
  pthread_mutex_unlock(&h->lock);
  free(s);
  return true;
}

static void run_teardowns(struct moat_linux *h) {
  while (teardown_one(h))
    ;
}

static bool template_ready(struct moat_linux *h, const char *name) { return template_ino(h, name) != 0; }

/* Runs queued reservations and teardowns off the request path. */
static void *teardown_main(void *arg) {
  struct moat_linux *h = arg;
  pthread_mutex_lock(&h->lock);
  while (!h->stopping) {
    if (h->reserve_head) {
      pthread_mutex_unlock(&h->lock);
      run_reserves(h);
      pthread_mutex_lock(&h->lock);
      continue;
    }
    if (h->teardown_head) { /* one at a time: a reservation queued meanwhile goes first */
      pthread_mutex_unlock(&h->lock);
      teardown_one(h);
      pthread_mutex_lock(&h->lock);
      continue;
    }
    pthread_cond_wait(&h->wake, &h->lock);
  }
  pthread_mutex_unlock(&h->lock);
  return NULL;
}

/* Keeps pool_size warm shells of pool_template. */
static void *filler_main(void *arg) {
  struct moat_linux *h = arg;
  unsigned failures = 0;
  pthread_mutex_lock(&h->lock);
  while (!h->stopping) {
    if (h->pool_template && h->pooled > 0) {
      /* shells of an image the template has since replaced go, and new ones take their place */
      pthread_mutex_unlock(&h->lock);
      ino_t current = template_ino(h, h->pool_template);
      pthread_mutex_lock(&h->lock);
      for (int i = 0; i < MOAT_MAX_RANGES && h->pooled > 0; i++) {
        struct slot *c = h->slots[i];
        if (!c || c->state != SLOT_POOLED || c->template_ino == current)
          continue;
        c->state = SLOT_ASSIGNED;
        h->pooled--;
        pthread_mutex_unlock(&h->lock);
        log_info("pool: slot %d holds the image template %s replaced; dropped", c->index, h->pool_template);
        linux_destroy(&h->base, c->index, NULL);
        pthread_mutex_lock(&h->lock);
      }
    }
    bool want = h->pool_template && h->pooled < h->pool_size && h->live < h->max_slots;
    if (want && template_ready(h, h->pool_template)) {
      pthread_mutex_unlock(&h->lock);
      struct slot *s = NULL;
      moat_error *e = NULL;
      if (build_shell(h, h->pool_template, &default_limits, SLOT_POOLED, &s, &e) < 0) {
        if (failures++ < 3 || failures % 100 == 0)
          log_warn("pool: %s", moat_error_msg(e));
        moat_error_free(&e);
        struct timespec ts = {.tv_sec = failures < 10 ? 0 : 1, .tv_nsec = failures < 10 ? 200000000 : 0};
        nanosleep(&ts, NULL);
      } else {
        failures = 0;
      }
      pthread_mutex_lock(&h->lock);
      continue;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 1; /* re-check template readiness now and then */
    pthread_cond_timedwait(&h->wake, &h->lock, &ts);
  }
  pthread_mutex_unlock(&h->lock);
  return NULL;
}

static void linux_free(struct moat_linux *h);

static int linux_init(struct moat_host **out, const struct moat_host_config *cfg, moat_error **err) {
  struct moat_linux *h = xcalloc(1, sizeof(*h));
  h->share_fd = -1;
  h->base.guest_channel.ops = &moat_linux_guest_channel_ops;
  moat_guest_channel_configure(&h->base.guest_channel, 0, NULL, NULL);
  pthread_mutex_init(&h->lock, NULL);
  pthread_cond_init(&h->wake, NULL);
  pthread_cond_init(&h->build_slot, NULL);
  pthread_mutex_init(&h->restore_lock, NULL);
  pthread_cond_init(&h->restore_turn, NULL);
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  h->restore_max = cpus < 2 ? 2 : (int)cpus;
  h->slots = xcalloc(MOAT_MAX_RANGES, sizeof(struct slot *));
  char *real = realpath(cfg->data_dir, NULL);
  h->data_dir = real ? real : xstrdup(cfg->data_dir);
  h->slots_dir = xasprintf("%s/host/slots", h->data_dir);
  h->disks_dir = xasprintf("%s/host/disks", h->data_dir);
  h->template_dir = xstrdup(cfg->template_dir);
  h->images_dir = xstrdup(cfg->images_dir ? cfg->images_dir : cfg->template_dir);
  h->guest_path = xstrdup(cfg->guest_path);
  h->pool_template = cfg->pool_template ? xstrdup(cfg->pool_template) : NULL;
  h->pool_size = cfg->pool_size;
  h->disk_overcommit = cfg->disk_overcommit;
  if (cfg->lxcfs_dir && strcmp(cfg->lxcfs_dir, MOAT_HOST_LXCFS_AUTO) == 0) {
    _cleanup_free_ char *why = NULL;
    h->lxcfs_dir = moat_lxcfs_auto(&why);
    if (h->lxcfs_dir)
      log_info("lxcfs at %s: sandboxes see their own /proc/meminfo, stat, uptime and loadavg", h->lxcfs_dir);
    else
      log_warn("no lxcfs (%s): sandboxes see the machine's /proc/meminfo, stat, uptime and loadavg", why);
  } else {
    h->lxcfs_dir = cfg->lxcfs_dir && *cfg->lxcfs_dir ? xstrdup(cfg->lxcfs_dir) : NULL;
  }
  h->max_slots = cfg->max_slots ? cfg->max_slots : 16384;
  instance_name(h->data_dir, h->instance);
  _cleanup_free_ char *hostdir = xasprintf("%s/host", h->data_dir);
  int ret = -1;
  if (geteuid() != 0) {
    moat_error_set(err, EPERM, "the linux driver needs root");
    goto out;
  }
  {
    /* every sandbox's user namespace takes moatd's soft limits as its ceiling (userns.h) */
    moat_error *e = NULL;
    if (moat_userns_limits_init(&e) < 0) {
      log_warn("per-sandbox limits: %s", moat_error_msg(e));
      moat_error_free(&e);
    }
  }
  if (access(h->guest_path, X_OK) < 0) {
    moat_error_errno(err, "guest binary %s", h->guest_path);
    goto out;
  }
  if (h->lxcfs_dir && moat_view_lxcfs_check(h->lxcfs_dir, err) < 0)
    goto out;
  if ((h->share_fd = moat_share_make(h->guest_path, err)) < 0)
    goto out;
  if (mkdir_p(h->slots_dir, 0711, err) < 0 || mkdir_p(h->disks_dir, 0700, err) < 0 ||
      mkdir_p(RANGES_DIR, 0755, err) < 0 || !(h->chan_base = moat_share_chan_base(h->instance, err)))
    goto out;
  chmod(h->slots_dir, 0711);
  chmod(hostdir, 0711);
  h->criu_net_script = xasprintf("%s/criu-net.sh", hostdir);
  if (moat_checkpoint_write_net_script(h->criu_net_script, err) < 0)
    goto out;
  /* The sandbox's init enters its slot dir as the host's root, then drops to the range: the
   * data dir itself may stay 0700. */
  if (moat_cgroups_open(&h->cgroups, h->instance, err) < 0 || moat_seccomp_build(&h->seccomp, err) < 0)
    goto out;
  {
    _cleanup_free_ char *net_state = xasprintf("%s/host/net", h->data_dir);
    if (moat_net_open(&h->net, cfg->net, h->instance, net_state, err) < 0)
      goto out;
  }
  {
    _cleanup_free_ char *vdir = xasprintf("%s/host/volumes", h->data_dir);
    h->volumes = moat_volumes_open(vdir, h->disk_overcommit, err);
    if (!h->volumes)
      goto out;
  }
  h->prjquota = moat_disk_prjquota_available(h->slots_dir);
  log_info("writable layers: %s, %s",
           h->prjquota ? "directories under XFS project quotas" : "ext4 images on loop devices",
           h->disk_overcommit ? "overcommitted (sparse)"
                              : "backed by the data dir (admitted by free space, allocated)");
  *out = &h->base;
  return 0;
out:
  moat_error_wrap(err, "init linux driver");
  linux_free(h);
  return ret;
}

/* Starts the pool filler and the teardown worker, once. 0, or -1 when either could not start
 * (then neither runs). */
static int start_threads(struct moat_linux *h, moat_error **err) {
  if (h->threads_started)
    return 0;
  int e = pthread_create(&h->filler, NULL, filler_main, h);
  if (e != 0) {
    errno = e;
    return moat_error_errno(err, "start the pool filler thread");
  }
  e = pthread_create(&h->reaper, NULL, teardown_main, h);
  if (e != 0) {
    pthread_mutex_lock(&h->lock);
    h->stopping = true;
    pthread_cond_broadcast(&h->wake);
    pthread_mutex_unlock(&h->lock);
    pthread_join(h->filler, NULL);
    h->stopping = false;
    errno = e;
    return moat_error_errno(err, "start the teardown thread");
  }
  h->threads_started = true;
  return 0;
}

/* Stops the threads, tears down warm shells, frees h (running sandboxes stay: driver.h). */
static void linux_free(struct moat_linux *h) {
  pthread_mutex_lock(&h->lock);
  h->stopping = true;
  pthread_cond_broadcast(&h->wake);
  pthread_mutex_unlock(&h->lock);
  if (h->threads_started) {
    pthread_join(h->filler, NULL);
    pthread_join(h->reaper, NULL);
  }
  /* Warm shells nobody uses go; assigned sandboxes stay for the next moatd to adopt. */
  pthread_mutex_lock(&h->lock);
  for (int i = 0; i < MOAT_MAX_RANGES && h->slots; i++) {
    struct slot *s = h->slots[i];
    if (s && s->state == SLOT_POOLED) {
      s->state = SLOT_TEARDOWN;
      s->next_teardown = h->teardown_head;
      h->teardown_head = s;
    }
  }
  pthread_mutex_unlock(&h->lock);
  if (h->cgroups)
    run_teardowns(h);
  for (int i = 0; i < MOAT_MAX_RANGES && h->slots; i++) {
    if (h->slots[i]) {
      if (h->slots[i]->pidfd >= 0)
        close(h->slots[i]->pidfd);
      if (h->slots[i]->disk_fd >= 0)
        close(h->slots[i]->disk_fd);
      if (h->slots[i]->img_fd >= 0)
        close(h->slots[i]->img_fd);
      free(h->slots[i]);
    }
  }
  free(h->slots);
  moat_net_close(h->net);
  moat_volumes_free(h->volumes);
  moat_cgroups_close(h->cgroups);
  free(h->seccomp.filter);
  free(h->data_dir);
  free(h->slots_dir);
  free(h->disks_dir);
  free(h->criu_net_script);
  free(h->chan_base);
  free(h->template_dir);
  free(h->images_dir);
  free(h->guest_path);
  if (h->share_fd >= 0)
    close(h->share_fd);
  free(h->lxcfs_dir);
  free(h->pool_template);
  pthread_mutex_destroy(&h->lock);
  pthread_cond_destroy(&h->wake);
  pthread_cond_destroy(&h->build_slot);
  pthread_mutex_destroy(&h->restore_lock);
  pthread_cond_destroy(&h->restore_turn);
  free(h);
}

static int linux_adopt(struct moat_host *base, int slot, pid_t pid, uint64_t start_time,
                       struct moat_instance *out, moat_error **err) {
  struct moat_linux *h = moat_linux_of(base);
  if (slot < 0 || slot >= MOAT_MAX_RANGES)
    return moat_error_set(err, EINVAL, "slot %d out of range", slot);
  pthread_mutex_lock(&h->lock);
  if (h->slots[slot]) {
    pthread_mutex_unlock(&h->lock);
    return moat_error_set(err, EEXIST, "slot %d is already in use", slot);
  }
  struct slot *s = slot_new(slot, SLOT_ASSIGNED);
  h->slots[slot] = s;
  h->live++;
  pthread_mutex_unlock(&h->lock);
  bool alive = pid > 0 && start_time != 0 && moat_proc_start_time(pid) == start_time &&
               range_is_ours(h, slot) && moat_cgroup_populated(h->cgroups, slot);
  if (alive) {
    s->pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    alive = s->pidfd >= 0 && moat_proc_start_time(pid) == start_time; /* pid not reused meanwhile */
  }
  if (!alive) {
    moat_error *e = NULL;
    if (cleanup_slot(h, slot, s, &e) < 0) {
      log_warn("slot %d: cleanup of a dead sandbox: %s", slot, moat_error_msg(e));
      moat_error_free(&e);
    }
    pthread_mutex_lock(&h->lock);
    h->slots[slot] = NULL;
    h->live--;
    pthread_mutex_unlock(&h->lock);
    free(s);
    return 0;
  }
  s->pid = pid;
  s->start_time = start_time;
  s->own_child = false;
  if (h->net) {
    _cleanup_free_ char *path = xasprintf("%s/%d/net", h->slots_dir, slot);
    _cleanup_free_ char *num = NULL;
    uint64_t ns;
    moat_error *e = NULL;
    if (read_file(path, &num, NULL, NULL) == 0 && parse_u64(num, &ns) == 0) {
      if (moat_net_adopt(h->net, (int)ns, &e) == 0)
        s->net = (int)ns;
      else
        log_warn("slot %d: network slot %d not adopted: %s", slot, (int)ns, moat_error_msg(e));
      moat_error_free(&e);
    }
  }
  {
    _cleanup_free_ char *dir = slot_path(h, slot);
    moat_checkpoint_recover(h->cgroups, slot, dir); /* a checkpoint cut short by our death */
  }
  fill_instance(h, s, out);
  return 1;
}

static int linux_reconcile(struct moat_host *base, moat_error **err) {
  struct moat_linux *h = moat_linux_of(base);
  int cleaned = 0;
  _cleanup_free_ int *cg_slots = NULL;
  size_t n_cg = 0;
  moat_cgroup_list_slots(h->cgroups, &cg_slots, &n_cg, NULL);
  /* Candidates: cgroup slots, slot dirs, and range claims naming our data dir. */
  size_t cap = n_cg + 64, n = 0;
  int *cand = xcalloc(cap, sizeof(int));
  for (size_t i = 0; i < n_cg; i++)
    cand[n++] = cg_slots[i];
  const char *dirs[] = {h->slots_dir, RANGES_DIR, h->chan_base};
  for (size_t d = 0; d < ARRAY_SIZE(dirs); d++) {
    DIR *dp = opendir(dirs[d]);
    if (!dp)
      continue;
    struct dirent *de;
    while ((de = readdir(dp)) != NULL) {
      uint64_t v;
      if (parse_u64(de->d_name, &v) < 0 || v >= MOAT_MAX_RANGES)
        continue;
      if (d == 1 && !range_is_ours(h, (int)v))
        continue;
      if (n == cap)
        cand = xrealloc(cand, (cap *= 2) * sizeof(int));
      cand[n++] = (int)v;
    }
    closedir(dp);
  }
  for (size_t i = 0; i < n; i++) {
    int slot = cand[i];
    pthread_mutex_lock(&h->lock);
    bool known = h->slots[slot] != NULL;
    pthread_mutex_unlock(&h->lock);
    if (known)
      continue;
    bool dup = false;
    for (size_t j = 0; j < i; j++)
      dup |= cand[j] == slot;
    if (dup)
      continue;
    moat_error *e = NULL;
    if (cleanup_slot(h, slot, NULL, &e) < 0) {
      log_warn("reconcile: slot %d: %s", slot, moat_error_msg(e));
      moat_error_free(&e);
      continue;
    }
    cleaned++;
  }
  free(cand);
  /* Claims naming a data dir that no longer exists belong to a moatd nobody can restart (its
   * data dir was removed after a crash): free their uid ranges for everyone. */
  DIR *rp = opendir(RANGES_DIR);
  if (rp) {
    struct dirent *de;
    while ((de = readdir(rp)) != NULL) {
      uint64_t v;
      if (parse_u64(de->d_name, &v) < 0 || v >= MOAT_MAX_RANGES)
        continue;
      _cleanup_free_ char *path = xasprintf(RANGES_DIR "/%s", de->d_name);
      _cleanup_free_ char *owner = NULL;
      if (read_file(path, &owner, NULL, NULL) == 0 && owner[0] == '/' && access(owner, F_OK) < 0 &&
          errno == ENOENT)
        unlink(path);
    }
    closedir(rp);
  }
  /* Image files are unlinked once attached; any left are from a crash mid-create. */
  DIR *dp = opendir(h->disks_dir);
  if (dp) {
    struct dirent *de;
    while ((de = readdir(dp)) != NULL)
      if (de->d_name[0] != '.' && strncmp(de->d_name, "golden-", 7) != 0)
        unlinkat(dirfd(dp), de->d_name, 0);
    closedir(dp);
  }
  if (cleaned)
    log_info("reconcile: removed the leftovers of %d sandbox(es)", cleaned);
  int ret = cleaned;
  if (h->net && moat_net_reconcile(h->net, err) < 0)
    ret = moat_error_wrap(err, "reconcile network");
  if (start_threads(h, err) < 0) /* also after a network error: destroyed slots must go */
    ret = moat_error_wrap(err, "host");
  return ret;
}

static bool linux_alive(struct moat_host *base, int slot) {
  struct moat_linux *h = moat_linux_of(base);
  if (slot < 0 || slot >= MOAT_MAX_RANGES)
    return false;
  pthread_mutex_lock(&h->lock);
  struct slot *s = h->slots[slot];
  int fd = s && s->state == SLOT_ASSIGNED ? s->pidfd : -1;
  bool alive = false;
  if (fd >= 0) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    alive = poll(&p, 1, 0) == 0;
  }
  pthread_mutex_unlock(&h->lock);
  return alive;
}

/* A number in /proc/sys (its first field), or 0 when unreadable. */
static uint64_t proc_sys_u64(const char *path) {
  _cleanup_free_ char *s = NULL;
  uint64_t v;
  if (read_file(path, &s, NULL, NULL) < 0)
    return 0;
  s[strcspn(s, " \t\n")] = '\0';
  return parse_u64(s, &v) == 0 ? v : 0;
}

/* MemAvailable of /proc/meminfo in MiB, or 0. */
static uint64_t meminfo_available_mb(void) {
  _cleanup_fclose_ FILE *f = fopen("/proc/meminfo", "re");
  char line[256];
  unsigned long long kb;
  while (f && fgets(line, sizeof(line), f))
    if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
      return kb / 1024;
  return 0;
}

static void linux_capacity(struct moat_host *base, struct moat_host_capacity *out) {
  struct moat_linux *h = moat_linux_of(base);
  long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGE_SIZE);
  if (pages > 0 && size > 0)
    out->memory_mb = (uint64_t)pages * (uint64_t)size / (1024 * 1024);
  struct statvfs sv;
  if (statvfs(h->data_dir, &sv) == 0) {
    out->disk_mb = (uint64_t)sv.f_blocks * (uint64_t)sv.f_frsize / (1024 * 1024);
    out->disk_free_mb = (uint64_t)sv.f_bavail * (uint64_t)sv.f_frsize / (1024 * 1024);
  }
  out->pid_max = proc_sys_u64("/proc/sys/kernel/pid_max");
  out->threads_max = proc_sys_u64("/proc/sys/kernel/threads-max");
  cpu_set_t cpus;
  if (sched_getaffinity(0, sizeof(cpus), &cpus) == 0)
    out->cpus = (unsigned)CPU_COUNT(&cpus);
  if (getloadavg(out->load, 3) != 3)
    out->load[0] = out->load[1] = out->load[2] = 0;
  struct sysinfo si;
  if (sysinfo(&si) == 0)
    out->uptime_s = (uint64_t)si.uptime;
  out->memory_available_mb = meminfo_available_mb();
}

static int linux_usage(struct moat_host *base, int slot, struct moat_usage *out, moat_error **err) {
  struct moat_linux *h = moat_linux_of(base);
  return moat_cgroup_usage(h->cgroups, slot, out, err);
}

static int linux_oom_kills(struct moat_host *base, int slot, uint64_t *out, moat_error **err) {
  struct moat_linux *h = moat_linux_of(base);
  return moat_cgroup_oom_kills(h->cgroups, slot, out, err);
}

/* ---- reaching into a running sandbox: its root's file system, its network namespace ---- */

/* The init of the running sandbox in slot: its pid and an owned dup of its pidfd, to check once
 * done with the pid that it still named that init (init_lived). 0, or -1 (ENOENT). */
static int slot_init(struct moat_linux *h, int slot, pid_t *pid, int *pidfd, moat_error **err) {
  *pidfd = -1;
  if (slot >= 0 && slot < MOAT_MAX_RANGES) {
    pthread_mutex_lock(&h->lock);
    struct slot *s = h->slots[slot];
    if (s && s->state == SLOT_ASSIGNED && s->pid > 0 && s->pidfd >= 0) {
      *pid = s->pid;
      *pidfd = fcntl(s->pidfd, F_DUPFD_CLOEXEC, 3);
    }
    pthread_mutex_unlock(&h->lock);
  }
  return *pidfd >= 0 ? 0 : moat_error_set(err, ENOENT, "slot %d holds no running sandbox", slot);
}

/* True when the init of pidfd has not exited yet: then its pid named it all along since
 * slot_init (a pid is reused only once its process is gone). */
static bool init_lived(int pidfd) {
  struct pollfd p = {.fd = pidfd, .events = POLLIN};
  return poll(&p, 1, 0) == 0;
}

/* The sandbox's root is an overlay whose statfs is its writable layer's (a filesystem of
 * limits.disk_mb). A frozen sandbox's mount namespace stays readable. */
static int linux_disk_usage(struct moat_host *base, int slot, struct moat_disk_usage *out, moat_error **err) {
  pid_t pid;
  _cleanup_close_ int pidfd = -1;
  if (slot_init(moat_linux_of(base), slot, &pid, &pidfd, err) < 0)
    return -1;
  char path[64];
  struct statvfs sv;
  snprintf(path, sizeof(path), "/proc/%d/root/", (int)pid);
  if (statvfs(path, &sv) < 0)
    return moat_error_errno(err, "statvfs %s", path);
  if (!init_lived(pidfd))
    return moat_error_set(err, ENOENT, "the sandbox in slot %d has exited", slot);
  if (sv.f_blocks < sv.f_bfree)
    return moat_error_set(err, EIO, "statvfs %s: more blocks free than there are", path);
  out->total_bytes = (uint64_t)sv.f_blocks * sv.f_frsize;
  out->used_bytes = (uint64_t)(sv.f_blocks - sv.f_bfree) * sv.f_frsize;
  return 0;
}

static int linux_netns(struct moat_host *base, int slot, moat_error **err) {
  pid_t pid;
  _cleanup_close_ int pidfd = -1;
  if (slot_init(moat_linux_of(base), slot, &pid, &pidfd, err) < 0)
    return -1;
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/ns/net", (int)pid);
  _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return moat_error_errno(err, "open %s", path);
  if (!init_lived(pidfd))
    return moat_error_set(err, ENOENT, "the sandbox in slot %d has exited", slot);
  return steal_fd(&fd);
}

static int linux_port_connect(struct moat_host *base, int slot, unsigned port, int timeout_ms,
                              moat_error **err) {
  _cleanup_close_ int ns = linux_netns(base, slot, err);
  if (ns < 0)
    return -1;
  return moat_net_connect_port(ns, port, timeout_ms, err);
}

/* ---- pause / resume: the slot's v2 cgroup.freeze ---- */

#define FREEZE_TIMEOUT_MS 5000

static int freeze_slot(struct moat_linux *h, int slot, bool frozen, moat_error **err) {
  if (slot < 0 || slot >= MOAT_MAX_RANGES)
    return moat_error_set(err, EINVAL, "slot %d out of range", slot);
  pthread_mutex_lock(&h->lock);
  bool assigned = h->slots[slot] && h->slots[slot]->state == SLOT_ASSIGNED;
  pthread_mutex_unlock(&h->lock);
  if (!assigned)
    return moat_error_set(err, ENOENT, "slot %d holds no sandbox", slot);
  return moat_cgroup_freeze(h->cgroups, slot, frozen, FREEZE_TIMEOUT_MS, err);
}

static int linux_pause(struct moat_host *h, int slot, moat_error **err) {
  return freeze_slot(moat_linux_of(h), slot, true, err);
}

static int linux_resume(struct moat_host *base, int slot, moat_error **err) {
  struct moat_linux *h = moat_linux_of(base);
  return freeze_slot(h, slot, false, err);
}

/* ---- slot internals for checkpoint.c (linux_internal.h) ---- */

int moat_linux_slot_view(struct moat_linux *h, int slot, struct moat_slot_view *out, moat_error **err) {
  if (slot < 0 || slot >= MOAT_MAX_RANGES)
    return moat_error_set(err, EINVAL, "slot %d out of range", slot);
  memset(out, 0, sizeof(*out));
  out->disk_fd = -1;
  pthread_mutex_lock(&h->lock);
  struct slot *s = h->slots[slot];
  if (!s || s->state != SLOT_ASSIGNED) {
    pthread_mutex_unlock(&h->lock);
    return moat_error_set(err, ENOENT, "slot %d holds no sandbox", slot);
  }
  out->pid = s->pid;
  out->uid_base = slot_uid_base(slot);
  out->disk_fd = s->disk_fd >= 0 ? fcntl(s->disk_fd, F_DUPFD_CLOEXEC, 3) : -1;
  out->limits = s->limits;
  snprintf(out->template_name, sizeof(out->template_name), "%s", s->template_name);
  pthread_mutex_unlock(&h->lock);
  out->slot_dir = slot_path(h, slot);
  out->chan_dir = chan_path(h, slot);
  out->cgroups = h->cgroups;
  out->disks_dir = h->disks_dir;
  return 0;
}

int moat_linux_slot_reserve(struct moat_linux *h, const char *template_name, const struct moat_limits *limits,
                            struct moat_slot_view *out, moat_error **err) {
  struct slot *s = reserve_slot(h, template_name, limits, err);
  if (!s)
    return -1;
  int n = s->index;
  memset(out, 0, sizeof(*out));
  out->disk_fd = -1;
  out->uid_base = slot_uid_base(n);
  out->slot_dir = slot_path(h, n);
  out->chan_dir = chan_path(h, n);
  out->cgroups = h->cgroups;
  out->limits = *limits;
  snprintf(out->template_name, sizeof(out->template_name), "%s", template_name);
  out->disks_dir = h->disks_dir;
  out->criu_net_script = h->criu_net_script;
  out->template_dir = image_base(h, template_name);
  out->share_fd = h->share_fd;
  out->lxcfs_dir = h->lxcfs_dir;
  return n;
}

/* The slot reserved (moat_linux_slot_reserve) and still building, or NULL (h->lock held). */
static struct slot *reserved_locked(struct moat_linux *h, int slot) {
  struct slot *s = slot >= 0 && slot < MOAT_MAX_RANGES ? h->slots[slot] : NULL;
  return s && s->state == SLOT_BUILDING && s->pidfd < 0 ? s : NULL;
}

int moat_linux_slot_commit(struct moat_linux *h, int slot, pid_t pid, int pidfd, uint64_t start_time,
                           int disk_fd, moat_error **err) {
  pthread_mutex_lock(&h->lock);
  struct slot *s = reserved_locked(h, slot);
  if (s) {
    s->pid = pid;
    s->pidfd = pidfd;
    s->start_time = start_time;
    s->disk_fd = disk_fd;
    s->own_child = false; /* CRIU's restored init is not our child */
  }
  pthread_mutex_unlock(&h->lock);
  if (!s) {
    if (pidfd >= 0)
      close(pidfd);
    if (disk_fd >= 0)
      close(disk_fd);
    return moat_error_set(err, EINVAL, "slot %d is not a slot reserved for a restore", slot);
  }
  /* A fresh network slot for the restored namespace (the checkpoint's was not kept), while the
   * slot is still building: nothing else acts on it meanwhile. */
  moat_error *e = NULL;
  if (attach_net(h, s, pid, false, &e) < 0) {
    log_warn("slot %d: restored sandbox has no network: %s", slot, moat_error_msg(e));
    moat_error_free(&e);
  }
  pthread_mutex_lock(&h->lock);
  s->state = SLOT_ASSIGNED;
  pthread_mutex_unlock(&h->lock);
  return 0;
}

void moat_linux_slot_abort(struct moat_linux *h, int slot) {
  pthread_mutex_lock(&h->lock);
  struct slot *s = reserved_locked(h, slot);
  if (s) {
    h->slots[slot] = NULL;
    h->live--;
  }
  pthread_mutex_unlock(&h->lock);
  if (!s) {
    log_error("slot %d: abort of a restore into a slot not reserved for one: left alone", slot);
    return;
  }
  moat_error *e = NULL;
  if (cleanup_slot(h, slot, s, &e) < 0) {
    log_warn("slot %d: cleanup after a failed restore: %s", slot, moat_error_msg(e));
    moat_error_free(&e);
  }
  free(s);
}

void moat_linux_restore_begin(struct moat_linux *h) {
  pthread_mutex_lock(&h->restore_lock);
  while (h->restoring >= h->restore_max)
    pthread_cond_wait(&h->restore_turn, &h->restore_lock);
  h->restoring++;
  pthread_mutex_unlock(&h->restore_lock);
}

void moat_linux_restore_end(struct moat_linux *h) {
  pthread_mutex_lock(&h->restore_lock);
  h->restoring--;
  pthread_cond_signal(&h->restore_turn);
  pthread_mutex_unlock(&h->restore_lock);
}

static struct moat_net *linux_net(struct moat_host *h) { return moat_linux_of(h)->net; }

struct moat_volumes *moat_linux_volumes(struct moat_linux *h) {
  return h->volumes;
}

static int linux_net_slot(struct moat_host *base, int slot) {
  struct moat_linux *h = moat_linux_of(base);
  if (slot < 0 || slot >= MOAT_MAX_RANGES)
    return -1;
  pthread_mutex_lock(&h->lock);
  int ns = h->slots[slot] ? h->slots[slot]->net : -1;
  pthread_mutex_unlock(&h->lock);
  return ns;
}

void moat_linux_fill_instance(struct moat_linux *h, int slot, struct moat_instance *out) {
  pthread_mutex_lock(&h->lock);
  struct slot *s = h->slots[slot];
  if (s)
    fill_instance(h, s, out);
  pthread_mutex_unlock(&h->lock);
}

static void linux_shutdown(struct moat_host *h) { linux_free(moat_linux_of(h)); }

const struct moat_driver_ops moat_linux_driver = {
    .name = "linux",
    .init = linux_init,
    .shutdown = linux_shutdown,
    .create = linux_create,
    .destroy = linux_destroy,
    .adopt = linux_adopt,
    .reconcile = linux_reconcile,
    .alive = linux_alive,
    .capacity = linux_capacity,
    .usage = linux_usage,
    .oom_kills = linux_oom_kills,
    .disk_usage = linux_disk_usage,
    .port_connect = linux_port_connect,
    .pause = linux_pause,
    .resume = linux_resume,
    .checkpoint = moat_linux_checkpoint,
    .restore = moat_linux_restore,
    .checkpoint_volumes = moat_linux_checkpoint_volumes,
    .checkpoint_status = moat_linux_checkpoint_status,
    .can_checkpoint = moat_linux_can_checkpoint,
    .guest_sessions = moat_linux_guest_sessions,
    .net = linux_net,
    .net_slot = linux_net_slot,
    .volume_create = moat_linux_volume_create,
    .volume_copy = moat_linux_volume_copy,
    .volume_remove = moat_linux_volume_remove,
    .volume_root = moat_linux_volume_root,
    .volume_attach = moat_linux_volume_attach,
    .volume_usage = moat_linux_volume_usage,
    .volume_gc = moat_linux_volume_gc,
    .export_layer = moat_linux_export_layer,
};

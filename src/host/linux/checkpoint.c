/* checkpoint.c -- checkpoint and restore of a running sandbox with CRIU
 *
 * A checkpoint dir holds:
 *   images/          CRIU's images of the sandbox's process tree (dump.log beside them), 0644:
 *                    restored tasks open some of them from inside their user namespace
 *   upper/           a copy of the overlay upper dir (the writable layer), owners as on the host
 *   moat-checkpoint  "key value" lines (uid_base, template, sizes), written last: a dir without
 *                    it is incomplete
 *
 * Checkpoint: freeze the slot's v2 cgroup at a moment when no moatd connection to the guest is
 * open (freeze_quiet), copy the upper dir, let CRIU dump the frozen tree (--freeze-cgroup: it
 * finds the tasks frozen and leaves them so), thaw (a hibernate's stay frozen: see driver.h). The
 * guest's listener is a unix socket of the tree, bound in the host's SLOT/chan, which the sandbox
 * sees as the external bind mount /run/moat/.sock (shell.h): CRIU dumps the mount as external
 * (key MOAT_CHAN_EXT_KEY) and the socket with it, and a restore binds the key to the new slot's
 * chan, where the restored guest binds its socket again; moatd connects per request, so
 * none is open at the freeze unless a stream, watch or PTY is attached (then EBUSY). The network
 * namespace (loopback only) is dumped and rebuilt by CRIU. (When CRIU made the restored user
 * namespace itself, a prepared one could not be handed over: it belonged to another user
 * namespace, "Can't setns net: Operation not permitted"; CRIU now runs inside the holder's user
 * namespace, where one could be made ahead: untried.) SLOT/checkpointing marks a checkpoint in
 * progress, for recovery after moatd's death (moat_checkpoint_recover).
 *
 * Restore into a fresh slot: a new uid range, cgroups and disk; the upper copy is written into
 * the new disk with owners shifted to the new range. A holder process makes the sandbox's user
 * namespace, owned by the new range's uid (never host root: the kernel charges per-user counts
 * to a namespace's owner, userns.h), mapping the new range, with a UTS namespace carrying the
 * dumped hostname and a time namespace whose clocks go on from the dumped ones; the idmapped
 * template takes its mapping from it. CRIU's images are linked into SLOT/images with the
 * inventory rewritten to say the tree shares CRIU's user and UTS namespaces
 * (moat_criu_images_link). A helper (the process that execs CRIU) enters a private mount
 * namespace with CRIU's kernel-feature cache on a tmpfs /run (criu.c), mounts the overlay root
 * there, shows the slot dir at CRIU_SLOT, then joins the holder's user, UTS and time namespaces
 * as root of the new range and execs CRIU (--unprivileged: it holds the new namespace's
 * capabilities, not the host's), which restores the tree into them with new pid, mount, net,
 * ipc and cgroup namespaces, so that the restored tree runs in the new range, never the
 * parent's. CRIU's helper runs inside the slot's cgroups, so the restored tree lands there.
 * Nothing of the checkpoint dir is written: restores may run concurrently from one dir.
 *
 * The dump runs CRIU as the owner of the sandbox's user namespace (dump_child).
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/sched.h>
#include <net/if.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <pthread.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <dirent.h>
#include <unistd.h>

#include "../../common/crashpoint.h"
#include "../../common/fault.h"
#include "../../common/log.h"
#include "../../common/util.h"
#include "cgroup.h"
#include "criu.h"
#include "criu_images.h"
#include "disk.h"
#include "../driver.h"
#include "../../proto/client/guest_client.h"
#include "layer_copy.h"
#include "shell.h"
#include "cpus.h"
#include "linux_internal.h"
#include "share.h"
#include "view.h"
#include "userns.h"

#define META "moat-checkpoint"
#define GUEST_READY_MS 10000

const char *moat_linux_checkpoint_status(struct moat_host *h) {
  (void)h;
  const char *s;
  moat_criu_available(&s);
  return s;
}

bool moat_linux_can_checkpoint(struct moat_host *h) {
  (void)h;
  return moat_criu_available(NULL);
}

/* The v2 cgroup dir of pid on the host (for CRIU's --freeze-cgroup). Caller frees. */
static char *v2_cgroup_of(pid_t pid, moat_error **err) {
  _cleanup_free_ char *mi = NULL, *cg = NULL;
  if (read_file("/proc/self/mountinfo", &mi, NULL, err) < 0)
    return NULL;
  char *mnt = NULL;
  for (char *line = strtok(mi, "\n"); line && !mnt; line = strtok(NULL, "\n")) {
    char *dash = strstr(line, " - cgroup2 ");
    if (!dash)
      continue;
    char *p = line;
    for (int i = 0; i < 4 && p; i++) /* mount point is field 5 */
      p = strchr(p + 1, ' ');
    if (!p)
      continue;
    char *end = strchr(p + 1, ' ');
    mnt = xstrndup(p + 1, end ? (size_t)(end - p - 1) : strlen(p + 1));
  }
  if (!mnt) {
    moat_error_set(err, ENOENT, "no cgroup2 mount");
    return NULL;
  }
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/cgroup", pid);
  if (read_file(path, &cg, NULL, err) < 0) {
    free(mnt);
    return NULL;
  }
  char *res = NULL;
  for (char *line = strtok(cg, "\n"); line; line = strtok(NULL, "\n"))
    if (strncmp(line, "0::", 3) == 0)
      res = xasprintf("%s%s", mnt, line + 3);
  free(mnt);
  if (!res)
    moat_error_set(err, ENOENT, "pid %d has no v2 cgroup", pid);
  return res;
}

/* Sum of the sizes of CRIU's pages-*.img in dir. */
static uint64_t pages_bytes(const char *dir) {
  uint64_t total = 0;
  DIR *dp = opendir(dir);
  if (!dp)
    return 0;
  struct dirent *de;
  struct stat st;
  while ((de = readdir(dp)) != NULL)
    if (strncmp(de->d_name, "pages-", 6) == 0 && fstatat(dirfd(dp), de->d_name, &st, 0) == 0)
      total += (uint64_t)st.st_size;
  closedir(dp);
  return total;
}

/* Makes CRIU's images readable by the restored tasks, which open some (timens, ...) themselves
 * from inside their user namespace through restore's hard links (moat_criu_images_link). The path to
 * them stays closed: the checkpoint dir is the caller's, the per-restore dir belongs to the new
 * range's root. 0 or -1. */
static int share_images(const char *dir, moat_error **err) {
  DIR *dp = opendir(dir);
  if (!dp)
    return moat_error_errno(err, "open %s", dir);
  struct dirent *de;
  int ret = 0;
  while (ret == 0 && (de = readdir(dp)) != NULL)
    if (de->d_name[0] != '.' && fchmodat(dirfd(dp), de->d_name, 0644, 0) < 0)
      ret = moat_error_errno(err, "chmod %s/%s", dir, de->d_name);
  closedir(dp);
  return ret;
}

static uint64_t meta_u64(const char *text, const char *key) {
  size_t k = strlen(key);
  for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
    if (strncmp(p, key, k) == 0 && p[k] == ' ')
      return strtoull(p + k + 1, NULL, 10);
  return 0;
}

static char *meta_str(const char *text, const char *key) {
  size_t k = strlen(key);
  for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
    if (strncmp(p, key, k) == 0 && p[k] == ' ')
      return xstrndup(p + k + 1, strcspn(p + k + 1, "\n"));
  return NULL;
}

static int cmp_ul(const void *a, const void *b) {
  unsigned long x = *(const unsigned long *)a, y = *(const unsigned long *)b;
  return x < y ? -1 : x > y;
}

/* Sockets that processes of the sandbox (cgroup dir cgdir) hold but that live in moatd's
 * network namespace: the guest's ends of moatd's connections (an accepted unix socket belongs
 * to the connecting side's namespace). CRIU cannot dump them. Returns the count, or -1. */
static int outside_sockets(const char *cgdir) {
  _cleanup_free_ char *unix_tab = NULL, *procs = NULL;
  _cleanup_free_ char *procs_path = xasprintf("%s/cgroup.procs", cgdir);
  if (read_file("/proc/self/net/unix", &unix_tab, NULL, NULL) < 0 ||
      read_file(procs_path, &procs, NULL, NULL) < 0)
    return -1;
  size_t cap = 256, n = 0;
  _cleanup_free_ unsigned long *inos = xcalloc(cap, sizeof(*inos));
  char *save = NULL;
  for (char *line = strtok_r(unix_tab, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    unsigned long ino;
    if (sscanf(line, "%*s %*s %*s %*s %*s %*s %lu", &ino) != 1)
      continue;
    if (n == cap)
      inos = xrealloc(inos, (cap *= 2) * sizeof(*inos));
    inos[n++] = ino;
  }
  qsort(inos, n, sizeof(*inos), cmp_ul);
  int found = 0;
  for (char *p = strtok_r(procs, "\n", &save); p; p = strtok_r(NULL, "\n", &save)) {
    _cleanup_free_ char *fd_dir = xasprintf("/proc/%s/fd", p);
    DIR *dp = opendir(fd_dir);
    if (!dp)
      continue;
    struct dirent *de;
    while ((de = readdir(dp)) != NULL) {
      char link[64];
      ssize_t k = readlinkat(dirfd(dp), de->d_name, link, sizeof(link) - 1);
      unsigned long ino;
      if (k <= 0)
        continue;
      link[k] = '\0';
      if (sscanf(link, "socket:[%lu]", &ino) == 1 && bsearch(&ino, inos, n, sizeof(*inos), cmp_ul))
        found++;
    }
    closedir(dp);
  }
  return found;
}

int moat_linux_guest_sessions(struct moat_host *h, int slot) {
  struct moat_slot_view v;
  if (moat_linux_slot_view(moat_linux_of(h), slot, &v, NULL) < 0)
    return -1;
  free(v.slot_dir);
  free(v.chan_dir);
  if (v.disk_fd >= 0)
    close(v.disk_fd);
  _cleanup_free_ char *cgdir = v2_cgroup_of(v.pid, NULL);
  return cgdir ? outside_sockets(cgdir) : -1;
}

/* Threads of the sandbox's processes (cgroup dir cgdir) in uninterruptible sleep ('D'). A task
 * frozen by the v2 freezer reads 'S'; 'D' is a real wait that CRIU cannot seize, most often the
 * parent of a vfork (posix_spawn, subprocess) whose child was frozen before its exec: it stays in
 * D until the child runs again. Returns the count, or -1. */
static int uninterruptible_threads(const char *cgdir) {
  _cleanup_free_ char *procs = NULL;
  _cleanup_free_ char *procs_path = xasprintf("%s/cgroup.procs", cgdir);
  if (read_file(procs_path, &procs, NULL, NULL) < 0)
    return -1;
  int found = 0;
  char *save = NULL;
  for (char *p = strtok_r(procs, "\n", &save); p; p = strtok_r(NULL, "\n", &save)) {
    _cleanup_free_ char *task_dir = xasprintf("/proc/%s/task", p);
    DIR *dp = opendir(task_dir);
    if (!dp)
      continue;
    struct dirent *de;
    while ((de = readdir(dp)) != NULL) {
      if (de->d_name[0] == '.')
        continue;
      _cleanup_free_ char *stat_path = xasprintf("%s/%s/stat", task_dir, de->d_name);
      _cleanup_free_ char *stat = NULL;
      if (read_file(stat_path, &stat, NULL, NULL) < 0)
        continue;
      const char *rp = strrchr(stat, ')');
      if (rp && rp[1] == ' ' && rp[2] == 'D')
        found++;
    }
    closedir(dp);
  }
  return found;
}

/* Freezes the slot at a moment when no connection to the guest is open: moatd opens one per
 * request and the guest closes its end a moment after the reply, so a freeze can catch one
 * half-closed; CRIU cannot dump a socket whose peer is outside. Nor can it seize a thread in
 * uninterruptible sleep, which a freeze can also catch. Thaws and retries for up to a
 * second; when connections stay open for QUIESCE_AFTER_MS (long enough for a file call in flight
 * to end) it asks the guest (SIGUSR2) to drop them: those an attached stream, watch or PTY keeps
 * open (their processes run on). A slot that was paused already stays frozen and fails with
 * EBUSY if a connection is open. */
#define QUIESCE_AFTER_MS 300
static int freeze_quiet(struct moat_slot_view *v, int slot, const char *cgdir, bool was_frozen,
                        moat_error **err) {
  int conns = 0, waiting = 0;
  uint64_t t0 = now_ns();
  bool quiesced = false;
  for (int attempt = 0; attempt < 100; attempt++) {
    if (moat_cgroup_freeze(v->cgroups, slot, true, 5000, err) < 0)
      return -1;
    conns = outside_sockets(cgdir);
    /* a thread caught in uninterruptible sleep (a vfork parent whose child froze before exec)
     * would make CRIU time out: thaw a moment and freeze again */
    waiting = conns == 0 && !was_frozen ? uninterruptible_threads(cgdir) : 0;
    if (conns == 0 && waiting <= 0)
      return 0;
    if (was_frozen)
      break; /* a paused sandbox cannot close anything */
    if (moat_cgroup_freeze(v->cgroups, slot, false, 5000, err) < 0)
      return -1;
    /* still open: a stream, watch or PTY; the guest drops them on SIGUSR2 (their processes run
     * on, their output stays for ATTACH) */
    if (conns > 0 && !quiesced && now_ns() - t0 >= (uint64_t)QUIESCE_AFTER_MS * 1000000ull) {
      kill(v->pid, SIGUSR2);
      quiesced = true;
    }
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  if (!was_frozen)
    moat_cgroup_freeze(v->cgroups, slot, false, 5000, NULL);
  if (conns < 0)
    return moat_error_set(err, ESRCH, "cannot list the sockets of sandbox %d's processes", v->pid);
  if (conns == 0 && waiting > 0)
    return moat_error_set(err, EBUSY,
                          "%d thread(s) of the sandbox stay in uninterruptible sleep (D state) for over a "
                          "second; CRIU cannot checkpoint them: try again",
                          waiting);
  return moat_error_set(err, EBUSY,
                        "%d connection(s) to the guest stay open (an attached exec stream, watch or PTY); "
                        "CRIU cannot checkpoint them: close them first",
                        conns);
}

/* After a moatd restart a slot keeps no fd of its writable layer. Finds it again: a dir under
 * project quotas (SLOT/fs), or the loop device whose (unlinked) backing file was DISKS/N.img,
 * whose ext4 superblock is then mounted again, detached. Returns a dir fd of the layer or -1. */
int moat_linux_reattach_disk(const char *slot_dir, const char *disks_dir, int slot, moat_error **err) {
  _cleanup_free_ char *fs_dir = xasprintf("%s/fs", slot_dir);
  int fd = open(fs_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0)
    return fd;
  _cleanup_free_ char *want = xasprintf("%s/%d.img", disks_dir, slot);
  DIR *dp = opendir("/sys/block");
  if (!dp)
    return moat_error_errno(err, "open /sys/block");
  char loop[300] = "";
  struct dirent *de;
  while (!loop[0] && (de = readdir(dp)) != NULL) {
    if (strncmp(de->d_name, "loop", 4) != 0)
      continue;
    _cleanup_free_ char *bf = xasprintf("/sys/block/%s/loop/backing_file", de->d_name);
    _cleanup_free_ char *name = NULL;
    if (read_file(bf, &name, NULL, NULL) < 0)
      continue;
    name[strcspn(name, "\n")] = '\0';
    char *del = strstr(name, " (deleted)");
    if (del)
      *del = '\0';
    if (strcmp(name, want) == 0)
      snprintf(loop, sizeof(loop), "/dev/%s", de->d_name);
  }
  closedir(dp);
  if (!loop[0])
    return moat_error_set(err, ENOENT, "no loop device holds %s", want);
  _cleanup_close_ int fsfd = fsopen("ext4", FSOPEN_CLOEXEC);
  if (fsfd < 0)
    return moat_error_errno(err, "fsopen ext4");
  if (fsconfig(fsfd, FSCONFIG_SET_STRING, "source", loop, 0) < 0 ||
      fsconfig(fsfd, FSCONFIG_SET_FLAG, "nodelalloc", NULL, 0) < 0 ||
      fsconfig(fsfd, FSCONFIG_CMD_CREATE, NULL, NULL, 0) < 0)
    return moat_error_errno(err, "mount %s again", loop);
  fd = moat_fault(MOAT_FAULT_MOUNT) ? (errno = ENOMEM, -1)
                                    : fsmount(fsfd, FSMOUNT_CLOEXEC, MOUNT_ATTR_NODEV | MOUNT_ATTR_NOSUID);
  if (fd < 0)
    return moat_error_errno(err, "fsmount %s", loop);
  return fd;
}

/* SLOT/checkpointing exists while a checkpoint holds the sandbox frozen: "was_frozen 0|1" and,
 * once CRIU runs, "criu PID START". If moatd dies meanwhile, moat_checkpoint_recover (at adopt)
 * waits for that CRIU to finish and thaws what the checkpoint froze. */
#define MARKER "checkpointing"

struct dump_ctx {
  const char *marker;
  bool was_frozen;
  uid_t owner; /* the sandbox's uid: owner of its user namespace */
};

static int dump_parent(void *arg, pid_t child, moat_error **err) {
  struct dump_ctx *c = arg;
  _cleanup_free_ char *line = xasprintf("was_frozen %d\ncriu %d %llu\n", c->was_frozen, child,
                                        (unsigned long long)moat_proc_start_time(child));
  _cleanup_close_ int fd = open(c->marker, O_WRONLY | O_TRUNC | O_CLOEXEC);
  if (fd < 0 || write_all(fd, line, strlen(line)) < 0)
    return moat_error_errno(err, "write %s", c->marker);
  return 0;
}

void moat_checkpoint_recover(struct moat_cgroups *cg, int slot, const char *slot_dir) {
  _cleanup_free_ char *marker = xasprintf("%s/" MARKER, slot_dir);
  _cleanup_free_ char *text = NULL;
  if (read_file(marker, &text, NULL, NULL) < 0)
    return;
  pid_t criu = (pid_t)meta_u64(text, "criu");
  _cleanup_free_ char *criu_line = meta_str(text, "criu");
  unsigned long long start = 0;
  if (criu_line)
    sscanf(criu_line, "%*d %llu", &start);
  if (criu > 0 && start && moat_proc_start_time(criu) == start) {
    /* CRIU outlived the moatd that started it: it finishes (and leaves the tasks as it found
     * them, frozen); thawing under it would be undone by it */
    int pfd = (int)syscall(SYS_pidfd_open, criu, 0);
    if (pfd >= 0) {
      struct pollfd p = {.fd = pfd, .events = POLLIN};
      poll(&p, 1, 60000);
      close(pfd);
    }
  }
  if (meta_u64(text, "was_frozen") == 0)
    moat_cgroup_freeze(cg, slot, false, 5000, NULL);
  unlink(marker);
  log_info("slot %d: thawed after a checkpoint interrupted by a moatd restart", slot);
}

/* Network devices of pid's net namespace other than lo (a veth to the host's network, net.c). */
static int count_net_links(pid_t pid) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/net/dev", pid);
  _cleanup_free_ char *s = NULL;
  if (read_file(path, &s, NULL, NULL) < 0)
    return 0;
  int n = 0, line = 0;
  for (char *l = strtok(s, "\n"); l; l = strtok(NULL, "\n"))
    if (++line > 2 && !strstr(l, " lo:") && strncmp(l, "lo:", 3) != 0)
      n++;
  return n;
}

/* CRIU dumps as the owner of the sandbox's user namespace (with every capability moatd has):
 * reading the rlimits of the sandbox's processes takes CAP_SYS_RESOURCE over that namespace,
 * which host root holds there only as its owner (and lacks outright on some hosts). */
static int dump_child(void *arg) {
  struct dump_ctx *c = arg;
  if (moat_criu_child_setup() < 0)
    return -1;
  return moat_userns_become_owner(c->owner);
}

/* Most binds of the share's device nodes a sandbox has: its /dev nodes and the /proc masks. */
#define SHARE_BINDS 32

/* Fills out[] with CRIU's --external argument for each bind of a device node of the share
 * (share.h) in the mount namespace of pid, "mnt[MOUNTPOINT]:" MOAT_SHARE_DEV_KEY "NAME", from its
 * mountinfo (the view files and the guest binary, from the share too, have keys of their own).
 * Returns how many. A restore maps each key to the new slot's share. */
static int share_binds(pid_t pid, char out[SHARE_BINDS][160]) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/mountinfo", (int)pid);
  _cleanup_free_ char *s = NULL;
  if (read_file(path, &s, NULL, NULL) < 0)
    return 0;
  int n = 0;
  for (char *line = s, *next; line && *line && n < SHARE_BINDS; line = next) {
    next = strchr(line, '\n');
    if (next)
      *next++ = '\0';
    /* ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTS */
    char root[128], target[128], fstype[32], source[64];
    const char *dash = strstr(line, " - ");
    if (!dash || sscanf(line, "%*s %*s %*s %127s %127s", root, target) != 2 ||
        sscanf(dash, " - %31s %63s", fstype, source) != 2)
      continue;
    if (strcmp(source, MOAT_SHARE_SOURCE) != 0 || root[0] != '/')
      continue;
    for (int d = 0; moat_share_devs[d]; d++)
      if (strcmp(root + 1, moat_share_devs[d]) == 0) {
        snprintf(out[n++], sizeof(out[0]), "mnt[%s]:" MOAT_SHARE_DEV_KEY "%s", target, moat_share_devs[d]);
        break;
      }
  }
  return n;
}

int moat_linux_checkpoint(struct moat_host *h, int slot, const char *dir, bool leave_running,
                          struct moat_checkpoint_info *info, moat_error **err) {
  uint64_t t0 = now_ns();
  const char *why;
  if (!moat_criu_available(&why))
    return moat_error_set(err, ENOSYS, "%s", why);
  struct moat_slot_view v;
  if (moat_linux_slot_view(moat_linux_of(h), slot, &v, err) < 0)
    return moat_error_wrap(err, "checkpoint");
  _cleanup_free_ char *slot_dir = v.slot_dir;
  _cleanup_free_ char *chan_dir = v.chan_dir; /* the dump needs only the mount inside */
  _cleanup_close_ int disk = v.disk_fd;
  if (disk < 0 && (disk = moat_linux_reattach_disk(slot_dir, v.disks_dir, slot, err)) < 0)
    return moat_error_wrap(err, "checkpoint slot %d: find its writable layer", slot);
  _cleanup_free_ char *cgdir = v2_cgroup_of(v.pid, err);
  if (!cgdir)
    return moat_error_wrap(err, "checkpoint slot %d", slot);
  _cleanup_close_ int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0)
    return moat_error_errno(err, "checkpoint: open %s", dir);
  if (mkdirat(dfd, "images", 0700) < 0)
    return moat_error_errno(err, "checkpoint: mkdir %s/images", dir);

  int net_links = count_net_links(v.pid);
  bool was_frozen = moat_cgroup_frozen(v.cgroups, slot);
  _cleanup_free_ char *marker = xasprintf("%s/" MARKER, slot_dir);
  {
    _cleanup_free_ char *line = xasprintf("was_frozen %d\n", was_frozen);
    _cleanup_close_ int mfd = open(marker, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (mfd < 0)
      return moat_error_errno(err, "checkpoint slot %d: %s", slot,
                              errno == EEXIST ? "another checkpoint runs" : marker);
    if (write_all(mfd, line, strlen(line)) < 0) {
      unlink(marker);
      return moat_error_errno(err, "write %s", marker);
    }
  }
  if (freeze_quiet(&v, slot, cgdir, was_frozen, err) < 0) {
    unlink(marker);
    return moat_error_wrap(err, "checkpoint slot %d", slot);
  }
  moat_crash_point("checkpoint.frozen");
  uint64_t tf = now_ns();
  uint64_t disk_bytes = 0;
  int ret = moat_layer_copy(disk, dfd, "upper", v.uid_base, v.uid_base, &disk_bytes, err);
  if (ret == 0) {
    _cleanup_free_ char *images = xasprintf("%s/images", dir);
    _cleanup_free_ char *log = xasprintf("%s/dump.log", images);
    _cleanup_free_ char *pid_s = xasprintf("%d", v.pid);
    char *argv[32 + 2 * MOAT_CGROUP_VIEW_MAX + 2 * MOAT_VIEW_FILES + 2 * MOAT_LXCFS_FILES + 2 * SHARE_BINDS +
               2 * MOAT_SLOT_MAX_VOLUMES];
    char cg_ext[MOAT_CGROUP_VIEW_MAX][96], view_ext[MOAT_VIEW_FILES][96], lx_ext[MOAT_LXCFS_FILES][96];
    char share_ext[SHARE_BINDS][160];
    struct moat_cgroup_view cgv;
    moat_cgroup_view_names(v.cgroups, &cgv);
    int a = 0;
    argv[a++] = "criu";
    argv[a++] = "dump";
    argv[a++] = "-t";
    argv[a++] = pid_s;
    argv[a++] = "-D";
    argv[a++] = images;
    argv[a++] = "-o";
    argv[a++] = "dump.log";
    argv[a++] = "-v2";
    argv[a++] = "--freeze-cgroup";
    argv[a++] = cgdir;
    argv[a++] = "--external";
    argv[a++] = "mnt[" MOAT_GUEST_SOCK_DIR "]:" MOAT_CHAN_EXT_KEY;
    argv[a++] = "--ext-mount-map";
    argv[a++] = "auto";
    argv[a++] = "--network-lock";
    argv[a++] = "skip";
    argv[a++] = "--manage-cgroups=ignore";
    argv[a++] = "--unprivileged"; /* CRIU's word for not uid 0: it keeps every capability */
    argv[a++] = "--external";
    argv[a++] = "mnt[" MOAT_GUEST_MOUNT_INSIDE "]:" MOAT_GUEST_MOUNT_KEY;
    for (int i = 0; moat_view_files[i].name; i++) { /* view.h: a restore binds the new slot's */
      snprintf(view_ext[i], sizeof(view_ext[i]), "mnt[%s]:%s", moat_view_files[i].inside,
               moat_view_files[i].key);
      argv[a++] = "--external";
      argv[a++] = view_ext[i];
    }
    for (int i = 0; moat_view_has_lxcfs(v.pid) && moat_lxcfs_files[i]; i++) { /* view.h */
      snprintf(lx_ext[i], sizeof(lx_ext[i]), "mnt[/proc/%s]:moat-lxcfs-%s", moat_lxcfs_files[i],
               moat_lxcfs_files[i]);
      argv[a++] = "--external";
      argv[a++] = lx_ext[i];
    }
    /* the share's device nodes (share.h), at /dev and under the /proc masks */
    for (int i = 0, k = share_binds(v.pid, share_ext); i < k; i++) {
      argv[a++] = "--external";
      argv[a++] = share_ext[i];
    }
    /* the cgroup view (cgroup.h): a restore binds the new slot's cgroups there */
    for (int i = 0; i < cgv.n; i++) {
      snprintf(cg_ext[i], sizeof(cg_ext[i]), "mnt[%s]:%s", cgv.inside[i], cgv.key[i]);
      argv[a++] = "--external";
      argv[a++] = cg_ext[i];
    }
    /* volumes (linux_internal.h): external, a restore mounts them again from the volume */
    struct moat_slot_volume vols[MOAT_SLOT_MAX_VOLUMES];
    char vol_ext[MOAT_SLOT_MAX_VOLUMES][1200];
    int nv = moat_volume_slot_list(slot_dir, vols);
    if (nv < 0)
      ret = moat_error_set(err, EIO, "checkpoint slot %d: its volume record does not parse", slot);
    for (int i = 0; i < nv; i++) {
      snprintf(vol_ext[i], sizeof(vol_ext[i]), "mnt[%s]:moat-vol-%d", vols[i].path, i);
      argv[a++] = "--external";
      argv[a++] = vol_ext[i];
    }
    /* Always: CRIU never ends the tree. A hibernate's stays frozen until the caller has recorded the
     * image and destroys the slot, so a moatd killed before then loses nothing. */
    argv[a++] = "--leave-running";
    argv[a] = NULL;
    struct dump_ctx dc = {.marker = marker, .was_frozen = was_frozen, .owner = v.uid_base};
    if (ret == 0)
      ret = moat_criu_run(argv, dump_parent, dump_child, &dc, log, err);
    if (ret == 0)
      ret = moat_volume_slot_copy(slot_dir, dir, false, err);
    if (ret == 0)
      ret = share_images(images, err);
    if (ret == 0 && info)
      info->memory_bytes = pages_bytes(images);
    if (ret == 0)
      moat_crash_point("checkpoint.dumped");
  }
  uint64_t tt = now_ns();
  if (ret == 0) {
    _cleanup_free_ char *meta =
        xasprintf("version 1\nuid_base %u\ntemplate %s\ndisk_bytes %llu\nmemory_bytes %llu\nnet_links %d\n",
                  v.uid_base, v.template_name, (unsigned long long)disk_bytes,
                  (unsigned long long)(info ? info->memory_bytes : 0), net_links);
    _cleanup_close_ int mfd = openat(dfd, META ".tmp", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (mfd < 0 || write_all(mfd, meta, strlen(meta)) < 0 || fsync(mfd) < 0 ||
        renameat(dfd, META ".tmp", dfd, META) < 0)
      ret = moat_error_errno(err, "write %s/" META, dir);
  }
  /* Thawed unless it was paused before, or a hibernate's checkpoint succeeded (frozen as dumped). */
  if (!was_frozen && (ret < 0 || leave_running)) {
    moat_error *e = NULL;
    if (moat_cgroup_freeze(v.cgroups, slot, false, 5000, &e) < 0) {
      if (ret == 0 && err && !*err) {
        *err = e;
        e = NULL;
      }
      ret = -1;
      moat_error_free(&e);
    }
  }
  unlink(marker);
  if (ret < 0)
    return moat_error_wrap(err, "checkpoint slot %d", slot);
  moat_crash_point("checkpoint.written");
  if (info) {
    info->disk_bytes = disk_bytes;
    info->frozen_ns = tt - tf;
    info->total_ns = now_ns() - t0;
  }
  return 0;
}

/* ---- restore ---- */

/* The holder: a process in a new user namespace with the new slot's map, owned by the new
 * slot's uid: the restored sandbox's own user namespace (CRIU runs in it and restores the tree
 * into it), and the mapping of the idmapped template. It exits when its socket closes. */
struct holder {
  pid_t pid;
  int pidfd;
  int ctl;     /* write end: close to end the holder */
  bool timens; /* it made a time namespace for its children */
};

/* The restored tree's hostname and domain name, set by the holder in its UTS namespace. */
struct holder_uts {
  char nodename[65], domainname[65];
};

static __attribute__((noreturn)) void holder_main(int rd, const struct holder_uts *uts) {
  /* A copy of multi-threaded moatd: keep none of its fds (other requests' pipes and sockets,
   * whose ends must close when their owners close them) but our socket, as fd 3. */
  if (rd != 3 && dup2(rd, 3) < 0)
    _exit(1);
  rd = 3;
  syscall(SYS_close_range, 4, ~0U, 0);
  char b;
  if (read(rd, &b, 1) != 1) /* maps written */
    _exit(1);
  if (unshare(CLONE_NEWUTS) < 0 || sethostname(uts->nodename, strlen(uts->nodename)) < 0 ||
      setdomainname(uts->domainname, strlen(uts->domainname)) < 0)
    _exit(1);
  /* a time namespace for the restored tree (moatd sets its clocks, CRIU's helper enters it):
   * CRIU, running inside the user namespace with --unprivileged, makes none itself */
  if (write(rd, unshare(CLONE_NEWTIME) == 0 ? "t" : "r", 1) != 1)
    _exit(1);
  while (read(rd, &b, 1) > 0) /* until moatd closes its end */
    ;
  _exit(0);
}

static void holder_end(struct holder *hd) {
  if (hd->ctl >= 0)
    close(hd->ctl);
  if (hd->pidfd >= 0) {
    syscall(SYS_pidfd_send_signal, hd->pidfd, SIGKILL, NULL, 0);
    close(hd->pidfd);
  }
  if (hd->pid > 0)
    while (waitpid(hd->pid, NULL, __WALL) < 0 && errno == EINTR)
      ;
  hd->pid = 0;
  hd->pidfd = hd->ctl = -1;
}

/* Starts the holder for uid range base: its UTS namespace has uts's names; timens_offsets: its
 * time namespace's clocks (NULL: the host's). */
static int holder_start(struct holder *hd, uid_t base, const struct holder_uts *uts,
                        const char *timens_offsets, moat_error **err) {
  int sp[2];
  hd->pid = 0;
  hd->pidfd = hd->ctl = -1;
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) < 0)
    return moat_error_errno(err, "socketpair");
  struct clone_args args;
  memset(&args, 0, sizeof(args));
  args.flags = CLONE_NEWUSER | CLONE_PIDFD;
  args.pidfd = (uint64_t)(uintptr_t)&hd->pidfd;
  args.exit_signal = SIGCHLD;
  pid_t pid = moat_userns_clone3(&args, base); /* the range's uid owns it: userns.h */
  if (pid < 0) {
    close(sp[0]);
    close(sp[1]);
    return moat_error_errno(err, "clone3 holder");
  }
  if (pid == 0) {
    close(sp[0]);
    holder_main(sp[1], uts);
  }
  close(sp[1]);
  hd->pid = pid;
  hd->ctl = sp[0];
  char path[64], map[64];
  snprintf(map, sizeof(map), "0 %u %u\n", base, MOAT_UID_RANGE);
  snprintf(path, sizeof(path), "/proc/%d/uid_map", pid);
  if (write_file(path, map, err) < 0)
    goto fail;
  snprintf(path, sizeof(path), "/proc/%d/gid_map", pid);
  if (write_file(path, map, err) < 0)
    goto fail;
  if (write(hd->ctl, "g", 1) != 1) {
    moat_error_errno(err, "start holder");
    goto fail;
  }
  char b;
  if (read(hd->ctl, &b, 1) != 1) {
    moat_error_set(err, EIO, "restore holder died");
    goto fail;
  }
  hd->timens = b == 't';
  if (hd->timens && timens_offsets) {
    snprintf(path, sizeof(path), "/proc/%d/timens_offsets", pid);
    if (write_file(path, timens_offsets, err) < 0)
      goto fail;
  }
  return 0;
fail:
  holder_end(hd);
  return -1;
}

/* Where the CRIU helper of a restore shows the slot dir, in its private mount namespace. */
#define CRIU_SLOT "/run/moat-slot"

/* What the CRIU helper needs between fork and exec (syscalls only). */
struct restore_ctx {
  int lower_fd, disk_fd, cg_fd, share_fd;
  int userns_fd; /* the holder's user namespace */
  int timens_fd; /* the holder's time namespace for children, or -1 */
  int utsns_fd;  /* the holder's UTS namespace */
  const char *slot_dir;
  const char *lower, *disk, *root, *share; /* mount points in the slot dir */
  const char *ovl_opts;
  struct moat_cgroups *cgroups;
  const struct moat_cgroup_view *cgv; /* attached at cg_targets (SLOT/cgroup[/NAME]) */
  char (*cg_targets)[4096 + 32];
  int slot;
  const int *vol_fds; /* volumes (linux_internal.h), attached at vol_targets (SLOT/vol-N) */
  char (*vol_targets)[4096 + 32];
  int nv;
};

static int restore_parent(void *arg, pid_t child, moat_error **err) {
  struct restore_ctx *c = arg;
  char pid_s[24];
  snprintf(pid_s, sizeof(pid_s), "%d", child);
  if (write_file_at(c->cg_fd, "cgroup.procs", pid_s, err) < 0)
    return -1;
  return moat_cgroup_attach_v1(c->cgroups, c->slot, child, err);
}

static int restore_child(void *arg) {
  struct restore_ctx *c = arg;
  if (moat_criu_child_setup() < 0)
    return -1;
  if (move_mount(c->lower_fd, "", AT_FDCWD, c->lower, MOVE_MOUNT_F_EMPTY_PATH) < 0 ||
      move_mount(c->disk_fd, "", AT_FDCWD, c->disk, MOVE_MOUNT_F_EMPTY_PATH) < 0 ||
      move_mount(c->share_fd, "", AT_FDCWD, c->share, MOVE_MOUNT_F_EMPTY_PATH) < 0)
    return -1;
  for (int i = 0; i < c->cgv->n; i++)
    if (move_mount(c->cgv->fd[i], "", AT_FDCWD, c->cg_targets[i], MOVE_MOUNT_F_EMPTY_PATH) < 0)
      return -1;
  for (int i = 0; i < c->nv; i++)
    if (move_mount(c->vol_fds[i], "", AT_FDCWD, c->vol_targets[i], MOVE_MOUNT_F_EMPTY_PATH) < 0)
      return -1;
  if (mount("overlay", c->root, "overlay", MS_NODEV, c->ovl_opts) < 0)
    return -1;
  /* CRIU runs as root of the holder's namespace, the host's uid_base, which may not search the
   * data dir's parents: it sees the slot dir (with the mounts above) at CRIU_SLOT instead */
  if (mkdir(CRIU_SLOT, 0711) < 0 || mount(c->slot_dir, CRIU_SLOT, NULL, MS_BIND | MS_REC, NULL) < 0)
    return -1;
  moat_userns_drop_loginuid(); /* else CRIU fails to reset it (CAP_AUDIT_CONTROL of the host) */
  if (setns(c->userns_fd, CLONE_NEWUSER) < 0 || setns(c->utsns_fd, CLONE_NEWUTS) < 0 ||
      (c->timens_fd >= 0 && setns(c->timens_fd, CLONE_NEWTIME) < 0))
    return -1;
  if (syscall(SYS_setgroups, 0, NULL) < 0 || syscall(SYS_setresgid, 0, 0, 0) < 0 ||
      syscall(SYS_setresuid, 0, 0, 0) < 0)
    return -1;
  /* a mount namespace of the new user namespace (a copy of this one): CRIU enters the restored
   * tree's and must be able to come back */
  return unshare(CLONE_NEWNS);
}

/* CRIU's action script for a restore into an empty net namespace: lo up at setup-namespaces. */
int moat_checkpoint_write_net_script(const char *path, moat_error **err) {
  static const char text[] = "#!/bin/sh\n"
                             "[ \"$CRTOOLS_SCRIPT_ACTION\" = setup-namespaces ] || exit 0\n"
                             "exec nsenter -t \"$CRTOOLS_INIT_PID\" -n ip link set lo up\n";
  _cleanup_free_ char *tmp = xasprintf("%s.tmp", path);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0755);
  if (fd < 0)
    return moat_error_errno(err, "write %s", tmp);
  if (write_all(fd, text, sizeof(text) - 1) < 0 || fchmod(fd, 0755) < 0) {
    moat_error_errno(err, "write %s", tmp);
    close(fd);
    unlink(tmp);
    return -1;
  }
  close(fd);
  if (rename(tmp, path) < 0) {
    moat_error_errno(err, "rename %s", tmp);
    unlink(tmp);
    return -1;
  }
  return 0;
}

static int wait_guest(const struct moat_guest_ep *ep, moat_error **err) {
  uint64_t deadline = now_ns() + (uint64_t)GUEST_READY_MS * 1000000ull;
  for (;;) {
    moat_error *e = NULL;
    if (moat_guest_ping(ep, 2000, &e) == 0)
      return 0;
    if (now_ns() >= deadline) {
      if (err && !*err) {
        *err = e;
        e = NULL;
      }
      moat_error_free(&e);
      return moat_error_wrap(err, "restored guest does not answer");
    }
    moat_error_free(&e);
    struct timespec ts = {0, 2 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
}

/* MOAT_CRIU_TIMING=1: each restore prints where its time went to stderr (for benchmarks). */
static void mark(const char *what, uint64_t *last) {
  static _Atomic int on = -1; /* concurrent restores read it: all find the same value */
  if (on < 0)
    on = getenv("MOAT_CRIU_TIMING") != NULL;
  uint64_t now = now_ns();
  if (on)
    fprintf(stderr, "restore: %-28s %7.2f ms\n", what, (double)(now - *last) / 1e6);
  *last = now;
}

int moat_linux_checkpoint_volumes(struct moat_host *base, const char *dir, moat_error **err) {
  struct moat_slot_volume vols[MOAT_SLOT_MAX_VOLUMES];
  int n = moat_volume_slot_list(dir, vols);
  if (n < 0)
    return moat_error_set(err, EIO, "%s/" MOAT_SLOT_VOLUMES_FILE " does not parse", dir);
  return n;
}

int moat_linux_restore(struct moat_host *base, const char *dir, const char *template_name,
                       const struct moat_limits *limits, unsigned flags, struct moat_instance *out,
                       moat_error **err) {
  struct moat_linux *h = moat_linux_of(base);
  uint64_t t0 = now_ns(), tm = t0;
  const char *why;
  if (!moat_criu_available(&why))
    return moat_error_set(err, ENOSYS, "%s", why);
  _cleanup_close_ int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0)
    return moat_error_errno(err, "restore: open %s", dir);
  _cleanup_free_ char *meta_path = xasprintf("%s/" META, dir);
  _cleanup_free_ char *meta = NULL;
  if (read_file(meta_path, &meta, NULL, err) < 0)
    return moat_error_wrap(err, "restore: %s is not a complete checkpoint", dir);
  uid_t old_base = (uid_t)meta_u64(meta, "uid_base");
  _cleanup_free_ char *tmpl = meta_str(meta, "template");
  if (!old_base || !tmpl)
    return moat_error_set(err, EINVAL, "restore: %s has no uid_base/template", meta_path);
  /* a sandbox adopted after a moatd restart does not know its template: the caller's word */
  if (tmpl[0] && strcmp(tmpl, template_name) != 0)
    return moat_error_set(err, EINVAL, "restore: %s was taken from template %s, not %s", dir, tmpl,
                          template_name);

  struct moat_slot_view v;
  int n = moat_linux_slot_reserve(h, template_name, limits, &v, err);
  if (n < 0)
    return moat_error_wrap(err, "restore");
  _cleanup_free_ char *slot_dir = v.slot_dir;
  _cleanup_free_ char *rootfs = xasprintf("%s/%s/rootfs", v.template_dir, template_name);
  _cleanup_free_ char *lower = xasprintf("%s/lower", slot_dir);
  _cleanup_free_ char *diskp = xasprintf("%s/disk", slot_dir);
  _cleanup_free_ char *root = xasprintf("%s/root", slot_dir);
  _cleanup_free_ char *share = xasprintf("%s/" MOAT_SHARE_DIR, slot_dir);
  _cleanup_free_ char *img = xasprintf("%s/%d.img", v.disks_dir, n);
  _cleanup_free_ char *src_images = xasprintf("%s/images", dir);
  _cleanup_free_ char *images = xasprintf("%s/images", slot_dir);
  _cleanup_free_ char *pidfile = xasprintf("%s/images/criu.pid", slot_dir);
  _cleanup_free_ char *log = xasprintf("%s/images/restore.log", slot_dir);
  _cleanup_free_ char *chan_dir = v.chan_dir;
  _cleanup_free_ char *chan_map = xasprintf(MOAT_CHAN_EXT_KEY ":%s", chan_dir);
  _cleanup_free_ char *net_script = xasprintf("%s/criu-net.sh", slot_dir);
  _cleanup_free_ char *ovl =
      xasprintf("lowerdir=%s,upperdir=%s/upper,workdir=%s/work,userxattr", lower, diskp, diskp);
  _cleanup_close_ int cg_fd = -1, disk = -1, lower_fd = -1, pidfd = -1, userns_fd = -1, timens_fd = -1,
                      utsns_fd = -1, share_fd = -1;
  char timens_offsets[160];
  struct moat_cgroup_view cgv = {0};
  char cg_ext[MOAT_CGROUP_VIEW_MAX][96], view_ext[MOAT_VIEW_FILES][96], lx_ext[MOAT_LXCFS_FILES][4200];
  char dev_ext[MOAT_SHARE_DEVS][96];
  char cg_targets[MOAT_CGROUP_VIEW_MAX][4096 + 32];
  struct moat_slot_volume vols[MOAT_SLOT_MAX_VOLUMES];
  int vol_fds[MOAT_SLOT_MAX_VOLUMES], nv = 0;
  char vol_targets[MOAT_SLOT_MAX_VOLUMES][4096 + 32], vol_ext[MOAT_SLOT_MAX_VOLUMES][64];
  struct holder_uts uts;
  struct holder hd = {.pid = 0, .pidfd = -1, .ctl = -1, .timens = false};
  pid_t pid = 0;
  uint64_t copied = 0;

  if (mkdir(slot_dir, 0711) < 0 || mkdir(lower, 0755) < 0 || mkdir(diskp, 0755) < 0 ||
      mkdir(root, 0755) < 0 || mkdir(share, 0755) < 0) {
    moat_error_errno(err, "mkdir %s", slot_dir);
    goto fail;
  }
  cg_fd = moat_cgroup_create(v.cgroups, n, limits, err);
  if (cg_fd < 0 || moat_shell_chan_prepare(chan_dir, v.uid_base, err) < 0)
    goto fail;
  mark("slot, dirs, cgroups", &tm);
  disk = moat_linux_slot_disk(h, img, limits->disk_mb, v.uid_base, err);
  if (disk < 0)
    goto fail;
  mark("disk", &tm);
  if (unlinkat(disk, "upper", AT_REMOVEDIR) < 0) {
    moat_error_errno(err, "remove the new disk's empty upper");
    goto fail;
  }
  if (moat_layer_copy(dfd, disk, "upper", old_base, v.uid_base, &copied, err) < 0)
    goto fail;
  mark("upper copy", &tm);
  nv = moat_volume_slot_list(dir, vols);
  if (nv < 0) {
    moat_error_set(err, EIO, "%s/" MOAT_SLOT_VOLUMES_FILE " does not parse", dir);
    nv = 0;
    goto fail;
  }
  for (int i = 0; i < nv; i++)
    vol_fds[i] = -1;
  /* forced read-only: CRIU must mount them so (a bind mount's flags are restored as dumped, and
   * CRIU cannot clear the read-only flag of a clone made so) */
  bool vol_ro = nv > 0 && (flags & MOAT_RESTORE_VOLUMES_RO);
  int clocks = moat_criu_images_timens_offsets(src_images, timens_offsets, sizeof(timens_offsets), err);
  if (clocks < 0 ||
      moat_criu_images_uts(src_images, uts.nodename, uts.domainname, sizeof(uts.nodename), err) < 0 ||
      moat_criu_images_link(src_images, images, v.uid_base, vol_ro ? "moat-vol-" : NULL, vol_ro ? nv : 0,
                            err) < 0 ||
      holder_start(&hd, v.uid_base, &uts, clocks ? timens_offsets : NULL, err) < 0)
    goto fail;
  lower_fd = moat_fault(MOAT_FAULT_MOUNT) ? (errno = ENOMEM, moat_error_errno(err, "open_tree %s", rootfs))
                                          : moat_shell_idmapped_template(rootfs, hd.pid, err);
  if (lower_fd < 0)
    goto fail;
  share_fd = moat_share_clone(v.share_fd, err);
  if (share_fd < 0 || moat_shell_cgroup_view(slot_dir, v.cgroups, n, &cgv, err) < 0)
    goto fail;
  /* the sandbox's volumes, idmapped for the new range (the holder's user namespace) */
  for (int i = 0; i < nv; i++) {
    snprintf(vol_targets[i], sizeof(vol_targets[i]), "%s/vol-%d", slot_dir, i);
    vol_fds[i] = moat_linux_volume_clone(h, vols[i].vid, hd.pid,
                                         vols[i].read_only || (flags & MOAT_RESTORE_VOLUMES_RO), err);
    if (vol_fds[i] < 0 || mkdir(vol_targets[i], 0755) < 0) {
      if (vol_fds[i] >= 0)
        moat_error_errno(err, "mkdir %s", vol_targets[i]);
      moat_error_wrap(err, "volume %s", vols[i].vid);
      goto fail;
    }
  }
  for (int i = 0; i < cgv.n; i++)
    snprintf(cg_targets[i], sizeof(cg_targets[i]), "%s/cgroup%s%s", slot_dir, cgv.name[i][0] ? "/" : "",
             cgv.name[i]);
  {
    char ns_path[64];
    snprintf(ns_path, sizeof(ns_path), "/proc/%d/ns/user", hd.pid);
    userns_fd = open(ns_path, O_RDONLY | O_CLOEXEC);
    if (userns_fd < 0) {
      moat_error_errno(err, "open %s", ns_path);
      goto fail;
    }
    snprintf(ns_path, sizeof(ns_path), "/proc/%d/ns/uts", hd.pid);
    if ((utsns_fd = open(ns_path, O_RDONLY | O_CLOEXEC)) < 0) {
      moat_error_errno(err, "open %s", ns_path);
      goto fail;
    }
    snprintf(ns_path, sizeof(ns_path), "/proc/%d/ns/time_for_children", hd.pid);
    if (hd.timens && (timens_fd = open(ns_path, O_RDONLY | O_CLOEXEC)) < 0) {
      moat_error_errno(err, "open %s", ns_path);
      goto fail;
    }
  }
  mark("images, holder, idmap", &tm);
  {
    /* paths as CRIU sees them (CRIU_SLOT) */
    /* the fixed arguments below, then the keys' maps (lxcfs, view, devices, cgroup view), the
     * network's four and the terminating NULL */
    char *argv[32 + 2 * (MOAT_LXCFS_FILES + MOAT_VIEW_FILES + MOAT_SHARE_DEVS + MOAT_CGROUP_VIEW_MAX) + 4 +
               2 * MOAT_SLOT_MAX_VOLUMES + 1] = {
        "criu", "restore", "-D", CRIU_SLOT "/images", "-W", CRIU_SLOT "/images", "-o", "restore.log",
        getenv("MOAT_CRIU_KEEP_LOGS") ? "-v4" : "-v2", "--root", CRIU_SLOT "/root", "--restore-detached",
        "--pidfile", CRIU_SLOT "/images/criu.pid", "--ext-mount-map", chan_map, "--ext-mount-map", "auto",
        "--manage-cgroups=ignore", "--network-lock", "skip",
        /* CRIU's word for not being the host's root: it then sets socket buffers
         * without SO_*BUFFORCE (CAP_NET_ADMIN of the host) and makes no time
         * namespace (the holder made one) */
        "--unprivileged",
        /* checkpoints since the guest got a key; older ones name its host path */
        "--external", "mnt[" MOAT_GUEST_MOUNT_KEY "]:" CRIU_SLOT "/" MOAT_SHARE_DIR "/" MOAT_SHARE_GUEST};
    {
      size_t k = 0;
      while (argv[k])
        k++;
      /* lxcfs files (view.h): this host's lxcfs answers the restored sandbox from its new cgroups */
      for (int i = 0; v.lxcfs_dir && moat_lxcfs_files[i]; i++) {
        snprintf(lx_ext[i], sizeof(lx_ext[i]), "mnt[moat-lxcfs-%s]:%s/proc/%s", moat_lxcfs_files[i],
                 v.lxcfs_dir, moat_lxcfs_files[i]);
        argv[k++] = "--external";
        argv[k++] = lx_ext[i];
      }
      /* the view files (view.h) for the new limits, from the new slot's share; checkpoints
       * from before the share have the same keys */
      for (int i = 0; moat_view_files[i].name; i++) {
        char name[64];
        moat_view_name(&moat_view_files[i], moat_view_cpus(limits), name, sizeof(name));
        snprintf(view_ext[i], sizeof(view_ext[i]), "mnt[%s]:" CRIU_SLOT "/" MOAT_SHARE_DIR "/%s",
                 moat_view_files[i].key, name);
        argv[k++] = "--external";
        argv[k++] = view_ext[i];
      }
      /* the share's device nodes (share_binds); checkpoints from before the share bound the host's
       * devtmpfs, which --ext-mount-map auto finds again */
      for (int i = 0; moat_share_devs[i]; i++) {
        snprintf(dev_ext[i], sizeof(dev_ext[i]),
                 "mnt[" MOAT_SHARE_DEV_KEY "%s]:" CRIU_SLOT "/" MOAT_SHARE_DIR "/%s", moat_share_devs[i],
                 moat_share_devs[i]);
        argv[k++] = "--external";
        argv[k++] = dev_ext[i];
      }
      for (int i = 0; i < cgv.n; i++) {
        snprintf(cg_ext[i], sizeof(cg_ext[i]), "mnt[%s]:" CRIU_SLOT "/cgroup%s%s", cgv.key[i],
                 cgv.name[i][0] ? "/" : "", cgv.name[i]);
        argv[k++] = "--external";
        argv[k++] = cg_ext[i];
      }
      for (int i = 0; i < nv; i++) {
        snprintf(vol_ext[i], sizeof(vol_ext[i]), "mnt[moat-vol-%d]:" CRIU_SLOT "/vol-%d", i, i);
        argv[k++] = "--external";
        argv[k++] = vol_ext[i];
      }
    }
    if (meta_u64(meta, "net_links") > 0) {
      /* The sandbox had a veth to the host's network, whose far end CRIU cannot rebuild ("Unknown
       * peer net namespace"): restore into an empty net namespace, bring its lo up once CRIU made
       * it (before any socket is restored), and let the host give the new slot its own veth
       * (moat_linux_slot_commit). */
      size_t k = 0;
      while (argv[k])
        k++;
      argv[k++] = "--empty-ns";
      argv[k++] = "net";
      argv[k++] = "--action-script";
      argv[k++] = CRIU_SLOT "/criu-net.sh";
      if (link(v.criu_net_script, net_script) < 0) {
        moat_error_errno(err, "link %s", net_script);
        goto fail;
      }
    }
    struct restore_ctx ctx = {.lower_fd = lower_fd,
                              .disk_fd = disk,
                              .cg_fd = cg_fd,
                              .share_fd = share_fd,
                              .share = share,
                              .userns_fd = userns_fd,
                              .timens_fd = timens_fd,
                              .utsns_fd = utsns_fd,
                              .slot_dir = slot_dir,
                              .lower = lower,
                              .disk = diskp,
                              .root = root,
                              .ovl_opts = ovl,
                              .cgroups = v.cgroups,
                              .cgv = &cgv,
                              .cg_targets = cg_targets,
                              .slot = n,
                              .vol_fds = vol_fds,
                              .vol_targets = vol_targets,
                              .nv = nv};
    moat_linux_restore_begin(h);
    int rr = moat_criu_run(argv, restore_parent, restore_child, &ctx, log, err);
    moat_linux_restore_end(h);
    /* a file the dumped tree held open for writing on a volume now mounted read-only */
    if (rr < 0 && vol_ro && err && *err && strstr(moat_error_msg(*err), "Read-only file system"))
      (*err)->status = EROFS;
    if (rr < 0)
      goto fail;
    mark("criu restore", &tm);
  }
  {
    _cleanup_free_ char *pid_s = NULL;
    uint64_t p;
    if (read_file(pidfile, &pid_s, NULL, err) < 0)
      goto fail;
    pid_s[strcspn(pid_s, "\n")] = '\0';
    if (parse_u64(pid_s, &p) < 0 || p == 0 || p > INT32_MAX) {
      moat_error_set(err, EIO, "criu wrote no pid to %s", pidfile);
      goto fail;
    }
    pid = (pid_t)p;
  }
  pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
  if (pidfd < 0) {
    moat_error_errno(err, "pidfd_open restored init %d", pid);
    goto fail;
  }
  holder_end(&hd);
  {
    struct moat_guest_ep ep;
    _cleanup_free_ char *events = moat_cgroup_events_path(v.cgroups, n);
    moat_shell_chan_ep(&moat_linux_base(h)->guest_channel, chan_dir, pid, v.uid_base, events, &ep);
    if (moat_shell_chan_lock(chan_dir, err) < 0 || wait_guest(&ep, err) < 0 || moat_guest_renew(&ep, err) < 0)
      goto fail;
  }
  mark("guest answers", &tm);
  {
    /* the guest starts every new command: its CPUs are the new limits' (restored ones keep theirs) */
    moat_error *ce = NULL;
    if (moat_cpus_apply(pid, n, limits->cpu, &ce) < 0) {
      log_warn("slot %d: %s", n, moat_error_msg(ce));
      moat_error_free(&ce);
    }
  }
  if (getenv("MOAT_CRIU_KEEP_LOGS")) {
    _cleanup_free_ char *keep = xasprintf("/tmp/moat-restore-%d.log", n);
    rename(log, keep);
  }
  if (moat_volume_slot_copy(dir, slot_dir, flags & MOAT_RESTORE_VOLUMES_RO, err) < 0)
    goto fail;
  if (moat_linux_slot_commit(h, n, pid, steal_fd(&pidfd), moat_proc_start_time(pid), steal_fd(&disk), err) <
      0)
    goto fail;
  moat_linux_fill_instance(h, n, out);
  out->ready_ns = now_ns() - t0;
  out->from_pool = false;
  unlink(pidfile);
  rm_rf(images, NULL); /* hard links into the checkpoint: they would pin its space and expose it */
  log_debug("slot %d: restored from %s in %.1f ms (%llu bytes of disk)", n, dir, (double)out->ready_ns / 1e6,
            (unsigned long long)copied);
  moat_cgroup_view_close(&cgv);
  for (int i = 0; i < nv; i++)
    if (vol_fds[i] >= 0)
      close(vol_fds[i]);
  return 0;

fail:
  moat_cgroup_view_close(&cgv);
  for (int i = 0; i < nv; i++)
    if (vol_fds[i] >= 0)
      close(vol_fds[i]);
  holder_end(&hd);
  if (getenv("MOAT_CRIU_KEEP_LOGS")) { /* debugging: the slot dir goes, its CRIU log stays */
    _cleanup_free_ char *keep = xasprintf("/tmp/moat-restore-%d.log", n);
    rename(log, keep);
  }
  moat_linux_slot_abort(h, n); /* kills what CRIU may have started in the slot's cgroups */
  return moat_error_wrap(err, "restore %s", dir);
}

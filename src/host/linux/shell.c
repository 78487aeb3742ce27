/* shell.c -- the linux driver's create path: clone3 into seven namespaces, uid map, idmapped
 * template + overlay, /proc /sys /dev, masked paths, pivot_root, capabilities, seccomp, moat-guest
 *
 * The child runs in a copy of a multi-threaded moatd: between clone3 and execve it calls only
 * system calls (no malloc, no stdio, no locks), and reports failure as {errno, step} on the sync
 * socket before _exit.
 */
#include "shell.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/openat2.h>
#include <linux/sched.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <grp.h>
#include <unistd.h>

#include "../../common/util.h"
#include "seccomp.h"
#include "share.h"
#include "userns.h"
#include "view.h"

#ifndef CLONE_INTO_CGROUP
#define CLONE_INTO_CGROUP 0x200000000ULL
#endif

struct child_report {
  int err;
  char step[124];
};

struct child_ctx {
  const struct moat_shell_spec *spec;
  int sync_fd;                           /* child's end of the sync socketpair */
  int slot_fd;                           /* O_PATH of the slot dir */
  int listen_fd;                         /* guest socket, bound and listening inside (set in the child) */
  int ready_fd;                          /* write end of the ready pipe */
  const struct moat_cgroup_view *cgview; /* attached at cgroup/NAME of the slot dir before the go */
};

/* Capabilities root keeps inside the sandbox (Docker's default set without MKNOD and NET_RAW). */
static const int kept_caps[] = {CAP_CHOWN,  CAP_DAC_OVERRIDE, CAP_FSETID,           CAP_FOWNER,
                                CAP_SETGID, CAP_SETUID,       CAP_SETFCAP,          CAP_SETPCAP,
                                CAP_KILL,   CAP_SYS_CHROOT,   CAP_NET_BIND_SERVICE, CAP_AUDIT_WRITE};

static __attribute__((noreturn)) void child_fail(int sync_fd, const char *step) {
  struct child_report r = {.err = errno};
  size_t n = strlen(step);
  if (n >= sizeof(r.step))
    n = sizeof(r.step) - 1;
  memcpy(r.step, step, n);
  if (write(sync_fd, &r, sizeof(r)) < 0) {
    /* nothing left to tell */
  }
  _exit(1);
}

#define CHECK(expr, step)                                                                                    \
  do {                                                                                                       \
    if ((expr) < 0)                                                                                          \
      child_fail(c->sync_fd, step);                                                                          \
  } while (0)

static int touch_file(const char *path, mode_t mode) {
  int fd = open(path, O_CREAT | O_WRONLY | O_CLOEXEC | O_NOFOLLOW, mode);
  if (fd < 0)
    return -1;
  close(fd);
  return 0;
}

/* Binds the share's null over a file, or an empty read-only tmpfs over a directory, if it exists. The
 * first masked directory gets the tmpfs (*dir_mask is then set to it); the others get read-only
 * bind mounts of that one, so that a checkpoint carries one empty tmpfs, not one per path (CRIU
 * archives every tmpfs's contents on dump and unpacks them on restore: ~4 ms each). */
static int mask_path(const char *path, const char **dir_mask) {
  struct stat st;
  if (lstat(path, &st) < 0)
    return errno == ENOENT ? 0 : -1;
  if (!S_ISDIR(st.st_mode))
    return mount(MOAT_SHARE_DIR "/" MOAT_SHARE_NULL, path, NULL, MS_BIND, NULL);
  const unsigned long ro = MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC;
  if (!*dir_mask) {
    if (mount("tmpfs", path, "tmpfs", ro, "size=0,mode=000") < 0)
      return -1;
    *dir_mask = path;
    return 0;
  }
  if (mount(*dir_mask, path, NULL, MS_BIND, NULL) < 0)
    return -1;
  return mount(NULL, path, NULL, MS_BIND | MS_REMOUNT | ro, NULL);
}

static int readonly_path(const char *path) {
  if (access(path, F_OK) < 0)
    return errno == ENOENT ? 0 : -1;
  if (mount(path, path, NULL, MS_BIND | MS_REC, NULL) < 0)
    return -1;
  return mount(NULL, path, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
}

static void setup_dev(struct child_ctx *c) {
  CHECK(mount("tmpfs", "root/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=755,size=65536k,nr_inodes=4096"),
        "mount /dev");
  /* the nodes of the share (share.h), read-only binds: they open as devices do on a read-only
   * mount (writes go to the device), but cannot be removed, chmod'ed or replaced */
  char src[64], dst[64];
  for (size_t i = 0; moat_share_devs[i]; i++) {
    snprintf(src, sizeof(src), MOAT_SHARE_DIR "/%s", moat_share_devs[i]);
    snprintf(dst, sizeof(dst), "root/dev/%s", moat_share_devs[i]);
    CHECK(touch_file(dst, 0666), "create /dev node");
    CHECK(mount(src, dst, NULL, MS_BIND, NULL), "bind /dev node");
  }
  CHECK(mkdir("root/dev/pts", 0755), "mkdir /dev/pts");
  /* max=: every devpts instance but the host's draws on one pool (kernel.pty.max less
   * kernel.pty.reserve); a sandbox takes at most MOAT_SANDBOX_PTYS of it */
  char pts_opts[96];
  snprintf(pts_opts, sizeof(pts_opts), "newinstance,ptmxmode=0666,mode=0620,max=%d", MOAT_SANDBOX_PTYS);
  CHECK(mount("devpts", "root/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, pts_opts), "mount /dev/pts");
  CHECK(symlink("pts/ptmx", "root/dev/ptmx"), "symlink /dev/ptmx");
  CHECK(mkdir("root/dev/shm", 01777), "mkdir /dev/shm");
  CHECK(mount("shm", "root/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777,size=65536k"),
        "mount /dev/shm");
  CHECK(mkdir("root/dev/mqueue", 0755), "mkdir /dev/mqueue");
  CHECK(mount("mqueue", "root/dev/mqueue", "mqueue", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL), "mount mqueue");
  CHECK(symlink("/proc/self/fd", "root/dev/fd"), "symlink /dev/fd");
  CHECK(symlink("/proc/self/fd/0", "root/dev/stdin"), "symlink /dev/stdin");
  CHECK(symlink("/proc/self/fd/1", "root/dev/stdout"), "symlink /dev/stdout");
  CHECK(symlink("/proc/self/fd/2", "root/dev/stderr"), "symlink /dev/stderr");
}

/* The image's own mount points, direct children of the new root (the overlay just mounted, so
 * nothing on the way can be a link): made (into the writable layer) when the image lacks them, as
 * an imported image may; anything but a directory there fails the create, never followed. */
static void image_mountpoints(struct child_ctx *c) {
  static const char *const dirs[] = {"root/proc", "root/sys", "root/dev", "root/run"};
  for (size_t i = 0; i < ARRAY_SIZE(dirs); i++) {
    struct stat st;
    if (lstat(dirs[i], &st) == 0) {
      if (!S_ISDIR(st.st_mode)) {
        errno = ENOTDIR;
        child_fail(c->sync_fd, "the image's mount point (/proc, /sys, /dev or /run) is not a directory");
      }
      continue;
    }
    if (errno != ENOENT || mkdir(dirs[i], 0755) < 0)
      child_fail(c->sync_fd, "make a mount point the image lacks (/proc, /sys, /dev or /run)");
  }
}

static void setup_proc_sys(struct child_ctx *c) {
  CHECK(mount("proc", "root/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL), "mount /proc");
  CHECK(mount("sysfs", "root/sys", "sysfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL),
        "mount /sys");
  static const char *masked[] = {
      "root/proc/kcore",       "root/proc/keys",           "root/proc/key-users",  "root/proc/timer_list",
      "root/proc/sched_debug", "root/proc/latency_stats",  "root/proc/kallsyms",   "root/proc/kmsg",
      "root/proc/acpi",        "root/proc/scsi",           "root/proc/asound",     "root/proc/driver",
      "root/sys/firmware",     "root/sys/kernel/security", "root/sys/kernel/debug"};
  const char *dir_mask = NULL;
  for (size_t i = 0; i < ARRAY_SIZE(masked); i++)
    CHECK(mask_path(masked[i], &dir_mask), "mask a /proc or /sys path");
  static const char *ro[] = {"root/proc/sys", "root/proc/sysrq-trigger", "root/proc/irq", "root/proc/bus",
                             "root/proc/fs"};
  for (size_t i = 0; i < ARRAY_SIZE(ro); i++)
    CHECK(readonly_path(ro[i]), "make a /proc path read-only");
  /* The sandbox's own files (view.h) over the machine's, from the share (share.h) in the slot
   * dir (our cwd); the targets are in the sysfs and proc mounted just now, which the rootfs
   * cannot redirect. */
  const unsigned long ro_flags = MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC;
  for (size_t i = 0; moat_view_files[i].name; i++) {
    char target[256], name[64], src[96];
    snprintf(target, sizeof(target), "root%s", moat_view_files[i].inside);
    moat_view_name(&moat_view_files[i], c->spec->view_cpus, name, sizeof(name));
    snprintf(src, sizeof(src), MOAT_SHARE_DIR "/%s", name);
    CHECK(mount(src, target, NULL, MS_BIND, NULL), "bind a view file");
    CHECK(mount(NULL, target, NULL, ro_flags, NULL), "make a view file read-only");
  }
  /* lxcfs (view.h): by the host's path, in our copy of the host's mount namespace */
  for (size_t i = 0; c->spec->lxcfs_dir && moat_lxcfs_files[i]; i++) {
    char src[4200], target[64];
    snprintf(src, sizeof(src), "%s/proc/%s", c->spec->lxcfs_dir, moat_lxcfs_files[i]);
    snprintf(target, sizeof(target), "root/proc/%s", moat_lxcfs_files[i]);
    CHECK(mount(src, target, NULL, MS_BIND, NULL), "bind an lxcfs file");
    CHECK(mount(NULL, target, NULL, ro_flags, NULL), "make an lxcfs file read-only");
  }
  /* /sys/fs/cgroup: the sandbox's own cgroups (cgroup.h), read-only, nothing else. */
  const struct moat_cgroup_view *v = c->cgview;
  if (v->n == 1 && !v->name[0][0]) {
    CHECK(mount("cgroup", "root/sys/fs/cgroup", NULL, MS_BIND, NULL), "bind the cgroup view");
    CHECK(mount(NULL, "root/sys/fs/cgroup", NULL, ro_flags, NULL), "make the cgroup view read-only");
    return;
  }
  CHECK(mount("tmpfs", "root/sys/fs/cgroup", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
              "mode=755,size=16k,nr_inodes=16"),
        "mount the cgroup view's tmpfs");
  for (int i = 0; i < v->n; i++) {
    char src[64], target[96];
    snprintf(src, sizeof(src), "cgroup/%s", v->name[i]);
    snprintf(target, sizeof(target), "root/sys/fs/cgroup/%s", v->name[i]);
    CHECK(mkdir(target, 0755), "mkdir in the cgroup view");
    CHECK(mount(src, target, NULL, MS_BIND, NULL), "bind a cgroup of the view");
    CHECK(mount(NULL, target, NULL, ro_flags, NULL), "make a cgroup of the view read-only");
  }
  CHECK(mount(NULL, "root/sys/fs/cgroup", NULL, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
              "mode=755,size=16k,nr_inodes=16"),
        "make the cgroup view's tmpfs read-only");
}

static void loopback_up(struct child_ctx *c) {
  int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  CHECK(s, "socket for lo");
  struct ifreq ifr;
  memset(&ifr, 0, sizeof(ifr));
  memcpy(ifr.ifr_name, "lo", 3);
  CHECK(ioctl(s, SIOCGIFFLAGS, &ifr), "get lo flags");
  ifr.ifr_flags |= IFF_UP;
  CHECK(ioctl(s, SIOCSIFFLAGS, &ifr), "bring lo up");
  close(s);
}

static void drop_caps(struct child_ctx *c) {
  int last = CAP_LAST_CAP;
  for (int cap = 0; cap <= last + 8; cap++) {
    bool keep = false;
    for (size_t i = 0; i < ARRAY_SIZE(kept_caps); i++)
      keep |= kept_caps[i] == cap;
    if (!keep && prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0 && errno != EINVAL)
      child_fail(c->sync_fd, "drop a capability from the bounding set");
  }
  CHECK(prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clear ambient capabilities");
  struct __user_cap_header_struct hdr = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
  struct __user_cap_data_struct data[2];
  memset(data, 0, sizeof(data));
  for (size_t i = 0; i < ARRAY_SIZE(kept_caps); i++) {
    data[kept_caps[i] / 32].effective |= 1u << (kept_caps[i] % 32);
    data[kept_caps[i] / 32].permitted |= 1u << (kept_caps[i] % 32);
  }
  CHECK(syscall(SYS_capset, &hdr, data), "capset");
}

/* Closes every inherited fd but stdio and our two: copies of moatd's sockets (the HTTP
 * listener, clients, other sandboxes' sync sockets) must not outlive moatd in a half-built child. */
static void close_other_fds(struct child_ctx *c) {
  int keep[3] = {c->sync_fd, c->ready_fd, c->ready_fd};
  for (int i = 0; i < 3; i++) /* sort three */
    for (int j = i + 1; j < 3; j++)
      if (keep[j] < keep[i]) {
        int t = keep[i];
        keep[i] = keep[j];
        keep[j] = t;
      }
  unsigned lo = 3;
  for (int i = 0; i < 3; i++) {
    if ((unsigned)keep[i] > lo)
      syscall(SYS_close_range, lo, (unsigned)keep[i] - 1, 0);
    if ((unsigned)keep[i] + 1 > lo)
      lo = (unsigned)keep[i] + 1;
  }
  syscall(SYS_close_range, lo, ~0U, 0);
}

/* Binds and listens on MOAT_GUEST_SOCK_INSIDE (in the new root, after pivot_root): the socket
 * file lands in the host's channel dir (spec->chan_dir), bound there by the sandbox's root. listen() here, in
 * the process that becomes the guest, makes it the socket's peer (SO_PEERCRED) for moatd's
 * connections. Returns the fd or fails the child. */
static int guest_listen_inside(struct child_ctx *c) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  memcpy(sa.sun_path, MOAT_GUEST_SOCK_INSIDE, sizeof(MOAT_GUEST_SOCK_INSIDE));
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  CHECK(fd, "guest socket");
  CHECK(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), "bind " MOAT_GUEST_SOCK_INSIDE);
  CHECK(chmod(MOAT_GUEST_SOCK_INSIDE, 0600), "chmod guest socket");
  CHECK(listen(fd, 128), "listen on the guest socket");
  return fd;
}

/* Waits for the parent's go: uid map written, cgroups joined, mounts attached in our namespace. */
static void wait_go(struct child_ctx *c) {
  char byte;
  ssize_t r;
  do
    r = read(c->sync_fd, &byte, 1);
  while (r < 0 && errno == EINTR);
  if (r != 1) /* parent gave up */
    _exit(1);
}

static __attribute__((noreturn)) void child_main(struct child_ctx *c) {
  /* Until the guest runs, die with the thread that created us (it waits for our ready byte). */
  prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
  close_other_fds(c);
  wait_go(c); /* lower/ (idmapped template), disk/ (writable layer) and share/ are attached now */
  /* Still the host's root's filesystem uid here (moat_userns_clone3 switched only the euid): enter
   * the slot dir (0711, beneath root's 0700 data dir) before becoming the range's root. */
  /* By path, in our own mount namespace: an fd from before clone points into the host's. */
  CHECK(chdir(c->spec->slot_dir), "enter slot dir");
  /* Raw syscalls: glibc's set*id wrappers broadcast to the threads it believes exist (this is
   * a clone3 child of a multi-threaded process) and block on a lock one of them held. */
  CHECK(syscall(SYS_setresgid, 0, 0, 0), "setresgid");
  CHECK(syscall(SYS_setgroups, 0, NULL), "setgroups");
  CHECK(syscall(SYS_setresuid, 0, 0, 0), "setresuid");
  CHECK(unshare(CLONE_NEWCGROUP), "unshare cgroup namespace");
  CHECK(mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL), "make / private");
  CHECK(mount("overlay", "root", "overlay", MS_NODEV,
              "lowerdir=lower,upperdir=disk/upper,workdir=disk/work,userxattr"),
        "mount overlay root");
  image_mountpoints(c);
  setup_proc_sys(c);
  setup_dev(c);
  CHECK(mount("tmpfs", "root/run", "tmpfs", MS_NOSUID | MS_NODEV, "mode=755,size=16384k"), "mount /run");
  CHECK(mkdir("root/run/moat", 0755), "mkdir /run/moat");
  CHECK(touch_file("root/run/moat/moat-guest", 0755), "create /run/moat/moat-guest");
  CHECK(mount(MOAT_SHARE_DIR "/" MOAT_SHARE_GUEST, "root/run/moat/moat-guest", NULL, MS_BIND, NULL),
        "bind guest");
  /* The guest channel's directory is the host's spec->chan_dir: a mount point inside (the sandbox
   * can neither move nor remove it), a directory of the host's outside, where moatd connects. */
  CHECK(mkdir("root" MOAT_GUEST_SOCK_DIR, 0755), "mkdir " MOAT_GUEST_SOCK_DIR);
  CHECK(mount(c->spec->chan_dir, "root" MOAT_GUEST_SOCK_DIR, NULL, MS_BIND, NULL),
        "bind " MOAT_GUEST_SOCK_DIR);
  CHECK(mount(NULL, "root" MOAT_GUEST_SOCK_DIR, NULL, MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NODEV | MS_NOEXEC,
              NULL),
        "remount " MOAT_GUEST_SOCK_DIR);
  CHECK(sethostname("sandbox", 7), "sethostname");
  loopback_up(c);
  CHECK(chdir("root"), "enter new root");
  CHECK(syscall(SYS_pivot_root, ".", "."), "pivot_root");
  CHECK(umount2(".", MNT_DETACH), "detach old root");
  CHECK(chdir("/"), "chdir /");
  c->listen_fd = guest_listen_inside(c);
  /* fds: 0-2 /dev/null, 3 listening socket, 4 ready pipe, nothing else. */
  int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
  CHECK(devnull, "open /dev/null");
  /* Move the four fds above all of them first, so that placing them at 0..5 clobbers none. */
  int hi = devnull;
  if (c->listen_fd > hi)
    hi = c->listen_fd;
  if (c->ready_fd > hi)
    hi = c->ready_fd;
  if (c->sync_fd > hi)
    hi = c->sync_fd;
  hi++;
  CHECK(dup3(c->sync_fd, hi + 2, O_CLOEXEC), "dup sync fd");
  c->sync_fd = hi + 2;
  CHECK(dup3(c->listen_fd, hi, O_CLOEXEC), "dup listen fd");
  CHECK(dup3(c->ready_fd, hi + 1, O_CLOEXEC), "dup ready fd");
  CHECK(dup3(devnull, hi + 3, O_CLOEXEC), "dup /dev/null");
  CHECK(dup3(hi + 3, 0, 0), "dup stdin");
  CHECK(dup3(hi + 3, 1, 0), "dup stdout");
  CHECK(dup3(hi + 3, 2, 0), "dup stderr");
  CHECK(dup3(hi, 3, 0), "place listen fd");
  CHECK(dup3(hi + 1, 4, 0), "place ready fd");
  CHECK(dup3(hi + 2, 5, O_CLOEXEC), "place sync fd");
  c->sync_fd = 5;
  CHECK(syscall(SYS_close_range, 6, ~0U, 0), "close inherited fds");
  /* The filter goes in while CAP_SYS_ADMIN is still ours (no no_new_privs: setuid programs such
   * as su keep working inside); capset and prctl are not in the deny-list. */
  int r = moat_seccomp_install(c->spec->seccomp);
  if (r < 0) {
    errno = -r;
    child_fail(c->sync_fd, "install seccomp filter");
  }
  CHECK(moat_userns_set_rlimits(), "set rlimits");
  drop_caps(c);
  char *argv[] = {"moat-guest", NULL};
  char *envp[] = {"MOAT_GUEST_LISTEN_FD=3", "MOAT_GUEST_READY_FD=4",
                  "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", NULL};
  prctl(PR_SET_PDEATHSIG, 0, 0, 0, 0); /* the sandbox outlives moatd from here on */
  execve("/run/moat/moat-guest", argv, envp);
  child_fail(c->sync_fd, "exec moat-guest");
}

uint64_t moat_proc_start_time(pid_t pid) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  _cleanup_free_ char *s = NULL;
  if (read_file(path, &s, NULL, NULL) < 0)
    return 0;
  char *p = strrchr(s, ')'); /* comm may hold spaces and parentheses */
  if (!p)
    return 0;
  /* after ") " come fields 3.. ; start time is field 22 */
  int field = 2;
  for (char *q = p + 1; *q; q++) {
    if (*q == ' ' && ++field == 22)
      return strtoull(q + 1, NULL, 10);
  }
  return 0;
}

static int write_id_maps(pid_t pid, uid_t base, moat_error **err) {
  char path[64], map[64];
  snprintf(map, sizeof(map), "0 %u %u\n", base, MOAT_UID_RANGE);
  snprintf(path, sizeof(path), "/proc/%d/uid_map", pid);
  if (write_file(path, map, err) < 0)
    return -1;
  snprintf(path, sizeof(path), "/proc/%d/gid_map", pid);
  return write_file(path, map, err);
}

/* Enters the sandbox's mount namespace (as the host's root, whose capabilities cover the
 * sandbox's user namespace, a child of the initial one) and attaches the
 * detached mounts at SLOT/lower, SLOT/disk and SLOT/share: a detached mount cannot be attached
 * from inside the sandbox's user namespace. Runs in a vfork child: syscalls only. */
static int attach_mounts(pid_t pid, const char *slot_dir, const int fds[3],
                         const struct moat_cgroup_view *cgv, moat_error **err) {
  static const char *names[] = {"lower", "disk", MOAT_SHARE_DIR};
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/ns/mnt", pid);
  _cleanup_close_ int mntns = open(path, O_RDONLY | O_CLOEXEC);
  if (mntns < 0)
    return moat_error_errno(err, "open %s", path);
  char targets[3 + MOAT_CGROUP_VIEW_MAX][4096 + 32];
  int all[3 + MOAT_CGROUP_VIEW_MAX];
  volatile int n = 0; /* read by the vfork child */
  for (int i = 0; i < 3; i++, n++) {
    snprintf(targets[n], sizeof(targets[n]), "%s/%s", slot_dir, names[i]);
    all[n] = fds[i];
  }
  for (int i = 0; i < cgv->n; i++, n++) {
    snprintf(targets[n], sizeof(targets[n]), "%s/cgroup%s%s", slot_dir, cgv->name[i][0] ? "/" : "",
             cgv->name[i]);
    all[n] = cgv->fd[i];
  }
  volatile int failed_errno = 0, failed_index = 0;
  pid_t h = vfork();
  if (h < 0)
    return moat_error_errno(err, "vfork mount helper");
  if (h == 0) {
    if (setns(mntns, CLONE_NEWNS) < 0) {
      failed_errno = errno;
      failed_index = -1;
      _exit(1);
    }
    for (int i = 0; i < n; i++)
      if (move_mount(all[i], "", AT_FDCWD, targets[i], MOVE_MOUNT_F_EMPTY_PATH) < 0) {
        failed_errno = errno;
        failed_index = i;
        _exit(1);
      }
    _exit(0);
  }
  int status;
  while (waitpid(h, &status, __WALL) < 0)
    if (errno != EINTR)
      return moat_error_errno(err, "wait mount helper");
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    static const char *what[] = {"template", "disk", "share"};
    errno = failed_errno ? failed_errno : EIO;
    return moat_error_errno(err, "attach %s",
                            failed_index < 0   ? "(setns)"
                            : failed_index < 3 ? what[failed_index]
                                               : "a cgroup of the view");
  }
  return 0;
}

/* In a vfork child that enters mntns: replaces the mount on each targets[i] by fds[i]. 0 or -1. */
static int move_over(int mntns, const int *fds, const char *const *targets, int n, moat_error **err) {
  volatile int failed_errno = 0, failed_index = -1; /* written by the vfork child */
  pid_t hp = vfork();
  if (hp < 0)
    return moat_error_errno(err, "vfork mount helper");
  if (hp == 0) {
    if (setns(mntns, CLONE_NEWNS) < 0) {
      failed_errno = errno;
      _exit(1);
    }
    for (int i = 0; i < n; i++)
      if (umount2(targets[i], MNT_DETACH) < 0 ||
          move_mount(fds[i], "", AT_FDCWD, targets[i], MOVE_MOUNT_F_EMPTY_PATH) < 0) {
        failed_errno = errno;
        failed_index = i;
        _exit(1);
      }
    _exit(0);
  }
  int status;
  while (waitpid(hp, &status, __WALL) < 0)
    if (errno != EINTR)
      return moat_error_errno(err, "wait mount helper");
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    errno = failed_errno ? failed_errno : EIO;
    return moat_error_errno(err, "rebind %s", failed_index < 0 ? "(setns)" : targets[failed_index]);
  }
  return 0;
}

int moat_shell_view_rebind(pid_t pid, int share_fd, unsigned cpus, moat_error **err) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/ns/mnt", pid);
  _cleanup_close_ int mntns = open(path, O_RDONLY | O_CLOEXEC);
  if (mntns < 0)
    return moat_error_errno(err, "open %s", path);
  int fds[MOAT_VIEW_FILES];
  const char *targets[MOAT_VIEW_FILES];
  int n = 0, ret = -1;
  for (int i = 0; moat_view_files[i].name; i++) {
    if (!moat_view_files[i].per_cpu)
      continue;
    char name[64];
    moat_view_name(&moat_view_files[i], cpus, name, sizeof(name));
    int fd = open_tree(share_fd, name, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
    struct mount_attr attr = {.attr_set = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV |
                                          MOUNT_ATTR_NOEXEC};
    if (fd < 0 || mount_setattr(fd, "", AT_EMPTY_PATH, &attr, sizeof(attr)) < 0) {
      moat_error_errno(err, "clone the share's %s", name);
      if (fd >= 0)
        close(fd);
      goto out;
    }
    fds[n] = fd;
    targets[n++] = moat_view_files[i].inside;
  }
  ret = move_over(mntns, fds, targets, n, err);
out:
  for (int i = 0; i < n; i++)
    close(fds[i]);
  return ret;
}

int moat_shell_idmapped_template(const char *rootfs, pid_t pid, moat_error **err) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/ns/user", pid);
  _cleanup_close_ int userns = open(path, O_RDONLY | O_CLOEXEC);
  if (userns < 0)
    return moat_error_errno(err, "open %s", path);
  _cleanup_close_ int fd = open_tree(AT_FDCWD, rootfs, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
  if (fd < 0)
    return moat_error_errno(err, "open_tree %s", rootfs);
  struct mount_attr attr = {.attr_set = MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY | MOUNT_ATTR_NODEV,
                            .userns_fd = (uint64_t)userns};
  if (mount_setattr(fd, "", AT_EMPTY_PATH, &attr, sizeof(attr)) < 0)
    return moat_error_errno(err, "idmap %s", rootfs);
  return steal_fd(&fd);
}

int moat_shell_cgroup_view(const char *slot_dir, struct moat_cgroups *cg, int slot,
                           struct moat_cgroup_view *out, moat_error **err) {
  if (moat_cgroup_view_open(cg, slot, out, err) < 0)
    return -1;
  _cleanup_free_ char *top = xasprintf("%s/cgroup", slot_dir);
  if (mkdir(top, 0755) < 0 && errno != EEXIST)
    goto fail;
  for (int i = 0; i < out->n; i++) {
    if (!out->name[i][0])
      continue;
    _cleanup_free_ char *d = xasprintf("%s/%s", top, out->name[i]);
    if (mkdir(d, 0755) < 0 && errno != EEXIST)
      goto fail;
  }
  return 0;
fail:
  moat_error_errno(err, "mount points of the cgroup view in %s", slot_dir);
  moat_cgroup_view_close(out);
  return -1;
}

int moat_shell_chan_prepare(const char *dir, uid_t uid_base, moat_error **err) {
  if (rm_rf(dir, err) < 0)
    return -1;
  if (mkdir(dir, 0700) < 0)
    return moat_error_errno(err, "mkdir %s", dir);
  if (chown(dir, uid_base, uid_base) < 0)
    return moat_error_errno(err, "chown %s", dir);
  return 0;
}

int moat_shell_chan_lock(const char *dir, moat_error **err) {
  _cleanup_close_ int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0)
    return moat_error_errno(err, "open %s", dir);
  struct stat st;
  if (fstatat(fd, "guest.sock", &st, AT_SYMLINK_NOFOLLOW) < 0)
    return moat_error_errno(err, "stat %s/guest.sock", dir);
  if (!S_ISSOCK(st.st_mode))
    return moat_error_set(err, EPERM, "%s/guest.sock is not a socket", dir);
  if (fchown(fd, 0, 0) < 0 || fchmod(fd, 0700) < 0)
    return moat_error_errno(err, "lock %s", dir);
  return 0;
}

void moat_shell_chan_ep(const struct moat_guest_channel *ch, const char *chan_dir, pid_t pid, uid_t uid_base,
                        const char *frozen_path, struct moat_guest_ep *out) {
  memset(out, 0, sizeof(*out));
  out->ch = ch;
  snprintf(out->path, sizeof(out->path), "%s/guest.sock", chan_dir);
  out->pid = pid;
  out->uid = uid_base;
  if (frozen_path)
    snprintf(out->frozen_path, sizeof(out->frozen_path), "%s", frozen_path);
}

/* Waits for the guest's ready byte or the child's failure report. */
static int wait_ready(int ready_fd, int sync_fd, int pidfd, moat_error **err) {
  struct pollfd p[2] = {{.fd = ready_fd, .events = POLLIN}, {.fd = sync_fd, .events = POLLIN}};
  uint64_t deadline = now_ns() + 60ull * 1000000000ull;
  for (;;) {
    uint64_t now = now_ns();
    if (now >= deadline)
      return moat_error_set(err, ETIMEDOUT, "sandbox init did not become ready in 60 s");
    int r = poll(p, 2, (int)((deadline - now) / 1000000ull) + 1);
    if (r < 0 && errno != EINTR)
      return moat_error_errno(err, "poll");
    if (r <= 0)
      continue;
    if (p[1].revents & POLLIN) {
      struct child_report rep;
      ssize_t n = read(sync_fd, &rep, sizeof(rep));
      if (n == (ssize_t)sizeof(rep)) {
        rep.step[sizeof(rep.step) - 1] = '\0';
        return moat_error_set(err, rep.err ? rep.err : EIO, "sandbox init: %s: %s", rep.step,
                              strerror(rep.err));
      }
    }
    if (p[0].revents & (POLLIN | POLLHUP)) {
      char b;
      ssize_t n = read(ready_fd, &b, 1);
      if (n == 1 && b == 'R')
        return 0;
      return moat_error_set(err, EIO, "moat-guest exited before it was ready");
    }
    if (p[1].revents & (POLLHUP | POLLERR))
      p[1].fd = -1;
    (void)pidfd;
  }
}

int moat_shell_create(const struct moat_shell_spec *spec, struct moat_shell *out, moat_error **err) {
  uint64_t t0 = now_ns();
  int disk_fd = spec->disk_fd;
  _cleanup_close_ int keep_disk = -1, slot_fd = -1, cg_fd = -1, pidfd = -1, lower_fd = -1, share_fd = -1;
  int sync[2] = {-1, -1}, ready[2] = {-1, -1};
  pid_t pid = -1;
  int ret = -1;
  struct moat_cgroup_view cgv = {0};

  slot_fd = open(spec->slot_dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (slot_fd < 0) {
    moat_error_errno(err, "open %s", spec->slot_dir);
    goto out;
  }
  if (moat_shell_chan_prepare(spec->chan_dir, spec->uid_base, err) < 0)
    goto out;
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sync) < 0 || pipe2(ready, O_CLOEXEC) < 0) {
    moat_error_errno(err, "socketpair/pipe");
    goto out;
  }
  cg_fd = moat_cgroup_create(spec->cgroups, spec->slot, spec->limits, err);
  if (cg_fd < 0 || moat_shell_cgroup_view(spec->slot_dir, spec->cgroups, spec->slot, &cgv, err) < 0)
    goto out;

  struct clone_args args;
  memset(&args, 0, sizeof(args));
  args.flags = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWUTS | CLONE_NEWIPC |
               CLONE_PIDFD | CLONE_INTO_CGROUP;
  args.pidfd = (uint64_t)(uintptr_t)&pidfd;
  args.exit_signal = SIGCHLD;
  args.cgroup = (uint64_t)cg_fd;
  struct child_ctx ctx = {.spec = spec,
                          .sync_fd = sync[1],
                          .slot_fd = slot_fd,
                          .listen_fd = -1,
                          .ready_fd = ready[1],
                          .cgview = &cgv};
  /* the sandbox's uid owns its user namespace: its per-user kernel counts are its own */
  pid = moat_userns_clone3(&args, spec->uid_base);
  if (pid < 0) {
    moat_error_errno(err, "clone3");
    goto out;
  }
  if (pid == 0)
    child_main(&ctx);
  close(sync[1]);
  sync[1] = -1;
  close(ready[1]);
  ready[1] = -1;

  if (write_id_maps(pid, spec->uid_base, err) < 0 ||
      moat_cgroup_attach_v1(spec->cgroups, spec->slot, pid, err) < 0)
    goto fail;
  lower_fd = moat_shell_idmapped_template(spec->rootfs, pid, err);
  if (lower_fd < 0)
    goto fail;
  share_fd = moat_share_clone(spec->share_fd, err);
  if (share_fd < 0)
    goto fail;
  keep_disk = fcntl(disk_fd, F_DUPFD_CLOEXEC, 3);
  if (keep_disk < 0) {
    moat_error_errno(err, "dup disk mount");
    goto fail;
  }
  int fds[3] = {lower_fd, disk_fd, share_fd};
  if (attach_mounts(pid, spec->slot_dir, fds, &cgv, err) < 0)
    goto fail;
  if (write(sync[0], "G", 1) != 1) {
    moat_error_errno(err, "start sandbox init");
    goto fail;
  }
  if (wait_ready(ready[0], sync[0], pidfd, err) < 0 || moat_shell_chan_lock(spec->chan_dir, err) < 0)
    goto fail;
  out->pid = pid;
  out->pidfd = steal_fd(&pidfd);
  out->start_time = moat_proc_start_time(pid);
  out->build_ns = now_ns() - t0;
  out->disk_fd = steal_fd(&keep_disk);
  ret = 0;
  goto out;

fail:
  moat_error_wrap(err, "create sandbox in slot %d", spec->slot);
  syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, NULL, 0);
  while (waitpid(pid, NULL, __WALL) < 0 && errno == EINTR)
    ;
out:
  if (ret < 0) {
    moat_cgroup_kill(spec->cgroups, spec->slot, 2000, NULL);
    moat_cgroup_remove(spec->cgroups, spec->slot, NULL);
  }
  moat_cgroup_view_close(&cgv);
  if (disk_fd >= 0)
    close(disk_fd);
  for (int i = 0; i < 2; i++) {
    if (sync[i] >= 0)
      close(sync[i]);
    if (ready[i] >= 0)
      close(ready[i]);
  }
  return ret;
}

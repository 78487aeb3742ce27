/* share.c -- the read-only tmpfs every sandbox takes its device nodes, view files and guest
 * binary from (share.h), and the machine's tmpfs of guest channel dirs */
#include "share.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/mount.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <dirent.h>
#include <unistd.h>

#include "../../common/log.h"
#include "../../common/util.h"
#include "shell.h"
#include "view.h"

const char *const moat_share_devs[MOAT_SHARE_DEVS + 1] = {"null",    "zero", "full", "random",
                                                          "urandom", "tty",  NULL};

static int copy_guest(int dfd, const char *guest_path, moat_error **err) {
  _cleanup_close_ int in = open(guest_path, O_RDONLY | O_CLOEXEC);
  if (in < 0)
    return moat_error_errno(err, "open %s", guest_path);
  struct stat st;
  if (fstat(in, &st) < 0)
    return moat_error_errno(err, "stat %s", guest_path);
  _cleanup_close_ int out = openat(dfd, MOAT_SHARE_GUEST, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0755);
  if (out < 0)
    return moat_error_errno(err, "create " MOAT_SHARE_GUEST);
  for (off_t done = 0; done < st.st_size;) {
    ssize_t n = sendfile(out, in, NULL, (size_t)(st.st_size - done));
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return moat_error_errno(err, "copy %s", guest_path);
    done += n;
  }
  return 0;
}

int moat_share_make(const char *guest_path, moat_error **err) {
  _cleanup_close_ int fs = fsopen("tmpfs", FSOPEN_CLOEXEC);
  if (fs < 0)
    return moat_error_errno(err, "share: fsopen tmpfs");
  /* size=0: no block limit, so statfs says f_blocks 0 and df lists none of its binds. Unbounded
   * costs nothing: its superblock is made read-only below, before any sandbox sees it. */
  if (fsconfig(fs, FSCONFIG_SET_STRING, "source", MOAT_SHARE_SOURCE, 0) < 0 ||
      fsconfig(fs, FSCONFIG_SET_STRING, "size", "0", 0) < 0 ||
      fsconfig(fs, FSCONFIG_SET_STRING, "mode", "0755", 0) < 0 ||
      fsconfig(fs, FSCONFIG_CMD_CREATE, NULL, NULL, 0) < 0)
    return moat_error_errno(err, "share: make tmpfs");
  _cleanup_close_ int mnt = fsmount(fs, FSMOUNT_CLOEXEC, MOUNT_ATTR_NOSUID);
  if (mnt < 0)
    return moat_error_errno(err, "share: fsmount");
  /* the host's own device numbers; nodev stays off: the binds inside are the sandbox's /dev */
  for (int i = 0; moat_share_devs[i]; i++) {
    char path[64];
    struct stat st;
    snprintf(path, sizeof(path), "/dev/%s", moat_share_devs[i]);
    if (stat(path, &st) < 0 || !S_ISCHR(st.st_mode))
      return moat_error_set(err, errno ? errno : ENODEV, "share: %s is not a character device", path);
    if (mknodat(mnt, moat_share_devs[i], S_IFCHR | 0666, st.st_rdev) < 0 ||
        fchmodat(mnt, moat_share_devs[i], 0666, 0) < 0) /* past the umask */
      return moat_error_errno(err, "share: mknod %s", moat_share_devs[i]);
  }
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  if (moat_view_fill(mnt, cpus > 0 ? (unsigned)cpus : 1, err) < 0 || copy_guest(mnt, guest_path, err) < 0)
    return moat_error_wrap(err, "share");
  _cleanup_close_ int pick = fspick(mnt, "", FSPICK_EMPTY_PATH | FSPICK_CLOEXEC);
  if (pick < 0 || fsconfig(pick, FSCONFIG_SET_FLAG, "ro", NULL, 0) < 0 ||
      fsconfig(pick, FSCONFIG_CMD_RECONFIGURE, NULL, NULL, 0) < 0)
    return moat_error_errno(err, "share: make the superblock read-only");
  struct mount_attr attr = {.attr_set = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID};
  if (mount_setattr(mnt, "", AT_EMPTY_PATH, &attr, sizeof(attr)) < 0)
    return moat_error_errno(err, "share: make the mount read-only");
  return steal_fd(&mnt);
}

int moat_share_clone(int share_fd, moat_error **err) {
  int fd = open_tree(share_fd, "", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH);
  if (fd < 0)
    return moat_error_errno(err, "clone the share");
  return fd;
}

static bool is_mount_root(const char *path) {
  struct statx sx;
  if (statx(AT_FDCWD, path, AT_SYMLINK_NOFOLLOW, STATX_BASIC_STATS, &sx) < 0)
    return false;
  return (sx.stx_attributes_mask & STATX_ATTR_MOUNT_ROOT) && (sx.stx_attributes & STATX_ATTR_MOUNT_ROOT);
}

/* The machine's mount namespace: pid 1's, or (pid 1 out of sight) the one with the initial
 * namespace's fixed inode number (PROC_MNT_INIT_INO, kernels since 6.15). */
static bool in_initial_mount_ns(void) {
  struct stat a, b;
  if (stat("/proc/self/ns/mnt", &a) < 0)
    return false;
  if (stat("/proc/1/ns/mnt", &b) == 0)
    return a.st_ino == b.st_ino && a.st_dev == b.st_dev;
  return a.st_ino == 0xEFFFFFF8u;
}

static bool dir_empty(const char *path) {
  DIR *d = opendir(path);
  if (!d)
    return errno == ENOENT;
  struct dirent *de;
  bool empty = true;
  while (empty && (de = readdir(d)) != NULL)
    empty = !strcmp(de->d_name, ".") || !strcmp(de->d_name, "..");
  closedir(d);
  return empty;
}

/* Mounts the tmpfs on MOAT_CHAN_ROOT unless it is a mount point already. True when it is one. */
static bool chan_tmpfs(moat_error **err) {
  if (is_mount_root(MOAT_CHAN_ROOT))
    return true;
  if (!in_initial_mount_ns())
    return false; /* a mount here would be this namespace's alone */
  /* one moatd at a time decides, so that two starting together mount one tmpfs, not two stacked */
  _cleanup_close_ int lock = open("/run/moat/.channels.lock", O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock < 0 || flock(lock, LOCK_EX) < 0) {
    moat_error_errno(err, "lock /run/moat/.channels.lock");
    return false;
  }
  if (is_mount_root(MOAT_CHAN_ROOT))
    return true;
  if (!dir_empty(MOAT_CHAN_ROOT)) { /* channel dirs of sandboxes alive: never hide them */
    moat_error_set(err, EEXIST, MOAT_CHAN_ROOT " is not empty");
    return false;
  }
  /* size=0 (df lists no bind of it): only the host's root writes here (directories, and the
   * guests' sockets, which take no blocks); each slot's dir is root's and 0700 from the guest's
   * first answer on (moat_shell_chan_lock) */
  if (mount("moat-channels", MOAT_CHAN_ROOT, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=0,mode=0711") <
      0) {
    moat_error_errno(err, "mount a tmpfs on " MOAT_CHAN_ROOT);
    return false;
  }
  return true;
}

char *moat_share_chan_base(const char *instance, moat_error **err) {
  _cleanup_free_ char *legacy = xasprintf(MOAT_CHAN_ROOT_LEGACY "/%s", instance);
  if (!dir_empty(legacy)) /* sandboxes of a moatd from before the tmpfs: they keep their sockets */
    return steal_pointer(&legacy);
  if (mkdir_p(MOAT_CHAN_ROOT, 0711, err) < 0)
    return NULL;
  moat_error *e = NULL;
  bool tmpfs = chan_tmpfs(&e);
  if (!tmpfs && e) {
    log_warn("guest channels: %s", moat_error_msg(e));
    moat_error_free(&e);
  }
  char *base = xasprintf("%s/%s", tmpfs ? MOAT_CHAN_ROOT : MOAT_CHAN_ROOT_LEGACY, instance);
  if (mkdir_p(base, 0711, err) < 0) {
    free(base);
    return NULL;
  }
  /* the sandboxes' roots (and CRIU restoring them) pass through to their channel dirs */
  chmod(tmpfs ? MOAT_CHAN_ROOT : MOAT_CHAN_ROOT_LEGACY, 0711);
  chmod(base, 0711);
  return base;
}

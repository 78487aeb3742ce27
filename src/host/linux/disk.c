/* disk.c -- sparse ext4 images on autoclear loop devices, mounted with the new mount API */
#include "disk.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/loop.h>
#include <pthread.h>
#include <stdlib.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <linux/dqblk_xfs.h>
#include <linux/fs.h>
#include <sys/mount.h>
#include <sys/quota.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../common/fault.h"
#include "../../common/util.h"

extern char **environ;

static int run_mkfs(const char *img, moat_error **err) {
  char *argv[] = {"mkfs.ext4", "-q", "-F", "-O",   "^has_journal", "-E", "lazy_itable_init=1,nodiscard",
                  "-m",        "0",  "-b", "4096", (char *)img,    NULL};
  static const char *paths[] = {"/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4"};
  const char *bin = NULL;
  for (size_t i = 0; i < ARRAY_SIZE(paths) && !bin; i++)
    if (access(paths[i], X_OK) == 0)
      bin = paths[i];
  if (!bin)
    return moat_error_set(err, ENOENT, "mkfs.ext4 not found (install e2fsprogs)");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  pid_t pid;
  int r = posix_spawn(&pid, bin, &fa, NULL, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  if (r != 0) {
    errno = r;
    return moat_error_errno(err, "spawn %s", bin);
  }
  int status;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR)
      return moat_error_errno(err, "wait mkfs.ext4");
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return moat_error_set(err, EIO, "mkfs.ext4 %s failed (status %d)", img, status);
  return 0;
}

/* Attaches img to a free loop device with autoclear. Returns the loop fd and its path. */
static int loop_attach(int img_fd, char *path, size_t path_len, moat_error **err) {
  _cleanup_close_ int ctl = open("/dev/loop-control", O_RDWR | O_CLOEXEC);
  if (ctl < 0)
    return moat_error_errno(err, "open /dev/loop-control");
  for (int tries = 0; tries < 64; tries++) {
    int n = ioctl(ctl, LOOP_CTL_GET_FREE);
    if (n < 0)
      return moat_error_errno(err, "LOOP_CTL_GET_FREE");
    snprintf(path, path_len, "/dev/loop%d", n);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT) /* udev-less hosts: make the node ourselves */
        if (mknod(path, S_IFBLK | 0600, makedev(7, (unsigned)n)) == 0 || errno == EEXIST)
          fd = open(path, O_RDWR | O_CLOEXEC);
      if (fd < 0)
        return moat_error_errno(err, "open %s", path);
    }
    struct loop_config cfg = {0};
    cfg.fd = (unsigned)img_fd;
    cfg.block_size = 4096;
    cfg.info.lo_flags = LO_FLAGS_AUTOCLEAR | LO_FLAGS_DIRECT_IO;
    if (ioctl(fd, LOOP_CONFIGURE, &cfg) == 0)
      return fd;
    int e = errno;
    if (e == EINVAL) { /* direct I/O unsupported by the backing file system */
      cfg.info.lo_flags = LO_FLAGS_AUTOCLEAR;
      if (ioctl(fd, LOOP_CONFIGURE, &cfg) == 0)
        return fd;
      e = errno;
    }
    close(fd);
    if (e != EBUSY) { /* EBUSY: another process took it between GET_FREE and CONFIGURE */
      errno = e;
      return moat_error_errno(err, "LOOP_CONFIGURE %s", path);
    }
  }
  return moat_error_set(err, EBUSY, "no free loop device after 64 tries");
}

static pthread_mutex_t golden_lock = PTHREAD_MUTEX_INITIALIZER;

/* A freshly formatted image of size_mb next to img_path's dir (../golden/SIZE.img), made once. */
static char *golden_image(const char *img_path, uint64_t size_mb, moat_error **err) {
  _cleanup_free_ char *dir = xstrdup(img_path);
  char *slash = strrchr(dir, '/');
  if (slash)
    *slash = '\0';
  char *path = xasprintf("%s/golden-%llu.img", dir, (unsigned long long)size_mb);
  pthread_mutex_lock(&golden_lock);
  if (access(path, F_OK) == 0) {
    pthread_mutex_unlock(&golden_lock);
    return path;
  }
  _cleanup_free_ char *tmp = xasprintf("%s.tmp", path);
  int ret = -1;
  unlink(tmp);
  {
    _cleanup_close_ int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0 || ftruncate(fd, (off_t)(size_mb << 20)) < 0)
      moat_error_errno(err, "create %s", tmp);
    else if (run_mkfs(tmp, err) == 0 && rename(tmp, path) == 0)
      ret = 0;
  }
  pthread_mutex_unlock(&golden_lock);
  if (ret < 0) {
    unlink(tmp);
    free(path);
    return NULL;
  }
  return path;
}

/* Copies the data extents of src into a new sparse file dst of the same size. */
static int copy_sparse(const char *src, const char *dst, moat_error **err) {
  _cleanup_close_ int in = open(src, O_RDONLY | O_CLOEXEC);
  if (in < 0)
    return moat_error_errno(err, "open %s", src);
  _cleanup_close_ int out = open(dst, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (out < 0)
    return moat_error_errno(err, "create %s", dst);
  struct stat st;
  if (fstat(in, &st) < 0 || ftruncate(out, st.st_size) < 0)
    return moat_error_errno(err, "size %s", dst);
  off_t off = 0;
  for (;;) {
    off_t data = lseek(in, off, SEEK_DATA);
    if (data < 0) {
      if (errno == ENXIO)
        break;
      return moat_error_errno(err, "seek %s", src);
    }
    off_t hole = lseek(in, data, SEEK_HOLE);
    if (hole < 0)
      return moat_error_errno(err, "seek %s", src);
    loff_t o_in = data, o_out = data;
    while (o_in < hole) {
      ssize_t n = copy_file_range(in, &o_in, out, &o_out, (size_t)(hole - o_in), 0);
      if (n <= 0)
        return moat_error_errno(err, "copy %s", src);
    }
    off = hole;
  }
  return 0;
}

int moat_disk_reserve(int img_fd, uint64_t size_mb, moat_error **err) {
  int r = fallocate(img_fd, 0, 0, (off_t)(size_mb << 20));
  if (r < 0 && errno == ENOSPC) /* what it did allocate stays the image's until it is freed */
    return moat_error_set(err, ENOSPC, "the data dir's file system cannot hold a %llu MiB disk",
                          (unsigned long long)size_mb);
  if (r < 0)
    return moat_error_errno(err, "reserve a %llu MiB disk", (unsigned long long)size_mb);
  return 0;
}

/* Mounts the ext4 file system on the block device at dev_path, detached. The mount fd, or -1. */
static int mount_ext4(const char *dev_path, moat_error **err) {
  _cleanup_close_ int fs = fsopen("ext4", FSOPEN_CLOEXEC);
  if (fs < 0)
    return moat_error_errno(err, "fsopen ext4");
  if (fsconfig(fs, FSCONFIG_SET_STRING, "source", dev_path, 0) < 0 ||
      fsconfig(fs, FSCONFIG_SET_FLAG, "nodelalloc", NULL, 0) < 0 ||
      fsconfig(fs, FSCONFIG_SET_STRING, "errors", "remount-ro", 0) < 0 ||
      fsconfig(fs, FSCONFIG_CMD_CREATE, NULL, NULL, 0) < 0)
    return moat_error_errno(err, "mount ext4 on %s", dev_path);
  int mnt = moat_fault(MOAT_FAULT_MOUNT) ? (errno = ENOMEM, -1)
                                         : fsmount(fs, FSMOUNT_CLOEXEC, MOUNT_ATTR_NODEV | MOUNT_ATTR_NOSUID);
  if (mnt < 0)
    return moat_error_errno(err, "fsmount %s", dev_path);
  return mnt;
}

int moat_disk_create(const char *img_path, uint64_t size_mb, uid_t owner, int *img_fd, moat_error **err) {
  unlink(img_path);
  _cleanup_free_ char *golden = golden_image(img_path, size_mb, err);
  if (!golden)
    return -1;
  if (copy_sparse(golden, img_path, err) < 0) {
    unlink(img_path);
    return -1;
  }
  _cleanup_close_ int img = open(img_path, O_RDWR | O_CLOEXEC);
  unlink(img_path);
  if (img < 0)
    return moat_error_errno(err, "open %s", img_path);
  char loop_path[64];
  _cleanup_close_ int loop = loop_attach(img, loop_path, sizeof(loop_path), err);
  if (loop < 0)
    return -1;
  /* The loop device autoclears on its last close: mount before closing it. */
  int mnt = mount_ext4(loop_path, err);
  if (mnt < 0)
    return -1;
  static const char *dirs[] = {"upper", "work"};
  for (size_t i = 0; i < ARRAY_SIZE(dirs); i++) {
    if (mkdirat(mnt, dirs[i], 0755) < 0 || fchownat(mnt, dirs[i], owner, owner, AT_SYMLINK_NOFOLLOW) < 0) {
      moat_error_errno(err, "prepare %s on %s", dirs[i], loop_path);
      close(mnt);
      return -1;
    }
  }
  /* lost+found belongs to the host's root: hide nothing, but let the sandbox's root own it. */
  fchownat(mnt, "lost+found", owner, owner, AT_SYMLINK_NOFOLLOW);
  if (img_fd)
    *img_fd = steal_fd(&img);
  return mnt;
}

/* ---- persistent images (volumes) ---- */

int moat_disk_image_make(const char *img_path, uint64_t size_mb, bool reserve, moat_error **err) {
  _cleanup_free_ char *golden = golden_image(img_path, size_mb, err);
  if (!golden)
    return -1;
  _cleanup_free_ char *tmp = xasprintf("%s.tmp", img_path);
  unlink(tmp);
  if (copy_sparse(golden, tmp, err) < 0)
    goto fail;
  {
    _cleanup_close_ int fd = open(tmp, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
      moat_error_errno(err, "open %s", tmp);
      goto fail;
    }
    if (reserve && moat_disk_reserve(fd, size_mb, err) < 0)
      goto fail;
    if (fsync(fd) < 0) {
      moat_error_errno(err, "fsync %s", tmp);
      goto fail;
    }
  }
  if (rename(tmp, img_path) < 0) {
    moat_error_errno(err, "rename %s", tmp);
    goto fail;
  }
  fsync_parent(img_path);
  return 0;
fail:
  unlink(tmp);
  return -1;
}

int moat_disk_image_copy(const char *src_img, const char *dst_img, moat_error **err) {
  _cleanup_free_ char *tmp = xasprintf("%s.tmp", dst_img);
  unlink(tmp);
  {
    _cleanup_close_ int in = open(src_img, O_RDONLY | O_CLOEXEC);
    if (in < 0)
      return moat_error_errno(err, "open %s", src_img);
    _cleanup_close_ int out = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (out < 0)
      return moat_error_errno(err, "create %s", tmp);
    struct stat st;
    int r = fstat(in, &st);
    /* a reflink where the file system shares extents (XFS, btrfs), else the data extents */
    if (r == 0 && ioctl(out, FICLONE, in) < 0) {
      close(out);
      out = -1;
      unlink(tmp);
      if (copy_sparse(src_img, tmp, err) < 0)
        goto fail;
      out = open(tmp, O_RDWR | O_CLOEXEC);
    }
    if (r < 0 || out < 0) {
      moat_error_errno(err, "copy %s", src_img);
      goto fail;
    }
    /* the source's allocation carries over: a reserved image stays reserved */
    if (st.st_blocks * 512 >= st.st_size && fallocate(out, 0, 0, st.st_size) < 0) {
      moat_error_set(err, errno == ENOSPC ? ENOSPC : EIO, "reserve %s: %s", tmp, strerror(errno));
      goto fail;
    }
    if (fsync(out) < 0) {
      moat_error_errno(err, "fsync %s", tmp);
      goto fail;
    }
  }
  if (rename(tmp, dst_img) < 0) {
    moat_error_errno(err, "rename %s", tmp);
    goto fail;
  }
  fsync_parent(dst_img);
  return 0;
fail:
  unlink(tmp);
  return -1;
}

/* The loop device whose backing file is img_path (an absolute path), into dev; true if found. */
static bool find_loop(const char *img_path, char *dev, size_t dev_len) {
  DIR *d = opendir("/sys/block");
  if (!d)
    return false;
  bool found = false;
  struct dirent *de;
  while (!found && (de = readdir(d))) {
    if (strncmp(de->d_name, "loop", 4) != 0)
      continue;
    char path[300];
    snprintf(path, sizeof(path), "/sys/block/%s/loop/backing_file", de->d_name);
    _cleanup_free_ char *b = NULL;
    if (read_file(path, &b, NULL, NULL) < 0)
      continue;
    b[strcspn(b, "\n")] = '\0';
    if (strcmp(b, img_path) == 0) {
      snprintf(dev, dev_len, "/dev/%.40s", de->d_name);
      found = true;
    }
  }
  closedir(d);
  return found;
}

int moat_disk_image_mount(const char *img_path, moat_error **err) {
  char loop_path[64];
  /* An image still mounted (a sandbox's namespace holds it after moatd restarted) is mounted again
   * through the same loop device: one superblock; a second loop device would be a second one. */
  if (find_loop(img_path, loop_path, sizeof(loop_path))) {
    int mnt = mount_ext4(loop_path, NULL);
    if (mnt >= 0)
      return mnt;
  }
  _cleanup_close_ int img = open(img_path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  if (img < 0)
    return moat_error_errno(err, "open %s", img_path);
  _cleanup_close_ int loop = loop_attach(img, loop_path, sizeof(loop_path), err);
  if (loop < 0)
    return -1;
  return mount_ext4(loop_path, err);
}

/* ---- project quotas (XFS prjquota) ---- */

static long quotactl_fd_(int fd, unsigned cmd, int id, void *addr) {
  return syscall(__NR_quotactl_fd, fd, cmd, id, addr);
}

bool moat_disk_prjquota_available(const char *dir) {
  _cleanup_close_ int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    return false;
  struct fs_quota_stat qs;
  memset(&qs, 0, sizeof(qs));
  if (quotactl_fd_(fd, QCMD(Q_XGETQSTAT, PRJQUOTA), 0, &qs) < 0)
    return false;
  return (qs.qs_flags & FS_QUOTA_PDQ_ENFD) != 0;
}

static int set_limit(int fd, uint32_t projid, uint64_t size_mb, moat_error **err) {
  struct fs_disk_quota dq;
  memset(&dq, 0, sizeof(dq));
  dq.d_version = FS_DQUOT_VERSION;
  dq.d_flags = FS_PROJ_QUOTA;
  dq.d_id = projid;
  dq.d_fieldmask = FS_DQ_BHARD | FS_DQ_BSOFT;
  dq.d_blk_hardlimit = size_mb << 11; /* 512-byte basic blocks */
  dq.d_blk_softlimit = size_mb << 11;
  if (quotactl_fd_(fd, QCMD(Q_XSETQLIM, PRJQUOTA), (int)projid, &dq) < 0)
    return moat_error_errno(err, "set project quota %u", projid);
  return 0;
}

int moat_disk_create_prjquota(const char *dir, uint32_t projid, uint64_t size_mb, uid_t owner,
                              moat_error **err) {
  if (mkdir(dir, 0755) < 0 && errno != EEXIST)
    return moat_error_errno(err, "mkdir %s", dir);
  _cleanup_close_ int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    return moat_error_errno(err, "open %s", dir);
  struct fsxattr fx;
  if (ioctl(fd, FS_IOC_FSGETXATTR, &fx) < 0)
    return moat_error_errno(err, "get project of %s", dir);
  fx.fsx_projid = projid;
  fx.fsx_xflags |= FS_XFLAG_PROJINHERIT;
  if (ioctl(fd, FS_IOC_FSSETXATTR, &fx) < 0)
    return moat_error_errno(err, "set project %u on %s", projid, dir);
  if (set_limit(fd, projid, size_mb, err) < 0)
    return -1;
  static const char *dirs[] = {"upper", "work"};
  for (size_t i = 0; i < ARRAY_SIZE(dirs); i++)
    if ((mkdirat(fd, dirs[i], 0755) < 0 && errno != EEXIST) ||
        fchownat(fd, dirs[i], owner, owner, AT_SYMLINK_NOFOLLOW) < 0)
      return moat_error_errno(err, "prepare %s in %s", dirs[i], dir);
  int mnt = moat_fault(MOAT_FAULT_MOUNT) ? (errno = ENOMEM, -1)
                                         : open_tree(AT_FDCWD, dir, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
  if (mnt < 0)
    return moat_error_errno(err, "open_tree %s", dir);
  struct mount_attr attr = {.attr_set = MOUNT_ATTR_NODEV | MOUNT_ATTR_NOSUID};
  if (mount_setattr(mnt, "", AT_EMPTY_PATH, &attr, sizeof(attr)) < 0) {
    moat_error_errno(err, "mount_setattr %s", dir);
    close(mnt);
    return -1;
  }
  return mnt;
}

void moat_disk_prjquota_release(const char *fs_dir, uint32_t projid) {
  _cleanup_close_ int fd = open(fs_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0)
    set_limit(fd, projid, 0, NULL); /* 0 = no limit: the id is free again */
}

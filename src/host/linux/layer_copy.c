/* layer_copy.c -- copying a sandbox's overlay upper dir (its writable layer) for checkpoints
 *
 * Runs in moatd as the host's root, on trees the sandbox wrote: every step works relative to
 * directory fds with O_NOFOLLOW, so a symlink planted in the layer is copied as a link and never
 * followed.
 */
#include "layer_copy.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "../../common/util.h"

#define RANGE 65536u
/* The id a user namespace shows for an owner it does not map (kernel.overflowuid's default). */
#define OVERFLOW_ID 65534u

struct link_seen {
  dev_t dev;
  ino_t ino;
  char *path; /* the first copy, relative to the destination's parent dir */
};

struct copy_ctx {
  uid_t from, to;
  bool squash; /* owners outside [from, from + RANGE) become OVERFLOW_ID, not kept */
  uint64_t bytes;
  bool no_cfr;  /* copy_file_range refused (EXDEV ...): read and write */
  int dst_root; /* the destination's parent dir (hard links are re-made from there) */
  struct link_seen *links;
  size_t n_links, cap_links;
  moat_error **err;
};

static uid_t shift(const struct copy_ctx *c, uid_t id) {
  if (id >= c->from && id - c->from < RANGE)
    return id - c->from + c->to;
  return c->squash ? OVERFLOW_ID : id;
}

static int copy_xattrs(struct copy_ctx *c, int src, int dst, const char *what) {
  char list[8192];
  ssize_t n = flistxattr(src, list, sizeof(list));
  if (n < 0)
    return errno == ENOTSUP ? 0 : moat_error_errno(c->err, "list xattrs of %s", what);
  for (ssize_t off = 0; off < n; off += (ssize_t)strlen(list + off) + 1) {
    const char *name = list + off;
    if (strncmp(name, "user.", 5) != 0 && strncmp(name, "trusted.", 8) != 0)
      continue; /* security.* (capabilities) would need remapping: dropped */
    char val[4096];
    ssize_t v = fgetxattr(src, name, val, sizeof(val));
    if (v < 0)
      return moat_error_errno(c->err, "read xattr %s of %s", name, what);
    if (fsetxattr(dst, name, val, (size_t)v, 0) < 0)
      return moat_error_errno(c->err, "write xattr %s of %s", name, what);
  }
  return 0;
}

static int copy_data(struct copy_ctx *c, int src, int dst, off_t size, const char *what) {
  if (ioctl(dst, FICLONE, src) == 0) {
    c->bytes += (uint64_t)size;
    return 0;
  }
  off_t pos = 0;
  while (pos < size) {
    off_t data = lseek(src, pos, SEEK_DATA);
    if (data < 0) {
      if (errno == ENXIO)
        break; /* the rest is a hole */
      data = pos;
    }
    off_t hole = lseek(src, data, SEEK_HOLE);
    if (hole < 0 || hole > size)
      hole = size;
    loff_t in = data, out = data;
    size_t left = (size_t)(hole - data);
    while (left > 0) {
      ssize_t w = c->no_cfr ? -1 : copy_file_range(src, &in, dst, &out, left, 0);
      if (w < 0 && !c->no_cfr && errno != EXDEV && errno != EINVAL && errno != EOPNOTSUPP && errno != ENOSYS)
        return moat_error_errno(c->err, "copy %s", what);
      if (w < 0) { /* across file systems: plain read and write */
        c->no_cfr = true;
        char buf[65536];
        ssize_t rd = pread(src, buf, left < sizeof(buf) ? left : sizeof(buf), in);
        if (rd < 0)
          return moat_error_errno(c->err, "read %s", what);
        if (rd == 0)
          break;
        for (ssize_t off = 0; off < rd;) {
          ssize_t wr = pwrite(dst, buf + off, (size_t)(rd - off), out + off);
          if (wr < 0)
            return moat_error_errno(c->err, "write copy of %s", what);
          off += wr;
        }
        w = rd;
        in += rd;
        out += rd;
      }
      if (w == 0)
        break;
      left -= (size_t)w;
      c->bytes += (uint64_t)w;
    }
    pos = hole;
  }
  if (ftruncate(dst, size) < 0)
    return moat_error_errno(c->err, "truncate %s", what);
  return 0;
}

static int set_meta(struct copy_ctx *c, int dst_dir, const char *name, const struct stat *st,
                    const char *what) {
  if (fchownat(dst_dir, name, shift(c, st->st_uid), shift(c, st->st_gid), AT_SYMLINK_NOFOLLOW) < 0)
    return moat_error_errno(c->err, "chown %s", what);
  if (!S_ISLNK(st->st_mode) && fchmodat(dst_dir, name, st->st_mode & 07777, 0) < 0)
    return moat_error_errno(c->err, "chmod %s", what);
  struct timespec ts[2] = {st->st_atim, st->st_mtim};
  if (utimensat(dst_dir, name, ts, AT_SYMLINK_NOFOLLOW) < 0)
    return moat_error_errno(c->err, "set times of %s", what);
  return 0;
}

static int copy_tree(struct copy_ctx *c, int src_dir, const char *name, int dst_dir, const char *dname,
                     const char *rel);

static int copy_dir(struct copy_ctx *c, int src_dir, const char *name, int dst_dir, const char *dname,
                    const char *rel, const struct stat *st) {
  _cleanup_close_ int s = openat(src_dir, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (s < 0)
    return moat_error_errno(c->err, "open %s", rel);
  if (mkdirat(dst_dir, dname, 0700) < 0)
    return moat_error_errno(c->err, "mkdir %s", rel);
  _cleanup_close_ int d = openat(dst_dir, dname, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (d < 0)
    return moat_error_errno(c->err, "open copy of %s", rel);
  int dup_fd = dup(s);
  if (dup_fd < 0)
    return moat_error_errno(c->err, "dup");
  DIR *dp = fdopendir(dup_fd);
  if (!dp) {
    close(dup_fd);
    return moat_error_errno(c->err, "read %s", rel);
  }
  int ret = 0;
  struct dirent *de;
  while (ret == 0 && (errno = 0, de = readdir(dp)) != NULL) {
    if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
      continue;
    _cleanup_free_ char *sub = xasprintf("%s/%s", rel, de->d_name);
    ret = copy_tree(c, s, de->d_name, d, de->d_name, sub);
  }
  closedir(dp);
  if (ret < 0)
    return -1;
  if (copy_xattrs(c, s, d, rel) < 0)
    return -1;
  return set_meta(c, dst_dir, dname, st, rel);
}

/* Copies src_dir/name to dst_dir/dname (the same name but at the top of a copy). */
static int copy_tree(struct copy_ctx *c, int src_dir, const char *name, int dst_dir, const char *dname,
                     const char *rel) {
  struct stat st;
  if (fstatat(src_dir, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
    return moat_error_errno(c->err, "stat %s", rel);
  switch (st.st_mode & S_IFMT) {
  case S_IFDIR:
    return copy_dir(c, src_dir, name, dst_dir, dname, rel, &st);
  case S_IFREG: {
    if (st.st_nlink > 1) {
      for (size_t i = 0; i < c->n_links; i++)
        if (c->links[i].dev == st.st_dev && c->links[i].ino == st.st_ino) {
          if (linkat(c->dst_root, c->links[i].path, dst_dir, dname, 0) < 0)
            return moat_error_errno(c->err, "link %s", rel);
          return 0;
        }
    }
    /* O_NONBLOCK: a fifo swapped in since the stat must not block the open */
    _cleanup_close_ int s = openat(src_dir, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (s < 0)
      return moat_error_errno(c->err, "open %s", rel);
    struct stat now;
    if (fstat(s, &now) < 0 || !S_ISREG(now.st_mode))
      return moat_error_set(c->err, EAGAIN, "%s changed while it was copied", rel);
    _cleanup_close_ int d =
        openat(dst_dir, dname, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (d < 0)
      return moat_error_errno(c->err, "create %s", rel);
    if (copy_data(c, s, d, st.st_size, rel) < 0 || copy_xattrs(c, s, d, rel) < 0)
      return -1;
    if (st.st_nlink > 1) {
      if (c->n_links == c->cap_links)
        c->links =
            xrealloc(c->links, (c->cap_links = c->cap_links ? c->cap_links * 2 : 16) * sizeof(*c->links));
      c->links[c->n_links++] = (struct link_seen){.dev = st.st_dev, .ino = st.st_ino, .path = xstrdup(rel)};
    }
    return set_meta(c, dst_dir, dname, &st, rel);
  }
  case S_IFLNK: {
    char target[4097];
    ssize_t n = readlinkat(src_dir, name, target, sizeof(target) - 1);
    if (n < 0)
      return moat_error_errno(c->err, "readlink %s", rel);
    target[n] = '\0';
    if (symlinkat(target, dst_dir, dname) < 0)
      return moat_error_errno(c->err, "symlink %s", rel);
    return set_meta(c, dst_dir, dname, &st, rel);
  }
  case S_IFCHR:
  case S_IFBLK:
  case S_IFIFO:
    if (mknodat(dst_dir, dname, st.st_mode & S_IFMT, st.st_rdev) < 0)
      return moat_error_errno(c->err, "mknod %s", rel);
    return set_meta(c, dst_dir, dname, &st, rel);
  default: /* sockets: their listeners are restored by CRIU, the inode means nothing */
    return 0;
  }
}

static int layer_copy(struct copy_ctx *c, int src_dir, const char *src_name, int dst_dir,
                      const char *dst_name, uint64_t *bytes) {
  c->dst_root = dst_dir; /* rel paths start with dst_name: linkat(dst_dir, rel) finds a first copy */
  int ret = copy_tree(c, src_dir, src_name, dst_dir, dst_name, dst_name);
  for (size_t i = 0; i < c->n_links; i++)
    free(c->links[i].path);
  free(c->links);
  if (bytes)
    *bytes += c->bytes;
  return ret;
}

int moat_layer_copy(int src_dir, int dst_dir, const char *name, uid_t from_base, uid_t to_base,
                    uint64_t *bytes, moat_error **err) {
  struct copy_ctx c = {.from = from_base, .to = to_base, .err = err};
  return layer_copy(&c, src_dir, name, dst_dir, name, bytes);
}

int moat_layer_export(int src_dir, const char *src_name, int dst_dir, const char *dst_name, uid_t from_base,
                      uint64_t *bytes, moat_error **err) {
  struct copy_ctx c = {.from = from_base, .to = 0, .squash = true, .err = err};
  return layer_copy(&c, src_dir, src_name, dst_dir, dst_name, bytes);
}

/* image_tree.c -- template images as trees of hard links: clone, apply an overlay layer, size
 *
 * Runs in moatd as the host's root on trees hostile code wrote. Every step is relative to a
 * directory fd opened with O_NOFOLLOW (| O_DIRECTORY for directories); the xattrs of entries that
 * cannot be opened safely (symlinks, devices, fifos) are reached as /proc/self/fd/DIRFD/NAME with
 * the l*xattr calls, which do not follow NAME. Nothing here is followed.
 */
#include "image_tree.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "../common/util.h"

/* ---- small helpers ---- */

/* The names in directory fd (not "." nor ".."), sorted, NULL-terminated; *out is the caller's to
 * strv_free. Read whole before the caller changes the directory. 0 or -1 with errno. */
static int read_names(int fd, char ***out) {
  *out = NULL;
  int dup_fd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
  if (dup_fd < 0)
    return -1;
  DIR *d = fdopendir(dup_fd);
  if (!d) {
    close(dup_fd);
    return -1;
  }
  rewinddir(d);
  size_t n = 0, cap = 16;
  char **v = xmalloc(cap * sizeof(*v));
  struct dirent *de;
  while ((errno = 0, de = readdir(d)) != NULL) {
    if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
      continue;
    if (n + 1 >= cap)
      v = xrealloc(v, (cap *= 2) * sizeof(*v));
    v[n++] = xstrdup(de->d_name);
  }
  int saved = errno;
  closedir(d);
  v[n] = NULL;
  if (saved) {
    strv_free(v);
    errno = saved;
    return -1;
  }
  *out = v;
  return 0;
}

/* What an xattr call works on: an open fd (directories, regular files), else dir/name reached
 * through /proc/self/fd without following name. */
struct xtarget {
  int fd;
  char *path; /* owned; NULL when fd is used */
};

static struct xtarget xt_fd(int fd) { return (struct xtarget){.fd = fd, .path = NULL}; }
static struct xtarget xt_at(int dir, const char *name) {
  return (struct xtarget){.fd = -1, .path = xasprintf("/proc/self/fd/%d/%s", dir, name)};
}
static void xt_free(struct xtarget *t) {
  free(t->path);
  t->path = NULL;
}

/* The NUL-separated xattr names of t into *out (caller frees; NULL when none). Length, or -1. */
static ssize_t xt_list(const struct xtarget *t, char **out) {
  *out = NULL;
  for (int tries = 0; tries < 4; tries++) {
    ssize_t n = t->path ? llistxattr(t->path, NULL, 0) : flistxattr(t->fd, NULL, 0);
    if (n < 0)
      return errno == ENOTSUP ? 0 : -1;
    if (n == 0)
      return 0;
    char *buf = xmalloc((size_t)n);
    ssize_t m = t->path ? llistxattr(t->path, buf, (size_t)n) : flistxattr(t->fd, buf, (size_t)n);
    if (m >= 0) {
      *out = buf;
      return m;
    }
    free(buf);
    if (errno != ERANGE)
      return -1;
  }
  errno = ERANGE;
  return -1;
}

/* The value of xattr name of t into *out (caller frees). Length, or -1 (ENODATA: none). */
static ssize_t xt_get(const struct xtarget *t, const char *name, char **out) {
  *out = NULL;
  for (int tries = 0; tries < 4; tries++) {
    ssize_t n = t->path ? lgetxattr(t->path, name, NULL, 0) : fgetxattr(t->fd, name, NULL, 0);
    if (n < 0)
      return -1;
    char *buf = xmalloc((size_t)n + 1);
    ssize_t m = t->path ? lgetxattr(t->path, name, buf, (size_t)n) : fgetxattr(t->fd, name, buf, (size_t)n);
    if (m >= 0) {
      buf[m] = '\0';
      *out = buf;
      return m;
    }
    free(buf);
    if (errno != ERANGE)
      return -1;
  }
  errno = ERANGE;
  return -1;
}

static int xt_set(const struct xtarget *t, const char *name, const char *val, size_t len) {
  return t->path ? lsetxattr(t->path, name, val, len, 0) : fsetxattr(t->fd, name, val, len, 0);
}

static int xt_remove(const struct xtarget *t, const char *name) {
  return t->path ? lremovexattr(t->path, name) : fremovexattr(t->fd, name);
}

/* user.* and trusted.*: the namespaces an image keeps (security.* would need remapping). */
static bool image_ns(const char *name) {
  return strncmp(name, "user.", 5) == 0 || strncmp(name, "trusted.", 8) == 0;
}

/* An overlayfs private xattr ("user.overlay.*" or "trusted.overlay.*"); *rest gets what follows. */
static bool overlay_xattr(const char *name, const char **rest) {
  const char *p = strncmp(name, "user.", 5) == 0      ? name + 5
                  : strncmp(name, "trusted.", 8) == 0 ? name + 8
                                                      : NULL;
  if (!p || strncmp(p, "overlay.", 8) != 0)
    return false;
  if (rest)
    *rest = p + 8;
  return true;
}

/* Copies the user.* / trusted.* xattrs of from onto to; with no_overlay, not the overlay ones. */
static int copy_xattrs(const struct xtarget *from, const struct xtarget *to, bool no_overlay,
                       const char *what, moat_error **err) {
  _cleanup_free_ char *list = NULL;
  ssize_t n = xt_list(from, &list);
  if (n < 0)
    return moat_error_errno(err, "list xattrs of %s", what);
  for (ssize_t off = 0; off < n; off += (ssize_t)strlen(list + off) + 1) {
    const char *name = list + off;
    if (!image_ns(name) || (no_overlay && overlay_xattr(name, NULL)))
      continue;
    _cleanup_free_ char *val = NULL;
    ssize_t v = xt_get(from, name, &val);
    if (v < 0) {
      if (errno == ENODATA)
        continue;
      return moat_error_errno(err, "read xattr %s of %s", name, what);
    }
    if (xt_set(to, name, val, (size_t)v) < 0)
      return moat_error_errno(err, "write xattr %s of %s", name, what);
  }
  return 0;
}

/* ---- inode sets: (dev, ino) -> an optional path ---- */

struct ino_slot {
  dev_t dev;
  ino_t ino;
  bool used;
  char *val; /* owned, may be NULL */
};

struct ino_map {
  struct ino_slot *s;
  size_t cap, n;
};

static size_t ino_hash(dev_t dev, ino_t ino) {
  uint64_t h = ((uint64_t)ino ^ ((uint64_t)dev << 32 | (uint64_t)dev >> 32)) * 0x9E3779B97F4A7C15ull;
  return (size_t)(h ^ (h >> 31));
}

/* The slot of (dev, ino), added (val NULL, *added true) when it was not there. */
static struct ino_slot *ino_map_get(struct ino_map *m, dev_t dev, ino_t ino, bool *added) {
  if ((m->n + 1) * 2 > m->cap) {
    size_t cap = m->cap ? m->cap * 2 : 64;
    struct ino_slot *s = xcalloc(cap, sizeof(*s));
    for (size_t i = 0; i < m->cap; i++)
      if (m->s[i].used) {
        size_t j = ino_hash(m->s[i].dev, m->s[i].ino) & (cap - 1);
        while (s[j].used)
          j = (j + 1) & (cap - 1);
        s[j] = m->s[i];
      }
    free(m->s);
    m->s = s;
    m->cap = cap;
  }
  size_t j = ino_hash(dev, ino) & (m->cap - 1);
  while (m->s[j].used) {
    if (m->s[j].dev == dev && m->s[j].ino == ino) {
      *added = false;
      return &m->s[j];
    }
    j = (j + 1) & (m->cap - 1);
  }
  m->s[j] = (struct ino_slot){.dev = dev, .ino = ino, .used = true};
  m->n++;
  *added = true;
  return &m->s[j];
}

static void ino_map_free(struct ino_map *m) {
  for (size_t i = 0; i < m->cap; i++)
    free(m->s[i].val);
  free(m->s);
  m->s = NULL;
  m->cap = m->n = 0;
}

/* ---- clone ---- */

struct clone_ctx {
  int dst_root;         /* dst_dir of the call: copies' paths are relative to it */
  struct ino_map moved; /* source inodes that hit EMLINK -> the path of their copy */
  moat_error **err;
};

/* Owner, mode (not for symlinks) and times of st onto dir/name. */
static int set_meta_at(int dir, const char *name, const struct stat *st, const char *what, moat_error **err) {
  if (fchownat(dir, name, st->st_uid, st->st_gid, AT_SYMLINK_NOFOLLOW) < 0)
    return moat_error_errno(err, "chown %s", what);
  if (!S_ISLNK(st->st_mode) && fchmodat(dir, name, st->st_mode & 07777, 0) < 0)
    return moat_error_errno(err, "chmod %s", what);
  struct timespec ts[2] = {st->st_atim, st->st_mtim};
  if (utimensat(dir, name, ts, AT_SYMLINK_NOFOLLOW) < 0)
    return moat_error_errno(err, "set times of %s", what);
  return 0;
}

static int set_meta_fd(int fd, const struct stat *st, const char *what, moat_error **err) {
  if (fchown(fd, st->st_uid, st->st_gid) < 0)
    return moat_error_errno(err, "chown %s", what);
  if (fchmod(fd, st->st_mode & 07777) < 0)
    return moat_error_errno(err, "chmod %s", what);
  struct timespec ts[2] = {st->st_atim, st->st_mtim};
  if (futimens(fd, ts) < 0)
    return moat_error_errno(err, "set times of %s", what);
  return 0;
}

/* A new inode at ddir/name with the data, xattrs and metadata of the regular file sdir/name. */
static int copy_file(int sdir, int ddir, const char *name, const struct stat *st, const char *what,
                     moat_error **err) {
  _cleanup_close_ int s = openat(sdir, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (s < 0)
    return moat_error_errno(err, "open %s", what);
  struct stat now;
  if (fstat(s, &now) < 0 || !S_ISREG(now.st_mode) || now.st_ino != st->st_ino)
    return moat_error_set(err, EAGAIN, "%s changed while it was cloned", what);
  _cleanup_close_ int d = openat(ddir, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (d < 0)
    return moat_error_errno(err, "create %s", what);
  if (ioctl(d, FICLONE, s) < 0) {
    bool plain = false;
    for (;;) {
      ssize_t w = -1;
      if (!plain) {
        w = copy_file_range(s, NULL, d, NULL, 1 << 30, 0);
        if (w < 0 && (errno == EXDEV || errno == EINVAL || errno == EOPNOTSUPP || errno == ENOSYS))
          plain = true;
        else if (w < 0)
          return moat_error_errno(err, "copy %s", what);
      }
      if (plain) {
        char buf[65536];
        w = read(s, buf, sizeof(buf));
        if (w < 0)
          return moat_error_errno(err, "read %s", what);
        if (w > 0 && write_all(d, buf, (size_t)w) < 0)
          return moat_error_errno(err, "write copy of %s", what);
      }
      if (w == 0)
        break;
    }
  }
  struct xtarget from = xt_fd(s), to = xt_fd(d);
  if (copy_xattrs(&from, &to, false, what, err) < 0)
    return -1;
  return set_meta_fd(d, st, what, err);
}

static int clone_entry(struct clone_ctx *c, int sdir, int ddir, const char *name, const char *rel, int depth);

static int clone_dir(struct clone_ctx *c, int sdir, int ddir, const char *name, const char *rel,
                     const struct stat *st, int depth) {
  if (depth > MOAT_IMAGE_TREE_MAX_DEPTH)
    return moat_error_set(c->err, ELOOP, "%s: deeper than %d directories", rel, MOAT_IMAGE_TREE_MAX_DEPTH);
  _cleanup_close_ int s = openat(sdir, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (s < 0)
    return moat_error_errno(c->err, "open %s", rel);
  if (mkdirat(ddir, name, 0700) < 0)
    return moat_error_errno(c->err, "mkdir %s", rel);
  _cleanup_close_ int d = openat(ddir, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (d < 0)
    return moat_error_errno(c->err, "open copy of %s", rel);
  _cleanup_strv_ char **names = NULL;
  if (read_names(s, &names) < 0)
    return moat_error_errno(c->err, "read %s", rel);
  for (char **p = names; *p; p++) {
    _cleanup_free_ char *sub = xasprintf("%s/%s", rel, *p);
    if (clone_entry(c, s, d, *p, sub, depth + 1) < 0)
      return -1;
  }
  struct xtarget from = xt_fd(s), to = xt_fd(d);
  if (copy_xattrs(&from, &to, false, rel, c->err) < 0)
    return -1;
  return set_meta_fd(d, st, rel, c->err);
}

static int clone_file(struct clone_ctx *c, int sdir, int ddir, const char *name, const char *rel,
                      const struct stat *st) {
  if (c->moved.n > 0 && st->st_nlink > 1) {
    bool added;
    struct ino_slot *sl = ino_map_get(&c->moved, st->st_dev, st->st_ino, &added);
    if (!added && sl->val)
      return linkat(c->dst_root, sl->val, ddir, name, 0) < 0 ? moat_error_errno(c->err, "link %s", rel) : 0;
  }
  if (linkat(sdir, name, ddir, name, 0) == 0)
    return 0;
  if (errno != EMLINK)
    return moat_error_errno(c->err, "link %s", rel);
  /* The source inode has all the links its file system allows: this clone gets its own copy, and
   * its other names here become links to that copy. */
  if (copy_file(sdir, ddir, name, st, rel, c->err) < 0)
    return -1;
  bool added;
  struct ino_slot *sl = ino_map_get(&c->moved, st->st_dev, st->st_ino, &added);
  if (!sl->val)
    sl->val = xstrdup(rel);
  return 0;
}

static int clone_entry(struct clone_ctx *c, int sdir, int ddir, const char *name, const char *rel,
                       int depth) {
  struct stat st;
  if (fstatat(sdir, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
    return moat_error_errno(c->err, "stat %s", rel);
  switch (st.st_mode & S_IFMT) {
  case S_IFDIR:
    return clone_dir(c, sdir, ddir, name, rel, &st, depth);
  case S_IFREG:
    return clone_file(c, sdir, ddir, name, rel, &st);
  case S_IFLNK: {
    size_t cap = st.st_size > 0 && st.st_size < 65536 ? (size_t)st.st_size + 1 : 4097;
    _cleanup_free_ char *target = xmalloc(cap);
    ssize_t n = readlinkat(sdir, name, target, cap);
    if (n < 0)
      return moat_error_errno(c->err, "readlink %s", rel);
    if ((size_t)n >= cap)
      return moat_error_set(c->err, EAGAIN, "%s changed while it was cloned", rel);
    target[n] = '\0';
    if (symlinkat(target, ddir, name) < 0)
      return moat_error_errno(c->err, "symlink %s", rel);
    break;
  }
  case S_IFCHR:
  case S_IFBLK:
  case S_IFIFO:
  case S_IFSOCK:
    if (mknodat(ddir, name, (st.st_mode & S_IFMT) | 0600, st.st_rdev) < 0)
      return moat_error_errno(c->err, "mknod %s", rel);
    break;
  default:
    return moat_error_set(c->err, EINVAL, "%s: unknown file type 0%o", rel, st.st_mode & S_IFMT);
  }
  struct xtarget from = xt_at(sdir, name), to = xt_at(ddir, name);
  int ret = copy_xattrs(&from, &to, false, rel, c->err);
  xt_free(&from);
  xt_free(&to);
  if (ret < 0)
    return -1;
  return set_meta_at(ddir, name, &st, rel, c->err);
}

int moat_image_tree_clone(int src_dir, int dst_dir, const char *name, moat_error **err) {
  struct clone_ctx c = {.dst_root = dst_dir, .err = err};
  int ret = clone_entry(&c, src_dir, dst_dir, name, name, 0);
  ino_map_free(&c.moved);
  if (ret < 0)
    moat_error_wrap(err, "clone image %s", name);
  return ret;
}

/* ---- apply ---- */

static bool is_whiteout(const struct stat *st) {
  return S_ISCHR(st->st_mode) && st->st_rdev == makedev(0, 0);
}

/* Refuses the overlay markers of features apply does not implement on t (at image path path). */
static int check_markers(const struct xtarget *t, const char *path, moat_error **err) {
  _cleanup_free_ char *list = NULL;
  ssize_t n = xt_list(t, &list);
  if (n < 0)
    return moat_error_errno(err, "list xattrs of %s", path);
  for (ssize_t off = 0; off < n; off += (ssize_t)strlen(list + off) + 1) {
    const char *rest;
    if (!overlay_xattr(list + off, &rest))
      continue;
    if (strcmp(rest, "redirect") == 0 || strcmp(rest, "metacopy") == 0 || strcmp(rest, "whiteout") == 0)
      return moat_error_set(err, EINVAL, "%s carries %s: layers with overlayfs %s are not supported", path,
                            list + off, rest);
  }
  return 0;
}

/* Walks the layer directory fd (at image path path) checking every entry's markers. */
static int check_layer(int fd, const char *path, int depth, moat_error **err) {
  if (depth > MOAT_IMAGE_TREE_MAX_DEPTH)
    return moat_error_set(err, ELOOP, "%s: deeper than %d directories", path, MOAT_IMAGE_TREE_MAX_DEPTH);
  struct xtarget self = xt_fd(fd);
  if (check_markers(&self, path[0] ? path : "/", err) < 0)
    return -1;
  _cleanup_strv_ char **names = NULL;
  if (read_names(fd, &names) < 0)
    return moat_error_errno(err, "read layer %s", path[0] ? path : "/");
  for (char **p = names; *p; p++) {
    _cleanup_free_ char *sub = xasprintf("%s/%s", path, *p);
    struct stat st;
    if (fstatat(fd, *p, &st, AT_SYMLINK_NOFOLLOW) < 0)
      return moat_error_errno(err, "stat layer %s", sub);
    if (S_ISDIR(st.st_mode)) {
      _cleanup_close_ int sub_fd = openat(fd, *p, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (sub_fd < 0)
        return moat_error_errno(err, "open layer %s", sub);
      if (check_layer(sub_fd, sub, depth + 1, err) < 0)
        return -1;
      continue;
    }
    struct xtarget t = xt_at(fd, *p);
    int ret = check_markers(&t, sub, err);
    xt_free(&t);
    if (ret < 0)
      return -1;
  }
  return 0;
}

static int remove_entry(int dir, const char *name, const char *path, int depth, moat_error **err);

/* Removes every entry of the root directory fd (at image path path). */
static int empty_dir(int fd, const char *path, int depth, moat_error **err) {
  if (depth > MOAT_IMAGE_TREE_MAX_DEPTH)
    return moat_error_set(err, ELOOP, "%s: deeper than %d directories", path, MOAT_IMAGE_TREE_MAX_DEPTH);
  _cleanup_strv_ char **names = NULL;
  if (read_names(fd, &names) < 0)
    return moat_error_errno(err, "read %s", path[0] ? path : "/");
  for (char **p = names; *p; p++) {
    _cleanup_free_ char *sub = xasprintf("%s/%s", path, *p);
    if (remove_entry(fd, *p, sub, depth + 1, err) < 0)
      return -1;
  }
  return 0;
}

/* Removes dir/name of the root, a whole tree if it is a directory; absent is fine. */
static int remove_entry(int dir, const char *name, const char *path, int depth, moat_error **err) {
  struct stat st;
  if (fstatat(dir, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
    return errno == ENOENT ? 0 : moat_error_errno(err, "stat %s", path);
  if (S_ISDIR(st.st_mode)) {
    _cleanup_close_ int fd = openat(dir, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
      return moat_error_errno(err, "open %s", path);
    if (empty_dir(fd, path, depth, err) < 0)
      return -1;
    if (unlinkat(dir, name, AT_REMOVEDIR) < 0)
      return moat_error_errno(err, "remove %s", path);
    return 0;
  }
  if (unlinkat(dir, name, 0) < 0 && errno != ENOENT)
    return moat_error_errno(err, "remove %s", path);
  return 0;
}

/* True when the layer directory fd is marked opaque. */
static bool is_opaque(int fd) {
  static const char *const names[] = {"user.overlay.opaque", "trusted.overlay.opaque"};
  struct xtarget t = xt_fd(fd);
  for (size_t i = 0; i < ARRAY_SIZE(names); i++) {
    _cleanup_free_ char *v = NULL;
    if (xt_get(&t, names[i], &v) == 1 && v[0] == 'y')
      return true;
  }
  return false;
}

/* Removes the overlay xattrs of t (a layer entry about to move into the root). */
static int strip_overlay(const struct xtarget *t, const char *path, moat_error **err) {
  _cleanup_free_ char *list = NULL;
  ssize_t n = xt_list(t, &list);
  if (n < 0)
    return moat_error_errno(err, "list xattrs of %s", path);
  for (ssize_t off = 0; off < n; off += (ssize_t)strlen(list + off) + 1)
    if (overlay_xattr(list + off, NULL) && xt_remove(t, list + off) < 0 && errno != ENODATA)
      return moat_error_errno(err, "remove xattr %s of %s", list + off, path);
  return 0;
}

/* Makes the root directory rd's user.* / trusted.* xattrs the layer directory ld's, overlay ones
 * aside. */
static int sync_dir_xattrs(int ld, int rd, const char *path, moat_error **err) {
  struct xtarget from = xt_fd(ld), to = xt_fd(rd);
  _cleanup_free_ char *have = NULL;
  ssize_t n = xt_list(&to, &have);
  if (n < 0)
    return moat_error_errno(err, "list xattrs of %s", path);
  for (ssize_t off = 0; off < n; off += (ssize_t)strlen(have + off) + 1) {
    const char *name = have + off;
    if (!image_ns(name))
      continue;
    _cleanup_free_ char *v = NULL;
    if (!overlay_xattr(name, NULL) && xt_get(&from, name, &v) >= 0)
      continue; /* the layer has it: set below */
    if (xt_remove(&to, name) < 0 && errno != ENODATA)
      return moat_error_errno(err, "remove xattr %s of %s", name, path);
  }
  return copy_xattrs(&from, &to, true, path, err);
}

/* Applies the layer directory ld (stat lst, at image path path) to rparent/rname of the root. */
static int apply_dir(int ld, const struct stat *lst, int rparent, const char *rname, const char *path,
                     int depth, moat_error **err) {
  const char *shown = path[0] ? path : "/";
  if (depth > MOAT_IMAGE_TREE_MAX_DEPTH)
    return moat_error_set(err, ELOOP, "%s: deeper than %d directories", shown, MOAT_IMAGE_TREE_MAX_DEPTH);
  struct stat rst;
  bool have = fstatat(rparent, rname, &rst, AT_SYMLINK_NOFOLLOW) == 0;
  if (!have && errno != ENOENT)
    return moat_error_errno(err, "stat %s", shown);
  if (have && !S_ISDIR(rst.st_mode)) { /* a file, a symlink ...: replaced, never followed */
    if (unlinkat(rparent, rname, 0) < 0)
      return moat_error_errno(err, "remove %s", shown);
    have = false;
  }
  if (!have && mkdirat(rparent, rname, 0700) < 0)
    return moat_error_errno(err, "mkdir %s", shown);
  _cleanup_close_ int rd = openat(rparent, rname, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (rd < 0)
    return moat_error_errno(err, "open %s", shown);
  if (have && is_opaque(ld) && empty_dir(rd, path, depth, err) < 0)
    return -1;
  _cleanup_strv_ char **names = NULL;
  if (read_names(ld, &names) < 0)
    return moat_error_errno(err, "read layer %s", shown);
  for (char **p = names; *p; p++) {
    _cleanup_free_ char *sub = xasprintf("%s/%s", path, *p);
    struct stat st;
    if (fstatat(ld, *p, &st, AT_SYMLINK_NOFOLLOW) < 0)
      return moat_error_errno(err, "stat layer %s", sub);
    if (is_whiteout(&st)) {
      if (remove_entry(rd, *p, sub, depth + 1, err) < 0)
        return -1;
    } else if (S_ISDIR(st.st_mode)) {
      _cleanup_close_ int sub_fd = openat(ld, *p, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (sub_fd < 0)
        return moat_error_errno(err, "open layer %s", sub);
      if (apply_dir(sub_fd, &st, rd, *p, sub, depth + 1, err) < 0)
        return -1;
    } else {
      struct xtarget t = xt_at(ld, *p);
      int ret = strip_overlay(&t, sub, err);
      xt_free(&t);
      if (ret < 0)
        return -1;
      struct stat old;
      if (fstatat(rd, *p, &old, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(old.st_mode) &&
          remove_entry(rd, *p, sub, depth + 1, err) < 0)
        return -1;
      if (renameat(ld, *p, rd, *p) < 0)
        return moat_error_errno(err, "move %s into the image", sub);
    }
  }
  if (sync_dir_xattrs(ld, rd, shown, err) < 0)
    return -1;
  return set_meta_fd(rd, lst, shown, err);
}

int moat_image_tree_apply(int root_dir, const char *root_name, int layer_dir, const char *layer_name,
                          moat_error **err) {
  _cleanup_close_ int ld = openat(layer_dir, layer_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (ld < 0)
    return moat_error_errno(err, "apply layer: open %s", layer_name);
  struct stat lst, rst;
  if (fstat(ld, &lst) < 0)
    return moat_error_errno(err, "apply layer: stat %s", layer_name);
  if (fstatat(root_dir, root_name, &rst, AT_SYMLINK_NOFOLLOW) < 0)
    return moat_error_errno(err, "apply layer: stat image %s", root_name);
  if (!S_ISDIR(rst.st_mode))
    return moat_error_set(err, ENOTDIR, "apply layer: image %s is not a directory", root_name);
  if (check_layer(ld, "", 0, err) < 0 || apply_dir(ld, &lst, root_dir, root_name, "", 0, err) < 0)
    return moat_error_wrap(err, "apply layer");
  return 0;
}

/* ---- size ---- */

static unsigned long long tree_size(int fd, struct ino_map *seen, int depth) {
  int dup_fd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
  if (dup_fd < 0)
    return 0;
  DIR *d = fdopendir(dup_fd);
  if (!d) {
    close(dup_fd);
    return 0;
  }
  rewinddir(d);
  unsigned long long sum = 0;
  struct dirent *de;
  while ((de = readdir(d)) != NULL) {
    if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
      continue;
    struct stat st;
    if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
      continue;
    if (S_ISDIR(st.st_mode)) {
      if (depth >= MOAT_IMAGE_TREE_MAX_DEPTH)
        continue;
      int sub = openat(dirfd(d), de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (sub >= 0) {
        sum += tree_size(sub, seen, depth + 1);
        close(sub);
      }
    } else if (S_ISREG(st.st_mode) || S_ISLNK(st.st_mode)) {
      bool added = true;
      if (S_ISREG(st.st_mode) && st.st_nlink > 1)
        ino_map_get(seen, st.st_dev, st.st_ino, &added);
      if (added)
        sum += (unsigned long long)st.st_size;
    }
  }
  closedir(d);
  return sum;
}

unsigned long long moat_image_tree_size(int dir_fd) {
  struct ino_map seen = {0};
  unsigned long long sum = tree_size(dir_fd, &seen, 0);
  ino_map_free(&seen);
  return sum;
}

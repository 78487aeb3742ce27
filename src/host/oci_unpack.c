/* oci_unpack.c -- applies an OCI layer tar to a rootfs directory: whiteouts, owners, modes, links,
 * every path resolved beneath the rootfs (a hostile layer never reaches outside it) */
#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "../common/log.h"
#include "../common/util.h"
#include "oci_internal.h"

/* Directories a whiteout removes are walked this deep at most (a tree made deeper through symlinks
 * fails the whiteout rather than the stack). */
#define RM_MAX_DEPTH 256

/* --- the set of paths a layer made --- */

static uint64_t hash_str(const char *s) {
  uint64_t h = 1469598103934665603ULL;
  for (; *s; s++)
    h = (h ^ (uint8_t)*s) * 1099511628211ULL;
  return h;
}

static bool set_has(const struct oci_pathset *s, const char *p) {
  if (!s->cap)
    return false;
  for (size_t i = hash_str(p) & (s->cap - 1);; i = (i + 1) & (s->cap - 1)) {
    if (!s->slot[i])
      return false;
    if (strcmp(s->slot[i], p) == 0)
      return true;
  }
}

/* Adds p (copied); false when it was there. */
static bool set_add1(struct oci_pathset *s, const char *p, size_t len) {
  if ((s->n + 1) * 2 > s->cap) {
    size_t cap = s->cap ? s->cap * 2 : 64;
    char **slot = xcalloc(cap, sizeof(*slot));
    for (size_t i = 0; i < s->cap; i++) {
      if (!s->slot[i])
        continue;
      size_t k = hash_str(s->slot[i]) & (cap - 1);
      while (slot[k])
        k = (k + 1) & (cap - 1);
      slot[k] = s->slot[i];
    }
    free(s->slot);
    s->slot = slot;
    s->cap = cap;
  }
  _cleanup_free_ char *c = xstrndup(p, len);
  size_t i = hash_str(c) & (s->cap - 1);
  for (; s->slot[i]; i = (i + 1) & (s->cap - 1))
    if (strcmp(s->slot[i], c) == 0)
      return false;
  s->slot[i] = steal_pointer(&c);
  s->n++;
  return true;
}

/* Adds p and its ancestors. */
static void set_add(struct oci_pathset *s, const char *p) {
  size_t len = strlen(p);
  while (len && set_add1(s, p, len)) {
    while (len && p[len - 1] != '/')
      len--;
    if (len)
      len--;
  }
}

static void set_clear(struct oci_pathset *s) {
  for (size_t i = 0; i < s->cap; i++)
    free(s->slot[i]);
  free(s->slot);
  *s = (struct oci_pathset){0};
}

/* --- names and paths --- */

char *oci_norm_name(const char *name, const char **why) {
  if (name[0] == '/') {
    *why = "absolute path";
    return NULL;
  }
  char *out = xmalloc(strlen(name) + 1);
  size_t o = 0, depth = 0;
  for (const char *p = name; *p;) {
    const char *e = strchrnul(p, '/');
    size_t l = (size_t)(e - p);
    if (l == 2 && p[0] == '.' && p[1] == '.') {
      free(out);
      *why = "'..' component";
      return NULL;
    }
    if (l && !(l == 1 && p[0] == '.')) {
      if (++depth > OCI_MAX_DEPTH) {
        free(out);
        *why = "too many components";
        return NULL;
      }
      if (o)
        out[o++] = '/';
      memcpy(out + o, p, l);
      o += l;
    }
    p = *e ? e + 1 : e;
  }
  out[o] = '\0';
  return out;
}

/* Opens path ("" for the root) beneath the rootfs with flags (O_PATH|O_DIRECTORY and the like). */
static int open_in_root(const struct oci_unpack *u, const char *path, int flags) {
  struct open_how how = {
      .flags = (uint64_t)(flags | O_CLOEXEC),
      .resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV,
  };
  long fd;
  do
    fd = syscall(SYS_openat2, u->root, path[0] ? path : ".", &how, sizeof(how));
  while (fd < 0 && (errno == EINTR || errno == EAGAIN));
  return (int)fd;
}

/* target (a symlink's, found in directory dir) joined to dir as the kernel resolves it beneath a
 * root: an absolute target starts at the root, ".." never climbs above it. Caller frees. */
static char *in_root_join(const char *dir, size_t dir_len, const char *target, const char *rest) {
  _cleanup_free_ char *all = target[0] == '/' ? xasprintf("%s/%s", target, rest)
                                              : xasprintf("%.*s/%s/%s", (int)dir_len, dir, target, rest);
  char *out = xmalloc(strlen(all) + 1);
  size_t o = 0;
  for (char *save = NULL, *c = strtok_r(all, "/", &save); c; c = strtok_r(NULL, "/", &save)) {
    if (strcmp(c, ".") == 0)
      continue;
    if (strcmp(c, "..") == 0) {
      while (o && out[o - 1] != '/')
        o--;
      if (o)
        o--;
      continue;
    }
    if (o)
      out[o++] = '/';
    memcpy(out + o, c, strlen(c));
    o += strlen(c);
  }
  out[o] = '\0';
  return out;
}

/* The directory holding norm ("a/b" of "a/b/c"), opened O_PATH beneath the rootfs; its missing
 * components are made (0755, owned by the caller) when mk, also where a symlink a layer planted
 * points (resolved beneath the rootfs, as the kernel would). Sets *base to norm's last component. */
static int open_parent(const struct oci_unpack *u, const char *norm, bool mk, const char **base,
                       moat_error **err) {
  const char *slash = strrchr(norm, '/');
  *base = slash ? slash + 1 : norm;
  _cleanup_free_ char *parent = xstrndup(norm, slash ? (size_t)(slash - norm) : 0);
  int fd = open_in_root(u, parent, O_PATH | O_DIRECTORY);
  if (fd >= 0 || errno != ENOENT || !mk) {
    if (fd < 0)
      moat_error_errno(err, "open %s", parent[0] ? parent : "/");
    return fd;
  }
  /* Walk from the root, making each missing component in the directory resolved before it; a
   * dangling symlink restarts the walk at its target. */
  for (int hops = 0; hops <= 40; hops++) {
    _cleanup_close_ int cur = open_in_root(u, "", O_PATH | O_DIRECTORY);
    if (cur < 0)
      return moat_error_errno(err, "open /");
    bool restart = false;
    for (size_t i = 0; parent[i] && !restart;) {
      size_t e = i;
      while (parent[e] && parent[e] != '/')
        e++;
      char save = parent[e];
      parent[e] = '\0';
      int next = open_in_root(u, parent, O_PATH | O_DIRECTORY);
      if (next < 0 && errno == ENOENT) {
        if (mkdirat(cur, parent + i, 0755) < 0 && errno != EEXIST)
          return moat_error_errno(err, "mkdir %s", parent);
        next = open_in_root(u, parent, O_PATH | O_DIRECTORY);
        char target[4096];
        ssize_t tl;
        if (next < 0 && errno == ENOENT &&
            (tl = readlinkat(cur, parent + i, target, sizeof(target) - 1)) > 0) {
          target[tl] = '\0';
          char *np = in_root_join(parent, i, target, save ? parent + e + 1 : "");
          free(parent);
          parent = np;
          restart = true;
          continue;
        }
      }
      if (next < 0)
        return moat_error_errno(err, "open %s", parent);
      close(cur);
      cur = next;
      parent[e] = save;
      i = save ? e + 1 : e;
    }
    if (!restart)
      return steal_fd(&cur);
  }
  return moat_error_set(err, ELOOP, "open %s: too many symlinks", norm);
}

/* Removes name in dirfd and, when a directory, all beneath it (never following a symlink, never
 * leaving the rootfs' file system). Absent is fine. 0 or -1. */
static int rm_at(const struct oci_unpack *u, int dirfd, const char *name, int depth, moat_error **err) {
  struct stat st;
  if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
    return errno == ENOENT ? 0 : moat_error_errno(err, "stat %s", name);
  if (!S_ISDIR(st.st_mode)) {
    if (unlinkat(dirfd, name, 0) < 0 && errno != ENOENT)
      return moat_error_errno(err, "unlink %s", name);
    return 0;
  }
  if (st.st_dev != u->root_dev)
    return moat_error_set(err, EXDEV, "remove %s: another file system", name);
  if (depth > RM_MAX_DEPTH)
    return moat_error_set(err, ELOOP, "remove %s: deeper than %d", name, RM_MAX_DEPTH);
  int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0)
    return moat_error_errno(err, "open %s", name);
  _cleanup_dir_ DIR *d = fdopendir(fd);
  if (!d) {
    close(fd);
    return moat_error_errno(err, "opendir %s", name);
  }
  for (struct dirent *de; (de = readdir(d));) {
    if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
      continue;
    if (rm_at(u, fd, de->d_name, depth + 1, err) < 0)
      return moat_error_wrap(err, "%s", name);
  }
  if (unlinkat(dirfd, name, AT_REMOVEDIR) < 0 && errno != ENOENT)
    return moat_error_errno(err, "rmdir %s", name);
  return 0;
}

static char *join(const char *dir, const char *name) {
  return dir[0] ? xasprintf("%s/%s", dir, name) : xstrdup(name);
}

/* Hides what the layers below put at path (name in dirfd): removes it unless this layer made it; a
 * directory this layer made keeps this layer's entries and loses the rest. 0 or -1. */
static int whiteout_at(struct oci_unpack *u, int dirfd, const char *name, const char *path, int depth,
                       moat_error **err) {
  if (!set_has(&u->made, path))
    return rm_at(u, dirfd, name, 0, err);
  struct stat st;
  if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
    return errno == ENOENT ? 0 : moat_error_errno(err, "stat %s", path);
  if (!S_ISDIR(st.st_mode))
    return 0;
  if (depth > RM_MAX_DEPTH)
    return moat_error_set(err, ELOOP, "whiteout %s: deeper than %d", path, RM_MAX_DEPTH);
  int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0)
    return moat_error_errno(err, "open %s", path);
  _cleanup_dir_ DIR *d = fdopendir(fd);
  if (!d) {
    close(fd);
    return moat_error_errno(err, "opendir %s", path);
  }
  for (struct dirent *de; (de = readdir(d));) {
    if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
      continue;
    _cleanup_free_ char *child = join(path, de->d_name);
    if (whiteout_at(u, fd, de->d_name, child, depth + 1, err) < 0)
      return -1;
  }
  return 0;
}

/* The opaque whiteout of directory dir (normalised): empties it of what the layers below made. */
static int opaque(struct oci_unpack *u, const char *dir, moat_error **err) {
  _cleanup_free_ char *probe = join(dir, "x");
  const char *base;
  _cleanup_close_ int pfd = open_parent(u, probe, true, &base, err);
  if (pfd < 0)
    return -1;
  _cleanup_close_ int fd = openat(pfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    return moat_error_errno(err, "open %s", dir[0] ? dir : "/");
  int dfd = dup(fd);
  if (dfd < 0)
    return moat_error_errno(err, "dup");
  _cleanup_dir_ DIR *d = fdopendir(dfd);
  if (!d) {
    close(dfd);
    return moat_error_errno(err, "opendir %s", dir);
  }
  for (struct dirent *de; (de = readdir(d));) {
    if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
      continue;
    _cleanup_free_ char *child = join(dir, de->d_name);
    if (whiteout_at(u, fd, de->d_name, child, 0, err) < 0)
      return -1;
  }
  return 0;
}

int oci_archive_status(struct archive *a) {
  switch (archive_errno(a)) {
  case EIO:
  case ENOMEM:
  case ENOSPC:
  case EDQUOT:
  case EBADF:
  case EFBIG:
    return archive_errno(a);
  default:
    return EINVAL;
  }
}

/* --- entries --- */

static int set_owner(const struct oci_unpack *u, int dirfd, const char *name, struct archive_entry *e,
                     moat_error **err) {
  if (fchownat(dirfd, name, (uid_t)archive_entry_uid(e), (gid_t)archive_entry_gid(e),
               AT_SYMLINK_NOFOLLOW | (name[0] ? 0 : AT_EMPTY_PATH)) < 0 &&
      (u->as_root || errno != EPERM))
    return moat_error_errno(err, "chown");
  return 0;
}

static void set_mtime(int dirfd, const char *name, struct archive_entry *e) {
  if (!archive_entry_mtime_is_set(e))
    return;
  struct timespec ts[2] = {{.tv_nsec = UTIME_OMIT},
                           {.tv_sec = archive_entry_mtime(e), .tv_nsec = archive_entry_mtime_nsec(e)}};
  utimensat(dirfd, name, ts, AT_SYMLINK_NOFOLLOW);
}

static int write_data(struct oci_unpack *u, struct archive *a, int fd, int64_t size, moat_error **err) {
  const void *buf;
  size_t len;
  int64_t off;
  for (;;) {
    int r = archive_read_data_block(a, &buf, &len, &off);
    if (r == ARCHIVE_EOF)
      break;
    if (r < ARCHIVE_WARN)
      return moat_error_set(err, oci_archive_status(a), "read: %s",
                            archive_error_string(a) ? archive_error_string(a) : "error");
    if (off < 0 || (uint64_t)off + len > (uint64_t)size)
      return moat_error_set(err, EINVAL, "data beyond the entry's size");
    for (size_t done = 0; done < len;) {
      ssize_t w = pwrite(fd, (const char *)buf + done, len - done, off + (off_t)done);
      if (w < 0 && errno == EINTR)
        continue;
      if (w < 0)
        return moat_error_errno(err, "write");
      done += (size_t)w;
    }
  }
  if (ftruncate(fd, size) < 0)
    return moat_error_errno(err, "truncate");
  return 0;
}

static int make_file(struct oci_unpack *u, struct archive *a, struct archive_entry *e, int pfd,
                     const char *base, moat_error **err) {
  int64_t size = archive_entry_size(e) > 0 ? archive_entry_size(e) : 0;
  if (rm_at(u, pfd, base, 0, err) < 0)
    return -1;
  _cleanup_close_ int fd = openat(pfd, base, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0)
    return moat_error_errno(err, "create");
  if (write_data(u, a, fd, size, err) < 0)
    return -1;
  if (set_owner(u, fd, "", e, err) < 0)
    return -1;
  /* After chown, which clears the setuid and setgid bits. */
  if (fchmod(fd, archive_entry_perm(e) & 07777) < 0)
    return moat_error_errno(err, "chmod");
  if (archive_entry_mtime_is_set(e)) {
    struct timespec ts[2] = {{.tv_nsec = UTIME_OMIT},
                             {.tv_sec = archive_entry_mtime(e), .tv_nsec = archive_entry_mtime_nsec(e)}};
    futimens(fd, ts);
  }
  return 0;
}

static int make_dir(struct oci_unpack *u, struct archive_entry *e, int pfd, const char *base,
                    moat_error **err) {
  struct stat st;
  bool have = fstatat(pfd, base, &st, AT_SYMLINK_NOFOLLOW) == 0;
  if (have && !S_ISDIR(st.st_mode)) {
    if (rm_at(u, pfd, base, 0, err) < 0)
      return -1;
    have = false;
  }
  if (!have && mkdirat(pfd, base, 0700) < 0)
    return moat_error_errno(err, "mkdir");
  _cleanup_close_ int fd = openat(pfd, base, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0)
    return moat_error_errno(err, "open");
  if (set_owner(u, fd, "", e, err) < 0)
    return -1;
  if (fchmod(fd, archive_entry_perm(e) & 07777) < 0)
    return moat_error_errno(err, "chmod");
  return 0;
}

static int make_link(struct oci_unpack *u, struct archive_entry *e, const char *norm, const char *target,
                     int pfd, const char *base, moat_error **err) {
  const char *why = NULL;
  _cleanup_free_ char *t = oci_norm_name(target, &why);
  if (!t)
    return moat_error_set(err, EINVAL, "hard link to %s: %s", target, why);
  if (!t[0] || strcmp(t, norm) == 0)
    return moat_error_set(err, EINVAL, "hard link to %s: not a file", target);
  const char *tbase;
  _cleanup_close_ int tfd = open_parent(u, t, false, &tbase, err);
  if (tfd < 0)
    return moat_error_wrap(err, "hard link to %s", target);
  struct stat st;
  if (fstatat(tfd, tbase, &st, AT_SYMLINK_NOFOLLOW) < 0)
    return moat_error_errno(err, "hard link to %s", target);
  if (S_ISDIR(st.st_mode))
    return moat_error_set(err, EINVAL, "hard link to %s: a directory", target);
  if (rm_at(u, pfd, base, 0, err) < 0)
    return -1;
  if (linkat(tfd, tbase, pfd, base, 0) < 0)
    return moat_error_errno(err, "hard link to %s", target);
  return 0;
}

static int make_other(struct oci_unpack *u, struct archive_entry *e, const char *norm, int pfd,
                      const char *base, moat_error **err) {
  mode_t type = archive_entry_filetype(e);
  if (type == AE_IFLNK) {
    const char *target = archive_entry_symlink(e);
    if (!target)
      target = archive_entry_symlink_utf8(e);
    if (!target || !target[0])
      return moat_error_set(err, EINVAL, "symlink without a target");
    if (rm_at(u, pfd, base, 0, err) < 0)
      return -1;
    if (symlinkat(target, pfd, base) < 0)
      return moat_error_errno(err, "symlink");
  } else if (type == AE_IFIFO) {
    if (rm_at(u, pfd, base, 0, err) < 0)
      return -1;
    if (mknodat(pfd, base, S_IFIFO | 0600, 0) < 0)
      return moat_error_errno(err, "mkfifo");
  } else {
    if (!u->skipped_logged)
      log_info("oci import: skipping %s (device nodes and sockets are not unpacked; sandboxes get their "
               "own /dev)",
               norm);
    u->skipped_logged = true;
    return 0;
  }
  if (set_owner(u, pfd, base, e, err) < 0)
    return -1;
  if (type == AE_IFIFO && fchmodat(pfd, base, archive_entry_perm(e) & 07777, 0) < 0)
    return moat_error_errno(err, "chmod");
  set_mtime(pfd, base, e);
  return 0;
}

/* Applies entry e (its name normalised: norm). */
static int apply_entry(struct oci_unpack *u, struct archive *a, struct archive_entry *e, const char *norm,
                       moat_error **err) {
  mode_t type = archive_entry_filetype(e);
  const char *hl = archive_entry_hardlink(e);
  if (!hl)
    hl = archive_entry_hardlink_utf8(e);
  if (!norm[0]) {
    if (hl || type != AE_IFDIR)
      return moat_error_set(err, EINVAL, "the root is not a directory");
    _cleanup_close_ int fd = open_in_root(u, "", O_RDONLY | O_DIRECTORY);
    if (fd < 0)
      return moat_error_errno(err, "open /");
    if (set_owner(u, fd, "", e, err) < 0)
      return -1;
    if (fchmod(fd, archive_entry_perm(e) & 07777) < 0)
      return moat_error_errno(err, "chmod");
    return 0;
  }
  const char *slash = strrchr(norm, '/');
  const char *name = slash ? slash + 1 : norm;
  if (strncmp(name, ".wh.", 4) == 0) {
    _cleanup_free_ char *dir = xstrndup(norm, slash ? (size_t)(slash - norm) : 0);
    if (strcmp(name, ".wh..wh..opq") == 0)
      return opaque(u, dir, err);
    if (strncmp(name, ".wh..wh.", 8) == 0)
      return 0; /* aufs' own metadata (.wh..wh.plnk, ...): nothing to apply */
    const char *victim = name + 4;
    if (!victim[0] || strcmp(victim, ".") == 0 || strcmp(victim, "..") == 0)
      return moat_error_set(err, EINVAL, "whiteout of '%s'", victim);
    _cleanup_free_ char *vpath = join(dir, victim);
    const char *vbase;
    _cleanup_close_ int pfd = open_parent(u, vpath, false, &vbase, err);
    if (pfd < 0) {
      if (err && *err && ((*err)->status == ENOENT || (*err)->status == ENOTDIR)) {
        moat_error_free(err);
        return 0; /* nothing below to hide */
      }
      return -1;
    }
    return whiteout_at(u, pfd, vbase, vpath, 0, err);
  }
  const char *base;
  _cleanup_close_ int pfd = open_parent(u, norm, true, &base, err);
  if (pfd < 0)
    return -1;
  set_add(&u->made, norm);
  if (hl)
    return make_link(u, e, norm, hl, pfd, base, err);
  if (type == AE_IFREG)
    return make_file(u, a, e, pfd, base, err);
  if (type == AE_IFDIR)
    return make_dir(u, e, pfd, base, err);
  return make_other(u, e, norm, pfd, base, err);
}

int oci_unpack_layer(struct oci_unpack *u, struct archive *a, const char *label, moat_error **err) {
  set_clear(&u->made);
  struct archive_entry *e;
  for (;;) {
    int r = archive_read_next_header(a, &e);
    if (r == ARCHIVE_EOF)
      break;
    if (r < ARCHIVE_WARN)
      return moat_error_set(err, oci_archive_status(a), "layer %s: %s", label,
                            archive_error_string(a) ? archive_error_string(a) : "not a tar");
    const char *name = archive_entry_pathname(e);
    if (!name)
      name = archive_entry_pathname_utf8(e);
    if (!name)
      return moat_error_set(err, EINVAL, "layer %s: an entry without a name", label);
    if (++u->entries > u->max_entries)
      return moat_error_set(err, EFBIG, "layer %s: entry %s: over the limit of %zu entries", label, name,
                            u->max_entries);
    /* Every entry's size counts (a whiteout or device with data is read through too). */
    uint64_t size = archive_entry_size(e) > 0 ? (uint64_t)archive_entry_size(e) : 0;
    if (size > u->max_bytes || u->bytes > u->max_bytes - size)
      return moat_error_set(err, EFBIG, "layer %s: entry %s: over the limit of %llu bytes unpacked", label,
                            name, (unsigned long long)u->max_bytes);
    u->bytes += size;
    const char *why = NULL;
    _cleanup_free_ char *norm = oci_norm_name(name, &why);
    if (!norm)
      return moat_error_set(err, EINVAL, "layer %s: entry %s: %s", label, name, why);
    if (apply_entry(u, a, e, norm, err) < 0)
      return moat_error_wrap(err, "layer %s: entry %s", label, name);
  }
  set_clear(&u->made);
  return 0;
}

int oci_unpack_init(struct oci_unpack *u, const char *rootfs_dir, uint64_t max_bytes, size_t max_entries,
                    moat_error **err) {
  *u = (struct oci_unpack){.root = -1, .max_bytes = max_bytes, .max_entries = max_entries};
  u->root = open(rootfs_dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (u->root < 0)
    return moat_error_errno(err, "open %s", rootfs_dir);
  struct stat st;
  if (fstat(u->root, &st) < 0)
    return moat_error_errno(err, "stat %s", rootfs_dir);
  u->root_dev = st.st_dev;
  u->as_root = geteuid() == 0;
  return 0;
}

void oci_unpack_fini(struct oci_unpack *u) {
  if (u->root >= 0)
    close(u->root);
  u->root = -1;
  set_clear(&u->made);
}

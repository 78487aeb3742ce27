/* build_copy.c -- COPY/ADD of a build context's sources into an image's rootfs, every path resolved
 * inside that rootfs (RESOLVE_IN_ROOT) and no last component ever followed */
#include "build_context.h"

#include <archive.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../common/util.h"
#include "build_context_internal.h"

#define COPY_BUF (128 * 1024)
/* /etc/passwd and /etc/group of an image are read up to this size. */
#define ID_FILE_MAX (8 * 1024 * 1024)

/* Reads the image's etc/<file> (in-root) into a NUL-terminated buffer; NULL (no error) when missing. */
static int read_id_file(int root, const char *file, char **out, moat_error **err) {
  *out = NULL;
  _cleanup_free_ char *path = xasprintf("etc/%s", file);
  _cleanup_close_ int fd = moat_bc_openat2(root, path, O_RDONLY | O_NOCTTY | O_NONBLOCK, MOAT_BC_IN_ROOT);
  if (fd < 0) {
    if (errno == ENOENT || errno == ENOTDIR)
      return 0;
    return moat_error_errno(err, "open the image's /etc/%s", file);
  }
  struct stat st;
  if (fstat(fd, &st) < 0)
    return moat_error_errno(err, "stat the image's /etc/%s", file);
  if (!S_ISREG(st.st_mode))
    return moat_error_set(err, EINVAL, "the image's /etc/%s is not a regular file", file);
  if (st.st_size > ID_FILE_MAX)
    return moat_error_set(err, EFBIG, "the image's /etc/%s is larger than %d bytes", file, ID_FILE_MAX);
  _cleanup_free_ char *buf = xmalloc((size_t)st.st_size + 1);
  ssize_t r = read_all(fd, buf, (size_t)st.st_size);
  if (r < 0)
    return moat_error_errno(err, "read the image's /etc/%s", file);
  buf[r] = '\0';
  *out = steal_pointer(&buf);
  return 0;
}

static bool parse_id(const char *s, size_t len, uint32_t *out) {
  if (len == 0 || len > 10)
    return false;
  uint64_t v = 0;
  for (size_t i = 0; i < len; i++) {
    if (s[i] < '0' || s[i] > '9')
      return false;
    v = v * 10 + (uint64_t)(s[i] - '0');
  }
  if (v >= UINT32_MAX)
    return false;
  *out = (uint32_t)v;
  return true;
}

/* Finds name in a passwd/group text: the line whose first field is name; *id its field id_field
 * (2: uid or gid) and *id2 the next one (passwd's gid). */
static bool lookup_name(const char *text, const char *name, uint32_t *id, uint32_t *id2) {
  size_t nlen = strlen(name);
  for (const char *line = text; line && *line;) {
    const char *end = strchr(line, '\n');
    size_t llen = end ? (size_t)(end - line) : strlen(line);
    const char *f[5];
    size_t fl[5];
    size_t nf = 0;
    for (const char *p = line; nf < 5;) {
      const char *colon = memchr(p, ':', llen - (size_t)(p - line));
      f[nf] = p;
      fl[nf] = colon ? (size_t)(colon - p) : llen - (size_t)(p - line);
      nf++;
      if (!colon)
        break;
      p = colon + 1;
    }
    if (nf >= 3 && fl[0] == nlen && memcmp(f[0], name, nlen) == 0 && parse_id(f[2], fl[2], id)) {
      if (!id2)
        return true;
      if (nf >= 4 && parse_id(f[3], fl[3], id2))
        return true;
    }
    line = end ? end + 1 : NULL;
  }
  return false;
}

/* chown's "user[:group]" as ids, names looked up in the image. */
static int resolve_chown(int root, const char *spec, uid_t *uid, gid_t *gid, moat_error **err) {
  const char *colon = strchr(spec, ':');
  _cleanup_free_ char *user = colon ? xstrndup(spec, (size_t)(colon - spec)) : xstrdup(spec);
  const char *group = colon ? colon + 1 : NULL;
  if (!*user || (group && (!*group || strchr(group, ':'))))
    return moat_error_set(err, EINVAL, "--chown='%s': want user[:group]", spec);
  uint32_t u = 0, g = 0;
  if (parse_id(user, strlen(user), &u)) {
    g = u;
  } else {
    _cleanup_free_ char *passwd = NULL;
    if (read_id_file(root, "passwd", &passwd, err) < 0)
      return -1;
    if (!passwd || !lookup_name(passwd, user, &u, &g))
      return moat_error_set(err, EINVAL, "--chown: no user '%s' in the image's /etc/passwd", user);
  }
  if (group && !parse_id(group, strlen(group), &g)) {
    _cleanup_free_ char *groups = NULL;
    if (read_id_file(root, "group", &groups, err) < 0)
      return -1;
    if (!groups || !lookup_name(groups, group, &g, NULL))
      return moat_error_set(err, EINVAL, "--chown: no group '%s' in the image's /etc/group", group);
  }
  *uid = u;
  *gid = g;
  return 0;
}

static int parse_chmod(const char *s, mode_t *out, moat_error **err) {
  if (!*s || strlen(s) > 5)
    return moat_error_set(err, EINVAL, "--chmod='%s': want an octal mode", s);
  unsigned v = 0;
  for (const char *p = s; *p; p++) {
    if (*p < '0' || *p > '7')
      return moat_error_set(err, EINVAL, "--chmod='%s': want an octal mode", s);
    v = v * 8 + (unsigned)(*p - '0');
  }
  if (v > 07777)
    return moat_error_set(err, EINVAL, "--chmod='%s': beyond 7777", s);
  *out = (mode_t)v;
  return 0;
}

struct copy_job {
  struct moat_build_context *c;
  int root; /* the image's */
  struct moat_bc_owner own;
  bool have_mode;
  mode_t mode;
  const char *dest; /* clean, in the image: where the walk's top goes */
  char *buf;
};

static mode_t mode_of(const struct copy_job *j, const struct stat *st) {
  return j->have_mode ? j->mode : (st->st_mode & 07777);
}

/* Writes the regular file fd as path (clean, in the image). */
static int put_file(struct copy_job *j, const char *path, int fd, const struct stat *st, moat_error **err) {
  _cleanup_free_ char *parent = NULL, *name = NULL;
  moat_bc_split(path, &parent, &name);
  _cleanup_close_ int dir = -1;
  if (moat_bc_mkdirs(j->root, parent, MOAT_BC_IN_ROOT, &j->own, &dir, err) < 0)
    return -1;
  if (moat_bc_make_room(dir, name, path, err) < 0)
    return -1;
  _cleanup_close_ int out = openat(dir, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (out < 0)
    return moat_error_errno(err, "create '/%s'", path);
  for (off_t off = 0;;) {
    ssize_t r = pread(fd, j->buf, COPY_BUF, off);
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0)
      return moat_error_errno(err, "read");
    if (r == 0)
      break;
    if (write_all(out, j->buf, (size_t)r) < 0)
      return moat_error_errno(err, "write '/%s'", path);
    off += r;
  }
  if (fchown(out, j->own.uid, j->own.gid) < 0 || fchmod(out, mode_of(j, st)) < 0)
    return moat_error_errno(err, "chown/chmod '/%s'", path);
  struct timespec ts[2] = {st->st_mtim, st->st_mtim};
  (void)futimens(out, ts);
  return 0;
}

static int put_symlink(struct copy_job *j, const char *path, const char *target, moat_error **err) {
  _cleanup_free_ char *parent = NULL, *name = NULL;
  moat_bc_split(path, &parent, &name);
  _cleanup_close_ int dir = -1;
  if (moat_bc_mkdirs(j->root, parent, MOAT_BC_IN_ROOT, &j->own, &dir, err) < 0)
    return -1;
  if (moat_bc_make_room(dir, name, path, err) < 0)
    return -1;
  if (symlinkat(target, dir, name) < 0)
    return moat_error_errno(err, "symlink '/%s'", path);
  if (fchownat(dir, name, j->own.uid, j->own.gid, AT_SYMLINK_NOFOLLOW) < 0)
    return moat_error_errno(err, "chown '/%s'", path);
  return 0;
}

/* Makes the directory path (following the image's symlinks in-root) unless it is there. */
static int put_dir(struct copy_job *j, const char *path, const struct stat *st, moat_error **err) {
  _cleanup_close_ int there = moat_bc_openat2(j->root, path, O_PATH | O_DIRECTORY, MOAT_BC_IN_ROOT);
  if (there >= 0)
    return 0;
  if (errno == ENOTDIR)
    return moat_error_set(err, ENOTDIR, "'/%s' is in the way and is not a directory", path);
  if (errno != ENOENT)
    return moat_error_errno(err, "open '/%s'", path);
  _cleanup_free_ char *parent = NULL, *name = NULL;
  moat_bc_split(path, &parent, &name);
  _cleanup_close_ int dir = -1;
  if (moat_bc_mkdirs(j->root, parent, MOAT_BC_IN_ROOT, &j->own, &dir, err) < 0)
    return -1;
  if (mkdirat(dir, name, 0700) < 0) {
    if (errno == EEXIST)
      return moat_error_set(err, ENOTDIR, "'/%s' is in the way and is not a directory", path);
    return moat_error_errno(err, "mkdir '/%s'", path);
  }
  _cleanup_close_ int fd = moat_bc_openat2(dir, name, O_RDONLY | O_DIRECTORY, MOAT_BC_BENEATH);
  if (fd < 0)
    return moat_error_errno(err, "open '/%s'", path);
  mode_t mode = j->have_mode ? j->mode : moat_bc_top_mode(j->c, st);
  if (fchown(fd, j->own.uid, j->own.gid) < 0 || fchmod(fd, mode) < 0)
    return moat_error_errno(err, "chown/chmod '/%s'", path);
  return 0;
}

static int copy_visit(void *arg, const struct moat_bc_node *n, moat_error **err) {
  struct copy_job *j = arg;
  _cleanup_free_ char *path = moat_bc_join(j->dest, n->rel);
  if (S_ISDIR(n->st->st_mode))
    return put_dir(j, path, n->st, err);
  if (S_ISLNK(n->st->st_mode))
    return put_symlink(j, path, n->target, err);
  return put_file(j, path, n->fd, n->st, err);
}

/* Whether the regular file fd is a tar libarchive reads (its offset is left at 0). */
static bool is_tar(int fd) {
  if (lseek(fd, 0, SEEK_SET) < 0)
    return false;
  moat_error *e = NULL;
  struct archive *a = moat_bc_reader(fd, false, &e);
  bool yes = false;
  if (a) {
    struct archive_entry *entry;
    int r = archive_read_next_header(a, &entry);
    yes = r == ARCHIVE_OK || r == ARCHIVE_WARN;
    archive_read_free(a);
  }
  moat_error_free(&e);
  (void)lseek(fd, 0, SEEK_SET);
  return yes;
}

static int add_tar(struct copy_job *j, const struct moat_copy_opts *o, int fd, const char *src,
                   moat_error **err) {
  _cleanup_close_ int dir = -1;
  if (moat_bc_mkdirs(j->root, j->dest, MOAT_BC_IN_ROOT, &j->own, &dir, err) < 0)
    return -1;
  struct archive *a = moat_bc_reader(fd, false, err);
  if (!a)
    return -1;
  _cleanup_free_ char *what = xasprintf("ADD %s", src);
  struct moat_bc_untar u = {.root = j->root,
                            .base = j->dest,
                            .resolve = MOAT_BC_IN_ROOT,
                            .dirs = j->own,
                            .keep_owner = true,
                            .entries = {.set = o->chown != NULL, .uid = j->own.uid, .gid = j->own.gid},
                            .max_bytes = j->c->max_bytes,
                            .max_entries = j->c->max_entries,
                            .what = what};
  int r = moat_bc_untar(a, &u, err);
  archive_read_free(a);
  return r;
}

static bool ends_as_dir(const char *d) {
  size_t n = strlen(d);
  if (n == 0)
    return true;
  if (d[n - 1] == '/')
    return true;
  const char *last = strrchr(d, '/');
  last = last ? last + 1 : d;
  return strcmp(last, ".") == 0 || strcmp(last, "..") == 0;
}

static const char *base_name(const char *path) {
  const char *s = strrchr(path, '/');
  return s ? s + 1 : path;
}

int moat_build_context_copy(struct moat_build_context *c, int root_fd, char *const *expanded, size_t n,
                            const struct moat_copy_opts *o, moat_error **err) {
  if (!o->dest || !*o->dest)
    return moat_error_set(err, EINVAL, "copy: no destination");
  const char *workdir = o->workdir && *o->workdir ? o->workdir : "/";
  _cleanup_free_ char *joined = o->dest[0] == '/' ? xstrdup(o->dest) : xasprintf("%s/%s", workdir, o->dest);
  _cleanup_free_ char *dest = moat_bc_clean(joined);
  bool want_dir = ends_as_dir(o->dest);
  struct copy_job j = {.c = c, .root = root_fd, .own = {.set = true}, .dest = dest};
  if (o->chown && resolve_chown(root_fd, o->chown, &j.own.uid, &j.own.gid, err) < 0)
    return moat_error_wrap(err, "copy to '%s'", o->dest);
  if (o->chmod && parse_chmod(o->chmod, &j.mode, err) < 0)
    return moat_error_wrap(err, "copy to '%s'", o->dest);
  j.have_mode = o->chmod != NULL;
  int probe = moat_bc_openat2(root_fd, dest, O_PATH | O_DIRECTORY, MOAT_BC_IN_ROOT);
  bool is_dir = probe >= 0;
  if (probe >= 0)
    close(probe);
  if (n > 1 && !want_dir && !is_dir)
    return moat_error_set(err, EINVAL,
                          "copy to '%s': with more than one source the destination must be a directory "
                          "(end it with '/')",
                          o->dest);
  _cleanup_free_ char *buf = xmalloc(COPY_BUF);
  j.buf = buf;
  for (size_t i = 0; i < n; i++) {
    const char *src = expanded[i];
    _cleanup_free_ char *clean = moat_bc_clean(src);
    _cleanup_close_ int fd =
        moat_bc_openat2(c->root, clean, O_RDONLY | O_NOCTTY | O_NONBLOCK, MOAT_BC_IN_ROOT);
    if (fd < 0) {
      if (errno == ENOENT || errno == ENOTDIR)
        return moat_error_set(err, ENOENT, "copy '%s' to '%s': not in the build context", src, o->dest);
      return moat_error_errno(err, "copy '%s' to '%s': open", src, o->dest);
    }
    struct stat st;
    if (fstat(fd, &st) < 0)
      return moat_error_errno(err, "copy '%s' to '%s': stat", src, o->dest);
    int r;
    _cleanup_free_ char *target = NULL;
    if (S_ISDIR(st.st_mode)) {
      j.dest = dest;
      r = moat_bc_walk(fd, copy_visit, &j, err);
    } else if (!S_ISREG(st.st_mode)) {
      r = moat_error_set(err, EINVAL, "not a regular file or directory");
    } else if (o->add && is_tar(fd)) {
      j.dest = dest;
      r = add_tar(&j, o, fd, src, err);
    } else {
      target = (want_dir || is_dir) ? moat_bc_join(dest, base_name(clean)) : xstrdup(dest);
      j.dest = target;
      r = moat_bc_walk(fd, copy_visit, &j, err);
    }
    if (r < 0)
      return moat_error_wrap(err, "copy '%s' to '%s'", src, o->dest);
  }
  return 0;
}

bool moat_image_has_dir(int root_fd, const char *path) {
  _cleanup_free_ char *clean = moat_bc_clean(path);
  _cleanup_close_ int fd = moat_bc_openat2(root_fd, clean, O_PATH | O_DIRECTORY, MOAT_BC_IN_ROOT);
  return fd >= 0;
}

int moat_image_mkdirs(int root_fd, const char *path, moat_error **err) {
  _cleanup_free_ char *clean = moat_bc_clean(path);
  const struct moat_bc_owner root = {.set = true, .uid = 0, .gid = 0};
  int fd = -1;
  if (moat_bc_mkdirs(root_fd, clean, MOAT_BC_IN_ROOT, &root, &fd, err) < 0)
    return moat_error_wrap(err, "WORKDIR %s", path);
  close(fd);
  return 0;
}

/* build_context.c -- a template build's context: its tar unpacked under rules that keep every entry
 * inside, read, globbed and hashed (COPY/ADD into an image is build_copy.c) */
#include "build_context.h"

#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <search.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "../common/sha256.h"
#include "../common/util.h"
#include "build_context_internal.h"

#define BC_BUF (128 * 1024)

int moat_bc_openat2(int dir, const char *path, int flags, uint64_t resolve) {
  struct open_how how = {.flags = (uint64_t)(flags | O_CLOEXEC), .resolve = resolve};
  for (int i = 0; i < 64; i++) {
    int fd = (int)syscall(SYS_openat2, dir, path, &how, sizeof(how));
    if (fd >= 0 || (errno != EAGAIN && errno != EINTR))
      return fd;
  }
  return -1;
}

char *moat_bc_clean(const char *path) {
  size_t n = strlen(path);
  char *out = xmalloc(n + 2);
  size_t o = 0;
  for (const char *p = path; *p;) {
    while (*p == '/')
      p++;
    size_t len = strcspn(p, "/");
    if (len == 0)
      break;
    if (len == 1 && p[0] == '.') {
    } else if (len == 2 && p[0] == '.' && p[1] == '.') {
      while (o > 0 && out[o - 1] != '/')
        o--;
      if (o > 0)
        o--;
    } else {
      if (o > 0)
        out[o++] = '/';
      memcpy(out + o, p, len);
      o += len;
    }
    p += len;
  }
  if (o == 0)
    out[o++] = '.';
  out[o] = '\0';
  return out;
}

char *moat_bc_join(const char *a, const char *b) {
  bool ea = strcmp(a, ".") == 0 || !*a, eb = strcmp(b, ".") == 0 || !*b;
  if (ea && eb)
    return xstrdup(".");
  if (ea)
    return xstrdup(b);
  if (eb)
    return xstrdup(a);
  return xasprintf("%s/%s", a, b);
}

void moat_bc_split(const char *path, char **parent, char **name) {
  const char *slash = strrchr(path, '/');
  if (!slash) {
    *parent = xstrdup(".");
    *name = xstrdup(path);
    return;
  }
  *parent = xstrndup(path, (size_t)(slash - path));
  *name = xstrdup(slash + 1);
}

static int set_owner(int fd, const struct moat_bc_owner *own) {
  if (!own || !own->set)
    return 0;
  return fchown(fd, own->uid, own->gid);
}

int moat_bc_mkdirs(int root, const char *path, uint64_t resolve, const struct moat_bc_owner *own, int *out,
                   moat_error **err) {
  int fd = moat_bc_openat2(root, path, O_PATH | O_DIRECTORY, resolve);
  if (fd >= 0) {
    *out = fd;
    return 0;
  }
  if (errno != ENOENT)
    return moat_error_errno(err, "open directory '%s'", path);
  _cleanup_close_ int cur = moat_bc_openat2(root, ".", O_PATH | O_DIRECTORY, resolve);
  if (cur < 0)
    return moat_error_errno(err, "open the root");
  _cleanup_free_ char *prefix = xmalloc(strlen(path) + 1);
  size_t o = 0;
  for (const char *p = path; *p;) {
    size_t len = strcspn(p, "/");
    if (o > 0)
      prefix[o++] = '/';
    memcpy(prefix + o, p, len);
    o += len;
    prefix[o] = '\0';
    _cleanup_free_ char *comp = xstrndup(p, len);
    p += len;
    while (*p == '/')
      p++;
    int next = moat_bc_openat2(root, prefix, O_PATH | O_DIRECTORY, resolve);
    if (next < 0 && errno != ENOENT)
      return moat_error_errno(err, "open directory '%s'", prefix);
    if (next < 0) {
      if (mkdirat(cur, comp, 0700) < 0) {
        if (errno == EEXIST)
          return moat_error_set(err, ENOTDIR, "'%s' is in the way and is not a directory", prefix);
        return moat_error_errno(err, "mkdir '%s'", prefix);
      }
      _cleanup_close_ int made = moat_bc_openat2(cur, comp, O_RDONLY | O_DIRECTORY, MOAT_BC_BENEATH);
      if (made < 0)
        return moat_error_errno(err, "open directory '%s'", prefix);
      if (set_owner(made, own) < 0 || fchmod(made, 0755) < 0)
        return moat_error_errno(err, "chown/chmod directory '%s'", prefix);
      next = moat_bc_openat2(cur, comp, O_PATH | O_DIRECTORY, MOAT_BC_BENEATH);
      if (next < 0)
        return moat_error_errno(err, "open directory '%s'", prefix);
    }
    close(cur);
    cur = next;
  }
  *out = steal_fd(&cur);
  return 0;
}

int moat_bc_make_room(int dir, const char *name, const char *shown, moat_error **err) {
  struct stat st;
  if (fstatat(dir, name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
    if (errno == ENOENT)
      return 0;
    return moat_error_errno(err, "stat '%s'", shown);
  }
  if (S_ISDIR(st.st_mode))
    return moat_error_set(err, EISDIR, "'%s' is a directory", shown);
  if (unlinkat(dir, name, 0) < 0 && errno != ENOENT)
    return moat_error_errno(err, "unlink '%s'", shown);
  return 0;
}

struct archive *moat_bc_reader(int fd, bool allow_empty, moat_error **err) {
  struct archive *a = archive_read_new();
  if (!a) {
    moat_error_set(err, ENOMEM, "archive_read_new");
    return NULL;
  }
  /* Only the filters libarchive has built in: none of them may start an external program. */
  if (archive_read_support_filter_gzip(a) != ARCHIVE_OK ||
      archive_read_support_filter_bzip2(a) != ARCHIVE_OK || archive_read_support_filter_xz(a) != ARCHIVE_OK ||
      archive_read_support_filter_zstd(a) != ARCHIVE_OK || archive_read_support_format_tar(a) != ARCHIVE_OK ||
      (allow_empty && archive_read_support_format_empty(a) != ARCHIVE_OK)) {
    moat_error_set(err, ENOTSUP, "tar reader: %s", archive_error_string(a) ? archive_error_string(a) : "?");
    archive_read_free(a);
    return NULL;
  }
  if (archive_read_open_fd(a, fd, BC_BUF) != ARCHIVE_OK) {
    moat_error_set(err, EINVAL, "not a tar: %s", archive_error_string(a) ? archive_error_string(a) : "?");
    archive_read_free(a);
    return NULL;
  }
  return a;
}

/* 0 when name (a tar entry's or hard link's) is relative without a ".." component; *clean its clean
 * form and *depth its number of components. */
static int check_name(const char *name, const struct moat_bc_untar *u, const char *shown, char **clean,
                      size_t *depth, moat_error **err) {
  size_t n = strlen(name);
  if (n > MOAT_BUILD_CONTEXT_MAX_NAME)
    return moat_error_set(err, EINVAL, "%s: entry '%.64s...' is longer than %d bytes", u->what, name,
                          MOAT_BUILD_CONTEXT_MAX_NAME);
  if (n == 0)
    return moat_error_set(err, EINVAL, "%s: an entry%s has an empty name", u->what, shown);
  if (name[0] == '/')
    return moat_error_set(err, EINVAL, "%s: entry '%s'%s is an absolute path", u->what, name, shown);
  size_t d = 0;
  for (const char *p = name; *p;) {
    while (*p == '/')
      p++;
    size_t len = strcspn(p, "/");
    if (len == 2 && p[0] == '.' && p[1] == '.')
      return moat_error_set(err, EINVAL, "%s: entry '%s'%s has a '..' component", u->what, name, shown);
    if (len > 0 && !(len == 1 && p[0] == '.'))
      d++;
    p += len;
  }
  *clean = moat_bc_clean(name);
  *depth = d;
  return 0;
}

/* 0 when a symlink at depth parent_depth (its directory's components) pointing to target stays
 * within the tar's root, resolved lexically. */
static int check_symlink(const char *name, const char *target, size_t parent_depth,
                         const struct moat_bc_untar *u, moat_error **err) {
  if (!target || !*target)
    return moat_error_set(err, EINVAL, "%s: symlink '%s' has an empty target", u->what, name);
  if (strlen(target) > MOAT_BUILD_CONTEXT_MAX_NAME)
    return moat_error_set(err, EINVAL, "%s: symlink '%s' has a target longer than %d bytes", u->what, name,
                          MOAT_BUILD_CONTEXT_MAX_NAME);
  if (target[0] == '/')
    return moat_error_set(err, EINVAL, "%s: symlink '%s' -> '%s' has an absolute target", u->what, name,
                          target);
  size_t d = parent_depth;
  for (const char *p = target; *p;) {
    while (*p == '/')
      p++;
    size_t len = strcspn(p, "/");
    if (len == 2 && p[0] == '.' && p[1] == '.') {
      if (d == 0)
        return moat_error_set(err, EINVAL, "%s: symlink '%s' -> '%s' points out of the root", u->what, name,
                              target);
      d--;
    } else if (len > 0 && !(len == 1 && p[0] == '.')) {
      d++;
    }
    p += len;
  }
  return 0;
}

static const char *type_name(mode_t t) {
  switch (t) {
  case AE_IFCHR:
    return "a character device";
  case AE_IFBLK:
    return "a block device";
  case AE_IFIFO:
    return "a fifo";
  case AE_IFSOCK:
    return "a socket";
  default:
    return "of an unknown type";
  }
}

static int cmp_str(const void *a, const void *b) { return strcmp(a, b); }

struct untar_state {
  const struct moat_bc_untar *u;
  void *done; /* tsearch tree of the clean names of non-directories unpacked so far */
  uint64_t bytes;
  char *buf;
};

static int untar_file(struct untar_state *s, struct archive *a, struct archive_entry *e, int dir,
                      const char *name, const char *shown, moat_error **err) {
  const struct moat_bc_untar *u = s->u;
  if (moat_bc_make_room(dir, name, shown, err) < 0)
    return -1;
  _cleanup_close_ int fd = openat(dir, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0)
    return moat_error_errno(err, "%s: create '%s'", u->what, shown);
  for (;;) {
    la_ssize_t r = archive_read_data(a, s->buf, BC_BUF);
    if (r == 0)
      break;
    if (r < 0)
      return moat_error_set(err, EINVAL, "%s: entry '%s': %s", u->what, shown, archive_error_string(a));
    s->bytes += (uint64_t)r;
    if (s->bytes > u->max_bytes)
      return moat_error_set(err, EFBIG, "%s: more than %llu bytes of file data (at entry '%s')", u->what,
                            (unsigned long long)u->max_bytes, shown);
    if (write_all(fd, s->buf, (size_t)r) < 0)
      return moat_error_errno(err, "%s: write '%s'", u->what, shown);
  }
  struct moat_bc_owner own = u->entries;
  if (!own.set && u->keep_owner)
    own = (struct moat_bc_owner){true, (uid_t)archive_entry_uid(e), (gid_t)archive_entry_gid(e)};
  if (set_owner(fd, &own) < 0 || fchmod(fd, archive_entry_perm(e) & 07777) < 0)
    return moat_error_errno(err, "%s: chown/chmod '%s'", u->what, shown);
  struct timespec ts[2] = {{.tv_sec = archive_entry_mtime(e), .tv_nsec = archive_entry_mtime_nsec(e)}};
  ts[1] = ts[0];
  if (!archive_entry_mtime_is_set(e))
    ts[0].tv_nsec = ts[1].tv_nsec = UTIME_OMIT;
  (void)futimens(fd, ts);
  return 0;
}

static int untar_dir(struct untar_state *s, struct archive_entry *e, int dir, const char *name,
                     const char *shown, moat_error **err) {
  const struct moat_bc_untar *u = s->u;
  struct stat st;
  if (fstatat(dir, name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
    if (errno != ENOENT)
      return moat_error_errno(err, "%s: stat '%s'", u->what, shown);
    if (mkdirat(dir, name, 0700) < 0)
      return moat_error_errno(err, "%s: mkdir '%s'", u->what, shown);
  } else if (!S_ISDIR(st.st_mode)) {
    return moat_error_set(err, EINVAL, "%s: directory entry '%s' where a non-directory is", u->what, shown);
  }
  _cleanup_close_ int fd = moat_bc_openat2(dir, name, O_RDONLY | O_DIRECTORY, MOAT_BC_BENEATH);
  if (fd < 0)
    return moat_error_errno(err, "%s: open directory '%s'", u->what, shown);
  struct moat_bc_owner own = u->entries;
  if (!own.set && u->keep_owner)
    own = (struct moat_bc_owner){true, (uid_t)archive_entry_uid(e), (gid_t)archive_entry_gid(e)};
  if (set_owner(fd, &own) < 0 || fchmod(fd, archive_entry_perm(e) & 07777) < 0)
    return moat_error_errno(err, "%s: chown/chmod '%s'", u->what, shown);
  return 0;
}

static int untar_entry(struct untar_state *s, struct archive *a, struct archive_entry *e, moat_error **err) {
  const struct moat_bc_untar *u = s->u;
  const char *raw = archive_entry_pathname(e);
  if (!raw)
    return moat_error_set(err, EINVAL, "%s: an entry has no name libarchive can read", u->what);
  _cleanup_free_ char *clean = NULL;
  size_t depth = 0;
  if (check_name(raw, u, "", &clean, &depth, err) < 0)
    return -1;
  const char *hard = archive_entry_hardlink(e);
  mode_t type = archive_entry_filetype(e);
  if (!hard && type != AE_IFREG && type != AE_IFDIR && type != AE_IFLNK)
    return moat_error_set(err, EINVAL, "%s: entry '%s' is %s", u->what, raw, type_name(type));
  if (archive_entry_size_is_set(e) && archive_entry_size(e) > 0) {
    uint64_t size = (uint64_t)archive_entry_size(e);
    if (size > u->max_bytes - s->bytes)
      return moat_error_set(err, EFBIG, "%s: more than %llu bytes of file data (entry '%s' holds %llu)",
                            u->what, (unsigned long long)u->max_bytes, raw, (unsigned long long)size);
    if (type != AE_IFREG || hard)
      s->bytes += size; /* what libarchive skips is read and inflated too */
  }
  if (strcmp(clean, ".") == 0) {
    if (hard || type != AE_IFDIR)
      return moat_error_set(err, EINVAL, "%s: entry '%s' names the root and is not a directory", u->what,
                            raw);
    return 0;
  }
  _cleanup_free_ char *full = moat_bc_join(u->base, clean);
  _cleanup_free_ char *parent = NULL, *name = NULL;
  moat_bc_split(full, &parent, &name);
  _cleanup_close_ int dir = -1;
  if (moat_bc_mkdirs(u->root, parent, u->resolve, &u->dirs, &dir, err) < 0) {
    if (*err && (*err)->status == ELOOP)
      (*err)->status = EINVAL;
    return moat_error_wrap(err, "%s: entry '%s'", u->what, raw);
  }
  if (hard) {
    _cleanup_free_ char *tclean = NULL;
    size_t tdepth;
    _cleanup_free_ char *shown = xasprintf(" (the target of hard link '%.256s')", raw);
    if (check_name(hard, u, shown, &tclean, &tdepth, err) < 0)
      return -1;
    if (!tfind(tclean, &s->done, cmp_str))
      return moat_error_set(err, EINVAL, "%s: hard link '%s' -> '%s': no such file unpacked before it",
                            u->what, raw, hard);
    if (strcmp(tclean, clean) == 0)
      return 0;
    _cleanup_free_ char *tfull = moat_bc_join(u->base, tclean);
    _cleanup_free_ char *tparent = NULL, *tname = NULL;
    moat_bc_split(tfull, &tparent, &tname);
    _cleanup_close_ int tdir = moat_bc_openat2(u->root, tparent, O_PATH | O_DIRECTORY, u->resolve);
    if (tdir < 0)
      return moat_error_errno(err, "%s: hard link '%s' -> '%s'", u->what, raw, hard);
    if (moat_bc_make_room(dir, name, raw, err) < 0)
      return moat_error_wrap(err, "%s", u->what);
    if (linkat(tdir, tname, dir, name, 0) < 0)
      return moat_error_errno(err, "%s: hard link '%s' -> '%s'", u->what, raw, hard);
  } else if (type == AE_IFDIR) {
    if (untar_dir(s, e, dir, name, raw, err) < 0)
      return -1;
    return 0; /* a directory is no hard link's target */
  } else if (type == AE_IFLNK) {
    const char *target = archive_entry_symlink(e);
    if (check_symlink(raw, target, depth - 1, u, err) < 0)
      return -1;
    if (moat_bc_make_room(dir, name, raw, err) < 0)
      return moat_error_wrap(err, "%s", u->what);
    if (symlinkat(target, dir, name) < 0)
      return moat_error_errno(err, "%s: symlink '%s'", u->what, raw);
    struct moat_bc_owner own = u->entries;
    if (!own.set && u->keep_owner)
      own = (struct moat_bc_owner){true, (uid_t)archive_entry_uid(e), (gid_t)archive_entry_gid(e)};
    if (own.set && fchownat(dir, name, own.uid, own.gid, AT_SYMLINK_NOFOLLOW) < 0)
      return moat_error_errno(err, "%s: chown '%s'", u->what, raw);
  } else if (untar_file(s, a, e, dir, name, raw, err) < 0) {
    return -1;
  }
  if (!tfind(clean, &s->done, cmp_str)) {
    char *key = steal_pointer(&clean);
    if (!tsearch(key, &s->done, cmp_str)) {
      free(key);
      return moat_error_set(err, ENOMEM, "%s: out of memory", u->what);
    }
  }
  return 0;
}

int moat_bc_untar(struct archive *a, const struct moat_bc_untar *u, moat_error **err) {
  struct untar_state s = {.u = u, .buf = xmalloc(BC_BUF)};
  size_t entries = 0;
  int ret = 0;
  for (;;) {
    struct archive_entry *e;
    int r = archive_read_next_header(a, &e);
    if (r == ARCHIVE_EOF)
      break;
    if (r != ARCHIVE_OK && r != ARCHIVE_WARN) {
      ret = moat_error_set(err, EINVAL, "%s: bad tar after %zu entries: %s", u->what, entries,
                           archive_error_string(a) ? archive_error_string(a) : "?");
      break;
    }
    if (++entries > u->max_entries) {
      ret = moat_error_set(err, EINVAL, "%s: more than %zu entries", u->what, u->max_entries);
      break;
    }
    if (untar_entry(&s, a, e, err) < 0) {
      ret = -1;
      break;
    }
  }
  tdestroy(s.done, free);
  free(s.buf);
  return ret;
}

int moat_build_context_open(struct moat_build_context **out, int tar_fd, const char *work_dir,
                            uint64_t max_bytes, size_t max_entries, moat_error **err) {
  *out = NULL;
  _cleanup_free_ char *dir = xasprintf("%s/ctx-XXXXXX", work_dir);
  if (!mkdtemp(dir))
    return moat_error_errno(err, "build context: mkdtemp under %s", work_dir);
  struct moat_build_context *c = xcalloc(1, sizeof(*c));
  c->dir = steal_pointer(&dir);
  c->max_bytes = max_bytes;
  c->max_entries = max_entries;
  c->root_mode = 0755;
  c->root = open(c->dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
  struct stat st;
  if (c->root < 0 || fstat(c->root, &st) < 0) {
    moat_error_errno(err, "build context: open %s", c->dir);
    moat_build_context_free(c);
    return -1;
  }
  c->root_dev = st.st_dev;
  c->root_ino = st.st_ino;
  struct archive *a = moat_bc_reader(tar_fd, true, err);
  if (!a) {
    moat_error_wrap(err, "build context");
    moat_build_context_free(c);
    return -1;
  }
  struct moat_bc_untar u = {.root = c->root,
                            .base = ".",
                            .resolve = MOAT_BC_BENEATH,
                            .max_bytes = max_bytes,
                            .max_entries = max_entries,
                            .what = "build context",
                            .root_mode = &c->root_mode};
  int r = moat_bc_untar(a, &u, err);
  archive_read_free(a);
  if (r < 0) {
    moat_build_context_free(c);
    return -1;
  }
  *out = c;
  return 0;
}

void moat_build_context_free(struct moat_build_context *c) {
  if (!c)
    return;
  if (c->root >= 0)
    close(c->root);
  moat_error *e = NULL;
  if (rm_rf(c->dir, &e) < 0)
    moat_error_free(&e);
  free(c->dir);
  free(c);
}

const char *moat_build_context_dir(const struct moat_build_context *c) { return c->dir; }

mode_t moat_bc_top_mode(const struct moat_build_context *c, const struct stat *st) {
  if (S_ISDIR(st->st_mode) && st->st_dev == c->root_dev && st->st_ino == c->root_ino)
    return c->root_mode;
  return st->st_mode & 07777;
}

int moat_build_context_read(struct moat_build_context *c, const char *path, char **text, size_t *len,
                            size_t max, moat_error **err) {
  *text = NULL;
  _cleanup_free_ char *clean = moat_bc_clean(path);
  _cleanup_close_ int fd = moat_bc_openat2(c->root, clean, O_RDONLY | O_NOCTTY | O_NONBLOCK, MOAT_BC_IN_ROOT);
  if (fd < 0) {
    if (errno == ENOENT || errno == ENOTDIR)
      return moat_error_set(err, ENOENT, "'%s' is not in the build context", path);
    return moat_error_errno(err, "open '%s' in the build context", path);
  }
  struct stat st;
  if (fstat(fd, &st) < 0)
    return moat_error_errno(err, "stat '%s'", path);
  if (!S_ISREG(st.st_mode))
    return moat_error_set(err, EINVAL, "'%s' in the build context is not a regular file", path);
  if ((uint64_t)st.st_size > max)
    return moat_error_set(err, EFBIG, "'%s' is larger than %zu bytes", path, max);
  _cleanup_free_ char *buf = xmalloc(max + 2);
  ssize_t r = read_all(fd, buf, max + 1);
  if (r < 0)
    return moat_error_errno(err, "read '%s'", path);
  if ((size_t)r > max)
    return moat_error_set(err, EFBIG, "'%s' is larger than %zu bytes", path, max);
  buf[r] = '\0';
  if (len)
    *len = (size_t)r;
  *text = steal_pointer(&buf);
  return 0;
}

/* The names in the directory at rel (clean, in the context) that match pattern, each appended to
 * *v as rel/name, sorted. */
struct strvec {
  char **v;
  size_t n, cap;
};
static void vec_push(struct strvec *s, char *p) {
  if (s->n + 2 > s->cap) {
    s->cap = s->cap ? s->cap * 2 : 16;
    s->v = xrealloc(s->v, s->cap * sizeof(char *));
  }
  s->v[s->n++] = p;
  s->v[s->n] = NULL;
}
static int cmp_strp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Reads the names of the directory fd (consumed) into a sorted vector. */
static int read_names(int fd, struct strvec *names, moat_error **err) {
  DIR *d = fdopendir(fd);
  if (!d) {
    close(fd);
    return moat_error_errno(err, "fdopendir");
  }
  struct dirent *de;
  errno = 0;
  while ((de = readdir(d)) != NULL) {
    if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
      continue;
    vec_push(names, xstrdup(de->d_name));
  }
  int e = errno;
  closedir(d);
  if (e)
    return moat_error_set(err, e, "readdir: %s", strerror(e));
  if (names->n)
    qsort(names->v, names->n, sizeof(char *), cmp_strp);
  return 0;
}

static bool has_magic(const char *comp, size_t len) {
  for (size_t i = 0; i < len; i++)
    if (comp[i] == '*' || comp[i] == '?' || comp[i] == '[' || comp[i] == '\\')
      return true;
  return false;
}

static int expand_one(struct moat_build_context *c, const char *src, struct strvec *out, size_t limit,
                      moat_error **err) {
  size_t budget = 4 * limit; /* candidates over all levels: symlink cycles cannot multiply the work */
  _cleanup_free_ char *clean = moat_bc_clean(src);
  struct strvec cur = {0};
  vec_push(&cur, xstrdup("."));
  int ret = 0;
  bool magic = false;
  for (const char *p = strcmp(clean, ".") == 0 ? "" : clean; *p && ret == 0;) {
    size_t len = strcspn(p, "/");
    _cleanup_free_ char *comp = xstrndup(p, len);
    p += len;
    if (*p == '/')
      p++;
    struct strvec next = {0};
    if (!has_magic(comp, len)) {
      for (size_t i = 0; i < cur.n; i++)
        vec_push(&next, moat_bc_join(cur.v[i], comp));
    } else {
      magic = true;
      for (size_t i = 0; i < cur.n && ret == 0; i++) {
        int fd = moat_bc_openat2(c->root, cur.v[i], O_RDONLY | O_DIRECTORY, MOAT_BC_IN_ROOT);
        if (fd < 0)
          continue; /* not a directory: nothing beneath it matches */
        struct strvec names = {0};
        if (read_names(fd, &names, err) < 0) {
          ret = moat_error_wrap(err, "'%s'", cur.v[i]);
        } else {
          for (size_t k = 0; k < names.n; k++) {
            if (fnmatch(comp, names.v[k], 0) != 0)
              continue;
            if (next.n + out->n >= limit || budget-- == 0) {
              ret = moat_error_set(err, EINVAL, "source '%s' matches more than %zu paths", src, limit);
              break;
            }
            vec_push(&next, moat_bc_join(cur.v[i], names.v[k]));
          }
        }
        strv_free(names.v);
      }
    }
    strv_free(cur.v);
    cur = next;
  }
  for (size_t i = 0; i < cur.n && ret == 0; i++) {
    int fd = moat_bc_openat2(c->root, cur.v[i], O_PATH, MOAT_BC_IN_ROOT);
    if (fd < 0)
      continue;
    close(fd);
    vec_push(out, steal_pointer(&cur.v[i]));
  }
  size_t matched = 0;
  for (size_t i = 0; i < cur.n; i++)
    matched += cur.v[i] == NULL;
  for (size_t i = 0; i < cur.n; i++)
    free(cur.v[i]);
  free(cur.v);
  if (ret == 0 && matched == 0)
    return moat_error_set(err, ENOENT, "%s '%s' is not in the build context",
                          magic ? "no file matches" : "source", src);
  return ret;
}

int moat_build_context_expand(struct moat_build_context *c, char *const *srcs, size_t n, char ***out,
                              moat_error **err) {
  *out = NULL;
  struct strvec v = {0};
  vec_push(&v, NULL);
  v.n = 0;
  size_t limit = c->max_entries + 1;
  for (size_t i = 0; i < n; i++) {
    if (expand_one(c, srcs[i], &v, limit, err) < 0) {
      strv_free(v.v);
      return -1;
    }
  }
  *out = v.v;
  return 0;
}

static void h_field(struct moat_sha256 *s, char tag, const void *data, uint64_t len) {
  uint8_t hdr[9] = {(uint8_t)tag};
  for (int i = 0; i < 8; i++)
    hdr[1 + i] = (uint8_t)(len >> (8 * i));
  moat_sha256_update(s, hdr, sizeof(hdr));
  if (len)
    moat_sha256_update(s, data, (size_t)len);
}
static void h_str(struct moat_sha256 *s, char tag, const char *str) {
  if (!str) {
    h_field(s, (char)(tag | 0x20), NULL, 0); /* absent differs from "" */
    return;
  }
  h_field(s, tag, str, strlen(str));
}
static void h_u64(struct moat_sha256 *s, char tag, uint64_t v) {
  uint8_t b[8];
  for (int i = 0; i < 8; i++)
    b[i] = (uint8_t)(v >> (8 * i));
  h_field(s, tag, b, 8);
}

struct digest_walk {
  struct moat_build_context *c;
  struct moat_sha256 *s;
  char *buf;
};

static int digest_visit(void *arg, const struct moat_bc_node *n, moat_error **err) {
  struct digest_walk *w = arg;
  h_str(w->s, 'N', n->rel);
  mode_t t = n->st->st_mode & S_IFMT;
  h_str(w->s, 'T', S_ISDIR(t) ? "d" : S_ISLNK(t) ? "l" : "f");
  h_u64(w->s, 'M', *n->rel ? n->st->st_mode & 07777 : moat_bc_top_mode(w->c, n->st));
  if (S_ISLNK(t)) {
    h_str(w->s, 'L', n->target);
    return 0;
  }
  if (!S_ISREG(t))
    return 0;
  uint64_t size = (uint64_t)n->st->st_size;
  h_u64(w->s, 'S', size);
  h_field(w->s, 'C', NULL, 0);
  uint64_t done = 0;
  while (done < size) {
    ssize_t r = pread(n->fd, w->buf, BC_BUF, (off_t)done);
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0)
      return moat_error_errno(err, "read '%s'", n->rel);
    if (r == 0)
      return moat_error_set(err, EIO, "'%s' is shorter than its size", n->rel);
    if ((uint64_t)r > size - done)
      r = (ssize_t)(size - done);
    moat_sha256_update(w->s, w->buf, (size_t)r);
    done += (uint64_t)r;
  }
  return 0;
}

int moat_build_context_digest(struct moat_build_context *c, char *const *expanded, size_t n,
                              const struct moat_copy_opts *o, uint8_t out[32], moat_error **err) {
  struct moat_sha256 s;
  moat_sha256_init(&s);
  h_str(&s, 'V', "moat-build-context-digest-1");
  h_u64(&s, 'n', n);
  _cleanup_free_ char *buf = xmalloc(BC_BUF);
  struct digest_walk w = {.c = c, .s = &s, .buf = buf};
  for (size_t i = 0; i < n; i++) {
    _cleanup_free_ char *clean = moat_bc_clean(expanded[i]);
    h_str(&s, 'P', clean);
    _cleanup_close_ int fd =
        moat_bc_openat2(c->root, clean, O_RDONLY | O_NOCTTY | O_NONBLOCK, MOAT_BC_IN_ROOT);
    if (fd < 0) {
      if (errno == ENOENT || errno == ENOTDIR)
        return moat_error_set(err, ENOENT, "source '%s' is not in the build context", expanded[i]);
      return moat_error_errno(err, "open source '%s'", expanded[i]);
    }
    if (moat_bc_walk(fd, digest_visit, &w, err) < 0)
      return moat_error_wrap(err, "digest of '%s'", expanded[i]);
  }
  if (o) {
    h_str(&s, 'D', o->dest);
    h_str(&s, 'W', o->workdir);
    h_str(&s, 'U', o->chown);
    h_str(&s, 'X', o->chmod);
    h_u64(&s, 'A', o->add);
  }
  moat_sha256_final(&s, out);
  return 0;
}

/* Visits the node at rel beneath top (fd: the top's own fd when rel is ""). */
static int walk_node(int top, const char *rel,
                     int (*visit)(void *, const struct moat_bc_node *, moat_error **), void *arg,
                     moat_error **err) {
  _cleanup_close_ int fd = -1;
  struct stat st;
  if (!*rel) {
    fd = dup(top);
    if (fd < 0)
      return moat_error_errno(err, "dup");
  } else {
    fd = moat_bc_openat2(top, rel, O_PATH | O_NOFOLLOW, MOAT_BC_BENEATH);
    if (fd < 0)
      return moat_error_errno(err, "open '%s'", rel);
  }
  if (fstat(fd, &st) < 0)
    return moat_error_errno(err, "stat '%s'", rel);
  struct moat_bc_node node = {.rel = rel, .fd = -1, .st = &st};
  if (S_ISLNK(st.st_mode)) {
    _cleanup_free_ char *target = xmalloc(MOAT_BUILD_CONTEXT_MAX_NAME + 1);
    ssize_t r = readlinkat(fd, "", target, MOAT_BUILD_CONTEXT_MAX_NAME);
    if (r < 0)
      return moat_error_errno(err, "readlink '%s'", rel);
    target[r] = '\0';
    node.target = target;
    return visit(arg, &node, err);
  }
  if (!S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode))
    return moat_error_set(err, EINVAL, "'%s' is not a file, directory or symlink", rel);
  if (*rel) {
    close(fd);
    fd = moat_bc_openat2(top, rel, O_RDONLY | O_NOFOLLOW | O_NOCTTY | O_NONBLOCK, MOAT_BC_BENEATH);
    if (fd < 0)
      return moat_error_errno(err, "open '%s'", rel);
    if (fstat(fd, &st) < 0)
      return moat_error_errno(err, "stat '%s'", rel);
  }
  node.fd = fd;
  if (visit(arg, &node, err) < 0)
    return -1;
  if (!S_ISDIR(st.st_mode))
    return 0;
  int dfd = openat(fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0)
    return moat_error_errno(err, "open directory '%s'", rel);
  close(fd);
  fd = -1;
  struct strvec names = {0};
  if (read_names(dfd, &names, err) < 0)
    return moat_error_wrap(err, "'%s'", rel);
  int ret = 0;
  for (size_t i = 0; i < names.n && ret == 0; i++) {
    _cleanup_free_ char *child = *rel ? xasprintf("%s/%s", rel, names.v[i]) : xstrdup(names.v[i]);
    ret = walk_node(top, child, visit, arg, err);
  }
  strv_free(names.v);
  return ret;
}

int moat_bc_walk(int top, int (*visit)(void *arg, const struct moat_bc_node *node, moat_error **err),
                 void *arg, moat_error **err) {
  return walk_node(top, "", visit, arg, err);
}

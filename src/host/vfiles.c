/* vfiles.c -- file operations beneath an untrusted directory fd, never following a link */
#include "vfiles.h"

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

#include "../common/util.h"

#define VF_RESOLVE (RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV)

static int vf_openat(int dir, const char *path, int flags, mode_t mode) {
  struct open_how how = {.flags = (uint64_t)(flags | O_CLOEXEC), .mode = mode, .resolve = VF_RESOLVE};
  return (int)syscall(SYS_openat2, dir, path, &how, sizeof(how));
}

int moat_vfile_check_path(const char *path, moat_error **err) {
  size_t total = strlen(path);
  if (total > 4096)
    return moat_error_set(err, ENAMETOOLONG, "path is longer than 4096 bytes");
  for (const char *p = path; *p;) {
    while (*p == '/')
      p++;
    size_t len = strcspn(p, "/");
    if ((len == 1 && p[0] == '.') || (len == 2 && p[0] == '.' && p[1] == '.'))
      return moat_error_set(err, EINVAL, "path '%.256s' has a '.' or '..' component", path);
    if (len > 255)
      return moat_error_set(err, ENAMETOOLONG, "a name in path '%.256s' is longer than 255 bytes", path);
    p += len;
  }
  return 0;
}

/* path without its leading slashes ("" -> "."). */
static const char *rel(const char *path) {
  while (*path == '/')
    path++;
  return *path ? path : ".";
}

int moat_vfile_open(int root, const char *path, int *fd, bool *is_dir, uint64_t *size, moat_error **err) {
  if (moat_vfile_check_path(path, err) < 0)
    return -1;
  /* O_NONBLOCK: a FIFO a sandbox made must not block the open */
  _cleanup_close_ int f = vf_openat(root, rel(path), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_NOFOLLOW, 0);
  if (f < 0)
    return moat_error_errno(err, "open %.256s", path);
  struct stat st;
  if (fstat(f, &st) < 0)
    return moat_error_errno(err, "stat %.256s", path);
  if (!S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode))
    return moat_error_set(err, EINVAL, "%.256s is not a regular file or a directory", path);
  int fl = fcntl(f, F_GETFL);
  if (fl >= 0)
    fcntl(f, F_SETFL, fl & ~O_NONBLOCK);
  *is_dir = S_ISDIR(st.st_mode);
  *size = (uint64_t)st.st_size;
  *fd = steal_fd(&f);
  return 0;
}

static int entry_cmp(const void *a, const void *b) {
  return strcmp(((const struct moat_file_entry *)a)->name, ((const struct moat_file_entry *)b)->name);
}

int moat_vfile_list(int dir_fd, const char *path, struct moat_file_entry **out, size_t *n, moat_error **err) {
  *out = NULL;
  *n = 0;
  int d2 = openat(dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (d2 < 0)
    return moat_error_errno(err, "open directory %.256s", path);
  DIR *d = fdopendir(d2);
  if (!d) {
    close(d2);
    return moat_error_errno(err, "read directory %.256s", path);
  }
  const char *base = rel(path);
  bool at_root = strcmp(base, ".") == 0;
  struct moat_file_entry *v = NULL;
  size_t len = 0, cap = 0;
  struct dirent *de;
  while ((de = readdir(d))) {
    if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
      continue;
    struct stat st;
    if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
      continue; /* removed meanwhile */
    if (len == cap) {
      cap = cap ? cap * 2 : 32;
      v = xrealloc(v, cap * sizeof(*v));
    }
    struct moat_file_entry *e = &v[len++];
    memset(e, 0, sizeof(*e));
    e->name = xstrdup(de->d_name);
    e->path = at_root ? xasprintf("/%s", de->d_name) : xasprintf("/%s/%s", base, de->d_name);
    e->type = S_ISREG(st.st_mode) ? 'f' : S_ISDIR(st.st_mode) ? 'd' : S_ISLNK(st.st_mode) ? 'l' : 'o';
    e->size = (uint64_t)st.st_size;
    e->mode = st.st_mode & 07777;
    e->mtime_ms = (int64_t)st.st_mtim.tv_sec * 1000 + st.st_mtim.tv_nsec / 1000000;
    e->uid = st.st_uid;
    e->gid = st.st_gid;
    if (S_ISLNK(st.st_mode)) {
      char target[4097];
      ssize_t tl = readlinkat(dirfd(d), de->d_name, target, sizeof(target) - 1);
      if (tl >= 0) {
        target[tl] = '\0';
        e->link_target = xstrdup(target);
      }
    }
  }
  closedir(d);
  if (len)
    qsort(v, len, sizeof(*v), entry_cmp);
  *out = v;
  *n = len;
  return 0;
}

/* Splits path into its parent's fd (opened beneath root, made when mkdirs) and its last name. */
static int open_parent(int root, const char *path, bool mkdirs, char *name, size_t name_len,
                       moat_error **err) {
  if (moat_vfile_check_path(path, err) < 0)
    return -1;
  const char *r = rel(path);
  if (strcmp(r, ".") == 0)
    return moat_error_set(err, EINVAL, "path must name a file in the volume, not its root");
  _cleanup_free_ char *dir = xstrdup(r);
  size_t dl = strlen(dir);
  while (dl > 0 && dir[dl - 1] == '/')
    dir[--dl] = '\0';
  char *slash = strrchr(dir, '/');
  const char *last = slash ? slash + 1 : dir;
  if (strlen(last) >= name_len)
    return moat_error_set(err, ENAMETOOLONG, "name too long");
  snprintf(name, name_len, "%s", last);
  int cur = fcntl(root, F_DUPFD_CLOEXEC, 3);
  if (cur < 0)
    return moat_error_errno(err, "dup");
  if (!slash)
    return cur;
  *slash = '\0';
  for (char *p = dir, *next; p && *p; p = next) {
    next = strchr(p, '/');
    if (next)
      *next++ = '\0';
    if (!*p)
      continue;
    int fd = vf_openat(cur, p, O_PATH | O_DIRECTORY, 0);
    if (fd < 0 && errno == ENOENT && mkdirs && (mkdirat(cur, p, 0755) == 0 || errno == EEXIST))
      fd = vf_openat(cur, p, O_PATH | O_DIRECTORY, 0);
    int e = errno;
    close(cur);
    if (fd < 0) {
      errno = e;
      return moat_error_errno(err, "open directory '%.256s' of %.256s", p, path);
    }
    cur = fd;
  }
  return cur;
}

int moat_vfile_remove(int root, const char *path, moat_error **err) {
  char name[256];
  _cleanup_close_ int parent = open_parent(root, path, false, name, sizeof(name), err);
  if (parent < 0)
    return -1;
  struct stat st;
  if (fstatat(parent, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
    return moat_error_errno(err, "remove %.256s", path);
  if (unlinkat(parent, name, S_ISDIR(st.st_mode) ? AT_REMOVEDIR : 0) < 0)
    return moat_error_errno(err, "remove %.256s", path);
  return 0;
}

struct moat_vfile_writer {
  int parent, fd;
  char name[256], tmp[64];
  uint64_t written;
};

int moat_vfile_write_open(int root, const char *path, mode_t mode, struct moat_vfile_writer **out,
                          moat_error **err) {
  struct moat_vfile_writer *w = xcalloc(1, sizeof(*w));
  w->fd = -1;
  w->parent = open_parent(root, path, true, w->name, sizeof(w->name), err);
  if (w->parent < 0) {
    free(w);
    return -1;
  }
  for (int tries = 0; tries < 16 && w->fd < 0; tries++) {
    char id[17] = {0};
    random_id(id, 16);
    snprintf(w->tmp, sizeof(w->tmp), ".moat-upload-%s", id);
    w->fd =
        vf_openat(w->parent, w->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, mode ? mode & 07777 : 0644);
    if (w->fd < 0 && errno != EEXIST)
      break;
  }
  if (w->fd < 0) {
    moat_error_errno(err, "create a file beside %.256s", path);
    close(w->parent);
    free(w);
    return -1;
  }
  *out = w;
  return 0;
}

int moat_vfile_write(struct moat_vfile_writer *w, const char *data, size_t len, moat_error **err) {
  while (len > 0) {
    ssize_t n = write(w->fd, data, len);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      return moat_error_errno(err, "write");
    data += n;
    len -= (size_t)n;
    w->written += (uint64_t)n;
  }
  return 0;
}

int moat_vfile_write_finish(struct moat_vfile_writer *w, uint64_t *written, moat_error **err) {
  if (fsync(w->fd) < 0)
    return moat_error_errno(err, "fsync");
  if (renameat(w->parent, w->tmp, w->parent, w->name) < 0)
    return moat_error_errno(err, "rename into place");
  w->tmp[0] = '\0';
  fsync(w->parent);
  *written = w->written;
  return 0;
}

void moat_vfile_writer_close(struct moat_vfile_writer *w) {
  if (!w)
    return;
  if (w->fd >= 0)
    close(w->fd);
  if (w->tmp[0])
    unlinkat(w->parent, w->tmp, 0);
  close(w->parent);
  free(w);
}

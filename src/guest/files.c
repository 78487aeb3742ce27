/* files.c -- file operations inside the sandbox's own view: READ WRITE REMOVE LIST STAT MKDIR MOVE (WATCH)
 *
 * The worker takes on the user's file-system identity (setgroups + setfsgid + setfsuid) before it
 * touches anything, so permission checks are that user's and what it creates belongs to them.
 * Paths are normalised lexically (guest_path_resolve); symlinks are never followed when removing
 * or listing below the requested path.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/fsuid.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../common/util.h"
#include "guest.h"

#define LIST_MAX_DEPTH 16
#define REMOVE_MAX_DEPTH 1024
#define DISCARD_MAX                                                                                          \
  (256ull << 20) /* upload bytes swallowed after a failed write, so the host sees the error */

/* Frames to the host, batched into one buffer. */
struct wbuf {
  int fd;
  struct moat_msg m; /* scratch */
  uint8_t *b;
  size_t len, cap;
  bool failed;
};

static void wbuf_flush(struct wbuf *w) {
  if (w->len && !w->failed && write_all(w->fd, w->b, w->len) < 0)
    w->failed = true;
  w->len = 0;
}

static void wbuf_put(struct wbuf *w, const struct moat_msg *m) {
  size_t need = 5 + m->len;
  if (w->len + need > w->cap) {
    w->cap = w->len + need > 64u << 10 ? w->len + need : 64u << 10;
    w->b = xrealloc(w->b, w->cap);
  }
  uint32_t l = (uint32_t)(m->len + 1);
  uint8_t *p = w->b + w->len;
  p[0] = (uint8_t)l;
  p[1] = (uint8_t)(l >> 8);
  p[2] = (uint8_t)(l >> 16);
  p[3] = (uint8_t)(l >> 24);
  p[4] = m->type;
  if (m->len)
    memcpy(p + 5, m->buf, m->len);
  w->len += need;
  if (w->len >= 60u << 10)
    wbuf_flush(w);
}

static void wbuf_free(struct wbuf *w) {
  free(w->b);
  moat_msg_free(&w->m);
}

static int send_errno(int fd, int e, const char *what, const char *path) {
  return moat_msg_send_error(fd, e, "%s %s: %s", what, path, strerror(e));
}

static const char *base_name(const char *path) {
  const char *s = strrchr(path, '/');
  return s && s[1] ? s + 1 : path;
}

static char *dir_name(const char *path) {
  const char *s = strrchr(path, '/');
  if (!s || s == path)
    return xstrdup("/");
  return xstrndup(path, (size_t)(s - path));
}

static char *join(const char *dir, const char *name) {
  return strcmp(dir, "/") == 0 ? xasprintf("/%s", name) : xasprintf("%s/%s", dir, name);
}

static char entry_type(mode_t m) {
  if (S_ISREG(m))
    return 'f';
  if (S_ISDIR(m))
    return 'd';
  if (S_ISLNK(m))
    return 'l';
  return 'o';
}

/* Fills m with the REP_ENTRY of name in dirfd (not following a symlink), reported as path. */
static int make_entry(struct moat_msg *m, int dirfd, const char *name, const char *path,
                      const struct stat *st) {
  moat_msg_reset(m, MOAT_REP_ENTRY);
  moat_msg_put_str(m, MOAT_T_PATH, path);
  moat_msg_put_str(m, MOAT_T_NAME, strcmp(path, "/") == 0 ? "/" : base_name(path));
  moat_msg_put_u32(m, MOAT_T_TYPE, (uint32_t)entry_type(st->st_mode));
  moat_msg_put_u64(m, MOAT_T_SIZE, (uint64_t)st->st_size);
  moat_msg_put_u32(m, MOAT_T_MODE, st->st_mode & 07777);
  moat_msg_put_i64(m, MOAT_T_MTIME, (int64_t)st->st_mtim.tv_sec * 1000 + st->st_mtim.tv_nsec / 1000000);
  moat_msg_put_u32(m, MOAT_T_UID, st->st_uid);
  moat_msg_put_u32(m, MOAT_T_GID, st->st_gid);
  if (S_ISLNK(st->st_mode)) {
    char target[GUEST_PATH_MAX + 1];
    ssize_t n = readlinkat(dirfd, name, target, sizeof(target) - 1);
    if (n >= 0)
      moat_msg_put(m, MOAT_T_LINK, target, (size_t)n);
  }
  return 0;
}

/* Takes on the user's file-system identity. 0 or -1 with err. */
int guest_become_user(const struct guest_user *u, moat_error **err) {
  if (geteuid() != 0) {
    if (u->uid != geteuid())
      return moat_error_set(err, EPERM, "cannot act as user '%s': the guest does not run as root", u->name);
    return 0;
  }
  if (setgroups(u->ngroups, u->groups) < 0)
    return moat_error_errno(err, "setgroups for user '%s'", u->name);
  setfsgid(u->gid);
  if ((gid_t)setfsgid((gid_t)-1) != u->gid)
    return moat_error_set(err, EPERM, "setfsgid %u failed", (unsigned)u->gid);
  setfsuid(u->uid);
  if ((uid_t)setfsuid((uid_t)-1) != u->uid)
    return moat_error_set(err, EPERM, "setfsuid %u failed", (unsigned)u->uid);
  return 0;
}

static void op_read(int fd, const char *path) {
  _cleanup_close_ int f = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (f < 0) {
    send_errno(fd, errno, "open", path);
    return;
  }
  struct stat st;
  if (fstat(f, &st) < 0) {
    send_errno(fd, errno, "stat", path);
    return;
  }
  if (S_ISDIR(st.st_mode)) {
    send_errno(fd, EISDIR, "read", path);
    return;
  }
  if (!S_ISREG(st.st_mode)) {
    moat_msg_send_error(fd, EINVAL, "read %s: not a regular file", path);
    return;
  }
  fd_set_nonblock(f, false);
  posix_fadvise(f, 0, 0, POSIX_FADV_SEQUENTIAL);
  struct moat_msg m;
  moat_msg_init(&m, MOAT_REP_OK);
  moat_msg_put_u64(&m, MOAT_T_SIZE, (uint64_t)st.st_size);
  moat_msg_put_u32(&m, MOAT_T_MODE, st.st_mode & 07777);
  int r = moat_msg_send(fd, &m);
  moat_msg_free(&m);
  if (r < 0)
    return;
  _cleanup_free_ uint8_t *buf = xmalloc(MOAT_PROTO_CHUNK);
  for (;;) {
    ssize_t n = read(f, buf, MOAT_PROTO_CHUNK);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      send_errno(fd, errno, "read", path);
      return;
    }
    if (n == 0)
      break;
    if (moat_msg_send_data(fd, MOAT_MSG_DATA, buf, (size_t)n) < 0)
      return;
  }
  moat_msg_send_empty(fd, MOAT_MSG_END);
}

/* After a failed upload: swallow the host's remaining frames (up to END, EOF or a bound) so that
 * it is not cut off mid-send before it reads the error already sent. */
static void discard_upload(int fd, struct moat_msg *m) {
  uint64_t seen = 0;
  moat_error *err = NULL;
  while (seen < DISCARD_MAX) {
    int r = moat_msg_recv(fd, m, &err);
    if (r <= 0 || m->type != MOAT_MSG_DATA)
      break;
    seen += m->len;
  }
  moat_error_free(&err);
}

static void op_write(int fd, const char *path, const struct moat_msg *req, uid_t fsuid) {
  struct stat old;
  bool existed = lstat(path, &old) == 0;
  if (existed && S_ISDIR(old.st_mode)) {
    send_errno(fd, EISDIR, "write", path);
    return;
  }
  if (!existed && errno != ENOENT) {
    send_errno(fd, errno, "stat", path);
    return;
  }
  _cleanup_free_ char *dir = dir_name(path);
  moat_error *err = NULL;
  if (mkdir_p(dir, 0755, &err) < 0) {
    moat_msg_send_error(fd, err->status, "%s", moat_error_msg(err));
    moat_error_free(&err);
    return;
  }
  _cleanup_close_ int dfd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) {
    send_errno(fd, errno, "open", dir);
    return;
  }
  char rnd[13];
  random_id(rnd, 12);
  _cleanup_free_ char *tmp = xasprintf(".moat-upload-%s", rnd);
  _cleanup_close_ int tfd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (tfd < 0) {
    send_errno(fd, errno, "create in", dir);
    return;
  }
  struct moat_msg m;
  moat_msg_init(&m, MOAT_REP_OK);
  if (moat_msg_send(fd, &m) < 0)
    goto fail_quiet;
  uint64_t size = 0;
  for (;;) {
    int r = moat_msg_recv(fd, &m, &err);
    if (r == 0)
      goto fail_quiet; /* host went away: keep the old file */
    if (r < 0) {
      moat_msg_send_error(fd, EPROTO, "%s", moat_error_msg(err));
      moat_error_free(&err);
      goto fail_quiet;
    }
    if (m.type == MOAT_MSG_END)
      break;
    if (m.type != MOAT_MSG_DATA) {
      moat_msg_send_error(fd, EPROTO, "guest protocol: frame type %u inside an upload", m.type);
      goto fail_quiet;
    }
    struct moat_field f;
    if (!moat_msg_find(&m, MOAT_T_DATA, &f))
      continue;
    if (write_all(tfd, f.data, f.len) < 0) {
      send_errno(fd, errno, "write", path);
      unlinkat(dfd, tmp, 0);
      discard_upload(fd, &m);
      moat_msg_free(&m);
      return;
    }
    size += f.len;
  }
  uint32_t mode = 0644;
  if (moat_msg_get_u32(req, MOAT_T_MODE, &mode) == 0)
    mode &= 07777;
  else if (existed && S_ISREG(old.st_mode))
    mode = old.st_mode & 07777;
  if (existed && S_ISREG(old.st_mode) && fsuid == 0 && (old.st_uid != 0 || old.st_gid != 0))
    (void)fchown(tfd, old.st_uid, old.st_gid); /* root replacing someone's file keeps it theirs */
  if (fchmod(tfd, mode) < 0) {
    send_errno(fd, errno, "chmod", path);
    goto fail_quiet;
  }
  if (close(steal_fd(&tfd)) < 0) {
    send_errno(fd, errno, "write", path);
    goto fail_quiet;
  }
  if (renameat(dfd, tmp, dfd, base_name(path)) < 0) {
    send_errno(fd, errno, "rename onto", path);
    goto fail_quiet;
  }
  moat_msg_reset(&m, MOAT_REP_OK);
  moat_msg_put_u64(&m, MOAT_T_SIZE, size);
  moat_msg_send(fd, &m);
  moat_msg_free(&m);
  return;
fail_quiet:
  unlinkat(dfd, tmp, 0);
  moat_msg_free(&m);
}

static uint64_t mount_id(int dirfd, const char *name) {
  struct statx sx;
  if (statx(dirfd, name, AT_SYMLINK_NOFOLLOW, STATX_MNT_ID, &sx) < 0 || !(sx.stx_mask & STATX_MNT_ID))
    return 0;
  return sx.stx_mnt_id;
}

/* The connection of the operation running in this worker: long operations that send nothing
 * until they end tell the host now and then that they are alive (proto.h). */
static int g_beat_fd = -1;
static uint64_t g_beat_ns;

static void beat(void) {
  uint64_t now = now_ns();
  if (g_beat_fd < 0 || now - g_beat_ns < MOAT_PROTO_HEARTBEAT_MS * 1000000ull)
    return;
  moat_msg_send_alive(g_beat_fd);
  g_beat_ns = now;
}

/* Removes the tree name in dirfd, which is known to be a directory on mount mnt (device dev).
 * Never follows symlinks, never crosses into another mount. 0 or -1 with err. */
static int remove_tree(int dirfd, const char *name, const char *path, dev_t dev, uint64_t mnt, int depth,
                       moat_error **err) {
  if (depth > REMOVE_MAX_DEPTH)
    return moat_error_set(err, ELOOP, "remove %s: tree deeper than %d levels", path, REMOVE_MAX_DEPTH);
  int dfd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dfd < 0)
    return moat_error_errno(err, "open %s", path);
  DIR *d = fdopendir(dfd);
  if (!d) {
    close(dfd);
    return moat_error_errno(err, "open %s", path);
  }
  int ret = 0;
  struct dirent *de;
  while (ret == 0 && (errno = 0, de = readdir(d)) != NULL) {
    if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
      continue;
    beat();
    struct stat st;
    if (fstatat(dfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
      if (errno == ENOENT)
        continue;
      _cleanup_free_ char *p = join(path, de->d_name);
      ret = moat_error_errno(err, "stat %s", p);
      break;
    }
    if (S_ISDIR(st.st_mode)) {
      _cleanup_free_ char *p = join(path, de->d_name);
      uint64_t sub = mount_id(dfd, de->d_name);
      if (st.st_dev != dev || (mnt && sub && sub != mnt))
        ret = moat_error_set(err, EBUSY, "remove %s: a mount point is in the way", p);
      else
        ret = remove_tree(dfd, de->d_name, p, dev, mnt, depth + 1, err);
    } else if (unlinkat(dfd, de->d_name, 0) < 0 && errno != ENOENT) {
      _cleanup_free_ char *p = join(path, de->d_name);
      ret = moat_error_errno(err, "unlink %s", p);
    }
  }
  if (ret == 0 && errno != 0 && de == NULL)
    ret = moat_error_errno(err, "read %s", path);
  closedir(d);
  if (ret < 0)
    return ret;
  if (unlinkat(dirfd, name, AT_REMOVEDIR) < 0 && errno != ENOENT)
    return moat_error_errno(err, "rmdir %s", path);
  return 0;
}

static void op_remove(int fd, const char *path, bool recursive) {
  if (strcmp(path, "/") == 0) {
    moat_msg_send_error(fd, EBUSY, "remove /: refusing to remove the root");
    return;
  }
  _cleanup_free_ char *dir = dir_name(path);
  _cleanup_close_ int dfd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) {
    send_errno(fd, errno, "open", dir);
    return;
  }
  const char *name = base_name(path);
  struct stat st;
  if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
    send_errno(fd, errno, "remove", path);
    return;
  }
  if (S_ISDIR(st.st_mode)) {
    if (recursive) {
      moat_error *err = NULL;
      if (remove_tree(dfd, name, path, st.st_dev, mount_id(dfd, name), 0, &err) < 0) {
        moat_msg_send_error(fd, err->status, "%s", moat_error_msg(err));
        moat_error_free(&err);
        return;
      }
    } else if (unlinkat(dfd, name, AT_REMOVEDIR) < 0) {
      send_errno(fd, errno, "remove", path);
      return;
    }
  } else if (unlinkat(dfd, name, 0) < 0) {
    send_errno(fd, errno, "remove", path);
    return;
  }
  moat_msg_send_empty(fd, MOAT_REP_OK);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Sends the entries of the directory dfd (reported as path), depth levels deep. Subdirectories
 * that cannot be opened are listed but not entered. Takes ownership of dfd. */
static void list_dir(struct wbuf *w, int dfd, const char *path, uint32_t depth) {
  DIR *d = fdopendir(dfd);
  if (!d) {
    close(dfd);
    return;
  }
  char **names = NULL;
  size_t n = 0, cap = 0;
  struct dirent *de;
  while ((de = readdir(d)) != NULL) {
    if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
      continue;
    if (n == cap) {
      cap = cap ? cap * 2 : 64;
      names = xrealloc(names, cap * sizeof(char *));
    }
    names[n++] = xstrdup(de->d_name);
  }
  if (n > 1)
    qsort(names, n, sizeof(char *), cmp_str);
  for (size_t i = 0; i < n && !w->failed; i++) {
    struct stat st;
    if (fstatat(dfd, names[i], &st, AT_SYMLINK_NOFOLLOW) < 0)
      continue;
    _cleanup_free_ char *p = join(path, names[i]);
    make_entry(&w->m, dfd, names[i], p, &st);
    wbuf_put(w, &w->m);
    if (depth > 1 && S_ISDIR(st.st_mode)) {
      int sub = openat(dfd, names[i], O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (sub >= 0)
        list_dir(w, sub, p, depth - 1);
    }
  }
  for (size_t i = 0; i < n; i++)
    free(names[i]);
  free(names);
  closedir(d);
}

static void op_list(int fd, const char *path, uint32_t depth) {
  int dfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) {
    send_errno(fd, errno, "list", path);
    return;
  }
  if (depth < 1)
    depth = 1;
  if (depth > LIST_MAX_DEPTH)
    depth = LIST_MAX_DEPTH;
  struct wbuf w = {.fd = fd};
  moat_msg_init(&w.m, MOAT_REP_ENTRY);
  list_dir(&w, dfd, path, depth);
  moat_msg_reset(&w.m, MOAT_MSG_END);
  wbuf_put(&w, &w.m);
  wbuf_flush(&w);
  wbuf_free(&w);
}

static void op_stat(int fd, const char *path) {
  struct stat st;
  if (lstat(path, &st) < 0) {
    send_errno(fd, errno, "stat", path);
    return;
  }
  struct moat_msg m;
  moat_msg_init(&m, MOAT_REP_ENTRY);
  make_entry(&m, AT_FDCWD, path, path, &st);
  moat_msg_send(fd, &m);
  moat_msg_free(&m);
}

static void op_mkdir(int fd, const char *path, bool parents, const struct moat_msg *req) {
  uint32_t mode = 0755;
  bool explicit_mode = moat_msg_get_u32(req, MOAT_T_MODE, &mode) == 0;
  mode &= 07777;
  if (parents) {
    moat_error *err = NULL;
    if (mkdir_p(path, mode, &err) < 0) {
      moat_msg_send_error(fd, err->status, "%s", moat_error_msg(err));
      moat_error_free(&err);
      return;
    }
    struct stat st;
    if (stat(path, &st) < 0) {
      send_errno(fd, errno, "mkdir", path);
      return;
    }
    if (!S_ISDIR(st.st_mode)) {
      moat_msg_send_error(fd, EEXIST, "mkdir %s: exists and is not a directory", path);
      return;
    }
  } else if (mkdir(path, mode) < 0) {
    send_errno(fd, errno, "mkdir", path);
    return;
  }
  if (explicit_mode && chmod(path, mode) < 0) {
    send_errno(fd, errno, "chmod", path);
    return;
  }
  moat_msg_send_empty(fd, MOAT_REP_OK);
}

static void op_move(int fd, const char *from, const char *to) {
  struct stat st;
  if (lstat(from, &st) < 0) {
    send_errno(fd, errno, "move", from);
    return;
  }
  _cleanup_free_ char *dir = dir_name(to);
  moat_error *err = NULL;
  if (mkdir_p(dir, 0755, &err) < 0) {
    moat_msg_send_error(fd, err->status, "%s", moat_error_msg(err));
    moat_error_free(&err);
    return;
  }
  if (rename(from, to) < 0) {
    moat_msg_send_error(fd, errno, "move %s to %s: %s", from, to, strerror(errno));
    return;
  }
  moat_msg_send_empty(fd, MOAT_REP_OK);
}

/* Reads a path field: resolves it against home. NULL (error sent) when missing or invalid. */
static char *path_arg(int fd, const struct moat_msg *req, uint16_t tag, const char *home) {
  struct moat_field f;
  if (!moat_msg_find(req, tag, &f)) {
    moat_msg_send_error(fd, EINVAL, "missing path");
    return NULL;
  }
  if (f.len > GUEST_PATH_MAX) {
    moat_msg_send_error(fd, EINVAL, "path longer than %d bytes", GUEST_PATH_MAX);
    return NULL;
  }
  _cleanup_free_ char *raw = moat_msg_get_str(req, tag);
  if (!raw) {
    moat_msg_send_error(fd, EINVAL, "path holds a NUL byte");
    return NULL;
  }
  moat_error *err = NULL;
  char *p = guest_path_resolve(home, raw, &err);
  if (!p) {
    moat_msg_send_error(fd, err->status, "%s", moat_error_msg(err));
    moat_error_free(&err);
  }
  return p;
}

void guest_file_op(int fd, const struct moat_msg *req, const char *etc_dir) {
  moat_error *err = NULL;
  g_beat_fd = fd;
  g_beat_ns = now_ns();
  _cleanup_free_ char *user = moat_msg_get_str(req, MOAT_T_USER);
  struct moat_field f;
  if (!user && moat_msg_find(req, MOAT_T_USER, &f)) {
    moat_msg_send_error(fd, EINVAL, "user holds a NUL byte");
    return;
  }
  struct guest_user u;
  if (guest_user_lookup(etc_dir, user, &u, &err) < 0) {
    moat_msg_send_error(fd, err->status, "%s", moat_error_msg(err));
    moat_error_free(&err);
    return;
  }
  _cleanup_free_ char *path = path_arg(fd, req, MOAT_T_PATH, u.home);
  _cleanup_free_ char *path2 = NULL;
  if (!path)
    goto out;
  if (req->type == MOAT_REQ_MOVE && !(path2 = path_arg(fd, req, MOAT_T_PATH2, u.home)))
    goto out;
  if (guest_become_user(&u, &err) < 0) {
    moat_msg_send_error(fd, err->status, "%s", moat_error_msg(err));
    moat_error_free(&err);
    goto out;
  }
  uint32_t flag = 0;
  switch (req->type) {
  case MOAT_REQ_READ:
    op_read(fd, path);
    break;
  case MOAT_REQ_WRITE:
    op_write(fd, path, req, u.uid);
    break;
  case MOAT_REQ_REMOVE:
    moat_msg_get_u32(req, MOAT_T_RECURSIVE, &flag);
    op_remove(fd, path, flag != 0);
    break;
  case MOAT_REQ_LIST:
    flag = 1;
    moat_msg_get_u32(req, MOAT_T_DEPTH, &flag);
    op_list(fd, path, flag);
    break;
  case MOAT_REQ_STAT:
    op_stat(fd, path);
    break;
  case MOAT_REQ_MKDIR:
    moat_msg_get_u32(req, MOAT_T_PARENTS, &flag);
    op_mkdir(fd, path, flag != 0, req);
    break;
  case MOAT_REQ_MOVE:
    op_move(fd, path, path2);
    break;
  case MOAT_REQ_WATCH:
    moat_msg_get_u32(req, MOAT_T_RECURSIVE, &flag);
    guest_watch(fd, path, flag != 0);
    break;
  default:
    moat_msg_send_error(fd, EPROTO, "guest protocol: unknown request type %u", req->type);
    break;
  }
out:
  guest_user_clear(&u);
}

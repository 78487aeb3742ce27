/* util.c -- allocation, file and string helpers shared by moatd, moat-guest and the CLI */
#include "util.h"

#include "assert.h"
#include "fault.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

void moat_freep(void *p) { free(*(void **)p); }

void moat_closep(int *fd) {
  if (*fd >= 0) {
    int saved = errno;
    close(*fd);
    errno = saved;
  }
  *fd = -1;
}

void moat_fclosep(FILE **f) {
  if (*f)
    fclose(*f);
  *f = NULL;
}

void moat_strvfreep(char ***v) {
  strv_free(*v);
  *v = NULL;
}

void moat_closedirp(DIR **d) {
  if (*d)
    closedir(*d);
}

void *xmalloc(size_t n) {
  void *p = moat_fault(MOAT_FAULT_ALLOC) ? NULL : malloc(n ? n : 1);
  if (!p)
    moat_oom("malloc", n, NULL, 0);
  return p;
}

void *xcalloc(size_t n, size_t size) {
  void *p = moat_fault(MOAT_FAULT_ALLOC) ? NULL : calloc(n ? n : 1, size ? size : 1);
  if (!p) /* n * size may overflow: calloc refuses that, and the product says how big */
    moat_oom("calloc", n > 0 && size > SIZE_MAX / n ? SIZE_MAX : n * size, NULL, 0);
  return p;
}

void *xrealloc(void *p, size_t n) {
  p = moat_fault(MOAT_FAULT_ALLOC) ? NULL : realloc(p, n ? n : 1);
  if (!p)
    moat_oom("realloc", n, NULL, 0);
  return p;
}

char *moat_xstrdup(const char *s, const char *file, int line) {
  if (!s)
    moat_assert_fail(file, line, "s != NULL", "xstrdup(NULL): the caller must say what NULL means");
  char *r = strdup(s);
  if (!r)
    moat_oom("strdup", strlen(s) + 1, file, line);
  return r;
}

void *xmemdup(const void *p, size_t n) {
  void *q = xmalloc(n);
  memcpy(q, p, n);
  return q;
}

char *xstrndup(const char *s, size_t n) {
  char *r = strndup(s, n);
  if (!r)
    moat_oom("strndup", n + 1, NULL, 0);
  return r;
}

char *xasprintf(const char *fmt, ...) {
  va_list ap, ap2;
  va_start(ap, fmt);
  va_copy(ap2, ap);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  moat_assert(n >= 0, "xasprintf: bad format \"%s\"", fmt);
  char *s = xmalloc((size_t)n + 1);
  vsnprintf(s, (size_t)n + 1, fmt, ap2);
  va_end(ap2);
  return s;
}

size_t strv_len(char *const *v) {
  size_t n = 0;
  while (v && v[n])
    n++;
  return n;
}

void strv_free(char **v) {
  if (!v)
    return;
  for (size_t i = 0; v[i]; i++)
    free(v[i]);
  free(v);
}

char **strv_concat(char *const *a, char *const *b) {
  size_t na = a ? strv_len(a) : 0, nb = b ? strv_len(b) : 0;
  char **v = xcalloc(na + nb + 1, sizeof(char *));
  for (size_t i = 0; i < na; i++)
    v[i] = xstrdup(a[i]);
  for (size_t i = 0; i < nb; i++)
    v[na + i] = xstrdup(b[i]);
  return v;
}

char **strv_dup(char *const *v) {
  size_t n = strv_len(v);
  char **r = xcalloc(n + 1, sizeof(char *));
  for (size_t i = 0; i < n; i++)
    r[i] = xstrdup(v[i]);
  return r;
}

int write_all(int fd, const void *buf, size_t len) {
  const char *p = buf;
  while (len > 0) {
    ssize_t w = write(fd, p, len);
    if (w < 0) {
      if (errno == EINTR)
        continue;
      return -1;
    }
    p += w;
    len -= (size_t)w;
  }
  return 0;
}

ssize_t read_all(int fd, void *buf, size_t len) {
  char *p = buf;
  size_t got = 0;
  while (got < len) {
    ssize_t r = read(fd, p + got, len - got);
    if (r < 0) {
      if (errno == EINTR)
        continue;
      return -1;
    }
    if (r == 0)
      break;
    got += (size_t)r;
  }
  return (ssize_t)got;
}

int write_file_at(int dirfd, const char *path, const char *content, moat_error **err) {
  _cleanup_close_ int fd = openat(dirfd, path, O_WRONLY | O_CLOEXEC);
  if (fd < 0)
    return moat_error_errno(err, "open %s", path);
  if (write_all(fd, content, strlen(content)) < 0)
    return moat_error_errno(err, "write %s", path);
  return 0;
}

int write_file(const char *path, const char *content, moat_error **err) {
  return write_file_at(AT_FDCWD, path, content, err);
}

int write_file_once(const char *path, const char *content, mode_t mode, moat_error **err) {
  _cleanup_free_ char *tmp = xasprintf("%s.tmp", path);
  unlink(tmp);
  _cleanup_close_ int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode);
  if (fd < 0)
    return moat_error_errno(err, "create %s", tmp);
  if (write_all(fd, content, strlen(content)) < 0 || fsync(fd) < 0) {
    moat_error_errno(err, "write %s", tmp);
    unlink(tmp);
    return -1;
  }
  int lr = link(tmp, path);
  int saved = errno;
  unlink(tmp);
  errno = saved;
  if (lr < 0)
    return moat_error_errno(err, "create %s", path);
  fsync_parent(path);
  return 0;
}

void fsync_parent(const char *path) {
  const char *slash = strrchr(path, '/');
  _cleanup_free_ char *dir =
      slash ? xstrndup(path, slash == path ? 1 : (size_t)(slash - path)) : xstrdup(".");
  _cleanup_close_ int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0)
    fsync(dfd);
}

int read_file(const char *path, char **out, size_t *len, moat_error **err) {
  _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return moat_error_errno(err, "open %s", path);
  size_t cap = 4096, n = 0;
  _cleanup_free_ char *buf = xmalloc(cap);
  for (;;) {
    if (n + 1 >= cap) {
      if (cap >= (16u << 20))
        return moat_error_set(err, EFBIG, "read %s: file too large", path);
      cap *= 2;
      buf = xrealloc(buf, cap);
    }
    ssize_t r = read(fd, buf + n, cap - n - 1);
    if (r < 0) {
      if (errno == EINTR)
        continue;
      return moat_error_errno(err, "read %s", path);
    }
    if (r == 0)
      break;
    n += (size_t)r;
  }
  buf[n] = '\0';
  if (len)
    *len = n;
  *out = steal_pointer(&buf);
  return 0;
}

int mkdir_p(const char *path, mode_t mode, moat_error **err) {
  _cleanup_free_ char *p = xstrdup(path);
  for (char *s = p + 1; *s; s++) {
    if (*s != '/')
      continue;
    *s = '\0';
    if (mkdir(p, mode) < 0 && errno != EEXIST)
      return moat_error_errno(err, "mkdir %s", p);
    *s = '/';
  }
  if (mkdir(p, mode) < 0 && errno != EEXIST)
    return moat_error_errno(err, "mkdir %s", p);
  return 0;
}

static int rm_rf_at(int dir_fd, const char *name, dev_t dev, moat_error **err) {
  struct stat st;
  if (fstatat(dir_fd, name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
    if (errno == ENOENT)
      return 0;
    return moat_error_errno(err, "stat %s", name);
  }
  if (S_ISDIR(st.st_mode)) {
    if (st.st_dev != dev)
      return moat_error_set(err, EBUSY, "rm %s: a mount point is in the way", name);
    int fd = openat(dir_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
      return moat_error_errno(err, "open %s", name);
    DIR *d = fdopendir(fd);
    if (!d) {
      close(fd);
      return moat_error_errno(err, "fdopendir %s", name);
    }
    struct dirent *de;
    int ret = 0;
    while ((de = readdir(d)) != NULL) {
      if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
        continue;
      if (rm_rf_at(dirfd(d), de->d_name, dev, err) < 0) {
        ret = -1;
        break;
      }
    }
    closedir(d);
    if (ret < 0)
      return moat_error_wrap(err, "%s", name);
    if (unlinkat(dir_fd, name, AT_REMOVEDIR) < 0 && errno != ENOENT)
      return moat_error_errno(err, "rmdir %s", name);
    return 0;
  }
  if (unlinkat(dir_fd, name, 0) < 0 && errno != ENOENT)
    return moat_error_errno(err, "unlink %s", name);
  return 0;
}

int rm_rf(const char *path, moat_error **err) {
  struct stat st;
  if (lstat(path, &st) < 0)
    return errno == ENOENT ? 0 : moat_error_errno(err, "stat %s", path);
  return rm_rf_at(AT_FDCWD, path, st.st_dev, err);
}

uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int64_t now_unix(void) { return (int64_t)time(NULL); }

int64_t now_unix_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void random_bytes(void *buf, size_t n) {
  char *p = buf;
  while (n > 0) {
    ssize_t r = getrandom(p, n, 0);
    if (r < 0) {
      if (errno == EINTR)
        continue;
      abort();
    }
    p += r;
    n -= (size_t)r;
  }
}

void random_id(char *out, size_t n) {
  static const char alphabet[] = "0123456789abcdefghijklmnopqrstuvwxyz";
  unsigned char raw[64];
  for (size_t i = 0; i < n;) {
    random_bytes(raw, sizeof(raw));
    for (size_t j = 0; j < sizeof(raw) && i < n; j++) {
      if (raw[j] >= 252) /* 252 = 7*36: reject to stay uniform */
        continue;
      out[i++] = alphabet[raw[j] % 36];
    }
  }
  out[n] = '\0';
}

int fd_set_cloexec(int fd, bool on) {
  int fl = fcntl(fd, F_GETFD);
  if (fl < 0)
    return -1;
  fl = on ? (fl | FD_CLOEXEC) : (fl & ~FD_CLOEXEC);
  return fcntl(fd, F_SETFD, fl);
}

int fd_set_nonblock(int fd, bool on) {
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0)
    return -1;
  fl = on ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK);
  return fcntl(fd, F_SETFL, fl);
}

int parse_u64(const char *s, uint64_t *out) {
  if (!s || !*s)
    return -1;
  uint64_t v = 0;
  for (const char *p = s; *p; p++) {
    if (*p < '0' || *p > '9')
      return -1;
    uint64_t d = (uint64_t)(*p - '0');
    if (v > (UINT64_MAX - d) / 10)
      return -1;
    v = v * 10 + d;
  }
  *out = v;
  return 0;
}

/* The kernel's struct sigaction for rt_sigaction(2) (x86_64 and the generic layout of arm64). */
struct kernel_sigaction {
  void (*handler)(int);
  unsigned long flags;
  void (*restorer)(void);
  uint64_t mask;
};

/* Every signal to its default action and none blocked, as a new program expects to start: execve
 * keeps ignored signals and the mask, and both may come from anywhere above us (the guest blocks
 * SIGCHLD/SIGUSR2 and ignores SIGPIPE; moatd may have inherited SIGINT and SIGQUIT ignored from a
 * shell's `&`). util.h. */
void reset_signals_raw(void) {
  struct kernel_sigaction dfl = {.handler = SIG_DFL};
  for (int sig = 1; sig <= 64; sig++)
    if (sig != SIGKILL && sig != SIGSTOP)
      syscall(SYS_rt_sigaction, sig, &dfl, NULL, sizeof(dfl.mask));
  uint64_t none = 0;
  syscall(SYS_rt_sigprocmask, SIG_SETMASK, &none, NULL, sizeof(none));
}

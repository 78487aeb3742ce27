/* util.h -- cleanup attributes, allocation that aborts on OOM, small file and string helpers */
#ifndef MOAT_UTIL_H
#define MOAT_UTIL_H

#include <dirent.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "error.h"

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

void moat_freep(void *p);
void moat_closep(int *fd);
void moat_fclosep(FILE **f);
void moat_strvfreep(char ***v);
void moat_closedirp(DIR **d);

#define _cleanup_free_ __attribute__((cleanup(moat_freep)))
#define _cleanup_close_ __attribute__((cleanup(moat_closep)))
#define _cleanup_fclose_ __attribute__((cleanup(moat_fclosep)))
#define _cleanup_strv_ __attribute__((cleanup(moat_strvfreep)))
#define _cleanup_dir_ __attribute__((cleanup(moat_closedirp)))

/* Returns *pp and sets *pp to NULL: explicit ownership hand-off. */
static inline void *moat_steal_pointer(void *pp) {
  void **p = (void **)pp;
  void *r = *p;
  *p = NULL;
  return r;
}
#define steal_pointer(pp) moat_steal_pointer(pp)

static inline int steal_fd(int *fd) {
  int r = *fd;
  *fd = -1;
  return r;
}

/* Abort on out-of-memory with a message naming the size (moat_oom); never return NULL (xmalloc(0)
 * returns a unique pointer). xstrdup(s) needs a string: NULL aborts naming the caller's file and line
 * (a caller with an optional string says what NULL means: `s ? xstrdup(s) : NULL`). */
void *xmalloc(size_t n);
void *xcalloc(size_t n, size_t size);
void *xrealloc(void *p, size_t n);
char *moat_xstrdup(const char *s, const char *file, int line);
#define xstrdup(s) moat_xstrdup((s), __FILE__, __LINE__)
char *xstrndup(const char *s, size_t n);
void *xmemdup(const void *p, size_t n);
char *xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* NULL-terminated string vectors. */
size_t strv_len(char *const *v);
void strv_free(char **v);
char **strv_dup(char *const *v);
/* A new vector of copies of a's strings then b's (either may be NULL); caller strv_frees. */
char **strv_concat(char *const *a, char *const *b);

/* Writes all of buf (retrying EINTR / short writes). Returns 0 or -1 with errno set. */
int write_all(int fd, const void *buf, size_t len);
/* Reads exactly len bytes. Returns len, or the number read before EOF, or -1 with errno set. */
ssize_t read_all(int fd, void *buf, size_t len);

/* Writes a short string to a file (O_WRONLY|O_CLOEXEC, no O_CREAT unless create). */
int write_file(const char *path, const char *content, moat_error **err);
int write_file_at(int dirfd, const char *path, const char *content, moat_error **err);
/* Creates path holding content, whole and durably, never replacing a file that is there:
 * content goes to PATH.tmp (made afresh, mode), is fsynced and hard-linked to path, and path's
 * directory is fsynced; a crash never leaves path empty or partial, and link() fails with EEXIST
 * (as O_EXCL would) when another process made path meanwhile. 0 or -1. */
int write_file_once(const char *path, const char *content, mode_t mode, moat_error **err);
/* fsyncs the directory holding path (best effort: a rename or link into it is then durable). */
void fsync_parent(const char *path);
/* Every signal (glibc's reserved 32 and 33 too) to its default action and none blocked, as a new
 * program expects to start: execve keeps ignored signals and the mask. Raw system calls only
 * (safe between fork and exec of a threaded process); about 10 us for all 64. */
void reset_signals_raw(void);
/* Reads a whole (small, < 16 MiB) file into a NUL-terminated buffer the caller frees. */
int read_file(const char *path, char **out, size_t *len, moat_error **err);

/* mkdir -p with mode for the created directories. Returns 0 or -1. */
int mkdir_p(const char *path, mode_t mode, moat_error **err);
/* rm -rf path; does not cross mount points. Returns 0 (also when path is absent) or -1. */
int rm_rf(const char *path, moat_error **err);

/* Monotonic clock in nanoseconds and wall clock in seconds / milliseconds. */
uint64_t now_ns(void);
int64_t now_unix(void);
int64_t now_unix_ms(void);

/* Random bytes from getrandom(2); aborts on failure. */
void random_bytes(void *buf, size_t n);
/* Writes n random lowercase base-36 characters plus NUL into out (size n+1). */
void random_id(char *out, size_t n);

/* Sets/clears O_CLOEXEC / O_NONBLOCK. Return 0 or -1 with errno. */
int fd_set_cloexec(int fd, bool on);
int fd_set_nonblock(int fd, bool on);

/* Parses a decimal unsigned 64-bit integer; the whole string must be digits. 0 or -1. */
int parse_u64(const char *s, uint64_t *out);

#endif

/* guest_client.h -- the host side of the guest protocol (see proto/proto.h)
 *
 * Every call opens its own connection to the sandbox's guest socket, so calls on one sandbox run
 * concurrently. Errors carry the guest's errno in err->status (ENOENT, EEXIST, ENOTDIR, EISDIR,
 * EACCES, ENOSPC, EINVAL, ...) so the API can choose an HTTP status; a sandbox that does not
 * answer gives ECONNREFUSED / EPIPE / EPROTO.
 */
#ifndef MOAT_GUEST_CLIENT_H
#define MOAT_GUEST_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "../common/error.h"

struct moat_exec_req {
  char **argv;            /* argv[0] is looked up in PATH inside the sandbox; NULL-terminated */
  char **env;             /* "K=V" entries applied over the guest's default environment; may be NULL */
  const char *cwd;        /* NULL = user's home */
  const char *user;       /* NULL = root */
  uint32_t timeout_ms;    /* 0 = none */
  uint64_t max_output;    /* bytes kept per stream; 0 = 16 MiB */
  const void *stdin_data; /* may be NULL; stdin is then empty (EOF) */
  size_t stdin_len;
};

struct moat_exec_result {
  int pid;
  int exit_code; /* -1 when killed by a signal */
  int signal;    /* 0 unless killed by a signal */
  bool timed_out;
  bool stdout_truncated, stderr_truncated;
  uint64_t duration_ms;
  char *out; /* owned, NUL-terminated for convenience (may contain NULs) */
  size_t out_len;
  char *err;
  size_t err_len;
};

void moat_exec_result_free(struct moat_exec_result *r);

/* Runs a command to completion. Returns 0 and fills res (also for non-zero exit codes and
 * timeouts), or -1 when the command could not be started (err->status from the guest). */
int moat_guest_exec(const char *sock_path, const struct moat_exec_req *req, struct moat_exec_result *res,
                    moat_error **err);

/* Returns 0 once the guest answers a ping within timeout_ms, or -1. */
int moat_guest_ping(const char *sock_path, int timeout_ms, moat_error **err);

/* File entries, as stat/list report them. */
struct moat_file_entry {
  char *path; /* absolute path inside the sandbox */
  char *name;
  char type; /* 'f', 'd', 'l', 'o' */
  uint64_t size;
  uint32_t mode;
  int64_t mtime_ms;
  uint32_t uid, gid;
  char *link_target; /* NULL unless a symlink */
};
void moat_file_entry_clear(struct moat_file_entry *e);
void moat_file_entries_free(struct moat_file_entry *v, size_t n);

int moat_guest_stat(const char *sock_path, const char *path, const char *user, struct moat_file_entry *out,
                    moat_error **err);
int moat_guest_list(const char *sock_path, const char *path, const char *user, uint32_t depth,
                    struct moat_file_entry **out, size_t *n, moat_error **err);
int moat_guest_mkdir(const char *sock_path, const char *path, const char *user, bool parents,
                     moat_error **err);
int moat_guest_move(const char *sock_path, const char *src, const char *dst, const char *user,
                    moat_error **err);
int moat_guest_remove(const char *sock_path, const char *path, const char *user, bool recursive,
                      moat_error **err);

/* Streaming read: open, then pull chunks until 0 (end) or -1. The reader owns a connection; free
 * it with moat_guest_reader_close in every case. */
struct moat_guest_reader;
int moat_guest_read_open(const char *sock_path, const char *path, const char *user,
                         struct moat_guest_reader **out, uint64_t *size, moat_error **err);
/* Copies up to cap bytes into buf. Returns bytes copied (> 0), 0 at end of file, -1 on error. */
ssize_t moat_guest_read_chunk(struct moat_guest_reader *r, void *buf, size_t cap, moat_error **err);
void moat_guest_reader_close(struct moat_guest_reader *r);

/* Streaming write: open (the guest creates parents and checks the path), push chunks, finish.
 * Finish renames the new file into place; close without finish discards it. */
struct moat_guest_writer;
int moat_guest_write_open(const char *sock_path, const char *path, const char *user, uint32_t mode,
                          struct moat_guest_writer **out, moat_error **err);
int moat_guest_write_chunk(struct moat_guest_writer *w, const void *buf, size_t len, moat_error **err);
int moat_guest_write_finish(struct moat_guest_writer *w, uint64_t *written, moat_error **err);
void moat_guest_writer_close(struct moat_guest_writer *w);

#endif

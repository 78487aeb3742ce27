/* guest_client.h -- the host side of the guest protocol (see proto/proto.h)
 *
 * Every call opens its own connection to the sandbox's guest through its driver's channel, so calls on one
 * sandbox run concurrently. Errors carry the guest's errno in err->status (ENOENT, EEXIST, ENOTDIR, EISDIR,
 * EACCES, ENOSPC, EINVAL, ...) so the API can choose an HTTP status. A guest that cannot be
 * reached gives ECONNREFUSED (nothing listens: it died), EPIPE / ECONNRESET / EPROTO (it closed or
 * broke the protocol, or its socket's peer is not the sandbox's init) or EHOSTUNREACH (it stopped
 * answering: no frame for the channel's timeout while the sandbox was not frozen).
 *
 * Deadlines: every wait on the guest -- connect, each frame of an answer, each send that the
 * guest does not drain -- ends after the channel's timeout without progress. The guest sends
 * REP_ALIVE on open streams and during long operations (proto.h), so a command that runs quietly
 * for hours keeps its stream; a guest that is frozen on purpose (pause, checkpoint: its cgroup
 * reports frozen) is waited for.
 */
#ifndef MOAT_GUEST_CLIENT_H
#define MOAT_GUEST_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "../../common/error.h"

struct moat_guest_ep;

/* How a driver reaches its guests (the linux driver: a unix socket the sandbox's init listens on,
 * checked with SO_PEERCRED; a VM driver: vsock). */
struct moat_guest_channel_ops {
  /* A connected, blocking stream to ep's guest, proven to be the sandbox's own (a listener of
   * anyone else is refused), its connect bounded by timeout_ms. The fd, or -1: ECONNREFUSED
   * (nothing listens), EPROTO (not the sandbox's), EHOSTUNREACH (the guest did not take it). */
  int (*connect)(const struct moat_guest_ep *ep, unsigned timeout_ms, moat_error **err);
  /* True while the sandbox is frozen on purpose (paused, checkpointed): its silence is no hang. */
  bool (*frozen)(const struct moat_guest_ep *ep);
};

/* One driver's channel (a host owns it; it outlives every endpoint that names it). timeout_ms and
 * the unreachable hook are set before any guest is reached (moat_guest_channel_configure). */
struct moat_guest_channel {
  const struct moat_guest_channel_ops *ops;
  unsigned timeout_ms; /* how long any wait on a guest may last without progress */
  /* called (on the caller's thread; it must not block) each time a call gives up on a guest with
   * EHOSTUNREACH; NULL: none */
  void (*unreachable)(const struct moat_guest_ep *ep, void *arg);
  void *unreachable_arg;
};

#define MOAT_GUEST_TIMEOUT_MS_DEFAULT 15000

/* Sets ch's timeout (0: MOAT_GUEST_TIMEOUT_MS_DEFAULT; at least 3 heartbeats) and hook. */
void moat_guest_channel_configure(struct moat_guest_channel *ch, unsigned timeout_ms,
                                  void (*unreachable)(const struct moat_guest_ep *ep, void *arg), void *arg);

/* The host's end of one sandbox's guest: the channel that reaches it and what that channel needs
 * to find and prove it. The linux driver's: a unix socket in a directory the host owns (the
 * sandbox's init binds it when the sandbox is made; the sandbox can neither move, remove nor
 * replace it) and the process that must be its peer (pid, uid). Plain data: copy it freely. */
struct moat_guest_ep {
  const struct moat_guest_channel *ch;
  char path[108];        /* the channel's address of the guest (linux: host path of the socket) */
  pid_t pid;             /* host pid of the sandbox's init */
  uid_t uid;             /* host uid of the sandbox's root */
  char frozen_path[256]; /* linux: the sandbox's v2 cgroup.events ("frozen 1" = paused on purpose), or "" */
  char id[32];           /* sandbox id for the unreachable hook, or "" */
};

/* True when a and b name the same guest: the same channel, address and init (a slot's address is
 * reused by the sandbox that gets the slot next). */
bool moat_guest_ep_same(const struct moat_guest_ep *a, const struct moat_guest_ep *b);

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

/* Options of a streamed or background exec; zero = defaults. */
struct moat_exec_opts {
  bool background;             /* reply with the pid at once; the process runs on */
  const char *tag;             /* NULL or [A-Za-z0-9_.-]{1,64} */
  uint32_t pty_cols, pty_rows; /* both non-zero: run on a pseudo-terminal */
  bool keep_on_disconnect;     /* a dropped stream connection does not kill the process */
};

struct moat_exec_result {
  int pid;
  int exit_code; /* -1 when killed by a signal */
  int signal;    /* 0 unless killed by a signal */
  bool timed_out;
  bool stdout_truncated, stderr_truncated;
  bool oom_killed; /* not the guest's: control sets it (control.h, OOM kills) */
  uint64_t duration_ms;
  char *out; /* owned, NUL-terminated for convenience (may contain NULs) */
  size_t out_len;
  char *err;
  size_t err_len;
};

void moat_exec_result_free(struct moat_exec_result *r);

/* Runs a command to completion. Returns 0 and fills res (also for non-zero exit codes and
 * timeouts), or -1 when the command could not be started (err->status from the guest). */
int moat_guest_exec(const struct moat_guest_ep *ep, const struct moat_exec_req *req,
                    struct moat_exec_result *res, moat_error **err);

/* A live connection to one process: the output of an exec/stream or of an attach. Events are
 * pulled one at a time; input may be pushed while output flows. Close with
 * moat_proc_stream_close in every case (for an exec without keep_on_disconnect, closing before
 * the exit kills the process group). Not thread-safe except that one thread may pull events
 * while another sends input. */
struct moat_proc_stream;

enum moat_proc_event_type {
  MOAT_PROC_STDOUT = 1,
  MOAT_PROC_STDERR,
  MOAT_PROC_DROPPED, /* replay: bytes lost from the ring buffer before what follows (size) */
  MOAT_PROC_EXIT,    /* the end: exit_code, signal, timed_out */
};

struct moat_proc_event {
  enum moat_proc_event_type type;
  const char *data; /* STDOUT/STDERR bytes: valid until the next call on the stream */
  size_t len;
  uint64_t dropped;
  int exit_code, signal;
  bool timed_out;
};

/* Description of a process, as PROCS and ATTACH report it. */
struct moat_proc_info {
  int pid;
  char *tag;   /* or NULL */
  char **argv; /* NULL-terminated */
  int64_t started_at_ms;
  bool running, pty, background;
  int exit_code, signal; /* when !running */
};
void moat_proc_info_clear(struct moat_proc_info *p);
void moat_proc_infos_free(struct moat_proc_info *v, size_t n);

/* Starts a command and returns its stream; *pid is set from REP_STARTED. For opts->background
 * the guest closes at once: *out is set to NULL and only *pid is meaningful. */
int moat_guest_exec_start(const struct moat_guest_ep *ep, const struct moat_exec_req *req,
                          const struct moat_exec_opts *opts, struct moat_proc_stream **out, int *pid,
                          moat_error **err);
/* Attaches to a process by pid (> 0) or tag; replay sends the retained output first. info may be
 * NULL. ESRCH when there is no such process. */
int moat_guest_attach(const struct moat_guest_ep *ep, int pid, const char *tag, bool replay,
                      struct moat_proc_stream **out, struct moat_proc_info *info, moat_error **err);
/* Returns 1 and fills ev, 0 when the stream ended without an exit event (guest closed), -1 on
 * error. timeout_ms < 0 waits forever; on timeout returns -1 with ETIMEDOUT (the stream stays usable). */
int moat_proc_stream_next(struct moat_proc_stream *s, struct moat_proc_event *ev, int timeout_ms,
                          moat_error **err);
int moat_proc_stream_input(struct moat_proc_stream *s, const void *data, size_t len, moat_error **err);
int moat_proc_stream_close_input(struct moat_proc_stream *s, moat_error **err);
int moat_proc_stream_resize(struct moat_proc_stream *s, uint32_t cols, uint32_t rows, moat_error **err);
/* The socket, for poll() by callers that multiplex (readable = an event may be pulled). */
int moat_proc_stream_fd(const struct moat_proc_stream *s);
void moat_proc_stream_close(struct moat_proc_stream *s);

/* One-shot process operations, by pid (> 0) or tag. */
int moat_guest_proc_stdin(const struct moat_guest_ep *ep, int pid, const char *tag, const void *data,
                          size_t len, bool close_stdin, moat_error **err);
int moat_guest_proc_signal(const struct moat_guest_ep *ep, int pid, const char *tag, int signal,
                           moat_error **err);
int moat_guest_proc_resize(const struct moat_guest_ep *ep, int pid, const char *tag, uint32_t cols,
                           uint32_t rows, moat_error **err);
int moat_guest_procs(const struct moat_guest_ep *ep, struct moat_proc_info **out, size_t *n,
                     moat_error **err);

/* File system events under a path (inotify in the guest). */
struct moat_watch;
struct moat_watch_event {
  const char *event; /* "create", "write", "remove", "rename", "overflow"; valid until the next call */
  const char *path;
  const char *path2; /* rename destination or NULL */
};
int moat_guest_watch(const struct moat_guest_ep *ep, const char *path, const char *user, bool recursive,
                     struct moat_watch **out, moat_error **err);
/* 1 with an event, 0 at end, -1 on error (ETIMEDOUT after timeout_ms; the watch stays usable). */
int moat_watch_next(struct moat_watch *w, struct moat_watch_event *ev, int timeout_ms, moat_error **err);
int moat_watch_fd(const struct moat_watch *w);
void moat_watch_close(struct moat_watch *w);

/* The output log of every process of the sandbox (proto.h LOGS): one connection, pulled record by
 * record. A new one ends any older one of the sandbox. */
struct moat_guest_log;
enum moat_guest_log_kind {
  MOAT_GLOG_START = 1, /* a process started: pid, tag, argv, pty, background, started_at_ms */
  MOAT_GLOG_OUTPUT,    /* bytes of stream (0 stdout, 1 stderr; pty: its one stream) */
  MOAT_GLOG_DROPPED,   /* size bytes of stream that the log lost */
  MOAT_GLOG_EXIT,      /* exit_code, signal */
};
struct moat_guest_log_rec {
  enum moat_guest_log_kind kind;
  int pid;
  const char *tag; /* or NULL; valid until the next call */
  bool pty, background;
  int stream;
  const uint8_t *data; /* OUTPUT; valid until the next call */
  size_t len;
  uint64_t size; /* DROPPED */
  char **argv;   /* START; valid until the next call */
  int64_t started_at_ms;
  int exit_code, signal;
};
int moat_guest_log_open(const struct moat_guest_ep *ep, struct moat_guest_log **out, moat_error **err);
/* 1 with a record, 0 when the guest closed, -1 on error (ETIMEDOUT after timeout_ms: usable). */
int moat_guest_log_next(struct moat_guest_log *l, struct moat_guest_log_rec *rec, int timeout_ms,
                        moat_error **err);
/* The connection's socket (for a shutdown(2) from another thread that ends a wait on it). */
int moat_guest_log_fd(const struct moat_guest_log *l);
void moat_guest_log_close(struct moat_guest_log *l);

/* Whether PID 1 itself answers (a request it serves, not a spare worker) within timeout_ms; a
 * frozen sandbox counts as answering. 0 or -1. */
int moat_guest_check(const struct moat_guest_ep *ep, int timeout_ms, moat_error **err);

/* After a restore: has PID 1 re-exec itself with its process table (proto.h RENEW). 0 once the new
 * image answers, or -1. */
int moat_guest_renew(const struct moat_guest_ep *ep, moat_error **err);
/* Sets what an exec that names no user or cwd of its own gets from now on (NULL: root, the
 * user's home); a fork or restore of the sandbox keeps them. */
int moat_guest_set_defaults(const struct moat_guest_ep *ep, const char *user, const char *cwd,
                            moat_error **err);

/* Returns 0 once the guest answers a ping within timeout_ms, or -1. */
int moat_guest_ping(const struct moat_guest_ep *ep, int timeout_ms, moat_error **err);

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

int moat_guest_stat(const struct moat_guest_ep *ep, const char *path, const char *user,
                    struct moat_file_entry *out, moat_error **err);
int moat_guest_list(const struct moat_guest_ep *ep, const char *path, const char *user, uint32_t depth,
                    struct moat_file_entry **out, size_t *n, moat_error **err);
int moat_guest_mkdir(const struct moat_guest_ep *ep, const char *path, const char *user, bool parents,
                     moat_error **err);
int moat_guest_move(const struct moat_guest_ep *ep, const char *src, const char *dst, const char *user,
                    moat_error **err);
int moat_guest_remove(const struct moat_guest_ep *ep, const char *path, const char *user, bool recursive,
                      moat_error **err);

/* Streaming read: open, then pull chunks until 0 (end) or -1. The reader owns a connection; free
 * it with moat_guest_reader_close in every case. */
struct moat_guest_reader;
int moat_guest_read_open(const struct moat_guest_ep *ep, const char *path, const char *user,
                         struct moat_guest_reader **out, uint64_t *size, moat_error **err);
/* Copies up to cap bytes into buf. Returns bytes copied (> 0), 0 at end of file, -1 on error. */
ssize_t moat_guest_read_chunk(struct moat_guest_reader *r, void *buf, size_t cap, moat_error **err);
void moat_guest_reader_close(struct moat_guest_reader *r);

/* Streaming write: open (the guest creates parents and checks the path), push chunks, finish.
 * Finish renames the new file into place; close without finish discards it. */
struct moat_guest_writer;
int moat_guest_write_open(const struct moat_guest_ep *ep, const char *path, const char *user, uint32_t mode,
                          struct moat_guest_writer **out, moat_error **err);
int moat_guest_write_chunk(struct moat_guest_writer *w, const void *buf, size_t len, moat_error **err);
int moat_guest_write_finish(struct moat_guest_writer *w, uint64_t *written, moat_error **err);
void moat_guest_writer_close(struct moat_guest_writer *w);

#endif

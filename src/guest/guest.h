/* guest.h -- internal interfaces of moat-guest: users, path resolution, one connection's work */
#ifndef MOAT_GUEST_H
#define MOAT_GUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "../common/error.h"
#include "../proto/proto.h"

#define GUEST_PATH_MAX 4096
#define GUEST_MAX_GROUPS 256

/* A user of the sandbox, as its /etc/passwd and /etc/group describe it. */
struct guest_user {
  char *name, *home, *shell;
  uid_t uid;
  gid_t gid;
  gid_t groups[GUEST_MAX_GROUPS]; /* supplementary groups, primary gid first */
  size_t ngroups;
};

/* Looks name up in ETC_DIR/passwd and collects its groups from ETC_DIR/group (as initgroups
 * does: the primary gid plus every group that lists the name). name NULL or "" means root
 * (uid 0; when passwd has no uid 0 line, root with home /root and shell /bin/sh). Returns 0, or -1
 * with err: EINVAL "user 'x' does not exist", or the errno of reading passwd. Free u with
 * guest_user_clear. */
int guest_user_lookup(const char *etc_dir, const char *name, struct guest_user *u, moat_error **err);
void guest_user_clear(struct guest_user *u);

/* Resolves path (absolute, or relative to home) to a normalised absolute path: no "//", "." or
 * ".." components (".." is resolved lexically; at "/" it stays "/"), no trailing slash. Returns
 * a new string, or NULL with err EINVAL (empty, longer than GUEST_PATH_MAX). */
char *guest_path_resolve(const char *home, const char *path, moat_error **err);

/* Handles one connection in a worker: reads the request frame and serves it. Does not close fd.
 * Never fails: failures are reported to the peer as REP_ERROR. Returns 1 without consuming
 * anything when the request is one PID 1 serves (EXEC, ATTACH, STDIN, SIGNAL, RESIZE, PROCS):
 * the caller then hands fd to PID 1. busy(arg) is called once the worker is committed to this
 * connection: at once when the request has not arrived yet, else before serving it in the worker. */
int guest_serve(int fd, const char *etc_dir, void (*busy)(void *), void *arg);
/* Touches the pages a worker writes while serving (stacks, heap), so that a spare worker pays
 * its copy-on-write faults before a request arrives rather than during it. */
void guest_prefault(void);

/* The operations, given the request already received. fd is the connection. */
void guest_file_op(int fd, const struct moat_msg *req, const char *etc_dir);
/* WATCH, once the worker acts as the user: REP_OK (or REP_ERROR), then REP_EVENTs until the host
 * closes the connection. path is resolved. */
void guest_watch(int fd, const char *path, bool recursive);
/* Takes on the user's file-system identity (setgroups, setfsgid, setfsuid). 0 or -1 with err. */
int guest_become_user(const struct guest_user *u, moat_error **err);

/* A command started by guest_spawn: its pid and PID 1's ends of its stdio (non-blocking,
 * close-on-exec). On a pty, out_fd is the master and in_fd a duplicate of it; err_fd is -1. */
struct guest_spawn {
  pid_t pid;
  int in_fd, out_fd, err_fd;
  bool pty;
  uint64_t t0_ns; /* when it was started (now_ns) */
};
/* What an EXEC without a USER or CWD of its own gets (a DEFAULTS request sets them; NULL: root, the
 * user's home). A default cwd that cannot be entered falls back as the home does. */
struct guest_defaults {
  const char *user, *cwd;
};
/* Starts the command of an EXEC request (ARGV, ENV, CWD, USER, PTY_COLS/PTY_ROWS) in its own
 * session. Returns 0, or -1 with err (status: the errno for REP_ERROR) when it could not start.
 * Only from a single-threaded process (CLONE_VM|CLONE_VFORK). */
int guest_spawn(const struct moat_msg *req, const char *etc_dir, const struct guest_defaults *defaults,
                struct guest_spawn *out, moat_error **err);

/* PID 1's process table (procs.c). The main loop asks for the fds to poll after its own `base`
 * entries (and the poll timeout), then hands back the results. */
void guest_procs_init(const char *etc_dir);
struct pollfd *guest_procs_pollfds(size_t base, size_t *n, int *timeout_ms);
void guest_procs_dispatch(struct pollfd *p, size_t base, size_t n);
/* Takes over a connection whose request (one PID 1 serves) is still unread. */
void guest_procs_adopt(int conn);
/* Before a checkpoint (SIGUSR2 from the host): closes every connection PID 1 holds, streams
 * included; their processes run on as if started with keep_on_disconnect (ATTACH replays their
 * output later). The next guest_procs_dispatch frees them. */
void guest_procs_quiesce(void);
/* A child reaped by PID 1's waitpid(-1). */
void guest_procs_reaped(pid_t pid, int status);

/* RENEW (proto.h). After a dispatch, returns the fd of a RENEW request's connection (the caller
 * owns it and answers REP_OK once renewed), or -1 when none came. */
int guest_procs_renew_requested(void);
/* Writes the process table to fd (frames of proto.h's framing), makes the processes' fds survive
 * an exec and closes every connection. 0 or -1 with err. */
int guest_procs_save(int fd, moat_error **err);
/* Rebuilds the table guest_procs_save wrote (fd at its start). 0 or -1 with err. */
int guest_procs_load(int fd, moat_error **err);
/* After a failed exec: the saved processes' fds are close-on-exec again. */
void guest_procs_saved_undo(void);

#endif

/* spawn.c -- EXEC: start a command as a user, stream its stdin/stdout/stderr, enforce timeout and caps
 *
 * The worker process that runs guest_exec owns one connection and one command. The command is
 * started with clone(CLONE_VM|CLONE_VFORK) (as posix_spawn does): everything the child needs is
 * prepared beforehand, and the child only makes system calls, so the round trip stays cheap.
 * The command runs in its own session (pgid = pid); timeouts and a vanished host kill that whole
 * process group. All I/O in the event loop is non-blocking: output waits in a buffer while the
 * host is slow to read (and the pipes are then left unread, which holds the command back), stdin
 * data waits in a frame while the pipe is full, so neither side can deadlock the other.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../common/util.h"
#include "guest.h"

#define DEFAULT_MAX_OUTPUT (16ull << 20)
#define DEFAULT_PATH "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#define OBUF_HIGH (4u << 20) /* stop reading the command's output while this much waits for the host */
#define FRAME_HDR 11         /* u32 length, u8 type, u16 tag, u32 field length */

#ifndef CLONE_PIDFD
#define CLONE_PIDFD 0x00001000
#endif

/* Everything the cloned child reads (prepared by the parent) and what it reports back: it shares
 * the parent's memory until it execs or exits. */
struct child_args {
  char **argv;
  char **envp;
  char **candidates; /* full paths to try for argv[0], in PATH order */
  char **sh_argv;    /* {"/bin/sh", <script>, argv[1..], NULL} for ENOEXEC */
  const char *cwd;
  bool cwd_fallback; /* cwd is the default home: use "/" if it cannot be entered */
  int in_fd, out_fd, err_fd;
  bool switch_user;
  uid_t uid;
  gid_t gid;
  const gid_t *groups;
  size_t ngroups;
  /* out */
  int setup_errno;
  const char *setup_what;
};

static char child_stack[64 << 10] __attribute__((aligned(16)));

void guest_prefault(void) {
  /* The clone child runs at the top of child_stack: a few pages there. */
  memset(child_stack + sizeof(child_stack) - (16 << 10), 0, 16 << 10);
  volatile char stack[32 << 10];
  memset((char *)stack, 0, sizeof(stack));
  /* Heap: frames, argv, env. Freed memory below the trim threshold stays mapped for reuse. */
  void *p = malloc(96 << 10);
  if (p) {
    memset(p, 0, 96 << 10);
    free(p);
  }
}

static void cat_str(char *buf, size_t cap, size_t *n, const char *s) {
  while (*s && *n + 1 < cap)
    buf[(*n)++] = *s++;
}

static int child_setup_fail(struct child_args *a, const char *what) {
  a->setup_errno = errno ? errno : EINVAL;
  a->setup_what = what;
  _exit(127);
}

/* Runs in the cloned child: only system calls and stack memory from here on. */
static int child_main(void *arg) {
  struct child_args *a = arg;
  /* execve resets handled signals; the only one the guest ignores (and exec would keep) is SIGPIPE */
  struct sigaction dfl = {.sa_handler = SIG_DFL};
  sigaction(SIGPIPE, &dfl, NULL);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  if (setsid() < 0)
    child_setup_fail(a, "setsid");
  if (dup2(a->in_fd, 0) < 0 || dup2(a->out_fd, 1) < 0 || dup2(a->err_fd, 2) < 0)
    child_setup_fail(a, "dup2");
  if (a->switch_user) {
    /* Raw system calls: glibc's wrappers would try to synchronise threads we share memory with. */
    if (syscall(SYS_setgroups, a->ngroups, a->groups) < 0)
      child_setup_fail(a, "setgroups");
    if (syscall(SYS_setresgid, a->gid, a->gid, a->gid) < 0)
      child_setup_fail(a, "setgid");
    if (syscall(SYS_setresuid, a->uid, a->uid, a->uid) < 0)
      child_setup_fail(a, "setuid");
  }
  if (chdir(a->cwd) < 0 && (!a->cwd_fallback || chdir("/") < 0))
    child_setup_fail(a, "cwd");
  if (syscall(SYS_close_range, 3, ~0U, 0) < 0) {
    for (int fd = 3; fd < 1024; fd++)
      close(fd);
  }
  bool eacces = false;
  int last = ENOENT;
  for (char **c = a->candidates; *c; c++) {
    execve(*c, a->argv, a->envp);
    int e = errno;
    if (e == ENOEXEC) {
      a->sh_argv[1] = *c;
      execve("/bin/sh", a->sh_argv, a->envp);
      last = errno;
      break;
    }
    if (e == EACCES) {
      eacces = true;
      continue;
    }
    if (e == ENOENT || e == ENOTDIR || e == ESTALE || e == ENODEV || e == ETIMEDOUT)
      continue;
    last = e;
    break;
  }
  int e = eacces ? EACCES : last;
  char msg[512];
  size_t n = 0;
  const char *desc = strerrordesc_np(e);
  cat_str(msg, sizeof(msg), &n, "moat: exec ");
  cat_str(msg, sizeof(msg), &n, a->argv[0]);
  cat_str(msg, sizeof(msg), &n, ": ");
  cat_str(msg, sizeof(msg), &n, desc ? desc : "cannot execute");
  msg[n++] = '\n';
  (void)!write(2, msg, n);
  _exit(e == EACCES ? 126 : 127);
}

/* The environment: defaults for the user, overlaid by "K=V" entries (later wins). */
static void env_set(char ***env, size_t *n, char *entry) {
  size_t klen = (size_t)(strchr(entry, '=') - entry);
  for (size_t i = 0; i < *n; i++)
    if (strncmp((*env)[i], entry, klen + 1) == 0) {
      free((*env)[i]);
      (*env)[i] = entry;
      return;
    }
  *env = xrealloc(*env, (*n + 2) * sizeof(char *));
  (*env)[(*n)++] = entry;
  (*env)[*n] = NULL;
}

static char **build_env(const struct guest_user *u, char **overlay, moat_error **err) {
  char **env = xcalloc(1, sizeof(char *));
  size_t n = 0;
  env_set(&env, &n, xstrdup("PATH=" DEFAULT_PATH));
  env_set(&env, &n, xasprintf("HOME=%s", u->home));
  env_set(&env, &n, xasprintf("USER=%s", u->name));
  env_set(&env, &n, xasprintf("LOGNAME=%s", u->name));
  env_set(&env, &n, xasprintf("SHELL=%s", u->shell));
  env_set(&env, &n, xstrdup("LANG=C.UTF-8"));
  env_set(&env, &n, xstrdup("TERM=xterm"));
  for (size_t i = 0; overlay[i]; i++) {
    const char *eq = strchr(overlay[i], '=');
    if (!eq || eq == overlay[i]) {
      strv_free(env);
      return moat_error_set(err, EINVAL, "env entry '%s' is not KEY=VALUE", overlay[i]), NULL;
    }
    env_set(&env, &n, xstrdup(overlay[i]));
  }
  return env;
}

/* Full paths to try for argv0: itself when it has a '/', else each PATH entry ("" = cwd). */
static char **exec_candidates(const char *argv0, char **env) {
  if (strchr(argv0, '/') || !argv0[0]) {
    char **v = xcalloc(2, sizeof(char *));
    v[0] = xstrdup(argv0);
    return v;
  }
  const char *path = NULL;
  for (size_t i = 0; env[i]; i++)
    if (strncmp(env[i], "PATH=", 5) == 0)
      path = env[i] + 5;
  if (!path)
    path = DEFAULT_PATH;
  size_t n = 1;
  for (const char *p = path; *p; p++)
    n += *p == ':';
  char **v = xcalloc(n + 1, sizeof(char *));
  size_t i = 0;
  const char *s = path;
  for (;;) {
    const char *e = strchrnul(s, ':');
    v[i++] = e == s ? xstrdup(argv0) : xasprintf("%.*s/%s", (int)(e - s), s, argv0);
    if (!*e)
      break;
    s = e + 1;
  }
  return v;
}

/* Outgoing bytes waiting for the host. */
struct obuf {
  uint8_t *b;
  size_t off, len, cap;
};

static uint8_t *obuf_reserve(struct obuf *o, size_t extra) {
  if (o->off > 0 && o->off == o->len)
    o->off = o->len = 0;
  if (o->len + extra > o->cap) {
    if (o->off > 0) {
      memmove(o->b, o->b + o->off, o->len - o->off);
      o->len -= o->off;
      o->off = 0;
    }
    if (o->len + extra > o->cap) {
      size_t cap = o->cap ? o->cap : 64 << 10;
      while (cap < o->len + extra)
        cap *= 2;
      o->b = xrealloc(o->b, cap);
      o->cap = cap;
    }
  }
  return o->b + o->len;
}

static size_t obuf_pending(const struct obuf *o) { return o->len - o->off; }

static void put_le32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
  p[2] = (uint8_t)(v >> 16);
  p[3] = (uint8_t)(v >> 24);
}

static void obuf_put_msg(struct obuf *o, const struct moat_msg *m) {
  uint8_t *p = obuf_reserve(o, 5 + m->len);
  put_le32(p, (uint32_t)(m->len + 1));
  p[4] = m->type;
  if (m->len)
    memcpy(p + 5, m->buf, m->len);
  o->len += 5 + m->len;
}

/* Sends what it can without blocking. 0, or -1 when the host is gone. */
static int obuf_flush(struct obuf *o, int fd) {
  while (obuf_pending(o) > 0) {
    ssize_t w = send(fd, o->b + o->off, obuf_pending(o), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0) {
      if (errno == EINTR)
        continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK)
        return 0;
      return -1;
    }
    o->off += (size_t)w;
  }
  return 0;
}

/* One output stream of the command. */
struct stream {
  int fd; /* read end, -1 once at EOF */
  uint8_t type;
  uint64_t forwarded, cap;
  bool truncated;
};

/* Reads up to max bytes from s into DATA frames in o. Returns bytes read, 0 at EOF (fd closed),
 * -1 when nothing is available. */
static ssize_t stream_read(struct stream *s, struct obuf *o, size_t max) {
  if (max > MOAT_PROTO_CHUNK)
    max = MOAT_PROTO_CHUNK;
  uint8_t *p = obuf_reserve(o, FRAME_HDR + max);
  ssize_t r;
  do
    r = read(s->fd, p + FRAME_HDR, max);
  while (r < 0 && errno == EINTR);
  if (r < 0)
    return -1;
  if (r == 0) {
    close(s->fd);
    s->fd = -1;
    return 0;
  }
  uint64_t room = s->cap - s->forwarded;
  size_t keep = (uint64_t)r < room ? (size_t)r : (size_t)room;
  if (keep < (size_t)r)
    s->truncated = true;
  if (keep > 0) {
    put_le32(p, (uint32_t)(keep + 7));
    p[4] = s->type;
    p[5] = (uint8_t)MOAT_T_DATA;
    p[6] = 0;
    put_le32(p + 7, (uint32_t)keep);
    o->len += FRAME_HDR + keep;
    s->forwarded += keep;
  }
  return r;
}

/* After the command exits: forward what is already in the pipe, never waiting for more (a
 * background process may hold the write end open forever). */
static void stream_drain(struct stream *s, struct obuf *o) {
  if (s->fd < 0)
    return;
  int avail = 0;
  if (ioctl(s->fd, FIONREAD, &avail) < 0)
    avail = 0;
  while (avail > 0) {
    ssize_t r = stream_read(s, o, (size_t)avail);
    if (r <= 0)
      break;
    avail -= (int)r;
  }
  if (s->fd >= 0) {
    close(s->fd);
    s->fd = -1;
  }
}

/* Incoming stdin frames: bytes from the host, parsed a frame at a time. */
struct ibuf {
  uint8_t *b;
  size_t start, len, cap;
};

/* Reads what is available. 1 read something, 0 EOF, -1 nothing now / error (errno). */
static int ibuf_fill(struct ibuf *in, int fd) {
  if (in->start > 0 && in->start == in->len)
    in->start = in->len = 0;
  if (in->cap - in->len < (64u << 10)) {
    if (in->start > 0) {
      memmove(in->b, in->b + in->start, in->len - in->start);
      in->len -= in->start;
      in->start = 0;
    }
    if (in->cap - in->len < (64u << 10)) {
      in->cap = in->cap ? in->cap * 2 : 256u << 10;
      in->b = xrealloc(in->b, in->cap);
    }
  }
  ssize_t r = recv(fd, in->b + in->len, in->cap - in->len, MSG_DONTWAIT);
  if (r < 0)
    return -1;
  if (r == 0)
    return 0;
  in->len += (size_t)r;
  return 1;
}

/* Takes one complete frame off in into m. 1 taken, 0 incomplete, -1 malformed (err). */
static int ibuf_take(struct ibuf *in, struct moat_msg *m, moat_error **err) {
  size_t have = in->len - in->start;
  if (have < 4)
    return 0;
  const uint8_t *p = in->b + in->start;
  uint32_t flen = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
  if (flen < 1 || flen > MOAT_PROTO_MAX_FRAME)
    return moat_error_set(err, EPROTO, "guest protocol: bad frame length %u", flen);
  if (have < 4 + (size_t)flen)
    return 0;
  if (moat_msg_parse(p, 4 + (size_t)flen, m, err) < 0)
    return -1;
  in->start += 4 + (size_t)flen;
  return 1;
}

struct exec_state {
  int conn;
  pid_t pid;
  int pidfd;
  int in_fd; /* write end of the command's stdin, -1 once closed */
  struct stream out, err;
  struct obuf o;
  struct ibuf in;
  bool reading_stdin; /* frames still expected from the host */
  struct moat_msg frame;
  const uint8_t *pending; /* stdin bytes of frame not yet in the pipe */
  size_t pending_len;
  bool exited, timed_out;
  int status;
};

static void close_stdin(struct exec_state *st) {
  if (st->in_fd >= 0)
    close(st->in_fd);
  st->in_fd = -1;
  st->pending_len = 0;
}

/* Moves stdin frames from the host into the pipe as far as both allow. 0, or -1 on a protocol
 * error (err). */
static int pump_stdin(struct exec_state *st, bool conn_readable, moat_error **err) {
  for (;;) {
    if (st->pending_len > 0) {
      if (st->in_fd < 0) {
        st->pending_len = 0;
        continue;
      }
      ssize_t w = write(st->in_fd, st->pending, st->pending_len);
      if (w < 0) {
        if (errno == EINTR)
          continue;
        if (errno == EAGAIN)
          return 0;
        close_stdin(st); /* EPIPE: the command closed its stdin; drop the rest */
        continue;
      }
      st->pending += w;
      st->pending_len -= (size_t)w;
      continue;
    }
    if (!st->reading_stdin)
      return 0;
    int r = ibuf_take(&st->in, &st->frame, err);
    if (r < 0)
      return -1;
    if (r == 1) {
      if (st->frame.type == MOAT_MSG_END) {
        st->reading_stdin = false;
        close_stdin(st);
        return 0;
      }
      if (st->frame.type != MOAT_MSG_DATA)
        return moat_error_set(err, EPROTO, "guest protocol: frame type %u during stdin", st->frame.type);
      struct moat_field f;
      if (moat_msg_find(&st->frame, MOAT_T_DATA, &f)) {
        st->pending = f.data;
        st->pending_len = f.len;
      }
      continue;
    }
    if (!conn_readable)
      return 0;
    conn_readable = false;
    int f = ibuf_fill(&st->in, st->conn);
    if (f == 0) { /* host shut its side without END: treat as end of stdin */
      if (st->in.len - st->in.start > 0)
        return moat_error_set(err, EPROTO, "guest protocol: connection closed inside a frame");
      st->reading_stdin = false;
      close_stdin(st);
      return 0;
    }
    if (f < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      st->reading_stdin = false;
      close_stdin(st);
      return 0;
    }
  }
}

static void kill_group(struct exec_state *st) {
  kill(-st->pid, SIGKILL);
  kill(st->pid, SIGKILL);
}

static void reap(struct exec_state *st) {
  while (waitpid(st->pid, &st->status, 0) < 0 && errno == EINTR)
    ;
  st->exited = true;
}

/* Writes the rest of st->o, waiting as long as the host needs. -1 when the host is gone. */
static int flush_all(struct exec_state *st) {
  while (obuf_pending(&st->o) > 0) {
    if (obuf_flush(&st->o, st->conn) < 0)
      return -1;
    if (obuf_pending(&st->o) == 0)
      break;
    struct pollfd p = {.fd = st->conn, .events = POLLOUT};
    if (poll(&p, 1, -1) < 0 && errno != EINTR)
      return -1;
    if ((p.revents & (POLLHUP | POLLERR)) && !(p.revents & POLLOUT))
      return -1;
  }
  return 0;
}

/* The event loop: runs until the command exits (or the host goes away: then kills it). Returns
 * 0 when the exit should be reported, -1 when there is nobody to report to. */
static int exec_loop(struct exec_state *st, uint64_t deadline_ns) {
  moat_error *err = NULL;
  while (!st->exited) {
    struct pollfd p[5];
    int n = 0, i_conn = -1, i_in = -1, i_out = -1, i_err = -1, i_pid;
    bool want_conn_in = st->reading_stdin && st->pending_len == 0;
    short ev = (short)((want_conn_in ? POLLIN : 0) | (obuf_pending(&st->o) ? POLLOUT : 0));
    p[i_conn = n++] = (struct pollfd){.fd = st->conn, .events = ev};
    if (st->in_fd >= 0 && st->pending_len > 0)
      p[i_in = n++] = (struct pollfd){.fd = st->in_fd, .events = POLLOUT};
    bool room = obuf_pending(&st->o) < OBUF_HIGH;
    if (room && st->out.fd >= 0)
      p[i_out = n++] = (struct pollfd){.fd = st->out.fd, .events = POLLIN};
    if (room && st->err.fd >= 0)
      p[i_err = n++] = (struct pollfd){.fd = st->err.fd, .events = POLLIN};
    p[i_pid = n++] = (struct pollfd){.fd = st->pidfd, .events = POLLIN};
    int timeout = -1;
    if (deadline_ns && !st->timed_out) {
      uint64_t now = now_ns();
      if (now >= deadline_ns) {
        kill_group(st);
        st->timed_out = true;
        continue;
      }
      uint64_t ms = (deadline_ns - now + 999999) / 1000000;
      timeout = ms > 1000000 ? 1000000 : (int)ms;
    }
    int r = poll(p, (nfds_t)n, timeout);
    if (r < 0) {
      if (errno == EINTR)
        continue;
      kill_group(st);
      reap(st);
      return -1;
    }
    if (p[i_conn].revents & (POLLHUP | POLLERR)) { /* the host closed the connection */
      kill_group(st);
      reap(st);
      return -1;
    }
    if ((p[i_conn].revents & POLLOUT) && obuf_flush(&st->o, st->conn) < 0) {
      kill_group(st);
      reap(st);
      return -1;
    }
    bool conn_in = (p[i_conn].revents & POLLIN) != 0;
    bool in_ready = i_in >= 0 && (p[i_in].revents & (POLLOUT | POLLERR | POLLHUP));
    if (conn_in || in_ready) {
      if (pump_stdin(st, conn_in, &err) < 0) {
        kill_group(st);
        reap(st);
        moat_msg_send_error(st->conn, err->status, "%s", moat_error_msg(err));
        moat_error_free(&err);
        return -1;
      }
    }
    if (i_out >= 0 && (p[i_out].revents & (POLLIN | POLLHUP | POLLERR)))
      stream_read(&st->out, &st->o, MOAT_PROTO_CHUNK);
    if (i_err >= 0 && (p[i_err].revents & (POLLIN | POLLHUP | POLLERR)))
      stream_read(&st->err, &st->o, MOAT_PROTO_CHUNK);
    if (obuf_pending(&st->o) && obuf_flush(&st->o, st->conn) < 0) {
      kill_group(st);
      reap(st);
      return -1;
    }
    if (p[i_pid].revents & POLLIN)
      reap(st);
  }
  return 0;
}

static int pidfd_of(pid_t pid) { return (int)syscall(SYS_pidfd_open, pid, 0); }

void guest_exec(int fd, const struct moat_msg *req, const char *etc_dir) {
  _cleanup_strv_ char **argv = moat_msg_get_strv(req, MOAT_T_ARGV);
  _cleanup_strv_ char **overlay = moat_msg_get_strv(req, MOAT_T_ENV);
  struct moat_field f;
  if (!argv || !argv[0]) {
    moat_msg_send_error(fd, EINVAL, "exec: %s", argv ? "no argv" : "argv holds a NUL byte");
    return;
  }
  if (!overlay) {
    moat_msg_send_error(fd, EINVAL, "exec: env holds a NUL byte");
    return;
  }
  _cleanup_free_ char *cwd_arg = moat_msg_get_str(req, MOAT_T_CWD);
  _cleanup_free_ char *user_arg = moat_msg_get_str(req, MOAT_T_USER);
  if ((!cwd_arg && moat_msg_find(req, MOAT_T_CWD, &f)) ||
      (!user_arg && moat_msg_find(req, MOAT_T_USER, &f))) {
    moat_msg_send_error(fd, EINVAL, "exec: cwd or user holds a NUL byte");
    return;
  }
  uint32_t timeout_ms = 0, stdin_stream = 0;
  uint64_t max_output = DEFAULT_MAX_OUTPUT;
  moat_msg_get_u32(req, MOAT_T_TIMEOUT_MS, &timeout_ms);
  moat_msg_get_u32(req, MOAT_T_STDIN_STREAM, &stdin_stream);
  if (moat_msg_get_u64(req, MOAT_T_MAX_OUTPUT, &max_output) == 0 && max_output == 0)
    max_output = DEFAULT_MAX_OUTPUT; /* 0 = the default, as guest_client.h documents */

  moat_error *err = NULL;
  struct guest_user u;
  if (guest_user_lookup(etc_dir, user_arg, &u, &err) < 0) {
    moat_msg_send_error(fd, err->status, "%s", moat_error_msg(err));
    moat_error_free(&err);
    return;
  }
  _cleanup_strv_ char **env = build_env(&u, overlay, &err);
  _cleanup_free_ char *cwd = NULL;
  if (env && cwd_arg)
    cwd = guest_path_resolve(u.home, cwd_arg, &err);
  if (!env || (cwd_arg && !cwd)) {
    moat_msg_send_error(fd, err->status, "%s", moat_error_msg(err));
    moat_error_free(&err);
    guest_user_clear(&u);
    return;
  }
  bool switch_user = geteuid() == 0;
  if (!switch_user && u.uid != geteuid()) {
    moat_msg_send_error(fd, EPERM, "cannot run as user '%s': the guest does not run as root", u.name);
    guest_user_clear(&u);
    return;
  }
  _cleanup_strv_ char **candidates = exec_candidates(argv[0], env);
  size_t argc = strv_len(argv);
  _cleanup_free_ char **sh_argv = xcalloc(argc + 2, sizeof(char *));
  sh_argv[0] = (char *)"/bin/sh";
  for (size_t i = 1; i < argc; i++)
    sh_argv[i + 1] = argv[i];

  int in[2] = {-1, -1}, out[2] = {-1, -1}, errp[2] = {-1, -1};
  if (pipe2(in, O_CLOEXEC) < 0 || pipe2(out, O_CLOEXEC) < 0 || pipe2(errp, O_CLOEXEC) < 0) {
    moat_msg_send_error(fd, errno, "exec: pipe: %s", strerror(errno));
    for (int i = 0; i < 2; i++) {
      if (in[i] >= 0)
        close(in[i]);
      if (out[i] >= 0)
        close(out[i]);
      if (errp[i] >= 0)
        close(errp[i]);
    }
    guest_user_clear(&u);
    return;
  }
  struct child_args a = {
      .argv = argv,
      .envp = env,
      .candidates = candidates,
      .sh_argv = sh_argv,
      .cwd = cwd ? cwd : u.home,
      .cwd_fallback = cwd == NULL,
      .in_fd = in[0],
      .out_fd = out[1],
      .err_fd = errp[1],
      .switch_user = switch_user,
      .uid = u.uid,
      .gid = u.gid,
      .groups = u.groups,
      .ngroups = u.ngroups,
  };
  uint64_t t0 = now_ns();
  int pidfd = -1;
  pid_t pid = clone(child_main, child_stack + sizeof(child_stack),
                    CLONE_VM | CLONE_VFORK | CLONE_PIDFD | SIGCHLD, &a, &pidfd);
  if (pid < 0 && errno == EINVAL) /* kernels without CLONE_PIDFD */
    pid = clone(child_main, child_stack + sizeof(child_stack), CLONE_VM | CLONE_VFORK | SIGCHLD, &a);
  int clone_errno = errno;
  close(in[0]);
  close(out[1]);
  close(errp[1]);
  struct exec_state st = {
      .conn = fd,
      .pid = pid,
      .pidfd = pidfd,
      .in_fd = in[1],
      .out = {.fd = out[0], .type = MOAT_REP_STDOUT, .cap = max_output},
      .err = {.fd = errp[0], .type = MOAT_REP_STDERR, .cap = max_output},
      .reading_stdin = stdin_stream != 0,
  };
  moat_msg_init(&st.frame, 0);
  if (pid < 0) {
    moat_msg_send_error(fd, clone_errno, "exec: clone: %s", strerror(clone_errno));
    goto out;
  }
  if (a.setup_errno) {
    reap(&st);
    if (strcmp(a.setup_what, "cwd") == 0)
      moat_msg_send_error(fd, a.setup_errno, "cwd %s: %s", a.cwd, strerror(a.setup_errno));
    else
      moat_msg_send_error(fd, a.setup_errno, "exec as user '%s': %s: %s", u.name, a.setup_what,
                          strerror(a.setup_errno));
    goto out;
  }
  if (st.pidfd < 0)
    st.pidfd = pidfd_of(pid);
  if (st.pidfd < 0) {
    kill_group(&st);
    reap(&st);
    moat_msg_send_error(fd, errno, "exec: pidfd_open: %s", strerror(errno));
    goto out;
  }
  if (!st.reading_stdin)
    close_stdin(&st);
  fd_set_nonblock(st.out.fd, true);
  fd_set_nonblock(st.err.fd, true);
  if (st.in_fd >= 0)
    fd_set_nonblock(st.in_fd, true);

  struct moat_msg m;
  moat_msg_init(&m, MOAT_REP_STARTED);
  moat_msg_put_i32(&m, MOAT_T_PID, pid);
  obuf_put_msg(&st.o, &m);
  uint64_t deadline = timeout_ms ? t0 + (uint64_t)timeout_ms * 1000000ull : 0;
  if (exec_loop(&st, deadline) == 0) {
    uint64_t dur = (now_ns() - t0) / 1000000;
    stream_drain(&st.out, &st.o);
    stream_drain(&st.err, &st.o);
    bool sig = WIFSIGNALED(st.status);
    moat_msg_reset(&m, MOAT_REP_EXIT);
    moat_msg_put_i32(&m, MOAT_T_EXIT_CODE, sig ? -1 : WEXITSTATUS(st.status));
    moat_msg_put_i32(&m, MOAT_T_SIGNAL, sig ? WTERMSIG(st.status) : 0);
    moat_msg_put_u32(&m, MOAT_T_TIMED_OUT, st.timed_out);
    moat_msg_put_u32(&m, MOAT_T_STDOUT_TRUNC, st.out.truncated);
    moat_msg_put_u32(&m, MOAT_T_STDERR_TRUNC, st.err.truncated);
    moat_msg_put_u64(&m, MOAT_T_DURATION_MS, dur);
    obuf_put_msg(&st.o, &m);
    flush_all(&st);
  }
  moat_msg_free(&m);
out:
  close_stdin(&st);
  if (st.out.fd >= 0)
    close(st.out.fd);
  if (st.err.fd >= 0)
    close(st.err.fd);
  if (st.pidfd >= 0)
    close(st.pidfd);
  free(st.o.b);
  free(st.in.b);
  moat_msg_free(&st.frame);
  guest_user_clear(&u);
}

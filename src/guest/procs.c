/* procs.c -- PID 1's process table: every EXEC'd command, its output rings and its connections
 *
 * Workers hand PID 1 the connections of EXEC, ATTACH, STDIN, SIGNAL, RESIZE and PROCS with the
 * request still unread (guest_procs_adopt). PID 1 is single-threaded and never blocks: every
 * socket, pipe and pty master is non-blocking and polled by main.c's loop through
 * guest_procs_pollfds / guest_procs_dispatch.
 *
 * Output of a process goes to a 1 MiB ring per stream (replay for ATTACH), to its EXEC connection
 * (the "primary": every byte, in order, up to MAX_OUTPUT per stream; while more than
 * PRIMARY_HIGH waits for that host the process's pipes are not read, which holds it back) and
 * to every attached connection (which, once more than ATTACH_HIGH waits for it, loses bytes and
 * is told so with REP_DROPPED{SIZE} when it catches up). The one LOGS connection (g_log) reads
 * every process's rings behind a cursor of its own (log_pump); a process more than LOG_LAG ahead
 * of it is not read while it moves (LOG_STALL_NS). Input
 * (DATA/END from the primary or an attach connection, REQ_STDIN) waits in one queue per process; past
 * STDIN_HIGH the connections are not read. Objects are only marked dead during an event and freed at the end
 * of guest_procs_dispatch, so pointers held by this iteration's poll slots stay valid.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../common/util.h"
#include "guest.h"

#define RING_CAP (1u << 20)
#define PRIMARY_HIGH (1u << 20)
#define ATTACH_HIGH (4u << 20)
#define ATTACH_LOW (1u << 20)
#define STDIN_HIGH (1u << 20)
#define STDIN_MAX (8u << 20) /* REQ_STDIN past this much queued input: EAGAIN */
#define FINISHED_KEEP 256
#define REQUEST_TIMEOUT_NS (60ull * 1000000000ull)
#define CLOSING_TIMEOUT_NS (30ull * 1000000000ull)
#define DEFAULT_MAX_OUTPUT (16ull << 20)
#define FRAME_HDR 11        /* u32 length, u8 type, u16 tag, u32 field length */
#define LOG_HIGH (1u << 20) /* the LOGS connection takes no more while this much waits for it */
/* A process whose log lags by more than LOG_LAG is not read while the LOGS connection moves (it
 * took bytes within LOG_STALL_NS): the log keeps pace with it. A host that stops reading holds
 * nothing back past that; the ring then overwrites what the log did not take. */
#define LOG_LAG (RING_CAP / 2)
#define LOG_STALL_NS (100ull * 1000000ull)

/* A byte queue: output waiting for a host, input waiting for a pipe or to be parsed. */
struct buf {
  uint8_t *b;
  size_t off, len, cap;
};

static size_t buf_pending(const struct buf *q) { return q->len - q->off; }

static uint8_t *buf_reserve(struct buf *q, size_t extra) {
  if (q->off > 0 && q->off == q->len)
    q->off = q->len = 0;
  if (q->len + extra > q->cap) {
    if (q->off > 0) {
      memmove(q->b, q->b + q->off, q->len - q->off);
      q->len -= q->off;
      q->off = 0;
    }
    if (q->len + extra > q->cap) {
      size_t cap = q->cap ? q->cap : 16 << 10;
      while (cap < q->len + extra)
        cap *= 2;
      q->b = xrealloc(q->b, cap);
      q->cap = cap;
    }
  }
  return q->b + q->len;
}

static void buf_free(struct buf *q) {
  free(q->b);
  memset(q, 0, sizeof(*q));
}

static void put_le32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
  p[2] = (uint8_t)(v >> 16);
  p[3] = (uint8_t)(v >> 24);
}

static void buf_put(struct buf *q, const void *d, size_t n) {
  memcpy(buf_reserve(q, n), d, n);
  q->len += n;
}

static void buf_put_msg(struct buf *q, const struct moat_msg *m) {
  uint8_t *p = buf_reserve(q, 5 + m->len);
  put_le32(p, (uint32_t)(m->len + 1));
  p[4] = m->type;
  if (m->len)
    memcpy(p + 5, m->buf, m->len);
  q->len += 5 + m->len;
}

/* DATA frames of type, at most MOAT_PROTO_CHUNK bytes each. */
static void buf_put_data(struct buf *q, uint8_t type, const uint8_t *d, size_t n) {
  while (n > 0) {
    size_t k = n > MOAT_PROTO_CHUNK ? MOAT_PROTO_CHUNK : n;
    uint8_t *p = buf_reserve(q, FRAME_HDR + k);
    put_le32(p, (uint32_t)(k + 7));
    p[4] = type;
    p[5] = (uint8_t)MOAT_T_DATA;
    p[6] = 0;
    put_le32(p + 7, (uint32_t)k);
    memcpy(p + FRAME_HDR, d, k);
    q->len += FRAME_HDR + k;
    d += k;
    n -= k;
  }
}

/* Last RING_CAP bytes of a stream. The buffer grows with the stream up to RING_CAP (until it is
 * full, the bytes sit at [0, total) and nothing wraps), so quiet processes cost little. */
struct ring {
  uint8_t *b;
  size_t cap;
  uint64_t total; /* bytes ever written */
};

static void ring_put(struct ring *r, const uint8_t *d, size_t n) {
  if (r->cap < RING_CAP && r->total + n > r->cap) {
    size_t cap = r->cap ? r->cap : 4096;
    while (cap < RING_CAP && cap < r->total + n)
      cap *= 2;
    r->b = xrealloc(r->b, cap);
    r->cap = cap;
  }
  if (n > RING_CAP) {
    r->total += n - RING_CAP;
    d += n - RING_CAP;
    n = RING_CAP;
  }
  while (n > 0) {
    size_t pos = (size_t)(r->total % RING_CAP);
    size_t k = RING_CAP - pos < n ? RING_CAP - pos : n;
    memcpy(r->b + pos, d, k);
    r->total += k;
    d += k;
    n -= k;
  }
}

enum conn_kind {
  C_REQ,    /* request not read yet */
  C_STREAM, /* attached to p (exec or attach): output flows, input accepted */
  C_DONE,   /* answered: flush what is queued, then close */
  C_LOG,    /* the LOGS connection (g_log): fed from the rings by log_pump */
};

struct proc;

struct conn {
  struct conn *next;
  int fd;
  enum conn_kind kind;
  struct proc *p; /* C_STREAM only */
  bool primary;   /* the EXEC connection of p */
  struct buf out, in;
  bool rd_eof, dead;
  uint64_t deadline_ns; /* C_REQ: the request; C_DONE: the flush; 0 = none */
  uint64_t beat_ns;     /* C_STREAM: when a REP_ALIVE is due if nothing else was sent */
  uint64_t dropped;     /* bytes not delivered, not yet reported */
};

struct proc {
  struct proc *next;
  pid_t pid;
  char *tag;
  char **argv;
  int64_t started_ms;
  uint64_t t0_ns, deadline_ns, duration_ms;
  bool running, pty, background, kill_on_disconnect, timed_out, dead;
  int status;
  int fd[2];       /* stdout (the pty master) and stderr; -1 once closed */
  int in_fd;       /* stdin; on a pty a duplicate of the master */
  bool stdin_open; /* more input accepted */
  struct buf inq;
  struct ring ring[2];
  struct conn *primary;
  uint64_t cap, fwd[2];
  bool trunc[2];
  /* LOGS: what of each ring the log took (ring totals), whether it was told of the start, exit */
  uint64_t logged[2];
  bool log_started, log_exited;
};

static const char *g_etc;
static struct guest_defaults g_defaults; /* owned strings */
static int g_renew_fd = -1;              /* a RENEW request's connection, for main.c */
static struct proc *g_procs;
static struct conn *g_conns;
static struct conn *g_log;         /* the LOGS connection, or NULL */
static uint64_t g_log_progress_ns; /* when g_log last took bytes (or opened) */
static uint8_t g_rbuf[MOAT_PROTO_CHUNK];

void guest_procs_init(const char *etc_dir) { g_etc = etc_dir; }

static void close_fd(int *fd) {
  if (*fd >= 0)
    close(*fd);
  *fd = -1;
}

static void kill_group(struct proc *p) {
  if (kill(-p->pid, SIGKILL) < 0)
    kill(p->pid, SIGKILL);
}

/* ---- connections ---- */

static void conn_detach(struct conn *c) {
  struct proc *p = c->p;
  if (p && c->primary && p->primary == c) {
    p->primary = NULL;
    if (p->running && p->kill_on_disconnect)
      kill_group(p);
  }
  c->p = NULL;
  c->primary = false;
}

static void conn_drop(struct conn *c) {
  conn_detach(c);
  c->dead = true;
}

/* Sends what the socket takes now. 0, or -1 when the host is gone (c dropped). */
static int conn_flush(struct conn *c) {
  while (buf_pending(&c->out) > 0) {
    ssize_t w = send(c->fd, c->out.b + c->out.off, buf_pending(&c->out), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0) {
      if (errno == EINTR)
        continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK)
        return 0;
      conn_drop(c);
      return -1;
    }
    c->out.off += (size_t)w;
    c->beat_ns = now_ns() + MOAT_PROTO_HEARTBEAT_MS * 1000000ull;
    if (c == g_log)
      g_log_progress_ns = now_ns();
  }
  return 0;
}

/* The answer is queued: close once it is sent (or after CLOSING_TIMEOUT_NS). */
static void conn_finish(struct conn *c) {
  conn_detach(c);
  c->kind = C_DONE;
  c->deadline_ns = now_ns() + CLOSING_TIMEOUT_NS;
  conn_flush(c);
}

static void conn_error(struct conn *c, int e, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void conn_error(struct conn *c, int e, const char *fmt, ...) {
  char text[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof(text), fmt, ap);
  va_end(ap);
  struct moat_msg m;
  moat_msg_init(&m, MOAT_REP_ERROR);
  moat_msg_put_i32(&m, MOAT_T_ERRNO, e);
  moat_msg_put_str(&m, MOAT_T_MESSAGE, text);
  buf_put_msg(&c->out, &m);
  moat_msg_free(&m);
  conn_finish(c);
}

static void conn_ok(struct conn *c) {
  struct moat_msg m;
  moat_msg_init(&m, MOAT_REP_OK);
  buf_put_msg(&c->out, &m);
  conn_finish(c);
}

/* ---- processes ---- */

static void proc_free(struct proc *p) {
  free(p->tag);
  strv_free(p->argv);
  close_fd(&p->fd[0]);
  close_fd(&p->fd[1]);
  close_fd(&p->in_fd);
  buf_free(&p->inq);
  free(p->ring[0].b);
  free(p->ring[1].b);
  free(p);
}

/* Writes queued input into the process's stdin as far as the pipe takes it. */
static void proc_pump_stdin(struct proc *p) {
  while (p->in_fd >= 0 && buf_pending(&p->inq) > 0) {
    ssize_t w = write(p->in_fd, p->inq.b + p->inq.off, buf_pending(&p->inq));
    if (w < 0) {
      if (errno == EINTR)
        continue;
      if (errno == EAGAIN)
        return;
      p->stdin_open = false; /* EPIPE: the command closed its stdin; drop the rest */
      p->inq.off = p->inq.len = 0;
      close_fd(&p->in_fd);
      return;
    }
    p->inq.off += (size_t)w;
  }
  if (!p->stdin_open && !p->pty && buf_pending(&p->inq) == 0)
    close_fd(&p->in_fd);
}

static void proc_input(struct proc *p, const void *d, size_t n) {
  if (!p->running || !p->stdin_open || p->in_fd < 0 || n == 0)
    return;
  buf_put(&p->inq, d, n);
  proc_pump_stdin(p);
}

/* End of input: a pipe is closed once drained; a pty gets its EOF character (^D). */
static void proc_close_stdin(struct proc *p) {
  if (!p->running || !p->stdin_open)
    return;
  if (p->pty)
    buf_put(&p->inq, "\x04", 1);
  p->stdin_open = false;
  proc_pump_stdin(p);
}

/* An attached (non-primary) connection: drop while it lags, report the gap when it catches up. */
static void attach_output(struct conn *c, uint8_t type, const uint8_t *d, size_t n) {
  if (c->dropped && buf_pending(&c->out) < ATTACH_LOW) {
    struct moat_msg m;
    moat_msg_init(&m, MOAT_REP_DROPPED);
    moat_msg_put_u64(&m, MOAT_T_SIZE, c->dropped);
    buf_put_msg(&c->out, &m);
    moat_msg_free(&m);
    c->dropped = 0;
  }
  if (c->dropped || buf_pending(&c->out) > ATTACH_HIGH) {
    c->dropped += n;
    return;
  }
  buf_put_data(&c->out, type, d, n);
  conn_flush(c);
}

static void proc_output(struct proc *p, int i, const uint8_t *d, size_t n) {
  uint8_t type = i ? MOAT_REP_STDERR : MOAT_REP_STDOUT;
  ring_put(&p->ring[i], d, n);
  struct conn *pc = p->primary;
  if (pc) {
    uint64_t room = p->cap - p->fwd[i];
    size_t keep = (uint64_t)n < room ? n : (size_t)room;
    if (keep < n)
      p->trunc[i] = true;
    if (keep > 0) {
      buf_put_data(&pc->out, type, d, keep);
      p->fwd[i] += keep;
      conn_flush(pc);
    }
  }
  for (struct conn *c = g_conns; c; c = c->next)
    if (c->p == p && !c->primary && !c->dead && c->kind == C_STREAM)
      attach_output(c, type, d, n);
}

/* Reads one chunk of stream i. */
static void proc_read(struct proc *p, int i) {
  if (p->fd[i] < 0)
    return;
  ssize_t r = read(p->fd[i], g_rbuf, sizeof(g_rbuf));
  if (r < 0 && (errno == EAGAIN || errno == EINTR))
    return;
  if (r <= 0) { /* EOF, or EIO from a pty master whose slave every holder closed */
    close_fd(&p->fd[i]);
    return;
  }
  proc_output(p, i, g_rbuf, (size_t)r);
}

/* After the exit: forward what is already buffered, never waiting for more (a background child
 * may hold the write end open forever), then close. */
static void proc_drain(struct proc *p, int i) {
  if (p->fd[i] < 0)
    return;
  if (p->pty) {
    /* A pty's last output may still sit in the tty layer's flip buffer (FIONREAD says 0 until
     * the kernel pushes it to the line discipline): read until EIO (every slave holder gone), or
     * until 20 ms pass without data (a background child keeps the slave open), 200 ms at most. */
    uint64_t deadline = now_ns() + 200000000ull;
    while (now_ns() < deadline) {
      struct pollfd pf = {.fd = p->fd[i], .events = POLLIN};
      if (poll(&pf, 1, 20) <= 0)
        break;
      ssize_t r = read(p->fd[i], g_rbuf, sizeof(g_rbuf));
      if (r <= 0)
        break;
      proc_output(p, i, g_rbuf, (size_t)r);
    }
    close_fd(&p->fd[i]);
    return;
  }
  for (;;) {
    int avail = 0;
    if (ioctl(p->fd[i], FIONREAD, &avail) < 0 || avail <= 0)
      break;
    ssize_t r = read(p->fd[i], g_rbuf, sizeof(g_rbuf));
    if (r <= 0)
      break;
    proc_output(p, i, g_rbuf, (size_t)r);
  }
  close_fd(&p->fd[i]);
}

static void put_exit(struct moat_msg *m, const struct proc *p) {
  bool sig = WIFSIGNALED(p->status);
  moat_msg_reset(m, MOAT_REP_EXIT);
  moat_msg_put_i32(m, MOAT_T_EXIT_CODE, sig ? -1 : WEXITSTATUS(p->status));
  moat_msg_put_i32(m, MOAT_T_SIGNAL, sig ? WTERMSIG(p->status) : 0);
  moat_msg_put_u32(m, MOAT_T_TIMED_OUT, p->timed_out);
  moat_msg_put_u32(m, MOAT_T_STDOUT_TRUNC, p->trunc[0]);
  moat_msg_put_u32(m, MOAT_T_STDERR_TRUNC, p->trunc[1]);
  moat_msg_put_u64(m, MOAT_T_DURATION_MS, p->duration_ms);
}

static void put_proc(struct moat_msg *m, const struct proc *p) {
  moat_msg_reset(m, MOAT_REP_PROC);
  moat_msg_put_i32(m, MOAT_T_PID, p->pid);
  if (p->tag)
    moat_msg_put_str(m, MOAT_T_TAG, p->tag);
  for (size_t i = 0; p->argv[i]; i++)
    moat_msg_put_str(m, MOAT_T_ARGV, p->argv[i]);
  moat_msg_put_i64(m, MOAT_T_STARTED_AT, p->started_ms);
  moat_msg_put_u32(m, MOAT_T_RUNNING, p->running);
  if (!p->running) {
    bool sig = WIFSIGNALED(p->status);
    moat_msg_put_i32(m, MOAT_T_EXIT_CODE, sig ? -1 : WEXITSTATUS(p->status));
    moat_msg_put_i32(m, MOAT_T_SIGNAL, sig ? WTERMSIG(p->status) : 0);
  }
  moat_msg_put_u32(m, MOAT_T_PTY, p->pty);
  moat_msg_put_u32(m, MOAT_T_BACKGROUND, p->background);
}

/* Sends the exit to every connection of p and closes them once flushed. */
static void conn_send_exit(struct conn *c, const struct moat_msg *exit_msg) {
  if (c->dropped) {
    struct moat_msg m;
    moat_msg_init(&m, MOAT_REP_DROPPED);
    moat_msg_put_u64(&m, MOAT_T_SIZE, c->dropped);
    buf_put_msg(&c->out, &m);
    moat_msg_free(&m);
    c->dropped = 0;
  }
  buf_put_msg(&c->out, exit_msg);
  conn_finish(c);
}

static void trim_finished(void) {
  size_t n = 0;
  for (struct proc *p = g_procs; p; p = p->next)
    n += !p->running && !p->dead;
  for (struct proc *p = g_procs; p && n > FINISHED_KEEP; p = p->next)
    if (!p->running && !p->dead) {
      p->dead = true;
      n--;
    }
}

void guest_procs_reaped(pid_t pid, int status) {
  struct proc *p = NULL;
  for (struct proc *q = g_procs; q; q = q->next)
    if (q->running && q->pid == pid)
      p = q;
  if (!p)
    return;
  p->running = false;
  p->status = status;
  p->duration_ms = (now_ns() - p->t0_ns) / 1000000;
  proc_drain(p, 0);
  proc_drain(p, 1);
  close_fd(&p->in_fd);
  p->stdin_open = false;
  buf_free(&p->inq);
  struct moat_msg m;
  moat_msg_init(&m, 0);
  put_exit(&m, p);
  for (struct conn *c = g_conns; c; c = c->next)
    if (c->p == p && !c->dead && c->kind == C_STREAM)
      conn_send_exit(c, &m);
  moat_msg_free(&m);
  p->primary = NULL;
  trim_finished();
}

/* ---- requests ---- */

static bool tag_valid(const char *t) {
  size_t n = strlen(t);
  if (n < 1 || n > 64)
    return false;
  for (size_t i = 0; i < n; i++) {
    char ch = t[i];
    if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_' ||
          ch == '.' || ch == '-'))
      return false;
  }
  return true;
}

static struct proc *find_running_tag(const char *tag) {
  for (struct proc *p = g_procs; p; p = p->next)
    if (!p->dead && p->running && p->tag && strcmp(p->tag, tag) == 0)
      return p;
  return NULL;
}

/* The process a request names by PID or TAG: a running one first, else the latest finished one.
 * NULL after answering the connection with an error. */
static struct proc *request_proc(struct conn *c, const struct moat_msg *req) {
  _cleanup_free_ char *tag = moat_msg_get_str(req, MOAT_T_TAG);
  int32_t pid = 0;
  struct moat_field f;
  if (!tag && moat_msg_find(req, MOAT_T_TAG, &f)) {
    conn_error(c, EINVAL, "tag holds a NUL byte");
    return NULL;
  }
  if (!tag && (moat_msg_get_i32(req, MOAT_T_PID, &pid) < 0 || pid <= 0)) {
    conn_error(c, EINVAL, "a pid (> 0) or a tag is required");
    return NULL;
  }
  struct proc *found = NULL;
  for (struct proc *p = g_procs; p; p = p->next) {
    if (p->dead || (tag ? !p->tag || strcmp(p->tag, tag) != 0 : p->pid != pid))
      continue;
    if (p->running)
      return p;
    found = p;
  }
  if (!found) {
    if (tag)
      conn_error(c, ESRCH, "no process tagged '%s'", tag);
    else
      conn_error(c, ESRCH, "no process %d", pid);
  }
  return found;
}

static void req_exec(struct conn *c, const struct moat_msg *req) {
  uint32_t background = 0, kod = 1, stdin_stream = 0, timeout_ms = 0;
  uint64_t max_output = DEFAULT_MAX_OUTPUT;
  moat_msg_get_u32(req, MOAT_T_BACKGROUND, &background);
  moat_msg_get_u32(req, MOAT_T_KILL_ON_DISCONNECT, &kod);
  moat_msg_get_u32(req, MOAT_T_STDIN_STREAM, &stdin_stream);
  moat_msg_get_u32(req, MOAT_T_TIMEOUT_MS, &timeout_ms);
  if (moat_msg_get_u64(req, MOAT_T_MAX_OUTPUT, &max_output) == 0 && max_output == 0)
    max_output = DEFAULT_MAX_OUTPUT; /* 0 = the default, as guest_client.h documents */
  _cleanup_free_ char *tag = moat_msg_get_str(req, MOAT_T_TAG);
  struct moat_field f;
  if (moat_msg_find(req, MOAT_T_TAG, &f) && (!tag || !tag_valid(tag))) {
    conn_error(c, EINVAL, "exec: tag must match [A-Za-z0-9_.-]{1,64}");
    return;
  }
  if (tag && find_running_tag(tag)) {
    conn_error(c, EEXIST, "exec: a running process is already tagged '%s'", tag);
    return;
  }
  struct guest_spawn sp;
  moat_error *err = NULL;
  if (guest_spawn(req, g_etc, &g_defaults, &sp, &err) < 0) {
    conn_error(c, err->status, "%s", moat_error_msg(err));
    moat_error_free(&err);
    return;
  }
  struct proc *p = xcalloc(1, sizeof(*p));
  p->pid = sp.pid;
  p->tag = steal_pointer(&tag);
  p->argv = moat_msg_get_strv(req, MOAT_T_ARGV);
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  p->started_ms = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
  p->t0_ns = sp.t0_ns;
  p->deadline_ns = timeout_ms ? sp.t0_ns + (uint64_t)timeout_ms * 1000000ull : 0;
  p->running = true;
  p->pty = sp.pty;
  p->background = background != 0;
  p->kill_on_disconnect = kod != 0 && !background;
  p->fd[0] = sp.out_fd;
  p->fd[1] = sp.err_fd;
  p->in_fd = sp.in_fd;
  p->cap = max_output;
  /* A plain exec without STDIN_STREAM reads EOF at once, as it always did; a process that may
   * outlive its connection (or talks to a terminal) keeps stdin open for STDIN / attach input. */
  p->stdin_open = stdin_stream || background || sp.pty || !kod;
  if (!p->stdin_open)
    close_fd(&p->in_fd);
  struct proc **tail = &g_procs;
  while (*tail)
    tail = &(*tail)->next;
  *tail = p;

  struct moat_msg m;
  moat_msg_init(&m, MOAT_REP_STARTED);
  moat_msg_put_i32(&m, MOAT_T_PID, p->pid);
  buf_put_msg(&c->out, &m);
  moat_msg_free(&m);
  if (background) {
    conn_finish(c);
    return;
  }
  c->kind = C_STREAM;
  c->beat_ns = now_ns() + MOAT_PROTO_HEARTBEAT_MS * 1000000ull;
  c->p = p;
  c->primary = true;
  c->deadline_ns = 0;
  p->primary = c;
  conn_flush(c);
}

static void ring_replay(struct conn *c, const struct ring *r, uint8_t type) {
  uint64_t keep = r->total < RING_CAP ? r->total : RING_CAP;
  size_t pos = (size_t)((r->total - keep) % RING_CAP);
  while (keep > 0) {
    size_t k = RING_CAP - pos < keep ? RING_CAP - pos : (size_t)keep;
    buf_put_data(&c->out, type, r->b + pos, k);
    keep -= k;
    pos = (pos + k) % RING_CAP;
  }
}

static void req_attach(struct conn *c, const struct moat_msg *req) {
  struct proc *p = request_proc(c, req);
  if (!p)
    return;
  uint32_t replay = 0;
  moat_msg_get_u32(req, MOAT_T_REPLAY, &replay);
  struct moat_msg m;
  moat_msg_init(&m, 0);
  put_proc(&m, p);
  buf_put_msg(&c->out, &m);
  if (replay) {
    uint64_t lost = 0;
    for (int i = 0; i < 2; i++)
      lost += p->ring[i].total > RING_CAP ? p->ring[i].total - RING_CAP : 0;
    if (lost) {
      moat_msg_reset(&m, MOAT_REP_DROPPED);
      moat_msg_put_u64(&m, MOAT_T_SIZE, lost);
      buf_put_msg(&c->out, &m);
    }
    ring_replay(c, &p->ring[0], MOAT_REP_STDOUT);
    ring_replay(c, &p->ring[1], MOAT_REP_STDERR);
  }
  if (!p->running) {
    put_exit(&m, p);
    buf_put_msg(&c->out, &m);
    conn_finish(c);
  } else {
    c->kind = C_STREAM;
    c->beat_ns = now_ns() + MOAT_PROTO_HEARTBEAT_MS * 1000000ull;
    c->p = p;
    c->primary = false;
    c->deadline_ns = 0;
    conn_flush(c);
  }
  moat_msg_free(&m);
}

static void req_stdin(struct conn *c, const struct moat_msg *req) {
  struct proc *p = request_proc(c, req);
  if (!p)
    return;
  if (!p->running || !p->stdin_open) {
    conn_error(c, EPIPE, "process %d: %s", p->pid, p->running ? "stdin is closed" : "has exited");
    return;
  }
  if (buf_pending(&p->inq) > STDIN_MAX) {
    conn_error(c, EAGAIN, "process %d: too much input waiting", p->pid);
    return;
  }
  struct moat_field f;
  uint32_t close_it = 0;
  moat_msg_get_u32(req, MOAT_T_CLOSE, &close_it);
  if (moat_msg_find(req, MOAT_T_DATA, &f))
    proc_input(p, f.data, f.len);
  if (close_it)
    proc_close_stdin(p);
  conn_ok(c);
}

static int signal_of(int32_t s) {
  static const int ok[] = {SIGTERM, SIGKILL, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGSTOP, SIGCONT};
  for (size_t i = 0; i < ARRAY_SIZE(ok); i++)
    if (ok[i] == s)
      return s;
  return 0;
}

static void req_signal(struct conn *c, const struct moat_msg *req) {
  int32_t s = 0;
  if (moat_msg_get_i32(req, MOAT_T_SIGNAL, &s) < 0 || !signal_of(s)) {
    conn_error(c, EINVAL, "signal %d is not one of TERM KILL INT HUP QUIT USR1 USR2 STOP CONT", s);
    return;
  }
  struct proc *p = request_proc(c, req);
  if (!p)
    return;
  if (!p->running) {
    conn_error(c, ESRCH, "process %d has exited", p->pid);
    return;
  }
  if (kill(-p->pid, s) < 0 && kill(p->pid, s) < 0) {
    conn_error(c, errno, "signal %d to %d: %s", s, p->pid, strerror(errno));
    return;
  }
  conn_ok(c);
}

static int set_size(struct proc *p, uint32_t cols, uint32_t rows) {
  struct winsize ws = {.ws_row = (unsigned short)rows, .ws_col = (unsigned short)cols};
  return p->fd[0] >= 0 ? ioctl(p->fd[0], TIOCSWINSZ, &ws) : -1;
}

static void req_resize(struct conn *c, const struct moat_msg *req) {
  struct proc *p = request_proc(c, req);
  if (!p)
    return;
  uint32_t cols = 0, rows = 0;
  moat_msg_get_u32(req, MOAT_T_PTY_COLS, &cols);
  moat_msg_get_u32(req, MOAT_T_PTY_ROWS, &rows);
  if (cols < 1 || cols > 1000 || rows < 1 || rows > 1000) {
    conn_error(c, EINVAL, "pty size %ux%u out of 1..1000", cols, rows);
    return;
  }
  if (!p->pty) {
    conn_error(c, ENOTTY, "process %d has no pty", p->pid);
    return;
  }
  if (!p->running) {
    conn_error(c, ESRCH, "process %d has exited", p->pid);
    return;
  }
  if (set_size(p, cols, rows) < 0) {
    conn_error(c, errno, "resize: %s", strerror(errno));
    return;
  }
  conn_ok(c);
}

static void req_procs(struct conn *c) {
  struct moat_msg m;
  moat_msg_init(&m, 0);
  for (struct proc *p = g_procs; p; p = p->next)
    if (!p->dead) {
      put_proc(&m, p);
      buf_put_msg(&c->out, &m);
    }
  moat_msg_reset(&m, MOAT_MSG_END);
  buf_put_msg(&c->out, &m);
  moat_msg_free(&m);
  conn_finish(c);
}

/* DEFAULTS: USER and CWD (each optional; absent: none) for the EXECs that name neither. */
static void req_defaults(struct conn *c, const struct moat_msg *req) {
  _cleanup_free_ char *user = moat_msg_get_str(req, MOAT_T_USER);
  _cleanup_free_ char *cwd = moat_msg_get_str(req, MOAT_T_CWD);
  struct moat_field f;
  if ((!user && moat_msg_find(req, MOAT_T_USER, &f)) || (!cwd && moat_msg_find(req, MOAT_T_CWD, &f))) {
    conn_error(c, EINVAL, "defaults: user or cwd holds a NUL byte");
    return;
  }
  if ((user && (!user[0] || strlen(user) > 256)) || (cwd && (cwd[0] != '/' || strlen(cwd) > 4096))) {
    conn_error(c, EINVAL, "defaults: user must be a name, cwd an absolute path");
    return;
  }
  free((char *)g_defaults.user);
  free((char *)g_defaults.cwd);
  g_defaults.user = steal_pointer(&user);
  g_defaults.cwd = steal_pointer(&cwd);
  conn_ok(c);
}

/* ---- the log (LOGS) ---- */

static void log_put_data(struct conn *c, const struct proc *p, int i, const uint8_t *d, size_t n) {
  struct moat_msg m;
  moat_msg_init(&m, MOAT_REP_STDOUT);
  moat_msg_put_i32(&m, MOAT_T_PID, p->pid);
  if (p->tag)
    moat_msg_put_str(&m, MOAT_T_TAG, p->tag);
  moat_msg_put_u32(&m, MOAT_T_PTY, p->pty);
  moat_msg_put_u32(&m, MOAT_T_STREAM, (uint32_t)i);
  moat_msg_put(&m, MOAT_T_DATA, d, n);
  buf_put_msg(&c->out, &m);
  moat_msg_free(&m);
}

/* Moves what the log has not taken from the rings into g_log's queue, at most one chunk per
 * stream and process per call (so that one loud process does not keep the others waiting) and
 * only while less than LOG_HIGH waits (log_holds keeps a process from running far ahead). */
static void log_pump(void) {
  struct conn *c = g_log;
  if (!c || c->dead)
    return;
  struct moat_msg m;
  moat_msg_init(&m, 0);
  for (struct proc *p = g_procs; p && buf_pending(&c->out) < LOG_HIGH; p = p->next) {
    if (p->dead)
      continue;
    if (!p->log_started) {
      put_proc(&m, p);
      buf_put_msg(&c->out, &m);
      p->log_started = true;
    }
    bool behind = false;
    for (int i = 0; i < 2; i++) {
      const struct ring *r = &p->ring[i];
      uint64_t oldest = r->total > RING_CAP ? r->total - RING_CAP : 0;
      if (p->logged[i] < oldest) {
        moat_msg_reset(&m, MOAT_REP_DROPPED);
        moat_msg_put_i32(&m, MOAT_T_PID, p->pid);
        moat_msg_put_u32(&m, MOAT_T_STREAM, (uint32_t)i);
        moat_msg_put_u64(&m, MOAT_T_SIZE, oldest - p->logged[i]);
        buf_put_msg(&c->out, &m);
        p->logged[i] = oldest;
      }
      if (p->logged[i] < r->total && buf_pending(&c->out) < LOG_HIGH) {
        size_t pos = (size_t)(p->logged[i] % RING_CAP);
        uint64_t left = r->total - p->logged[i];
        size_t k = RING_CAP - pos;
        if ((uint64_t)k > left)
          k = (size_t)left;
        if (k > MOAT_PROTO_CHUNK)
          k = MOAT_PROTO_CHUNK;
        log_put_data(c, p, i, r->b + pos, k);
        p->logged[i] += k;
      }
      behind |= p->logged[i] < r->total;
    }
    if (!p->running && !p->log_exited && !behind && p->fd[0] < 0 && p->fd[1] < 0) {
      put_exit(&m, p);
      moat_msg_put_i32(&m, MOAT_T_PID, p->pid);
      buf_put_msg(&c->out, &m);
      p->log_exited = true;
    }
  }
  moat_msg_free(&m);
  conn_flush(c);
}

static void req_logs(struct conn *c) {
  if (g_log && g_log != c)
    conn_drop(g_log); /* one log reader at a time: the newest */
  g_log = c;
  g_log_progress_ns = now_ns();
  struct moat_msg m;
  moat_msg_init(&m, MOAT_REP_OK);
  buf_put_msg(&c->out, &m);
  moat_msg_free(&m);
  c->kind = C_LOG;
  c->deadline_ns = 0;
  c->beat_ns = now_ns() + MOAT_PROTO_HEARTBEAT_MS * 1000000ull;
  log_pump();
}

static void handle_request(struct conn *c, const struct moat_msg *req) {
  switch (req->type) {
  case MOAT_REQ_LOGS:
    req_logs(c);
    break;
  case MOAT_REQ_EXEC:
    req_exec(c, req);
    break;
  case MOAT_REQ_ATTACH:
    req_attach(c, req);
    break;
  case MOAT_REQ_STDIN:
    req_stdin(c, req);
    break;
  case MOAT_REQ_SIGNAL:
    req_signal(c, req);
    break;
  case MOAT_REQ_RESIZE:
    req_resize(c, req);
    break;
  case MOAT_REQ_PROCS:
    req_procs(c);
    break;
  case MOAT_REQ_DEFAULTS:
    req_defaults(c, req);
    break;
  case MOAT_REQ_RENEW:
    if (g_renew_fd >= 0) {
      conn_error(c, EBUSY, "a renewal is under way");
      break;
    }
    g_renew_fd = fcntl(c->fd, F_DUPFD_CLOEXEC, 3);
    if (g_renew_fd < 0) {
      conn_error(c, errno, "renew: dup: %s", strerror(errno));
      break;
    }
    fd_set_nonblock(g_renew_fd, false);
    c->dead = true; /* main.c answers on the duplicate */
    break;
  default:
    conn_error(c, EPROTO, "guest protocol: unknown request type %u", req->type);
    break;
  }
}

/* A frame on a stream connection: input, end of input, or a resize. false on anything else. */
static bool stream_frame(struct conn *c, const struct moat_msg *m) {
  struct proc *p = c->p;
  struct moat_field f;
  switch (m->type) {
  case MOAT_MSG_DATA:
    if (p && moat_msg_find(m, MOAT_T_DATA, &f))
      proc_input(p, f.data, f.len);
    return true;
  case MOAT_MSG_END:
    if (p)
      proc_close_stdin(p);
    return true;
  case MOAT_REQ_RESIZE: {
    uint32_t cols = 0, rows = 0;
    moat_msg_get_u32(m, MOAT_T_PTY_COLS, &cols);
    moat_msg_get_u32(m, MOAT_T_PTY_ROWS, &rows);
    if (p && p->pty && p->running && cols >= 1 && cols <= 1000 && rows >= 1 && rows <= 1000)
      set_size(p, cols, rows);
    return true;
  }
  default:
    return false;
  }
}

/* Takes one complete frame off c->in into m. 1 taken, 0 incomplete, -1 malformed (err). */
static int take_frame(struct conn *c, struct moat_msg *m, moat_error **err) {
  size_t have = buf_pending(&c->in);
  if (have < 4)
    return 0;
  const uint8_t *p = c->in.b + c->in.off;
  uint32_t flen = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
  if (flen < 1 || flen > MOAT_PROTO_MAX_FRAME)
    return moat_error_set(err, EPROTO, "guest protocol: bad frame length %u", flen);
  if (have < 4 + (size_t)flen)
    return 0;
  if (moat_msg_parse(p, 4 + (size_t)flen, m, err) < 0)
    return -1;
  c->in.off += 4 + (size_t)flen;
  return 1;
}

/* Parses and acts on the frames that have arrived, as far as the state allows. */
static void conn_frames(struct conn *c) {
  struct moat_msg m;
  moat_msg_init(&m, 0);
  moat_error *err = NULL;
  while (!c->dead && c->kind != C_DONE) {
    if (c->kind == C_STREAM && c->p && buf_pending(&c->p->inq) > STDIN_HIGH)
      break; /* the rest waits until the process reads its input */
    int r = take_frame(c, &m, &err);
    if (r == 0)
      break;
    if (r < 0) {
      conn_error(c, EPROTO, "%s", moat_error_msg(err));
      moat_error_free(&err);
      break;
    }
    if (c->kind == C_REQ)
      handle_request(c, &m);
    else if (!stream_frame(c, &m))
      conn_error(c, EPROTO, "guest protocol: frame type %u on a process stream", m.type);
  }
  if (c->kind == C_DONE)
    c->in.off = c->in.len = 0; /* whatever else the host sent is ignored */
  moat_msg_free(&m);
}

/* True when the host closed the connection (both ways), not just its write side: a disconnect,
 * which ends a process that dies with its connection (conn_drop) and leaves the input of one that
 * outlives it open (a pty's shell gets no ^D). */
static bool peer_closed(int fd) {
  struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
  return poll(&p, 1, 0) > 0 && (p.revents & (POLLHUP | POLLERR)) != 0;
}

static void conn_read(struct conn *c, bool hup) {
  while (!c->rd_eof && !c->dead && c->kind != C_DONE) {
    if (c->kind == C_STREAM && c->p && buf_pending(&c->p->inq) > STDIN_HIGH)
      break;
    uint8_t *b = buf_reserve(&c->in, 64u << 10);
    ssize_t r = recv(c->fd, b, 64u << 10, MSG_DONTWAIT);
    if (r < 0) {
      if (errno == EINTR)
        continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK)
        hup = true;
      break;
    }
    if (r == 0) {
      c->rd_eof = true;
      break;
    }
    c->in.len += (size_t)r;
    conn_frames(c);
  }
  if (c->dead)
    return;
  if (c->rd_eof) {
    if (c->kind == C_REQ) {
      if (buf_pending(&c->in) > 0 && !hup)
        conn_error(c, EPROTO, "guest protocol: connection closed inside a frame");
      else
        c->dead = true;
    } else if (c->kind == C_STREAM && c->primary && c->p && !hup && !peer_closed(c->fd)) {
      proc_close_stdin(c->p); /* the host shut its write side only: end of input */
    }
  }
  if (hup && !c->dead) /* the host is gone */
    conn_drop(c);
}

void guest_procs_adopt(int fd) {
  struct conn *c = xcalloc(1, sizeof(*c));
  c->fd = fd;
  c->kind = C_REQ;
  c->deadline_ns = now_ns() + REQUEST_TIMEOUT_NS;
  fd_set_nonblock(fd, true);
  c->next = g_conns;
  g_conns = c;
  conn_read(c, false);
}

/* True while stream i of p waits for the log (LOG_LAG); *until: when that wait ends at the latest. */
static bool log_holds(const struct proc *p, int i, uint64_t now, uint64_t *until) {
  if (!g_log || g_log->dead || p->ring[i].total - p->logged[i] <= LOG_LAG)
    return false;
  uint64_t end = g_log_progress_ns + LOG_STALL_NS;
  if (now >= end)
    return false;
  *until = end;
  return true;
}

/* ---- the loop's side ---- */

enum slot_kind { S_OUT, S_ERR, S_IN, S_CONN };
struct slot {
  enum slot_kind kind;
  void *ptr;
};
static struct pollfd *g_pv;
static struct slot *g_sv;
static size_t g_pcap;

static void add_slot(size_t *k, int fd, short ev, enum slot_kind kind, void *ptr) {
  if (*k >= g_pcap) {
    g_pcap = g_pcap ? g_pcap * 2 : 64;
    g_pv = xrealloc(g_pv, g_pcap * sizeof(*g_pv));
    g_sv = xrealloc(g_sv, g_pcap * sizeof(*g_sv));
  }
  g_pv[*k] = (struct pollfd){.fd = fd, .events = ev};
  g_sv[*k] = (struct slot){kind, ptr};
  (*k)++;
}

struct pollfd *guest_procs_pollfds(size_t base, size_t *n, int *timeout_ms) {
  log_pump();
  size_t k = 0;
  while (k < base)
    add_slot(&k, -1, 0, S_CONN, NULL);
  uint64_t next = 0, now = now_ns();
  for (struct proc *p = g_procs; p; p = p->next) {
    if (p->dead)
      continue;
    bool room = !p->primary || buf_pending(&p->primary->out) < PRIMARY_HIGH;
    for (int i = 0; i < 2; i++) {
      uint64_t until = 0;
      if (!room || p->fd[i] < 0)
        continue;
      if (log_holds(p, i, now, &until)) {
        if (!next || until < next)
          next = until;
        continue;
      }
      add_slot(&k, p->fd[i], POLLIN, i ? S_ERR : S_OUT, p);
    }
    if (p->in_fd >= 0 && buf_pending(&p->inq) > 0)
      add_slot(&k, p->in_fd, POLLOUT, S_IN, p);
    if (p->running && p->deadline_ns && !p->timed_out && (!next || p->deadline_ns < next))
      next = p->deadline_ns;
  }
  for (struct conn *c = g_conns; c; c = c->next) {
    if (c->dead)
      continue;
    short ev = 0;
    bool want_in = c->kind == C_REQ || c->kind == C_LOG ||
                   (c->kind == C_STREAM && (!c->p || buf_pending(&c->p->inq) <= STDIN_HIGH));
    if (want_in && !c->rd_eof)
      ev |= POLLIN;
    if (buf_pending(&c->out) > 0)
      ev |= POLLOUT;
    add_slot(&k, c->fd, ev, S_CONN, c);
    if (c->deadline_ns && (!next || c->deadline_ns < next))
      next = c->deadline_ns;
    /* a heartbeat is due only where nothing waits to be sent (the host is not reading then) */
    if ((c->kind == C_STREAM || c->kind == C_LOG) && buf_pending(&c->out) == 0 &&
        (!next || c->beat_ns < next))
      next = c->beat_ns;
  }
  *timeout_ms = -1;
  if (next) {
    now = now_ns();
    uint64_t ms = next > now ? (next - now + 999999) / 1000000 : 0;
    *timeout_ms = ms > 1000000 ? 1000000 : (int)ms;
  }
  *n = k;
  return g_pv;
}

void guest_procs_quiesce(void) {
  for (struct conn *c = g_conns; c; c = c->next) {
    if (c->p && c->primary)
      c->p->kill_on_disconnect = false; /* the process outlives its cut stream */
    conn_drop(c);
  }
}

static void sweep(void) {
  for (struct conn **pc = &g_conns; *pc;) {
    struct conn *c = *pc;
    if (c->kind == C_DONE && buf_pending(&c->out) == 0)
      c->dead = true;
    if (!c->dead) {
      pc = &c->next;
      continue;
    }
    conn_detach(c);
    if (g_log == c)
      g_log = NULL;
    *pc = c->next;
    close(c->fd);
    buf_free(&c->out);
    buf_free(&c->in);
    free(c);
  }
  for (struct proc **pp = &g_procs; *pp;) {
    struct proc *p = *pp;
    if (!p->dead) {
      pp = &p->next;
      continue;
    }
    *pp = p->next;
    proc_free(p);
  }
}

void guest_procs_dispatch(struct pollfd *pv, size_t base, size_t n) {
  for (size_t i = base; i < n; i++) {
    short rev = pv[i].revents;
    if (!rev)
      continue;
    struct slot s = g_sv[i];
    if (s.kind == S_CONN) {
      struct conn *c = s.ptr;
      if (c->dead)
        continue;
      if ((rev & POLLOUT) && conn_flush(c) < 0)
        continue;
      if (rev & POLLIN)
        conn_read(c, (rev & (POLLHUP | POLLERR)) != 0);
      else if (rev & (POLLHUP | POLLERR))
        conn_drop(c);
      continue;
    }
    struct proc *p = s.ptr;
    if (p->dead)
      continue;
    if (s.kind == S_IN)
      proc_pump_stdin(p);
    else
      proc_read(p, s.kind == S_ERR);
  }
  /* Input that waited for room in a stdin queue. */
  for (struct conn *c = g_conns; c; c = c->next)
    if (!c->dead && c->kind == C_STREAM && buf_pending(&c->in) > 0)
      conn_frames(c);
  uint64_t now = now_ns();
  for (struct proc *p = g_procs; p; p = p->next)
    if (!p->dead && p->running && p->deadline_ns && !p->timed_out && now >= p->deadline_ns) {
      kill_group(p);
      p->timed_out = true;
    }
  for (struct conn *c = g_conns; c; c = c->next) {
    if (!c->dead && (c->kind == C_STREAM || c->kind == C_LOG) && buf_pending(&c->out) == 0 &&
        now >= c->beat_ns) {
      struct moat_msg alive;
      moat_msg_init(&alive, MOAT_REP_ALIVE);
      buf_put_msg(&c->out, &alive);
      conn_flush(c);
    }
    if (c->dead || !c->deadline_ns || now < c->deadline_ns)
      continue;
    if (c->kind == C_REQ)
      conn_error(c, ETIMEDOUT, "guest protocol: no request within %llu s",
                 (unsigned long long)(REQUEST_TIMEOUT_NS / 1000000000ull));
    else
      c->dead = true;
  }
  sweep();
}

/* ---- renewal (guest.h) ---- */

int guest_procs_renew_requested(void) {
  int fd = g_renew_fd;
  g_renew_fd = -1;
  return fd;
}

/* One frame of type STATE_PROC per process, with these fields. */
#define STATE_PROC 200
enum state_tag {
  ST_PID = 1,
  ST_TAG,
  ST_ARGV,
  ST_STARTED,
  ST_T0,
  ST_DEADLINE,
  ST_DURATION,
  ST_FLAGS,
  ST_STATUS,
  ST_FD_OUT,
  ST_FD_ERR,
  ST_FD_IN,
  ST_INQ,
  ST_RING_OUT,
  ST_RING_ERR,
  ST_TOTAL_OUT,
  ST_TOTAL_ERR,
  ST_CAP,
  ST_FWD_OUT,
  ST_FWD_ERR,
  ST_LOG_OUT,
  ST_LOG_ERR,
};
enum state_flag {
  SF_RUNNING = 1,
  SF_PTY = 2,
  SF_BACKGROUND = 4,
  SF_KOD = 8,
  SF_TIMED_OUT = 16,
  SF_STDIN_OPEN = 32,
  SF_TRUNC_OUT = 64,
  SF_TRUNC_ERR = 128,
  SF_LOG_START = 256,
  SF_LOG_EXIT = 512,
};

/* The retained bytes of r, oldest first, into m under tag. */
static void put_ring(struct moat_msg *m, uint16_t tag, const struct ring *r) {
  uint64_t keep = r->total < RING_CAP ? r->total : RING_CAP;
  uint8_t *flat = xmalloc(keep ? keep : 1);
  size_t pos = (size_t)((r->total - keep) % RING_CAP), off = 0;
  while (off < keep) {
    size_t k = RING_CAP - pos < keep - off ? RING_CAP - pos : (size_t)(keep - off);
    memcpy(flat + off, r->b + pos, k);
    off += k;
    pos = (pos + k) % RING_CAP;
  }
  moat_msg_put(m, tag, flat, keep);
  free(flat);
}

static void keep_fd(int fd, bool across_exec) {
  if (fd >= 0)
    fd_set_cloexec(fd, !across_exec);
}

int guest_procs_save(int fd, moat_error **err) {
  for (struct conn *c = g_conns; c; c = c->next) {
    if (c->p && c->primary)
      c->p->kill_on_disconnect = false; /* as at a quiesce: the process outlives its stream */
    conn_drop(c);
  }
  sweep();
  struct moat_msg m;
  moat_msg_init(&m, STATE_PROC);
  int ret = 0;
  for (struct proc *p = g_procs; p && ret == 0; p = p->next) {
    moat_msg_reset(&m, STATE_PROC);
    moat_msg_put_i32(&m, ST_PID, p->pid);
    if (p->tag)
      moat_msg_put_str(&m, ST_TAG, p->tag);
    for (size_t i = 0; p->argv && p->argv[i]; i++)
      moat_msg_put_str(&m, ST_ARGV, p->argv[i]);
    moat_msg_put_i64(&m, ST_STARTED, p->started_ms);
    moat_msg_put_u64(&m, ST_T0, p->t0_ns);
    moat_msg_put_u64(&m, ST_DEADLINE, p->deadline_ns);
    moat_msg_put_u64(&m, ST_DURATION, p->duration_ms);
    uint32_t flags = (p->running ? SF_RUNNING : 0) | (p->pty ? SF_PTY : 0) |
                     (p->background ? SF_BACKGROUND : 0) | (p->kill_on_disconnect ? SF_KOD : 0) |
                     (p->timed_out ? SF_TIMED_OUT : 0) | (p->stdin_open ? SF_STDIN_OPEN : 0) |
                     (p->trunc[0] ? SF_TRUNC_OUT : 0) | (p->trunc[1] ? SF_TRUNC_ERR : 0) |
                     (p->log_started ? SF_LOG_START : 0) | (p->log_exited ? SF_LOG_EXIT : 0);
    moat_msg_put_u32(&m, ST_FLAGS, flags);
    moat_msg_put_i32(&m, ST_STATUS, p->status);
    moat_msg_put_i32(&m, ST_FD_OUT, p->fd[0]);
    moat_msg_put_i32(&m, ST_FD_ERR, p->fd[1]);
    moat_msg_put_i32(&m, ST_FD_IN, p->in_fd);
    moat_msg_put(&m, ST_INQ, p->inq.b ? p->inq.b + p->inq.off : (const uint8_t *)"", buf_pending(&p->inq));
    put_ring(&m, ST_RING_OUT, &p->ring[0]);
    put_ring(&m, ST_RING_ERR, &p->ring[1]);
    moat_msg_put_u64(&m, ST_TOTAL_OUT, p->ring[0].total);
    moat_msg_put_u64(&m, ST_TOTAL_ERR, p->ring[1].total);
    moat_msg_put_u64(&m, ST_CAP, p->cap);
    moat_msg_put_u64(&m, ST_FWD_OUT, p->fwd[0]);
    moat_msg_put_u64(&m, ST_FWD_ERR, p->fwd[1]);
    moat_msg_put_u64(&m, ST_LOG_OUT, p->logged[0]);
    moat_msg_put_u64(&m, ST_LOG_ERR, p->logged[1]);
    if (moat_msg_send(fd, &m) < 0)
      ret = moat_error_errno(err, "save the process table");
  }
  moat_msg_free(&m);
  if (ret == 0)
    for (struct proc *p = g_procs; p; p = p->next) {
      keep_fd(p->fd[0], true);
      keep_fd(p->fd[1], true);
      keep_fd(p->in_fd, true);
    }
  return ret;
}

void guest_procs_saved_undo(void) {
  for (struct proc *p = g_procs; p; p = p->next) {
    keep_fd(p->fd[0], false);
    keep_fd(p->fd[1], false);
    keep_fd(p->in_fd, false);
  }
}

/* An fd the saved table names: open in this image, or -1. */
static int saved_fd(const struct moat_msg *m, uint16_t tag) {
  int32_t fd = -1;
  if (moat_msg_get_i32(m, tag, &fd) < 0 || fd < 0 || fcntl(fd, F_GETFD) < 0)
    return -1;
  fd_set_cloexec(fd, true);
  fd_set_nonblock(fd, true);
  return fd;
}

/* Rebuilds ring r from the retained bytes and the total ever written. */
static void load_ring(struct ring *r, const struct moat_msg *m, uint16_t data_tag, uint16_t total_tag) {
  struct moat_field f;
  uint64_t total = 0;
  moat_msg_get_u64(m, total_tag, &total);
  if (!moat_msg_find(m, data_tag, &f) || f.len > RING_CAP || f.len > total)
    return;
  r->total = total - f.len; /* ring_put lays the bytes out where total puts them */
  ring_put(r, f.data, f.len);
  r->total = total;
}

int guest_procs_load(int fd, moat_error **err) {
  struct moat_msg m;
  moat_msg_init(&m, 0);
  struct proc **tail = &g_procs;
  while (*tail)
    tail = &(*tail)->next;
  int ret = 0;
  for (;;) {
    int r = moat_msg_recv(fd, &m, err);
    if (r <= 0) {
      ret = r;
      break;
    }
    int32_t pid = 0, status = 0;
    uint32_t flags = 0;
    if (m.type != STATE_PROC || moat_msg_get_i32(&m, ST_PID, &pid) < 0 || pid <= 0) {
      ret = moat_error_set(err, EPROTO, "renew: malformed saved process");
      break;
    }
    struct proc *p = xcalloc(1, sizeof(*p));
    p->pid = pid;
    p->tag = moat_msg_get_str(&m, ST_TAG);
    p->argv = moat_msg_get_strv(&m, ST_ARGV);
    if (!p->argv)
      p->argv = xcalloc(1, sizeof(char *));
    moat_msg_get_i64(&m, ST_STARTED, &p->started_ms);
    moat_msg_get_u64(&m, ST_T0, &p->t0_ns);
    moat_msg_get_u64(&m, ST_DEADLINE, &p->deadline_ns);
    moat_msg_get_u64(&m, ST_DURATION, &p->duration_ms);
    moat_msg_get_u32(&m, ST_FLAGS, &flags);
    moat_msg_get_i32(&m, ST_STATUS, &status);
    p->status = status;
    p->running = flags & SF_RUNNING;
    p->pty = flags & SF_PTY;
    p->background = flags & SF_BACKGROUND;
    p->kill_on_disconnect = flags & SF_KOD;
    p->timed_out = flags & SF_TIMED_OUT;
    p->stdin_open = flags & SF_STDIN_OPEN;
    p->trunc[0] = flags & SF_TRUNC_OUT;
    p->trunc[1] = flags & SF_TRUNC_ERR;
    p->fd[0] = saved_fd(&m, ST_FD_OUT);
    p->fd[1] = saved_fd(&m, ST_FD_ERR);
    p->in_fd = saved_fd(&m, ST_FD_IN);
    struct moat_field f;
    if (moat_msg_find(&m, ST_INQ, &f) && f.len > 0)
      buf_put(&p->inq, f.data, f.len);
    load_ring(&p->ring[0], &m, ST_RING_OUT, ST_TOTAL_OUT);
    load_ring(&p->ring[1], &m, ST_RING_ERR, ST_TOTAL_ERR);
    p->cap = DEFAULT_MAX_OUTPUT;
    moat_msg_get_u64(&m, ST_CAP, &p->cap);
    moat_msg_get_u64(&m, ST_FWD_OUT, &p->fwd[0]);
    moat_msg_get_u64(&m, ST_FWD_ERR, &p->fwd[1]);
    moat_msg_get_u64(&m, ST_LOG_OUT, &p->logged[0]);
    moat_msg_get_u64(&m, ST_LOG_ERR, &p->logged[1]);
    p->log_started = flags & SF_LOG_START;
    p->log_exited = flags & SF_LOG_EXIT;
    *tail = p;
    tail = &p->next;
  }
  moat_msg_free(&m);
  return ret < 0 ? -1 : 0;
}

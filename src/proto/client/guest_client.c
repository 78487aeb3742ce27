/* guest_client.c -- the host side of the guest protocol: one connection per operation (exec, processes,
 * files, watch) */
#include "guest_client.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../../common/buf.h"
#include "../../common/log.h"
#include "../../common/util.h"
#include "../proto.h"

#define DEFAULT_MAX_OUTPUT (16ull << 20)

void moat_guest_channel_configure(struct moat_guest_channel *ch, unsigned timeout_ms,
                                  void (*unreachable)(const struct moat_guest_ep *ep, void *arg), void *arg) {
  if (timeout_ms == 0)
    timeout_ms = MOAT_GUEST_TIMEOUT_MS_DEFAULT;
  ch->timeout_ms = timeout_ms < 3 * MOAT_PROTO_HEARTBEAT_MS ? 3 * MOAT_PROTO_HEARTBEAT_MS : timeout_ms;
  ch->unreachable = unreachable;
  ch->unreachable_arg = arg;
}

bool moat_guest_ep_same(const struct moat_guest_ep *a, const struct moat_guest_ep *b) {
  return a->ch == b->ch && a->pid == b->pid && a->uid == b->uid &&
         strncmp(a->path, b->path, sizeof(a->path)) == 0;
}

/* One connection to a guest: its socket, whom it belongs to and when the guest last spoke. */
struct gconn {
  int fd;
  struct moat_guest_ep ep;
  unsigned timeout_ms; /* the channel's */
  uint64_t last_rx_ns; /* atomic: the last frame from the guest (or the connect) */
};

/* Hands e up as *err (when the caller wants it and has none yet). Returns -1. */
static int pass_error(moat_error **err, moat_error *e) {
  if (err && !*err)
    *err = e;
  else
    moat_error_free(&e);
  return -1;
}

static uint64_t ms_ns(uint64_t ms) { return ms * 1000000ull; }

static bool ep_frozen(const struct moat_guest_ep *ep) {
  return ep->ch && ep->ch->ops->frozen && ep->ch->ops->frozen(ep);
}

static int unreachable(const struct gconn *g, const char *what, moat_error **err) {
  if (g->ep.ch && g->ep.ch->unreachable)
    g->ep.ch->unreachable(&g->ep, g->ep.ch->unreachable_arg);
  return moat_error_set(err, EHOSTUNREACH, "sandbox guest did not answer for %u ms (%s)", g->timeout_ms,
                        what);
}

/* Connects to ep through its channel. */
static int gc_open(struct gconn *g, const struct moat_guest_ep *ep, moat_error **err) {
  g->fd = -1;
  g->ep = *ep;
  g->timeout_ms = ep->ch && ep->ch->timeout_ms ? ep->ch->timeout_ms : MOAT_GUEST_TIMEOUT_MS_DEFAULT;
  if (!ep->ch)
    return moat_error_set(err, ECONNREFUSED, "sandbox guest: no channel");
  moat_error *e = NULL;
  int fd = ep->ch->ops->connect(ep, g->timeout_ms, &e);
  if (fd < 0) {
    if (e && e->status == EHOSTUNREACH && ep->ch->unreachable)
      ep->ch->unreachable(ep, ep->ch->unreachable_arg);
    return pass_error(err, e);
  }
  g->last_rx_ns = now_ns();
  g->fd = fd;
  return 0;
}

/* Waits until fd is readable. 1 readable; 0 when timeout_ms (>= 0) passed first; -1 with
 * EHOSTUNREACH when the guest sent nothing for the guest timeout (frozen sandboxes excepted). */
static int gc_wait_readable(struct gconn *g, int timeout_ms, moat_error **err) {
  uint64_t cend = timeout_ms >= 0 ? now_ns() + ms_ns((uint64_t)timeout_ms) : 0;
  for (;;) {
    uint64_t now = now_ns();
    uint64_t dead = __atomic_load_n(&g->last_rx_ns, __ATOMIC_RELAXED) + ms_ns(g->timeout_ms);
    uint64_t until = timeout_ms >= 0 && cend < dead ? cend : dead;
    int wait = until > now ? (int)((until - now + 999999) / 1000000) : 0;
    struct pollfd p = {.fd = g->fd, .events = POLLIN};
    int r = poll(&p, 1, wait);
    if (r > 0)
      return 1;
    if (r < 0) {
      if (errno == EINTR)
        continue;
      return moat_error_errno(err, "poll the sandbox guest");
    }
    /* nothing to read: the guest's silence is checked first, so that callers that only poll
     * (timeout 0) learn of a hung guest too */
    now = now_ns();
    if (now >= __atomic_load_n(&g->last_rx_ns, __ATOMIC_RELAXED) + ms_ns(g->timeout_ms)) {
      if (!ep_frozen(&g->ep))
        return unreachable(g, "waiting for its answer", err);
      __atomic_store_n(&g->last_rx_ns, now, __ATOMIC_RELAXED);
    }
    if (timeout_ms >= 0 && now >= cend)
      return 0;
  }
}

/* Receives the next frame that is not a heartbeat. 1 with a frame, 0 at EOF, -1 on error
 * (ETIMEDOUT when timeout_ms >= 0 passed first: the connection stays usable). */
static int gc_recv(struct gconn *g, struct moat_msg *m, int timeout_ms, moat_error **err) {
  uint64_t cend = timeout_ms >= 0 ? now_ns() + ms_ns((uint64_t)timeout_ms) : 0;
  for (;;) {
    int left = -1;
    if (timeout_ms >= 0) {
      uint64_t now = now_ns();
      left = cend > now ? (int)((cend - now + 999999) / 1000000) : 0;
    }
    int w = gc_wait_readable(g, left, err);
    if (w < 0)
      return -1;
    if (w == 0)
      return moat_error_set(err, ETIMEDOUT, "no frame from the guest in %d ms", timeout_ms);
    moat_error *e = NULL;
    int r = moat_msg_recv(g->fd, m, &e);
    if (r < 0) {
      if (e && (e->status == EAGAIN || e->status == EWOULDBLOCK)) {
        moat_error_free(&e);
        return unreachable(g, "a frame stopped half-way", err);
      }
      return pass_error(err, e);
    }
    if (r == 0)
      return 0;
    __atomic_store_n(&g->last_rx_ns, now_ns(), __ATOMIC_RELAXED);
    if (m->type != MOAT_REP_ALIVE)
      return 1;
  }
}

/* moat_msg_send_wait's wait: room in the socket within the guest timeout, counted from whichever
 * is later, this wait's start or the guest's last frame (a guest that streams or beats its heart
 * while not reading input is alive: a command that does not read its stdin). */
static int gc_send_wait(void *arg) {
  struct gconn *g = arg;
  uint64_t start = now_ns();
  for (;;) {
    struct pollfd p = {.fd = g->fd, .events = POLLOUT};
    int r = poll(&p, 1, 1000);
    if (r > 0)
      return 0;
    if (r < 0 && errno != EINTR)
      return -1;
    uint64_t now = now_ns(), last = __atomic_load_n(&g->last_rx_ns, __ATOMIC_RELAXED);
    uint64_t from = last > start ? last : start;
    if (now >= from + ms_ns(g->timeout_ms)) {
      if (!ep_frozen(&g->ep)) {
        if (g->ep.ch->unreachable)
          g->ep.ch->unreachable(&g->ep, g->ep.ch->unreachable_arg);
        errno = EHOSTUNREACH;
        return -1;
      }
      start = now;
    }
  }
}

static int gc_send(struct gconn *g, const struct moat_msg *m, const char *what, moat_error **err) {
  if (moat_msg_send_wait(g->fd, m, gc_send_wait, g) < 0)
    return moat_error_errno(err, "send %s to the sandbox guest", what);
  return 0;
}

static int gc_send_data(struct gconn *g, uint8_t type, const void *data, size_t len, moat_error **err) {
  if (moat_msg_send_data_wait(g->fd, type, data, len, gc_send_wait, g) < 0)
    return moat_error_errno(err, "send data to the sandbox guest");
  return 0;
}

static void gc_close(struct gconn *g) {
  if (g->fd >= 0)
    close(g->fd);
  g->fd = -1;
}

/* Turns a REP_ERROR frame into err (status = the guest's errno). */
static int guest_error(const struct moat_msg *m, moat_error **err) {
  int32_t e = EIO;
  moat_msg_get_i32(m, MOAT_T_ERRNO, &e);
  _cleanup_free_ char *text = moat_msg_get_str(m, MOAT_T_MESSAGE);
  return moat_error_set(err, e > 0 ? e : EIO, "%s", text ? text : strerror(e));
}

static int unexpected(const struct moat_msg *m, const char *what, moat_error **err) {
  if (m->type == MOAT_REP_ERROR)
    return guest_error(m, err);
  return moat_error_set(err, EPROTO, "guest protocol: unexpected frame type %u %s", m->type, what);
}

/* Receives one frame; EOF is an error here. */
static int recv_frame(struct gconn *g, struct moat_msg *m, moat_error **err) {
  int r = gc_recv(g, m, -1, err);
  if (r == 0)
    return moat_error_set(err, EPIPE, "sandbox guest closed the connection");
  return r < 0 ? -1 : 0;
}

static int simple_request(const struct moat_guest_ep *ep, struct moat_msg *req, moat_error **err) {
  struct gconn g;
  if (gc_open(&g, ep, err) < 0)
    return -1;
  int ret = gc_send(&g, req, "a request", err);
  struct moat_msg rep;
  moat_msg_init(&rep, 0);
  if (ret == 0)
    ret = recv_frame(&g, &rep, err);
  if (ret == 0 && rep.type != MOAT_REP_OK)
    ret = unexpected(&rep, "instead of ok", err);
  moat_msg_free(&rep);
  gc_close(&g);
  return ret;
}

static void put_user(struct moat_msg *m, const char *user) {
  if (user && *user)
    moat_msg_put_str(m, MOAT_T_USER, user);
}

void moat_exec_result_free(struct moat_exec_result *r) {
  free(r->out);
  free(r->err);
  memset(r, 0, sizeof(*r));
}

struct stdin_feed {
  struct gconn *g;
  pthread_mutex_t *lock;
  const char *data;
  size_t len;
};

static void *feed_stdin(void *arg) {
  struct stdin_feed *f = arg;
  for (size_t off = 0; off < f->len;) {
    size_t n = f->len - off > MOAT_PROTO_CHUNK ? MOAT_PROTO_CHUNK : f->len - off;
    pthread_mutex_lock(f->lock);
    int r = moat_msg_send_data_wait(f->g->fd, MOAT_MSG_DATA, f->data + off, n, gc_send_wait, f->g);
    pthread_mutex_unlock(f->lock);
    if (r < 0)
      return NULL; /* the command exited without reading all of it, or the guest is gone */
    off += n;
  }
  pthread_mutex_lock(f->lock);
  struct moat_msg end;
  moat_msg_init(&end, MOAT_MSG_END);
  moat_msg_send_wait(f->g->fd, &end, gc_send_wait, f->g);
  pthread_mutex_unlock(f->lock);
  return NULL;
}

struct moat_proc_stream {
  struct gconn g;
  struct moat_msg m;
  pthread_mutex_t send_lock; /* input, resize and the stdin feeder send whole frames */
  bool feeding, ended;
  pthread_t feeder;
  struct stdin_feed feed;
};

/* Takes over g's connection. */
static struct moat_proc_stream *stream_new(struct gconn *g) {
  struct moat_proc_stream *s = xcalloc(1, sizeof(*s));
  s->g = *g;
  g->fd = -1;
  moat_msg_init(&s->m, 0);
  pthread_mutex_init(&s->send_lock, NULL);
  return s;
}

void moat_proc_stream_close(struct moat_proc_stream *s) {
  if (!s)
    return;
  if (s->feeding) {
    shutdown(s->g.fd, SHUT_RDWR); /* unblocks a feeder stuck on a dead guest */
    pthread_join(s->feeder, NULL);
  }
  gc_close(&s->g);
  moat_msg_free(&s->m);
  pthread_mutex_destroy(&s->send_lock);
  free(s);
}

int moat_proc_stream_fd(const struct moat_proc_stream *s) { return s->g.fd; }

static void put_target(struct moat_msg *m, int pid, const char *tag) {
  if (tag && *tag)
    moat_msg_put_str(m, MOAT_T_TAG, tag);
  else
    moat_msg_put_i32(m, MOAT_T_PID, pid);
}

static int check_target(int pid, const char *tag, moat_error **err) {
  if ((!tag || !*tag) && pid <= 0)
    return moat_error_set(err, EINVAL, "a pid (> 0) or a tag is required");
  return 0;
}

int moat_guest_exec_start(const struct moat_guest_ep *ep, const struct moat_exec_req *req,
                          const struct moat_exec_opts *opts, struct moat_proc_stream **out, int *pid,
                          moat_error **err) {
  static const struct moat_exec_opts none = {0};
  if (!opts)
    opts = &none;
  if (out)
    *out = NULL;
  if (pid)
    *pid = 0;
  if (!req->argv || !req->argv[0])
    return moat_error_set(err, EINVAL, "exec: empty argv");
  if ((opts->pty_cols == 0) != (opts->pty_rows == 0))
    return moat_error_set(err, EINVAL, "exec: a pty needs both columns and rows");
  struct gconn g;
  if (gc_open(&g, ep, err) < 0)
    return -1;
  struct moat_msg m;
  moat_msg_init(&m, MOAT_REQ_EXEC);
  for (size_t i = 0; req->argv[i]; i++)
    moat_msg_put_str(&m, MOAT_T_ARGV, req->argv[i]);
  for (size_t i = 0; req->env && req->env[i]; i++)
    moat_msg_put_str(&m, MOAT_T_ENV, req->env[i]);
  if (req->cwd)
    moat_msg_put_str(&m, MOAT_T_CWD, req->cwd);
  put_user(&m, req->user);
  if (req->timeout_ms)
    moat_msg_put_u32(&m, MOAT_T_TIMEOUT_MS, req->timeout_ms);
  moat_msg_put_u64(&m, MOAT_T_MAX_OUTPUT, req->max_output ? req->max_output : DEFAULT_MAX_OUTPUT);
  bool has_stdin = req->stdin_data && req->stdin_len > 0;
  if (has_stdin && !opts->background)
    moat_msg_put_u32(&m, MOAT_T_STDIN_STREAM, 1);
  if (opts->background)
    moat_msg_put_u32(&m, MOAT_T_BACKGROUND, 1);
  if (opts->tag)
    moat_msg_put_str(&m, MOAT_T_TAG, opts->tag);
  if (opts->pty_cols) {
    moat_msg_put_u32(&m, MOAT_T_PTY_COLS, opts->pty_cols);
    moat_msg_put_u32(&m, MOAT_T_PTY_ROWS, opts->pty_rows);
  }
  if (opts->keep_on_disconnect)
    moat_msg_put_u32(&m, MOAT_T_KILL_ON_DISCONNECT, 0);
  int ret = -1;
  if (gc_send(&g, &m, "an exec request", err) < 0 || recv_frame(&g, &m, err) < 0)
    goto done;
  if (m.type != MOAT_REP_STARTED) {
    unexpected(&m, "to exec", err);
    goto done;
  }
  int32_t p = 0;
  moat_msg_get_i32(&m, MOAT_T_PID, &p);
  if (pid)
    *pid = p;
  if (opts->background) {
    ret = has_stdin ? moat_guest_proc_stdin(ep, p, NULL, req->stdin_data, req->stdin_len, true, err) : 0;
    goto done;
  }
  struct moat_proc_stream *s = stream_new(&g);
  if (has_stdin) {
    /* stdin is fed by a thread while the caller drains output: a command that writes a lot before
     * reading its input cannot deadlock the two directions. */
    s->feed = (struct stdin_feed){
        .g = &s->g, .lock = &s->send_lock, .data = req->stdin_data, .len = req->stdin_len};
    s->feeding = pthread_create(&s->feeder, NULL, feed_stdin, &s->feed) == 0;
    if (!s->feeding) {
      moat_proc_stream_close(s);
      moat_error_set(err, EAGAIN, "exec: cannot start the stdin feeder");
      goto done;
    }
  }
  if (out)
    *out = s;
  else
    moat_proc_stream_close(s);
  ret = 0;
done:
  moat_msg_free(&m);
  gc_close(&g);
  return ret;
}

void moat_proc_info_clear(struct moat_proc_info *p) {
  free(p->tag);
  strv_free(p->argv);
  memset(p, 0, sizeof(*p));
}

void moat_proc_infos_free(struct moat_proc_info *v, size_t n) {
  for (size_t i = 0; i < n; i++)
    moat_proc_info_clear(&v[i]);
  free(v);
}

static int parse_proc(const struct moat_msg *m, struct moat_proc_info *p, moat_error **err) {
  memset(p, 0, sizeof(*p));
  int32_t pid = 0, code = 0, sig = 0;
  uint32_t running = 0, pty = 0, bg = 0;
  if (moat_msg_get_i32(m, MOAT_T_PID, &pid) < 0)
    return moat_error_set(err, EPROTO, "guest protocol: process without a pid");
  p->argv = moat_msg_get_strv(m, MOAT_T_ARGV);
  if (!p->argv)
    return moat_error_set(err, EPROTO, "guest protocol: bad argv in a process entry");
  p->pid = pid;
  p->tag = moat_msg_get_str(m, MOAT_T_TAG);
  moat_msg_get_i64(m, MOAT_T_STARTED_AT, &p->started_at_ms);
  moat_msg_get_u32(m, MOAT_T_RUNNING, &running);
  moat_msg_get_u32(m, MOAT_T_PTY, &pty);
  moat_msg_get_u32(m, MOAT_T_BACKGROUND, &bg);
  moat_msg_get_i32(m, MOAT_T_EXIT_CODE, &code);
  moat_msg_get_i32(m, MOAT_T_SIGNAL, &sig);
  p->running = running != 0;
  p->pty = pty != 0;
  p->background = bg != 0;
  p->exit_code = code;
  p->signal = sig;
  return 0;
}

int moat_guest_attach(const struct moat_guest_ep *ep, int pid, const char *tag, bool replay,
                      struct moat_proc_stream **out, struct moat_proc_info *info, moat_error **err) {
  *out = NULL;
  if (info)
    memset(info, 0, sizeof(*info));
  if (check_target(pid, tag, err) < 0)
    return -1;
  struct gconn g;
  if (gc_open(&g, ep, err) < 0)
    return -1;
  struct moat_msg m;
  moat_msg_init(&m, MOAT_REQ_ATTACH);
  put_target(&m, pid, tag);
  moat_msg_put_u32(&m, MOAT_T_REPLAY, replay ? 1 : 0);
  int ret = -1;
  if (gc_send(&g, &m, "attach", err) == 0 && recv_frame(&g, &m, err) == 0) {
    if (m.type != MOAT_REP_PROC) {
      unexpected(&m, "to attach", err);
    } else if (!info || parse_proc(&m, info, err) == 0) {
      *out = stream_new(&g);
      ret = 0;
    }
  }
  moat_msg_free(&m);
  gc_close(&g);
  return ret;
}

int moat_proc_stream_next(struct moat_proc_stream *s, struct moat_proc_event *ev, int timeout_ms,
                          moat_error **err) {
  memset(ev, 0, sizeof(*ev));
  for (;;) {
    if (s->ended)
      return 0;
    moat_error *e = NULL;
    int r = gc_recv(&s->g, &s->m, timeout_ms, &e);
    if (r < 0) {
      if (e->status != ETIMEDOUT)
        s->ended = true;
      return pass_error(err, e);
    }
    if (r == 0) {
      s->ended = true;
      return 0;
    }
    struct moat_field f;
    switch (s->m.type) {
    case MOAT_REP_STARTED:
    case MOAT_REP_PROC:
      continue; /* consumed at start; never expected again */
    case MOAT_REP_STDOUT:
    case MOAT_REP_STDERR:
      ev->type = s->m.type == MOAT_REP_STDOUT ? MOAT_PROC_STDOUT : MOAT_PROC_STDERR;
      if (moat_msg_find(&s->m, MOAT_T_DATA, &f)) {
        ev->data = (const char *)f.data;
        ev->len = f.len;
      } else {
        ev->data = "";
      }
      return 1;
    case MOAT_REP_DROPPED:
      ev->type = MOAT_PROC_DROPPED;
      moat_msg_get_u64(&s->m, MOAT_T_SIZE, &ev->dropped);
      return 1;
    case MOAT_REP_EXIT: {
      int32_t code = -1, sig = 0;
      uint32_t to = 0;
      moat_msg_get_i32(&s->m, MOAT_T_EXIT_CODE, &code);
      moat_msg_get_i32(&s->m, MOAT_T_SIGNAL, &sig);
      moat_msg_get_u32(&s->m, MOAT_T_TIMED_OUT, &to);
      ev->type = MOAT_PROC_EXIT;
      ev->exit_code = code;
      ev->signal = sig;
      ev->timed_out = to != 0;
      s->ended = true;
      return 1;
    }
    default:
      s->ended = true;
      return unexpected(&s->m, "on a process stream", err);
    }
  }
}

static int stream_send(struct moat_proc_stream *s, const struct moat_msg *m, moat_error **err) {
  pthread_mutex_lock(&s->send_lock);
  int r = gc_send(&s->g, m, "to the process stream", err);
  pthread_mutex_unlock(&s->send_lock);
  return r;
}

int moat_proc_stream_input(struct moat_proc_stream *s, const void *data, size_t len, moat_error **err) {
  const char *p = data;
  while (len > 0) {
    size_t n = len > MOAT_PROTO_CHUNK ? MOAT_PROTO_CHUNK : len;
    pthread_mutex_lock(&s->send_lock);
    int r = gc_send_data(&s->g, MOAT_MSG_DATA, p, n, err);
    pthread_mutex_unlock(&s->send_lock);
    if (r < 0)
      return -1;
    p += n;
    len -= n;
  }
  return 0;
}

int moat_proc_stream_close_input(struct moat_proc_stream *s, moat_error **err) {
  struct moat_msg m;
  moat_msg_init(&m, MOAT_MSG_END);
  return stream_send(s, &m, err);
}

int moat_proc_stream_resize(struct moat_proc_stream *s, uint32_t cols, uint32_t rows, moat_error **err) {
  if (cols < 1 || cols > 1000 || rows < 1 || rows > 1000)
    return moat_error_set(err, EINVAL, "pty size %ux%u out of 1..1000", cols, rows);
  struct moat_msg m;
  moat_msg_init(&m, MOAT_REQ_RESIZE);
  moat_msg_put_u32(&m, MOAT_T_PTY_COLS, cols);
  moat_msg_put_u32(&m, MOAT_T_PTY_ROWS, rows);
  int r = stream_send(s, &m, err);
  moat_msg_free(&m);
  return r;
}

int moat_guest_proc_stdin(const struct moat_guest_ep *ep, int pid, const char *tag, const void *data,
                          size_t len, bool close_stdin, moat_error **err) {
  if (check_target(pid, tag, err) < 0)
    return -1;
  const char *p = data;
  do { /* frames of at most one chunk; CLOSE rides on the last */
    size_t n = len > MOAT_PROTO_CHUNK ? MOAT_PROTO_CHUNK : len;
    struct moat_msg m;
    moat_msg_init(&m, MOAT_REQ_STDIN);
    put_target(&m, pid, tag);
    if (n)
      moat_msg_put(&m, MOAT_T_DATA, p, n);
    if (close_stdin && n == len)
      moat_msg_put_u32(&m, MOAT_T_CLOSE, 1);
    int r = simple_request(ep, &m, err);
    moat_msg_free(&m);
    if (r < 0)
      return -1;
    p += n;
    len -= n;
  } while (len > 0);
  return 0;
}

int moat_guest_proc_signal(const struct moat_guest_ep *ep, int pid, const char *tag, int signal,
                           moat_error **err) {
  if (check_target(pid, tag, err) < 0)
    return -1;
  struct moat_msg m;
  moat_msg_init(&m, MOAT_REQ_SIGNAL);
  put_target(&m, pid, tag);
  moat_msg_put_i32(&m, MOAT_T_SIGNAL, signal);
  int r = simple_request(ep, &m, err);
  moat_msg_free(&m);
  return r;
}

int moat_guest_proc_resize(const struct moat_guest_ep *ep, int pid, const char *tag, uint32_t cols,
                           uint32_t rows, moat_error **err) {
  if (check_target(pid, tag, err) < 0)
    return -1;
  struct moat_msg m;
  moat_msg_init(&m, MOAT_REQ_RESIZE);
  put_target(&m, pid, tag);
  moat_msg_put_u32(&m, MOAT_T_PTY_COLS, cols);
  moat_msg_put_u32(&m, MOAT_T_PTY_ROWS, rows);
  int r = simple_request(ep, &m, err);
  moat_msg_free(&m);
  return r;
}

/* Sends req on a new connection and collects the item_type frames that answer it, up to END,
 * into a growing array of item_size elements filled by parse. On error the parsed elements are
 * released with free_items and *n is 0. */
static int collect_list(const struct moat_guest_ep *ep, struct moat_msg *req, uint8_t item_type,
                        const char *what, size_t item_size,
                        int (*parse)(const struct moat_msg *, void *, moat_error **),
                        void (*free_items)(void *, size_t), void **out, size_t *n, moat_error **err) {
  *out = NULL;
  *n = 0;
  struct gconn g;
  if (gc_open(&g, ep, err) < 0)
    return -1;
  int ret = -1;
  size_t cap = 0;
  char *v = NULL;
  if (gc_send(&g, req, what, err) < 0)
    goto out;
  for (;;) {
    if (recv_frame(&g, req, err) < 0)
      goto out;
    if (req->type == MOAT_MSG_END)
      break;
    if (req->type != item_type) {
      char where[64];
      snprintf(where, sizeof(where), "in a %s", what);
      unexpected(req, where, err);
      goto out;
    }
    if (*n == cap) {
      cap = cap ? cap * 2 : 32;
      v = xrealloc(v, cap * item_size);
    }
    if (parse(req, v + *n * item_size, err) < 0)
      goto out;
    (*n)++;
  }
  *out = steal_pointer(&v);
  ret = 0;
out:
  if (ret < 0) {
    free_items(v, *n);
    *n = 0;
  }
  gc_close(&g);
  return ret;
}

static int parse_proc_any(const struct moat_msg *m, void *item, moat_error **err) {
  return parse_proc(m, item, err);
}
static void free_procs_any(void *v, size_t n) { moat_proc_infos_free(v, n); }

int moat_guest_procs(const struct moat_guest_ep *ep, struct moat_proc_info **out, size_t *n,
                     moat_error **err) {
  struct moat_msg m;
  moat_msg_init(&m, MOAT_REQ_PROCS);
  void *v;
  int ret = collect_list(ep, &m, MOAT_REP_PROC, "process list", sizeof(struct moat_proc_info), parse_proc_any,
                         free_procs_any, &v, n, err);
  *out = v;
  moat_msg_free(&m);
  return ret;
}

struct moat_watch {
  struct gconn g;
  struct moat_msg m;
  char *event, *path, *path2;
};

int moat_guest_watch(const struct moat_guest_ep *ep, const char *path, const char *user, bool recursive,
                     struct moat_watch **out, moat_error **err) {
  *out = NULL;
  struct gconn g;
  if (gc_open(&g, ep, err) < 0)
    return -1;
  struct moat_msg m;
  moat_msg_init(&m, MOAT_REQ_WATCH);
  moat_msg_put_str(&m, MOAT_T_PATH, path);
  put_user(&m, user);
  moat_msg_put_u32(&m, MOAT_T_RECURSIVE, recursive ? 1 : 0);
  int ret = -1;
  if (gc_send(&g, &m, "watch", err) == 0 && recv_frame(&g, &m, err) == 0) {
    if (m.type != MOAT_REP_OK) {
      unexpected(&m, "to watch", err);
    } else {
      struct moat_watch *w = xcalloc(1, sizeof(*w));
      w->g = g;
      g.fd = -1;
      moat_msg_init(&w->m, 0);
      *out = w;
      ret = 0;
    }
  }
  moat_msg_free(&m);
  gc_close(&g);
  return ret;
}

int moat_watch_next(struct moat_watch *w, struct moat_watch_event *ev, int timeout_ms, moat_error **err) {
  memset(ev, 0, sizeof(*ev));
  int r = gc_recv(&w->g, &w->m, timeout_ms, err);
  if (r <= 0)
    return r;
  if (w->m.type != MOAT_REP_EVENT)
    return unexpected(&w->m, "on a watch", err);
  free(w->event);
  free(w->path);
  free(w->path2);
  w->event = moat_msg_get_str(&w->m, MOAT_T_EVENT);
  w->path = moat_msg_get_str(&w->m, MOAT_T_PATH);
  w->path2 = moat_msg_get_str(&w->m, MOAT_T_PATH2);
  if (!w->event || !w->path)
    return moat_error_set(err, EPROTO, "guest protocol: event without a name or path");
  ev->event = w->event;
  ev->path = w->path;
  ev->path2 = w->path2;
  return 1;
}

int moat_watch_fd(const struct moat_watch *w) { return w->g.fd; }

void moat_watch_close(struct moat_watch *w) {
  if (!w)
    return;
  gc_close(&w->g);
  moat_msg_free(&w->m);
  free(w->event);
  free(w->path);
  free(w->path2);
  free(w);
}

struct moat_guest_log {
  struct gconn g;
  struct moat_msg m;
  struct moat_proc_info info;
  char *tag;
};

int moat_guest_log_open(const struct moat_guest_ep *ep, struct moat_guest_log **out, moat_error **err) {
  *out = NULL;
  struct gconn g;
  if (gc_open(&g, ep, err) < 0)
    return -1;
  struct moat_msg m;
  moat_msg_init(&m, MOAT_REQ_LOGS);
  int ret = -1;
  if (gc_send(&g, &m, "logs", err) == 0 && recv_frame(&g, &m, err) == 0) {
    if (m.type != MOAT_REP_OK) {
      unexpected(&m, "to logs", err);
    } else {
      struct moat_guest_log *l = xcalloc(1, sizeof(*l));
      l->g = g;
      g.fd = -1;
      moat_msg_init(&l->m, 0);
      *out = l;
      ret = 0;
    }
  }
  moat_msg_free(&m);
  gc_close(&g);
  return ret;
}

int moat_guest_log_next(struct moat_guest_log *l, struct moat_guest_log_rec *rec, int timeout_ms,
                        moat_error **err) {
  memset(rec, 0, sizeof(*rec));
  int r = gc_recv(&l->g, &l->m, timeout_ms, err);
  if (r <= 0)
    return r;
  const struct moat_msg *m = &l->m;
  int32_t pid = 0;
  if (m->type != MOAT_REP_PROC && moat_msg_get_i32(m, MOAT_T_PID, &pid) < 0)
    return moat_error_set(err, EPROTO, "guest protocol: log record without a pid");
  rec->pid = pid;
  uint32_t u = 0;
  switch (m->type) {
  case MOAT_REP_PROC:
    moat_proc_info_clear(&l->info);
    if (parse_proc(m, &l->info, err) < 0)
      return -1;
    rec->kind = MOAT_GLOG_START;
    rec->pid = l->info.pid;
    rec->tag = l->info.tag;
    rec->argv = l->info.argv;
    rec->pty = l->info.pty;
    rec->background = l->info.background;
    rec->started_at_ms = l->info.started_at_ms;
    return 1;
  case MOAT_REP_STDOUT: {
    struct moat_field f;
    if (!moat_msg_find(m, MOAT_T_DATA, &f))
      return moat_error_set(err, EPROTO, "guest protocol: log output without data");
    free(l->tag);
    l->tag = moat_msg_get_str(m, MOAT_T_TAG);
    rec->kind = MOAT_GLOG_OUTPUT;
    rec->tag = l->tag;
    moat_msg_get_u32(m, MOAT_T_PTY, &u);
    rec->pty = u != 0;
    u = 0;
    moat_msg_get_u32(m, MOAT_T_STREAM, &u);
    rec->stream = u ? 1 : 0;
    rec->data = f.data;
    rec->len = f.len;
    return 1;
  }
  case MOAT_REP_DROPPED:
    rec->kind = MOAT_GLOG_DROPPED;
    moat_msg_get_u32(m, MOAT_T_STREAM, &u);
    rec->stream = u ? 1 : 0;
    moat_msg_get_u64(m, MOAT_T_SIZE, &rec->size);
    return 1;
  case MOAT_REP_EXIT: {
    int32_t code = 0, sig = 0;
    moat_msg_get_i32(m, MOAT_T_EXIT_CODE, &code);
    moat_msg_get_i32(m, MOAT_T_SIGNAL, &sig);
    rec->kind = MOAT_GLOG_EXIT;
    rec->exit_code = code;
    rec->signal = sig;
    return 1;
  }
  default:
    return unexpected(m, "on the log", err);
  }
}

int moat_guest_log_fd(const struct moat_guest_log *l) { return l->g.fd; }

void moat_guest_log_close(struct moat_guest_log *l) {
  if (!l)
    return;
  gc_close(&l->g);
  moat_msg_free(&l->m);
  moat_proc_info_clear(&l->info);
  free(l->tag);
  free(l);
}

int moat_guest_exec(const struct moat_guest_ep *ep, const struct moat_exec_req *req,
                    struct moat_exec_result *res, moat_error **err) {
  memset(res, 0, sizeof(*res));
  struct moat_proc_stream *s = NULL;
  int pid = 0;
  if (moat_guest_exec_start(ep, req, NULL, &s, &pid, err) < 0)
    return -1;
  res->pid = pid;
  struct moat_buf out = {0}, errb = {0};
  int ret = -1;
  for (;;) {
    struct moat_proc_event ev;
    int r = moat_proc_stream_next(s, &ev, -1, err);
    if (r < 0)
      break;
    if (r == 0) {
      moat_error_set(err, EPIPE, "sandbox guest closed the connection");
      break;
    }
    if (ev.type == MOAT_PROC_STDOUT || ev.type == MOAT_PROC_STDERR) {
      moat_buf_append(ev.type == MOAT_PROC_STDOUT ? &out : &errb, ev.data, ev.len);
    } else if (ev.type == MOAT_PROC_EXIT) {
      uint32_t t1 = 0, t2 = 0;
      uint64_t dur = 0;
      moat_msg_get_u32(&s->m, MOAT_T_STDOUT_TRUNC, &t1);
      moat_msg_get_u32(&s->m, MOAT_T_STDERR_TRUNC, &t2);
      moat_msg_get_u64(&s->m, MOAT_T_DURATION_MS, &dur);
      res->exit_code = ev.exit_code;
      res->signal = ev.signal;
      res->timed_out = ev.timed_out;
      res->stdout_truncated = t1 != 0;
      res->stderr_truncated = t2 != 0;
      res->duration_ms = dur;
      ret = 0;
      break;
    }
  }
  moat_proc_stream_close(s);
  if (ret < 0) {
    free(out.p);
    free(errb.p);
    return -1;
  }
  res->out = out.p ? out.p : xstrdup("");
  res->out_len = out.len;
  res->err = errb.p ? errb.p : xstrdup("");
  res->err_len = errb.len;
  return 0;
}

int moat_guest_check(const struct moat_guest_ep *ep, int timeout_ms, moat_error **err) {
  struct gconn g;
  if (gc_open(&g, ep, err) < 0)
    return ep_frozen(ep) ? 0 : -1;
  struct moat_msg m;
  moat_msg_init(&m, MOAT_REQ_PROCS);
  int ret = gc_send(&g, &m, "a check", err);
  if (ret == 0) {
    int r = gc_recv(&g, &m, timeout_ms, err);
    if (r <= 0 && !ep_frozen(ep))
      ret = r == 0 ? moat_error_set(err, EPIPE, "sandbox guest closed the connection") : -1;
  }
  moat_msg_free(&m);
  gc_close(&g);
  return ret;
}

int moat_guest_renew(const struct moat_guest_ep *ep, moat_error **err) {
  struct moat_msg m;
  moat_msg_init(&m, MOAT_REQ_RENEW);
  int r = simple_request(ep, &m, err);
  moat_msg_free(&m);
  return r < 0 ? moat_error_wrap(err, "renew the restored guest") : 0;
}

int moat_guest_set_defaults(const struct moat_guest_ep *ep, const char *user, const char *cwd,
                            moat_error **err) {
  struct moat_msg m;
  moat_msg_init(&m, MOAT_REQ_DEFAULTS);
  if (user)
    moat_msg_put_str(&m, MOAT_T_USER, user);
  if (cwd)
    moat_msg_put_str(&m, MOAT_T_CWD, cwd);
  int r = simple_request(ep, &m, err);
  moat_msg_free(&m);
  return r < 0 ? moat_error_wrap(err, "set the guest's exec defaults") : 0;
}

int moat_guest_ping(const struct moat_guest_ep *ep, int timeout_ms, moat_error **err) {
  struct gconn g;
  if (gc_open(&g, ep, err) < 0)
    return -1;
  struct moat_msg m;
  moat_msg_init(&m, MOAT_REQ_PING);
  int ret = gc_send(&g, &m, "ping", err);
  if (ret == 0) {
    int r = gc_recv(&g, &m, timeout_ms, err);
    if (r == 0)
      ret = moat_error_set(err, EPIPE, "sandbox guest closed the connection");
    else if (r < 0)
      ret = -1;
    else if (m.type != MOAT_REP_OK)
      ret = unexpected(&m, "to ping", err);
  }
  moat_msg_free(&m);
  gc_close(&g);
  return ret;
}

void moat_file_entry_clear(struct moat_file_entry *e) {
  free(e->path);
  free(e->name);
  free(e->link_target);
  memset(e, 0, sizeof(*e));
}

void moat_file_entries_free(struct moat_file_entry *v, size_t n) {
  for (size_t i = 0; i < n; i++)
    moat_file_entry_clear(&v[i]);
  free(v);
}

static int parse_entry(const struct moat_msg *m, struct moat_file_entry *e, moat_error **err) {
  memset(e, 0, sizeof(*e));
  uint32_t type = 'o';
  e->path = moat_msg_get_str(m, MOAT_T_PATH);
  e->name = moat_msg_get_str(m, MOAT_T_NAME);
  if (!e->path || !e->name) {
    moat_file_entry_clear(e);
    return moat_error_set(err, EPROTO, "guest protocol: entry without path or name");
  }
  moat_msg_get_u32(m, MOAT_T_TYPE, &type);
  e->type = (char)type;
  moat_msg_get_u64(m, MOAT_T_SIZE, &e->size);
  moat_msg_get_u32(m, MOAT_T_MODE, &e->mode);
  moat_msg_get_i64(m, MOAT_T_MTIME, &e->mtime_ms);
  moat_msg_get_u32(m, MOAT_T_UID, &e->uid);
  moat_msg_get_u32(m, MOAT_T_GID, &e->gid);
  e->link_target = moat_msg_get_str(m, MOAT_T_LINK);
  return 0;
}

int moat_guest_stat(const struct moat_guest_ep *ep, const char *path, const char *user,
                    struct moat_file_entry *out, moat_error **err) {
  struct gconn g;
  if (gc_open(&g, ep, err) < 0)
    return -1;
  struct moat_msg m;
  moat_msg_init(&m, MOAT_REQ_STAT);
  moat_msg_put_str(&m, MOAT_T_PATH, path);
  put_user(&m, user);
  int ret = -1;
  if (gc_send(&g, &m, "stat", err) == 0 && recv_frame(&g, &m, err) == 0)
    ret = m.type == MOAT_REP_ENTRY ? parse_entry(&m, out, err) : unexpected(&m, "to stat", err);
  moat_msg_free(&m);
  gc_close(&g);
  return ret;
}

static int parse_entry_any(const struct moat_msg *m, void *item, moat_error **err) {
  return parse_entry(m, item, err);
}
static void free_entries_any(void *v, size_t n) { moat_file_entries_free(v, n); }

int moat_guest_list(const struct moat_guest_ep *ep, const char *path, const char *user, uint32_t depth,
                    struct moat_file_entry **out, size_t *n, moat_error **err) {
  struct moat_msg m;
  moat_msg_init(&m, MOAT_REQ_LIST);
  moat_msg_put_str(&m, MOAT_T_PATH, path);
  put_user(&m, user);
  moat_msg_put_u32(&m, MOAT_T_DEPTH, depth ? depth : 1);
  void *v;
  int ret = collect_list(ep, &m, MOAT_REP_ENTRY, "listing", sizeof(struct moat_file_entry), parse_entry_any,
                         free_entries_any, &v, n, err);
  *out = v;
  moat_msg_free(&m);
  return ret;
}

int moat_guest_mkdir(const struct moat_guest_ep *ep, const char *path, const char *user, bool parents,
                     moat_error **err) {
  struct moat_msg m;
  moat_msg_init(&m, MOAT_REQ_MKDIR);
  moat_msg_put_str(&m, MOAT_T_PATH, path);
  put_user(&m, user);
  moat_msg_put_u32(&m, MOAT_T_PARENTS, parents ? 1 : 0);
  int r = simple_request(ep, &m, err);
  moat_msg_free(&m);
  return r;
}

int moat_guest_move(const struct moat_guest_ep *ep, const char *src, const char *dst, const char *user,
                    moat_error **err) {
  struct moat_msg m;
  moat_msg_init(&m, MOAT_REQ_MOVE);
  moat_msg_put_str(&m, MOAT_T_PATH, src);
  moat_msg_put_str(&m, MOAT_T_PATH2, dst);
  put_user(&m, user);
  int r = simple_request(ep, &m, err);
  moat_msg_free(&m);
  return r;
}

int moat_guest_remove(const struct moat_guest_ep *ep, const char *path, const char *user, bool recursive,
                      moat_error **err) {
  struct moat_msg m;
  moat_msg_init(&m, MOAT_REQ_REMOVE);
  moat_msg_put_str(&m, MOAT_T_PATH, path);
  put_user(&m, user);
  moat_msg_put_u32(&m, MOAT_T_RECURSIVE, recursive ? 1 : 0);
  int r = simple_request(ep, &m, err);
  moat_msg_free(&m);
  return r;
}

struct moat_guest_reader {
  struct gconn g;
  struct moat_msg m;
  size_t off; /* consumed bytes of the current DATA field */
  bool ended;
};

int moat_guest_read_open(const struct moat_guest_ep *ep, const char *path, const char *user,
                         struct moat_guest_reader **out, uint64_t *size, moat_error **err) {
  struct gconn g;
  if (gc_open(&g, ep, err) < 0)
    return -1;
  struct moat_msg m;
  moat_msg_init(&m, MOAT_REQ_READ);
  moat_msg_put_str(&m, MOAT_T_PATH, path);
  put_user(&m, user);
  int ret = -1;
  if (gc_send(&g, &m, "read", err) == 0 && recv_frame(&g, &m, err) == 0) {
    if (m.type != MOAT_REP_OK) {
      unexpected(&m, "to read", err);
    } else {
      uint64_t sz = 0;
      moat_msg_get_u64(&m, MOAT_T_SIZE, &sz);
      if (size)
        *size = sz;
      struct moat_guest_reader *r = xcalloc(1, sizeof(*r));
      r->g = g;
      g.fd = -1;
      moat_msg_init(&r->m, 0);
      *out = r;
      ret = 0;
    }
  }
  moat_msg_free(&m);
  gc_close(&g);
  return ret;
}

ssize_t moat_guest_read_chunk(struct moat_guest_reader *r, void *buf, size_t cap, moat_error **err) {
  for (;;) {
    if (r->ended)
      return 0;
    struct moat_field f;
    if (r->m.type == MOAT_MSG_DATA && moat_msg_find(&r->m, MOAT_T_DATA, &f) && r->off < f.len) {
      size_t n = f.len - r->off;
      if (n > cap)
        n = cap;
      memcpy(buf, f.data + r->off, n);
      r->off += n;
      return (ssize_t)n;
    }
    if (recv_frame(&r->g, &r->m, err) < 0)
      return -1;
    r->off = 0;
    if (r->m.type == MOAT_MSG_END)
      r->ended = true;
    else if (r->m.type != MOAT_MSG_DATA)
      return unexpected(&r->m, "while reading a file", err);
  }
}

void moat_guest_reader_close(struct moat_guest_reader *r) {
  if (!r)
    return;
  gc_close(&r->g);
  moat_msg_free(&r->m);
  free(r);
}

struct moat_guest_writer {
  struct gconn g;
  uint64_t sent;
};

int moat_guest_write_open(const struct moat_guest_ep *ep, const char *path, const char *user, uint32_t mode,
                          struct moat_guest_writer **out, moat_error **err) {
  struct gconn g;
  if (gc_open(&g, ep, err) < 0)
    return -1;
  struct moat_msg m;
  moat_msg_init(&m, MOAT_REQ_WRITE);
  moat_msg_put_str(&m, MOAT_T_PATH, path);
  put_user(&m, user);
  if (mode)
    moat_msg_put_u32(&m, MOAT_T_MODE, mode);
  int ret = -1;
  if (gc_send(&g, &m, "write", err) == 0 && recv_frame(&g, &m, err) == 0) {
    if (m.type != MOAT_REP_OK) {
      unexpected(&m, "to write", err);
    } else {
      struct moat_guest_writer *w = xcalloc(1, sizeof(*w));
      w->g = g;
      g.fd = -1;
      *out = w;
      ret = 0;
    }
  }
  moat_msg_free(&m);
  gc_close(&g);
  return ret;
}

/* If the guest gave up (ENOSPC, ...) it sent REP_ERROR and closed: fetch that reason. A guest
 * that stopped taking the data (EHOSTUNREACH from the send) is reported as such. */
static int writer_failure(struct moat_guest_writer *w, moat_error **err) {
  if (errno == EHOSTUNREACH)
    return moat_error_set(err, EHOSTUNREACH, "sandbox guest took no upload data for %u ms", w->g.timeout_ms);
  struct moat_msg m;
  moat_msg_init(&m, 0);
  moat_error *e = NULL;
  int r = gc_recv(&w->g, &m, 1000, &e);
  moat_error_free(&e);
  if (r > 0 && m.type == MOAT_REP_ERROR)
    guest_error(&m, err);
  else
    moat_error_set(err, EPIPE, "sandbox guest stopped accepting the upload");
  moat_msg_free(&m);
  return -1;
}

int moat_guest_write_chunk(struct moat_guest_writer *w, const void *buf, size_t len, moat_error **err) {
  const char *p = buf;
  while (len > 0) {
    size_t n = len > MOAT_PROTO_CHUNK ? MOAT_PROTO_CHUNK : len;
    if (moat_msg_send_data_wait(w->g.fd, MOAT_MSG_DATA, p, n, gc_send_wait, &w->g) < 0)
      return writer_failure(w, err);
    /* An early REP_ERROR (disk full) is waiting to be read: stop sending. */
    struct pollfd pf = {.fd = w->g.fd, .events = POLLIN};
    if (poll(&pf, 1, 0) > 0)
      return writer_failure(w, err);
    w->sent += n;
    p += n;
    len -= n;
  }
  return 0;
}

int moat_guest_write_finish(struct moat_guest_writer *w, uint64_t *written, moat_error **err) {
  struct moat_msg m;
  moat_msg_init(&m, MOAT_MSG_END);
  if (moat_msg_send_wait(w->g.fd, &m, gc_send_wait, &w->g) < 0)
    return writer_failure(w, err);
  int ret = recv_frame(&w->g, &m, err);
  if (ret == 0 && m.type != MOAT_REP_OK)
    ret = unexpected(&m, "to the end of an upload", err);
  if (ret == 0 && written) {
    uint64_t sz = w->sent;
    moat_msg_get_u64(&m, MOAT_T_SIZE, &sz);
    *written = sz;
  }
  moat_msg_free(&m);
  return ret;
}

void moat_guest_writer_close(struct moat_guest_writer *w) {
  if (!w)
    return;
  gc_close(&w->g);
  free(w);
}

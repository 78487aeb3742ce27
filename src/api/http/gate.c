/* gate.c -- moatd's front door: connection records, the framing tap on recv(2), header and idle deadlines
 *
 * Locking: g_lock guards the list of connections and the watchdog's configuration; each record's
 * own lock guards its fields. A record is registered before libmicrohttpd starts the connection's
 * thread and removed (NOTIFY_CLOSED) after that thread ended and before the socket is closed, so
 * a socket the watchdog shuts down under g_lock is always still open, and g_by_fd never names a
 * closed (possibly reused) descriptor number.
 */
#include "gate.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../../common/log.h"
#include "../../common/util.h"
#include "http.h"
#include "framing.h"

#define WATCH_PERIOD_MS 200
/* An org's idle connections beyond max_idle_per_org are closed once idle this long: a client
 * reusing a keep-alive connection as the server closes it loses its request (a POST is not sent
 * again), and common clients drop idle connections sooner themselves (undici, Node's fetch: 4 s). */
#define IDLE_EXCESS_GRACE_MS 5000
#define MAX_FDS (1u << 20)
#define DRAIN_S 2
#define DRAIN_MAX (64u << 20)

struct gate_conn {
  pthread_mutex_t lock;
  int fd;
  struct gate_conn *prev, *next;
  struct api_framing fr;
  uint64_t accept_ns, head_since_ns, idle_since_ns;
  uint64_t started;  /* requests handed to the application */
  uint64_t done;     /* requests ended */
  const void *org;   /* the org of the last request, or NULL */
  bool killed;       /* the gate closed it (or is closing it) */
  bool bad_pending;  /* a bad head waits behind requests not ended yet: answered when they have */
  bool released;     /* the socket belongs to other code now */
  unsigned answered; /* status the gate wrote itself */
  char why[192];
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cond = PTHREAD_COND_INITIALIZER;
static struct gate_conn *g_head;
static struct gate_conn **g_by_fd; /* by descriptor number, read with atomics by the tap */
static size_t g_nfd;
static struct api_gate_config g_cfg;
static unsigned g_users;
static bool g_stop;
static pthread_t g_thread;

/* ---- writing an answer ourselves ---- */

/* Writes a complete JSON error response on fd (best effort, without waiting). */
static void write_answer(int fd, unsigned status, const char *code, const char *msg) {
  json_t *j = api_error_json(code, msg);
  char *body = json_dumps(j, JSON_COMPACT);
  json_decref(j);
  if (!body)
    abort();
  const char *phrase = MHD_get_reason_phrase_for(status);
  char *resp = xasprintf("HTTP/1.1 %u %s\r\nConnection: close\r\nContent-Type: application/json\r\n"
                         "Content-Length: %zu\r\n\r\n%s\n",
                         status, phrase && *phrase ? phrase : "Error", strlen(body) + 1, body);
  free(body);
  ssize_t n = send(fd, resp, strlen(resp), MSG_DONTWAIT | MSG_NOSIGNAL);
  (void)n;
  free(resp);
}

/* After an answer: stop writing and read what the client still sends for a moment, so that the
 * close does not reset the connection before the client read the answer. Runs on the connection's
 * own thread. */
static void drain(int fd) {
  shutdown(fd, SHUT_WR);
  char buf[16384];
  size_t drained = 0;
  uint64_t deadline = now_ns() + DRAIN_S * 1000000000ULL;
  for (;;) {
    uint64_t now = now_ns();
    if (now >= deadline || drained > DRAIN_MAX)
      break;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, (int)((deadline - now) / 1000000) + 1) <= 0)
      break;
    ssize_t n = recvfrom(fd, buf, sizeof(buf), MSG_DONTWAIT, NULL, NULL);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
      break;
    if (n > 0)
      drained += (size_t)n;
  }
}

/* Answers 400 invalid_request with msg and closes the connection (on its own thread). */
static void answer_and_close(int fd, const char *msg) {
  write_answer(fd, 400, "invalid_request", msg);
  drain(fd);
  shutdown(fd, SHUT_RDWR);
}

/* ---- the tap ---- */

static struct gate_conn *by_fd(int fd) {
  if (fd < 0 || (size_t)fd >= __atomic_load_n(&g_nfd, __ATOMIC_ACQUIRE))
    return NULL;
  struct gate_conn **v = __atomic_load_n(&g_by_fd, __ATOMIC_ACQUIRE);
  return v ? __atomic_load_n(&v[fd], __ATOMIC_ACQUIRE) : NULL;
}

/* n bytes of a registered connection were read into buf: judge them. Returns n, or -1 with errno
 * ECONNRESET when libmicrohttpd is not to see them (the gate answered and closes the connection). */
static ssize_t tap(struct gate_conn *g, const char *buf, ssize_t n) {
  pthread_mutex_lock(&g->lock);
  if (g->killed) {
    pthread_mutex_unlock(&g->lock);
    errno = ECONNRESET;
    return -1;
  }
  if (g->bad_pending) { /* nothing after a bad head reaches libmicrohttpd */
    pthread_mutex_unlock(&g->lock);
    errno = EAGAIN;
    return -1;
  }
  if (g->released || g->fr.opaque) {
    pthread_mutex_unlock(&g->lock);
    return n;
  }
  bool was_in_head = g->fr.in_head;
  uint64_t heads = g->fr.heads;
  enum api_fr_result res = api_framing_feed(&g->fr, buf, (size_t)n);
  if (g->fr.in_head && g->fr.heads > 0 && (!was_in_head || g->fr.heads != heads))
    g->head_since_ns = now_ns();
  if (res == API_FR_OK) {
    pthread_mutex_unlock(&g->lock);
    return n;
  }
  char msg[256];
  if (res == API_FR_BAD_HEAD && g->done + 1 < g->fr.bad_head) {
    /* Requests before the bad one have not ended (pipelined): libmicrohttpd gets the bytes before
     * the bad head's last line end, so it never sees that head complete; the 400 goes out when the
     * requests before it have ended (api_gate_request_done). */
    g->bad_pending = true;
    size_t keep = g->fr.bad_at;
    pthread_mutex_unlock(&g->lock);
    if (keep == 0) {
      errno = EAGAIN;
      return -1;
    }
    return (ssize_t)keep;
  }
  g->killed = true;
  g->answered = 400;
  if (res == API_FR_BAD_BODY)
    snprintf(msg, sizeof(msg), "malformed chunked body: %s", g->fr.why);
  else
    snprintf(msg, sizeof(msg), "%s", g->fr.why);
  pthread_mutex_unlock(&g->lock);
  /* No response is under way: libmicrohttpd is reading a request (its head or its body). */
  answer_and_close(g->fd, msg);
  errno = ECONNRESET;
  return -1;
}

/* recv(2) for the whole process: libmicrohttpd reads its client sockets with it. Sockets the gate
 * did not register (and MSG_PEEK reads) are plain recvfrom(2). */
ssize_t recv(int fd, void *buf, size_t len, int flags) {
  ssize_t n = recvfrom(fd, buf, len, flags, NULL, NULL);
  if (n <= 0 || (flags & MSG_PEEK))
    return n;
  struct gate_conn *g = by_fd(fd);
  return g ? tap(g, buf, n) : n;
}

/* ---- connection records ---- */

static struct gate_conn *conn_of(struct MHD_Connection *c) {
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  return ci ? ci->socket_context : NULL;
}

void api_gate_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                     enum MHD_ConnectionNotificationCode toe) {
  if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci)
      return;
    struct gate_conn *g = xcalloc(1, sizeof(*g));
    pthread_mutex_init(&g->lock, NULL);
    g->fd = ci->connect_fd;
    api_framing_init(&g->fr);
    g->accept_ns = g->head_since_ns = g->idle_since_ns = now_ns();
    pthread_mutex_lock(&g_lock);
    g->next = g_head;
    if (g_head)
      g_head->prev = g;
    g_head = g;
    if (g->fd >= 0 && (size_t)g->fd < g_nfd)
      __atomic_store_n(&g_by_fd[g->fd], g, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&g_lock);
    *socket_context = g;
    return;
  }
  struct gate_conn *g = *socket_context;
  if (!g)
    return;
  pthread_mutex_lock(&g_lock);
  if (g->prev)
    g->prev->next = g->next;
  else
    g_head = g->next;
  if (g->next)
    g->next->prev = g->prev;
  if (g->fd >= 0 && (size_t)g->fd < g_nfd && g_by_fd[g->fd] == g)
    __atomic_store_n(&g_by_fd[g->fd], NULL, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&g_lock);
  pthread_mutex_destroy(&g->lock);
  free(g);
  *socket_context = NULL;
}

void api_gate_request(struct MHD_Connection *c) {
  struct gate_conn *g = conn_of(c);
  if (!g)
    return;
  pthread_mutex_lock(&g->lock);
  g->started++;
  g->org = NULL;
  pthread_mutex_unlock(&g->lock);
}

void api_gate_attribute(struct MHD_Connection *c, const void *org) {
  struct gate_conn *g = conn_of(c);
  if (!g)
    return;
  pthread_mutex_lock(&g->lock);
  g->org = org;
  pthread_mutex_unlock(&g->lock);
}

void api_gate_request_done(struct MHD_Connection *c) {
  struct gate_conn *g = conn_of(c);
  if (!g)
    return;
  pthread_mutex_lock(&g->lock);
  g->done++;
  g->idle_since_ns = now_ns();
  bool live = !g->released && !g->killed;
  /* A bad head whose turn has come; or an Upgrade request that ended without an upgrade (the gate
   * stopped following this connection's framing after it, so no further request may be read). */
  bool answer = live && g->bad_pending && g->done + 1 >= g->fr.bad_head;
  bool close_it = live && !answer && g->fr.opaque && !g->fr.bad_head && g->done >= g->fr.heads;
  if (answer || close_it)
    g->killed = true;
  if (answer)
    g->answered = 400;
  char msg[192];
  snprintf(msg, sizeof(msg), "%s", g->fr.why);
  pthread_mutex_unlock(&g->lock);
  /* libmicrohttpd notifies after the response went out: nothing else is being written. */
  if (answer)
    answer_and_close(g->fd, msg);
  else if (close_it)
    shutdown(g->fd, SHUT_RDWR);
}

void api_gate_release(struct MHD_Connection *c) {
  struct gate_conn *g = conn_of(c);
  if (!g)
    return;
  pthread_mutex_lock(&g->lock);
  g->released = true;
  pthread_mutex_unlock(&g->lock);
}

unsigned api_gate_answered(struct MHD_Connection *c) {
  struct gate_conn *g = conn_of(c);
  if (!g)
    return 0;
  pthread_mutex_lock(&g->lock);
  unsigned st = g->answered;
  pthread_mutex_unlock(&g->lock);
  return st;
}

/* ---- the watchdog ---- */

struct idle_ref {
  struct gate_conn *g;
  const void *org;
  uint64_t since;
};

static int idle_cmp(const void *a, const void *b) {
  const struct idle_ref *x = a, *y = b;
  if (x->org != y->org)
    return (uintptr_t)x->org < (uintptr_t)y->org ? -1 : 1;
  return x->since < y->since ? -1 : x->since > y->since ? 1 : 0;
}

/* Closes g (g_lock held: its socket is open), answering 408 first when a head was arriving. */
static void kill_locked(struct gate_conn *g, bool answer_408, const char *why) {
  if (answer_408) {
    char msg[160];
    snprintf(msg, sizeof(msg), "the request head did not arrive within %u s (moatd --header-timeout)",
             g_cfg.header_timeout_s);
    write_answer(g->fd, 408, "request_timeout", msg);
  }
  shutdown(g->fd, SHUT_RDWR);
  log_debug("gate: closed connection fd %d: %s", g->fd, why);
}

static void watch_pass(void) {
  uint64_t now = now_ns();
  uint64_t header_ns = (uint64_t)g_cfg.header_timeout_s * 1000000000ULL;
  uint64_t idle_ns = (uint64_t)g_cfg.idle_timeout_s * 1000000000ULL;
  size_t n = 0, cap = 0;
  struct idle_ref *idle = NULL;
  for (struct gate_conn *g = g_head; g; g = g->next) {
    pthread_mutex_lock(&g->lock);
    int what = 0; /* 1: header timeout, 2: never sent a request, 3: idle too long */
    bool busy = g->killed || g->released || g->fr.heads > g->done;
    if (busy) {
      /* neither deadline applies */
    } else if (g->fr.in_head) {
      if (now - g->head_since_ns > header_ns)
        what = 1;
    } else if (g->done == 0) {
      if (now - g->accept_ns > header_ns)
        what = 2;
    } else if (now - g->idle_since_ns > idle_ns) {
      what = 3;
    } else if (g->org && now - g->idle_since_ns >= IDLE_EXCESS_GRACE_MS * 1000000ULL) {
      if (n == cap) {
        cap = cap ? cap * 2 : 64;
        idle = xrealloc(idle, cap * sizeof(*idle));
      }
      idle[n++] = (struct idle_ref){g, g->org, g->idle_since_ns};
    }
    if (what) {
      g->killed = true;
      if (what == 1)
        g->answered = 408;
    }
    pthread_mutex_unlock(&g->lock);
    if (what)
      kill_locked(g, what == 1,
                  what == 1   ? "request head too slow"
                  : what == 2 ? "no request"
                              : "idle keep-alive");
  }
  /* Per org, the oldest idle connections beyond max_idle_per_org. */
  if (n > 1)
    qsort(idle, n, sizeof(*idle), idle_cmp);
  for (size_t i = 0; i < n;) {
    size_t j = i;
    while (j < n && idle[j].org == idle[i].org)
      j++;
    size_t over = j - i > g_cfg.max_idle_per_org ? j - i - g_cfg.max_idle_per_org : 0;
    for (size_t k = i; k < i + over; k++) {
      struct gate_conn *g = idle[k].g;
      pthread_mutex_lock(&g->lock);
      bool still = !g->killed && !g->released && g->fr.heads == g->done && !g->fr.in_head;
      if (still)
        g->killed = true;
      pthread_mutex_unlock(&g->lock);
      if (still)
        kill_locked(g, false, "over the org's idle keep-alive connections");
    }
    i = j;
  }
  free(idle);
}

static void *watchdog(void *arg) {
  pthread_mutex_lock(&g_lock);
  while (!g_stop) {
    watch_pass();
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += WATCH_PERIOD_MS * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&g_cond, &g_lock, &ts);
  }
  pthread_mutex_unlock(&g_lock);
  return NULL;
}

int api_gate_start(const struct api_gate_config *cfg, moat_error **err) {
  pthread_mutex_lock(&g_lock);
  if (g_users++ > 0) {
    pthread_mutex_unlock(&g_lock);
    return 0;
  }
  g_cfg = *cfg;
  if (!g_by_fd) {
    struct rlimit rl;
    size_t nfd = MAX_FDS;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_max != RLIM_INFINITY)
      nfd = (size_t)rl.rlim_max;
    if (nfd > MAX_FDS)
      nfd = MAX_FDS;
    __atomic_store_n(&g_by_fd, xcalloc(nfd, sizeof(*g_by_fd)), __ATOMIC_RELEASE);
    __atomic_store_n(&g_nfd, nfd, __ATOMIC_RELEASE);
  }
  g_stop = false;
  int rc = pthread_create(&g_thread, NULL, watchdog, NULL);
  if (rc != 0) {
    g_users--;
    pthread_mutex_unlock(&g_lock);
    errno = rc;
    return moat_error_errno(err, "start the connection watchdog");
  }
  pthread_mutex_unlock(&g_lock);
  return 0;
}

void api_gate_stop(void) {
  pthread_mutex_lock(&g_lock);
  if (g_users == 0 || --g_users > 0) {
    pthread_mutex_unlock(&g_lock);
    return;
  }
  g_stop = true;
  pthread_cond_signal(&g_cond);
  pthread_mutex_unlock(&g_lock);
  pthread_join(g_thread, NULL);
}

/* forward.c -- forwards one HTTP request (or a WebSocket) to a server inside a sandbox
 *
 * The backend connection comes from control (moat_control_port_connect): made inside the
 * sandbox's own network, to its 127.0.0.1:P, else [::1]:P, never to anything of the host's.
 *
 * Backend connections are kept alive: one whose response ended cleanly (framed by Content-Length
 * or chunked, HTTP/1.1, no "Connection: close", the whole request body sent) goes to an idle pool
 * keyed by (sandbox id, port) and is reused by the next request for that port within
 * PORT_IDLE_MS (a sweeper thread closes older ones: CRIU refuses to checkpoint a sandbox with an
 * established TCP connection, so idle ones must not linger); one that the server closed meanwhile
 * is noticed (readable at reuse) and dropped. A request without a body that fails on a reused
 * connection before any answer byte is retried once on a new one. Upgrades always get a connection
 * of their own.
 * The request body is streamed as MHD hands it over (re-chunked when the client sent it chunked);
 * the response head is parsed and the body streamed back through an MHD callback response:
 * chunked bodies are decoded (MHD frames them again for the client; trailers are dropped),
 * Content-Length bodies are passed with their length, others until the server closes. A server
 * that goes away in the middle of a body (a killed sandbox) ends the client's connection.
 * Upgrade: a 101 from the server is answered 101 to the client with the server's headers, then a
 * thread copies bytes both ways until either side closes.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "../../common/buf.h"
#include "../../common/log.h"
#include "../http/fair.h"
#include "../http/gate.h"
#include "ports.h"

#define WAIT_SLICE_MS 500
#define COPY_BUF (64 * 1024)
#define PORT_IDLE_MS 1000  /* short: an open connection keeps CRIU from checkpointing the sandbox */
#define POOL_MAX 256       /* idle backend connections kept, all ports together */
#define POOL_MAX_PER_KEY 8 /* per (namespace, port) */

enum chunk_state { CH_SIZE, CH_DATA, CH_DATA_END, CH_TRAILER, CH_DONE };

struct port_fwd {
  struct port_pool *pool; /* borrowed */
  struct MHD_Connection *conn;
  struct port_env env;
  struct api_ticket **ticket; /* the request's slot (fair.h): an upgraded connection takes it */
  int fd;                     /* backend socket */
  int client_fd;              /* for disconnect checks, or -1 */
  bool head_req;              /* HEAD: no body comes back */
  bool upgrade;               /* the client asked for an Upgrade */
  bool chunked_out;           /* the request body is sent chunked */
  bool body_ended;
  char *in; /* bytes from the server not used yet: in[pos, len) */
  size_t pos, len, cap;
  enum port_framing framing;
  uint64_t remaining; /* PORT_BODY_LENGTH: body bytes left; PORT_BODY_CHUNKED: of the current chunk */
  enum chunk_state ch;
  char desc[64];
  /* keep-alive */
  struct moat_control *control;
  char id[MOAT_ID_LEN + 1];
  char *org;
  unsigned port;
  bool reused;      /* fd came from the idle pool */
  bool has_body;    /* the request has a body */
  bool keep;        /* the response allows reuse (HTTP/1.1, no Connection: close) */
  bool got_any;     /* a byte of the response arrived */
  bool answered;    /* port_fwd_respond made a response */
  char *head;       /* the request head, kept for one retry (no body) */
  char *set_cookie; /* added to the response, or NULL */
  size_t head_len;
  struct port_grant *grant; /* what let the request in: the response ends when it no longer holds */
  uint64_t grant_seen_ns;   /* when it was last looked at */
};

/* ---- idle backend connections ---- */

struct idle {
  char id[MOAT_ID_LEN + 1];
  unsigned port;
  int fd;
  uint64_t since_ns;
};

struct port_pool {
  pthread_mutex_t lock;    /* guards the rest; a leaf (no call under it but close and poll(0)) */
  struct idle v[POOL_MAX]; /* entries in use are v[0..n) */
  size_t n;
  bool stop;           /* the sweeper ends */
  pthread_cond_t wake; /* tells the sweeper to stop */
  pthread_t sweeper;
  bool sweeping; /* the sweeper runs: without it, no connection is kept */
};

static void pool_drop_locked(struct port_pool *pl, size_t i) {
  close(pl->v[i].fd);
  pl->v[i] = pl->v[--pl->n];
}

/* An idle connection to port of sandbox id that the server has not closed, or -1. */
static int pool_take(struct port_pool *pl, const char *id, unsigned port) {
  uint64_t now = now_ns();
  int fd = -1;
  pthread_mutex_lock(&pl->lock);
  for (size_t i = 0; i < pl->n;) {
    if (now - pl->v[i].since_ns > PORT_IDLE_MS * 1000000ULL) {
      pool_drop_locked(pl, i);
      continue;
    }
    if (fd < 0 && pl->v[i].port == port && strcmp(pl->v[i].id, id) == 0) {
      int cand = pl->v[i].fd;
      pl->v[i] = pl->v[--pl->n];
      struct pollfd p = {.fd = cand, .events = POLLIN};
      if (poll(&p, 1, 0) != 0) { /* closed by the server, or bytes nobody asked for */
        close(cand);
        continue;
      }
      fd = cand;
      continue;
    }
    i++;
  }
  pthread_mutex_unlock(&pl->lock);
  return fd;
}

/* Closes idle connections older than PORT_IDLE_MS, every PORT_IDLE_MS / 4, until the pool is freed. */
static void *sweeper(void *arg) {
  struct port_pool *pl = arg;
  pthread_mutex_lock(&pl->lock);
  while (!pl->stop) {
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_nsec += (long)PORT_IDLE_MS * 1000000L / 4;
    until.tv_sec += until.tv_nsec / 1000000000L;
    until.tv_nsec %= 1000000000L;
    pthread_cond_timedwait(&pl->wake, &pl->lock, &until);
    uint64_t now = now_ns();
    for (size_t i = 0; i < pl->n;) {
      if (now - pl->v[i].since_ns > PORT_IDLE_MS * 1000000ULL)
        pool_drop_locked(pl, i);
      else
        i++;
    }
  }
  pthread_mutex_unlock(&pl->lock);
  return NULL;
}

struct port_pool *port_pool_new(void) {
  struct port_pool *pl = xcalloc(1, sizeof(*pl));
  pthread_mutex_init(&pl->lock, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&pl->wake, &ca);
  pthread_condattr_destroy(&ca);
  pl->sweeping = pthread_create(&pl->sweeper, NULL, sweeper, pl) == 0;
  if (!pl->sweeping)
    log_warn("ports: no sweeper thread: backend connections are not kept alive");
  return pl;
}

void port_pool_free(struct port_pool *pl) {
  if (!pl)
    return;
  if (pl->sweeping) {
    pthread_mutex_lock(&pl->lock);
    pl->stop = true;
    pthread_cond_signal(&pl->wake);
    pthread_mutex_unlock(&pl->lock);
    pthread_join(pl->sweeper, NULL);
  }
  while (pl->n > 0)
    pool_drop_locked(pl, 0);
  pthread_cond_destroy(&pl->wake);
  pthread_mutex_destroy(&pl->lock);
  free(pl);
}

static void pool_put(struct port_pool *pl, const char *id, unsigned port, int fd) {
  if (!pl->sweeping) {
    close(fd);
    return;
  }
  pthread_mutex_lock(&pl->lock);
  size_t same = 0, oldest = 0;
  for (size_t i = 0; i < pl->n; i++) {
    if (pl->v[i].port == port && strcmp(pl->v[i].id, id) == 0)
      same++;
    if (pl->v[i].since_ns < pl->v[oldest].since_ns)
      oldest = i;
  }
  if (same >= POOL_MAX_PER_KEY) {
    pthread_mutex_unlock(&pl->lock);
    close(fd);
    return;
  }
  if (pl->n == POOL_MAX)
    pool_drop_locked(pl, oldest);
  struct idle *e = &pl->v[pl->n++];
  snprintf(e->id, sizeof(e->id), "%s", id);
  e->port = port;
  e->fd = fd;
  e->since_ns = now_ns();
  pthread_mutex_unlock(&pl->lock);
}

/* ---- the backend connection ---- */

/* A new connection to port of org's sandbox id, for sending requests on. */
static int connect_backend(struct moat_control *c, const char *org, const char *id, unsigned port,
                           moat_error **err) {
  int fd = moat_control_port_connect(c, org, id, port, PORT_CONNECT_TIMEOUT_S * 1000, err);
  if (fd < 0)
    return -1;
  struct timeval tv = {.tv_sec = PORT_SEND_TIMEOUT_S};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

/* ---- the request ---- */

static bool has_token(const char *h, const char *t) {
  size_t n = strlen(t);
  for (const char *p = h; p && *p;) {
    while (*p == ' ' || *p == '\t' || *p == ',')
      p++;
    const char *e = p;
    while (*e && *e != ',')
      e++;
    const char *te = e;
    while (te > p && (te[-1] == ' ' || te[-1] == '\t'))
      te--;
    if ((size_t)(te - p) == n && strncasecmp(p, t, n) == 0)
      return true;
    p = e;
  }
  return false;
}

static void buf_printf(struct moat_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Request headers that are the hop's own, or moat's, and never go to the server. */
static bool skip_request_header(const char *k, bool drop_auth) {
  static const char *const hop[] = {"Connection",
                                    "Keep-Alive",
                                    "Proxy-Connection",
                                    "Proxy-Authorization",
                                    "TE",
                                    "Trailer",
                                    "Transfer-Encoding",
                                    "Upgrade",
                                    "Content-Length",
                                    "X-API-Key",
                                    PORT_TOKEN_HEADER,
                                    "X-Forwarded-Prefix",
                                    "Expect",
                                    NULL};
  for (size_t i = 0; hop[i]; i++)
    if (strcasecmp(k, hop[i]) == 0)
      return true;
  return drop_auth && strcasecmp(k, "Authorization") == 0;
}

struct head_ctx {
  struct moat_buf *b;
  bool drop_auth;
  const char *connection; /* the client's Connection header: names more hop-by-hop headers */
  const char *xff;
  bool has_proto, has_host_fwd;
};

static enum MHD_Result add_header(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
  struct head_ctx *h = cls;
  if (!key || !value || skip_request_header(key, h->drop_auth))
    return MHD_YES;
  if (h->connection && has_token(h->connection, key))
    return MHD_YES;
  if (strcasecmp(key, "X-Forwarded-For") == 0) {
    h->xff = value;
    return MHD_YES;
  }
  if (strcasecmp(key, "Cookie") == 0) { /* without moat's own cookie */
    struct moat_buf c = {0};
    const char *p = value;
    size_t cl = strlen(PORT_TOKEN_COOKIE);
    while (*p) {
      while (*p == ' ' || *p == ';')
        p++;
      const char *e = strchr(p, ';');
      size_t n = e ? (size_t)(e - p) : strlen(p);
      if (n > 0 && !(n > cl && strncmp(p, PORT_TOKEN_COOKIE, cl) == 0 && p[cl] == '=')) {
        if (c.len)
          moat_buf_append(&c, "; ", 2);
        moat_buf_append(&c, p, n);
      }
      p += n;
    }
    if (c.len)
      buf_printf(h->b, "Cookie: %s\r\n", c.p);
    free(c.p);
    return MHD_YES;
  }
  if (strcasecmp(key, "X-Forwarded-Proto") == 0)
    h->has_proto = true;
  if (strcasecmp(key, "X-Forwarded-Host") == 0)
    h->has_host_fwd = true;
  moat_buf_append(h->b, key, strlen(key));
  moat_buf_append(h->b, ": ", 2);
  moat_buf_append(h->b, value, strlen(value));
  moat_buf_append(h->b, "\r\n", 2);
  return MHD_YES;
}

static void buf_printf(struct moat_buf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *s = NULL;
  int n = vasprintf(&s, fmt, ap);
  va_end(ap);
  if (n < 0)
    abort();
  moat_buf_append(b, s, (size_t)n);
  free(s);
}

static int send_all(int fd, const void *p, size_t n, moat_error **err) {
  const char *c = p;
  while (n > 0) {
    ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR)
      continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return moat_error_set(err, ETIMEDOUT, "the server in the sandbox read nothing for %d s",
                            PORT_SEND_TIMEOUT_S);
    if (w < 0)
      return moat_error_set(err, EPIPE, "the server in the sandbox closed the connection: %s",
                            strerror(errno));
    c += w;
    n -= (size_t)w;
  }
  return 0;
}

static const char *client_header(struct MHD_Connection *c, const char *k) {
  return MHD_lookup_connection_value(c, MHD_HEADER_KIND, k);
}

static void client_ip(struct MHD_Connection *c, char *out, size_t size) {
  snprintf(out, size, "unknown");
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
  if (!ci || !ci->client_addr)
    return;
  const struct sockaddr *sa = ci->client_addr;
  if (sa->sa_family == AF_INET)
    inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, out, (socklen_t)size);
  else if (sa->sa_family == AF_INET6)
    inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)sa)->sin6_addr, out, (socklen_t)size);
}

/* Replaces f's connection with a new one (same sandbox and port). 0 or -1. */
static int reconnect(struct port_fwd *f, moat_error **err) {
  close(f->fd);
  f->fd = -1;
  f->reused = false;
  f->pos = f->len = 0;
  f->fd = connect_backend(f->control, f->org, f->id, f->port, err);
  return f->fd < 0 ? -1 : 0;
}

struct port_fwd *port_fwd_open(struct port_pool *pool, struct moat_control *c, const char *org,
                               const char *id, unsigned port, const struct port_fwd_req *req,
                               moat_error **err) {
  struct MHD_Connection *conn = req->conn;
  const char *upgrade = client_header(conn, MHD_HTTP_HEADER_UPGRADE);
  const char *connection = client_header(conn, MHD_HTTP_HEADER_CONNECTION);
  bool want_upgrade = upgrade && *upgrade && connection && has_token(connection, "upgrade");
  const char *cl = client_header(conn, MHD_HTTP_HEADER_CONTENT_LENGTH);
  const char *te = client_header(conn, MHD_HTTP_HEADER_TRANSFER_ENCODING);
  bool chunked = te && has_token(te, "chunked");
  if (chunked)
    cl = NULL; /* Transfer-Encoding wins (RFC 9112 6.3): the server gets chunked framing, no length */
  uint64_t len = 0;
  if (cl && parse_u64(cl, &len) < 0) {
    moat_error_set(err, EINVAL, "bad Content-Length");
    port_grant_free(req->grant);
    return NULL;
  }
  for (const char *t = req->target; *t; t++) {
    if ((unsigned char)*t <= 0x20 || *t == 0x7f) {
      moat_error_set(err, EINVAL, "the request target holds a space or a control character");
      port_grant_free(req->grant);
      return NULL;
    }
  }
  /* A pooled connection is used only once control said org's sandbox runs (it wakes a hibernated
   * one): the same checks as a new connection's. */
  _cleanup_close_ int fd = -1;
  if (!want_upgrade) {
    if (moat_control_running(c, org, id, err) < 0) {
      port_grant_free(req->grant);
      return NULL;
    }
    fd = pool_take(pool, id, port);
  }
  bool reused = fd >= 0;
  if (fd < 0 && (fd = connect_backend(c, org, id, port, err)) < 0) {
    port_grant_free(req->grant);
    return NULL;
  }

  struct port_fwd *f = xcalloc(1, sizeof(*f));
  f->pool = pool;
  f->conn = conn;
  f->env = req->env;
  f->grant = req->grant;
  f->ticket = req->ticket;
  f->fd = steal_fd(&fd);
  f->control = c;
  snprintf(f->id, sizeof(f->id), "%s", id);
  f->org = xstrdup(org);
  f->port = port;
  f->reused = reused;
  f->head_req = strcmp(req->method, "HEAD") == 0;
  f->upgrade = want_upgrade;
  f->chunked_out = chunked;
  f->has_body = (cl && len > 0) || f->chunked_out;
  f->set_cookie = req->set_cookie ? xstrdup(req->set_cookie) : NULL;
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
  f->client_fd = ci ? ci->connect_fd : -1;
  snprintf(f->desc, sizeof(f->desc), "%s:%u", id, port);

  struct moat_buf b = {0};
  buf_printf(&b, "%s %s HTTP/1.1\r\n", req->method, req->target);
  struct head_ctx h = {.b = &b, .drop_auth = req->drop_authorization, .connection = connection};
  MHD_get_connection_values(conn, MHD_HEADER_KIND, add_header, &h);
  char ip[INET6_ADDRSTRLEN + 1];
  client_ip(conn, ip, sizeof(ip));
  if (h.xff)
    buf_printf(&b, "X-Forwarded-For: %s, %s\r\n", h.xff, ip);
  else
    buf_printf(&b, "X-Forwarded-For: %s\r\n", ip);
  if (!h.has_proto)
    buf_printf(&b, "X-Forwarded-Proto: http\r\n");
  const char *host = client_header(conn, MHD_HTTP_HEADER_HOST);
  if (!h.has_host_fwd && host)
    buf_printf(&b, "X-Forwarded-Host: %s\r\n", host);
  if (req->prefix)
    buf_printf(&b, "X-Forwarded-Prefix: %s\r\n", req->prefix);
  if (want_upgrade)
    buf_printf(&b, "Connection: Upgrade\r\nUpgrade: %s\r\n", upgrade);
  if (cl)
    buf_printf(&b, "Content-Length: %llu\r\n", (unsigned long long)len);
  else if (f->chunked_out)
    buf_printf(&b, "Transfer-Encoding: chunked\r\n");
  moat_buf_append(&b, "\r\n", 2);
  f->head = b.p;
  f->head_len = b.len;
  int rc = send_all(f->fd, f->head, f->head_len, err);
  if (rc < 0 && f->reused) { /* the server closed the idle connection just now: once more, anew */
    moat_error_free(err);
    rc = reconnect(f, err);
    if (rc == 0)
      rc = send_all(f->fd, f->head, f->head_len, err);
  }
  if (rc < 0) {
    port_fwd_free(f);
    return NULL;
  }
  if (f->has_body) { /* no retry once a body went out: the head is not needed again */
    free(f->head);
    f->head = NULL;
  }
  return f;
}

int port_fwd_body(struct port_fwd *f, const char *data, size_t len, moat_error **err) {
  if (len == 0)
    return 0;
  if (!f->chunked_out)
    return send_all(f->fd, data, len, err);
  char hdr[32];
  int n = snprintf(hdr, sizeof(hdr), "%zx\r\n", len);
  if (send_all(f->fd, hdr, (size_t)n, err) < 0 || send_all(f->fd, data, len, err) < 0 ||
      send_all(f->fd, "\r\n", 2, err) < 0)
    return -1;
  return 0;
}

/* True when f's connection ended its exchange cleanly and may carry the next request. */
static bool reusable(const struct port_fwd *f) {
  if (f->fd < 0 || !f->answered || !f->keep || !f->body_ended || f->pos != f->len)
    return false;
  switch (f->framing) {
  case PORT_BODY_NONE:
    return true;
  case PORT_BODY_LENGTH:
    return f->remaining == 0;
  case PORT_BODY_CHUNKED:
    return f->ch == CH_DONE;
  case PORT_BODY_CLOSE:
    return false;
  }
  return false;
}

/* Hands f's connection back to the pool as soon as the server's response is read in full, before
 * its last bytes reach the client: a client's next request then finds it there. */
static void release_when_done(struct port_fwd *f) {
  if (reusable(f)) {
    pool_put(f->pool, f->id, f->port, f->fd);
    f->fd = -1;
  }
}

void port_fwd_free(void *p) {
  struct port_fwd *f = p;
  if (!f)
    return;
  if (reusable(f)) {
    pool_put(f->pool, f->id, f->port, f->fd);
    f->fd = -1;
  }
  if (f->fd >= 0)
    close(f->fd);
  port_grant_free(f->grant);
  free(f->org);
  free(f->head);
  free(f->set_cookie);
  free(f->in);
  free(f);
}

/* ---- the response ---- */

/* Whether what let the request in still holds, looked at once per WAIT_SLICE_MS (the key's check
 * is one atomic read until a key is revoked somewhere). */
static bool grant_holds(struct port_grant *g, uint64_t *seen_ns) {
  uint64_t now = now_ns();
  if (now - *seen_ns < (uint64_t)WAIT_SLICE_MS * 1000000ULL)
    return true;
  *seen_ns = now;
  return port_grant_valid(g);
}

/* Waits until the server's socket is readable. 0, or -1: the client left, moatd stops, the
 * request's grant ended (EACCES), or timeout_ms (-1: none) passed. */
static int wait_server(struct port_fwd *f, int timeout_ms) {
  uint64_t start = now_ns();
  for (;;) {
    if (!grant_holds(f->grant, &f->grant_seen_ns)) {
      errno = EACCES;
      return -1;
    }
    struct pollfd p = {.fd = f->fd, .events = POLLIN};
    int n = poll(&p, 1, WAIT_SLICE_MS);
    if (n > 0)
      return 0;
    if (n < 0 && errno != EINTR)
      return -1;
    if (f->env.stopping && f->env.stopping(f->env.arg))
      return -1;
    if (api_client_gone(f->client_fd))
      return -1;
    if (timeout_ms >= 0 && now_ns() - start >= (uint64_t)timeout_ms * 1000000ULL) {
      errno = ETIMEDOUT;
      return -1;
    }
  }
}

/* Reads more server bytes into f->in (compacting it). >0 bytes, 0 at EOF, -1 on error. */
static ssize_t fill(struct port_fwd *f, int timeout_ms) {
  if (f->pos > 0 && f->pos == f->len)
    f->pos = f->len = 0;
  if (f->pos > 0 && f->len - f->pos < f->cap / 2) {
    memmove(f->in, f->in + f->pos, f->len - f->pos);
    f->len -= f->pos;
    f->pos = 0;
  }
  if (f->cap - f->len < 4096) {
    f->cap = f->cap ? f->cap * 2 : 16384;
    f->in = xrealloc(f->in, f->cap);
  }
  for (;;) {
    if (wait_server(f, timeout_ms) < 0)
      return -1;
    ssize_t n = recv(f->fd, f->in + f->len, f->cap - f->len, MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN))
      continue;
    if (n > 0) {
      f->len += (size_t)n;
      f->got_any = true;
    }
    return n;
  }
}

/* The position of the end of the line starting at f->pos ("\r\n" or "\n"), or NULL. */
static char *line_end(struct port_fwd *f) { return memchr(f->in + f->pos, '\n', f->len - f->pos); }

int port_head_parse(char *p, char *end, struct port_resp_head *h) {
  memset(h, 0, sizeof(*h));
  char *nl = memchr(p, '\n', (size_t)(end - p));
  if (!nl || end - p < 12 || strncmp(p, "HTTP/1.", 7) != 0 || p[8] != ' ')
    return -1;
  unsigned st = 0;
  for (int i = 9; i < 12; i++) {
    if (p[i] < '0' || p[i] > '9')
      return -1;
    st = st * 10 + (unsigned)(p[i] - '0');
  }
  if (st < 100 || st > 599)
    return -1;
  h->status = st;
  h->http11 = p[7] == '1';
  p = nl + 1;
  while (p < end) {
    nl = memchr(p, '\n', (size_t)(end - p));
    if (!nl)
      return -1;
    char *e = nl;
    if (e > p && e[-1] == '\r')
      e--;
    *e = '\0';
    if (e == p)
      break;
    char *colon = strchr(p, ':');
    if (!colon || colon == p || *p == ' ' || *p == '\t')
      return -1; /* obsolete line folding is not accepted */
    *colon = '\0';
    char *v = colon + 1;
    while (*v == ' ' || *v == '\t')
      v++;
    char *ve = v + strlen(v);
    while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t'))
      *--ve = '\0';
    if (h->n < ARRAY_SIZE(h->name)) {
      h->name[h->n] = p;
      h->value[h->n] = v;
      h->n++;
    }
    p = nl + 1;
  }
  return 0;
}

static const char *head_get(const struct port_resp_head *h, const char *k) {
  for (size_t i = 0; i < h->n; i++)
    if (strcasecmp(h->name[i], k) == 0)
      return h->value[i];
  return NULL;
}

/* True when the head has field k more than once with values that differ. */
static bool head_conflict(const struct port_resp_head *h, const char *k) {
  const char *first = NULL;
  for (size_t i = 0; i < h->n; i++)
    if (strcasecmp(h->name[i], k) == 0) {
      if (first && strcmp(first, h->value[i]) != 0)
        return true;
      first = h->value[i];
    }
  return false;
}

/* True when the last transfer coding of a Transfer-Encoding value is chunked. */
static bool te_final_chunked(const char *te) {
  const char *last = strrchr(te, ',');
  last = last ? last + 1 : te;
  while (*last == ' ' || *last == '\t')
    last++;
  size_t n = strlen(last);
  while (n > 0 && (last[n - 1] == ' ' || last[n - 1] == '\t'))
    n--;
  return n == 7 && strncasecmp(last, "chunked", 7) == 0;
}

int port_chunk_size_parse(const char *line, uint64_t *out) {
  uint64_t v = 0;
  const char *p = line;
  for (; *p; p++) {
    int d = *p >= '0' && *p <= '9'   ? *p - '0'
            : *p >= 'a' && *p <= 'f' ? *p - 'a' + 10
            : *p >= 'A' && *p <= 'F' ? *p - 'A' + 10
                                     : -1;
    if (d < 0)
      break;
    if (v > ((uint64_t)INT64_MAX - (uint64_t)d) / 16)
      return -1;
    v = v * 16 + (uint64_t)d;
  }
  if (p == line || (*p && *p != ';' && *p != ' ' && *p != '\t'))
    return -1;
  *out = v;
  return 0;
}

/* Reads one response head; f->pos moves past it. 0 or -1 with *err. */
static int read_head(struct port_fwd *f, struct port_resp_head *h, moat_error **err) {
  uint64_t deadline = now_ns() + PORT_HEAD_TIMEOUT_S * 1000000000ULL;
  size_t scanned = f->pos;
  for (;;) {
    /* the head ends at an empty line */
    char *end = NULL;
    for (size_t i = scanned; i < f->len; i++) {
      if (f->in[i] == '\n' &&
          ((i >= 1 && f->in[i - 1] == '\n') || (i >= 2 && f->in[i - 1] == '\r' && f->in[i - 2] == '\n'))) {
        if (i + 1 - f->pos > 1) {
          end = f->in + i + 1;
          break;
        }
      }
    }
    if (end && (size_t)(end - (f->in + f->pos)) > PORT_MAX_HEAD)
      return moat_error_set(err, EPROTO, "the server's response head is larger than %d bytes", PORT_MAX_HEAD);
    if (end) {
      char *start = f->in + f->pos;
      f->pos = (size_t)(end - f->in);
      if (port_head_parse(start, end, h) < 0)
        return moat_error_set(err, EPROTO, "the server in the sandbox sent a malformed response head");
      return 0;
    }
    scanned = f->len > f->pos + 2 ? f->len - 2 : f->pos;
    if (f->len - f->pos > PORT_MAX_HEAD)
      return moat_error_set(err, EPROTO, "the server's response head is larger than %d bytes", PORT_MAX_HEAD);
    uint64_t now = now_ns();
    if (now >= deadline)
      return moat_error_set(err, ETIMEDOUT, "the server in the sandbox did not answer within %d s",
                            PORT_HEAD_TIMEOUT_S);
    size_t old_pos = f->pos;
    ssize_t n = fill(f, (int)((deadline - now) / 1000000ULL) + 1);
    scanned -= old_pos - f->pos; /* fill may have compacted the buffer */
    if (n == 0)
      return moat_error_set(err, ECONNRESET,
                            "the server in the sandbox closed the connection without answering");
    if (n < 0) {
      if (errno == ETIMEDOUT)
        return moat_error_set(err, ETIMEDOUT, "the server in the sandbox did not answer within %d s",
                              PORT_HEAD_TIMEOUT_S);
      return moat_error_set(err, ECONNRESET, "the request ended before the server answered");
    }
  }
}

/* Copies min(buffered, max, limit) bytes, or reads straight from the server when nothing is
 * buffered. >0, 0 at EOF, -1 on error. */
static ssize_t body_bytes(struct port_fwd *f, char *buf, size_t max, uint64_t limit) {
  if (max > limit)
    max = (size_t)limit;
  if (f->pos < f->len) {
    size_t n = f->len - f->pos;
    if (n > max)
      n = max;
    memcpy(buf, f->in + f->pos, n);
    f->pos += n;
    return (ssize_t)n;
  }
  for (;;) {
    if (wait_server(f, -1) < 0)
      return -1;
    ssize_t n = recv(f->fd, buf, max, MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN))
      continue;
    return n;
  }
}

/* One line of chunked framing (without its line end) into line; moves f->pos past it. 0 or -1. */
static int chunk_line(struct port_fwd *f, char *line, size_t size) {
  for (;;) {
    char *nl = line_end(f);
    if (nl) {
      size_t n = (size_t)(nl - (f->in + f->pos));
      if (n > 0 && f->in[f->pos + n - 1] == '\r')
        n--;
      if (n >= size)
        return -1;
      memcpy(line, f->in + f->pos, n);
      line[n] = '\0';
      f->pos = (size_t)(nl - f->in) + 1;
      return 0;
    }
    if (f->len - f->pos > 4096)
      return -1;
    if (fill(f, -1) <= 0)
      return -1;
  }
}

static ssize_t body_reader(void *cls, uint64_t pos, char *buf, size_t max) {
  struct port_fwd *f = cls;
  (void)pos;
  switch (f->framing) {
  case PORT_BODY_NONE:
    return MHD_CONTENT_READER_END_OF_STREAM;
  case PORT_BODY_LENGTH: {
    if (f->remaining == 0)
      return MHD_CONTENT_READER_END_OF_STREAM;
    ssize_t n = body_bytes(f, buf, max, f->remaining);
    if (n <= 0) {
      log_info("ports %s: the server closed %llu bytes before the end of its response", f->desc,
               (unsigned long long)f->remaining);
      return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    f->remaining -= (uint64_t)n;
    if (f->remaining == 0)
      release_when_done(f);
    return n;
  }
  case PORT_BODY_CLOSE: {
    ssize_t n = body_bytes(f, buf, max, UINT64_MAX);
    if (n == 0)
      return MHD_CONTENT_READER_END_OF_STREAM;
    return n < 0 ? MHD_CONTENT_READER_END_WITH_ERROR : n;
  }
  case PORT_BODY_CHUNKED:
    break;
  }
  char line[4100];
  for (;;) {
    switch (f->ch) {
    case CH_SIZE: {
      if (chunk_line(f, line, sizeof(line)) < 0)
        goto broken;
      uint64_t n;
      if (port_chunk_size_parse(line, &n) < 0)
        goto broken;
      f->remaining = n;
      f->ch = n ? CH_DATA : CH_TRAILER;
      break;
    }
    case CH_DATA: {
      ssize_t n = body_bytes(f, buf, max, f->remaining);
      if (n <= 0)
        goto broken;
      f->remaining -= (uint64_t)n;
      if (f->remaining == 0)
        f->ch = CH_DATA_END;
      return n;
    }
    case CH_DATA_END:
      if (chunk_line(f, line, sizeof(line)) < 0 || line[0])
        goto broken;
      f->ch = CH_SIZE;
      break;
    case CH_TRAILER:
      if (chunk_line(f, line, sizeof(line)) < 0)
        goto broken;
      if (!line[0]) {
        f->ch = CH_DONE;
        release_when_done(f);
      }
      break;
    case CH_DONE:
      return MHD_CONTENT_READER_END_OF_STREAM;
    }
  }
broken:
  log_info("ports %s: the server's chunked response ended early or is malformed", f->desc);
  return MHD_CONTENT_READER_END_WITH_ERROR;
}

/* Response headers that are the hop's own and not passed to the client. */
static bool skip_response_header(const char *k) {
  static const char *const hop[] = {"Connection",     "Keep-Alive", "Proxy-Connection", "Transfer-Encoding",
                                    "Content-Length", "Upgrade",    "Trailer",          NULL};
  for (size_t i = 0; hop[i]; i++)
    if (strcasecmp(k, hop[i]) == 0)
      return true;
  return false;
}

static void copy_headers(struct MHD_Response *resp, const struct port_resp_head *h) {
  const char *conn = head_get(h, "Connection");
  for (size_t i = 0; i < h->n; i++) {
    if (skip_response_header(h->name[i]) || (conn && has_token(conn, h->name[i])))
      continue;
    if (MHD_add_response_header(resp, h->name[i], h->value[i]) != MHD_YES)
      log_debug("ports: response header %s not passed on", h->name[i]);
  }
}

/* ---- upgraded connections ---- */

struct splice {
  int client, server;
  struct MHD_UpgradeResponseHandle *urh;
  struct port_env env;
  char *to_server, *to_client; /* bytes already read on either side */
  size_t to_server_len, to_client_len;
  char desc[64];
  struct api_ticket *ticket; /* given back when the connection closes */
  struct port_grant *grant;  /* the connection closes when it no longer holds */
  uint64_t grant_seen_ns;
};

/* Copies what is readable on from to to. 1 moved, 0 EOF, -1 error. */
static int move_bytes(int from, int to, char *buf) {
  ssize_t n = recv(from, buf, COPY_BUF, MSG_DONTWAIT);
  if (n < 0)
    return errno == EAGAIN || errno == EINTR ? 1 : -1;
  if (n == 0)
    return 0;
  moat_error *err = NULL;
  if (send_all(to, buf, (size_t)n, &err) < 0) {
    moat_error_free(&err);
    return -1;
  }
  return 1;
}

static void *splice_thread(void *arg) {
  struct splice *s = arg;
  char *buf = xmalloc(COPY_BUF);
  moat_error *err = NULL;
  /* The client socket is non-blocking under MHD: sends wait in send_all's loop below. */
  int fl = fcntl(s->client, F_GETFL);
  if (fl >= 0)
    fcntl(s->client, F_SETFL, fl & ~O_NONBLOCK);
  struct timeval tv = {.tv_sec = PORT_SEND_TIMEOUT_S};
  setsockopt(s->client, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  if ((s->to_server_len && send_all(s->server, s->to_server, s->to_server_len, &err) < 0) ||
      (s->to_client_len && send_all(s->client, s->to_client, s->to_client_len, &err) < 0)) {
    moat_error_free(&err);
    goto out;
  }
  bool c_open = true, s_open = true; /* the read sides */
  while (c_open || s_open) {
    if (s->env.stopping && s->env.stopping(s->env.arg))
      break;
    if (!grant_holds(s->grant, &s->grant_seen_ns))
      break;
    struct pollfd p[2] = {{.fd = c_open ? s->client : -1, .events = POLLIN},
                          {.fd = s_open ? s->server : -1, .events = POLLIN}};
    int n = poll(p, 2, WAIT_SLICE_MS);
    if (n < 0 && errno != EINTR)
      break;
    if (n <= 0)
      continue;
    if (p[0].revents) {
      int m = move_bytes(s->client, s->server, buf);
      if (m < 0)
        break;
      if (m == 0) {
        c_open = false;
        shutdown(s->server, SHUT_WR);
      }
    }
    if (p[1].revents) {
      int m = move_bytes(s->server, s->client, buf);
      if (m < 0)
        break;
      if (m == 0) {
        s_open = false;
        shutdown(s->client, SHUT_WR);
      }
    }
  }
out:
  free(buf);
  close(s->server);
  MHD_upgrade_action(s->urh, MHD_UPGRADE_ACTION_CLOSE);
  struct port_env env = s->env;
  api_fair_release(s->ticket);
  port_grant_free(s->grant);
  free(s->to_server);
  free(s->to_client);
  free(s);
  if (env.release)
    env.release(env.arg);
  return NULL;
}

static void upgrade_cb(void *cls, struct MHD_Connection *conn, void *con_cls, const char *extra_in,
                       size_t extra_in_size, MHD_socket sock, struct MHD_UpgradeResponseHandle *urh) {
  struct port_fwd *f = cls;
  api_gate_release(conn);
  struct splice *s = xcalloc(1, sizeof(*s));
  if (f->ticket) {
    s->ticket = *f->ticket;
    *f->ticket = NULL;
  }
  s->client = sock;
  s->server = f->fd;
  f->fd = -1; /* the thread owns the server socket from here */
  s->grant = f->grant;
  f->grant = NULL;
  s->grant_seen_ns = f->grant_seen_ns;
  s->urh = urh;
  s->env = f->env;
  snprintf(s->desc, sizeof(s->desc), "%s", f->desc);
  if (extra_in_size) {
    s->to_server = xmalloc(extra_in_size);
    memcpy(s->to_server, extra_in, extra_in_size);
    s->to_server_len = extra_in_size;
  }
  if (f->pos < f->len) {
    s->to_client_len = f->len - f->pos;
    s->to_client = xmalloc(s->to_client_len);
    memcpy(s->to_client, f->in + f->pos, s->to_client_len);
    f->pos = f->len;
  }
  int one = 1;
  setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (s->env.hold)
    s->env.hold(s->env.arg);
  pthread_t t;
  pthread_attr_t at;
  pthread_attr_init(&at);
  pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
  if (pthread_create(&t, &at, splice_thread, s) != 0) {
    log_warn("ports %s: no thread for the upgraded connection", s->desc);
    close(s->server);
    MHD_upgrade_action(urh, MHD_UPGRADE_ACTION_CLOSE);
    if (s->env.release)
      s->env.release(s->env.arg);
    api_fair_release(s->ticket);
    port_grant_free(s->grant);
    free(s->to_server);
    free(s->to_client);
    free(s);
  }
  pthread_attr_destroy(&at);
}

int port_head_framing(const struct port_resp_head *h, bool head_req, enum port_framing *framing,
                      uint64_t *len, moat_error **err) {
  const char *te = head_get(h, "Transfer-Encoding");
  const char *cl = head_get(h, "Content-Length");
  *len = 0;
  /* Framing a client and moatd could read differently (RFC 9112 6.3): refused, never passed on. */
  if (te && cl)
    return moat_error_set(err, EPROTO,
                          "the server in the sandbox sent both Content-Length and Transfer-Encoding");
  if (head_conflict(h, "Content-Length") || head_conflict(h, "Transfer-Encoding"))
    return moat_error_set(err, EPROTO, "the server in the sandbox sent conflicting framing headers");
  if (head_req || h->status == 204 || h->status == 304)
    *framing = PORT_BODY_NONE;
  else if (te && te_final_chunked(te))
    *framing = PORT_BODY_CHUNKED;
  else if (te)
    *framing = PORT_BODY_CLOSE;
  else if (cl) {
    if (parse_u64(cl, len) < 0)
      return moat_error_set(err, EPROTO, "the server in the sandbox sent a bad Content-Length");
    *framing = PORT_BODY_LENGTH;
  } else
    *framing = PORT_BODY_CLOSE;
  return 0;
}

struct MHD_Response *port_fwd_respond(struct port_fwd *f, unsigned *status, moat_error **err) {
  if (!f->body_ended) {
    f->body_ended = true;
    if (f->chunked_out && send_all(f->fd, "0\r\n\r\n", 5, err) < 0)
      return NULL;
  }
  struct port_resp_head h;
  for (;;) {
    if (read_head(f, &h, err) < 0) {
      /* A reused connection the server closed as the request went out: a request without a body
       * is sent again once, on a new connection. */
      if (!f->reused || f->got_any || !f->head || !*err || (*err)->status != ECONNRESET)
        return NULL;
      moat_error_free(err);
      if (reconnect(f, err) < 0 || send_all(f->fd, f->head, f->head_len, err) < 0)
        return NULL;
      continue;
    }
    if (h.status == 101 || h.status >= 200)
      break; /* 100 Continue, 103 Early Hints: the client gets the final answer only */
  }
  struct MHD_Response *resp = NULL;
  if (h.status == 101) {
    const char *up = head_get(&h, "Upgrade");
    if (!f->upgrade || !up) {
      moat_error_set(err, EPROTO, "the server in the sandbox switched protocols unasked");
      return NULL;
    }
    resp = MHD_create_response_for_upgrade(upgrade_cb, f);
    if (!resp)
      abort();
    copy_headers(resp, &h);
    MHD_add_response_header(resp, MHD_HTTP_HEADER_UPGRADE, up);
    if (f->set_cookie)
      MHD_add_response_header(resp, MHD_HTTP_HEADER_SET_COOKIE, f->set_cookie);
    *status = 101;
    return resp;
  }
  if (port_head_framing(&h, f->head_req, &f->framing, &f->remaining, err) < 0)
    return NULL;
  uint64_t len = f->remaining;
  const char *te = head_get(&h, "Transfer-Encoding");
  const char *cl = head_get(&h, "Content-Length");
  const char *rconn = head_get(&h, "Connection");
  f->keep = h.http11 && !f->upgrade && !(rconn && has_token(rconn, "close")) &&
            !(te && !te_final_chunked(te)); /* else a body ended by the server's close */
  uint64_t head_len = 0;
  if (f->head_req && cl && !(te && has_token(te, "chunked")) && parse_u64(cl, &head_len) == 0)
    /* HEAD: no body, but the length a GET would have (MHD sends no body for HEAD, and never calls
     * body_reader, which would end at once for PORT_BODY_NONE) */
    resp = MHD_create_response_from_callback(head_len, COPY_BUF, body_reader, f, NULL);
  else if (f->framing == PORT_BODY_NONE)
    resp = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
  else
    resp = MHD_create_response_from_callback(f->framing == PORT_BODY_LENGTH ? len : MHD_SIZE_UNKNOWN,
                                             COPY_BUF, body_reader, f, NULL);
  if (!resp)
    abort();
  copy_headers(resp, &h);
  *status = h.status;
  if (f->set_cookie)
    MHD_add_response_header(resp, MHD_HTTP_HEADER_SET_COOKIE, f->set_cookie);
  f->answered = true;
  if (f->framing == PORT_BODY_NONE || (f->framing == PORT_BODY_LENGTH && f->remaining == 0))
    release_when_done(f);
  return resp;
}

/* ---- errors ---- */

unsigned port_error_http(int status, const char **code) {
  switch (status) {
  case ECONNREFUSED:
    *code = "port_not_listening";
    return 502;
  case ETIMEDOUT:
    *code = "gateway_timeout";
    return 504;
  case EPROTO:
  case ECONNRESET:
  case EPIPE:
    *code = "bad_gateway";
    return 502;
  case EACCES:
    *code = "unauthorized";
    return 401;
  case EPERM:
    *code = "forbidden";
    return 403;
  default:
    return api_errno_http(status, code);
  }
}

int port_reply_error(struct MHD_Connection *conn, moat_error **err) {
  const char *code;
  unsigned st = port_error_http(*err ? (*err)->status : 0, &code);
  json_t *j = api_error_json(code, moat_error_msg(*err));
  moat_error_free(err);
  char *s = json_dumps(j, JSON_COMPACT);
  json_decref(j);
  if (!s)
    abort();
  size_t n = strlen(s);
  s = xrealloc(s, n + 2);
  s[n++] = '\n';
  s[n] = '\0';
  struct MHD_Response *resp = MHD_create_response_from_buffer(n, s, MHD_RESPMEM_MUST_FREE);
  if (!resp) {
    free(s);
    return -1;
  }
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
  if (st == 429)
    MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, API_RETRY_AFTER_S);
  if (st == 429)
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
  int rc = MHD_queue_response(conn, st, resp) == MHD_YES ? 0 : -1;
  MHD_destroy_response(resp);
  return rc;
}

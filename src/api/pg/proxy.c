/* proxy.c -- the PostgreSQL proxy's listeners: startup, routing, caps, cancels, and the byte copy
 *
 * An accept thread of its own for the main listener and the scoped one; a thread per connection
 * (a small stack, PG_BUF bytes buffered each way), bounded, per listener, by a cap on all its
 * connections and a cap per client address. A connection over either cap is answered by one of at
 * most PG_MAX_REJECTERS threads (per listener) with ErrorResponse 53300 after its startup packet
 * (closed at once beyond that), so that no client holds more than its share and the others are
 * served, and neither listener's clients take the other's room. A scoped connection's client
 * address is mapped to its org (cfg->origin) before anything of it is read; only that org's
 * databases are resolved for it, its cancels included. Every wait before a connection is routed
 * has a deadline; a routed connection lives as long as both ends do (TCP keepalive finds dead
 * peers).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/ssl.h>

#include "../../common/log.h"
#include "../../common/util.h"
#include "../http/http.h"
#include "pg.h"

#define PG_SRC_BUCKETS 256
#define PG_STACK (128 * 1024)
#define PG_TLS_STACK (512 * 1024) /* with TLS: OpenSSL's handshake wants more */
#define PG_WRITE_TIMEOUT_MS 5000  /* an ErrorResponse or the startup packet handed to the server */

#define PG_MAIN 0   /* the listener of cfg->listen */
#define PG_SCOPED 1 /* cfg->scoped_fd's */

struct pg_src {
  struct pg_src *next;
  uint8_t addr[16];
  uint8_t lst; /* PG_MAIN or PG_SCOPED: the two listeners' addresses are counted apart */
  unsigned n;
};

struct pg_listener {
  int fd;                     /* -1: none */
  unsigned active, rejecting; /* under p->lock */
};

struct pg_conn {
  struct moat_pg_proxy *p;
  struct pg_conn *prev, *next; /* routed connections, for cancels (under p->lock) */
  int cfd, sfd;
  SSL *ssl;    /* the client's TLS once negotiated, else NULL */
  uint8_t lst; /* PG_MAIN or PG_SCOPED */
  uint8_t src[16];
  struct sockaddr_storage ss;
  socklen_t ss_len;
  /* ADDR:PORT, and " (CLIENT)" for a scoped one */
  char peer[INET6_ADDRSTRLEN + 64];
  char *client; /* scoped: the origin's name for the client, or NULL */
  char *scope;  /* scoped: the client's org, "" when its address maps to none; main: NULL */
  bool reject;  /* over a cap: answered 53300 */
  char *user, *database, *org, *id;
  bool have_key; /* pid, secret: the server's BackendKeyData (under p->lock) */
  uint32_t pid, secret;
  uint64_t in, out;
};

struct moat_pg_proxy {
  struct moat_pg_config cfg;
  SSL_CTX *tls;              /* NULL: SSLRequest answered 'N' */
  struct pg_listener lst[2]; /* PG_MAIN, PG_SCOPED */
  int stop_fd;               /* an eventfd made readable once, when the proxy stops */
  unsigned port;
  pthread_t acceptor;
  pthread_mutex_t lock;
  pthread_cond_t idle;
  unsigned routed, threads;
  struct pg_conn *conns;
  struct pg_src *src[PG_SRC_BUCKETS];
};

/* ---- per-address counts (under p->lock) ---- */

static unsigned src_hash(const uint8_t a[16], uint8_t lst) {
  uint32_t h = 2166136261u;
  for (int i = 0; i < 16; i++)
    h = (h ^ a[i]) * 16777619u;
  h = (h ^ lst) * 16777619u;
  return h % PG_SRC_BUCKETS;
}

static struct pg_src *src_find(struct moat_pg_proxy *p, const uint8_t a[16], uint8_t lst, bool add) {
  struct pg_src **pp = &p->src[src_hash(a, lst)];
  for (struct pg_src *s = *pp; s; s = s->next)
    if (s->lst == lst && memcmp(s->addr, a, 16) == 0)
      return s;
  if (!add)
    return NULL;
  struct pg_src *s = xcalloc(1, sizeof(*s));
  memcpy(s->addr, a, 16);
  s->lst = lst;
  s->next = *pp;
  *pp = s;
  return s;
}

/* Gives back one of a's connections on listener lst (drop: none, only an entry src_find just made
 * with n 0). */
static void src_release(struct moat_pg_proxy *p, const uint8_t a[16], uint8_t lst, bool drop) {
  struct pg_src **pp = &p->src[src_hash(a, lst)];
  for (struct pg_src *s = *pp; s; pp = &s->next, s = s->next)
    if (s->lst == lst && memcmp(s->addr, a, 16) == 0) {
      if (!drop && s->n > 0)
        s->n--;
      if (s->n == 0) {
        *pp = s->next;
        free(s);
      }
      return;
    }
}

/* ---- I/O with deadlines ---- */

/* Waits for fd to be ready for ev until deadline (ns) or the proxy stops: 0, or -1 (ETIMEDOUT,
 * ECANCELED). */
static int wait_fd(struct moat_pg_proxy *p, int fd, short ev, uint64_t deadline) {
  for (;;) {
    uint64_t now = now_ns();
    if (now >= deadline) {
      errno = ETIMEDOUT;
      return -1;
    }
    struct pollfd pf[2] = {{.fd = fd, .events = ev}, {.fd = p->stop_fd, .events = POLLIN}};
    int ms = (int)((deadline - now) / 1000000) + 1;
    int r = poll(pf, 2, ms);
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0)
      return -1;
    if (pf[1].revents) {
      errno = ECANCELED;
      return -1;
    }
    if (pf[0].revents)
      return 0;
  }
}

static int write_full(struct moat_pg_proxy *p, int fd, const uint8_t *buf, size_t n, uint64_t deadline) {
  size_t done = 0;
  while (done < n) {
    ssize_t r = send(fd, buf + done, n - done, MSG_NOSIGNAL);
    if (r > 0) {
      done += (size_t)r;
      continue;
    }
    if (r < 0 && errno == EINTR)
      continue;
    if (r == 0 || errno != EAGAIN || wait_fd(p, fd, POLLOUT, deadline) < 0)
      return -1;
  }
  return 0;
}

static uint64_t deadline_ms(unsigned ms) { return now_ns() + (uint64_t)ms * 1000000ULL; }

/* ---- the client's end: its socket, or TLS over it ---- */

/* One SSL call's outcome as a read()/write() would give it: > 0 bytes, 0 at the end, or -1 with
 * errno (EAGAIN, and *want the poll event it waits for; EPROTO for a TLS failure). */
static ssize_t tls_result(struct pg_conn *c, int r, short *want) {
  if (r > 0)
    return r;
  int e = SSL_get_error(c->ssl, r);
  switch (e) {
  case SSL_ERROR_WANT_READ:
    *want = POLLIN;
    errno = EAGAIN;
    return -1;
  case SSL_ERROR_WANT_WRITE:
    *want = POLLOUT;
    errno = EAGAIN;
    return -1;
  case SSL_ERROR_ZERO_RETURN:
    return 0;
  case SSL_ERROR_SYSCALL:
    ERR_clear_error();
    if (errno == 0)
      return 0; /* the peer closed without close_notify */
    return -1;
  default:
    ERR_clear_error();
    errno = EPROTO;
    return -1;
  }
}

/* read() or write() of the client: *want gets the event to wait for on EAGAIN. */
static ssize_t client_read(struct pg_conn *c, uint8_t *buf, size_t n, short *want) {
  *want = POLLIN;
  if (!c->ssl)
    return read(c->cfd, buf, n);
  return tls_result(c, SSL_read(c->ssl, buf, n > INT32_MAX ? INT32_MAX : (int)n), want);
}

static ssize_t client_write(struct pg_conn *c, const uint8_t *buf, size_t n, short *want) {
  *want = POLLOUT;
  if (!c->ssl)
    return send(c->cfd, buf, n, MSG_NOSIGNAL);
  return tls_result(c, SSL_write(c->ssl, buf, n > INT32_MAX ? INT32_MAX : (int)n), want);
}

/* Reads exactly n bytes of the client (its socket, or TLS over it): 0, or -1 (errno; 0 for an end
 * of stream). */
static int client_read_full(struct pg_conn *c, uint8_t *buf, size_t n, uint64_t deadline) {
  for (size_t got = 0; got < n;) {
    short want;
    ssize_t r = client_read(c, buf + got, n - got, &want);
    if (r > 0) {
      got += (size_t)r;
      continue;
    }
    if (r == 0) {
      errno = 0;
      return -1;
    }
    if (errno == EINTR)
      continue;
    if (errno != EAGAIN || wait_fd(c->p, c->cfd, want, deadline) < 0)
      return -1;
  }
  return 0;
}

/* write_full of the client's end. */
static int client_write_full(struct pg_conn *c, const uint8_t *buf, size_t n, uint64_t deadline) {
  if (!c->ssl)
    return write_full(c->p, c->cfd, buf, n, deadline);
  for (size_t done = 0; done < n;) {
    short want;
    ssize_t r = client_write(c, buf + done, n - done, &want);
    if (r > 0) {
      done += (size_t)r;
      continue;
    }
    if (r == 0 || errno != EAGAIN || wait_fd(c->p, c->cfd, want, deadline) < 0)
      return -1;
  }
  return 0;
}

/* The client's writing side ends (after its last bytes): close_notify over TLS, then FIN. */
static void client_shutdown(struct pg_conn *c) {
  if (c->ssl)
    SSL_shutdown(c->ssl);
  shutdown(c->cfd, SHUT_WR);
}

/* The TLS handshake after 'S', until deadline: 0, or -1 (logged). */
static int tls_accept(struct pg_conn *c, uint64_t deadline) {
  c->ssl = SSL_new(c->p->tls);
  if (!c->ssl || SSL_set_fd(c->ssl, c->cfd) != 1) {
    log_warn("pg %s: TLS: no session", c->peer);
    return -1;
  }
  for (;;) {
    short want = POLLIN;
    int r = SSL_accept(c->ssl);
    if (r == 1)
      return 0;
    if (tls_result(c, r, &want) < 0 && errno == EAGAIN && wait_fd(c->p, c->cfd, want, deadline) == 0)
      continue;
    log_info("pg %s: TLS handshake failed (%s)", c->peer, errno == ETIMEDOUT ? "timed out" : "refused");
    SSL_free(c->ssl);
    c->ssl = NULL; /* nothing more is said on this connection */
    return -1;
  }
}

/* Sends an ErrorResponse to the client (best effort) and lets it read it before the close. */
static void send_error(struct pg_conn *c, const char *sqlstate, const char *msg) {
  uint8_t buf[1024];
  size_t n = pg_error_response(buf, sizeof(buf), sqlstate, msg);
  if (client_write_full(c, buf, n, deadline_ms(PG_WRITE_TIMEOUT_MS)) == 0)
    client_shutdown(c);
}

static void tune_socket(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  int idle = 60, intvl = 10, cnt = 6;
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
}

/* ---- the copy both ways ---- */

struct pg_dir {
  uint8_t buf[PG_BUF];
  size_t off, len;
  bool eof;  /* the reading side ended */
  bool shut; /* the writing side was shut down after the end */
};

/* Copies bytes client <-> server until both directions ended (each end's FIN passed on as a
 * shutdown of the other's writing side), either end fails, or the proxy stops. The client's end
 * may be TLS: its reads and writes each wait for what OpenSSL asks (want[]), and bytes OpenSSL
 * holds decrypted already (SSL_pending) are read without waiting for the socket. */
static void splice_both(struct pg_conn *c) {
  struct moat_pg_proxy *p = c->p;
  struct pg_dir *d = xcalloc(2, sizeof(*d)); /* d[0]: client -> server, d[1]: server -> client */
  struct pg_backend_scan scan = {0};
  bool hup[2] = {false, false}; /* hup[i]: end i (0 client, 1 server) reported POLLHUP */
  /* the events the client's end waits for: for reading it (from TLS, POLLOUT during a key update)
   * and for writing to it */
  short c_rd = POLLIN, c_wr = POLLOUT;
  for (;;) {
    struct pollfd pf[3] = {{.fd = c->cfd}, {.fd = c->sfd}, {.fd = p->stop_fd, .events = POLLIN}};
    if (d[0].len == 0 && !d[0].eof)
      pf[0].events |= c_rd;
    if (d[1].len > 0)
      pf[0].events |= c_wr;
    if (d[1].len == 0 && !d[1].eof)
      pf[1].events |= POLLIN;
    if (d[0].len > 0)
      pf[1].events |= POLLOUT;
    for (int i = 0; i < 2;
         i++) /* a hung-up end whose bytes wait for the other is not polled (it would spin) */
      if (hup[i] && !(pf[i].events & (POLLIN | POLLOUT)))
        pf[i].fd = -1;
    bool pending = c->ssl && d[0].len == 0 && !d[0].eof && SSL_pending(c->ssl) > 0;
    if (poll(pf, 3, pending ? 0 : -1) < 0) {
      if (errno == EINTR)
        continue;
      break;
    }
    if (pf[2].revents)
      break;
    bool fail = false;
    for (int i = 0; i < 2; i++) {
      if (pf[i].revents & POLLERR)
        fail = true;
      if (pf[i].revents & POLLHUP)
        hup[i] = true;
    }
    /* client -> server: read the client */
    if (!fail && d[0].len == 0 && !d[0].eof && (pending || (pf[0].revents & (c_rd | POLLHUP)))) {
      ssize_t r = client_read(c, d[0].buf, sizeof(d[0].buf), &c_rd);
      if (r > 0) {
        d[0].off = 0;
        d[0].len = (size_t)r;
        c->in += (uint64_t)r;
        c_rd = POLLIN;
      } else if (r == 0) {
        d[0].eof = true;
      } else if (errno != EAGAIN && errno != EINTR) {
        fail = true;
      }
    }
    /* server -> client: read the server */
    if (!fail && (pf[1].revents & (POLLIN | POLLHUP)) && d[1].len == 0 && !d[1].eof) {
      ssize_t r = read(c->sfd, d[1].buf, sizeof(d[1].buf));
      if (r > 0) {
        d[1].off = 0;
        d[1].len = (size_t)r;
        if (!scan.done) {
          pg_backend_scan_feed(&scan, d[1].buf, (size_t)r);
          if (scan.have_key && !c->have_key) {
            pthread_mutex_lock(&p->lock);
            c->pid = scan.pid;
            c->secret = scan.secret;
            c->have_key = true;
            pthread_mutex_unlock(&p->lock);
          }
        }
        c->out += (uint64_t)r;
      } else if (r == 0) {
        d[1].eof = true;
      } else if (errno != EAGAIN && errno != EINTR) {
        fail = true;
      }
    }
    /* the writes: to the server, then to the client */
    if (!fail && d[0].len > 0) {
      ssize_t w = send(c->sfd, d[0].buf + d[0].off, d[0].len, MSG_NOSIGNAL);
      if (w > 0) {
        d[0].off += (size_t)w;
        d[0].len -= (size_t)w;
      } else if (w < 0 && errno != EAGAIN && errno != EINTR) {
        fail = true;
      }
    }
    if (!fail && d[1].len > 0) {
      ssize_t w = client_write(c, d[1].buf + d[1].off, d[1].len, &c_wr);
      if (w > 0) {
        d[1].off += (size_t)w;
        d[1].len -= (size_t)w;
        c_wr = POLLOUT;
      } else if (w < 0 && errno != EAGAIN && errno != EINTR) {
        fail = true;
      }
    }
    if (!fail && d[0].eof && d[0].len == 0 && !d[0].shut) {
      shutdown(c->sfd, SHUT_WR);
      d[0].shut = true;
    }
    if (!fail && d[1].eof && d[1].len == 0 && !d[1].shut) {
      client_shutdown(c);
      d[1].shut = true;
    }
    if (fail || (d[0].shut && d[1].shut))
      break;
  }
  free(d);
}

/* ---- routing ---- */

static const char *sqlstate_of(int status) {
  switch (status) {
  case ENOENT:
    return "3D000"; /* invalid_catalog_name */
  case EACCES:
  case EPERM:
    return "28000"; /* invalid_authorization_specification */
  case ETIMEDOUT:
  case EBUSY:
  case EAGAIN:
    return "57P03"; /* cannot_connect_now */
  default:
    return "08006"; /* connection_failure */
  }
}

static void conn_link(struct pg_conn *c) {
  struct moat_pg_proxy *p = c->p;
  pthread_mutex_lock(&p->lock);
  c->next = p->conns;
  if (p->conns)
    p->conns->prev = c;
  p->conns = c;
  p->routed++;
  pthread_mutex_unlock(&p->lock);
}

static void conn_unlink(struct pg_conn *c) {
  struct moat_pg_proxy *p = c->p;
  pthread_mutex_lock(&p->lock);
  if (c->prev)
    c->prev->next = c->next;
  else
    p->conns = c->next;
  if (c->next)
    c->next->prev = c->prev;
  p->routed--;
  pthread_mutex_unlock(&p->lock);
}

/* A CancelRequest: forwarded (the client's 16 bytes unchanged) to the server of the routed
 * connection with that key, reached again through the resolver by its user and database within
 * the client's scope (and only when that still names the same database); dropped when no
 * connection has the key. */
static void handle_cancel(struct pg_conn *c, const uint8_t *pkt, const struct pg_startup *st) {
  struct moat_pg_proxy *p = c->p;
  _cleanup_free_ char *user = NULL, *database = NULL, *id = NULL;
  pthread_mutex_lock(&p->lock);
  for (struct pg_conn *o = p->conns; o; o = o->next)
    if (o->have_key && o->pid == st->cancel_pid && o->secret == st->cancel_key) {
      user = xstrdup(o->user);
      database = xstrdup(o->database);
      id = xstrdup(o->id);
      break;
    }
  pthread_mutex_unlock(&p->lock);
  if (!id) {
    log_info("pg %s: a cancel request matches no connection: dropped", c->peer);
    return;
  }
  moat_error *err = NULL;
  _cleanup_free_ char *org = NULL, *id2 = NULL;
  /* a scoped client cancels only on its org's databases */
  _cleanup_close_ int fd =
      p->cfg.resolve(p->cfg.arg, c->scope, user, database, &org, &id2, (int)p->cfg.connect_timeout_ms, &err);
  if (fd < 0 || strcmp(id, id2) != 0) {
    log_info("pg %s: cancel for %s not forwarded: %s", c->peer, id, fd < 0 ? moat_error_msg(err) : "moved");
    moat_error_free(&err);
    return;
  }
  fd_set_nonblock(fd, true);
  if (write_full(p, fd, pkt, 16, deadline_ms(PG_WRITE_TIMEOUT_MS)) < 0)
    log_info("pg %s: cancel for %s: %s", c->peer, id, strerror(errno));
  else
    log_info("pg %s: cancel forwarded to %s", c->peer, id);
}

/* Reads the startup packet, answering SSLRequest and GSSENCRequest with 'N' (at most one of
 * each); 0 with pkt (caller frees) and *st, or -1 when the connection is to close (an
 * ErrorResponse already sent where the bytes were a startup packet). */
static int read_startup(struct pg_conn *c, uint8_t **pkt, uint32_t *len, struct pg_startup *st) {
  struct moat_pg_proxy *p = c->p;
  uint64_t deadline = deadline_ms(p->cfg.startup_timeout_ms);
  bool ssl = false, gss = false;
  for (;;) {
    uint8_t hdr[4];
    if (client_read_full(c, hdr, 4, deadline) < 0) {
      log_debug("pg %s: closed before a startup packet (%s)", c->peer,
                errno ? strerror(errno) : "end of stream");
      return -1;
    }
    moat_error *err = NULL;
    if (pg_startup_length(hdr, len, &err) < 0) {
      log_info("pg %s: %s: closed", c->peer, moat_error_msg(err));
      moat_error_free(&err);
      return -1;
    }
    _cleanup_free_ uint8_t *buf = xmalloc(*len);
    memcpy(buf, hdr, 4);
    if (client_read_full(c, buf + 4, *len - 4, deadline) < 0) {
      log_info("pg %s: startup packet cut short (%s)", c->peer, errno ? strerror(errno) : "end of stream");
      return -1;
    }
    const char *sqlstate = NULL;
    if (pg_startup_parse(buf, *len, st, &sqlstate, &err) < 0) {
      log_info("pg %s: %s", c->peer, moat_error_msg(err));
      send_error(c, sqlstate, moat_error_msg(err));
      moat_error_free(&err);
      return -1;
    }
    if (st->kind == PG_KIND_SSL || st->kind == PG_KIND_GSSENC) {
      bool *seen = st->kind == PG_KIND_SSL ? &ssl : &gss;
      if (*seen) {
        send_error(c, "08P01", "encryption was already negotiated or refused on this connection");
        return -1;
      }
      *seen = true;
      bool tls = st->kind == PG_KIND_SSL && p->tls && !c->ssl;
      /* 'S', then the handshake: nothing the client sent after its SSLRequest is read as plain text
       * (client_read_full read the request's bytes only) */
      if (client_write_full(c, (const uint8_t *)(tls ? "S" : "N"), 1, deadline) < 0)
        return -1;
      if (tls && tls_accept(c, deadline) < 0)
        return -1;
      continue;
    }
    *pkt = steal_pointer(&buf);
    return 0;
  }
}

static void serve(struct pg_conn *c) {
  struct moat_pg_proxy *p = c->p;
  _cleanup_free_ uint8_t *pkt = NULL;
  uint32_t len = 0;
  struct pg_startup st;
  if (read_startup(c, &pkt, &len, &st) < 0)
    return;
  if (st.kind == PG_KIND_CANCEL) {
    if (!c->reject)
      handle_cancel(c, pkt, &st);
    return;
  }
  if (c->reject) {
    send_error(c, "53300",
               "sorry, too many connections: the database proxy's cap for this client address "
               "or for all clients is reached");
    return;
  }
  moat_error *err = NULL;
  uint64_t t0 = now_ns();
  c->sfd = p->cfg.resolve(p->cfg.arg, c->scope, st.user, st.database, &c->org, &c->id,
                          (int)p->cfg.connect_timeout_ms, &err);
  if (c->sfd < 0) {
    log_info("pg %s: user \"%s\" database \"%s\": %s", c->peer, st.user, st.database, moat_error_msg(err));
    send_error(c, sqlstate_of(err ? err->status : 0), moat_error_msg(err));
    moat_error_free(&err);
    return;
  }
  fd_set_nonblock(c->sfd, true);
  fd_set_cloexec(c->sfd, true);
  tune_socket(c->sfd);
  c->user = xstrdup(st.user);
  c->database = xstrdup(st.database);
  double ms = (double)(now_ns() - t0) / 1e6;
  log_info("pg %s: user \"%s\" database \"%s\" -> %s (%.1f ms)", c->peer, c->user, c->database, c->id, ms);
  conn_link(c);
  if (p->cfg.conn_event)
    p->cfg.conn_event(p->cfg.arg, c->id, +1);
  uint64_t started = now_ns();
  if (write_full(p, c->sfd, pkt, len, deadline_ms(PG_WRITE_TIMEOUT_MS)) == 0)
    splice_both(c);
  if (p->cfg.conn_event)
    p->cfg.conn_event(p->cfg.arg, c->id, -1);
  conn_unlink(c);
  log_info("pg %s: %s closed after %.1f s (%llu bytes in, %llu out)", c->peer, c->id,
           (double)(now_ns() - started) / 1e9, (unsigned long long)c->in, (unsigned long long)c->out);
}

/* The accounting of c's end (p->lock held): its listener's counts and its address's. */
static void conn_done(struct moat_pg_proxy *p, struct pg_conn *c) {
  struct pg_listener *l = &p->lst[c->lst];
  if (c->reject) {
    l->rejecting--;
  } else {
    l->active--;
    src_release(p, c->src, c->lst, false);
  }
  if (--p->threads == 0)
    pthread_cond_broadcast(&p->idle);
}

/* A scoped connection's org, from its client address, before anything of it is read. */
static void map_origin(struct pg_conn *c) {
  struct moat_pg_proxy *p = c->p;
  char *org = NULL, *client = NULL;
  if (p->cfg.origin(p->cfg.arg, (const struct sockaddr *)&c->ss, (unsigned)c->ss_len, &org, &client) < 0) {
    free(org);
    free(client);
    org = xstrdup(""); /* no database matches: every name is answered as unknown */
    log_info("pg %s: the client address maps to no org: every database is unknown to it", c->peer);
  } else if (client) {
    size_t n = strlen(c->peer);
    snprintf(c->peer + n, sizeof(c->peer) - n, " (%s)", client);
  }
  c->scope = org;
  c->client = client;
}

static void *conn_main(void *arg) {
  struct pg_conn *c = arg;
  struct moat_pg_proxy *p = c->p;
  if (c->lst == PG_SCOPED && !c->reject)
    map_origin(c);
  serve(c);
  SSL_free(c->ssl);
  close(c->cfd);
  if (c->sfd >= 0)
    close(c->sfd);
  pthread_mutex_lock(&p->lock);
  conn_done(p, c);
  pthread_mutex_unlock(&p->lock);
  free(c->scope);
  free(c->client);
  free(c->user);
  free(c->database);
  free(c->org);
  free(c->id);
  free(c);
  return NULL;
}

/* ---- accepting ---- */

static void addr_key(const struct sockaddr_storage *ss, uint8_t key[16], char *peer, size_t peer_len) {
  memset(key, 0, 16);
  char host[INET6_ADDRSTRLEN] = "?";
  unsigned port = 0;
  if (ss->ss_family == AF_INET) {
    const struct sockaddr_in *in = (const struct sockaddr_in *)ss;
    key[10] = key[11] = 0xff; /* the v4-mapped form, as a dual-stack socket reports it */
    memcpy(key + 12, &in->sin_addr, 4);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    port = ntohs(in->sin_port);
  } else if (ss->ss_family == AF_INET6) {
    const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)ss;
    memcpy(key, &in6->sin6_addr, 16);
    inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
    port = ntohs(in6->sin6_port);
  }
  snprintf(peer, peer_len, "%s:%u", host, port);
}

static void admit(struct moat_pg_proxy *p, uint8_t lst, int fd, const struct sockaddr_storage *ss,
                  socklen_t ss_len) {
  struct pg_conn *c = xcalloc(1, sizeof(*c));
  struct pg_listener *l = &p->lst[lst];
  c->p = p;
  c->cfd = fd;
  c->sfd = -1;
  c->lst = lst;
  c->ss = *ss;
  c->ss_len = ss_len;
  addr_key(ss, c->src, c->peer, sizeof(c->peer));
  pthread_mutex_lock(&p->lock);
  struct pg_src *s = src_find(p, c->src, lst, true);
  if (l->active < p->cfg.max_connections && s->n < p->cfg.max_conns_per_ip) {
    l->active++;
    s->n++;
  } else {
    if (s->n == 0)
      src_release(p, c->src, lst, true); /* the entry src_find made for this refusal */
    if (l->rejecting >= PG_MAX_REJECTERS) {
      pthread_mutex_unlock(&p->lock);
      log_debug("pg %s: over the caps and %d refusals under way: closed", c->peer, PG_MAX_REJECTERS);
      close(fd);
      free(c);
      return;
    }
    l->rejecting++;
    c->reject = true;
  }
  p->threads++;
  pthread_mutex_unlock(&p->lock);
  if (c->reject)
    log_info("pg %s: over the connection caps: refusing", c->peer);
  fd_set_nonblock(fd, true);
  tune_socket(fd);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, p->tls ? PG_TLS_STACK : PG_STACK);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_t t;
  int rc = pthread_create(&t, &attr, conn_main, c);
  pthread_attr_destroy(&attr);
  if (rc != 0) {
    log_warn("pg %s: no thread for the connection: %s", c->peer, strerror(rc));
    c->sfd = -1;
    /* conn_main's bookkeeping without serving */
    close(fd);
    pthread_mutex_lock(&p->lock);
    conn_done(p, c);
    pthread_mutex_unlock(&p->lock);
    free(c);
  }
}

static void *accept_main(void *arg) {
  struct moat_pg_proxy *p = arg;
  for (;;) {
    /* a negative fd (no scoped listener) is ignored by poll */
    struct pollfd pf[3] = {{.fd = p->stop_fd, .events = POLLIN},
                           {.fd = p->lst[PG_MAIN].fd, .events = POLLIN},
                           {.fd = p->lst[PG_SCOPED].fd, .events = POLLIN}};
    if (poll(pf, 3, -1) < 0) {
      if (errno == EINTR)
        continue;
      log_warn("pg: poll: %s", strerror(errno));
      usleep(100000);
      continue;
    }
    if (pf[0].revents)
      return NULL;
    for (uint8_t i = PG_MAIN; i <= PG_SCOPED; i++) {
      if (!pf[1 + i].revents)
        continue;
      struct sockaddr_storage ss;
      socklen_t sl = sizeof(ss);
      int fd = accept4(p->lst[i].fd, (struct sockaddr *)&ss, &sl, SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          log_warn("pg: accept: %s", strerror(errno));
          usleep(100000);
        }
        continue;
      }
      admit(p, i, fd, &ss, sl);
    }
  }
}

/* ---- start / stop ---- */

/* "ADDR:PORT" of a listening socket, for the log. */
static void sock_name(int fd, char *out, size_t len) {
  struct sockaddr_storage ss;
  socklen_t sl = sizeof(ss);
  uint8_t key[16];
  snprintf(out, len, "?");
  if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0)
    addr_key(&ss, key, out, len);
}

int moat_pg_proxy_start(struct moat_pg_proxy **out, const struct moat_pg_config *cfg, moat_error **err) {
  _cleanup_close_ int scoped = cfg->origin ? cfg->scoped_fd : -1; /* ours from here on */
  if (!cfg->resolve)
    return moat_error_set(err, EINVAL, "the database proxy needs a resolver");
  if (cfg->origin && cfg->scoped_fd < 0)
    return moat_error_set(err, EINVAL, "the database proxy's scoped listener needs a socket");
  unsigned port;
  bool ipv6;
  _cleanup_close_ int lfd = api_listen_socket(cfg->listen, &port, &ipv6, err);
  if (lfd < 0)
    return -1;
  SSL_CTX *tls = NULL;
  if ((cfg->tls_cert || cfg->tls_key) && !(tls = pg_tls_context(cfg->tls_cert, cfg->tls_key, err)))
    return -1;
  int sfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (sfd < 0) {
    SSL_CTX_free(tls);
    return moat_error_errno(err, "eventfd");
  }
  struct moat_pg_proxy *p = xcalloc(1, sizeof(*p));
  p->cfg = *cfg;
  p->tls = tls;
  p->cfg.tls_cert = p->cfg.tls_key = NULL; /* borrowed: not kept */
#define DEF(f, v)                                                                                            \
  if (!p->cfg.f)                                                                                             \
  p->cfg.f = v
  DEF(max_connections, PG_DEFAULT_MAX_CONNECTIONS);
  DEF(max_conns_per_ip, PG_DEFAULT_MAX_CONNS_PER_IP);
  DEF(startup_timeout_ms, PG_DEFAULT_STARTUP_TIMEOUT_MS);
  DEF(connect_timeout_ms, PG_DEFAULT_CONNECT_TIMEOUT_MS);
#undef DEF
  p->cfg.listen = NULL; /* borrowed: not kept */
  p->stop_fd = sfd;
  p->port = port;
  pthread_mutex_init(&p->lock, NULL);
  pthread_cond_init(&p->idle, NULL);
  fd_set_nonblock(lfd, true);
  p->lst[PG_MAIN].fd = steal_fd(&lfd);
  p->lst[PG_SCOPED].fd = -1;
  if (scoped >= 0) {
    fd_set_nonblock(scoped, true);
    fd_set_cloexec(scoped, true);
    p->lst[PG_SCOPED].fd = steal_fd(&scoped);
  }
  int rc = pthread_create(&p->acceptor, NULL, accept_main, p);
  if (rc != 0) {
    close(p->lst[PG_MAIN].fd);
    if (p->lst[PG_SCOPED].fd >= 0)
      close(p->lst[PG_SCOPED].fd);
    close(p->stop_fd);
    pthread_mutex_destroy(&p->lock);
    pthread_cond_destroy(&p->idle);
    SSL_CTX_free(p->tls);
    free(p);
    errno = rc;
    return moat_error_errno(err, "database proxy: thread");
  }
  log_info("database proxy listening on %s (port %u; caps %u connections, %u per client address; TLS %s)",
           cfg->listen, port, p->cfg.max_connections, p->cfg.max_conns_per_ip,
           p->tls ? "offered" : "not offered");
  if (p->lst[PG_SCOPED].fd >= 0) {
    char name[INET6_ADDRSTRLEN + 8];
    sock_name(p->lst[PG_SCOPED].fd, name, sizeof(name));
    log_info("database proxy listening on %s for scoped clients (each reaches its org's databases only; "
             "the same caps)",
             name);
  }
  *out = p;
  return 0;
}

unsigned moat_pg_proxy_port(const struct moat_pg_proxy *p) { return p ? p->port : 0; }

unsigned moat_pg_proxy_active(const struct moat_pg_proxy *p, unsigned *routed) {
  struct moat_pg_proxy *m = (struct moat_pg_proxy *)p;
  pthread_mutex_lock(&m->lock);
  unsigned n = m->lst[PG_MAIN].active + m->lst[PG_SCOPED].active;
  if (routed)
    *routed = m->routed;
  pthread_mutex_unlock(&m->lock);
  return n;
}

void moat_pg_proxy_stop(struct moat_pg_proxy *p) {
  if (!p)
    return;
  uint64_t one = 1;
  if (write(p->stop_fd, &one, sizeof(one)) != sizeof(one))
    log_warn("pg: eventfd: %s", strerror(errno));
  pthread_join(p->acceptor, NULL);
  for (int i = PG_MAIN; i <= PG_SCOPED; i++)
    if (p->lst[i].fd >= 0)
      close(p->lst[i].fd);
  /* every connection thread sees stop_fd (a resolver call in flight ends within its timeout) */
  pthread_mutex_lock(&p->lock);
  while (p->threads > 0)
    pthread_cond_wait(&p->idle, &p->lock);
  pthread_mutex_unlock(&p->lock);
  close(p->stop_fd);
  for (size_t i = 0; i < PG_SRC_BUCKETS; i++)
    while (p->src[i]) {
      struct pg_src *s = p->src[i];
      p->src[i] = s->next;
      free(s);
    }
  pthread_mutex_destroy(&p->lock);
  pthread_cond_destroy(&p->idle);
  SSL_CTX_free(p->tls);
  free(p);
}

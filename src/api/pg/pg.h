/* pg.h -- moatd's PostgreSQL-protocol proxy: one address (--db-listen) for every database
 *
 * A listener of its own (proxy.c), apart from the HTTP API: each client connection's startup
 * packet is read with strict bounds (startup.c), the database it names (by user or database) is
 * found by a resolver (in moatd: control's moat_control_database_connect, which wakes a
 * hibernated database) and the client's startup packet is handed to that server; from then on
 * bytes are copied both ways unchanged. The server authenticates the client itself (SCRAM end to
 * end): the proxy never sees a password. SSLRequest is answered 'S' and the client's TLS
 * terminated here when the proxy has a certificate (cfg->tls_cert/tls_key; the bytes to the
 * server, on its sandbox's loopback, stay plain), else 'N'; GSSENCRequest is answered 'N'; a
 * CancelRequest is forwarded to the server of the connection whose
 * BackendKeyData it carries, or dropped. Errors before a connection is routed are ErrorResponse
 * messages with a SQLSTATE; bytes that are not a startup packet close the connection.
 *
 * Two listeners: the main one (cfg->listen), where any client may name any database (the server's
 * SCRAM is the check), and optionally a scoped one (cfg->scoped_fd, in moatd the sandboxes'
 * listener), where each client address is mapped to an org when its connection is accepted
 * (cfg->origin) and only that org's databases are routed to; every other name, and every name
 * from an address that maps to no org, is answered as an unknown database.
 *
 * The parser (startup.c) is pure: unit tests and the fuzz target link it alone.
 */
#ifndef MOAT_API_PG_H
#define MOAT_API_PG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "../../common/error.h"

/* ---- the startup packet (startup.c) ---- */

#define PG_STARTUP_MIN 8     /* length field included */
#define PG_STARTUP_MAX 10000 /* PostgreSQL's own MAX_STARTUP_PACKET_LENGTH */
#define PG_MAX_PARAMS 64     /* name/value pairs in a startup packet */
#define PG_MAX_NAME 63       /* user and database names (PostgreSQL's NAMEDATALEN - 1) */
#define PG_PROTOCOL_3 196608u
#define PG_SSL_REQUEST_CODE 80877103u
#define PG_GSSENC_REQUEST_CODE 80877104u
#define PG_CANCEL_REQUEST_CODE 80877102u

enum pg_startup_kind { PG_KIND_STARTUP, PG_KIND_SSL, PG_KIND_GSSENC, PG_KIND_CANCEL };

/* A parsed startup packet. The strings point into the packet parsed (NUL-terminated there). */
struct pg_startup {
  enum pg_startup_kind kind;
  uint32_t version;     /* PG_KIND_STARTUP: 3.x (major << 16 | minor) */
  const char *user;     /* never NULL for PG_KIND_STARTUP: 1..PG_MAX_NAME bytes */
  const char *database; /* defaults to user */
  const char *options;  /* NULL when absent */
  size_t n_params;
  uint32_t cancel_pid, cancel_key; /* PG_KIND_CANCEL */
};

/* The length a packet's first 4 bytes announce, when from PG_STARTUP_MIN to PG_STARTUP_MAX: 0 and
 * *len; else -1 (*err EPROTO): the bytes are no startup packet (HTTP, TLS, garbage). */
int pg_startup_length(const uint8_t hdr[4], uint32_t *len, moat_error **err);

/* Parses the packet pkt[0..len) (len its announced length, checked by pg_startup_length). 0 and
 * *out; or -1 with *err (EPROTO) and *sqlstate (static): "0A000" for a protocol other than 3.x or
 * an unknown request code, "08P01" for a malformed layout (a request of the wrong length,
 * parameters not NUL-terminated pairs ending in one NUL, an empty or repeated name, more than
 * PG_MAX_PARAMS), "28000" for no user or one longer than PG_MAX_NAME, "3D000" for a database
 * name longer than PG_MAX_NAME. */
int pg_startup_parse(const uint8_t *pkt, size_t len, struct pg_startup *out, const char **sqlstate,
                     moat_error **err);

/* An ErrorResponse message (severity FATAL) with sqlstate (5 characters) and msg (cut to fit;
 * bytes below 0x20 become '?') written into out[0..cap); returns its length (cap >= 64). */
size_t pg_error_response(uint8_t *out, size_t cap, const char *sqlstate, const char *msg);

/* Reads the server's first messages as they pass to the client, until ReadyForQuery or an
 * ErrorResponse, to keep the connection's BackendKeyData (the key a CancelRequest carries).
 * Feed it every byte in order; it never looks at anything after that. */
struct pg_backend_scan {
  uint8_t hdr[5]; /* type, int32 length */
  size_t hdr_have;
  uint32_t remaining; /* body bytes of the current message still to pass */
  uint8_t key[8];     /* the BackendKeyData body being read */
  size_t key_have;
  bool done; /* ReadyForQuery, ErrorResponse or a malformed frame seen: nothing more is read */
  bool have_key;
  uint32_t pid, secret;
};
void pg_backend_scan_feed(struct pg_backend_scan *s, const uint8_t *p, size_t n);

/* ---- the proxy (proxy.c) ---- */

/* Finds and connects to the server of the database a startup names, of org only (NULL: any org's,
 * the main listener; "" matches none: a scoped client whose address maps to no org). Returns a
 * connected TCP fd (the caller owns it) and sets *db_org and *id (caller frees), or -1 with *err:
 * ENOENT (no such database, or one of another org: 3D000, the same message either way), EACCES/EPERM
 * (28000), others (ETIMEDOUT waking it...: 57P03 / 08006). May block up to timeout_ms. */
typedef int (*moat_pg_resolve_fn)(void *arg, const char *org, const char *user, const char *database,
                                  char **db_org, char **id, int timeout_ms, moat_error **err);
/* The org whose databases a client of the scoped listener at address sa may reach: 0 with *org and
 * *client (a name for it in logs; both caller frees), or -1 when the address maps to no org. Called
 * on the connection's thread once it is accepted, before a byte of it is read; must not block. */
typedef int (*moat_pg_origin_fn)(void *arg, const struct sockaddr *sa, unsigned sa_len, char **org,
                                 char **client);
/* Told +1 when a client connection is routed to database id and -1 when it closes. */
typedef void (*moat_pg_conn_event_fn)(void *arg, const char *id, int delta);

#define PG_DEFAULT_MAX_CONNECTIONS 2048
#define PG_DEFAULT_MAX_CONNS_PER_IP 256
#define PG_DEFAULT_STARTUP_TIMEOUT_MS 10000 /* the startup packet (after SSL/GSS refusals) */
#define PG_DEFAULT_CONNECT_TIMEOUT_MS 30000 /* the resolver's: a hibernated database wakes */
#define PG_MAX_REJECTERS 64                 /* connections over a cap being answered 53300 at once */
#define PG_BUF 32768                        /* bytes buffered per direction per connection */

struct moat_pg_config {
  const char *listen;               /* "HOST:PORT" (api_parse_listen's forms), PORT 0 = any */
  moat_pg_origin_fn origin;         /* NULL: no scoped listener; else scoped_fd is one */
  int scoped_fd;                    /* a listening TCP socket, the proxy's from start on (closed by
                                       start when it fails); used only with origin */
  unsigned max_connections;         /* 0: PG_DEFAULT_MAX_CONNECTIONS (each listener's) */
  unsigned max_conns_per_ip;        /* 0: PG_DEFAULT_MAX_CONNS_PER_IP (each listener's) */
  unsigned startup_timeout_ms;      /* 0: PG_DEFAULT_STARTUP_TIMEOUT_MS */
  unsigned connect_timeout_ms;      /* 0: PG_DEFAULT_CONNECT_TIMEOUT_MS */
  moat_pg_resolve_fn resolve;       /* required */
  moat_pg_conn_event_fn conn_event; /* NULL: none */
  void *arg;                        /* passed to both */
  const char *tls_cert, *tls_key;   /* PEM files (a chain, its key) for TLS on both listeners; NULL:
                                       none (SSLRequest answered 'N') */
};

/* ---- TLS (tls.c) ---- */
typedef struct ssl_ctx_st SSL_CTX;
/* A server context for cert (a PEM chain) and key: TLS 1.2 and later, no compression, no
 * renegotiation, partial writes. NULL with *err (EINVAL naming the file and OpenSSL's reason). */
SSL_CTX *pg_tls_context(const char *cert, const char *key, moat_error **err);

struct moat_pg_proxy;
/* Binds cfg->listen and serves it, and cfg->scoped_fd with cfg->origin, with a thread per
 * connection (an accept thread of its own for both). 0, or -1 with *err (EADDRINUSE, EINVAL...). */
int moat_pg_proxy_start(struct moat_pg_proxy **out, const struct moat_pg_config *cfg, moat_error **err);
unsigned moat_pg_proxy_port(const struct moat_pg_proxy *p);
/* Connections served now (routed or still in their startup; both listeners') and routed ones. */
unsigned moat_pg_proxy_active(const struct moat_pg_proxy *p, unsigned *routed);
/* Stops accepting, closes every connection, waits for their threads, frees p. NULL: nothing. */
void moat_pg_proxy_stop(struct moat_pg_proxy *p);

/* The front end (front.c) that starts a proxy with the api when its config names db_listen,
 * resolving through control's databases. */
struct api_front;
extern const struct api_front api_front_pg;

#endif

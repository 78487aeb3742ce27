/* api.h -- the HTTP front end of moatd: v1 routes over libmicrohttpd, auth, validation, JSON errors */
#ifndef MOAT_API_H
#define MOAT_API_H

#include "../common/error.h"
#include "../control/control.h"

struct moat_api;

/* The defaults of struct moat_api_limits (docs/CONTRACT.md "Limits and fairness"). One org at all
 * its caps holds at most REQUESTS + STREAMS + IDLE connections: far below MAX_CONNECTIONS. */
#define API_DEFAULT_MAX_CONNECTIONS 4000
#define API_DEFAULT_HEADER_TIMEOUT_S 10
#define API_DEFAULT_IDLE_TIMEOUT_S 30
#define API_DEFAULT_STREAM_KEEPALIVE_MS 15000
#define API_DEFAULT_REQUESTS_PER_ORG 256
#define API_DEFAULT_STREAMS_PER_ORG 256
#define API_DEFAULT_REQUESTS_PER_SANDBOX 64
#define API_DEFAULT_STREAMS_PER_SANDBOX 64
#define API_DEFAULT_IDLE_PER_ORG 32

/* Connection limits, deadlines and per-tenant caps of both listeners (API and port proxy). A field
 * left 0 takes its API_DEFAULT_*; max_conns_per_ip 0 means no per-address limit. */
struct moat_api_limits {
  unsigned max_connections;  /* connections per listener (libmicrohttpd's limit) */
  unsigned max_conns_per_ip; /* connections per client address, per listener */
  unsigned header_timeout_s; /* a request head must arrive within this */
  unsigned idle_timeout_s;   /* idle keep-alive connections are closed after this */
  unsigned requests_per_org, streams_per_org, requests_per_sandbox, streams_per_sandbox;
  unsigned idle_per_org;        /* idle keep-alive connections one org may hold */
  unsigned stream_keepalive_ms; /* an SSE stream silent this long gets a keep-alive comment */
};
/* lim with every 0 field replaced by its default. */
struct moat_api_limits moat_api_limits_resolve(const struct moat_api_limits *lim);

struct moat_api_config {
  const char *listen;      /* "HOST:PORT", HOST an IPv4/IPv6 literal or "localhost"; PORT 0 = any */
  unsigned conn_timeout_s; /* inactivity timeout of a connection busy with a request (a stalled
                            * body or a client that reads nothing); 0 = 60 */
  const char *version;     /* reported by /healthz */
  const struct moat_api_limits *limits; /* NULL: all defaults */
  /* 32 bytes that sign the sandbox access tokens the E2B front end hands out (moatd keeps them in
   * DATA/e2b-secret so tokens survive a restart); NULL: random ones for this api's lifetime. */
  const uint8_t *token_secret;
  size_t token_secret_len;
  /* A second listener for exposed ports by host name ("Host: P-ID.DOMAIN"), or NULL; proxy_domain
   * is its DOMAIN (NULL: any; the URLs handed out then say localhost). */
  const char *proxy_listen;
  const char *proxy_domain;
  /* The PostgreSQL-protocol proxy's listener ("HOST:PORT"), or NULL for none; its caps (0: the
   * defaults of api/pg/pg.h). */
  const char *db_listen;
  unsigned db_max_connections, db_max_conns_per_ip;
  const char *db_tls_cert, *db_tls_key; /* PEM files for the proxy's TLS, or NULL */
  /* The web dashboard's built assets (a directory with a MANIFEST), or NULL: /ui/ then answers 503. */
  const char *ui_dir;
};

/* Starts serving on cfg->listen with a thread per connection; returns 0 or -1 (EADDRINUSE, ...).
 * control is borrowed and must outlive the api. */
int moat_api_start(struct moat_api **out, struct moat_control *control, const struct moat_api_config *cfg,
                   moat_error **err);

/* The port actually bound (useful with PORT 0), and the proxy listener's (0: none). */
unsigned moat_api_port(const struct moat_api *a);
unsigned moat_api_proxy_port(const struct moat_api *a);
/* The database proxy's port (0: none). */
unsigned moat_api_db_port(const struct moat_api *a);

/* Stops accepting, waits for in-flight requests, frees a. */
void moat_api_stop(struct moat_api *a);

/* Every front end's routes on rt, in the order moatd serves them (the route tests read them). */
struct api_router;
void api_front_ends(struct api_router *rt);

#endif

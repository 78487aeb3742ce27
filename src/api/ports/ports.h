/* ports.h -- exposed ports: HTTP and WebSocket to a server inside a sandbox
 *
 * A server listening on port P inside sandbox ID is reached two ways, both served by the same
 * forwarding engine (forward.c):
 *   - by path on moatd's API listener: ANY /v1/sandboxes/ID/ports/P/REST -> "ANY /REST" (ports.c)
 *   - by host name on moatd's proxy listener (moatd --proxy-listen, --proxy-domain): a request with
 *     "Host: P-ID.DOMAIN" -> the same request line (proxy.c)
 * The backend connection comes from control (moat_control_port_connect), made inside the sandbox's
 * own network to its 127.0.0.1:P, then [::1]:P; so it needs no route into the sandbox and works for
 * loopback-only sandboxes.
 *
 * Access (ports.c): a proxied request needs the org's API key (Authorization: Bearer / X-API-Key),
 * or the port's access token (X-Moat-Port-Token header or ?moat_token= query parameter), or the
 * port to be public. POST /v1/sandboxes/ID/ports/P sets a port's access; the settings live in
 * moatd's memory (a restart forgets them: ports are back to API-key only).
 */
#ifndef MOAT_PORTS_H
#define MOAT_PORTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../../common/error.h"
#include "../../control/control.h"
#include "../http/http.h"

struct MHD_Connection;
struct MHD_Response;
struct api_ticket;

#define PORT_TOKEN_HEADER "X-Moat-Port-Token"
#define PORT_TOKEN_ARG "moat_token"
#define PORT_TOKEN_COOKIE "moat_port_token"
#define PORTS_MAX_PER_SANDBOX 64
#define PORT_TOKEN_MIN 16
#define PORT_TOKEN_MAX 256
#define PORT_CONNECT_TIMEOUT_S 5 /* connecting to the server in the sandbox */
#define PORT_HEAD_TIMEOUT_S 300  /* waiting for the response head: 504 after this */
#define PORT_SEND_TIMEOUT_S 60   /* a server that reads nothing of a request body for this long */
#define PORT_MAX_HEAD                                                                                        \
  (16 * 1024) /* response head from the server (it must fit MHD's 32 KiB per connection); larger: 502 */

/* How the listener a request came through lets a long wait end (moatd stopping) and keeps itself
 * alive while a WebSocket outlives its request. */
struct port_env {
  bool (*stopping)(void *arg);
  void (*hold)(void *arg);
  void (*release)(void *arg);
  void *arg;
};

/* ---- forwarding (forward.c) ---- */

struct port_fwd;
/* Idle backend connections kept for reuse (briefly: an open connection keeps CRIU from
 * checkpointing a sandbox), closed by a sweeper thread of the pool's own. */
struct port_pool;
struct port_pool *port_pool_new(void);
void port_pool_free(struct port_pool *pl); /* every port_fwd of it freed first */

/* The response head of the server in a sandbox, parsed in place: names and values point into the
 * head (NUL-terminated there); fields past the 128th are not kept. */
struct port_resp_head {
  unsigned status;
  bool http11;
  size_t n;
  char *name[128], *value[128];
};
/* How the body after a head is framed. */
enum port_framing { PORT_BODY_NONE, PORT_BODY_LENGTH, PORT_BODY_CHUNKED, PORT_BODY_CLOSE };

/* Parses the head in [p, end) (through its empty line) in place: status line "HTTP/1.x NNN"
 * (100-599), then "name: value" fields (no obsolete line folding). 0 or -1 (malformed). */
int port_head_parse(char *p, char *end, struct port_resp_head *h);
/* The framing of the body after h, for a request that was a HEAD (head_req) or not: none (HEAD, 204,
 * 304), chunked (Transfer-Encoding ending in chunked), Content-Length (*len) or until the server
 * closes. -1 with *err EPROTO for framing a client and moatd could read differently (RFC 9112 6.3:
 * both headers, a header twice with different values, a bad Content-Length). */
int port_head_framing(const struct port_resp_head *h, bool head_req, enum port_framing *framing,
                      uint64_t *len, moat_error **err);
/* A chunk-size line: 1+ hex digits (below 2^63), then nothing, whitespace or ";" extensions. 0 or -1. */
int port_chunk_size_parse(const char *line, uint64_t *out);

struct port_fwd_req {
  struct MHD_Connection *conn; /* the client's request: method, headers, client address */
  const char *method;
  const char *target;      /* request target sent to the server: "/path?query", raw */
  const char *prefix;      /* X-Forwarded-Prefix (path routing), or NULL */
  bool drop_authorization; /* the Authorization header carried moat's API key: not forwarded */
  const char *set_cookie;  /* a Set-Cookie header for the response (ports_token_cookie), or NULL */
  struct port_env env;
  struct api_ticket **ticket; /* where the request keeps its slot under the caps (fair.h): an upgraded
                               * connection takes it and gives it back when it closes; NULL: none */
  struct port_grant *grant;   /* what let the request in (ports_authorize), or NULL: port_fwd_open
                               * takes it, also when it fails */
};

/* Connects to port inside sandbox id (org's; running: a hibernated one is woken) and sends the
 * request head. Returns the forwarder (free with port_fwd_free) or NULL with *err: ENOENT (no such
 * sandbox), MOAT_E_PAUSED, EBUSY, ECONNREFUSED (nothing listens on the port), ETIMEDOUT, others. It
 * takes req->grant in either case; the request (or its upgraded connection) ends once the grant no
 * longer holds (looked at every half second). */
struct port_fwd *port_fwd_open(struct port_pool *pool, struct moat_control *c, const char *org,
                               const char *id, unsigned port, const struct port_fwd_req *req,
                               moat_error **err);
/* Forwards len bytes of the request body. 0 or -1 (*err: EPIPE when the server went away). */
int port_fwd_body(struct port_fwd *f, const char *data, size_t len, moat_error **err);
/* Ends the request body and waits for the server's response head. Returns an MHD response to
 * queue with *status (101 for an upgraded connection: bytes are then copied both ways on a thread
 * of its own until either side closes), or NULL with *err (EPROTO: malformed response, ETIMEDOUT,
 * ECONNRESET). The response reads the body from the server; f must outlive it. */
struct MHD_Response *port_fwd_respond(struct port_fwd *f, unsigned *status, moat_error **err);
void port_fwd_free(void *f);

/* HTTP status and error code of a forwarding or access error (port_not_listening for
 * ECONNREFUSED, sandbox_paused, gateway_timeout, ...). */
unsigned port_error_http(int status, const char **code);
/* Queues {"code","message"} with that status on conn (for the proxy listener). Frees *err. */
int port_reply_error(struct MHD_Connection *conn, moat_error **err);

/* ---- access (ports.c) ---- */

/* Decides whether a proxied request for (id, port) may pass, in this order: a valid API key in
 * X-API-Key (xkey) or in "Authorization: Bearer" (bearer; *how is then PORT_AUTH_BEARER and the
 * caller does not forward that header) passes; else a port token presented (token) must be the
 * port's (else EPERM: 403); else a public port passes; otherwise EACCES (401; also for an API key
 * that is not valid). A readonly API key passes GET and HEAD requests (method) only: another is
 * EPERM. Sets *org (caller frees) to the org that control then checks the sandbox against, and
 * *how to what let the request through. */
enum port_auth { PORT_AUTH_KEY, PORT_AUTH_BEARER, PORT_AUTH_TOKEN, PORT_AUTH_PUBLIC };
struct ports_state;
/* What let a proxied request in, looked at again while its connection lasts (an upgraded
 * connection, a response still streaming): the request's API key revoked, the port's token changed
 * or the port no longer public (for a request the token or the port's being public let in) ends it. */
struct port_grant;
bool port_grant_valid(struct port_grant *g); /* NULL: valid */
void port_grant_free(struct port_grant *g);
/* A grant of API key key_id of control c (valid until the key is revoked). */
struct port_grant *port_grant_key(struct moat_control *c, const char *key_id);
/* Decides a proxied request's access: *org (caller frees), *how and, unless grant is NULL, *grant
 * (caller frees with port_grant_free) on success. */
int ports_authorize(struct ports_state *ps, struct moat_control *c, const char *method, const char *id,
                    unsigned port, const char *xkey, const char *bearer, const char *token, char **org,
                    enum port_auth *how, struct port_grant **grant, moat_error **err);
/* The port token a request presents: the X-Moat-Port-Token header, else ?moat_token= (*from_query
 * set), else the moat_port_token cookie; NULL when none. Borrowed from the connection. */
const char *ports_request_token(struct MHD_Connection *c, bool *from_query);
/* "moat_port_token=TOKEN; Path=PATH; HttpOnly; SameSite=Lax" (caller frees): a token that came in
 * the URL is kept by the browser for the pages and requests that follow. */
char *ports_token_cookie(const char *token, const char *path);
/* The request target without the moat_token query parameter (caller frees). */
char *ports_strip_token(const char *target);
/* The idle connections of the api's front end (e2b.c forwards through them too). */
struct port_pool *ports_pool(const struct ports_state *ps);
struct port_pool *ports_pool_of(const struct moat_api *a);

/* ---- the proxy listener (proxy.c) ---- */

/* Started by the ports front end when cfg->proxy_listen is set: serves cfg->proxy_listen with the
 * api's caps and gate, deciding access with ps's settings. */
struct moat_proxy;
int ports_proxy_start(struct moat_proxy **out, struct moat_api *api, struct ports_state *ps,
                      const struct moat_api_config *cfg, moat_error **err);
unsigned ports_proxy_port(const struct moat_proxy *p);
void ports_proxy_stop(struct moat_proxy *p); /* NULL: nothing */

/* ---- routes (ports.c): ports/{P} settings, and ports/{P}/... proxied to the sandbox's server ---- */
int api_h_ports_list(struct api_req *r, json_t *body);
int api_h_port_get(struct api_req *r, json_t *body);
int api_h_port_expose(struct api_req *r, json_t *body);
int api_h_port_unexpose(struct api_req *r, json_t *body);
extern const struct api_front api_front_ports;

#endif

/* envd.h -- what the files of E2B's in-sandbox daemon (envd, port 49983) share:
 * connect.c (the Connect protocol: unary JSON replies, errors, server streams),
 * envd.c (routing, REST /health and /files), envd_fs.c (filesystem.Filesystem) and
 * envd_process.c (process.Process).
 *
 * Connect protocol (connectrpc.com/docs/protocol), JSON codec only, as the e2b SDK's
 * createConnectTransport({useBinaryFormat: false}) speaks it over HTTP/1.1:
 *   unary:  POST /pkg.Service/Method, Content-Type application/json, body one JSON message;
 *           200 + JSON, or an HTTP error status + {"code": "not_found", "message": "..."}.
 *   server stream: Content-Type application/connect+json; the request body and every response
 *           message are enveloped (u8 flags, u32 big-endian length, JSON); the last response
 *           envelope has flag 0x02 and carries {} or {"error": {"code", "message"}}; the HTTP
 *           status is 200 even for errors.
 * Field names are protobuf JSON (lowerCamelCase), 64-bit integers strings, bytes base64. */
#ifndef MOAT_E2B_ENVD_H
#define MOAT_E2B_ENVD_H

#include "../../common/buf.h"
#include "e2b_internal.h"

#define ENVD_DEFAULT_USER "user"        /* E2B's default user; moat's templates have it (uid 1000) */
#define ENVD_DISCARD_MAX (64u << 20)    /* body bytes read past a refused upload before closing */
#define ENVD_MAX_TIMEOUT_MS 2592000000u /* 30 days: the longest sandbox TTL; fits the guest's u32 */

/* ---- Connect codes (connect.c) ---- */

/* The HTTP status Connect uses for a code ("not_found" -> 404, ...); 500 for unknown codes. */
unsigned cx_code_http(const char *code);
/* The Connect code for an errno-like status of a moat_error. */
const char *cx_errno_code(int status);

/* Unary replies: JSON message (consumed) with 200, or a Connect error. */
int cx_reply(struct api_req *r, json_t *msg);
int cx_reply_error(struct api_req *r, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Maps (*err)->status with cx_errno_code; frees *err. */
int cx_reply_moat_error(struct api_req *r, moat_error **err);

/* Appends one envelope (flags, JSON of msg; msg consumed) to b. */
void cx_frame(struct moat_buf *b, unsigned flags, json_t *msg);
/* Parses a request body that holds exactly one uncompressed envelope. -1 EINVAL otherwise. */
int cx_unwrap(const char *body, size_t len, json_t **out, moat_error **err);

/* ---- server streams (connect.c) ---- */

/* One server-stream response. The stream's owner fills `pull` and `ctx`; the callback runs on the
 * connection's thread whenever the output buffer is empty and appends messages with cx_send /
 * ends the stream with cx_end. */
struct cx_stream {
  struct moat_api *api;
  int client_fd;       /* not owned */
  struct moat_buf out; /* envelopes not yet handed to MHD */
  size_t out_pos;
  bool done;                /* the end-of-stream envelope is in out */
  bool cut;                 /* once out is sent, reset the connection without an end (sandbox gone) */
  uint64_t last_ns;         /* last byte handed to MHD */
  uint64_t deadline_ns;     /* Connect-Timeout-Ms; 0 = none */
  uint64_t keepalive_ns;    /* Keepalive-Ping-Interval; 0 = none */
  json_t *keepalive;        /* the keepalive message (owned) */
  struct api_key_watch key; /* the stream ends (unauthenticated) once its key is revoked */
  /* Waits up to timeout_ms for something to send and appends it (or ends the stream). */
  void (*pull)(struct cx_stream *s, int timeout_ms);
  /* Called once the deadline passed, before the deadline_exceeded end (may be NULL). */
  void (*on_deadline)(struct cx_stream *s);
  void (*ctx_free)(void *ctx);
  void *ctx;
};

/* A new stream for r: deadline from Connect-Timeout-Ms, keepalive from Keepalive-Ping-Interval. */
struct cx_stream *cx_stream_new(struct api_req *r, json_t *keepalive);
void cx_send(struct cx_stream *s, json_t *msg);
/* Ends the stream: code NULL for success. */
void cx_end(struct cx_stream *s, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void cx_end_moat_error(struct cx_stream *s, moat_error **err);
/* Queues the 200 application/connect+json response; s is owned by it from here on (also on
 * failure). */
int cx_stream_reply(struct api_req *r, struct cx_stream *s);
/* A stream that ends at once with an error (nothing sent before). */
int cx_stream_error(struct api_req *r, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- envd request state (envd.c) ---- */

struct envd_req {
  struct e2b_req *e;
  char *method;     /* "Start" ... (RPC) */
  bool proc;        /* process.Process (else filesystem.Filesystem) */
  bool stream;      /* application/connect+json */
  const char *user; /* points into user_buf, or ENVD_DEFAULT_USER */
  char user_buf[API_MAX_USER + 1];
  bool check_user; /* envd_guest checks that the user exists (unauthenticated otherwise) */
  struct moat_buf body;
  /* POST /files */
  struct envd_upload *up;
  /* POST /files refused before its body was read: the reply waits until the body is in (an early
   * reply with the body unread makes the close reset the connection, and the client may lose the
   * answer); what arrives meanwhile is discarded, up to ENVD_DISCARD_MAX. */
  bool defer_errors;
  unsigned deferred_status;
  char *deferred_msg;
  uint64_t discarded;
};

/* The guest socket of the request's sandbox (caller frees) and, with env, the sandbox env. With
 * q->check_user, a user the sandbox does not know is EKEYREJECTED (envd's "invalid username",
 * Connect's unauthenticated, HTTP 401). */
struct moat_guest_ep *envd_guest(struct api_req *r, struct envd_req *q, char ***env, moat_error **err);
/* False when the sandbox's /etc/passwd (cached a few seconds) has no such user; true when it
 * does or cannot be read (the guest then decides). */
bool envd_user_known(struct envd_fs_state *fs, const struct moat_guest_ep *sock, const char *user);

/* process.Process/<method> (envd_process.c): body is the parsed request message. */
void envd_process(struct api_req *r, struct envd_req *q, json_t *body);
/* filesystem.Filesystem/<method> (envd_fs.c). */
void envd_filesystem(struct api_req *r, struct envd_req *q, json_t *body);
/* Is method of service a server stream? */
bool envd_is_stream(const char *service, const char *method);

/* Reads a non-negative integer field of a protobuf JSON message (number or decimal string).
 * 0 with *out (def when absent), -1 EINVAL naming the field. */
int envd_json_uint(json_t *msg, const char *field, uint64_t max, uint64_t def, uint64_t *out,
                   moat_error **err);
/* A string field: NULL when absent; -1 EINVAL when not a string. */
int envd_json_str(json_t *msg, const char *field, const char **out, moat_error **err);

#endif

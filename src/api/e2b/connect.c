/* connect.c -- the Connect protocol (JSON codec) for E2B's envd: replies, errors, streams
 *
 * A server stream is an MHD callback response of unknown size (chunked), run on the connection's
 * own thread like v1/stream.c's SSE streams: when its buffer is empty the callback asks the
 * stream's owner to pull the next guest event (short timeout), checks the client socket for a
 * hang-up, the Connect-Timeout-Ms deadline and moatd's shutdown, and sends the owner's keepalive
 * message after Keepalive-Ping-Interval seconds of silence (the SDK asks for 50).
 */
#include <errno.h>
#include <microhttpd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../common/log.h"
#include "envd.h"

#define CX_BLOCK (64 * 1024)
#define CX_POLL_MS 500

static const struct {
  const char *code;
  unsigned http;
} cx_codes[] = {
    {"canceled", 499},
    {"unknown", 500},
    {"invalid_argument", 400},
    {"deadline_exceeded", 504},
    {"not_found", 404},
    {"already_exists", 409},
    {"permission_denied", 403},
    {"resource_exhausted", 429},
    {"failed_precondition", 400},
    {"aborted", 409},
    {"out_of_range", 400},
    {"unimplemented", 501},
    {"internal", 500},
    {"unavailable", 503},
    {"data_loss", 500},
    {"unauthenticated", 401},
};

unsigned cx_code_http(const char *code) {
  for (size_t i = 0; i < sizeof(cx_codes) / sizeof(cx_codes[0]); i++)
    if (strcmp(code, cx_codes[i].code) == 0)
      return cx_codes[i].http;
  return 500;
}

const char *cx_errno_code(int status) {
  switch (status) {
  case ENOENT:
  case ESRCH:
    return "not_found";
  case EINVAL:
  case ENOTDIR:
  case EISDIR:
  case ENAMETOOLONG:
  case ELOOP:
  case ENOTEMPTY:
  case EXDEV:
  case EBADMSG:
  case ENOTTY:
    return "invalid_argument";
  case EEXIST:
    return "already_exists";
  case EACCES:
  case EPERM:
  case EROFS:
    return "permission_denied";
  case ENOSPC:
  case EDQUOT:
  case EMSGSIZE:
  case E2BIG:
  case EFBIG:
  case EAGAIN:
  case API_E_TOO_MANY:
    return "resource_exhausted";
  case ENOSYS:
  case EOPNOTSUPP:
    return "unimplemented";
  case EBUSY:
    return "failed_precondition";
  case ETIMEDOUT:
    return "deadline_exceeded";
  case EKEYREJECTED:
    return "unauthenticated";
  case ECONNREFUSED:
  case ECONNRESET:
  case EPIPE:
  case EPROTO:
    return "unavailable";
  default:
    return "internal";
  }
}

int cx_reply(struct api_req *r, json_t *msg) {
  char *s = json_dumps(msg, JSON_COMPACT);
  json_decref(msg);
  if (!s)
    abort(); /* out of memory only */
  struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(s), s, MHD_RESPMEM_MUST_FREE);
  if (!resp) {
    free(s);
    return -1;
  }
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
  int ret = api_reply_response(r, 200, resp);
  MHD_destroy_response(resp);
  return ret;
}

static int reply_error_v(struct api_req *r, const char *code, const char *fmt, va_list ap) {
  char msg[1024];
  vsnprintf(msg, sizeof(msg), fmt, ap);
  unsigned http = cx_code_http(code);
  if (http >= 500)
    log_warn("%s %s: %s: %s", r->method, r->path ? r->path : "?", code, msg);
  return api_reply_json(r, http, json_pack("{s:s, s:o}", "code", code, "message", api_str_json(msg)));
}

int cx_reply_error(struct api_req *r, const char *code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int ret = reply_error_v(r, code, fmt, ap);
  va_end(ap);
  return ret;
}

int cx_reply_moat_error(struct api_req *r, moat_error **err) {
  int ret = cx_reply_error(r, cx_errno_code(*err ? (*err)->status : 0), "%s", moat_error_msg(*err));
  moat_error_free(err);
  return ret;
}

void cx_frame(struct moat_buf *b, unsigned flags, json_t *msg) {
  char *js = json_dumps(msg, JSON_COMPACT);
  json_decref(msg);
  if (!js)
    abort();
  size_t n = strlen(js);
  unsigned char hdr[5] = {(unsigned char)flags, (unsigned char)(n >> 24), (unsigned char)(n >> 16),
                          (unsigned char)(n >> 8), (unsigned char)n};
  moat_buf_append(b, hdr, 5);
  moat_buf_append(b, js, n);
  free(js);
}

int cx_unwrap(const char *body, size_t len, json_t **out, moat_error **err) {
  if (len < 5)
    return moat_error_set(err, EINVAL, "a streaming request needs one enveloped message (%zu bytes received)",
                          len);
  const unsigned char *p = (const unsigned char *)body;
  if (p[0] & 0x01)
    return moat_error_set(err, EINVAL, "compressed messages are not supported");
  if (p[0] != 0)
    return moat_error_set(err, EINVAL, "unexpected envelope flags 0x%02x", p[0]);
  size_t n = ((size_t)p[1] << 24) | ((size_t)p[2] << 16) | ((size_t)p[3] << 8) | p[4];
  if (n != len - 5)
    return moat_error_set(err, EINVAL,
                          "the request must hold exactly one message (envelope of %zu bytes, body of %zu)", n,
                          len - 5);
  json_error_t je;
  json_t *j = json_loadb(body + 5, n, 0, &je);
  if (!j)
    return moat_error_set(err, EINVAL, "invalid JSON message: %s", je.text);
  if (!json_is_object(j)) {
    json_decref(j);
    return moat_error_set(err, EINVAL, "the message must be a JSON object");
  }
  *out = j;
  return 0;
}

/* ---- streams ---- */

struct cx_stream *cx_stream_new(struct api_req *r, json_t *keepalive) {
  struct cx_stream *s = xcalloc(1, sizeof(*s));
  s->api = r->api;
  s->client_fd = api_conn_fd(r);
  s->last_ns = now_ns();
  s->keepalive = keepalive;
  api_key_watch_init(&s->key, r);
  const char *t = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Connect-Timeout-Ms");
  uint64_t v;
  if (t && parse_u64(t, &v) == 0 && v > 0)
    s->deadline_ns = s->last_ns + (v > ENVD_MAX_TIMEOUT_MS ? ENVD_MAX_TIMEOUT_MS : v) * 1000000ULL;
  const char *k = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Keepalive-Ping-Interval");
  if (keepalive && k && parse_u64(k, &v) == 0 && v > 0)
    s->keepalive_ns = (v > 3600 ? 3600 : v) * 1000000000ULL;
  return s;
}

void cx_send(struct cx_stream *s, json_t *msg) { cx_frame(&s->out, 0, msg); }

static void end_v(struct cx_stream *s, const char *code, const char *fmt, va_list ap) {
  if (s->done)
    return;
  json_t *m = json_object();
  if (code) {
    char msg[1024];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    json_object_set_new(m, "error", json_pack("{s:s, s:o}", "code", code, "message", api_str_json(msg)));
  }
  cx_frame(&s->out, 0x02, m);
  s->done = true;
}

void cx_end(struct cx_stream *s, const char *code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  end_v(s, code, fmt, ap);
  va_end(ap);
}

void cx_end_moat_error(struct cx_stream *s, moat_error **err) {
  cx_end(s, cx_errno_code(*err ? (*err)->status : 0), "%s", moat_error_msg(*err));
  moat_error_free(err);
}

static ssize_t stream_cb(void *cls, uint64_t pos, char *buf, size_t max) {
  struct cx_stream *s = cls;
  for (;;) {
    if (s->out_pos < s->out.len) {
      size_t n = s->out.len - s->out_pos;
      if (n > max)
        n = max;
      memcpy(buf, s->out.p + s->out_pos, n);
      s->out_pos += n;
      s->last_ns = now_ns();
      return (ssize_t)n;
    }
    s->out.len = s->out_pos = 0;
    if (s->cut) {
      api_conn_reset(s->client_fd);
      return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    if (s->done)
      return MHD_CONTENT_READER_END_OF_STREAM;
    if (api_stopping(s->api)) {
      cx_end(s, "unavailable", "moatd is stopping");
      continue;
    }
    if (api_key_watch_revoked(&s->key)) {
      cx_end(s, "unauthenticated", "the API key of this stream was revoked");
      continue;
    }
    if (api_client_gone(s->client_fd))
      return MHD_CONTENT_READER_END_WITH_ERROR;
    uint64_t now = now_ns();
    if (s->deadline_ns && now >= s->deadline_ns) {
      if (s->on_deadline)
        s->on_deadline(s);
      cx_end(s, "deadline_exceeded", "the request's timeout (Connect-Timeout-Ms) passed");
      continue;
    }
    if (s->keepalive_ns && now - s->last_ns >= s->keepalive_ns) {
      cx_send(s, json_incref(s->keepalive));
      continue;
    }
    int wait = CX_POLL_MS;
    if (s->deadline_ns && (s->deadline_ns - now) / 1000000 < (uint64_t)wait)
      wait = (int)((s->deadline_ns - now) / 1000000) + 1;
    s->pull(s, wait);
  }
}

static void stream_free(void *cls) {
  struct cx_stream *s = cls;
  if (s->ctx_free)
    s->ctx_free(s->ctx);
  json_decref(s->keepalive);
  free(s->out.p);
  free(s);
}

int cx_stream_reply(struct api_req *r, struct cx_stream *s) {
  struct MHD_Response *resp =
      MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, CX_BLOCK, stream_cb, s, stream_free);
  if (!resp) {
    stream_free(s);
    return cx_reply_error(r, "internal", "could not create a response");
  }
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/connect+json");
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
  MHD_add_response_header(resp, "X-Accel-Buffering", "no");
  int ret = api_reply_response(r, 200, resp);
  MHD_destroy_response(resp); /* MHD keeps its reference; stream_free runs when it is done */
  return ret;
}

static void pull_nothing(struct cx_stream *s, int timeout_ms) {
  cx_end(s, "internal", "stream without a source");
}

int cx_stream_error(struct api_req *r, const char *code, const char *fmt, ...) {
  struct cx_stream *s = cx_stream_new(r, NULL);
  s->pull = pull_nothing;
  va_list ap;
  va_start(ap, fmt);
  end_v(s, code, fmt, ap);
  va_end(ap);
  if (cx_code_http(code) >= 500)
    log_warn("%s %s: %s", r->method, r->path ? r->path : "?", code);
  return cx_stream_reply(r, s);
}

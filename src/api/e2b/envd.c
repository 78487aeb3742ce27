/* envd.c -- E2B's in-sandbox daemon (envd, port 49983) on moat's guest: routing, the user,
 * REST GET /health, GET /files, POST /files, and the hand-off of Connect calls
 *
 * e2b.c hands every port-49983 call here once the sandbox is resolved and the caller
 * authenticated (X-Access-Token). The user a call acts as is E2B's: "Authorization: Basic
 * base64(USER:)" on RPCs, ?username= on /files, else ENVD_DEFAULT_USER ("user", uid 1000 in
 * moat's templates, as in E2B's). A user the sandbox's /etc/passwd lacks is envd's "invalid
 * username" (unauthenticated / 401: the SDK's AuthenticationError); a template without "user"
 * answers so to calls that do not name root. Paths are resolved by the guest against the user's
 * home and inside the sandbox's root, as envd does (".." cannot leave the sandbox).
 */
#include <errno.h>
#include <microhttpd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "../../common/log.h"
#include "envd.h"
#include "multipart.h"

#define ENVD_MAX_FILES 1024 /* parts of one multipart upload */

/* ---- small JSON readers ---- */

int envd_json_uint(json_t *msg, const char *field, uint64_t max, uint64_t def, uint64_t *out,
                   moat_error **err) {
  json_t *v = json_object_get(msg, field);
  uint64_t n;
  if (!v || json_is_null(v)) {
    *out = def;
    return 0;
  }
  if (json_is_integer(v) && json_integer_value(v) >= 0)
    n = (uint64_t)json_integer_value(v);
  else if (!json_is_string(v) || parse_u64(json_string_value(v), &n) < 0)
    return moat_error_set(err, EINVAL, "field '%s' must be a non-negative integer", field);
  if (n > max)
    return moat_error_set(err, EINVAL, "field '%s' must be at most %llu", field, (unsigned long long)max);
  *out = n;
  return 0;
}

int envd_json_str(json_t *msg, const char *field, const char **out, moat_error **err) {
  json_t *v = json_object_get(msg, field);
  *out = NULL;
  if (!v || json_is_null(v))
    return 0;
  if (!json_is_string(v))
    return moat_error_set(err, EINVAL, "field '%s' must be a string", field);
  if (strlen(json_string_value(v)) != json_string_length(v))
    return moat_error_set(err, EINVAL, "field '%s' contains a NUL byte", field);
  *out = json_string_value(v);
  return 0;
}

struct moat_guest_ep *envd_guest(struct api_req *r, struct envd_req *q, char ***env, moat_error **err) {
  struct moat_guest_ep *sock = NULL;
  if (moat_control_guest(api_control(r), q->e->org, q->e->sandbox_id, &sock, env, err) < 0) {
    /* The sandbox was resolved by e2b.c: it went away or is not running (paused). E2B's proxy
     * answers 502 then, which the SDK maps like Connect's "unavailable". */
    if (*err && ((*err)->status == ENOENT || (*err)->status == EBUSY))
      (*err)->status = ECONNREFUSED;
    return NULL;
  }
  if (q->check_user && !envd_user_known(e2b_state(r)->fs, sock, q->user)) {
    moat_error_set(err, EKEYREJECTED, "invalid username: '%s'%s", q->user,
                   q->user == q->user_buf ? "" : " (E2B's default user: the template needs it)");
    free(sock);
    if (env) {
      strv_free(*env);
      *env = NULL;
    }
    return NULL;
  }
  return sock;
}

/* ---- REST ---- */

/* envd's REST errors: {"code": HTTP status, "message"}. */
static int rest_error(struct api_req *r, unsigned status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int rest_error(struct api_req *r, unsigned status, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  struct e2b_req *e = r->front;
  struct envd_req *q = e ? e->sub : NULL;
  if (q && q->defer_errors) { /* the first error waits for the end of the body */
    if (!q->deferred_msg) {
      q->deferred_status = status;
      q->deferred_msg = xstrdup(msg);
    }
    return 0;
  }
  return api_reply_json(r, status,
                        json_pack("{s:i, s:o}", "code", (int)status, "message", api_str_json(msg)));
}

static unsigned rest_status(int st) {
  if (st == ENOSPC || st == EDQUOT)
    return 507; /* the SDK's NotEnoughSpaceError */
  if (st == EKEYREJECTED)
    return 401; /* an unknown user */
  const char *code;
  return api_errno_http(st, &code);
}

static int rest_moat_error(struct api_req *r, moat_error **err) {
  int ret = rest_error(r, rest_status(*err ? (*err)->status : 0), "%s", moat_error_msg(*err));
  moat_error_free(err);
  return ret;
}

/* ?path= and ?username= of /files. -1 after replying. */
static int files_args(struct api_req *r, struct envd_req *q, const char **path, bool path_required) {
  static const char *const allowed[] = {"path", "username", "signature", "signature_expiration", NULL};
  moat_error *err = NULL;
  if (api_args_check(&r->args, allowed, &err) < 0)
    return rest_moat_error(r, &err), -1;
  if (api_arg_get(&r->args, "signature"))
    return rest_error(r, 400, "signed file URLs are not supported; use the access token"), -1;
  q->check_user = true;
  const char *u = api_arg_get(&r->args, "username");
  if (u && *u) {
    if (api_check_user("username", u, &err) < 0)
      return rest_moat_error(r, &err), -1;
    snprintf(q->user_buf, sizeof(q->user_buf), "%s", u);
    q->user = q->user_buf;
  }
  *path = api_arg_get(&r->args, "path");
  if (*path && !**path)
    *path = NULL;
  if (!*path && path_required)
    return rest_error(r, 400, "query parameter 'path' is required"), -1;
  if (*path && api_check_path("path", *path, strlen(*path), &err) < 0)
    return rest_moat_error(r, &err), -1;
  return 0;
}

static void files_get(struct api_req *r, struct envd_req *q) {
  const char *path;
  moat_error *err = NULL;
  if (files_args(r, q, &path, true) < 0)
    return;
  _cleanup_free_ struct moat_guest_ep *sock = envd_guest(r, q, NULL, &err);
  if (!sock) {
    rest_moat_error(r, &err);
    return;
  }
  struct moat_guest_reader *rd = NULL;
  uint64_t size = 0;
  if (moat_guest_read_open(sock, path, q->user, &rd, &size, &err) < 0) {
    if (err->status == EISDIR)
      rest_error(r, 400, "path '%.1024s' is a directory", path), moat_error_free(&err);
    else
      rest_moat_error(r, &err);
    return;
  }
  _cleanup_free_ char *desc = xasprintf("%s:%.256s", q->e->sandbox_id, path);
  struct MHD_Response *resp = api_file_response(rd, size, desc);
  if (!resp) {
    rest_error(r, 500, "could not create a response");
    return;
  }
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/octet-stream");
  api_reply_response(r, 200, resp);
  MHD_destroy_response(resp);
}

/* POST /files: multipart/form-data (one part "file" per file; its filename is the path when the
 * query has none; other parts are skipped) or application/octet-stream (the body is the file at
 * ?path=, possibly Content-Encoding: gzip, which the SDK's write(..., {gzip: true}) sends). Every
 * file streams to a guest writer as it arrives; nothing is buffered whole. */
struct envd_upload {
  struct moat_guest_ep *sock;
  const char *user;  /* borrowed from the envd_req */
  const char *qpath; /* ?path= (borrowed from r->args) or NULL */
  bool multipart;
  struct mp_parser mp;
  z_stream *gz; /* Content-Encoding: gzip (octet-stream): inflated as it arrives */
  bool gz_end;  /* the last gzip member ended */
  struct moat_guest_writer *w;
  char *cur_path;
  bool skip; /* the current part is not "file" */
  size_t nfiles;
  json_t *written; /* [{name, type, path}] */
};

static void upload_free(struct envd_upload *u) {
  if (!u)
    return;
  if (u->w)
    moat_guest_writer_close(u->w); /* an unfinished file is discarded */
  free(u->sock);
  mp_free(&u->mp);
  if (u->gz) {
    inflateEnd(u->gz);
    free(u->gz);
  }
  free(u->cur_path);
  json_decref(u->written);
  free(u);
}

/* E2B's envd runs as root: an upload as another user into directories that do not exist yet gets
 * them made (by root, wherever they are) and handed to that user. Here: the missing directories
 * of absolute path's parent are made as root in the sandbox and chowned (-R from the first missing
 * one) to user. The sandbox's root is reachable through the same API (user "root"), so this gives
 * the caller nothing it did not have. 0 when made, -1 otherwise. */
static int make_parents_for(struct envd_upload *u, const char *path) {
  if (path[0] != '/' || strcmp(u->user, "root") == 0)
    return -1;
  _cleanup_free_ char *dir = xstrdup(path);
  char *slash = strrchr(dir, '/');
  if (!slash || slash == dir)
    return -1;
  *slash = '\0';
  /* the first missing ancestor: walk up while stat (as root) says ENOENT */
  _cleanup_free_ char *first = NULL;
  _cleanup_free_ char *probe = xstrdup(dir);
  for (;;) {
    struct moat_file_entry e;
    memset(&e, 0, sizeof(e));
    moat_error *serr = NULL;
    int rc = moat_guest_stat(u->sock, probe, "root", &e, &serr);
    moat_file_entry_clear(&e);
    bool missing = rc < 0 && serr && serr->status == ENOENT;
    moat_error_free(&serr);
    if (rc == 0)
      break;
    if (!missing)
      return -1;
    free(first);
    first = xstrdup(probe);
    char *s = strrchr(probe, '/');
    if (!s || s == probe)
      break;
    *s = '\0';
  }
  if (!first)
    return -1;
  _cleanup_free_ char *owner = xasprintf("%s:", u->user);
  char *argv[] = {"/bin/sh", "-c", "mkdir -p -- \"$1\" && chown -R -- \"$2\" \"$3\"", "sh", dir, owner,
                  first,     NULL};
  struct moat_exec_req req = {.argv = argv, .user = NULL, .timeout_ms = 30000, .max_output = 4096};
  struct moat_exec_result res;
  memset(&res, 0, sizeof(res));
  moat_error *xerr = NULL;
  int rc = moat_guest_exec(u->sock, &req, &res, &xerr);
  bool ok = rc == 0 && res.exit_code == 0;
  moat_error_free(&xerr);
  moat_exec_result_free(&res);
  return ok ? 0 : -1;
}

static int part_open(struct envd_upload *u, const char *path, moat_error **err) {
  if (api_check_path("path", path, strlen(path), err) < 0)
    return -1;
  if (++u->nfiles > ENVD_MAX_FILES)
    return moat_error_set(err, E2BIG, "more than %d files in one upload", ENVD_MAX_FILES);
  moat_error *oerr = NULL;
  int orc = moat_guest_write_open(u->sock, path, u->user, 0644, &u->w, &oerr);
  if (orc < 0 && oerr && (oerr->status == EACCES || oerr->status == EPERM) &&
      make_parents_for(u, path) == 0) {
    moat_error_free(&oerr);
    orc = moat_guest_write_open(u->sock, path, u->user, 0644, &u->w, &oerr);
  }
  if (orc < 0) {
    u->w = NULL;
    if (err && !*err)
      *err = oerr;
    else
      moat_error_free(&oerr);
    return -1;
  }
  free(u->cur_path);
  u->cur_path = xstrdup(path);
  return 0;
}

static int part_write(struct envd_upload *u, const char *p, size_t n, moat_error **err) {
  if (!u->w)
    return moat_error_set(err, EIO, "upload already failed");
  if (moat_guest_write_chunk(u->w, p, n, err) < 0) {
    moat_guest_writer_close(u->w); /* discards the partial file */
    u->w = NULL;
    return -1;
  }
  return 0;
}

/* Renames the file into place and adds its entry to u->written. */
static int part_finish(struct envd_upload *u, moat_error **err) {
  if (!u->w)
    return 0;
  uint64_t written = 0;
  int rc = moat_guest_write_finish(u->w, &written, err);
  moat_guest_writer_close(u->w);
  u->w = NULL;
  if (rc < 0)
    return -1;
  struct moat_file_entry e;
  memset(&e, 0, sizeof(e));
  moat_error *serr = NULL;
  const char *path = u->cur_path;
  if (moat_guest_stat(u->sock, u->cur_path, u->user, &e, &serr) == 0 && e.path)
    path = e.path; /* absolute: relative paths are against the user's home */
  moat_error_free(&serr);
  const char *slash = strrchr(path, '/');
  json_array_append_new(u->written,
                        json_pack("{s:o, s:s, s:o}", "name", api_str_json(slash ? slash + 1 : path), "type",
                                  "file", "path", api_str_json(path)));
  moat_file_entry_clear(&e);
  return 0;
}

static int mp_begin(void *ctx, const char *name, const char *filename, moat_error **err) {
  struct envd_upload *u = ctx;
  u->skip = !name || strcmp(name, "file") != 0;
  if (u->skip)
    return 0;
  const char *path = u->qpath ? u->qpath : filename;
  if (!path || !*path)
    return moat_error_set(err, EINVAL, "a file part needs a path (?path= or the part's filename)");
  return part_open(u, path, err);
}

static int mp_data(void *ctx, const char *p, size_t n, moat_error **err) {
  struct envd_upload *u = ctx;
  return u->skip ? 0 : part_write(u, p, n, err);
}

static int mp_end(void *ctx, moat_error **err) {
  struct envd_upload *u = ctx;
  return u->skip ? 0 : part_finish(u, err);
}

static const struct mp_callbacks upload_cb = {.begin = mp_begin, .data = mp_data, .end = mp_end};

/* Inflates a gzip body's bytes into the file (members may follow each other, as gzip allows). */
static int gunzip_write(struct envd_upload *u, const char *data, size_t len, moat_error **err) {
  char out[64 * 1024];
  z_stream *z = u->gz;
  z->next_in = (Bytef *)data;
  z->avail_in = (uInt)len;
  int rc;
  do {
    if (u->gz_end && z->avail_in > 0) { /* the next member */
      inflateReset(z);
      u->gz_end = false;
    }
    z->next_out = (Bytef *)out;
    z->avail_out = sizeof(out);
    rc = inflate(z, Z_NO_FLUSH);
    if (rc != Z_OK && rc != Z_STREAM_END && rc != Z_BUF_ERROR)
      return moat_error_set(err, EINVAL, "the gzip body is corrupt: %s", z->msg ? z->msg : "inflate failed");
    size_t n = sizeof(out) - z->avail_out;
    if (n > 0 && part_write(u, out, n, err) < 0)
      return -1;
    if (rc == Z_STREAM_END)
      u->gz_end = true;
  } while (z->avail_out == 0 || (z->avail_in > 0 && rc != Z_BUF_ERROR));
  return 0;
}

static int upload_chunk(struct envd_req *q, const char *data, size_t len, moat_error **err) {
  struct envd_upload *u = q->up;
  if (u->multipart)
    return mp_feed(&u->mp, data, len, &upload_cb, u, err);
  if (u->gz)
    return gunzip_write(u, data, len, err);
  return part_write(u, data, len, err);
}

static void upload_finish(struct api_req *r, struct envd_req *q) {
  struct envd_upload *u = q->up;
  moat_error *err = NULL;
  if (u->multipart) {
    if (!mp_done(&u->mp)) {
      rest_error(r, 400, "the multipart body ended before its closing boundary");
      return;
    }
    if (json_array_size(u->written) == 0) {
      rest_error(r, 400, "no 'file' part in the multipart body");
      return;
    }
  } else if (u->gz && !u->gz_end) {
    rest_error(r, 400, "the gzip body ended early (truncated)");
    return;
  } else if (part_finish(u, &err) < 0) {
    rest_moat_error(r, &err);
    return;
  }
  api_reply_json(r, 200, json_incref(u->written));
}

static enum MHD_Result find_metadata(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
  if (strncasecmp(key, "X-Metadata-", 11) == 0) {
    *(bool *)cls = true;
    return MHD_NO;
  }
  return MHD_YES;
}

/* Sets up POST /files; -1 after replying. */
static int upload_begin(struct api_req *r, struct envd_req *q) {
  const char *path;
  moat_error *err = NULL;
  if (files_args(r, q, &path, false) < 0)
    return -1;
  bool meta = false;
  MHD_get_connection_values(r->conn, MHD_HEADER_KIND, find_metadata, &meta);
  if (meta)
    return rest_error(r, 400, "file metadata (X-Metadata-* headers) is not supported by moat"), -1;
  const char *enc = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_ENCODING);
  bool gzip = enc && strcasecmp(enc, "gzip") == 0;
  if (enc && !gzip && strcasecmp(enc, "identity") != 0)
    return rest_error(r, 400, "Content-Encoding %.64s is not supported (gzip or identity)", enc), -1;
  const char *ct = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
  struct envd_upload *u = xcalloc(1, sizeof(*u));
  q->up = u;
  u->written = json_array();
  u->qpath = path;
  u->user = q->user;
  if (ct && strncasecmp(ct, "multipart/form-data", 19) == 0) {
    if (gzip)
      return rest_error(r, 400, "a gzip body must be application/octet-stream"), -1;
    if (mp_init(&u->mp, ct, &err) < 0)
      return rest_moat_error(r, &err), -1;
    u->multipart = true;
  } else if (ct && strncasecmp(ct, "application/octet-stream", 24) == 0) {
    if (!path)
      return rest_error(r, 400, "query parameter 'path' is required for an application/octet-stream upload"),
             -1;
  } else {
    return rest_error(r, 400, "Content-Type must be multipart/form-data or application/octet-stream"), -1;
  }
  u->sock = envd_guest(r, q, NULL, &err);
  if (!u->sock)
    return rest_moat_error(r, &err), -1;
  if (gzip) {
    u->gz = xcalloc(1, sizeof(*u->gz));
    if (inflateInit2(u->gz, 16 + MAX_WBITS) != Z_OK) { /* 16: gzip framing */
      free(u->gz);
      u->gz = NULL;
      return rest_error(r, 500, "cannot set up gzip decoding"), -1;
    }
  }
  if (!u->multipart && part_open(u, path, &err) < 0)
    return rest_moat_error(r, &err), -1;
  return 0;
}

/* ---- the e2b.c hand-off ---- */

static void envd_req_free(void *p) {
  struct envd_req *q = p;
  if (!q)
    return;
  upload_free(q->up);
  free(q->deferred_msg);
  free(q->method);
  free(q->body.p);
  free(q);
}

static const char *const process_methods[] = {
    "Start", "Connect", "List", "SendInput", "SendSignal", "CloseStdin", "Update", "StreamInput", NULL};
static const char *const fs_methods[] = {"Stat",          "MakeDir",  "Move",          "ListDir",
                                         "Remove",        "WatchDir", "CreateWatcher", "GetWatcherEvents",
                                         "RemoveWatcher", NULL};

bool envd_is_stream(const char *service, const char *method) {
  if (strcmp(service, "process.Process") == 0)
    return strcmp(method, "Start") == 0 || strcmp(method, "Connect") == 0;
  return strcmp(method, "WatchDir") == 0;
}

static bool in_list(const char *const *v, const char *s) {
  for (size_t i = 0; v[i]; i++)
    if (strcmp(v[i], s) == 0)
      return true;
  return false;
}

/* "Authorization: Basic base64(USER:PASSWORD)" -> USER into q. -1 after replying. */
static int rpc_user(struct api_req *r, struct envd_req *q) {
  const char *h = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
  if (!h || strncasecmp(h, "Basic ", 6) != 0)
    return 0;
  h += 6;
  while (*h == ' ')
    h++;
  _cleanup_free_ unsigned char *dec = NULL;
  size_t n = 0;
  if (moat_base64_decode(h, strlen(h), &dec, &n) < 0)
    return cx_reply_error(r, "unauthenticated", "the Authorization header is not valid base64"), -1;
  const unsigned char *c = memchr(dec, ':', n);
  size_t ul = c ? (size_t)(c - dec) : n;
  if (ul == 0)
    return 0;
  if (ul > API_MAX_USER)
    return cx_reply_error(r, "invalid_argument", "user name longer than %d bytes", API_MAX_USER), -1;
  memcpy(q->user_buf, dec, ul);
  q->user_buf[ul] = '\0';
  q->check_user = true; /* envd's authn checks a given user on every call */
  moat_error *err = NULL;
  if (api_check_user("user", q->user_buf, &err) < 0)
    return cx_reply_moat_error(r, &err), -1;
  q->user = q->user_buf;
  return 0;
}

static bool rpc_begin(struct api_req *r, struct envd_req *q, const char *url, const char *method) {
  const char *slash = strchr(url + 1, '/');
  char service[32];
  if (!slash || (size_t)(slash - url - 1) >= sizeof(service)) {
    rest_error(r, 404, "no such path: %.256s", url);
    return true;
  }
  snprintf(service, sizeof(service), "%.*s", (int)(slash - url - 1), url + 1);
  const char *m = slash + 1;
  bool proc = strcmp(service, "process.Process") == 0, fs = strcmp(service, "filesystem.Filesystem") == 0;
  if (!proc && !fs) {
    rest_error(r, 404, "no such path: %.256s", url);
    return true;
  }
  if (!in_list(proc ? process_methods : fs_methods, m)) {
    api_reply_json(r, 404,
                   json_pack("{s:s, s:s+}", "code", "unimplemented", "message", "no such procedure: ", url));
    return true;
  }
  if (strcmp(method, "POST") != 0) {
    cx_reply_error(r, "unimplemented", "%s needs POST (GET requests are not supported)", url);
    return true;
  }
  q->method = xstrdup(m);
  q->proc = proc;
  q->check_user = !proc || strcmp(m, "Start") == 0; /* the calls that act as the user */
  q->stream = envd_is_stream(service, m);
  moat_error *err = NULL;
  if (q->stream && api_req_stream(r, &err) < 0) {
    cx_reply_moat_error(r, &err);
    return true;
  }
  const char *ct = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
  const char *want = q->stream ? "application/connect+json" : "application/json";
  size_t wl = strlen(want);
  if (!ct || strncasecmp(ct, want, wl) != 0 || (ct[wl] && ct[wl] != ';' && ct[wl] != ' ')) {
    api_reply_json(
        r, 415,
        json_pack("{s:s, s:s+}", "code", "invalid_argument", "message", "Content-Type must be ", want));
    return true;
  }
  const char *ver = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Connect-Protocol-Version");
  if (ver && strcmp(ver, "1") != 0) {
    cx_reply_error(r, "invalid_argument", "Connect-Protocol-Version must be 1");
    return true;
  }
  const char *cenc = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND,
                                                 q->stream ? "Connect-Content-Encoding" : "Content-Encoding");
  if (cenc && strcasecmp(cenc, "identity") != 0) {
    cx_reply_error(r, "unimplemented", "compression %.32s is not supported", cenc);
    return true;
  }
  const char *cl = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
  uint64_t n;
  if (cl && parse_u64(cl, &n) == 0 && n > API_MAX_BODY) {
    cx_reply_error(r, "resource_exhausted", "request message larger than %d bytes", API_MAX_BODY);
    return true;
  }
  if (rpc_user(r, q) < 0)
    return true;
  return false;
}

bool e2b_envd_begin(struct api_req *r, struct e2b_req *e, const char *url, const char *method) {
  struct envd_req *q = xcalloc(1, sizeof(*q));
  q->e = e;
  q->user = ENVD_DEFAULT_USER;
  e->sub = q;
  e->sub_free = envd_req_free;
  if (strcmp(url, "/health") == 0) {
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
      rest_error(r, 405, "method %s is not allowed on /health", method);
    else
      api_reply_empty(r, 204);
    return true;
  }
  if (strcmp(url, "/files") == 0) {
    if (strcmp(method, "GET") == 0) {
      files_get(r, q);
      return true;
    }
    if (strcmp(method, "POST") == 0) {
      q->defer_errors = true;
      upload_begin(r, q);
      q->defer_errors = false;
      return false; /* the body is read (or discarded) before any reply */
    }
    rest_error(r, 405, "method %s is not allowed on /files", method);
    return true;
  }
  if (url[0] == '/' && strchr(url + 1, '/') && strchr(url, '.'))
    return rpc_begin(r, q, url, method);
  rest_error(r, 404, "no such path: %.256s", url);
  return true;
}

/* The errno whose HTTP status (api_errno_http) is close to a deferred REST status. */
static int status_errno(unsigned status) {
  switch (status) {
  case 401:
  case 403:
    return EACCES;
  case 404:
    return ENOENT;
  case 502:
    return ECONNREFUSED;
  case 507:
    return ENOSPC;
  case 500:
    return EIO;
  default:
    return EINVAL;
  }
}

int e2b_envd_body(struct api_req *r, struct e2b_req *e, const char *data, size_t len, moat_error **err) {
  struct envd_req *q = e->sub;
  if (q->deferred_msg) {
    q->discarded += len;
    if (q->discarded > ENVD_DISCARD_MAX)
      return moat_error_set(err, status_errno(q->deferred_status), "%s", q->deferred_msg);
    return 0;
  }
  if (q->up)
    return upload_chunk(q, data, len, err);
  if (len > API_MAX_BODY - q->body.len)
    return moat_error_set(err, EMSGSIZE, "request message larger than %d bytes", API_MAX_BODY);
  moat_buf_append(&q->body, data, len);
  return 0;
}

void e2b_envd_dispatch(struct api_req *r, struct e2b_req *e) {
  struct envd_req *q = e->sub;
  if (q->deferred_msg) {
    rest_error(r, q->deferred_status, "%s", q->deferred_msg);
    return;
  }
  if (q->up) {
    upload_finish(r, q);
    return;
  }
  if (!q->method) {
    rest_error(r, 500, "request without a handler");
    return;
  }
  moat_error *err = NULL;
  json_t *body = NULL;
  if (q->stream) {
    if (cx_unwrap(q->body.p, q->body.len, &body, &err) < 0) {
      cx_stream_error(r, "invalid_argument", "%s", moat_error_msg(err));
      moat_error_free(&err);
      return;
    }
  } else if (api_body_parse(q->body.p ? q->body.p : "", q->body.len, true, &body, &err) < 0) {
    cx_reply_error(r, "invalid_argument", "%s", moat_error_msg(err));
    moat_error_free(&err);
    return;
  }
  if (q->proc)
    envd_process(r, q, body);
  else
    envd_filesystem(r, q, body);
  json_decref(body);
}

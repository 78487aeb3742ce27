/* files.c -- /v1/sandboxes/{id}/files: streamed GET/PUT, DELETE, list, stat, mkdir, move via the guest */
#include <errno.h>
#include <microhttpd.h>
#include <stdlib.h>
#include <string.h>

#include "../../common/log.h"
#include "v1.h"

/* The guest socket of the request's sandbox (caller frees), after control's org/state checks. */
static struct moat_guest_ep *guest_sock(struct api_req *r, moat_error **err) {
  struct moat_guest_ep *sock = NULL;
  if (moat_control_guest(api_control(r), r->org, r->route.id, &sock, NULL, err) < 0)
    return NULL;
  return sock;
}

/* Checks the query (allowed keys, path, user). Replies and returns -1 on a bad one. */
static int file_args(struct api_req *r, const char *const *allowed, const char **path, const char **user) {
  moat_error *err = NULL;
  if (api_args_check(&r->args, allowed, &err) < 0 ||
      (path && api_arg_path(&r->args, "path", path, &err) < 0) || api_arg_user(&r->args, user, &err) < 0) {
    api_reply_moat_error(r, &err);
    return -1;
  }
  return 0;
}

/* Replies with the entry of path (status), or, when stat fails, with fallback (may be NULL). */
static int reply_entry(struct api_req *r, const struct moat_guest_ep *sock, const char *path,
                       const char *user, unsigned status) {
  moat_error *err = NULL;
  struct moat_file_entry e;
  memset(&e, 0, sizeof(e));
  if (moat_guest_stat(sock, path, user, &e, &err) < 0)
    return api_reply_moat_error(r, &err);
  int ret = api_reply_json(r, status, api_file_entry_json(&e));
  moat_file_entry_clear(&e);
  return ret;
}

/* ---- GET: streamed from the guest in API_FILE_BLOCK pieces ---- */

int api_h_files_get(struct api_req *r, json_t *body) {
  static const char *const allowed[] = {"path", "user", NULL};
  const char *path, *user;
  moat_error *err = NULL;
  if (file_args(r, allowed, &path, &user) < 0)
    return -1;
  _cleanup_free_ struct moat_guest_ep *sock = guest_sock(r, &err);
  if (!sock)
    return api_reply_moat_error(r, &err);
  struct moat_guest_reader *rd = NULL;
  uint64_t size = 0;
  if (moat_guest_read_open(sock, path, user, &rd, &size, &err) < 0)
    return api_reply_moat_error(r, &err);
  _cleanup_free_ char *desc = xasprintf("%s:%.256s", r->route.id, path);
  struct MHD_Response *resp = api_file_response(rd, size, desc);
  if (!resp)
    return api_reply_error(r, 500, "internal", "could not create a response");
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/octet-stream");
  int ret = api_reply_response(r, 200, resp);
  MHD_destroy_response(resp); /* MHD holds its own reference until sent; read_free runs then */
  return ret;
}

/* ---- PUT: the writer opens before the body is read; every chunk goes straight to the guest ---- */

/* The request's upload (r->front). */
struct files_put {
  struct moat_guest_writer *writer; /* NULL once finished or failed */
  struct moat_guest_ep *sock;
  const char *path, *user; /* borrowed from r->args */
};

static void files_put_free(void *p) {
  struct files_put *u = p;
  if (u->writer) /* client gone or error mid-upload: nothing was renamed into place */
    moat_guest_writer_close(u->writer);
  free(u->sock);
  free(u);
}

bool api_files_put_open(struct api_req *r) {
  static const char *const allowed[] = {"path", "user", "mode", NULL};
  moat_error *err = NULL;
  uint32_t mode;
  struct files_put *u = xcalloc(1, sizeof(*u));
  r->front = u;
  r->front_free = files_put_free;
  if (file_args(r, allowed, &u->path, &u->user) < 0)
    return true;
  if (api_arg_mode(&r->args, &mode, &err) < 0)
    return api_reply_moat_error(r, &err), true;
  u->sock = guest_sock(r, &err);
  if (!u->sock)
    return api_reply_moat_error(r, &err), true;
  if (moat_guest_write_open(u->sock, u->path, u->user, mode, &u->writer, &err) < 0) {
    u->writer = NULL;
    return api_reply_moat_error(r, &err), true;
  }
  return false;
}

int api_files_put_chunk(struct api_req *r, const char *data, size_t len, moat_error **err) {
  struct files_put *u = r->front;
  if (!u->writer)
    return moat_error_set(err, EIO, "upload already failed");
  if (moat_guest_write_chunk(u->writer, data, len, err) < 0) {
    moat_guest_writer_close(u->writer); /* discards the partial file; the old one stays */
    u->writer = NULL;
    return -1;
  }
  return 0;
}

int api_files_put_finish(struct api_req *r) {
  struct files_put *u = r->front;
  moat_error *err = NULL;
  uint64_t written = 0;
  if (!u || !u->writer)
    return api_reply_error(r, 500, "internal", "upload is not open");
  int rc = moat_guest_write_finish(u->writer, &written, &err);
  moat_guest_writer_close(u->writer);
  u->writer = NULL;
  if (rc < 0)
    return api_reply_moat_error(r, &err);
  /* Report the absolute path the guest resolved (relative paths are against the user's home). */
  struct moat_file_entry e;
  memset(&e, 0, sizeof(e));
  const char *path = u->path;
  if (moat_guest_stat(u->sock, u->path, u->user, &e, &err) == 0 && e.path)
    path = e.path;
  moat_error_free(&err);
  int ret = api_reply_json(r, 200,
                           json_pack("{s:o, s:I}", "path", api_str_json(path), "size", (json_int_t)written));
  moat_file_entry_clear(&e);
  return ret;
}

/* ---- DELETE, list, stat, mkdir, move ---- */

int api_h_files_delete(struct api_req *r, json_t *body) {
  static const char *const allowed[] = {"path", "user", "recursive", NULL};
  const char *path, *user;
  bool recursive;
  moat_error *err = NULL;
  if (file_args(r, allowed, &path, &user) < 0)
    return -1;
  if (api_arg_bool(&r->args, "recursive", false, &recursive, &err) < 0)
    return api_reply_moat_error(r, &err);
  _cleanup_free_ struct moat_guest_ep *sock = guest_sock(r, &err);
  if (!sock || moat_guest_remove(sock, path, user, recursive, &err) < 0)
    return api_reply_moat_error(r, &err);
  return api_reply_empty(r, 204);
}

int api_h_files_list(struct api_req *r, json_t *body) {
  static const char *const allowed[] = {"path", "user", "depth", NULL};
  const char *path, *user;
  uint32_t depth;
  moat_error *err = NULL;
  if (file_args(r, allowed, &path, &user) < 0)
    return -1;
  if (api_arg_depth(&r->args, &depth, &err) < 0)
    return api_reply_moat_error(r, &err);
  _cleanup_free_ struct moat_guest_ep *sock = guest_sock(r, &err);
  struct moat_file_entry *v = NULL;
  size_t n = 0;
  if (!sock || moat_guest_list(sock, path, user, depth, &v, &n, &err) < 0)
    return api_reply_moat_error(r, &err);
  json_t *arr = json_array();
  for (size_t i = 0; i < n; i++)
    json_array_append_new(arr, api_file_entry_json(&v[i]));
  moat_file_entries_free(v, n);
  return api_reply_json(r, 200, json_pack("{s:o}", "entries", arr));
}

int api_h_files_stat(struct api_req *r, json_t *body) {
  static const char *const allowed[] = {"path", "user", NULL};
  const char *path, *user;
  moat_error *err = NULL;
  if (file_args(r, allowed, &path, &user) < 0)
    return -1;
  _cleanup_free_ struct moat_guest_ep *sock = guest_sock(r, &err);
  if (!sock)
    return api_reply_moat_error(r, &err);
  return reply_entry(r, sock, path, user, 200);
}

int api_h_files_mkdir(struct api_req *r, json_t *body) {
  static const char *const allowed[] = {"user", NULL};
  const char *quser;
  struct api_mkdir_req m;
  moat_error *err = NULL;
  if (file_args(r, allowed, NULL, &quser) < 0)
    return -1;
  if (api_parse_mkdir(body, quser, &m, &err) < 0)
    return api_reply_moat_error(r, &err);
  _cleanup_free_ struct moat_guest_ep *sock = guest_sock(r, &err);
  if (!sock || moat_guest_mkdir(sock, m.path, m.user, m.parents, &err) < 0)
    return api_reply_moat_error(r, &err);
  return reply_entry(r, sock, m.path, m.user, 201);
}

int api_h_files_move(struct api_req *r, json_t *body) {
  static const char *const allowed[] = {"user", NULL};
  const char *quser;
  struct api_move_req m;
  moat_error *err = NULL;
  if (file_args(r, allowed, NULL, &quser) < 0)
    return -1;
  if (api_parse_move(body, quser, &m, &err) < 0)
    return api_reply_moat_error(r, &err);
  _cleanup_free_ struct moat_guest_ep *sock = guest_sock(r, &err);
  if (!sock || moat_guest_move(sock, m.from, m.to, m.user, &err) < 0)
    return api_reply_moat_error(r, &err);
  return reply_entry(r, sock, m.to, m.user, 200);
}

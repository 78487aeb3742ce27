/* procs.c -- background exec and /v1/sandboxes/{id}/processes: list, stdin, signal, resize */
#include <errno.h>
#include <signal.h>
#include <string.h>

#include "../../common/log.h"
#include "v1.h"

struct moat_guest_ep *api_guest_sock(struct api_req *r, char ***env, moat_error **err) {
  struct moat_guest_ep *sock = NULL;
  if (moat_control_guest(api_control(r), r->org, r->route.id, &sock, env, err) < 0)
    return NULL;
  return sock;
}

int api_reply_proc_error(struct api_req *r, moat_error **err) {
  int st = *err ? (*err)->status : 0;
  const char *code = NULL;
  unsigned status = 0;
  if (st == ESRCH) {
    status = 404;
    code = "process_not_found";
  } else if (st == ENOTTY) {
    status = 400;
    code = "not_a_tty";
  } else if (st == EEXIST) {
    status = 409;
    code = "tag_in_use";
  }
  if (!code)
    return api_reply_moat_error(r, err);
  int ret = api_reply_json(r, status, api_error_json(code, moat_error_msg(*err)));
  moat_error_free(err);
  return ret;
}

int api_exec_background(struct api_req *r, struct moat_exec_req *req, const struct api_exec_extra *x) {
  moat_error *err = NULL;
  _cleanup_strv_ char **senv = NULL;
  _cleanup_free_ struct moat_guest_ep *sock = api_guest_sock(r, &senv, &err);
  if (!sock)
    return api_reply_moat_error(r, &err);
  _cleanup_strv_ char **env = strv_concat(senv, req->env);
  struct moat_exec_req rq = *req;
  rq.env = env;
  struct moat_exec_opts opts = {
      .background = true,
      .tag = x->tag,
      .pty_cols = x->pty_cols,
      .pty_rows = x->pty_rows,
      .keep_on_disconnect = true,
  };
  struct moat_proc_stream *ps = NULL;
  int pid = 0;
  if (moat_guest_exec_start(sock, &rq, &opts, &ps, &pid, &err) < 0) {
    api_exec_enoent(r, err);
    return api_reply_proc_error(r, &err);
  }
  if (ps) /* the guest closes a background exec at once; nothing more to read */
    moat_proc_stream_close(ps);
  return api_reply_json(r, 201, json_pack("{s:i, s:o}", "pid", pid, "tag", api_str_json(x->tag)));
}

int api_h_procs_list(struct api_req *r, json_t *body) {
  static const char *const none[] = {NULL};
  moat_error *err = NULL;
  if (api_args_check(&r->args, none, &err) < 0)
    return api_reply_moat_error(r, &err);
  _cleanup_free_ struct moat_guest_ep *sock = api_guest_sock(r, NULL, &err);
  if (!sock)
    return api_reply_moat_error(r, &err);
  struct moat_proc_info *v = NULL;
  size_t n = 0;
  if (moat_guest_procs(sock, &v, &n, &err) < 0)
    return api_reply_proc_error(r, &err);
  json_t *arr = json_array();
  for (size_t i = 0; i < n; i++)
    json_array_append_new(arr, api_proc_info_json(&v[i]));
  moat_proc_infos_free(v, n);
  return api_reply_json(r, 200, json_pack("{s:o}", "processes", arr));
}

/* Checks that a process route has no query and a body with only `known` fields; replies on a bad one. */
static int proc_prelude(struct api_req *r, json_t *body, const char *const *known,
                        struct moat_guest_ep **sock) {
  static const char *const none[] = {NULL};
  moat_error *err = NULL;
  if (api_args_check(&r->args, none, &err) < 0)
    return api_reply_moat_error(r, &err), -1;
  const char *k;
  json_t *v;
  json_object_foreach(body, k, v) {
    bool ok = false;
    for (size_t i = 0; known[i]; i++)
      ok = ok || strcmp(k, known[i]) == 0;
    if (!ok)
      return api_reply_error(r, 400, "invalid_request", "unknown field '%.128s'", k), -1;
  }
  *sock = api_guest_sock(r, NULL, &err);
  if (!*sock)
    return api_reply_moat_error(r, &err), -1;
  return 0;
}

static const char *route_tag(const struct api_req *r) { return r->route.tag[0] ? r->route.tag : NULL; }

int api_h_proc_stdin(struct api_req *r, json_t *body) {
  static const char *const known[] = {"data", "data_b64", "close", NULL};
  json_t *data = json_object_get(body, "data"), *b64 = json_object_get(body, "data_b64"),
         *close = json_object_get(body, "close");
  if (data && !json_is_string(data))
    return api_reply_error(r, 400, "invalid_request",
                           "field 'data' must be a string (use data_b64 for bytes)");
  if (b64 && !json_is_string(b64))
    return api_reply_error(r, 400, "invalid_request", "field 'data_b64' must be a base64 string");
  if (data && b64)
    return api_reply_error(r, 400, "invalid_request", "fields 'data' and 'data_b64' exclude each other");
  if (close && !json_is_boolean(close))
    return api_reply_error(r, 400, "invalid_request", "field 'close' must be a boolean");
  bool do_close = close && json_is_true(close);
  if (!data && !b64 && !do_close)
    return api_reply_error(r, 400, "invalid_request",
                           "one of fields 'data', 'data_b64' or 'close': true is required");
  _cleanup_free_ unsigned char *bytes = NULL;
  size_t len = 0;
  if (b64 && moat_base64_decode(json_string_value(b64), json_string_length(b64), &bytes, &len) < 0)
    return api_reply_error(r, 400, "invalid_request", "field 'data_b64' is not valid base64");
  _cleanup_free_ struct moat_guest_ep *sock = NULL;
  if (proc_prelude(r, body, known, &sock) < 0)
    return -1;
  const void *p = bytes;
  if (data) {
    p = json_string_value(data);
    len = json_string_length(data);
  }
  moat_error *err = NULL;
  if (moat_guest_proc_stdin(sock, r->route.pid, route_tag(r), p, len, do_close, &err) < 0) {
    if (err && err->status == EPIPE) {
      /* EPIPE is the guest's "stdin already closed" and also a broken connection: a guest that
       * still answers a ping means the former. */
      moat_error *perr = NULL;
      if (moat_guest_ping(sock, 2000, &perr) == 0) {
        api_reply_error(r, 409, "stdin_closed", "%s", moat_error_msg(err));
        moat_error_free(&err);
        return 0;
      }
      moat_error_free(&perr);
    }
    return api_reply_proc_error(r, &err);
  }
  return api_reply_empty(r, 204);
}

int api_h_proc_signal(struct api_req *r, json_t *body) {
  static const char *const known[] = {"signal", NULL};
  json_t *s = json_object_get(body, "signal");
  int sig = SIGTERM; /* the default, as kill(1) */
  if (s) {
    if (!json_is_string(s) || (sig = api_signal_parse(json_string_value(s))) == 0)
      return api_reply_error(r, 400, "invalid_request",
                             "field 'signal' must be one of TERM KILL INT HUP QUIT USR1 USR2 STOP CONT");
  }
  _cleanup_free_ struct moat_guest_ep *sock = NULL;
  if (proc_prelude(r, body, known, &sock) < 0)
    return -1;
  moat_error *err = NULL;
  if (moat_guest_proc_signal(sock, r->route.pid, route_tag(r), sig, &err) < 0)
    return api_reply_proc_error(r, &err);
  return api_reply_empty(r, 204);
}

int api_h_proc_resize(struct api_req *r, json_t *body) {
  static const char *const known[] = {"cols", "rows", NULL};
  json_t *c = json_object_get(body, "cols"), *w = json_object_get(body, "rows");
  if (!json_is_integer(c) || json_integer_value(c) < 1 || json_integer_value(c) > API_MAX_PTY)
    return api_reply_error(r, 400, "invalid_request", "field 'cols' must be an integer from 1 to %d",
                           API_MAX_PTY);
  if (!json_is_integer(w) || json_integer_value(w) < 1 || json_integer_value(w) > API_MAX_PTY)
    return api_reply_error(r, 400, "invalid_request", "field 'rows' must be an integer from 1 to %d",
                           API_MAX_PTY);
  _cleanup_free_ struct moat_guest_ep *sock = NULL;
  if (proc_prelude(r, body, known, &sock) < 0)
    return -1;
  moat_error *err = NULL;
  if (moat_guest_proc_resize(sock, r->route.pid, route_tag(r), (uint32_t)json_integer_value(c),
                             (uint32_t)json_integer_value(w), &err) < 0)
    return api_reply_proc_error(r, &err);
  return api_reply_empty(r, 204);
}

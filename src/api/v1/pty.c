/* pty.c -- GET /v1/sandboxes/{id}/pty: a terminal over WebSocket (RFC 6455; wslay frames it)
 *
 * The handler checks the handshake headers, starts the process on a pty (or attaches to one by
 * pid or tag) and only then answers 101, so that every error is still a JSON reply. After the
 * upgrade one thread per WebSocket polls the upgraded socket and the guest stream:
 *   client binary frame          -> process input
 *   client text frame            -> {"type":"resize","cols":N,"rows":M} resizes (a bad one gets a
 *                                   text frame {"type":"error","message":...} and the connection
 *                                   stays open); any other text is input (xterm.js attach addon)
 *   process output               -> binary frames
 *   process exit                 -> close frame 1000 after the last output
 * Bounds: client messages up to WS_MAX_MSG (larger: close 1009); while more than WS_MAX_QUEUE
 * bytes wait for a client that does not read, output is not pulled from the guest, and after
 * WS_STALL_S of that the connection is closed. Protocol errors (unmasked or malformed frames)
 * close with 1002. A started shell is killed when the WebSocket goes away; an attached process
 * is not.
 */
#include <errno.h>
#include <fcntl.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <wslay/wslay.h>

#include "../../common/log.h"
#include "v1.h"
#include "../http/fair.h"
#include "../http/gate.h"

#define WS_MAX_MSG (1u << 20)
#define WS_MAX_QUEUE (4u << 20)
#define WS_STALL_S 30
#define WS_CLOSE_WAIT_S 5
#define WS_POLL_MS 200

/* True when the comma-separated header value h holds token t (case-insensitive). */
static bool has_token(const char *h, const char *t) {
  size_t tl = strlen(t);
  while (h && *h) {
    while (*h == ' ' || *h == '\t' || *h == ',')
      h++;
    size_t n = strcspn(h, ",");
    size_t m = n;
    while (m > 0 && (h[m - 1] == ' ' || h[m - 1] == '\t'))
      m--;
    if (m == tl && strncasecmp(h, t, tl) == 0)
      return true;
    h += n;
  }
  return false;
}

/* ---- the connection ---- */

struct ws {
  struct moat_api *api;
  struct moat_proc_stream *ps;
  int fd;
  struct MHD_UpgradeResponseHandle *urh;
  wslay_event_context_ptr ctx;
  char *extra; /* bytes MHD read past the request headers: the first frames */
  size_t extra_len, extra_pos;
  bool proc_done, close_queued, failed;
  bool close_when_flushed; /* the process exited: close once its output has been sent */
  uint64_t close_at_ns, stall_since_ns;
  char *desc;
  struct api_ticket *ticket; /* the stream's slot (fair.h), once the upgrade took it */
  struct api_key_watch key;  /* closed once the request's key is revoked */
};

static void ws_free(struct ws *w) {
  if (!w)
    return;
  api_fair_release(w->ticket);
  if (w->ps)
    moat_proc_stream_close(w->ps);
  free(w->extra);
  free(w->desc);
  free(w);
}

static ssize_t recv_cb(wslay_event_context_ptr ctx, uint8_t *buf, size_t len, int flags, void *user) {
  struct ws *w = user;
  if (w->extra_pos < w->extra_len) {
    size_t n = w->extra_len - w->extra_pos;
    if (n > len)
      n = len;
    memcpy(buf, w->extra + w->extra_pos, n);
    w->extra_pos += n;
    return (ssize_t)n;
  }
  ssize_t n;
  do
    n = recv(w->fd, buf, len, 0);
  while (n < 0 && errno == EINTR);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
    wslay_event_set_error(ctx, WSLAY_ERR_WOULDBLOCK);
    return -1;
  }
  if (n <= 0) { /* gone */
    wslay_event_set_error(ctx, WSLAY_ERR_CALLBACK_FAILURE);
    return -1;
  }
  return n;
}

static ssize_t send_cb(wslay_event_context_ptr ctx, const uint8_t *data, size_t len, int flags, void *user) {
  struct ws *w = user;
  ssize_t n;
  do
    n = send(w->fd, data, len, MSG_NOSIGNAL);
  while (n < 0 && errno == EINTR);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
    wslay_event_set_error(ctx, WSLAY_ERR_WOULDBLOCK);
    return -1;
  }
  if (n < 0) {
    wslay_event_set_error(ctx, WSLAY_ERR_CALLBACK_FAILURE);
    return -1;
  }
  return n;
}

static void send_text(struct ws *w, json_t *j) {
  char *s = json_dumps(j, JSON_COMPACT);
  json_decref(j);
  if (!s)
    abort();
  struct wslay_event_msg m = {.opcode = WSLAY_TEXT_FRAME, .msg = (const uint8_t *)s, .msg_length = strlen(s)};
  wslay_event_queue_msg(w->ctx, &m);
  free(s);
}

static void send_error(struct ws *w, const char *msg) {
  send_text(w, json_pack("{s:s, s:s}", "type", "error", "message", msg));
}

static void queue_close(struct ws *w, uint16_t code, const char *reason) {
  if (w->close_queued)
    return;
  w->close_queued = true;
  w->close_at_ns = now_ns();
  wslay_event_queue_close(w->ctx, code, (const uint8_t *)reason, strlen(reason));
}

static void input(struct ws *w, const void *p, size_t n) {
  moat_error *err = NULL;
  if (w->proc_done || n == 0)
    return;
  if (moat_proc_stream_input(w->ps, p, n, &err) < 0) {
    log_debug("pty %s: input: %s", w->desc, moat_error_msg(err));
    moat_error_free(&err);
  }
}

/* A text frame: a resize control message, or terminal input. */
static void text(struct ws *w, const char *p, size_t n) {
  json_t *j = NULL;
  if (n > 0 && p[0] == '{')
    j = json_loadb(p, n, 0, NULL);
  json_t *type = j ? json_object_get(j, "type") : NULL;
  if (!json_is_string(type) || strcmp(json_string_value(type), "resize") != 0) {
    json_decref(j);
    input(w, p, n);
    return;
  }
  json_t *c = json_object_get(j, "cols"), *r = json_object_get(j, "rows");
  if (!json_is_integer(c) || !json_is_integer(r) || json_integer_value(c) < 1 ||
      json_integer_value(c) > API_MAX_PTY || json_integer_value(r) < 1 ||
      json_integer_value(r) > API_MAX_PTY) {
    json_decref(j);
    char msg[96];
    snprintf(msg, sizeof(msg), "resize needs integer cols and rows from 1 to %d", API_MAX_PTY);
    send_error(w, msg);
    return;
  }
  moat_error *err = NULL;
  if (!w->proc_done && moat_proc_stream_resize(w->ps, (uint32_t)json_integer_value(c),
                                               (uint32_t)json_integer_value(r), &err) < 0) {
    send_error(w, moat_error_msg(err));
    moat_error_free(&err);
  }
  json_decref(j);
}

static void on_msg(wslay_event_context_ptr ctx, const struct wslay_event_on_msg_recv_arg *arg, void *user) {
  struct ws *w = user;
  if (arg->opcode == WSLAY_BINARY_FRAME)
    input(w, arg->msg, arg->msg_length);
  else if (arg->opcode == WSLAY_TEXT_FRAME)
    text(w, (const char *)arg->msg, arg->msg_length);
  /* close: wslay answers it; ping: wslay pongs */
}

/* Moves available process output into binary frames, up to the queue bound. */
static void drain(struct ws *w) {
  while (!w->proc_done && wslay_event_get_queued_msg_length(w->ctx) < WS_MAX_QUEUE) {
    struct moat_proc_event ev;
    moat_error *err = NULL;
    int rc = moat_proc_stream_next(w->ps, &ev, 0, &err);
    if (rc < 0 && err && err->status == ETIMEDOUT) {
      moat_error_free(&err);
      return;
    }
    if (rc <= 0) {
      log_warn("pty %s: guest stream: %s", w->desc, rc < 0 ? moat_error_msg(err) : "ended without exit");
      moat_error_free(&err);
      w->proc_done = true;
      queue_close(w, 1011, "the sandbox stream broke");
      return;
    }
    if (ev.type == MOAT_PROC_STDOUT || ev.type == MOAT_PROC_STDERR) {
      struct wslay_event_msg m = {
          .opcode = WSLAY_BINARY_FRAME, .msg = (const uint8_t *)ev.data, .msg_length = ev.len};
      wslay_event_queue_msg(w->ctx, &m);
    } else if (ev.type == MOAT_PROC_EXIT) {
      /* wslay sends control frames ahead of queued messages: the close waits until the last
       * output frame has gone (see ws_thread), or it would overtake it. */
      w->proc_done = true;
      w->close_when_flushed = true;
    }
  }
}

static void *ws_thread(void *arg) {
  struct ws *w = arg;
  struct wslay_event_callbacks cbs = {
      .recv_callback = recv_cb, .send_callback = send_cb, .on_msg_recv_callback = on_msg};
  int fl = fcntl(w->fd, F_GETFL);
  if (fl >= 0)
    fcntl(w->fd, F_SETFL, fl | O_NONBLOCK);
  if (wslay_event_context_server_init(&w->ctx, &cbs, w) != 0) {
    log_warn("pty %s: wslay init failed", w->desc);
    goto out;
  }
  wslay_event_config_set_max_recv_msg_length(w->ctx, WS_MAX_MSG);
  bool pending = true; /* events may sit in the stream's buffer without the socket being readable */
  for (;;) {
    if (api_stopping(w->api))
      queue_close(w, 1001, "moatd is stopping");
    else if (!w->close_queued && api_key_watch_revoked(&w->key))
      queue_close(w, 1008, "the API key was revoked");
    if (w->close_when_flushed && wslay_event_get_queued_msg_count(w->ctx) == 0) {
      w->close_when_flushed = false;
      queue_close(w, 1000, "process exited");
    }
    bool wr = wslay_event_want_read(w->ctx), ww = wslay_event_want_write(w->ctx);
    if (!wr && !ww)
      break;
    uint64_t now = now_ns();
    if (w->close_queued && now - w->close_at_ns > WS_CLOSE_WAIT_S * 1000000000ULL)
      break;
    bool full = wslay_event_get_queued_msg_length(w->ctx) >= WS_MAX_QUEUE;
    if (!full)
      w->stall_since_ns = 0;
    else if (!w->stall_since_ns)
      w->stall_since_ns = now;
    else if (now - w->stall_since_ns > WS_STALL_S * 1000000000ULL) {
      log_warn("pty %s: the client has not read for %d s; closing", w->desc, WS_STALL_S);
      break;
    }
    bool pull = !w->proc_done && !full;
    struct pollfd p[2] = {
        {.fd = w->fd, .events = (short)((wr ? POLLIN : 0) | (ww ? POLLOUT : 0))},
        {.fd = pull ? moat_proc_stream_fd(w->ps) : -1, .events = POLLIN},
    };
    bool have_extra = w->extra_pos < w->extra_len;
    int n = poll(p, 2, (pull && pending) || have_extra ? 0 : WS_POLL_MS);
    if (n < 0 && errno != EINTR)
      break;
    if (wr && ((p[0].revents & (POLLIN | POLLHUP | POLLERR)) || have_extra)) {
      if (wslay_event_recv(w->ctx) != 0)
        break;
    }
    /* every turn, not only when readable: a guest that went silent is noticed (guest_client.h) */
    if (pull) {
      drain(w);
      pending = !w->proc_done && wslay_event_get_queued_msg_length(w->ctx) >= WS_MAX_QUEUE;
    }
    if (wslay_event_want_write(w->ctx) && wslay_event_send(w->ctx) != 0)
      break;
  }
out:
  if (w->ctx)
    wslay_event_context_free(w->ctx);
  struct moat_api *api = w->api;
  MHD_upgrade_action(w->urh, MHD_UPGRADE_ACTION_CLOSE);
  ws_free(w);
  api_release(api);
  return NULL;
}

static void upgrade_cb(void *cls, struct MHD_Connection *conn, void *con_cls, const char *extra_in,
                       size_t extra_in_size, MHD_socket sock, struct MHD_UpgradeResponseHandle *urh) {
  struct ws *w = cls;
  struct api_req *r = con_cls;
  api_gate_release(conn);
  if (r) {
    r->upgrade = NULL; /* the thread owns w from here, and the stream's slot with it */
    w->ticket = api_req_take_ticket(r);
  }
  w->fd = sock;
  /* keystrokes: wslay writes a frame's header and payload separately; without NODELAY, Nagle holds
   * the payload for the peer's delayed ACK (~40 ms per echo) */
  int one = 1;
  setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  w->urh = urh;
  if (extra_in_size) {
    w->extra = xmalloc(extra_in_size);
    memcpy(w->extra, extra_in, extra_in_size);
    w->extra_len = extra_in_size;
  }
  api_hold(w->api);
  pthread_t t;
  pthread_attr_t at;
  pthread_attr_init(&at);
  pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
  if (pthread_create(&t, &at, ws_thread, w) != 0) {
    log_warn("pty %s: no thread for the WebSocket", w->desc);
    MHD_upgrade_action(urh, MHD_UPGRADE_ACTION_CLOSE);
    api_release(w->api);
    ws_free(w);
  }
  pthread_attr_destroy(&at);
}

static void ws_free_cb(void *p) { ws_free(p); }

/* cols/rows query parameter: 1..API_MAX_PTY, default def. */
static int arg_dim(const struct api_args *a, const char *key, uint32_t def, uint32_t *out, moat_error **err) {
  const char *v = api_arg_get(a, key);
  uint64_t x;
  if (!v) {
    *out = def;
    return 0;
  }
  if (parse_u64(v, &x) < 0 || x < 1 || x > API_MAX_PTY)
    return moat_error_set(err, EINVAL, "query parameter '%s' must be an integer from 1 to %d", key,
                          API_MAX_PTY);
  *out = (uint32_t)x;
  return 0;
}

int api_h_pty(struct api_req *r, json_t *body) {
  static const char *const allowed[] = {"cols", "rows", "cmd", "pid", "tag", "user", "api_key", NULL};
  moat_error *err = NULL;
  uint32_t cols, rows;
  const char *user;
  if (api_args_check(&r->args, allowed, &err) < 0 || arg_dim(&r->args, "cols", 80, &cols, &err) < 0 ||
      arg_dim(&r->args, "rows", 24, &rows, &err) < 0 || api_arg_user(&r->args, &user, &err) < 0)
    return api_reply_moat_error(r, &err);
  const char *cmd = api_arg_get(&r->args, "cmd"), *pids = api_arg_get(&r->args, "pid"),
             *tag = api_arg_get(&r->args, "tag");
  int pid = 0;
  if (pids) {
    uint64_t x;
    if (parse_u64(pids, &x) < 0 || x < 1 || x > 999999999)
      return api_reply_error(r, 400, "invalid_request", "query parameter 'pid' must be a positive integer");
    pid = (int)x;
  }
  if (tag && !api_valid_tag(tag))
    return api_reply_error(r, 400, "invalid_request",
                           "query parameter 'tag' must match [A-Za-z0-9_.-]{1,64}");
  if ((pid && tag) || (cmd && (pid || tag)))
    return api_reply_error(r, 400, "invalid_request", "give at most one of 'cmd', 'pid' and 'tag'");
  if (cmd && (!*cmd || strlen(cmd) > API_MAX_BODY))
    return api_reply_error(r, 400, "invalid_request", "query parameter 'cmd' must not be empty");

  /* The handshake (RFC 6455 section 4.2.1). */
  const char *up = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_UPGRADE);
  const char *co = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONNECTION);
  const char *ver = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Sec-WebSocket-Version");
  const char *key = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Sec-WebSocket-Key");
  if (!up || !has_token(up, "websocket") || !co || !has_token(co, "upgrade"))
    return api_reply_error(r, 400, "invalid_request",
                           "this route is a WebSocket: send Upgrade: websocket and Connection: Upgrade");
  if (!ver || strcmp(ver, "13") != 0)
    return api_reply_error(r, 400, "invalid_request", "Sec-WebSocket-Version must be 13");
  unsigned char *kb = NULL;
  size_t kl = 0;
  if (!key || moat_base64_decode(key, strlen(key), &kb, &kl) < 0 || kl != 16) {
    free(kb);
    return api_reply_error(r, 400, "invalid_request", "Sec-WebSocket-Key must be 16 bytes in base64");
  }
  free(kb);

  _cleanup_strv_ char **senv = NULL;
  _cleanup_free_ struct moat_guest_ep *sock = api_guest_sock(r, &senv, &err);
  if (!sock)
    return api_reply_moat_error(r, &err);
  struct moat_proc_stream *ps = NULL;
  if (pid || tag) {
    if (moat_guest_attach(sock, pid, tag, true, &ps, NULL, &err) < 0)
      return api_reply_proc_error(r, &err);
  } else {
    struct moat_file_entry e;
    memset(&e, 0, sizeof(e));
    bool bash = !cmd && moat_guest_stat(sock, "/bin/bash", NULL, &e, NULL) == 0;
    moat_file_entry_clear(&e);
    char *shell_argv[] = {"/bin/bash", "-l", NULL};
    char *sh_argv[] = {"/bin/sh", "-l", NULL};
    char *cmd_argv[] = {"/bin/sh", "-c", (char *)cmd, NULL};
    char *term[] = {"TERM=xterm-256color", NULL};
    _cleanup_strv_ char **env = strv_concat(term, senv);
    struct moat_exec_req req = {
        .argv = cmd    ? cmd_argv
                : bash ? shell_argv
                       : sh_argv,
        .env = env,
        .user = user,
        .max_output = UINT64_MAX,
    };
    struct moat_exec_opts opts = {.pty_cols = cols, .pty_rows = rows, .keep_on_disconnect = false};
    int spid;
    if (moat_guest_exec_start(sock, &req, &opts, &ps, &spid, &err) < 0) {
      api_exec_enoent(r, err);
      return api_reply_proc_error(r, &err);
    }
  }
  _cleanup_free_ char *accept = moat_ws_accept(key);
  struct ws *w = xcalloc(1, sizeof(*w));
  w->api = r->api;
  api_key_watch_init(&w->key, r);
  w->ps = ps;
  w->fd = -1;
  w->desc = xasprintf("%s %s%.64s", r->route.id, pid || tag ? "attach " : "", tag ? tag : pids ? pids : "");
  struct MHD_Response *resp = MHD_create_response_for_upgrade(upgrade_cb, w);
  if (!resp) {
    ws_free(w);
    return api_reply_error(r, 500, "internal", "could not create an upgrade response");
  }
  MHD_add_response_header(resp, MHD_HTTP_HEADER_UPGRADE, "websocket");
  MHD_add_response_header(resp, "Sec-WebSocket-Accept", accept);
  /* Until upgrade_cb runs, the request owns w: a response that is never sent frees it. */
  r->upgrade = w;
  r->upgrade_free = ws_free_cb;
  int ret = api_reply_response(r, MHD_HTTP_SWITCHING_PROTOCOLS, resp);
  MHD_destroy_response(resp);
  if (ret < 0) {
    r->upgrade = NULL;
    ws_free(w);
  }
  return ret;
}

/* cmd_shell.c -- moat shell: a terminal in a sandbox over the PTY WebSocket (GET .../pty). Our own
 * TCP connection and HTTP/1.1 upgrade (RFC 6455 handshake, accept key checked), wslay for framing;
 * the local terminal in raw mode (restored on every exit path), SIGWINCH sent as a resize frame. */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <termios.h>
#include <unistd.h>
#include <wslay/wslay.h>

#include "../common/util.h"
#include "cli.h"

/* ---- the local terminal ---- */

static struct termios saved_tio;
static volatile sig_atomic_t tio_saved; /* raw mode is on: saved_tio must be put back */
static int sig_pipe[2] = {-1, -1};

static void tty_restore(void) {
  if (tio_saved) {
    tcsetattr(STDIN_FILENO, TCSAFLUSH, &saved_tio);
    tio_saved = 0;
  }
}

/* Async-signal-safe: restores the terminal first (a second signal or a crash of the loop cannot
 * leave it raw), then wakes the loop. */
static void on_shell_signal(int sig) {
  int e = errno;
  if (sig != SIGWINCH && tio_saved)
    tcsetattr(STDIN_FILENO, TCSAFLUSH, &saved_tio);
  unsigned char b = (unsigned char)sig;
  if (write(sig_pipe[1], &b, 1) < 0) {
    /* the pipe is full: the loop has wake-ups pending anyway */
  }
  errno = e;
}

static int tty_raw(void) {
  if (!isatty(STDIN_FILENO))
    return 0;
  if (tcgetattr(STDIN_FILENO, &saved_tio) < 0)
    return -1;
  struct termios raw = saved_tio;
  cfmakeraw(&raw);
  tio_saved = 1;
  atexit(tty_restore);
  return tcsetattr(STDIN_FILENO, TCSAFLUSH, &raw);
}

static void term_size(int *cols, int *rows) {
  struct winsize ws;
  *cols = 80, *rows = 24;
  if (ioctl(STDIN_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0 && ws.ws_row > 0) {
    *cols = ws.ws_col;
    *rows = ws.ws_row;
  } else if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0 && ws.ws_row > 0) {
    *cols = ws.ws_col;
    *rows = ws.ws_row;
  }
}

/* ---- connection and handshake ---- */

/* Splits MOAT_API_URL ("http://host[:port][/prefix]") into host, port and path prefix. */
static int parse_url(const char *url, char **host, char **port, char **prefix) {
  if (strncmp(url, "http://", 7) != 0) {
    cli_errorf("moat shell speaks plain http only; MOAT_API_URL is %s", url);
    return -1;
  }
  const char *h = url + 7, *slash = strchr(h, '/');
  size_t hl = slash ? (size_t)(slash - h) : strlen(h);
  _cleanup_free_ char *hostport = xstrndup(h, hl);
  *prefix = xstrdup(slash ? slash : "");
  char *colon;
  if (hostport[0] == '[') { /* [v6]:port */
    char *close = strchr(hostport, ']');
    if (!close) {
      cli_errorf("bad host in MOAT_API_URL: %s", url);
      free(*prefix);
      return -1;
    }
    *host = xstrndup(hostport + 1, (size_t)(close - hostport - 1));
    colon = close[1] == ':' ? close + 1 : NULL;
  } else {
    colon = strrchr(hostport, ':');
    *host = xstrndup(hostport, colon ? (size_t)(colon - hostport) : strlen(hostport));
  }
  *port = xstrdup(colon && colon[1] ? colon + 1 : "80");
  return 0;
}

static int tcp_connect(const char *host, const char *port) {
  struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
  int e = getaddrinfo(host, port, &hints, &res);
  if (e) {
    cli_errorf("cannot resolve %s: %s", host, gai_strerror(e));
    return -1;
  }
  int fd = -1;
  for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0)
      continue;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
      /* wslay writes a frame's header and payload separately: without NODELAY each keystroke's
       * payload would wait for the server's delayed ACK (~40 ms) */
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      break;
    }
    close(fd);
    fd = -1;
  }
  freeaddrinfo(res);
  if (fd < 0)
    cli_errorf("cannot reach moatd at %s:%s (is it running? `make run` starts it)", host, port);
  return fd;
}

/* The value of header `name` in the response head (NUL-terminated lines ending in \r\n); a copy. */
static char *header_value(const char *head, const char *name) {
  size_t nl = strlen(name);
  for (const char *l = strstr(head, "\r\n"); l && l[2]; l = strstr(l + 2, "\r\n")) {
    const char *line = l + 2;
    if (strncasecmp(line, name, nl) == 0 && line[nl] == ':') {
      const char *v = line + nl + 1;
      while (*v == ' ' || *v == '\t')
        v++;
      const char *end = strstr(v, "\r\n");
      size_t n = end ? (size_t)(end - v) : strlen(v);
      while (n && (v[n - 1] == ' ' || v[n - 1] == '\t'))
        n--;
      return xstrndup(v, n);
    }
  }
  return NULL;
}

/* Bytes read past the response head: handed to wslay before anything else. */
struct pending {
  unsigned char buf[16384];
  size_t off, len;
};

/* Reads an error answer's body (JSON {code, message}) and prints it. */
static void report_refusal(int fd, int status, const char *head, struct pending *p) {
  _cleanup_free_ char *cl = header_value(head, "Content-Length");
  size_t want = cl ? (size_t)strtoul(cl, NULL, 10) : 8192;
  if (want > 8192)
    want = 8192;
  char body[8193];
  size_t n = p->len - p->off < want ? p->len - p->off : want;
  memcpy(body, p->buf + p->off, n);
  while (n < want) {
    ssize_t r = read(fd, body + n, want - n);
    if (r <= 0)
      break;
    n += (size_t)r;
  }
  body[n] = '\0';
  json_error_t jerr;
  json_t *j = json_loadb(body, n, 0, &jerr);
  const char *m = json_string_value(json_object_get(j, "message"));
  const char *c = json_string_value(json_object_get(j, "code"));
  if (m || c)
    cli_errorf("%s (%s)", m ? m : "error", c ? c : "unknown");
  else
    cli_errorf("HTTP %d: the server refused the WebSocket upgrade", status);
  json_decref(j);
}

/* Sends the upgrade request and checks the answer. Returns 0 with the bytes read past the head in
 * *p, or -1 (printed). */
static int handshake(int fd, const char *host, const char *port, const char *target, struct pending *p) {
  unsigned char nonce[16];
  random_bytes(nonce, sizeof(nonce));
  _cleanup_free_ char *key = moat_base64_encode(nonce, sizeof(nonce), NULL);
  _cleanup_free_ char *auth =
      cli_api_key() ? xasprintf("Authorization: Bearer %s\r\n", cli_api_key()) : xstrdup("");
  _cleanup_free_ char *req = xasprintf("GET %s HTTP/1.1\r\nHost: %s:%s\r\nUpgrade: websocket\r\n"
                                       "Connection: Upgrade\r\nSec-WebSocket-Key: %s\r\n"
                                       "Sec-WebSocket-Version: 13\r\n%s\r\n",
                                       target, host, port, key, auth);
  if (write_all(fd, req, strlen(req)) < 0) {
    cli_errorf("send the upgrade request: %s", strerror(errno));
    return -1;
  }
  char head[16385];
  size_t n = 0;
  char *end = NULL;
  while (!end) {
    if (n == sizeof(head) - 1) {
      cli_errorf("the upgrade answer's head is too long");
      return -1;
    }
    ssize_t r = read(fd, head + n, sizeof(head) - 1 - n);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0) {
      cli_errorf("moatd closed the connection during the WebSocket upgrade");
      return -1;
    }
    n += (size_t)r;
    head[n] = '\0';
    end = strstr(head, "\r\n\r\n");
  }
  size_t hlen = (size_t)(end - head) + 4;
  p->off = 0;
  p->len = n - hlen;
  memcpy(p->buf, head + hlen, p->len);
  head[hlen - 2] = '\0'; /* keep the last header's \r\n */
  int status = 0;
  if (sscanf(head, "HTTP/1.%*d %d", &status) != 1) {
    cli_errorf("the upgrade answer is not HTTP");
    return -1;
  }
  if (status != 101) {
    report_refusal(fd, status, head, p);
    return -1;
  }
  _cleanup_free_ char *accept = header_value(head, "Sec-WebSocket-Accept");
  _cleanup_free_ char *want = moat_ws_accept(key);
  if (!accept || strcmp(accept, want) != 0) {
    cli_errorf("the server's Sec-WebSocket-Accept is %s, want %s", accept ? accept : "missing", want);
    return -1;
  }
  return 0;
}

/* ---- the session ---- */

struct session {
  int fd;
  struct pending pend;
  bool closed;   /* a close frame came, or the connection ended */
  int exit_code; /* from the server's exit notice; -1 when none */
  bool failed;
};

static ssize_t ws_recv(wslay_event_context_ptr ctx, uint8_t *buf, size_t len, int flags, void *ud) {
  struct session *s = ud;
  if (s->pend.off < s->pend.len) {
    size_t n = s->pend.len - s->pend.off < len ? s->pend.len - s->pend.off : len;
    memcpy(buf, s->pend.buf + s->pend.off, n);
    s->pend.off += n;
    return (ssize_t)n;
  }
  ssize_t r;
  do
    r = read(s->fd, buf, len);
  while (r < 0 && errno == EINTR);
  if (r < 0) {
    wslay_event_set_error(ctx, errno == EAGAIN ? WSLAY_ERR_WOULDBLOCK : WSLAY_ERR_CALLBACK_FAILURE);
    return -1;
  }
  if (r == 0) {
    s->closed = true;
    wslay_event_set_error(ctx, WSLAY_ERR_CALLBACK_FAILURE);
    return -1;
  }
  return r;
}

static ssize_t ws_send(wslay_event_context_ptr ctx, const uint8_t *data, size_t len, int flags, void *ud) {
  struct session *s = ud;
  ssize_t r;
  do
    r = send(s->fd, data, len, MSG_NOSIGNAL);
  while (r < 0 && errno == EINTR);
  if (r < 0) {
    wslay_event_set_error(ctx, errno == EAGAIN ? WSLAY_ERR_WOULDBLOCK : WSLAY_ERR_CALLBACK_FAILURE);
    return -1;
  }
  return r;
}

static int ws_genmask(wslay_event_context_ptr ctx, uint8_t *buf, size_t len, void *ud) {
  random_bytes(buf, len);
  return 0;
}

/* Reads an exit notice: {"type":"exit","exit_code":N[,"signal":S]} (a text frame or a close reason). */
static void take_exit(struct session *s, const uint8_t *msg, size_t len) {
  json_error_t jerr;
  json_t *j = json_loadb((const char *)msg, len, 0, &jerr);
  if (j && json_object_get(j, "exit_code")) {
    json_int_t sig = json_integer_value(json_object_get(j, "signal"));
    json_int_t ec = json_integer_value(json_object_get(j, "exit_code"));
    s->exit_code = sig > 0 ? 128 + (int)(sig & 127) : ec >= 0 ? (int)(ec & 255) : s->exit_code;
  }
  json_decref(j);
}

static void ws_on_msg(wslay_event_context_ptr ctx, const struct wslay_event_on_msg_recv_arg *arg, void *ud) {
  struct session *s = ud;
  if (arg->opcode == WSLAY_BINARY_FRAME) {
    if (write_all(STDOUT_FILENO, arg->msg, arg->msg_length) < 0)
      s->failed = true;
  } else if (arg->opcode == WSLAY_TEXT_FRAME) {
    json_error_t jerr;
    json_t *j = json_loadb((const char *)arg->msg, arg->msg_length, 0, &jerr);
    const char *type = json_string_value(json_object_get(j, "type"));
    if (type && strcmp(type, "error") == 0) { /* e.g. a refused resize; the session goes on */
      const char *m = json_string_value(json_object_get(j, "message"));
      fprintf(stderr, "\r\nmoat: %s\r\n", m ? m : "error");
    }
    json_decref(j);
    take_exit(s, arg->msg, arg->msg_length);
  } else if (arg->opcode == WSLAY_CONNECTION_CLOSE) {
    s->closed = true;
    if (arg->msg_length > 2)
      take_exit(s, arg->msg + 2, arg->msg_length - 2);
    if (arg->status_code != 1000 && arg->status_code != 0 && arg->status_code != 1005 && s->exit_code < 0) {
      tty_restore();
      cli_errorf("moatd closed the terminal (status %u%s%.*s)", arg->status_code,
                 arg->msg_length > 2 ? ": " : "", arg->msg_length > 2 ? (int)arg->msg_length - 2 : 0,
                 arg->msg_length > 2 ? (const char *)arg->msg + 2 : "");
      s->exit_code = EXIT_API;
    }
  }
}

static void queue_resize(wslay_event_context_ptr ctx) {
  int cols, rows;
  term_size(&cols, &rows);
  _cleanup_free_ char *m = xasprintf("{\"type\":\"resize\",\"cols\":%d,\"rows\":%d}", cols, rows);
  struct wslay_event_msg msg = {WSLAY_TEXT_FRAME, (const uint8_t *)m, strlen(m)};
  wslay_event_queue_msg(ctx, &msg);
}

static const char shell_usage[] = "moat shell ID [--cmd CMD]   (an interactive terminal in the sandbox; CMD "
                                  "default: the user's login shell)\n"
                                  "Exit code: the remote shell's, 1 on a connection error.\n";

static int on_shell_opt(int id, const char *value, void *ctx) {
  *(const char **)ctx = value;
  return 0;
}

static int run_session(int fd, struct session *s) {
  wslay_event_context_ptr ctx;
  struct wslay_event_callbacks cb = {.recv_callback = ws_recv,
                                     .send_callback = ws_send,
                                     .genmask_callback = ws_genmask,
                                     .on_msg_recv_callback = ws_on_msg};
  if (wslay_event_context_client_init(&ctx, &cb, s) != 0) {
    cli_errorf("cannot set up the WebSocket");
    return -1;
  }
  wslay_event_config_set_max_recv_msg_length(ctx, 16u << 20);
  bool stdin_open = true;
  int sig = 0;
  /* bytes that came with the handshake */
  if (s->pend.len && wslay_event_recv(ctx) != 0 && !s->closed)
    s->failed = true;
  while (!s->closed && !s->failed && !sig) {
    struct pollfd pf[3] = {{.fd = fd},
                           {.fd = stdin_open ? STDIN_FILENO : -1, .events = POLLIN},
                           {.fd = sig_pipe[0], .events = POLLIN}};
    if (wslay_event_want_read(ctx))
      pf[0].events |= POLLIN;
    if (wslay_event_want_write(ctx))
      pf[0].events |= POLLOUT;
    if (!pf[0].events)
      break;
    if (poll(pf, 3, -1) < 0) {
      if (errno == EINTR)
        continue;
      break;
    }
    if (pf[2].revents & POLLIN) {
      unsigned char b[16];
      ssize_t n = read(sig_pipe[0], b, sizeof(b));
      for (ssize_t i = 0; i < n; i++) {
        if (b[i] == SIGWINCH)
          queue_resize(ctx);
        else
          sig = b[i];
      }
    }
    if (pf[1].revents & (POLLIN | POLLHUP | POLLERR)) {
      unsigned char buf[4096];
      ssize_t n = read(STDIN_FILENO, buf, sizeof(buf));
      if (n > 0) {
        struct wslay_event_msg msg = {WSLAY_BINARY_FRAME, buf, (size_t)n};
        wslay_event_queue_msg(ctx, &msg);
      } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
        stdin_open = false; /* the remote side ends the session */
      }
    }
    if ((pf[0].revents & (POLLIN | POLLHUP | POLLERR)) && wslay_event_recv(ctx) != 0 && !s->closed)
      s->failed = true;
    if (!s->failed && wslay_event_want_write(ctx) && wslay_event_send(ctx) != 0)
      s->failed = true;
  }
  if (sig && !s->closed) { /* say goodbye; the remote shell gets a hangup */
    wslay_event_queue_close(ctx, 1000, NULL, 0);
    wslay_event_send(ctx);
  }
  wslay_event_context_free(ctx);
  return sig ? 128 + sig : 0;
}

int cmd_shell(int argc, char **argv) {
  static const struct cli_opt opts[] = {{"cmd", true, 1}, {NULL, false, 0}};
  const char *cmd = NULL;
  struct cli_args a;
  int r = cli_parse(argc, argv, opts, 1, false, on_shell_opt, &cmd, &a);
  _cleanup_free_ char **pos = a.pos;
  _cleanup_free_ char **rest = a.rest;
  if (r == 1) {
    printf("usage: %s", shell_usage);
    return 0;
  }
  if (r < 0 || a.npos != 1)
    return cli_usage_error(shell_usage, "%s", r < 0 ? "" : "shell needs a sandbox id");
  _cleanup_free_ char *host = NULL, *port = NULL, *prefix = NULL;
  if (parse_url(cli_api_url(), &host, &port, &prefix) < 0)
    return EXIT_API;
  int cols, rows;
  term_size(&cols, &rows);
  _cleanup_free_ char *eid = cli_escape(pos[0]);
  _cleanup_free_ char *ecmd = cmd ? cli_escape(cmd) : NULL;
  _cleanup_free_ char *target = xasprintf("%s/v1/sandboxes/%s/pty?cols=%d&rows=%d%s%s", prefix, eid, cols,
                                          rows, ecmd ? "&cmd=" : "", ecmd ? ecmd : "");
  _cleanup_close_ int fd = tcp_connect(host, port);
  if (fd < 0)
    return EXIT_API;
  struct session s = {.fd = fd, .exit_code = -1};
  if (handshake(fd, host, port, target, &s.pend) < 0)
    return EXIT_API;
  if (pipe2(sig_pipe, O_CLOEXEC | O_NONBLOCK) < 0) {
    cli_errorf("pipe: %s", strerror(errno));
    return EXIT_API;
  }
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = on_shell_signal;
  sigemptyset(&sa.sa_mask);
  int sigs[] = {SIGWINCH, SIGINT, SIGTERM, SIGHUP, SIGQUIT};
  for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++)
    sigaction(sigs[i], &sa, NULL);
  fd_set_nonblock(fd, true);
  if (tty_raw() < 0) {
    cli_errorf("cannot put the terminal in raw mode: %s", strerror(errno));
    return EXIT_API;
  }
  int sig = run_session(fd, &s);
  tty_restore();
  close(sig_pipe[0]);
  close(sig_pipe[1]);
  if (sig)
    return sig;
  if (s.failed && !s.closed) {
    cli_errorf("the terminal connection failed");
    return EXIT_API;
  }
  return s.exit_code >= 0 ? s.exit_code : 0;
}

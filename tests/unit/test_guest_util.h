/* test_guest_util.h -- TAP output, a moat-guest started with --listen, and a tiny protocol client for tests
 */
#ifndef MOAT_TEST_GUEST_UTIL_H
#define MOAT_TEST_GUEST_UTIL_H

#pragma GCC diagnostic ignored "-Wunused-function" /* each test uses a subset */

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/util.h"
#include "proto/proto.h"

#include "tap.h"

/* ---- the guest under test ---- */
static char g_dir[64];
static char g_sock[100];
static pid_t g_pid;

static int g_connect(void) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", g_sock);
  if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
    close(fd);
    return -1;
  }
  return fd;
}

/* Starts $MOAT_GUEST (default build/moat-guest) --listen in a fresh temp dir; exits 1 if it fails. */
static void g_start(void) {
  const char *bin = getenv("MOAT_GUEST");
  if (!bin)
    bin = "build/moat-guest";
  snprintf(g_dir, sizeof(g_dir), "/tmp/moat-guest-test-XXXXXX");
  if (!mkdtemp(g_dir)) {
    perror("mkdtemp");
    exit(1);
  }
  chmod(g_dir, 0755);
  snprintf(g_sock, sizeof(g_sock), "%s/guest.sock", g_dir);
  g_pid = fork();
  if (g_pid == 0) {
    execl(bin, "moat-guest", "--listen", g_sock, (char *)NULL);
    fprintf(stderr, "exec %s: %s\n", bin, strerror(errno));
    _exit(127);
  }
  for (int i = 0; i < 500; i++) {
    int fd = g_connect();
    if (fd >= 0) {
      close(fd);
      return;
    }
    if (waitpid(g_pid, NULL, WNOHANG) == g_pid)
      break;
    usleep(10000);
  }
  fprintf(stderr, "moat-guest (%s) did not start listening on %s\n", bin, g_sock);
  exit(1);
}

static void g_stop(void) {
  kill(g_pid, SIGTERM);
  waitpid(g_pid, NULL, 0);
  moat_error *err = NULL;
  rm_rf(g_dir, &err);
  moat_error_free(&err);
}

/* ---- exec client ---- */
struct x_opts {
  const char *const *argv; /* NULL-terminated */
  const char *const *env;  /* may be NULL */
  const char *cwd, *user;
  uint32_t timeout_ms;
  uint64_t max_output; /* 0: not sent */
  const void *stdin_data;
  size_t stdin_len;
  bool stream;      /* send STDIN_STREAM=1 and the data as DATA frames + END */
  bool write_first; /* with stream: send all of stdin before reading anything (a naive host) */
};

struct x_res {
  int err_no; /* REP_ERROR's errno, or -1 on a protocol failure; 0 when the command ran */
  char msg[1024];
  int pid;
  char *out, *err;
  size_t out_len, err_len;
  int exit_code, sig;
  uint32_t timed_out, out_trunc, err_trunc;
  uint64_t duration_ms;
  int frames_out; /* REP_STDOUT frames seen */
};

static void x_res_free(struct x_res *r) {
  free(r->out);
  free(r->err);
  memset(r, 0, sizeof(*r));
}

static void append(char **buf, size_t *len, const void *data, size_t n) {
  *buf = xrealloc(*buf, *len + n + 1);
  memcpy(*buf + *len, data, n);
  *len += n;
  (*buf)[*len] = '\0';
}

struct feeder {
  int fd;
  const uint8_t *data;
  size_t len;
};

static void *feed_stdin(void *arg) {
  struct feeder *f = arg;
  for (size_t off = 0; off < f->len;) {
    size_t n = f->len - off > 65536 ? 65536 : f->len - off;
    if (moat_msg_send_data(f->fd, MOAT_MSG_DATA, f->data + off, n) < 0)
      return NULL;
    off += n;
  }
  moat_msg_send_empty(f->fd, MOAT_MSG_END);
  return NULL;
}

static void x_build(struct moat_msg *m, const struct x_opts *o) {
  moat_msg_init(m, MOAT_REQ_EXEC);
  for (size_t i = 0; o->argv && o->argv[i]; i++)
    moat_msg_put_str(m, MOAT_T_ARGV, o->argv[i]);
  for (size_t i = 0; o->env && o->env[i]; i++)
    moat_msg_put_str(m, MOAT_T_ENV, o->env[i]);
  if (o->cwd)
    moat_msg_put_str(m, MOAT_T_CWD, o->cwd);
  if (o->user)
    moat_msg_put_str(m, MOAT_T_USER, o->user);
  if (o->timeout_ms)
    moat_msg_put_u32(m, MOAT_T_TIMEOUT_MS, o->timeout_ms);
  if (o->max_output)
    moat_msg_put_u64(m, MOAT_T_MAX_OUTPUT, o->max_output);
  if (o->stream)
    moat_msg_put_u32(m, MOAT_T_STDIN_STREAM, 1);
}

/* Reads exec replies from fd until EXIT or ERROR into r. 0 when EXIT or ERROR arrived, -1 else. */
static int x_collect(int fd, struct x_res *r) {
  struct moat_msg m;
  moat_msg_init(&m, 0);
  moat_error *err = NULL;
  int ret = -1;
  for (;;) {
    int k = moat_msg_recv(fd, &m, &err);
    if (k <= 0) {
      snprintf(r->msg, sizeof(r->msg), "recv: %s", k < 0 ? moat_error_msg(err) : "EOF");
      r->err_no = -1;
      moat_error_free(&err);
      break;
    }
    struct moat_field f;
    if (m.type == MOAT_REP_STARTED) {
      moat_msg_get_i32(&m, MOAT_T_PID, &r->pid);
    } else if (m.type == MOAT_REP_STDOUT || m.type == MOAT_REP_STDERR) {
      if (moat_msg_find(&m, MOAT_T_DATA, &f)) {
        if (m.type == MOAT_REP_STDOUT) {
          append(&r->out, &r->out_len, f.data, f.len);
          r->frames_out++;
        } else {
          append(&r->err, &r->err_len, f.data, f.len);
        }
      }
    } else if (m.type == MOAT_REP_EXIT) {
      moat_msg_get_i32(&m, MOAT_T_EXIT_CODE, &r->exit_code);
      moat_msg_get_i32(&m, MOAT_T_SIGNAL, &r->sig);
      moat_msg_get_u32(&m, MOAT_T_TIMED_OUT, &r->timed_out);
      moat_msg_get_u32(&m, MOAT_T_STDOUT_TRUNC, &r->out_trunc);
      moat_msg_get_u32(&m, MOAT_T_STDERR_TRUNC, &r->err_trunc);
      moat_msg_get_u64(&m, MOAT_T_DURATION_MS, &r->duration_ms);
      ret = 0;
      break;
    } else if (m.type == MOAT_REP_ERROR) {
      moat_msg_get_i32(&m, MOAT_T_ERRNO, &r->err_no);
      char *s = moat_msg_get_str(&m, MOAT_T_MESSAGE);
      snprintf(r->msg, sizeof(r->msg), "%s", s ? s : "");
      free(s);
      ret = 0;
      break;
    } else {
      snprintf(r->msg, sizeof(r->msg), "unexpected frame type %u", m.type);
      r->err_no = -1;
      break;
    }
  }
  moat_msg_free(&m);
  if (!r->out)
    append(&r->out, &r->out_len, "", 0);
  if (!r->err)
    append(&r->err, &r->err_len, "", 0);
  return ret;
}

/* Runs one exec to completion. 0 when the guest answered (r->err_no says how), -1 otherwise. */
static int x_run(const struct x_opts *o, struct x_res *r) {
  memset(r, 0, sizeof(*r));
  int fd = g_connect();
  if (fd < 0) {
    snprintf(r->msg, sizeof(r->msg), "connect: %s", strerror(errno));
    r->err_no = -1;
    return -1;
  }
  struct moat_msg m;
  x_build(&m, o);
  int s = moat_msg_send(fd, &m);
  moat_msg_free(&m);
  if (s < 0) {
    close(fd);
    r->err_no = -1;
    return -1;
  }
  pthread_t th;
  struct feeder fe = {fd, o->stdin_data, o->stdin_len};
  if (o->stream && o->write_first)
    feed_stdin(&fe);
  else if (o->stream)
    pthread_create(&th, NULL, feed_stdin, &fe);
  int ret = x_collect(fd, r);
  if (o->stream && !o->write_first) {
    shutdown(fd, SHUT_RDWR); /* unblocks a feeder stuck on a guest that stopped reading */
    pthread_join(th, NULL);
  }
  close(fd);
  return ret;
}

#define ARGV(...) ((const char *const[]){__VA_ARGS__, NULL})

/* ---- file client ---- */
struct f_entry {
  char path[4200], name[256], link[4200];
  char type;
  uint64_t size;
  uint32_t mode, uid, gid;
  int64_t mtime;
};

static char f_msg[1024]; /* message of the last REP_ERROR */

static void f_entry_from(const struct moat_msg *m, struct f_entry *e) {
  memset(e, 0, sizeof(*e));
  struct moat_field f;
  uint32_t t = 0;
  if (moat_msg_find(m, MOAT_T_PATH, &f))
    snprintf(e->path, sizeof(e->path), "%.*s", (int)f.len, (const char *)f.data);
  if (moat_msg_find(m, MOAT_T_NAME, &f))
    snprintf(e->name, sizeof(e->name), "%.*s", (int)f.len, (const char *)f.data);
  if (moat_msg_find(m, MOAT_T_LINK, &f))
    snprintf(e->link, sizeof(e->link), "%.*s", (int)f.len, (const char *)f.data);
  moat_msg_get_u32(m, MOAT_T_TYPE, &t);
  e->type = (char)t;
  moat_msg_get_u64(m, MOAT_T_SIZE, &e->size);
  moat_msg_get_u32(m, MOAT_T_MODE, &e->mode);
  moat_msg_get_u32(m, MOAT_T_UID, &e->uid);
  moat_msg_get_u32(m, MOAT_T_GID, &e->gid);
  moat_msg_get_i64(m, MOAT_T_MTIME, &e->mtime);
}

/* errno of a REP_ERROR (message into f_msg), 0 for other frames, -1 when none came. */
static int f_reply(int fd, struct moat_msg *m) {
  moat_error *err = NULL;
  int k = moat_msg_recv(fd, m, &err);
  if (k <= 0) {
    snprintf(f_msg, sizeof(f_msg), "recv: %s", k < 0 ? moat_error_msg(err) : "EOF");
    moat_error_free(&err);
    return -1;
  }
  if (m->type != MOAT_REP_ERROR)
    return 0;
  int32_t e = -1;
  moat_msg_get_i32(m, MOAT_T_ERRNO, &e);
  char *s = moat_msg_get_str(m, MOAT_T_MESSAGE);
  snprintf(f_msg, sizeof(f_msg), "%s", s ? s : "");
  free(s);
  return e;
}

/* Sends req on a new connection and reads the first reply into rep. Returns the connection. */
static int f_request(struct moat_msg *req, struct moat_msg *rep, int *status) {
  int fd = g_connect();
  if (fd < 0 || moat_msg_send(fd, req) < 0) {
    *status = -1;
    if (fd >= 0)
      close(fd);
    return -1;
  }
  *status = f_reply(fd, rep);
  return fd;
}

/* A simple request: returns 0 on REP_OK / REP_ENTRY (entry filled if e), the errno of REP_ERROR. */
static int f_simple(uint8_t type, const char *path, const char *path2, const char *user, int flag,
                    struct f_entry *e) {
  struct moat_msg req, rep;
  moat_msg_init(&req, type);
  moat_msg_init(&rep, 0);
  if (path)
    moat_msg_put_str(&req, MOAT_T_PATH, path);
  if (path2)
    moat_msg_put_str(&req, MOAT_T_PATH2, path2);
  if (user)
    moat_msg_put_str(&req, MOAT_T_USER, user);
  if (type == MOAT_REQ_REMOVE && flag >= 0)
    moat_msg_put_u32(&req, MOAT_T_RECURSIVE, (uint32_t)flag);
  if (type == MOAT_REQ_MKDIR && flag >= 0)
    moat_msg_put_u32(&req, MOAT_T_PARENTS, (uint32_t)flag);
  int st;
  int fd = f_request(&req, &rep, &st);
  if (st == 0 && e && rep.type == MOAT_REP_ENTRY)
    f_entry_from(&rep, e);
  if (st == 0 && rep.type != MOAT_REP_OK && rep.type != MOAT_REP_ENTRY)
    st = -1;
  if (fd >= 0)
    close(fd);
  moat_msg_free(&req);
  moat_msg_free(&rep);
  return st;
}

static int f_stat(const char *path, const char *user, struct f_entry *e) {
  return f_simple(MOAT_REQ_STAT, path, NULL, user, -1, e);
}

/* Lists path; entries into a new array (*out, *n). 0 or errno. */
static int f_list(const char *path, const char *user, uint32_t depth, struct f_entry **out, size_t *n) {
  struct moat_msg req, rep;
  moat_msg_init(&req, MOAT_REQ_LIST);
  moat_msg_init(&rep, 0);
  moat_msg_put_str(&req, MOAT_T_PATH, path);
  if (user)
    moat_msg_put_str(&req, MOAT_T_USER, user);
  if (depth)
    moat_msg_put_u32(&req, MOAT_T_DEPTH, depth);
  *out = NULL;
  *n = 0;
  int st;
  int fd = f_request(&req, &rep, &st);
  while (st == 0 && rep.type == MOAT_REP_ENTRY) {
    *out = xrealloc(*out, (*n + 1) * sizeof(struct f_entry));
    f_entry_from(&rep, &(*out)[(*n)++]);
    st = f_reply(fd, &rep);
  }
  if (st == 0 && rep.type != MOAT_MSG_END)
    st = -1;
  if (fd >= 0)
    close(fd);
  moat_msg_free(&req);
  moat_msg_free(&rep);
  return st;
}

/* Writes data to path in chunks of chunk bytes. mode < 0: not sent. 0 or errno (-1 protocol). */
static int f_write(const char *path, const void *data, size_t len, const char *user, long mode,
                   size_t chunk) {
  struct moat_msg req, rep;
  moat_msg_init(&req, MOAT_REQ_WRITE);
  moat_msg_init(&rep, 0);
  moat_msg_put_str(&req, MOAT_T_PATH, path);
  if (user)
    moat_msg_put_str(&req, MOAT_T_USER, user);
  if (mode >= 0)
    moat_msg_put_u32(&req, MOAT_T_MODE, (uint32_t)mode);
  int st;
  int fd = f_request(&req, &rep, &st);
  if (st == 0 && rep.type != MOAT_REP_OK)
    st = -1;
  for (size_t off = 0; st == 0 && off < len; off += chunk) {
    size_t n = len - off < chunk ? len - off : chunk;
    if (moat_msg_send_data(fd, MOAT_MSG_DATA, (const uint8_t *)data + off, n) < 0)
      break; /* the guest stopped reading: its error follows */
  }
  if (st == 0) {
    moat_msg_send_empty(fd, MOAT_MSG_END);
    st = f_reply(fd, &rep);
    uint64_t size = 0;
    if (st == 0 && (rep.type != MOAT_REP_OK || moat_msg_get_u64(&rep, MOAT_T_SIZE, &size) < 0 || size != len))
      st = -1;
  }
  if (fd >= 0)
    close(fd);
  moat_msg_free(&req);
  moat_msg_free(&rep);
  return st;
}

/* Reads path into a new buffer. 0 or errno (-1 protocol). size/mode as REP_OK reported them. */
static int f_read(const char *path, const char *user, char **data, size_t *len, uint64_t *size,
                  uint32_t *mode) {
  struct moat_msg req, rep;
  moat_msg_init(&req, MOAT_REQ_READ);
  moat_msg_init(&rep, 0);
  moat_msg_put_str(&req, MOAT_T_PATH, path);
  if (user)
    moat_msg_put_str(&req, MOAT_T_USER, user);
  *data = NULL;
  *len = 0;
  int st;
  int fd = f_request(&req, &rep, &st);
  if (st == 0) {
    if (rep.type != MOAT_REP_OK)
      st = -1;
    if (size)
      moat_msg_get_u64(&rep, MOAT_T_SIZE, size);
    if (mode)
      moat_msg_get_u32(&rep, MOAT_T_MODE, mode);
  }
  append(data, len, "", 0);
  while (st == 0) {
    st = f_reply(fd, &rep);
    if (st != 0 || rep.type == MOAT_MSG_END)
      break;
    struct moat_field f;
    if (rep.type != MOAT_MSG_DATA || !moat_msg_find(&rep, MOAT_T_DATA, &f)) {
      st = -1;
      break;
    }
    append(data, len, f.data, f.len);
  }
  if (fd >= 0)
    close(fd);
  moat_msg_free(&req);
  moat_msg_free(&rep);
  return st;
}

static uint64_t t_now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000;
}

/* Zombie children of pid, by scanning /proc (what `ps` would show as <defunct>). */
static int zombies_of(pid_t pid) {
  int n = 0;
  char cmd[128];
  snprintf(cmd, sizeof(cmd), "/proc/%d/task/%d/children", pid, pid);
  _cleanup_free_ char *kids = NULL;
  moat_error *err = NULL;
  if (read_file(cmd, &kids, NULL, &err) < 0) {
    moat_error_free(&err);
    return -1;
  }
  char *save = NULL;
  for (char *t = strtok_r(kids, " \n", &save); t; t = strtok_r(NULL, " \n", &save)) {
    char path[64];
    snprintf(path, sizeof(path), "/proc/%s/stat", t);
    _cleanup_free_ char *st = NULL;
    if (read_file(path, &st, NULL, &err) < 0) {
      moat_error_free(&err);
      continue;
    }
    char *rp = strrchr(st, ')');
    if (rp && rp[1] == ' ' && rp[2] == 'Z')
      n++;
  }
  return n;
}

#endif

/* test_guest_client.c -- processes and file watch through the host client (guest_client.c) against a
 * moat-guest started with --listen: background/attach/replay, 50 MB streams, kill on disconnect,
 * stdin, signals, tags, pty, watch, bad input, and the exec round trip. */
#include <poll.h>

#include "test_guest_util.h"

/* test_guest_* link only the guest's library: the client is compiled in here. */
#define feed_stdin client_feed_stdin /* test_guest_util.h has its own */
#include "proto/client/guest_client.c"
#undef feed_stdin
#include "host/linux/guest_channel.c"

/* The linux driver's channel, as a host hands it out. */
static struct moat_guest_channel g_channel = {.ops = &moat_linux_guest_channel_ops,
                                              .timeout_ms = MOAT_GUEST_TIMEOUT_MS_DEFAULT};

/* The guest started with --listen binds and listens itself: it is the socket's peer. */
static const struct moat_guest_ep *sock(void) {
  static struct moat_guest_ep ep;
  ep.ch = &g_channel;
  snprintf(ep.path, sizeof(ep.path), "%s", g_sock);
  ep.pid = g_pid;
  ep.uid = geteuid();
  return &ep;
}

static char **av(const char *a, const char *b, const char *c) {
  char **v = xcalloc(4, sizeof(char *));
  v[0] = xstrdup(a);
  v[1] = b ? xstrdup(b) : NULL;
  v[2] = b && c ? xstrdup(c) : NULL;
  return v;
}

static int bg_start(const char *cmd, const char *tag, struct moat_exec_opts *o, moat_error **err) {
  char **argv = av("sh", "-c", cmd);
  struct moat_exec_req r = {.argv = argv};
  struct moat_exec_opts def = {.background = true, .tag = tag};
  int pid = 0;
  if (moat_guest_exec_start(sock(), &r, o ? o : &def, NULL, &pid, err) < 0)
    pid = -1;
  strv_free(argv);
  return pid;
}

/* Reads a stream to its end: stdout into *out (appended), returns the exit code (-2: none). */
static int drain(struct moat_proc_stream *s, char **out, size_t *len, uint64_t *dropped, int timeout_ms) {
  for (;;) {
    struct moat_proc_event ev;
    moat_error *err = NULL;
    int r = moat_proc_stream_next(s, &ev, timeout_ms, &err);
    if (r <= 0) {
      moat_error_free(&err);
      return -2;
    }
    if (ev.type == MOAT_PROC_STDOUT && out)
      append(out, len, ev.data, ev.len);
    if (ev.type == MOAT_PROC_DROPPED && dropped)
      *dropped += ev.dropped;
    if (ev.type == MOAT_PROC_EXIT)
      return ev.exit_code >= 0 ? ev.exit_code : -100 - ev.signal;
  }
}

/* Waits until stdout of s holds want (or timeout); returns whether it did. Output kept in buf. */
static bool wait_for(struct moat_proc_stream *s, const char *want, char **buf, size_t *len, int ms) {
  uint64_t end = t_now_us() + (uint64_t)ms * 1000;
  while (!(*buf && strstr(*buf, want))) {
    int left = (int)((end - t_now_us()) / 1000);
    if (t_now_us() >= end)
      return false;
    struct moat_proc_event ev;
    moat_error *err = NULL;
    int r = moat_proc_stream_next(s, &ev, left, &err);
    moat_error_free(&err);
    if (r <= 0)
      return false;
    if (ev.type == MOAT_PROC_STDOUT)
      append(buf, len, ev.data, ev.len);
    if (ev.type == MOAT_PROC_EXIT)
      return *buf && strstr(*buf, want);
  }
  return true;
}

static bool alive(int pid) { return kill(pid, 0) == 0; }

static bool gone_within(int pid, int ms) {
  for (int i = 0; i < ms / 10; i++) {
    char path[64], *st = NULL;
    snprintf(path, sizeof(path), "/proc/%d/stat", pid);
    moat_error *err = NULL;
    if (read_file(path, &st, NULL, &err) < 0) {
      moat_error_free(&err);
      return true;
    }
    char *rp = strrchr(st, ')');
    bool z = rp && rp[1] == ' ' && rp[2] == 'Z';
    free(st);
    if (z)
      return true;
    usleep(10000);
  }
  return false;
}

static struct moat_proc_info *find_info(struct moat_proc_info *v, size_t n, int pid) {
  for (size_t i = 0; i < n; i++)
    if (v[i].pid == pid)
      return &v[i];
  return NULL;
}

static void test_background_attach(void) {
  moat_error *err = NULL;
  int pid = bg_start("echo first; echo err1 >&2; read x; echo got $x; exit 7", "bg1", NULL, &err);
  CHECK(pid > 0, "background exec replies with a pid (%d) %s", pid, err ? moat_error_msg(err) : "");
  moat_error_free(&err);
  usleep(100000);
  struct moat_proc_info *v = NULL;
  size_t n = 0;
  int r = moat_guest_procs(sock(), &v, &n, &err);
  struct moat_proc_info *pi = r == 0 ? find_info(v, n, pid) : NULL;
  CHECK(pi && pi->running && pi->background && pi->tag && strcmp(pi->tag, "bg1") == 0 &&
            strcmp(pi->argv[0], "sh") == 0 && pi->started_at_ms > 1600000000000,
        "PROCS lists the running background process with its tag and argv");
  moat_proc_infos_free(v, n);

  struct moat_proc_stream *s = NULL;
  struct moat_proc_info info;
  r = moat_guest_attach(sock(), 0, "bg1", true, &s, &info, &err);
  CHECK(r == 0 && info.pid == pid && info.running, "attach by tag with replay (%s)",
        err ? moat_error_msg(err) : "");
  moat_proc_info_clear(&info);
  moat_error_free(&err);
  char *out = NULL, *errs = NULL;
  size_t len = 0, elen = 0;
  bool ok = true;
  while (r == 0 && !(out && strstr(out, "first\n") && errs && strstr(errs, "err1\n"))) {
    struct moat_proc_event ev;
    if (moat_proc_stream_next(s, &ev, 2000, &err) <= 0) {
      ok = false;
      break;
    }
    if (ev.type == MOAT_PROC_STDOUT)
      append(&out, &len, ev.data, ev.len);
    if (ev.type == MOAT_PROC_STDERR)
      append(&errs, &elen, ev.data, ev.len);
  }
  moat_error_free(&err);
  CHECK(ok, "replay gives the output written before the attach (stdout and stderr)");
  /* input through the attach connection */
  if (s)
    moat_proc_stream_input(s, "hello\n", 6, &err);
  int code = s ? drain(s, &out, &len, NULL, 3000) : -2;
  CHECK(code == 7 && out && strstr(out, "got hello\n"),
        "DATA on an attach connection is stdin; exit 7 (%d) '%s'", code, out ? out : "");
  moat_proc_stream_close(s);
  free(out);
  free(errs);

  /* attach to the finished process: replay then the exit at once */
  s = NULL;
  out = NULL;
  len = 0;
  r = moat_guest_attach(sock(), pid, NULL, true, &s, &info, &err);
  code = r == 0 ? drain(s, &out, &len, NULL, 2000) : -2;
  CHECK(r == 0 && !info.running && info.exit_code == 7 && code == 7 && out && strstr(out, "first\n"),
        "attach after the exit: replay and exit (%d)", code);
  moat_proc_info_clear(&info);
  moat_proc_stream_close(s);
  free(out);

  r = moat_guest_procs(sock(), &v, &n, &err);
  pi = r == 0 ? find_info(v, n, pid) : NULL;
  CHECK(pi && !pi->running && pi->exit_code == 7 && pi->signal == 0, "PROCS keeps the finished process");
  moat_proc_infos_free(v, n);
}

/* The client refuses a socket whose listener is not the process it expects. */
static void test_peer_check(void) {
  struct moat_guest_ep ep = *sock();
  moat_error *err = NULL;
  CHECK(moat_guest_ping(&ep, 2000, &err) == 0, "ping with the right peer %s", err ? moat_error_msg(err) : "");
  moat_error_free(&err);
  ep.pid = getpid(); /* not the guest */
  int r = moat_guest_ping(&ep, 2000, &err);
  CHECK(r < 0 && err && err->status == EPROTO, "a socket whose peer is another pid: EPROTO (%s)",
        err ? moat_error_msg(err) : "accepted");
  moat_error_free(&err);
  ep = *sock();
  ep.uid = 12345;
  r = moat_guest_ping(&ep, 2000, &err);
  CHECK(r < 0 && err && err->status == EPROTO, "a socket whose peer has another uid: EPROTO");
  moat_error_free(&err);
  snprintf(ep.path, sizeof(ep.path), "%s.none", g_sock);
  ep.uid = geteuid();
  r = moat_guest_ping(&ep, 2000, &err);
  CHECK(r < 0 && err && err->status == ECONNREFUSED, "no socket: ECONNREFUSED (502), not ENOENT (404)");
  moat_error_free(&err);
}

/* RENEW: PID 1 execs itself with its table; processes, tags, rings and stdin carry over. */
static void test_renew(void) {
  moat_error *err = NULL;
  int pid = bg_start("echo before; read x; echo after $x; exit 3", "renew1", NULL, &err);
  CHECK(pid > 0, "background exec before the renewal %s", err ? moat_error_msg(err) : "");
  moat_error_free(&err);
  int done = bg_start("echo finished-before", "renew-done", NULL, &err);
  moat_error_free(&err);
  usleep(200000);
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/stat", (int)g_pid);
  struct stat st0, st1;
  int s0 = stat(path, &st0);
  int r = moat_guest_renew(sock(), &err);
  CHECK(r == 0, "RENEW answers once the new image runs (%s)", err ? moat_error_msg(err) : "");
  moat_error_free(&err);
  int s1 = stat(path, &st1);
  CHECK(s0 == 0 && s1 == 0 && kill(g_pid, 0) == 0, "the guest keeps its pid across the renewal");
  struct moat_proc_info *v = NULL;
  size_t n = 0;
  r = moat_guest_procs(sock(), &v, &n, &err);
  struct moat_proc_info *pi = r == 0 ? find_info(v, n, pid) : NULL;
  struct moat_proc_info *pd = r == 0 ? find_info(v, n, done) : NULL;
  CHECK(pi && pi->running && pi->tag && strcmp(pi->tag, "renew1") == 0 && pd && !pd->running &&
            pd->exit_code == 0,
        "the renewed table lists the running process (tag kept) and the finished one");
  moat_proc_infos_free(v, n);
  moat_error_free(&err);
  struct moat_proc_stream *s = NULL;
  r = moat_guest_attach(sock(), 0, "renew1", true, &s, NULL, &err);
  moat_error_free(&err);
  if (r == 0)
    moat_proc_stream_input(s, "x\n", 2, &err);
  moat_error_free(&err);
  char *out = NULL;
  size_t len = 0;
  int code = r == 0 ? drain(s, &out, &len, NULL, 3000) : -2;
  CHECK(code == 3 && out && strstr(out, "before\n") && strstr(out, "after x\n"),
        "after the renewal: replay of the old output, stdin, exit 3 (%d) '%s'", code, out ? out : "");
  moat_proc_stream_close(s);
  free(out);
}

static void test_big_stream(void) {
  /* 50 MB through the exec connection, complete and in order: compare checksums */
  /* a deterministic 50 MB sequence, checksummed here as it arrives and computed independently */
  char **argv =
      av("sh", "-c", "i=0; while [ $i -lt 5 ]; do seq 1000000 9999999 | head -c 10000000; i=$((i+1)); done");
  struct moat_exec_req r = {.argv = argv, .max_output = 64ull << 20};
  struct moat_proc_stream *s = NULL;
  moat_error *err = NULL;
  int pid = 0;
  uint64_t sum = 1469598103934665603ull, total = 0;
  int code = -2;
  if (moat_guest_exec_start(sock(), &r, NULL, &s, &pid, &err) == 0) {
    for (;;) {
      struct moat_proc_event ev;
      if (moat_proc_stream_next(s, &ev, 30000, &err) <= 0)
        break;
      if (ev.type == MOAT_PROC_STDOUT) {
        for (size_t i = 0; i < ev.len; i++)
          sum = (sum ^ (uint8_t)ev.data[i]) * 1099511628211ull;
        total += ev.len;
      }
      if (ev.type == MOAT_PROC_EXIT) {
        code = ev.exit_code;
        break;
      }
    }
  }
  moat_error_free(&err);
  moat_proc_stream_close(s);
  strv_free(argv);
  /* the same bytes, computed here */
  uint64_t want = 1469598103934665603ull;
  char *chunk = xmalloc(10000000 + 16);
  size_t cl = 0;
  for (unsigned v = 1000000; cl < 10000000; v++)
    cl += (size_t)snprintf(chunk + cl, 16, "%u\n", v);
  for (int k = 0; k < 5; k++)
    for (size_t i = 0; i < 10000000; i++)
      want = (want ^ (uint8_t)chunk[i]) * 1099511628211ull;
  free(chunk);
  CHECK(code == 0 && total == 50000000 && sum == want,
        "50 MB through an exec connection, complete and in order (%llu bytes)", (unsigned long long)total);
}

static void test_slow_attach(void) {
  /* an attach connection that does not read loses bytes, is told how many, and still sees the exit */
  moat_error *err = NULL;
  int pid = bg_start("sleep 0.3; head -c 20000000 /dev/zero; sleep 0.2", NULL, NULL, &err);
  struct moat_proc_stream *s = NULL;
  int r = moat_guest_attach(sock(), pid, NULL, false, &s, NULL, &err);
  moat_error_free(&err);
  usleep(2000000);
  uint64_t got = 0, dropped = 0;
  int code = -2;
  while (r == 0) {
    struct moat_proc_event ev;
    if (moat_proc_stream_next(s, &ev, 5000, &err) <= 0)
      break;
    if (ev.type == MOAT_PROC_STDOUT)
      got += ev.len;
    if (ev.type == MOAT_PROC_DROPPED)
      dropped += ev.dropped;
    if (ev.type == MOAT_PROC_EXIT) {
      code = ev.exit_code;
      break;
    }
  }
  moat_error_free(&err);
  moat_proc_stream_close(s);
  CHECK(code == 0 && dropped > 0 && got + dropped == 20000000,
        "a lagging attach gets REP_DROPPED: %llu received + %llu dropped = 20000000", (unsigned long long)got,
        (unsigned long long)dropped);
}

static void test_kill_on_disconnect(void) {
  char **argv = av("sh", "-c", "echo up; sleep 100");
  struct moat_exec_req r = {.argv = argv};
  struct moat_proc_stream *s = NULL;
  moat_error *err = NULL;
  int pid = 0;
  char *out = NULL;
  size_t len = 0;
  moat_guest_exec_start(sock(), &r, &(struct moat_exec_opts){.keep_on_disconnect = true}, &s, &pid, &err);
  bool up = s && wait_for(s, "up\n", &out, &len, 3000);
  moat_proc_stream_close(s);
  free(out);
  usleep(200000);
  CHECK(up && pid > 0 && alive(pid), "kill_on_disconnect=0: the process survives a dropped connection");
  struct moat_proc_stream *a = NULL;
  int ar = moat_guest_attach(sock(), pid, NULL, false, &a, NULL, &err);
  moat_error_free(&err);
  CHECK(ar == 0, "and stays attachable");
  moat_guest_proc_signal(sock(), pid, NULL, SIGKILL, &err);
  int code = a ? drain(a, NULL, NULL, NULL, 3000) : -2;
  CHECK(code == -100 - SIGKILL, "SIGKILL by pid ends it; the attach sees the exit (%d)", code);
  moat_proc_stream_close(a);
  moat_error_free(&err);

  s = NULL;
  out = NULL;
  len = 0;
  moat_guest_exec_start(sock(), &r, NULL, &s, &pid, &err);
  up = s && wait_for(s, "up\n", &out, &len, 3000);
  moat_proc_stream_close(s);
  free(out);
  CHECK(up && gone_within(pid, 2000), "kill_on_disconnect=1 (default): a dropped connection kills it");
  strv_free(argv);
  moat_error_free(&err);
}

static void test_stdin_signals_tags(void) {
  moat_error *err = NULL;
  int pid = bg_start("cat", "cat1", NULL, &err);
  struct moat_proc_stream *a = NULL;
  moat_guest_attach(sock(), pid, NULL, false, &a, NULL, &err);
  int r1 = moat_guest_proc_stdin(sock(), pid, NULL, "abc\n", 4, false, &err);
  char *out = NULL;
  size_t len = 0;
  bool got = a && wait_for(a, "abc\n", &out, &len, 3000);
  CHECK(r1 == 0 && got, "REQ_STDIN reaches the process");
  int r2 = moat_guest_proc_stdin(sock(), 0, "cat1", "", 0, true, &err);
  int code = a ? drain(a, &out, &len, NULL, 3000) : -2;
  CHECK(r2 == 0 && code == 0, "closing stdin (by tag): cat sees EOF and exits 0 (%d)", code);
  moat_proc_stream_close(a);
  free(out);
  moat_error_free(&err);
  int r3 = moat_guest_proc_stdin(sock(), pid, NULL, "x", 1, false, &err);
  CHECK(r3 < 0 && err && err->status == EPIPE, "stdin to a finished process -> EPIPE");
  moat_error_free(&err);

  int p2 = bg_start("sleep 100", "sleeper", NULL, &err);
  int p3 = bg_start("sleep 100", "sleeper", NULL, &err);
  CHECK(p2 > 0 && p3 < 0 && err && err->status == EEXIST, "a tag is unique among running processes (EEXIST)");
  moat_error_free(&err);
  int rs = moat_guest_proc_signal(sock(), 0, "sleeper", SIGTERM, &err);
  CHECK(rs == 0 && gone_within(p2, 2000), "SIGTERM by tag");
  moat_error_free(&err);
  usleep(50000);
  int p4 = bg_start("sleep 100", "sleeper", NULL, &err);
  CHECK(p4 > 0, "the tag is free again once the process ended");
  rs = moat_guest_proc_signal(sock(), p4, NULL, 99, &err);
  CHECK(rs < 0 && err && err->status == EINVAL, "signal 99 -> EINVAL");
  moat_error_free(&err);
  rs = moat_guest_proc_resize(sock(), p4, NULL, 80, 24, &err);
  CHECK(rs < 0 && err && err->status == ENOTTY, "resize of a process without a pty -> ENOTTY");
  moat_error_free(&err);
  moat_guest_proc_signal(sock(), p4, NULL, SIGKILL, &err);
  rs = moat_guest_proc_signal(sock(), 999999, NULL, SIGTERM, &err);
  CHECK(rs < 0 && err && err->status == ESRCH, "unknown pid -> ESRCH");
  moat_error_free(&err);
  struct moat_proc_stream *s = NULL;
  rs = moat_guest_attach(sock(), 0, "no-such-tag", false, &s, NULL, &err);
  CHECK(rs < 0 && err && err->status == ESRCH, "attach to an unknown tag -> ESRCH");
  moat_error_free(&err);
}

static void test_pty(void) {
  if (geteuid() != 0) {
    tap_skip("pty tests need root");
    return;
  }
  char **argv = av("sh", "-c", "tty; stty size; read x; stty size");
  struct moat_exec_req r = {.argv = argv};
  struct moat_proc_stream *s = NULL;
  moat_error *err = NULL;
  int pid = 0;
  char *out = NULL;
  size_t len = 0;
  int sr = moat_guest_exec_start(sock(), &r, &(struct moat_exec_opts){.pty_cols = 100, .pty_rows = 30}, &s,
                                 &pid, &err);
  bool ok = sr == 0 && wait_for(s, "30 100", &out, &len, 3000);
  CHECK(ok && strstr(out, "/dev/pts/"), "pty: tty prints /dev/pts/N and stty size is 30 100: '%s' %s",
        out ? out : "", err ? moat_error_msg(err) : "");
  moat_error_free(&err);
  int rr = moat_guest_proc_resize(sock(), pid, NULL, 0, 10, &err);
  CHECK(rr < 0 && err && err->status == EINVAL, "resize 0 -> EINVAL");
  moat_error_free(&err);
  rr = moat_guest_proc_resize(sock(), pid, NULL, 100000, 10, &err);
  CHECK(rr < 0 && err && err->status == EINVAL, "resize 100000 -> EINVAL");
  moat_error_free(&err);
  rr = moat_guest_proc_resize(sock(), pid, NULL, 120, 40, &err);
  moat_error_free(&err);
  if (s)
    moat_proc_stream_input(s, "go\n", 3, &err);
  moat_error_free(&err);
  int code = s ? drain(s, &out, &len, NULL, 3000) : -2;
  CHECK(rr == 0 && code == 0 && out && strstr(out, "40 120"), "RESIZE changes stty size to 40 120 (%d)",
        code);
  moat_proc_stream_close(s);
  free(out);
  strv_free(argv);

  /* an interactive shell echoes what it is sent and runs it */
  argv = av("sh", "-i", NULL);
  r = (struct moat_exec_req){.argv = argv};
  s = NULL;
  out = NULL;
  len = 0;
  moat_guest_exec_start(sock(), &r, &(struct moat_exec_opts){.pty_cols = 80, .pty_rows = 24}, &s, &pid, &err);
  if (s)
    moat_proc_stream_input(s, "echo hel''lo-pty\n", 17, &err);
  ok = s && wait_for(s, "echo hel''lo-pty", &out, &len, 3000) && wait_for(s, "hello-pty", &out, &len, 3000);
  CHECK(ok, "interactive sh on a pty echoes input and runs it");
  if (s)
    moat_proc_stream_input(s, "exit 3\n", 7, &err);
  code = s ? drain(s, &out, &len, NULL, 3000) : -2;
  CHECK(code == 3, "sh exits 3 (%d)", code);
  moat_proc_stream_close(s);
  free(out);
  strv_free(argv);
  moat_error_free(&err);
}

static bool want_event(struct moat_watch *w, const char *event, const char *path, const char *path2) {
  for (int i = 0; i < 50; i++) {
    struct moat_watch_event ev;
    moat_error *err = NULL;
    int r = moat_watch_next(w, &ev, 2000, &err);
    moat_error_free(&err);
    if (r <= 0)
      return false;
    if (strcmp(ev.event, event) == 0 && strcmp(ev.path, path) == 0 &&
        (!path2 || (ev.path2 && strcmp(ev.path2, path2) == 0)))
      return true;
  }
  return false;
}

static void test_watch(void) {
  char dir[200], p1[256], p2[256], sub[256], p3[256];
  snprintf(dir, sizeof(dir), "%s/w", g_dir);
  mkdir(dir, 0755);
  snprintf(p1, sizeof(p1), "%s/a.txt", dir);
  snprintf(p2, sizeof(p2), "%s/b.txt", dir);
  snprintf(sub, sizeof(sub), "%s/sub", dir);
  snprintf(p3, sizeof(p3), "%s/sub/c.txt", dir);
  struct moat_watch *w = NULL;
  moat_error *err = NULL;
  int r = moat_guest_watch(sock(), dir, NULL, true, &w, &err);
  CHECK(r == 0, "watch a directory (%s)", err ? moat_error_msg(err) : "");
  moat_error_free(&err);
  if (r < 0)
    return;
  FILE *f = fopen(p1, "w");
  fputs("x", f);
  fclose(f);
  CHECK(want_event(w, "create", p1, NULL), "create event");
  CHECK(want_event(w, "write", p1, NULL), "write event");
  rename(p1, p2);
  CHECK(want_event(w, "rename", p1, p2), "rename event with both paths");
  unlink(p2);
  CHECK(want_event(w, "remove", p2, NULL), "remove event");
  mkdir(sub, 0755);
  CHECK(want_event(w, "create", sub, NULL), "a new subdirectory");
  usleep(50000);
  f = fopen(p3, "w");
  fclose(f);
  CHECK(want_event(w, "create", p3, NULL), "recursive: create inside the new subdirectory");
  moat_watch_close(w);

  r = moat_guest_watch(sock(), p3, NULL, false, &w, &err);
  CHECK(r < 0 && err && err->status == ENOTDIR, "watch of a file -> ENOTDIR");
  moat_error_free(&err);
  r = moat_guest_watch(sock(), "/no/such/dir-moat", NULL, false, &w, &err);
  CHECK(r < 0 && err && err->status == ENOENT, "watch of a missing path -> ENOENT");
  moat_error_free(&err);
}

static void test_garbage_on_attach(void) {
  moat_error *err = NULL;
  int pid = bg_start("sleep 100", NULL, NULL, &err);
  int fd = g_connect();
  struct moat_msg m;
  moat_msg_init(&m, MOAT_REQ_ATTACH);
  moat_msg_put_i32(&m, MOAT_T_PID, pid);
  moat_msg_send(fd, &m);
  moat_error *e = NULL;
  int k = moat_msg_recv(fd, &m, &e);
  bool proc = k == 1 && m.type == MOAT_REP_PROC;
  write_all(fd, "\x05\x00\x00\x00\x07garbage-garbage", 20);
  bool closed = false;
  for (int i = 0; i < 20; i++) {
    k = moat_msg_recv(fd, &m, &e);
    moat_error_free(&e);
    if (k <= 0) {
      closed = true;
      break;
    }
  }
  close(fd);
  moat_msg_free(&m);
  CHECK(proc && closed, "garbage on an attach connection closes that connection");
  CHECK(alive(pid), "the process runs on");
  struct moat_exec_result res;
  char **argv = av("echo", "fine", NULL);
  struct moat_exec_req rq = {.argv = argv};
  int r = moat_guest_exec(sock(), &rq, &res, &err);
  CHECK(r == 0 && strcmp(res.out, "fine\n") == 0, "and PID 1 carries on");
  moat_exec_result_free(&res);
  strv_free(argv);
  moat_guest_proc_signal(sock(), pid, NULL, SIGKILL, &err);
  moat_error_free(&err);
}

static void test_exec_compat(void) {
  char **argv = av("sh", "-c", "cat; echo e >&2; exit 4");
  struct moat_exec_req rq = {.argv = argv, .stdin_data = "in-data", .stdin_len = 7};
  struct moat_exec_result res;
  moat_error *err = NULL;
  int r = moat_guest_exec(sock(), &rq, &res, &err);
  CHECK(r == 0 && res.exit_code == 4 && strcmp(res.out, "in-data") == 0 && strcmp(res.err, "e\n") == 0 &&
            res.pid > 0,
        "moat_guest_exec: stdin, stdout, stderr, exit code");
  moat_exec_result_free(&res);
  strv_free(argv);
  argv = av("sleep", "5", NULL);
  rq = (struct moat_exec_req){.argv = argv, .timeout_ms = 200};
  r = moat_guest_exec(sock(), &rq, &res, &err);
  CHECK(r == 0 && res.timed_out && res.signal == SIGKILL, "moat_guest_exec: timeout");
  moat_exec_result_free(&res);
  strv_free(argv);
  argv = av("true", NULL, NULL);
  rq = (struct moat_exec_req){.argv = argv, .cwd = "/nonexistent-moat"};
  r = moat_guest_exec(sock(), &rq, &res, &err);
  CHECK(r < 0 && err && err->status == ENOENT, "moat_guest_exec: bad cwd -> ENOENT");
  moat_error_free(&err);
  strv_free(argv);
}

/* Many execs in a row, each on its connection: none fails (their speed is make bench's). */
static void test_many_execs(void) {
  enum { N = 300 };
  char **argv = av("true", NULL, NULL);
  struct moat_exec_req rq = {.argv = argv};
  int done = 0;
  for (int i = 0; i < N; i++) {
    struct moat_exec_result res;
    moat_error *err = NULL;
    if (moat_guest_exec(sock(), &rq, &res, &err) < 0) {
      moat_error_free(&err);
      break;
    }
    done += res.exit_code == 0;
    moat_exec_result_free(&res);
  }
  strv_free(argv);
  CHECK(done == N, "%d execs in a row succeed (%d did)", N, done);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  g_start();
  test_exec_compat();
  test_peer_check();
  test_background_attach();
  test_stdin_signals_tags();
  test_kill_on_disconnect();
  test_big_stream();
  test_renew();
  test_slow_attach();
  test_pty();
  test_watch();
  test_garbage_on_attach();
  test_many_execs();
  g_stop();
  return tap_done();
}

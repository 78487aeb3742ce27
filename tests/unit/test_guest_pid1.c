/* test_guest_pid1.c -- moat-guest started as the driver starts it: PID 1 of a new pid namespace,
 * with MOAT_GUEST_LISTEN_FD / MOAT_GUEST_READY_FD; checks readiness, exec, orphan reaping, and that
 * PID 1 owns background and pty processes there. */
#include <sched.h>
#include <sys/syscall.h>

#include "test_guest_util.h"

#define feed_stdin client_feed_stdin /* test_guest_util.h has its own */
#include "proto/client/guest_client.c"
#undef feed_stdin
#include "host/linux/guest_channel.c"

/* The linux driver's channel, as a host hands it out. */
static struct moat_guest_channel g_channel = {.ops = &moat_linux_guest_channel_ops,
                                              .timeout_ms = MOAT_GUEST_TIMEOUT_MS_DEFAULT};

/* A background process and a pty process owned by PID 1 inside the namespace. */
static struct moat_guest_ep g_ep;

static void test_processes(void) {
  moat_error *err = NULL;
  char *bg_argv[] = {"sh", "-c", "echo $$; sleep 100", NULL};
  struct moat_exec_req rq = {.argv = bg_argv};
  int pid = 0;
  int r = moat_guest_exec_start(&g_ep, &rq, &(struct moat_exec_opts){.background = true, .tag = "ns-bg"},
                                NULL, &pid, &err);
  CHECK(r == 0 && pid > 1 && pid < 1000, "background process inside the namespace (pid %d) %s", pid,
        err ? moat_error_msg(err) : "");
  moat_error_free(&err);
  struct moat_proc_info *v = NULL;
  size_t n = 0;
  bool listed = false;
  if (moat_guest_procs(&g_ep, &v, &n, &err) == 0)
    for (size_t i = 0; i < n; i++)
      listed |= v[i].pid == pid && v[i].running && v[i].tag && strcmp(v[i].tag, "ns-bg") == 0;
  moat_proc_infos_free(v, n);
  moat_error_free(&err);
  CHECK(listed, "PROCS lists it as running");
  struct moat_proc_stream *s = NULL;
  int code = -2;
  if (moat_guest_attach(&g_ep, pid, NULL, true, &s, NULL, &err) == 0) {
    moat_guest_proc_signal(&g_ep, 0, "ns-bg", SIGTERM, &err);
    struct moat_proc_event ev;
    while (moat_proc_stream_next(s, &ev, 3000, &err) == 1)
      if (ev.type == MOAT_PROC_EXIT) {
        code = ev.signal;
        break;
      }
  }
  moat_proc_stream_close(s);
  moat_error_free(&err);
  CHECK(code == SIGTERM, "attach, SIGTERM by tag, the exit is reported (signal %d)", code);

  char *tty_argv[] = {"sh", "-c", "tty; stty size", NULL};
  rq = (struct moat_exec_req){.argv = tty_argv};
  s = NULL;
  char *out = NULL;
  size_t len = 0;
  code = -2;
  if (moat_guest_exec_start(&g_ep, &rq, &(struct moat_exec_opts){.pty_cols = 77, .pty_rows = 11}, &s, &pid,
                            &err) == 0) {
    struct moat_proc_event ev;
    while (moat_proc_stream_next(s, &ev, 3000, &err) == 1) {
      if (ev.type == MOAT_PROC_STDOUT)
        append(&out, &len, ev.data, ev.len);
      if (ev.type == MOAT_PROC_EXIT) {
        code = ev.exit_code;
        break;
      }
    }
  }
  moat_proc_stream_close(s);
  CHECK(code == 0 && out && strstr(out, "/dev/pts/") && strstr(out, "11 77"),
        "pty inside the namespace: '%s' %s", out ? out : "", err ? moat_error_msg(err) : "");
  free(out);
  moat_error_free(&err);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  if (geteuid() != 0) {
    printf("1..0 # SKIP needs root for a pid namespace\n");
    return 77;
  }
  const char *bin = getenv("MOAT_GUEST");
  if (!bin)
    bin = "build/moat-guest";
  snprintf(g_dir, sizeof(g_dir), "/tmp/moat-guest-pid1-XXXXXX");
  if (!mkdtemp(g_dir))
    return 1;
  snprintf(g_sock, sizeof(g_sock), "%s/guest.sock", g_dir);
  int lfd = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", g_sock);
  if (bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(lfd, 64) < 0)
    return 1;
  /* listen() ran here: this process is the socket's peer for the client's check */
  g_ep.ch = &g_channel;
  snprintf(g_ep.path, sizeof(g_ep.path), "%s", g_sock);
  g_ep.pid = getpid();
  g_ep.uid = geteuid();
  int rp[2];
  if (pipe(rp) < 0)
    return 1;
  uint64_t t0 = t_now_us();
  pid_t pid = (pid_t)syscall(SYS_clone, CLONE_NEWPID | SIGCHLD, 0, 0, 0, 0);
  if (pid < 0) {
    printf("1..0 # SKIP clone(CLONE_NEWPID): %s\n", strerror(errno));
    return 77;
  }
  if (pid == 0) {
    close(rp[0]);
    char l[16], r[16];
    snprintf(l, sizeof(l), "%d", lfd);
    snprintf(r, sizeof(r), "%d", rp[1]);
    setenv("MOAT_GUEST_LISTEN_FD", l, 1);
    setenv("MOAT_GUEST_READY_FD", r, 1);
    execl(bin, "moat-guest", (char *)NULL);
    _exit(127);
  }
  g_pid = pid;
  close(rp[1]);
  close(lfd);
  char c = 0;
  ssize_t n = read(rp[0], &c, 1);
  uint64_t ready_us = t_now_us() - t0;
  char c2;
  ssize_t n2 = read(rp[0], &c2, 1);
  close(rp[0]);
  CHECK(n == 1 && c == 'R' && n2 == 0, "ready byte 'R' then EOF (after %llu us)",
        (unsigned long long)ready_us);

  struct x_res r;
  x_run(&(struct x_opts){.argv = ARGV("sh", "-c", "echo $$; env | grep -c MOAT_GUEST; true")}, &r);
  int inner = atoi(r.out);
  CHECK(r.exit_code == 0 && inner > 1 && inner < 100 && r.pid > 1 && r.pid < 100,
        "command runs inside the pid namespace (pid %d, STARTED %d)", inner, r.pid);
  CHECK(strstr(r.out, "\n0\n") != NULL, "MOAT_GUEST_* variables not passed to commands: '%s'", r.out);
  x_res_free(&r);

  x_run(&(struct x_opts){.argv = ARGV("sh", "-c", "ls /proc/self/fd | wc -l")}, &r);
  CHECK(r.exit_code == 0 && atoi(r.out) == 4, "listen and ready fds not inherited (%s)", r.out);
  x_res_free(&r);

  for (int i = 0; i < 40; i++) {
    x_run(&(struct x_opts){.argv = ARGV("sh", "-c", "sleep 0.02 & sleep 0.01 & true")}, &r);
    x_res_free(&r);
  }
  int z = -1;
  for (int i = 0; i < 50; i++) {
    usleep(20000);
    z = zombies_of(g_pid);
    if (z == 0)
      break;
  }
  CHECK(z == 0, "PID 1 reaps orphans: no zombies after 40 execs (%d)", z);

  x_run(&(struct x_opts){.argv = ARGV("sh", "-c", "sleep 100 & sleep 100"), .timeout_ms = 200}, &r);
  CHECK(r.timed_out == 1 && r.sig == SIGKILL, "timeout inside the namespace");
  x_res_free(&r);

  test_processes();

  kill(g_pid, SIGKILL);
  waitpid(g_pid, NULL, 0);
  moat_error *err = NULL;
  rm_rf(g_dir, &err);
  moat_error_free(&err);
  return tap_done();
}

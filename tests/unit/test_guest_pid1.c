/* test_guest_pid1.c -- moat-guest started as the driver starts it: PID 1 of a new pid namespace,
 * with MOAT_GUEST_LISTEN_FD / MOAT_GUEST_READY_FD; checks readiness, exec, orphan reaping. */
#include <sched.h>
#include <sys/syscall.h>

#include "test_guest_util.h"

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

  kill(g_pid, SIGKILL);
  waitpid(g_pid, NULL, 0);
  moat_error *err = NULL;
  rm_rf(g_dir, &err);
  moat_error_free(&err);
  return tap_done();
}

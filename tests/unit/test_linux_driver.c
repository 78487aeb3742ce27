/* test_linux_driver.c -- the linux driver end to end: create, guest ping/exec, limits, destroy,
 * crash-style adopt and reconcile. Needs root and a built base template (skips with 77 without). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <signal.h>
#include <unistd.h>

#include "common/util.h"
#include "host/driver.h"
#include "proto/client/guest_client.h"

#include "tap.h"

/* A test named name; detail (may be NULL) is added to the line only when it failed. */
static void ok(bool cond, const char *name, const char *detail) {
  bool show = !cond && detail;
  tap_ok(cond, "%s%s%s", name, show ? ": " : "", show ? detail : "");
}

static char *exec_out(const struct moat_guest_ep *sock, const char *cmd, int *code) {
  char *argv[] = {"/bin/sh", "-c", (char *)cmd, NULL};
  struct moat_exec_req req = {.argv = argv, .timeout_ms = 10000};
  struct moat_exec_result res;
  moat_error *err = NULL;
  if (moat_guest_exec(sock, &req, &res, &err) < 0) {
    fprintf(stderr, "# exec %s: %s\n", cmd, moat_error_msg(err));
    moat_error_free(&err);
    *code = -100;
    return xstrdup("");
  }
  *code = res.exit_code;
  char *out = xstrdup(res.out);
  out[strcspn(out, "\n")] = '\0';
  moat_exec_result_free(&res);
  return out;
}

int main(void) {
  const char *tdir = getenv("MOAT_TEST_TEMPLATE_DIR");
  if (!tdir)
    tdir = "/var/tmp/moat-test-templates";
  _cleanup_free_ char *ready = xasprintf("%s/base/ready", tdir);
  if (geteuid() != 0 || access(ready, F_OK) < 0) {
    printf("1..0 # SKIP needs root and a built base template in %s\n0 passed, 0 failed\n", tdir);
    return 77;
  }
  const char *guest = getenv("MOAT_GUEST");
  if (!guest)
    guest = "build/moat-guest";
  char data[] = "/var/tmp/moat-test-driver-XXXXXX";
  if (!mkdtemp(data)) {
    perror("mkdtemp");
    return 1;
  }
  struct moat_host_config cfg = {.data_dir = data,
                                 .template_dir = tdir,
                                 .guest_path = guest,
                                 .pool_size = 0,
                                 .pool_template = "base",
                                 .max_slots = 64};
  struct moat_host *h = NULL;
  moat_error *err = NULL;
  int r = moat_host_init(&h, &cfg, &err);
  ok(r == 0, "host init", moat_error_msg(err));
  if (r < 0)
    return 1;
  /* A claim left by a moatd whose data dir is gone is freed by anyone's reconcile. */
  const char *stale = "/run/moat/ranges/49149";
  bool planted = false;
  if (access(stale, F_OK) < 0) {
    FILE *f = fopen(stale, "w");
    if (f) {
      fputs("/var/tmp/moat-test-driver-no-such-dir", f);
      fclose(f);
      planted = true;
    }
  }
  moat_host_reconcile(h, NULL);
  if (planted)
    ok(access(stale, F_OK) < 0, "reconcile frees a claim whose data dir is gone", NULL);

  struct moat_limits lim = {.cpu = 1, .memory_mb = 256, .pids = 128, .disk_mb = 64};
  struct moat_instance inst;
  uint64_t t0 = now_ns();
  r = moat_host_create(h, "base", &lim, &inst, &err);
  ok(r == 0, "create a sandbox on the request path", moat_error_msg(err));
  if (r < 0)
    return 1;
  printf("# request-path create: %.2f ms\n", (double)(now_ns() - t0) / 1e6);
  ok(moat_guest_ping(&inst.guest, 2000, &err) == 0, "guest answers ping", moat_error_msg(err));
  ok(moat_host_alive(h, inst.slot), "alive", NULL);

  int code;
  _cleanup_free_ char *uid = exec_out(&inst.guest, "id -u", &code);
  ok(code == 0 && strcmp(uid, "0") == 0, "root inside", uid);
  _cleanup_free_ char *map = exec_out(&inst.guest, "cat /proc/self/uid_map | tr -s ' '", &code);
  ok(strstr(map, " 0 1073741824") == NULL && strstr(map, "65536") != NULL, "uid range is not the host's root",
     map);
  _cleanup_free_ char *pid1 = exec_out(&inst.guest, "cat /proc/1/comm", &code);
  ok(strcmp(pid1, "moat-guest") == 0, "moat-guest is pid 1", pid1);
  _cleanup_free_ char *nproc = exec_out(&inst.guest, "ls /proc | grep -c '^[0-9]'", &code);
  ok(atoi(nproc) <= 6, "only the sandbox's processes are visible", nproc);
  _cleanup_free_ char *host = exec_out(&inst.guest, "hostname", &code);
  ok(strcmp(host, "sandbox") == 0, "own hostname", host);
  _cleanup_free_ char *mnt = exec_out(&inst.guest, "mount -t tmpfs none /mnt 2>&1; echo rc=$?", &code);
  ok(strstr(mnt, "rc=0") == NULL, "mount is denied", mnt);
  _cleanup_free_ char *dd =
      exec_out(&inst.guest,
               "dd if=/dev/zero of=/big bs=1M count=200 2>&1 | grep -o 'No space left' ; rm -f /big", &code);
  ok(strstr(dd, "No space left") != NULL || strstr(dd, "space") != NULL, "disk limit gives ENOSPC", dd);
  _cleanup_free_ char *net =
      exec_out(&inst.guest, "cat /sys/class/net/lo/operstate; ls /sys/class/net | wc -l", &code);
  ok(code == 0, "sysfs mounted, loopback only", net);

  r = moat_host_destroy(h, inst.slot, &err);
  ok(r == 0, "destroy", moat_error_msg(err));
  /* A crash-style restart: shut down (teardowns run), new host, reconcile. */
  moat_host_shutdown(h);
  r = moat_host_init(&h, &cfg, &err);
  ok(r == 0, "host re-init", moat_error_msg(err));
  int cleaned = moat_host_reconcile(h, &err);
  ok(cleaned == 0, "nothing left to reconcile after destroy", NULL);
  _cleanup_free_ char *slots = xasprintf("%s/host/slots", data);
  _cleanup_free_ char *ls = xasprintf("ls -A %s | wc -l", slots);
  FILE *p = popen(ls, "r");
  int left = -1;
  if (p) {
    if (fscanf(p, "%d", &left) != 1)
      left = -1;
    pclose(p);
  }
  ok(left == 0, "no slot dirs left", NULL);

  /* Leftovers of a "crashed" moatd: a sandbox nobody adopts is removed by reconcile. */
  r = moat_host_create(h, "base", &lim, &inst, &err);
  ok(r == 0, "create again", moat_error_msg(err));
  pid_t orphan = inst.pid;
  moat_host_shutdown(h); /* assigned sandboxes survive shutdown */
  ok(kill(orphan, 0) == 0, "sandbox survives moatd shutdown", NULL);
  r = moat_host_init(&h, &cfg, &err);
  cleaned = moat_host_reconcile(h, &err);
  ok(cleaned == 1, "reconcile removes an unadopted sandbox", NULL);
  usleep(100000);
  ok(waitpid(orphan, NULL, WNOHANG) == orphan, "its processes are gone", NULL);
  moat_host_shutdown(h);
  moat_error_free(&err);
  rm_rf(data, NULL);
  return tap_done();
}

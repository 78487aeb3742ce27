/* test_host_ports.c -- what the host hands out to reach into a running sandbox without control/
 * making syscalls: moat_host_port_connect (a TCP connection made on the sandbox's own loopback,
 * never the host's) and moat_host_disk_usage. Needs root and a built base
 * template (skips with 77 without). */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include "common/util.h"
#include "host/driver.h"
#include "proto/client/guest_client.h"

#include "tap.h"

/* The message of err, or "" when there is none. */
static const char *em(const moat_error *err) { return err ? moat_error_msg(err) : ""; }

static int sh(const struct moat_guest_ep *ep, const char *cmd) {
  char *argv[] = {"/bin/sh", "-c", (char *)cmd, NULL};
  struct moat_exec_req req = {.argv = argv, .timeout_ms = 20000};
  struct moat_exec_result res;
  moat_error *err = NULL;
  if (moat_guest_exec(ep, &req, &res, &err) < 0) {
    printf("# exec %s: %s\n", cmd, em(err));
    moat_error_free(&err);
    return -1;
  }
  int code = res.exit_code;
  moat_exec_result_free(&res);
  return code;
}

/* A listener on the host's own 127.0.0.1 at a free port; its fd, the port in *port. */
static int host_listener(unsigned *port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t l = sizeof(a);
  if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(fd, 8) < 0 ||
      getsockname(fd, (struct sockaddr *)&a, &l) < 0)
    return -1;
  *port = ntohs(a.sin_port);
  return fd;
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
  char data[] = "/var/tmp/moat-test-hostports-XXXXXX";
  if (!mkdtemp(data)) {
    perror("mkdtemp");
    return 1;
  }
  struct moat_host_config cfg = {
      .data_dir = data, .template_dir = tdir, .guest_path = guest, .pool_template = "base", .max_slots = 16};
  struct moat_host *h = NULL;
  moat_error *err = NULL;
  if (!OK(moat_host_init(&h, &cfg, &err) == 0, "host init: %s", em(err))) {
    rm_rf(data, NULL);
    return 1;
  }
  OK(moat_host_reconcile(h, &err) >= 0, "reconcile: %s", em(err));
  struct moat_limits lim = {.cpu = 1, .memory_mb = 256, .pids = 128, .disk_mb = 64};
  struct moat_instance inst;
  if (!OK(moat_host_create(h, "base", &lim, &inst, &err) == 0, "create: %s", em(err))) {
    moat_host_shutdown(h);
    rm_rf(data, NULL);
    return 1;
  }

  /* The host's loopback listens on port; the sandbox's does not (yet). */
  unsigned port = 0;
  _cleanup_close_ int lfd = host_listener(&port);
  OK(lfd >= 0, "a listener on the host's 127.0.0.1:%u", port);
  int fd = moat_host_port_connect(h, inst.slot, port, 2000, &err);
  OK(fd < 0 && err && err->status == ECONNREFUSED, "a port only the host listens on is refused: %s",
     fd < 0 ? em(err) : "connected");
  if (fd >= 0)
    close(fd);
  moat_error_free(&err);
  struct pollfd pl = {.fd = lfd, .events = POLLIN};
  OK(poll(&pl, 1, 200) == 0, "the host's listener got no connection");

  /* A server on the sandbox's loopback, same port: the connection reaches it. */
  _cleanup_free_ char *srv =
      xasprintf("(python3 -c 'import socket\n"
                "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
                "s.bind((\"127.0.0.1\", %u)); s.listen(4)\n"
                "for _ in range(8):\n"
                "    c, _ = s.accept(); c.sendall(b\"inside\\n\"); c.close()' </dev/null >/dev/null 2>&1 &)",
                port);
  OK(sh(&inst.guest, srv) == 0, "start a server inside on port %u", port);
  fd = -1;
  for (int i = 0; i < 100 && fd < 0; i++) { /* until it listens: at most 5 s */
    moat_error_free(&err);
    fd = moat_host_port_connect(h, inst.slot, port, 2000, &err);
    if (fd < 0)
      usleep(50000);
  }
  char buf[16] = "";
  struct timeval tv = {.tv_sec = 5};
  if (fd >= 0)
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)); /* a wrong peer never answers */
  ssize_t n = fd >= 0 ? read(fd, buf, sizeof(buf) - 1) : -1;
  if (n > 0)
    buf[n] = '\0';
  OK(fd >= 0 && strcmp(buf, "inside\n") == 0, "the connection reaches the sandbox's server: %s",
     fd < 0 ? em(err) : buf);
  if (fd >= 0)
    close(fd);
  moat_error_free(&err);
  OK(poll(&pl, 1, 0) == 0, "still nothing reached the host's listener");
  OK(moat_host_port_connect(h, inst.slot, 0, 1000, &err) < 0 && err->status == EINVAL, "port 0 is EINVAL");
  moat_error_free(&err);

  /* Disk usage is the writable layer's: about disk_mb, and grows with what the sandbox writes. */
  struct moat_disk_usage d0 = {0}, d1 = {0};
  int r = moat_host_disk_usage(h, inst.slot, &d0, &err);
  OK(r == 0 && d0.total_bytes > (32ull << 20) && d0.total_bytes <= (64ull << 20),
     "disk total is the 64 MiB layer's: %llu bytes %s", (unsigned long long)d0.total_bytes, em(err));
  moat_error_free(&err);
  OK(sh(&inst.guest, "dd if=/dev/urandom of=/root/f bs=1M count=8 2>/dev/null && sync") == 0,
     "write 8 MiB inside");
  r = moat_host_disk_usage(h, inst.slot, &d1, &err);
  OK(r == 0 && d1.used_bytes >= d0.used_bytes + (7ull << 20), "disk used grows by the 8 MiB: %llu -> %llu",
     (unsigned long long)d0.used_bytes, (unsigned long long)d1.used_bytes);
  moat_error_free(&err);

  /* No sandbox in the slot: ENOENT, nothing reached. */
  int other = inst.slot == 0 ? 1 : 0;
  OK(moat_host_disk_usage(h, other, &d1, &err) < 0 && err->status == ENOENT,
     "disk usage of an empty slot is ENOENT");
  moat_error_free(&err);
  OK(moat_host_port_connect(h, -1, port, 1000, &err) < 0 && err->status == ENOENT, "slot -1 is ENOENT");
  moat_error_free(&err);
  OK(moat_host_destroy(h, inst.slot, &err) == 0, "destroy: %s", em(err));
  fd = moat_host_port_connect(h, inst.slot, port, 1000, &err);
  OK(fd < 0 && err && err->status == ENOENT, "a destroyed sandbox's port is ENOENT: %s", em(err));
  if (fd >= 0)
    close(fd);
  moat_error_free(&err);
  moat_host_shutdown(h);
  rm_rf(data, NULL);
  return tap_done();
}

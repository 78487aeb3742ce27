/* test_fault.c -- fault injection (common/fault.h) through control, host and store: the Nth mount,
 * clone or store write of a create, a fork or a delete fails, for every N the operation reaches
 * (or, past MAX_STEPS, N by a stride), and afterwards nothing is left that the operation made: no
 * mount, loop device, cgroup, uid-range claim or file under the data dir, no fd of this process,
 * no store row (the failed create or fork is not listed; a failed delete leaves a sandbox that a
 * second delete removes). An operation the fault did not stop (the failing call was one it
 * tolerates) is undone and checked the same way.
 *
 * With `ip` (iproute2) the sandboxes have networking, uplinked to an empty network namespace of the
 * test's own (nothing leaves the machine), and the Nth netlink request fails too: then no veth is
 * left in moatd's routing namespace either (their count is back to the warm set's).
 * Needs root and a built base template (skips with 77 without); fork needs working CRIU (skipped
 * without). Background work is kept quiet (no warm pool, no reaper pass during the test): every
 * counted call is the operation's. An allocation failure aborts (xmalloc's contract:
 * test_common_assert); what an abort leaves is a crash's, which test_crash covers. */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/buf.h"
#include "common/fault.h"
#include "common/log.h"
#include "common/util.h"
#include "control/control.h"
#include "host/net/net.h"
#include "tap.h"

#define MAX_STEPS 24    /* points tried per kind and operation (a stride beyond) */
#define SETTLE_MS 10000 /* how long what an operation releases off its path may take to go */

static char data_dir[] = "/var/tmp/moat-test-fault-XXXXXX";
static char *real_dir, instance[17];
static char uplink_ns[64]; /* /run/netns/NAME of the empty uplink, or "" without networking */

static char *repo_path(const char *rel) {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0)
    return NULL;
  buf[n] = 0;
  for (char *d; (d = strrchr(buf, '/')) != NULL;) { /* REPO/build[/san]/tests/test_fault */
    *d = 0;
    char probe[4200];
    snprintf(probe, sizeof(probe), "%s/Makefile", buf);
    if (access(probe, F_OK) == 0)
      return xasprintf("%s/%s", buf, rel);
  }
  return NULL;
}

/* The linux driver's name for this data dir (FNV-1a of its real path): its cgroups and channel
 * dirs are named so. */
static void instance_of(const char *dir) {
  uint64_t x = 1469598103934665603ull;
  for (const char *p = dir; *p; p++) {
    x ^= (unsigned char)*p;
    x *= 1099511628211ull;
  }
  snprintf(instance, sizeof(instance), "%016llx", (unsigned long long)x);
}

/* Appends the line "KIND A B" (b ends with its newline, or add one). */
static void add_line(struct moat_buf *b, const char *kind, const char *a, const char *c) {
  moat_buf_append(b, kind, strlen(kind));
  moat_buf_append(b, " ", 1);
  moat_buf_append(b, a, strlen(a));
  moat_buf_append(b, c, strlen(c));
  if (b->len && b->p[b->len - 1] != '\n')
    moat_buf_append(b, "\n", 1);
}

/* Files under dir (recursively), as "file PATH" lines; the store's own files are not the
 * operation's. */
static void walk(struct moat_buf *b, const char *dir) {
  DIR *d = opendir(dir);
  if (!d)
    return;
  struct dirent *de;
  while ((de = readdir(d))) {
    if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..") || !strncmp(de->d_name, "moat.db", 7))
      continue;
    _cleanup_free_ char *p = xasprintf("%s/%s", dir, de->d_name);
    add_line(b, "file", p, "");
    struct stat st;
    if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode))
      walk(b, p);
  }
  closedir(d);
}

/* Cgroup directories below the instance's, in every hierarchy mounted under /sys/fs/cgroup. */
static void cgroups(struct moat_buf *b, const char *dir, int depth) {
  DIR *d = opendir(dir);
  if (!d)
    return;
  struct dirent *de;
  while ((de = readdir(d))) {
    if (de->d_type != DT_DIR || de->d_name[0] == '.')
      continue;
    _cleanup_free_ char *p = xasprintf("%s/%s", dir, de->d_name);
    if (strstr(p, instance))
      add_line(b, "cgroup", p, "");
    if (depth < 6)
      cgroups(b, p, depth + 1);
  }
  closedir(d);
}

/* What the instance holds on the host now, one sorted-enough line per thing. */
static char *snapshot(void) {
  struct moat_buf b = {0};
  moat_buf_append(&b, "", 0);
  /* fds of this process */
  DIR *d = opendir("/proc/self/fd");
  int fds = 0;
  while (d && readdir(d))
    fds++;
  if (d)
    closedir(d);
  char n[32];
  snprintf(n, sizeof(n), "%d", fds);
  add_line(&b, "fds", n, "");
  /* mounts under the data dir or the instance's channel dir */
  FILE *f = fopen("/proc/self/mountinfo", "r");
  char line[4096];
  while (f && fgets(line, sizeof(line), f))
    if (strstr(line, real_dir) || strstr(line, instance))
      add_line(&b, "mount", line, "");
  if (f)
    fclose(f);
  /* loop devices backed by files under the data dir */
  d = opendir("/sys/block");
  struct dirent *de;
  while (d && (de = readdir(d))) {
    if (strncmp(de->d_name, "loop", 4))
      continue;
    _cleanup_free_ char *p = xasprintf("/sys/block/%s/loop/backing_file", de->d_name);
    _cleanup_free_ char *back = NULL;
    if (read_file(p, &back, NULL, NULL) == 0 && strstr(back, real_dir))
      add_line(&b, "loop", de->d_name, back);
  }
  if (d)
    closedir(d);
  /* uid-range claims naming the data dir */
  d = opendir("/run/moat/ranges");
  while (d && (de = readdir(d))) {
    _cleanup_free_ char *p = xasprintf("/run/moat/ranges/%s", de->d_name);
    _cleanup_free_ char *owner = NULL;
    if (de->d_name[0] != '.' && read_file(p, &owner, NULL, NULL) == 0 && strstr(owner, real_dir))
      add_line(&b, "range", de->d_name, "");
  }
  if (d)
    closedir(d);
  cgroups(&b, "/sys/fs/cgroup", 0);
  walk(&b, real_dir);
  if (uplink_ns[0]) { /* links of moatd's routing namespace */
    _cleanup_free_ char *cmd =
        xasprintf("nsenter --net=/run/moat/net/%s ip -o link show 2>&1 | wc -l", instance);
    FILE *p = popen(cmd, "r");
    char cnt[32] = "?";
    if (p && fgets(cnt, sizeof(cnt), p))
      cnt[strcspn(cnt, "\n")] = '\0';
    if (p)
      pclose(p);
    add_line(&b, "routing-ns links", cnt, "");
  }
  return b.p;
}

/* A snapshot that stays the same for half a second (what a delete releases off its path has gone,
 * the warm network slot is back), within SETTLE_MS. */
static char *steady_snapshot(void) {
  char *a = snapshot();
  for (int i = 0; i < SETTLE_MS / 500; i++) {
    usleep(500000);
    char *b = snapshot();
    bool same = strcmp(a, b) == 0;
    free(a);
    a = b;
    if (same)
      break;
  }
  return a;
}

/* NULL when the host is back to base within SETTLE_MS, else what differs (caller frees). */
static char *settle(const char *base) {
  char *now = NULL;
  for (int i = 0; i < SETTLE_MS / 50; i++) {
    free(now);
    now = snapshot();
    if (strcmp(now, base) == 0) {
      free(now);
      return NULL;
    }
    usleep(50000);
  }
  /* the first line of now that base lacks, or of base that now lacks */
  struct moat_buf diff = {0};
  moat_buf_append(&diff, "", 0);
  for (int pass = 0; pass < 2; pass++) {
    const char *a = pass ? base : now, *b = pass ? now : base;
    for (const char *l = a; *l;) {
      const char *e = strchr(l, '\n');
      size_t len = e ? (size_t)(e - l) + 1 : strlen(l);
      _cleanup_free_ char *one = xstrndup(l, len);
      if (!strstr(b, one) && diff.len < 600) {
        moat_buf_append(&diff, pass ? "gone: " : "left: ", 6);
        moat_buf_append(&diff, one, strlen(one) - (one[len - 1] == '\n'));
        moat_buf_append(&diff, "; ", 2);
      }
      l += len;
    }
  }
  free(now);
  return diff.p;
}

static struct moat_control *ctl;
static char parent[64]; /* a running sandbox to fork */

static int n_sandboxes(void) {
  struct moat_sandbox_info *v = NULL;
  size_t n = 0;
  moat_error *err = NULL;
  if (moat_control_list(ctl, "default", NULL, NULL, &v, &n, &err) < 0) {
    moat_error_free(&err);
    return -1;
  }
  moat_sandbox_infos_free(v, n);
  return (int)n;
}

static int kill_all_but(const char *keep) {
  struct moat_sandbox_info *v = NULL;
  size_t n = 0;
  moat_error *err = NULL;
  if (moat_control_list(ctl, "default", NULL, NULL, &v, &n, &err) < 0) {
    moat_error_free(&err);
    return -1;
  }
  for (size_t i = 0; i < n; i++)
    if (!keep || strcmp(v[i].id, keep) != 0) {
      if (moat_control_kill(ctl, "default", v[i].id, "api", &err) < 0)
        moat_error_free(&err);
    }
  moat_sandbox_infos_free(v, n);
  return 0;
}

static const struct moat_sandbox_spec spec = {
    .template_name = "base",
    .ttl_seconds = 600,
    .limits = {.memory_mb = 128, .disk_mb = 64, .pids = 128, .cpu = 1}};

/* The operations. Each returns 0 or -1 with *err; what it made stays for the check. */
static int op_create(moat_error **err) {
  struct moat_sandbox_info i;
  int rc = moat_control_create(ctl, "default", &spec, &i, err);
  if (rc == 0)
    moat_sandbox_info_clear(&i);
  return rc;
}

static int op_fork(moat_error **err) {
  struct moat_sandbox_info *kids = NULL;
  int rc = moat_control_fork(ctl, "default", parent, 2, false, &kids, err);
  if (rc == 0)
    moat_sandbox_infos_free(kids, 2);
  return rc;
}

static char victim[64]; /* made unarmed before each delete */
static int prep_delete(void) {
  struct moat_sandbox_info i;
  moat_error *err = NULL;
  if (moat_control_create(ctl, "default", &spec, &i, &err) < 0) {
    OK(false, "create a sandbox to delete: %s", moat_error_msg(err));
    moat_error_free(&err);
    return -1;
  }
  snprintf(victim, sizeof(victim), "%s", i.id);
  moat_sandbox_info_clear(&i);
  return 0;
}
static int op_delete(moat_error **err) { return moat_control_kill(ctl, "default", victim, "api", err); }

struct op {
  const char *name;
  int (*prep)(void); /* unarmed, before each try */
  int (*run)(moat_error **err);
};

/* Tries op with kind failing at each N; one TAP line per N. */
static void sweep(const struct op *op, enum moat_fault_kind kind, const char *base) {
  const char *kn = moat_fault_name(kind);
  moat_error *err = NULL;
  if (op->prep && op->prep() < 0)
    return;
  moat_fault_set(kind, MOAT_FAULT_COUNT);
  int rc = op->run(&err);
  if (rc < 0) {
    OK(false, "%s without a fault: %s", op->name, moat_error_msg(err));
    moat_error_free(&err);
  }
  /* the delete's own calls go on off its path (the network slot's teardown waits a few seconds on
   * the worker): counted once the host is back to base (a create's undoing is a delete, measured
   * on its own) */
  _cleanup_free_ char *steady = op->run == op_delete ? settle(base) : NULL;
  unsigned long total = moat_fault_count(kind);
  moat_fault_set(kind, 0);
  kill_all_but(parent);
  _cleanup_free_ char *d0 = settle(base);
  if (!OK(d0 == NULL, "%s and its undoing leave the host as it was%s%s", op->name, d0 ? ": " : "",
          d0 ? d0 : ""))
    return;
  if (total == 0) {
    printf("# %s makes no %s call\n", op->name, kn);
    return;
  }
  unsigned long stride = total > MAX_STEPS ? (total + MAX_STEPS - 1) / MAX_STEPS : 1;
  printf("# %s: %lu %s calls, trying every %lu%s\n", op->name, total, kn, stride, stride > 1 ? "th" : "");
  for (unsigned long n = 1; n <= total; n += stride) {
    if (op->prep && op->prep() < 0)
      return;
    int before = n_sandboxes();
    moat_fault_set(kind, n);
    uint64_t t0 = now_ns();
    rc = op->run(&err);
    uint64_t took = now_ns() - t0;
    bool failed = rc < 0;
    bool said = !failed || (err && err->msg && err->msg[0]);
    char why[200];
    snprintf(why, sizeof(why), "%s", failed ? moat_error_msg(err) : "not stopped by it");
    moat_error_free(&err);
    int after = n_sandboxes();
    /* a failed create or fork lists nothing new; a delete that answered 0 lists its sandbox no more,
     * and one that failed is finished by a second delete */
    bool rows = op->run == op_delete
                    ? after == before - 1 || (failed && op_delete(&err) == 0 && n_sandboxes() == before - 1)
                    : !failed || after == before;
    moat_error_free(&err);
    kill_all_but(parent);
    _cleanup_free_ char *d = settle(base);
    /* counted after the settling: some calls are made off the operation's path (a delete's network
     * teardown is the worker's) */
    unsigned long reached = moat_fault_count(kind);
    moat_fault_set(kind, 0);
    /* the network worker's own requests (refilling the warm slot) may fall inside a count: then a
     * later N is never reached, which is said, not failed */
    OK(d == NULL && said && rows, "%s, %s call %lu of %lu fails (%.0f ms): %s; %s%s%s", op->name, kn, n,
       total, (double)took / 1e6, reached >= n ? why : "not reached", d ? "left " : "nothing left",
       d ? d : "", rows ? "" : ", and it is listed");
  }
}

int main(void) {
  const char *tdir =
      getenv("MOAT_TEST_TEMPLATE_DIR") ? getenv("MOAT_TEST_TEMPLATE_DIR") : "/var/tmp/moat-test-templates";
  _cleanup_free_ char *ready = xasprintf("%s/base/ready", tdir);
  if (geteuid() != 0 || access(ready, F_OK) != 0) {
    printf("1..0 # SKIP needs root and a built base template in %s\n0 passed, 0 failed\n", tdir);
    return 77;
  }
  moat_log_set_level(getenv("MOAT_TEST_DEBUG") ? MOAT_LOG_DEBUG : MOAT_LOG_ERROR);
  if (!mkdtemp(data_dir))
    return 1;
  real_dir = realpath(data_dir, NULL);
  instance_of(real_dir);
  _cleanup_free_ char *recipes = repo_path("templates"), *guest = repo_path("build/moat-guest");
  struct moat_net_config net = {.warm = 1};
  if (system("command -v ip >/dev/null && command -v nsenter >/dev/null") == 0) {
    snprintf(uplink_ns, sizeof(uplink_ns), "moat-fault-%d", (int)getpid());
    _cleanup_free_ char *add = xasprintf("ip netns add %s", uplink_ns);
    if (system(add) == 0) {
      net.uplink = xasprintf("netns:/run/netns/%s", uplink_ns);
      net.dns_upstream = "192.0.2.53"; /* TEST-NET-1 inside the empty namespace: never answered */
    } else
      uplink_ns[0] = '\0';
  }
  if (!uplink_ns[0])
    printf("# no networking (ip netns): netlink faults are not tried\n");
  struct moat_control_config cfg = {
      .data_dir = data_dir,
      .template_dir = tdir,
      .recipes_dir = recipes,
      .guest_path = guest,
      .pool_size = 0,
      .reap_interval_ms = 3600 * 1000,
      .disk_overcommit = true,
      .net = net.uplink ? &net : NULL,
  };
  moat_error *err = NULL;
  if (!OK(moat_control_open(&ctl, &cfg, &err) == 0, "open control in %s: %s", data_dir, moat_error_msg(err)))
    return tap_done();
  /* one create and delete first: the disk image cache (host/disks/golden-*) is made once, and kept */
  if (!OK(op_create(&err) == 0 && kill_all_but(NULL) == 0, "a first create and delete: %s",
          moat_error_msg(err)))
    return tap_done();
  _cleanup_free_ char *base = steady_snapshot();

  static const struct op create = {"create", NULL, op_create}, del = {"delete", prep_delete, op_delete},
                         fork = {"fork", NULL, op_fork};
  static const enum moat_fault_kind all[] = {MOAT_FAULT_MOUNT, MOAT_FAULT_CLONE, MOAT_FAULT_STORE,
                                             MOAT_FAULT_NETLINK};
  const enum moat_fault_kind *kinds = all;
  size_t nkinds = ARRAY_SIZE(all) - (uplink_ns[0] ? 0 : 1);
  for (size_t k = 0; k < nkinds; k++) {
    sweep(&create, kinds[k], base);
    sweep(&del, kinds[k], base);
  }
  if (!moat_control_can_checkpoint(ctl)) {
    tap_skip("fork: checkpoints unavailable: %s", moat_control_criu_status(ctl));
  } else {
    struct moat_sandbox_info p;
    if (OK(moat_control_create(ctl, "default", &spec, &p, &err) == 0, "create the sandbox to fork: %s",
           moat_error_msg(err))) {
      snprintf(parent, sizeof(parent), "%s", p.id);
      moat_sandbox_info_clear(&p);
      _cleanup_free_ char *with_parent = steady_snapshot();
      for (size_t k = 0; k < nkinds; k++)
        sweep(&fork, kinds[k], with_parent);
      parent[0] = '\0';
    }
    moat_error_free(&err);
  }
  kill_all_but(NULL);
  _cleanup_free_ char *d = settle(base);
  OK(d == NULL, "every sandbox deleted: the host is as it was%s%s", d ? ": " : "", d ? d : "");
  moat_control_close(ctl);
  if (uplink_ns[0]) { /* the routing namespace outlives moatd (its sandboxes would): removed here */
    _cleanup_free_ char *rm =
        xasprintf("umount -l /run/moat/net/%s; rm -f /run/moat/net/%s /run/moat/net/%s.owner;"
                  " ip netns del %s",
                  instance, instance, instance, uplink_ns);
    if (system(rm) != 0)
      printf("# cleanup of the network namespaces failed: %s\n", rm);
    free((char *)net.uplink);
  }
  rm_rf(data_dir, NULL);
  free(real_dir);
  return tap_done();
}

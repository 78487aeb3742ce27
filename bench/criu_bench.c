/* criu_bench.c -- the linux driver's checkpoint and restore (CRIU) against the plain criu CLI on
 * the same sandbox, in the same run, for an idle shell and a sandbox holding 64 MiB.
 *
 *   make build/bench/criu_bench       (also built by `make all`)
^ *   build/bench/criu_bench [runs]      (root; a built base template; scripts/criu.sh done)
 *
 * moat: moat_host_checkpoint(leave_running) (freeze, copy the upper, criu dump --freeze-cgroup,
 * thaw) and moat_host_restore (fresh slot: uid range, cgroups, disk + upper copy, overlay root,
 * criu restore, guest answering); 8 concurrent restores (a fork of 8); hibernate + wake.
 * peer: the same criu binary run plainly on the same sandbox: `criu dump -t PID --leave-running`
 * (tasks stopped by ptrace, no freeze or upper copy), and `criu restore -d` of those images with
 * --root an overlay of the template and a copy of the sandbox's upper, mounted in a private
 * mount namespace (the restored tree keeps the parent's uid range: the CLI has no way to change
 * it), until criu returns. Prints p50/p95/p99 in ms.
 *
 * The peer cannot dump a sandbox as it is now: PID 1 is not dumpable and belongs to the sandbox's
 * user namespace, so a criu run as host root outside it fails ("Can't get rlimit 0: Operation not
 * permitted"), which is what keeps root inside from reading PID 1's memory. Its rows then say "no
 * successful run", with CRIU's errors above them.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/mount.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/util.h"
#include "host/linux/criu.h"
#include "host/linux/shell.h"
#include "host/driver.h"
#include "proto/client/guest_client.h"

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static void row(const char *name, double *v, int n) {
  if (n == 0) {
    printf("%-58s   (no successful run)\n", name);
    return;
  }
  qsort(v, (size_t)n, sizeof(double), cmp_d);
  int i50 = (n - 1) / 2, i95 = (int)((n - 1) * 0.95 + 0.5), i99 = (int)((n - 1) * 0.99 + 0.5);
  printf("%-58s p50 %7.1f  p95 %7.1f  p99 %7.1f ms  (n=%d)\n", name, v[i50], v[i95], v[i99], n);
  fflush(stdout);
}

static double ms_since(uint64_t t0) { return (double)(now_ns() - t0) / 1e6; }

static int sh(const struct moat_guest_ep *ep, const char *cmd) {
  char *argv[] = {"/bin/sh", "-c", (char *)cmd, NULL};
  struct moat_exec_req req = {.argv = argv, .timeout_ms = 60000};
  struct moat_exec_result res;
  moat_error *err = NULL;
  if (moat_guest_exec(ep, &req, &res, &err) < 0) {
    fprintf(stderr, "exec: %s\n", moat_error_msg(err));
    moat_error_free(&err);
    return -1;
  }
  int code = res.exit_code;
  moat_exec_result_free(&res);
  return code;
}

static int run(char **argv) {
  pid_t p = fork();
  if (p == 0) {
    int null = open("/dev/null", O_RDWR);
    dup2(null, 0), dup2(null, 1), dup2(null, 2);
    execv(argv[0], argv);
    _exit(127);
  }
  int st;
  waitpid(p, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* The peer's restore: a child that enters a private mount namespace, mounts the overlay root,
 * execs criu restore -d. */
struct peer_restore {
  const char *rootfs, *upper, *work, *root, *images, *pidfile, *criu;
  const char *lower; /* mount point for lower_fd */
  const char *chan;  /* an empty directory for the guest channel's mount */
  const char *guest; /* the moat-guest binary, for its bind mount */
  int lower_fd;      /* the template, idmapped for the parent's uid range (as a sandbox sees it) */
};

/* An idmapped clone of rootfs for a user namespace mapping 0..65535 to base (a throwaway child
 * holds the namespace while the mount is made). */
static int idmapped_rootfs(const char *rootfs, unsigned base) {
  int p[2];
  if (pipe(p) < 0)
    return -1;
  pid_t c = (pid_t)syscall(SYS_clone, CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0);
  if (c == 0) {
    char b;
    close(p[1]);
    if (read(p[0], &b, 1) < 0)
      _exit(1);
    _exit(0);
  }
  close(p[0]);
  char path[64], map[64];
  snprintf(map, sizeof(map), "0 %u 65536\n", base);
  snprintf(path, sizeof(path), "/proc/%d/uid_map", c);
  write_file(path, map, NULL);
  snprintf(path, sizeof(path), "/proc/%d/gid_map", c);
  write_file(path, map, NULL);
  snprintf(path, sizeof(path), "/proc/%d/ns/user", c);
  int userns = open(path, O_RDONLY | O_CLOEXEC);
  int fd = open_tree(AT_FDCWD, rootfs, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
  struct mount_attr attr = {.attr_set = MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY, .userns_fd = (uint64_t)userns};
  if (fd >= 0 && mount_setattr(fd, "", AT_EMPTY_PATH, &attr, sizeof(attr)) < 0) {
    close(fd);
    fd = -1;
  }
  close(userns);
  close(p[1]);
  waitpid(c, NULL, 0);
  return fd;
}

static int peer_restore(struct peer_restore *p) {
  pid_t c = fork();
  if (c == 0) {
    int null = open("/dev/null", O_RDWR);
    dup2(null, 0), dup2(null, 1), dup2(null, 2);
    if (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
      _exit(120);
    if (move_mount(p->lower_fd, "", AT_FDCWD, p->lower, MOVE_MOUNT_F_EMPTY_PATH) < 0)
      _exit(122);
    char opts[4096];
    snprintf(opts, sizeof(opts), "lowerdir=%s,upperdir=%s,workdir=%s,userxattr", p->lower, p->upper, p->work);
    if (mount("overlay", p->root, "overlay", MS_NODEV, opts) < 0)
      _exit(121);
    /* the two bind mounts every sandbox has are external to its image (as moat's restore maps them) */
    char chan_map[4200], guest_map[4200];
    snprintf(chan_map, sizeof(chan_map), MOAT_CHAN_EXT_KEY ":%s", p->chan);
    snprintf(guest_map, sizeof(guest_map), "mnt[" MOAT_GUEST_MOUNT_KEY "]:%s", p->guest);
    char *argv[] = {(char *)p->criu, "restore", "-D", (char *)p->images, "-o", "restore.log", "--root",
                    (char *)p->root, "-d", "--pidfile", (char *)p->pidfile, "--ext-mount-map", chan_map,
                    "--external", guest_map, "--ext-mount-map", "auto", "--network-lock", "skip",
                    "--manage-cgroups=ignore", NULL};
    execv(argv[0], argv);
    _exit(127);
  }
  int st;
  waitpid(c, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static void kill_pidfile(const char *pidfile) {
  _cleanup_free_ char *s = NULL;
  if (read_file(pidfile, &s, NULL, NULL) < 0)
    return;
  pid_t pid = atoi(s);
  int fd = (int)syscall(SYS_pidfd_open, pid, 0);
  if (fd < 0)
    return;
  syscall(SYS_pidfd_send_signal, fd, SIGKILL, NULL, 0);
  for (int i = 0; i < 200 && kill(pid, 0) == 0; i++) {
    char path[64], st[256];
    snprintf(path, sizeof(path), "/proc/%d/stat", pid);
    int f = open(path, O_RDONLY);
    ssize_t n = f >= 0 ? read(f, st, sizeof(st) - 1) : -1;
    if (f >= 0)
      close(f);
    if (n <= 0)
      break;
    st[n] = '\0';
    char *q = strrchr(st, ')');
    if (q && q[2] == 'Z')
      break;
    usleep(5000);
  }
  close(fd);
  unlink(pidfile);
}

struct job {
  struct moat_host *h;
  const char *dir;
  struct moat_instance inst;
  int r;
  uint64_t done_ns;
};

static void *restore_job(void *arg) {
  struct job *j = arg;
  struct moat_limits lim = {.cpu = 2, .memory_mb = 1024, .pids = 512, .disk_mb = 1024};
  moat_error *err = NULL;
  j->r = moat_host_restore(j->h, j->dir, "base", &lim, 0, &j->inst, &err);
  j->done_ns = now_ns();
  if (j->r < 0)
    fprintf(stderr, "restore: %s\n", moat_error_msg(err));
  moat_error_free(&err);
  return NULL;
}

static char guest[4096]; /* the moat-guest binary's absolute path */

static void bench_one(struct moat_host *h, const char *data, const char *tdir, const char *label, int mib,
                      int runs) {
  printf("\n## %s\n", label);
  struct moat_limits lim = {.cpu = 2, .memory_mb = 1024, .pids = 512, .disk_mb = 1024};
  struct moat_instance s;
  moat_error *err = NULL;
  if (moat_host_create(h, "base", &lim, &s, &err) < 0) {
    printf("create: %s\n", moat_error_msg(err));
    moat_error_free(&err);
    return;
  }
  if (mib) {
    _cleanup_free_ char *cmd =
        xasprintf("python3 -c 'import time\nb = bytearray(%d << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\n"
                  "open(\"/tmp/held\", \"w\").write(\"1\")\nwhile True: time.sleep(1)' </dev/null >/dev/null 2>&1 &"
                  " while [ ! -e /tmp/held ]; do sleep 0.05; done",
                  mib);
    sh(&s.guest, cmd);
  }
  double *ck = xcalloc((size_t)runs, sizeof(double)), *fr = xcalloc((size_t)runs, sizeof(double)),
         *rs = xcalloc((size_t)runs, sizeof(double)), *pd = xcalloc((size_t)runs, sizeof(double)),
         *pr = xcalloc((size_t)runs, sizeof(double)), *wk = xcalloc((size_t)runs, sizeof(double));
  int nck = 0, nrs = 0, npd = 0, npr = 0, nwk = 0;
  uint64_t mem = 0, disk = 0;
  _cleanup_free_ char *first = NULL;
  for (int i = 0; i < runs; i++) {
    char *dir = xasprintf("%s/%s-ck%d", data, label, i);
    mkdir(dir, 0700);
    struct moat_checkpoint_info info;
    if (moat_host_checkpoint(h, s.slot, dir, true, &info, &err) == 0) {
      ck[nck] = (double)info.total_ns / 1e6;
      fr[nck++] = (double)info.frozen_ns / 1e6;
      mem = info.memory_bytes, disk = info.disk_bytes;
      if (!first)
        first = xstrdup(dir);
    } else {
      printf("checkpoint: %s\n", moat_error_msg(err));
      moat_error_free(&err);
    }
    if (first && strcmp(first, dir) != 0)
      rm_rf(dir, NULL);
    free(dir);
  }
  printf("# sandbox memory written by CRIU %.1f MiB, writable layer %.1f KiB\n", (double)mem / 1048576.0,
         (double)disk / 1024.0);
  row("moat checkpoint (leave running): total", ck, nck);
  row("moat checkpoint: sandbox frozen", fr, nck);
  if (!first)
    return;
  for (int i = 0; i < runs; i++) {
    struct job j = {.h = h, .dir = first};
    uint64_t t0 = now_ns();
    restore_job(&j);
    if (j.r == 0) {
      rs[nrs++] = ms_since(t0);
      moat_host_destroy(h, j.inst.slot, NULL);
    }
  }
  row("moat restore into a fresh slot (fork child ready)", rs, nrs);
  /* a fork of 8: all at once from one checkpoint */
  {
    struct job jobs[8];
    pthread_t th[8];
    uint64_t t0 = now_ns();
    for (int i = 0; i < 8; i++) {
      jobs[i] = (struct job){.h = h, .dir = first};
      pthread_create(&th[i], NULL, restore_job, &jobs[i]);
    }
    double firstready = 1e12, all = 0;
    int okn = 0;
    for (int i = 0; i < 8; i++) {
      pthread_join(th[i], NULL);
      if (jobs[i].r == 0) {
        okn++;
        double d = (double)(jobs[i].done_ns - t0) / 1e6;
        if (d < firstready)
          firstready = d;
        if (d > all)
          all = d;
      }
    }
    uint64_t memsum = 0;
    for (int i = 0; i < 8; i++)
      if (jobs[i].r == 0) {
        struct moat_usage u;
        if (moat_host_usage(h, jobs[i].inst.slot, &u, NULL) == 0)
          memsum += u.memory_bytes;
        moat_host_destroy(h, jobs[i].inst.slot, NULL);
      }
    printf("%-58s first %.1f ms, all %.1f ms (%d/8 ok), memory of the 8: %.1f MiB\n",
           "moat 8 concurrent restores (fork of 8)", firstready, all, okn, (double)memsum / 1048576.0);
  }
  /* the plain CLI on the same sandbox */
  unsigned parent_base = 0;
  {
    _cleanup_free_ char *meta_path = xasprintf("%s/moat-checkpoint", first), *meta = NULL;
    if (read_file(meta_path, &meta, NULL, NULL) == 0 && strstr(meta, "uid_base "))
      parent_base = (unsigned)strtoul(strstr(meta, "uid_base ") + 9, NULL, 10);
  }
  const char *criu = moat_criu_path();
  _cleanup_free_ char *rootfs = xasprintf("%s/base/rootfs", tdir);
  _cleanup_free_ char *pidfile = xasprintf("%s/peer.pid", data);
  for (int i = 0; i < runs; i++) {
    _cleanup_free_ char *img = xasprintf("%s/%s-peer%d", data, label, i);
    mkdir(img, 0711);
    _cleanup_free_ char *pid_s = xasprintf("%d", s.pid);
    char *argv[] = {(char *)criu, "dump", "-t", pid_s, "-D", img, "-o", "dump.log", "--leave-running",
                    "--external", "mnt[" MOAT_GUEST_SOCK_DIR "]:" MOAT_CHAN_EXT_KEY, "--external",
                    "mnt[" MOAT_GUEST_MOUNT_INSIDE "]:" MOAT_GUEST_MOUNT_KEY, "--ext-mount-map", "auto",
                    "--network-lock", "skip", NULL};
    uint64_t t0 = now_ns();
    if (run(argv) != 0) {
      _cleanup_free_ char *lg = xasprintf("grep 'Error (' %s/dump.log | head -3", img);
      printf("peer dump failed:\n");
      fflush(stdout);
      if (system(lg) < 0)
        perror("system");
      continue;
    }
    pd[npd++] = ms_since(t0);
    _cleanup_free_ char *chmod_cmd = xasprintf("/bin/chmod -R go+rX %s", img);
    char *cargv[] = {"/bin/sh", "-c", chmod_cmd, NULL};
    run(cargv);
    /* restore: a fresh overlay over the template with a copy of the sandbox's upper */
    _cleanup_free_ char *base = xasprintf("%s/%s-peerfs%d", data, label, i);
    _cleanup_free_ char *upper = xasprintf("%s/upper", base), *work = xasprintf("%s/work", base),
                        *root = xasprintf("%s/root", base), *lower = xasprintf("%s/lower", base);
    _cleanup_free_ char *chan = xasprintf("%s/chan", base);
    _cleanup_free_ char *cp =
        xasprintf("mkdir -p %s %s %s %s && cp -a %s/upper %s/", work, root, lower, chan, first, base);
    char *cpargv[] = {"/bin/sh", "-c", cp, NULL};
    run(cpargv);
    struct peer_restore p = {.rootfs = rootfs, .upper = upper, .work = work, .root = root, .images = img,
                             .pidfile = pidfile, .criu = criu, .lower = lower, .chan = chan, .guest = guest,
                             .lower_fd = idmapped_rootfs(rootfs, parent_base)};
    t0 = now_ns();
    int rc = peer_restore(&p);
    double d = ms_since(t0);
    if (rc == 0)
      pr[npr++] = d;
    else {
      _cleanup_free_ char *lg = xasprintf("grep 'Error (' %s/restore.log | grep -v -e RLIMIT -e tables -e 'status 1' | head -3", img);
      printf("peer restore failed (%d):\n", rc);
      fflush(stdout);
      if (system(lg) < 0)
        perror("system");
    }
    kill_pidfile(pidfile);
    if (p.lower_fd >= 0)
      close(p.lower_fd);
    if (i > 0 || rc == 0) {
      rm_rf(base, NULL);
      rm_rf(img, NULL);
    }
  }
  row("peer: criu dump --leave-running (same sandbox)", pd, npd);
  row("peer: criu restore -d (same images, fresh overlay)", pr, npr);
  /* hibernate and wake */
  for (int i = 0; i < runs; i++) {
    _cleanup_free_ char *dir = xasprintf("%s/%s-hib%d", data, label, i);
    mkdir(dir, 0700);
    if (moat_host_checkpoint(h, s.slot, dir, false, NULL, &err) < 0) {
      printf("hibernate: %s\n", moat_error_msg(err));
      moat_error_free(&err);
      break;
    }
    struct job j = {.h = h, .dir = dir};
    uint64_t t0 = now_ns();
    restore_job(&j);
    if (j.r < 0)
      break;
    wk[nwk++] = ms_since(t0);
    s = j.inst;
    rm_rf(dir, NULL);
  }
  row("moat wake after hibernate (restore of its own image)", wk, nwk);
  if (npr && nrs) {
    qsort(rs, (size_t)nrs, sizeof(double), cmp_d);
    qsort(pr, (size_t)npr, sizeof(double), cmp_d);
    printf("# fork child ready / plain criu restore (p50): %.2fx (target <= 0.5x)\n", rs[(nrs - 1) / 2] / pr[(npr - 1) / 2]);
  }
  moat_host_destroy(h, s.slot, NULL);
  rm_rf(first, NULL);
  free(ck), free(fr), free(rs), free(pd), free(pr), free(wk);
}

int main(int argc, char **argv) {
  int runs = argc > 1 ? atoi(argv[1]) : 7;
  const char *tdir = getenv("MOAT_TEST_TEMPLATE_DIR");
  if (!tdir)
    tdir = "/var/tmp/moat-test-templates";
  const char *status;
  if (!moat_criu_available(&status)) {
    printf("no CRIU: %s\n", status);
    return 77;
  }
  char data[] = "/var/tmp/moat-criu-bench-XXXXXX";
  if (!mkdtemp(data))
    return 1;
  if (!realpath("build/moat-guest", guest)) {
    perror("build/moat-guest");
    return 1;
  }
  struct moat_host_config cfg = {.data_dir = data, .template_dir = tdir, .guest_path = "build/moat-guest",
                                 .pool_template = "base", .max_slots = 64};
  struct moat_host *h;
  moat_error *err = NULL;
  if (moat_host_init(&h, &cfg, &err) < 0) {
    printf("init: %s\n", moat_error_msg(err));
    return 1;
  }
  moat_host_reconcile(h, NULL);
  printf("# %s\n# runs per figure: %d\n", status, runs);
  const char *only = getenv("MOAT_BENCH_ONLY"); /* "idle" or "64" */
  if (!only || strcmp(only, "idle") == 0)
    bench_one(h, data, tdir, "idle-shell", 0, runs);
  if (!only || strcmp(only, "64") == 0)
    bench_one(h, data, tdir, "64MiB", 64, runs);
  moat_host_shutdown(h);
  rm_rf(data, NULL);
  return 0;
}

/* probe.c -- a static helper the integration and attack tests upload into a sandbox and run there
 *
 * Built on the host with `cc -static` (tests/lib/probe.py), so it needs nothing from the template.
 * Every operation prints one result line: "OK [details]" or "ERR <ERRNO NAME> [details]", and
 * exits 0 unless the arguments were wrong (exit 2). The tests parse that line, so that each
 * attack checks not only that it failed but why (EPERM from seccomp, ENOSPC from the disk limit...).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/bpf.h>
#include <linux/keyctl.h>
#include <linux/perf_event.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/ptrace.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <sys/inotify.h>
#include <sys/ipc.h>
#include <sys/shm.h>
#include <linux/capability.h>
#include <ftw.h>
#include <mqueue.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

static int ok(const char *detail) {
  printf("OK%s%s\n", detail ? " " : "", detail ? detail : "");
  return 0;
}

static int err_(int e, const char *detail) {
  const char *n = strerrorname_np(e);
  printf("ERR %s%s%s\n", n ? n : "E?", detail ? " " : "", detail ? detail : "");
  return 0;
}

/* Reports the outcome of a call that returns -1 + errno on failure. */
static int res(long rc) { return rc < 0 ? err_(errno, NULL) : ok(NULL); }

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int op_read(const char *path) {
  int fd = open(path, O_RDONLY);
  if (fd < 0)
    return err_(errno, NULL);
  char buf[65536];
  ssize_t n = read(fd, buf, sizeof buf);
  if (n < 0)
    return err_(errno, NULL);
  printf("OK %zd\n", n);
  fwrite(buf, 1, n, stdout);
  return 0;
}

static int op_write(const char *path, const char *data) {
  int fd = open(path, O_WRONLY);
  if (fd < 0)
    return err_(errno, "open");
  if (write(fd, data, strlen(data)) < 0)
    return err_(errno, "write");
  if (close(fd) < 0)
    return err_(errno, "close");
  return ok(NULL);
}

static int op_unshare(const char *what) {
  int flags = 0;
  if (!strcmp(what, "user"))
    flags = CLONE_NEWUSER;
  else if (!strcmp(what, "mnt"))
    flags = CLONE_NEWNS;
  else if (!strcmp(what, "net"))
    flags = CLONE_NEWNET;
  else if (!strcmp(what, "pid"))
    flags = CLONE_NEWPID;
  else if (!strcmp(what, "uts"))
    flags = CLONE_NEWUTS;
  else if (!strcmp(what, "cgroup"))
    flags = CLONE_NEWCGROUP;
  else
    return 2;
  return res(unshare(flags));
}

/* Named syscalls with harmless arguments: if one were allowed it would fail with EINVAL/EFAULT/
 * ENOENT or do nothing; the tests expect EPERM from the seccomp filter or the missing capability. */
static int op_sys(const char *name) {
  if (!strcmp(name, "init_module")) {
    static char img[64];
    return res(syscall(SYS_init_module, img, sizeof img, ""));
  }
  if (!strcmp(name, "finit_module")) {
    int fd = open("/dev/null", O_RDONLY);
    return res(syscall(SYS_finit_module, fd, "", 0));
  }
  if (!strcmp(name, "delete_module"))
    return res(syscall(SYS_delete_module, "moat_no_such_module", O_NONBLOCK));
  if (!strcmp(name, "kexec_load"))
    return res(syscall(SYS_kexec_load, 0UL, 0UL, NULL, 0UL));
  if (!strcmp(name, "keyctl"))
    return res(syscall(SYS_keyctl, KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING, 0));
  if (!strcmp(name, "add_key"))
    return res(syscall(SYS_add_key, "user", "moat-probe", "x", 1, KEY_SPEC_SESSION_KEYRING));
  if (!strcmp(name, "request_key"))
    return res(syscall(SYS_request_key, "user", "moat-probe", NULL, KEY_SPEC_SESSION_KEYRING));
  if (!strcmp(name, "bpf")) {
    union bpf_attr a;
    memset(&a, 0, sizeof a);
    a.map_type = BPF_MAP_TYPE_ARRAY;
    a.key_size = 4;
    a.value_size = 4;
    a.max_entries = 1;
    long fd = syscall(SYS_bpf, BPF_MAP_CREATE, &a, sizeof a);
    return res(fd);
  }
  if (!strcmp(name, "ptrace")) {
    pid_t c = fork();
    if (c == 0) {
      pause();
      _exit(0);
    }
    long rc = ptrace(PTRACE_ATTACH, c, NULL, NULL);
    int e = errno;
    kill(c, SIGKILL);
    waitpid(c, NULL, 0);
    errno = e;
    return res(rc);
  }
  if (!strcmp(name, "ptrace_init"))
    return res(ptrace(PTRACE_ATTACH, 1, NULL, NULL));
  if (!strcmp(name, "perf_event_open")) {
    struct perf_event_attr pa;
    memset(&pa, 0, sizeof pa);
    pa.type = PERF_TYPE_SOFTWARE;
    pa.size = sizeof pa;
    pa.config = PERF_COUNT_SW_CPU_CLOCK;
    pa.disabled = 1;
    pa.exclude_kernel = 1;
    pa.exclude_hv = 1;
    return res(syscall(SYS_perf_event_open, &pa, 0, -1, -1, 0));
  }
  if (!strcmp(name, "userfaultfd"))
    return res(syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK));
  if (!strcmp(name, "open_by_handle_at"))
    return res(syscall(SYS_open_by_handle_at, AT_FDCWD, NULL, O_RDONLY));
  if (!strcmp(name, "swapon"))
    return res(syscall(SYS_swapon, "/moat-no-such-swapfile", 0));
  if (!strcmp(name, "syslog")) {
    static char buf[4096];
    return res(syscall(SYS_syslog, 3 /* SYSLOG_ACTION_READ_ALL */, buf, (int)sizeof buf));
  }
  if (!strcmp(name, "io_uring_setup")) {
    static char params[120]; /* struct io_uring_params */
    return res(syscall(SYS_io_uring_setup, 1, params));
  }
  if (!strcmp(name, "tiocsti")) {
    int fd = open("/dev/ptmx", O_RDWR | O_NOCTTY);
    if (fd < 0)
      return res(-1);
    char c = 'x';
    long rc = ioctl(fd, TIOCSTI, &c);
    int e = errno;
    close(fd);
    errno = e;
    return res(rc);
  }
  if (!strcmp(name, "clone_newuser")) {
    long rc = syscall(SYS_clone, CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0);
    if (rc == 0)
      _exit(0);
    if (rc > 0)
      waitpid((pid_t)rc, NULL, 0);
    return res(rc);
  }
  if (!strcmp(name, "clone3")) {
    uint64_t args[11] = {0};
    args[0] = CLONE_NEWUSER; /* flags */
    args[4] = SIGCHLD;       /* exit_signal */
    long rc = syscall(SYS_clone3, args, sizeof(args));
    if (rc == 0)
      _exit(0);
    if (rc > 0)
      waitpid((pid_t)rc, NULL, 0);
    return res(rc);
  }
  if (!strcmp(name, "mount_tmpfs")) {
    mkdir("/tmp/moat-probe-mnt", 0755);
    return res(mount("none", "/tmp/moat-probe-mnt", "tmpfs", 0, "size=1m"));
  }
  if (!strcmp(name, "mount_proc")) {
    mkdir("/tmp/moat-probe-proc", 0755);
    return res(mount("proc", "/tmp/moat-probe-proc", "proc", 0, NULL));
  }
  if (!strcmp(name, "umount_proc"))
    return res(umount2("/proc", MNT_DETACH));
  if (!strcmp(name, "pivot_root"))
    return res(syscall(SYS_pivot_root, "/tmp", "/tmp"));
  if (!strcmp(name, "chroot_escape")) {
    /* the classic: chroot into a subdir, then climb. Must stay inside the sandbox's root. */
    mkdir("/tmp/moat-chroot", 0755);
    if (chroot("/tmp/moat-chroot") < 0)
      return err_(errno, "chroot");
    for (int i = 0; i < 64; i++)
      if (chdir("..") < 0)
        break;
    if (chroot(".") < 0)
      return err_(errno, "chroot2");
    return ok(NULL);
  }
  fprintf(stderr, "unknown syscall %s\n", name);
  return 2;
}

static int op_mknod(const char *path, const char *type, int maj, int min) {
  mode_t m = (type[0] == 'b' ? S_IFBLK : S_IFCHR) | 0600;
  return res(mknod(path, m, makedev(maj, min)));
}

/* Allocates mb MiB and touches every page; prints OK only if it survived. */
static int op_alloc(long mb) {
  size_t len = (size_t)mb << 20;
  char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    return err_(errno, "mmap");
  for (size_t i = 0; i < len; i += 4096)
    p[i] = 1;
  char d[64];
  snprintf(d, sizeof d, "touched=%ld", mb);
  return ok(d);
}

/* Forks up to n children that pause; reports how many forks succeeded and the first failure.
 * Kills and reaps every child before returning. */
static int op_forkcount(long n) {
  pid_t *kids = calloc(n, sizeof *kids);
  long got = 0;
  int e = 0;
  for (long i = 0; i < n; i++) {
    pid_t c = fork();
    if (c < 0) {
      e = errno;
      break;
    }
    if (c == 0) {
      pause();
      _exit(0);
    }
    kids[got++] = c;
  }
  for (long i = 0; i < got; i++)
    kill(kids[i], SIGKILL);
  for (long i = 0; i < got; i++)
    waitpid(kids[i], NULL, 0);
  char d[64];
  snprintf(d, sizeof d, "forked=%ld", got);
  return e ? err_(e, d) : ok(d);
}

/* nproc children spin for secs of wall time; prints the CPU time they used and the wall time. */
static int op_burn(double secs, int nproc) {
  double t0 = now_s();
  for (int i = 0; i < nproc; i++) {
    pid_t c = fork();
    if (c < 0)
      return err_(errno, "fork");
    if (c == 0) {
      volatile unsigned long x = 0;
      while (now_s() - t0 < secs)
        for (int k = 0; k < 100000; k++)
          x += k;
      _exit(0);
    }
  }
  while (wait(NULL) > 0)
    ;
  double wall = now_s() - t0;
  struct rusage ru;
  getrusage(RUSAGE_CHILDREN, &ru);
  double cpu =
      ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
  char d[128];
  snprintf(d, sizeof d, "cpu_s=%.3f wall_s=%.3f", cpu, wall);
  return ok(d);
}

/* Writes 1 MiB blocks to path until an error; reports bytes written and the errno. */
static int op_fill(const char *path) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0)
    return err_(errno, "open");
  static char buf[1 << 20];
  memset(buf, 'x', sizeof buf);
  long long total = 0;
  int e = 0;
  for (;;) {
    ssize_t n = write(fd, buf, sizeof buf);
    if (n < 0) {
      e = errno;
      break;
    }
    total += n;
    if (total > (64LL << 30)) /* never fill more than 64 GiB, whatever happens */
      break;
  }
  if (!e && fsync(fd) < 0)
    e = errno;
  close(fd);
  char d[64];
  snprintf(d, sizeof d, "written=%lld", total);
  return e ? err_(e, d) : ok(d);
}

static int op_connect(const char *ip, int port) {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  if (s < 0)
    return err_(errno, "socket");
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
  if (inet_pton(AF_INET, ip, &a.sin_addr) != 1)
    return 2;
  alarm(10);
  double t0 = now_s();
  int rc = connect(s, (struct sockaddr *)&a, sizeof a);
  int e = errno;
  char d[64];
  snprintf(d, sizeof d, "ms=%.1f", (now_s() - t0) * 1000);
  return rc < 0 ? err_(e, d) : ok(d);
}

/* Detaches a child (new session, stdio on /dev/null) and runs fn in it; the parent prints the
 * child's pid once the child reported readiness through a pipe. */
static int daemonize(int (*fn)(int ready_fd, void *), void *arg) {
  int p[2];
  if (pipe(p) < 0)
    return err_(errno, "pipe");
  pid_t c = fork();
  if (c < 0)
    return err_(errno, "fork");
  if (c == 0) {
    close(p[0]);
    setsid();
    int nul = open("/dev/null", O_RDWR);
    dup2(nul, 0);
    dup2(nul, 1);
    dup2(nul, 2);
    if (fork() > 0)
      _exit(0);
    _exit(fn(p[1], arg));
  }
  close(p[1]);
  waitpid(c, NULL, 0);
  char buf[128] = {0};
  ssize_t n = read(p[0], buf, sizeof buf - 1);
  if (n <= 0) {
    printf("ERR EIO daemon\n");
    return 0;
  }
  printf("%s\n", buf);
  return 0;
}

static int listen_fn(int ready, void *arg) {
  int port = *(int *)arg;
  char msg[128];
  int s = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {
      .sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  if (bind(s, (struct sockaddr *)&a, sizeof a) < 0 || listen(s, 16) < 0) {
    snprintf(msg, sizeof msg, "ERR %s listen", strerrorname_np(errno));
    write(ready, msg, strlen(msg));
    return 1;
  }
  snprintf(msg, sizeof msg, "OK pid=%d", getpid());
  write(ready, msg, strlen(msg));
  close(ready);
  for (;;) {
    int c = accept(s, NULL, NULL);
    if (c >= 0) {
      write(c, "moat-probe\n", 11);
      close(c);
    }
  }
}

static int sleep_fn(int ready, void *arg) {
  char msg[64];
  snprintf(msg, sizeof msg, "OK pid=%d", getpid());
  write(ready, msg, strlen(msg));
  close(ready);
  sleep(*(int *)arg);
  return 0;
}

static int op_statfs(const char *path) {
  struct statfs s;
  if (statfs(path, &s) < 0)
    return err_(errno, NULL);
  char d[128];
  snprintf(d, sizeof d, "total=%llu avail=%llu", (unsigned long long)s.f_blocks * s.f_bsize,
           (unsigned long long)s.f_bavail * s.f_bsize);
  return ok(d);
}

/* ---- per-user kernel resources: exhaust one and hold it (hold), or take one (try) ----
 * Resources: inotify (instances), watches (inotify watches), pty (/dev/ptmx), mqueue (POSIX
 * message queue bytes), sigpending (queued real-time signals), memlock (SHM_LOCK'ed bytes),
 * threads (tasks). */

static char **walk_paths;
static long walk_n, walk_cap;

static int walk_add(const char *path, const struct stat *st, int type, struct FTW *f) {
  (void)st, (void)type, (void)f;
  if (walk_n == walk_cap) {
    walk_cap = walk_cap ? walk_cap * 2 : 4096;
    walk_paths = realloc(walk_paths, walk_cap * sizeof *walk_paths);
  }
  walk_paths[walk_n++] = strdup(path);
  return walk_n >= 20000;
}

static void *thread_park(void *a) {
  (void)a;
  for (;;)
    pause();
  return NULL;
}

/* Takes units of res until the kernel refuses (or max units); *got: units taken. Returns the
 * errno of the refusal, 0 if max was reached first. Takes, never gives back. */
static int take(const char *what, long max, long *got) {
  *got = 0;
  if (!strcmp(what, "inotify")) {
    for (; *got < max; ++*got)
      if (inotify_init1(IN_CLOEXEC) < 0)
        return errno;
    return 0;
  }
  if (!strcmp(what, "watches")) {
    if (!walk_n)
      nftw("/usr", walk_add, 64, FTW_PHYS);
    int fds[64], nfd = 0, e = 0; /* half of a user's 128 instances: the rest stay free */
    while (nfd < 64 && (fds[nfd] = inotify_init1(IN_CLOEXEC)) >= 0)
      nfd++;
    if (!nfd)
      return errno;
    for (int i = 0; i < nfd && !e; i++) {
      int top = 0; /* a new watch gets a higher descriptor; an inode seen again reuses its own */
      for (long j = 0; j < walk_n && *got < max; j++) {
        int wd = inotify_add_watch(fds[i], walk_paths[j], IN_MODIFY | IN_DONT_FOLLOW);
        if (wd < 0) {
          if (errno == ENOSPC || errno == ENOMEM) {
            e = errno;
            break;
          }
          continue;
        }
        if (wd > top) {
          top = wd;
          ++*got;
        }
      }
    }
    return e;
  }
  if (!strcmp(what, "pty")) {
    for (; *got < max; ++*got)
      if (open("/dev/ptmx", O_RDWR | O_NOCTTY | O_CLOEXEC) < 0)
        return errno;
    return 0;
  }
  if (!strcmp(what, "mqueue")) {
    struct mq_attr a = {.mq_maxmsg = 10, .mq_msgsize = 8192};
    char name[64];
    for (; *got < max; ++*got) {
      snprintf(name, sizeof name, "/moat-probe-%d-%ld", getpid(), *got);
      if (mq_open(name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600, &a) == (mqd_t)-1)
        return errno;
    }
    return 0;
  }
  if (!strcmp(what, "sigpending")) {
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGRTMIN);
    sigprocmask(SIG_BLOCK, &s, NULL);
    for (; *got < max; ++*got)
      if (sigqueue(getpid(), SIGRTMIN, (union sigval){.sival_int = 1}) < 0)
        return errno;
    return 0;
  }
  if (!strcmp(what, "memlock")) { /* in MiB */
    for (; *got < max; ++*got) {
      int id = shmget(IPC_PRIVATE, 1 << 20, IPC_CREAT | 0600);
      if (id < 0)
        return errno;
      if (shmctl(id, SHM_LOCK, NULL) < 0) {
        int e = errno;
        shmctl(id, IPC_RMID, NULL);
        return e;
      }
    }
    return 0;
  }
  if (!strcmp(what, "threads")) {
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setstacksize(&at, 16384);
    for (; *got < max; ++*got) {
      pthread_t t;
      int e = pthread_create(&t, &at, thread_park, NULL);
      if (e)
        return e;
    }
    return 0;
  }
  return -1;
}

struct hold_args {
  const char *what;
  long max;
  int secs;
};

static int hold_fn(int ready, void *arg) {
  struct hold_args *h = arg;
  long got;
  int e = take(h->what, h->max, &got);
  char msg[128];
  snprintf(msg, sizeof msg, "OK pid=%d count=%ld errno=%s", getpid(), got,
           e > 0   ? strerrorname_np(e)
           : e < 0 ? "EINVAL"
                   : "none");
  write(ready, msg, strlen(msg));
  close(ready);
  sleep(h->secs);
  return 0;
}

/* Drops CAP_IPC_LOCK from the effective set: the host root a memlock "try" stands for (a service
 * without it) is bound by RLIMIT_MEMLOCK like everyone else. */
static void drop_ipc_lock(void) {
  struct __user_cap_header_struct hdr = {.version = _LINUX_CAPABILITY_VERSION_3};
  struct __user_cap_data_struct d[2];
  if (syscall(SYS_capget, &hdr, d) == 0) {
    d[CAP_IPC_LOCK / 32].effective &= ~(1u << (CAP_IPC_LOCK % 32));
    syscall(SYS_capset, &hdr, d);
  }
}

/* One unit of res, given back at once where it can be (queues unlinked, segments removed). */
static int op_try(const char *what) {
  long got;
  int e;
  if (!strcmp(what, "memlock")) {
    drop_ipc_lock();
    int id = shmget(IPC_PRIVATE, 1 << 20, IPC_CREAT | 0600);
    if (id < 0)
      return err_(errno, "shmget");
    int r = shmctl(id, SHM_LOCK, NULL);
    e = errno;
    shmctl(id, IPC_RMID, NULL);
    return r < 0 ? err_(e, NULL) : ok(NULL);
  }
  if (!strcmp(what, "mqueue")) {
    struct mq_attr a = {.mq_maxmsg = 10, .mq_msgsize = 8192};
    char name[64];
    snprintf(name, sizeof name, "/moat-probe-try-%d", getpid());
    mqd_t q = mq_open(name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600, &a);
    if (q == (mqd_t)-1)
      return err_(errno, NULL);
    mq_unlink(name);
    return ok(NULL);
  }
  if (!strcmp(what, "watches")) {
    int fd = inotify_init1(IN_CLOEXEC);
    if (fd < 0)
      return err_(errno, "inotify_init1");
    return res(inotify_add_watch(fd, "/", IN_MODIFY));
  }
  e = take(what, 1, &got);
  if (e < 0)
    return 2;
  return e ? err_(e, NULL) : ok(NULL);
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc < 2)
    return 2;
  const char *op = argv[1];
  if (!strcmp(op, "read") && argc == 3)
    return op_read(argv[2]);
  if (!strcmp(op, "write") && argc == 4)
    return op_write(argv[2], argv[3]);
  if (!strcmp(op, "unshare") && argc == 3)
    return op_unshare(argv[2]);
  if (!strcmp(op, "sys") && argc == 3)
    return op_sys(argv[2]);
  if (!strcmp(op, "mknod") && argc == 6)
    return op_mknod(argv[2], argv[3], atoi(argv[4]), atoi(argv[5]));
  if (!strcmp(op, "alloc") && argc == 3)
    return op_alloc(atol(argv[2]));
  if (!strcmp(op, "forkcount") && argc == 3)
    return op_forkcount(atol(argv[2]));
  if (!strcmp(op, "burn") && argc == 4)
    return op_burn(atof(argv[2]), atoi(argv[3]));
  if (!strcmp(op, "fill") && argc == 3)
    return op_fill(argv[2]);
  if (!strcmp(op, "connect") && argc == 4)
    return op_connect(argv[2], atoi(argv[3]));
  if (!strcmp(op, "listen") && argc == 3) {
    int port = atoi(argv[2]);
    return daemonize(listen_fn, &port);
  }
  if (!strcmp(op, "sleepd") && argc >= 3) { /* extra args: tags the host can find in cmdline */
    int secs = atoi(argv[2]);
    return daemonize(sleep_fn, &secs);
  }
  if (!strcmp(op, "kill") && argc == 4)
    return res(kill(atoi(argv[2]), atoi(argv[3])));
  if (!strcmp(op, "statfs") && argc == 3)
    return op_statfs(argv[2]);
  if (!strcmp(op, "hold") && argc >= 5) { /* RES MAX SECS [tags the host can find in cmdline] */
    struct hold_args h = {argv[2], atol(argv[3]), atoi(argv[4])};
    return daemonize(hold_fn, &h);
  }
  if (!strcmp(op, "try") && argc == 3)
    return op_try(argv[2]);
  fprintf(stderr, "usage: probe OP ARGS\n");
  return 2;
}

/* main.c -- moat-guest: PID 1 of a sandbox; accepts guest-protocol connections, forks a worker each
 *
 * Started by the linux driver with MOAT_GUEST_LISTEN_FD (a bound, listening unix socket) and
 * MOAT_GUEST_READY_FD (write one 'R' there once accepting, then close it), or for development
 * as `moat-guest --listen PATH` (binds PATH itself). Pre-forked spare workers accept; a worker
 * serves file operations and WATCH itself, and hands the connections of process requests (EXEC,
 * ATTACH, STDIN, SIGNAL, RESIZE, PROCS) to PID 1 with SCM_RIGHTS, request unread, and exits: PID
 * 1 owns every process (procs.c). The main loop never blocks on a client, and reaps every child
 * and orphan as SIGCHLD arrives (through a signalfd).
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../common/log.h"
#include "../common/util.h"
#include "guest.h"

static int env_fd(const char *name) {
  const char *s = getenv(name);
  uint64_t v;
  if (!s || parse_u64(s, &v) < 0 || v > INT32_MAX)
    return -1;
  return (int)v;
}

static int listen_on(const char *path, moat_error **err) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  if (strlen(path) >= sizeof(sa.sun_path))
    return moat_error_set(err, ENAMETOOLONG, "listen %s: path too long for a unix socket", path);
  strcpy(sa.sun_path, path);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return moat_error_errno(err, "socket");
  unlink(path);
  if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fd, 512) < 0) {
    moat_error_errno(err, "listen %s", path);
    close(fd);
    return -1;
  }
  return fd;
}

/* Makes sure fds 0-2 are open, so no pipe or socket of ours lands there. */
static void ensure_std_fds(void) {
  for (int i = 0; i < 3; i++) {
    if (fcntl(i, F_GETFD) >= 0)
      continue;
    int fd = open("/dev/null", O_RDWR);
    if (fd < 0)
      fd = open("/", O_RDONLY | O_DIRECTORY); /* no /dev/null: any fd holds the slot */
    if (fd >= 0 && fd != i) {
      dup2(fd, i);
      close(fd);
    }
  }
}

static void forget_spare(pid_t pid);

/* Workers that took a file operation or WATCH (they told PID 1 through the notify pipe): ended
 * by a checkpoint's quiesce, so that none holds a connection to moatd while CRIU dumps. */
#define MAX_BUSY 64
static pid_t busy_workers[MAX_BUSY];

static void busy_add(pid_t pid) {
  for (int i = 0; i < MAX_BUSY; i++)
    if (busy_workers[i] <= 0) {
      busy_workers[i] = pid;
      return;
    }
}

static void busy_forget(pid_t pid) {
  for (int i = 0; i < MAX_BUSY; i++)
    if (busy_workers[i] == pid)
      busy_workers[i] = 0;
}

/* SIGUSR2 from the host before a checkpoint: drop every connection to moatd (see guest.h). */
static void quiesce(void) {
  guest_procs_quiesce();
  for (int i = 0; i < MAX_BUSY; i++)
    if (busy_workers[i] > 0)
      kill(busy_workers[i], SIGKILL);
}

static void reap_all(void) {
  for (;;) {
    int status = 0;
    pid_t p = waitpid(-1, &status, WNOHANG);
    if (p > 0) {
      forget_spare(p); /* a spare that died before serving is replaced */
      busy_forget(p);
      guest_procs_reaped(p, status);
      continue;
    }
    if (p < 0 && errno == EINTR)
      continue;
    break;
  }
}

/* Spare workers: PID 1 keeps SPARES children blocked in accept() with their pages already
 * faulted in, so a request does not wait for fork and copy-on-write (page faults are expensive:
 * ~14 us each on these hosts). A spare that takes a file operation or WATCH tells PID 1 its pid
 * through the notify pipe and PID 1 forks the next spare at once; a process request is handed to
 * PID 1 and the spare stays a spare. */
#define SPARES 1
static pid_t spares[SPARES];

struct spare_busy {
  int notify_w, lfd;
  bool told;
};

/* Tells PID 1 this spare is taken, so that it forks the next one. */
static void spare_busy(void *arg) {
  struct spare_busy *b = arg;
  pid_t me = getpid();
  prctl(PR_SET_PDEATHSIG, 0, 0, 0, 0); /* a request in flight finishes even if PID 1 goes */
  (void)!write(b->notify_w, &me, sizeof(me));
  close(b->lfd);
  b->told = true;
}

/* Hands conn (request unread) to PID 1. pid is reserved (always 0 now): a spare that hands over
 * stays the spare, unless it told PID 1 it was busy. */
static void hand_over(int handoff_w, int conn, pid_t pid) {
  char cbuf[CMSG_SPACE(sizeof(int))];
  memset(cbuf, 0, sizeof(cbuf));
  struct iovec iov = {.iov_base = &pid, .iov_len = sizeof(pid)};
  struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf)};
  struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
  cm->cmsg_level = SOL_SOCKET;
  cm->cmsg_type = SCM_RIGHTS;
  cm->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(cm), &conn, sizeof(int));
  while (sendmsg(handoff_w, &mh, MSG_NOSIGNAL) < 0 && errno == EINTR)
    ;
}

/* Closes every fd but those in keep (sorted ascending): PID 1's clients, pipes and ptys. */
static void close_others(const int *keep, size_t n) {
  unsigned lo = 0;
  for (size_t i = 0; i <= n; i++) {
    unsigned hi = i < n ? (unsigned)keep[i] : ~0U;
    if (hi > lo && syscall(SYS_close_range, lo, hi - 1, 0) < 0)
      for (unsigned fd = lo; fd < hi && fd < 4096; fd++)
        close((int)fd);
    lo = hi + 1;
  }
}

static int cmp_int(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

static __attribute__((noreturn)) void spare_main(int lfd, int notify_w, int handoff_w, const char *etc_dir,
                                                 pid_t parent) {
  /* Outside a pid namespace (--listen) nothing else ends an idle spare when its parent goes. */
  prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
  if (getppid() != parent)
    _exit(0);
  int keep[] = {0, 1, 2, lfd, notify_w, handoff_w};
  qsort(keep, ARRAY_SIZE(keep), sizeof(int), cmp_int);
  close_others(keep, ARRAY_SIZE(keep));
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  guest_prefault();
  for (;;) {
    struct pollfd p = {.fd = lfd, .events = POLLIN};
    if (poll(&p, 1, -1) < 0 && errno != EINTR)
      _exit(1);
    int conn = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
    if (conn < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED)
        continue;                                 /* another spare took it */
      struct timespec ts = {0, 10 * 1000 * 1000}; /* EMFILE, ENOBUFS: back off, do not spin */
      nanosleep(&ts, NULL);
      continue;
    }
    struct spare_busy b = {.notify_w = notify_w, .lfd = lfd};
    if (guest_serve(conn, etc_dir, spare_busy, &b) == 1) {
      /* A process request: PID 1 serves it, and this spare goes back to accept() (no fork on
       * the exec path) unless it already told PID 1 it was busy (a slow client). */
      hand_over(handoff_w, conn, 0);
      close(conn);
      if (!b.told)
        continue;
      _exit(0);
    }
    close(conn);
    _exit(0);
  }
}

static void fork_spares(int lfd, int notify_w, int handoff_w, const char *etc_dir) {
  for (int i = 0; i < SPARES; i++) {
    if (spares[i] > 0)
      continue;
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0)
      spare_main(lfd, notify_w, handoff_w, etc_dir, parent);
    if (pid < 0)
      return; /* retried at the next event */
    spares[i] = pid;
  }
}

static void forget_spare(pid_t pid) {
  for (int i = 0; i < SPARES; i++)
    if (spares[i] == pid)
      spares[i] = 0;
}

/* Connections that spares handed over, each with the spare's pid (0 when it told already). */
static void receive_handoffs(int fd) {
  for (;;) {
    pid_t pid = 0;
    char cbuf[CMSG_SPACE(sizeof(int))];
    struct iovec iov = {.iov_base = &pid, .iov_len = sizeof(pid)};
    struct msghdr mh = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf)};
    ssize_t r = recvmsg(fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (r < 0) {
      if (errno == EINTR)
        continue;
      return;
    }
    if (r == (ssize_t)sizeof(pid) && pid > 0)
      forget_spare(pid);
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm))
      if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
        int conn;
        memcpy(&conn, CMSG_DATA(cm), sizeof(int));
        guest_procs_adopt(conn);
      }
  }
}

/* RENEW (proto.h): hands the process table to a fresh exec of ourselves. The exec runs with a
 * real uid other than the effective one, so the kernel makes the new image non-dumpable from its
 * first instruction (unless fs.suid_dumpable is 1: then we refuse) and nothing in the sandbox can
 * open it in between. Returns only when the exec failed (the connection answered). */
static void renew(int conn, int lfd) {
  moat_error *err = NULL;
  char sd[8] = "";
  int sdf = open("/proc/sys/fs/suid_dumpable", O_RDONLY | O_CLOEXEC);
  if (sdf >= 0) {
    (void)!read(sdf, sd, sizeof(sd) - 1);
    close(sdf);
  }
  if (sd[0] == '1') {
    moat_msg_send_error(conn, EPERM, "renew: fs.suid_dumpable is 1: the new image would be dumpable");
    close(conn);
    return;
  }
  for (int i = 0; i < SPARES; i++)
    if (spares[i] > 0) {
      kill(spares[i], SIGKILL);
      waitpid(spares[i], NULL, 0);
      spares[i] = 0;
    }
  for (int i = 0; i < MAX_BUSY; i++)
    if (busy_workers[i] > 0) {
      kill(busy_workers[i], SIGKILL);
      waitpid(busy_workers[i], NULL, 0);
      busy_workers[i] = 0;
    }
  int state = memfd_create("moat-guest-state", 0);
  if (state < 0 || guest_procs_save(state, &err) < 0 || lseek(state, 0, SEEK_SET) < 0) {
    moat_msg_send_error(conn, EIO, "renew: %s", err ? moat_error_msg(err) : strerror(errno));
    moat_error_free(&err);
    guest_procs_saved_undo();
    if (state >= 0)
      close(state);
    close(conn);
    return;
  }
  char v_lfd[16], v_state[16], v_conn[16];
  snprintf(v_lfd, sizeof(v_lfd), "%d", lfd);
  snprintf(v_state, sizeof(v_state), "%d", state);
  snprintf(v_conn, sizeof(v_conn), "%d", conn);
  setenv("MOAT_GUEST_LISTEN_FD", v_lfd, 1);
  setenv("MOAT_GUEST_STATE_FD", v_state, 1);
  setenv("MOAT_GUEST_RENEW_FD", v_conn, 1);
  fd_set_cloexec(lfd, false);
  fd_set_cloexec(conn, false);
  fd_set_nonblock(lfd, false);
  uid_t ruid = getuid(), euid = geteuid();
  if (syscall(SYS_setresuid, ruid == 65534 ? 65533 : 65534, euid, euid) == 0) {
    char *argv[] = {"moat-guest", NULL};
    execve("/proc/self/exe", argv, environ);
  }
  int e = errno;
  syscall(SYS_setresuid, ruid, euid, euid);
  fd_set_cloexec(lfd, true);
  fd_set_nonblock(lfd, true);
  guest_procs_saved_undo();
  unsetenv("MOAT_GUEST_LISTEN_FD");
  unsetenv("MOAT_GUEST_STATE_FD");
  unsetenv("MOAT_GUEST_RENEW_FD");
  moat_msg_send_error(conn, e, "renew: exec: %s", strerror(e));
  close(conn);
  close(state);
}

static void usage(void) {
  fprintf(stderr, "usage: moat-guest [--listen PATH] [--etc DIR]\n"
                  "  without --listen: MOAT_GUEST_LISTEN_FD and MOAT_GUEST_READY_FD come from the driver\n");
}

int main(int argc, char **argv) {
  const char *listen_path = NULL, *etc_dir = "/etc";
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--listen") == 0 && i + 1 < argc)
      listen_path = argv[++i];
    else if (strcmp(argv[i], "--etc") == 0 && i + 1 < argc)
      etc_dir = argv[++i];
    else {
      usage();
      return 2;
    }
  }
  /* Out of reach of the code we run, root included: a non-dumpable process's memory, fds,
   * environment, root and cwd (/proc/PID/mem, fd/, environ, root, cwd, syscall, maps...) and
   * ptrace need CAP_SYS_PTRACE over its user namespace, which nothing in the sandbox has. Our
   * forks (spares, file workers) inherit it; a command we exec is dumpable again (exec resets it). */
  prctl(PR_SET_NAME, "moat-guest", 0, 0, 0); /* a renewal execs /proc/self/exe */
  if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0) {
    fprintf(stderr, "moat-guest: PR_SET_DUMPABLE: %s\n", strerror(errno));
    return 1;
  }
  ensure_std_fds();
  signal(SIGPIPE, SIG_IGN);
  umask(022);

  moat_error *err = NULL;
  int lfd, ready = -1, renewed = -1;
  if (listen_path) {
    lfd = listen_on(listen_path, &err);
    if (lfd < 0) {
      fprintf(stderr, "moat-guest: %s\n", moat_error_msg(err));
      return 1;
    }
  } else {
    lfd = env_fd("MOAT_GUEST_LISTEN_FD");
    ready = env_fd("MOAT_GUEST_READY_FD");
    if (lfd < 0 || fcntl(lfd, F_GETFD) < 0) {
      fprintf(stderr, "moat-guest: MOAT_GUEST_LISTEN_FD is not an open fd (or use --listen PATH)\n");
      return 1;
    }
    fd_set_cloexec(lfd, true);
    if (ready >= 0)
      fd_set_cloexec(ready, true);
    int state = env_fd("MOAT_GUEST_STATE_FD");
    if (state >= 0) { /* a renewal: the table of the image before us */
      renewed = env_fd("MOAT_GUEST_RENEW_FD");
      int rc = guest_procs_load(state, &err);
      close(state);
      /* back to the uids we ran with (the exec ran with another real uid) */
      uid_t euid = geteuid();
      if (rc < 0 || syscall(SYS_setresuid, euid, euid, euid) < 0) {
        fprintf(stderr, "moat-guest: renew: %s\n", rc < 0 ? moat_error_msg(err) : strerror(errno));
        return 1;
      }
      if (renewed >= 0)
        fd_set_cloexec(renewed, true);
    }
    unsetenv("MOAT_GUEST_LISTEN_FD");
    unsetenv("MOAT_GUEST_READY_FD");
    unsetenv("MOAT_GUEST_STATE_FD");
    unsetenv("MOAT_GUEST_RENEW_FD");
  }
  fd_set_nonblock(lfd, true);
  if (getpid() == 1) {
    /* CRIU wants the sandbox's init to lead its own session and hold no stdin from outside. */
    (void)setsid();
    int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (null >= 0) {
      dup2(null, 0);
      close(null);
    }
  } else {
    /* Outside a pid namespace (development), orphans of commands come back to us, not to init. */
    prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
  }

  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGCHLD);
  sigaddset(&mask, SIGUSR2); /* the host's quiesce before a checkpoint */
  sigprocmask(SIG_BLOCK, &mask, NULL);
  int sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sfd < 0) {
    fprintf(stderr, "moat-guest: signalfd: %s\n", strerror(errno));
    return 1;
  }
  int notify[2];
  if (pipe2(notify, O_CLOEXEC | O_NONBLOCK) < 0) {
    fprintf(stderr, "moat-guest: pipe: %s\n", strerror(errno));
    return 1;
  }
  int handoff[2];
  if (socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, handoff) < 0) {
    fprintf(stderr, "moat-guest: socketpair: %s\n", strerror(errno));
    return 1;
  }
  fd_set_nonblock(handoff[0], true);
  guest_procs_init(etc_dir);
  if (ready >= 0) { /* before the first fork: spares must not hold the ready pipe open */
    (void)!write(ready, "R", 1);
    close(ready);
  }
  fork_spares(lfd, notify[1], handoff[1], etc_dir);
  if (renewed >= 0) {
    moat_msg_send_empty(renewed, MOAT_REP_OK);
    close(renewed);
  }
  for (;;) {
    bool missing = false;
    for (int i = 0; i < SPARES; i++)
      missing |= spares[i] <= 0;
    size_t n;
    int timeout;
    struct pollfd *p = guest_procs_pollfds(3, &n, &timeout);
    p[0] = (struct pollfd){.fd = handoff[0], .events = POLLIN};
    p[1] = (struct pollfd){.fd = notify[0], .events = POLLIN};
    p[2] = (struct pollfd){.fd = sfd, .events = POLLIN};
    if (missing && (timeout < 0 || timeout > 50))
      timeout = 50; /* a failed fork (pids limit) is retried */
    if (poll(p, n, timeout) < 0) {
      if (errno == EINTR)
        continue;
      struct timespec ts = {0, 10 * 1000 * 1000};
      nanosleep(&ts, NULL);
      continue;
    }
    if (p[0].revents & POLLIN)
      receive_handoffs(handoff[0]);
    if (p[1].revents & POLLIN) {
      pid_t busy[16];
      ssize_t k;
      while ((k = read(notify[0], busy, sizeof(busy))) > 0)
        for (size_t i = 0; i < (size_t)k / sizeof(pid_t); i++) {
          forget_spare(busy[i]);
          busy_add(busy[i]);
        }
    }
    if (p[2].revents & POLLIN) {
      struct signalfd_siginfo si[16];
      ssize_t k;
      bool q = false;
      while ((k = read(sfd, si, sizeof(si))) > 0)
        for (size_t i = 0; i < (size_t)k / sizeof(si[0]); i++)
          q |= si[i].ssi_signo == SIGUSR2 && si[i].ssi_pid == 0; /* from outside our pid namespace:
                                                                    the host's, not the sandbox's */
      reap_all();
      if (q)
        quiesce();
    }
    guest_procs_dispatch(p, 3, n);
    int rq = guest_procs_renew_requested();
    if (rq >= 0)
      renew(rq, lfd); /* returns only if the exec failed */
    fork_spares(lfd, notify[1], handoff[1], etc_dir);
    if ((p[0].revents | p[1].revents | p[2].revents) & (POLLERR | POLLNVAL)) { /* never spin on a broken fd */
      struct timespec ts = {0, 10 * 1000 * 1000};
      nanosleep(&ts, NULL);
    }
  }
}

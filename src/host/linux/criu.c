/* criu.c -- finding and running the CRIU binary that scripts/criu.sh chose for this host
 *
 * moatd never builds CRIU command lines from user input: checkpoint.c passes fixed options and
 * paths under the data dir only.
 */
#include "criu.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../common/crashpoint.h"
#include "../../common/log.h"
#include "../../common/util.h"

/* The first probe runs once, on the first call; while CRIU fails it, a thread probes again after
 * 1, 2, 4 ... s (at most RETRY_MAX_S apart) until it passes. Once available it stays so. The status
 * line is written into the buffer readers do not hold (two, flipped): a reader copies it at once. */
#define RETRY_MAX_S 60
static pthread_once_t once = PTHREAD_ONCE_INIT;
static bool available; /* atomic; criu_bin and kdat are set before it turns true */
static char status_lines[2][1024];
static int status_cur; /* atomic: index of the line readers see */
static char criu_bin[4096];
static void load_kdat(const char *bin);
/* CRIU's kernel-feature cache (/run/criu.kdat): CRIU keeps it only on a tmpfs /run, which this
 * host may not have; we make one once per boot and hand it to every CRIU run in its private
 * mount namespace, which saves CRIU's ~40 ms of probing per run. */
static char *kdat;
static size_t kdat_len;

/* Runs `BIN check`; returns 0 when it passes, else -1 with its last error line in why. */
static int criu_check(const char *bin, char *why, size_t why_len) {
  int p[2];
  if (pipe2(p, O_CLOEXEC) < 0) {
    snprintf(why, why_len, "pipe: %s", strerror(errno));
    return -1;
  }
  pid_t pid = fork();
  if (pid < 0) {
    snprintf(why, why_len, "fork: %s", strerror(errno));
    close(p[0]);
    close(p[1]);
    return -1;
  }
  if (pid == 0) {
    dup2(p[1], 1);
    dup2(p[1], 2);
    int null = open("/dev/null", O_RDONLY);
    if (null >= 0)
      dup2(null, 0);
    execl(bin, "criu", "check", (char *)NULL);
    _exit(127);
  }
  close(p[1]);
  char buf[8192];
  size_t len = 0;
  ssize_t r;
  while ((r = read(p[0], buf + len, sizeof(buf) - 1 - len)) > 0 || (r < 0 && errno == EINTR))
    if (r > 0 && (len += (size_t)r) >= sizeof(buf) - 1)
      break;
  buf[len] = '\0';
  close(p[0]);
  int st;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
    ;
  if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
    return 0;
  /* the most telling line: one naming the cause, else the last non-empty one */
  char *pick = NULL;
  for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n"))
    if (!pick || strstr(line, "vdso") || strstr(line, "Unexpected"))
      pick = line;
  if (WIFEXITED(st) && WEXITSTATUS(st) == 127)
    snprintf(why, why_len, "cannot run %s", bin);
  else
    snprintf(why, why_len, "%s", pick ? pick : "criu check failed");
  return -1;
}

static void set_status(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void set_status(const char *fmt, ...) {
  int next = !__atomic_load_n(&status_cur, __ATOMIC_ACQUIRE);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(status_lines[next], sizeof(status_lines[next]), fmt, ap);
  va_end(ap);
  __atomic_store_n(&status_cur, next, __ATOMIC_RELEASE);
}

/* One probe: finds the binary and runs `criu check`. True when CRIU is usable (then available is
 * set). why gets the reason otherwise. */
static bool probe(char *why, size_t why_len) {
  const char *env = getenv("MOAT_CRIU");
  const char *bin = env && *env ? env : MOAT_CRIU_DEFAULT;
  if (access(bin, X_OK) < 0) {
    snprintf(why, why_len, "no CRIU at %s (run scripts/criu.sh as root to install one)", bin);
    return false;
  }
  char line[512];
  if (criu_check(bin, line, sizeof(line)) < 0) {
    snprintf(why, why_len, "%s fails criu check: %s", bin, line);
    return false;
  }
  snprintf(criu_bin, sizeof(criu_bin), "%s", bin);
  load_kdat(bin);
  _cleanup_free_ char *choice = NULL;
  if (!env && read_file(MOAT_CRIU_CHOICE, &choice, NULL, NULL) == 0 && *choice) {
    choice[strcspn(choice, "\n")] = '\0';
    set_status("%s", choice);
  } else {
    set_status("criu at %s (%s; criu check passes)", bin,
               env ? "from MOAT_CRIU" : "no CHOICE line from scripts/criu.sh");
  }
  __atomic_store_n(&available, true, __ATOMIC_RELEASE);
  return true;
}

static void *retry_main(void *arg) {
  (void)arg;
  char why[600];
  unsigned delay = 1;
  for (unsigned attempt = 2;; attempt++) {
    sleep(delay);
    if (probe(why, sizeof(why))) {
      log_info("checkpoints available after %u probes of CRIU", attempt);
      return NULL;
    }
    delay = delay * 2 > RETRY_MAX_S ? RETRY_MAX_S : delay * 2;
    set_status("checkpoints unavailable: %s (probe %u failed; next in %u s)", why, attempt, delay);
  }
}

static void find_criu(void) {
  char why[600];
  if (probe(why, sizeof(why)))
    return;
  set_status("checkpoints unavailable: %s (probe 1 failed; next in 1 s)", why);
  log_warn("checkpoints unavailable: %s (probing again, at most %d s apart)", why, RETRY_MAX_S);
  pthread_attr_t attr;
  pthread_t t;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  if (pthread_create(&t, &attr, retry_main, NULL) != 0)
    set_status("checkpoints unavailable: %s (cannot start a thread to probe again)", why);
  pthread_attr_destroy(&attr);
}

/* Runs `criu check` in a private mount namespace with a tmpfs /run, where CRIU saves its cache,
 * and keeps a copy at /run/moat/criu-kdat-BOOTID; loads it into kdat. Best effort. */
static void load_kdat(const char *bin) {
  _cleanup_free_ char *boot = NULL;
  if (read_file("/proc/sys/kernel/random/boot_id", &boot, NULL, NULL) < 0)
    return;
  boot[strcspn(boot, "\n")] = '\0';
  mkdir("/run/moat", 0755);
  _cleanup_free_ char *path = xasprintf("/run/moat/criu-kdat-%s", boot);
  if (read_file(path, &kdat, &kdat_len, NULL) == 0 && kdat_len > 0)
    return;
  free(kdat);
  kdat = NULL;
  _cleanup_free_ char *tmp = xasprintf("%s.%d", path, getpid());
  int out = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (out < 0)
    return;
  pid_t pid = fork();
  if (pid == 0) {
    if (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0 ||
        mount("tmpfs", "/run", "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755") < 0)
      _exit(1);
    pid_t c = fork();
    if (c == 0) {
      int null = open("/dev/null", O_RDWR);
      dup2(null, 0), dup2(null, 1), dup2(null, 2);
      execl(bin, "criu", "check", (char *)NULL);
      _exit(127);
    }
    int st;
    if (c < 0 || waitpid(c, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
      _exit(2);
    int in = open("/run/criu.kdat", O_RDONLY);
    char buf[8192];
    ssize_t n;
    if (in < 0)
      _exit(3);
    while ((n = read(in, buf, sizeof(buf))) > 0)
      if (write_all(out, buf, (size_t)n) < 0)
        _exit(4);
    _exit(n < 0 ? 5 : 0);
  }
  int st = -1;
  if (pid > 0)
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
      ;
  close(out);
  if (pid > 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0 && rename(tmp, path) == 0 &&
      read_file(path, &kdat, &kdat_len, NULL) == 0)
    return;
  unlink(tmp);
  free(kdat);
  kdat = NULL;
  kdat_len = 0;
}

int moat_criu_child_setup(void) {
  if (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
    return -1;
  /* /run/moat stays visible under the new /run: a restore binds the new slot's guest channel
   * dir from there (shell.h). */
  int keep = open_tree(AT_FDCWD, "/run/moat", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE);
  if (keep < 0)
    return -1;
  /* writable by a CRIU running as a sandbox's uid, readable by one inside its namespace */
  if (mount("tmpfs", "/run", "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=1777") < 0 ||
      mkdir("/run/moat", 0755) < 0 ||
      move_mount(keep, "", AT_FDCWD, "/run/moat", MOVE_MOUNT_F_EMPTY_PATH) < 0) {
    close(keep);
    return -1;
  }
  close(keep);
  if (!kdat)
    return 0;
  int fd = open("/run/criu.kdat", O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0)
    return -1;
  int r = write_all(fd, kdat, kdat_len);
  close(fd);
  return r;
}

bool moat_criu_available(const char **status) {
  pthread_once(&once, find_criu);
  if (status)
    *status = status_lines[__atomic_load_n(&status_cur, __ATOMIC_ACQUIRE)];
  return __atomic_load_n(&available, __ATOMIC_ACQUIRE);
}

const char *moat_criu_path(void) { return moat_criu_available(NULL) ? criu_bin : NULL; }

/* The "Error (...)" lines of a CRIU log, joined by "; " (at most ~1 KiB). */
static char *log_errors(const char *log_path) {
  _cleanup_free_ char *text = NULL;
  if (!log_path || read_file(log_path, &text, NULL, NULL) < 0)
    return xstrdup("no log");
  size_t cap = 1024, len = 0;
  char *out = xcalloc(1, cap + 1);
  for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
    char *e = strstr(line, "Error (");
    if (!e || strstr(line, "RLIMIT_NOFILE") || strstr(line, "tables-") || strstr(line, "exited, status"))
      continue; /* noise: CRIU probing for optional helpers */
    char *msg = strstr(e, "): ");
    msg = msg ? msg + 3 : e;
    int n = snprintf(out + len, cap + 1 - len, "%s%s", len ? "; " : "", msg);
    if (n < 0 || (size_t)n >= cap + 1 - len) {
      len = cap;
      break;
    }
    len += (size_t)n;
  }
  if (!len)
    snprintf(out, cap + 1, "no error lines in %s", log_path);
  return out;
}

struct child_fail {
  int err;
  char step;
};

int moat_criu_run(char **argv, moat_criu_parent_fn parent_fn, moat_criu_child_fn child_fn, void *arg,
                  const char *log_path, moat_error **err) {
  const char *bin = moat_criu_path();
  if (!bin)
    return moat_error_set(err, ENOSYS, "%s", status_lines[__atomic_load_n(&status_cur, __ATOMIC_ACQUIRE)]);
  argv[0] = (char *)bin;
  /* CRIU run as a non-root uid (--unprivileged) looks for its kernel-feature cache in
   * $XDG_RUNTIME_DIR: the same /run/criu.kdat (moat_criu_child_setup). Built here, not in the
   * child, which may not allocate. */
  size_t n_env = 0;
  while (environ[n_env])
    n_env++;
  _cleanup_free_ char **envp = xcalloc(n_env + 2, sizeof(char *));
  size_t k = 0;
  for (size_t i = 0; i < n_env; i++)
    if (strncmp(environ[i], "XDG_RUNTIME_DIR=", 16) != 0)
      envp[k++] = environ[i];
  envp[k++] = "XDG_RUNTIME_DIR=/run";
  int go[2], rep[2];
  if (pipe2(go, O_CLOEXEC) < 0)
    return moat_error_errno(err, "pipe");
  if (pipe2(rep, O_CLOEXEC) < 0) {
    close(go[0]);
    close(go[1]);
    return moat_error_errno(err, "pipe");
  }
  pid_t pid = fork();
  if (pid < 0) {
    close(go[0]), close(go[1]), close(rep[0]), close(rep[1]);
    return moat_error_errno(err, "fork criu");
  }
  if (pid == 0) {
    close(go[1]);
    close(rep[0]);
    struct child_fail f = {0, 'g'};
    char b;
    if (read(go[0], &b, 1) != 1)
      _exit(125);
    int null = open("/dev/null", O_RDWR);
    if (null >= 0) {
      dup2(null, 0);
      dup2(null, 1);
      dup2(null, 2);
    }
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    f.step = 'c';
    if (child_fn && child_fn(arg) < 0)
      goto fail;
    f.step = 'e';
    execve(bin, argv, envp);
  fail:
    f.err = errno;
    (void)!write(rep[1], &f, sizeof(f));
    _exit(126);
  }
  close(go[0]);
  close(rep[1]);
  int ret = 0;
  if (parent_fn && parent_fn(arg, pid, err) < 0) {
    kill(pid, SIGKILL);
    ret = -1;
  } else if (write(go[1], "g", 1) != 1) {
    ret = moat_error_errno(err, "start criu");
    kill(pid, SIGKILL);
  }
  close(go[1]);
  if (ret == 0)
    moat_crash_point(strcmp(argv[1], "dump") == 0 ? "criu.dump" : "criu.restore");
  /* Wait for the process first, then look for a failure report: waiting for EOF on rep instead
   * would hang while any other process forked meanwhile by another thread (a restore's holder)
   * holds a copy of rep[1]. */
  int st;
  while (waitpid(pid, &st, 0) < 0)
    if (errno != EINTR) {
      close(rep[0]);
      return ret < 0 ? ret : moat_error_errno(err, "wait criu");
    }
  struct child_fail f = {0, 0};
  fd_set_nonblock(rep[0], true);
  ssize_t n = read(rep[0], &f, sizeof(f));
  close(rep[0]);
  if (ret < 0)
    return ret;
  if (n == (ssize_t)sizeof(f)) {
    errno = f.err;
    return moat_error_errno(err, "criu %s: %s", argv[1],
                            f.step == 'c' ? "preparing its namespaces failed" : "exec failed");
  }
  if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
    return 0;
  _cleanup_free_ char *why = log_errors(log_path);
  return moat_error_set(err, EIO, "criu %s failed (%s %d): %s", argv[1], WIFEXITED(st) ? "status" : "signal",
                        WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st), why);
}

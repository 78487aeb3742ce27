/* lxcfs.c -- finding or starting the machine's lxcfs (lxcfs.h) */
#include "lxcfs.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../common/util.h"
#include "view.h"

#define DEBIAN_SERVICE_DIR "/var/lib/lxcfs"
#define START_WAIT_MS 5000

static bool usable(const char *dir) {
  moat_error *e = NULL;
  int r = moat_view_lxcfs_check(dir, &e);
  moat_error_free(&e);
  return r == 0;
}

/* The lxcfs executable on PATH (or /usr/bin's), or NULL. Caller frees. */
static char *find_lxcfs(void) {
  const char *path = getenv("PATH");
  _cleanup_free_ char *copy = xstrdup(path && *path ? path : "/usr/sbin:/usr/bin:/sbin:/bin");
  char *save = NULL;
  for (char *d = strtok_r(copy, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
    char *p = xasprintf("%s/lxcfs", d);
    if (access(p, X_OK) == 0)
      return p;
    free(p);
  }
  return access("/usr/bin/lxcfs", X_OK) == 0 ? xstrdup("/usr/bin/lxcfs") : NULL;
}

/* Forks twice so that lxcfs is nobody's child here (moatd never reaps it) and leads a session of
 * its own; the grandchild starts with default signal dispositions and an empty mask whatever
 * moatd inherited, stdin /dev/null and its output appended to log. Only system calls between
 * fork and exec: moatd has threads. */
static int spawn_detached(const char *exe, const char *dir, const char *pidfile, const char *log,
                          moat_error **err) {
  char *argv[] = {(char *)"lxcfs", (char *)"-f",    (char *)"-l", (char *)"--enable-cfs",
                  (char *)"-p",    (char *)pidfile, (char *)dir,  NULL};
  pid_t p = fork();
  if (p < 0)
    return moat_error_errno(err, "fork");
  if (p == 0) {
    if (setsid() < 0)
      _exit(1);
    pid_t q = fork();
    if (q != 0)
      _exit(q < 0);
    reset_signals_raw();
    int in = open("/dev/null", O_RDONLY | O_CLOEXEC);
    int out = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (in < 0 || out < 0 || dup2(in, 0) < 0 || dup2(out, 1) < 0 || dup2(out, 2) < 0)
      _exit(1);
    syscall(SYS_close_range, 3, ~0U, 0);
    execv(exe, argv);
    _exit(127);
  }
  int status;
  while (waitpid(p, &status, 0) < 0)
    if (errno != EINTR)
      return moat_error_errno(err, "wait for lxcfs's launcher");
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return moat_error_set(err, EIO, "lxcfs's launcher failed");
  return 0;
}

char *moat_lxcfs_auto(char **why) {
  *why = NULL;
  if (usable(DEBIAN_SERVICE_DIR))
    return xstrdup(DEBIAN_SERVICE_DIR);
  if (usable(MOAT_LXCFS_DIR))
    return xstrdup(MOAT_LXCFS_DIR);
  _cleanup_free_ char *exe = find_lxcfs();
  if (!exe) {
    *why = xstrdup("no lxcfs on PATH (Debian's package lxcfs)");
    return NULL;
  }
  if (access("/dev/fuse", R_OK | W_OK) < 0) {
    *why = xasprintf("/dev/fuse: %s", strerror(errno));
    return NULL;
  }
  moat_error *e = NULL;
  if (mkdir_p(MOAT_LXCFS_DIR, 0755, &e) < 0) {
    *why = xstrdup(moat_error_msg(e));
    moat_error_free(&e);
    return NULL;
  }
  /* one start for the machine: a second moatd waits here, then finds the first one's mount */
  _cleanup_close_ int lock = open(MOAT_LXCFS_HOME "/lock", O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock < 0 || flock(lock, LOCK_EX) < 0) {
    *why = xasprintf("lock %s/lock: %s", MOAT_LXCFS_HOME, strerror(errno));
    return NULL;
  }
  if (usable(MOAT_LXCFS_DIR))
    return xstrdup(MOAT_LXCFS_DIR);
  /* an lxcfs that died leaves its FUSE mount behind ("transport endpoint is not connected") */
  umount2(MOAT_LXCFS_DIR, MNT_DETACH);
  if (spawn_detached(exe, MOAT_LXCFS_DIR, MOAT_LXCFS_HOME "/pid", MOAT_LXCFS_HOME "/log", &e) < 0) {
    *why = xstrdup(moat_error_msg(e));
    moat_error_free(&e);
    return NULL;
  }
  for (int waited = 0; waited < START_WAIT_MS; waited += 20) {
    if (usable(MOAT_LXCFS_DIR))
      return xstrdup(MOAT_LXCFS_DIR);
    usleep(20 * 1000);
  }
  *why = xasprintf("%s started but did not mount %s in %d s (see %s/log)", exe, MOAT_LXCFS_DIR,
                   START_WAIT_MS / 1000, MOAT_LXCFS_HOME);
  return NULL;
}

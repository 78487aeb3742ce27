/* userns.c -- user namespaces owned by the sandbox's own host uid (userns.h says why) */
#include "userns.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/securebits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "../../common/fault.h"
#include "../../common/log.h"
#include "../../common/sanitizer.h"

static const struct {
  int resource;
  rlim_t value;
  const char *name;
} sandbox_limits[] = {
    {RLIMIT_SIGPENDING, MOAT_SANDBOX_SIGPENDING, "RLIMIT_SIGPENDING"},
    {RLIMIT_MSGQUEUE, MOAT_SANDBOX_MSGQUEUE, "RLIMIT_MSGQUEUE"},
    {RLIMIT_MEMLOCK, MOAT_SANDBOX_MEMLOCK, "RLIMIT_MEMLOCK"},
};

int moat_userns_limits_init(moat_error **err) {
  for (size_t i = 0; i < sizeof(sandbox_limits) / sizeof(sandbox_limits[0]); i++) {
    struct rlimit rl;
    if (getrlimit(sandbox_limits[i].resource, &rl) < 0)
      return moat_error_errno(err, "getrlimit %s", sandbox_limits[i].name);
    rlim_t want = sandbox_limits[i].value;
    if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < want)
      want = rl.rlim_max;
    rl.rlim_cur = want;
    if (setrlimit(sandbox_limits[i].resource, &rl) < 0)
      return moat_error_errno(err, "setrlimit %s", sandbox_limits[i].name);
  }
  return 0;
}

int moat_userns_drop_loginuid(void) {
  int fd = (int)syscall(SYS_openat, AT_FDCWD, "/proc/thread-self/loginuid", O_RDWR | O_CLOEXEC);
  if (fd < 0)
    return errno == ENOENT ? 0 : -1; /* no audit support: nothing to carry */
  static const char unset[] = "4294967295";
  char cur[16];
  ssize_t n = read(fd, cur, sizeof(cur) - 1);
  int ret = 0;
  if (n < 0 || (size_t)n != sizeof(unset) - 1 || memcmp(cur, unset, sizeof(unset) - 1) != 0)
    ret = pwrite(fd, unset, sizeof(unset) - 1, 0) == (ssize_t)sizeof(unset) - 1 ? 0 : -1;
  int e = errno;
  close(fd);
  errno = e;
  return ret;
}

pid_t moat_userns_clone3(struct clone_args *args, uid_t owner) {
  if (moat_fault(MOAT_FAULT_CLONE))
    return errno = EAGAIN, -1;
  moat_userns_drop_loginuid();
  uid_t ruid, euid, suid;
  if (syscall(SYS_getresuid, &ruid, &euid, &suid) < 0)
    return -1;
  long bits = syscall(SYS_prctl, PR_GET_SECUREBITS, 0, 0, 0, 0);
  if (bits < 0)
    return -1;
  uid_t fsuid = (uid_t)syscall(SYS_setfsuid, -1);
  if (syscall(SYS_prctl, PR_SET_SECUREBITS, bits | SECBIT_NO_SETUID_FIXUP, 0, 0, 0) < 0)
    return -1;
  pid_t pid = -1;
  int saved = 0;
  if (syscall(SYS_setresuid, -1, owner, -1) < 0) {
    saved = errno;
  } else {
    syscall(SYS_setfsuid, fsuid); /* setresuid moved it along with the euid */
    pid = (pid_t)syscall(SYS_clone3, args, sizeof(*args));
    if (pid == 0)
      return moat_sanitizer_clone_child(), 0;
    saved = errno;
  }
  /* A thread left with another euid would create files and processes as that uid: never go on. */
  if (syscall(SYS_setresuid, -1, euid, -1) < 0 || syscall(SYS_prctl, PR_SET_SECUREBITS, bits, 0, 0, 0) < 0) {
    log_error("userns: cannot restore this thread's credentials: %s", strerror(errno));
    abort();
  }
  syscall(SYS_setfsuid, fsuid);
  (void)ruid, (void)suid;
  errno = saved;
  return pid;
}

int moat_userns_become_owner(uid_t owner) {
  struct __user_cap_header_struct hdr = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
  struct __user_cap_data_struct d[2];
  if (syscall(SYS_capget, &hdr, d) < 0)
    return -1;
  d[0].inheritable = d[0].permitted;
  d[1].inheritable = d[1].permitted;
  if (syscall(SYS_capset, &hdr, d) < 0)
    return -1;
  for (int cap = 0; cap < 64; cap++)
    if ((d[cap / 32].permitted >> (cap % 32)) & 1)
      if (syscall(SYS_prctl, PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, cap, 0, 0) < 0)
        return -1;
  long bits = syscall(SYS_prctl, PR_GET_SECUREBITS, 0, 0, 0, 0);
  if (bits < 0 || syscall(SYS_prctl, PR_SET_SECUREBITS, bits | SECBIT_NO_SETUID_FIXUP, 0, 0, 0) < 0)
    return -1;
  if (syscall(SYS_setgroups, 0, NULL) < 0 || syscall(SYS_setresgid, owner, owner, owner) < 0 ||
      syscall(SYS_setresuid, owner, owner, owner) < 0)
    return -1;
  return syscall(SYS_prctl, PR_SET_SECUREBITS, bits, 0, 0, 0) < 0 ? -1 : 0;
}

/* Sets soft and hard limit to value, or to the current hard limit if that is lower (raising it
 * would take CAP_SYS_RESOURCE). */
static int cap_rlimit(int resource, rlim_t value) {
  struct rlimit old;
  if (syscall(SYS_prlimit64, 0, resource, NULL, &old) < 0)
    return -1;
  if (old.rlim_max != RLIM_INFINITY && old.rlim_max < value)
    value = old.rlim_max;
  struct rlimit rl = {value, value};
  return syscall(SYS_prlimit64, 0, resource, &rl, NULL) < 0 ? -1 : 0;
}

int moat_userns_set_rlimits(void) {
  for (size_t i = 0; i < sizeof(sandbox_limits) / sizeof(sandbox_limits[0]); i++)
    if (cap_rlimit(sandbox_limits[i].resource, sandbox_limits[i].value) < 0)
      return -1;
  return cap_rlimit(RLIMIT_NPROC, RLIM_INFINITY);
}

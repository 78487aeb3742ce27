/* seccomp.c -- the sandbox's seccomp deny-list: Docker's default denials plus keyctl, bpf,
 * userfaultfd, perf_event_open, io_uring, the whole mount API and namespace creation */
#include "seccomp.h"

#include <errno.h>
#include <sched.h>
#include <seccomp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../common/util.h"

/* Denied with EPERM whatever their arguments. */
static const char *const denied[] = {
    "acct",
    "add_key",
    "bpf",
    "clock_adjtime",
    "clock_settime",
    "settimeofday",
    "stime",
    "create_module",
    "delete_module",
    "finit_module",
    "init_module",
    "get_kernel_syms",
    "query_module",
    "kexec_file_load",
    "kexec_load",
    "keyctl",
    "request_key",
    "lookup_dcookie",
    "nfsservctl",
    "open_by_handle_at",
    "perf_event_open",
    "pivot_root",
    "process_vm_readv",
    "process_vm_writev",
    "ptrace",
    "quotactl",
    "quotactl_fd",
    "reboot",
    "setns",
    "swapon",
    "swapoff",
    "sysfs",
    "_sysctl",
    "mount",
    "umount",
    "umount2",
    "unshare",
    "uselib",
    "userfaultfd",
    "ustat",
    "vm86",
    "vm86old",
    "mount_setattr",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "iopl",
    "ioperm",
    "kcmp",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "pidfd_getfd",
    "fanotify_init",
    "syslog",
    "vhangup",
    "name_to_handle_at",
    "lsm_set_self_attr",
    "landlock_create_ruleset",
    "landlock_add_rule",
    "landlock_restrict_self",
};

int moat_seccomp_build(struct sock_fprog *prog, moat_error **err) {
  scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
  int ret = -1, memfd = -1;
  if (!ctx)
    return moat_error_set(err, ENOMEM, "seccomp_init failed");
  /* Other ABIs (i386, x32) are killed: the deny-list is written for x86_64 / the native ABI. */
  if (seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS) < 0 ||
      seccomp_attr_set(ctx, SCMP_FLTATR_CTL_NNP, 0) < 0) {
    moat_error_set(err, EINVAL, "seccomp: set attributes");
    goto out;
  }
  for (size_t i = 0; i < ARRAY_SIZE(denied); i++) {
    int nr = seccomp_syscall_resolve_name(denied[i]);
    if (nr == __NR_SCMP_ERROR)
      continue; /* not on this architecture */
    int r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), nr, 0);
    if (r < 0 && r != -EDOM && r != -EEXIST) {
      moat_error_set(err, -r, "seccomp: deny %s: %s", denied[i], strerror(-r));
      goto out;
    }
  }
  /* clone3 passes its flags in memory where a filter cannot look: ENOSYS makes libc fall back
   * to clone(2), whose flags are checked below. */
  if (seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0) < 0) {
    moat_error_set(err, EINVAL, "seccomp: clone3 rule");
    goto out;
  }
  static const unsigned long ns_flags[] = {CLONE_NEWNS,     CLONE_NEWUTS, CLONE_NEWIPC,
                                           CLONE_NEWUSER,   CLONE_NEWPID, CLONE_NEWNET,
                                           CLONE_NEWCGROUP, 0x00000080 /* NEWTIME */};
  for (size_t i = 0; i < ARRAY_SIZE(ns_flags); i++)
    if (seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), 1,
                         SCMP_A0(SCMP_CMP_MASKED_EQ, ns_flags[i], ns_flags[i])) < 0) {
      moat_error_set(err, EINVAL, "seccomp: clone rule");
      goto out;
    }
  /* TIOCSTI / TIOCLINUX push input into a terminal another process reads. */
  static const unsigned long bad_ioctls[] = {TIOCSTI, TIOCLINUX};
  for (size_t i = 0; i < ARRAY_SIZE(bad_ioctls); i++)
    if (seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(ioctl), 1,
                         SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffffffffUL, bad_ioctls[i])) < 0) {
      moat_error_set(err, EINVAL, "seccomp: ioctl rule");
      goto out;
    }
  /* personality: the flags that weaken ASLR or NX are denied. */
  if (seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(personality), 1,
                       SCMP_A0(SCMP_CMP_MASKED_EQ, 0x0400000UL /* READ_IMPLIES_EXEC */, 0x0400000UL)) < 0 ||
      seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(personality), 1,
                       SCMP_A0(SCMP_CMP_MASKED_EQ, 0x0040000UL /* ADDR_NO_RANDOMIZE */, 0x0040000UL)) < 0) {
    moat_error_set(err, EINVAL, "seccomp: personality rule");
    goto out;
  }
  memfd = memfd_create("moat-seccomp", MFD_CLOEXEC);
  if (memfd < 0) {
    moat_error_errno(err, "memfd_create");
    goto out;
  }
  int r = seccomp_export_bpf(ctx, memfd);
  if (r < 0) {
    moat_error_set(err, -r, "seccomp_export_bpf: %s", strerror(-r));
    goto out;
  }
  struct stat st;
  if (fstat(memfd, &st) < 0 || st.st_size <= 0 || st.st_size % (off_t)sizeof(struct sock_filter) != 0) {
    moat_error_set(err, EINVAL, "seccomp: exported program has a bad size");
    goto out;
  }
  struct sock_filter *f = xmalloc((size_t)st.st_size);
  if (pread(memfd, f, (size_t)st.st_size, 0) != st.st_size) {
    free(f);
    moat_error_errno(err, "read exported seccomp program");
    goto out;
  }
  prog->len = (unsigned short)((size_t)st.st_size / sizeof(struct sock_filter));
  prog->filter = f;
  ret = 0;
out:
  if (memfd >= 0)
    close(memfd);
  seccomp_release(ctx);
  return ret;
}

int moat_seccomp_install(const struct sock_fprog *prog) {
  if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, prog, 0, 0) < 0)
    return -errno;
  return 0;
}

/* seccomp.h -- the sandbox's seccomp deny-list, compiled once and installed in each new sandbox */
#ifndef MOAT_SECCOMP_H
#define MOAT_SECCOMP_H

#include <linux/filter.h>

#include "../../common/error.h"

/* Builds the filter (libseccomp) and exports it as a classic BPF program; prog->filter is owned
 * by the caller (free). 0 or -1. */
int moat_seccomp_build(struct sock_fprog *prog, moat_error **err);

/* Installs prog in the calling thread (async-signal-safe: for the child after clone). Requires
 * CAP_SYS_ADMIN in the caller's user namespace or no_new_privs. Returns 0 or -errno. */
int moat_seccomp_install(const struct sock_fprog *prog);

#endif

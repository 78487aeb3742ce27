/* fault.h -- fault injection: a test makes the Nth allocation, mount, clone, netlink message or
 * store write fail, to show that every error path cleans up (SQLite's habit) */
#ifndef MOAT_FAULT_H
#define MOAT_FAULT_H

#include <stdbool.h>

enum moat_fault_kind {
  MOAT_FAULT_ALLOC,   /* xmalloc, xcalloc, xrealloc: the allocator returns NULL (so they abort) */
  MOAT_FAULT_MOUNT,   /* a mount of the linux driver's create or restore fails (ENOMEM) */
  MOAT_FAULT_CLONE,   /* the clone3 of a sandbox's init or a restore's holder fails (EAGAIN) */
  MOAT_FAULT_NETLINK, /* a netlink request of the network fails to send (ENOBUFS) */
  MOAT_FAULT_STORE,   /* a store write (a statement or a commit) fails (EIO) */
  MOAT_FAULT_KINDS
};

/* Called at each injection point: true when this call of kind is the one to fail (the caller then
 * fails as the real operation would). Calls are counted only while some kind is armed; when none
 * is, this is one relaxed load. The first armed call reads MOAT_FAULT: a comma-separated list of
 * KIND:N (alloc, mount, clone, netlink, store), each arming kind to fail its Nth call counted from
 * process start; a failing call writes "fault: KIND call N fails" to stderr. Thread-safe. For
 * tests: an operator never sets it. */
bool moat_fault(enum moat_fault_kind kind);

/* Test-only: arms kind to fail its nth call from now (n >= 1; MOAT_FAULT_COUNT only counts), or
 * disarms it (n = 0); its count starts again at 0 either way. Every thread counts (and the
 * processes they clone or fork go on with a copy of the counts): a test keeps background work
 * quiet, or accepts that the call that fails may be one of it. */
#define MOAT_FAULT_COUNT (~0ul)
void moat_fault_set(enum moat_fault_kind kind, unsigned long n);
/* Calls of kind counted since its last moat_fault_set (or process start). */
unsigned long moat_fault_count(enum moat_fault_kind kind);
/* "alloc", "mount", ... */
const char *moat_fault_name(enum moat_fault_kind kind);

#endif

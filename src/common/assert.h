/* assert.h -- moat_assert: invariants that must never fail, checked in every build */
#ifndef MOAT_ASSERT_H
#define MOAT_ASSERT_H

#include <stddef.h>

/* moat_assert(cond, fmt, ...): when cond is false, writes "moat: FILE:LINE: assertion `cond'
 * failed: <message>" to stderr and aborts. For states the code can never reach when it is right
 * (a reference count below zero, a length that wrapped): never for what input, a sandbox or the
 * host can cause, which is an error to return. Not compiled out by NDEBUG: going on from a broken
 * invariant in a daemon that holds other tenants' sandboxes is worse than stopping. */
#define moat_assert(cond, ...) ((cond) ? (void)0 : moat_assert_fail(__FILE__, __LINE__, #cond, __VA_ARGS__))

void moat_assert_fail(const char *file, int line, const char *expr, const char *fmt, ...)
    __attribute__((noreturn, cold, format(printf, 4, 5)));

/* Writes "moat: out of memory: WHAT of N bytes" (FILE:LINE when file is not NULL) to stderr and
 * aborts: what xmalloc and its kin do when the allocator fails. Allocates nothing. */
void moat_oom(const char *what, size_t n, const char *file, int line) __attribute__((noreturn, cold));

#endif

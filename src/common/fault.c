/* fault.c -- fault injection points: counters per kind and the call that fails */
#include "fault.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *const names[MOAT_FAULT_KINDS] = {"alloc", "mount", "clone", "netlink", "store"};

static _Atomic unsigned long calls[MOAT_FAULT_KINDS];
static _Atomic unsigned long fail_at[MOAT_FAULT_KINDS]; /* 0: not armed */
static _Atomic unsigned armed;                          /* kinds with fail_at != 0 */
static pthread_once_t env_once = PTHREAD_ONCE_INIT;

const char *moat_fault_name(enum moat_fault_kind kind) {
  return (unsigned)kind < MOAT_FAULT_KINDS ? names[kind] : "?";
}

/* MOAT_FAULT=kind:N,...: parsed without allocating (xmalloc is an injection point). */
static void load_env(void) {
  const char *v = getenv("MOAT_FAULT");
  for (const char *p = v; p && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL) {
    for (unsigned k = 0; k < MOAT_FAULT_KINDS; k++) {
      size_t l = strlen(names[k]);
      if (strncmp(p, names[k], l) == 0 && p[l] == ':') {
        unsigned long n = strtoul(p + l + 1, NULL, 10);
        if (n) {
          atomic_store(&fail_at[k], n);
          atomic_fetch_or(&armed, 1u << k);
        }
      }
    }
  }
}

bool moat_fault(enum moat_fault_kind kind) {
  if (!atomic_load_explicit(&armed, memory_order_relaxed)) {
    static _Atomic bool env_read;
    if (atomic_load_explicit(&env_read, memory_order_relaxed))
      return false;
    pthread_once(&env_once, load_env);
    atomic_store(&env_read, true);
    if (!atomic_load(&armed))
      return false;
  }
  unsigned long at = atomic_load(&fail_at[kind]);
  if (!at)
    return false;
  unsigned long n = atomic_fetch_add(&calls[kind], 1) + 1;
  if (n != at)
    return false;
  char line[64];
  int len = snprintf(line, sizeof(line), "fault: %s call %lu fails\n", names[kind], n);
  if (len > 0)
    (void)!write(STDERR_FILENO, line, (size_t)len < sizeof(line) ? (size_t)len : sizeof(line) - 1);
  return true;
}

void moat_fault_set(enum moat_fault_kind kind, unsigned long n) {
  pthread_once(&env_once, load_env);
  atomic_store(&fail_at[kind], n);
  atomic_store(&calls[kind], 0);
  if (n)
    atomic_fetch_or(&armed, 1u << kind);
  else
    atomic_fetch_and(&armed, ~(1u << kind));
}

unsigned long moat_fault_count(enum moat_fault_kind kind) { return atomic_load(&calls[kind]); }

/* hostinfo.c -- the host now: the driver's capacity and load, and what the live sandboxes of an org
 * (or of every org) hold of it (control.h moat_control_host_info) */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "control_internal.h"

void moat_control_host_info(struct moat_control *c, const char *org, struct moat_host_info *out) {
  memset(out, 0, sizeof(*out));
  moat_host_capacity(c->host, &out->cap);
  size_t n = 0;
  struct live **v = live_all(c, org, SIZE_MAX, &n);
  for (size_t i = 0; i < n; i++) {
    struct live *e = v[i];
    pthread_mutex_lock(&e->m);
    enum moat_sandbox_state st = e->state;
    struct moat_limits lim = e->limits;
    pthread_mutex_unlock(&e->m);
    if (st <= MOAT_SB_KILLED)
      out->by_state[st]++;
    if (st == MOAT_SB_RUNNING || st == MOAT_SB_PAUSED) {
      out->committed_vcpus += lim.cpu;
      out->committed_memory_mb += lim.memory_mb;
    }
    live_put(c, e);
  }
  free(v);
}

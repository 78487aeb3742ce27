/* cpu.c -- a sandbox's CPU use as a percent of its limit, over the window since it was last asked
 *
 * The cgroup reports CPU time used; a percent needs two samples. The sample each call takes is
 * remembered (least recently asked sandboxes forgotten first) and the next call measures the window
 * since; a window shorter than CPU_WINDOW_MIN_MS or longer than CPU_WINDOW_MAX_MS (or none yet) is
 * measured now over CPU_WINDOW_MIN_MS instead.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../common/util.h"
#include "control_internal.h"

#define CPU_WINDOW_MIN_MS 100
#define CPU_WINDOW_MAX_MS 60000
#define PREV_SLOTS 256

struct prev_sample {
  char id[MOAT_ID_LEN + 1];
  uint64_t at_ns; /* monotonic */
  uint64_t cpu_ns;
};

struct ctl_cpu {
  pthread_mutex_t lock; /* guards prev */
  struct prev_sample prev[PREV_SLOTS];
};

struct ctl_cpu *ctl_cpu_new(void) {
  struct ctl_cpu *p = xcalloc(1, sizeof(*p));
  pthread_mutex_init(&p->lock, NULL);
  return p;
}

void ctl_cpu_free(struct ctl_cpu *p) {
  if (!p)
    return;
  pthread_mutex_destroy(&p->lock);
  free(p);
}

/* Records (id, at_ns, cpu_ns) and returns the sample it replaces for id in *old (found: true). */
static bool prev_swap(struct ctl_cpu *p, const char *id, uint64_t at_ns, uint64_t cpu_ns,
                      struct prev_sample *old) {
  pthread_mutex_lock(&p->lock);
  size_t victim = 0;
  bool found = false;
  for (size_t i = 0; i < PREV_SLOTS; i++) {
    if (strcmp(p->prev[i].id, id) == 0) {
      victim = i;
      found = true;
      break;
    }
    if (p->prev[i].at_ns < p->prev[victim].at_ns)
      victim = i;
  }
  if (found)
    *old = p->prev[victim];
  snprintf(p->prev[victim].id, sizeof(p->prev[victim].id), "%s", id);
  p->prev[victim].at_ns = at_ns;
  p->prev[victim].cpu_ns = cpu_ns;
  pthread_mutex_unlock(&p->lock);
  return found;
}

int moat_control_usage_cpu(struct moat_control *c, const char *org, const char *id,
                           struct moat_sandbox_usage *u, struct moat_cpu_pct *pct, moat_error **err) {
  memset(pct, 0, sizeof(*pct));
  if (moat_control_usage(c, org, id, u, err) < 0)
    return -1;
  if (!u->sampled)
    return 0;
  uint64_t t = now_ns();
  struct prev_sample old;
  bool have = prev_swap(c->cpu, id, t, u->u.cpu_usage_ns, &old);
  uint64_t age_ms = have ? (t - old.at_ns) / 1000000 : 0;
  if (!have || age_ms < CPU_WINDOW_MIN_MS || age_ms > CPU_WINDOW_MAX_MS || old.cpu_ns > u->u.cpu_usage_ns) {
    old.at_ns = t;
    old.cpu_ns = u->u.cpu_usage_ns;
    usleep(CPU_WINDOW_MIN_MS * 1000);
    if (moat_control_usage(c, org, id, u, err) < 0)
      return -1;
    if (!u->sampled)
      return 0;
    t = now_ns();
    prev_swap(c->cpu, id, t, u->u.cpu_usage_ns, &(struct prev_sample){0});
  }
  double window_ns = (double)(t - old.at_ns);
  double used = u->u.cpu_usage_ns >= old.cpu_ns ? (double)(u->u.cpu_usage_ns - old.cpu_ns) : 0;
  double limit = u->limits.cpu > 0 ? u->limits.cpu : 1;
  pct->window_ms = window_ns / 1e6;
  pct->pct = window_ns > 0 ? used / window_ns / limit * 100.0 : 0;
  if (pct->pct > 100)
    pct->pct = 100; /* CFS lets a period overshoot its quota slightly */
  return 0;
}

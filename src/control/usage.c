/* usage.c -- resource use of sandboxes (cgroups, writable layer) and moatd-wide sandbox counts,
 * for the metrics routes (v1/metrics.c). Reads only: no state changes, no TTL refresh. */
#include <errno.h>
#include <string.h>

#include "../common/util.h"
#include "../store/store.h"
#include "control_internal.h"

/* Samples e into out; e->m is taken here. */
static void sample_live(struct moat_control *c, struct live *e, struct moat_sandbox_usage *out) {
  memset(out, 0, sizeof(*out));
  snprintf(out->id, sizeof(out->id), "%s", e->id);
  snprintf(out->org, sizeof(out->org), "%s", e->org);
  pthread_mutex_lock(&e->m);
  out->state = e->state;
  out->limits = e->limits;
  out->at_ms = now_unix_ms();
  if ((e->state == MOAT_SB_RUNNING || e->state == MOAT_SB_PAUSED) && e->slot >= 0) {
    moat_error *err = NULL;
    if (moat_host_usage(c->host, e->slot, &out->u, &err) == 0)
      out->sampled = true;
    moat_error_free(&err);
    struct moat_disk_usage du;
    if (moat_host_disk_usage(c->host, e->slot, &du, NULL) == 0) {
      out->disk_total_bytes = du.total_bytes;
      out->disk_used_bytes = du.used_bytes;
      out->has_disk = true;
    }
  }
  pthread_mutex_unlock(&e->m);
}

int moat_control_usage(struct moat_control *c, const char *org, const char *id,
                       struct moat_sandbox_usage *out, moat_error **err) {
  struct live *e = live_get(c, id);
  if (!e || strcmp(e->org, org) != 0) {
    if (e)
      live_put(c, e);
    return not_live_error(c, org, id, err);
  }
  sample_live(c, e, out);
  live_put(c, e);
  if (out->state == MOAT_SB_KILLED)
    return not_live_error(c, org, id, err);
  return 0;
}

int moat_control_usage_list(struct moat_control *c, const char *org, size_t max,
                            struct moat_sandbox_usage **out, size_t *n, moat_error **err) {
  (void)err;
  *out = NULL;
  *n = 0;
  /* Take references under the table lock, sample after it (sampling takes each e->m). */
  size_t cnt;
  struct live **refs = live_all(c, org, max, &cnt);
  struct moat_sandbox_usage *v = cnt ? xcalloc(cnt, sizeof(*v)) : NULL;
  size_t k = 0;
  for (size_t i = 0; i < cnt; i++) {
    sample_live(c, refs[i], &v[k]);
    if (v[k].state != MOAT_SB_KILLED)
      k++;
    live_put(c, refs[i]);
  }
  free(refs);
  *out = v;
  *n = k;
  return 0;
}

/* Upper bounds (seconds) of the create latency histogram; the last bucket is +Inf. */
const double moat_create_latency_bounds[MOAT_LATENCY_BUCKETS] = {0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};

int moat_control_stats(struct moat_control *c, struct moat_control_stats *out, moat_error **err) {
  memset(out, 0, sizeof(*out));
  static const char *const states[] = {"creating", "running", "paused", "hibernated", "killed"};
  for (size_t i = 0; i < ARRAY_SIZE(states); i++) {
    struct moat_store_filter f = {.org = NULL, .state = states[i], .metadata = NULL};
    struct moat_store_sandbox *rows = NULL;
    size_t n = 0;
    if (moat_store_sandbox_list(c->store, &f, &rows, &n, err) < 0)
      return -1;
    enum moat_sandbox_state st;
    if (moat_sandbox_state_parse(states[i], &st) == 0 && (unsigned)st < ARRAY_SIZE(out->by_state))
      out->by_state[st] = n;
    out->created_total += n;
    for (size_t j = 0; j < n; j++) {
      if (rows[j].ready_us == 0)
        continue;
      double s = (double)rows[j].ready_us / 1e6;
      out->latency_count++;
      out->latency_sum_s += s;
      for (size_t b = 0; b < MOAT_LATENCY_BUCKETS; b++)
        if (s <= moat_create_latency_bounds[b])
          out->latency_le[b]++;
    }
    moat_store_sandboxes_free(rows, n);
  }
  return 0;
}

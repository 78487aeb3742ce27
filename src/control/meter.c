/* meter.c -- metering: per-sandbox samples of CPU, working-set memory and the history's gauges,
 * taken by a sampler thread every interval and at each pause, hibernation, kill and stop, and
 * written to the store in batches (control.h, "metering").
 *
 * A sample carries the sandbox's running totals. CPU comes from the cgroup's cumulative counter, so
 * nothing is lost between samples; memory is the working set integrated (trapezoid) over the time
 * since the previous reading. After a moatd crash the first reading of an adopted sandbox goes on
 * from its last recorded counter and time when its cgroup is the same (the gap's memory at the
 * working set then): what is lost is what was sampled and not yet written. */
#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../common/log.h"
#include "../common/util.h"
#include "../host/net/net.h"
#include "control_internal.h"

#define METER_DEFAULT_INTERVAL_MS 10000
#define METER_DEFAULT_RETENTION_H 24
#define METER_HOURLY_KEEP_MS (400LL * 86400000LL) /* the hourly totals: longer than a query's range */
#define METER_PRUNE_EVERY_MS 60000
#define METER_MAX_QUEUED 200000
#define GIB 1073741824.0

struct meter_org {
  char *org;
  uint64_t cpu_ns;
  double mem_gib_s;
};

struct ctl_meter {
  pthread_mutex_t lock; /* a leaf */
  pthread_cond_t cond;  /* queued samples, or stop */
  pthread_cond_t idle;  /* nothing queued, nothing being written */
  struct moat_store_meter_sample *q;
  size_t n, cap;
  uint64_t dropped;
  bool stop, writing;
  unsigned interval_ms;
  int64_t retention_ms;
  int64_t pruned_ms;      /* the reaper's */
  struct meter_org *orgs; /* totals per org: loaded from the store, then advanced per sample */
  size_t n_orgs;
  pthread_t thread;
};

static struct meter_org *org_slot(struct ctl_meter *m, const char *org) {
  for (size_t i = 0; i < m->n_orgs; i++)
    if (strcmp(m->orgs[i].org, org) == 0)
      return &m->orgs[i];
  m->orgs = xrealloc(m->orgs, (m->n_orgs + 1) * sizeof(*m->orgs));
  m->orgs[m->n_orgs] = (struct meter_org){.org = xstrdup(org)};
  return &m->orgs[m->n_orgs++];
}

static void queue(struct ctl_meter *m, struct moat_store_meter_sample *s, uint64_t d_cpu, double d_mem) {
  pthread_mutex_lock(&m->lock);
  struct meter_org *o = org_slot(m, s->org);
  o->cpu_ns += d_cpu;
  o->mem_gib_s += d_mem;
  if (m->n >= METER_MAX_QUEUED) {
    m->dropped++;
    free(s->sandbox_id);
    free(s->org);
  } else {
    if (m->n == m->cap) {
      m->cap = m->cap ? m->cap * 2 : 256;
      m->q = xrealloc(m->q, m->cap * sizeof(*m->q));
    }
    m->q[m->n++] = *s;
    pthread_cond_signal(&m->cond);
  }
  pthread_mutex_unlock(&m->lock);
}

/* The totals of e from the store, once (m held). */
static void load_totals(struct moat_control *c, struct live *e, struct moat_store_meter_sample *last,
                        bool *have_last) {
  *have_last = false;
  if (e->meter.loaded)
    return;
  e->meter.loaded = true;
  moat_error *err = NULL;
  if (moat_store_meter_last(c->store, e->id, last, &err) == 0) {
    e->meter.cpu_ns = last->cpu_ns;
    e->meter.mem_gib_s = last->mem_gib_s;
    e->meter.alive_ms = last->alive_ms;
    *have_last = true;
  } else if (err && err->status != ENOENT) {
    log_warn("meter %s: read its last sample: %s", e->id, moat_error_msg(err));
  }
  moat_error_free(&err);
}

void ctl_meter_begin(struct moat_control *c, struct live *e) {
  if (!c->meter || e->slot < 0)
    return;
  struct moat_store_meter_sample last = {0};
  bool have = false;
  load_totals(c, e, &last, &have);
  free(last.sandbox_id);
  free(last.org);
  struct moat_usage u = {0};
  moat_error *err = NULL;
  if (moat_host_usage(c->host, e->slot, &u, &err) < 0)
    moat_error_free(&err);
  e->meter.slot = e->slot;
  e->meter.at_ms = now_unix_ms();
  e->meter.at_ns = now_ns();
  e->meter.counter_ns = 0; /* a new cgroup: its whole counter is this sandbox's */
  e->meter.ws_bytes = u.working_set_bytes;
}

static void sample_locked(struct moat_control *c, struct live *e) {
  struct ctl_meter *m = c->meter;
  if (!m || e->slot < 0 || (e->state != MOAT_SB_RUNNING && e->state != MOAT_SB_PAUSED))
    return;
  struct moat_usage u;
  moat_error *err = NULL;
  if (moat_host_usage(c->host, e->slot, &u, &err) < 0) {
    moat_error_free(&err);
    return;
  }
  int64_t now = now_unix_ms();
  uint64_t mono = now_ns();
  /* the store orders a sandbox's samples by time: a clock stepped back must not put one before
   * its predecessor */
  if (now <= e->meter.last_ms)
    now = e->meter.last_ms + 1;
  if (e->meter.at_ms == 0 || e->meter.slot != e->slot) {
    /* no reading since the slot was bound here: adopted after a restart (or begun by a moatd
     * without metering) */
    struct moat_store_meter_sample last = {0};
    bool have = false;
    load_totals(c, e, &last, &have);
    if (!have && e->meter.loaded) {
      moat_error *e2 = NULL;
      have = moat_store_meter_last(c->store, e->id, &last, &e2) == 0;
      moat_error_free(&e2);
    }
    e->meter.counter_ns =
        have && last.slot == e->slot && last.cpu_counter_ns <= u.cpu_usage_ns ? last.cpu_counter_ns : 0;
    e->meter.slot = e->slot;
    e->meter.at_ms = now;
    e->meter.at_ns = mono;
    if (have && last.at_ms >= now)
      now = last.at_ms + 1;
    if (e->meter.counter_ns && last.at_ms < now) {
      /* the same cgroup since its last sample: it was alive all along (moatd was not); its memory
       * over the gap is charged at today's working set */
      uint64_t gap_ns = (uint64_t)(now - last.at_ms) * 1000000;
      e->meter.at_ns = mono > gap_ns ? mono - gap_ns : 0;
    }
    e->meter.ws_bytes = u.working_set_bytes;
    free(last.sandbox_id);
    free(last.org);
  }
  uint64_t d_cpu =
      u.cpu_usage_ns >= e->meter.counter_ns ? u.cpu_usage_ns - e->meter.counter_ns : u.cpu_usage_ns;
  int64_t dt = mono > e->meter.at_ns ? (int64_t)((mono - e->meter.at_ns) / 1000000) : 0;
  double d_mem = ((double)e->meter.ws_bytes + (double)u.working_set_bytes) / 2 / GIB * ((double)dt / 1000);
  e->meter.cpu_ns += d_cpu;
  e->meter.mem_gib_s += d_mem;
  e->meter.alive_ms += dt;
  e->meter.counter_ns = u.cpu_usage_ns;
  e->meter.ws_bytes = u.working_set_bytes;
  e->meter.at_ms = now;
  e->meter.at_ns += (uint64_t)dt * 1000000; /* the remainder below a ms counts next time */
  e->meter.last_ms = now;
  double pct = 0;
  if (dt > 0 && e->limits.cpu > 0)
    pct = (double)d_cpu / ((double)dt * 1e6 * e->limits.cpu) * 100;
  if (pct > 100)
    pct = 100;
  struct moat_store_meter_sample s = {.sandbox_id = xstrdup(e->id),
                                      .org = xstrdup(e->org),
                                      .at_ms = now,
                                      .slot = e->slot,
                                      .cpu_counter_ns = u.cpu_usage_ns,
                                      .cpu_ns = e->meter.cpu_ns,
                                      .mem_gib_s = e->meter.mem_gib_s,
                                      .alive_ms = e->meter.alive_ms,
                                      .cpu_pct = pct,
                                      .cpu_count = e->limits.cpu,
                                      .mem_used = u.working_set_bytes,
                                      .mem_limit = e->limits.memory_mb << 20,
                                      .disk_used = -1,
                                      .disk_total = -1,
                                      .net_rx = -1,
                                      .net_tx = -1};
  struct moat_disk_usage du;
  if (moat_host_disk_usage(c->host, e->slot, &du, NULL) == 0) {
    s.disk_used = (int64_t)du.used_bytes;
    s.disk_total = (int64_t)du.total_bytes;
  }
  int ns = moat_host_net_slot(c->host, e->slot);
  if (ns >= 0 && moat_host_net(c->host)) {
    json_t *j = moat_net_describe(moat_host_net(c->host), ns, NULL);
    json_t *bi = json_object_get(j, "bytes_in"), *bo = json_object_get(j, "bytes_out");
    if (json_is_integer(bi) && json_is_integer(bo)) {
      s.net_rx = json_integer_value(bi);
      s.net_tx = json_integer_value(bo);
    }
    json_decref(j);
  }
  queue(m, &s, d_cpu, d_mem);
}

void ctl_meter_sample(struct moat_control *c, struct live *e) { sample_locked(c, e); }

void ctl_meter_end(struct moat_control *c, struct live *e) {
  sample_locked(c, e);
  e->meter.at_ms = 0;
  e->meter.slot = -1;
}

/* One pass over every live sandbox; one that is busy (its mutex held) is read next time: its CPU
 * counter is cumulative and its memory integral spans the longer interval. */
static void sample_all(struct moat_control *c) {
  size_t n;
  struct live **v = live_all(c, NULL, SIZE_MAX, &n);
  for (size_t i = 0; i < n; i++) {
    if (pthread_mutex_trylock(&v[i]->m) == 0) {
      sample_locked(c, v[i]);
      pthread_mutex_unlock(&v[i]->m);
    }
    live_put(c, v[i]);
  }
  free(v);
}

static void flush(struct moat_control *c) {
  struct ctl_meter *m = c->meter;
  /* lock held on entry and on return */
  struct moat_store_meter_sample *batch = m->q;
  size_t n = m->n;
  uint64_t dropped = m->dropped;
  m->q = NULL;
  m->n = m->cap = 0;
  m->dropped = 0;
  m->writing = true;
  pthread_mutex_unlock(&m->lock);
  moat_error *e = NULL;
  if (n && moat_store_meter_add(c->store, batch, n, &e) < 0) {
    log_error("meter: %zu samples not recorded: %s", n, moat_error_msg(e));
    moat_error_free(&e);
  }
  if (dropped)
    log_error("meter: %llu samples dropped (more than %d waiting)", (unsigned long long)dropped,
              METER_MAX_QUEUED);
  moat_store_meter_samples_free(batch, n);
  pthread_mutex_lock(&m->lock);
  m->writing = false;
  if (m->n == 0)
    pthread_cond_broadcast(&m->idle);
}

static void *meter_main(void *arg) {
  struct moat_control *c = arg;
  struct ctl_meter *m = c->meter;
  int64_t next = now_unix_ms() + m->interval_ms;
  pthread_mutex_lock(&m->lock);
  while (!m->stop) {
    if (m->n == 0) {
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      int64_t wait = next - now_unix_ms();
      if (wait > 0) {
        ts.tv_sec += wait / 1000;
        ts.tv_nsec += (wait % 1000) * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
          ts.tv_sec++;
          ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&m->cond, &m->lock, &ts);
      }
    }
    if (m->stop)
      break;
    if (now_unix_ms() >= next) {
      pthread_mutex_unlock(&m->lock);
      sample_all(c);
      next = now_unix_ms() + m->interval_ms;
      pthread_mutex_lock(&m->lock);
    }
    if (m->n)
      flush(c);
  }
  pthread_mutex_unlock(&m->lock);
  return NULL;
}

int ctl_meter_open(struct moat_control *c, int interval_ms, unsigned retention_hours, moat_error **err) {
  if (interval_ms < 0)
    return 0;
  struct ctl_meter *m = xcalloc(1, sizeof(*m));
  pthread_mutex_init(&m->lock, NULL);
  pthread_cond_init(&m->cond, NULL);
  pthread_cond_init(&m->idle, NULL);
  m->interval_ms = interval_ms ? (unsigned)interval_ms : METER_DEFAULT_INTERVAL_MS;
  m->retention_ms = (int64_t)(retention_hours ? retention_hours : METER_DEFAULT_RETENTION_H) * 3600000LL;
  struct moat_store_meter_org *o = NULL;
  size_t no = 0;
  moat_error *e = NULL;
  if (moat_store_meter_org_totals(c->store, &o, &no, &e) < 0) {
    log_warn("meter: the orgs' totals: %s", moat_error_msg(e));
    moat_error_free(&e);
  }
  for (size_t i = 0; i < no; i++) {
    struct meter_org *s = org_slot(m, o[i].org);
    s->cpu_ns = o[i].cpu_ns;
    s->mem_gib_s = o[i].mem_gib_s;
    free(o[i].org);
  }
  free(o);
  c->meter = m;
  int rc = pthread_create(&m->thread, NULL, meter_main, c);
  if (rc != 0) {
    c->meter = NULL;
    errno = rc;
    return moat_error_errno(err, "meter: thread");
  }
  return 0;
}

void ctl_meter_close(struct moat_control *c) {
  struct ctl_meter *m = c->meter;
  if (!m)
    return;
  pthread_mutex_lock(&m->lock);
  m->stop = true;
  pthread_cond_signal(&m->cond);
  pthread_mutex_unlock(&m->lock);
  pthread_join(m->thread, NULL);
  /* the sandboxes outlive moatd: their last interval is recorded now (one still busy is not waited
   * for: the next moatd goes on from its CPU counter) */
  for (size_t b = 0; b < NBUCKETS; b++)
    for (struct live *e = c->buckets[b]; e; e = e->next) {
      if (pthread_mutex_trylock(&e->m) != 0)
        continue;
      sample_locked(c, e);
      pthread_mutex_unlock(&e->m);
    }
  pthread_mutex_lock(&m->lock);
  if (m->n)
    flush(c);
  pthread_mutex_unlock(&m->lock);
  c->meter = NULL;
  for (size_t i = 0; i < m->n_orgs; i++)
    free(m->orgs[i].org);
  free(m->orgs);
  pthread_mutex_destroy(&m->lock);
  pthread_cond_destroy(&m->cond);
  pthread_cond_destroy(&m->idle);
  free(m);
}

/* What was queued before the call is written first. */
static void meter_sync(struct moat_control *c) {
  struct ctl_meter *m = c->meter;
  if (!m)
    return;
  pthread_mutex_lock(&m->lock);
  while (m->n > 0 || m->writing)
    pthread_cond_wait(&m->idle, &m->lock);
  pthread_mutex_unlock(&m->lock);
}

void ctl_meter_reap(struct moat_control *c, int64_t now_ms) {
  struct ctl_meter *m = c->meter;
  if (!m || now_ms - m->pruned_ms < METER_PRUNE_EVERY_MS)
    return;
  m->pruned_ms = now_ms;
  moat_error *e = NULL;
  int n = moat_store_meter_prune(c->store, now_ms - m->retention_ms, now_ms - METER_HOURLY_KEEP_MS, &e);
  if (n < 0) {
    log_warn("meter: prune: %s", moat_error_msg(e));
    moat_error_free(&e);
  } else if (n > 0) {
    log_debug("meter: removed %d samples older than %lld hours", n, (long long)(m->retention_ms / 3600000));
  }
}

int64_t moat_control_metrics_retention_ms(const struct moat_control *c) {
  return c->meter ? c->meter->retention_ms : METER_DEFAULT_RETENTION_H * 3600000LL;
}

bool moat_control_meter_org_totals(struct moat_control *c, const char *org, double *cpu_seconds,
                                   double *memory_gib_seconds) {
  struct ctl_meter *m = c->meter;
  *cpu_seconds = *memory_gib_seconds = 0;
  if (!m)
    return false;
  pthread_mutex_lock(&m->lock);
  for (size_t i = 0; i < m->n_orgs; i++)
    if (strcmp(m->orgs[i].org, org) == 0) {
      *cpu_seconds = (double)m->orgs[i].cpu_ns / 1e9;
      *memory_gib_seconds = m->orgs[i].mem_gib_s;
    }
  pthread_mutex_unlock(&m->lock);
  return true;
}

void moat_usage_rows_free(struct moat_usage_row *v, size_t n) {
  for (size_t i = 0; v && i < n; i++) {
    free(v[i].key);
    free(v[i].series);
  }
  free(v);
}

/* Adds the sandbox's buckets (in order) to the row's series (in order). */
static void series_add(struct moat_usage_row *r, const struct moat_store_meter_bucket *b, size_t nb) {
  if (!nb)
    return;
  struct moat_usage_point *v = xcalloc(r->n_series + nb, sizeof(*v));
  size_t i = 0, j = 0, n = 0;
  while (i < r->n_series || j < nb) {
    if (j == nb || (i < r->n_series && r->series[i].start_ms < b[j].start_ms)) {
      v[n++] = r->series[i++];
      continue;
    }
    if (i == r->n_series || b[j].start_ms < r->series[i].start_ms)
      v[n] = (struct moat_usage_point){.start_ms = b[j].start_ms};
    else
      v[n] = r->series[i++];
    v[n].cpu_seconds += (double)b[j].cpu_ns / 1e9;
    v[n].memory_gib_seconds += b[j].mem_gib_s;
    v[n].sandbox_seconds += (double)b[j].alive_ms / 1000;
    n++;
    j++;
  }
  free(r->series);
  r->series = v;
  r->n_series = n;
}

/* The group key of u (a copy, or NULL for the sandboxes without one). */
static char *group_key(const struct moat_store_meter_use *u, const char *org, enum moat_usage_group g,
                       const char *meta_key) {
  switch (g) {
  case MOAT_USAGE_BY_SANDBOX:
    return xstrdup(u->sandbox_id);
  case MOAT_USAGE_BY_ORG:
    return xstrdup(org);
  case MOAT_USAGE_BY_TEMPLATE:
    return u->template_name ? xstrdup(u->template_name) : NULL;
  case MOAT_USAGE_BY_METADATA:
    break;
  }
  if (!u->metadata_json)
    return NULL;
  json_t *md = json_loads(u->metadata_json, 0, NULL);
  json_t *v = json_object_get(md, meta_key);
  char *out = NULL;
  if (json_is_string(v))
    out = xstrdup(json_string_value(v));
  else if (v && !json_is_null(v))
    out = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
  json_decref(md);
  return out;
}

static int by_cpu_desc(const void *a, const void *b) {
  const struct moat_usage_row *x = a, *y = b;
  return x->cpu_seconds < y->cpu_seconds ? 1 : x->cpu_seconds > y->cpu_seconds ? -1 : 0;
}

int moat_control_usage_query(struct moat_control *c, const char *org, int64_t from_ms, int64_t to_ms,
                             enum moat_usage_group g, const char *meta_key, int64_t bucket_ms,
                             struct moat_usage_row **out, size_t *n, moat_error **err) {
  *out = NULL;
  *n = 0;
  meter_sync(c);
  struct moat_store_meter_use *u = NULL;
  size_t nu = 0;
  if ((bucket_ms > 0 ? moat_store_meter_usage_series(c->store, org, from_ms, to_ms, bucket_ms, &u, &nu, err)
                     : moat_store_meter_usage(c->store, org, from_ms, to_ms, &u, &nu, err)) < 0)
    return -1;
  struct moat_usage_row *v = nu ? xcalloc(nu, sizeof(*v)) : NULL;
  size_t len = 0;
  for (size_t i = 0; i < nu; i++) {
    if (u[i].cpu_ns == 0 && u[i].mem_gib_s == 0 && u[i].alive_ms == 0)
      continue; /* sampled in the range's first hour, but before from */
    char *k = group_key(&u[i], org, g, meta_key);
    size_t j = 0;
    if (g != MOAT_USAGE_BY_SANDBOX)
      for (; j < len; j++)
        if ((!k && !v[j].key) || (k && v[j].key && strcmp(k, v[j].key) == 0))
          break;
    if (g == MOAT_USAGE_BY_SANDBOX || j == len) {
      j = len++;
      v[j].key = k;
    } else {
      free(k);
    }
    v[j].cpu_seconds += (double)u[i].cpu_ns / 1e9;
    v[j].memory_gib_seconds += u[i].mem_gib_s;
    v[j].sandbox_seconds += (double)u[i].alive_ms / 1000;
    series_add(&v[j], u[i].buckets, u[i].n_buckets);
  }
  moat_store_meter_uses_free(u, nu);
  if (len > 1)
    qsort(v, len, sizeof(*v), by_cpu_desc);
  *out = v;
  *n = len;
  return 0;
}

int moat_control_metrics_series(struct moat_control *c, const char *org, const char *id, int64_t from_ms,
                                int64_t to_ms, unsigned limit, struct moat_store_meter_sample **out,
                                size_t *n, moat_error **err) {
  *out = NULL;
  *n = 0;
  struct moat_store_sandbox r = {0};
  if (moat_store_sandbox_get(c->store, org, id, &r, err) < 0)
    return -1;
  moat_store_sandbox_clear(&r);
  meter_sync(c);
  return moat_store_meter_series(c->store, org, id, from_ms, to_ms, limit, out, n, err);
}

/* control.c -- the sandbox state machine (control.h): create, get, list, update, kill, guest access,
 * API keys, crash recovery at open and the TTL / dead-init reaper
 *
 * Locking: c->lock guards only the table of live sandboxes (lookups and reference counts); it is
 * never held across the store, the host or the guest. Each live sandbox has its own mutex, held
 * across its state transitions (create, kill, patch, TTL refresh) so that they serialise per
 * sandbox while creates and execs of different sandboxes run in parallel. An exec holds a
 * reference, never the sandbox mutex, while the command runs: a kill racing it tears the sandbox
 * down and the exec fails with a connection error.
 */
#include "control.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../common/assert.h"
#include "../common/crashpoint.h"
#include "../common/log.h"
#include "../common/sha256.h"
#include "../common/util.h"
#include "../store/store.h"
#include "../host/images.h"
#include "control_internal.h"
#include "spec.h"

static const char *const state_names[] = {"creating", "running", "paused", "hibernated", "killed"};

const char *moat_sandbox_state_name(enum moat_sandbox_state s) {
  return (unsigned)s < ARRAY_SIZE(state_names) ? state_names[s] : "unknown";
}

int moat_sandbox_state_parse(const char *name, enum moat_sandbox_state *out) {
  for (size_t i = 0; name && i < ARRAY_SIZE(state_names); i++)
    if (strcmp(name, state_names[i]) == 0) {
      *out = (enum moat_sandbox_state)i;
      return 0;
    }
  return -1;
}

void moat_sandbox_info_clear(struct moat_sandbox_info *s) {
  if (!s)
    return;
  free(s->org);
  free(s->template_name);
  json_decref(s->metadata);
  json_decref(s->env);
  free(s->killed_reason);
  free(s->forked_from);
  free(s->from_snapshot);
  for (size_t i = 0; i < s->n_volumes; i++) {
    free(s->volumes[i].name);
    free(s->volumes[i].path);
  }
  free(s->volumes);
  memset(s, 0, sizeof(*s));
}

void moat_sandbox_infos_free(struct moat_sandbox_info *v, size_t n) {
  for (size_t i = 0; v && i < n; i++)
    moat_sandbox_info_clear(&v[i]);
  free(v);
}

/* ---- the table of live sandboxes ---- */

static unsigned bucket_of(const char *id) {
  unsigned h = 2166136261u;
  for (const char *p = id; *p; p++)
    h = (h ^ (unsigned char)*p) * 16777619u;
  return h % NBUCKETS;
}

static void live_free(struct live *e) {
  free(e->org);
  memset(&e->guest, 0, sizeof(e->guest));
  free(e->template_name);
  json_decref(e->env);
  pthread_mutex_destroy(&e->m);
  free(e);
}

/* Returns the live sandbox id with a reference taken, or NULL. */
struct live *live_get(struct moat_control *c, const char *id) {
  if (strlen(id) > MOAT_ID_LEN)
    return NULL;
  pthread_mutex_lock(&c->lock);
  struct live *e = c->buckets[bucket_of(id)];
  while (e && strcmp(e->id, id) != 0)
    e = e->next;
  if (e)
    e->refs++;
  pthread_mutex_unlock(&c->lock);
  return e;
}

void live_put(struct moat_control *c, struct live *e) {
  pthread_mutex_lock(&c->lock);
  moat_assert(e->refs > 0, "live_put of sandbox %s holding no reference", e->id);
  bool last = --e->refs == 0;
  pthread_mutex_unlock(&c->lock);
  if (last)
    live_free(e);
}

struct live **live_all(struct moat_control *c, const char *org, size_t max, size_t *n) {
  size_t cnt = 0, cap = 64;
  struct live **v = xmalloc(cap * sizeof(*v));
  pthread_mutex_lock(&c->lock);
  for (size_t b = 0; b < NBUCKETS && cnt < max; b++)
    for (struct live *e = c->buckets[b]; e && cnt < max; e = e->next) {
      if (org && strcmp(e->org, org) != 0)
        continue;
      if (cnt == cap) {
        cap *= 2;
        v = xrealloc(v, cap * sizeof(*v));
      }
      e->refs++;
      v[cnt++] = e;
    }
  pthread_mutex_unlock(&c->lock);
  *n = cnt;
  return v;
}

/* Adds e (refs = 1 for the table) to the table. */
void live_add_locked(struct moat_control *c, struct live *e) {
  unsigned b = bucket_of(e->id);
  e->next = c->buckets[b];
  c->buckets[b] = e;
  e->refs++;
  e->in_table = true;
  e->counted = e->state != MOAT_SB_HIBERNATED && e->state != MOAT_SB_KILLED;
}

void live_each_locked(struct moat_control *c, void (*fn)(struct live *e, void *arg), void *arg) {
  for (unsigned b = 0; b < NBUCKETS; b++)
    for (struct live *e = c->buckets[b]; e; e = e->next)
      fn(e, arg);
}

void live_add(struct moat_control *c, struct live *e) {
  pthread_mutex_lock(&c->lock);
  live_add_locked(c, e);
  pthread_mutex_unlock(&c->lock);
}

/* Removes e from the table and drops the table's reference (the caller still holds one). */
void live_remove(struct moat_control *c, struct live *e) {
  pthread_mutex_lock(&c->lock);
  if (e->in_table) {
    struct live **pp = &c->buckets[bucket_of(e->id)];
    while (*pp && *pp != e)
      pp = &(*pp)->next;
    if (*pp)
      *pp = e->next;
    e->in_table = false;
    moat_assert(e->refs > 1, "live_remove of sandbox %s by a caller holding no reference", e->id);
    e->refs--; /* never the last: the caller holds one */
  }
  pthread_mutex_unlock(&c->lock);
}

void ctl_set_guest(struct live *e, const struct moat_instance *inst) {
  e->guest = inst->guest;
  snprintf(e->guest.id, sizeof(e->guest.id), "%s", e->id);
  ctl_oom_reset(e, true); /* a new slot's cgroup is new */
}

struct live *live_new(const char *id, const char *org) {
  struct live *e = xcalloc(1, sizeof(*e));
  snprintf(e->id, sizeof(e->id), "%s", id);
  e->org = xstrdup(org);
  e->refs = 1; /* the creator's */
  e->slot = -1;
  ctl_oom_reset(e, false);
  pthread_mutex_init(&e->m, NULL);
  return e;
}

/* ---- store rows to sandbox infos ---- */

json_t *parse_object(const char *text) {
  json_t *j = text ? json_loads(text, 0, NULL) : NULL;
  if (!json_is_object(j)) {
    json_decref(j);
    j = json_object();
  }
  return j;
}

char *dump_object(json_t *j) {
  if (!j)
    return xstrdup("{}");
  char *s = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
  if (!s)
    abort();
  return s;
}

void info_from_row(struct moat_control *c, const struct moat_store_sandbox *r,
                   struct moat_sandbox_info *out) {
  memset(out, 0, sizeof(*out));
  snprintf(out->id, sizeof(out->id), "%s", r->id);
  out->org = xstrdup(r->org);
  out->template_name = ctl_template_display(r->template_name);
  if (moat_sandbox_state_parse(r->state, &out->state) < 0)
    out->state = MOAT_SB_KILLED;
  out->created_at_ms = r->created_at_ms;
  out->expires_at_ms = r->persistent ? 0 : r->expires_at_ms;
  out->ttl_seconds = r->ttl_seconds;
  out->persistent = r->persistent;
  out->metadata = parse_object(r->metadata_json);
  out->env = parse_object(r->env_json);
  out->limits.cpu = r->cpu;
  out->limits.memory_mb = r->memory_mb;
  out->limits.pids = r->pids;
  out->limits.disk_mb = r->disk_mb;
  out->killed_reason = r->killed_reason ? xstrdup(r->killed_reason) : NULL;
  out->killed_at_ms = r->killed_at_ms;
  out->ready_us = r->ready_us;
  out->forked_from = r->forked_from ? xstrdup(r->forked_from) : NULL;
  out->from_snapshot = r->from_snapshot ? xstrdup(r->from_snapshot) : NULL;
  out->hibernate_after_seconds = r->hibernate_after_s;
  out->paused_at_ms = r->paused_at_ms;
  ctl_volumes_of(c, r->id, out);
  /* The store's expiry lags the live one by up to a second (see refresh_ttl). */
  if (out->state != MOAT_SB_KILLED && !out->persistent) {
    struct live *e = live_get(c, r->id);
    if (e) {
      int64_t x = __atomic_load_n(&e->expires_at_ms, __ATOMIC_RELAXED);
      if (x > out->expires_at_ms)
        out->expires_at_ms = x;
      live_put(c, e);
    }
  }
}

/* ---- kill ---- */

/* Tears down e (its mutex held; state not killed), records it killed with reason and removes it
 * from the table. A teardown error is logged: the sandbox is recorded killed all the same, and
 * the next start's reconcile removes what is left of its slot. */
int kill_locked(struct moat_control *c, struct live *e, const char *reason, moat_error **out) {
  moat_error *err = NULL;
  int ret = 0;
  ctl_meter_end(c, e);
  if (e->slot >= 0 && moat_host_destroy(c->host, e->slot, &err) < 0) {
    log_error("kill %s: destroy slot %d: %s", e->id, e->slot, moat_error_msg(err));
    moat_error_free(&err);
  }
  if (e->state == MOAT_SB_HIBERNATED)
    tt_forget_hibernated(c, e->id);
  tt_drop_fork_image(c, e);
  ctl_net_forget(c, e->id);
  if (moat_store_sandbox_transition(c->store, e->id, NULL, "killed", reason, &err) < 0) {
    log_error("kill %s: record: %s", e->id, moat_error_msg(err));
    ret = moat_error_set(out, err->status, "sandbox %s is gone, but recording it killed failed: %s", e->id,
                         moat_error_msg(err));
    moat_error_free(&err);
  }
  log_info("sandbox %s killed (%s)", e->id, reason);
  e->state = MOAT_SB_KILLED;
  e->slot = -1;
  live_remove(c, e);
  return ret;
}

/* The error for a sandbox of org that is not live: ENOENT, naming the kill reason if killed. */
int not_live_error(struct moat_control *c, const char *org, const char *id, moat_error **err) {
  struct moat_store_sandbox r = {0};
  moat_error *e2 = NULL;
  if (moat_store_sandbox_get(c->store, org, id, &r, &e2) < 0) {
    int st = e2->status;
    moat_error_free(&e2);
    if (st == ENOENT)
      return moat_error_set(err, ENOENT, "no sandbox %s", id);
    return moat_error_set(err, st, "sandbox %s: store error", id);
  }
  int ret;
  if (strcmp(r.state, "killed") == 0)
    ret = moat_error_set(err, ENOENT, "sandbox %s was killed (%s)", id,
                         r.killed_reason ? r.killed_reason : "?");
  else
    ret = moat_error_set(err, EBUSY, "sandbox %s is %s", id, r.state);
  moat_store_sandbox_clear(&r);
  return ret;
}

int moat_control_kill(struct moat_control *c, const char *org, const char *id, const char *reason,
                      moat_error **err) {
  struct live *e = live_get(c, id);
  if (e && strcmp(e->org, org) != 0) {
    live_put(c, e);
    return moat_error_set(err, ENOENT, "no sandbox %s", id);
  }
  if (!e) {
    /* Not live: killed already (ENOENT), or a row this moatd holds no live entry for: it is
     * recorded killed, and a hibernated image it may have left is removed. */
    struct moat_store_sandbox r = {0};
    if (moat_store_sandbox_get(c->store, org, id, &r, err) < 0)
      return -1;
    bool killed = strcmp(r.state, "killed") == 0;
    moat_store_sandbox_clear(&r);
    if (killed)
      return moat_error_set(err, ENOENT, "no sandbox %s (already killed)", id);
    if (moat_store_sandbox_transition(c->store, id, NULL, "killed", reason, err) < 0)
      return moat_error_wrap(err, "kill %s", id);
    tt_forget_hibernated(c, id);
    return 0;
  }
  pthread_mutex_lock(&e->m);
  int ret = 0;
  if (e->state == MOAT_SB_KILLED)
    ret = moat_error_set(err, ENOENT, "no sandbox %s (already killed)", id);
  else
    ret = kill_locked(c, e, reason ? reason : "api", err);
  pthread_mutex_unlock(&e->m);
  live_put(c, e);
  return ret;
}

/* ---- create ---- */

int moat_control_create(struct moat_control *c, const char *org, const struct moat_sandbox_spec *spec,
                        struct moat_sandbox_info *out, moat_error **err) {
  if (spec->hibernate_after_seconds < 0 || spec->hibernate_after_seconds > MOAT_MAX_TTL_S)
    return moat_error_set(err, EINVAL, "idle.hibernate_after_seconds: must be between 1 and %lld",
                          (long long)MOAT_MAX_TTL_S);
  if (spec->hibernate_after_seconds > 0 && !spec->persistent)
    return moat_error_set(err, EINVAL, "idle.hibernate_after_seconds needs persistent: true");
  if (moat_volume_mounts_check(spec->volumes, spec->n_volumes, err) < 0)
    return -1;
  if (spec->n_volumes && spec->from_snapshot)
    return moat_error_set(
        err, EINVAL,
        "volumes cannot be used with from_snapshot (a restore from a snapshot mounts no volume)");
  /* the databases' URLs go over the create's env */
  _cleanup_json_ json_t *db_env = NULL;
  struct moat_sandbox_spec with_dbs;
  if (spec->n_databases) {
    if (!(db_env = ctl_databases_env(c, org, spec, err)))
      return -1;
    with_dbs = *spec;
    with_dbs.env = db_env;
    spec = &with_dbs;
  }
  if (spec->from_snapshot)
    return tt_create_from_snapshot(c, org, spec, out, err);
  const char *tmpl = spec->template_name ? spec->template_name : "base";
  struct moat_store_db_attachment dbs[MOAT_MAX_SANDBOX_DATABASES];
  for (size_t i = 0; i < spec->n_databases; i++)
    dbs[i] = (struct moat_store_db_attachment){.env = (char *)spec->databases[i].env,
                                               .database_id = (char *)spec->databases[i].id};
  struct ctl_new n = {
      .template_name = tmpl,
      .persistent = spec->persistent,
      .metadata = spec->metadata,
      .env = spec->env,
      .hibernate_after_s = spec->hibernate_after_seconds,
      .network = spec->network,
      .volumes = spec->volumes,
      .n_volumes = spec->n_volumes,
      .databases = dbs,
      .n_databases = spec->n_databases,
  };
  if (spec->network && moat_control_network_check(c, spec->network, err) < 0)
    return -1;
  if (ctl_volumes_precheck(c, org, spec->volumes, spec->n_volumes, err) < 0)
    return -1;
  if (moat_spec_resolve(spec, &c->bounds, &n.limits, &n.ttl_seconds, err) < 0)
    return -1;
  _cleanup_free_ char *column = NULL;
  _cleanup_json_ json_t *config = NULL, *env = NULL;
  pthread_rwlock_rdlock(&c->images_lock);
  if (ctl_template_resolve(c, org, tmpl, &column, &config, err) < 0) {
    pthread_rwlock_unlock(&c->images_lock);
    return -1;
  }
  n.template_name = column;
  if (config)
    n.env = env = ctl_template_env(config, spec->env);
  /* the template's start state, baked by an earlier create, when this one asks for nothing it
   * depends on */
  bool plain = (!spec->env || json_object_size(spec->env) == 0) && !spec->network && !spec->n_volumes;
  _cleanup_free_ char *baked = config && plain ? ctl_template_bake_path(c, org, column, config) : NULL;
  char id[MOAT_ID_LEN + 1];
  if (baked && moat_image_dir_exists(baked)) {
    n.restore_dir = baked;
    moat_error *berr = NULL;
    int brc = ctl_create(c, org, &n, id, out, &berr);
    if (brc == 0) {
      pthread_rwlock_unlock(&c->images_lock);
      return 0;
    }
    log_warn("template %s: restore its start state %s: %s; starting it instead", tmpl, baked,
             moat_error_msg(berr));
    moat_error_free(&berr);
    n.restore_dir = NULL;
  }
  int rc = ctl_create(c, org, &n, id, config ? NULL : out, err);
  pthread_rwlock_unlock(&c->images_lock);
  if (rc < 0 || !config)
    return rc;
  if (ctl_template_start(c, org, id, config, err) < 0) {
    moat_error *kerr = NULL;
    if (moat_control_kill(c, org, id, "error", &kerr) < 0)
      moat_error_free(&kerr);
    return moat_error_wrap(err, "sandbox %s of template %s", id, tmpl);
  }
  if (baked && !moat_image_dir_exists(baked))
    ctl_template_bake(c, org, id, column, baked);
  return out ? moat_control_get(c, org, id, out, err) : 0;
}

int ctl_create(struct moat_control *c, const char *org, const struct ctl_new *n, char *id_out,
               struct moat_sandbox_info *out, moat_error **err) {
  uint64_t t0 = now_ns();
  const char *tmpl = n->template_name;
  struct moat_limits limits = n->limits;
  int64_t ttl = n->ttl_seconds;

  char id[MOAT_ID_LEN + 1] = "sb-";
  random_id(id + 3, MOAT_ID_LEN - 3);
  if (id_out)
    snprintf(id_out, MOAT_ID_LEN + 1, "%s", id);
  _cleanup_free_ char *meta = dump_object(n->metadata);
  _cleanup_free_ char *env = dump_object(n->env);
  struct moat_store_sandbox row = {
      .id = id,
      .org = (char *)org,
      .template_name = (char *)tmpl,
      .state = (char *)"creating",
      .created_at_ms = now_unix_ms(),
      .ttl_seconds = ttl,
      .persistent = n->persistent,
      .metadata_json = meta,
      .env_json = env,
      .cpu = limits.cpu,
      .memory_mb = limits.memory_mb,
      .pids = limits.pids,
      .disk_mb = limits.disk_mb,
      .slot = -1,
      .forked_from = (char *)n->forked_from,
      .from_snapshot = (char *)n->from_snapshot,
      .hibernate_after_s = n->hibernate_after_s,
  };

  struct moat_quotas quotas;
  if (ctl_quotas_load(c, org, &quotas, err) < 0)
    return -1;
  if (quotas.v[MOAT_Q_TTL_SECONDS] >= 0 && !n->persistent && ttl > quotas.v[MOAT_Q_TTL_SECONDS])
    return moat_error_set(err, MOAT_E_QUOTA, "over quota max_ttl_seconds: limit %lld, use %lld",
                          (long long)quotas.v[MOAT_Q_TTL_SECONDS], (long long)ttl);

  struct live *e = live_new(id, org);
  e->state = MOAT_SB_CREATING;
  e->env = n->env ? json_deep_copy(n->env) : json_object();
  e->ttl_seconds = ttl;
  e->persistent = n->persistent;
  e->template_name = xstrdup(tmpl);
  e->limits = limits;
  e->hibernate_after_s = n->hibernate_after_s;
  e->last_api_ms = now_unix_ms();
  pthread_mutex_lock(&e->m); /* a kill or exec of this id waits until the create is done */
  /* the quotas' check and reservation, before anything slow */
  if (ctl_live_admit(c, e, &quotas, err) < 0) {
    pthread_mutex_unlock(&e->m);
    live_put(c, e);
    return -1;
  }

  if (moat_store_sandbox_insert(c->store, &row, n->forked_from ? "fork" : "api", err) < 0) {
    moat_error_wrap(err, "create sandbox");
    e->state = MOAT_SB_KILLED;
    ctl_live_unadmit(c, e);
    live_remove(c, e);
    pthread_mutex_unlock(&e->m);
    live_put(c, e);
    return -1;
  }

  struct moat_instance inst;
  memset(&inst, 0, sizeof(inst));
  /* volumes are claimed once the row exists: a claim is live while its sandbox's row is */
  int rc = n->n_volumes ? ctl_volumes_claim(c, org, id, n->volumes, n->n_volumes, err) : 0;
  if (rc == 0 && n->n_databases) {
    struct moat_store_db_attachment *att = xcalloc(n->n_databases, sizeof(*att));
    for (size_t i = 0; i < n->n_databases; i++) {
      att[i] = n->databases[i];
      att[i].sandbox_id = id;
    }
    rc = moat_store_db_attach(c->store, att, n->n_databases, err);
    free(att);
  }
  bool claimed = rc == 0;
  if (claimed)
    rc = n->restore_dir ? moat_host_restore(c->host, n->restore_dir, ctl_image_of(tmpl), &limits,
                                            n->forked_from ? MOAT_RESTORE_VOLUMES_RO : 0, &inst, err)
                        : moat_host_create(c->host, ctl_image_of(tmpl), &limits, &inst, err);
  uint64_t ready_us = (now_ns() - t0) / 1000;
  if (rc < 0) {
    /* The spec was validated above: a host failure is ours (500), unless it says "no capacity"
     * (EAGAIN: 503), "out of disk" (ENOSPC: 507) or "no checkpoints here". */
    if (!claimed)
      ; /* the claim's own error: the volume is missing or held */
    else if (err && *err && (*err)->status == ENOSYS)
      (*err)->status = MOAT_E_NO_CHECKPOINTS;
    else if (err && *err && (*err)->status == EROFS && n->forked_from)
      (*err)->status = MOAT_E_VOLUME_ATTACHED;
    else if (err && *err && (*err)->status != EAGAIN && (*err)->status != ENOSPC)
      (*err)->status = EIO;
    if (claimed && err && *err && (*err)->status == MOAT_E_VOLUME_ATTACHED)
      moat_error_wrap(err,
                      "a process of sandbox %s holds a file of a volume open for writing, and a fork's "
                      "children mount its volumes read-only",
                      n->forked_from);
    else if (claimed)
      moat_error_wrap(err, "%s sandbox", n->restore_dir ? "restore" : "create");
    log_warn("create %s failed: %s", id, moat_error_msg(*err));
    moat_error *e2 = NULL;
    if (moat_store_sandbox_transition(c->store, id, "creating", "killed", "error", &e2) < 0) {
      log_error("create %s: record failure: %s", id, moat_error_msg(e2));
      moat_error_free(&e2);
    }
    e->state = MOAT_SB_KILLED;
    ctl_live_unadmit(c, e);
    live_remove(c, e);
    pthread_mutex_unlock(&e->m);
    live_put(c, e);
    return -1;
  }

  moat_crash_point("create.started");
  int64_t expires = n->persistent ? 0 : now_unix_ms() + ttl * 1000;
  e->slot = inst.slot;
  e->pid = inst.pid;
  e->start_time = inst.start_time;
  ctl_set_guest(e, &inst);
  /* a restore mounted the checkpoint's volumes (read-only for a fork's child) */
  if ((n->n_volumes && !n->restore_dir && ctl_volumes_attach(c, id, inst.slot, err) < 0) ||
      ctl_net_bind(c, id, org, inst.slot, n->network, n->forked_from, err) < 0 ||
      moat_store_sandbox_set_running(c->store, id, inst.slot, inst.pid, inst.start_time, ready_us, expires,
                                     err) < 0) {
    moat_error_wrap(err, "create sandbox");
    ctl_live_unadmit(c, e);
    kill_locked(c, e, "error", NULL);
    pthread_mutex_unlock(&e->m);
    live_put(c, e);
    return -1;
  }
  moat_crash_point("create.recorded");
  e->state = MOAT_SB_RUNNING;
  e->meter.loaded = true; /* a new sandbox: no totals recorded yet */
  ctl_meter_begin(c, e);
  e->db_expires_at_ms = expires;
  __atomic_store_n(&e->expires_at_ms, expires, __ATOMIC_RELAXED);
  pthread_mutex_unlock(&e->m);
  live_put(c, e);
  log_info("sandbox %s created for %s: template %s, slot %d, %s, ready in %llu us", id, org, tmpl, inst.slot,
           n->restore_dir   ? "restored"
           : inst.from_pool ? "warm shell"
                            : "cold",
           (unsigned long long)ready_us);
  if (!out)
    return 0;
  return moat_control_get(c, org, id, out, err);
}

/* ---- get, list, update ---- */

int moat_control_get(struct moat_control *c, const char *org, const char *id, struct moat_sandbox_info *out,
                     moat_error **err) {
  struct moat_store_sandbox r = {0};
  if (moat_store_sandbox_get(c->store, org, id, &r, err) < 0)
    return -1;
  info_from_row(c, &r, out);
  moat_store_sandbox_clear(&r);
  return 0;
}

int moat_control_list_page(struct moat_control *c, const char *org, const enum moat_sandbox_state *state,
                           json_t *meta, const char *template_name, const struct moat_store_page *page,
                           struct moat_sandbox_info **out, size_t *n, size_t *total, bool *more,
                           moat_error **err) {
  if (meta && !json_is_object(meta))
    return moat_error_set(err, EINVAL, "metadata filter must be an object");
  struct moat_store_filter f = {.org = org,
                                .state = state ? moat_sandbox_state_name(*state) : NULL,
                                .metadata = meta,
                                .template_name = template_name};
  struct moat_store_sandbox *rows;
  size_t nr;
  if (moat_store_sandbox_page(c->store, &f, page, &rows, &nr, total, more, err) < 0)
    return -1;
  struct moat_sandbox_info *v = nr ? xcalloc(nr, sizeof(*v)) : NULL;
  for (size_t i = 0; i < nr; i++)
    info_from_row(c, &rows[i], &v[i]);
  moat_store_sandboxes_free(rows, nr);
  *out = v;
  *n = nr;
  return 0;
}

int moat_control_list(struct moat_control *c, const char *org, const enum moat_sandbox_state *state,
                      json_t *meta, struct moat_sandbox_info **out, size_t *n, moat_error **err) {
  return moat_control_list_page(c, org, state, meta, NULL, NULL, out, n, NULL, NULL, err);
}

int moat_control_update(struct moat_control *c, const char *org, const char *id,
                        const struct moat_sandbox_patch *patch, struct moat_sandbox_info *out,
                        moat_error **err) {
  if (patch->has_ttl && (patch->ttl_seconds < 1 || patch->ttl_seconds > MOAT_MAX_TTL_S))
    return moat_error_set(err, EINVAL, "ttl_seconds: must be between 1 and %lld", (long long)MOAT_MAX_TTL_S);
  if (moat_spec_check_metadata(patch->metadata, err) < 0)
    return -1;
  if (patch->metadata && !json_is_object(patch->metadata))
    return moat_error_set(err, EINVAL, "metadata: must be an object");
  if (patch->has_ttl && moat_control_quota_check(c, org, MOAT_Q_TTL_SECONDS, patch->ttl_seconds, 0, err) < 0)
    return -1;

  struct moat_store_sandbox r = {0};
  if (moat_store_sandbox_get(c->store, org, id, &r, err) < 0)
    return -1;
  bool killed = strcmp(r.state, "killed") == 0;
  int64_t ttl = r.ttl_seconds;
  bool persistent = r.persistent;
  moat_store_sandbox_clear(&r);
  if (killed)
    return moat_error_set(err, ENOENT, "no sandbox %s (killed)", id);

  struct live *e = live_get(c, id);
  if (e)
    pthread_mutex_lock(&e->m);
  if (e && e->state == MOAT_SB_KILLED) {
    pthread_mutex_unlock(&e->m);
    live_put(c, e);
    return moat_error_set(err, ENOENT, "no sandbox %s (killed)", id);
  }
  if (e) {
    ttl = e->ttl_seconds;
    persistent = e->persistent;
  }
  bool was_persistent = persistent;
  if (patch->has_ttl)
    ttl = patch->ttl_seconds;
  if (patch->has_persistent)
    persistent = patch->persistent;
  _cleanup_free_ char *meta = patch->metadata ? dump_object(patch->metadata) : NULL;
  struct moat_store_patch p = {
      .set_ttl = patch->has_ttl,
      .ttl_seconds = ttl,
      .set_persistent = patch->has_persistent,
      .persistent = persistent,
      .metadata_json = meta,
  };
  /* The expiry restarts from now when the TTL changes or persistence ends; 0 while persistent. */
  if (persistent) {
    p.set_expires = true;
    p.expires_at_ms = 0;
  } else if (patch->has_ttl || was_persistent) {
    p.set_expires = true;
    p.expires_at_ms = now_unix_ms() + ttl * 1000;
  }
  /* A new expiry of a paused or hibernated sandbox counts from now: its pause clock restarts too, so
   * that the resume does not add the time paused before the change. */
  bool stopped = e && (e->state == MOAT_SB_PAUSED || e->state == MOAT_SB_HIBERNATED);
  int64_t now = now_unix_ms();
  if (stopped && p.set_expires) {
    p.set_paused_at = true;
    p.paused_at_ms = now;
  }
  int ret = moat_store_sandbox_patch(c->store, id, &p, err);
  if (ret == 0 && stopped && p.set_expires)
    e->paused_at_ms = now;
  if (ret == 0 && e) {
    e->ttl_seconds = ttl;
    e->persistent = persistent;
    if (p.set_expires) {
      e->db_expires_at_ms = p.expires_at_ms;
      __atomic_store_n(&e->expires_at_ms, p.expires_at_ms, __ATOMIC_RELAXED);
    }
  }
  if (e) {
    pthread_mutex_unlock(&e->m);
    live_put(c, e);
  }
  if (ret < 0)
    return moat_error_wrap(err, "update %s", id);
  return out ? moat_control_get(c, org, id, out, err) : 0;
}

/* ---- guest access and exec ---- */

/* Pushes e's expiry to now + ttl; writes the store when it moved by a second or more, so that a
 * busy sandbox costs at most one write a second. e->m held. */
void refresh_ttl(struct moat_control *c, struct live *e) {
  if (e->persistent)
    return;
  int64_t x = now_unix_ms() + e->ttl_seconds * 1000;
  __atomic_store_n(&e->expires_at_ms, x, __ATOMIC_RELAXED);
  if (x - e->db_expires_at_ms < 1000)
    return;
  struct moat_store_patch p = {.set_expires = true, .expires_at_ms = x};
  moat_error *err = NULL;
  if (moat_store_sandbox_patch(c->store, e->id, &p, &err) < 0) {
    log_warn("refresh ttl of %s: %s", e->id, moat_error_msg(err));
    moat_error_free(&err);
    return;
  }
  e->db_expires_at_ms = x;
}

/* Finds org's running sandbox id, refreshes its TTL and returns it with a reference taken (and
 * copies of its guest endpoint and env when asked). With call, counts a guest call in e->inflight
 * before letting go of e->m, so a checkpoint that takes e->m next waits for it (the caller
 * decrements it when the call ends). ENOENT (absent, another org's, killed), EBUSY (not running). */
static struct live *acquire_running(struct moat_control *c, const char *org, const char *id,
                                    struct moat_guest_ep **ep, json_t **env, bool call, moat_error **err) {
  struct live *e = live_get(c, id);
  if (e && strcmp(e->org, org) != 0) {
    live_put(c, e);
    moat_error_set(err, ENOENT, "no sandbox %s", id);
    return NULL;
  }
  if (!e) {
    not_live_error(c, org, id, err);
    return NULL;
  }
  pthread_mutex_lock(&e->m);
  __atomic_store_n(&e->last_api_ms, now_unix_ms(), __ATOMIC_RELAXED);
  if (e->state == MOAT_SB_HIBERNATED && tt_wake_locked(c, e, "api", err) < 0) {
    pthread_mutex_unlock(&e->m);
    live_put(c, e);
    return NULL;
  }
  if (e->state == MOAT_SB_PAUSED) {
    pthread_mutex_unlock(&e->m);
    live_put(c, e);
    moat_error_set(err, MOAT_E_PAUSED, "sandbox %s is paused: resume it first (POST /v1/sandboxes/%s/resume)",
                   id, id);
    return NULL;
  }
  if (e->state != MOAT_SB_RUNNING) {
    enum moat_sandbox_state st = e->state;
    pthread_mutex_unlock(&e->m);
    live_put(c, e);
    if (st == MOAT_SB_KILLED)
      not_live_error(c, org, id, err);
    else
      moat_error_set(err, EBUSY, "sandbox %s is %s", id, moat_sandbox_state_name(st));
    return NULL;
  }
  refresh_ttl(c, e);
  if (ep)
    *ep = xmemdup(&e->guest, sizeof(e->guest));
  if (env)
    *env = json_deep_copy(e->env);
  if (call)
    __atomic_add_fetch(&e->inflight, 1, __ATOMIC_SEQ_CST);
  pthread_mutex_unlock(&e->m);
  return e;
}

int moat_control_guest(struct moat_control *c, const char *org, const char *id, struct moat_guest_ep **ep,
                       char ***env, moat_error **err) {
  _cleanup_json_ json_t *envj = NULL;
  struct live *e = acquire_running(c, org, id, ep, env ? &envj : NULL, false, err);
  if (!e)
    return -1;
  if (env)
    *env = moat_env_merge(envj, NULL);
  live_put(c, e);
  return 0;
}

int moat_control_running(struct moat_control *c, const char *org, const char *id, moat_error **err) {
  struct live *e = acquire_running(c, org, id, NULL, NULL, false, err);
  if (!e)
    return -1;
  live_put(c, e);
  return 0;
}

int moat_control_port_connect(struct moat_control *c, const char *org, const char *id, unsigned port,
                              int timeout_ms, moat_error **err) {
  struct live *e = acquire_running(c, org, id, NULL, NULL, false, err);
  if (!e)
    return -1;
  int fd = -1;
  /* m held: a kill waits, so the slot stays the sandbox's until the connection is made (at most
   * timeout_ms; a loopback connect is refused or accepted at once unless the listener's backlog
   * is full) */
  pthread_mutex_lock(&e->m);
  if (e->state == MOAT_SB_RUNNING && e->slot >= 0) {
    fd = moat_host_port_connect(c->host, e->slot, port, timeout_ms, err);
    if (fd < 0)
      moat_error_wrap(err, "sandbox %s", id);
  } else {
    moat_error_set(err, EBUSY, "sandbox %s is %s", id, moat_sandbox_state_name(e->state));
  }
  pthread_mutex_unlock(&e->m);
  live_put(c, e);
  return fd;
}

int moat_control_exec(struct moat_control *c, const char *org, const char *id,
                      const struct moat_exec_req *req, struct moat_exec_result *res, moat_error **err) {
  _cleanup_free_ struct moat_guest_ep *sock = NULL;
  _cleanup_json_ json_t *envj = NULL;
  struct live *e = acquire_running(c, org, id, &sock, &envj, true, err);
  if (!e)
    return -1;
  _cleanup_strv_ char **env = moat_env_merge(envj, req->env);
  struct moat_exec_req r = *req;
  r.env = env;
  uint64_t oom_before = ctl_oom_count(c, e);
  /* counted in inflight by acquire_running: the reaper does not expire a busy sandbox, and a
   * checkpoint waits for the call to end */
  int rc = moat_guest_exec(sock, &r, res, err);
  if (rc == 0) {
    struct moat_oom_proc p = {.pid = res->pid, .argv = req->argv};
    res->oom_killed = ctl_oom_ended(c, e, oom_before, &p, res->exit_code, res->signal);
  }
  int calls = __atomic_sub_fetch(&e->inflight, 1, __ATOMIC_SEQ_CST);
  moat_assert(calls >= 0, "sandbox %s: more guest calls ended than began", e->id);
  pthread_mutex_lock(&e->m);
  if (e->state == MOAT_SB_RUNNING)
    refresh_ttl(c, e);
  bool killed = e->state == MOAT_SB_KILLED;
  pthread_mutex_unlock(&e->m);
  live_put(c, e);
  if (rc < 0 && killed) {
    moat_error_wrap(err, "sandbox %s was killed during exec", id);
    if (err && *err)
      (*err)->status = ENOENT;
    return -1;
  }
  return rc < 0 ? moat_error_wrap(err, "exec in %s", id) : 0;
}

uint64_t moat_control_host_memory_mb(const struct moat_control *c) { return c->bounds.host_memory_mb; }

bool moat_control_template_exists(struct moat_control *c, const char *name) {
  return c->templates && moat_template_exists(c->templates, name);
}

int moat_control_template_list(struct moat_control *c, struct moat_template_info **out, size_t *n,
                               moat_error **err) {
  *out = NULL;
  *n = 0;
  if (!c->templates)
    return moat_error_set(err, EAGAIN, "templates are not available");
  return moat_template_list(c->templates, out, n, err);
}

int moat_control_template_build(struct moat_control *c, const char *name, moat_error **err) {
  if (!c->templates)
    return moat_error_set(err, EAGAIN, "templates are not available");
  if (!moat_template_exists(c->templates, name))
    return moat_error_set(err, ENOENT, "no template recipe '%s'", name);
  return moat_template_ensure(c->templates, name, err);
}

/* ---- reaper ---- */

/* One pass: kills expired non-persistent sandboxes (reason ttl) and those whose init died
 * (reason oom when the kernel OOM-killed in it, else error). Sandboxes busy in a transition are
 * skipped until the next pass. */
static void reap_once(struct moat_control *c) {
  size_t n;
  struct live **v = live_all(c, NULL, SIZE_MAX, &n);

  int64_t now = now_unix_ms();
  for (size_t i = 0; i < n; i++) {
    struct live *e = v[i];
    if (pthread_mutex_trylock(&e->m) == 0) {
      if (e->state == MOAT_SB_RUNNING || e->state == MOAT_SB_PAUSED) {
        bool busy = __atomic_load_n(&e->inflight, __ATOMIC_SEQ_CST) > 0;
        if (!e->persistent && !busy && e->state == MOAT_SB_RUNNING && e->expires_at_ms <= now) {
          kill_locked(c, e, "ttl", NULL);
        } else if (!moat_host_alive(c->host, e->slot)) {
          struct moat_usage u = {0};
          moat_error *err = NULL;
          const char *reason = "guest_exited";
          if (moat_host_usage(c->host, e->slot, &u, &err) == 0 && u.oom_kills > 0)
            reason = "oom";
          moat_error_free(&err);
          log_warn("sandbox %s: its init (moat-guest, pid %d) died%s", e->id, (int)e->pid,
                   u.oom_kills ? " (out of memory)" : "");
          kill_locked(c, e, reason, NULL);
        } else {
          if (e->state == MOAT_SB_RUNNING && !busy)
            ctl_oom_reap(c, e);
          if (e->state == MOAT_SB_RUNNING && !busy && e->hibernate_after_s > 0)
            tt_reap_idle(c, e, now);
        }
      }
      pthread_mutex_unlock(&e->m);
    }
    live_put(c, e);
  }
  free(v);
  tt_reap_explores(c, now);
  ctl_databases_reap(c, now);
  ctl_audit_reap(c, now_unix_ms());
  ctl_meter_reap(c, now_unix_ms());
}

static void *reaper_main(void *arg) {
  struct moat_control *c = arg;
  pthread_mutex_lock(&c->reap_lock);
  while (!c->stop) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t ns = (uint64_t)ts.tv_nsec + (uint64_t)c->reap_interval_ms * 1000000ull;
    ts.tv_sec += (time_t)(ns / 1000000000ull);
    ts.tv_nsec = (long)(ns % 1000000000ull);
    while (!c->stop && pthread_cond_timedwait(&c->reap_cond, &c->reap_lock, &ts) != ETIMEDOUT)
      ;
    if (c->stop)
      break;
    pthread_mutex_unlock(&c->reap_lock);
    reap_once(c);
    pthread_mutex_lock(&c->reap_lock);
  }
  pthread_mutex_unlock(&c->reap_lock);
  return NULL;
}

/* ---- open, recovery, close ---- */

/* For every sandbox recorded live: adopt it if its init still runs, else record it killed
 * (host_restart). A sandbox still "creating" was never answered (moatd died inside its create,
 * fork or restore): it is forgotten, row and events. Then reconcile the host, which removes
 * whatever of the host's slots no adopted sandbox holds. */
static int recover(struct moat_control *c, moat_error **err) {
  struct moat_store_filter f = {0};
  struct moat_store_sandbox *rows;
  size_t n;
  if (moat_store_sandbox_list(c->store, &f, &rows, &n, err) < 0)
    return moat_error_wrap(err, "recover");
  unsigned adopted = 0, lost = 0, forgotten = 0;
  for (size_t i = 0; i < n; i++) {
    struct moat_store_sandbox *r = &rows[i];
    enum moat_sandbox_state st;
    if (moat_sandbox_state_parse(r->state, &st) < 0)
      continue;
    if (st == MOAT_SB_CREATING) {
      moat_error *e2 = NULL;
      if (moat_store_sandbox_forget_creating(c->store, r->id, &e2) < 0) {
        log_error("recover %s: forget an unfinished create: %s", r->id, moat_error_msg(e2));
        moat_error_free(&e2);
      } else {
        forgotten++;
      }
      continue;
    }
    if (st == MOAT_SB_HIBERNATED) {
      /* No process to adopt: it lives on as its image in DATA/hibernate/ID. */
      _cleanup_free_ char *img = xasprintf("%s/%s", c->hib_dir, r->id);
      if (moat_image_dir_exists(img)) {
        struct live *e = live_new(r->id, r->org);
        e->state = st;
        e->env = parse_object(r->env_json);
        e->ttl_seconds = r->ttl_seconds;
        e->persistent = r->persistent;
        e->expires_at_ms = e->db_expires_at_ms = r->expires_at_ms;
        e->template_name = xstrdup(r->template_name);
        e->limits = (struct moat_limits){r->cpu, r->memory_mb, r->pids, r->disk_mb};
        e->paused_at_ms = r->paused_at_ms;
        e->hibernate_after_s = r->hibernate_after_s;
        e->last_api_ms = now_unix_ms();
        live_add(c, e);
        live_put(c, e);
        adopted++;
        continue;
      }
      log_error("recover %s: hibernated but its image %s is gone", r->id, img);
    }
    int alive = 0;
    struct moat_instance inst;
    memset(&inst, 0, sizeof(inst));
    if (r->slot >= 0 && (st == MOAT_SB_RUNNING || st == MOAT_SB_PAUSED)) {
      moat_error *e2 = NULL;
      alive = moat_host_adopt(c->host, r->slot, (pid_t)r->pid, r->start_time, &inst, &e2);
      if (alive < 0) {
        log_error("adopt %s (slot %d): %s", r->id, r->slot, moat_error_msg(e2));
        moat_error_free(&e2);
        alive = 0;
      }
    }
    if (alive == 1) {
      /* The freezer state follows the record: a moatd killed in the middle of a checkpoint (the host
       * freezes the cgroup for it) or of a pause leaves the cgroup frozen or not regardless. */
      moat_error *e3 = NULL;
      if ((st == MOAT_SB_PAUSED ? moat_host_pause(c->host, r->slot, &e3)
                                : moat_host_resume(c->host, r->slot, &e3)) < 0) {
        log_warn("recover %s: set freezer to %s: %s", r->id, r->state, moat_error_msg(e3));
        moat_error_free(&e3);
      }
      struct live *e = live_new(r->id, r->org);
      e->state = st;
      e->slot = r->slot;
      e->pid = (pid_t)r->pid;
      e->start_time = r->start_time;
      ctl_set_guest(e, &inst);
      ctl_oom_reset(e, false); /* kills before the restart were announced then */
      e->env = parse_object(r->env_json);
      e->ttl_seconds = r->ttl_seconds;
      e->persistent = r->persistent;
      e->expires_at_ms = e->db_expires_at_ms = r->expires_at_ms;
      e->template_name = xstrdup(r->template_name);
      e->limits = (struct moat_limits){r->cpu, r->memory_mb, r->pids, r->disk_mb};
      e->paused_at_ms = st == MOAT_SB_PAUSED ? r->paused_at_ms : 0;
      e->hibernate_after_s = r->hibernate_after_s;
      e->last_api_ms = now_unix_ms();
      live_add(c, e);
      live_put(c, e);
      adopted++;
    } else {
      moat_error *e2 = NULL;
      if (moat_store_sandbox_transition(c->store, r->id, NULL, "killed", "host_restart", &e2) < 0) {
        log_error("recover %s: %s", r->id, moat_error_msg(e2));
        moat_error_free(&e2);
      }
      lost++;
    }
  }
  moat_store_sandboxes_free(rows, n);
  moat_error *e2 = NULL;
  int cleaned = moat_host_reconcile(c->host, &e2);
  if (cleaned < 0) {
    log_error("reconcile: %s", moat_error_msg(e2));
    moat_error_free(&e2);
  }
  if (adopted || lost || forgotten || cleaned > 0)
    log_info("recovery: %u sandboxes adopted, %u recorded killed (host_restart), %u unfinished creates "
             "forgotten, %d leftover slots cleaned",
             adopted, lost, forgotten, cleaned);
  return 0;
}

int moat_control_open(struct moat_control **out, const struct moat_control_config *cfg, moat_error **err) {
  struct moat_control *c = xcalloc(1, sizeof(*c));
  pthread_mutex_init(&c->lock, NULL);
  pthread_mutex_init(&c->reap_lock, NULL);
  pthread_mutex_init(&c->explore_lock, NULL);
  pthread_mutex_init(&c->ctx_lock, NULL);
  pthread_mutex_init(&c->conn_lock, NULL);
  pthread_mutex_init(&c->db_lock, NULL);
  c->audit_retention_ms = (int64_t)(cfg->audit_retention_days ? cfg->audit_retention_days : 90) * 86400000LL;
  ctl_db_events_open(c);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&c->reap_cond, &ca);
  pthread_condattr_destroy(&ca);
  c->reap_interval_ms = cfg->reap_interval_ms ? cfg->reap_interval_ms : DEFAULT_REAP_INTERVAL_MS;
  c->cpu = ctl_cpu_new();
  c->data_dir = xstrdup(cfg->data_dir);
  c->template_dir = cfg->template_dir ? xstrdup(cfg->template_dir) : xasprintf("%s/templates", cfg->data_dir);
  c->builds_dir = xasprintf("%s/builds", cfg->data_dir);
  c->images_dir = xasprintf("%s/images", cfg->data_dir);
  c->baked_dir = xasprintf("%s/baked", cfg->data_dir);
  c->build_context_max_bytes = (cfg->build_context_max_mb ? cfg->build_context_max_mb : 1024) << 20;
  pthread_rwlock_init(&c->images_lock, NULL);
  pthread_mutex_init(&c->build_lock, NULL);
  pthread_cond_init(&c->build_cond, NULL);
  const char *template_dir = c->template_dir;
  _cleanup_free_ char *db = xasprintf("%s/moat.db", c->data_dir);

  if (ctl_databases_config(c, cfg->db_listen, err) < 0)
    goto fail;
  if (mkdir_p(c->data_dir, 0700, err) < 0)
    goto fail;
  if (moat_store_open(&c->store, db, err) < 0)
    goto fail;
  if (ctl_ensure_api_key(c, err) < 0)
    goto fail;
  if (moat_templates_open(&c->templates, cfg->recipes_dir, template_dir, err) < 0) {
    moat_error_wrap(err, "templates");
    goto fail;
  }
  struct moat_host_config hc = {
      .data_dir = c->data_dir,
      .template_dir = template_dir,
      .images_dir = c->images_dir,
      .guest_path = cfg->guest_path,
      .pool_size = cfg->pool_size,
      .pool_template = "base",
      .max_slots = 16384,
      .net = cfg->net,
      .disk_overcommit = cfg->disk_overcommit,
      .lxcfs_dir = cfg->lxcfs_dir,
  };
  if (moat_host_init(&c->host, &hc, err) < 0) {
    moat_error_wrap(err, "host");
    goto fail;
  }
  ctl_events_open(c);
  struct moat_host_capacity cap;
  moat_host_capacity(c->host, &cap);
  c->bounds.host_memory_mb = cap.memory_mb ? cap.memory_mb : MOAT_MAX_MEMORY_MB;
  c->bounds.disk_fs_mb = cap.disk_mb ? cap.disk_mb : MOAT_MAX_DISK_MB;
  c->bounds.host_pids =
      moat_spec_host_pids(cap.pid_max ? cap.pid_max : 32768, cap.threads_max ? cap.threads_max : 32768);
  if (tt_open(c, err) < 0)
    goto fail;
  if (recover(c, err) < 0)
    goto fail;
  ctl_volumes_gc(c);
  if (ctl_builder_open(c, err) < 0)
    goto fail;
  ctl_images_gc(c);
  ctl_health_open(c, cfg->guest_timeout_ms);
  c->health_open = true;
  ctl_databases_open(c);
  ctl_orgs_open(c);
  if (!cfg->audit_off && ctl_audit_open(c, err) < 0)
    goto fail;
  if (ctl_meter_open(c, cfg->sample_interval_ms, cfg->metrics_retention_hours, err) < 0)
    goto fail;
  if (ctl_logs_open(c, cfg->log_max_bytes, cfg->log_retention_s, err) < 0 ||
      (!cfg->logs_off && ctl_logs_start(c, err) < 0))
    goto fail;
  if (pthread_create(&c->reaper, NULL, reaper_main, c) != 0) {
    moat_error_set(err, EAGAIN, "start reaper thread");
    goto fail;
  }
  c->reaper_started = true;
  *out = c;
  return 0;
fail:
  moat_control_close(c);
  return -1;
}

void moat_control_close(struct moat_control *c) {
  if (!c)
    return;
  if (c->reaper_started) {
    pthread_mutex_lock(&c->reap_lock);
    c->stop = true;
    pthread_cond_signal(&c->reap_cond);
    pthread_mutex_unlock(&c->reap_lock);
    pthread_join(c->reaper, NULL);
  }
  ctl_meter_close(c);
  ctl_logs_close(c);
  ctl_audit_close(c);
  __atomic_store_n(&c->stop, true, __ATOMIC_SEQ_CST);
  if (c->store)
    ctl_builder_close(c);
  if (c->health_open)
    ctl_health_close(c);
  tt_close(c);
  if (c->host)
    moat_host_shutdown(c->host);
  if (c->templates)
    moat_templates_close(c->templates);
  moat_store_close(c->store);
  for (size_t b = 0; b < NBUCKETS; b++) {
    struct live *e = c->buckets[b];
    while (e) {
      struct live *next = e->next;
      tt_drop_fork_image(c, e);
      live_free(e); /* every caller has returned: only the table's reference is left */
      e = next;
    }
  }
  pthread_cond_destroy(&c->reap_cond);
  pthread_mutex_destroy(&c->reap_lock);
  pthread_mutex_destroy(&c->lock);
  pthread_mutex_destroy(&c->explore_lock);
  ctl_ctx_close(c);
  pthread_mutex_destroy(&c->ctx_lock);
  pthread_mutex_destroy(&c->conn_lock); /* every subscription was closed: the api stopped first */
  ctl_databases_close(c);
  ctl_db_events_close(c);
  pthread_mutex_destroy(&c->db_lock);
  ctl_cpu_free(c->cpu);
  ctl_orgs_close(c);
  free(c->snap_dir);
  free(c->hib_dir);
  free(c->tmp_dir);
  free(c->data_dir);
  free(c->template_dir);
  free(c->builds_dir);
  free(c->images_dir);
  free(c->baked_dir);
  pthread_rwlock_destroy(&c->images_lock);
  pthread_mutex_destroy(&c->build_lock);
  pthread_cond_destroy(&c->build_cond);
  free(c);
}

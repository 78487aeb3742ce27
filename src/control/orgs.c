/* orgs.c -- the orgs a platform admin manages and their quotas.
 *
 * Live quotas (max_sandboxes, max_vcpus, max_memory_mb) count the table's entries of the org that
 * are "counted": a create is counted from the moment it enters the table (ctl_live_admit, under
 * c->lock, where the check is made: concurrent creates cannot overshoot), a hibernated sandbox is
 * not (it holds no slot: a wake reserves again), a killed one leaves the table. creates_per_hour
 * counts the creates this moatd admitted in the last hour (a failed create gives its mark back; the
 * window starts empty when moatd starts). The other quotas are checked against the store's rows
 * when a volume, database or snapshot is made or a TTL set.
 *
 * A delete of an org revokes its keys and marks it deleting in one transaction, then kills and
 * removes what it has; the mark stays until that is done, so an interrupted delete is finished by
 * the next open (ctl_orgs_open) and a create of an org being deleted is refused. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "../common/crashpoint.h"
#include "../common/log.h"
#include "../common/util.h"
#include "../store/store.h"
#include "control.h"
#include "control_internal.h"

#define HOUR_MS 3600000LL
#define QUOTA_MAX (1LL << 53)

static const char *const quota_names[MOAT_Q_N] = {
    [MOAT_Q_SANDBOXES] = "max_sandboxes",
    [MOAT_Q_CREATES_PER_HOUR] = "creates_per_hour",
    [MOAT_Q_VCPUS] = "max_vcpus",
    [MOAT_Q_MEMORY_MB] = "max_memory_mb",
    [MOAT_Q_TTL_SECONDS] = "max_ttl_seconds",
    [MOAT_Q_SNAPSHOT_BYTES] = "max_snapshot_bytes",
    [MOAT_Q_VOLUMES] = "max_volumes",
    [MOAT_Q_VOLUME_BYTES] = "max_volume_bytes",
    [MOAT_Q_DATABASES] = "max_databases",
    [MOAT_Q_DATABASE_BYTES] = "max_database_bytes",
};

struct ctl_org_rate {
  char *org;
  int64_t *t; /* admission times, ms */
  size_t n, cap;
  struct ctl_org_rate *next;
};

const char *moat_quota_name(enum moat_quota q) { return (unsigned)q < MOAT_Q_N ? quota_names[q] : "?"; }

static void quotas_unlimited(struct moat_quotas *q) {
  for (int i = 0; i < MOAT_Q_N; i++)
    q->v[i] = -1;
}

int moat_quotas_parse(const json_t *o, struct moat_quotas *out, moat_error **err) {
  quotas_unlimited(out);
  if (!json_is_object(o))
    return moat_error_set(err, EINVAL, "quotas must be a JSON object");
  const char *k;
  json_t *v;
  json_object_foreach((json_t *)o, k, v) {
    int i = 0;
    while (i < MOAT_Q_N && strcmp(k, quota_names[i]) != 0)
      i++;
    if (i == MOAT_Q_N)
      return moat_error_set(err, EINVAL,
                            "unknown quota '%.64s' (max_sandboxes, creates_per_hour, max_vcpus, "
                            "max_memory_mb, max_ttl_seconds, max_snapshot_bytes, max_volumes, "
                            "max_volume_bytes, max_databases, max_database_bytes)",
                            k);
    if (json_is_null(v))
      continue;
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > QUOTA_MAX)
      return moat_error_set(err, EINVAL, "quota '%s' must be null (unlimited) or an integer from 0 to 2^53",
                            quota_names[i]);
    out->v[i] = json_integer_value(v);
  }
  return 0;
}

json_t *moat_quotas_json(const struct moat_quotas *q) {
  json_t *o = json_object();
  for (int i = 0; i < MOAT_Q_N; i++)
    json_object_set_new(o, quota_names[i], q->v[i] < 0 ? json_null() : json_integer(q->v[i]));
  return o;
}

bool moat_org_id_valid(const char *id) {
  size_t n = strlen(id);
  if (n < 1 || n > 63 || !((id[0] >= 'a' && id[0] <= 'z') || (id[0] >= '0' && id[0] <= '9')))
    return false;
  for (size_t i = 1; i < n; i++)
    if (!((id[i] >= 'a' && id[i] <= 'z') || (id[i] >= '0' && id[i] <= '9') || id[i] == '_' || id[i] == '.' ||
          id[i] == '-'))
      return false;
  return true;
}

void moat_org_info_clear(struct moat_org_info *o) {
  if (!o)
    return;
  free(o->id);
  memset(o, 0, sizeof(*o));
}

void moat_org_infos_free(struct moat_org_info *v, size_t n) {
  for (size_t i = 0; v && i < n; i++)
    moat_org_info_clear(&v[i]);
  free(v);
}

static int quota_error(moat_error **err, enum moat_quota q, int64_t limit, int64_t use) {
  return moat_error_set(err, MOAT_E_QUOTA, "over quota %s: limit %lld, use %lld", quota_names[q],
                        (long long)limit, (long long)use);
}

static void org_from_row(const struct moat_store_org *r, struct moat_org_info *out) {
  memset(out, 0, sizeof(*out));
  out->id = xstrdup(r->id);
  out->created_at_ms = r->created_at_ms;
  out->deleting = r->deleting_at_ms > 0;
  _cleanup_json_ json_t *j = json_loads(r->quotas_json ? r->quotas_json : "{}", 0, NULL);
  moat_error *e = NULL;
  if (moat_quotas_parse(j, &out->quotas, &e) < 0) { /* a newer moatd's quota: unknown here */
    log_warn("org %s: quotas: %s", r->id, moat_error_msg(e));
    moat_error_free(&e);
  }
}

int ctl_quotas_load(struct moat_control *c, const char *org, struct moat_quotas *q, moat_error **err) {
  quotas_unlimited(q);
  struct moat_store_org r = {0};
  moat_error *e = NULL;
  if (moat_store_org_get(c->store, org, &r, &e) < 0) {
    if (e->status == ENOENT) {
      moat_error_free(&e);
      return 0;
    }
    *err = e;
    return -1;
  }
  struct moat_org_info info;
  org_from_row(&r, &info);
  *q = info.quotas;
  moat_org_info_clear(&info);
  moat_store_org_clear(&r);
  return 0;
}

/* ---- live use, under c->lock ---- */

/* cpu in thousandths, rounded (no libm) */
static int64_t milli(double cpu) { return (int64_t)(cpu * 1000 + 0.5); }

struct live_use {
  const char *org;
  const struct live *skip;
  int64_t n, cpu_milli, memory_mb, ttl_max;
};

static void use_add(struct live *e, void *arg) {
  struct live_use *u = arg;
  if (!e->counted || e == u->skip || strcmp(e->org, u->org) != 0)
    return;
  u->n++;
  u->cpu_milli += milli(e->limits.cpu);
  u->memory_mb += (int64_t)e->limits.memory_mb;
}

static struct ctl_org_rate *rate_of(struct moat_control *c, const char *org, bool make) {
  for (struct ctl_org_rate *r = c->rates; r; r = r->next)
    if (strcmp(r->org, org) == 0)
      return r;
  if (!make)
    return NULL;
  struct ctl_org_rate *r = xcalloc(1, sizeof(*r));
  r->org = xstrdup(org);
  r->next = c->rates;
  c->rates = r;
  return r;
}

static int64_t rate_count(struct ctl_org_rate *r, int64_t now) {
  if (!r)
    return 0;
  size_t j = 0;
  for (size_t i = 0; i < r->n; i++)
    if (r->t[i] > now - HOUR_MS)
      r->t[j++] = r->t[i];
  r->n = j;
  return (int64_t)r->n;
}

static bool deleting_locked(struct moat_control *c, const char *org) {
  for (size_t i = 0; i < c->n_deleting; i++)
    if (strcmp(c->deleting_orgs[i], org) == 0)
      return true;
  return false;
}

/* The live quotas with count more sandboxes of limits l (c->lock held). */
static int check_live_locked(struct moat_control *c, const char *org, const struct live *skip,
                             const struct moat_quotas *q, unsigned count, const struct moat_limits *l,
                             bool creates, moat_error **err) {
  struct live_use u = {.org = org, .skip = skip};
  live_each_locked(c, use_add, &u);
  int64_t add_milli = milli(l->cpu) * count;
  if (q->v[MOAT_Q_SANDBOXES] >= 0 && u.n + count > q->v[MOAT_Q_SANDBOXES])
    return quota_error(err, MOAT_Q_SANDBOXES, q->v[MOAT_Q_SANDBOXES], u.n);
  if (q->v[MOAT_Q_VCPUS] >= 0 && u.cpu_milli + add_milli > q->v[MOAT_Q_VCPUS] * 1000)
    return quota_error(err, MOAT_Q_VCPUS, q->v[MOAT_Q_VCPUS], (u.cpu_milli + 999) / 1000);
  if (q->v[MOAT_Q_MEMORY_MB] >= 0 && u.memory_mb + (int64_t)l->memory_mb * count > q->v[MOAT_Q_MEMORY_MB])
    return quota_error(err, MOAT_Q_MEMORY_MB, q->v[MOAT_Q_MEMORY_MB], u.memory_mb);
  if (creates && q->v[MOAT_Q_CREATES_PER_HOUR] >= 0) {
    int64_t used = rate_count(rate_of(c, org, false), now_unix_ms());
    if (used + count > q->v[MOAT_Q_CREATES_PER_HOUR])
      return quota_error(err, MOAT_Q_CREATES_PER_HOUR, q->v[MOAT_Q_CREATES_PER_HOUR], used);
  }
  return 0;
}

int ctl_live_admit(struct moat_control *c, struct live *e, const struct moat_quotas *q, moat_error **err) {
  if (strcmp(e->org, MOAT_PLATFORM_ORG) == 0) /* the platform admin key's org holds nothing */
    return moat_error_set(err, EACCES, "the platform admin key makes no sandbox");
  pthread_mutex_lock(&c->lock);
  if (deleting_locked(c, e->org)) {
    pthread_mutex_unlock(&c->lock);
    return moat_error_set(err, EACCES, "org %s is being deleted", e->org);
  }
  if (q && check_live_locked(c, e->org, NULL, q, 1, &e->limits, true, err) < 0) {
    pthread_mutex_unlock(&c->lock);
    return -1;
  }
  struct ctl_org_rate *r = rate_of(c, e->org, true);
  int64_t now = now_unix_ms();
  rate_count(r, now);
  if (r->n == r->cap) {
    r->cap = r->cap ? r->cap * 2 : 16;
    r->t = xrealloc(r->t, r->cap * sizeof(*r->t));
  }
  r->t[r->n++] = now;
  e->rate_at_ms = now;
  live_add_locked(c, e);
  e->counted = true;
  pthread_mutex_unlock(&c->lock);
  return 0;
}

void ctl_live_unadmit(struct moat_control *c, struct live *e) {
  pthread_mutex_lock(&c->lock);
  struct ctl_org_rate *r = e->rate_at_ms ? rate_of(c, e->org, false) : NULL;
  for (size_t i = 0; r && i < r->n; i++)
    if (r->t[i] == e->rate_at_ms) {
      r->t[i] = r->t[--r->n];
      break;
    }
  e->rate_at_ms = 0;
  pthread_mutex_unlock(&c->lock);
}

int ctl_quota_wake(struct moat_control *c, struct live *e, moat_error **err) {
  struct moat_quotas q;
  if (ctl_quotas_load(c, e->org, &q, err) < 0)
    return -1;
  pthread_mutex_lock(&c->lock);
  int rc = 0;
  if (!e->counted && (rc = check_live_locked(c, e->org, e, &q, 1, &e->limits, false, err)) == 0)
    e->counted = true;
  pthread_mutex_unlock(&c->lock);
  return rc;
}

void ctl_live_uncount(struct moat_control *c, struct live *e) {
  pthread_mutex_lock(&c->lock);
  e->counted = false;
  pthread_mutex_unlock(&c->lock);
}

int ctl_quota_precheck(struct moat_control *c, const char *org, unsigned count, const struct moat_limits *l,
                       moat_error **err) {
  struct moat_quotas q;
  if (ctl_quotas_load(c, org, &q, err) < 0)
    return -1;
  pthread_mutex_lock(&c->lock);
  int rc = check_live_locked(c, org, NULL, &q, count, l, true, err);
  pthread_mutex_unlock(&c->lock);
  return rc;
}

int moat_control_quota_check(struct moat_control *c, const char *org, enum moat_quota qn, int64_t use,
                             int64_t add, moat_error **err) {
  struct moat_quotas q;
  if (ctl_quotas_load(c, org, &q, err) < 0)
    return -1;
  if (q.v[qn] >= 0 && use + add > q.v[qn])
    return quota_error(err, qn, q.v[qn], use);
  return 0;
}

static pthread_mutex_t storage_lock = PTHREAD_MUTEX_INITIALIZER; /* see quota_storage_begin */

int moat_control_quota_storage_begin(struct moat_control *c, const char *org, enum moat_quota kind,
                                     int64_t add_bytes, bool *held, moat_error **err) {
  *held = false;
  struct moat_quotas q;
  if (ctl_quotas_load(c, org, &q, err) < 0)
    return -1;
  enum moat_quota count_q = kind, bytes_q = kind == MOAT_Q_VOLUMES     ? MOAT_Q_VOLUME_BYTES
                                            : kind == MOAT_Q_DATABASES ? MOAT_Q_DATABASE_BYTES
                                                                       : MOAT_Q_SNAPSHOT_BYTES;
  bool counts = kind != MOAT_Q_SNAPSHOT_BYTES;
  if ((!counts || q.v[count_q] < 0) && q.v[bytes_q] < 0)
    return 0;
  pthread_mutex_lock(&storage_lock);
  struct moat_quotas now;
  int64_t use[MOAT_Q_N];
  int rc = moat_control_org_usage(c, org, &now, use, err);
  if (rc == 0 && counts && q.v[count_q] >= 0 && use[count_q] + 1 > q.v[count_q])
    rc = quota_error(err, count_q, q.v[count_q], use[count_q]);
  if (rc == 0 && q.v[bytes_q] >= 0 &&
      (counts ? use[bytes_q] + add_bytes > q.v[bytes_q] : use[bytes_q] >= q.v[bytes_q]))
    rc = quota_error(err, bytes_q, q.v[bytes_q], use[bytes_q]);
  if (rc < 0) {
    pthread_mutex_unlock(&storage_lock);
    return -1;
  }
  *held = true;
  return 0;
}

void moat_control_quota_storage_end(struct moat_control *c, bool held) {
  if (held)
    pthread_mutex_unlock(&storage_lock);
}

/* ---- orgs ---- */

static int org_row_live(struct moat_control *c, const char *id, struct moat_store_org *r, moat_error **err) {
  if (!moat_org_id_valid(id))
    return moat_error_set(err, ENOENT, "no org '%.64s'", id);
  if (moat_store_org_get(c->store, id, r, err) < 0)
    return -1;
  if (r->deleted_at_ms > 0) {
    moat_store_org_clear(r);
    return moat_error_set(err, ENOENT, "no org '%.64s'", id);
  }
  return 0;
}

int moat_control_org_create(struct moat_control *c, const char *id, struct moat_org_info *out,
                            struct moat_key_info *key, char **secret, moat_error **err) {
  if (!id || !moat_org_id_valid(id))
    return moat_error_set(err, EINVAL, "field 'name' must match [a-z0-9][a-z0-9_.-]{0,62}");
  if (moat_store_org_create(c->store, id, now_unix_ms(), err) < 0)
    return -1;
  if (moat_control_keys_create(c, id, "admin", MOAT_ROLE_ADMIN, 0, key, secret, err) < 0)
    return moat_error_wrap(err, "org %s: its first admin key", id);
  return moat_control_org_get(c, id, out, err);
}

int moat_control_org_get(struct moat_control *c, const char *id, struct moat_org_info *out,
                         moat_error **err) {
  struct moat_store_org r = {0};
  if (org_row_live(c, id, &r, err) < 0)
    return -1;
  org_from_row(&r, out);
  moat_store_org_clear(&r);
  return 0;
}

int moat_control_org_list(struct moat_control *c, const char *after, unsigned limit,
                          struct moat_org_info **out, size_t *n, moat_error **err) {
  struct moat_store_org *v = NULL;
  size_t m = 0;
  if (moat_store_org_list(c->store, after, limit + 1, false, &v, &m, err) < 0)
    return -1;
  *out = xcalloc(m ? m : 1, sizeof(**out));
  *n = 0;
  for (size_t i = 0; i < m && *n < limit; i++)
    if (strcmp(v[i].id, MOAT_PLATFORM_ORG) != 0)
      org_from_row(&v[i], &(*out)[(*n)++]);
  moat_store_orgs_free(v, m);
  return 0;
}

int moat_control_org_quotas_set(struct moat_control *c, const char *id, const struct moat_quotas *q,
                                moat_error **err) {
  struct moat_store_org r = {0};
  if (org_row_live(c, id, &r, err) < 0)
    return -1;
  moat_store_org_clear(&r);
  _cleanup_json_ json_t *j = json_object();
  for (int i = 0; i < MOAT_Q_N; i++)
    if (q->v[i] >= 0)
      json_object_set_new(j, quota_names[i], json_integer(q->v[i]));
  _cleanup_free_ char *text = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
  return moat_store_org_set_quotas(c->store, id, text, err);
}

/* Volumes that hold a database's data count as the database's, not as volumes. */
static bool is_db_volume(const struct moat_database_info *d, size_t nd, const char *name) {
  for (size_t i = 0; i < nd; i++)
    if (d[i].volume && strcmp(d[i].volume, name) == 0)
      return true;
  return false;
}

int moat_control_org_usage(struct moat_control *c, const char *id, struct moat_quotas *quotas,
                           int64_t use[MOAT_Q_N], moat_error **err) {
  if (ctl_quotas_load(c, id, quotas, err) < 0)
    return -1;
  memset(use, 0, sizeof(int64_t) * MOAT_Q_N);
  struct live_use u = {.org = id};
  pthread_mutex_lock(&c->lock);
  live_each_locked(c, use_add, &u);
  use[MOAT_Q_CREATES_PER_HOUR] = rate_count(rate_of(c, id, false), now_unix_ms());
  pthread_mutex_unlock(&c->lock);
  use[MOAT_Q_SANDBOXES] = u.n;
  use[MOAT_Q_VCPUS] = (u.cpu_milli + 999) / 1000;
  use[MOAT_Q_MEMORY_MB] = u.memory_mb;
  struct moat_sandbox_info *sv = NULL;
  size_t ns = 0;
  if (moat_control_list(c, id, NULL, NULL, &sv, &ns, err) < 0)
    return -1;
  for (size_t i = 0; i < ns; i++)
    if (!sv[i].persistent && sv[i].ttl_seconds > use[MOAT_Q_TTL_SECONDS])
      use[MOAT_Q_TTL_SECONDS] = sv[i].ttl_seconds;
  moat_sandbox_infos_free(sv, ns);
  struct moat_snapshot_info *snaps = NULL;
  size_t nsn = 0;
  if (moat_control_snapshot_list(c, id, NULL, &snaps, &nsn, err) < 0)
    return -1;
  for (size_t i = 0; i < nsn; i++)
    use[MOAT_Q_SNAPSHOT_BYTES] += (int64_t)(snaps[i].memory_bytes + snaps[i].disk_bytes);
  moat_snapshot_infos_free(snaps, nsn);
  struct moat_database_info *dbs = NULL;
  size_t nd = 0;
  if (moat_control_database_list(c, id, &dbs, &nd, err) < 0)
    return -1;
  for (size_t i = 0; i < nd; i++) {
    use[MOAT_Q_DATABASES]++;
    use[MOAT_Q_DATABASE_BYTES] += (int64_t)dbs[i].size_mb << 20;
  }
  struct moat_volume_info *vols = NULL;
  size_t nv = 0;
  int rc = moat_control_volume_list(c, id, &vols, &nv, err);
  for (size_t i = 0; rc == 0 && i < nv; i++)
    if (!is_db_volume(dbs, nd, vols[i].name)) {
      use[MOAT_Q_VOLUMES]++;
      use[MOAT_Q_VOLUME_BYTES] += (int64_t)vols[i].size_mb << 20;
    }
  moat_volume_infos_free(vols, nv);
  moat_database_infos_free(dbs, nd);
  return rc;
}

/* ---- delete ---- */

static void deleting_add(struct moat_control *c, const char *id) {
  pthread_mutex_lock(&c->lock);
  if (!deleting_locked(c, id)) {
    c->deleting_orgs = xrealloc(c->deleting_orgs, (c->n_deleting + 1) * sizeof(char *));
    c->deleting_orgs[c->n_deleting++] = xstrdup(id);
  }
  pthread_mutex_unlock(&c->lock);
}

static void deleting_remove(struct moat_control *c, const char *id) {
  pthread_mutex_lock(&c->lock);
  for (size_t i = 0; i < c->n_deleting; i++)
    if (strcmp(c->deleting_orgs[i], id) == 0) {
      free(c->deleting_orgs[i]);
      c->deleting_orgs[i] = c->deleting_orgs[--c->n_deleting];
      break;
    }
  pthread_mutex_unlock(&c->lock);
}

/* What org id holds: live (not killed) sandboxes, volumes, databases, snapshots. */
static int org_holdings(struct moat_control *c, const char *id, size_t n[4], moat_error **err) {
  struct moat_sandbox_info *sv = NULL;
  struct moat_volume_info *vv = NULL;
  struct moat_database_info *dv = NULL;
  struct moat_snapshot_info *pv = NULL;
  if (moat_control_list(c, id, NULL, NULL, &sv, &n[0], err) < 0)
    return -1;
  moat_sandbox_infos_free(sv, n[0]);
  if (moat_control_volume_list(c, id, &vv, &n[1], err) < 0)
    return -1;
  moat_volume_infos_free(vv, n[1]);
  if (moat_control_database_list(c, id, &dv, &n[2], err) < 0)
    return -1;
  moat_database_infos_free(dv, n[2]);
  if (moat_control_snapshot_list(c, id, NULL, &pv, &n[3], err) < 0)
    return -1;
  moat_snapshot_infos_free(pv, n[3]);
  return 0;
}

/* Kills and removes everything of org id (its delete began): 0, or -1 naming the first failure
 * (the rest is still tried; a later delete or open tries again). */
static int org_purge(struct moat_control *c, const char *id, moat_error **err) {
  int ret = 0;
  moat_error *e = NULL;
#define PURGE_STEP(call, what, name)                                                                         \
  do {                                                                                                       \
    if ((call) < 0 && e && e->status != ENOENT && e->status != MOAT_E_NO_VOLUME) {                           \
      log_warn("delete org %s: %s %s: %s", id, what, name, moat_error_msg(e));                               \
      if (ret == 0 && err && !*err) {                                                                        \
        *err = e;                                                                                            \
        e = NULL;                                                                                            \
      }                                                                                                      \
      ret = -1;                                                                                              \
    }                                                                                                        \
    moat_error_free(&e);                                                                                     \
  } while (0)
  struct moat_database_info *dv = NULL;
  size_t nd = 0;
  if (moat_control_database_list(c, id, &dv, &nd, err) < 0)
    return -1;
  for (size_t i = 0; i < nd; i++)
    PURGE_STEP(moat_control_database_delete(c, id, dv[i].id, &e), "database", dv[i].id);
  moat_database_infos_free(dv, nd);
  struct moat_sandbox_info *sv = NULL;
  size_t ns = 0;
  if (moat_control_list(c, id, NULL, NULL, &sv, &ns, err) < 0)
    return -1;
  for (size_t i = 0; i < ns; i++)
    PURGE_STEP(moat_control_kill(c, id, sv[i].id, "org_deleted", &e), "sandbox", sv[i].id);
  moat_sandbox_infos_free(sv, ns);
  struct moat_volume_info *vv = NULL;
  size_t nv = 0;
  if (moat_control_volume_list(c, id, &vv, &nv, err) < 0)
    return -1;
  for (size_t i = 0; i < nv; i++)
    PURGE_STEP(moat_control_volume_delete(c, id, vv[i].name, &e), "volume", vv[i].name);
  moat_volume_infos_free(vv, nv);
  struct moat_snapshot_info *pv = NULL;
  size_t np = 0;
  if (moat_control_snapshot_list(c, id, NULL, &pv, &np, err) < 0)
    return -1;
  for (size_t i = 0; i < np; i++)
    PURGE_STEP(moat_control_snapshot_delete(c, id, pv[i].id, &e), "snapshot", pv[i].id);
  moat_snapshot_infos_free(pv, np);
  struct moat_user_template *tv = NULL;
  size_t nt = 0;
  if (moat_control_user_template_list(c, id, &tv, &nt, err) < 0)
    return -1;
  for (size_t i = 0; i < nt; i++)
    PURGE_STEP(moat_control_user_template_delete(c, id, tv[i].name, &e), "template", tv[i].name);
  moat_user_templates_free(tv, nt);
#undef PURGE_STEP
  return ret;
}

static int org_finish_delete(struct moat_control *c, const char *id, moat_error **err) {
  deleting_add(c, id);
  if (org_purge(c, id, err) < 0)
    return moat_error_wrap(err, "delete org %s (a retry of the delete resumes it)", id);
  if (moat_store_org_end_delete(c->store, id, now_unix_ms(), err) < 0)
    return -1;
  deleting_remove(c, id);
  log_info("org %s deleted", id);
  return 0;
}

int moat_control_org_delete(struct moat_control *c, const char *id, bool force, moat_error **err) {
  struct moat_store_org r = {0};
  if (org_row_live(c, id, &r, err) < 0)
    return -1;
  bool begun = r.deleting_at_ms > 0;
  moat_store_org_clear(&r);
  if (strcmp(id, MOAT_PLATFORM_ORG) == 0)
    return moat_error_set(err, ENOENT, "no org '%.64s'", id);
  if (!force && !begun) {
    size_t n[4];
    if (org_holdings(c, id, n, err) < 0)
      return -1;
    if (n[0] || n[1] || n[2] || n[3])
      return moat_error_set(err, EBUSY,
                            "org %s has %zu live sandboxes, %zu volumes, %zu databases and %zu snapshots: "
                            "delete them first, or delete the org with ?force=true",
                            id, n[0], n[1], n[2], n[3]);
  }
  if (!begun) {
    if (moat_store_org_begin_delete(c->store, id, now_unix_ms(), err) < 0)
      return -1;
    ctl_keys_revoked(c);
    moat_crash_point("org_delete.begun");
  }
  return org_finish_delete(c, id, err);
}

void ctl_orgs_open(struct moat_control *c) {
  struct moat_store_org *v = NULL;
  size_t n = 0;
  moat_error *e = NULL;
  if (moat_store_org_list(c->store, NULL, 100000, true, &v, &n, &e) < 0) {
    log_error("orgs: list the deletes to finish: %s", moat_error_msg(e));
    moat_error_free(&e);
    return;
  }
  for (size_t i = 0; i < n; i++) {
    log_info("org %s: finishing its delete", v[i].id);
    if (org_finish_delete(c, v[i].id, &e) < 0) {
      log_error("%s", moat_error_msg(e));
      moat_error_free(&e);
    }
  }
  moat_store_orgs_free(v, n);
}

void ctl_orgs_close(struct moat_control *c) {
  while (c->rates) {
    struct ctl_org_rate *r = c->rates;
    c->rates = r->next;
    free(r->org);
    free(r->t);
    free(r);
  }
  for (size_t i = 0; i < c->n_deleting; i++)
    free(c->deleting_orgs[i]);
  free(c->deleting_orgs);
  c->deleting_orgs = NULL;
  c->n_deleting = 0;
}

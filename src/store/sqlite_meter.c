/* sqlite_meter.c -- the store's metering samples and hourly totals (store.h, "metering") */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "../common/util.h"
#include "sqlite_internal.h"

#define HOUR_MS 3600000LL

void moat_store_meter_samples_free(struct moat_store_meter_sample *v, size_t n) {
  for (size_t i = 0; v && i < n; i++) {
    free(v[i].sandbox_id);
    free(v[i].org);
  }
  free(v);
}

void moat_store_meter_uses_free(struct moat_store_meter_use *v, size_t n) {
  for (size_t i = 0; v && i < n; i++) {
    free(v[i].sandbox_id);
    free(v[i].template_name);
    free(v[i].metadata_json);
    free(v[i].buckets);
  }
  free(v);
}

static void bind_opt(sqlite3_stmt *st, int i, int64_t v) {
  if (v < 0)
    sqlite3_bind_null(st, i);
  else
    sqlite3_bind_int64(st, i, v);
}

static int64_t col_opt(sqlite3_stmt *st, int i) {
  return sqlite3_column_type(st, i) == SQLITE_NULL ? -1 : sqlite3_column_int64(st, i);
}

int moat_store_meter_add(struct moat_store *s, const struct moat_store_meter_sample *v, size_t n,
                         moat_error **err) {
  /* a second sample of the same ms replaces the first: its totals include the first's */
  static const char ins[] =
      "INSERT OR REPLACE INTO meter_samples (sandbox_id, at_ms, org, slot, cpu_counter_ns, cpu_ns, "
      "mem_gib_s, "
      "alive_ms, cpu_pct, cpu_count, mem_used, mem_limit, disk_used, disk_total, net_rx, net_tx) "
      "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)";
  static const char hour[] =
      "INSERT INTO meter_hourly (sandbox_id, hour_ms, org, cpu_ns, mem_gib_s, alive_ms) "
      "VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (sandbox_id, hour_ms) DO UPDATE SET "
      "cpu_ns = max(cpu_ns, excluded.cpu_ns), mem_gib_s = max(mem_gib_s, excluded.mem_gib_s), "
      "alive_ms = max(alive_ms, excluded.alive_ms)";
  pthread_mutex_lock(&s->lock);
  int ret = -1;
  if (sql_begin(s, err) < 0)
    goto out;
  for (size_t i = 0; i < n; i++) {
    const struct moat_store_meter_sample *m = &v[i];
    sqlite3_stmt *st = sql_stmt(s, ins, err);
    if (!st)
      goto fail;
    sql_bind_text(st, 1, m->sandbox_id);
    sqlite3_bind_int64(st, 2, m->at_ms);
    sql_bind_text(st, 3, m->org);
    sqlite3_bind_int(st, 4, m->slot);
    sqlite3_bind_int64(st, 5, (int64_t)m->cpu_counter_ns);
    sqlite3_bind_int64(st, 6, (int64_t)m->cpu_ns);
    sqlite3_bind_double(st, 7, m->mem_gib_s);
    sqlite3_bind_int64(st, 8, m->alive_ms);
    sqlite3_bind_double(st, 9, m->cpu_pct);
    sqlite3_bind_double(st, 10, m->cpu_count);
    sqlite3_bind_int64(st, 11, (int64_t)m->mem_used);
    sqlite3_bind_int64(st, 12, (int64_t)m->mem_limit);
    bind_opt(st, 13, m->disk_used);
    bind_opt(st, 14, m->disk_total);
    bind_opt(st, 15, m->net_rx);
    bind_opt(st, 16, m->net_tx);
    if (sql_step_done(s, st, err, "record a meter sample") < 0)
      goto fail;
    st = sql_stmt(s, hour, err);
    if (!st)
      goto fail;
    sql_bind_text(st, 1, m->sandbox_id);
    sqlite3_bind_int64(st, 2, m->at_ms - m->at_ms % HOUR_MS);
    sql_bind_text(st, 3, m->org);
    sqlite3_bind_int64(st, 4, (int64_t)m->cpu_ns);
    sqlite3_bind_double(st, 5, m->mem_gib_s);
    sqlite3_bind_int64(st, 6, m->alive_ms);
    if (sql_step_done(s, st, err, "record an hour's meter totals") < 0)
      goto fail;
  }
  ret = sql_commit(s, err);
  goto out;
fail:
  sql_rollback(s);
out:
  pthread_mutex_unlock(&s->lock);
  return ret;
}

#define SAMPLE_COLS                                                                                          \
  "sandbox_id, at_ms, org, slot, cpu_counter_ns, cpu_ns, mem_gib_s, alive_ms, cpu_pct, cpu_count, "          \
  "mem_used, "                                                                                               \
  "mem_limit, disk_used, disk_total, net_rx, net_tx"

static void sample_from_row(sqlite3_stmt *st, struct moat_store_meter_sample *m) {
  *m = (struct moat_store_meter_sample){.sandbox_id = sql_col_text(st, 0),
                                        .at_ms = sqlite3_column_int64(st, 1),
                                        .org = sql_col_text(st, 2),
                                        .slot = sqlite3_column_int(st, 3),
                                        .cpu_counter_ns = (uint64_t)sqlite3_column_int64(st, 4),
                                        .cpu_ns = (uint64_t)sqlite3_column_int64(st, 5),
                                        .mem_gib_s = sqlite3_column_double(st, 6),
                                        .alive_ms = sqlite3_column_int64(st, 7),
                                        .cpu_pct = sqlite3_column_double(st, 8),
                                        .cpu_count = sqlite3_column_double(st, 9),
                                        .mem_used = (uint64_t)sqlite3_column_int64(st, 10),
                                        .mem_limit = (uint64_t)sqlite3_column_int64(st, 11),
                                        .disk_used = col_opt(st, 12),
                                        .disk_total = col_opt(st, 13),
                                        .net_rx = col_opt(st, 14),
                                        .net_tx = col_opt(st, 15)};
}

int moat_store_meter_last(struct moat_store *s, const char *sandbox_id, struct moat_store_meter_sample *out,
                          moat_error **err) {
  static const char sql[] =
      "SELECT " SAMPLE_COLS " FROM meter_samples WHERE sandbox_id = ?1 ORDER BY at_ms DESC LIMIT 1";
  memset(out, 0, sizeof(*out));
  pthread_mutex_lock(&s->lock);
  int ret = -1;
  sqlite3_stmt *st = sql_stmt(s, sql, err);
  if (st) {
    sql_bind_text(st, 1, sandbox_id);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
      sample_from_row(st, out);
      ret = 0;
    } else if (rc == SQLITE_DONE) {
      moat_error_set(err, ENOENT, "no meter sample of %s", sandbox_id);
    } else {
      sql_db_error(s, rc, err, "read a meter sample");
    }
    sqlite3_reset(st);
  }
  pthread_mutex_unlock(&s->lock);
  return ret;
}

int moat_store_meter_series(struct moat_store *s, const char *org, const char *sandbox_id, int64_t from_ms,
                            int64_t to_ms, unsigned limit, struct moat_store_meter_sample **out, size_t *n,
                            moat_error **err) {
  static const char sql[] = "SELECT " SAMPLE_COLS " FROM meter_samples WHERE sandbox_id = ?1 AND org = ?2 "
                            "AND at_ms >= ?3 AND at_ms < ?4 ORDER BY at_ms LIMIT ?5";
  *out = NULL;
  *n = 0;
  pthread_mutex_lock(&s->lock);
  int ret = -1;
  sqlite3_stmt *st = sql_stmt(s, sql, err);
  if (!st)
    goto out;
  sql_bind_text(st, 1, sandbox_id);
  sql_bind_text(st, 2, org);
  sqlite3_bind_int64(st, 3, from_ms);
  sqlite3_bind_int64(st, 4, to_ms);
  sqlite3_bind_int64(st, 5, limit);
  struct moat_store_meter_sample *v = NULL;
  size_t len = 0, cap = 0;
  int rc = sql_collect(st, v, len, cap, 64, sample_from_row);
  if (rc != SQLITE_DONE) {
    sql_db_error(s, rc, err, "list meter samples");
    moat_store_meter_samples_free(v, len);
    goto out;
  }
  *out = v;
  *n = len;
  ret = 0;
out:
  pthread_mutex_unlock(&s->lock);
  return ret;
}

struct totals {
  uint64_t cpu_ns;
  double mem_gib_s;
  int64_t alive_ms;
};

/* The sandbox's totals as of t: its last sample before t, else (pruned) its last hour that ended
 * by t; zero when it has neither. s->lock held. */
static int totals_at(struct moat_store *s, const char *id, int64_t t, struct totals *out, moat_error **err) {
  static const char raw[] = "SELECT cpu_ns, mem_gib_s, alive_ms FROM meter_samples WHERE sandbox_id = ?1 "
                            "AND at_ms < ?2 ORDER BY at_ms DESC LIMIT 1";
  static const char hour[] = "SELECT cpu_ns, mem_gib_s, alive_ms FROM meter_hourly WHERE sandbox_id = ?1 "
                             "AND hour_ms <= ?2 ORDER BY hour_ms DESC LIMIT 1";
  memset(out, 0, sizeof(*out));
  for (int k = 0; k < 2; k++) {
    sqlite3_stmt *st = sql_stmt(s, k == 0 ? raw : hour, err);
    if (!st)
      return -1;
    sql_bind_text(st, 1, id);
    sqlite3_bind_int64(st, 2, k == 0 ? t : t - HOUR_MS);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
      struct totals v = {(uint64_t)sqlite3_column_int64(st, 0), sqlite3_column_double(st, 1),
                         sqlite3_column_int64(st, 2)};
      sqlite3_reset(st);
      if (v.cpu_ns >= out->cpu_ns && v.alive_ms >= out->alive_ms)
        *out = v;
      if (k == 0)
        return 0; /* a sample is never older than its hour's totals */
      continue;
    }
    sqlite3_reset(st);
    if (rc != SQLITE_DONE)
      return sql_db_error(s, rc, err, "read meter totals");
  }
  return 0;
}

static int64_t floor_to(int64_t t, int64_t w) { return t - ((t % w) + w) % w; }

static void bucket_add(struct moat_store_meter_use *u, size_t *cap, int64_t start, const struct totals *d) {
  if (d->cpu_ns == 0 && d->mem_gib_s == 0 && d->alive_ms == 0)
    return;
  struct moat_store_meter_bucket *last = u->n_buckets ? &u->buckets[u->n_buckets - 1] : NULL;
  if (!last || last->start_ms != start) {
    if (u->n_buckets == *cap) {
      *cap = *cap ? *cap * 2 : 16;
      u->buckets = xrealloc(u->buckets, *cap * sizeof(*u->buckets));
    }
    last = &u->buckets[u->n_buckets++];
    *last = (struct moat_store_meter_bucket){.start_ms = start};
  }
  last->cpu_ns += d->cpu_ns;
  last->mem_gib_s += d->mem_gib_s;
  last->alive_ms += d->alive_ms;
}

/* u's use per bucket of w over [from, to), given its totals a at from and b at to. A bucket's end
 * totals are the largest of its samples' and of the hourly rows of the hours that ended in it (a
 * row stands for the hour's last ms), as totals_at reads them; the raw samples are served by their
 * primary key (sandbox_id, at_ms), the hourly rows by theirs (sandbox_id, hour_ms). s->lock held. */
static int use_buckets(struct moat_store *s, struct moat_store_meter_use *u, int64_t from, int64_t to,
                       int64_t w, const struct totals *a, const struct totals *b, moat_error **err) {
  static const char sql[] =
      "SELECT k, max(c), max(m), max(a) FROM ("
      "SELECT (at_ms - ?2) / ?5 AS k, cpu_ns c, mem_gib_s m, alive_ms a FROM meter_samples "
      "WHERE sandbox_id = ?1 AND at_ms >= ?3 AND at_ms < ?4 UNION ALL "
      "SELECT (hour_ms + ?8 - ?2) / ?5, cpu_ns, mem_gib_s, alive_ms FROM meter_hourly "
      "WHERE sandbox_id = ?1 AND hour_ms >= ?6 AND hour_ms < ?7) GROUP BY k ORDER BY k";
  int64_t origin = floor_to(from, w);
  sqlite3_stmt *st = sql_stmt(s, sql, err);
  if (!st)
    return -1;
  sql_bind_text(st, 1, u->sandbox_id);
  sqlite3_bind_int64(st, 2, origin);
  sqlite3_bind_int64(st, 3, from);
  sqlite3_bind_int64(st, 4, to);
  sqlite3_bind_int64(st, 5, w);
  sqlite3_bind_int64(st, 6, from - (HOUR_MS - 1));
  sqlite3_bind_int64(st, 7, to - (HOUR_MS - 1));
  sqlite3_bind_int64(st, 8, HOUR_MS - 1);
  struct totals cur = *a;
  size_t cap = 0;
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    uint64_t c = (uint64_t)sqlite3_column_int64(st, 1);
    double m = sqlite3_column_double(st, 2);
    int64_t al = sqlite3_column_int64(st, 3);
    /* running totals never fall; none passes the totals at to */
    struct totals nx = {c > cur.cpu_ns ? (c < b->cpu_ns ? c : b->cpu_ns) : cur.cpu_ns,
                        m > cur.mem_gib_s ? (m < b->mem_gib_s ? m : b->mem_gib_s) : cur.mem_gib_s,
                        al > cur.alive_ms ? (al < b->alive_ms ? al : b->alive_ms) : cur.alive_ms};
    struct totals d = {nx.cpu_ns - cur.cpu_ns, nx.mem_gib_s - cur.mem_gib_s, nx.alive_ms - cur.alive_ms};
    bucket_add(u, &cap, origin + sqlite3_column_int64(st, 0) * w, &d);
    cur = nx;
  }
  sqlite3_reset(st);
  if (rc != SQLITE_DONE)
    return sql_db_error(s, rc, err, "sum meter samples per bucket");
  /* what the buckets' ends did not reach (none when the rows agree with totals_at) goes in the last */
  struct totals rest = {b->cpu_ns > cur.cpu_ns ? b->cpu_ns - cur.cpu_ns : 0,
                        b->mem_gib_s > cur.mem_gib_s ? b->mem_gib_s - cur.mem_gib_s : 0,
                        b->alive_ms > cur.alive_ms ? b->alive_ms - cur.alive_ms : 0};
  if (to > from)
    bucket_add(u, &cap, floor_to(to - 1, w), &rest);
  return 0;
}

static int usage(struct moat_store *s, const char *org, int64_t from_ms, int64_t to_ms, int64_t bucket_ms,
                 struct moat_store_meter_use **out, size_t *n, moat_error **err) {
  /* the sandboxes with a sample in an hour that overlaps the range */
  static const char set[] =
      "SELECT h.sandbox_id, s.template, s.metadata FROM (SELECT DISTINCT sandbox_id FROM meter_hourly "
      "WHERE org = ?1 AND hour_ms >= ?2 AND hour_ms < ?3) h LEFT JOIN sandboxes s ON s.id = h.sandbox_id";
  *out = NULL;
  *n = 0;
  pthread_mutex_lock(&s->lock);
  int ret = -1;
  struct moat_store_meter_use *v = NULL;
  size_t len = 0, cap = 0;
  sqlite3_stmt *st = sql_stmt(s, set, err);
  if (!st)
    goto out;
  sql_bind_text(st, 1, org);
  sqlite3_bind_int64(st, 2, from_ms - from_ms % HOUR_MS);
  sqlite3_bind_int64(st, 3, to_ms);
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    if (len == cap) {
      cap = cap ? cap * 2 : 64;
      v = xrealloc(v, cap * sizeof(*v));
    }
    v[len++] = (struct moat_store_meter_use){.sandbox_id = sql_col_text(st, 0),
                                             .template_name = sql_col_text(st, 1),
                                             .metadata_json = sql_col_text(st, 2)};
  }
  sqlite3_reset(st);
  if (rc != SQLITE_DONE) {
    sql_db_error(s, rc, err, "list metered sandboxes");
    goto fail;
  }
  for (size_t i = 0; i < len; i++) {
    struct totals a, b;
    if (totals_at(s, v[i].sandbox_id, from_ms, &a, err) < 0 ||
        totals_at(s, v[i].sandbox_id, to_ms, &b, err) < 0)
      goto fail;
    v[i].cpu_ns = b.cpu_ns > a.cpu_ns ? b.cpu_ns - a.cpu_ns : 0;
    v[i].mem_gib_s = b.mem_gib_s > a.mem_gib_s ? b.mem_gib_s - a.mem_gib_s : 0;
    v[i].alive_ms = b.alive_ms > a.alive_ms ? b.alive_ms - a.alive_ms : 0;
    if (bucket_ms > 0 && (v[i].cpu_ns || v[i].mem_gib_s > 0 || v[i].alive_ms) &&
        use_buckets(s, &v[i], from_ms, to_ms, bucket_ms, &a, &b, err) < 0)
      goto fail;
  }
  *out = v;
  *n = len;
  v = NULL;
  ret = 0;
  goto out;
fail:
  moat_store_meter_uses_free(v, len);
out:
  pthread_mutex_unlock(&s->lock);
  return ret;
}

int moat_store_meter_usage(struct moat_store *s, const char *org, int64_t from_ms, int64_t to_ms,
                           struct moat_store_meter_use **out, size_t *n, moat_error **err) {
  return usage(s, org, from_ms, to_ms, 0, out, n, err);
}

int moat_store_meter_usage_series(struct moat_store *s, const char *org, int64_t from_ms, int64_t to_ms,
                                  int64_t bucket_ms, struct moat_store_meter_use **out, size_t *n,
                                  moat_error **err) {
  if (bucket_ms <= 0)
    return moat_error_set(err, EINVAL, "a bucket of %lld ms", (long long)bucket_ms);
  return usage(s, org, from_ms, to_ms, bucket_ms, out, n, err);
}

int moat_store_meter_org_totals(struct moat_store *s, struct moat_store_meter_org **out, size_t *n,
                                moat_error **err) {
  static const char sql[] = "SELECT org, sum(c), sum(m) FROM (SELECT org, max(cpu_ns) c, max(mem_gib_s) m "
                            "FROM meter_hourly GROUP BY sandbox_id) GROUP BY org";
  *out = NULL;
  *n = 0;
  pthread_mutex_lock(&s->lock);
  int ret = -1;
  sqlite3_stmt *st = sql_stmt(s, sql, err);
  if (st) {
    struct moat_store_meter_org *v = NULL;
    size_t len = 0, cap = 0;
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
      if (len == cap) {
        cap = cap ? cap * 2 : 8;
        v = xrealloc(v, cap * sizeof(*v));
      }
      v[len++] = (struct moat_store_meter_org){.org = sql_col_text(st, 0),
                                               .cpu_ns = (uint64_t)sqlite3_column_int64(st, 1),
                                               .mem_gib_s = sqlite3_column_double(st, 2)};
    }
    sqlite3_reset(st);
    if (rc == SQLITE_DONE) {
      *out = v;
      *n = len;
      ret = 0;
    } else {
      sql_db_error(s, rc, err, "sum meter totals");
      for (size_t i = 0; i < len; i++)
        free(v[i].org);
      free(v);
    }
  }
  pthread_mutex_unlock(&s->lock);
  return ret;
}

int moat_store_meter_prune(struct moat_store *s, int64_t before_ms, int64_t hours_before_ms,
                           moat_error **err) {
  static const char raw[] = "DELETE FROM meter_samples WHERE at_ms < ?1";
  static const char hour[] = "DELETE FROM meter_hourly WHERE hour_ms < ?1";
  pthread_mutex_lock(&s->lock);
  int ret = -1;
  sqlite3_stmt *st = sql_stmt(s, raw, err);
  if (st) {
    sqlite3_bind_int64(st, 1, before_ms);
    if (sql_step_done(s, st, err, "prune meter samples") == 0) {
      ret = sqlite3_changes(s->db);
      st = sql_stmt(s, hour, err);
      if (st)
        sqlite3_bind_int64(st, 1, hours_before_ms);
      if (!st || sql_step_done(s, st, err, "prune hourly meter totals") < 0)
        ret = -1;
      else
        ret += sqlite3_changes(s->db);
    }
  }
  pthread_mutex_unlock(&s->lock);
  return ret;
}

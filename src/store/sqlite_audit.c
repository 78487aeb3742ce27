/* sqlite_audit.c -- the store's audit log (store.h, "the audit log") */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "../common/util.h"
#include "sqlite_internal.h"

void moat_store_audit_free(struct moat_store_audit *v, size_t n) {
  for (size_t i = 0; v && i < n; i++) {
    free(v[i].org);
    free(v[i].key_id);
    free(v[i].method);
    free(v[i].route);
    free(v[i].path);
    free(v[i].target);
  }
  free(v);
}

int moat_store_audit_add(struct moat_store *s, const struct moat_store_audit *a, size_t n, moat_error **err) {
  static const char sql[] = "INSERT INTO audit (at_ms, org, key_id, method, route, path, target, status) "
                            "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)";
  pthread_mutex_lock(&s->lock);
  int ret = -1;
  if (sql_begin(s, err) < 0)
    goto out;
  for (size_t i = 0; i < n; i++) {
    sqlite3_stmt *st = sql_stmt(s, sql, err);
    if (!st)
      goto fail;
    sqlite3_bind_int64(st, 1, a[i].at_ms);
    sql_bind_text(st, 2, a[i].org);
    sql_bind_text(st, 3, a[i].key_id);
    sql_bind_text(st, 4, a[i].method);
    sql_bind_text(st, 5, a[i].route);
    sql_bind_text(st, 6, a[i].path);
    sql_bind_text(st, 7, a[i].target);
    sqlite3_bind_int(st, 8, a[i].status);
    if (sql_step_done(s, st, err, "record an audit entry") < 0)
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

int moat_store_audit_list(struct moat_store *s, const struct moat_store_audit_query *q,
                          struct moat_store_audit **out, size_t *n, moat_error **err) {
  static const char sql[] =
      "SELECT seq, at_ms, org, key_id, method, route, path, target, status FROM audit "
      "WHERE org = ?1 AND at_ms >= ?2 AND at_ms < ?3 AND seq > ?4 AND (?5 IS NULL OR target = ?5) "
      "AND (?6 IS NULL OR key_id = ?6) ORDER BY seq LIMIT ?7";
  *out = NULL;
  *n = 0;
  pthread_mutex_lock(&s->lock);
  int ret = -1;
  sqlite3_stmt *st = sql_stmt(s, sql, err);
  if (!st)
    goto out;
  sql_bind_text(st, 1, q->org);
  sqlite3_bind_int64(st, 2, q->from_ms);
  sqlite3_bind_int64(st, 3, q->to_ms);
  sqlite3_bind_int64(st, 4, (int64_t)q->after);
  sql_bind_text(st, 5, q->target);
  sql_bind_text(st, 6, q->key_id);
  sqlite3_bind_int64(st, 7, q->limit);
  struct moat_store_audit *v = NULL;
  size_t len = 0, cap = 0;
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    if (len == cap) {
      cap = cap ? cap * 2 : 16;
      v = xrealloc(v, cap * sizeof(*v));
    }
    v[len++] = (struct moat_store_audit){.seq = (uint64_t)sqlite3_column_int64(st, 0),
                                         .at_ms = sqlite3_column_int64(st, 1),
                                         .org = sql_col_text(st, 2),
                                         .key_id = sql_col_text(st, 3),
                                         .method = sql_col_text(st, 4),
                                         .route = sql_col_text(st, 5),
                                         .path = sql_col_text(st, 6),
                                         .target = sql_col_text(st, 7),
                                         .status = sqlite3_column_int(st, 8)};
  }
  if (rc != SQLITE_DONE) {
    sql_db_error(s, rc, err, "list the audit log");
    moat_store_audit_free(v, len);
    goto out;
  }
  *out = v;
  *n = len;
  ret = 0;
out:
  pthread_mutex_unlock(&s->lock);
  return ret;
}

int moat_store_audit_prune(struct moat_store *s, int64_t before_ms, moat_error **err) {
  static const char sql[] = "DELETE FROM audit WHERE at_ms < ?1";
  pthread_mutex_lock(&s->lock);
  int ret = -1;
  sqlite3_stmt *st = sql_stmt(s, sql, err);
  if (st) {
    sqlite3_bind_int64(st, 1, before_ms);
    if (sql_step_done(s, st, err, "prune the audit log") == 0)
      ret = sqlite3_changes(s->db);
  }
  pthread_mutex_unlock(&s->lock);
  return ret;
}

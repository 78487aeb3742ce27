/* sqlite_orgs.c -- the store's orgs (store.h): rows of orgs with their quotas and the state of a
 * delete. A deleted org keeps its row; its keys go when its delete begins. */
#include <errno.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <string.h>

#include "../common/util.h"
#include "sqlite_internal.h"

#define ORG_COLS "id, created_at_ms, deleting_at_ms, deleted_at_ms, quotas"

void moat_store_org_clear(struct moat_store_org *o) {
  if (!o)
    return;
  free(o->id);
  free(o->quotas_json);
  memset(o, 0, sizeof(*o));
}

void moat_store_orgs_free(struct moat_store_org *v, size_t n) {
  for (size_t i = 0; v && i < n; i++)
    moat_store_org_clear(&v[i]);
  free(v);
}

static void org_row(sqlite3_stmt *st, struct moat_store_org *o) {
  o->id = sql_col_text(st, 0);
  o->created_at_ms = sqlite3_column_int64(st, 1);
  o->deleting_at_ms = sqlite3_column_int64(st, 2);
  o->deleted_at_ms = sqlite3_column_int64(st, 3);
  o->quotas_json = sql_col_text(st, 4);
  if (!o->quotas_json)
    o->quotas_json = xstrdup("{}");
}

int moat_store_org_create(struct moat_store *s, const char *id, int64_t at_ms, moat_error **err) {
  static const char sql[] =
      "INSERT INTO orgs (id, created_at_ms) VALUES (?1, ?2) ON CONFLICT(id) DO UPDATE SET"
      " created_at_ms = ?2, quotas = '{}', deleting_at_ms = 0, deleted_at_ms = 0 WHERE deleted_at_ms > 0";
  pthread_mutex_lock(&s->lock);
  sqlite3_stmt *st = sql_stmt(s, sql, err);
  if (st) {
    sql_bind_text(st, 1, id);
    sqlite3_bind_int64(st, 2, at_ms);
  }
  int ret = sql_change_one(s, st, err, "create org", EEXIST, "org '%.64s' exists", id);
  pthread_mutex_unlock(&s->lock);
  return ret;
}

int moat_store_org_get(struct moat_store *s, const char *id, struct moat_store_org *out, moat_error **err) {
  static const char sql[] = "SELECT " ORG_COLS " FROM orgs WHERE id = ?1";
  int ret = -1;
  memset(out, 0, sizeof(*out));
  pthread_mutex_lock(&s->lock);
  sqlite3_stmt *st = sql_stmt(s, sql, err);
  if (st) {
    sql_bind_text(st, 1, id);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
      org_row(st, out);
      ret = 0;
    } else if (rc == SQLITE_DONE) {
      moat_error_set(err, ENOENT, "no org '%.64s'", id);
    } else {
      sql_db_error(s, rc, err, "get org");
    }
    sqlite3_reset(st);
  }
  pthread_mutex_unlock(&s->lock);
  return ret;
}

int moat_store_org_list(struct moat_store *s, const char *after, unsigned limit, bool deleting,
                        struct moat_store_org **out, size_t *n, moat_error **err) {
  static const char all[] = "SELECT " ORG_COLS " FROM orgs WHERE deleted_at_ms = 0 AND id > ?1"
                            " ORDER BY id LIMIT ?2";
  static const char del[] = "SELECT " ORG_COLS " FROM orgs WHERE deleted_at_ms = 0 AND deleting_at_ms > 0"
                            " AND id > ?1 ORDER BY id LIMIT ?2";
  *out = NULL;
  *n = 0;
  size_t cap = 0;
  struct moat_store_org *v = NULL;
  int ret = -1;
  pthread_mutex_lock(&s->lock);
  sqlite3_stmt *st = sql_stmt(s, deleting ? del : all, err);
  if (!st)
    goto out;
  sql_bind_text(st, 1, after ? after : "");
  sqlite3_bind_int64(st, 2, limit);
  int rc = sql_collect(st, v, *n, cap, 8, org_row);
  if (rc != SQLITE_DONE) {
    sql_db_error(s, rc, err, "list orgs");
    moat_store_orgs_free(v, *n);
    v = NULL;
    *n = 0;
    goto out;
  }
  *out = v;
  ret = 0;
out:
  pthread_mutex_unlock(&s->lock);
  return ret;
}

int moat_store_org_set_quotas(struct moat_store *s, const char *id, const char *quotas_json,
                              moat_error **err) {
  static const char sql[] = "UPDATE orgs SET quotas = ?2 WHERE id = ?1 AND deleted_at_ms = 0";
  pthread_mutex_lock(&s->lock);
  sqlite3_stmt *st = sql_stmt(s, sql, err);
  if (st) {
    sql_bind_text(st, 1, id);
    sql_bind_text(st, 2, quotas_json);
  }
  int ret = sql_change_one(s, st, err, "set quotas", ENOENT, "no org '%.64s'", id);
  pthread_mutex_unlock(&s->lock);
  return ret;
}

int moat_store_org_begin_delete(struct moat_store *s, const char *id, int64_t at_ms, moat_error **err) {
  static const char mark[] = "UPDATE orgs SET deleting_at_ms = ?2 WHERE id = ?1 AND deleted_at_ms = 0"
                             " AND deleting_at_ms = 0";
  static const char keys[] = "DELETE FROM api_keys WHERE org = ?1";
  int ret = -1;
  pthread_mutex_lock(&s->lock);
  if (sql_begin(s, err) < 0)
    goto out;
  sqlite3_stmt *st = sql_stmt(s, mark, err);
  if (!st)
    goto fail;
  sql_bind_text(st, 1, id);
  sqlite3_bind_int64(st, 2, at_ms);
  if (sql_step_done(s, st, err, "mark org deleting") < 0)
    goto fail;
  if (!(st = sql_stmt(s, keys, err)))
    goto fail;
  sql_bind_text(st, 1, id);
  if (sql_step_done(s, st, err, "revoke org's keys") < 0)
    goto fail;
  ret = sql_commit(s, err);
  goto out;
fail:
  sql_rollback(s);
out:
  pthread_mutex_unlock(&s->lock);
  return ret;
}

int moat_store_org_end_delete(struct moat_store *s, const char *id, int64_t at_ms, moat_error **err) {
  static const char sql[] = "UPDATE orgs SET deleted_at_ms = ?2, deleting_at_ms = 0, quotas = '{}'"
                            " WHERE id = ?1";
  int ret = -1;
  pthread_mutex_lock(&s->lock);
  sqlite3_stmt *st = sql_stmt(s, sql, err);
  if (st) {
    sql_bind_text(st, 1, id);
    sqlite3_bind_int64(st, 2, at_ms);
    ret = sql_step_done(s, st, err, "mark org deleted");
  }
  pthread_mutex_unlock(&s->lock);
  return ret;
}

int moat_store_key_exists(struct moat_store *s, const char *id, moat_error **err) {
  static const char sql[] = "SELECT 1 FROM api_keys WHERE id = ?1";
  int ret = -1;
  pthread_mutex_lock(&s->lock);
  sqlite3_stmt *st = sql_stmt(s, sql, err);
  if (st) {
    sql_bind_text(st, 1, id);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW)
      ret = 1;
    else if (rc == SQLITE_DONE)
      ret = 0;
    else
      sql_db_error(s, rc, err, "look up key");
    sqlite3_reset(st);
  }
  pthread_mutex_unlock(&s->lock);
  return ret;
}

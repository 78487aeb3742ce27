/* sqlite_databases.c -- the store's databases table (store.h, "databases") */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "../common/util.h"
#include "sqlite_internal.h"

void moat_store_database_clear(struct moat_store_database *d) {
  if (!d)
    return;
  free(d->id);
  free(d->org);
  free(d->name);
  free(d->metadata_json);
  free(d->role);
  free(d->password);
  free(d->volume);
  free(d->sandbox_id);
  free(d->state);
  memset(d, 0, sizeof(*d));
}

void moat_store_databases_free(struct moat_store_database *v, size_t n) {
  for (size_t i = 0; v && i < n; i++)
    moat_store_database_clear(&v[i]);
  free(v);
}

#define DATABASE_COLS                                                                                        \
  "id, org, name, size_mb, metadata, idle_seconds, role, password, volume, sandbox_id, state, created_at_ms"

static void read_database(sqlite3_stmt *st, struct moat_store_database *d) {
  memset(d, 0, sizeof(*d));
  d->id = sql_col_text(st, 0);
  d->org = sql_col_text(st, 1);
  d->name = sql_col_text(st, 2);
  d->size_mb = (uint64_t)sqlite3_column_int64(st, 3);
  d->metadata_json = sql_col_text(st, 4);
  d->idle_seconds = sqlite3_column_int64(st, 5);
  d->role = sql_col_text(st, 6);
  d->password = sql_col_text(st, 7);
  d->volume = sql_col_text(st, 8);
  d->sandbox_id = sql_col_text(st, 9);
  d->state = sql_col_text(st, 10);
  d->created_at_ms = sqlite3_column_int64(st, 11);
}

int moat_store_database_insert(struct moat_store *s, const struct moat_store_database *d, moat_error **err) {
  static const char sql[] =
      "INSERT INTO databases (" DATABASE_COLS ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)";
  int ret = -1;
  pthread_mutex_lock(&s->lock);
  if (sql_begin(s, err) < 0)
    goto out;
  if (sql_ensure_org(s, d->org, err) < 0)
    goto fail;
  sqlite3_stmt *st = sql_stmt(s, sql, err);
  if (!st)
    goto fail;
  sql_bind_text(st, 1, d->id);
  sql_bind_text(st, 2, d->org);
  sql_bind_text(st, 3, d->name);
  sqlite3_bind_int64(st, 4, (int64_t)d->size_mb);
  sql_bind_text(st, 5, d->metadata_json ? d->metadata_json : "{}");
  sqlite3_bind_int64(st, 6, d->idle_seconds);
  sql_bind_text(st, 7, d->role);
  sql_bind_text(st, 8, d->password);
  sql_bind_text(st, 9, d->volume);
  sql_bind_text(st, 10, d->sandbox_id);
  sql_bind_text(st, 11, d->state);
  sqlite3_bind_int64(st, 12, d->created_at_ms);
  if (sql_step_done(s, st, err, "write database") < 0) {
    if (err && *err && (*err)->status == EEXIST) {
      moat_error_free(err);
      moat_error_set(err, EEXIST, "database '%s' exists", d->name);
    }
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

/* Steps st (bound) for one row into out: 0, -1 ENOENT ("no database WHAT"), or a store error. */
static int one_row(struct moat_store *s, sqlite3_stmt *st, struct moat_store_database *out, const char *what,
                   moat_error **err) {
  int ret = -1;
  int rc = sqlite3_step(st);
  if (rc == SQLITE_ROW) {
    read_database(st, out);
    ret = 0;
  } else if (rc == SQLITE_DONE) {
    moat_error_set(err, ENOENT, "no database %s", what);
  } else {
    sql_db_error(s, rc, err, "read database");
  }
  sqlite3_reset(st);
  return ret;
}

int moat_store_database_get(struct moat_store *s, const char *org, const char *id,
                            struct moat_store_database *out, moat_error **err) {
  static const char sql[] =
      "SELECT " DATABASE_COLS " FROM databases WHERE id = ?1 AND (?2 IS NULL OR org = ?2)";
  pthread_mutex_lock(&s->lock);
  int ret = -1;
  sqlite3_stmt *st = sql_stmt(s, sql, err);
  if (st) {
    sql_bind_text(st, 1, id);
    sql_bind_text(st, 2, org);
    ret = one_row(s, st, out, id, err);
  }
  pthread_mutex_unlock(&s->lock);
  return ret;
}

int moat_store_database_find(struct moat_store *s, const char *org, const char *role, const char *database,
                             struct moat_store_database *out, moat_error **err) {
  static const char sql[] =
      "SELECT " DATABASE_COLS " FROM databases WHERE role = ?1 AND (?2 IS NULL OR org = ?2)";
  const char *keys[2] = {role, database};
  pthread_mutex_lock(&s->lock);
  int ret = -1;
  sqlite3_stmt *st = sql_stmt(s, sql, err);
  for (size_t i = 0; st && i < 2 && ret < 0; i++) {
    if (!keys[i] || !keys[i][0])
      continue;
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    sql_bind_text(st, 1, keys[i]);
    sql_bind_text(st, 2, org);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
      read_database(st, out);
      ret = 0;
    } else if (rc != SQLITE_DONE) {
      sql_db_error(s, rc, err, "find database");
      sqlite3_reset(st);
      pthread_mutex_unlock(&s->lock);
      return -1;
    }
    sqlite3_reset(st);
  }
  if (st && ret < 0)
    moat_error_set(err, ENOENT, "no such database: user \"%.64s\", database \"%.64s\"", role ? role : "",
                   database ? database : (role ? role : ""));
  pthread_mutex_unlock(&s->lock);
  return ret;
}

int moat_store_database_list(struct moat_store *s, const char *org, struct moat_store_database **out,
                             size_t *n, moat_error **err) {
  static const char sql[] =
      "SELECT " DATABASE_COLS " FROM databases WHERE (?1 IS NULL OR org = ?1) ORDER BY created_at_ms, id";
  struct moat_store_database *v = NULL;
  size_t len = 0, cap = 0;
  int ret = -1;
  *out = NULL;
  *n = 0;
  pthread_mutex_lock(&s->lock);
  sqlite3_stmt *st = sql_stmt(s, sql, err);
  if (!st)
    goto out;
  sql_bind_text(st, 1, org);
  int rc = sql_collect(st, v, len, cap, 16, read_database);
  if (rc != SQLITE_DONE) {
    sql_db_error(s, rc, err, "list databases");
    moat_store_databases_free(v, len);
    goto out;
  }
  *out = v;
  *n = len;
  ret = 0;
out:
  pthread_mutex_unlock(&s->lock);
  return ret;
}

int moat_store_database_update(struct moat_store *s, const char *id, const char *state,
                               const char *sandbox_id, moat_error **err) {
  static const char sql[] =
      "UPDATE databases SET state = ?2, sandbox_id = coalesce(?3, sandbox_id) WHERE id = ?1";
  pthread_mutex_lock(&s->lock);
  int ret = -1;
  sqlite3_stmt *st = sql_stmt(s, sql, err);
  if (st) {
    sql_bind_text(st, 1, id);
    sql_bind_text(st, 2, state);
    sql_bind_text(st, 3, sandbox_id);
    if (sql_step_done(s, st, err, "update database") == 0) {
      if (sqlite3_changes(s->db) == 1)
        ret = 0;
      else
        moat_error_set(err, ENOENT, "no database %s", id);
    }
  }
  pthread_mutex_unlock(&s->lock);
  return ret;
}

int moat_store_database_delete(struct moat_store *s, const char *id, moat_error **err) {
  static const char del_att[] = "DELETE FROM database_attachments WHERE database_id = ?1";
  static const char del_row[] = "DELETE FROM databases WHERE id = ?1";
  pthread_mutex_lock(&s->lock);
  int ret = -1;
  if (sql_begin(s, err) < 0)
    goto out;
  sqlite3_stmt *st = sql_stmt(s, del_att, err);
  if (!st)
    goto fail;
  sql_bind_text(st, 1, id);
  if (sql_step_done(s, st, err, "delete database attachments") < 0)
    goto fail;
  if (!(st = sql_stmt(s, del_row, err)))
    goto fail;
  sql_bind_text(st, 1, id);
  if (sql_step_done(s, st, err, "delete database") < 0)
    goto fail;
  if (sqlite3_changes(s->db) != 1) {
    moat_error_set(err, ENOENT, "no database %s", id);
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

/* ---- attachments ---- */

void moat_store_db_attachments_free(struct moat_store_db_attachment *v, size_t n) {
  for (size_t i = 0; v && i < n; i++) {
    free(v[i].sandbox_id);
    free(v[i].env);
    free(v[i].database_id);
  }
  free(v);
}

int moat_store_db_attach(struct moat_store *s, const struct moat_store_db_attachment *a, size_t n,
                         moat_error **err) {
  static const char sql[] = "INSERT OR REPLACE INTO database_attachments (sandbox_id, env, database_id, "
                            "owned) VALUES (?1, ?2, ?3, ?4)";
  pthread_mutex_lock(&s->lock);
  int ret = -1;
  if (sql_begin(s, err) < 0)
    goto out;
  for (size_t i = 0; i < n; i++) {
    sqlite3_stmt *st = sql_stmt(s, sql, err);
    if (!st)
      goto fail;
    sql_bind_text(st, 1, a[i].sandbox_id);
    sql_bind_text(st, 2, a[i].env);
    sql_bind_text(st, 3, a[i].database_id);
    sqlite3_bind_int(st, 4, a[i].owned);
    if (sql_step_done(s, st, err, "record a database attachment") < 0)
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

/* Runs st (bound; columns sandbox_id, env, database_id, owned) into *out. */
static int attachment_rows(struct moat_store *s, sqlite3_stmt *st, struct moat_store_db_attachment **out,
                           size_t *n, moat_error **err) {
  struct moat_store_db_attachment *v = NULL;
  size_t len = 0, cap = 0;
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    if (len == cap) {
      cap = cap ? cap * 2 : 4;
      v = xrealloc(v, cap * sizeof(*v));
    }
    v[len++] = (struct moat_store_db_attachment){.sandbox_id = sql_col_text(st, 0),
                                                 .env = sql_col_text(st, 1),
                                                 .database_id = sql_col_text(st, 2),
                                                 .owned = sqlite3_column_int(st, 3) != 0};
  }
  if (rc != SQLITE_DONE) {
    sql_db_error(s, rc, err, "list database attachments");
    moat_store_db_attachments_free(v, len);
    return -1;
  }
  *out = v;
  *n = len;
  return 0;
}

int moat_store_db_attachments(struct moat_store *s, const char *sandbox_id,
                              struct moat_store_db_attachment **out, size_t *n, moat_error **err) {
  static const char sql[] = "SELECT sandbox_id, env, database_id, owned FROM database_attachments "
                            "WHERE sandbox_id = ?1 ORDER BY env";
  *out = NULL;
  *n = 0;
  pthread_mutex_lock(&s->lock);
  int ret = -1;
  sqlite3_stmt *st = sql_stmt(s, sql, err);
  if (st) {
    sql_bind_text(st, 1, sandbox_id);
    ret = attachment_rows(s, st, out, n, err);
  }
  pthread_mutex_unlock(&s->lock);
  return ret;
}

int moat_store_db_orphans(struct moat_store *s, struct moat_store_db_attachment **out, size_t *n,
                          moat_error **err) {
  static const char sql[] = "SELECT a.sandbox_id, a.env, a.database_id, a.owned FROM database_attachments a "
                            "LEFT JOIN sandboxes b ON b.id = a.sandbox_id WHERE a.owned = 1 AND (b.id IS "
                            "NULL OR b.state = 'killed')";
  *out = NULL;
  *n = 0;
  pthread_mutex_lock(&s->lock);
  int ret = -1;
  sqlite3_stmt *st = sql_stmt(s, sql, err);
  if (st)
    ret = attachment_rows(s, st, out, n, err);
  pthread_mutex_unlock(&s->lock);
  return ret;
}

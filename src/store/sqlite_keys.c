/* sqlite_keys.c -- the store's API keys (store.h): rows of api_keys, looked up by the hash of the key,
 * listed, deleted and touched by id. The key itself is never stored. */
#include <errno.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <string.h>

#include "../common/util.h"
#include "sqlite_internal.h"

#define KEY_COLS "id, org, name, role, created_at_ms, expires_at_ms, last_used_at_ms"

void moat_store_key_clear(struct moat_store_key *k) {
  if (!k)
    return;
  free(k->id);
  free(k->org);
  free(k->name);
  free(k->role);
  memset(k, 0, sizeof(*k));
}

void moat_store_keys_free(struct moat_store_key *v, size_t n) {
  for (size_t i = 0; v && i < n; i++)
    moat_store_key_clear(&v[i]);
  free(v);
}

static void key_row(sqlite3_stmt *st, struct moat_store_key *k) {
  k->id = sql_col_text(st, 0);
  k->org = sql_col_text(st, 1);
  k->name = sql_col_text(st, 2);
  k->role = sql_col_text(st, 3);
  k->created_at_ms = sqlite3_column_int64(st, 4);
  k->expires_at_ms = sqlite3_column_int64(st, 5);
  k->last_used_at_ms = sqlite3_column_int64(st, 6);
}

/* Inserts k. Lock held, in a transaction. */
static int insert_locked(struct moat_store *s, const struct moat_store_key *k, const char *hash,
                         moat_error **err) {
  static const char ins[] =
      "INSERT INTO api_keys (key_hash, org, created_at_ms, id, name, role, expires_at_ms)"
      " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)";
  static const char busy[] = "SELECT deleting_at_ms FROM orgs WHERE id = ?1";
  static const char revive[] = "UPDATE orgs SET deleted_at_ms = 0, quotas = '{}', created_at_ms = ?2"
                               " WHERE id = ?1 AND deleted_at_ms > 0";
  if (sql_ensure_org(s, k->org, err) < 0)
    return -1;
  /* a key of an org being deleted would outlive it; a key of a deleted org makes it anew */
  sqlite3_stmt *st = sql_stmt(s, busy, err);
  if (!st)
    return -1;
  sql_bind_text(st, 1, k->org);
  int rc = sqlite3_step(st);
  bool deleting = rc == SQLITE_ROW && sqlite3_column_int64(st, 0) > 0;
  sqlite3_reset(st);
  if (rc != SQLITE_ROW && rc != SQLITE_DONE)
    return sql_db_error(s, rc, err, "look up org");
  if (deleting)
    return moat_error_set(err, EBUSY, "org %s is being deleted", k->org);
  if (!(st = sql_stmt(s, revive, err)))
    return -1;
  sql_bind_text(st, 1, k->org);
  sqlite3_bind_int64(st, 2, now_unix_ms());
  if (sql_step_done(s, st, err, "make org anew") < 0)
    return -1;
  st = sql_stmt(s, ins, err);
  if (!st)
    return -1;
  sql_bind_text(st, 1, hash);
  sql_bind_text(st, 2, k->org);
  sqlite3_bind_int64(st, 3, k->created_at_ms ? k->created_at_ms : now_unix_ms());
  sql_bind_text(st, 4, k->id);
  sql_bind_text(st, 5, k->name ? k->name : "");
  sql_bind_text(st, 6, k->role);
  sqlite3_bind_int64(st, 7, k->expires_at_ms);
  return sql_step_done(s, st, err, "insert key");
}

int moat_store_key_add(struct moat_store *s, const char *org, const char *key_hash_hex, moat_error **err) {
  static const char sel[] = "SELECT org FROM api_keys WHERE key_hash = ?1";
  char id[4 + 16 + 1] = "key-";
  random_id(id + 4, 16);
  struct moat_store_key k = {.id = id, .org = (char *)org, .name = "default", .role = "admin"};
  int ret = -1;
  pthread_mutex_lock(&s->lock);
  if (sql_begin(s, err) < 0)
    goto out;
  sqlite3_stmt *st = sql_stmt(s, sel, err);
  if (!st)
    goto fail;
  sql_bind_text(st, 1, key_hash_hex);
  int rc = sqlite3_step(st);
  if (rc == SQLITE_ROW) {
    bool same = strcmp((const char *)sqlite3_column_text(st, 0), org) == 0;
    sqlite3_reset(st);
    if (!same) {
      moat_error_set(err, EEXIST, "api key belongs to another org");
      goto fail;
    }
    ret = sql_commit(s, err);
    goto out;
  }
  sqlite3_reset(st);
  if (rc != SQLITE_DONE) {
    sql_db_error(s, rc, err, "look up key");
    goto fail;
  }
  if (insert_locked(s, &k, key_hash_hex, err) < 0)
    goto fail;
  ret = sql_commit(s, err);
  goto out;
fail:
  sql_rollback(s);
out:
  pthread_mutex_unlock(&s->lock);
  return ret;
}

int moat_store_key_insert(struct moat_store *s, const struct moat_store_key *k, const char *key_hash_hex,
                          moat_error **err) {
  int ret = -1;
  pthread_mutex_lock(&s->lock);
  if (sql_begin(s, err) < 0)
    goto out;
  if (insert_locked(s, k, key_hash_hex, err) < 0) {
    sql_rollback(s);
    goto out;
  }
  ret = sql_commit(s, err);
out:
  pthread_mutex_unlock(&s->lock);
  return ret;
}

int moat_store_key_lookup(struct moat_store *s, const char *key_hash_hex, char **org, moat_error **err) {
  struct moat_store_key k = {0};
  if (moat_store_key_get(s, key_hash_hex, &k, err) < 0)
    return -1;
  *org = steal_pointer(&k.org);
  moat_store_key_clear(&k);
  return 0;
}

int moat_store_key_get(struct moat_store *s, const char *key_hash_hex, struct moat_store_key *out,
                       moat_error **err) {
  static const char sql[] = "SELECT " KEY_COLS " FROM api_keys WHERE key_hash = ?1";
  int ret = -1;
  memset(out, 0, sizeof(*out));
  pthread_mutex_lock(&s->lock);
  sqlite3_stmt *st = sql_stmt(s, sql, err);
  if (st) {
    sql_bind_text(st, 1, key_hash_hex);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
      key_row(st, out);
      ret = 0;
    } else if (rc == SQLITE_DONE) {
      moat_error_set(err, ENOENT, "unknown api key");
    } else {
      sql_db_error(s, rc, err, "look up key");
    }
    sqlite3_reset(st);
  }
  pthread_mutex_unlock(&s->lock);
  return ret;
}

int moat_store_key_list(struct moat_store *s, const char *org, struct moat_store_key **out, size_t *n,
                        moat_error **err) {
  static const char sql[] = "SELECT " KEY_COLS " FROM api_keys WHERE org = ?1 ORDER BY created_at_ms, id";
  *out = NULL;
  *n = 0;
  size_t cap = 0;
  struct moat_store_key *v = NULL;
  int ret = -1;
  pthread_mutex_lock(&s->lock);
  sqlite3_stmt *st = sql_stmt(s, sql, err);
  if (!st)
    goto out;
  sql_bind_text(st, 1, org);
  int rc = sql_collect(st, v, *n, cap, 8, key_row);
  if (rc != SQLITE_DONE) {
    sql_db_error(s, rc, err, "list keys");
    moat_store_keys_free(v, *n);
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

int moat_store_key_delete(struct moat_store *s, const char *org, const char *id, moat_error **err) {
  static const char sql[] = "DELETE FROM api_keys WHERE org = ?1 AND id = ?2";
  pthread_mutex_lock(&s->lock);
  sqlite3_stmt *st = sql_stmt(s, sql, err);
  if (st) {
    sql_bind_text(st, 1, org);
    sql_bind_text(st, 2, id);
  }
  int ret = sql_change_one(s, st, err, "delete key", ENOENT, "no API key '%.64s'", id);
  pthread_mutex_unlock(&s->lock);
  return ret;
}

int moat_store_key_touch(struct moat_store *s, const char *id, int64_t at_ms, moat_error **err) {
  static const char sql[] = "UPDATE api_keys SET last_used_at_ms = ?2 WHERE id = ?1";
  int ret = -1;
  pthread_mutex_lock(&s->lock);
  sqlite3_stmt *st = sql_stmt(s, sql, err);
  if (st) {
    sql_bind_text(st, 1, id);
    sqlite3_bind_int64(st, 2, at_ms);
    ret = sql_step_done(s, st, err, "touch key");
  }
  pthread_mutex_unlock(&s->lock);
  return ret;
}

/* sqlite_templates.c -- the store's templates table (store.h, "templates") */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "../common/util.h"
#include "sqlite_internal.h"

void moat_store_template_clear(struct moat_store_template *t) {
  if (!t)
    return;
  free(t->org);
  free(t->name);
  free(t->state);
  free(t->build_id);
  free(t->image);
  free(t->layers_json);
  free(t->source);
  free(t->from_ref);
  free(t->config_json);
  free(t->error);
  memset(t, 0, sizeof(*t));
}

void moat_store_templates_free(struct moat_store_template *v, size_t n) {
  for (size_t i = 0; v && i < n; i++)
    moat_store_template_clear(&v[i]);
  free(v);
}

#define TEMPLATE_COLS                                                                                        \
  "org, name, state, build_id, image, layers, source, from_ref, config, size_bytes, error, created_at_ms, "  \
  "updated_at_ms"

static void read_template(sqlite3_stmt *st, struct moat_store_template *t) {
  memset(t, 0, sizeof(*t));
  t->org = sql_col_text(st, 0);
  t->name = sql_col_text(st, 1);
  t->state = sql_col_text(st, 2);
  t->build_id = sql_col_text(st, 3);
  t->image = sql_col_text(st, 4);
  t->layers_json = sql_col_text(st, 5);
  t->source = sql_col_text(st, 6);
  t->from_ref = sql_col_text(st, 7);
  t->config_json = sql_col_text(st, 8);
  t->size_bytes = (uint64_t)sqlite3_column_int64(st, 9);
  t->error = sql_col_text(st, 10);
  t->created_at_ms = sqlite3_column_int64(st, 11);
  t->updated_at_ms = sqlite3_column_int64(st, 12);
}

int moat_store_template_put(struct moat_store *s, const struct moat_store_template *t, moat_error **err) {
  static const char sql[] = "INSERT OR REPLACE INTO templates (" TEMPLATE_COLS
                            ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)";
  int ret = -1;
  pthread_mutex_lock(&s->lock);
  if (sql_begin(s, err) < 0)
    goto out;
  if (sql_ensure_org(s, t->org, err) < 0)
    goto fail;
  sqlite3_stmt *st = sql_stmt(s, sql, err);
  if (!st)
    goto fail;
  sql_bind_text(st, 1, t->org);
  sql_bind_text(st, 2, t->name);
  sql_bind_text(st, 3, t->state);
  sql_bind_text(st, 4, t->build_id);
  sql_bind_text(st, 5, t->image);
  sql_bind_text(st, 6, t->layers_json ? t->layers_json : "[]");
  sql_bind_text(st, 7, t->source);
  sql_bind_text(st, 8, t->from_ref);
  sql_bind_text(st, 9, t->config_json ? t->config_json : "{}");
  sqlite3_bind_int64(st, 10, (int64_t)t->size_bytes);
  sql_bind_text(st, 11, t->error);
  sqlite3_bind_int64(st, 12, t->created_at_ms);
  sqlite3_bind_int64(st, 13, t->updated_at_ms);
  if (sql_step_done(s, st, err, "write template") < 0)
    goto fail;
  ret = sql_commit(s, err);
  goto out;
fail:
  sql_rollback(s);
out:
  pthread_mutex_unlock(&s->lock);
  return ret;
}

int moat_store_template_get(struct moat_store *s, const char *org, const char *name,
                            struct moat_store_template *out, moat_error **err) {
  static const char sql[] = "SELECT " TEMPLATE_COLS " FROM templates WHERE org = ?1 AND name = ?2";
  pthread_mutex_lock(&s->lock);
  int ret = -1;
  sqlite3_stmt *st = sql_stmt(s, sql, err);
  if (st) {
    sql_bind_text(st, 1, org);
    sql_bind_text(st, 2, name);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
      read_template(st, out);
      ret = 0;
    } else if (rc == SQLITE_DONE) {
      moat_error_set(err, ENOENT, "no template '%s'", name);
    } else {
      sql_db_error(s, rc, err, "read template");
    }
    sqlite3_reset(st);
  }
  pthread_mutex_unlock(&s->lock);
  return ret;
}

int moat_store_template_list(struct moat_store *s, const char *org, struct moat_store_template **out,
                             size_t *n, moat_error **err) {
  static const char sql[] =
      "SELECT " TEMPLATE_COLS " FROM templates WHERE (?1 IS NULL OR org = ?1) ORDER BY name, org";
  struct moat_store_template *v = NULL;
  size_t len = 0, cap = 0;
  int ret = -1;
  *out = NULL;
  *n = 0;
  pthread_mutex_lock(&s->lock);
  sqlite3_stmt *st = sql_stmt(s, sql, err);
  if (!st)
    goto out;
  sql_bind_text(st, 1, org);
  int rc = sql_collect(st, v, len, cap, 16, read_template);
  if (rc != SQLITE_DONE) {
    sql_db_error(s, rc, err, "list templates");
    moat_store_templates_free(v, len);
    goto out;
  }
  *out = v;
  *n = len;
  ret = 0;
out:
  pthread_mutex_unlock(&s->lock);
  return ret;
}

int moat_store_template_delete(struct moat_store *s, const char *org, const char *name, moat_error **err) {
  static const char sql[] = "DELETE FROM templates WHERE org = ?1 AND name = ?2";
  pthread_mutex_lock(&s->lock);
  int ret = -1;
  sqlite3_stmt *st = sql_stmt(s, sql, err);
  if (st) {
    sql_bind_text(st, 1, org);
    sql_bind_text(st, 2, name);
    if (sql_step_done(s, st, err, "delete template") == 0) {
      if (sqlite3_changes(s->db) == 1)
        ret = 0;
      else
        moat_error_set(err, ENOENT, "no template '%s'", name);
    }
  }
  pthread_mutex_unlock(&s->lock);
  return ret;
}

int moat_store_templates_fail_building(struct moat_store *s, const char *why, moat_error **err) {
  static const char sql[] =
      "UPDATE templates SET state = 'failed', error = ?1, updated_at_ms = ?2 WHERE state = 'building'";
  pthread_mutex_lock(&s->lock);
  int ret = -1;
  sqlite3_stmt *st = sql_stmt(s, sql, err);
  if (st) {
    sql_bind_text(st, 1, why);
    sqlite3_bind_int64(st, 2, now_unix_ms());
    ret = sql_step_done(s, st, err, "fail interrupted template builds");
  }
  pthread_mutex_unlock(&s->lock);
  return ret;
}

int moat_store_images_in_use(struct moat_store *s, char ***out, moat_error **err) {
  static const char sql[] =
      "SELECT image FROM templates WHERE image IS NOT NULL "
      "UNION SELECT j.value FROM templates t, json_each(t.layers) j "
      "UNION SELECT substr(template, instr(template, '@') + 1) FROM sandboxes "
      "  WHERE state != 'killed' AND instr(template, '@') > 0 "
      "UNION SELECT substr(template, instr(template, '@') + 1) FROM snapshots WHERE instr(template, '@') > 0";
  size_t len = 0, cap = 16;
  char **v = xcalloc(cap, sizeof(char *));
  int ret = -1;
  pthread_mutex_lock(&s->lock);
  sqlite3_stmt *st = sql_stmt(s, sql, err);
  if (st) {
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
      if (len + 1 >= cap) {
        cap *= 2;
        v = xrealloc(v, cap * sizeof(char *));
      }
      char *t = sql_col_text(st, 0);
      if (t)
        v[len++] = t;
      v[len] = NULL;
    }
    sqlite3_reset(st);
    if (rc == SQLITE_DONE)
      ret = 0;
    else
      sql_db_error(s, rc, err, "list images in use");
  }
  pthread_mutex_unlock(&s->lock);
  if (ret < 0) {
    strv_free(v);
    return -1;
  }
  *out = v;
  return 0;
}

/* sqlite_internal.h -- what the store's SQLite files (sqlite.c, sqlite_templates.c) share: the
 * connection and its statement cache, and the helpers every query uses. Each helper is called with
 * s->lock held. */
#ifndef MOAT_STORE_SQLITE_INTERNAL_H
#define MOAT_STORE_SQLITE_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sqlite3.h>
#include <string.h>

#include "../common/util.h" /* xrealloc, for sql_collect */
#include "store.h"

#define STMT_CACHE 128

struct moat_store {
  pthread_mutex_t lock; /* guards db and the statement cache */
  sqlite3 *db;
  bool event_added; /* the open transaction inserted a sandbox event (lock held) */
  /* sandbox events committed since the store opened, and the waiters for the next (a leaf lock) */
  pthread_mutex_t event_lock;
  pthread_cond_t event_cond;
  uint64_t event_seq;
  struct {
    const char *sql; /* compared by address: callers pass string constants */
    sqlite3_stmt *st;
  } cache[STMT_CACHE];
};

/* A moat_error from an SQLite result code (EEXIST for a constraint, EBUSY, ENOSPC, ...). */
int sql_db_error(struct moat_store *s, int rc, moat_error **err, const char *what);
/* A reset statement for sql, a string constant compared by address, prepared on first use. */
sqlite3_stmt *sql_stmt(struct moat_store *s, const char *sql, moat_error **err);
int sql_exec_sql(struct moat_store *s, const char *sql, moat_error **err);
int sql_begin(struct moat_store *s, moat_error **err); /* BEGIN IMMEDIATE */
int sql_commit(struct moat_store *s, moat_error **err);
void sql_rollback(struct moat_store *s);
void sql_bind_text(sqlite3_stmt *st, int i, const char *v); /* NULL binds NULL */
char *sql_col_text(sqlite3_stmt *st, int i);                /* a copy, or NULL */
/* Runs a statement that returns no rows. */
int sql_step_done(struct moat_store *s, sqlite3_stmt *st, moat_error **err, const char *what);
/* Runs a bound statement (st NULL: its preparation failed, err set) that must change one row: 0, or
 * -1 with status (ENOENT, EEXIST...) and the message fmt when it changed none, or the database's error
 * (what). */
int sql_change_one(struct moat_store *s, sqlite3_stmt *st, moat_error **err, const char *what, int status,
                   const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* Steps st to its end: for each row, appends a zeroed element to the array v (len in use, cap
 * allocated, grown by doubling from first) and fills it with fill(st, &element). Resets st and
 * evaluates to the last sqlite3_step code, SQLITE_DONE when every row was read (else the caller
 * frees the len elements read and reports it: sql_db_error). */
#define sql_collect(st, v, len, cap, first, fill)                                                            \
  ({                                                                                                         \
    int rc_;                                                                                                 \
    while ((rc_ = sqlite3_step(st)) == SQLITE_ROW) {                                                         \
      if ((len) == (cap)) {                                                                                  \
        (cap) = (cap) ? (cap)*2 : (first);                                                                   \
        (v) = xrealloc((v), (cap) * sizeof(*(v)));                                                           \
      }                                                                                                      \
      memset(&(v)[len], 0, sizeof(*(v)));                                                                    \
      fill((st), &(v)[(len)++]);                                                                             \
    }                                                                                                        \
    sqlite3_reset(st);                                                                                       \
    rc_;                                                                                                     \
  })
/* Records org in orgs if it is not there yet. */
int sql_ensure_org(struct moat_store *s, const char *org, moat_error **err);

#endif

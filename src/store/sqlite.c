/* sqlite.c -- the store (store.h) on SQLite: WAL, one mutex-guarded connection, cached statements */
#include "store.h"

#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../common/buf.h"
#include "../common/fault.h"
#include "../common/util.h"
#include "sqlite_internal.h"

/* Migration i brings user_version from i to i + 1. Append only; never edit a shipped one. */
static const char *const migrations[] = {
    /* 0 -> 1: tenants and their keys */
    "CREATE TABLE orgs ("
    "  id TEXT PRIMARY KEY,"
    "  created_at_ms INTEGER NOT NULL);"
    "CREATE TABLE api_keys ("
    "  key_hash TEXT PRIMARY KEY," /* hex SHA-256 of the key */
    "  org TEXT NOT NULL REFERENCES orgs(id),"
    "  created_at_ms INTEGER NOT NULL);"
    "CREATE INDEX api_keys_org ON api_keys(org);",
    /* 1 -> 2: sandboxes and their lifecycle */
    "CREATE TABLE sandboxes ("
    "  id TEXT PRIMARY KEY,"
    "  org TEXT NOT NULL REFERENCES orgs(id),"
    "  template TEXT NOT NULL,"
    "  state TEXT NOT NULL,"
    "  created_at_ms INTEGER NOT NULL,"
    "  expires_at_ms INTEGER NOT NULL DEFAULT 0,"
    "  ttl_seconds INTEGER NOT NULL,"
    "  persistent INTEGER NOT NULL DEFAULT 0,"
    "  metadata TEXT NOT NULL DEFAULT '{}',"
    "  env TEXT NOT NULL DEFAULT '{}',"
    "  cpu REAL NOT NULL,"
    "  memory_mb INTEGER NOT NULL,"
    "  pids INTEGER NOT NULL,"
    "  disk_mb INTEGER NOT NULL,"
    "  slot INTEGER NOT NULL DEFAULT -1,"
    "  pid INTEGER NOT NULL DEFAULT 0,"
    "  start_time INTEGER NOT NULL DEFAULT 0,"
    "  ready_us INTEGER NOT NULL DEFAULT 0,"
    "  killed_reason TEXT,"
    "  killed_at_ms INTEGER NOT NULL DEFAULT 0,"
    "  updated_at_ms INTEGER NOT NULL);"
    "CREATE INDEX sandboxes_org_state ON sandboxes(org, state);"
    "CREATE INDEX sandboxes_state ON sandboxes(state);"
    "CREATE TABLE sandbox_events ("
    "  seq INTEGER PRIMARY KEY AUTOINCREMENT,"
    "  sandbox_id TEXT NOT NULL REFERENCES sandboxes(id),"
    "  at_ms INTEGER NOT NULL,"
    "  from_state TEXT,"
    "  to_state TEXT NOT NULL,"
    "  reason TEXT NOT NULL);"
    "CREATE INDEX sandbox_events_sandbox ON sandbox_events(sandbox_id, seq);",
    /* 2 -> 3: time travel: fork / snapshot lineage, idle hibernation, pause time; snapshots */
    "ALTER TABLE sandboxes ADD COLUMN forked_from TEXT;"
    "ALTER TABLE sandboxes ADD COLUMN from_snapshot TEXT;"
    "ALTER TABLE sandboxes ADD COLUMN hibernate_after_s INTEGER NOT NULL DEFAULT 0;"
    "ALTER TABLE sandboxes ADD COLUMN paused_at_ms INTEGER NOT NULL DEFAULT 0;"
    "CREATE TABLE snapshots ("
    "  id TEXT PRIMARY KEY,"
    "  org TEXT NOT NULL REFERENCES orgs(id),"
    "  sandbox_id TEXT NOT NULL,"
    "  template TEXT NOT NULL,"
    "  created_at_ms INTEGER NOT NULL,"
    "  memory_bytes INTEGER NOT NULL DEFAULT 0,"
    "  disk_bytes INTEGER NOT NULL DEFAULT 0,"
    "  metadata TEXT NOT NULL DEFAULT '{}',"
    "  cpu REAL NOT NULL,"
    "  memory_mb INTEGER NOT NULL,"
    "  pids INTEGER NOT NULL,"
    "  disk_mb INTEGER NOT NULL,"
    "  ttl_seconds INTEGER NOT NULL,"
    "  env TEXT NOT NULL DEFAULT '{}',"
    "  sandbox_metadata TEXT NOT NULL DEFAULT '{}');"
    "CREATE INDEX snapshots_org_sandbox ON snapshots(org, sandbox_id);",
    /* 3 -> 4: volumes and which sandboxes mount them (live while the sandbox is not killed) */
    "CREATE TABLE volumes ("
    "  id TEXT PRIMARY KEY,"
    "  org TEXT NOT NULL REFERENCES orgs(id),"
    "  name TEXT NOT NULL,"
    "  size_mb INTEGER NOT NULL,"
    "  created_at_ms INTEGER NOT NULL,"
    "  UNIQUE (org, name));"
    "CREATE TABLE volume_attachments ("
    "  volume_id TEXT NOT NULL REFERENCES volumes(id) ON DELETE CASCADE,"
    "  sandbox_id TEXT NOT NULL,"
    "  path TEXT NOT NULL,"
    "  read_only INTEGER NOT NULL,"
    "  PRIMARY KEY (volume_id, sandbox_id, path));"
    "CREATE INDEX volume_attachments_sandbox ON volume_attachments(sandbox_id);",
    /* 4 -> 5: templates an org built (from a Dockerfile) or imported (an OCI image) */
    "CREATE TABLE templates ("
    "  org TEXT NOT NULL REFERENCES orgs(id),"
    "  name TEXT NOT NULL,"
    "  state TEXT NOT NULL,"
    "  build_id TEXT NOT NULL,"
    "  image TEXT,"
    "  layers TEXT NOT NULL DEFAULT '[]',"
    "  source TEXT NOT NULL,"
    "  from_ref TEXT NOT NULL,"
    "  config TEXT NOT NULL DEFAULT '{}',"
    "  size_bytes INTEGER NOT NULL DEFAULT 0,"
    "  error TEXT,"
    "  created_at_ms INTEGER NOT NULL,"
    "  updated_at_ms INTEGER NOT NULL,"
    "  PRIMARY KEY (org, name));",
    /* 5 -> 6: an org's PostgreSQL databases (sqlite_databases.c) */
    "CREATE TABLE databases ("
    "  id TEXT PRIMARY KEY,"
    "  org TEXT NOT NULL REFERENCES orgs(id),"
    "  name TEXT NOT NULL,"
    "  size_mb INTEGER NOT NULL,"
    "  metadata TEXT NOT NULL DEFAULT '{}',"
    "  idle_seconds INTEGER NOT NULL,"
    "  role TEXT NOT NULL UNIQUE,"
    "  password TEXT NOT NULL,"
    "  volume TEXT NOT NULL,"
    "  sandbox_id TEXT,"
    "  state TEXT NOT NULL,"
    "  created_at_ms INTEGER NOT NULL,"
    "  UNIQUE (org, name));",
    /* 6 -> 7: the databases a sandbox was given (its env names their URLs), and which were branched
     * for it (they go when it is killed) */
    "CREATE TABLE database_attachments ("
    "  sandbox_id TEXT NOT NULL,"
    "  env TEXT NOT NULL,"
    "  database_id TEXT NOT NULL,"
    "  owned INTEGER NOT NULL DEFAULT 0,"
    "  PRIMARY KEY (sandbox_id, env));"
    "CREATE INDEX database_attachments_database ON database_attachments(database_id);",
    /* 7 -> 8: keys an org manages (sqlite_keys.c): an id, a name, a role, an expiry; the keys made
     * before are their org's admins */
    "ALTER TABLE api_keys ADD COLUMN id TEXT;"
    "ALTER TABLE api_keys ADD COLUMN name TEXT NOT NULL DEFAULT '';"
    "ALTER TABLE api_keys ADD COLUMN role TEXT NOT NULL DEFAULT 'admin';"
    "ALTER TABLE api_keys ADD COLUMN expires_at_ms INTEGER NOT NULL DEFAULT 0;"
    "ALTER TABLE api_keys ADD COLUMN last_used_at_ms INTEGER NOT NULL DEFAULT 0;"
    "UPDATE api_keys SET id = 'key-' || lower(hex(randomblob(8))) WHERE id IS NULL;"
    "CREATE UNIQUE INDEX api_keys_id ON api_keys(id);",
    /* 8 -> 9: the audit log of mutating calls (sqlite_audit.c) */
    "CREATE TABLE audit ("
    "  seq INTEGER PRIMARY KEY AUTOINCREMENT,"
    "  at_ms INTEGER NOT NULL,"
    "  org TEXT NOT NULL,"
    "  key_id TEXT,"
    "  method TEXT NOT NULL,"
    "  route TEXT NOT NULL,"
    "  path TEXT NOT NULL,"
    "  target TEXT,"
    "  status INTEGER NOT NULL);"
    "CREATE INDEX audit_org_at ON audit(org, at_ms);"
    "CREATE INDEX audit_at ON audit(at_ms);",
    /* 9 -> 10: orgs the platform admin manages (sqlite_orgs.c): their quotas (a JSON object), and a
     * delete in progress (deleting_at_ms) or done (deleted_at_ms; the row stays for old rows' sake) */
    "ALTER TABLE orgs ADD COLUMN quotas TEXT NOT NULL DEFAULT '{}';"
    "ALTER TABLE orgs ADD COLUMN deleting_at_ms INTEGER NOT NULL DEFAULT 0;"
    "ALTER TABLE orgs ADD COLUMN deleted_at_ms INTEGER NOT NULL DEFAULT 0;",
    /* 10 -> 11: metering (sqlite_meter.c): a sandbox's samples with its running totals, and the totals at
     * the last sample of each hour */
    "CREATE TABLE meter_samples ("
    "  sandbox_id TEXT NOT NULL,"
    "  at_ms INTEGER NOT NULL,"
    "  org TEXT NOT NULL,"
    "  slot INTEGER NOT NULL,"
    "  cpu_counter_ns INTEGER NOT NULL,"
    "  cpu_ns INTEGER NOT NULL,"
    "  mem_gib_s REAL NOT NULL,"
    "  alive_ms INTEGER NOT NULL,"
    "  cpu_pct REAL NOT NULL,"
    "  cpu_count REAL NOT NULL,"
    "  mem_used INTEGER NOT NULL,"
    "  mem_limit INTEGER NOT NULL,"
    "  disk_used INTEGER,"
    "  disk_total INTEGER,"
    "  net_rx INTEGER,"
    "  net_tx INTEGER,"
    "  PRIMARY KEY (sandbox_id, at_ms)) WITHOUT ROWID;"
    "CREATE INDEX meter_samples_at ON meter_samples(at_ms);"
    "CREATE TABLE meter_hourly ("
    "  sandbox_id TEXT NOT NULL,"
    "  hour_ms INTEGER NOT NULL,"
    "  org TEXT NOT NULL,"
    "  cpu_ns INTEGER NOT NULL,"
    "  mem_gib_s REAL NOT NULL,"
    "  alive_ms INTEGER NOT NULL,"
    "  PRIMARY KEY (sandbox_id, hour_ms)) WITHOUT ROWID;"
    "CREATE INDEX meter_hourly_org ON meter_hourly(org, hour_ms, sandbox_id);",
    /* 11 -> 12: an org's sandboxes in list order (created_at_ms, id), so that a page of the list
     * seeks to its cursor: the live ones (any state but killed) and those of one state */
    "CREATE INDEX sandboxes_org_live ON sandboxes(org, created_at_ms, id) WHERE state != 'killed';"
    "CREATE INDEX sandboxes_org_state_created ON sandboxes(org, state, created_at_ms, id);"
    "DROP INDEX IF EXISTS sandboxes_org_state;",
};

_Static_assert(sizeof(migrations) / sizeof(migrations[0]) == MOAT_STORE_SCHEMA_VERSION,
               "MOAT_STORE_SCHEMA_VERSION must equal the number of migrations");

static int status_of(int rc) {
  switch (rc & 0xff) {
  case SQLITE_CONSTRAINT:
    return EEXIST;
  case SQLITE_BUSY:
  case SQLITE_LOCKED:
    return EBUSY;
  case SQLITE_FULL:
    return ENOSPC;
  case SQLITE_NOMEM:
    return ENOMEM;
  case SQLITE_READONLY:
  case SQLITE_PERM:
  case SQLITE_AUTH:
    return EACCES;
  case SQLITE_CANTOPEN:
    return ENOENT;
  default:
    return EIO;
  }
}

int sql_db_error(struct moat_store *s, int rc, moat_error **err, const char *what) {
  return moat_error_set(err, status_of(rc), "%s: %s", what,
                        s->db ? sqlite3_errmsg(s->db) : sqlite3_errstr(rc));
}

/* Returns a reset statement for sql (a string constant), preparing it on first use. Lock held. */
sqlite3_stmt *sql_stmt(struct moat_store *s, const char *sql, moat_error **err) {
  size_t free_i = STMT_CACHE;
  for (size_t i = 0; i < STMT_CACHE; i++) {
    if (s->cache[i].sql == sql) {
      sqlite3_reset(s->cache[i].st);
      sqlite3_clear_bindings(s->cache[i].st);
      return s->cache[i].st;
    }
    if (!s->cache[i].sql && free_i == STMT_CACHE)
      free_i = i;
  }
  sqlite3_stmt *st = NULL;
  int rc = sqlite3_prepare_v3(s->db, sql, -1, free_i < STMT_CACHE ? SQLITE_PREPARE_PERSISTENT : 0, &st, NULL);
  if (rc != SQLITE_OK) {
    sql_db_error(s, rc, err, "prepare");
    return NULL;
  }
  if (free_i < STMT_CACHE) {
    s->cache[free_i].sql = sql;
    s->cache[free_i].st = st;
  } else {
    abort(); /* STMT_CACHE is too small for the statements below: a programming error */
  }
  return st;
}

int sql_exec_sql(struct moat_store *s, const char *sql, moat_error **err) {
  char *msg = NULL;
  int rc = sqlite3_exec(s->db, sql, NULL, NULL, &msg);
  if (rc != SQLITE_OK) {
    moat_error_set(err, status_of(rc), "%s: %s", sql, msg ? msg : sqlite3_errstr(rc));
    sqlite3_free(msg);
    return -1;
  }
  return 0;
}

int sql_begin(struct moat_store *s, moat_error **err) { return sql_exec_sql(s, "BEGIN IMMEDIATE", err); }

int sql_commit(struct moat_store *s, moat_error **err) {
  bool events = s->event_added;
  s->event_added = false;
  if ((moat_fault(MOAT_FAULT_STORE) ? moat_error_set(err, EIO, "COMMIT: injected fault")
                                    : sql_exec_sql(s, "COMMIT", err)) < 0) {
    sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
    return -1;
  }
  if (events) {
    pthread_mutex_lock(&s->event_lock);
    s->event_seq++;
    pthread_cond_broadcast(&s->event_cond);
    pthread_mutex_unlock(&s->event_lock);
  }
  return 0;
}

void sql_rollback(struct moat_store *s) {
  s->event_added = false;
  sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
}

uint64_t moat_store_events_wait(struct moat_store *s, uint64_t seen, int timeout_ms) {
  struct timespec until;
  clock_gettime(CLOCK_MONOTONIC, &until);
  until.tv_sec += timeout_ms / 1000;
  until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
  if (until.tv_nsec >= 1000000000L) {
    until.tv_sec++;
    until.tv_nsec -= 1000000000L;
  }
  pthread_mutex_lock(&s->event_lock);
  while (timeout_ms > 0 && s->event_seq == seen &&
         pthread_cond_timedwait(&s->event_cond, &s->event_lock, &until) == 0)
    ;
  uint64_t now = s->event_seq;
  pthread_mutex_unlock(&s->event_lock);
  return now;
}

void sql_bind_text(sqlite3_stmt *st, int i, const char *v) {
  if (v)
    sqlite3_bind_text(st, i, v, -1, SQLITE_TRANSIENT);
  else
    sqlite3_bind_null(st, i);
}

char *sql_col_text(sqlite3_stmt *st, int i) {
  const unsigned char *t = sqlite3_column_text(st, i);
  return t ? xstrdup((const char *)t) : NULL;
}

static int migrate(struct moat_store *s, moat_error **err) {
  if (sql_begin(s, err) < 0)
    return moat_error_wrap(err, "migrate");
  sqlite3_stmt *st = NULL;
  int rc = sqlite3_prepare_v2(s->db, "PRAGMA user_version", -1, &st, NULL);
  int version = -1;
  if (rc == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
    version = sqlite3_column_int(st, 0);
  sqlite3_finalize(st);
  if (version < 0) {
    sql_rollback(s);
    return sql_db_error(s, rc, err, "read user_version");
  }
  if (version > MOAT_STORE_SCHEMA_VERSION) {
    sql_rollback(s);
    return moat_error_set(err, ENOTSUP, "database schema version %d is newer than this moatd (%d)", version,
                          MOAT_STORE_SCHEMA_VERSION);
  }
  for (int v = version; v < MOAT_STORE_SCHEMA_VERSION; v++) {
    if (sql_exec_sql(s, migrations[v], err) < 0) {
      sql_rollback(s);
      return moat_error_wrap(err, "migration %d -> %d", v, v + 1);
    }
  }
  if (version < MOAT_STORE_SCHEMA_VERSION) {
    char sql[64];
    snprintf(sql, sizeof(sql), "PRAGMA user_version = %d", MOAT_STORE_SCHEMA_VERSION);
    if (sql_exec_sql(s, sql, err) < 0) {
      sql_rollback(s);
      return -1;
    }
  }
  return sql_commit(s, err) < 0 ? moat_error_wrap(err, "migrate") : 0;
}

int moat_store_open(struct moat_store **out, const char *path, moat_error **err) {
  {
    /* Create the file ourselves so that it (and SQLite's -wal/-shm, which copy its mode) is 0600. */
    _cleanup_close_ int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0)
      return moat_error_errno(err, "open %s", path);
    if (fchmod(fd, 0600) < 0)
      return moat_error_errno(err, "chmod %s", path);
  }
  struct moat_store *s = xcalloc(1, sizeof(*s));
  pthread_mutex_init(&s->lock, NULL);
  pthread_mutex_init(&s->event_lock, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&s->event_cond, &ca);
  pthread_condattr_destroy(&ca);
  int rc = sqlite3_open_v2(path, &s->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_FULLMUTEX, NULL);
  if (rc != SQLITE_OK) {
    moat_error_set(err, status_of(rc), "open %s: %s", path,
                   s->db ? sqlite3_errmsg(s->db) : sqlite3_errstr(rc));
    moat_store_close(s);
    return -1;
  }
  sqlite3_busy_timeout(s->db, 10000);
  /* WAL with synchronous=NORMAL: a crash of moatd loses nothing; a power loss may lose the last
   * transactions but never corrupts the file. */
  if (sql_exec_sql(s, "PRAGMA journal_mode = WAL", err) < 0 ||
      sql_exec_sql(s, "PRAGMA synchronous = NORMAL", err) < 0 ||
      sql_exec_sql(s, "PRAGMA foreign_keys = ON", err) < 0 || migrate(s, err) < 0 ||
      /* attachments of sandboxes killed (or forgotten) before kills dropped them */
      sql_exec_sql(s,
                   "DELETE FROM volume_attachments WHERE sandbox_id NOT IN "
                   "(SELECT id FROM sandboxes WHERE state != 'killed')",
                   err) < 0) {
    moat_error_wrap(err, "open %s", path);
    moat_store_close(s);
    return -1;
  }
  *out = s;
  return 0;
}

void moat_store_close(struct moat_store *s) {
  if (!s)
    return;
  for (size_t i = 0; i < STMT_CACHE; i++)
    if (s->cache[i].st)
      sqlite3_finalize(s->cache[i].st);
  if (s->db)
    sqlite3_close(s->db);
  pthread_mutex_destroy(&s->lock);
  pthread_mutex_destroy(&s->event_lock);
  pthread_cond_destroy(&s->event_cond);
  free(s);
}

int moat_store_schema_version(struct moat_store *s, int *version, moat_error **err) {
  static const char sql[] = "PRAGMA user_version";
  int ret = -1;
  pthread_mutex_lock(&s->lock);
  sqlite3_stmt *st = sql_stmt(s, sql, err);
  if (st) {
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
      *version = sqlite3_column_int(st, 0);
      ret = 0;
    } else {
      sql_db_error(s, rc, err, "user_version");
    }
    sqlite3_reset(st);
  }
  pthread_mutex_unlock(&s->lock);
  return ret;
}

/* Runs a statement that returns no rows. Lock held. */
int sql_step_done(struct moat_store *s, sqlite3_stmt *st, moat_error **err, const char *what) {
  if (moat_fault(MOAT_FAULT_STORE))
    return sqlite3_reset(st), moat_error_set(err, EIO, "%s: injected fault", what);
  int rc = sqlite3_step(st);
  sqlite3_reset(st);
  if (rc != SQLITE_DONE)
    return sql_db_error(s, rc, err, what);
  return 0;
}

int sql_change_one(struct moat_store *s, sqlite3_stmt *st, moat_error **err, const char *what, int status,
                   const char *fmt, ...) {
  if (!st || sql_step_done(s, st, err, what) < 0)
    return -1;
  if (sqlite3_changes(s->db) > 0)
    return 0;
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  return moat_error_set(err, status, "%s", msg);
}

int sql_ensure_org(struct moat_store *s, const char *org, moat_error **err) {
  static const char sql[] = "INSERT OR IGNORE INTO orgs (id, created_at_ms) VALUES (?1, ?2)";
  sqlite3_stmt *st = sql_stmt(s, sql, err);
  if (!st)
    return -1;
  sql_bind_text(st, 1, org);
  sqlite3_bind_int64(st, 2, now_unix_ms());
  return sql_step_done(s, st, err, "insert org");
}

void moat_store_sandbox_clear(struct moat_store_sandbox *r) {
  if (!r)
    return;
  free(r->id);
  free(r->org);
  free(r->template_name);
  free(r->state);
  free(r->metadata_json);
  free(r->env_json);
  free(r->killed_reason);
  free(r->forked_from);
  free(r->from_snapshot);
  memset(r, 0, sizeof(*r));
  r->slot = -1;
}

void moat_store_sandboxes_free(struct moat_store_sandbox *v, size_t n) {
  for (size_t i = 0; v && i < n; i++)
    moat_store_sandbox_clear(&v[i]);
  free(v);
}

#define SANDBOX_COLS                                                                                         \
  "id, org, template, state, created_at_ms, expires_at_ms, ttl_seconds, persistent, metadata, env, cpu, "    \
  "memory_mb, pids, disk_mb, slot, pid, start_time, ready_us, killed_reason, killed_at_ms, updated_at_ms, "  \
  "forked_from, from_snapshot, hibernate_after_s, paused_at_ms"

static void read_row(sqlite3_stmt *st, struct moat_store_sandbox *r) {
  r->id = sql_col_text(st, 0);
  r->org = sql_col_text(st, 1);
  r->template_name = sql_col_text(st, 2);
  r->state = sql_col_text(st, 3);
  r->created_at_ms = sqlite3_column_int64(st, 4);
  r->expires_at_ms = sqlite3_column_int64(st, 5);
  r->ttl_seconds = sqlite3_column_int64(st, 6);
  r->persistent = sqlite3_column_int(st, 7) != 0;
  r->metadata_json = sql_col_text(st, 8);
  r->env_json = sql_col_text(st, 9);
  r->cpu = sqlite3_column_double(st, 10);
  r->memory_mb = (uint64_t)sqlite3_column_int64(st, 11);
  r->pids = (uint64_t)sqlite3_column_int64(st, 12);
  r->disk_mb = (uint64_t)sqlite3_column_int64(st, 13);
  r->slot = sqlite3_column_int(st, 14);
  r->pid = sqlite3_column_int64(st, 15);
  r->start_time = (uint64_t)sqlite3_column_int64(st, 16);
  r->ready_us = (uint64_t)sqlite3_column_int64(st, 17);
  r->killed_reason = sql_col_text(st, 18);
  r->killed_at_ms = sqlite3_column_int64(st, 19);
  r->updated_at_ms = sqlite3_column_int64(st, 20);
  r->forked_from = sql_col_text(st, 21);
  r->from_snapshot = sql_col_text(st, 22);
  r->hibernate_after_s = sqlite3_column_int64(st, 23);
  r->paused_at_ms = sqlite3_column_int64(st, 24);
}

static int add_event(struct moat_store *s, const char *id, int64_t at_ms, const char *from, const char *to,
                     const char *reason, moat_error **err) {
  static const char sql[] = "INSERT INTO sandbox_events (sandbox_id, at_ms, from_state, to_state, reason) "
                            "VALUES (?1, ?2, ?3, ?4, ?5)";
  sqlite3_stmt *st = sql_stmt(s, sql, err);
  if (!st)
    return -1;
  sql_bind_text(st, 1, id);
  sqlite3_bind_int64(st, 2, at_ms);
  sql_bind_text(st, 3, from);
  sql_bind_text(st, 4, to);
  sql_bind_text(st, 5, reason ? reason : "");
  s->event_added = true;
  return sql_step_done(s, st, err, "insert event");
}

int moat_store_sandbox_insert(struct moat_store *s, const struct moat_store_sandbox *r, const char *reason,
                              moat_error **err) {
  static const char sql[] =
      "INSERT INTO sandboxes (id, org, template, state, created_at_ms, expires_at_ms, ttl_seconds, "
      "persistent, "
      "metadata, env, cpu, memory_mb, pids, disk_mb, slot, pid, start_time, ready_us, updated_at_ms, "
      "forked_from, from_snapshot, hibernate_after_s) "
      "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, "
      "?21, "
      "?22)";
  int ret = -1;
  int64_t now = now_unix_ms();
  pthread_mutex_lock(&s->lock);
  if (sql_begin(s, err) < 0)
    goto out;
  if (sql_ensure_org(s, r->org, err) < 0)
    goto fail;
  sqlite3_stmt *st = sql_stmt(s, sql, err);
  if (!st)
    goto fail;
  sql_bind_text(st, 1, r->id);
  sql_bind_text(st, 2, r->org);
  sql_bind_text(st, 3, r->template_name);
  sql_bind_text(st, 4, r->state);
  sqlite3_bind_int64(st, 5, r->created_at_ms);
  sqlite3_bind_int64(st, 6, r->expires_at_ms);
  sqlite3_bind_int64(st, 7, r->ttl_seconds);
  sqlite3_bind_int(st, 8, r->persistent);
  sql_bind_text(st, 9, r->metadata_json ? r->metadata_json : "{}");
  sql_bind_text(st, 10, r->env_json ? r->env_json : "{}");
  sqlite3_bind_double(st, 11, r->cpu);
  sqlite3_bind_int64(st, 12, (int64_t)r->memory_mb);
  sqlite3_bind_int64(st, 13, (int64_t)r->pids);
  sqlite3_bind_int64(st, 14, (int64_t)r->disk_mb);
  sqlite3_bind_int(st, 15, r->slot);
  sqlite3_bind_int64(st, 16, r->pid);
  sqlite3_bind_int64(st, 17, (int64_t)r->start_time);
  sqlite3_bind_int64(st, 18, (int64_t)r->ready_us);
  sqlite3_bind_int64(st, 19, now);
  sql_bind_text(st, 20, r->forked_from);
  sql_bind_text(st, 21, r->from_snapshot);
  sqlite3_bind_int64(st, 22, r->hibernate_after_s);
  int rc = sqlite3_step(st);
  sqlite3_reset(st);
  if (rc != SQLITE_DONE) {
    if ((rc & 0xff) == SQLITE_CONSTRAINT)
      moat_error_set(err, EEXIST, "sandbox %s exists", r->id);
    else
      sql_db_error(s, rc, err, "insert sandbox");
    goto fail;
  }
  if (add_event(s, r->id, now, NULL, r->state, reason, err) < 0)
    goto fail;
  ret = sql_commit(s, err);
  goto out;
fail:
  sql_rollback(s);
out:
  pthread_mutex_unlock(&s->lock);
  return ret;
}

int moat_store_sandbox_get(struct moat_store *s, const char *org, const char *id,
                           struct moat_store_sandbox *out, moat_error **err) {
  static const char sql[] =
      "SELECT " SANDBOX_COLS " FROM sandboxes WHERE id = ?1 AND (?2 IS NULL OR org = ?2)";
  int ret = -1;
  pthread_mutex_lock(&s->lock);
  sqlite3_stmt *st = sql_stmt(s, sql, err);
  if (st) {
    sql_bind_text(st, 1, id);
    sql_bind_text(st, 2, org);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
      memset(out, 0, sizeof(*out));
      read_row(st, out);
      ret = 0;
    } else if (rc == SQLITE_DONE) {
      moat_error_set(err, ENOENT, "no sandbox %s", id);
    } else {
      sql_db_error(s, rc, err, "read sandbox");
    }
    sqlite3_reset(st);
  }
  pthread_mutex_unlock(&s->lock);
  return ret;
}

/* Appends to sql the WHERE clause of f (and, when after is set, of rows past the cursor in the order
 * desc says). Its parameters are bound by bind_filter in the same order. */
static void filter_sql(struct moat_buf *sql, const struct moat_store_filter *f, bool after, bool desc) {
  static const char live[] = " WHERE state != 'killed'";
  static const char one[] = " WHERE state = ?";
  static const char org[] = " AND org = ?";
  static const char meta[] = " AND EXISTS (SELECT 1 FROM json_each(metadata) WHERE key = ? AND type = 'text' "
                             "AND value = ?)";
  static const char tmpl[] = " AND (template = ? OR substr(template, 1, ?) = ?)";
  static const char cursor[] = " AND (created_at_ms, id) > (?, ?)";
  static const char cursor_desc[] = " AND (created_at_ms, id) < (?, ?)";
  if (f && f->state)
    moat_buf_append(sql, one, sizeof(one) - 1);
  else
    moat_buf_append(sql, live, sizeof(live) - 1);
  if (f && f->org)
    moat_buf_append(sql, org, sizeof(org) - 1);
  for (size_t i = 0; f && f->metadata && i < json_object_size(f->metadata); i++)
    moat_buf_append(sql, meta, sizeof(meta) - 1);
  if (f && f->template_name)
    moat_buf_append(sql, tmpl, sizeof(tmpl) - 1);
  if (after && desc)
    moat_buf_append(sql, cursor_desc, sizeof(cursor_desc) - 1);
  else if (after)
    moat_buf_append(sql, cursor, sizeof(cursor) - 1);
}

/* Binds what filter_sql asked for from parameter 1; returns the next free parameter index. A metadata
 * filter value that is not a string matches nothing (bound as NULL). */
static int bind_filter(sqlite3_stmt *st, const struct moat_store_filter *f, const struct moat_store_page *p) {
  int i = 1;
  if (f && f->state)
    sql_bind_text(st, i++, f->state);
  if (f && f->org)
    sql_bind_text(st, i++, f->org);
  if (f && f->metadata) {
    const char *k;
    json_t *want;
    json_object_foreach(f->metadata, k, want) {
      sql_bind_text(st, i++, k);
      sql_bind_text(st, i++, json_is_string(want) ? json_string_value(want) : NULL);
    }
  }
  if (f && f->template_name) {
    /* the column is "name" or "name@version" */
    _cleanup_free_ char *versioned = xasprintf("%s@", f->template_name);
    sql_bind_text(st, i++, f->template_name);
    sqlite3_bind_int64(st, i++, (int64_t)strlen(versioned));
    sqlite3_bind_text(st, i++, versioned, -1, SQLITE_TRANSIENT);
  }
  if (p && p->after_id) {
    sqlite3_bind_int64(st, i++, p->after_created_ms);
    sql_bind_text(st, i++, p->after_id);
  }
  return i;
}

/* Prepares sql (not cached: its text depends on the filter). Lock held. */
static sqlite3_stmt *prepare_once(struct moat_store *s, const struct moat_buf *sql, moat_error **err) {
  sqlite3_stmt *st = NULL;
  int rc = sqlite3_prepare_v2(s->db, sql->p, (int)sql->len, &st, NULL);
  if (rc != SQLITE_OK) {
    sql_db_error(s, rc, err, "prepare sandbox list");
    return NULL;
  }
  return st;
}

/* The number of rows matching f into *total. Lock held. */
static int count_matches(struct moat_store *s, const struct moat_store_filter *f, size_t *total,
                         moat_error **err) {
  static const char head[] = "SELECT count(*) FROM sandboxes";
  /* left to itself SQLite counts an org's live ones on (org, state, ...), through its killed rows too,
   * which only grow: the partial index holds the live ones alone */
  static const char live_head[] = "SELECT count(*) FROM sandboxes INDEXED BY sandboxes_org_live";
  _cleanup_free_ char *text = NULL;
  struct moat_buf sql = {0};
  if (f && f->org && !f->state)
    moat_buf_append(&sql, live_head, sizeof(live_head) - 1);
  else
    moat_buf_append(&sql, head, sizeof(head) - 1);
  filter_sql(&sql, f, false, false);
  text = sql.p;
  sqlite3_stmt *st = prepare_once(s, &sql, err);
  if (!st)
    return -1;
  bind_filter(st, f, NULL);
  int rc = sqlite3_step(st);
  int ret = 0;
  if (rc == SQLITE_ROW)
    *total = (size_t)sqlite3_column_int64(st, 0);
  else
    ret = sql_db_error(s, rc, err, "count sandboxes");
  sqlite3_finalize(st);
  return ret;
}

int moat_store_sandbox_page(struct moat_store *s, const struct moat_store_filter *f,
                            const struct moat_store_page *p, struct moat_store_sandbox **out, size_t *n,
                            size_t *total, bool *more, moat_error **err) {
  static const char head[] = "SELECT " SANDBOX_COLS " FROM sandboxes";
  static const char tail[] = " ORDER BY created_at_ms, id LIMIT ?";
  static const char tail_desc[] = " ORDER BY created_at_ms DESC, id DESC LIMIT ?";
  struct moat_store_sandbox *v = NULL;
  size_t len = 0, cap = 0;
  int ret = -1;
  *out = NULL;
  *n = 0;
  if (more)
    *more = false;
  _cleanup_free_ char *text = NULL;
  struct moat_buf sql = {0};
  moat_buf_append(&sql, head, sizeof(head) - 1);
  bool desc = p && p->desc;
  filter_sql(&sql, f, p && p->after_id, desc);
  if (desc)
    moat_buf_append(&sql, tail_desc, sizeof(tail_desc) - 1);
  else
    moat_buf_append(&sql, tail, sizeof(tail) - 1);
  text = sql.p;
  /* one row past the page tells whether another page follows */
  int64_t limit = p && p->limit ? (int64_t)p->limit + 1 : -1;
  pthread_mutex_lock(&s->lock);
  if (total && count_matches(s, f, total, err) < 0)
    goto out;
  sqlite3_stmt *st = prepare_once(s, &sql, err);
  if (!st)
    goto out;
  sqlite3_bind_int64(st, bind_filter(st, f, p), limit);
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    if (p && p->limit && len == p->limit) {
      if (more)
        *more = true;
      continue;
    }
    if (len == cap) {
      cap = cap ? cap * 2 : 16;
      v = xrealloc(v, cap * sizeof(*v));
    }
    memset(&v[len], 0, sizeof(v[len]));
    read_row(st, &v[len++]);
  }
  sqlite3_finalize(st);
  if (rc != SQLITE_DONE) {
    sql_db_error(s, rc, err, "list sandboxes");
    moat_store_sandboxes_free(v, len);
    goto out;
  }
  *out = len ? v : NULL;
  if (!len)
    free(v);
  *n = len;
  ret = 0;
out:
  pthread_mutex_unlock(&s->lock);
  return ret;
}

int moat_store_sandbox_list(struct moat_store *s, const struct moat_store_filter *f,
                            struct moat_store_sandbox **out, size_t *n, moat_error **err) {
  return moat_store_sandbox_page(s, f, NULL, out, n, NULL, NULL, err);
}

/* Reads the state of id into buf. 0, or -1 with ENOENT. Lock held. */
static int read_state(struct moat_store *s, const char *id, char *buf, size_t size, moat_error **err) {
  static const char sql[] = "SELECT state FROM sandboxes WHERE id = ?1";
  sqlite3_stmt *st = sql_stmt(s, sql, err);
  if (!st)
    return -1;
  sql_bind_text(st, 1, id);
  int rc = sqlite3_step(st);
  if (rc == SQLITE_ROW) {
    snprintf(buf, size, "%s", (const char *)sqlite3_column_text(st, 0));
    sqlite3_reset(st);
    return 0;
  }
  sqlite3_reset(st);
  if (rc == SQLITE_DONE)
    return moat_error_set(err, ENOENT, "no sandbox %s", id);
  return sql_db_error(s, rc, err, "read state");
}

/* Removes sandbox_id's volume attachments (lock held, in the caller's transaction): a killed or forgotten
 * sandbox holds none. */
static int drop_attachments(struct moat_store *s, const char *sandbox_id, moat_error **err) {
  sqlite3_stmt *st = sql_stmt(s, "DELETE FROM volume_attachments WHERE sandbox_id = ?1", err);
  if (!st)
    return -1;
  sql_bind_text(st, 1, sandbox_id);
  return sql_step_done(s, st, err, "drop volume attachments");
}

int moat_store_sandbox_transition(struct moat_store *s, const char *id, const char *from, const char *to,
                                  const char *reason, moat_error **err) {
  static const char upd[] = "UPDATE sandboxes SET state = ?2, updated_at_ms = ?3 WHERE id = ?1";
  static const char upd_kill[] = "UPDATE sandboxes SET state = ?2, updated_at_ms = ?3, killed_reason = ?4, "
                                 "killed_at_ms = ?3 WHERE id = ?1";
  int ret = -1;
  int64_t now = now_unix_ms();
  bool kill = strcmp(to, "killed") == 0;
  char cur[32];
  pthread_mutex_lock(&s->lock);
  if (sql_begin(s, err) < 0)
    goto out;
  if (read_state(s, id, cur, sizeof(cur), err) < 0)
    goto fail;
  if (from ? strcmp(cur, from) != 0 : strcmp(cur, "killed") == 0) {
    moat_error_set(err, EBUSY, "sandbox %s is %s", id, cur);
    goto fail;
  }
  sqlite3_stmt *st = sql_stmt(s, kill ? upd_kill : upd, err);
  if (!st)
    goto fail;
  sql_bind_text(st, 1, id);
  sql_bind_text(st, 2, to);
  sqlite3_bind_int64(st, 3, now);
  if (kill)
    sql_bind_text(st, 4, reason ? reason : "");
  if (sql_step_done(s, st, err, "update state") < 0 || add_event(s, id, now, cur, to, reason, err) < 0)
    goto fail;
  if (kill && drop_attachments(s, id, err) < 0)
    goto fail;
  ret = sql_commit(s, err);
  goto out;
fail:
  sql_rollback(s);
out:
  pthread_mutex_unlock(&s->lock);
  return ret;
}

int moat_store_sandbox_forget_creating(struct moat_store *s, const char *id, moat_error **err) {
  static const char del_events[] = "DELETE FROM sandbox_events WHERE sandbox_id = ?1";
  static const char del_row[] = "DELETE FROM sandboxes WHERE id = ?1";
  int ret = -1;
  char cur[32];
  pthread_mutex_lock(&s->lock);
  if (sql_begin(s, err) < 0)
    goto out;
  if (read_state(s, id, cur, sizeof(cur), err) < 0)
    goto fail;
  if (strcmp(cur, "creating") != 0) {
    moat_error_set(err, EBUSY, "sandbox %s is %s", id, cur);
    goto fail;
  }
  const char *sqls[] = {del_events, del_row};
  for (size_t i = 0; i < 2; i++) {
    sqlite3_stmt *st = sql_stmt(s, sqls[i], err);
    if (!st)
      goto fail;
    sql_bind_text(st, 1, id);
    if (sql_step_done(s, st, err, "forget sandbox") < 0)
      goto fail;
  }
  if (drop_attachments(s, id, err) < 0)
    goto fail;
  ret = sql_commit(s, err);
  goto out;
fail:
  sql_rollback(s);
out:
  pthread_mutex_unlock(&s->lock);
  return ret;
}

int moat_store_sandbox_set_running(struct moat_store *s, const char *id, int slot, int64_t pid,
                                   uint64_t start_time, uint64_t ready_us, int64_t expires_at_ms,
                                   moat_error **err) {
  static const char sql[] = "UPDATE sandboxes SET state = 'running', slot = ?2, pid = ?3, start_time = ?4, "
                            "ready_us = ?5, expires_at_ms = ?6, updated_at_ms = ?7 WHERE id = ?1";
  int ret = -1;
  int64_t now = now_unix_ms();
  char cur[32];
  pthread_mutex_lock(&s->lock);
  if (sql_begin(s, err) < 0)
    goto out;
  if (read_state(s, id, cur, sizeof(cur), err) < 0)
    goto fail;
  if (strcmp(cur, "creating") != 0) {
    moat_error_set(err, EBUSY, "sandbox %s is %s", id, cur);
    goto fail;
  }
  sqlite3_stmt *st = sql_stmt(s, sql, err);
  if (!st)
    goto fail;
  sql_bind_text(st, 1, id);
  sqlite3_bind_int(st, 2, slot);
  sqlite3_bind_int64(st, 3, pid);
  sqlite3_bind_int64(st, 4, (int64_t)start_time);
  sqlite3_bind_int64(st, 5, (int64_t)ready_us);
  sqlite3_bind_int64(st, 6, expires_at_ms);
  sqlite3_bind_int64(st, 7, now);
  if (sql_step_done(s, st, err, "set running") < 0 ||
      add_event(s, id, now, cur, "running", "created", err) < 0)
    goto fail;
  ret = sql_commit(s, err);
  goto out;
fail:
  sql_rollback(s);
out:
  pthread_mutex_unlock(&s->lock);
  return ret;
}

int moat_store_sandbox_patch(struct moat_store *s, const char *id, const struct moat_store_patch *p,
                             moat_error **err) {
  static const char sql[] =
      "UPDATE sandboxes SET ttl_seconds = CASE WHEN ?2 THEN ?3 ELSE ttl_seconds END, "
      "expires_at_ms = CASE WHEN ?4 THEN ?5 ELSE expires_at_ms END, "
      "persistent = CASE WHEN ?6 THEN ?7 ELSE persistent END, "
      "metadata = COALESCE(?8, metadata), updated_at_ms = ?9, "
      "paused_at_ms = CASE WHEN ?10 THEN ?11 ELSE paused_at_ms END WHERE id = ?1 AND state != 'killed'";
  pthread_mutex_lock(&s->lock);
  sqlite3_stmt *st = sql_stmt(s, sql, err);
  if (st) {
    sql_bind_text(st, 1, id);
    sqlite3_bind_int(st, 2, p->set_ttl);
    sqlite3_bind_int64(st, 3, p->ttl_seconds);
    sqlite3_bind_int(st, 4, p->set_expires);
    sqlite3_bind_int64(st, 5, p->expires_at_ms);
    sqlite3_bind_int(st, 6, p->set_persistent);
    sqlite3_bind_int(st, 7, p->persistent);
    sql_bind_text(st, 8, p->metadata_json);
    sqlite3_bind_int64(st, 9, now_unix_ms());
    sqlite3_bind_int(st, 10, p->set_paused_at);
    sqlite3_bind_int64(st, 11, p->paused_at_ms);
  }
  int ret = sql_change_one(s, st, err, "update sandbox", ENOENT, "no sandbox %s", id);
  pthread_mutex_unlock(&s->lock);
  return ret;
}

int moat_store_events(struct moat_store *s, const char *id, struct moat_store_event **out, size_t *n,
                      moat_error **err) {
  static const char sql[] =
      "SELECT at_ms, from_state, to_state, reason FROM sandbox_events WHERE sandbox_id = ?1 ORDER BY seq";
  struct moat_store_event *v = NULL;
  size_t len = 0, cap = 0;
  int ret = -1;
  *out = NULL;
  *n = 0;
  pthread_mutex_lock(&s->lock);
  sqlite3_stmt *st = sql_stmt(s, sql, err);
  if (!st)
    goto out;
  sql_bind_text(st, 1, id);
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    if (len == cap) {
      cap = cap ? cap * 2 : 8;
      v = xrealloc(v, cap * sizeof(*v));
    }
    v[len].at_ms = sqlite3_column_int64(st, 0);
    v[len].from_state = sql_col_text(st, 1);
    v[len].to_state = sql_col_text(st, 2);
    v[len].reason = sql_col_text(st, 3);
    len++;
  }
  sqlite3_reset(st);
  if (rc != SQLITE_DONE) {
    sql_db_error(s, rc, err, "list events");
    moat_store_events_free(v, len);
    goto out;
  }
  if (len)
    *out = v;
  else
    free(v);
  *n = len;
  ret = 0;
out:
  pthread_mutex_unlock(&s->lock);
  return ret;
}

void moat_store_events_free(struct moat_store_event *v, size_t n) {
  for (size_t i = 0; v && i < n; i++) {
    free(v[i].from_state);
    free(v[i].to_state);
    free(v[i].reason);
  }
  free(v);
}

/* ---- time travel: state moves, snapshots (schema 3) ---- */

int moat_store_sandbox_move(struct moat_store *s, const char *id, const struct moat_store_move *m,
                            moat_error **err) {
  static const char sql[] =
      "UPDATE sandboxes SET state = ?2, updated_at_ms = ?3, "
      "slot = CASE WHEN ?4 THEN ?5 ELSE slot END, pid = CASE WHEN ?4 THEN ?6 ELSE pid END, "
      "start_time = CASE WHEN ?4 THEN ?7 ELSE start_time END, "
      "expires_at_ms = CASE WHEN ?8 THEN ?9 ELSE expires_at_ms END, "
      "paused_at_ms = CASE WHEN ?10 THEN ?11 ELSE paused_at_ms END, "
      "from_snapshot = COALESCE(?12, from_snapshot) WHERE id = ?1";
  if (!m->to || strcmp(m->to, "killed") == 0)
    return moat_error_set(err, EINVAL, "move %s: bad target state", id);
  int ret = -1;
  int64_t now = now_unix_ms();
  char cur[32];
  pthread_mutex_lock(&s->lock);
  if (sql_begin(s, err) < 0)
    goto out;
  if (read_state(s, id, cur, sizeof(cur), err) < 0)
    goto fail;
  if (m->from ? strcmp(cur, m->from) != 0 : strcmp(cur, "killed") == 0) {
    moat_error_set(err, EBUSY, "sandbox %s is %s", id, cur);
    goto fail;
  }
  sqlite3_stmt *st = sql_stmt(s, sql, err);
  if (!st)
    goto fail;
  sql_bind_text(st, 1, id);
  sql_bind_text(st, 2, m->to);
  sqlite3_bind_int64(st, 3, now);
  sqlite3_bind_int(st, 4, m->set_instance);
  sqlite3_bind_int(st, 5, m->slot);
  sqlite3_bind_int64(st, 6, m->pid);
  sqlite3_bind_int64(st, 7, (int64_t)m->start_time);
  sqlite3_bind_int(st, 8, m->set_expires);
  sqlite3_bind_int64(st, 9, m->expires_at_ms);
  sqlite3_bind_int(st, 10, m->set_paused_at);
  sqlite3_bind_int64(st, 11, m->paused_at_ms);
  sql_bind_text(st, 12, m->from_snapshot);
  if (sql_step_done(s, st, err, "move sandbox") < 0 || add_event(s, id, now, cur, m->to, m->reason, err) < 0)
    goto fail;
  ret = sql_commit(s, err);
  goto out;
fail:
  sql_rollback(s);
out:
  pthread_mutex_unlock(&s->lock);
  return ret;
}

void moat_store_snapshot_clear(struct moat_store_snapshot *r) {
  if (!r)
    return;
  free(r->id);
  free(r->org);
  free(r->sandbox_id);
  free(r->template_name);
  free(r->metadata_json);
  free(r->env_json);
  free(r->sandbox_metadata_json);
  memset(r, 0, sizeof(*r));
}

void moat_store_snapshots_free(struct moat_store_snapshot *v, size_t n) {
  for (size_t i = 0; v && i < n; i++)
    moat_store_snapshot_clear(&v[i]);
  free(v);
}

#define SNAPSHOT_COLS                                                                                        \
  "id, org, sandbox_id, template, created_at_ms, memory_bytes, disk_bytes, metadata, cpu, memory_mb, pids, " \
  "disk_mb, ttl_seconds, env, sandbox_metadata"

static void read_snapshot(sqlite3_stmt *st, struct moat_store_snapshot *r) {
  memset(r, 0, sizeof(*r));
  r->id = sql_col_text(st, 0);
  r->org = sql_col_text(st, 1);
  r->sandbox_id = sql_col_text(st, 2);
  r->template_name = sql_col_text(st, 3);
  r->created_at_ms = sqlite3_column_int64(st, 4);
  r->memory_bytes = (uint64_t)sqlite3_column_int64(st, 5);
  r->disk_bytes = (uint64_t)sqlite3_column_int64(st, 6);
  r->metadata_json = sql_col_text(st, 7);
  r->cpu = sqlite3_column_double(st, 8);
  r->memory_mb = (uint64_t)sqlite3_column_int64(st, 9);
  r->pids = (uint64_t)sqlite3_column_int64(st, 10);
  r->disk_mb = (uint64_t)sqlite3_column_int64(st, 11);
  r->ttl_seconds = sqlite3_column_int64(st, 12);
  r->env_json = sql_col_text(st, 13);
  r->sandbox_metadata_json = sql_col_text(st, 14);
}

int moat_store_snapshot_insert(struct moat_store *s, const struct moat_store_snapshot *r, moat_error **err) {
  static const char sql[] =
      "INSERT INTO snapshots (" SNAPSHOT_COLS ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, "
      "?9, ?10, ?11, ?12, ?13, ?14, ?15)";
  int ret = -1;
  pthread_mutex_lock(&s->lock);
  if (sql_begin(s, err) < 0)
    goto out;
  if (sql_ensure_org(s, r->org, err) < 0)
    goto fail;
  sqlite3_stmt *st = sql_stmt(s, sql, err);
  if (!st)
    goto fail;
  sql_bind_text(st, 1, r->id);
  sql_bind_text(st, 2, r->org);
  sql_bind_text(st, 3, r->sandbox_id);
  sql_bind_text(st, 4, r->template_name);
  sqlite3_bind_int64(st, 5, r->created_at_ms);
  sqlite3_bind_int64(st, 6, (int64_t)r->memory_bytes);
  sqlite3_bind_int64(st, 7, (int64_t)r->disk_bytes);
  sql_bind_text(st, 8, r->metadata_json ? r->metadata_json : "{}");
  sqlite3_bind_double(st, 9, r->cpu);
  sqlite3_bind_int64(st, 10, (int64_t)r->memory_mb);
  sqlite3_bind_int64(st, 11, (int64_t)r->pids);
  sqlite3_bind_int64(st, 12, (int64_t)r->disk_mb);
  sqlite3_bind_int64(st, 13, r->ttl_seconds);
  sql_bind_text(st, 14, r->env_json ? r->env_json : "{}");
  sql_bind_text(st, 15, r->sandbox_metadata_json ? r->sandbox_metadata_json : "{}");
  int rc = sqlite3_step(st);
  sqlite3_reset(st);
  if (rc != SQLITE_DONE) {
    if ((rc & 0xff) == SQLITE_CONSTRAINT)
      moat_error_set(err, EEXIST, "snapshot %s exists", r->id);
    else
      sql_db_error(s, rc, err, "insert snapshot");
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

int moat_store_snapshot_get(struct moat_store *s, const char *org, const char *id,
                            struct moat_store_snapshot *out, moat_error **err) {
  static const char sql[] =
      "SELECT " SNAPSHOT_COLS " FROM snapshots WHERE id = ?1 AND (?2 IS NULL OR org = ?2)";
  int ret = -1;
  pthread_mutex_lock(&s->lock);
  sqlite3_stmt *st = sql_stmt(s, sql, err);
  if (st) {
    sql_bind_text(st, 1, id);
    sql_bind_text(st, 2, org);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
      read_snapshot(st, out);
      ret = 0;
    } else if (rc == SQLITE_DONE) {
      moat_error_set(err, ENOENT, "no snapshot %s", id);
    } else {
      sql_db_error(s, rc, err, "read snapshot");
    }
    sqlite3_reset(st);
  }
  pthread_mutex_unlock(&s->lock);
  return ret;
}

int moat_store_snapshot_list(struct moat_store *s, const char *org, const char *sandbox_id,
                             struct moat_store_snapshot **out, size_t *n, moat_error **err) {
  static const char sql[] = "SELECT " SNAPSHOT_COLS " FROM snapshots WHERE (?1 IS NULL OR org = ?1) AND "
                            "(?2 IS NULL OR sandbox_id = ?2) ORDER BY created_at_ms, rowid";
  struct moat_store_snapshot *v = NULL;
  size_t len = 0, cap = 0;
  int ret = -1;
  *out = NULL;
  *n = 0;
  pthread_mutex_lock(&s->lock);
  sqlite3_stmt *st = sql_stmt(s, sql, err);
  if (!st)
    goto out;
  sql_bind_text(st, 1, org);
  sql_bind_text(st, 2, sandbox_id);
  int rc = sql_collect(st, v, len, cap, 16, read_snapshot);
  if (rc != SQLITE_DONE) {
    sql_db_error(s, rc, err, "list snapshots");
    moat_store_snapshots_free(v, len);
    goto out;
  }
  if (len)
    *out = v;
  else
    free(v);
  *n = len;
  ret = 0;
out:
  pthread_mutex_unlock(&s->lock);
  return ret;
}

int moat_store_snapshot_delete(struct moat_store *s, const char *org, const char *id, moat_error **err) {
  static const char sql[] = "DELETE FROM snapshots WHERE id = ?1 AND (?2 IS NULL OR org = ?2)";
  pthread_mutex_lock(&s->lock);
  sqlite3_stmt *st = sql_stmt(s, sql, err);
  if (st) {
    sql_bind_text(st, 1, id);
    sql_bind_text(st, 2, org);
  }
  int ret = sql_change_one(s, st, err, "delete snapshot", ENOENT, "no snapshot %s", id);
  pthread_mutex_unlock(&s->lock);
  return ret;
}

/* ---- volumes ---- */

void moat_store_volume_clear(struct moat_store_volume *v) {
  if (!v)
    return;
  free(v->id);
  free(v->org);
  free(v->name);
  memset(v, 0, sizeof(*v));
}

void moat_store_volumes_free(struct moat_store_volume *v, size_t n) {
  for (size_t i = 0; v && i < n; i++)
    moat_store_volume_clear(&v[i]);
  free(v);
}

void moat_store_attachments_free(struct moat_store_attachment *v, size_t n) {
  for (size_t i = 0; v && i < n; i++) {
    free(v[i].volume_id);
    free(v[i].sandbox_id);
    free(v[i].path);
    free(v[i].volume_name);
  }
  free(v);
}

#define VOLUME_COLS "id, org, name, size_mb, created_at_ms"

static void read_volume(sqlite3_stmt *st, struct moat_store_volume *v) {
  memset(v, 0, sizeof(*v));
  v->id = sql_col_text(st, 0);
  v->org = sql_col_text(st, 1);
  v->name = sql_col_text(st, 2);
  v->size_mb = (uint64_t)sqlite3_column_int64(st, 3);
  v->created_at_ms = sqlite3_column_int64(st, 4);
}

int moat_store_volume_insert(struct moat_store *s, const struct moat_store_volume *v, moat_error **err) {
  static const char sql[] = "INSERT INTO volumes (" VOLUME_COLS ") VALUES (?1, ?2, ?3, ?4, ?5)";
  int ret = -1;
  pthread_mutex_lock(&s->lock);
  if (sql_begin(s, err) < 0)
    goto out;
  if (sql_ensure_org(s, v->org, err) < 0)
    goto fail;
  sqlite3_stmt *st = sql_stmt(s, sql, err);
  if (!st)
    goto fail;
  sql_bind_text(st, 1, v->id);
  sql_bind_text(st, 2, v->org);
  sql_bind_text(st, 3, v->name);
  sqlite3_bind_int64(st, 4, (int64_t)v->size_mb);
  sqlite3_bind_int64(st, 5, v->created_at_ms);
  int rc = sqlite3_step(st);
  sqlite3_reset(st);
  if (rc != SQLITE_DONE) {
    if ((rc & 0xff) == SQLITE_CONSTRAINT)
      moat_error_set(err, EEXIST, "volume '%s' exists", v->name);
    else
      sql_db_error(s, rc, err, "insert volume");
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

/* org's volume name into out (lock held). 0, or -1 (ENOENT). */
static int volume_get_locked(struct moat_store *s, const char *org, const char *name,
                             struct moat_store_volume *out, moat_error **err) {
  static const char sql[] = "SELECT " VOLUME_COLS " FROM volumes WHERE org = ?1 AND name = ?2";
  sqlite3_stmt *st = sql_stmt(s, sql, err);
  if (!st)
    return -1;
  sql_bind_text(st, 1, org);
  sql_bind_text(st, 2, name);
  int rc = sqlite3_step(st), ret = -1;
  if (rc == SQLITE_ROW) {
    read_volume(st, out);
    ret = 0;
  } else if (rc == SQLITE_DONE) {
    moat_error_set(err, ENOENT, "no volume '%s'", name);
  } else {
    sql_db_error(s, rc, err, "read volume");
  }
  sqlite3_reset(st);
  return ret;
}

int moat_store_volume_get(struct moat_store *s, const char *org, const char *name,
                          struct moat_store_volume *out, moat_error **err) {
  pthread_mutex_lock(&s->lock);
  int ret = volume_get_locked(s, org, name, out, err);
  pthread_mutex_unlock(&s->lock);
  return ret;
}

int moat_store_volume_list(struct moat_store *s, const char *org, struct moat_store_volume **out, size_t *n,
                           moat_error **err) {
  static const char sql[] =
      "SELECT " VOLUME_COLS " FROM volumes WHERE (?1 IS NULL OR org = ?1) ORDER BY created_at_ms, rowid";
  struct moat_store_volume *v = NULL;
  size_t len = 0, cap = 0;
  int ret = -1;
  *out = NULL;
  *n = 0;
  pthread_mutex_lock(&s->lock);
  sqlite3_stmt *st = sql_stmt(s, sql, err);
  if (!st)
    goto out;
  sql_bind_text(st, 1, org);
  int rc = sql_collect(st, v, len, cap, 16, read_volume);
  if (rc != SQLITE_DONE) {
    sql_db_error(s, rc, err, "list volumes");
    moat_store_volumes_free(v, len);
    goto out;
  }
  if (len)
    *out = v;
  else
    free(v);
  *n = len;
  ret = 0;
out:
  pthread_mutex_unlock(&s->lock);
  return ret;
}

/* Live attachments (their sandbox not killed) of volume_id and/or sandbox_id (NULL: any); lock held. */
static int attachments_locked(struct moat_store *s, const char *volume_id, const char *sandbox_id,
                              struct moat_store_attachment **out, size_t *n, moat_error **err) {
  static const char sql[] = "SELECT a.volume_id, a.sandbox_id, a.path, a.read_only, v.name FROM "
                            "volume_attachments a JOIN sandboxes s ON s.id = a.sandbox_id JOIN volumes v "
                            "ON v.id = a.volume_id WHERE s.state != 'killed' AND "
                            "(?1 IS NULL OR a.volume_id = ?1) AND (?2 IS NULL OR a.sandbox_id = ?2) "
                            "ORDER BY a.rowid";
  struct moat_store_attachment *v = NULL;
  size_t len = 0, cap = 0;
  *out = NULL;
  *n = 0;
  sqlite3_stmt *st = sql_stmt(s, sql, err);
  if (!st)
    return -1;
  sql_bind_text(st, 1, volume_id);
  sql_bind_text(st, 2, sandbox_id);
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    if (len == cap) {
      cap = cap ? cap * 2 : 8;
      v = xrealloc(v, cap * sizeof(*v));
    }
    v[len].volume_id = sql_col_text(st, 0);
    v[len].sandbox_id = sql_col_text(st, 1);
    v[len].path = sql_col_text(st, 2);
    v[len].read_only = sqlite3_column_int(st, 3) != 0;
    v[len].volume_name = sql_col_text(st, 4);
    len++;
  }
  sqlite3_reset(st);
  if (rc != SQLITE_DONE) {
    moat_store_attachments_free(v, len);
    return sql_db_error(s, rc, err, "list volume attachments");
  }
  *out = v;
  *n = len;
  return 0;
}

int moat_store_attachments(struct moat_store *s, const char *volume_id, const char *sandbox_id,
                           struct moat_store_attachment **out, size_t *n, moat_error **err) {
  pthread_mutex_lock(&s->lock);
  int ret = attachments_locked(s, volume_id, sandbox_id, out, n, err);
  pthread_mutex_unlock(&s->lock);
  return ret;
}

int moat_store_volume_delete(struct moat_store *s, const char *org, const char *name, char **id,
                             moat_error **err) {
  static const char sql[] = "DELETE FROM volumes WHERE id = ?1";
  struct moat_store_volume v = {0};
  struct moat_store_attachment *a = NULL;
  size_t na = 0;
  int ret = -1;
  pthread_mutex_lock(&s->lock);
  if (sql_begin(s, err) < 0)
    goto out;
  if (volume_get_locked(s, org, name, &v, err) < 0 || attachments_locked(s, v.id, NULL, &a, &na, err) < 0)
    goto fail;
  if (na) {
    moat_error_set(err, EBUSY, "volume '%s' is attached to sandbox %s", name, a[0].sandbox_id);
    goto fail;
  }
  sqlite3_stmt *st = sql_stmt(s, sql, err);
  if (!st)
    goto fail;
  sql_bind_text(st, 1, v.id);
  if (sql_step_done(s, st, err, "delete volume") < 0 || sqlite3_changes(s->db) != 1) {
    if (err && !*err)
      moat_error_set(err, ENOENT, "no volume '%s'", name);
    goto fail;
  }
  if (sql_commit(s, err) < 0)
    goto out;
  *id = v.id;
  v.id = NULL;
  ret = 0;
  goto out;
fail:
  sql_rollback(s);
out:
  pthread_mutex_unlock(&s->lock);
  moat_store_attachments_free(a, na);
  moat_store_volume_clear(&v);
  return ret;
}

int moat_store_volume_claim(struct moat_store *s, const char *org, const char *sandbox_id,
                            struct moat_store_claim *claims, size_t n, moat_error **err) {
  static const char sql[] =
      "INSERT INTO volume_attachments (volume_id, sandbox_id, path, read_only) VALUES (?1, ?2, ?3, ?4)";
  int ret = -1;
  pthread_mutex_lock(&s->lock);
  if (sql_begin(s, err) < 0)
    goto out;
  for (size_t i = 0; i < n; i++) {
    struct moat_store_volume v = {0};
    if (volume_get_locked(s, org, claims[i].name, &v, err) < 0)
      goto fail;
    free(claims[i].volume_id);
    claims[i].volume_id = v.id;
    v.id = NULL;
    moat_store_volume_clear(&v);
    struct moat_store_attachment *a = NULL;
    size_t na = 0;
    if (attachments_locked(s, claims[i].volume_id, NULL, &a, &na, err) < 0)
      goto fail;
    const char *holder = NULL;
    for (size_t j = 0; j < na && !holder && !claims[i].read_only; j++)
      if (!a[j].read_only)
        holder = a[j].sandbox_id;
    for (size_t j = 0; j < i && !holder && !claims[i].read_only; j++)
      if (strcmp(claims[j].volume_id, claims[i].volume_id) == 0 && !claims[j].read_only)
        holder = sandbox_id;
    if (holder)
      moat_error_set(err, EBUSY, "volume '%s' is attached read-write to sandbox %s", claims[i].name, holder);
    moat_store_attachments_free(a, na);
    if (holder)
      goto fail;
    sqlite3_stmt *st = sql_stmt(s, sql, err);
    if (!st)
      goto fail;
    sql_bind_text(st, 1, claims[i].volume_id);
    sql_bind_text(st, 2, sandbox_id);
    sql_bind_text(st, 3, claims[i].path);
    sqlite3_bind_int(st, 4, claims[i].read_only ? 1 : 0);
    if (sql_step_done(s, st, err, "attach volume") < 0)
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

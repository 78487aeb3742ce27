/* test_store_timetravel.c -- the store's schema-3 additions: lineage columns, state moves with their
 * events, snapshot rows (insert, org scoping, list filters, delete), and migrating a schema-2 file */
#include <errno.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/util.h"
#include "store/store.h"

#include "tap.h"

static char dir[] = "/tmp/moat-test-store-tt-XXXXXX";

static int insert(struct moat_store *s, const char *id, const char *org, const char *forked_from) {
  struct moat_store_sandbox r = {0};
  r.id = (char *)id;
  r.org = (char *)org;
  r.template_name = (char *)"base";
  r.state = (char *)"creating";
  r.created_at_ms = now_unix_ms();
  r.ttl_seconds = 60;
  r.cpu = 1;
  r.memory_mb = 256;
  r.pids = 64;
  r.disk_mb = 512;
  r.slot = -1;
  r.forked_from = (char *)forked_from;
  r.from_snapshot = forked_from ? (char *)"snap-aaaaaaaaaaaaaaaaa" : NULL;
  r.hibernate_after_s = forked_from ? 0 : 30;
  moat_error *err = NULL;
  int rc = moat_store_sandbox_insert(s, &r, "api", &err);
  moat_error_free(&err);
  return rc;
}

static struct moat_store_snapshot snap(const char *id, const char *org, const char *sb) {
  struct moat_store_snapshot r = {0};
  r.id = (char *)id;
  r.org = (char *)org;
  r.sandbox_id = (char *)sb;
  r.template_name = (char *)"base";
  r.created_at_ms = now_unix_ms();
  r.memory_bytes = 1234;
  r.disk_bytes = 5678;
  r.metadata_json = (char *)"{\"k\":\"v\"}";
  r.cpu = 1.5;
  r.memory_mb = 256;
  r.pids = 64;
  r.disk_mb = 512;
  r.ttl_seconds = 60;
  r.env_json = (char *)"{\"A\":\"1\"}";
  return r;
}

static void test_moves(struct moat_store *s) {
  moat_error *err = NULL;
  CHECK(insert(s, "sb-1", "org1", NULL) == 0 && insert(s, "sb-2", "org1", "sb-1") == 0,
        "insert with lineage");
  struct moat_store_sandbox r = {0};
  CHECK(moat_store_sandbox_get(s, NULL, "sb-2", &r, &err) == 0 && r.forked_from &&
            strcmp(r.forked_from, "sb-1") == 0 && r.from_snapshot &&
            strcmp(r.from_snapshot, "snap-aaaaaaaaaaaaaaaaa") == 0 && r.hibernate_after_s == 0 &&
            r.paused_at_ms == 0,
        "lineage read back");
  moat_store_sandbox_clear(&r);
  CHECK(moat_store_sandbox_get(s, NULL, "sb-1", &r, &err) == 0 && !r.forked_from && r.hibernate_after_s == 30,
        "hibernate_after_s read back");
  moat_store_sandbox_clear(&r);
  CHECK(moat_store_sandbox_set_running(s, "sb-1", 7, 100, 200, 5, 1000, &err) == 0, "running");
  struct moat_store_move m = {
      .from = "running", .to = "paused", .reason = "api", .set_paused_at = true, .paused_at_ms = 4242};
  CHECK(moat_store_sandbox_move(s, "sb-1", &m, &err) == 0, "running -> paused");
  CHECK(moat_store_sandbox_move(s, "sb-1", &m, &err) < 0 && err && err->status == EBUSY,
        "running -> paused again: EBUSY (%s)", moat_error_msg(err));
  moat_error_free(&err);
  CHECK(moat_store_sandbox_get(s, NULL, "sb-1", &r, &err) == 0 && strcmp(r.state, "paused") == 0 &&
            r.paused_at_ms == 4242 && r.slot == 7 && r.expires_at_ms == 1000,
        "paused, pause time kept, slot and expiry untouched");
  moat_store_sandbox_clear(&r);
  struct moat_store_move h = {.to = "hibernated", .reason = "idle", .set_instance = true, .slot = -1};
  CHECK(moat_store_sandbox_move(s, "sb-1", &h, &err) == 0, "paused -> hibernated (from any)");
  struct moat_store_move w = {.from = "hibernated",
                              .to = "running",
                              .reason = "api",
                              .set_instance = true,
                              .slot = 9,
                              .pid = 300,
                              .start_time = 400,
                              .set_expires = true,
                              .expires_at_ms = 9999,
                              .set_paused_at = true,
                              .paused_at_ms = 0,
                              .from_snapshot = "snap-bbbbbbbbbbbbbbbbb"};
  CHECK(moat_store_sandbox_move(s, "sb-1", &w, &err) == 0, "hibernated -> running");
  CHECK(moat_store_sandbox_get(s, NULL, "sb-1", &r, &err) == 0 && strcmp(r.state, "running") == 0 &&
            r.slot == 9 && r.pid == 300 && r.start_time == 400 && r.expires_at_ms == 9999 &&
            r.paused_at_ms == 0 && r.from_snapshot && strcmp(r.from_snapshot, "snap-bbbbbbbbbbbbbbbbb") == 0,
        "new instance, expiry, pause time and from_snapshot recorded");
  moat_store_sandbox_clear(&r);
  struct moat_store_event *ev;
  size_t n;
  CHECK(moat_store_events(s, "sb-1", &ev, &n, &err) == 0 && n == 5 && strcmp(ev[2].to_state, "paused") == 0 &&
            strcmp(ev[3].from_state, "paused") == 0 && strcmp(ev[3].to_state, "hibernated") == 0 &&
            strcmp(ev[3].reason, "idle") == 0 && strcmp(ev[4].to_state, "running") == 0,
        "every move is an event with its reason (%zu)", n);
  moat_store_events_free(ev, n);
  struct moat_store_patch pp = {
      .set_expires = true, .expires_at_ms = 7777, .set_paused_at = true, .paused_at_ms = 55};
  CHECK(moat_store_sandbox_patch(s, "sb-1", &pp, &err) == 0 &&
            moat_store_sandbox_get(s, NULL, "sb-1", &r, &err) == 0 && r.expires_at_ms == 7777 &&
            r.paused_at_ms == 55,
        "patch sets the pause time with the expiry");
  moat_store_sandbox_clear(&r);
  struct moat_store_patch pm = {.metadata_json = "{}"};
  CHECK(moat_store_sandbox_patch(s, "sb-1", &pm, &err) == 0 &&
            moat_store_sandbox_get(s, NULL, "sb-1", &r, &err) == 0 && r.paused_at_ms == 55,
        "a patch without it keeps the pause time");
  moat_store_sandbox_clear(&r);
  struct moat_store_move k = {.to = "killed"};
  CHECK(moat_store_sandbox_move(s, "sb-1", &k, &err) < 0 && err->status == EINVAL, "move to killed refused");
  moat_error_free(&err);
  CHECK(moat_store_sandbox_transition(s, "sb-1", NULL, "killed", "api", &err) == 0, "kill");
  struct moat_store_move again = {.to = "running"};
  CHECK(moat_store_sandbox_move(s, "sb-1", &again, &err) < 0 && err->status == EBUSY,
        "no move out of killed");
  moat_error_free(&err);
  CHECK(moat_store_sandbox_move(s, "sb-nope", &again, &err) < 0 && err->status == ENOENT, "unknown: ENOENT");
  moat_error_free(&err);
}

static void test_snapshots(struct moat_store *s) {
  moat_error *err = NULL;
  struct moat_store_snapshot a = snap("snap-a", "org1", "sb-1"), b = snap("snap-b", "org1", "sb-2"),
                             c = snap("snap-c", "org2", "sb-1");
  CHECK(moat_store_snapshot_insert(s, &a, &err) == 0 && moat_store_snapshot_insert(s, &b, &err) == 0 &&
            moat_store_snapshot_insert(s, &c, &err) == 0,
        "insert three snapshots (a new org is created)");
  CHECK(moat_store_snapshot_insert(s, &a, &err) < 0 && err->status == EEXIST, "duplicate id: EEXIST");
  moat_error_free(&err);
  struct moat_store_snapshot r;
  CHECK(moat_store_snapshot_get(s, "org1", "snap-a", &r, &err) == 0 && strcmp(r.sandbox_id, "sb-1") == 0 &&
            r.memory_bytes == 1234 && r.disk_bytes == 5678 && strcmp(r.metadata_json, "{\"k\":\"v\"}") == 0 &&
            r.cpu == 1.5 && r.memory_mb == 256 && r.pids == 64 && r.disk_mb == 512 && r.ttl_seconds == 60 &&
            strcmp(r.env_json, "{\"A\":\"1\"}") == 0 && strcmp(r.sandbox_metadata_json, "{}") == 0,
        "get reads every field back");
  moat_store_snapshot_clear(&r);
  CHECK(moat_store_snapshot_get(s, "org2", "snap-a", &r, &err) < 0 && err->status == ENOENT,
        "another org's snapshot: ENOENT");
  moat_error_free(&err);
  struct moat_store_snapshot *v;
  size_t n;
  CHECK(moat_store_snapshot_list(s, "org1", NULL, &v, &n, &err) == 0 && n == 2 &&
            strcmp(v[0].id, "snap-a") == 0 && strcmp(v[1].id, "snap-b") == 0,
        "list by org, oldest first");
  moat_store_snapshots_free(v, n);
  CHECK(moat_store_snapshot_list(s, "org1", "sb-2", &v, &n, &err) == 0 && n == 1 &&
            strcmp(v[0].id, "snap-b") == 0,
        "list by org and sandbox");
  moat_store_snapshots_free(v, n);
  CHECK(moat_store_snapshot_list(s, NULL, NULL, &v, &n, &err) == 0 && n == 3, "list all orgs");
  moat_store_snapshots_free(v, n);
  CHECK(moat_store_snapshot_delete(s, "org2", "snap-a", &err) < 0 && err->status == ENOENT,
        "delete of another org's: ENOENT");
  moat_error_free(&err);
  CHECK(moat_store_snapshot_delete(s, "org1", "snap-a", &err) == 0, "delete");
  CHECK(moat_store_snapshot_delete(s, "org1", "snap-a", &err) < 0 && err->status == ENOENT,
        "delete twice: ENOENT");
  moat_error_free(&err);
  CHECK(moat_store_snapshot_list(s, "org1", NULL, &v, &n, &err) == 0 && n == 1, "one left in org1");
  moat_store_snapshots_free(v, n);
}

/* A schema-2 database (sandboxes without the new columns) migrates, keeping its rows. */
static void test_migrate_from_2(void) {
  char *path = xasprintf("%s/v2.db", dir);
  sqlite3 *db;
  sqlite3_open(path, &db);
  int rc = sqlite3_exec(
      db,
      "CREATE TABLE orgs (id TEXT PRIMARY KEY, created_at_ms INTEGER NOT NULL);"
      "CREATE TABLE api_keys (key_hash TEXT PRIMARY KEY, org TEXT NOT NULL REFERENCES orgs(id), "
      "created_at_ms "
      "INTEGER NOT NULL);"
      "CREATE INDEX api_keys_org ON api_keys(org);"
      "CREATE TABLE sandboxes (id TEXT PRIMARY KEY, org TEXT NOT NULL REFERENCES orgs(id), template TEXT NOT "
      "NULL,"
      " state TEXT NOT NULL, created_at_ms INTEGER NOT NULL, expires_at_ms INTEGER NOT NULL DEFAULT 0,"
      " ttl_seconds INTEGER NOT NULL, persistent INTEGER NOT NULL DEFAULT 0, metadata TEXT NOT NULL DEFAULT "
      "'{}',"
      " env TEXT NOT NULL DEFAULT '{}', cpu REAL NOT NULL, memory_mb INTEGER NOT NULL, pids INTEGER NOT NULL,"
      " disk_mb INTEGER NOT NULL, slot INTEGER NOT NULL DEFAULT -1, pid INTEGER NOT NULL DEFAULT 0,"
      " start_time INTEGER NOT NULL DEFAULT 0, ready_us INTEGER NOT NULL DEFAULT 0, killed_reason TEXT,"
      " killed_at_ms INTEGER NOT NULL DEFAULT 0, updated_at_ms INTEGER NOT NULL);"
      "CREATE TABLE sandbox_events (seq INTEGER PRIMARY KEY AUTOINCREMENT, sandbox_id TEXT NOT NULL "
      "REFERENCES "
      "sandboxes(id), at_ms INTEGER NOT NULL, from_state TEXT, to_state TEXT NOT NULL, reason TEXT NOT NULL);"
      "INSERT INTO orgs VALUES ('o', 1);"
      "INSERT INTO sandboxes (id, org, template, state, created_at_ms, ttl_seconds, cpu, memory_mb, pids, "
      "disk_mb,"
      " updated_at_ms) VALUES ('sb-old', 'o', 'base', 'running', 1, 60, 1, 256, 64, 512, 1);"
      "PRAGMA user_version = 2;",
      NULL, NULL, NULL);
  sqlite3_close(db);
  CHECK(rc == SQLITE_OK, "wrote a schema-2 database");
  struct moat_store *s = NULL;
  moat_error *err = NULL;
  int version = 0;
  CHECK(moat_store_open(&s, path, &err) == 0 && moat_store_schema_version(s, &version, &err) == 0 &&
            version == MOAT_STORE_SCHEMA_VERSION,
        "migrated to %d: %s", version, moat_error_msg(err));
  struct moat_store_sandbox r = {0};
  CHECK(s && moat_store_sandbox_get(s, NULL, "sb-old", &r, &err) == 0 && strcmp(r.state, "running") == 0 &&
            !r.forked_from && !r.from_snapshot && r.hibernate_after_s == 0 && r.paused_at_ms == 0,
        "old row kept with empty time-travel columns");
  moat_store_sandbox_clear(&r);
  struct moat_store_snapshot *v;
  size_t n = 9;
  CHECK(s && moat_store_snapshot_list(s, NULL, NULL, &v, &n, &err) == 0 && n == 0, "snapshots table empty");
  moat_error_free(&err);
  moat_store_close(s);
  free(path);
}

int main(void) {
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 1;
  }
  char *path = xasprintf("%s/moat.db", dir);
  struct moat_store *s = NULL;
  moat_error *err = NULL;
  CHECK(moat_store_open(&s, path, &err) == 0, "open a new store");
  if (s) {
    test_moves(s);
    test_snapshots(s);
    moat_store_close(s);
  }
  test_migrate_from_2();
  moat_error *e2 = NULL;
  rm_rf(dir, &e2);
  moat_error_free(&e2);
  free(path);
  return tap_done();
}

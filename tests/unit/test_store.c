/* test_store.c -- the SQLite store: CRUD, filters, org scoping, transitions and events, migrations,
 * databases found by role within an org */
#include <errno.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/sha256.h"
#include "common/util.h"
#include "store/store.h"

#include "tap.h"

static char dir[] = "/tmp/moat-test-store-XXXXXX";
static char db_path[256];

static struct moat_store_sandbox row(const char *id, const char *org, const char *meta) {
  struct moat_store_sandbox r = {0};
  r.id = (char *)id;
  r.org = (char *)org;
  r.template_name = (char *)"base";
  r.state = (char *)"creating";
  r.created_at_ms = now_unix_ms();
  r.ttl_seconds = 3600;
  r.metadata_json = (char *)meta;
  r.env_json = (char *)"{\"A\":\"1\"}";
  r.cpu = 1.5;
  r.memory_mb = 512;
  r.pids = 100;
  r.disk_mb = 1024;
  r.slot = -1;
  return r;
}

static int insert(struct moat_store *s, const char *id, const char *org, const char *meta) {
  struct moat_store_sandbox r = row(id, org, meta);
  moat_error *err = NULL;
  int rc = moat_store_sandbox_insert(s, &r, "api", &err);
  if (rc < 0) {
    printf("# insert %s: %s\n", id, moat_error_msg(err));
    moat_error_free(&err);
  }
  return rc;
}

/* Lists with the given filter and returns the ids joined by ",". Caller frees. */
static char *list_ids(struct moat_store *s, const char *org, const char *state, const char *meta_json) {
  json_t *meta = meta_json ? json_loads(meta_json, 0, NULL) : NULL;
  struct moat_store_filter f = {.org = org, .state = state, .metadata = meta};
  struct moat_store_sandbox *v;
  size_t n;
  moat_error *err = NULL;
  char *out = xstrdup("");
  if (moat_store_sandbox_list(s, &f, &v, &n, &err) < 0) {
    free(out);
    out = xasprintf("error: %s", moat_error_msg(err));
    moat_error_free(&err);
  } else {
    for (size_t i = 0; i < n; i++) {
      char *next = xasprintf("%s%s%s", out, i ? "," : "", v[i].id);
      free(out);
      out = next;
    }
    moat_store_sandboxes_free(v, n);
  }
  json_decref(meta);
  return out;
}

static void test_keys(struct moat_store *s) {
  moat_error *err = NULL;
  char h1[65], h2[65];
  moat_sha256_hex("moat_key_one", 12, h1);
  moat_sha256_hex("moat_key_two", 12, h2);
  CHECK(moat_store_key_add(s, "default", h1, &err) == 0, "add key for org default");
  moat_error_free(&err);
  CHECK(moat_store_key_add(s, "default", h1, &err) == 0, "adding the same key to the same org is a no-op");
  moat_error_free(&err);
  CHECK(moat_store_key_add(s, "other", h1, &err) < 0 && err && err->status == EEXIST,
        "the same key for another org is EEXIST");
  moat_error_free(&err);
  CHECK(moat_store_key_add(s, "other", h2, &err) == 0, "add key for org other");
  moat_error_free(&err);
  char *org = NULL;
  CHECK(moat_store_key_lookup(s, h1, &org, &err) == 0 && org && strcmp(org, "default") == 0,
        "key one maps to default (%s)", org ? org : "null");
  free(org);
  org = NULL;
  CHECK(moat_store_key_lookup(s, h2, &org, &err) == 0 && org && strcmp(org, "other") == 0,
        "key two maps to other (%s)", org ? org : "null");
  free(org);
  org = NULL;
  char h3[65];
  moat_sha256_hex("nope", 4, h3);
  CHECK(moat_store_key_lookup(s, h3, &org, &err) < 0 && err && err->status == ENOENT && !org,
        "unknown key is ENOENT");
  moat_error_free(&err);

  /* Keys with ids, names, roles and expiry: insert, get, list, touch, delete. */
  char h4[65], h5[65];
  moat_sha256_hex("moat_key_four", 13, h4);
  moat_sha256_hex("moat_key_five", 13, h5);
  struct moat_store_key k4 = {.id = "key-aaaaaaaaaaaaaaaa",
                              .org = "other",
                              .name = "ci",
                              .role = "readonly",
                              .created_at_ms = 5,
                              .expires_at_ms = 99};
  CHECK(moat_store_key_insert(s, &k4, h4, &err) == 0, "insert a named readonly key");
  moat_error_free(&err);
  struct moat_store_key dup = k4;
  CHECK(moat_store_key_insert(s, &dup, h5, &err) < 0 && err && err->status == EEXIST,
        "a second key with its id is EEXIST");
  moat_error_free(&err);
  dup.id = "key-bbbbbbbbbbbbbbbb";
  CHECK(moat_store_key_insert(s, &dup, h4, &err) < 0 && err && err->status == EEXIST,
        "a second key with its hash is EEXIST");
  moat_error_free(&err);
  struct moat_store_key got = {0};
  CHECK(moat_store_key_get(s, h4, &got, &err) == 0 && strcmp(got.id, k4.id) == 0 &&
            strcmp(got.name, "ci") == 0 && strcmp(got.role, "readonly") == 0 &&
            strcmp(got.org, "other") == 0 && got.created_at_ms == 5 && got.expires_at_ms == 99 &&
            got.last_used_at_ms == 0,
        "get returns the key's row");
  moat_store_key_clear(&got);
  CHECK(moat_store_key_touch(s, k4.id, 1234, &err) == 0 && moat_store_key_get(s, h4, &got, &err) == 0 &&
            got.last_used_at_ms == 1234,
        "touch records last use");
  moat_store_key_clear(&got);
  struct moat_store_key *kv = NULL;
  size_t kn = 0;
  CHECK(moat_store_key_list(s, "other", &kv, &kn, &err) == 0 && kn == 2, "org other lists its 2 keys (%zu)",
        kn);
  bool seen = false;
  for (size_t i = 0; i < kn; i++)
    seen |= strcmp(kv[i].id, k4.id) == 0 && strcmp(kv[i].org, "other") == 0;
  CHECK(seen, "the list has the inserted key");
  moat_store_keys_free(kv, kn);
  CHECK(moat_store_key_delete(s, "default", k4.id, &err) < 0 && err && err->status == ENOENT,
        "another org cannot delete it (ENOENT)");
  moat_error_free(&err);
  CHECK(moat_store_key_delete(s, "other", k4.id, &err) == 0 && moat_store_key_get(s, h4, &got, &err) < 0 &&
            err && err->status == ENOENT,
        "a deleted key is unknown");
  moat_error_free(&err);
  CHECK(moat_store_key_delete(s, "other", k4.id, &err) < 0 && err && err->status == ENOENT,
        "deleting it again is ENOENT");
  moat_error_free(&err);

  /* The key itself is nowhere in the file, only its hash. */
  char *cmd =
      xasprintf("grep -c moat_key_one %s %s-wal 2>/dev/null | grep -v ':0$' | grep -c . ", db_path, db_path);
  FILE *p = popen(cmd, "r");
  char line[32] = "";
  if (p) {
    if (!fgets(line, sizeof(line), p))
      line[0] = 0;
    pclose(p);
  }
  free(cmd);
  CHECK(atoi(line) == 0, "the plaintext key is not stored in the database files");
}

static void test_crud(struct moat_store *s) {
  moat_error *err = NULL;
  CHECK(insert(s, "sb-a1", "a", "{\"team\":\"x\",\"k\\\"q\":\"v=1\"}") == 0, "insert sb-a1 (org a)");
  CHECK(insert(s, "sb-a2", "a", "{\"team\":\"y\"}") == 0, "insert sb-a2 (org a)");
  CHECK(insert(s, "sb-b1", "b", "{\"team\":\"x\"}") == 0, "insert sb-b1 (org b)");
  CHECK(insert(s, "sb-a3", "a", NULL) == 0, "insert sb-a3 with no metadata");
  struct moat_store_sandbox dup = row("sb-a1", "a", NULL);
  CHECK(moat_store_sandbox_insert(s, &dup, "api", &err) < 0 && err && err->status == EEXIST,
        "duplicate id is EEXIST");
  moat_error_free(&err);

  struct moat_store_sandbox r = {0};
  CHECK(moat_store_sandbox_get(s, "a", "sb-a1", &r, &err) == 0, "get sb-a1 as org a");
  CHECK(r.id && strcmp(r.id, "sb-a1") == 0 && strcmp(r.org, "a") == 0 && strcmp(r.state, "creating") == 0 &&
            strcmp(r.template_name, "base") == 0 && r.cpu == 1.5 && r.memory_mb == 512 && r.pids == 100 &&
            r.disk_mb == 1024 && r.slot == -1 && r.ttl_seconds == 3600 && !r.persistent &&
            strcmp(r.env_json, "{\"A\":\"1\"}") == 0 && r.killed_reason == NULL && r.updated_at_ms > 0,
        "fields round-trip");
  moat_store_sandbox_clear(&r);
  CHECK(moat_store_sandbox_get(s, "a", "sb-a3", &r, &err) == 0 && strcmp(r.metadata_json, "{}") == 0,
        "NULL metadata is stored as {}");
  moat_store_sandbox_clear(&r);
  CHECK(moat_store_sandbox_get(s, "b", "sb-a1", &r, &err) < 0 && err && err->status == ENOENT,
        "another org's sandbox is ENOENT");
  moat_error_free(&err);
  CHECK(moat_store_sandbox_get(s, NULL, "sb-a1", &r, &err) == 0, "org NULL reads any org");
  moat_store_sandbox_clear(&r);
  CHECK(moat_store_sandbox_get(s, "a", "sb-none", &r, &err) < 0 && err && err->status == ENOENT,
        "unknown id is ENOENT");
  moat_error_free(&err);

  /* Transitions and events. */
  CHECK(moat_store_sandbox_set_running(s, "sb-a1", 7, 4242, 99999, 1234, 5555, &err) == 0,
        "sb-a1 -> running");
  moat_error_free(&err);
  CHECK(moat_store_sandbox_get(s, "a", "sb-a1", &r, &err) == 0 && strcmp(r.state, "running") == 0 &&
            r.slot == 7 && r.pid == 4242 && r.start_time == 99999 && r.ready_us == 1234 &&
            r.expires_at_ms == 5555,
        "running row has slot, pid, start_time, ready_us, expiry");
  moat_store_sandbox_clear(&r);
  CHECK(moat_store_sandbox_set_running(s, "sb-a1", 8, 1, 1, 1, 1, &err) < 0 && err && err->status == EBUSY,
        "set_running of a running sandbox is EBUSY");
  moat_error_free(&err);
  CHECK(moat_store_sandbox_transition(s, "sb-a1", "creating", "killed", "api", &err) < 0 && err &&
            err->status == EBUSY,
        "transition with the wrong from-state is EBUSY");
  moat_error_free(&err);
  CHECK(moat_store_sandbox_transition(s, "sb-nope", NULL, "killed", "api", &err) < 0 && err &&
            err->status == ENOENT,
        "transition of an unknown id is ENOENT");
  moat_error_free(&err);
  CHECK(moat_store_sandbox_transition(s, "sb-a1", "running", "paused", "api", &err) == 0,
        "running -> paused");
  CHECK(moat_store_sandbox_transition(s, "sb-a1", NULL, "killed", "ttl", &err) == 0,
        "paused -> killed (ttl)");
  moat_error_free(&err);
  CHECK(moat_store_sandbox_transition(s, "sb-a1", NULL, "killed", "api", &err) < 0 && err &&
            err->status == EBUSY,
        "killing a killed sandbox is EBUSY");
  moat_error_free(&err);
  CHECK(moat_store_sandbox_get(s, "a", "sb-a1", &r, &err) == 0 && strcmp(r.state, "killed") == 0 &&
            r.killed_reason && strcmp(r.killed_reason, "ttl") == 0 && r.killed_at_ms >= r.created_at_ms,
        "killed row keeps reason and time");
  moat_store_sandbox_clear(&r);

  struct moat_store_event *ev;
  size_t nev;
  CHECK(moat_store_events(s, "sb-a1", &ev, &nev, &err) == 0 && nev == 4, "4 events recorded for sb-a1 (%zu)",
        nev);
  if (nev == 4) {
    CHECK(ev[0].from_state == NULL && strcmp(ev[0].to_state, "creating") == 0 &&
              strcmp(ev[0].reason, "api") == 0,
          "event 1: null -> creating (api)");
    CHECK(strcmp(ev[1].from_state, "creating") == 0 && strcmp(ev[1].to_state, "running") == 0 &&
              strcmp(ev[1].reason, "created") == 0,
          "event 2: creating -> running (created)");
    CHECK(strcmp(ev[2].from_state, "running") == 0 && strcmp(ev[2].to_state, "paused") == 0,
          "event 3: running -> paused");
    CHECK(strcmp(ev[3].from_state, "paused") == 0 && strcmp(ev[3].to_state, "killed") == 0 &&
              strcmp(ev[3].reason, "ttl") == 0 && ev[3].at_ms >= ev[0].at_ms,
          "event 4: paused -> killed (ttl), in time order");
  }
  moat_store_events_free(ev, nev);
  CHECK(moat_store_events(s, "sb-nope", &ev, &nev, &err) == 0 && nev == 0 && ev == NULL,
        "no events for an unknown id");

  /* Lists: org scoping, killed only on request, metadata filters. */
  char *ids;
  ids = list_ids(s, "a", NULL, NULL);
  CHECK(strcmp(ids, "sb-a2,sb-a3") == 0, "org a, any live state: %s", ids);
  free(ids);
  ids = list_ids(s, "a", "killed", NULL);
  CHECK(strcmp(ids, "sb-a1") == 0, "org a, killed: %s", ids);
  free(ids);
  ids = list_ids(s, "b", NULL, NULL);
  CHECK(strcmp(ids, "sb-b1") == 0, "org b: %s", ids);
  free(ids);
  /* list order is created_at_ms, then id: a3 and b1 swap when they were made in the same ms */
  int64_t at_b1 = 0, at_a3 = 0;
  if (moat_store_sandbox_get(s, NULL, "sb-b1", &r, &err) == 0)
    at_b1 = r.created_at_ms;
  moat_store_sandbox_clear(&r);
  if (moat_store_sandbox_get(s, NULL, "sb-a3", &r, &err) == 0)
    at_a3 = r.created_at_ms;
  moat_store_sandbox_clear(&r);
  const char *want = at_a3 == at_b1 ? "sb-a2,sb-a3,sb-b1" : "sb-a2,sb-b1,sb-a3";
  ids = list_ids(s, NULL, "creating", NULL);
  CHECK(strcmp(ids, want) == 0, "every org, creating: %s (want %s)", ids, want);
  free(ids);
  ids = list_ids(s, NULL, NULL, "{\"team\":\"x\"}");
  CHECK(strcmp(ids, "sb-b1") == 0, "metadata team=x among live ones: %s", ids);
  free(ids);
  ids = list_ids(s, "a", "killed", "{\"team\":\"x\",\"k\\\"q\":\"v=1\"}");
  CHECK(strcmp(ids, "sb-a1") == 0, "two metadata keys, one with a quote, value with '=': %s", ids);
  free(ids);
  ids = list_ids(s, "a", "killed", "{\"team\":\"x\",\"k\\\"q\":\"v=2\"}");
  CHECK(strcmp(ids, "") == 0, "one key differing excludes the row: '%s'", ids);
  free(ids);
  ids = list_ids(s, "a", NULL, "{\"missing\":\"x\"}");
  CHECK(strcmp(ids, "") == 0, "a key the row lacks excludes it: '%s'", ids);
  free(ids);

  /* Patch. */
  struct moat_store_patch p = {.set_ttl = true,
                               .ttl_seconds = 60,
                               .set_expires = true,
                               .expires_at_ms = 777,
                               .metadata_json = "{\"team\":\"z\"}"};
  CHECK(moat_store_sandbox_patch(s, "sb-a2", &p, &err) == 0, "patch sb-a2 ttl, expiry and metadata");
  CHECK(moat_store_sandbox_get(s, "a", "sb-a2", &r, &err) == 0 && r.ttl_seconds == 60 &&
            r.expires_at_ms == 777 && !r.persistent && strcmp(r.metadata_json, "{\"team\":\"z\"}") == 0,
        "patched fields stored, others kept");
  moat_store_sandbox_clear(&r);
  struct moat_store_patch p2 = {
      .set_persistent = true, .persistent = true, .set_expires = true, .expires_at_ms = 0};
  CHECK(moat_store_sandbox_patch(s, "sb-a2", &p2, &err) == 0 &&
            moat_store_sandbox_get(s, "a", "sb-a2", &r, &err) == 0 && r.persistent && r.expires_at_ms == 0 &&
            r.ttl_seconds == 60 && strcmp(r.metadata_json, "{\"team\":\"z\"}") == 0,
        "patch persistent keeps ttl and metadata");
  moat_store_sandbox_clear(&r);
  CHECK(moat_store_sandbox_patch(s, "sb-a1", &p, &err) < 0 && err && err->status == ENOENT,
        "patching a killed sandbox is ENOENT");
  moat_error_free(&err);
}

struct thread_arg {
  struct moat_store *s;
  int t;
  int failures;
};

static void *worker(void *p) {
  struct thread_arg *a = p;
  for (int i = 0; i < 50; i++) {
    char id[32];
    snprintf(id, sizeof(id), "sb-t%d-%d", a->t, i);
    moat_error *err = NULL;
    if (insert(a->s, id, "conc", "{}") < 0 ||
        moat_store_sandbox_set_running(a->s, id, i, 1, 1, 1, 1, &err) < 0 ||
        moat_store_sandbox_transition(a->s, id, "running", "killed", "api", &err) < 0)
      a->failures++;
    moat_error_free(&err);
  }
  return NULL;
}

static void test_threads(struct moat_store *s) {
  pthread_t th[4];
  struct thread_arg args[4];
  for (int i = 0; i < 4; i++) {
    args[i] = (struct thread_arg){.s = s, .t = i};
    pthread_create(&th[i], NULL, worker, &args[i]);
  }
  int failures = 0;
  for (int i = 0; i < 4; i++) {
    pthread_join(th[i], NULL);
    failures += args[i].failures;
  }
  struct moat_store_filter f = {.org = "conc", .state = "killed"};
  struct moat_store_sandbox *v;
  size_t n = 0;
  moat_error *err = NULL;
  moat_store_sandbox_list(s, &f, &v, &n, &err);
  moat_store_sandboxes_free(v, n);
  CHECK(failures == 0 && n == 200, "4 threads x 50 create/run/kill: %d failures, %zu killed rows", failures,
        n);
}

static int sql_run(const char *path, const char *sql) {
  sqlite3 *db;
  if (sqlite3_open(path, &db) != SQLITE_OK)
    return -1;
  int rc = sqlite3_exec(db, sql, NULL, NULL, NULL);
  sqlite3_close(db);
  return rc == SQLITE_OK ? 0 : -1;
}

static void test_migrations(void) {
  moat_error *err = NULL;
  struct moat_store *s = NULL;
  int version = -1;

  /* Reopening the current database migrates nothing and keeps the data. */
  CHECK(moat_store_open(&s, db_path, &err) == 0, "reopen");
  CHECK(s && moat_store_schema_version(s, &version, &err) == 0 && version == MOAT_STORE_SCHEMA_VERSION,
        "version still %d after reopen", version);
  struct moat_store_sandbox r = {0};
  CHECK(s && moat_store_sandbox_get(s, "b", "sb-b1", &r, &err) == 0, "rows survive reopen");
  moat_store_sandbox_clear(&r);
  moat_store_close(s);
  s = NULL;

  /* Two handles on one file (moatd and `moatd key create`) see each other's writes. */
  struct moat_store *s2 = NULL;
  char h[65], *org = NULL;
  moat_sha256_hex("shared", 6, h);
  CHECK(moat_store_open(&s, db_path, &err) == 0 && moat_store_open(&s2, db_path, &err) == 0 &&
            moat_store_key_add(s, "shared-org", h, &err) == 0 &&
            moat_store_key_lookup(s2, h, &org, &err) == 0 && org && strcmp(org, "shared-org") == 0,
        "a second handle sees a key the first added");
  free(org);
  moat_store_close(s);
  moat_store_close(s2);
  s = NULL;

  /* A version-1 database (keys only) upgrades and keeps its keys. */
  char *v1 = xasprintf("%s/v1.db", dir);
  int rc =
      sql_run(v1, "CREATE TABLE orgs (id TEXT PRIMARY KEY, created_at_ms INTEGER NOT NULL);"
                  "CREATE TABLE api_keys (key_hash TEXT PRIMARY KEY, org TEXT NOT NULL REFERENCES orgs(id),"
                  " created_at_ms INTEGER NOT NULL);"
                  "CREATE INDEX api_keys_org ON api_keys(org);"
                  "INSERT INTO orgs VALUES ('old', 1);"
                  "INSERT INTO api_keys VALUES ('"
                  "abcd"
                  "', 'old', 1);"
                  "PRAGMA user_version = 1;");
  CHECK(rc == 0 && moat_store_open(&s, v1, &err) == 0, "open a version-1 database");
  CHECK(s && moat_store_schema_version(s, &version, &err) == 0 && version == MOAT_STORE_SCHEMA_VERSION,
        "migrated to %d", version);
  org = NULL;
  CHECK(s && moat_store_key_lookup(s, "abcd", &org, &err) == 0 && org && strcmp(org, "old") == 0,
        "the old key survives the migration");
  free(org);
  struct moat_store_key ok = {0};
  CHECK(s && moat_store_key_get(s, "abcd", &ok, &err) == 0 && ok.role && strcmp(ok.role, "admin") == 0 &&
            ok.id && strncmp(ok.id, "key-", 4) == 0 && strlen(ok.id) == 20 && ok.expires_at_ms == 0,
        "the old key becomes its org's admin with an id (%s, %s)", ok.role ? ok.role : "null",
        ok.id ? ok.id : "null");
  moat_store_key_clear(&ok);
  CHECK(s && insert(s, "sb-new", "old", NULL) == 0, "the new tables work after migration");
  moat_store_close(s);
  s = NULL;

  /* A database from a newer moatd is refused. */
  rc = sql_run(v1, "PRAGMA user_version = 99");
  CHECK(rc == 0 && moat_store_open(&s, v1, &err) < 0 && err && err->status == ENOTSUP,
        "a newer schema is refused: %s", err ? err->msg : "(opened)");
  moat_error_free(&err);
  moat_store_close(s);
  free(v1);
}

static int db_insert(struct moat_store *s, const char *id, const char *org, const char *role) {
  struct moat_store_database d = {.id = (char *)id,
                                  .org = (char *)org,
                                  .name = (char *)id,
                                  .size_mb = 64,
                                  .metadata_json = (char *)"{}",
                                  .idle_seconds = 300,
                                  .role = (char *)role,
                                  .password = (char *)"pw",
                                  .volume = (char *)id,
                                  .state = (char *)"running",
                                  .created_at_ms = now_unix_ms()};
  moat_error *err = NULL;
  int rc = moat_store_database_insert(s, &d, &err);
  if (rc < 0)
    printf("# insert database %s: %s\n", id, moat_error_msg(err));
  moat_error_free(&err);
  return rc;
}

/* moat_store_database_find(org, role, database): the id found, or "ENOENT: message". Caller frees. */
static char *db_find(struct moat_store *s, const char *org, const char *role, const char *database) {
  struct moat_store_database r = {0};
  moat_error *err = NULL;
  char *out;
  if (moat_store_database_find(s, org, role, database, &r, &err) == 0)
    out = xstrdup(r.id);
  else
    out = xasprintf("%s: %s", err && err->status == ENOENT ? "ENOENT" : "error", moat_error_msg(err));
  moat_error_free(&err);
  moat_store_database_clear(&r);
  return out;
}

static void test_database_find(struct moat_store *s) {
  CHECK(db_insert(s, "db-aaaa", "org-a", "db_aaaa") == 0 && db_insert(s, "db-bbbb", "org-b", "db_bbbb") == 0,
        "two databases of two orgs");
  struct {
    const char *org, *role, *database, *want;
  } cases[] = {
      {NULL, "db_aaaa", "db_aaaa", "db-aaaa"},
      {NULL, "db_bbbb", NULL, "db-bbbb"},
      {"org-a", "db_aaaa", "db_aaaa", "db-aaaa"},
      {"org-a", "nosuch", "db_aaaa", "db-aaaa"}, /* by the database name when the role names none */
      {"org-b", "db_bbbb", "db_bbbb", "db-bbbb"},
      /* another org's: as unknown as a name nobody has, with the same message */
      {"org-b", "db_aaaa", "db_aaaa", "ENOENT: no such database: user \"db_aaaa\", database \"db_aaaa\""},
      {"org-b", "nosuch", "nosuch", "ENOENT: no such database: user \"nosuch\", database \"nosuch\""},
      {"org-b", "db_aaaa", "db_bbbb", "db-bbbb"}, /* org-a's role is skipped, org-b's database found */
      {"org-a", "db_bbbb", "nosuch", "ENOENT: no such database: user \"db_bbbb\", database \"nosuch\""},
      {"", "db_aaaa", "db_aaaa", "ENOENT: no such database: user \"db_aaaa\", database \"db_aaaa\""},
      {"org-c", "db_aaaa", NULL, "ENOENT: no such database: user \"db_aaaa\", database \"db_aaaa\""},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    char *got = db_find(s, cases[i].org, cases[i].role, cases[i].database);
    CHECK(strcmp(got, cases[i].want) == 0, "find org %s role %s database %s: %s",
          cases[i].org ? cases[i].org : "NULL", cases[i].role, cases[i].database ? cases[i].database : "NULL",
          got);
    free(got);
  }
}

int main(void) {
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 1;
  }
  snprintf(db_path, sizeof(db_path), "%s/moat.db", dir);
  moat_error *err = NULL;
  struct moat_store *s = NULL;
  CHECK(moat_store_open(&s, db_path, &err) == 0, "open a new store: %s", err ? err->msg : "ok");
  if (!s) {
    tap_done();
    return 1;
  }
  struct stat st;
  CHECK(stat(db_path, &st) == 0 && (st.st_mode & 0777) == 0600, "moat.db has mode 0600 (%o)",
        st.st_mode & 0777);
  int version = -1;
  CHECK(moat_store_schema_version(s, &version, &err) == 0 && version == MOAT_STORE_SCHEMA_VERSION,
        "new store is at schema version %d", version);
  char *wal = xasprintf("%s-wal", db_path);
  CHECK(access(wal, F_OK) == 0, "WAL journal in use");
  free(wal);

  test_keys(s);
  test_crud(s);
  test_threads(s);
  test_database_find(s);
  moat_store_close(s);
  test_migrations();

  moat_error_free(&err);
  rm_rf(dir, NULL);
  return tap_done();
}

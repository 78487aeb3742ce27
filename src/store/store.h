/* store.h -- moatd's durable state: orgs, API key hashes, sandboxes and their state transitions
 *
 * One SQLite database (WAL, busy_timeout) per data dir, schema versioned with PRAGMA user_version
 * and upgraded by ordered migrations at open. A store handle is safe to use from any thread (one
 * connection guarded by a mutex); several processes (moatd and `moatd key create`) may open the
 * same file at once.
 *
 * The store knows nothing of sandbox semantics beyond recording them: state names are strings
 * ("creating", "running", "paused", "hibernated", "killed"), and every state change goes through
 * moat_store_sandbox_transition or moat_store_sandbox_set_running, which append a row to
 * sandbox_events (sandbox_id, at_ms, from_state, to_state, reason) in the same transaction.
 * Errors: ENOENT (no such row), EBUSY (a conditional transition found another state), EIO and
 * friends (SQLite failures), ENOTSUP (the database is newer than this binary).
 */
#ifndef MOAT_STORE_H
#define MOAT_STORE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../common/error.h"

#define MOAT_STORE_SCHEMA_VERSION 12 /* user_version after all migrations ran */

struct moat_store;

/* Opens (creating with mode 0600 if absent) the database at path and migrates it to
 * MOAT_STORE_SCHEMA_VERSION. Returns 0 and sets *out, or -1. */
int moat_store_open(struct moat_store **out, const char *path, moat_error **err);
void moat_store_close(struct moat_store *s);

/* PRAGMA user_version as stored in the file. */
int moat_store_schema_version(struct moat_store *s, int *version, moat_error **err);

/* API keys are stored as the lowercase hex SHA-256 of the key (64 chars), never the key.
 * key_add creates the org if needed; adding a hash that exists already is a no-op when it
 * belongs to the same org and EEXIST otherwise. */
int moat_store_key_add(struct moat_store *s, const char *org, const char *key_hash_hex, moat_error **err);
/* Returns 0 and sets *org (caller frees) for a known hash, or -1 with ENOENT. */
int moat_store_key_lookup(struct moat_store *s, const char *key_hash_hex, char **org, moat_error **err);

/* One row of api_keys without its hash. Strings are owned (moat_store_key_clear). role is
 * "admin", "member" or "readonly"; the store does not check it. */
struct moat_store_key {
  char *id; /* "key-" + 16 characters */
  char *org;
  char *name;
  char *role;
  int64_t created_at_ms;
  int64_t expires_at_ms;   /* 0 = never */
  int64_t last_used_at_ms; /* 0 = never used (updated at most once a minute) */
};
void moat_store_key_clear(struct moat_store_key *k);
void moat_store_keys_free(struct moat_store_key *v, size_t n);
/* Inserts key k (id, org, name, role, created_at_ms, expires_at_ms) with its hash; creates the org
 * if needed. EEXIST when the hash or the id exists already. key_add above is this with a new id,
 * the name "default" and the role admin (a no-op for a hash its org has already). */
int moat_store_key_insert(struct moat_store *s, const struct moat_store_key *k, const char *key_hash_hex,
                          moat_error **err);
/* The key of a hash: 0 and *out (moat_store_key_clear), or -1 with ENOENT. */
int moat_store_key_get(struct moat_store *s, const char *key_hash_hex, struct moat_store_key *out,
                       moat_error **err);
/* org's keys, oldest first: 0 and *out, *n (moat_store_keys_free), or -1. */
int moat_store_key_list(struct moat_store *s, const char *org, struct moat_store_key **out, size_t *n,
                        moat_error **err);
/* Deletes org's key id (its hash goes with it): 0, or -1 with ENOENT (no such key in org). */
int moat_store_key_delete(struct moat_store *s, const char *org, const char *id, moat_error **err);
/* Records that key id was used at at_ms. */
int moat_store_key_touch(struct moat_store *s, const char *id, int64_t at_ms, moat_error **err);

/* One row of the sandboxes table. Strings are owned (freed by moat_store_sandbox_clear). */
struct moat_store_sandbox {
  char *id;
  char *org;
  char *template_name;
  char *state;
  int64_t created_at_ms;
  int64_t expires_at_ms; /* 0 = never (persistent) */
  int64_t ttl_seconds;
  bool persistent;
  char *metadata_json; /* JSON object text; NULL is stored as "{}" */
  char *env_json;      /* JSON object text; NULL is stored as "{}" */
  double cpu;
  uint64_t memory_mb, pids, disk_mb;
  int slot; /* -1 when the sandbox holds no slot */
  int64_t pid;
  uint64_t start_time;
  uint64_t ready_us;
  char *killed_reason; /* NULL unless killed */
  int64_t killed_at_ms;
  int64_t updated_at_ms;
  /* schema 3 (time travel) */
  char *forked_from;         /* NULL unless forked */
  char *from_snapshot;       /* NULL unless restored from / rolled back to a snapshot */
  int64_t hibernate_after_s; /* 0 = never */
  int64_t paused_at_ms;      /* when paused or hibernated, else 0 */
};
void moat_store_sandbox_clear(struct moat_store_sandbox *r);
void moat_store_sandboxes_free(struct moat_store_sandbox *v, size_t n);

/* Inserts a new row (killed_* and updated_at are set by the store) and records the event
 * (NULL -> r->state, reason). EEXIST if the id is taken. */
int moat_store_sandbox_insert(struct moat_store *s, const struct moat_store_sandbox *r, const char *reason,
                              moat_error **err);

/* Reads a row. org NULL = any org; with an org, another org's row is ENOENT. */
int moat_store_sandbox_get(struct moat_store *s, const char *org, const char *id,
                           struct moat_store_sandbox *out, moat_error **err);

struct moat_store_filter {
  const char *org;           /* NULL = every org */
  const char *state;         /* NULL = every state but "killed"; else exactly this state */
  json_t *metadata;          /* object key -> string value; every pair must match; NULL = no filter */
  const char *template_name; /* NULL = any; else this template's name (of any of its versions) */
};
/* Rows matching f in list order (created_at_ms, then id), oldest first. *out is NULL when *n is 0;
 * free with moat_store_sandboxes_free. */
int moat_store_sandbox_list(struct moat_store *s, const struct moat_store_filter *f,
                            struct moat_store_sandbox **out, size_t *n, moat_error **err);

/* Where a page of the list starts and how long it is. */
struct moat_store_page {
  size_t limit;             /* rows at most; 0 = every row from the start */
  const char *after_id;     /* NULL = from the first row; else rows after (after_created_ms, after_id) */
  int64_t after_created_ms; /* in list order */
  bool desc;                /* the list order reversed: newest first, ties by id descending */
};
/* One page of the rows matching f, in list order, read with one seek to the cursor (cost grows with
 * the page, not the list). total (if not NULL) = rows matching f whatever the cursor, counted in the
 * same read; more (if not NULL) = whether rows follow the page. Same ownership as moat_store_sandbox_list. */
int moat_store_sandbox_page(struct moat_store *s, const struct moat_store_filter *f,
                            const struct moat_store_page *p, struct moat_store_sandbox **out, size_t *n,
                            size_t *total, bool *more, moat_error **err);

/* Moves a sandbox from state `from` (NULL = any state but "killed") to `to`, recording the event
 * with reason. When `to` is "killed", killed_reason = reason and killed_at_ms = now. ENOENT when
 * the id is unknown, EBUSY when its state is not `from` (or is killed, for from NULL). */
int moat_store_sandbox_transition(struct moat_store *s, const char *id, const char *from, const char *to,
                                  const char *reason, moat_error **err);

/* Removes sandbox id and its events if it is still "creating" (a create that moatd died in the
 * middle of and never answered). 0; ENOENT when there is no such row, EBUSY when it is past
 * creating. */
int moat_store_sandbox_forget_creating(struct moat_store *s, const char *id, moat_error **err);

/* creating -> running with the host's coordinates, readiness time and first expiry. */
int moat_store_sandbox_set_running(struct moat_store *s, const char *id, int slot, int64_t pid,
                                   uint64_t start_time, uint64_t ready_us, int64_t expires_at_ms,
                                   moat_error **err);

/* Changes TTL, expiry, persistence and/or metadata of a sandbox that is not killed. Fields not
 * set are kept. ENOENT (unknown or killed). */
struct moat_store_patch {
  bool set_ttl;
  int64_t ttl_seconds;
  bool set_expires;
  int64_t expires_at_ms;
  bool set_persistent;
  bool persistent;
  const char *metadata_json; /* NULL = keep */
  bool set_paused_at;        /* schema 3 */
  int64_t paused_at_ms;
};
int moat_store_sandbox_patch(struct moat_store *s, const char *id, const struct moat_store_patch *p,
                             moat_error **err);

/* A state change with whatever else changes with it, in one transaction with its event row. */
struct moat_store_move {
  const char *from;   /* required current state; NULL = any but "killed" */
  const char *to;     /* new state (not "killed": use moat_store_sandbox_transition) */
  const char *reason; /* event reason */
  bool set_instance;  /* slot, pid, start_time (slot -1, pid 0 when it holds none) */
  int slot;
  int64_t pid;
  uint64_t start_time;
  bool set_expires;
  int64_t expires_at_ms;
  bool set_paused_at;
  int64_t paused_at_ms;
  const char *from_snapshot; /* non-NULL: recorded */
};
/* ENOENT unknown id, EBUSY when the current state is not m->from (or killed). */
int moat_store_sandbox_move(struct moat_store *s, const char *id, const struct moat_store_move *m,
                            moat_error **err);

/* ---- snapshots (schema 3) ----
 * A row exists only for a complete snapshot: the caller writes the files first, then inserts. */
struct moat_store_snapshot {
  char *id;
  char *org;
  char *sandbox_id;
  char *template_name;
  int64_t created_at_ms;
  uint64_t memory_bytes, disk_bytes;
  char *metadata_json; /* the snapshot's own metadata (object text) */
  /* what the sandbox had, for creates from the snapshot */
  double cpu;
  uint64_t memory_mb, pids, disk_mb;
  int64_t ttl_seconds;
  char *env_json;
  char *sandbox_metadata_json;
};
void moat_store_snapshot_clear(struct moat_store_snapshot *r);
void moat_store_snapshots_free(struct moat_store_snapshot *v, size_t n);
/* EEXIST if the id is taken. */
int moat_store_snapshot_insert(struct moat_store *s, const struct moat_store_snapshot *r, moat_error **err);
/* org NULL = any org. ENOENT when unknown (or another org's). */
int moat_store_snapshot_get(struct moat_store *s, const char *org, const char *id,
                            struct moat_store_snapshot *out, moat_error **err);
/* org NULL = every org, sandbox_id NULL = every sandbox; oldest first. */
int moat_store_snapshot_list(struct moat_store *s, const char *org, const char *sandbox_id,
                             struct moat_store_snapshot **out, size_t *n, moat_error **err);
/* ENOENT when unknown (or another org's). */
int moat_store_snapshot_delete(struct moat_store *s, const char *org, const char *id, moat_error **err);

/* ---- volumes (schema 4) ----
 * A volume is org's by name; an attachment (volume, sandbox, path, read_only) is live while its
 * sandbox's row is not killed (a create that failed, a kill, a forgotten row all end it). The kill's
 * transition and the forget remove the sandbox's attachment rows; the store's open removes those of
 * sandboxes killed or gone before that. */
struct moat_store_volume {
  char *id; /* the host's name of its storage */
  char *org;
  char *name;
  uint64_t size_mb;
  int64_t created_at_ms;
};
struct moat_store_attachment {
  char *volume_id, *sandbox_id, *path, *volume_name;
  bool read_only;
};
void moat_store_volume_clear(struct moat_store_volume *v);
void moat_store_volumes_free(struct moat_store_volume *v, size_t n);
void moat_store_attachments_free(struct moat_store_attachment *v, size_t n);
/* EEXIST when org has a volume of that name. */
int moat_store_volume_insert(struct moat_store *s, const struct moat_store_volume *v, moat_error **err);
/* ENOENT ("no volume 'NAME'") when org has none of that name. */
int moat_store_volume_get(struct moat_store *s, const char *org, const char *name,
                          struct moat_store_volume *out, moat_error **err);
/* org NULL = every org's; oldest first. */
int moat_store_volume_list(struct moat_store *s, const char *org, struct moat_store_volume **out, size_t *n,
                           moat_error **err);
/* Live attachments of volume_id and/or sandbox_id (NULL: any), oldest first; free with
 * moat_store_attachments_free (*out may be NULL when *n is 0). */
int moat_store_attachments(struct moat_store *s, const char *volume_id, const char *sandbox_id,
                           struct moat_store_attachment **out, size_t *n, moat_error **err);
/* Removes org's volume name and its attachment rows, unless one is live: EBUSY naming the sandbox.
 * ENOENT when unknown. *id: the removed volume's id (caller frees). */
int moat_store_volume_delete(struct moat_store *s, const char *org, const char *name, char **id,
                             moat_error **err);
/* One volume a create asks for; volume_id is filled (owned: the caller frees it). */
struct moat_store_claim {
  const char *name, *path;
  bool read_only;
  char *volume_id;
};
/* Records sandbox_id's attachments in one transaction, or none: ENOENT ("no volume 'NAME'") for a
 * name org has no volume of; EBUSY naming the holder for a read-write claim of a volume that has
 * a live read-write attachment (read-only claims never conflict). */
int moat_store_volume_claim(struct moat_store *s, const char *org, const char *sandbox_id,
                            struct moat_store_claim *claims, size_t n, moat_error **err);

/* ---- templates (schema 5; sqlite_templates.c) ----
 * A template an org built from a Dockerfile or imported from an OCI image, by (org, name). image is
 * the host's name of the root image creates use (the driver's template name), NULL until a build
 * was ready; a rebuild keeps the previous image until it is ready itself. layers (a JSON array of
 * image names) are what its last ready build made, the cache a rebuild reuses. Sandbox and snapshot
 * rows name their image as "NAME@IMAGE" in their template column. */
struct moat_store_template {
  char *org, *name;
  char *state;    /* "building", "ready", "failed" */
  char *build_id; /* the last build */
  char *image;    /* or NULL */
  char *layers_json;
  char *source;   /* "dockerfile" or "oci" */
  char *from_ref; /* FROM as written, or the archive's image reference */
  char *config_json;
  uint64_t size_bytes;
  char *error; /* the last build's error, or NULL */
  int64_t created_at_ms, updated_at_ms;
};
void moat_store_template_clear(struct moat_store_template *t);
void moat_store_templates_free(struct moat_store_template *v, size_t n);
/* Inserts or replaces org's template name (every field). */
int moat_store_template_put(struct moat_store *s, const struct moat_store_template *t, moat_error **err);
/* ENOENT ("no template 'NAME'") when org has none of that name. */
int moat_store_template_get(struct moat_store *s, const char *org, const char *name,
                            struct moat_store_template *out, moat_error **err);
/* org NULL = every org's; by name. */
int moat_store_template_list(struct moat_store *s, const char *org, struct moat_store_template **out,
                             size_t *n, moat_error **err);
/* ENOENT when unknown. */
int moat_store_template_delete(struct moat_store *s, const char *org, const char *name, moat_error **err);
/* Marks every template still "building" as "failed" with error why (a build does not outlive moatd). */
int moat_store_templates_fail_building(struct moat_store *s, const char *why, moat_error **err);
/* Every image name in use: templates' images and layers, and the images of sandboxes that are not
 * killed and of snapshots (the part of their template after '@'). A NULL-terminated list (strv_free). */
int moat_store_images_in_use(struct moat_store *s, char ***out, moat_error **err);

/* ---- databases (schema 6; sqlite_databases.c) ----
 * An org's PostgreSQL database by id; name is unique per org, role (the login role and database
 * name) unique everywhere. volume names the org's volume holding its data directory, sandbox_id
 * the sandbox running its server (NULL before there is one). password is stored as given. */
struct moat_store_database {
  char *id, *org, *name;
  uint64_t size_mb;
  char *metadata_json;
  int64_t idle_seconds;
  char *role, *password, *volume, *sandbox_id;
  char *state; /* "creating", "running", "hibernated", "failed" */
  int64_t created_at_ms;
};
void moat_store_database_clear(struct moat_store_database *d);
void moat_store_databases_free(struct moat_store_database *v, size_t n);
/* EEXIST ("database 'NAME' exists") when org has one of that name. */
int moat_store_database_insert(struct moat_store *s, const struct moat_store_database *d, moat_error **err);
/* By id (org NULL: any org's). ENOENT ("no database ID") when org has none. */
int moat_store_database_get(struct moat_store *s, const char *org, const char *id,
                            struct moat_store_database *out, moat_error **err);
/* The database whose role is role, else (role NULL or unknown) whose role is database (the
 * name a PostgreSQL client connects to), of org only (NULL: any org's; "": none). ENOENT ("no
 * such database: user "ROLE", database "DATABASE"", the same whether another org has one or not)
 * when neither names one. */
int moat_store_database_find(struct moat_store *s, const char *org, const char *role, const char *database,
                             struct moat_store_database *out, moat_error **err);
/* org NULL = every org's; oldest first. */
int moat_store_database_list(struct moat_store *s, const char *org, struct moat_store_database **out,
                             size_t *n, moat_error **err);
/* Sets state, and sandbox_id when sandbox_id is not NULL. ENOENT when unknown. */
int moat_store_database_update(struct moat_store *s, const char *id, const char *state,
                               const char *sandbox_id, moat_error **err);
/* ENOENT when unknown. Its attachments go too. */
int moat_store_database_delete(struct moat_store *s, const char *id, moat_error **err);

/* A database given to a sandbox: its URL is in the sandbox's env under env; owned when it was
 * branched for the sandbox (it goes once the sandbox is killed). */
struct moat_store_db_attachment {
  char *sandbox_id, *env, *database_id;
  bool owned;
};
void moat_store_db_attachments_free(struct moat_store_db_attachment *v, size_t n);
/* Records a's n attachments (one transaction; sandbox_id's row need not exist yet). */
int moat_store_db_attach(struct moat_store *s, const struct moat_store_db_attachment *a, size_t n,
                         moat_error **err);
/* sandbox_id's attachments, by env name. */
int moat_store_db_attachments(struct moat_store *s, const char *sandbox_id,
                              struct moat_store_db_attachment **out, size_t *n, moat_error **err);
/* The attachments that own a database whose sandbox is killed or has no row (the databases to
 * delete). */
int moat_store_db_orphans(struct moat_store *s, struct moat_store_db_attachment **out, size_t *n,
                          moat_error **err);

/* How many sandbox events (any sandbox's) have been committed since the store opened: returned at
 * once when it is not seen, else once the next is committed or timeout_ms passed (0: at once). */
uint64_t moat_store_events_wait(struct moat_store *s, uint64_t seen, int timeout_ms);

/* ---- the audit log (sqlite_audit.c): one row per mutating call of an authenticated org ---- */
struct moat_store_audit {
  uint64_t seq; /* set by the store: increasing, never reused */
  int64_t at_ms;
  char *org, *key_id;                   /* key_id NULL when unknown */
  char *method, *route, *path, *target; /* route: the route's name; target NULL when none */
  int status;
};
void moat_store_audit_free(struct moat_store_audit *v, size_t n);
/* Records a's n rows in one transaction. */
int moat_store_audit_add(struct moat_store *s, const struct moat_store_audit *a, size_t n, moat_error **err);
/* org's rows with from_ms <= at_ms < to_ms and seq > after (target and key_id NULL: any), oldest
 * first, at most limit. */
struct moat_store_audit_query {
  const char *org, *target, *key_id;
  int64_t from_ms, to_ms;
  uint64_t after;
  unsigned limit;
};
int moat_store_audit_list(struct moat_store *s, const struct moat_store_audit_query *q,
                          struct moat_store_audit **out, size_t *n, moat_error **err);
/* Removes the rows older than before_ms: how many, or -1. */
int moat_store_audit_prune(struct moat_store *s, int64_t before_ms, moat_error **err);

/* ---- metering (sqlite_meter.c): one row per sandbox per sample, carrying the sandbox's running
 * totals since it was created (CPU ns, working-set GiB-seconds, ms alive), and per sandbox and
 * hour the totals at that hour's last sample. Usage over [from, to) is a difference of totals. */
struct moat_store_meter_sample {
  char *sandbox_id, *org;
  int64_t at_ms;
  int slot;                /* the cgroup the counter is of */
  uint64_t cpu_counter_ns; /* the cgroup's cumulative counter at at_ms */
  uint64_t cpu_ns;         /* totals */
  double mem_gib_s;
  int64_t alive_ms;
  /* the history's gauges */
  double cpu_pct, cpu_count;
  uint64_t mem_used, mem_limit;
  int64_t disk_used, disk_total, net_rx, net_tx; /* -1: not known */
};
void moat_store_meter_samples_free(struct moat_store_meter_sample *v, size_t n);
/* Records the n samples (and their hours' totals) in one transaction. */
int moat_store_meter_add(struct moat_store *s, const struct moat_store_meter_sample *v, size_t n,
                         moat_error **err);
/* The sandbox's latest sample: 0 and *out, or -1 (ENOENT when it has none). */
int moat_store_meter_last(struct moat_store *s, const char *sandbox_id, struct moat_store_meter_sample *out,
                          moat_error **err);
/* org's sandbox's samples with from_ms <= at_ms < to_ms, oldest first, at most limit. */
int moat_store_meter_series(struct moat_store *s, const char *org, const char *sandbox_id, int64_t from_ms,
                            int64_t to_ms, unsigned limit, struct moat_store_meter_sample **out, size_t *n,
                            moat_error **err);
/* A sandbox's use in one bucket: [start_ms, start_ms + bucket) as far as it lies in the range. */
struct moat_store_meter_bucket {
  int64_t start_ms;
  uint64_t cpu_ns;
  double mem_gib_s;
  int64_t alive_ms;
};
/* A sandbox's use over a range, with what it was created with. */
struct moat_store_meter_use {
  char *sandbox_id, *template_name, *metadata_json; /* template, metadata NULL: no row */
  uint64_t cpu_ns;
  double mem_gib_s;
  int64_t alive_ms;
  struct moat_store_meter_bucket *buckets; /* moat_store_meter_usage_series: those with use, in order */
  size_t n_buckets;
};
void moat_store_meter_uses_free(struct moat_store_meter_use *v, size_t n);
/* Per sandbox of org with samples in [from_ms, to_ms): its totals at the last sample before to_ms
 * minus those at the last sample before from_ms. Where the samples were pruned, the hourly totals
 * stand in (the range's ends rounded down to the hour). */
int moat_store_meter_usage(struct moat_store *s, const char *org, int64_t from_ms, int64_t to_ms,
                           struct moat_store_meter_use **out, size_t *n, moat_error **err);
/* The same, and each sandbox's use per bucket of bucket_ms (> 0) aligned to multiples of it since
 * the Unix epoch: a bucket's use is the difference of the totals at its ends (the range's ends for
 * the first and last), so the buckets sum to the range's totals. Buckets without use are left out.
 * The samples are grouped per bucket by the store (one row per bucket and sandbox). */
int moat_store_meter_usage_series(struct moat_store *s, const char *org, int64_t from_ms, int64_t to_ms,
                                  int64_t bucket_ms, struct moat_store_meter_use **out, size_t *n,
                                  moat_error **err);
/* Every org's totals over all its sandboxes (for the counters moatd exports). */
struct moat_store_meter_org {
  char *org;
  uint64_t cpu_ns;
  double mem_gib_s;
};
int moat_store_meter_org_totals(struct moat_store *s, struct moat_store_meter_org **out, size_t *n,
                                moat_error **err);
/* Removes the samples older than before_ms and the hourly rows older than hours_before_ms: how
 * many rows, or -1. */
int moat_store_meter_prune(struct moat_store *s, int64_t before_ms, int64_t hours_before_ms,
                           moat_error **err);

/* Lifecycle events of a sandbox, oldest first. */
struct moat_store_event {
  int64_t at_ms;
  char *from_state; /* NULL for the insert */
  char *to_state;
  char *reason;
};
int moat_store_events(struct moat_store *s, const char *id, struct moat_store_event **out, size_t *n,
                      moat_error **err);
void moat_store_events_free(struct moat_store_event *v, size_t n);

/* ---- orgs (sqlite_orgs.c): the tenants a platform admin manages ----
 * A row is made by org_create or implicitly by the first key or sandbox of an org. A deleted org
 * keeps its row (deleted_at_ms > 0; old sandbox rows name it) and has no keys; org_create of its id
 * makes it anew (no quotas). quotas is a JSON object (control/orgs.c validates it). */
struct moat_store_org {
  char *id;
  int64_t created_at_ms, deleting_at_ms, deleted_at_ms;
  char *quotas_json;
};
void moat_store_org_clear(struct moat_store_org *o);
void moat_store_orgs_free(struct moat_store_org *v, size_t n);
/* EEXIST when a live (not deleted) org has that id. */
int moat_store_org_create(struct moat_store *s, const char *id, int64_t at_ms, moat_error **err);
/* ENOENT when there is no row (a deleted org's row is answered: check deleted_at_ms). */
int moat_store_org_get(struct moat_store *s, const char *id, struct moat_store_org *out, moat_error **err);
/* Orgs not deleted with id > after (NULL: from the start), by id, at most limit. deleting: only those
 * whose delete began and did not end. */
int moat_store_org_list(struct moat_store *s, const char *after, unsigned limit, bool deleting,
                        struct moat_store_org **out, size_t *n, moat_error **err);
int moat_store_org_set_quotas(struct moat_store *s, const char *id, const char *quotas_json,
                              moat_error **err);
/* Marks a delete begun (at_ms) and removes every key of the org, in one transaction. */
int moat_store_org_begin_delete(struct moat_store *s, const char *id, int64_t at_ms, moat_error **err);
/* Marks the delete done. */
int moat_store_org_end_delete(struct moat_store *s, const char *id, int64_t at_ms, moat_error **err);
/* 1 when key id exists, 0 when it does not, -1 on a store error. */
int moat_store_key_exists(struct moat_store *s, const char *id, moat_error **err);

#endif

/* control.h -- the sandbox state machine, TTL reaper and reconcile: what api/ may ask of moatd
 *
 * Owns the store and the host. Every call is scoped to an org: a sandbox of another org is
 * reported exactly as a missing one (ENOENT), so the API answers 404 for both.
 * Errors: err->status is an errno value the API maps to HTTP: ENOENT 404, EINVAL 400,
 * EEXIST 409, EBUSY/EAGAIN 409/503 (state conflict / no capacity), ENOSPC 507, others 500.
 * Thread safety: all functions may be called concurrently from HTTP worker threads.
 */
#ifndef MOAT_CONTROL_H
#define MOAT_CONTROL_H

#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "../common/error.h"
#include "../common/json_cleanup.h"
#include "../host/driver.h"
#include "../proto/client/guest_client.h"
#include "../host/template.h"
#include "../store/store.h" /* the audit log's rows and query */

#define MOAT_ID_LEN 20 /* "sb-" + 17 base-36 chars; buffers are MOAT_ID_LEN + 1 */

/* Defaults and bounds; the API rejects values outside [min, max] with 400. */
#define MOAT_DEFAULT_TTL_S 3600
#define MOAT_MAX_TTL_S (30LL * 24 * 3600)
#define MOAT_DEFAULT_CPU 2.0
#define MOAT_MIN_CPU 0.05
#define MOAT_MAX_CPU 64.0
#define MOAT_DEFAULT_MEMORY_MB 2048
#define MOAT_MIN_MEMORY_MB 16
#define MOAT_MAX_MEMORY_MB (1024ULL * 1024)
#define MOAT_DEFAULT_PIDS 4096
#define MOAT_MIN_PIDS 8
#define MOAT_MAX_PIDS 1000000
#define MOAT_DEFAULT_DISK_MB 10240
#define MOAT_MIN_DISK_MB 16
#define MOAT_MAX_DISK_MB (16ULL * 1024 * 1024)
#define MOAT_MAX_OUTPUT_DEFAULT (16ULL << 20)

enum moat_sandbox_state {
  MOAT_SB_CREATING = 0,
  MOAT_SB_RUNNING,
  MOAT_SB_PAUSED,
  MOAT_SB_HIBERNATED,
  MOAT_SB_KILLED,
};
const char *moat_sandbox_state_name(enum moat_sandbox_state s);
/* Returns 0 and sets *out for a known state name, else -1. */
int moat_sandbox_state_parse(const char *name, enum moat_sandbox_state *out);

/* A volume a create mounts (control/volumes.c): all borrowed. */
#define MOAT_MAX_SANDBOX_VOLUMES 8
struct moat_volume_mount {
  const char *name;
  const char *path; /* absolute, not /, nor under /proc, /sys, /dev or /run/moat */
  bool read_only;
};

#define MOAT_MAX_SANDBOX_DATABASES 8
struct moat_sandbox_spec {
  const char *template_name; /* NULL = "base" */
  int64_t ttl_seconds;       /* 0 = default */
  bool persistent;
  json_t *metadata;          /* object of string -> string, or NULL; borrowed */
  json_t *env;               /* object of string -> string, or NULL; borrowed */
  struct moat_limits limits; /* zero fields = defaults */
  /* Time travel. */
  const char *from_snapshot;       /* snapshot id to start from (moat_host_restore), or NULL; the
                                      snapshot's template is used and template_name must be NULL
                                      or the same; zero limits default to the snapshot's */
  int64_t hibernate_after_seconds; /* persistent only: hibernate after this long idle; 0 = never */
  json_t *network;                 /* network policy (host/net/net.h) or NULL for the default; borrowed */
  struct moat_volume_mount volumes[MOAT_MAX_SANDBOX_VOLUMES];
  size_t n_volumes;
  /* Databases whose URL goes into env under the name env names: the in-sandbox one
   * (moat_control_database_sandbox_url) when this moatd has that listener, else the host's
   * (moat_control_database_url, which nothing in a sandbox reaches); an id that is not org's
   * database is ENOENT (404). All borrowed. */
  struct moat_database_attach {
    const char *id;
    const char *env; /* a variable name, [A-Za-z_][A-Za-z0-9_]* */
  } databases[MOAT_MAX_SANDBOX_DATABASES];
  size_t n_databases;
};

struct moat_sandbox_info {
  char id[MOAT_ID_LEN + 1];
  char *org;
  char *template_name;
  enum moat_sandbox_state state;
  int64_t created_at_ms;
  int64_t expires_at_ms; /* 0 when persistent */
  int64_t ttl_seconds;
  bool persistent;
  json_t *metadata; /* owned, object */
  json_t *env;      /* owned, object */
  struct moat_limits limits;
  char *killed_reason; /* NULL unless killed: "api", "ttl", "host_restart", "oom", "error" */
  int64_t killed_at_ms;
  uint64_t ready_us; /* server-side create-to-ready in microseconds */
  /* Time travel. */
  char *forked_from;               /* parent sandbox id of a fork / explore branch, or NULL */
  char *from_snapshot;             /* snapshot it was created from (or last rolled back to), or NULL */
  int64_t hibernate_after_seconds; /* 0 = never */
  int64_t paused_at_ms;            /* when paused or hibernated; 0 otherwise */
  /* Volumes it mounts (none once killed: the attachment ends with the sandbox), as created. */
  struct moat_sandbox_volume {
    char *name, *path;
    bool read_only;
  } * volumes;
  size_t n_volumes;
};
void moat_sandbox_info_clear(struct moat_sandbox_info *s);
void moat_sandbox_infos_free(struct moat_sandbox_info *v, size_t n);

struct moat_control;

struct moat_control_config {
  const char *data_dir;      /* DIR: moat.db, api-key, host state */
  const char *template_dir;  /* built templates; default DIR/templates */
  const char *recipes_dir;   /* the repo's templates/ */
  const char *guest_path;    /* build/moat-guest */
  unsigned guest_timeout_ms; /* 0 = MOAT_GUEST_TIMEOUT_MS_DEFAULT (guest_client.h) */
  unsigned pool_size;        /* warm shells of "base" */
  unsigned reap_interval_ms;
  const struct moat_net_config *net; /* sandbox networking; NULL = loopback only (host/net/net.h) */
  bool disk_overcommit;          /* accept disks the data dir cannot back (sparse); default: ENOSPC (507) */
  const char *lxcfs_dir;         /* moat_host_config.lxcfs_dir */
  uint64_t build_context_max_mb; /* a template build's context (its files' data); 0 = 1024 */
  /* The PostgreSQL proxy's address (moatd --db-listen HOST:PORT; NULL = "127.0.0.1:7432"): where
   * the proxy (api/pg) listens, and the host:port in the databases' connection URLs. */
  const char *db_listen;
  unsigned audit_retention_days;    /* how long the audit log keeps an entry; 0 = 90 */
  bool audit_off;                   /* record no audit entries (moatd --audit off) */
  int sample_interval_ms;           /* metering's sampling period; 0 = 10000, -1 = no metering */
  unsigned metrics_retention_hours; /* how long metric samples are kept; 0 = 24 */
  uint64_t log_max_bytes;           /* a sandbox's output log (logs.c) holds at most this; 0 = 16 MiB */
  uint64_t log_retention_s;         /* a killed sandbox's log is kept this long; 0 = 86400 */
  bool logs_off;                    /* no output logs: no logger reads the guests (lifecycle lines only) */
};

/* Opens the store, initialises the host, adopts or marks killed (reason host_restart) every
 * sandbox recorded as live, reconciles host leftovers, starts the reaper. 0 or -1. */
int moat_control_open(struct moat_control **out, const struct moat_control_config *cfg, moat_error **err);
void moat_control_close(struct moat_control *c);

/* ---- output logs (logs.c) ----
 * Every process's start, output and exit, as the sandbox's guest reports them, in files of the
 * data dir (at most moat_control_config.log_max_bytes a sandbox: the oldest go first, counted in
 * a `dropped` record at the head), kept through hibernation and for log_retention_s after the kill. */
enum moat_log_kind {
  MOAT_LOG_STDOUT = 1,
  MOAT_LOG_STDERR,
  MOAT_LOG_PTY,
  MOAT_LOG_START,   /* data: JSON {argv, background, pty, started_at_ms} */
  MOAT_LOG_EXIT,    /* data: JSON {exit_code, signal} */
  MOAT_LOG_LOST,    /* value bytes of (pid, stream) that the guest dropped before the log took them */
  MOAT_LOG_DROPPED, /* the first record when the bound dropped older ones: value bytes of records */
  MOAT_LOG_OOM,     /* the kernel OOM-killed in the sandbox: data JSON as GET .../events' oom */
};
struct moat_log_rec {
  enum moat_log_kind kind;
  int stream; /* 0 stdout, 1 stderr */
  int pid;
  const char *tag; /* or NULL; valid until the next call */
  int64_t at_ms;   /* when moatd wrote it */
  int64_t value;
  const uint8_t *data; /* valid until the next call */
  size_t len;
};
struct moat_log_reader;
/* A reader of the log of sandbox id of org, from its oldest record. ENOENT: no such sandbox of
 * org, or it was killed longer ago than the retention. *ended (may be NULL): it is killed. */
int moat_control_logs_open(struct moat_control *c, const char *org, const char *id,
                           struct moat_log_reader **out, bool *ended, moat_error **err);
/* 1 with the next record, 0 when none is there yet (a follower waits and calls again), -1. */
int moat_log_reader_next(struct moat_log_reader *lr, struct moat_log_rec *rec, moat_error **err);
void moat_log_reader_close(struct moat_log_reader *lr);
/* True while records of id may still come (its logger runs or it is live). */
bool moat_control_logs_writing(struct moat_control *c, const char *id);
/* Waits up to timeout_ms for a record (of any sandbox) past count seen; returns the count. */
uint64_t moat_control_logs_wait(struct moat_control *c, uint64_t seen, int timeout_ms);

/* ---- audit (audit.c) ----
 * Every mutating call of an authenticated org (the API records it once answered): time, org, key,
 * method, route, path, target, status. Kept moat_control_config.audit_retention_days. Entries are
 * written by a thread of their own, in batches (one transaction each, 20 ms after the first of it
 * came): recording costs the caller a copy; a moatd killed may lose the last 20 ms of entries. */
struct moat_audit_entry {
  int64_t at_ms;                                             /* 0: now */
  const char *org, *key_id, *method, *route, *path, *target; /* key_id, route, target may be NULL */
  int status;
};
/* Queues a to be recorded (a store failure is logged: the call it describes is done). */
void moat_control_audit_record(struct moat_control *c, const struct moat_audit_entry *a);
int moat_control_audit_list(struct moat_control *c, const struct moat_store_audit_query *q,
                            struct moat_store_audit **out, size_t *n, moat_error **err);
int64_t moat_control_audit_retention_ms(const struct moat_control *c);

/* Auth: maps an API key to its org. Returns 0 and sets *org (caller frees), or -1 (EACCES; an
 * expired key is EKEYEXPIRED). */
int moat_control_auth(struct moat_control *c, const char *api_key, char **org, moat_error **err);

/* ---- API keys (keys.c) ----
 * A key has a role: admin (everything, keys included), member (everything but managing keys),
 * readonly (GET and HEAD routes only). The API enforces roles where it routes a request. */
/* MOAT_ROLE_PLATFORM: the platform admin's key (orgs.c); moat_key_role_parse never yields it. */
enum moat_key_role { MOAT_ROLE_ADMIN = 0, MOAT_ROLE_MEMBER, MOAT_ROLE_READONLY, MOAT_ROLE_PLATFORM };
#define MOAT_KEY_ID_LEN 20   /* "key-" + 16 lowercase base-36 characters */
#define MOAT_KEY_NAME_MAX 64 /* bytes */
#define MOAT_ORG_MAX 128     /* bytes */
/* "admin", "member", "readonly" -> 0 and *role; -1 for any other string (pure). */
int moat_key_role_parse(const char *s, enum moat_key_role *role);
const char *moat_key_role_name(enum moat_key_role role);
/* A key name: 1 to MOAT_KEY_NAME_MAX bytes of printable ASCII (pure). */
bool moat_key_name_valid(const char *name);
/* A key id as moat makes them (pure). */
bool moat_key_id_valid(const char *id);
struct moat_key_info {
  char id[MOAT_KEY_ID_LEN + 1];
  char org[MOAT_ORG_MAX + 1];
  char name[MOAT_KEY_NAME_MAX + 1];
  enum moat_key_role role;
  int64_t created_at_ms;
  int64_t expires_at_ms;   /* 0 = never */
  int64_t last_used_at_ms; /* 0 = never; recorded at most once a minute */
};
/* Auth with the key's details: 0 and *out, or -1: EACCES (unknown or deleted key), EKEYEXPIRED
 * (the key expired; the message says when). Records the key's use. */
int moat_control_auth_key(struct moat_control *c, const char *api_key, struct moat_key_info *out,
                          moat_error **err);
/* Makes a key for org: 0, *out and *secret (the key, "moat_..."; caller frees; never stored), or -1
 * (EINVAL: a bad name, or expires_at_ms not in the future; 0 = never expires). */
int moat_control_keys_create(struct moat_control *c, const char *org, const char *name,
                             enum moat_key_role role, int64_t expires_at_ms, struct moat_key_info *out,
                             char **secret, moat_error **err);
/* org's keys, oldest first: 0, *out and *n (caller frees *out), or -1. */
int moat_control_keys_list(struct moat_control *c, const char *org, struct moat_key_info **out, size_t *n,
                           moat_error **err);
/* Deletes org's key id: its next request is refused. 0, or -1 (ENOENT: no such key in org). */
int moat_control_keys_delete(struct moat_control *c, const char *org, const char *id, moat_error **err);
/* A counter that grows whenever a key is revoked (a delete, its org's delete): a stream holding
 * key id checks moat_control_key_alive when it sees the counter move (atomic read; pure). */
uint64_t moat_control_keys_gen(const struct moat_control *c);
/* 1 while key id exists, 0 once it was revoked, -1 on a store error (*err). */
int moat_control_key_alive(struct moat_control *c, const char *id, moat_error **err);

/* ---- orgs and their quotas (orgs.c) ----
 * The platform admin key (`moatd key create --admin`, role "platform") belongs to the reserved org
 * MOAT_PLATFORM_ORG: it manages orgs and their quotas and nothing else (no tenant's sandboxes). */
#define MOAT_PLATFORM_ORG "_platform"
#define MOAT_E_QUOTA ECHRNG /* API 429 quota_exceeded; the message holds "over quota Q: limit L, use U" */
enum moat_quota {
  MOAT_Q_SANDBOXES = 0, /* live sandboxes: creating, running, paused (not hibernated) */
  MOAT_Q_CREATES_PER_HOUR,
  MOAT_Q_VCPUS,     /* sum of live sandboxes' cpu limits */
  MOAT_Q_MEMORY_MB, /* sum of live sandboxes' memory limits */
  MOAT_Q_TTL_SECONDS,
  MOAT_Q_SNAPSHOT_BYTES,
  MOAT_Q_VOLUMES,
  MOAT_Q_VOLUME_BYTES,
  MOAT_Q_DATABASES,
  MOAT_Q_DATABASE_BYTES,
  MOAT_Q_N
};
const char *moat_quota_name(enum moat_quota q); /* "max_sandboxes", ... */
struct moat_quotas {
  int64_t v[MOAT_Q_N]; /* -1 = unlimited */
};
/* A quotas object ({"max_sandboxes": 50, ...}; null or absent = unlimited) -> *out: EINVAL for an
 * unknown name or a value that is not an integer in 0..2^53 (pure). */
int moat_quotas_parse(const json_t *o, struct moat_quotas *out, moat_error **err);
json_t *moat_quotas_json(const struct moat_quotas *q); /* every name, null when unlimited */
/* True for an org id the API may make: [a-z0-9][a-z0-9_.-]{0,62} (pure). */
bool moat_org_id_valid(const char *id);
struct moat_org_info {
  char *id;
  int64_t created_at_ms;
  bool deleting; /* a delete began and did not finish */
  struct moat_quotas quotas;
};
void moat_org_info_clear(struct moat_org_info *o);
void moat_org_infos_free(struct moat_org_info *v, size_t n);
/* Makes org id and its first admin key (*secret, caller frees): EINVAL for a bad or reserved id,
 * EEXIST when it exists. */
int moat_control_org_create(struct moat_control *c, const char *id, struct moat_org_info *out,
                            struct moat_key_info *key, char **secret, moat_error **err);
/* ENOENT for an unknown or deleted org. */
int moat_control_org_get(struct moat_control *c, const char *id, struct moat_org_info *out, moat_error **err);
/* Orgs with id > after (NULL: first), by id, at most limit; the reserved org is not listed. */
int moat_control_org_list(struct moat_control *c, const char *after, unsigned limit,
                          struct moat_org_info **out, size_t *n, moat_error **err);
/* Deletes org id: its keys are revoked at once. Without force EBUSY while it has a live sandbox,
 * a volume, a database or a snapshot; with force they are killed and deleted first. A delete cut
 * short (a crash) is finished by the next moatd's open. */
int moat_control_org_delete(struct moat_control *c, const char *id, bool force, moat_error **err);
/* ENOENT for an unknown org. */
int moat_control_org_quotas_set(struct moat_control *c, const char *id, const struct moat_quotas *q,
                                moat_error **err);
/* The org's use against each quota now (same indexes; creates_per_hour: the creates of the last
 * hour this moatd admitted). */
int moat_control_org_usage(struct moat_control *c, const char *id, struct moat_quotas *quotas,
                           int64_t use[MOAT_Q_N], moat_error **err);
/* Before org makes a volume (kind MOAT_Q_VOLUMES) or a database (MOAT_Q_DATABASES) of add_bytes, or
 * a snapshot (MOAT_Q_SNAPSHOT_BYTES, add_bytes 0: refused once the use reached the limit): MOAT_E_QUOTA
 * when it would go over the count or the bytes. When the org has such a quota, the check holds a
 * lock (*held) that quota_storage_end releases once the thing is made or failed, so that
 * concurrent makes of one kind cannot overshoot. */
int moat_control_quota_storage_begin(struct moat_control *c, const char *org, enum moat_quota kind,
                                     int64_t add_bytes, bool *held, moat_error **err);
void moat_control_quota_storage_end(struct moat_control *c, bool held);
/* MOAT_E_QUOTA when org would go over quota q with add more (use counted by the caller, pure
 * check with the store's quotas). */
int moat_control_quota_check(struct moat_control *c, const char *org, enum moat_quota q, int64_t use,
                             int64_t add, moat_error **err);

int moat_control_create(struct moat_control *c, const char *org, const struct moat_sandbox_spec *spec,
                        struct moat_sandbox_info *out, moat_error **err);
int moat_control_get(struct moat_control *c, const char *org, const char *id, struct moat_sandbox_info *out,
                     moat_error **err);
/* state: NULL for any; meta: object of key -> value that must all match, or NULL. Killed
 * sandboxes are listed only when state asks for them. */
int moat_control_list(struct moat_control *c, const char *org, const enum moat_sandbox_state *state,
                      json_t *meta, struct moat_sandbox_info **out, size_t *n, moat_error **err);
/* One page of what moat_control_list returns, in its order (created_at_ms, then id); page NULL = all;
 * template_name (NULL = any) keeps those of that template.
 * total and more as moat_store_sandbox_page gives them (either may be NULL). Each row costs a read of
 * its volumes and a look at the live table, so a page costs what its rows do plus one count. */
int moat_control_list_page(struct moat_control *c, const char *org, const enum moat_sandbox_state *state,
                           json_t *meta, const char *template_name, const struct moat_store_page *page,
                           struct moat_sandbox_info **out, size_t *n, size_t *total, bool *more,
                           moat_error **err);

struct moat_sandbox_patch {
  bool has_ttl;
  int64_t ttl_seconds; /* new TTL from now */
  bool has_persistent;
  bool persistent;
  json_t *metadata; /* replaces metadata when non-NULL; borrowed */
};
int moat_control_update(struct moat_control *c, const char *org, const char *id,
                        const struct moat_sandbox_patch *patch, struct moat_sandbox_info *out,
                        moat_error **err);
/* Kills and records reason. Killing a killed sandbox is ENOENT (it is gone for the API).
 * Killed sandboxes: get returns them (state killed, killed_reason set) and list shows them when
 * asked for state killed; kill, update, guest and exec on them are ENOENT with the message
 * "sandbox ID was killed (REASON)" (or "no sandbox ID (already killed)"). */
int moat_control_kill(struct moat_control *c, const char *org, const char *id, const char *reason,
                      moat_error **err);

/* For exec and files: checks the sandbox is the org's and running, refreshes its TTL, and
 * returns the guest's endpoint (a copy: caller frees) and, when env is not NULL, the sandbox's env as a
 * "K=V" vector (caller frees with strv_free; moat_control_exec merges req->env over it).
 * EBUSY when not running (creating waits for the create to finish), ENOENT when killed. */
int moat_control_guest(struct moat_control *c, const char *org, const char *id, struct moat_guest_ep **ep,
                       char ***env, moat_error **err);

/* For exposed ports: the same checks as moat_control_guest (a hibernated sandbox is woken, a paused
 * one is MOAT_E_PAUSED): 0 when org's sandbox id runs, else -1. */
int moat_control_running(struct moat_control *c, const char *org, const char *id, moat_error **err);

/* For exposed ports: the same checks as moat_control_running, then a TCP connection to port on the
 * sandbox's own loopback (moat_host_port_connect: 127.0.0.1, else ::1; never the host's), its
 * connect bounded by timeout_ms. The connected fd (caller closes), or -1: ECONNREFUSED when nothing
 * listens there, ETIMEDOUT. */
int moat_control_port_connect(struct moat_control *c, const char *org, const char *id, unsigned port,
                              int timeout_ms, moat_error **err);

/* Runs a command: moat_control_guest + moat_guest_exec; req->env is merged over the sandbox env. */
int moat_control_exec(struct moat_control *c, const char *org, const char *id,
                      const struct moat_exec_req *req, struct moat_exec_result *res, moat_error **err);

/* ---- OOM kills (control/oom.c) ----
 * The source is the kernel's OOM-kill count of the sandbox's memory cgroup. A command counts as
 * OOM-killed when it ended by SIGKILL, or with exit code 137 (a shell reporting its child's
 * SIGKILL), and the count rose while it ran: an exit 137 or a SIGKILL alone is not an OOM kill.
 * Each rise of the count is announced once as an `oom` event ({pid, cmd, argv, tag, kills,
 * oom_kills, time_ms}) to the sandbox's event subscribers: by the command that claims it, else
 * (pid, cmd and tag null) by the reaper. */
struct moat_oom_proc {
  int pid;           /* in the sandbox's pid namespace; 0 when unknown */
  char *const *argv; /* or NULL */
  const char *tag;   /* or NULL */
};
/* The OOM-kill count of the running sandbox id now, to hand to moat_control_oom_ended when the
 * command started after this ends; UINT64_MAX when it cannot tell. */
uint64_t moat_control_oom_count(struct moat_control *c, const char *org, const char *id);
/* A command p of sandbox id that started when the count was before ended with exit_code/signal
 * (signal 0 when it exited): true when it was OOM-killed by the rule above. */
bool moat_control_oom_ended(struct moat_control *c, const char *org, const char *id, uint64_t before,
                            const struct moat_oom_proc *p, int exit_code, int signal);

/* Creates a new API key ("moat_" + 64 hex digits) for org in the store under data_dir, which a
 * running moatd may have open, named name (NULL: "default") with role (NULL: "admin"). Returns 0
 * and sets *key (caller frees), or -1 (EINVAL for a bad org, name or role). */
int moat_control_key_create(const char *data_dir, const char *org, const char *name, const char *role,
                            char **key, moat_error **err);
/* The E2B-shaped form of a key new_key made ("e2b_" + the same 64 hex digits; E2B's SDKs accept
 * only ^e2b_[0-9a-f]+$), or NULL for a key of another shape. Caller frees. moat_control_auth takes
 * either form for the same org; the secret is the same, so only the key's own org is reached. */
char *moat_control_key_e2b_form(const char *key);

/* ---- time travel (control/timetravel.c) ----
 *
 * Errors on top of the ones above: MOAT_E_PAUSED (API 409 sandbox_paused) from guest access to a
 * paused sandbox; MOAT_E_NO_CHECKPOINTS (API 503 checkpoints_unavailable) from every call that
 * needs a checkpoint when the host has no working CRIU; EBUSY (409) for a transition the state
 * does not allow. A hibernated sandbox is woken transparently by moat_control_guest and
 * moat_control_exec. */
#define MOAT_E_PAUSED EHOSTDOWN
#define MOAT_E_NO_CHECKPOINTS ENOPKG
/* A code context that is running code already (API 409 context_busy). */
#define MOAT_E_CTX_BUSY EINPROGRESS
/* No such code context in the sandbox (API 404 context_not_found). */
#define MOAT_E_NO_CONTEXT EIDRM

/* running -> paused (cgroup freeze; TTL clock stopped). Paused already: 0. Hibernated: EBUSY. */
int moat_control_pause(struct moat_control *c, const char *org, const char *id, moat_error **err);
/* paused -> running (thaw; expires_at moves on by the time spent paused). Running already: 0. */
int moat_control_resume(struct moat_control *c, const char *org, const char *id, moat_error **err);
/* running|paused -> hibernated: checkpoint into DATA/hibernate/ID, slot released, TTL stopped.
 * Hibernated already: 0. */
int moat_control_hibernate(struct moat_control *c, const char *org, const char *id, moat_error **err);
/* hibernated -> running: restore into a fresh slot under the same id, image removed. Running or
 * paused already: 0 (a paused one stays paused). */
int moat_control_wake(struct moat_control *c, const char *org, const char *id, moat_error **err);

struct moat_snapshot_info {
  char id[32]; /* "snap-" + 17 base-36 chars */
  char sandbox_id[MOAT_ID_LEN + 1];
  char *org;
  char *template_name;
  int64_t created_at_ms;
  uint64_t memory_bytes, disk_bytes;
  json_t *metadata; /* owned, object */
};
void moat_snapshot_info_clear(struct moat_snapshot_info *s);
void moat_snapshot_infos_free(struct moat_snapshot_info *v, size_t n);

/* Checkpoints running sandbox id (it keeps running) into DATA/snapshots/SID. The snapshot is
 * listed only once complete. metadata: object of string -> string or NULL (borrowed). */
int moat_control_snapshot_create(struct moat_control *c, const char *org, const char *id, json_t *metadata,
                                 struct moat_snapshot_info *out, moat_error **err);
/* sandbox_id NULL = all of org's snapshots; oldest first. */
int moat_control_snapshot_list(struct moat_control *c, const char *org, const char *sandbox_id,
                               struct moat_snapshot_info **out, size_t *n, moat_error **err);
int moat_control_snapshot_get(struct moat_control *c, const char *org, const char *sid,
                              struct moat_snapshot_info *out, moat_error **err);
/* Removes the snapshot's row and files. A restore reading it at that moment keeps its open files;
 * the delete never waits. ENOENT when unknown. */
int moat_control_snapshot_delete(struct moat_control *c, const char *org, const char *sid, moat_error **err);

/* Forks running sandbox id count (1..16) times: one checkpoint (the parent keeps running), then
 * count concurrent restores. *children gets count infos (caller frees with
 * moat_sandbox_infos_free): independent sandboxes with the parent's template, limits, TTL,
 * metadata and env, forked_from = id. They are given the parent's databases (its env holds their
 * URLs), or with branch_databases each child a branch of each of them (ctl_databases_for_child: the
 * child's env holds its branches' URLs; they are deleted once the child is killed; EINVAL when the
 * parent was given none). On any failure the children made are killed. */
int moat_control_fork(struct moat_control *c, const char *org, const char *id, unsigned count,
                      bool branch_databases, struct moat_sandbox_info **children, moat_error **err);

/* Returns sandbox id (running or paused) to snapshot_id (a snapshot of this same sandbox): the
 * snapshot is restored into a fresh slot, the record swapped under the same id, the old slot
 * destroyed. The sandbox is running afterwards. */
int moat_control_rollback(struct moat_control *c, const char *org, const char *id, const char *snapshot_id,
                          moat_error **err);

#define MOAT_EXPLORE_MAX_BRANCHES 16
#define MOAT_EXPLORE_TAIL 4096      /* bytes of stdout / stderr kept per branch */
#define MOAT_EXPLORE_BEST_TTL_S 600 /* keep "best": branches die this long after the explore unless kept */

enum moat_explore_keep { MOAT_KEEP_FIRST_SUCCESS = 0, MOAT_KEEP_BEST };
struct moat_explore_branch {
  const char *cmd;    /* run with /bin/sh -c in the branch */
  int64_t timeout_ms; /* 0 = 10 minutes */
};
struct moat_explore_outcome {
  char sandbox_id[MOAT_ID_LEN + 1];
  int exit_code; /* -1 when killed by a signal, timed out or not run */
  bool timed_out;
  char *stdout_tail; /* last MOAT_EXPLORE_TAIL bytes (raw, may be invalid UTF-8) */
  size_t stdout_len;
  char *stderr_tail;
  size_t stderr_len;
  json_t *files_changed; /* array of paths changed in the branch's writable layer */
  int64_t duration_ms;
  bool alive;  /* the branch sandbox still exists after the call */
  char *error; /* why the branch could not run, or NULL */
};
struct moat_explore_result {
  char explore_id[32];                   /* "exp-..." for keep best; "" otherwise */
  char winner[MOAT_ID_LEN + 1];          /* "" when none */
  int64_t expires_at_ms;                 /* keep best: when unkept branches die */
  struct moat_explore_outcome *outcomes; /* one per branch, in request order */
  size_t n;
};
void moat_explore_result_clear(struct moat_explore_result *r);
/* Forks running sandbox id once per branch, runs each branch's command concurrently and reports
 * outcomes. first_success: the first branch (by finish time) that exits 0 wins and stays as an
 * independent sandbox; all others are killed (also when none passes). best: every branch stays
 * alive for MOAT_EXPLORE_BEST_TTL_S; the client calls moat_control_explore_keep. branch_databases:
 * as moat_control_fork's (a killed branch's databases go with it). */
int moat_control_explore(struct moat_control *c, const char *org, const char *id,
                         const struct moat_explore_branch *branches, size_t n, enum moat_explore_keep keep,
                         bool branch_databases, struct moat_explore_result *out, moat_error **err);
/* keep best: promotes branch sandbox_id of explore explore_id (started from sandbox id) to an
 * independent sandbox with the parent's TTL and kills the other branches. ENOENT when unknown or
 * already decided. */
int moat_control_explore_keep(struct moat_control *c, const char *org, const char *id, const char *explore_id,
                              const char *sandbox_id, struct moat_sandbox_info *out, moat_error **err);

/* For /healthz: whether checkpoints work here and which CRIU the host uses (static storage). */
bool moat_control_can_checkpoint(struct moat_control *c);
const char *moat_control_criu_status(struct moat_control *c);

/* ---- network (control/network.c) ----
 * Without an uplink (moatd --net-uplink none, or auto on a host with no default route) sandboxes
 * have loopback only: a policy asking for the internet is EINVAL, internet: false is accepted. */

/* {internet, uplink} for /healthz (host/net/net.h moat_net_status). New reference. */
json_t *moat_control_network_status(struct moat_control *c);

/* Validates a policy object for create or PUT. 0 or -1 (EINVAL naming the entry). */
int moat_control_network_check(struct moat_control *c, json_t *policy, moat_error **err);
/* {address, dns, policy, bytes_in, bytes_out, connections} of a running sandbox, or
 * {policy: {internet: false, ...}} for one without network. New reference or NULL. */
json_t *moat_control_network_get(struct moat_control *c, const char *org, const char *id, moat_error **err);
/* Replaces the policy of a running sandbox; new connections follow it at once. Returns the new
 * state as network_get does. ENOENT for an unknown or killed sandbox, EBUSY when not running. */
json_t *moat_control_network_set(struct moat_control *c, const char *org, const char *id, json_t *policy,
                                 moat_error **err);
/* The sandbox's connection log after sequence number since (at most limit entries). */
json_t *moat_control_network_log(struct moat_control *c, const char *org, const char *id, uint64_t since,
                                 unsigned limit, moat_error **err);

/* One recorded transition of a sandbox's state. */
struct moat_sandbox_event {
  int64_t at_ms;
  char *from_state; /* NULL for its creation */
  char *to_state;
  char *reason; /* may be NULL */
};
void moat_sandbox_events_free(struct moat_sandbox_event *v, size_t n);
/* Waits until a sandbox's lifecycle event (any sandbox's) is recorded after the count seen, or
 * timeout_ms passed; returns the count (timeout_ms 0: the count now). For event streams: a
 * transition reaches them as it is recorded, not at their next poll. */
uint64_t moat_control_events_wait(struct moat_control *c, uint64_t seen, int timeout_ms);
/* The recorded lifecycle events of a sandbox (also a killed one), oldest first. ENOENT for an
 * unknown sandbox or another org's. forked_from (may be NULL): set to the parent's id for a fork's
 * child, else NULL (caller frees). */
int moat_control_sandbox_events(struct moat_control *c, const char *org, const char *id,
                                struct moat_sandbox_event **out, size_t *n, char **forked_from,
                                moat_error **err);

/* A subscription to the new connection-log entries of one sandbox (as moat_control_network_log
 * writes them), queued as the network log thread sees them: none is lost when the sandbox's
 * network goes away (hibernate, kill) before the subscriber reads. At most MOAT_CONN_QUEUE_MAX
 * wait; later ones are counted as dropped. Nothing arrives without networking. */
#define MOAT_CONN_QUEUE_MAX 1024
struct moat_conn_sub;
/* ENOENT for an unknown sandbox or another org's. */
struct moat_conn_sub *moat_control_conn_subscribe(struct moat_control *c, const char *org, const char *id,
                                                  moat_error **err);
/* The entries queued since the last call (a new array, oldest first); *dropped: how many did not
 * fit meanwhile. */
json_t *moat_conn_sub_take(struct moat_conn_sub *s, uint64_t *dropped);
void moat_conn_sub_close(struct moat_conn_sub *s); /* NULL: nothing */

/* The host's memory in MiB (what a sandbox's memory_mb may not exceed). */
uint64_t moat_control_host_memory_mb(const struct moat_control *c);

/* Templates: the recipes moatd knows and their images. */
bool moat_control_template_exists(struct moat_control *c, const char *name); /* a recipe of that name */
/* A recipe of that name, or one of org's templates (built or not). */
bool moat_control_template_known(struct moat_control *c, const char *org, const char *name);
/* Every recipe with its state (free with moat_template_infos_free). EAGAIN when moatd has none. */
int moat_control_template_list(struct moat_control *c, struct moat_template_info **out, size_t *n,
                               moat_error **err);
/* Builds template name unless it is built, blocking until it is (also when another call builds it).
 * ENOENT: no such recipe; EAGAIN when moatd has no templates. */
int moat_control_template_build(struct moat_control *c, const char *name, moat_error **err);

/* ---- templates an org builds (control/templates.c, control/builder.c) ----
 * An org's template, by name, from a Dockerfile and a build context, or imported from an OCI image
 * archive. Names are the recipes' (^[a-z0-9][a-z0-9._-]{0,62}$); a recipe's name is taken (EEXIST)
 * and another org's template is reported as a missing one. A create from it uses the image of its
 * last ready build (a rebuild keeps serving the previous one until it is ready), with the image's
 * config: its env under the create's, and its start command (ENTRYPOINT/CMD) started in the
 * background as tag "start" with the image's user and workdir; when the image has a readiness check
 * (HEALTHCHECK CMD, else one of its EXPOSEd TCP ports accepting a connection), the create waits for it
 * (ETIMEDOUT, API 504, and no sandbox when it does not pass in time). Deleting a template keeps the
 * images that sandboxes and snapshots still use until the last of them is gone. */
#define MOAT_E_TEMPLATE_BUILDING EALREADY         /* API 409 template_building */
#define MOAT_E_TEMPLATE_NOT_READY ENOTRECOVERABLE /* API 409 template_not_ready */

struct moat_user_template {
  char *name;
  char *state;    /* "building", "ready", "failed" */
  char *source;   /* "dockerfile", "oci" */
  char *build_id; /* the last build */
  char *from;     /* FROM as written, or the imported image's reference */
  char *error;    /* the last build's, or NULL */
  bool usable;    /* a create can use it (some build was ready) */
  uint64_t size_bytes;
  int64_t created_at_ms, updated_at_ms;
  json_t *config; /* owned: env, workdir, user, start, ready, exposed, labels */
};
void moat_user_template_clear(struct moat_user_template *t);
void moat_user_templates_free(struct moat_user_template *v, size_t n);

struct moat_template_build_req {
  const char *name;
  int context_fd;                /* the build context: a tar (any compression), read from where it is */
  const char *dockerfile;        /* its path in the context; NULL = "Dockerfile" */
  const char *const *build_args; /* "K=V", n_build_args of them */
  size_t n_build_args;
};
/* Checks the request (the context, the Dockerfile: EINVAL "line N: ..." for a syntax error, an
 * unknown FROM: EINVAL), records the build and starts it; out describes the template (state
 * "building"). MOAT_E_TEMPLATE_BUILDING while a build of that name runs. */
int moat_control_template_submit(struct moat_control *c, const char *org,
                                 const struct moat_template_build_req *req, struct moat_user_template *out,
                                 moat_error **err);
/* Imports an OCI image archive (oci-archive or docker save) read from archive_fd as org's template name. */
int moat_control_template_import(struct moat_control *c, const char *org, const char *name, int archive_fd,
                                 struct moat_user_template *out, moat_error **err);
int moat_control_user_template_get(struct moat_control *c, const char *org, const char *name,
                                   struct moat_user_template *out, moat_error **err);
int moat_control_user_template_list(struct moat_control *c, const char *org, struct moat_user_template **out,
                                    size_t *n, moat_error **err);
/* MOAT_E_TEMPLATE_BUILDING while it builds. */
int moat_control_user_template_delete(struct moat_control *c, const char *org, const char *name,
                                      moat_error **err);
/* A private temporary file (O_TMPFILE) for a build context or image archive as it is uploaded, and
 * the most bytes such an upload may hold. */
int moat_control_upload_spool(struct moat_control *c, moat_error **err);
uint64_t moat_control_upload_max(const struct moat_control *c);
/* A build's log from byte *offset on: the lines ({step, instruction, text, time_ms}, or the end:
 * {state, error}) appended to lines, *offset advanced, *ended once the end was read. ENOENT for a
 * build that is not org's template name's. */
int moat_control_build_log_read(struct moat_control *c, const char *org, const char *name,
                                const char *build_id, uint64_t *offset, json_t *lines, bool *ended,
                                moat_error **err);

/* ---- files uploaded for builds (control/build_files.c) ----
 * Archives an org uploads for its builds under a content hash its client computed (E2B's filesHash:
 * 64 lowercase hex digits), kept whole as they came for the build contexts made from them, at most
 * MOAT_BUILD_FILES_MAX per org (storing one more removes the least recently stored); and per
 * template name a JSON object a front end keeps about the builds it started (its own ids, tags).
 * One org never sees another's files or notes: both live under a directory of its own. */
#define MOAT_BUILD_FILES_MAX 256
bool moat_build_file_hash_valid(const char *hash); /* pure */
bool moat_control_build_file_present(struct moat_control *c, const char *org, const char *hash);
/* Stores the file spool_fd (from moat_control_upload_spool, written whole) as org's file hash,
 * replacing one of that hash. */
int moat_control_build_file_store(struct moat_control *c, const char *org, const char *hash, int spool_fd,
                                  moat_error **err);
/* *fd (caller closes) reads org's file hash; ENOENT when none was stored. */
int moat_control_build_file_open(struct moat_control *c, const char *org, const char *hash, int *fd,
                                 moat_error **err);
/* *out (caller decrefs): the notes put for org's template name, NULL when none. EINVAL: a bad name. */
int moat_control_build_notes_get(struct moat_control *c, const char *org, const char *name, json_t **out,
                                 moat_error **err);
/* Replaces them with doc (an object; NULL removes them). */
int moat_control_build_notes_put(struct moat_control *c, const char *org, const char *name, json_t *doc,
                                 moat_error **err);

/* ---- volumes (control/volumes.c) ----
 * A volume is an org's file system that outlives its sandboxes: mounted read-write by at most one
 * live sandbox at a time and read-only by any number (also while one writes). A volume of another
 * org is reported as a missing one. Volumes are not part of a checkpoint, which records only their
 * mounts: a hibernated or rolled back sandbox mounts them again as they are then; a fork's children
 * mount the parent's read-only, each with a read-only claim (MOAT_E_VOLUME_ATTACHED when a file the
 * parent holds open for writing on one cannot be reopened so); from_snapshot of a snapshot with
 * volume mounts is EINVAL. */
#define MOAT_MIN_VOLUME_MB 16
#define MOAT_E_VOLUME_IN_USE ETXTBSY       /* API 409 volume_in_use */
#define MOAT_E_NO_VOLUME ENOMEDIUM         /* API 404 volume_not_found */
#define MOAT_E_VOLUME_ATTACHED EMEDIUMTYPE /* API 409 volume_attached */

struct moat_volume_attachment {
  char *sandbox_id;
  char *path;
  bool read_only;
};
struct moat_volume_info {
  char *name;
  uint64_t size_mb;
  uint64_t used_bytes; /* as its file system reports it */
  int64_t created_at_ms;
  struct moat_volume_attachment *attached; /* live sandboxes mounting it */
  size_t n_attached;
};
void moat_volume_info_clear(struct moat_volume_info *v);
void moat_volume_infos_free(struct moat_volume_info *v, size_t n);
/* True for [a-z0-9][a-z0-9_.-]{0,62}. Pure. */
bool moat_volume_name_valid(const char *name);
/* Checks a create's volumes (at most MOAT_MAX_SANDBOX_VOLUMES, valid names, paths as
 * struct moat_volume_mount says, no path twice): 0 or -1 EINVAL naming the entry. Pure. */
int moat_volume_mounts_check(const struct moat_volume_mount *v, size_t n, moat_error **err);

/* EINVAL for a bad name or size_mb outside [MOAT_MIN_VOLUME_MB, the data dir's size]; EEXIST when
 * org has one of that name; ENOSPC when the data dir cannot back it. */
int moat_control_volume_create(struct moat_control *c, const char *org, const char *name, uint64_t size_mb,
                               struct moat_volume_info *out, moat_error **err);
/* MOAT_E_NO_VOLUME when org has none of that name. */
int moat_control_volume_get(struct moat_control *c, const char *org, const char *name,
                            struct moat_volume_info *out, moat_error **err);
int moat_control_volume_list(struct moat_control *c, const char *org, struct moat_volume_info **out,
                             size_t *n, moat_error **err);
/* MOAT_E_VOLUME_IN_USE (naming the sandbox) while a live sandbox mounts it; its storage goes. */
int moat_control_volume_delete(struct moat_control *c, const char *org, const char *name, moat_error **err);
/* Files of org's volume name with no sandbox (host/vfiles.h has the rules: paths relative to the
 * volume's root, '.' and '..' EINVAL, a symbolic link anywhere on a path ELOOP, never followed).
 * path_check: 0 when path is one of those (pure). open: *fd (caller closes) of a regular file
 * (*size) or a directory (*is_dir; list it with list). remove: a file, link or empty directory. */
int moat_control_volume_path_check(const char *path, moat_error **err);
int moat_control_volume_open(struct moat_control *c, const char *org, const char *name, const char *path,
                             int *fd, bool *is_dir, uint64_t *size, moat_error **err);
int moat_control_volume_list_dir(int dir_fd, const char *path, struct moat_file_entry **out, size_t *n,
                                 moat_error **err);
int moat_control_volume_remove(struct moat_control *c, const char *org, const char *name, const char *path,
                               moat_error **err);
/* An upload to path: written beside it and renamed over it at finish (close frees w; an unfinished
 * upload leaves what was there). */
struct moat_vfile_writer;
int moat_control_volume_write_open(struct moat_control *c, const char *org, const char *name,
                                   const char *path, uint32_t mode, struct moat_vfile_writer **w,
                                   moat_error **err);
int moat_control_volume_write(struct moat_vfile_writer *w, const char *data, size_t len, moat_error **err);
int moat_control_volume_write_finish(struct moat_vfile_writer *w, uint64_t *written, moat_error **err);
void moat_control_volume_write_close(struct moat_vfile_writer *w);

/* ---- databases (control/databases.c) ----
 * An org's PostgreSQL 15 database: a persistent sandbox of the `postgres` template whose data
 * directory (initdb --auth=scram-sha-256, fsync on) lives on a volume of the org named
 * "db-<id>" (listed in GET /v1/volumes; a live sandbox mounts it, so it cannot be deleted there
 * while the database exists). The server listens on 127.0.0.1:5432 inside the sandbox only; its
 * one login role (not a superuser) and its database are both named after the id ("db-abc" ->
 * "db_abc"), the password is 32 random characters kept in the store and shown to the org. A
 * database of another org is reported as a missing one (ENOENT). States: "creating", "running",
 * "hibernated" (no connection for idle_seconds: its sandbox is hibernated, costing no compute;
 * the next connect wakes it), "failed" (its server could not be started; delete it). */
#define MOAT_DB_ID_LEN 20 /* "db-" + 17 base-36 chars */
#define MOAT_DB_DEFAULT_SIZE_MB 1024
#define MOAT_DB_MIN_SIZE_MB 64
#define MOAT_DB_DEFAULT_IDLE_S 300
#define MOAT_DB_MAX_IDLE_S (30LL * 24 * 3600)
#define MOAT_DB_PORT 5432 /* the server's port inside its sandbox */

struct moat_database_spec {
  const char *name;     /* ^[a-z0-9][a-z0-9_-]{0,62}$, unique in the org */
  uint64_t size_mb;     /* 0 = MOAT_DB_DEFAULT_SIZE_MB; else [MOAT_DB_MIN_SIZE_MB, the data dir's size] */
  json_t *metadata;     /* object of string -> string, or NULL; borrowed */
  int64_t idle_seconds; /* 0 = MOAT_DB_DEFAULT_IDLE_S; at most MOAT_DB_MAX_IDLE_S */
};

struct moat_database_info {
  char id[MOAT_DB_ID_LEN + 1];
  char *org, *name, *state;
  uint64_t size_mb;
  int64_t idle_seconds;
  json_t *metadata; /* owned, object */
  int64_t created_at_ms;
  char *role, *password, *database; /* connection credentials (database = role) */
  char *volume;                     /* the volume's name */
  char *sandbox_id;                 /* the server's sandbox, NULL before it has one */
  int connections;                  /* open client connections (moat_control_database_conn_event) */
};
void moat_database_info_clear(struct moat_database_info *d);
void moat_database_infos_free(struct moat_database_info *v, size_t n);
/* True for ^[a-z0-9][a-z0-9_-]{0,62}$. Pure. */
bool moat_database_name_valid(const char *name);

/* Creates org's database and waits until its server accepts connections. EINVAL for a bad field,
 * EEXIST for a name org has, ENOSPC (507) when the data dir cannot back size_mb. On failure
 * nothing is left; a moatd killed during a create leaves a "creating" row that the next open
 * removes with its sandbox and volume. */
int moat_control_database_create(struct moat_control *c, const char *org,
                                 const struct moat_database_spec *spec, struct moat_database_info *out,
                                 moat_error **err);
/* ENOENT when org has no database id. */
int moat_control_database_get(struct moat_control *c, const char *org, const char *id,
                              struct moat_database_info *out, moat_error **err);
/* Oldest first. */
int moat_control_database_list(struct moat_control *c, const char *org, struct moat_database_info **out,
                               size_t *n, moat_error **err);
/* Kills its sandbox, removes its volume and its row. ENOENT when org has no database id. */
int moat_control_database_delete(struct moat_control *c, const char *org, const char *id, moat_error **err);

/* Makes org's database spec->name a branch of its database id: the source's data as of now (a
 * copy-on-write copy of its volume where the data dir's file system can, else a full copy; either
 * taken with the source's server frozen, so it holds every transaction committed before the
 * call), with its own role, password and volume, independent from then on. spec->size_mb is 0 or
 * the source's; idle_seconds 0 takes the source's. EBUSY while the source is being created or
 * deleted, ENOENT when org has no database id, EEXIST for a name org has. */
int moat_control_database_branch(struct moat_control *c, const char *org, const char *id,
                                 const struct moat_database_spec *spec, struct moat_database_info *out,
                                 moat_error **err);
/* Database id's recent events (the last 256) with seq > after, oldest first: objects {type,
 * database_id, at_ms, seq, ...}: "created" {branch_of?}, "branched" {branch_id}, "connection"
 * {opened: bool, connections}, "hibernated", "woken" {wake_ms}, "restarted" {reason}, "deleted".
 * ENOENT when org has no database id (a deleted one too). */
json_t *moat_control_database_events(struct moat_control *c, const char *org, const char *id, uint64_t after,
                                     moat_error **err);
/* moatd's counters over every org's databases since it started. */
#define MOAT_DB_WAKE_BUCKETS 8
extern const double moat_db_wake_bounds[MOAT_DB_WAKE_BUCKETS]; /* seconds */
struct moat_database_stats {
  uint64_t connections_total;             /* client connections the proxy routed */
  uint64_t wakes_total;                   /* connects that woke or restarted a server */
  uint64_t wake_le[MOAT_DB_WAKE_BUCKETS]; /* cumulative: wakes that took <= bound */
  double wake_sum_s;
};
void moat_control_database_stats(struct moat_control *c, struct moat_database_stats *out);

/* THE PROXY'S CONTRACT. A connected TCP fd (caller closes) to the server of the database whose role
 * is role, or, when role names none, whose database name is database (either may be NULL; the
 * PostgreSQL startup message's "user" and "database"), of org only: org NULL takes any org's (the
 * host listener, where the credentials are the check), else only org's (the in-sandbox listener:
 * the org of the sandbox that connected, "" when no live sandbox did), another org's database
 * being refused as an unknown one (ENOENT, the same message: nothing tells that it exists), before
 * anything of it is touched (no wake). A hibernated database is woken first, one whose sandbox
 * died is started again on its volume; the call returns once the server's port accepts (bounded
 * by timeout_ms, <= 0: 30 s). *org_out and *id_out (caller frees) name the database's org and id.
 * -1 with ENOENT when no database (of org) has that role or name, EBUSY while it is being created
 * or deleted, ETIMEDOUT, EIO when its server cannot start. */
int moat_control_database_connect(struct moat_control *c, const char *org, const char *role,
                                  const char *database, char **org_out, char **id_out, int timeout_ms,
                                  moat_error **err);
/* The proxy reports a client connection to database id opened (delta +1) or closed (-1). A database
 * with no connection for its idle_seconds (counted from its last close, or from its start) is
 * hibernated by the reaper. Unknown ids are ignored. */
void moat_control_database_conn_event(struct moat_control *c, const char *id, int delta);
/* The address the host uses to reach the databases (the proxy's, from
 * moat_control_config.db_listen), and the URL of database d there:
 * postgresql://ROLE:PASSWORD@HOST:PORT/DB?sslmode=disable (caller frees). */
const char *moat_control_db_host(const struct moat_control *c);
unsigned moat_control_db_port(const struct moat_control *c);
/* The port the proxy bound, for a db_listen of port 0 (moatd's main sets it once the proxy listens). */
void moat_control_set_db_port(struct moat_control *c, unsigned port);
char *moat_control_database_url(const struct moat_control *c, const struct moat_database_info *d);
/* The URL postgresql://ROLE:PASSWORD@HOST:PORT/DATABASE?sslmode=disable, an IPv6 HOST in brackets
 * (caller frees). Pure. */
char *moat_database_url_format(const char *host, unsigned port, const char *role, const char *password,
                               const char *database);

/* The proxy's second listener, for sandboxes: a TCP socket listening on the routing namespace's
 * service address (the sandboxes' DNS server) at MOAT_DB_SANDBOX_PORT, open to every sandbox whose
 * network is on (host/net/net.h moat_net_listen_tcp); from then on the sandbox URL below is given.
 * The fd (caller owns it), or -1: ENODEV when this moatd has no sandbox networking (sandboxes have
 * loopback only), others from the network layer. Once. */
#define MOAT_DB_SANDBOX_PORT 5432
int moat_control_database_listen_sandboxes(struct moat_control *c, moat_error **err);
/* The org of the live sandbox (running or paused, its slot bound to it) whose network address is
 * addr_be (IPv4, network order: a client address on the in-sandbox listener): 0 with *org and
 * *sandbox_id (caller frees), or -1 ENOENT when no live sandbox holds that address now. */
int moat_control_sandbox_org_at(struct moat_control *c, uint32_t addr_be, char **org, char **sandbox_id,
                                moat_error **err);
/* The URL of database d as a sandbox reaches it (the in-sandbox listener: the service address and
 * MOAT_DB_SANDBOX_PORT), or NULL when there is no such listener (caller frees). */
char *moat_control_database_sandbox_url(const struct moat_control *c, const struct moat_database_info *d);

/* ---- metrics (control/usage.c) ---- */

/* One sandbox's resource use now. sampled is false (counters zero) when it holds no slot
 * (creating, hibernated); a paused sandbox is sampled (frozen, it keeps its memory). */
struct moat_sandbox_usage {
  char id[MOAT_ID_LEN + 1];
  char org[128]; /* truncated when longer */
  enum moat_sandbox_state state;
  struct moat_limits limits;
  int64_t at_ms; /* when sampled, ms since the epoch */
  bool sampled;
  struct moat_usage u;
  bool has_disk; /* the writable layer's statfs was read */
  uint64_t disk_used_bytes, disk_total_bytes;
};
/* org's sandbox id (not killed). ENOENT for another org's, a missing or a killed one. */
int moat_control_usage(struct moat_control *c, const char *org, const char *id,
                       struct moat_sandbox_usage *out, moat_error **err);
/* A sandbox's CPU use as a percent of its limit (cpu.c). */
struct moat_cpu_pct {
  double pct;       /* of the CPU limit, 0..100 (more is clamped) */
  double window_ms; /* 0: not measured (the sandbox holds no slot) */
};
/* moat_control_usage plus the CPU percent over the window since the last call for id (measured
 * now over 100 ms when there is no fitting one). 0 or -1 as moat_control_usage. */
int moat_control_usage_cpu(struct moat_control *c, const char *org, const char *id,
                           struct moat_sandbox_usage *u, struct moat_cpu_pct *pct, moat_error **err);

/* Every live (not killed) sandbox of org, or of every org when org is NULL, at most max of them
 * (in no particular order). *out: caller frees (NULL when *n is 0). */
int moat_control_usage_list(struct moat_control *c, const char *org, size_t max,
                            struct moat_sandbox_usage **out, size_t *n, moat_error **err);

/* ---- metering (control/meter.c) ----
 * Every sandbox running or paused is sampled every sample interval and at its pause, hibernation,
 * kill and moatd's stop: CPU time from its cgroup's cumulative counter, working-set memory
 * integrated over the time between samples (a paused sandbox: memory only; hibernated: nothing). */
enum moat_usage_group {
  MOAT_USAGE_BY_SANDBOX,
  MOAT_USAGE_BY_ORG,
  MOAT_USAGE_BY_TEMPLATE,
  MOAT_USAGE_BY_METADATA
};
/* A group's use in one bucket, [start_ms, start_ms + bucket) within the range. */
struct moat_usage_point {
  int64_t start_ms;
  double cpu_seconds, memory_gib_seconds, sandbox_seconds;
};
struct moat_usage_row {
  char *key; /* NULL: the sandboxes without that metadata key */
  double cpu_seconds, memory_gib_seconds, sandbox_seconds;
  struct moat_usage_point *series; /* bucket_ms > 0: the buckets with use, in order; they sum to the above */
  size_t n_series;
};
void moat_usage_rows_free(struct moat_usage_row *v, size_t n);
/* org's use over [from_ms, to_ms), grouped (meta_key: the metadata key for BY_METADATA), the
 * largest CPU first; with bucket_ms > 0 each group's use also per bucket of bucket_ms aligned to
 * multiples of it since the Unix epoch (moat_store_meter_usage_series). What was sampled before the
 * call is counted. */
int moat_control_usage_query(struct moat_control *c, const char *org, int64_t from_ms, int64_t to_ms,
                             enum moat_usage_group g, const char *meta_key, int64_t bucket_ms,
                             struct moat_usage_row **out, size_t *n, moat_error **err);
/* The metric samples of org's sandbox id (live or killed) with from_ms <= at < to_ms, oldest first,
 * at most limit. ENOENT for a sandbox that is not org's. */
int moat_control_metrics_series(struct moat_control *c, const char *org, const char *id, int64_t from_ms,
                                int64_t to_ms, unsigned limit, struct moat_store_meter_sample **out,
                                size_t *n, moat_error **err);
/* org's totals over every sandbox it ever ran (false when metering is off). */
bool moat_control_meter_org_totals(struct moat_control *c, const char *org, double *cpu_seconds,
                                   double *memory_gib_seconds);
int64_t moat_control_metrics_retention_ms(const struct moat_control *c);

#define MOAT_LATENCY_BUCKETS 9
/* Upper bounds in seconds of the create-latency histogram buckets (ascending). */
extern const double moat_create_latency_bounds[MOAT_LATENCY_BUCKETS];
/* moatd-wide counts from the store (every org, every sandbox this data dir ever recorded). */
struct moat_control_stats {
  uint64_t by_state[MOAT_SB_KILLED + 1];
  uint64_t created_total;                    /* rows in any state */
  uint64_t latency_le[MOAT_LATENCY_BUCKETS]; /* cumulative: creates with ready time <= bound */
  uint64_t latency_count;
  double latency_sum_s;
};
int moat_control_stats(struct moat_control *c, struct moat_control_stats *out, moat_error **err);

/* The host now (hostinfo.c): its capacity and load as the driver reports them, and the live
 * sandboxes of one org (or of every org) by state with the vCPUs and memory their limits commit.
 * Hibernated sandboxes hold no slot and commit nothing. */
struct moat_host_info {
  struct moat_host_capacity cap;
  uint64_t by_state[MOAT_SB_KILLED + 1];
  double committed_vcpus;       /* of the running and paused */
  uint64_t committed_memory_mb; /* of the running and paused */
};
void moat_control_host_info(struct moat_control *c, const char *org, struct moat_host_info *out);

/* ---- code contexts (contexts.c): persistent python/node/bash interpreters in a sandbox ---- */
#define MOAT_CTX_ID_LEN 16 /* [a-z0-9] */
struct moat_ctx {
  char id[MOAT_CTX_ID_LEN + 1];
  const char *language; /* "python", "node" or "bash" (static) */
  char *cwd;
  char *user; /* NULL: root */
  int64_t created_at_ms;
  int pid; /* the kernel's, in the guest */
};
void moat_ctx_clear(struct moat_ctx *x);
void moat_ctxs_free(struct moat_ctx *v, size_t n);
bool moat_ctx_valid_id(const char *s);
bool moat_ctx_language_known(const char *name);

/* Starts a kernel of language in cwd (as user, NULL: root) in org's sandbox sid. EINVAL for an
 * unknown language or one whose interpreter the sandbox lacks, ENOENT for a cwd that is not there. */
int moat_ctx_create(struct moat_control *c, const char *org, const char *sid, const char *language,
                    const char *cwd, const char *user, struct moat_ctx *out, moat_error **err);
/* The running contexts of the sandbox; *out freed with moat_ctxs_free. */
int moat_ctx_list(struct moat_control *c, const char *org, const char *sid, struct moat_ctx **out, size_t *n,
                  moat_error **err);
/* MOAT_E_NO_CONTEXT when the sandbox has no context cid. */
int moat_ctx_delete(struct moat_control *c, const char *org, const char *sid, const char *cid,
                    moat_error **err);
/* Kills and starts again the kernel (same language, cwd and user; its variables are gone).
 * MOAT_E_NO_CONTEXT, or MOAT_E_CTX_BUSY while a run is in progress. */
int moat_ctx_restart(struct moat_control *c, const char *org, const char *sid, const char *cid,
                     struct moat_ctx *out, moat_error **err);
/* Starts context cid of language unless it runs already (two callers at once start one). */
int moat_ctx_ensure(struct moat_control *c, const char *org, const char *sid, const char *cid,
                    const char *language, const char *cwd, const char *user, moat_error **err);

/* A run: the cell's output as events, in order, then END once; the outcome is final after END. */
enum moat_ctx_event_type { MOAT_CTX_STDOUT = 1, MOAT_CTX_STDERR, MOAT_CTX_RESULT, MOAT_CTX_END };
struct moat_ctx_event {
  enum moat_ctx_event_type type;
  const char *text; /* STDOUT/STDERR: raw bytes (not necessarily UTF-8 or whole characters) */
  size_t len;
  json_t *result; /* RESULT: {text, png, html, json, is_main_result} (null formats it lacks); borrowed */
};
struct moat_ctx_outcome {
  int execution_count;
  bool timed_out;     /* SIGINT was sent at the run's timeout */
  bool restarted;     /* the kernel died or did not stop: it was started again */
  bool has_exit_code; /* bash: the cell's status */
  int exit_code;
  json_t *error; /* {name, value, traceback: [lines]} or NULL; borrowed */
};
struct moat_ctx_run_opts {
  uint32_t timeout_ms;
  json_t *env;             /* for this cell only, {NAME: value} (names checked by the caller); may be NULL */
  bool (*wait)(void *arg); /* while the context is busy: true to wait, false: MOAT_E_CTX_BUSY; NULL: false */
  void *wait_arg;
};
struct moat_ctx_run;
/* Sends code to context cid. EINVAL for code with a NUL, MOAT_E_NO_CONTEXT, MOAT_E_CTX_BUSY (see opts->wait).
 */
int moat_ctx_run_start(struct moat_control *c, const char *org, const char *sid, const char *cid,
                       const char *code, size_t code_len, const struct moat_ctx_run_opts *opts,
                       struct moat_ctx_run **out, moat_error **err);
/* The next event, waiting up to timeout_ms (< 0: until there is one): 1 and *out (valid until the
 * next call), or 0 when none came in time or END was handed out already. Timeouts and dead kernels
 * are handled here: call it until END. */
int moat_ctx_run_next(struct moat_ctx_run *u, struct moat_ctx_event *out, int timeout_ms);
const struct moat_ctx_outcome *moat_ctx_run_outcome(const struct moat_ctx_run *u);
/* SIGINT to the cell (its caller left); the run still ends with END. */
void moat_ctx_run_interrupt(struct moat_ctx_run *u);
/* Frees the run and gives the context back (a run not at its end is left to the kernel). */
void moat_ctx_run_close(struct moat_ctx_run *u);

#endif

/* control_internal.h -- what the files of src/control share: the table of live sandboxes, the
 * control handle and the state-machine helpers control.c offers timetravel.c
 *
 * Locking (see control.c): c->lock guards the table only; each live sandbox's mutex m is held
 * across its state transitions, never c->lock inside it.
 */
#ifndef MOAT_CONTROL_INTERNAL_H
#define MOAT_CONTROL_INTERNAL_H

#include <pthread.h>

#include "../store/store.h"
#include "control.h"
#include "spec.h"

#define NBUCKETS 4096
#define DEFAULT_REAP_INTERVAL_MS 1000
#define API_KEY_FILE "api-key"
#define DEFAULT_ORG "default"

/* A sandbox's metering state (meter.c): its running totals and the last reading of its cgroup. */
struct ctl_meter_live {
  bool loaded;         /* totals read from the store (or known to be zero) */
  int slot;            /* the cgroup last read; valid while at_ms != 0 */
  int64_t at_ms;       /* the last reading; 0: none since the sandbox got its slot */
  uint64_t at_ns;      /* its monotonic time (now_ns): intervals are measured on it */
  int64_t last_ms;     /* the time of its last sample: each next one is later, whatever the clock does */
  uint64_t counter_ns; /* the cgroup's CPU counter then */
  uint64_t ws_bytes;   /* the working set then */
  uint64_t cpu_ns;     /* totals since the sandbox was created */
  double mem_gib_s;
  int64_t alive_ms;
};

struct live {
  char id[MOAT_ID_LEN + 1];
  char *org;
  struct live *next;     /* hash chain; c->lock */
  unsigned refs;         /* c->lock: the table's reference plus one per user */
  bool in_table;         /* c->lock */
  bool counted;          /* c->lock: counts against its org's live quotas (orgs.c) */
  int64_t rate_at_ms;    /* c->lock: its create's mark in the org's creates_per_hour window, or 0 */
  bool logged;           /* c->lock: a logger of logs.c runs for it (set and cleared by its manager) */
  int inflight;          /* execs running now (counted under m, see acquire_running); atomic */
  bool health_check;     /* a check of an unanswering guest runs (health.c); atomic */
  int64_t expires_at_ms; /* atomic reads allowed (get/list overlay it); written under m */
  int64_t last_api_ms;   /* last API use (guest access); atomic */

  pthread_mutex_t m; /* guards the rest */
  enum moat_sandbox_state state;
  int slot; /* -1 while it holds none (creating, hibernated) */
  pid_t pid;
  uint64_t start_time;
  struct moat_guest_ep guest; /* path[0] == '\0' while it holds no slot */
  json_t *env;                /* the sandbox's env object */
  int64_t ttl_seconds;
  bool persistent;
  int64_t db_expires_at_ms; /* expiry last written to the store */
  /* time travel */
  char *template_name;
  struct moat_limits limits;
  int64_t paused_at_ms;      /* paused or hibernated since, else 0 */
  int64_t hibernate_after_s; /* idle hibernation; 0 = never */
  uint64_t idle_cpu_ns;      /* reaper: cgroup CPU usage at idle_sample_ms */
  int64_t idle_sample_ms;
  int64_t busy_at_ms;          /* reaper: last time CPU use was above the idle threshold */
  struct ckpt_ref *fork_image; /* while paused: the checkpoint a fork took, reused by later forks */
  /* oom.c: the slot's OOM-kill count that oom events announced already (UINT64_MAX: not known
   * yet, the reaper's next reading is the baseline), and the count at the reaper's last pass */
  uint64_t oom_reported, oom_seen;
  struct ctl_meter_live meter; /* meter.c, under m */
};
struct ckpt_ref; /* timetravel.c */

struct explore; /* timetravel.c */

struct moat_control {
  char *data_dir;
  char *snap_dir; /* DATA/snapshots */
  char *hib_dir;  /* DATA/hibernate */
  char *tmp_dir;  /* DATA/checkpoints-tmp: fork images */
  struct moat_store *store;
  struct moat_templates *templates;
  char *template_dir; /* the recipes' images */
  char *images_dir;   /* DATA/images: the images of orgs' templates (templates.c) */
  char *builds_dir;   /* DATA/builds: build logs and contexts (builder.c) */
  char *baked_dir;    /* DATA/baked: templates' start states (templates.c) */
  /* templates.c: a create holds it for reading from the choice of its image until its row names
   * it; the removal of unused images holds it for writing */
  pthread_rwlock_t images_lock;
  pthread_mutex_t build_lock; /* builder.c: a leaf, guards builds */
  pthread_cond_t build_cond;  /* builder.c: a build ended */
  struct ctl_build *builds;   /* builder.c: the builds running now */
  unsigned builds_running;
  unsigned builds_detached;         /* build threads not yet ended; build_lock */
  uint64_t build_context_max_bytes; /* a build context's file data */
  struct moat_host *host;
  struct moat_spec_bounds bounds;

  /* Lock order: a sandbox's m, then lock (a kill removes its entry from the table under m).
   * lock, reap_lock, explore_lock, ctx_lock and conn_lock are leaves: nothing else is locked and no
   * guest, host or store call is made under them. */
  pthread_mutex_t lock; /* guards buckets and each entry's refs, next and in_table */
  struct live *buckets[NBUCKETS];

  pthread_t reaper;
  bool reaper_started;
  pthread_mutex_t reap_lock;
  pthread_cond_t reap_cond;
  bool stop;         /* reap_lock; read atomically by health.c */
  int health_checks; /* health.c threads running; atomic */
  bool health_open;
  unsigned reap_interval_ms;

  struct ctl_cpu *cpu; /* cpu.c: previous CPU samples */

  pthread_mutex_t explore_lock;
  struct explore *explores;   /* keep-best explores awaiting a choice; explore_lock */
  struct snap_use *snap_uses; /* timetravel.c: snapshots being restored; explore_lock */

  pthread_mutex_t conn_lock;       /* events.c: a leaf */
  struct moat_conn_sub *conn_subs; /* connection-log subscriptions; conn_lock */

  pthread_mutex_t ctx_lock;
  struct ctl_ctx_busy *ctx_busy; /* contexts.c: contexts with a run in progress; ctx_lock */

  pthread_mutex_t db_lock;         /* databases.c: a leaf, guards dbs' counts */
  struct ctl_db *dbs;              /* databases.c: connection counts and start mutexes */
  struct ctl_db_events *db_events; /* database_events.c: recent events and counters */
  struct ctl_audit *audit;         /* audit.c: the entries being written */
  struct ctl_logs *logs;           /* logs.c: the output logs' writers and their manager */
  int64_t audit_retention_ms;      /* audit.c */
  int64_t audit_pruned_ms;         /* the reaper thread's */
  struct ctl_meter *meter;         /* meter.c: the sampler; NULL when metering is off */
  char *db_host; /* the proxy's address in connection URLs (moat_control_config.db_listen) */
  unsigned db_port;
  /* the proxy's in-sandbox listener (moat_control_database_listen_sandboxes): its address and
   * port in sandbox URLs; port 0 (atomic) while there is none */
  char db_sandbox_host[16];
  unsigned db_sandbox_port;
  /* orgs.c: the creates of the last hour per org and the orgs being deleted (c->lock); keys_gen
   * (atomic) grows with every revocation */
  struct ctl_org_rate *rates;
  char **deleting_orgs;
  size_t n_deleting;
  uint64_t keys_gen;
};

/* ---- logs.c ---- */
int ctl_logs_open(struct moat_control *c, uint64_t max_bytes, uint64_t retention_s, moat_error **err);
int ctl_logs_start(struct moat_control *c, moat_error **err); /* the manager thread */
void ctl_logs_close(struct moat_control *c);                  /* before the table goes */
/* Closes sandbox id's log connection to its guest (waiting up to 2 s, also for one being opened), so
 * that a checkpoint finds none open, and holds the logger from opening another until
 * ctl_logs_reattach (the sandbox's m, which the caller holds, does not: the logger may be past its
 * look at the sandbox, connecting). */
void ctl_logs_detach(struct moat_control *c, const char *id);
void ctl_logs_reattach(struct moat_control *c, const char *id);
/* 1 while sandbox id's logger holds a connection to its guest, else 0. */
int ctl_logs_connected(struct moat_control *c, const char *id);
/* An OOM kill in sandbox id (oom.c's event) as an `oom` record of its log. */
void ctl_logs_note_oom(struct moat_control *c, const char *id, json_t *ev);

/* ---- control.c ---- */
struct live *live_get(struct moat_control *c, const char *id); /* reference taken, or NULL */
void live_put(struct moat_control *c, struct live *e);
/* Every live sandbox (of org; NULL: all), at most max, each with a reference taken: the caller
 * live_puts each and frees the array. */
struct live **live_all(struct moat_control *c, const char *org, size_t max, size_t *n);
void live_add(struct moat_control *c, struct live *e);
void live_add_locked(struct moat_control *c, struct live *e); /* c->lock held */
/* Calls fn for each entry in the table (c->lock held: fn locks nothing). */
void live_each_locked(struct moat_control *c, void (*fn)(struct live *e, void *arg), void *arg);
void live_remove(struct moat_control *c, struct live *e);
struct live *live_new(const char *id, const char *org);
/* Takes the guest endpoint of e's new slot (m held). */
void ctl_set_guest(struct live *e, const struct moat_instance *inst);
json_t *parse_object(const char *text); /* never NULL */
char *dump_object(json_t *j);           /* "{}" for NULL */
void info_from_row(struct moat_control *c, const struct moat_store_sandbox *r, struct moat_sandbox_info *out);
/* Tears e down (m held, not killed), records it killed with reason, removes it from the table.
 * Returns 0, or -1 with *err (may be NULL) when the record could not be written: the sandbox is gone
 * all the same, its row still says otherwise until a kill of the row (moat_control_kill of a sandbox
 * not live) or a restart's reconcile records it. */
int kill_locked(struct moat_control *c, struct live *e, const char *reason, moat_error **err);
int not_live_error(struct moat_control *c, const char *org, const char *id, moat_error **err);
void refresh_ttl(struct moat_control *c, struct live *e); /* m held */

/* A sandbox to make: fresh from its template, or restored from a checkpoint dir. */
struct ctl_new {
  const char *template_name;
  struct moat_limits limits; /* resolved */
  int64_t ttl_seconds;
  bool persistent;
  json_t *metadata;          /* borrowed, may be NULL */
  json_t *env;               /* borrowed, may be NULL */
  const char *restore_dir;   /* NULL = moat_host_create */
  const char *forked_from;   /* recorded, may be NULL */
  const char *from_snapshot; /* recorded, may be NULL */
  int64_t hibernate_after_s;
  json_t *network; /* network policy, borrowed; NULL = default (a fork: its parent's) */
  const struct moat_volume_mount *volumes; /* borrowed, n_volumes of them, checked */
  size_t n_volumes;
  /* the databases whose URLs env holds, recorded with the row (sandbox_id is filled in there) */
  const struct moat_store_db_attachment *databases;
  size_t n_databases;
};
/* Creates (records, builds or restores, marks running) a sandbox; fills out when not NULL and
 * id (MOAT_ID_LEN + 1) when not NULL. On failure nothing is left but a row recorded killed. */
int ctl_create(struct moat_control *c, const char *org, const struct ctl_new *n, char *id,
               struct moat_sandbox_info *out, moat_error **err);

/* ---- orgs.c ---- */
/* Adds e (a new create, m held) to the table unless its org is being deleted (EACCES) or the create
 * would go over the org's quotas q (MOAT_E_QUOTA): the check and the reservation are one step
 * under c->lock. q NULL: no quotas. */
int ctl_live_admit(struct moat_control *c, struct live *e, const struct moat_quotas *q, moat_error **err);
/* A create that failed after ctl_live_admit: its mark in the hourly window goes (before live_remove). */
void ctl_live_unadmit(struct moat_control *c, struct live *e);
/* Org's quotas from the store (all unlimited for an org without a row). */
int ctl_quotas_load(struct moat_control *c, const char *org, struct moat_quotas *q, moat_error **err);
/* Before a wake of e (m held, hibernated): reserves its live use, or MOAT_E_QUOTA. */
int ctl_quota_wake(struct moat_control *c, struct live *e, moat_error **err);
/* e stops counting (hibernated, or a wake failed). */
void ctl_live_uncount(struct moat_control *c, struct live *e);
/* MOAT_E_QUOTA unless count more sandboxes of limits fit org's live quotas now (no reservation). */
int ctl_quota_precheck(struct moat_control *c, const char *org, unsigned count, const struct moat_limits *l,
                       moat_error **err);
/* At open: finishes the org deletes a crash cut short. */
void ctl_orgs_open(struct moat_control *c);
void ctl_orgs_close(struct moat_control *c);
/* A key was revoked: streams recheck theirs (keys.c). */
void ctl_keys_revoked(struct moat_control *c);

/* ---- volumes.c ---- */
/* Before a create records anything: every volume is org's and no read-write one is held. */
int ctl_volumes_precheck(struct moat_control *c, const char *org, const struct moat_volume_mount *v, size_t n,
                         moat_error **err);
/* Makes org's volume dst_name a copy of its volume src_name as it is now (moat_host_volume_copy:
 * the caller stops src_name's writers). EEXIST when dst_name exists, MOAT_E_NO_VOLUME when
 * src_name does not. */
int ctl_volume_copy(struct moat_control *c, const char *org, const char *src_name, const char *dst_name,
                    moat_error **err);
/* Records sandbox id's volumes (its row exists), atomically against other creates. */
int ctl_volumes_claim(struct moat_control *c, const char *org, const char *id,
                      const struct moat_volume_mount *v, size_t n, moat_error **err);
/* Mounts the claimed volumes into the sandbox in slot, in order. */
int ctl_volumes_attach(struct moat_control *c, const char *id, int slot, moat_error **err);
/* At open: removes the storage of volumes no record names (a crash between making and recording
 * one, or between a delete's record and its storage). Logs what it cannot. */
void ctl_volumes_gc(struct moat_control *c);
/* MOAT_E_VOLUME_ATTACHED naming the volume when org's sandbox id mounts one (what: "hibernate"...). */
/* Fills out->volumes with id's live attachments (none on a store error, which is logged). */
void ctl_volumes_of(struct moat_control *c, const char *id, struct moat_sandbox_info *out);

/* ---- templates.c ---- */
/* Makes sure DATA/api-key exists and is registered for the default org (keys.c). */
int ctl_ensure_api_key(struct moat_control *c, moat_error **err);
bool ctl_template_name_valid(const char *name); /* ^[a-z0-9][a-z0-9._-]{0,62}$ */
/* The dir holding image: DATA/images for an org's (moat_host_image_name), else the template dir. */
const char *ctl_image_dir(const struct moat_control *c, const char *image);
/* The image a template column names (after '@'), the name the API shows (before it, caller frees). */
const char *ctl_image_of(const char *column);
char *ctl_template_display(const char *column);
void ctl_user_template_from_row(const struct moat_store_template *r, struct moat_user_template *out);
/* What a create of template name for org uses: *column ("NAME" for a recipe, which is built if it
 * is not; "NAME@IMAGE" for org's template) and *config (the image config, NULL for a recipe). The
 * caller holds images_lock for reading until the sandbox row exists. EINVAL for an unknown name,
 * MOAT_E_TEMPLATE_NOT_READY when no build of it was ready. */
int ctl_template_resolve(struct moat_control *c, const char *org, const char *name, char **column,
                         json_t **config, moat_error **err);
/* A JSON array of strings as a NULL-terminated list (strv_free); NULL for a non-array, and with
 * empty_is_null for an empty one. */
char **ctl_json_strv(json_t *a, bool empty_is_null);
/* Sets K in the env object from a "K=V" entry (one without a name before '=' is left out). */
void ctl_env_set_kv(json_t *env, const char *kv);
/* The create's env (object or NULL) over the image config's (a new object). */
json_t *ctl_template_env(json_t *config, json_t *env);
/* Starts the image's start command in the new sandbox id and waits for its readiness check. */
int ctl_template_start(struct moat_control *c, const char *org, const char *id, json_t *config,
                       moat_error **err);
/* The checkpoint of a sandbox of the template column (image config config) taken once its start
 * command was ready, for org's creates that ask for nothing the start state depends on (env,
 * network policy, volumes): a path (caller frees), or NULL when the template has no start command
 * or the host no checkpoints. ctl_template_bake writes it from the new sandbox id. */
char *ctl_template_bake_path(struct moat_control *c, const char *org, const char *column, json_t *config);
void ctl_template_bake(struct moat_control *c, const char *org, const char *id, const char *column,
                       const char *path);
/* Removes the images (moat_host_image_name) nothing uses: no template, running build, live sandbox
 * or snapshot. */
void ctl_images_gc(struct moat_control *c);

/* ---- builder.c ---- */
int ctl_builder_open(struct moat_control *c, moat_error **err); /* builds a crash cut short are failed */
void ctl_builder_close(struct moat_control *c);                 /* waits for running builds */
bool ctl_build_running(struct moat_control *c, const char *org, const char *name);
bool ctl_build_uses(struct moat_control *c, const char *image); /* build_lock: a leaf */

/* ---- cpu.c ---- */
struct ctl_cpu *ctl_cpu_new(void);
void ctl_cpu_free(struct ctl_cpu *p);

/* ---- events.c ---- */
/* Takes the network's log entries for subscriptions (once the host is up). */
void ctl_events_open(struct moat_control *c);
/* Queues entry (an object with "kind" and "time_ms") to every event subscriber of sandbox id. */
void ctl_events_push(struct moat_control *c, const char *id, json_t *entry);

/* ---- oom.c ---- */
/* A new slot (create, restore, wake): its cgroup has counted no OOM kill (m held). */
void ctl_oom_reset(struct live *e, bool known_zero);
/* e's OOM-kill count now, UINT64_MAX when it cannot tell. */
uint64_t ctl_oom_count(struct moat_control *c, struct live *e);
/* A command of e ended: see moat_control_oom_ended. */
bool ctl_oom_ended(struct moat_control *c, struct live *e, uint64_t before, const struct moat_oom_proc *p,
                   int exit_code, int signal);
/* Reaper pass over a running sandbox no exec is busy in (m held): announces OOM kills no ended
 * command claimed, once the count has stood still for a whole pass. */
void ctl_oom_reap(struct moat_control *c, struct live *e);

/* ---- databases.c ---- */
/* Parses moat_control_config.db_listen (NULL: 127.0.0.1:7432) into c->db_host and c->db_port. */
int ctl_databases_config(struct moat_control *c, const char *listen, moat_error **err);
/* At open, after recover(): finishes the creates, branches and deletes a moatd cut short (removes
 * them) and resumes the servers a branch cut short left frozen. */
void ctl_databases_open(struct moat_control *c);
/* Reaper pass: hibernates the sandbox of each database with no connection for its idle_seconds. */
void ctl_databases_reap(struct moat_control *c, int64_t now_ms);
void ctl_databases_close(struct moat_control *c);
/* spec's env (a copy, or a new object) with the URL of each of spec->databases under its name:
 * NULL with ENOENT for an id that is not one of org's databases, EINVAL for a bad count. */
json_t *ctl_databases_env(struct moat_control *c, const char *org, const struct moat_sandbox_spec *spec,
                          moat_error **err);

/* A fork child's env and database attachments (*att_out, np of them, caller frees with
 * moat_store_db_attachments_free) from its parent's (parent_env, patt): the same databases, or with
 * branch a new branch of each (owned by the child: it goes once the child is killed) whose URL
 * replaces the parent's in env. NULL on failure, with no branch left. */
json_t *ctl_databases_for_child(struct moat_control *c, const char *org, const char *parent_id,
                                const json_t *parent_env, const struct moat_store_db_attachment *patt,
                                size_t np, bool branch, struct moat_store_db_attachment **att_out,
                                moat_error **err);
/* Deletes the databases among att's n that it owns (a child that was not made). Logged. */
void ctl_databases_drop_owned(struct moat_control *c, const char *org, struct moat_store_db_attachment *att,
                              size_t n);

/* ---- audit.c ---- */
/* The audit writer thread (after the store is open) / its stop, once what is queued is written
 * (before the store closes). */
int ctl_audit_open(struct moat_control *c, moat_error **err);
void ctl_audit_close(struct moat_control *c);
/* Reaper pass: once a minute, the entries older than the retention go. */
void ctl_audit_reap(struct moat_control *c, int64_t now_ms);

/* ---- meter.c ---- */
int ctl_meter_open(struct moat_control *c, int interval_ms, unsigned retention_hours, moat_error **err);
/* Takes a final sample of every live sandbox, writes what is queued, stops the sampler. */
void ctl_meter_close(struct moat_control *c);
/* e (m held) got a new slot whose cgroup counts from zero: metering starts from now. */
void ctl_meter_begin(struct moat_control *c, struct live *e);
/* A sample of e now (m held; running or paused with a slot, else nothing): before a pause, and
 * by the sampler. */
void ctl_meter_sample(struct moat_control *c, struct live *e);
/* The last sample of e's slot before the slot goes (kill, hibernate, rollback; m held). */
void ctl_meter_end(struct moat_control *c, struct live *e);
/* Reaper pass: once a minute, samples older than the retention go. */
void ctl_meter_reap(struct moat_control *c, int64_t now_ms);

/* ---- database_events.c ---- */
void ctl_db_events_open(struct moat_control *c);
void ctl_db_events_close(struct moat_control *c);
/* Appends an event of database id: fields (stolen; NULL for none) with type, database_id, at_ms and
 * seq added. Types: created, branched, connection, hibernated, woken, restarted, deleted. */
void ctl_db_event(struct moat_control *c, const char *id, const char *type, json_t *fields);
/* Drops id's events (the database is gone). */
void ctl_db_events_forget(struct moat_control *c, const char *id);
/* A connect that had to wake or restart its database's server took seconds. */
void ctl_db_wake_observed(struct moat_control *c, double seconds);

/* ---- contexts.c ---- */
void ctl_ctx_close(struct moat_control *c);

/* ---- health.c ---- */
/* Sets the guest timeout (0 = default) and takes guest_client's unreachable reports. */
void ctl_health_open(struct moat_control *c, unsigned guest_timeout_ms);
/* Stops taking reports and waits for running checks (c->stop set). */
void ctl_health_close(struct moat_control *c);

/* ---- network.c ---- */
/* Binds the new sandbox id's network slot (host slot) to its policy; for a fork without one, the
 * parent's. 0 when the sandbox has no network slot and the policy asks for none; -1 otherwise on error. */
int ctl_net_bind(struct moat_control *c, const char *id, const char *org, int slot, json_t *policy,
                 const char *forked_from, moat_error **err);
/* The sandbox id is killed: its saved policy goes. */
void ctl_net_forget(struct moat_control *c, const char *id);

/* ---- timetravel.c ---- */
/* Checkpoints org's running sandbox id into dir (made here; it must not exist), leaving it running. */
int tt_checkpoint_running(struct moat_control *c, const char *org, const char *id, const char *dir,
                          moat_error **err);
/* moat_control_create with spec->from_snapshot set. */
int tt_create_from_snapshot(struct moat_control *c, const char *org, const struct moat_sandbox_spec *spec,
                            struct moat_sandbox_info *out, moat_error **err);
/* At open, after the store is up and before recover(): makes the snapshot, hibernate and temp
 * dirs, removes partial snapshots and snapshot dirs without a row. 0 or -1. */
int tt_open(struct moat_control *c, moat_error **err);
void tt_close(struct moat_control *c);
/* Hibernated sandboxes (no slot) are woken here when guest access finds one: e->m held. */
int tt_wake_locked(struct moat_control *c, struct live *e, const char *reason, moat_error **err);
/* Drops e's cached fork image (m held, or e no longer shared). */
void tt_drop_fork_image(struct moat_control *c, struct live *e);
/* Removes what a killed hibernated sandbox left (its image). */
void tt_forget_hibernated(struct moat_control *c, const char *id);
/* Reaper pass helpers: idle hibernation of e (m held, running). */
void tt_reap_idle(struct moat_control *c, struct live *e, int64_t now_ms);
/* Checkpoints org's sandbox id once (a paused one's kept image is reused) and restores it count
 * (1..16) times concurrently; ids gets count ids (MOAT_ID_LEN + 1 each). why names the caller in
 * logs and errors. The children get the parent's databases, or with branch_dbs each a branch of each
 * (EINVAL when it has none). On failure the children made are killed. 0 or -1. */
int tt_fork_ids(struct moat_control *c, const char *org, const char *id, unsigned count, const char *why,
                bool branch_dbs, char (*ids)[MOAT_ID_LEN + 1], moat_error **err);

/* ---- explore.c ---- */
/* Explores whose keep-best window ran out are forgotten (their branches die by TTL). */
void tt_reap_explores(struct moat_control *c, int64_t now_ms);
/* Frees the open explores (at close). */
void tt_explores_free(struct moat_control *c);

#endif

/* timetravel.c -- pause/resume, hibernate/wake, snapshots, fork and rollback: the state
 * machine around the host's freezer and checkpoint/restore (explore, built on fork, is explore.c)
 *
 * Files under the data dir:
 *   DATA/snapshots/SID          a complete snapshot (the host's checkpoint dir); listed once its
 *                               row exists, and a row is inserted only after the rename from
 *   DATA/snapshots/SID.partial  which tt_open removes (a moatd killed mid-snapshot), together
 *                               with any SID dir that has no row
 *   DATA/hibernate/ID           the image of hibernated sandbox ID (.partial while written)
 *   DATA/checkpoints-tmp/       fork images, removed after the restores and at every start
 * Every transition holds the sandbox's mutex (control_internal.h) across the host call, so a
 * kill, exec or second transition of the same sandbox waits for it.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../common/assert.h"
#include "../common/crashpoint.h"
#include "../common/log.h"
#include "../common/util.h"
#include "../host/images.h"
#include "control_internal.h"

#define IDLE_CPU_THRESHOLD 0.02 /* of one CPU: above this a sandbox is busy, never idle-hibernated */

/* A snapshot being restored right now (delete answers 409 for it); c->snap_uses, explore_lock. */
struct snap_use {
  struct snap_use *next;
  char id[32];
  unsigned n;
};

/* A checkpoint dir shared by a paused sandbox (its fork image) and the forks restoring from it; the
 * last reference removes it. refs under explore_lock. */
struct ckpt_ref {
  char *dir;
  unsigned refs;
};

static struct ckpt_ref *ref_new(const char *dir) {
  struct ckpt_ref *r = xcalloc(1, sizeof(*r));
  r->dir = xstrdup(dir);
  r->refs = 1;
  return r;
}

static struct ckpt_ref *ref_get(struct moat_control *c, struct ckpt_ref *r) {
  pthread_mutex_lock(&c->explore_lock);
  r->refs++;
  pthread_mutex_unlock(&c->explore_lock);
  return r;
}

static void ref_put(struct moat_control *c, struct ckpt_ref *r) {
  pthread_mutex_lock(&c->explore_lock);
  moat_assert(r->refs > 0, "checkpoint %s released more often than taken", r->dir);
  bool last = --r->refs == 0;
  pthread_mutex_unlock(&c->explore_lock);
  if (!last)
    return;
  moat_image_dir_remove(r->dir);
  free(r->dir);
  free(r);
}

void tt_drop_fork_image(struct moat_control *c, struct live *e) {
  if (e->fork_image) {
    ref_put(c, e->fork_image);
    e->fork_image = NULL;
  }
}

/* ---- small helpers ---- */

static int no_checkpoints(struct moat_control *c, moat_error **err) {
  return moat_error_set(err, MOAT_E_NO_CHECKPOINTS, "checkpoints are unavailable on this host (%s)",
                        moat_host_criu_status(c->host));
}

/* A host checkpoint/restore error: ENOSYS means no CRIU here; EBUSY (connections or threads of
 * the sandbox that stay in the way: 409), EAGAIN (no capacity: 503) and ENOSPC (507) stay. */
static int host_error(moat_error **err) {
  if (err && *err && (*err)->status == ENOSYS)
    (*err)->status = MOAT_E_NO_CHECKPOINTS;
  else if (err && *err && (*err)->status != EAGAIN && (*err)->status != ENOSPC && (*err)->status != EBUSY)
    (*err)->status = EIO;
  return -1;
}

/* How long a checkpoint waits for exec calls already running in the sandbox to end. */
#define CALLS_WAIT_MS 5000

/* Waits (e->m held, so no new call starts) until no exec call runs in e, for up to CALLS_WAIT_MS.
 * 0, or -1 with EBUSY. */
static int wait_calls(struct live *e, moat_error **err) {
  uint64_t deadline = now_ns() + (uint64_t)CALLS_WAIT_MS * 1000000ull;
  int n;
  while ((n = __atomic_load_n(&e->inflight, __ATOMIC_SEQ_CST)) > 0) {
    if (now_ns() >= deadline)
      return moat_error_set(err, EBUSY,
                            "%d exec call(s) still running in sandbox %s after %d s; try again when they end",
                            n, e->id, CALLS_WAIT_MS / 1000);
    usleep(5000);
  }
  return 0;
}

/* Finds org's sandbox id in the table and locks it. NULL with ENOENT (absent, another org's,
 * killed) or EBUSY (a row no live entry backs). */
static struct live *lock_live(struct moat_control *c, const char *org, const char *id, moat_error **err) {
  struct live *e = live_get(c, id);
  if (e && strcmp(e->org, org) != 0) {
    live_put(c, e);
    moat_error_set(err, ENOENT, "no sandbox %s", id);
    return NULL;
  }
  if (!e) {
    not_live_error(c, org, id, err);
    return NULL;
  }
  pthread_mutex_lock(&e->m);
  if (e->state == MOAT_SB_KILLED) {
    pthread_mutex_unlock(&e->m);
    live_put(c, e);
    not_live_error(c, org, id, err);
    return NULL;
  }
  __atomic_store_n(&e->last_api_ms, now_unix_ms(), __ATOMIC_RELAXED);
  return e;
}

static void unlock_live(struct moat_control *c, struct live *e) {
  pthread_mutex_unlock(&e->m);
  live_put(c, e);
}

static int state_error(struct live *e, const char *what, moat_error **err) {
  return moat_error_set(err, EBUSY, "cannot %s sandbox %s: it is %s", what, e->id,
                        moat_sandbox_state_name(e->state));
}

/* ---- open / close ---- */

static bool snapshot_has_row(const char *name, void *arg) {
  struct moat_control *c = arg;
  if (strlen(name) >= 32 || strchr(name, '.'))
    return false; /* SID.partial: a snapshot moatd did not finish */
  struct moat_store_snapshot r;
  moat_error *err = NULL;
  if (moat_store_snapshot_get(c->store, NULL, name, &r, &err) < 0) {
    bool keep = err->status != ENOENT; /* a store error: keep rather than lose data */
    moat_error_free(&err);
    return keep;
  }
  moat_store_snapshot_clear(&r);
  return true;
}

static bool hibernated_row(const char *name, void *arg) {
  struct moat_control *c = arg;
  if (strlen(name) > MOAT_ID_LEN || strchr(name, '.'))
    return false;
  struct moat_store_sandbox r = {0};
  moat_error *err = NULL;
  if (moat_store_sandbox_get(c->store, NULL, name, &r, &err) < 0) {
    bool keep = err->status != ENOENT;
    moat_error_free(&err);
    return keep;
  }
  bool keep = strcmp(r.state, "hibernated") == 0;
  moat_store_sandbox_clear(&r);
  return keep;
}

int tt_open(struct moat_control *c, moat_error **err) {
  c->snap_dir = xasprintf("%s/snapshots", c->data_dir);
  c->hib_dir = xasprintf("%s/hibernate", c->data_dir);
  c->tmp_dir = xasprintf("%s/checkpoints-tmp", c->data_dir);
  if (moat_image_parent_open(c->snap_dir, err) < 0 || moat_image_parent_open(c->hib_dir, err) < 0 ||
      moat_image_parent_open(c->tmp_dir, err) < 0)
    return moat_error_wrap(err, "time travel dirs");
  moat_image_dirs_sweep(c->tmp_dir, NULL, NULL, c->tmp_dir);
  moat_image_dirs_sweep(c->snap_dir, snapshot_has_row, c, c->tmp_dir);
  moat_image_dirs_sweep(c->hib_dir, hibernated_row, c, c->tmp_dir);
  return 0;
}

void tt_close(struct moat_control *c) { tt_explores_free(c); }

bool moat_control_can_checkpoint(struct moat_control *c) { return moat_host_can_checkpoint(c->host); }

const char *moat_control_criu_status(struct moat_control *c) { return moat_host_criu_status(c->host); }

/* ---- pause / resume ---- */

/* running -> paused; e->m held. */
static int pause_locked(struct moat_control *c, struct live *e, const char *reason, moat_error **err) {
  ctl_meter_sample(c, e); /* the CPU up to the pause; paused, it costs memory only */
  if (moat_host_pause(c->host, e->slot, err) < 0)
    return moat_error_wrap(err, "pause %s", e->id);
  int64_t now = now_unix_ms();
  struct moat_store_move m = {
      .from = "running", .to = "paused", .reason = reason, .set_paused_at = true, .paused_at_ms = now};
  if (moat_store_sandbox_move(c->store, e->id, &m, err) < 0) {
    moat_error *e2 = NULL;
    if (moat_host_resume(c->host, e->slot, &e2) < 0) {
      log_error("pause %s: thaw after a failed record: %s", e->id, moat_error_msg(e2));
      moat_error_free(&e2);
    }
    return moat_error_wrap(err, "pause %s", e->id);
  }
  e->state = MOAT_SB_PAUSED;
  e->paused_at_ms = now;
  return 0;
}

/* The expiry after a pause or hibernation that began at e->paused_at_ms: moved on by its length. */
static int64_t expiry_after_pause(struct live *e, int64_t now) {
  if (e->persistent)
    return 0;
  int64_t x = __atomic_load_n(&e->expires_at_ms, __ATOMIC_RELAXED);
  if (e->paused_at_ms > 0 && now > e->paused_at_ms)
    x += now - e->paused_at_ms;
  return x;
}

/* paused -> running; e->m held. */
static int resume_locked(struct moat_control *c, struct live *e, const char *reason, moat_error **err) {
  if (moat_host_resume(c->host, e->slot, err) < 0)
    return moat_error_wrap(err, "resume %s", e->id);
  int64_t now = now_unix_ms();
  int64_t x = expiry_after_pause(e, now);
  struct moat_store_move m = {.from = "paused",
                              .to = "running",
                              .reason = reason,
                              .set_expires = true,
                              .expires_at_ms = x,
                              .set_paused_at = true,
                              .paused_at_ms = 0};
  if (moat_store_sandbox_move(c->store, e->id, &m, err) < 0) {
    moat_error *e2 = NULL;
    if (moat_host_pause(c->host, e->slot, &e2) < 0) {
      log_error("resume %s: refreeze after a failed record: %s", e->id, moat_error_msg(e2));
      moat_error_free(&e2);
    }
    return moat_error_wrap(err, "resume %s", e->id);
  }
  e->state = MOAT_SB_RUNNING;
  e->paused_at_ms = 0;
  e->db_expires_at_ms = x;
  __atomic_store_n(&e->expires_at_ms, x, __ATOMIC_RELAXED);
  tt_drop_fork_image(c, e); /* it runs on: the image no longer shows its state */
  return 0;
}

int moat_control_pause(struct moat_control *c, const char *org, const char *id, moat_error **err) {
  struct live *e = lock_live(c, org, id, err);
  if (!e)
    return -1;
  int ret = 0;
  if (e->state == MOAT_SB_RUNNING)
    ret = pause_locked(c, e, "api", err);
  else if (e->state != MOAT_SB_PAUSED)
    ret = state_error(e, "pause", err);
  unlock_live(c, e);
  return ret;
}

int moat_control_resume(struct moat_control *c, const char *org, const char *id, moat_error **err) {
  struct live *e = lock_live(c, org, id, err);
  if (!e)
    return -1;
  int ret = 0;
  if (e->state == MOAT_SB_PAUSED)
    ret = resume_locked(c, e, "api", err);
  else if (e->state == MOAT_SB_HIBERNATED)
    ret = tt_wake_locked(c, e, "api", err); /* resume of a hibernated sandbox wakes it */
  else if (e->state != MOAT_SB_RUNNING)
    ret = state_error(e, "resume", err);
  unlock_live(c, e);
  return ret;
}

/* ---- checkpoints of a live sandbox ---- */

/* Checkpoints e (running or paused; m held) into dir, which must not exist yet (made here). A
 * paused sandbox is thawed for the checkpoint (CRIU freezes on its own) and frozen again after it.
 * Without leave_running the sandbox stays frozen on success (moat_host_checkpoint). On failure dir
 * is removed and the sandbox goes on as before. */
static int checkpoint_locked(struct moat_control *c, struct live *e, const char *dir, bool leave_running,
                             struct moat_checkpoint_info *info, moat_error **err) {
  if (!moat_host_can_checkpoint(c->host))
    return no_checkpoints(c, err);
  if (e->state != MOAT_SB_RUNNING && e->state != MOAT_SB_PAUSED)
    return state_error(e, "checkpoint", err);
  if (e->state == MOAT_SB_RUNNING && wait_calls(e, err) < 0)
    return moat_error_wrap(err, "checkpoint");
  if (moat_image_dir_fresh(dir, err) < 0)
    return -1;
  bool paused = e->state == MOAT_SB_PAUSED;
  if (paused)
    tt_drop_fork_image(c, e); /* thawed for the dump, it may move on */
  if (paused && moat_host_resume(c->host, e->slot, err) < 0) {
    moat_image_dir_remove(dir);
    return moat_error_wrap(err, "thaw %s for its checkpoint", e->id);
  }
  memset(info, 0, sizeof(*info));
  ctl_logs_detach(c, e->id); /* its connection would hold the checkpoint back (freeze_quiet) */
  int rc = moat_host_checkpoint(c->host, e->slot, dir, leave_running, info, err);
  ctl_logs_reattach(c, e->id);
  if (rc < 0) {
    host_error(err);
    moat_image_dir_remove(dir);
  }
  if (paused && (rc < 0 || leave_running)) { /* a hibernate's stays frozen as dumped */
    moat_error *e2 = NULL;
    if (moat_host_pause(c->host, e->slot, &e2) < 0) {
      log_error("%s: refreeze after its checkpoint: %s", e->id, moat_error_msg(e2));
      moat_error_free(&e2);
    }
  }
  return rc < 0 ? moat_error_wrap(err, "checkpoint %s", e->id) : 0;
}

int tt_checkpoint_running(struct moat_control *c, const char *org, const char *id, const char *dir,
                          moat_error **err) {
  struct live *e = lock_live(c, org, id, err);
  if (!e)
    return -1;
  struct moat_checkpoint_info info;
  int rc = checkpoint_locked(c, e, dir, true, &info, err);
  unlock_live(c, e);
  return rc;
}

/* ---- hibernate / wake ---- */

/* After a hibernate's checkpoint succeeded but the image could not be kept or recorded: the
 * sandbox, frozen as dumped, goes on as its record says (running, or paused). */
static void hibernate_undo(struct moat_control *c, struct live *e) {
  moat_error *e2 = NULL;
  if (e->state == MOAT_SB_RUNNING && moat_host_resume(c->host, e->slot, &e2) < 0) {
    log_error("hibernate %s: thaw after a failure: %s", e->id, moat_error_msg(e2));
    moat_error_free(&e2);
  }
}

/* running|paused -> hibernated; e->m held. The sandbox stays whole (frozen once dumped) until its
 * image is complete under DATA/hibernate/ID and recorded: a moatd killed at any point finds it
 * running (or paused), or hibernated with that image. */
static int hibernate_locked(struct moat_control *c, struct live *e, const char *reason, moat_error **err) {
  _cleanup_free_ char *dir = xasprintf("%s/%s", c->hib_dir, e->id);
  _cleanup_free_ char *part = xasprintf("%s.partial", dir);
  struct moat_checkpoint_info info;
  uint64_t t0 = now_ns();
  if (checkpoint_locked(c, e, part, false, &info, err) < 0)
    return moat_error_wrap(err, "hibernate");
  if (moat_image_dir_commit(part, dir, err) < 0) {
    hibernate_undo(c, e);
    return moat_error_wrap(err, "hibernate %s", e->id);
  }
  moat_crash_point("hibernate.renamed");
  int64_t now = now_unix_ms();
  bool was_paused = e->state == MOAT_SB_PAUSED;
  struct moat_store_move m = {.to = "hibernated",
                              .reason = reason,
                              .set_instance = true,
                              .slot = -1,
                              .pid = 0,
                              .start_time = 0,
                              .set_paused_at = true,
                              .paused_at_ms = was_paused ? e->paused_at_ms : now};
  if (moat_store_sandbox_move(c->store, e->id, &m, err) < 0) {
    moat_error_wrap(err, "hibernate %s", e->id);
    moat_image_dir_remove(dir);
    hibernate_undo(c, e);
    return -1;
  }
  moat_crash_point("hibernate.recorded");
  /* From here the image is the sandbox. */
  moat_error *e2 = NULL;
  ctl_meter_end(c, e);
  if (moat_host_destroy(c->host, e->slot, &e2) < 0) {
    log_error("hibernate %s: destroy slot %d: %s (reconciled at the next start)", e->id, e->slot,
              moat_error_msg(e2));
    moat_error_free(&e2);
  }
  e->slot = -1;
  if (!was_paused)
    e->paused_at_ms = now;
  e->state = MOAT_SB_HIBERNATED;
  ctl_live_uncount(c, e);
  memset(&e->guest, 0, sizeof(e->guest));
  e->pid = 0;
  e->start_time = 0;
  log_info("sandbox %s hibernated (%s): %llu bytes of memory, %llu of disk, %.1f ms", e->id, reason,
           (unsigned long long)info.memory_bytes, (unsigned long long)info.disk_bytes, (now_ns() - t0) / 1e6);
  return 0;
}

/* A restored sandbox keeps its network policy: the new slot is bound to the one saved
 * for its id. A failure leaves it with the default policy and is logged. */
static void tt_net_rebind(struct moat_control *c, struct live *e, int slot) {
  moat_error *e2 = NULL;
  if (ctl_net_bind(c, e->id, e->org, slot, NULL, NULL, &e2) < 0) {
    log_warn("sandbox %s: network policy after restore: %s", e->id, moat_error_msg(e2));
    moat_error_free(&e2);
  }
}

int tt_wake_locked(struct moat_control *c, struct live *e, const char *reason, moat_error **err) {
  if (e->state != MOAT_SB_HIBERNATED)
    return 0;
  if (!moat_host_can_checkpoint(c->host))
    return no_checkpoints(c, err);
  _cleanup_free_ char *dir = xasprintf("%s/%s", c->hib_dir, e->id);
  struct moat_instance inst;
  memset(&inst, 0, sizeof(inst));
  uint64_t t0 = now_ns();
  /* a woken sandbox is live again: its org's live quotas are reserved before the restore */
  if (ctl_quota_wake(c, e, err) < 0)
    return moat_error_wrap(err, "wake %s", e->id);
  if (moat_host_restore(c->host, dir, ctl_image_of(e->template_name), &e->limits, 0, &inst, err) < 0) {
    ctl_live_uncount(c, e);
    host_error(err);
    return moat_error_wrap(err, "wake %s", e->id);
  }
  moat_crash_point("wake.restored");
  tt_net_rebind(c, e, inst.slot);
  int64_t now = now_unix_ms();
  int64_t x = expiry_after_pause(e, now);
  struct moat_store_move m = {.from = "hibernated",
                              .to = "running",
                              .reason = reason,
                              .set_instance = true,
                              .slot = inst.slot,
                              .pid = inst.pid,
                              .start_time = inst.start_time,
                              .set_expires = true,
                              .expires_at_ms = x,
                              .set_paused_at = true,
                              .paused_at_ms = 0};
  if (moat_store_sandbox_move(c->store, e->id, &m, err) < 0) {
    moat_error *e2 = NULL;
    if (moat_host_destroy(c->host, inst.slot, &e2) < 0) {
      log_error("wake %s: destroy slot %d: %s", e->id, inst.slot, moat_error_msg(e2));
      moat_error_free(&e2);
    }
    ctl_live_uncount(c, e);
    return moat_error_wrap(err, "wake %s", e->id);
  }
  moat_crash_point("wake.recorded");
  e->state = MOAT_SB_RUNNING;
  e->slot = inst.slot;
  e->pid = inst.pid;
  e->start_time = inst.start_time;
  ctl_meter_begin(c, e);
  ctl_set_guest(e, &inst);
  e->paused_at_ms = 0;
  e->db_expires_at_ms = x;
  e->busy_at_ms = now;
  e->idle_sample_ms = 0;
  __atomic_store_n(&e->expires_at_ms, x, __ATOMIC_RELAXED);
  moat_image_dir_remove(dir);
  log_info("sandbox %s woken (%s) into slot %d in %.1f ms", e->id, reason, inst.slot, (now_ns() - t0) / 1e6);
  return 0;
}

void tt_forget_hibernated(struct moat_control *c, const char *id) {
  if (!c->hib_dir || strlen(id) > MOAT_ID_LEN)
    return;
  _cleanup_free_ char *dir = xasprintf("%s/%s", c->hib_dir, id);
  if (moat_image_dir_exists(dir))
    moat_image_dir_remove(dir);
}

int moat_control_hibernate(struct moat_control *c, const char *org, const char *id, moat_error **err) {
  struct live *e = lock_live(c, org, id, err);
  if (!e)
    return -1;
  int ret = 0;
  if (e->state == MOAT_SB_RUNNING || e->state == MOAT_SB_PAUSED)
    ret = hibernate_locked(c, e, "api", err);
  else if (e->state != MOAT_SB_HIBERNATED)
    ret = state_error(e, "hibernate", err);
  unlock_live(c, e);
  return ret;
}

int moat_control_wake(struct moat_control *c, const char *org, const char *id, moat_error **err) {
  struct live *e = lock_live(c, org, id, err);
  if (!e)
    return -1;
  int ret = 0;
  if (e->state == MOAT_SB_HIBERNATED)
    ret = tt_wake_locked(c, e, "api", err);
  else if (e->state != MOAT_SB_RUNNING && e->state != MOAT_SB_PAUSED)
    ret = state_error(e, "wake", err);
  unlock_live(c, e);
  return ret;
}

void tt_reap_idle(struct moat_control *c, struct live *e, int64_t now) {
  struct moat_usage u;
  moat_error *err = NULL;
  if (moat_host_usage(c->host, e->slot, &u, &err) < 0) {
    moat_error_free(&err);
    return;
  }
  if (e->idle_sample_ms == 0 || now < e->idle_sample_ms) {
    e->idle_sample_ms = now;
    e->idle_cpu_ns = u.cpu_usage_ns;
    if (e->busy_at_ms == 0)
      e->busy_at_ms = now;
    return;
  }
  int64_t dt = now - e->idle_sample_ms;
  if (dt >= 500) {
    double rate = (double)(u.cpu_usage_ns - e->idle_cpu_ns) / ((double)dt * 1e6);
    if (u.cpu_usage_ns < e->idle_cpu_ns || rate > IDLE_CPU_THRESHOLD)
      e->busy_at_ms = now;
    e->idle_sample_ms = now;
    e->idle_cpu_ns = u.cpu_usage_ns;
  }
  int64_t last = __atomic_load_n(&e->last_api_ms, __ATOMIC_RELAXED);
  if (e->busy_at_ms > last)
    last = e->busy_at_ms;
  if (now - last < e->hibernate_after_s * 1000 || !moat_host_can_checkpoint(c->host))
    return;
  int sessions = moat_host_guest_sessions(c->host, e->slot);
  if (sessions > 0)
    sessions -= ctl_logs_connected(c, e->id); /* moatd's own log reader is nobody */
  if (sessions != 0) {                        /* someone is attached (or we cannot tell): not idle */
    e->busy_at_ms = now;
    return;
  }
  if (hibernate_locked(c, e, "idle", &err) < 0) {
    log_warn("idle hibernation of %s: %s", e->id, moat_error_msg(err));
    moat_error_free(&err);
    e->busy_at_ms = now; /* try again after another idle window, not every pass */
  }
}

/* ---- snapshots ---- */

void moat_snapshot_info_clear(struct moat_snapshot_info *s) {
  if (!s)
    return;
  free(s->org);
  free(s->template_name);
  json_decref(s->metadata);
  memset(s, 0, sizeof(*s));
}

void moat_snapshot_infos_free(struct moat_snapshot_info *v, size_t n) {
  for (size_t i = 0; v && i < n; i++)
    moat_snapshot_info_clear(&v[i]);
  free(v);
}

static void snapshot_from_row(const struct moat_store_snapshot *r, struct moat_snapshot_info *out) {
  memset(out, 0, sizeof(*out));
  snprintf(out->id, sizeof(out->id), "%s", r->id);
  snprintf(out->sandbox_id, sizeof(out->sandbox_id), "%s", r->sandbox_id);
  out->org = xstrdup(r->org);
  out->template_name = ctl_template_display(r->template_name);
  out->created_at_ms = r->created_at_ms;
  out->memory_bytes = r->memory_bytes;
  out->disk_bytes = r->disk_bytes;
  out->metadata = parse_object(r->metadata_json);
}

static bool valid_snapshot_id(const char *sid) {
  if (strncmp(sid, "snap-", 5) != 0 || strlen(sid) != 22)
    return false;
  for (const char *p = sid + 5; *p; p++)
    if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9')))
      return false;
  return true;
}

static int snapshot_create(struct moat_control *c, const char *org, const char *id, json_t *metadata,
                           struct moat_snapshot_info *out, moat_error **err);

/* Refused once the org's snapshots reached max_snapshot_bytes. */
int moat_control_snapshot_create(struct moat_control *c, const char *org, const char *id, json_t *metadata,
                                 struct moat_snapshot_info *out, moat_error **err) {
  bool held = false;
  if (moat_control_quota_storage_begin(c, org, MOAT_Q_SNAPSHOT_BYTES, 0, &held, err) < 0)
    return -1;
  int rc = snapshot_create(c, org, id, metadata, out, err);
  moat_control_quota_storage_end(c, held);
  return rc;
}

static int snapshot_create(struct moat_control *c, const char *org, const char *id, json_t *metadata,
                           struct moat_snapshot_info *out, moat_error **err) {
  if (moat_spec_check_metadata(metadata, err) < 0)
    return -1;
  if (!moat_host_can_checkpoint(c->host))
    return no_checkpoints(c, err);
  struct moat_store_sandbox row = {0};
  if (moat_store_sandbox_get(c->store, org, id, &row, err) < 0)
    return -1;
  struct live *e = lock_live(c, org, id, err);
  if (!e) {
    moat_store_sandbox_clear(&row);
    return -1;
  }
  if (e->state == MOAT_SB_HIBERNATED && tt_wake_locked(c, e, "snapshot", err) < 0) {
    unlock_live(c, e);
    moat_store_sandbox_clear(&row);
    return -1;
  }
  char sid[32] = "snap-";
  random_id(sid + 5, 17);
  _cleanup_free_ char *dir = xasprintf("%s/%s", c->snap_dir, sid);
  _cleanup_free_ char *part = xasprintf("%s.partial", dir);
  struct moat_checkpoint_info info;
  int ret = checkpoint_locked(c, e, part, true, &info, err);
  _cleanup_free_ char *env = dump_object(e->env);
  struct moat_limits lim = e->limits;
  int64_t ttl = e->ttl_seconds;
  unlock_live(c, e);
  if (ret < 0) {
    moat_store_sandbox_clear(&row);
    return moat_error_wrap(err, "snapshot");
  }
  if (moat_image_dir_commit(part, dir, err) < 0) {
    moat_store_sandbox_clear(&row);
    return moat_error_wrap(err, "snapshot %s", id);
  }
  moat_crash_point("snapshot.renamed");
  _cleanup_free_ char *meta = dump_object(metadata);
  struct moat_store_snapshot s = {
      .id = sid,
      .org = (char *)org,
      .sandbox_id = (char *)id,
      .template_name = row.template_name,
      .created_at_ms = now_unix_ms(),
      .memory_bytes = info.memory_bytes,
      .disk_bytes = info.disk_bytes,
      .metadata_json = meta,
      .cpu = lim.cpu,
      .memory_mb = lim.memory_mb,
      .pids = lim.pids,
      .disk_mb = lim.disk_mb,
      .ttl_seconds = ttl,
      .env_json = env,
      .sandbox_metadata_json = row.metadata_json,
  };
  ret = moat_store_snapshot_insert(c->store, &s, err);
  if (ret < 0) {
    moat_image_dir_remove(dir);
    moat_store_sandbox_clear(&row);
    return moat_error_wrap(err, "snapshot %s", id);
  }
  log_info("snapshot %s of %s: %llu bytes of memory, %llu of disk, frozen %.1f ms, total %.1f ms", sid, id,
           (unsigned long long)info.memory_bytes, (unsigned long long)info.disk_bytes, info.frozen_ns / 1e6,
           info.total_ns / 1e6);
  moat_store_sandbox_clear(&row);
  if (!out)
    return 0;
  return moat_control_snapshot_get(c, org, sid, out, err);
}

int moat_control_snapshot_list(struct moat_control *c, const char *org, const char *sandbox_id,
                               struct moat_snapshot_info **out, size_t *n, moat_error **err) {
  struct moat_store_snapshot *rows;
  size_t nr;
  if (moat_store_snapshot_list(c->store, org, sandbox_id, &rows, &nr, err) < 0)
    return -1;
  struct moat_snapshot_info *v = nr ? xcalloc(nr, sizeof(*v)) : NULL;
  for (size_t i = 0; i < nr; i++)
    snapshot_from_row(&rows[i], &v[i]);
  moat_store_snapshots_free(rows, nr);
  *out = v;
  *n = nr;
  return 0;
}

int moat_control_snapshot_get(struct moat_control *c, const char *org, const char *sid,
                              struct moat_snapshot_info *out, moat_error **err) {
  if (!valid_snapshot_id(sid))
    return moat_error_set(err, ENOENT, "no snapshot %.64s", sid);
  struct moat_store_snapshot r;
  if (moat_store_snapshot_get(c->store, org, sid, &r, err) < 0)
    return -1;
  snapshot_from_row(&r, out);
  moat_store_snapshot_clear(&r);
  return 0;
}

/* Marks snapshot sid in use by a restore (use true) or done (false). */
static void snap_use(struct moat_control *c, const char *sid, bool use) {
  pthread_mutex_lock(&c->explore_lock);
  struct snap_use **pp = &c->snap_uses;
  while (*pp && strcmp((*pp)->id, sid) != 0)
    pp = &(*pp)->next;
  if (use) {
    if (!*pp) {
      *pp = xcalloc(1, sizeof(**pp));
      snprintf((*pp)->id, sizeof((*pp)->id), "%s", sid);
    }
    (*pp)->n++;
  } else if (*pp && --(*pp)->n == 0) {
    struct snap_use *u = *pp;
    *pp = u->next;
    free(u);
  }
  pthread_mutex_unlock(&c->explore_lock);
}

static bool snap_in_use(struct moat_control *c, const char *sid) {
  pthread_mutex_lock(&c->explore_lock);
  struct snap_use *u = c->snap_uses;
  while (u && strcmp(u->id, sid) != 0)
    u = u->next;
  pthread_mutex_unlock(&c->explore_lock);
  return u != NULL;
}

int moat_control_snapshot_delete(struct moat_control *c, const char *org, const char *sid, moat_error **err) {
  if (!valid_snapshot_id(sid))
    return moat_error_set(err, ENOENT, "no snapshot %.64s", sid);
  struct moat_store_snapshot r;
  if (moat_store_snapshot_get(c->store, org, sid, &r, err) < 0)
    return -1;
  moat_store_snapshot_clear(&r);
  if (snap_in_use(c, sid))
    return moat_error_set(err, EBUSY, "snapshot %s is being restored right now; delete it afterwards", sid);
  if (moat_store_snapshot_delete(c->store, org, sid, err) < 0)
    return -1;
  _cleanup_free_ char *dir = xasprintf("%s/%s", c->snap_dir, sid);
  moat_image_dir_remove(dir);
  return 0;
}

int tt_create_from_snapshot(struct moat_control *c, const char *org, const struct moat_sandbox_spec *spec,
                            struct moat_sandbox_info *out, moat_error **err) {
  const char *sid = spec->from_snapshot;
  if (!valid_snapshot_id(sid))
    return moat_error_set(err, ENOENT, "no snapshot %.64s", sid);
  struct moat_store_snapshot r;
  if (moat_store_snapshot_get(c->store, org, sid, &r, err) < 0)
    return -1;
  if (!moat_host_can_checkpoint(c->host)) {
    moat_store_snapshot_clear(&r);
    return no_checkpoints(c, err);
  }
  int ret = -1;
  _cleanup_json_ json_t *senv = NULL;
  _cleanup_json_ json_t *smeta = NULL;
  _cleanup_free_ char *dir = NULL;
  _cleanup_free_ char *snap_template = ctl_template_display(r.template_name);
  if (spec->template_name && strcmp(spec->template_name, snap_template) != 0) {
    moat_error_set(err, EINVAL, "template '%s' differs from snapshot %s's template '%s'", spec->template_name,
                   sid, snap_template);
    goto out;
  }
  struct moat_sandbox_spec s2 = *spec;
  if (!s2.limits.cpu)
    s2.limits.cpu = r.cpu;
  if (!s2.limits.memory_mb)
    s2.limits.memory_mb = r.memory_mb;
  if (!s2.limits.pids)
    s2.limits.pids = r.pids;
  if (!s2.limits.disk_mb)
    s2.limits.disk_mb = r.disk_mb;
  if (!s2.ttl_seconds)
    s2.ttl_seconds = r.ttl_seconds;
  struct ctl_new n = {
      .template_name = r.template_name,
      .persistent = spec->persistent,
      .restore_dir = NULL,
      .from_snapshot = sid,
      .hibernate_after_s = spec->hibernate_after_seconds,
  };
  if (moat_spec_resolve(&s2, &c->bounds, &n.limits, &n.ttl_seconds, err) < 0)
    goto out;
  senv = parse_object(r.env_json);
  smeta = parse_object(r.sandbox_metadata_json);
  n.env = spec->env ? spec->env : senv;
  n.metadata = spec->metadata ? spec->metadata : smeta;
  dir = xasprintf("%s/%s", c->snap_dir, sid);
  n.restore_dir = dir;
  /* a snapshot's volume mounts are restored only into its own sandbox (rollback) */
  int nv = moat_host_checkpoint_volumes(c->host, dir, err);
  if (nv != 0) {
    if (nv > 0)
      moat_error_set(err, EINVAL,
                     "snapshot %s holds %d volume mount(s) of sandbox %s: from_snapshot cannot restore it "
                     "(roll that sandbox back, or fork it: its children mount its volumes read-only)",
                     sid, nv, r.sandbox_id);
    goto out;
  }
  snap_use(c, sid, true);
  ret = ctl_create(c, org, &n, NULL, out, err);
  snap_use(c, sid, false);
out:
  moat_store_snapshot_clear(&r);
  return ret;
}

/* ---- fork ---- */

struct child_job {
  struct moat_control *c;
  const char *org, *parent;
  const struct ctl_new *n;
  const struct moat_store_db_attachment *parent_dbs; /* the parent's databases */
  size_t n_parent_dbs;
  bool branch_dbs; /* each child gets a branch of each */
  char id[MOAT_ID_LEN + 1];
  uint64_t ready_ns; /* since the fork began */
  uint64_t t0;
  int rc;
  moat_error *err;
};

static void *child_main(void *arg) {
  struct child_job *j = arg;
  struct ctl_new n = *j->n;
  struct moat_store_db_attachment *att = NULL;
  json_t *env = NULL;
  if (j->n_parent_dbs) {
    env = ctl_databases_for_child(j->c, j->org, j->parent, j->n->env, j->parent_dbs, j->n_parent_dbs,
                                  j->branch_dbs, &att, &j->err);
    if (!env) {
      j->rc = -1;
      return NULL;
    }
    n.env = env;
    n.databases = att;
    n.n_databases = j->n_parent_dbs;
  }
  j->rc = ctl_create(j->c, j->org, &n, j->id, NULL, &j->err);
  j->ready_ns = now_ns() - j->t0;
  if (j->rc < 0)
    ctl_databases_drop_owned(j->c, j->org, att, j->n_parent_dbs);
  moat_store_db_attachments_free(att, j->n_parent_dbs);
  json_decref(env);
  return NULL;
}

int tt_fork_ids(struct moat_control *c, const char *org, const char *id, unsigned count, const char *why,
                bool branch_dbs, char (*ids)[MOAT_ID_LEN + 1], moat_error **err) {
  if (count < 1 || count > MOAT_EXPLORE_MAX_BRANCHES)
    return moat_error_set(err, EINVAL, "count: must be between 1 and %d", MOAT_EXPLORE_MAX_BRANCHES);
  if (!moat_host_can_checkpoint(c->host))
    return no_checkpoints(c, err);
  struct moat_store_sandbox row = {0};
  if (moat_store_sandbox_get(c->store, org, id, &row, err) < 0)
    return -1;
  /* count children count against the org's quotas: refused before the checkpoint when they cannot
   * fit (each child's create reserves its own share again) */
  struct moat_limits rl = {row.cpu, row.memory_mb, row.pids, row.disk_mb};
  if (ctl_quota_precheck(c, org, count, &rl, err) < 0) {
    moat_store_sandbox_clear(&row);
    return moat_error_wrap(err, "%s", why);
  }
  struct live *e = lock_live(c, org, id, err);
  if (!e) {
    moat_store_sandbox_clear(&row);
    return -1;
  }
  if (e->state == MOAT_SB_HIBERNATED && tt_wake_locked(c, e, why, err) < 0) {
    unlock_live(c, e);
    moat_store_sandbox_clear(&row);
    return -1;
  }
  /* A paused sandbox does not change: the image one fork took serves the next ones. */
  struct moat_checkpoint_info info = {0};
  uint64_t t0 = now_ns();
  struct ckpt_ref *img = NULL;
  bool reused = false;
  int rc = 0;
  if (e->state == MOAT_SB_PAUSED && e->fork_image) {
    img = ref_get(c, e->fork_image);
    reused = true;
  } else {
    char tag[18];
    random_id(tag, 17);
    _cleanup_free_ char *dir = xasprintf("%s/fork-%s", c->tmp_dir, tag);
    rc = checkpoint_locked(c, e, dir, true, &info, err);
    if (rc == 0) {
      img = ref_new(dir);
      if (e->state == MOAT_SB_PAUSED)
        e->fork_image = ref_get(c, img);
    }
  }
  json_t *env = json_deep_copy(e->env);
  /* the children mount the parent's volumes read-only (the parent stays their writer) */
  struct moat_store_attachment *att = NULL;
  size_t n_att = 0;
  struct moat_volume_mount mounts[MOAT_MAX_SANDBOX_VOLUMES];
  if (rc == 0 && moat_store_attachments(c->store, NULL, id, &att, &n_att, err) < 0)
    rc = -1;
  struct moat_store_db_attachment *dbs = NULL;
  size_t n_dbs = 0;
  if (rc == 0 && moat_store_db_attachments(c->store, id, &dbs, &n_dbs, err) < 0)
    rc = -1;
  if (rc == 0 && branch_dbs && n_dbs == 0)
    rc = moat_error_set(err, EINVAL, "databases: \"branch\": sandbox %s was given no database", id);
  for (size_t i = 0; i < n_att && i < MOAT_MAX_SANDBOX_VOLUMES; i++)
    mounts[i] =
        (struct moat_volume_mount){.name = att[i].volume_name, .path = att[i].path, .read_only = true};
  struct ctl_new n = {
      .template_name = row.template_name,
      .limits = e->limits,
      .ttl_seconds = e->ttl_seconds,
      .persistent = e->persistent,
      .env = env,
      .restore_dir = img ? img->dir : NULL,
      .forked_from = id,
      .volumes = mounts,
      .n_volumes = n_att < MOAT_MAX_SANDBOX_VOLUMES ? n_att : MOAT_MAX_SANDBOX_VOLUMES,
  };
  unlock_live(c, e);
  if (rc < 0) {
    json_decref(env);
    moat_store_attachments_free(att, n_att);
    moat_store_db_attachments_free(dbs, n_dbs);
    if (img)
      ref_put(c, img);
    moat_store_sandbox_clear(&row);
    return moat_error_wrap(err, "%s", why);
  }
  moat_crash_point("fork.checkpointed");
  json_t *meta = parse_object(row.metadata_json);
  n.metadata = meta;
  uint64_t t_ckpt = now_ns() - t0;

  struct child_job *jobs = xcalloc(count, sizeof(*jobs));
  pthread_t *th = xcalloc(count, sizeof(*th));
  bool *started = xcalloc(count, sizeof(*started));
  uint64_t t1 = now_ns();
  for (unsigned i = 0; i < count; i++) {
    jobs[i] = (struct child_job){.c = c,
                                 .org = org,
                                 .parent = id,
                                 .n = &n,
                                 .parent_dbs = dbs,
                                 .n_parent_dbs = n_dbs,
                                 .branch_dbs = branch_dbs,
                                 .t0 = t1,
                                 .rc = -1};
    started[i] = pthread_create(&th[i], NULL, child_main, &jobs[i]) == 0;
    if (!started[i])
      moat_error_set(&jobs[i].err, EAGAIN, "start a restore thread");
  }
  int ret = 0;
  uint64_t first = 0, last = 0;
  for (unsigned i = 0; i < count; i++) {
    if (started[i])
      pthread_join(th[i], NULL);
    if (jobs[i].rc < 0 && ret == 0) {
      ret = -1;
      moat_error_wrap(&jobs[i].err, "%s child %u of %u", why, i + 1, count);
      if (err && !*err) {
        *err = jobs[i].err;
        jobs[i].err = NULL;
      }
    }
    if (jobs[i].rc == 0) {
      if (!first || jobs[i].ready_ns < first)
        first = jobs[i].ready_ns;
      if (jobs[i].ready_ns > last)
        last = jobs[i].ready_ns;
    }
  }
  for (unsigned i = 0; i < count; i++) {
    moat_error_free(&jobs[i].err);
    if (ret < 0 && jobs[i].rc == 0) {
      moat_error *e2 = NULL;
      if (moat_control_kill(c, org, jobs[i].id, "error", &e2) < 0) {
        log_warn("%s of %s: kill child %s: %s", why, id, jobs[i].id, moat_error_msg(e2));
        moat_error_free(&e2);
      }
    }
    snprintf(ids[i], MOAT_ID_LEN + 1, "%s", jobs[i].rc == 0 ? jobs[i].id : "");
  }
  if (ret == 0)
    log_info("%s of %s: %u children; %s %.1f ms (%llu bytes), first child %.1f ms, last %.1f ms", why, id,
             count, reused ? "reused the paused sandbox's image" : "checkpoint", t_ckpt / 1e6,
             (unsigned long long)info.memory_bytes, first / 1e6, last / 1e6);
  ref_put(c, img);
  free(jobs);
  free(th);
  free(started);
  moat_store_attachments_free(att, n_att);
  moat_store_db_attachments_free(dbs, n_dbs);
  json_decref(env);
  json_decref(meta);
  moat_store_sandbox_clear(&row);
  return ret;
}

int moat_control_fork(struct moat_control *c, const char *org, const char *id, unsigned count,
                      bool branch_databases, struct moat_sandbox_info **children, moat_error **err) {
  *children = NULL;
  if (count < 1 || count > MOAT_EXPLORE_MAX_BRANCHES)
    return moat_error_set(err, EINVAL, "count: must be between 1 and %d", MOAT_EXPLORE_MAX_BRANCHES);
  char(*ids)[MOAT_ID_LEN + 1] = xcalloc(count, sizeof(*ids));
  if (tt_fork_ids(c, org, id, count, "fork", branch_databases, ids, err) < 0) {
    free(ids);
    return -1;
  }
  struct moat_sandbox_info *v = xcalloc(count, sizeof(*v));
  int ret = 0;
  for (unsigned i = 0; i < count && ret == 0; i++)
    ret = moat_control_get(c, org, ids[i], &v[i], err);
  if (ret < 0) {
    moat_sandbox_infos_free(v, count);
    v = NULL;
  }
  free(ids);
  *children = v;
  return ret;
}

/* ---- rollback ---- */

int moat_control_rollback(struct moat_control *c, const char *org, const char *id, const char *snapshot_id,
                          moat_error **err) {
  if (!snapshot_id || !valid_snapshot_id(snapshot_id))
    return moat_error_set(err, ENOENT, "no snapshot %.64s", snapshot_id ? snapshot_id : "");
  struct moat_store_snapshot r;
  if (moat_store_snapshot_get(c->store, org, snapshot_id, &r, err) < 0)
    return -1;
  bool mine = strcmp(r.sandbox_id, id) == 0;
  _cleanup_free_ char *owner = xstrdup(r.sandbox_id);
  moat_store_snapshot_clear(&r);
  if (!mine)
    return moat_error_set(err, EINVAL, "snapshot %s is of sandbox %s, not %s", snapshot_id, owner, id);
  if (!moat_host_can_checkpoint(c->host))
    return no_checkpoints(c, err);
  struct live *e = lock_live(c, org, id, err);
  if (!e)
    return -1;
  if (e->state != MOAT_SB_RUNNING && e->state != MOAT_SB_PAUSED && e->state != MOAT_SB_HIBERNATED) {
    int ret = state_error(e, "roll back", err);
    unlock_live(c, e);
    return ret;
  }
  _cleanup_free_ char *dir = xasprintf("%s/%s", c->snap_dir, snapshot_id);
  struct moat_instance inst;
  memset(&inst, 0, sizeof(inst));
  uint64_t t0 = now_ns();
  snap_use(c, snapshot_id, true);
  int rc = moat_host_restore(c->host, dir, ctl_image_of(e->template_name), &e->limits, 0, &inst, err);
  snap_use(c, snapshot_id, false);
  if (rc < 0) {
    host_error(err);
    unlock_live(c, e);
    return moat_error_wrap(err, "roll %s back to %s", id, snapshot_id);
  }
  tt_net_rebind(c, e, inst.slot);
  int64_t now = now_unix_ms();
  int64_t x = e->persistent ? 0 : now + e->ttl_seconds * 1000;
  struct moat_store_move m = {.to = "running",
                              .reason = "rollback",
                              .set_instance = true,
                              .slot = inst.slot,
                              .pid = inst.pid,
                              .start_time = inst.start_time,
                              .set_expires = true,
                              .expires_at_ms = x,
                              .set_paused_at = true,
                              .paused_at_ms = 0,
                              .from_snapshot = snapshot_id};
  if (moat_store_sandbox_move(c->store, id, &m, err) < 0) {
    moat_error *e2 = NULL;
    if (moat_host_destroy(c->host, inst.slot, &e2) < 0) {
      log_error("rollback %s: destroy slot %d: %s", id, inst.slot, moat_error_msg(e2));
      moat_error_free(&e2);
    }
    unlock_live(c, e);
    return moat_error_wrap(err, "roll %s back", id);
  }
  int old = e->slot;
  bool was_hibernated = e->state == MOAT_SB_HIBERNATED;
  ctl_meter_end(c, e);
  tt_drop_fork_image(c, e);
  e->state = MOAT_SB_RUNNING;
  e->slot = inst.slot;
  e->pid = inst.pid;
  e->start_time = inst.start_time;
  ctl_meter_begin(c, e);
  ctl_set_guest(e, &inst);
  e->paused_at_ms = 0;
  e->db_expires_at_ms = x;
  __atomic_store_n(&e->expires_at_ms, x, __ATOMIC_RELAXED);
  if (old >= 0) {
    moat_error *e2 = NULL;
    if (moat_host_destroy(c->host, old, &e2) < 0) {
      log_error("rollback %s: destroy old slot %d: %s", id, old, moat_error_msg(e2));
      moat_error_free(&e2);
    }
  }
  if (was_hibernated)
    tt_forget_hibernated(c, id);
  unlock_live(c, e);
  log_info("sandbox %s rolled back to %s into slot %d in %.1f ms", id, snapshot_id, inst.slot,
           (now_ns() - t0) / 1e6);
  return 0;
}

/* oom.c -- OOM kills: which ended command the sandbox cgroup's OOM-kill count names, and the oom
 * event that announces each kill once (the rule is in control.h) */
#include <inttypes.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../common/buf.h"
#include "../common/log.h"
#include "../common/util.h"
#include "control_internal.h"

void ctl_oom_reset(struct live *e, bool known_zero) {
  e->oom_reported = known_zero ? 0 : UINT64_MAX;
  e->oom_seen = e->oom_reported;
}

/* Reads the count of slot (no lock needed: the slot is only read once). */
static uint64_t slot_count(struct moat_control *c, int slot) {
  uint64_t n = 0;
  moat_error *err = NULL;
  if (slot < 0 || moat_host_oom_kills(c->host, slot, &n, &err) < 0) {
    moat_error_free(&err);
    return UINT64_MAX;
  }
  return n;
}

uint64_t ctl_oom_count(struct moat_control *c, struct live *e) {
  pthread_mutex_lock(&e->m);
  int slot = e->state == MOAT_SB_RUNNING ? e->slot : -1;
  pthread_mutex_unlock(&e->m);
  return slot_count(c, slot);
}

/* Announces kills of the count up to total; p names the command (NULL: unknown). */
static void announce(struct moat_control *c, struct live *e, uint64_t kills, uint64_t total,
                     const struct moat_oom_proc *p) {
  json_t *argv = json_null(), *cmd = json_null();
  if (p && p->argv) {
    argv = json_array();
    struct moat_buf b = {0};
    for (size_t i = 0; p->argv[i]; i++) {
      json_t *s = json_string(p->argv[i]); /* NULL for bytes that are not UTF-8: left out */
      if (s)
        json_array_append_new(argv, s);
      if (i)
        moat_buf_append(&b, " ", 1);
      moat_buf_append(&b, p->argv[i], strlen(p->argv[i]));
    }
    json_t *s = json_stringn(b.p ? b.p : "", b.len);
    free(b.p);
    if (s) {
      json_decref(cmd);
      cmd = s;
    }
  }
  json_t *ev = json_pack("{s:s, s:o, s:o, s:o, s:s?, s:I, s:I, s:I}", "kind", "oom", "pid",
                         p && p->pid > 0 ? json_integer(p->pid) : json_null(), "cmd", cmd, "argv", argv,
                         "tag", p ? p->tag : NULL, "kills", (json_int_t)kills, "oom_kills", (json_int_t)total,
                         "time_ms", (json_int_t)now_unix_ms());
  if (!p || !p->tag)
    json_object_set_new(ev, "tag", json_null());
  log_info("sandbox %s: the kernel OOM-killed %" PRIu64 " process(es) (command pid %d)", e->id, kills,
           p ? p->pid : 0);
  ctl_events_push(c, e->id, ev);
  ctl_logs_note_oom(c, e->id, ev);
  json_decref(ev);
}

bool ctl_oom_ended(struct moat_control *c, struct live *e, uint64_t before, const struct moat_oom_proc *p,
                   int exit_code, int signal) {
  bool by_kill = signal == SIGKILL || (signal == 0 && exit_code == 128 + SIGKILL);
  if (before == UINT64_MAX || !by_kill)
    return false;
  /* The kernel counts the kill before it sends the SIGKILL: the count is up by now. */
  uint64_t now = ctl_oom_count(c, e);
  if (now == UINT64_MAX || now <= before)
    return false;
  pthread_mutex_lock(&e->m);
  uint64_t from = e->oom_reported == UINT64_MAX || e->oom_reported < before ? before : e->oom_reported;
  if (e->oom_reported == UINT64_MAX || e->oom_reported < now)
    e->oom_reported = now;
  if (now > from)
    announce(c, e, now - from, now, p);
  pthread_mutex_unlock(&e->m);
  return true;
}

void ctl_oom_reap(struct moat_control *c, struct live *e) {
  uint64_t now = slot_count(c, e->slot);
  if (now == UINT64_MAX)
    return;
  if (e->oom_reported == UINT64_MAX || now < e->oom_reported) {
    e->oom_reported = e->oom_seen = now;
    return;
  }
  /* A command that ends soon after its kill claims it (with its pid): wait one pass. */
  if (now > e->oom_reported && now == e->oom_seen) {
    announce(c, e, now - e->oom_reported, now, NULL);
    e->oom_reported = now;
  }
  e->oom_seen = now;
}

uint64_t moat_control_oom_count(struct moat_control *c, const char *org, const char *id) {
  struct live *e = live_get(c, id);
  if (!e)
    return UINT64_MAX;
  uint64_t n = strcmp(e->org, org) == 0 ? ctl_oom_count(c, e) : UINT64_MAX;
  live_put(c, e);
  return n;
}

bool moat_control_oom_ended(struct moat_control *c, const char *org, const char *id, uint64_t before,
                            const struct moat_oom_proc *p, int exit_code, int signal) {
  struct live *e = live_get(c, id);
  if (!e)
    return false;
  bool r = strcmp(e->org, org) == 0 && ctl_oom_ended(c, e, before, p, exit_code, signal);
  live_put(c, e);
  return r;
}

/* explore.c -- POST /v1/sandboxes/{id}/explore: fork once per branch, run the branches' commands
 * concurrently, report their outcomes, keep the first to pass or let the client choose
 *
 * keep best: the branches live on with a short TTL; the open explores are remembered in memory
 * (c->explores) until chosen or expired, so after a moatd restart only the TTL reaps them.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/log.h"
#include "../common/util.h"
#include "control_internal.h"

#define EXPLORE_DEFAULT_TIMEOUT_MS 600000

struct explore {
  struct explore *next;
  char id[32];
  char *org;
  char parent[MOAT_ID_LEN + 1];
  size_t n;
  char (*branches)[MOAT_ID_LEN + 1];
  int64_t expires_at_ms;
};

void moat_explore_result_clear(struct moat_explore_result *r) {
  if (!r)
    return;
  for (size_t i = 0; i < r->n; i++) {
    free(r->outcomes[i].stdout_tail);
    free(r->outcomes[i].stderr_tail);
    free(r->outcomes[i].error);
    json_decref(r->outcomes[i].files_changed);
  }
  free(r->outcomes);
  memset(r, 0, sizeof(*r));
}

struct branch_job {
  struct moat_control *c;
  const char *org;
  const struct moat_explore_branch *b;
  struct moat_explore_outcome *o;
  enum moat_explore_keep keep;
  /* shared, under *lock */
  pthread_mutex_t *lock;
  char *winner; /* MOAT_ID_LEN + 1 */
  size_t n;
  struct branch_job *all;
};

static char *tail_of(const char *buf, size_t len, size_t *out_len) {
  size_t keep = len > MOAT_EXPLORE_TAIL ? MOAT_EXPLORE_TAIL : len;
  char *t = xmalloc(keep + 1);
  memcpy(t, buf + len - keep, keep);
  t[keep] = '\0';
  *out_len = keep;
  return t;
}

/* Files whose data or inode changed since start_ms on the branch's root filesystem (the overlay:
 * /proc, /sys, /dev and other mounts are not crossed). Deleted files are not reported. */
static json_t *files_changed(struct moat_control *c, const char *org, const char *id, int64_t start_ms) {
  char since[64];
  /* File times come from the coarse kernel clock, up to a tick behind the wall clock. */
  int64_t t = start_ms - 20;
  snprintf(since, sizeof(since), "@%lld.%03lld", (long long)(t / 1000), (long long)(t % 1000));
  char *argv[] = {"find", "/", "-xdev", "(",     "-newermt", since,    "-o", "-newerct",
                  since,  ")", "!",     "-type", "d",        "-print", NULL};
  struct moat_exec_req req = {.argv = argv, .timeout_ms = 30000, .max_output = 1 << 20};
  struct moat_exec_result res;
  memset(&res, 0, sizeof(res));
  moat_error *err = NULL;
  json_t *a = json_array();
  if (moat_control_exec(c, org, id, &req, &res, &err) < 0) {
    moat_error_free(&err);
    return a;
  }
  char *save = NULL;
  for (char *line = strtok_r(res.out, "\n", &save); line && json_array_size(a) < 1000;
       line = strtok_r(NULL, "\n", &save))
    json_array_append_new(a, json_string(line) ? json_string(line) : json_string("?"));
  moat_exec_result_free(&res);
  return a;
}

static void *branch_main(void *arg) {
  struct branch_job *j = arg;
  struct moat_explore_outcome *o = j->o;
  char *argv[] = {"/bin/sh", "-c", (char *)j->b->cmd, NULL};
  int64_t timeout = j->b->timeout_ms > 0 ? j->b->timeout_ms : EXPLORE_DEFAULT_TIMEOUT_MS;
  struct moat_exec_req req = {.argv = argv, .timeout_ms = (uint32_t)timeout};
  struct moat_exec_result res;
  memset(&res, 0, sizeof(res));
  moat_error *err = NULL;
  int64_t start = now_unix_ms();
  uint64_t t0 = now_ns();
  o->exit_code = -1;
  int rc = moat_control_exec(j->c, j->org, o->sandbox_id, &req, &res, &err);
  o->duration_ms = (int64_t)((now_ns() - t0) / 1000000);
  if (rc < 0) {
    o->error = xstrdup(moat_error_msg(err));
    moat_error_free(&err);
    o->stdout_tail = xstrdup("");
    o->stderr_tail = xstrdup("");
    o->files_changed = json_array();
    return NULL;
  }
  o->exit_code = res.exit_code;
  o->timed_out = res.timed_out;
  o->stdout_tail = tail_of(res.out, res.out_len, &o->stdout_len);
  o->stderr_tail = tail_of(res.err, res.err_len, &o->stderr_len);
  moat_exec_result_free(&res);

  /* first_success: claim the win before anything else, so that the losers are killed at once. */
  bool won = false, lost = false;
  if (j->keep == MOAT_KEEP_FIRST_SUCCESS) {
    pthread_mutex_lock(j->lock);
    if (*j->winner)
      lost = true; /* another branch won while this one ran: it is being killed */
    else if (o->exit_code == 0 && !o->timed_out) {
      snprintf(j->winner, MOAT_ID_LEN + 1, "%s", o->sandbox_id);
      won = true;
    }
    pthread_mutex_unlock(j->lock);
  }
  if (won)
    for (size_t i = 0; i < j->n; i++) {
      if (j->all[i].o == o)
        continue;
      moat_error *e2 = NULL;
      if (moat_control_kill(j->c, j->org, j->all[i].o->sandbox_id, "explore", &e2) < 0)
        moat_error_free(&e2);
    }
  o->files_changed = lost ? json_array() : files_changed(j->c, j->org, o->sandbox_id, start);
  return NULL;
}

int moat_control_explore(struct moat_control *c, const char *org, const char *id,
                         const struct moat_explore_branch *branches, size_t n, enum moat_explore_keep keep,
                         bool branch_databases, struct moat_explore_result *out, moat_error **err) {
  memset(out, 0, sizeof(*out));
  if (n < 1 || n > MOAT_EXPLORE_MAX_BRANCHES)
    return moat_error_set(err, EINVAL, "branches: must hold 1 to %d branches", MOAT_EXPLORE_MAX_BRANCHES);
  for (size_t i = 0; i < n; i++) {
    if (!branches[i].cmd || !*branches[i].cmd)
      return moat_error_set(err, EINVAL, "branches[%zu].cmd: must be a non-empty string", i);
    if (branches[i].timeout_ms < 0 || branches[i].timeout_ms > 86400000LL)
      return moat_error_set(err, EINVAL, "branches[%zu].timeout_ms: must be between 0 and 86400000", i);
  }
  char(*ids)[MOAT_ID_LEN + 1] = xcalloc(n, sizeof(*ids));
  if (tt_fork_ids(c, org, id, (unsigned)n, "explore", branch_databases, ids, err) < 0) {
    free(ids);
    return -1;
  }
  out->n = n;
  out->outcomes = xcalloc(n, sizeof(*out->outcomes));
  pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
  char winner[MOAT_ID_LEN + 1] = "";
  struct branch_job *jobs = xcalloc(n, sizeof(*jobs));
  pthread_t *th = xcalloc(n, sizeof(*th));
  for (size_t i = 0; i < n; i++) {
    snprintf(out->outcomes[i].sandbox_id, sizeof(out->outcomes[i].sandbox_id), "%s", ids[i]);
    jobs[i] = (struct branch_job){.c = c,
                                  .org = org,
                                  .b = &branches[i],
                                  .o = &out->outcomes[i],
                                  .keep = keep,
                                  .lock = &lock,
                                  .winner = winner,
                                  .n = n,
                                  .all = jobs};
  }
  bool *started = xcalloc(n, sizeof(*started));
  for (size_t i = 0; i < n; i++)
    started[i] = pthread_create(&th[i], NULL, branch_main, &jobs[i]) == 0;
  for (size_t i = 0; i < n; i++) {
    if (started[i])
      pthread_join(th[i], NULL);
    else
      branch_main(&jobs[i]);
  }
  free(started);
  free(th);
  free(jobs);
  pthread_mutex_destroy(&lock);

  if (keep == MOAT_KEEP_FIRST_SUCCESS) {
    snprintf(out->winner, sizeof(out->winner), "%s", winner);
    for (size_t i = 0; i < n; i++) {
      struct moat_explore_outcome *o = &out->outcomes[i];
      if (strcmp(o->sandbox_id, winner) == 0) {
        o->alive = true;
        continue;
      }
      moat_error *e2 = NULL;
      if (moat_control_kill(c, org, o->sandbox_id, "explore", &e2) < 0)
        moat_error_free(&e2); /* killed already when the winner finished */
    }
    free(ids);
    return 0;
  }

  /* best: every branch stays for MOAT_EXPLORE_BEST_TTL_S unless the client keeps one. */
  struct explore *x = xcalloc(1, sizeof(*x));
  snprintf(x->id, sizeof(x->id), "exp-");
  random_id(x->id + 4, 17);
  x->org = xstrdup(org);
  snprintf(x->parent, sizeof(x->parent), "%s", id);
  x->n = n;
  x->branches = ids;
  x->expires_at_ms = now_unix_ms() + MOAT_EXPLORE_BEST_TTL_S * 1000LL;
  struct moat_sandbox_patch p = {
      .has_ttl = true, .ttl_seconds = MOAT_EXPLORE_BEST_TTL_S, .has_persistent = true};
  for (size_t i = 0; i < n; i++) {
    moat_error *e2 = NULL;
    out->outcomes[i].alive = moat_control_update(c, org, ids[i], &p, NULL, &e2) == 0;
    moat_error_free(&e2);
  }
  snprintf(out->explore_id, sizeof(out->explore_id), "%s", x->id);
  out->expires_at_ms = x->expires_at_ms;
  pthread_mutex_lock(&c->explore_lock);
  x->next = c->explores;
  c->explores = x;
  pthread_mutex_unlock(&c->explore_lock);
  return 0;
}

int moat_control_explore_keep(struct moat_control *c, const char *org, const char *id, const char *explore_id,
                              const char *sandbox_id, struct moat_sandbox_info *out, moat_error **err) {
  pthread_mutex_lock(&c->explore_lock);
  struct explore **pp = &c->explores;
  while (*pp && !(strcmp((*pp)->id, explore_id) == 0 && strcmp((*pp)->org, org) == 0 &&
                  strcmp((*pp)->parent, id) == 0))
    pp = &(*pp)->next;
  struct explore *x = *pp;
  bool found = false;
  if (x)
    for (size_t i = 0; i < x->n; i++)
      found |= strcmp(x->branches[i], sandbox_id) == 0;
  if (x && found)
    *pp = x->next;
  pthread_mutex_unlock(&c->explore_lock);
  if (!x)
    return moat_error_set(err, ENOENT, "no open explore %.64s of sandbox %s (unknown, decided or expired)",
                          explore_id, id);
  if (!found)
    return moat_error_set(err, EINVAL, "sandbox %.64s is not a branch of explore %s", sandbox_id, explore_id);
  /* The parent's TTL and persistence go to the kept branch. */
  struct moat_store_sandbox prow = {0};
  struct moat_sandbox_patch p = {.has_ttl = true, .ttl_seconds = MOAT_DEFAULT_TTL_S};
  if (moat_store_sandbox_get(c->store, org, id, &prow, NULL) == 0) {
    p.ttl_seconds = prow.ttl_seconds;
    p.has_persistent = true;
    p.persistent = prow.persistent;
    moat_store_sandbox_clear(&prow);
  }
  int ret = moat_control_update(c, org, sandbox_id, &p, out, err);
  for (size_t i = 0; i < x->n; i++) {
    if (strcmp(x->branches[i], sandbox_id) == 0)
      continue;
    moat_error *e2 = NULL;
    if (moat_control_kill(c, org, x->branches[i], "explore", &e2) < 0)
      moat_error_free(&e2);
  }
  free(x->org);
  free(x->branches);
  free(x);
  return ret < 0 ? moat_error_wrap(err, "keep %s", sandbox_id) : 0;
}

void tt_reap_explores(struct moat_control *c, int64_t now_ms) {
  pthread_mutex_lock(&c->explore_lock);
  struct explore **pp = &c->explores;
  while (*pp) {
    struct explore *x = *pp;
    if (x->expires_at_ms > now_ms) {
      pp = &x->next;
      continue;
    }
    *pp = x->next; /* its branches' own TTL reaps them */
    free(x->org);
    free(x->branches);
    free(x);
  }
  pthread_mutex_unlock(&c->explore_lock);
}

void tt_explores_free(struct moat_control *c) {
  pthread_mutex_lock(&c->explore_lock);
  struct explore *x = c->explores;
  c->explores = NULL;
  pthread_mutex_unlock(&c->explore_lock);
  while (x) {
    struct explore *next = x->next;
    free(x->org);
    free(x->branches);
    free(x);
    x = next;
  }
}

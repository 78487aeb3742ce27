/* audit.c -- the audit log of mutating calls (control.h, "audit") */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../common/log.h"
#include "../common/util.h"
#include "control_internal.h"

#define AUDIT_PRUNE_EVERY_MS 60000

/* The entries recorded and not yet written, and the thread that writes them (a batch per
 * transaction, AUDIT_BATCH_MS after the first of it came). */
#define AUDIT_BATCH_MS 20
#define AUDIT_MAX_QUEUED 100000 /* beyond it entries are dropped (and counted in the log) */
struct ctl_audit {
  pthread_mutex_t lock; /* a leaf */
  pthread_cond_t cond;
  struct moat_store_audit *q;
  size_t n, cap;
  uint64_t dropped;
  bool stop;
  bool writing;        /* a batch taken and not yet committed */
  pthread_cond_t idle; /* nothing queued, nothing being written */
  pthread_t thread;
};

static char *dup_or_null(const char *s) { return s ? xstrdup(s) : NULL; }

void moat_control_audit_record(struct moat_control *c, const struct moat_audit_entry *a) {
  struct ctl_audit *x = c->audit;
  if (!x)
    return;
  pthread_mutex_lock(&x->lock);
  if (x->n >= AUDIT_MAX_QUEUED) {
    x->dropped++;
  } else {
    if (x->n == x->cap) {
      x->cap = x->cap ? x->cap * 2 : 64;
      x->q = xrealloc(x->q, x->cap * sizeof(*x->q));
    }
    x->q[x->n++] = (struct moat_store_audit){.at_ms = a->at_ms ? a->at_ms : now_unix_ms(),
                                             .org = xstrdup(a->org),
                                             .key_id = dup_or_null(a->key_id),
                                             .method = xstrdup(a->method),
                                             .route = xstrdup(a->route ? a->route : "-"),
                                             .path = xstrdup(a->path),
                                             .target = dup_or_null(a->target),
                                             .status = a->status};
    pthread_cond_signal(&x->cond);
  }
  pthread_mutex_unlock(&x->lock);
}

static void *audit_main(void *arg) {
  struct moat_control *c = arg;
  struct ctl_audit *x = c->audit;
  pthread_mutex_lock(&x->lock);
  for (;;) {
    while (x->n == 0 && !x->stop)
      pthread_cond_wait(&x->cond, &x->lock);
    if (x->n == 0 && x->stop)
      break;
    if (!x->stop) { /* let the batch fill */
      pthread_mutex_unlock(&x->lock);
      struct timespec ts = {0, AUDIT_BATCH_MS * 1000000L};
      nanosleep(&ts, NULL);
      pthread_mutex_lock(&x->lock);
    }
    struct moat_store_audit *batch = x->q;
    size_t n = x->n;
    uint64_t dropped = x->dropped;
    x->q = NULL;
    x->n = x->cap = 0;
    x->dropped = 0;
    x->writing = true;
    pthread_mutex_unlock(&x->lock);
    moat_error *e = NULL;
    if (moat_store_audit_add(c->store, batch, n, &e) < 0) {
      log_error("audit: %zu entries not recorded: %s", n, moat_error_msg(e));
      moat_error_free(&e);
    }
    if (dropped)
      log_error("audit: %llu entries dropped (more than %d waiting to be written)",
                (unsigned long long)dropped, AUDIT_MAX_QUEUED);
    moat_store_audit_free(batch, n);
    pthread_mutex_lock(&x->lock);
    x->writing = false;
    if (x->n == 0)
      pthread_cond_broadcast(&x->idle);
  }
  pthread_mutex_unlock(&x->lock);
  return NULL;
}

int ctl_audit_open(struct moat_control *c, moat_error **err) {
  struct ctl_audit *x = xcalloc(1, sizeof(*x));
  pthread_mutex_init(&x->lock, NULL);
  pthread_cond_init(&x->cond, NULL);
  pthread_cond_init(&x->idle, NULL);
  c->audit = x;
  int rc = pthread_create(&x->thread, NULL, audit_main, c);
  if (rc != 0) {
    c->audit = NULL;
    pthread_mutex_destroy(&x->lock);
    pthread_cond_destroy(&x->cond);
    pthread_cond_destroy(&x->idle);
    free(x);
    errno = rc;
    return moat_error_errno(err, "audit: thread");
  }
  return 0;
}

void ctl_audit_close(struct moat_control *c) {
  struct ctl_audit *x = c->audit;
  if (!x)
    return;
  pthread_mutex_lock(&x->lock);
  x->stop = true;
  pthread_cond_signal(&x->cond);
  pthread_mutex_unlock(&x->lock);
  pthread_join(x->thread, NULL); /* it writes what is queued first */
  c->audit = NULL;
  pthread_mutex_destroy(&x->lock);
  pthread_cond_destroy(&x->cond);
  pthread_cond_destroy(&x->idle);
  free(x);
}

int moat_control_audit_list(struct moat_control *c, const struct moat_store_audit_query *q,
                            struct moat_store_audit **out, size_t *n, moat_error **err) {
  /* what was recorded before the call is written first (at most a batch's wait) */
  struct ctl_audit *x = c->audit;
  if (x) {
    pthread_mutex_lock(&x->lock);
    while (x->n > 0 || x->writing)
      pthread_cond_wait(&x->idle, &x->lock);
    pthread_mutex_unlock(&x->lock);
  }
  return moat_store_audit_list(c->store, q, out, n, err);
}

int64_t moat_control_audit_retention_ms(const struct moat_control *c) { return c->audit_retention_ms; }

void ctl_audit_reap(struct moat_control *c, int64_t now_ms) {
  if (now_ms - c->audit_pruned_ms < AUDIT_PRUNE_EVERY_MS)
    return;
  c->audit_pruned_ms = now_ms;
  moat_error *e = NULL;
  int n = moat_store_audit_prune(c->store, now_ms - c->audit_retention_ms, &e);
  if (n < 0) {
    log_warn("audit: prune: %s", moat_error_msg(e));
    moat_error_free(&e);
  } else if (n > 0) {
    log_info("audit: removed %d entries older than %lld days", n,
             (long long)(c->audit_retention_ms / 86400000));
  }
}

/* health.c -- a sandbox whose guest stopped answering: checked once more, then killed and reported
 *
 * The guest channel calls on_unreachable whenever a call gives up on a guest (EHOSTUNREACH). One
 * check per sandbox runs at a time, on a thread of its own: a request served by PID 1 itself (a
 * spare worker may still answer for a PID 1 that hangs) must answer within HEALTH_CHECK_MS. If it
 * does not, and the sandbox is still running with the same init, it is killed with reason
 * guest_unresponsive (a state event like any kill).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../common/log.h"
#include "../common/util.h"
#include "control_internal.h"

#define HEALTH_CHECK_MS 5000

struct check {
  struct moat_control *c;
  struct live *e;
  struct moat_guest_ep ep;
};

static void *check_main(void *arg) {
  struct check *k = arg;
  moat_error *err = NULL;
  if (moat_guest_check(&k->ep, HEALTH_CHECK_MS, &err) < 0 &&
      !__atomic_load_n(&k->c->stop, __ATOMIC_SEQ_CST)) {
    pthread_mutex_lock(&k->e->m);
    if (k->e->state == MOAT_SB_RUNNING && k->e->pid == k->ep.pid) {
      log_warn("sandbox %s: its guest (pid %d) does not answer (%s): killing it", k->e->id, (int)k->ep.pid,
               moat_error_msg(err));
      kill_locked(k->c, k->e, "guest_unresponsive", NULL);
    }
    pthread_mutex_unlock(&k->e->m);
  }
  moat_error_free(&err);
  __atomic_store_n(&k->e->health_check, false, __ATOMIC_SEQ_CST);
  live_put(k->c, k->e);
  __atomic_sub_fetch(&k->c->health_checks, 1, __ATOMIC_SEQ_CST);
  free(k);
  return NULL;
}

static void on_unreachable(const struct moat_guest_ep *ep, void *arg) {
  struct moat_control *c = arg;
  if (!ep->id[0] || __atomic_load_n(&c->stop, __ATOMIC_SEQ_CST))
    return;
  struct live *e = live_get(c, ep->id);
  if (!e)
    return;
  if (__atomic_exchange_n(&e->health_check, true, __ATOMIC_SEQ_CST)) {
    live_put(c, e); /* one check at a time */
    return;
  }
  struct check *k = xcalloc(1, sizeof(*k));
  *k = (struct check){.c = c, .e = e, .ep = *ep};
  __atomic_add_fetch(&c->health_checks, 1, __ATOMIC_SEQ_CST);
  pthread_attr_t at;
  pthread_attr_init(&at);
  pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
  pthread_t t;
  if (pthread_create(&t, &at, check_main, k) != 0) {
    __atomic_store_n(&e->health_check, false, __ATOMIC_SEQ_CST);
    __atomic_sub_fetch(&c->health_checks, 1, __ATOMIC_SEQ_CST);
    live_put(c, e);
    free(k);
  }
  pthread_attr_destroy(&at);
}

void ctl_health_open(struct moat_control *c, unsigned guest_timeout_ms) {
  moat_guest_channel_configure(moat_host_guest_channel(c->host), guest_timeout_ms, on_unreachable, c);
}

void ctl_health_close(struct moat_control *c) {
  struct moat_guest_channel *ch = moat_host_guest_channel(c->host);
  moat_guest_channel_configure(ch, ch->timeout_ms, NULL, NULL);
  /* running checks end within HEALTH_CHECK_MS (the guest timeout bounds their connect) */
  for (int i = 0; i < 2000 && __atomic_load_n(&c->health_checks, __ATOMIC_SEQ_CST) > 0; i++) {
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
}

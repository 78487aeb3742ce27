/* database_events.c -- what happens to an org's databases, as events and counters (control.h,
 * "database events"): each database's recent events in a ring of its own (created, branched,
 * connection, hibernated, woken, restarted, deleted), kept while the database exists, and moatd's
 * counters of connections and wakes with the wake times' histogram. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "../common/util.h"
#include "control_internal.h"

#define DB_EVENTS_RING 256

const double moat_db_wake_bounds[MOAT_DB_WAKE_BUCKETS] = {0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};

struct ctl_db_ring {
  char id[MOAT_DB_ID_LEN + 1];
  json_t *ev[DB_EVENTS_RING]; /* ev[seq % DB_EVENTS_RING] for the last DB_EVENTS_RING seqs */
  uint64_t next_seq;          /* the seq the next event gets (the first is 1) */
  struct ctl_db_ring *next;
};

struct ctl_db_events {
  pthread_mutex_t lock; /* a leaf */
  struct ctl_db_ring *rings;
  struct moat_database_stats st;
};

void ctl_db_events_open(struct moat_control *c) {
  c->db_events = xcalloc(1, sizeof(*c->db_events));
  pthread_mutex_init(&c->db_events->lock, NULL);
}

static void ring_free(struct ctl_db_ring *r) {
  for (size_t i = 0; i < DB_EVENTS_RING; i++)
    json_decref(r->ev[i]);
  free(r);
}

void ctl_db_events_close(struct moat_control *c) {
  struct ctl_db_events *x = c->db_events;
  if (!x)
    return;
  for (struct ctl_db_ring *r = x->rings, *next; r; r = next) {
    next = r->next;
    ring_free(r);
  }
  pthread_mutex_destroy(&x->lock);
  free(x);
  c->db_events = NULL;
}

/* id's ring (made when create), x->lock held. */
static struct ctl_db_ring *ring_of(struct ctl_db_events *x, const char *id, bool create) {
  for (struct ctl_db_ring *r = x->rings; r; r = r->next)
    if (strcmp(r->id, id) == 0)
      return r;
  if (!create)
    return NULL;
  struct ctl_db_ring *r = xcalloc(1, sizeof(*r));
  snprintf(r->id, sizeof(r->id), "%s", id);
  r->next_seq = 1;
  r->next = x->rings;
  x->rings = r;
  return r;
}

void ctl_db_event(struct moat_control *c, const char *id, const char *type, json_t *fields) {
  struct ctl_db_events *x = c->db_events;
  json_t *ev = fields ? fields : json_object();
  json_object_set_new(ev, "type", json_string(type));
  json_object_set_new(ev, "database_id", json_string(id));
  json_object_set_new(ev, "at_ms", json_integer(now_unix_ms()));
  pthread_mutex_lock(&x->lock);
  if (strcmp(type, "connection") == 0 && json_is_true(json_object_get(ev, "opened")))
    x->st.connections_total++;
  struct ctl_db_ring *r = ring_of(x, id, true);
  uint64_t seq = r->next_seq++;
  json_object_set_new(ev, "seq", json_integer((json_int_t)seq));
  json_t **slot = &r->ev[seq % DB_EVENTS_RING];
  json_decref(*slot);
  *slot = ev;
  pthread_mutex_unlock(&x->lock);
}

void ctl_db_events_forget(struct moat_control *c, const char *id) {
  struct ctl_db_events *x = c->db_events;
  pthread_mutex_lock(&x->lock);
  for (struct ctl_db_ring **p = &x->rings; *p; p = &(*p)->next)
    if (strcmp((*p)->id, id) == 0) {
      struct ctl_db_ring *r = *p;
      *p = r->next;
      ring_free(r);
      break;
    }
  pthread_mutex_unlock(&x->lock);
}

void ctl_db_wake_observed(struct moat_control *c, double seconds) {
  struct ctl_db_events *x = c->db_events;
  pthread_mutex_lock(&x->lock);
  x->st.wakes_total++;
  x->st.wake_sum_s += seconds;
  for (size_t i = 0; i < MOAT_DB_WAKE_BUCKETS; i++)
    if (seconds <= moat_db_wake_bounds[i])
      x->st.wake_le[i]++;
  pthread_mutex_unlock(&x->lock);
}

void moat_control_database_stats(struct moat_control *c, struct moat_database_stats *out) {
  struct ctl_db_events *x = c->db_events;
  pthread_mutex_lock(&x->lock);
  *out = x->st;
  pthread_mutex_unlock(&x->lock);
}

json_t *moat_control_database_events(struct moat_control *c, const char *org, const char *id, uint64_t after,
                                     moat_error **err) {
  struct moat_store_database r = {0};
  if (moat_store_database_get(c->store, org, id, &r, err) < 0)
    return NULL;
  moat_store_database_clear(&r);
  struct ctl_db_events *x = c->db_events;
  json_t *out = json_array();
  pthread_mutex_lock(&x->lock);
  struct ctl_db_ring *ring = ring_of(x, id, false);
  if (ring) {
    uint64_t first = ring->next_seq > DB_EVENTS_RING ? ring->next_seq - DB_EVENTS_RING : 1;
    for (uint64_t s = after + 1 > first ? after + 1 : first; s < ring->next_seq; s++)
      json_array_append(out, ring->ev[s % DB_EVENTS_RING]);
  }
  pthread_mutex_unlock(&x->lock);
  return out;
}

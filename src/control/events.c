/* events.c -- a sandbox's recorded lifecycle events, scoped to an org, and subscriptions to its
 * connection log (GET .../events) */
#include <errno.h>
#include <pthread.h>
#include <string.h>

#include "../common/util.h"
#include "../host/net/net.h"
#include "control_internal.h"

struct moat_conn_sub {
  struct moat_control *c;
  char id[MOAT_ID_LEN + 1];
  /* c->conn_lock */
  struct moat_conn_sub *next;
  json_t *queue;
  uint64_t dropped;
};

/* The network log thread: one new entry of sandbox id. */
static void on_conn(const char *id, json_t *entry, void *arg) {
  struct moat_control *c = arg;
  pthread_mutex_lock(&c->conn_lock);
  for (struct moat_conn_sub *s = c->conn_subs; s; s = s->next) {
    if (strcmp(s->id, id) != 0)
      continue;
    if (json_array_size(s->queue) < MOAT_CONN_QUEUE_MAX)
      json_array_append(s->queue, entry);
    else
      s->dropped++;
  }
  pthread_mutex_unlock(&c->conn_lock);
}

void ctl_events_push(struct moat_control *c, const char *id, json_t *entry) { on_conn(id, entry, c); }

void ctl_events_open(struct moat_control *c) { moat_net_set_log_hook(moat_host_net(c->host), on_conn, c); }

struct moat_conn_sub *moat_control_conn_subscribe(struct moat_control *c, const char *org, const char *id,
                                                  moat_error **err) {
  struct moat_store_sandbox r = {0};
  if (moat_store_sandbox_get(c->store, org, id, &r, err) < 0)
    return NULL;
  moat_store_sandbox_clear(&r);
  struct moat_conn_sub *s = xcalloc(1, sizeof(*s));
  s->c = c;
  snprintf(s->id, sizeof(s->id), "%s", id);
  s->queue = json_array();
  pthread_mutex_lock(&c->conn_lock);
  s->next = c->conn_subs;
  c->conn_subs = s;
  pthread_mutex_unlock(&c->conn_lock);
  return s;
}

json_t *moat_conn_sub_take(struct moat_conn_sub *s, uint64_t *dropped) {
  json_t *fresh = json_array();
  pthread_mutex_lock(&s->c->conn_lock);
  json_t *q = s->queue;
  s->queue = fresh;
  *dropped = s->dropped;
  s->dropped = 0;
  pthread_mutex_unlock(&s->c->conn_lock);
  return q;
}

void moat_conn_sub_close(struct moat_conn_sub *s) {
  if (!s)
    return;
  pthread_mutex_lock(&s->c->conn_lock);
  for (struct moat_conn_sub **pp = &s->c->conn_subs; *pp; pp = &(*pp)->next)
    if (*pp == s) {
      *pp = s->next;
      break;
    }
  pthread_mutex_unlock(&s->c->conn_lock);
  json_decref(s->queue);
  free(s);
}

void moat_sandbox_events_free(struct moat_sandbox_event *v, size_t n) {
  for (size_t i = 0; v && i < n; i++) {
    free(v[i].from_state);
    free(v[i].to_state);
    free(v[i].reason);
  }
  free(v);
}

int moat_control_sandbox_events(struct moat_control *c, const char *org, const char *id,
                                struct moat_sandbox_event **out, size_t *n, char **forked_from,
                                moat_error **err) {
  struct moat_store_sandbox r = {0};
  *out = NULL;
  *n = 0;
  if (forked_from)
    *forked_from = NULL;
  if (moat_store_sandbox_get(c->store, org, id, &r, err) < 0)
    return -1;
  if (forked_from && r.forked_from)
    *forked_from = xstrdup(r.forked_from);
  moat_store_sandbox_clear(&r);
  struct moat_store_event *rows = NULL;
  size_t nr = 0;
  if (moat_store_events(c->store, id, &rows, &nr, err) < 0)
    return -1;
  struct moat_sandbox_event *v = xcalloc(nr ? nr : 1, sizeof(*v));
  for (size_t i = 0; i < nr; i++) { /* the strings change hands */
    v[i] = (struct moat_sandbox_event){.at_ms = rows[i].at_ms,
                                       .from_state = rows[i].from_state,
                                       .to_state = rows[i].to_state,
                                       .reason = rows[i].reason};
    rows[i].from_state = rows[i].to_state = rows[i].reason = NULL;
  }
  moat_store_events_free(rows, nr);
  *out = v;
  *n = nr;
  return 0;
}

uint64_t moat_control_events_wait(struct moat_control *c, uint64_t seen, int timeout_ms) {
  return moat_store_events_wait(c->store, seen, timeout_ms);
}

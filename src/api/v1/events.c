/* events.c -- GET /v1/sandboxes/{id}/events: the sandbox's lifecycle transitions and network
 * connections as Server-Sent Events
 *
 * Transitions: the source reads the store's sandbox_events rows (every transition, with time and
 * reason) whenever one is recorded (moat_control_events_wait), and at least every EV_POLL_MS. Connections:
 * control's subscription (moat_control_conn_subscribe) queues every new entry of the sandbox (beyond its
 * bound they are counted, and the subscriber gets a `dropped` {"connections": N} event instead), so that none
 * is lost when the sandbox's network slot goes away (hibernate, kill) before the next poll. Replay takes the
 * slot's ring (the last 1,024 entries) once, at subscription. Each poll emits what is new, merged in time
 * order; the writer in v1/stream.c hands it to the client and polls again only when all of it was written.
 * OOM kills (control.h) reach the same subscription as `oom` events, live only (not replayed).
 * The stream ends after the `killed` event.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../common/buf.h"
#include "../../common/log.h"
#include "v1.h"

#define EV_POLL_MS 200 /* latency of a live event */

struct evsrc {
  struct moat_control *ctl;
  char *org, *id;
  size_t n_seen;     /* transitions already sent (or skipped by since) */
  char *forked_from; /* the parent of a fork's child, named in its first event */
  json_t *initial;   /* the replayed connections, sent at the first poll */
  /* queue entries that are in initial too: seq <= skip_seq and time_ms <= skip_ms (until one is not) */
  bool skipping;
  uint64_t skip_seq;
  int64_t skip_ms;
  struct moat_conn_sub *sub; /* new connections */
};

static void ev_free(void *ctx) {
  struct evsrc *e = ctx;
  moat_conn_sub_close(e->sub);
  json_decref(e->initial);
  free(e->org);
  free(e->id);
  free(e->forked_from);
  free(e);
}

static bool is(const char *a, const char *b) { return a && strcmp(a, b) == 0; }

const char *api_v1_transition_name(const struct moat_sandbox_event *ev) {
  if (!ev->from_state)
    return "created";
  if (is(ev->to_state, "killed"))
    return "killed";
  if (is(ev->to_state, "running")) {
    if (is(ev->reason, "rollback"))
      return "rolled_back";
    if (is(ev->from_state, "paused"))
      return "resumed";
    if (is(ev->from_state, "hibernated"))
      return "woken";
  }
  return ev->to_state;
}

static json_t *state_json(const struct evsrc *e, const struct moat_sandbox_event *ev) {
  char at[64];
  json_t *d = json_pack("{s:s, s:s, s:s?, s:s?, s:s, s:I}", "state", ev->to_state, "event",
                        api_v1_transition_name(ev), "from", ev->from_state, "reason", ev->reason, "at",
                        api_rfc3339_ms(ev->at_ms, at, sizeof(at)), "at_ms", (json_int_t)ev->at_ms);
  if (!ev->from_state && e->forked_from)
    json_object_set_new(d, "forked_from", json_string(e->forked_from));
  return d;
}

static json_t *conn_json(json_t *le) {
  char at[64];
  int64_t ms = json_integer_value(json_object_get(le, "time_ms"));
  json_t *name = json_object_get(le, "name");
  return json_pack("{s:O, s:O, s:O, s:O, s:O, s:O, s:s, s:I, s:O}", "dst", json_object_get(le, "destination"),
                   "port", json_object_get(le, "port"), "proto", json_object_get(le, "protocol"), "name",
                   name ? name : json_null(), "verdict", json_object_get(le, "verdict"), "reason",
                   json_object_get(le, "reason"), "at", api_rfc3339_ms(ms, at, sizeof(at)), "at_ms",
                   (json_int_t)ms, "seq", json_object_get(le, "seq"));
}

/* An OOM kill control announced (control.h): its fields but kind and time_ms, and at/at_ms. */
static json_t *oom_json(json_t *le) {
  char at[64];
  int64_t ms = json_integer_value(json_object_get(le, "time_ms"));
  json_t *d = json_deep_copy(le);
  json_object_del(d, "kind");
  json_object_del(d, "time_ms");
  json_object_set_new(d, "at", json_string(api_rfc3339_ms(ms, at, sizeof(at))));
  json_object_set_new(d, "at_ms", json_integer(ms));
  return d;
}

/* The sandbox's connection log after seq since, or an empty array (no network, not running). */
static json_t *conns(struct evsrc *e, uint64_t since, unsigned limit) {
  moat_error *err = NULL;
  json_t *a = moat_control_network_log(e->ctl, e->org, e->id, since, limit, &err);
  if (!a) {
    moat_error_free(&err);
    a = json_array();
  }
  return a;
}

static void ev_next(void *ctx, struct moat_buf *out, int timeout_ms, bool *done) {
  struct evsrc *e = ctx;
  moat_error *err = NULL;
  uint64_t seq = moat_control_events_wait(e->ctl, 0, 0); /* the transitions recorded so far */
  struct moat_sandbox_event *evs = NULL;
  size_t n = 0;
  if (moat_control_sandbox_events(e->ctl, e->org, e->id, &evs, &n, NULL, &err) < 0) {
    const char *code;
    api_errno_http(err ? err->status : 0, &code);
    api_sse_format(out, "error", api_error_json(code, moat_error_msg(err)));
    moat_error_free(&err);
    *done = true;
    return;
  }
  json_t *cs = e->initial ? e->initial : json_array();
  e->initial = NULL;
  uint64_t dropped;
  json_t *q = moat_conn_sub_take(e->sub, &dropped);
  size_t qi;
  json_t *qe;
  json_array_foreach(q, qi, qe) {
    if (is(json_string_value(json_object_get(qe, "kind")), "oom")) { /* not in the ring */
      json_array_append(cs, qe);
      continue;
    }
    if (e->skipping && (uint64_t)json_integer_value(json_object_get(qe, "seq")) <= e->skip_seq &&
        json_integer_value(json_object_get(qe, "time_ms")) <= e->skip_ms)
      continue;
    e->skipping = false;
    json_array_append(cs, qe);
  }
  json_decref(q);
  size_t ci = 0, nc = json_array_size(cs);
  size_t before = out->len;
  if (dropped)
    api_sse_format(out, "dropped", json_pack("{s:I}", "connections", (json_int_t)dropped));
  while (e->n_seen < n || ci < nc) {
    json_t *le = ci < nc ? json_array_get(cs, ci) : NULL;
    int64_t cms = le ? json_integer_value(json_object_get(le, "time_ms")) : 0;
    if (e->n_seen < n && (!le || evs[e->n_seen].at_ms <= cms)) {
      const struct moat_sandbox_event *ev = &evs[e->n_seen++];
      api_sse_format(out, "state", state_json(e, ev));
      if (strcmp(ev->to_state, "killed") == 0) {
        *done = true;
        break;
      }
      continue;
    }
    if (is(json_string_value(json_object_get(le, "kind")), "oom"))
      api_sse_format(out, "oom", oom_json(le));
    else
      api_sse_format(out, "connection", conn_json(le));
    ci++;
  }
  json_decref(cs);
  moat_sandbox_events_free(evs, n);
  /* nothing new: a transition (of any sandbox) ends the wait at once; connections are polled */
  if (out->len == before && !*done)
    moat_control_events_wait(e->ctl, seq, timeout_ms < EV_POLL_MS ? timeout_ms : EV_POLL_MS);
}

int api_h_events(struct api_req *r, json_t *body) {
  static const char *const allowed[] = {"since", "replay", NULL};
  moat_error *err = NULL;
  bool replay;
  if (api_args_check(&r->args, allowed, &err) < 0 ||
      api_arg_bool(&r->args, "replay", false, &replay, &err) < 0)
    return api_reply_moat_error(r, &err);
  const char *since_s = api_arg_get(&r->args, "since");
  int64_t since = 0;
  if (since_s && api_parse_time_ms(since_s, &since) < 0)
    return api_reply_error(r, 400, "invalid_request",
                           "query parameter 'since' must be an RFC 3339 time or Unix milliseconds");
  bool from_start = replay || since_s;
  if (!since_s)
    since = replay ? 0 : INT64_MAX;

  struct moat_control *ctl = api_control(r);
  struct moat_sandbox_event *evs = NULL;
  size_t n = 0;
  char *forked_from = NULL;
  if (moat_control_sandbox_events(ctl, r->org, r->route.id, &evs, &n, &forked_from, &err) < 0)
    return api_reply_moat_error(r, &err);
  struct evsrc *e = xcalloc(1, sizeof(*e));
  e->forked_from = forked_from;
  e->initial = json_array();
  e->ctl = ctl;
  e->org = xstrdup(r->org);
  e->id = xstrdup(r->route.id);
  while (e->n_seen < n && (!from_start || evs[e->n_seen].at_ms < since))
    e->n_seen++;
  /* A killed sandbox's stream always carries its last event, the kill, and ends. */
  if (e->n_seen == n && n > 0 && strcmp(evs[n - 1].to_state, "killed") == 0)
    e->n_seen = n - 1;
  moat_sandbox_events_free(evs, n);
  /* Connections: subscribe first, then take the ring (its entries at or after since are replayed;
   * those that reached the queue meanwhile are skipped at the first poll). */
  e->sub = moat_control_conn_subscribe(ctl, r->org, r->route.id, &err);
  if (!e->sub) {
    ev_free(e);
    return api_reply_moat_error(r, &err);
  }
  json_t *cs = conns(e, 0, 1024);
  size_t i;
  json_t *le;
  json_array_foreach(cs, i, le) {
    int64_t ms = json_integer_value(json_object_get(le, "time_ms"));
    e->skipping = true;
    e->skip_seq = (uint64_t)json_integer_value(json_object_get(le, "seq"));
    e->skip_ms = ms;
    if (from_start && ms >= since)
      json_array_append(e->initial, le);
  }
  json_decref(cs);
  struct api_stream_source src = {.next = ev_next, .free = ev_free, .ctx = e};
  /* A comment first, so that the client sees the headers and knows the subscription is in place. */
  return api_stream_reply(r, &src, "text/event-stream", ": subscribed\n\n");
}

/* api_events.c -- GET /v1/sandboxes/{id}/events: the sandbox's lifecycle transitions and network
 * connections as Server-Sent Events
 *
 * The source polls what moatd records anyway: the store's sandbox_events rows (every transition,
 * with time and reason) and the connection ring of the sandbox's network slot (host/net.c, the
 * last 1,024 entries). Each poll emits what is new, merged in time order, then the writer in
 * api_stream.c hands it to the client; a poll runs only when everything before it was written,
 * so a subscriber holds at most one poll's events (<= EV_CONN_BATCH connections plus the new
 * transitions). A subscriber that reads slower than the sandbox connects loses the connections
 * the ring overwrote meanwhile and is told so with a `dropped` event ({"connections": N}).
 * The stream ends after the `killed` event.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../common/buf.h"
#include "../common/log.h"
#include "../store/store.h"
#include "api_internal.h"

#define EV_POLL_MS 200    /* latency of a live event */
#define EV_CONN_BATCH 256 /* connections taken per poll */

struct evsrc {
  struct moat_control *ctl;
  char *org, *id;
  size_t n_seen;     /* transitions already sent (or skipped by since) */
  uint64_t conn_seq; /* last connection sequence number sent (or skipped) */
  bool conn_gap_ok;  /* a jump in sequence numbers is a drop (false right after a new slot) */
  char *forked_from; /* the parent of a fork's child, named in its first event */
};

static void ev_free(void *ctx) {
  struct evsrc *e = ctx;
  free(e->org);
  free(e->id);
  free(e->forked_from);
  free(e);
}

static bool is(const char *a, const char *b) { return a && strcmp(a, b) == 0; }

/* What a transition means: created, running (ready), paused, resumed, hibernated, woken,
 * rolled_back, killed; else the new state's name. */
static const char *transition_name(const struct moat_store_event *ev) {
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

/* A transition into running that gives the sandbox a fresh network slot (whose log starts over). */
static bool new_slot(const struct moat_store_event *ev) {
  return is(ev->to_state, "running") && (!is(ev->from_state, "paused") || is(ev->reason, "rollback"));
}

static json_t *state_json(const struct evsrc *e, const struct moat_store_event *ev) {
  char at[64];
  json_t *d = json_pack("{s:s, s:s, s:s?, s:s?, s:s, s:I}", "state", ev->to_state, "event", transition_name(ev),
                        "from", ev->from_state, "reason", ev->reason, "at", api_rfc3339_ms(ev->at_ms, at, sizeof(at)),
                        "at_ms", (json_int_t)ev->at_ms);
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
  struct moat_store_event *evs = NULL;
  size_t n = 0;
  if (moat_control_sandbox_events(e->ctl, e->org, e->id, &evs, &n, NULL, &err) < 0) {
    const char *code;
    api_errno_http(err ? err->status : 0, &code);
    api_sse_format(out, "error", api_error_json(code, moat_error_msg(err)));
    moat_error_free(&err);
    *done = true;
    return;
  }
  json_t *cs = conns(e, e->conn_seq, EV_CONN_BATCH);
  size_t ci = 0, nc = json_array_size(cs);
  size_t before = out->len;
  while (e->n_seen < n || ci < nc) {
    json_t *le = ci < nc ? json_array_get(cs, ci) : NULL;
    int64_t cms = le ? json_integer_value(json_object_get(le, "time_ms")) : 0;
    if (e->n_seen < n && (!le || evs[e->n_seen].at_ms <= cms)) {
      const struct moat_store_event *ev = &evs[e->n_seen++];
      api_sse_format(out, "state", state_json(e, ev));
      if (strcmp(ev->to_state, "killed") == 0) {
        *done = true;
        break;
      }
      if (new_slot(ev)) {
        e->conn_seq = 0;
        e->conn_gap_ok = false;
        if (ci < nc)
          break; /* the rest of cs is the slot before's: the new slot's log comes at the next poll */
      }
      continue;
    }
    uint64_t seq = (uint64_t)json_integer_value(json_object_get(le, "seq"));
    if (e->conn_gap_ok && seq > e->conn_seq + 1)
      api_sse_format(out, "dropped", json_pack("{s:I}", "connections", (json_int_t)(seq - e->conn_seq - 1)));
    api_sse_format(out, "connection", conn_json(le));
    e->conn_seq = seq;
    e->conn_gap_ok = true;
    ci++;
  }
  json_decref(cs);
  moat_store_events_free(evs, n);
  if (out->len == before && !*done) {
    struct timespec ts = {0, (long)(timeout_ms < EV_POLL_MS ? timeout_ms : EV_POLL_MS) * 1000000L};
    nanosleep(&ts, NULL);
  }
}

/* since: RFC 3339 ("2026-01-02T03:04:05.678Z", "+01:00" offsets) or Unix milliseconds. */
static int parse_since(const char *s, int64_t *ms) {
  char *end;
  if (*s >= '0' && *s <= '9' && strspn(s, "0123456789") == strlen(s)) {
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || strlen(s) > 15)
      return -1;
    *ms = v;
    return 0;
  }
  struct tm tm = {0};
  int used = 0;
  if (sscanf(s, "%4d-%2d-%2d%*1[Tt ]%2d:%2d:%2d%n", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour, &tm.tm_min,
             &tm.tm_sec, &used) != 6 ||
      used != 19)
    return -1;
  if (tm.tm_mon < 1 || tm.tm_mon > 12 || tm.tm_mday < 1 || tm.tm_mday > 31 || tm.tm_hour > 23 || tm.tm_min > 59 ||
      tm.tm_sec > 60)
    return -1;
  const char *p = s + used;
  int64_t frac = 0;
  if (*p == '.') {
    int digits = 0;
    for (p++; *p >= '0' && *p <= '9'; p++, digits++)
      if (digits < 3)
        frac = frac * 10 + (*p - '0');
    if (digits == 0)
      return -1;
    for (; digits < 3; digits++)
      frac *= 10;
  }
  int64_t off = 0;
  if (*p == 'Z' || *p == 'z') {
    p++;
  } else if (*p == '+' || *p == '-') {
    int hh, mm, k = 0;
    if (sscanf(p + 1, "%2d:%2d%n", &hh, &mm, &k) != 2 || k != 5 || hh > 23 || mm > 59)
      return -1;
    off = (hh * 60 + mm) * 60 * (*p == '+' ? 1 : -1);
    p += 6;
  } else {
    return -1;
  }
  if (*p)
    return -1;
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  time_t t = timegm(&tm);
  if (t == (time_t)-1)
    return -1;
  *ms = ((int64_t)t - off) * 1000 + frac;
  return 0;
}

int api_h_events(struct api_req *r) {
  static const char *const allowed[] = {"since", "replay", NULL};
  moat_error *err = NULL;
  bool replay;
  if (api_args_check(&r->args, allowed, &err) < 0 || api_arg_bool(&r->args, "replay", false, &replay, &err) < 0)
    return api_reply_moat_error(r, &err);
  const char *since_s = api_arg_get(&r->args, "since");
  int64_t since = 0;
  if (since_s && parse_since(since_s, &since) < 0)
    return api_reply_error(r, 400, "invalid_request",
                           "query parameter 'since' must be an RFC 3339 time or Unix milliseconds");
  bool from_start = replay || since_s;
  if (!since_s)
    since = replay ? 0 : INT64_MAX;

  struct moat_control *ctl = api_control(r);
  struct moat_store_event *evs = NULL;
  size_t n = 0;
  char *forked_from = NULL;
  if (moat_control_sandbox_events(ctl, r->org, r->route.id, &evs, &n, &forked_from, &err) < 0)
    return api_reply_moat_error(r, &err);
  struct evsrc *e = xcalloc(1, sizeof(*e));
  e->forked_from = forked_from;
  e->ctl = ctl;
  e->org = xstrdup(r->org);
  e->id = xstrdup(r->route.id);
  while (e->n_seen < n && (!from_start || evs[e->n_seen].at_ms < since))
    e->n_seen++;
  /* A killed sandbox's stream always carries its last event, the kill, and ends. */
  if (e->n_seen == n && n > 0 && strcmp(evs[n - 1].to_state, "killed") == 0)
    e->n_seen = n - 1;
  moat_store_events_free(evs, n);
  /* Connections: the ring's entries at or after since, or none of those buffered now. */
  json_t *cs = conns(e, 0, 1024);
  size_t i;
  json_t *le;
  json_array_foreach(cs, i, le) {
    uint64_t seq = (uint64_t)json_integer_value(json_object_get(le, "seq"));
    if (from_start && json_integer_value(json_object_get(le, "time_ms")) >= since) {
      e->conn_seq = seq - 1;
      break;
    }
    e->conn_seq = seq;
  }
  json_decref(cs);
  struct api_sse_source src = {.next = ev_next, .free = ev_free, .ctx = e};
  /* A comment first, so that the client sees the headers and knows the subscription is in place. */
  return api_sse_reply_source(r, &src, ": subscribed\n\n");
}

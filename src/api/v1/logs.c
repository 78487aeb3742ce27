/* logs.c -- GET /v1/sandboxes/{id}/logs: the sandbox's output log (every process's start, output
 * and exit, control/logs.c) merged in time order with its lifecycle transitions
 *
 * Query: follow (bool, default false: what is stored, then the end), since (RFC 3339 or Unix ms:
 * entries at or after it; the bound's `dropped` marker is always first when there is one).
 * Answer: text/event-stream (one event per entry, named by its type), or with
 * `Accept: application/json` (and no follow) one JSON object {"entries": [...]}.
 * A followed stream ends once the sandbox is killed and its log has nothing more.
 */
#include <errno.h>
#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../common/buf.h"
#include "../../common/codec.h"
#include "../../common/util.h"
#include "v1.h"

#define LOGS_POLL_MS 200
#define LOGS_CHUNK (512u << 10) /* what one call of next appends at most */

struct logsrc {
  struct moat_control *ctl;
  char *org, *id;
  struct moat_log_reader *rd;
  bool follow;
  int64_t since;
  size_t n_seen;      /* lifecycle transitions already sent or skipped */
  bool killed_seen;   /* the kill transition was sent */
  char *forked_from;  /* named in a fork's `created` */
  bool have;          /* rec holds a record not sent yet */
  json_t *pending;    /* that record's entry */
  int64_t pending_ms; /* and its time */
};

static void logs_free(void *ctx) {
  struct logsrc *s = ctx;
  moat_log_reader_close(s->rd);
  json_decref(s->pending);
  free(s->org);
  free(s->id);
  free(s->forked_from);
  free(s);
}

static bool is(const char *a, const char *b) { return a && strcmp(a, b) == 0; }

static void set_time(json_t *j, int64_t ms) {
  char at[64];
  json_object_set_new(j, "at", json_string(api_rfc3339_ms(ms, at, sizeof(at))));
  json_object_set_new(j, "at_ms", json_integer(ms));
}

static json_t *lifecycle_json(const struct logsrc *s, const struct moat_sandbox_event *ev) {
  json_t *j =
      json_pack("{s:s, s:s, s:s, s:s?, s:s?}", "type", "lifecycle", "event", api_v1_transition_name(ev),
                "state", ev->to_state, "from", ev->from_state, "reason", ev->reason);
  if (!ev->from_state && s->forked_from)
    json_object_set_new(j, "forked_from", json_string(s->forked_from));
  set_time(j, ev->at_ms);
  return j;
}

static const char *stream_name(enum moat_log_kind k) {
  return k == MOAT_LOG_STDERR ? "stderr" : k == MOAT_LOG_PTY ? "pty" : "stdout";
}

/* The entry of a record (NULL for a kind this version does not know). */
static json_t *rec_json(const struct moat_log_rec *r) {
  json_t *j = NULL;
  switch (r->kind) {
  case MOAT_LOG_STDOUT:
  case MOAT_LOG_STDERR:
  case MOAT_LOG_PTY: {
    j = json_pack("{s:s, s:s, s:i}", "type", "output", "stream", stream_name(r->kind), "pid", r->pid);
    if (api_utf8_valid((const char *)r->data, r->len)) {
      json_object_set_new(j, "data", json_stringn((const char *)r->data, r->len));
      json_object_set_new(j, "encoding", json_string("utf8"));
    } else {
      size_t bl;
      char *b = moat_base64_encode(r->data, r->len, &bl);
      json_object_set_new(j, "data", json_stringn(b, bl));
      json_object_set_new(j, "encoding", json_string("base64"));
      free(b);
    }
    break;
  }
  case MOAT_LOG_START:
  case MOAT_LOG_EXIT: {
    json_t *d = json_loadb((const char *)r->data, r->len, 0, NULL);
    j = json_is_object(d) ? d : json_object();
    if (!json_is_object(d))
      json_decref(d);
    json_object_set_new(j, "type", json_string("process"));
    json_object_set_new(j, "event", json_string(r->kind == MOAT_LOG_START ? "start" : "exit"));
    json_object_set_new(j, "pid", json_integer(r->pid));
    json_object_del(j, "started_at_ms");
    break;
  }
  case MOAT_LOG_LOST:
    j = json_pack("{s:s, s:s, s:I, s:i, s:s}", "type", "dropped", "reason", "unread", "bytes",
                  (json_int_t)r->value, "pid", r->pid, "stream", r->stream ? "stderr" : "stdout");
    break;
  case MOAT_LOG_OOM: {
    json_t *d = json_loadb((const char *)r->data, r->len, 0, NULL);
    j = json_is_object(d) ? d : json_object();
    if (!json_is_object(d))
      json_decref(d);
    json_object_set_new(j, "type", json_string("oom"));
    break;
  }
  case MOAT_LOG_DROPPED:
    return json_pack("{s:s, s:s, s:I}", "type", "dropped", "reason", "bound", "bytes", (json_int_t)r->value);
  }
  if (!j)
    return NULL;
  if (r->tag && r->kind != MOAT_LOG_LOST)
    json_object_set_new(j, "tag", json_string(r->tag));
  set_time(j, r->at_ms);
  return j;
}

static void emit(struct moat_buf *out, json_t *j) {
  char name[32];
  const char *type = json_string_value(json_object_get(j, "type"));
  snprintf(name, sizeof(name), "%s", type ? type : "entry"); /* api_sse_format takes j */
  api_sse_format(out, name, j);
}

/* The next stored record at or after since into s->pending; false when there is none yet. */
static bool fill(struct logsrc *s) {
  while (!s->have) {
    struct moat_log_rec r;
    moat_error *err = NULL;
    int n = moat_log_reader_next(s->rd, &r, &err);
    moat_error_free(&err);
    if (n <= 0)
      return false;
    if (r.kind != MOAT_LOG_DROPPED && r.at_ms < s->since)
      continue;
    json_t *j = rec_json(&r);
    if (!j)
      continue;
    s->pending = j;
    s->pending_ms = r.kind == MOAT_LOG_DROPPED ? INT64_MIN : r.at_ms;
    s->have = true;
  }
  return true;
}

/* Appends up to LOGS_CHUNK of entries, in time order, to out (or to arr when not NULL). */
static void produce(struct logsrc *s, struct moat_buf *out, json_t *arr, bool *more) {
  struct moat_sandbox_event *evs = NULL;
  size_t n = 0;
  moat_error *err = NULL;
  if (moat_control_sandbox_events(s->ctl, s->org, s->id, &evs, &n, NULL, &err) < 0)
    moat_error_free(&err);
  size_t before = out ? out->len : 0;
  *more = false;
  for (;;) {
    if (out && out->len - before >= LOGS_CHUNK) {
      *more = true;
      break;
    }
    bool rec = fill(s);
    bool ev = s->n_seen < n;
    if (!rec && !ev)
      break;
    json_t *j;
    if (ev && (!rec || evs[s->n_seen].at_ms <= s->pending_ms)) {
      const struct moat_sandbox_event *e = &evs[s->n_seen++];
      if (e->at_ms < s->since)
        continue;
      if (is(e->to_state, "killed"))
        s->killed_seen = true;
      j = lifecycle_json(s, e);
    } else {
      j = s->pending;
      s->pending = NULL;
      s->have = false;
    }
    if (arr)
      json_array_append_new(arr, j);
    else
      emit(out, j);
  }
  moat_sandbox_events_free(evs, n);
}

static void logs_next(void *ctx, struct moat_buf *out, int timeout_ms, bool *done) {
  struct logsrc *s = ctx;
  uint64_t seq = moat_control_logs_wait(s->ctl, 0, 0);
  bool more;
  size_t before = out->len;
  produce(s, out, NULL, &more);
  if (more)
    return;
  if (!s->follow) {
    *done = true;
    return;
  }
  if (out->len > before)
    return;
  /* nothing new: once the sandbox is killed and its logger ended, nothing more will come */
  if (s->killed_seen && !moat_control_logs_writing(s->ctl, s->id)) {
    produce(s, out, NULL, &more);
    if (!more)
      *done = true;
    return;
  }
  moat_control_logs_wait(s->ctl, seq, timeout_ms < LOGS_POLL_MS ? timeout_ms : LOGS_POLL_MS);
}

static bool wants_json(const struct api_req *r) {
  const char *a = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_ACCEPT);
  return a && strstr(a, "application/json") && !strstr(a, "text/event-stream");
}

int api_h_logs(struct api_req *r, json_t *body) {
  static const char *const allowed[] = {"since", "follow", NULL};
  moat_error *err = NULL;
  bool follow;
  if (api_args_check(&r->args, allowed, &err) < 0 ||
      api_arg_bool(&r->args, "follow", false, &follow, &err) < 0)
    return api_reply_moat_error(r, &err);
  const char *since_s = api_arg_get(&r->args, "since");
  int64_t since = INT64_MIN;
  if (since_s && api_parse_time_ms(since_s, &since) < 0)
    return api_reply_error(r, 400, "invalid_request",
                           "query parameter 'since' must be an RFC 3339 time or Unix milliseconds");
  bool json = wants_json(r);
  if (json && follow)
    return api_reply_error(r, 400, "invalid_request",
                           "follow=true streams text/event-stream; ask for it, not application/json");
  struct moat_control *ctl = api_control(r);
  struct logsrc *s = xcalloc(1, sizeof(*s));
  s->ctl = ctl;
  s->org = xstrdup(r->org);
  s->id = xstrdup(r->route.id);
  s->follow = follow;
  s->since = since;
  if (moat_control_logs_open(ctl, r->org, r->route.id, &s->rd, NULL, &err) < 0) {
    logs_free(s);
    return api_reply_moat_error(r, &err);
  }
  struct moat_sandbox_event *evs = NULL;
  size_t n = 0;
  if (moat_control_sandbox_events(ctl, r->org, r->route.id, &evs, &n, &s->forked_from, &err) < 0) {
    logs_free(s);
    return api_reply_moat_error(r, &err);
  }
  moat_sandbox_events_free(evs, n);
  if (json) {
    json_t *arr = json_array();
    bool more;
    produce(s, NULL, arr, &more);
    logs_free(s);
    return api_reply_json(r, 200, json_pack("{s:o}", "entries", arr));
  }
  struct api_stream_source src = {.next = logs_next, .free = logs_free, .ctx = s};
  return api_stream_reply(r, &src, "text/event-stream", ": logs\n\n");
}

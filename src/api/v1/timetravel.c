/* timetravel.c -- pause/resume, hibernate/wake, snapshots, fork, explore, rollback
 *
 * Bodies and replies are in docs/CONTRACT.md ("Time travel"). Errors beyond the usual ones:
 * 409 sandbox_paused (guest access to a paused sandbox), 409 conflict (a transition the state
 * does not allow, or deleting a snapshot being restored), 503 checkpoints_unavailable (the host
 * has no working CRIU: snapshots, fork, explore, hibernate, wake, rollback, from_snapshot).
 */
#include <errno.h>
#include <string.h>

#include "v1.h"

/* Rejects every field of body not in allowed (NULL-terminated). */
static int only_fields(json_t *body, const char *const *allowed, moat_error **err) {
  const char *k;
  json_t *v;
  json_object_foreach(body, k, v) {
    bool ok = false;
    for (size_t i = 0; allowed[i] && !ok; i++)
      ok = strcmp(k, allowed[i]) == 0;
    if (!ok)
      return moat_error_set(err, EINVAL, "unknown field '%.128s'", k);
  }
  return 0;
}

/* Replies with the sandbox as it is now. */
static int reply_sandbox(struct api_req *r, unsigned status, const char *id) {
  moat_error *err = NULL;
  struct moat_sandbox_info info;
  memset(&info, 0, sizeof(info));
  if (moat_control_get(api_control(r), r->org, id, &info, &err) < 0)
    return api_reply_moat_error(r, &err);
  int ret = api_reply_json(r, status, api_sandbox_json(&info));
  moat_sandbox_info_clear(&info);
  return ret;
}

typedef int (*transition_fn)(struct moat_control *, const char *, const char *, moat_error **);

static int transition(struct api_req *r, json_t *body, transition_fn fn) {
  static const char *const none[] = {NULL};
  moat_error *err = NULL;
  if (api_args_none(r) < 0)
    return -1;
  if (body && only_fields(body, none, &err) < 0)
    return api_reply_moat_error(r, &err);
  if (fn(api_control(r), r->org, r->route.id, &err) < 0)
    return api_reply_moat_error(r, &err);
  return reply_sandbox(r, 200, r->route.id);
}

int api_h_pause(struct api_req *r, json_t *body) { return transition(r, body, moat_control_pause); }
int api_h_resume(struct api_req *r, json_t *body) { return transition(r, body, moat_control_resume); }
int api_h_hibernate(struct api_req *r, json_t *body) { return transition(r, body, moat_control_hibernate); }
int api_h_wake(struct api_req *r, json_t *body) { return transition(r, body, moat_control_wake); }

/* ---- snapshots ---- */

static json_t *snapshot_json(const struct moat_snapshot_info *s) {
  json_t *o = json_object();
  json_object_set_new(o, "id", json_string(s->id));
  json_object_set_new(o, "snapshot_id", json_string(s->id));
  json_object_set_new(o, "sandbox_id", json_string(s->sandbox_id));
  json_object_set_new(o, "template", json_string(s->template_name ? s->template_name : ""));
  json_object_set_new(o, "created_at", api_time_json(s->created_at_ms, false));
  json_object_set_new(o, "memory_bytes", json_integer((json_int_t)s->memory_bytes));
  json_object_set_new(o, "disk_bytes", json_integer((json_int_t)s->disk_bytes));
  json_object_set_new(o, "metadata", s->metadata ? json_incref(s->metadata) : json_object());
  return o;
}

/* An object of <= 64 string values (the sandbox metadata rules). */
static int check_metadata(json_t *v, moat_error **err) {
  if (!json_is_object(v))
    return moat_error_set(err, EINVAL, "field 'metadata' must be an object of strings");
  if (json_object_size(v) > API_MAX_META_KEYS)
    return moat_error_set(err, EINVAL, "field 'metadata' has more than %d keys", API_MAX_META_KEYS);
  const char *k;
  json_t *x;
  json_object_foreach(v, k, x) {
    size_t kl = strlen(k);
    if (kl == 0 || kl > API_MAX_META_KEY)
      return moat_error_set(err, EINVAL, "field 'metadata': keys must be 1 to %d bytes", API_MAX_META_KEY);
    if (!json_is_string(x) || json_string_length(x) > API_MAX_META_VALUE ||
        strlen(json_string_value(x)) != json_string_length(x))
      return moat_error_set(err, EINVAL, "field 'metadata.%.64s' must be a string of at most %d bytes", k,
                            API_MAX_META_VALUE);
  }
  return 0;
}

int api_h_snapshot_create(struct api_req *r, json_t *body) {
  static const char *const allowed[] = {"metadata", NULL};
  moat_error *err = NULL;
  if (api_args_none(r) < 0)
    return -1;
  json_t *meta = body ? json_object_get(body, "metadata") : NULL;
  if ((body && only_fields(body, allowed, &err) < 0) ||
      (meta && !json_is_null(meta) && check_metadata(meta, &err) < 0))
    return api_reply_moat_error(r, &err);
  struct moat_snapshot_info s;
  memset(&s, 0, sizeof(s));
  if (moat_control_snapshot_create(api_control(r), r->org, r->route.id, json_is_object(meta) ? meta : NULL,
                                   &s, &err) < 0)
    return api_reply_moat_error(r, &err);
  int ret = api_reply_json(r, 201, snapshot_json(&s));
  moat_snapshot_info_clear(&s);
  return ret;
}

int api_h_snapshots_list(struct api_req *r, json_t *body) {
  static const char *const allowed[] = {"sandbox_id", NULL};
  moat_error *err = NULL;
  if (api_args_check(&r->args, allowed, &err) < 0)
    return api_reply_moat_error(r, &err);
  const char *sb = api_arg_get(&r->args, "sandbox_id");
  if (sb && !api_valid_sandbox_id(sb))
    return api_reply_error(r, 400, "invalid_request", "query parameter 'sandbox_id' is not a sandbox id");
  struct moat_snapshot_info *v = NULL;
  size_t n = 0;
  if (moat_control_snapshot_list(api_control(r), r->org, sb, &v, &n, &err) < 0)
    return api_reply_moat_error(r, &err);
  json_t *arr = json_array();
  for (size_t i = 0; i < n; i++)
    json_array_append_new(arr, snapshot_json(&v[i]));
  moat_snapshot_infos_free(v, n);
  return api_reply_json(r, 200, json_pack("{s:o}", "snapshots", arr));
}

int api_h_snapshot_get(struct api_req *r, json_t *body) {
  moat_error *err = NULL;
  if (api_args_none(r) < 0)
    return -1;
  struct moat_snapshot_info s;
  memset(&s, 0, sizeof(s));
  if (moat_control_snapshot_get(api_control(r), r->org, r->route.sid, &s, &err) < 0)
    return api_reply_moat_error(r, &err);
  int ret = api_reply_json(r, 200, snapshot_json(&s));
  moat_snapshot_info_clear(&s);
  return ret;
}

int api_h_snapshot_delete(struct api_req *r, json_t *body) {
  moat_error *err = NULL;
  if (api_args_none(r) < 0)
    return -1;
  if (moat_control_snapshot_delete(api_control(r), r->org, r->route.sid, &err) < 0)
    return api_reply_moat_error(r, &err);
  return api_reply_empty(r, 204);
}

/* ---- fork, rollback ---- */

/* The optional field databases: "branch" (each child gets a branch of each database its parent was
 * given). *branch set; -1 with the reply sent for anything else. */
static int databases_field(struct api_req *r, json_t *body, bool *branch) {
  json_t *d = body ? json_object_get(body, "databases") : NULL;
  *branch = false;
  if (!d)
    return 0;
  if (!json_is_string(d) || strcmp(json_string_value(d), "branch") != 0) {
    api_reply_error(r, 400, "invalid_request", "field 'databases' must be \"branch\" when given");
    return -1;
  }
  *branch = true;
  return 0;
}

int api_h_fork(struct api_req *r, json_t *body) {
  static const char *const allowed[] = {"count", "memory", "databases", NULL};
  moat_error *err = NULL;
  if (api_args_none(r) < 0)
    return -1;
  if (body && only_fields(body, allowed, &err) < 0)
    return api_reply_moat_error(r, &err);
  json_t *cnt = body ? json_object_get(body, "count") : NULL;
  json_t *mem = body ? json_object_get(body, "memory") : NULL;
  json_int_t count = 1;
  if (cnt) {
    if (!json_is_integer(cnt) || json_integer_value(cnt) < 1 ||
        json_integer_value(cnt) > MOAT_EXPLORE_MAX_BRANCHES)
      return api_reply_error(r, 400, "invalid_request", "field 'count' must be an integer from 1 to %d",
                             MOAT_EXPLORE_MAX_BRANCHES);
    count = json_integer_value(cnt);
  }
  if (mem && !json_is_boolean(mem))
    return api_reply_error(r, 400, "invalid_request", "field 'memory' must be a boolean");
  if (mem && !json_is_true(mem))
    return api_reply_error(
        r, 400, "invalid_request",
        "field 'memory': only true is supported (a fork always carries memory and processes)");
  bool branch = false;
  if (databases_field(r, body, &branch) < 0)
    return -1;
  struct moat_sandbox_info *v = NULL;
  if (moat_control_fork(api_control(r), r->org, r->route.id, (unsigned)count, branch, &v, &err) < 0)
    return api_reply_moat_error(r, &err);
  json_t *arr = json_array();
  for (json_int_t i = 0; i < count; i++)
    json_array_append_new(arr, api_sandbox_json(&v[i]));
  moat_sandbox_infos_free(v, (size_t)count);
  return api_reply_json(r, 201, json_pack("{s:o}", "sandboxes", arr));
}

int api_h_rollback(struct api_req *r, json_t *body) {
  static const char *const allowed[] = {"snapshot_id", NULL};
  moat_error *err = NULL;
  if (api_args_none(r) < 0)
    return -1;
  if (!body || only_fields(body, allowed, &err) < 0)
    return err ? api_reply_moat_error(r, &err) : api_reply_error(r, 400, "invalid_request", "body required");
  json_t *sid = json_object_get(body, "snapshot_id");
  if (!json_is_string(sid) || json_string_length(sid) == 0 || json_string_length(sid) > 63)
    return api_reply_error(r, 400, "invalid_request", "field 'snapshot_id' must be a snapshot id string");
  if (moat_control_rollback(api_control(r), r->org, r->route.id, json_string_value(sid), &err) < 0)
    return api_reply_moat_error(r, &err);
  return reply_sandbox(r, 200, r->route.id);
}

/* ---- explore ---- */

/* {choose: {explore_id, sandbox_id}}: the keep-best decision. */
static int explore_choose(struct api_req *r, json_t *choose) {
  static const char *const allowed[] = {"explore_id", "sandbox_id", NULL};
  moat_error *err = NULL;
  if (!json_is_object(choose))
    return api_reply_error(r, 400, "invalid_request",
                           "field 'choose' must be an object {explore_id, sandbox_id}");
  if (only_fields(choose, allowed, &err) < 0)
    return api_reply_moat_error(r, &err);
  json_t *eid = json_object_get(choose, "explore_id"), *sid = json_object_get(choose, "sandbox_id");
  if (!json_is_string(eid) || json_string_length(eid) == 0 || json_string_length(eid) > 63)
    return api_reply_error(r, 400, "invalid_request",
                           "field 'choose.explore_id' must be an explore id string");
  if (!json_is_string(sid) || !api_valid_sandbox_id(json_string_value(sid)))
    return api_reply_error(r, 400, "invalid_request", "field 'choose.sandbox_id' must be a sandbox id");
  struct moat_sandbox_info info;
  memset(&info, 0, sizeof(info));
  if (moat_control_explore_keep(api_control(r), r->org, r->route.id, json_string_value(eid),
                                json_string_value(sid), &info, &err) < 0)
    return api_reply_moat_error(r, &err);
  int ret =
      api_reply_json(r, 200, json_pack("{s:s, s:o}", "winner", info.id, "sandbox", api_sandbox_json(&info)));
  moat_sandbox_info_clear(&info);
  return ret;
}

static json_t *bytes_json(const char *buf, size_t len) {
  size_t n;
  bool valid;
  char *s = api_utf8_sanitize(buf ? buf : "", buf ? len : 0, &n, &valid);
  json_t *j = json_stringn(s, n);
  free(s);
  return j ? j : json_string("");
}

int api_h_explore(struct api_req *r, json_t *body) {
  static const char *const allowed[] = {"branches", "keep", "databases", NULL};
  static const char *const branch_allowed[] = {"cmd", "timeout_ms", NULL};
  moat_error *err = NULL;
  if (api_args_none(r) < 0)
    return -1;
  if (!body)
    return api_reply_error(r, 400, "invalid_request", "body required: {branches, keep} or {choose}");
  json_t *choose = json_object_get(body, "choose");
  if (choose) {
    if (json_object_size(body) != 1)
      return api_reply_error(r, 400, "invalid_request", "field 'choose' goes alone");
    return explore_choose(r, choose);
  }
  if (only_fields(body, allowed, &err) < 0)
    return api_reply_moat_error(r, &err);
  json_t *br = json_object_get(body, "branches"), *keepj = json_object_get(body, "keep");
  if (!json_is_array(br) || json_array_size(br) < 1 || json_array_size(br) > MOAT_EXPLORE_MAX_BRANCHES)
    return api_reply_error(r, 400, "invalid_request", "field 'branches' must be an array of 1 to %d branches",
                           MOAT_EXPLORE_MAX_BRANCHES);
  enum moat_explore_keep keep = MOAT_KEEP_FIRST_SUCCESS;
  if (keepj) {
    const char *k = json_is_string(keepj) ? json_string_value(keepj) : "";
    if (strcmp(k, "first_success") == 0)
      keep = MOAT_KEEP_FIRST_SUCCESS;
    else if (strcmp(k, "best") == 0)
      keep = MOAT_KEEP_BEST;
    else
      return api_reply_error(r, 400, "invalid_request", "field 'keep' must be \"first_success\" or \"best\"");
  }
  size_t n = json_array_size(br);
  struct moat_explore_branch b[MOAT_EXPLORE_MAX_BRANCHES];
  memset(b, 0, sizeof(b));
  for (size_t i = 0; i < n; i++) {
    json_t *o = json_array_get(br, i);
    if (!json_is_object(o))
      return api_reply_error(r, 400, "invalid_request", "branches[%zu] must be an object {cmd, timeout_ms}",
                             i);
    if (only_fields(o, branch_allowed, &err) < 0) {
      moat_error_wrap(&err, "branches[%zu]", i);
      return api_reply_moat_error(r, &err);
    }
    json_t *cmd = json_object_get(o, "cmd"), *to = json_object_get(o, "timeout_ms");
    if (!json_is_string(cmd) || json_string_length(cmd) == 0 || json_string_length(cmd) > 128 * 1024 ||
        strlen(json_string_value(cmd)) != json_string_length(cmd))
      return api_reply_error(r, 400, "invalid_request",
                             "branches[%zu].cmd must be a non-empty shell command string without NUL", i);
    if (to &&
        (!json_is_integer(to) || json_integer_value(to) < 1 || json_integer_value(to) > API_MAX_TIMEOUT_MS))
      return api_reply_error(r, 400, "invalid_request",
                             "branches[%zu].timeout_ms must be an integer from 1 to %lld", i,
                             (long long)API_MAX_TIMEOUT_MS);
    b[i].cmd = json_string_value(cmd);
    b[i].timeout_ms = to ? json_integer_value(to) : 0;
  }
  bool branch = false;
  if (databases_field(r, body, &branch) < 0)
    return -1;
  struct moat_explore_result res;
  if (moat_control_explore(api_control(r), r->org, r->route.id, b, n, keep, branch, &res, &err) < 0)
    return api_reply_moat_error(r, &err);
  json_t *outs = json_array();
  for (size_t i = 0; i < res.n; i++) {
    struct moat_explore_outcome *o = &res.outcomes[i];
    json_t *j = json_object();
    json_object_set_new(j, "sandbox_id", json_string(o->sandbox_id));
    json_object_set_new(j, "exit_code", o->error ? json_null() : json_integer(o->exit_code));
    json_object_set_new(j, "timed_out", json_boolean(o->timed_out));
    json_object_set_new(j, "stdout_tail", bytes_json(o->stdout_tail, o->stdout_len));
    json_object_set_new(j, "stderr_tail", bytes_json(o->stderr_tail, o->stderr_len));
    json_object_set_new(j, "files_changed", o->files_changed ? json_incref(o->files_changed) : json_array());
    json_object_set_new(j, "duration_ms", json_integer(o->duration_ms));
    json_object_set_new(j, "alive", json_boolean(o->alive));
    json_object_set_new(j, "error", o->error ? api_str_json(o->error) : json_null());
    json_array_append_new(outs, j);
  }
  json_t *reply = json_object();
  json_object_set_new(reply, "keep", json_string(keep == MOAT_KEEP_BEST ? "best" : "first_success"));
  json_object_set_new(reply, "winner", res.winner[0] ? json_string(res.winner) : json_null());
  json_object_set_new(reply, "explore_id", res.explore_id[0] ? json_string(res.explore_id) : json_null());
  json_object_set_new(reply, "expires_at", api_time_json(res.expires_at_ms, true));
  json_object_set_new(reply, "outcomes", outs);
  moat_explore_result_clear(&res);
  return api_reply_json(r, 200, reply);
}

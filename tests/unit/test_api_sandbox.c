/* test_api_sandbox.c -- sandbox JSON per CONTRACT.md and the list filters (state, metadata.KEY) */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "api/v1/v1.h"
#include "tap.h"

static struct api_args args2(const char *k1, const char *v1, const char *k2, const char *v2) {
  struct api_args a = {0};
  if (k1) {
    a.v[a.n].key = (char *)k1;
    a.v[a.n++].value = (char *)v1;
  }
  if (k2) {
    a.v[a.n].key = (char *)k2;
    a.v[a.n++].value = (char *)v2;
  }
  return a;
}

static void test_filters(void) {
  moat_error *err = NULL;
  bool has;
  enum moat_sandbox_state st;
  json_t *meta = NULL;
  struct api_args a = args2(NULL, NULL, NULL, NULL);
  OK(api_args_list_filter(&a, &has, &st, &meta, &err) == 0 && !has && !meta, "no filters");
  a = args2("state", "running", "metadata.team", "a b");
  OK(api_args_list_filter(&a, &has, &st, &meta, &err) == 0 && has && st == MOAT_SB_RUNNING && meta &&
         strcmp(json_string_value(json_object_get(meta, "team")), "a b") == 0,
     "state=running and metadata.team");
  json_decref(meta);
  meta = NULL;
  a = args2("state", "killed", NULL, NULL);
  OK(api_args_list_filter(&a, &has, &st, &meta, &err) == 0 && st == MOAT_SB_KILLED, "state=killed");
  const char *bad[] = {"", "RUNNING", "zombie", "run"};
  for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
    a = args2("state", bad[i], NULL, NULL);
    OK(api_args_list_filter(&a, &has, &st, &meta, &err) < 0 && err->status == EINVAL && !meta,
       "state '%s' rejected", bad[i]);
    moat_error_free(&err);
  }
  a = args2("page", "5", NULL, NULL);
  OK(api_args_list_filter(&a, &has, &st, &meta, &err) < 0 && strstr(err->msg, "'page'"),
     "unknown parameter named");
  moat_error_free(&err);
  a = args2("limit", "5", "cursor", "c1.sb-x");
  OK(api_args_list_filter(&a, &has, &st, &meta, &err) == 0 && !has && !meta,
     "limit and cursor pass the filter (the handler checks them)");
  moat_error_free(&err);
  a = args2("metadata.k", "\xff", NULL, NULL);
  OK(api_args_list_filter(&a, &has, &st, &meta, &err) < 0 && !meta, "non-UTF-8 metadata filter rejected");
  moat_error_free(&err);
}

static void test_sandbox_json(void) {
  struct moat_sandbox_info s;
  memset(&s, 0, sizeof(s));
  strcpy(s.id, "sb-0123456789abcdefg");
  s.template_name = "base";
  s.state = MOAT_SB_RUNNING;
  s.created_at_ms = 1795943796123LL;
  s.expires_at_ms = 1795947396123LL;
  s.ttl_seconds = 3600;
  s.metadata = json_pack("{s:s}", "team", "a");
  s.limits = (struct moat_limits){.cpu = 2.0, .memory_mb = 2048, .pids = 4096, .disk_mb = 10240};
  s.ready_us = 250;
  json_t *j = api_sandbox_json(&s);
  static const char *const keys[] = {
      "id",        "template",  "state",       "created_at",    "expires_at", "ttl_seconds", "persistent",
      "metadata",  "cpu",       "memory_mb",   "pids",          "disk_mb",    "ready_us",    "killed_reason",
      "killed_at", "paused_at", "forked_from", "from_snapshot", "idle",       "volumes"};
  bool all = true;
  for (size_t i = 0; i < ARRAY_SIZE(keys); i++)
    if (!json_object_get(j, keys[i])) {
      printf("# missing %s\n", keys[i]);
      all = false;
    }
  OK(all && json_object_size(j) == ARRAY_SIZE(keys), "sandbox JSON has exactly the contract's fields");
  OK(strcmp(json_string_value(json_object_get(j, "state")), "running") == 0 &&
         strcmp(json_string_value(json_object_get(j, "created_at")), "2026-11-29T09:16:36.123Z") == 0 &&
         strcmp(json_string_value(json_object_get(j, "expires_at")), "2026-11-29T10:16:36.123Z") == 0 &&
         json_is_null(json_object_get(j, "killed_reason")) && json_is_null(json_object_get(j, "killed_at")) &&
         json_real_value(json_object_get(j, "cpu")) == 2.0 &&
         json_integer_value(json_object_get(j, "memory_mb")) == 2048,
     "running sandbox values");
  json_decref(j);
  s.persistent = true;
  s.state = MOAT_SB_KILLED;
  s.killed_reason = "ttl";
  s.killed_at_ms = 1795943797000LL;
  j = api_sandbox_json(&s);
  OK(json_is_null(json_object_get(j, "expires_at")) && json_is_true(json_object_get(j, "persistent")) &&
         strcmp(json_string_value(json_object_get(j, "state")), "killed") == 0 &&
         strcmp(json_string_value(json_object_get(j, "killed_reason")), "ttl") == 0 &&
         strcmp(json_string_value(json_object_get(j, "killed_at")), "2026-11-29T09:16:37.000Z") == 0,
     "persistent killed sandbox: expires_at null, killed_reason and killed_at set");
  json_decref(j);
  json_decref(s.metadata);
}

int main(void) {
  test_filters();
  test_sandbox_json();
  return tap_done();
}

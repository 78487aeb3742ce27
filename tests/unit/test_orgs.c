/* test_orgs.c -- orgs in the store (create, revive after delete, list and paging, quotas, a delete's
 * two marks revoking the org's keys) and the pure parts of quotas: parsing and bounds, org ids, the
 * quota detail of an error message */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api/http/http.h"
#include "common/util.h"
#include "control/control.h"
#include "store/store.h"

#include "tap.h"

static char dir[] = "/tmp/moat-test-orgs-XXXXXX";

static int parse(const char *text, struct moat_quotas *q) {
  json_t *j = json_loads(text, JSON_DECODE_ANY, NULL);
  moat_error *err = NULL;
  int rc = moat_quotas_parse(j, q, &err);
  if (rc < 0 && err->status != EINVAL)
    rc = -2;
  moat_error_free(&err);
  json_decref(j);
  return rc;
}

static void test_quotas_parse(void) {
  struct moat_quotas q;
  CHECK(parse("{}", &q) == 0 && q.v[MOAT_Q_SANDBOXES] == -1 && q.v[MOAT_Q_DATABASE_BYTES] == -1,
        "{}: every quota unlimited");
  CHECK(parse("{\"max_sandboxes\": 50, \"max_ttl_seconds\": null, \"max_volume_bytes\": 9007199254740992}",
              &q) == 0 &&
            q.v[MOAT_Q_SANDBOXES] == 50 && q.v[MOAT_Q_TTL_SECONDS] == -1 &&
            q.v[MOAT_Q_VOLUME_BYTES] == 9007199254740992LL,
        "integers, null and 2^53 are taken");
  CHECK(parse("{\"max_sandboxes\": 0}", &q) == 0 && q.v[MOAT_Q_SANDBOXES] == 0, "0 is a limit (nothing)");
  const char *bad[] = {"{\"max_sandboxes\": -1}",
                       "{\"max_sandboxes\": 1.5}",
                       "{\"max_sandboxes\": \"5\"}",
                       "{\"max_sandboxes\": true}",
                       "{\"max_sandboxes\": 9007199254740993}",
                       "{\"max_sandboxes\": [1]}",
                       "{\"nope\": 1}",
                       "[]",
                       "5",
                       "null"};
  for (size_t i = 0; i < ARRAY_SIZE(bad); i++)
    CHECK(parse(bad[i], &q) == -1, "%s: EINVAL", bad[i]);
  for (int i = 0; i < MOAT_Q_N; i++)
    q.v[i] = i % 2 ? -1 : i;
  json_t *j = moat_quotas_json(&q);
  struct moat_quotas back;
  moat_error *err = NULL;
  CHECK(json_object_size(j) == MOAT_Q_N && moat_quotas_parse(j, &back, &err) == 0 &&
            memcmp(&q, &back, sizeof(q)) == 0,
        "moat_quotas_json names every quota and parses back to the same");
  json_decref(j);
  moat_error_free(&err);
}

static void test_ids_and_detail(void) {
  CHECK(moat_org_id_valid("default") && moat_org_id_valid("acme-1.x_y") && moat_org_id_valid("0"),
        "org ids: lowercase, digits, _ . - after the first");
  CHECK(!moat_org_id_valid("") && !moat_org_id_valid("_platform") && !moat_org_id_valid("Acme") &&
            !moat_org_id_valid("a/b") && !moat_org_id_valid("-a"),
        "org ids: the reserved org, upper case, a slash, a leading dash are not");
  char big[70];
  memset(big, 'a', 64);
  big[64] = '\0';
  CHECK(!moat_org_id_valid(big) && (big[63] = '\0', moat_org_id_valid(big)), "org ids: 63 bytes at most");
  char q[32];
  long long limit, use;
  CHECK(api_quota_detail("create sandbox: over quota max_sandboxes: limit 50, use 50", q, &limit, &use) &&
            strcmp(q, "max_sandboxes") == 0 && limit == 50 && use == 50,
        "the quota detail survives a wrapped message");
  CHECK(!api_quota_detail("no quota here", q, &limit, &use), "no detail in another message");
}

static void test_store_orgs(void) {
  char *db = xasprintf("%s/moat.db", dir);
  struct moat_store *s = NULL;
  moat_error *err = NULL;
  CHECK(moat_store_open(&s, db, &err) == 0, "open: %s", moat_error_msg(err));
  free(db);
  if (!s)
    return;
  CHECK(moat_store_org_create(s, "acme", 1000, &err) == 0, "create acme");
  CHECK(moat_store_org_create(s, "acme", 2000, &err) < 0 && err->status == EEXIST, "create it again: EEXIST");
  moat_error_free(&err);
  CHECK(moat_store_key_add(s, "bolt", "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff",
                           &err) == 0,
        "a key's org is made implicitly");
  struct moat_store_org o = {0};
  CHECK(moat_store_org_get(s, "bolt", &o, &err) == 0 && strcmp(o.quotas_json, "{}") == 0 &&
            o.deleted_at_ms == 0,
        "the implicit org has no quotas");
  moat_store_org_clear(&o);
  CHECK(moat_store_org_set_quotas(s, "acme", "{\"max_sandboxes\":3}", &err) == 0, "set quotas");
  CHECK(moat_store_org_set_quotas(s, "nope", "{}", &err) < 0 && err->status == ENOENT,
        "quotas of no org: ENOENT");
  moat_error_free(&err);
  struct moat_store_org *v = NULL;
  size_t n = 0;
  CHECK(moat_store_org_list(s, NULL, 1, false, &v, &n, &err) == 0 && n == 1 && strcmp(v[0].id, "acme") == 0,
        "list limit 1: acme");
  moat_store_orgs_free(v, n);
  CHECK(moat_store_org_list(s, "acme", 10, false, &v, &n, &err) == 0 && n == 1 &&
            strcmp(v[0].id, "bolt") == 0,
        "list after acme: bolt");
  moat_store_orgs_free(v, n);
  CHECK(moat_store_org_begin_delete(s, "bolt", 3000, &err) == 0, "begin bolt's delete");
  CHECK(moat_store_key_exists(s, "key-none", &err) == 0, "an unknown key id does not exist");
  char *org = NULL;
  CHECK(moat_store_key_lookup(s, "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff", &org,
                              &err) < 0 &&
            err->status == ENOENT,
        "bolt's key went with the delete's first mark");
  moat_error_free(&err);
  free(org);
  CHECK(moat_store_org_list(s, NULL, 10, true, &v, &n, &err) == 0 && n == 1 && strcmp(v[0].id, "bolt") == 0 &&
            v[0].deleting_at_ms == 3000,
        "bolt is listed as a delete to finish");
  moat_store_orgs_free(v, n);
  CHECK(moat_store_org_end_delete(s, "bolt", 4000, &err) == 0, "end bolt's delete");
  CHECK(moat_store_org_list(s, NULL, 10, false, &v, &n, &err) == 0 && n == 1 && strcmp(v[0].id, "acme") == 0,
        "a deleted org is not listed");
  moat_store_orgs_free(v, n);
  CHECK(moat_store_org_get(s, "bolt", &o, &err) == 0 && o.deleted_at_ms == 4000 && o.deleting_at_ms == 0,
        "its row stays, marked deleted");
  moat_store_org_clear(&o);
  CHECK(moat_store_org_set_quotas(s, "bolt", "{}", &err) < 0, "a deleted org takes no quotas");
  moat_error_free(&err);
  CHECK(moat_store_key_add(s, "bolt", "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100",
                           &err) == 0 &&
            moat_store_org_get(s, "bolt", &o, &err) == 0 && o.deleted_at_ms == 0,
        "a new key of a deleted org makes it anew");
  moat_store_org_clear(&o);
  CHECK(moat_store_org_begin_delete(s, "bolt", 4500, &err) == 0 &&
            moat_store_org_end_delete(s, "bolt", 4600, &err) == 0,
        "delete bolt again");
  CHECK(moat_store_org_create(s, "gone", 100, &err) == 0 &&
            moat_store_org_begin_delete(s, "gone", 200, &err) == 0,
        "begin the delete of org gone");
  CHECK(moat_store_key_add(s, "gone", "aaeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100",
                           &err) < 0 &&
            err->status == EBUSY,
        "no key is added to an org being deleted: EBUSY");
  moat_error_free(&err);
  CHECK(moat_store_org_create(s, "bolt", 5000, &err) == 0 && moat_store_org_get(s, "bolt", &o, &err) == 0 &&
            o.deleted_at_ms == 0 && o.created_at_ms == 5000 && strcmp(o.quotas_json, "{}") == 0,
        "a deleted org's id is made anew");
  moat_store_org_clear(&o);
  moat_error_free(&err);
  moat_store_close(s);
}

int main(void) {
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 1;
  }
  test_quotas_parse();
  test_ids_and_detail();
  test_store_orgs();
  rm_rf(dir, NULL);
  return tap_done();
}

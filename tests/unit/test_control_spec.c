/* test_control_spec.c -- control's spec resolution (defaults, bounds, host capacity), metadata and env
 * checks, env merging, state names and database URLs */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/util.h"
#include "control/control.h"
#include "control/spec.h"

#include "tap.h"

static const struct moat_spec_bounds big = {.host_memory_mb = 24000, .disk_fs_mb = 100000};

/* Resolves spec; returns the error status (0 on success) and whether the message names field. */
static int resolve(struct moat_sandbox_spec *spec, const struct moat_spec_bounds *b, const char *field,
                   struct moat_limits *l, int64_t *ttl) {
  moat_error *err = NULL;
  struct moat_limits tmp;
  int64_t t;
  int rc = moat_spec_resolve(spec, b, l ? l : &tmp, ttl ? ttl : &t, &err);
  int st = 0;
  if (rc < 0) {
    st = err ? err->status : -1;
    if (field && !strstr(moat_error_msg(err), field))
      st = -2;
    printf("# %s\n", moat_error_msg(err));
  }
  moat_error_free(&err);
  return st;
}

static void test_defaults(void) {
  struct moat_sandbox_spec spec = {0};
  struct moat_limits l;
  int64_t ttl;
  CHECK(resolve(&spec, &big, NULL, &l, &ttl) == 0 && ttl == MOAT_DEFAULT_TTL_S && l.cpu == MOAT_DEFAULT_CPU &&
            l.memory_mb == MOAT_DEFAULT_MEMORY_MB && l.pids == MOAT_DEFAULT_PIDS &&
            l.disk_mb == MOAT_DEFAULT_DISK_MB,
        "empty spec gets the defaults (ttl %lld, cpu %g, mem %llu, pids %llu, disk %llu)", (long long)ttl,
        l.cpu, (unsigned long long)l.memory_mb, (unsigned long long)l.pids, (unsigned long long)l.disk_mb);
  struct moat_spec_bounds small = {.host_memory_mb = 1000, .disk_fs_mb = 5000};
  CHECK(resolve(&spec, &small, NULL, &l, &ttl) == 0 && l.memory_mb == 1000 && l.disk_mb == 5000,
        "defaults shrink to a small host (mem %llu, disk %llu)", (unsigned long long)l.memory_mb,
        (unsigned long long)l.disk_mb);
  spec = (struct moat_sandbox_spec){.ttl_seconds = 5,
                                    .limits = {.cpu = 0.5, .memory_mb = 64, .pids = 10, .disk_mb = 100}};
  CHECK(resolve(&spec, &big, NULL, &l, &ttl) == 0 && ttl == 5 && l.cpu == 0.5 && l.memory_mb == 64 &&
            l.pids == 10 && l.disk_mb == 100,
        "explicit values are kept");
}

static void test_bounds(void) {
  struct {
    struct moat_sandbox_spec spec;
    const char *field;
  } bad[] = {
      {{.ttl_seconds = -1}, "ttl_seconds"},
      {{.ttl_seconds = MOAT_MAX_TTL_S + 1}, "ttl_seconds"},
      {{.limits = {.cpu = 0.01}}, "cpu"},
      {{.limits = {.cpu = 65}}, "cpu"},
      {{.limits = {.cpu = -1}}, "cpu"},
      {{.limits = {.cpu = NAN}}, "cpu"},
      {{.limits = {.memory_mb = 15}}, "memory_mb"},
      {{.limits = {.memory_mb = 30000}}, "memory_mb"}, /* above the host's 24000 */
      {{.limits = {.memory_mb = MOAT_MAX_MEMORY_MB + 1}}, "memory_mb"},
      {{.limits = {.pids = 7}}, "pids"},
      {{.limits = {.pids = MOAT_MAX_PIDS + 1}}, "pids"},
      {{.limits = {.disk_mb = 15}}, "disk_mb"},
      {{.limits = {.disk_mb = 200000}}, "disk_mb"}, /* above the filesystem's 100000 */
  };
  for (size_t i = 0; i < ARRAY_SIZE(bad); i++)
    CHECK(resolve(&bad[i].spec, &big, bad[i].field, NULL, NULL) == EINVAL,
          "bad %s (case %zu) is EINVAL naming it", bad[i].field, i);
  struct moat_sandbox_spec edge = {
      .ttl_seconds = MOAT_MAX_TTL_S,
      .limits = {.cpu = MOAT_MIN_CPU, .memory_mb = 24000, .pids = MOAT_MIN_PIDS, .disk_mb = 100000}};
  CHECK(resolve(&edge, &big, NULL, NULL, NULL) == 0, "values exactly at the bounds are accepted");
  struct moat_spec_bounds small = big;
  small.host_pids = moat_spec_host_pids(32768, 192726);
  struct moat_sandbox_spec many = {.limits = {.pids = 8193}};
  CHECK(small.host_pids == 8192 && resolve(&many, &small, "pids", NULL, NULL) == EINVAL,
        "pids above a quarter of the host's pid space (%llu) is EINVAL", (unsigned long long)small.host_pids);
  many.limits.pids = 8192;
  CHECK(resolve(&many, &small, NULL, NULL, NULL) == 0, "pids at the host's limit is accepted");
  struct moat_spec_bounds tiny = big;
  tiny.host_pids = moat_spec_host_pids(4096, 192726);
  struct moat_sandbox_spec dflt = {0};
  struct moat_limits l;
  CHECK(resolve(&dflt, &tiny, NULL, &l, NULL) == 0 && l.pids == 1024,
        "the default pids fits a small host (%llu)", (unsigned long long)l.pids);
}

static void test_metadata_env(void) {
  json_t *m = json_pack("{s:s, s:s}", "a", "1", "b", "");
  struct moat_sandbox_spec spec = {.metadata = m};
  CHECK(resolve(&spec, &big, NULL, NULL, NULL) == 0, "string metadata accepted");
  json_object_set_new(m, "n", json_integer(3));
  CHECK(resolve(&spec, &big, "metadata.n", NULL, NULL) == EINVAL, "non-string metadata value is EINVAL");
  json_decref(m);

  m = json_object();
  for (int i = 0; i < 65; i++) {
    char k[16];
    snprintf(k, sizeof(k), "k%d", i);
    json_object_set_new(m, k, json_string("v"));
  }
  spec.metadata = m;
  CHECK(resolve(&spec, &big, "64", NULL, NULL) == EINVAL, "65 metadata keys is EINVAL");
  json_decref(m);

  char longkey[130];
  memset(longkey, 'k', 129);
  longkey[129] = 0;
  m = json_object();
  json_object_set_new(m, longkey, json_string("v"));
  spec.metadata = m;
  CHECK(resolve(&spec, &big, "128", NULL, NULL) == EINVAL, "a 129-byte key is EINVAL");
  json_decref(m);

  char longval[1026];
  memset(longval, 'v', 1025);
  longval[1025] = 0;
  m = json_object();
  json_object_set_new(m, "k", json_string(longval));
  spec.metadata = m;
  CHECK(resolve(&spec, &big, "1024", NULL, NULL) == EINVAL, "a 1025-byte value is EINVAL");
  json_decref(m);
  spec.metadata = json_array();
  CHECK(resolve(&spec, &big, "metadata", NULL, NULL) == EINVAL, "metadata that is not an object is EINVAL");
  json_decref(spec.metadata);
  spec.metadata = NULL;

  const char *good[] = {"A", "_x", "PATH", "a_1"};
  const char *badnames[] = {"1A", "A-B", "A=B", "", "A B", "é"};
  for (size_t i = 0; i < ARRAY_SIZE(good); i++) {
    json_t *e = json_object();
    json_object_set_new(e, good[i], json_string("v"));
    spec.env = e;
    CHECK(resolve(&spec, &big, NULL, NULL, NULL) == 0, "env name '%s' accepted", good[i]);
    json_decref(e);
  }
  for (size_t i = 0; i < ARRAY_SIZE(badnames); i++) {
    json_t *e = json_object();
    json_object_set_new(e, badnames[i], json_string("v"));
    spec.env = e;
    CHECK(resolve(&spec, &big, "env", NULL, NULL) == EINVAL, "env name '%s' rejected", badnames[i]);
    json_decref(e);
  }
  json_t *e = json_object();
  json_object_set_new(e, "A", json_stringn("x\0y", 3));
  spec.env = e;
  CHECK(resolve(&spec, &big, "NUL", NULL, NULL) == EINVAL, "env value with a NUL byte rejected");
  json_decref(e);
}

static char *joined(char **v) {
  char *s = xstrdup("");
  for (size_t i = 0; v[i]; i++) {
    char *n = xasprintf("%s%s%s", s, i ? " " : "", v[i]);
    free(s);
    s = n;
  }
  return s;
}

static void test_env_merge(void) {
  json_t *base = json_pack("{s:s, s:s, s:s}", "B", "2", "A", "1", "AB", "x");
  char *over[] = {"A=9", "C=3", NULL};
  char **v = moat_env_merge(base, over);
  char *s = joined(v);
  CHECK(strcmp(s, "AB=x B=2 A=9 C=3") == 0,
        "request env overrides the sandbox's; 'A' does not touch 'AB': %s", s);
  free(s);
  strv_free(v);
  v = moat_env_merge(NULL, over);
  s = joined(v);
  CHECK(strcmp(s, "A=9 C=3") == 0, "no sandbox env: %s", s);
  free(s);
  strv_free(v);
  v = moat_env_merge(base, NULL);
  s = joined(v);
  CHECK(strcmp(s, "A=1 AB=x B=2") == 0, "no request env: sandbox env in key order: %s", s);
  free(s);
  strv_free(v);
  v = moat_env_merge(NULL, NULL);
  CHECK(v && v[0] == NULL, "both empty gives an empty vector");
  strv_free(v);
  json_decref(base);
}

static void test_states(void) {
  const char *names[] = {"creating", "running", "paused", "hibernated", "killed"};
  int ok = 0;
  for (size_t i = 0; i < ARRAY_SIZE(names); i++) {
    enum moat_sandbox_state st;
    if (moat_sandbox_state_parse(names[i], &st) == 0 && strcmp(moat_sandbox_state_name(st), names[i]) == 0)
      ok++;
  }
  enum moat_sandbox_state st;
  CHECK(ok == 5, "every state name parses and prints back");
  CHECK(moat_sandbox_state_parse("dead", &st) < 0 && moat_sandbox_state_parse(NULL, &st) < 0,
        "unknown and NULL names are rejected");
}

static void test_database_urls(void) {
  struct {
    const char *host;
    unsigned port;
    const char *want;
  } cases[] = {
      {"127.0.0.1", 7432, "postgresql://db_x:pw@127.0.0.1:7432/db_x?sslmode=disable"},
      {"10.200.0.1", 5432, "postgresql://db_x:pw@10.200.0.1:5432/db_x?sslmode=disable"},
      {"::1", 7432, "postgresql://db_x:pw@[::1]:7432/db_x?sslmode=disable"},
      {"localhost", 1, "postgresql://db_x:pw@localhost:1/db_x?sslmode=disable"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    char *u = moat_database_url_format(cases[i].host, cases[i].port, "db_x", "pw", "db_x");
    CHECK(strcmp(u, cases[i].want) == 0, "database URL on %s:%u: %s", cases[i].host, cases[i].port, u);
    free(u);
  }
}

/* API key roles, names and ids (keys.c). */
static void test_key_helpers(void) {
  enum moat_key_role r = MOAT_ROLE_ADMIN;
  CHECK(moat_key_role_parse("readonly", &r) == 0 && r == MOAT_ROLE_READONLY, "readonly parses");
  CHECK(moat_key_role_parse("member", &r) == 0 && r == MOAT_ROLE_MEMBER, "member parses");
  CHECK(moat_key_role_parse("admin", &r) == 0 && r == MOAT_ROLE_ADMIN, "admin parses");
  r = MOAT_ROLE_MEMBER;
  CHECK(moat_key_role_parse("root", &r) < 0 && r == MOAT_ROLE_MEMBER, "root does not parse and leaves *role");
  CHECK(moat_key_role_parse("Admin", &r) < 0 && moat_key_role_parse("", &r) < 0 &&
            moat_key_role_parse(NULL, &r) < 0,
        "roles are lowercase words");
  for (int i = MOAT_ROLE_ADMIN; i <= MOAT_ROLE_READONLY; i++)
    CHECK(moat_key_role_parse(moat_key_role_name((enum moat_key_role)i), &r) == 0 && (int)r == i,
          "role %d round-trips through its name", i);
  char long_name[MOAT_KEY_NAME_MAX + 2];
  memset(long_name, 'n', sizeof(long_name) - 1);
  long_name[MOAT_KEY_NAME_MAX + 1] = '\0';
  CHECK(!moat_key_name_valid(long_name), "a name of %d bytes is refused", MOAT_KEY_NAME_MAX + 1);
  long_name[MOAT_KEY_NAME_MAX] = '\0';
  CHECK(moat_key_name_valid(long_name), "a name of %d bytes is fine", MOAT_KEY_NAME_MAX);
  CHECK(moat_key_name_valid("ci reader (prod)") && !moat_key_name_valid("") && !moat_key_name_valid("a\tb") &&
            !moat_key_name_valid("caf\xc3\xa9"),
        "names are printable ASCII");
  CHECK(moat_key_id_valid("key-0123456789abcdef") && !moat_key_id_valid("key-0123456789abcde") &&
            !moat_key_id_valid("key-0123456789ABCDEF") && !moat_key_id_valid("sb-0123456789abcdefg") &&
            !moat_key_id_valid("key-0123456789abcdef0"),
        "key ids are key- and 16 lowercase base-36 characters");
}

int main(void) {
  test_key_helpers();
  test_database_urls();
  test_defaults();
  test_bounds();
  test_metadata_env();
  test_env_merge();
  test_states();
  return tap_done();
}

/* test_control_live.c -- control against the real linux host: create, exec with env, org scoping,
 * TTL refresh and expiry, dead init, kill, adopt after a restart, exec racing kill.
 * Needs root and a built `base` template in MOAT_TEST_TEMPLATE_DIR (default
 * /var/tmp/moat-test-templates); skips (77) otherwise. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "control/control.h"
#include "store/store.h"

#include "tap.h"

static char data_dir[] = "/tmp/moat-test-control-XXXXXX";
static struct moat_control_config cfg;

static void note(moat_error **err) {
  if (err && *err) {
    printf("# %s\n", moat_error_msg(*err));
    moat_error_free(err);
  }
}

static char *repo_path(const char *rel) {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0)
    return NULL;
  buf[n] = 0;
  /* REPO/build/tests/test_x or REPO/build/san/tests/test_x */
  for (char *d = buf; (d = strrchr(buf, '/')) != NULL;) {
    *d = 0;
    char *p = xasprintf("%s/templates/base", buf);
    struct stat st;
    bool ok = stat(p, &st) == 0;
    free(p);
    if (ok)
      return xasprintf("%s/%s", buf, rel);
  }
  return NULL;
}

/* Runs cmd with /bin/sh -c; returns exit code, or -100 on error; *out gets stdout (caller frees). */
static int run(struct moat_control *c, const char *org, const char *id, const char *cmd, char **env,
               char **out) {
  char *argv[] = {"/bin/sh", "-c", (char *)cmd, NULL};
  struct moat_exec_req req = {.argv = argv, .env = env, .timeout_ms = 20000};
  struct moat_exec_result res;
  memset(&res, 0, sizeof(res));
  moat_error *err = NULL;
  if (moat_control_exec(c, org, id, &req, &res, &err) < 0) {
    if (out)
      *out = xasprintf("error %d: %s", err ? err->status : 0, moat_error_msg(err));
    moat_error_free(&err);
    return -100;
  }
  if (out)
    *out = xstrndup(res.out ? res.out : "", res.out_len);
  int code = res.exit_code;
  moat_exec_result_free(&res);
  return code;
}

static int create(struct moat_control *c, const char *org, int64_t ttl, bool persistent, json_t *meta,
                  json_t *env, struct moat_sandbox_info *info) {
  struct moat_sandbox_spec spec = {.template_name = "base",
                                   .ttl_seconds = ttl,
                                   .persistent = persistent,
                                   .metadata = meta,
                                   .env = env,
                                   .limits = {.memory_mb = 256, .disk_mb = 256, .pids = 256, .cpu = 1}};
  moat_error *err = NULL;
  int rc = moat_control_create(c, org, &spec, info, &err);
  note(&err);
  return rc;
}

static int err_status_of_get(struct moat_control *c, const char *org, const char *id) {
  struct moat_sandbox_info i;
  moat_error *err = NULL;
  int rc = moat_control_get(c, org, id, &i, &err);
  int st = rc < 0 ? (err ? err->status : -1) : 0;
  if (rc == 0)
    moat_sandbox_info_clear(&i);
  moat_error_free(&err);
  return st;
}

static char *state_of(struct moat_control *c, const char *id, char **reason) {
  struct moat_sandbox_info i;
  moat_error *err = NULL;
  if (moat_control_get(c, "default", id, &i, &err) < 0) {
    moat_error_free(&err);
    return xstrdup("?");
  }
  char *s = xstrdup(moat_sandbox_state_name(i.state));
  if (reason)
    *reason = i.killed_reason ? xstrdup(i.killed_reason) : NULL;
  moat_sandbox_info_clear(&i);
  return s;
}

/* Waits up to ms for id to be killed; returns the reason (caller frees) or NULL. */
static char *wait_killed(struct moat_control *c, const char *id, int ms) {
  for (int t = 0; t < ms; t += 100) {
    char *reason = NULL;
    char *s = state_of(c, id, &reason);
    bool killed = strcmp(s, "killed") == 0;
    free(s);
    if (killed)
      return reason ? reason : xstrdup("");
    free(reason);
    usleep(100 * 1000);
  }
  return NULL;
}

static pid_t init_pid(const char *id) {
  char *db = xasprintf("%s/moat.db", data_dir);
  struct moat_store *s;
  moat_error *err = NULL;
  pid_t pid = 0;
  if (moat_store_open(&s, db, &err) == 0) {
    struct moat_store_sandbox r = {0};
    if (moat_store_sandbox_get(s, NULL, id, &r, &err) == 0)
      pid = (pid_t)r.pid;
    moat_store_sandbox_clear(&r);
    moat_store_close(s);
  }
  moat_error_free(&err);
  free(db);
  return pid;
}

struct race {
  struct moat_control *c;
  const char *id;
  int rc;
};

static void *race_exec(void *p) {
  struct race *r = p;
  r->rc = run(r->c, "default", r->id, "sleep 5; echo done", NULL, NULL);
  return NULL;
}

int main(void) {
  const char *tdir =
      getenv("MOAT_TEST_TEMPLATE_DIR") ? getenv("MOAT_TEST_TEMPLATE_DIR") : "/var/tmp/moat-test-templates";
  char *ready = xasprintf("%s/base/ready", tdir);
  if (geteuid() != 0 || access(ready, F_OK) != 0) {
    printf("1..0 # SKIP needs root and a built base template in %s\n0 passed, 0 failed\n", tdir);
    free(ready);
    return 77;
  }
  free(ready);
  moat_log_set_level(getenv("MOAT_TEST_DEBUG") ? MOAT_LOG_DEBUG : MOAT_LOG_WARN);
  if (!mkdtemp(data_dir))
    return 1;
  cfg = (struct moat_control_config){
      .data_dir = data_dir,
      .template_dir = tdir,
      .recipes_dir = repo_path("templates"),
      .guest_path = repo_path("build/moat-guest"),
      .pool_size = 1,
      .reap_interval_ms = 200,
  };
  moat_error *err = NULL;
  struct moat_control *c = NULL;
  CHECK(moat_control_open(&c, &cfg, &err) == 0, "open control in %s", data_dir);
  note(&err);
  if (!c)
    goto done;

  /* API keys. */
  char *keyfile = xasprintf("%s/api-key", data_dir), *key = NULL;
  struct stat st;
  CHECK(stat(keyfile, &st) == 0 && (st.st_mode & 0777) == 0600, "api-key written with mode 0600");
  read_file(keyfile, &key, NULL, &err);
  if (key)
    key[strcspn(key, "\n")] = 0;
  char *org = NULL;
  CHECK(key && strncmp(key, "moat_", 5) == 0 && strlen(key) == 69 &&
            moat_control_auth(c, key, &org, &err) == 0 && strcmp(org, "default") == 0,
        "the key file's key authenticates as org default");
  free(org);
  org = NULL;
  CHECK(moat_control_auth(c, "moat_wrong", &org, &err) < 0 && err && err->status == EACCES,
        "a wrong key is EACCES");
  moat_error_free(&err);
  char *other_key = NULL;
  CHECK(moat_control_key_create(data_dir, "other", NULL, NULL, &other_key, &err) == 0 &&
            moat_control_auth(c, other_key, &org, &err) == 0 && strcmp(org, "other") == 0,
        "key create for org other works while control has the store open");
  note(&err);
  free(org);
  free(other_key);
  free(keyfile);
  free(key);

  /* Create with metadata and env; exec sees env merged with the request's. */
  json_t *meta = json_pack("{s:s}", "owner", "test");
  json_t *env = json_pack("{s:s, s:s}", "FOO", "sandbox", "BAR", "sandbox");
  struct moat_sandbox_info a;
  int64_t t0 = now_unix_ms();
  memset(&a, 0, sizeof(a));
  int arc = create(c, "default", 2, false, meta, env, &a);
  json_decref(meta);
  json_decref(env);
  CHECK(arc == 0, "create sandbox A (ttl 2 s)");
  if (arc < 0)
    goto done; /* the rest needs a working host */
  CHECK(a.state == MOAT_SB_RUNNING && a.ready_us > 0 && a.expires_at_ms >= t0 + 2000 &&
            a.expires_at_ms <= now_unix_ms() + 2000 && a.limits.memory_mb == 256 &&
            strcmp(json_string_value(json_object_get(a.metadata, "owner")), "test") == 0,
        "A is running, ready in %llu us, expires in ~2 s", (unsigned long long)a.ready_us);
  char *out = NULL;
  char *req_env[] = {"BAR=request", NULL};
  int code = run(c, "default", a.id, "echo $FOO $BAR", req_env, &out);
  CHECK(code == 0 && strcmp(out, "sandbox request\n") == 0, "exec sees sandbox env under request env: %s",
        out);
  free(out);

  /* Org scoping. */
  CHECK(err_status_of_get(c, "other", a.id) == ENOENT, "another org's get is ENOENT");
  CHECK(run(c, "other", a.id, "true", NULL, &out) == -100 && strstr(out, "error 2:"),
        "another org's exec is ENOENT: %s", out);
  free(out);
  CHECK(moat_control_kill(c, "other", a.id, "api", &err) < 0 && err && err->status == ENOENT,
        "another org's kill is ENOENT");
  moat_error_free(&err);
  struct moat_sandbox_info *list;
  size_t n;
  json_t *filter = json_pack("{s:s}", "owner", "test");
  CHECK(moat_control_list(c, "default", NULL, filter, &list, &n, &err) == 0 && n == 1 &&
            strcmp(list[0].id, a.id) == 0,
        "list by metadata finds A");
  moat_sandbox_infos_free(list, n);
  CHECK(moat_control_list(c, "other", NULL, filter, &list, &n, &err) == 0 && n == 0,
        "org other lists nothing");
  moat_sandbox_infos_free(list, n);
  json_decref(filter);

  /* TTL: activity refreshes it; idleness expires it. */
  for (int i = 0; i < 4; i++) {
    usleep(800 * 1000);
    run(c, "default", a.id, "true", NULL, NULL);
  }
  char *s = state_of(c, a.id, NULL);
  CHECK(strcmp(s, "running") == 0, "A still running after 3.2 s of exec every 0.8 s (ttl 2 s): %s", s);
  free(s);
  char *reason = wait_killed(c, a.id, 4000);
  CHECK(reason && strcmp(reason, "ttl") == 0, "idle A is reaped with reason ttl (%s)",
        reason ? reason : "not killed");
  free(reason);
  CHECK(run(c, "default", a.id, "true", NULL, &out) == -100 && strstr(out, "killed (ttl)"),
        "exec on killed A: %s", out);
  free(out);
  CHECK(err_status_of_get(c, "default", a.id) == 0, "get still returns killed A");
  CHECK(moat_control_kill(c, "default", a.id, "api", &err) < 0 && err && err->status == ENOENT,
        "kill of killed A is ENOENT");
  moat_error_free(&err);
  moat_sandbox_info_clear(&a);

  /* Persistent: not reaped; patch back to a short TTL and it is. */
  struct moat_sandbox_info p = {0};
  CHECK(create(c, "default", 1, true, NULL, NULL, &p) == 0 && p.expires_at_ms == 0,
        "create persistent P (ttl 1 s)");
  usleep(1800 * 1000);
  s = state_of(c, p.id, NULL);
  CHECK(strcmp(s, "running") == 0, "persistent P survives past its ttl: %s", s);
  free(s);
  struct moat_sandbox_patch patch = {
      .has_persistent = true, .persistent = false, .has_ttl = true, .ttl_seconds = 1};
  struct moat_sandbox_info pi = {0};
  CHECK(moat_control_update(c, "default", p.id, &patch, &pi, &err) == 0 && !pi.persistent &&
            pi.ttl_seconds == 1 && pi.expires_at_ms > now_unix_ms() - 100,
        "patch P to non-persistent, ttl 1");
  note(&err);
  moat_sandbox_info_clear(&pi);
  reason = wait_killed(c, p.id, 3000);
  CHECK(reason && strcmp(reason, "ttl") == 0, "P reaped after the patch (%s)",
        reason ? reason : "not killed");
  free(reason);
  moat_sandbox_info_clear(&p);

  /* Dead init: reason error. */
  struct moat_sandbox_info d = {0};
  CHECK(create(c, "default", 600, false, NULL, NULL, &d) == 0, "create D");
  pid_t pid = init_pid(d.id);
  CHECK(pid > 1 && kill(pid, SIGKILL) == 0, "SIGKILL D's init (pid %d)", (int)pid);
  reason = wait_killed(c, d.id, 3000);
  CHECK(reason && (strcmp(reason, "guest_exited") == 0 || strcmp(reason, "oom") == 0),
        "D recorded killed (%s)", reason ? reason : "not killed");
  free(reason);
  moat_sandbox_info_clear(&d);

  /* Exec racing kill: the exec fails, nothing crashes. */
  struct moat_sandbox_info r = {0};
  CHECK(create(c, "default", 600, false, NULL, NULL, &r) == 0, "create R");
  struct race ra = {.c = c, .id = r.id};
  pthread_t th;
  pthread_create(&th, NULL, race_exec, &ra);
  usleep(300 * 1000);
  CHECK(moat_control_kill(c, "default", r.id, "api", &err) == 0, "kill R during a 5 s exec");
  note(&err);
  pthread_join(th, NULL);
  CHECK(ra.rc != 0, "the racing exec did not succeed (%d)", ra.rc);
  moat_sandbox_info_clear(&r);

  /* Restart: a live sandbox is adopted, one whose init died meanwhile is host_restart. */
  struct moat_sandbox_info k = {0}, g = {0};
  CHECK(create(c, "default", 600, false, NULL, NULL, &k) == 0 &&
            create(c, "default", 600, false, NULL, NULL, &g) == 0,
        "create K and G");
  moat_control_close(c);
  c = NULL;
  pid = init_pid(g.id);
  CHECK(pid > 1 && kill(pid, SIGKILL) == 0, "with control closed, SIGKILL G's init");
  usleep(200 * 1000);
  CHECK(moat_control_open(&c, &cfg, &err) == 0, "reopen control");
  note(&err);
  if (c) {
    s = state_of(c, k.id, NULL);
    CHECK(strcmp(s, "running") == 0 && run(c, "default", k.id, "echo adopted", NULL, &out) == 0 &&
              strcmp(out, "adopted\n") == 0,
          "K adopted and execs after the restart (%s)", s);
    free(s);
    free(out);
    reason = NULL;
    s = state_of(c, g.id, &reason);
    CHECK(strcmp(s, "killed") == 0 && reason && strcmp(reason, "host_restart") == 0, "G recorded %s (%s)", s,
          reason ? reason : "-");
    free(s);
    free(reason);
    CHECK(moat_control_kill(c, "default", k.id, "api", &err) == 0, "kill K");
    note(&err);
  }
  moat_sandbox_info_clear(&k);
  moat_sandbox_info_clear(&g);

done:
  moat_control_close(c);
  moat_error_free(&err);
  free((char *)cfg.recipes_dir);
  free((char *)cfg.guest_path);
  rm_rf(data_dir, NULL);
  return tap_done();
}

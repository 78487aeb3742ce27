/* test_control_timetravel.c -- control's time travel against the real linux host: pause/resume
 * (idempotence, MOAT_E_PAUSED on guest access, the TTL clock, org scoping), and where the host can
 * checkpoint: snapshot, create from it, fork, rollback, hibernate and a transparent wake; where it
 * cannot: MOAT_E_NO_CHECKPOINTS with nothing changed. Needs root and a built `base` template in
 * MOAT_TEST_TEMPLATE_DIR (default /var/tmp/moat-test-templates); skips (77) otherwise. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "control/control.h"

#include "tap.h"

static char data_dir[] = "/tmp/moat-test-control-tt-XXXXXX";

static char *repo_path(const char *rel) {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0)
    return NULL;
  buf[n] = 0;
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

/* Runs cmd; returns its exit code, or -(error status) when the exec failed. *out: stdout. */
static int run(struct moat_control *c, const char *id, const char *cmd, char **out) {
  char *argv[] = {"/bin/sh", "-c", (char *)cmd, NULL};
  struct moat_exec_req req = {.argv = argv, .timeout_ms = 20000};
  struct moat_exec_result res;
  memset(&res, 0, sizeof(res));
  moat_error *err = NULL;
  if (moat_control_exec(c, "default", id, &req, &res, &err) < 0) {
    int st = err ? err->status : 1;
    moat_error_free(&err);
    if (out)
      *out = xstrdup("");
    return -st;
  }
  if (out)
    *out = xstrndup(res.out ? res.out : "", res.out_len);
  int code = res.exit_code;
  moat_exec_result_free(&res);
  return code;
}

static int status_of(int rc, moat_error **err) {
  int st = rc < 0 ? (*err ? (*err)->status : -1) : 0;
  moat_error_free(err);
  return st;
}

static struct moat_sandbox_info get(struct moat_control *c, const char *id) {
  struct moat_sandbox_info i;
  memset(&i, 0, sizeof(i));
  moat_error *err = NULL;
  moat_control_get(c, "default", id, &i, &err);
  moat_error_free(&err);
  return i;
}

static bool state_is(struct moat_control *c, const char *id, enum moat_sandbox_state want) {
  struct moat_sandbox_info i = get(c, id);
  bool ok = i.state == want;
  moat_sandbox_info_clear(&i);
  return ok;
}

static void test_pause(struct moat_control *c) {
  moat_error *err = NULL;
  struct moat_sandbox_info sb;
  struct moat_sandbox_spec spec = {.ttl_seconds = 2, .limits = {.memory_mb = 256, .disk_mb = 256}};
  if (!CHECK(moat_control_create(c, "default", &spec, &sb, &err) == 0, "create"))
    return;
  char *id = xstrdup(sb.id);
  int64_t exp0 = sb.expires_at_ms;
  moat_sandbox_info_clear(&sb);
  CHECK(run(c, id, "echo x > /root/f", NULL) == 0, "write a file");
  CHECK(moat_control_pause(c, "default", id, &err) == 0 && state_is(c, id, MOAT_SB_PAUSED), "pause");
  CHECK(moat_control_pause(c, "default", id, &err) == 0, "pause again: 0");
  CHECK(status_of(moat_control_pause(c, "other", id, &err), &err) == ENOENT, "another org: ENOENT");
  CHECK(run(c, id, "true", NULL) == -MOAT_E_PAUSED, "exec while paused: MOAT_E_PAUSED");
  struct moat_guest_ep *sock = NULL;
  CHECK(status_of(moat_control_guest(c, "default", id, &sock, NULL, &err), &err) == MOAT_E_PAUSED,
        "guest access while paused: MOAT_E_PAUSED");
  free(sock);
  usleep(3000 * 1000); /* past the 2 s TTL: the reaper (200 ms) must spare it */
  CHECK(state_is(c, id, MOAT_SB_PAUSED), "still paused after its TTL went by");
  CHECK(moat_control_resume(c, "default", id, &err) == 0 && state_is(c, id, MOAT_SB_RUNNING), "resume");
  struct moat_sandbox_info i = get(c, id);
  CHECK(i.expires_at_ms - exp0 >= 2500 && i.paused_at_ms == 0, "expiry moved on by the pause (%lld ms)",
        (long long)(i.expires_at_ms - exp0));
  moat_sandbox_info_clear(&i);
  CHECK(moat_control_resume(c, "default", id, &err) == 0, "resume again: 0");
  char *out = NULL;
  CHECK(run(c, id, "cat /root/f", &out) == 0 && strcmp(out, "x\n") == 0, "file there after resume");
  free(out);
  CHECK(moat_control_kill(c, "default", id, "api", &err) == 0, "kill");
  CHECK(status_of(moat_control_resume(c, "default", id, &err), &err) == ENOENT, "resume of killed: ENOENT");
  free(id);
}

static void test_checkpoints(struct moat_control *c) {
  moat_error *err = NULL;
  struct moat_sandbox_info sb;
  struct moat_sandbox_spec spec = {.ttl_seconds = 600, .limits = {.memory_mb = 256, .disk_mb = 256}};
  if (!CHECK(moat_control_create(c, "default", &spec, &sb, &err) == 0, "create"))
    return;
  char *id = xstrdup(sb.id);
  moat_sandbox_info_clear(&sb);
  struct moat_snapshot_info si;
  memset(&si, 0, sizeof(si));
  CHECK(status_of(moat_control_snapshot_get(c, "default", "snap-00000000000000000", &si, &err), &err) ==
            ENOENT,
        "unknown snapshot: ENOENT");
  if (!moat_control_can_checkpoint(c)) {
    tap_skip("checkpoints unavailable: %s", moat_control_criu_status(c));
    CHECK(status_of(moat_control_snapshot_create(c, "default", id, NULL, &si, &err), &err) ==
              MOAT_E_NO_CHECKPOINTS,
          "snapshot: MOAT_E_NO_CHECKPOINTS");
    CHECK(status_of(moat_control_hibernate(c, "default", id, &err), &err) == MOAT_E_NO_CHECKPOINTS &&
              state_is(c, id, MOAT_SB_RUNNING),
          "hibernate: MOAT_E_NO_CHECKPOINTS, still running");
    moat_control_kill(c, "default", id, "api", &err);
    moat_error_free(&err);
    free(id);
    return;
  }
  CHECK(run(c, id, "echo v1 > /root/v", NULL) == 0, "write v1");
  CHECK(moat_control_snapshot_create(c, "default", id, NULL, &si, &err) == 0 &&
            strncmp(si.id, "snap-", 5) == 0 && strcmp(si.sandbox_id, id) == 0,
        "snapshot %s", si.id);
  CHECK(run(c, id, "echo v2 > /root/v", NULL) == 0, "write v2");
  struct moat_sandbox_spec from = {.from_snapshot = si.id};
  struct moat_sandbox_info r;
  memset(&r, 0, sizeof(r));
  char *out = NULL;
  CHECK(moat_control_create(c, "default", &from, &r, &err) == 0 && r.from_snapshot &&
            strcmp(r.from_snapshot, si.id) == 0 && r.limits.memory_mb == 256,
        "create from the snapshot (limits from the snapshot)");
  CHECK(run(c, r.id, "cat /root/v", &out) == 0 && strcmp(out, "v1\n") == 0, "restored sandbox has v1");
  free(out);
  struct moat_sandbox_info *kids = NULL;
  CHECK(moat_control_fork(c, "default", r.id, 2, false, &kids, &err) == 0 && kids && kids[0].forked_from &&
            strcmp(kids[0].forked_from, r.id) == 0,
        "fork 2 of the restored sandbox");
  for (int k = 0; kids && k < 2; k++) {
    CHECK(run(c, kids[k].id, "cat /root/v", &out) == 0 && strcmp(out, "v1\n") == 0, "child %d has v1", k);
    free(out);
    moat_control_kill(c, "default", kids[k].id, "api", &err);
  }
  moat_sandbox_infos_free(kids, 2);
  CHECK(status_of(moat_control_fork(c, "default", id, 17, false, &kids, &err), &err) == EINVAL,
        "fork 17: EINVAL");
  CHECK(status_of(moat_control_rollback(c, "default", r.id, si.id, &err), &err) == EINVAL,
        "rollback to another sandbox's snapshot: EINVAL");
  CHECK(moat_control_rollback(c, "default", id, si.id, &err) == 0, "rollback");
  CHECK(run(c, id, "cat /root/v", &out) == 0 && strcmp(out, "v1\n") == 0, "rolled back to v1");
  free(out);
  CHECK(moat_control_hibernate(c, "default", id, &err) == 0 && state_is(c, id, MOAT_SB_HIBERNATED),
        "hibernate");
  CHECK(status_of(moat_control_pause(c, "default", id, &err), &err) == EBUSY, "pause of hibernated: EBUSY");
  CHECK(run(c, id, "cat /root/v", &out) == 0 && strcmp(out, "v1\n") == 0 && state_is(c, id, MOAT_SB_RUNNING),
        "exec wakes it transparently");
  free(out);
  CHECK(moat_control_snapshot_delete(c, "default", si.id, &err) == 0, "delete the snapshot");
  CHECK(status_of(moat_control_snapshot_delete(c, "default", si.id, &err), &err) == ENOENT,
        "delete again: ENOENT");
  moat_control_kill(c, "default", r.id, "api", &err);
  moat_control_kill(c, "default", id, "api", &err);
  moat_error_free(&err);
  moat_sandbox_info_clear(&r);
  moat_snapshot_info_clear(&si);
  free(id);
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
  struct moat_control_config cfg = {
      .data_dir = data_dir,
      .template_dir = tdir,
      .recipes_dir = repo_path("templates"),
      .guest_path = repo_path("build/moat-guest"),
      .pool_size = 0,
      .reap_interval_ms = 200,
  };
  moat_error *err = NULL;
  struct moat_control *c = NULL;
  CHECK(moat_control_open(&c, &cfg, &err) == 0, "open control in %s: %s", data_dir,
        err ? moat_error_msg(err) : "ok");
  moat_error_free(&err);
  if (c) {
    test_pause(c);
    test_checkpoints(c);
    moat_control_close(c);
  }
  free((char *)cfg.recipes_dir);
  free((char *)cfg.guest_path);
  rm_rf(data_dir, NULL);
  return tap_done();
}

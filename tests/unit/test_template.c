/* test_template.c -- template recipes: names, listing, digests, ready detection, leftovers, failed
 * builds and the build lock, all without the network (a failing build points debootstrap at a closed
 * loopback port) */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "host/template.h"

/* Defined in template.c without a header entry: test hooks. */
int moat_template_digest(struct moat_templates *t, const char *name, char out[65], moat_error **err);
int moat_template_remove_leftovers(struct moat_templates *t, const char *name, moat_error **err);

#include "tap.h"

#define check(...) CHECK(__VA_ARGS__)
#define skip(why) tap_skip("%s", (why))

static char root[256], recipes[300], built[300];

static void put(const char *rel, const char *content, mode_t mode) {
  char *path = xasprintf("%s/%s", root, rel);
  char *dir = xstrdup(path);
  *strrchr(dir, '/') = '\0';
  moat_error *err = NULL;
  if (mkdir_p(dir, 0755, &err) < 0) {
    fprintf(stderr, "%s\n", moat_error_msg(err));
    exit(2);
  }
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0 || write_all(fd, content, strlen(content)) < 0 || fchmod(fd, mode) < 0) {
    perror(path);
    exit(2);
  }
  close(fd);
  free(path);
  free(dir);
}

static void mkd(const char *rel) {
  char *path = xasprintf("%s/%s", root, rel);
  moat_error *err = NULL;
  if (mkdir_p(path, 0755, &err) < 0) {
    fprintf(stderr, "%s\n", moat_error_msg(err));
    exit(2);
  }
  free(path);
}

static bool exists(const char *rel) {
  char *path = xasprintf("%s/%s", root, rel);
  struct stat st;
  bool r = lstat(path, &st) == 0;
  free(path);
  return r;
}

static struct moat_templates *open_t(void) {
  struct moat_templates *t = NULL;
  moat_error *err = NULL;
  if (moat_templates_open(&t, recipes, built, &err) < 0) {
    fprintf(stderr, "open: %s\n", moat_error_msg(err));
    exit(2);
  }
  return t;
}

static void digest_of(struct moat_templates *t, const char *name, char out[65]) {
  moat_error *err = NULL;
  if (moat_template_digest(t, name, out, &err) < 0) {
    printf("# digest %s: %s\n", name, moat_error_msg(err));
    moat_error_free(&err);
    out[0] = '\0';
  }
}

static enum moat_template_state state_of(struct moat_templates *t, const char *name, char **error) {
  struct moat_template_info *v = NULL;
  size_t n = 0;
  moat_error *err = NULL;
  enum moat_template_state s = (enum moat_template_state) - 1;
  if (moat_template_list(t, &v, &n, &err) < 0) {
    moat_error_free(&err);
    return s;
  }
  for (size_t i = 0; i < n; i++) {
    if (strcmp(v[i].name, name) == 0) {
      s = v[i].state;
      if (error)
        *error = v[i].error ? xstrdup(v[i].error) : NULL;
    }
  }
  moat_template_infos_free(v, n);
  return s;
}

static void test_names(void) {
  struct moat_templates *t = open_t();
  mkd("recipes/base");
  mkd("recipes/a_b.c-9");
  mkd("recipes/Upper");
  mkd("recipes/.hidden");
  mkd("recipes/-dash");
  put("recipes/notadir", "x", 0644);
  char long_name[80];
  memset(long_name, 'a', 64);
  long_name[64] = '\0';
  char *p = xasprintf("recipes/%s", long_name);
  mkd(p);
  free(p);
  check(moat_template_exists(t, "base"), "a plain name with a recipe exists");
  check(moat_template_exists(t, "a_b.c-9"), "'.', '_' and '-' are allowed after the first character");
  check(!moat_template_exists(t, "nosuch"), "a valid name without a recipe does not exist");
  check(!moat_template_exists(t, "Upper"), "upper case is refused even with a recipe dir");
  check(!moat_template_exists(t, ".hidden") && !moat_template_exists(t, "-dash"),
        "a name must start with [a-z0-9]");
  check(!moat_template_exists(t, long_name), "64 characters is too long");
  long_name[63] = '\0';
  check(!moat_template_exists(t, long_name), "63 characters is valid but has no recipe here");
  check(!moat_template_exists(t, "") && !moat_template_exists(t, "../recipes/base") &&
            !moat_template_exists(t, "base/") && !moat_template_exists(t, "notadir"),
        "empty, path-like and non-directory names are refused");
  moat_error *err = NULL;
  int r = moat_template_ensure(t, "nosuch", &err);
  check(r < 0 && err && err->status == ENOENT, "ensure of an unknown template fails with ENOENT (%s)",
        moat_error_msg(err));
  moat_error_free(&err);
  check(moat_template_rootfs(t, "nosuch") == NULL && moat_template_rootfs(t, "base") == NULL,
        "no rootfs path for unknown or unbuilt templates");

  struct moat_template_info *v = NULL;
  size_t n = 0;
  r = moat_template_list(t, &v, &n, &err);
  bool ok = r == 0 && n == 2 && strcmp(v[0].name, "a_b.c-9") == 0 && strcmp(v[1].name, "base") == 0 &&
            v[0].state == MOAT_TEMPLATE_MISSING && v[1].state == MOAT_TEMPLATE_MISSING &&
            v[1].error == NULL && v[1].built_at == 0 && v[1].size_bytes == 0;
  check(ok, "list reports exactly the valid recipes, sorted, as missing (got %zu)", n);
  for (size_t i = 0; i < n; i++)
    printf("#   %s %s\n", v[i].name, moat_template_state_name(v[i].state));
  moat_template_infos_free(v, n);
  check(strcmp(moat_template_state_name(MOAT_TEMPLATE_READY), "ready") == 0 &&
            strcmp(moat_template_state_name(MOAT_TEMPLATE_BUILDING), "building") == 0 &&
            strcmp(moat_template_state_name(MOAT_TEMPLATE_FAILED), "failed") == 0 &&
            strcmp(moat_template_state_name(MOAT_TEMPLATE_MISSING), "missing") == 0,
        "state names match the API's");
  moat_templates_close(t);
}

static void test_digest(void) {
  struct moat_templates *t = open_t();
  put("recipes/d/packages", "procps\n", 0644);
  put("recipes/d/run", "echo hi\n", 0644);
  put("recipes/d/files/etc/motd", "hello\n", 0644);
  char d0[65], d1[65];
  digest_of(t, "d", d0);
  digest_of(t, "d", d1);
  check(strlen(d0) == 64 && strspn(d0, "0123456789abcdef") == 64, "digest is 64 hex digits");
  check(strcmp(d0, d1) == 0, "digest is stable");

  put("recipes/d/packages", "procps\nless\n", 0644);
  digest_of(t, "d", d1);
  check(strcmp(d0, d1) != 0, "digest changes when packages change");
  put("recipes/d/packages", "procps\n", 0644);
  digest_of(t, "d", d1);
  check(strcmp(d0, d1) == 0, "digest returns to the old value when the change is undone");

  put("recipes/d/run", "echo bye\n", 0644);
  digest_of(t, "d", d1);
  check(strcmp(d0, d1) != 0, "digest changes when run changes");
  put("recipes/d/run", "echo hi\n", 0644);

  put("recipes/d/files/etc/motd", "hello\n", 0600);
  digest_of(t, "d", d1);
  check(strcmp(d0, d1) != 0, "digest changes when a file's mode changes");
  put("recipes/d/files/etc/motd", "hello\n", 0644);

  put("recipes/d/files/etc/issue", "", 0644);
  digest_of(t, "d", d1);
  check(strcmp(d0, d1) != 0, "digest changes when an (empty) file is added");
  char *p = xasprintf("%s/recipes/d/files/etc/issue", root);
  unlink(p);
  free(p);
  /* Moving content between files must not collide: "ab"+"" vs "a"+"b". */
  put("recipes/d/files/x", "ab", 0644);
  put("recipes/d/files/y", "", 0644);
  char e0[65], e1[65];
  digest_of(t, "d", e0);
  put("recipes/d/files/x", "a", 0644);
  put("recipes/d/files/y", "b", 0644);
  digest_of(t, "d", e1);
  check(strcmp(e0, e1) != 0, "digest separates file boundaries");
  moat_templates_close(t);
}

/* Plants a built image for name (with the given ready content) by hand. */
static void plant_built(const char *name, const char *ready) {
  char *rel = xasprintf("built/%s/rootfs/etc/os-release", name);
  put(rel, "ID=debian\n", 0644);
  free(rel);
  rel = xasprintf("built/%s/ready", name);
  put(rel, ready, 0644);
  free(rel);
}

static void test_ready(void) {
  put("recipes/r/packages", "procps\n", 0644);
  struct moat_templates *t = open_t();
  char d[65];
  digest_of(t, "r", d);
  char *ready = xasprintf("%s\n", d);
  plant_built("r", ready);
  free(ready);
  check(state_of(t, "r", NULL) == MOAT_TEMPLATE_READY, "a built image whose ready holds the digest is ready");
  char *rootfs = moat_template_rootfs(t, "r");
  char *want = xasprintf("%s/r/rootfs", built);
  check(rootfs && strcmp(rootfs, want) == 0, "rootfs path is TEMPLATE_DIR/NAME/rootfs (%s)",
        rootfs ? rootfs : "NULL");
  free(rootfs);
  free(want);
  moat_error *err = NULL;
  uint64_t t0 = now_ns();
  int r = moat_template_ensure(t, "r", &err);
  uint64_t dt = now_ns() - t0;
  check(r == 0 && dt < 50u * 1000 * 1000, "ensure of a ready template returns at once (%.3f ms)",
        (double)dt / 1e6);
  moat_error_free(&err);
  moat_templates_close(t);

  put("recipes/r/packages", "procps\nless\n", 0644);
  t = open_t();
  check(state_of(t, "r", NULL) == MOAT_TEMPLATE_MISSING,
        "after the recipe changes the old image counts as missing");
  check(moat_template_rootfs(t, "r") == NULL, "and has no rootfs path");
  moat_templates_close(t);

  plant_built("r2", "0000\n");
  put("recipes/r2/packages", "", 0644);
  t = open_t();
  check(state_of(t, "r2", NULL) == MOAT_TEMPLATE_MISSING, "a ready file with another digest is missing");
  moat_templates_close(t);
}

static void test_leftovers(bool is_root) {
  mkd("recipes/lo");
  mkd("recipes/lo.tmp-keep"); /* a real template whose name looks like a build dir */
  put("built/lo.tmp-abc123/rootfs/etc/passwd", "root:x:0:0::/root:/bin/sh\n", 0644);
  put("built/lo.tmp-def456/ready", "x\n", 0644);
  put("built/lo.tmp-keep/ready", "x\n", 0644);
  put("built/lox.tmp-aaaaaa/ready", "x\n", 0644);
  bool mounted = false;
  if (is_root) {
    mkd("built/lo.tmp-abc123/rootfs/proc");
    char *p = xasprintf("%s/built/lo.tmp-abc123/rootfs/proc", root);
    mounted = mount("moat-test", p, "tmpfs", 0, "size=64k") == 0;
    free(p);
  }
  struct moat_templates *t = open_t();
  moat_error *err = NULL;
  int r = moat_template_remove_leftovers(t, "lo", &err);
  check(r == 0, "leftover removal succeeds%s%s", err ? ": " : "", err ? moat_error_msg(err) : "");
  moat_error_free(&err);
  check(!exists("built/lo.tmp-abc123") && !exists("built/lo.tmp-def456"),
        "NAME.tmp-* build dirs are removed");
  if (is_root)
    check(mounted && !exists("built/lo.tmp-abc123"),
          "even one with a mount left inside (crash during debootstrap)");
  else
    skip("mount inside a leftover needs root");
  check(exists("built/lo.tmp-keep/ready"), "a template whose name merely looks like a build dir is kept");
  check(exists("built/lox.tmp-aaaaaa/ready"), "another template's build dirs are not touched");
  moat_templates_close(t);
}

struct ens_arg {
  struct moat_templates *t;
  const char *name;
  int r;
  char *msg;
  uint64_t done_ns;
};

static void *ensure_thread(void *p) {
  struct ens_arg *a = p;
  moat_error *err = NULL;
  a->r = moat_template_ensure(a->t, a->name, &err);
  a->msg = err ? xstrdup(moat_error_msg(err)) : NULL;
  a->done_ns = now_ns();
  moat_error_free(&err);
  return NULL;
}

/* A build that cannot reach its mirror: fails fast, keeps the error, cleans up, retries next time. */
static void test_failed_build(bool is_root) {
  if (!is_root || access("/usr/sbin/debootstrap", X_OK) < 0) {
    skip("failed-build tests need root and debootstrap");
    return;
  }
  setenv("MOAT_DEBIAN_MIRROR", "http://127.0.0.1:9/debian", 1); /* discard port: connection refused */
  put("recipes/fb/packages", "procps\n", 0644);
  put("built/fb.tmp-old111/x", "stale\n", 0644);
  struct moat_templates *t = open_t();
  moat_error *err = NULL;
  int r = moat_template_ensure(t, "fb", &err);
  check(r < 0 && err && strstr(moat_error_msg(err), "debootstrap"), "a build without a mirror fails: %s",
        moat_error_msg(err));
  moat_error_free(&err);
  char *e = NULL;
  enum moat_template_state st = state_of(t, "fb", &e);
  check(st == MOAT_TEMPLATE_FAILED && e && strstr(e, "build template 'fb'"),
        "list reports failed with the error (%s)", e ? e : "NULL");
  free(e);
  check(!exists("built/fb.tmp-old111"), "the leftover of an earlier crash was removed by the build");
  check(!exists("built/fb"), "no half image is left under the template's name");
  bool any_tmp = false;
  DIR *d = opendir(built);
  struct dirent *de;
  while (d && (de = readdir(d)) != NULL)
    any_tmp = any_tmp || strncmp(de->d_name, "fb.tmp-", 7) == 0;
  if (d)
    closedir(d);
  check(!any_tmp, "the failed build removed its own build dir");

  /* The next ensure retries: a new leftover planted now is removed by that second build. */
  put("built/fb.tmp-old222/x", "stale\n", 0644);
  r = moat_template_ensure(t, "fb", &err);
  check(r < 0 && !exists("built/fb.tmp-old222"), "the next ensure retries the build");
  moat_error_free(&err);

  /* The cross-process lock: while someone else holds NAME.lock, ensure waits (and shows building). */
  char *lock_path = xasprintf("%s/fb.lock", built);
  int lfd = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  free(lock_path);
  check(lfd >= 0 && flock(lfd, LOCK_EX) == 0, "test takes the build lock as another process would");
  struct ens_arg a1 = {.t = t, .name = "fb"}, a2 = {.t = t, .name = "fb"};
  pthread_t th1, th2;
  pthread_create(&th1, NULL, ensure_thread, &a1);
  pthread_create(&th2, NULL, ensure_thread, &a2);
  struct timespec ts = {0, 300 * 1000 * 1000};
  nanosleep(&ts, NULL);
  check(a1.done_ns == 0 && a2.done_ns == 0, "both ensures wait while the lock is held");
  check(state_of(t, "fb", NULL) == MOAT_TEMPLATE_BUILDING, "list shows building meanwhile");
  uint64_t released = now_ns();
  flock(lfd, LOCK_UN);
  close(lfd);
  pthread_join(th1, NULL);
  pthread_join(th2, NULL);
  check(a1.done_ns > released && a2.done_ns > released && a1.r < 0 && a2.r < 0,
        "both finish after the lock is released, sharing the one build's failure");
  check(a1.msg && a2.msg && strcmp(a1.msg, a2.msg) == 0, "the waiter gets the builder's error (%s)",
        a1.msg ? a1.msg : "NULL");
  free(a1.msg);
  free(a2.msg);
  moat_templates_close(t);
  unsetenv("MOAT_DEBIAN_MIRROR");
}

int main(void) {
  moat_log_set_level(MOAT_LOG_WARN);
  snprintf(root, sizeof(root), "/tmp/moat-test-template-XXXXXX");
  if (!mkdtemp(root)) {
    perror("mkdtemp");
    return 2;
  }
  snprintf(recipes, sizeof(recipes), "%s/recipes", root);
  snprintf(built, sizeof(built), "%s/built", root);
  mkd("recipes");
  bool is_root = geteuid() == 0;

  test_names();
  test_digest();
  test_ready();
  test_leftovers(is_root);
  test_failed_build(is_root);

  moat_error *err = NULL;
  if (rm_rf(root, &err) < 0) {
    fprintf(stderr, "cleanup: %s\n", moat_error_msg(err));
    moat_error_free(&err);
  }
  return tap_done();
}

/* test_volumes.c -- volumes without a daemon: the store's schema-4 rows (org scoping, live
 * attachments, the one-writer claim, delete while held), create's mount checks, and host/vfiles.c
 * on a plain directory (links never followed, '..' refused, uploads renamed into place) */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/util.h"
#include "control/control.h"
#include "host/vfiles.h"
#include "store/store.h"

#include "tap.h"

static char dir[] = "/tmp/moat-test-volumes-XXXXXX";

static void sandbox_row(struct moat_store *s, const char *id, const char *org) {
  struct moat_store_sandbox r = {0};
  r.id = (char *)id;
  r.org = (char *)org;
  r.template_name = (char *)"base";
  r.state = (char *)"creating";
  r.created_at_ms = now_unix_ms();
  r.ttl_seconds = 60;
  r.cpu = 1;
  r.memory_mb = 256;
  r.pids = 64;
  r.disk_mb = 512;
  r.slot = -1;
  moat_error *err = NULL;
  CHECK(moat_store_sandbox_insert(s, &r, "api", &err) == 0, "insert sandbox %s: %s", id, moat_error_msg(err));
  moat_error_free(&err);
}

static int claim(struct moat_store *s, const char *org, const char *sid, const char *name, bool ro,
                 int *status) {
  struct moat_store_claim c = {.name = name, .path = "/data", .read_only = ro};
  moat_error *err = NULL;
  int rc = moat_store_volume_claim(s, org, sid, &c, 1, &err);
  *status = err ? err->status : 0;
  free(c.volume_id);
  moat_error_free(&err);
  return rc;
}

static size_t live(struct moat_store *s, const char *vid) {
  struct moat_store_attachment *a = NULL;
  size_t n = 99;
  moat_error *err = NULL;
  if (moat_store_attachments(s, vid, NULL, &a, &n, &err) < 0)
    n = 99;
  moat_store_attachments_free(a, n == 99 ? 0 : n);
  moat_error_free(&err);
  return n;
}

static void test_store(struct moat_store *s) {
  moat_error *err = NULL;
  struct moat_store_volume v = {
      .id = (char *)"v-1", .org = (char *)"a", .name = (char *)"data", .size_mb = 32, .created_at_ms = 5};
  CHECK(moat_store_volume_insert(s, &v, &err) == 0, "insert a volume");
  CHECK(moat_store_volume_insert(s, &v, &err) < 0 && err->status == EEXIST, "same org, same name: EEXIST");
  moat_error_free(&err);
  v.id = (char *)"v-2";
  v.org = (char *)"b";
  CHECK(moat_store_volume_insert(s, &v, &err) == 0, "another org may use the name");
  struct moat_store_volume got = {0};
  CHECK(moat_store_volume_get(s, "a", "data", &got, &err) == 0 && strcmp(got.id, "v-1") == 0 &&
            got.size_mb == 32,
        "get org a's");
  moat_store_volume_clear(&got);
  CHECK(moat_store_volume_get(s, "c", "data", &got, &err) < 0 && err->status == ENOENT, "org c: ENOENT");
  moat_error_free(&err);
  struct moat_store_volume *list = NULL;
  size_t n = 0;
  CHECK(moat_store_volume_list(s, "a", &list, &n, &err) == 0 && n == 1 && strcmp(list[0].org, "a") == 0,
        "list is per org");
  moat_store_volumes_free(list, n);

  int st = 0;
  sandbox_row(s, "sb-w", "a");
  sandbox_row(s, "sb-w2", "a");
  sandbox_row(s, "sb-r", "a");
  sandbox_row(s, "sb-b", "b");
  CHECK(claim(s, "a", "sb-w", "data", false, &st) == 0, "first read-write claim");
  CHECK(claim(s, "a", "sb-w2", "data", false, &st) < 0 && st == EBUSY, "second read-write claim: EBUSY");
  CHECK(claim(s, "a", "sb-r", "data", true, &st) == 0, "read-only claim beside the writer");
  CHECK(claim(s, "b", "sb-b", "nope", true, &st) < 0 && st == ENOENT, "unknown name: ENOENT");
  CHECK(claim(s, "c", "sb-b", "data", true, &st) < 0 && st == ENOENT, "another org's volume: ENOENT");
  CHECK(live(s, "v-1") == 2, "two live attachments");
  {
    struct moat_store_claim two[2] = {{.name = "data", .path = "/x", .read_only = false},
                                      {.name = "data", .path = "/y", .read_only = false}};
    sandbox_row(s, "sb-b2", "b");
    CHECK(moat_store_volume_claim(s, "b", "sb-b2", two, 2, &err) < 0 && err->status == EBUSY,
          "the same volume read-write twice in one create: EBUSY");
    moat_error_free(&err);
    free(two[0].volume_id);
    free(two[1].volume_id);
    CHECK(live(s, "v-2") == 0, "a refused claim records nothing");
  }
  char *id = NULL;
  CHECK(moat_store_volume_delete(s, "a", "data", &id, &err) < 0 && err->status == EBUSY &&
            strstr(err->msg, "sb-w") != NULL,
        "delete while attached: EBUSY naming the sandbox (%s)", moat_error_msg(err));
  moat_error_free(&err);
  CHECK(moat_store_sandbox_transition(s, "sb-w", NULL, "killed", "api", &err) == 0, "kill the writer");
  CHECK(live(s, "v-1") == 1, "a killed sandbox's attachment is not live");
  CHECK(claim(s, "a", "sb-w2", "data", false, &st) == 0, "read-write again once the writer is killed");
  CHECK(moat_store_sandbox_transition(s, "sb-w2", NULL, "killed", "api", &err) == 0 &&
            moat_store_sandbox_transition(s, "sb-r", NULL, "killed", "api", &err) == 0,
        "kill the others");
  CHECK(moat_store_volume_delete(s, "b", "data", &id, &err) == 0 && strcmp(id, "v-2") == 0,
        "org b deletes its own");
  free(id);
  id = NULL;
  CHECK(moat_store_volume_delete(s, "a", "data", &id, &err) == 0 && strcmp(id, "v-1") == 0,
        "delete once free");
  free(id);
  CHECK(moat_store_volume_get(s, "a", "data", &got, &err) < 0 && err->status == ENOENT, "gone");
  moat_error_free(&err);
  CHECK(moat_store_volume_delete(s, "a", "data", &id, &err) < 0 && err->status == ENOENT,
        "delete again: ENOENT");
  moat_error_free(&err);
}

static void test_mounts_check(void) {
  struct moat_volume_mount ok[2] = {{"data", "/data", false}, {"ro.v_1", "/srv/x/", true}};
  moat_error *err = NULL;
  CHECK(moat_volume_mounts_check(ok, 2, &err) == 0, "good mounts: %s", moat_error_msg(err));
  static const char *bad_paths[] = {"/",      "//",     "rel",       "/proc",        "/proc/1",
                                    "/sys/",  "/dev/x", "/run/moat", "/run//moat/x", "/a/../b",
                                    "/a/./b", "/..",    "",          "/a\nb",        "/a\tb"};
  for (size_t i = 0; i < sizeof(bad_paths) / sizeof(bad_paths[0]); i++) {
    struct moat_volume_mount m = {"data", bad_paths[i], false};
    CHECK(moat_volume_mounts_check(&m, 1, &err) < 0 && err->status == EINVAL, "path '%s' refused",
          bad_paths[i]);
    moat_error_free(&err);
  }
  struct moat_volume_mount fine = {"data", "/run/moatx", false};
  CHECK(moat_volume_mounts_check(&fine, 1, &err) == 0, "/run/moatx is not /run/moat");
  static const char *bad_names[] = {"", "A", "-a", "a/b", ".a", "a b"};
  for (size_t i = 0; i < sizeof(bad_names) / sizeof(bad_names[0]); i++) {
    struct moat_volume_mount m = {bad_names[i], "/d", false};
    CHECK(moat_volume_mounts_check(&m, 1, &err) < 0, "name '%s' refused", bad_names[i]);
    moat_error_free(&err);
  }
  struct moat_volume_mount nine[9];
  for (int i = 0; i < 9; i++)
    nine[i] = (struct moat_volume_mount){"data", "/d", true};
  CHECK(moat_volume_mounts_check(nine, 9, &err) < 0, "nine volumes refused");
  moat_error_free(&err);
  CHECK(moat_volume_mounts_check(nine, 2, &err) < 0, "one path twice refused");
  moat_error_free(&err);
}

static void test_vfiles(const char *root_dir) {
  moat_error *err = NULL;
  _cleanup_free_ char *vol = xasprintf("%s/vol", root_dir);
  _cleanup_free_ char *outside = xasprintf("%s/outside", root_dir);
  mkdir(vol, 0755);
  write_file_once(outside, "secret", 0600, NULL);
  _cleanup_free_ char *l1 = xasprintf("%s/link", vol);
  _cleanup_free_ char *l2 = xasprintf("%s/up", vol);
  _cleanup_free_ char *l3 = xasprintf("%s/dirlink", vol);
  CHECK(symlink(outside, l1) == 0 && symlink("..", l2) == 0 && symlink(root_dir, l3) == 0, "links made");
  int root = open(vol, O_PATH | O_DIRECTORY | O_CLOEXEC);
  int fd = -1;
  bool is_dir = false;
  uint64_t size = 0;
  CHECK(moat_vfile_open(root, "/link", &fd, &is_dir, &size, &err) < 0 && err->status == ELOOP,
        "a link to a file outside: ELOOP (%s)", moat_error_msg(err));
  moat_error_free(&err);
  CHECK(moat_vfile_open(root, "up/outside", &fd, &is_dir, &size, &err) < 0, "through a '..' link: refused");
  moat_error_free(&err);
  CHECK(moat_vfile_open(root, "dirlink/outside", &fd, &is_dir, &size, &err) < 0,
        "through a dir link: refused");
  moat_error_free(&err);
  CHECK(moat_vfile_open(root, "../outside", &fd, &is_dir, &size, &err) < 0 && err->status == EINVAL,
        "'..': EINVAL");
  moat_error_free(&err);
  struct moat_vfile_writer *w = NULL;
  CHECK(moat_vfile_write_open(root, "dirlink/outside", 0644, &w, &err) < 0,
        "upload through a dir link: refused");
  moat_error_free(&err);
  CHECK(moat_vfile_write_open(root, "a/b/f", 0600, &w, &err) == 0 && moat_vfile_write(w, "hi", 2, &err) == 0,
        "upload with new parents");
  uint64_t written = 0;
  CHECK(w && moat_vfile_write_finish(w, &written, &err) == 0 && written == 2, "finish");
  moat_vfile_writer_close(w);
  CHECK(moat_vfile_open(root, "/a/b/f", &fd, &is_dir, &size, &err) == 0 && !is_dir && size == 2,
        "read it back");
  if (fd >= 0)
    close(fd);
  w = NULL;
  CHECK(moat_vfile_write_open(root, "a/b/f", 0600, &w, &err) == 0 && moat_vfile_write(w, "xyz", 3, &err) == 0,
        "an upload left unfinished");
  moat_vfile_writer_close(w);
  CHECK(moat_vfile_open(root, "/a/b/f", &fd, &is_dir, &size, &err) == 0 && size == 2, "keeps the old file");
  if (fd >= 0)
    close(fd);
  struct moat_file_entry *v = NULL;
  size_t n = 0;
  CHECK(moat_vfile_open(root, "/a/b", &fd, &is_dir, &size, &err) == 0 && is_dir &&
            moat_vfile_list(fd, "/a/b", &v, &n, &err) == 0 && n == 1 && strcmp(v[0].path, "/a/b/f") == 0,
        "list shows the file alone (no temporary left)");
  moat_file_entries_free(v, n);
  if (fd >= 0)
    close(fd);
  CHECK(moat_vfile_remove(root, "/link", &err) == 0 && access(outside, F_OK) == 0,
        "removing a link leaves its target (%s)", moat_error_msg(err));
  CHECK(moat_vfile_remove(root, "/a", &err) < 0 && err->status == ENOTEMPTY, "non-empty dir: ENOTEMPTY");
  moat_error_free(&err);
  CHECK(moat_vfile_remove(root, "/", &err) < 0 && err->status == EINVAL, "the root: EINVAL");
  moat_error_free(&err);
  _cleanup_free_ char *s = NULL;
  CHECK(read_file(outside, &s, NULL, NULL) == 0 && strcmp(s, "secret") == 0, "the outside file is untouched");
  close(root);
}

int main(void) {
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 1;
  }
  char *path = xasprintf("%s/moat.db", dir);
  struct moat_store *s = NULL;
  moat_error *err = NULL;
  CHECK(moat_store_open(&s, path, &err) == 0, "open a new store");
  if (s) {
    test_store(s);
    moat_store_close(s);
  }
  test_mounts_check();
  test_vfiles(dir);
  moat_error *e2 = NULL;
  rm_rf(dir, &e2);
  moat_error_free(&e2);
  moat_error_free(&err);
  free(path);
  return tap_done();
}

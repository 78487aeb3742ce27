/* fuzz_build_context.c -- libFuzzer target: a build context's tar (host/build_context.c), which
 * moatd unpacks from every template build a client posts, then COPY and ADD of all of it into a
 * scratch rootfs (host/build_copy.c).
 *
 * Input: the bytes of the context (tar, maybe compressed). Checks: open succeeds or fails with an
 * error carrying a status and a message, and a failed open leaves nothing under its work dir; a
 * context's files are expanded ("*", "."), hashed twice alike, its Dockerfile read, and it is
 * copied and ADDed into a rootfs; after each input nothing beside the work dir and the rootfs
 * changed (a sentinel file and directory next to them keep their content and stay alone), and
 * freeing the context empties the work dir. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/util.h"
#include "host/build_context.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char scratch[256], work[300], rootfs[300], sentinel[300];

static size_t count_entries(const char *path) {
  DIR *d = opendir(path);
  if (!d)
    abort();
  size_t n = 0;
  struct dirent *de;
  while ((de = readdir(d)))
    if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
      n++;
  closedir(d);
  return n;
}

static void cleanup(void) {
  moat_error *err = NULL;
  if (rm_rf(scratch, &err) < 0)
    moat_error_free(&err);
}

static void setup(void) {
  const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
  snprintf(scratch, sizeof(scratch), "%s/fuzz_build_context.XXXXXX", tmp);
  if (!mkdtemp(scratch))
    abort();
  atexit(cleanup);
  /* scratch/outer/{work,rootfs,sentinel}: a path escaping either lands in outer/ or scratch/. */
  char outer[280];
  snprintf(outer, sizeof(outer), "%s/outer", scratch);
  snprintf(work, sizeof(work), "%s/work", outer);
  snprintf(rootfs, sizeof(rootfs), "%s/rootfs", outer);
  snprintf(sentinel, sizeof(sentinel), "%s/sentinel", outer);
  if (mkdir(outer, 0700) < 0 || mkdir(work, 0700) < 0)
    abort();
  int fd = open(sentinel, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0 || write(fd, "sentinel", 8) != 8)
    abort();
  close(fd);
}

static void check_outside(void) {
  char outer[280];
  snprintf(outer, sizeof(outer), "%s/outer", scratch);
  char buf[16] = {0};
  int fd = open(sentinel, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0 || read(fd, buf, sizeof(buf)) != 8 || memcmp(buf, "sentinel", 8) != 0)
    abort();
  close(fd);
  /* outer holds work, sentinel and (while copying) rootfs; scratch holds outer alone. */
  if (count_entries(scratch) != 1 || count_entries(outer) > 3)
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!scratch[0])
    setup();
  int fd = memfd_create("ctx", MFD_CLOEXEC);
  if (fd < 0 || write_all(fd, data, size) < 0 || lseek(fd, 0, SEEK_SET) < 0)
    abort();
  struct moat_build_context *c = NULL;
  moat_error *err = NULL;
  int r = moat_build_context_open(&c, fd, work, 1 << 20, 256, &err);
  close(fd);
  if (r < 0) {
    if (c || !err || !err->msg || !err->status || count_entries(work) != 0)
      abort();
    moat_error_free(&err);
    check_outside();
    return 0;
  }
  if (!c || err || count_entries(work) != 1)
    abort();

  char *text = NULL;
  size_t len = 0;
  if (moat_build_context_read(c, "Dockerfile", &text, &len, 4096, &err) == 0) {
    if (!text || strlen(text) > len)
      abort();
    free(text);
  } else {
    moat_error_free(&err);
  }
  char *star[] = {"*", ".", "../x/../*"};
  char **v = NULL;
  if (moat_build_context_expand(c, star, 3, &v, &err) == 0) {
    size_t n = strv_len(v);
    uint8_t h1[32], h2[32];
    int a = moat_build_context_digest(c, v, n, NULL, h1, &err);
    moat_error_free(&err);
    int b = moat_build_context_digest(c, v, n, NULL, h2, &err);
    moat_error_free(&err);
    if (a != b || (a == 0 && memcmp(h1, h2, 32) != 0))
      abort();
    if (mkdir(rootfs, 0755) < 0)
      abort();
    int root = open(rootfs, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (root < 0)
      abort();
    struct moat_copy_opts o = {.dest = "/dst/", .workdir = "/"};
    if (moat_build_context_copy(c, root, v, n, &o, &err) < 0)
      moat_error_free(&err);
    o.add = true;
    o.dest = "add/";
    if (moat_build_context_copy(c, root, v, n, &o, &err) < 0)
      moat_error_free(&err);
    close(root);
    check_outside();
    if (rm_rf(rootfs, &err) < 0)
      abort();
    strv_free(v);
  } else {
    if (!err || !err->msg)
      abort();
    moat_error_free(&err);
  }
  moat_build_context_free(c);
  if (count_entries(work) != 0)
    abort();
  check_outside();
  return 0;
}

/* test_guest_files.c -- moat-guest --listen file operations: READ WRITE REMOVE LIST STAT MKDIR MOVE */
#include <sys/mount.h>

#include "test_guest_util.h"

static char P[8][512];

/* A path under the test dir (rotating buffers, so several can be live in one call). */
static const char *tp(const char *rel) {
  static int i;
  char *b = P[i++ % 8];
  snprintf(b, 512, "%s/%s", g_dir, rel);
  return b;
}

static bool exists(const char *p) {
  struct stat st;
  return lstat(p, &st) == 0;
}

static int count_dir(const char *dir) {
  size_t n = 0;
  struct f_entry *e = NULL;
  if (f_list(dir, NULL, 1, &e, &n) != 0)
    return -1;
  free(e);
  return (int)n;
}

static void test_round_trip(void) {
  size_t n = 20u << 20;
  uint8_t *data = xmalloc(n);
  random_bytes(data, n);
  uint64_t t0 = t_now_us();
  int w = f_write(tp("big/nested/file.bin"), data, n, NULL, -1, MOAT_PROTO_CHUNK);
  uint64_t t1 = t_now_us();
  char *back = NULL;
  size_t len = 0;
  uint64_t size = 0;
  uint32_t mode = 0;
  int r = f_read(tp("big/nested/file.bin"), NULL, &back, &len, &size, &mode);
  uint64_t t2 = t_now_us();
  CHECK(w == 0, "write 20 MiB (parents created) in %llu ms (%s)", (unsigned long long)(t1 - t0) / 1000,
        f_msg);
  CHECK(r == 0 && len == n && size == n && memcmp(back, data, n) == 0,
        "read back 20 MiB identical in %llu ms", (unsigned long long)(t2 - t1) / 1000);
  CHECK(mode == 0644, "default mode 0644 (%o)", mode);
  struct f_entry e;
  r = f_stat(tp("big/nested"), NULL, &e);
  CHECK(r == 0 && e.type == 'd' && e.mode == 0755, "parents made 0755 (%o)", e.mode);
  free(back);
  free(data);

  /* many small DATA frames */
  char small[5000];
  for (size_t i = 0; i < sizeof(small); i++)
    small[i] = (char)('a' + i % 26);
  CHECK(f_write(tp("small.txt"), small, sizeof(small), NULL, 0600, 7) == 0, "write in 7-byte frames");
  r = f_read(tp("small.txt"), NULL, &back, &len, NULL, &mode);
  CHECK(r == 0 && len == sizeof(small) && memcmp(back, small, len) == 0 && mode == 0600,
        "read back, mode 0600 (%o)", mode);
  free(back);
  char *eback = NULL;
  CHECK(f_write(tp("empty"), "", 0, NULL, -1, 1) == 0 &&
            f_read(tp("empty"), NULL, &eback, &len, NULL, NULL) == 0 && len == 0,
        "empty file round trip");
  free(eback);
}

static void test_atomic_replace(void) {
  const char *p = tp("replace/target.txt");
  CHECK(f_write(p, "old content", 11, NULL, 0640, 1024) == 0, "write old");
  CHECK(f_write(p, "new", 3, NULL, -1, 1024) == 0, "replace");
  char *back = NULL;
  size_t len;
  uint32_t mode = 0;
  f_read(p, NULL, &back, &len, NULL, &mode);
  CHECK(len == 3 && memcmp(back, "new", 3) == 0 && mode == 0640, "new content, existing mode kept (%o)",
        mode);
  free(back);

  /* an upload that fails midway (protocol error) leaves the old file and no temp file */
  int fd = g_connect();
  struct moat_msg m, rep;
  moat_msg_init(&m, MOAT_REQ_WRITE);
  moat_msg_init(&rep, 0);
  moat_msg_put_str(&m, MOAT_T_PATH, p);
  moat_msg_send(fd, &m);
  int st = f_reply(fd, &rep);
  moat_msg_send_data(fd, MOAT_MSG_DATA, "partial", 7);
  moat_msg_send_empty(fd, MOAT_REQ_PING); /* not DATA/END */
  int st2 = f_reply(fd, &rep);
  close(fd);
  CHECK(st == 0 && st2 == EPROTO, "bad frame inside upload -> EPROTO (%d)", st2);
  /* a host that vanishes mid-upload */
  fd = g_connect();
  moat_msg_send(fd, &m);
  f_reply(fd, &rep);
  moat_msg_send_data(fd, MOAT_MSG_DATA, "partial", 7);
  close(fd);
  usleep(100000);
  moat_msg_free(&m);
  moat_msg_free(&rep);
  f_read(p, NULL, &back, &len, NULL, NULL);
  CHECK(len == 3 && memcmp(back, "new", 3) == 0, "old content survives failed uploads");
  free(back);
  CHECK(count_dir(tp("replace")) == 1, "no temp files left (%d entries)", count_dir(tp("replace")));

  /* ENOSPC on a small tmpfs: error reported, old content kept */
  const char *mnt = tp("small-fs");
  mkdir(mnt, 0755);
  if (geteuid() != 0 || mount("tmpfs", mnt, "tmpfs", 0, "size=1m") < 0) {
    tap_skip("ENOSPC (cannot mount a tmpfs)");
    return;
  }
  const char *fp = tp("small-fs/f");
  f_write(fp, "keep", 4, NULL, -1, 1024);
  size_t n = 3u << 20;
  char *big = xcalloc(1, n);
  int e = f_write(fp, big, n, NULL, -1, 65536);
  CHECK(e == ENOSPC, "ENOSPC reported (%d: %s)", e, f_msg);
  f_read(fp, NULL, &back, &len, NULL, NULL);
  CHECK(len == 4 && memcmp(back, "keep", 4) == 0 && count_dir(mnt) == 1,
        "after ENOSPC: old content, no temp file");
  free(back);
  free(big);
  umount2(mnt, MNT_DETACH);
}

static void test_errors(void) {
  char *back = NULL;
  size_t len;
  CHECK(f_read(tp("missing"), NULL, &back, &len, NULL, NULL) == ENOENT, "read missing -> ENOENT");
  free(back);
  CHECK(f_read(g_dir, NULL, &back, &len, NULL, NULL) == EISDIR, "read dir -> EISDIR");
  free(back);
  mkdir(tp("adir"), 0755);
  CHECK(f_write(tp("adir"), "x", 1, NULL, -1, 1) == EISDIR, "write onto dir -> EISDIR");
  f_write(tp("afile"), "x", 1, NULL, -1, 1);
  CHECK(f_write(tp("afile/sub"), "x", 1, NULL, -1, 1) == ENOTDIR, "write below a file -> ENOTDIR (%s)",
        f_msg);
  struct f_entry *e;
  size_t n;
  CHECK(f_list(tp("afile"), NULL, 1, &e, &n) == ENOTDIR, "list a file -> ENOTDIR");
  free(e);
  CHECK(f_list(tp("nope"), NULL, 1, &e, &n) == ENOENT, "list missing -> ENOENT");
  free(e);
  CHECK(f_stat(tp("nope"), NULL, NULL) == ENOENT, "stat missing -> ENOENT");
  CHECK(f_simple(MOAT_REQ_REMOVE, tp("nope"), NULL, NULL, 0, NULL) == ENOENT, "remove missing -> ENOENT");
  CHECK(f_simple(MOAT_REQ_MOVE, tp("nope"), tp("nope2"), NULL, -1, NULL) == ENOENT, "move missing -> ENOENT");

  struct moat_msg m;
  moat_msg_init(&m, MOAT_REQ_STAT);
  moat_msg_put(&m, MOAT_T_PATH, "/tm\0p", 5);
  int st;
  struct moat_msg rep;
  moat_msg_init(&rep, 0);
  int fd = f_request(&m, &rep, &st);
  CHECK(st == EINVAL, "NUL in path -> EINVAL (%s)", f_msg);
  close(fd);
  moat_msg_reset(&m, MOAT_REQ_STAT);
  char *longp = xmalloc(5001);
  memset(longp, 'a', 5000);
  longp[0] = '/';
  longp[5000] = '\0';
  moat_msg_put_str(&m, MOAT_T_PATH, longp);
  fd = f_request(&m, &rep, &st);
  CHECK(st == EINVAL || st == ENAMETOOLONG, "path > 4096 -> EINVAL (%s)", f_msg);
  close(fd);
  moat_msg_reset(&m, MOAT_REQ_STAT);
  fd = f_request(&m, &rep, &st);
  CHECK(st == EINVAL, "missing path -> EINVAL");
  close(fd);
  free(longp);
  moat_msg_free(&m);
  moat_msg_free(&rep);
  CHECK(f_stat(g_dir, "no-such-user-moat", NULL) == EINVAL, "unknown user -> EINVAL (%s)", f_msg);
}

static void test_mkdir_list_stat(void) {
  CHECK(f_simple(MOAT_REQ_MKDIR, tp("m/a/b"), NULL, NULL, 0, NULL) == ENOENT,
        "mkdir without parents -> ENOENT");
  CHECK(f_simple(MOAT_REQ_MKDIR, tp("m/a/b"), NULL, NULL, 1, NULL) == 0, "mkdir -p");
  CHECK(f_simple(MOAT_REQ_MKDIR, tp("m/a/b"), NULL, NULL, 1, NULL) == 0, "mkdir -p on existing dir succeeds");
  CHECK(f_simple(MOAT_REQ_MKDIR, tp("m/a/b"), NULL, NULL, 0, NULL) == EEXIST, "mkdir on existing -> EEXIST");
  f_write(tp("m/a/file"), "hello", 5, NULL, -1, 5);
  CHECK(f_simple(MOAT_REQ_MKDIR, tp("m/a/file"), NULL, NULL, 1, NULL) == EEXIST,
        "mkdir -p on a file -> EEXIST");
  symlink("/etc", tp("m/a/link"));
  f_write(tp("m/a/b/deep"), "x", 1, NULL, -1, 1);

  struct f_entry *e;
  size_t n;
  int r = f_list(tp("m/a"), NULL, 0, &e, &n);
  CHECK(r == 0 && n == 3, "list depth 1: %zu entries", n);
  if (r == 0 && n == 3) {
    CHECK(strcmp(e[0].name, "b") == 0 && e[0].type == 'd' && strcmp(e[0].path, tp("m/a/b")) == 0,
          "entry b dir %s", e[0].path);
    CHECK(strcmp(e[1].name, "file") == 0 && e[1].type == 'f' && e[1].size == 5 && e[1].mode == 0644 &&
              e[1].uid == geteuid(),
          "entry file: size %llu mode %o", (unsigned long long)e[1].size, e[1].mode);
    CHECK(strcmp(e[2].name, "link") == 0 && e[2].type == 'l' && strcmp(e[2].link, "/etc") == 0,
          "entry link -> %s", e[2].link);
    int64_t now = (int64_t)time(NULL) * 1000;
    CHECK(e[1].mtime > now - 60000 && e[1].mtime <= now + 1000, "mtime in ms");
  }
  free(e);
  r = f_list(tp("m"), NULL, 3, &e, &n);
  CHECK(r == 0 && n == 5, "list depth 3: %zu entries (a, b, deep, file, link; link not followed)", n);
  if (r == 0 && n == 5)
    CHECK(strcmp(e[2].path, tp("m/a/b/deep")) == 0, "depth-first order: %s", e[2].path);
  free(e);
  r = f_list(tp("m/a/link"), NULL, 1, &e, &n);
  CHECK(r == 0 && n > 0, "list through a symlinked dir lists its target");
  free(e);

  struct f_entry s;
  CHECK(f_stat(tp("m/a/link"), NULL, &s) == 0 && s.type == 'l' && strcmp(s.link, "/etc") == 0,
        "stat does not follow");
  CHECK(f_stat(tp("m/./a//b/../file"), NULL, &s) == 0 && strcmp(s.path, tp("m/a/file")) == 0 &&
            strcmp(s.name, "file") == 0,
        "path normalised: %s", s.path);
  CHECK(f_stat("/", NULL, &s) == 0 && strcmp(s.path, "/") == 0 && s.type == 'd', "stat / (name %s)", s.name);
  CHECK(f_stat(".", NULL, &s) == 0 && strcmp(s.path, "/root") == 0,
        "relative path resolves against home (%s)", s.path);
}

static void test_move_remove(void) {
  f_write(tp("mv/src.txt"), "moved", 5, NULL, -1, 5);
  CHECK(f_simple(MOAT_REQ_MOVE, tp("mv/src.txt"), tp("mv/new/parent/dst.txt"), NULL, -1, NULL) == 0,
        "move creates parents");
  CHECK(!exists(tp("mv/src.txt")) && exists(tp("mv/new/parent/dst.txt")), "moved");

  f_write(tp("rm/file"), "x", 1, NULL, -1, 1);
  CHECK(f_simple(MOAT_REQ_REMOVE, tp("rm/file"), NULL, NULL, 0, NULL) == 0 && !exists(tp("rm/file")),
        "remove file");
  mkdir(tp("rm/empty"), 0755);
  CHECK(f_simple(MOAT_REQ_REMOVE, tp("rm/empty"), NULL, NULL, 0, NULL) == 0 && !exists(tp("rm/empty")),
        "remove empty dir");
  /* a tree holding a symlink to a directory outside it */
  f_write(tp("outside/precious"), "keep", 4, NULL, -1, 4);
  f_write(tp("rm/tree/a/b/c"), "x", 1, NULL, -1, 1);
  symlink(tp("outside"), tp("rm/tree/a/escape"));
  symlink(tp("outside"), tp("rm/dirlink"));
  CHECK(f_simple(MOAT_REQ_REMOVE, tp("rm/tree"), NULL, NULL, 0, NULL) == ENOTEMPTY,
        "non-empty without recursive -> ENOTEMPTY");
  CHECK(f_simple(MOAT_REQ_REMOVE, tp("rm/tree"), NULL, NULL, 1, NULL) == 0 && !exists(tp("rm/tree")),
        "recursive remove");
  CHECK(exists(tp("outside/precious")), "recursive remove does not follow symlinks");
  CHECK(f_simple(MOAT_REQ_REMOVE, tp("rm/dirlink"), NULL, NULL, 1, NULL) == 0 && !exists(tp("rm/dirlink")) &&
            exists(tp("outside/precious")),
        "removing a symlink to a dir removes the link only");
  if (geteuid() == 0) {
    mkdir(tp("rm/mnt"), 0755);
    mkdir(tp("rm/mnt/m"), 0755);
    if (mount("tmpfs", tp("rm/mnt/m"), "tmpfs", 0, "size=1m") == 0) {
      int r = f_simple(MOAT_REQ_REMOVE, tp("rm/mnt"), NULL, NULL, 1, NULL);
      CHECK(r == EBUSY && exists(tp("rm/mnt/m")), "recursive remove stops at a mount point (%d %s)", r,
            f_msg);
      umount2(tp("rm/mnt/m"), MNT_DETACH);
    }
  }
  CHECK(f_simple(MOAT_REQ_REMOVE, "/", NULL, NULL, 1, NULL) == EBUSY, "refuses to remove /");
}

static void test_user_files(void) {
  if (geteuid() != 0) {
    tap_skip("files as nobody (not root)");
    return;
  }
  mkdir(tp("shared"), 0777);
  chmod(tp("shared"), 0777);
  CHECK(f_write(tp("shared/sub/by-nobody"), "n", 1, "nobody", -1, 1) == 0, "nobody writes in a 0777 dir");
  struct f_entry s;
  int r = f_stat(tp("shared/sub/by-nobody"), NULL, &s);
  CHECK(r == 0 && s.uid == 65534 && s.gid == 65534, "file owned by nobody (%u:%u)", s.uid, s.gid);
  CHECK(f_stat(tp("shared/sub"), NULL, &s) == 0 && s.uid == 65534, "parent made by nobody owned by nobody");
  CHECK(f_write(tp("root-only/x"), "n", 1, "nobody", -1, 1) == EACCES,
        "nobody cannot write in root's dir (%s)", f_msg);
  f_write(tp("secret"), "s", 1, NULL, 0600, 1);
  char *b = NULL;
  size_t len;
  CHECK(f_read(tp("secret"), "nobody", &b, &len, NULL, NULL) == EACCES,
        "nobody cannot read a 0600 root file");
  free(b);
  CHECK(f_simple(MOAT_REQ_REMOVE, tp("secret"), NULL, "nobody", 0, NULL) == EACCES,
        "nobody cannot remove it");
  /* root replacing nobody's file keeps the owner */
  r = f_write(tp("shared/sub/by-nobody"), "r", 1, NULL, -1, 1);
  CHECK(r == 0 && f_stat(tp("shared/sub/by-nobody"), NULL, &s) == 0 && s.uid == 65534,
        "root's replace keeps the owner (%u)", s.uid);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  g_start();
  test_round_trip();
  test_atomic_replace();
  test_errors();
  test_mkdir_list_stat();
  test_move_remove();
  test_user_files();
  g_stop();
  return tap_done();
}

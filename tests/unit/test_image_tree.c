/* test_image_tree.c -- image trees: a clone shares regular files as hard links and keeps the rest
 * (symlinks not followed, modes, owners, times, xattrs, EMLINK copied once); applying an overlay
 * layer deletes, replaces and merges as overlayfs shows it, never follows a symlink of the root
 * (nothing is written outside the test's root), never writes a shared file in place, keeps the
 * layer's hard links, drops overlay xattrs and refuses redirect / metacopy; sizes count inodes once.
 * Needs root (owners, trusted.* xattrs, whiteouts): skipped otherwise. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "host/image_tree.h"

#include "tap.h"

#define check(...) CHECK(__VA_ARGS__)

static char root[256], outside[256];
static int root_fd = -1;

static char *at(const char *rel) { return xasprintf("%s/%s", root, rel); }

static void die(const char *what) {
  perror(what);
  exit(2);
}

static void mkd(const char *rel, mode_t mode) {
  _cleanup_free_ char *p = at(rel);
  if (mkdir(p, mode) < 0 || chmod(p, mode) < 0)
    die(p);
}

static void put(const char *rel, const char *content, mode_t mode) {
  _cleanup_free_ char *p = at(rel);
  int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0 || write_all(fd, content, strlen(content)) < 0 || fchmod(fd, mode) < 0)
    die(p);
  close(fd);
}

static void ln(const char *target, const char *rel) {
  _cleanup_free_ char *p = at(rel);
  if (symlink(target, p) < 0)
    die(p);
}

static void hard(const char *from, const char *to) {
  _cleanup_free_ char *a = at(from), *b = at(to);
  if (link(a, b) < 0)
    die(b);
}

static void own(const char *rel, uid_t u, gid_t g) {
  _cleanup_free_ char *p = at(rel);
  if (lchown(p, u, g) < 0)
    die(p);
}

static void whiteout(const char *rel) {
  _cleanup_free_ char *p = at(rel);
  if (mknod(p, S_IFCHR | 0600, makedev(0, 0)) < 0)
    die(p);
}

static void xset(const char *rel, const char *name, const char *val) {
  _cleanup_free_ char *p = at(rel);
  if (lsetxattr(p, name, val, strlen(val), 0) < 0)
    die(p);
}

static bool xhas(const char *rel, const char *name, const char *val) {
  _cleanup_free_ char *p = at(rel);
  char buf[256];
  ssize_t n = lgetxattr(p, name, buf, sizeof(buf) - 1);
  if (n < 0)
    return false;
  buf[n] = '\0';
  return !val || strcmp(buf, val) == 0;
}

static bool lst(const char *rel, struct stat *st) {
  _cleanup_free_ char *p = at(rel);
  return lstat(p, st) == 0;
}

static bool exists(const char *rel) {
  struct stat st;
  return lst(rel, &st);
}

static ino_t ino(const char *rel) {
  struct stat st;
  return lst(rel, &st) ? st.st_ino : 0;
}

static bool content_is(const char *rel, const char *want) {
  _cleanup_free_ char *p = at(rel), *s = NULL;
  moat_error *err = NULL;
  if (read_file(p, &s, NULL, &err) < 0) {
    moat_error_free(&err);
    return false;
  }
  return strcmp(s, want) == 0;
}

static bool link_is(const char *rel, const char *want) {
  _cleanup_free_ char *p = at(rel);
  char buf[256];
  ssize_t n = readlink(p, buf, sizeof(buf) - 1);
  if (n < 0)
    return false;
  buf[n] = '\0';
  return strcmp(buf, want) == 0;
}

/* Entries beneath dir (not counting it); -1 when it cannot be read. */
static long count_tree(const char *path) {
  _cleanup_close_ int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0)
    return -1;
  DIR *d = fdopendir(dup(fd));
  if (!d)
    return -1;
  long n = 0;
  struct dirent *de;
  while ((de = readdir(d)) != NULL) {
    if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
      continue;
    n++;
    if (de->d_type == DT_DIR) {
      _cleanup_free_ char *sub = xasprintf("%s/%s", path, de->d_name);
      long m = count_tree(sub);
      n += m > 0 ? m : 0;
    }
  }
  closedir(d);
  return n;
}

/* The parent image "a": the clone's source and, after the clone, what apply must leave alone. */
static void make_parent(void) {
  mkd("a", 0755);
  mkd("a/etc", 0755);
  put("a/etc/passwd", "root:x:0:0\n", 0644);
  put("a/etc/conf", "old", 0640);
  own("a/etc/conf", 1000, 1001);
  xset("a/etc", "user.foo", "1");
  xset("a/etc", "trusted.bar", "2");
  mkd("a/bin", 0755);
  put("a/bin/tool", "#!/bin/sh\n", 04755);
  hard("a/bin/tool", "a/bin/tool2");
  ln("/", "a/root-link");
  ln("etc/passwd", "a/rel-link");
  own("a/rel-link", 7, 8);
  mkd("a/private", 0700);
  own("a/private", 5, 6);
  _cleanup_free_ char *fifo = at("a/fifo");
  if (mkfifo(fifo, 0620) < 0 || chmod(fifo, 0620) < 0)
    die(fifo);
  mkd("a/deldir", 0755);
  mkd("a/deldir/x", 0755);
  put("a/deldir/x/y", "y", 0644);
  put("a/delfile", "gone", 0644);
  mkd("a/opq", 0755);
  put("a/opq/old1", "1", 0644);
  mkd("a/opq/sub", 0755);
  put("a/opq/sub/old2", "2", 0644);
  ln(outside, "a/sym-out");   /* the layer has a directory here */
  ln(outside, "a/del-out");   /* the layer has a whiteout here */
  ln(outside, "a/opq-out");   /* the layer has an opaque directory here */
  ln(outside, "a/file-out");  /* the layer has a file here */
  put("a/f2d", "file", 0644); /* the layer has a directory here */
  mkd("a/d2f", 0755);         /* the layer has a file here */
  put("a/d2f/inner", "i", 0644);
  struct timespec ts[2] = {{.tv_sec = 1000000000}, {.tv_sec = 1000000000}};
  _cleanup_free_ char *priv = at("a/private");
  utimensat(AT_FDCWD, priv, ts, 0);
}

static void test_clone(void) {
  moat_error *err = NULL;
  int ret = moat_image_tree_clone(root_fd, root_fd, "a", &err);
  check(ret < 0 && err && err->status == EEXIST, "clone onto an existing name fails (%s)",
        err ? moat_error_msg(err) : "none");
  moat_error_free(&err);
  mkd("c", 0755);
  _cleanup_close_ int cfd = openat(root_fd, "c", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ret = moat_image_tree_clone(root_fd, cfd, "a", &err);
  check(ret == 0, "clone a -> c/a: %s", ret == 0 ? "ok" : moat_error_msg(err));
  moat_error_free(&err);
}

static void check_clone(const char *src, const char *dst) {
  char s[64], d[64];
#define P(buf, base, rel) (snprintf(buf, sizeof(buf), "%s/%s", base, rel), buf)
  check(ino(P(s, src, "etc/passwd")) == ino(P(d, dst, "etc/passwd")) && ino(s) != 0,
        "clone: a regular file is a hard link to the source's inode");
  check(ino(P(s, src, "bin/tool")) == ino(P(d, dst, "bin/tool2")) &&
            ino(P(s, dst, "bin/tool")) == ino(P(d, dst, "bin/tool2")),
        "clone: hard-linked names stay one inode");
  struct stat st;
  check(lst(P(d, dst, "root-link"), &st) && S_ISLNK(st.st_mode) && link_is(d, "/"),
        "clone: a symlink to / is a symlink to / (not followed)");
  _cleanup_free_ char *sp = at(src), *dp = at(dst);
  long ns = count_tree(sp), nd = count_tree(dp);
  check(ns > 0 && ns == nd, "clone: as many entries as the source (%ld, %ld): nothing followed", ns, nd);
  check(lst(P(d, dst, "rel-link"), &st) && S_ISLNK(st.st_mode) && st.st_uid == 7 && st.st_gid == 8 &&
            link_is(d, "etc/passwd"),
        "clone: a symlink keeps its target and owner (uid %u)", (unsigned)st.st_uid);
  struct stat a, b;
  check(lst(P(s, src, "private"), &a) && lst(P(d, dst, "private"), &b) && a.st_ino != b.st_ino &&
            (b.st_mode & 07777) == 0700 && b.st_uid == 5 && b.st_gid == 6 && b.st_mtim.tv_sec == 1000000000,
        "clone: a directory is new with the same mode (%o), owner and mtime", (unsigned)(b.st_mode & 07777));
  check(lst(P(d, dst, "fifo"), &b) && S_ISFIFO(b.st_mode) && (b.st_mode & 07777) == 0620,
        "clone: a fifo is a fifo with its mode");
  check(lst(P(d, dst, "bin/tool"), &b) && (b.st_mode & 07777) == 04755,
        "clone: setuid bit kept (shared inode)");
  check(xhas(P(d, dst, "etc"), "user.foo", "1") && xhas(d, "trusted.bar", "2"),
        "clone: user.* and trusted.* xattrs of a directory kept");
  check(lst(P(d, dst, "sym-out"), &b) && S_ISLNK(b.st_mode),
        "clone: a symlink out of the tree stays a symlink");
#undef P
}

/* The layer: what a RUN step left in its upper dir. */
static void make_layer(void) {
  mkd("layer", 0755);
  whiteout("layer/delfile");
  whiteout("layer/deldir");
  whiteout("layer/del-out");
  whiteout("layer/never-there");
  mkd("layer/opq", 0750);
  xset("layer/opq", "user.overlay.opaque", "y");
  put("layer/opq/new1", "n", 0644);
  mkd("layer/opq-out", 0755);
  xset("layer/opq-out", "user.overlay.opaque", "y");
  mkd("layer/sym-out", 0755);
  put("layer/sym-out/planted", "p", 0644);
  mkd("layer/sym-out/deeper", 0755);
  put("layer/sym-out/deeper/planted2", "p", 0644);
  put("layer/file-out", "f", 0644);
  mkd("layer/etc", 0711);
  own("layer/etc", 0, 42);
  xset("layer/etc", "user.bar", "3"); /* user.foo was removed in the sandbox */
  xset("layer/etc", "trusted.bar", "2");
  put("layer/etc/conf", "new", 0600);
  put("layer/etc/marked", "m", 0644);
  xset("layer/etc/marked", "user.overlay.origin", "x");
  xset("layer/etc/marked", "user.keep", "k");
  mkd("layer/new", 0755);
  put("layer/new/pair1", "pp", 0644);
  hard("layer/new/pair1", "layer/new/pair2");
  ln("/etc/shadow", "layer/new/link");
  mkd("layer/f2d", 0755);
  put("layer/f2d/in", "in", 0644);
  put("layer/d2f", "now a file", 0644);
}

static void test_apply(void) {
  make_layer();
  ino_t pair_ino = ino("layer/new/pair1");
  ino_t conf_a = ino("a/etc/conf");
  moat_error *err = NULL;
  int ret = moat_image_tree_apply(root_fd, "c/a", root_fd, "layer", &err);
  check(ret == 0, "apply the layer to the clone: %s", ret == 0 ? "ok" : moat_error_msg(err));
  moat_error_free(&err);
  struct stat st;
  check(!exists("c/a/delfile") && exists("a/delfile"), "whiteout removes a file (the source keeps it)");
  check(!exists("c/a/deldir") && content_is("a/deldir/x/y", "y"), "whiteout removes a directory tree");
  check(!exists("c/a/del-out") && exists("a/del-out"), "whiteout over a symlink out removes the link");
  check(!exists("c/a/never-there"), "a whiteout never lands in the image");
  check(content_is("c/a/opq/new1", "n") && !exists("c/a/opq/old1") && !exists("c/a/opq/sub") &&
            exists("a/opq/sub/old2"),
        "opaque directory replaces what was there");
  check(lst("c/a/opq", &st) && (st.st_mode & 07777) == 0750, "opaque directory has the layer's mode");
  check(!xhas("c/a/opq", "user.overlay.opaque", NULL) && !xhas("c/a/opq-out", "user.overlay.opaque", NULL),
        "user.overlay.opaque is not copied into the image");
  check(lst("c/a/sym-out", &st) && S_ISDIR(st.st_mode) && content_is("c/a/sym-out/planted", "p") &&
            content_is("c/a/sym-out/deeper/planted2", "p"),
        "directory over a symlink replaces the symlink");
  check(lst("c/a/opq-out", &st) && S_ISDIR(st.st_mode), "opaque directory over a symlink replaces it");
  check(lst("c/a/file-out", &st) && S_ISREG(st.st_mode), "file over a symlink replaces it");
  long n_out = count_tree(outside);
  _cleanup_free_ char *keep = xasprintf("%s/keep", outside), *keep_s = NULL;
  moat_error *e2 = NULL;
  bool keep_ok = read_file(keep, &keep_s, NULL, &e2) == 0 && strcmp(keep_s, "outside") == 0;
  moat_error_free(&e2);
  check(n_out == 1 && keep_ok, "nothing written or removed outside the test root (%ld entries there)", n_out);
  check(content_is("c/a/etc/conf", "new") && content_is("a/etc/conf", "old") && ino("a/etc/conf") == conf_a &&
            ino("c/a/etc/conf") != conf_a,
        "file replaces file: a new inode; the clone's source keeps the old content and inode");
  check(lst("a/etc/conf", &st) && (st.st_mode & 07777) == 0640 && st.st_uid == 1000,
        "the replaced file's old inode keeps its mode and owner");
  check(content_is("c/a/etc/passwd", "root:x:0:0\n") && ino("c/a/etc/passwd") == ino("a/etc/passwd"),
        "directory over directory merges (untouched files stay shared)");
  check(lst("c/a/etc", &st) && (st.st_mode & 07777) == 0711 && st.st_gid == 42 &&
            xhas("c/a/etc", "user.bar", "3") && !xhas("c/a/etc", "user.foo", NULL) &&
            xhas("c/a/etc", "trusted.bar", "2"),
        "merged directory takes the layer's mode, owner and xattrs");
  check(lst("a/etc", &st) && (st.st_mode & 07777) == 0755 && xhas("a/etc", "user.foo", "1"),
        "the source's directory is unchanged");
  check(!xhas("c/a/etc/marked", "user.overlay.origin", NULL) && xhas("c/a/etc/marked", "user.keep", "k"),
        "a moved file loses user.overlay.* and keeps its other xattrs");
  check(ino("c/a/new/pair1") == pair_ino && ino("c/a/new/pair2") == pair_ino,
        "a hard-linked pair of the layer stays linked (moved, not copied)");
  check(link_is("c/a/new/link", "/etc/shadow"), "a symlink of the layer is moved as a symlink");
  check(lst("c/a/f2d", &st) && S_ISDIR(st.st_mode) && content_is("c/a/f2d/in", "in") &&
            content_is("a/f2d", "file"),
        "directory over a file replaces it");
  check(content_is("c/a/d2f", "now a file") && content_is("a/d2f/inner", "i"),
        "file over a directory replaces it");
}

static void test_refused(void) {
  mkd("img2", 0755);
  put("img2/f", "f", 0644);
  mkd("l2", 0755);
  mkd("l2/x", 0755);
  xset("l2/x", "user.overlay.redirect", "/y");
  put("l2/moved", "m", 0644);
  moat_error *err = NULL;
  errno = 0;
  int ret = moat_image_tree_apply(root_fd, "img2", root_fd, "l2", &err);
  check(ret < 0 && err && err->status == EINVAL && strstr(moat_error_msg(err), "/x") &&
            strstr(moat_error_msg(err), "redirect"),
        "a redirect xattr is refused with EINVAL naming the path (%s)", err ? moat_error_msg(err) : "none");
  moat_error_free(&err);
  check(!exists("img2/moved") && !exists("img2/x") && exists("l2/moved"), "a refused layer changes nothing");
  mkd("l3", 0755);
  mkd("l3/d", 0755);
  put("l3/d/meta", "", 0644);
  xset("l3/d/meta", "user.overlay.metacopy", "");
  ret = moat_image_tree_apply(root_fd, "img2", root_fd, "l3", &err);
  check(ret < 0 && err && err->status == EINVAL && strstr(moat_error_msg(err), "/d/meta"),
        "a metacopy xattr is refused with EINVAL naming the path (%s)", err ? moat_error_msg(err) : "none");
  moat_error_free(&err);
  ret = moat_image_tree_apply(root_fd, "a/root-link", root_fd, "l3", &err);
  check(ret < 0, "an image root that is a symlink is refused, not followed (%s)",
        err ? moat_error_msg(err) : "none");
  moat_error_free(&err);
}

static void test_size(void) {
  mkd("s", 0755);
  put("s/a", "0123456789", 0644);
  hard("s/a", "s/a2");
  put("s/b", "01234", 0644);
  ln("abc", "s/l");
  mkd("s/d", 0755);
  put("s/d/c", "xy", 0644);
  _cleanup_close_ int fd = openat(root_fd, "s", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  unsigned long long n1 = moat_image_tree_size(fd);
  check(n1 == 10 + 5 + 3 + 2, "size counts a hard-linked file once (%llu bytes)", n1);
  moat_error *err = NULL;
  mkd("s2", 0755);
  _cleanup_close_ int s2 = openat(root_fd, "s2", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (moat_image_tree_clone(fd, s2, "d", &err) < 0) {
    fprintf(stderr, "%s\n", moat_error_msg(err));
    moat_error_free(&err);
  }
  unsigned long long n2 = moat_image_tree_size(fd);
  check(n2 == n1, "size of a tree whose files another tree links is unchanged (%llu bytes)", n2);
  check(fcntl(fd, F_GETFD) >= 0, "the size's dir fd stays the caller's (still open)");
}

/* A source inode at ext4's link limit: the clone copies it once and links its other names there. */
static void test_emlink(void) {
  mkd("e", 0755);
  mkd("e/img", 0755);
  put("e/img/f", "data", 0644);
  xset("e/img/f", "user.x", "1");
  hard("e/img/f", "e/img/g");
  mkd("e/pad", 0755);
  _cleanup_close_ int img = openat(root_fd, "e/img", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  _cleanup_close_ int pad = openat(root_fd, "e/pad", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  int made = 0;
  for (; made < 70000; made++) {
    char name[16];
    snprintf(name, sizeof(name), "%d", made);
    if (linkat(img, "f", pad, name, 0) < 0)
      break;
  }
  if (errno != EMLINK || made >= 70000) {
    tap_skip("the file system has no link limit below 70000 (%s)", strerror(errno));
    return;
  }
  moat_error *err = NULL;
  _cleanup_close_ int e = openat(root_fd, "e", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  mkd("e/out", 0755);
  _cleanup_close_ int out = openat(root_fd, "e/out", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  int ret = moat_image_tree_clone(e, out, "img", &err);
  check(ret == 0, "clone of an inode at its link limit (%d links): %s", made + 2,
        ret == 0 ? "ok" : moat_error_msg(err));
  moat_error_free(&err);
  struct stat f, g, src;
  check(lst("e/out/img/f", &f) && lst("e/out/img/g", &g) && lst("e/img/f", &src) && f.st_ino == g.st_ino &&
            f.st_ino != src.st_ino && f.st_nlink == 2 && content_is("e/out/img/f", "data") &&
            (f.st_mode & 07777) == 0644 && xhas("e/out/img/f", "user.x", "1"),
        "EMLINK: one copy (same content, mode, xattrs), its names linked to each other");
  _cleanup_free_ char *p = at("e/pad");
  if (rm_rf(p, &err) < 0)
    moat_error_free(&err);
}

int main(void) {
  moat_log_set_level(MOAT_LOG_WARN);
  if (geteuid() != 0) {
    printf("1..0 # SKIP needs root (owners, trusted.* xattrs, whiteouts)\n");
    return 77;
  }
  snprintf(root, sizeof(root), "/tmp/moat-test-image-tree-XXXXXX");
  snprintf(outside, sizeof(outside), "/tmp/moat-test-image-tree-outside-XXXXXX");
  if (!mkdtemp(root) || !mkdtemp(outside))
    die("mkdtemp");
  if (chdir(root) < 0)
    die(root);
  _cleanup_free_ char *keep = xasprintf("%s/keep", outside);
  moat_error *err = NULL;
  if (write_file_once(keep, "outside", 0644, &err) < 0) {
    fprintf(stderr, "%s\n", moat_error_msg(err));
    return 2;
  }
  root_fd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (root_fd < 0)
    die(root);

  make_parent();
  test_clone();
  check_clone("a", "c/a");
  test_apply();
  test_refused();
  test_size();
  test_emlink();

  close(root_fd);
  if (chdir("/") < 0)
    die("/");
  if (rm_rf(root, &err) < 0 || rm_rf(outside, &err) < 0) {
    fprintf(stderr, "cleanup: %s\n", moat_error_msg(err));
    moat_error_free(&err);
  }
  return tap_done();
}

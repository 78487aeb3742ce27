/* test_build_context.c -- build contexts (host/build_context.c, build_copy.c): unpacking a tar with
 * every refusal, reading the Dockerfile, expanding COPY sources, the COPY digest, and COPY/ADD into a
 * fake rootfs holding hostile symlinks, checking that nothing outside the rootfs changes */
#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "common/util.h"
#include "host/build_context.h"

#include "tap.h"

/* A tar entry: type 'f' file, 'd' dir, 'l' symlink, 'h' hard link, 'c' char device, 'p' fifo;
 * data is a file's content or a link's target; size (when not 0) is the size the header declares
 * (the data written is then size bytes of 'x'). */
struct ent {
  char type;
  const char *name;
  const char *data;
  int mode;
  int64_t size;
  int64_t mtime;
};

static char scratch[4096]; /* a temp directory for everything */
static char last_err[1024];
static int last_status;

/* A memfd holding the tar of ents (filter "gzip", "zstd", ... or NULL), at offset 0. */
static int make_tar(const struct ent *ents, size_t n, const char *filter) {
  int fd = memfd_create("tar", MFD_CLOEXEC);
  struct archive *a = archive_write_new();
  archive_write_set_format_pax_restricted(a);
  if (filter)
    archive_write_add_filter_by_name(a, filter);
  archive_write_open_fd(a, fd);
  char *big = NULL;
  for (size_t i = 0; i < n; i++) {
    const struct ent *e = &ents[i];
    struct archive_entry *ae = archive_entry_new();
    archive_entry_set_pathname(ae, e->name);
    archive_entry_set_mtime(ae, e->mtime ? e->mtime : 1700000000, 0);
    archive_entry_set_uid(ae, 1000);
    archive_entry_set_gid(ae, 1000);
    int64_t size = 0;
    switch (e->type) {
    case 'f':
      archive_entry_set_filetype(ae, AE_IFREG);
      archive_entry_set_perm(ae, e->mode ? (mode_t)e->mode : 0644);
      size = e->size ? e->size : (int64_t)strlen(e->data ? e->data : "");
      break;
    case 'd':
      archive_entry_set_filetype(ae, AE_IFDIR);
      archive_entry_set_perm(ae, e->mode ? (mode_t)e->mode : 0755);
      break;
    case 'l':
      archive_entry_set_filetype(ae, AE_IFLNK);
      archive_entry_set_perm(ae, 0777);
      archive_entry_set_symlink(ae, e->data);
      break;
    case 'h':
      archive_entry_set_filetype(ae, AE_IFREG);
      archive_entry_set_perm(ae, 0644);
      archive_entry_set_hardlink(ae, e->data);
      break;
    case 'c':
      archive_entry_set_filetype(ae, AE_IFCHR);
      archive_entry_set_perm(ae, 0666);
      archive_entry_set_rdev(ae, makedev(1, 3));
      break;
    case 'p':
      archive_entry_set_filetype(ae, AE_IFIFO);
      archive_entry_set_perm(ae, 0644);
      break;
    }
    archive_entry_set_size(ae, size);
    archive_write_header(a, ae);
    if (e->type == 'f' && size > 0) {
      if (e->size) {
        big = xrealloc(big, (size_t)size);
        memset(big, 'x', (size_t)size);
        archive_write_data(a, big, (size_t)size);
      } else {
        archive_write_data(a, e->data, (size_t)size);
      }
    }
    archive_entry_free(ae);
  }
  free(big);
  archive_write_close(a);
  archive_write_free(a);
  lseek(fd, 0, SEEK_SET);
  return fd;
}

/* Opens a context from ents into work (NULL on failure: last_err, last_status). */
static struct moat_build_context *open_ctx(const struct ent *ents, size_t n, const char *filter,
                                           const char *work, uint64_t max_bytes, size_t max_entries) {
  int fd = make_tar(ents, n, filter);
  struct moat_build_context *c = NULL;
  moat_error *err = NULL;
  last_status = 0;
  last_err[0] = '\0';
  if (moat_build_context_open(&c, fd, work, max_bytes, max_entries, &err) < 0) {
    snprintf(last_err, sizeof(last_err), "%s", moat_error_msg(err));
    last_status = err ? err->status : -1;
    moat_error_free(&err);
  }
  close(fd);
  return c;
}

static bool dir_empty(const char *path) {
  DIR *d = opendir(path);
  if (!d)
    return false;
  struct dirent *de;
  int n = 0;
  while ((de = readdir(d)))
    if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
      n++;
  closedir(d);
  return n == 0;
}

static char *slurp(const char *path) {
  char *s = NULL;
  size_t len;
  moat_error *err = NULL;
  if (read_file(path, &s, &len, &err) < 0)
    moat_error_free(&err);
  return s;
}

static bool file_is(const char *path, const char *want) {
  char *s = slurp(path);
  bool ok = s && strcmp(s, want) == 0;
  free(s);
  return ok;
}

static bool link_is(const char *path, const char *want) {
  char buf[4096];
  ssize_t r = readlink(path, buf, sizeof(buf) - 1);
  if (r < 0)
    return false;
  buf[r] = '\0';
  return strcmp(buf, want) == 0;
}

static mode_t mode_at(const char *path) {
  struct stat st;
  if (lstat(path, &st) < 0)
    return (mode_t)-1;
  return st.st_mode;
}

static const struct ent good[] = {
    {'d', "./", NULL, 0755, 0, 0},
    {'f', "Dockerfile", "FROM base\nCOPY . /app\n", 0644, 0, 0},
    {'d', "src/", NULL, 0750, 0, 0},
    {'f', "src/main.c", "int main(void) { return 0; }\n", 0600, 0, 0},
    {'f', "src/run.sh", "#!/bin/sh\necho hi\n", 04755, 0, 0},
    {'f', "deep/er/file.txt", "deep\n", 0644, 0, 0}, /* parents without entries */
    {'l', "src/link", "main.c", 0, 0, 0},
    {'l', "top", "src/../deep/er", 0, 0, 0},
    {'l', "deep/er/up", "../../src", 0, 0, 0},
    {'h', "src/hard", "src/main.c", 0, 0, 0},
    {'f', "a.txt", "A\n", 0644, 0, 0},
    {'f', "b.txt", "B\n", 0644, 0, 0},
    {'f', ".hidden.txt", "H\n", 0644, 0, 0},
    {'f', "dup", "first\n", 0644, 0, 0},
    {'f', "dup", "second\n", 0644, 0, 0},
};

static char work[4200];

static void test_good(void) {
  const char *filters[] = {NULL, "gzip", "bzip2", "xz", "zstd"};
  for (size_t f = 0; f < ARRAY_SIZE(filters); f++) {
    struct moat_build_context *c = open_ctx(good, ARRAY_SIZE(good), filters[f], work, 1 << 20, 100);
    if (!CHECK(c != NULL, "a good context opens (%s): %s", filters[f] ? filters[f] : "plain", last_err))
      continue;
    const char *d = moat_build_context_dir(c);
    char p[4600];
    bool ok = strncmp(d, work, strlen(work)) == 0 && (mode_at(d) & 07777) == 0700;
    snprintf(p, sizeof(p), "%s/src/main.c", d);
    ok = ok && file_is(p, "int main(void) { return 0; }\n") && (mode_at(p) & 07777) == 0600;
    struct stat st1, st2;
    ok = ok && stat(p, &st1) == 0 && st1.st_uid == getuid();
    snprintf(p, sizeof(p), "%s/src/hard", d);
    ok = ok && stat(p, &st2) == 0 && st1.st_ino == st2.st_ino;
    snprintf(p, sizeof(p), "%s/src/run.sh", d);
    ok = ok && (mode_at(p) & 07777) == 04755;
    snprintf(p, sizeof(p), "%s/src", d);
    ok = ok && S_ISDIR(mode_at(p)) && (mode_at(p) & 07777) == 0750;
    snprintf(p, sizeof(p), "%s/deep/er", d);
    ok = ok && (mode_at(p) & 07777) == 0755;
    snprintf(p, sizeof(p), "%s/src/link", d);
    ok = ok && S_ISLNK(mode_at(p)) && link_is(p, "main.c");
    snprintf(p, sizeof(p), "%s/top", d);
    ok = ok && link_is(p, "src/../deep/er");
    snprintf(p, sizeof(p), "%s/dup", d);
    ok = ok && file_is(p, "second\n");
    CHECK(ok, "files, modes (setuid kept), owner, hard link, symlinks, a later duplicate wins (%s)",
          filters[f] ? filters[f] : "plain");
    char *dir = xstrdup(d);
    moat_build_context_free(c);
    CHECK(access(dir, F_OK) != 0 && dir_empty(work), "free removes the directory");
    free(dir);
  }
  int fd = memfd_create("empty", MFD_CLOEXEC);
  struct moat_build_context *c = NULL;
  moat_error *err = NULL;
  CHECK(moat_build_context_open(&c, fd, work, 100, 10, &err) == 0 && c,
        "an empty input is an empty context: %s", err ? moat_error_msg(err) : "");
  moat_error_free(&err);
  close(fd);
  moat_build_context_free(c);
}

static void refused(const struct ent *ents, size_t n, int status, const char *what, const char *desc,
                    uint64_t max_bytes, size_t max_entries) {
  struct moat_build_context *c = open_ctx(ents, n, NULL, work, max_bytes, max_entries);
  CHECK(!c && last_status == status && strstr(last_err, what) && dir_empty(work),
        "refused: %s (status %d, '%s'), nothing left", desc, last_status, last_err);
  moat_build_context_free(c);
}

static void test_refusals(void) {
  const struct ent dotdot[] = {{'f', "a", "x", 0, 0, 0}, {'f', "sub/../../escape", "x", 0, 0, 0}};
  refused(dotdot, 2, EINVAL, "sub/../../escape", "a '..' component", 1 << 20, 100);
  const struct ent dotdot2[] = {{'f', "../escape", "x", 0, 0, 0}};
  refused(dotdot2, 1, EINVAL, "'..'", "a leading '..'", 1 << 20, 100);
  const struct ent abs[] = {{'f', "/etc/cron.d/evil", "x", 0, 0, 0}};
  refused(abs, 1, EINVAL, "/etc/cron.d/evil", "an absolute path", 1 << 20, 100);
  const struct ent slabs[] = {{'l', "etc", "/etc", 0, 0, 0}};
  refused(slabs, 1, EINVAL, "absolute target", "a symlink to an absolute path", 1 << 20, 100);
  const struct ent slup[] = {{'d', "a/b/", NULL, 0, 0, 0}, {'l', "a/b/out", "../../../x", 0, 0, 0}};
  refused(slup, 2, EINVAL, "a/b/out", "a symlink climbing above the root", 1 << 20, 100);
  const struct ent slup2[] = {{'l', "x", "a/../..", 0, 0, 0}};
  refused(slup2, 1, EINVAL, "points out", "a symlink climbing out through a/../..", 1 << 20, 100);
  const struct ent hlout[] = {{'h', "h", "../etc/passwd", 0, 0, 0}};
  refused(hlout, 1, EINVAL, "'h'", "a hard link outside", 1 << 20, 100);
  const struct ent hlabs[] = {{'h', "h", "/etc/passwd", 0, 0, 0}};
  refused(hlabs, 1, EINVAL, "/etc/passwd", "a hard link to an absolute path", 1 << 20, 100);
  const struct ent hllater[] = {{'h', "h", "later", 0, 0, 0}, {'f', "later", "x", 0, 0, 0}};
  refused(hllater, 2, EINVAL, "no such file unpacked before", "a hard link to a later entry", 1 << 20, 100);
  const struct ent dev[] = {{'c', "dev/null", NULL, 0, 0, 0}};
  refused(dev, 1, EINVAL, "character device", "a device node", 1 << 20, 100);
  const struct ent fifo[] = {{'p', "pipe", NULL, 0, 0, 0}};
  refused(fifo, 1, EINVAL, "fifo", "a fifo", 1 << 20, 100);
  const struct ent beneath[] = {
      {'l', "l", "d", 0, 0, 0}, {'d', "d/", NULL, 0, 0, 0}, {'f', "l/x", "x", 0, 0, 0}};
  refused(beneath, 3, EINVAL, "l/x", "an entry beneath a symlink", 1 << 20, 100);
  /* 8 MiB declared against a 1 MiB bound: refused from the header, before its data is read. */
  const struct ent big[] = {{'f', "small", "abc", 0, 0, 0}, {'f', "big", NULL, 0, 8 << 20, 0}};
  refused(big, 2, EFBIG, "big", "more bytes than max_bytes", 1 << 20, 100);
  const struct ent sum[] = {{'f', "a", NULL, 0, 600 << 10, 0}, {'f', "b", NULL, 0, 600 << 10, 0}};
  refused(sum, 2, EFBIG, "'b'", "two files that together exceed max_bytes", 1 << 20, 100);
  struct ent many[20];
  char names[20][16];
  for (int i = 0; i < 20; i++) {
    snprintf(names[i], sizeof(names[i]), "f%d", i);
    many[i] = (struct ent){'f', names[i], "x", 0, 0, 0};
  }
  refused(many, 20, EINVAL, "more than 10 entries", "more entries than max_entries", 1 << 20, 10);
  char *longname = xmalloc(5000);
  for (int i = 0; i < 4998; i += 2)
    memcpy(longname + i, "a/", 2);
  longname[4998] = 'z';
  longname[4999] = '\0';
  const struct ent lng[] = {{'f', longname, "x", 0, 0, 0}};
  refused(lng, 1, EINVAL, "longer than 4096", "a name over 4096 bytes", 1 << 20, 100);
  free(longname);
  const struct ent dirfile[] = {{'f', "x", "x", 0, 0, 0}, {'d', "x/", NULL, 0, 0, 0}};
  refused(dirfile, 2, EINVAL, "'x", "a directory entry over a file", 1 << 20, 100);

  int fd = memfd_create("junk", MFD_CLOEXEC);
  write_all(fd, "this is not a tar, it is text that goes on for a while.........", 64);
  lseek(fd, 0, SEEK_SET);
  struct moat_build_context *c = NULL;
  moat_error *err = NULL;
  CHECK(moat_build_context_open(&c, fd, work, 100, 10, &err) < 0 && !c && err && err->status == EINVAL &&
            dir_empty(work),
        "junk is refused (EINVAL): %s", err ? moat_error_msg(err) : "");
  moat_error_free(&err);
  close(fd);
}

static struct moat_build_context *ctx; /* the good context */

static void test_read(void) {
  char *text = NULL;
  size_t len = 0;
  moat_error *err = NULL;
  CHECK(moat_build_context_read(ctx, "Dockerfile", &text, &len, 1 << 20, &err) == 0 && text &&
            strcmp(text, "FROM base\nCOPY . /app\n") == 0 && len == strlen(text),
        "read the Dockerfile: %s", err ? moat_error_msg(err) : "");
  free(text);
  moat_error_free(&err);
  text = NULL;
  CHECK(moat_build_context_read(ctx, "../../Dockerfile", &text, &len, 1 << 20, &err) == 0 && text &&
            strncmp(text, "FROM", 4) == 0,
        "'../../Dockerfile' is the context's Dockerfile: %s", err ? moat_error_msg(err) : "");
  free(text);
  moat_error_free(&err);
  text = NULL;
  CHECK(moat_build_context_read(ctx, "top/file.txt", &text, &len, 100, &err) == 0 && text &&
            strcmp(text, "deep\n") == 0,
        "read through an in-context symlink: %s", err ? moat_error_msg(err) : "");
  free(text);
  moat_error_free(&err);
  text = NULL;
  CHECK(moat_build_context_read(ctx, "missing", &text, &len, 100, &err) < 0 && err && err->status == ENOENT &&
            !text,
        "a missing file is ENOENT: %s", err ? moat_error_msg(err) : "");
  moat_error_free(&err);
  CHECK(moat_build_context_read(ctx, "Dockerfile", &text, &len, 5, &err) < 0 && err && err->status == EFBIG,
        "over max is EFBIG: %s", err ? moat_error_msg(err) : "");
  moat_error_free(&err);
  CHECK(moat_build_context_read(ctx, "src", &text, &len, 100, &err) < 0 && err && err->status == EINVAL,
        "a directory is EINVAL: %s", err ? moat_error_msg(err) : "");
  moat_error_free(&err);
}

/* expand(srcs...) joined with ' ', or "ERR <status>" */
static const char *expand(const char *a, const char *b) {
  static char out[1024];
  char *srcs[2] = {(char *)a, (char *)b};
  char **v = NULL;
  moat_error *err = NULL;
  if (moat_build_context_expand(ctx, srcs, b ? 2 : 1, &v, &err) < 0) {
    snprintf(out, sizeof(out), "ERR %d %s", err ? err->status : -1, moat_error_msg(err));
    moat_error_free(&err);
    return out;
  }
  out[0] = '\0';
  for (size_t i = 0; v[i]; i++)
    snprintf(out + strlen(out), sizeof(out) - strlen(out), "%s%s", i ? " " : "", v[i]);
  strv_free(v);
  return out;
}
#define EXPANDS(a, b, want)                                                                                  \
  do {                                                                                                       \
    const char *got_ = expand(a, b);                                                                         \
    CHECK(strcmp(got_, want) == 0, "expand %s %s -> '%s' (got '%s')", a, b ? b : "", want, got_);            \
  } while (0)

static void test_expand(void) {
  EXPANDS("a.txt", NULL, "a.txt");
  EXPANDS("/a.txt", NULL, "a.txt");
  EXPANDS("../a.txt", NULL, "a.txt");
  EXPANDS("../../src/../b.txt", NULL, "b.txt");
  EXPANDS(".", NULL, ".");
  EXPANDS("/", NULL, ".");
  EXPANDS("..", NULL, ".");
  EXPANDS("*.txt", NULL, ".hidden.txt a.txt b.txt");
  EXPANDS("?.txt", "src/*", "a.txt b.txt src/hard src/link src/main.c src/run.sh");
  EXPANDS("s[r]c/[lm]*", NULL, "src/link src/main.c");
  EXPANDS("*/er/*.txt", NULL, "deep/er/file.txt");
  EXPANDS("*/file.txt", NULL, "top/file.txt"); /* through the in-context symlink top -> deep/er */
  EXPANDS("a\\.txt", NULL, "a.txt");
  const char *e = expand("nope.txt", NULL);
  CHECK(strncmp(e, "ERR 2 ", 6) == 0 && strstr(e, "nope.txt"), "a missing source is ENOENT naming it: %s", e);
  e = expand("a.txt", "*.nothing");
  CHECK(strncmp(e, "ERR 2 ", 6) == 0 && strstr(e, "*.nothing"), "a wildcard matching nothing is ENOENT: %s",
        e);
}

static bool digest_of(struct moat_build_context *c, const char *src, const struct moat_copy_opts *o,
                      uint8_t out[32]) {
  char *v[1] = {(char *)src};
  moat_error *err = NULL;
  int r = moat_build_context_digest(c, v, 1, o, out, &err);
  moat_error_free(&err);
  return r == 0;
}

static void test_digest(void) {
  const struct ent base[] = {
      {'f', "d/a", "one", 0644, 0, 0}, {'f', "d/b", "two", 0644, 0, 0}, {'l', "d/l", "a", 0, 0, 0}};
  uint8_t h0[32], h1[32];
  struct moat_build_context *c = open_ctx(base, 3, NULL, work, 1 << 20, 100);
  bool ok = c && digest_of(c, "d", NULL, h0);
  moat_build_context_free(c);
  const struct ent mtime[] = {
      {'f', "d/a", "one", 0644, 0, 1600000000}, {'f', "d/b", "two", 0644, 0, 5}, {'l', "d/l", "a", 0, 0, 7}};
  c = open_ctx(mtime, 3, "gzip", work, 1 << 20, 100);
  CHECK(ok && c && digest_of(c, "d", NULL, h1) && memcmp(h0, h1, 32) == 0, "the digest ignores mtimes");
  moat_build_context_free(c);
  const struct ent content[] = {
      {'f', "d/a", "onE", 0644, 0, 0}, {'f', "d/b", "two", 0644, 0, 0}, {'l', "d/l", "a", 0, 0, 0}};
  const struct ent mode[] = {
      {'f', "d/a", "one", 0755, 0, 0}, {'f', "d/b", "two", 0644, 0, 0}, {'l', "d/l", "a", 0, 0, 0}};
  const struct ent name[] = {
      {'f', "d/a", "one", 0644, 0, 0}, {'f', "d/c", "two", 0644, 0, 0}, {'l', "d/l", "a", 0, 0, 0}};
  const struct ent target[] = {
      {'f', "d/a", "one", 0644, 0, 0}, {'f', "d/b", "two", 0644, 0, 0}, {'l', "d/l", "b", 0, 0, 0}};
  const struct ent shift[] = {
      {'f', "d/a", "onet", 0644, 0, 0}, {'f', "d/b", "wo", 0644, 0, 0}, {'l', "d/l", "a", 0, 0, 0}};
  const struct {
    const struct ent *e;
    const char *what;
  } variants[] = {{content, "content"},
                  {mode, "mode"},
                  {name, "name"},
                  {target, "link target"},
                  {shift, "a byte moved between files"}};
  for (size_t i = 0; i < ARRAY_SIZE(variants); i++) {
    c = open_ctx(variants[i].e, 3, NULL, work, 1 << 20, 100);
    CHECK(c && digest_of(c, "d", NULL, h1) && memcmp(h0, h1, 32) != 0, "the digest changes with the %s",
          variants[i].what);
    moat_build_context_free(c);
  }
  c = open_ctx(base, 3, NULL, work, 1 << 20, 100);
  struct moat_copy_opts o1 = {.dest = "/x/", .workdir = "/"}, o2 = o1;
  o2.chown = "1:1";
  uint8_t h2[32], h3[32];
  CHECK(c && digest_of(c, "d", &o1, h2) && digest_of(c, "d", &o2, h3) && memcmp(h2, h3, 32) != 0 &&
            memcmp(h0, h2, 32) != 0,
        "the digest changes with --chown");
  o2 = o1;
  o2.add = true;
  CHECK(c && digest_of(c, "d", &o2, h3) && memcmp(h2, h3, 32) != 0, "the digest changes with ADD");
  CHECK(c && digest_of(c, "d/a", NULL, h2) && memcmp(h0, h2, 32) != 0, "a file's digest is not its dir's");
  moat_build_context_free(c);
}

/* The fake rootfs and the host directory outside it that nothing may touch. */
static char rootfs[4300], outside[4300];

static int copy(const char *src1, const char *src2, const char *dest, const char *chown_, const char *chmod_,
                bool add) {
  char *srcs[2] = {(char *)src1, (char *)src2};
  struct moat_copy_opts o = {.dest = dest, .workdir = "/work", .chown = chown_, .chmod = chmod_, .add = add};
  int root = open(rootfs, O_PATH | O_DIRECTORY | O_CLOEXEC);
  moat_error *err = NULL;
  last_err[0] = '\0';
  last_status = 0;
  int r = moat_build_context_copy(ctx, root, srcs, src2 ? 2 : 1, &o, &err);
  if (r < 0) {
    snprintf(last_err, sizeof(last_err), "%s", moat_error_msg(err));
    last_status = err ? err->status : -1;
  }
  moat_error_free(&err);
  close(root);
  return r;
}

static const char *rp(const char *rel) {
  static char buf[4][4600];
  static int k;
  char *b = buf[k++ % 4];
  snprintf(b, 4600, "%s/%s", rootfs, rel);
  return b;
}

static bool owned(const char *path, uid_t u, gid_t g) {
  struct stat st;
  return lstat(path, &st) == 0 && st.st_uid == u && st.st_gid == g;
}

static void sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void sh(const char *fmt, ...) {
  char cmd[9000];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof(cmd), fmt, ap);
  va_end(ap);
  if (system(cmd) != 0)
    fprintf(stderr, "# failed: %s\n", cmd);
}

static void test_copy(void) {
  /* The image: merged /usr, a hostile etc -> / (so its passwd is the rootfs's /passwd), a planted
   * symlink at a file's destination and one on a parent's way, both pointing at the host. */
  sh("mkdir -p %s/usr/bin %s/opt/app %s/work %s%s && ln -s usr/bin %s/bin && ln -s / %s/etc", rootfs, rootfs,
     rootfs, rootfs, outside, rootfs, rootfs);
  sh("ln -s %s/victim %s/opt/app/config && ln -s %s %s/opt/link", outside, rootfs, outside, rootfs);
  sh("printf 'root:x:0:0::/root:/bin/sh\\nbuilder:x:1234:4321::/home/builder:/bin/sh\\n' > %s/passwd",
     rootfs);
  sh("printf 'root:x:0:\\nstaff:x:50:\\nbuilder:x:4321:\\n' > %s/group", rootfs);
  sh("printf original > %s/victim", outside);

  CHECK(copy("a.txt", NULL, "/bin/", NULL, NULL, false) == 0 && file_is(rp("usr/bin/a.txt"), "A\n") &&
            owned(rp("usr/bin/a.txt"), 0, 0),
        "COPY a.txt /bin/ lands in /usr/bin through the image's bin -> usr/bin: %s", last_err);
  char hostpath[256];
  snprintf(hostpath, sizeof(hostpath), "/etc/moat-bc-test-%d", (int)getpid());
  CHECK(copy("a.txt", NULL, hostpath, NULL, NULL, false) == 0 && file_is(rp(hostpath + 5), "A\n") &&
            access(hostpath, F_OK) != 0,
        "COPY to /etc/x through a hostile etc -> / lands at the rootfs's /x, not the host's /etc: %s",
        last_err);
  CHECK(copy("b.txt", NULL, "/opt/app/config", NULL, NULL, false) == 0 &&
            S_ISREG(mode_at(rp("opt/app/config"))) && file_is(rp("opt/app/config"), "B\n"),
        "a planted symlink at the destination is replaced by the file: %s", last_err);
  CHECK(copy("b.txt", NULL, "/opt/link/f", NULL, NULL, false) == 0,
        "COPY through a planted absolute symlink on the way: %s", last_err);
  char victim[4400], through[4400];
  snprintf(victim, sizeof(victim), "%s/victim", outside);
  snprintf(through, sizeof(through), "%s/f", outside);
  CHECK(file_is(victim, "original") && access(through, F_OK) != 0 && dir_empty(outside) == false,
        "nothing outside the rootfs changed (the host's victim keeps its content, no file made beside it)");
  {
    char in_root[8700];
    snprintf(in_root, sizeof(in_root), "%s%s/f", rootfs, outside);
    CHECK(file_is(in_root, "B\n"), "the absolute symlink resolved inside the rootfs (%s)", in_root);
  }

  /* Directory sources copy their contents; symlinks stay symlinks. */
  CHECK(copy("src", NULL, "/dst", NULL, NULL, false) == 0 &&
            file_is(rp("dst/main.c"), "int main(void) { return 0; }\n") &&
            link_is(rp("dst/link"), "main.c") && (mode_at(rp("dst/run.sh")) & 07777) == 04755 &&
            access(rp("dst/src"), F_OK) != 0 && (mode_at(rp("dst")) & 07777) == 0750,
        "COPY src /dst copies src's contents, symlinks as symlinks, modes kept: %s", last_err);
  CHECK(copy(".", NULL, "ctx/", NULL, NULL, false) == 0 &&
            file_is(rp("work/ctx/deep/er/file.txt"), "deep\n") &&
            link_is(rp("work/ctx/top"), "src/../deep/er") &&
            file_is(rp("work/ctx/Dockerfile"), "FROM base\nCOPY . /app\n"),
        "COPY . ctx/ copies the whole context relative to WORKDIR: %s", last_err);
  CHECK(copy(".", NULL, "/app", NULL, NULL, false) == 0 && (mode_at(rp("app")) & 07777) == 0755 &&
            file_is(rp("app/a.txt"), "A\n"),
        "COPY . /app makes /app with the tar's './' mode (0755), not the private dir's 0700: %s", last_err);
  CHECK(copy("top", NULL, "/followed/", NULL, NULL, false) == 0 && file_is(rp("followed/file.txt"), "deep\n"),
        "a source that is a symlink to a directory is followed: %s", last_err);

  /* Destination semantics. */
  CHECK(copy("a.txt", NULL, "/newfile", NULL, NULL, false) == 0 && file_is(rp("newfile"), "A\n"),
        "COPY a.txt /newfile makes the file /newfile: %s", last_err);
  CHECK(copy("a.txt", NULL, "/newdir/", NULL, NULL, false) == 0 && file_is(rp("newdir/a.txt"), "A\n"),
        "COPY a.txt /newdir/ makes /newdir/a.txt: %s", last_err);
  CHECK(copy("b.txt", NULL, "/newdir", NULL, NULL, false) == 0 && file_is(rp("newdir/b.txt"), "B\n"),
        "COPY b.txt /newdir (an existing dir) makes /newdir/b.txt: %s", last_err);
  CHECK(copy("a.txt", "b.txt", "/notadir", NULL, NULL, false) < 0 && last_status == EINVAL &&
            access(rp("notadir"), F_OK) != 0,
        "two sources to a destination without '/' is EINVAL: %s", last_err);
  CHECK(copy("a.txt", "b.txt", "/multi/", NULL, NULL, false) == 0 && file_is(rp("multi/a.txt"), "A\n") &&
            file_is(rp("multi/b.txt"), "B\n"),
        "two sources to /multi/: %s", last_err);
  sh("mkdir -p %s/isdir/a.txt", rootfs);
  CHECK(copy("a.txt", NULL, "/isdir/", NULL, NULL, false) < 0 && last_status == EISDIR &&
            strstr(last_err, "a.txt") && strstr(last_err, "/isdir/"),
        "a directory where the file must go is EISDIR naming source and destination: %s", last_err);
  CHECK(copy("src", NULL, "/newfile", NULL, NULL, false) < 0 && last_status == ENOTDIR,
        "a directory source onto a file is ENOTDIR: %s", last_err);
  sh("echo old > %s/shared && ln %s/shared %s/shared2", rootfs, rootfs, rootfs);
  CHECK(copy("a.txt", NULL, "/shared", NULL, NULL, false) == 0 && file_is(rp("shared"), "A\n") &&
            file_is(rp("shared2"), "old\n"),
        "a file replacing a hard-linked one never writes the other link: %s", last_err);

  /* --chown by name through the image's passwd and group, by number, unknown names; --chmod. */
  CHECK(copy("src", NULL, "/home/builder/new/", "builder", NULL, false) == 0 &&
            owned(rp("home/builder/new/main.c"), 1234, 4321) &&
            owned(rp("home/builder/new/link"), 1234, 4321) && owned(rp("home"), 1234, 4321) &&
            owned(rp("home/builder/new"), 1234, 4321),
        "--chown=builder: the user's uid and primary gid, parents made owned too: %s", last_err);
  CHECK(copy("a.txt", NULL, "/own/", "builder:staff", NULL, false) == 0 && owned(rp("own/a.txt"), 1234, 50),
        "--chown=builder:staff: %s", last_err);
  CHECK(copy("a.txt", NULL, "/own/n", "77", NULL, false) == 0 && owned(rp("own/n"), 77, 77),
        "--chown=77 is 77:77: %s", last_err);
  CHECK(copy("a.txt", NULL, "/own/m", "nobodyhere", NULL, false) < 0 && last_status == EINVAL &&
            strstr(last_err, "nobodyhere"),
        "an unknown user is EINVAL naming it: %s", last_err);
  CHECK(copy("a.txt", NULL, "/own/m", "builder:nogroup", NULL, false) < 0 && last_status == EINVAL &&
            strstr(last_err, "nogroup"),
        "an unknown group is EINVAL naming it: %s", last_err);
  CHECK(copy("src", NULL, "/modes/", NULL, "0640", false) == 0 &&
            (mode_at(rp("modes/main.c")) & 07777) == 0640 && (mode_at(rp("modes/run.sh")) & 07777) == 0640,
        "--chmod=0640: %s", last_err);
  CHECK(copy("a.txt", NULL, "/modes/", NULL, "9", false) < 0 && last_status == EINVAL,
        "--chmod=9 is EINVAL: %s", last_err);

  CHECK(file_is(victim, "original") && access(through, F_OK) != 0 && access(hostpath, F_OK) != 0,
        "after every copy, nothing outside the rootfs changed");
}

static void test_add(void) {
  const struct ent inner[] = {{'d', "pkg/", NULL, 0755, 0, 0},
                              {'f', "pkg/tool", "#!/bin/sh\n", 0755, 0, 0},
                              {'l', "pkg/alias", "tool", 0, 0, 0},
                              {'h', "pkg/tool2", "pkg/tool", 0, 0, 0}};
  int tfd = make_tar(inner, ARRAY_SIZE(inner), "gzip");
  struct stat st;
  fstat(tfd, &st);
  char *tgz = xmalloc((size_t)st.st_size);
  read_all(tfd, tgz, (size_t)st.st_size);
  close(tfd);
  const struct ent evil_inner[] = {{'f', "ok", "x", 0, 0, 0}, {'f', "../../escape", "x", 0, 0, 0}};
  tfd = make_tar(evil_inner, 2, NULL);
  struct stat st2;
  fstat(tfd, &st2);
  char *evil = xmalloc((size_t)st2.st_size);
  read_all(tfd, evil, (size_t)st2.st_size);
  close(tfd);
  /* A context holding the two archives (bytes of 'f' entries are their data: build by hand). */
  int fd = memfd_create("ctx", MFD_CLOEXEC);
  struct archive *a = archive_write_new();
  archive_write_set_format_pax_restricted(a);
  archive_write_open_fd(a, fd);
  const struct {
    const char *name;
    const char *data;
    size_t len;
  } files[] = {{"pkg.tar.gz", tgz, (size_t)st.st_size},
               {"evil.tar", evil, (size_t)st2.st_size},
               {"plain.gz", "not a tar", 9}};
  for (size_t i = 0; i < ARRAY_SIZE(files); i++) {
    struct archive_entry *ae = archive_entry_new();
    archive_entry_set_pathname(ae, files[i].name);
    archive_entry_set_filetype(ae, AE_IFREG);
    archive_entry_set_perm(ae, 0644);
    archive_entry_set_size(ae, (int64_t)files[i].len);
    archive_write_header(a, ae);
    archive_write_data(a, files[i].data, files[i].len);
    archive_entry_free(ae);
  }
  archive_write_close(a);
  archive_write_free(a);
  free(tgz);
  free(evil);
  lseek(fd, 0, SEEK_SET);
  struct moat_build_context *c = NULL;
  moat_error *err = NULL;
  moat_build_context_open(&c, fd, work, 1 << 20, 100, &err);
  close(fd);
  moat_error_free(&err);
  if (!CHECK(c != NULL, "a context with archives opens"))
    return;
  struct moat_build_context *saved = ctx;
  ctx = c;
  CHECK(copy("pkg.tar.gz", NULL, "/opt/unpacked", NULL, NULL, true) == 0 &&
            file_is(rp("opt/unpacked/pkg/tool"), "#!/bin/sh\n") &&
            link_is(rp("opt/unpacked/pkg/alias"), "tool") &&
            (mode_at(rp("opt/unpacked/pkg/tool")) & 07777) == 0755 &&
            owned(rp("opt/unpacked/pkg/tool"), 1000, 1000),
        "ADD x.tar.gz /opt/unpacked unpacks it (modes and the tar's owners kept): %s", last_err);
  struct stat s1, s2;
  CHECK(stat(rp("opt/unpacked/pkg/tool"), &s1) == 0 && stat(rp("opt/unpacked/pkg/tool2"), &s2) == 0 &&
            s1.st_ino == s2.st_ino,
        "ADD's hard link links within the unpacked tree");
  CHECK(copy("pkg.tar.gz", NULL, "/opt/owned/", "builder", NULL, true) == 0 &&
            owned(rp("opt/owned/pkg/tool"), 1234, 4321),
        "ADD --chown applies to the unpacked entries: %s", last_err);
  CHECK(copy("pkg.tar.gz", NULL, "/opt/copied.tgz", NULL, NULL, false) == 0 &&
            S_ISREG(mode_at(rp("opt/copied.tgz"))),
        "COPY of the same archive copies it: %s", last_err);
  CHECK(copy("plain.gz", NULL, "/opt/plain.gz", NULL, NULL, true) == 0 &&
            file_is(rp("opt/plain.gz"), "not a tar"),
        "ADD of a file that is no tar copies it: %s", last_err);
  CHECK(copy("pkg.tar.gz", NULL, "/bin/", NULL, NULL, true) == 0 &&
            file_is(rp("usr/bin/pkg/tool"), "#!/bin/sh\n"),
        "ADD into /bin/ unpacks through the image's bin -> usr/bin: %s", last_err);
  CHECK(copy("evil.tar", NULL, "/opt/evil/", NULL, NULL, true) < 0 && last_status == EINVAL &&
            strstr(last_err, "../../escape") && access(rp("escape"), F_OK) != 0 &&
            access(rp("opt/escape"), F_OK) != 0,
        "ADD of a tar with a '..' entry is refused naming it: %s", last_err);
  ctx = saved;
  moat_build_context_free(c);
}

int main(void) {
  const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
  snprintf(scratch, sizeof(scratch), "%s/test_build_context.XXXXXX", tmp);
  if (!mkdtemp(scratch)) {
    perror("mkdtemp");
    return 1;
  }
  snprintf(work, sizeof(work), "%s/work", scratch);
  snprintf(rootfs, sizeof(rootfs), "%s/rootfs", scratch);
  snprintf(outside, sizeof(outside), "%s/outside", scratch);
  mkdir(work, 0700);
  mkdir(rootfs, 0755);
  mkdir(outside, 0755);

  test_good();
  test_refusals();
  ctx = open_ctx(good, ARRAY_SIZE(good), "gzip", work, 1 << 20, 100);
  if (CHECK(ctx != NULL, "the good context opens again: %s", last_err)) {
    test_read();
    test_expand();
    test_copy();
    test_add();
    moat_build_context_free(ctx);
  }
  test_digest();
  CHECK(dir_empty(work), "every context removed its directory");
  moat_error *err = NULL;
  rm_rf(scratch, &err);
  moat_error_free(&err);
  return tap_done();
}

/* test_oci_import.c -- OCI image archives into a rootfs (host/oci_import.c, oci_unpack.c): archives
 * built here with libarchive's writer (oci-archive and docker save), whiteouts, config, digests,
 * hostile entries (.., absolute, through planted symlinks, hard links out), limits, architecture,
 * and one archive made by umoci. Runs as root (owners are checked). */
#include <archive.h>
#include <archive_entry.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/sha256.h"
#include "common/util.h"
#include "host/oci_import.h"

#include "tap.h"

static char tmp[] = "/tmp/moat-oci-test-XXXXXX";

/* --- a growable buffer and a tar writer into it --- */

struct mem {
  char *p;
  size_t n, cap;
};

static la_ssize_t mem_write(struct archive *a, void *arg, const void *buf, size_t len) {
  struct mem *m = arg;
  if (m->n + len > m->cap) {
    m->cap = (m->n + len) * 2;
    m->p = xrealloc(m->p, m->cap);
  }
  memcpy(m->p + m->n, buf, len);
  m->n += len;
  return (la_ssize_t)len;
}

enum comp { PLAIN, GZIP, ZSTD };

struct tw {
  struct archive *a;
  struct mem m;
};

static struct tw *tw_new(enum comp c) {
  struct tw *t = xcalloc(1, sizeof(*t));
  t->a = archive_write_new();
  archive_write_set_format_pax_restricted(t->a);
  if (c == GZIP)
    archive_write_add_filter_gzip(t->a);
  else if (c == ZSTD)
    archive_write_add_filter_zstd(t->a);
  archive_write_set_bytes_in_last_block(t->a, 1);
  archive_write_open(t->a, &t->m, NULL, mem_write, NULL);
  return t;
}

static void tw_entry(struct tw *t, const char *name, mode_t type, mode_t perm, const void *data, size_t len,
                     const char *link, bool hard, unsigned uid, unsigned gid) {
  struct archive_entry *e = archive_entry_new();
  archive_entry_set_pathname(e, name);
  archive_entry_set_filetype(e, type);
  archive_entry_set_perm(e, perm);
  archive_entry_set_uid(e, uid);
  archive_entry_set_gid(e, gid);
  archive_entry_set_mtime(e, 1700000000, 0);
  archive_entry_set_size(e, type == AE_IFREG && !hard ? (la_int64_t)len : 0);
  if (link && hard)
    archive_entry_set_hardlink(e, link);
  else if (link)
    archive_entry_set_symlink(e, link);
  if (archive_write_header(t->a, e) != ARCHIVE_OK)
    fprintf(stderr, "# write header %s: %s\n", name, archive_error_string(t->a));
  if (data && len && !hard)
    archive_write_data(t->a, data, len);
  archive_entry_free(e);
}
static void tw_file(struct tw *t, const char *name, const char *s) {
  tw_entry(t, name, AE_IFREG, 0644, s, strlen(s), NULL, false, 0, 0);
}
static void tw_dir(struct tw *t, const char *name) {
  tw_entry(t, name, AE_IFDIR, 0755, NULL, 0, NULL, false, 0, 0);
}
static void tw_sym(struct tw *t, const char *name, const char *target) {
  tw_entry(t, name, AE_IFLNK, 0777, NULL, 0, target, false, 0, 0);
}
static void tw_hard(struct tw *t, const char *name, const char *target) {
  tw_entry(t, name, AE_IFREG, 0644, NULL, 0, target, true, 0, 0);
}
static void tw_blob(struct tw *t, const char *name, const struct mem *m) {
  tw_entry(t, name, AE_IFREG, 0644, m->p, m->n, NULL, false, 0, 0);
}
/* Closes the tar and returns its bytes (t freed). */
static struct mem tw_done(struct tw *t) {
  archive_write_close(t->a);
  archive_write_free(t->a);
  struct mem m = t->m;
  free(t);
  return m;
}

static void hex(const uint8_t d[32], char out[65]) {
  for (int i = 0; i < 32; i++)
    snprintf(out + 2 * i, 3, "%02x", d[i]);
}

static struct mem mem_json(json_t *j) {
  char *s = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
  json_decref(j);
  return (struct mem){.p = s, .n = strlen(s), .cap = strlen(s)};
}

/* --- an OCI image layout --- */

struct img {
  struct tw *out; /* the archive */
  char *names[32];
  size_t n_names;
};

/* Adds blob m (freed) under its digest (or under bad_digest when given); returns a descriptor. */
static json_t *add_blob(struct img *im, struct mem m, const char *media, const char *bad_digest) {
  uint8_t d[32];
  char h[65], name[128], digest[80];
  moat_sha256(m.p, m.n, d);
  hex(d, h);
  snprintf(digest, sizeof(digest), "sha256:%s", bad_digest ? bad_digest : h);
  snprintf(name, sizeof(name), "blobs/sha256/%s", bad_digest ? bad_digest : h);
  bool seen = false;
  for (size_t i = 0; i < im->n_names; i++)
    seen |= strcmp(im->names[i], name) == 0;
  if (!seen) {
    tw_blob(im->out, name, &m);
    im->names[im->n_names++] = xstrdup(name);
  }
  free(m.p);
  return json_pack("{s:s, s:s, s:I}", "mediaType", media, "digest", digest, "size", (json_int_t)m.n);
}

static const char *arch(void) {
  static struct utsname u;
  uname(&u);
  return strcmp(u.machine, "x86_64") == 0 ? "amd64" : strcmp(u.machine, "aarch64") == 0 ? "arm64" : u.machine;
}

static json_t *config_json(const char *arch_name, json_t *cfg) {
  return json_pack("{s:s, s:s, s:o, s:{s:s, s:[]}}", "architecture", arch_name, "os", "linux", "config",
                   cfg ? cfg : json_object(), "rootfs", "type", "layers", "diff_ids");
}

/* A manifest for layers (tars, freed; comp[i] their compression for the media type) and config
 * (freed); returns its descriptor; *mdigest its sha256 when given. bad_layer: the index of a layer
 * whose descriptor names a wrong digest (-1: none). */
static json_t *add_manifest(struct img *im, struct mem *layers, const enum comp *comp, size_t n,
                            json_t *config, int bad_layer, uint8_t mdigest[32]) {
  json_t *ls = json_array();
  for (size_t i = 0; i < n; i++) {
    const char *mt = comp[i] == GZIP   ? "application/vnd.oci.image.layer.v1.tar+gzip"
                     : comp[i] == ZSTD ? "application/vnd.oci.image.layer.v1.tar+zstd"
                                       : "application/vnd.oci.image.layer.v1.tar";
    json_array_append_new(
        ls, add_blob(im, layers[i], mt,
                     (int)i == bad_layer ? "00000000000000000000000000000000000000000000000000000000deadbeef"
                                         : NULL));
  }
  json_t *cd = add_blob(im, mem_json(config), "application/vnd.oci.image.config.v1+json", NULL);
  json_t *man = json_pack("{s:i, s:s, s:o, s:o}", "schemaVersion", 2, "mediaType",
                          "application/vnd.oci.image.manifest.v1+json", "config", cd, "layers", ls);
  struct mem mm = mem_json(man);
  if (mdigest)
    moat_sha256(mm.p, mm.n, mdigest);
  return add_blob(im, mm, "application/vnd.oci.image.manifest.v1+json", NULL);
}

static struct img *img_new_comp(enum comp c) {
  struct img *im = xcalloc(1, sizeof(*im));
  im->out = tw_new(c);
  tw_file(im->out, "oci-layout", "{\"imageLayoutVersion\":\"1.0.0\"}");
  return im;
}

static struct img *img_new(void) { return img_new_comp(PLAIN); }

/* Writes index.json listing descs (freed) and returns the archive as a memfd. */
static int img_done(struct img *im, json_t *descs) {
  json_t *idx = json_pack("{s:i, s:o}", "schemaVersion", 2, "manifests", descs);
  struct mem m = mem_json(idx);
  tw_blob(im->out, "index.json", &m);
  free(m.p);
  struct mem a = tw_done(im->out);
  for (size_t i = 0; i < im->n_names; i++)
    free(im->names[i]);
  free(im);
  int fd = memfd_create("oci", MFD_CLOEXEC);
  write_all(fd, a.p, a.n);
  free(a.p);
  return fd;
}

/* A one-image archive of layers and a config. */
static int simple(struct mem *layers, const enum comp *comp, size_t n, json_t *config, int bad_layer,
                  uint8_t mdigest[32]) {
  struct img *im = img_new();
  json_t *d = add_manifest(im, layers, comp, n, config, bad_layer, mdigest);
  json_object_set_new(d, "annotations", json_pack("{s:s}", "org.opencontainers.image.ref.name", "latest"));
  return img_done(im, json_pack("[o]", d));
}

/* --- running the import --- */

static char root[256];
static char last_err[1024];
static int last_status;
static int n_root;

static int import(int fd, const char *ref, uint64_t max_bytes, size_t max_entries,
                  struct moat_oci_config *c) {
  snprintf(root, sizeof(root), "%s/root%d", tmp, ++n_root);
  mkdir(root, 0755);
  moat_error *err = NULL;
  int rc = moat_oci_import(fd, ref, tmp, root, max_bytes, max_entries, c, &err);
  snprintf(last_err, sizeof(last_err), "%s", err ? moat_error_msg(err) : "");
  last_status = err ? err->status : 0;
  if (rc < 0 && !err)
    snprintf(last_err, sizeof(last_err), "(failed without an error)");
  if (rc == 0 && err)
    snprintf(last_err, sizeof(last_err), "(succeeded with an error)");
  moat_error_free(&err);
  close(fd);
  return rc;
}
#define BIG (1ull << 30)

static char *at(const char *rel) { return xasprintf("%s/%s", root, rel); }

static bool exists(const char *rel) {
  _cleanup_free_ char *p = at(rel);
  struct stat st;
  return lstat(p, &st) == 0;
}

static bool content_is(const char *rel, const char *want) {
  _cleanup_free_ char *p = at(rel), *got = NULL;
  size_t len;
  if (read_file(p, &got, &len, NULL) < 0)
    return false;
  return strcmp(got, want) == 0;
}

static struct stat lst(const char *rel) {
  _cleanup_free_ char *p = at(rel);
  struct stat st = {0};
  lstat(p, &st);
  return st;
}

/* --- the tests --- */

static void test_layers_and_config(void) {
  struct tw *l1 = tw_new(PLAIN);
  tw_dir(l1, "etc");
  tw_file(l1, "etc/a", "A");
  tw_file(l1, "etc/b", "B");
  tw_dir(l1, "d");
  tw_file(l1, "d/x", "X");
  tw_dir(l1, "d/sub");
  tw_file(l1, "d/sub/y", "Y");
  tw_entry(l1, "bin/su", AE_IFREG, 04755, "su", 2, NULL, false, 0, 0);
  tw_entry(l1, "home/u/f", AE_IFREG, 0600, "mine", 4, NULL, false, 1000, 1001);
  tw_sym(l1, "etc/link", "b");
  tw_hard(l1, "etc/hard", "etc/b");
  tw_entry(l1, "dev/null", AE_IFCHR, 0666, NULL, 0, NULL, false, 0, 0);
  tw_file(l1, "gone/deep/f", "deep");
  struct tw *l2 = tw_new(GZIP);
  tw_file(l2, "d/z", "Z"); /* before the opaque marker: this layer's own, kept */
  tw_file(l2, "etc/.wh.a", "");
  tw_file(l2, "d/.wh..wh..opq", "");
  tw_file(l2, "d/new", "N");
  tw_file(l2, "gone/.wh.deep", "");
  tw_file(l2, "nowhere/.wh.thing", ""); /* nothing below to hide */
  struct tw *l3 = tw_new(ZSTD);
  tw_file(l3, "etc/b", "B3");
  tw_file(l3, "etc/.wh.b", ""); /* after this layer's etc/b: hides only the layers below */
  struct mem layers[] = {tw_done(l1), tw_done(l2), tw_done(l3)};
  enum comp comp[] = {PLAIN, GZIP, ZSTD};
  json_t *cfg = json_pack("{s:[s,s], s:s, s:s, s:[s], s:[s,s], s:{s:{}, s:{}}, s:{s:s}, s:s}", "Env",
                          "PATH=/usr/bin", "A=b=c", "WorkingDir", "/srv", "User", "1000:1001", "Entrypoint",
                          "/bin/ep", "Cmd", "serve", "--port=80", "ExposedPorts", "80/tcp", "443/tcp",
                          "Labels", "org.example", "yes", "StopSignal", "SIGINT");
  uint8_t mdigest[32];
  int fd = simple(layers, comp, 3, config_json(arch(), cfg), -1, mdigest);
  struct moat_oci_config c;
  int rc = import(fd, NULL, BIG, 10000, &c);
  if (!OK(rc == 0, "three layers (plain, gzip, zstd) import: %s", last_err))
    return;
  OK(!exists("etc/a") && content_is("etc/b", "B3"),
     "file whiteout removes the lower etc/a; etc/b of the same layer kept");
  OK(!exists("d/x") && !exists("d/sub") && content_is("d/new", "N") && content_is("d/z", "Z"),
     "opaque d/ drops the lower d/x and d/sub, keeps this layer's d/z (before the marker) and d/new");
  OK(!exists("gone/deep") && exists("gone"), "whiteout of a lower directory removes its tree");
  OK(!exists("etc/.wh.a") && !exists("d/.wh..wh..opq"), "whiteout markers are not unpacked");
  struct stat su = lst("bin/su"), f = lst("home/u/f"), ln = lst("etc/link");
  OK((su.st_mode & 07777) == 04755 && su.st_uid == 0, "setuid kept (mode %o)", su.st_mode & 07777);
  OK(f.st_uid == 1000 && f.st_gid == 1001 && (f.st_mode & 0777) == 0600, "owner 1000:1001 as written (%u:%u)",
     f.st_uid, f.st_gid);
  OK(S_ISLNK(ln.st_mode), "symlink is a symlink");
  /* l3 replaced etc/b with a new file: the hard link keeps l1's inode. */
  OK(content_is("etc/hard", "B") && lst("etc/hard").st_nlink == 1, "hard link made (content of l1's etc/b)");
  OK(!exists("dev/null"), "device node skipped");
  OK(lst("etc/b").st_mtime == 1700000000, "mtime kept");
  OK(c.env && strcmp(c.env[0], "PATH=/usr/bin") == 0 && strcmp(c.env[1], "A=b=c") == 0 && !c.env[2], "Env");
  OK(c.workdir && strcmp(c.workdir, "/srv") == 0 && c.user && strcmp(c.user, "1000:1001") == 0,
     "WorkingDir, User");
  OK(c.entrypoint && strcmp(c.entrypoint[0], "/bin/ep") == 0 && !c.entrypoint[1] && c.cmd &&
         strcmp(c.cmd[1], "--port=80") == 0 && !c.cmd[2],
     "Entrypoint, Cmd");
  OK(c.exposed && strcmp(c.exposed[0], "443/tcp") == 0 && strcmp(c.exposed[1], "80/tcp") == 0 &&
         !c.exposed[2],
     "ExposedPorts sorted");
  OK(c.labels && strcmp(json_string_value(json_object_get(c.labels, "org.example")), "yes") == 0 &&
         c.stopsignal && strcmp(c.stopsignal, "SIGINT") == 0,
     "Labels, StopSignal");
  OK(memcmp(c.digest, mdigest, 32) == 0 && strcmp(c.os, "linux") == 0 && strcmp(c.architecture, arch()) == 0,
     "digest is the manifest's sha256; os, architecture");
  moat_oci_config_clear(&c);
}

/* An archive written to a pipe by a child (the import spools it). */
static int pipe_of(struct mem a) {
  int p[2];
  if (pipe2(p, O_CLOEXEC) < 0)
    return -1;
  pid_t pid = fork();
  if (pid == 0) {
    close(p[0]);
    write_all(p[1], a.p, a.n);
    _exit(0);
  }
  close(p[1]);
  free(a.p);
  return p[0];
}

static void test_docker_save(void) {
  struct tw *l1 = tw_new(PLAIN);
  tw_file(l1, "hello", "docker");
  tw_file(l1, "bye", "x");
  struct mem layer = tw_done(l1);
  struct tw *l2 = tw_new(PLAIN);
  tw_file(l2, ".wh.bye", "");
  struct mem layer2 = tw_done(l2);
  uint8_t d1[32], d2[32], dc[32];
  char h1[65], h2[65], hc[65], id1[80], id2[80];
  moat_sha256(layer.p, layer.n, d1);
  moat_sha256(layer2.p, layer2.n, d2);
  hex(d1, h1);
  hex(d2, h2);
  snprintf(id1, sizeof(id1), "sha256:%s", h1);
  snprintf(id2, sizeof(id2), "sha256:%s", h2);
  json_t *cfg = json_pack("{s:s, s:s, s:{s:[s]}, s:{s:s, s:[s,s,s]}}", "architecture", arch(), "os", "linux",
                          "config", "Cmd", "/hello", "rootfs", "type", "layers", "diff_ids", id1, id2, id1);
  struct mem cm = mem_json(cfg);
  moat_sha256(cm.p, cm.n, dc);
  hex(dc, hc);
  char cname[80];
  snprintf(cname, sizeof(cname), "%s.json", hc);
  json_t *man = json_pack("[{s:s, s:[s], s:[s,s,s]}, {s:s, s:[s], s:[]}]", "Config", cname, "RepoTags",
                          "img:1", "Layers", "aaa/layer.tar", "bbb/layer.tar", "ccc/layer.tar", "Config",
                          cname, "RepoTags", "other:2", "Layers");
  struct mem mm = mem_json(man);
  struct tw *out = tw_new(PLAIN);
  tw_dir(out, "aaa");
  tw_blob(out, "aaa/layer.tar", &layer);
  tw_blob(out, "bbb/layer.tar", &layer2);
  tw_sym(out, "ccc/layer.tar", "../aaa/layer.tar"); /* docker save links a layer it already wrote */
  tw_blob(out, cname, &cm);
  tw_blob(out, "manifest.json", &mm);
  struct mem a = tw_done(out);
  struct mem a2 = {.p = xmemdup(a.p, a.n), .n = a.n}, a3 = {.p = xmemdup(a.p, a.n), .n = a.n};
  free(layer.p);
  free(layer2.p);
  free(cm.p);
  free(mm.p);

  struct moat_oci_config c;
  int rc = import(pipe_of(a), "img:1", BIG, 1000, &c);
  OK(rc == 0 && content_is("hello", "docker") && content_is("bye", "x"),
     "docker save (piped, spooled): layers, the symlinked duplicate re-adds bye: %s", last_err);
  OK(rc == 0 && c.cmd && strcmp(c.cmd[0], "/hello") == 0 && memcmp(c.digest, dc, 32) == 0,
     "docker save: Cmd, digest is the config's");
  moat_oci_config_clear(&c);
  rc = import(pipe_of(a2), "nope:3", BIG, 1000, &c);
  OK(rc < 0 && last_status == EINVAL && strstr(last_err, "nope:3"), "docker save, unknown ref: EINVAL (%s)",
     last_err);
  rc = import(pipe_of(a3), NULL, BIG, 1000, &c);
  OK(rc < 0 && last_status == EINVAL && strstr(last_err, "2 images"),
     "docker save of two images, no ref: EINVAL (%s)", last_err);
}

/* One layer of the given entries; import; returns rc. */
static int one_layer(struct tw *l, uint64_t max_bytes, size_t max_entries) {
  struct mem m[] = {tw_done(l)};
  enum comp comp[] = {PLAIN};
  struct moat_oci_config c;
  int rc = import(simple(m, comp, 1, config_json(arch(), NULL), -1, NULL), NULL, max_bytes, max_entries, &c);
  moat_oci_config_clear(&c);
  return rc;
}

static void test_digest(void) {
  struct tw *l = tw_new(PLAIN);
  tw_file(l, "f", "content");
  struct mem m[] = {tw_done(l)};
  enum comp comp[] = {PLAIN};
  struct moat_oci_config c;
  int rc = import(simple(m, comp, 1, config_json(arch(), NULL), 0, NULL), NULL, BIG, 100, &c);
  OK(rc < 0 && last_status == EINVAL && strstr(last_err, "digest mismatch"),
     "wrong layer digest: EINVAL (%s)", last_err);
}

static void test_hostile_names(void) {
  char outside[300];
  snprintf(outside, sizeof(outside), "%s/escape", tmp);
  struct tw *l = tw_new(PLAIN);
  tw_file(l, "ok", "1");
  tw_file(l, "a/../../escape", "evil");
  int rc = one_layer(l, BIG, 100);
  OK(rc < 0 && last_status == EINVAL && strstr(last_err, "'..'") && strstr(last_err, "layer 1") &&
         strstr(last_err, "a/../../escape") && access(outside, F_OK) < 0,
     "'..' entry: EINVAL naming layer and entry, nothing outside (%s)", last_err);
  l = tw_new(PLAIN);
  tw_file(l, "/abs-moat-test", "evil");
  rc = one_layer(l, BIG, 100);
  OK(rc < 0 && last_status == EINVAL && strstr(last_err, "absolute") && access("/abs-moat-test", F_OK) < 0,
     "absolute entry: EINVAL (%s)", last_err);
}

static void test_symlink_escape(void) {
  char host_x[128], out_dir[300], out_file[320];
  snprintf(host_x, sizeof(host_x), "moat-oci-x-%d", (int)getpid());
  snprintf(out_dir, sizeof(out_dir), "%s/outside", tmp);
  snprintf(out_file, sizeof(out_file), "%s/f", out_dir);
  mkdir(out_dir, 0755);
  char host_path[160];
  snprintf(host_path, sizeof(host_path), "/%s", host_x);
  struct tw *l1 = tw_new(PLAIN);
  tw_sym(l1, "etc", "/");
  tw_sym(l1, "up", "../../../../../..");
  tw_sym(l1, "out", out_dir);
  tw_sym(l1, "victim", "/etc/hostname");
  struct tw *l2 = tw_new(GZIP);
  char n1[200], n2[200];
  snprintf(n1, sizeof(n1), "etc/%s", host_x);
  snprintf(n2, sizeof(n2), "up/%s-up", host_x);
  tw_file(l2, n1, "x");
  tw_file(l2, n2, "y");
  tw_file(l2, "out/f", "z");
  tw_dir(l2, "etc/sub"); /* a directory through the symlink too */
  tw_file(l2, "victim", "replaced");
  struct mem m[] = {tw_done(l1), tw_done(l2)};
  enum comp comp[] = {PLAIN, GZIP};
  struct stat hn0, hn1;
  stat("/etc/hostname", &hn0);
  struct moat_oci_config c;
  int rc = import(simple(m, comp, 2, config_json(arch(), NULL), -1, NULL), NULL, BIG, 100, &c);
  moat_oci_config_clear(&c);
  char in_up[220], in_out[400];
  snprintf(in_up, sizeof(in_up), "%s-up", host_x);
  snprintf(in_out, sizeof(in_out), "%s/f", out_dir + 1);
  stat("/etc/hostname", &hn1);
  OK(rc == 0, "symlinks planted then written through: import succeeds (%s)", last_err);
  OK(access(host_path, F_OK) < 0 && content_is(host_x, "x") && exists("sub"),
     "etc -> / then etc/X: lands at ROOTFS/X, no /X on the host");
  snprintf(n2, sizeof(n2), "/%s-up", host_x);
  OK(access(n2, F_OK) < 0 && content_is(in_up, "y"), "up -> ../../.. then up/X: lands at ROOTFS/X");
  OK(access(out_file, F_OK) < 0 && content_is(in_out, "z"),
     "out -> <absolute dir outside> then out/f: lands at ROOTFS<dir>/f, the outside dir untouched");
  OK(S_ISREG(lst("victim").st_mode) && hn1.st_size == hn0.st_size && hn1.st_mtime == hn0.st_mtime,
     "a file over a symlink to /etc/hostname replaces the symlink, the host file untouched");
  unlink(host_path);
  unlink(n2);
}

static void test_hardlink_out(void) {
  struct stat p0, p1;
  stat("/etc/passwd", &p0);
  struct tw *l = tw_new(PLAIN);
  tw_hard(l, "h", "../../../../etc/passwd");
  int rc = one_layer(l, BIG, 100);
  OK(rc < 0 && last_status == EINVAL && strstr(last_err, "'..'"),
     "hard link to ../../etc/passwd: EINVAL (%s)", last_err);
  l = tw_new(PLAIN);
  tw_hard(l, "h", "/etc/passwd");
  rc = one_layer(l, BIG, 100);
  OK(rc < 0 && last_status == EINVAL && strstr(last_err, "absolute"), "hard link to /etc/passwd: EINVAL (%s)",
     last_err);
  struct tw *l1 = tw_new(PLAIN);
  tw_sym(l1, "lnk", "/etc");
  struct tw *l2 = tw_new(PLAIN);
  tw_hard(l2, "h", "lnk/passwd");
  struct mem m[] = {tw_done(l1), tw_done(l2)};
  enum comp comp[] = {PLAIN, PLAIN};
  struct moat_oci_config c;
  rc = import(simple(m, comp, 2, config_json(arch(), NULL), -1, NULL), NULL, BIG, 100, &c);
  moat_oci_config_clear(&c);
  stat("/etc/passwd", &p1);
  OK(rc < 0 && !exists("h") && p1.st_nlink == p0.st_nlink,
     "hard link through lnk -> /etc: resolved in the rootfs (absent there), /etc/passwd nlink %lu -> %lu "
     "(%s)",
     (unsigned long)p0.st_nlink, (unsigned long)p1.st_nlink, last_err);
}

static void test_limits(void) {
  char big[2001];
  memset(big, 'b', 2000);
  big[2000] = '\0';
  struct tw *l = tw_new(PLAIN);
  tw_file(l, "small", "s");
  tw_file(l, "big", big);
  int rc = one_layer(l, 1000, 100);
  OK(rc < 0 && last_status == EFBIG && strstr(last_err, "big"), "2000-byte file, max_bytes 1000: EFBIG (%s)",
     last_err);
  l = tw_new(PLAIN);
  for (int i = 0; i < 20; i++) {
    char n[16];
    snprintf(n, sizeof(n), "f%d", i);
    tw_file(l, n, "x");
  }
  rc = one_layer(l, BIG, 10);
  OK(rc < 0 && last_status == EFBIG && strstr(last_err, "entries"), "20 entries, max_entries 10: EFBIG (%s)",
     last_err);
  l = tw_new(PLAIN);
  tw_file(l, "a", big);
  rc = one_layer(l, 2000, 100);
  OK(rc == 0, "exactly max_bytes: fine (%s)", last_err);
}

static void test_arch(void) {
  const char *other = strcmp(arch(), "riscv64") == 0 ? "amd64" : "riscv64";
  struct tw *l = tw_new(PLAIN);
  tw_file(l, "f", "x");
  struct mem m[] = {tw_done(l)};
  enum comp comp[] = {PLAIN};
  struct moat_oci_config c;
  int rc = import(simple(m, comp, 1, config_json(other, NULL), -1, NULL), NULL, BIG, 100, &c);
  OK(rc < 0 && last_status == EINVAL && strstr(last_err, other) && !exists("f"),
     "image for %s: EINVAL before any layer (%s)", other, last_err);

  /* A multi-platform index: the entry for this machine is the one unpacked. */
  struct img *im = img_new();
  struct tw *la = tw_new(PLAIN), *lb = tw_new(PLAIN);
  tw_file(la, "which", other);
  tw_file(lb, "which", "mine");
  struct mem ma[] = {tw_done(la)}, mb[] = {tw_done(lb)};
  json_t *da = add_manifest(im, ma, comp, 1, config_json(other, NULL), -1, NULL);
  json_t *db = add_manifest(im, mb, comp, 1, config_json(arch(), NULL), -1, NULL);
  json_object_set_new(da, "platform", json_pack("{s:s, s:s}", "os", "linux", "architecture", other));
  json_object_set_new(db, "platform", json_pack("{s:s, s:s}", "os", "linux", "architecture", arch()));
  json_t *inner = json_pack("{s:i, s:s, s:[o,o]}", "schemaVersion", 2, "mediaType",
                            "application/vnd.oci.image.index.v1+json", "manifests", da, db);
  json_t *di = add_blob(im, mem_json(inner), "application/vnd.oci.image.index.v1+json", NULL);
  rc = import(img_done(im, json_pack("[o]", di)), NULL, BIG, 100, &c);
  OK(rc == 0 && content_is("which", "mine"), "nested multi-platform index: this machine's image (%s)",
     last_err);
  moat_oci_config_clear(&c);
}

/* Two tagged images in one layout (the archive gzip-compressed as a whole). */
static void test_refs(void) {
  int fds[3];
  for (int k = 0; k < 3; k++) {
    struct img *im = img_new_comp(GZIP);
    json_t *descs = json_array();
    for (int i = 0; i < 2; i++) {
      struct tw *l = tw_new(PLAIN);
      tw_file(l, "which", i ? "b" : "a");
      struct mem m[] = {tw_done(l)};
      enum comp comp[] = {PLAIN};
      json_t *d = add_manifest(im, m, comp, 1, config_json(arch(), NULL), -1, NULL);
      json_object_set_new(d, "annotations",
                          json_pack("{s:s}", "org.opencontainers.image.ref.name", i ? "b" : "a"));
      json_array_append_new(descs, d);
    }
    fds[k] = img_done(im, descs);
  }
  struct moat_oci_config c;
  int rc = import(fds[0], "b", BIG, 100, &c);
  OK(rc == 0 && content_is("which", "b"), "gzip'd layout of two images, ref b: image b (%s)", last_err);
  moat_oci_config_clear(&c);
  rc = import(fds[1], NULL, BIG, 100, &c);
  OK(rc < 0 && last_status == EINVAL && strstr(last_err, "2 images"), "two images, no ref: EINVAL (%s)",
     last_err);
  rc = import(fds[2], "zz", BIG, 100, &c);
  OK(rc < 0 && last_status == EINVAL && strstr(last_err, "'zz'"), "two images, unknown ref: EINVAL (%s)",
     last_err);
  int fd = memfd_create("junk", MFD_CLOEXEC);
  write_all(fd, "this is not a tar at all, not even close", 40);
  rc = import(fd, NULL, BIG, 100, &c);
  OK(rc < 0 && last_status == EINVAL, "not an archive: EINVAL (%s)", last_err);
}

static int run(const char *cmd) {
  int st = system(cmd);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_umoci(void) {
  if (run("command -v umoci >/dev/null 2>&1") != 0) {
    tap_skip("umoci is not installed");
    return;
  }
  _cleanup_free_ char *cmd = xasprintf(
      "set -e; cd %s; umoci init --layout lay; umoci new --image lay:t; umoci unpack --image lay:t bundle;"
      "mkdir -p bundle/rootfs/opt/app; echo umoci > bundle/rootfs/opt/app/hello; ln -s hello "
      "bundle/rootfs/opt/app/link; umoci repack --image lay:t bundle;"
      "umoci config --image lay:t --config.env=K=v --config.workingdir=/opt/app --config.cmd=/opt/app/hello;"
      "rm -rf bundle; umoci unpack --image lay:t bundle; rm bundle/rootfs/opt/app/link;"
      "umoci repack --image lay:t bundle; tar -C lay -cf umoci.tar .",
      tmp);
  if (!OK(run(cmd) == 0, "umoci made an image (two layers, the second deletes a file)"))
    return;
  _cleanup_free_ char *path = xasprintf("%s/umoci.tar", tmp);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  struct moat_oci_config c;
  int rc = import(fd, "t", BIG, 10000, &c);
  OK(rc == 0 && content_is("opt/app/hello", "umoci\n") && !exists("opt/app/link"),
     "umoci archive imported; the whiteout of umoci's second layer applied (%s)", last_err);
  OK(rc == 0 && c.env && strcmp(c.env[strv_len(c.env) - 1], "K=v") == 0 && c.workdir &&
         strcmp(c.workdir, "/opt/app") == 0 && c.cmd && strcmp(c.cmd[0], "/opt/app/hello") == 0,
     "umoci config: Env, WorkingDir, Cmd");
  moat_oci_config_clear(&c);
}

int main(void) {
  if (geteuid() != 0) {
    printf("1..0 # SKIP needs root (owners)\n");
    return 77;
  }
  if (!mkdtemp(tmp))
    return 1;
  test_layers_and_config();
  test_docker_save();
  test_digest();
  test_hostile_names();
  test_symlink_escape();
  test_hardlink_out();
  test_limits();
  test_arch();
  test_refs();
  test_umoci();
  while (waitpid(-1, NULL, 0) > 0)
    ;
  _cleanup_free_ char *rm = xasprintf("rm -rf %s", tmp);
  run(rm);
  return tap_done();
}

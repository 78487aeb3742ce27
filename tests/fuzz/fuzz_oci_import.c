/* fuzz_oci_import.c -- libFuzzer target: OCI image import (host/oci_import.c, oci_unpack.c), which
 * reads the image archives clients post to POST /v1/templates/NAME/import.
 *
 * Input: a first byte, then the rest. First byte even: the rest is the image archive as it is.
 * Odd: the rest is up to four layer tars separated by "\n--layer--\n", which this target wraps into
 * an OCI image layout with correct digests and a config for this machine (so that the mutations
 * reach the layer unpacker rather than stop at a digest). Each run imports into a fresh rootfs
 * beside a sentinel directory (/tmp/moat-fuzz-oci/outside/sentinel; the seeds plant symlinks and hard
 * links to it); checks: a failure has an error with a message, a success none and
 * os "linux"; the sentinel directory still holds only its file, unchanged; nothing appeared beside
 * the rootfs. */
#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "common/sha256.h"
#include "common/util.h"
#include "host/oci_import.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char base[64];

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

static void put(struct archive *a, const char *name, const void *p, size_t n) {
  struct archive_entry *e = archive_entry_new();
  archive_entry_set_pathname(e, name);
  archive_entry_set_filetype(e, AE_IFREG);
  archive_entry_set_perm(e, 0644);
  archive_entry_set_size(e, (la_int64_t)n);
  archive_write_header(a, e);
  archive_write_data(a, p, n);
  archive_entry_free(e);
}

/* Puts blob p as blobs/sha256/HEX; returns its descriptor. */
static json_t *blob(struct archive *a, const void *p, size_t n, const char *media) {
  char hex[65], name[96], digest[80];
  moat_sha256_hex(p, n, hex);
  snprintf(name, sizeof(name), "blobs/sha256/%s", hex);
  snprintf(digest, sizeof(digest), "sha256:%s", hex);
  put(a, name, p, n);
  return json_pack("{s:s, s:s, s:I}", "mediaType", media, "digest", digest, "size", (json_int_t)n);
}

static json_t *blob_json(struct archive *a, json_t *j, const char *media) {
  char *s = json_dumps(j, JSON_COMPACT);
  json_decref(j);
  json_t *d = blob(a, s, strlen(s), media);
  free(s);
  return d;
}

static const char *arch(void) {
  static struct utsname u;
  uname(&u);
  return strcmp(u.machine, "x86_64") == 0 ? "amd64" : strcmp(u.machine, "aarch64") == 0 ? "arm64" : u.machine;
}

/* An OCI layout of the layers in data (split on the separator). */
static struct mem wrap(const uint8_t *data, size_t size) {
  static const char sep[] = "\n--layer--\n";
  struct mem m = {0};
  struct archive *a = archive_write_new();
  archive_write_set_format_pax_restricted(a);
  archive_write_open(a, &m, NULL, mem_write, NULL);
  json_t *layers = json_array();
  const uint8_t *p = data, *end = data + size;
  for (int i = 0; i < 4 && p <= end; i++) {
    const uint8_t *s = memmem(p, (size_t)(end - p), sep, sizeof(sep) - 1);
    const uint8_t *e = s && i < 3 ? s : end;
    json_array_append_new(layers, blob(a, p, (size_t)(e - p), "application/vnd.oci.image.layer.v1.tar"));
    if (e == end)
      break;
    p = e + sizeof(sep) - 1;
  }
  json_t *cfg =
      json_pack("{s:s, s:s, s:{s:[s]}}", "architecture", arch(), "os", "linux", "config", "Env", "A=b");
  json_t *cd = blob_json(a, cfg, "application/vnd.oci.image.config.v1+json");
  json_t *man = json_pack("{s:i, s:o, s:o}", "schemaVersion", 2, "config", cd, "layers", layers);
  json_t *md = blob_json(a, man, "application/vnd.oci.image.manifest.v1+json");
  json_t *index = json_pack("{s:i, s:[o]}", "schemaVersion", 2, "manifests", md);
  char *idx = json_dumps(index, JSON_COMPACT);
  json_decref(index);
  put(a, "index.json", idx, strlen(idx));
  free(idx);
  archive_write_close(a);
  archive_write_free(a);
  return m;
}

static size_t count_dir(const char *path) {
  DIR *d = opendir(path);
  size_t n = 0;
  if (!d)
    return 0;
  for (struct dirent *de; (de = readdir(d));)
    n += strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0;
  closedir(d);
  return n;
}

static void remove_base(void) { rm_rf(base, NULL); }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!base[0]) {
    atexit(remove_base);
    /* A fixed path, so that seeds can plant symlinks to it (targets run one at a time). */
    snprintf(base, sizeof(base), "/tmp/moat-fuzz-oci");
    rm_rf(base, NULL);
    mkdir(base, 0700);
    _cleanup_free_ char *outside = xasprintf("%s/outside", base),
                        *sentinel = xasprintf("%s/outside/sentinel", base);
    mkdir(outside, 0700);
    write_file_once(sentinel, "sentinel", 0600, NULL);
  }
  if (!size)
    return 0;
  struct mem m = {0};
  if (data[0] & 1)
    m = wrap(data + 1, size - 1);
  else
    m = (struct mem){.p = xmemdup(data + 1, size - 1), .n = size - 1};
  int fd = memfd_create("fuzz-oci", MFD_CLOEXEC);
  write_all(fd, m.p, m.n);
  free(m.p);
  _cleanup_free_ char *root = xasprintf("%s/root", base);
  mkdir(root, 0755);
  struct moat_oci_config c;
  moat_error *err = NULL;
  int rc = moat_oci_import(fd, NULL, base, root, 1u << 20, 1000, &c, &err);
  close(fd);
  if (rc < 0 && (!err || !err->msg || !err->msg[0]))
    abort();
  if (rc == 0 && (err || !c.os || strcmp(c.os, "linux") != 0))
    abort();
  moat_error_free(&err);
  moat_oci_config_clear(&c);
  rm_rf(root, NULL);
  _cleanup_free_ char *outside = xasprintf("%s/outside", base),
                      *sentinel = xasprintf("%s/outside/sentinel", base);
  _cleanup_free_ char *got = NULL;
  size_t len;
  if (count_dir(base) != 1 || count_dir(outside) != 1 || read_file(sentinel, &got, &len, NULL) < 0 ||
      strcmp(got, "sentinel") != 0)
    abort();
  return 0;
}

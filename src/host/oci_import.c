/* oci_import.c -- reads an OCI image archive (oci-archive or `docker save`): finds its members,
 * picks the image, checks every blob's digest, parses the config, streams each layer to oci_unpack.c */
#include "oci_import.h"

#include <archive.h>
#include <archive_entry.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "../common/assert.h"
#include "../common/json_cleanup.h"
#include "../common/util.h"
#include "oci_internal.h"

#define JSON_MAX (4u << 20)     /* index, manifests, configs */
#define OUTER_MAX_ENTRIES 16384 /* members of the image archive */
#define MAX_LAYERS 256
#define MAX_INDEX_DEPTH 4 /* nested indexes */
#define MAX_MEMBER_HOPS 8 /* symlinks between members (docker save links duplicate layers) */
#define BUF_SIZE (128u << 10)

void moat_oci_config_clear(struct moat_oci_config *c) {
  strv_free(c->env);
  free(c->workdir);
  free(c->user);
  strv_free(c->entrypoint);
  strv_free(c->cmd);
  strv_free(c->exposed);
  json_decref(c->labels);
  free(c->stopsignal);
  free(c->architecture);
  free(c->os);
  *c = (struct moat_oci_config){0};
}

/* --- the archive file, read with pread from offset 0 --- */

struct src {
  int fd; /* not owned */
  off_t size;
};

struct reader {
  const struct src *src;
  off_t off;
  char buf[BUF_SIZE];
};

static la_ssize_t src_read(struct archive *a, void *arg, const void **out) {
  struct reader *r = arg;
  ssize_t n;
  do
    n = pread(r->src->fd, r->buf, sizeof(r->buf), r->off);
  while (n < 0 && errno == EINTR);
  if (n < 0) {
    archive_set_error(a, errno, "read the image archive: %s", strerror(errno));
    return -1;
  }
  r->off += n;
  *out = r->buf;
  return n;
}

static la_int64_t src_skip(struct archive *a, void *arg, la_int64_t req) {
  struct reader *r = arg;
  la_int64_t left = r->src->size - r->off;
  la_int64_t n = req < left ? req : left;
  if (n < 0)
    n = 0;
  r->off += n;
  return n;
}

/* An open reader of the archive (tar, plain/gzip/zstd) and its callback state. */
struct outer {
  struct archive *a;
  struct reader *r;
};

static void outer_close(struct outer *o) {
  if (o->a)
    archive_read_free(o->a);
  free(o->r);
  *o = (struct outer){0};
}
#define _cleanup_outer_ __attribute__((cleanup(outer_close)))

static int ar_fail(struct archive *a, const char *what, moat_error **err) {
  return moat_error_set(err, oci_archive_status(a), "%s: %s", what,
                        archive_error_string(a) ? archive_error_string(a) : "error");
}

static int outer_open(const struct src *s, struct outer *o, moat_error **err) {
  *o = (struct outer){.a = archive_read_new(), .r = xcalloc(1, sizeof(struct reader))};
  if (!o->a)
    moat_oom("archive_read_new", 0, __FILE__, __LINE__);
  o->r->src = s;
  archive_read_support_filter_gzip(o->a);
  archive_read_support_filter_zstd(o->a);
  archive_read_support_format_tar(o->a);
  archive_read_set_read_callback(o->a, src_read);
  archive_read_set_skip_callback(o->a, src_skip);
  archive_read_set_callback_data(o->a, o->r);
  if (archive_read_open1(o->a) != ARCHIVE_OK)
    return ar_fail(o->a, "image archive", err);
  return 0;
}

/* name resolved against dir within the archive's names ('..' pops, never above the top). */
static char *member_join(const char *dir, const char *target) {
  _cleanup_free_ char *all = target[0] == '/' ? xstrdup(target) : xasprintf("%s/%s", dir, target);
  char *out = xmalloc(strlen(all) + 1);
  size_t o = 0;
  for (char *save = NULL, *c = strtok_r(all, "/", &save); c; c = strtok_r(NULL, "/", &save)) {
    if (strcmp(c, ".") == 0)
      continue;
    if (strcmp(c, "..") == 0) {
      if (!o) {
        free(out);
        return NULL;
      }
      while (o && out[o - 1] != '/')
        o--;
      if (o)
        o--;
      continue;
    }
    if (o)
      out[o++] = '/';
    memcpy(out + o, c, strlen(c));
    o += strlen(c);
  }
  out[o] = '\0';
  return out;
}

/* Opens the archive positioned at member name's data (the first member of that name; symlinks and
 * hard links between members followed). *size: its size. 0, or -1: ENOENT when absent. */
static int member_open(const struct src *s, const char *name, struct outer *o, int64_t *size,
                       moat_error **err) {
  _cleanup_free_ char *want = xstrdup(name);
  for (int hop = 0; hop <= MAX_MEMBER_HOPS; hop++) {
    _cleanup_outer_ struct outer cur = {0};
    if (outer_open(s, &cur, err) < 0)
      return -1;
    struct archive_entry *e;
    bool found = false;
    for (size_t n = 0;; n++) {
      int r = archive_read_next_header(cur.a, &e);
      if (r == ARCHIVE_EOF)
        break;
      if (r < ARCHIVE_WARN)
        return ar_fail(cur.a, "image archive", err);
      if (n >= OUTER_MAX_ENTRIES)
        return moat_error_set(err, EFBIG, "image archive: more than %d members", OUTER_MAX_ENTRIES);
      const char *p = archive_entry_pathname(e), *why;
      _cleanup_free_ char *norm = p ? oci_norm_name(p, &why) : NULL;
      if (norm && strcmp(norm, want) == 0) {
        found = true;
        break;
      }
    }
    if (!found)
      return moat_error_set(err, ENOENT, "image archive: no %s", name);
    const char *hl = archive_entry_hardlink(e);
    if (archive_entry_filetype(e) == AE_IFLNK || hl) {
      const char *slash = strrchr(want, '/');
      _cleanup_free_ char *dir = xstrndup(want, slash ? (size_t)(slash - want) : 0);
      const char *t = hl ? hl : archive_entry_symlink(e);
      char *next = t ? member_join(hl ? "" : dir, t) : NULL;
      if (!next)
        return moat_error_set(err, EINVAL, "image archive: %s: a link out of the archive", name);
      free(want);
      want = next;
      continue;
    }
    if (archive_entry_filetype(e) != AE_IFREG)
      return moat_error_set(err, EINVAL, "image archive: %s is not a file", name);
    *size = archive_entry_size(e);
    *o = cur;
    cur = (struct outer){0};
    return 0;
  }
  return moat_error_set(err, EINVAL, "image archive: %s: more than %d links", name, MAX_MEMBER_HOPS);
}

/* Reads member name whole (at most JSON_MAX bytes) into *buf (NUL-terminated, caller frees). */
static int member_read(const struct src *s, const char *name, char **buf, size_t *len, moat_error **err) {
  _cleanup_outer_ struct outer o = {0};
  int64_t size;
  if (member_open(s, name, &o, &size, err) < 0)
    return -1;
  if (size < 0 || size > (int64_t)JSON_MAX)
    return moat_error_set(err, EINVAL, "image archive: %s: over %u bytes", name, JSON_MAX);
  _cleanup_free_ char *b = xmalloc((size_t)size + 1);
  size_t got = 0;
  for (;;) {
    la_ssize_t n = archive_read_data(o.a, b + got, (size_t)size - got);
    if (n < 0)
      return ar_fail(o.a, name, err);
    if (n == 0)
      break;
    got += (size_t)n;
  }
  if (got != (size_t)size)
    return moat_error_set(err, EINVAL, "image archive: %s: truncated", name);
  b[got] = '\0';
  *buf = steal_pointer(&b);
  *len = got;
  return 0;
}

/* --- descriptors and digests --- */

struct blob {
  char *name; /* member name */
  uint8_t digest[MOAT_SHA256_LEN];
  int64_t size; /* -1: not known (docker save legacy) */
  bool has_digest;
};

static void blob_clear(struct blob *b) {
  free(b->name);
  *b = (struct blob){0};
}

static int unhex(char c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  return -1;
}

/* "sha256:<64 lowercase hex>" (prefix optional when !prefixed) -> out. 0 or -1. */
static int parse_digest(const char *s, bool prefixed, uint8_t out[MOAT_SHA256_LEN]) {
  if (strncmp(s, "sha256:", 7) == 0)
    s += 7;
  else if (prefixed)
    return -1;
  if (strlen(s) < 64)
    return -1;
  for (int i = 0; i < 32; i++) {
    int h = unhex(s[2 * i]), l = unhex(s[2 * i + 1]);
    if (h < 0 || l < 0)
      return -1;
    out[i] = (uint8_t)(h << 4 | l);
  }
  return s[64] ? -1 : 0;
}

static void hex32(const uint8_t d[MOAT_SHA256_LEN], char out[65]) {
  for (int i = 0; i < 32; i++)
    snprintf(out + 2 * i, 3, "%02x", d[i]);
}

/* A descriptor {digest, size, mediaType} -> a blob named blobs/sha256/HEX. 0 or -1 (EINVAL). */
static int desc_blob(json_t *d, const char *what, struct blob *b, moat_error **err) {
  const char *digest = json_string_value(json_object_get(d, "digest"));
  json_t *size = json_object_get(d, "size");
  if (!json_is_object(d) || !digest || !json_is_integer(size) || json_integer_value(size) < 0)
    return moat_error_set(err, EINVAL, "%s: a descriptor needs a digest and a size", what);
  if (parse_digest(digest, true, b->digest) < 0)
    return moat_error_set(err, EINVAL, "%s: digest '%.80s' is not sha256:<64 hex>", what, digest);
  b->name = xasprintf("blobs/sha256/%s", digest + 7);
  b->size = json_integer_value(size);
  b->has_digest = true;
  return 0;
}

static int check_digest(const struct blob *b, const uint8_t got[MOAT_SHA256_LEN], const char *what,
                        moat_error **err) {
  if (!b->has_digest || memcmp(b->digest, got, MOAT_SHA256_LEN) == 0)
    return 0;
  char want_hex[65], got_hex[65];
  hex32(b->digest, want_hex);
  hex32(got, got_hex);
  return moat_error_set(err, EINVAL,
                        "%s: digest mismatch: the descriptor says sha256:%s, the blob is sha256:%s", what,
                        want_hex, got_hex);
}

/* Reads blob b (JSON, checked against its descriptor) and parses it. NULL on error. */
static json_t *blob_json(const struct src *s, const struct blob *b, const char *what, uint8_t digest[32],
                         moat_error **err) {
  _cleanup_free_ char *buf = NULL;
  size_t len;
  if (member_read(s, b->name, &buf, &len, err) < 0) {
    moat_error_wrap(err, "%s", what);
    return NULL;
  }
  if (b->size >= 0 && (int64_t)len != b->size) {
    moat_error_set(err, EINVAL, "%s: %zu bytes, the descriptor says %lld", what, len, (long long)b->size);
    return NULL;
  }
  uint8_t got[MOAT_SHA256_LEN];
  moat_sha256(buf, len, got);
  if (check_digest(b, got, what, err) < 0)
    return NULL;
  if (digest)
    memcpy(digest, got, MOAT_SHA256_LEN);
  json_error_t je;
  json_t *j = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &je);
  if (!j)
    moat_error_set(err, EINVAL, "%s: not JSON: %s (line %d)", what, je.text, je.line);
  return j;
}

/* --- picking the image --- */

/* This machine's architecture in the OCI / Go names. */
static const char *machine_arch(void) {
  static char arch[65];
  struct utsname u;
  if (uname(&u) < 0)
    return "unknown";
  static const struct {
    const char *uname, *oci;
  } map[] = {{"x86_64", "amd64"},    {"aarch64", "arm64"}, {"armv7l", "arm"},
             {"armv6l", "arm"},      {"i686", "386"},      {"i386", "386"},
             {"ppc64le", "ppc64le"}, {"s390x", "s390x"},   {"riscv64", "riscv64"}};
  for (size_t i = 0; i < ARRAY_SIZE(map); i++)
    if (strcmp(u.machine, map[i].uname) == 0)
      return map[i].oci;
  snprintf(arch, sizeof(arch), "%s", u.machine);
  return arch;
}

static bool is_index(json_t *desc_or_doc) {
  const char *mt = json_string_value(json_object_get(desc_or_doc, "mediaType"));
  if (mt)
    return strcmp(mt, "application/vnd.oci.image.index.v1+json") == 0 ||
           strcmp(mt, "application/vnd.docker.distribution.manifest.list.v2+json") == 0;
  return json_is_array(json_object_get(desc_or_doc, "manifests"));
}

static bool ref_matches(json_t *desc, const char *ref) {
  json_t *ann = json_object_get(desc, "annotations");
  const char *a = json_string_value(json_object_get(ann, "org.opencontainers.image.ref.name"));
  const char *b = json_string_value(json_object_get(ann, "io.containerd.image.name"));
  return (a && strcmp(a, ref) == 0) || (b && strcmp(b, ref) == 0);
}

static bool platform_matches(json_t *desc) {
  json_t *p = json_object_get(desc, "platform");
  const char *os = json_string_value(json_object_get(p, "os"));
  const char *arch = json_string_value(json_object_get(p, "architecture"));
  return os && arch && strcmp(os, "linux") == 0 && strcmp(arch, machine_arch()) == 0;
}

/* From the descriptors of an index's "manifests", the one to use (borrowed). NULL on error. */
static json_t *pick(json_t *manifests, const char *ref, const char *where, moat_error **err) {
  if (!json_is_array(manifests) || !json_array_size(manifests)) {
    moat_error_set(err, EINVAL, "%s: no manifests", where);
    return NULL;
  }
  size_t i, n = 0, with_platform = 0;
  json_t *d, *only = NULL, *first_match = NULL;
  json_array_foreach(manifests, i, d) {
    if (ref && !ref_matches(d, ref))
      continue;
    n++;
    only = d;
    with_platform += json_object_get(d, "platform") != NULL;
    if (!first_match && platform_matches(d))
      first_match = d;
  }
  if (ref && !n) {
    moat_error_set(err, EINVAL, "%s: no image named '%s'", where, ref);
    return NULL;
  }
  if (n == 1 && !first_match && !with_platform)
    return only;
  if (first_match)
    return first_match;
  if (!with_platform)
    moat_error_set(err, EINVAL, "%s: %zu images; name the one to import", where, n);
  else
    moat_error_set(err, EINVAL, "%s: no image for linux/%s", where, machine_arch());
  return NULL;
}

/* What the archive says to unpack. */
struct plan {
  json_t *config;
  struct blob *layers;
  size_t n_layers;
  uint8_t digest[MOAT_SHA256_LEN];
};

static void plan_clear(struct plan *p) {
  json_decref(p->config);
  for (size_t i = 0; i < p->n_layers; i++)
    blob_clear(&p->layers[i]);
  free(p->layers);
  *p = (struct plan){0};
}

static bool layer_type_ok(const char *mt) { return !mt || (strstr(mt, "tar") && !strstr(mt, "encrypted")); }

/* An OCI image layout: index.json (already read: idx) -> manifest -> config and layers. */
static int plan_oci(const struct src *s, json_t *idx, const char *ref, struct plan *p, moat_error **err) {
  json_t *d = pick(json_object_get(idx, "manifests"), ref, "index.json", err);
  if (!d)
    return -1;
  _cleanup_json_ json_t *doc = NULL;
  for (int depth = 0;; depth++) {
    _cleanup_free_ char *what = NULL;
    struct blob b = {0};
    if (desc_blob(d, "manifest", &b, err) < 0)
      return -1;
    what = xasprintf("manifest %s", b.name + 13);
    json_t *next = blob_json(s, &b, what, p->digest, err);
    blob_clear(&b);
    if (!next)
      return -1;
    json_decref(doc);
    doc = next;
    if (!is_index(doc))
      break;
    if (depth >= MAX_INDEX_DEPTH)
      return moat_error_set(err, EINVAL, "indexes nested more than %d deep", MAX_INDEX_DEPTH);
    if (!(d = pick(json_object_get(doc, "manifests"), NULL, what, err)))
      return -1;
  }
  json_t *layers = json_object_get(doc, "layers");
  struct blob cb = {0};
  if (!json_is_array(layers))
    return moat_error_set(err, EINVAL, "manifest: no layers");
  if (desc_blob(json_object_get(doc, "config"), "config", &cb, err) < 0)
    return -1;
  p->config = blob_json(s, &cb, "config", NULL, err);
  blob_clear(&cb);
  if (!p->config)
    return -1;
  if (json_array_size(layers) > MAX_LAYERS)
    return moat_error_set(err, EINVAL, "manifest: more than %d layers", MAX_LAYERS);
  p->layers = xcalloc(json_array_size(layers) + 1, sizeof(*p->layers));
  size_t i;
  json_t *l;
  json_array_foreach(layers, i, l) {
    char what[32];
    snprintf(what, sizeof(what), "layer %zu", i + 1);
    const char *mt = json_string_value(json_object_get(l, "mediaType"));
    if (!layer_type_ok(mt))
      return moat_error_set(err, EINVAL, "%s: media type %s is not a tar", what, mt);
    if (desc_blob(l, what, &p->layers[p->n_layers], err) < 0)
      return -1;
    p->n_layers++;
  }
  return 0;
}

/* Whether RepoTags tags holds ref (or ref:latest when ref has no tag). */
static bool tagged(json_t *tags, const char *ref) {
  size_t k, rl = strlen(ref);
  json_t *t;
  json_array_foreach(tags, k, t) {
    const char *tag = json_string_value(t);
    if (tag && (strcmp(tag, ref) == 0 ||
                (!strchr(ref, ':') && strncmp(tag, ref, rl) == 0 && strcmp(tag + rl, ":latest") == 0)))
      return true;
  }
  return false;
}

/* A `docker save` archive: manifest.json (already read: man) -> config (named by its digest) and
 * layers (checked against the config's diff_ids, or named blobs/sha256/HEX). */
static int plan_docker(const struct src *s, json_t *man, const char *ref, struct plan *p, moat_error **err) {
  if (!json_is_array(man) || !json_array_size(man))
    return moat_error_set(err, EINVAL, "manifest.json: not a list of images");
  json_t *pickd = NULL, *m;
  size_t i, n = 0;
  json_array_foreach(man, i, m) {
    if (!ref || tagged(json_object_get(m, "RepoTags"), ref)) {
      n++;
      if (!pickd)
        pickd = m;
    }
  }
  if (!n)
    return moat_error_set(err, EINVAL, "manifest.json: no image tagged '%s'", ref);
  if (n > 1 && !ref)
    return moat_error_set(err, EINVAL, "manifest.json: %zu images; name the one to import", n);
  const char *cfg = json_string_value(json_object_get(pickd, "Config"));
  json_t *layers = json_object_get(pickd, "Layers");
  if (!cfg || !json_is_array(layers))
    return moat_error_set(err, EINVAL, "manifest.json: an image needs Config and Layers");
  const char *why;
  struct blob cb = {.size = -1};
  if (!(cb.name = oci_norm_name(cfg, &why)))
    return moat_error_set(err, EINVAL, "manifest.json: Config %s: %s", cfg, why);
  /* The config's name is its digest: HEX.json (legacy) or blobs/sha256/HEX. */
  const char *base = strrchr(cb.name, '/') ? strrchr(cb.name, '/') + 1 : cb.name;
  char hex[65] = {0};
  if (strlen(base) == 69 && strcmp(base + 64, ".json") == 0)
    memcpy(hex, base, 64);
  else if (strncmp(cb.name, "blobs/sha256/", 13) == 0 && strlen(cb.name) == 13 + 64)
    memcpy(hex, cb.name + 13, 64);
  if (!hex[0] || parse_digest(hex, false, cb.digest) < 0) {
    blob_clear(&cb);
    return moat_error_set(err, EINVAL, "manifest.json: Config %s is not named by its digest", cfg);
  }
  cb.has_digest = true;
  p->config = blob_json(s, &cb, "config", p->digest, err);
  blob_clear(&cb);
  if (!p->config)
    return -1;
  json_t *diff_ids = json_object_get(json_object_get(p->config, "rootfs"), "diff_ids");
  if (json_array_size(layers) > MAX_LAYERS)
    return moat_error_set(err, EINVAL, "manifest.json: more than %d layers", MAX_LAYERS);
  p->layers = xcalloc(json_array_size(layers) + 1, sizeof(*p->layers));
  json_t *l;
  json_array_foreach(layers, i, l) {
    const char *ln = json_string_value(l);
    struct blob *b = &p->layers[p->n_layers];
    b->size = -1;
    if (!ln || !(b->name = oci_norm_name(ln, &why)))
      return moat_error_set(err, EINVAL, "manifest.json: layer %zu: %s", i + 1, ln ? why : "not a string");
    p->n_layers++;
    const char *id = json_string_value(json_array_get(diff_ids, i));
    if (strncmp(b->name, "blobs/sha256/", 13) == 0 && parse_digest(b->name + 13, false, b->digest) == 0)
      b->has_digest = true;
    else if (id && parse_digest(id, true, b->digest) == 0)
      b->has_digest = true;
    else
      return moat_error_set(err, EINVAL, "manifest.json: layer %zu (%s): no digest to check it against",
                            i + 1, ln);
  }
  return 0;
}

/* --- the config --- */

static int get_strv(json_t *o, const char *key, char ***out, moat_error **err) {
  json_t *v = json_object_get(o, key);
  if (!v || json_is_null(v))
    return 0;
  if (!json_is_array(v))
    return moat_error_set(err, EINVAL, "config: %s is not a list", key);
  char **r = xcalloc(json_array_size(v) + 1, sizeof(char *));
  size_t i;
  json_t *s;
  json_array_foreach(v, i, s) {
    if (!json_is_string(s)) {
      strv_free(r);
      return moat_error_set(err, EINVAL, "config: %s[%zu] is not a string", key, i);
    }
    r[i] = xstrdup(json_string_value(s));
  }
  *out = r;
  return 0;
}

static int get_str(json_t *o, const char *key, char **out, moat_error **err) {
  json_t *v = json_object_get(o, key);
  if (!v || json_is_null(v))
    return 0;
  if (!json_is_string(v))
    return moat_error_set(err, EINVAL, "config: %s is not a string", key);
  if (json_string_length(v))
    *out = xstrdup(json_string_value(v));
  return 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int parse_config(json_t *doc, struct moat_oci_config *c, moat_error **err) {
  if (!json_is_object(doc))
    return moat_error_set(err, EINVAL, "config: not an object");
  if (get_str(doc, "architecture", &c->architecture, err) < 0 || get_str(doc, "os", &c->os, err) < 0)
    return -1;
  if (!c->os || strcmp(c->os, "linux") != 0)
    return moat_error_set(err, EINVAL, "the image is for os '%s', not linux", c->os ? c->os : "");
  if (!c->architecture || strcmp(c->architecture, machine_arch()) != 0)
    return moat_error_set(err, EINVAL, "the image is for architecture '%s', this machine is %s",
                          c->architecture ? c->architecture : "", machine_arch());
  json_t *cfg = json_object_get(doc, "config");
  if (!cfg || json_is_null(cfg))
    return 0;
  if (!json_is_object(cfg))
    return moat_error_set(err, EINVAL, "config: config is not an object");
  if (get_strv(cfg, "Env", &c->env, err) < 0 || get_str(cfg, "WorkingDir", &c->workdir, err) < 0 ||
      get_str(cfg, "User", &c->user, err) < 0 || get_strv(cfg, "Entrypoint", &c->entrypoint, err) < 0 ||
      get_strv(cfg, "Cmd", &c->cmd, err) < 0 || get_str(cfg, "StopSignal", &c->stopsignal, err) < 0)
    return -1;
  for (size_t i = 0; c->env && c->env[i]; i++)
    if (!strchr(c->env[i], '=') || c->env[i][0] == '=')
      return moat_error_set(err, EINVAL, "config: Env entry '%.80s' is not K=V", c->env[i]);
  json_t *ports = json_object_get(cfg, "ExposedPorts");
  if (ports && !json_is_null(ports)) {
    if (!json_is_object(ports))
      return moat_error_set(err, EINVAL, "config: ExposedPorts is not an object");
    c->exposed = xcalloc(json_object_size(ports) + 1, sizeof(char *));
    size_t n = 0;
    const char *k;
    json_t *v;
    json_object_foreach(ports, k, v) c->exposed[n++] = xstrdup(k);
    qsort(c->exposed, n, sizeof(char *), cmp_str);
  }
  json_t *labels = json_object_get(cfg, "Labels");
  if (labels && !json_is_null(labels)) {
    if (!json_is_object(labels))
      return moat_error_set(err, EINVAL, "config: Labels is not an object");
    c->labels = json_deep_copy(labels);
  }
  return 0;
}

/* --- layers --- */

/* Feeds a layer blob from the outer archive to the layer's reader, hashing and counting it. */
struct feed {
  struct archive *outer;
  struct moat_sha256 h;
  uint64_t n;
  char buf[BUF_SIZE];
};

static la_ssize_t feed_read(struct archive *inner, void *arg, const void **out) {
  struct feed *f = arg;
  la_ssize_t n = archive_read_data(f->outer, f->buf, sizeof(f->buf));
  if (n < 0) {
    archive_set_error(inner, archive_errno(f->outer), "%s",
                      archive_error_string(f->outer) ? archive_error_string(f->outer) : "read error");
    return -1;
  }
  moat_sha256_update(&f->h, f->buf, (size_t)n);
  f->n += (uint64_t)n;
  *out = f->buf;
  return n;
}

/* Reads the rest of the blob (what the layer's reader left) into the digest. */
static int feed_drain(struct feed *f, const char *what, moat_error **err) {
  for (;;) {
    la_ssize_t n = archive_read_data(f->outer, f->buf, sizeof(f->buf));
    if (n < 0)
      return ar_fail(f->outer, what, err);
    if (n == 0)
      return 0;
    moat_sha256_update(&f->h, f->buf, (size_t)n);
    f->n += (uint64_t)n;
  }
}

/* Puts e into *err (or frees it when err is NULL); -1. */
static int hand_over(moat_error **err, moat_error *e) {
  if (err && !*err)
    *err = e;
  else
    moat_error_free(&e);
  return -1;
}

static int apply_layer(const struct src *s, struct oci_unpack *u, const struct blob *b, size_t i,
                       moat_error **err) {
  char hex[65];
  hex32(b->digest, hex);
  char label[48];
  snprintf(label, sizeof(label), "%zu (sha256:%.12s)", i + 1, hex);
  _cleanup_free_ char *what = xasprintf("layer %s", label);
  _cleanup_outer_ struct outer o = {0};
  int64_t size;
  if (member_open(s, b->name, &o, &size, err) < 0)
    return moat_error_wrap(err, "%s", what);
  if (b->size >= 0 && size != b->size)
    return moat_error_set(err, EINVAL, "%s: %lld bytes, the descriptor says %lld", what, (long long)size,
                          (long long)b->size);
  _cleanup_free_ struct feed *f = xcalloc(1, sizeof(*f));
  f->outer = o.a;
  moat_sha256_init(&f->h);
  struct archive *in = archive_read_new();
  if (!in)
    moat_oom("archive_read_new", 0, __FILE__, __LINE__);
  archive_read_support_filter_gzip(in);
  archive_read_support_filter_zstd(in);
  archive_read_support_format_tar(in);
  archive_read_set_read_callback(in, feed_read);
  archive_read_set_callback_data(in, f);
  int rc = 0;
  moat_error *uerr = NULL;
  if (archive_read_open1(in) != ARCHIVE_OK)
    rc = ar_fail(in, what, &uerr);
  else
    rc = oci_unpack_layer(u, in, label, &uerr);
  archive_read_free(in);
  /* A digest that does not match is the error to report, whatever the layer's reader made of it. */
  moat_error *derr = NULL;
  if (feed_drain(f, what, &derr) < 0) {
    moat_error_free(&uerr);
    return hand_over(err, derr);
  }
  uint8_t got[MOAT_SHA256_LEN];
  moat_sha256_final(&f->h, got);
  if (check_digest(b, got, what, &derr) < 0) {
    moat_error_free(&uerr);
    return hand_over(err, derr);
  }
  return rc < 0 ? hand_over(err, uerr) : 0;
}

/* --- the source --- */

/* A regular file is used as it is; anything else is copied into an unlinked file in work_dir. */
static int src_open(int fd, const char *work_dir, uint64_t max_bytes, int *spool, struct src *s,
                    moat_error **err) {
  struct stat st;
  if (fstat(fd, &st) < 0)
    return moat_error_errno(err, "stat the image archive");
  if (S_ISREG(st.st_mode)) {
    *s = (struct src){.fd = fd, .size = st.st_size};
    return 0;
  }
  _cleanup_close_ int t = open(work_dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (t < 0) {
    _cleanup_free_ char *tmpl = xasprintf("%s/oci-spool-XXXXXX", work_dir);
    t = mkostemp(tmpl, O_CLOEXEC);
    if (t < 0)
      return moat_error_errno(err, "spool the image archive into %s", work_dir);
    unlink(tmpl);
  }
  uint64_t limit = max_bytes > (UINT64_MAX - (64u << 20)) / 4 ? UINT64_MAX : max_bytes * 4 + (64u << 20);
  _cleanup_free_ char *buf = xmalloc(BUF_SIZE);
  uint64_t total = 0;
  for (;;) {
    ssize_t n = read(fd, buf, BUF_SIZE);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      return moat_error_errno(err, "read the image archive");
    if (n == 0)
      break;
    total += (uint64_t)n;
    if (total > limit)
      return moat_error_set(err, EFBIG, "the image archive is over %llu bytes", (unsigned long long)limit);
    if (write_all(t, buf, (size_t)n) < 0)
      return moat_error_errno(err, "spool the image archive");
  }
  *s = (struct src){.fd = t, .size = (off_t)total};
  *spool = steal_fd(&t);
  return 0;
}

int moat_oci_import(int archive_fd, const char *ref, const char *work_dir, const char *rootfs_dir,
                    uint64_t max_bytes, size_t max_entries, struct moat_oci_config *out, moat_error **err) {
  *out = (struct moat_oci_config){0};
  _cleanup_close_ int spool = -1;
  struct src s;
  if (src_open(archive_fd, work_dir, max_bytes, &spool, &s, err) < 0)
    return -1;

  struct plan p = {0};
  int rc = -1;
  _cleanup_free_ char *buf = NULL;
  size_t len;
  moat_error *e1 = NULL;
  json_error_t je;
  if (member_read(&s, "index.json", &buf, &len, &e1) == 0) {
    _cleanup_json_ json_t *idx = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &je);
    if (!idx)
      moat_error_set(err, EINVAL, "index.json: not JSON: %s (line %d)", je.text, je.line);
    else if (plan_oci(&s, idx, ref, &p, err) == 0)
      rc = 0;
  } else if (e1->status == ENOENT && member_read(&s, "manifest.json", &buf, &len, err) == 0) {
    _cleanup_json_ json_t *man = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &je);
    if (!man)
      moat_error_set(err, EINVAL, "manifest.json: not JSON: %s (line %d)", je.text, je.line);
    else if (plan_docker(&s, man, ref, &p, err) == 0)
      rc = 0;
  } else if (e1->status != ENOENT) {
    hand_over(err, steal_pointer(&e1));
  } else if (err && *err && (*err)->status == ENOENT) {
    moat_error_free(err);
    moat_error_set(err, EINVAL, "not an image archive: no index.json (OCI) nor manifest.json (docker save)");
  }
  moat_error_free(&e1);
  if (rc < 0 || parse_config(p.config, out, err) < 0)
    goto fail;
  memcpy(out->digest, p.digest, MOAT_SHA256_LEN);

  struct oci_unpack u;
  if (oci_unpack_init(&u, rootfs_dir, max_bytes, max_entries, err) < 0) {
    oci_unpack_fini(&u);
    goto fail;
  }
  for (size_t i = 0; i < p.n_layers; i++)
    if (apply_layer(&s, &u, &p.layers[i], i, err) < 0) {
      oci_unpack_fini(&u);
      goto fail;
    }
  oci_unpack_fini(&u);
  plan_clear(&p);
  return 0;
fail:
  plan_clear(&p);
  moat_oci_config_clear(out);
  return moat_error_wrap(err, "import image");
}

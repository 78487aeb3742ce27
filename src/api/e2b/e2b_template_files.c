/* e2b_template_files.c -- the files of E2B's template builds: the signed URLs the SDK uploads a
 * copy()'s tar.gz to (see e2b_template.c for the URL's form) and the build context made of a
 * build's Dockerfile and its uploads
 */
#include <archive.h>
#include <archive_entry.h>
#include <errno.h>
#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../common/buf.h"
#include "../../common/json_cleanup.h"
#include "e2b_internal.h"

#define UPLOAD_TTL_S (2 * 3600)
#define FILES_DIR "e2b-files"

static const char *header(struct api_req *r, const char *name) {
  return MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, name);
}

/* ---- upload URLs ---- */

static void hex_of(const uint8_t *b, size_t n, char *out) {
  static const char d[] = "0123456789abcdef";
  for (size_t i = 0; i < n; i++) {
    out[2 * i] = d[b[i] >> 4];
    out[2 * i + 1] = d[b[i] & 15];
  }
  out[2 * n] = '\0';
}

static void upload_sig(struct api_req *r, const char *org, const char *tid, const char *hash, const char *exp,
                       char out[65]) {
  struct moat_buf m = {0};
  moat_buf_append(&m, "upload", 7);
  moat_buf_append(&m, org, strlen(org) + 1);
  moat_buf_append(&m, tid, strlen(tid) + 1);
  moat_buf_append(&m, hash, strlen(hash) + 1);
  moat_buf_append(&m, exp, strlen(exp));
  uint8_t mac[32];
  e2b_hmac(e2b_state(r)->secret, sizeof(e2b_state(r)->secret), m.p, m.len, mac);
  free(m.p);
  hex_of(mac, sizeof(mac), out);
}

char *e2b_template_upload_url(struct api_req *r, const char *tid, const char *hash) {
  const char *host = header(r, MHD_HTTP_HEADER_HOST);
  const char *proto = header(r, "X-Forwarded-Proto");
  bool https = proto && strcasecmp(proto, "https") == 0;
  char exp[24], sig[65];
  snprintf(exp, sizeof(exp), "%lld", (long long)(now_unix() + UPLOAD_TTL_S));
  upload_sig(r, r->org, tid, hash, exp, sig);
  size_t ol = strlen(r->org);
  _cleanup_free_ char *orghex = xmalloc(2 * ol + 1);
  hex_of((const uint8_t *)r->org, ol, orghex);
  return xasprintf("%s://%s/templates/%s/files/%s?org=%s&exp=%s&sig=%s", https ? "https" : "http",
                   host && *host ? host : "127.0.0.1", tid, hash, orghex, exp, sig);
}

/* The org an upload URL's signature vouches for (caller frees), or NULL. */
static char *upload_org(struct api_req *r, const char *tid, const char *hash) {
  const char *oh = api_arg_get(&r->args, "org"), *exp = api_arg_get(&r->args, "exp"),
             *sig = api_arg_get(&r->args, "sig");
  uint64_t e;
  if (!oh || !exp || !sig || strlen(sig) != 64 || parse_u64(exp, &e) < 0 || (int64_t)e < now_unix())
    return NULL;
  size_t hl = strlen(oh);
  if (hl == 0 || hl % 2 || hl > 512)
    return NULL;
  char *org = xmalloc(hl / 2 + 1);
  for (size_t i = 0; i < hl / 2; i++) {
    unsigned v;
    if (sscanf(oh + 2 * i, "%2x", &v) != 1 || v == 0) {
      free(org);
      return NULL;
    }
    org[i] = (char)v;
  }
  org[hl / 2] = '\0';
  char want[65];
  upload_sig(r, org, tid, hash, exp, want);
  unsigned diff = 0;
  for (size_t i = 0; i < 64; i++)
    diff |= (unsigned)(want[i] ^ sig[i]);
  if (diff) {
    free(org);
    return NULL;
  }
  return org;
}

struct upload {
  int fd;
  uint64_t size, max;
  char tid[64], hash[65];
};

static void upload_free(void *p) {
  struct upload *u = p;
  if (u->fd >= 0)
    close(u->fd);
  free(u);
}

bool e2b_template_upload_begin(struct api_req *r, struct e2b_req *e) {
  /* PUT /templates/TID/files/HASH */
  const char *t = r->path;
  if (strcmp(r->method, "PUT") != 0 || strncmp(t, "/templates/", 11) != 0)
    return false;
  const char *slash = strchr(t + 11, '/');
  if (!slash || strncmp(slash, "/files/", 7) != 0 || strchr(slash + 7, '/') || slash - (t + 11) >= 64)
    return false;
  e->upload = true;
  char tid[64];
  memcpy(tid, t + 11, (size_t)(slash - (t + 11)));
  tid[slash - (t + 11)] = '\0';
  const char *hash = slash + 7;
  if (!api_valid_template_name(tid) || !moat_build_file_hash_valid(hash))
    return e2b_error(r, 404, "no such upload: %.256s", r->path), true;
  char *org = upload_org(r, tid, hash);
  if (!org)
    return e2b_error(r, 403, "the upload URL is not valid (signature, or expired: ask for a new one)"), true;
  r->org = org;
  e->org = xstrdup(org);
  moat_error *err = NULL;
  if (api_req_admit(r, r->org, NULL, false, &err) < 0)
    return e2b_moat_error(r, &err), true;
  struct upload *u = xcalloc(1, sizeof(*u));
  u->fd = -1;
  u->max = moat_control_upload_max(api_control(r));
  snprintf(u->tid, sizeof(u->tid), "%s", tid);
  snprintf(u->hash, sizeof(u->hash), "%s", hash);
  e->sub = u;
  e->sub_free = upload_free;
  const char *cl = header(r, MHD_HTTP_HEADER_CONTENT_LENGTH);
  uint64_t n;
  if (cl && parse_u64(cl, &n) == 0 && n > u->max)
    return e2b_error(r, 413, "the upload is larger than %llu bytes", (unsigned long long)u->max), true;
  u->fd = moat_control_upload_spool(api_control(r), &err);
  if (u->fd < 0)
    return e2b_moat_error(r, &err), true;
  return false;
}

int e2b_template_upload_body(struct api_req *r, struct e2b_req *e, const char *data, size_t len,
                             moat_error **err) {
  struct upload *u = e->sub;
  if (!u || u->fd < 0)
    return 0;
  if (len > u->max - u->size)
    return moat_error_set(err, EMSGSIZE, "the upload is larger than %llu bytes", (unsigned long long)u->max);
  if (write_all(u->fd, data, len) < 0)
    return moat_error_errno(err, "spool the upload");
  u->size += len;
  return 0;
}

void e2b_template_upload_finish(struct api_req *r, struct e2b_req *e) {
  struct upload *u = e->sub;
  if (r->responded || !u)
    return;
  moat_error *err = NULL;
  if (u->size == 0) {
    e2b_error(r, 400, "the upload is empty (a tar.gz of the files was expected)");
    return;
  }
  if (moat_control_build_file_store(api_control(r), r->org, u->hash, u->fd, &err) < 0) {
    e2b_moat_error(r, &err);
    return;
  }
  api_reply_empty(r, 200);
}

/* ---- the build context: the Dockerfile and every COPY's upload under e2b-files/STEP/ ---- */

static int ar_fail(struct archive *a, const char *what, moat_error **err) {
  return moat_error_set(err, EINVAL, "%s: %s", what,
                        archive_error_string(a) ? archive_error_string(a) : "error");
}

/* True when a symlink at path (relative) to target stays inside the upload's root. */
static bool link_inside(const char *path, const char *target) {
  if (!*target || *target == '/')
    return false;
  int depth = 0;
  for (const char *p = path; *p; p++)
    if (*p == '/' && p[1] && p[1] != '/')
      depth++;
  const char *p = target;
  while (*p) {
    const char *e = strchr(p, '/');
    size_t n = e ? (size_t)(e - p) : strlen(p);
    if (n == 2 && p[0] == '.' && p[1] == '.') {
      if (--depth < 0)
        return false;
    } else if (n && !(n == 1 && p[0] == '.')) {
      depth++;
    }
    p += n;
    while (*p == '/')
      p++;
  }
  return true;
}

static int copy_upload(struct api_req *r, struct archive *w, json_int_t step, const char *hash,
                       json_t *warnings, moat_error **err) {
  _cleanup_close_ int fd = -1;
  if (moat_control_build_file_open(api_control(r), r->org, hash, &fd, err) < 0)
    return -1;
  struct archive *a = archive_read_new();
  archive_read_support_filter_all(a);
  archive_read_support_format_tar(a);
  archive_read_support_format_gnutar(a);
  archive_read_support_format_empty(a);
  int ret = 0;
  _cleanup_free_ char *what = xasprintf("the upload of step %lld (%s)", (long long)step, hash);
  if (archive_read_open_fd(a, fd, 65536) != ARCHIVE_OK) {
    ret = ar_fail(a, what, err);
    goto out;
  }
  struct archive_entry *en;
  int rc;
  while ((rc = archive_read_next_header(a, &en)) == ARCHIVE_OK) {
    const char *path = archive_entry_pathname(en);
    while (path && path[0] == '.' && path[1] == '/')
      path += 2;
    if (!path || !*path || strcmp(path, ".") == 0)
      continue;
    if (!e2b_template_path_ok(path)) {
      ret =
          moat_error_set(err, EINVAL, "%s: the entry '%.200s' is not a path inside the context", what, path);
      goto out;
    }
    const char *link = archive_entry_symlink(en);
    if (link && !link_inside(path, link)) {
      if (json_array_size(warnings) < 32)
        json_array_append_new(
            warnings, json_sprintf("step %lld: symlink %.200s -> %.200s left out (moat keeps only symlinks "
                                   "that stay inside the copied files; copy with resolveSymlinks to "
                                   "copy what it points to)",
                                   (long long)step, path, link));
      continue;
    }
    _cleanup_free_ char *np = xasprintf(FILES_DIR "/%lld/%s", (long long)step, path);
    archive_entry_set_pathname(en, np);
    const char *hl = archive_entry_hardlink(en);
    if (hl) {
      _cleanup_free_ char *nh =
          xasprintf(FILES_DIR "/%lld/%s", (long long)step, hl[0] == '.' && hl[1] == '/' ? hl + 2 : hl);
      archive_entry_set_hardlink(en, nh);
    }
    if (archive_write_header(w, en) != ARCHIVE_OK) {
      ret = ar_fail(w, "the build context", err);
      goto out;
    }
    const void *blk;
    size_t sz;
    la_int64_t off;
    int dr;
    while ((dr = archive_read_data_block(a, &blk, &sz, &off)) == ARCHIVE_OK)
      if (archive_write_data(w, blk, sz) < 0) {
        ret = ar_fail(w, "the build context", err);
        goto out;
      }
    if (dr != ARCHIVE_EOF) {
      ret = ar_fail(a, what, err);
      goto out;
    }
  }
  if (rc != ARCHIVE_EOF)
    ret = ar_fail(a, what, err);
out:
  archive_read_free(a);
  return ret;
}

int e2b_template_context(struct api_req *r, const char *df, size_t df_len, json_t *copies, json_t *warnings,
                         int *out, moat_error **err) {
  _cleanup_close_ int fd = moat_control_upload_spool(api_control(r), err);
  if (fd < 0)
    return -1;
  struct archive *w = archive_write_new();
  archive_write_set_format_pax_restricted(w);
  int ret = 0;
  if (archive_write_open_fd(w, fd) != ARCHIVE_OK) {
    ret = ar_fail(w, "the build context", err);
    goto out;
  }
  struct archive_entry *en = archive_entry_new();
  archive_entry_set_pathname(en, "Dockerfile");
  archive_entry_set_filetype(en, AE_IFREG);
  archive_entry_set_perm(en, 0644);
  archive_entry_set_size(en, (la_int64_t)df_len);
  if (archive_write_header(w, en) != ARCHIVE_OK || archive_write_data(w, df, df_len) < 0) {
    archive_entry_free(en);
    ret = ar_fail(w, "the build context", err);
    goto out;
  }
  archive_entry_free(en);
  size_t i;
  json_t *c;
  json_array_foreach(copies, i, c) {
    if (copy_upload(r, w, json_integer_value(json_object_get(c, "i")),
                    json_string_value(json_object_get(c, "hash")), warnings, err) < 0) {
      ret = -1;
      goto out;
    }
  }
  if (archive_write_close(w) != ARCHIVE_OK) {
    ret = ar_fail(w, "the build context", err);
    goto out;
  }
  if (lseek(fd, 0, SEEK_SET) < 0) {
    ret = moat_error_errno(err, "rewind the build context");
    goto out;
  }
  *out = steal_fd(&fd);
out:
  archive_write_free(w);
  return ret;
}

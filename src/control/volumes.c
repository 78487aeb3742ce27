/* volumes.c -- an org's volumes: records in the store, storage on the host, attachments at create */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "../common/log.h"
#include "../common/util.h"
#include "../host/vfiles.h"
#include "control_internal.h"

void moat_volume_info_clear(struct moat_volume_info *v) {
  if (!v)
    return;
  free(v->name);
  for (size_t i = 0; i < v->n_attached; i++) {
    free(v->attached[i].sandbox_id);
    free(v->attached[i].path);
  }
  free(v->attached);
  memset(v, 0, sizeof(*v));
}

void moat_volume_infos_free(struct moat_volume_info *v, size_t n) {
  for (size_t i = 0; v && i < n; i++)
    moat_volume_info_clear(&v[i]);
  free(v);
}

bool moat_volume_name_valid(const char *s) {
  size_t n = strlen(s);
  if (n == 0 || n > 63)
    return false;
  for (size_t i = 0; i < n; i++) {
    char ch = s[i];
    bool alnum = (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9');
    if (!alnum && (i == 0 || (ch != '_' && ch != '.' && ch != '-')))
      return false;
  }
  return true;
}

/* True when path is dir or beneath it. */
static bool under(const char *path, const char *dir) {
  size_t n = strlen(dir);
  return strncmp(path, dir, n) == 0 && (path[n] == '\0' || path[n] == '/');
}

int moat_volume_mounts_check(const struct moat_volume_mount *v, size_t n, moat_error **err) {
  static const char *const reserved[] = {"/proc", "/sys", "/dev", "/run/moat"};
  if (n > MOAT_MAX_SANDBOX_VOLUMES)
    return moat_error_set(err, EINVAL, "volumes: at most %d", MOAT_MAX_SANDBOX_VOLUMES);
  for (size_t i = 0; i < n; i++) {
    const char *p = v[i].path;
    if (!v[i].name || !moat_volume_name_valid(v[i].name))
      return moat_error_set(err, EINVAL, "volumes[%zu].name: must match [a-z0-9][a-z0-9_.-]{0,62}", i);
    if (!p || p[0] != '/')
      return moat_error_set(err, EINVAL, "volumes[%zu].path: must be an absolute path", i);
    if (strlen(p) > 1024)
      return moat_error_set(err, EINVAL, "volumes[%zu].path: longer than 1024 bytes", i);
    for (const char *q = p; *q; q++)
      if ((unsigned char)*q < 0x20 || *q == 0x7f)
        return moat_error_set(err, EINVAL, "volumes[%zu].path: has a control character", i);
    bool only_slashes = true, dots = false;
    for (const char *q = p; *q;) {
      while (*q == '/')
        q++;
      size_t len = strcspn(q, "/");
      if (len)
        only_slashes = false;
      if ((len == 1 && q[0] == '.') || (len == 2 && q[0] == '.' && q[1] == '.'))
        dots = true;
      q += len;
    }
    if (only_slashes)
      return moat_error_set(err, EINVAL, "volumes[%zu].path: a volume cannot be mounted at /", i);
    if (dots)
      return moat_error_set(err, EINVAL, "volumes[%zu].path: '.' and '..' are not allowed", i);
    /* compare without doubled or trailing slashes */
    char norm[1100];
    size_t k = 0;
    for (const char *q = p; *q && k < sizeof(norm) - 1; q++)
      if (!(*q == '/' && (k > 0 && norm[k - 1] == '/')))
        norm[k++] = *q;
    while (k > 1 && norm[k - 1] == '/')
      k--;
    norm[k] = '\0';
    for (size_t r = 0; r < ARRAY_SIZE(reserved); r++)
      if (under(norm, reserved[r]))
        return moat_error_set(err, EINVAL, "volumes[%zu].path: %s is reserved", i, reserved[r]);
    for (size_t j = 0; j < i; j++)
      if (strcmp(v[j].path, p) == 0)
        return moat_error_set(err, EINVAL, "volumes[%zu].path: %.256s is used twice", i, p);
  }
  return 0;
}

/* The API's error for a store error about volumes. */
static int remap(moat_error **err) {
  if (err && *err && (*err)->status == ENOENT)
    (*err)->status = MOAT_E_NO_VOLUME;
  else if (err && *err && (*err)->status == EBUSY)
    (*err)->status = MOAT_E_VOLUME_IN_USE;
  return -1;
}

static int info_of(struct moat_control *c, const struct moat_store_volume *r, struct moat_volume_info *out,
                   moat_error **err) {
  memset(out, 0, sizeof(*out));
  struct moat_store_attachment *a = NULL;
  size_t na = 0;
  if (moat_store_attachments(c->store, r->id, NULL, &a, &na, err) < 0)
    return -1;
  out->name = xstrdup(r->name);
  out->size_mb = r->size_mb;
  out->created_at_ms = r->created_at_ms;
  out->attached = na ? xcalloc(na, sizeof(*out->attached)) : NULL;
  for (size_t i = 0; i < na; i++) {
    out->attached[i].sandbox_id = xstrdup(a[i].sandbox_id);
    out->attached[i].path = xstrdup(a[i].path);
    out->attached[i].read_only = a[i].read_only;
  }
  out->n_attached = na;
  moat_store_attachments_free(a, na);
  struct moat_disk_usage u = {0};
  moat_error *e = NULL;
  if (moat_host_volume_usage(c->host, r->id, &u, &e) == 0)
    out->used_bytes = u.used_bytes;
  else {
    log_warn("volume %s: usage: %s", r->name, moat_error_msg(e));
    moat_error_free(&e);
  }
  return 0;
}

int moat_control_volume_create(struct moat_control *c, const char *org, const char *name, uint64_t size_mb,
                               struct moat_volume_info *out, moat_error **err) {
  if (!moat_volume_name_valid(name))
    return moat_error_set(err, EINVAL, "name: must match [a-z0-9][a-z0-9_.-]{0,62}");
  uint64_t max = c->bounds.disk_fs_mb;
  if (size_mb < MOAT_MIN_VOLUME_MB || size_mb > max)
    return moat_error_set(err, EINVAL, "size_mb: must be between %d and %llu (the data filesystem's size)",
                          MOAT_MIN_VOLUME_MB, (unsigned long long)max);
  struct moat_store_volume row = {0};
  moat_error *e = NULL;
  if (moat_store_volume_get(c->store, org, name, &row, &e) == 0) {
    moat_store_volume_clear(&row);
    return moat_error_set(err, EEXIST, "volume '%s' exists", name);
  }
  moat_error_free(&e);
  char vid[20] = "v-";
  random_id(vid + 2, 16);
  vid[18] = '\0';
  if (moat_host_volume_create(c->host, vid, size_mb, err) < 0) {
    if (err && *err && (*err)->status != ENOSPC)
      (*err)->status = EIO;
    return moat_error_wrap(err, "create volume '%s'", name);
  }
  row = (struct moat_store_volume){.id = vid,
                                   .org = (char *)org,
                                   .name = (char *)name,
                                   .size_mb = size_mb,
                                   .created_at_ms = now_unix_ms()};
  if (moat_store_volume_insert(c->store, &row, err) < 0) {
    moat_host_volume_remove(c->host, vid, NULL);
    return -1;
  }
  log_info("volume %s (%s) created for %s: %llu MiB", name, vid, org, (unsigned long long)size_mb);
  return out ? info_of(c, &row, out, err) : 0;
}

int ctl_volume_copy(struct moat_control *c, const char *org, const char *src_name, const char *dst_name,
                    moat_error **err) {
  if (!moat_volume_name_valid(dst_name))
    return moat_error_set(err, EINVAL, "name: must match [a-z0-9][a-z0-9_.-]{0,62}");
  struct moat_store_volume src = {0};
  if (moat_store_volume_get(c->store, org, src_name, &src, err) < 0)
    return remap(err);
  struct moat_store_volume row = {0};
  moat_error *e = NULL;
  if (moat_store_volume_get(c->store, org, dst_name, &row, &e) == 0) {
    moat_store_volume_clear(&row);
    moat_store_volume_clear(&src);
    return moat_error_set(err, EEXIST, "volume '%s' exists", dst_name);
  }
  moat_error_free(&e);
  char vid[20] = "v-";
  random_id(vid + 2, 16);
  vid[18] = '\0';
  int ret = moat_host_volume_copy(c->host, src.id, vid, err);
  if (ret < 0) {
    if (err && *err && (*err)->status != ENOSPC)
      (*err)->status = EIO;
    moat_error_wrap(err, "copy volume '%s'", src_name);
  } else {
    row = (struct moat_store_volume){.id = vid,
                                     .org = (char *)org,
                                     .name = (char *)dst_name,
                                     .size_mb = src.size_mb,
                                     .created_at_ms = now_unix_ms()};
    ret = moat_store_volume_insert(c->store, &row, err);
    if (ret < 0)
      moat_host_volume_remove(c->host, vid, NULL);
    else
      log_info("volume %s (%s) of %s copied from %s (%s)", dst_name, vid, org, src_name, src.id);
  }
  moat_store_volume_clear(&src);
  return ret;
}

int moat_control_volume_get(struct moat_control *c, const char *org, const char *name,
                            struct moat_volume_info *out, moat_error **err) {
  struct moat_store_volume row = {0};
  if (moat_store_volume_get(c->store, org, name, &row, err) < 0)
    return remap(err);
  int ret = info_of(c, &row, out, err);
  moat_store_volume_clear(&row);
  return ret;
}

int moat_control_volume_list(struct moat_control *c, const char *org, struct moat_volume_info **out,
                             size_t *n, moat_error **err) {
  struct moat_store_volume *rows = NULL;
  size_t nr = 0;
  *out = NULL;
  *n = 0;
  if (moat_store_volume_list(c->store, org, &rows, &nr, err) < 0)
    return -1;
  struct moat_volume_info *v = nr ? xcalloc(nr, sizeof(*v)) : NULL;
  for (size_t i = 0; i < nr; i++)
    if (info_of(c, &rows[i], &v[i], err) < 0) {
      moat_volume_infos_free(v, i);
      moat_store_volumes_free(rows, nr);
      return -1;
    }
  moat_store_volumes_free(rows, nr);
  *out = v;
  *n = nr;
  return 0;
}

int moat_control_volume_delete(struct moat_control *c, const char *org, const char *name, moat_error **err) {
  _cleanup_free_ char *vid = NULL;
  if (moat_store_volume_delete(c->store, org, name, &vid, err) < 0)
    return remap(err);
  moat_error *e = NULL;
  if (moat_host_volume_remove(c->host, vid, &e) < 0) {
    log_error("volume %s (%s) deleted, its storage not removed: %s", name, vid, moat_error_msg(e));
    moat_error_free(&e);
  }
  log_info("volume %s (%s) of %s deleted", name, vid, org);
  return 0;
}

/* A directory fd of the root of org's volume name (caller closes). */
static int volume_root(struct moat_control *c, const char *org, const char *name, moat_error **err) {
  struct moat_store_volume row = {0};
  if (moat_store_volume_get(c->store, org, name, &row, err) < 0)
    return remap(err);
  int fd = moat_host_volume_root(c->host, row.id, err);
  moat_store_volume_clear(&row);
  return fd;
}

int moat_control_volume_path_check(const char *path, moat_error **err) {
  return moat_vfile_check_path(path, err);
}

int moat_control_volume_open(struct moat_control *c, const char *org, const char *name, const char *path,
                             int *fd, bool *is_dir, uint64_t *size, moat_error **err) {
  if (moat_vfile_check_path(path, err) < 0)
    return -1;
  _cleanup_close_ int root = volume_root(c, org, name, err);
  if (root < 0)
    return -1;
  return moat_vfile_open(root, path, fd, is_dir, size, err);
}

int moat_control_volume_list_dir(int dir_fd, const char *path, struct moat_file_entry **out, size_t *n,
                                 moat_error **err) {
  return moat_vfile_list(dir_fd, path, out, n, err);
}

int moat_control_volume_remove(struct moat_control *c, const char *org, const char *name, const char *path,
                               moat_error **err) {
  if (moat_vfile_check_path(path, err) < 0)
    return -1;
  _cleanup_close_ int root = volume_root(c, org, name, err);
  if (root < 0)
    return -1;
  return moat_vfile_remove(root, path, err);
}

int moat_control_volume_write_open(struct moat_control *c, const char *org, const char *name,
                                   const char *path, uint32_t mode, struct moat_vfile_writer **w,
                                   moat_error **err) {
  if (moat_vfile_check_path(path, err) < 0)
    return -1;
  _cleanup_close_ int root = volume_root(c, org, name, err);
  if (root < 0)
    return -1;
  return moat_vfile_write_open(root, path, (mode_t)mode, w, err);
}

int moat_control_volume_write(struct moat_vfile_writer *w, const char *data, size_t len, moat_error **err) {
  return moat_vfile_write(w, data, len, err);
}

int moat_control_volume_write_finish(struct moat_vfile_writer *w, uint64_t *written, moat_error **err) {
  return moat_vfile_write_finish(w, written, err);
}

void moat_control_volume_write_close(struct moat_vfile_writer *w) { moat_vfile_writer_close(w); }

int ctl_volumes_precheck(struct moat_control *c, const char *org, const struct moat_volume_mount *v, size_t n,
                         moat_error **err) {
  for (size_t i = 0; i < n; i++) {
    struct moat_store_volume row = {0};
    if (moat_store_volume_get(c->store, org, v[i].name, &row, err) < 0)
      return remap(err);
    struct moat_store_attachment *a = NULL;
    size_t na = 0;
    int rc = moat_store_attachments(c->store, row.id, NULL, &a, &na, err);
    moat_store_volume_clear(&row);
    if (rc < 0)
      return -1;
    const char *holder = NULL;
    for (size_t j = 0; j < na && !holder && !v[i].read_only; j++)
      if (!a[j].read_only)
        holder = a[j].sandbox_id;
    if (holder)
      moat_error_set(err, MOAT_E_VOLUME_IN_USE, "volume '%s' is attached read-write to sandbox %s", v[i].name,
                     holder);
    moat_store_attachments_free(a, na);
    if (holder)
      return -1;
  }
  return 0;
}

int ctl_volumes_claim(struct moat_control *c, const char *org, const char *id,
                      const struct moat_volume_mount *v, size_t n, moat_error **err) {
  struct moat_store_claim claims[MOAT_MAX_SANDBOX_VOLUMES];
  memset(claims, 0, sizeof(claims));
  for (size_t i = 0; i < n; i++)
    claims[i] = (struct moat_store_claim){.name = v[i].name, .path = v[i].path, .read_only = v[i].read_only};
  int rc = moat_store_volume_claim(c->store, org, id, claims, n, err);
  for (size_t i = 0; i < n; i++)
    free(claims[i].volume_id);
  return rc < 0 ? remap(err) : 0;
}

int ctl_volumes_attach(struct moat_control *c, const char *id, int slot, moat_error **err) {
  struct moat_store_attachment *a = NULL;
  size_t na = 0;
  if (moat_store_attachments(c->store, NULL, id, &a, &na, err) < 0)
    return -1;
  int ret = 0;
  for (size_t i = 0; i < na && ret == 0; i++)
    if (moat_host_volume_attach(c->host, slot, a[i].volume_id, a[i].path, a[i].read_only, err) < 0) {
      if (err && *err && (*err)->status != ELOOP && (*err)->status != ENOTDIR)
        (*err)->status = EIO;
      ret = moat_error_wrap(err, "volume '%s' at %s", a[i].volume_name, a[i].path);
    }
  moat_store_attachments_free(a, na);
  return ret;
}

void ctl_volumes_of(struct moat_control *c, const char *id, struct moat_sandbox_info *out) {
  struct moat_store_attachment *a = NULL;
  size_t na = 0;
  moat_error *e = NULL;
  if (moat_store_attachments(c->store, NULL, id, &a, &na, &e) < 0) {
    log_warn("sandbox %s: its volumes: %s", id, moat_error_msg(e));
    moat_error_free(&e);
    return;
  }
  out->volumes = na ? xcalloc(na, sizeof(*out->volumes)) : NULL;
  for (size_t i = 0; i < na; i++)
    out->volumes[i] = (struct moat_sandbox_volume){
        .name = xstrdup(a[i].volume_name), .path = xstrdup(a[i].path), .read_only = a[i].read_only};
  out->n_volumes = na;
  moat_store_attachments_free(a, na);
}

void ctl_volumes_gc(struct moat_control *c) {
  struct moat_store_volume *rows = NULL;
  size_t n = 0;
  moat_error *err = NULL;
  if (moat_store_volume_list(c->store, NULL, &rows, &n, &err) < 0) {
    log_warn("volumes: not collecting unrecorded storage: %s", moat_error_msg(err));
    moat_error_free(&err);
    return;
  }
  const char **keep = xcalloc(n + 1, sizeof(*keep));
  for (size_t i = 0; i < n; i++)
    keep[i] = rows[i].id;
  int removed = moat_host_volume_gc(c->host, keep, n, &err);
  if (removed < 0) {
    log_warn("volumes: collecting unrecorded storage: %s", moat_error_msg(err));
    moat_error_free(&err);
  } else if (removed > 0) {
    log_info("volumes: removed the storage of %d unrecorded volume(s)", removed);
  }
  free(keep);
  moat_store_volumes_free(rows, n);
}

/* criu_images.c -- a per-restore view of a checkpoint's CRIU images (criu_images.h) */
#include "criu_images.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../../common/util.h"

/* CRIU images: magic (4 bytes for inventory.img, 8 for the others), a u32 length, one protobuf
 * message. TaskKobjIdsEntry.user_ns_id is field 10; InventoryEntry.root_ids is field 3. */
#define INVENTORY_HDR 4
#define IMAGE_HDR 8
#define IDS_USER_NS 10
#define INVENTORY_ROOT_IDS 3
#define IDS_TIME_NS 12
#define IDS_UTS_NS 8

struct pb_field {
  uint64_t num, v;   /* field number; value of a varint */
  int wire;          /* 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32 */
  size_t start, end; /* the whole field, tag included */
  size_t data, len;  /* payload of a length-delimited field */
};

static int pb_varint(const uint8_t *p, size_t len, size_t *off, uint64_t *v) {
  *v = 0;
  for (int shift = 0; shift < 64 && *off < len; shift += 7) {
    uint8_t b = p[(*off)++];
    *v |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80))
      return 0;
  }
  return -1;
}

static size_t pb_put(uint8_t *out, uint64_t v) {
  size_t n = 0;
  do {
    out[n] = (uint8_t)(v & 0x7f);
    v >>= 7;
    if (v)
      out[n] |= 0x80;
    n++;
  } while (v);
  return n;
}

/* The field at *off of the message p[0..len); advances *off. 0, or -1 if malformed. */
static int pb_next(const uint8_t *p, size_t len, size_t *off, struct pb_field *f) {
  uint64_t tag;
  f->start = *off;
  if (pb_varint(p, len, off, &tag) < 0)
    return -1;
  f->num = tag >> 3;
  f->wire = (int)(tag & 7);
  f->v = 0;
  switch (f->wire) {
  case 0:
    if (pb_varint(p, len, off, &f->v) < 0)
      return -1;
    break;
  case 1:
  case 5: {
    size_t n = f->wire == 1 ? 8 : 4;
    if (len - *off < n)
      return -1;
    *off += n;
    break;
  }
  case 2:
    if (pb_varint(p, len, off, &f->v) < 0 || f->v > len - *off)
      return -1;
    f->data = *off;
    f->len = (size_t)f->v;
    *off += f->len;
    break;
  default:
    return -1;
  }
  f->end = *off;
  return 0;
}

/* Reads image path: its message into *msg (caller frees the buffer in *buf), its header length
 * hdr. 0 or -1. */
static int read_image(const char *path, size_t hdr, char **buf, const uint8_t **msg, size_t *msg_len,
                      moat_error **err) {
  size_t len;
  if (read_file(path, buf, &len, err) < 0)
    return -1;
  uint32_t l;
  if (len < hdr + 4)
    return moat_error_set(err, EPROTO, "%s: too short", path);
  memcpy(&l, *buf + hdr, 4);
  if (hdr + 4 + (size_t)l != len)
    return moat_error_set(err, EPROTO, "%s: one entry expected", path);
  *msg = (const uint8_t *)*buf + hdr + 4;
  *msg_len = l;
  return 0;
}

/* Field num (a varint) of the init task's ids (ids-1.img). 0, or -1 (EPROTO when absent). */
static int init_ns_id(const char *src_dir, uint64_t num, uint64_t *id, moat_error **err) {
  _cleanup_free_ char *path = xasprintf("%s/ids-1.img", src_dir);
  _cleanup_free_ char *buf = NULL;
  const uint8_t *m;
  size_t len, off = 0;
  if (read_image(path, IMAGE_HDR, &buf, &m, &len, err) < 0)
    return -1;
  while (off < len) {
    struct pb_field f;
    if (pb_next(m, len, &off, &f) < 0)
      return moat_error_set(err, EPROTO, "%s: malformed", path);
    if (f.num == num && f.wire == 0) {
      *id = f.v;
      return 0;
    }
  }
  return moat_error_set(err, EPROTO, "%s: no namespace id %llu", path, (unsigned long long)num);
}

/* Writes dst: inventory src with root_ids.user_ns_id and uts_ns_id set to user_ns and uts_ns. */
static int rewrite_inventory(const char *src, const char *dst, uint64_t user_ns, uint64_t uts_ns,
                             moat_error **err) {
  _cleanup_free_ char *buf = NULL;
  const uint8_t *m;
  size_t len, off = 0;
  if (read_image(src, INVENTORY_HDR, &buf, &m, &len, err) < 0)
    return -1;
  _cleanup_free_ uint8_t *out = xmalloc(INVENTORY_HDR + 4 + len + 32);
  size_t o = INVENTORY_HDR + 4;
  bool found = false;
  while (off < len) {
    struct pb_field f;
    if (pb_next(m, len, &off, &f) < 0)
      return moat_error_set(err, EPROTO, "%s: malformed", src);
    if (f.num != INVENTORY_ROOT_IDS || f.wire != 2 || found) {
      memcpy(out + o, m + f.start, f.end - f.start);
      o += f.end - f.start;
      continue;
    }
    found = true;
    uint8_t sub[256];
    size_t so = 0, soff = f.data, send = f.data + f.len;
    while (soff < send) {
      struct pb_field g;
      if (pb_next(m, send, &soff, &g) < 0 || so + (g.end - g.start) + 24 > sizeof(sub))
        return moat_error_set(err, EPROTO, "%s: malformed root_ids", src);
      if ((g.num == IDS_USER_NS || g.num == IDS_UTS_NS) && g.wire == 0)
        continue; /* written below */
      memcpy(sub + so, m + g.start, g.end - g.start);
      so += g.end - g.start;
    }
    so += pb_put(sub + so, IDS_UTS_NS << 3);
    so += pb_put(sub + so, uts_ns);
    so += pb_put(sub + so, IDS_USER_NS << 3);
    so += pb_put(sub + so, user_ns);
    o += pb_put(out + o, INVENTORY_ROOT_IDS << 3 | 2);
    o += pb_put(out + o, so);
    memcpy(out + o, sub, so);
    o += so;
  }
  if (!found)
    return moat_error_set(err, EPROTO, "%s: no root_ids", src);
  memcpy(out, buf, INVENTORY_HDR);
  uint32_t nl = (uint32_t)(o - INVENTORY_HDR - 4);
  memcpy(out + INVENTORY_HDR, &nl, 4);
  _cleanup_close_ int fd = open(dst, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0 || fchmod(fd, 0644) < 0 || write_all(fd, out, o) < 0)
    return moat_error_errno(err, "write %s", dst);
  return 0;
}

/* MntEntry (mountpoints-N.img): flags is field 5, ext_key 18 (CRIU 4 sets it for an external mount;
 * older CRIUs set ext_mount, 13, and keep the key in root, 6). */
#define MNT_FLAGS 5
#define MNT_ROOT 6
#define MNT_EXT_MOUNT 13
#define MNT_EXT_KEY 18

/* True when the MntEntry m[0..len) is an external mount whose key starts with prefix. */
static bool mnt_is_ext(const uint8_t *m, size_t len, const char *prefix) {
  size_t off = 0, pl = strlen(prefix);
  bool ext = false, keyed = false, rooted = false;
  while (off < len) {
    struct pb_field f;
    if (pb_next(m, len, &off, &f) < 0)
      return false;
    bool named = f.wire == 2 && f.len >= pl && memcmp(m + f.data, prefix, pl) == 0;
    if (f.num == MNT_EXT_MOUNT && f.wire == 0)
      ext = f.v != 0;
    else if (f.num == MNT_EXT_KEY && named)
      keyed = true;
    else if (f.num == MNT_ROOT && named)
      rooted = true;
  }
  return keyed || (ext && rooted);
}

/* Writes dst: the mount image src with MS_RDONLY added to the flags of the external mounts keyed
 * prefix*. How many it changed, or -1. */
static int rewrite_mounts_ro(const char *src, const char *dst, const char *prefix, moat_error **err) {
  _cleanup_free_ char *buf = NULL;
  size_t len;
  if (read_file(src, &buf, &len, err) < 0)
    return -1;
  if (len < IMAGE_HDR)
    return moat_error_set(err, EPROTO, "%s: too short", src);
  _cleanup_free_ uint8_t *out = xmalloc(len + 64 * 16);
  size_t cap = len + 64 * 16, o = IMAGE_HDR, off = IMAGE_HDR;
  memcpy(out, buf, IMAGE_HDR);
  int changed = 0;
  while (off < len) {
    uint32_t l;
    if (len - off < 4)
      return moat_error_set(err, EPROTO, "%s: malformed", src);
    memcpy(&l, buf + off, 4);
    off += 4;
    if (l > len - off)
      return moat_error_set(err, EPROTO, "%s: malformed", src);
    const uint8_t *m = (const uint8_t *)buf + off;
    off += l;
    if (o + 4 + l + 16 > cap)
      return moat_error_set(err, EPROTO, "%s: too many mounts to rewrite", src);
    size_t lo = o;
    o += 4;
    bool ro = mnt_is_ext(m, l, prefix);
    size_t moff = 0;
    while (moff < l) {
      struct pb_field f;
      if (pb_next(m, l, &moff, &f) < 0)
        return moat_error_set(err, EPROTO, "%s: malformed mount entry", src);
      if (ro && f.num == MNT_FLAGS && f.wire == 0) {
        o += pb_put(out + o, MNT_FLAGS << 3);
        o += pb_put(out + o, f.v | 1 /* MS_RDONLY */);
        changed++;
        continue;
      }
      memcpy(out + o, m + f.start, f.end - f.start);
      o += f.end - f.start;
    }
    uint32_t nl = (uint32_t)(o - lo - 4);
    memcpy(out + lo, &nl, 4);
  }
  _cleanup_close_ int fd = open(dst, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0 || fchmod(fd, 0644) < 0 || write_all(fd, out, o) < 0)
    return moat_error_errno(err, "write %s", dst);
  return changed;
}

int moat_criu_images_link(const char *src_dir, const char *dst_dir, uid_t owner, const char *ro_ext, int n_ro,
                          moat_error **err) {
  uint64_t user_ns = 0, uts_ns = 0;
  if (init_ns_id(src_dir, IDS_USER_NS, &user_ns, err) < 0 ||
      init_ns_id(src_dir, IDS_UTS_NS, &uts_ns, err) < 0)
    return -1;
  if (mkdir(dst_dir, 0711) < 0 || chown(dst_dir, owner, owner) < 0)
    return moat_error_errno(err, "mkdir %s", dst_dir);
  DIR *dp = opendir(src_dir);
  if (!dp)
    return moat_error_errno(err, "open %s", src_dir);
  int ret = 0, made_ro = 0;
  struct dirent *de;
  while (ret == 0 && (de = readdir(dp)) != NULL) {
    if (de->d_name[0] == '.' || strstr(de->d_name, ".log") || strncmp(de->d_name, "userns-", 7) == 0)
      continue;
    _cleanup_free_ char *src = xasprintf("%s/%s", src_dir, de->d_name);
    _cleanup_free_ char *dst = xasprintf("%s/%s", dst_dir, de->d_name);
    if (strcmp(de->d_name, "inventory.img") == 0) {
      ret = rewrite_inventory(src, dst, user_ns, uts_ns, err);
    } else if (ro_ext && strncmp(de->d_name, "mountpoints-", 12) == 0) {
      int k = rewrite_mounts_ro(src, dst, ro_ext, err);
      ret = k < 0 ? -1 : 0;
      made_ro += k > 0 ? k : 0;
    } else if (link(src, dst) < 0) {
      ret = moat_error_errno(err, "link %s", dst);
    }
  }
  closedir(dp);
  if (ret == 0 && ro_ext && made_ro != n_ro)
    ret = moat_error_set(err, EPROTO, "%s: %d external mount(s) %s* found, %d expected", src_dir, made_ro,
                         ro_ext, n_ro);
  return ret;
}

/* A Timespec {tv_sec = 1, tv_nsec = 2} at m[0..len). */
static int read_timespec(const uint8_t *m, size_t len, struct timespec *ts) {
  size_t off = 0;
  int seen = 0;
  while (off < len) {
    struct pb_field f;
    if (pb_next(m, len, &off, &f) < 0)
      return -1;
    if (f.wire == 0 && f.num == 1)
      ts->tv_sec = (time_t)f.v, seen |= 1;
    else if (f.wire == 0 && f.num == 2)
      ts->tv_nsec = (long)f.v, seen |= 2;
  }
  return seen == 3 && ts->tv_nsec >= 0 && ts->tv_nsec < 1000000000L ? 0 : -1;
}

/* dumped - now, as "seconds nanoseconds" with 0 <= nanoseconds < 1e9. */
static void offset_of(const struct timespec *dumped, clockid_t clock, long long *sec, long *nsec) {
  struct timespec now;
  clock_gettime(clock, &now);
  *sec = (long long)dumped->tv_sec - (long long)now.tv_sec;
  *nsec = dumped->tv_nsec - now.tv_nsec;
  if (*nsec < 0) {
    *nsec += 1000000000L;
    --*sec;
  }
}

int moat_criu_images_timens_offsets(const char *src_dir, char *buf, size_t len, moat_error **err) {
  uint64_t id = 0;
  moat_error *e = NULL;
  if (init_ns_id(src_dir, IDS_TIME_NS, &id, &e) < 0)
    moat_error_free(&e); /* no time namespace recorded: timens-0.img is the dumped clocks */
  _cleanup_free_ char *path = xasprintf("%s/timens-%llu.img", src_dir, (unsigned long long)id);
  if (access(path, F_OK) < 0) {
    free(path);
    path = xasprintf("%s/timens-0.img", src_dir);
    if (access(path, F_OK) < 0)
      return 0;
  }
  _cleanup_free_ char *img = NULL;
  const uint8_t *m;
  size_t ml, off = 0;
  if (read_image(path, IMAGE_HDR, &img, &m, &ml, err) < 0)
    return -1;
  struct timespec mono = {0, 0}, boot = {0, 0};
  int seen = 0;
  while (off < ml) {
    struct pb_field f;
    if (pb_next(m, ml, &off, &f) < 0 || f.wire != 2)
      return moat_error_set(err, EPROTO, "%s: malformed", path);
    if (f.num == 1 && read_timespec(m + f.data, f.len, &mono) == 0)
      seen |= 1;
    else if (f.num == 2 && read_timespec(m + f.data, f.len, &boot) == 0)
      seen |= 2;
  }
  if (seen != 3)
    return moat_error_set(err, EPROTO, "%s: no monotonic and boottime clocks", path);
  long long ms, bs;
  long mn, bn;
  offset_of(&mono, CLOCK_MONOTONIC, &ms, &mn);
  offset_of(&boot, CLOCK_BOOTTIME, &bs, &bn);
  snprintf(buf, len, "%d %lld %ld\n%d %lld %ld\n", CLOCK_MONOTONIC, ms, mn, CLOCK_BOOTTIME, bs, bn);
  return 1;
}

/* A string field's bytes into out (size n, NUL-terminated). */
static int pb_string(const uint8_t *m, const struct pb_field *f, char *out, size_t n) {
  if (f->wire != 2 || f->len >= n)
    return -1;
  memcpy(out, m + f->data, f->len);
  out[f->len] = '\0';
  return 0;
}

int moat_criu_images_uts(const char *src_dir, char *nodename, char *domainname, size_t n, moat_error **err) {
  uint64_t id;
  if (init_ns_id(src_dir, IDS_UTS_NS, &id, err) < 0)
    return -1;
  _cleanup_free_ char *path = xasprintf("%s/utsns-%llu.img", src_dir, (unsigned long long)id);
  _cleanup_free_ char *img = NULL;
  const uint8_t *m;
  size_t ml, off = 0;
  if (read_image(path, IMAGE_HDR, &img, &m, &ml, err) < 0)
    return -1;
  int seen = 0;
  while (off < ml) {
    struct pb_field f;
    if (pb_next(m, ml, &off, &f) < 0)
      return moat_error_set(err, EPROTO, "%s: malformed", path);
    if (f.num == 1 && pb_string(m, &f, nodename, n) == 0)
      seen |= 1;
    else if (f.num == 2 && pb_string(m, &f, domainname, n) == 0)
      seen |= 2;
  }
  return seen == 3 ? 0 : moat_error_set(err, EPROTO, "%s: no nodename and domainname", path);
}

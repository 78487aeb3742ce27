/* volume.c -- the linux driver's volumes: ext4 images under DATA/host/volumes, mounted once by
 * moatd (detached) and into sandboxes as idmapped clones of that mount */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../common/util.h"
#include "disk.h"
#include "linux_internal.h"

#define VOL_MAX_DEPTH 32
#define VOL_MAX_NAME 255

struct vol_mount {
  char vid[48];
  int fd; /* the image's detached mount */
  struct vol_mount *next;
};

struct moat_volumes {
  char *dir; /* absolute */
  bool overcommit;
  pthread_mutex_t lock; /* guards mounts; held across an image's mount (no other lock inside) */
  struct vol_mount *mounts;
};

static bool valid_vid(const char *vid) {
  size_t n = strlen(vid);
  if (n == 0 || n > 40)
    return false;
  for (size_t i = 0; i < n; i++)
    if (!((vid[i] >= 'a' && vid[i] <= 'z') || (vid[i] >= '0' && vid[i] <= '9') || vid[i] == '-'))
      return false;
  return true;
}

struct moat_volumes *moat_volumes_open(const char *dir, bool overcommit, moat_error **err) {
  if (mkdir_p(dir, 0700, err) < 0)
    return NULL;
  struct moat_volumes *v = xcalloc(1, sizeof(*v));
  char *real = realpath(dir, NULL);
  v->dir = real ? real : xstrdup(dir);
  v->overcommit = overcommit;
  pthread_mutex_init(&v->lock, NULL);
  return v;
}

void moat_volumes_free(struct moat_volumes *v) {
  if (!v)
    return;
  for (struct vol_mount *m = v->mounts, *next; m; m = next) {
    next = m->next;
    close(m->fd);
    free(m);
  }
  pthread_mutex_destroy(&v->lock);
  free(v->dir);
  free(v);
}

static char *image_path(struct moat_volumes *v, const char *vid) {
  return xasprintf("%s/%s.img", v->dir, vid);
}

/* A dup of vid's mount (mounting the image on first use). Caller closes. */
static int volume_mount(struct moat_volumes *v, const char *vid, moat_error **err) {
  if (!valid_vid(vid))
    return moat_error_set(err, EINVAL, "bad volume id '%.48s'", vid);
  pthread_mutex_lock(&v->lock);
  int ret = -1;
  struct vol_mount *m = v->mounts;
  while (m && strcmp(m->vid, vid) != 0)
    m = m->next;
  if (!m) {
    _cleanup_free_ char *img = image_path(v, vid);
    if (access(img, F_OK) < 0) {
      moat_error_set(err, ENOENT, "volume %s has no image", vid);
      goto out;
    }
    int fd = moat_disk_image_mount(img, err);
    if (fd < 0)
      goto out;
    m = xcalloc(1, sizeof(*m));
    snprintf(m->vid, sizeof(m->vid), "%s", vid);
    m->fd = fd;
    m->next = v->mounts;
    v->mounts = m;
  }
  ret = fcntl(m->fd, F_DUPFD_CLOEXEC, 3);
  if (ret < 0)
    moat_error_errno(err, "dup volume mount");
out:
  pthread_mutex_unlock(&v->lock);
  return ret;
}

int moat_linux_volume_create(struct moat_host *base, const char *vid, uint64_t size_mb, moat_error **err) {
  struct moat_volumes *v = moat_linux_volumes(moat_linux_of(base));
  if (!valid_vid(vid))
    return moat_error_set(err, EINVAL, "bad volume id '%.48s'", vid);
  _cleanup_free_ char *img = image_path(v, vid);
  if (moat_disk_image_make(img, size_mb, !v->overcommit, err) < 0)
    return moat_error_wrap(err, "volume %s", vid);
  /* an empty root: lost+found is mkfs's, not the user's */
  _cleanup_close_ int mnt = volume_mount(v, vid, err);
  if (mnt < 0) {
    unlink(img);
    return moat_error_wrap(err, "volume %s", vid);
  }
  unlinkat(mnt, "lost+found", AT_REMOVEDIR);
  return 0;
}

int moat_linux_volume_remove(struct moat_host *base, const char *vid, moat_error **err) {
  struct moat_volumes *v = moat_linux_volumes(moat_linux_of(base));
  if (!valid_vid(vid))
    return moat_error_set(err, EINVAL, "bad volume id '%.48s'", vid);
  pthread_mutex_lock(&v->lock);
  for (struct vol_mount **p = &v->mounts; *p; p = &(*p)->next)
    if (strcmp((*p)->vid, vid) == 0) {
      struct vol_mount *m = *p;
      *p = m->next;
      close(m->fd);
      free(m);
      break;
    }
  pthread_mutex_unlock(&v->lock);
  _cleanup_free_ char *img = image_path(v, vid);
  if (unlink(img) < 0 && errno != ENOENT)
    return moat_error_errno(err, "remove %s", img);
  fsync_parent(img);
  return 0;
}

int moat_linux_volume_copy(struct moat_host *base, const char *src_vid, const char *dst_vid,
                           moat_error **err) {
  struct moat_volumes *v = moat_linux_volumes(moat_linux_of(base));
  if (!valid_vid(src_vid) || !valid_vid(dst_vid))
    return moat_error_set(err, EINVAL, "bad volume id '%.48s'", valid_vid(src_vid) ? dst_vid : src_vid);
  _cleanup_free_ char *src = image_path(v, src_vid);
  _cleanup_free_ char *dst = image_path(v, dst_vid);
  if (access(dst, F_OK) == 0)
    return moat_error_set(err, EEXIST, "volume %s exists", dst_vid);
  /* what the source's file system holds in memory goes to its image first (syncfs wants an fd
   * that is not O_PATH, as the detached mount's is) */
  {
    _cleanup_close_ int mnt = volume_mount(v, src_vid, err);
    if (mnt < 0)
      return moat_error_wrap(err, "copy volume %s", src_vid);
    _cleanup_close_ int root = openat(mnt, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (root < 0 || syncfs(root) < 0)
      return moat_error_errno(err, "sync volume %s", src_vid);
  }
  if (moat_disk_image_copy(src, dst, err) < 0)
    return moat_error_wrap(err, "copy volume %s to %s", src_vid, dst_vid);
  return 0;
}

int moat_linux_volume_root(struct moat_host *base, const char *vid, moat_error **err) {
  return volume_mount(moat_linux_volumes(moat_linux_of(base)), vid, err);
}

int moat_linux_volume_usage(struct moat_host *base, const char *vid, struct moat_disk_usage *out,
                            moat_error **err) {
  _cleanup_close_ int fd = volume_mount(moat_linux_volumes(moat_linux_of(base)), vid, err);
  if (fd < 0)
    return -1;
  struct statfs st;
  if (fstatfs(fd, &st) < 0)
    return moat_error_errno(err, "statfs volume %s", vid);
  out->total_bytes = (uint64_t)st.f_blocks * (uint64_t)st.f_bsize;
  out->used_bytes = (uint64_t)(st.f_blocks - st.f_bfree) * (uint64_t)st.f_bsize;
  return 0;
}

int moat_linux_volume_gc(struct moat_host *base, const char *const *keep, size_t n, moat_error **err) {
  struct moat_volumes *v = moat_linux_volumes(moat_linux_of(base));
  DIR *d = opendir(v->dir);
  if (!d)
    return moat_error_errno(err, "open %s", v->dir);
  int removed = 0;
  struct dirent *de;
  while ((de = readdir(d))) {
    /* ours: v-ID.img and v-ID.img.tmp (golden-SIZE.img are shared templates of empty images) */
    if (strncmp(de->d_name, "v-", 2) != 0)
      continue;
    char vid[48];
    size_t len = strcspn(de->d_name, ".");
    const char *ext = de->d_name + len;
    if (len >= sizeof(vid) || (strcmp(ext, ".img") != 0 && strcmp(ext, ".img.tmp") != 0))
      continue;
    memcpy(vid, de->d_name, len);
    vid[len] = '\0';
    bool kept = false;
    for (size_t i = 0; i < n && !kept; i++)
      kept = strcmp(keep[i], vid) == 0 && strcmp(ext, ".img") == 0;
    if (kept)
      continue;
    if (unlinkat(dirfd(d), de->d_name, 0) == 0)
      removed++;
  }
  closedir(d);
  return removed;
}

/* Splits an absolute path into its components (no "." or "..", none empty but between slashes). */
static int split_path(const char *path, char comps[VOL_MAX_DEPTH][VOL_MAX_NAME + 1], int *n,
                      moat_error **err) {
  *n = 0;
  if (path[0] != '/')
    return moat_error_set(err, EINVAL, "volume path '%.256s' is not absolute", path);
  for (const char *p = path; *p;) {
    while (*p == '/')
      p++;
    if (!*p)
      break;
    size_t len = strcspn(p, "/");
    if (len > VOL_MAX_NAME || *n == VOL_MAX_DEPTH)
      return moat_error_set(err, ENAMETOOLONG, "volume path '%.256s' is too long", path);
    if ((len == 1 && p[0] == '.') || (len == 2 && p[0] == '.' && p[1] == '.'))
      return moat_error_set(err, EINVAL, "volume path '%.256s' has a '.' or '..'", path);
    memcpy(comps[*n], p, len);
    comps[*n][len] = '\0';
    (*n)++;
    p += len;
  }
  if (*n == 0)
    return moat_error_set(err, EINVAL, "a volume cannot be mounted at /");
  return 0;
}

/* Enters pid's mount namespace (as the host's root, in a vfork child: syscalls only), walks to
 * path from the namespace's root without following any link, making missing directories (as
 * owner, the sandbox's root), and moves the detached mount mnt there. */
static int move_into(pid_t pid, uid_t owner, int mnt, const char *path, moat_error **err) {
  static char comps[VOL_MAX_DEPTH][VOL_MAX_NAME + 1]; /* under attach_lock */
  static pthread_mutex_t attach_lock = PTHREAD_MUTEX_INITIALIZER;
  char nspath[64];
  snprintf(nspath, sizeof(nspath), "/proc/%d/ns/mnt", pid);
  _cleanup_close_ int mntns = open(nspath, O_RDONLY | O_CLOEXEC);
  if (mntns < 0)
    return moat_error_errno(err, "open %s", nspath);
  pthread_mutex_lock(&attach_lock);
  int n;
  if (split_path(path, comps, &n, err) < 0) {
    pthread_mutex_unlock(&attach_lock);
    return -1;
  }
  volatile int failed_errno = 0, failed_step = 0;
  pid_t h = vfork();
  if (h < 0) {
    pthread_mutex_unlock(&attach_lock);
    return moat_error_errno(err, "vfork volume helper");
  }
  if (h == 0) {
    if (setns(mntns, CLONE_NEWNS) < 0) {
      failed_errno = errno;
      failed_step = 1;
      _exit(1);
    }
    int cur = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
    for (int i = 0; cur >= 0 && i < n; i++) {
      struct open_how how = {.flags = O_PATH | O_DIRECTORY | O_CLOEXEC,
                             .resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS};
      int next = (int)syscall(SYS_openat2, cur, comps[i], &how, sizeof(how));
      if (next < 0 && errno == ENOENT) {
        /* made as the sandbox's root: the overlay cannot store an inode of the host's root */
        syscall(SYS_setfsgid, owner);
        syscall(SYS_setfsuid, owner);
        int made = mkdirat(cur, comps[i], 0755) == 0 || errno == EEXIST;
        syscall(SYS_setfsuid, 0);
        syscall(SYS_setfsgid, 0);
        if (made)
          next = (int)syscall(SYS_openat2, cur, comps[i], &how, sizeof(how));
      }
      close(cur);
      cur = next;
    }
    if (cur < 0) {
      failed_errno = errno;
      failed_step = 2;
      _exit(1);
    }
    if (move_mount(mnt, "", cur, "", MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH) < 0) {
      failed_errno = errno;
      failed_step = 3;
      _exit(1);
    }
    _exit(0);
  }
  int status;
  while (waitpid(h, &status, __WALL) < 0)
    if (errno != EINTR) {
      pthread_mutex_unlock(&attach_lock);
      return moat_error_errno(err, "wait volume helper");
    }
  pthread_mutex_unlock(&attach_lock);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
    return 0;
  static const char *what[] = {"", "enter the sandbox's mount namespace", "make the mount point", "mount"};
  errno = failed_errno ? failed_errno : EIO;
  return moat_error_errno(err, "%s at %.256s", what[failed_step], path);
}

static int record(const char *slot_dir, const char *vid, bool ro, const char *path, moat_error **err);

int moat_linux_volume_attach(struct moat_host *base, int slot, const char *vid, const char *path,
                             bool read_only, moat_error **err) {
  struct moat_linux *h = moat_linux_of(base);
  struct moat_slot_view sv;
  if (moat_linux_slot_view(h, slot, &sv, err) < 0)
    return -1;
  pid_t pid = sv.pid;
  uid_t owner = sv.uid_base;
  if (sv.disk_fd >= 0)
    close(sv.disk_fd);
  _cleanup_free_ char *slot_dir = sv.slot_dir;
  free(sv.chan_dir);
  _cleanup_close_ int clone = moat_linux_volume_clone(h, vid, pid, read_only, err);
  if (clone < 0)
    return moat_error_wrap(err, "attach volume %s", vid);
  if (move_into(pid, owner, clone, path, err) < 0)
    return moat_error_wrap(err, "attach volume %s", vid);
  return record(slot_dir, vid, read_only, path, err);
}

int moat_linux_volume_clone(struct moat_linux *h, const char *vid, pid_t pid, bool ro, moat_error **err) {
  _cleanup_close_ int root = volume_mount(moat_linux_volumes(h), vid, err);
  if (root < 0)
    return -1;
  char upath[64];
  snprintf(upath, sizeof(upath), "/proc/%d/ns/user", pid);
  _cleanup_close_ int userns = open(upath, O_RDONLY | O_CLOEXEC);
  if (userns < 0)
    return moat_error_errno(err, "open %s", upath);
  _cleanup_close_ int clone = open_tree(root, "", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH);
  if (clone < 0)
    return moat_error_errno(err, "clone the mount of volume %s", vid);
  struct mount_attr attr = {.attr_set = MOUNT_ATTR_IDMAP | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOSUID |
                                        (ro ? MOUNT_ATTR_RDONLY : 0),
                            .userns_fd = (uint64_t)userns};
  if (mount_setattr(clone, "", AT_EMPTY_PATH, &attr, sizeof(attr)) < 0)
    return moat_error_errno(err, "idmap volume %s", vid);
  return steal_fd(&clone);
}

/* ---- SLOT/volumes ---- */

/* path with its slashes collapsed, none at the end (as the kernel shows mount points). */
static void normalise(const char *path, char *out, size_t len) {
  size_t k = 0;
  for (const char *q = path; *q && k + 1 < len; q++)
    if (!(*q == '/' && k > 0 && out[k - 1] == '/'))
      out[k++] = *q;
  while (k > 1 && out[k - 1] == '/')
    k--;
  out[k] = '\0';
}

static int record(const char *slot_dir, const char *vid, bool ro, const char *path, moat_error **err) {
  char norm[1100];
  normalise(path, norm, sizeof(norm));
  _cleanup_free_ char *file = xasprintf("%s/" MOAT_SLOT_VOLUMES_FILE, slot_dir);
  _cleanup_free_ char *line = xasprintf("%s %d %s\n", vid, ro ? 1 : 0, norm);
  _cleanup_close_ int fd = open(file, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0 || write(fd, line, strlen(line)) != (ssize_t)strlen(line))
    return moat_error_errno(err, "record volume %s in %s", vid, file);
  return 0;
}

int moat_volume_slot_list(const char *dir, struct moat_slot_volume *out) {
  _cleanup_free_ char *file = xasprintf("%s/" MOAT_SLOT_VOLUMES_FILE, dir);
  _cleanup_free_ char *text = NULL;
  if (read_file(file, &text, NULL, NULL) < 0)
    return errno == ENOENT ? 0 : -1;
  int n = 0;
  for (char *line = text, *next; line && *line; line = next) {
    next = strchr(line, '\n');
    if (next)
      *next++ = '\0';
    if (n == MOAT_SLOT_MAX_VOLUMES)
      return -1;
    char *sp1 = strchr(line, ' ');
    char *sp2 = sp1 ? strchr(sp1 + 1, ' ') : NULL;
    if (!sp1 || !sp2 || (size_t)(sp1 - line) >= sizeof(out[n].vid) || sp2[1] != '/' ||
        strlen(sp2 + 1) >= sizeof(out[n].path))
      return -1;
    memcpy(out[n].vid, line, (size_t)(sp1 - line));
    out[n].vid[sp1 - line] = '\0';
    out[n].read_only = sp1[1] == '1';
    snprintf(out[n].path, sizeof(out[n].path), "%s", sp2 + 1);
    n++;
  }
  return n;
}

int moat_volume_slot_copy(const char *src_dir, const char *dst_dir, bool all_ro, moat_error **err) {
  struct moat_slot_volume v[MOAT_SLOT_MAX_VOLUMES];
  int n = moat_volume_slot_list(src_dir, v);
  if (n < 0)
    return moat_error_set(err, EIO, "%s/" MOAT_SLOT_VOLUMES_FILE " does not parse", src_dir);
  if (n == 0)
    return 0;
  _cleanup_free_ char *dst = xasprintf("%s/" MOAT_SLOT_VOLUMES_FILE, dst_dir);
  _cleanup_close_ int fd = open(dst, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0)
    return moat_error_errno(err, "write %s", dst);
  for (int i = 0; i < n; i++) {
    _cleanup_free_ char *line =
        xasprintf("%s %d %s\n", v[i].vid, v[i].read_only || all_ro ? 1 : 0, v[i].path);
    if (write(fd, line, strlen(line)) != (ssize_t)strlen(line))
      return moat_error_errno(err, "write %s", dst);
  }
  return 0;
}

/* build_files.c -- archives an org uploads for its builds, by content hash, and the notes a front end
 * keeps about the builds it started
 *
 * DATA/build-files/ORG/ holds one org's files: ORG is the first 32 hex digits of sha256(org), so no
 * org name reaches a path. FILES are ORG/HASH (the uploaded bytes as they came), NOTES are
 * ORG/notes/NAME.json. Both are written beside their place and renamed over it, so a reader sees a
 * whole file or none; a lock serializes the writers of one moatd.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../common/sha256.h"
#include "../common/util.h"
#include "control_internal.h"

static pthread_mutex_t files_lock = PTHREAD_MUTEX_INITIALIZER;

bool moat_build_file_hash_valid(const char *hash) {
  if (!hash || strlen(hash) != 64)
    return false;
  for (const char *p = hash; *p; p++)
    if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
      return false;
  return true;
}

/* DATA/build-files/ORG (caller frees). */
static char *org_dir(const struct moat_control *c, const char *org) {
  char hex[2 * MOAT_SHA256_LEN + 1];
  moat_sha256_hex(org, strlen(org), hex);
  hex[32] = '\0';
  return xasprintf("%s/build-files/%s", c->data_dir, hex);
}

bool moat_control_build_file_present(struct moat_control *c, const char *org, const char *hash) {
  if (!moat_build_file_hash_valid(hash))
    return false;
  _cleanup_free_ char *dir = org_dir(c, org);
  _cleanup_free_ char *path = xasprintf("%s/%s", dir, hash);
  struct stat st;
  return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* Removes the oldest files of dir while it holds more than MOAT_BUILD_FILES_MAX (files_lock held). */
static void evict(const char *dir) {
  for (;;) {
    _cleanup_dir_ DIR *d = opendir(dir);
    if (!d)
      return;
    size_t n = 0;
    char oldest[65] = "";
    struct timespec old = {0};
    struct dirent *de;
    while ((de = readdir(d))) {
      if (!moat_build_file_hash_valid(de->d_name))
        continue;
      struct stat st;
      if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
        continue;
      n++;
      if (!*oldest || st.st_mtim.tv_sec < old.tv_sec ||
          (st.st_mtim.tv_sec == old.tv_sec && st.st_mtim.tv_nsec < old.tv_nsec)) {
        old = st.st_mtim;
        memcpy(oldest, de->d_name, 65); /* a valid hash: 64 characters and its NUL */
      }
    }
    if (n <= MOAT_BUILD_FILES_MAX || !*oldest)
      return;
    if (unlinkat(dirfd(d), oldest, 0) < 0)
      return;
  }
}

int moat_control_build_file_store(struct moat_control *c, const char *org, const char *hash, int spool_fd,
                                  moat_error **err) {
  if (!moat_build_file_hash_valid(hash))
    return moat_error_set(err, EINVAL, "a file hash is 64 lowercase hex digits");
  _cleanup_free_ char *dir = org_dir(c, org);
  if (mkdir_p(dir, 0700, err) < 0)
    return -1;
  char tag[17];
  random_id(tag, sizeof(tag) - 1);
  tag[16] = '\0';
  _cleanup_free_ char *tmp = xasprintf("%s/.%s.tmp-%s", dir, hash, tag);
  _cleanup_free_ char *path = xasprintf("%s/%s", dir, hash);
  _cleanup_free_ char *proc = xasprintf("/proc/self/fd/%d", spool_fd);
  if (linkat(AT_FDCWD, proc, AT_FDCWD, tmp, AT_SYMLINK_FOLLOW) < 0)
    return moat_error_errno(err, "store the uploaded file %s", hash);
  pthread_mutex_lock(&files_lock);
  int rc = rename(tmp, path);
  int saved = errno;
  if (rc == 0)
    evict(dir);
  pthread_mutex_unlock(&files_lock);
  if (rc < 0) {
    unlink(tmp);
    errno = saved;
    return moat_error_errno(err, "store the uploaded file %s", hash);
  }
  fsync_parent(path);
  return 0;
}

int moat_control_build_file_open(struct moat_control *c, const char *org, const char *hash, int *fd,
                                 moat_error **err) {
  if (!moat_build_file_hash_valid(hash))
    return moat_error_set(err, EINVAL, "a file hash is 64 lowercase hex digits");
  _cleanup_free_ char *dir = org_dir(c, org);
  _cleanup_free_ char *path = xasprintf("%s/%s", dir, hash);
  *fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (*fd < 0) {
    if (errno == ENOENT)
      return moat_error_set(err, ENOENT, "no file %s was uploaded", hash);
    return moat_error_errno(err, "open the uploaded file %s", hash);
  }
  return 0;
}

int moat_control_build_notes_get(struct moat_control *c, const char *org, const char *name, json_t **out,
                                 moat_error **err) {
  *out = NULL;
  if (!ctl_template_name_valid(name))
    return moat_error_set(err, EINVAL, "'%.64s' is not a template name", name);
  _cleanup_free_ char *dir = org_dir(c, org);
  _cleanup_free_ char *path = xasprintf("%s/notes/%s.json", dir, name);
  json_error_t je;
  pthread_mutex_lock(&files_lock);
  *out = json_load_file(path, 0, &je);
  int saved = errno;
  pthread_mutex_unlock(&files_lock);
  if (!*out) {
    struct stat st;
    if (stat(path, &st) < 0 && errno == ENOENT)
      return 0;
    errno = saved;
    return moat_error_set(err, EIO, "read %s: %s", path, je.text);
  }
  if (!json_is_object(*out)) {
    json_decref(*out);
    *out = NULL;
    return moat_error_set(err, EIO, "%s is not a JSON object", path);
  }
  return 0;
}

int moat_control_build_notes_put(struct moat_control *c, const char *org, const char *name, json_t *doc,
                                 moat_error **err) {
  if (!ctl_template_name_valid(name))
    return moat_error_set(err, EINVAL, "'%.64s' is not a template name", name);
  _cleanup_free_ char *dir = org_dir(c, org);
  _cleanup_free_ char *notes = xasprintf("%s/notes", dir);
  _cleanup_free_ char *path = xasprintf("%s/%s.json", notes, name);
  if (!doc) {
    if (unlink(path) < 0 && errno != ENOENT)
      return moat_error_errno(err, "remove %s", path);
    return 0;
  }
  if (mkdir_p(notes, 0700, err) < 0)
    return -1;
  _cleanup_free_ char *text = json_dumps(doc, JSON_COMPACT);
  if (!text)
    return moat_error_set(err, ENOMEM, "encode the notes of %s", name);
  char tag[17];
  random_id(tag, sizeof(tag) - 1);
  tag[16] = '\0';
  _cleanup_free_ char *tmp = xasprintf("%s/.%s.tmp-%s", notes, name, tag);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0)
    return moat_error_errno(err, "write %s", tmp);
  int rc = write_all(fd, text, strlen(text));
  if (rc == 0)
    rc = fsync(fd);
  int saved = errno;
  close(fd);
  if (rc == 0) {
    pthread_mutex_lock(&files_lock);
    rc = rename(tmp, path);
    saved = errno;
    pthread_mutex_unlock(&files_lock);
  }
  if (rc < 0) {
    unlink(tmp);
    errno = saved;
    return moat_error_errno(err, "write %s", path);
  }
  return 0;
}

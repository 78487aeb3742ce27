/* images.c -- checkpoint image directories: made fresh, renamed into place, removed, swept */
#include "images.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../common/log.h"
#include "../common/util.h"

int moat_image_parent_open(const char *dir, moat_error **err) { return mkdir_p(dir, 0700, err); }

void moat_image_dir_remove(const char *dir) {
  moat_error *err = NULL;
  if (rm_rf(dir, &err) < 0) {
    log_warn("remove %s: %s", dir, moat_error_msg(err));
    moat_error_free(&err);
  }
}

bool moat_image_dir_exists(const char *dir) { return access(dir, F_OK) == 0; }

int moat_image_dir_fresh(const char *dir, moat_error **err) {
  moat_image_dir_remove(dir);
  if (mkdir(dir, 0700) < 0)
    return moat_error_errno(err, "mkdir %s", dir);
  return 0;
}

int moat_image_dir_commit(const char *part, const char *dir, moat_error **err) {
  moat_image_dir_remove(dir);
  if (rename(part, dir) < 0) {
    moat_error_errno(err, "rename %s", part);
    moat_image_dir_remove(part);
    return -1;
  }
  fsync_parent(dir);
  return 0;
}

static void remove_leftover(const char *path, const char *name, const char *stale_dir) {
  moat_error *err = NULL;
  for (int i = 0; i < 20; i++) {
    if (rm_rf(path, &err) == 0)
      return;
    moat_error_free(&err);
    usleep(100000);
  }
  char tag[8];
  random_id(tag, 7);
  _cleanup_free_ char *dst = xasprintf("%s/stale-%s-%s", stale_dir, name, tag);
  if (rename(path, dst) < 0)
    log_error("leftover %s: cannot remove nor move it away: %s", path, strerror(errno));
  else
    log_warn("leftover %s is still being written (a CRIU of the previous moatd?): moved to %s", path, dst);
}

void moat_image_dirs_sweep(const char *parent, bool (*keep)(const char *name, void *arg), void *arg,
                           const char *stale_dir) {
  _cleanup_dir_ DIR *d = opendir(parent);
  if (!d)
    return;
  struct dirent *de;
  while ((de = readdir(d)) != NULL) {
    if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
      continue;
    if (keep && keep(de->d_name, arg))
      continue;
    _cleanup_free_ char *p = xasprintf("%s/%s", parent, de->d_name);
    log_info("removing leftover %s", p);
    remove_leftover(p, de->d_name, stale_dir);
  }
}

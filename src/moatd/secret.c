/* secret.c -- DATA/e2b-secret: the 32 bytes that sign E2B access tokens, made once per data dir */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "../common/util.h"
#include "secret.h"

int moatd_secret_load(const char *path, uint8_t out[MOATD_SECRET_LEN], moat_error **err) {
  for (int attempt = 0; attempt < 2; attempt++) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd >= 0) {
      ssize_t n = read_all(fd, out, MOATD_SECRET_LEN);
      close(fd);
      if (n != MOATD_SECRET_LEN)
        return moat_error_set(err, EINVAL, "%s holds %zd bytes, not %d", path, n, MOATD_SECRET_LEN);
      return 0;
    }
    if (errno != ENOENT)
      return moat_error_errno(err, "open %s", path);
    uint8_t fresh[MOATD_SECRET_LEN];
    random_bytes(fresh, sizeof(fresh));
    _cleanup_free_ char *tmp = xasprintf("%s.tmp-%d", path, (int)getpid());
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0)
      return moat_error_errno(err, "create %s", tmp);
    bool ok = write_all(fd, fresh, sizeof(fresh)) == 0 && fsync(fd) == 0;
    int saved = errno;
    close(fd);
    /* link() fails with EEXIST when another writer won: theirs is read on the next attempt. */
    if (ok && link(tmp, path) < 0 && errno != EEXIST) {
      ok = false;
      saved = errno;
    }
    unlink(tmp);
    explicit_bzero(fresh, sizeof(fresh));
    if (!ok) {
      errno = saved;
      return moat_error_errno(err, "write %s", path);
    }
  }
  return moat_error_set(err, EIO, "%s: made, but not readable", path);
}

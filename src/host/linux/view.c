/* view.c -- files of the sandbox's own computer that the host writes in the slot dir and the
 * sandbox sees read-only in place of the machine's (bind mounts made by the shell's child and
 * carried by checkpoints as external mounts) */
#include "view.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "../../common/util.h"

const struct moat_view_file moat_view_files[] = {
    {MOAT_VIEW_CPU_ONLINE, MOAT_VIEW_CPU_ONLINE_INSIDE, MOAT_VIEW_CPU_ONLINE_KEY},
    {NULL, NULL, NULL},
};

/* Whole CPUs the sandbox has: cpu rounded up, at least 1. */
static unsigned whole_cpus(double cpu) {
  unsigned n = (unsigned)cpu;
  if (cpu > (double)n + 1e-9)
    n++;
  return n ? n : 1;
}

int moat_view_write(const char *slot_dir, const struct moat_limits *l, moat_error **err) {
  _cleanup_close_ int dfd = open(slot_dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dfd < 0)
    return moat_error_errno(err, "open %s", slot_dir);
  char text[64];
  unsigned n = whole_cpus(l->cpu);
  if (n == 1)
    snprintf(text, sizeof(text), "0\n");
  else
    snprintf(text, sizeof(text), "0-%u\n", n - 1);
  /* Rewritten in place: a bind mount of the file shows the new text. */
  _cleanup_close_ int fd =
      openat(dfd, MOAT_VIEW_CPU_ONLINE, O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0444);
  if (fd < 0)
    return moat_error_errno(err, "create %s/cpu-online", slot_dir);
  size_t len = strlen(text);
  if (ftruncate(fd, 0) < 0 || pwrite(fd, text, len, 0) != (ssize_t)len)
    return moat_error_errno(err, "write %s/cpu-online", slot_dir);
  return 0;
}

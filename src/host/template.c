/* template.c -- builds recipes (templates/NAME/) into read-only root images with debootstrap */
#include "template.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../common/log.h"
#include "../common/sha256.h"
#include "../common/util.h"
#include "image_tree.h"

/* Bump when the way a recipe becomes an image changes: every template is then rebuilt. */
#define BUILDER_VERSION "moat-template-builder 1"
#define SUITE "bookworm"
#define DEFAULT_MIRROR "http://deb.debian.org/debian"
/* A cached "ready" verdict is trusted this long before the recipe is hashed again. */
#define READY_CACHE_NS (1000ull * 1000 * 1000)

/* ---- recipes ---- */

struct entry {
  char *name;
  bool building;           /* a thread of this process is building it */
  unsigned generation;     /* bumped when a build ends */
  bool failed;             /* the last build failed */
  char *error;             /* its message */
  bool ready_cached;       /* the last check found it ready ... */
  uint64_t ready_checked;  /* ... at this now_ns() */
  unsigned long long size; /* bytes in the built rootfs, 0 = not known yet */
  struct entry *next;
};

struct moat_templates {
  char *recipes_dir;
  char *template_dir;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  struct entry *entries;
};

const char *moat_template_state_name(enum moat_template_state s) {
  switch (s) {
  case MOAT_TEMPLATE_MISSING:
    return "missing";
  case MOAT_TEMPLATE_BUILDING:
    return "building";
  case MOAT_TEMPLATE_READY:
    return "ready";
  case MOAT_TEMPLATE_FAILED:
    return "failed";
  }
  return "unknown";
}

static bool name_valid(const char *name) {
  size_t n = strlen(name);
  if (n < 1 || n > 63)
    return false;
  for (size_t i = 0; i < n; i++) {
    char c = name[i];
    bool alnum = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
    if (!alnum && (i == 0 || (c != '.' && c != '_' && c != '-')))
      return false;
  }
  return true;
}

static bool recipe_present(struct moat_templates *t, const char *name) {
  if (!name_valid(name))
    return false;
  _cleanup_free_ char *p = xasprintf("%s/%s", t->recipes_dir, name);
  struct stat st;
  return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Sorted names in dir (without . and ..); caller frees with strv_free. */
static int list_dir_sorted(const char *dir, char ***out, moat_error **err) {
  DIR *d = opendir(dir);
  if (!d)
    return moat_error_errno(err, "open %s", dir);
  size_t n = 0, cap = 16;
  char **v = xcalloc(cap, sizeof(char *));
  struct dirent *de;
  while ((de = readdir(d)) != NULL) {
    if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
      continue;
    if (n + 1 >= cap) {
      cap *= 2;
      v = xrealloc(v, cap * sizeof(char *));
    }
    v[n++] = xstrdup(de->d_name);
  }
  v[n] = NULL;
  closedir(d);
  qsort(v, n, sizeof(char *), cmp_str);
  *out = v;
  return 0;
}

static void hash_field(struct moat_sha256 *s, const char *tag, const void *data, size_t len) {
  char hdr[64];
  int n = snprintf(hdr, sizeof(hdr), "%s %zu\n", tag, len);
  moat_sha256_update(s, hdr, (size_t)n);
  moat_sha256_update(s, data, len);
}

/* Hashes the tree at path (rel is its name inside the recipe): names, types, modes and contents. */
static int hash_tree(struct moat_sha256 *s, const char *path, const char *rel, moat_error **err) {
  struct stat st;
  if (lstat(path, &st) < 0)
    return moat_error_errno(err, "stat %s", path);
  char meta[64];
  snprintf(meta, sizeof(meta), "%o", (unsigned)st.st_mode);
  hash_field(s, "path", rel, strlen(rel));
  hash_field(s, "mode", meta, strlen(meta));
  if (S_ISLNK(st.st_mode)) {
    char target[4096];
    ssize_t n = readlink(path, target, sizeof(target));
    if (n < 0)
      return moat_error_errno(err, "readlink %s", path);
    hash_field(s, "link", target, (size_t)n);
  } else if (S_ISREG(st.st_mode)) {
    _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
      return moat_error_errno(err, "open %s", path);
    char hdr[64];
    int hn = snprintf(hdr, sizeof(hdr), "data %lld\n", (long long)st.st_size);
    moat_sha256_update(s, hdr, (size_t)hn);
    char buf[65536];
    for (;;) {
      ssize_t r = read(fd, buf, sizeof(buf));
      if (r < 0) {
        if (errno == EINTR)
          continue;
        return moat_error_errno(err, "read %s", path);
      }
      if (r == 0)
        break;
      moat_sha256_update(s, buf, (size_t)r);
    }
  } else if (S_ISDIR(st.st_mode)) {
    _cleanup_strv_ char **names = NULL;
    if (list_dir_sorted(path, &names, err) < 0)
      return -1;
    for (char **p = names; *p; p++) {
      _cleanup_free_ char *child = xasprintf("%s/%s", path, *p);
      _cleanup_free_ char *crel = xasprintf("%s/%s", rel, *p);
      if (hash_tree(s, child, crel, err) < 0)
        return -1;
    }
  }
  return 0;
}

/* The digest of recipe NAME: 64 hex digits of SHA-256 over the builder version, the suite and every
 * file of the recipe (paths, modes, contents). Exposed (no header) for tests/unit/test_template.c. */
int moat_template_digest(struct moat_templates *t, const char *name, char out[65], moat_error **err) {
  if (!recipe_present(t, name))
    return moat_error_set(err, ENOENT, "no template recipe '%s'", name);
  struct moat_sha256 s;
  moat_sha256_init(&s);
  hash_field(&s, "builder", BUILDER_VERSION, strlen(BUILDER_VERSION));
  hash_field(&s, "suite", SUITE, strlen(SUITE));
  _cleanup_free_ char *dir = xasprintf("%s/%s", t->recipes_dir, name);
  if (hash_tree(&s, dir, ".", err) < 0)
    return moat_error_wrap(err, "digest of template '%s'", name);
  uint8_t bin[MOAT_SHA256_LEN];
  moat_sha256_final(&s, bin);
  for (size_t i = 0; i < MOAT_SHA256_LEN; i++)
    snprintf(out + 2 * i, 3, "%02x", bin[i]);
  return 0;
}

/* Reads the packages file (one per line, # comments) into a comma list; "" when there is none. */
static int read_packages(const char *recipe, char **out, moat_error **err) {
  _cleanup_free_ char *path = xasprintf("%s/packages", recipe);
  _cleanup_free_ char *text = NULL;
  if (access(path, F_OK) < 0 && errno == ENOENT) {
    *out = xstrdup("");
    return 0;
  }
  if (read_file(path, &text, NULL, err) < 0)
    return -1;
  size_t cap = strlen(text) + 1, n = 0;
  _cleanup_free_ char *list = xmalloc(cap + 1);
  list[0] = '\0';
  char *save = NULL;
  for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    char *hash = strchr(line, '#');
    if (hash)
      *hash = '\0';
    char *tok_save = NULL;
    for (char *pkg = strtok_r(line, " \t\r", &tok_save); pkg; pkg = strtok_r(NULL, " \t\r", &tok_save)) {
      for (const char *c = pkg; *c; c++) {
        bool ok = (*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '+' || *c == '-' || *c == '.';
        if (!ok)
          return moat_error_set(err, EINVAL, "%s: invalid package name '%s'", path, pkg);
      }
      size_t l = strlen(pkg);
      if (n > 0)
        list[n++] = ',';
      memcpy(list + n, pkg, l);
      n += l;
      list[n] = '\0';
    }
  }
  *out = steal_pointer(&list);
  return 0;
}

/* ---- the built image ---- */

/* True when TEMPLATE_DIR/NAME/ready holds the current digest and the rootfs is a directory. */
static bool built_matches(struct moat_templates *t, const char *name, const char *digest) {
  _cleanup_free_ char *ready = xasprintf("%s/%s/ready", t->template_dir, name);
  _cleanup_free_ char *rootfs = xasprintf("%s/%s/rootfs", t->template_dir, name);
  _cleanup_free_ char *content = NULL;
  moat_error *e = NULL;
  if (read_file(ready, &content, NULL, &e) < 0) {
    moat_error_free(&e);
    return false;
  }
  size_t l = strlen(content);
  while (l > 0 && (content[l - 1] == '\n' || content[l - 1] == ' '))
    content[--l] = '\0';
  struct stat st;
  return strcmp(content, digest) == 0 && stat(rootfs, &st) == 0 && S_ISDIR(st.st_mode);
}

static struct entry *entry_get(struct moat_templates *t, const char *name) {
  for (struct entry *e = t->entries; e; e = e->next)
    if (strcmp(e->name, name) == 0)
      return e;
  struct entry *e = xcalloc(1, sizeof(*e));
  e->name = xstrdup(name);
  e->next = t->entries;
  t->entries = e;
  return e;
}

/* Whether NAME is built from the current recipe; t->mu held. Trusts a ready verdict for a second. */
static bool is_ready_locked(struct moat_templates *t, struct entry *e) {
  uint64_t now = now_ns();
  if (e->ready_cached && now - e->ready_checked < READY_CACHE_NS)
    return true;
  char digest[65];
  moat_error *err = NULL;
  if (moat_template_digest(t, e->name, digest, &err) < 0) {
    moat_error_free(&err);
    e->ready_cached = false;
    return false;
  }
  e->ready_cached = built_matches(t, e->name, digest);
  e->ready_checked = now;
  return e->ready_cached;
}

/* Unmounts everything mounted at or below dir (deepest first, lazily). Best effort. */
static void umount_below(const char *dir) {
  size_t dl = strlen(dir);
  for (int round = 0; round < 64; round++) {
    FILE *f = fopen("/proc/self/mountinfo", "re");
    if (!f)
      return;
    char line[8192], best[4096] = "";
    while (fgets(line, sizeof(line), f)) {
      /* id parent major:minor root mountpoint ... */
      char mp[4096];
      if (sscanf(line, "%*s %*s %*s %*s %4095s", mp) != 1)
        continue;
      if (strncmp(mp, dir, dl) != 0 || (mp[dl] != '/' && mp[dl] != '\0'))
        continue;
      if (strlen(mp) > strlen(best))
        snprintf(best, sizeof(best), "%s", mp);
    }
    fclose(f);
    if (!best[0])
      return;
    /* mountinfo escapes spaces as \040; such paths do not occur under our own build dirs. */
    if (umount2(best, MNT_DETACH) < 0) {
      log_warn("template: umount %s: %s", best, strerror(errno));
      return;
    }
  }
}

static int remove_tree(const char *path, moat_error **err) {
  umount_below(path);
  return rm_rf(path, err);
}

/* Removes TEMPLATE_DIR/NAME.tmp-* left by a crashed build (not ones that are recipes of their own).
 * Called with the build lock held. Exposed (no header) for tests/unit/test_template.c. */
int moat_template_remove_leftovers(struct moat_templates *t, const char *name, moat_error **err) {
  _cleanup_strv_ char **names = NULL;
  if (list_dir_sorted(t->template_dir, &names, err) < 0)
    return -1;
  _cleanup_free_ char *prefix = xasprintf("%s.tmp-", name);
  for (char **p = names; *p; p++) {
    if (strncmp(*p, prefix, strlen(prefix)) != 0 || recipe_present(t, *p))
      continue;
    _cleanup_free_ char *path = xasprintf("%s/%s", t->template_dir, *p);
    log_info("template %s: removing leftover %s", name, path);
    if (remove_tree(path, err) < 0)
      return moat_error_wrap(err, "remove leftover build");
  }
  return 0;
}

/* Runs argv with stdout+stderr streamed line by line to the log as "template NAME: ...".
 * stdin_path (or /dev/null) is its stdin. lock_fd (the build lock) is passed down as fd 3, so that
 * the lock stays held while any descendant lives: should moatd die mid-build, the next build waits
 * for debootstrap's orphans before it removes their directory. Returns 0 when it exits 0, else -1. */
static int run_logged(const char *name, char *const argv[], const char *stdin_path, int lock_fd,
                      moat_error **err) {
  int pfd[2];
  if (pipe2(pfd, O_CLOEXEC) < 0)
    return moat_error_errno(err, "pipe");
  _cleanup_free_ char *http_proxy =
      getenv("http_proxy") ? xasprintf("http_proxy=%s", getenv("http_proxy")) : NULL;
  char *envp[] = {"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                  "HOME=/root",
                  "LANG=C.UTF-8",
                  "LC_ALL=C.UTF-8",
                  "DEBIAN_FRONTEND=noninteractive",
                  "SHELL=/bin/sh",
                  http_proxy,
                  NULL};
  int in = open(stdin_path ? stdin_path : "/dev/null", O_RDONLY | O_CLOEXEC);
  if (in < 0) {
    int saved = errno;
    close(pfd[0]);
    close(pfd[1]);
    errno = saved;
    return moat_error_errno(err, "open %s", stdin_path ? stdin_path : "/dev/null");
  }
  pid_t pid = fork();
  if (pid < 0) {
    int saved = errno;
    close(pfd[0]);
    close(pfd[1]);
    close(in);
    errno = saved;
    return moat_error_errno(err, "fork");
  }
  if (pid == 0) {
    /* Only async-signal-safe calls: the daemon has other threads. */
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    signal(SIGPIPE, SIG_DFL);
    prctl(PR_SET_PDEATHSIG, SIGTERM); /* the building thread waits for us; if it dies, stop */
    dup2(in, 0);
    dup2(pfd[1], 1);
    dup2(pfd[1], 2);
    if (lock_fd >= 0 && lock_fd != 3)
      dup2(lock_fd, 3); /* dup2 clears O_CLOEXEC on the copy */
    else if (lock_fd == 3)
      fcntl(3, F_SETFD, 0);
    syscall(SYS_close_range, lock_fd >= 0 ? 4 : 3, ~0u, 0);
    execve(argv[0], argv, envp);
    _exit(127);
  }
  close(pfd[1]);
  close(in);
  FILE *f = fdopen(pfd[0], "r");
  if (!f) {
    close(pfd[0]);
  } else {
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    char last[512] = "";
    while ((n = getline(&line, &cap, f)) > 0) {
      while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r'))
        line[--n] = '\0';
      if (n == 0)
        continue;
      log_info("template %s: %s", name, line);
      snprintf(last, sizeof(last), "%s", line);
    }
    free(line);
    fclose(f);
    int status;
    while (waitpid(pid, &status, 0) < 0)
      if (errno != EINTR)
        return moat_error_errno(err, "wait %s", argv[0]);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
      return 0;
    if (WIFEXITED(status))
      return moat_error_set(err, EIO, "%s exited %d%s%s", argv[0], WEXITSTATUS(status), last[0] ? ": " : "",
                            last);
    return moat_error_set(err, EIO, "%s killed by signal %d", argv[0], WTERMSIG(status));
  }
  int status;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
    ;
  return moat_error_set(err, EIO, "read output of %s", argv[0]);
}

/* Removes every entry of dir except the names in keep (NULL-terminated); missing dir is fine. */
static void empty_dir(const char *dir, const char *const *keep) {
  _cleanup_strv_ char **names = NULL;
  moat_error *e = NULL;
  if (list_dir_sorted(dir, &names, &e) < 0) {
    moat_error_free(&e);
    return;
  }
  for (char **p = names; *p; p++) {
    bool kept = false;
    for (const char *const *k = keep; k && *k; k++)
      kept = kept || strcmp(*p, *k) == 0;
    if (kept)
      continue;
    _cleanup_free_ char *path = xasprintf("%s/%s", dir, *p);
    if (rm_rf(path, &e) < 0) {
      log_warn("template: %s", moat_error_msg(e));
      moat_error_free(&e);
    }
  }
}

/* Builds NAME into tmp (TEMPLATE_DIR/NAME.tmp-XXXXXX) and renames it into place. Build lock held. */
static int build_into(struct moat_templates *t, const char *name, const char *digest, const char *tmp,
                      int lock_fd, moat_error **err) {
  _cleanup_free_ char *recipe = xasprintf("%s/%s", t->recipes_dir, name);
  _cleanup_free_ char *rootfs = xasprintf("%s/rootfs", tmp);
  _cleanup_free_ char *packages = NULL;
  if (read_packages(recipe, &packages, err) < 0)
    return -1;
  const char *mirror = getenv("MOAT_DEBIAN_MIRROR");
  if (!mirror || !*mirror)
    mirror = DEFAULT_MIRROR;
  if (access("/usr/sbin/debootstrap", X_OK) < 0)
    return moat_error_set(err, ENOENT, "debootstrap is not installed (apt-get install debootstrap)");

  uint64_t t0 = now_ns();
  log_info("template %s: debootstrap %s from %s (packages: %s)", name, SUITE, mirror,
           packages[0] ? packages : "none");
  _cleanup_free_ char *include = xasprintf("--include=%s", packages);
  char *deb_argv[8];
  size_t a = 0;
  deb_argv[a++] = "/usr/sbin/debootstrap";
  deb_argv[a++] = "--variant=minbase";
  if (packages[0])
    deb_argv[a++] = include;
  deb_argv[a++] = SUITE;
  deb_argv[a++] = rootfs;
  deb_argv[a++] = (char *)mirror;
  deb_argv[a] = NULL;
  int r = run_logged(name, deb_argv, NULL, lock_fd, err);
  umount_below(rootfs); /* debootstrap mounts /proc and /sys in the target; a failure can leave them */
  if (r < 0)
    return moat_error_wrap(err, "debootstrap");
  log_info("template %s: debootstrap done in %.1f s", name, (double)(now_ns() - t0) / 1e9);

  /* files/: copied by tar, extracted inside the chroot so that the image's own symlinks
   * (bin -> usr/bin, absolute ones) resolve within it and never onto the host. */
  _cleanup_free_ char *files = xasprintf("%s/files", recipe);
  struct stat st;
  if (stat(files, &st) == 0 && S_ISDIR(st.st_mode)) {
    char *cp_argv[] = {"/bin/sh",
                       "-c",
                       "set -e; tar -C \"$1\" --owner=0 --group=0 --numeric-owner -cf - . | "
                       "chroot \"$2\" tar -xpf - -C / --keep-directory-symlink --no-overwrite-dir",
                       "sh",
                       files,
                       rootfs,
                       NULL};
    if (run_logged(name, cp_argv, NULL, lock_fd, err) < 0)
      return moat_error_wrap(err, "copy files/");
  }

  /* run: a shell script run with sh -e as root inside the image (copied to /tmp there, removed
   * after); nothing from the host is mounted into it, its stdin is /dev/null. */
  _cleanup_free_ char *run = xasprintf("%s/run", recipe);
  if (stat(run, &st) == 0 && S_ISREG(st.st_mode)) {
    log_info("template %s: running recipe script", name);
    _cleanup_free_ char *script = NULL;
    if (read_file(run, &script, NULL, err) < 0)
      return moat_error_wrap(err, "recipe script");
    _cleanup_free_ char *tmpdir = xasprintf("%s/tmp", rootfs);
    _cleanup_close_ int tfd = open(tmpdir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (tfd < 0)
      return moat_error_errno(err, "open %s", tmpdir);
    _cleanup_close_ int sfd =
        openat(tfd, ".moat-recipe-run", O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0700);
    if (sfd < 0 || write_all(sfd, script, strlen(script)) < 0)
      return moat_error_errno(err, "copy recipe script into %s", tmpdir);
    char *run_argv[] = {"/usr/sbin/chroot", rootfs, "/bin/sh", "-e", "/tmp/.moat-recipe-run", NULL};
    r = run_logged(name, run_argv, NULL, lock_fd, err);
    umount_below(rootfs);
    unlinkat(tfd, ".moat-recipe-run", 0);
    if (r < 0)
      return moat_error_wrap(err, "recipe script");
  }

  /* Package caches are not part of the image. */
  _cleanup_free_ char *archives = xasprintf("%s/var/cache/apt/archives", rootfs);
  _cleanup_free_ char *lists = xasprintf("%s/var/lib/apt/lists", rootfs);
  _cleanup_free_ char *aptcache = xasprintf("%s/var/cache/apt", rootfs);
  static const char *const keep_archives[] = {"partial", "lock", NULL};
  static const char *const keep_lists[] = {"partial", "lock", NULL};
  static const char *const keep_cache[] = {"archives", NULL};
  empty_dir(archives, keep_archives);
  empty_dir(lists, keep_lists);
  empty_dir(aptcache, keep_cache);

  _cleanup_close_ int rfd = open(rootfs, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  unsigned long long size = rfd >= 0 ? moat_image_tree_size(rfd) : 0;
  char sizebuf[32];
  snprintf(sizebuf, sizeof(sizebuf), "%llu\n", size);
  _cleanup_free_ char *size_path = xasprintf("%s/size", tmp);
  _cleanup_free_ char *ready_path = xasprintf("%s/ready", tmp);
  _cleanup_free_ char *ready = xasprintf("%s\n", digest);
  _cleanup_close_ int sfd = open(size_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  _cleanup_close_ int dfd = open(ready_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (sfd < 0 || dfd < 0 || write_all(sfd, sizebuf, strlen(sizebuf)) < 0 ||
      write_all(dfd, ready, strlen(ready)) < 0)
    return moat_error_errno(err, "write %s", ready_path);
  if (syncfs(dfd) < 0) /* the image must be on disk before it is visible under its name */
    return moat_error_errno(err, "sync %s", tmp);

  _cleanup_free_ char *final = xasprintf("%s/%s", t->template_dir, name);
  if (renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_EXCHANGE) == 0) {
    /* tmp now holds the old image. Sandboxes may still run on it, and nothing here can tell (their
     * idmapped views of it are detached mounts): deleting it would pull files from under them. So it
     * is parked as NAME.old-XXXXXX and left for whoever runs moatd to remove. */
    char suffix[7];
    random_id(suffix, 6);
    _cleanup_free_ char *old = xasprintf("%s/%s.old-%s", t->template_dir, name, suffix);
    if (rename(tmp, old) < 0)
      log_warn("template %s: park the replaced image at %s: %s; removing it", name, old, strerror(errno));
    else
      log_warn("template %s: the replaced image is kept at %s; remove it (rm -rf) once no sandbox created "
               "before now runs",
               name, old);
  } else if (errno == ENOENT) {
    if (rename(tmp, final) < 0)
      return moat_error_errno(err, "rename %s to %s", tmp, final);
  } else {
    return moat_error_errno(err, "exchange %s with %s", tmp, final);
  }
  log_info("template %s: ready in %.1f s, %.1f MiB, at %s", name, (double)(now_ns() - t0) / 1e9,
           (double)size / (1024.0 * 1024.0), final);
  return 0;
}

/* Builds NAME unless another process did meanwhile; takes the cross-process lock. */
static int build(struct moat_templates *t, const char *name, moat_error **err) {
  if (mkdir_p(t->template_dir, 0755, err) < 0)
    return -1;
  _cleanup_free_ char *lock_path = xasprintf("%s/%s.lock", t->template_dir, name);
  _cleanup_close_ int lfd = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lfd < 0)
    return moat_error_errno(err, "open %s", lock_path);
  if (flock(lfd, LOCK_EX | LOCK_NB) < 0) {
    if (errno != EWOULDBLOCK)
      return moat_error_errno(err, "lock %s", lock_path);
    log_info("template %s: another process is building it; waiting", name);
    while (flock(lfd, LOCK_EX) < 0)
      if (errno != EINTR)
        return moat_error_errno(err, "lock %s", lock_path);
  }
  char digest[65];
  if (moat_template_digest(t, name, digest, err) < 0)
    return -1;
  if (built_matches(t, name, digest))
    return 0; /* another process built it while we waited */
  if (moat_template_remove_leftovers(t, name, err) < 0)
    return -1;
  _cleanup_free_ char *tmp = xasprintf("%s/%s.tmp-XXXXXX", t->template_dir, name);
  if (!mkdtemp(tmp))
    return moat_error_errno(err, "mkdtemp %s", tmp);
  chmod(tmp, 0755);
  int r = build_into(t, name, digest, tmp, lfd, err);
  moat_error *rm_err = NULL;
  if (remove_tree(tmp, &rm_err) < 0) {
    log_warn("template %s: %s", name, moat_error_msg(rm_err));
    moat_error_free(&rm_err);
  }
  if (r < 0)
    return moat_error_wrap(err, "build template '%s'", name);
  return 0;
}

int moat_templates_open(struct moat_templates **out, const char *recipes_dir, const char *template_dir,
                        moat_error **err) {
  struct stat st;
  if (stat(recipes_dir, &st) < 0)
    return moat_error_errno(err, "template recipes %s", recipes_dir);
  if (!S_ISDIR(st.st_mode))
    return moat_error_set(err, ENOTDIR, "template recipes %s: not a directory", recipes_dir);
  if (mkdir_p(template_dir, 0755, err) < 0)
    return moat_error_wrap(err, "template dir");
  struct moat_templates *t = xcalloc(1, sizeof(*t));
  t->recipes_dir = xstrdup(recipes_dir);
  t->template_dir = xstrdup(template_dir);
  pthread_mutex_init(&t->mu, NULL);
  pthread_cond_init(&t->cv, NULL);
  *out = t;
  return 0;
}

void moat_templates_close(struct moat_templates *t) {
  if (!t)
    return;
  struct entry *e = t->entries;
  while (e) {
    struct entry *next = e->next;
    free(e->name);
    free(e->error);
    free(e);
    e = next;
  }
  pthread_mutex_destroy(&t->mu);
  pthread_cond_destroy(&t->cv);
  free(t->recipes_dir);
  free(t->template_dir);
  free(t);
}

bool moat_template_exists(struct moat_templates *t, const char *name) { return recipe_present(t, name); }

int moat_template_ensure(struct moat_templates *t, const char *name, moat_error **err) {
  if (!recipe_present(t, name))
    return moat_error_set(err, ENOENT, "unknown template '%s'", name);
  pthread_mutex_lock(&t->mu);
  struct entry *e = entry_get(t, name);
  while (e->building) {
    /* Another thread builds it: wait for that build and share its outcome. */
    unsigned gen = e->generation;
    while (e->generation == gen)
      pthread_cond_wait(&t->cv, &t->mu);
    if (e->failed) {
      int r = moat_error_set(err, EIO, "%s", e->error ? e->error : "template build failed");
      pthread_mutex_unlock(&t->mu);
      return r;
    }
  }
  if (is_ready_locked(t, e)) {
    pthread_mutex_unlock(&t->mu);
    return 0;
  }
  e->building = true;
  pthread_mutex_unlock(&t->mu);

  moat_error *berr = NULL;
  int r = build(t, name, &berr);

  pthread_mutex_lock(&t->mu);
  e->building = false;
  e->generation++;
  e->ready_cached = false;
  free(e->error);
  e->error = NULL;
  e->failed = r < 0;
  e->size = 0;
  if (r < 0) {
    e->error = xstrdup(moat_error_msg(berr));
    log_error("template %s: %s", name, e->error);
  }
  pthread_cond_broadcast(&t->cv);
  pthread_mutex_unlock(&t->mu);
  if (r < 0) {
    if (err && !*err)
      *err = berr;
    else
      moat_error_free(&berr);
    return -1;
  }
  return 0;
}

/* Size of a built template: its size file, else a walk of the rootfs (cached in the entry). */
static unsigned long long built_size(struct moat_templates *t, struct entry *e) {
  if (e->size)
    return e->size;
  _cleanup_free_ char *path = xasprintf("%s/%s/size", t->template_dir, e->name);
  _cleanup_free_ char *text = NULL;
  moat_error *err = NULL;
  uint64_t v = 0;
  if (read_file(path, &text, NULL, &err) == 0) {
    text[strcspn(text, "\n")] = '\0';
    if (parse_u64(text, &v) < 0)
      v = 0;
  }
  moat_error_free(&err);
  if (v == 0) {
    _cleanup_free_ char *rootfs = xasprintf("%s/%s/rootfs", t->template_dir, e->name);
    _cleanup_close_ int fd = open(rootfs, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0)
      v = moat_image_tree_size(fd);
  }
  e->size = v;
  return v;
}

/* True when another process holds NAME's build lock. */
static bool locked_elsewhere(struct moat_templates *t, const char *name) {
  _cleanup_free_ char *lock_path = xasprintf("%s/%s.lock", t->template_dir, name);
  _cleanup_close_ int fd = open(lock_path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return false;
  if (flock(fd, LOCK_SH | LOCK_NB) < 0)
    return errno == EWOULDBLOCK;
  flock(fd, LOCK_UN);
  return false;
}

int moat_template_list(struct moat_templates *t, struct moat_template_info **out, size_t *n,
                       moat_error **err) {
  _cleanup_strv_ char **names = NULL;
  if (list_dir_sorted(t->recipes_dir, &names, err) < 0)
    return moat_error_wrap(err, "list templates");
  struct moat_template_info *v = xcalloc(strv_len(names) + 1, sizeof(*v));
  size_t k = 0;
  pthread_mutex_lock(&t->mu);
  for (char **p = names; *p; p++) {
    if (!recipe_present(t, *p))
      continue;
    struct entry *e = entry_get(t, *p);
    struct moat_template_info *info = &v[k++];
    info->name = xstrdup(*p);
    if (e->building) {
      info->state = MOAT_TEMPLATE_BUILDING;
    } else if (is_ready_locked(t, e)) {
      info->state = MOAT_TEMPLATE_READY;
      _cleanup_free_ char *ready = xasprintf("%s/%s/ready", t->template_dir, *p);
      struct stat st;
      if (stat(ready, &st) == 0)
        info->built_at = (long long)st.st_mtime;
      info->size_bytes = built_size(t, e);
    } else if (locked_elsewhere(t, *p)) {
      info->state = MOAT_TEMPLATE_BUILDING;
    } else if (e->failed) {
      info->state = MOAT_TEMPLATE_FAILED;
    } else {
      info->state = MOAT_TEMPLATE_MISSING;
    }
    if (e->failed && e->error && info->state != MOAT_TEMPLATE_READY)
      info->error = xstrdup(e->error);
  }
  pthread_mutex_unlock(&t->mu);
  *out = v;
  *n = k;
  return 0;
}

void moat_template_infos_free(struct moat_template_info *v, size_t n) {
  if (!v)
    return;
  for (size_t i = 0; i < n; i++) {
    free(v[i].name);
    free(v[i].error);
  }
  free(v);
}

char *moat_template_rootfs(struct moat_templates *t, const char *name) {
  if (!recipe_present(t, name))
    return NULL;
  pthread_mutex_lock(&t->mu);
  struct entry *e = entry_get(t, name);
  bool ready = !e->building && is_ready_locked(t, e);
  pthread_mutex_unlock(&t->mu);
  return ready ? xasprintf("%s/%s/rootfs", t->template_dir, name) : NULL;
}

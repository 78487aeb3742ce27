/* context_tar.c -- a build context as a tar: a directory walked without following symbolic links,
 * less what its .dockerignore excludes */
#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../common/util.h"
#include "context_tar.h"

#define IGNORE_MAX_BYTES (1 << 20)
#define LINK_MAX_BYTES 4096

struct ignore_rule {
  char *pattern;
  bool negate;
};

struct walk {
  struct archive *a;
  struct ignore_rule *rules;
  size_t n_rules;
  bool any_negate;
  const char *keep[2]; /* relative paths sent even when .dockerignore excludes them */
  struct cli_tar_stats *stats;
};

static void rules_free(struct walk *w) {
  for (size_t i = 0; i < w->n_rules; i++)
    free(w->rules[i].pattern);
  free(w->rules);
}

/* Reads dirfd's .dockerignore (a missing one is no rule). Returns 0 or -1 (printed). */
static int rules_load(struct walk *w, int dirfd) {
  _cleanup_close_ int fd = openat(dirfd, ".dockerignore", O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT)
      return 0;
    cli_errorf(".dockerignore: %s", strerror(errno));
    return -1;
  }
  _cleanup_free_ char *text = xcalloc(IGNORE_MAX_BYTES + 1, 1);
  size_t len = 0;
  for (;;) {
    ssize_t r = read(fd, text + len, IGNORE_MAX_BYTES - len);
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0) {
      cli_errorf(".dockerignore: %s", strerror(errno));
      return -1;
    }
    if (r == 0)
      break;
    len += (size_t)r;
    if (len == IGNORE_MAX_BYTES) {
      cli_errorf(".dockerignore is over %d bytes", IGNORE_MAX_BYTES);
      return -1;
    }
  }
  char *save = NULL;
  for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    char *p = line;
    while (*p == ' ' || *p == '\t')
      p++;
    size_t l = strlen(p);
    while (l && (p[l - 1] == ' ' || p[l - 1] == '\t' || p[l - 1] == '\r'))
      p[--l] = '\0';
    if (!*p || *p == '#')
      continue;
    bool negate = *p == '!';
    if (negate)
      p++;
    while (*p == '/' || (p[0] == '.' && p[1] == '/'))
      p += *p == '/' ? 1 : 2;
    l = strlen(p);
    while (l && p[l - 1] == '/')
      p[--l] = '\0';
    if (!*p)
      continue;
    w->rules = xrealloc(w->rules, (w->n_rules + 1) * sizeof(*w->rules));
    w->rules[w->n_rules++] = (struct ignore_rule){xstrdup(p), negate};
    w->any_negate |= negate;
  }
  return 0;
}

/* Whether pattern matches path or a directory above it. '*' and '?' stop at '/', except in a
 * pattern with "**", where every '*' crosses directories. */
static bool rule_matches(const char *pattern, const char *path) {
  int flags = strstr(pattern, "**") ? 0 : FNM_PATHNAME;
  if (fnmatch(pattern, path, flags) == 0)
    return true;
  _cleanup_free_ char *prefix = xstrdup(path);
  for (char *slash = strrchr(prefix, '/'); slash; slash = strrchr(prefix, '/')) {
    *slash = '\0';
    if (fnmatch(pattern, prefix, flags) == 0)
      return true;
  }
  return false;
}

static bool excluded(const struct walk *w, const char *rel) {
  for (size_t i = 0; i < 2; i++)
    if (w->keep[i] && strcmp(w->keep[i], rel) == 0)
      return false;
  bool out = false;
  for (size_t i = 0; i < w->n_rules; i++) /* the last rule that matches decides */
    if (rule_matches(w->rules[i].pattern, rel))
      out = !w->rules[i].negate;
  return out;
}

/* Whether a kept path lies beneath directory rel (so that an excluded directory is still walked). */
static bool keeps_beneath(const struct walk *w, const char *rel) {
  size_t l = strlen(rel);
  for (size_t i = 0; i < 2; i++)
    if (w->keep[i] && strncmp(w->keep[i], rel, l) == 0 && w->keep[i][l] == '/')
      return true;
  return false;
}

static int write_header(struct walk *w, const char *rel, const struct stat *st, mode_t type, int64_t size,
                        const char *symlink) {
  struct archive_entry *e = archive_entry_new();
  archive_entry_set_pathname(e, rel);
  archive_entry_set_filetype(e, type);
  archive_entry_set_perm(e, st->st_mode & 07777);
  archive_entry_set_size(e, size);
  archive_entry_set_mtime(e, st->st_mtim.tv_sec, 0);
  if (symlink)
    archive_entry_set_symlink(e, symlink);
  int r = archive_write_header(w->a, e);
  archive_entry_free(e);
  if (r != ARCHIVE_OK) {
    cli_errorf("tar %s: %s", rel, archive_error_string(w->a));
    return -1;
  }
  return 0;
}

/* Adds the regular file name of dirfd as rel: opened without following a link and checked to be
 * the file lstat saw; exactly st_size bytes are sent (a file that shrinks meanwhile is an error). */
static int add_file(struct walk *w, int dirfd, const char *name, const char *rel, const struct stat *lst) {
  _cleanup_close_ int fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_NOCTTY | O_NONBLOCK | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) < 0) {
    cli_errorf("%s: %s", rel, strerror(errno));
    return -1;
  }
  if (!S_ISREG(st.st_mode) || st.st_ino != lst->st_ino || st.st_dev != lst->st_dev) {
    cli_errorf("%s: changed while it was read", rel);
    return -1;
  }
  if (write_header(w, rel, &st, AE_IFREG, st.st_size, NULL) < 0)
    return -1;
  char buf[65536];
  int64_t left = st.st_size;
  while (left > 0) {
    ssize_t r = read(fd, buf, left < (int64_t)sizeof(buf) ? (size_t)left : sizeof(buf));
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0) {
      cli_errorf("%s: %s", rel, r < 0 ? strerror(errno) : "shrank while it was read");
      return -1;
    }
    if (archive_write_data(w->a, buf, (size_t)r) != r) {
      cli_errorf("tar %s: %s", rel, archive_error_string(w->a));
      return -1;
    }
    left -= r;
  }
  w->stats->files++;
  w->stats->bytes += (uint64_t)st.st_size;
  return 0;
}

static int name_cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Adds the entries of directory dirfd (rel: its path in the tar, "" for the root), sorted by name. */
static int add_dir(struct walk *w, int dirfd, const char *rel, int depth) {
  if (depth > 256) {
    cli_errorf("%s: directories nested too deep", rel);
    return -1;
  }
  int dup_fd = fcntl(dirfd, F_DUPFD_CLOEXEC, 0);
  DIR *d = dup_fd >= 0 ? fdopendir(dup_fd) : NULL;
  if (!d) {
    cli_errorf("%s: %s", rel[0] ? rel : ".", strerror(errno));
    if (dup_fd >= 0)
      close(dup_fd);
    return -1;
  }
  _cleanup_strv_ char **names = NULL;
  size_t n = 0;
  struct dirent *de;
  errno = 0;
  while ((de = readdir(d))) {
    if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
      continue;
    names = xrealloc(names, (n + 2) * sizeof(*names));
    names[n++] = xstrdup(de->d_name);
    names[n] = NULL;
  }
  int e = errno;
  closedir(d);
  if (e) {
    cli_errorf("%s: %s", rel[0] ? rel : ".", strerror(e));
    return -1;
  }
  if (n)
    qsort(names, n, sizeof(*names), name_cmp);
  for (size_t i = 0; i < n; i++) {
    _cleanup_free_ char *child = rel[0] ? xasprintf("%s/%s", rel, names[i]) : xstrdup(names[i]);
    struct stat st;
    if (fstatat(dirfd, names[i], &st, AT_SYMLINK_NOFOLLOW) < 0) {
      cli_errorf("%s: %s", child, strerror(errno));
      return -1;
    }
    bool skip = excluded(w, child);
    if (S_ISDIR(st.st_mode)) {
      if (skip && !w->any_negate && !keeps_beneath(w, child))
        continue; /* nothing beneath can come back */
      if (!skip && write_header(w, child, &st, AE_IFDIR, 0, NULL) < 0)
        return -1;
      _cleanup_close_ int sub = openat(dirfd, names[i], O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (sub < 0) {
        cli_errorf("%s: %s", child, strerror(errno));
        return -1;
      }
      if (add_dir(w, sub, child, depth + 1) < 0)
        return -1;
      continue;
    }
    if (skip)
      continue;
    if (S_ISREG(st.st_mode)) {
      if (add_file(w, dirfd, names[i], child, &st) < 0)
        return -1;
    } else if (S_ISLNK(st.st_mode)) {
      /* The link itself, never what it points to: moatd refuses one that leads out of the context. */
      char target[LINK_MAX_BYTES];
      ssize_t l = readlinkat(dirfd, names[i], target, sizeof(target) - 1);
      if (l < 0) {
        cli_errorf("%s: %s", child, strerror(errno));
        return -1;
      }
      target[l] = '\0';
      if (write_header(w, child, &st, AE_IFLNK, 0, target) < 0)
        return -1;
    } else {
      fprintf(stderr, "moat: %s: not a file, directory or link: left out\n", child);
    }
  }
  return 0;
}

static la_ssize_t file_write(struct archive *a, void *ud, const void *buf, size_t len) {
  (void)a;
  return fwrite(buf, 1, len, ud) == len ? (la_ssize_t)len : -1;
}

int cli_context_tar(const char *dir, const char *dockerfile_rel, const char *extra_name, FILE *extra,
                    FILE *out, struct cli_tar_stats *stats) {
  memset(stats, 0, sizeof(*stats));
  _cleanup_close_ int root = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (root < 0) {
    cli_errorf("%s: %s", dir, strerror(errno));
    return -1;
  }
  struct walk w = {.stats = stats, .keep = {dockerfile_rel, ".dockerignore"}};
  if (rules_load(&w, root) < 0) {
    rules_free(&w);
    return -1;
  }
  w.a = archive_write_new();
  archive_write_set_format_pax_restricted(w.a);
  archive_write_set_bytes_in_last_block(w.a, 1);
  int ret = -1;
  if (archive_write_open2(w.a, out, NULL, file_write, NULL, NULL) != ARCHIVE_OK) {
    cli_errorf("tar: %s", archive_error_string(w.a));
    goto out;
  }
  if (add_dir(&w, root, "", 0) < 0)
    goto out;
  if (extra) {
    struct stat st;
    if (fstat(fileno(extra), &st) < 0 || !S_ISREG(st.st_mode)) {
      cli_errorf("%s: not a regular file", extra_name);
      goto out;
    }
    st.st_mode = S_IFREG | 0644;
    if (write_header(&w, extra_name, &st, AE_IFREG, st.st_size, NULL) < 0)
      goto out;
    char buf[65536];
    size_t r;
    int64_t left = st.st_size;
    while (left > 0 && (r = fread(buf, 1, sizeof(buf), extra)) > 0) {
      if (archive_write_data(w.a, buf, r) != (la_ssize_t)r) {
        cli_errorf("tar: %s", archive_error_string(w.a));
        goto out;
      }
      left -= (int64_t)r;
    }
    if (left != 0) {
      cli_errorf("%s: %s", extra_name, ferror(extra) ? strerror(errno) : "changed while it was read");
      goto out;
    }
  }
  if (archive_write_close(w.a) != ARCHIVE_OK) {
    cli_errorf("tar: %s", archive_error_string(w.a));
    goto out;
  }
  ret = 0;
out:
  archive_write_free(w.a);
  rules_free(&w);
  return ret;
}

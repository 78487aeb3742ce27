/* users.c -- user and group lookup from the sandbox's own /etc/passwd and /etc/group (no NSS) */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "../common/util.h"
#include "guest.h"

/* Splits line at ':' into at most n fields (in place). Returns the number of fields found. */
static size_t split_colon(char *line, char **fields, size_t n) {
  size_t i = 0;
  char *p = line;
  while (i < n) {
    fields[i++] = p;
    char *c = strchr(p, ':');
    if (!c)
      break;
    *c = '\0';
    p = c + 1;
  }
  return i;
}

/* Parses a decimal id (uid/gid) that fits in 32 bits and is not (uid_t)-1. */
static int parse_id(const char *s, uint32_t *out) {
  uint64_t v;
  if (parse_u64(s, &v) < 0 || v >= UINT32_MAX)
    return -1;
  *out = (uint32_t)v;
  return 0;
}

static bool member_of(char *members, const char *name) {
  char *save = NULL;
  for (char *m = strtok_r(members, ",", &save); m; m = strtok_r(NULL, ",", &save))
    if (strcmp(m, name) == 0)
      return true;
  return false;
}

static void add_group(struct guest_user *u, gid_t g) {
  for (size_t i = 0; i < u->ngroups; i++)
    if (u->groups[i] == g)
      return;
  if (u->ngroups < GUEST_MAX_GROUPS)
    u->groups[u->ngroups++] = g;
}

static void collect_groups(const char *etc_dir, struct guest_user *u) {
  _cleanup_free_ char *path = xasprintf("%s/group", etc_dir);
  _cleanup_free_ char *text = NULL;
  moat_error *err = NULL;
  if (read_file(path, &text, NULL, &err) < 0) { /* no group file: only the primary group */
    moat_error_free(&err);
    return;
  }
  char *save = NULL;
  for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    char *f[4];
    uint32_t gid;
    if (line[0] == '#' || split_colon(line, f, 4) < 4 || parse_id(f[2], &gid) < 0)
      continue;
    if (member_of(f[3], u->name))
      add_group(u, gid);
  }
}

int guest_user_lookup(const char *etc_dir, const char *name, struct guest_user *u, moat_error **err) {
  memset(u, 0, sizeof(*u));
  bool want_root = name == NULL || name[0] == '\0';
  _cleanup_free_ char *path = xasprintf("%s/passwd", etc_dir);
  _cleanup_free_ char *text = NULL;
  moat_error *rerr = NULL;
  if (read_file(path, &text, NULL, &rerr) < 0) {
    if (!want_root || rerr->status != ENOENT) {
      int st = rerr->status;
      int r = moat_error_set(err, st == ENOENT ? EINVAL : st, "user '%s': %s", want_root ? "root" : name,
                             moat_error_msg(rerr));
      moat_error_free(&rerr);
      return r;
    }
    moat_error_free(&rerr);
  }
  /* a name, or a number: the uid (as docker exec -u 1000 takes it) */
  uint32_t by_uid = 0;
  bool numeric = !want_root && parse_id(name, &by_uid) == 0;
  char *save = NULL;
  for (char *line = text ? strtok_r(text, "\n", &save) : NULL; line; line = strtok_r(NULL, "\n", &save)) {
    char *f[7];
    uint32_t uid, gid;
    if (line[0] == '#' || split_colon(line, f, 7) < 7 || parse_id(f[2], &uid) < 0 || parse_id(f[3], &gid) < 0)
      continue;
    if (want_root ? uid != 0 : numeric ? uid != by_uid : strcmp(f[0], name) != 0)
      continue;
    u->name = xstrdup(f[0]);
    u->uid = uid;
    u->gid = gid;
    u->home = xstrdup(f[5][0] ? f[5] : "/");
    u->shell = xstrdup(f[6][0] ? f[6] : "/bin/sh");
    break;
  }
  if (!u->name && numeric) { /* a uid the image has no entry for: itself, its own group, home / */
    u->name = xstrdup(name);
    u->uid = by_uid;
    u->gid = by_uid;
    u->home = xstrdup("/");
    u->shell = xstrdup("/bin/sh");
  }
  if (!u->name) {
    if (!want_root)
      return moat_error_set(err, EINVAL, "user '%s' does not exist", name);
    u->name = xstrdup("root");
    u->home = xstrdup("/root");
    u->shell = xstrdup("/bin/sh");
  }
  add_group(u, u->gid);
  collect_groups(etc_dir, u);
  return 0;
}

void guest_user_clear(struct guest_user *u) {
  free(u->name);
  free(u->home);
  free(u->shell);
  memset(u, 0, sizeof(*u));
}

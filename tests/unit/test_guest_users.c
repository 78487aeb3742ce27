/* test_guest_users.c -- passwd/group parsing and path normalisation of moat-guest (library level) */
#include "guest/guest.h"
#include "test_guest_util.h"

static char etc[64];

static void put(const char *name, const char *text) {
  char p[128];
  snprintf(p, sizeof(p), "%s/%s", etc, name);
  FILE *f = fopen(p, "w");
  fputs(text, f);
  fclose(f);
}

static void test_users(void) {
  snprintf(etc, sizeof(etc), "/tmp/moat-users-XXXXXX");
  mkdtemp(etc);
  put("passwd", "root:x:0:0:root:/root:/bin/bash\n"
                "# comment\n"
                "broken line\n"
                "daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n"
                "user:x:1000:1000:,,,:/home/user:/bin/bash\n"
                "nohome:x:1001:1001::::\n"
                "bad:x:notanumber:1::/:/bin/sh\n");
  put("group", "root:x:0:\n"
               "sudo:x:27:user,other\n"
               "users:x:100:other,user\n"
               "user:x:1000:\n"
               "audio:x:29:nobody\n"
               "garbage\n");
  struct guest_user u;
  moat_error *err = NULL;
  CHECK(guest_user_lookup(etc, "user", &u, &err) == 0 && u.uid == 1000 && u.gid == 1000 &&
            strcmp(u.home, "/home/user") == 0 && strcmp(u.shell, "/bin/bash") == 0,
        "user found with home and shell");
  bool g27 = false, g100 = false, g29 = false;
  for (size_t i = 0; i < u.ngroups; i++) {
    g27 |= u.groups[i] == 27;
    g100 |= u.groups[i] == 100;
    g29 |= u.groups[i] == 29;
  }
  CHECK(u.ngroups == 3 && u.groups[0] == 1000 && g27 && g100 && !g29, "groups: primary + sudo + users (%zu)",
        u.ngroups);
  guest_user_clear(&u);

  CHECK(guest_user_lookup(etc, NULL, &u, &err) == 0 && u.uid == 0 && strcmp(u.name, "root") == 0 &&
            strcmp(u.shell, "/bin/bash") == 0,
        "absent user = root");
  guest_user_clear(&u);
  CHECK(guest_user_lookup(etc, "nohome", &u, &err) == 0 && strcmp(u.home, "/") == 0 &&
            strcmp(u.shell, "/bin/sh") == 0,
        "empty home/shell default to / and /bin/sh");
  guest_user_clear(&u);
  CHECK(guest_user_lookup(etc, "bad", &u, &err) < 0 && err->status == EINVAL, "malformed uid line ignored");
  moat_error_free(&err);
  CHECK(guest_user_lookup(etc, "ghost", &u, &err) < 0 && err->status == EINVAL &&
            strcmp(err->msg, "user 'ghost' does not exist") == 0,
        "unknown user message");
  moat_error_free(&err);
  CHECK(guest_user_lookup(etc, "broken line", &u, &err) < 0, "a line with too few fields matches nothing");
  moat_error_free(&err);
  CHECK(guest_user_lookup(etc, "1000", &u, &err) == 0 && strcmp(u.name, "user") == 0 && u.uid == 1000 &&
            strcmp(u.home, "/home/user") == 0,
        "a number is the uid of the entry that has it");
  guest_user_clear(&u);
  CHECK(guest_user_lookup(etc, "4321", &u, &err) == 0 && u.uid == 4321 && u.gid == 4321 &&
            strcmp(u.home, "/") == 0,
        "a uid with no entry is itself, its own group, home /");
  guest_user_clear(&u);
  CHECK(guest_user_lookup(etc, "4294967295", &u, &err) < 0, "a number beyond uid_t is no uid");
  moat_error_free(&err);

  put("passwd", "user:x:1000:1000::/home/user:/bin/sh\n");
  CHECK(guest_user_lookup(etc, NULL, &u, &err) == 0 && u.uid == 0 && strcmp(u.home, "/root") == 0,
        "no uid 0 line: root with /root");
  guest_user_clear(&u);
  rm_rf(etc, &err);
  CHECK(guest_user_lookup(etc, NULL, &u, &err) == 0 && u.uid == 0, "no passwd at all: root still works");
  guest_user_clear(&u);
  CHECK(guest_user_lookup(etc, "user", &u, &err) < 0 && err->status == EINVAL, "no passwd: named user fails");
  moat_error_free(&err);
}

static void test_paths(void) {
  static const char *cases[][3] = {
      {"/home/u", "/a/b", "/a/b"},
      {"/home/u", "a/b", "/home/u/a/b"},
      {"/home/u", ".", "/home/u"},
      {"/home/u", "..", "/home"},
      {"/home/u", "../../../..", "/"},
      {"/home/u", "/../etc//passwd/", "/etc/passwd"},
      {"/home/u", "/a/./b/../c", "/a/c"},
      {"/home/u", "/", "/"},
      {"/home/u", "//", "/"},
      {"/", "x", "/x"},
      {"/home/u", "...", "/home/u/..."},
      {"/home/u", "a/..b", "/home/u/a/..b"},
  };
  for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
    moat_error *err = NULL;
    char *p = guest_path_resolve(cases[i][0], cases[i][1], &err);
    CHECK(p && strcmp(p, cases[i][2]) == 0, "resolve '%s' in %s -> %s (%s)", cases[i][1], cases[i][0],
          cases[i][2], p ? p : moat_error_msg(err));
    free(p);
    moat_error_free(&err);
  }
  moat_error *err = NULL;
  CHECK(guest_path_resolve("/", "", &err) == NULL && err->status == EINVAL, "empty path -> EINVAL");
  moat_error_free(&err);
  char *longp = xmalloc(4200);
  memset(longp, 'a', 4199);
  longp[4199] = 0;
  CHECK(guest_path_resolve("/", longp, &err) == NULL && err->status == EINVAL, "too long -> EINVAL");
  moat_error_free(&err);
  memset(longp, 'a', 4000);
  longp[4000] = 0;
  CHECK(
      guest_path_resolve("/home/very/long/home/directory/for/this/test/case/that/pushes/it/over/the/limit/of/"
                         "4096/bytes/total/when/joined/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
                         longp, &err) == NULL &&
          err->status == EINVAL,
      "too long after joining home -> EINVAL");
  moat_error_free(&err);
  free(longp);
}

int main(void) {
  test_users();
  test_paths();
  return tap_done();
}

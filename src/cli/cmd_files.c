/* cmd_files.c -- moat cp: stream one file into or out of a sandbox */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../common/util.h"
#include "cli.h"

static const char cp_usage[] =
    "moat cp SRC DST   where exactly one of them is ID:PATH\n"
    "  moat cp ./data.csv ID:/home/user/   upload (a DST ending in / takes SRC's name)\n"
    "  moat cp ID:/etc/os-release .        download (into a directory, or to a file name)\n"
    "  '-' as the local side means stdin / stdout. A local name containing ':' needs a './'.\n"
    "moat cp -r SRC DST   a directory, as one tar stream: DST becomes a copy of SRC's tree\n"
    "  moat cp -r ./src ID:/work/src      upload (DST made if missing; the sandbox extracts it)\n"
    "  moat cp -r ID:/work/out ./out      download into a NEW local directory; entries that are\n"
    "                                     absolute, have '..', are hard links, devices or lead\n"
    "                                     through a link are refused (exit 1)\n";

/* Splits "ID:PATH" when spec starts with an id ([A-Za-z0-9_-]+) and a colon; else false. */
static bool split_remote(const char *spec, char **id, const char **path) {
  const char *c = spec;
  while ((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '_' ||
         *c == '-')
    c++;
  if (c == spec || *c != ':')
    return false;
  *id = xstrndup(spec, (size_t)(c - spec));
  *path = c + 1;
  return true;
}

static char *base_name(const char *p) {
  _cleanup_free_ char *copy = xstrdup(p);
  size_t l = strlen(copy);
  while (l > 1 && copy[l - 1] == '/')
    copy[--l] = '\0';
  return xstrdup(basename(copy));
}

static int upload(const char *local, const char *id, const char *rpath) {
  FILE *in = stdin;
  long long size = -1;
  mode_t mode = 0644;
  if (strcmp(local, "-") != 0) {
    in = fopen(local, "rbe");
    if (!in) {
      cli_errorf("%s: %s", local, strerror(errno));
      return EXIT_API;
    }
    struct stat st;
    if (fstat(fileno(in), &st) < 0 || S_ISDIR(st.st_mode)) {
      cli_errorf("%s: %s", local,
                 S_ISDIR(st.st_mode) ? "is a directory (cp copies one file)" : strerror(errno));
      fclose(in);
      return EXIT_API;
    }
    if (S_ISREG(st.st_mode))
      size = (long long)st.st_size;
    mode = st.st_mode & 07777;
  }
  _cleanup_free_ char *target = NULL;
  size_t rl = strlen(rpath);
  if (rl == 0 || rpath[rl - 1] == '/') {
    if (in == stdin)
      return cli_usage_error(cp_usage, "uploading stdin needs a file name in DST");
    _cleanup_free_ char *b = base_name(local);
    target = xasprintf("%s%s", rpath, b);
  } else {
    target = xstrdup(rpath);
  }
  _cleanup_free_ char *eid = cli_escape(id);
  _cleanup_free_ char *epath = cli_escape(target);
  _cleanup_free_ char *url =
      xasprintf("/v1/sandboxes/%s/files?path=%s&mode=%04o", eid, epath, (unsigned)mode);
  struct cli_resp resp;
  int r = cli_upload(url, in, size, &resp);
  if (in != stdin)
    fclose(in);
  if (r < 0)
    return EXIT_API;
  json_decref(resp.json);
  return 0;
}

static int download(const char *id, const char *rpath, const char *local) {
  _cleanup_free_ char *eid = cli_escape(id);
  _cleanup_free_ char *epath = cli_escape(rpath);
  /* stat first: a directory is refused before anything local changes, and the mode is kept. */
  _cleanup_free_ char *stat_url = xasprintf("/v1/sandboxes/%s/files/stat?path=%s", eid, epath);
  struct cli_resp st_resp;
  if (cli_request("GET", stat_url, NULL, &st_resp) < 0)
    return EXIT_API;
  const char *type = json_string_value(json_object_get(st_resp.json, "type"));
  const char *mode_s = json_string_value(json_object_get(st_resp.json, "mode"));
  mode_t mode = mode_s ? (mode_t)strtoul(mode_s, NULL, 8) & 0777 : 0644;
  bool is_dir = type && strcmp(type, "dir") == 0;
  json_decref(st_resp.json);
  if (is_dir) {
    cli_errorf("%s:%s is a directory (cp copies one file)", id, rpath);
    return EXIT_API;
  }
  _cleanup_free_ char *url = xasprintf("/v1/sandboxes/%s/files?path=%s", eid, epath);
  if (strcmp(local, "-") == 0)
    return cli_download(url, stdout) < 0 ? EXIT_API : 0;

  _cleanup_free_ char *dest = NULL;
  struct stat st;
  size_t ll = strlen(local);
  if ((stat(local, &st) == 0 && S_ISDIR(st.st_mode)) || local[ll - 1] == '/') {
    _cleanup_free_ char *b = base_name(rpath);
    dest = xasprintf("%s%s%s", local, local[ll - 1] == '/' ? "" : "/", b);
  } else {
    dest = xstrdup(local);
  }
  /* Write beside the destination and rename: a failed transfer leaves the old file untouched. */
  _cleanup_free_ char *dcopy = xstrdup(dest);
  _cleanup_free_ char *tmp = xasprintf("%s/.moat-cp-XXXXXX", dirname(dcopy));
  int fd = mkostemp(tmp, O_CLOEXEC);
  if (fd < 0) {
    cli_errorf("%s: %s", tmp, strerror(errno));
    return EXIT_API;
  }
  FILE *out = fdopen(fd, "wb");
  if (!out) {
    close(fd);
    unlink(tmp);
    cli_errorf("fdopen: %s", strerror(errno));
    return EXIT_API;
  }
  int r = cli_download(url, out);
  if (fchmod(fileno(out), mode & ~(mode_t)0) < 0 && r == 0) {
    cli_errorf("chmod %s: %s", tmp, strerror(errno));
    r = -1;
  }
  if (fclose(out) != 0 && r == 0) {
    cli_errorf("write %s: %s", dest, strerror(errno));
    r = -1;
  }
  if (r == 0 && rename(tmp, dest) < 0) {
    cli_errorf("rename to %s: %s", dest, strerror(errno));
    r = -1;
  }
  if (r < 0) {
    unlink(tmp);
    return EXIT_API;
  }
  return 0;
}

static const struct cli_opt cp_opts[] = {{"recursive", false, 1}, {"r", false, 1}, {NULL, false, 0}};
static int on_cp_opt(int id, const char *value, void *ctx) {
  *(bool *)ctx = true;
  return 0;
}

int cmd_cp(int argc, char **argv) {
  struct cli_args a;
  bool recursive = false;
  int r = cli_parse(argc, argv, cp_opts, 2, false, on_cp_opt, &recursive, &a);
  _cleanup_free_ char **pos = a.pos;
  free(a.rest);
  if (r == 1) {
    printf("usage: %s", cp_usage);
    return 0;
  }
  if (r < 0 || a.npos != 2)
    return cli_usage_error(cp_usage, "%s", r < 0 ? "" : "cp takes SRC and DST");
  _cleanup_free_ char *sid = NULL, *did = NULL;
  const char *spath = NULL, *dpath = NULL;
  bool src_remote = split_remote(pos[0], &sid, &spath);
  bool dst_remote = split_remote(pos[1], &did, &dpath);
  if (src_remote == dst_remote)
    return cli_usage_error(cp_usage, "exactly one of SRC and DST must be ID:PATH");
  if (dst_remote && recursive)
    return dpath[0] ? cli_cp_tree_up(pos[0], did, dpath)
                    : cli_usage_error(cp_usage, "DST needs a path after '%s:'", did);
  if (dst_remote)
    return upload(pos[0], did, dpath);
  if (!spath[0])
    return cli_usage_error(cp_usage, "SRC needs a path after '%s:'", sid);
  return recursive ? cli_cp_tree_down(sid, spath, pos[1]) : download(sid, spath, pos[1]);
}

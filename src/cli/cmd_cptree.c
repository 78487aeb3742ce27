/* cmd_cptree.c -- moat cp -r: a directory into or out of a sandbox as one tar stream.
 *
 * Up: the CLI walks the local tree (links stored as links, never followed; owners left out) into a
 * tar, starts `tar -x` inside the sandbox (background exec) and feeds it the tar through the
 * process's stdin; the sandbox extracts it, so the host never touches a sandbox path.
 * Down: `tar -c` runs inside the sandbox (exec/stream) and the CLI extracts what it sends into a new
 * local directory. That tar is the sandbox's, so hostile: an entry that is absolute, has a ".."
 * component, is a hard link or a device/fifo, or would be written through a symbolic link is refused
 * (exit 1, naming it); what was extracted before it stays. */
#include <archive.h>
#include <archive_entry.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../common/util.h"
#include "cli.h"

#define STDIN_CHUNK (192 * 1024) /* raw bytes per POST .../stdin (base64 makes it 256 KiB) */

/* ---- the events of a process: stdout into a file (or dropped), stderr relayed, the exit code ---- */
struct proc_out {
  FILE *out; /* NULL: stdout is dropped */
  int code;
  bool failed;
};

static int write_data(json_t *data, FILE *f) {
  json_t *dj = json_object_get(data, "data");
  const char *d = json_string_value(dj);
  if (!d)
    return -1;
  const char *enc = json_string_value(json_object_get(data, "encoding"));
  if (enc && strcmp(enc, "base64") == 0) {
    unsigned char *raw;
    size_t len;
    if (moat_base64_decode(d, json_string_length(dj), &raw, &len) < 0)
      return -1;
    size_t w = fwrite(raw, 1, len, f);
    free(raw);
    return w == len ? 0 : -1;
  }
  return fwrite(d, 1, json_string_length(dj), f) == json_string_length(dj) ? 0 : -1;
}

static int on_proc_event(const char *event, const char *raw, size_t len, void *ctx) {
  struct proc_out *p = ctx;
  json_error_t jerr;
  _cleanup_json_ json_t *j = json_loadb(raw, len, JSON_ALLOW_NUL, &jerr); /* utf8 output may hold NULs */
  if (strcmp(event, "stdout") == 0) {
    if (p->out && write_data(j, p->out) < 0) {
      cli_errorf("cannot write the sandbox's tar locally (or its data is not base64)");
      p->failed = true;
      return -1;
    }
    return 0;
  }
  if (strcmp(event, "stderr") == 0) {
    write_data(j, stderr);
    return 0;
  }
  if (strcmp(event, "exit") == 0) {
    json_t *ec = json_object_get(j, "exit_code");
    p->code = json_is_integer(ec) ? (int)json_integer_value(ec) : -1;
    return 1;
  }
  if (strcmp(event, "dropped") == 0) {
    cli_errorf("output of the sandbox's tar was dropped");
    p->failed = true;
    return -1;
  }
  if (strcmp(event, "error") == 0) {
    const char *m = json_string_value(json_object_get(j, "message"));
    cli_errorf("%s", m ? m : "stream error");
    p->failed = true;
    return -1;
  }
  return 0;
}

/* ---- up ---- */

/* Writes the tree at dir as a pax tar into out, paths relative to dir ("." for dir itself). */
static int tar_tree(const char *dir, FILE *out, unsigned long long *files) {
  struct archive *disk = archive_read_disk_new();
  struct archive *w = archive_write_new();
  struct archive_entry *e = NULL;
  int ret = -1;
  size_t dl = strlen(dir);
  char buf[65536];
  archive_read_disk_set_symlink_physical(disk);
  archive_write_set_format_pax_restricted(w);
  if (archive_read_disk_open(disk, dir) != ARCHIVE_OK || archive_write_open_FILE(w, out) != ARCHIVE_OK) {
    cli_errorf("%s: %s", dir,
               archive_error_string(disk) ? archive_error_string(disk) : archive_error_string(w));
    goto out;
  }
  for (;;) {
    archive_entry_free(e);
    e = archive_entry_new();
    int r = archive_read_next_header2(disk, e);
    if (r == ARCHIVE_EOF)
      break;
    if (r != ARCHIVE_OK && r != ARCHIVE_WARN) {
      cli_errorf("%s: %s", dir, archive_error_string(disk));
      goto out;
    }
    archive_read_disk_descend(disk);
    const char *p = archive_entry_pathname(e);
    if (!p || strncmp(p, dir, dl) != 0) {
      cli_errorf("%s: an entry outside the tree (%s)", dir, p ? p : "?");
      goto out;
    }
    const char *rel = p + dl;
    while (*rel == '/')
      rel++;
    _cleanup_free_ char *name = xasprintf("./%s", rel);
    mode_t type = archive_entry_filetype(e);
    if (type != AE_IFREG && type != AE_IFDIR && type != AE_IFLNK) {
      fprintf(stderr, "moat: skipping %s (not a file, directory or link)\n", p);
      continue;
    }
    archive_entry_set_pathname(e, name);
    archive_entry_set_uid(e, 0);
    archive_entry_set_gid(e, 0);
    archive_entry_set_uname(e, NULL);
    archive_entry_set_gname(e, NULL);
    archive_entry_set_perm(e, archive_entry_perm(e) & 0777);
    if (archive_write_header(w, e) != ARCHIVE_OK) {
      cli_errorf("%s: %s", p, archive_error_string(w));
      goto out;
    }
    if (type != AE_IFREG)
      continue;
    (*files)++;
    la_ssize_t n;
    while ((n = archive_read_data(disk, buf, sizeof(buf))) > 0)
      if (archive_write_data(w, buf, (size_t)n) != n) {
        cli_errorf("%s: %s", p, archive_error_string(w));
        goto out;
      }
    if (n < 0) {
      cli_errorf("%s: %s", p, archive_error_string(disk));
      goto out;
    }
  }
  if (archive_write_close(w) != ARCHIVE_OK) {
    cli_errorf("writing the tar: %s", archive_error_string(w));
    goto out;
  }
  ret = 0;
out:
  archive_entry_free(e);
  archive_write_free(w);
  archive_read_free(disk);
  return ret;
}

int cli_cp_tree_up(const char *local, const char *id, const char *rdir) {
  struct stat st;
  if (stat(local, &st) < 0) {
    cli_errorf("%s: %s", local, strerror(errno));
    return EXIT_API;
  }
  if (!S_ISDIR(st.st_mode)) {
    cli_errorf("%s: not a directory (cp without -r copies a file)", local);
    return EXIT_API;
  }
  FILE *tmp = tmpfile();
  if (!tmp) {
    cli_errorf("tmpfile: %s", strerror(errno));
    return EXIT_API;
  }
  unsigned long long files = 0;
  if (tar_tree(local, tmp, &files) < 0 || fflush(tmp) != 0 || fseek(tmp, 0, SEEK_SET) != 0) {
    fclose(tmp);
    return EXIT_API;
  }
  _cleanup_free_ char *eid = cli_escape(id);
  _cleanup_free_ char *exec_path = xasprintf("/v1/sandboxes/%s/exec", eid);
  _cleanup_json_ json_t *body = json_pack("{s:[s,s,s,s,s], s:b}", "argv", "sh", "-c",
                                          "mkdir -p -- \"$1\" && exec tar -x -f - -C \"$1\" --no-same-owner",
                                          "sh", rdir, "background", 1);
  struct cli_resp resp;
  if (cli_request("POST", exec_path, body, &resp) < 0) {
    fclose(tmp);
    return EXIT_API;
  }
  json_int_t pid = json_integer_value(json_object_get(resp.json, "pid"));
  json_decref(resp.json);
  _cleanup_free_ char *stdin_path = xasprintf("/v1/sandboxes/%s/processes/%lld/stdin", eid, (long long)pid);
  static unsigned char chunk[STDIN_CHUNK];
  int ret = 0;
  for (;;) {
    size_t n = fread(chunk, 1, sizeof(chunk), tmp);
    bool last = n < sizeof(chunk);
    _cleanup_json_ json_t *sb = json_object();
    if (n) {
      char *b64 = moat_base64_encode(chunk, n, NULL);
      json_object_set_new(sb, "data_b64", json_string(b64));
      free(b64);
    }
    if (last)
      json_object_set_new(sb, "close", json_true());
    if (cli_request("POST", stdin_path, sb, &resp) < 0) {
      ret = EXIT_API; /* tar ended early: its stderr below says why */
      break;
    }
    json_decref(resp.json);
    if (last)
      break;
  }
  fclose(tmp);
  _cleanup_free_ char *stream_path =
      xasprintf("/v1/sandboxes/%s/processes/%lld/stream?replay=true", eid, (long long)pid);
  struct proc_out p = {.code = -1};
  if (cli_sse("GET", stream_path, NULL, on_proc_event, &p) != 0 || p.failed)
    return EXIT_API;
  if (p.code != 0) {
    cli_errorf("tar in the sandbox exited %d", p.code);
    return EXIT_API;
  }
  if (ret == 0)
    fprintf(stderr, "moat: %llu files copied to %s:%s\n", files, id, rdir);
  return ret;
}

/* ---- down ---- */

/* NULL when the sandbox's entry may be extracted, else why not. */
static const char *refuse(struct archive_entry *e) {
  const char *p = archive_entry_pathname(e);
  if (!p || !*p)
    return "no name";
  if (p[0] == '/')
    return "an absolute path";
  for (const char *s = p; *s;) {
    const char *end = strchr(s, '/');
    size_t l = end ? (size_t)(end - s) : strlen(s);
    if (l == 2 && s[0] == '.' && s[1] == '.')
      return "a '..' component";
    s += l;
    while (*s == '/')
      s++;
  }
  if (archive_entry_hardlink(e))
    return "a hard link";
  mode_t t = archive_entry_filetype(e);
  if (t != AE_IFREG && t != AE_IFDIR && t != AE_IFLNK)
    return "not a file, directory or symbolic link";
  return NULL;
}

static int extract(FILE *in, unsigned long long *files) {
  struct archive *a = archive_read_new();
  struct archive *d = archive_write_disk_new();
  int ret = -1;
  archive_read_support_format_tar(a);
  archive_write_disk_set_options(d, ARCHIVE_EXTRACT_TIME | ARCHIVE_EXTRACT_PERM |
                                        ARCHIVE_EXTRACT_SECURE_NODOTDOT |
                                        ARCHIVE_EXTRACT_SECURE_NOABSOLUTEPATHS |
                                        ARCHIVE_EXTRACT_SECURE_SYMLINKS | ARCHIVE_EXTRACT_NO_OVERWRITE);
  if (archive_read_open_FILE(a, in) != ARCHIVE_OK) {
    cli_errorf("the sandbox's tar: %s", archive_error_string(a));
    goto out;
  }
  struct archive_entry *e;
  for (;;) {
    int r = archive_read_next_header(a, &e);
    if (r == ARCHIVE_EOF)
      break;
    if (r != ARCHIVE_OK) {
      cli_errorf("the sandbox's tar: %s", archive_error_string(a));
      goto out;
    }
    const char *why = refuse(e);
    if (why) {
      cli_errorf("refusing the sandbox's tar entry '%s': %s", archive_entry_pathname(e), why);
      goto out;
    }
    const char *p = archive_entry_pathname(e);
    if (strcmp(p, ".") == 0 || strcmp(p, "./") == 0)
      continue; /* the directory itself: made already */
    archive_entry_set_perm(e, archive_entry_perm(e) & 0777);
    if (archive_write_header(d, e) != ARCHIVE_OK) {
      cli_errorf("refusing the sandbox's tar entry '%s': %s", p, archive_error_string(d));
      goto out;
    }
    if (archive_entry_filetype(e) == AE_IFREG) {
      (*files)++;
      const void *buf;
      size_t size;
      la_int64_t off;
      while ((r = archive_read_data_block(a, &buf, &size, &off)) == ARCHIVE_OK)
        if (archive_write_data_block(d, buf, size, off) != ARCHIVE_OK) {
          cli_errorf("%s: %s", p, archive_error_string(d));
          goto out;
        }
      if (r != ARCHIVE_EOF) {
        cli_errorf("the sandbox's tar: %s", archive_error_string(a));
        goto out;
      }
    }
    if (archive_write_finish_entry(d) != ARCHIVE_OK) {
      cli_errorf("%s: %s", p, archive_error_string(d));
      goto out;
    }
  }
  ret = 0;
out:
  archive_write_close(d);
  archive_write_free(d);
  archive_read_free(a);
  return ret;
}

int cli_cp_tree_down(const char *id, const char *rdir, const char *local) {
  if (mkdir(local, 0755) < 0) {
    cli_errorf("%s: %s (cp -r makes a new directory)", local, strerror(errno));
    return EXIT_API;
  }
  FILE *tmp = tmpfile();
  if (!tmp) {
    cli_errorf("tmpfile: %s", strerror(errno));
    return EXIT_API;
  }
  _cleanup_free_ char *eid = cli_escape(id);
  _cleanup_free_ char *path = xasprintf("/v1/sandboxes/%s/exec/stream", eid);
  _cleanup_json_ json_t *body = json_pack("{s:[s,s,s,s,s,s], s:b}", "argv", "tar", "-c", "-f", "-", "-C",
                                          rdir, "kill_on_disconnect", 1);
  json_array_append_new(json_object_get(body, "argv"), json_string("."));
  struct proc_out p = {.out = tmp, .code = -1};
  cli_trap_signals();
  int s = cli_sse("POST", path, body, on_proc_event, &p);
  if (s != 0 || p.failed || p.code != 0) {
    if (s == 0 && !p.failed)
      cli_errorf("tar in the sandbox exited %d", p.code);
    fclose(tmp);
    return cli_interrupted ? 128 + cli_interrupted : EXIT_API;
  }
  if (fflush(tmp) != 0 || fseek(tmp, 0, SEEK_SET) != 0) {
    cli_errorf("tmpfile: %s", strerror(errno));
    fclose(tmp);
    return EXIT_API;
  }
  int cwd = open(".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (cwd < 0 || chdir(local) < 0) {
    cli_errorf("%s: %s", local, strerror(errno));
    if (cwd >= 0)
      close(cwd);
    fclose(tmp);
    return EXIT_API;
  }
  unsigned long long files = 0;
  int r = extract(tmp, &files);
  fclose(tmp);
  if (fchdir(cwd) < 0)
    r = -1;
  close(cwd);
  if (r < 0)
    return EXIT_API;
  fprintf(stderr, "moat: %llu files copied to %s\n", files, local);
  return 0;
}

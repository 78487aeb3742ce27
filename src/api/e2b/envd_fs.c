/* envd_fs.c -- envd's filesystem.Filesystem on moat's guest file operations
 *
 * Stat, MakeDir (parents made; an existing directory is already_exists, which the SDK's makeDir
 * turns into false), Move, ListDir (depth), Remove (recursive; a missing path is not an error, as
 * envd's os.RemoveAll), WatchDir (a server stream over the guest's inotify watch) and the polling
 * watchers CreateWatcher / GetWatcherEvents / RemoveWatcher. Entries are E2B's EntryInfo: type
 * FILE_TYPE_*, size as an int64 string, mode (permission bits), permissions as Go's
 * os.FileMode.String(), owner and group names from the sandbox's own /etc/passwd and /etc/group,
 * modifiedTime RFC 3339, symlinkTarget for symlinks.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../common/log.h"
#include "envd.h"

/* A required path field: non-empty, <= API_MAX_PATH. */
static int json_path(json_t *msg, const char *field, const char **out, moat_error **err) {
  if (envd_json_str(msg, field, out, err) < 0)
    return -1;
  if (!*out)
    return moat_error_set(err, EINVAL, "field '%s' is required", field);
  return api_check_path(field, *out, strlen(*out), err);
}
/* ---- entries: E2B's EntryInfo ---- */

/* uid/gid -> name, read from the sandbox's /etc/passwd and /etc/group when first needed. */
struct names {
  struct envd_fs_state *fs;
  const struct moat_guest_ep *sock;
  const char *user;
  bool loaded[2];
  char *text[2]; /* passwd, group */
};

static void names_clear(struct names *n) {
  free(n->text[0]);
  free(n->text[1]);
}

static char *read_small(const struct moat_guest_ep *sock, const char *path, const char *user) {
  struct moat_guest_reader *rd = NULL;
  uint64_t size = 0;
  moat_error *err = NULL;
  if (moat_guest_read_open(sock, path, user, &rd, &size, &err) < 0 || size > (1u << 20)) {
    moat_error_free(&err);
    moat_guest_reader_close(rd);
    return NULL;
  }
  char *buf = xmalloc(size + 1);
  size_t got = 0;
  while (got < size) {
    ssize_t n = moat_guest_read_chunk(rd, buf + got, size - got, &err);
    if (n <= 0)
      break;
    got += (size_t)n;
  }
  moat_error_free(&err);
  moat_guest_reader_close(rd);
  buf[got] = '\0';
  return buf;
}

/* The last NAMES_CACHE sandboxes' /etc/passwd and /etc/group, for NAMES_TTL_MS: a listing of a
 * user's files costs no extra guest round trips (a user added in the sandbox shows as its number
 * for at most that long). */
#define NAMES_CACHE 32
#define NAMES_TTL_MS 5000
struct names_entry {
  struct moat_guest_ep *sock;
  char *text;
  uint64_t at_ns;
};

#define WATCHERS_MAX 1024
struct watcher;

/* What the filesystem service keeps between requests (the E2B front end's state owns it). Locks:
 * names_lock and watchers_lock are never held together, nor across a guest call but a watcher's
 * hang-up poll. */
struct envd_fs_state {
  pthread_mutex_t names_lock;
  struct names_entry names[2][NAMES_CACHE]; /* passwd, group; names_lock */
  pthread_mutex_t watchers_lock;
  struct watcher *watchers[WATCHERS_MAX]; /* watchers_lock */
};

static char *names_text(struct envd_fs_state *fs, const struct moat_guest_ep *sock, int which) {
  struct names_entry *cache = fs->names[which];
  uint64_t now = now_ns();
  size_t oldest = 0;
  pthread_mutex_lock(&fs->names_lock);
  for (size_t i = 0; i < NAMES_CACHE; i++) {
    if (cache[i].sock && moat_guest_ep_same(cache[i].sock, sock) &&
        now - cache[i].at_ns < NAMES_TTL_MS * 1000000ULL) {
      char *t = cache[i].text ? xstrdup(cache[i].text) : NULL;
      pthread_mutex_unlock(&fs->names_lock);
      return t;
    }
    if (cache[i].at_ns < cache[oldest].at_ns)
      oldest = i;
  }
  pthread_mutex_unlock(&fs->names_lock);
  char *t = read_small(sock, which == 0 ? "/etc/passwd" : "/etc/group", "root");
  pthread_mutex_lock(&fs->names_lock);
  free(cache[oldest].sock);
  free(cache[oldest].text);
  cache[oldest].sock = xmemdup(sock, sizeof(*sock));
  cache[oldest].text = t ? xstrdup(t) : NULL;
  cache[oldest].at_ns = now;
  pthread_mutex_unlock(&fs->names_lock);
  return t;
}

bool envd_user_known(struct envd_fs_state *fs, const struct moat_guest_ep *sock, const char *user) {
  if (strcmp(user, "root") == 0)
    return true;
  _cleanup_free_ char *pw = names_text(fs, sock, 0);
  if (!pw)
    return true;
  size_t ul = strlen(user);
  for (const char *l = pw; l && *l;) {
    if (strncmp(l, user, ul) == 0 && l[ul] == ':')
      return true;
    l = strchr(l, '\n');
    l = l ? l + 1 : NULL;
  }
  return false;
}

static json_t *name_of(struct names *n, int which, uint32_t id) {
  if (id == 0)
    return json_string("root");
  if (!n->loaded[which]) {
    n->loaded[which] = true;
    n->text[which] = names_text(n->fs, n->sock, which);
  }
  for (const char *l = n->text[which]; l && *l;) {
    const char *end = strchr(l, '\n');
    size_t len = end ? (size_t)(end - l) : strlen(l);
    /* name:x:ID:... */
    const char *c1 = memchr(l, ':', len);
    const char *c2 = c1 ? memchr(c1 + 1, ':', len - (size_t)(c1 + 1 - l)) : NULL;
    if (c2) {
      char idbuf[16];
      const char *c3 = memchr(c2 + 1, ':', len - (size_t)(c2 + 1 - l));
      size_t il = c3 ? (size_t)(c3 - c2 - 1) : 0;
      uint64_t v;
      if (il > 0 && il < sizeof(idbuf)) {
        memcpy(idbuf, c2 + 1, il);
        idbuf[il] = '\0';
        if (parse_u64(idbuf, &v) == 0 && v == id)
          return json_stringn(l, (size_t)(c1 - l));
      }
    }
    l = end ? end + 1 : NULL;
  }
  char buf[16];
  snprintf(buf, sizeof(buf), "%u", id);
  return json_string(buf);
}

/* Go's os.FileMode.String(): the type letter, then rwxrwxrwx. */
static void perm_string(char type, uint32_t mode, char out[11]) {
  out[0] = type == 'd' ? 'd' : type == 'l' ? 'L' : '-';
  static const char rwx[] = "rwxrwxrwx";
  for (int i = 0; i < 9; i++)
    out[1 + i] = (mode & (1u << (8 - i))) ? rwx[i] : '-';
  out[10] = '\0';
}

static const char *file_type(char t) {
  switch (t) {
  case 'f':
    return "FILE_TYPE_FILE";
  case 'd':
    return "FILE_TYPE_DIRECTORY";
  case 'l':
    return "FILE_TYPE_SYMLINK";
  default:
    return "FILE_TYPE_UNSPECIFIED";
  }
}

/* A symlink's target as E2B's envd reports it: absolute, a relative target taken from the link's
 * directory, "." and ".." segments resolved lexically (caller frees). */
static char *abs_link_target(const char *link_path, const char *target) {
  struct moat_buf b = {0};
  if (target[0] != '/') {
    const char *slash = strrchr(link_path, '/');
    if (slash)
      moat_buf_append(&b, link_path, (size_t)(slash - link_path));
  }
  moat_buf_append(&b, "/", 1);
  moat_buf_append(&b, target, strlen(target));
  moat_buf_append(&b, "", 1);
  /* clean in place: segments kept in out, ".." drops the last one */
  char *out = xmalloc(b.len + 1);
  size_t o = 0;
  for (const char *p = b.p; *p;) {
    while (*p == '/')
      p++;
    const char *q = p;
    while (*q && *q != '/')
      q++;
    size_t l = (size_t)(q - p);
    if (l == 0 || (l == 1 && p[0] == '.')) {
    } else if (l == 2 && p[0] == '.' && p[1] == '.') {
      while (o > 0 && out[o - 1] != '/')
        o--;
      if (o > 0)
        o--;
    } else {
      out[o++] = '/';
      memcpy(out + o, p, l);
      o += l;
    }
    p = q;
  }
  if (o == 0)
    out[o++] = '/';
  out[o] = '\0';
  free(b.p);
  return out;
}

static json_t *entry_json(struct names *n, const struct moat_file_entry *e) {
  char perms[11], size[24], t[32];
  perm_string(e->type, e->mode, perms);
  snprintf(size, sizeof(size), "%llu", (unsigned long long)e->size);
  json_t *j = json_pack("{s:o, s:s, s:o, s:s, s:i, s:s, s:o, s:o, s:s}", "name", api_str_json(e->name),
                        "type", file_type(e->type), "path", api_str_json(e->path), "size", size, "mode",
                        (int)(e->mode & 0777), "permissions", perms, "owner", name_of(n, 0, e->uid), "group",
                        name_of(n, 1, e->gid), "modifiedTime", api_rfc3339_ms(e->mtime_ms, t, sizeof(t)));
  if (e->link_target) {
    char *abs = abs_link_target(e->path ? e->path : "/", e->link_target);
    json_object_set_new(j, "symlinkTarget", api_str_json(abs));
    free(abs);
  }
  return j;
}

/* {"entry": EntryInfo of path} */
static int reply_entry(struct api_req *r, const struct moat_guest_ep *sock, const char *path,
                       const char *user) {
  moat_error *err = NULL;
  struct moat_file_entry e;
  memset(&e, 0, sizeof(e));
  if (moat_guest_stat(sock, path, user, &e, &err) < 0)
    return cx_reply_moat_error(r, &err);
  if (e.type == 'l' && e.link_target) {
    /* E2B's getInfo of a symlink gives the type of what it points to (symlinkTarget says it is
     * a link); a dangling link stays a symlink */
    _cleanup_free_ char *abs = abs_link_target(e.path ? e.path : path, e.link_target);
    struct moat_file_entry t;
    memset(&t, 0, sizeof(t));
    moat_error *terr = NULL;
    if (moat_guest_stat(sock, abs, user, &t, &terr) == 0 && t.type != 'l')
      e.type = t.type;
    moat_error_free(&terr);
    moat_file_entry_clear(&t);
  }
  struct names n = {.fs = e2b_state(r)->fs, .sock = sock, .user = user};
  int ret = cx_reply(r, json_pack("{s:o}", "entry", entry_json(&n, &e)));
  names_clear(&n);
  moat_file_entry_clear(&e);
  return ret;
}

/* ---- filesystem.Filesystem: unary ---- */

static int fs_stat(struct api_req *r, struct envd_req *q, const struct moat_guest_ep *sock, json_t *body) {
  moat_error *err = NULL;
  const char *path;
  if (json_path(body, "path", &path, &err) < 0)
    return cx_reply_moat_error(r, &err);
  return reply_entry(r, sock, path, q->user);
}

static int fs_make_dir(struct api_req *r, struct envd_req *q, const struct moat_guest_ep *sock,
                       json_t *body) {
  moat_error *err = NULL;
  const char *path;
  if (json_path(body, "path", &path, &err) < 0)
    return cx_reply_moat_error(r, &err);
  /* envd: an existing directory is already_exists (the SDK's makeDir returns false), an existing
   * file invalid_argument; otherwise the directory and its parents are made. */
  struct moat_file_entry e;
  memset(&e, 0, sizeof(e));
  if (moat_guest_stat(sock, path, q->user, &e, &err) == 0) {
    char type = e.type;
    moat_file_entry_clear(&e);
    if (type == 'd')
      return cx_reply_error(r, "already_exists", "directory %.1024s already exists", path);
    return cx_reply_error(r, "invalid_argument", "path %.1024s already exists and is not a directory", path);
  }
  if (err->status != ENOENT)
    return cx_reply_moat_error(r, &err);
  moat_error_free(&err);
  if (moat_guest_mkdir(sock, path, q->user, true, &err) < 0)
    return cx_reply_moat_error(r, &err);
  return reply_entry(r, sock, path, q->user);
}

static int fs_move(struct api_req *r, struct envd_req *q, const struct moat_guest_ep *sock, json_t *body) {
  moat_error *err = NULL;
  const char *src, *dst;
  if (json_path(body, "source", &src, &err) < 0 || json_path(body, "destination", &dst, &err) < 0)
    return cx_reply_moat_error(r, &err);
  if (moat_guest_move(sock, src, dst, q->user, &err) < 0)
    return cx_reply_moat_error(r, &err);
  return reply_entry(r, sock, dst, q->user);
}

static int fs_list_dir(struct api_req *r, struct envd_req *q, const struct moat_guest_ep *sock,
                       json_t *body) {
  moat_error *err = NULL;
  const char *path;
  uint64_t depth;
  if (json_path(body, "path", &path, &err) < 0 ||
      envd_json_uint(body, "depth", UINT32_MAX, 1, &depth, &err) < 0)
    return cx_reply_moat_error(r, &err);
  if (depth == 0)
    depth = 1; /* proto3 omits 0; envd treats it as 1 */
  if (depth > API_MAX_DEPTH)
    return cx_reply_error(r, "invalid_argument", "depth must be at most %d", API_MAX_DEPTH);
  struct moat_file_entry *v = NULL; /* a file is ENOTDIR: invalid_argument */
  size_t n = 0;
  if (moat_guest_list(sock, path, q->user, (uint32_t)depth, &v, &n, &err) < 0)
    return cx_reply_moat_error(r, &err);
  struct names nm = {.fs = e2b_state(r)->fs, .sock = sock, .user = q->user};
  json_t *arr = json_array();
  for (size_t i = 0; i < n; i++)
    json_array_append_new(arr, entry_json(&nm, &v[i]));
  names_clear(&nm);
  moat_file_entries_free(v, n);
  return cx_reply(r, json_pack("{s:o}", "entries", arr));
}

static int fs_remove(struct api_req *r, struct envd_req *q, const struct moat_guest_ep *sock, json_t *body) {
  moat_error *err = NULL;
  const char *path;
  if (json_path(body, "path", &path, &err) < 0)
    return cx_reply_moat_error(r, &err);
  /* envd removes recursively (os.RemoveAll): a missing path is not an error. */
  if (moat_guest_remove(sock, path, q->user, true, &err) < 0) {
    if (err->status != ENOENT)
      return cx_reply_moat_error(r, &err);
    moat_error_free(&err);
  }
  return cx_reply(r, json_object());
}

/* ---- filesystem events: WatchDir (stream) and the polling watchers ---- */

static const char *event_type(const char *ev) {
  if (strcmp(ev, "create") == 0)
    return "EVENT_TYPE_CREATE";
  if (strcmp(ev, "write") == 0)
    return "EVENT_TYPE_WRITE";
  if (strcmp(ev, "remove") == 0)
    return "EVENT_TYPE_REMOVE";
  if (strcmp(ev, "rename") == 0)
    return "EVENT_TYPE_RENAME";
  return NULL;
}

/* What a watch needs to turn guest events into E2B FilesystemEvents. */
struct watch_src {
  struct envd_fs_state *fs; /* borrowed: the front end's state outlives every stream */
  struct moat_watch *w;
  struct moat_guest_ep *sock;
  char *root; /* absolute path watched, for names relative to it */
  char *user;
  bool include_entry;
};

static void watch_src_free(struct watch_src *ws) {
  if (!ws)
    return;
  if (ws->w)
    moat_watch_close(ws->w);
  free(ws->sock);
  free(ws->root);
  free(ws->user);
  free(ws);
}

/* The name of path relative to the watched root, as envd reports it. */
static const char *rel_name(const struct watch_src *ws, const char *path) {
  size_t n = strlen(ws->root);
  if (strncmp(path, ws->root, n) == 0 && path[n] == '/')
    return path + n + 1;
  if (strcmp(ws->root, "/") == 0 && path[0] == '/')
    return path + 1;
  return path;
}

static json_t *fs_event(const struct watch_src *ws, const char *type, const char *path) {
  json_t *j = json_pack("{s:o, s:s}", "name", api_str_json(rel_name(ws, path)), "type", type);
  if (ws->include_entry && strcmp(type, "EVENT_TYPE_REMOVE") != 0 && strcmp(type, "EVENT_TYPE_RENAME") != 0) {
    struct moat_file_entry e;
    memset(&e, 0, sizeof(e));
    moat_error *err = NULL;
    if (moat_guest_stat(ws->sock, path, ws->user, &e, &err) == 0) {
      struct names nm = {.fs = ws->fs, .sock = ws->sock, .user = ws->user};
      json_object_set_new(j, "entry", entry_json(&nm, &e));
      names_clear(&nm);
      moat_file_entry_clear(&e);
    }
    moat_error_free(&err);
  }
  return j;
}

/* True for the temporary file the guest writes an upload into (".moat-upload-*" beside the
 * target), renamed over the target when complete. */
static bool upload_temp(const char *path) {
  const char *b = strrchr(path, '/');
  return strncmp(b ? b + 1 : path, ".moat-upload-", 13) == 0;
}

/* Appends the FilesystemEvents of one guest event to arr: a rename is envd's (fsnotify's)
 * RENAME of the old name plus CREATE of the new one. An upload's temporary file stays invisible:
 * its rename onto the target reads as envd's direct write (open O_CREAT, chown to the user,
 * write), CREATE, CHMOD and WRITE of the target. */
static void fs_events(const struct watch_src *ws, const struct moat_watch_event *ev, json_t *arr) {
  const char *type = event_type(ev->event);
  if (!type) {
    log_warn("e2b watch %s: %s event (events were lost)", ws->root, ev->event);
    return;
  }
  bool rename = strcmp(ev->event, "rename") == 0;
  if (upload_temp(ev->path)) {
    if (rename && ev->path2 && !upload_temp(ev->path2)) {
      json_array_append_new(arr, fs_event(ws, "EVENT_TYPE_CREATE", ev->path2));
      json_array_append_new(arr, fs_event(ws, "EVENT_TYPE_CHMOD", ev->path2));
      json_array_append_new(arr, fs_event(ws, "EVENT_TYPE_WRITE", ev->path2));
    }
    return;
  }
  json_array_append_new(arr, fs_event(ws, type, ev->path));
  if (rename && ev->path2)
    json_array_append_new(arr, fs_event(ws, "EVENT_TYPE_CREATE", ev->path2));
}

/* Opens a watch on the request's path (must be a directory). 0, or -1 with *err. */
static int watch_open(struct envd_fs_state *fs, struct envd_req *q, const struct moat_guest_ep *sock,
                      json_t *body, struct watch_src **out, moat_error **err) {
  const char *path;
  json_t *rec = json_object_get(body, "recursive"), *inc = json_object_get(body, "includeEntry");
  if (json_path(body, "path", &path, err) < 0)
    return -1;
  if ((rec && !json_is_boolean(rec)) || (inc && !json_is_boolean(inc)))
    return moat_error_set(err, EINVAL, "fields 'recursive' and 'includeEntry' must be booleans");
  struct moat_file_entry st;
  memset(&st, 0, sizeof(st));
  if (moat_guest_stat(sock, path, q->user, &st, err) < 0)
    return -1;
  if (st.type != 'd') {
    moat_file_entry_clear(&st);
    return moat_error_set(err, EINVAL, "path %.1024s is not a directory", path);
  }
  struct watch_src *ws = xcalloc(1, sizeof(*ws));
  ws->root = st.path ? xstrdup(st.path) : xstrdup(path);
  moat_file_entry_clear(&st);
  ws->fs = fs;
  ws->sock = xmemdup(sock, sizeof(*sock));
  ws->user = xstrdup(q->user);
  ws->include_entry = json_is_true(inc);
  if (moat_guest_watch(sock, path, q->user, json_is_true(rec), &ws->w, err) < 0) {
    ws->w = NULL;
    watch_src_free(ws);
    return -1;
  }
  *out = ws;
  return 0;
}

static void watch_pull(struct cx_stream *s, int timeout_ms) {
  struct watch_src *ws = s->ctx;
  moat_error *err = NULL;
  struct moat_watch_event ev;
  int rc = moat_watch_next(ws->w, &ev, timeout_ms, &err);
  if (rc < 0 && err && err->status == ETIMEDOUT) {
    moat_error_free(&err);
    return;
  }
  if (rc < 0)
    return cx_end_moat_error(s, &err);
  if (rc == 0)
    return cx_end(s, "unavailable", "the watch ended (the sandbox went away)");
  json_t *arr = json_array();
  fs_events(ws, &ev, arr);
  size_t i;
  json_t *v;
  json_array_foreach(arr, i, v) cx_send(s, json_pack("{s:O}", "filesystem", v));
  json_decref(arr);
}

static void watch_ctx_free(void *p) { watch_src_free(p); }

static int fs_watch_dir(struct api_req *r, struct envd_req *q, const struct moat_guest_ep *sock,
                        json_t *body) {
  moat_error *err = NULL;
  struct watch_src *ws = NULL;
  if (watch_open(e2b_state(r)->fs, q, sock, body, &ws, &err) < 0) {
    const char *code = cx_errno_code(err ? err->status : 0);
    int ret = cx_stream_error(r, code, "%s", moat_error_msg(err));
    moat_error_free(&err);
    return ret;
  }
  struct cx_stream *s = cx_stream_new(r, json_pack("{s:{}}", "keepalive"));
  s->pull = watch_pull;
  s->ctx = ws;
  s->ctx_free = watch_ctx_free;
  cx_send(s, json_pack("{s:{}}", "start"));
  return cx_stream_reply(r, s);
}

/* Polling watchers (CreateWatcher / GetWatcherEvents / RemoveWatcher): kept in moatd, at most
 * WATCHERS_PER_SANDBOX per sandbox and WATCHERS_MAX in all. Each holds its guest watch
 * connection; events wait in that connection until polled. A watcher not polled for
 * WATCHER_IDLE_S, or whose sandbox went away (its connection hung up), is freed by the next
 * watcher call (CreateWatcher, GetWatcherEvents or RemoveWatcher of any sandbox). */
#define WATCHERS_PER_SANDBOX 64
#define WATCHER_IDLE_S 600
#define WATCHER_MAX_EVENTS 4096 /* per GetWatcherEvents */

struct watcher {
  char id[40];
  char sandbox[MOAT_ID_LEN + 1];
  struct watch_src *ws;
  uint64_t last_ns;
  bool busy; /* a GetWatcherEvents is draining it */
};

static bool watch_hung_up(struct watch_src *ws) {
  struct pollfd p = {.fd = moat_watch_fd(ws->w), .events = POLLRDHUP};
  return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

/* Frees idle and dead watchers. Caller holds watchers_lock. */
static void watchers_sweep(struct envd_fs_state *fs) {
  uint64_t now = now_ns();
  for (size_t i = 0; i < WATCHERS_MAX; i++) {
    struct watcher *w = fs->watchers[i];
    if (!w || w->busy)
      continue;
    if (now - w->last_ns > WATCHER_IDLE_S * 1000000000ULL || watch_hung_up(w->ws)) {
      watch_src_free(w->ws);
      free(w);
      fs->watchers[i] = NULL;
    }
  }
}

static int fs_create_watcher(struct api_req *r, struct envd_req *q, const struct moat_guest_ep *sock,
                             json_t *body) {
  struct envd_fs_state *fs = e2b_state(r)->fs;
  moat_error *err = NULL;
  struct watch_src *ws = NULL;
  if (watch_open(e2b_state(r)->fs, q, sock, body, &ws, &err) < 0)
    return cx_reply_moat_error(r, &err);
  struct watcher *w = xcalloc(1, sizeof(*w));
  unsigned char rnd[16];
  random_bytes(rnd, sizeof(rnd));
  for (size_t i = 0; i < sizeof(rnd); i++)
    snprintf(w->id + 2 * i, 3, "%02x", rnd[i]);
  snprintf(w->sandbox, sizeof(w->sandbox), "%s", q->e->sandbox_id);
  w->ws = ws;
  w->last_ns = now_ns();
  pthread_mutex_lock(&fs->watchers_lock);
  watchers_sweep(fs);
  size_t same = 0, slot = WATCHERS_MAX;
  for (size_t i = 0; i < WATCHERS_MAX; i++) {
    if (!fs->watchers[i])
      slot = slot == WATCHERS_MAX ? i : slot;
    else if (strcmp(fs->watchers[i]->sandbox, w->sandbox) == 0)
      same++;
  }
  if (same >= WATCHERS_PER_SANDBOX || slot == WATCHERS_MAX) {
    pthread_mutex_unlock(&fs->watchers_lock);
    watch_src_free(ws);
    free(w);
    return cx_reply_error(r, "resource_exhausted", "too many watchers (at most %d per sandbox, %d in all)",
                          WATCHERS_PER_SANDBOX, WATCHERS_MAX);
  }
  fs->watchers[slot] = w;
  pthread_mutex_unlock(&fs->watchers_lock);
  return cx_reply(r, json_pack("{s:s}", "watcherId", w->id));
}

/* The watcher id of body in this sandbox, or -1 after replying. Caller holds watchers_lock. */
static int find_watcher(struct api_req *r, struct envd_req *q, json_t *body) {
  struct envd_fs_state *fs = e2b_state(r)->fs;
  moat_error *err = NULL;
  const char *id;
  watchers_sweep(fs);
  if (envd_json_str(body, "watcherId", &id, &err) < 0) {
    pthread_mutex_unlock(&fs->watchers_lock);
    return cx_reply_moat_error(r, &err), -1;
  }
  for (size_t i = 0; id && i < WATCHERS_MAX; i++)
    if (fs->watchers[i] && strcmp(fs->watchers[i]->id, id) == 0 &&
        strcmp(fs->watchers[i]->sandbox, q->e->sandbox_id) == 0)
      return (int)i;
  pthread_mutex_unlock(&fs->watchers_lock);
  return cx_reply_error(r, "not_found", "watcher %.64s not found", id ? id : ""), -1;
}

static int fs_get_watcher_events(struct api_req *r, struct envd_req *q, json_t *body) {
  struct envd_fs_state *fs = e2b_state(r)->fs;
  pthread_mutex_lock(&fs->watchers_lock);
  int i = find_watcher(r, q, body);
  if (i < 0)
    return -1;
  struct watcher *w = fs->watchers[i];
  if (w->busy) {
    pthread_mutex_unlock(&fs->watchers_lock);
    return cx_reply_error(r, "aborted", "another GetWatcherEvents of this watcher is running");
  }
  w->busy = true;
  pthread_mutex_unlock(&fs->watchers_lock);
  json_t *arr = json_array();
  bool ended = false;
  moat_error *err = NULL;
  while (json_array_size(arr) < WATCHER_MAX_EVENTS) {
    struct moat_watch_event ev;
    int rc = moat_watch_next(w->ws->w, &ev, 0, &err);
    if (rc < 0 && err && err->status == ETIMEDOUT) {
      moat_error_free(&err);
      break;
    }
    if (rc <= 0) {
      moat_error_free(&err);
      ended = true;
      break;
    }
    fs_events(w->ws, &ev, arr);
  }
  pthread_mutex_lock(&fs->watchers_lock);
  w->busy = false;
  w->last_ns = now_ns();
  if (ended) {
    fs->watchers[i] = NULL;
    watch_src_free(w->ws);
    free(w);
  }
  pthread_mutex_unlock(&fs->watchers_lock);
  if (ended && json_array_size(arr) == 0) {
    json_decref(arr);
    return cx_reply_error(r, "unavailable", "the watcher ended (the sandbox went away)");
  }
  return cx_reply(r, json_pack("{s:o}", "events", arr));
}

static int fs_remove_watcher(struct api_req *r, struct envd_req *q, json_t *body) {
  struct envd_fs_state *fs = e2b_state(r)->fs;
  pthread_mutex_lock(&fs->watchers_lock);
  int i = find_watcher(r, q, body);
  if (i < 0)
    return -1;
  struct watcher *w = fs->watchers[i];
  if (w->busy) {
    pthread_mutex_unlock(&fs->watchers_lock);
    return cx_reply_error(r, "aborted", "a GetWatcherEvents of this watcher is running");
  }
  fs->watchers[i] = NULL;
  pthread_mutex_unlock(&fs->watchers_lock);
  watch_src_free(w->ws);
  free(w);
  return cx_reply(r, json_object());
}

void envd_filesystem(struct api_req *r, struct envd_req *q, json_t *body) {
  moat_error *err = NULL;
  const char *m = q->method;
  if (strcmp(m, "GetWatcherEvents") == 0) {
    fs_get_watcher_events(r, q, body);
    return;
  }
  if (strcmp(m, "RemoveWatcher") == 0) {
    fs_remove_watcher(r, q, body);
    return;
  }
  _cleanup_free_ struct moat_guest_ep *sock = envd_guest(r, q, NULL, &err);
  if (!sock) {
    if (q->stream)
      cx_stream_error(r, cx_errno_code(err->status), "%s", moat_error_msg(err)), moat_error_free(&err);
    else
      cx_reply_moat_error(r, &err);
    return;
  }
  if (strcmp(m, "Stat") == 0)
    fs_stat(r, q, sock, body);
  else if (strcmp(m, "MakeDir") == 0)
    fs_make_dir(r, q, sock, body);
  else if (strcmp(m, "Move") == 0)
    fs_move(r, q, sock, body);
  else if (strcmp(m, "ListDir") == 0)
    fs_list_dir(r, q, sock, body);
  else if (strcmp(m, "Remove") == 0)
    fs_remove(r, q, sock, body);
  else if (strcmp(m, "WatchDir") == 0)
    fs_watch_dir(r, q, sock, body);
  else if (strcmp(m, "CreateWatcher") == 0)
    fs_create_watcher(r, q, sock, body);
  else
    cx_reply_error(r, "unimplemented", "filesystem.Filesystem/%.64s is not implemented", m);
}

/* ---- the state of envd's filesystem service ---- */

struct envd_fs_state *envd_fs_state_new(void) {
  struct envd_fs_state *fs = xcalloc(1, sizeof(*fs));
  pthread_mutex_init(&fs->names_lock, NULL);
  pthread_mutex_init(&fs->watchers_lock, NULL);
  return fs;
}

void envd_fs_state_free(struct envd_fs_state *fs) {
  if (!fs)
    return;
  for (int w = 0; w < 2; w++)
    for (size_t i = 0; i < NAMES_CACHE; i++) {
      free(fs->names[w][i].sock);
      free(fs->names[w][i].text);
    }
  for (size_t i = 0; i < WATCHERS_MAX; i++)
    if (fs->watchers[i]) {
      watch_src_free(fs->watchers[i]->ws);
      free(fs->watchers[i]);
    }
  pthread_mutex_destroy(&fs->names_lock);
  pthread_mutex_destroy(&fs->watchers_lock);
  free(fs);
}

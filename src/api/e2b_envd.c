/* e2b_envd.c -- E2B's in-sandbox daemon (envd, port 49983) on moat's guest: routing, the user,
 * REST GET /health, GET /files, POST /files, and filesystem.Filesystem over Connect
 *
 * e2b.c hands every port-49983 call here once the sandbox is resolved and the caller
 * authenticated (X-Access-Token). The user a call acts as is E2B's: "Authorization: Basic
 * base64(USER:)" on RPCs, ?username= on /files, else ENVD_DEFAULT_USER ("user", uid 1000 in
 * moat's templates, as in E2B's). Paths are resolved by the guest against that user's home and
 * inside the sandbox's root, as envd does.
 */
#include <errno.h>
#include <microhttpd.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/log.h"
#include "e2b_envd.h"

#define ENVD_MAX_PART_HEADERS (16 * 1024)
#define ENVD_MAX_FILES 1024 /* parts of one multipart upload */

/* ---- small JSON readers ---- */

int envd_json_uint(json_t *msg, const char *field, uint64_t max, uint64_t def, uint64_t *out, moat_error **err) {
  json_t *v = json_object_get(msg, field);
  uint64_t n;
  if (!v || json_is_null(v)) {
    *out = def;
    return 0;
  }
  if (json_is_integer(v) && json_integer_value(v) >= 0)
    n = (uint64_t)json_integer_value(v);
  else if (!json_is_string(v) || parse_u64(json_string_value(v), &n) < 0)
    return moat_error_set(err, EINVAL, "field '%s' must be a non-negative integer", field);
  if (n > max)
    return moat_error_set(err, EINVAL, "field '%s' must be at most %llu", field, (unsigned long long)max);
  *out = n;
  return 0;
}

int envd_json_str(json_t *msg, const char *field, const char **out, moat_error **err) {
  json_t *v = json_object_get(msg, field);
  *out = NULL;
  if (!v || json_is_null(v))
    return 0;
  if (!json_is_string(v))
    return moat_error_set(err, EINVAL, "field '%s' must be a string", field);
  if (strlen(json_string_value(v)) != json_string_length(v))
    return moat_error_set(err, EINVAL, "field '%s' contains a NUL byte", field);
  *out = json_string_value(v);
  return 0;
}

/* A required path field: non-empty, <= API_MAX_PATH. */
static int json_path(json_t *msg, const char *field, const char **out, moat_error **err) {
  if (envd_json_str(msg, field, out, err) < 0)
    return -1;
  if (!*out)
    return moat_error_set(err, EINVAL, "field '%s' is required", field);
  return api_check_path(field, *out, strlen(*out), err);
}

char *envd_guest(struct api_req *r, struct envd_req *q, char ***env, moat_error **err) {
  char *sock = NULL;
  if (moat_control_guest(api_control(r), q->e->org, q->e->sandbox_id, &sock, env, err) < 0) {
    /* The sandbox was resolved by e2b.c: it went away or is not running (paused). E2B's proxy
     * answers 502 then, which the SDK maps like Connect's "unavailable". */
    if (*err && ((*err)->status == ENOENT || (*err)->status == EBUSY))
      (*err)->status = ECONNREFUSED;
    return NULL;
  }
  return sock;
}

/* ---- entries: E2B's EntryInfo ---- */

/* uid/gid -> name, read from the sandbox's /etc/passwd and /etc/group when first needed. */
struct names {
  const char *sock;
  const char *user;
  bool loaded[2];
  char *text[2]; /* passwd, group */
};

static void names_clear(struct names *n) {
  free(n->text[0]);
  free(n->text[1]);
}

static char *read_small(const char *sock, const char *path, const char *user) {
  struct moat_guest_reader *rd = NULL;
  uint64_t size = 0;
  moat_error *err = NULL;
  if (moat_guest_read_open(sock, path, "root", &rd, &size, &err) < 0 || size > (1u << 20)) {
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

static json_t *name_of(struct names *n, int which, uint32_t id) {
  if (id == 0)
    return json_string("root");
  if (!n->loaded[which]) {
    n->loaded[which] = true;
    n->text[which] = read_small(n->sock, which == 0 ? "/etc/passwd" : "/etc/group", n->user);
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

static json_t *entry_json(struct names *n, const struct moat_file_entry *e) {
  char perms[11], size[24], t[32];
  perm_string(e->type, e->mode, perms);
  snprintf(size, sizeof(size), "%llu", (unsigned long long)e->size);
  json_t *j = json_pack("{s:o, s:s, s:o, s:s, s:i, s:s, s:o, s:o, s:s}", "name", api_str_json(e->name), "type",
                        file_type(e->type), "path", api_str_json(e->path), "size", size, "mode",
                        (int)(e->mode & 0777), "permissions", perms, "owner", name_of(n, 0, e->uid), "group",
                        name_of(n, 1, e->gid), "modifiedTime", api_rfc3339_ms(e->mtime_ms, t, sizeof(t)));
  if (e->link_target)
    json_object_set_new(j, "symlinkTarget", api_str_json(e->link_target));
  return j;
}

/* {"entry": EntryInfo of path} */
static int reply_entry(struct api_req *r, const char *sock, const char *path, const char *user) {
  moat_error *err = NULL;
  struct moat_file_entry e;
  memset(&e, 0, sizeof(e));
  if (moat_guest_stat(sock, path, user, &e, &err) < 0)
    return cx_reply_moat_error(r, &err);
  struct names n = {.sock = sock, .user = user};
  int ret = cx_reply(r, json_pack("{s:o}", "entry", entry_json(&n, &e)));
  names_clear(&n);
  moat_file_entry_clear(&e);
  return ret;
}

/* ---- filesystem.Filesystem: unary ---- */

static int fs_stat(struct api_req *r, struct envd_req *q, const char *sock, json_t *body) {
  moat_error *err = NULL;
  const char *path;
  if (json_path(body, "path", &path, &err) < 0)
    return cx_reply_moat_error(r, &err);
  return reply_entry(r, sock, path, q->user);
}

static int fs_make_dir(struct api_req *r, struct envd_req *q, const char *sock, json_t *body) {
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

static int fs_move(struct api_req *r, struct envd_req *q, const char *sock, json_t *body) {
  moat_error *err = NULL;
  const char *src, *dst;
  if (json_path(body, "source", &src, &err) < 0 || json_path(body, "destination", &dst, &err) < 0)
    return cx_reply_moat_error(r, &err);
  if (moat_guest_move(sock, src, dst, q->user, &err) < 0)
    return cx_reply_moat_error(r, &err);
  return reply_entry(r, sock, dst, q->user);
}

static int fs_list_dir(struct api_req *r, struct envd_req *q, const char *sock, json_t *body) {
  moat_error *err = NULL;
  const char *path;
  uint64_t depth;
  if (json_path(body, "path", &path, &err) < 0 || envd_json_uint(body, "depth", UINT32_MAX, 1, &depth, &err) < 0)
    return cx_reply_moat_error(r, &err);
  if (depth == 0)
    depth = 1; /* proto3 omits 0; envd treats it as 1 */
  if (depth > API_MAX_DEPTH)
    return cx_reply_error(r, "invalid_argument", "depth must be at most %d", API_MAX_DEPTH);
  struct moat_file_entry st;
  memset(&st, 0, sizeof(st));
  if (moat_guest_stat(sock, path, q->user, &st, &err) < 0)
    return cx_reply_moat_error(r, &err);
  char type = st.type;
  moat_file_entry_clear(&st);
  if (type != 'd')
    return cx_reply_error(r, "invalid_argument", "path %.1024s is not a directory", path);
  struct moat_file_entry *v = NULL;
  size_t n = 0;
  if (moat_guest_list(sock, path, q->user, (uint32_t)depth, &v, &n, &err) < 0)
    return cx_reply_moat_error(r, &err);
  struct names nm = {.sock = sock, .user = q->user};
  json_t *arr = json_array();
  for (size_t i = 0; i < n; i++)
    json_array_append_new(arr, entry_json(&nm, &v[i]));
  names_clear(&nm);
  moat_file_entries_free(v, n);
  return cx_reply(r, json_pack("{s:o}", "entries", arr));
}

static int fs_remove(struct api_req *r, struct envd_req *q, const char *sock, json_t *body) {
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
  struct moat_watch *w;
  char *sock;
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
      struct names nm = {.sock = ws->sock, .user = ws->user};
      json_object_set_new(j, "entry", entry_json(&nm, &e));
      names_clear(&nm);
      moat_file_entry_clear(&e);
    }
    moat_error_free(&err);
  }
  return j;
}

/* Appends the FilesystemEvents of one guest event to arr: a rename is envd's (fsnotify's)
 * RENAME of the old name plus CREATE of the new one. */
static void fs_events(const struct watch_src *ws, const struct moat_watch_event *ev, json_t *arr) {
  const char *type = event_type(ev->event);
  if (!type) {
    log_warn("e2b watch %s: %s event (events were lost)", ws->root, ev->event);
    return;
  }
  json_array_append_new(arr, fs_event(ws, type, ev->path));
  if (strcmp(ev->event, "rename") == 0 && ev->path2)
    json_array_append_new(arr, fs_event(ws, "EVENT_TYPE_CREATE", ev->path2));
}

/* Opens a watch on the request's path (must be a directory). 0, or -1 with *err. */
static int watch_open(struct envd_req *q, const char *sock, json_t *body, struct watch_src **out, moat_error **err) {
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
  ws->sock = xstrdup(sock);
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

static int fs_watch_dir(struct api_req *r, struct envd_req *q, const char *sock, json_t *body) {
  moat_error *err = NULL;
  struct watch_src *ws = NULL;
  if (watch_open(q, sock, body, &ws, &err) < 0) {
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
 * watcher call. */
#define WATCHERS_MAX 1024
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

static pthread_mutex_t watchers_lock = PTHREAD_MUTEX_INITIALIZER;
static struct watcher *watchers[WATCHERS_MAX];

static bool watch_hung_up(struct watch_src *ws) {
  struct pollfd p = {.fd = moat_watch_fd(ws->w), .events = POLLRDHUP};
  return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

/* Frees idle and dead watchers. Caller holds watchers_lock. */
static void watchers_sweep(void) {
  uint64_t now = now_ns();
  for (size_t i = 0; i < WATCHERS_MAX; i++) {
    struct watcher *w = watchers[i];
    if (!w || w->busy)
      continue;
    if (now - w->last_ns > WATCHER_IDLE_S * 1000000000ULL || watch_hung_up(w->ws)) {
      watch_src_free(w->ws);
      free(w);
      watchers[i] = NULL;
    }
  }
}

static int fs_create_watcher(struct api_req *r, struct envd_req *q, const char *sock, json_t *body) {
  moat_error *err = NULL;
  struct watch_src *ws = NULL;
  if (watch_open(q, sock, body, &ws, &err) < 0)
    return cx_reply_moat_error(r, &err);
  struct watcher *w = xcalloc(1, sizeof(*w));
  unsigned char rnd[16];
  random_bytes(rnd, sizeof(rnd));
  for (size_t i = 0; i < sizeof(rnd); i++)
    snprintf(w->id + 2 * i, 3, "%02x", rnd[i]);
  snprintf(w->sandbox, sizeof(w->sandbox), "%s", q->e->sandbox_id);
  w->ws = ws;
  w->last_ns = now_ns();
  pthread_mutex_lock(&watchers_lock);
  watchers_sweep();
  size_t same = 0, slot = WATCHERS_MAX;
  for (size_t i = 0; i < WATCHERS_MAX; i++) {
    if (!watchers[i])
      slot = slot == WATCHERS_MAX ? i : slot;
    else if (strcmp(watchers[i]->sandbox, w->sandbox) == 0)
      same++;
  }
  if (same >= WATCHERS_PER_SANDBOX || slot == WATCHERS_MAX) {
    pthread_mutex_unlock(&watchers_lock);
    watch_src_free(ws);
    free(w);
    return cx_reply_error(r, "resource_exhausted", "too many watchers (at most %d per sandbox, %d in all)",
                          WATCHERS_PER_SANDBOX, WATCHERS_MAX);
  }
  watchers[slot] = w;
  pthread_mutex_unlock(&watchers_lock);
  return cx_reply(r, json_pack("{s:s}", "watcherId", w->id));
}

/* The watcher id of body in this sandbox, or -1 after replying. Caller holds watchers_lock. */
static int find_watcher(struct api_req *r, struct envd_req *q, json_t *body) {
  moat_error *err = NULL;
  const char *id;
  if (envd_json_str(body, "watcherId", &id, &err) < 0) {
    pthread_mutex_unlock(&watchers_lock);
    return cx_reply_moat_error(r, &err), -1;
  }
  for (size_t i = 0; id && i < WATCHERS_MAX; i++)
    if (watchers[i] && strcmp(watchers[i]->id, id) == 0 && strcmp(watchers[i]->sandbox, q->e->sandbox_id) == 0)
      return (int)i;
  pthread_mutex_unlock(&watchers_lock);
  return cx_reply_error(r, "not_found", "watcher %.64s not found", id ? id : ""), -1;
}

static int fs_get_watcher_events(struct api_req *r, struct envd_req *q, json_t *body) {
  pthread_mutex_lock(&watchers_lock);
  int i = find_watcher(r, q, body);
  if (i < 0)
    return -1;
  struct watcher *w = watchers[i];
  if (w->busy) {
    pthread_mutex_unlock(&watchers_lock);
    return cx_reply_error(r, "aborted", "another GetWatcherEvents of this watcher is running");
  }
  w->busy = true;
  pthread_mutex_unlock(&watchers_lock);
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
  pthread_mutex_lock(&watchers_lock);
  w->busy = false;
  w->last_ns = now_ns();
  if (ended) {
    watchers[i] = NULL;
    watch_src_free(w->ws);
    free(w);
  }
  pthread_mutex_unlock(&watchers_lock);
  if (ended && json_array_size(arr) == 0) {
    json_decref(arr);
    return cx_reply_error(r, "unavailable", "the watcher ended (the sandbox went away)");
  }
  return cx_reply(r, json_pack("{s:o}", "events", arr));
}

static int fs_remove_watcher(struct api_req *r, struct envd_req *q, json_t *body) {
  pthread_mutex_lock(&watchers_lock);
  int i = find_watcher(r, q, body);
  if (i < 0)
    return -1;
  struct watcher *w = watchers[i];
  if (w->busy) {
    pthread_mutex_unlock(&watchers_lock);
    return cx_reply_error(r, "aborted", "a GetWatcherEvents of this watcher is running");
  }
  watchers[i] = NULL;
  pthread_mutex_unlock(&watchers_lock);
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
  _cleanup_free_ char *sock = envd_guest(r, q, NULL, &err);
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

/* ---- REST ---- */

/* envd's REST errors: {"code": HTTP status, "message"}. */
static int rest_error(struct api_req *r, unsigned status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int rest_error(struct api_req *r, unsigned status, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  return api_reply_json(r, status, json_pack("{s:i, s:o}", "code", (int)status, "message", api_str_json(msg)));
}

static unsigned rest_status(int st) {
  if (st == ENOSPC || st == EDQUOT)
    return 507; /* the SDK's NotEnoughSpaceError */
  const char *code;
  return api_errno_http(st, &code);
}

static int rest_moat_error(struct api_req *r, moat_error **err) {
  int ret = rest_error(r, rest_status(*err ? (*err)->status : 0), "%s", moat_error_msg(*err));
  moat_error_free(err);
  return ret;
}

/* ?path= and ?username= of /files. -1 after replying. */
static int files_args(struct api_req *r, struct envd_req *q, const char **path, bool path_required) {
  static const char *const allowed[] = {"path", "username", "signature", "signature_expiration", NULL};
  moat_error *err = NULL;
  if (api_args_check(&r->args, allowed, &err) < 0)
    return rest_moat_error(r, &err), -1;
  if (api_arg_get(&r->args, "signature"))
    return rest_error(r, 400, "signed file URLs are not supported; use the access token"), -1;
  const char *u = api_arg_get(&r->args, "username");
  if (u && *u) {
    if (api_check_user("username", u, &err) < 0)
      return rest_moat_error(r, &err), -1;
    snprintf(q->user_buf, sizeof(q->user_buf), "%s", u);
    q->user = q->user_buf;
  }
  *path = api_arg_get(&r->args, "path");
  if (*path && !**path)
    *path = NULL;
  if (!*path && path_required)
    return rest_error(r, 400, "query parameter 'path' is required"), -1;
  if (*path && api_check_path("path", *path, strlen(*path), &err) < 0)
    return rest_moat_error(r, &err), -1;
  return 0;
}

struct read_state {
  struct moat_guest_reader *reader;
  uint64_t size, pos;
};

static ssize_t read_cb(void *cls, uint64_t pos, char *buf, size_t max) {
  struct read_state *st = cls;
  if (st->pos >= st->size)
    return MHD_CONTENT_READER_END_OF_STREAM;
  size_t cap = max;
  if ((uint64_t)cap > st->size - st->pos)
    cap = (size_t)(st->size - st->pos);
  moat_error *err = NULL;
  ssize_t n = moat_guest_read_chunk(st->reader, buf, cap, &err);
  if (n <= 0) { /* the file shrank or the guest went away: a short body and a closed connection */
    moat_error_free(&err);
    return MHD_CONTENT_READER_END_WITH_ERROR;
  }
  st->pos += (uint64_t)n;
  return n;
}

static void read_free(void *cls) {
  struct read_state *st = cls;
  moat_guest_reader_close(st->reader);
  free(st);
}

static void files_get(struct api_req *r, struct envd_req *q) {
  const char *path;
  moat_error *err = NULL;
  if (files_args(r, q, &path, true) < 0)
    return;
  _cleanup_free_ char *sock = envd_guest(r, q, NULL, &err);
  if (!sock) {
    rest_moat_error(r, &err);
    return;
  }
  struct read_state *st = xcalloc(1, sizeof(*st));
  if (moat_guest_read_open(sock, path, q->user, &st->reader, &st->size, &err) < 0) {
    free(st);
    if (err->status == EISDIR)
      rest_error(r, 400, "path '%.1024s' is a directory", path), moat_error_free(&err);
    else
      rest_moat_error(r, &err);
    return;
  }
  struct MHD_Response *resp = MHD_create_response_from_callback(st->size, API_FILE_BLOCK, read_cb, st, read_free);
  if (!resp) {
    read_free(st);
    rest_error(r, 500, "could not create a response");
    return;
  }
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/octet-stream");
  api_reply_response(r, 200, resp);
  MHD_destroy_response(resp);
}

/* POST /files: multipart/form-data (one part "file" per file; its filename is the path when the
 * query has none) or application/octet-stream (the body is the file at ?path=). Every file
 * streams to a guest writer as it arrives; nothing is buffered whole. */
enum { UP_PREAMBLE, UP_HEADERS, UP_DATA, UP_AFTER_DELIM, UP_DONE };

struct envd_upload {
  char *sock;
  const char *qpath; /* ?path= (borrowed from r->args) or NULL */
  bool multipart;
  char delim[80]; /* "\r\n--BOUNDARY" */
  size_t dlen;
  int state;
  struct moat_buf pend; /* bytes not yet consumed */
  size_t pend_off;
  struct moat_guest_writer *w;
  char *cur_path;
  bool skip; /* a part that is not "file" */
  size_t nfiles;
  json_t *written; /* [{name, type, path}] */
};

static void upload_free(struct envd_upload *u) {
  if (!u)
    return;
  if (u->w)
    moat_guest_writer_close(u->w); /* an unfinished file is discarded */
  free(u->sock);
  free(u->pend.p);
  free(u->cur_path);
  json_decref(u->written);
  free(u);
}

static int part_open(struct envd_upload *u, const char *user, const char *path, moat_error **err) {
  if (api_check_path("path", path, strlen(path), err) < 0)
    return -1;
  if (++u->nfiles > ENVD_MAX_FILES)
    return moat_error_set(err, E2BIG, "more than %d files in one upload", ENVD_MAX_FILES);
  if (moat_guest_write_open(u->sock, path, user, 0644, &u->w, err) < 0) {
    u->w = NULL;
    return -1;
  }
  free(u->cur_path);
  u->cur_path = xstrdup(path);
  return 0;
}

static int part_finish(struct envd_upload *u, const char *user, moat_error **err) {
  if (!u->w)
    return 0;
  uint64_t written = 0;
  int rc = moat_guest_write_finish(u->w, &written, err);
  moat_guest_writer_close(u->w);
  u->w = NULL;
  if (rc < 0)
    return -1;
  struct moat_file_entry e;
  memset(&e, 0, sizeof(e));
  moat_error *serr = NULL;
  const char *path = u->cur_path;
  if (moat_guest_stat(u->sock, u->cur_path, user, &e, &serr) == 0 && e.path)
    path = e.path;
  moat_error_free(&serr);
  const char *slash = strrchr(path, '/');
  json_array_append_new(u->written, json_pack("{s:o, s:s, s:o}", "name", api_str_json(slash ? slash + 1 : path),
                                              "type", "file", "path", api_str_json(path)));
  moat_file_entry_clear(&e);
  return 0;
}

/* The value of param (name="..." / filename="...") in a Content-Disposition line, or NULL. */
static char *disposition_param(const char *h, size_t hl, const char *param) {
  size_t pl = strlen(param);
  for (size_t i = 0; i + pl + 2 <= hl; i++) {
    if ((i == 0 || h[i - 1] == ' ' || h[i - 1] == ';') && strncasecmp(h + i, param, pl) == 0 && h[i + pl] == '=') {
      const char *v = h + i + pl + 1, *end = h + hl;
      if (v < end && *v == '"') {
        v++;
        const char *q = memchr(v, '"', (size_t)(end - v));
        return q ? xstrndup(v, (size_t)(q - v)) : NULL;
      }
      const char *q = v;
      while (q < end && *q != ';' && *q != '\r')
        q++;
      return xstrndup(v, (size_t)(q - v));
    }
  }
  return NULL;
}

/* A part's headers are complete (h[0..hl), without the blank line): open its writer. */
static int part_headers(struct envd_upload *u, const char *user, const char *h, size_t hl, moat_error **err) {
  _cleanup_free_ char *name = NULL, *filename = NULL;
  for (const char *l = h; l < h + hl;) {
    const char *e = memmem(l, (size_t)(h + hl - l), "\r\n", 2);
    size_t ll = e ? (size_t)(e - l) : (size_t)(h + hl - l);
    if (ll > 20 && strncasecmp(l, "Content-Disposition:", 20) == 0) {
      name = disposition_param(l + 20, ll - 20, "name");
      filename = disposition_param(l + 20, ll - 20, "filename");
    }
    l = e ? e + 2 : h + hl;
  }
  u->skip = !name || strcmp(name, "file") != 0;
  if (u->skip)
    return 0;
  const char *path = u->qpath ? u->qpath : filename;
  if (!path || !*path)
    return moat_error_set(err, EINVAL, "a file part needs a path (?path= or the part's filename)");
  return part_open(u, user, path, err);
}

static int multipart_feed(struct envd_upload *u, const char *user, moat_error **err) {
  for (;;) {
    const char *p = u->pend.p + u->pend_off;
    size_t n = u->pend.len - u->pend_off;
    switch (u->state) {
    case UP_PREAMBLE:
    case UP_DATA: {
      const char *d = memmem(p, n, u->delim, u->dlen);
      size_t take = d ? (size_t)(d - p) : (n >= u->dlen ? n - (u->dlen - 1) : 0);
      if (u->state == UP_DATA && !u->skip && take > 0 && moat_guest_write_chunk(u->w, p, take, err) < 0) {
        moat_guest_writer_close(u->w);
        u->w = NULL;
        return -1;
      }
      u->pend_off += take;
      if (!d)
        return 0;
      if (u->state == UP_DATA && !u->skip && part_finish(u, user, err) < 0)
        return -1;
      u->pend_off += u->dlen;
      u->state = UP_AFTER_DELIM;
      break;
    }
    case UP_AFTER_DELIM:
      if (n < 2)
        return 0;
      if (p[0] == '-' && p[1] == '-') {
        u->state = UP_DONE;
        u->pend_off = u->pend.len;
        return 0;
      }
      if (p[0] != '\r' || p[1] != '\n')
        return moat_error_set(err, EINVAL, "malformed multipart body (no CRLF after a boundary)");
      u->pend_off += 2;
      u->state = UP_HEADERS;
      break;
    case UP_HEADERS: {
      if (n >= 2 && p[0] == '\r' && p[1] == '\n') { /* a part without headers */
        u->pend_off += 2;
        u->skip = true;
        u->state = UP_DATA;
        break;
      }
      const char *e = memmem(p, n, "\r\n\r\n", 4);
      if (!e) {
        if (n > ENVD_MAX_PART_HEADERS)
          return moat_error_set(err, EINVAL, "multipart part headers longer than %d bytes", ENVD_MAX_PART_HEADERS);
        return 0;
      }
      if (part_headers(u, user, p, (size_t)(e - p), err) < 0)
        return -1;
      u->pend_off += (size_t)(e - p) + 4;
      u->state = UP_DATA;
      break;
    }
    case UP_DONE:
      u->pend_off = u->pend.len; /* the epilogue is ignored */
      return 0;
    }
  }
}

static int upload_chunk(struct envd_req *q, const char *data, size_t len, moat_error **err) {
  struct envd_upload *u = q->up;
  if (!u->multipart) {
    if (!u->w)
      return moat_error_set(err, EIO, "upload already failed");
    if (moat_guest_write_chunk(u->w, data, len, err) < 0) {
      moat_guest_writer_close(u->w);
      u->w = NULL;
      return -1;
    }
    return 0;
  }
  /* Drop what was consumed, then append: pend stays below one chunk plus a boundary. */
  if (u->pend_off > 0) {
    memmove(u->pend.p, u->pend.p + u->pend_off, u->pend.len - u->pend_off);
    u->pend.len -= u->pend_off;
    u->pend_off = 0;
  }
  moat_buf_append(&u->pend, data, len);
  return multipart_feed(u, q->user, err);
}

static void upload_finish(struct api_req *r, struct envd_req *q) {
  struct envd_upload *u = q->up;
  moat_error *err = NULL;
  if (u->multipart) {
    if (u->state != UP_DONE) {
      rest_error(r, 400, "the multipart body ended before its closing boundary");
      return;
    }
    if (json_array_size(u->written) == 0) {
      rest_error(r, 400, "no 'file' part in the multipart body");
      return;
    }
  } else if (part_finish(u, q->user, &err) < 0) {
    rest_moat_error(r, &err);
    return;
  }
  api_reply_json(r, 200, json_incref(u->written));
}

static enum MHD_Result find_metadata(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
  if (strncasecmp(key, "X-Metadata-", 11) == 0) {
    *(bool *)cls = true;
    return MHD_NO;
  }
  return MHD_YES;
}

/* Sets up POST /files; -1 after replying. */
static int upload_begin(struct api_req *r, struct envd_req *q) {
  const char *path;
  moat_error *err = NULL;
  if (files_args(r, q, &path, false) < 0)
    return -1;
  bool meta = false;
  MHD_get_connection_values(r->conn, MHD_HEADER_KIND, find_metadata, &meta);
  if (meta)
    return rest_error(r, 400, "file metadata (X-Metadata-* headers) is not supported by moat"), -1;
  const char *enc = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_ENCODING);
  if (enc && strcasecmp(enc, "identity") != 0)
    return rest_error(r, 400, "Content-Encoding %.64s is not supported (upload without gzip)", enc), -1;
  const char *ct = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
  struct envd_upload *u = xcalloc(1, sizeof(*u));
  q->up = u;
  u->written = json_array();
  u->qpath = path;
  if (ct && strncasecmp(ct, "multipart/form-data", 19) == 0) {
    const char *b = strcasestr(ct, "boundary=");
    if (!b)
      return rest_error(r, 400, "multipart/form-data without a boundary"), -1;
    b += 9;
    size_t bl;
    if (*b == '"') {
      b++;
      const char *e = strchr(b, '"');
      bl = e ? (size_t)(e - b) : 0;
    } else {
      bl = strcspn(b, "; \t");
    }
    if (bl == 0 || bl > 70)
      return rest_error(r, 400, "multipart boundary must be 1 to 70 characters"), -1;
    u->multipart = true;
    u->dlen = (size_t)snprintf(u->delim, sizeof(u->delim), "\r\n--%.*s", (int)bl, b);
    /* The body starts with "--BOUNDARY": seen as a delimiter after a virtual CRLF. */
    moat_buf_append(&u->pend, "\r\n", 2);
    u->state = UP_PREAMBLE;
  } else if (ct && strncasecmp(ct, "application/octet-stream", 24) == 0) {
    if (!path)
      return rest_error(r, 400, "query parameter 'path' is required for an application/octet-stream upload"), -1;
  } else {
    return rest_error(r, 400, "Content-Type must be multipart/form-data or application/octet-stream"), -1;
  }
  u->sock = envd_guest(r, q, NULL, &err);
  if (!u->sock)
    return rest_moat_error(r, &err), -1;
  if (!u->multipart && part_open(u, q->user, path, &err) < 0)
    return rest_moat_error(r, &err), -1;
  return 0;
}

/* ---- the e2b.c hand-off ---- */

static void envd_req_free(void *p) {
  struct envd_req *q = p;
  if (!q)
    return;
  upload_free(q->up);
  free(q->method);
  free(q->body.p);
  free(q);
}

static const char *const process_methods[] = {"Start",      "Connect",    "List",   "SendInput", "SendSignal",
                                              "CloseStdin", "Update",     "StreamInput", NULL};
static const char *const fs_methods[] = {"Stat",   "MakeDir",  "Move",          "ListDir",          "Remove",
                                         "WatchDir", "CreateWatcher", "GetWatcherEvents", "RemoveWatcher", NULL};

bool envd_is_stream(const char *service, const char *method) {
  if (strcmp(service, "process.Process") == 0)
    return strcmp(method, "Start") == 0 || strcmp(method, "Connect") == 0;
  return strcmp(method, "WatchDir") == 0;
}

static bool in_list(const char *const *v, const char *s) {
  for (size_t i = 0; v[i]; i++)
    if (strcmp(v[i], s) == 0)
      return true;
  return false;
}

/* "Authorization: Basic base64(USER:PASSWORD)" -> USER into q. -1 after replying. */
static int rpc_user(struct api_req *r, struct envd_req *q) {
  const char *h = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
  if (!h || strncasecmp(h, "Basic ", 6) != 0)
    return 0;
  h += 6;
  while (*h == ' ')
    h++;
  _cleanup_free_ unsigned char *dec = NULL;
  size_t n = 0;
  if (moat_base64_decode(h, strlen(h), &dec, &n) < 0)
    return cx_reply_error(r, "unauthenticated", "the Authorization header is not valid base64"), -1;
  const unsigned char *c = memchr(dec, ':', n);
  size_t ul = c ? (size_t)(c - dec) : n;
  if (ul == 0)
    return 0;
  if (ul > API_MAX_USER)
    return cx_reply_error(r, "invalid_argument", "user name longer than %d bytes", API_MAX_USER), -1;
  memcpy(q->user_buf, dec, ul);
  q->user_buf[ul] = '\0';
  moat_error *err = NULL;
  if (api_check_user("user", q->user_buf, &err) < 0)
    return cx_reply_moat_error(r, &err), -1;
  q->user = q->user_buf;
  return 0;
}

static bool rpc_begin(struct api_req *r, struct envd_req *q, const char *url, const char *method) {
  const char *slash = strchr(url + 1, '/');
  char service[32];
  if (!slash || (size_t)(slash - url - 1) >= sizeof(service)) {
    rest_error(r, 404, "no such path: %.256s", url);
    return true;
  }
  snprintf(service, sizeof(service), "%.*s", (int)(slash - url - 1), url + 1);
  const char *m = slash + 1;
  bool proc = strcmp(service, "process.Process") == 0, fs = strcmp(service, "filesystem.Filesystem") == 0;
  if (!proc && !fs) {
    rest_error(r, 404, "no such path: %.256s", url);
    return true;
  }
  if (!in_list(proc ? process_methods : fs_methods, m)) {
    api_reply_json(r, 404, json_pack("{s:s, s:s+}", "code", "unimplemented", "message", "no such procedure: ", url));
    return true;
  }
  if (strcmp(method, "POST") != 0) {
    cx_reply_error(r, "unimplemented", "%s needs POST (GET requests are not supported)", url);
    return true;
  }
  q->method = xstrdup(m);
  q->proc = proc;
  q->stream = envd_is_stream(service, m);
  const char *ct = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
  const char *want = q->stream ? "application/connect+json" : "application/json";
  size_t wl = strlen(want);
  if (!ct || strncasecmp(ct, want, wl) != 0 || (ct[wl] && ct[wl] != ';' && ct[wl] != ' ')) {
    api_reply_json(r, 415,
                   json_pack("{s:s, s:s+}", "code", "invalid_argument", "message", "Content-Type must be ", want));
    return true;
  }
  const char *ver = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Connect-Protocol-Version");
  if (ver && strcmp(ver, "1") != 0) {
    cx_reply_error(r, "invalid_argument", "Connect-Protocol-Version must be 1");
    return true;
  }
  const char *cenc = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND,
                                                 q->stream ? "Connect-Content-Encoding" : "Content-Encoding");
  if (cenc && strcasecmp(cenc, "identity") != 0) {
    cx_reply_error(r, "unimplemented", "compression %.32s is not supported", cenc);
    return true;
  }
  const char *cl = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
  uint64_t n;
  if (cl && parse_u64(cl, &n) == 0 && n > API_MAX_BODY) {
    cx_reply_error(r, "resource_exhausted", "request message larger than %d bytes", API_MAX_BODY);
    return true;
  }
  if (rpc_user(r, q) < 0)
    return true;
  return false;
}

bool e2b_envd_begin(struct api_req *r, struct e2b_req *e, const char *url, const char *method) {
  struct envd_req *q = xcalloc(1, sizeof(*q));
  q->e = e;
  q->user = ENVD_DEFAULT_USER;
  e->sub = q;
  e->sub_free = envd_req_free;
  if (strcmp(url, "/health") == 0) {
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
      rest_error(r, 405, "method %s is not allowed on /health", method);
    else
      api_reply_empty(r, 204);
    return true;
  }
  if (strcmp(url, "/files") == 0) {
    if (strcmp(method, "GET") == 0) {
      files_get(r, q);
      return true;
    }
    if (strcmp(method, "POST") == 0)
      return upload_begin(r, q) < 0;
    rest_error(r, 405, "method %s is not allowed on /files", method);
    return true;
  }
  if (url[0] == '/' && strchr(url + 1, '/') && strchr(url, '.'))
    return rpc_begin(r, q, url, method);
  rest_error(r, 404, "no such path: %.256s", url);
  return true;
}

int e2b_envd_body(struct api_req *r, struct e2b_req *e, const char *data, size_t len, moat_error **err) {
  struct envd_req *q = e->sub;
  if (q->up)
    return upload_chunk(q, data, len, err);
  if (len > API_MAX_BODY - q->body.len)
    return moat_error_set(err, EMSGSIZE, "request message larger than %d bytes", API_MAX_BODY);
  moat_buf_append(&q->body, data, len);
  return 0;
}

void e2b_envd_dispatch(struct api_req *r, struct e2b_req *e) {
  struct envd_req *q = e->sub;
  if (q->up) {
    upload_finish(r, q);
    return;
  }
  if (!q->method) {
    rest_error(r, 500, "request without a handler");
    return;
  }
  moat_error *err = NULL;
  json_t *body = NULL;
  if (q->stream) {
    if (cx_unwrap(q->body.p, q->body.len, &body, &err) < 0) {
      cx_stream_error(r, "invalid_argument", "%s", moat_error_msg(err));
      moat_error_free(&err);
      return;
    }
  } else if (api_body_parse(q->body.p ? q->body.p : "", q->body.len, true, &body, &err) < 0) {
    cx_reply_error(r, "invalid_argument", "%s", moat_error_msg(err));
    moat_error_free(&err);
    return;
  }
  if (q->proc)
    envd_process(r, q, body);
  else
    envd_filesystem(r, q, body);
  json_decref(body);
}

/* watch.c -- WATCH: inotify events under a directory (optionally its whole tree) as REP_EVENT frames
 *
 * Runs in a worker that already acts as the user (files.c). Events: "create" (IN_CREATE, and an
 * unpaired IN_MOVED_TO), "write" (IN_MODIFY / IN_CLOSE_WRITE; repeats for the same path in a row
 * are coalesced), "remove" (IN_DELETE, IN_DELETE_SELF of the root, an unpaired IN_MOVED_FROM),
 * "rename" (IN_MOVED_FROM + IN_MOVED_TO with one cookie: PATH, PATH2) and "overflow". With
 * RECURSIVE, every subdirectory is watched, including ones created or moved in later (what they
 * already hold is reported as "create"). Ends when the host closes the connection.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../common/util.h"
#include "guest.h"

#define WATCH_MASK                                                                                           \
  (IN_CREATE | IN_MODIFY | IN_CLOSE_WRITE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE_SELF |       \
   IN_ONLYDIR | IN_DONT_FOLLOW | IN_EXCL_UNLINK)
#define MAX_WATCHES 8192
#define MAX_DEPTH 64

/* An IN_MOVED_FROM waiting for the IN_MOVED_TO with its cookie. The kernel queues the two halves of
 * a rename one after the other, so a read can end between them. */
struct pending_move {
  uint32_t cookie;
  char *path;
  bool dir;
};

struct watch_state {
  int fd, ifd;
  bool recursive, failed;
  char **paths; /* indexed by watch descriptor */
  size_t npaths;
  char *last_write; /* path of the last "write" sent (coalescing) */
  struct pending_move mv;
  struct moat_msg m;
};

static void send_event(struct watch_state *w, const char *event, const char *path, const char *path2) {
  if (w->failed)
    return;
  bool is_write = strcmp(event, "write") == 0;
  if (is_write && w->last_write && strcmp(w->last_write, path) == 0)
    return;
  free(w->last_write);
  w->last_write = is_write ? xstrdup(path) : NULL;
  moat_msg_reset(&w->m, MOAT_REP_EVENT);
  moat_msg_put_str(&w->m, MOAT_T_EVENT, event);
  moat_msg_put_str(&w->m, MOAT_T_PATH, path);
  if (path2)
    moat_msg_put_str(&w->m, MOAT_T_PATH2, path2);
  if (moat_msg_send(w->fd, &w->m) < 0)
    w->failed = true;
}

static char *join(const char *dir, const char *name) {
  return strcmp(dir, "/") == 0 ? xasprintf("/%s", name) : xasprintf("%s/%s", dir, name);
}

/* Watches dir (and, recursively, its subdirectories); with report, what they hold is sent as
 * "create" (it appeared with the directory). */
static int add_tree(struct watch_state *w, const char *dir, int depth, bool report) {
  int wd = inotify_add_watch(w->ifd, dir, WATCH_MASK);
  if (wd < 0)
    return -1;
  if ((size_t)wd >= w->npaths) {
    size_t n = (size_t)wd + 64;
    w->paths = xrealloc(w->paths, n * sizeof(char *));
    memset(w->paths + w->npaths, 0, (n - w->npaths) * sizeof(char *));
    w->npaths = n;
  }
  free(w->paths[wd]);
  w->paths[wd] = xstrdup(dir);
  if ((!w->recursive && !report) || depth >= MAX_DEPTH || (size_t)wd >= MAX_WATCHES)
    return 0;
  DIR *d = opendir(dir);
  if (!d)
    return 0;
  struct dirent *de;
  while ((de = readdir(d))) {
    if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
      continue;
    _cleanup_free_ char *p = join(dir, de->d_name);
    if (report)
      send_event(w, "create", p, NULL);
    if (w->recursive && de->d_type == DT_DIR)
      add_tree(w, p, depth + 1, report);
  }
  closedir(d);
  return 0;
}

/* Renames the watched paths below from (a directory that moved) to to. */
static void move_prefix(struct watch_state *w, const char *from, const char *to) {
  size_t fl = strlen(from);
  for (size_t i = 0; i < w->npaths; i++) {
    char *p = w->paths[i];
    if (p && strncmp(p, from, fl) == 0 && (p[fl] == '\0' || p[fl] == '/')) {
      w->paths[i] = xasprintf("%s%s", to, p + fl);
      free(p);
    }
  }
}

/* The pending move's second half never came: it left the watched tree. */
static void flush_move(struct watch_state *w) {
  if (!w->mv.path)
    return;
  send_event(w, "remove", w->mv.path, NULL);
  free(w->mv.path);
  w->mv.path = NULL;
}

static void handle_events(struct watch_state *w, const uint8_t *buf, size_t len) {
  struct pending_move *mv = &w->mv;
  for (size_t off = 0; off + sizeof(struct inotify_event) <= len;) {
    const struct inotify_event *e = (const struct inotify_event *)(buf + off);
    off += sizeof(*e) + e->len;
    if (e->mask & IN_Q_OVERFLOW) {
      send_event(w, "overflow", "/", NULL);
      continue;
    }
    if (e->wd < 0 || (size_t)e->wd >= w->npaths || !w->paths[e->wd])
      continue;
    const char *dir = w->paths[e->wd];
    if (e->mask & IN_IGNORED) {
      free(w->paths[e->wd]);
      w->paths[e->wd] = NULL;
      continue;
    }
    if (e->mask & IN_DELETE_SELF) {
      if (e->wd == 1) /* the watched root itself */
        send_event(w, "remove", dir, NULL);
      continue;
    }
    if (!e->len)
      continue;
    _cleanup_free_ char *path = join(dir, e->name);
    bool isdir = (e->mask & IN_ISDIR) != 0;
    if (mv->path && !((e->mask & IN_MOVED_TO) && e->cookie == mv->cookie))
      flush_move(w);
    if (e->mask & IN_CREATE) {
      send_event(w, "create", path, NULL);
      if (isdir && w->recursive)
        add_tree(w, path, 1, true);
    } else if (e->mask & (IN_MODIFY | IN_CLOSE_WRITE)) {
      send_event(w, "write", path, NULL);
    } else if (e->mask & IN_DELETE) {
      send_event(w, "remove", path, NULL);
    } else if (e->mask & IN_MOVED_FROM) {
      *mv = (struct pending_move){e->cookie, steal_pointer(&path), isdir};
    } else if (e->mask & IN_MOVED_TO) {
      if (mv->path && mv->cookie == e->cookie) {
        send_event(w, "rename", mv->path, path);
        if (mv->dir && w->recursive)
          move_prefix(w, mv->path, path);
        free(mv->path);
        mv->path = NULL;
      } else {
        send_event(w, "create", path, NULL);
        if (isdir && w->recursive)
          add_tree(w, path, 1, true);
      }
    }
  }
}

/* Reads what the inotify fd holds; while a move waits for its second half, waits up to
 * MOVE_PAIR_WAIT_MS for more before calling it a move out of the tree. */
#define MOVE_PAIR_WAIT_MS 50
static void read_events(struct watch_state *w, uint8_t *buf, size_t size) {
  for (;;) {
    ssize_t n = read(w->ifd, buf, size);
    if (n > 0)
      handle_events(w, buf, (size_t)n);
    if (!w->mv.path || w->failed)
      break;
    struct pollfd p = {.fd = w->ifd, .events = POLLIN};
    int pr;
    do
      pr = poll(&p, 1, MOVE_PAIR_WAIT_MS);
    while (pr < 0 && errno == EINTR);
    if (pr <= 0)
      break;
  }
  flush_move(w);
}

void guest_watch(int fd, const char *path, bool recursive) {
  struct stat st;
  if (stat(path, &st) < 0) {
    moat_msg_send_error(fd, errno, "watch %s: %s", path, strerror(errno));
    return;
  }
  if (!S_ISDIR(st.st_mode)) {
    moat_msg_send_error(fd, ENOTDIR, "watch %s: %s", path, strerror(ENOTDIR));
    return;
  }
  struct watch_state w = {.fd = fd, .recursive = recursive};
  moat_msg_init(&w.m, 0);
  w.ifd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  if (w.ifd < 0) {
    moat_msg_send_error(fd, errno, "watch: inotify: %s", strerror(errno));
    goto out;
  }
  if (add_tree(&w, path, 0, false) < 0) {
    moat_msg_send_error(fd, errno, "watch %s: %s", path, strerror(errno));
    goto out;
  }
  if (moat_msg_send_empty(fd, MOAT_REP_OK) < 0)
    goto out;
  _Alignas(struct inotify_event) uint8_t buf[64 << 10];
  while (!w.failed) {
    struct pollfd p[2] = {{.fd = w.ifd, .events = POLLIN}, {.fd = fd, .events = POLLIN}};
    int pr = poll(p, 2, MOAT_PROTO_HEARTBEAT_MS);
    if (pr < 0) {
      if (errno == EINTR)
        continue;
      break;
    }
    if (pr == 0) { /* quiet: tell the host we are alive */
      moat_msg_send_alive(fd);
      continue;
    }
    if (p[1].revents) { /* the host closed (or sent something: a watch takes no input) */
      uint8_t junk[256];
      ssize_t r = recv(fd, junk, sizeof(junk), MSG_DONTWAIT);
      if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR) || (p[1].revents & (POLLHUP | POLLERR)))
        break;
    }
    if (p[0].revents & POLLIN)
      read_events(&w, buf, sizeof(buf));
  }
out:
  if (w.ifd >= 0)
    close(w.ifd);
  for (size_t i = 0; i < w.npaths; i++)
    free(w.paths[i]);
  free(w.paths);
  free(w.last_write);
  free(w.mv.path);
  moat_msg_free(&w.m);
}

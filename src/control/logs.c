/* logs.c -- every sandbox's output log: what the guest's LOGS connection sends (each process's
 * start, output and exit), kept in files under DATA/logs/<id>/ that only moatd writes
 *
 * One logger thread per live sandbox holds its guest's LOGS connection (proto.h) while the
 * sandbox runs or is paused, and reconnects after a wake or a restore: the guest's cursors go on
 * where the last connection stopped. The guest holds a loud process to the log's pace while this
 * logger reads, and lets it run on (the log then loses bytes, and says so) once it stalls.
 *
 * Files: segments <seq>.log of records (struct rec_hdr, then tag, then data), appended with one
 * write each; a segment is closed once it holds half the bound and the one before it is removed,
 * so a sandbox's files never hold more than its bound. "dropped" (written whole, then renamed into
 * place) counts the bytes of removed segments. A crash of moatd leaves whole records and at most a
 * torn last one, which the next writer cuts off; readers stop at one.
 *
 * Kept after the kill for the retention period (moat_control_config.log_retention_s), then
 * removed by this file's manager thread, which also starts the loggers.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "../common/log.h"
#include "../common/util.h"
#include "../proto/client/guest_client.h"
#include "control_internal.h"

#define REC_MAGIC 0x31474c4du /* "MLG1" */
#define MANAGER_TICK_MS 200
#define LOGGER_STACK (256u << 10)
#define DEFAULT_LOG_MAX (16ull << 20)
#define DEFAULT_RETENTION_S 86400

struct rec_hdr {
  uint32_t magic;
  uint32_t len; /* the whole record */
  uint8_t kind, stream, tag_len, pad;
  int32_t pid;
  int64_t at_ms;
  int64_t value;
};

struct ctl_log {
  struct ctl_log *next; /* logs->list; logs->lock */
  char id[MOAT_ID_LEN + 1];
  pthread_t thread;
  bool ended;         /* the logger returned (logs->lock) */
  pthread_mutex_t wm; /* the writer: the logger thread, and notes of other threads (a leaf) */
  int gfd;            /* the guest connection's socket while one is open, else -1 (logs->lock) */
  bool connecting;    /* the logger is opening a guest connection (logs->lock) */
  bool held;          /* a checkpoint runs: no connection may be opened (logs->lock) */
  int fd;
  uint64_t seq, cur_size, old_size, dropped;
};

struct gone {
  struct gone *next;
  char id[MOAT_ID_LEN + 1];
  int64_t remove_at_ms;
};

struct ctl_logs {
  struct moat_control *c;
  char *dir;
  uint64_t max_bytes;
  int64_t retention_ms;
  pthread_mutex_t lock; /* a leaf */
  pthread_cond_t cond;  /* seq moved, or stop */
  uint64_t seq;         /* records appended, any sandbox's */
  bool stop;
  struct ctl_log *list;
  struct gone *gone; /* killed sandboxes' logs, and when to remove them */
  pthread_t manager;
  bool started;
};

static char *seg_path(const char *dir, const char *id, uint64_t seq) {
  return xasprintf("%s/%s/%llu.log", dir, id, (unsigned long long)seq);
}

/* The segments of a sandbox: lowest and highest sequence numbers; false when there is none. */
static bool seg_range(const char *sdir, uint64_t *lo, uint64_t *hi) {
  DIR *d = opendir(sdir);
  if (!d)
    return false;
  bool any = false;
  struct dirent *de;
  while ((de = readdir(d))) {
    char *end = NULL;
    unsigned long long v = strtoull(de->d_name, &end, 10);
    if (end == de->d_name || strcmp(end, ".log") != 0)
      continue;
    if (!any || v < *lo)
      *lo = v;
    if (!any || v > *hi)
      *hi = v;
    any = true;
  }
  closedir(d);
  return any;
}

static uint64_t read_dropped(const char *sdir) {
  _cleanup_free_ char *p = xasprintf("%s/dropped", sdir);
  char b[32] = {0};
  int fd = open(p, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return 0;
  ssize_t r = read(fd, b, sizeof(b) - 1);
  close(fd);
  return r > 0 ? strtoull(b, NULL, 10) : 0;
}

static void write_dropped(const char *sdir, uint64_t v) {
  _cleanup_free_ char *p = xasprintf("%s/dropped", sdir);
  _cleanup_free_ char *tmp = xasprintf("%s/dropped.tmp", sdir);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0)
    return;
  char b[32];
  int n = snprintf(b, sizeof(b), "%llu\n", (unsigned long long)v);
  bool ok = write(fd, b, (size_t)n) == n;
  close(fd);
  if (ok)
    rename(tmp, p);
}

/* The length of the whole records at the start of fd's file (a torn last one is not counted). */
static uint64_t whole_length(int fd) {
  uint64_t off = 0;
  struct stat st;
  if (fstat(fd, &st) < 0)
    return 0;
  for (;;) {
    struct rec_hdr h;
    if (pread(fd, &h, sizeof(h), (off_t)off) != (ssize_t)sizeof(h) || h.magic != REC_MAGIC ||
        h.len < sizeof(h) || off + h.len > (uint64_t)st.st_size)
      return off;
    off += h.len;
  }
}

/* Opens (making) the sandbox's newest segment for appending. */
static int writer_open(struct ctl_logs *L, struct ctl_log *l) {
  if (l->fd >= 0)
    return 0;
  _cleanup_free_ char *sdir = xasprintf("%s/%s", L->dir, l->id);
  if (mkdir(sdir, 0700) < 0 && errno != EEXIST)
    return -1;
  uint64_t lo = 0, hi = 0;
  bool any = seg_range(sdir, &lo, &hi);
  l->seq = any ? hi : 1;
  l->old_size = 0;
  if (any && lo < hi) {
    _cleanup_free_ char *op = seg_path(L->dir, l->id, hi - 1);
    struct stat st;
    if (stat(op, &st) == 0)
      l->old_size = (uint64_t)st.st_size;
  }
  l->dropped = read_dropped(sdir);
  _cleanup_free_ char *p = seg_path(L->dir, l->id, l->seq);
  l->fd = open(p, O_RDWR | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
  if (l->fd < 0)
    return -1;
  l->cur_size = whole_length(l->fd);
  if (ftruncate(l->fd, (off_t)l->cur_size) < 0 || lseek(l->fd, 0, SEEK_END) < 0) {
    close(l->fd);
    l->fd = -1;
    return -1;
  }
  return 0;
}

/* Closes the newest segment and starts the next; the one before the closed one goes. */
static void writer_rotate(struct ctl_logs *L, struct ctl_log *l) {
  _cleanup_free_ char *sdir = xasprintf("%s/%s", L->dir, l->id);
  _cleanup_free_ char *np = seg_path(L->dir, l->id, l->seq + 1);
  int fd = open(np, O_RDWR | O_APPEND | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0)
    return;
  close(l->fd);
  l->fd = fd;
  if (l->seq > 1) {
    _cleanup_free_ char *op = seg_path(L->dir, l->id, l->seq - 1);
    struct stat st;
    if (stat(op, &st) == 0) {
      l->dropped += (uint64_t)st.st_size;
      write_dropped(sdir, l->dropped);
      unlink(op);
    }
  }
  l->old_size = l->cur_size;
  l->cur_size = 0;
  l->seq++;
}

static void writer_close(struct ctl_log *l) {
  pthread_mutex_lock(&l->wm);
  if (l->fd >= 0)
    close(l->fd);
  l->fd = -1;
  pthread_mutex_unlock(&l->wm);
}

static void append_locked(struct ctl_logs *L, struct ctl_log *l, uint8_t kind, uint8_t stream, int pid,
                          const char *tag, int64_t value, const void *data, size_t len);

/* Appends one record; a failure (a full disk) loses it. */
static void log_append(struct ctl_logs *L, struct ctl_log *l, uint8_t kind, uint8_t stream, int pid,
                       const char *tag, int64_t value, const void *data, size_t len) {
  pthread_mutex_lock(&l->wm);
  append_locked(L, l, kind, stream, pid, tag, value, data, len);
  pthread_mutex_unlock(&l->wm);
}

static void append_locked(struct ctl_logs *L, struct ctl_log *l, uint8_t kind, uint8_t stream, int pid,
                          const char *tag, int64_t value, const void *data, size_t len) {
  if (writer_open(L, l) < 0)
    return;
  size_t tl = tag ? strlen(tag) : 0;
  if (tl > 255)
    tl = 255;
  uint64_t half = L->max_bytes / 2;
  if (len > half - sizeof(struct rec_hdr) - 256)
    len = half - sizeof(struct rec_hdr) - 256; /* never a record that a segment cannot hold */
  struct rec_hdr h = {.magic = REC_MAGIC,
                      .len = (uint32_t)(sizeof(h) + tl + len),
                      .kind = kind,
                      .stream = stream,
                      .tag_len = (uint8_t)tl,
                      .pid = pid,
                      .at_ms = now_unix_ms(),
                      .value = value};
  if (l->cur_size > 0 && l->cur_size + h.len > half)
    writer_rotate(L, l);
  struct iovec iov[3] = {{&h, sizeof(h)}, {(void *)tag, tl}, {(void *)data, len}};
  ssize_t w = writev(l->fd, iov, 3);
  if (w != (ssize_t)h.len) {
    if (w > 0 && ftruncate(l->fd, (off_t)l->cur_size) == 0) /* a torn record (ENOSPC) is undone */
      lseek(l->fd, 0, SEEK_END);
    return;
  }
  l->cur_size += h.len;
  pthread_mutex_lock(&L->lock);
  L->seq++;
  pthread_cond_broadcast(&L->cond);
  pthread_mutex_unlock(&L->lock);
}

static bool logs_stopping(struct ctl_logs *L) { return __atomic_load_n(&L->stop, __ATOMIC_RELAXED); }

static void deadline_in(struct timespec *ts, int ms) {
  clock_gettime(CLOCK_REALTIME, ts);
  ts->tv_sec += ms / 1000;
  ts->tv_nsec += (long)(ms % 1000) * 1000000L;
  if (ts->tv_nsec >= 1000000000L) {
    ts->tv_sec++;
    ts->tv_nsec -= 1000000000L;
  }
}

/* Waits ms, or less when moatd stops. */
static void logs_nap(struct ctl_logs *L, int ms) {
  struct timespec ts;
  deadline_in(&ts, ms);
  pthread_mutex_lock(&L->lock);
  if (!L->stop)
    pthread_cond_timedwait(&L->cond, &L->lock, &ts);
  pthread_mutex_unlock(&L->lock);
}

/* One guest record into the file. */
static void take_guest_rec(struct ctl_logs *L, struct ctl_log *l, const struct moat_guest_log_rec *g) {
  switch (g->kind) {
  case MOAT_GLOG_OUTPUT:
    log_append(L, l,
               g->pty      ? MOAT_LOG_PTY
               : g->stream ? MOAT_LOG_STDERR
                           : MOAT_LOG_STDOUT,
               (uint8_t)g->stream, g->pid, g->tag, 0, g->data, g->len);
    break;
  case MOAT_GLOG_START: {
    json_t *argv = json_array();
    for (size_t i = 0; g->argv && g->argv[i]; i++)
      json_array_append_new(argv, json_string(g->argv[i]));
    json_t *j = json_pack("{s:o, s:b, s:b, s:I}", "argv", argv, "background", g->background, "pty", g->pty,
                          "started_at_ms", (json_int_t)g->started_at_ms);
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (s)
      log_append(L, l, MOAT_LOG_START, 0, g->pid, g->tag, g->started_at_ms, s, strlen(s));
    free(s);
    break;
  }
  case MOAT_GLOG_DROPPED:
    log_append(L, l, MOAT_LOG_LOST, (uint8_t)g->stream, g->pid, NULL, (int64_t)g->size, NULL, 0);
    break;
  case MOAT_GLOG_EXIT: {
    char s[64];
    int n = snprintf(s, sizeof(s), "{\"exit_code\":%d,\"signal\":%d}", g->exit_code, g->signal);
    log_append(L, l, MOAT_LOG_EXIT, 0, g->pid, NULL, g->exit_code, s, (size_t)n);
    break;
  }
  }
}

/* The sandbox's guest endpoint while its guest can be reached (running or paused). 1 with *ep,
 * 0 while it cannot (creating, hibernated), -1 once it is gone (killed, not in the table). */
static int current_ep(struct moat_control *c, const char *id, struct moat_guest_ep *ep) {
  struct live *e = live_get(c, id);
  if (!e)
    return -1;
  pthread_mutex_lock(&e->m);
  int r = e->state == MOAT_SB_KILLED                                                        ? -1
          : (e->state == MOAT_SB_RUNNING || e->state == MOAT_SB_PAUSED) && e->guest.path[0] ? 1
                                                                                            : 0;
  if (r == 1)
    *ep = e->guest;
  pthread_mutex_unlock(&e->m);
  live_put(c, e);
  return r;
}

struct logger_arg {
  struct ctl_logs *L;
  struct ctl_log *l;
};

static void *logger_run(void *arg) {
  struct logger_arg a = *(struct logger_arg *)arg;
  free(arg);
  struct ctl_logs *L = a.L;
  struct ctl_log *l = a.l;
  struct moat_control *c = L->c;
  while (!logs_stopping(L)) {
    struct moat_guest_ep ep;
    int s = current_ep(c, l->id, &ep);
    if (s <= 0)
      break; /* killed, or without a guest (hibernated): the manager starts one again at wake */
    struct moat_guest_log *g = NULL;
    moat_error *err = NULL;
    pthread_mutex_lock(&L->lock);
    bool held = l->held;
    l->connecting = !held;
    pthread_mutex_unlock(&L->lock);
    if (held) {
      logs_nap(L, MANAGER_TICK_MS); /* until the checkpoint is done (ctl_logs_reattach) */
      continue;
    }
    int orc = moat_guest_log_open(&ep, &g, &err);
    pthread_mutex_lock(&L->lock);
    l->connecting = false;
    held = l->held;
    if (orc == 0 && !held)
      l->gfd = moat_guest_log_fd(g);
    pthread_cond_broadcast(&L->cond);
    pthread_mutex_unlock(&L->lock);
    if (orc < 0 || held) {
      moat_error_free(&err);
      if (orc == 0)
        moat_guest_log_close(g); /* a checkpoint began meanwhile: it must find no connection */
      logs_nap(L, MANAGER_TICK_MS);
      continue;
    }
    while (!logs_stopping(L)) {
      struct moat_guest_log_rec rec;
      int r = moat_guest_log_next(g, &rec, 500, &err);
      if (r == 1) {
        take_guest_rec(L, l, &rec);
        continue;
      }
      if (r < 0 && err && err->status == ETIMEDOUT) {
        moat_error_free(&err);
        continue;
      }
      moat_error_free(&err);
      break;
    }
    pthread_mutex_lock(&L->lock);
    l->gfd = -1;
    pthread_cond_broadcast(&L->cond);
    pthread_mutex_unlock(&L->lock);
    moat_guest_log_close(g);
  }
  writer_close(l);
  pthread_mutex_lock(&L->lock);
  l->ended = true;
  pthread_cond_broadcast(&L->cond);
  pthread_mutex_unlock(&L->lock);
  return NULL;
}

static void add_gone(struct ctl_logs *L, const char *id, int64_t killed_at_ms) {
  struct gone *g = xcalloc(1, sizeof(*g));
  snprintf(g->id, sizeof(g->id), "%s", id);
  g->remove_at_ms = killed_at_ms + L->retention_ms;
  pthread_mutex_lock(&L->lock);
  g->next = L->gone;
  L->gone = g;
  pthread_mutex_unlock(&L->lock);
}

/* A sandbox whose logs are not written any more: removed once its retention ends (now, when the
 * store has no row of it). */
static void schedule_removal(struct ctl_logs *L, const char *id) {
  struct moat_store_sandbox r = {0};
  moat_error *err = NULL;
  int64_t at = 0;
  if (moat_store_sandbox_get(L->c->store, NULL, id, &r, &err) == 0) {
    if (r.state && strcmp(r.state, "killed") != 0) {
      moat_store_sandbox_clear(&r);
      return; /* not killed: a restart's reconcile has not reached it yet */
    }
    at = r.killed_at_ms ? r.killed_at_ms : now_unix_ms();
    moat_store_sandbox_clear(&r);
  }
  moat_error_free(&err);
  add_gone(L, id, at);
}

static void remove_dir(struct ctl_logs *L, const char *id) {
  _cleanup_free_ char *sdir = xasprintf("%s/%s", L->dir, id);
  DIR *d = opendir(sdir);
  if (d) {
    struct dirent *de;
    while ((de = readdir(d)))
      if (de->d_name[0] != '.') {
        _cleanup_free_ char *p = xasprintf("%s/%s", sdir, de->d_name);
        unlink(p);
      }
    closedir(d);
  }
  if (rmdir(sdir) == 0)
    log_info("sandbox %s: logs removed (retention over)", id);
}

static bool is_live(struct moat_control *c, const char *id) {
  struct live *e = live_get(c, id);
  if (e)
    live_put(c, e);
  return e != NULL;
}

/* Sets the live entry's logged mark (c->lock); false when id is not live any more. */
static bool mark_logged(struct moat_control *c, const char *id, bool logged) {
  struct live *e = live_get(c, id);
  if (!e)
    return false;
  pthread_mutex_lock(&c->lock);
  e->logged = logged;
  pthread_mutex_unlock(&c->lock);
  live_put(c, e);
  return true;
}

/* Joins the loggers that ended; a sandbox's own ends when it is killed or loses its guest
 * (hibernate), so a hibernated sandbox holds no thread. Then starts one for every running or
 * paused sandbox without one. One pass is linear in the live sandboxes: the live entries carry
 * their mark, and only the sandboxes that get a logger are looked up further. */
static void manage_loggers(struct ctl_logs *L) {
  struct moat_control *c = L->c;
  for (;;) {
    struct ctl_log *done = NULL;
    pthread_mutex_lock(&L->lock);
    for (struct ctl_log **pp = &L->list; *pp; pp = &(*pp)->next)
      if ((*pp)->ended) {
        done = *pp;
        *pp = done->next;
        break;
      }
    pthread_mutex_unlock(&L->lock);
    if (!done)
      break;
    pthread_join(done->thread, NULL);
    if (!mark_logged(c, done->id, false))
      schedule_removal(L, done->id); /* its files wait for their retention */
    pthread_mutex_destroy(&done->wm);
    free(done);
  }
  size_t n = 0, cap = 64;
  char(*ids)[MOAT_ID_LEN + 1] = xmalloc(cap * sizeof(*ids));
  pthread_mutex_lock(&c->lock);
  for (size_t b = 0; b < NBUCKETS; b++)
    for (struct live *e = c->buckets[b]; e; e = e->next) {
      if (e->logged)
        continue;
      if (n == cap) {
        cap *= 2;
        ids = xrealloc(ids, cap * sizeof(*ids));
      }
      memcpy(ids[n++], e->id, sizeof(ids[0]));
    }
  pthread_mutex_unlock(&c->lock);
  for (size_t i = 0; i < n; i++) {
    struct moat_guest_ep ep;
    if (current_ep(c, ids[i], &ep) != 1)
      continue; /* creating, hibernated or killed: nothing to read */
    pthread_mutex_lock(&L->lock);
    /* a sandbox that comes back (a wake after moatd restarted) is no longer to be removed */
    for (struct gone **pg = &L->gone; *pg;)
      if (strcmp((*pg)->id, ids[i]) == 0) {
        struct gone *g = *pg;
        *pg = g->next;
        free(g);
      } else {
        pg = &(*pg)->next;
      }
    pthread_mutex_unlock(&L->lock);
    struct ctl_log *l = xcalloc(1, sizeof(*l));
    snprintf(l->id, sizeof(l->id), "%s", ids[i]);
    l->fd = -1;
    l->gfd = -1;
    pthread_mutex_init(&l->wm, NULL);
    struct logger_arg *a = xmalloc(sizeof(*a));
    *a = (struct logger_arg){L, l};
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setstacksize(&at, LOGGER_STACK); /* one thread per running sandbox */
    int rc = pthread_create(&l->thread, &at, logger_run, a);
    pthread_attr_destroy(&at);
    if (rc != 0) {
      free(a);
      pthread_mutex_destroy(&l->wm);
      free(l);
      continue;
    }
    pthread_mutex_lock(&L->lock);
    l->next = L->list;
    L->list = l;
    pthread_mutex_unlock(&L->lock);
    mark_logged(c, ids[i], true); /* a sandbox gone meanwhile: its logger ends by itself */
  }
  free(ids);
}

static void prune(struct ctl_logs *L) {
  int64_t now = now_unix_ms();
  for (;;) {
    struct gone *due = NULL;
    pthread_mutex_lock(&L->lock);
    for (struct gone **pg = &L->gone; *pg; pg = &(*pg)->next)
      if ((*pg)->remove_at_ms <= now) {
        due = *pg;
        *pg = due->next;
        break;
      }
    pthread_mutex_unlock(&L->lock);
    if (!due)
      return;
    if (!is_live(L->c, due->id))
      remove_dir(L, due->id);
    free(due);
  }
}

static void *manager_main(void *arg) {
  struct ctl_logs *L = arg;
  /* logs of sandboxes that are not live any more (killed while moatd was down, or before) */
  DIR *d = opendir(L->dir);
  if (d) {
    struct dirent *de;
    while ((de = readdir(d)))
      if (de->d_name[0] != '.' && strlen(de->d_name) <= MOAT_ID_LEN && !is_live(L->c, de->d_name))
        schedule_removal(L, de->d_name);
    closedir(d);
  }
  pthread_mutex_lock(&L->lock);
  while (!L->stop) {
    pthread_mutex_unlock(&L->lock);
    manage_loggers(L);
    prune(L);
    pthread_mutex_lock(&L->lock);
    struct timespec ts;
    deadline_in(&ts, MANAGER_TICK_MS);
    if (!L->stop)
      pthread_cond_timedwait(&L->cond, &L->lock, &ts);
  }
  pthread_mutex_unlock(&L->lock);
  /* every logger sees stop within its poll */
  for (struct ctl_log *l = L->list, *next; l; l = next) {
    next = l->next;
    pthread_join(l->thread, NULL);
    pthread_mutex_destroy(&l->wm);
    free(l);
  }
  L->list = NULL;
  return NULL;
}

int ctl_logs_open(struct moat_control *c, uint64_t max_bytes, uint64_t retention_s, moat_error **err) {
  struct ctl_logs *L = xcalloc(1, sizeof(*L));
  L->c = c;
  L->dir = xasprintf("%s/logs", c->data_dir);
  L->max_bytes = max_bytes ? max_bytes : DEFAULT_LOG_MAX;
  L->retention_ms = (int64_t)(retention_s ? retention_s : DEFAULT_RETENTION_S) * 1000;
  pthread_mutex_init(&L->lock, NULL);
  pthread_cond_init(&L->cond, NULL);
  c->logs = L;
  if (mkdir(L->dir, 0700) < 0 && errno != EEXIST)
    return moat_error_errno(err, "mkdir %s", L->dir);
  return 0;
}

int ctl_logs_start(struct moat_control *c, moat_error **err) {
  struct ctl_logs *L = c->logs;
  if (pthread_create(&L->manager, NULL, manager_main, L) != 0)
    return moat_error_set(err, EAGAIN, "start the log manager thread");
  L->started = true;
  return 0;
}

void ctl_logs_close(struct moat_control *c) {
  struct ctl_logs *L = c->logs;
  if (!L)
    return;
  pthread_mutex_lock(&L->lock);
  __atomic_store_n(&L->stop, true, __ATOMIC_RELAXED);
  pthread_cond_broadcast(&L->cond);
  pthread_mutex_unlock(&L->lock);
  if (L->started)
    pthread_join(L->manager, NULL);
  for (struct gone *g = L->gone, *next; g; g = next) {
    next = g->next;
    free(g);
  }
  pthread_mutex_destroy(&L->lock);
  pthread_cond_destroy(&L->cond);
  free(L->dir);
  free(L);
  c->logs = NULL;
}

void ctl_logs_detach(struct moat_control *c, const char *id) {
  struct ctl_logs *L = c->logs;
  if (!L)
    return;
  struct timespec ts;
  deadline_in(&ts, 2000);
  pthread_mutex_lock(&L->lock);
  for (;;) {
    struct ctl_log *l = L->list;
    while (l && (strcmp(l->id, id) != 0 || l->ended))
      l = l->next;
    if (!l)
      break;
    l->held = true; /* no new connection until ctl_logs_reattach */
    if (l->gfd < 0 && !l->connecting)
      break;
    if (l->gfd >= 0)
      shutdown(l->gfd, SHUT_RDWR); /* the logger's wait ends; it clears gfd, then closes */
    if (pthread_cond_timedwait(&L->cond, &L->lock, &ts) == ETIMEDOUT)
      break;
  }
  pthread_mutex_unlock(&L->lock);
}

void ctl_logs_reattach(struct moat_control *c, const char *id) {
  struct ctl_logs *L = c->logs;
  if (!L)
    return;
  pthread_mutex_lock(&L->lock);
  for (struct ctl_log *l = L->list; l; l = l->next)
    if (strcmp(l->id, id) == 0)
      l->held = false;
  pthread_cond_broadcast(&L->cond);
  pthread_mutex_unlock(&L->lock);
}

int ctl_logs_connected(struct moat_control *c, const char *id) {
  struct ctl_logs *L = c->logs;
  if (!L)
    return 0;
  int n = 0;
  pthread_mutex_lock(&L->lock);
  for (struct ctl_log *l = L->list; l; l = l->next)
    if (strcmp(l->id, id) == 0 && !l->ended && l->gfd >= 0)
      n = 1;
  pthread_mutex_unlock(&L->lock);
  return n;
}

void ctl_logs_note_oom(struct moat_control *c, const char *id, json_t *ev) {
  struct ctl_logs *L = c->logs;
  if (!L || !L->started) /* logs off */
    return;
  json_t *d = json_deep_copy(ev);
  json_object_del(d, "kind");
  json_object_del(d, "time_ms");
  char *s = json_dumps(d, JSON_COMPACT);
  json_decref(d);
  if (!s)
    return;
  struct ctl_log *l = NULL;
  pthread_mutex_lock(&L->lock);
  for (struct ctl_log *x = L->list; x && !l; x = x->next)
    if (strcmp(x->id, id) == 0 && !x->ended) {
      l = x;
      pthread_mutex_lock(&l->wm); /* the list's lock, then a writer's: never the other way */
    }
  pthread_mutex_unlock(&L->lock);
  if (l) {
    append_locked(L, l, MOAT_LOG_OOM, 0, 0, NULL, 0, s, strlen(s));
    pthread_mutex_unlock(&l->wm);
  } else { /* its logger has not started, or has ended: a writer of its own */
    struct ctl_log tmp = {.fd = -1};
    snprintf(tmp.id, sizeof(tmp.id), "%s", id);
    append_locked(L, &tmp, MOAT_LOG_OOM, 0, 0, NULL, 0, s, strlen(s));
    if (tmp.fd >= 0)
      close(tmp.fd);
  }
  free(s);
}

/* ---- readers (control.h) ---- */

struct moat_log_reader {
  struct ctl_logs *L;
  char id[MOAT_ID_LEN + 1];
  char *sdir;
  bool marker_done;
  uint64_t seq; /* the segment being read (0: none yet) */
  int fd;
  uint64_t off;
  uint8_t *buf;
  size_t cap;
  char tag[256];
};

int moat_control_logs_open(struct moat_control *c, const char *org, const char *id,
                           struct moat_log_reader **out, bool *ended, moat_error **err) {
  *out = NULL;
  struct moat_store_sandbox r = {0};
  if (moat_store_sandbox_get(c->store, org, id, &r, err) < 0)
    return -1;
  bool killed = r.state && strcmp(r.state, "killed") == 0;
  int64_t killed_at = r.killed_at_ms;
  moat_store_sandbox_clear(&r);
  struct ctl_logs *L = c->logs;
  if (killed && killed_at + L->retention_ms <= now_unix_ms())
    return moat_error_set(err, ENOENT,
                          "the logs of sandbox %s were removed: it was killed more than %lld s ago", id,
                          (long long)(L->retention_ms / 1000));
  struct moat_log_reader *lr = xcalloc(1, sizeof(*lr));
  lr->L = L;
  snprintf(lr->id, sizeof(lr->id), "%s", id);
  lr->sdir = xasprintf("%s/%s", L->dir, id);
  lr->fd = -1;
  *out = lr;
  if (ended)
    *ended = killed;
  return 0;
}

/* The next segment to read after seq (the lowest there is when the reader fell behind). */
static int reader_advance(struct moat_log_reader *lr) {
  uint64_t lo = 0, hi = 0;
  if (!seg_range(lr->sdir, &lo, &hi))
    return 0;
  uint64_t want = lr->seq + 1;
  if (lr->seq == 0 || want < lo)
    want = lo;
  if (want > hi)
    return 0;
  _cleanup_free_ char *p = seg_path(lr->L->dir, lr->id, want);
  int fd = open(p, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return 0;
  if (lr->fd >= 0)
    close(lr->fd);
  lr->fd = fd;
  lr->seq = want;
  lr->off = 0;
  return 1;
}

int moat_log_reader_next(struct moat_log_reader *lr, struct moat_log_rec *rec, moat_error **err) {
  memset(rec, 0, sizeof(*rec));
  if (!lr->marker_done) {
    lr->marker_done = true;
    uint64_t d = read_dropped(lr->sdir);
    if (d) {
      rec->kind = MOAT_LOG_DROPPED;
      rec->value = (int64_t)d;
      return 1;
    }
  }
  for (;;) {
    if (lr->fd < 0 && !reader_advance(lr))
      return 0;
    struct rec_hdr h;
    ssize_t r = pread(lr->fd, &h, sizeof(h), (off_t)lr->off);
    if (r == (ssize_t)sizeof(h) && h.magic == REC_MAGIC && h.len >= sizeof(h)) {
      size_t body = h.len - sizeof(h);
      if (body > lr->cap) {
        lr->cap = body;
        lr->buf = xrealloc(lr->buf, body);
      }
      if (pread(lr->fd, lr->buf, body, (off_t)(lr->off + sizeof(h))) == (ssize_t)body && h.tag_len <= body) {
        lr->off += h.len;
        memcpy(lr->tag, lr->buf, h.tag_len);
        lr->tag[h.tag_len] = '\0';
        rec->kind = (enum moat_log_kind)h.kind;
        rec->stream = h.stream;
        rec->pid = h.pid;
        rec->at_ms = h.at_ms;
        rec->value = h.value;
        rec->tag = h.tag_len ? lr->tag : NULL;
        rec->data = lr->buf + h.tag_len;
        rec->len = body - h.tag_len;
        return 1;
      }
    }
    /* the end of this segment (or a record being written): a newer segment means this one is done */
    uint64_t save_seq = lr->seq;
    int save_fd = lr->fd;
    lr->fd = -1;
    if (reader_advance(lr) && lr->seq != save_seq) {
      close(save_fd);
      continue;
    }
    lr->fd = save_fd;
    lr->seq = save_seq;
    return 0;
  }
}

void moat_log_reader_close(struct moat_log_reader *lr) {
  if (!lr)
    return;
  if (lr->fd >= 0)
    close(lr->fd);
  free(lr->sdir);
  free(lr->buf);
  free(lr);
}

bool moat_control_logs_writing(struct moat_control *c, const char *id) {
  struct ctl_logs *L = c->logs;
  bool w = false;
  pthread_mutex_lock(&L->lock);
  for (struct ctl_log *l = L->list; l && !w; l = l->next)
    w = strcmp(l->id, id) == 0 && !l->ended;
  pthread_mutex_unlock(&L->lock);
  return w || is_live(c, id);
}

uint64_t moat_control_logs_wait(struct moat_control *c, uint64_t seen, int timeout_ms) {
  struct ctl_logs *L = c->logs;
  pthread_mutex_lock(&L->lock);
  if (L->seq == seen && timeout_ms > 0 && !L->stop) {
    struct timespec ts;
    deadline_in(&ts, timeout_ms);
    pthread_cond_timedwait(&L->cond, &L->lock, &ts);
  }
  uint64_t s = L->seq;
  pthread_mutex_unlock(&L->lock);
  return s;
}

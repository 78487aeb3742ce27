/* databases.c -- an org's PostgreSQL databases: a row, a volume for the data directory and a
 * persistent sandbox of the `postgres` template running the server (control.h, "databases") */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../common/buf.h"
#include "../common/crashpoint.h"
#include "../common/log.h"
#include "../common/util.h"
#include "../host/net/net.h"
#include "control_internal.h"

#define DB_TEMPLATE "postgres"
#define DB_MOUNT "/var/lib/postgresql/data" /* the volume's mount point in the sandbox */
#define DB_PGDATA DB_MOUNT "/pgdata"        /* the cluster: made whole by initdb, then renamed */
#define DB_META_KEY "moat.database"         /* the sandbox's metadata names its database */
#define DB_READY_TIMEOUT_MS 60000           /* initdb + first start, or a start after a crash */
#define DB_CONNECT_TIMEOUT_MS 30000         /* moat_control_database_connect's default */
#define DB_PASSWORD_LEN 32
#define DB_REPAIR_STACK (8u << 20) /* a connect that wakes or starts a server runs on a stack this big */
#define DB_SANDBOX_MEMORY_MB 1024
#define DB_SANDBOX_CPU 1.0
#define DB_SANDBOX_DISK_MB 1024 /* the server's writable layer; the data is on the volume */

/* One database's connection count and idle clock (c->db_lock, a leaf), and the mutex that
 * serialises starting its server (held across sandbox and guest calls: never under another lock).
 * Entries live until close: an id is never reused. */
struct ctl_db {
  char id[MOAT_DB_ID_LEN + 1];
  int conns;
  int64_t idle_since_ms; /* last close, connect or start */
  pthread_mutex_t start;
  struct ctl_db *next;
};

/* Hands e to *err (or frees it when the caller takes none, or has one). */
static void take_error(moat_error **err, moat_error *e) {
  if (err && !*err)
    *err = e;
  else
    moat_error_free(&e);
}

/* ---- the in-memory table ---- */

static struct ctl_db *db_entry(struct moat_control *c, const char *id) {
  pthread_mutex_lock(&c->db_lock);
  struct ctl_db *d = c->dbs;
  while (d && strcmp(d->id, id) != 0)
    d = d->next;
  if (!d) {
    d = xcalloc(1, sizeof(*d));
    snprintf(d->id, sizeof(d->id), "%s", id);
    d->idle_since_ms = now_unix_ms();
    pthread_mutex_init(&d->start, NULL);
    d->next = c->dbs;
    c->dbs = d;
  }
  pthread_mutex_unlock(&c->db_lock);
  return d;
}

static void db_touch(struct moat_control *c, struct ctl_db *d) {
  pthread_mutex_lock(&c->db_lock);
  d->idle_since_ms = now_unix_ms();
  pthread_mutex_unlock(&c->db_lock);
}

void moat_control_database_conn_event(struct moat_control *c, const char *id, int delta) {
  if (!id || strncmp(id, "db-", 3) != 0 || strlen(id) > MOAT_DB_ID_LEN)
    return;
  struct ctl_db *d = db_entry(c, id);
  pthread_mutex_lock(&c->db_lock);
  d->conns += delta;
  if (d->conns < 0)
    d->conns = 0;
  d->idle_since_ms = now_unix_ms();
  int now = d->conns;
  pthread_mutex_unlock(&c->db_lock);
  ctl_db_event(c, id, "connection", json_pack("{sbsi}", "opened", delta > 0, "connections", now));
}

static int db_conns(struct moat_control *c, const char *id) {
  int n = 0;
  pthread_mutex_lock(&c->db_lock);
  for (struct ctl_db *d = c->dbs; d; d = d->next)
    if (strcmp(d->id, id) == 0)
      n = d->conns;
  pthread_mutex_unlock(&c->db_lock);
  return n;
}

/* ---- infos ---- */

void moat_database_info_clear(struct moat_database_info *d) {
  if (!d)
    return;
  free(d->org);
  free(d->name);
  free(d->state);
  json_decref(d->metadata);
  free(d->role);
  free(d->password);
  free(d->database);
  free(d->volume);
  free(d->sandbox_id);
  memset(d, 0, sizeof(*d));
}

void moat_database_infos_free(struct moat_database_info *v, size_t n) {
  for (size_t i = 0; v && i < n; i++)
    moat_database_info_clear(&v[i]);
  free(v);
}

bool moat_database_name_valid(const char *s) {
  size_t n = s ? strlen(s) : 0;
  if (n == 0 || n > 63)
    return false;
  for (size_t i = 0; i < n; i++) {
    char ch = s[i];
    bool alnum = (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9');
    if (!alnum && (i == 0 || (ch != '_' && ch != '-')))
      return false;
  }
  return true;
}

/* The state the API shows: the row's, or for a database past its create, its sandbox's
 * ("running", "hibernated", "paused"; "stopped" when the sandbox is gone: the next connect starts
 * the server again). */
static char *shown_state(struct moat_control *c, const struct moat_store_database *r) {
  if (strcmp(r->state, "running") != 0 || !r->sandbox_id)
    return xstrdup(r->state);
  struct moat_sandbox_info sb = {0};
  moat_error *e = NULL;
  if (moat_control_get(c, r->org, r->sandbox_id, &sb, &e) < 0) {
    moat_error_free(&e);
    return xstrdup("stopped");
  }
  const char *st = sb.state == MOAT_SB_KILLED ? "stopped" : moat_sandbox_state_name(sb.state);
  char *ret = xstrdup(st);
  moat_sandbox_info_clear(&sb);
  return ret;
}

static void info_of(struct moat_control *c, const struct moat_store_database *r,
                    struct moat_database_info *out) {
  memset(out, 0, sizeof(*out));
  snprintf(out->id, sizeof(out->id), "%s", r->id);
  out->org = xstrdup(r->org);
  out->name = xstrdup(r->name);
  out->state = shown_state(c, r);
  out->size_mb = r->size_mb;
  out->idle_seconds = r->idle_seconds;
  out->metadata = parse_object(r->metadata_json);
  out->created_at_ms = r->created_at_ms;
  out->role = xstrdup(r->role);
  out->password = xstrdup(r->password);
  out->database = xstrdup(r->role);
  out->volume = xstrdup(r->volume);
  out->sandbox_id = r->sandbox_id ? xstrdup(r->sandbox_id) : NULL;
  out->connections = db_conns(c, r->id);
}

const char *moat_control_db_host(const struct moat_control *c) { return c->db_host; }
unsigned moat_control_db_port(const struct moat_control *c) {
  return __atomic_load_n(&c->db_port, __ATOMIC_RELAXED);
}

void moat_control_set_db_port(struct moat_control *c, unsigned port) {
  if (port)
    __atomic_store_n(&c->db_port, port, __ATOMIC_RELAXED);
}

char *moat_database_url_format(const char *host, unsigned port, const char *role, const char *password,
                               const char *database) {
  bool v6 = strchr(host, ':') != NULL;
  return xasprintf("postgresql://%s:%s@%s%s%s:%u/%s?sslmode=disable", role, password, v6 ? "[" : "", host,
                   v6 ? "]" : "", port, database);
}

char *moat_control_database_url(const struct moat_control *c, const struct moat_database_info *d) {
  return moat_database_url_format(c->db_host, moat_control_db_port(c), d->role, d->password, d->database);
}

char *moat_control_database_sandbox_url(const struct moat_control *c, const struct moat_database_info *d) {
  unsigned port = __atomic_load_n(&c->db_sandbox_port, __ATOMIC_ACQUIRE);
  return port ? moat_database_url_format(c->db_sandbox_host, port, d->role, d->password, d->database) : NULL;
}

int moat_control_database_listen_sandboxes(struct moat_control *c, moat_error **err) {
  struct moat_net *net = moat_host_net(c->host);
  if (!net)
    return moat_error_set(err, ENODEV, "this moatd has no sandbox networking: sandboxes have loopback only");
  if (__atomic_load_n(&c->db_sandbox_port, __ATOMIC_ACQUIRE))
    return moat_error_set(err, EALREADY, "the in-sandbox database listener is open already");
  int fd = moat_net_listen_tcp(net, MOAT_DB_SANDBOX_PORT, 0, err);
  if (fd < 0)
    return moat_error_wrap(err, "the database proxy's in-sandbox listener");
  moat_net_service_address(net, c->db_sandbox_host);
  __atomic_store_n(&c->db_sandbox_port, MOAT_DB_SANDBOX_PORT, __ATOMIC_RELEASE);
  return fd;
}

int ctl_databases_config(struct moat_control *c, const char *listen, moat_error **err) {
  const char *l = listen && listen[0] ? listen : "127.0.0.1:7432";
  const char *colon = strrchr(l, ':');
  char *end = NULL;
  unsigned long port = colon ? strtoul(colon + 1, &end, 10) : 0;
  if (!colon || colon == l || !end || *end || colon[1] == '\0' || port > 65535)
    return moat_error_set(err, EINVAL, "--db-listen: '%.128s' is not HOST:PORT", l);
  const char *h = l;
  size_t hl = (size_t)(colon - l);
  if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') {
    h++;
    hl -= 2;
  }
  c->db_host = xstrndup(h, hl);
  c->db_port = (unsigned)port;
  return 0;
}

/* The URL a sandbox given d gets in its env. A sandbox reaches the proxy on the service address of
 * its network (its loopback is its own); without sandbox networking nothing in it reaches a
 * database: the host's URL, as shown. */
static char *attach_url(struct moat_control *c, const struct moat_database_info *d) {
  char *url = moat_control_database_sandbox_url(c, d);
  return url ? url : moat_control_database_url(c, d);
}

json_t *ctl_databases_env(struct moat_control *c, const char *org, const struct moat_sandbox_spec *spec,
                          moat_error **err) {
  if (spec->n_databases > MOAT_MAX_SANDBOX_DATABASES) {
    moat_error_set(err, EINVAL, "databases: at most %d", MOAT_MAX_SANDBOX_DATABASES);
    return NULL;
  }
  json_t *env = spec->env ? json_deep_copy(spec->env) : json_object();
  for (size_t i = 0; i < spec->n_databases; i++) {
    const struct moat_database_attach *a = &spec->databases[i];
    struct moat_database_info d;
    if (!a->id || !a->env || moat_control_database_get(c, org, a->id, &d, err) < 0) {
      if (!a->id || !a->env)
        moat_error_set(err, EINVAL, "databases[%zu]: needs an id and an env name", i);
      else
        moat_error_wrap(err, "databases[%zu]", i);
      json_decref(env);
      return NULL;
    }
    char *url = attach_url(c, &d);
    json_object_set_new(env, a->env, json_string(url));
    free(url);
    moat_database_info_clear(&d);
  }
  return env;
}

/* ---- the server ---- */

/* Makes the cluster on the volume unless it is there (initdb as postgres, the org's role and its
 * database in single-user mode, then one rename: a cut-short initdb leaves only pgdata.new, which
 * the next attempt removes). $1 is the role; the role's password comes on stdin. */
static const char init_script[] =
    "set -eu\n"
    "D=" DB_PGDATA "\n"
    "chown postgres:postgres " DB_MOUNT "\n"
    "chmod 0700 " DB_MOUNT "\n"
    "if [ -s \"$D/PG_VERSION\" ]; then exit 0; fi\n"
    "read -r PW\n"
    "rm -rf \"$D.new\"\n"
    "install -d -o postgres -g postgres -m 0700 \"$D.new\"\n"
    "SU=$(mktemp)\n"
    "head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \\n' > \"$SU\"\n" /* a superuser password no one keeps */
    "chown postgres \"$SU\"\n"
    "runuser -u postgres -- initdb -D \"$D.new\" -U postgres --auth=scram-sha-256 --pwfile=\"$SU\" "
    "--encoding=UTF8 --locale=C.UTF-8 >/dev/null\n"
    "rm -f \"$SU\"\n"
    "cat >> \"$D.new/postgresql.conf\" <<'EOF'\n"
    "listen_addresses = '127.0.0.1'\n"
    "port = 5432\n"
    "unix_socket_directories = ''\n"
    "fsync = on\n"
    "synchronous_commit = on\n"
    "full_page_writes = on\n"
    "huge_pages = off\n"
    "EOF\n"
    "printf 'host %s %s 127.0.0.1/32 scram-sha-256\\n' \"$1\" \"$1\" > \"$D.new/pg_hba.conf\"\n"
    "printf \"CREATE ROLE %s LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD '%s';\\n"
    "CREATE DATABASE %s OWNER %s;\\n\" \"$1\" \"$PW\" \"$1\" \"$1\" |"
    " runuser -u postgres -- postgres --single -D \"$D.new\" postgres >/dev/null\n"
    "sync\n"
    "mv \"$D.new\" \"$D\"\n"
    "sync\n";

/* A branch's first start: the cluster copied from its source takes the branch's role, database and
 * password (single-user mode, after the crash recovery a copy of a live cluster needs), and
 * pg_hba.conf admits the branch's role only. $1 is the branch's role, $2 the source's; the
 * password comes on stdin. Single-user mode reports a failed statement without failing: its
 * ERROR line fails the script. */
static const char rename_script[] =
    "set -eu\n"
    "D=" DB_PGDATA "\n"
    "read -r PW\n"
    "rm -f \"$D/postmaster.pid\"\n" /* the source's server was live when the copy was taken */
    "printf 'host %s %s 127.0.0.1/32 scram-sha-256\\n' \"$1\" \"$1\" > \"$D/pg_hba.conf\"\n"
    "OUT=$(printf \"ALTER ROLE %s RENAME TO %s;\\nALTER ROLE %s PASSWORD '%s';\\n"
    "ALTER DATABASE %s RENAME TO %s;\\n\" \"$2\" \"$1\" \"$1\" \"$PW\" \"$2\" \"$1\" |"
    " runuser -u postgres -- postgres --single -D \"$D\" -c recovery_init_sync_method=syncfs postgres"
    " 2>&1 >/dev/null)\n"
    "if printf '%s\\n' \"$OUT\" | grep -E '^(ERROR|FATAL|PANIC):' >&2; then exit 1; fi\n"
    "sync\n";

static int db_exec(struct moat_control *c, const struct moat_store_database *r, char **argv, const char *user,
                   const char *stdin_data, uint32_t timeout_ms, struct moat_exec_result *res,
                   moat_error **err) {
  struct moat_exec_req req = {.argv = argv,
                              .user = user,
                              .cwd = "/",
                              .timeout_ms = timeout_ms,
                              .max_output = 8192,
                              .stdin_data = stdin_data,
                              .stdin_len = stdin_data ? strlen(stdin_data) : 0};
  memset(res, 0, sizeof(*res));
  return moat_control_exec(c, r->org, r->sandbox_id, &req, res, err);
}

/* 0 when the command exited 0, else -1 EIO with what it said. */
static int db_run(struct moat_control *c, const struct moat_store_database *r, char **argv, const char *user,
                  const char *stdin_data, uint32_t timeout_ms, const char *what, moat_error **err) {
  struct moat_exec_result res;
  if (db_exec(c, r, argv, user, stdin_data, timeout_ms, &res, err) < 0)
    return moat_error_wrap(err, "%s", what);
  int ret = 0;
  if (res.exit_code != 0 || res.timed_out)
    ret = moat_error_set(err, EIO, "%s: %s%d: %.400s", what, res.timed_out ? "timed out, exit " : "exit ",
                         res.exit_code, res.err_len ? res.err : (res.out ? res.out : ""));
  moat_exec_result_free(&res);
  return ret;
}

/* Whether the background process pid has ended; then said gets the end of its output (its last
 * three lines, as PostgreSQL logs them: "LOG: ... FATAL: ..."). */
static bool server_exited(const struct moat_guest_ep *ep, int pid, char *said, size_t len) {
  struct moat_proc_stream *s = NULL;
  struct moat_proc_info info;
  memset(&info, 0, sizeof(info));
  moat_error *e = NULL;
  snprintf(said, len, "(it said nothing)");
  if (moat_guest_attach(ep, pid, NULL, true, &s, &info, &e) < 0) {
    bool gone = e && e->status == ESRCH;
    moat_error_free(&e);
    return gone;
  }
  bool exited = !info.running;
  moat_proc_info_clear(&info);
  struct moat_buf out = {0};
  struct moat_proc_event ev;
  while (exited && moat_proc_stream_next(s, &ev, 200, &e) > 0 && ev.type != MOAT_PROC_EXIT)
    if (ev.type == MOAT_PROC_STDOUT || ev.type == MOAT_PROC_STDERR)
      moat_buf_append(&out, ev.data, ev.len);
  moat_error_free(&e);
  moat_proc_stream_close(s);
  if (out.len) {
    while (out.len && (out.p[out.len - 1] == '\n' || out.p[out.len - 1] == '\r'))
      out.p[--out.len] = '\0';
    /* its last three lines, one after the other */
    char *from = out.p + out.len;
    for (int lines = 0; lines < 3 && from > out.p; lines++) {
      char *nl = memrchr(out.p, '\n', (size_t)(from - out.p));
      if (lines > 0 && from < out.p + out.len)
        *from = ' '; /* the newline that ended this line */
      from = nl ? nl : out.p;
    }
    snprintf(said, len, "%s", from + (*from == '\n'));
  }
  free(out.p);
  return exited;
}

/* Starts the server in r's sandbox as a background process tagged "postgres", and waits until
 * pg_isready answers; a server that exits before that fails the start at once, with its last
 * words. The postmaster.pid a killed server left is removed first unless a postgres process runs
 * (one starting: this one then fails on the lock and the other is waited for): PostgreSQL takes
 * a pid file whose pid is alive for a live server's, and in the sandbox's pid namespace, restored
 * by CRIU or not, the dead server's pid is soon another process's. */
static int db_start_server(struct moat_control *c, const struct moat_store_database *r, moat_error **err) {
  char *rm[] = {"sh", "-c", "pgrep -x postgres >/dev/null || rm -f " DB_PGDATA "/postmaster.pid", NULL};
  if (db_run(c, r, rm, NULL, NULL, 10000, "remove a stale postmaster.pid", err) < 0)
    return -1;
  _cleanup_free_ struct moat_guest_ep *ep = NULL;
  if (moat_control_guest(c, r->org, r->sandbox_id, &ep, NULL, err) < 0)
    return -1;
  /* after a crash (a kill, a copy of a live cluster) the data directory is synced once with syncfs
   * (its own file system: the volume) rather than file by file */
  char *argv[] = {"postgres", "-D", DB_PGDATA, "-c", "recovery_init_sync_method=syncfs", NULL};
  struct moat_exec_req req = {.argv = argv, .user = "postgres", .cwd = "/"};
  struct moat_exec_opts opts = {.background = true, .tag = "postgres"};
  struct moat_proc_stream *ps = NULL;
  int pid = 0;
  if (moat_guest_exec_start(ep, &req, &opts, &ps, &pid, err) < 0)
    return moat_error_wrap(err, "start postgres");
  moat_proc_stream_close(ps);
  uint64_t deadline = now_ns() + (uint64_t)DB_READY_TIMEOUT_MS * 1000000ull;
  char *check[] = {"pg_isready", "-q", "-h", "127.0.0.1", "-p", "5432", "-t", "5", NULL};
  char said[512];
  for (;;) {
    struct moat_exec_result res;
    moat_error *e = NULL;
    int rc = db_exec(c, r, check, "postgres", NULL, 10000, &res, &e);
    bool ready = rc == 0 && res.exit_code == 0;
    if (rc == 0)
      moat_exec_result_free(&res);
    moat_error_free(&e);
    if (ready)
      return 0;
    if (server_exited(ep, pid, said, sizeof(said))) {
      /* on another's lock (one starting): that one is waited for; else it failed */
      char *other[] = {"pgrep", "-x", "postgres", NULL};
      if (db_run(c, r, other, NULL, NULL, 10000, "pgrep", &e) < 0) {
        moat_error_free(&e);
        return moat_error_set(err, EIO, "postgres exited before it was ready: %s", said);
      }
    }
    if (now_ns() > deadline)
      return moat_error_set(err, EIO, "postgres did not become ready in %d s", DB_READY_TIMEOUT_MS / 1000);
    usleep(50 * 1000);
  }
}

/* The sandbox of r made by a create or restart that did not get to record it (moatd died), or
 * NULL. Caller frees. */
static char *db_find_sandbox(struct moat_control *c, const struct moat_store_database *r) {
  _cleanup_json_ json_t *meta = json_pack("{ss}", DB_META_KEY, r->id);
  struct moat_sandbox_info *v = NULL;
  size_t n = 0;
  moat_error *e = NULL;
  if (moat_control_list(c, r->org, NULL, meta, &v, &n, &e) < 0) {
    moat_error_free(&e);
    return NULL;
  }
  char *id = n ? xstrdup(v[0].id) : NULL;
  moat_sandbox_infos_free(v, n);
  return id;
}

/* Kills r's recorded sandbox and any other one made for it. Logged, not failed. */
static void db_kill_sandboxes(struct moat_control *c, const struct moat_store_database *r) {
  for (int round = 0; round < 4; round++) {
    _cleanup_free_ char *sid = r->sandbox_id && round == 0 ? xstrdup(r->sandbox_id) : db_find_sandbox(c, r);
    if (!sid)
      return;
    moat_error *e = NULL;
    if (moat_control_kill(c, r->org, sid, "api", &e) < 0 && e->status != ENOENT)
      log_warn("database %s: kill its sandbox %s: %s", r->id, sid, moat_error_msg(e));
    moat_error_free(&e);
  }
}

/* A new sandbox for r mounting its volume (r->sandbox_id replaced, and recorded), the cluster made
 * when the volume has none (or, with from_role, the copied cluster of from_role's database renamed
 * as r's: a branch's first start), and the server started. d->start held. */
static int db_new_server(struct moat_control *c, struct moat_store_database *r, const char *from_role,
                         moat_error **err) {
  _cleanup_json_ json_t *meta = json_pack("{ss}", DB_META_KEY, r->id);
  /* loopback only: moatd reaches the server through the sandbox's loopback, it needs no network */
  _cleanup_json_ json_t *net = json_pack("{sb}", "internet", 0);
  struct moat_sandbox_spec spec = {
      .template_name = DB_TEMPLATE,
      .persistent = true,
      .metadata = meta,
      .network = net,
      .limits = {.cpu = DB_SANDBOX_CPU, .memory_mb = DB_SANDBOX_MEMORY_MB, .disk_mb = DB_SANDBOX_DISK_MB},
      .volumes = {{.name = r->volume, .path = DB_MOUNT, .read_only = false}},
      .n_volumes = 1,
  };
  struct moat_sandbox_info sb = {0};
  uint64_t t0 = now_ns(), t_made = 0, t_renamed = 0, t_init = 0;
  if (moat_control_create(c, r->org, &spec, &sb, err) < 0)
    return moat_error_wrap(err, "database %s: its sandbox", r->id);
  t_made = now_ns();
  free(r->sandbox_id);
  r->sandbox_id = xstrdup(sb.id);
  moat_sandbox_info_clear(&sb);
  moat_crash_point("db_sandbox_made");
  char *init[] = {"sh", "-c", (char *)init_script, "sh", r->role, NULL};
  _cleanup_free_ char *pw = xasprintf("%s\n", r->password); /* before the first goto: freed at fail */
  if (moat_store_database_update(c->store, r->id, r->state, r->sandbox_id, err) < 0)
    goto fail;
  if (from_role) {
    char *rename[] = {"sh", "-c", (char *)rename_script, "sh", r->role, (char *)from_role, NULL};
    if (db_run(c, r, rename, NULL, pw, DB_READY_TIMEOUT_MS, "rename the copied cluster", err) < 0)
      goto fail;
    moat_crash_point("db_branch_renamed");
  }
  t_renamed = now_ns();
  if (db_run(c, r, init, NULL, pw, DB_READY_TIMEOUT_MS, "initdb", err) < 0)
    goto fail;
  moat_crash_point("db_initdb_done");
  t_init = now_ns();
  if (db_start_server(c, r, err) < 0)
    goto fail;
  log_info("database %s: server ready in sandbox %s in %.1f ms (sandbox %.1f, rename %.1f, initdb %.1f, "
           "start %.1f)",
           r->id, r->sandbox_id, (now_ns() - t0) / 1e6, (t_made - t0) / 1e6, (t_renamed - t_made) / 1e6,
           (t_init - t_renamed) / 1e6, (now_ns() - t_init) / 1e6);
  return 0;
fail:
  db_kill_sandboxes(c, r);
  return moat_error_wrap(err, "database %s", r->id);
}

/* ---- create, get, list, delete ---- */

/* The names a new database's row points at (db_row_new fills them). */
struct db_new {
  char id[MOAT_DB_ID_LEN + 1];
  char role[MOAT_DB_ID_LEN + 1];
  char password[DB_PASSWORD_LEN + 1];
};

/* A new "creating" row for org's database name: a fresh id, its role ("db-abc" -> "db_abc": a
 * PostgreSQL name that needs no quoting), password and volume (named as the id), all in nw. */
static struct moat_store_database db_row_new(struct db_new *nw, const char *org, const char *name,
                                             uint64_t size_mb, char *metadata_json, int64_t idle_s) {
  snprintf(nw->id, sizeof(nw->id), "db-");
  random_id(nw->id + 3, MOAT_DB_ID_LEN - 3);
  snprintf(nw->role, sizeof(nw->role), "%s", nw->id);
  nw->role[2] = '_';
  random_id(nw->password, DB_PASSWORD_LEN);
  return (struct moat_store_database){
      .id = nw->id,
      .org = (char *)org,
      .name = (char *)name,
      .size_mb = size_mb,
      .metadata_json = metadata_json,
      .idle_seconds = idle_s,
      .role = nw->role,
      .password = nw->password,
      .volume = nw->id,
      .state = "creating",
      .created_at_ms = now_unix_ms(),
  };
}

/* Undoes a create or branch that failed before it was "running": r's sandboxes, its volume, its
 * row. Logged, not failed (the next open removes what is left of a "creating" row). */
static void db_discard(struct moat_control *c, struct moat_store_database *r) {
  r->state = "creating";
  db_kill_sandboxes(c, r);
  moat_error *e = NULL;
  if (moat_control_volume_delete(c, r->org, r->volume, &e) < 0 && e->status != MOAT_E_NO_VOLUME)
    log_warn("database %s: remove its volume: %s", r->id, moat_error_msg(e));
  moat_error_free(&e);
  moat_store_database_delete(c->store, r->id, NULL);
}

/* The rest of a create or a branch once row ("creating") and its volume exist: a server on the
 * volume (from_role: see db_new_server), the row "running", out filled. On failure everything made
 * for row is removed. */
static int db_finish(struct moat_control *c, struct moat_store_database *row, const char *from_role,
                     struct moat_database_info *out, moat_error **err) {
  struct ctl_db *d = db_entry(c, row->id);
  pthread_mutex_lock(&d->start);
  row->sandbox_id = NULL;
  int rc = db_new_server(c, row, from_role, err);
  if (rc == 0) {
    row->state = "running";
    rc = moat_store_database_update(c->store, row->id, "running", NULL, err);
  }
  pthread_mutex_unlock(&d->start);
  _cleanup_free_ char *sid = row->sandbox_id; /* db_new_server's copy */
  if (rc < 0) {
    db_discard(c, row);
    row->sandbox_id = NULL;
    return -1;
  }
  db_touch(c, d);
  if (out)
    info_of(c, row, out);
  row->sandbox_id = NULL;
  return 0;
}

static int database_create(struct moat_control *c, const char *org, const struct moat_database_spec *spec,
                           struct moat_database_info *out, moat_error **err);

/* The org's database quotas are checked (and held) around the create. */
int moat_control_database_create(struct moat_control *c, const char *org,
                                 const struct moat_database_spec *spec, struct moat_database_info *out,
                                 moat_error **err) {
  uint64_t size = spec->size_mb ? spec->size_mb : MOAT_DB_DEFAULT_SIZE_MB;
  bool held = false;
  if (moat_control_quota_storage_begin(c, org, MOAT_Q_DATABASES, (int64_t)(size << 20), &held, err) < 0)
    return -1;
  int rc = database_create(c, org, spec, out, err);
  moat_control_quota_storage_end(c, held);
  return rc;
}

static int database_create(struct moat_control *c, const char *org, const struct moat_database_spec *spec,
                           struct moat_database_info *out, moat_error **err) {
  if (!moat_database_name_valid(spec->name))
    return moat_error_set(err, EINVAL, "name: must match ^[a-z0-9][a-z0-9_-]{0,62}$");
  uint64_t size = spec->size_mb ? spec->size_mb : MOAT_DB_DEFAULT_SIZE_MB;
  if (size < MOAT_DB_MIN_SIZE_MB || size > c->bounds.disk_fs_mb)
    return moat_error_set(err, EINVAL, "size_mb: must be between %d and %llu (the data filesystem's size)",
                          MOAT_DB_MIN_SIZE_MB, (unsigned long long)c->bounds.disk_fs_mb);
  int64_t idle = spec->idle_seconds ? spec->idle_seconds : MOAT_DB_DEFAULT_IDLE_S;
  if (idle < 1 || idle > MOAT_DB_MAX_IDLE_S)
    return moat_error_set(err, EINVAL, "idle_seconds: must be between 1 and %lld",
                          (long long)MOAT_DB_MAX_IDLE_S);
  if (spec->metadata && !json_is_object(spec->metadata))
    return moat_error_set(err, EINVAL, "metadata: must be an object");

  struct db_new nw;
  _cleanup_free_ char *meta = dump_object(spec->metadata);
  struct moat_store_database row = db_row_new(&nw, org, spec->name, size, meta, idle);
  /* the row first: a moatd that dies from here on leaves a "creating" row, which the next open
   * removes with whatever was made for it (ctl_databases_open) */
  if (moat_store_database_insert(c->store, &row, err) < 0)
    return -1;
  const char *id = row.id;
  if (moat_control_volume_create(c, org, row.volume, size, NULL, err) < 0) {
    if (err && *err && (*err)->status == EEXIST)
      (*err)->status = EIO;
    moat_store_database_delete(c->store, id, NULL);
    return moat_error_wrap(err, "database '%s'", spec->name);
  }
  moat_crash_point("db_volume_made");
  if (db_finish(c, &row, NULL, out, err) < 0)
    return -1;
  ctl_db_event(c, id, "created", NULL);
  log_info("database %s (%s) created for %s: %llu MiB", spec->name, id, org, (unsigned long long)size);
  return 0;
}

int moat_control_database_get(struct moat_control *c, const char *org, const char *id,
                              struct moat_database_info *out, moat_error **err) {
  struct moat_store_database r = {0};
  if (moat_store_database_get(c->store, org, id, &r, err) < 0)
    return -1;
  info_of(c, &r, out);
  moat_store_database_clear(&r);
  return 0;
}

int moat_control_database_list(struct moat_control *c, const char *org, struct moat_database_info **out,
                               size_t *n, moat_error **err) {
  struct moat_store_database *rows = NULL;
  size_t nr = 0;
  *out = NULL;
  *n = 0;
  if (moat_store_database_list(c->store, org, &rows, &nr, err) < 0)
    return -1;
  struct moat_database_info *v = nr ? xcalloc(nr, sizeof(*v)) : NULL;
  for (size_t i = 0; i < nr; i++)
    info_of(c, &rows[i], &v[i]);
  moat_store_databases_free(rows, nr);
  *out = v;
  *n = nr;
  return 0;
}

/* Removes r: state "deleting" (connects are refused from here), its sandboxes, its volume, its row.
 * A moatd that dies on the way leaves the row "deleting", which the next open finishes. */
static int db_remove(struct moat_control *c, struct moat_store_database *r, moat_error **err) {
  if (moat_store_database_update(c->store, r->id, "deleting", NULL, err) < 0)
    return -1;
  struct ctl_db *d = db_entry(c, r->id);
  pthread_mutex_lock(&d->start);
  db_kill_sandboxes(c, r);
  pthread_mutex_unlock(&d->start);
  moat_crash_point("db_delete_killed");
  moat_error *e = NULL;
  if (moat_control_volume_delete(c, r->org, r->volume, &e) < 0 && e->status != MOAT_E_NO_VOLUME) {
    moat_error_wrap(&e, "database %s: remove its volume %s", r->id, r->volume);
    take_error(err, e);
    return -1;
  }
  moat_error_free(&e);
  if (moat_store_database_delete(c->store, r->id, err) < 0)
    return -1;
  ctl_db_events_forget(c, r->id);
  log_info("database %s (%s) of %s deleted", r->name, r->id, r->org);
  return 0;
}

int moat_control_database_delete(struct moat_control *c, const char *org, const char *id, moat_error **err) {
  struct moat_store_database r = {0};
  if (moat_store_database_get(c->store, org, id, &r, err) < 0)
    return -1;
  int ret = -1;
  if (strcmp(r.state, "creating") == 0)
    moat_error_set(err, EBUSY, "database %s is being created", id);
  else
    ret = db_remove(c, &r, err);
  moat_store_database_clear(&r);
  return ret;
}

/* ---- branch ---- */

/* Whether org's sandbox id is running now (no wake is needed to reach it). */
static bool sandbox_running(struct moat_control *c, const char *org, const char *id) {
  struct live *e = id ? live_get(c, id) : NULL;
  if (!e)
    return false;
  pthread_mutex_lock(&e->m);
  bool running = e->state == MOAT_SB_RUNNING && e->slot >= 0 && strcmp(e->org, org) == 0;
  pthread_mutex_unlock(&e->m);
  live_put(c, e);
  return running;
}

int moat_control_database_branch(struct moat_control *c, const char *org, const char *id,
                                 const struct moat_database_spec *spec, struct moat_database_info *out,
                                 moat_error **err) {
  if (!moat_database_name_valid(spec->name))
    return moat_error_set(err, EINVAL, "name: must match ^[a-z0-9][a-z0-9_-]{0,62}$");
  if (spec->metadata && !json_is_object(spec->metadata))
    return moat_error_set(err, EINVAL, "metadata: must be an object");
  if (spec->idle_seconds < 0 || spec->idle_seconds > MOAT_DB_MAX_IDLE_S)
    return moat_error_set(err, EINVAL, "idle_seconds: must be between 1 and %lld",
                          (long long)MOAT_DB_MAX_IDLE_S);
  struct moat_store_database src = {0};
  if (moat_store_database_get(c->store, org, id, &src, err) < 0)
    return -1;
  int ret = -1;
  struct db_new nw;
  _cleanup_free_ char *meta = dump_object(spec->metadata);
  struct moat_store_database row = db_row_new(&nw, org, spec->name, src.size_mb, meta,
                                              spec->idle_seconds ? spec->idle_seconds : src.idle_seconds);
  if (spec->size_mb && spec->size_mb != src.size_mb) {
    moat_error_set(err, EINVAL, "size_mb: a branch has its source's size (%llu)",
                   (unsigned long long)src.size_mb);
    goto out;
  }
  if (strcmp(src.state, "running") != 0) {
    moat_error_set(err, EBUSY, "database %s is %s: only a running or hibernated one can be branched", id,
                   src.state);
    goto out;
  }
  if (moat_store_database_insert(c->store, &row, err) < 0)
    goto out;
  /* The copy: under the source's start mutex (no wake, hibernation or restart meanwhile), its
   * server's sandbox frozen when it runs (so the copy is what a power cut would leave: committed
   * transactions are in the WAL, which the branch's first start replays), thawed right after. A
   * moatd that dies in between leaves the sandbox paused: the next open resumes it. */
  struct ctl_db *d = db_entry(c, src.id);
  uint64_t t0 = now_ns();
  pthread_mutex_lock(&d->start);
  bool frozen = false;
  int rc = 0;
  if (src.sandbox_id && sandbox_running(c, org, src.sandbox_id)) {
    rc = moat_control_pause(c, org, src.sandbox_id, err);
    frozen = rc == 0;
  }
  uint64_t t_frozen = now_ns();
  if (rc == 0) {
    moat_crash_point("db_branch_frozen");
    rc = ctl_volume_copy(c, org, src.volume, row.volume, err);
  }
  t_frozen = now_ns() - t_frozen;
  if (frozen) {
    moat_error *e = NULL;
    if (moat_control_resume(c, org, src.sandbox_id, &e) < 0) {
      log_error("database %s: thaw its sandbox %s after a branch: %s", src.id, src.sandbox_id,
                moat_error_msg(e));
      moat_error_free(&e);
    }
  }
  pthread_mutex_unlock(&d->start);
  if (rc < 0) {
    moat_error_wrap(err, "branch database %s", id);
    moat_store_database_delete(c->store, row.id, NULL);
    goto out;
  }
  moat_crash_point("db_branch_copied");
  if (db_finish(c, &row, src.role, out, err) < 0) {
    moat_error_wrap(err, "branch '%s' of database %s", spec->name, id);
    goto out;
  }
  ctl_db_event(c, row.id, "created", json_pack("{ss}", "branch_of", src.id));
  ctl_db_event(c, src.id, "branched", json_pack("{ss}", "branch_id", row.id));
  log_info("database %s (%s) branched from %s for %s: %llu MiB, source frozen %.1f ms, ready in %.1f ms",
           spec->name, row.id, src.id, org, (unsigned long long)src.size_mb, t_frozen / 1e6,
           (now_ns() - t0) / 1e6);
  ret = 0;
out:
  moat_store_database_clear(&src);
  return ret;
}

/* ---- the databases of a fork's children ---- */

void ctl_databases_drop_owned(struct moat_control *c, const char *org, struct moat_store_db_attachment *att,
                              size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (!att[i].owned)
      continue;
    moat_error *e = NULL;
    if (moat_control_database_delete(c, org, att[i].database_id, &e) < 0 && e->status != ENOENT)
      log_warn("database %s: delete the branch of a child not made: %s", att[i].database_id,
               moat_error_msg(e));
    moat_error_free(&e);
  }
}

json_t *ctl_databases_for_child(struct moat_control *c, const char *org, const char *parent_id,
                                const json_t *parent_env, const struct moat_store_db_attachment *patt,
                                size_t np, bool branch, struct moat_store_db_attachment **att_out,
                                moat_error **err) {
  json_t *env = parent_env ? json_deep_copy(parent_env) : json_object();
  struct moat_store_db_attachment *att = np ? xcalloc(np, sizeof(*att)) : NULL;
  size_t made = 0;
  for (; made < np; made++) {
    struct moat_store_db_attachment *a = &att[made];
    a->env = xstrdup(patt[made].env);
    if (!branch) {
      a->database_id = xstrdup(patt[made].database_id);
      continue;
    }
    struct moat_database_info src, d;
    if (moat_control_database_get(c, org, patt[made].database_id, &src, err) < 0) {
      moat_error_wrap(err, "branch database %s (%s) of %s", patt[made].database_id, patt[made].env,
                      parent_id);
      goto fail;
    }
    char name[64], tag[9];
    random_id(tag, 8);
    snprintf(name, sizeof(name), "%.40s-%s", src.name, tag);
    _cleanup_json_ json_t *meta =
        json_pack("{ssss}", "moat.branch_of", src.id, "moat.forked_from", parent_id);
    moat_database_info_clear(&src);
    struct moat_database_spec spec = {.name = name, .metadata = meta};
    if (moat_control_database_branch(c, org, patt[made].database_id, &spec, &d, err) < 0) {
      moat_error_wrap(err, "branch database %s (%s) of %s", patt[made].database_id, patt[made].env,
                      parent_id);
      goto fail;
    }
    a->database_id = xstrdup(d.id);
    a->owned = true;
    char *url = attach_url(c, &d);
    json_object_set_new(env, a->env, json_string(url));
    free(url);
    moat_database_info_clear(&d);
  }
  *att_out = att;
  return env;
fail:
  free(att[made].env);
  att[made].env = NULL;
  ctl_databases_drop_owned(c, org, att, made);
  moat_store_db_attachments_free(att, made);
  json_decref(env);
  *att_out = NULL;
  return NULL;
}

/* ---- connect ---- */

#define DB_NEEDS_STACK (-2)

/* moat_control_database_connect. Without may_repair it only connects to a running sandbox's
 * server and returns DB_NEEDS_STACK (nothing set) when more is needed: a wake, a restart or a new
 * sandbox, which run deep call chains that a caller's small thread stack (the proxy's) may not
 * hold. */
static int db_connect(struct moat_control *c, const char *org, const char *role, const char *database,
                      char **org_out, char **id_out, int timeout_ms, bool may_repair, moat_error **err) {
  struct moat_store_database r = {0};
  if (moat_store_database_find(c->store, org, role, database, &r, err) < 0)
    return -1;
  int fd = -1;
  struct ctl_db *d = db_entry(c, r.id);
  if (strcmp(r.state, "running") != 0) {
    if (strcmp(r.state, "failed") == 0)
      moat_error_set(err, EIO, "database %s failed to start", r.id);
    else
      moat_error_set(err, EBUSY, "database %s is %s", r.id, r.state);
    goto out;
  }
  /* d->start is held from here to the touch after the connection: the reaper takes it before it
   * hibernates (and looks at the idle clock again), so it never hibernates under a connect */
  pthread_mutex_lock(&d->start);
  db_touch(c, d);
  moat_error *e = NULL;
  if (!may_repair && !sandbox_running(c, r.org, r.sandbox_id)) {
    pthread_mutex_unlock(&d->start);
    moat_store_database_clear(&r);
    return DB_NEEDS_STACK;
  }
  /* the sandbox is woken here when it hibernates (moat_control_port_connect) */
  if (r.sandbox_id)
    fd = moat_control_port_connect(c, r.org, r.sandbox_id, MOAT_DB_PORT, timeout_ms, &e);
  if (fd >= 0)
    goto ok;
  if (!may_repair) {
    moat_error_free(&e);
    pthread_mutex_unlock(&d->start);
    moat_store_database_clear(&r);
    return DB_NEEDS_STACK;
  }
  /* something to repair (one caller at a time per database), from the row as it is now */
  moat_error_free(&e);
  struct moat_store_database now = {0};
  if (moat_store_database_get(c->store, NULL, r.id, &now, err) < 0) {
    pthread_mutex_unlock(&d->start);
    goto out;
  }
  moat_store_database_clear(&r);
  r = now;
  if (strcmp(r.state, "running") != 0) {
    moat_error_set(err, EBUSY, "database %s is %s", r.id, r.state);
  } else {
    if (r.sandbox_id)
      fd = moat_control_port_connect(c, r.org, r.sandbox_id, MOAT_DB_PORT, timeout_ms, &e);
    if (fd < 0 && e && e->status == ECONNREFUSED) {
      /* the sandbox lives, its server does not listen: start it (a server still starting fails on
       * its lock file and the one starting is waited for) */
      moat_error_free(&e);
      ctl_db_event(c, r.id, "restarted", json_pack("{ss}", "reason", "its server was not running"));
      if (db_start_server(c, &r, err) == 0)
        fd = moat_control_port_connect(c, r.org, r.sandbox_id, MOAT_DB_PORT, timeout_ms, err);
    } else if (fd < 0 && (!e || e->status == ENOENT)) {
      /* the sandbox is gone (killed, or moatd restarted without it): a new one on the same volume */
      moat_error_free(&e);
      log_info("database %s: its sandbox %s is gone; starting a new one", r.id,
               r.sandbox_id ? r.sandbox_id : "-");
      ctl_db_event(c, r.id, "restarted", json_pack("{ss}", "reason", "its sandbox was gone"));
      /* a sandbox that died under moatd (its init killed) may still hold the volume's claim until
       * the reaper sees it: its record goes first */
      db_kill_sandboxes(c, &r);
      if (db_new_server(c, &r, NULL, err) == 0)
        fd = moat_control_port_connect(c, r.org, r.sandbox_id, MOAT_DB_PORT, timeout_ms, err);
    } else if (fd < 0) {
      take_error(err, e);
    }
  }
  if (fd < 0) {
    pthread_mutex_unlock(&d->start);
    moat_error_wrap(err, "database %s", r.id);
    goto out;
  }
ok:
  db_touch(c, d);
  pthread_mutex_unlock(&d->start);
  if (org_out)
    *org_out = xstrdup(r.org);
  if (id_out)
    *id_out = xstrdup(r.id);
out:
  moat_store_database_clear(&r);
  return fd;
}

struct connect_job {
  struct moat_control *c;
  const char *org, *role, *database;
  char **org_out, **id_out;
  int timeout_ms, fd;
  moat_error *err;
};

static void *connect_main(void *arg) {
  struct connect_job *j = arg;
  j->fd = db_connect(j->c, j->org, j->role, j->database, j->org_out, j->id_out, j->timeout_ms, true, &j->err);
  return NULL;
}

int moat_control_database_connect(struct moat_control *c, const char *org, const char *role,
                                  const char *database, char **org_out, char **id_out, int timeout_ms,
                                  moat_error **err) {
  if (timeout_ms <= 0)
    timeout_ms = DB_CONNECT_TIMEOUT_MS;
  uint64_t t0 = now_ns();
  int fd = db_connect(c, org, role, database, org_out, id_out, timeout_ms, false, err);
  if (fd != DB_NEEDS_STACK)
    return fd;
  /* a wake, a restart or a new sandbox: on a thread with a full stack */
  char *id = NULL;
  struct connect_job j = {.c = c,
                          .org = org,
                          .role = role,
                          .database = database,
                          .org_out = org_out,
                          .id_out = &id,
                          .timeout_ms = timeout_ms,
                          .fd = -1};
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, DB_REPAIR_STACK);
  pthread_t t;
  int rc = pthread_create(&t, &attr, connect_main, &j);
  pthread_attr_destroy(&attr);
  if (rc != 0)
    return moat_error_set(err, EAGAIN, "database: start a connect thread: %s", strerror(rc));
  pthread_join(t, NULL);
  take_error(err, j.err);
  if (j.fd >= 0) {
    double s = (double)(now_ns() - t0) / 1e9;
    ctl_db_wake_observed(c, s);
    ctl_db_event(c, id, "woken", json_pack("{sf}", "wake_ms", s * 1e3));
  }
  if (id_out)
    *id_out = id;
  else
    free(id);
  return j.fd;
}

/* ---- open, reaper, close ---- */

void ctl_databases_open(struct moat_control *c) {
  struct moat_store_database *rows = NULL;
  size_t n = 0;
  moat_error *e = NULL;
  if (moat_store_database_list(c->store, NULL, &rows, &n, &e) < 0) {
    log_warn("databases: not recovering interrupted creates: %s", moat_error_msg(e));
    moat_error_free(&e);
    return;
  }
  for (size_t i = 0; i < n; i++) {
    struct moat_store_database *r = &rows[i];
    if (strcmp(r->state, "running") == 0 && r->sandbox_id) {
      /* a branch that moatd did not finish froze its source's server */
      struct moat_sandbox_info sb = {0};
      if (moat_control_get(c, r->org, r->sandbox_id, &sb, &e) == 0 && sb.state == MOAT_SB_PAUSED) {
        log_info("databases: resuming the server of %s (%s), left paused by a moatd that stopped", r->name,
                 r->id);
        if (moat_control_resume(c, r->org, r->sandbox_id, &e) < 0)
          log_warn("databases: resume %s: %s", r->id, moat_error_msg(e));
      }
      moat_error_free(&e);
      moat_sandbox_info_clear(&sb);
      continue;
    }
    if (strcmp(r->state, "creating") != 0 && strcmp(r->state, "deleting") != 0)
      continue;
    log_info("databases: removing %s (%s), left %s by a moatd that stopped", r->name, r->id, r->state);
    if (db_remove(c, r, &e) < 0) {
      log_warn("databases: remove %s: %s", r->id, moat_error_msg(e));
      moat_error_free(&e);
    }
  }
  moat_store_databases_free(rows, n);
}

/* Deletes the databases branched for sandboxes that are killed now. */
static void reap_orphans(struct moat_control *c) {
  struct moat_store_db_attachment *v = NULL;
  size_t n = 0;
  moat_error *e = NULL;
  if (moat_store_db_orphans(c->store, &v, &n, &e) < 0) {
    log_warn("databases: list the branches of killed sandboxes: %s", moat_error_msg(e));
    moat_error_free(&e);
    return;
  }
  for (size_t i = 0; i < n; i++) {
    struct moat_store_database r = {0};
    if (moat_store_database_get(c->store, NULL, v[i].database_id, &r, &e) == 0 &&
        strcmp(r.state, "creating") != 0 && strcmp(r.state, "deleting") != 0) {
      if (db_remove(c, &r, &e) == 0)
        log_info("database %s: its sandbox %s is gone: deleted", r.id, v[i].sandbox_id);
      else
        log_warn("database %s: delete the branch of the gone sandbox %s: %s", r.id, v[i].sandbox_id,
                 moat_error_msg(e));
    }
    moat_error_free(&e);
    moat_store_database_clear(&r);
  }
  moat_store_db_attachments_free(v, n);
}

void ctl_databases_reap(struct moat_control *c, int64_t now_ms) {
  struct moat_store_database *rows = NULL;
  size_t n = 0;
  moat_error *e = NULL;
  reap_orphans(c);
  if (moat_store_database_list(c->store, NULL, &rows, &n, &e) < 0) {
    moat_error_free(&e);
    return;
  }
  for (size_t i = 0; i < n; i++) {
    struct moat_store_database *r = &rows[i];
    if (strcmp(r->state, "running") != 0 || !r->sandbox_id)
      continue;
    struct ctl_db *d = db_entry(c, r->id);
    pthread_mutex_lock(&c->db_lock);
    bool idle = d->conns == 0 && now_ms - d->idle_since_ms >= r->idle_seconds * 1000;
    pthread_mutex_unlock(&c->db_lock);
    /* an exec or a file call in its sandbox counts as use too */
    struct live *sb_live = idle ? live_get(c, r->sandbox_id) : NULL;
    if (sb_live) {
      int64_t api_ms = __atomic_load_n(&sb_live->last_api_ms, __ATOMIC_RELAXED);
      if (__atomic_load_n(&sb_live->inflight, __ATOMIC_SEQ_CST) > 0 ||
          now_ms - api_ms < r->idle_seconds * 1000)
        idle = false;
      live_put(c, sb_live);
    }
    if (!idle || pthread_mutex_trylock(&d->start) != 0)
      continue;
    pthread_mutex_lock(&c->db_lock); /* a connect may have ended between the look and the lock */
    idle = d->conns == 0 && now_unix_ms() - d->idle_since_ms >= r->idle_seconds * 1000;
    pthread_mutex_unlock(&c->db_lock);
    if (!idle) {
      pthread_mutex_unlock(&d->start);
      continue;
    }
    struct moat_sandbox_info sb = {0};
    if (moat_control_get(c, r->org, r->sandbox_id, &sb, &e) == 0 && sb.state == MOAT_SB_RUNNING) {
      if (moat_control_hibernate(c, r->org, r->sandbox_id, &e) == 0 &&
          (ctl_db_event(c, r->id, "hibernated", NULL), true))
        log_info("database %s: no connection for %lld s: hibernated", r->id, (long long)r->idle_seconds);
      else
        log_warn("database %s: hibernate: %s", r->id, moat_error_msg(e));
      db_touch(c, d); /* the next attempt is an idle period away */
    }
    moat_error_free(&e);
    moat_sandbox_info_clear(&sb);
    pthread_mutex_unlock(&d->start);
  }
  moat_store_databases_free(rows, n);
}

void ctl_databases_close(struct moat_control *c) {
  for (struct ctl_db *d = c->dbs, *next; d; d = next) {
    next = d->next;
    pthread_mutex_destroy(&d->start);
    free(d);
  }
  c->dbs = NULL;
  free(c->db_host);
  c->db_host = NULL;
}

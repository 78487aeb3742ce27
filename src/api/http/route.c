/* route.c -- v1 route table, query-argument checks and the errno -> HTTP status mapping (pure) */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../api_internal.h"

bool api_valid_sandbox_id(const char *s) {
  if (strncmp(s, "sb-", 3) != 0)
    return false;
  size_t i;
  for (i = 3; s[i]; i++) {
    char c = s[i];
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')))
      return false;
  }
  return i == MOAT_ID_LEN;
}

bool api_valid_template_name(const char *s) {
  size_t i;
  if (!((s[0] >= 'a' && s[0] <= 'z') || (s[0] >= '0' && s[0] <= '9')))
    return false;
  for (i = 1; s[i]; i++) {
    char c = s[i];
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-'))
      return false;
  }
  return i <= 63;
}

static const char *const route_names[] = {
    [API_R_NONE] = "none",
    [API_R_HEALTHZ] = "healthz",
    [API_R_SANDBOXES_LIST] = "sandboxes.list",
    [API_R_SANDBOXES_CREATE] = "sandboxes.create",
    [API_R_SANDBOX_GET] = "sandbox.get",
    [API_R_SANDBOX_PATCH] = "sandbox.patch",
    [API_R_SANDBOX_DELETE] = "sandbox.delete",
    [API_R_EXEC] = "exec",
    [API_R_FILES_GET] = "files.get",
    [API_R_FILES_PUT] = "files.put",
    [API_R_FILES_DELETE] = "files.delete",
    [API_R_FILES_LIST] = "files.list",
    [API_R_FILES_STAT] = "files.stat",
    [API_R_FILES_MKDIR] = "files.mkdir",
    [API_R_FILES_MOVE] = "files.move",
    [API_R_TEMPLATES_LIST] = "templates.list",
    [API_R_TEMPLATE_BUILD] = "templates.build",
    [API_R_EXEC_STREAM] = "exec.stream",
    [API_R_PROCS_LIST] = "processes.list",
    [API_R_PROC_STDIN] = "process.stdin",
    [API_R_PROC_SIGNAL] = "process.signal",
    [API_R_PROC_RESIZE] = "process.resize",
    [API_R_PROC_STREAM] = "process.stream",
    [API_R_PTY] = "pty",
    [API_R_FILES_WATCH] = "files.watch",
    [API_R_CTX_CREATE] = "contexts.create",
    [API_R_CTX_LIST] = "contexts.list",
    [API_R_CTX_DELETE] = "contexts.delete",
    [API_R_CTX_RESTART] = "contexts.restart",
    [API_R_CTX_RUN] = "contexts.run",
    [API_R_PAUSE] = "sandbox.pause",
    [API_R_RESUME] = "sandbox.resume",
    [API_R_HIBERNATE] = "sandbox.hibernate",
    [API_R_WAKE] = "sandbox.wake",
    [API_R_SNAPSHOT_CREATE] = "snapshots.create",
    [API_R_FORK] = "sandbox.fork",
    [API_R_EXPLORE] = "sandbox.explore",
    [API_R_ROLLBACK] = "sandbox.rollback",
    [API_R_SNAPSHOTS_LIST] = "snapshots.list",
    [API_R_SNAPSHOT_GET] = "snapshot.get",
    [API_R_SNAPSHOT_DELETE] = "snapshot.delete",
    [API_R_PORTS_LIST] = "ports.list",
    [API_R_PORT_GET] = "port.get",
    [API_R_PORT_EXPOSE] = "port.expose",
    [API_R_PORT_UNEXPOSE] = "port.unexpose",
    [API_R_PORT_PROXY] = "port.proxy",
    [API_R_MCP_SANDBOX] = "mcp.sandbox",
    [API_R_MCP_WORKSPACE] = "mcp.workspace",
    [API_R_NETWORK_GET] = "sandbox.network.get",
    [API_R_NETWORK_PUT] = "sandbox.network.put",
    [API_R_NETWORK_LOG] = "sandbox.network.log",
    [API_R_METRICS] = "metrics",
    [API_R_SANDBOX_METRICS] = "sandbox.metrics",
    [API_R_EVENTS] = "sandbox.events",
};

const char *api_route_name(enum api_route_kind k) {
  if ((size_t)k < ARRAY_SIZE(route_names) && route_names[k])
    return route_names[k];
  return "unknown";
}

/* One path shape: up to three methods, each with its route kind. */
struct shape {
  const char *allow;
  struct {
    const char *method;
    enum api_route_kind kind;
    bool json_body;
  } m[3];
};

static enum api_match pick(const struct shape *s, const char *method, struct api_route *r) {
  for (size_t i = 0; i < ARRAY_SIZE(s->m) && s->m[i].method; i++) {
    if (strcmp(method, s->m[i].method) == 0) {
      r->kind = s->m[i].kind;
      r->json_body = s->m[i].json_body;
      r->needs_auth = r->kind != API_R_HEALTHZ;
      return API_MATCH_OK;
    }
  }
  r->allow = s->allow;
  return API_MATCH_BAD_METHOD;
}

static const struct shape sh_healthz = {"GET", {{"GET", API_R_HEALTHZ, false}}};
static const struct shape sh_sandboxes = {
    "GET, POST", {{"GET", API_R_SANDBOXES_LIST, false}, {"POST", API_R_SANDBOXES_CREATE, true}}};
static const struct shape sh_sandbox = {"GET, PATCH, DELETE",
                                        {{"GET", API_R_SANDBOX_GET, false},
                                         {"PATCH", API_R_SANDBOX_PATCH, true},
                                         {"DELETE", API_R_SANDBOX_DELETE, false}}};
static const struct shape sh_exec = {"POST", {{"POST", API_R_EXEC, true}}};
static const struct shape sh_files = {"GET, PUT, DELETE",
                                      {{"GET", API_R_FILES_GET, false},
                                       {"PUT", API_R_FILES_PUT, false},
                                       {"DELETE", API_R_FILES_DELETE, false}}};
static const struct shape sh_files_list = {"GET", {{"GET", API_R_FILES_LIST, false}}};
static const struct shape sh_files_stat = {"GET", {{"GET", API_R_FILES_STAT, false}}};
static const struct shape sh_files_mkdir = {"POST", {{"POST", API_R_FILES_MKDIR, true}}};
static const struct shape sh_files_move = {"POST", {{"POST", API_R_FILES_MOVE, true}}};
static const struct shape sh_exec_stream = {"POST", {{"POST", API_R_EXEC_STREAM, true}}};
static const struct shape sh_procs = {"GET", {{"GET", API_R_PROCS_LIST, false}}};
static const struct shape sh_proc_stdin = {"POST", {{"POST", API_R_PROC_STDIN, true}}};
static const struct shape sh_proc_signal = {"POST", {{"POST", API_R_PROC_SIGNAL, true}}};
static const struct shape sh_proc_resize = {"POST", {{"POST", API_R_PROC_RESIZE, true}}};
static const struct shape sh_proc_stream = {"GET", {{"GET", API_R_PROC_STREAM, false}}};
static const struct shape sh_pty = {"GET", {{"GET", API_R_PTY, false}}};
static const struct shape sh_files_watch = {"GET", {{"GET", API_R_FILES_WATCH, false}}};
static const struct shape sh_templates = {"GET", {{"GET", API_R_TEMPLATES_LIST, false}}};
static const struct shape sh_template_build = {"POST", {{"POST", API_R_TEMPLATE_BUILD, false}}};
static const struct shape sh_pause = {"POST", {{"POST", API_R_PAUSE, true}}};
static const struct shape sh_resume = {"POST", {{"POST", API_R_RESUME, true}}};
static const struct shape sh_hibernate = {"POST", {{"POST", API_R_HIBERNATE, true}}};
static const struct shape sh_wake = {"POST", {{"POST", API_R_WAKE, true}}};
static const struct shape sh_snapshot_create = {"POST", {{"POST", API_R_SNAPSHOT_CREATE, true}}};
static const struct shape sh_fork = {"POST", {{"POST", API_R_FORK, true}}};
static const struct shape sh_explore = {"POST", {{"POST", API_R_EXPLORE, true}}};
static const struct shape sh_rollback = {"POST", {{"POST", API_R_ROLLBACK, true}}};
static const struct shape sh_snapshots = {"GET", {{"GET", API_R_SNAPSHOTS_LIST, false}}};
static const struct shape sh_snapshot = {
    "GET, DELETE", {{"GET", API_R_SNAPSHOT_GET, false}, {"DELETE", API_R_SNAPSHOT_DELETE, false}}};
/* MCP streamable HTTP: POST carries JSON-RPC; GET (server stream) and DELETE (end session) are
 * answered by the handler. */
static const struct shape sh_mcp_sandbox = {"POST, GET, DELETE",
                                            {{"POST", API_R_MCP_SANDBOX, false},
                                             {"GET", API_R_MCP_SANDBOX, false},
                                             {"DELETE", API_R_MCP_SANDBOX, false}}};
static const struct shape sh_mcp_workspace = {"POST, GET, DELETE",
                                              {{"POST", API_R_MCP_WORKSPACE, false},
                                               {"GET", API_R_MCP_WORKSPACE, false},
                                               {"DELETE", API_R_MCP_WORKSPACE, false}}};

static const struct shape sh_network = {"GET, PUT",
                                        {{"GET", API_R_NETWORK_GET, false}, {"PUT", API_R_NETWORK_PUT, true}}};
static const struct shape sh_network_log = {"GET", {{"GET", API_R_NETWORK_LOG, false}}};
static const struct shape sh_metrics = {"GET", {{"GET", API_R_METRICS, false}}};
static const struct shape sh_sandbox_metrics = {"GET", {{"GET", API_R_SANDBOX_METRICS, false}}};
static const struct shape sh_events = {"GET", {{"GET", API_R_EVENTS, false}}};

/* Exposed ports: ports, ports/{P} (settings), ports/{P}/... (proxied: every method but TRACE and
 * CONNECT; the handler authenticates: API key, the port's token, or none for a public port). */
static const struct shape sh_ports = {"GET", {{"GET", API_R_PORTS_LIST, false}}};
static const struct shape sh_port = {"GET, POST, DELETE",
                                     {{"GET", API_R_PORT_GET, false},
                                      {"POST", API_R_PORT_EXPOSE, true},
                                      {"DELETE", API_R_PORT_UNEXPOSE, false}}};

static enum api_match port_route(const char *sub, const char *method, struct api_route *r) {
  if (strcmp(sub, "ports") == 0)
    return pick(&sh_ports, method, r);
  const char *p = sub + 6, *slash = strchr(p, '/');
  size_t n = slash ? (size_t)(slash - p) : strlen(p);
  unsigned port = 0;
  for (size_t i = 0; i < n; i++) {
    if (p[i] < '0' || p[i] > '9' || i >= 5) {
      port = 0;
      break;
    }
    port = port * 10 + (unsigned)(p[i] - '0');
  }
  if (n == 0) {
    r->id[0] = '\0';
    return API_MATCH_NOT_FOUND;
  }
  r->port = port <= 65535 ? port : 0;
  if (!slash)
    return pick(&sh_port, method, r);
  static const char *const proxied[] = {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"};
  for (size_t i = 0; i < ARRAY_SIZE(proxied); i++) {
    if (strcmp(method, proxied[i]) == 0) {
      r->kind = API_R_PORT_PROXY;
      r->needs_auth = true; /* checked by the handler: API key, port token or a public port */
      return API_MATCH_OK;
    }
  }
  r->allow = "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS";
  return API_MATCH_BAD_METHOD;
}

bool api_parse_port_host(const char *host, unsigned *port, char id[MOAT_ID_LEN + 1], const char **domain) {
  if (!host)
    return false;
  const char *dash = strchr(host, '-');
  if (!dash || dash == host || dash - host > 5)
    return false;
  unsigned p = 0;
  for (const char *c = host; c < dash; c++) {
    if (*c < '0' || *c > '9')
      return false;
    p = p * 10 + (unsigned)(*c - '0');
  }
  const char *dot = strchr(dash + 1, '.');
  if (!dot || dot - dash - 1 != MOAT_ID_LEN)
    return false;
  char buf[MOAT_ID_LEN + 1];
  memcpy(buf, dash + 1, MOAT_ID_LEN);
  buf[MOAT_ID_LEN] = '\0';
  if (!api_valid_sandbox_id(buf) || p == 0 || p > 65535)
    return false;
  *port = p;
  memcpy(id, buf, sizeof(buf));
  if (domain)
    *domain = dot + 1;
  return true;
}

/* Code contexts: contexts, contexts/{cid}, contexts/{cid}/restart, contexts/{cid}/run. The cid
 * is kept as given (1..63 chars of [A-Za-z0-9_.-]); the handler answers 404 context_not_found. */
static const struct shape sh_ctxs = {"GET, POST",
                                     {{"GET", API_R_CTX_LIST, false}, {"POST", API_R_CTX_CREATE, true}}};
static const struct shape sh_ctx = {"DELETE", {{"DELETE", API_R_CTX_DELETE, false}}};
static const struct shape sh_ctx_restart = {"POST", {{"POST", API_R_CTX_RESTART, true}}};
static const struct shape sh_ctx_run = {"POST", {{"POST", API_R_CTX_RUN, true}}};

static const struct shape *ctx_shape(const char *sub, struct api_route *r) {
  if (strcmp(sub, "contexts") == 0)
    return &sh_ctxs;
  const char *cid = sub + 9, *slash = strchr(cid, '/');
  size_t n = slash ? (size_t)(slash - cid) : strlen(cid);
  if (n == 0 || n >= sizeof(r->cid))
    return NULL;
  for (size_t i = 0; i < n; i++) {
    char c = cid[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' ||
          c == '-'))
      return NULL;
  }
  memcpy(r->cid, cid, n);
  r->cid[n] = '\0';
  if (!slash)
    return &sh_ctx;
  if (strcmp(slash, "/restart") == 0)
    return &sh_ctx_restart;
  if (strcmp(slash, "/run") == 0)
    return &sh_ctx_run;
  return NULL;
}

bool api_valid_tag(const char *s) {
  size_t i;
  bool digits = true;
  for (i = 0; s[i]; i++) {
    char c = s[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' ||
          c == '-'))
      return false;
    if (c < '0' || c > '9')
      digits = false;
  }
  return i >= 1 && i <= API_MAX_TAG && !digits;
}

int api_signal_parse(const char *name) {
  static const struct {
    const char *name;
    int sig;
  } sigs[] = {{"TERM", SIGTERM}, {"KILL", SIGKILL}, {"INT", SIGINT},   {"HUP", SIGHUP},   {"QUIT", SIGQUIT},
              {"USR1", SIGUSR1}, {"USR2", SIGUSR2}, {"STOP", SIGSTOP}, {"CONT", SIGCONT}};
  if (strncmp(name, "SIG", 3) == 0)
    name += 3;
  for (size_t i = 0; i < ARRAY_SIZE(sigs); i++)
    if (strcmp(name, sigs[i].name) == 0)
      return sigs[i].sig;
  return 0;
}

/* "processes/{pid|tag}/{action}": fills r->pid or r->tag and returns the shape, or NULL. */
static const struct shape *proc_shape(const char *sub, struct api_route *r) {
  const char *ref = sub + strlen("processes/");
  const char *slash = strchr(ref, '/');
  if (!slash)
    return NULL;
  size_t n = (size_t)(slash - ref);
  if (n == 0 || n > API_MAX_TAG)
    return NULL;
  char buf[API_MAX_TAG + 1];
  memcpy(buf, ref, n);
  buf[n] = '\0';
  if (strspn(buf, "0123456789") == n) {
    if (n > 9 || buf[0] == '0') /* pids are 1..999999999 here (Linux: < 2^22) */
      return NULL;
    r->pid = atoi(buf);
  } else if (api_valid_tag(buf)) {
    memcpy(r->tag, buf, n + 1);
  } else {
    return NULL;
  }
  const char *act = slash + 1;
  if (strcmp(act, "stdin") == 0)
    return &sh_proc_stdin;
  if (strcmp(act, "signal") == 0)
    return &sh_proc_signal;
  if (strcmp(act, "resize") == 0)
    return &sh_proc_resize;
  if (strcmp(act, "stream") == 0)
    return &sh_proc_stream;
  return NULL;
}

enum api_match api_route_match(const char *method, const char *path, struct api_route *r) {
  memset(r, 0, sizeof(*r));
  if (strcmp(path, "/healthz") == 0)
    return pick(&sh_healthz, method, r);
  if (strcmp(path, "/metrics") == 0)
    return pick(&sh_metrics, method, r);
  if (strcmp(path, "/v1/snapshots") == 0)
    return pick(&sh_snapshots, method, r);
  if (strncmp(path, "/v1/snapshots/", 14) == 0) {
    const char *sid = path + 14;
    size_t n = strlen(sid);
    if (n == 0 || n >= sizeof(r->sid) || strchr(sid, '/'))
      return API_MATCH_NOT_FOUND;
    memcpy(r->sid, sid, n + 1);
    return pick(&sh_snapshot, method, r);
  }
  if (strcmp(path, "/v1/mcp") == 0)
    return pick(&sh_mcp_workspace, method, r);
  if (strcmp(path, "/v1/templates") == 0)
    return pick(&sh_templates, method, r);
  if (strncmp(path, "/v1/templates/", 14) == 0) {
    const char *name = path + 14;
    const char *slash = strchr(name, '/');
    if (!slash || strcmp(slash, "/build") != 0)
      return API_MATCH_NOT_FOUND;
    size_t n = (size_t)(slash - name);
    if (n == 0 || n >= sizeof(r->name))
      return API_MATCH_NOT_FOUND;
    memcpy(r->name, name, n);
    r->name[n] = '\0';
    if (!api_valid_template_name(r->name))
      return API_MATCH_NOT_FOUND;
    return pick(&sh_template_build, method, r);
  }
  if (strcmp(path, "/v1/sandboxes") == 0)
    return pick(&sh_sandboxes, method, r);
  if (strncmp(path, "/v1/sandboxes/", 14) != 0)
    return API_MATCH_NOT_FOUND;

  const char *id = path + 14;
  const char *slash = strchr(id, '/');
  size_t idlen = slash ? (size_t)(slash - id) : strlen(id);
  if (idlen != MOAT_ID_LEN)
    return API_MATCH_NOT_FOUND;
  memcpy(r->id, id, idlen);
  r->id[idlen] = '\0';
  if (!api_valid_sandbox_id(r->id))
    return API_MATCH_NOT_FOUND;
  if (!slash)
    return pick(&sh_sandbox, method, r);

  const char *sub = slash + 1;
  const struct shape *s = NULL;
  if (strcmp(sub, "exec") == 0)
    s = &sh_exec;
  else if (strcmp(sub, "files") == 0)
    s = &sh_files;
  else if (strcmp(sub, "files/list") == 0)
    s = &sh_files_list;
  else if (strcmp(sub, "files/stat") == 0)
    s = &sh_files_stat;
  else if (strcmp(sub, "files/mkdir") == 0)
    s = &sh_files_mkdir;
  else if (strcmp(sub, "files/move") == 0)
    s = &sh_files_move;
  else if (strcmp(sub, "exec/stream") == 0)
    s = &sh_exec_stream;
  else if (strcmp(sub, "processes") == 0)
    s = &sh_procs;
  else if (strncmp(sub, "processes/", 10) == 0)
    s = proc_shape(sub, r);
  else if (strcmp(sub, "pty") == 0)
    s = &sh_pty;
  else if (strcmp(sub, "files/watch") == 0)
    s = &sh_files_watch;
  else if (strcmp(sub, "contexts") == 0 || strncmp(sub, "contexts/", 9) == 0)
    s = ctx_shape(sub, r);
  else if (strcmp(sub, "pause") == 0)
    s = &sh_pause;
  else if (strcmp(sub, "resume") == 0)
    s = &sh_resume;
  else if (strcmp(sub, "hibernate") == 0)
    s = &sh_hibernate;
  else if (strcmp(sub, "wake") == 0)
    s = &sh_wake;
  else if (strcmp(sub, "snapshots") == 0)
    s = &sh_snapshot_create;
  else if (strcmp(sub, "fork") == 0)
    s = &sh_fork;
  else if (strcmp(sub, "explore") == 0)
    s = &sh_explore;
  else if (strcmp(sub, "rollback") == 0)
    s = &sh_rollback;
  else if (strcmp(sub, "ports") == 0 || strncmp(sub, "ports/", 6) == 0)
    return port_route(sub, method, r);
  else if (strcmp(sub, "mcp") == 0)
    s = &sh_mcp_sandbox;
  else if (strcmp(sub, "events") == 0)
    s = &sh_events;
  else if (strcmp(sub, "network") == 0)
    s = &sh_network;
  else if (strcmp(sub, "network/log") == 0)
    s = &sh_network_log;
  else if (strcmp(sub, "metrics") == 0)
    s = &sh_sandbox_metrics;
  if (!s) {
    r->id[0] = '\0';
    return API_MATCH_NOT_FOUND;
  }
  return pick(s, method, r);
}

unsigned api_errno_http(int status, const char **code) {
  switch (status) {
  case ENOENT:
  case ESRCH:
    *code = "not_found";
    return 404;
  case EINVAL:
  case ENOTDIR:
  case EISDIR:
  case ENAMETOOLONG:
  case ELOOP:
  case ENOTEMPTY:
  case EXDEV:
    *code = "invalid_request";
    return 400;
  case EBADMSG:
    *code = "invalid_json";
    return 400;
  case EEXIST:
    *code = "already_exists";
    return 409;
  case EBUSY:
    *code = "conflict";
    return 409;
  case EACCES:
  case EPERM:
  case EROFS:
    *code = "forbidden";
    return 403;
  case EMSGSIZE:
  case E2BIG:
  case EFBIG:
    *code = "payload_too_large";
    return 413;
  case ENOSYS:
  case EOPNOTSUPP:
    *code = "not_implemented";
    return 501;
  case ECONNREFUSED:
  case ECONNRESET:
  case EPIPE:
  case EPROTO:
  case EHOSTUNREACH:
    *code = "sandbox_unreachable";
    return 502;
  case EAGAIN:
    *code = "unavailable";
    return 503;
  case API_E_TOO_MANY:
    *code = "too_many_requests";
    return 429;
  case MOAT_E_PAUSED:
    *code = "sandbox_paused";
    return 409;
  case MOAT_E_NO_CHECKPOINTS:
    *code = "checkpoints_unavailable";
    return 503;
  case ETIMEDOUT:
    *code = "timeout";
    return 504;
  case ENOSPC:
  case EDQUOT:
    *code = "insufficient_storage";
    return 507;
  default:
    *code = "internal";
    return 500;
  }
}

const char *api_arg_get(const struct api_args *a, const char *key) {
  for (size_t i = 0; i < a->n; i++)
    if (strcmp(a->v[i].key, key) == 0)
      return a->v[i].value;
  return NULL;
}

int api_args_check(const struct api_args *a, const char *const *allowed, moat_error **err) {
  for (size_t i = 0; i < a->n; i++) {
    const char *k = a->v[i].key;
    bool ok = false;
    for (size_t j = 0; allowed && allowed[j]; j++) {
      size_t n = strlen(allowed[j]);
      if (n > 0 && allowed[j][n - 1] == '.') {
        if (strncmp(k, allowed[j], n) == 0 && k[n] != '\0') {
          ok = true;
          break;
        }
      } else if (strcmp(k, allowed[j]) == 0) {
        ok = true;
        break;
      }
    }
    if (!ok)
      return moat_error_set(err, EINVAL, "unknown query parameter '%.128s'", k);
    for (size_t j = 0; j < i; j++)
      if (strcmp(a->v[j].key, k) == 0)
        return moat_error_set(err, EINVAL, "query parameter '%.128s' given more than once", k);
  }
  return 0;
}

int api_arg_bool(const struct api_args *a, const char *key, bool def, bool *out, moat_error **err) {
  const char *v = api_arg_get(a, key);
  if (!v) {
    *out = def;
    return 0;
  }
  if (strcmp(v, "true") == 0 || strcmp(v, "1") == 0)
    *out = true;
  else if (strcmp(v, "false") == 0 || strcmp(v, "0") == 0)
    *out = false;
  else
    return moat_error_set(err, EINVAL, "query parameter '%s' must be true or false", key);
  return 0;
}

int api_arg_path(const struct api_args *a, const char *key, const char **out, moat_error **err) {
  const char *v = api_arg_get(a, key);
  if (!v)
    return moat_error_set(err, EINVAL, "query parameter '%s' is required", key);
  /* NUL bytes were rejected when the arguments were collected (http.c). */
  if (api_check_path(key, v, strlen(v), err) < 0)
    return -1;
  *out = v;
  return 0;
}

int api_arg_user(const struct api_args *a, const char **out, moat_error **err) {
  const char *v = api_arg_get(a, "user");
  *out = NULL;
  if (!v)
    return 0;
  if (api_check_user("user", v, err) < 0)
    return -1;
  *out = v;
  return 0;
}

int api_arg_depth(const struct api_args *a, uint32_t *out, moat_error **err) {
  const char *v = api_arg_get(a, "depth");
  uint64_t d;
  if (!v) {
    *out = 1;
    return 0;
  }
  if (parse_u64(v, &d) < 0 || d < 1 || d > API_MAX_DEPTH)
    return moat_error_set(err, EINVAL, "query parameter 'depth' must be an integer from 1 to %d",
                          API_MAX_DEPTH);
  *out = (uint32_t)d;
  return 0;
}

int api_arg_mode(const struct api_args *a, uint32_t *out, moat_error **err) {
  const char *v = api_arg_get(a, "mode");
  if (!v) {
    *out = 0; /* the guest's default */
    return 0;
  }
  size_t n = strlen(v);
  uint32_t m = 0;
  if (n == 0 || n > 5)
    goto bad;
  for (size_t i = 0; i < n; i++) {
    if (v[i] < '0' || v[i] > '7')
      goto bad;
    m = m * 8 + (uint32_t)(v[i] - '0');
  }
  if (m > 07777)
    goto bad;
  *out = m;
  return 0;
bad:
  return moat_error_set(err, EINVAL, "query parameter 'mode' must be an octal mode from 0 to 07777");
}

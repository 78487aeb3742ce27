/* tools.c -- the MCP tools: shell and files in one sandbox, and a workspace of sandboxes
 *
 * Each tool checks its arguments against the input schema it publishes (types, required fields,
 * bounds, no unknown fields), then calls what the v1 handlers call: control for sandboxes and
 * exec, the guest client for files. A failure of the tool's work (a missing file, a killed
 * sandbox, a feature this host lacks) is a result with isError true whose text says why, so a
 * model can read it and act; only an unknown tool (and, before protocol 2025-11-25, bad arguments)
 * is a JSON-RPC error.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../common/buf.h"
#include "mcp.h"

#define MCP_MAX_OUTPUT (1024 * 1024) /* bytes kept per exec stream */
#define MCP_MAX_READ (1024 * 1024)   /* bytes read_file returns */
#define MCP_MAX_ENTRIES 2000         /* list_dir lines */
#define MCP_DEFAULT_TIMEOUT_MS 60000 /* shell / exec without timeout_ms */
#define MCP_MAX_TIMEOUT_MS 3600000   /* 1 hour */
#define MCP_MAX_COMMAND (256 * 1024) /* bytes of a command */
#define MCP_MAX_FORK 16

/* What a tool produced: text items of the result and whether it is an error. bad_args: the
 * arguments failed the input schema (first item says why). */
struct tool_out {
  json_t *content; /* array */
  bool is_error;
  bool bad_args;
};

static void out_text(struct tool_out *o, const char *s, size_t n) {
  size_t m;
  char *u = api_utf8_sanitize(s, n, &m, NULL);
  json_array_append_new(o->content, json_pack("{s:s, s:s%}", "type", "text", "text", u, m));
  free(u);
}

static void out_printf(struct tool_out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void out_printf(struct tool_out *o, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *s = NULL;
  if (vasprintf(&s, fmt, ap) < 0)
    abort();
  va_end(ap);
  out_text(o, s, strlen(s));
  free(s);
}

/* A failed tool: isError with "error (CODE): MESSAGE", CODE as the v1 API would answer. Frees *err. */
static int out_moat_error(struct tool_out *o, const char *what, moat_error **err) {
  const char *code;
  api_errno_http(*err ? (*err)->status : 0, &code);
  out_printf(o, "error (%s): %s: %s", code, what, moat_error_msg(*err));
  moat_error_free(err);
  o->is_error = true;
  return -1;
}

static int bad_args(struct tool_out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int bad_args(struct tool_out *o, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *s = NULL;
  if (vasprintf(&s, fmt, ap) < 0)
    abort();
  va_end(ap);
  out_printf(o, "invalid arguments: %s", s);
  free(s);
  o->is_error = o->bad_args = true;
  return -1;
}

/* ---- argument checks (the subset of JSON Schema the tools publish) ---- */

static int check_keys(json_t *args, const char *const *allowed, struct tool_out *o) {
  const char *k;
  json_t *v;
  json_object_foreach(args, k, v) {
    bool ok = false;
    for (size_t i = 0; allowed[i]; i++)
      if (strcmp(k, allowed[i]) == 0)
        ok = true;
    if (!ok)
      return bad_args(o, "unknown argument '%.64s'", k);
  }
  return 0;
}

/* A string argument without NUL bytes of 1..max bytes; *out NULL when absent and optional. */
static int arg_str(json_t *args, const char *key, bool required, size_t max, const char **out,
                   struct tool_out *o) {
  json_t *v = json_object_get(args, key);
  *out = NULL;
  if (!v) {
    if (required)
      return bad_args(o, "'%s' is required", key);
    return 0;
  }
  if (!json_is_string(v))
    return bad_args(o, "'%s' must be a string", key);
  size_t n = json_string_length(v);
  if (n == 0 || n > max)
    return bad_args(o, "'%s' must be 1 to %zu bytes long", key, max);
  if (memchr(json_string_value(v), '\0', n))
    return bad_args(o, "'%s' must not contain NUL bytes", key);
  *out = json_string_value(v);
  return 0;
}

/* An integer argument in [min, max]; def when absent. */
static int arg_int(json_t *args, const char *key, int64_t min, int64_t max, int64_t def, int64_t *out,
                   struct tool_out *o) {
  json_t *v = json_object_get(args, key);
  *out = def;
  if (!v)
    return 0;
  if (!json_is_integer(v) || json_integer_value(v) < min || json_integer_value(v) > max)
    return bad_args(o, "'%s' must be an integer from %lld to %lld", key, (long long)min, (long long)max);
  *out = json_integer_value(v);
  return 0;
}

static int arg_path(json_t *args, const char *key, bool required, const char **out, struct tool_out *o) {
  return arg_str(args, key, required, API_MAX_PATH, out, o);
}

/* An object of string -> string (metadata), or NULL when absent. */
static int arg_str_map(json_t *args, const char *key, json_t **out, struct tool_out *o) {
  json_t *v = json_object_get(args, key);
  *out = NULL;
  if (!v)
    return 0;
  if (!json_is_object(v))
    return bad_args(o, "'%s' must be an object of strings", key);
  const char *k;
  json_t *x;
  json_object_foreach(v, k, x) {
    if (!json_is_string(x))
      return bad_args(o, "'%s.%.64s' must be a string", key, k);
  }
  *out = v;
  return 0;
}

static int arg_sandbox(json_t *args, const char **id, struct tool_out *o) {
  if (arg_str(args, "sandbox_id", true, 64, id, o) < 0)
    return -1;
  if (!api_valid_sandbox_id(*id)) {
    out_printf(o, "error (not_found): no sandbox '%.64s' (ids look like sb-0123456789abcdefg)", *id);
    o->is_error = true;
    return -1;
  }
  return 0;
}

/* ---- commands ---- */

/* printf onto a buffer. */
static void bprintf(struct moat_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void bprintf(struct moat_buf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *s = NULL;
  int n = vasprintf(&s, fmt, ap);
  va_end(ap);
  if (n < 0)
    abort();
  moat_buf_append(b, s, (size_t)n);
  free(s);
}

/* Appends a stream's text section to b. */
static void section(struct moat_buf *b, const char *name, const char *data, size_t len, bool truncated) {
  size_t n;
  bool valid;
  char *u = api_utf8_sanitize(data ? data : "", data ? len : 0, &n, &valid);
  bprintf(b, "--- %s%s%s ---\n", name, valid ? "" : " (invalid UTF-8 replaced)",
          truncated ? " (truncated to the first 1 MiB)" : "");
  moat_buf_append(b, u, n);
  if (n > 0 && u[n - 1] != '\n')
    moat_buf_append(b, "\n", 1);
  free(u);
}

/* Runs command in sandbox id of the request's org and reports it. */
static int run_command(const struct mcp_call *c, const char *id, json_t *args, struct tool_out *o) {
  const char *cmd, *cwd;
  int64_t timeout;
  if (arg_str(args, "command", true, MCP_MAX_COMMAND, &cmd, o) < 0 ||
      arg_path(args, "cwd", false, &cwd, o) < 0 ||
      arg_int(args, "timeout_ms", 1, MCP_MAX_TIMEOUT_MS, MCP_DEFAULT_TIMEOUT_MS, &timeout, o) < 0)
    return -1;
  char *argv[] = {"/bin/sh", "-c", (char *)cmd, NULL};
  struct moat_exec_req req = {
      .argv = argv, .cwd = cwd, .timeout_ms = (uint32_t)timeout, .max_output = MCP_MAX_OUTPUT};
  struct moat_exec_result res;
  memset(&res, 0, sizeof(res));
  moat_error *err = NULL;
  if (moat_control_exec(api_control(c->r), c->r->org, id, &req, &res, &err) < 0)
    return out_moat_error(o, "could not run the command", &err);
  struct moat_buf b = {0};
  if (res.timed_out)
    bprintf(&b, "timed out after %lld ms (killed); exit_code: %d\n", (long long)timeout, res.exit_code);
  else if (res.signal)
    bprintf(&b, "killed by signal %d; exit_code: -1\n", res.signal);
  else
    bprintf(&b, "exit_code: %d\n", res.exit_code);
  section(&b, "stdout", res.out, res.out_len, res.stdout_truncated);
  section(&b, "stderr", res.err, res.err_len, res.stderr_truncated);
  out_text(o, b.p ? b.p : "", b.len);
  free(b.p);
  moat_exec_result_free(&res);
  return 0;
}

/* ---- sandbox tools ---- */

/* The guest socket of the endpoint's sandbox (caller frees), or NULL after reporting the error. */
static struct moat_guest_ep *sandbox_sock(const struct mcp_call *c, struct tool_out *o) {
  struct moat_guest_ep *sock = NULL;
  moat_error *err = NULL;
  if (moat_control_guest(api_control(c->r), c->r->org, c->r->route.id, &sock, NULL, &err) < 0) {
    out_moat_error(o, "sandbox unavailable", &err);
    return NULL;
  }
  return sock;
}

static int tool_shell(const struct mcp_call *c, json_t *args, struct tool_out *o) {
  static const char *const keys[] = {"command", "timeout_ms", "cwd", NULL};
  if (check_keys(args, keys, o) < 0)
    return -1;
  return run_command(c, c->r->route.id, args, o);
}

static int tool_read_file(const struct mcp_call *c, json_t *args, struct tool_out *o) {
  static const char *const keys[] = {"path", NULL};
  const char *path;
  if (check_keys(args, keys, o) < 0 || arg_path(args, "path", true, &path, o) < 0)
    return -1;
  _cleanup_free_ struct moat_guest_ep *sock = sandbox_sock(c, o);
  if (!sock)
    return -1;
  moat_error *err = NULL;
  struct moat_guest_reader *rd = NULL;
  uint64_t size = 0;
  if (moat_guest_read_open(sock, path, NULL, &rd, &size, &err) < 0)
    return out_moat_error(o, path, &err);
  /* Read to the end, not to the size stat reported: files of /proc and /sys say 0. One byte past
   * the limit tells whether there is more. */
  size_t want = MCP_MAX_READ + 1, got = 0;
  _cleanup_free_ char *data = xmalloc(want);
  while (got < want) {
    ssize_t n = moat_guest_read_chunk(rd, data + got, want - got, &err);
    if (n < 0) {
      moat_guest_reader_close(rd);
      return out_moat_error(o, path, &err);
    }
    if (n == 0)
      break;
    got += (size_t)n;
  }
  moat_guest_reader_close(rd);
  bool truncated = got > MCP_MAX_READ;
  if (truncated)
    got = MCP_MAX_READ;
  if (size < got)
    size = got;
  bool valid;
  size_t text = truncated ? api_utf8_stream_split(data, got, &valid) : got;
  if (!truncated)
    valid = api_utf8_valid(data, got);
  if (!valid || memchr(data, '\0', got)) {
    out_printf(o,
               "%s is a binary file (%llu bytes; not UTF-8 text), not shown. Inspect it with the shell tool, "
               "e.g. `xxd %s | head` or `base64 %s`.",
               path, (unsigned long long)size, path, path);
    return 0;
  }
  out_text(o, data, text);
  if (truncated) {
    char total[48];
    if (size > got)
      snprintf(total, sizeof(total), "%llu", (unsigned long long)size);
    else /* stat did not know (a /proc file): there is at least one byte more */
      snprintf(total, sizeof(total), "more than %zu", got);
    out_printf(o, "[truncated: the first %zu of %s bytes are shown; read the rest with the shell tool]", text,
               total);
  }
  return 0;
}

static int tool_write_file(const struct mcp_call *c, json_t *args, struct tool_out *o) {
  static const char *const keys[] = {"path", "content", NULL};
  const char *path;
  if (check_keys(args, keys, o) < 0 || arg_path(args, "path", true, &path, o) < 0)
    return -1;
  json_t *content = json_object_get(args, "content");
  if (!content)
    return bad_args(o, "'content' is required");
  if (!json_is_string(content))
    return bad_args(o, "'content' must be a string");
  _cleanup_free_ struct moat_guest_ep *sock = sandbox_sock(c, o);
  if (!sock)
    return -1;
  moat_error *err = NULL;
  struct moat_guest_writer *w = NULL;
  uint64_t written = 0;
  if (moat_guest_write_open(sock, path, NULL, 0, &w, &err) < 0)
    return out_moat_error(o, path, &err);
  size_t n = json_string_length(content);
  if ((n > 0 && moat_guest_write_chunk(w, json_string_value(content), n, &err) < 0) ||
      moat_guest_write_finish(w, &written, &err) < 0) {
    moat_guest_writer_close(w); /* the old file, if any, stays */
    return out_moat_error(o, path, &err);
  }
  moat_guest_writer_close(w);
  struct moat_file_entry e;
  memset(&e, 0, sizeof(e));
  const char *abs = path;
  if (moat_guest_stat(sock, path, NULL, &e, &err) == 0 && e.path)
    abs = e.path;
  moat_error_free(&err);
  out_printf(o, "wrote %llu bytes to %s", (unsigned long long)written, abs);
  moat_file_entry_clear(&e);
  return 0;
}

static int tool_list_dir(const struct mcp_call *c, json_t *args, struct tool_out *o) {
  static const char *const keys[] = {"path", "depth", NULL};
  const char *path;
  int64_t depth;
  if (check_keys(args, keys, o) < 0 || arg_path(args, "path", true, &path, o) < 0 ||
      arg_int(args, "depth", 1, API_MAX_DEPTH, 1, &depth, o) < 0)
    return -1;
  _cleanup_free_ struct moat_guest_ep *sock = sandbox_sock(c, o);
  if (!sock)
    return -1;
  moat_error *err = NULL;
  struct moat_file_entry *v = NULL;
  size_t n = 0;
  if (moat_guest_list(sock, path, NULL, (uint32_t)depth, &v, &n, &err) < 0)
    return out_moat_error(o, path, &err);
  struct moat_buf b = {0};
  bprintf(&b, "%zu entr%s under %s (type size mode path):\n", n, n == 1 ? "y" : "ies", path);
  for (size_t i = 0; i < n && i < MCP_MAX_ENTRIES; i++) {
    const struct moat_file_entry *e = &v[i];
    bprintf(&b, "%s %llu %04o %s%s%s%s\n", api_file_type_name(e->type), (unsigned long long)e->size,
            e->mode & 07777, e->path ? e->path : "", e->type == 'd' ? "/" : "", e->link_target ? " -> " : "",
            e->link_target ? e->link_target : "");
  }
  if (n > MCP_MAX_ENTRIES)
    bprintf(&b, "[%zu more not shown; list a subdirectory or use a smaller depth]\n", n - MCP_MAX_ENTRIES);
  out_text(o, b.p ? b.p : "", b.len);
  free(b.p);
  moat_file_entries_free(v, n);
  return 0;
}

/* ---- workspace tools ---- */

static json_t *sandbox_brief(const struct moat_sandbox_info *s) {
  json_t *full = api_sandbox_json(s);
  json_t *o = json_object();
  static const char *const keep[] = {"id",       "template", "state",     "created_at",   "expires_at",
                                     "metadata", "cpu",      "memory_mb", "killed_reason"};
  for (size_t i = 0; i < ARRAY_SIZE(keep); i++) {
    json_t *v = json_object_get(full, keep[i]);
    if (v)
      json_object_set(o, keep[i], v);
  }
  json_decref(full);
  return o;
}

static void out_json(struct tool_out *o, json_t *j) {
  char *s = json_dumps(j, JSON_INDENT(2));
  json_decref(j);
  if (!s)
    abort();
  out_text(o, s, strlen(s));
  free(s);
}

static int tool_create(const struct mcp_call *c, json_t *args, struct tool_out *o) {
  static const char *const keys[] = {"template", "ttl_seconds", "metadata", NULL};
  const char *tname;
  int64_t ttl;
  json_t *meta;
  if (check_keys(args, keys, o) < 0 || arg_str(args, "template", false, 63, &tname, o) < 0 ||
      arg_int(args, "ttl_seconds", 1, MOAT_MAX_TTL_S, 0, &ttl, o) < 0 ||
      arg_str_map(args, "metadata", &meta, o) < 0)
    return -1;
  /* The same checks as POST /v1/sandboxes. */
  moat_error *err = NULL;
  struct moat_sandbox_spec spec;
  json_t *body = json_object();
  if (tname)
    json_object_set_new(body, "template", json_string(tname));
  if (ttl)
    json_object_set_new(body, "ttl_seconds", json_integer(ttl));
  if (meta)
    json_object_set(body, "metadata", meta);
  int rc = api_parse_create(body, moat_control_host_memory_mb(api_control(c->r)), &spec, &err);
  if (rc < 0) {
    json_decref(body);
    return out_moat_error(o, "create_sandbox", &err);
  }
  const char *t = spec.template_name ? spec.template_name : "base";
  if (!api_valid_template_name(t) || !moat_control_template_known(api_control(c->r), c->r->org, t)) {
    out_printf(o, "error (invalid_request): unknown template '%.64s'", t);
    o->is_error = true;
    json_decref(body);
    return -1;
  }
  struct moat_sandbox_info info;
  memset(&info, 0, sizeof(info));
  rc = moat_control_create(api_control(c->r), c->r->org, &spec, &info, &err);
  json_decref(body);
  if (rc < 0)
    return out_moat_error(o, "create_sandbox", &err);
  out_json(o, sandbox_brief(&info));
  moat_sandbox_info_clear(&info);
  return 0;
}

static int tool_list(const struct mcp_call *c, json_t *args, struct tool_out *o) {
  static const char *const keys[] = {"state", "metadata", NULL};
  const char *st;
  json_t *meta;
  enum moat_sandbox_state state;
  if (check_keys(args, keys, o) < 0 || arg_str(args, "state", false, 16, &st, o) < 0 ||
      arg_str_map(args, "metadata", &meta, o) < 0)
    return -1;
  if (st && moat_sandbox_state_parse(st, &state) < 0)
    return bad_args(o, "'state' must be one of creating, running, paused, hibernated, killed");
  moat_error *err = NULL;
  struct moat_sandbox_info *v = NULL;
  size_t n = 0;
  if (moat_control_list(api_control(c->r), c->r->org, st ? &state : NULL, meta, &v, &n, &err) < 0)
    return out_moat_error(o, "list_sandboxes", &err);
  json_t *arr = json_array();
  for (size_t i = 0; i < n; i++)
    json_array_append_new(arr, sandbox_brief(&v[i]));
  moat_sandbox_infos_free(v, n);
  out_json(o, json_pack("{s:o}", "sandboxes", arr));
  return 0;
}

static int tool_exec(const struct mcp_call *c, json_t *args, struct tool_out *o) {
  static const char *const keys[] = {"sandbox_id", "command", "timeout_ms", "cwd", NULL};
  const char *id;
  if (check_keys(args, keys, o) < 0 || arg_sandbox(args, &id, o) < 0)
    return -1;
  return run_command(c, id, args, o);
}

static int tool_fork(const struct mcp_call *c, json_t *args, struct tool_out *o) {
  static const char *const keys[] = {"sandbox_id", "count", NULL};
  const char *id;
  int64_t count;
  if (check_keys(args, keys, o) < 0 || arg_sandbox(args, &id, o) < 0 ||
      arg_int(args, "count", 1, MCP_MAX_FORK, 1, &count, o) < 0)
    return -1;
  moat_error *err = NULL;
  struct moat_sandbox_info *kids = NULL;
  if (moat_control_fork(api_control(c->r), c->r->org, id, (unsigned)count, false, &kids, &err) < 0)
    return out_moat_error(o, "fork_sandbox", &err);
  json_t *arr = json_array();
  for (int64_t i = 0; i < count; i++)
    json_array_append_new(arr, sandbox_brief(&kids[i]));
  moat_sandbox_infos_free(kids, (size_t)count);
  out_json(o, json_pack("{s:o}", "sandboxes", arr));
  return 0;
}

static int tool_hibernate(const struct mcp_call *c, json_t *args, struct tool_out *o) {
  static const char *const keys[] = {"sandbox_id", NULL};
  const char *id;
  if (check_keys(args, keys, o) < 0 || arg_sandbox(args, &id, o) < 0)
    return -1;
  moat_error *err = NULL;
  if (moat_control_hibernate(api_control(c->r), c->r->org, id, &err) < 0)
    return out_moat_error(o, "hibernate_sandbox", &err);
  out_printf(o, "sandbox %s is hibernated; the next exec in it wakes it", id);
  return 0;
}

static int tool_kill(const struct mcp_call *c, json_t *args, struct tool_out *o) {
  static const char *const keys[] = {"sandbox_id", NULL};
  const char *id;
  if (check_keys(args, keys, o) < 0 || arg_sandbox(args, &id, o) < 0)
    return -1;
  moat_error *err = NULL;
  if (moat_control_kill(api_control(c->r), c->r->org, id, "api", &err) < 0)
    return out_moat_error(o, "kill_sandbox", &err);
  out_printf(o, "sandbox %s is killed", id);
  return 0;
}

/* ---- database tools ---- */

static int arg_database(json_t *args, const char **id, struct tool_out *o) {
  if (arg_str(args, "database_id", true, 64, id, o) < 0)
    return -1;
  if (strncmp(*id, "db-", 3) != 0 || strlen(*id) != MOAT_DB_ID_LEN) {
    out_printf(o, "error (not_found): no database '%.64s' (ids look like db-0123456789abcdefg)", *id);
    o->is_error = true;
    return -1;
  }
  return 0;
}

/* The optional idle_seconds and metadata of a create or a branch, into body (a new reference). */
static int db_common_args(json_t *args, json_t *body, struct tool_out *o) {
  int64_t idle;
  json_t *meta;
  if (arg_int(args, "idle_seconds", 1, MOAT_DB_MAX_IDLE_S, 0, &idle, o) < 0 ||
      arg_str_map(args, "metadata", &meta, o) < 0)
    return -1;
  if (idle)
    json_object_set_new(body, "idle_seconds", json_integer(idle));
  if (meta)
    json_object_set(body, "metadata", meta);
  return 0;
}

static int tool_database_create(const struct mcp_call *c, json_t *args, struct tool_out *o) {
  static const char *const keys[] = {"name", "size_mb", "idle_seconds", "metadata", NULL};
  const char *name;
  int64_t size;
  if (check_keys(args, keys, o) < 0 || arg_str(args, "name", true, 63, &name, o) < 0 ||
      arg_int(args, "size_mb", MOAT_DB_MIN_SIZE_MB, MOAT_MAX_DISK_MB, 0, &size, o) < 0)
    return -1;
  _cleanup_json_ json_t *body = json_pack("{s:s}", "name", name);
  if (db_common_args(args, body, o) < 0)
    return -1;
  if (size)
    json_object_set_new(body, "size_mb", json_integer(size));
  /* The same checks as POST /v1/databases. */
  moat_error *err = NULL;
  struct moat_database_spec spec;
  if (api_parse_database_create(body, &spec, &err) < 0)
    return out_moat_error(o, "database_create", &err);
  struct moat_database_info d;
  if (moat_control_database_create(api_control(c->r), c->r->org, &spec, &d, &err) < 0)
    return out_moat_error(o, "database_create", &err);
  out_json(o, api_database_json(c->r, &d));
  moat_database_info_clear(&d);
  return 0;
}

static int tool_database_list(const struct mcp_call *c, json_t *args, struct tool_out *o) {
  static const char *const keys[] = {NULL};
  if (check_keys(args, keys, o) < 0)
    return -1;
  moat_error *err = NULL;
  struct moat_database_info *v = NULL;
  size_t n = 0;
  if (moat_control_database_list(api_control(c->r), c->r->org, &v, &n, &err) < 0)
    return out_moat_error(o, "database_list", &err);
  json_t *arr = json_array();
  for (size_t i = 0; i < n; i++)
    json_array_append_new(arr, api_database_json(c->r, &v[i]));
  moat_database_infos_free(v, n);
  out_json(o, json_pack("{s:o}", "databases", arr));
  return 0;
}

static int tool_database_branch(const struct mcp_call *c, json_t *args, struct tool_out *o) {
  static const char *const keys[] = {"database_id", "name", "idle_seconds", "metadata", NULL};
  const char *id, *name;
  if (check_keys(args, keys, o) < 0 || arg_database(args, &id, o) < 0 ||
      arg_str(args, "name", true, 63, &name, o) < 0)
    return -1;
  _cleanup_json_ json_t *body = json_pack("{s:s}", "name", name);
  if (db_common_args(args, body, o) < 0)
    return -1;
  /* The same checks as POST /v1/databases/{id}/branch. */
  moat_error *err = NULL;
  struct moat_database_spec spec;
  if (api_parse_database_create(body, &spec, &err) < 0)
    return out_moat_error(o, "database_branch", &err);
  struct moat_database_info d;
  if (moat_control_database_branch(api_control(c->r), c->r->org, id, &spec, &d, &err) < 0)
    return out_moat_error(o, "database_branch", &err);
  out_json(o, api_database_json(c->r, &d));
  moat_database_info_clear(&d);
  return 0;
}

static int tool_database_delete(const struct mcp_call *c, json_t *args, struct tool_out *o) {
  static const char *const keys[] = {"database_id", NULL};
  const char *id;
  if (check_keys(args, keys, o) < 0 || arg_database(args, &id, o) < 0)
    return -1;
  moat_error *err = NULL;
  if (moat_control_database_delete(api_control(c->r), c->r->org, id, &err) < 0)
    return out_moat_error(o, "database_delete", &err);
  out_printf(o, "database %s is deleted, with its data", id);
  return 0;
}

/* ---- the tables ---- */

struct tool {
  const char *name, *title, *description;
  const char *schema; /* inputSchema, JSON */
  int (*run)(const struct mcp_call *c, json_t *args, struct tool_out *o);
  bool reads; /* it changes nothing: a readonly API key may call it (no other tool) */
};

#define CMD_PROPS                                                                                            \
  "\"command\":{\"type\":\"string\",\"description\":\"Shell command, run as root with /bin/sh -c\"},"        \
  "\"timeout_ms\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":3600000,\"description\":\"Kill the "       \
  "command "                                                                                                 \
  "after this many milliseconds (default 60000)\"},"                                                         \
  "\"cwd\":{\"type\":\"string\",\"description\":\"Working directory (default /root)\"}"
#define SB_PROP                                                                                              \
  "\"sandbox_id\":{\"type\":\"string\",\"pattern\":\"^sb-[a-z0-9]{17}$\",\"description\":\"Sandbox id\"}"
#define DB_PROP                                                                                              \
  "\"database_id\":{\"type\":\"string\",\"pattern\":\"^db-[a-z0-9]{17}$\",\"description\":\"Database id\"}"
#define DB_NAME_PROP                                                                                         \
  "\"name\":{\"type\":\"string\",\"pattern\":\"^[a-z0-9][a-z0-9_-]{0,62}$\","                                \
  "\"description\":\"Database name, unique in this account\"}"
#define DB_COMMON_PROPS                                                                                      \
  "\"idle_seconds\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":2592000,"                                \
  "\"description\":\"Hibernate after this many seconds with no connection (default 300); the next "          \
  "connection wakes it\"},"                                                                                  \
  "\"metadata\":{\"type\":\"object\",\"additionalProperties\":{\"type\":\"string\"},"                        \
  "\"description\":\"Labels\"}"

static const struct tool sandbox_tools[] = {
    {"shell", "Run a shell command",
     "Runs a shell command in the sandbox and returns its exit code, stdout and stderr (each cut at 1 MiB).",
     "{\"type\":\"object\",\"properties\":{" CMD_PROPS
     "},\"required\":[\"command\"],\"additionalProperties\":false}",
     tool_shell, false},
    {"read_file", "Read a text file",
     "Returns the text of a file in the sandbox (up to 1 MiB; a binary file is reported, not shown).",
     "{\"type\":\"object\",\"properties\":{\"path\":{\"type\":\"string\",\"description\":\"File path; "
     "relative "
     "paths are against /root\"}},\"required\":[\"path\"],\"additionalProperties\":false}",
     tool_read_file, true},
    {"write_file", "Write a file",
     "Writes content to a file in the sandbox, replacing it and creating parent directories.",
     "{\"type\":\"object\",\"properties\":{\"path\":{\"type\":\"string\",\"description\":\"File path; "
     "relative "
     "paths are against /root\"},\"content\":{\"type\":\"string\",\"description\":\"The new contents "
     "(UTF-8)\"}},\"required\":[\"path\",\"content\"],\"additionalProperties\":false}",
     tool_write_file, false},
    {"list_dir", "List a directory",
     "Lists a directory in the sandbox: one line per entry with type, size, mode and path.",
     "{\"type\":\"object\",\"properties\":{\"path\":{\"type\":\"string\",\"description\":\"Directory path\"},"
     "\"depth\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":16,\"description\":\"Levels to descend "
     "(default 1)\"}},\"required\":[\"path\"],\"additionalProperties\":false}",
     tool_list_dir, true},
};

static const struct tool workspace_tools[] = {
    {"create_sandbox", "Create a sandbox",
     "Creates a new isolated Linux sandbox and returns it as JSON (its id is what the other tools take).",
     "{\"type\":\"object\",\"properties\":{\"template\":{\"type\":\"string\",\"description\":\"Template name "
     "(default base; code-interpreter has python3 with data "
     "libraries)\"},\"ttl_seconds\":{\"type\":\"integer\","
     "\"minimum\":1,\"maximum\":2592000,\"description\":\"Lifetime in seconds (default "
     "3600)\"},\"metadata\":{"
     "\"type\":\"object\",\"additionalProperties\":{\"type\":\"string\"},\"description\":\"Labels to find it "
     "by\"}},\"additionalProperties\":false}",
     tool_create, false},
    {"list_sandboxes", "List sandboxes",
     "Lists this account's sandboxes (not killed ones unless state is killed) as JSON.",
     "{\"type\":\"object\",\"properties\":{\"state\":{\"type\":\"string\",\"enum\":[\"creating\",\"running\","
     "\"paused\",\"hibernated\",\"killed\"]},\"metadata\":{\"type\":\"object\",\"additionalProperties\":{"
     "\"type\":"
     "\"string\"},\"description\":\"Only sandboxes with all these labels\"}},\"additionalProperties\":false}",
     tool_list, true},
    {"exec", "Run a command in a sandbox",
     "Runs a shell command in a sandbox and returns its exit code, stdout and stderr (each cut at 1 MiB).",
     "{\"type\":\"object\",\"properties\":{" SB_PROP "," CMD_PROPS
     "},\"required\":[\"sandbox_id\",\"command\"],\"additionalProperties\":false}",
     tool_exec, false},
    {"fork_sandbox", "Fork a sandbox",
     "Copies a running sandbox (memory, processes and files) count times; returns the new sandboxes as JSON.",
     "{\"type\":\"object\",\"properties\":{" SB_PROP
     ",\"count\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":16,"
     "\"description\":\"Number of copies (default "
     "1)\"}},\"required\":[\"sandbox_id\"],\"additionalProperties\":"
     "false}",
     tool_fork, false},
    {"hibernate_sandbox", "Hibernate a sandbox",
     "Saves a sandbox to disk and frees its memory; the next exec in it wakes it where it was.",
     "{\"type\":\"object\",\"properties\":{" SB_PROP
     "},\"required\":[\"sandbox_id\"],\"additionalProperties\":false}",
     tool_hibernate, false},
    {"kill_sandbox", "Kill a sandbox", "Ends a sandbox and deletes its files.",
     "{\"type\":\"object\",\"properties\":{" SB_PROP
     "},\"required\":[\"sandbox_id\"],\"additionalProperties\":false}",
     tool_kill, false},
    {"database_create", "Create a PostgreSQL database",
     "Creates a PostgreSQL 15 database whose data outlives sandboxes and returns it as JSON, with "
     "connection.url (postgresql://...) to connect with.",
     "{\"type\":\"object\",\"properties\":{" DB_NAME_PROP
     ",\"size_mb\":{\"type\":\"integer\",\"minimum\":64,\"description\":\"Size of its data volume in MiB "
     "(default 1024)\"}," DB_COMMON_PROPS "},\"required\":[\"name\"],\"additionalProperties\":false}",
     tool_database_create, false},
    {"database_list", "List databases",
     "Lists this account's PostgreSQL databases, with their connections, as JSON.",
     "{\"type\":\"object\",\"properties\":{},\"additionalProperties\":false}", tool_database_list, true},
    {"database_branch", "Branch a database",
     "Makes a new PostgreSQL database holding a database's data as it is now (its own credentials; the two "
     "change independently from then on) and returns it as JSON, as database_create does.",
     "{\"type\":\"object\",\"properties\":{" DB_PROP "," DB_NAME_PROP "," DB_COMMON_PROPS
     "},\"required\":[\"database_id\",\"name\"],\"additionalProperties\":false}",
     tool_database_branch, false},
    {"database_delete", "Delete a database", "Deletes a PostgreSQL database and all its data.",
     "{\"type\":\"object\",\"properties\":{" DB_PROP
     "},\"required\":[\"database_id\"],\"additionalProperties\":false}",
     tool_database_delete, false},
};

static const struct tool *tools_of(enum mcp_endpoint ep, size_t *n) {
  if (ep == MCP_EP_SANDBOX) {
    *n = ARRAY_SIZE(sandbox_tools);
    return sandbox_tools;
  }
  *n = ARRAY_SIZE(workspace_tools);
  return workspace_tools;
}

json_t *mcp_tools_list(enum mcp_endpoint ep, bool reads_only) {
  size_t n;
  const struct tool *t = tools_of(ep, &n);
  json_t *arr = json_array();
  for (size_t i = 0; i < n; i++) {
    if (reads_only && !t[i].reads)
      continue;
    json_error_t je;
    json_t *schema = json_loads(t[i].schema, 0, &je);
    if (!schema)
      abort(); /* a schema above is malformed: a bug caught by any tools/list test */
    json_array_append_new(arr, json_pack("{s:s, s:s, s:s, s:o, s:{s:b}}", "name", t[i].name, "title",
                                         t[i].title, "description", t[i].description, "inputSchema", schema,
                                         "annotations", "readOnlyHint", t[i].reads));
  }
  return arr;
}

json_t *mcp_tool_call(const struct mcp_call *c, const char *name, json_t *args, int *rpc_code,
                      char **rpc_msg) {
  size_t n;
  const struct tool *t = tools_of(c->ep, &n);
  for (size_t i = 0; i < n; i++) {
    if (strcmp(t[i].name, name) != 0)
      continue;
    struct tool_out o = {.content = json_array()};
    if (c->r && c->r->has_key && c->r->key.role == MOAT_ROLE_READONLY && !t[i].reads) {
      out_printf(&o,
                 "error (forbidden): this API key's role is readonly: it may only call the tools that read, "
                 "not %s",
                 name);
      o.is_error = true;
    } else {
      t[i].run(c, args, &o);
    }
    if (o.bad_args && !c->bad_args_as_result) {
      json_t *first = json_array_get(o.content, 0);
      *rpc_code = -32602;
      *rpc_msg = xasprintf("%s: %s", name, json_string_value(json_object_get(first, "text")));
      json_decref(o.content);
      return NULL;
    }
    return json_pack("{s:o, s:b}", "content", o.content, "isError", o.is_error);
  }
  *rpc_code = -32602;
  *rpc_msg = xasprintf("Unknown tool: %.128s", name);
  return NULL;
}

/* envd_process.c -- envd's process.Process on moat's guest processes
 *
 * Start runs ProcessConfig{cmd, args, envs, cwd} (the SDK sends /bin/bash -l -c CMD) as the
 * call's user, over the sandbox's env, and streams StartResponse{event}: start{pid}, then
 * data{stdout|stderr|pty} (base64 bytes), then end{exitCode, exited, status, error} as Go's
 * os/exec reports them ("exit status 1", "signal: killed"). As in envd, the process outlives the
 * stream (the SDK's disconnect() leaves it running) but not the call's Connect-Timeout-Ms: the
 * guest kills it then (the SDK's timeoutMs, 60 s by default, 0 = none). stdin is closed at once
 * when StartRequest.stdin is false (the SDK's default), open when true or absent, as in envd.
 * Connect attaches to a running process by pid or tag (live output only unless replay is set, as
 * envd; an exited process is not_found).
 */
#include <ctype.h>
#include <errno.h>
#include <microhttpd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../common/log.h"
#include "envd.h"

struct proc_ctx {
  struct moat_proc_stream *ps;
  bool pty;
  struct moat_control *ctl;
  char *org;
  char id[MOAT_ID_LEN + 1];
};

static struct proc_ctx *proc_ctx_new(struct api_req *r, struct envd_req *q, struct moat_proc_stream *ps,
                                     bool pty) {
  struct proc_ctx *c = xcalloc(1, sizeof(*c));
  c->ps = ps;
  c->pty = pty;
  c->ctl = api_control(r);
  c->org = xstrdup(q->e->org);
  snprintf(c->id, sizeof(c->id), "%s", q->e->sandbox_id);
  return c;
}

static void proc_ctx_free(void *p) {
  struct proc_ctx *c = p;
  if (c->ps)
    moat_proc_stream_close(c->ps);
  free(c->org);
  free(c);
}

static json_t *event_msg(const char *kind, json_t *v) { return json_pack("{s:{s:o}}", "event", kind, v); }

static void send_data(struct cx_stream *s, const char *field, const char *p, size_t n) {
  char *b = moat_base64_encode(p, n, NULL);
  cx_send(s, event_msg("data", json_pack("{s:s}", field, b)));
  free(b);
}

static void proc_pull(struct cx_stream *s, int timeout_ms) {
  struct proc_ctx *c = s->ctx;
  moat_error *err = NULL;
  struct moat_proc_event ev;
  int rc = moat_proc_stream_next(c->ps, &ev, timeout_ms, &err);
  if (rc < 0 && err && err->status == ETIMEDOUT) {
    moat_error_free(&err);
    return;
  }
  if (rc < 0 && e2b_sandbox_gone(c->ctl, c->org, c->id)) {
    /* the guest connection failed (reset) because the sandbox was killed: as the end below */
    moat_error_free(&err);
    s->cut = true;
    return;
  }
  if (rc < 0)
    return cx_end_moat_error(s, &err);
  if (rc == 0) {
    /* no exit status: the sandbox went away. E2B's proxy drops the connection then, and the SDK
     * (seeing its health check fail) says the sandbox was killed or reached its end of life. */
    s->cut = true;
    return;
  }
  switch (ev.type) {
  case MOAT_PROC_STDOUT:
    send_data(s, c->pty ? "pty" : "stdout", ev.data, ev.len);
    break;
  case MOAT_PROC_STDERR:
    send_data(s, c->pty ? "pty" : "stderr", ev.data, ev.len);
    break;
  case MOAT_PROC_DROPPED:
    break; /* only on replay, which Connect does not ask for */
  case MOAT_PROC_EXIT: {
    if (ev.timed_out)
      return cx_end(s, "deadline_exceeded", "the command was killed when its timeout passed");
    char status[64];
    json_t *end;
    if (ev.signal) {
      snprintf(status, sizeof(status), "signal: %s",
               ev.signal == SIGKILL   ? "killed"
               : ev.signal == SIGTERM ? "terminated"
               : ev.signal == SIGINT  ? "interrupt"
               : ev.signal == SIGHUP  ? "hangup"
                                      : strsignal(ev.signal));
      status[8] = (char)tolower((unsigned char)status[8]); /* Go's names are lower case */
      end = json_pack("{s:i, s:b, s:s, s:s}", "exitCode", -1, "exited", 0, "status", status, "error", status);
    } else {
      snprintf(status, sizeof(status), "exit status %d", ev.exit_code);
      end = json_pack("{s:i, s:b, s:s}", "exitCode", ev.exit_code, "exited", 1, "status", status);
      if (ev.exit_code != 0)
        json_object_set_new(end, "error", json_string(status));
    }
    cx_send(s, event_msg("end", end));
    cx_end(s, NULL, " ");
    break;
  }
  }
}

/* ProcessSelector {pid} | {tag} of msg.process. -1 EINVAL. */
static int selector(json_t *msg, int *pid, const char **tag, moat_error **err) {
  json_t *p = json_object_get(msg, "process");
  *pid = 0;
  *tag = NULL;
  if (!json_is_object(p))
    return moat_error_set(err, EINVAL, "field 'process' (a ProcessSelector) is required");
  uint64_t v;
  if (envd_json_uint(p, "pid", INT32_MAX, 0, &v, err) < 0 || envd_json_str(p, "tag", tag, err) < 0)
    return -1;
  *pid = (int)v;
  if (*tag && !api_valid_tag(*tag))
    return moat_error_set(err, EINVAL, "tag must be 1 to 64 of [A-Za-z0-9_.-], not all digits");
  if (!*pid && !*tag)
    return moat_error_set(err, EINVAL, "the process selector needs a pid or a tag");
  return 0;
}

static int reply_not_found(struct api_req *r, int pid, const char *tag) {
  if (tag)
    return cx_reply_error(r, "not_found", "process with tag %s not found", tag);
  return cx_reply_error(r, "not_found", "process with pid %d not found", pid);
}

/* Replies to a failed one-shot process operation. */
static int reply_proc_error(struct api_req *r, int pid, const char *tag, moat_error **err) {
  if (*err && (*err)->status == ESRCH) {
    moat_error_free(err);
    return reply_not_found(r, pid, tag);
  }
  return cx_reply_moat_error(r, err);
}

static int stream_fail(struct api_req *r, moat_error **err) {
  int ret = cx_stream_error(r, cx_errno_code(*err ? (*err)->status : 0), "%s", moat_error_msg(*err));
  moat_error_free(err);
  return ret;
}

/* ProcessConfig -> argv (owned), env entries appended to env (owned), cwd (borrowed). */
static int parse_config(json_t *cfg, char ***argv, char ***env, const char **cwd, moat_error **err) {
  const char *cmd;
  if (!json_is_object(cfg))
    return moat_error_set(err, EINVAL, "field 'process' (a ProcessConfig) is required");
  if (envd_json_str(cfg, "cmd", &cmd, err) < 0 || envd_json_str(cfg, "cwd", cwd, err) < 0)
    return -1;
  if (!cmd || !*cmd)
    return moat_error_set(err, EINVAL, "field 'process.cmd' is required");
  if (*cwd && !**cwd)
    *cwd = NULL;
  if (*cwd && api_check_path("cwd", *cwd, strlen(*cwd), err) < 0)
    return -1;
  json_t *args = json_object_get(cfg, "args"), *envs = json_object_get(cfg, "envs");
  if (args && !json_is_null(args) && !json_is_array(args))
    return moat_error_set(err, EINVAL, "field 'process.args' must be an array of strings");
  if (envs && !json_is_null(envs) && !json_is_object(envs))
    return moat_error_set(err, EINVAL, "field 'process.envs' must be an object of strings");
  size_t na = json_array_size(args);
  if (na + 1 > API_MAX_ARGV)
    return moat_error_set(err, EINVAL, "more than %d arguments", API_MAX_ARGV);
  if (json_object_size(envs) > API_MAX_ENV_KEYS)
    return moat_error_set(err, EINVAL, "more than %d environment variables", API_MAX_ENV_KEYS);
  char **v = xcalloc(na + 2, sizeof(char *));
  v[0] = xstrdup(cmd);
  for (size_t i = 0; i < na; i++) {
    json_t *a = json_array_get(args, i);
    if (!json_is_string(a) || strlen(json_string_value(a)) != json_string_length(a)) {
      strv_free(v);
      return moat_error_set(err, EINVAL, "process.args[%zu] must be a string without NUL bytes", i);
    }
    v[i + 1] = xstrdup(json_string_value(a));
  }
  char **e = xcalloc(json_object_size(envs) + 1, sizeof(char *));
  size_t ne = 0;
  const char *k;
  json_t *val;
  json_object_foreach(envs, k, val) {
    if (!api_valid_env_name(k) || strlen(k) > API_MAX_ENV_KEY || !json_is_string(val) ||
        json_string_length(val) > API_MAX_ENV_VALUE ||
        strlen(json_string_value(val)) != json_string_length(val)) {
      strv_free(v);
      strv_free(e);
      return moat_error_set(err, EINVAL, "process.envs: '%.128s' must be a valid name with a string value",
                            k);
    }
    e[ne++] = xasprintf("%s=%s", k, json_string_value(val));
  }
  *argv = v;
  *env = e;
  return 0;
}

static int p_start(struct api_req *r, struct envd_req *q, json_t *body) {
  moat_error *err = NULL;
  _cleanup_strv_ char **argv = NULL, **renv = NULL, **senv = NULL;
  const char *cwd = NULL, *tag = NULL;
  json_t *pty = json_object_get(body, "pty"), *in = json_object_get(body, "stdin");
  uint64_t cols = 0, rows = 0;
  if (parse_config(json_object_get(body, "process"), &argv, &renv, &cwd, &err) < 0 ||
      envd_json_str(body, "tag", &tag, &err) < 0)
    return stream_fail(r, &err);
  if (tag && !api_valid_tag(tag)) {
    moat_error_set(&err, EINVAL, "tag must be 1 to 64 of [A-Za-z0-9_.-], not all digits");
    return stream_fail(r, &err);
  }
  if (in && !json_is_boolean(in)) {
    moat_error_set(&err, EINVAL, "field 'stdin' must be a boolean");
    return stream_fail(r, &err);
  }
  if (pty && !json_is_null(pty)) {
    json_t *size = json_object_get(pty, "size");
    if (!json_is_object(size) || envd_json_uint(size, "cols", API_MAX_PTY, 0, &cols, &err) < 0 ||
        envd_json_uint(size, "rows", API_MAX_PTY, 0, &rows, &err) < 0 || !cols || !rows) {
      if (!err)
        moat_error_set(&err, EINVAL, "pty.size needs cols and rows from 1 to %d", API_MAX_PTY);
      return stream_fail(r, &err);
    }
  }
  _cleanup_free_ struct moat_guest_ep *sock = envd_guest(r, q, &senv, &err);
  if (!sock)
    return stream_fail(r, &err);
  _cleanup_strv_ char **env = strv_concat(senv, renv);
  const char *t = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Connect-Timeout-Ms");
  uint64_t timeout = 0;
  if (t && (parse_u64(t, &timeout) < 0 || timeout > ENVD_MAX_TIMEOUT_MS))
    timeout = ENVD_MAX_TIMEOUT_MS;
  struct moat_exec_req req = {
      .argv = argv,
      .env = env,
      .cwd = cwd,
      .user = q->user,
      .timeout_ms = (uint32_t)timeout,
      .max_output = UINT64_MAX, /* a stream has no cap */
  };
  struct moat_exec_opts opts = {
      .tag = tag,
      .pty_cols = (uint32_t)cols,
      .pty_rows = (uint32_t)rows,
      .keep_on_disconnect = true,
  };
  struct moat_proc_stream *ps = NULL;
  int pid = 0;
  if (moat_guest_exec_start(sock, &req, &opts, &ps, &pid, &err) < 0) {
    if (err && err->status == ENOENT && cwd)
      err->status = EINVAL; /* a missing cwd */
    return stream_fail(r, &err);
  }
  if (json_is_false(in) && !cols) { /* envd: absent means open (older clients), false /dev/null */
    moat_error *cerr = NULL;
    if (moat_proc_stream_close_input(ps, &cerr) < 0)
      moat_error_free(&cerr);
  }
  struct proc_ctx *c = proc_ctx_new(r, q, ps, cols != 0);
  struct cx_stream *s = cx_stream_new(r, event_msg("keepalive", json_object()));
  s->pull = proc_pull;
  s->ctx = c;
  s->ctx_free = proc_ctx_free;
  cx_send(s, event_msg("start", json_pack("{s:i}", "pid", pid)));
  return cx_stream_reply(r, s);
}

static int p_connect(struct api_req *r, struct envd_req *q, json_t *body) {
  moat_error *err = NULL;
  int pid;
  const char *tag;
  if (selector(body, &pid, &tag, &err) < 0)
    return stream_fail(r, &err);
  _cleanup_free_ struct moat_guest_ep *sock = envd_guest(r, q, NULL, &err);
  if (!sock)
    return stream_fail(r, &err);
  struct moat_proc_stream *ps = NULL;
  struct moat_proc_info info;
  memset(&info, 0, sizeof(info));
  json_t *replay = json_object_get(body, "replay"); /* newer envd: the retained output first */
  if (moat_guest_attach(sock, tag ? 0 : pid, tag, json_is_true(replay), &ps, &info, &err) < 0) {
    if (err && err->status == ESRCH) {
      moat_error_free(&err);
      if (tag)
        return cx_stream_error(r, "not_found", "process with tag %s not found", tag);
      return cx_stream_error(r, "not_found", "process with pid %d not found", pid);
    }
    return stream_fail(r, &err);
  }
  if (!info.running) {
    int p = info.pid;
    moat_proc_info_clear(&info);
    moat_proc_stream_close(ps);
    return cx_stream_error(r, "not_found", "process with pid %d not found (it has exited)", p);
  }
  struct proc_ctx *c = proc_ctx_new(r, q, ps, info.pty);
  struct cx_stream *s = cx_stream_new(r, event_msg("keepalive", json_object()));
  s->pull = proc_pull;
  s->ctx = c;
  s->ctx_free = proc_ctx_free;
  cx_send(s, event_msg("start", json_pack("{s:i}", "pid", info.pid)));
  moat_proc_info_clear(&info);
  return cx_stream_reply(r, s);
}

static int p_list(struct api_req *r, const struct moat_guest_ep *sock) {
  moat_error *err = NULL;
  struct moat_proc_info *v = NULL;
  size_t n = 0;
  if (moat_guest_procs(sock, &v, &n, &err) < 0)
    return cx_reply_moat_error(r, &err);
  json_t *arr = json_array();
  for (size_t i = 0; i < n; i++) {
    if (!v[i].running)
      continue; /* envd lists the processes it still runs */
    json_t *args = json_array();
    for (size_t k = 1; v[i].argv[0] && v[i].argv[k]; k++)
      json_array_append_new(args, api_str_json(v[i].argv[k]));
    json_t *p =
        json_pack("{s:{s:o, s:o, s:{}}, s:i}", "config", "cmd",
                  api_str_json(v[i].argv[0] ? v[i].argv[0] : ""), "args", args, "envs", "pid", v[i].pid);
    if (v[i].tag)
      json_object_set_new(p, "tag", api_str_json(v[i].tag));
    json_array_append_new(arr, p);
  }
  moat_proc_infos_free(v, n);
  return cx_reply(r, json_pack("{s:o}", "processes", arr));
}

/* True when the guest runs the process (pid, or tag when not NULL). */
static bool proc_running(const struct moat_guest_ep *sock, int pid, const char *tag) {
  moat_error *err = NULL;
  struct moat_proc_info *v = NULL;
  size_t n = 0;
  bool running = false;
  if (moat_guest_procs(sock, &v, &n, &err) < 0) {
    moat_error_free(&err);
    return true; /* unknown: keep the stdin answer */
  }
  for (size_t i = 0; i < n; i++)
    if (v[i].running && (tag ? v[i].tag && strcmp(v[i].tag, tag) == 0 : v[i].pid == pid))
      running = true;
  moat_proc_infos_free(v, n);
  return running;
}

/* Decodes a protobuf JSON bytes value (standard or URL-safe base64, padding optional). */
static int json_bytes(json_t *v, unsigned char **out, size_t *len) {
  if (!json_is_string(v))
    return -1;
  size_t n = json_string_length(v);
  _cleanup_free_ char *s = xstrndup(json_string_value(v), n);
  for (size_t i = 0; i < n; i++)
    s[i] = s[i] == '-' ? '+' : s[i] == '_' ? '/' : s[i];
  return moat_base64_decode(s, n, out, len);
}

static int p_send_input(struct api_req *r, const struct moat_guest_ep *sock, json_t *body) {
  moat_error *err = NULL;
  int pid;
  const char *tag;
  if (selector(body, &pid, &tag, &err) < 0)
    return cx_reply_moat_error(r, &err);
  json_t *in = json_object_get(body, "input");
  json_t *d = json_object_get(in, "stdin");
  if (!d)
    d = json_object_get(in, "pty");
  _cleanup_free_ unsigned char *data = NULL;
  size_t len = 0;
  if (!json_is_object(in))
    return cx_reply_error(r, "invalid_argument", "field 'input' (a ProcessInput) is required");
  if (d && json_bytes(d, &data, &len) < 0)
    return cx_reply_error(r, "invalid_argument", "input.stdin / input.pty must be base64 bytes");
  if (moat_guest_proc_stdin(sock, pid, tag, data, len, false, &err) < 0) {
    if (err && err->status == EPIPE) {
      /* The guest's EPIPE is "stdin closed" and also "has exited"; envd has forgotten an exited
       * process (not_found). */
      moat_error_free(&err);
      if (!proc_running(sock, pid, tag))
        return reply_not_found(r, pid, tag);
      return cx_reply_error(r, "failed_precondition",
                            "stdin of the process is closed (start it with stdin: true to send input)");
    }
    return reply_proc_error(r, pid, tag, &err);
  }
  return cx_reply(r, json_object());
}

static int p_close_stdin(struct api_req *r, const struct moat_guest_ep *sock, json_t *body) {
  moat_error *err = NULL;
  int pid;
  const char *tag;
  if (selector(body, &pid, &tag, &err) < 0)
    return cx_reply_moat_error(r, &err);
  if (moat_guest_proc_stdin(sock, pid, tag, NULL, 0, true, &err) < 0) {
    if (err && err->status == EPIPE) { /* already closed: closing again is harmless */
      moat_error_free(&err);
      return cx_reply(r, json_object());
    }
    return reply_proc_error(r, pid, tag, &err);
  }
  return cx_reply(r, json_object());
}

static int p_send_signal(struct api_req *r, const struct moat_guest_ep *sock, json_t *body) {
  moat_error *err = NULL;
  int pid;
  const char *tag;
  if (selector(body, &pid, &tag, &err) < 0)
    return cx_reply_moat_error(r, &err);
  json_t *sv = json_object_get(body, "signal");
  int sig = 0;
  if (json_is_string(sv) && strcmp(json_string_value(sv), "SIGNAL_SIGKILL") == 0)
    sig = SIGKILL;
  else if (json_is_string(sv) && strcmp(json_string_value(sv), "SIGNAL_SIGTERM") == 0)
    sig = SIGTERM;
  else if (json_is_integer(sv) && (json_integer_value(sv) == SIGKILL || json_integer_value(sv) == SIGTERM))
    sig = (int)json_integer_value(sv);
  if (!sig)
    return cx_reply_error(r, "invalid_argument", "field 'signal' must be SIGNAL_SIGTERM or SIGNAL_SIGKILL");
  if (moat_guest_proc_signal(sock, pid, tag, sig, &err) < 0)
    return reply_proc_error(r, pid, tag, &err);
  return cx_reply(r, json_object());
}

static int p_update(struct api_req *r, const struct moat_guest_ep *sock, json_t *body) {
  moat_error *err = NULL;
  int pid;
  const char *tag;
  uint64_t cols, rows;
  if (selector(body, &pid, &tag, &err) < 0)
    return cx_reply_moat_error(r, &err);
  json_t *pty = json_object_get(body, "pty");
  if (!pty || json_is_null(pty))
    return cx_reply(r, json_object()); /* nothing to update */
  json_t *size = json_object_get(pty, "size");
  if (!json_is_object(size) || envd_json_uint(size, "cols", API_MAX_PTY, 0, &cols, &err) < 0 ||
      envd_json_uint(size, "rows", API_MAX_PTY, 0, &rows, &err) < 0 || !cols || !rows) {
    moat_error_free(&err);
    return cx_reply_error(r, "invalid_argument", "pty.size needs cols and rows from 1 to %d", API_MAX_PTY);
  }
  if (moat_guest_proc_resize(sock, pid, tag, (uint32_t)cols, (uint32_t)rows, &err) < 0)
    return reply_proc_error(r, pid, tag, &err);
  return cx_reply(r, json_object());
}

void envd_process(struct api_req *r, struct envd_req *q, json_t *body) {
  const char *m = q->method;
  if (strcmp(m, "Start") == 0) {
    p_start(r, q, body);
    return;
  }
  if (strcmp(m, "Connect") == 0) {
    p_connect(r, q, body);
    return;
  }
  if (strcmp(m, "StreamInput") == 0) {
    /* A client stream needs HTTP/2 (or a full-duplex HTTP/1.1 body), which the SDK's fetch
     * transport does not use; SendInput covers it. */
    cx_reply_error(r, "unimplemented", "process.Process/StreamInput is not supported; use SendInput");
    return;
  }
  moat_error *err = NULL;
  _cleanup_free_ struct moat_guest_ep *sock = envd_guest(r, q, NULL, &err);
  if (!sock) {
    cx_reply_moat_error(r, &err);
    return;
  }
  if (strcmp(m, "List") == 0)
    p_list(r, sock);
  else if (strcmp(m, "SendInput") == 0)
    p_send_input(r, sock, body);
  else if (strcmp(m, "CloseStdin") == 0)
    p_close_stdin(r, sock, body);
  else if (strcmp(m, "SendSignal") == 0)
    p_send_signal(r, sock, body);
  else if (strcmp(m, "Update") == 0)
    p_update(r, sock, body);
  else
    cx_reply_error(r, "unimplemented", "process.Process/%.64s is not implemented", m);
}

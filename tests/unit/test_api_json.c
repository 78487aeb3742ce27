/* test_api_json.c -- request body validation, error mapping and response JSON of the API */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "api/http/http.h"
#include "tap.h"

static json_t *body(const char *s) {
  json_t *j = NULL;
  moat_error *err = NULL;
  if (api_body_parse(s, strlen(s), true, &j, &err) < 0) {
    printf("# body %s: %s\n", s, moat_error_msg(err));
    moat_error_free(&err);
    return NULL;
  }
  return j;
}

/* The error status of validating s with fn (0 on success); when msg is set, the message must
 * contain it or -2 is returned. */
enum which { CREATE, PATCH, EXEC, MKDIR, MOVE };
static int check(enum which w, const char *s, const char *msg) {
  json_t *j = body(s);
  if (!j)
    return -1;
  moat_error *err = NULL;
  int rc;
  struct moat_sandbox_spec spec;
  struct moat_sandbox_patch patch;
  struct moat_exec_req req;
  struct api_mkdir_req mk;
  struct api_move_req mv;
  switch (w) {
  case CREATE:
    rc = api_parse_create(j, 4096, &spec, &err);
    break;
  case PATCH:
    rc = api_parse_patch(j, &patch, &err);
    break;
  case EXEC:
    rc = api_parse_exec(j, &req, &err);
    if (rc == 0)
      api_exec_req_clear(&req);
    break;
  case MKDIR:
    rc = api_parse_mkdir(j, NULL, &mk, &err);
    break;
  default:
    rc = api_parse_move(j, NULL, &mv, &err);
    break;
  }
  int st = 0;
  if (rc < 0) {
    st = err ? err->status : -3;
    if (msg && !strstr(moat_error_msg(err), msg)) {
      printf("# message: %s\n", moat_error_msg(err));
      st = -2;
    }
  }
  moat_error_free(&err);
  json_decref(j);
  return st;
}

static void test_body_parse(void) {
  json_t *j = NULL;
  moat_error *err = NULL;
  OK(api_body_parse("", 0, true, &j, &err) == 0 && json_is_object(j) && json_object_size(j) == 0,
     "empty body -> {} when allowed");
  json_decref(j);
  OK(api_body_parse("  \n", 3, false, &j, &err) < 0 && err->status == EINVAL,
     "empty body rejected when required");
  moat_error_free(&err);
  OK(api_body_parse("{\"a\":", 5, true, &j, &err) < 0 && err->status == EBADMSG &&
         strstr(err->msg, "position"),
     "truncated JSON -> EBADMSG with position (%s)", moat_error_msg(err));
  moat_error_free(&err);
  OK(api_body_parse("[1]", 3, true, &j, &err) < 0 && err->status == EINVAL, "array body -> EINVAL");
  moat_error_free(&err);
  OK(api_body_parse("42", 2, true, &j, &err) < 0 && err->status == EBADMSG, "scalar body -> invalid JSON");
  moat_error_free(&err);
  OK(api_body_parse("{\"a\":1,\"a\":2}", 13, true, &j, &err) < 0 && err->status == EBADMSG,
     "duplicate keys rejected");
  moat_error_free(&err);
  OK(api_body_parse("{} x", 4, true, &j, &err) < 0 && err->status == EBADMSG, "trailing garbage rejected");
  moat_error_free(&err);
  OK(api_body_parse("{\"a\":\"\\u0000\"}", 14, true, &j, &err) < 0 && err->status == EBADMSG,
     "\\u0000 in a string rejected");
  moat_error_free(&err);
  OK(api_body_parse("{\"a\":\"\xff\"}", 8, true, &j, &err) < 0 && err->status == EBADMSG,
     "invalid UTF-8 rejected");
  moat_error_free(&err);
  OK(api_body_parse("{\"a\":99999999999999999999999}", 29, true, &j, &err) < 0 && err->status == EBADMSG,
     "integer overflow rejected");
  moat_error_free(&err);
}

static void test_create(void) {
  OK(check(CREATE, "{}", NULL) == 0, "create: empty body ok");
  OK(check(CREATE,
           "{\"template\":\"base\",\"ttl_seconds\":60,\"persistent\":true,\"metadata\":{\"a\":\"b\"},"
           "\"env\":{\"FOO_1\":\"x\"},\"cpu\":0.5,\"memory_mb\":256,\"pids\":100,\"disk_mb\":1024}",
           NULL) == 0,
     "create: every field ok");
  OK(check(CREATE, "{\"cpu\":2}", NULL) == 0, "create: integer cpu ok");
  OK(check(CREATE, "{\"memory_mb\":1.5}", "memory_mb") == EINVAL, "create: memory_mb 1.5 rejected");
  OK(check(CREATE, "{\"memory_mb\":2048.0}", "memory_mb") == EINVAL, "create: memory_mb 2048.0 rejected");
  OK(check(CREATE, "{\"memory_mb\":-1}", "memory_mb") == EINVAL, "create: negative memory rejected");
  OK(check(CREATE, "{\"memory_mb\":15}", "memory_mb") == EINVAL, "create: memory below 16 rejected");
  OK(check(CREATE, "{\"memory_mb\":4097}", "memory_mb") == EINVAL, "create: memory above host RAM rejected");
  OK(check(CREATE, "{\"memory_mb\":\"2048\"}", "memory_mb") == EINVAL, "create: memory as string rejected");
  OK(check(CREATE, "{\"ttl_seconds\":0}", "ttl_seconds") == EINVAL, "create: ttl 0 rejected");
  OK(check(CREATE, "{\"ttl_seconds\":2592001}", "ttl_seconds") == EINVAL,
     "create: ttl above 30 days rejected");
  OK(check(CREATE, "{\"ttl_seconds\":2592000}", NULL) == 0, "create: ttl 30 days ok");
  OK(check(CREATE, "{\"cpu\":0.01}", "cpu") == EINVAL, "create: cpu 0.01 rejected");
  OK(check(CREATE, "{\"cpu\":65}", "cpu") == EINVAL, "create: cpu 65 rejected");
  OK(check(CREATE, "{\"cpu\":true}", "cpu") == EINVAL, "create: cpu bool rejected");
  OK(check(CREATE, "{\"pids\":7}", "pids") == EINVAL, "create: pids 7 rejected");
  OK(check(CREATE, "{\"pids\":1000001}", "pids") == EINVAL, "create: pids 1000001 rejected");
  OK(check(CREATE, "{\"disk_mb\":9223372036854775807}", "disk_mb") == EINVAL, "create: huge disk rejected");
  OK(check(CREATE, "{\"persistent\":1}", "persistent") == EINVAL, "create: persistent 1 rejected");
  OK(check(CREATE, "{\"template\":5}", "template") == EINVAL, "create: template number rejected");
  OK(check(CREATE, "{\"template\":\"\"}", "template") == EINVAL, "create: empty template rejected");
  OK(check(CREATE, "{\"metadata\":{\"a\":1}}", "metadata.a") == EINVAL,
     "create: metadata value number rejected");
  OK(check(CREATE, "{\"metadata\":[]}", "metadata") == EINVAL, "create: metadata array rejected");
  OK(check(CREATE, "{\"metadata\":{\"\":\"x\"}}", "metadata") == EINVAL,
     "create: empty metadata key rejected");
  OK(check(CREATE, "{\"env\":{\"1A\":\"x\"}}", "not a valid variable name") == EINVAL,
     "create: env name 1A rejected");
  OK(check(CREATE, "{\"env\":{\"A=B\":\"x\"}}", "env") == EINVAL, "create: env name with = rejected");
  OK(check(CREATE, "{\"bogus\":1}", "'bogus'") == EINVAL, "create: unknown field named");
  OK(check(CREATE, "{\"network\":{}}", NULL) == 0,
     "create: network object accepted (control checks entries)");
  OK(check(CREATE, "{\"network\":[]}", "network") == EINVAL, "create: network must be an object");
  OK(check(CREATE, "{\"from_snapshot\":\"snap-0123456789abcdefg\"}", NULL) == 0,
     "create: from_snapshot accepted");
  OK(check(CREATE, "{\"from_snapshot\":7}", "from_snapshot") == EINVAL,
     "create: from_snapshot must be a string");
  OK(check(CREATE, "{\"persistent\":true,\"idle\":{\"hibernate_after_seconds\":60}}", NULL) == 0,
     "create: idle.hibernate_after_seconds accepted");
  OK(check(CREATE, "{\"idle\":{\"hibernate_after_seconds\":0}}", "hibernate_after_seconds") == EINVAL,
     "create: idle.hibernate_after_seconds 0 rejected");
  OK(check(CREATE, "{\"idle\":{\"cpu\":1}}", "idle.cpu") == EINVAL, "create: unknown idle field named");
  OK(check(CREATE, "{\"idle\":5}", "idle") == EINVAL, "create: idle must be an object");
  /* metadata limits */
  char big[4096];
  strcpy(big, "{\"metadata\":{");
  for (int i = 0; i < 65; i++)
    sprintf(big + strlen(big), "%s\"k%d\":\"v\"", i ? "," : "", i);
  strcat(big, "}}");
  OK(check(CREATE, big, "more than 64") == EINVAL, "create: 65 metadata keys rejected");
  char val[1200];
  memset(val, 'x', 1025);
  val[1025] = '\0';
  char *s = xasprintf("{\"metadata\":{\"k\":\"%s\"}}", val);
  OK(check(CREATE, s, "longer than 1024") == EINVAL, "create: metadata value of 1025 bytes rejected");
  free(s);
  val[1024] = '\0';
  s = xasprintf("{\"metadata\":{\"k\":\"%s\"}}", val);
  OK(check(CREATE, s, NULL) == 0, "create: metadata value of 1024 bytes ok");
  free(s);

  json_t *j = body("{\"template\":\"python\",\"memory_mb\":512,\"cpu\":1.5}");
  struct moat_sandbox_spec spec;
  moat_error *err = NULL;
  OK(j && api_parse_create(j, 0, &spec, &err) == 0 && strcmp(spec.template_name, "python") == 0 &&
         spec.limits.memory_mb == 512 && spec.limits.cpu == 1.5 && spec.limits.pids == 0 &&
         spec.ttl_seconds == 0,
     "create: values land in the spec, unset ones stay 0");
  json_decref(j);
}

static void test_patch(void) {
  OK(check(PATCH, "{}", NULL) == 0, "patch: empty ok");
  OK(check(PATCH, "{\"ttl_seconds\":10,\"persistent\":false,\"metadata\":{}}", NULL) == 0,
     "patch: all fields ok");
  OK(check(PATCH, "{\"cpu\":1}", "'cpu'") == EINVAL, "patch: cpu rejected by name");
  OK(check(PATCH, "{\"ttl_seconds\":-5}", "ttl_seconds") == EINVAL, "patch: negative ttl rejected");
  json_t *j = body("{\"ttl_seconds\":10,\"metadata\":{\"a\":\"b\"}}");
  struct moat_sandbox_patch p;
  moat_error *err = NULL;
  OK(j && api_parse_patch(j, &p, &err) == 0 && p.has_ttl && p.ttl_seconds == 10 && !p.has_persistent &&
         p.metadata,
     "patch: fields land in the patch");
  json_decref(j);
}

static void test_exec(void) {
  OK(check(EXEC, "{\"cmd\":\"echo hi\"}", NULL) == 0, "exec: cmd ok");
  OK(check(EXEC, "{\"argv\":[\"ls\",\"-l\"]}", NULL) == 0, "exec: argv ok");
  OK(check(EXEC, "{}", "exactly one") == EINVAL, "exec: neither cmd nor argv rejected");
  OK(check(EXEC, "{\"cmd\":\"x\",\"argv\":[\"x\"]}", "exactly one") == EINVAL, "exec: both rejected");
  OK(check(EXEC, "{\"argv\":[]}", "argv") == EINVAL, "exec: empty argv rejected");
  OK(check(EXEC, "{\"argv\":[\"ls\",1]}", "argv[1]") == EINVAL, "exec: non-string argv entry rejected");
  OK(check(EXEC, "{\"argv\":[\"\"]}", "argv[0]") == EINVAL, "exec: empty argv[0] rejected");
  OK(check(EXEC, "{\"argv\":\"ls\"}", "argv") == EINVAL, "exec: argv string rejected");
  OK(check(EXEC, "{\"cmd\":\"\"}", "cmd") == EINVAL, "exec: empty cmd rejected");
  OK(check(EXEC, "{\"cmd\":\"x\",\"timeout_ms\":0}", "timeout_ms") == EINVAL, "exec: timeout 0 rejected");
  OK(check(EXEC, "{\"cmd\":\"x\",\"timeout_ms\":86400001}", "timeout_ms") == EINVAL,
     "exec: timeout > 1 day rejected");
  OK(check(EXEC, "{\"cmd\":\"x\",\"timeout_ms\":1.5}", "timeout_ms") == EINVAL,
     "exec: fractional timeout rejected");
  OK(check(EXEC, "{\"cmd\":\"x\",\"env\":{\"A\":1}}", "env.A") == EINVAL, "exec: env value number rejected");
  OK(check(EXEC, "{\"cmd\":\"x\",\"env\":{\"A-B\":\"1\"}}", "env") == EINVAL, "exec: env name A-B rejected");
  OK(check(EXEC, "{\"cmd\":\"x\",\"stdin\":\"a\",\"stdin_b64\":\"YQ==\"}", "stdin") == EINVAL,
     "exec: stdin and stdin_b64 together rejected");
  OK(check(EXEC, "{\"cmd\":\"x\",\"stdin_b64\":\"!!\"}", "stdin_b64") == EINVAL, "exec: bad base64 rejected");
  OK(check(EXEC, "{\"cmd\":\"x\",\"user\":\"../etc\"}", "user") == EINVAL, "exec: user with / rejected");
  OK(check(EXEC, "{\"cmd\":\"x\",\"user\":\"\"}", "user") == EINVAL, "exec: empty user rejected");
  OK(check(EXEC, "{\"cmd\":\"x\",\"cwd\":7}", "cwd") == EINVAL, "exec: cwd number rejected");
  OK(check(EXEC, "{\"cmd\":\"x\",\"max_output\":7}", "'max_output'") == EINVAL, "exec: unknown field named");

  json_t *j = body(
      "{\"cmd\":\"echo $A\",\"env\":{\"A\":\"1\",\"B\":\"x=y\"},\"stdin_b64\":\"AP8=\",\"timeout_ms\":500,"
      "\"user\":\"agent\",\"cwd\":\"/tmp\"}");
  struct moat_exec_req r;
  moat_error *err = NULL;
  bool ok = j && api_parse_exec(j, &r, &err) == 0;
  OK(ok && strv_len(r.argv) == 3 && strcmp(r.argv[0], "/bin/sh") == 0 && strcmp(r.argv[1], "-c") == 0 &&
         strcmp(r.argv[2], "echo $A") == 0,
     "exec: cmd becomes /bin/sh -c CMD");
  OK(ok && strv_len(r.env) == 2 &&
         ((strcmp(r.env[0], "A=1") == 0 && strcmp(r.env[1], "B=x=y") == 0) ||
          (strcmp(r.env[1], "A=1") == 0 && strcmp(r.env[0], "B=x=y") == 0)),
     "exec: env becomes K=V");
  OK(ok && r.stdin_len == 2 && memcmp(r.stdin_data, "\x00\xff", 2) == 0, "exec: stdin_b64 decoded");
  OK(ok && r.timeout_ms == 500 && strcmp(r.user, "agent") == 0 && strcmp(r.cwd, "/tmp") == 0,
     "exec: timeout, user, cwd");
  if (ok)
    api_exec_req_clear(&r);
  json_decref(j);
}

static void test_files_bodies(void) {
  OK(check(MKDIR, "{\"path\":\"/a/b\"}", NULL) == 0, "mkdir: path ok");
  OK(check(MKDIR, "{}", "'path' is required") == EINVAL, "mkdir: path required");
  OK(check(MKDIR, "{\"path\":\"\"}", "path") == EINVAL, "mkdir: empty path rejected");
  OK(check(MKDIR, "{\"path\":\"/a\",\"parents\":\"yes\"}", "parents") == EINVAL,
     "mkdir: parents string rejected");
  OK(check(MKDIR, "{\"path\":\"/a\",\"mode\":\"0755\"}", "'mode'") == EINVAL, "mkdir: unknown field named");
  OK(check(MOVE, "{\"from\":\"a\",\"to\":\"b\"}", NULL) == 0, "move: ok");
  OK(check(MOVE, "{\"from\":\"a\"}", "'to'") == EINVAL, "move: to required");
  char *p = xmalloc(API_MAX_PATH + 32);
  memset(p, 'a', API_MAX_PATH + 1);
  p[API_MAX_PATH + 1] = '\0';
  char *s = xasprintf("{\"path\":\"%s\"}", p);
  OK(check(MKDIR, s, "longer than 4096") == EINVAL, "mkdir: path of 4097 bytes rejected");
  free(s);
  p[API_MAX_PATH] = '\0';
  s = xasprintf("{\"path\":\"%s\"}", p);
  OK(check(MKDIR, s, NULL) == 0, "mkdir: path of 4096 bytes ok");
  free(s);
  free(p);
  moat_error *err = NULL;
  OK(api_check_path("path", "a\0b", 3, &err) < 0 && err->status == EINVAL && strstr(err->msg, "NUL"),
     "path with NUL rejected");
  moat_error_free(&err);
  json_t *j = body("{\"path\":\"/x\",\"user\":\"bob\"}");
  struct api_mkdir_req mk;
  OK(j && api_parse_mkdir(j, "alice", &mk, &err) < 0 && err->status == EINVAL,
     "mkdir: query and body users disagree");
  moat_error_free(&err);
  OK(j && api_parse_mkdir(j, NULL, &mk, &err) == 0 && mk.parents && strcmp(mk.user, "bob") == 0,
     "mkdir: parents default true, user from body");
  json_decref(j);
}

static void test_errno_map(void) {
  static const struct {
    int e;
    unsigned http;
    const char *code;
  } t[] = {
      {ENOENT, 404, "not_found"},
      {EINVAL, 400, "invalid_request"},
      {EEXIST, 409, "already_exists"},
      {EBUSY, 409, "conflict"},
      {EAGAIN, 503, "unavailable"},
      {ENOTDIR, 400, "invalid_request"},
      {EISDIR, 400, "invalid_request"},
      {EACCES, 403, "forbidden"},
      {EPERM, 403, "forbidden"},
      {ENOSPC, 507, "insufficient_storage"},
      {EDQUOT, 507, "insufficient_storage"},
      {ENAMETOOLONG, 400, "invalid_request"},
      {ECONNREFUSED, 502, "sandbox_unreachable"},
      {EPIPE, 502, "sandbox_unreachable"},
      {EPROTO, 502, "sandbox_unreachable"},
      {EBADMSG, 400, "invalid_json"},
      {ENOSYS, 501, "not_implemented"},
      {EMSGSIZE, 413, "payload_too_large"},
      {EIO, 500, "internal"},
      {0, 500, "internal"},
  };
  for (size_t i = 0; i < ARRAY_SIZE(t); i++) {
    const char *code = NULL;
    unsigned h = api_errno_http(t[i].e, &code);
    OK(h == t[i].http && strcmp(code, t[i].code) == 0, "errno %d -> %u %s (got %u %s)", t[i].e, t[i].http,
       t[i].code, h, code);
  }
}

static void test_output(void) {
  struct moat_exec_result res = {0};
  res.out = "ok\n";
  res.out_len = 3;
  res.err = "bad\xff";
  res.err_len = 4;
  res.exit_code = -1;
  res.signal = 9;
  res.stderr_truncated = true;
  res.pid = 42;
  res.duration_ms = 17;
  json_t *j = api_exec_result_json(&res);
  OK(strcmp(json_string_value(json_object_get(j, "stdout")), "ok\n") == 0 &&
         !json_object_get(j, "stdout_b64"),
     "exec result: valid stdout has no stdout_b64");
  OK(strcmp(json_string_value(json_object_get(j, "stderr")), "bad\xEF\xBF\xBD") == 0 &&
         strcmp(json_string_value(json_object_get(j, "stderr_b64")), "YmFk/w==") == 0,
     "exec result: invalid stderr repaired, raw bytes in stderr_b64");
  OK(json_is_true(json_object_get(j, "truncated")) && json_is_false(json_object_get(j, "stdout_truncated")) &&
         json_integer_value(json_object_get(j, "exit_code")) == -1 &&
         json_integer_value(json_object_get(j, "signal")) == 9 &&
         json_integer_value(json_object_get(j, "pid")) == 42 &&
         json_integer_value(json_object_get(j, "duration_ms")) == 17 &&
         json_is_false(json_object_get(j, "timed_out")) && json_is_false(json_object_get(j, "oom_killed")),
     "exec result: flags and numbers");
  json_decref(j);
  res.oom_killed = true;
  j = api_exec_result_json(&res);
  OK(json_is_true(json_object_get(j, "oom_killed")), "exec result: oom_killed");
  json_decref(j);
  res.oom_killed = false;
  res.out = "a\0b";
  res.out_len = 3;
  j = api_exec_result_json(&res);
  char *dump = json_dumps(j, JSON_COMPACT);
  OK(strstr(dump, "\"stdout\":\"a\\u0000b\"") != NULL, "exec result: NUL bytes survive as \\u0000");
  free(dump);
  json_decref(j);

  struct moat_file_entry e = {.path = "/root/x",
                              .name = "x",
                              .type = 'l',
                              .size = 5,
                              .mode = 0100644,
                              .mtime_ms = 1000,
                              .uid = 1,
                              .gid = 2,
                              .link_target = "/etc/passwd"};
  j = api_file_entry_json(&e);
  OK(strcmp(json_string_value(json_object_get(j, "type")), "symlink") == 0 &&
         strcmp(json_string_value(json_object_get(j, "mode")), "0644") == 0 &&
         strcmp(json_string_value(json_object_get(j, "mtime")), "1970-01-01T00:00:01.000Z") == 0 &&
         strcmp(json_string_value(json_object_get(j, "symlink_target")), "/etc/passwd") == 0 &&
         json_integer_value(json_object_get(j, "size")) == 5,
     "file entry JSON");
  json_decref(j);
  e.type = 'd';
  e.link_target = NULL;
  e.mode = 041777;
  j = api_file_entry_json(&e);
  OK(strcmp(json_string_value(json_object_get(j, "type")), "dir") == 0 &&
         strcmp(json_string_value(json_object_get(j, "mode")), "1777") == 0 &&
         json_is_null(json_object_get(j, "symlink_target")),
     "dir entry: sticky mode, null symlink_target");
  json_decref(j);
  j = api_error_json("invalid_request", "bad \xff byte");
  OK(j && strcmp(json_string_value(json_object_get(j, "code")), "invalid_request") == 0 &&
         strcmp(json_string_value(json_object_get(j, "message")), "bad \xEF\xBF\xBD byte") == 0,
     "error JSON repairs invalid UTF-8 in messages");
  json_decref(j);
}

/* api_parse_exec_ex: 0 and *x, or the error status (-2 when msg is not in the message). */
static int check_ex(unsigned allow, const char *s, const char *msg, struct api_exec_extra *x) {
  json_t *j = body(s);
  if (!j)
    return -1;
  moat_error *err = NULL;
  struct moat_exec_req req;
  int rc = api_parse_exec_ex(j, allow, &req, x, &err), st = 0;
  static char tag[API_MAX_TAG + 1]; /* x->tag borrows from the body, freed below */
  if (rc == 0 && x->tag) {
    snprintf(tag, sizeof(tag), "%s", x->tag);
    x->tag = tag;
  }
  if (rc == 0)
    api_exec_req_clear(&req);
  else {
    st = err ? err->status : -3;
    if (msg && !strstr(moat_error_msg(err), msg)) {
      printf("# message: %s\n", moat_error_msg(err));
      st = -2;
    }
  }
  moat_error_free(&err);
  json_decref(j);
  return st;
}

static void test_exec_extra(void) {
  struct api_exec_extra x;
  OK(check_ex(API_EXEC_BACKGROUND, "{\"cmd\":\"x\",\"background\":true,\"tag\":\"web\"}", NULL, &x) == 0 &&
         x.background && strcmp(x.tag, "web") == 0 && x.pty_cols == 0,
     "exec: background with tag");
  OK(check_ex(API_EXEC_BACKGROUND, "{\"cmd\":\"x\",\"background\":true,\"pty\":{\"cols\":100,\"rows\":30}}",
              NULL, &x) == 0 &&
         x.pty_cols == 100 && x.pty_rows == 30,
     "exec: background on a pty");
  OK(check_ex(API_EXEC_BACKGROUND, "{\"cmd\":\"x\",\"background\":true,\"pty\":{}}", NULL, &x) == 0 &&
         x.pty_cols == 80 && x.pty_rows == 24,
     "exec: pty defaults 80x24");
  OK(check_ex(API_EXEC_BACKGROUND, "{\"cmd\":\"x\",\"tag\":\"web\"}", "background", &x) == EINVAL,
     "exec: tag without background rejected");
  OK(check_ex(API_EXEC_BACKGROUND, "{\"cmd\":\"x\",\"background\":1}", "background", &x) == EINVAL,
     "exec: background must be a boolean");
  OK(check_ex(API_EXEC_BACKGROUND, "{\"cmd\":\"x\",\"kill_on_disconnect\":true}", "kill_on_disconnect", &x) ==
         EINVAL,
     "exec: kill_on_disconnect only on exec/stream");
  OK(check_ex(API_EXEC_STREAM, "{\"cmd\":\"x\",\"kill_on_disconnect\":true}", NULL, &x) == 0 &&
         x.kill_on_disconnect && !x.background,
     "exec/stream: kill_on_disconnect");
  OK(check_ex(API_EXEC_STREAM, "{\"cmd\":\"x\"}", NULL, &x) == 0 && !x.kill_on_disconnect,
     "exec/stream: kill_on_disconnect defaults to false");
  OK(check_ex(API_EXEC_STREAM, "{\"cmd\":\"x\",\"background\":true}", "background", &x) == EINVAL,
     "exec/stream: background rejected");
  static const char *bad_pty[] = {"{\"cols\":0,\"rows\":10}",
                                  "{\"cols\":100000,\"rows\":10}",
                                  "{\"cols\":10,\"rows\":1001}",
                                  "{\"cols\":\"80\"}",
                                  "[80,24]",
                                  "{\"cols\":80,\"depth\":1}",
                                  "{\"cols\":1.5}"};
  for (size_t i = 0; i < ARRAY_SIZE(bad_pty); i++) {
    char b[256];
    snprintf(b, sizeof(b), "{\"cmd\":\"x\",\"pty\":%s}", bad_pty[i]);
    OK(check_ex(API_EXEC_STREAM, b, "pty", &x) == EINVAL, "exec/stream: pty %s rejected", bad_pty[i]);
  }
  static const char *bad_tag[] = {
      "\"\"",    "\"123\"", "\"a/b\"",
      "\"a b\"", "7",       "\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\""};
  for (size_t i = 0; i < ARRAY_SIZE(bad_tag); i++) {
    char b[256];
    snprintf(b, sizeof(b), "{\"cmd\":\"x\",\"tag\":%s}", bad_tag[i]);
    OK(check_ex(API_EXEC_STREAM, b, "tag", &x) == EINVAL, "exec/stream: tag %s rejected", bad_tag[i]);
  }
  OK(check(EXEC, "{\"cmd\":\"x\",\"background\":true}", "unknown field") == EINVAL,
     "api_parse_exec alone still rejects the issue-3 fields");
}

static void test_proc_json(void) {
  char *argv[] = {"sleep", "30", NULL};
  struct moat_proc_info p = {.pid = 7, .tag = "web", .argv = argv, .started_at_ms = 1000, .running = true};
  json_t *j = api_proc_info_json(&p);
  OK(json_integer_value(json_object_get(j, "pid")) == 7 &&
         strcmp(json_string_value(json_object_get(j, "cmd")), "sleep 30") == 0 &&
         json_array_size(json_object_get(j, "argv")) == 2 &&
         strcmp(json_string_value(json_object_get(j, "started_at")), "1970-01-01T00:00:01.000Z") == 0 &&
         json_is_true(json_object_get(j, "running")) && json_is_null(json_object_get(j, "exit_code")) &&
         strcmp(json_string_value(json_object_get(j, "tag")), "web") == 0,
     "process JSON of a running process");
  json_decref(j);
  p.running = false;
  p.exit_code = -1;
  p.signal = 9;
  p.tag = NULL;
  j = api_proc_info_json(&p);
  OK(json_integer_value(json_object_get(j, "exit_code")) == -1 &&
         json_integer_value(json_object_get(j, "signal")) == 9 && json_is_null(json_object_get(j, "tag")),
     "process JSON of a killed process");
  json_decref(j);
}

int main(void) {
  test_exec_extra();
  test_proc_json();
  test_body_parse();
  test_create();
  test_patch();
  test_exec();
  test_files_bodies();
  test_errno_map();
  test_output();
  return tap_done();
}

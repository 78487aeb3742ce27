/* test_api_router.c -- route matching (404/405/501), id checks and query-argument parsing */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "api/http/http.h"
#include "tap.h"

#define ID "sb-0123456789abcdefg"

/* moatd's routes: every front end's table, as api.c serves them. */
static struct api_router *g_router;

static enum api_match api_route_match(const char *method, const char *path, struct api_route *r) {
  return api_router_match(g_router, method, path, r);
}

#define JSON_BODY(r) ((r).def && ((r).def->flags & API_RT_JSON))
#define NEEDS_AUTH(r) ((r).def && !((r).def->flags & API_RT_PUBLIC))

static void route(const char *method, const char *path, enum api_match want, const char *name) {
  struct api_route r;
  enum api_match m = api_route_match(method, path, &r);
  bool ok = m == want && (want != API_MATCH_OK || strcmp(api_route_name(&r), name) == 0);
  OK(ok, "%s %s -> %d %s (got %d %s)", method, path, want, name ? name : "-", m, api_route_name(&r));
}

static void test_routes(void) {
  route("GET", "/healthz", API_MATCH_OK, "healthz");
  route("GET", "/v1/sandboxes", API_MATCH_OK, "sandboxes.list");
  route("POST", "/v1/sandboxes", API_MATCH_OK, "sandboxes.create");
  route("GET", "/v1/sandboxes/" ID, API_MATCH_OK, "sandbox.get");
  route("PATCH", "/v1/sandboxes/" ID, API_MATCH_OK, "sandbox.patch");
  route("DELETE", "/v1/sandboxes/" ID, API_MATCH_OK, "sandbox.delete");
  route("POST", "/v1/sandboxes/" ID "/exec", API_MATCH_OK, "exec");
  route("GET", "/v1/sandboxes/" ID "/files", API_MATCH_OK, "files.get");
  route("PUT", "/v1/sandboxes/" ID "/files", API_MATCH_OK, "files.put");
  route("DELETE", "/v1/sandboxes/" ID "/files", API_MATCH_OK, "files.delete");
  route("GET", "/v1/sandboxes/" ID "/files/list", API_MATCH_OK, "files.list");
  route("GET", "/v1/sandboxes/" ID "/files/stat", API_MATCH_OK, "files.stat");
  route("POST", "/v1/sandboxes/" ID "/files/mkdir", API_MATCH_OK, "files.mkdir");
  route("POST", "/v1/sandboxes/" ID "/files/move", API_MATCH_OK, "files.move");
  route("GET", "/v1/templates", API_MATCH_OK, "templates.list");
  route("POST", "/v1/templates/base/build", API_MATCH_OK, "templates.build");

  route("POST", "/healthz", API_MATCH_BAD_METHOD, 0);
  route("PUT", "/v1/sandboxes", API_MATCH_BAD_METHOD, 0);
  route("POST", "/v1/sandboxes/" ID, API_MATCH_BAD_METHOD, 0);
  route("GET", "/v1/sandboxes/" ID "/exec", API_MATCH_BAD_METHOD, 0);
  route("POST", "/v1/sandboxes/" ID "/files", API_MATCH_BAD_METHOD, 0);
  route("GET", "/v1/templates/base/build", API_MATCH_BAD_METHOD, 0);

  route("GET", "/", API_MATCH_NOT_FOUND, 0);
  route("GET", "/v1", API_MATCH_NOT_FOUND, 0);
  route("GET", "/v1/sandboxes/", API_MATCH_NOT_FOUND, 0);
  route("GET", "/v1/sandboxes/sb-abc", API_MATCH_NOT_FOUND, 0);
  route("GET", "/v1/sandboxes/sb-0123456789ABCDEFG", API_MATCH_NOT_FOUND, 0);
  route("GET", "/v1/sandboxes/sb-0123456789abcdefgh", API_MATCH_NOT_FOUND, 0);
  route("GET", "/v1/sandboxes/xx-0123456789abcdefg", API_MATCH_NOT_FOUND, 0);
  route("GET", "/v1/sandboxes/sb-0123456789abcde.g", API_MATCH_NOT_FOUND, 0);
  route("GET", "/v1/sandboxes/" ID "/", API_MATCH_NOT_FOUND, 0);
  route("GET", "/v1/sandboxes/" ID "/nope", API_MATCH_NOT_FOUND, 0);
  route("GET", "/v1/sandboxes/" ID "/files/", API_MATCH_NOT_FOUND, 0);
  route("GET", "/v1/sandboxes/" ID "/files/list/x", API_MATCH_NOT_FOUND, 0);
  route("GET", "/v1/healthz", API_MATCH_NOT_FOUND, 0);
  route("POST", "/v1/templates/Base/build", API_MATCH_NOT_FOUND, 0);
  route("POST", "/v1/templates/../build", API_MATCH_NOT_FOUND, 0);
  route("POST", "/v1/templates//build", API_MATCH_NOT_FOUND, 0);
  route("POST", "/v1/templates/myapp", API_MATCH_OK, "template.create");
  route("GET", "/v1/templates/myapp", API_MATCH_OK, "template.get");
  route("DELETE", "/v1/templates/myapp", API_MATCH_OK, "template.delete");
  route("PUT", "/v1/templates/myapp", API_MATCH_BAD_METHOD, 0);
  route("POST", "/v1/templates/myapp/import", API_MATCH_OK, "template.import");
  route("GET", "/v1/templates/myapp/builds/bd-0123/logs", API_MATCH_OK, "template.build.logs");
  route("GET", "/v1/templates/myapp/builds//logs", API_MATCH_NOT_FOUND, 0);
  route("POST", "/v1/templates/My_App", API_MATCH_NOT_FOUND, 0);

  route("POST", "/v1/sandboxes/" ID "/pause", API_MATCH_OK, "sandbox.pause");
  route("GET", "/v1/sandboxes/" ID "/pause", API_MATCH_BAD_METHOD, 0);
  route("POST", "/v1/sandboxes/" ID "/snapshots", API_MATCH_OK, "snapshots.create");
  route("POST", "/v1/sandboxes/" ID "/fork", API_MATCH_OK, "sandbox.fork");
  route("POST", "/v1/sandboxes/" ID "/explore", API_MATCH_OK, "sandbox.explore");
  route("POST", "/v1/sandboxes/" ID "/rollback", API_MATCH_OK, "sandbox.rollback");
  route("POST", "/v1/sandboxes/" ID "/mcp", API_MATCH_OK, "mcp.sandbox");
  route("POST", "/v1/mcp", API_MATCH_OK, "mcp.workspace");
  route("PUT", "/v1/mcp", API_MATCH_BAD_METHOD, 0);
  route("GET", "/v1/sandboxes/" ID "/events", API_MATCH_OK, "sandbox.events");
  route("POST", "/v1/sandboxes/" ID "/events", API_MATCH_BAD_METHOD, 0);
  route("GET", "/v1/sandboxes/" ID "/events/x", API_MATCH_NOT_FOUND, 0);
  route("POST", "/v1/sandboxes/" ID "/exec/stream", API_MATCH_OK, "exec.stream");
  route("GET", "/v1/sandboxes/" ID "/exec/stream", API_MATCH_BAD_METHOD, 0);
  route("GET", "/v1/sandboxes/" ID "/files/watch", API_MATCH_OK, "files.watch");
  route("GET", "/v1/sandboxes/" ID "/processes", API_MATCH_OK, "processes.list");
  route("POST", "/v1/sandboxes/" ID "/processes", API_MATCH_BAD_METHOD, 0);
  route("POST", "/v1/sandboxes/" ID "/processes/42/stdin", API_MATCH_OK, "process.stdin");
  route("POST", "/v1/sandboxes/" ID "/processes/42/signal", API_MATCH_OK, "process.signal");
  route("POST", "/v1/sandboxes/" ID "/processes/dev-server.1/resize", API_MATCH_OK, "process.resize");
  route("GET", "/v1/sandboxes/" ID "/processes/dev_server/stream", API_MATCH_OK, "process.stream");
  route("GET", "/v1/sandboxes/" ID "/processes/42/stdin", API_MATCH_BAD_METHOD, 0);
  route("POST", "/v1/sandboxes/" ID "/processes/42", API_MATCH_NOT_FOUND, 0);
  route("POST", "/v1/sandboxes/" ID "/processes/42/nope", API_MATCH_NOT_FOUND, 0);
  route("POST", "/v1/sandboxes/" ID "/processes//stdin", API_MATCH_NOT_FOUND, 0);
  route("POST", "/v1/sandboxes/" ID "/processes/0/stdin", API_MATCH_NOT_FOUND, 0);
  route("POST", "/v1/sandboxes/" ID "/processes/01/stdin", API_MATCH_NOT_FOUND, 0);
  route("POST", "/v1/sandboxes/" ID "/processes/9999999999/stdin", API_MATCH_NOT_FOUND, 0);
  route("POST", "/v1/sandboxes/" ID "/processes/a b/stdin", API_MATCH_NOT_FOUND, 0);
  route("POST",
        "/v1/sandboxes/" ID
        "/processes/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa/stdin",
        API_MATCH_NOT_FOUND, 0);
  route("GET", "/v1/sandboxes/" ID "/pty", API_MATCH_OK, "pty");
  route("POST", "/v1/sandboxes/" ID "/pty", API_MATCH_BAD_METHOD, 0);
  route("GET", "/v1/snapshots", API_MATCH_OK, "snapshots.list");
  route("DELETE", "/v1/snapshots/snap-1", API_MATCH_OK, "snapshot.delete");
  route("GET", "/v1/snapshots/snap-1", API_MATCH_OK, "snapshot.get");
  route("GET", "/v1/snapshots/a/b", API_MATCH_NOT_FOUND, 0);
  route("POST", "/v1/snapshots/snap-1", API_MATCH_BAD_METHOD, 0);
  route("GET", "/metrics", API_MATCH_OK, "metrics");
  route("POST", "/metrics", API_MATCH_BAD_METHOD, 0);
  route("GET", "/v1/sandboxes/" ID "/metrics", API_MATCH_OK, "sandbox.metrics");
  route("DELETE", "/v1/sandboxes/" ID "/metrics", API_MATCH_BAD_METHOD, 0);
  route("GET", "/v1/sandboxes/" ID "/metrics/x", API_MATCH_NOT_FOUND, 0);

  struct api_route r;
  OK(api_route_match("POST", "/v1/sandboxes/" ID, &r) == API_MATCH_BAD_METHOD &&
         strcmp(r.allow, "GET, PATCH, DELETE") == 0,
     "405 carries the Allow list");
  OK(api_route_match("PATCH", "/v1/sandboxes/" ID, &r) == API_MATCH_OK && strcmp(r.id, ID) == 0 &&
         JSON_BODY(r) && NEEDS_AUTH(r),
     "id captured, JSON body, auth");
  OK(api_route_match("GET", "/healthz", &r) == API_MATCH_OK && !NEEDS_AUTH(r), "healthz needs no auth");
  OK(api_route_match("GET", "/metrics", &r) == API_MATCH_OK && NEEDS_AUTH(r), "/metrics needs the API key");
  OK(api_route_match("PUT", "/v1/sandboxes/" ID "/files", &r) == API_MATCH_OK && !JSON_BODY(r),
     "files PUT is streamed, not a JSON body");
  OK(api_route_match("POST", "/v1/templates/code-interpreter/build", &r) == API_MATCH_OK &&
         strcmp(r.name, "code-interpreter") == 0,
     "template name captured");
  OK(api_route_match("POST", "/v1/sandboxes/" ID "/processes/1234/signal", &r) == API_MATCH_OK &&
         r.pid == 1234 && r.tag[0] == '\0' && JSON_BODY(r),
     "pid captured");
  OK(api_route_match("GET", "/v1/sandboxes/" ID "/processes/web.1/stream", &r) == API_MATCH_OK &&
         r.pid == 0 && strcmp(r.tag, "web.1") == 0 && !JSON_BODY(r),
     "tag captured");
  OK(api_valid_tag("devserver") && api_valid_tag("a-b_c.1") && api_valid_tag("1a") && !api_valid_tag("123") &&
         !api_valid_tag("") && !api_valid_tag("a/b") && !api_valid_tag("a b") &&
         api_valid_tag("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa") &&
         !api_valid_tag("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"),
     "tag syntax");
  OK(api_signal_parse("TERM") == SIGTERM && api_signal_parse("SIGKILL") == SIGKILL &&
         api_signal_parse("INT") == SIGINT && api_signal_parse("USR2") == SIGUSR2 &&
         api_signal_parse("CONT") == SIGCONT && api_signal_parse("term") == 0 && api_signal_parse("9") == 0 &&
         api_signal_parse("SIG") == 0 && api_signal_parse("") == 0 && api_signal_parse("SEGV") == 0,
     "signal names");
  OK(api_valid_sandbox_id(ID) && !api_valid_sandbox_id("sb-") &&
         !api_valid_sandbox_id("sb-0123456789abcdef_"),
     "sandbox id syntax");
  OK(api_valid_template_name("base") && !api_valid_template_name(".x") && !api_valid_template_name(""),
     "template name syntax");
}

static struct api_args args(int n, ...) {
  struct api_args a = {0};
  va_list ap;
  va_start(ap, n);
  for (int i = 0; i < n; i++) {
    a.v[i].key = va_arg(ap, char *);
    a.v[i].value = va_arg(ap, char *);
  }
  va_end(ap);
  a.n = (size_t)n;
  return a;
}

static void test_args(void) {
  moat_error *err = NULL;
  static const char *const allowed[] = {"path", "user", "metadata.", NULL};
  struct api_args a = args(3, "path", "/x", "user", "bob", "metadata.team", "a");
  OK(api_args_check(&a, allowed, &err) == 0, "allowed args pass");
  a = args(1, "bogus", "1");
  OK(api_args_check(&a, allowed, &err) < 0 && err->status == EINVAL && strstr(err->msg, "'bogus'"),
     "unknown parameter named");
  moat_error_free(&err);
  a = args(1, "metadata.", "1");
  OK(api_args_check(&a, allowed, &err) < 0, "bare 'metadata.' rejected");
  moat_error_free(&err);
  a = args(2, "path", "/a", "path", "/b");
  OK(api_args_check(&a, allowed, &err) < 0 && strstr(err->msg, "more than once"),
     "repeated parameter rejected");
  moat_error_free(&err);

  uint32_t d;
  a = args(0);
  OK(api_arg_depth(&a, &d, &err) == 0 && d == 1, "depth default 1");
  const char *bad_depths[] = {"0", "17", "-1", "1.5", "", "abc", "99999999999999999999"};
  for (size_t i = 0; i < ARRAY_SIZE(bad_depths); i++) {
    a = args(1, "depth", bad_depths[i]);
    OK(api_arg_depth(&a, &d, &err) < 0 && err->status == EINVAL, "depth '%s' rejected", bad_depths[i]);
    moat_error_free(&err);
  }
  a = args(1, "depth", "16");
  OK(api_arg_depth(&a, &d, &err) == 0 && d == 16, "depth 16 ok");

  uint32_t m;
  a = args(1, "mode", "0755");
  OK(api_arg_mode(&a, &m, &err) == 0 && m == 0755, "mode 0755");
  a = args(1, "mode", "600");
  OK(api_arg_mode(&a, &m, &err) == 0 && m == 0600, "mode 600");
  const char *bad_modes[] = {"0778", "", "rwx", "017777", "-1"};
  for (size_t i = 0; i < ARRAY_SIZE(bad_modes); i++) {
    a = args(1, "mode", bad_modes[i]);
    OK(api_arg_mode(&a, &m, &err) < 0, "mode '%s' rejected", bad_modes[i]);
    moat_error_free(&err);
  }

  const char *p;
  a = args(0);
  OK(api_arg_path(&a, "path", &p, &err) < 0 && strstr(err->msg, "required"), "path required");
  moat_error_free(&err);
  a = args(1, "path", "");
  OK(api_arg_path(&a, "path", &p, &err) < 0, "empty path rejected");
  moat_error_free(&err);
  char *longp = xmalloc(API_MAX_PATH + 2);
  memset(longp, 'a', API_MAX_PATH + 1);
  longp[API_MAX_PATH + 1] = '\0';
  a = args(1, "path", longp);
  OK(api_arg_path(&a, "path", &p, &err) < 0 && err->status == EINVAL, "path of 4097 bytes rejected");
  moat_error_free(&err);
  free(longp);

  bool b;
  a = args(1, "recursive", "true");
  OK(api_arg_bool(&a, "recursive", false, &b, &err) == 0 && b, "recursive=true");
  a = args(1, "recursive", "yes");
  OK(api_arg_bool(&a, "recursive", false, &b, &err) < 0, "recursive=yes rejected");
  moat_error_free(&err);

  const char *u;
  a = args(1, "user", "root;rm");
  OK(api_arg_user(&a, &u, &err) < 0, "user with ';' rejected");
  moat_error_free(&err);
  a = args(1, "user", "agent");
  OK(api_arg_user(&a, &u, &err) == 0 && strcmp(u, "agent") == 0, "user agent");
}

int main(void) {
  g_router = api_router_new();
  api_front_ends(g_router);
  test_routes();
  test_args();
  api_router_free(g_router);
  return tap_done();
}

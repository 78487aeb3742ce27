/* cmd_code.c -- moat run --python: a throwaway sandbox (template code-interpreter), one Python
 * context, CODE run in it; prints its output, the last expression's value and saves its figures */
#include <stdlib.h>
#include <string.h>

#include "../common/util.h"
#include "cli.h"

static void print_str(json_t *j, FILE *f) {
  if (json_is_string(j))
    fwrite(json_string_value(j), 1, json_string_length(j), f);
}

/* Saves a base64 PNG as ./moat-result-N.png (the first N not taken). Returns 0 or -1 (printed). */
static int save_png(const char *b64, int *n) {
  unsigned char *raw;
  size_t len;
  if (moat_base64_decode(b64, strlen(b64), &raw, &len) < 0) {
    cli_errorf("a result's png is not base64");
    return -1;
  }
  for (;;) {
    _cleanup_free_ char *name = xasprintf("moat-result-%d.png", ++*n);
    FILE *f = fopen(name, "wxe"); /* never overwrite an earlier result */
    if (!f)
      continue;
    size_t w = fwrite(raw, 1, len, f);
    int c = fclose(f);
    free(raw);
    if (w != len || c != 0) {
      cli_errorf("write %s failed", name);
      return -1;
    }
    fprintf(stderr, "moat: saved a figure as ./%s (%zu bytes)\n", name, len);
    return 0;
  }
}

int cli_print_run(json_t *res) {
  print_str(json_object_get(res, "stdout"), stdout);
  fflush(stdout);
  print_str(json_object_get(res, "stderr"), stderr);
  int n = 0, rc = 0;
  size_t i;
  json_t *r;
  json_array_foreach(json_object_get(res, "results"), i, r) {
    const char *png = json_string_value(json_object_get(r, "png"));
    if (png) {
      if (save_png(png, &n) < 0)
        rc = EXIT_API;
      continue;
    }
    json_t *text = json_object_get(r, "text");
    if (json_is_string(text)) {
      print_str(text, stdout);
      if (json_string_length(text) && json_string_value(text)[json_string_length(text) - 1] != '\n')
        fputc('\n', stdout);
    }
  }
  fflush(stdout);
  json_t *err = json_object_get(res, "error");
  if (json_is_object(err)) {
    json_t *tb = json_object_get(err, "traceback");
    if (json_is_string(tb) && json_string_length(tb)) {
      print_str(tb, stderr);
      if (json_string_value(tb)[json_string_length(tb) - 1] != '\n')
        fputc('\n', stderr);
    } else if (json_is_array(tb) && json_array_size(tb)) {
      json_t *line;
      json_array_foreach(tb, i, line) {
        print_str(line, stderr);
        fputc('\n', stderr);
      }
    } else {
      const char *name = json_string_value(json_object_get(err, "name"));
      const char *value = json_string_value(json_object_get(err, "value"));
      fprintf(stderr, "%s: %s\n", name ? name : "Error", value ? value : "");
    }
    return 1;
  }
  return rc;
}

int cli_run_python(const char *code, json_t *create_body) {
  if (!json_object_get(create_body, "template"))
    json_object_set_new(create_body, "template", json_string("code-interpreter"));
  cli_trap_signals();
  struct cli_resp resp;
  int r = cli_request("POST", "/v1/sandboxes", create_body, &resp);
  json_decref(create_body);
  if (r < 0)
    return cli_interrupted ? 128 + cli_interrupted : EXIT_API;
  const char *sid = json_string_value(json_object_get(resp.json, "id"));
  _cleanup_free_ char *id = sid ? xstrdup(sid) : NULL;
  json_decref(resp.json);
  if (!id) {
    cli_errorf("the answer has no sandbox id");
    return EXIT_API;
  }
  int code_rc = EXIT_API;
  _cleanup_free_ char *eid = cli_escape(id);
  _cleanup_free_ char *cpath = xasprintf("/v1/sandboxes/%s/contexts", eid);
  json_t *body = json_pack("{s:s}", "language", "python");
  r = cli_interrupted ? -1 : cli_request("POST", cpath, body, &resp);
  json_decref(body);
  if (r == 0) {
    const char *cid = json_string_value(json_object_get(resp.json, "id"));
    if (!cid) {
      cli_errorf("the answer has no context id");
    } else {
      _cleanup_free_ char *ecid = cli_escape(cid);
      _cleanup_free_ char *rpath = xasprintf("%s/%s/run", cpath, ecid);
      json_t *run = json_pack("{s:s}", "code", code);
      struct cli_resp out;
      if (!cli_interrupted && cli_request("POST", rpath, run, &out) == 0) {
        code_rc = cli_print_run(out.json);
        json_decref(out.json);
      }
      json_decref(run);
    }
    json_decref(resp.json);
  }
  int sig = cli_interrupted;
  cli_interrupted = 0;
  cli_kill_sandbox(id);
  return sig ? 128 + sig : code_rc;
}

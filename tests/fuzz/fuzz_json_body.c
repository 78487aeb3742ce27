/* fuzz_json_body.c -- libFuzzer target over the API's body parsing and validators, UTF-8 repair and base64
 *
 * Built by make FUZZ=1 fuzzers (scripts/fuzz.sh runs it).
 * The first input byte picks the validator; the rest is the request body.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "api/http/http.h"

static void check_json_out(json_t *j) {
  /* Whatever we answer must dump and re-parse (valid UTF-8 strings only). */
  char *s = json_dumps(j, JSON_COMPACT);
  if (!s)
    abort();
  json_error_t e;
  json_t *back = json_loads(s, JSON_ALLOW_NUL, &e); /* \u0000 is valid JSON */
  if (!back)
    abort();
  json_decref(back);
  free(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  uint8_t sel = data[0];
  const char *buf = (const char *)data + 1;
  size_t len = size - 1;

  /* Codecs over raw bytes. */
  size_t n;
  bool valid;
  char *u = api_utf8_sanitize(buf, len, &n, &valid);
  if (!api_utf8_valid(u, n) || valid != api_utf8_valid(buf, len) ||
      (valid && (n != len || memcmp(u, buf, len))))
    abort();
  free(u);
  unsigned char *d;
  size_t dl;
  if (moat_base64_decode(buf, len, &d, &dl) == 0) {
    size_t el;
    char *e = moat_base64_encode(d, dl, &el);
    /* canonical input re-encodes to itself, modulo optional padding */
    if (el < len || memcmp(e, buf, len) != 0)
      abort();
    free(e);
    free(d);
  }

  json_t *body = NULL;
  moat_error *err = NULL;
  if (api_body_parse(buf, len, true, &body, &err) < 0) {
    if (!err || (err->status != EBADMSG && err->status != EINVAL))
      abort();
    json_t *ej = api_error_json("invalid_json", moat_error_msg(err));
    check_json_out(ej);
    json_decref(ej);
    moat_error_free(&err);
    return 0;
  }
  switch (sel % 5) {
  case 0: {
    struct moat_sandbox_spec spec;
    if (api_parse_create(body, 1024, &spec, &err) == 0) {
      if (spec.limits.memory_mb &&
          (spec.limits.memory_mb < MOAT_MIN_MEMORY_MB || spec.limits.memory_mb > 1024))
        abort();
      if (spec.ttl_seconds < 0 || spec.ttl_seconds > MOAT_MAX_TTL_S)
        abort();
    }
    break;
  }
  case 1: {
    struct moat_sandbox_patch p;
    api_parse_patch(body, &p, &err);
    break;
  }
  case 2: {
    struct moat_exec_req r;
    if (api_parse_exec(body, &r, &err) == 0) {
      if (!r.argv || !r.argv[0] || !r.argv[0][0])
        abort();
      if (r.timeout_ms > API_MAX_TIMEOUT_MS)
        abort();
      struct moat_exec_result res = {0};
      res.out = (char *)r.stdin_data;
      res.out_len = r.stdin_len;
      res.err = r.argv[0];
      res.err_len = strlen(r.argv[0]);
      json_t *j = api_exec_result_json(&res);
      check_json_out(j);
      json_decref(j);
      api_exec_req_clear(&r);
    }
    break;
  }
  case 3: {
    struct api_mkdir_req m;
    if (api_parse_mkdir(body, NULL, &m, &err) == 0 && (!m.path || strlen(m.path) > API_MAX_PATH))
      abort();
    break;
  }
  default: {
    struct api_move_req m;
    api_parse_move(body, NULL, &m, &err);
    break;
  }
  }
  if (err) {
    if (err->status != EINVAL && err->status != ENOSYS)
      abort();
    json_t *ej = api_error_json("invalid_request", moat_error_msg(err));
    check_json_out(ej);
    json_decref(ej);
    moat_error_free(&err);
  }
  json_decref(body);
  return 0;
}

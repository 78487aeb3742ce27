/* test_e2b_multipart.c -- the streaming multipart/form-data parser of E2B's POST /files
 * (api/e2b_multipart.c): every split of a body into chunks gives the same parts, boundary
 * look-alikes inside data stay data, and malformed bodies are errors. Also the Connect envelope
 * reader (api/e2b_connect.c cx_unwrap) and Connect code -> HTTP status mapping. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "api/e2b/envd.h"
#include "api/e2b/multipart.h"
#include "tap.h"

#define MAXP 8

struct got {
  int n;     /* parts begun */
  int ended; /* parts ended */
  char name[MAXP][64], filename[MAXP][64];
  struct moat_buf data[MAXP];
  int fail_at_begin; /* 1-based part whose begin fails, or 0 */
};

static int cb_begin(void *ctx, const char *name, const char *filename, moat_error **err) {
  struct got *g = ctx;
  if (g->n >= MAXP)
    return moat_error_set(err, E2BIG, "too many parts");
  snprintf(g->name[g->n], 64, "%s", name ? name : "(null)");
  snprintf(g->filename[g->n], 64, "%s", filename ? filename : "(null)");
  g->n++;
  if (g->fail_at_begin == g->n)
    return moat_error_set(err, EACCES, "refused");
  return 0;
}

static int cb_data(void *ctx, const char *p, size_t n, moat_error **err) {
  struct got *g = ctx;
  moat_buf_append(&g->data[g->n - 1], p, n);
  return 0;
}

static int cb_end(void *ctx, moat_error **err) {
  struct got *g = ctx;
  g->ended++;
  return 0;
}

static const struct mp_callbacks cb = {cb_begin, cb_data, cb_end};

static void got_free(struct got *g) {
  for (int i = 0; i < MAXP; i++)
    free(g->data[i].p);
}

/* Feeds body in chunks of `step` bytes (0: all at once). Returns mp_feed's last result; *done. */
static int run(const char *ct, const char *body, size_t len, size_t step, struct got *g, bool *done,
               int *status) {
  struct mp_parser m;
  moat_error *err = NULL;
  *status = 0;
  if (mp_init(&m, ct, &err) < 0) {
    *status = err->status;
    moat_error_free(&err);
    return -1;
  }
  int rc = 0;
  for (size_t off = 0; off < len && rc == 0;) {
    size_t n = step && len - off > step ? step : len - off;
    rc = mp_feed(&m, body + off, n, &cb, g, &err);
    off += n;
  }
  if (rc < 0) {
    *status = err ? err->status : -1;
    moat_error_free(&err);
  }
  *done = mp_done(&m);
  mp_free(&m);
  return rc;
}

static bool data_is(const struct moat_buf *b, const char *want, size_t wl) {
  return b->len == wl && (wl == 0 || memcmp(b->p, want, wl) == 0);
}

int main(void) {
  /* Three parts: a plain field, a file whose data holds boundary look-alikes (no CRLF before
   * "--B", a CRLF before a longer/shorter word, a lone CR), an empty file; a preamble and an
   * epilogue. Binary bytes (NUL, 0xff) included. */
  static const char d2[] = "line1\r\n--Bx\r\n-\r\n--B0undary\r--Boundary-ish\r\n\r\n\0\xff end";
  const size_t d2l = sizeof(d2) - 1;
  struct moat_buf body = {0};
#define ADD(s) moat_buf_append(&body, (s), strlen(s))
  ADD("preamble to ignore\r\n--Boundary\r\nContent-Disposition: form-data; name=\"field\"\r\n\r\nvalue");
  ADD("\r\n--Boundary\r\ncontent-disposition: form-data; name=\"file\"; filename=\"/tmp/a b.txt\"\r\n"
      "Content-Type: application/octet-stream\r\n\r\n");
  moat_buf_append(&body, d2, d2l);
  ADD("\r\n--Boundary\r\nContent-Disposition: form-data; filename=rel/x; name=file\r\n\r\n");
  ADD("\r\n--Boundary--\r\nepilogue --Boundary\r\n");
  const char *ct = "multipart/form-data; boundary=Boundary";

  bool all_ok = true;
  for (size_t step = 0; step <= body.len; step++) {
    struct got g = {0};
    bool done = false;
    int st;
    int rc = run(ct, body.p, body.len, step, &g, &done, &st);
    bool ok = rc == 0 && done && g.n == 3 && g.ended == 3 && strcmp(g.name[0], "field") == 0 &&
              strcmp(g.filename[0], "(null)") == 0 && data_is(&g.data[0], "value", 5) &&
              strcmp(g.name[1], "file") == 0 && strcmp(g.filename[1], "/tmp/a b.txt") == 0 &&
              data_is(&g.data[1], d2, d2l) && strcmp(g.name[2], "file") == 0 &&
              strcmp(g.filename[2], "rel/x") == 0 && data_is(&g.data[2], "", 0);
    if (!ok) {
      OK(false, "chunks of %zu bytes: rc %d done %d parts %d ended %d names %s/%s/%s", step, rc, done, g.n,
         g.ended, g.name[0], g.name[1], g.name[2]);
      all_ok = false;
    }
    got_free(&g);
    if (!ok)
      break;
  }
  OK(all_ok, "every chunking (1..%zu bytes and whole) gives the same 3 parts", body.len);

  /* Quoted boundary with a parameter after it; a part without headers. */
  {
    const char *b = "--q:q\r\n\r\nraw\r\n--q:q--";
    struct got g = {0};
    bool done;
    int st;
    int rc = run("multipart/form-data; boundary=\"q:q\"; charset=utf-8", b, strlen(b), 1, &g, &done, &st);
    OK(rc == 0 && done && g.n == 1 && strcmp(g.name[0], "(null)") == 0 && data_is(&g.data[0], "raw", 3),
       "quoted boundary, a part without headers (rc %d, parts %d)", rc, g.n);
    got_free(&g);
  }

  /* Errors. */
  {
    struct got g = {0};
    bool done;
    int st;
    OK(run("multipart/form-data", "", 0, 0, &g, &done, &st) < 0 && st == EINVAL, "no boundary: EINVAL");
    OK(run("multipart/form-data; boundary=", "", 0, 0, &g, &done, &st) < 0 && st == EINVAL,
       "empty boundary: EINVAL");
    char longb[128] = "multipart/form-data; boundary=";
    memset(longb + strlen(longb), 'x', 71);
    OK(run(longb, "", 0, 0, &g, &done, &st) < 0 && st == EINVAL, "boundary of 71 characters: EINVAL");
    const char *trunc = "--B\r\nContent-Disposition: form-data; name=\"file\"\r\n\r\nabc";
    OK(run("multipart/form-data; boundary=B", trunc, strlen(trunc), 0, &g, &done, &st) == 0 && !done &&
           g.n == 1 && g.ended == 0,
       "no closing boundary: the part never ends, the parse is not done");
    got_free(&g);
    memset(&g, 0, sizeof(g));
    const char *bad = "--B\r\nX: y\r\n\r\nabc\r\n--Bzz";
    OK(run("multipart/form-data; boundary=B", bad, strlen(bad), 0, &g, &done, &st) < 0 && st == EINVAL,
       "no CRLF after a boundary: EINVAL");
    got_free(&g);
    memset(&g, 0, sizeof(g));
    struct moat_buf big = {0};
    moat_buf_append(&big, "--B\r\nX: ", 8);
    for (int i = 0; i < MP_MAX_HEADERS / 8 + 2; i++)
      moat_buf_append(&big, "aaaaaaaa", 8);
    OK(run("multipart/form-data; boundary=B", big.p, big.len, 1000, &g, &done, &st) < 0 && st == EINVAL,
       "a header block over %d bytes: EINVAL", MP_MAX_HEADERS);
    free(big.p);
    got_free(&g);
    memset(&g, 0, sizeof(g));
    g.fail_at_begin = 2;
    OK(run(ct, body.p, body.len, 7, &g, &done, &st) < 0 && st == EACCES && g.n == 2,
       "a callback's error stops the parse with its status");
    got_free(&g);
  }
  free(body.p);

  /* Connect envelopes. */
  {
    moat_error *err = NULL;
    json_t *j = NULL;
    const char ok1[] = "\x00\x00\x00\x00\x0a{\"pid\":12}";
    OK(cx_unwrap(ok1, sizeof(ok1) - 1, &j, &err) == 0 && json_integer_value(json_object_get(j, "pid")) == 12,
       "one envelope: its message");
    json_decref(j);
    const char two[] = "\x00\x00\x00\x00\x02{}\x00\x00\x00\x00\x02{}";
    OK(cx_unwrap(two, sizeof(two) - 1, &j, &err) < 0 && err->status == EINVAL, "two envelopes: EINVAL");
    moat_error_free(&err);
    const char comp[] = "\x01\x00\x00\x00\x02{}";
    OK(cx_unwrap(comp, sizeof(comp) - 1, &j, &err) < 0 && err->status == EINVAL, "compressed flag: EINVAL");
    moat_error_free(&err);
    const char arr[] = "\x00\x00\x00\x00\x02[]";
    OK(cx_unwrap(arr, sizeof(arr) - 1, &j, &err) < 0, "not an object: error");
    moat_error_free(&err);
    OK(cx_unwrap("{}", 2, &j, &err) < 0, "a bare JSON body: error");
    moat_error_free(&err);
    struct moat_buf b = {0};
    cx_frame(&b, 2, json_pack("{s:{s:s}}", "error", "code", "not_found"));
    OK(b.len == 5 + 30 && (unsigned char)b.p[0] == 2 && b.p[4] == 30 &&
           memcmp(b.p + 5, "{\"error\":{\"code\":\"not_found\"}}", 30) == 0,
       "end-of-stream frame: flag 2, big-endian length");
    free(b.p);
    OK(cx_code_http("not_found") == 404 && cx_code_http("already_exists") == 409 &&
           cx_code_http("invalid_argument") == 400 && cx_code_http("deadline_exceeded") == 504 &&
           cx_code_http("unavailable") == 503 && cx_code_http("permission_denied") == 403 &&
           cx_code_http("unauthenticated") == 401 && cx_code_http("resource_exhausted") == 429 &&
           cx_code_http("unimplemented") == 501 && cx_code_http("bogus") == 500,
       "Connect codes map to Connect's HTTP statuses");
    OK(strcmp(cx_errno_code(ENOENT), "not_found") == 0 &&
           strcmp(cx_errno_code(EEXIST), "already_exists") == 0 &&
           strcmp(cx_errno_code(ENOTDIR), "invalid_argument") == 0 &&
           strcmp(cx_errno_code(EACCES), "permission_denied") == 0 &&
           strcmp(cx_errno_code(ECONNREFUSED), "unavailable") == 0 &&
           strcmp(cx_errno_code(EIO), "internal") == 0,
       "errno statuses map to Connect codes");
  }
  return tap_done();
}

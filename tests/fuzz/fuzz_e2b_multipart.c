/* fuzz_e2b_multipart.c -- libFuzzer target: E2B's streaming multipart/form-data parser
 * (api/e2b_multipart.c). The input's first byte picks a chunk size; the body is parsed whole and
 * in chunks of that size, and both parses must give the same parts, data and outcome (the
 * parser's result cannot depend on how the network split the body). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "api/e2b/multipart.h"
#include "common/util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

struct trace {
  struct moat_buf log; /* "B<name>|<filename>\n", data bytes as "D<bytes>", "E\n" */
  bool in_part;
};

static int t_begin(void *ctx, const char *name, const char *filename, moat_error **err) {
  struct trace *t = ctx;
  if (t->in_part)
    abort(); /* a part begins only after the previous one ended */
  t->in_part = true;
  moat_buf_append(&t->log, "B", 1);
  if (name)
    moat_buf_append(&t->log, name, strlen(name));
  moat_buf_append(&t->log, "|", 1);
  if (filename)
    moat_buf_append(&t->log, filename, strlen(filename));
  moat_buf_append(&t->log, "\n", 1);
  return 0;
}

static int t_data(void *ctx, const char *p, size_t n, moat_error **err) {
  struct trace *t = ctx;
  if (!t->in_part || n == 0)
    abort();
  moat_buf_append(&t->log, p, n); /* concatenated: chunking may split data differently */
  return 0;
}

static int t_end(void *ctx, moat_error **err) {
  struct trace *t = ctx;
  if (!t->in_part)
    abort();
  t->in_part = false;
  moat_buf_append(&t->log, "\nE\n", 3);
  return 0;
}

static const struct mp_callbacks cb = {t_begin, t_data, t_end};

/* Returns 0/-1 of the parse and fills t; done says whether the closing boundary was seen. */
static int parse(const uint8_t *body, size_t len, size_t step, struct trace *t, bool *done) {
  struct mp_parser m;
  moat_error *err = NULL;
  if (mp_init(&m, "multipart/form-data; boundary=xB", &err) < 0)
    abort();
  int rc = 0;
  for (size_t off = 0; off < len && rc == 0;) {
    size_t n = step && len - off > step ? step : len - off;
    rc = mp_feed(&m, (const char *)body + off, n, &cb, t, &err);
    off += n;
  }
  if (rc == 0 && len == 0)
    rc = mp_feed(&m, "", 0, &cb, t, &err);
  if (rc < 0 && (!err || !err->msg))
    abort(); /* a failure explains itself */
  moat_error_free(&err);
  *done = mp_done(&m);
  if (m.pend.cap > len + MP_MAX_HEADERS + 4096 + 256)
    abort(); /* memory stays bounded by the body (and far below it for long bodies) */
  mp_free(&m);
  return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  size_t step = (size_t)data[0] % 17 + 1;
  struct trace a = {0}, b = {0};
  bool da, db;
  int ra = parse(data + 1, size - 1, 0, &a, &da);
  int rb = parse(data + 1, size - 1, step, &b, &db);
  /* A malformed body may be noticed at different points, but a body parsed without error either
   * way gives the same parts. */
  if (ra == 0 && rb == 0 &&
      (da != db || a.log.len != b.log.len || (a.log.len && memcmp(a.log.p, b.log.p, a.log.len))))
    abort();
  if (ra != rb)
    abort();
  free(a.log.p);
  free(b.log.p);
  return 0;
}

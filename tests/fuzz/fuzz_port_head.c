/* fuzz_port_head.c -- libFuzzer target: the port proxy's reading of what a server inside a sandbox
 * answers (api ports/forward.c): its response head, the body framing chosen from it, and chunk-size
 * lines. The server is the sandbox's: every byte is hostile.
 *
 * Input: u8 flags (bit 0: the request was a HEAD), then the head through its empty line, then
 * chunk-size lines. Checks: a parsed head has a status of 100-599, names that are non-empty and
 * hold no ':' nor start with whitespace, values without surrounding blanks, at most 128 fields, all
 * inside the head; framing is refused when Content-Length and Transfer-Encoding both appear or one
 * appears twice with different values, is chunked only when the last transfer coding is chunked,
 * and a Content-Length is all digits; a chunk size is below 2^63 and read from hex digits only. */
#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "api/ports/ports.h"
#include "common/util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static size_t count(const struct port_resp_head *h, const char *k, const char **first, bool *differ) {
  size_t c = 0;
  *first = NULL;
  *differ = false;
  for (size_t i = 0; i < h->n; i++)
    if (strcasecmp(h->name[i], k) == 0) {
      if (*first && strcmp(*first, h->value[i]) != 0)
        *differ = true;
      if (!*first)
        *first = h->value[i];
      c++;
    }
  return c;
}

static void check_head(const struct port_resp_head *h, const char *start, const char *end, bool head_req) {
  if (h->status < 100 || h->status > 599 || h->n > 128)
    abort();
  for (size_t i = 0; i < h->n; i++) {
    const char *k = h->name[i], *v = h->value[i];
    if (k < start || k >= end || v < start || v > end || !k[0] || strchr(k, ':') || k[0] == ' ' ||
        k[0] == '\t')
      abort();
    size_t vl = strlen(v);
    if (vl && (v[0] == ' ' || v[0] == '\t' || v[vl - 1] == ' ' || v[vl - 1] == '\t'))
      abort();
  }
  enum port_framing fr = PORT_BODY_CLOSE;
  uint64_t len = 7;
  moat_error *err = NULL;
  int rc = port_head_framing(h, head_req, &fr, &len, &err);
  const char *te, *cl;
  bool te_differ, cl_differ;
  size_t nte = count(h, "Transfer-Encoding", &te, &te_differ),
         ncl = count(h, "Content-Length", &cl, &cl_differ);
  bool must_refuse = (nte && ncl) || te_differ || cl_differ;
  if (must_refuse && rc == 0)
    abort(); /* a framing the client could read otherwise was passed on */
  if (rc < 0) {
    if (!err || err->status != EPROTO)
      abort();
    moat_error_free(&err);
    return;
  }
  if (head_req || h->status == 204 || h->status == 304) {
    if (fr != PORT_BODY_NONE)
      abort();
    return;
  }
  if (fr == PORT_BODY_CHUNKED) {
    const char *last = strrchr(te, ',');
    last = last ? last + 1 : te;
    while (*last == ' ' || *last == '\t')
      last++;
    if (strncasecmp(last, "chunked", 7) != 0)
      abort();
  } else if (fr == PORT_BODY_LENGTH) {
    if (!cl || nte || !cl[0])
      abort();
    uint64_t v = 0;
    for (const char *c = cl; *c; c++)
      if (!isdigit((unsigned char)*c))
        abort();
    if (parse_u64(cl, &v) < 0 || v != len)
      abort();
  } else if (fr != PORT_BODY_CLOSE || (!nte && ncl))
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  bool head_req = data[0] & 1;
  /* the head ends at the first empty line, as read_head finds it */
  const char *in = (const char *)data + 1;
  size_t n = size - 1, hl = 0;
  for (size_t i = 1; i < n && !hl; i++)
    if (in[i] == '\n' && (in[i - 1] == '\n' || (i >= 2 && in[i - 1] == '\r' && in[i - 2] == '\n')))
      hl = i + 1;
  if (!hl)
    hl = n;
  char *head = xmemdup(in, hl); /* parsed in place */
  struct port_resp_head h;
  if (port_head_parse(head, head + hl, &h) == 0)
    check_head(&h, head, head + hl, head_req);
  free(head);
  /* the rest: chunk-size lines */
  for (size_t off = hl; off < n;) {
    const char *nl = memchr(in + off, '\n', n - off);
    size_t ll = nl ? (size_t)(nl - (in + off)) : n - off;
    _cleanup_free_ char *line = xstrndup(in + off, ll);
    uint64_t v;
    if (port_chunk_size_parse(line, &v) == 0) {
      if (v > (uint64_t)INT64_MAX || !isxdigit((unsigned char)line[0]))
        abort();
      uint64_t back = strtoull(line, NULL, 16);
      if (back != v)
        abort();
    }
    off += ll + 1;
  }
  return 0;
}

/* test_api_framing.c -- the request-framing judge (src/api/framing.c): heads libmicrohttpd would read
 * ambiguously are judged bad, bodies are followed to the next request, bad chunk sizes are caught, and
 * the verdict does not depend on how the bytes are split */
#include <string.h>

#include "api/http/framing.h"
#include "tap.h"

struct run {
  enum api_fr_result res;
  uint64_t heads, bad_head;
  bool in_head, opaque;
  char why[192];
};

/* Feeds s in pieces of step bytes (0: all at once). */
static struct run feed(const char *s, size_t len, size_t step) {
  struct api_framing f;
  api_framing_init(&f);
  struct run r = {API_FR_OK, 0, 0, false, false, ""};
  size_t i = 0;
  while (i < len) {
    size_t n = step && len - i > step ? step : len - i;
    r.res = api_framing_feed(&f, s + i, n);
    i += n;
    if (r.res != API_FR_OK)
      break;
  }
  r.heads = f.heads;
  r.bad_head = f.bad_head;
  r.in_head = f.in_head;
  r.opaque = f.opaque;
  snprintf(r.why, sizeof(r.why), "%s", f.why);
  return r;
}

/* The same verdict whatever the split: whole, byte by byte, and in 7-byte pieces. */
static bool same_split(const char *s, size_t len, struct run *out) {
  struct run a = feed(s, len, 0), b = feed(s, len, 1), c = feed(s, len, 7);
  *out = a;
  bool same = a.res == b.res && a.res == c.res && a.heads == b.heads && a.heads == c.heads &&
              a.bad_head == b.bad_head && a.bad_head == c.bad_head && a.in_head == b.in_head &&
              a.in_head == c.in_head && strcmp(a.why, b.why) == 0 && strcmp(a.why, c.why) == 0;
  if (!same)
    printf(
        "# split changes the verdict: %d/%d/%d heads %llu/%llu/%llu bad %llu/%llu/%llu why '%s' '%s' '%s'\n",
        a.res, b.res, c.res, (unsigned long long)a.heads, (unsigned long long)b.heads,
        (unsigned long long)c.heads, (unsigned long long)a.bad_head, (unsigned long long)b.bad_head,
        (unsigned long long)c.bad_head, a.why, b.why, c.why);
  return same;
}

#define S(lit) lit, sizeof(lit) - 1

static bool good(const char *s, size_t len, uint64_t heads, bool in_head) {
  struct run r;
  bool same = same_split(s, len, &r);
  bool ok = same && r.res == API_FR_OK && r.bad_head == 0 && r.heads == heads && r.in_head == in_head;
  if (!ok)
    printf("# res %d heads %llu bad %llu in_head %d why '%s'\n", r.res, (unsigned long long)r.heads,
           (unsigned long long)r.bad_head, r.in_head, r.why);
  return ok;
}

static bool bad_head(const char *s, size_t len, uint64_t which, const char *why_part) {
  struct run r;
  bool same = same_split(s, len, &r);
  bool ok = same && r.res == API_FR_BAD_HEAD && r.bad_head == which && r.opaque && strstr(r.why, why_part);
  if (!ok)
    printf("# res %d heads %llu bad %llu why '%s'\n", r.res, (unsigned long long)r.heads,
           (unsigned long long)r.bad_head, r.why);
  return ok;
}

static bool bad_body(const char *s, size_t len, const char *why_part) {
  struct run r;
  bool same = same_split(s, len, &r);
  bool ok = same && r.res == API_FR_BAD_BODY && r.bad_head == 0 && strstr(r.why, why_part);
  if (!ok)
    printf("# res %d bad %llu why '%s'\n", r.res, (unsigned long long)r.bad_head, r.why);
  return ok;
}

static void test_good(void) {
  OK(good(S("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), 1, false), "a plain GET");
  OK(good(S("GET / HTTP/1.1\nHost: x\n\n"), 1, false), "bare LF line ends");
  OK(good(S("\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n"), 1, false),
     "empty lines before a request are skipped");
  OK(good(S("POST /a HTTP/1.1\r\nContent-Length: 5\r\n\r\nhelloGET /b HTTP/1.1\r\n\r\n"), 2, false),
     "a Content-Length body, then the next request");
  OK(good(S("POST /a HTTP/1.1\r\ncontent-length:  3\r\nContent-Length: 3\r\n\r\nabc"), 1, false),
     "Content-Length twice with the same value");
  OK(good(S("POST /a HTTP/1.1\r\nTransfer-Encoding: Chunked\r\n\r\n5\r\nhello\r\n1A;x=y\r\n"
            "abcdefghijklmnopqrstuvwxyz\r\n0\r\nTrailer: v\r\n\r\nGET /b HTTP/1.1\r\n\r\n"),
          2, false),
     "a chunked body with an extension and a trailer, then the next request");
  OK(good(S("POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0000000000000000000005\nhello\n0\n\n"), 1,
          false),
     "leading zeros and bare LFs in chunked framing");
  OK(good(S("POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n7fffffffffffffff\r\nabc"), 1, false),
     "the largest chunk size accepted: 2^63-1");
  OK(good(S("GET / HTTP/1.1\r\nHost: x\r\n"), 0, true), "a head not complete yet");
  OK(good(S("GET / HTTP/1.1\r\nHost: x\r\n\r\nGET /next HT"), 1, true), "the next head started");
  OK(good(S("GET / HTTP/1.1\r\nX-Long: "
            "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
            "aaaaaaaa"
            "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n"
            "A-Very-Long-Field-Name-That-Is-Not-Of-Interest: 1\r\n\r\n"),
          1, false),
     "long lines and names of no interest");
  struct run r;
  same_split(S("GET /pty HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n\x81\x85garbage"), &r);
  OK(r.res == API_FR_OK && r.heads == 1 && r.opaque && !r.bad_head,
     "after an Upgrade request the bytes are not looked at");
  same_split(S("POST /u HTTP/1.1\r\nUpgrade: x\r\nTransfer-Encoding: chunked\r\n\r\nFFFFFFFFFFFFFFFF\r\n"),
             &r);
  OK(r.res == API_FR_BAD_BODY, "but the body of an Upgrade request still is");
}

static void test_bad_heads(void) {
  OK(bad_head(S("POST / HTTP/1.1\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n"), 1,
              "both Content-Length and Transfer-Encoding"),
     "Content-Length and Transfer-Encoding");
  OK(bad_head(S("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n"), 1,
              "both Content-Length and Transfer-Encoding"),
     "Transfer-Encoding and Content-Length");
  OK(bad_head(S("POST / HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 5\r\n\r\n"), 1, "differ"),
     "two different Content-Lengths");
  OK(bad_head(S("POST / HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\n"), 1, "decimal"), "a Content-Length list");
  OK(bad_head(S("POST / HTTP/1.1\r\nContent-Length: +5\r\n\r\n"), 1, "decimal"), "a signed Content-Length");
  OK(bad_head(S("POST / HTTP/1.1\r\nContent-Length: 9223372036854775808\r\n\r\n"), 1, "below 2^63"),
     "a Content-Length of 2^63");
  OK(bad_head(S("POST / HTTP/1.1\r\nContent-Length:\r\n\r\n"), 1, "decimal"), "an empty Content-Length");
  OK(bad_head(S("POST / HTTP/1.1\r\nContent-Length : 5\r\n\r\nhello"), 1, "whitespace"),
     "whitespace before the colon");
  OK(bad_head(S("POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n"), 1, "\"gzip\""),
     "a Transfer-Encoding other than chunked");
  OK(bad_head(S("POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"), 1, "must be \"chunked\""),
     "a coding before chunked");
  OK(bad_head(S("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n"), 1,
              "more than once"),
     "Transfer-Encoding twice");
  OK(bad_head(S("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\r\n\r\n"), 1, "must be \"chunked\""),
     "a CR left in the value (libmicrohttpd would read it as not chunked)");
  OK(bad_head(S("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n"), 1, "HTTP/1.0"),
     "Transfer-Encoding in HTTP/1.0");
  OK(bad_head(S("GET / HTTP/1.1\r\nX-A: 1\r\n  folded\r\n\r\n"), 1, "folding"), "obsolete line folding");
  OK(bad_head(S("GET / HTTP/1.1\r\nno colon here\r\n\r\n"), 1, "no colon"), "a field line without a colon");
  OK(bad_head(S("GET / HTTP/1.1\r\nX-A: a\0b\r\n\r\n"), 1, "NUL"), "a NUL byte in a value");
  OK(bad_head(S("GET /a HTTP/1.1\r\n\r\nPOST /b HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n"),
              2, "differ"),
     "the second head of a pipeline");
  static const char pipe[] =
      "GET /a HTTP/1.1\r\n\r\nPOST /b HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab";
  struct api_framing f;
  api_framing_init(&f);
  enum api_fr_result res = api_framing_feed(&f, pipe, sizeof(pipe) - 1);
  OK(res == API_FR_BAD_HEAD && f.bad_at == sizeof(pipe) - 4 && pipe[f.bad_at] == '\n' && f.heads == 2,
     "bad_at is the line end completing the bad head (%zu)", f.bad_at);
}

static void test_bad_bodies(void) {
  OK(bad_body(S("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nFFFFFFFFFFFFFFFF\r\n{}\r\n0\r\n\r\n"),
              "2^63"),
     "chunk size FFFFFFFFFFFFFFFF (2^64-1)");
  OK(bad_body(S("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n8000000000000000\r\n"), "2^63"),
     "chunk size 2^63");
  OK(bad_body(S("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1FFFFFFFFFFFFFFFF\r\n"), "2^63"),
     "chunk size of 17 digits");
  OK(bad_body(S("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n-1\r\n"), "hexadecimal"),
     "a negative chunk size");
  OK(bad_body(S("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0x10\r\n"), "hexadecimal"),
     "a 0x prefix");
  OK(bad_body(S("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n 5\r\n"), "hexadecimal"),
     "whitespace before a chunk size");
  OK(bad_body(S("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n\r\n"), "hexadecimal"),
     "an empty chunk-size line");
  OK(bad_body(S("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\rX\n"), "hexadecimal"),
     "a CR inside the chunk-size line");
  OK(bad_body(S("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n"), "no line end"),
     "more chunk data than the chunk size");
  char big[5000];
  int n = snprintf(big, sizeof(big), "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1;");
  memset(big + n, 'e', sizeof(big) - (size_t)n);
  OK(bad_body(big, sizeof(big), "4096"), "a chunk-size line longer than 4096 bytes");
}

int main(void) {
  test_good();
  test_bad_heads();
  test_bad_bodies();
  return tap_done();
}

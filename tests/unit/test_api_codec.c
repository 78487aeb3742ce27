/* test_api_codec.c -- UTF-8 repair, RFC 3339 and listen-address parsing of the API, and the API's
 * contract for common/codec.c: strict base64 decoding and Sec-WebSocket-Accept */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>

#include "api/http/http.h"
#include "tap.h"

static bool sanitized_is_n(const char *in, size_t inlen, const char *want, size_t wantlen, bool want_valid) {
  size_t n;
  bool valid;
  char *s = api_utf8_sanitize(in, inlen, &n, &valid);
  bool ok = n == wantlen && memcmp(s, want, n) == 0 && valid == want_valid && api_utf8_valid(s, n);
  if (!ok) {
    printf("# got %zu bytes:", n);
    for (size_t i = 0; i < n; i++)
      printf(" %02x", (unsigned char)s[i]);
    printf(" valid=%d\n", valid);
  }
  free(s);
  return ok;
}

static bool sanitized_is(const char *in, size_t inlen, const char *want, bool want_valid) {
  return sanitized_is_n(in, inlen, want, strlen(want), want_valid);
}

#define FFFD "\xEF\xBF\xBD"

static void test_utf8(void) {
  OK(sanitized_is("hello", 5, "hello", true), "ASCII unchanged");
  OK(sanitized_is("h\xC3\xA9llo \xE2\x82\xAC \xF0\x9F\x98\x80", 15,
                  "h\xC3\xA9llo \xE2\x82\xAC \xF0\x9F\x98\x80", true),
     "2-, 3- and 4-byte sequences unchanged");
  OK(sanitized_is("a\xFF"
                  "b",
                  3, "a" FFFD "b", false),
     "0xFF -> U+FFFD");
  OK(sanitized_is("\xC0\xAF", 2, FFFD FFFD, false), "overlong C0 AF -> two U+FFFD");
  OK(sanitized_is("\xE0\x80\xAF", 3, FFFD FFFD FFFD, false), "overlong E0 80 AF -> three U+FFFD");
  OK(sanitized_is("\xED\xA0\x80", 3, FFFD FFFD FFFD, false), "surrogate ED A0 80 rejected");
  OK(sanitized_is("\xF4\x90\x80\x80", 4, FFFD FFFD FFFD FFFD, false), "code point above U+10FFFF rejected");
  OK(sanitized_is("\xE2\x82"
                  "x",
                  3, FFFD "x", false),
     "truncated 3-byte sequence is one U+FFFD (maximal subpart)");
  OK(sanitized_is("x\xF0\x9F\x98", 4, "x" FFFD, false), "truncated 4-byte sequence at the end is one U+FFFD");
  OK(sanitized_is("\x80\x80", 2, FFFD FFFD, false), "lone continuation bytes, one U+FFFD each");
  OK(sanitized_is_n("a\0b", 3, "a\0b", 3, true), "NUL bytes are valid UTF-8 and kept");
  OK(sanitized_is("", 0, "", true), "empty input");
  OK(!api_utf8_valid("\xF5\x80\x80\x80", 4), "F5 lead byte invalid");
  OK(api_utf8_valid("\xF4\x8F\xBF\xBF", 4), "U+10FFFF valid");
  OK(api_utf8_valid("\xEF\xBF\xBF", 3), "U+FFFF valid");
  /* every byte value alone: ASCII valid, everything else one replacement */
  int bad = 0;
  for (int b = 0; b < 256; b++) {
    char in = (char)b;
    size_t n;
    bool valid;
    char *s = api_utf8_sanitize(&in, 1, &n, &valid);
    if (b < 0x80 ? !(valid && n == 1) : !(!valid && n == 3 && memcmp(s, FFFD, 3) == 0))
      bad++;
    free(s);
  }
  OK(bad == 0, "each single byte: ASCII kept, others replaced (%d wrong)", bad);
}

static bool b64_roundtrip(const char *in, size_t n, const char *want) {
  size_t el;
  char *e = moat_base64_encode(in, n, &el);
  bool ok = strcmp(e, want) == 0 && el == strlen(want);
  unsigned char *d;
  size_t dl;
  ok = ok && moat_base64_decode(e, el, &d, &dl) == 0 && dl == n && memcmp(d, in, n) == 0;
  if (ok)
    free(d);
  free(e);
  return ok;
}

static void test_base64(void) {
  OK(b64_roundtrip("", 0, ""), "base64 empty");
  OK(b64_roundtrip("f", 1, "Zg=="), "base64 f");
  OK(b64_roundtrip("fo", 2, "Zm8="), "base64 fo");
  OK(b64_roundtrip("foo", 3, "Zm9v"), "base64 foo");
  OK(b64_roundtrip("foobar", 6, "Zm9vYmFy"), "base64 foobar");
  OK(b64_roundtrip("\xff\x00\xfe", 3, "/wD+"), "base64 binary");
  unsigned char *d;
  size_t dl;
  OK(moat_base64_decode("Zm8", 3, &d, &dl) == 0 && dl == 2 && memcmp(d, "fo", 2) == 0, "unpadded accepted");
  free(d);
  OK(moat_base64_decode("Zm9v!", 5, &d, &dl) < 0, "invalid character rejected");
  OK(moat_base64_decode("Z", 1, &d, &dl) < 0, "1 char rejected");
  OK(moat_base64_decode("Zm=v", 4, &d, &dl) < 0, "padding in the middle rejected");
  OK(moat_base64_decode("Zh==", 4, &d, &dl) < 0, "non-zero trailing bits rejected");
  OK(moat_base64_decode("Zm9v\n", 5, &d, &dl) < 0, "whitespace rejected");
  OK(moat_base64_decode("=", 1, &d, &dl) < 0, "lone '=' rejected");
  /* all byte values */
  unsigned char all[256];
  for (int i = 0; i < 256; i++)
    all[i] = (unsigned char)i;
  size_t el;
  char *e = moat_base64_encode(all, 256, &el);
  OK(el == 344 && moat_base64_decode(e, el, &d, &dl) == 0 && dl == 256 && memcmp(d, all, 256) == 0,
     "256 byte values round-trip");
  free(d);
  free(e);
}

static void test_rfc3339(void) {
  char b[48];
  OK(strcmp(api_rfc3339_ms(0, b, sizeof(b)), "1970-01-01T00:00:00.000Z") == 0, "epoch");
  OK(strcmp(api_rfc3339_ms(1795943796123LL, b, sizeof(b)), "2026-11-29T09:16:36.123Z") == 0,
     "2026-11-29T09:16:36.123Z (%s)", b);
  OK(strcmp(api_rfc3339_ms(951782400007LL, b, sizeof(b)), "2000-02-29T00:00:00.007Z") == 0,
     "leap day, 7 ms (%s)", b);
  OK(strcmp(api_rfc3339_ms(-1, b, sizeof(b)), "1969-12-31T23:59:59.999Z") == 0, "negative ms floors (%s)", b);
  json_t *j = api_time_json(0, true);
  OK(json_is_null(j), "0 -> null when null_if_zero");
  json_decref(j);
  j = api_time_json(1000, true);
  OK(json_is_string(j) && strcmp(json_string_value(j), "1970-01-01T00:00:01.000Z") == 0,
     "time as JSON string");
  json_decref(j);
}

static void test_listen(void) {
  struct sockaddr_storage ss;
  socklen_t sl;
  moat_error *err = NULL;
  struct sockaddr_in *in4 = (struct sockaddr_in *)&ss;
  struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;
  OK(api_parse_listen("127.0.0.1:7070", &ss, &sl, &err) == 0 && ss.ss_family == AF_INET &&
         ntohs(in4->sin_port) == 7070 && in4->sin_addr.s_addr == htonl(INADDR_LOOPBACK),
     "127.0.0.1:7070");
  OK(api_parse_listen("localhost:0", &ss, &sl, &err) == 0 && ss.ss_family == AF_INET &&
         ntohs(in4->sin_port) == 0,
     "localhost:0");
  OK(api_parse_listen("[::1]:8080", &ss, &sl, &err) == 0 && ss.ss_family == AF_INET6 &&
         ntohs(in6->sin6_port) == 8080 && sl == sizeof(*in6),
     "[::1]:8080");
  OK(api_parse_listen("::1:8080", &ss, &sl, &err) == 0 && ss.ss_family == AF_INET6,
     "::1:8080 without brackets");
  static const char *bad[] = {
      "",        "7070", "127.0.0.1", "127.0.0.1:", "127.0.0.1:65536", "127.0.0.1:-1", "example.com:80",
      "[::1:80", ":80",  "1.2.3.4:8x"};
  for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
    int rc = api_parse_listen(bad[i], &ss, &sl, &err);
    OK(rc < 0 && err && err->status == EINVAL, "'%s' rejected", bad[i]);
    moat_error_free(&err);
  }
}

static bool split_is(const char *buf, size_t len, size_t want, bool want_valid) {
  bool valid;
  size_t n = api_utf8_stream_split(buf, len, &valid);
  return n == want && valid == want_valid;
}

static void test_stream_split(void) {
  OK(split_is("abc", 3, 3, true), "split: ASCII whole");
  OK(split_is("", 0, 0, true), "split: empty");
  OK(split_is("a\xc3", 2, 1, true), "split: 2-byte lead carried");
  OK(split_is("a\xe2\x82", 3, 1, true), "split: 3-byte sequence cut after 2 carried");
  OK(split_is("\xf0\x9f\x98", 3, 0, true), "split: 4-byte sequence cut after 3 carried");
  OK(split_is("x\xf0\x9f\x98\x80", 5, 5, true), "split: complete emoji kept");
  OK(split_is("a\xff", 2, 2, false), "split: 0xff invalid");
  OK(split_is("\xc3(", 2, 2, false), "split: bad continuation invalid");
  OK(split_is("\xc0", 1, 1, false), "split: 0xc0 lead invalid, not carried");
  OK(split_is("\xe0\x80", 2, 2, false), "split: overlong prefix invalid");
  OK(split_is("\xed\xa0", 2, 2, false), "split: surrogate prefix invalid");
  OK(split_is("\x80"
              "abc",
              4, 4, false),
     "split: stray continuation invalid");
  /* A sequence split across two chunks at every position re-joins into valid text. */
  const char *euro = "\xe2\x82\xac";
  bool all = true;
  for (size_t cut = 0; cut <= 3; cut++) {
    bool v;
    size_t n = api_utf8_stream_split(euro, cut, &v);
    all = all && v && n == (cut == 3 ? 3 : 0);
  }
  OK(all, "split: euro sign cut anywhere is carried, not broken");
}

static void test_ws_accept(void) {
  /* RFC 6455 section 1.3 */
  char *a = moat_ws_accept("dGhlIHNhbXBsZSBub25jZQ==");
  OK(a && strcmp(a, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=") == 0, "Sec-WebSocket-Accept of the RFC 6455 example (%s)",
     a ? a : "NULL");
  free(a);
  a = moat_ws_accept("x3JJHMbDL1EzLkh9GBhXDw==");
  OK(a && strcmp(a, "HSmrc0sMlYUkAGmm5OPpG2HaGWk=") == 0, "Sec-WebSocket-Accept of a second key (%s)",
     a ? a : "NULL");
  free(a);
}

int main(void) {
  test_stream_split();
  test_ws_accept();
  test_utf8();
  test_base64();
  test_rfc3339();
  test_listen();
  return tap_done();
}

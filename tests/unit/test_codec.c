/* test_codec.c -- common/codec.c, shared by the API and the CLI: SHA-1 test vectors (FIPS 180 /
 * RFC 3174), base64 round trips and RFC 6455's Sec-WebSocket-Accept example */
#include <stdlib.h>
#include <string.h>

#include "common/codec.h"
#include "tap.h"

static void hex(const unsigned char *d, size_t n, char *out) {
  for (size_t i = 0; i < n; i++)
    sprintf(out + 2 * i, "%02x", d[i]);
}

static bool sha1_is(const void *data, size_t len, const char *want) {
  unsigned char d[20];
  char h[41];
  moat_sha1(data, len, d);
  hex(d, 20, h);
  return strcmp(h, want) == 0;
}

int main(void) {
  OK(sha1_is("", 0, "da39a3ee5e6b4b0d3255bfef95601890afd80709"), "sha1 of the empty string");
  OK(sha1_is("abc", 3, "a9993e364706816aba3e25717850c26c9cd0d89d"), "sha1 of abc");
  const char *m448 = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  OK(sha1_is(m448, strlen(m448), "84983e441c3bd26ebaae4aa1f95129e5e54670f1"), "sha1 of the 448-bit vector");
  const char *m896 =
      "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrs"
      "mnopqrstnopqrstu";
  OK(sha1_is(m896, strlen(m896), "a49b2446a02c645bf419f995b67091253a04a259"), "sha1 of the 896-bit vector");
  size_t mn = 1000000;
  char *ma = malloc(mn);
  memset(ma, 'a', mn);
  OK(sha1_is(ma, mn, "34aa973cd4c4daa4f61eeb2bdbad27316534016f"), "sha1 of a million a's");
  free(ma);
  /* lengths around the padding boundary (55, 56, 63, 64 bytes) against known digests */
  char z[64];
  memset(z, 'a', sizeof(z));
  OK(sha1_is(z, 55, "c1c8bbdc22796e28c0e15163d20899b65621d65a"), "sha1 of 55 a's");
  OK(sha1_is(z, 56, "c2db330f6083854c99d4b5bfb6e8f29f201be699"), "sha1 of 56 a's");
  OK(sha1_is(z, 64, "0098ba824b5c16427bd7a1122a5a442a25ec644d"), "sha1 of 64 a's");

  char *acc = moat_ws_accept("dGhlIHNhbXBsZSBub25jZQ==");
  OK(strcmp(acc, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=") == 0, "RFC 6455 accept example: %s", acc);
  free(acc);

  const char *vec[][2] = {{"", ""},
                          {"f", "Zg=="},
                          {"fo", "Zm8="},
                          {"foo", "Zm9v"},
                          {"foob", "Zm9vYg=="},
                          {"fooba", "Zm9vYmE="},
                          {"foobar", "Zm9vYmFy"}};
  for (size_t i = 0; i < sizeof(vec) / sizeof(vec[0]); i++) {
    char *e = moat_base64_encode(vec[i][0], strlen(vec[i][0]), NULL);
    unsigned char *d = NULL;
    size_t dl = 0;
    int r = moat_base64_decode(vec[i][1], strlen(vec[i][1]), &d, &dl);
    OK(strcmp(e, vec[i][1]) == 0 && r == 0 && dl == strlen(vec[i][0]) && memcmp(d, vec[i][0], dl) == 0,
       "base64 '%s' <-> '%s' (got '%s')", vec[i][0], vec[i][1], e);
    free(e);
    free(d);
  }
  unsigned char *d = NULL;
  size_t dl;
  OK(moat_base64_decode("Zm9v!", 5, &d, &dl) < 0, "base64 rejects a bad character");
  unsigned char all[256];
  for (int i = 0; i < 256; i++)
    all[i] = (unsigned char)i;
  char *e = moat_base64_encode(all, sizeof(all), NULL);
  OK(moat_base64_decode(e, strlen(e), &d, &dl) == 0 && dl == 256 && memcmp(d, all, 256) == 0,
     "base64 round trip of all bytes");
  free(e);
  free(d);
  return tap_done();
}

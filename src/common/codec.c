/* codec.c -- base64 (RFC 4648), SHA-1 (FIPS 180-4) and Sec-WebSocket-Accept (RFC 6455); pure, the
 * one copy for moatd's API and the CLI; unit-tested by test_codec.c and test_api_codec.c */
#include "codec.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

static const char b64chars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

char *moat_base64_encode(const void *buf, size_t len, size_t *out_len) {
  const unsigned char *s = buf;
  size_t n = (len + 2) / 3 * 4;
  char *out = xmalloc(n + 1);
  size_t o = 0, i = 0;
  for (; i + 2 < len; i += 3) {
    uint32_t v = (uint32_t)s[i] << 16 | (uint32_t)s[i + 1] << 8 | s[i + 2];
    out[o++] = b64chars[v >> 18];
    out[o++] = b64chars[(v >> 12) & 63];
    out[o++] = b64chars[(v >> 6) & 63];
    out[o++] = b64chars[v & 63];
  }
  if (i < len) {
    uint32_t v = (uint32_t)s[i] << 16 | (i + 1 < len ? (uint32_t)s[i + 1] << 8 : 0);
    out[o++] = b64chars[v >> 18];
    out[o++] = b64chars[(v >> 12) & 63];
    out[o++] = i + 1 < len ? b64chars[(v >> 6) & 63] : '=';
    out[o++] = '=';
  }
  out[o] = '\0';
  if (out_len)
    *out_len = o;
  return out;
}

static int b64val(unsigned char c) {
  if (c >= 'A' && c <= 'Z')
    return c - 'A';
  if (c >= 'a' && c <= 'z')
    return c - 'a' + 26;
  if (c >= '0' && c <= '9')
    return c - '0' + 52;
  if (c == '+')
    return 62;
  if (c == '/')
    return 63;
  return -1;
}

int moat_base64_decode(const char *s, size_t len, unsigned char **out, size_t *out_len) {
  size_t pad = 0;
  if (len % 4 == 0 && len >= 1 && s[len - 1] == '=') {
    pad = 1;
    if (len >= 2 && s[len - 2] == '=')
      pad = 2;
  }
  size_t data = len - pad; /* characters carrying bits */
  if (data % 4 == 1)
    return -1;
  if (pad && data % 4 == 0)
    return -1;
  unsigned char *o = xmalloc(data / 4 * 3 + 3);
  size_t on = 0;
  uint32_t acc = 0;
  int bits = 0;
  for (size_t i = 0; i < data; i++) {
    int v = b64val((unsigned char)s[i]);
    if (v < 0) {
      free(o);
      return -1;
    }
    acc = acc << 6 | (uint32_t)v;
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      o[on++] = (unsigned char)(acc >> bits);
      acc &= (1u << bits) - 1;
    }
  }
  if (acc != 0) { /* non-canonical trailing bits */
    free(o);
    return -1;
  }
  *out = o;
  *out_len = on;
  return 0;
}

/* ---- SHA-1 ---- */

static uint32_t rol(uint32_t x, int n) { return (x << n) | (x >> (32 - n)); }

static void sha1_block(uint32_t h[5], const unsigned char *p) {
  uint32_t w[80];
  for (int i = 0; i < 16; i++)
    w[i] =
        (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
  for (int i = 16; i < 80; i++)
    w[i] = rol(w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16], 1);
  uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4];
  for (int i = 0; i < 80; i++) {
    uint32_t f, k;
    if (i < 20)
      f = (b & c) | (~b & d), k = 0x5A827999;
    else if (i < 40)
      f = b ^ c ^ d, k = 0x6ED9EBA1;
    else if (i < 60)
      f = (b & c) | (b & d) | (c & d), k = 0x8F1BBCDC;
    else
      f = b ^ c ^ d, k = 0xCA62C1D6;
    uint32_t t = rol(a, 5) + f + e + k + w[i];
    e = d, d = c, c = rol(b, 30), b = a, a = t;
  }
  h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e;
}

void moat_sha1(const void *data, size_t len, unsigned char out[20]) {
  uint32_t h[5] = {0x67452301, 0xEFCDAB89, 0x98BADCFE, 0x10325476, 0xC3D2E1F0};
  const unsigned char *p = data;
  size_t n = len;
  for (; n >= 64; n -= 64, p += 64)
    sha1_block(h, p);
  /* the rest, 0x80, zeros and the 64-bit bit length: one block, or two when it does not fit */
  unsigned char last[128] = {0};
  memcpy(last, p, n);
  last[n] = 0x80;
  size_t total = n + 9 <= 64 ? 64 : 128;
  uint64_t bits = (uint64_t)len * 8;
  for (int i = 0; i < 8; i++)
    last[total - 1 - i] = (unsigned char)(bits >> (8 * i));
  sha1_block(h, last);
  if (total == 128)
    sha1_block(h, last + 64);
  for (int i = 0; i < 5; i++)
    for (int j = 0; j < 4; j++)
      out[4 * i + j] = (unsigned char)(h[i] >> (24 - 8 * j));
}

char *moat_ws_accept(const char *key) {
  static const char guid[] = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
  _cleanup_free_ char *s = xasprintf("%s%s", key, guid);
  unsigned char d[20];
  moat_sha1(s, strlen(s), d);
  return moat_base64_encode(d, sizeof(d), NULL);
}

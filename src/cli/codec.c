/* codec.c -- the CLI's pure codecs: base64 (RFC 4648), SHA-1 (FIPS 180-4) and the WebSocket
 * Sec-WebSocket-Accept value (RFC 6455 section 4.2.2); no I/O, unit-tested by test_cli_ws.c */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../common/util.h"
#include "cli.h"

static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

char *cli_b64_encode(const unsigned char *p, size_t n) {
  char *out = xmalloc((n + 2) / 3 * 4 + 1), *o = out;
  size_t i = 0;
  for (; i + 2 < n; i += 3) {
    uint32_t v = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8 | p[i + 2];
    *o++ = b64[v >> 18];
    *o++ = b64[(v >> 12) & 63];
    *o++ = b64[(v >> 6) & 63];
    *o++ = b64[v & 63];
  }
  if (i < n) {
    uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0);
    *o++ = b64[v >> 18];
    *o++ = b64[(v >> 12) & 63];
    *o++ = i + 1 < n ? b64[(v >> 6) & 63] : '=';
    *o++ = '=';
  }
  *o = '\0';
  return out;
}

int cli_b64_decode(const char *s, unsigned char **out, size_t *len) {
  size_t n = strlen(s);
  unsigned char *buf = xmalloc(n / 4 * 3 + 3), *o = buf;
  uint32_t acc = 0;
  int bits = 0;
  for (; *s; s++) {
    if (*s == '=' || *s == '\n' || *s == '\r' || *s == ' ')
      continue;
    const char *p = strchr(b64, *s);
    if (!p) {
      free(buf);
      return -1;
    }
    acc = acc << 6 | (uint32_t)(p - b64);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      *o++ = (unsigned char)(acc >> bits);
      acc &= (1u << bits) - 1;
    }
  }
  *out = buf;
  *len = (size_t)(o - buf);
  return 0;
}

/* ---- SHA-1 ---- */

static uint32_t rol(uint32_t x, int n) { return x << n | x >> (32 - n); }

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
    if (i < 20) {
      f = (b & c) | (~b & d);
      k = 0x5A827999;
    } else if (i < 40) {
      f = b ^ c ^ d;
      k = 0x6ED9EBA1;
    } else if (i < 60) {
      f = (b & c) | (b & d) | (c & d);
      k = 0x8F1BBCDC;
    } else {
      f = b ^ c ^ d;
      k = 0xCA62C1D6;
    }
    uint32_t t = rol(a, 5) + f + e + k + w[i];
    e = d;
    d = c;
    c = rol(b, 30);
    b = a;
    a = t;
  }
  h[0] += a;
  h[1] += b;
  h[2] += c;
  h[3] += d;
  h[4] += e;
}

void cli_sha1(const void *data, size_t len, unsigned char out[20]) {
  uint32_t h[5] = {0x67452301, 0xEFCDAB89, 0x98BADCFE, 0x10325476, 0xC3D2E1F0};
  const unsigned char *p = data;
  size_t left = len;
  for (; left >= 64; left -= 64, p += 64)
    sha1_block(h, p);
  unsigned char tail[128] = {0};
  memcpy(tail, p, left);
  tail[left] = 0x80;
  size_t tlen = left + 1 + 8 <= 64 ? 64 : 128;
  uint64_t bits = (uint64_t)len * 8;
  for (int i = 0; i < 8; i++)
    tail[tlen - 1 - i] = (unsigned char)(bits >> (8 * i));
  sha1_block(h, tail);
  if (tlen == 128)
    sha1_block(h, tail + 64);
  for (int i = 0; i < 5; i++) {
    out[4 * i] = (unsigned char)(h[i] >> 24);
    out[4 * i + 1] = (unsigned char)(h[i] >> 16);
    out[4 * i + 2] = (unsigned char)(h[i] >> 8);
    out[4 * i + 3] = (unsigned char)h[i];
  }
}

char *cli_ws_accept(const char *key) {
  static const char guid[] = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
  _cleanup_free_ char *s = xasprintf("%s%s", key, guid);
  unsigned char d[20];
  cli_sha1(s, strlen(s), d);
  return cli_b64_encode(d, sizeof(d));
}

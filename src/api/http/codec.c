/* codec.c -- UTF-8 validation and repair, RFC 3339 times and listen addresses (pure; base64 and
 * the WebSocket accept key are in common/codec.c) */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "http.h"

/* Length of the valid UTF-8 sequence at s[0..n), or 0 when s starts an ill-formed one; then
 * *bad is the length of its maximal subpart (>= 1), which becomes one U+FFFD (Unicode 3.9, the
 * "best practice" browsers and Python follow). */
static size_t utf8_seq(const unsigned char *s, size_t n, size_t *bad) {
  unsigned char c = s[0];
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;
  *bad = 1;
  if (c < 0x80)
    return 1;
  if (c >= 0xC2 && c <= 0xDF)
    need = 1;
  else if (c >= 0xE0 && c <= 0xEF) {
    need = 2;
    if (c == 0xE0)
      lo = 0xA0; /* no overlongs */
    else if (c == 0xED)
      hi = 0x9F; /* no surrogates */
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 3;
    if (c == 0xF0)
      lo = 0x90;
    else if (c == 0xF4)
      hi = 0x8F; /* <= U+10FFFF */
  } else
    return 0;
  for (size_t i = 1; i <= need; i++) {
    if (i >= n)
      return 0;
    unsigned char d = s[i];
    unsigned char l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
    if (d < l || d > h)
      return 0;
    *bad = i + 1;
  }
  return need + 1;
}

size_t api_utf8_stream_split(const char *buf, size_t len, bool *valid) {
  const unsigned char *s = (const unsigned char *)buf;
  size_t i = 0, bad;
  *valid = true;
  while (i < len) {
    size_t k = utf8_seq(s + i, len - i, &bad);
    if (k == 0) {
      /* A valid lead byte whose sequence runs into the end of buf: carry it over. */
      if (s[i] >= 0xC2 && s[i] <= 0xF4 && bad == len - i)
        return i;
      *valid = false;
      return len;
    }
    i += k;
  }
  return len;
}

bool api_utf8_valid(const char *buf, size_t len) {
  const unsigned char *s = (const unsigned char *)buf;
  size_t i = 0, bad;
  while (i < len) {
    size_t k = utf8_seq(s + i, len - i, &bad);
    if (k == 0)
      return false;
    i += k;
  }
  return true;
}

char *api_utf8_sanitize(const char *buf, size_t len, size_t *out_len, bool *was_valid) {
  const unsigned char *s = (const unsigned char *)buf;
  /* Worst case: every byte becomes 3 bytes (EF BF BD). */
  if (len > (SIZE_MAX - 1) / 3)
    abort();
  char *out = xmalloc(len * 3 + 1);
  size_t i = 0, o = 0, bad;
  bool valid = true;
  while (i < len) {
    size_t k = utf8_seq(s + i, len - i, &bad);
    if (k > 0) {
      memcpy(out + o, s + i, k);
      o += k;
      i += k;
    } else {
      /* bad counts the lead byte plus the continuation bytes that were still acceptable */
      if (bad > len - i)
        bad = len - i;
      out[o++] = (char)0xEF;
      out[o++] = (char)0xBF;
      out[o++] = (char)0xBD;
      i += bad;
      valid = false;
    }
  }
  out[o] = '\0';
  if (out_len)
    *out_len = o;
  if (was_valid)
    *was_valid = valid;
  return out;
}

char *api_rfc3339_ms(int64_t ms, char *buf, size_t size) {
  int64_t sec = ms / 1000, rem = ms % 1000;
  if (rem < 0) {
    rem += 1000;
    sec -= 1;
  }
  time_t t = (time_t)sec;
  struct tm tm;
  if (!gmtime_r(&t, &tm)) {
    snprintf(buf, size, "1970-01-01T00:00:00.000Z");
    return buf;
  }
  snprintf(buf, size, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
           tm.tm_hour, tm.tm_min, tm.tm_sec, (int)rem);
  return buf;
}

json_t *api_time_json(int64_t ms, bool null_if_zero) {
  char b[48];
  if (null_if_zero && ms <= 0)
    return json_null();
  return json_string(api_rfc3339_ms(ms, b, sizeof(b)));
}

int api_parse_listen(const char *listen, struct sockaddr_storage *ss, socklen_t *len, moat_error **err) {
  if (!listen || !*listen)
    return moat_error_set(err, EINVAL, "listen address is empty");
  const char *colon = strrchr(listen, ':');
  if (!colon || colon == listen)
    return moat_error_set(err, EINVAL, "listen address '%s' is not HOST:PORT", listen);
  uint64_t port;
  if (parse_u64(colon + 1, &port) < 0 || port > 65535)
    return moat_error_set(err, EINVAL, "listen address '%s': bad port", listen);
  size_t hlen = (size_t)(colon - listen);
  char host[INET6_ADDRSTRLEN + 8];
  if (listen[0] == '[') {
    if (hlen < 3 || listen[hlen - 1] != ']')
      return moat_error_set(err, EINVAL, "listen address '%s': bad [IPv6] host", listen);
    hlen -= 2;
    if (hlen >= sizeof(host))
      return moat_error_set(err, EINVAL, "listen address '%s': host too long", listen);
    memcpy(host, listen + 1, hlen);
  } else {
    if (hlen >= sizeof(host))
      return moat_error_set(err, EINVAL, "listen address '%s': host too long", listen);
    memcpy(host, listen, hlen);
  }
  host[hlen] = '\0';
  memset(ss, 0, sizeof(*ss));
  if (strcmp(host, "localhost") == 0)
    strcpy(host, "127.0.0.1");
  struct sockaddr_in *in4 = (struct sockaddr_in *)ss;
  struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ss;
  if (inet_pton(AF_INET, host, &in4->sin_addr) == 1) {
    in4->sin_family = AF_INET;
    in4->sin_port = htons((uint16_t)port);
    *len = sizeof(*in4);
    return 0;
  }
  if (inet_pton(AF_INET6, host, &in6->sin6_addr) == 1) {
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons((uint16_t)port);
    *len = sizeof(*in6);
    return 0;
  }
  return moat_error_set(err, EINVAL, "listen address '%s': host must be an IP literal or localhost", listen);
}

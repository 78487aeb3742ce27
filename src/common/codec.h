/* codec.h -- base64 (RFC 4648), SHA-1 (FIPS 180-4) and the WebSocket Sec-WebSocket-Accept value
 * (RFC 6455 section 4.2.2), shared by moatd's API and the CLI; pure, no I/O */
#ifndef MOAT_CODEC_H
#define MOAT_CODEC_H

#include <stddef.h>

/* Standard base64 with padding of buf[0..len), NUL-terminated; *out_len (when not NULL) is its
 * length. Never fails; caller frees. */
char *moat_base64_encode(const void *buf, size_t len, size_t *out_len);
/* Strict decoding of s[0..len): the standard alphabet only, padding optional but, when present,
 * only at the end of a 4-character group; no whitespace; non-zero trailing bits rejected.
 * Returns 0 with *out (owned by the caller) and *out_len, or -1 with *out untouched. */
int moat_base64_decode(const char *s, size_t len, unsigned char **out, size_t *out_len);
/* SHA-1 digest of data[0..len) into out. Only for protocols that require it (WebSocket). */
void moat_sha1(const void *data, size_t len, unsigned char out[20]);
/* The Sec-WebSocket-Accept answering Sec-WebSocket-Key `key`: base64 of SHA-1 of key + the
 * RFC 6455 GUID. Caller frees. */
char *moat_ws_accept(const char *key);

#endif

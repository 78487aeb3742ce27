/* sha256.h -- SHA-256 (FIPS 180-4), for hashing API keys before they are stored */
#ifndef MOAT_SHA256_H
#define MOAT_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define MOAT_SHA256_LEN 32

struct moat_sha256 {
  uint32_t h[8];
  uint64_t len; /* bytes hashed so far */
  uint8_t buf[64];
  size_t buf_len;
};

void moat_sha256_init(struct moat_sha256 *s);
void moat_sha256_update(struct moat_sha256 *s, const void *data, size_t n);
/* Writes the 32-byte digest; s must be re-initialised before reuse. */
void moat_sha256_final(struct moat_sha256 *s, uint8_t out[MOAT_SHA256_LEN]);

/* One-shot digest of data. */
void moat_sha256(const void *data, size_t n, uint8_t out[MOAT_SHA256_LEN]);
/* One-shot digest as 64 lowercase hex characters plus NUL into hex (size 65). */
void moat_sha256_hex(const void *data, size_t n, char hex[2 * MOAT_SHA256_LEN + 1]);

#endif

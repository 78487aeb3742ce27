/* test_sha256.c -- SHA-256 against the FIPS 180-4 / NIST vectors, incremental updates and sha256sum(1) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/sha256.h"
#include "common/util.h"

#include "tap.h"

static void hex_of(const uint8_t d[32], char out[65]) {
  for (int i = 0; i < 32; i++)
    sprintf(out + 2 * i, "%02x", d[i]);
}

int main(void) {
  static const struct {
    const char *in;
    const char *hex;
  } vectors[] = {
      {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
      {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
      {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
       "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
      {"abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopq"
       "rstnopqrstu",
       "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"},
  };
  for (size_t i = 0; i < sizeof(vectors) / sizeof(vectors[0]); i++) {
    char hex[65];
    moat_sha256_hex(vectors[i].in, strlen(vectors[i].in), hex);
    CHECK(strcmp(hex, vectors[i].hex) == 0, "vector %zu (%zu bytes): %s", i, strlen(vectors[i].in), hex);
  }

  /* One million 'a', fed in uneven pieces. */
  {
    struct moat_sha256 s;
    moat_sha256_init(&s);
    char chunk[997];
    memset(chunk, 'a', sizeof(chunk));
    size_t left = 1000000;
    while (left > 0) {
      size_t n = left < sizeof(chunk) ? left : sizeof(chunk);
      moat_sha256_update(&s, chunk, n);
      left -= n;
    }
    uint8_t d[32];
    char hex[65];
    moat_sha256_final(&s, d);
    hex_of(d, hex);
    CHECK(strcmp(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0") == 0,
          "one million 'a' in 997-byte pieces: %s", hex);
  }

  /* Every split point of every length up to 200 bytes gives the one-shot digest. */
  {
    uint8_t data[200];
    random_bytes(data, sizeof(data));
    int bad = 0;
    for (size_t len = 0; len <= sizeof(data); len++) {
      uint8_t whole[32];
      moat_sha256(data, len, whole);
      for (size_t cut = 0; cut <= len; cut++) {
        struct moat_sha256 s;
        uint8_t d[32];
        moat_sha256_init(&s);
        moat_sha256_update(&s, data, cut);
        moat_sha256_update(&s, data + cut, len - cut);
        moat_sha256_final(&s, d);
        if (memcmp(d, whole, 32) != 0)
          bad++;
      }
    }
    CHECK(bad == 0, "split updates match one-shot for all lengths 0..200 (%d mismatches)", bad);
  }

  /* Random data against the system's sha256sum, lengths around the padding boundaries. */
  {
    static const size_t lens[] = {1, 55, 56, 57, 63, 64, 65, 119, 120, 4096, 100003};
    int bad = 0, ran = 0;
    for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
      size_t len = lens[i];
      uint8_t *data = xmalloc(len);
      random_bytes(data, len);
      char path[] = "/tmp/moat-sha-XXXXXX";
      int fd = mkstemp(path);
      if (fd < 0 || write_all(fd, data, len) < 0) {
        bad++;
        free(data);
        continue;
      }
      close(fd);
      char cmd[128], line[128] = "";
      snprintf(cmd, sizeof(cmd), "sha256sum %s", path);
      FILE *p = popen(cmd, "r");
      if (p) {
        if (!fgets(line, sizeof(line), p))
          line[0] = '\0';
        pclose(p);
      }
      unlink(path);
      char hex[65];
      moat_sha256_hex(data, len, hex);
      free(data);
      if (strlen(line) < 64)
        continue; /* no sha256sum on this machine */
      ran++;
      if (strncmp(line, hex, 64) != 0)
        bad++;
    }
    CHECK(ran > 0 && bad == 0, "random data of 11 lengths matches sha256sum (%d compared, %d mismatches)",
          ran, bad);
  }

  return tap_done();
}

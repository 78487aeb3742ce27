/* fuzz_pg_startup.c -- libFuzzer target: what the database proxy reads from a client before it
 * routes the connection (api/pg/startup.c), and the server bytes it scans for BackendKeyData.
 * Every byte is hostile.
 *
 * Input: the client's bytes (a length word, then the packet; the rest is fed to the scan as a
 * server's). Checks: a length is accepted only from 8 to 10000; a parse that succeeds yields a
 * known kind, a startup's user of 1..63 bytes and database of 1..63 bytes pointing inside the
 * packet, at most 64 parameters; a failure names a SQLSTATE of 5 characters with EPROTO; an
 * ErrorResponse built from any message fits its buffer and frames itself; the scan never reads
 * past what it is fed and keeps a key only from a 12-byte BackendKeyData. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "api/pg/pg.h"
#include "common/util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_string(const char *s, const uint8_t *pkt, size_t len) {
  if (!s || (const uint8_t *)s < pkt + 8 || (const uint8_t *)s >= pkt + len)
    abort();
  size_t n = strnlen(s, (size_t)(pkt + len - (const uint8_t *)s));
  if (n == 0 || n > PG_MAX_NAME || (const uint8_t *)s + n >= pkt + len)
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 4)
    return 0;
  uint32_t len = 0;
  moat_error *err = NULL;
  uint32_t announced = (uint32_t)data[0] << 24 | (uint32_t)data[1] << 16 | (uint32_t)data[2] << 8 | data[3];
  int rc = pg_startup_length(data, &len, &err);
  if ((rc == 0) != (announced >= PG_STARTUP_MIN && announced <= PG_STARTUP_MAX))
    abort();
  if (rc < 0) {
    if (!err || err->status != EPROTO)
      abort();
    moat_error_free(&err);
  }
  size_t rest = 0;
  if (rc == 0 && len <= size) {
    uint8_t *pkt = xmemdup(data, len); /* exactly the packet: a read past it is caught by ASan */
    struct pg_startup st;
    const char *state = NULL;
    if (pg_startup_parse(pkt, len, &st, &state, &err) == 0) {
      switch (st.kind) {
      case PG_KIND_SSL:
      case PG_KIND_GSSENC:
        if (len != 8)
          abort();
        break;
      case PG_KIND_CANCEL:
        if (len != 16)
          abort();
        break;
      case PG_KIND_STARTUP:
        if (st.version >> 16 != 3 || st.n_params > PG_MAX_PARAMS || pkt[len - 1] != 0)
          abort();
        check_string(st.user, pkt, len);
        check_string(st.database, pkt, len);
        break;
      default:
        abort();
      }
    } else {
      if (!err || err->status != EPROTO || !state || strlen(state) != 5)
        abort();
      uint8_t e[128];
      size_t el = pg_error_response(e, sizeof(e), state, moat_error_msg(err));
      if (el > sizeof(e) || e[0] != 'E' || e[el - 1] != 0 ||
          ((uint32_t)e[1] << 24 | (uint32_t)e[2] << 16 | (uint32_t)e[3] << 8 | e[4]) != el - 1)
        abort();
      moat_error_free(&err);
    }
    free(pkt);
    rest = len;
  }
  /* the rest as a server's first messages, in two pieces */
  size_t n = size - rest;
  uint8_t *srv = xmalloc(n ? n : 1); /* exactly n bytes are read */
  memcpy(srv, data + rest, n);
  struct pg_backend_scan sc = {0};
  size_t half = n / 2;
  pg_backend_scan_feed(&sc, srv, half);
  pg_backend_scan_feed(&sc, srv + half, n - half);
  if (sc.have_key) {
    const uint8_t *k = memmem(srv, n, "K\0\0\0\x0c", 5);
    if (!k)
      abort(); /* a key from no BackendKeyData frame */
  }
  free(srv);
  return 0;
}

/* test_pg_startup.c -- the database proxy's startup packet parser, ErrorResponse builder and
 * BackendKeyData scan (api/pg/startup.c): bounds, every request kind, malformed layouts */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "api/pg/pg.h"
#include "tap.h"

static size_t put32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)(v >> 24);
  p[1] = (uint8_t)(v >> 16);
  p[2] = (uint8_t)(v >> 8);
  p[3] = (uint8_t)v;
  return 4;
}

/* A packet: code, then the raw body bytes (NUL-separated params with their final NUL as given). */
static size_t pkt(uint8_t *out, uint32_t code, const char *body, size_t body_len) {
  size_t n = 8 + body_len;
  put32(out, (uint32_t)n);
  put32(out + 4, code);
  memcpy(out + 8, body, body_len);
  return n;
}

#define BODY(s) s, sizeof(s) - 1

static int parse(const uint8_t *p, size_t n, struct pg_startup *st, const char **state) {
  moat_error *err = NULL;
  *state = NULL;
  int rc = pg_startup_parse(p, n, st, state, &err);
  if (rc < 0 && (!err || err->status != EPROTO || !*state))
    return -2; /* a failure must say why */
  moat_error_free(&err);
  return rc;
}

int main(void) {
  uint8_t b[PG_STARTUP_MAX + 64];
  struct pg_startup st;
  const char *state;
  moat_error *err = NULL;
  uint32_t len;

  /* the length word */
  put32(b, 8);
  CHECK(pg_startup_length(b, &len, &err) == 0 && len == 8, "length 8 (the smallest) is accepted");
  put32(b, PG_STARTUP_MAX);
  CHECK(pg_startup_length(b, &len, &err) == 0 && len == PG_STARTUP_MAX, "length 10000 is accepted");
  put32(b, 7);
  CHECK(pg_startup_length(b, &len, &err) < 0 && err->status == EPROTO, "length 7 is refused");
  moat_error_free(&err);
  put32(b, PG_STARTUP_MAX + 1);
  CHECK(pg_startup_length(b, &len, &err) < 0, "length 10001 is refused");
  moat_error_free(&err);
  CHECK(pg_startup_length((const uint8_t *)"GET ", &len, &err) < 0, "\"GET \" (HTTP) is no length");
  moat_error_free(&err);
  const uint8_t tls[4] = {0x16, 0x03, 0x01, 0x02};
  CHECK(pg_startup_length(tls, &len, &err) < 0, "a TLS ClientHello is no length");
  moat_error_free(&err);
  put32(b, 0);
  CHECK(pg_startup_length(b, &len, &err) < 0, "length 0 is refused");
  moat_error_free(&err);

  /* a real startup, as libpq sends it */
  const char real[] = "user\0alice\0database\0shop\0application_name\0psql\0client_encoding\0UTF8\0";
  size_t n = pkt(b, PG_PROTOCOL_3, real, sizeof(real)); /* the literal's own NUL ends the list */
  CHECK(parse(b, n, &st, &state) == 0 && st.kind == PG_KIND_STARTUP && st.version == PG_PROTOCOL_3 &&
            strcmp(st.user, "alice") == 0 && strcmp(st.database, "shop") == 0 && st.options == NULL &&
            st.n_params == 4,
        "libpq's startup: user alice, database shop, 4 parameters");

  n = pkt(b, PG_PROTOCOL_3, BODY("user\0bob\0options\0-c search_path=x\0\0"));
  CHECK(parse(b, n, &st, &state) == 0 && strcmp(st.database, "bob") == 0 &&
            strcmp(st.options, "-c search_path=x") == 0,
        "no database: it defaults to the user; options are kept");

  n = pkt(b, PG_PROTOCOL_3 | 2, BODY("user\0bob\0\0"));
  CHECK(parse(b, n, &st, &state) == 0 && st.version == (PG_PROTOCOL_3 | 2),
        "protocol 3.2 passes (the server negotiates)");

  n = pkt(b, 2 << 16, BODY("user\0bob\0\0"));
  CHECK(parse(b, n, &st, &state) == -1 && strcmp(state, "0A000") == 0, "protocol 2.0 is 0A000");
  n = pkt(b, 4 << 16, BODY("user\0bob\0\0"));
  CHECK(parse(b, n, &st, &state) == -1 && strcmp(state, "0A000") == 0, "protocol 4.0 is 0A000");
  n = pkt(b, 1234, BODY("\0"));
  CHECK(parse(b, n, &st, &state) == -1 && strcmp(state, "0A000") == 0, "an unknown request code is 0A000");

  /* the special requests */
  n = pkt(b, PG_SSL_REQUEST_CODE, BODY(""));
  CHECK(parse(b, n, &st, &state) == 0 && st.kind == PG_KIND_SSL, "SSLRequest");
  n = pkt(b, PG_GSSENC_REQUEST_CODE, BODY(""));
  CHECK(parse(b, n, &st, &state) == 0 && st.kind == PG_KIND_GSSENC, "GSSENCRequest");
  n = pkt(b, PG_SSL_REQUEST_CODE, BODY("xxxx"));
  CHECK(parse(b, n, &st, &state) == -1 && strcmp(state, "08P01") == 0, "an SSLRequest of 12 bytes is 08P01");
  n = pkt(b, PG_CANCEL_REQUEST_CODE, BODY("\x00\x00\x30\x39\xde\xad\xbe\xef"));
  CHECK(parse(b, n, &st, &state) == 0 && st.kind == PG_KIND_CANCEL && st.cancel_pid == 12345 &&
            st.cancel_key == 0xdeadbeef,
        "CancelRequest: pid 12345, key 0xdeadbeef");
  n = pkt(b, PG_CANCEL_REQUEST_CODE, BODY("\x00\x00\x30\x39"));
  CHECK(parse(b, n, &st, &state) == -1 && strcmp(state, "08P01") == 0,
        "a CancelRequest of 12 bytes is 08P01");

  /* malformed layouts */
  n = pkt(b, PG_PROTOCOL_3, BODY(""));
  CHECK(parse(b, n, &st, &state) == -1 && strcmp(state, "08P01") == 0,
        "no parameters and no terminator: 08P01");
  n = pkt(b, PG_PROTOCOL_3, BODY("\0"));
  CHECK(parse(b, n, &st, &state) == -1 && strcmp(state, "28000") == 0, "no user: 28000");
  n = pkt(b, PG_PROTOCOL_3, BODY("user\0\0\0"));
  CHECK(parse(b, n, &st, &state) == -1 && strcmp(state, "28000") == 0, "an empty user: 28000");
  n = pkt(b, PG_PROTOCOL_3, BODY("user\0bob\0"));
  CHECK(parse(b, n, &st, &state) == -1 && strcmp(state, "08P01") == 0, "no final terminator: 08P01");
  n = pkt(b, PG_PROTOCOL_3, BODY("user\0bob"));
  CHECK(parse(b, n, &st, &state) == -1 && strcmp(state, "08P01") == 0, "a value not terminated: 08P01");
  n = pkt(b, PG_PROTOCOL_3, BODY("user"));
  CHECK(parse(b, n, &st, &state) == -1 && strcmp(state, "08P01") == 0, "a name not terminated: 08P01");
  n = pkt(b, PG_PROTOCOL_3, BODY("user\0bob\0\0junk"));
  CHECK(parse(b, n, &st, &state) == -1 && strcmp(state, "08P01") == 0, "bytes after the terminator: 08P01");
  n = pkt(b, PG_PROTOCOL_3, BODY("user\0bob\0user\0eve\0\0"));
  CHECK(parse(b, n, &st, &state) == -1 && strcmp(state, "08P01") == 0, "a repeated user: 08P01");
  n = pkt(b, PG_PROTOCOL_3, BODY("user\0bob\0\0"));
  put32(b, (uint32_t)n + 1);
  CHECK(parse(b, n, &st, &state) == -1, "a length word that is not the packet's: refused");

  /* name bounds: 63 bytes pass, 64 do not */
  char body[512];
  size_t bl = 0;
  memcpy(body, "user\0", 5);
  bl = 5;
  memset(body + bl, 'u', 63);
  bl += 63;
  body[bl++] = 0;
  body[bl++] = 0;
  n = pkt(b, PG_PROTOCOL_3, body, bl);
  CHECK(parse(b, n, &st, &state) == 0 && strlen(st.user) == 63, "a 63-byte user passes");
  memcpy(body, "user\0", 5);
  bl = 5;
  memset(body + bl, 'u', 64);
  bl += 64;
  body[bl++] = 0;
  body[bl++] = 0;
  n = pkt(b, PG_PROTOCOL_3, body, bl);
  CHECK(parse(b, n, &st, &state) == -1 && strcmp(state, "28000") == 0, "a 64-byte user is 28000");
  bl = 0;
  memcpy(body, "user\0u\0database\0", 16);
  bl = 16;
  memset(body + bl, 'd', 64);
  bl += 64;
  body[bl++] = 0;
  body[bl++] = 0;
  n = pkt(b, PG_PROTOCOL_3, body, bl);
  CHECK(parse(b, n, &st, &state) == -1 && strcmp(state, "3D000") == 0, "a 64-byte database is 3D000");

  /* the parameter count bound: 64 pass, 65 do not */
  for (int count = 64; count <= 65; count++) {
    char *many = malloc(count * 16 + 16);
    size_t ml = (size_t)sprintf(many, "user%cu%c", 0, 0);
    for (int i = 1; i < count; i++)
      ml += (size_t)sprintf(many + ml, "p%d%cv%c", i, 0, 0);
    many[ml++] = 0;
    n = pkt(b, PG_PROTOCOL_3, many, ml);
    int rc = parse(b, n, &st, &state);
    if (count == 64)
      CHECK(rc == 0 && st.n_params == 64, "64 parameters pass");
    else
      CHECK(rc == -1 && strcmp(state, "08P01") == 0, "65 parameters are 08P01");
    free(many);
  }

  /* the largest packet: one long value, 10000 bytes in all */
  memcpy(b + 8, "user\0u\0x\0", 9);
  size_t vl = PG_STARTUP_MAX - 8 - 9 - 2;
  memset(b + 17, 'v', vl);
  b[17 + vl] = 0;
  b[18 + vl] = 0;
  put32(b, PG_STARTUP_MAX);
  put32(b + 4, PG_PROTOCOL_3);
  CHECK(parse(b, PG_STARTUP_MAX, &st, &state) == 0 && st.n_params == 2, "a 10000-byte startup parses");

  /* ErrorResponse */
  uint8_t e[256];
  size_t el = pg_error_response(e, sizeof(e), "53300", "too\nmany");
  CHECK(e[0] == 'E' && el >= 5 && ((uint32_t)e[1] << 24 | e[2] << 16 | e[3] << 8 | e[4]) == el - 1,
        "ErrorResponse: 'E' and a length of the rest (%zu bytes)", el);
  CHECK(memmem(e, el, "C53300", 7) && memmem(e, el, "SFATAL", 7) && memmem(e, el, "Mtoo?many", 10) &&
            e[el - 1] == 0 && e[el - 2] == 0,
        "ErrorResponse: severity, SQLSTATE, message with control bytes replaced, terminators");
  char longmsg[2000];
  memset(longmsg, 'm', sizeof(longmsg) - 1);
  longmsg[sizeof(longmsg) - 1] = 0;
  el = pg_error_response(e, 64, "08P01", longmsg);
  CHECK(el == 64 && e[63] == 0 && e[62] == 0, "a long message is cut to the buffer (64 bytes)");

  /* BackendKeyData scan: AuthenticationOk, ParameterStatus, BackendKeyData, ReadyForQuery, fed a
   * byte at a time and whole */
  uint8_t srv[128];
  size_t sl = 0;
  srv[sl++] = 'R';
  sl += put32(srv + sl, 8);
  sl += put32(srv + sl, 0);
  srv[sl++] = 'S';
  sl += put32(srv + sl, 4 + 9);
  memcpy(srv + sl, "a\0bcdefg", 9);
  sl += 9;
  srv[sl++] = 'K';
  sl += put32(srv + sl, 12);
  sl += put32(srv + sl, 4242);
  sl += put32(srv + sl, 0x01020304);
  srv[sl++] = 'Z';
  sl += put32(srv + sl, 5);
  srv[sl++] = 'I';
  /* a 'K' after ReadyForQuery is query data: never read */
  srv[sl++] = 'K';
  sl += put32(srv + sl, 12);
  sl += put32(srv + sl, 1);
  sl += put32(srv + sl, 1);
  struct pg_backend_scan sc = {0};
  for (size_t i = 0; i < sl; i++)
    pg_backend_scan_feed(&sc, srv + i, 1);
  CHECK(sc.have_key && sc.pid == 4242 && sc.secret == 0x01020304 && sc.done,
        "BackendKeyData fed byte by byte: pid 4242, stops at ReadyForQuery");
  struct pg_backend_scan sc2 = {0};
  pg_backend_scan_feed(&sc2, srv, sl);
  CHECK(sc2.have_key && sc2.pid == 4242 && sc2.secret == 0x01020304 && sc2.done, "the same fed whole");
  struct pg_backend_scan sc3 = {0};
  uint8_t bad[] = {'K', 0, 0, 0, 13, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  pg_backend_scan_feed(&sc3, bad, sizeof(bad));
  CHECK(sc3.done && !sc3.have_key, "a BackendKeyData of the wrong length is not kept");
  struct pg_backend_scan sc4 = {0};
  uint8_t er[] = {'E', 0, 0, 0, 4, 'K', 0, 0, 0, 12, 0, 0, 0, 1, 0, 0, 0, 1};
  pg_backend_scan_feed(&sc4, er, sizeof(er));
  CHECK(sc4.done && !sc4.have_key, "the scan stops at an ErrorResponse");

  return tap_done();
}

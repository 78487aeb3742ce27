/* test_proto.c -- guest protocol frames: encode/decode round trips, malformed frames rejected */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/util.h"
#include "proto/proto.h"

#include "tap.h"

#define check(cond, name) CHECK((cond), "%s", (name))

/* The wire bytes of m, as moat_msg_send writes them (through a socketpair). */
static uint8_t *wire(const struct moat_msg *m, size_t *len) {
  int sv[2];
  socketpair(AF_UNIX, SOCK_STREAM, 0, sv);
  moat_msg_send(sv[0], m);
  close(sv[0]);
  size_t cap = m->len + 64;
  uint8_t *b = xmalloc(cap);
  ssize_t r = read_all(sv[1], b, cap);
  close(sv[1]);
  *len = r > 0 ? (size_t)r : 0;
  return b;
}

static void test_round_trip(void) {
  struct moat_msg m, d;
  moat_msg_init(&m, MOAT_REQ_EXEC);
  moat_msg_init(&d, 0);
  moat_msg_put_str(&m, MOAT_T_ARGV, "sh");
  moat_msg_put_str(&m, MOAT_T_ARGV, "-c");
  moat_msg_put_str(&m, MOAT_T_ARGV, "");
  moat_msg_put_str(&m, MOAT_T_ENV, "A=1");
  moat_msg_put_u32(&m, MOAT_T_TIMEOUT_MS, 0xdeadbeef);
  moat_msg_put_i32(&m, MOAT_T_EXIT_CODE, -1);
  moat_msg_put_u64(&m, MOAT_T_MAX_OUTPUT, 0x0102030405060708ull);
  moat_msg_put_i64(&m, MOAT_T_MTIME, -1234567890123ll);
  moat_msg_put(&m, MOAT_T_DATA, "a\0b", 3);
  size_t len;
  uint8_t *b = wire(&m, &len);
  check(len == 5 + m.len && b[0] == (uint8_t)(m.len + 1) && b[4] == MOAT_REQ_EXEC,
        "frame header: LE length + type");
  moat_error *err = NULL;
  check(moat_msg_parse(b, len, &d, &err) == 1 && d.type == MOAT_REQ_EXEC && d.len == m.len &&
            memcmp(d.buf, m.buf, m.len) == 0,
        "parse gives back the same fields");
  char **argv = moat_msg_get_strv(&d, MOAT_T_ARGV);
  check(argv && strv_len(argv) == 3 && strcmp(argv[0], "sh") == 0 && strcmp(argv[1], "-c") == 0 &&
            argv[2][0] == 0,
        "repeated strings in order (empty one kept)");
  strv_free(argv);
  uint32_t u32 = 0;
  int32_t i32 = 0;
  uint64_t u64 = 0;
  int64_t i64 = 0;
  check(moat_msg_get_u32(&d, MOAT_T_TIMEOUT_MS, &u32) == 0 && u32 == 0xdeadbeef, "u32");
  check(moat_msg_get_i32(&d, MOAT_T_EXIT_CODE, &i32) == 0 && i32 == -1, "i32 negative");
  check(moat_msg_get_u64(&d, MOAT_T_MAX_OUTPUT, &u64) == 0 && u64 == 0x0102030405060708ull, "u64");
  check(moat_msg_get_i64(&d, MOAT_T_MTIME, &i64) == 0 && i64 == -1234567890123ll, "i64 negative");
  check(moat_msg_get_u32(&d, MOAT_T_MAX_OUTPUT, &u32) < 0 && u32 == 0xdeadbeef,
        "wrong width rejected, value untouched");
  check(moat_msg_get_u32(&d, MOAT_T_PID, &u32) < 0, "absent field");
  check(moat_msg_get_str(&d, MOAT_T_DATA) == NULL, "string with NUL rejected");
  struct moat_field f;
  check(moat_msg_find(&d, MOAT_T_DATA, &f) && f.len == 3 && memcmp(f.data, "a\0b", 3) == 0,
        "bytes field keeps NUL");
  char *s = moat_msg_get_str(&d, MOAT_T_ENV);
  check(s && strcmp(s, "A=1") == 0, "string getter");
  free(s);
  free(b);

  /* data frames and recv over a socket */
  int sv[2];
  socketpair(AF_UNIX, SOCK_STREAM, 0, sv);
  static uint8_t chunk[MOAT_PROTO_CHUNK];
  for (size_t i = 0; i < sizeof(chunk); i++)
    chunk[i] = (uint8_t)(i * 7);
  if (fork() == 0) {
    close(sv[1]);
    moat_msg_send_data(sv[0], MOAT_MSG_DATA, chunk, sizeof(chunk));
    moat_msg_send_empty(sv[0], MOAT_MSG_END);
    moat_msg_send_error(sv[0], ENOENT, "open %s: %s", "/x", "No such file or directory");
    _exit(0);
  }
  close(sv[0]);
  check(moat_msg_recv(sv[1], &d, &err) == 1 && d.type == MOAT_MSG_DATA &&
            moat_msg_find(&d, MOAT_T_DATA, &f) && f.len == sizeof(chunk) &&
            memcmp(f.data, chunk, sizeof(chunk)) == 0,
        "256 KiB DATA frame over a socket");
  check(moat_msg_recv(sv[1], &d, &err) == 1 && d.type == MOAT_MSG_END && d.len == 0, "END frame");
  check(moat_msg_recv(sv[1], &d, &err) == 1 && d.type == MOAT_REP_ERROR &&
            moat_msg_get_i32(&d, MOAT_T_ERRNO, &i32) == 0 && i32 == ENOENT,
        "error frame errno");
  s = moat_msg_get_str(&d, MOAT_T_MESSAGE);
  check(s && strcmp(s, "open /x: No such file or directory") == 0, "error frame message");
  free(s);
  check(moat_msg_recv(sv[1], &d, &err) == 0, "clean EOF between frames -> 0");
  close(sv[1]);
  moat_msg_free(&m);
  moat_msg_free(&d);
}

static bool rejects(const uint8_t *b, size_t len) {
  struct moat_msg d;
  moat_msg_init(&d, 0);
  moat_error *err = NULL;
  int r = moat_msg_parse(b, len, &d, &err);
  bool ok = r < 0 && err && err->status == EPROTO;
  moat_error_free(&err);
  moat_msg_free(&d);
  return ok;
}

static bool recv_rejects(const uint8_t *b, size_t len) {
  int sv[2];
  socketpair(AF_UNIX, SOCK_STREAM, 0, sv);
  write_all(sv[0], b, len);
  close(sv[0]);
  struct moat_msg d;
  moat_msg_init(&d, 0);
  moat_error *err = NULL;
  int r = moat_msg_recv(sv[1], &d, &err);
  bool ok = r < 0 && err && err->status == EPROTO;
  moat_error_free(&err);
  moat_msg_free(&d);
  close(sv[1]);
  return ok;
}

static void test_malformed(void) {
  const uint8_t shorthdr[] = {1, 0, 0};
  check(rejects(shorthdr, sizeof(shorthdr)) && recv_rejects(shorthdr, sizeof(shorthdr)), "short header");
  const uint8_t zero[] = {0, 0, 0, 0, 2};
  check(rejects(zero, sizeof(zero)) && recv_rejects(zero, sizeof(zero)), "zero length");
  const uint8_t past[] = {9, 0, 0, 0, 2, 7, 0};
  check(rejects(past, sizeof(past)) && recv_rejects(past, sizeof(past)), "length past end");
  const uint8_t huge[] = {0xff, 0xff, 0xff, 0xff, 2};
  check(rejects(huge, sizeof(huge)) && recv_rejects(huge, sizeof(huge)), "huge length");
  uint8_t over[5] = {0, 0, 0, 0, 2};
  uint32_t l = MOAT_PROTO_MAX_FRAME + 1;
  memcpy(over, &l, 4);
  check(rejects(over, sizeof(over)) && recv_rejects(over, sizeof(over)), "length just past MAX_FRAME");
  const uint8_t fpast[] = {8, 0, 0, 0, 2, 7, 0, 2, 0, 0, 0, 'a'};
  check(rejects(fpast, sizeof(fpast)) && recv_rejects(fpast, sizeof(fpast)), "field past end");
  const uint8_t fhuge[] = {8, 0, 0, 0, 2, 7, 0, 0xff, 0xff, 0xff, 0xff, 'a'};
  check(rejects(fhuge, sizeof(fhuge)) && recv_rejects(fhuge, sizeof(fhuge)), "field with huge length");
  const uint8_t fhalf[] = {4, 0, 0, 0, 2, 7, 0, 1};
  check(rejects(fhalf, sizeof(fhalf)) && recv_rejects(fhalf, sizeof(fhalf)), "truncated field header");
  const uint8_t trailing[] = {8, 0, 0, 0, 2, 7, 0, 1, 0, 0, 0, 'a', 'x'};
  check(rejects(trailing, sizeof(trailing)), "bytes after the frame (parse wants exact length)");
  const uint8_t good[] = {8, 0, 0, 0, 2, 7, 0, 1, 0, 0, 0, 'a'};
  struct moat_msg d;
  moat_msg_init(&d, 0);
  moat_error *err = NULL;
  check(moat_msg_parse(good, sizeof(good), &d, &err) == 1 && d.len == 7, "well-formed frame accepted");
  const uint8_t empty[] = {1, 0, 0, 0, MOAT_REQ_PING};
  check(moat_msg_parse(empty, sizeof(empty), &d, &err) == 1 && d.type == MOAT_REQ_PING && d.len == 0,
        "frame with no fields accepted");
  moat_msg_free(&d);
}

int main(void) {
  test_round_trip();
  test_malformed();
  return tap_done();
}

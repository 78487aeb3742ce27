/* startup.c -- the PostgreSQL startup packet, ErrorResponse and BackendKeyData: pure parsing */
#include <errno.h>
#include <string.h>

#include "pg.h"

static uint32_t be32(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static void put32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)(v >> 24);
  p[1] = (uint8_t)(v >> 16);
  p[2] = (uint8_t)(v >> 8);
  p[3] = (uint8_t)v;
}

int pg_startup_length(const uint8_t hdr[4], uint32_t *len, moat_error **err) {
  uint32_t n = be32(hdr);
  if (n < PG_STARTUP_MIN || n > PG_STARTUP_MAX)
    return moat_error_set(err, EPROTO, "not a PostgreSQL startup packet (length %u)", n);
  *len = n;
  return 0;
}

static int refuse(moat_error **err, const char **sqlstate, const char *code, const char *msg) {
  *sqlstate = code;
  return moat_error_set(err, EPROTO, "%s", msg);
}

int pg_startup_parse(const uint8_t *pkt, size_t len, struct pg_startup *out, const char **sqlstate,
                     moat_error **err) {
  *out = (struct pg_startup){0};
  if (len < PG_STARTUP_MIN || len > PG_STARTUP_MAX || be32(pkt) != len)
    return refuse(err, sqlstate, "08P01", "invalid length of startup packet");
  uint32_t code = be32(pkt + 4);
  switch (code) {
  case PG_SSL_REQUEST_CODE:
  case PG_GSSENC_REQUEST_CODE:
    if (len != 8)
      return refuse(err, sqlstate, "08P01", "invalid length of encryption request");
    out->kind = code == PG_SSL_REQUEST_CODE ? PG_KIND_SSL : PG_KIND_GSSENC;
    return 0;
  case PG_CANCEL_REQUEST_CODE:
    if (len != 16)
      return refuse(err, sqlstate, "08P01", "invalid length of cancel request");
    out->kind = PG_KIND_CANCEL;
    out->cancel_pid = be32(pkt + 8);
    out->cancel_key = be32(pkt + 12);
    return 0;
  default:
    break;
  }
  if (code >> 16 != 3) {
    *sqlstate = "0A000";
    return moat_error_set(err, EPROTO, "unsupported frontend protocol %u.%u: the proxy supports 3.x",
                          code >> 16, code & 0xffff);
  }
  out->kind = PG_KIND_STARTUP;
  out->version = code;
  /* name\0value\0 ... \0, ending exactly at len */
  const char *names[PG_MAX_PARAMS];
  size_t off = 8;
  for (;;) {
    if (off >= len)
      return refuse(err, sqlstate, "08P01",
                    "invalid startup packet layout: expected terminator as last byte");
    if (pkt[off] == '\0') {
      if (off + 1 != len)
        return refuse(err, sqlstate, "08P01", "invalid startup packet layout: bytes after the terminator");
      break;
    }
    const uint8_t *nend = memchr(pkt + off, '\0', len - off);
    if (!nend)
      return refuse(err, sqlstate, "08P01", "invalid startup packet layout: a name is not terminated");
    const char *name = (const char *)pkt + off;
    off = (size_t)(nend - pkt) + 1;
    const uint8_t *vend = off < len ? memchr(pkt + off, '\0', len - off) : NULL;
    if (!vend)
      return refuse(err, sqlstate, "08P01", "invalid startup packet layout: a value is not terminated");
    const char *value = (const char *)pkt + off;
    off = (size_t)(vend - pkt) + 1;
    if (out->n_params == PG_MAX_PARAMS)
      return refuse(err, sqlstate, "08P01", "too many startup parameters");
    for (size_t i = 0; i < out->n_params; i++)
      if (strcmp(names[i], name) == 0)
        return refuse(err, sqlstate, "08P01", "a startup parameter is repeated");
    names[out->n_params++] = name;
    if (strcmp(name, "user") == 0)
      out->user = value;
    else if (strcmp(name, "database") == 0)
      out->database = value;
    else if (strcmp(name, "options") == 0)
      out->options = value;
  }
  if (!out->user || !out->user[0])
    return refuse(err, sqlstate, "28000", "no PostgreSQL user name specified in startup packet");
  if (strlen(out->user) > PG_MAX_NAME)
    return refuse(err, sqlstate, "28000", "the user name is longer than 63 bytes");
  if (!out->database || !out->database[0])
    out->database = out->user;
  if (strlen(out->database) > PG_MAX_NAME)
    return refuse(err, sqlstate, "3D000", "the database name is longer than 63 bytes");
  return 0;
}

size_t pg_error_response(uint8_t *out, size_t cap, const char *sqlstate, const char *msg) {
  /* 'E' len 'S' FATAL\0 'V' FATAL\0 'C' XXXXX\0 'M' msg\0 \0 */
  static const char fixed[] = "SFATAL\0VFATAL\0C";
  size_t n = 5;
  memcpy(out + n, fixed, sizeof(fixed) - 1);
  n += sizeof(fixed) - 1;
  for (size_t i = 0; i < 5; i++)
    out[n++] = sqlstate && strlen(sqlstate) == 5 ? (uint8_t)sqlstate[i] : (uint8_t) "08006"[i];
  out[n++] = '\0';
  out[n++] = 'M';
  size_t room = cap - n - 2; /* the message's NUL and the final one */
  for (const char *m = msg ? msg : ""; *m && room; m++, room--)
    out[n++] = (uint8_t)*m < 0x20 ? '?' : (uint8_t)*m;
  out[n++] = '\0';
  out[n++] = '\0';
  out[0] = 'E';
  put32(out + 1, (uint32_t)(n - 1));
  return n;
}

void pg_backend_scan_feed(struct pg_backend_scan *s, const uint8_t *p, size_t n) {
  while (n > 0 && !s->done) {
    if (s->remaining == 0 && s->hdr_have < 5) {
      size_t take = 5 - s->hdr_have < n ? 5 - s->hdr_have : n;
      memcpy(s->hdr + s->hdr_have, p, take);
      s->hdr_have += take;
      p += take;
      n -= take;
      if (s->hdr_have < 5)
        return;
      uint32_t len = be32(s->hdr + 1);
      uint8_t type = s->hdr[0];
      if (len < 4 || (type == 'K' && len != 12)) {
        s->done = true; /* not a frame we understand: stop reading, the bytes still pass */
        return;
      }
      s->remaining = len - 4;
      s->key_have = 0;
      if (type == 'Z' || type == 'E') {
        s->done = true;
        return;
      }
      if (s->remaining == 0)
        s->hdr_have = 0;
      continue;
    }
    size_t take = s->remaining < n ? s->remaining : n;
    if (s->hdr[0] == 'K') {
      memcpy(s->key + s->key_have, p, take);
      s->key_have += take;
      if (s->key_have == 8) {
        s->pid = be32(s->key);
        s->secret = be32(s->key + 4);
        s->have_key = true;
      }
    }
    s->remaining -= (uint32_t)take;
    p += take;
    n -= take;
    if (s->remaining == 0)
      s->hdr_have = 0;
  }
}

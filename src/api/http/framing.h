/* framing.h -- judges the framing of a stream of HTTP/1.x requests on the bytes as they arrive
 *
 * The gate (gate.c) feeds this parser every byte libmicrohttpd reads from a client, so that what
 * libmicrohttpd would otherwise accept or misread is refused with a JSON 400 first:
 *   - a head with both Content-Length and Transfer-Encoding, with Content-Lengths that differ or
 *     are not decimal numbers below 2^63, with a Transfer-Encoding other than exactly "chunked"
 *     (once), or with Transfer-Encoding in an HTTP/1.0 request (RFC 9112 6.1, 6.3);
 *   - a head with obsolete line folding, whitespace between a field name and its colon, a field
 *     line without a colon, or a NUL byte (RFC 9112 5.1, 5.2);
 *   - a chunked body whose chunk size is not hexadecimal, is 2^63 or more, or whose line is longer
 *     than API_FR_MAX_CHUNK_LINE, or whose chunk data is not followed by a line end.
 * Line ends are LF or CRLF and empty lines before a request line are skipped, as libmicrohttpd
 * 0.9.75 does, so both agree on where each request starts and ends. Pure: no I/O, no allocation.
 */
#ifndef MOAT_API_FRAMING_H
#define MOAT_API_FRAMING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define API_FR_MAX_CHUNK_LINE 4096             /* a chunk-size line with its extensions */
#define API_FR_MAX_CHUNK ((uint64_t)INT64_MAX) /* the largest chunk size accepted */

enum api_fr_result {
  API_FR_OK = 0,   /* go on */
  API_FR_BAD_HEAD, /* the head that ended in this call is bad (bad_head, bad_at, why) */
  API_FR_BAD_BODY, /* the body being received is malformed: why says how */
};

struct api_framing {
  int st;            /* where in the stream the parser is (framing.c) */
  uint64_t heads;    /* request heads completed so far */
  bool in_head;      /* bytes of a head that is not complete yet have arrived */
  uint64_t bad_head; /* the number (1 = the first) of the head judged bad, 0 while none; parsing stops */
  size_t bad_at;     /* API_FR_BAD_HEAD: bytes of that call before the line end that completed the head */
  bool opaque;       /* parsing stopped: after a bad head, a bad body, or the body of an Upgrade request */
  char why[192];     /* what is wrong with bad_head or the body */
  /* the head being received */
  bool http10, fold, name_ws, no_colon, nul, upgrade;
  unsigned cl_count, te_count;
  bool cl_bad, cl_conflict, te_bad;
  uint64_t cl;
  char te_seen[40]; /* a Transfer-Encoding value that is not "chunked", for the message */
  /* the line being received */
  size_t pos;    /* bytes of the line so far */
  bool colon;    /* the line's colon was seen */
  int field;     /* the field the line names (framing.c) */
  char name[24]; /* the field name, lowercased, while it is short */
  size_t name_len;
  char val[64]; /* the value of a field of interest */
  size_t val_len;
  bool val_long;
  char tail[12]; /* the last bytes of the request line (its version) */
  /* bodies */
  uint64_t remaining; /* Content-Length or chunk bytes still to come */
  uint64_t chunk;     /* chunk size being read */
  unsigned chunk_digits;
};

void api_framing_init(struct api_framing *f);

/* Feeds len bytes of the request stream. Returns API_FR_OK; API_FR_BAD_HEAD when a head completed
 * in these bytes is bad (its number in bad_head; the bytes before its last line end in bad_at, so
 * that a server handed only those never sees the head complete); or API_FR_BAD_BODY. why says what
 * is wrong; the parser is opaque from then on: further bytes are not looked at (API_FR_OK). */
enum api_fr_result api_framing_feed(struct api_framing *f, const char *buf, size_t len);

#endif

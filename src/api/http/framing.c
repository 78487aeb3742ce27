/* framing.c -- judges the framing of a stream of HTTP/1.x requests on the bytes as they arrive */
#include "framing.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

enum {
  S_START,      /* between requests: empty lines are skipped */
  S_REQLINE,    /* the request line */
  S_HEADERS,    /* field lines, up to the empty line */
  S_BODY,       /* Content-Length bytes */
  S_CHUNK_SIZE, /* hex digits of a chunk size */
  S_CHUNK_EXT,  /* ";..." after them, up to the line end */
  S_CHUNK_SIZE_CR,
  S_CHUNK_DATA,
  S_CHUNK_DATA_END, /* the line end after a chunk's data */
  S_CHUNK_DATA_CR,
  S_TRAILER, /* trailer lines after the last chunk, up to an empty line */
  S_OPAQUE,
};

enum { F_NONE, F_CL, F_TE, F_UPGRADE };

void api_framing_init(struct api_framing *f) {
  memset(f, 0, sizeof(*f));
  f->st = S_START;
}

static void head_reset(struct api_framing *f) {
  f->http10 = f->fold = f->name_ws = f->no_colon = f->nul = f->upgrade = false;
  f->cl_count = f->te_count = 0;
  f->cl_bad = f->cl_conflict = f->te_bad = false;
  f->cl = 0;
  f->te_seen[0] = '\0';
}

static void line_reset(struct api_framing *f) {
  f->pos = 0;
  f->colon = false;
  f->field = F_NONE;
  f->name_len = 0;
  f->val_len = 0;
  f->val_long = false;
}

static enum api_fr_result bad_body(struct api_framing *f, const char *why) {
  snprintf(f->why, sizeof(f->why), "%s", why);
  f->opaque = true;
  f->st = S_OPAQUE;
  return API_FR_BAD_BODY;
}

/* A field line is complete (without its line end): take what it says about the framing. */
static void field_done(struct api_framing *f, bool last_cr) {
  if (!f->colon) {
    f->no_colon = true;
    return;
  }
  size_t n = f->val_len;
  if (last_cr && n > 0 && f->val[n - 1] == '\r' && !f->val_long)
    n--;
  switch (f->field) {
  case F_CL: {
    uint64_t v = 0;
    bool ok = n > 0 && !f->val_long;
    for (size_t i = 0; ok && i < n; i++) {
      char c = f->val[i];
      if (c < '0' || c > '9' || v > ((uint64_t)INT64_MAX - (uint64_t)(c - '0')) / 10)
        ok = false;
      else
        v = v * 10 + (uint64_t)(c - '0');
    }
    if (!ok)
      f->cl_bad = true;
    else if (f->cl_count > 0 && v != f->cl)
      f->cl_conflict = true;
    f->cl = v;
    f->cl_count++;
    break;
  }
  case F_TE:
    f->te_count++;
    if (f->val_long || n != 7 || strncasecmp(f->val, "chunked", 7) != 0) {
      f->te_bad = true;
      if (!f->te_seen[0])
        snprintf(f->te_seen, sizeof(f->te_seen), "%.*s%s", (int)(n < 32 ? n : 32), f->val,
                 n > 32 || f->val_long ? "..." : "");
    }
    break;
  case F_UPGRADE:
    f->upgrade = true;
    break;
  }
}

static const char *head_fault(const struct api_framing *f, char *buf, size_t size) {
  if (f->nul)
    return "the request head contains a NUL byte";
  if (f->fold)
    return "a header line starts with a space or tab (obsolete line folding is not accepted)";
  if (f->no_colon)
    return "a header line has no colon";
  if (f->name_ws)
    return "a header field name contains whitespace (none is allowed before the colon)";
  if (f->te_count > 0 && f->cl_count > 0)
    return "the request has both Content-Length and Transfer-Encoding";
  if (f->te_count > 0 && f->http10)
    return "Transfer-Encoding is not allowed in an HTTP/1.0 request";
  if (f->te_count > 1)
    return "Transfer-Encoding is given more than once";
  if (f->te_bad) {
    snprintf(buf, size, "Transfer-Encoding must be \"chunked\", not \"%s\"", f->te_seen);
    return buf;
  }
  if (f->cl_bad)
    return "Content-Length must be a decimal number below 2^63";
  if (f->cl_conflict)
    return "the request has Content-Length values that differ";
  return NULL;
}

/* The empty line that ends a head has arrived: judge the head and pick the body's framing. */
static void head_done(struct api_framing *f) {
  f->heads++;
  f->in_head = false;
  char buf[96];
  const char *fault = head_fault(f, buf, sizeof(buf));
  if (fault) {
    snprintf(f->why, sizeof(f->why), "%s", fault);
    f->bad_head = f->heads;
    f->opaque = true;
    f->st = S_OPAQUE;
    return;
  }
  if (f->te_count > 0) {
    f->chunk = 0;
    f->chunk_digits = 0;
    f->pos = 0;
    f->st = S_CHUNK_SIZE;
  } else if (f->cl > 0) {
    f->remaining = f->cl;
    f->st = S_BODY;
  } else {
    f->st = S_START;
  }
  if (f->st == S_START && f->upgrade) {
    f->opaque = true;
    f->st = S_OPAQUE;
  }
}

/* The body of the current request is complete. */
static void body_done(struct api_framing *f) {
  f->st = f->upgrade ? S_OPAQUE : S_START;
  f->opaque = f->upgrade;
}

static int hexval(char c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

enum api_fr_result api_framing_feed(struct api_framing *f, const char *buf, size_t len) {
  size_t i = 0;
  /* last_cr: the previous byte of the current line was a CR (kept across calls in tail/val) */
  while (i < len) {
    char c = buf[i];
    switch (f->st) {
    case S_OPAQUE:
      return API_FR_OK;
    case S_START:
      f->in_head = true;
      if (c == '\n') { /* an empty line before a request line is skipped */
        i++;
        break;
      }
      head_reset(f);
      line_reset(f);
      memset(f->tail, 0, sizeof(f->tail));
      f->st = S_REQLINE;
      break; /* the byte is read again as the first of the request line */
    case S_REQLINE:
      i++;
      if (c == '\n') {
        bool cr = f->tail[sizeof(f->tail) - 1] == '\r';
        size_t n = f->pos - (cr ? 1 : 0);
        if (n == 0) { /* it was an empty line ("\r\n") */
          f->st = S_START;
          break;
        }
        const char *t = f->tail + sizeof(f->tail) - (cr ? 9 : 8);
        f->http10 = memcmp(t, "HTTP/1.0", 8) == 0;
        line_reset(f);
        f->st = S_HEADERS;
        break;
      }
      if (c == '\0')
        f->nul = true;
      memmove(f->tail, f->tail + 1, sizeof(f->tail) - 1);
      f->tail[sizeof(f->tail) - 1] = c;
      f->pos++;
      break;
    case S_HEADERS:
      i++;
      if (c == '\n') {
        bool cr = f->pos > 0 && f->tail[0] == '\r';
        if (f->pos - (cr ? 1 : 0) == 0) {
          head_done(f);
          if (f->bad_head) {
            f->bad_at = i - 1;
            return API_FR_BAD_HEAD;
          }
        } else {
          field_done(f, cr);
          line_reset(f);
        }
        f->tail[0] = 0;
        break;
      }
      if (c == '\0')
        f->nul = true;
      if (f->pos == 0 && (c == ' ' || c == '\t')) {
        f->fold = true;
      } else if (!f->colon) {
        if (c == ':') {
          f->colon = true;
          if (f->name_len == 14 && memcmp(f->name, "content-length", 14) == 0)
            f->field = F_CL;
          else if (f->name_len == 17 && memcmp(f->name, "transfer-encoding", 17) == 0)
            f->field = F_TE;
          else if (f->name_len == 7 && memcmp(f->name, "upgrade", 7) == 0)
            f->field = F_UPGRADE;
        } else if (c == ' ' || c == '\t') {
          f->name_ws = true;
        } else if (f->name_len < sizeof(f->name)) {
          f->name[f->name_len] = (char)(c >= 'A' && c <= 'Z' ? c + 32 : c);
          f->name_len++;
        } else {
          f->name_len = sizeof(f->name) + 1; /* too long to be a field of interest */
        }
      } else if (f->field != F_NONE) {
        if (f->val_len == 0 && (c == ' ' || c == '\t')) {
          /* leading whitespace of the value */
        } else if (f->val_len < sizeof(f->val)) {
          f->val[f->val_len++] = c;
        } else {
          f->val_long = true;
        }
      }
      f->tail[0] = c; /* the last byte of the line, for a CR before the LF */
      f->pos++;
      break;
    case S_BODY: {
      size_t n = len - i;
      if (n > f->remaining)
        n = (size_t)f->remaining;
      f->remaining -= n;
      i += n;
      if (f->remaining == 0)
        body_done(f);
      break;
    }
    case S_CHUNK_SIZE: {
      i++;
      if (++f->pos > API_FR_MAX_CHUNK_LINE)
        return bad_body(f, "a chunk-size line is longer than 4096 bytes");
      int d = hexval(c);
      if (d >= 0) {
        if (f->chunk > (API_FR_MAX_CHUNK - (uint64_t)d) / 16)
          return bad_body(f, "a chunk size is 2^63 bytes or more");
        f->chunk = f->chunk * 16 + (uint64_t)d;
        f->chunk_digits++;
        break;
      }
      if (f->chunk_digits == 0 || (c != ';' && c != '\r' && c != '\n'))
        return bad_body(f, "a chunk size is not a hexadecimal number");
      if (c == ';') {
        f->st = S_CHUNK_EXT;
        break;
      }
      if (c == '\r') {
        f->st = S_CHUNK_SIZE_CR;
        break;
      }
      goto size_line_done;
    }
    case S_CHUNK_EXT:
      i++;
      if (++f->pos > API_FR_MAX_CHUNK_LINE)
        return bad_body(f, "a chunk-size line is longer than 4096 bytes");
      if (c == '\n')
        goto size_line_done;
      break;
    case S_CHUNK_SIZE_CR:
      i++;
      if (c != '\n')
        return bad_body(f, "a chunk size is not a hexadecimal number");
    size_line_done:
      if (f->chunk == 0) {
        f->pos = 0;
        f->tail[0] = 0;
        f->st = S_TRAILER;
      } else {
        f->remaining = f->chunk;
        f->st = S_CHUNK_DATA;
      }
      break;
    case S_CHUNK_DATA: {
      size_t n = len - i;
      if (n > f->remaining)
        n = (size_t)f->remaining;
      f->remaining -= n;
      i += n;
      if (f->remaining == 0)
        f->st = S_CHUNK_DATA_END;
      break;
    }
    case S_CHUNK_DATA_END:
    case S_CHUNK_DATA_CR:
      i++;
      if (c == '\r' && f->st == S_CHUNK_DATA_END) {
        f->st = S_CHUNK_DATA_CR;
        break;
      }
      if (c != '\n')
        return bad_body(f, "chunk data is longer than its chunk size (no line end after it)");
      f->chunk = 0;
      f->chunk_digits = 0;
      f->pos = 0;
      f->st = S_CHUNK_SIZE;
      break;
    case S_TRAILER:
      i++;
      if (c == '\n') {
        bool cr = f->pos > 0 && f->tail[0] == '\r';
        if (f->pos - (cr ? 1 : 0) == 0)
          body_done(f);
        f->pos = 0;
        f->tail[0] = 0;
        break;
      }
      f->tail[0] = c;
      f->pos++;
      break;
    }
  }
  return API_FR_OK;
}

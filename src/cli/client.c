/* client.c -- the moat CLI's HTTP client (libcurl), argument parsing and error reporting */
#include <curl/curl.h>
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../common/util.h"
#include "cli.h"

volatile sig_atomic_t cli_interrupted;

static char *api_url;
static char *api_key;

/* ---- errors and arguments ---- */

void cli_errorf(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("moat: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

int cli_usage_error(const char *usage, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  if (msg[0]) /* empty when the parser already said what was wrong */
    fprintf(stderr, "moat: %s\n", msg);
  if (usage)
    fprintf(stderr, "usage: %s", usage);
  return EXIT_USAGE;
}

int cli_parse(int argc, char **argv, const struct cli_opt *opts, int max_pos, bool rest_ok,
              int (*on_opt)(int id, const char *value, void *ctx), void *ctx, struct cli_args *a) {
  a->pos = xcalloc((size_t)argc + 1, sizeof(char *));
  a->rest = xcalloc((size_t)argc + 1, sizeof(char *));
  a->npos = a->nrest = 0;
  int i = 1; /* argv[0] is the command's name */
  for (; i < argc; i++) {
    char *arg = argv[i];
    if (strcmp(arg, "--") == 0) {
      i++;
      break;
    }
    if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0)
      return 1;
    if (arg[0] == '-' && arg[1] != '\0') {
      /* "-x" is the option named "x" when the command has one (no bundling, value in the next word) */
      bool one_letter = arg[1] != '-' && arg[2] == '\0';
      if (arg[1] != '-' && !one_letter) {
        cli_errorf("unknown option '%s'", arg);
        return -1;
      }
      const char *name = arg + (one_letter ? 1 : 2);
      const char *eq = strchr(name, '=');
      size_t nlen = eq ? (size_t)(eq - name) : strlen(name);
      const struct cli_opt *o = NULL;
      for (const struct cli_opt *p = opts; p && p->name; p++)
        if (strlen(p->name) == nlen && strncmp(p->name, name, nlen) == 0) {
          o = p; /* the first match wins */
          break;
        }
      if (!o) {
        cli_errorf("unknown option '%s%.*s'", one_letter ? "-" : "--", (int)nlen, name);
        return -1;
      }
      const char *value = NULL;
      if (o->has_arg) {
        if (eq) {
          value = eq + 1;
        } else if (i + 1 < argc) {
          value = argv[++i];
        } else {
          cli_errorf("option '--%s' needs a value", o->name);
          return -1;
        }
      } else if (eq) {
        cli_errorf("option '--%s' takes no value", o->name);
        return -1;
      }
      if (on_opt(o->id, value, ctx) < 0)
        return -1;
      continue;
    }
    if (a->npos < max_pos || max_pos < 0) {
      a->pos[a->npos++] = arg;
      continue;
    }
    if (!rest_ok) {
      cli_errorf("unexpected argument '%s'", arg);
      return -1;
    }
    break; /* the trailing argv starts here */
  }
  for (; i < argc; i++) {
    if (!rest_ok) {
      cli_errorf("unexpected argument '%s'", argv[i]);
      return -1;
    }
    a->rest[a->nrest++] = argv[i];
  }
  return 0;
}

int cli_kv_set(json_t *obj, const char *kv, const char *what) {
  const char *eq = strchr(kv, '=');
  if (!eq || eq == kv) {
    cli_errorf("%s '%s' is not KEY=VALUE", what, kv);
    return -1;
  }
  _cleanup_free_ char *key = xstrndup(kv, (size_t)(eq - kv));
  json_object_set_new(obj, key, json_string(eq + 1));
  return 0;
}

int cli_parse_ll(const char *s, const char *what, long long *out) {
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno || end == s || *end) {
    cli_errorf("%s '%s' is not an integer", what, s);
    return -1;
  }
  *out = v;
  return 0;
}

int cli_parse_double(const char *s, const char *what, double *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || *end) {
    cli_errorf("%s '%s' is not a number", what, s);
    return -1;
  }
  *out = v;
  return 0;
}

/* ---- signals ---- */

static void on_signal(int sig) { cli_interrupted = sig; }

void cli_trap_signals(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGHUP, &sa, NULL);
}

/* ---- client ---- */

static char *read_key_file(const char *path) {
  FILE *f = fopen(path, "re");
  if (!f)
    return NULL;
  char buf[512];
  char *r = NULL;
  if (fgets(buf, sizeof(buf), f)) {
    buf[strcspn(buf, "\r\n")] = '\0';
    if (buf[0])
      r = xstrdup(buf);
  }
  fclose(f);
  return r;
}

void cli_client_init(void) {
  curl_global_init(CURL_GLOBAL_DEFAULT);
  const char *url = getenv("MOAT_API_URL");
  api_url = xstrdup(url && *url ? url : "http://127.0.0.1:7070");
  size_t l = strlen(api_url);
  while (l > 0 && api_url[l - 1] == '/')
    api_url[--l] = '\0';
  const char *key = getenv("MOAT_API_KEY");
  if (key && *key)
    api_key = xstrdup(key);
  else
    api_key = read_key_file(".moat/api-key");
}

void cli_client_cleanup(void) {
  free(api_url);
  free(api_key);
  api_url = api_key = NULL;
  curl_global_cleanup();
}

char *cli_escape(const char *s) {
  char *e = curl_easy_escape(NULL, s, 0);
  if (!e)
    abort();
  char *r = xstrdup(e);
  curl_free(e);
  return r;
}

struct membuf {
  char *data;
  size_t len, cap;
};

static void membuf_add(struct membuf *m, const void *p, size_t n) {
  if (m->len + n + 1 > m->cap) {
    m->cap = (m->len + n + 1) * 2;
    m->data = xrealloc(m->data, m->cap);
  }
  memcpy(m->data + m->len, p, n);
  m->len += n;
  m->data[m->len] = '\0';
}

/* Server-sent events: the parser's state across chunks of a 2xx text/event-stream body. */
struct sse {
  cli_sse_fn fn;
  void *ctx;
  struct membuf line; /* the line being read */
  struct membuf data; /* the event's data lines, joined by '\n' */
  char event[64];     /* the event's name ("" = "message") */
  bool has_data;
  int stopped; /* the callback's non-zero answer, which ended the transfer */
};

/* What one transfer writes to: memory (JSON, errors), a stream or an SSE parser once the status is 2xx. */
struct sink {
  CURL *curl;
  struct membuf mem;
  FILE *out; /* NULL: everything to mem */
  struct sse *sse;
  bool out_failed;
};

/* Handles one complete line (without its end of line) of an event stream; returns the callback's
 * answer when an event was dispatched, else 0. */
static int sse_line(struct sse *e, char *line, size_t len) {
  if (len == 0) {
    int r = 0;
    if (e->has_data)
      r = e->fn(e->event[0] ? e->event : "message", e->data.data ? e->data.data : "", e->data.len, e->ctx);
    e->event[0] = '\0';
    e->data.len = 0;
    e->has_data = false;
    return r;
  }
  if (line[0] == ':')
    return 0; /* a comment (keep-alive) */
  char *colon = memchr(line, ':', len);
  size_t flen = colon ? (size_t)(colon - line) : len;
  char *val = colon ? colon + 1 : line + len;
  if (colon && *val == ' ')
    val++;
  size_t vlen = (size_t)(line + len - val);
  if (flen == 5 && memcmp(line, "event", 5) == 0) {
    size_t n = vlen < sizeof(e->event) - 1 ? vlen : sizeof(e->event) - 1;
    memcpy(e->event, val, n);
    e->event[n] = '\0';
  } else if (flen == 4 && memcmp(line, "data", 4) == 0) {
    if (e->has_data)
      membuf_add(&e->data, "\n", 1);
    membuf_add(&e->data, val, vlen);
    e->has_data = true;
  }
  return 0;
}

/* Feeds a chunk of the body to the parser; returns non-zero when the callback asked to stop. */
static int sse_feed(struct sse *e, const char *p, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (p[i] != '\n') {
      const char *nl = memchr(p + i, '\n', n - i);
      size_t run = nl ? (size_t)(nl - (p + i)) : n - i;
      membuf_add(&e->line, p + i, run);
      i += run - 1;
      continue;
    }
    size_t l = e->line.len;
    if (l && e->line.data[l - 1] == '\r')
      l--;
    int r = sse_line(e, l ? e->line.data : (char *)"", l);
    e->line.len = 0;
    if (r)
      return e->stopped = r;
  }
  return 0;
}

static size_t on_write(char *p, size_t size, size_t n, void *ud) {
  struct sink *s = ud;
  size_t len = size * n;
  if (s->sse) {
    long code = 0;
    curl_easy_getinfo(s->curl, CURLINFO_RESPONSE_CODE, &code);
    if (code >= 200 && code < 300)
      return sse_feed(s->sse, p, len) ? 0 : len;
  }
  if (s->out) {
    long code = 0;
    curl_easy_getinfo(s->curl, CURLINFO_RESPONSE_CODE, &code);
    if (code >= 200 && code < 300) {
      if (fwrite(p, 1, len, s->out) != len) {
        s->out_failed = true;
        return 0; /* aborts the transfer */
      }
      return len;
    }
  }
  if (s->mem.len < (64u << 20)) /* an error body or JSON answer; bounded so a bad server cannot eat memory */
    membuf_add(&s->mem, p, len);
  return len;
}

static int on_progress(void *ud, curl_off_t dlt, curl_off_t dln, curl_off_t ult, curl_off_t uln) {
  (void)ud, (void)dlt, (void)dln, (void)ult, (void)uln;
  return cli_interrupted ? 1 : 0;
}

struct upload {
  FILE *in;
  const char *content_type; /* NULL: application/octet-stream */
  bool failed;
};

static size_t on_read(char *p, size_t size, size_t n, void *ud) {
  struct upload *u = ud;
  size_t r = fread(p, 1, size * n, u->in);
  if (r == 0 && ferror(u->in)) {
    u->failed = true;
    return CURL_READFUNC_ABORT;
  }
  return r;
}

/* The sandbox id a request path names (/v1/sandboxes/ID...) into id, or false. */
static bool path_sandbox(const char *path, char *id, size_t len) {
  static const char prefix[] = "/v1/sandboxes/";
  if (strncmp(path, prefix, sizeof(prefix) - 1) != 0)
    return false;
  const char *s = path + sizeof(prefix) - 1;
  size_t n = strcspn(s, "/?");
  if (n == 0 || n >= len)
    return false;
  memcpy(id, s, n);
  id[n] = '\0';
  return true;
}

/* Prints the error an unsuccessful answer to a request of path carries; a sandbox the path names
 * that does not exist (or whose id is malformed) is "sandbox ID not found". */
static void report_http_error(long status, const char *path, const struct membuf *m) {
  json_error_t jerr;
  json_t *j = m->len ? json_loadb(m->data, m->len, 0, &jerr) : NULL;
  const char *code = j ? json_string_value(json_object_get(j, "code")) : NULL;
  const char *msg = j ? json_string_value(json_object_get(j, "message")) : NULL;
  char id[128];
  if (status == 404 && code && strcmp(code, "not_found") == 0 && msg && path_sandbox(path, id, sizeof(id)) &&
      (strncmp(msg, "no sandbox ", 11) == 0 || strncmp(msg, "no such resource", 16) == 0)) {
    cli_errorf("sandbox %s not found", id);
  } else if (msg || code) {
    cli_errorf("%s (%s)", msg ? msg : "error", code ? code : "unknown");
  } else {
    size_t l = m->len ? strcspn(m->data, "\r\n") : 0;
    if (l > 200)
      l = 200;
    cli_errorf("HTTP %ld%s%.*s", status, l ? ": " : "", (int)l, m->len ? m->data : "");
  }
  json_decref(j);
}

/* Performs one request. body_json (may be NULL) or upload (may be NULL) is the body; out (may be
 * NULL) receives a 2xx body. Returns 0 on 2xx with resp filled, else prints and returns -1. */
static int perform(const char *method, const char *path, const char *body_json, struct upload *up,
                   long long up_size, FILE *out, struct sse *sse, struct cli_resp *resp) {
  if (resp) {
    resp->status = 0;
    resp->json = NULL;
  }
  CURL *c = curl_easy_init();
  if (!c) {
    cli_errorf("cannot initialise libcurl");
    return -1;
  }
  _cleanup_free_ char *url = xasprintf("%s%s", api_url, path);
  struct curl_slist *hdrs = NULL;
  if (api_key) {
    _cleanup_free_ char *auth = xasprintf("Authorization: Bearer %s", api_key);
    hdrs = curl_slist_append(hdrs, auth);
  }
  hdrs = curl_slist_append(hdrs, "Expect:"); /* no 100-continue round trip before uploads */
  struct sink sink = {.curl = c, .out = out, .sse = sse};
  curl_easy_setopt(c, CURLOPT_URL, url);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, 10000L); /* the only timeout: creates may build templates */
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_write);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &sink);
  curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress);
  if (up) {
    _cleanup_free_ char *ctype =
        xasprintf("Content-Type: %s", up->content_type ? up->content_type : "application/octet-stream");
    hdrs = curl_slist_append(hdrs, ctype);
    curl_easy_setopt(c, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(c, CURLOPT_READFUNCTION, on_read);
    curl_easy_setopt(c, CURLOPT_READDATA, up);
    if (up_size >= 0)
      curl_easy_setopt(c, CURLOPT_INFILESIZE_LARGE, (curl_off_t)up_size);
    else
      hdrs = curl_slist_append(hdrs, "Transfer-Encoding: chunked");
  } else if (body_json) {
    hdrs = curl_slist_append(hdrs, "Content-Type: application/json");
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body_json);
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(body_json));
  } else if (strcmp(method, "GET") != 0 && strcmp(method, "DELETE") != 0) {
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, ""); /* an explicit empty body: Content-Length: 0 */
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)0);
  }
  if (!up || strcmp(method, "PUT") != 0)
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdrs);

  CURLcode rc = curl_easy_perform(c);
  long status = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
  curl_slist_free_all(hdrs);
  curl_easy_cleanup(c);
  int ret = -1;
  if (rc != CURLE_OK && sse && sse->stopped > 0) {
    ret = 0; /* the callback ended the stream */
  } else if (rc != CURLE_OK && sse && sse->stopped < 0) {
    ret = -1; /* the callback printed why */
  } else if (rc != CURLE_OK) {
    if (cli_interrupted)
      cli_errorf("interrupted");
    else if (sink.out_failed)
      cli_errorf("write: %s", strerror(errno));
    else if (up && up->failed)
      cli_errorf("read: %s", strerror(errno));
    else if (rc == CURLE_COULDNT_CONNECT)
      cli_errorf("cannot reach moatd at %s (is it running? `make run` starts it)", api_url);
    else
      cli_errorf("%s %s: %s", method, url, curl_easy_strerror(rc));
  } else if (status < 200 || status >= 300) {
    report_http_error(status, path, &sink.mem);
  } else {
    ret = 0;
    if (resp) {
      resp->status = status;
      if (sink.mem.len) {
        json_error_t jerr;
        resp->json = json_loadb(sink.mem.data, sink.mem.len, JSON_ALLOW_NUL, &jerr);
        if (!resp->json) {
          cli_errorf("%s %s: the answer is not JSON: %s", method, path, jerr.text);
          ret = -1;
        }
      }
    }
  }
  if (resp && ret < 0)
    resp->status = status;
  free(sink.mem.data);
  return ret;
}

int cli_request(const char *method, const char *path, json_t *body, struct cli_resp *resp) {
  _cleanup_free_ char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
  if (body && !text) {
    cli_errorf("cannot encode the request");
    return -1;
  }
  return perform(method, path, text, NULL, -1, NULL, NULL, resp);
}

int cli_sse(const char *method, const char *path, json_t *body, cli_sse_fn fn, void *ctx) {
  _cleanup_free_ char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
  struct sse e = {.fn = fn, .ctx = ctx};
  int r = perform(method, path, text, NULL, -1, NULL, &e, NULL);
  free(e.line.data);
  free(e.data.data);
  if (r == 0 && e.stopped == 0)
    return 1; /* the server ended the stream without the event the caller waited for */
  return r;
}

const char *cli_api_url(void) { return api_url; }
const char *cli_api_key(void) { return api_key; }

int cli_upload(const char *path, FILE *in, long long size, struct cli_resp *resp) {
  return cli_upload_as("PUT", path, NULL, in, size, resp);
}

int cli_upload_as(const char *method, const char *path, const char *content_type, FILE *in, long long size,
                  struct cli_resp *resp) {
  struct upload up = {.in = in, .content_type = content_type};
  return perform(method, path, NULL, &up, size, NULL, NULL, resp);
}

int cli_download(const char *path, FILE *out) {
  return perform("GET", path, NULL, NULL, -1, out, NULL, NULL);
}

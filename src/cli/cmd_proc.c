/* cmd_proc.c -- streamed and background exec, and the processes of a sandbox: moat exec --stream,
 * moat exec --background, moat ps, moat attach, moat kill */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../common/util.h"
#include "cli.h"

/* ---- relaying an event stream ---- */

struct relay {
  int code;      /* the exit code to pass through, once the exit event came; -1 before */
  long long pid; /* from the start or process event */
  char *scratch; /* decoded output of the fast path */
  size_t scratch_cap;
};

/* The exit code a shell would report for an exit event / a process description. */
static int exit_code_of(json_t *j) {
  json_int_t sig = json_integer_value(json_object_get(j, "signal"));
  json_t *ec = json_object_get(j, "exit_code");
  if (json_is_true(json_object_get(j, "timed_out")))
    return 124;
  if (sig > 0)
    return 128 + (int)(sig & 127);
  if (json_is_integer(ec) && json_integer_value(ec) >= 0)
    return (int)(json_integer_value(ec) & 255);
  return -1;
}

/* Writes the bytes of a stdout/stderr event ({data, encoding: utf8|base64}) to fd. */
static int write_event_data(json_t *data, int fd) {
  json_t *dj = json_object_get(data, "data");
  const char *d = json_string_value(dj);
  if (!d) {
    cli_errorf("an output event without data");
    return -1;
  }
  const char *enc = json_string_value(json_object_get(data, "encoding"));
  if (enc && strcmp(enc, "base64") == 0) {
    unsigned char *raw;
    size_t len;
    if (moat_base64_decode(d, json_string_length(dj), &raw, &len) < 0) {
      cli_errorf("an output event's data is not base64");
      return -1;
    }
    int r = write_all(fd, raw, len);
    free(raw);
    return r;
  }
  return write_all(fd, d, json_string_length(dj));
}

static int hexval(char c) {
  return c >= '0' && c <= '9'   ? c - '0'
         : c >= 'a' && c <= 'f' ? c - 'a' + 10
         : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                : -1;
}

/* The fast path for the commonest event, {"data":"...","encoding":"utf8"} exactly (jansson costs more
 * than the rest of a 1 GiB stream): decodes the JSON string into out (at least len bytes). Returns
 * the decoded length, or -1 when the event has another shape (the caller falls back to jansson). */
static ssize_t fast_utf8_data(const char *p, size_t len, char *out) {
  static const char head[] = "{\"data\":\"", tail[] = ",\"encoding\":\"utf8\"}";
  if (len < sizeof(head) - 1 || memcmp(p, head, sizeof(head) - 1) != 0)
    return -1;
  const char *s = p + sizeof(head) - 1, *end = p + len;
  char *o = out;
  while (s < end && *s != '"') {
    const char *q = s;
    while (q < end && *q != '"' && *q != '\\')
      q++;
    memcpy(o, s, (size_t)(q - s));
    o += q - s;
    s = q;
    if (s >= end || *s == '"')
      break;
    if (s + 1 >= end)
      return -1;
    char c = s[1];
    s += 2;
    switch (c) {
    case '"':
    case '\\':
    case '/':
      *o++ = c;
      break;
    case 'b':
      *o++ = '\b';
      break;
    case 'f':
      *o++ = '\f';
      break;
    case 'n':
      *o++ = '\n';
      break;
    case 'r':
      *o++ = '\r';
      break;
    case 't':
      *o++ = '\t';
      break;
    case 'u': {
      if (end - s < 4)
        return -1;
      unsigned cp = 0;
      for (int i = 0; i < 4; i++) {
        int h = hexval(s[i]);
        if (h < 0)
          return -1;
        cp = cp << 4 | (unsigned)h;
      }
      s += 4;
      if (cp >= 0xD800 && cp <= 0xDFFF) {
        if (cp > 0xDBFF || end - s < 6 || s[0] != '\\' || s[1] != 'u')
          return -1;
        unsigned lo = 0;
        for (int i = 2; i < 6; i++) {
          int h = hexval(s[i]);
          if (h < 0)
            return -1;
          lo = lo << 4 | (unsigned)h;
        }
        if (lo < 0xDC00 || lo > 0xDFFF)
          return -1;
        s += 6;
        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
      }
      if (cp < 0x80) {
        *o++ = (char)cp;
      } else if (cp < 0x800) {
        *o++ = (char)(0xC0 | cp >> 6);
        *o++ = (char)(0x80 | (cp & 0x3F));
      } else if (cp < 0x10000) {
        *o++ = (char)(0xE0 | cp >> 12);
        *o++ = (char)(0x80 | ((cp >> 6) & 0x3F));
        *o++ = (char)(0x80 | (cp & 0x3F));
      } else {
        *o++ = (char)(0xF0 | cp >> 18);
        *o++ = (char)(0x80 | ((cp >> 12) & 0x3F));
        *o++ = (char)(0x80 | ((cp >> 6) & 0x3F));
        *o++ = (char)(0x80 | (cp & 0x3F));
      }
      break;
    }
    default:
      return -1;
    }
  }
  if (s >= end || (size_t)(end - s - 1) != sizeof(tail) - 1 || memcmp(s + 1, tail, sizeof(tail) - 1) != 0)
    return -1;
  return o - out;
}

static int on_event_json(const char *event, json_t *data, struct relay *r);

static int on_event(const char *event, const char *raw, size_t len, void *ctx) {
  struct relay *r = ctx;
  bool out = strcmp(event, "stdout") == 0, err = !out && strcmp(event, "stderr") == 0;
  if (out || err) {
    if (len > r->scratch_cap) {
      free(r->scratch);
      r->scratch_cap = len;
      r->scratch = xmalloc(len);
    }
    ssize_t n = fast_utf8_data(raw, len, r->scratch);
    if (n >= 0)
      return write_all(out ? STDOUT_FILENO : STDERR_FILENO, r->scratch, (size_t)n) < 0 ? -1 : 0;
  }
  json_error_t jerr;
  json_t *j = json_loadb(raw, len, 0, &jerr);
  int rc = on_event_json(event, j, r);
  json_decref(j);
  return rc;
}

static int on_event_json(const char *event, json_t *data, struct relay *r) {
  if (strcmp(event, "stdout") == 0 || strcmp(event, "stderr") == 0) {
    if (write_event_data(data, strcmp(event, "stdout") == 0 ? STDOUT_FILENO : STDERR_FILENO) < 0)
      return -1;
    if (json_is_true(json_object_get(data, "dropped")))
      cli_errorf("(some %s was dropped from the replay buffer)", event);
    return 0;
  }
  if (strcmp(event, "start") == 0 || strcmp(event, "process") == 0) {
    r->pid = json_integer_value(json_object_get(data, "pid"));
    return 0;
  }
  if (strcmp(event, "exit") == 0) {
    r->code = exit_code_of(data);
    if (r->code < 0) {
      cli_errorf("the exit event has no exit_code");
      r->code = EXIT_API;
    }
    return 1;
  }
  if (strcmp(event, "dropped") == 0) { /* the replay ring overflowed: its oldest bytes are gone */
    fprintf(stderr, "moat: (%lld bytes of earlier output were dropped from the replay buffer)\n",
            (long long)json_integer_value(json_object_get(data, "bytes")));
    return 0;
  }
  if (strcmp(event, "error") == 0) {
    const char *m = json_string_value(json_object_get(data, "message"));
    const char *c = json_string_value(json_object_get(data, "code"));
    cli_errorf("%s (%s)", m ? m : "stream error", c ? c : "error");
    return -1;
  }
  return 0; /* events this CLI does not know (dropped, keep-alives) */
}

int cli_exec_stream(const char *id, json_t *body) {
  _cleanup_free_ char *eid = cli_escape(id);
  _cleanup_free_ char *path = xasprintf("/v1/sandboxes/%s/exec/stream", eid);
  /* an interrupted CLI ends the command too, as a local one would */
  json_object_set_new(body, "kill_on_disconnect", json_true());
  struct relay r = {.code = -1};
  cli_trap_signals();
  int s = cli_sse("POST", path, body, on_event, &r);
  free(r.scratch);
  if (s < 0)
    return cli_interrupted ? 128 + cli_interrupted : -1;
  if (s == 1) {
    cli_errorf("the stream ended before the command's exit");
    return -1;
  }
  return r.code;
}

int cli_exec_background(const char *id, json_t *body) {
  _cleanup_free_ char *eid = cli_escape(id);
  _cleanup_free_ char *path = xasprintf("/v1/sandboxes/%s/exec", eid);
  json_object_set_new(body, "background", json_true());
  struct cli_resp resp;
  if (cli_request("POST", path, body, &resp) < 0)
    return -1;
  json_t *pid = json_object_get(resp.json, "pid");
  if (!json_is_integer(pid)) {
    json_decref(resp.json);
    cli_errorf("the answer has no pid");
    return -1;
  }
  printf("%lld\n", (long long)json_integer_value(pid));
  json_decref(resp.json);
  return 0;
}

/* ---- ps, attach, kill ---- */

/* Parses "ID PID|TAG" commands' arguments: 0, 1 (help printed) or EXIT_USAGE. */
static int no_opt(int id, const char *value, void *ctx) {
  (void)id, (void)value, (void)ctx;
  return 0;
}

static const char ps_usage[] = "moat ps ID   (the sandbox's processes: background, streamed and pty)\n";

int cmd_ps(int argc, char **argv) {
  static const struct cli_opt opts[] = {{NULL, false, 0}};
  struct cli_args a;
  int r = cli_parse(argc, argv, opts, 1, false, no_opt, NULL, &a);
  _cleanup_free_ char **pos = a.pos;
  _cleanup_free_ char **rest = a.rest;
  if (r == 1) {
    printf("usage: %s", ps_usage);
    return 0;
  }
  if (r < 0 || a.npos != 1)
    return cli_usage_error(ps_usage, "%s", r < 0 ? "" : "ps needs a sandbox id");
  _cleanup_free_ char *eid = cli_escape(pos[0]);
  _cleanup_free_ char *path = xasprintf("/v1/sandboxes/%s/processes", eid);
  struct cli_resp resp;
  if (cli_request("GET", path, NULL, &resp) < 0)
    return EXIT_API;
  json_t *list = json_object_get(resp.json, "processes");
  if (!json_is_array(list)) {
    json_decref(resp.json);
    cli_errorf("the answer has no processes list");
    return EXIT_API;
  }
  printf("%-8s %-16s %-10s %-24s %s\n", "PID", "TAG", "STATE", "STARTED", "CMD");
  size_t i;
  json_t *p;
  json_array_foreach(list, i, p) {
    char state[32];
    if (json_is_true(json_object_get(p, "running")))
      snprintf(state, sizeof(state), "running");
    else if (json_integer_value(json_object_get(p, "signal")) > 0)
      snprintf(state, sizeof(state), "killed:%lld",
               (long long)json_integer_value(json_object_get(p, "signal")));
    else
      snprintf(state, sizeof(state), "exit:%lld",
               (long long)json_integer_value(json_object_get(p, "exit_code")));
    const char *tag = json_string_value(json_object_get(p, "tag"));
    const char *started = json_string_value(json_object_get(p, "started_at"));
    const char *cmd = json_string_value(json_object_get(p, "cmd"));
    _cleanup_free_ char *joined = NULL;
    if (!cmd) { /* argv form */
      json_t *av = json_object_get(p, "argv"), *w;
      size_t k;
      joined = xstrdup("");
      json_array_foreach(av, k, w) {
        char *n = xasprintf("%s%s%s", joined, k ? " " : "", json_string_value(w) ? json_string_value(w) : "");
        free(joined);
        joined = n;
      }
      cmd = joined;
    }
    printf("%-8lld %-16s %-10s %-24s %s%s\n", (long long)json_integer_value(json_object_get(p, "pid")),
           tag && *tag ? tag : "-", state, started ? started : "-", cmd,
           json_is_true(json_object_get(p, "pty")) || json_is_object(json_object_get(p, "pty")) ? "  (pty)"
                                                                                                : "");
  }
  json_decref(resp.json);
  return 0;
}

static const char attach_usage[] =
    "moat attach ID PID|TAG   (replay the process's output since it started, then follow it until it\n"
    "                          exits; its exit code passes through. Ctrl-C detaches and leaves it running)\n";

int cmd_attach(int argc, char **argv) {
  static const struct cli_opt opts[] = {{NULL, false, 0}};
  struct cli_args a;
  int r = cli_parse(argc, argv, opts, 2, false, no_opt, NULL, &a);
  _cleanup_free_ char **pos = a.pos;
  _cleanup_free_ char **rest = a.rest;
  if (r == 1) {
    printf("usage: %s", attach_usage);
    return 0;
  }
  if (r < 0 || a.npos != 2)
    return cli_usage_error(attach_usage, "%s", r < 0 ? "" : "attach needs a sandbox id and a pid or tag");
  _cleanup_free_ char *eid = cli_escape(pos[0]);
  _cleanup_free_ char *eref = cli_escape(pos[1]);
  _cleanup_free_ char *path = xasprintf("/v1/sandboxes/%s/processes/%s/stream?replay=true", eid, eref);
  struct relay rl = {.code = -1};
  cli_trap_signals();
  int s = cli_sse("GET", path, NULL, on_event, &rl);
  free(rl.scratch);
  if (s < 0 && cli_interrupted) {
    fprintf(stderr, "\nmoat: detached; process %s keeps running (moat kill %s %s ends it)\n", pos[1], pos[0],
            pos[1]);
    return 0;
  }
  if (s < 0)
    return EXIT_API;
  if (s == 1) {
    cli_errorf("the stream ended before the process's exit");
    return EXIT_API;
  }
  return rl.code;
}

static const char kill_usage[] =
    "moat kill ID PID|TAG [--signal S]   (S: TERM (default), KILL, INT, HUP, QUIT, "
    "USR1, USR2, STOP, CONT)\n";

static int on_kill_opt(int id, const char *value, void *ctx) {
  *(const char **)ctx = value;
  return 0;
}

int cmd_kill(int argc, char **argv) {
  static const struct cli_opt opts[] = {{"signal", true, 1}, {NULL, false, 0}};
  const char *sig = "TERM";
  struct cli_args a;
  int r = cli_parse(argc, argv, opts, 2, false, on_kill_opt, &sig, &a);
  _cleanup_free_ char **pos = a.pos;
  _cleanup_free_ char **rest = a.rest;
  if (r == 1) {
    printf("usage: %s", kill_usage);
    return 0;
  }
  if (r < 0 || a.npos != 2)
    return cli_usage_error(kill_usage, "%s", r < 0 ? "" : "kill needs a sandbox id and a pid or tag");
  _cleanup_free_ char *eid = cli_escape(pos[0]);
  _cleanup_free_ char *eref = cli_escape(pos[1]);
  _cleanup_free_ char *path = xasprintf("/v1/sandboxes/%s/processes/%s/signal", eid, eref);
  json_t *body = json_pack("{s:s}", "signal", sig);
  struct cli_resp resp;
  r = cli_request("POST", path, body, &resp);
  json_decref(body);
  if (r < 0)
    return EXIT_API;
  json_decref(resp.json);
  return 0;
}

/* cmd_net.c -- moat port, network, events and update: a sandbox's exposed ports, egress
 * policy and connection log, event stream, resource use and lifetime */
#include <stdlib.h>
#include <string.h>

#include "../common/util.h"
#include "cli.h"

int cli_print_json(json_t *j) {
  if (json_dumpf(j, stdout, JSON_INDENT(2)) < 0)
    return -1;
  fputc('\n', stdout);
  return 0;
}

int cli_call_print(const char *method, const char *path, json_t *body) {
  struct cli_resp resp;
  if (cli_request(method, path, body, &resp) < 0)
    return EXIT_API;
  int r = 0;
  if (resp.json)
    r = cli_print_json(resp.json) < 0 ? EXIT_API : 0;
  json_decref(resp.json);
  return r;
}

/* "/v1/sandboxes/<escaped id><suffix>"; caller frees. */
static char *sb_path(const char *id, const char *suffix) {
  _cleanup_free_ char *e = cli_escape(id);
  return xasprintf("/v1/sandboxes/%s%s", e, suffix);
}

static int parse_port(const char *s, long long *port) {
  if (cli_parse_ll(s, "PORT", port) < 0)
    return -1;
  if (*port < 1 || *port > 65535) {
    cli_errorf("PORT must be 1..65535, got %s", s);
    return -1;
  }
  return 0;
}

/* ---- moat port ---- */
static const char port_usage[] =
    "moat port ls ID                          the ports whose access was set\n"
    "moat port get ID PORT                    one port's access (public, token, url, path)\n"
    "moat port expose ID PORT [--public | --token T]\n"
    "                                         set its access: public, or a token (default: a new one)\n"
    "moat port rm ID PORT                     forget its token and public flag (API key only again)\n";

enum { P_PUBLIC = 1, P_TOKEN };
static const struct cli_opt port_opts[] = {
    {"public", false, P_PUBLIC}, {"token", true, P_TOKEN}, {NULL, false, 0}};
struct port_ctx {
  bool public;
  const char *token;
};
static int on_port_opt(int id, const char *value, void *ctx) {
  struct port_ctx *p = ctx;
  if (id == P_PUBLIC)
    p->public = true;
  else
    p->token = value;
  return 0;
}

int cmd_port(int argc, char **argv) {
  struct port_ctx p = {0};
  struct cli_args a;
  int r = cli_parse(argc, argv, port_opts, 3, false, on_port_opt, &p, &a);
  _cleanup_free_ char **pos = a.pos;
  free(a.rest);
  if (r == 1) {
    printf("usage: %s", port_usage);
    return 0;
  }
  if (r < 0 || a.npos < 2)
    return cli_usage_error(port_usage, "%s", r < 0 ? "" : "port needs a subcommand and a sandbox ID");
  const char *sub = pos[0];
  bool expose = strcmp(sub, "expose") == 0;
  if (!expose && (p.public || p.token))
    return cli_usage_error(port_usage, "--public and --token go with port expose");
  if (strcmp(sub, "ls") == 0) {
    if (a.npos != 2)
      return cli_usage_error(port_usage, "port ls takes one ID");
    _cleanup_free_ char *path = sb_path(pos[1], "/ports");
    return cli_call_print("GET", path, NULL);
  }
  bool get = strcmp(sub, "get") == 0, rm = strcmp(sub, "rm") == 0;
  if (!get && !rm && !expose)
    return cli_usage_error(port_usage, "unknown port subcommand '%s'", sub);
  long long port;
  if (a.npos != 3)
    return cli_usage_error(port_usage, "port %s takes ID and PORT", sub);
  if (parse_port(pos[2], &port) < 0)
    return EXIT_USAGE;
  if (p.public && p.token)
    return cli_usage_error(port_usage, "a public port takes no --token");
  _cleanup_free_ char *suffix = xasprintf("/ports/%lld", port);
  _cleanup_free_ char *path = sb_path(pos[1], suffix);
  if (get)
    return cli_call_print("GET", path, NULL);
  if (rm)
    return cli_call_print("DELETE", path, NULL);
  _cleanup_json_ json_t *body = json_object();
  if (p.public)
    json_object_set_new(body, "public", json_true());
  if (p.token)
    json_object_set_new(body, "token", json_string(p.token));
  return cli_call_print("POST", path, body);
}

/* ---- moat network ---- */
static const char network_usage[] =
    "moat network get ID                      address, policy and byte/connection counters\n"
    "moat network set ID [--internet on|off] [--egress allow|deny] [--allow E]... [--deny E]...\n"
    "                                         replace the egress policy (E: IPv4, CIDR, name, *.name)\n"
    "moat network log ID [--since SEQ] [--limit N]\n"
    "                                         outbound connections and dropped attempts, as JSON\n";

enum { N_INTERNET = 1, N_EGRESS, N_ALLOW, N_DENY, N_SINCE, N_LIMIT };
static const struct cli_opt network_opts[] = {{"internet", true, N_INTERNET},
                                              {"egress", true, N_EGRESS},
                                              {"allow", true, N_ALLOW},
                                              {"deny", true, N_DENY},
                                              {"since", true, N_SINCE},
                                              {"limit", true, N_LIMIT},
                                              {NULL, false, 0}};
struct network_ctx {
  json_t *policy;
  bool set_opts;
  long long since, limit;
  bool has_since, has_limit;
};
static int on_network_opt(int id, const char *value, void *ctx) {
  struct network_ctx *n = ctx;
  switch (id) {
  case N_INTERNET:
    if (strcmp(value, "on") != 0 && strcmp(value, "off") != 0) {
      cli_errorf("--internet takes on or off, got '%s'", value);
      return -1;
    }
    n->set_opts = true;
    json_object_set_new(n->policy, "internet", json_boolean(strcmp(value, "on") == 0));
    return 0;
  case N_EGRESS:
    if (strcmp(value, "allow") != 0 && strcmp(value, "deny") != 0) {
      cli_errorf("--egress takes allow or deny, got '%s'", value);
      return -1;
    }
    n->set_opts = true;
    json_object_set_new(n->policy, "egress", json_string(value));
    return 0;
  case N_ALLOW:
  case N_DENY: {
    const char *k = id == N_ALLOW ? "allow" : "deny";
    json_t *arr = json_object_get(n->policy, k);
    if (!arr) {
      arr = json_array();
      json_object_set_new(n->policy, k, arr);
    }
    n->set_opts = true;
    json_array_append_new(arr, json_string(value));
    return 0;
  }
  case N_SINCE:
    n->has_since = true;
    return cli_parse_ll(value, "--since", &n->since);
  default:
    n->has_limit = true;
    return cli_parse_ll(value, "--limit", &n->limit);
  }
}

int cmd_network(int argc, char **argv) {
  _cleanup_json_ json_t *policy = json_object();
  struct network_ctx n = {.policy = policy};
  struct cli_args a;
  int r = cli_parse(argc, argv, network_opts, 2, false, on_network_opt, &n, &a);
  _cleanup_free_ char **pos = a.pos;
  free(a.rest);
  if (r == 1) {
    printf("usage: %s", network_usage);
    return 0;
  }
  if (r < 0 || a.npos != 2)
    return cli_usage_error(network_usage, "%s", r < 0 ? "" : "network takes a subcommand and one sandbox ID");
  const char *sub = pos[0];
  bool set = strcmp(sub, "set") == 0, log = strcmp(sub, "log") == 0;
  if (!set && n.set_opts)
    return cli_usage_error(network_usage, "--internet, --egress, --allow and --deny go with network set");
  if (!log && (n.has_since || n.has_limit))
    return cli_usage_error(network_usage, "--since and --limit go with network log");
  if (strcmp(sub, "get") == 0) {
    _cleanup_free_ char *path = sb_path(pos[1], "/network");
    return cli_call_print("GET", path, NULL);
  }
  if (set) {
    _cleanup_free_ char *path = sb_path(pos[1], "/network");
    return cli_call_print("PUT", path, policy);
  }
  if (!log)
    return cli_usage_error(network_usage, "unknown network subcommand '%s'", sub);
  char q[64] = "";
  if (n.has_since && n.has_limit)
    snprintf(q, sizeof(q), "?since=%lld&limit=%lld", n.since, n.limit);
  else if (n.has_since)
    snprintf(q, sizeof(q), "?since=%lld", n.since);
  else if (n.has_limit)
    snprintf(q, sizeof(q), "?limit=%lld", n.limit);
  _cleanup_free_ char *suffix = xasprintf("/network/log%s", q);
  _cleanup_free_ char *path = sb_path(pos[1], suffix);
  struct cli_resp resp;
  if (cli_request("GET", path, NULL, &resp) < 0)
    return EXIT_API;
  r = cli_print_json(json_object_get(resp.json, "connections")) < 0 ? EXIT_API : 0;
  json_decref(resp.json);
  return r;
}

/* ---- moat events ---- */
static const char events_usage[] =
    "moat events ID [--replay] [--since TIME] [--count N]\n"
    "  prints the sandbox's events as they come, one JSON object {event, data} a line\n"
    "  (event: state, connection, dropped or oom), until interrupted or the sandbox is gone\n"
    "  --replay       the recorded transitions and buffered connections first\n"
    "  --since TIME   replay from TIME on (RFC 3339 or Unix ms)\n"
    "  --count N      stop after N events\n";

enum { E_REPLAY = 1, E_SINCE, E_COUNT };
static const struct cli_opt events_opts[] = {
    {"replay", false, E_REPLAY}, {"since", true, E_SINCE}, {"count", true, E_COUNT}, {NULL, false, 0}};
struct events_ctx {
  bool replay;
  const char *since;
  long long count, seen;
};
static int on_events_opt(int id, const char *value, void *ctx) {
  struct events_ctx *e = ctx;
  if (id == E_REPLAY) {
    e->replay = true;
    return 0;
  }
  if (id == E_SINCE) {
    e->since = value;
    return 0;
  }
  if (cli_parse_ll(value, "--count", &e->count) < 0)
    return -1;
  if (e->count < 1) {
    cli_errorf("--count must be at least 1");
    return -1;
  }
  return 0;
}

static int on_sandbox_event(const char *event, const char *data, size_t len, void *ctx) {
  struct events_ctx *e = ctx;
  json_error_t jerr;
  json_t *d = json_loadb(data, len, 0, &jerr);
  _cleanup_json_ json_t *line =
      json_pack("{s:s, s:o}", "event", event, "data", d ? d : json_stringn(data, len));
  if (!line || json_dumpf(line, stdout, JSON_COMPACT) < 0) {
    cli_errorf("cannot print an event");
    return -1;
  }
  fputc('\n', stdout);
  fflush(stdout);
  return e->count && ++e->seen >= e->count ? 1 : 0;
}

int cmd_events(int argc, char **argv) {
  struct events_ctx e = {0};
  struct cli_args a;
  int r = cli_parse(argc, argv, events_opts, 1, false, on_events_opt, &e, &a);
  _cleanup_free_ char **pos = a.pos;
  free(a.rest);
  if (r == 1) {
    printf("usage: %s", events_usage);
    return 0;
  }
  if (r < 0 || a.npos != 1)
    return cli_usage_error(events_usage, "%s", r < 0 ? "" : "events takes one sandbox ID");
  _cleanup_free_ char *since = e.since ? cli_escape(e.since) : NULL;
  _cleanup_free_ char *suffix = xasprintf("/events?replay=%s%s%s", e.replay ? "true" : "false",
                                          since ? "&since=" : "", since ? since : "");
  _cleanup_free_ char *path = sb_path(pos[0], suffix);
  cli_trap_signals();
  r = cli_sse("GET", path, NULL, on_sandbox_event, &e);
  if (r < 0)
    return cli_interrupted ? 128 + cli_interrupted : EXIT_API;
  return 0;
}

/* ---- moat update ---- */
static const char update_usage[] =
    "moat update ID [--ttl S] [--persistent | --no-persistent] [--meta K=V]...\n"
    "  --ttl S          kill it S seconds from now (unless API use refreshes it)\n"
    "  --persistent     no TTL; --no-persistent: the TTL again\n"
    "  --meta K=V       replace its metadata with these labels (repeatable)\n"
    "  prints the sandbox as JSON\n";

enum { U_TTL = 1, U_PERSISTENT, U_NO_PERSISTENT, U_META };
static const struct cli_opt update_opts[] = {{"ttl", true, U_TTL},
                                             {"persistent", false, U_PERSISTENT},
                                             {"no-persistent", false, U_NO_PERSISTENT},
                                             {"meta", true, U_META},
                                             {NULL, false, 0}};
static int on_update_opt(int id, const char *value, void *ctx) {
  json_t *body = ctx;
  if (id == U_TTL) {
    long long s;
    if (cli_parse_ll(value, "--ttl", &s) < 0)
      return -1;
    json_object_set_new(body, "ttl_seconds", json_integer(s));
    return 0;
  }
  if (id == U_PERSISTENT || id == U_NO_PERSISTENT) {
    json_object_set_new(body, "persistent", json_boolean(id == U_PERSISTENT));
    return 0;
  }
  json_t *m = json_object_get(body, "metadata");
  if (!m) {
    m = json_object();
    json_object_set_new(body, "metadata", m);
  }
  return cli_kv_set(m, value, "--meta");
}

int cmd_update(int argc, char **argv) {
  _cleanup_json_ json_t *body = json_object();
  struct cli_args a;
  int r = cli_parse(argc, argv, update_opts, 1, false, on_update_opt, body, &a);
  _cleanup_free_ char **pos = a.pos;
  free(a.rest);
  if (r == 1) {
    printf("usage: %s", update_usage);
    return 0;
  }
  if (r < 0 || a.npos != 1)
    return cli_usage_error(update_usage, "%s", r < 0 ? "" : "update takes one sandbox ID");
  if (json_object_size(body) == 0)
    return cli_usage_error(update_usage, "update needs --ttl, --persistent, --no-persistent or --meta");
  _cleanup_free_ char *path = sb_path(pos[0], "");
  return cli_call_print("PATCH", path, body);
}

/* pg_harness.c -- the database proxy (api/pg) served in a process of its own with a resolver that
 * connects to one real PostgreSQL server, for tests and the benchmark (tests/lib/pgtest.py)
 *
 *   pg_harness --backend HOST:PORT --name NAME [--listen HOST:PORT] [--max-connections N]
 *              [--max-conns-per-ip N] [--startup-timeout-ms N] [--resolve-delay-ms N]
 *              [--scoped-listen HOST:PORT [--scope IPV4=ORG]...]
 *
 * A startup whose user or database is NAME is routed to the backend (org "org-test", database id
 * "db-NAME") when the client's scope admits org-test; any other is ENOENT ("no such database").
 * The scoped listener maps each client address given by --scope to its ORG (any other address to
 * none). Prints "pg proxy on port P" once listening (and "scoped on port Q" with a scoped
 * listener); then reads commands from stdin: "stats" prints "active N routed N events +N -N";
 * end of input stops the proxy (every connection closed, every thread done) and exits 0. */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "api/http/http.h"
#include "api/pg/pg.h"
#include "common/util.h"

#define MAX_SCOPES 16
static struct {
  struct in_addr addr;
  const char *org;
} scopes[MAX_SCOPES];
static int n_scopes;

static struct sockaddr_in backend;
static const char *name;
static unsigned resolve_delay_ms;
static int ev_plus, ev_minus; /* atomic */

static int resolve(void *arg, const char *scope, const char *user, const char *database, char **org,
                   char **id, int timeout_ms, moat_error **err) {
  if ((strcmp(user, name) != 0 && strcmp(database, name) != 0) || (scope && strcmp(scope, "org-test") != 0))
    return moat_error_set(err, ENOENT, "no such database: user \"%s\", database \"%s\"", user, database);
  if (resolve_delay_ms)
    usleep(resolve_delay_ms * 1000);
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return moat_error_errno(err, "socket");
  if (connect(fd, (struct sockaddr *)&backend, sizeof(backend)) < 0) {
    moat_error_errno(err, "connect to the database server");
    close(fd);
    return -1;
  }
  *org = xstrdup("org-test");
  *id = xasprintf("db-%s", name);
  return fd;
}

static int origin(void *arg, const struct sockaddr *sa, unsigned len, char **org, char **client) {
  const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
  if (sa->sa_family != AF_INET || len < sizeof(*in))
    return -1;
  for (int i = 0; i < n_scopes; i++)
    if (scopes[i].addr.s_addr == in->sin_addr.s_addr) {
      *org = xstrdup(scopes[i].org);
      *client = xasprintf("client of %s", scopes[i].org);
      return 0;
    }
  return -1;
}

static void conn_event(void *arg, const char *id, int delta) {
  __atomic_add_fetch(delta > 0 ? &ev_plus : &ev_minus, 1, __ATOMIC_SEQ_CST);
}

int main(int argc, char **argv) {
  struct moat_pg_config cfg = {.listen = "127.0.0.1:0", .resolve = resolve, .conn_event = conn_event};
  const char *be = NULL, *scoped = NULL;
  static const struct option opts[] = {
      {"listen", required_argument, NULL, 'l'},
      {"backend", required_argument, NULL, 'b'},
      {"name", required_argument, NULL, 'n'},
      {"max-connections", required_argument, NULL, 'm'},
      {"max-conns-per-ip", required_argument, NULL, 'i'},
      {"startup-timeout-ms", required_argument, NULL, 's'},
      {"resolve-delay-ms", required_argument, NULL, 'd'},
      {"scoped-listen", required_argument, NULL, 'S'},
      {"scope", required_argument, NULL, 'o'},
      {NULL, 0, NULL, 0},
  };
  int ch;
  while ((ch = getopt_long(argc, argv, "", opts, NULL)) != -1) {
    switch (ch) {
    case 'l':
      cfg.listen = optarg;
      break;
    case 'b':
      be = optarg;
      break;
    case 'n':
      name = optarg;
      break;
    case 'm':
      cfg.max_connections = (unsigned)atoi(optarg);
      break;
    case 'i':
      cfg.max_conns_per_ip = (unsigned)atoi(optarg);
      break;
    case 's':
      cfg.startup_timeout_ms = (unsigned)atoi(optarg);
      break;
    case 'd':
      resolve_delay_ms = (unsigned)atoi(optarg);
      break;
    case 'S':
      scoped = optarg;
      break;
    case 'o': {
      const char *eq = strchr(optarg, '=');
      char a[32];
      snprintf(a, sizeof(a), "%.*s", eq ? (int)(eq - optarg) : 0, optarg);
      if (!eq || n_scopes == MAX_SCOPES || inet_pton(AF_INET, a, &scopes[n_scopes].addr) != 1) {
        fprintf(stderr, "pg_harness: --scope %s: IPV4=ORG\n", optarg);
        return 2;
      }
      scopes[n_scopes++].org = eq + 1;
      break;
    }
    default:
      return 2;
    }
  }
  const char *colon = be ? strrchr(be, ':') : NULL;
  if (!colon || !name) {
    fprintf(stderr, "usage: pg_harness --backend HOST:PORT --name NAME [...]\n");
    return 2;
  }
  char host[64];
  snprintf(host, sizeof(host), "%.*s", (int)(colon - be), be);
  backend.sin_family = AF_INET;
  backend.sin_port = htons((uint16_t)atoi(colon + 1));
  if (inet_pton(AF_INET, host, &backend.sin_addr) != 1) {
    fprintf(stderr, "pg_harness: --backend %s: an IPv4 address\n", be);
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  moat_error *err = NULL;
  struct moat_pg_proxy *p = NULL;
  unsigned scoped_port = 0;
  if (scoped) {
    bool v6;
    cfg.scoped_fd = api_listen_socket(scoped, &scoped_port, &v6, &err);
    if (cfg.scoped_fd < 0) {
      fprintf(stderr, "pg_harness: --scoped-listen: %s\n", moat_error_msg(err));
      return 1;
    }
    cfg.origin = origin;
  }
  if (moat_pg_proxy_start(&p, &cfg, &err) < 0) {
    fprintf(stderr, "pg_harness: %s\n", moat_error_msg(err));
    return 1;
  }
  printf("pg proxy on port %u\n", moat_pg_proxy_port(p));
  if (scoped)
    printf("scoped on port %u\n", scoped_port);
  fflush(stdout);
  char line[128];
  while (fgets(line, sizeof(line), stdin)) {
    if (strncmp(line, "stats", 5) == 0) {
      unsigned routed = 0, active = moat_pg_proxy_active(p, &routed);
      printf("active %u routed %u events +%d -%d\n", active, routed,
             __atomic_load_n(&ev_plus, __ATOMIC_SEQ_CST), __atomic_load_n(&ev_minus, __ATOMIC_SEQ_CST));
      fflush(stdout);
    }
  }
  moat_pg_proxy_stop(p);
  return 0;
}

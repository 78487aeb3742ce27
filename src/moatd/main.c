/* main.c -- moatd: the daemon's command line, start-up checks, signal handling; `moatd key create` */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../common/version.h"
#include "api/api.h"
#include "api/pg/pg.h"
#include "common/log.h"
#include "common/util.h"
#include "control/control.h"
#include "host/driver.h"
#include "host/net/net.h"
#include "secret.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: moatd [--listen HOST:PORT] [--data-dir DIR] [--template-dir DIR] [--recipes DIR]\n"
          "             [--guest PATH] [--pool N] [--log-level debug|info|warn|error]\n"
          "       moatd key create --data-dir DIR --org ORG [--name NAME] [--role admin|member|readonly]\n"
          "       moatd key create --data-dir DIR --admin [--name NAME]   (the platform admin key: manages "
          "orgs)\n"
          "\n"
          "  --listen HOST:PORT   address to serve the API on (default 127.0.0.1:7070)\n"
          "  --data-dir DIR       state: moat.db, api-key, sandboxes (default ./.moat)\n"
          "  --template-dir DIR   built templates (default $MOAT_TEMPLATE_DIR, else DIR/templates)\n"
          "  --recipes DIR        template recipes (default: the repository's templates/)\n"
          "  --guest PATH         the static moat-guest binary (default: next to moatd)\n"
          "  --ui-dir DIR         the web dashboard's built assets, served at /ui/ (default: ui/ next to\n"
          "                       moatd, else the repository's build/ui)\n"
          "  --proxy-listen HOST:PORT  serve exposed ports by host name: a request with Host\n"
          "                       PORT-SANDBOXID.DOMAIN goes to PORT inside the sandbox (default: off)\n"
          "  --proxy-domain DOMAIN  the DOMAIN of those host names (default: any; URLs say localhost)\n"
          "  --db-listen HOST:PORT|none  the PostgreSQL-protocol proxy: one address for every database,\n"
          "                       routed by the startup message's user or database (default\n"
          "                       127.0.0.1:7432; none: no proxy). With sandbox networking it also\n"
          "                       listens for sandboxes on their DNS address, port 5432 (each served\n"
          "                       its own org's databases only)\n"
          "  --db-tls-cert FILE --db-tls-key FILE  TLS for the database proxy's clients (a PEM certificate\n"
          "                       chain and its key; both listeners answer SSLRequest with 'S'). Without\n"
          "                       them: no TLS (sslmode=disable or prefer)\n"
          "  --audit-retention-days N  how long the audit log (GET /v1/audit) keeps an entry (default 90)\n"
          "  --audit on|off       off: record no new audit entries (what is recorded stays readable)\n"
          "  --metrics-retention-hours N  how long metric samples (GET /v1/sandboxes/ID/metrics?from=)\n"
          "                       are kept (default 24; usage's hourly totals are kept 400 days)\n"
          "  --log-max-mb N       a sandbox's output log (GET /v1/sandboxes/ID/logs) keeps at most N MiB,\n"
          "                       the oldest dropped first (default 16; 0: no output logs)\n"
          "  --log-retention-seconds N  how long a killed sandbox's output log is kept (default 86400)\n"
          "  --db-max-connections N  connections the database proxy serves at once (default %d)\n"
          "  --db-max-conns-per-ip N  of those, from one client address (default %d)\n"
          "  --pool N             warm shells of the base template kept ready (default 4)\n"
          "  --lxcfs auto|none|DIR  where sandboxes' /proc/meminfo, stat, uptime and loadavg come\n"
          "                       from (their own memory, CPU time and load). auto (the default): the\n"
          "                       machine's lxcfs (Debian's service at /var/lib/lxcfs, or one at\n"
          "                       /run/moat/lxcfs.d/mnt, which moatd starts if needed and leaves running);\n"
          "                       without lxcfs or /dev/fuse, the machine's files and a warning.\n"
          "                       none: the machine's. DIR: that lxcfs mount (else moatd refuses to start)\n"
          "  --build-context-max-mb N  the most file data a template build's context may hold\n"
          "                       (default 1024; an upload may be twice that plus 64 MiB of tar headers)\n"
          "  --disk-overcommit    accept sandboxes whose disk_mb the data dir's free space cannot back\n"
          "                       (sparse disks; a write the host cannot store then fails inside with\n"
          "                       ENOSPC/EIO and turns that disk read-only). Default: such a create is\n"
          "                       507 insufficient_storage and every disk is allocated in full\n"
          "  --net-uplink auto|none|IF|netns:PATH  how sandboxes reach the internet (IPv4). auto (the\n"
          "                       default): through the interface of this host's IPv4 default route,\n"
          "                       masqueraded, with forwarding turned on for that interface and moat's\n"
          "                       own link only; a host with no default route starts without one (a\n"
          "                       warning says so, /healthz shows uplink none). IF: through interface\n"
          "                       IF (moatd refuses to start when it does not exist). netns:PATH: through\n"
          "                       the network namespace at PATH. none: loopback only\n"
          "  --net-dns-upstream IP[:PORT]  resolver moatd forwards sandboxes' allowed names to (default:\n"
          "                       the nameservers of /etc/resolv.conf, re-read when it changes; a\n"
          "                       loopback stub such as 127.0.0.53 works), reached from the uplink's side\n"
          "  --net-pool CIDR      IPv4 pool of per-sandbox /30s (default 10.200.0.0/16: 16,384 /30s)\n"
          "  --net-block-ports P,P,...  TCP/UDP ports always dropped (default: common mining-pool ports)\n"
          "  --net-warm N         network slots prepared ahead (default 8)\n"
          "  --guest-timeout MS   a sandbox's guest that sends nothing for this long while not frozen\n"
          "                       is unreachable: the call fails 502 and the sandbox is checked\n"
          "                       (default 15000, at least 9000)\n"
          "\n"
          "Connections and fairness (each listener; see docs/CONTRACT.md \"Limits and fairness\"):\n"
          "  --max-connections N  open connections (default %d)\n"
          "  --max-conns-per-ip N open connections per client address (default 0: no limit)\n"
          "  --header-timeout S   a request head must arrive within S seconds (default %d)\n"
          "  --idle-timeout S     idle keep-alive connections close after S seconds (default %d)\n"
          "  --stream-keepalive-ms N  an SSE stream silent N ms gets a keep-alive comment (default 15000)\n"
          "  --max-requests-per-org N     requests in flight per org (default %d)\n"
          "  --max-streams-per-org N      streams open per org (SSE, exec/stream, PTY, watch...)\n"
          "                       (default %d)\n"
          "  --max-requests-per-sandbox N requests in flight per sandbox (default %d)\n"
          "  --max-streams-per-sandbox N  streams open per sandbox (default %d)\n"
          "  --max-idle-per-org N  idle keep-alive connections kept per org (default %d)\n",
          PG_DEFAULT_MAX_CONNECTIONS, PG_DEFAULT_MAX_CONNS_PER_IP, API_DEFAULT_MAX_CONNECTIONS,
          API_DEFAULT_HEADER_TIMEOUT_S, API_DEFAULT_IDLE_TIMEOUT_S, API_DEFAULT_REQUESTS_PER_ORG,
          API_DEFAULT_STREAMS_PER_ORG, API_DEFAULT_REQUESTS_PER_SANDBOX, API_DEFAULT_STREAMS_PER_SANDBOX,
          API_DEFAULT_IDLE_PER_ORG);
}

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("moatd: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  exit(1);
}

/* The value of --flag: an integer from min to max, or moatd dies. */
static unsigned flag_uint(const char *flag, const char *arg, unsigned min, unsigned max) {
  uint64_t v;
  if (parse_u64(arg, &v) < 0 || v < min || v > max)
    die("--%s %s: expected a number from %u to %u", flag, arg, min, max);
  return (unsigned)v;
}

/* The directory holding this executable (caller frees), or NULL. */
static char *exe_dir(void) {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0)
    return NULL;
  buf[n] = '\0';
  char *slash = strrchr(buf, '/');
  if (!slash)
    return NULL;
  *slash = '\0';
  return xstrdup(buf[0] ? buf : "/");
}

/* The repository root: the nearest directory above the executable that holds templates/base
 * (exe is REPO/build/moatd or REPO/build/san/moatd). Caller frees; NULL if none. */
static char *find_repo(const char *dir) {
  if (!dir)
    return NULL;
  char *d = xstrdup(dir);
  for (;;) {
    char *probe = xasprintf("%s/templates/base", d);
    struct stat st;
    bool found = stat(probe, &st) == 0 && S_ISDIR(st.st_mode);
    free(probe);
    if (found)
      return d;
    char *slash = strrchr(d, '/');
    if (!slash || slash == d) {
      free(d);
      return NULL;
    }
    *slash = '\0';
  }
}

static bool is_file(const char *p) {
  struct stat st;
  return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* Absolute form of a path that may not exist yet (caller frees). */
static char *absolute(const char *p) {
  if (p[0] == '/')
    return xstrdup(p);
  char cwd[PATH_MAX];
  if (!getcwd(cwd, sizeof(cwd)))
    die("getcwd: %s", strerror(errno));
  return xasprintf("%s/%s", cwd, p);
}

/* Fails when another process listens on listen ("HOST:PORT", "[V6]:PORT"); a port of 0 passes.
 * The API binds for real later; this only lets moatd refuse before it touches any sandbox. */
/* Dies unless --flag's listen_addr can be listened on (a port of 0 is not tried). */
static void check_port(const char *flag, const char *listen_addr) {
  const char *colon = strrchr(listen_addr, ':');
  if (!colon || !colon[1])
    die("--%s %s: expected HOST:PORT", flag, listen_addr);
  uint64_t port;
  if (parse_u64(colon + 1, &port) < 0 || port > 65535)
    die("--%s %s: bad port", flag, listen_addr);
  if (port == 0)
    return;
  _cleanup_free_ char *host = xstrndup(listen_addr, (size_t)(colon - listen_addr));
  if (host[0] == '[' && host[strlen(host) - 1] == ']') {
    memmove(host, host + 1, strlen(host));
    host[strlen(host) - 1] = '\0';
  }
  struct sockaddr_storage ss;
  memset(&ss, 0, sizeof(ss));
  socklen_t sl;
  struct sockaddr_in *in4 = (struct sockaddr_in *)&ss;
  struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;
  if (strcmp(host, "localhost") == 0 || inet_pton(AF_INET, host, &in4->sin_addr) == 1) {
    if (strcmp(host, "localhost") == 0)
      in4->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    in4->sin_family = AF_INET;
    in4->sin_port = htons((uint16_t)port);
    sl = sizeof(*in4);
  } else if (inet_pton(AF_INET6, host, &in6->sin6_addr) == 1) {
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons((uint16_t)port);
    sl = sizeof(*in6);
  } else {
    die("--%s %s: HOST must be an IP address or localhost", flag, listen_addr);
  }
  _cleanup_close_ int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    die("socket: %s", strerror(errno));
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd, (struct sockaddr *)&ss, sl) < 0 || listen(fd, 1) < 0)
    die("--%s: cannot listen on %s: %s", flag, listen_addr,
        errno == EADDRINUSE ? "address already in use (is another server on that port?)" : strerror(errno));
}

static int key_create(int argc, char **argv) {
  const char *data_dir = "./.moat", *org = NULL, *name = NULL, *role = NULL;
  static const struct option opts[] = {
      {"data-dir", required_argument, NULL, 'd'},
      {"org", required_argument, NULL, 'o'},
      {"name", required_argument, NULL, 'n'},
      {"role", required_argument, NULL, 'r'},
      {"help", no_argument, NULL, 'h'},
      {"admin", no_argument, NULL, 'a'},
      {NULL, 0, NULL, 0},
  };
  bool admin = false;
  int ch;
  optind = 1;
  while ((ch = getopt_long(argc, argv, "", opts, NULL)) != -1) {
    switch (ch) {
    case 'd':
      data_dir = optarg;
      break;
    case 'o':
      org = optarg;
      break;
    case 'n':
      name = optarg;
      break;
    case 'r':
      role = optarg;
      break;
    case 'a':
      admin = true;
      break;
    case 'h':
      usage(stdout);
      return 0;
    default:
      usage(stderr);
      return 2;
    }
  }
  if (admin && (org || role)) {
    fprintf(stderr, "moatd: key create: --admin makes the platform admin key: no --org or --role with it\n");
    return 2;
  }
  if (admin) {
    org = MOAT_PLATFORM_ORG;
    role = "platform";
  }
  if (optind != argc || !org) {
    usage(stderr);
    return 2;
  }
  char *key = NULL;
  moat_error *err = NULL;
  struct stat st;
  int st_rc = stat(data_dir, &st);
  if (st_rc < 0 || !S_ISDIR(st.st_mode)) {
    fprintf(stderr, "moatd: key create: data dir %s: %s\n", data_dir,
            st_rc < 0 ? strerror(errno) : "not a directory");
    return 1;
  }
  if (moat_control_key_create(data_dir, org, name, role, &key, &err) < 0) {
    fprintf(stderr, "moatd: key create: %s\n", moat_error_msg(err));
    moat_error_free(&err);
    return 1;
  }
  printf("%s\n", key);
  fflush(stdout); /* the key line first, also where stdout and stderr are one stream */
  char *e2b = moat_control_key_e2b_form(key);
  if (e2b) /* stderr: stdout stays the one key line scripts read */
    fprintf(stderr, "moatd: the same key for E2B's SDKs (E2B_API_KEY): %s\n", e2b);
  free(e2b);
  free(key);
  return 0;
}

int main(int argc, char **argv) {
  if (argc >= 3 && strcmp(argv[1], "key") == 0 && strcmp(argv[2], "create") == 0)
    return key_create(argc - 2, argv + 2);

  const char *listen_addr = "127.0.0.1:7070", *data_opt = "./.moat", *template_opt = NULL,
             *recipes_opt = NULL, *guest_opt = NULL, *ui_opt = NULL;
  unsigned pool = 4, guest_timeout_ms = 0;
  uint64_t build_context_max_mb = 1024;
  bool disk_overcommit = false;
  const char *lxcfs_dir = MOAT_HOST_LXCFS_AUTO;
  const char *proxy_listen = NULL, *proxy_domain = NULL, *db_listen = "127.0.0.1:7432";
  unsigned db_max_connections = 0, db_max_conns_per_ip = 0;
  const char *db_tls_cert = NULL, *db_tls_key = NULL;
  unsigned audit_days = 0;
  bool audit_off = false;
  unsigned metrics_hours = 0;
  int sample_interval_ms = 0;
  unsigned log_max_mb = 0, log_retention_s = 0;
  bool logs_off = false;
  struct moat_net_config net = {.uplink = "auto"};
  struct moat_api_limits lim = {0};
  enum moat_log_level level = MOAT_LOG_INFO;
  static const struct option opts[] = {
      {"listen", required_argument, NULL, 'l'},
      {"proxy-listen", required_argument, NULL, 0x100},
      {"proxy-domain", required_argument, NULL, 0x101},
      {"data-dir", required_argument, NULL, 'd'},
      {"template-dir", required_argument, NULL, 't'},
      {"recipes", required_argument, NULL, 'r'},
      {"guest", required_argument, NULL, 'g'},
      {"ui-dir", required_argument, NULL, 0x5501},
      {"pool", required_argument, NULL, 'p'},
      {"disk-overcommit", no_argument, NULL, 0x102},
      {"lxcfs", required_argument, NULL, 0x103},
      {"build-context-max-mb", required_argument, NULL, 0x104},
      {"log-level", required_argument, NULL, 'L'},
      {"net-uplink", required_argument, NULL, 'U'},
      {"net-dns-upstream", required_argument, NULL, 'D'},
      {"net-pool", required_argument, NULL, 'P'},
      {"net-block-ports", required_argument, NULL, 'B'},
      {"net-warm", required_argument, NULL, 'W'},
      {"guest-timeout", required_argument, NULL, 0x110},
      {"db-listen", required_argument, NULL, 0x120},
      {"db-max-connections", required_argument, NULL, 0x121},
      {"db-max-conns-per-ip", required_argument, NULL, 0x122},
      {"db-tls-cert", required_argument, NULL, 0x123},
      {"db-tls-key", required_argument, NULL, 0x124},
      {"audit-retention-days", required_argument, NULL, 0x125},
      {"audit", required_argument, NULL, 0x126},
      {"metrics-retention-hours", required_argument, NULL, 0x140},
      {"sample-interval-ms", required_argument, NULL, 0x141}, /* hidden: tests; 0 = metering off */
      {"log-max-mb", required_argument, NULL, 0x130},
      {"log-retention-seconds", required_argument, NULL, 0x131},
      {"max-connections", required_argument, NULL, 0x200},
      {"max-conns-per-ip", required_argument, NULL, 0x201},
      {"header-timeout", required_argument, NULL, 0x202},
      {"idle-timeout", required_argument, NULL, 0x203},
      {"stream-keepalive-ms", required_argument, NULL, 0x20a},
      {"max-requests-per-org", required_argument, NULL, 0x204},
      {"max-streams-per-org", required_argument, NULL, 0x205},
      {"max-requests-per-sandbox", required_argument, NULL, 0x206},
      {"max-streams-per-sandbox", required_argument, NULL, 0x207},
      {"max-idle-per-org", required_argument, NULL, 0x208},
      {"help", no_argument, NULL, 'h'},
      {"version", no_argument, NULL, 'V'},
      {NULL, 0, NULL, 0},
  };
  int ch;
  while ((ch = getopt_long(argc, argv, "", opts, NULL)) != -1) {
    switch (ch) {
    case 'l':
      listen_addr = optarg;
      break;
    case 0x100:
      proxy_listen = optarg;
      break;
    case 0x101:
      proxy_domain = optarg;
      break;
    case 0x102:
      disk_overcommit = true;
      break;
    case 0x103:
      lxcfs_dir = optarg;
      break;
    case 0x104:
      build_context_max_mb = flag_uint("build-context-max-mb", optarg, 1, 1024 * 1024);
      break;
    case 'd':
      data_opt = optarg;
      break;
    case 't':
      template_opt = optarg;
      break;
    case 'r':
      recipes_opt = optarg;
      break;
    case 'g':
      guest_opt = optarg;
      break;
    case 0x5501:
      ui_opt = optarg;
      break;
    case 'p': {
      uint64_t v;
      if (parse_u64(optarg, &v) < 0 || v > 4096)
        die("--pool %s: expected a number from 0 to 4096", optarg);
      pool = (unsigned)v;
      break;
    }
    case 'U':
      net.uplink = optarg;
      break;
    case 'D':
      net.dns_upstream = optarg;
      break;
    case 'P':
      net.pool = optarg;
      break;
    case 'B':
      net.block_ports = optarg;
      break;
    case 'W': {
      uint64_t v;
      if (parse_u64(optarg, &v) < 0 || v < 1 || v > 4096)
        die("--net-warm %s: expected a number from 1 to 4096", optarg);
      net.warm = (unsigned)v;
      break;
    }
    case 0x120:
      db_listen = strcmp(optarg, "none") == 0 ? NULL : optarg;
      break;
    case 0x121:
      db_max_connections = flag_uint("db-max-connections", optarg, 1, 1000000);
      break;
    case 0x123:
      db_tls_cert = optarg;
      break;
    case 0x124:
      db_tls_key = optarg;
      break;
    case 0x140:
      metrics_hours = flag_uint("metrics-retention-hours", optarg, 1, 24 * 366);
      break;
    case 0x141: {
      unsigned v = flag_uint("sample-interval-ms", optarg, 0, 3600000);
      sample_interval_ms = v == 0 ? -1 : (int)(v < 100 ? 100 : v);
      break;
    }
    case 0x125:
      audit_days = flag_uint("audit-retention-days", optarg, 1, 36500);
      break;
    case 0x126:
      if (strcmp(optarg, "on") != 0 && strcmp(optarg, "off") != 0)
        die("--audit %s: expected on or off", optarg);
      audit_off = strcmp(optarg, "off") == 0;
      break;
    case 0x130:
      log_max_mb = flag_uint("log-max-mb", optarg, 0, 65536);
      logs_off = log_max_mb == 0;
      break;
    case 0x131:
      log_retention_s = flag_uint("log-retention-seconds", optarg, 1, 100u * 365 * 86400);
      break;
    case 0x122:
      db_max_conns_per_ip = flag_uint("db-max-conns-per-ip", optarg, 1, 1000000);
      break;
    case 0x110: {
      uint64_t v;
      if (parse_u64(optarg, &v) < 0 || v < 9000 || v > 3600000)
        die("--guest-timeout %s: expected milliseconds from 9000 to 3600000", optarg);
      guest_timeout_ms = (unsigned)v;
      break;
    }
    case 0x200:
      lim.max_connections = flag_uint("max-connections", optarg, 16, 1000000);
      break;
    case 0x201:
      lim.max_conns_per_ip = flag_uint("max-conns-per-ip", optarg, 0, 1000000);
      break;
    case 0x202:
      lim.header_timeout_s = flag_uint("header-timeout", optarg, 1, 3600);
      break;
    case 0x203:
      lim.idle_timeout_s = flag_uint("idle-timeout", optarg, 1, 86400);
      break;
    case 0x20a:
      lim.stream_keepalive_ms = flag_uint("stream-keepalive-ms", optarg, 100, 600000);
      break;
    case 0x204:
      lim.requests_per_org = flag_uint("max-requests-per-org", optarg, 1, 1000000);
      break;
    case 0x205:
      lim.streams_per_org = flag_uint("max-streams-per-org", optarg, 1, 1000000);
      break;
    case 0x206:
      lim.requests_per_sandbox = flag_uint("max-requests-per-sandbox", optarg, 1, 1000000);
      break;
    case 0x207:
      lim.streams_per_sandbox = flag_uint("max-streams-per-sandbox", optarg, 1, 1000000);
      break;
    case 0x208:
      lim.idle_per_org = flag_uint("max-idle-per-org", optarg, 1, 1000000);
      break;
    case 'L':
      if (strcmp(optarg, "debug") == 0)
        level = MOAT_LOG_DEBUG;
      else if (strcmp(optarg, "info") == 0)
        level = MOAT_LOG_INFO;
      else if (strcmp(optarg, "warn") == 0)
        level = MOAT_LOG_WARN;
      else if (strcmp(optarg, "error") == 0)
        level = MOAT_LOG_ERROR;
      else
        die("--log-level %s: expected debug, info, warn or error", optarg);
      break;
    case 'h':
      usage(stdout);
      return 0;
    case 'V':
      printf("moatd %s\n", MOAT_VERSION);
      return 0;
    default:
      usage(stderr);
      return 2;
    }
  }
  if (optind != argc) {
    usage(stderr);
    return 2;
  }
  moat_log_set_level(level);

  if (geteuid() != 0)
    die("must run as root (it creates namespaces, cgroups and mounts for sandboxes)");

  _cleanup_free_ char *data_dir = absolute(data_opt);
  /* sandboxes bind from it */
  _cleanup_free_ char *lxcfs_abs = strcmp(lxcfs_dir, "none") == 0                 ? NULL
                                   : strcmp(lxcfs_dir, MOAT_HOST_LXCFS_AUTO) == 0 ? xstrdup(lxcfs_dir)
                                                                                  : absolute(lxcfs_dir);
  moat_error *err = NULL;
  if (mkdir_p(data_dir, 0700, &err) < 0)
    die("data dir: %s", moat_error_msg(err));
  chmod(data_dir, 0700);

  /* One moatd per data dir. A POSIX record lock (not flock): it belongs to this process, so the
   * kernel drops it when moatd dies (kill -9 included) even if a forked, not yet exec'd child of
   * moatd still holds a copy of the fd for a moment. Never closed: closing any fd of the file
   * would drop the lock. */
  _cleanup_free_ char *lock_path = xasprintf("%s/lock", data_dir);
  int lock_fd = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (lock_fd < 0)
    die("open %s: %s", lock_path, strerror(errno));
  struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
  if (fcntl(lock_fd, F_SETLK, &fl) < 0) {
    if (errno == EACCES || errno == EAGAIN) {
      struct flock who = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
      if (fcntl(lock_fd, F_GETLK, &who) == 0 && who.l_type != F_UNLCK)
        die("another moatd (pid %d) is running with data dir %s", (int)who.l_pid, data_dir);
      die("another moatd is running with data dir %s", data_dir);
    }
    die("lock %s: %s", lock_path, strerror(errno));
  }

  check_port("listen", listen_addr);
  if (db_listen)
    check_port("db-listen", db_listen);
  if (!db_tls_cert != !db_tls_key)
    die("--db-tls-cert and --db-tls-key go together (a certificate and its key)");
  if (db_tls_cert && !db_listen)
    die("--db-tls-cert: there is no database proxy (--db-listen none)");

  _cleanup_free_ char *exe = exe_dir();
  _cleanup_free_ char *repo = find_repo(exe);
  _cleanup_free_ char *template_dir = NULL, *recipes = NULL, *guest = NULL;
  if (template_opt)
    template_dir = absolute(template_opt);
  else if (getenv("MOAT_TEMPLATE_DIR") && *getenv("MOAT_TEMPLATE_DIR"))
    template_dir = absolute(getenv("MOAT_TEMPLATE_DIR"));
  else
    template_dir = xasprintf("%s/templates", data_dir);
  if (recipes_opt)
    recipes = absolute(recipes_opt);
  else if (repo)
    recipes = xasprintf("%s/templates", repo);
  else
    die("cannot find the template recipes (templates/base above %s); pass --recipes DIR",
        exe ? exe : "moatd");
  if (guest_opt) {
    guest = absolute(guest_opt);
  } else {
    char *next = exe ? xasprintf("%s/moat-guest", exe) : NULL;
    if (next && is_file(next)) {
      guest = next;
    } else {
      free(next);
      if (repo)
        guest = xasprintf("%s/build/moat-guest", repo);
    }
  }
  if (!guest || !is_file(guest))
    die("cannot find moat-guest (%s); build it (make build/moat-guest) or pass --guest PATH",
        guest ? guest : "not next to moatd");

  /* The dashboard: found like the guest (next to moatd, else the repository's build); without one
   * moatd runs and answers /ui/ 503. */
  _cleanup_free_ char *ui_dir = NULL;
  if (ui_opt) {
    ui_dir = absolute(ui_opt);
  } else {
    char *next = exe ? xasprintf("%s/ui/MANIFEST", exe) : NULL;
    if (next && is_file(next))
      ui_dir = xasprintf("%s/ui", exe);
    else if (repo)
      ui_dir = xasprintf("%s/build/ui", repo);
    free(next);
  }

  /* Signals: every thread created from here on inherits the mask; main waits for them. */
  signal(SIGPIPE, SIG_IGN);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, NULL);

  log_info("moatd %s starting: data %s, templates %s, recipes %s, guest %s, pool %u", MOAT_VERSION, data_dir,
           template_dir, recipes, guest, pool);
  struct moat_control_config cc = {
      .data_dir = data_dir,
      .template_dir = template_dir,
      .recipes_dir = recipes,
      .guest_path = guest,
      .guest_timeout_ms = guest_timeout_ms,
      .pool_size = pool,
      .disk_overcommit = disk_overcommit,
      .lxcfs_dir = lxcfs_abs,
      .build_context_max_mb = build_context_max_mb,
      .db_listen = db_listen,
      .audit_retention_days = audit_days,
      .audit_off = audit_off,
      .sample_interval_ms = sample_interval_ms,
      .metrics_retention_hours = metrics_hours,
      .log_max_bytes = (uint64_t)log_max_mb << 20,
      .log_retention_s = log_retention_s,
      .logs_off = logs_off,
      .net = &net,
  };
  {
    const char *colon = strrchr(listen_addr, ':');
    uint64_t port;
    if (colon && parse_u64(colon + 1, &port) == 0 && port < 65536)
      net.api_port = (uint16_t)port;
  }
  struct moat_control *control = NULL;
  if (moat_control_open(&control, &cc, &err) < 0)
    die("%s", moat_error_msg(err));

  uint8_t token_secret[MOATD_SECRET_LEN];
  _cleanup_free_ char *secret_path = xasprintf("%s/e2b-secret", data_dir);
  if (moatd_secret_load(secret_path, token_secret, &err) < 0)
    die("%s", moat_error_msg(err));
  struct moat_api_config ac = {.listen = listen_addr,
                               .version = MOAT_VERSION,
                               .limits = &lim,
                               .token_secret = token_secret,
                               .token_secret_len = sizeof(token_secret),
                               .proxy_listen = proxy_listen,
                               .proxy_domain = proxy_domain,
                               .db_listen = db_listen,
                               .db_max_connections = db_max_connections,
                               .db_max_conns_per_ip = db_max_conns_per_ip,
                               .db_tls_cert = db_tls_cert,
                               .db_tls_key = db_tls_key,
                               .ui_dir = ui_dir};
  struct moat_api *api = NULL;
  if (moat_api_start(&api, control, &ac, &err) < 0) {
    moat_control_close(control);
    die("%s", moat_error_msg(err));
  }

  _cleanup_free_ char *host = xstrndup(listen_addr, (size_t)(strrchr(listen_addr, ':') - listen_addr));
  printf("moatd listening on http://%s:%u\n", host, moat_api_port(api));
  fflush(stdout);
  log_info("moatd listening on http://%s:%u", host, moat_api_port(api));

  if (proxy_listen) {
    printf("moatd port proxy on http://%.*s:%u\n", (int)(strrchr(proxy_listen, ':') - proxy_listen),
           proxy_listen, moat_api_proxy_port(api));
    fflush(stdout);
  }

  if (db_listen) {
    moat_control_set_db_port(control, moat_api_db_port(api)); /* --db-listen HOST:0: the port bound */
    printf("moatd database proxy on %.*s:%u\n", (int)(strrchr(db_listen, ':') - db_listen), db_listen,
           moat_api_db_port(api));
    fflush(stdout);
  }

  int sig = 0;
  while (sigwait(&set, &sig) != 0)
    ;
  log_info("%s: stopping (sandboxes keep running and are adopted on the next start)", strsignal(sig));
  moat_api_stop(api);
  moat_control_close(control);
  log_info("stopped");
  return 0;
}

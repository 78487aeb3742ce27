/* test_control_moatd.c -- the moatd binary's start-up contract: refuses to run when not root, when
 * another moatd holds the data dir or when the port is taken; starts, answers /healthz, writes a
 * 0600 API key, stops cleanly on SIGTERM, restarts after SIGTERM and after kill -9; `moatd key
 * create` makes a key for an org. Needs root (skips with 77 otherwise). */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/sha256.h"
#include "common/util.h"
#include "store/store.h"

#include "tap.h"

static char moatd[4096];
static char dir[] = "/tmp/moat-test-moatd-XXXXXX";
static char data[4200], tdir[4200];

struct proc {
  pid_t pid;
  int out; /* stdout+stderr of the child */
};

/* Starts moatd with args (NULL-terminated), stdout and stderr into a pipe. as_nobody drops to 65534. */
static struct proc spawn(char **args, bool as_nobody) {
  int p[2];
  struct proc r = {-1, -1};
  if (pipe2(p, O_CLOEXEC) < 0)
    return r;
  pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* no daemon outlives a test that dies */
    dup2(p[1], 1);
    dup2(p[1], 2);
    if (as_nobody &&
        (setgroups(0, NULL) < 0 || setresgid(65534, 65534, 65534) < 0 || setresuid(65534, 65534, 65534) < 0))
      _exit(99);
    execv(moatd, args);
    _exit(98);
  }
  close(p[1]);
  r.pid = pid;
  r.out = p[0];
  return r;
}

/* Reads the child's output until it contains needle or timeout_ms passes or EOF. Returns what was
 * read (caller frees). */
static char *read_until(int fd, const char *needle, int timeout_ms) {
  size_t len = 0, cap = 4096;
  char *buf = xmalloc(cap);
  buf[0] = 0;
  uint64_t end = now_ns() + (uint64_t)timeout_ms * 1000000ull;
  while (!(needle && strstr(buf, needle))) {
    int64_t left = (int64_t)(end - now_ns()) / 1000000;
    if (left <= 0)
      break;
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    if (poll(&pf, 1, (int)left) <= 0)
      break;
    if (len + 1024 >= cap)
      buf = xrealloc(buf, cap *= 2);
    ssize_t n = read(fd, buf + len, cap - len - 1);
    if (n <= 0)
      break;
    len += (size_t)n;
    buf[len] = 0;
  }
  return buf;
}

/* Waits for pid up to timeout_ms; returns its exit status (or 128+signal), -1 on timeout. */
static int wait_exit(pid_t pid, int timeout_ms) {
  for (int t = 0; t < timeout_ms; t += 20) {
    int st;
    pid_t r = waitpid(pid, &st, WNOHANG);
    if (r == pid)
      return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    usleep(20 * 1000);
  }
  return -1;
}

/* Runs moatd to completion; returns its exit code and sets *out. */
static int run_moatd(char **args, bool as_nobody, char **out) {
  struct proc p = spawn(args, as_nobody);
  *out = read_until(p.out, NULL, 10000);
  size_t len = strlen(*out);
  while (len > 0 && (*out)[len - 1] == '\n')
    (*out)[--len] = 0;
  close(p.out);
  int rc = wait_exit(p.pid, 10000);
  if (rc < 0) {
    kill(p.pid, SIGKILL);
    waitpid(p.pid, NULL, 0);
  }
  return rc;
}

static int http_status(int port, const char *path) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
    close(fd);
    return -1;
  }
  char req[256];
  snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", path);
  write_all(fd, req, strlen(req));
  char *resp = read_until(fd, "\r\n", 5000);
  close(fd);
  int st = -1;
  sscanf(resp, "HTTP/1.%*d %d", &st);
  free(resp);
  return st;
}

/* Starts a daemon on a free port; returns its proc and port (0 on failure). */
static struct proc start_daemon(int *port, char **log) {
  char *args[] = {
      moatd,         "--listen",    "127.0.0.1:0", "--data-dir",   data,   "--template-dir",
      tdir,          "--pool",      "0",           "--net-uplink", "none", /* never the host's default route
                                                                              in a test */
      "--db-listen", "127.0.0.1:0", /* nor the machine's 127.0.0.1:7432 */
      NULL};
  struct proc p = spawn(args, false);
  *log = read_until(p.out, "listening on http://127.0.0.1:", 60000);
  *port = 0;
  char *at = strstr(*log, "moatd listening on http://127.0.0.1:");
  if (at) {
    char *end = NULL;
    long v = strtol(at + strlen("moatd listening on http://127.0.0.1:"), &end, 10);
    if (end && (*end == '\n' || *end == '\r' || *end == 0))
      *port = (int)v;
  }
  return p;
}

int main(void) {
  if (geteuid() != 0) {
    printf("1..0 # SKIP needs root\n0 passed, 0 failed\n");
    return 77;
  }
  ssize_t n = readlink("/proc/self/exe", moatd, sizeof(moatd) - 16);
  if (n <= 0)
    return 1;
  moatd[n] = 0;
  *strrchr(moatd, '/') = 0; /* O/tests */
  *strrchr(moatd, '/') = 0; /* O */
  strcat(moatd, "/moatd");
  if (access(moatd, X_OK) != 0) {
    printf("1..0 # SKIP %s not built\n0 passed, 0 failed\n", moatd);
    return 77;
  }
  if (!mkdtemp(dir))
    return 1;
  chmod(dir, 0755); /* nobody must reach the data dir to be refused for the right reason */
  snprintf(data, sizeof(data), "%s/data", dir);
  snprintf(tdir, sizeof(tdir), "%s/templates", dir);
  char *out;

  /* Not root. */
  char *args_plain[] = {moatd, "--listen", "127.0.0.1:0", "--data-dir", data, NULL};
  int rc = run_moatd(args_plain, true, &out);
  CHECK(rc == 1 && strstr(out, "must run as root"), "refuses to run as nobody (rc %d): %s", rc, out);
  free(out);

  /* Data dir locked by someone else (this process plays the other moatd). */
  mkdir(data, 0700);
  char lock_path[4300];
  snprintf(lock_path, sizeof(lock_path), "%s/lock", data);
  int lfd = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
  CHECK(lfd >= 0 && fcntl(lfd, F_SETLK, &fl) == 0, "hold the data dir lock");
  rc = run_moatd(args_plain, false, &out);
  char want[64];
  snprintf(want, sizeof(want), "another moatd (pid %d)", (int)getpid());
  CHECK(rc == 1 && strstr(out, want), "refuses a locked data dir, naming the holder (rc %d): %s", rc, out);
  free(out);
  close(lfd); /* drops the lock */

  /* Port in use. */
  int sfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t sl = sizeof(sa);
  bind(sfd, (struct sockaddr *)&sa, sizeof(sa));
  listen(sfd, 1);
  getsockname(sfd, (struct sockaddr *)&sa, &sl);
  char listen_arg[64];
  snprintf(listen_arg, sizeof(listen_arg), "127.0.0.1:%d", ntohs(sa.sin_port));
  char *args_port[] = {moatd, "--listen", listen_arg, "--data-dir", data, "--db-listen", "none", NULL};
  rc = run_moatd(args_port, false, &out);
  CHECK(rc == 1 && strstr(out, "address already in use"), "refuses a port in use (rc %d): %s", rc, out);
  free(out);
  char *args_db_port[] = {moatd, "--listen",    "127.0.0.1:0", "--data-dir",
                          data,  "--db-listen", listen_arg,    NULL};
  rc = run_moatd(args_db_port, false, &out);
  CHECK(rc == 1 && strstr(out, "--db-listen") && strstr(out, "address already in use"),
        "refuses a --db-listen port in use, naming the flag (rc %d): %s", rc, out);
  free(out);
  close(sfd);

  /* Bad arguments. */
  char *args_bad[] = {moatd, "--pool", "lots", NULL};
  rc = run_moatd(args_bad, false, &out);
  CHECK(rc == 1 && strstr(out, "--pool"), "rejects --pool lots (rc %d)", rc);
  free(out);

  /* An uplink that does not exist: refused at start, naming it. */
  char *args_uplink[] = {moatd, "--listen",     "127.0.0.1:0", "--data-dir",  data,   "--template-dir",
                         tdir,  "--net-uplink", "eth9",        "--db-listen", "none", NULL};
  rc = run_moatd(args_uplink, false, &out);
  CHECK(rc == 1 && strstr(out, "uplink interface eth9 does not exist"),
        "refuses --net-uplink eth9, naming it (rc %d): %s", rc, out);
  free(out);

  /* A real start. */
  int port;
  char *log;
  struct proc d = start_daemon(&port, &log);
  CHECK(port > 0, "starts and prints its address (port %d)", port);
  if (port <= 0)
    printf("# %s\n", log);
  free(log);
  CHECK(port > 0 && http_status(port, "/healthz") == 200, "GET /healthz is 200");
  CHECK(port > 0 && http_status(port, "/v1/sandboxes") == 401, "GET /v1/sandboxes without a key is 401");
  struct stat st;
  char key_path[4300], db_path[4300];
  snprintf(key_path, sizeof(key_path), "%s/api-key", data);
  snprintf(db_path, sizeof(db_path), "%s/moat.db", data);
  CHECK(stat(key_path, &st) == 0 && (st.st_mode & 0777) == 0600, "api-key is 0600");
  CHECK(stat(db_path, &st) == 0 && (st.st_mode & 0777) == 0600, "moat.db is 0600");
  CHECK(stat(data, &st) == 0 && (st.st_mode & 0777) == 0700, "data dir is 0700");
  char *first_key = NULL;
  read_file(key_path, &first_key, NULL, NULL);

  rc = run_moatd(args_plain, false, &out);
  snprintf(want, sizeof(want), "another moatd (pid %d)", (int)d.pid);
  CHECK(rc == 1 && strstr(out, want), "a second moatd on the same data dir is refused: %s", out);
  free(out);

  /* key create while the daemon runs. */
  char *args_key[] = {moatd, "key", "create", "--data-dir", data, "--org", "other-org", NULL};
  rc = run_moatd(args_key, false, &out);
  char *second = out + strcspn(out, "\n");
  char want_e2b[80] = "";
  if (*second)
    *second++ = 0;
  CHECK(rc == 0 && strncmp(out, "moat_", 5) == 0 && strlen(out) == 69, "key create prints a key: %s", out);
  snprintf(want_e2b, sizeof(want_e2b), "E2B_API_KEY): e2b_%s", out + 5);
  CHECK(strstr(second, want_e2b) != NULL, "then its E2B form (e2b_ + the same hex): %s", second);
  struct moat_store *s = NULL;
  char hash[65], *org = NULL;
  moat_sha256_hex(out, strlen(out), hash);
  CHECK(moat_store_open(&s, db_path, NULL) == 0 && moat_store_key_lookup(s, hash, &org, NULL) == 0 &&
            strcmp(org, "other-org") == 0,
        "the new key is registered for other-org");
  free(org);
  org = NULL;
  free(out);
  char *args_key2[] = {moatd, "key", "create", "--data-dir", data, NULL};
  rc = run_moatd(args_key2, false, &out);
  CHECK(rc == 2, "key create without --org is a usage error (rc %d)", rc);
  free(out);

  /* SIGTERM: clean exit; restart keeps the key; kill -9: restart still works. */
  kill(d.pid, SIGTERM);
  rc = wait_exit(d.pid, 15000);
  CHECK(rc == 0, "SIGTERM: exit 0 (rc %d)", rc);
  close(d.out);
  d = start_daemon(&port, &log);
  free(log);
  char *second_key = NULL;
  read_file(key_path, &second_key, NULL, NULL);
  CHECK(port > 0 && first_key && second_key && strcmp(first_key, second_key) == 0,
        "restart after SIGTERM serves again with the same key");
  kill(d.pid, SIGKILL);
  waitpid(d.pid, NULL, 0);
  close(d.out);
  d = start_daemon(&port, &log);
  free(log);
  CHECK(port > 0 && http_status(port, "/healthz") == 200, "restart after kill -9 serves again");
  kill(d.pid, SIGINT);
  rc = wait_exit(d.pid, 15000);
  CHECK(rc == 0, "SIGINT: exit 0 (rc %d)", rc);
  close(d.out);
  if (s) {
    char h1[65];
    first_key[strcspn(first_key, "\n")] = 0;
    moat_sha256_hex(first_key, strlen(first_key), h1);
    CHECK(moat_store_key_lookup(s, h1, &org, NULL) == 0 && strcmp(org, "default") == 0,
          "the key file's key belongs to org default");
    free(org);
    moat_store_close(s);
  }
  free(first_key);
  free(second_key);

  rm_rf(dir, NULL);
  return tap_done();
}

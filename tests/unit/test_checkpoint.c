/* test_checkpoint.c -- CRIU checkpoint and restore of real sandboxes through the linux driver:
 * a process holding state in memory and files on disk is checkpointed, restored twice (at once),
 * both copies carry the state and diverge independently, each in its own uid range; a restored
 * copy is checkpointed and restored again; a hibernate (checkpoint without leave_running) ends
 * the sandbox and wakes from the image; nothing is left behind after destroying them all.
 * Needs root, a built base template and a CRIU that passes `criu check` (skips with 77 without,
 * saying why). */
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/util.h"
#include "host/driver.h"
#include "proto/client/guest_client.h"

#include "tap.h"

static void ok(bool cond, const char *name, const char *detail) {
  bool show = !cond && detail;
  tap_ok(cond, "%s%s%s", name, show ? ": " : "", show ? detail : "");
}

static char *sh(const struct moat_guest_ep *sock, const char *cmd, int *code) {
  char *argv[] = {"/bin/sh", "-c", (char *)cmd, NULL};
  struct moat_exec_req req = {.argv = argv, .timeout_ms = 10000};
  struct moat_exec_result res;
  moat_error *err = NULL;
  if (moat_guest_exec(sock, &req, &res, &err) < 0) {
    char *m = xasprintf("exec failed: %s", moat_error_msg(err));
    moat_error_free(&err);
    if (code)
      *code = -100;
    return m;
  }
  if (code)
    *code = res.exit_code;
  char *out = xstrdup(res.out);
  out[strcspn(out, "\n")] = '\0';
  moat_exec_result_free(&res);
  return out;
}

/* The state process: a token drawn at start and kept only in memory, a count of SIGUSR1s it
 * received and a tick counter, written to /tmp/state every 20 ms. */
static const char *state_py = "import os, signal, time, random\n"
                              "tok = '%016x' % random.getrandbits(64)\n"
                              "bumps = 0\n"
                              "def bump(s, f):\n"
                              "    global bumps\n"
                              "    bumps += 1\n"
                              "signal.signal(signal.SIGUSR1, bump)\n"
                              "n = 0\n"
                              "while True:\n"
                              "    n += 1\n"
                              "    with open('/tmp/state.tmp', 'w') as f:\n"
                              "        f.write('%s %d %d' % (tok, bumps, n))\n"
                              "    os.rename('/tmp/state.tmp', '/tmp/state')\n"
                              "    time.sleep(0.02)\n";

struct state {
  char tok[32];
  int bumps;
  long n;
};

static bool read_state(const struct moat_guest_ep *sock, struct state *st) {
  _cleanup_free_ char *s = sh(sock, "cat /tmp/state", NULL);
  memset(st, 0, sizeof(*st));
  return sscanf(s, "%31s %d %ld", st->tok, &st->bumps, &st->n) == 3;
}

/* The state process is alive and ticking: its counter advances past `after`. */
static bool ticking(const struct moat_guest_ep *sock, long after, struct state *st) {
  for (int i = 0; i < 100; i++) {
    if (read_state(sock, st) && st->n > after)
      return true;
    usleep(20000);
  }
  return false;
}

static long host_uid_of(pid_t pid) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/status", pid);
  _cleanup_free_ char *s = NULL;
  if (read_file(path, &s, NULL, NULL) < 0)
    return -1;
  char *u = strstr(s, "\nUid:");
  return u ? (long)strtoul(u + 5, NULL, 10) : -1;
}

/* pid has exited (gone or a zombie) within two seconds. */
static bool gone(pid_t pid) {
  for (int i = 0; i < 100; i++) {
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/stat", pid);
    _cleanup_free_ char *s = NULL;
    if (read_file(path, &s, NULL, NULL) < 0)
      return true;
    char *p = strrchr(s, ')');
    if (p && p[1] == ' ' && p[2] == 'Z')
      return true;
    usleep(20000);
  }
  return false;
}

/* True when pid's v2 cgroup reports frozen (cgroup.events "frozen 1"). */
static bool frozen(pid_t pid) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/cgroup", pid);
  _cleanup_free_ char *cg = NULL;
  if (read_file(path, &cg, NULL, NULL) < 0)
    return false;
  char *v2 = strstr(cg, "0::");
  if (!v2)
    return false;
  v2[strcspn(v2, "\n")] = '\0';
  static const char *roots[] = {"/sys/fs/cgroup/unified", "/sys/fs/cgroup"};
  for (size_t i = 0; i < 2; i++) {
    _cleanup_free_ char *ev_path = xasprintf("%s%s/cgroup.events", roots[i], v2 + 3);
    _cleanup_free_ char *ev = NULL;
    if (read_file(ev_path, &ev, NULL, NULL) == 0)
      return strstr(ev, "frozen 1") != NULL;
  }
  return false;
}

struct restore_job {
  struct moat_host *h;
  const char *dir;
  struct moat_instance inst;
  int r;
  moat_error *err;
};

static void *restore_thread(void *arg) {
  struct restore_job *j = arg;
  struct moat_limits lim = {.cpu = 1, .memory_mb = 512, .pids = 256, .disk_mb = 256};
  j->r = moat_host_restore(j->h, j->dir, "base", &lim, 0, &j->inst, &j->err);
  return NULL;
}

/* Lines of `cmd` output. */
static int count_lines(const char *cmd) {
  FILE *p = popen(cmd, "r");
  int n = 0, c;
  if (!p)
    return -1;
  while ((c = fgetc(p)) != EOF)
    n += c == '\n';
  pclose(p);
  return n;
}

int main(void) {
  const char *tdir = getenv("MOAT_TEST_TEMPLATE_DIR");
  if (!tdir)
    tdir = "/var/tmp/moat-test-templates";
  _cleanup_free_ char *ready = xasprintf("%s/base/ready", tdir);
  if (geteuid() != 0 || access(ready, F_OK) < 0) {
    printf("1..0 # SKIP needs root and a built base template in %s\n0 passed, 0 failed\n", tdir);
    return 77;
  }
  const char *guest = getenv("MOAT_GUEST");
  if (!guest)
    guest = "build/moat-guest";
  char data[] = "/var/tmp/moat-test-ckpt-XXXXXX";
  if (!mkdtemp(data)) {
    perror("mkdtemp");
    return 1;
  }
  struct moat_host_config cfg = {
      .data_dir = data, .template_dir = tdir, .guest_path = guest, .pool_template = "base", .max_slots = 64};
  struct moat_host *h = NULL;
  moat_error *err = NULL;
  if (moat_host_init(&h, &cfg, &err) < 0) {
    printf("not ok 1 - host init: %s\n0 passed, 1 failed\n", moat_error_msg(err));
    return 1;
  }
  moat_host_reconcile(h, NULL);
  printf("# %s\n", moat_host_criu_status(h));
  if (!moat_host_can_checkpoint(h)) {
    struct moat_limits lim = {.cpu = 1, .memory_mb = 256, .pids = 128, .disk_mb = 64};
    struct moat_instance x;
    bool created = moat_host_create(h, "base", &lim, &x, &err) == 0;
    int r = created ? moat_host_checkpoint(h, x.slot, data, true, NULL, &err) : -1;
    ok(created && r < 0 && err && err->status == ENOSYS, "without CRIU checkpoint fails with ENOSYS",
       moat_error_msg(err));
    if (created)
      moat_host_destroy(h, x.slot, NULL);
    moat_host_shutdown(h);
    rm_rf(data, NULL);
    printf("# SKIP the rest: no working CRIU on this host (%s)\n", moat_host_criu_status(NULL));
    return tap_done() == 0 ? 77 : 1;
  }

  struct restore_job jb = {.h = h, .r = -1}, jc = {.h = h, .r = -1}, jd = {.h = h, .r = -1},
                     je = {.h = h, .r = -1};
  _cleanup_free_ char *d1 = xasprintf("%s/ckpt-a", data), *d2 = xasprintf("%s/ckpt-b", data),
                      *d3 = xasprintf("%s/ckpt-c", data);
  struct moat_limits lim = {.cpu = 1, .memory_mb = 512, .pids = 256, .disk_mb = 256};
  struct moat_instance a;
  int r = moat_host_create(h, "base", &lim, &a, &err);
  ok(r == 0, "create sandbox A", moat_error_msg(err));
  if (r < 0)
    return 1;
  int code;
  {
    char *argv[] = {"/bin/sh", "-c", "cat > /root/state.py", NULL};
    struct moat_exec_req req = {
        .argv = argv, .timeout_ms = 10000, .stdin_data = state_py, .stdin_len = strlen(state_py)};
    struct moat_exec_result res;
    r = moat_guest_exec(&a.guest, &req, &res, &err);
    if (r == 0)
      moat_exec_result_free(&res);
  }
  free(sh(&a.guest,
          "echo disk-A > /root/file.txt && mkdir -p /opt/d && rm -rf /etc/motd && "
          "(python3 /root/state.py </dev/null >/dev/null 2>&1 & echo $! > /root/state.pid)",
          &code));
  struct state sa;
  ok(ticking(&a.guest, 0, &sa), "A's state process runs", sa.tok);

  /* an attached exec stream is open during the checkpoint: the guest drops it, its process runs on */
  struct moat_proc_stream *stream = NULL;
  int spid = 0;
  {
    char *argv[] = {"/bin/sh", "-c", "while true; do echo tick; sleep 0.1; done", NULL};
    struct moat_exec_req req = {.argv = argv};
    struct moat_exec_opts opts = {.tag = "ticker", .pty_cols = 80, .pty_rows = 24}; /* on a pty, too */
    r = moat_guest_exec_start(&a.guest, &req, &opts, &stream, &spid, &err);
    ok(r == 0 && stream, "an exec stream on a pty is attached", moat_error_msg(err));
    moat_error_free(&err);
  }

  /* checkpoint A, leave it running */
  mkdir(d1, 0700);
  struct moat_checkpoint_info info;
  memset(&info, 0, sizeof(info));
  r = moat_host_checkpoint(h, a.slot, d1, true, &info, &err);
  ok(r == 0, "checkpoint A (leave running)", moat_error_msg(err));
  if (r < 0)
    goto out;
  printf("# checkpoint A: %.1f ms total, %.1f ms frozen, %llu bytes memory, %llu bytes disk\n",
         (double)info.total_ns / 1e6, (double)info.frozen_ns / 1e6, (unsigned long long)info.memory_bytes,
         (unsigned long long)info.disk_bytes);
  struct state sa2;
  ok(ticking(&a.guest, sa.n, &sa2) && strcmp(sa2.tok, sa.tok) == 0, "A runs on after its checkpoint",
     sa2.tok);
  if (stream) {
    struct moat_proc_event ev;
    int got;
    do
      got = moat_proc_stream_next(stream, &ev, 3000, &err);
    while (got == 1 && ev.type != MOAT_PROC_EXIT);
    ok(got == 0, "the checkpoint cut the stream (guest closed it)", moat_error_msg(err));
    moat_error_free(&err);
    moat_proc_stream_close(stream);
    _cleanup_free_ char *alive =
        sh(&a.guest, "kill -0 $(pgrep -f 'echo tick' | head -1) && echo alive", &code);
    ok(strcmp(alive, "alive") == 0, "its process runs on", alive);
  }

  /* two restores at once */
  jb.dir = jc.dir = d1;
  pthread_t tb, tc;
  pthread_create(&tb, NULL, restore_thread, &jb);
  pthread_create(&tc, NULL, restore_thread, &jc);
  pthread_join(tb, NULL);
  pthread_join(tc, NULL);
  ok(jb.r == 0, "restore B from A's checkpoint", moat_error_msg(jb.err));
  ok(jc.r == 0, "restore C from A's checkpoint at the same time", moat_error_msg(jc.err));
  if (jb.r < 0 || jc.r < 0)
    goto out;
  printf("# restores (concurrent): B %.1f ms, C %.1f ms\n", (double)jb.inst.ready_ns / 1e6,
         (double)jc.inst.ready_ns / 1e6);
  const struct moat_instance *b = &jb.inst, *c = &jc.inst;
  ok(b->slot != a.slot && c->slot != a.slot && b->slot != c->slot, "each copy has its own slot", NULL);
  long ua = host_uid_of(a.pid), ub = host_uid_of(b->pid), uc = host_uid_of(c->pid);
  _cleanup_free_ char *uids = xasprintf("A %ld B %ld C %ld", ua, ub, uc);
  ok(ua > 0 && ub > 0 && uc > 0 && ua != ub && ub != uc && ua != uc,
     "each copy runs as its own host uid range", uids);
  struct state sb, sc;
  ok(ticking(&b->guest, 0, &sb) && strcmp(sb.tok, sa.tok) == 0,
     "B has A's memory (same token, process runs on)", sb.tok);
  ok(ticking(&c->guest, 0, &sc) && strcmp(sc.tok, sa.tok) == 0, "C has A's memory", sc.tok);
  _cleanup_free_ char *fb = sh(&b->guest, "cat /root/file.txt; test -e /etc/motd && echo motd", &code);
  ok(strcmp(fb, "disk-A") == 0, "B has A's files (and A's deletion)", fb);
  _cleanup_free_ char *idb = sh(&b->guest, "id -u; stat -c %u /root/file.txt", &code);
  ok(strcmp(idb, "0") == 0, "root inside B, files owned by B's root", idb);
  _cleanup_free_ char *own =
      sh(&b->guest, "stat -c %u:%g /root/file.txt /root/state.py | sort -u | tr '\\n' ' '", &code);
  ok(strcmp(own, "0:0 ") == 0, "B's copied files belong to root of B's range", own);
  /* the guest's channel cannot be touched from inside (moatd would follow a planted symlink) */
  const char *tamper =
      "rm -f /run/moat/.sock/guest.sock; mv /run/moat/.sock /run/moat/x; umount -l /run/moat/.sock; "
      "ln -s /etc/passwd /run/moat/.sock/guest.sock; ls /run/moat/.sock >/dev/null 2>&1 || echo closed";
  _cleanup_free_ char *tpa = sh(&a.guest, tamper, &code), *tpb = sh(&b->guest, tamper, &code);
  struct stat sta, stb;
  bool socks = lstat(a.guest.path, &sta) == 0 && S_ISSOCK(sta.st_mode) && lstat(b->guest.path, &stb) == 0 &&
               S_ISSOCK(stb.st_mode);
  ok(strcmp(tpa, "closed") == 0 && strcmp(tpb, "closed") == 0 && socks,
     "root inside can neither enter nor replace the guest's channel (created, restored)", tpb);
  ok(moat_guest_ping(&a.guest, 2000, NULL) == 0 && moat_guest_ping(&b->guest, 2000, NULL) == 0,
     "both still answer", NULL);

  /* diverge: B gets two signals and a file; C neither */
  free(sh(&b->guest,
          "kill -USR1 $(cat /root/state.pid); sleep 0.1; kill -USR1 $(cat /root/state.pid); "
          "echo only-b > /root/only-b",
          &code));
  free(sh(&c->guest, "echo only-c > /root/only-c", &code));
  usleep(200000);
  read_state(&b->guest, &sb);
  read_state(&c->guest, &sc);
  struct state sa3;
  read_state(&a.guest, &sa3);
  _cleanup_free_ char *bumps = xasprintf("A %d B %d C %d", sa3.bumps, sb.bumps, sc.bumps);
  ok(sb.bumps == 2 && sc.bumps == 0 && sa3.bumps == 0, "memory diverges: only B counted its signals", bumps);
  _cleanup_free_ char *fc = sh(&c->guest, "ls /root | tr '\\n' ' '", &code);
  ok(strstr(fc, "only-c") && !strstr(fc, "only-b"), "disk diverges: C sees its file, not B's", fc);
  _cleanup_free_ char *fa = sh(&a.guest, "ls /root | tr '\\n' ' '", &code);
  ok(!strstr(fa, "only-c") && !strstr(fa, "only-b"), "A sees neither", fa);

  /* a restore that fails (an image missing) leaves nothing behind: checked at the end */
  {
    _cleanup_free_ char *bad = xasprintf("%s/ckpt-bad", data);
    _cleanup_free_ char *cp = xasprintf("cp -a %s %s && rm %s/images/pstree.img", d1, bad, bad);
    struct restore_job jx = {.h = h, .dir = bad, .r = -1};
    if (system(cp) == 0)
      restore_thread(&jx);
    ok(jx.r < 0 && jx.err && strstr(moat_error_msg(jx.err), "criu restore"),
       "a broken checkpoint fails to restore", jx.r == 0 ? "it restored" : moat_error_msg(jx.err));
    if (jx.r == 0)
      moat_host_destroy(h, jx.inst.slot, NULL);
    moat_error_free(&jx.err);
    struct moat_instance none;
    r = moat_host_restore(h, d1, "code-interpreter", &lim, 0, &none, &err);
    ok(r < 0 && err && err->status == EINVAL, "restoring under another template is refused",
       moat_error_msg(err));
    moat_error_free(&err);
  }

  /* a checkpoint of a restored copy restores */
  mkdir(d2, 0700);
  r = moat_host_checkpoint(h, b->slot, d2, true, &info, &err);
  ok(r == 0, "checkpoint B (a restored sandbox)", moat_error_msg(err));
  jd.dir = d2;
  if (r == 0)
    restore_thread(&jd);
  ok(r == 0 && jd.r == 0, "restore D from B's checkpoint", moat_error_msg(jd.err));
  struct state sd;
  if (jd.r == 0 && r == 0) {
    ok(ticking(&jd.inst.guest, 0, &sd) && strcmp(sd.tok, sa.tok) == 0 && sd.bumps == 2,
       "D has B's memory (token, two signals)", sd.tok);
    _cleanup_free_ char *fd = sh(&jd.inst.guest, "cat /root/only-b", &code);
    ok(strcmp(fd, "only-b") == 0, "D has B's files", fd);
  }

  /* hibernate C (checkpoint without leave_running: C stays, frozen, until destroyed) and wake it */
  mkdir(d3, 0700);
  pid_t cpid = c->pid;
  r = moat_host_checkpoint(h, c->slot, d3, false, &info, &err);
  ok(r == 0, "hibernate C", moat_error_msg(err));
  ok(kill(cpid, 0) == 0 && frozen(cpid), "C stays whole and frozen after hibernate's checkpoint", NULL);
  moat_host_destroy(h, c->slot, NULL);
  ok(gone(cpid), "C's processes are gone once destroyed", NULL);
  je.dir = d3;
  if (r == 0)
    restore_thread(&je);
  ok(r == 0 && je.r == 0, "wake C as E", moat_error_msg(je.err));
  struct state se;
  if (je.r == 0 && r == 0) {
    ok(ticking(&je.inst.guest, 0, &se) && strcmp(se.tok, sa.tok) == 0 && se.bumps == 0, "E has C's memory",
       se.tok);
    _cleanup_free_ char *fe = sh(&je.inst.guest, "cat /root/only-c", &code);
    ok(strcmp(fe, "only-c") == 0, "E has C's files", fe);
  }

  /* a sandbox with a veth to the host's network (as net.c gives one): CRIU cannot rebuild the
   * far end, so the restore gets an empty net namespace with lo up (the host adds a new veth) */
  {
    struct moat_instance g, gr;
    r = moat_host_create(h, "base", &lim, &g, &err);
    _cleanup_free_ char *veth = xasprintf("ip link add mck%d type veth peer name eth0 netns %d && "
                                          "nsenter -t %d -n ip addr add 10.99.0.2/24 dev eth0 && "
                                          "nsenter -t %d -n ip link set eth0 up",
                                          g.slot, g.pid, g.pid, g.pid);
    bool has_veth = r == 0 && system(veth) == 0;
    ok(has_veth, "a sandbox with a veth", moat_error_msg(err));
    moat_error_free(&err);
    _cleanup_free_ char *dg = xasprintf("%s/ckpt-veth", data);
    mkdir(dg, 0700);
    int rc = has_veth ? moat_host_checkpoint(h, g.slot, dg, true, &info, &err) : -1;
    ok(rc == 0, "its checkpoint", moat_error_msg(err));
    moat_error_free(&err);
    rc = rc == 0 ? moat_host_restore(h, dg, "base", &lim, 0, &gr, &err) : -1;
    ok(rc == 0, "its restore", moat_error_msg(err));
    moat_error_free(&err);
    if (rc == 0) {
      _cleanup_free_ char *net =
          sh(&gr.guest, "ls /sys/class/net | tr '\\n' ' '; cat /sys/class/net/lo/flags", &code);
      ok(strcmp(net, "lo 0x9") == 0, "the restored copy has lo only, up", net);
      _cleanup_free_ char *lo = sh(
          &gr.guest,
          "python3 -c 'import socket; s=socket.socket(); s.bind((\"127.0.0.1\", 0)); print(\"ok\")'", &code);
      ok(strcmp(lo, "ok") == 0, "and 127.0.0.1 works there", lo);
      moat_host_destroy(h, gr.slot, NULL);
    }
    if (r == 0)
      moat_host_destroy(h, g.slot, NULL);
    _cleanup_free_ char *del = xasprintf("ip link del mck%d 2>/dev/null", g.slot);
    if (r == 0 && system(del) < 0)
      perror("system");
  }

  /* moatd restarts: an adopted sandbox checkpoints again (its writable layer is found again), and
   * one frozen by a checkpoint that the restart cut short is thawed at adopt */
  if (je.r == 0 && jd.r == 0) {
    _cleanup_free_ char *marker = xasprintf("%s/host/slots/%d/checkpointing", data, a.slot);
    r = moat_host_pause(h, a.slot, &err);
    ok(r == 0, "freeze A as an interrupted checkpoint leaves it", moat_error_msg(err));
    FILE *mf = fopen(marker, "w");
    if (mf) {
      fputs("was_frozen 0\n", mf);
      fclose(mf);
    }
    moat_host_shutdown(h);
    r = moat_host_init(&h, &cfg, &err);
    ok(r == 0, "host re-init", moat_error_msg(err));
    if (r < 0)
      return 1;
    struct moat_instance x[4];
    int adopted = 0;
    const struct moat_instance *all[] = {&a, &jb.inst, &jd.inst, &je.inst};
    for (size_t i = 0; i < ARRAY_SIZE(all); i++)
      adopted += moat_host_adopt(h, all[i]->slot, all[i]->pid, all[i]->start_time, &x[i], NULL) == 1;
    ok(adopted == 4, "the four running sandboxes are adopted", NULL);
    moat_host_reconcile(h, NULL);
    a = x[0]; /* the endpoints of the host that adopted them (the old host's are gone with it) */
    ok(moat_guest_ping(&a.guest, 2000, &err) == 0 && access(marker, F_OK) < 0,
       "A, frozen by an interrupted checkpoint, runs again after adopt", moat_error_msg(err));
    moat_error_free(&err);
    _cleanup_free_ char *d4 = xasprintf("%s/ckpt-a2", data);
    mkdir(d4, 0700);
    r = moat_host_checkpoint(h, a.slot, d4, true, &info, &err);
    ok(r == 0, "checkpoint of an adopted sandbox", moat_error_msg(err));
    struct restore_job jf = {.h = h, .dir = d4, .r = -1};
    if (r == 0)
      restore_thread(&jf);
    struct state sf;
    ok(jf.r == 0 && ticking(&jf.inst.guest, 0, &sf) && strcmp(sf.tok, sa.tok) == 0,
       "its restore has A's memory", jf.r ? moat_error_msg(jf.err) : sf.tok);
    _cleanup_free_ char *ff = jf.r == 0 ? sh(&jf.inst.guest, "cat /root/file.txt", &code) : xstrdup("");
    ok(strcmp(ff, "disk-A") == 0, "and A's files", ff);
    if (jf.r == 0)
      moat_host_destroy(h, jf.inst.slot, NULL);
    moat_error_free(&jf.err);
  }

out:
  moat_host_destroy(h, a.slot, NULL);
  if (jb.r == 0)
    moat_host_destroy(h, jb.inst.slot, NULL);
  if (jc.r == 0)
    moat_host_destroy(h, jc.inst.slot, NULL); /* a no-op when its hibernate ended it */
  if (jd.r == 0)
    moat_host_destroy(h, jd.inst.slot, NULL);
  if (je.r == 0)
    moat_host_destroy(h, je.inst.slot, NULL);
  moat_host_shutdown(h); /* runs the queued teardowns */
  _cleanup_free_ char *slots = xasprintf("ls -A %s/host/slots", data);
  ok(count_lines(slots) == 0, "no slot dirs left", NULL);
  _cleanup_free_ char *claims = xasprintf("grep -lx '%s' /run/moat/ranges/* 2>/dev/null", data);
  ok(count_lines(claims) == 0, "no uid-range claims left", NULL);
  _cleanup_free_ char *loops = xasprintf("grep -l '%s' /sys/block/loop*/loop/backing_file 2>/dev/null", data);
  ok(count_lines(loops) == 0, "no loop devices left", NULL);
  r = moat_host_init(&h, &cfg, &err);
  int cleaned = r == 0 ? moat_host_reconcile(h, &err) : -1;
  ok(cleaned == 0, "reconcile finds no leftover cgroups, dirs or claims", NULL);
  if (r == 0)
    moat_host_shutdown(h);
  moat_error_free(&err);
  moat_error_free(&jb.err);
  moat_error_free(&jc.err);
  moat_error_free(&jd.err);
  moat_error_free(&je.err);
  if (getenv("MOAT_TEST_KEEP")) /* CRIU's logs stay for a look */
    printf("# kept %s\n", data);
  else
    rm_rf(data, NULL);
  return tap_done();
}

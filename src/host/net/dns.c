/* dns.c -- moatd's DNS for sandboxes: a UDP resolver in the routing namespace that every sandbox's
 * /etc/resolv.conf names. A query's source address says which sandbox asks. A name its policy
 * denies gets NXDOMAIN (and, when the name is listed in deny, moatd resolves it itself and puts
 * the addresses in deny_dns, so they are not reachable by raw IP once learned); an allowed name is
 * forwarded to the upstream resolver (reached from the uplink namespace) and, when the sandbox's
 * default is deny, the answer's A records are added to allow_dns for (sandbox, address) with a
 * timeout of the answer's TTL (at least NET_MIN_TTL_S) before the answer is relayed. Over TCP
 * (a resolver's retry of a truncated answer) each connection gets a thread that asks the upstream
 * over TCP the same way.
 *
 * Fair shares: each sandbox has at most PENDING_PER_SANDBOX queries waiting for the upstream and
 * TCP_PER_SANDBOX TCP connections. When the table of pending queries (PENDING) or of TCP
 * connections (TCP_MAX_CONNS) is full, a sandbox holding fewer entries than the largest holder
 * takes one of the largest holder's (its oldest query is forgotten, its oldest connection shut
 * down): however many sandboxes flood, each one still gets about an equal share.
 *
 * Upstreams: the one --net-dns-upstream names, else the IPv4 nameservers of resolv_path (at most
 * MAX_UPSTREAMS, as glibc reads them), re-read when that file changes (DHCP, a VPN, NetworkManager
 * rewrite it). A loopback nameserver (systemd-resolved's stub 127.0.0.53, a local dnsmasq) is
 * reached too: the upstream sockets live in the uplink namespace, which for an interface uplink is
 * moatd's own. Queries go to the one in use; when a query it was sent has no answer within
 * FAILOVER_MS the next one is used from then on (the sandbox's resolver retries and reaches it).
 * An answer counts only from the address and port its query went to. With no upstream a query is
 * answered SERVFAIL.
 *
 * State: struct net_dns, one per struct moat_net (n->dns), made by dns_start and freed by
 * dns_stop. Its three locks are leaves (nothing is taken while one is held, but up_lock inside
 * pend_lock): pend_lock guards the pending queries, tcp_lock the table of TCP connections, up_lock
 * the upstreams.
 */
#include "net_internal.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../common/log.h"
#include "../../common/util.h"

#define NET_MIN_TTL_S 60
#define NET_MAX_TTL_S 86400
#define PENDING 1024 /* divides 65536: an id's entry is pend[id % PENDING] */
#define PENDING_TIMEOUT_MS 5000
#define PENDING_PER_SANDBOX 64
#define SWEEP_MS 100
#define MAX_UPSTREAMS 3      /* glibc's MAXNS */
#define FAILOVER_MS 2000     /* a query unanswered this long: the next upstream takes over */
#define RESOLV_CHECK_MS 2000 /* how often resolv_path is looked at for a change */

enum { P_FREE = 0, P_CLIENT, P_LEARN_DENY };

struct pending {
  int kind;
  uint16_t our_id, client_id;
  struct sockaddr_in client;
  int slot;
  int64_t deadline_ms, sent_ms;
  struct sockaddr_in to; /* the upstream it was sent to: only its answer counts */
  bool late;             /* counted towards a failover already */
  char name[MOAT_NET_MAX_NAME + 1];
};

#define TCP_MAX_CONNS 64
#define TCP_PER_SANDBOX 4
#define TCP_TIMEOUT_S 5

struct tcp_job {
  struct moat_net *n;
  int fd;
  struct sockaddr_in peer;
  unsigned bucket;
  int index; /* in tcp_table, or -1 once shut down to make room */
  uint64_t since_ns;
};

struct net_dns {
  /* Entries per sandbox: one bucket per slot of the pool, and a last one for addresses of none. */
  unsigned n_buckets;
  /* pend_lock: pend, next_id, pend_count, last_sweep_ms (the UDP thread and the TCP threads,
   * through learn_denied, share them) */
  pthread_mutex_t pend_lock;
  struct pending pend[PENDING];
  uint16_t next_id;
  unsigned *pend_count; /* n_buckets */
  int64_t last_sweep_ms;
  /* tcp_lock: tcp_table and tcp_count, the connections served (TCP_MAX_CONNS, TCP_PER_SANDBOX
   * each) */
  pthread_mutex_t tcp_lock;
  struct tcp_job *tcp_table[TCP_MAX_CONNS];
  unsigned *tcp_count; /* n_buckets */
  int tcp_conns;       /* atomic: connection threads alive */
  /* up_lock: up, n_up, up_cur, failover_ms (the UDP thread, inside pend_lock, and the TCP threads
   * read them; the UDP thread changes them) */
  pthread_mutex_t up_lock;
  struct sockaddr_in up[MAX_UPSTREAMS];
  unsigned n_up, up_cur;
  int64_t failover_ms;
  /* the UDP thread's own: resolv_path as last read */
  struct stat resolv_st;
  bool resolv_read;
  int64_t resolv_check_ms;
};

static unsigned bucket_of(const struct net_dns *d, int slot) {
  return slot >= 0 && (unsigned)slot < d->n_buckets - 1 ? (unsigned)slot : d->n_buckets - 1;
}

/* ---- upstreams ---- */

/* "IP" or "IP:PORT" into out. 0 or -1. */
static int parse_addr_port(const char *s, struct sockaddr_in *out) {
  memset(out, 0, sizeof(*out));
  out->sin_family = AF_INET;
  out->sin_port = htons(53);
  char tmp[64];
  if (strlen(s) >= sizeof(tmp))
    return -1;
  snprintf(tmp, sizeof(tmp), "%s", s);
  char *colon = strchr(tmp, ':');
  if (colon) {
    *colon = '\0';
    uint64_t p;
    if (parse_u64(colon + 1, &p) < 0 || p == 0 || p > 65535)
      return -1;
    out->sin_port = htons((uint16_t)p);
  }
  return inet_pton(AF_INET, tmp, &out->sin_addr) == 1 ? 0 : -1;
}

int dns_check_fixed(const char *fixed, moat_error **err) {
  struct sockaddr_in a;
  if (parse_addr_port(fixed, &a) < 0)
    return moat_error_set(err, EINVAL, "DNS upstream %s: expected IPv4 address or IP:PORT", fixed);
  return 0;
}

static bool same_addr(const struct sockaddr_in *a, const struct sockaddr_in *b) {
  return a->sin_addr.s_addr == b->sin_addr.s_addr && a->sin_port == b->sin_port;
}

static void addr_text(const struct sockaddr_in *a, char *out, size_t cap) {
  char ip[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &a->sin_addr, ip, sizeof(ip));
  snprintf(out, cap, "%s:%u", ip, ntohs(a->sin_port));
}

/* The IPv4 nameservers of resolv.conf text (glibc's reading: "nameserver ADDR" lines, at most
 * MAX_UPSTREAMS); *skipped counts the others (IPv6, past the limit). Returns how many. */
static unsigned parse_resolv(char *text, struct sockaddr_in *out, unsigned *skipped) {
  unsigned n = 0;
  *skipped = 0;
  char *save = NULL;
  for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    char kw[16], addr[64];
    if (sscanf(line, "%15s %63s", kw, addr) != 2 || strcmp(kw, "nameserver") != 0)
      continue;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(53)};
    if (n < MAX_UPSTREAMS && inet_pton(AF_INET, addr, &a.sin_addr) == 1)
      out[n++] = a;
    else
      (*skipped)++;
  }
  return n;
}

/* Sets the upstreams (the UDP thread, or dns_start before it runs). */
static void set_upstreams(struct moat_net *n, const struct sockaddr_in *up, unsigned count) {
  struct net_dns *d = n->dns;
  pthread_mutex_lock(&d->up_lock);
  memcpy(d->up, up, count * sizeof(*up));
  d->n_up = count;
  d->up_cur = 0;
  pthread_mutex_unlock(&d->up_lock);
}

/* Reads n->resolv_path when it changed since it was last read (or always, with force). */
static void reload_resolv(struct moat_net *n, bool force) {
  struct net_dns *d = n->dns;
  struct stat st;
  if (stat(n->resolv_path, &st) < 0) {
    if (force || d->resolv_read)
      log_warn("dns: %s: %s: sandboxes' lookups %s", n->resolv_path, strerror(errno),
               d->resolv_read ? "keep the upstreams read before"
                              : "fail (SERVFAIL) until it has a nameserver");
    d->resolv_read = false;
    return;
  }
  if (!force && d->resolv_read && st.st_dev == d->resolv_st.st_dev && st.st_ino == d->resolv_st.st_ino &&
      st.st_size == d->resolv_st.st_size && st.st_mtim.tv_sec == d->resolv_st.st_mtim.tv_sec &&
      st.st_mtim.tv_nsec == d->resolv_st.st_mtim.tv_nsec)
    return;
  _cleanup_free_ char *text = NULL;
  if (read_file(n->resolv_path, &text, NULL, NULL) < 0)
    return;
  d->resolv_st = st;
  d->resolv_read = true;
  struct sockaddr_in up[MAX_UPSTREAMS];
  unsigned skipped;
  unsigned count = parse_resolv(text, up, &skipped);
  set_upstreams(n, up, count);
  char list[MAX_UPSTREAMS * 24] = "";
  for (unsigned i = 0; i < count; i++) {
    char a[24];
    addr_text(&up[i], a, sizeof(a));
    snprintf(list + strlen(list), sizeof(list) - strlen(list), "%s%s", i ? " " : "", a);
  }
  if (!count)
    log_warn("dns: %s names no IPv4 nameserver%s: sandboxes' lookups fail (SERVFAIL) until it does",
             n->resolv_path, skipped ? " (IPv6 ones are not used)" : "");
  else
    log_info("dns: upstreams from %s: %s%s", n->resolv_path, list,
             skipped ? " (more, or IPv6, nameservers there are not used)" : "");
  for (unsigned i = 0; i < count && n->uplink_is_netns; i++)
    if ((ntohl(up[i].sin_addr.s_addr) >> 24) == 127)
      log_warn("dns: upstream %s is a loopback address, reached inside the uplink namespace (not moatd's)",
               inet_ntoa(up[i].sin_addr));
}

/* The upstream in use into out. false when there is none. */
static bool upstream_current(struct net_dns *d, struct sockaddr_in *out) {
  pthread_mutex_lock(&d->up_lock);
  bool have = d->n_up > 0;
  if (have)
    *out = d->up[d->up_cur % d->n_up];
  pthread_mutex_unlock(&d->up_lock);
  return have;
}

/* p, sent to its upstream FAILOVER_MS ago, has no answer: the next upstream takes over, when p
 * went to the one in use and no switch happened within FAILOVER_MS. */
static void upstream_failed(struct net_dns *d, const struct pending *p, int64_t now) {
  pthread_mutex_lock(&d->up_lock);
  if (d->n_up > 1 && same_addr(&p->to, &d->up[d->up_cur % d->n_up]) && now - d->failover_ms >= FAILOVER_MS) {
    char was[24], now_a[24];
    addr_text(&d->up[d->up_cur % d->n_up], was, sizeof(was));
    d->up_cur = (d->up_cur + 1) % d->n_up;
    d->failover_ms = now;
    addr_text(&d->up[d->up_cur], now_a, sizeof(now_a));
    log_warn("dns: upstream %s did not answer within %d ms: using %s", was, FAILOVER_MS, now_a);
  }
  pthread_mutex_unlock(&d->up_lock);
}

json_t *dns_upstreams_json(struct moat_net *n) {
  json_t *a = json_array();
  struct net_dns *d = n->dns;
  if (!d) {
    if (n->dns_fixed)
      json_array_append_new(a, json_string(n->dns_fixed));
    return a;
  }
  pthread_mutex_lock(&d->up_lock);
  for (unsigned i = 0; i < d->n_up; i++) {
    char t[24];
    addr_text(&d->up[(d->up_cur + i) % d->n_up], t, sizeof(t)); /* the one in use first */
    json_array_append_new(a, json_string(t));
  }
  pthread_mutex_unlock(&d->up_lock);
  return a;
}

/* Reads a (possibly compressed) name at *off into out (lower case, dotted, no trailing dot).
 * Advances *off past it. 0 or -1; -1 too for a label holding a NUL or a dot, which would make out
 * read as another name than the one on the wire (the upstream resolves the wire's). */
static int read_name(const uint8_t *m, size_t len, size_t *off, char *out, size_t outsz) {
  size_t o = *off, w = 0;
  bool jumped = false;
  int hops = 0;
  for (;;) {
    if (o >= len)
      return -1;
    uint8_t l = m[o];
    if ((l & 0xc0) == 0xc0) {
      if (o + 1 >= len || ++hops > 16)
        return -1;
      if (!jumped)
        *off = o + 2;
      jumped = true;
      o = ((size_t)(l & 0x3f) << 8) | m[o + 1];
      continue;
    }
    if (l & 0xc0)
      return -1;
    if (l == 0) {
      if (!jumped)
        *off = o + 1;
      break;
    }
    if (o + 1 + l > len || w + l + 2 > outsz)
      return -1;
    if (w)
      out[w++] = '.';
    for (unsigned i = 0; i < l; i++) {
      if (m[o + 1 + i] == '\0' || m[o + 1 + i] == '.')
        return -1;
      out[w++] = (char)tolower(m[o + 1 + i]);
    }
    o += 1 + l;
  }
  out[w] = '\0';
  return 0;
}

/* Copies name into out (size MOAT_NET_MAX_NAME + 1) as DNS presentation text: a byte outside
 * '!'..'~', and '\\', becomes \\DDD (RFC 1035 5.1), so that what a sandbox put in a label is always
 * printable ASCII (the connection log is JSON: a name that is not UTF-8 could not be written). Cut
 * short, never inside an escape. */
static void name_text(char *out, const char *name) {
  size_t w = 0;
  for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
    bool plain = *p >= '!' && *p <= '~' && *p != '\\';
    if (w + (plain ? 1 : 4) > MOAT_NET_MAX_NAME)
      break;
    if (plain)
      out[w++] = (char)*p;
    else
      w += (size_t)snprintf(out + w, 5, "\\%03u", *p);
  }
  out[w] = '\0';
}

static void learn(struct moat_net *n, int slot, uint32_t addr, const char *name, bool denied, bool in_set) {
  struct net_slot *s = &n->slots[slot];
  if (!s->learned)
    return;
  for (unsigned i = 0; i < s->n_learned; i++)
    if (s->learned[i].addr == addr) {
      name_text(s->learned[i].name, name);
      s->learned[i].denied = denied;
      s->learned[i].in_set |= in_set;
      return;
    }
  struct net_learned *l = &s->learned[s->learned_next];
  s->learned_next = (s->learned_next + 1) % NET_LEARN_MAX;
  if (s->n_learned < NET_LEARN_MAX)
    s->n_learned++;
  l->addr = addr;
  l->denied = denied;
  l->in_set = in_set;
  name_text(l->name, name);
}

void net_learned_name(struct net_slot *s, uint32_t addr, char *out) {
  out[0] = '\0';
  for (unsigned i = 0; s->learned && i < s->n_learned; i++)
    if (s->learned[i].addr == addr) {
      snprintf(out, MOAT_NET_MAX_NAME + 1, "%s", s->learned[i].name);
      return;
    }
}

void net_forget_learned(struct moat_net *n, int slot) {
  char sip[INET_ADDRSTRLEN];
  uint32_t sb = net_slot_sandbox_ip(n, slot);
  inet_ntop(AF_INET, &sb, sip, sizeof(sip));
  pthread_mutex_lock(&n->lock);
  struct net_slot *s = &n->slots[slot];
  unsigned cnt = s->n_learned;
  struct net_learned *copy = cnt ? xcalloc(cnt, sizeof(*copy)) : NULL;
  if (cnt)
    memcpy(copy, s->learned, cnt * sizeof(*copy));
  s->n_learned = s->learned_next = 0;
  pthread_mutex_unlock(&n->lock);
  for (unsigned i = 0; i < cnt; i++) {
    if (!copy[i].in_set)
      continue;
    char a[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &copy[i].addr, a, sizeof(a));
    /* Elements may have timed out already: one transaction each, failures ignored. */
    _cleanup_free_ char *cmd = xasprintf("delete element inet moat %s { %s . %s }\n",
                                         copy[i].denied ? "deny_dns" : "allow_dns", sip, a);
    moat_error *e = NULL;
    nft_run(n, cmd, &e);
    moat_error_free(&e);
  }
  free(copy);
}

/* Adds (sandbox . addr) elements for the A records of an answer. */
static void add_elements(struct moat_net *n, int slot, const uint32_t *addrs, size_t na, uint32_t ttl,
                         bool deny) {
  if (!na)
    return;
  if (ttl < NET_MIN_TTL_S)
    ttl = NET_MIN_TTL_S;
  if (ttl > NET_MAX_TTL_S)
    ttl = NET_MAX_TTL_S;
  char sip[INET_ADDRSTRLEN];
  uint32_t sb = net_slot_sandbox_ip(n, slot);
  inet_ntop(AF_INET, &sb, sip, sizeof(sip));
  const char *set = deny ? "deny_dns" : "allow_dns";
  char *add = NULL, *del = NULL;
  size_t la = 0, ld = 0;
  for (size_t i = 0; i < na; i++) {
    char a[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &addrs[i], a, sizeof(a));
    net_sappend(&add, &la, "%s%s . %s timeout %us", i ? ", " : "", sip, a, ttl);
    net_sappend(&del, &ld, "%s%s . %s", i ? ", " : "", sip, a);
  }
  /* add (a no-op when present), delete, add: one transaction that also restarts the timeout */
  _cleanup_free_ char *script =
      xasprintf("add element inet moat %s { %s }\ndelete element inet moat %s { %s }\n"
                "add element inet moat %s { %s }\n",
                set, add, set, del, set, add);
  free(add);
  free(del);
  moat_error *e = NULL;
  if (nft_run(n, script, &e) < 0) {
    log_warn("dns: slot %d: add learned addresses: %s", slot, moat_error_msg(e));
    moat_error_free(&e);
  }
}

/* Parses an upstream answer: A records (network order) and their smallest TTL. */
static size_t answer_addrs(const uint8_t *m, size_t len, uint32_t *addrs, size_t max, uint32_t *min_ttl) {
  if (len < 12)
    return 0;
  unsigned qd = (unsigned)(m[4] << 8 | m[5]), an = (unsigned)(m[6] << 8 | m[7]);
  size_t off = 12;
  char name[MOAT_NET_MAX_NAME + 2];
  for (unsigned i = 0; i < qd; i++) {
    if (read_name(m, len, &off, name, sizeof(name)) < 0 || off + 4 > len)
      return 0;
    off += 4;
  }
  size_t na = 0;
  *min_ttl = NET_MAX_TTL_S;
  for (unsigned i = 0; i < an; i++) {
    if (read_name(m, len, &off, name, sizeof(name)) < 0 || off + 10 > len)
      break;
    uint16_t type = (uint16_t)(m[off] << 8 | m[off + 1]), cls = (uint16_t)(m[off + 2] << 8 | m[off + 3]);
    uint32_t ttl =
        (uint32_t)m[off + 4] << 24 | (uint32_t)m[off + 5] << 16 | (uint32_t)m[off + 6] << 8 | m[off + 7];
    uint16_t rdlen = (uint16_t)(m[off + 8] << 8 | m[off + 9]);
    off += 10;
    if (off + rdlen > len)
      break;
    if (type == 1 && cls == 1 && rdlen == 4 && na < max) {
      memcpy(&addrs[na++], m + off, 4);
      if (ttl < *min_ttl)
        *min_ttl = ttl;
    }
    off += rdlen;
  }
  return na;
}

/* Writes into r (512 bytes) a reply to q (question ending at qend) with rcode and no answers.
 * Returns its length, or 0. */
static size_t build_rcode(uint8_t *r, const uint8_t *q, size_t qend, int rcode) {
  if (qend > 512 || qend < 12)
    return 0;
  memcpy(r, q, qend);
  r[2] = (uint8_t)(0x80 | (q[2] & 0x79)); /* QR, opcode, RD kept */
  r[3] = (uint8_t)(0x80 | (rcode & 0xf)); /* RA */
  r[6] = r[7] = r[8] = r[9] = r[10] = r[11] = 0;
  return qend;
}

static void reply_rcode(int fd, const uint8_t *q, size_t qend, const struct sockaddr_in *to, int rcode) {
  uint8_t r[512];
  size_t l = build_rcode(r, q, qend, rcode);
  if (l)
    sendto(fd, r, l, MSG_DONTWAIT, (const struct sockaddr *)to, sizeof(*to));
}

/* Frees p (pend_lock held). */
static void pending_drop(struct net_dns *d, struct pending *p) {
  if (p->kind != P_FREE)
    d->pend_count[bucket_of(d, p->slot)]--;
  p->kind = P_FREE;
}

/* Frees the entries past their deadline (pend_lock held): the upstream never answered them; one
 * unanswered for FAILOVER_MS moves the queries after it to the next upstream. */
static void pending_sweep(struct net_dns *d, int64_t now) {
  if (now - d->last_sweep_ms < SWEEP_MS)
    return;
  d->last_sweep_ms = now;
  for (unsigned i = 0; i < PENDING; i++) {
    struct pending *p = &d->pend[i];
    if (p->kind == P_FREE)
      continue;
    if (!p->late && now - p->sent_ms >= FAILOVER_MS) {
      p->late = true;
      upstream_failed(d, p, now);
    }
    if (p->deadline_ms <= now)
      pending_drop(d, p);
  }
}

/* The oldest entry of the bucket holding the most entries, if it holds more than mine (pend_lock
 * held), or NULL. */
static struct pending *pending_victim(struct net_dns *d, unsigned mine) {
  unsigned top = mine;
  for (unsigned b = 0; b < d->n_buckets; b++)
    if (d->pend_count[b] > d->pend_count[top])
      top = b;
  if (top == mine)
    return NULL;
  struct pending *v = NULL;
  for (unsigned i = 0; i < PENDING; i++)
    if (d->pend[i].kind != P_FREE && bucket_of(d, d->pend[i].slot) == top &&
        (!v || d->pend[i].deadline_ms < v->deadline_ms))
      v = &d->pend[i];
  return v;
}

/* A new entry for a query of slot (pend_lock held), counted against its share; NULL when slot
 * holds PENDING_PER_SANDBOX already, or the table is full of entries of sandboxes that hold no
 * more than it. */
static struct pending *pending_new(struct net_dns *d, int slot) {
  int64_t now = now_unix_ms();
  pending_sweep(d, now);
  unsigned b = bucket_of(d, slot);
  if (d->pend_count[b] >= PENDING_PER_SANDBOX)
    return NULL;
  struct pending *p = NULL;
  uint16_t id = 0;
  for (unsigned k = 0; k < PENDING && !p; k++) {
    id = d->next_id++;
    struct pending *q = &d->pend[id % PENDING];
    if (q->kind == P_FREE || q->deadline_ms <= now)
      p = q;
  }
  if (!p) {
    p = pending_victim(d, b);
    if (!p)
      return NULL;
    id = (uint16_t)(p->our_id + PENDING); /* same entry; a late answer to the victim is ignored */
  }
  pending_drop(d, p);
  memset(p, 0, sizeof(*p));
  p->our_id = id;
  p->deadline_ms = now + PENDING_TIMEOUT_MS;
  p->slot = slot;
  p->kind = P_CLIENT; /* the caller may say P_LEARN_DENY */
  d->pend_count[b]++;
  return p;
}

/* Sends q for p to the upstream in use (pend_lock held). false (p dropped) when there is none or
 * the send failed. */
static bool send_upstream(struct moat_net *n, struct pending *p, const uint8_t *q, size_t len) {
  uint8_t b[4096];
  if (len > sizeof(b) || !upstream_current(n->dns, &p->to)) {
    pending_drop(n->dns, p);
    return false;
  }
  memcpy(b, q, len);
  b[0] = (uint8_t)(p->our_id >> 8);
  b[1] = (uint8_t)p->our_id;
  p->sent_ms = now_unix_ms();
  if (sendto(n->up_fd, b, len, MSG_DONTWAIT, (struct sockaddr *)&p->to, sizeof(p->to)) < 0) {
    pending_drop(n->dns, p);
    return false;
  }
  return true;
}

/* A learn-only query for name's A records (for deny_dns). */
static void learn_denied(struct moat_net *n, int slot, const char *name) {
  pthread_mutex_lock(&n->dns->pend_lock);
  struct pending *p = pending_new(n->dns, slot);
  if (!p) {
    pthread_mutex_unlock(&n->dns->pend_lock);
    return;
  }
  p->kind = P_LEARN_DENY;
  snprintf(p->name, sizeof(p->name), "%.253s", name);
  uint8_t q[512];
  size_t o = 12;
  memset(q, 0, 12);
  q[2] = 0x01; /* RD */
  q[5] = 1;    /* one question */
  const char *s = name;
  while (*s) {
    const char *dot = strchr(s, '.');
    size_t l = dot ? (size_t)(dot - s) : strlen(s);
    if (l == 0 || l > 63 || o + l + 6 > sizeof(q)) {
      pending_drop(n->dns, p);
      pthread_mutex_unlock(&n->dns->pend_lock);
      return;
    }
    q[o++] = (uint8_t)l;
    memcpy(q + o, s, l);
    o += l;
    s += l + (dot ? 1 : 0);
  }
  q[o++] = 0;
  q[o++] = 0, q[o++] = 1; /* A */
  q[o++] = 0, q[o++] = 1; /* IN */
  send_upstream(n, p, q, o);
  pthread_mutex_unlock(&n->dns->pend_lock);
}

/* What to do with query q from a sandbox address: 0 forward (slot, name filled), or an rcode to
 * answer with (1 FORMERR, 3 NXDOMAIN, 5 REFUSED). *qend: where the question ends. A denied name
 * listed in deny is looked up for deny_dns here. */
static int decide(struct moat_net *n, const uint8_t *q, size_t len, uint32_t from_be, int *slot_out,
                  char *name, size_t *qend) {
  *qend = 12;
  if (len < 12 || (q[2] & 0x80)) /* not a query */
    return 1;
  unsigned qd = (unsigned)(q[4] << 8 | q[5]);
  size_t off = 12;
  if (qd != 1 || read_name(q, len, &off, name, MOAT_NET_MAX_NAME + 2) < 0 || off + 4 > len)
    return 1;
  *qend = off + 4;
  int slot = net_slot_of_ip(n, from_be);
  pthread_mutex_lock(&n->lock);
  struct net_slot *s = slot >= 0 ? &n->slots[slot] : NULL;
  bool leased = s && s->state == NS_LEASED;
  bool internet = !leased || !s->bound || s->pol.internet;
  int allowed = leased && s->bound ? net_policy_name_allowed(&s->pol, name) : 1;
  bool explicit_deny =
      leased && s->bound && !allowed && net_policy_name_listed(s->pol.deny, s->pol.n_deny, name);
  pthread_mutex_unlock(&n->lock);
  if (!leased || !internet)
    return 5;
  if (!allowed) {
    if (explicit_deny)
      learn_denied(n, slot, name);
    return 3;
  }
  *slot_out = slot;
  return 0;
}

static void on_query(struct moat_net *n, uint8_t *q, size_t len, const struct sockaddr_in *from) {
  char name[MOAT_NET_MAX_NAME + 2];
  size_t qend;
  int slot = -1;
  int rc = decide(n, q, len, from->sin_addr.s_addr, &slot, name, &qend);
  if (rc) {
    if (len >= 12)
      reply_rcode(n->dns_fd, q, qend <= len ? qend : 12, from, rc);
    return;
  }
  pthread_mutex_lock(&n->dns->pend_lock);
  struct pending *p = pending_new(n->dns, slot);
  if (!p) {
    pthread_mutex_unlock(&n->dns->pend_lock);
    reply_rcode(n->dns_fd, q, qend, from, 2 /* SERVFAIL */);
    return;
  }
  p->client_id = (uint16_t)(q[0] << 8 | q[1]);
  p->client = *from;
  snprintf(p->name, sizeof(p->name), "%.253s", name);
  bool sent = send_upstream(n, p, q, len);
  pthread_mutex_unlock(&n->dns->pend_lock);
  if (!sent)
    reply_rcode(n->dns_fd, q, qend, from, 2 /* SERVFAIL */);
}

/* An upstream answer for slot's query of name: addresses learned (and, when the sandbox's default
 * is deny, or for a denied name, put in its nft set) before the answer is relayed. false when the
 * slot is gone. */
static bool absorb_answer(struct moat_net *n, int slot, const char *name, const uint8_t *m, size_t len,
                          bool deny) {
  uint32_t addrs[64], ttl = 0;
  size_t na = answer_addrs(m, len, addrs, ARRAY_SIZE(addrs), &ttl);
  pthread_mutex_lock(&n->lock);
  struct net_slot *s = &n->slots[slot];
  bool ok = s->state == NS_LEASED;
  bool need_set = ok && s->bound && !deny && s->pol.egress_deny;
  bool policy_locked = false;
  if (ok && na && (need_set || deny)) {
    /* Elements go into nft under policy_lock, the slot checked leased under it: its teardown
     * (which forgets what the slot learned) or a new bind never misses one. */
    pthread_mutex_unlock(&n->lock);
    pthread_mutex_lock(&n->policy_lock);
    policy_locked = true;
    pthread_mutex_lock(&n->lock);
    ok = s->state == NS_LEASED;
    need_set = ok && s->bound && !deny && s->pol.egress_deny;
  }
  if (ok)
    for (size_t i = 0; i < na; i++)
      learn(n, slot, addrs[i], name, deny, need_set || deny);
  pthread_mutex_unlock(&n->lock);
  if (ok && (need_set || deny))
    add_elements(n, slot, addrs, na, ttl, deny);
  if (policy_locked)
    pthread_mutex_unlock(&n->policy_lock);
  return ok;
}

static void on_answer(struct moat_net *n, uint8_t *m, size_t len, const struct sockaddr_in *from) {
  if (len < 12)
    return;
  uint16_t id = (uint16_t)(m[0] << 8 | m[1]);
  pthread_mutex_lock(&n->dns->pend_lock);
  struct pending *p = &n->dns->pend[id % PENDING];
  if (p->kind == P_FREE || p->our_id != id || !same_addr(&p->to, from)) {
    pthread_mutex_unlock(&n->dns->pend_lock);
    return;
  }
  struct pending cp = *p;
  pending_drop(n->dns, p);
  pthread_mutex_unlock(&n->dns->pend_lock);
  if (!absorb_answer(n, cp.slot, cp.name, m, len, cp.kind == P_LEARN_DENY))
    return;
  if (cp.kind == P_CLIENT) {
    m[0] = (uint8_t)(cp.client_id >> 8);
    m[1] = (uint8_t)cp.client_id;
    sendto(n->dns_fd, m, len, MSG_DONTWAIT, (struct sockaddr *)&cp.client, sizeof(cp.client));
  }
}

/* ---- DNS over TCP (answers too big for UDP are retried over TCP by resolvers) ---- */

static int read_msg(int fd, uint8_t *buf, size_t cap, size_t *len) {
  uint8_t l2[2];
  if (read_all(fd, l2, 2) != 2)
    return -1;
  size_t l = (size_t)(l2[0] << 8 | l2[1]);
  if (l < 12 || l > cap || read_all(fd, buf, l) != (ssize_t)l)
    return -1;
  *len = l;
  return 0;
}

static int write_msg(int fd, const uint8_t *m, size_t len) {
  uint8_t l2[2] = {(uint8_t)(len >> 8), (uint8_t)len};
  return write_all(fd, l2, 2) < 0 || write_all(fd, m, len) < 0 ? -1 : 0;
}

static void set_timeouts(int fd) {
  struct timeval tv = {.tv_sec = TCP_TIMEOUT_S};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

/* Forwards one query over TCP to the upstream (from the uplink namespace). */
static int tcp_upstream(struct moat_net *n, const uint8_t *q, size_t len, uint8_t *ans, size_t cap,
                        size_t *alen) {
  struct sockaddr_in up;
  if (!upstream_current(n->dns, &up))
    return -1;
  _cleanup_close_ int fd = net_socket_in(n->outside_fd, AF_INET, SOCK_STREAM, 0, NULL);
  if (fd < 0)
    return -1;
  set_timeouts(fd);
  if (connect(fd, (struct sockaddr *)&up, sizeof(up)) < 0 || write_msg(fd, q, len) < 0)
    return -1;
  return read_msg(fd, ans, cap, alen);
}

static void *tcp_main(void *arg) {
  struct tcp_job *j = arg;
  struct moat_net *n = j->n;
  uint8_t *q = xmalloc(65535), *ans = xmalloc(65535);
  set_timeouts(j->fd);
  for (int k = 0; k < 16; k++) { /* a few queries per connection */
    size_t len, alen, qend;
    if (read_msg(j->fd, q, 65535, &len) < 0)
      break;
    char name[MOAT_NET_MAX_NAME + 2];
    int slot = -1;
    int rc = decide(n, q, len, j->peer.sin_addr.s_addr, &slot, name, &qend);
    if (rc == 0 && tcp_upstream(n, q, len, ans, 65535, &alen) < 0)
      rc = 2; /* SERVFAIL */
    if (rc) {
      uint8_t r[512];
      size_t rl = build_rcode(r, q, qend <= len ? qend : 12, rc);
      if (!rl || write_msg(j->fd, r, rl) < 0)
        break;
      continue;
    }
    ans[0] = q[0], ans[1] = q[1];
    if (!absorb_answer(n, slot, name, ans, alen, false) || write_msg(j->fd, ans, alen) < 0)
      break;
  }
  free(q);
  free(ans);
  pthread_mutex_lock(&n->dns->tcp_lock);
  if (j->index >= 0) {
    n->dns->tcp_table[j->index] = NULL;
    n->dns->tcp_count[j->bucket]--;
  }
  pthread_mutex_unlock(&n->dns->tcp_lock);
  close(j->fd);
  free(j);
  __atomic_fetch_sub(&n->dns->tcp_conns, 1, __ATOMIC_RELAXED);
  return NULL;
}

/* A place in tcp_table for a connection of bucket b (tcp_lock held): a free one, else one the
 * largest holder gives up when it holds more than b (its oldest connection is shut down; its
 * thread ends on its own). -1 when b holds its share already or no one holds more. */
static int tcp_place(struct net_dns *d, unsigned b) {
  if (d->tcp_count[b] >= TCP_PER_SANDBOX)
    return -1;
  for (int i = 0; i < TCP_MAX_CONNS; i++)
    if (!d->tcp_table[i])
      return i;
  unsigned top = b;
  for (unsigned k = 0; k < d->n_buckets; k++)
    if (d->tcp_count[k] > d->tcp_count[top])
      top = k;
  if (top == b)
    return -1;
  int v = -1;
  for (int i = 0; i < TCP_MAX_CONNS; i++)
    if (d->tcp_table[i]->bucket == top && (v < 0 || d->tcp_table[i]->since_ns < d->tcp_table[v]->since_ns))
      v = i;
  shutdown(d->tcp_table[v]->fd, SHUT_RDWR);
  d->tcp_table[v]->index = -1;
  d->tcp_table[v] = NULL;
  d->tcp_count[top]--;
  return v;
}

static void on_tcp_accept(struct moat_net *n) {
  struct sockaddr_in peer;
  socklen_t pl = sizeof(peer);
  int fd = accept4(n->dns_tcp_fd, (struct sockaddr *)&peer, &pl, SOCK_CLOEXEC);
  if (fd < 0)
    return;
  struct tcp_job *j = xcalloc(1, sizeof(*j));
  j->n = n;
  j->fd = fd;
  j->peer = peer;
  j->bucket = bucket_of(n->dns, net_slot_of_ip(n, peer.sin_addr.s_addr));
  j->since_ns = now_ns();
  pthread_mutex_lock(&n->dns->tcp_lock);
  j->index = tcp_place(n->dns, j->bucket);
  if (j->index >= 0) {
    n->dns->tcp_table[j->index] = j;
    n->dns->tcp_count[j->bucket]++;
  }
  pthread_mutex_unlock(&n->dns->tcp_lock);
  if (j->index < 0) {
    close(fd);
    free(j);
    return;
  }
  __atomic_add_fetch(&n->dns->tcp_conns, 1, __ATOMIC_RELAXED);
  pthread_t t;
  pthread_attr_t at;
  pthread_attr_init(&at);
  pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
  if (pthread_create(&t, &at, tcp_main, j) != 0) {
    pthread_mutex_lock(&n->dns->tcp_lock);
    if (j->index >= 0) {
      n->dns->tcp_table[j->index] = NULL;
      n->dns->tcp_count[j->bucket]--;
    }
    pthread_mutex_unlock(&n->dns->tcp_lock);
    close(fd);
    free(j);
    __atomic_fetch_sub(&n->dns->tcp_conns, 1, __ATOMIC_RELAXED);
  }
  pthread_attr_destroy(&at);
}

static void *dns_main(void *arg) {
  struct moat_net *n = arg;
  uint8_t buf[4096];
  for (;;) {
    struct pollfd p[4] = {{.fd = n->dns_fd, .events = POLLIN},
                          {.fd = n->up_fd, .events = POLLIN},
                          {.fd = n->stop_pipe[0], .events = POLLIN},
                          {.fd = n->dns_tcp_fd, .events = POLLIN}};
    if (poll(p, 4, 1000) < 0 && errno != EINTR)
      break;
    if (p[2].revents)
      break;
    int64_t now = now_unix_ms();
    if (n->resolv_path && now - n->dns->resolv_check_ms >= RESOLV_CHECK_MS) {
      n->dns->resolv_check_ms = now;
      reload_resolv(n, false);
    }
    pthread_mutex_lock(&n->dns->pend_lock); /* failovers happen with no new query too */
    pending_sweep(n->dns, now);
    pthread_mutex_unlock(&n->dns->pend_lock);
    if (p[3].revents & POLLIN)
      on_tcp_accept(n);
    if (p[0].revents & POLLIN) {
      struct sockaddr_in from;
      socklen_t fl = sizeof(from);
      ssize_t r = recvfrom(n->dns_fd, buf, sizeof(buf), MSG_DONTWAIT, (struct sockaddr *)&from, &fl);
      if (r > 0 && from.sin_family == AF_INET)
        on_query(n, buf, (size_t)r, &from);
    }
    if (p[1].revents & POLLIN) {
      struct sockaddr_in from;
      socklen_t fl = sizeof(from);
      ssize_t r = recvfrom(n->up_fd, buf, sizeof(buf), MSG_DONTWAIT, (struct sockaddr *)&from, &fl);
      if (r > 0 && from.sin_family == AF_INET)
        on_answer(n, buf, (size_t)r, &from);
    }
  }
  return NULL;
}

int dns_start(struct moat_net *n, moat_error **err) {
  struct net_dns *d = xcalloc(1, sizeof(*d));
  pthread_mutex_init(&d->pend_lock, NULL);
  pthread_mutex_init(&d->tcp_lock, NULL);
  pthread_mutex_init(&d->up_lock, NULL);
  d->n_buckets = n->pool_size + 1;
  d->pend_count = xcalloc(d->n_buckets, sizeof(*d->pend_count));
  d->tcp_count = xcalloc(d->n_buckets, sizeof(*d->tcp_count));
  d->next_id = (uint16_t)(now_ns() & 0xffff);
  n->dns = d;
  if (n->dns_fixed) {
    struct sockaddr_in a;
    if (parse_addr_port(n->dns_fixed, &a) < 0)
      return dns_check_fixed(n->dns_fixed, err);
    set_upstreams(n, &a, 1);
  } else {
    reload_resolv(n, true);
    d->resolv_check_ms = now_unix_ms();
  }
  n->dns_fd = net_socket_in(n->router_fd, AF_INET, SOCK_DGRAM, 0, err);
  if (n->dns_fd < 0)
    return -1;
  struct sockaddr_in a = {
      .sin_family = AF_INET, .sin_port = htons(NET_DNS_PORT), .sin_addr.s_addr = net_dns_ip(n)};
  if (bind(n->dns_fd, (struct sockaddr *)&a, sizeof(a)) < 0)
    return moat_error_errno(err, "bind the sandboxes' DNS");
  n->dns_tcp_fd = net_socket_in(n->router_fd, AF_INET, SOCK_STREAM, 0, err);
  if (n->dns_tcp_fd < 0)
    return -1;
  int one = 1;
  setsockopt(n->dns_tcp_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(n->dns_tcp_fd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(n->dns_tcp_fd, 64) < 0)
    return moat_error_errno(err, "listen for the sandboxes' DNS over TCP");
  n->up_fd = net_socket_in(n->outside_fd, AF_INET, SOCK_DGRAM, 0, err);
  if (n->up_fd < 0)
    return -1;
  if (pipe2(n->stop_pipe, O_CLOEXEC) < 0)
    return moat_error_errno(err, "pipe");
  if (pthread_create(&n->dns_thread, NULL, dns_main, n) != 0)
    return moat_error_set(err, EAGAIN, "start the DNS thread");
  n->dns_started = true;
  return 0;
}

void dns_stop(struct moat_net *n) {
  if (n->stop_pipe[1] >= 0 && write(n->stop_pipe[1], "x", 1) < 0) {
    /* the threads also poll with a timeout */
  }
  if (n->dns_started) {
    pthread_join(n->dns_thread, NULL);
    n->dns_started = false;
  }
  /* The stop pipe stays readable (nobody reads the byte) for netlog's thread; net.c closes it. */
  struct net_dns *d = n->dns;
  if (d) {
    /* TCP connections in flight end at once (their sockets shut down) or, asking the upstream,
     * within its timeouts. */
    pthread_mutex_lock(&d->tcp_lock);
    for (int i = 0; i < TCP_MAX_CONNS; i++)
      if (d->tcp_table[i])
        shutdown(d->tcp_table[i]->fd, SHUT_RDWR);
    pthread_mutex_unlock(&d->tcp_lock);
    for (int i = 0; i < (TCP_TIMEOUT_S * 2 + 1) * 20 && __atomic_load_n(&d->tcp_conns, __ATOMIC_RELAXED) > 0;
         i++)
      usleep(50000);
  }
  int fds[] = {n->dns_fd, n->up_fd, n->dns_tcp_fd};
  for (size_t i = 0; i < ARRAY_SIZE(fds); i++)
    if (fds[i] >= 0)
      close(fds[i]);
  n->dns_fd = n->up_fd = n->dns_tcp_fd = -1;
  if (d && __atomic_load_n(&d->tcp_conns, __ATOMIC_RELAXED) == 0) { /* else threads may still use it */
    pthread_mutex_destroy(&d->pend_lock);
    pthread_mutex_destroy(&d->tcp_lock);
    pthread_mutex_destroy(&d->up_lock);
    free(d->pend_count);
    free(d->tcp_count);
    free(d);
    n->dns = NULL;
  }
}

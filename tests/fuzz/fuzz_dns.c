/* fuzz_dns.c -- libFuzzer target: moatd's DNS message parsing (host dns.c), the bytes a sandbox
 * sends as a query and an upstream sends as an answer. dns.c's parsers are static, so the file is
 * included whole and driven through on_query and on_answer as its UDP thread drives them, for a
 * sandbox in slot 2 of a pool whose policy denies some names (so a query may also start a
 * deny-list lookup).
 *
 * Input: u16 big-endian query length Q, then Q bytes of query, then the answer (its id is set to
 * the pending entry's). The first byte of the answer part's flags picks whether the pending entry is
 * the client's query or a deny-list lookup.
 * Checks, beyond the sanitizers: every name read is lower case, at most 253 bytes, without empty
 * labels or a trailing dot, and the same name as the wire's labels (what the policy matches is what
 * the upstream resolves); an rcode reply copies the question and nothing more; answer_addrs finds
 * at most the room it has and a TTL within bounds; learned names stay NUL-terminated printable ASCII
 * in the slot's ring and the pending table's counts return to zero. */
#include "host/net/dns.c"

#include <jansson.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define SLOT 2

static struct moat_net net;

static void setup(void) {
  if (net.slots)
    return;
  moat_log_set_level(MOAT_LOG_ERROR);
  net.pool = 0x0ac80000; /* 10.200.0.0 */
  net.pool_size = 4;
  net.slots = xcalloc(net.pool_size, sizeof(*net.slots));
  net.dns_fd = net.up_fd = net.dns_tcp_fd = -1; /* sends fail (EBADF): nothing leaves */
  pthread_mutex_init(&net.lock, NULL);
  pthread_mutex_init(&net.nft_lock, NULL);
  struct net_slot *s = &net.slots[SLOT];
  s->state = NS_LEASED;
  s->bound = true;
  s->learned = xcalloc(NET_LEARN_MAX, sizeof(*s->learned));
  json_error_t je;
  json_t *pol = json_loads("{\"internet\": true, \"egress\": \"allow\", \"allow\": [\"ok.test\"],"
                           " \"deny\": [\"bad.test\", \"*.denied.test\", \"10.0.0.0/8\"]}",
                           0, &je);
  moat_error *err = NULL;
  if (!pol || net_policy_parse(pol, &s->pol, &err) < 0)
    abort();
  json_decref(pol);
  struct net_dns *d = xcalloc(1, sizeof(*d));
  pthread_mutex_init(&d->pend_lock, NULL);
  pthread_mutex_init(&d->tcp_lock, NULL);
  pthread_mutex_init(&d->up_lock, NULL);
  d->up[0] = (struct sockaddr_in){
      .sin_family = AF_INET, .sin_port = htons(53), .sin_addr.s_addr = htonl(0xc6336435)};
  d->n_up = 1;
  d->n_buckets = net.pool_size + 1;
  d->pend_count = xcalloc(d->n_buckets, sizeof(*d->pend_count));
  d->tcp_count = xcalloc(d->n_buckets, sizeof(*d->tcp_count));
  net.dns = d;
}

static void check_name(const char *name) {
  size_t n = strlen(name);
  if (n > MOAT_NET_MAX_NAME + 1) /* read_name's out holds MOAT_NET_MAX_NAME + 2 */
    abort();
  if (n && (name[0] == '.' || name[n - 1] == '.' || strstr(name, "..")))
    abort();
  for (size_t i = 0; i < n; i++)
    if (name[i] >= 'A' && name[i] <= 'Z')
      abort();
}

/* The wire form of the name at off (compression followed, labels lower-cased), written here
 * independently of read_name: uncompressed labels into out. Its length, or 0 when malformed. */
static size_t wire_labels(const uint8_t *m, size_t len, size_t off, uint8_t *out, size_t cap) {
  size_t w = 0;
  for (int hops = 0; hops <= 16;) {
    if (off >= len)
      return 0;
    uint8_t l = m[off];
    if ((l & 0xc0) == 0xc0) {
      if (off + 1 >= len)
        return 0;
      off = (size_t)(l & 0x3f) << 8 | m[off + 1];
      hops++;
      continue;
    }
    if (l & 0xc0 || off + 1 + l > len || w + 1 + l > cap)
      return 0;
    out[w++] = l;
    if (l == 0)
      return w;
    for (unsigned i = 0; i < l; i++)
      out[w++] = (uint8_t)tolower(m[off + 1 + i]);
    off += 1 + l;
  }
  return 0;
}

/* The policy sees name; the upstream resolves the wire's labels: they must be the same name. */
static void check_same_name(const uint8_t *m, size_t len, size_t off, const char *name) {
  uint8_t wire[1024], back[1024];
  size_t wl = wire_labels(m, len, off, wire, sizeof(wire));
  if (wl == 0)
    abort(); /* read_name accepted what is not a name */
  size_t bl = 0;
  for (const char *p = name; *p;) {
    const char *dot = strchr(p, '.');
    size_t l = dot ? (size_t)(dot - p) : strlen(p);
    back[bl++] = (uint8_t)l;
    memcpy(back + bl, p, l);
    bl += l;
    p += l + (dot ? 1 : 0);
  }
  back[bl++] = 0;
  if (bl != wl || memcmp(back, wire, wl) != 0)
    abort();
}

static void fuzz_parsers(const uint8_t *m, size_t len) {
  char name[MOAT_NET_MAX_NAME + 2];
  size_t off = 12;
  if (len >= 12 && read_name(m, len, &off, name, sizeof(name)) == 0) {
    check_name(name);
    check_same_name(m, len, 12, name);
    if (off > len)
      abort();
  }
  uint32_t addrs[8], ttl = 0;
  size_t na = answer_addrs(m, len, addrs, ARRAY_SIZE(addrs), &ttl);
  if (na > ARRAY_SIZE(addrs) || (na && ttl > NET_MAX_TTL_S))
    abort();
  uint8_t r[512];
  for (size_t qend = 0; qend <= len && qend <= 600; qend += 97) {
    size_t l = build_rcode(r, m, qend, 3);
    if (l && (l != qend || !(r[2] & 0x80) || (r[3] & 0xf) != 3 || r[6] | r[7] | r[8] | r[9] | r[10] | r[11]))
      abort();
    if (l > 12 && memcmp(r + 12, m + 12, l - 12) != 0)
      abort();
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  setup();
  if (size < 2)
    return 0;
  size_t ql = (size_t)data[0] << 8 | data[1];
  if (ql > size - 2)
    ql = size - 2;
  /* on_query and on_answer rewrite ids in place: copies, sized exactly so ASan sees overreads */
  uint8_t *q = xmemdup(data + 2, ql), *a = xmemdup(data + 2 + ql, size - 2 - ql);
  size_t al = size - 2 - ql;
  fuzz_parsers(q, ql);
  fuzz_parsers(a, al);

  struct sockaddr_in from = {
      .sin_family = AF_INET, .sin_port = htons(5353), .sin_addr.s_addr = net_slot_sandbox_ip(&net, SLOT)};
  on_query(&net, q, ql, &from);
  char name[MOAT_NET_MAX_NAME + 2];
  int slot = -1;
  size_t qend = 0;
  int rc = decide(&net, q, ql, from.sin_addr.s_addr, &slot, name, &qend);
  if (rc == 0 && (slot != SLOT || qend > ql))
    abort();
  if (rc == 0)
    check_name(name);
  if (rc != 0 && rc != 1 && rc != 3 && rc != 5)
    abort();

  if (al >= 12) {
    pthread_mutex_lock(&net.dns->pend_lock);
    struct pending *p = pending_new(net.dns, SLOT);
    if (p) {
      p->to = net.dns->up[0]; /* as send_upstream records it */
      p->kind = (a[2] & 0x40) ? P_LEARN_DENY : P_CLIENT;
      snprintf(p->name, sizeof(p->name), "%s", rc == 0 ? name : "x.test");
      a[0] = (uint8_t)(p->our_id >> 8);
      a[1] = (uint8_t)p->our_id;
    }
    pthread_mutex_unlock(&net.dns->pend_lock);
    on_answer(&net, a, al, &net.dns->up[0]);
  }
  struct net_slot *s = &net.slots[SLOT];
  if (s->n_learned > NET_LEARN_MAX || s->learned_next >= NET_LEARN_MAX)
    abort();
  for (unsigned i = 0; i < s->n_learned; i++) {
    if (!memchr(s->learned[i].name, '\0', sizeof(s->learned[i].name)))
      abort();
    for (const char *c = s->learned[i].name; *c; c++)
      if (*c < '!' || *c > '~')
        abort(); /* the connection log writes learned names as JSON strings */
  }
  /* the per-sandbox counts agree with the table: emptied, they are all zero */
  struct net_dns *d = net.dns;
  pthread_mutex_lock(&d->pend_lock);
  for (unsigned i = 0; i < PENDING; i++)
    if (d->pend[i].kind != P_FREE)
      pending_drop(d, &d->pend[i]);
  for (unsigned b = 0; b < d->n_buckets; b++)
    if (d->pend_count[b] != 0)
      abort();
  pthread_mutex_unlock(&d->pend_lock);
  free(q);
  free(a);
  return 0;
}

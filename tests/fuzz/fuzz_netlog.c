/* fuzz_netlog.c -- libFuzzer target: the connection log's reading of NFLOG messages (host
 * netlog.c). The kernel writes the netlink framing and moat's own nft rules the log prefix ("A
 * name", "D default": NFLOG groups are per network namespace, so no sandbox writes them); the
 * sandbox writes the packet, whose first bytes (the IP and TCP/UDP headers) the message carries.
 * netlog.c's callbacks are static, so the file is included whole and its msg_cb run as its log
 * thread runs it, over a message framed as the kernel frames it, for a sandbox in slot 2 that has
 * learned a name for 198.51.100.13.
 *
 * Input: u8 length L, L bytes of learned name (mapped to printable ASCII: all dns.c learns, as
 * fuzz_dns checks), u8 picking the prefix, then the packet (its first 96 bytes: the rules' copy
 * range). Checks: entries land only in the sending sandbox's ring, in sequence; an entry's reason
 * and name stay NUL-terminated; every entry becomes JSON (the log hook and GET .../network/log read
 * it that way: an entry that cannot is one the sandbox hid from its log). */
#include "host/net/netlog.c"

#include <jansson.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define SLOT 2

static struct moat_net net;
static unsigned hooked;

static void hook(const char *id, json_t *entry, void *arg) {
  if (!entry || strcmp(id, "sb-fuzz") != 0)
    abort();
  char *s = json_dumps(entry, JSON_COMPACT);
  if (!s)
    abort();
  free(s);
  hooked++;
}

static void setup(void) {
  if (net.slots)
    return;
  moat_log_set_level(MOAT_LOG_ERROR);
  net.pool = 0x0ac80000; /* 10.200.0.0 */
  net.pool_size = 4;
  net.slots = xcalloc(net.pool_size, sizeof(*net.slots));
  pthread_mutex_init(&net.lock, NULL);
  for (int i = 0; i < (int)net.pool_size; i++) {
    struct net_slot *s = &net.slots[i];
    s->log = xcalloc(NET_LOG_RING, sizeof(*s->log));
    s->learned = xcalloc(NET_LEARN_MAX, sizeof(*s->learned));
  }
  struct net_slot *s = &net.slots[SLOT];
  s->state = NS_LEASED;
  s->bound = true;
  snprintf(s->id, sizeof(s->id), "sb-fuzz");
  snprintf(s->org, sizeof(s->org), "org-fuzz");
  s->n_learned = 1;
  s->learned[0].addr = htonl(0xc633640d); /* 198.51.100.13 */
  moat_net_set_log_hook(&net, hook, NULL);
}

static const char *const prefixes[] = {"A name", "A cidr",    "A default", "D name",
                                       "D cidr", "D default", "D block"};

/* Appends attribute type t of n bytes to the message at b (length *len), as the kernel does. */
static void put_attr(char *b, size_t *len, uint16_t t, const void *p, size_t n) {
  struct nlattr *a = (struct nlattr *)(b + *len);
  a->nla_type = t;
  a->nla_len = (uint16_t)(NLA_HDRLEN + n);
  memcpy(b + *len + NLA_HDRLEN, p, n);
  *len += NLA_ALIGN(NLA_HDRLEN + n);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  setup();
  if (size < 2 || (size_t)data[0] + 2 > size)
    return 0;
  struct net_slot *s = &net.slots[SLOT];
  size_t nl = data[0] < MOAT_NET_MAX_NAME ? data[0] : MOAT_NET_MAX_NAME;
  for (size_t i = 0; i < nl; i++)
    s->learned[0].name[i] = (char)('!' + data[1 + i] % ('~' - '!' + 1));
  s->learned[0].name[nl] = '\0';
  const char *prefix = prefixes[data[1 + data[0]] % ARRAY_SIZE(prefixes)];
  const uint8_t *pkt = data + 2 + data[0];
  size_t plen = size - 2 - data[0];
  if (plen > 96)
    plen = 96;
  /* one NFULNL_MSG_PACKET: header, nfgenmsg, prefix, payload */
  size_t cap =
      NLMSG_HDRLEN + NLMSG_ALIGN(sizeof(struct nfgenmsg)) + 2 * NLA_HDRLEN + 16 + NLA_ALIGN(plen) + 16;
  char *buf = xcalloc(1, cap);
  struct nlmsghdr *nlh = (struct nlmsghdr *)buf;
  nlh->nlmsg_type = (NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_PACKET;
  size_t len = NLMSG_HDRLEN;
  struct nfgenmsg *nfg = (struct nfgenmsg *)(buf + len);
  nfg->nfgen_family = AF_INET;
  nfg->res_id = htons(NET_NFLOG_GROUP);
  len += NLMSG_ALIGN(sizeof(*nfg));
  put_attr(buf, &len, NFULA_PREFIX, prefix, strlen(prefix) + 1);
  put_attr(buf, &len, NFULA_PAYLOAD, pkt, plen);
  nlh->nlmsg_len = (uint32_t)len;
  uint64_t seq0 = s->log_seq;
  hooked = 0;
  mnl_cb_run(buf, len, 0, 0, msg_cb, &net);
  for (unsigned i = 0; i < net.pool_size; i++)
    if (i != SLOT && net.slots[i].log_seq != 0)
      abort(); /* another slot's ring */
  if (s->log_seq - seq0 != hooked || hooked > 1)
    abort(); /* an entry the hook never saw: it could not be made JSON */
  for (uint64_t q = seq0; q < s->log_seq; q++) {
    struct net_log_entry *e = &s->log[q % NET_LOG_RING];
    if (e->seq != q || !memchr(e->reason, '\0', sizeof(e->reason)) || !memchr(e->name, '\0', sizeof(e->name)))
      abort();
    json_t *j = net_log_entry_json(e, s->id, s->org);
    if (!j)
      abort();
    json_decref(j);
  }
  free(buf);
  return 0;
}

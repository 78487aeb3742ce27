/* nft.c -- the egress firewall: one nftables table "inet moat" in moat's routing namespace, driven
 * by libnftables (no nft binary), and for an interface uplink one "ip moat_up_INSTANCE" table in
 * moatd's own namespace for the masquerade out of that interface. No other table is touched.
 *
 * Verdicts for a sandbox's new outbound connection, first match wins, each logged to NFLOG group
 * NET_NFLOG_GROUP with a prefix "A reason" / "D reason" that netlog.c turns into log entries:
 *   offline (internet: false) · another sandbox · 169.254.0.0/16 (cloud metadata) · the host's
 *   own addresses (moatd's API included) · blocked ports (mining pools) · deny CIDRs · addresses of
 *   denied names · allow CIDRs · addresses of allowed names · egress "deny" default · allow.
 * IPv6 (fe80::/10 included) is never forwarded; the routing namespace itself answers only DNS and
 * moatd's TCP services on the DNS address (set "services", service.c), to sandboxes whose network
 * is on whatever their egress policy (they are moatd's own, as DNS is).
 */
#include "net_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <nftables/libnftables.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../common/log.h"
#include "../../common/util.h"

#define STR_(x) #x
#define STR(x) STR_(x)
#define NFLOG_G STR(NET_NFLOG_GROUP)

void net_sappend(char **buf, size_t *len, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int k = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (k <= 0)
    return;
  *buf = xrealloc(*buf, *len + (size_t)k + 1);
  va_start(ap, fmt);
  vsnprintf(*buf + *len, (size_t)k + 1, fmt, ap);
  va_end(ap);
  *len += (size_t)k;
}

/* libnftables opens its netlink socket when the context is made: a context made while this
 * thread is in a namespace keeps talking to that namespace. */
static int new_ctx_fn(void *a) {
  struct nft_ctx **ctx = a;
  *ctx = nft_ctx_new(NFT_CTX_DEFAULT);
  return *ctx ? 0 : -1;
}

static struct nft_ctx *ctx_in(int nsfd, moat_error **err) {
  struct nft_ctx *ctx = NULL;
  if (net_in_ns(nsfd, new_ctx_fn, &ctx, err) < 0 || !ctx) {
    if (err && !*err)
      moat_error_set(err, ENOMEM, "nft_ctx_new");
    return NULL;
  }
  nft_ctx_buffer_output(ctx);
  nft_ctx_buffer_error(ctx);
  return ctx;
}

static int run_ctx(struct moat_net *n, struct nft_ctx *ctx, const char *script, moat_error **err) {
  if (!script || !script[0])
    return 0;
  if (!ctx)
    return moat_error_set(err, EINVAL, "nftables context not open");
  pthread_mutex_lock(&n->nft_lock);
  int ret = 0;
  if (nft_run_cmd_from_buffer(ctx, script) != 0) {
    const char *msg = nft_ctx_get_error_buffer(ctx);
    size_t l = msg ? strlen(msg) : 0;
    while (l && (msg[l - 1] == '\n' || msg[l - 1] == ' '))
      l--;
    ret = moat_error_set(err, EIO, "nftables: %.*s", (int)(l > 600 ? 600 : l), msg ? msg : "failed");
  }
  pthread_mutex_unlock(&n->nft_lock);
  return ret;
}

int nft_run(struct moat_net *n, const char *script, moat_error **err) {
  return run_ctx(n, n->nft, script, err);
}

static void ip_str(uint32_t be, char out[INET_ADDRSTRLEN]) { inet_ntop(AF_INET, &be, out, INET_ADDRSTRLEN); }

static void rule_elems(const char *sip, const struct net_rule *rules, size_t nr, char **buf, size_t *len) {
  bool first = true;
  for (size_t i = 0; i < nr; i++) {
    if (rules[i].kind != RULE_CIDR)
      continue;
    char a[INET_ADDRSTRLEN];
    ip_str(htonl(rules[i].addr), a);
    if (rules[i].plen == 32)
      net_sappend(buf, len, "%s%s . %s", first ? "" : ", ", sip, a);
    else
      net_sappend(buf, len, "%s%s . %s/%u", first ? "" : ", ", sip, a, rules[i].plen);
    first = false;
  }
}

static bool has_cidr(const struct net_rule *rules, size_t nr) {
  for (size_t i = 0; i < nr; i++)
    if (rules[i].kind == RULE_CIDR)
      return true;
  return false;
}

void nft_policy_elements(struct moat_net *n, int slot, const struct net_policy *p, const char *op, char **buf,
                         size_t *len) {
  char sip[INET_ADDRSTRLEN];
  ip_str(net_slot_sandbox_ip(n, slot), sip);
  if (!p->internet)
    net_sappend(buf, len, "%s element inet moat offline { %s }\n", op, sip);
  /* Sandboxes with rules take the slow path through the four (sandbox . address) sets. */
  if (p->egress_deny || p->n_allow || p->n_deny)
    net_sappend(buf, len, "%s element inet moat policied { %s }\n", op, sip);
  if (p->egress_deny)
    net_sappend(buf, len, "%s element inet moat egress_deny { %s }\n", op, sip);
  if (has_cidr(p->allow, p->n_allow)) {
    net_sappend(buf, len, "%s element inet moat allow_net { ", op);
    rule_elems(sip, p->allow, p->n_allow, buf, len);
    net_sappend(buf, len, " }\n");
  }
  if (has_cidr(p->deny, p->n_deny)) {
    net_sappend(buf, len, "%s element inet moat deny_net { ", op);
    rule_elems(sip, p->deny, p->n_deny, buf, len);
    net_sappend(buf, len, " }\n");
  }
}

/* The host's own IPv4 addresses (moatd's netns) as nft set elements. */
static void host_addrs(struct moat_net *n, char **buf, size_t *len) {
  char a[INET_ADDRSTRLEN];
  ip_str(htonl(n->pool + 5), a); /* the uplink link's outside end */
  net_sappend(buf, len, "%s", a);
  struct ifaddrs *ifa = NULL;
  if (getifaddrs(&ifa) < 0)
    return;
  for (struct ifaddrs *i = ifa; i; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET)
      continue;
    uint32_t be = ((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr;
    if ((ntohl(be) >> 24) == 127 || be == htonl(n->pool + 5))
      continue;
    ip_str(be, a);
    net_sappend(buf, len, ", %s", a);
  }
  freeifaddrs(ifa);
}

int nft_open(struct moat_net *n, moat_error **err) {
  n->nft = ctx_in(n->router_fd, err);
  if (!n->nft)
    return -1;
  char dns[INET_ADDRSTRLEN];
  ip_str(net_dns_ip(n), dns);
  char *s = NULL;
  size_t len = 0;
  /* Sets keep their elements across a restart (adopted sandboxes stay enforced); chains are
   * rebuilt. The whole script is one transaction. */
  net_sappend(&s, &len,
              "add table inet moat\n"
              "add set inet moat hostaddrs { type ipv4_addr; flags interval; auto-merge; }\n"
              "add set inet moat blockports { type inet_service; }\n"
              "add set inet moat services { type inet_service; }\n"
              "add set inet moat offline { type ipv4_addr; }\n"
              "add set inet moat egress_deny { type ipv4_addr; }\n"
              "add set inet moat policied { type ipv4_addr; }\n"
              "add set inet moat allow_net { type ipv4_addr . ipv4_addr; flags interval; }\n"
              "add set inet moat deny_net { type ipv4_addr . ipv4_addr; flags interval; }\n"
              "add set inet moat allow_dns { type ipv4_addr . ipv4_addr; flags timeout; }\n"
              "add set inet moat deny_dns { type ipv4_addr . ipv4_addr; flags timeout; }\n"
              "add chain inet moat pre { type filter hook prerouting priority -150; policy accept; }\n"
              "add chain inet moat input { type filter hook input priority 0; policy drop; }\n"
              "add chain inet moat forward { type filter hook forward priority 0; policy drop; }\n"
              "add chain inet moat egress\n"
              "add chain inet moat post { type nat hook postrouting priority 100; policy accept; }\n"
              "flush chain inet moat pre\nflush chain inet moat input\nflush chain inet moat forward\n"
              "flush chain inet moat egress\nflush chain inet moat post\n"
              "flush set inet moat hostaddrs\nflush set inet moat blockports\nflush set inet moat services\n"
              "add element inet moat hostaddrs { ");
  host_addrs(n, &s, &len);
  net_sappend(&s, &len, " }\nadd element inet moat blockports { %s }\n", n->block_ports);
  net_sappend(
      &s, &len,
      "add rule inet moat pre iifname \"mv*\" meta nfproto ipv6 drop\n"
      "add rule inet moat input iif lo accept\n"
      "add rule inet moat input ct state established,related accept\n"
      /* a sandbox sends only from its own address (checked for new flows: a spoofed
       * packet never matches an established one) */
      "add rule inet moat input iifname \"mv*\" fib saddr . iif oif missing drop\n"
      "add rule inet moat input iifname \"mv*\" ip saddr @offline drop\n"
      "add rule inet moat input iifname \"mv*\" ip daddr %s udp dport 53 accept\n"
      "add rule inet moat input iifname \"mv*\" ip daddr %s tcp dport 53 accept\n"
      "add rule inet moat input iifname \"mv*\" ip daddr %s tcp dport @services accept\n"
      "add rule inet moat input iifname \"mv*\" ct state new log group " NFLOG_G " prefix \"D host\" drop\n"
      "add rule inet moat forward ct state established,related accept\n"
      "add rule inet moat forward ct state invalid drop\n"
      "add rule inet moat forward iifname \"mv*\" jump egress\n"
      "add rule inet moat egress fib saddr . iif oif missing drop\n"
      "add rule inet moat egress ip saddr @offline log group " NFLOG_G " prefix \"D offline\" drop\n"
      "add rule inet moat egress meta nfproto ipv6 drop\n"
      "add rule inet moat egress oifname \"mv*\" log group " NFLOG_G " prefix \"D sandbox\" drop\n"
      "add rule inet moat egress ip daddr 169.254.0.0/16 log group " NFLOG_G " prefix \"D link-local\" drop\n"
      "add rule inet moat egress ip daddr @hostaddrs log group " NFLOG_G " prefix \"D host\" drop\n"
      "add rule inet moat egress tcp dport @blockports log group " NFLOG_G " prefix \"D port\" drop\n"
      "add rule inet moat egress udp dport @blockports log group " NFLOG_G " prefix \"D port\" drop\n"
      "add rule inet moat egress ip saddr != @policied oifname \"mup0\" log group " NFLOG_G
      " prefix \"A default\" accept\n"
      "add rule inet moat egress ip saddr . ip daddr @deny_net log group " NFLOG_G
      " prefix \"D policy\" drop\n"
      "add rule inet moat egress ip saddr . ip daddr @deny_dns log group " NFLOG_G " prefix \"D name\" drop\n"
      "add rule inet moat egress ip saddr . ip daddr @allow_net log group " NFLOG_G
      " prefix \"A policy\" accept\n"
      "add rule inet moat egress ip saddr . ip daddr @allow_dns log group " NFLOG_G
      " prefix \"A name\" accept\n"
      "add rule inet moat egress ip saddr @egress_deny log group " NFLOG_G " prefix \"D default\" drop\n"
      "add rule inet moat egress oifname \"mup0\" log group " NFLOG_G " prefix \"A default\" accept\n"
      "add rule inet moat egress log group " NFLOG_G " prefix \"D route\" drop\n"
      "add rule inet moat post oifname \"mup0\" masquerade\n",
      dns, dns, dns);
  int r = nft_run(n, s, err);
  free(s);
  return r < 0 ? moat_error_wrap(err, "build table inet moat") : 0;
}

int nft_refresh_hostaddrs(struct moat_net *n, moat_error **err) {
  char *s = NULL;
  size_t len = 0;
  net_sappend(&s, &len, "flush set inet moat hostaddrs\nadd element inet moat hostaddrs { ");
  host_addrs(n, &s, &len);
  net_sappend(&s, &len, " }\n");
  int r = nft_run(n, s, err);
  free(s);
  return r;
}

void nft_close(struct moat_net *n) {
  if (n->nft)
    nft_ctx_free(n->nft);
  if (n->nft_self)
    nft_ctx_free(n->nft_self);
  n->nft = n->nft_self = NULL;
}

static char *uplink_table(struct moat_net *n) { return xasprintf("moat_up_%.12s", n->instance); }

int nft_uplink_open(struct moat_net *n, moat_error **err) {
  _cleanup_free_ char *t = uplink_table(n);
  char link[INET_ADDRSTRLEN];
  ip_str(htonl(n->pool + 6), link);
  const char *up = n->uplink_if, *out = n->outside_link;
  /* Chains sb_nat and sb_fwd (not "fwd": an nft keyword). Sandboxes' flows (masqueraded to link
   * in the routing namespace) leave by the uplink only,
   * never towards link-local addresses; nothing enters moat's veth but their replies; and, with
   * the guard (uplink.c), no new flow in through the uplink is forwarded anywhere. */
  _cleanup_free_ char *guard =
      n->fwd_guard
          ? xasprintf("add rule ip %s sb_fwd iifname \"%s\" ct state != { established, related } drop\n", t,
                      up)
          : xstrdup("");
  _cleanup_free_ char *s =
      xasprintf("add table ip %s\n"
                "add chain ip %s sb_nat { type nat hook postrouting priority 100; policy accept; }\n"
                "add chain ip %s sb_fwd { type filter hook forward priority 0; policy accept; }\n"
                "flush chain ip %s sb_nat\nflush chain ip %s sb_fwd\n"
                "add rule ip %s sb_nat ip saddr %s oifname \"%s\" masquerade\n"
                "add rule ip %s sb_fwd iifname \"%s\" oifname != \"%s\" drop\n"
                "add rule ip %s sb_fwd iifname \"%s\" ip daddr 169.254.0.0/16 drop\n"
                "add rule ip %s sb_fwd oifname \"%s\" ct state != { established, related } drop\n"
                "%s",
                t, t, t, t, t, t, link, up, t, out, up, t, out, t, out, guard);
  if (!n->nft_self)
    n->nft_self = ctx_in(n->self_fd, err);
  if (!n->nft_self)
    return -1;
  return run_ctx(n, n->nft_self, s, err);
}

void nft_uplink_close(struct moat_net *n) {
  _cleanup_free_ char *t = uplink_table(n);
  _cleanup_free_ char *s = xasprintf("delete table ip %s\n", t);
  moat_error *e = NULL;
  if (n->nft_self && run_ctx(n, n->nft_self, s, &e) < 0)
    log_warn("network: %s", moat_error_msg(e));
  moat_error_free(&e);
}

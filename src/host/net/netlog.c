/* netlog.c -- the connection log: nft's "log group" verdicts (nft.c) arrive over NFLOG
 * (libmnl, in the routing namespace); each becomes an entry of the sending sandbox's ring
 * (moat_net_log) naming destination, port, the name its DNS resolved to it, verdict and reason. */
#include "net_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <libmnl/libmnl.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nfnetlink_log.h>
#include <netinet/ip.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../common/log.h"
#include "../../common/util.h"

struct mnl_open_args {
  struct mnl_socket *nl;
};
static int open_fn(void *a) {
  struct mnl_open_args *x = a;
  x->nl = mnl_socket_open2(NETLINK_NETFILTER, SOCK_CLOEXEC);
  if (!x->nl)
    return -1;
  if (mnl_socket_bind(x->nl, 0, MNL_SOCKET_AUTOPID) < 0) {
    mnl_socket_close(x->nl);
    x->nl = NULL;
    return -1;
  }
  return 0;
}

/* cmd: a NFULNL_CFG_CMD_*; mode: set copy mode instead; batch: set queue threshold and flush
 * timeout instead (the kernel sends entries in batches: fewer wakeups of the log thread). */
static int send_cfg(struct mnl_socket *nl, uint16_t group, uint8_t cmd, bool mode, unsigned seq, bool batch) {
  char buf[NET_NLBUF];
  struct nlmsghdr *nlh = mnl_nlmsg_put_header(buf);
  nlh->nlmsg_type = (NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_CONFIG;
  nlh->nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK;
  nlh->nlmsg_seq = seq;
  struct nfgenmsg *nfg = mnl_nlmsg_put_extra_header(nlh, sizeof(*nfg));
  nfg->nfgen_family = AF_UNSPEC;
  nfg->version = NFNETLINK_V0;
  nfg->res_id = htons(group);
  if (batch) {
    mnl_attr_put_u32(nlh, NFULA_CFG_QTHRESH, htonl(64));
    mnl_attr_put_u32(nlh, NFULA_CFG_TIMEOUT, htonl(5)); /* 1/100 s: entries reach the log within 50 ms */
  } else if (mode) {
    struct nfulnl_msg_config_mode m = {.copy_range = htonl(96), .copy_mode = NFULNL_COPY_PACKET};
    mnl_attr_put(nlh, NFULA_CFG_MODE, sizeof(m), &m);
  } else {
    struct nfulnl_msg_config_cmd c = {.command = cmd};
    mnl_attr_put(nlh, NFULA_CFG_CMD, sizeof(c), &c);
  }
  if (mnl_socket_sendto(nl, nlh, nlh->nlmsg_len) < 0)
    return -1;
  ssize_t r = mnl_socket_recvfrom(nl, buf, sizeof(buf));
  if (r < 0)
    return -1;
  return mnl_cb_run(buf, (size_t)r, seq, mnl_socket_get_portid(nl), NULL, NULL) < 0 ? -1 : 0;
}

struct pkt {
  const char *prefix;
  const uint8_t *payload;
  size_t plen;
};
static int pkt_attr_cb(const struct nlattr *attr, void *data) {
  struct pkt *p = data;
  switch (mnl_attr_get_type(attr)) {
  case NFULA_PREFIX:
    p->prefix = mnl_attr_get_str(attr);
    break;
  case NFULA_PAYLOAD:
    p->payload = mnl_attr_get_payload(attr);
    p->plen = mnl_attr_get_payload_len(attr);
    break;
  }
  return MNL_CB_OK;
}

static void record(struct moat_net *n, const struct pkt *p) {
  if (!p->prefix || !p->payload || p->plen < 20)
    return;
  const struct iphdr *ip = (const struct iphdr *)p->payload;
  if (ip->version != 4)
    return;
  size_t ihl = (size_t)ip->ihl * 4;
  uint16_t dport = 0;
  if ((ip->protocol == IPPROTO_TCP || ip->protocol == IPPROTO_UDP) && p->plen >= ihl + 4)
    dport = (uint16_t)(p->payload[ihl + 2] << 8 | p->payload[ihl + 3]);
  int slot = net_slot_of_ip(n, ip->saddr);
  if (slot < 0)
    return;
  moat_net_log_hook hook = atomic_load(&n->log_hook);
  json_t *hooked = NULL;
  char id[sizeof(n->slots[0].id)] = "";
  pthread_mutex_lock(&n->lock);
  struct net_slot *s = &n->slots[slot];
  if (s->state == NS_LEASED && s->bound && s->log) {
    struct net_log_entry *e = &s->log[s->log_seq % NET_LOG_RING];
    memset(e, 0, sizeof(*e));
    e->seq = s->log_seq++;
    e->time_ms = now_unix_ms();
    e->daddr = ip->daddr;
    e->dport = dport;
    e->proto = ip->protocol;
    e->allowed = p->prefix[0] == 'A';
    snprintf(e->reason, sizeof(e->reason), "%s", p->prefix[0] && p->prefix[1] ? p->prefix + 2 : "");
    net_learned_name(s, ip->daddr, e->name);
    if (e->allowed)
      s->connections++;
    if (hook && s->id[0]) {
      hooked = net_log_entry_json(e, s->id, s->org);
      snprintf(id, sizeof(id), "%s", s->id);
    }
  }
  pthread_mutex_unlock(&n->lock);
  if (hooked) {
    hook(id, hooked, n->log_hook_arg);
    json_decref(hooked);
  }
}

static int msg_cb(const struct nlmsghdr *nlh, void *data) {
  if ((nlh->nlmsg_type & 0xff) != NFULNL_MSG_PACKET)
    return MNL_CB_OK;
  struct pkt p = {0};
  mnl_attr_parse(nlh, sizeof(struct nfgenmsg), pkt_attr_cb, &p);
  record(data, &p);
  return MNL_CB_OK;
}

static void *log_main(void *arg) {
  struct moat_net *n = arg;
  char buf[NET_NLBUF * 4];
  int fd = mnl_socket_get_fd(n->nflog);
  for (;;) {
    struct pollfd p[2] = {{.fd = fd, .events = POLLIN}, {.fd = n->stop_pipe[0], .events = POLLIN}};
    if (poll(p, 2, 1000) < 0 && errno != EINTR)
      break;
    if (p[1].revents)
      break;
    if (!(p[0].revents & POLLIN))
      continue;
    ssize_t r = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (r <= 0)
      continue; /* ENOBUFS: entries were lost under load */
    mnl_cb_run(buf, (size_t)r, 0, 0, msg_cb, n);
  }
  return NULL;
}

int netlog_start(struct moat_net *n, moat_error **err) {
  struct mnl_open_args a = {NULL};
  if (net_in_ns(n->router_fd, open_fn, &a, err) < 0 || !a.nl)
    return err && *err ? -1 : moat_error_errno(err, "NFLOG socket");
  n->nflog = a.nl;
  if (send_cfg(n->nflog, NET_NFLOG_GROUP, NFULNL_CFG_CMD_BIND, false, 1, false) < 0 ||
      send_cfg(n->nflog, NET_NFLOG_GROUP, 0, true, 2, false) < 0 ||
      send_cfg(n->nflog, NET_NFLOG_GROUP, 0, false, 3, true) < 0)
    return moat_error_errno(err, "bind NFLOG group %d", NET_NFLOG_GROUP);
  int sz = 1 << 20;
  setsockopt(mnl_socket_get_fd(n->nflog), SOL_SOCKET, SO_RCVBUF, &sz, sizeof(sz));
  if (pthread_create(&n->log_thread, NULL, log_main, n) != 0)
    return moat_error_set(err, EAGAIN, "start the connection log thread");
  n->log_started = true;
  return 0;
}

void netlog_stop(struct moat_net *n) {
  /* dns_stop wrote to stop_pipe before closing it; the thread also wakes every second. */
  if (n->log_started) {
    pthread_join(n->log_thread, NULL);
    n->log_started = false;
  }
  if (n->nflog)
    mnl_socket_close(n->nflog);
  n->nflog = NULL;
}

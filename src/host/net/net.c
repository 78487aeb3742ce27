/* net.c -- sandbox network slots over netlink (libmnl): the routing namespace, veth pairs, /30s,
 * the warm set, attach, teardown, adoption and reconcile; binding a slot to a sandbox's policy */
#include "net_internal.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libmnl/libmnl.h>
#include <linux/if.h>
#include <linux/openat2.h>
#include <linux/if_link.h>
#include <linux/rtnetlink.h>
#include <linux/nsfs.h>
#include <linux/veth.h>

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "../../common/fault.h"
#include "../../common/log.h"
#include "../../common/util.h"

#define NET_RUN_DIR "/run/moat/net"
#define DEFAULT_POOL "10.200.0.0/16"
#define DEFAULT_BLOCK_PORTS "3333,3334,4444,5555,6666,7777,8888,9999,14433,14444,45560,45700"
#define FIRST_SLOT 2

/* Creates or replaces path with content. 0 or -1. */
int moat_net_put_file(const char *path, const char *content, moat_error **err) {
  _cleanup_close_ int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0)
    return moat_error_errno(err, "create %s", path);
  if (write_all(fd, content, strlen(content)) < 0)
    return moat_error_errno(err, "write %s", path);
  return 0;
}

/* ---- namespaces ---- */

int net_in_ns(int nsfd, int (*fn)(void *), void *arg, moat_error **err) {
  _cleanup_close_ int cur = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
  if (cur < 0)
    return moat_error_errno(err, "open own netns");
  if (setns(nsfd, CLONE_NEWNET) < 0)
    return moat_error_errno(err, "setns net");
  int r = fn(arg);
  int saved = errno;
  if (setns(cur, CLONE_NEWNET) < 0) {
    /* This thread would stay in another namespace: nothing safe is left to do. */
    log_error("setns back to moatd's netns: %s", strerror(errno));
    abort();
  }
  errno = saved;
  return r;
}

struct sock_args {
  int domain, type, proto, fd;
};
static int sock_fn(void *a) {
  struct sock_args *s = a;
  s->fd = socket(s->domain, s->type | SOCK_CLOEXEC, s->proto);
  return s->fd < 0 ? -1 : 0;
}
int net_socket_in(int nsfd, int domain, int type, int proto, moat_error **err) {
  struct sock_args s = {domain, type, proto, -1};
  if (net_in_ns(nsfd, sock_fn, &s, err) < 0)
    return err && *err ? -1 : moat_error_errno(err, "socket in netns");
  return s.fd;
}

struct mnl_args {
  struct mnl_socket *nl;
  int bus;
};
static int mnl_fn(void *a) {
  struct mnl_args *m = a;
  m->nl = mnl_socket_open2(m->bus, SOCK_CLOEXEC);
  if (!m->nl)
    return -1;
  if (mnl_socket_bind(m->nl, 0, MNL_SOCKET_AUTOPID) < 0) {
    mnl_socket_close(m->nl);
    m->nl = NULL;
    return -1;
  }
  return 0;
}
static struct mnl_socket *mnl_in(int nsfd, int bus, moat_error **err) {
  struct mnl_args m = {NULL, bus};
  if (net_in_ns(nsfd, mnl_fn, &m, err) < 0) {
    if (err && !*err)
      moat_error_errno(err, "netlink socket in netns");
    return NULL;
  }
  return m.nl;
}

int net_slot_of_ip(const struct moat_net *n, uint32_t addr_be) {
  uint32_t a = ntohl(addr_be);
  if (a < n->pool || a >= n->pool + n->pool_size * 4 || (a & 3) != 2)
    return -1;
  int slot = (int)((a - n->pool) / 4);
  return slot >= FIRST_SLOT ? slot : -1;
}

/* ---- netlink requests ---- */

/* Sends nlh and waits for its ack. 0, or -1 with the kernel's errno. */
static int nl_talk(struct mnl_socket *nl, struct nlmsghdr *nlh, unsigned seq) {
  nlh->nlmsg_flags |= NLM_F_ACK;
  nlh->nlmsg_seq = seq;
  if ((moat_fault(MOAT_FAULT_NETLINK) ? (errno = ENOBUFS, -1) : mnl_socket_sendto(nl, nlh, nlh->nlmsg_len)) <
      0)
    return -1;
  char buf[NET_NLBUF];
  unsigned portid = mnl_socket_get_portid(nl);
  for (;;) {
    ssize_t r = mnl_socket_recvfrom(nl, buf, sizeof(buf));
    if (r < 0) {
      if (errno == EINTR)
        continue;
      return -1;
    }
    int rc = mnl_cb_run(buf, (size_t)r, seq, portid, NULL, NULL);
    if (rc <= MNL_CB_STOP)
      return rc < 0 ? -1 : 0;
  }
}

/* Runs a request on the routing ns socket. */
static int router_talk(struct moat_net *n, struct nlmsghdr *nlh) {
  pthread_mutex_lock(&n->nl_lock);
  int r = nl_talk(n->nl, nlh, ++n->nl_seq);
  int saved = errno;
  pthread_mutex_unlock(&n->nl_lock);
  errno = saved;
  return r;
}

static struct nlmsghdr *link_msg(char *buf, uint16_t type, uint16_t flags, int ifindex) {
  struct nlmsghdr *nlh = mnl_nlmsg_put_header(buf);
  nlh->nlmsg_type = type;
  nlh->nlmsg_flags = NLM_F_REQUEST | flags;
  struct ifinfomsg *ifi = mnl_nlmsg_put_extra_header(nlh, sizeof(*ifi));
  ifi->ifi_family = AF_UNSPEC;
  ifi->ifi_index = ifindex;
  return nlh;
}

/* Creates veth name <-> peer in the socket's ns; the peer goes to peer_ns (-1: same ns). */
static struct nlmsghdr *veth_msg(char *buf, const char *name, const char *peer, int peer_ns) {
  struct nlmsghdr *nlh = link_msg(buf, RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, 0);
  mnl_attr_put_strz(nlh, IFLA_IFNAME, name);
  struct nlattr *li = mnl_attr_nest_start(nlh, IFLA_LINKINFO);
  mnl_attr_put_strz(nlh, IFLA_INFO_KIND, "veth");
  struct nlattr *data = mnl_attr_nest_start(nlh, IFLA_INFO_DATA);
  struct nlattr *pi = mnl_attr_nest_start(nlh, VETH_INFO_PEER);
  struct ifinfomsg *pifi = mnl_nlmsg_put_extra_header(nlh, sizeof(struct ifinfomsg));
  pifi->ifi_family = AF_UNSPEC;
  mnl_attr_put_strz(nlh, IFLA_IFNAME, peer);
  if (peer_ns >= 0)
    mnl_attr_put_u32(nlh, IFLA_NET_NS_FD, (uint32_t)peer_ns);
  mnl_attr_nest_end(nlh, pi);
  mnl_attr_nest_end(nlh, data);
  mnl_attr_nest_end(nlh, li);
  return nlh;
}

static struct nlmsghdr *up_msg(char *buf, int ifindex) {
  struct nlmsghdr *nlh = link_msg(buf, RTM_NEWLINK, 0, ifindex);
  struct ifinfomsg *ifi = mnl_nlmsg_get_payload(nlh);
  ifi->ifi_flags = IFF_UP;
  ifi->ifi_change = IFF_UP;
  return nlh;
}

static struct nlmsghdr *addr_msg(char *buf, int ifindex, uint32_t addr_be, uint8_t plen) {
  struct nlmsghdr *nlh = mnl_nlmsg_put_header(buf);
  nlh->nlmsg_type = RTM_NEWADDR;
  nlh->nlmsg_flags = NLM_F_REQUEST | NLM_F_CREATE | NLM_F_REPLACE;
  struct ifaddrmsg *ifa = mnl_nlmsg_put_extra_header(nlh, sizeof(*ifa));
  ifa->ifa_family = AF_INET;
  ifa->ifa_prefixlen = plen;
  ifa->ifa_scope = RT_SCOPE_UNIVERSE;
  ifa->ifa_index = (unsigned)ifindex;
  mnl_attr_put_u32(nlh, IFA_LOCAL, addr_be);
  mnl_attr_put_u32(nlh, IFA_ADDRESS, addr_be);
  return nlh;
}

static struct nlmsghdr *default_route_msg(char *buf, uint32_t gw_be, int ifindex) {
  struct nlmsghdr *nlh = mnl_nlmsg_put_header(buf);
  nlh->nlmsg_type = RTM_NEWROUTE;
  nlh->nlmsg_flags = NLM_F_REQUEST | NLM_F_CREATE | NLM_F_REPLACE;
  struct rtmsg *rtm = mnl_nlmsg_put_extra_header(nlh, sizeof(*rtm));
  rtm->rtm_family = AF_INET;
  rtm->rtm_table = RT_TABLE_MAIN;
  rtm->rtm_protocol = RTPROT_STATIC;
  rtm->rtm_scope = RT_SCOPE_UNIVERSE;
  rtm->rtm_type = RTN_UNICAST;
  mnl_attr_put_u32(nlh, RTA_GATEWAY, gw_be);
  mnl_attr_put_u32(nlh, RTA_OIF, (uint32_t)ifindex);
  return nlh;
}

/* ifindex of name in the ns of dgram socket fd, or -1. */
static int ifindex_of(int fd, const char *name) {
  struct ifreq ifr;
  memset(&ifr, 0, sizeof(ifr));
  snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "%s", name);
  if (ioctl(fd, SIOCGIFINDEX, &ifr) < 0)
    return -1;
  return ifr.ifr_ifindex;
}

static int router_ifindex(struct moat_net *n, const char *name) {
  _cleanup_close_ int fd = net_socket_in(n->router_fd, AF_INET, SOCK_DGRAM, 0, NULL);
  return fd < 0 ? -1 : ifindex_of(fd, name);
}

static int router_dellink(struct moat_net *n, const char *name) {
  char buf[NET_NLBUF];
  struct nlmsghdr *nlh = link_msg(buf, RTM_DELLINK, 0, 0);
  mnl_attr_put_strz(nlh, IFLA_IFNAME, name);
  if (router_talk(n, nlh) < 0 && errno != ENODEV)
    return -1;
  return 0;
}

/* Builds slot i's veth pair in the routing ns: mvI (router side, .1/30, up) and mpI. */
static int build_slot(struct moat_net *n, int i, moat_error **err) {
  char buf[NET_NLBUF], name[IFNAMSIZ], peer[IFNAMSIZ];
  snprintf(name, sizeof(name), "mv%d", i);
  snprintf(peer, sizeof(peer), "mp%d", i);
  if (router_talk(n, veth_msg(buf, name, peer, -1)) < 0) {
    if (errno != EEXIST)
      return moat_error_errno(err, "create veth %s", name);
    /* Left over from a crash: start over. */
    router_dellink(n, name);
    if (router_talk(n, veth_msg(buf, name, peer, -1)) < 0)
      return moat_error_errno(err, "create veth %s", name);
  }
  _cleanup_close_ int fd = net_socket_in(n->router_fd, AF_INET, SOCK_DGRAM, 0, err);
  if (fd < 0)
    goto fail;
  int idx = ifindex_of(fd, name), pidx = ifindex_of(fd, peer);
  if (idx < 0 || pidx < 0) {
    moat_error_errno(err, "ifindex of %s", name);
    goto fail;
  }
  if (router_talk(n, addr_msg(buf, idx, net_slot_router_ip(n, i), 30)) < 0 ||
      router_talk(n, up_msg(buf, idx)) < 0) {
    moat_error_errno(err, "address %s", name);
    goto fail;
  }
  n->slots[i].peer_ifindex = pidx;
  return 0;
fail:
  router_dellink(n, name);
  return -1;
}

/* ---- the sandbox side ---- */

struct inside_args {
  struct moat_net *n;
  int slot;
  int err_step;
};

/* In the sandbox's netns: eth0 addressed, up, default route via the router side. */
static int inside_fn(void *a) {
  struct inside_args *x = a;
  struct mnl_socket *nl = mnl_socket_open2(NETLINK_ROUTE, SOCK_CLOEXEC);
  if (!nl)
    return -1;
  int ret = -1;
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || mnl_socket_bind(nl, 0, MNL_SOCKET_AUTOPID) < 0)
    goto out;
  int idx = ifindex_of(fd, "eth0");
  if (idx < 0)
    goto out;
  char buf[NET_NLBUF];
  x->err_step = 1;
  if (nl_talk(nl, addr_msg(buf, idx, net_slot_sandbox_ip(x->n, x->slot), 30), 1) < 0)
    goto out;
  x->err_step = 2;
  if (nl_talk(nl, up_msg(buf, idx), 2) < 0)
    goto out;
  x->err_step = 3;
  if (nl_talk(nl, default_route_msg(buf, net_slot_router_ip(x->n, x->slot), idx), 3) < 0)
    goto out;
  ret = 0;
out:
  if (fd >= 0)
    close(fd);
  mnl_socket_close(nl);
  return ret;
}

/* Takes a prepared slot, or builds one here when none is. Returns the index or -1. */
static int take_slot(struct moat_net *n, moat_error **err) {
  pthread_mutex_lock(&n->lock);
  int pick = -1, free_idx = -1;
  for (unsigned i = FIRST_SLOT; i < n->pool_size; i++) {
    if (n->slots[i].state == NS_PREPARED) {
      pick = (int)i;
      break;
    }
    if (free_idx < 0 && n->slots[i].state == NS_FREE)
      free_idx = (int)i;
  }
  if (pick >= 0) {
    n->slots[pick].state = NS_LEASED;
    n->prepared--;
    n->leased++;
    pthread_cond_broadcast(&n->wake); /* the worker prepares another */
    pthread_mutex_unlock(&n->lock);
    return pick;
  }
  if (free_idx < 0) {
    pthread_mutex_unlock(&n->lock);
    return moat_error_set(err, EAGAIN, "no free network slot (pool of %u)", n->pool_size);
  }
  n->slots[free_idx].state = NS_BUILDING;
  pthread_mutex_unlock(&n->lock);
  int r = build_slot(n, free_idx, err);
  pthread_mutex_lock(&n->lock);
  if (r < 0) {
    n->slots[free_idx].state = NS_FREE;
  } else {
    n->slots[free_idx].state = NS_LEASED;
    n->leased++;
  }
  pthread_mutex_unlock(&n->lock);
  return r < 0 ? -1 : free_idx;
}

static void slot_reset(struct net_slot *s) {
  s->bound = false;
  s->id[0] = s->org[0] = '\0';
  if (s->policy_json)
    json_decref(s->policy_json);
  s->policy_json = NULL;
  net_policy_clear(&s->pol);
  s->n_learned = s->learned_next = 0;
  s->log_seq = 0;
  s->connections = 0;
  s->link_down = s->link_want_down = false;
}

static void queue_teardown(struct moat_net *n, int slot) {
  struct net_slot *s = &n->slots[slot];
  if (s->state == NS_LEASED)
    n->leased--;
  else if (s->state == NS_PREPARED)
    n->prepared--;
  s->state = NS_TEARDOWN;
  s->teardown_since_ns = now_ns();
  n->tearing++;
  s->next_teardown = n->teardown_head;
  n->teardown_head = s;
  pthread_cond_broadcast(&n->wake);
}

int moat_net_attach_fd(struct moat_net *n, int netns_fd, moat_error **err) {
  int slot = take_slot(n, err);
  if (slot < 0)
    return moat_error_wrap(err, "network slot");
  _cleanup_free_ char *path = xasprintf("%s/%d", n->state_dir, slot);
  char buf[NET_NLBUF];
  struct nlmsghdr *nlh = link_msg(buf, RTM_NEWLINK, 0, n->slots[slot].peer_ifindex);
  mnl_attr_put_u32(nlh, IFLA_NET_NS_FD, (uint32_t)netns_fd);
  mnl_attr_put_strz(nlh, IFLA_IFNAME, "eth0");
  if (router_talk(n, nlh) < 0) {
    moat_error_errno(err, "move mp%d into the sandbox", slot);
    goto fail;
  }
  struct inside_args x = {n, slot, 0};
  if (net_in_ns(netns_fd, inside_fn, &x, err) < 0) {
    static const char *steps[] = {"find eth0", "address eth0", "bring eth0 up", "default route"};
    if (err && !*err)
      moat_error_errno(err, "sandbox side: %s", steps[x.err_step]);
    goto fail;
  }
  if (moat_net_put_file(path, "{}", err) < 0)
    goto fail;
  return slot;
fail:
  pthread_mutex_lock(&n->lock);
  queue_teardown(n, slot);
  pthread_mutex_unlock(&n->lock);
  return moat_error_wrap(err, "attach network slot %d", slot);
}

/* Writes /etc/resolv.conf inside the sandbox's root (no symlink may lead out of it). */
static int write_resolv(struct moat_net *n, pid_t pid, uid_t uid_base, moat_error **err) {
  _cleanup_free_ char *root = xasprintf("/proc/%d/root", pid);
  _cleanup_close_ int rfd = open(root, O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (rfd < 0)
    return moat_error_errno(err, "open %s", root);
  struct open_how how = {.flags = O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW,
                         .mode = 0644,
                         .resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS};
  _cleanup_close_ int fd = (int)syscall(SYS_openat2, rfd, "etc/resolv.conf", &how, sizeof(how));
  if (fd < 0)
    return moat_error_errno(err, "open the sandbox's /etc/resolv.conf");
  char addr[INET_ADDRSTRLEN];
  uint32_t dns = net_dns_ip(n);
  inet_ntop(AF_INET, &dns, addr, sizeof(addr));
  _cleanup_free_ char *content =
      xasprintf("# moat: moatd answers DNS for this sandbox\nnameserver %s\n", addr);
  if (write_all(fd, content, strlen(content)) < 0)
    return moat_error_errno(err, "write the sandbox's /etc/resolv.conf");
  if (fchown(fd, uid_base, uid_base) < 0)
    return moat_error_errno(err, "chown the sandbox's /etc/resolv.conf");
  return 0;
}

int moat_net_attach(struct moat_net *n, pid_t pid, bool resolv, uid_t uid_base, moat_error **err) {
  _cleanup_free_ char *path = xasprintf("/proc/%d/ns/net", pid);
  _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return moat_error_errno(err, "open %s", path);
  int slot = moat_net_attach_fd(n, fd, err);
  if (slot < 0)
    return -1;
  if (resolv && write_resolv(n, pid, uid_base, err) < 0) {
    moat_net_release(n, slot);
    return -1;
  }
  return slot;
}

void moat_net_release(struct moat_net *n, int slot) {
  if (!n || slot < FIRST_SLOT || (unsigned)slot >= n->pool_size)
    return;
  pthread_mutex_lock(&n->lock);
  if (n->slots[slot].state == NS_LEASED)
    queue_teardown(n, slot);
  pthread_mutex_unlock(&n->lock);
}

/* ---- binding, policy ---- */

/* A sandbox id usable as a file name. */
static bool id_ok(const char *id) {
  if (!id || !id[0] || strlen(id) > 64)
    return false;
  for (const char *p = id; *p; p++)
    if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '-' ||
          *p == '_'))
      return false;
  return true;
}

json_t *moat_net_saved_policy(struct moat_net *n, const char *id) {
  if (!n || !id_ok(id))
    return NULL;
  _cleanup_free_ char *path = xasprintf("%s/by-id/%s.json", n->state_dir, id);
  _cleanup_free_ char *text = NULL;
  if (read_file(path, &text, NULL, NULL) < 0)
    return NULL;
  json_t *j = json_loads(text, 0, NULL);
  if (j && moat_net_policy_check(j, NULL) < 0) {
    json_decref(j);
    return NULL;
  }
  return j;
}

/* A copy of policy (NULL = the default) with every field, so that GET shows the effective one. */
static json_t *policy_filled(json_t *policy) {
  json_t *pj = policy ? json_deep_copy(policy) : moat_net_policy_default();
  if (!json_object_get(pj, "internet"))
    json_object_set_new(pj, "internet", json_true());
  if (!json_object_get(pj, "egress"))
    json_object_set_new(pj, "egress", json_string("allow"));
  if (!json_object_get(pj, "allow"))
    json_object_set_new(pj, "allow", json_array());
  if (!json_object_get(pj, "deny"))
    json_object_set_new(pj, "deny", json_array());
  return pj;
}

void moat_net_forget(struct moat_net *n, const char *id) {
  if (!n || !id_ok(id))
    return;
  _cleanup_free_ char *path = xasprintf("%s/by-id/%s.json", n->state_dir, id);
  unlink(path);
}

int moat_net_bind(struct moat_net *n, int slot, const char *id, const char *org, json_t *policy,
                  moat_error **err) {
  if (slot < FIRST_SLOT || (unsigned)slot >= n->pool_size)
    return moat_error_set(err, EINVAL, "network slot %d out of range", slot);
  struct net_policy p;
  if (net_policy_parse(policy, &p, err) < 0)
    return -1;
  json_t *pj = policy_filled(policy);

  /* policy_lock across the whole change: the slot's nft elements, its link state and its state
   * file always match s->pol (a second bind, a teardown or a DNS answer waits); n->lock only
   * while the slot's memory is read or written, never across a round trip. */
  pthread_mutex_lock(&n->policy_lock);
  pthread_mutex_lock(&n->lock);
  struct net_slot *s = &n->slots[slot];
  if (s->state != NS_LEASED) {
    pthread_mutex_unlock(&n->lock);
    pthread_mutex_unlock(&n->policy_lock);
    net_policy_clear(&p);
    json_decref(pj);
    return moat_error_set(err, ENOENT, "network slot %d is not leased", slot);
  }
  if (!s->log)
    s->log = xcalloc(NET_LOG_RING, sizeof(*s->log));
  if (!s->learned)
    s->learned = xcalloc(NET_LEARN_MAX, sizeof(*s->learned));
  bool had = s->bound;
  const struct net_policy *old = &s->pol; /* stays as it is while policy_lock is held */
  bool is_default = p.internet && !p.egress_deny && !p.n_allow && !p.n_deny;
  bool old_custom = had && !(old->internet && !old->egress_deny && !old->n_allow && !old->n_deny);
  /* The nft transaction: old policy's elements out, new ones in, atomically. */
  char *script = NULL;
  size_t len = 0;
  if (had)
    nft_policy_elements(n, slot, old, "delete", &script, &len);
  nft_policy_elements(n, slot, &p, "add", &script, &len);
  pthread_mutex_unlock(&n->lock);
  int r = nft_run(n, script, err);
  free(script);
  if (r < 0) {
    pthread_mutex_unlock(&n->policy_lock);
    net_policy_clear(&p);
    json_decref(pj);
    return moat_error_wrap(err, "apply network policy");
  }
  /* internet: false is enforced by nft (above) and moatd's DNS from here on. The router side of
   * the link also goes down (the sandbox's eth0 loses its carrier, so that its programs fail at
   * once rather than time out), by the worker, off the request path: RTM_NEWLINK takes the rtnl
   * lock, which a veth being built or deleted elsewhere may hold for milliseconds. */
  /* The slot may have been released meanwhile (its teardown waits for policy_lock): it is
   * updated all the same, so that the teardown removes what is in nft now. */
  pthread_mutex_lock(&n->lock);
  s->link_want_down = !p.internet;
  if (s->link_want_down != s->link_down) {
    n->link_dirty = true;
    pthread_cond_broadcast(&n->wake);
  }
  bool same_sandbox = had && strcmp(s->id, id) == 0;
  net_policy_clear(&s->pol);
  s->pol = p;
  if (s->policy_json)
    json_decref(s->policy_json);
  s->policy_json = pj;
  snprintf(s->id, sizeof(s->id), "%s", id);
  snprintf(s->org, sizeof(s->org), "%s", org);
  s->bound = true;
  if (!same_sandbox) {
    s->log_seq = 0;
    s->connections = 0;
  }
  pthread_mutex_unlock(&n->lock);
  /* Addresses learned under the old policy may not be allowed by the new one: forget them all (the
   * sandbox's next lookup learns them again under the new policy). */
  if (had)
    net_forget_learned(n, slot);
  /* Byte counts are those of the slot's veth, made for this sandbox (slots are never handed to a
   * second one): no baseline to read on the request path. */
  /* By sandbox id, for a wake, rollback or fork after this slot is gone. No file means the
   * default policy: a default create writes nothing here. */
  if (id_ok(id) && is_default && old_custom) {
    _cleanup_free_ char *by_id = xasprintf("%s/by-id/%s.json", n->state_dir, id);
    unlink(by_id);
  }
  if (id_ok(id) && !is_default) {
    _cleanup_free_ char *text_p = json_dumps(pj, JSON_COMPACT);
    _cleanup_free_ char *by_id = xasprintf("%s/by-id/%s.json", n->state_dir, id);
    moat_error *e3 = NULL;
    if (moat_net_put_file(by_id, text_p, &e3) < 0) {
      log_warn("network: %s", moat_error_msg(e3));
      moat_error_free(&e3);
    }
  }
  /* For adoption after a restart. */
  json_t *st = json_pack("{s:s, s:s, s:O}", "id", id, "org", org, "policy", pj);
  _cleanup_free_ char *text = json_dumps(st, JSON_COMPACT);
  json_decref(st);
  _cleanup_free_ char *path = xasprintf("%s/%d", n->state_dir, slot);
  moat_error *e2 = NULL;
  if (moat_net_put_file(path, text, &e2) < 0) {
    log_warn("network slot %d: %s", slot, moat_error_msg(e2));
    moat_error_free(&e2);
  }
  pthread_mutex_unlock(&n->policy_lock);
  return 0;
}

struct link_stats_ctx {
  uint64_t rx, tx;
  bool found;
};
static int link_attr_cb(const struct nlattr *attr, void *data) {
  struct link_stats_ctx *c = data;
  if (mnl_attr_get_type(attr) == IFLA_STATS64 &&
      mnl_attr_get_payload_len(attr) >= sizeof(struct rtnl_link_stats64)) {
    struct rtnl_link_stats64 st;
    memcpy(&st, mnl_attr_get_payload(attr), sizeof(st));
    c->rx = st.rx_bytes;
    c->tx = st.tx_bytes;
    c->found = true;
  }
  return MNL_CB_OK;
}
static int link_msg_cb(const struct nlmsghdr *nlh, void *data) {
  return mnl_attr_parse(nlh, sizeof(struct ifinfomsg), link_attr_cb, data);
}

/* Bytes received / sent by the router side of slot's veth (rx = the sandbox sent). */
static int link_counters(struct moat_net *n, int slot, uint64_t *rx, uint64_t *tx) {
  char buf[NET_NLBUF], name[IFNAMSIZ];
  snprintf(name, sizeof(name), "mv%d", slot);
  /* With an ack the kernel ends the single reply with NLMSG_ERROR 0: mnl_cb_run says stop. */
  struct nlmsghdr *nlh = link_msg(buf, RTM_GETLINK, NLM_F_ACK, 0);
  mnl_attr_put_strz(nlh, IFLA_IFNAME, name);
  struct link_stats_ctx c = {0};
  pthread_mutex_lock(&n->nl_lock);
  unsigned seq = ++n->nl_seq;
  nlh->nlmsg_seq = seq;
  int ret = -1;
  if (mnl_socket_sendto(n->nl, nlh, nlh->nlmsg_len) >= 0) {
    ssize_t r;
    while ((r = mnl_socket_recvfrom(n->nl, buf, sizeof(buf))) > 0) {
      int rc = mnl_cb_run(buf, (size_t)r, seq, mnl_socket_get_portid(n->nl), link_msg_cb, &c);
      if (rc <= MNL_CB_STOP) {
        ret = rc < 0 ? -1 : 0;
        break;
      }
    }
  }
  pthread_mutex_unlock(&n->nl_lock);
  if (ret < 0 || !c.found)
    return -1;
  *rx = c.rx;
  *tx = c.tx;
  return 0;
}

json_t *moat_net_describe(struct moat_net *n, int slot, moat_error **err) {
  if (slot < FIRST_SLOT || (unsigned)slot >= n->pool_size)
    return moat_error_set(err, ENOENT, "no network slot %d", slot), NULL;
  uint64_t rx = 0, tx = 0;
  int have = link_counters(n, slot, &rx, &tx);
  pthread_mutex_lock(&n->lock);
  struct net_slot *s = &n->slots[slot];
  if (s->state != NS_LEASED) {
    pthread_mutex_unlock(&n->lock);
    moat_error_set(err, ENOENT, "network slot %d is not leased", slot);
    return NULL;
  }
  char addr[INET_ADDRSTRLEN], dns[INET_ADDRSTRLEN];
  uint32_t a = net_slot_sandbox_ip(n, slot), d = net_dns_ip(n);
  inet_ntop(AF_INET, &a, addr, sizeof(addr));
  inet_ntop(AF_INET, &d, dns, sizeof(dns));
  json_t *pol = s->policy_json ? json_incref(s->policy_json) : moat_net_policy_default();
  /* the veth was made for this sandbox (a slot is never handed to a second one): its counters
   * are the sandbox's own */
  uint64_t out_b = have == 0 ? rx : 0;
  uint64_t in_b = have == 0 ? tx : 0;
  json_t *j =
      json_pack("{s:s, s:s, s:o, s:I, s:I, s:I}", "address", addr, "dns", dns, "policy", pol, "bytes_out",
                (json_int_t)out_b, "bytes_in", (json_int_t)in_b, "connections", (json_int_t)s->connections);
  pthread_mutex_unlock(&n->lock);
  return j;
}

json_t *net_log_entry_json(const struct net_log_entry *le, const char *id, const char *org) {
  char dst[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &le->daddr, dst, sizeof(dst));
  const char *proto = le->proto == IPPROTO_TCP    ? "tcp"
                      : le->proto == IPPROTO_UDP  ? "udp"
                      : le->proto == IPPROTO_ICMP ? "icmp"
                                                  : "other";
  return json_pack("{s:I, s:I, s:s, s:s, s:s, s:s, s:i, s:s?, s:s, s:s}", "seq", (json_int_t)le->seq + 1,
                   "time_ms", (json_int_t)le->time_ms, "sandbox_id", id, "org", org, "protocol", proto,
                   "destination", dst, "port", (int)le->dport, "name", le->name[0] ? le->name : NULL,
                   "verdict", le->allowed ? "allowed" : "denied", "reason", le->reason);
}

void moat_net_set_log_hook(struct moat_net *n, moat_net_log_hook fn, void *arg) {
  if (!n)
    return;
  n->log_hook_arg = arg;
  atomic_store(&n->log_hook, fn); /* after arg: the log thread reads the hook, then its arg */
}

json_t *moat_net_log(struct moat_net *n, int slot, uint64_t since, unsigned limit, moat_error **err) {
  if (slot < FIRST_SLOT || (unsigned)slot >= n->pool_size)
    return moat_error_set(err, ENOENT, "no network slot %d", slot), NULL;
  json_t *arr = json_array();
  pthread_mutex_lock(&n->lock);
  struct net_slot *s = &n->slots[slot];
  if (s->state == NS_LEASED && s->log) {
    uint64_t first = s->log_seq > NET_LOG_RING ? s->log_seq - NET_LOG_RING : 0;
    if (since > first)
      first = since;
    for (uint64_t q = first; q < s->log_seq && json_array_size(arr) < limit; q++)
      json_array_append_new(arr, net_log_entry_json(&s->log[q % NET_LOG_RING], s->id, s->org));
  }
  pthread_mutex_unlock(&n->lock);
  return arr;
}

/* ---- worker: warm set and teardown ---- */

#define TEARDOWN_WAIT_NS (3ull * 1000000000ull)

/* Tears slot s down. The kernel removes the veth with the sandbox's namespace (in batches, one
 * RCU grace period for many); only one still there after TEARDOWN_WAIT_NS (or with force) is
 * deleted here (~39 ms under the rtnl lock each). Returns 1 when deferred (veth still there). */
static int teardown_one(struct moat_net *n, struct net_slot *s, bool force) {
  int slot = (int)(s - n->slots);
  char name[IFNAMSIZ];
  snprintf(name, sizeof(name), "mv%d", slot);
  if (ifindex_of(n->router_ioctl, name) >= 0) {
    if (!force && now_ns() - s->teardown_since_ns < TEARDOWN_WAIT_NS)
      return 1;
    if (router_dellink(n, name) < 0)
      log_warn("network slot %d: delete %s: %s", slot, name, strerror(errno));
  }
  /* policy_lock: a bind or DNS answer still running for this slot finishes first, and none
   * starts (the slot is no longer leased), so what is deleted here is all the slot has in nft. */
  pthread_mutex_lock(&n->policy_lock);
  net_forget_learned(n, slot);
  char *script = NULL;
  size_t len = 0;
  pthread_mutex_lock(&n->lock);
  if (s->bound)
    nft_policy_elements(n, slot, &s->pol, "delete", &script, &len);
  slot_reset(s);
  pthread_mutex_unlock(&n->lock);
  moat_error *e = NULL;
  if (script && script[0] && nft_run(n, script, &e) < 0) {
    log_warn("network slot %d: remove policy elements: %s", slot, moat_error_msg(e));
    moat_error_free(&e);
  }
  free(script);
  _cleanup_free_ char *path = xasprintf("%s/%d", n->state_dir, slot);
  unlink(path);
  pthread_mutex_unlock(&n->policy_lock);
  pthread_mutex_lock(&n->lock);
  s->state = NS_FREE;
  n->tearing--;
  pthread_mutex_unlock(&n->lock);
  return 0;
}

/* Sets the router side of every leased slot's link as its policy asks (worker; n->lock held on
 * entry and return, dropped around each netlink round trip, and no other lock taken: a bind
 * never waits for this). A bind changing link_want_down meanwhile sets link_dirty again, and so
 * does a change seen after the round trip: the worker comes back. Slots are built and torn down
 * by this same thread, so mvN is the leased slot's link throughout. */
static void sync_links(struct moat_net *n) {
  n->link_dirty = false;
  for (unsigned i = FIRST_SLOT; i < n->pool_size; i++) {
    struct net_slot *s = &n->slots[i];
    if (s->state != NS_LEASED || s->link_want_down == s->link_down)
      continue;
    bool down = s->link_want_down;
    pthread_mutex_unlock(&n->lock);
    char lb[NET_NLBUF], nm[IFNAMSIZ];
    snprintf(nm, sizeof(nm), "mv%u", i);
    struct nlmsghdr *nlh = link_msg(lb, RTM_NEWLINK, 0, 0);
    struct ifinfomsg *ifi = mnl_nlmsg_get_payload(nlh);
    ifi->ifi_change = IFF_UP;
    ifi->ifi_flags = down ? 0 : IFF_UP;
    mnl_attr_put_strz(nlh, IFLA_IFNAME, nm);
    int r = router_talk(n, nlh);
    int saved = errno;
    pthread_mutex_lock(&n->lock);
    if (r < 0) {
      log_warn("network slot %u: set %s %s: %s", i, nm, down ? "down" : "up", strerror(saved));
      continue;
    }
    s->link_down = down;
    if (s->state == NS_LEASED && s->link_want_down != down)
      n->link_dirty = true;
  }
}

static void *worker_main(void *arg) {
  struct moat_net *n = arg;
  unsigned next = FIRST_SLOT, failures = 0;
  pthread_mutex_lock(&n->lock);
  struct net_slot *deferred = NULL;
  uint64_t last_pass = 0, last_addrs = now_ns();
  while (!n->stopping) {
    if (now_ns() - last_addrs > 10ull * 1000000000ull) {
      /* The host's addresses may change (DHCP, a new interface): they stay unreachable. */
      last_addrs = now_ns();
      pthread_mutex_unlock(&n->lock);
      moat_error *e = NULL;
      if (nft_refresh_hostaddrs(n, &e) < 0) {
        log_warn("network: refresh host addresses: %s", moat_error_msg(e));
        moat_error_free(&e);
      }
      /* The host may have turned forwarding on (or off) meanwhile: the guard follows. */
      if (n->uplink_if && net_uplink_guard_changed(n) && nft_uplink_open(n, &e) < 0) {
        log_warn("network: rebuild the uplink's forward filter: %s", moat_error_msg(e));
        moat_error_free(&e);
      }
      pthread_mutex_lock(&n->lock);
      continue;
    }
    if (n->link_dirty) {
      sync_links(n);
      continue;
    }
    if (n->teardown_head) {
      struct net_slot *s = n->teardown_head;
      n->teardown_head = s->next_teardown;
      pthread_mutex_unlock(&n->lock);
      int r = teardown_one(n, s, false);
      pthread_mutex_lock(&n->lock);
      if (r == 1) {
        s->next_teardown = deferred;
        deferred = s;
      }
      continue;
    }
    if (deferred && now_ns() - last_pass > 50000000ull) {
      n->teardown_head = deferred; /* look again at veths the kernel had not removed yet */
      deferred = NULL;
      last_pass = now_ns();
      continue;
    }
    if (n->prepared < n->warm && n->prepared + n->leased + n->tearing + FIRST_SLOT < n->pool_size &&
        failures < 5) {
      int pick = -1;
      for (unsigned k = 0; k < n->pool_size && pick < 0; k++) {
        unsigned i = FIRST_SLOT + (next - FIRST_SLOT + k) % (n->pool_size - FIRST_SLOT);
        if (n->slots[i].state == NS_FREE)
          pick = (int)i;
      }
      if (pick >= 0) {
        next = (unsigned)pick + 1;
        n->slots[pick].state = NS_BUILDING;
        pthread_mutex_unlock(&n->lock);
        moat_error *e = NULL;
        int r = build_slot(n, pick, &e);
        if (r < 0) {
          log_warn("network: prepare slot %d: %s", pick, moat_error_msg(e));
          moat_error_free(&e);
        }
        pthread_mutex_lock(&n->lock);
        if (r < 0) {
          n->slots[pick].state = NS_FREE;
          failures++;
        } else {
          n->slots[pick].state = NS_PREPARED;
          n->prepared++;
          failures = 0;
        }
        continue;
      }
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (deferred) {
      ts.tv_nsec += 50000000;
      if (ts.tv_nsec >= 1000000000) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000;
      }
    } else {
      ts.tv_sec += 1;
    }
    pthread_cond_timedwait(&n->wake, &n->lock, &ts);
    if (failures >= 5)
      failures = 4; /* retry once a second */
  }
  pthread_mutex_unlock(&n->lock);
  return NULL;
}

/* ---- adopt, reconcile ---- */

int moat_net_adopt(struct moat_net *n, int slot, moat_error **err) {
  if (slot < FIRST_SLOT || (unsigned)slot >= n->pool_size)
    return moat_error_set(err, EINVAL, "network slot %d out of range", slot);
  _cleanup_free_ char *path = xasprintf("%s/%d", n->state_dir, slot);
  _cleanup_free_ char *text = NULL;
  if (read_file(path, &text, NULL, err) < 0)
    return -1;
  pthread_mutex_lock(&n->lock);
  struct net_slot *s = &n->slots[slot];
  if (s->state != NS_FREE) {
    pthread_mutex_unlock(&n->lock);
    return moat_error_set(err, EEXIST, "network slot %d is in use", slot);
  }
  s->state = NS_LEASED;
  n->leased++;
  pthread_mutex_unlock(&n->lock);
  json_t *st = json_loads(text, 0, NULL);
  const char *id = json_string_value(json_object_get(st, "id"));
  const char *org = json_string_value(json_object_get(st, "org"));
  int ret = 0;
  if (id && org && moat_net_bind(n, slot, id, org, json_object_get(st, "policy"), err) < 0)
    ret = -1;
  json_decref(st);
  return ret;
}

struct dump_ctx {
  struct moat_net *n;
  char (*names)[IFNAMSIZ];
  size_t count, cap;
};
static int dump_attr_cb(const struct nlattr *attr, void *data) {
  struct dump_ctx *c = data;
  if (mnl_attr_get_type(attr) == IFLA_IFNAME) {
    if (c->count == c->cap)
      c->names = xrealloc(c->names, (c->cap = c->cap ? c->cap * 2 : 64) * IFNAMSIZ);
    snprintf(c->names[c->count++], IFNAMSIZ, "%s", mnl_attr_get_str(attr));
  }
  return MNL_CB_OK;
}
static int dump_msg_cb(const struct nlmsghdr *nlh, void *data) {
  return mnl_attr_parse(nlh, sizeof(struct ifinfomsg), dump_attr_cb, data);
}

int moat_net_reconcile(struct moat_net *n, moat_error **err) {
  /* Every mvN / mpN in the routing ns whose slot is not leased goes. */
  char buf[NET_NLBUF];
  struct nlmsghdr *nlh = link_msg(buf, RTM_GETLINK, NLM_F_DUMP, 0);
  struct dump_ctx c = {n, NULL, 0, 0};
  pthread_mutex_lock(&n->nl_lock);
  unsigned seq = ++n->nl_seq;
  nlh->nlmsg_seq = seq;
  if (mnl_socket_sendto(n->nl, nlh, nlh->nlmsg_len) >= 0) {
    ssize_t r;
    while ((r = mnl_socket_recvfrom(n->nl, buf, sizeof(buf))) > 0)
      if (mnl_cb_run(buf, (size_t)r, seq, mnl_socket_get_portid(n->nl), dump_msg_cb, &c) <= MNL_CB_STOP)
        break;
  }
  pthread_mutex_unlock(&n->nl_lock);
  int removed = 0;
  for (size_t i = 0; i < c.count; i++) {
    const char *nm = c.names[i];
    uint64_t v;
    if ((strncmp(nm, "mv", 2) != 0 && strncmp(nm, "mp", 2) != 0) || parse_u64(nm + 2, &v) < 0 ||
        v >= n->pool_size)
      continue;
    pthread_mutex_lock(&n->lock);
    bool keep = n->slots[v].state != NS_FREE;
    pthread_mutex_unlock(&n->lock);
    if (keep)
      continue;
    if (nm[1] == 'v') {
      router_dellink(n, nm);
      removed++;
    } else {
      router_dellink(n, nm);
    }
  }
  free(c.names);
  /* State files of slots nobody adopted. */
  DIR *d = opendir(n->state_dir);
  if (d) {
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
      uint64_t v;
      if (parse_u64(de->d_name, &v) < 0)
        continue;
      pthread_mutex_lock(&n->lock);
      bool keep = v < n->pool_size && n->slots[v].state == NS_LEASED;
      pthread_mutex_unlock(&n->lock);
      if (!keep)
        unlinkat(dirfd(d), de->d_name, 0);
    }
    closedir(d);
  }
  /* nft: rebuild every set from the leased slots' policies (elements of dead slots go). */
  char *script = NULL;
  size_t len = 0;
  net_sappend(&script, &len,
              "flush set inet moat offline\nflush set inet moat egress_deny\nflush set inet moat allow_net\n"
              "flush set inet moat deny_net\nflush set inet moat allow_dns\nflush set inet moat deny_dns\n"
              "flush set inet moat policied\n");
  pthread_mutex_lock(&n->policy_lock); /* no bind changes a slot's elements meanwhile */
  pthread_mutex_lock(&n->lock);
  for (unsigned i = FIRST_SLOT; i < n->pool_size; i++)
    if (n->slots[i].state == NS_LEASED && n->slots[i].bound)
      nft_policy_elements(n, (int)i, &n->slots[i].pol, "add", &script, &len);
  pthread_mutex_unlock(&n->lock);
  int r = nft_run(n, script, err);
  pthread_mutex_unlock(&n->policy_lock);
  free(script);
  if (r < 0)
    moat_error_wrap(err, "reconcile nft sets");
  /* The worker starts whatever the sets' fate: without it no slot is prepared or torn down. */
  if (!n->worker_started) {
    int e = pthread_create(&n->worker, NULL, worker_main, n);
    if (e != 0) {
      errno = e;
      r = moat_error_errno(err, "start the network worker");
    } else {
      n->worker_started = true;
    }
  }
  if (removed)
    log_info("network reconcile: removed %d veth(s) of no live sandbox", removed);
  return r < 0 ? -1 : removed;
}

/* ---- open / close ---- */

bool moat_net_config_enabled(const struct moat_net_config *cfg) {
  return cfg && cfg->uplink && cfg->uplink[0] && strcmp(cfg->uplink, "none") != 0;
}

json_t *moat_net_status(struct moat_net *n) {
  if (!n)
    return json_pack("{s:b, s:s}", "internet", false, "uplink", "none");
  return json_pack("{s:b, s:s}", "internet", true, "uplink",
                   n->uplink_is_netns ? "netns"
                   : n->uplink_auto   ? "auto"
                                      : "interface");
}

static int parse_cidr(const char *s, uint32_t *addr, unsigned *plen) {
  char tmp[64];
  snprintf(tmp, sizeof(tmp), "%s", s);
  char *slash = strchr(tmp, '/');
  if (!slash)
    return -1;
  *slash = '\0';
  struct in_addr a;
  uint64_t p;
  if (inet_pton(AF_INET, tmp, &a) != 1 || parse_u64(slash + 1, &p) < 0 || p > 30 || p < 8)
    return -1;
  *plen = (unsigned)p;
  *addr = ntohl(a.s_addr) & (p ? ~0u << (32 - p) : 0);
  return 0;
}

static int write_sysctl(void *arg) {
  const char **kv = arg;
  for (; kv[0]; kv += 2) {
    int fd = open(kv[0], O_WRONLY | O_CLOEXEC);
    if (fd < 0)
      continue; /* ipv6 may be off in this kernel */
    if (write(fd, kv[1], strlen(kv[1])) < 0) {
      close(fd);
      return -1;
    }
    close(fd);
  }
  return 0;
}

static int unshare_fn(void *arg) {
  const char *path = arg;
  if (unshare(CLONE_NEWNET) < 0)
    return -1;
  return mount("/proc/thread-self/ns/net", path, NULL, MS_BIND, NULL);
}

/* Routing namespaces whose moatd's state dir is gone (a data dir removed after a crash) can never
 * be adopted: they go, with every veth and nft element in them. */
static void remove_orphan_routers(void) {
  DIR *d = opendir(NET_RUN_DIR);
  if (!d)
    return;
  struct dirent *de;
  while ((de = readdir(d)) != NULL) {
    size_t l = strlen(de->d_name);
    if (l < 7 || strcmp(de->d_name + l - 6, ".owner") != 0)
      continue;
    _cleanup_free_ char *owner_path = xasprintf(NET_RUN_DIR "/%s", de->d_name);
    _cleanup_free_ char *owner = NULL;
    if (read_file(owner_path, &owner, NULL, NULL) < 0 || owner[0] != '/' || access(owner, F_OK) == 0 ||
        errno != ENOENT)
      continue;
    _cleanup_free_ char *ns = xasprintf(NET_RUN_DIR "/%.*s", (int)(l - 6), de->d_name);
    umount2(ns, MNT_DETACH);
    unlink(ns);
    unlink(owner_path);
    log_info("network: removed the routing namespace %s of a moatd whose state %s is gone", ns, owner);
  }
  closedir(d);
}

/* Opens the routing ns of this instance, making it on first use. */
static int router_open(struct moat_net *n, moat_error **err) {
  if (mkdir_p(NET_RUN_DIR, 0755, err) < 0)
    return -1;
  remove_orphan_routers();
  {
    _cleanup_free_ char *owner = xasprintf("%s.owner", n->ns_path);
    if (moat_net_put_file(owner, n->state_dir, err) < 0)
      return -1;
  }
  int fd = open(n->ns_path, O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    if (ioctl(fd, NS_GET_NSTYPE) == CLONE_NEWNET)
      return fd; /* kept from an earlier moatd: its leased slots are adopted */
    close(fd);
    umount2(n->ns_path, MNT_DETACH);
  }
  _cleanup_close_ int f = open(n->ns_path, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
  if (f < 0)
    return moat_error_errno(err, "create %s", n->ns_path);
  if (net_in_ns(n->self_fd, unshare_fn, (void *)n->ns_path, err) < 0) {
    if (err && !*err)
      moat_error_errno(err, "make the routing namespace");
    return -1;
  }
  fd = open(n->ns_path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return moat_error_errno(err, "open %s", n->ns_path);
  return fd;
}

/* The uplink link: mup0 in the routing ns <-> outside_link in the uplink ns, /30 number 1. */
static int uplink_open(struct moat_net *n, moat_error **err) {
  char buf[NET_NLBUF];
  int idx = router_ifindex(n, "mup0");
  if (idx < 0) {
    if (router_talk(n, veth_msg(buf, "mup0", n->outside_link, n->outside_fd)) < 0)
      return moat_error_errno(err, "create uplink veth mup0/%s", n->outside_link);
    idx = router_ifindex(n, "mup0");
  }
  uint32_t outside = htonl(n->pool + 5), router = htonl(n->pool + 6);
  if (idx < 0 || router_talk(n, addr_msg(buf, idx, router, 30)) < 0 || router_talk(n, up_msg(buf, idx)) < 0 ||
      router_talk(n, default_route_msg(buf, outside, idx)) < 0)
    return moat_error_errno(err, "configure mup0");
  /* The outside end. */
  struct mnl_socket *nl = mnl_in(n->outside_fd, NETLINK_ROUTE, err);
  if (!nl)
    return -1;
  _cleanup_close_ int fd = net_socket_in(n->outside_fd, AF_INET, SOCK_DGRAM, 0, err);
  int oidx = fd >= 0 ? ifindex_of(fd, n->outside_link) : -1;
  int r = oidx < 0 || nl_talk(nl, addr_msg(buf, oidx, outside, 30), 1) < 0 ||
          nl_talk(nl, up_msg(buf, oidx), 2) < 0;
  mnl_socket_close(nl);
  if (r)
    return moat_error_errno(err, "configure %s in the uplink namespace", n->outside_link);
  return 0;
}

static int router_setup(struct moat_net *n, moat_error **err) {
  static const char *kv[] = {"/proc/sys/net/ipv4/ip_forward",
                             "1",
                             "/proc/sys/net/ipv6/conf/all/disable_ipv6",
                             "1",
                             "/proc/sys/net/ipv6/conf/default/disable_ipv6",
                             "1",
                             NULL};
  if (net_in_ns(n->router_fd, write_sysctl, (void *)kv, err) < 0)
    return err && *err ? -1 : moat_error_errno(err, "sysctls of the routing namespace");
  char buf[NET_NLBUF];
  int lo = router_ifindex(n, "lo");
  if (lo < 0 || router_talk(n, up_msg(buf, lo)) < 0 ||
      router_talk(n, addr_msg(buf, lo, net_dns_ip(n), 32)) < 0)
    return moat_error_errno(err, "routing namespace: lo");
  return 0;
}

int moat_net_open(struct moat_net **out, const struct moat_net_config *cfg, const char *instance,
                  const char *state_dir, moat_error **err) {
  *out = NULL;
  if (!moat_net_config_enabled(cfg))
    return 0;
  struct moat_net *n = xcalloc(1, sizeof(*n));
  pthread_mutex_init(&n->lock, NULL);
  pthread_mutex_init(&n->nl_lock, NULL);
  pthread_mutex_init(&n->nft_lock, NULL);
  pthread_mutex_init(&n->policy_lock, NULL);
  pthread_cond_init(&n->wake, NULL);
  n->router_fd = n->outside_fd = n->self_fd = n->dns_fd = n->dns_tcp_fd = n->up_fd = n->router_ioctl = -1;
  n->stop_pipe[0] = n->stop_pipe[1] = -1;
  n->instance = xstrdup(instance);
  n->state_dir = xstrdup(state_dir);
  n->ns_path = xasprintf(NET_RUN_DIR "/%s", instance);
  n->warm = cfg->warm ? cfg->warm : 8;
  n->api_port = cfg->api_port;
  n->block_ports = xstrdup(cfg->block_ports ? cfg->block_ports : DEFAULT_BLOCK_PORTS);
  snprintf(n->outside_link, sizeof(n->outside_link), "mu%.12s", instance);
  unsigned plen;
  if (parse_cidr(cfg->pool ? cfg->pool : DEFAULT_POOL, &n->pool, &plen) < 0) {
    moat_error_set(err, EINVAL, "network pool %s: expected an IPv4 CIDR from /8 to /28",
                   cfg->pool ? cfg->pool : DEFAULT_POOL);
    goto fail;
  }
  n->pool_size = 1u << (30 - plen);
  if (n->pool_size < 4) {
    moat_error_set(err, EINVAL, "network pool too small");
    goto fail;
  }
  for (const char *p = n->block_ports; *p; p++)
    if (!(*p >= '0' && *p <= '9') && *p != ',') {
      moat_error_set(err, EINVAL, "blocked ports: expected a comma-separated list of numbers");
      goto fail;
    }
  if (cfg->dns_upstream) {
    if (dns_check_fixed(cfg->dns_upstream, err) < 0)
      goto fail;
    n->dns_fixed = xstrdup(cfg->dns_upstream);
  } else {
    n->resolv_path = xstrdup(cfg->resolv_conf ? cfg->resolv_conf : "/etc/resolv.conf");
  }
  n->slots = xcalloc(n->pool_size, sizeof(struct net_slot));
  n->self_fd = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
  if (n->self_fd < 0) {
    moat_error_errno(err, "open own netns");
    goto fail;
  }
  {
    moat_error *e = NULL;
    if (net_uplink_resolve(n, cfg->uplink, &e) < 0) {
      if (strcmp(cfg->uplink, "auto") == 0 && e->status == ENETUNREACH) {
        /* A host without a default route (an offline box, a netns of its own): moatd serves
         * sandboxes with loopback only rather than not at all, and says so. */
        log_warn("network: %s: sandboxes have loopback only (as with --net-uplink none) until moatd is "
                 "restarted on a host with an IPv4 default route, or with --net-uplink IFNAME",
                 moat_error_msg(e));
        moat_error_free(&e);
        moat_net_close(n);
        return 0;
      }
      if (err && !*err)
        *err = e;
      else
        moat_error_free(&e);
      goto fail;
    }
  }
  {
    _cleanup_free_ char *by_id = xasprintf("%s/by-id", n->state_dir);
    if (mkdir_p(by_id, 0700, err) < 0)
      goto fail;
  }
  n->router_fd = router_open(n, err);
  if (n->router_fd < 0)
    goto fail;
  n->nl = mnl_in(n->router_fd, NETLINK_ROUTE, err);
  if (!n->nl)
    goto fail;
  n->router_ioctl = net_socket_in(n->router_fd, AF_INET, SOCK_DGRAM, 0, err);
  if (n->router_ioctl < 0)
    goto fail;
  if (router_setup(n, err) < 0 || uplink_open(n, err) < 0 || nft_open(n, err) < 0)
    goto fail;
  if (n->uplink_if && (net_uplink_forwarding_on(n, err) < 0 || nft_uplink_open(n, err) < 0))
    goto fail;
  if (dns_start(n, err) < 0 || netlog_start(n, err) < 0)
    goto fail;
  for (unsigned i = 0; i < n->pool_size; i++) {
    n->slots[i].learned = NULL;
    n->slots[i].log = NULL;
  }
  char pool[INET_ADDRSTRLEN];
  uint32_t pb = htonl(n->pool);
  inet_ntop(AF_INET, &pb, pool, sizeof(pool));
  json_t *ups = dns_upstreams_json(n);
  char *up_text = json_dumps(ups, JSON_COMPACT); /* no _cleanup_: the gotos above jump past it */
  json_decref(ups);
  log_info("network: uplink %s%s%s, pool %s/%u (%u slots), DNS upstreams %s (%s), routing namespace %s",
           cfg->uplink, n->uplink_auto ? " = " : "", n->uplink_auto ? n->uplink_if : "", pool, plen,
           n->pool_size - FIRST_SLOT, up_text, n->dns_fixed ? "--net-dns-upstream" : n->resolv_path,
           n->ns_path);
  free(up_text);
  *out = n;
  return 0;
fail:
  moat_error_wrap(err, "network");
  moat_net_close(n);
  return -1;
}

void moat_net_close(struct moat_net *n) {
  if (!n)
    return;
  pthread_mutex_lock(&n->lock);
  n->stopping = true;
  pthread_cond_broadcast(&n->wake);
  pthread_mutex_unlock(&n->lock);
  if (n->worker_started)
    pthread_join(n->worker, NULL);
  dns_stop(n);
  netlog_stop(n);
  /* Prepared (never leased) slots go now; leased ones stay for the next moatd to adopt. */
  for (unsigned i = 0; n->slots && i < n->pool_size; i++) {
    if (n->slots[i].state == NS_PREPARED || n->slots[i].state == NS_TEARDOWN) {
      char name[IFNAMSIZ];
      snprintf(name, sizeof(name), "mv%u", i);
      router_dellink(n, name);
      if (n->slots[i].state == NS_TEARDOWN) {
        _cleanup_free_ char *path = xasprintf("%s/%u", n->state_dir, i);
        unlink(path);
      }
    }
    slot_reset(&n->slots[i]);
    free(n->slots[i].learned);
    free(n->slots[i].log);
  }
  /* With no sandbox left on it, the routing namespace (and with it every veth, the uplink link
   * and the nft table) goes; otherwise it stays for the next moatd to adopt. */
  bool empty = n->leased == 0;
  if (n->uplink_if && empty) {
    nft_uplink_close(n);
    net_uplink_forwarding_off(n);
  }
  nft_close(n);
  if (empty && n->ns_path && n->router_fd >= 0) {
    char buf[NET_NLBUF];
    struct nlmsghdr *nlh = link_msg(buf, RTM_DELLINK, 0, 0);
    mnl_attr_put_strz(nlh, IFLA_IFNAME, "mup0");
    if (n->nl)
      router_talk(n, nlh);
    if (umount2(n->ns_path, MNT_DETACH) == 0) {
      unlink(n->ns_path);
      _cleanup_free_ char *owner = xasprintf("%s.owner", n->ns_path);
      unlink(owner);
    }
  }
  if (n->nl)
    mnl_socket_close(n->nl);
  int fds[] = {n->router_fd, n->outside_fd, n->self_fd, n->stop_pipe[0], n->stop_pipe[1], n->router_ioctl};
  for (size_t i = 0; i < ARRAY_SIZE(fds); i++)
    if (fds[i] >= 0)
      close(fds[i]);
  free(n->slots);
  free(n->instance);
  free(n->state_dir);
  free(n->ns_path);
  free(n->block_ports);
  free(n->uplink_if);
  free(n->dns_fixed);
  free(n->resolv_path);
  pthread_mutex_destroy(&n->lock);
  pthread_mutex_destroy(&n->nl_lock);
  pthread_mutex_destroy(&n->nft_lock);
  pthread_mutex_destroy(&n->policy_lock);
  pthread_cond_destroy(&n->wake);
  free(n);
}

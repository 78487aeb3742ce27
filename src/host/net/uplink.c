/* uplink.c -- which way sandboxes reach the outside world: "auto" (the interface of moatd's IPv4
 * default route), a named interface or a network namespace; and, for an interface, the IPv4
 * forwarding it needs, turned on for moat's veth and the uplink only (never host-wide)
 *
 * Forwarding. Linux forwards a packet only when the interface it came in on has forwarding on
 * (conf/IF/forwarding). moatd turns it on for its own veth end (outside_link: sandbox traffic
 * out) and the uplink (the replies in), and leaves conf/all and every other interface alone. When
 * the uplink forwarded nothing before (its flag was 0), moatd owns the flag: nft.c then drops
 * every new flow coming in through the uplink (the host was no router there and does not become
 * one), as long as the host forwards nothing else (conf/all/forwarding stays 0: when someone
 * turns that on, the guard steps aside within the worker's refresh), and the flag goes back to 0
 * when the last sandbox is gone. Ownership is recorded in state_dir/uplink-forwarding, so that a
 * restarted moatd, finding the flag on, knows it was its own.
 */
#include "net_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <libmnl/libmnl.h>
#include <linux/if.h>
#include <linux/rtnetlink.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../../common/log.h"
#include "../../common/util.h"

#define FWD_STATE "uplink-forwarding"

/* ---- the default route ---- */

struct route_pick {
  int oif;
  uint32_t prio, gw;
  bool usable; /* not linkdown / dead */
  bool found;
};

static int route_attr_cb(const struct nlattr *attr, void *data) {
  const struct nlattr **tb = data;
  int type = mnl_attr_get_type(attr);
  if (type >= 0 && type <= RTA_MAX)
    tb[type] = attr;
  return MNL_CB_OK;
}

static int route_cb(const struct nlmsghdr *nlh, void *data) {
  struct route_pick *best = data;
  const struct rtmsg *rtm = mnl_nlmsg_get_payload(nlh);
  if (nlh->nlmsg_type != RTM_NEWROUTE || rtm->rtm_family != AF_INET || rtm->rtm_dst_len != 0 ||
      rtm->rtm_type != RTN_UNICAST)
    return MNL_CB_OK;
  const struct nlattr *tb[RTA_MAX + 1] = {0};
  mnl_attr_parse(nlh, sizeof(*rtm), route_attr_cb, tb);
  uint32_t table = tb[RTA_TABLE] ? mnl_attr_get_u32(tb[RTA_TABLE]) : rtm->rtm_table;
  if (table != RT_TABLE_MAIN)
    return MNL_CB_OK;
  int oif = tb[RTA_OIF] ? (int)mnl_attr_get_u32(tb[RTA_OIF]) : 0;
  uint32_t gw = tb[RTA_GATEWAY] ? mnl_attr_get_u32(tb[RTA_GATEWAY]) : 0;
  unsigned flags = rtm->rtm_flags;
  if (!oif && tb[RTA_MULTIPATH] && mnl_attr_get_payload_len(tb[RTA_MULTIPATH]) >= sizeof(struct rtnexthop)) {
    const struct rtnexthop *nh = mnl_attr_get_payload(tb[RTA_MULTIPATH]); /* the first hop */
    oif = nh->rtnh_ifindex;
    flags |= nh->rtnh_flags;
  }
  if (!oif)
    return MNL_CB_OK;
  uint32_t prio = tb[RTA_PRIORITY] ? mnl_attr_get_u32(tb[RTA_PRIORITY]) : 0;
  bool usable = !(flags & (RTNH_F_LINKDOWN | RTNH_F_DEAD));
  /* A usable route beats one whose link is down; then the lowest metric wins. */
  if (!best->found || (usable && !best->usable) || (usable == best->usable && prio < best->prio))
    *best = (struct route_pick){.oif = oif, .prio = prio, .gw = gw, .usable = usable, .found = true};
  return MNL_CB_OK;
}

/* The interface of the main table's IPv4 default route in this thread's netns (the lowest
 * metric; of a multipath route, its first hop). 0, or -1 (ENETUNREACH when there is none). */
static int default_route_if(char out[IFNAMSIZ], uint32_t *gw_be, moat_error **err) {
  struct mnl_socket *nl = mnl_socket_open2(NETLINK_ROUTE, SOCK_CLOEXEC);
  if (!nl || mnl_socket_bind(nl, 0, MNL_SOCKET_AUTOPID) < 0) {
    if (nl)
      mnl_socket_close(nl);
    return moat_error_errno(err, "netlink socket");
  }
  char buf[NET_NLBUF];
  struct nlmsghdr *nlh = mnl_nlmsg_put_header(buf);
  nlh->nlmsg_type = RTM_GETROUTE;
  nlh->nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
  nlh->nlmsg_seq = 1;
  struct rtmsg *rtm = mnl_nlmsg_put_extra_header(nlh, sizeof(*rtm));
  rtm->rtm_family = AF_INET;
  struct route_pick best = {0};
  int rc = -1;
  if (mnl_socket_sendto(nl, nlh, nlh->nlmsg_len) >= 0) {
    unsigned portid = mnl_socket_get_portid(nl);
    ssize_t r;
    while ((r = mnl_socket_recvfrom(nl, buf, sizeof(buf))) > 0) {
      rc = mnl_cb_run(buf, (size_t)r, 1, portid, route_cb, &best);
      if (rc <= MNL_CB_STOP)
        break;
    }
  }
  int saved = errno;
  mnl_socket_close(nl);
  if (rc < 0) {
    errno = saved;
    return moat_error_errno(err, "read the routing table");
  }
  if (!best.found)
    return moat_error_set(err, ENETUNREACH, "uplink auto: this host has no IPv4 default route");
  struct ifreq ifr;
  memset(&ifr, 0, sizeof(ifr));
  ifr.ifr_ifindex = best.oif;
  _cleanup_close_ int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || ioctl(fd, SIOCGIFNAME, &ifr) < 0)
    return moat_error_errno(err, "uplink auto: interface %d of the default route", best.oif);
  snprintf(out, IFNAMSIZ, "%s", ifr.ifr_name);
  *gw_be = best.gw;
  if (!best.usable)
    log_warn("network: the default route's interface %s has no carrier", out);
  return 0;
}

static bool if_exists(const char *name) {
  _cleanup_close_ int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  struct ifreq ifr;
  memset(&ifr, 0, sizeof(ifr));
  if (fd < 0 || strlen(name) >= IFNAMSIZ)
    return false;
  snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "%s", name);
  return ioctl(fd, SIOCGIFINDEX, &ifr) == 0;
}

int net_uplink_resolve(struct moat_net *n, const char *spec, moat_error **err) {
  if (strncmp(spec, "netns:", 6) == 0) {
    n->uplink_is_netns = true;
    n->outside_fd = open(spec + 6, O_RDONLY | O_CLOEXEC);
    if (n->outside_fd < 0)
      return moat_error_errno(err, "uplink netns %s", spec + 6);
    return 0;
  }
  char ifname[IFNAMSIZ];
  if (strcmp(spec, "auto") == 0) {
    uint32_t gw = 0;
    if (default_route_if(ifname, &gw, err) < 0)
      return -1;
    char g[INET_ADDRSTRLEN] = "-";
    if (gw)
      inet_ntop(AF_INET, &gw, g, sizeof(g));
    log_info("network: uplink auto: %s (the IPv4 default route, via %s)", ifname, g);
    n->uplink_auto = true;
  } else {
    if (strlen(spec) >= IFNAMSIZ || !spec[0] || strchr(spec, '/') || !if_exists(spec))
      return moat_error_set(err, EINVAL, "uplink interface %s does not exist", spec);
    snprintf(ifname, sizeof(ifname), "%s", spec);
  }
  n->uplink_if = xstrdup(ifname);
  n->outside_fd = fcntl(n->self_fd, F_DUPFD_CLOEXEC, 3);
  if (n->outside_fd < 0)
    return moat_error_errno(err, "dup own netns");
  return 0;
}

/* ---- forwarding ---- */

/* The value of an IPv4 sysctl of this netns (0 or 1), or -1. */
static int sysctl_get(const char *path) {
  char buf[8] = {0};
  _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0 || read(fd, buf, sizeof(buf) - 1) <= 0)
    return -1;
  return buf[0] == '1' ? 1 : buf[0] == '0' ? 0 : -1;
}

static char *conf_path(const char *ifname) {
  return xasprintf("/proc/sys/net/ipv4/conf/%s/forwarding", ifname);
}

static bool host_forwards(void) { return sysctl_get("/proc/sys/net/ipv4/conf/all/forwarding") == 1; }

int net_uplink_forwarding_on(struct moat_net *n, moat_error **err) {
  _cleanup_free_ char *out = conf_path(n->outside_link);
  if (write_file(out, "1", err) < 0)
    return moat_error_wrap(err, "forwarding on %s", n->outside_link);
  _cleanup_free_ char *up = conf_path(n->uplink_if);
  _cleanup_free_ char *state = xasprintf("%s/" FWD_STATE, n->state_dir);
  _cleanup_free_ char *recorded = NULL;
  bool ours = read_file(state, &recorded, NULL, NULL) == 0 && strcmp(recorded, n->uplink_if) == 0;
  int v = sysctl_get(up);
  if (v < 0)
    return moat_error_errno(err, "read %s", up);
  if (v == 0) {
    /* Recorded before it is turned on: a crash in between leaves a record of a flag that is off
     * (harmless), never a flag on that nobody knows to turn off. */
    if (moat_net_put_file(state, n->uplink_if, err) < 0 || write_file(up, "1", err) < 0)
      return moat_error_wrap(err, "forwarding on %s", n->uplink_if);
    ours = true;
  } else if (recorded && !ours) {
    unlink(state); /* a record of another interface's flag, from a run with another uplink */
  }
  n->fwd_owned = ours;
  n->fwd_guard = ours && !host_forwards();
  log_info("network: IPv4 forwarding on %s and %s only%s", n->outside_link, n->uplink_if,
           n->fwd_guard   ? "; new flows in through the uplink are dropped (the host forwards nothing else)"
           : n->fwd_owned ? ""
                          : " (the uplink forwarded already)");
  return 0;
}

bool net_uplink_guard_changed(struct moat_net *n) {
  bool g = n->fwd_owned && !host_forwards();
  if (g == n->fwd_guard)
    return false;
  n->fwd_guard = g;
  log_info("network: the host %s IPv4 forwarding: new flows in through %s are %s", g ? "stopped" : "started",
           n->uplink_if, g ? "dropped again" : "left to the host's own rules");
  return true;
}

void net_uplink_forwarding_off(struct moat_net *n) {
  if (!n->uplink_if || !n->fwd_owned)
    return;
  _cleanup_free_ char *state = xasprintf("%s/" FWD_STATE, n->state_dir);
  if (!host_forwards()) {
    _cleanup_free_ char *up = conf_path(n->uplink_if);
    moat_error *e = NULL;
    if (write_file(up, "0", &e) < 0) {
      log_warn("network: turn forwarding off on %s: %s", n->uplink_if, moat_error_msg(e));
      moat_error_free(&e);
      return;
    }
  }
  unlink(state);
  n->fwd_owned = n->fwd_guard = false;
}

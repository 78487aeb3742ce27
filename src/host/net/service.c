/* service.c -- moatd's own TCP services for sandboxes on the service address of the routing
 * namespace (the DNS address), and which sandbox holds a source address there */
#include "net_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../../common/log.h"
#include "../../common/util.h"

void moat_net_service_address(const struct moat_net *n, char out[MOAT_NET_ADDR_LEN]) {
  uint32_t a = net_dns_ip(n);
  inet_ntop(AF_INET, &a, out, MOAT_NET_ADDR_LEN);
}

int moat_net_listen_tcp(struct moat_net *n, unsigned port, int backlog, moat_error **err) {
  if (port == 0 || port > 65535 || port == NET_DNS_PORT)
    return moat_error_set(err, EINVAL, "service port %u: must be 1 to 65535 and not DNS's", port);
  _cleanup_close_ int fd = net_socket_in(n->router_fd, AF_INET, SOCK_STREAM, 0, err);
  if (fd < 0)
    return -1;
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  struct sockaddr_in a = {
      .sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = net_dns_ip(n)};
  char addr[MOAT_NET_ADDR_LEN];
  moat_net_service_address(n, addr);
  if (bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(fd, backlog > 0 ? backlog : SOMAXCONN) < 0)
    return moat_error_errno(err, "listen on %s:%u in the routing namespace", addr, port);
  /* the input chain accepts new TCP flows from sandboxes to the service address's ports in the set */
  _cleanup_free_ char *s = xasprintf("add element inet moat services { %u }\n", port);
  if (nft_run(n, s, err) < 0)
    return moat_error_wrap(err, "open port %u to sandboxes", port);
  log_info("network: sandboxes reach %s:%u (tcp)", addr, port);
  return steal_fd(&fd);
}

int moat_net_sandbox_at(struct moat_net *n, uint32_t addr_be, char *id, size_t id_len) {
  int slot = net_slot_of_ip(n, addr_be);
  if (slot < 0 || (unsigned)slot >= n->pool_size)
    return -1;
  pthread_mutex_lock(&n->lock);
  const struct net_slot *s = &n->slots[slot];
  bool held = s->state == NS_LEASED && s->bound && s->id[0];
  if (held)
    snprintf(id, id_len, "%s", s->id);
  pthread_mutex_unlock(&n->lock);
  return held ? slot : -1;
}

/* net.h -- sandbox networking: slots (veth + /30 in a moat-owned routing namespace), egress
 * firewall (nft.c), per-sandbox policy (netpolicy.c), moatd's DNS (dns.c), connection log and
 * byte counts
 *
 * Topology. moatd makes one routing namespace of its own (bind-mounted at /run/moat/net/INSTANCE,
 * kept across restarts). Every sandbox's netns gets eth0, the peer of a veth "mvN" in the routing
 * namespace, with the /30 number N of the pool (sandbox .2, router .1, default route via .1). The
 * routing namespace reaches the outside world through a veth "mup0" whose other end lives in the
 * uplink namespace: a netns given by path (tests build a fake internet there), or, for an uplink
 * interface, moatd's own netns, where that end is masqueraded out of the interface. Sandboxes'
 * resolver is moatd's DNS at the pool's first address, answered in the routing namespace.
 *
 * Pool layout: /30 number 0 holds the DNS address (.1), number 1 the uplink link (outside .1,
 * router .2); sandboxes use 2 .. pool_size-1.
 *
 * Slots are prepared ahead (veth pair made, router side addressed and up) by a worker thread,
 * attached on demand (peer moved into the sandbox's netns, addressed, routed) and torn down by the
 * same worker off the request path (the index returns to the pool).
 *
 * Thread safety: every function may be called from any thread, except open and close.
 */
#ifndef MOAT_NET_H
#define MOAT_NET_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "../../common/error.h"

struct moat_net_config {
  /* "auto": the interface of moatd's IPv4 default route (resolved once, at open); "IFNAME": that
   * interface (masqueraded); "netns:PATH": the network namespace at PATH stands for the outside
   * world. NULL, "" or "none" = no networking (loopback only). */
  const char *uplink;
  const char *dns_upstream; /* "IP" or "IP:PORT"; NULL = the nameservers of resolv_conf */
  const char *resolv_conf;  /* where the upstreams come from without dns_upstream (re-read when it
                               changes); NULL = /etc/resolv.conf */
  const char *pool;         /* IPv4 CIDR of the /30 pool; NULL = 10.200.0.0/16 (16,384 /30s) */
  const char *block_ports;  /* comma-separated TCP/UDP ports always dropped (mining pools); NULL = default */
  unsigned warm;            /* prepared slots kept ready; 0 = 8 */
  uint16_t api_port;        /* moatd's API port (dropped towards every host address) */
};

/* Whether cfg asks for networking at all (an uplink other than none). */
bool moat_net_config_enabled(const struct moat_net_config *cfg);

struct moat_net;

/* Opens (or, after a restart, reopens) the routing namespace of instance, builds the nft table,
 * the uplink link and the DNS server, and starts the worker. state_dir keeps one file per leased
 * slot (its sandbox, org and policy) for adoption. *out is NULL (and 0 returned) when cfg has no
 * uplink. Returns 0 or -1: EINVAL naming the uplink when it does not exist, ENETUNREACH for
 * "auto" on a host without an IPv4 default route. */
int moat_net_open(struct moat_net **out, const struct moat_net_config *cfg, const char *instance,
                  const char *state_dir, moat_error **err);
/* Stops the worker and DNS. Leased slots stay (their sandboxes outlive moatd). */
void moat_net_close(struct moat_net *n);

/* What the network is, for the unauthenticated /healthz (no address, no interface name):
 * {internet: true, uplink: "auto"|"interface"|"netns"}, or with n NULL {internet: false, uplink:
 * "none"}. New reference. */
json_t *moat_net_status(struct moat_net *n);

/* Gives the network namespace of pid a slot: eth0 with its /30, default route, and, with
 * write_resolv, /etc/resolv.conf (inside the sandbox's root, as the range's root uid_base) naming
 * moatd's DNS. The slot starts unbound: default policy until moat_net_bind. Returns the slot index
 * (>= 0) or -1 (nothing left behind). */
int moat_net_attach(struct moat_net *n, pid_t pid, bool write_resolv, uid_t uid_base, moat_error **err);
/* Same, for a namespace given as an fd (e.g. a restore's). */
int moat_net_attach_fd(struct moat_net *n, int netns_fd, moat_error **err);

/* Queues slot for teardown off the request path: its nft elements are removed, its veth deleted,
 * its index returned to the pool. */
void moat_net_release(struct moat_net *n, int slot);

/* After a restart: takes back slot of an adopted sandbox (its veth and state file). 0 or -1. */
int moat_net_adopt(struct moat_net *n, int slot, moat_error **err);
/* After every adopt, once: removes veths, state files and nft elements of slots nobody took back,
 * re-applies adopted slots' policies and starts the worker (warm slots, teardown). Returns the
 * number of slots removed, or -1 when the sets could not be rebuilt or the worker did not start
 * (it is started in either case when it can be). */
int moat_net_reconcile(struct moat_net *n, moat_error **err);

/* A TCP connection to port on the loopback of the network namespace netns_fd (127.0.0.1, else
 * ::1), made inside it: this thread enters the namespace for the socket call only, the socket
 * keeps the namespace, and nothing outside it is reached. timeout_ms (> 0) bounds the connect.
 * Needs no struct moat_net (a sandbox without an uplink still has its loopback). Returns the
 * connected fd (blocking, close-on-exec, no send timeout left; the caller owns it), or -1:
 * ECONNREFUSED when nothing listens there, ETIMEDOUT, EINVAL for a port out of 1..65535. */
int moat_net_connect_port(int netns_fd, unsigned port, int timeout_ms, moat_error **err);

/* ---- moatd's own services for sandboxes ---- */

/* The service address (dotted IPv4, at most 15 characters): where sandboxes reach moatd's DNS
 * (port 53) and the services of moat_net_listen_tcp, the same for every slot. */
#define MOAT_NET_ADDR_LEN 16
void moat_net_service_address(const struct moat_net *n, char out[MOAT_NET_ADDR_LEN]);

/* A TCP socket listening on the service address's port (1..65535, not 53) in the routing
 * namespace, backlog <= 0: SOMAXCONN. From then on the firewall admits new connections to it from
 * every sandbox whose network is on (internet not false), whatever its egress policy: it is
 * moatd's own service, as DNS is; a sandbox with internet: false (its link down) reaches nothing.
 * The sandbox's address is its own (the firewall drops a spoofed source), so moat_net_sandbox_at
 * names who connected. Returns the fd (close-on-exec, blocking; the caller owns it), or -1:
 * EINVAL for the port, EADDRINUSE, EIO when the firewall could not be opened. */
int moat_net_listen_tcp(struct moat_net *n, unsigned port, int backlog, moat_error **err);

/* The sandbox whose slot has the address addr_be (network order) and is bound to it now: its slot
 * (>= 0) and its id copied into id[0..id_len), or -1 when the address is no slot's, or the slot is
 * free, prepared, being torn down or not yet bound. Memory only (no syscall). */
int moat_net_sandbox_at(struct moat_net *n, uint32_t addr_be, char *id, size_t id_len);

/* ---- policy ---- */

#define MOAT_NET_MAX_RULES 1024 /* entries in allow + deny */
#define MOAT_NET_MAX_NAME 253

/* Validates a policy object {internet, egress, allow, deny}: 0, or -1 with EINVAL and a message
 * naming the field and entry. */
int moat_net_policy_check(json_t *policy, moat_error **err);
/* The policy a sandbox gets without one. New reference. */
json_t *moat_net_policy_default(void);

/* Binds slot to a sandbox (id, org) with policy (NULL = default; checked first): nft elements
 * replaced atomically, DNS answers from now on by it, log and counters restarted. Used on create
 * and on PUT .../network (run-time change: new connections follow it). 0 or -1. */
int moat_net_bind(struct moat_net *n, int slot, const char *id, const char *org, json_t *policy,
                  moat_error **err);

/* The policy last bound for sandbox id (kept after its slot is released, for a wake, a rollback
 * or a fork's children), or NULL. New reference. */
json_t *moat_net_saved_policy(struct moat_net *n, const char *id);
/* Forgets id's saved policy (the sandbox is killed). */
void moat_net_forget(struct moat_net *n, const char *id);

/* The slot's state: {address, policy, bytes_in, bytes_out, connections}. New reference or NULL
 * (ENOENT). */
json_t *moat_net_describe(struct moat_net *n, int slot, moat_error **err);
/* The slot's connection log, oldest first, at most limit entries after seq since: array of
 * {seq, time_ms, sandbox_id, org, protocol, destination, port, name, verdict, reason}. */
json_t *moat_net_log(struct moat_net *n, int slot, uint64_t since, unsigned limit, moat_error **err);

/* Called on the log thread, outside the net lock, for every new entry of a sandbox's log, with
 * the sandbox's id, the entry as moat_net_log writes it (borrowed) and the hook's arg. It must not
 * block. */
typedef void (*moat_net_log_hook)(const char *sandbox_id, json_t *entry, void *arg);
/* Sets the hook, once, before any entry is logged; arg must outlive n (n may be NULL: no network,
 * nothing to hook). */
void moat_net_set_log_hook(struct moat_net *n, moat_net_log_hook fn, void *arg);
/* Creates or replaces path (mode 0600) with content. 0 or -1. */
int moat_net_put_file(const char *path, const char *content, moat_error **err);

#endif

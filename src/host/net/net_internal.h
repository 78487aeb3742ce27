/* net_internal.h -- what net.c, nft.c, dns.c, netlog.c and netpolicy.c share */
#ifndef MOAT_NET_INTERNAL_H
#define MOAT_NET_INTERNAL_H

#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "net.h"

#define NET_LOG_RING 1024 /* log entries kept per slot */
#define NET_LEARN_MAX 512 /* DNS-learned addresses remembered per slot */
#define NET_NFLOG_GROUP 7
#define NET_DNS_PORT 53
#define NET_NLBUF 8192 /* netlink message buffers (MNL_SOCKET_BUFFER_SIZE is not a constant) */

/* ---- policy (netpolicy.c) ---- */
enum net_rule_kind { RULE_CIDR = 1, RULE_NAME, RULE_WILDCARD };
struct net_rule {
  enum net_rule_kind kind;
  uint32_t addr; /* host order, masked */
  uint8_t plen;
  char *name; /* lower case, no trailing dot; for a wildcard the suffix without "*." */
};
struct net_policy {
  bool internet;
  bool egress_deny; /* default verdict deny */
  struct net_rule *allow, *deny;
  size_t n_allow, n_deny;
};
/* Parses (NULL = default policy). 0 or -1 (EINVAL). */
int net_policy_parse(json_t *j, struct net_policy *out, moat_error **err);
void net_policy_clear(struct net_policy *p);
/* Name verdict: 1 allowed, 0 denied. name lower case without trailing dot. */
int net_policy_name_allowed(const struct net_policy *p, const char *name);
/* Whether a name is covered by an explicit allow rule (its answers must be added to allow_dns). */
bool net_policy_name_listed(const struct net_rule *rules, size_t n, const char *name);

/* ---- slots ---- */
enum net_slot_state { NS_FREE = 0, NS_BUILDING, NS_PREPARED, NS_LEASED, NS_TEARDOWN };

struct net_learned {
  uint32_t addr; /* network order */
  bool denied;   /* element of deny_dns, else allow_dns; or neither when !in_set */
  bool in_set;
  char name[MOAT_NET_MAX_NAME + 1];
};

struct net_log_entry {
  uint64_t seq;
  int64_t time_ms;
  uint32_t daddr; /* network order */
  uint16_t dport;
  uint8_t proto;
  bool allowed;
  char reason[16];
  char name[MOAT_NET_MAX_NAME + 1];
};

/* The JSON of one log entry, as moat_net_log writes it (net.c). New reference. */
json_t *net_log_entry_json(const struct net_log_entry *le, const char *id, const char *org);

struct net_slot {
  enum net_slot_state state;
  int peer_ifindex; /* mpN in the routing ns while prepared */
  bool bound;
  char id[40];
  char org[128];
  json_t *policy_json; /* the bound policy (defaults filled), or NULL */
  struct net_policy pol;
  struct net_learned *learned; /* NET_LEARN_MAX ring */
  unsigned n_learned, learned_next;
  struct net_log_entry *log; /* NET_LOG_RING ring */
  uint64_t log_seq;          /* entries ever logged */
  uint64_t connections;
  bool link_down;             /* router side set down (internet: false) */
  bool link_want_down;        /* what the bound policy asks; the worker makes link_down follow */
  uint64_t teardown_since_ns; /* when queued for teardown */
  struct net_slot *next_teardown;
};

struct moat_net {
  char *instance, *state_dir, *ns_path;
  int router_fd;    /* routing namespace */
  int outside_fd;   /* uplink namespace (a netns path, or moatd's own) */
  int self_fd;      /* moatd's netns */
  int router_ioctl; /* AF_INET dgram socket in the routing ns: ifindex lookups without rtnl */
  bool uplink_is_netns;
  bool uplink_auto;      /* the uplink was "auto" (uplink_if is the default route's interface) */
  char *uplink_if;       /* interface mode: the uplink interface in moatd's netns */
  char outside_link[16]; /* our veth end in the uplink namespace */
  /* interface mode (uplink.c): IPv4 forwarding is on for outside_link and uplink_if only, never
   * host-wide. fwd_owned: uplink_if forwarded nothing before moatd turned it on (recorded in
   * state_dir/uplink-forwarding across restarts; turned off again when the last sandbox goes).
   * fwd_guard: owned and the host forwards nothing else (conf/all/forwarding 0), so that nft
   * drops every new flow entering through uplink_if that the host would otherwise forward. */
  bool fwd_owned, fwd_guard;
  uint32_t pool;      /* host order, first address */
  unsigned pool_size; /* /30s */
  unsigned warm;
  uint16_t api_port;
  char *block_ports;
  char *dns_fixed;   /* --net-dns-upstream as given, or NULL */
  char *resolv_path; /* without dns_fixed: where the upstreams come from (dns.c re-reads it) */

  /* Locks, each taken only in this order (never one while holding a later one):
   *   policy_lock  ->  lock
   *   policy_lock  ->  nl_lock, nft_lock (one round trip each, lock never held meanwhile)
   * lock is held for memory only (slots[], the counters and queues below), never across a
   * syscall round trip: the DNS thread, the log thread and every API read take it. nl_lock and
   * nft_lock are leaves, each held for one round trip on its socket or context. dns.c's
   * struct net_dns has two leaf locks of its own. */
  pthread_mutex_t policy_lock; /* serializes changes of a slot's nft elements (bind, teardown, DNS
                                  answers that add elements, reconcile): held across the nft and
                                  netlink round trips and the state-file writes of one change, so
                                  that what is in nft always matches slots[i].pol */
  pthread_mutex_t lock;        /* slots[], prepared/leased/tearing, teardown_head, stopping, worker_started */
  pthread_cond_t wake;         /* with lock: the worker waits for work */
  struct net_slot *slots;      /* pool_size entries */
  unsigned prepared, leased, tearing;
  struct net_slot *teardown_head;
  bool link_dirty; /* some leased slot's link_want_down differs from its link_down */
  bool stopping;
  pthread_t worker;
  bool worker_started;

  pthread_mutex_t nl_lock; /* nl and nl_seq: one request and its answer at a time */
  struct mnl_socket *nl;
  unsigned nl_seq;

  pthread_mutex_t nft_lock; /* nft and nft_self (libnftables contexts are not thread-safe) */
  struct nft_ctx *nft;      /* bound to the routing ns */
  struct nft_ctx *nft_self; /* bound to moatd's ns (interface uplink only) */

  /* dns.c */
  struct net_dns *dns; /* its pending queries and TCP connections (dns_start .. dns_stop) */
  int dns_fd;          /* UDP in the routing ns */
  int dns_tcp_fd;      /* TCP listener in the routing ns */
  int up_fd;           /* UDP towards the upstream, in the uplink namespace */
  pthread_t dns_thread;
  bool dns_started;
  int stop_pipe[2];
  /* netlog.c */
  struct mnl_socket *nflog;
  pthread_t log_thread;
  /* moat_net_set_log_hook: called on the log thread for every new entry (set once, never cleared) */
  _Atomic(moat_net_log_hook) log_hook;
  void *log_hook_arg;
  bool log_started;
};

static inline uint32_t net_slot_sandbox_ip(const struct moat_net *n, int slot) {
  return htonl(n->pool + (uint32_t)slot * 4 + 2);
}
static inline uint32_t net_slot_router_ip(const struct moat_net *n, int slot) {
  return htonl(n->pool + (uint32_t)slot * 4 + 1);
}
static inline uint32_t net_dns_ip(const struct moat_net *n) { return htonl(n->pool + 1); }
/* Slot of a sandbox address, or -1. */
int net_slot_of_ip(const struct moat_net *n, uint32_t addr_be);

/* Runs fn in the routing (or any) namespace on this thread: setns there, call, setns back. */
int net_in_ns(int nsfd, int (*fn)(void *), void *arg, moat_error **err);
/* Socket created in namespace nsfd. fd or -1. */
int net_socket_in(int nsfd, int domain, int type, int proto, moat_error **err);

/* ---- uplink.c ---- */
/* Resolves spec ("auto", "IFNAME" or "netns:PATH") into n->outside_fd and n->uplink_if in
 * moatd's netns (n->self_fd). 0, or -1: EINVAL naming a missing interface or namespace,
 * ENETUNREACH for auto without an IPv4 default route. */
int net_uplink_resolve(struct moat_net *n, const char *spec, moat_error **err);
/* Interface mode: forwarding on outside_link and uplink_if, fwd_owned and fwd_guard set. 0 or -1. */
int net_uplink_forwarding_on(struct moat_net *n, moat_error **err);
/* Re-evaluates fwd_guard (the host may have turned forwarding on meanwhile). true when it changed. */
bool net_uplink_guard_changed(struct moat_net *n);
/* The last sandbox is gone: uplink_if's forwarding off again if moatd turned it on. */
void net_uplink_forwarding_off(struct moat_net *n);

/* ---- nft.c ---- */
/* Appends printf output to the malloc'd string *buf of length *len (both may start NULL / 0). */
void net_sappend(char **buf, size_t *len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int nft_open(struct moat_net *n, moat_error **err);
void nft_close(struct moat_net *n);
/* Re-reads the host's addresses into set hostaddrs (one transaction: never empty in between). */
int nft_refresh_hostaddrs(struct moat_net *n, moat_error **err);
/* Runs one nft script (a transaction) in the routing ns. 0 or -1 with nft's message. */
int nft_run(struct moat_net *n, const char *script, moat_error **err);
/* Appends to b the "add/delete element" lines of slot's policy p (op "add" or "delete"). */
void nft_policy_elements(struct moat_net *n, int slot, const struct net_policy *p, const char *op, char **buf,
                         size_t *len);
/* Interface-mode uplink: masquerade and the forward filter in moatd's own netns (rebuilt, with
 * the guard as n->fwd_guard says, when called again). */
int nft_uplink_open(struct moat_net *n, moat_error **err);
void nft_uplink_close(struct moat_net *n);

/* ---- dns.c ---- */
/* Checks n->dns_fixed (EINVAL when it is not IP or IP:PORT). */
int dns_check_fixed(const char *fixed, moat_error **err);
int dns_start(struct moat_net *n, moat_error **err);
/* The upstreams in use, as ["IP:PORT", ...] (empty when none is configured). New reference. */
json_t *dns_upstreams_json(struct moat_net *n);
void dns_stop(struct moat_net *n);
/* Name of addr as last learned by slot's DNS, copied into out (size MOAT_NET_MAX_NAME + 1): "" if none.
 * Call with n->lock held. */
void net_learned_name(struct net_slot *s, uint32_t addr, char *out);
/* Removes slot's learned addresses from the nft sets (n->policy_lock held, n->lock not). */
void net_forget_learned(struct moat_net *n, int slot);

/* ---- netlog.c ---- */
int netlog_start(struct moat_net *n, moat_error **err);
void netlog_stop(struct moat_net *n);

#endif

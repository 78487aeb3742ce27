/* network.c -- control's side of sandbox networking: policy on create and at run time,
 * network state and the connection log of a sandbox, by id and org; which sandbox holds an address */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "../common/util.h"
#include "../host/net/net.h"
#include "control_internal.h"

static bool wants_internet(json_t *policy) {
  json_t *i = policy ? json_object_get(policy, "internet") : NULL;
  return !i || !json_is_false(i);
}

json_t *moat_control_network_status(struct moat_control *c) {
  return moat_net_status(moat_host_net(c->host));
}

int moat_control_network_check(struct moat_control *c, json_t *policy, moat_error **err) {
  if (moat_net_policy_check(policy, err) < 0)
    return -1;
  if (!moat_host_net(c->host) && wants_internet(policy))
    return moat_error_set(
        err, EINVAL,
        "network: this moatd has no uplink (it was started with --net-uplink none, or on a host with "
        "no IPv4 default route): sandboxes have loopback only; ask for {\"internet\": false} or leave "
        "network out");
  return 0;
}

int ctl_net_bind(struct moat_control *c, const char *id, const char *org, int slot, json_t *policy,
                 const char *forked_from, moat_error **err) {
  struct moat_net *net = moat_host_net(c->host);
  if (!net)
    return 0;
  int ns = moat_host_net_slot(c->host, slot);
  if (ns < 0)
    return moat_error_set(err, EIO, "sandbox %s has no network slot", id);
  /* No policy given: a fork takes its parent's, a woken or rolled back sandbox its own. */
  json_t *inherited = policy ? NULL : moat_net_saved_policy(net, forked_from ? forked_from : id);
  int r = moat_net_bind(net, ns, id, org, policy ? policy : inherited, err);
  json_decref(inherited);
  return r < 0 ? moat_error_wrap(err, "network") : 0;
}

void ctl_net_forget(struct moat_control *c, const char *id) { moat_net_forget(moat_host_net(c->host), id); }

/* The running sandbox's network slot, or -1 (err set). e->m is taken and released here. */
static int sandbox_net_slot(struct moat_control *c, const char *org, const char *id, moat_error **err) {
  struct live *e = live_get(c, id);
  if (!e || strcmp(e->org, org) != 0) {
    if (e)
      live_put(c, e);
    return not_live_error(c, org, id, err);
  }
  pthread_mutex_lock(&e->m);
  int slot = e->state == MOAT_SB_RUNNING || e->state == MOAT_SB_PAUSED ? e->slot : -1;
  enum moat_sandbox_state st = e->state;
  pthread_mutex_unlock(&e->m);
  live_put(c, e);
  if (st == MOAT_SB_KILLED)
    return not_live_error(c, org, id, err);
  if (slot < 0)
    return moat_error_set(err, EBUSY, "sandbox %s is %s", id, moat_sandbox_state_name(st));
  return moat_host_net_slot(c->host, slot) < 0 ? -2 : moat_host_net_slot(c->host, slot);
}

static json_t *no_network(void) {
  json_t *p = moat_net_policy_default();
  json_object_set_new(p, "internet", json_false());
  return json_pack("{s:n, s:o, s:i, s:i, s:i}", "address", "policy", p, "bytes_in", 0, "bytes_out", 0,
                   "connections", 0);
}

json_t *moat_control_network_get(struct moat_control *c, const char *org, const char *id, moat_error **err) {
  int ns = sandbox_net_slot(c, org, id, err);
  if (ns == -1)
    return NULL;
  if (ns == -2 || !moat_host_net(c->host))
    return no_network();
  return moat_net_describe(moat_host_net(c->host), ns, err);
}

json_t *moat_control_network_set(struct moat_control *c, const char *org, const char *id, json_t *policy,
                                 moat_error **err) {
  if (moat_net_policy_check(policy, err) < 0)
    return NULL;
  int ns = sandbox_net_slot(c, org, id, err);
  if (ns == -1)
    return NULL;
  if (ns == -2 || !moat_host_net(c->host)) {
    if (wants_internet(policy)) {
      moat_error_set(err, EINVAL, "network: sandbox %s has no network (this moatd has no uplink)", id);
      return NULL;
    }
    return no_network();
  }
  if (moat_net_bind(moat_host_net(c->host), ns, id, org, policy, err) < 0)
    return NULL;
  return moat_net_describe(moat_host_net(c->host), ns, err);
}

json_t *moat_control_network_log(struct moat_control *c, const char *org, const char *id, uint64_t since,
                                 unsigned limit, moat_error **err) {
  int ns = sandbox_net_slot(c, org, id, err);
  if (ns == -1)
    return NULL;
  if (ns == -2 || !moat_host_net(c->host))
    return json_array();
  return moat_net_log(moat_host_net(c->host), ns, since, limit, err);
}

int moat_control_sandbox_org_at(struct moat_control *c, uint32_t addr_be, char **org, char **sandbox_id,
                                moat_error **err) {
  struct moat_net *net = moat_host_net(c->host);
  char id[MOAT_ID_LEN + 1] = "";
  int ns = net ? moat_net_sandbox_at(net, addr_be, id, sizeof(id)) : -1;
  struct live *e = ns >= 0 ? live_get(c, id) : NULL;
  if (!e)
    return moat_error_set(err, ENOENT, "no live sandbox holds that address");
  pthread_mutex_lock(&e->m);
  bool live = e->state == MOAT_SB_RUNNING || e->state == MOAT_SB_PAUSED;
  int slot = live ? e->slot : -1;
  char *o = live ? xstrdup(e->org) : NULL;
  pthread_mutex_unlock(&e->m);
  live_put(c, e);
  /* the network slot the address names is the one this sandbox holds now */
  if (slot < 0 || moat_host_net_slot(c->host, slot) != ns) {
    free(o);
    return moat_error_set(err, ENOENT, "no live sandbox holds that address");
  }
  *org = o;
  if (sandbox_id)
    *sandbox_id = xstrdup(id);
  return 0;
}

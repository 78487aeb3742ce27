/* fuzz_netpolicy.c -- libFuzzer target: a sandbox's network policy parser and name matching
 * (host netpolicy.c), which read the JSON a client sends with a create or a PUT .../network.
 *
 * Input: the policy's JSON text, then optionally a NUL byte and a name to match. Checks: a policy
 * that parses has no more than MOAT_NET_MAX_RULES rules, CIDRs without host bits, no CIDR inside
 * another of its list, names in lower case without a trailing dot or a '*'; each rule's own name
 * matches it (a wildcard matches a name below it, never itself); deny wins over allow for every
 * listed name and for the input's name; a policy that fails says why, with EINVAL, and holds
 * nothing; moat_net_policy_check agrees with the parse. */
#include <errno.h>
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "host/net/net_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_rules(const struct net_policy *p, const struct net_rule *r, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (r[i].kind == RULE_CIDR) {
      uint32_t mask = r[i].plen ? ~0u << (32 - r[i].plen) : 0;
      if (r[i].plen > 32 || (r[i].addr & ~mask) || r[i].name)
        abort();
      for (size_t j = 0; j < n; j++) {
        if (j == i || r[j].kind != RULE_CIDR || r[j].plen > r[i].plen)
          continue;
        uint32_t mj = r[j].plen ? ~0u << (32 - r[j].plen) : 0;
        if ((r[i].addr & mj) == r[j].addr)
          abort(); /* one interval inside another cannot sit in one nft interval set */
      }
      continue;
    }
    if ((r[i].kind != RULE_NAME && r[i].kind != RULE_WILDCARD) || !r[i].name)
      abort();
    size_t l = strlen(r[i].name);
    if (l == 0 || l > MOAT_NET_MAX_NAME || r[i].name[l - 1] == '.' || strchr(r[i].name, '*'))
      abort();
    for (size_t k = 0; k < l; k++)
      if (r[i].name[k] >= 'A' && r[i].name[k] <= 'Z')
        abort();
    char below[MOAT_NET_MAX_NAME + 8];
    snprintf(below, sizeof(below), "a.%s", r[i].name);
    bool self = net_policy_name_listed(&r[i], 1, r[i].name), sub = net_policy_name_listed(&r[i], 1, below);
    if (r[i].kind == RULE_NAME ? !self || sub : self || !sub)
      abort();
  }
}

static void check_name(const struct net_policy *p, const char *name) {
  int allowed = net_policy_name_allowed(p, name);
  if (allowed != 0 && allowed != 1)
    abort();
  if (allowed && (!p->internet || net_policy_name_listed(p->deny, p->n_deny, name)))
    abort(); /* deny wins, and internet: false allows nothing */
  if (allowed && p->egress_deny && !net_policy_name_listed(p->allow, p->n_allow, name))
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const uint8_t *nul = memchr(data, '\0', size);
  size_t jl = nul ? (size_t)(nul - data) : size;
  _cleanup_free_ char *name = nul ? xstrndup((const char *)nul + 1, size - jl - 1) : NULL;
  json_error_t je;
  json_t *j = json_loadb((const char *)data, jl, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
  if (!j)
    return 0;
  struct net_policy p;
  moat_error *err = NULL;
  int rc = net_policy_parse(j, &p, &err);
  moat_error *err2 = NULL;
  if (moat_net_policy_check(j, &err2) != rc)
    abort();
  moat_error_free(&err2);
  if (rc < 0) {
    if (!err || err->status != EINVAL || !err->msg || p.allow || p.deny || p.n_allow || p.n_deny)
      abort();
    moat_error_free(&err);
    json_decref(j);
    return 0;
  }
  if (err || p.n_allow + p.n_deny > MOAT_NET_MAX_RULES)
    abort();
  check_rules(&p, p.allow, p.n_allow);
  check_rules(&p, p.deny, p.n_deny);
  for (size_t i = 0; i < p.n_deny; i++)
    if (p.deny[i].kind == RULE_NAME && net_policy_name_allowed(&p, p.deny[i].name))
      abort();
  for (size_t i = 0; i < p.n_allow; i++)
    if (p.allow[i].name)
      check_name(&p, p.allow[i].name);
  if (name)
    check_name(&p, name);
  net_policy_clear(&p);
  json_decref(j);
  return 0;
}

/* netpolicy.c -- a sandbox's network policy: parsing, validation and name matching (pure code)
 *
 * {internet: bool = true, egress: "allow"|"deny" = "allow", allow: [ENTRY], deny: [ENTRY]}
 * ENTRY: an IPv4 address, an IPv4 CIDR (no host bits), a domain name ("example.com": that name
 * only) or a wildcard ("*.example.com": every name below example.com, not example.com itself).
 * At most MOAT_NET_MAX_RULES entries in allow and deny together. Deny wins over allow.
 */
#include "net_internal.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "../../common/util.h"

json_t *moat_net_policy_default(void) {
  return json_pack("{s:b, s:s, s:[], s:[]}", "internet", 1, "egress", "allow", "allow", "deny");
}

void net_policy_clear(struct net_policy *p) {
  for (size_t i = 0; i < p->n_allow; i++)
    free(p->allow[i].name);
  for (size_t i = 0; i < p->n_deny; i++)
    free(p->deny[i].name);
  free(p->allow);
  free(p->deny);
  memset(p, 0, sizeof(*p));
}

static bool looks_numeric(const char *s) {
  for (; *s; s++)
    if (!isdigit((unsigned char)*s) && *s != '.' && *s != '/')
      return false;
  return true;
}

static int valid_name(const char *s) {
  size_t len = strlen(s);
  if (len == 0 || len > MOAT_NET_MAX_NAME)
    return 0;
  size_t label = 0;
  for (const char *p = s; *p; p++) {
    if (*p == '.') {
      if (label == 0)
        return 0;
      label = 0;
      continue;
    }
    if (!isalnum((unsigned char)*p) && *p != '-' && *p != '_')
      return 0;
    if (++label > 63)
      return 0;
  }
  return label > 0;
}

static int parse_entry(const char *field, size_t idx, const char *s, struct net_rule *r, moat_error **err) {
  memset(r, 0, sizeof(*r));
  size_t len = strlen(s);
  if (len == 0 || len > MOAT_NET_MAX_NAME + 2)
    return moat_error_set(err, EINVAL, "network.%s[%zu]: expected an IPv4 address, CIDR, name or *.name",
                          field, idx);
  if (strchr(s, ':'))
    return moat_error_set(err, EINVAL,
                          "network.%s[%zu]: '%.64s': IPv6 is not supported (sandboxes have IPv4 only)", field,
                          idx, s);
  if (looks_numeric(s)) {
    char tmp[64];
    if (len >= sizeof(tmp))
      return moat_error_set(err, EINVAL, "network.%s[%zu]: '%.64s' is not a valid IPv4 address or CIDR",
                            field, idx, s);
    memcpy(tmp, s, len + 1);
    char *slash = strchr(tmp, '/');
    uint64_t plen = 32;
    if (slash) {
      *slash = '\0';
      if (parse_u64(slash + 1, &plen) < 0 || plen > 32 || !slash[1] || strlen(slash + 1) > 2)
        return moat_error_set(err, EINVAL, "network.%s[%zu]: '%.64s': the prefix length must be 0 to 32",
                              field, idx, s);
    }
    struct in_addr a;
    if (inet_pton(AF_INET, tmp, &a) != 1)
      return moat_error_set(err, EINVAL, "network.%s[%zu]: '%.64s' is not a valid IPv4 address or CIDR",
                            field, idx, s);
    uint32_t h = ntohl(a.s_addr), mask = plen ? ~0u << (32 - plen) : 0;
    if (h & ~mask)
      return moat_error_set(err, EINVAL,
                            "network.%s[%zu]: '%.64s' has host bits set (did you mean %u.%u.%u.%u/%u?)",
                            field, idx, s, (h & mask) >> 24, ((h & mask) >> 16) & 255,
                            ((h & mask) >> 8) & 255, h & mask & 255, (unsigned)plen);
    r->kind = RULE_CIDR;
    r->addr = h;
    r->plen = (uint8_t)plen;
    return 0;
  }
  char low[MOAT_NET_MAX_NAME + 3];
  size_t w = 0;
  for (const char *p = s; *p; p++)
    low[w++] = (char)tolower((unsigned char)*p);
  low[w] = '\0';
  if (w && low[w - 1] == '.')
    low[--w] = '\0';
  const char *name = low;
  bool wild = false;
  if (strncmp(low, "*.", 2) == 0) {
    wild = true;
    name = low + 2;
  }
  if (!valid_name(name) || strchr(name, '*'))
    return moat_error_set(err, EINVAL,
                          "network.%s[%zu]: '%.64s' is not a valid domain name (letters, digits, '-', '_'; a "
                          "wildcard is '*.' before a name)",
                          field, idx, s);
  r->kind = wild ? RULE_WILDCARD : RULE_NAME;
  r->name = xstrdup(name);
  return 0;
}

static bool cidr_within(const struct net_rule *inner, const struct net_rule *outer) {
  if (outer->plen > inner->plen)
    return false;
  uint32_t mask = outer->plen ? ~0u << (32 - outer->plen) : 0;
  return (inner->addr & mask) == outer->addr;
}

static int parse_list(json_t *arr, const char *field, struct net_rule **out, size_t *n, size_t *total,
                      moat_error **err) {
  if (!arr)
    return 0;
  if (!json_is_array(arr))
    return moat_error_set(err, EINVAL, "network.%s must be an array of strings", field);
  size_t sz = json_array_size(arr);
  *total += sz;
  if (*total > MOAT_NET_MAX_RULES)
    return moat_error_set(err, EINVAL,
                          "network: at most %d entries in allow and deny together (got %zu or more)",
                          MOAT_NET_MAX_RULES, *total);
  *out = xcalloc(sz ? sz : 1, sizeof(struct net_rule));
  for (size_t i = 0; i < sz; i++) {
    json_t *v = json_array_get(arr, i);
    if (!json_is_string(v) || strlen(json_string_value(v)) != json_string_length(v))
      return moat_error_set(err, EINVAL, "network.%s[%zu] must be a string", field, i);
    struct net_rule r;
    if (parse_entry(field, i, json_string_value(v), &r, err) < 0)
      return -1;
    (*out)[(*n)++] = r;
  }
  /* Overlapping intervals cannot sit in one nft interval set: keep only CIDRs no other one of
   * the list contains (identical ones: the first). */
  size_t w = 0;
  for (size_t i = 0; i < *n; i++) {
    struct net_rule *r = &(*out)[i];
    bool covered = false;
    for (size_t j = 0; r->kind == RULE_CIDR && j < *n && !covered; j++) {
      const struct net_rule *o = &(*out)[j];
      if (j == i || o->kind != RULE_CIDR || !cidr_within(r, o))
        continue;
      covered = o->plen < r->plen || j < i;
    }
    if (covered) {
      free(r->name);
      continue;
    }
    (*out)[w++] = *r;
  }
  *n = w;
  return 0;
}

int net_policy_parse(json_t *j, struct net_policy *out, moat_error **err) {
  memset(out, 0, sizeof(*out));
  out->internet = true;
  if (!j || json_is_null(j))
    return 0;
  if (!json_is_object(j))
    return moat_error_set(err, EINVAL, "network must be an object {internet, egress, allow, deny}");
  const char *k;
  json_t *v;
  json_object_foreach(j, k, v) {
    if (strcmp(k, "internet") && strcmp(k, "egress") && strcmp(k, "allow") && strcmp(k, "deny"))
      return moat_error_set(err, EINVAL, "network: unknown field '%.64s' (internet, egress, allow, deny)", k);
  }
  json_t *inet = json_object_get(j, "internet");
  if (inet) {
    if (!json_is_boolean(inet))
      return moat_error_set(err, EINVAL, "network.internet must be true or false");
    out->internet = json_is_true(inet);
  }
  json_t *eg = json_object_get(j, "egress");
  if (eg) {
    const char *s = json_string_value(eg);
    if (!s || (strcmp(s, "allow") && strcmp(s, "deny")))
      return moat_error_set(err, EINVAL, "network.egress must be \"allow\" or \"deny\"");
    out->egress_deny = strcmp(s, "deny") == 0;
  }
  size_t total = 0;
  if (parse_list(json_object_get(j, "allow"), "allow", &out->allow, &out->n_allow, &total, err) < 0 ||
      parse_list(json_object_get(j, "deny"), "deny", &out->deny, &out->n_deny, &total, err) < 0) {
    net_policy_clear(out);
    return -1;
  }
  return 0;
}

int moat_net_policy_check(json_t *policy, moat_error **err) {
  struct net_policy p;
  if (net_policy_parse(policy, &p, err) < 0)
    return -1;
  net_policy_clear(&p);
  return 0;
}

static bool rule_matches(const struct net_rule *r, const char *name) {
  if (r->kind == RULE_NAME)
    return strcmp(r->name, name) == 0;
  if (r->kind != RULE_WILDCARD)
    return false;
  size_t ln = strlen(name), lr = strlen(r->name);
  return ln > lr + 1 && name[ln - lr - 1] == '.' && strcmp(name + ln - lr, r->name) == 0;
}

bool net_policy_name_listed(const struct net_rule *rules, size_t n, const char *name) {
  for (size_t i = 0; i < n; i++)
    if (rule_matches(&rules[i], name))
      return true;
  return false;
}

int net_policy_name_allowed(const struct net_policy *p, const char *name) {
  if (!p->internet)
    return 0;
  if (net_policy_name_listed(p->deny, p->n_deny, name))
    return 0;
  if (p->egress_deny)
    return net_policy_name_listed(p->allow, p->n_allow, name) ? 1 : 0;
  return 1;
}

/* test_netpolicy.c -- network policy parsing, bounds and name matching (src/host/net/netpolicy.c) */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "../../src/common/util.h"
#include "../../src/host/net/net_internal.h"

static int passed, failed, n;
#define OK(cond, name)                                                                                       \
  do {                                                                                                       \
    n++;                                                                                                     \
    if (cond) {                                                                                              \
      passed++;                                                                                              \
      printf("ok %d - %s\n", n, name);                                                                       \
    } else {                                                                                                 \
      failed++;                                                                                              \
      printf("not ok %d - %s\n", n, name);                                                                   \
    }                                                                                                        \
  } while (0)

/* 0 when text parses; else the error status, with its message in msg. */
static int parse(const char *text, struct net_policy *p, char *msg, size_t len) {
  json_t *j = json_loads(text, JSON_DECODE_ANY, NULL);
  moat_error *err = NULL;
  int rc = net_policy_parse(j, p, &err);
  json_decref(j);
  if (rc == 0)
    return 0;
  snprintf(msg, len, "%s", moat_error_msg(err));
  int st = err->status;
  moat_error_free(&err);
  return st;
}

static bool rejects(const char *text, const char *needle) {
  struct net_policy p;
  char msg[512] = "";
  int st = parse(text, &p, msg, sizeof(msg));
  if (st == 0)
    net_policy_clear(&p);
  return st == EINVAL && (!needle || strstr(msg, needle));
}

int main(void) {
  struct net_policy p;
  char msg[512];
  OK(parse("null", &p, msg, sizeof(msg)) == 0 && p.internet && !p.egress_deny && !p.n_allow,
     "null: default policy");
  net_policy_clear(&p);
  OK(parse("{\"internet\":false,\"egress\":\"deny\",\"allow\":[\"10.0.0.0/8\",\"1.2.3.4\",\"Example.COM.\","
           "\"*.api.test\"],\"deny\":[\"0.0.0.0/0\"]}",
           &p, msg, sizeof(msg)) == 0,
     "a full policy parses");
  OK(!p.internet && p.egress_deny && p.n_allow == 4 && p.n_deny == 1, "fields");
  OK(p.allow[0].kind == RULE_CIDR && p.allow[0].addr == 0x0a000000u && p.allow[0].plen == 8, "CIDR");
  OK(p.allow[1].kind == RULE_CIDR && p.allow[1].plen == 32, "IP is a /32");
  OK(p.allow[2].kind == RULE_NAME && strcmp(p.allow[2].name, "example.com") == 0,
     "name lower-cased, dot dropped");
  OK(p.allow[3].kind == RULE_WILDCARD && strcmp(p.allow[3].name, "api.test") == 0, "wildcard suffix");
  net_policy_clear(&p);

  OK(rejects("{\"allow\":[\"10.0.0.0/33\"]}", "allow[0]"), "prefix 33");
  OK(rejects("{\"allow\":[\"300.1.1.1\"]}", "not a valid IPv4"), "octet 300");
  OK(rejects("{\"allow\":[\"10.0.0/8\"]}", NULL), "three octets");
  OK(rejects("{\"deny\":[\"10.0.0.1/8\"]}", "host bits"), "host bits set");
  OK(rejects("{\"deny\":[\"1.2.3.4/\"]}", NULL), "empty prefix");
  OK(rejects("{\"deny\":[\"fe80::/10\"]}", "IPv6"), "IPv6 refused");
  OK(rejects("{\"allow\":[\"*.*.com\"]}", NULL), "double wildcard");
  OK(rejects("{\"allow\":[\"a*.com\"]}", NULL), "inner star");
  OK(rejects("{\"allow\":[\"a..com\"]}", NULL), "empty label");
  OK(rejects("{\"allow\":[7]}", "string"), "number entry");
  OK(rejects("{\"allow\":\"x.com\"}", "array"), "not an array");
  OK(rejects("{\"egress\":\"maybe\"}", "egress"), "egress value");
  OK(rejects("{\"internet\":1}", "internet"), "internet type");
  OK(rejects("{\"colour\":1}", "unknown field"), "unknown field");
  OK(rejects("[]", NULL), "not an object");
  {
    char *big = xstrdup("{\"allow\":[");
    for (int i = 0; i < 10000; i++) {
      char *nb = xasprintf("%s%s\"d%d.example.com\"", big, i ? "," : "", i);
      free(big);
      big = nb;
    }
    char *nb = xasprintf("%s]}", big);
    free(big);
    OK(rejects(nb, "at most 1024"), "10,000 entries rejected");
    free(nb);
  }

  OK(parse("{\"allow\":[\"10.0.0.0/8\",\"10.1.0.0/16\",\"10.0.0.0/8\",\"192.168.1.1\"]}", &p, msg,
           sizeof(msg)) == 0 &&
         p.n_allow == 2,
     "contained and duplicate CIDRs folded (nft interval sets take no overlaps)");
  net_policy_clear(&p);

  parse("{\"deny\":[\"bad.test\",\"*.evil.test\"]}", &p, msg, sizeof(msg));
  OK(net_policy_name_allowed(&p, "good.test") == 1, "egress allow: unlisted allowed");
  OK(net_policy_name_allowed(&p, "bad.test") == 0, "exact deny");
  OK(net_policy_name_allowed(&p, "sub.bad.test") == 1, "exact does not cover subdomains");
  OK(net_policy_name_allowed(&p, "a.b.evil.test") == 0, "wildcard deny, deep");
  OK(net_policy_name_allowed(&p, "evil.test") == 1, "wildcard does not cover its base");
  OK(net_policy_name_allowed(&p, "notevil.test") == 1, "wildcard needs a dot boundary");
  net_policy_clear(&p);
  parse("{\"egress\":\"deny\",\"allow\":[\"*.api.test\",\"ok.test\"],\"deny\":[\"x.api.test\"]}", &p, msg,
        sizeof(msg));
  OK(net_policy_name_allowed(&p, "ok.test") == 1 && net_policy_name_allowed(&p, "y.api.test") == 1,
     "egress deny: listed allowed");
  OK(net_policy_name_allowed(&p, "other.test") == 0, "egress deny: unlisted denied");
  OK(net_policy_name_allowed(&p, "x.api.test") == 0, "deny wins over allow");
  net_policy_clear(&p);
  parse("{\"internet\":false,\"allow\":[\"ok.test\"]}", &p, msg, sizeof(msg));
  OK(net_policy_name_allowed(&p, "ok.test") == 0, "internet false: nothing resolves");
  net_policy_clear(&p);

  printf("1..%d\n%d passed, %d failed\n", n, passed, failed);
  return failed ? 1 : 0;
}

/* events.c -- a sandbox's recorded lifecycle events, scoped to an org (GET .../events) */
#include <errno.h>

#include "../common/util.h"
#include "../host/net/net.h"
#include "control_internal.h"

void moat_control_set_conn_hook(struct moat_control *c, void (*fn)(const char *id, json_t *entry)) {
  moat_net_set_log_hook(moat_host_net(c->host), fn);
}

int moat_control_sandbox_events(struct moat_control *c, const char *org, const char *id,
                                struct moat_store_event **out, size_t *n, char **forked_from, moat_error **err) {
  struct moat_store_sandbox r = {0};
  *out = NULL;
  *n = 0;
  if (forked_from)
    *forked_from = NULL;
  if (moat_store_sandbox_get(c->store, org, id, &r, err) < 0)
    return -1;
  if (forked_from && r.forked_from)
    *forked_from = xstrdup(r.forked_from);
  moat_store_sandbox_clear(&r);
  return moat_store_events(c->store, id, out, n, err);
}

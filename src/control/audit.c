/* audit.c -- the audit log of mutating calls (control.h, "audit") */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "../common/log.h"
#include "../common/util.h"
#include "control_internal.h"

#define AUDIT_PRUNE_EVERY_MS 60000

void moat_control_audit_record(struct moat_control *c, const struct moat_audit_entry *a) {
  struct moat_store_audit row = {.at_ms = a->at_ms ? a->at_ms : now_unix_ms(),
                                 .org = (char *)a->org,
                                 .key_id = (char *)a->key_id,
                                 .method = (char *)a->method,
                                 .route = (char *)(a->route ? a->route : "-"),
                                 .path = (char *)a->path,
                                 .target = (char *)a->target,
                                 .status = a->status};
  moat_error *e = NULL;
  if (moat_store_audit_add(c->store, &row, &e) < 0) {
    log_error("audit: %s %s of %s not recorded: %s", a->method, a->path, a->org, moat_error_msg(e));
    moat_error_free(&e);
  }
}

int moat_control_audit_list(struct moat_control *c, const struct moat_store_audit_query *q,
                            struct moat_store_audit **out, size_t *n, moat_error **err) {
  return moat_store_audit_list(c->store, q, out, n, err);
}

int64_t moat_control_audit_retention_ms(const struct moat_control *c) { return c->audit_retention_ms; }

void ctl_audit_reap(struct moat_control *c, int64_t now_ms) {
  if (now_ms - c->audit_pruned_ms < AUDIT_PRUNE_EVERY_MS)
    return;
  c->audit_pruned_ms = now_ms;
  moat_error *e = NULL;
  int n = moat_store_audit_prune(c->store, now_ms - c->audit_retention_ms, &e);
  if (n < 0) {
    log_warn("audit: prune: %s", moat_error_msg(e));
    moat_error_free(&e);
  } else if (n > 0) {
    log_info("audit: removed %d entries older than %lld days", n,
             (long long)(c->audit_retention_ms / 86400000));
  }
}

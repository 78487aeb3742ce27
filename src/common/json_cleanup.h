/* json_cleanup.h -- _cleanup_json_: a jansson value the scope owns, json_decref'd when it ends.
 * Hand ownership off with moat_steal_json(&v), which returns v and leaves NULL behind. */
#pragma once

#include <jansson.h>

static inline void moat_json_decrefp(json_t **p) { json_decref(*p); }
#define _cleanup_json_ __attribute__((cleanup(moat_json_decrefp)))

static inline json_t *moat_steal_json(json_t **p) {
  json_t *v = *p;
  *p = NULL;
  return v;
}

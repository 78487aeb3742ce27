/* spec.h -- control's pure helpers: sandbox spec validation with defaults, env and metadata checks */
#ifndef MOAT_CONTROL_SPEC_H
#define MOAT_CONTROL_SPEC_H

#include <jansson.h>
#include <stdint.h>

#include "control.h"

/* Host capacity the spec is checked against. */
struct moat_spec_bounds {
  uint64_t host_memory_mb; /* physical RAM */
  uint64_t disk_fs_mb;     /* size of the data dir's filesystem */
  uint64_t host_pids;      /* most tasks one sandbox may hold (moat_spec_host_pids); 0: no bound */
};

/* The most tasks one sandbox may hold on a host with kernel.pid_max pid_max and
 * kernel.threads-max threads_max: a quarter of the smaller. Both are host-wide (every task of
 * every sandbox also takes a pid of the host's), so a sandbox at its pids limit leaves the host
 * and the other sandboxes three quarters. */
uint64_t moat_spec_host_pids(uint64_t pid_max, uint64_t threads_max);

/* Applies defaults (zero fields) and checks every bound of control.h and the host's capacity.
 * Defaults larger than the host are lowered to fit it; explicit values larger are EINVAL.
 * On success fills *limits and *ttl_seconds. Returns 0, or -1 with EINVAL naming the field. */
int moat_spec_resolve(const struct moat_sandbox_spec *spec, const struct moat_spec_bounds *b,
                      struct moat_limits *limits, int64_t *ttl_seconds, moat_error **err);

/* metadata: NULL, or an object of <= 64 string values, keys 1..128 bytes, values <= 1024 bytes. */
int moat_spec_check_metadata(json_t *metadata, moat_error **err);
/* env: NULL, or an object of string values with keys [A-Za-z_][A-Za-z0-9_]*, values without NUL. */
int moat_spec_check_env(json_t *env, moat_error **err);

/* Merges "K=V" entries: base (a JSON object, may be NULL) under over (NULL-terminated, may be
 * NULL); an entry of over replaces base's entry of the same name. Returns a new vector (never
 * NULL; caller frees with strv_free), base's entries first in key order, then over's. */
char **moat_env_merge(json_t *base, char *const *over);

#endif

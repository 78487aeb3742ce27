/* spec.c -- sandbox spec validation with defaults, env and metadata checks, env merging */
#include "spec.h"

#include <errno.h>
#include <math.h>
#include <string.h>

#include "../common/util.h"

int moat_spec_check_metadata(json_t *metadata, moat_error **err) {
  if (!metadata)
    return 0;
  if (!json_is_object(metadata))
    return moat_error_set(err, EINVAL, "metadata: must be an object of strings");
  if (json_object_size(metadata) > 64)
    return moat_error_set(err, EINVAL, "metadata: at most 64 keys");
  const char *k;
  json_t *v;
  json_object_foreach(metadata, k, v) {
    size_t klen = strlen(k);
    if (klen == 0 || klen > 128)
      return moat_error_set(err, EINVAL, "metadata: keys must be 1 to 128 bytes");
    if (!json_is_string(v))
      return moat_error_set(err, EINVAL, "metadata.%s: must be a string", k);
    if (json_string_length(v) > 1024)
      return moat_error_set(err, EINVAL, "metadata.%s: at most 1024 bytes", k);
    if (strlen(json_string_value(v)) != json_string_length(v))
      return moat_error_set(err, EINVAL, "metadata.%s: contains a NUL byte", k);
  }
  return 0;
}

static bool env_name_ok(const char *k) {
  if (!((*k >= 'A' && *k <= 'Z') || (*k >= 'a' && *k <= 'z') || *k == '_'))
    return false;
  for (const char *p = k + 1; *p; p++)
    if (!((*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '_'))
      return false;
  return true;
}

int moat_spec_check_env(json_t *env, moat_error **err) {
  if (!env)
    return 0;
  if (!json_is_object(env))
    return moat_error_set(err, EINVAL, "env: must be an object of strings");
  const char *k;
  json_t *v;
  json_object_foreach(env, k, v) {
    if (!env_name_ok(k))
      return moat_error_set(err, EINVAL, "env: invalid variable name '%s'", k);
    if (!json_is_string(v))
      return moat_error_set(err, EINVAL, "env.%s: must be a string", k);
    if (strlen(json_string_value(v)) != json_string_length(v))
      return moat_error_set(err, EINVAL, "env.%s: contains a NUL byte", k);
  }
  return 0;
}

static int check_u64(const char *field, uint64_t *v, uint64_t def, uint64_t min, uint64_t max, uint64_t host,
                     const char *host_what, moat_error **err) {
  if (*v == 0) {
    *v = def < host ? def : host;
    if (*v < min)
      return moat_error_set(err, EINVAL, "%s: the host's %s (%llu MiB) is below the minimum %llu", field,
                            host_what, (unsigned long long)host, (unsigned long long)min);
    return 0;
  }
  if (*v < min || *v > max)
    return moat_error_set(err, EINVAL, "%s: must be between %llu and %llu", field, (unsigned long long)min,
                          (unsigned long long)max);
  if (*v > host)
    return moat_error_set(err, EINVAL, "%s: %llu exceeds the host's %s (%llu MiB)", field,
                          (unsigned long long)*v, host_what, (unsigned long long)host);
  return 0;
}

uint64_t moat_spec_host_pids(uint64_t pid_max, uint64_t threads_max) {
  uint64_t m = pid_max < threads_max ? pid_max : threads_max;
  return m / 4 < MOAT_MIN_PIDS ? MOAT_MIN_PIDS : m / 4;
}

int moat_spec_resolve(const struct moat_sandbox_spec *spec, const struct moat_spec_bounds *b,
                      struct moat_limits *limits, int64_t *ttl_seconds, moat_error **err) {
  int64_t ttl = spec->ttl_seconds ? spec->ttl_seconds : MOAT_DEFAULT_TTL_S;
  if (ttl < 1 || ttl > MOAT_MAX_TTL_S)
    return moat_error_set(err, EINVAL, "ttl_seconds: must be between 1 and %lld", (long long)MOAT_MAX_TTL_S);
  struct moat_limits l = spec->limits;
  if (l.cpu == 0)
    l.cpu = MOAT_DEFAULT_CPU;
  if (!isfinite(l.cpu) || l.cpu < MOAT_MIN_CPU || l.cpu > MOAT_MAX_CPU)
    return moat_error_set(err, EINVAL, "cpu: must be between %g and %g", MOAT_MIN_CPU, MOAT_MAX_CPU);
  if (check_u64("memory_mb", &l.memory_mb, MOAT_DEFAULT_MEMORY_MB, MOAT_MIN_MEMORY_MB, MOAT_MAX_MEMORY_MB,
                b->host_memory_mb, "memory", err) < 0 ||
      check_u64("disk_mb", &l.disk_mb, MOAT_DEFAULT_DISK_MB, MOAT_MIN_DISK_MB, MOAT_MAX_DISK_MB,
                b->disk_fs_mb, "data filesystem size", err) < 0)
    return -1;
  if (l.pids == 0)
    l.pids = b->host_pids && b->host_pids < MOAT_DEFAULT_PIDS ? b->host_pids : MOAT_DEFAULT_PIDS;
  if (l.pids < MOAT_MIN_PIDS || l.pids > MOAT_MAX_PIDS)
    return moat_error_set(err, EINVAL, "pids: must be between %d and %d", MOAT_MIN_PIDS, MOAT_MAX_PIDS);
  if (b->host_pids && l.pids > b->host_pids)
    return moat_error_set(err, EINVAL,
                          "pids: %llu exceeds this host's limit for one sandbox, %llu (a quarter of "
                          "kernel.pid_max or kernel.threads-max)",
                          (unsigned long long)l.pids, (unsigned long long)b->host_pids);
  if (moat_spec_check_metadata(spec->metadata, err) < 0 || moat_spec_check_env(spec->env, err) < 0)
    return -1;
  *limits = l;
  *ttl_seconds = ttl;
  return 0;
}

char **moat_env_merge(json_t *base, char *const *over) {
  size_t n_over = strv_len(over);
  size_t cap = (base ? json_object_size(base) : 0) + n_over + 1;
  char **v = xcalloc(cap, sizeof(char *));
  size_t n = 0;
  if (base && json_is_object(base)) {
    /* Key order, so the result does not depend on jansson's hash order. */
    size_t nk = json_object_size(base), i = 0;
    const char **keys = xcalloc(nk ? nk : 1, sizeof(char *));
    const char *k;
    json_t *val;
    json_object_foreach(base, k, val) keys[i++] = k;
    for (size_t a = 1; a < nk; a++)
      for (size_t c = a; c > 0 && strcmp(keys[c - 1], keys[c]) > 0; c--) {
        const char *t = keys[c];
        keys[c] = keys[c - 1];
        keys[c - 1] = t;
      }
    for (i = 0; i < nk; i++) {
      size_t klen = strlen(keys[i]);
      bool replaced = false;
      for (size_t j = 0; j < n_over && !replaced; j++)
        replaced = strncmp(over[j], keys[i], klen) == 0 && over[j][klen] == '=';
      json_t *s = json_object_get(base, keys[i]);
      if (replaced || !json_is_string(s))
        continue;
      v[n++] = xasprintf("%s=%s", keys[i], json_string_value(s));
    }
    free(keys);
  }
  for (size_t j = 0; j < n_over; j++)
    v[n++] = xstrdup(over[j]);
  v[n] = NULL;
  return v;
}

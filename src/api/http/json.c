/* json.c -- request body parsing and validation, and the JSON the API answers with (pure) */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http.h"

int api_body_parse(const char *buf, size_t len, bool empty_ok, json_t **out, moat_error **err) {
  size_t i = 0;
  while (i < len && (buf[i] == ' ' || buf[i] == '\t' || buf[i] == '\r' || buf[i] == '\n'))
    i++;
  if (i == len) {
    if (!empty_ok)
      return moat_error_set(err, EINVAL, "request body is empty: a JSON object is required");
    *out = json_object();
    return 0;
  }
  json_error_t je;
  json_t *j = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &je);
  if (!j)
    return moat_error_set(err, EBADMSG, "invalid JSON: %s (line %d, column %d, position %d)", je.text,
                          je.line, je.column, je.position);
  if (!json_is_object(j)) {
    json_decref(j);
    return moat_error_set(err, EINVAL, "request body must be a JSON object");
  }
  *out = j;
  return 0;
}

/* ---- field helpers: each names the field in its error ---- */

static int want_int(json_t *v, const char *name, long long lo, long long hi, long long *out,
                    moat_error **err) {
  if (!json_is_integer(v))
    return moat_error_set(err, EINVAL, "field '%s' must be an integer", name);
  long long x = json_integer_value(v);
  if (x < lo || x > hi)
    return moat_error_set(err, EINVAL, "field '%s' must be from %lld to %lld", name, lo, hi);
  *out = x;
  return 0;
}

static int want_bool(json_t *v, const char *name, bool *out, moat_error **err) {
  if (!json_is_boolean(v))
    return moat_error_set(err, EINVAL, "field '%s' must be a boolean", name);
  *out = json_is_true(v);
  return 0;
}

static int want_string(json_t *v, const char *name, size_t maxlen, const char **out, moat_error **err) {
  if (!json_is_string(v))
    return moat_error_set(err, EINVAL, "field '%s' must be a string", name);
  size_t n = json_string_length(v);
  const char *s = json_string_value(v);
  if (n == 0)
    return moat_error_set(err, EINVAL, "field '%s' must not be empty", name);
  if (n > maxlen)
    return moat_error_set(err, EINVAL, "field '%s' is longer than %zu bytes", name, maxlen);
  if (strlen(s) != n)
    return moat_error_set(err, EINVAL, "field '%s' contains a NUL byte", name);
  *out = s;
  return 0;
}

bool api_valid_env_name(const char *s) {
  if (!((s[0] >= 'A' && s[0] <= 'Z') || (s[0] >= 'a' && s[0] <= 'z') || s[0] == '_'))
    return false;
  for (size_t i = 1; s[i]; i++) {
    char c = s[i];
    if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_'))
      return false;
  }
  return true;
}

int api_check_path(const char *what, const char *p, size_t len, moat_error **err) {
  if (len == 0)
    return moat_error_set(err, EINVAL, "'%s' must not be empty", what);
  if (strnlen(p, len) != len)
    return moat_error_set(err, EINVAL, "'%s' contains a NUL byte", what);
  if (len > API_MAX_PATH)
    return moat_error_set(err, EINVAL, "'%s' is longer than %d bytes", what, API_MAX_PATH);
  return 0;
}

int api_check_user(const char *what, const char *u, moat_error **err) {
  size_t n = strlen(u);
  if (n == 0 || n > API_MAX_USER)
    return moat_error_set(err, EINVAL, "'%s' must be 1 to %d characters", what, API_MAX_USER);
  if (u[0] == '-')
    return moat_error_set(err, EINVAL, "'%s' must not start with '-'", what);
  for (size_t i = 0; i < n; i++) {
    char c = u[i];
    if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' ||
          c == '-' || c == '.'))
      return moat_error_set(err, EINVAL, "'%s' may hold only letters, digits, '.', '_' and '-'", what);
  }
  return 0;
}

/* An object of string -> string. kind "metadata": <= 64 keys, key 1..128 bytes, value <= 1024.
 * kind "env": names [A-Za-z_][A-Za-z0-9_]*. */
static int want_string_map(json_t *v, const char *name, bool env, moat_error **err) {
  if (!json_is_object(v))
    return moat_error_set(err, EINVAL, "field '%s' must be an object of strings", name);
  size_t max_keys = env ? API_MAX_ENV_KEYS : API_MAX_META_KEYS;
  size_t max_key = env ? API_MAX_ENV_KEY : API_MAX_META_KEY;
  size_t max_val = env ? API_MAX_ENV_VALUE : API_MAX_META_VALUE;
  if (json_object_size(v) > max_keys)
    return moat_error_set(err, EINVAL, "field '%s' has more than %zu keys", name, max_keys);
  const char *k;
  json_t *x;
  json_object_foreach(v, k, x) {
    size_t kl = strlen(k);
    if (kl == 0 || kl > max_key)
      return moat_error_set(err, EINVAL, "field '%s': keys must be 1 to %zu bytes", name, max_key);
    if (env && !api_valid_env_name(k))
      return moat_error_set(err, EINVAL, "field '%s': '%.64s' is not a valid variable name", name, k);
    if (!json_is_string(x))
      return moat_error_set(err, EINVAL, "field '%s.%.64s' must be a string", name, k);
    size_t vl = json_string_length(x);
    if (vl > max_val)
      return moat_error_set(err, EINVAL, "field '%s.%.64s' is longer than %zu bytes", name, k, max_val);
    if (strlen(json_string_value(x)) != vl)
      return moat_error_set(err, EINVAL, "field '%s.%.64s' contains a NUL byte", name, k);
  }
  return 0;
}

/* Rejects a field of a later issue (501) or an unknown one (400). */
static int unknown_field(const char *k, const char *const *later, moat_error **err) {
  for (size_t i = 0; later && later[i]; i++)
    if (strcmp(k, later[i]) == 0)
      return moat_error_set(err, ENOSYS, "field '%s' is not supported yet", k);
  return moat_error_set(err, EINVAL, "unknown field '%.128s'", k);
}

int api_parse_database_create(json_t *body, struct moat_database_spec *spec, moat_error **err) {
  memset(spec, 0, sizeof(*spec));
  const char *k;
  json_t *v;
  long long x;
  json_object_foreach(body, k, v) {
    if (strcmp(k, "name") == 0) {
      if (want_string(v, k, 63, &spec->name, err) < 0)
        return -1;
    } else if (strcmp(k, "size_mb") == 0) {
      if (want_int(v, k, MOAT_DB_MIN_SIZE_MB, (long long)MOAT_MAX_DISK_MB, &x, err) < 0)
        return -1;
      spec->size_mb = (uint64_t)x;
    } else if (strcmp(k, "idle_seconds") == 0) {
      if (want_int(v, k, 1, MOAT_DB_MAX_IDLE_S, &x, err) < 0)
        return -1;
      spec->idle_seconds = x;
    } else if (strcmp(k, "metadata") == 0) {
      if (want_string_map(v, k, false, err) < 0)
        return -1;
      spec->metadata = v;
    } else {
      return moat_error_set(err, EINVAL, "unknown field '%.128s' (name, size_mb, idle_seconds, metadata)", k);
    }
  }
  if (!spec->name)
    return moat_error_set(err, EINVAL, "field 'name' is required");
  if (!moat_database_name_valid(spec->name))
    return moat_error_set(err, EINVAL, "field 'name' must match ^[a-z0-9][a-z0-9_-]{0,62}$");
  return 0;
}

int api_parse_create(json_t *body, uint64_t host_memory_mb, struct moat_sandbox_spec *spec,
                     moat_error **err) {
  static const char *const later[] = {NULL};
  memset(spec, 0, sizeof(*spec));
  uint64_t max_mem = MOAT_MAX_MEMORY_MB;
  if (host_memory_mb > 0 && host_memory_mb < max_mem)
    max_mem = host_memory_mb;
  const char *k;
  json_t *v;
  long long x;
  json_object_foreach(body, k, v) {
    if (strcmp(k, "template") == 0) {
      if (want_string(v, k, 63, &spec->template_name, err) < 0)
        return -1;
    } else if (strcmp(k, "ttl_seconds") == 0) {
      if (want_int(v, k, 1, MOAT_MAX_TTL_S, &x, err) < 0)
        return -1;
      spec->ttl_seconds = x;
    } else if (strcmp(k, "persistent") == 0) {
      if (want_bool(v, k, &spec->persistent, err) < 0)
        return -1;
    } else if (strcmp(k, "metadata") == 0) {
      if (want_string_map(v, k, false, err) < 0)
        return -1;
      spec->metadata = v;
    } else if (strcmp(k, "env") == 0) {
      if (want_string_map(v, k, true, err) < 0)
        return -1;
      spec->env = v;
    } else if (strcmp(k, "cpu") == 0) {
      if (!json_is_number(v))
        return moat_error_set(err, EINVAL, "field 'cpu' must be a number");
      double c = json_number_value(v);
      if (!isfinite(c) || c < MOAT_MIN_CPU || c > MOAT_MAX_CPU)
        return moat_error_set(err, EINVAL, "field 'cpu' must be from %g to %g", MOAT_MIN_CPU, MOAT_MAX_CPU);
      spec->limits.cpu = c;
    } else if (strcmp(k, "memory_mb") == 0) {
      if (want_int(v, k, MOAT_MIN_MEMORY_MB, (long long)max_mem, &x, err) < 0)
        return -1;
      spec->limits.memory_mb = (uint64_t)x;
    } else if (strcmp(k, "pids") == 0) {
      if (want_int(v, k, MOAT_MIN_PIDS, MOAT_MAX_PIDS, &x, err) < 0)
        return -1;
      spec->limits.pids = (uint64_t)x;
    } else if (strcmp(k, "disk_mb") == 0) {
      if (want_int(v, k, MOAT_MIN_DISK_MB, (long long)MOAT_MAX_DISK_MB, &x, err) < 0)
        return -1;
      spec->limits.disk_mb = (uint64_t)x;
    } else if (strcmp(k, "from_snapshot") == 0) {
      if (json_is_null(v))
        continue;
      if (want_string(v, k, 63, &spec->from_snapshot, err) < 0)
        return -1;
    } else if (strcmp(k, "idle") == 0) {
      /* idle: {hibernate_after_seconds} (persistent sandboxes; control checks that) */
      if (json_is_null(v))
        continue;
      if (!json_is_object(v))
        return moat_error_set(err, EINVAL, "field 'idle' must be an object {hibernate_after_seconds}");
      const char *ik;
      json_t *iv;
      json_object_foreach(v, ik, iv) {
        if (strcmp(ik, "hibernate_after_seconds") != 0)
          return moat_error_set(err, EINVAL,
                                "unknown field 'idle.%.64s' (idle accepts hibernate_after_seconds)", ik);
        if (want_int(iv, "idle.hibernate_after_seconds", 1, MOAT_MAX_TTL_S, &x, err) < 0)
          return -1;
        spec->hibernate_after_seconds = x;
      }
    } else if (strcmp(k, "volumes") == 0) {
      /* [{name, path, read_only}]: control checks names and paths (control/volumes.c) */
      if (json_is_null(v))
        continue;
      if (!json_is_array(v))
        return moat_error_set(err, EINVAL, "field 'volumes' must be an array of {name, path, read_only}");
      if (json_array_size(v) > MOAT_MAX_SANDBOX_VOLUMES)
        return moat_error_set(err, EINVAL, "field 'volumes' holds more than %d entries",
                              MOAT_MAX_SANDBOX_VOLUMES);
      size_t i;
      json_t *ent;
      json_array_foreach(v, i, ent) {
        struct moat_volume_mount *m = &spec->volumes[i];
        if (!json_is_object(ent))
          return moat_error_set(err, EINVAL, "volumes[%zu] must be an object {name, path, read_only}", i);
        const char *vk;
        json_t *vv;
        json_object_foreach(ent, vk, vv) {
          char what[48];
          snprintf(what, sizeof(what), "volumes[%zu].%s", i, strcmp(vk, "name") == 0 ? "name" : "path");
          if (strcmp(vk, "name") == 0 || strcmp(vk, "path") == 0) {
            if (want_string(vv, what, strcmp(vk, "name") == 0 ? 63 : 1024,
                            strcmp(vk, "name") == 0 ? &m->name : &m->path, err) < 0)
              return -1;
          } else if (strcmp(vk, "read_only") == 0) {
            if (want_bool(vv, "read_only", &m->read_only, err) < 0)
              return -1;
          } else {
            return moat_error_set(err, EINVAL, "unknown field 'volumes[%zu].%.64s' (name, path, read_only)",
                                  i, vk);
          }
        }
        if (!m->name || !m->path)
          return moat_error_set(err, EINVAL, "volumes[%zu] needs a name and a path", i);
      }
      spec->n_volumes = json_array_size(v);
    } else if (strcmp(k, "databases") == 0) {
      /* [{id, env}]: control checks the ids are org's databases (control/databases.c) */
      if (json_is_null(v))
        continue;
      if (!json_is_array(v))
        return moat_error_set(err, EINVAL, "field 'databases' must be an array of {id, env}");
      if (json_array_size(v) > MOAT_MAX_SANDBOX_DATABASES)
        return moat_error_set(err, EINVAL, "field 'databases' holds more than %d entries",
                              MOAT_MAX_SANDBOX_DATABASES);
      size_t i;
      json_t *ent;
      json_array_foreach(v, i, ent) {
        struct moat_database_attach *a = &spec->databases[i];
        if (!json_is_object(ent))
          return moat_error_set(err, EINVAL, "databases[%zu] must be an object {id, env}", i);
        const char *dk;
        json_t *dv;
        json_object_foreach(ent, dk, dv) {
          char what[48];
          snprintf(what, sizeof(what), "databases[%zu].%s", i, strcmp(dk, "id") == 0 ? "id" : "env");
          if (strcmp(dk, "id") == 0 || strcmp(dk, "env") == 0) {
            if (want_string(dv, what, strcmp(dk, "id") == 0 ? MOAT_DB_ID_LEN : API_MAX_ENV_KEY,
                            strcmp(dk, "id") == 0 ? &a->id : &a->env, err) < 0)
              return -1;
          } else {
            return moat_error_set(err, EINVAL, "unknown field 'databases[%zu].%.64s' (id, env)", i, dk);
          }
        }
        if (!a->id)
          return moat_error_set(err, EINVAL, "databases[%zu] needs an id", i);
        if (!a->env)
          a->env = "DATABASE_URL";
        if (!api_valid_env_name(a->env))
          return moat_error_set(err, EINVAL, "databases[%zu].env: '%.64s' is not a valid variable name", i,
                                a->env);
        for (size_t j = 0; j < i; j++)
          if (strcmp(spec->databases[j].env, a->env) == 0)
            return moat_error_set(err, EINVAL, "databases[%zu].env: %.64s is set twice", i, a->env);
      }
      spec->n_databases = json_array_size(v);
    } else if (strcmp(k, "network") == 0) {
      /* {internet, egress, allow, deny}: control checks the entries (control/network.c) */
      if (json_is_null(v))
        continue;
      if (!json_is_object(v))
        return moat_error_set(err, EINVAL,
                              "field 'network' must be an object {internet, egress, allow, deny}");
      spec->network = v;
    } else {
      return unknown_field(k, later, err);
    }
  }
  return 0;
}

int api_parse_patch(json_t *body, struct moat_sandbox_patch *patch, moat_error **err) {
  memset(patch, 0, sizeof(*patch));
  const char *k;
  json_t *v;
  long long x;
  json_object_foreach(body, k, v) {
    if (strcmp(k, "ttl_seconds") == 0) {
      if (want_int(v, k, 1, MOAT_MAX_TTL_S, &x, err) < 0)
        return -1;
      patch->has_ttl = true;
      patch->ttl_seconds = x;
    } else if (strcmp(k, "persistent") == 0) {
      if (want_bool(v, k, &patch->persistent, err) < 0)
        return -1;
      patch->has_persistent = true;
    } else if (strcmp(k, "metadata") == 0) {
      if (want_string_map(v, k, false, err) < 0)
        return -1;
      patch->metadata = v;
    } else {
      return moat_error_set(err, EINVAL,
                            "unknown field '%.128s' (PATCH accepts ttl_seconds, persistent, metadata)", k);
    }
  }
  return 0;
}

void api_exec_req_clear(struct moat_exec_req *req) {
  strv_free(req->argv);
  strv_free(req->env);
  free((void *)req->stdin_data);
  memset(req, 0, sizeof(*req));
}

static char **json_to_argv(json_t *v, moat_error **err) {
  if (!json_is_array(v) || json_array_size(v) == 0)
    return moat_error_set(err, EINVAL, "field 'argv' must be a non-empty array of strings"), NULL;
  size_t n = json_array_size(v);
  if (n > API_MAX_ARGV)
    return moat_error_set(err, EINVAL, "field 'argv' has more than %d entries", API_MAX_ARGV), NULL;
  char **argv = xcalloc(n + 1, sizeof(char *));
  for (size_t i = 0; i < n; i++) {
    json_t *a = json_array_get(v, i);
    if (!json_is_string(a) || strlen(json_string_value(a)) != json_string_length(a) ||
        (i == 0 && json_string_length(a) == 0)) {
      strv_free(argv);
      moat_error_set(err, EINVAL, "field 'argv[%zu]' must be a%s string without NUL bytes", i,
                     i == 0 ? " non-empty" : "");
      return NULL;
    }
    argv[i] = xstrdup(json_string_value(a));
  }
  return argv;
}

/* pty: {cols, rows}, each 1..API_MAX_PTY. */
static int want_pty(json_t *v, uint32_t *cols, uint32_t *rows, moat_error **err) {
  long long x;
  const char *k;
  json_t *f;
  if (!json_is_object(v))
    return moat_error_set(err, EINVAL, "field 'pty' must be an object {\"cols\": N, \"rows\": M}");
  *cols = *rows = 0;
  json_object_foreach(v, k, f) {
    if (strcmp(k, "cols") == 0) {
      if (want_int(f, "pty.cols", 1, API_MAX_PTY, &x, err) < 0)
        return -1;
      *cols = (uint32_t)x;
    } else if (strcmp(k, "rows") == 0) {
      if (want_int(f, "pty.rows", 1, API_MAX_PTY, &x, err) < 0)
        return -1;
      *rows = (uint32_t)x;
    } else {
      return moat_error_set(err, EINVAL, "unknown field 'pty.%.128s'", k);
    }
  }
  if (*cols == 0)
    *cols = 80;
  if (*rows == 0)
    *rows = 24;
  return 0;
}

/* One of the issue-3 exec fields, when allow admits it: 1 handled, 0 not one of them, -1 bad. */
static int exec_extra(const char *k, json_t *v, unsigned allow, struct api_exec_extra *x, moat_error **err) {
  if (allow == 0)
    return 0;
  if (strcmp(k, "background") == 0 && (allow & API_EXEC_BACKGROUND))
    return want_bool(v, k, &x->background, err) < 0 ? -1 : 1;
  if (strcmp(k, "kill_on_disconnect") == 0 && (allow & API_EXEC_STREAM))
    return want_bool(v, k, &x->kill_on_disconnect, err) < 0 ? -1 : 1;
  if (strcmp(k, "tag") == 0) {
    if (!json_is_string(v) || !api_valid_tag(json_string_value(v)) ||
        strlen(json_string_value(v)) != json_string_length(v))
      return moat_error_set(err, EINVAL, "field 'tag' must match [A-Za-z0-9_.-]{1,64} and not be all digits");
    x->tag = json_string_value(v);
    return 1;
  }
  if (strcmp(k, "pty") == 0)
    return want_pty(v, &x->pty_cols, &x->pty_rows, err) < 0 ? -1 : 1;
  return 0;
}

int api_parse_exec(json_t *body, struct moat_exec_req *req, moat_error **err) {
  return api_parse_exec_ex(body, 0, req, NULL, err);
}

int api_parse_exec_ex(json_t *body, unsigned allow, struct moat_exec_req *req, struct api_exec_extra *x,
                      moat_error **err) {
  memset(req, 0, sizeof(*req));
  if (x)
    memset(x, 0, sizeof(*x));
  json_t *cmd = NULL, *argv = NULL, *stdin_s = NULL, *stdin_b = NULL;
  const char *k;
  json_t *v;
  long long ms;
  json_object_foreach(body, k, v) {
    if (strcmp(k, "cmd") == 0) {
      const char *s;
      if (want_string(v, k, API_MAX_BODY, &s, err) < 0)
        goto fail;
      cmd = v;
    } else if (strcmp(k, "argv") == 0) {
      argv = v;
    } else if (strcmp(k, "env") == 0) {
      if (want_string_map(v, k, true, err) < 0)
        goto fail;
      size_t n = json_object_size(v), i = 0;
      req->env = xcalloc(n + 1, sizeof(char *));
      const char *ek;
      json_t *ev;
      json_object_foreach(v, ek, ev) req->env[i++] = xasprintf("%s=%s", ek, json_string_value(ev));
    } else if (strcmp(k, "cwd") == 0) {
      if (want_string(v, k, API_MAX_PATH, &req->cwd, err) < 0)
        goto fail;
    } else if (strcmp(k, "user") == 0) {
      if (!json_is_string(v)) {
        moat_error_set(err, EINVAL, "field 'user' must be a string");
        goto fail;
      }
      if (api_check_user("user", json_string_value(v), err) < 0)
        goto fail;
      req->user = json_string_value(v);
    } else if (strcmp(k, "stdin") == 0) {
      if (!json_is_string(v)) {
        moat_error_set(err, EINVAL, "field 'stdin' must be a string (use stdin_b64 for bytes)");
        goto fail;
      }
      stdin_s = v;
    } else if (strcmp(k, "stdin_b64") == 0) {
      if (!json_is_string(v)) {
        moat_error_set(err, EINVAL, "field 'stdin_b64' must be a base64 string");
        goto fail;
      }
      stdin_b = v;
    } else if (strcmp(k, "timeout_ms") == 0) {
      if (want_int(v, k, 1, API_MAX_TIMEOUT_MS, &ms, err) < 0)
        goto fail;
      req->timeout_ms = (uint32_t)ms;
    } else {
      int rc = exec_extra(k, v, allow, x, err);
      if (rc < 0)
        goto fail;
      if (rc == 0) {
        unknown_field(k, NULL, err);
        goto fail;
      }
    }
  }
  if ((allow & API_EXEC_BACKGROUND) && !x->background && (x->tag || x->pty_cols)) {
    moat_error_set(err, EINVAL,
                   "fields 'tag' and 'pty' of exec need 'background': true (or use exec/stream)");
    goto fail;
  }
  if ((cmd != NULL) == (argv != NULL)) {
    moat_error_set(err, EINVAL, "exactly one of fields 'cmd' and 'argv' is required");
    goto fail;
  }
  if (cmd) {
    req->argv = xcalloc(4, sizeof(char *));
    req->argv[0] = xstrdup("/bin/sh");
    req->argv[1] = xstrdup("-c");
    req->argv[2] = xstrdup(json_string_value(cmd));
  } else if (!(req->argv = json_to_argv(argv, err))) {
    goto fail;
  }
  if (stdin_s && stdin_b) {
    moat_error_set(err, EINVAL, "fields 'stdin' and 'stdin_b64' exclude each other");
    goto fail;
  }
  if (stdin_s) {
    size_t n = json_string_length(stdin_s);
    void *d = xmalloc(n + 1);
    memcpy(d, json_string_value(stdin_s), n);
    req->stdin_data = d;
    req->stdin_len = n;
  } else if (stdin_b) {
    unsigned char *d;
    size_t n;
    if (moat_base64_decode(json_string_value(stdin_b), json_string_length(stdin_b), &d, &n) < 0) {
      moat_error_set(err, EINVAL, "field 'stdin_b64' is not valid base64");
      goto fail;
    }
    req->stdin_data = d;
    req->stdin_len = n;
  }
  return 0;
fail:
  api_exec_req_clear(req);
  return -1;
}

static int want_path_field(json_t *body, const char *name, const char **out, moat_error **err) {
  json_t *v = json_object_get(body, name);
  if (!v)
    return moat_error_set(err, EINVAL, "field '%s' is required", name);
  if (!json_is_string(v))
    return moat_error_set(err, EINVAL, "field '%s' must be a string", name);
  if (api_check_path(name, json_string_value(v), json_string_length(v), err) < 0)
    return -1;
  *out = json_string_value(v);
  return 0;
}

static int body_user(json_t *body, const char *query_user, const char **out, moat_error **err) {
  json_t *v = json_object_get(body, "user");
  *out = query_user;
  if (!v)
    return 0;
  if (!json_is_string(v))
    return moat_error_set(err, EINVAL, "field 'user' must be a string");
  if (api_check_user("user", json_string_value(v), err) < 0)
    return -1;
  if (query_user && strcmp(query_user, json_string_value(v)) != 0)
    return moat_error_set(err, EINVAL, "'user' given in both query and body with different values");
  *out = json_string_value(v);
  return 0;
}

static int only_fields(json_t *body, const char *const *known, moat_error **err) {
  const char *k;
  json_t *v;
  json_object_foreach(body, k, v) {
    bool ok = false;
    for (size_t i = 0; known[i]; i++)
      if (strcmp(k, known[i]) == 0)
        ok = true;
    if (!ok)
      return unknown_field(k, NULL, err);
  }
  return 0;
}

int api_parse_mkdir(json_t *body, const char *query_user, struct api_mkdir_req *out, moat_error **err) {
  static const char *const known[] = {"path", "parents", "user", NULL};
  memset(out, 0, sizeof(*out));
  out->parents = true;
  if (only_fields(body, known, err) < 0 || want_path_field(body, "path", &out->path, err) < 0 ||
      body_user(body, query_user, &out->user, err) < 0)
    return -1;
  json_t *p = json_object_get(body, "parents");
  if (p && want_bool(p, "parents", &out->parents, err) < 0)
    return -1;
  return 0;
}

int api_parse_move(json_t *body, const char *query_user, struct api_move_req *out, moat_error **err) {
  static const char *const known[] = {"from", "to", "user", NULL};
  memset(out, 0, sizeof(*out));
  if (only_fields(body, known, err) < 0 || want_path_field(body, "from", &out->from, err) < 0 ||
      want_path_field(body, "to", &out->to, err) < 0 || body_user(body, query_user, &out->user, err) < 0)
    return -1;
  return 0;
}

/* ---- output ---- */

json_t *api_error_json(const char *code, const char *message) {
  size_t n = strlen(message);
  /* Messages can quote client input or guest paths: keep them valid UTF-8. */
  char *m = api_utf8_sanitize(message, n, &n, NULL);
  json_t *j = json_pack("{s:s, s:s%}", "code", code, "message", m, n);
  free(m);
  return j;
}

/* Sets NAME (UTF-8, repaired) and, when the bytes were not valid UTF-8, NAME_b64. */
static void set_stream(json_t *o, const char *name, const char *buf, size_t len) {
  size_t n;
  bool valid;
  char *s = api_utf8_sanitize(buf ? buf : "", buf ? len : 0, &n, &valid);
  json_object_set_new(o, name, json_stringn_nocheck(s, n));
  free(s);
  if (!valid) {
    char key[32];
    size_t bl;
    char *b = moat_base64_encode(buf, len, &bl);
    snprintf(key, sizeof(key), "%s_b64", name);
    json_object_set_new(o, key, json_stringn_nocheck(b, bl));
    free(b);
  }
}

json_t *api_exec_result_json(const struct moat_exec_result *res) {
  json_t *o = json_object();
  set_stream(o, "stdout", res->out, res->out_len);
  set_stream(o, "stderr", res->err, res->err_len);
  json_object_set_new(o, "exit_code", json_integer(res->exit_code));
  json_object_set_new(o, "signal", json_integer(res->signal));
  json_object_set_new(o, "duration_ms", json_integer((json_int_t)res->duration_ms));
  json_object_set_new(o, "timed_out", json_boolean(res->timed_out));
  json_object_set_new(o, "oom_killed", json_boolean(res->oom_killed));
  json_object_set_new(o, "truncated", json_boolean(res->stdout_truncated || res->stderr_truncated));
  json_object_set_new(o, "stdout_truncated", json_boolean(res->stdout_truncated));
  json_object_set_new(o, "stderr_truncated", json_boolean(res->stderr_truncated));
  json_object_set_new(o, "pid", json_integer(res->pid));
  return o;
}

const char *api_file_type_name(char t) {
  switch (t) {
  case 'f':
    return "file";
  case 'd':
    return "dir";
  case 'l':
    return "symlink";
  default:
    return "other";
  }
}

json_t *api_str_json(const char *s) {
  if (!s)
    return json_null();
  size_t n;
  char *u = api_utf8_sanitize(s, strlen(s), &n, NULL);
  json_t *j = json_stringn_nocheck(u, n);
  free(u);
  return j;
}

json_t *api_file_entry_json(const struct moat_file_entry *e) {
  char mode[16];
  snprintf(mode, sizeof(mode), "%04o", (unsigned)(e->mode & 07777));
  json_t *o = json_object();
  json_object_set_new(o, "name", api_str_json(e->name ? e->name : ""));
  json_object_set_new(o, "path", api_str_json(e->path ? e->path : ""));
  json_object_set_new(o, "type", json_string(api_file_type_name(e->type)));
  json_object_set_new(o, "size", json_integer((json_int_t)e->size));
  json_object_set_new(o, "mode", json_string(mode));
  json_object_set_new(o, "mtime", api_time_json(e->mtime_ms, false));
  json_object_set_new(o, "uid", json_integer(e->uid));
  json_object_set_new(o, "gid", json_integer(e->gid));
  json_object_set_new(o, "symlink_target", api_str_json(e->link_target));
  return o;
}

json_t *api_proc_info_json(const struct moat_proc_info *p) {
  json_t *argv = json_array();
  size_t len = 0;
  for (size_t i = 0; p->argv && p->argv[i]; i++) {
    json_array_append_new(argv, api_str_json(p->argv[i]));
    len += strlen(p->argv[i]) + 1;
  }
  /* cmd: argv joined by spaces, for display (not quoted: argv is the exact form) */
  char *cmd = xmalloc(len + 1);
  size_t o = 0;
  for (size_t i = 0; p->argv && p->argv[i]; i++) {
    if (i)
      cmd[o++] = ' ';
    size_t n = strlen(p->argv[i]);
    memcpy(cmd + o, p->argv[i], n);
    o += n;
  }
  cmd[o] = '\0';
  json_t *j = json_object();
  json_object_set_new(j, "pid", json_integer(p->pid));
  json_object_set_new(j, "tag", api_str_json(p->tag));
  json_object_set_new(j, "cmd", api_str_json(cmd));
  free(cmd);
  json_object_set_new(j, "argv", argv);
  json_object_set_new(j, "started_at", api_time_json(p->started_at_ms, true));
  json_object_set_new(j, "running", json_boolean(p->running));
  json_object_set_new(j, "exit_code", p->running ? json_null() : json_integer(p->exit_code));
  json_object_set_new(j, "signal", p->running ? json_null() : json_integer(p->signal));
  json_object_set_new(j, "pty", json_boolean(p->pty));
  json_object_set_new(j, "background", json_boolean(p->background));
  return j;
}

json_t *api_sandbox_json(const struct moat_sandbox_info *s) {
  json_t *o = json_object();
  json_object_set_new(o, "id", json_string(s->id));
  json_object_set_new(o, "template", json_string(s->template_name ? s->template_name : ""));
  json_object_set_new(o, "state", json_string(moat_sandbox_state_name(s->state)));
  json_object_set_new(o, "created_at", api_time_json(s->created_at_ms, false));
  json_object_set_new(o, "expires_at", s->persistent ? json_null() : api_time_json(s->expires_at_ms, true));
  json_object_set_new(o, "ttl_seconds", json_integer(s->ttl_seconds));
  json_object_set_new(o, "persistent", json_boolean(s->persistent));
  json_object_set_new(o, "metadata", s->metadata ? json_incref(s->metadata) : json_object());
  json_object_set_new(o, "cpu", json_real(s->limits.cpu));
  json_object_set_new(o, "memory_mb", json_integer((json_int_t)s->limits.memory_mb));
  json_object_set_new(o, "pids", json_integer((json_int_t)s->limits.pids));
  json_object_set_new(o, "disk_mb", json_integer((json_int_t)s->limits.disk_mb));
  json_object_set_new(o, "ready_us", json_integer((json_int_t)s->ready_us));
  json_object_set_new(o, "killed_reason", s->killed_reason ? json_string(s->killed_reason) : json_null());
  json_object_set_new(o, "killed_at", api_time_json(s->killed_at_ms, true));
  /* time travel */
  json_object_set_new(o, "paused_at", api_time_json(s->paused_at_ms, true));
  json_object_set_new(o, "forked_from", s->forked_from ? json_string(s->forked_from) : json_null());
  json_object_set_new(o, "from_snapshot", s->from_snapshot ? json_string(s->from_snapshot) : json_null());
  json_object_set_new(o, "idle",
                      s->hibernate_after_seconds > 0 ? json_pack("{s:I}", "hibernate_after_seconds",
                                                                 (json_int_t)s->hibernate_after_seconds)
                                                     : json_null());
  json_t *vols = json_array();
  for (size_t i = 0; i < s->n_volumes; i++)
    json_array_append_new(vols, json_pack("{s:s, s:s, s:b}", "name", s->volumes[i].name, "path",
                                          s->volumes[i].path, "read_only", s->volumes[i].read_only));
  json_object_set_new(o, "volumes", vols);
  return o;
}

json_t *api_database_json(struct api_req *r, const struct moat_database_info *d) {
  struct moat_control *c = api_control(r);
  bool secret = !api_req_readonly(r);
  char *url = moat_control_database_url(c, d);
  json_t *conn = json_pack("{s:s, s:I, s:s, s:s, s:s, s:s}", "host", moat_control_db_host(c), "port",
                           (json_int_t)moat_control_db_port(c), "user", d->role, "password", d->password,
                           "database", d->database, "url", url);
  free(url);
  if (!secret) {
    json_object_set_new(conn, "password", json_null());
    json_object_set_new(conn, "url", json_null());
  }
  /* how a sandbox reaches it (null: this moatd gives sandboxes no network, nothing in one does) */
  char *sandbox_url = moat_control_database_sandbox_url(c, d);
  json_object_set_new(conn, "sandbox_url", sandbox_url && secret ? json_string(sandbox_url) : json_null());
  free(sandbox_url);
  json_t *o = json_object();
  json_object_set_new(o, "id", json_string(d->id));
  json_object_set_new(o, "name", json_string(d->name));
  json_object_set_new(o, "state", json_string(d->state));
  json_object_set_new(o, "size_mb", json_integer((json_int_t)d->size_mb));
  json_object_set_new(o, "idle_seconds", json_integer((json_int_t)d->idle_seconds));
  json_object_set_new(o, "metadata", json_deep_copy(d->metadata));
  json_object_set_new(o, "created_at", api_time_json(d->created_at_ms, false));
  json_object_set_new(o, "volume", json_string(d->volume));
  json_object_set_new(o, "sandbox_id", d->sandbox_id ? json_string(d->sandbox_id) : json_null());
  json_object_set_new(o, "connections", json_integer(d->connections));
  json_object_set_new(o, "connection", conn);
  return o;
}

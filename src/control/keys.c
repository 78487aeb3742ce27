/* keys.c -- API keys: the data dir's key file, `moatd key create`, auth (a key -> its org and role),
 * and the keys an org manages over the API. A key is "moat_" + 64 hex digits; the store keeps only
 * its SHA-256. "e2b_" + the same hex digits is the same key (E2B's SDKs accept only that shape). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../common/log.h"
#include "../common/sha256.h"
#include "../common/util.h"
#include "../store/store.h"
#include "control.h"
#include "control_internal.h"

#define KEY_TOUCH_MS 60000 /* last_used_at is recorded at most this often */

static const char *const role_names[] = {
    [MOAT_ROLE_ADMIN] = "admin",
    [MOAT_ROLE_MEMBER] = "member",
    [MOAT_ROLE_READONLY] = "readonly",
    [MOAT_ROLE_PLATFORM] = "platform",
};

int moat_key_role_parse(const char *s, enum moat_key_role *role) {
  for (size_t i = 0; s && i < MOAT_ROLE_PLATFORM; i++)
    if (strcmp(s, role_names[i]) == 0) {
      *role = (enum moat_key_role)i;
      return 0;
    }
  return -1;
}

const char *moat_key_role_name(enum moat_key_role role) {
  return (size_t)role < ARRAY_SIZE(role_names) ? role_names[role] : "readonly";
}

bool moat_key_name_valid(const char *name) {
  size_t n = 0;
  for (; name[n]; n++)
    if ((unsigned char)name[n] < 0x20 || (unsigned char)name[n] > 0x7e)
      return false;
  return n >= 1 && n <= MOAT_KEY_NAME_MAX;
}

bool moat_key_id_valid(const char *id) {
  if (strncmp(id, "key-", 4) != 0)
    return false;
  size_t n = 4;
  for (; id[n]; n++)
    if (!((id[n] >= 'a' && id[n] <= 'z') || (id[n] >= '0' && id[n] <= '9')))
      return false;
  return n == MOAT_KEY_ID_LEN;
}

static char *new_key(void) {
  uint8_t raw[32];
  random_bytes(raw, sizeof(raw));
  char *k = xmalloc(5 + 64 + 1);
  memcpy(k, "moat_", 5);
  for (size_t i = 0; i < sizeof(raw); i++)
    snprintf(k + 5 + 2 * i, 3, "%02x", raw[i]);
  return k;
}

static void new_key_id(char id[MOAT_KEY_ID_LEN + 1]) {
  memcpy(id, "key-", 4);
  random_id(id + 4, MOAT_KEY_ID_LEN - 4);
}

/* 64 lowercase hex digits and nothing else: the secret part of a key new_key makes. */
static bool is_key_hex(const char *s) {
  size_t n = 0;
  for (; s[n]; n++)
    if (!((s[n] >= '0' && s[n] <= '9') || (s[n] >= 'a' && s[n] <= 'f')))
      return false;
  return n == 64;
}

static void trim(char *s) {
  size_t n = strlen(s);
  while (n > 0 && (s[n - 1] == '\n' || s[n - 1] == '\r' || s[n - 1] == ' ' || s[n - 1] == '\t'))
    s[--n] = '\0';
}

static void key_hash(const char *key, char hash[2 * MOAT_SHA256_LEN + 1]) {
  moat_sha256_hex(key, strlen(key), hash);
}

static void info_from_store(const struct moat_store_key *k, struct moat_key_info *out) {
  memset(out, 0, sizeof(*out));
  snprintf(out->id, sizeof(out->id), "%s", k->id ? k->id : "");
  snprintf(out->org, sizeof(out->org), "%s", k->org ? k->org : "");
  snprintf(out->name, sizeof(out->name), "%s", k->name ? k->name : "");
  /* a role this binary does not know (a newer one wrote it) gets the least */
  if (k->role && strcmp(k->role, "platform") == 0 && k->org && strcmp(k->org, MOAT_PLATFORM_ORG) == 0)
    out->role = MOAT_ROLE_PLATFORM;
  else if (moat_key_role_parse(k->role, &out->role) < 0)
    out->role = MOAT_ROLE_READONLY;
  out->created_at_ms = k->created_at_ms;
  out->expires_at_ms = k->expires_at_ms;
  out->last_used_at_ms = k->last_used_at_ms;
}

int ctl_ensure_api_key(struct moat_control *c, moat_error **err) {
  _cleanup_free_ char *path = xasprintf("%s/%s", c->data_dir, API_KEY_FILE);
  _cleanup_free_ char *key = NULL;
  moat_error *e = NULL;
  if (read_file(path, &key, NULL, &e) == 0) {
    trim(key);
    if (strlen(key) < 16)
      return moat_error_set(err, EINVAL, "%s: not an API key; remove it to have a new one made", path);
  } else if (e->status != ENOENT) {
    if (err && !*err)
      *err = e;
    else
      moat_error_free(&e);
    return -1;
  } else {
    moat_error_free(&e);
    key = new_key();
    _cleanup_free_ char *line = xasprintf("%s\n", key);
    if (write_file_once(path, line, 0600, err) < 0)
      return -1;
    log_info("wrote a new API key to %s", path);
  }
  char hash[2 * MOAT_SHA256_LEN + 1];
  key_hash(key, hash);
  if (moat_store_key_add(c->store, DEFAULT_ORG, hash, err) < 0)
    return moat_error_wrap(err, "register %s", path);
  return 0;
}

int moat_control_key_create(const char *data_dir, const char *org, const char *name, const char *role,
                            char **key, moat_error **err) {
  enum moat_key_role rl;
  if (!org || !*org || strlen(org) > MOAT_ORG_MAX)
    return moat_error_set(err, EINVAL, "org: must be 1 to %d bytes", MOAT_ORG_MAX);
  if (!name)
    name = "default";
  if (!moat_key_name_valid(name))
    return moat_error_set(err, EINVAL, "name: must be 1 to %d bytes of printable ASCII", MOAT_KEY_NAME_MAX);
  if (!role)
    role = "admin";
  /* the platform admin's key (--admin) is the only one of the reserved org */
  bool platform = strcmp(role, "platform") == 0;
  if (platform != (strcmp(org, MOAT_PLATFORM_ORG) == 0))
    return moat_error_set(err, EINVAL, "org %s is reserved for the platform admin key (--admin)",
                          MOAT_PLATFORM_ORG);
  if (platform)
    rl = MOAT_ROLE_PLATFORM;
  else if (moat_key_role_parse(role, &rl) < 0)
    return moat_error_set(err, EINVAL, "role: must be admin, member or readonly");
  _cleanup_free_ char *db = xasprintf("%s/moat.db", data_dir);
  struct moat_store *s;
  if (moat_store_open(&s, db, err) < 0)
    return -1;
  _cleanup_free_ char *k = new_key();
  char hash[2 * MOAT_SHA256_LEN + 1], id[MOAT_KEY_ID_LEN + 1];
  key_hash(k, hash);
  new_key_id(id);
  struct moat_store_key row = {
      .id = id, .org = (char *)org, .name = (char *)name, .role = (char *)moat_key_role_name(rl)};
  int rc = moat_store_key_insert(s, &row, hash, err);
  moat_store_close(s);
  if (rc < 0)
    return -1;
  *key = steal_pointer(&k);
  return 0;
}

char *moat_control_key_e2b_form(const char *key) {
  if (strncmp(key, "moat_", 5) != 0 || !is_key_hex(key + 5))
    return NULL;
  return xasprintf("e2b_%s", key + 5);
}

int moat_control_auth_key(struct moat_control *c, const char *api_key, struct moat_key_info *out,
                          moat_error **err) {
  if (!api_key || !*api_key || strlen(api_key) > 512)
    return moat_error_set(err, EACCES, "missing or invalid API key");
  /* "e2b_" + the hex of a moat key is that key: the store holds only the moat form's hash. */
  char alias[5 + 64 + 1];
  if (strncmp(api_key, "e2b_", 4) == 0 && is_key_hex(api_key + 4)) {
    snprintf(alias, sizeof(alias), "moat_%s", api_key + 4);
    api_key = alias;
  }
  char hash[2 * MOAT_SHA256_LEN + 1];
  key_hash(api_key, hash);
  moat_error *e2 = NULL;
  struct moat_store_key k = {0};
  if (moat_store_key_get(c->store, hash, &k, &e2) < 0) {
    int st = e2->status;
    moat_error_free(&e2);
    if (st == ENOENT)
      return moat_error_set(err, EACCES, "invalid API key");
    return moat_error_set(err, st, "look up API key: store error");
  }
  info_from_store(&k, out);
  moat_store_key_clear(&k);
  int64_t now = now_unix_ms();
  if (out->expires_at_ms > 0 && now >= out->expires_at_ms) {
    char when[32];
    time_t t = (time_t)(out->expires_at_ms / 1000);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", &tm);
    return moat_error_set(err, EKEYEXPIRED, "the API key %s expired at %s", out->id, when);
  }
  if (now - out->last_used_at_ms >= KEY_TOUCH_MS) {
    if (moat_store_key_touch(c->store, out->id, now, &e2) < 0) {
      log_warn("record the use of key %s: %s", out->id, moat_error_msg(e2));
      moat_error_free(&e2);
    } else {
      out->last_used_at_ms = now;
    }
  }
  return 0;
}

int moat_control_auth(struct moat_control *c, const char *api_key, char **org, moat_error **err) {
  struct moat_key_info k;
  if (moat_control_auth_key(c, api_key, &k, err) < 0)
    return -1;
  *org = xstrdup(k.org);
  return 0;
}

int moat_control_keys_create(struct moat_control *c, const char *org, const char *name,
                             enum moat_key_role role, int64_t expires_at_ms, struct moat_key_info *out,
                             char **secret, moat_error **err) {
  if (!name || !moat_key_name_valid(name))
    return moat_error_set(err, EINVAL, "field 'name' must be 1 to %d bytes of printable ASCII",
                          MOAT_KEY_NAME_MAX);
  int64_t now = now_unix_ms();
  if (expires_at_ms < 0 || (expires_at_ms > 0 && expires_at_ms <= now))
    return moat_error_set(err, EINVAL, "field 'expires_at' must be a time in the future");
  _cleanup_free_ char *k = new_key();
  char hash[2 * MOAT_SHA256_LEN + 1], id[MOAT_KEY_ID_LEN + 1];
  key_hash(k, hash);
  new_key_id(id);
  struct moat_store_key row = {.id = id,
                               .org = (char *)org,
                               .name = (char *)name,
                               .role = (char *)moat_key_role_name(role),
                               .created_at_ms = now,
                               .expires_at_ms = expires_at_ms};
  if (moat_store_key_insert(c->store, &row, hash, err) < 0)
    return -1;
  info_from_store(&row, out);
  *secret = steal_pointer(&k);
  return 0;
}

int moat_control_keys_list(struct moat_control *c, const char *org, struct moat_key_info **out, size_t *n,
                           moat_error **err) {
  struct moat_store_key *v = NULL;
  size_t m = 0;
  if (moat_store_key_list(c->store, org, &v, &m, err) < 0)
    return -1;
  *out = xcalloc(m ? m : 1, sizeof(**out));
  for (size_t i = 0; i < m; i++)
    info_from_store(&v[i], &(*out)[i]);
  *n = m;
  moat_store_keys_free(v, m);
  return 0;
}

int moat_control_keys_delete(struct moat_control *c, const char *org, const char *id, moat_error **err) {
  if (!moat_key_id_valid(id))
    return moat_error_set(err, ENOENT, "no API key '%.64s'", id);
  if (moat_store_key_delete(c->store, org, id, err) < 0)
    return -1;
  ctl_keys_revoked(c);
  return 0;
}

void ctl_keys_revoked(struct moat_control *c) { __atomic_add_fetch(&c->keys_gen, 1, __ATOMIC_SEQ_CST); }

uint64_t moat_control_keys_gen(const struct moat_control *c) {
  return __atomic_load_n(&c->keys_gen, __ATOMIC_SEQ_CST);
}

int moat_control_key_alive(struct moat_control *c, const char *id, moat_error **err) {
  return moat_store_key_exists(c->store, id, err);
}

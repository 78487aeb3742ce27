/* sessions.c -- the dashboard's sign-in sessions (sessions.h) */
#include "sessions.h"

#include <openssl/crypto.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "../../common/util.h"

struct ui_session {
  char token[UI_TOKEN_HEX + 1];
  char *key;
  int64_t expires_ms;
};

struct ui_sessions {
  pthread_mutex_t lock; /* guards the rest */
  struct ui_session *v;
  size_t n, cap;
};

struct ui_sessions *ui_sessions_new(size_t cap) {
  struct ui_sessions *t = xcalloc(1, sizeof(*t));
  pthread_mutex_init(&t->lock, NULL);
  t->cap = cap ? cap : 1;
  t->v = xcalloc(t->cap, sizeof(*t->v));
  return t;
}

static void session_clear(struct ui_session *x) {
  if (x->key) {
    explicit_bzero(x->key, strlen(x->key));
    free(x->key);
  }
  explicit_bzero(x, sizeof(*x));
}

void ui_sessions_free(struct ui_sessions *t) {
  if (!t)
    return;
  for (size_t i = 0; i < t->n; i++)
    session_clear(&t->v[i]);
  free(t->v);
  pthread_mutex_destroy(&t->lock);
  free(t);
}

/* Index of token's session (lock held), or -1. The comparison takes the same time wherever the
 * tokens differ. */
static ssize_t find_locked(const struct ui_sessions *t, const char *token) {
  if (!token || strnlen(token, UI_TOKEN_HEX + 1) != UI_TOKEN_HEX)
    return -1;
  for (size_t i = 0; i < t->n; i++)
    if (CRYPTO_memcmp(t->v[i].token, token, UI_TOKEN_HEX) == 0)
      return (ssize_t)i;
  return -1;
}

static void drop_locked(struct ui_sessions *t, size_t i) {
  session_clear(&t->v[i]);
  t->v[i] = t->v[--t->n];
  memset(&t->v[t->n], 0, sizeof(t->v[0]));
}

/* Ends expired sessions and, at the cap, the one closest to expiring (lock held). */
static void prune_locked(struct ui_sessions *t, int64_t now) {
  for (size_t i = 0; i < t->n;)
    if (t->v[i].expires_ms <= now)
      drop_locked(t, i);
    else
      i++;
  if (t->n < t->cap)
    return;
  size_t soonest = 0;
  for (size_t i = 1; i < t->n; i++)
    if (t->v[i].expires_ms < t->v[soonest].expires_ms)
      soonest = i;
  drop_locked(t, soonest);
}

void ui_sessions_add(struct ui_sessions *t, const char *key, int64_t expires_ms, int64_t now_ms,
                     char token[UI_TOKEN_HEX + 1]) {
  struct ui_session x = {.key = xstrdup(key), .expires_ms = expires_ms};
  uint8_t raw[UI_TOKEN_HEX / 2];
  random_bytes(raw, sizeof(raw));
  for (size_t i = 0; i < sizeof(raw); i++)
    snprintf(x.token + 2 * i, 3, "%02x", raw[i]);
  explicit_bzero(raw, sizeof(raw));
  memcpy(token, x.token, UI_TOKEN_HEX + 1);
  pthread_mutex_lock(&t->lock);
  prune_locked(t, now_ms);
  t->v[t->n++] = x;
  pthread_mutex_unlock(&t->lock);
}

char *ui_sessions_key(struct ui_sessions *t, const char *token, int64_t now_ms, int64_t *expires_ms) {
  char *key = NULL;
  pthread_mutex_lock(&t->lock);
  ssize_t i = find_locked(t, token);
  if (i >= 0 && t->v[i].expires_ms <= now_ms) {
    drop_locked(t, (size_t)i);
    i = -1;
  }
  if (i >= 0) {
    key = xstrdup(t->v[i].key);
    if (expires_ms)
      *expires_ms = t->v[i].expires_ms;
  }
  pthread_mutex_unlock(&t->lock);
  return key;
}

void ui_sessions_end(struct ui_sessions *t, const char *token) {
  pthread_mutex_lock(&t->lock);
  ssize_t i = find_locked(t, token);
  if (i >= 0)
    drop_locked(t, (size_t)i);
  pthread_mutex_unlock(&t->lock);
}

size_t ui_sessions_count(struct ui_sessions *t) {
  pthread_mutex_lock(&t->lock);
  size_t n = t->n;
  pthread_mutex_unlock(&t->lock);
  return n;
}

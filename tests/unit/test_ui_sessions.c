/* test_ui_sessions.c -- the dashboard's session table: a token stands for its key until its expiry and
 * not after, unknown, truncated and extended tokens stand for nothing, an ended session is gone, tokens
 * are distinct 64-hex-digit strings, and at the cap the session closest to expiring is the one ended
 * (expired ones first); many threads adding, reading and ending at once keep the count bounded */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/ui/sessions.h"
#include "tap.h"

static bool is_hex64(const char *s) {
  if (strlen(s) != UI_TOKEN_HEX)
    return false;
  for (const char *p = s; *p; p++)
    if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
      return false;
  return true;
}

static bool key_is(struct ui_sessions *t, const char *tok, int64_t now, const char *want) {
  char *k = ui_sessions_key(t, tok, now, NULL);
  bool ok = want ? k && strcmp(k, want) == 0 : k == NULL;
  free(k);
  return ok;
}

#define THREADS 8
#define ROUNDS 2000
static void *churn(void *arg) {
  struct ui_sessions *t = arg;
  for (int i = 0; i < ROUNDS; i++) {
    char tok[UI_TOKEN_HEX + 1];
    ui_sessions_add(t, "moat_churn", 1000 + i, i, tok);
    char *k = ui_sessions_key(t, tok, i, NULL);
    free(k);
    if (i % 3 == 0)
      ui_sessions_end(t, tok);
  }
  return NULL;
}

int main(void) {
  struct ui_sessions *t = ui_sessions_new(4);
  char a[UI_TOKEN_HEX + 1], b[UI_TOKEN_HEX + 1];
  ui_sessions_add(t, "moat_a", 1000, 0, a);
  ui_sessions_add(t, "moat_b", 2000, 0, b);
  OK(is_hex64(a) && is_hex64(b), "tokens are 64 lowercase hex digits");
  OK(strcmp(a, b) != 0, "two sessions, two tokens");
  OK(key_is(t, a, 999, "moat_a"), "a token stands for its key before its expiry");
  int64_t exp = 0;
  char *k = ui_sessions_key(t, b, 10, &exp);
  OK(k && exp == 2000, "and says its expiry (%lld)", (long long)exp);
  free(k);
  OK(key_is(t, a, 1000, NULL), "not at its expiry");
  OK(ui_sessions_count(t) == 1, "the expired session was ended when read (%zu left)", ui_sessions_count(t));
  OK(key_is(t, a, 0, NULL), "and stays ended for an earlier clock");

  char bad[UI_TOKEN_HEX + 2];
  memcpy(bad, b, UI_TOKEN_HEX + 1);
  bad[UI_TOKEN_HEX - 1] = '\0';
  OK(key_is(t, bad, 10, NULL), "a truncated token stands for nothing");
  memcpy(bad, b, UI_TOKEN_HEX);
  bad[UI_TOKEN_HEX] = '0';
  bad[UI_TOKEN_HEX + 1] = '\0';
  OK(key_is(t, bad, 10, NULL), "nor one with a digit more");
  memcpy(bad, b, UI_TOKEN_HEX + 1);
  bad[0] = bad[0] == 'a' ? 'b' : 'a';
  OK(key_is(t, bad, 10, NULL), "nor one differing in a digit");
  OK(key_is(t, "", 10, NULL) && key_is(t, NULL, 10, NULL), "nor an empty or absent one");
  ui_sessions_end(t, bad);
  OK(key_is(t, b, 10, "moat_b"), "ending an unknown token ends nothing");
  ui_sessions_end(t, b);
  OK(key_is(t, b, 10, NULL) && ui_sessions_count(t) == 0, "an ended session is gone");

  /* the cap: 4. Expiries 500, 300, 400, 600; a fifth ends the one expiring at 300 */
  char c[4][UI_TOKEN_HEX + 1], d[UI_TOKEN_HEX + 1];
  const int64_t when[4] = {500, 300, 400, 600};
  for (int i = 0; i < 4; i++) {
    char key[16];
    snprintf(key, sizeof(key), "moat_c%d", i);
    ui_sessions_add(t, key, when[i], 0, c[i]);
  }
  ui_sessions_add(t, "moat_d", 700, 0, d);
  OK(ui_sessions_count(t) == 4, "at the cap the table stays at 4");
  OK(key_is(t, c[1], 1, NULL), "the session closest to expiring was ended");
  OK(key_is(t, c[0], 1, "moat_c0") && key_is(t, c[2], 1, "moat_c2") && key_is(t, c[3], 1, "moat_c3") &&
         key_is(t, d, 1, "moat_d"),
     "the others stand");
  /* at 450 the one expiring at 400 is expired: adding ends it, not a live one */
  char e[UI_TOKEN_HEX + 1];
  ui_sessions_add(t, "moat_e", 800, 450, e);
  OK(key_is(t, c[0], 451, "moat_c0") && key_is(t, e, 451, "moat_e"),
     "an expired session goes before a live one");
  OK(key_is(t, c[2], 451, NULL), "(the expired one)");
  ui_sessions_free(t);

  struct ui_sessions *m = ui_sessions_new(64);
  pthread_t th[THREADS];
  for (int i = 0; i < THREADS; i++)
    pthread_create(&th[i], NULL, churn, m);
  for (int i = 0; i < THREADS; i++)
    pthread_join(th[i], NULL);
  OK(ui_sessions_count(m) <= 64,
     "%d threads adding, reading and ending at once: %zu sessions, at most the cap", THREADS,
     ui_sessions_count(m));
  ui_sessions_free(m);
  return tap_done();
}

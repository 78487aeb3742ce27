/* sessions.h -- the dashboard's sign-in sessions: a table of opaque tokens each standing for an API
 * key until an expiry, bounded in size (at the cap, the session closest to expiring ends). Thread-safe
 * (one lock, a leaf). Keys are wiped from memory when their session ends. */
#ifndef MOAT_API_UI_SESSIONS_H
#define MOAT_API_UI_SESSIONS_H

#include <stddef.h>
#include <stdint.h>

#define UI_TOKEN_HEX 64 /* a token: 32 random bytes in lowercase hex */

struct ui_sessions;

struct ui_sessions *ui_sessions_new(size_t cap);
void ui_sessions_free(struct ui_sessions *t);

/* A new session for key until expires_ms: its token into token. Expired sessions (at now_ms) end
 * first; at the cap, the one closest to expiring. */
void ui_sessions_add(struct ui_sessions *t, const char *key, int64_t expires_ms, int64_t now_ms,
                     char token[UI_TOKEN_HEX + 1]);
/* The key token stands for at now_ms (caller frees, and should wipe) and, if expires_ms is not NULL,
 * its expiry; NULL when there is no such session or it expired (it then ends). */
char *ui_sessions_key(struct ui_sessions *t, const char *token, int64_t now_ms, int64_t *expires_ms);
/* Ends the session token, if there is one. */
void ui_sessions_end(struct ui_sessions *t, const char *token);
size_t ui_sessions_count(struct ui_sessions *t);

#endif

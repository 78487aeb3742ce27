/* ui.h -- the web dashboard's front end: its built assets under /ui/ and its sign-in sessions
 *
 * The assets are the files a manifest (DIR/MANIFEST, written at make time) names, read into memory when
 * moatd starts: a request is answered only with one of them, so no path reaches the file system. A
 * session is an opaque cookie (UI_COOKIE) that stands for an API key for a while: every request it
 * authenticates authenticates that key again, so a revoked or expired key ends its sessions.
 */
#ifndef MOAT_API_UI_H
#define MOAT_API_UI_H

#include <stdbool.h>

#include "../http/http.h"

#define UI_COOKIE "moat_ui"
#define UI_CSRF_HEADER "X-Moat-UI"   /* a mutation authenticated by the cookie must carry it, = "1" */
#define UI_SESSION_TTL_S (12 * 3600) /* a session's life (shorter when its key expires sooner) */
#define UI_MAX_SESSIONS 4096         /* beyond: the session closest to expiring is ended */

extern const struct api_front api_front_ui;

/* True when name may be a served asset: segments of [A-Za-z0-9._-] split by '/', none empty or
 * starting with '.', at most 200 bytes (so no "..", no absolute path, no hidden file). Pure. */
bool api_ui_asset_name_ok(const char *name);

/* The API key that session token stands for (caller frees, and should wipe), or NULL when there is no
 * such session or it expired. */
char *api_ui_session_key(const struct moat_api *a, const char *token);
/* Ends the session token (its key was refused). */
void api_ui_session_end(const struct moat_api *a, const char *token);

#endif

/* fair.h -- caps per org and per sandbox on requests in flight and streams open
 *
 * Every authenticated request holds a ticket from its start (auth) to its end: a "request", or a
 * "stream" for the long-lived ones (SSE event streams, exec/stream and attach, PTY WebSockets,
 * files/watch, upgraded connections through an exposed port, E2B's streaming RPCs). A ticket counts
 * against its org and, when the request names a sandbox, that sandbox; one over a cap is refused
 * with API_E_TOO_MANY (HTTP 429 too_many_requests) naming the cap and its moatd flag. A WebSocket
 * or upgraded connection takes its ticket along and gives it back when it closes.
 */
#ifndef MOAT_API_FAIR_H
#define MOAT_API_FAIR_H

#include <stdbool.h>

#include "../../common/error.h"

struct api_fair_config {
  unsigned requests_per_org, streams_per_org;         /* > 0 */
  unsigned requests_per_sandbox, streams_per_sandbox; /* > 0 */
};

/* The counters of every listener of one api (the API's and the proxy's). Tickets must all be given
 * back before api_fair_free. */
struct api_fair;
struct api_fair *api_fair_new(const struct api_fair_config *cfg);
void api_fair_free(struct api_fair *f);

struct api_ticket;

/* Admits one request (stream false) or stream of org, counted against sandbox too when it is not
 * NULL. Returns the ticket (give it back with api_fair_release) or NULL with *err (API_E_TOO_MANY,
 * the message naming the cap). */
struct api_ticket *api_fair_admit(struct api_fair *f, const char *org, const char *sandbox, bool stream,
                                  moat_error **err);
/* Turns an admitted request into a stream: it counts as a stream and no longer as a request. 0,
 * or -1 with *err as above (t is unchanged: still a request). A stream is left as it is. */
int api_fair_to_stream(struct api_ticket *t, moat_error **err);
/* Gives the ticket back (NULL: no-op). */
void api_fair_release(struct api_ticket *t);
/* The org's tag: one pointer per org for the api_fair's lifetime (for api_gate_attribute). */
const void *api_fair_org(const struct api_ticket *t);

#endif

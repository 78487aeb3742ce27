/* api.h -- the HTTP front end of moatd: v1 routes over libmicrohttpd, auth, validation, JSON errors */
#ifndef MOAT_API_H
#define MOAT_API_H

#include "../common/error.h"
#include "../control/control.h"

struct moat_api;

struct moat_api_config {
  const char *listen;       /* "HOST:PORT", HOST an IPv4/IPv6 literal or "localhost"; PORT 0 = any */
  unsigned conn_timeout_s;  /* idle connection timeout (slow clients); 0 = 60 */
  const char *version;      /* reported by /healthz */
};

/* Starts serving on cfg->listen with a thread per connection; returns 0 or -1 (EADDRINUSE, ...).
 * control is borrowed and must outlive the api. */
int moat_api_start(struct moat_api **out, struct moat_control *control, const struct moat_api_config *cfg,
                   moat_error **err);

/* The port actually bound (useful with PORT 0). */
unsigned moat_api_port(const struct moat_api *a);

/* Stops accepting, waits for in-flight requests, frees a. */
void moat_api_stop(struct moat_api *a);

#endif

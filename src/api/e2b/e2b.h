/* e2b.h -- the E2B front end as api.c registers it */
#ifndef MOAT_API_E2B_H
#define MOAT_API_E2B_H

#include "../http/http.h"

/* The E2B front end (e2b/): it claims every request that is its own (its control-plane paths, or a
 * sandbox call routed by the E2b-Sandbox-Id header or a "PORT-ID.DOMAIN" Host) before routing. */
extern const struct api_front api_front_e2b;

#endif

/* api.c -- moatd's HTTP API put together: the transport (http/) serving every front end's routes */
#include "api.h"

#include "e2b/e2b.h"
#include "http/http.h"
#include "mcp/mcp.h"
#include "ports/ports.h"
#include "v1/v1.h"

static const struct api_claimer *const claimers[] = {&api_e2b_claimer};

/* Every front end's routes, in the order moatd serves them (the first match wins). */
void api_front_ends(struct api_router *rt) {
  api_v1_routes(rt);
  api_mcp_routes(rt);
  api_ports_routes(rt);
}

int moat_api_start(struct moat_api **out, struct moat_control *control, const struct moat_api_config *cfg,
                   moat_error **err) {
  struct api_router *rt = api_router_new();
  api_front_ends(rt);
  return api_http_start(out, control, cfg, rt, claimers, sizeof(claimers) / sizeof(claimers[0]), err);
}

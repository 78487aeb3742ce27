/* api.c -- moatd's HTTP API put together: the transport (http/) serving every front end */
#include "api.h"

#include "e2b/e2b.h"
#include "http/http.h"
#include "mcp/mcp.h"
#include "pg/pg.h"
#include "ports/ports.h"
#include "ui/ui.h"
#include "v1/v1.h"

/* E2B claims its requests before any route is tried; then v1's, MCP's, the ports' and the
 * dashboard's routes. The
 * database proxy has no routes: a listener of its own. */
static const struct api_front *const fronts[] = {&api_front_e2b,   &api_front_v1, &api_front_mcp,
                                                 &api_front_ports, &api_front_pg, &api_front_ui};

void api_front_ends(struct api_router *rt) {
  for (size_t i = 0; i < ARRAY_SIZE(fronts); i++)
    if (fronts[i]->routes)
      fronts[i]->routes(rt);
}

int moat_api_start(struct moat_api **out, struct moat_control *control, const struct moat_api_config *cfg,
                   moat_error **err) {
  return api_http_start(out, control, cfg, fronts, ARRAY_SIZE(fronts), err);
}

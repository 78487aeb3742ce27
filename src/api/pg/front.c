/* front.c -- the database proxy as one of moatd's front ends: started with the api when
 * cfg->db_listen names an address, routing through control's databases */
#include <errno.h>
#include <stdlib.h>

#include "../../control/control.h"
#include "../http/http.h"
#include "pg.h"

struct pg_front {
  struct moat_pg_proxy *proxy;
  struct moat_control *control;
};

static int control_resolve(void *arg, const char *user, const char *database, char **org, char **id,
                           int timeout_ms, moat_error **err) {
  struct pg_front *f = arg;
  return moat_control_database_connect(f->control, user, database, org, id, timeout_ms, err);
}

static void control_conn_event(void *arg, const char *id, int delta) {
  struct pg_front *f = arg;
  moat_control_database_conn_event(f->control, id, delta);
}

static void pg_close(void *state) {
  struct pg_front *f = state;
  moat_pg_proxy_stop(f->proxy);
  free(f);
}

static int pg_open(struct moat_api *a, const struct moat_api_config *cfg, void **state, moat_error **err) {
  struct pg_front *f = xcalloc(1, sizeof(*f));
  f->control = api_control_of(a);
  if (cfg->db_listen) {
    struct moat_pg_config pc = {
        .listen = cfg->db_listen,
        .max_connections = cfg->db_max_connections,
        .max_conns_per_ip = cfg->db_max_conns_per_ip,
        .resolve = control_resolve,
        .conn_event = control_conn_event,
        .arg = f,
    };
    if (moat_pg_proxy_start(&f->proxy, &pc, err) < 0) {
      free(f);
      return moat_error_wrap(err, "--db-listen");
    }
  }
  *state = f;
  return 0;
}

const struct api_front api_front_pg = {.name = "database proxy", .open = pg_open, .close = pg_close};

unsigned moat_api_db_port(const struct moat_api *a) {
  struct pg_front *f = api_front_state(a, &api_front_pg);
  return f ? moat_pg_proxy_port(f->proxy) : 0;
}

/* front.c -- the database proxy as one of moatd's front ends: started with the api when
 * cfg->db_listen names an address, routing through control's databases; with sandbox networking
 * its scoped listener is the sandboxes' (control's in-sandbox listener), each client address
 * mapped to the org of the sandbox that holds it */
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>

#include "../../control/control.h"
#include "../http/http.h"
#include "pg.h"

struct pg_front {
  struct moat_pg_proxy *proxy;
  struct moat_control *control;
};

static int control_resolve(void *arg, const char *org, const char *user, const char *database, char **db_org,
                           char **id, int timeout_ms, moat_error **err) {
  struct pg_front *f = arg;
  return moat_control_database_connect(f->control, org, user, database, db_org, id, timeout_ms, err);
}

/* A client of the in-sandbox listener: the org of the sandbox whose address it connects from. */
static int control_origin(void *arg, const struct sockaddr *sa, unsigned sa_len, char **org, char **client) {
  struct pg_front *f = arg;
  if (sa->sa_family != AF_INET || sa_len < sizeof(struct sockaddr_in))
    return -1;
  const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
  return moat_control_sandbox_org_at(f->control, in->sin_addr.s_addr, org, client, NULL);
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
        .tls_cert = cfg->db_tls_cert,
        .tls_key = cfg->db_tls_key,
    };
    /* sandboxes reach the proxy on their network's service address (ENODEV: no sandbox networking,
     * no such listener: a sandbox has loopback only) */
    moat_error *e = NULL;
    int sfd = moat_control_database_listen_sandboxes(f->control, &e);
    if (sfd >= 0) {
      pc.origin = control_origin;
      pc.scoped_fd = sfd;
    } else if (e->status != ENODEV) {
      free(f);
      moat_error_wrap(&e, "--db-listen");
      if (err && !*err)
        *err = e;
      else
        moat_error_free(&e);
      return -1;
    }
    moat_error_free(&e);
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

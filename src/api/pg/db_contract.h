/* db_contract.h -- control's database calls the proxy routes through, declared weak until control
 * defines them (drop this header once control.h declares them)
 *
 * moat_control_database_connect returns a connected TCP fd to the PostgreSQL server of the
 * database a startup names by role or database (waking it if hibernated), setting *org_out and
 * *id_out (caller frees); -1 with *err ENOENT when there is none. moat_control_database_conn_event
 * is told +1 when a client connection is routed to database id and -1 when it closes. While no
 * definition is linked, both are NULL and the proxy answers every startup "no such database".
 */
#ifndef MOAT_API_PG_DB_CONTRACT_H
#define MOAT_API_PG_DB_CONTRACT_H

#include "../../common/error.h"
#include "../../control/control.h"

int moat_control_database_connect(struct moat_control *c, const char *role, const char *database,
                                  char **org_out, char **id_out, int timeout_ms, moat_error **err)
    __attribute__((weak));
void moat_control_database_conn_event(struct moat_control *c, const char *id, int delta)
    __attribute__((weak));

#endif

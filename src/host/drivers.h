/* drivers.h -- the isolation drivers built into moatd, for host.c's table (a new driver adds its
 * line here and in host.c) */
#ifndef MOAT_DRIVERS_H
#define MOAT_DRIVERS_H

#include "driver.h"

extern const struct moat_driver_ops moat_linux_driver; /* linux/: namespaces, cgroups, CRIU */

#endif

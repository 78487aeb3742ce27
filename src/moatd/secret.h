/* secret.h -- secrets moatd keeps in its data dir */
#ifndef MOAT_MOATD_SECRET_H
#define MOAT_MOATD_SECRET_H

#include <stdint.h>

#include "../common/error.h"

#define MOATD_SECRET_LEN 32

/* Reads the MOATD_SECRET_LEN random bytes of path, making the file (mode 0600, fsynced, linked into
 * place so two moatds never see different ones) when it is not there. 0 or -1. */
int moatd_secret_load(const char *path, uint8_t out[MOATD_SECRET_LEN], moat_error **err);

#endif

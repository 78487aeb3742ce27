/* version.h -- the version moatd and the moat CLI report */
#ifndef MOAT_VERSION_H
#define MOAT_VERSION_H

#define MOAT_VERSION "0.1.0"

#endif

/* crashpoint.h -- named points at which a test makes moatd die as a kill -9 would */
#ifndef MOAT_CRASHPOINT_H
#define MOAT_CRASHPOINT_H

/* When the environment variable MOAT_CRASH_AT lists name (comma-separated names, read once),
 * writes "crash point NAME" to stderr and kills the process with SIGKILL: nothing after the
 * point runs, as when moatd is killed there. Otherwise does nothing (one load and compare). The
 * points are for the crash tests (tests/integration/test_crash.py); an operator never sets it. */
void moat_crash_point(const char *name);

#endif

/* context_tar.h -- a build context directory as a tar stream (libarchive) */
#ifndef MOAT_CLI_CONTEXT_TAR_H
#define MOAT_CLI_CONTEXT_TAR_H

#include <stdint.h>
#include <stdio.h>

#include "cli.h"

struct cli_tar_stats {
  uint64_t files, bytes; /* regular files sent and their bytes */
};

/* Writes the directory dir as a tar (pax) to out: its files, directories and symbolic links (a link
 * is stored as a link, never followed; moatd refuses one leading out of the context), sorted by
 * name, without owners. Paths that dir's .dockerignore excludes are left out (one pattern a line,
 * '#' comments, '!' re-includes, the last matching line decides, a pattern matching a directory
 * excludes what lies beneath; "**" crosses directories), except dockerfile_rel (may be NULL) and
 * .dockerignore itself. When extra is given, its content is added as the regular file extra_name.
 * Returns 0, or -1 after printing why. */
int cli_context_tar(const char *dir, const char *dockerfile_rel, const char *extra_name, FILE *extra,
                    FILE *out, struct cli_tar_stats *stats);

#endif

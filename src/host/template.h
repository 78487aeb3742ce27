/* template.h -- templates: recipes in the repo (templates/NAME/) built into read-only root images
 *
 * A recipe directory holds:
 *   packages   Debian packages to add to debootstrap --variant=minbase bookworm (one per line, # comments)
 *   files/     a tree copied over the root image (owner root, modes kept)
 *   run        a shell script run with chroot inside the image after packages and files
 * A built template lives at TEMPLATE_DIR/NAME/rootfs, with TEMPLATE_DIR/NAME/ready written last
 * (its content: the recipe digest). Building happens in TEMPLATE_DIR/NAME.tmp-XXXX and is renamed
 * into place, so a crash mid-build leaves no half template behind.
 */
#ifndef MOAT_TEMPLATE_H
#define MOAT_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>

#include "../common/error.h"

enum moat_template_state {
  MOAT_TEMPLATE_MISSING = 0,
  MOAT_TEMPLATE_BUILDING,
  MOAT_TEMPLATE_READY,
  MOAT_TEMPLATE_FAILED
};

const char *moat_template_state_name(enum moat_template_state s);

struct moat_templates;

/* recipes_dir: the repo's templates/; template_dir: where images are built. */
int moat_templates_open(struct moat_templates **out, const char *recipes_dir, const char *template_dir,
                        moat_error **err);
void moat_templates_close(struct moat_templates *t);

/* True when NAME is a valid template name (^[a-z0-9][a-z0-9._-]{0,62}$) with a recipe. */
bool moat_template_exists(struct moat_templates *t, const char *name);

/* Ensures NAME is built: returns at once if ready; else builds it (or waits for the build another
 * thread started). Progress goes to moatd's log. Returns 0 or -1 (ENOENT: no such recipe). */
int moat_template_ensure(struct moat_templates *t, const char *name, moat_error **err);

struct moat_template_info {
  char *name;
  enum moat_template_state state;
  char *error;        /* last build error, or NULL */
  long long built_at; /* unix seconds, 0 if not built */
  unsigned long long size_bytes;
};
/* Lists every recipe with its state. Caller frees with moat_template_infos_free. */
int moat_template_list(struct moat_templates *t, struct moat_template_info **out, size_t *n,
                       moat_error **err);
void moat_template_infos_free(struct moat_template_info *v, size_t n);

/* Path of a built template's rootfs (caller frees), or NULL when not ready. */
char *moat_template_rootfs(struct moat_templates *t, const char *name);

#endif

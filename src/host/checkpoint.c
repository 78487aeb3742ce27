/* checkpoint.c -- checkpoint and restore of a running sandbox with CRIU (issue 4)
 *
 * Until CRIU is wired in, checkpoints are unavailable: both calls fail with ENOSYS. */
#include <errno.h>

#include "driver.h"

int moat_host_checkpoint(struct moat_host *h, int slot, const char *dir, bool leave_running,
                         struct moat_checkpoint_info *info, moat_error **err) {
  (void)h, (void)slot, (void)dir, (void)leave_running, (void)info;
  moat_error_set(err, ENOSYS, "checkpoints are not available on this host yet");
  return -1;
}

int moat_host_restore(struct moat_host *h, const char *dir, const char *template_name,
                      const struct moat_limits *limits, struct moat_instance *out, moat_error **err) {
  (void)h, (void)dir, (void)template_name, (void)limits, (void)out;
  moat_error_set(err, ENOSYS, "checkpoints are not available on this host yet");
  return -1;
}

const char *moat_host_criu_status(struct moat_host *h) {
  (void)h;
  return "checkpoints unavailable: CRIU is not wired in yet";
}

bool moat_host_can_checkpoint(struct moat_host *h) {
  (void)h;
  return false;
}

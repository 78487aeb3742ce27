/* export.c -- the linux driver's export_layer: a paused sandbox's writable layer copied out, with
 * the image's owners, for an image build (driver.h has the contract) */
#include <errno.h>

#include "../../common/util.h"
#include "layer_copy.h"
#include "linux_internal.h"

int moat_linux_export_layer(struct moat_host *h, int slot, int dst_dir, const char *name, moat_error **err) {
  struct moat_slot_view v;
  if (moat_linux_slot_view(moat_linux_of(h), slot, &v, err) < 0)
    return moat_error_wrap(err, "export layer");
  _cleanup_free_ char *slot_dir = v.slot_dir;
  _cleanup_free_ char *chan_dir = v.chan_dir;
  _cleanup_close_ int disk = v.disk_fd;
  /* A running sandbox could change the layer under the copy (and swap what was stat'ed). */
  if (!moat_cgroup_frozen(v.cgroups, slot))
    return moat_error_set(err, EBUSY, "export layer of slot %d: the sandbox is not paused", slot);
  if (disk < 0 && (disk = moat_linux_reattach_disk(slot_dir, v.disks_dir, slot, err)) < 0)
    return moat_error_wrap(err, "export layer of slot %d: find its writable layer", slot);
  if (moat_layer_export(disk, "upper", dst_dir, name, v.uid_base, NULL, err) < 0)
    return moat_error_wrap(err, "export layer of slot %d", slot);
  return 0;
}

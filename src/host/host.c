/* host.c -- the moat_host_* entry points: picks the driver at init and dispatches every call
 * through its ops table (driver.h) */
#include "driver.h"

#include <errno.h>
#include <string.h>

#include "../common/util.h"
#include "drivers.h"

/* Built-in drivers; the first is the default. */
static const struct moat_driver_ops *const drivers[] = {&moat_linux_driver};

int moat_host_init(struct moat_host **out, const struct moat_host_config *cfg, moat_error **err) {
  *out = NULL;
  const char *name = cfg->driver && cfg->driver[0] ? cfg->driver : drivers[0]->name;
  for (size_t i = 0; i < ARRAY_SIZE(drivers); i++) {
    if (strcmp(drivers[i]->name, name) != 0)
      continue;
    struct moat_host *h = NULL;
    if (drivers[i]->init(&h, cfg, err) < 0)
      return -1;
    h->ops = drivers[i];
    *out = h;
    return 0;
  }
  return moat_error_set(err, ENOENT, "no isolation driver named %s", name);
}

void moat_host_shutdown(struct moat_host *h) {
  if (h)
    h->ops->shutdown(h);
}

int moat_host_create(struct moat_host *h, const char *template_name, const struct moat_limits *limits,
                     struct moat_instance *out, moat_error **err) {
  return h->ops->create(h, template_name, limits, out, err);
}

int moat_host_destroy(struct moat_host *h, int slot, moat_error **err) {
  return h->ops->destroy(h, slot, err);
}

int moat_host_adopt(struct moat_host *h, int slot, pid_t pid, uint64_t start_time, struct moat_instance *out,
                    moat_error **err) {
  return h->ops->adopt(h, slot, pid, start_time, out, err);
}

int moat_host_reconcile(struct moat_host *h, moat_error **err) { return h->ops->reconcile(h, err); }

bool moat_host_alive(struct moat_host *h, int slot) { return h->ops->alive(h, slot); }

void moat_host_capacity(struct moat_host *h, struct moat_host_capacity *out) {
  memset(out, 0, sizeof(*out));
  h->ops->capacity(h, out);
}

int moat_host_usage(struct moat_host *h, int slot, struct moat_usage *out, moat_error **err) {
  return h->ops->usage(h, slot, out, err);
}

int moat_host_oom_kills(struct moat_host *h, int slot, uint64_t *out, moat_error **err) {
  if (h->ops->oom_kills)
    return h->ops->oom_kills(h, slot, out, err);
  struct moat_usage u;
  if (h->ops->usage(h, slot, &u, err) < 0)
    return -1;
  *out = u.oom_kills;
  return 0;
}

int moat_host_disk_usage(struct moat_host *h, int slot, struct moat_disk_usage *out, moat_error **err) {
  return h->ops->disk_usage(h, slot, out, err);
}

int moat_host_port_connect(struct moat_host *h, int slot, unsigned port, int timeout_ms, moat_error **err) {
  return h->ops->port_connect(h, slot, port, timeout_ms, err);
}

static int unsupported(struct moat_host *h, const char *what, moat_error **err) {
  return moat_error_set(err, ENOSYS, "the %s driver cannot %s", h->ops->name, what);
}

int moat_host_pause(struct moat_host *h, int slot, moat_error **err) {
  return h->ops->pause ? h->ops->pause(h, slot, err) : unsupported(h, "pause", err);
}

int moat_host_resume(struct moat_host *h, int slot, moat_error **err) {
  return h->ops->resume ? h->ops->resume(h, slot, err) : unsupported(h, "resume", err);
}

int moat_host_checkpoint(struct moat_host *h, int slot, const char *dir, bool leave_running,
                         struct moat_checkpoint_info *info, moat_error **err) {
  return h->ops->checkpoint ? h->ops->checkpoint(h, slot, dir, leave_running, info, err)
                            : unsupported(h, "checkpoint", err);
}

int moat_host_restore(struct moat_host *h, const char *dir, const char *template_name,
                      const struct moat_limits *limits, unsigned flags, struct moat_instance *out,
                      moat_error **err) {
  return h->ops->restore ? h->ops->restore(h, dir, template_name, limits, flags, out, err)
                         : unsupported(h, "restore", err);
}

int moat_host_checkpoint_volumes(struct moat_host *h, const char *dir, moat_error **err) {
  return h->ops->checkpoint_volumes ? h->ops->checkpoint_volumes(h, dir, err) : 0;
}

const char *moat_host_criu_status(struct moat_host *h) {
  return h->ops->checkpoint_status ? h->ops->checkpoint_status(h) : "this driver has no checkpoints";
}

bool moat_host_can_checkpoint(struct moat_host *h) {
  return h->ops->can_checkpoint && h->ops->checkpoint && h->ops->restore && h->ops->can_checkpoint(h);
}

struct moat_guest_channel *moat_host_guest_channel(struct moat_host *h) {
  return &h->guest_channel;
}

int moat_host_guest_sessions(struct moat_host *h, int slot) {
  return h->ops->guest_sessions ? h->ops->guest_sessions(h, slot) : -1;
}

struct moat_net *moat_host_net(struct moat_host *h) {
  return h->ops->net ? h->ops->net(h) : NULL;
}

int moat_host_net_slot(struct moat_host *h, int slot) {
  return h->ops->net_slot ? h->ops->net_slot(h, slot) : -1;
}

int moat_host_volume_create(struct moat_host *h, const char *vid, uint64_t size_mb, moat_error **err) {
  return h->ops->volume_create ? h->ops->volume_create(h, vid, size_mb, err)
                               : unsupported(h, "keep volumes", err);
}

int moat_host_volume_copy(struct moat_host *h, const char *src_vid, const char *dst_vid, moat_error **err) {
  return h->ops->volume_copy ? h->ops->volume_copy(h, src_vid, dst_vid, err)
                             : unsupported(h, "copy volumes", err);
}

int moat_host_volume_remove(struct moat_host *h, const char *vid, moat_error **err) {
  return h->ops->volume_remove ? h->ops->volume_remove(h, vid, err) : unsupported(h, "keep volumes", err);
}

int moat_host_volume_root(struct moat_host *h, const char *vid, moat_error **err) {
  return h->ops->volume_root ? h->ops->volume_root(h, vid, err) : unsupported(h, "keep volumes", err);
}

int moat_host_volume_attach(struct moat_host *h, int slot, const char *vid, const char *path, bool read_only,
                            moat_error **err) {
  return h->ops->volume_attach ? h->ops->volume_attach(h, slot, vid, path, read_only, err)
                               : unsupported(h, "keep volumes", err);
}

int moat_host_volume_usage(struct moat_host *h, const char *vid, struct moat_disk_usage *out,
                           moat_error **err) {
  return h->ops->volume_usage ? h->ops->volume_usage(h, vid, out, err) : unsupported(h, "keep volumes", err);
}

int moat_host_volume_gc(struct moat_host *h, const char *const *keep, size_t n, moat_error **err) {
  return h->ops->volume_gc ? h->ops->volume_gc(h, keep, n, err) : 0;
}

int moat_host_export_layer(struct moat_host *h, int slot, int dst_dir, const char *name, moat_error **err) {
  return h->ops->export_layer ? h->ops->export_layer(h, slot, dst_dir, name, err)
                              : unsupported(h, "export a writable layer", err);
}

bool moat_host_image_name(const char *name) {
  if (strlen(name) != 26 || (name[0] != 's' && name[0] != 'i') || name[1] != '-')
    return false;
  for (size_t i = 2; i < 26; i++)
    if (!((name[i] >= '0' && name[i] <= '9') || (name[i] >= 'a' && name[i] <= 'f')))
      return false;
  return true;
}

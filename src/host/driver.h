/* driver.h -- the isolation driver interface: what control/ may ask of a host, and the ops table
 * a driver implements to answer it
 *
 * A host owns a pool of slots. A slot is everything one sandbox needs on this host: a uid range,
 * a cgroup directory, a writable-layer disk, a guest channel. A running sandbox occupies one slot;
 * control/ remembers (sandbox id -> slot, init pid, generation) in the store and hands them back
 * to adopt or destroy after a restart.
 *
 * The moat_host_* functions below are the stable API control/ calls. Each one dispatches through
 * the ops table (struct moat_driver_ops, at the end) of the driver moat_host_init chose by name
 * (host.c); the linux driver (host/linux/) is the default. A driver lives in a folder of its own
 * beneath host/ and adds one line to host.c's table. Nothing above host/ knows which driver runs.
 *
 * Thread safety: every function may be called from any thread concurrently, except init and
 * shutdown.
 */
#ifndef MOAT_DRIVER_H
#define MOAT_DRIVER_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "../common/error.h"
#include "../proto/client/guest_client.h"

struct moat_host;
struct moat_net;
struct moat_net_config;

/* moat_host_config.lxcfs_dir's value for "find or start the machine's lxcfs" */
#define MOAT_HOST_LXCFS_AUTO "auto"

/* True for the name of an org's image ("s-" or "i-" and 24 hex digits): it lives in images_dir. */
bool moat_host_image_name(const char *name);

struct moat_host_config {
  const char *driver;                /* driver name ("linux"); NULL or "" = the first built in (linux) */
  const char *data_dir;              /* moatd's data dir; the host keeps slots/ and disks/ under it */
  const char *template_dir;          /* where built templates live: TEMPLATE_DIR/NAME/rootfs */
  const char *images_dir;            /* the images of orgs' templates, IMAGES_DIR/NAME/rootfs for a NAME
                                      * of moat_host_image_name's shape; NULL = template_dir */
  const char *guest_path;            /* host path of the static moat-guest binary */
  unsigned pool_size;                /* warm, never-used shells kept ready per pooled template; 0 = none */
  const char *pool_template;         /* template the pool prepares ("base") */
  unsigned max_slots;                /* highest slot count (uid ranges) this host hands out */
  const struct moat_net_config *net; /* sandbox networking (net/net.h); NULL or no uplink = loopback only */
  bool disk_overcommit; /* false: every sandbox's disk_mb is backed by the data dir (else ENOSPC) */
  /* an lxcfs mount whose proc/{meminfo,stat,uptime,loadavg} sandboxes see as their own (lxcfs
   * answers each reader from its cgroups); MOAT_HOST_LXCFS_AUTO = the driver finds or starts the
   * machine's (none found nor started: the machine's files); NULL = the machine's */
  const char *lxcfs_dir;
};

struct moat_limits {
  double cpu;         /* vCPUs (cfs quota = cpu * period) */
  uint64_t memory_mb; /* hard memory limit */
  uint64_t pids;      /* max processes */
  uint64_t disk_mb;   /* writable layer size; writes past it fail with ENOSPC */
};

/* What the host tells control about a running sandbox; control stores it to adopt later. */
struct moat_instance {
  int slot;                   /* slot index */
  pid_t pid;                  /* host pid of the sandbox's init (moat-guest) */
  uint64_t start_time;        /* init's start time (clock ticks after boot, /proc/PID/stat field 22):
                                 with pid it names the process across pid reuse */
  struct moat_guest_ep guest; /* the guest channel (guest_client.h) */
  uint64_t ready_ns;          /* how long create took inside the host, for metrics */
  bool from_pool;             /* a warm shell was used */
};

/* Sets up the host with the driver cfg->driver names: for the linux driver, finds or creates
 * moat's cgroup subtree beneath the cgroups moatd runs in and opens the slot table (the pool
 * filler and teardown worker start at moat_host_reconcile). Returns 0, or -1 (ENOENT: no driver
 * of that name). */
int moat_host_init(struct moat_host **out, const struct moat_host_config *cfg, moat_error **err);

/* Stops the pool filler and destroys warm, unassigned shells. Running sandboxes are left alone
 * (they outlive moatd and are adopted on the next start). Frees h. */
void moat_host_shutdown(struct moat_host *h);

/* Creates a running sandbox from a built template with the given limits. Uses a warm shell when
 * one matches (template and disk size); otherwise builds one on the request path. On failure
 * nothing is left behind. Returns 0 and fills out, or -1. */
int moat_host_create(struct moat_host *h, const char *template_name, const struct moat_limits *limits,
                     struct moat_instance *out, moat_error **err);

/* Kills every process of the sandbox in slot, releases its mounts, cgroups and disk, and frees
 * the slot for reuse (teardown may finish off the request path). Tolerates a sandbox that is
 * already dead or half built. Returns 0 or -1. */
int moat_host_destroy(struct moat_host *h, int slot, moat_error **err);

/* After a restart: takes back a slot recorded by control. Returns 1 when the sandbox's init is
 * still alive (same pid and start time) and fills out; 0 when it is gone (its leftovers are then
 * removed and the slot freed); -1 on error. */
int moat_host_adopt(struct moat_host *h, int slot, pid_t pid, uint64_t start_time, struct moat_instance *out,
                    moat_error **err);

/* After adopting: removes cgroups, disks, slot dirs and processes of every slot that was neither
 * adopted nor is pooled, then starts the host's worker threads (pool filler, teardown). Call once,
 * after all moat_host_adopt calls. A leftover that cannot be removed now is logged and left for
 * the next start. Returns the number of slots cleaned, or -1 when the host cannot run as it
 * should: a worker thread did not start (then destroyed slots are never torn down), or the
 * network could not be reconciled. */
int moat_host_reconcile(struct moat_host *h, moat_error **err);

/* Returns true while the sandbox's init is alive. */
bool moat_host_alive(struct moat_host *h, int slot);

/* What this host has to give sandboxes, for the bounds of what a create may ask; 0 where it
 * cannot tell. */
struct moat_host_capacity {
  uint64_t memory_mb;   /* physical memory */
  uint64_t disk_mb;     /* size of the file system holding the data dir (the writable layers) */
  uint64_t pid_max;     /* the kernel's highest pid + 1 (linux: kernel.pid_max) */
  uint64_t threads_max; /* the kernel's limit on threads (linux: kernel.threads-max) */
  /* now, as the host reports it (zero where it cannot tell) */
  unsigned cpus;                /* CPUs moatd may run on (its affinity) */
  uint64_t memory_available_mb; /* memory the kernel could hand out without swapping */
  uint64_t disk_free_mb;        /* free space of the data dir's file system */
  double load[3];               /* load averages over 1, 5 and 15 minutes */
  uint64_t uptime_s;            /* since the host booted */
};
void moat_host_capacity(struct moat_host *h, struct moat_host_capacity *out);

/* Resource use of a running sandbox, from its cgroups. */
struct moat_usage {
  uint64_t memory_bytes;
  uint64_t cpu_usage_ns;
  uint64_t pids;
  uint64_t oom_kills;         /* times the kernel OOM-killed a process of this sandbox */
  uint64_t working_set_bytes; /* memory_bytes less the inactive file cache (what metering charges) */
};
int moat_host_usage(struct moat_host *h, int slot, struct moat_usage *out, moat_error **err);
/* moat_usage.oom_kills alone, cheaply (one read): control samples it around every exec. 0 and
 * *out, or -1 (ENOENT when the slot holds no running sandbox). */
int moat_host_oom_kills(struct moat_host *h, int slot, uint64_t *out, moat_error **err);

/* The writable layer of the running sandbox in slot, as its root file system reports it. */
struct moat_disk_usage {
  uint64_t total_bytes;
  uint64_t used_bytes;
};
/* Fills out for the running (or paused) sandbox in slot. 0, or -1 (ENOENT when the slot holds no
 * running sandbox). */
int moat_host_disk_usage(struct moat_host *h, int slot, struct moat_disk_usage *out, moat_error **err);

/* ---- reaching a sandbox's network ---- */

/* A TCP connection to port on the loopback of the sandbox in slot (127.0.0.1, else ::1), made
 * inside the sandbox's own network: nothing outside the sandbox is reached through it, whatever
 * listens on the host's loopback. timeout_ms (> 0) bounds the connect. Returns the connected fd
 * (blocking, close-on-exec; the caller owns it), or -1: ECONNREFUSED when nothing listens there,
 * ETIMEDOUT, ENOENT when the slot holds no running sandbox. */
int moat_host_port_connect(struct moat_host *h, int slot, unsigned port, int timeout_ms, moat_error **err);

/* ---- time travel: pause, checkpoint, restore ---- */

/* Freezes every process of the sandbox in slot (cgroup freezer; returns once the cgroup reports
 * frozen) / thaws it. Both idempotent. A frozen sandbox uses no CPU and keeps its memory; its
 * guest does not answer until resumed. Returns 0 or -1. */
int moat_host_pause(struct moat_host *h, int slot, moat_error **err);
int moat_host_resume(struct moat_host *h, int slot, moat_error **err);

/* What a checkpoint took. */
struct moat_checkpoint_info {
  uint64_t memory_bytes; /* process memory written (CRIU pages images) */
  uint64_t disk_bytes;   /* bytes of the writable layer copied */
  uint64_t frozen_ns;    /* how long the sandbox's processes were stopped */
  uint64_t total_ns;
};

/* Checkpoints the running sandbox in slot into dir (an empty directory the caller made, on the
 * same filesystem as the data dir): its processes, memory and open files (CRIU images) and a copy
 * of its writable layer, both taken while the sandbox is frozen, so disk and memory agree; dir's
 * moat-checkpoint file, written last, marks it complete. With leave_running the sandbox goes on
 * afterwards as before (snapshot, fork); without (hibernate), it stays frozen as dumped, whole,
 * until the caller, having recorded the image, destroys the slot (moat_host_destroy): a moatd
 * killed before that finds it running at its next start. On failure dir may hold partial files
 * (the caller removes it) and the sandbox runs on as before (paused if it was). Returns 0 or -1. */
int moat_host_checkpoint(struct moat_host *h, int slot, const char *dir, bool leave_running,
                         struct moat_checkpoint_info *info, moat_error **err);

/* Starts a new sandbox in a fresh slot from a checkpoint dir that moat_host_checkpoint wrote
 * from a sandbox of template_name: the same processes, memory, open files and disk, in its own
 * namespaces, cgroups, uid range and writable layer, diverging from there. dir is only read: it
 * may be restored many times, also concurrently. limits apply to the new sandbox. The guest
 * answers on out->guest once this returns. On failure nothing is left behind. Returns 0 and
 * fills out like moat_host_create, or -1. The volumes the checkpoint recorded are mounted again, as
 * they are now, read-only where they were, and every one read-only with MOAT_RESTORE_VOLUMES_RO (a
 * second sandbox from another's checkpoint: never a second writer); the new sandbox's own
 * checkpoints record them so. EROFS when, so, a file the checkpoint holds open for writing on one
 * cannot be reopened. */
#define MOAT_RESTORE_VOLUMES_RO 1u
int moat_host_restore(struct moat_host *h, const char *dir, const char *template_name,
                      const struct moat_limits *limits, unsigned flags, struct moat_instance *out,
                      moat_error **err);
/* How many volume mounts the checkpoint in dir records (0 for none), or -1. */
int moat_host_checkpoint_volumes(struct moat_host *h, const char *dir, moat_error **err);

/* Connections from moatd the sandbox in slot holds open now (an attached exec stream, PTY, watch):
 * traffic on them makes no API call, so the idle reaper asks. -1 when it cannot tell. */
int moat_host_guest_sessions(struct moat_host *h, int slot);
/* The channel every guest endpoint of h names (its timeout and unreachable hook are the caller's
 * to set, before guests are reached). */
struct moat_guest_channel *moat_host_guest_channel(struct moat_host *h);

/* A line saying how this host checkpoints (the linux driver: which CRIU and why, "criu 4.1.1 from
 * /var/lib/moat/criu (the system's 3.17 fails criu check on this kernel)"), or why checkpoints
 * are unavailable; static storage. Checkpoint and restore fail with ENOSYS when unavailable. */
const char *moat_host_criu_status(struct moat_host *h);
/* True when checkpoint and restore work on this host (linux: a CRIU that passed its check was
 * found). */
bool moat_host_can_checkpoint(struct moat_host *h);

/* ---- volumes: file systems that outlive sandboxes ----
 * A volume is named by an id control chooses ([a-z0-9-]{1,40}); its files belong to ids 0..65535
 * as every sandbox sees them, whatever its uid range. */

/* Makes volume vid's storage: size_mb is a hard limit (writes past it fail with ENOSPC inside),
 * backed by the data dir unless moatd overcommits disks (ENOSPC when it cannot be). 0, or -1 with
 * nothing left behind. */
int moat_host_volume_create(struct moat_host *h, const char *vid, uint64_t size_mb, moat_error **err);
/* Makes volume dst_vid's storage a copy of src_vid's as it is now: what src_vid's file system
 * holds unwritten is synced to its storage first, then copied (copy-on-write where the data dir's
 * file system shares extents). A consistent copy needs nothing writing to src_vid meanwhile: the
 * caller stops its writers (freezes the sandboxes that mount it). EEXIST when dst_vid has storage;
 * ENOSPC when the data dir cannot hold it. 0, or -1 with nothing left behind. */
int moat_host_volume_copy(struct moat_host *h, const char *src_vid, const char *dst_vid, moat_error **err);
/* Removes volume vid's storage (absent: 0). Sandboxes that still mount it keep it until they end. */
int moat_host_volume_remove(struct moat_host *h, const char *vid, moat_error **err);
/* A directory fd of the root of volume vid's files, in no mount namespace (caller closes), for the
 * host's own file operations (host/vfiles.h: nothing in it is followed). -1 (ENOENT: no storage). */
int moat_host_volume_root(struct moat_host *h, const char *vid, moat_error **err);
/* Mounts volume vid at path (absolute, checked by the caller: no "..", not /) in the running
 * sandbox in slot, its files owned as the sandbox sees them (idmapped), read-only when read_only
 * (EROFS inside). Directories missing on the way are made; a symbolic link on the way fails (ELOOP).
 * 0 or -1. */
int moat_host_volume_attach(struct moat_host *h, int slot, const char *vid, const char *path, bool read_only,
                            moat_error **err);
/* Removes the storage of every volume whose id is not among keep's n (and what an interrupted
 * create left). Returns how many it removed, or -1. */
int moat_host_volume_gc(struct moat_host *h, const char *const *keep, size_t n, moat_error **err);
/* Size and use of volume vid's file system. */
int moat_host_volume_usage(struct moat_host *h, const char *vid, struct moat_disk_usage *out,
                           moat_error **err);

/* ---- image builds ---- */

/* Copies the writable layer of the sandbox in slot (its overlay upper dir: the files it added or
 * changed, 0/0 character devices where it deleted, directories it replaced marked with the xattr
 * user.overlay.opaque = "y") to dst_dir/name, which must not exist, for moat_image_tree_apply
 * (image_tree.h). Owners become the image's: host uid_base + n (the sandbox's n) becomes n, and an
 * owner outside the sandbox's range (which the sandbox saw as the overflow id) becomes 65534, never
 * a privileged id. Modes, times, hard links, symlinks (copied, never followed) and user.* / trusted.*
 * xattrs are kept; security.* xattrs (file capabilities) and sockets are not. The sandbox must be
 * paused (moat_host_pause) for the copy to be whole: EBUSY when it is not. On failure dst_dir/name
 * may be partial (the caller removes it). 0, or -1 (ENOENT when the slot holds no sandbox; ENOSYS
 * when the driver cannot). */
int moat_host_export_layer(struct moat_host *h, int slot, int dst_dir, const char *name, moat_error **err);

/* ---- network (net/net.h) ---- */

/* The host's sandbox network, or NULL when moatd runs without an uplink (loopback only). */
struct moat_net *moat_host_net(struct moat_host *h);
/* The network slot (net/net.h) of the sandbox in slot, or -1 when it has none. */
int moat_host_net_slot(struct moat_host *h, int slot);

/* ---- the ops table ----
 * What a driver implements. Each op has the contract of the moat_host_* function of the same
 * name above, for the driver's own handle. A driver's handle is a struct of its own whose first
 * member is struct moat_host: init allocates it and returns &its->base; every other op gets that
 * pointer back and converts it to the driver's type. Ops marked optional may be NULL: the
 * moat_host_* function then fails with ENOSYS (or says "none", as its contract tells).
 *
 * The guest channel: create, adopt and restore hand it out in moat_instance.guest (the endpoint
 * guest_client.c connects to); a driver makes its guest listen where that endpoint says. */
struct moat_host {
  const struct moat_driver_ops *ops; /* set by moat_host_init */
  /* how the driver reaches its guests: the driver sets ops at init, every endpoint it hands out
   * names it; moat_host_guest_channel lets its user set the timeout and hook */
  struct moat_guest_channel guest_channel;
};

struct moat_driver_ops {
  const char *name; /* moat_host_config.driver */
  int (*init)(struct moat_host **out, const struct moat_host_config *cfg, moat_error **err);
  void (*shutdown)(struct moat_host *h);
  int (*create)(struct moat_host *h, const char *template_name, const struct moat_limits *limits,
                struct moat_instance *out, moat_error **err);
  int (*destroy)(struct moat_host *h, int slot, moat_error **err);
  int (*adopt)(struct moat_host *h, int slot, pid_t pid, uint64_t start_time, struct moat_instance *out,
               moat_error **err);
  int (*reconcile)(struct moat_host *h, moat_error **err);
  bool (*alive)(struct moat_host *h, int slot);
  void (*capacity)(struct moat_host *h, struct moat_host_capacity *out);
  int (*usage)(struct moat_host *h, int slot, struct moat_usage *out, moat_error **err);
  int (*disk_usage)(struct moat_host *h, int slot, struct moat_disk_usage *out, moat_error **err);
  /* optional (NULL: usage is asked) */
  int (*oom_kills)(struct moat_host *h, int slot, uint64_t *out, moat_error **err);
  int (*port_connect)(struct moat_host *h, int slot, unsigned port, int timeout_ms, moat_error **err);
  /* optional: time travel */
  int (*pause)(struct moat_host *h, int slot, moat_error **err);
  int (*resume)(struct moat_host *h, int slot, moat_error **err);
  int (*checkpoint)(struct moat_host *h, int slot, const char *dir, bool leave_running,
                    struct moat_checkpoint_info *info, moat_error **err);
  int (*checkpoint_volumes)(struct moat_host *h, const char *dir, moat_error **err);
  int (*restore)(struct moat_host *h, const char *dir, const char *template_name,
                 const struct moat_limits *limits, unsigned flags, struct moat_instance *out,
                 moat_error **err);
  const char *(*checkpoint_status)(struct moat_host *h); /* moat_host_criu_status */
  bool (*can_checkpoint)(struct moat_host *h);
  /* optional: the guest's sessions (NULL: -1, cannot tell) */
  int (*guest_sessions)(struct moat_host *h, int slot);
  /* optional: volumes (NULL: ENOSYS) */
  int (*volume_create)(struct moat_host *h, const char *vid, uint64_t size_mb, moat_error **err);
  int (*volume_copy)(struct moat_host *h, const char *src_vid, const char *dst_vid, moat_error **err);
  int (*volume_remove)(struct moat_host *h, const char *vid, moat_error **err);
  int (*volume_root)(struct moat_host *h, const char *vid, moat_error **err);
  int (*volume_attach)(struct moat_host *h, int slot, const char *vid, const char *path, bool read_only,
                       moat_error **err);
  int (*volume_usage)(struct moat_host *h, const char *vid, struct moat_disk_usage *out, moat_error **err);
  int (*volume_gc)(struct moat_host *h, const char *const *keep, size_t n, moat_error **err);
  /* optional: image builds (NULL: ENOSYS) */
  int (*export_layer)(struct moat_host *h, int slot, int dst_dir, const char *name, moat_error **err);
  /* optional: network hooks (NULL: no network, no network slot) */
  struct moat_net *(*net)(struct moat_host *h);
  int (*net_slot)(struct moat_host *h, int slot);
};

#endif

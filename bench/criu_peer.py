#!/usr/bin/env python3
"""criu_peer.py -- the plain criu CLI on a real moat sandbox: the peer for time-travel benchmarks.

Offers (import it, or run it):
  sandbox_pid(slot_dir)                  host pid of a sandbox's init: SLOT_DIR/guest.sock links to
                                         /proc/PID/root/run/moat/guest.sock (src/host/linux/shell.c)
  dump(pid, images_dir) -> ms            `criu dump -t PID --leave-running` of the sandbox, plainly:
                                         tasks stopped by ptrace (no cgroup freeze, no copy of the
                                         writable layer), net namespace dumped, no kernel-feature cache
  restore(images_dir, rootfs, upper, uid_base) -> (ms, pid)
                                         `criu restore -d` of those images onto a fresh overlay (the
                                         template's rootfs idmapped for the parent's range uid_base, as
                                         a sandbox sees it, + a copy of `upper`, e.g. a moat checkpoint's
                                         upper/), mounted in a private mount namespace; ms until criu
                                         returns (the tree then runs). It keeps the parent's uid range:
                                         the CLI cannot move a tree to another one.
  kill(pid)                              ends a restored tree (SIGKILL to its init, a pid-ns init)
  CLI: criu_peer.py --slot-dir DIR --rootfs DIR --checkpoint DIR [--runs N] prints JSON
       (DIR of --checkpoint: one moat_host_checkpoint wrote from that sandbox: its upper/ and uid_base)
       {"dump_ms": [...], "restore_ms": [...]}.
Root only. Uses the CRIU moatd uses (MOAT_CRIU, default /var/lib/moat/criu/criu).
bench/criu_bench.c measures the same peer in C beside moat's own checkpoint and restore.
"""

import argparse
import ctypes
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time

CRIU = os.environ.get("MOAT_CRIU", "/var/lib/moat/criu/criu")


def sandbox_pid(slot_dir):
    target = os.readlink(os.path.join(slot_dir, "guest.sock"))  # /proc/PID/root/run/moat/guest.sock
    parts = target.split("/")
    if len(parts) < 3 or parts[1] != "proc":
        raise ValueError("%s/guest.sock does not point into /proc: %s" % (slot_dir, target))
    return int(parts[2])


def _errors(log):
    try:
        with open(log) as f:
            return "; ".join(l.strip() for l in f if "Error" in l and "RLIMIT" not in l and "tables" not in l)[:800]
    except OSError:
        return "no log"


def dump(pid, images_dir):
    os.makedirs(images_dir, exist_ok=True)
    os.chmod(images_dir, 0o711)
    t0 = time.monotonic()
    r = subprocess.run([CRIU, "dump", "-t", str(pid), "-D", images_dir, "-o", "dump.log", "--leave-running",
                        "--ext-mount-map", "auto", "--network-lock", "skip"],
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ms = (time.monotonic() - t0) * 1000
    if r.returncode != 0:
        raise RuntimeError("criu dump failed: " + _errors(os.path.join(images_dir, "dump.log")))
    # the restored tasks open some images from inside their user namespace
    for name in os.listdir(images_dir):
        os.chmod(os.path.join(images_dir, name), 0o644)
    return ms


libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
SYS_open_tree, SYS_move_mount, SYS_mount_setattr = 428, 429, 442
CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000


class MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def _check(r, what):
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, "%s: %s" % (what, os.strerror(e)))
    return r


def idmapped_rootfs(rootfs, uid_base):
    """A detached, read-only, idmapped clone of rootfs for a user namespace mapping 0..65535 to
    uid_base (a throwaway child holds the namespace while the mount is made). Returns its fd."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(w)
        libc.unshare(CLONE_NEWUSER)
        os.read(r, 1)
        os._exit(0)
    os.close(r)
    try:
        time.sleep(0.01)
        for f in ("uid_map", "gid_map"):
            with open("/proc/%d/%s" % (pid, f), "w") as m:
                m.write("0 %d 65536\n" % uid_base)
        userns = os.open("/proc/%d/ns/user" % pid, os.O_RDONLY)
        fd = _check(libc.syscall(SYS_open_tree, -100, rootfs.encode(), 1 | 0o2000000), "open_tree")  # CLONE|CLOEXEC
        attr = MountAttr(0x00100000 | 0x1, 0, 0, userns)  # MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY
        _check(libc.syscall(SYS_mount_setattr, fd, b"", 0x1000, ctypes.byref(attr), ctypes.sizeof(attr)),
               "mount_setattr")  # AT_EMPTY_PATH
        os.close(userns)
        return fd
    finally:
        os.close(w)
        os.waitpid(pid, 0)


def restore(images_dir, rootfs, upper, uid_base):
    base = tempfile.mkdtemp(prefix="moat-criu-peer-")
    lower_fd = -1
    try:
        subprocess.run(["cp", "-a", upper, os.path.join(base, "upper")], check=True)  # whiteouts, xattrs too
        for d in ("work", "root", "lower"):
            os.mkdir(os.path.join(base, d))
        pidfile = os.path.join(base, "pid")
        lower_fd = idmapped_rootfs(rootfs, uid_base)
        opts = "lowerdir=%s/lower,upperdir=%s/upper,workdir=%s/work,userxattr" % (base, base, base)
        argv = [CRIU, "restore", "-D", images_dir, "-o", "restore.log", "--root", base + "/root", "-d",
                "--pidfile", pidfile, "--ext-mount-map", "auto", "--manage-cgroups=ignore"]
        t0 = time.monotonic()
        pid = os.fork()
        if pid == 0:  # private mount ns: the overlay is never visible on the host
            try:
                _check(libc.unshare(CLONE_NEWNS), "unshare")
                _check(libc.mount(None, b"/", None, 0x4000 | 0x40000, None), "make / private")  # MS_REC|MS_PRIVATE
                _check(libc.syscall(SYS_move_mount, lower_fd, b"", -100, (base + "/lower").encode(), 4),
                       "move_mount")  # MOVE_MOUNT_F_EMPTY_PATH
                _check(libc.mount(b"overlay", (base + "/root").encode(), b"overlay", 16, opts.encode()),
                       "mount overlay")  # MS_NODEV
                null = os.open("/dev/null", os.O_RDWR)
                for i in range(3):
                    os.dup2(null, i)
                os.execv(CRIU, argv)
            finally:
                os._exit(127)
        _, st = os.waitpid(pid, 0)
        ms = (time.monotonic() - t0) * 1000
        if os.waitstatus_to_exitcode(st) != 0:
            raise RuntimeError("criu restore failed: " + _errors(os.path.join(images_dir, "restore.log")))
        with open(pidfile) as f:
            return ms, int(f.read().strip())
    finally:
        if lower_fd >= 0:
            os.close(lower_fd)
        shutil.rmtree(base, ignore_errors=True)


def kill(pid):
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    for _ in range(200):
        try:
            with open("/proc/%d/stat" % pid) as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return
        except (OSError, IndexError):
            return
        time.sleep(0.005)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--slot-dir", required=True, help="the sandbox's slot dir (DATA/host/slots/N)")
    ap.add_argument("--rootfs", required=True, help="its template's rootfs")
    ap.add_argument("--checkpoint", required=True, help="a moat checkpoint dir of that sandbox (upper/, uid_base)")
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    pid = sandbox_pid(a.slot_dir)
    with open(os.path.join(a.checkpoint, "moat-checkpoint")) as f:
        uid_base = int(dict(l.split(" ", 1) for l in f.read().splitlines() if " " in l)["uid_base"])
    res = {"dump_ms": [], "restore_ms": []}
    tmp = tempfile.mkdtemp(prefix="moat-criu-peer-img-")
    try:
        for i in range(a.runs):
            img = os.path.join(tmp, str(i))
            res["dump_ms"].append(round(dump(pid, img), 2))
            ms, rpid = restore(img, a.rootfs, os.path.join(a.checkpoint, "upper"), uid_base)
            kill(rpid)
            res["restore_ms"].append(round(ms, 2))
            shutil.rmtree(img, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(res))


if __name__ == "__main__":
    main()

"""test_disk_full.py -- moatd's data dir on a small file system the test makes (a loop-mounted ext4
image under /var/tmp, removed afterwards): nothing a sandbox writes is lost when it fills.

- By default every sandbox's disk_mb is backed by the data dir: a create the free space cannot back
  is 507 insufficient_storage, an admitted sandbox's disk is allocated in full (a warm shell's right
  after it is handed out), and when something else then fills the file system the sandbox still
  writes up to its disk_mb, each acknowledged write intact.
- With --disk-overcommit the create is accepted; when the host fills, writes fail inside with an
  error (ENOSPC/EIO at fsync), every acknowledged write is intact, and once the disk's file system
  lost metadata it is read-only (EROFS): nothing more is acknowledged on it, also after the host has
  room again.

A write counts as acknowledged when write and fsync returned without error; it is checked by reading
the file back from the disk (its cached pages dropped first)."""

import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
import moatd  # noqa: E402

# python3-minimal only: no json.
WRITER = r"""
import hashlib, os, sys
def load():
    try:
        with open("/dev/shm/acked") as f:
            return dict(line.split() for line in f if line.strip())
    except OSError:
        return {}
if sys.argv[1] == "write":
    prefix, n, kib = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    acked, errs = load(), {}
    damaged, after = False, 0  # an EIO or EROFS: the disk lost something; acks after that
    for i in range(n):
        data = os.urandom(kib << 10)
        p = "/root/%s%d/%d" % (prefix, i // 10, i)  # ten to a directory: metadata to write too
        try:
            os.makedirs(os.path.dirname(p), exist_ok=True)
            fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            acked[p] = hashlib.sha256(data).hexdigest()
            after += damaged
        except OSError as e:
            errs[e.errno] = errs.get(e.errno, 0) + 1
            damaged = damaged or e.errno in (5, 30)
    with open("/dev/shm/acked", "w") as f:  # a tmpfs: the record does not depend on the disk
        f.write("".join("%s %s\n" % kv for kv in sorted(acked.items())))
    print("acked %d" % (n - sum(errs.values())))
    print("acked_after_damage %d" % after)
    print("errors " + " ".join("%s=%d" % (os.strerror(k).replace(" ", "_"), v) for k, v in sorted(errs.items())))
else:
    lost = []
    acked = load()
    for p, h in sorted(acked.items()):
        try:
            fd = os.open(p, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            got = b""
            while True:
                b = os.read(fd, 1 << 20)
                if not b:
                    break
                got += b
            os.close(fd)
            if hashlib.sha256(got).hexdigest() != h:
                lost.append(p)
        except OSError as e:
            lost.append("%s(%s)" % (p, e.strerror.replace(" ", "_")))
    print("checked %d" % len(acked))
    print("lost %d %s" % (len(lost), " ".join(lost)))
"""


def parse(out):
    d = {}
    for line in out.splitlines():
        k, _, v = line.partition(" ")
        d[k] = v
    return d


class SmallFs:
    """An ext4 file system of size_mb (sparse image, no blocks reserved for root) mounted under
    /var/tmp; remove() unmounts it and deletes the image."""

    def __init__(self, size_mb):
        self.base = tempfile.mkdtemp(prefix="moat-smallfs-", dir="/var/tmp")
        self.img = os.path.join(self.base, "fs.img")
        self.mnt = os.path.join(self.base, "mnt")
        os.mkdir(self.mnt)
        with open(self.img, "wb") as f:
            f.truncate(size_mb << 20)
        subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", self.img], check=True)
        subprocess.run(["mount", "-o", "loop", self.img, self.mnt], check=True)
        self.data = os.path.join(self.mnt, "data")
        self.filler = os.path.join(self.mnt, "filler")

    def free_mb(self):
        st = os.statvfs(self.mnt)
        return st.f_bavail * st.f_frsize >> 20

    def fill(self, leave_kib):
        """Something else takes the file system's space but leave_kib."""
        st = os.statvfs(self.mnt)
        want = st.f_bavail * st.f_frsize - leave_kib * 1024
        fd = os.open(self.filler, os.O_CREAT | os.O_RDWR, 0o600)
        try:
            if want > 0:
                os.posix_fallocate(fd, 0, want)
        finally:
            os.close(fd)

    def unfill(self):
        os.unlink(self.filler)

    def remove(self):
        if subprocess.run(["umount", self.mnt], stderr=subprocess.DEVNULL).returncode != 0:
            subprocess.run(["umount", "-l", self.mnt], stderr=subprocess.DEVNULL)
        shutil.rmtree(self.base, ignore_errors=True)


class DiskFullTest(unittest.TestCase):
    def start(self, fs_mb, pool=0, overcommit=False):
        self.fs = SmallFs(fs_mb)
        self.addCleanup(self.fs.remove)
        self.d = moatd.MoatDaemon(pool=pool, data_dir=self.fs.data, disk_overcommit=overcommit)
        self.addCleanup(self.d.stop)
        self.d.start()
        self.c = self.d.client

    def writer(self, sid, *args):
        r = self.c.exec(sid, argv=["python3", "/root/writer.py"] + [str(a) for a in args], timeout=300)
        self.assertEqual(r["exit_code"], 0, r)
        return parse(r["stdout"])

    def sandbox_with_writer(self, disk_mb):
        sb = self.c.create(disk_mb=disk_mb, ttl_seconds=900)
        self.c.put_file(sb["id"], "/root/writer.py", WRITER.encode())
        return sb["id"]

    def wait_free_below(self, mb, timeout=30):
        deadline = time.time() + timeout
        while self.fs.free_mb() > mb and time.time() < deadline:
            time.sleep(0.1)
        return self.fs.free_mb()

    def test_disks_are_backed_by_the_data_dir(self):
        self.start(12288, pool=1)  # sparse: allocating a 10 GiB disk in it writes only metadata
        deadline = time.time() + 60  # the warm shell (default disk_mb 10240)
        while not any(os.path.isdir(os.path.join(self.fs.data, "host/slots", s))
                      for s in os.listdir(os.path.join(self.fs.data, "host/slots"))) and time.time() < deadline:
            time.sleep(0.1)
        time.sleep(1)
        free0 = self.fs.free_mb()
        self.assertGreater(free0, 10240 + 512, "the test's file system is too small")
        warm = self.c.create(ttl_seconds=900)["id"]  # the warm shell, handed out
        free1 = self.wait_free_below(free0 - 10240 + 256)
        self.assertLess(free1, free0 - 10240 + 256,
                        "a 10240 MiB disk took %d MiB of the data dir: not backed" % (free0 - free1))

        # more than what is left: refused, saying why
        st, body = self.c.request("POST", "/v1/sandboxes", body={"disk_mb": free1 + 64}, expect=(201, 507))
        if st == 201:
            self.c.delete(body["id"])
        self.assertEqual((st, body.get("code")), (507, "insufficient_storage"), body)
        self.assertIn("--disk-overcommit", body["message"])

        # what is left can be had (a cold build), and it is taken at once
        want = free1 // 2
        sid = self.sandbox_with_writer(want)
        free2 = self.fs.free_mb()
        self.assertLess(free2, free1 - want + 64, "a %d MiB disk took %d MiB" % (want, free1 - free2))

        # something else fills the file system: the sandboxes still have their disks
        self.fs.fill(leave_kib=512)
        w = self.writer(sid, "write", "f", 40, 1024)
        self.assertEqual(w["acked"], "40", "writes within disk_mb failed once the host filled: %r" % w)
        v = self.writer(sid, "verify")
        self.assertEqual(v["lost"], "0 ", v)
        self.c.put_file(warm, "/root/writer.py", WRITER.encode())
        w = self.writer(warm, "write", "w", 20, 1024)
        self.assertEqual(w["acked"], "20", "the warm shell's disk was not backed: %r" % w)
        self.assertEqual(self.writer(warm, "verify")["lost"], "0 ")
        self.fs.unfill()
        self.c.delete(sid)
        self.c.delete(warm)

    def loop_of_disk(self):
        loops = moatd.loops_under(self.fs.data)
        self.assertEqual(len(loops), 1, loops)
        return loops[0][0]

    def test_overcommitted_disk_reports_what_it_cannot_store(self):
        self.start(256, overcommit=True)
        sid = self.sandbox_with_writer(200)  # more than the data dir can hold besides its other files
        dev = self.loop_of_disk()
        self.fs.fill(leave_kib=4096)
        w1 = self.writer(sid, "write", "f", 400, 64)
        self.assertLess(int(w1["acked"]), 400, "25 MiB were acknowledged on a host with 4 MiB free: %r" % w1)
        self.assertTrue(w1["errors"], w1)
        # write back the disk's metadata now (as the kernel's flusher would later): bitmaps and
        # inode tables the host may have no room for either
        sync = self.c.exec(sid, cmd="sync", timeout=120)
        errors_path = "/sys/fs/ext4/%s/errors_count" % dev
        deadline = time.time() + 3  # the kernel records the error count a moment later
        while True:
            with open(errors_path) as f:
                fs_errors = int(f.read())
            if fs_errors or time.time() > deadline:
                break
            time.sleep(0.1)
        self.fs.unfill()  # the host has room again
        w2 = self.writer(sid, "write", "g", 200, 64)
        if fs_errors:
            # metadata of the disk was lost: it must not take more writes, now that it is damaged
            self.assertEqual(w2["acked"], "0", "writes acknowledged on a disk that lost metadata (%d errors): %r"
                             % (fs_errors, w2))
        self.assertEqual(w2["acked_after_damage"], "0", "writes acknowledged after the disk failed one with EIO "
                         "or EROFS: %r" % w2)
        v = self.writer(sid, "verify")
        self.assertEqual(v["lost"], "0 ", "acknowledged writes lost: %r (first wave %r)" % (v, w1))
        sys.stderr.write("[wave 1: %s acked, errors %s; sync exit %d; disk fs errors %d; wave 2: %s acked, "
                         "errors %s] " % (w1["acked"], w1["errors"], sync["exit_code"], fs_errors, w2["acked"],
                                          w2["errors"]))
        self.c.delete(sid)

"""test_limits.py -- cpu, memory_mb, pids and disk_mb take effect inside the sandbox (checked by their
effects, since the sandbox's cgroup files need not be visible inside)."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
from moattest import DaemonTest  # noqa: E402


class LimitsTest(DaemonTest):
    def test_limits_reported(self):
        sb = self.sandbox(cpu=0.5, memory_mb=128, pids=100, disk_mb=256)
        self.assertEqual((sb["cpu"], sb["memory_mb"], sb["pids"], sb["disk_mb"]), (0.5, 128, 100, 256))
        g = self.c.get(sb["id"])
        self.assertEqual((g["cpu"], g["memory_mb"], g["pids"], g["disk_mb"]), (0.5, 128, 100, 256))

    def test_memory(self):
        sid = self.with_probe(memory_mb=96)
        r = self.probe(sid, "alloc", 32)
        self.assertTrue(r.ok, r)
        r = self.probe(sid, "alloc", 192)
        self.assertFalse(r.ok, r)
        self.assertEqual((r.raw["exit_code"], r.raw["signal"]), (-1, 9), r)
        self.assertAlive(sid)

    def test_pids(self):
        sid = self.with_probe(pids=32)
        r = self.probe(sid, "forkcount", 200)
        self.assertEqual(r.errno, "EAGAIN", r)
        forked = int(r.fields["forked"])
        self.assertLess(forked, 32)
        self.assertGreater(forked, 10)
        self.assertAlive(sid)
        # the processes were released: forking works again
        r = self.probe(sid, "forkcount", 5)
        self.assertTrue(r.ok, r)

    def test_cpu(self):
        sid = self.with_probe(cpu=0.25)
        r = self.probe(sid, "burn", 2, 2, timeout_ms=60000)
        self.assertTrue(r.ok, r)
        cpu, wall = float(r.fields["cpu_s"]), float(r.fields["wall_s"])
        self.assertLess(cpu / wall, 0.35, r)
        self.assertGreater(cpu / wall, 0.05, r)

    def test_disk(self):
        sid = self.with_probe(disk_mb=48)
        r = self.probe(sid, "fill", "/root/fill.bin", timeout_ms=120000)
        self.assertIn(r.errno, ("ENOSPC", "EDQUOT"), r)
        written = int(r.fields["written"])
        self.assertLess(written, 48 << 20)
        self.assertGreater(written, 16 << 20)
        self.c.sh(sid, "rm -f /root/fill.bin")
        self.assertAlive(sid)
        # space is usable again
        self.c.sh(sid, "head -c 4194304 /dev/zero > /root/after.bin")


class CgroupPlacementTest(DaemonTest):
    """moatd puts every sandbox cgroup beneath the cgroup it was started in (the harness starts it
    in a cgroup of its own), in every hierarchy, never at a hierarchy's root."""

    def test_sandbox_cgroups_beneath_daemon(self):
        import time
        import uuid
        import moatd
        if not self.daemon.cgroups:
            self.skipTest("daemon not started in a test cgroup (MOAT_TEST_CGROUP=0)")
        sid = self.with_probe(memory_mb=256)
        tag = "cgplace-" + uuid.uuid4().hex[:10]
        self.assertTrue(self.probe(sid, "sleepd", 60, tag).ok)
        time.sleep(0.2)
        pids = moatd.find_pids_by_cmdline(tag)
        self.assertEqual(len(pids), 1)
        dirs = moatd.pid_cgroup_dirs(pids[0])
        daemon_dirs = moatd.pid_cgroup_dirs(self.daemon.proc.pid)
        for test_cg in self.daemon.cgroups:
            hier = test_cg[:test_cg.index("/", len(moatd.CG_ROOT) + 1)] if test_cg.count("/") > 4 else test_cg
            mine = [d for d in dirs if d == hier or d.startswith(hier + "/")]
            if hier.endswith(("/cpuset", "/blkio", "/devices", "/freezer")):
                continue  # hierarchies moatd does not use
            with self.subTest(hierarchy=hier):
                self.assertTrue(mine, "sandbox in no cgroup of %s: %r" % (hier, dirs))
                self.assertTrue(mine[0].startswith(test_cg + "/"),
                                "sandbox cgroup %s is not beneath moatd's cgroup %s (moatd is in %r)"
                                % (mine[0], test_cg, daemon_dirs))

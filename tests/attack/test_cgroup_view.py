"""test_cgroup_view.py -- a sandbox's /sys/fs/cgroup shows its own cgroups read-only, and nothing else;
its view files (cpu/online, cpuinfo, swaps, bound from moatd's read-only share, which every sandbox
binds) cannot be changed either.

From inside, as root: writing a limit, making a child cgroup, moving a process (cgroup.procs),
remounting read-write, chmod and unmounting all fail; the sandbox's limits, read on the host from its
cgroup dirs, are unchanged afterwards. No cgroup but its own is visible: the hierarchy roots show no
slot-N or moat-* dir, and cgroup.procs lists only the sandbox's own processes -- a second sandbox's
sleeping process, whose pid the host knows, appears in neither the first one's view nor its ps.
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
import moatd  # noqa: E402
from moattest import DaemonTest  # noqa: E402

MIB = 1 << 20
HYBRID = os.path.isdir("/sys/fs/cgroup/memory")
LIMIT = "/sys/fs/cgroup/memory/memory.limit_in_bytes" if HYBRID else "/sys/fs/cgroup/memory.max"


def host_limit(pid):
    for d in moatd.pid_cgroup_dirs(pid):
        f = os.path.join(d, "memory.limit_in_bytes" if HYBRID else "memory.max")
        if os.path.exists(f):
            with open(f) as fh:
                return int(fh.read())
    raise AssertionError("no memory cgroup of pid %d on the host" % pid)


class CgroupViewAttackTest(DaemonTest):
    pool = 0

    def test_read_only_and_own_only(self):
        a = self.sandbox(memory_mb=256, cpu=1)["id"]
        b = self.sandbox(memory_mb=256, cpu=1)["id"]
        self.c.exec(b, cmd="exec sleep 600", tag="other", background=True, expect=201)
        ha = self.daemon.sandbox_host(a)
        self.assertEqual(host_limit(ha["pid"]), 256 * MIB)
        attempts = [
            "echo %d > %s" % (1 << 40, LIMIT),
            "mkdir /sys/fs/cgroup/%s/escape" % ("memory" if HYBRID else "."),
            "echo 1 > /sys/fs/cgroup/%s/cgroup.procs" % ("memory" if HYBRID else "."),
            "mount -o remount,rw /sys/fs/cgroup",
            "mount -o remount,rw %s" % os.path.dirname(LIMIT),
            "chmod 777 %s" % LIMIT,
            "umount %s" % os.path.dirname(LIMIT),
            "umount -l /sys/fs/cgroup",
            # the view files bound from moatd's share
            "echo 0-63 > /sys/devices/system/cpu/online",
            "umount /sys/devices/system/cpu/online",
            "umount -l /proc/cpuinfo",
            "echo x > /proc/swaps",
            "ln -sf /etc/passwd /sys/devices/system/cpu/online",
        ]
        for cmd in attempts:
            r = self.c.exec(a, cmd=cmd)
            self.assertNotEqual(r["exit_code"], 0, (cmd, r))
        # the limit stands, inside and out; the host's view files are as moatd wrote them
        self.assertEqual(host_limit(ha["pid"]), 256 * MIB)
        # the view files are moatd's share's, which b binds too: b sees them as moatd wrote them
        self.assertEqual(self.c.sh(b, "cat /sys/devices/system/cpu/online; wc -l < /proc/swaps").split(),
                         ["0", "1"])
        self.assertEqual(self.c.sh(a, "cat /sys/devices/system/cpu/online").strip(), "0")
        self.assertEqual(int(self.c.sh(a, "cat %s" % LIMIT)), 256 * MIB)
        # no cgroup but its own: no other dir at any hierarchy root, only its own processes
        listing = self.c.sh(a, "find /sys/fs/cgroup -mindepth 1 -maxdepth 2 -type d")
        self.assertNotIn("slot-", listing)
        self.assertNotIn("moat-", listing)
        procs_dir = os.path.dirname(LIMIT)
        # read both at once, in one process: every pid the view lists is one of the sandbox's
        out = self.c.sh(a, "python3 -c \"import os; p = open('%s/cgroup.procs').read().split(); "
                           "mine = [x for x in os.listdir('/proc') if x.isdigit()]; "
                           "print(len(p), len(set(p) - set(mine)))\"" % procs_dir).split()
        self.assertGreater(int(out[0]), 0, "empty cgroup.procs")
        self.assertEqual(out[1], "0", "cgroup.procs lists a pid the sandbox does not have")
        other = self.c.request("GET", "/v1/sandboxes/%s/processes" % b)[1]
        self.assertTrue(any(p.get("tag") == "other" for p in other.get("processes", [])), other)
        hb = self.daemon.sandbox_host(b)
        hb_dirs = moatd.pid_cgroup_dirs(hb["pid"])
        self.assertTrue(hb_dirs)
        names = {os.path.basename(d) for d in hb_dirs}
        for n in names:
            self.assertNotIn(n, listing)

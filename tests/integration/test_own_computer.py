"""test_own_computer.py -- a sandbox sees its own computer: nproc, os.cpu_count() and
sched_getaffinity and /sys/devices/system/cpu/online report its cpu limit rounded up (its init is
pinned to that many of moatd's CPUs, round robin by slot, the cfs quota staying the limit; the
online list is a file of moatd's read-only share bound over sysfs's, as are /proc/cpuinfo, cut to
that many processors, and an empty /proc/swaps). /sys/fs/cgroup holds the
sandbox's own cgroups, read-only, each the root of what it shows (the cgroup namespace): the limits
a runtime sizes itself from are there. df lists the sandbox's own filesystems only: the share and
the guest channel's tmpfs have no size (f_blocks 0), and mountinfo names no path of the host's.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
import moatd  # noqa: E402
from moattest import DaemonTest  # noqa: E402

HOST_CPUS = len(os.sched_getaffinity(0))
HYBRID = os.path.isdir("/sys/fs/cgroup/memory")
HOST_CPUSET = os.path.isdir("/sys/fs/cgroup/cpuset") if HYBRID else None  # (v2: cpuset may not be delegated)
MIB = 1 << 20
PY_CPUS = "import os; print(os.cpu_count(), len(os.sched_getaffinity(0)))"


class OwnComputerTest(DaemonTest):
    pool = 1

    def cpus(self, sid):
        nproc = int(self.c.sh(sid, "nproc").strip())
        count, affinity = (int(x) for x in self.c.sh(sid, "python3 -c '%s'" % PY_CPUS).split())
        return nproc, count, affinity

    def test_nproc_is_cpu_rounded_up(self):
        for cpu in (0.5, 1, 1.5, 2):
            want = int(min(HOST_CPUS, -(-cpu // 1)))
            sid = self.sandbox(memory_mb=512, cpu=cpu)["id"]
            nproc, count, affinity = self.cpus(sid)
            self.assertEqual(nproc, want, cpu)
            self.assertEqual(affinity, want, cpu)
            self.assertEqual(count, want, cpu)  # sysconf(_SC_NPROCESSORS_ONLN): cpu/online
            online = self.c.sh(sid, "cat /sys/devices/system/cpu/online").strip()
            self.assertEqual(online, "0" if want == 1 else "0-%d" % (want - 1), cpu)
            self.assertEqual(int(self.c.sh(sid, "grep -c ^processor /proc/cpuinfo")), want, cpu)
            self.assertEqual(self.c.sh(sid, "grep -E '^(siblings|cpu cores)' /proc/cpuinfo | sort -u | "
                                            "awk -F: '{print $2}' | sort -u").split(), [str(want)], cpu)
            self.assertEqual(self.c.sh(sid, "wc -l < /proc/swaps").strip(), "1", cpu)  # the header alone
            r = self.c.exec(sid, cmd="echo 0-63 > /sys/devices/system/cpu/online")
            self.assertNotEqual(r["exit_code"], 0, r)
            self.assertIn("Read-only", r["stderr"], r)

    def test_affinity_cannot_widen_beyond_the_cpus(self):
        """sched_setaffinity to every CPU from inside: the slot's cpuset keeps the sandbox on its
        own CPUs (nproc stays cpu rounded up); without a cpuset the mask would widen."""
        if HOST_CPUS < 2:
            self.skipTest("one CPU: nothing to widen to")
        sid = self.sandbox(memory_mb=512, cpu=1)["id"]
        if HYBRID and not HOST_CPUSET:
            self.skipTest("no v1 cpuset hierarchy on this host")
        if not HYBRID and self.c.sh(sid, "test -e /sys/fs/cgroup/cpuset.cpus && echo y || echo n").strip() == "n":
            self.skipTest("cpuset is not delegated to moat's cgroups on this v2 host")
        widen = "import os\ntry:\n    os.sched_setaffinity(0, range(%d))\nexcept OSError:\n    pass\n" \
                "print(len(os.sched_getaffinity(0)))\n" % HOST_CPUS
        self.c.put_file(sid, "/tmp/widen.py", widen.encode())
        out = self.c.sh(sid, "python3 /tmp/widen.py")
        self.assertEqual(out.strip(), "1", out)
        self.assertEqual(self.c.sh(sid, "taskset -c 0-%d nproc 2>/dev/null || nproc" % (HOST_CPUS - 1)).strip(), "1")

    def test_fork_and_wake_keep_the_view(self):
        ck = self.c.request("GET", "/healthz")[1].get("checkpoints") or {}
        if not ck.get("available"):
            self.skipTest("no checkpoints here: %s" % ck.get("criu"))
        sid = self.sandbox(memory_mb=512, cpu=1)["id"]
        self.c.exec(sid, cmd="sleep 600", background=True, expect=201)
        out = self.c.request("POST", "/v1/sandboxes/%s/fork" % sid, body={"count": 1}, expect=201,
                             timeout=300)[1]
        kid = out["sandboxes"][0]["id"]
        self.addCleanup(self._delete_quietly, self.c, kid)
        both = "cat /sys/devices/system/cpu/online; nproc; grep -c ^processor /proc/cpuinfo"
        self.assertEqual(self.c.sh(kid, both).split(), ["0", "1", "1"])
        self.c.request("POST", "/v1/sandboxes/%s/hibernate" % sid, body={}, expect=200, timeout=300)
        self.assertEqual(self.c.sh(sid, both).split(), ["0", "1", "1"])

    def test_cgroup_files(self):
        sid = self.sandbox(memory_mb=512, cpu=1, pids=300)["id"]
        sh = lambda cmd: self.c.sh(sid, cmd).strip()  # noqa: E731
        self.assertEqual(sh("cat /proc/self/cgroup | cut -d: -f3 | sort -u"), "/")
        if HYBRID:
            want = ["cpu", "cpuacct", "memory", "pids", "unified"] + (["cpuset"] if HOST_CPUSET else [])
            self.assertEqual(sorted(sh("ls /sys/fs/cgroup").split()), sorted(want))
            self.assertEqual(int(sh("cat /sys/fs/cgroup/memory/memory.limit_in_bytes")), 512 * MIB)
            self.assertEqual(sh("cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us /sys/fs/cgroup/cpu/cpu.cfs_period_us").split(),
                             ["100000", "100000"])
            self.assertEqual(sh("cat /sys/fs/cgroup/pids/pids.max"), "300")
            self.assertGreater(int(sh("cat /sys/fs/cgroup/memory/memory.usage_in_bytes")), 0)
            self.assertGreater(int(sh("cat /sys/fs/cgroup/cpuacct/cpuacct.usage")), 0)
        else:
            self.assertEqual(int(sh("cat /sys/fs/cgroup/memory.max")), 512 * MIB)
            self.assertEqual(sh("cat /sys/fs/cgroup/cpu.max"), "100000 100000")
            self.assertEqual(sh("cat /sys/fs/cgroup/pids.max"), "300")
            self.assertGreater(int(sh("cat /sys/fs/cgroup/memory.current")), 0)
        # mountinfo names each as the root of its hierarchy (the JVM and libuv match it with /proc/self/cgroup)
        roots = sh("awk '$5 ~ \"^/sys/fs/cgroup/\" && $9 ~ /^cgroup/ {print $4}' /proc/self/mountinfo | sort -u")
        self.assertEqual(roots, "/")

    def test_df_shows_the_sandbox_filesystems_only(self):
        sid = self.sandbox(memory_mb=512, cpu=1)["id"]
        sh = lambda cmd, **kw: self.c.sh(sid, cmd, **kw)  # noqa: E731
        # df -P: "Filesystem 1024-blocks Used Available Capacity Mounted on"; without -a, df lists
        # what has blocks (statfs f_blocks > 0), one line per device
        own = {"/": ("overlay",), "/dev": ("tmpfs",), "/dev/shm": ("shm", "tmpfs"), "/run": ("tmpfs",),
               "/sys/fs/cgroup": ("tmpfs", "cgroup", "cgroup2")}
        for flags in ("-P", "-hP", "-P -x tmpfs", "-P -T"):
            rows = [line.split() for line in sh("df %s" % flags).splitlines()[1:]]
            self.assertTrue(rows, flags)
            for row in rows:
                fs, target = row[0], row[-1]
                self.assertIn(target, own, (flags, row))
                self.assertIn(fs, own[target], (flags, row))
            self.assertIn("/", [r[-1] for r in rows], flags)
        # df -a lists every mount: none is of a block device (the host's disk)
        for line in sh("df -aP").splitlines()[1:]:
            row = line.split()
            self.assertFalse(row[0].startswith("/dev/"), row)  # a block device: the host's disk
        mountinfo = sh("cat /proc/self/mountinfo")
        for host_path in (os.path.realpath(self.daemon.data_dir), os.path.realpath(moatd.guest_bin()),
                          "/run/moat/chan", "/run/moat/channels", "/var/tmp", " /work/"):
            self.assertNotIn(host_path, mountinfo)
        for line in mountinfo.splitlines():  # the sandbox's mounts are of no block device
            fields = line.split()
            source = fields[fields.index("-") + 2]
            self.assertFalse(source.startswith("/dev/"), line)
        # the devices still work (open /dev/tty: ENXIO without a controlling terminal)
        self.assertEqual(sh("head -c 5 /dev/zero | od -An -tx1").split(), ["00"] * 5)
        self.assertEqual(sh("head -c 16 /dev/urandom | wc -c").strip(), "16")
        self.assertEqual(sh("head -c 16 /dev/random | wc -c").strip(), "16")
        self.assertEqual(sh("echo x > /dev/null; wc -c < /dev/null").strip(), "0")
        r = self.c.exec(sid, argv=["python3", "-c", "import os\nfd = os.open('/dev/full', os.O_WRONLY)\ntry:\n"
                                   " os.write(fd, b'x')\nexcept OSError as e:\n print(e.errno)"])
        self.assertEqual(r["stdout"].strip(), "28", r)  # ENOSPC
        r = self.c.exec(sid, argv=["python3", "-c", "import os\ntry:\n os.open('/dev/tty', os.O_RDWR)\n"
                                   "except OSError as e:\n print(e.errno)"])
        self.assertEqual(r["stdout"].strip(), "6", r)  # ENXIO
        # root inside can neither write nor remount them read-write; the host's copies stay as they were
        before = {p: os.stat(p) for p in ("/dev/null", "/dev/zero", "/dev/urandom")}
        for cmd in ("echo 0-63 > /sys/devices/system/cpu/online", "echo x >> /proc/cpuinfo",
                    "echo x >> /proc/swaps", "mount -o remount,rw /proc/cpuinfo",
                    "mount -o remount,rw /proc/swaps", "mount -o remount,rw /sys/devices/system/cpu/online",
                    "mount -o remount,rw /run/moat/moat-guest", "echo x >> /run/moat/moat-guest",
                    "mount -o remount,rw /dev/null", "mount -o remount,rw,bind /dev/null",
                    "rm -f /dev/null", "mknod /dev/x c 1 3", "touch /run/moat/.sock/x",
                    "mkdir /run/moat/.sock/d", "chmod 666 /dev/null"):
            r = self.c.exec(sid, cmd=cmd, user="root")
            self.assertNotEqual(r["exit_code"], 0, (cmd, r))
        for p, st in before.items():
            now = os.stat(p)
            self.assertEqual((now.st_mode, now.st_rdev, now.st_uid), (st.st_mode, st.st_rdev, st.st_uid), p)
        self.assertEqual(sh("stat -c %a /dev/null"), "666\n")
        self.assertEqual(sh("wc -l < /proc/swaps").strip(), "1")
        self.assertEqual(sh("cat /sys/devices/system/cpu/online").strip(), "0")


class LxcfsTest(DaemonTest):
    """moatd --lxcfs DIR: /proc/meminfo, stat, uptime and loadavg come from a (private) lxcfs, which
    answers each reader from its own cgroups: free and /proc/meminfo say memory_mb and follow its
    use, uptime counts from the sandbox's start; a fork's child keeps them (external mounts)."""

    pool = 0
    lxcfs = None

    @classmethod
    def setUpClass(cls):
        if not shutil.which("lxcfs") or not os.path.exists("/dev/fuse"):
            raise unittest.SkipTest("no lxcfs or /dev/fuse here")
        cls.lx_dir = tempfile.mkdtemp(prefix="moat-lxcfs-")
        cls.lxcfs = subprocess.Popen(["lxcfs", "-f", "-l", "--enable-cfs", "-p", cls.lx_dir + ".pid", cls.lx_dir],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 20
        while not os.path.exists(os.path.join(cls.lx_dir, "proc", "meminfo")):
            if time.time() > deadline or cls.lxcfs.poll() is not None:
                cls._stop_lxcfs()
                raise RuntimeError("lxcfs did not come up")
            time.sleep(0.05)
        cls.daemon = moatd.MoatDaemon(pool=cls.pool, extra_args=("--lxcfs", cls.lx_dir))
        try:
            cls.daemon.start()
        except Exception:
            cls.daemon.stop()
            cls._stop_lxcfs()
            raise
        cls.c = cls.daemon.client

    @classmethod
    def _stop_lxcfs(cls):
        if cls.lxcfs is not None and cls.lxcfs.poll() is None:
            cls.lxcfs.terminate()
            try:
                cls.lxcfs.wait(10)
            except subprocess.TimeoutExpired:
                cls.lxcfs.kill()
                cls.lxcfs.wait()
        if os.path.ismount(cls.lx_dir):  # lxcfs unmounts itself when it ends
            subprocess.run(["umount", "-l", cls.lx_dir], stderr=subprocess.DEVNULL)
        try:
            os.rmdir(cls.lx_dir)
            os.unlink(cls.lx_dir + ".pid")
        except OSError:
            pass

    @classmethod
    def tearDownClass(cls):
        try:
            super().tearDownClass()
        finally:
            cls._stop_lxcfs()

    def test_meminfo_uptime_loadavg_stat(self):
        sid = self.sandbox(memory_mb=512, cpu=1)["id"]
        sh = lambda cmd: self.c.sh(sid, cmd).strip()  # noqa: E731
        self.assertEqual(sh("awk '/^MemTotal:/ {print $2}' /proc/meminfo"), str(512 * 1024))
        self.assertEqual(sh("free -m | awk '/^Mem:/ {print $2}'"), "512")
        with open("/proc/uptime") as f:
            host_up = float(f.read().split()[0])
        up = float(sh("cut -d' ' -f1 /proc/uptime"))
        self.assertLess(up, min(120, host_up - 1), "uptime is the machine's")
        self.assertRegex(sh("cat /proc/loadavg"), r"^\d+\.\d\d \d+\.\d\d \d+\.\d\d \d+/\d+ \d+$")
        # lxcfs's stat counts the cpuset's CPUs: the slot's own where moat has a cpuset
        ncpu = int(sh("grep -c '^cpu[0-9]' /proc/stat"))
        if HOST_CPUSET:
            self.assertEqual(ncpu, 1)
        else:
            self.assertGreaterEqual(ncpu, 1)
        # a 300 MB process shows in the sandbox's own used memory
        self.c.exec(sid, cmd="python3 -c \"b = b'x' * (300 << 20); import time; time.sleep(600)\"",
                    background=True, expect=201)
        deadline = time.time() + 30
        while time.time() < deadline:
            avail = int(sh("awk '/^MemAvailable:/ {print $2}' /proc/meminfo"))
            if avail < 256 * 1024:
                break
            time.sleep(0.2)
        self.assertLess(avail, 256 * 1024, "MemAvailable does not follow the sandbox's use")
        r = self.c.exec(sid, cmd="echo x > /proc/meminfo")
        self.assertNotEqual(r["exit_code"], 0, r)

    def test_fork_keeps_lxcfs(self):
        ck = self.c.request("GET", "/healthz")[1].get("checkpoints") or {}
        if not ck.get("available"):
            self.skipTest("no checkpoints here: %s" % ck.get("criu"))
        sid = self.sandbox(memory_mb=512, cpu=1)["id"]
        out = self.c.request("POST", "/v1/sandboxes/%s/fork" % sid, body={"count": 1}, expect=201,
                             timeout=300)[1]
        kid = out["sandboxes"][0]["id"]
        self.addCleanup(self._delete_quietly, self.c, kid)
        self.assertEqual(self.c.sh(kid, "awk '/^MemTotal:/ {print $2}' /proc/meminfo").strip(), str(512 * 1024))


def _proc_status(pid):
    with open("/proc/%d/status" % pid) as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


class LxcfsAutoTest(DaemonTest):
    """Plain moatd (--lxcfs auto, the default) finds the machine's lxcfs or starts one at
    /run/moat/lxcfs.d/mnt, left running for the next moatd: sandboxes see their own memory and
    uptime with no flag. The daemons run in a mount namespace of the test's own, with an empty
    tmpfs on /run/moat/lxcfs.d, so the lxcfs they start is the test's alone (it sits in the test
    daemon's cgroup, whose cleanup ends it) and the machine's is never touched."""

    pool = 0
    HOME = "/run/moat/lxcfs.d"

    @classmethod
    def setUpClass(cls):
        if not shutil.which("lxcfs") or not os.path.exists("/dev/fuse"):
            raise unittest.SkipTest("no lxcfs or /dev/fuse here")
        # moatd starts with SIGINT and SIGQUIT ignored, as `moatd &` from a script does, and 32 (glibc's
        # reserved SIGCANCEL, which its sigaction() will not reset), as make test's environment once had
        import signal
        cls.daemon = moatd.MoatDaemon(pool=cls.pool, extra_args=("--lxcfs", "auto"), private_tmpfs=(cls.HOME,),
                                      ignore_signals=(signal.SIGINT, signal.SIGQUIT, 32))
        try:
            cls.daemon.start()
        except Exception:
            cls.daemon.stop()
            raise
        cls.c = cls.daemon.client
        cls.root = "/proc/%d/root" % cls.daemon.proc.pid  # the daemon's mount namespace

    def lxcfs_pid(self):
        """The pid of the lxcfs moatd started, or None when it adopted Debian's service's."""
        if "lxcfs at /var/lib/lxcfs" in self.daemon.log_tail(400):
            return None
        with open(self.root + self.HOME + "/pid") as f:
            return int(f.read().split()[0])

    def test_sandbox_sees_its_own_memory_without_flags(self):
        sid = self.sandbox(memory_mb=512, cpu=1)["id"]
        self.assertEqual(self.c.sh(sid, "awk '/^MemTotal:/ {print $2}' /proc/meminfo").strip(), str(512 * 1024))
        with open("/proc/uptime") as f:
            host_up = float(f.read().split()[0])
        self.assertLess(float(self.c.sh(sid, "cut -d' ' -f1 /proc/uptime").strip()), min(120, host_up - 1))
        self.assertRegex(self.daemon.log_tail(400), r"lxcfs at (/run/moat/lxcfs\.d/mnt|/var/lib/lxcfs)")

    def test_started_lxcfs_is_detached_with_default_signals(self):
        pid = self.lxcfs_pid()
        if pid is None:
            self.skipTest("this machine runs Debian's lxcfs service: moatd adopted it")
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            argv = f.read().split(b"\0")
        self.assertTrue(argv[0].endswith(b"lxcfs"), argv)
        self.assertIn((self.HOME + "/mnt").encode(), argv)
        st = _proc_status(pid)
        self.assertEqual(int(st["SigIgn"], 16), 0, "lxcfs inherited moatd's ignored signals")
        self.assertEqual(int(st["SigBlk"], 16), 0)
        self.assertNotEqual(int(st["PPid"]), self.daemon.proc.pid, "lxcfs is moatd's child: it would be reaped")
        # a session of its own (its launcher led it and exited: lxcfs can take no terminal)
        self.assertNotEqual(os.getsid(pid), os.getsid(self.daemon.proc.pid), "lxcfs is in moatd's session")
        self.assertEqual(os.getpgid(pid), os.getsid(pid))

    def test_second_moatd_adopts_it_and_it_outlives_moatd(self):
        pid = self.lxcfs_pid()
        if pid is None:
            self.skipTest("this machine runs Debian's lxcfs service: moatd adopted it")
        second = moatd.MoatDaemon(pool=0, extra_args=("--lxcfs", "auto"),
                                  mountns="/proc/%d/ns/mnt" % self.daemon.proc.pid)
        try:
            second.start()
            c2 = second.client
            st, body = c2.request("POST", "/v1/sandboxes", body={"template": "base", "memory_mb": 256}, expect=201)
            sid = body["id"]
            self.assertEqual(c2.sh(sid, "awk '/^MemTotal:/ {print $2}' /proc/meminfo").strip(), str(256 * 1024))
            self.assertIn("lxcfs at %s/mnt" % self.HOME, second.log_tail(400))
            with open(self.root + self.HOME + "/pid") as f:
                self.assertEqual(int(f.read().split()[0]), pid, "a second lxcfs was started")
        finally:
            second.stop()
        os.kill(pid, 0)  # still running after that moatd ended

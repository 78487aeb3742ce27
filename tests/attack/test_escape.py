"""test_escape.py -- from inside a sandbox, try to reach the host: its files (directly, through /proc,
through `..` and symlinks in the files API), its processes, /proc/sys and /sys, mounts, kernel
modules, dangerous syscalls, device nodes and the network. Each attempt must fail, for the right
reason."""

import os
import shutil
import subprocess
import sys
import tempfile
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
from moattest import DaemonTest  # noqa: E402

DENIED = ("EPERM", "EACCES", "EROFS")


class EscapeTest(DaemonTest):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        # a secret on the host, in a directory no sandbox should ever see
        cls.secret_dir = tempfile.mkdtemp(prefix="moat-secret-", dir="/var/tmp")
        cls.secret_name = "host-secret-%s.txt" % uuid.uuid4().hex[:12]
        cls.secret = "HOSTSECRET-" + uuid.uuid4().hex
        with open(os.path.join(cls.secret_dir, cls.secret_name), "w") as f:
            f.write(cls.secret)
        cls.secret_path = os.path.join(cls.secret_dir, cls.secret_name)
        sb = cls.c.create(ttl_seconds=3600)
        cls.sid = sb["id"]
        import probe
        probe.install(cls.c, cls.sid)
        cls.c.sh(cls.sid, "echo sandbox-own > /sandbox-marker")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.secret_dir, ignore_errors=True)
        super().tearDownClass()

    def run_(self, *args, **kw):
        return self.probe(self.sid, *args, **kw)

    # -- host files --
    def test_host_file_not_reachable_from_inside(self):
        for path in (self.secret_path, "/proc/1/root" + self.secret_path, "/host" + self.secret_path,
                     "/proc/self/root" + self.secret_path, "/../../.." + self.secret_path):
            with self.subTest(path=path):
                r = self.run_("read", path)
                # PID 1 is out of reach altogether (non-dumpable): its root is EACCES, not a way in
                self.assertEqual(r.errno, "EACCES" if path.startswith("/proc/1/") else "ENOENT", r)
        out = self.c.exec(self.sid, cmd="find / -name '%s' 2>/dev/null; grep -rl '%s' /tmp /root /var /proc/1/root/var "
                                        "2>/dev/null; true" % (self.secret_name, self.secret), timeout_ms=120000)
        self.assertNotIn(self.secret_name, out["stdout"])
        self.assertEqual(out["stdout"].strip(), "")
        # the chroot-and-climb escape stays inside the sandbox
        r = self.c.exec(self.sid, cmd="/tmp/moat-probe sys chroot_escape; ls /work /var/tmp 2>&1; cat /sandbox-marker")
        self.assertIn("sandbox-own", r["stdout"])
        self.assertNotIn(os.path.basename(self.secret_dir), r["stdout"])

    def test_host_file_not_reachable_through_files_api(self):
        paths = [self.secret_path, "../../../../../../.." + self.secret_path, "/../../.." + self.secret_path,
                 "/proc/1/root" + self.secret_path, "/tmp/../../../.." + self.secret_path]
        for p in paths:
            with self.subTest(path=p):
                # the guest's own workers cannot enter PID 1's root either: 403 there
                status, code = (403, "forbidden") if p.startswith("/proc/1/") else (404, "not_found")
                self.assertApiError(status, code, self.c.get_file, self.sid, p)
                self.assertApiError(status, code, self.c.stat, self.sid, p)

    def test_symlink_escapes_through_files_api(self):
        self.c.sh(self.sid, "ln -sfn / /tmp/to-root; ln -sfn ../../../../../../.. /tmp/up; "
                            "mkdir -p /tmp/d; ln -sfn ../../../../../.. /tmp/d/up2")
        for link in ("/tmp/to-root", "/tmp/up", "/tmp/d/up2"):
            with self.subTest(link=link):
                self.assertApiError(404, "not_found", self.c.get_file, self.sid, link + self.secret_path)
                # through the link one sees the sandbox's own root, never the host's
                ents = {e["name"] for e in self.c.list_files(self.sid, link + "/")["entries"]}
                self.assertIn("sandbox-marker", ents)
                self.assertNotIn("work", ents)
                self.assertEqual(self.c.get_file(self.sid, link + "/sandbox-marker"), b"sandbox-own\n")
                # writing through the link lands inside the sandbox
                self.c.put_file(self.sid, link + "/tmp/written-through-link", b"x")
                self.assertFalse(os.path.exists("/tmp/written-through-link"))
                self.assertEqual(self.c.sh(self.sid, "cat /tmp/written-through-link"), "x")
        # a symlink to the host path itself
        self.c.sh(self.sid, "ln -sfn %s /tmp/direct" % self.secret_path)
        self.assertApiError(404, "not_found", self.c.get_file, self.sid, "/tmp/direct")
        # moving onto a path outside stays inside too
        self.c.put_file(self.sid, "/tmp/mv-src", b"moved")
        self.c.move(self.sid, "/tmp/mv-src", "/tmp/up/tmp/mv-dst")
        self.assertEqual(self.c.sh(self.sid, "cat /tmp/mv-dst"), "moved")

    # -- host processes --
    def test_host_processes_invisible(self):
        tag = "31337.%d" % os.getpid()
        host_sleeper = subprocess.Popen(["sleep", tag])
        self.addCleanup(host_sleeper.wait)
        self.addCleanup(host_sleeper.kill)
        out = self.c.sh(self.sid, "for p in /proc/[0-9]*; do echo \"${p#/proc/} $(cat $p/comm 2>/dev/null) "
                                  "$(tr '\\0' ' ' < $p/cmdline 2>/dev/null)\"; done")
        lines = [ln for ln in out.splitlines() if ln.strip()]
        self.assertNotIn(tag, out)
        self.assertNotIn("moatd", out)
        self.assertNotIn("python", out)
        self.assertLess(len(lines), 12, out)
        pid1 = [ln for ln in lines if ln.startswith("1 ")]
        self.assertTrue(pid1 and "moat-guest" in pid1[0], out)
        # our own pid is not a process there (or, if the number exists, it is not us)
        r = self.run_("kill", os.getpid(), 0)
        self.assertEqual(r.errno, "ESRCH", r)
        r = self.run_("read", "/proc/%d/cmdline" % host_sleeper.pid)
        if r.ok:
            self.assertNotIn(tag, r.rest)
        else:
            self.assertEqual(r.errno, "ENOENT", r)

    # -- /proc/sys, /sys, sysrq --
    def test_proc_sys_and_sys_not_writable(self):
        with open("/proc/sys/kernel/hostname") as f:
            host_name = f.read().strip()
        with open("/sys/kernel/mm/ksm/run") as f:
            ksm = f.read().strip()
        cases = [("/proc/sys/kernel/hostname", "pwned"), ("/proc/sys/vm/drop_caches", "1"),
                 ("/proc/sys/kernel/core_pattern", "|/tmp/pwn"), ("/proc/sys/kernel/modprobe", "/tmp/pwn"),
                 ("/proc/sysrq-trigger", "h"), ("/sys/kernel/mm/ksm/run", ksm),
                 ("/sys/fs/cgroup/cgroup.procs", "1"), ("/sys/kernel/profiling", "1")]
        for path, data in cases:
            with self.subTest(path=path):
                r = self.run_("write", path, data)
                self.assertFalse(r.ok, r)
                if os.path.exists(path):  # present on the host: inside it is read-only or masked
                    self.assertIn(r.errno, DENIED + (("ENOENT",) if path.startswith("/sys") else ()), r)
                else:
                    self.assertIn(r.errno, DENIED + ("ENOENT",), r)
        with open("/proc/sys/kernel/hostname") as f:
            self.assertEqual(f.read().strip(), host_name)
        with open("/proc/sys/kernel/core_pattern") as f:
            self.assertNotIn("/tmp/pwn", f.read())
        # masked files give nothing away
        for path in ("/proc/kcore", "/proc/keys", "/proc/timer_list"):
            with self.subTest(masked=path):
                r = self.c.exec(self.sid, cmd="head -c 64 %s 2>/dev/null | wc -c" % path)
                self.assertEqual(r["stdout"].strip(), "0", r)
        r = self.c.exec(self.sid, cmd="ls -A /sys/firmware 2>/dev/null | wc -l")
        self.assertEqual(r["stdout"].strip(), "0", r)

    # -- mounts, namespaces, modules, syscalls --
    def test_mount_and_unshare_denied(self):
        before = open("/proc/self/mountinfo").read()
        for name in ("mount_tmpfs", "mount_proc", "umount_proc", "pivot_root"):
            with self.subTest(sys=name):
                r = self.run_("sys", name)
                self.assertEqual(r.errno, "EPERM", r)
        for ns in ("mnt", "user", "net", "pid", "uts", "cgroup"):
            with self.subTest(unshare=ns):
                r = self.run_("unshare", ns)
                self.assertEqual(r.errno, "EPERM", r)
        r = self.c.exec(self.sid, cmd="mount -t tmpfs none /mnt 2>&1; echo rc=$?")
        self.assertNotIn("rc=0", r["stdout"])
        r = self.c.exec(self.sid, cmd="unshare -m true 2>&1; echo rc=$?")
        self.assertNotIn("rc=0", r["stdout"])
        after = open("/proc/self/mountinfo").read()
        self.assertEqual(before.count("tmpfs"), after.count("tmpfs"))

    def test_modules_denied(self):
        for name in ("init_module", "finit_module", "delete_module"):
            with self.subTest(sys=name):
                r = self.run_("sys", name)
                self.assertEqual(r.errno, "EPERM", r)
        r = self.c.exec(self.sid, cmd="insmod /nonexistent.ko 2>&1; modprobe dummy 2>&1; echo rc=$?")
        self.assertNotIn("rc=0", r["stdout"])

    def test_dangerous_syscalls_denied(self):
        for name in ("keyctl", "add_key", "request_key", "bpf", "ptrace", "ptrace_init", "perf_event_open",
                     "userfaultfd", "kexec_load", "open_by_handle_at", "swapon", "syslog"):
            with self.subTest(sys=name):
                r = self.run_("sys", name)
                self.assertEqual(r.errno, "EPERM", r)
        self.assertAlive(self.sid)

    def test_more_syscalls_denied(self):
        """io_uring, terminal input injection and new user namespaces are refused by seccomp;
        clone3 answers ENOSYS so that libc falls back to clone, whose flags the filter can see."""
        for name, want in (("io_uring_setup", "EPERM"), ("tiocsti", "EPERM"), ("clone_newuser", "EPERM"),
                           ("clone3", "ENOSYS")):
            with self.subTest(sys=name):
                r = self.run_("sys", name)
                self.assertEqual(r.errno, want, r)
        self.assertAlive(self.sid)

    def test_capabilities_bounded(self):
        """Root inside keeps no capability that reaches past its own namespaces or makes devices."""
        r = self.c.exec(self.sid, cmd="grep -E '^Cap(Bnd|Eff|Prm)' /proc/self/status")
        caps = dict(line.split(":\t") for line in r["stdout"].strip().splitlines())
        for name in ("CapBnd", "CapEff", "CapPrm"):
            v = int(caps[name].strip(), 16)
            for bit, cap in ((21, "CAP_SYS_ADMIN"), (16, "CAP_SYS_MODULE"), (27, "CAP_MKNOD"), (13, "CAP_NET_RAW"),
                             (17, "CAP_SYS_RAWIO"), (19, "CAP_SYS_PTRACE"), (25, "CAP_SYS_TIME"),
                             (12, "CAP_NET_ADMIN")):
                self.assertFalse(v & (1 << bit), "%s has %s (%s)" % (name, cap, caps[name]))

    def test_masked_proc_paths(self):
        """Kernel memory, keys and timers are masked; /proc/sys is read-only."""
        r = self.c.exec(self.sid, cmd="for f in /proc/kcore /proc/keys /proc/timer_list /proc/kallsyms; do "
                                      "[ -e $f ] && printf '%s %s\\n' $f $(head -c 4096 $f | wc -c); done; "
                                      "echo 1 > /proc/sys/vm/drop_caches 2>&1; echo rc=$?")
        for line in r["stdout"].splitlines():
            if line.startswith("/proc/"):
                path, n = line.split()
                self.assertEqual(n, "0", "%s is readable inside: %s bytes" % (path, n))
        self.assertIn("Read-only file system", r["stdout"] + r["stderr"])
        self.assertNotIn("rc=0", r["stdout"])

    def test_device_nodes_denied(self):
        for args in (("/tmp/sda", "b", 8, 0), ("/tmp/mem", "c", 1, 1), ("/tmp/kmsg", "c", 1, 11)):
            with self.subTest(node=args[0]):
                r = self.run_("mknod", *args)
                self.assertEqual(r.errno, "EPERM", r)
        r = self.run_("read", "/dev/sda")
        self.assertIn(r.errno, ("ENOENT", "EPERM", "EACCES"), r)
        r = self.run_("read", "/dev/mem")
        self.assertIn(r.errno, ("ENOENT", "EPERM", "EACCES"), r)

    # -- network: loopback only --
    def test_no_route_out(self):
        for ip in ("10.0.0.1", "169.254.169.254"):
            with self.subTest(ip=ip):
                r = self.run_("connect", ip, 80)
                self.assertEqual(r.errno, "ENETUNREACH", r)
                self.assertLess(float(r.fields["ms"]), 1000)
        # the daemon's port on the host's loopback is not the sandbox's loopback
        r = self.run_("connect", "127.0.0.1", self.daemon.port)
        self.assertEqual(r.errno, "ECONNREFUSED", r)
        out = self.c.sh(self.sid, "cat /proc/net/dev")
        ifaces = [ln.split(":")[0].strip() for ln in out.splitlines()[2:]]
        self.assertEqual(ifaces, ["lo"], out)


"""moatd.py -- start a real moatd on a free loopback port with a temporary data dir, and talk to it.

Like redis's start_server: MoatDaemon(...) starts build/moatd (MOAT_BUILD) with
  --listen 127.0.0.1:PORT --data-dir D --template-dir SHARED --pool N
in a cgroup of its own beneath the test's cgroup (so that everything it starts can be found,
accounted and, on failure, killed), waits for GET /healthz, reads D/api-key and hands out a
Client. stop() deletes every sandbox it can still see, stops the daemon (SIGTERM, then SIGKILL)
and removes whatever is left (processes in its cgroups, mounts and loop devices under D, D itself).

SHARED is MOAT_TEST_TEMPLATE_DIR (default /var/tmp/moat-test-templates): built templates shared by
every daemon the tests start; tests/run.py builds `base` there once before the suite.
"""

import atexit
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.abspath(os.path.join(REPO, os.environ.get("MOAT_BUILD", "build")))
TEMPLATE_DIR = os.environ.get("MOAT_TEST_TEMPLATE_DIR", "/var/tmp/moat-test-templates")
HEALTH_TIMEOUT_S = 300
CG_ROOT = "/sys/fs/cgroup"


def moatd_bin():
    return os.path.join(BUILD, "moatd")


def guest_bin():
    # The guest is static and never sanitized: it lives in build/ even for SANITIZE builds.
    p = os.path.join(BUILD, "moat-guest")
    return p if os.path.exists(p) else os.path.join(REPO, "build", "moat-guest")


_libc = None


def _setns(fd, nstype):
    global _libc
    import ctypes
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    if _libc.setns(fd, nstype) != 0:
        e = ctypes.get_errno()
        raise OSError(e, "setns: " + os.strerror(e))


def ignore_signal_raw(sig):
    """SIG_IGN for sig by the rt_sigaction system call (x86_64), which glibc (and so Python) refuses
    for its reserved signals 32 and 33; an exec'd program inherits it unless it resets them itself."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    act = (ctypes.c_ulong * 4)(1, 0, 0, 0)  # handler SIG_IGN, flags, restorer, mask
    if libc.syscall(13, sig, ctypes.byref(act), None, 8) != 0:  # SYS_rt_sigaction
        e = ctypes.get_errno()
        raise OSError(e, "rt_sigaction(%d): %s" % (sig, os.strerror(e)))


CLONE_NEWNET = 0x40000000
CLONE_NEWNS = 0x00020000


def connect_in_netns(netns, host, port, timeout):
    """A TCP connection to host:port made from the network namespace at path netns (this thread
    enters it for the socket() call only and returns to its own)."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(netns, os.O_RDONLY)
    try:
        _setns(target, CLONE_NEWNET)
        try:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        finally:
            _setns(own, CLONE_NEWNET)
    finally:
        os.close(own)
        os.close(target)
    s.settimeout(timeout)
    try:
        s.connect((host, port))
    except OSError:
        s.close()
        raise
    return s


def enter_netns_with_resolv(netns, resolv_conf):
    """For a child before exec: enter the network namespace at netns and, with resolv_conf, a mount
    namespace of its own (mounts propagate into it, none out) where resolv_conf is bind-mounted on
    /etc/resolv.conf."""
    import ctypes
    fd = os.open(netns, os.O_RDONLY)
    _setns(fd, CLONE_NEWNET)
    os.close(fd)
    if resolv_conf:
        libc = ctypes.CDLL(None, use_errno=True)
        MS_BIND, MS_REC, MS_SLAVE = 4096, 16384, 1 << 19
        if libc.unshare(CLONE_NEWNS) != 0 or \
                libc.mount(None, b"/", None, MS_REC | MS_SLAVE, None) != 0 or \
                libc.mount(resolv_conf.encode(), b"/etc/resolv.conf", None, MS_BIND, None) != 0:
            e = ctypes.get_errno()
            raise OSError(e, "mount namespace for resolv.conf: " + os.strerror(e))


def enter_private_tmpfs(paths):
    """For a child before exec: a mount namespace of its own (mounts propagate into it, none out)
    with an empty tmpfs on each of paths, so that what moatd mounts or writes there (the machine's
    lxcfs that --lxcfs auto starts) is the test's alone and ends with it."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    MS_REC, MS_SLAVE = 16384, 1 << 19
    if libc.unshare(CLONE_NEWNS) != 0 or libc.mount(None, b"/", None, MS_REC | MS_SLAVE, None) != 0:
        e = ctypes.get_errno()
        raise OSError(e, "private mount namespace: " + os.strerror(e))
    for p in paths:
        os.makedirs(p, exist_ok=True)
        if libc.mount(b"tmpfs", p.encode(), b"tmpfs", 0, b"mode=0755,size=16m") != 0:
            e = ctypes.get_errno()
            raise OSError(e, "tmpfs on %s: %s" % (p, os.strerror(e)))


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class HTTPError(Exception):
    def __init__(self, method, path, status, body):
        self.method, self.path, self.status, self.body = method, path, status, body
        super().__init__("%s %s -> %d %r" % (method, path, status, body if not isinstance(body, bytes) else body[:300]))

    @property
    def code(self):
        return self.body.get("code") if isinstance(self.body, dict) else None


class Client:
    """A small client of the v1 API. Methods raise HTTPError unless the status is expected, and
    return (status, body): body is parsed JSON when the response is JSON, else bytes."""

    def __init__(self, port, key, host="127.0.0.1", timeout=600, netns=None):
        self.host, self.port, self.key, self.timeout = host, port, key, timeout
        self.netns = netns  # path of the network namespace moatd listens in (None: this one)

    def with_key(self, key):
        return Client(self.port, key, self.host, self.timeout, self.netns)

    def request(self, method, path, body=None, raw=None, query=None, headers=None, expect=None, auth=True,
                timeout=None):
        if query:
            path += "?" + urllib.parse.urlencode(query, quote_via=urllib.parse.quote)
        h = {}
        if auth and self.key is not None:
            h["Authorization"] = "Bearer " + self.key
        data = raw
        if body is not None:
            data = json.dumps(body).encode() if not isinstance(body, (bytes, str)) else body
            if isinstance(data, str):
                data = data.encode()
            h["Content-Type"] = "application/json"
        if headers:
            h.update(headers)
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout or self.timeout)
        if self.netns:
            conn.sock = connect_in_netns(self.netns, self.host, self.port, timeout or self.timeout)
        try:
            conn.request(method, path, body=data, headers=h)
            resp = conn.getresponse()
            payload = resp.read()
            ctype = resp.getheader("Content-Type", "")
            status = resp.status
        finally:
            conn.close()
        parsed = payload
        if "json" in ctype or (payload[:1] in (b"{", b"[") and "octet" not in ctype):
            try:
                parsed = json.loads(payload)
            except ValueError:
                parsed = payload
        ok = (200 <= status < 300) if expect is None else (status in expect if isinstance(expect, (tuple, list, set)) else status == expect)
        if not ok:
            raise HTTPError(method, path, status, parsed)
        return status, parsed

    # sandboxes
    def create(self, expect=201, **spec):
        return self.request("POST", "/v1/sandboxes", body=spec, expect=expect)[1]

    def get(self, sid, expect=200):
        return self.request("GET", "/v1/sandboxes/" + sid, expect=expect)[1]

    def list(self, state=None, metadata=None, expect=200):
        q = {}
        if state:
            q["state"] = state
        for k, v in (metadata or {}).items():
            q["metadata." + k] = v
        return self.request("GET", "/v1/sandboxes", query=q or None, expect=expect)[1]["sandboxes"]

    def patch(self, sid, expect=200, **fields):
        return self.request("PATCH", "/v1/sandboxes/" + sid, body=fields, expect=expect)[1]

    def delete(self, sid, expect=204):
        return self.request("DELETE", "/v1/sandboxes/" + sid, expect=expect)[0]

    def exec(self, sid, cmd=None, argv=None, expect=200, timeout=None, **kw):
        body = dict(kw)
        if cmd is not None:
            body["cmd"] = cmd
        if argv is not None:
            body["argv"] = argv
        return self.request("POST", "/v1/sandboxes/%s/exec" % sid, body=body, expect=expect, timeout=timeout)[1]

    def sh(self, sid, cmd, **kw):
        """Runs cmd and returns stdout; fails the caller (AssertionError) on a non-zero exit."""
        r = self.exec(sid, cmd=cmd, **kw)
        if r.get("exit_code") != 0:
            raise AssertionError("command %r exited %r: stdout=%r stderr=%r" % (cmd, r.get("exit_code"),
                                                                                r.get("stdout"), r.get("stderr")))
        return r["stdout"]

    # files
    def put_file(self, sid, path, data, mode=None, expect=200, user=None):
        q = {"path": path}
        if mode is not None:
            q["mode"] = mode
        if user:
            q["user"] = user
        return self.request("PUT", "/v1/sandboxes/%s/files" % sid, raw=data, query=q,
                            headers={"Content-Type": "application/octet-stream"}, expect=expect)[1]

    def get_file(self, sid, path, expect=200, user=None):
        q = {"path": path}
        if user:
            q["user"] = user
        return self.request("GET", "/v1/sandboxes/%s/files" % sid, query=q, expect=expect)[1]

    def delete_file(self, sid, path, recursive=False, expect=204):
        q = {"path": path}
        if recursive:
            q["recursive"] = "true"
        return self.request("DELETE", "/v1/sandboxes/%s/files" % sid, query=q, expect=expect)[1]

    def list_files(self, sid, path, depth=1, expect=200):
        return self.request("GET", "/v1/sandboxes/%s/files/list" % sid, query={"path": path, "depth": depth},
                            expect=expect)[1]

    def stat(self, sid, path, expect=200):
        return self.request("GET", "/v1/sandboxes/%s/files/stat" % sid, query={"path": path}, expect=expect)[1]

    def mkdir(self, sid, path, parents=None, expect=201):
        b = {"path": path}
        if parents is not None:
            b["parents"] = parents
        return self.request("POST", "/v1/sandboxes/%s/files/mkdir" % sid, body=b, expect=expect)[1]

    def move(self, sid, src, dst, expect=200):
        return self.request("POST", "/v1/sandboxes/%s/files/move" % sid, body={"from": src, "to": dst},
                            expect=expect)[1]

    def healthz(self):
        return self.request("GET", "/healthz", auth=False, expect=200, timeout=10)[1]


# ---- cgroups: a cgroup of the tests' own for each daemon ----

def _cgroup_mounts():
    """Returns {controller or '' for v2 or 'name=X'} -> mount point, from /proc/self/mountinfo."""
    out = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split()
            sep = parts.index("-")
            fstype, opts = parts[sep + 1], parts[sep + 3]
            mnt = parts[4]
            if fstype == "cgroup2":
                out.setdefault("", mnt)
            elif fstype == "cgroup":
                for o in opts.split(","):
                    if o not in ("rw", "ro", "nosuid", "nodev", "noexec", "relatime", "clone_children", "xattr") \
                            and not o.startswith("release_agent"):
                        out.setdefault(o, mnt)
    return out


def self_cgroup_dirs(pid="self"):
    """The directories of a process's cgroups, one per mounted hierarchy (v1 and v2)."""
    mounts = _cgroup_mounts()
    dirs = []
    with open("/proc/%s/cgroup" % pid) as f:
        for line in f:
            _, ctrls, path = line.rstrip("\n").split(":", 2)
            if ctrls == "":
                mnt = mounts.get("")
            else:
                mnt = None
                for c in ctrls.split(","):
                    mnt = mounts.get(c)
                    if mnt:
                        break
            if mnt and os.path.isdir(mnt + path):
                d = os.path.normpath(mnt + path)
                if d not in dirs:
                    dirs.append(d)
    return dirs


def make_test_cgroup(tag):
    """Creates a child cgroup named tag beneath this process's cgroup in every hierarchy we can
    write. Returns the list of directories made."""
    made = []
    for parent in self_cgroup_dirs():
        if "/systemd" in parent.split(CG_ROOT, 1)[-1][:9]:
            continue  # leave name=systemd to systemd
        d = os.path.join(parent, tag)
        try:
            os.mkdir(d)
        except FileExistsError:
            pass
        except OSError:
            continue
        for f in ("cpuset.cpus", "cpuset.mems"):  # a v1 cpuset child starts empty
            if os.path.exists(os.path.join(d, f)):
                try:
                    with open(os.path.join(parent, f)) as src:
                        val = src.read().strip()
                    with open(os.path.join(d, f), "w") as dst:
                        dst.write(val)
                except OSError:
                    pass
        made.append(d)
    return made


def cgroup_walk(d):
    """Every directory at or below cgroup dir d, deepest first."""
    out = []
    for root, dirs, _ in os.walk(d, topdown=False):
        out.append(root)
    return out


def cgroup_procs(d):
    pids = set()
    for sub in cgroup_walk(d):
        try:
            with open(os.path.join(sub, "cgroup.procs")) as f:
                pids.update(int(x) for x in f.read().split())
        except OSError:
            pass
    return pids


def kill_cgroup_tree(d, exclude=()):
    """SIGKILLs every process in d and below (cgroup.kill on v2 where available)."""
    for _ in range(50):
        pids = cgroup_procs(d) - set(exclude)
        if not pids:
            return True
        for sub in cgroup_walk(d):
            k = os.path.join(sub, "cgroup.kill")
            if not exclude and os.path.exists(k):
                try:
                    with open(k, "w") as f:
                        f.write("1")
                except OSError:
                    pass
        # thaw v1 freezers, or the kill stays pending
        for sub in cgroup_walk(d):
            st = os.path.join(sub, "freezer.state")
            if os.path.exists(st):
                try:
                    with open(st, "w") as f:
                        f.write("THAWED")
                except OSError:
                    pass
            fz = os.path.join(sub, "cgroup.freeze")
            if os.path.exists(fz):
                try:
                    with open(fz, "w") as f:
                        f.write("0")
                except OSError:
                    pass
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.1)
    return not (cgroup_procs(d) - set(exclude))


def remove_cgroup_tree(d):
    for sub in cgroup_walk(d):
        for _ in range(20):
            try:
                os.rmdir(sub)
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.05)


# ---- host-side leak checks ----

def mounts_under(path):
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            if path in line:
                out.append(line.strip())
    return out


def loops_under(path):
    out = []
    for dev in sorted(os.listdir("/sys/block")):
        bf = os.path.join("/sys/block", dev, "loop", "backing_file")
        try:
            with open(bf) as f:
                back = f.read().strip()
        except OSError:
            continue
        if back.startswith(path):
            out.append((dev, back))
    return out


def procs_under(path):
    """Pids whose cwd or root lies under path (as seen from this mount namespace)."""
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        for what in ("cwd", "root"):
            try:
                t = os.readlink("/proc/%s/%s" % (p, what))
            except OSError:
                continue
            if t.startswith(path):
                out.append((int(p), what, t))
    return out


def netns_inodes_in_use():
    """Net namespace inodes held by any process or bind mount on the host."""
    inos = set()
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                inos.add(os.stat("/proc/%s/ns/net" % p).st_ino)
            except OSError:
                pass
    with open("/proc/self/mountinfo") as f:
        for line in f:
            if "net:[" in line:
                inos.add(int(line.split("net:[", 1)[1].split("]", 1)[0]))
    return inos


def find_pids_by_cmdline(tag):
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % p, "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if tag.encode() in cmd:
            out.append(int(p))
    return out


def pid_cgroup_dirs(pid):
    try:
        return self_cgroup_dirs(str(pid))
    except OSError:
        return []


_live = []


def _atexit_stop_all():
    for d in list(_live):
        try:
            d.stop()
        except Exception as e:  # keep cleaning the others
            sys.stderr.write("cleanup of moatd on port %s failed: %s\n" % (d.port, e))


atexit.register(_atexit_stop_all)


class MoatDaemon:
    """A moatd under test. Use start() / stop(), or as a context manager."""

    def __init__(self, pool=2, data_dir=None, extra_args=(), template_dir=None, own_cgroup=True, env=None,
                 disk_overcommit=True, ignore_signals=(), netns=None, resolv_conf=None, private_tmpfs=(),
                 mountns=None):
        self.pool = pool
        # netns: path of a network namespace moatd runs in (the test's own "host" with a fake
        # internet behind its default route); only then does moatd get its default uplink (auto).
        # Everywhere else it gets --net-uplink none unless extra_args name one: a test never
        # masquerades sandboxes out of the real host's default route. Nor does one start the
        # machine's lxcfs (moatd's default, --lxcfs auto) unless extra_args name --lxcfs: the tests
        # that use lxcfs run a private one. resolv_conf: a file moatd
        # sees as /etc/resolv.conf (in a mount namespace of its own; with netns only).
        self.netns = netns
        self.resolv_conf = resolv_conf
        self.private_tmpfs = tuple(private_tmpfs)  # enter_private_tmpfs's paths
        self.mountns = mountns  # path of a mount namespace moatd starts in (another daemon's)
        # Signals moatd starts with ignored (SIG_IGN survives exec), as a shell's `cmd &` leaves
        # SIGINT and SIGQUIT for a background job.
        self.ignore_signals = tuple(ignore_signals)
        # The shared build machines cannot back 10 GiB (the default disk_mb) for every sandbox the
        # suite runs at once: daemons overcommit unless a test (test_disk_full) asks otherwise.
        self.disk_overcommit = disk_overcommit
        self.env = dict(env or {})  # added to (value None: removed from) the test's environment at start()
        self.port = free_port()
        # the database proxy (--db-listen) on a port of its own unless extra_args name one: its
        # default, 127.0.0.1:7432, is the machine's to share
        self.db_port = free_port()
        self.own_data_dir = data_dir is None
        self.data_dir = data_dir or tempfile.mkdtemp(prefix="moat-test-", dir="/var/tmp")
        self.template_dir = template_dir or TEMPLATE_DIR
        self.extra_args = list(extra_args)
        self.proc = None
        self.keys = []  # every key handed out, for cleanup
        self.client = None
        self.cgroups = []
        self.want_cgroup = own_cgroup and os.environ.get("MOAT_TEST_CGROUP", "1") != "0"
        self.log_path = os.path.join(tempfile.gettempdir(), "moatd-test-%d.log" % self.port)
        self._log = None

    # -- lifecycle --
    def start(self, wait=True):
        os.makedirs(self.template_dir, exist_ok=True)
        if self.want_cgroup and not self.cgroups:
            self.cgroups = make_test_cgroup("moat-test-%d-%d" % (os.getpid(), self.port))
        cgs = list(self.cgroups)
        ignore = self.ignore_signals
        netns, resolv_conf, private_tmpfs, mountns = self.netns, self.resolv_conf, self.private_tmpfs, self.mountns

        def enter_cgroup():
            for d in cgs:
                try:
                    with open(os.path.join(d, "cgroup.procs"), "w") as f:
                        f.write(str(os.getpid()))
                except OSError:
                    pass
            for s in ignore:
                if 32 <= s <= 33:
                    ignore_signal_raw(s)
                else:
                    signal.signal(s, signal.SIG_IGN)
            if netns:
                enter_netns_with_resolv(netns, resolv_conf)
            if private_tmpfs:
                enter_private_tmpfs(private_tmpfs)
            if mountns:
                fd = os.open(mountns, os.O_RDONLY)
                _setns(fd, CLONE_NEWNS)
                os.close(fd)

        argv = [moatd_bin(), "--listen", "127.0.0.1:%d" % self.port, "--data-dir", self.data_dir,
                "--template-dir", self.template_dir, "--pool", str(self.pool), "--guest", guest_bin(),
                "--recipes", os.path.join(REPO, "templates")] + \
            (["--disk-overcommit"] if self.disk_overcommit else []) + \
            ([] if self.netns or "--net-uplink" in self.extra_args else ["--net-uplink", "none"]) + \
            ([] if "--lxcfs" in self.extra_args else ["--lxcfs", "none"]) + \
            ([] if "--db-listen" in self.extra_args else ["--db-listen", "127.0.0.1:%d" % self.db_port]) + \
            self.extra_args
        env = dict(os.environ)
        for k, v in self.env.items():
            if v is None:
                env.pop(k, None)
            else:
                env[k] = v
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(argv, cwd=REPO, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, preexec_fn=enter_cgroup, env=env)
        if self not in _live:
            _live.append(self)
        if wait:
            self.wait_healthy()
        return self

    def wait_healthy(self, timeout=HEALTH_TIMEOUT_S):
        deadline = time.time() + timeout
        probe = Client(self.port, None, netns=self.netns)
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("moatd exited with %s; log tail:\n%s%s" % (self.proc.returncode, self.log_tail(),
                                                                             self.lock_holders()))
            try:
                probe.healthz()
                break
            except (OSError, HTTPError, http.client.HTTPException):
                time.sleep(0.05)
        else:
            raise RuntimeError("moatd not healthy after %ds; log tail:\n%s" % (timeout, self.log_tail()))
        key = self.read_key()
        self.client = Client(self.port, key, netns=self.netns)
        if key not in self.keys:
            self.keys.append(key)
        return self.client

    def lock_holders(self):
        """Diagnostics: processes holding an fd on DATA/lock (they keep a restart from starting)."""
        lock = os.path.join(self.data_dir, "lock")
        out = []
        for p in os.listdir("/proc"):
            if not p.isdigit():
                continue
            try:
                fds = os.listdir("/proc/%s/fd" % p)
            except OSError:
                continue
            for fd in fds:
                try:
                    if os.readlink("/proc/%s/fd/%s" % (p, fd)) == lock:
                        with open("/proc/%s/cmdline" % p, "rb") as f:
                            cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
                        with open("/proc/%s/wchan" % p) as f:
                            wchan = f.read()
                        out.append("pid %s fd %s wchan %s cmd %s nfds %d" % (p, fd, wchan, cmd, len(fds)))
                except OSError:
                    pass
        return ("\nholders of %s:\n  " % lock + "\n  ".join(out)) if out else ""

    def read_key(self):
        deadline = time.time() + 30
        path = os.path.join(self.data_dir, "api-key")
        while time.time() < deadline:
            try:
                with open(path) as f:
                    k = f.read().strip()
                if k:
                    return k
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError("no api key at %s" % path)

    def new_platform_key(self):
        """A platform admin key (moatd key create --admin)."""
        r = subprocess.run([moatd_bin(), "key", "create", "--data-dir", self.data_dir, "--admin"], cwd=REPO,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
        if r.returncode != 0:
            raise RuntimeError("moatd key create --admin failed (%d): %s" % (r.returncode, r.stderr.decode(errors="replace")))
        return r.stdout.decode().strip().splitlines()[-1].split()[-1]

    def new_org_key(self, org):
        r = subprocess.run([moatd_bin(), "key", "create", "--data-dir", self.data_dir, "--org", org], cwd=REPO,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
        if r.returncode != 0:
            raise RuntimeError("moatd key create failed (%d): %s" % (r.returncode, r.stderr.decode(errors="replace")))
        lines = [ln.strip() for ln in r.stdout.decode().splitlines() if ln.strip()]
        if not lines:
            raise RuntimeError("moatd key create printed no key")
        key = lines[-1].split()[-1]
        self.keys.append(key)
        return key

    def instance(self):
        """The 16-hex-digit name moatd gives its host state (FNV-1a of the data dir's real path)."""
        x = 1469598103934665603
        for ch in os.path.realpath(self.data_dir).encode():
            x ^= ch
            x = (x * 1099511628211) & 0xFFFFFFFFFFFFFFFF
        return "%016x" % x

    def sandbox_host(self, sid):
        """Where a running sandbox lives on the host, from moatd's store: {pid, slot, chan}, where pid
        is its init (moat-guest) and chan the host dir of its guest socket."""
        import sqlite3
        db = sqlite3.connect("file:%s?mode=ro" % os.path.join(self.data_dir, "moat.db"), uri=True, timeout=30)
        try:
            row = db.execute("SELECT pid, slot FROM sandboxes WHERE id = ?", (sid,)).fetchone()
        finally:
            db.close()
        if not row or row[0] <= 0:
            raise RuntimeError("sandbox %s has no init recorded" % sid)
        # the machine's tmpfs of channel dirs, or (moatd in a mount namespace of its own) the legacy root
        chans = ["%s/%s/%d" % (root, self.instance(), row[1]) for root in ("/run/moat/channels", "/run/moat/chan")]
        chan = next((c for c in chans if os.path.isdir(c)), chans[0])
        return {"pid": row[0], "slot": row[1], "chan": chan}

    def log_tail(self, n=60):
        try:
            with open(self.log_path, "rb") as f:
                return b"\n".join(f.read().splitlines()[-n:]).decode(errors="replace")
        except OSError:
            return ""

    def kill9(self):
        """Simulates a crash: SIGKILL to moatd only; its sandboxes keep running."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def delete_all(self):
        """DELETE every sandbox every known key can see."""
        for key in self.keys:
            c = Client(self.port, key, timeout=15, netns=self.netns)
            try:
                for sb in c.list():
                    try:
                        c.request("DELETE", "/v1/sandboxes/" + sb["id"], expect=(204, 404))
                    except Exception:
                        pass
            except Exception:
                pass

    def terminate(self, timeout=20):
        """SIGTERM, then SIGKILL after timeout. Returns the exit status."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(30)

    def stop(self, keep_data=False):
        """Deletes all sandboxes, stops moatd and removes every leftover. Safe to call twice."""
        if self.proc is not None and self.proc.poll() is None:
            self.delete_all()
        self.terminate()
        if self._log:
            self._log.close()
            self._log = None
        self.force_cleanup(keep_data=keep_data)
        if self in _live:
            _live.remove(self)

    def stray_children(self):
        """Processes still running moatd's code for this data dir (forked children of a daemon
        that is gone: they share its cmdline) other than the live daemon itself."""
        me = self.proc.pid if self.proc is not None and self.proc.poll() is None else None
        return [p for p in find_pids_by_cmdline("--data-dir\0" + self.data_dir + "\0") if p != me]

    def force_cleanup(self, keep_data=False):
        for d in self.cgroups:
            kill_cgroup_tree(d)
        for pid in self.stray_children():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        # processes outside our cgroups that still sit in the data dir
        for pid, _, _ in procs_under(self.data_dir):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        for line in reversed(mounts_under(self.data_dir)):
            mnt = line.split()[4]
            subprocess.run(["umount", "-l", mnt], stderr=subprocess.DEVNULL)
        for dev, _ in loops_under(self.data_dir):
            subprocess.run(["losetup", "-d", "/dev/" + dev], stderr=subprocess.DEVNULL)
        for d in self.cgroups:
            remove_cgroup_tree(d)
        if not keep_data and self.own_data_dir and os.path.isdir(self.data_dir):
            shutil.rmtree(self.data_dir, ignore_errors=True)
        if not keep_data:
            self.cgroups = []

    def leftovers(self, netns=(), grace_s=5):
        """What the daemon left behind after it stopped: a dict of non-empty lists. Waits up to
        grace_s for the kernel to finish tearing down processes that were already killed."""
        deadline = time.time() + grace_s
        while True:
            out = self._leftovers(netns)
            if not out or time.time() >= deadline:
                return out
            time.sleep(0.1)

    def _leftovers(self, netns):
        out = {}
        cg = []
        for d in self.cgroups:
            for sub in cgroup_walk(d):
                if sub == d:
                    continue
                cg.append(sub)
            procs = cgroup_procs(d)
            if procs:
                out.setdefault("cgroup_processes", []).extend(sorted(procs))
        if cg:
            out["cgroup_dirs"] = cg
        p = procs_under(self.data_dir)
        if p:
            out["processes"] = p
        strays = self.stray_children()
        if strays:
            out["moatd_children"] = strays
        m = mounts_under(self.data_dir)
        if m:
            out["mounts"] = m
        lo = loops_under(self.data_dir)
        if lo:
            out["loop_devices"] = lo
        if netns:
            alive = netns_inodes_in_use() & set(netns)
            if alive:
                out["netns"] = sorted(alive)
        return out

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def ensure_template(name="base", timeout=1800):
    """Builds template NAME in the shared template dir once, with a throwaway daemon."""
    ready = os.path.join(TEMPLATE_DIR, name, "ready")
    if os.path.exists(ready):
        return
    d = MoatDaemon(pool=0)
    try:
        d.start()
        d.client.request("POST", "/v1/templates/%s/build" % name, expect=200, timeout=timeout)
    finally:
        d.stop()

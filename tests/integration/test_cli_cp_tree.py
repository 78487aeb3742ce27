"""test_cli_cp_tree.py -- moat cp -r against a real moatd: a directory tree up into a sandbox and
back down (nested directories, modes, a symbolic link, binary data, an empty directory), a big tree
(2,000 small files and a 40 MB one, timed), and hostile tars from the sandbox on the way down (its
`tar` replaced by one that sends a crafted archive): '../', absolute, a link then a file through it,
a hard link, a device node. Each is refused with exit 1 and nothing is written outside the new
local directory."""

import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "lib"))
import moatd  # noqa: E402
from moattest import DaemonTest  # noqa: E402


def tree_digest(root):
    """{relative path: (kind, mode, sha256 or link target)} of a local tree (links not followed)."""
    out = {}
    for d, dirs, files in os.walk(root):
        for n in dirs + files:
            p = os.path.join(d, n)
            rel = os.path.relpath(p, root)
            st = os.lstat(p)
            if os.path.islink(p):
                out[rel] = ("link", None, os.readlink(p))
            elif os.path.isdir(p):
                out[rel] = ("dir", st.st_mode & 0o777, None)
            else:
                with open(p, "rb") as f:
                    out[rel] = ("file", st.st_mode & 0o777, hashlib.sha256(f.read()).hexdigest())
    return out


class CpTreeTest(DaemonTest):
    pool = 2

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="moat-cptree-")
        self.addCleanup(shutil.rmtree, self.tmp, True)

    def moat(self, *args, check=0, timeout=600):
        e = dict(os.environ, MOAT_API_URL="http://127.0.0.1:%d" % self.daemon.port, MOAT_API_KEY=self.c.key)
        r = subprocess.run([os.path.join(moatd.BUILD, "moat")] + list(args), env=e, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=timeout, text=True, cwd=self.tmp)
        if check is not None:
            self.assertEqual(r.returncode, check, "moat %s: %s" % (" ".join(args), r.stderr[-3000:]))
        return r

    def make_tree(self, root):
        os.makedirs(os.path.join(root, "a", "b", "c"))
        os.makedirs(os.path.join(root, "empty"))
        with open(os.path.join(root, "a", "b", "c", "deep.txt"), "w") as f:
            f.write("deep\n")
        with open(os.path.join(root, "bin.dat"), "wb") as f:
            f.write(bytes(range(256)) * 1000)
        with open(os.path.join(root, "run.sh"), "w") as f:
            f.write("#!/bin/sh\necho hi\n")
        os.chmod(os.path.join(root, "run.sh"), 0o750)
        with open(os.path.join(root, "a", "name with spaces"), "w") as f:
            f.write("s")
        os.symlink("a/b/c/deep.txt", os.path.join(root, "link"))

    def test_round_trip(self):
        src = os.path.join(self.tmp, "src")
        self.make_tree(src)
        sid = self.sandbox()["id"]
        self.moat("cp", "-r", src, "%s:/work/up" % sid)
        out = self.c.sh(sid, "cd /work/up && sha256sum bin.dat a/b/c/deep.txt && readlink link && stat -c %a run.sh "
                        "&& test -d empty && cat 'a/name with spaces'")
        self.assertIn(hashlib.sha256(bytes(range(256)) * 1000).hexdigest(), out)
        self.assertIn("a/b/c/deep.txt\n750\ns", out)
        self.moat("cp", "-r", "%s:/work/up" % sid, "back")
        self.assertEqual(tree_digest(os.path.join(self.tmp, "back")), tree_digest(src))
        # the destination must be new: nothing is merged into an existing directory
        r = self.moat("cp", "-r", "%s:/work/up" % sid, "back", check=1)
        self.assertIn("new directory", r.stderr)
        r = self.moat("cp", "-r", "%s:/nonexistent" % sid, "gone", check=1)
        self.assertIn("tar", r.stderr)
        self.moat("cp", "-r", os.path.join(self.tmp, "nosuch"), "%s:/work/x" % sid, check=1)

    def test_big_tree(self):
        src = os.path.join(self.tmp, "big")
        for i in range(20):
            d = os.path.join(src, "d%02d" % i)
            os.makedirs(d)
            for j in range(100):
                with open(os.path.join(d, "f%03d" % j), "w") as f:
                    f.write("%d-%d\n" % (i, j) * 20)
        with open(os.path.join(src, "large.bin"), "wb") as f:
            f.write(os.urandom(40 << 20))
        sid = self.sandbox()["id"]
        t0 = time.time()
        self.moat("cp", "-r", src, "%s:/work/big" % sid)
        up = time.time() - t0
        r = self.c.sh(sid, "find /work/big -type f | wc -l")
        self.assertEqual(r.split()[0], "2001", r)
        t0 = time.time()
        self.moat("cp", "-r", "%s:/work/big" % sid, "down")
        down = time.time() - t0
        self.assertEqual(tree_digest(os.path.join(self.tmp, "down")), tree_digest(src))
        sys.stderr.write("    cp -r 2001 files, 40.4 MB: up %.1f s, down %.1f s\n" % (up, down))

    def hostile(self, sid, build, why):
        """Makes the sandbox's tar send the archive build(tarfile) writes; moat cp -r must fail with why."""
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as t:
            build(t)
        self.c.put_file(sid, "/tmp/evil.tar", buf.getvalue())
        self.c.put_file(sid, "/tmp/faketar", b"#!/bin/sh\ncat /tmp/evil.tar\n", mode="0755")
        self.c.sh(sid, "cp /tmp/faketar /usr/bin/tar")
        dest = os.path.join(self.tmp, "in", "dest")
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.rmtree(dest, ignore_errors=True)
        before = sorted(os.listdir(self.tmp))
        r = self.moat("cp", "-r", "%s:/work" % sid, dest, check=1)
        self.assertIn(why, r.stderr)
        self.assertEqual(sorted(os.listdir(self.tmp)), before)  # nothing beside dest
        self.assertEqual(os.listdir(os.path.join(self.tmp, "in")), ["dest"])
        return r

    @staticmethod
    def add(t, name, data=b"x", **kw):
        ti = tarfile.TarInfo(name)
        for k, v in kw.items():
            setattr(ti, k, v)
        if ti.type == tarfile.REGTYPE:
            ti.size = len(data)
            t.addfile(ti, io.BytesIO(data))
        else:
            t.addfile(ti)

    def test_hostile_tars_refused(self):
        sid = self.sandbox()["id"]
        outside = os.path.join(self.tmp, "in", "escaped")
        self.hostile(sid, lambda t: (self.add(t, "ok.txt"), self.add(t, "../escaped")), "'..' component")
        self.assertFalse(os.path.exists(outside))
        self.hostile(sid, lambda t: self.add(t, "sub/../../escaped"), "'..' component")
        self.assertFalse(os.path.exists(outside))
        self.hostile(sid, lambda t: self.add(t, outside), "absolute path")
        self.assertFalse(os.path.exists(outside))
        # a link to the outside, then a file through it
        self.hostile(sid, lambda t: (self.add(t, "link", type=tarfile.SYMTYPE, linkname=os.path.join(self.tmp, "in")),
                                     self.add(t, "link/escaped")), "link/escaped")
        self.assertFalse(os.path.exists(outside))
        secret = os.path.join(self.tmp, "secret")
        with open(secret, "w") as f:
            f.write("host secret")
        self.hostile(sid, lambda t: self.add(t, "hard", type=tarfile.LNKTYPE, linkname=secret), "hard link")
        self.hostile(sid, lambda t: self.add(t, "dev", type=tarfile.CHRTYPE, devmajor=1, devminor=3),
                     "not a file, directory or symbolic link")
        with open(secret) as f:
            self.assertEqual(f.read(), "host secret")
        # an ordinary archive through the same fake tar is extracted
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as t:
            self.add(t, "./fine/x.txt", b"fine")
        self.c.put_file(sid, "/tmp/evil.tar", buf.getvalue())
        self.moat("cp", "-r", "%s:/work" % sid, "okdest")
        with open(os.path.join(self.tmp, "okdest", "fine", "x.txt")) as f:
            self.assertEqual(f.read(), "fine")

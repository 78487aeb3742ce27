"""test_volumes_attack.py -- what a sandbox writes into a volume, and what another org asks of it:
links a sandbox made are never followed by the host's files API (a host file is neither read nor
overwritten), a FIFO does not hang it, '..' is refused, and a second org's key can neither see,
read, write, attach nor delete the volume (404, as for one that does not exist)."""

import http.client
import os
import sys
import tempfile
import time
import urllib.parse
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "integration"))
from moattest import DaemonTest  # noqa: E402
from test_volumes import VolumeMixin, vname  # noqa: E402


class VolumeAttackTest(VolumeMixin, DaemonTest):
    pool = 1

    def setUp(self):
        fd, self.host_file = tempfile.mkstemp(prefix="moat-volume-victim-", dir="/var/tmp")
        os.write(fd, b"host secret\n")
        os.close(fd)
        os.chmod(self.host_file, 0o600)
        self.addCleanup(os.unlink, self.host_file)
        self.name = self.volume()["name"]
        self.sid = self.sandbox(volumes=[{"name": self.name, "path": "/data"}])["id"]

    def host_file_intact(self):
        with open(self.host_file, "rb") as f:
            self.assertEqual(f.read(), b"host secret\n", "the host file was overwritten")

    def test_symlinks_are_not_followed(self):
        c, n = self.c, self.name
        hostdir = os.path.dirname(self.host_file)
        self.c.sh(self.sid, "ln -s %s /data/file-link && ln -s /etc /data/dir-link && ln -s %s /data/dir2 && "
                  "ln -s /proc/self/root /data/magic && mkdir /data/real && ln -s ../../../../.. /data/real/up"
                  % (self.host_file, hostdir))
        base = os.path.basename(self.host_file)
        for path in ("/file-link", "/dir-link/shadow", "/dir-link/passwd", "/dir2/" + base,
                     "/magic/etc/passwd", "/real/up/etc/passwd", "/real/up" + self.host_file):
            e = self.assertApiError((400, 404), None, self.vfile, n, path)
            self.assertNotIn(b"host secret", repr(e.body).encode())
            self.assertNotIn("root:", repr(e.body))
        for path in ("/dir2/" + base, "/real/up" + self.host_file, "/dir-link/moat-volume-test"):
            self.assertApiError((400, 404), None, self.vput, n, path, b"overwritten by the files API")
            self.host_file_intact()
        self.assertFalse(os.path.exists("/etc/moat-volume-test"))
        # the listing shows the links as links; removing one removes the link, not its target
        ents = {e["name"]: e for e in self.vfile(n, "/")["entries"]}
        self.assertEqual((ents["file-link"]["type"], ents["file-link"]["symlink_target"]),
                         ("symlink", self.host_file))
        c.request("DELETE", "/v1/volumes/%s/files" % n, query={"path": "/file-link"}, expect=204)
        self.host_file_intact()
        c.request("DELETE", "/v1/volumes/%s/files" % n, query={"path": "/dir2/" + base}, expect=(400, 404))
        self.host_file_intact()
        # a PUT over a link replaces the link inside the volume; the target is untouched
        self.c.sh(self.sid, "ln -s %s /data/file-link" % self.host_file)
        self.vput(n, "/file-link", b"now a file")
        self.host_file_intact()
        self.assertEqual(self.c.sh(self.sid, "cat /data/file-link; test -L /data/file-link || echo regular"),
                         "now a fileregular\n")

    def test_link_swapped_during_upload(self):
        """The directory an upload writes into is swapped for a link to a host dir mid-body: the
        upload lands in the directory it opened (inside the volume), nothing in the host dir."""
        n = self.name
        self.c.sh(self.sid, "mkdir -p /data/up")
        hostdir = tempfile.mkdtemp(prefix="moat-volume-victim-dir-", dir="/var/tmp")
        self.addCleanup(os.rmdir, hostdir)
        body = b"y" * (1 << 20)
        conn = http.client.HTTPConnection("127.0.0.1", self.daemon.port, timeout=60)
        try:
            q = urllib.parse.urlencode({"path": "/up/planted"})
            conn.putrequest("PUT", "/v1/volumes/%s/files?%s" % (n, q))
            conn.putheader("Authorization", "Bearer " + self.c.key)
            conn.putheader("Content-Type", "application/octet-stream")
            conn.putheader("Content-Length", str(len(body)))
            conn.endheaders()
            conn.send(body[:4096])
            time.sleep(0.3)
            self.c.sh(self.sid, "mv /data/up /data/up.old && ln -s %s /data/up" % hostdir)
            conn.send(body[4096:])
            resp = conn.getresponse()
            resp.read()
            status = resp.status
        finally:
            conn.close()
        self.assertEqual(os.listdir(hostdir), [], "the upload went through the link into the host dir")
        if status == 200:
            self.assertEqual(self.c.sh(self.sid, "stat -c %s /data/up.old/planted"), "%d\n" % len(body))
        else:
            self.assertIn(status, (400, 404))

    def test_fifo_and_dotdot(self):
        n = self.name
        self.c.sh(self.sid, "mkfifo /data/fifo && mkdir -p /data/a")
        t0 = time.monotonic()
        self.assertApiError(400, "invalid_request", self.vfile, n, "/fifo")
        self.assertLess(time.monotonic() - t0, 30, "reading a FIFO hung the files API")
        for path in ("..", "/..", "../etc/passwd", "/a/../../etc/passwd", "a/./b", "/a/.."):
            self.assertApiError(400, "invalid_request", self.vfile, n, path)
            self.assertApiError(400, "invalid_request", self.vput, n, path, b"x")
            self.assertApiError(400, "invalid_request", self.c.request, "DELETE", "/v1/volumes/%s/files" % n,
                                query={"path": path})
        self.assertAlive(self.sid)

    def test_other_org(self):
        other = self.c.with_key(self.daemon.new_org_key("org-" + uuid.uuid4().hex[:8]))
        n = self.name
        self.c.sh(self.sid, "echo org-a-data > /data/secret")
        names = [v["name"] for v in other.request("GET", "/v1/volumes")[1]["volumes"]]
        self.assertNotIn(n, names)
        self.assertApiError(404, "volume_not_found", self.vget, n, client=other)
        self.assertApiError(404, "volume_not_found", self.vfile, n, "/secret", client=other)
        self.assertApiError(404, "volume_not_found", self.vfile, n, "/", client=other)
        self.assertApiError(404, "volume_not_found", self.vput, n, "/secret", b"x", client=other)
        self.assertApiError(404, "volume_not_found", other.request, "DELETE", "/v1/volumes/%s/files" % n,
                            query={"path": "/secret"})
        self.assertApiError(404, "volume_not_found", other.request, "DELETE", "/v1/volumes/" + n)
        for ro in (False, True):
            self.assertApiError(404, "volume_not_found", other.create,
                                volumes=[{"name": n, "path": "/data", "read_only": ro}])
        # time travel of org A's sandbox from org B: 404 as for any sandbox of another org
        self.assertApiError(404, None, other.request, "POST", "/v1/sandboxes/%s/fork" % self.sid,
                            body={"count": 1})
        # the same name in org B is B's own, empty volume
        self.volume(name=n, client=other)
        self.assertEqual(self.vfile(n, "/", client=other)["entries"], [])
        sb = other.create(volumes=[{"name": n, "path": "/data"}])
        self.addCleanup(self._delete_quietly, other, sb["id"])
        self.assertEqual(other.sh(sb["id"], "ls -A /data"), "")
        self.assertEqual(self.vfile(n, "/secret"), b"org-a-data\n")
        self.assertEqual(self.c.sh(self.sid, "cat /data/secret"), "org-a-data\n")
        self.assertEqual([a["sandbox"] for a in self.vget(n)["attached"]], [self.sid])

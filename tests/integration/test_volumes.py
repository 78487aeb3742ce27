"""test_volumes.py -- durable volumes: an org's file systems that outlive sandboxes, moatd restarts
and kill -9; size_mb is a hard limit; one read-write holder, any number of readers; files read and
written with no sandbox; volumes and time travel (hibernate keeps them; a fork's children and explore's
branches mount them read-only; a rollback keeps them as they are; from_snapshot of a snapshot with volumes
is 400)."""

import glob
import os
import sys
import unittest
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
import moatd  # noqa: E402
from moattest import DaemonTest  # noqa: E402


def attachment_rows(daemon, sandbox_id=None):
    """The store's volume_attachments rows (of sandbox_id, or all), read from its file read-only."""
    import sqlite3
    db = sqlite3.connect("file:%s?mode=ro" % os.path.join(daemon.data_dir, "moat.db"), uri=True, timeout=30)
    try:
        return db.execute("SELECT COUNT(*) FROM volume_attachments WHERE ?1 IS NULL OR sandbox_id = ?1",
                          (sandbox_id,)).fetchone()[0]
    finally:
        db.close()


def vname():
    return "vol-" + uuid.uuid4().hex[:10]


class VolumeMixin:
    def volume(self, size_mb=32, name=None, client=None):
        """Creates a volume (201 asserted), deleted when the test ends (after its sandboxes)."""
        client = client or self.c
        name = name or vname()
        _, v = client.request("POST", "/v1/volumes", body={"name": name, "size_mb": size_mb}, expect=201)
        self.addCleanup(self._delete_volume_quietly, client, name)
        return v

    @staticmethod
    def _delete_volume_quietly(client, name):
        try:
            client.request("DELETE", "/v1/volumes/" + name, expect=(204, 404, 409), timeout=60)
        except Exception:
            pass

    def vget(self, name, client=None, expect=200):
        return (client or self.c).request("GET", "/v1/volumes/" + name, expect=expect)[1]

    def vfile(self, name, path, client=None, expect=200):
        return (client or self.c).request("GET", "/v1/volumes/%s/files" % name, query={"path": path},
                                          expect=expect)[1]

    def vput(self, name, path, data, client=None, expect=200):
        return (client or self.c).request("PUT", "/v1/volumes/%s/files" % name, query={"path": path}, raw=data,
                                          headers={"Content-Type": "application/octet-stream"},
                                          expect=expect)[1]

    def images(self, daemon):
        return sorted(glob.glob(os.path.join(daemon.data_dir, "host", "volumes", "v-*.img")))


class VolumeTest(VolumeMixin, DaemonTest):
    pool = 1

    def test_create_get_list_delete(self):
        name = vname()
        v = self.volume(size_mb=24, name=name)
        self.assertEqual((v["name"], v["size_mb"], v["attached"]), (name, 24, []), v)
        self.assertIsInstance(v["used_bytes"], int)
        self.assertTrue(v["created_at"].endswith("Z"), v)
        self.assertEqual(self.vget(name)["size_mb"], 24)
        names = [x["name"] for x in self.c.request("GET", "/v1/volumes")[1]["volumes"]]
        self.assertIn(name, names)
        self.assertApiError(409, "already_exists", self.c.request, "POST", "/v1/volumes",
                            body={"name": name, "size_mb": 24})
        n_images = len(self.images(self.daemon))
        self.c.request("DELETE", "/v1/volumes/" + name, expect=204)
        self.assertEqual(len(self.images(self.daemon)), n_images - 1, "the image stayed")
        self.assertApiError(404, "volume_not_found", self.vget, name)
        self.assertApiError(404, "volume_not_found", self.c.request, "DELETE", "/v1/volumes/" + name)

    def test_bad_input(self):
        post = lambda body: self.c.request("POST", "/v1/volumes", body=body)  # noqa: E731
        for body in ({"name": "a/b", "size_mb": 32}, {"name": "", "size_mb": 32}, {"name": "-x", "size_mb": 32},
                     {"name": "Upper", "size_mb": 32}, {"name": "x" * 64, "size_mb": 32}, {"size_mb": 32},
                     {"name": "ok", "size_mb": 0}, {"name": "ok", "size_mb": -5}, {"name": "ok"},
                     {"name": "ok", "size_mb": "32"}, {"name": "ok", "size_mb": 32, "extra": 1},
                     {"name": "ok", "size_mb": 1 << 40}):
            self.assertApiError(400, "invalid_request", post, body)
        self.assertEqual([x for x in self.c.request("GET", "/v1/volumes")[1]["volumes"] if x["name"] == "ok"], [])
        self.assertApiError(404, "volume_not_found", self.c.create, volumes=[{"name": "nope-" + vname(),
                                                                               "path": "/data"}])
        e = self.assertApiError(404, "volume_not_found", self.c.create,
                                volumes=[{"name": "missing-one", "path": "/data"}])
        self.assertIn("missing-one", e.body["message"])
        v = self.volume()["name"]
        for vols in ([{"name": v, "path": "/"}], [{"name": v, "path": "data"}], [{"name": v, "path": "/proc/x"}],
                     [{"name": v, "path": "/sys"}], [{"name": v, "path": "/dev/shm/x"}],
                     [{"name": v, "path": "/run/moat"}], [{"name": v, "path": "/a/../etc"}],
                     [{"name": v, "path": "//"}], [{"name": v}], [{"path": "/x"}],
                     [{"name": v, "path": "/x", "read_only": "yes"}], [{"name": v, "path": "/x", "other": 1}],
                     [{"name": v, "path": "/d%d" % i, "read_only": True} for i in range(9)],
                     [{"name": v, "path": "/x", "read_only": True}, {"name": v, "path": "/x", "read_only": True}],
                     "notalist"):
            self.assertApiError(400, "invalid_request", self.c.create, volumes=vols)
        self.assertEqual(self.vget(v)["attached"], [], "a refused create left an attachment")

    def test_data_outlives_the_sandbox(self):
        name = self.volume()["name"]
        a = self.sandbox(volumes=[{"name": name, "path": "/data"}])["id"]
        self.c.sh(a, "mkdir -p /data/work && echo from-A > /data/work/note && chown 1000:1000 /data/work/note")
        # the files belong to the sandbox's own users inside (idmapped), to ids 0..65535 on disk
        self.assertEqual(self.c.sh(a, "stat -c %u:%g /data /data/work/note"), "0:0\n1000:1000\n")
        att = self.vget(name)["attached"]
        self.assertEqual(att, [{"sandbox": a, "path": "/data", "read_only": False}])
        self.c.delete(a)
        self.assertEqual(self.vget(name)["attached"], [])
        b = self.sandbox(volumes=[{"name": name, "path": "/mnt/other"}])["id"]
        self.assertEqual(self.c.sh(b, "cat /mnt/other/work/note; stat -c %u /mnt/other/work/note"),
                         "from-A\n1000\n")
        # on disk the owner is 1000, whatever b's uid range on the host
        ent = [e for e in self.vfile(name, "/work")["entries"] if e["name"] == "note"][0]
        self.assertEqual((ent["uid"], ent["type"], ent["size"]), (1000, "file", 7), ent)

    def test_sandbox_json_lists_its_volumes(self):
        """GET /v1/sandboxes/{id} and the list show volumes: [{name, path, read_only}] in the create's
        order ([] for a sandbox with none, and once killed)."""
        one, two = self.volume()["name"], self.volume()["name"]
        want = [{"name": two, "path": "/b", "read_only": True}, {"name": one, "path": "/a/x", "read_only": False}]
        sid = self.sandbox(volumes=want)["id"]
        plain = self.sandbox()["id"]
        self.assertEqual(self.c.get(sid)["volumes"], want)
        self.assertEqual(self.c.get(plain)["volumes"], [])
        listed = {s["id"]: s["volumes"] for s in self.c.request("GET", "/v1/sandboxes")[1]["sandboxes"]}
        self.assertEqual((listed[sid], listed[plain]), (want, []))
        self.c.delete(sid)
        killed = [s for s in self.c.request("GET", "/v1/sandboxes", query={"state": "killed"})[1]["sandboxes"]
                  if s["id"] == sid]
        self.assertEqual([s["volumes"] for s in killed], [[]])

    def test_one_writer_many_readers(self):
        name = self.volume()["name"]
        w = self.sandbox(volumes=[{"name": name, "path": "/data"}])["id"]
        e = self.assertApiError(409, "volume_in_use", self.c.create, volumes=[{"name": name, "path": "/data"}])
        self.assertIn(w, e.body["message"])
        r1 = self.sandbox(volumes=[{"name": name, "path": "/data", "read_only": True}])["id"]
        r2 = self.sandbox(volumes=[{"name": name, "path": "/ro", "read_only": True}])["id"]
        self.c.sh(w, "echo written-after > /data/live")
        self.assertEqual(self.c.sh(r1, "cat /data/live"), "written-after\n")
        r = self.c.exec(r2, cmd="echo x > /ro/nope")
        self.assertNotEqual(r["exit_code"], 0, r)
        self.assertIn("Read-only file system", r["stderr"])
        self.assertEqual(self.c.exec(r2, cmd="rm /ro/live")["exit_code"] != 0, True)
        self.assertEqual(self.c.sh(w, "cat /data/live"), "written-after\n")
        att = sorted((a["sandbox"], a["read_only"]) for a in self.vget(name)["attached"])
        self.assertEqual(att, sorted([(w, False), (r1, True), (r2, True)]))
        # the writer gone, another may write
        self.c.delete(w)
        w2 = self.sandbox(volumes=[{"name": name, "path": "/data"}])["id"]
        self.c.sh(w2, "echo second > /data/live")
        self.assertEqual(self.c.sh(r1, "cat /data/live"), "second\n")

    def test_failed_mount_releases_the_volume(self):
        """A mount point the host refuses (a file on the way, a symbolic link on the way: /var/run is
        one in the template) fails the create with 400 and leaves the volume free."""
        name = self.volume()["name"]
        for path in ("/etc/hostname/x", "/etc/hostname", "/var/run/x"):
            e = self.assertApiError(400, "invalid_request", self.c.create, volumes=[{"name": name, "path": path}])
            self.assertIn(name, e.body["message"])
            self.assertEqual(self.vget(name)["attached"], [], path)
        sid = self.sandbox(volumes=[{"name": name, "path": "/srv/deep/er"}])["id"]
        self.assertEqual(self.c.sh(sid, "stat -c %u /srv/deep; test -w /srv/deep/er && echo w"), "0\nw\n")

    def test_idle_hibernation_with_a_volume(self):
        if not self.c.healthz()["checkpoints"]["available"]:
            self.skipTest("no working CRIU on this host")
        import time
        name = self.volume()["name"]
        sid = self.sandbox(persistent=True, idle={"hibernate_after_seconds": 2},
                           volumes=[{"name": name, "path": "/data"}])["id"]
        self.c.sh(sid, "echo kept > /data/k")
        deadline = time.time() + 20
        while time.time() < deadline and self.c.get(sid)["state"] != "hibernated":
            time.sleep(0.5)
        self.assertEqual(self.c.get(sid)["state"], "hibernated")
        self.assertEqual(self.c.sh(sid, "cat /data/k"), "kept\n")  # woken by the exec
        self.assertEqual(self.vget(name)["attached"][0]["sandbox"], sid)

    def test_concurrent_writers(self):
        """Six creates asking for the same volume read-write at once: exactly one gets it."""
        import threading
        name = self.volume()["name"]
        results = []

        def create():
            try:
                results.append(("ok", self.c.create(volumes=[{"name": name, "path": "/data"}])["id"]))
            except moatd.HTTPError as e:
                results.append((e.body.get("code") if isinstance(e.body, dict) else e.status, None))

        threads = [threading.Thread(target=create) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        for code, sid in results:
            if sid:
                self.addCleanup(self._delete_quietly, self.c, sid)
        codes = sorted(code for code, _ in results)
        self.assertEqual(codes, ["ok"] + ["volume_in_use"] * 5, results)
        winner = [sid for code, sid in results if sid][0]
        self.assertEqual(self.vget(name)["attached"], [{"sandbox": winner, "path": "/data", "read_only": False}])

    def test_delete_while_attached(self):
        name = self.volume()["name"]
        before = self.images(self.daemon)
        sid = self.sandbox(volumes=[{"name": name, "path": "/data", "read_only": True}])["id"]
        e = self.assertApiError(409, "volume_in_use", self.c.request, "DELETE", "/v1/volumes/" + name)
        self.assertIn(sid, e.body["message"])
        self.assertEqual(self.images(self.daemon), before)
        self.c.delete(sid)
        self.c.request("DELETE", "/v1/volumes/" + name, expect=204)
        self.assertEqual(len(self.images(self.daemon)), len(before) - 1, "the image is still there")
        self.assertApiError(404, "volume_not_found", self.c.create, volumes=[{"name": name, "path": "/data"}])

    def test_size_is_a_hard_limit(self):
        name = self.volume(size_mb=32)["name"]
        img = [p for p in self.images(self.daemon)]
        sid = self.sandbox(volumes=[{"name": name, "path": "/data"}])["id"]
        r = self.c.exec(sid, cmd="dd if=/dev/zero of=/data/big bs=1M count=64 conv=fsync")
        self.assertNotEqual(r["exit_code"], 0, r)
        self.assertIn("No space left on device", r["stderr"])
        size = int(self.c.sh(sid, "stat -c %s /data/big"))
        self.assertLess(size, 32 << 20)
        # what the host pays: the image's blocks, never more than size_mb
        for p in self.images(self.daemon):
            if p not in img:
                continue
            self.assertLessEqual(os.stat(p).st_blocks * 512, (32 << 20) + (1 << 20), p)
        # the sandbox's own disk is not the volume's: it still writes there
        self.c.sh(sid, "echo ok > /root/after")
        used = self.vget(name)["used_bytes"]
        self.assertGreater(used, 24 << 20, used)

    def test_files_with_no_sandbox(self):
        name = self.volume()["name"]
        self.assertEqual(self.vput(name, "/a/b/c.txt", b"hello")["size"], 5)
        self.assertEqual(self.vfile(name, "/a/b/c.txt"), b"hello")
        self.assertEqual(self.vfile(name, "a/b/c.txt"), b"hello")
        self.vput(name, "/a/b/c.txt", b"replaced")
        self.assertEqual(self.vfile(name, "/a/b/c.txt"), b"replaced")
        big = os.urandom(3 << 20)
        self.vput(name, "/big.bin", big)
        self.assertEqual(self.vfile(name, "/big.bin"), big)
        root = self.vfile(name, "/")
        self.assertEqual(sorted(e["name"] for e in root["entries"]), ["a", "big.bin"])
        self.assertEqual([e["type"] for e in self.vfile(name, "/a")["entries"]], ["dir"])
        self.assertApiError(400, "invalid_request", self.c.request, "DELETE", "/v1/volumes/%s/files" % name,
                            query={"path": "/a"})  # not empty
        self.c.request("DELETE", "/v1/volumes/%s/files" % name, query={"path": "/a/b/c.txt"}, expect=204)
        self.assertApiError(404, "not_found", self.vfile, name, "/a/b/c.txt")
        self.assertApiError(400, "invalid_request", self.c.request, "DELETE", "/v1/volumes/%s/files" % name,
                            query={"path": "/"})
        # what the host wrote, a sandbox reads as root's
        sid = self.sandbox(volumes=[{"name": name, "path": "/v", "read_only": True}])["id"]
        self.assertEqual(self.c.sh(sid, "stat -c %u /v/big.bin; md5sum < /v/big.bin | cut -c1-8"),
                         "0\n%s\n" % __import__("hashlib").md5(big).hexdigest()[:8])
        self.assertApiError(404, "volume_not_found", self.vfile, "no-such-" + vname(), "/")

    def need_checkpoints(self):
        if not self.c.healthz()["checkpoints"]["available"]:
            self.skipTest("no working CRIU on this host")

    def test_pause_resume_and_from_snapshot_with_volumes(self):
        name = self.volume()["name"]
        sid = self.sandbox(volumes=[{"name": name, "path": "/data", "read_only": True}], persistent=True)["id"]
        # pause and resume keep the volume mounted
        self.c.request("POST", "/v1/sandboxes/%s/pause" % sid, body={})
        self.c.request("POST", "/v1/sandboxes/%s/resume" % sid, body={})
        self.assertEqual(self.c.sh(sid, "grep -c ' /data ' /proc/self/mounts"), "1\n")
        self.assertApiError(400, "invalid_request", self.c.create, from_snapshot="snap-00000000000000000",
                            volumes=[{"name": name, "path": "/d"}])

    def test_fork_children_get_the_volumes_read_only(self):
        """A fork's children mount the parent's volumes read-only (EROFS inside), the parent stays the
        writer and its writes reach them (one file system); each child holds a read-only claim, so the
        volume cannot be deleted while one lives; a second org reaches neither the volume nor a child."""
        self.need_checkpoints()
        name, ro = self.volume()["name"], self.volume()["name"]
        self.vput(ro, "/r", b"reader")
        parent = self.sandbox(persistent=True, volumes=[{"name": name, "path": "/data"},
                                                        {"name": ro, "path": "/ro", "read_only": True}])["id"]
        self.c.sh(parent, "echo before > /data/f")
        _, body = self.c.request("POST", "/v1/sandboxes/%s/fork" % parent, body={"count": 2}, expect=201,
                                 timeout=120)
        kids = [k["id"] for k in body["sandboxes"]]
        for k in kids:
            self.addCleanup(self._delete_quietly, self.c, k)
        want = [{"name": name, "path": "/data", "read_only": True}, {"name": ro, "path": "/ro", "read_only": True}]
        for k in body["sandboxes"]:
            self.assertEqual(k["volumes"], want)
        self.assertEqual(self.c.get(parent)["volumes"][0], {"name": name, "path": "/data", "read_only": False})
        att = sorted((a["sandbox"], a["read_only"]) for a in self.vget(name)["attached"])
        self.assertEqual(att, sorted([(parent, False)] + [(k, True) for k in kids]))
        for k in kids:
            self.assertEqual(self.c.sh(k, "cat /data/f /ro/r"), "before\nreader")
            for cmd in ("echo x > /data/f", "touch /data/new", "rm /data/f", "mkdir /data/d"):
                r = self.c.exec(k, cmd=cmd)
                self.assertNotEqual(r["exit_code"], 0, (cmd, r))
                self.assertIn("Read-only file system", r["stderr"], cmd)
            self.assertIn(" /data ", self.c.sh(k, "grep ' /data ' /proc/self/mounts"))
            self.assertEqual(self.c.sh(k, "grep ' /data ' /proc/self/mounts | cut -d' ' -f4 | cut -d, -f1"),
                             "ro\n")
        # the parent still writes, and the children see it
        self.c.sh(parent, "echo after > /data/f; echo more > /data/g")
        self.assertEqual(self.c.sh(kids[0], "cat /data/f /data/g"), "after\nmore\n")
        self.assertEqual(self.vfile(name, "/f"), b"after\n")
        # no second writer while the parent lives
        self.assertApiError(409, "volume_in_use", self.c.create, volumes=[{"name": name, "path": "/data"}])
        # a second org: neither the volume nor the children
        other = self.c.with_key(self.daemon.new_org_key("org-" + uuid.uuid4().hex[:8]))
        self.assertApiError(404, "volume_not_found", self.vget, name, client=other)
        self.assertApiError(404, "volume_not_found", self.vfile, name, "/f", client=other)
        self.assertApiError(404, "volume_not_found", other.create, volumes=[{"name": name, "path": "/d",
                                                                             "read_only": True}])
        for k in kids:
            self.assertApiError(404, None, other.get, k)
            self.assertApiError(404, None, other.request, "POST", "/v1/sandboxes/%s/fork" % k, body={"count": 1})
            self.assertApiError(404, None, other.request, "POST", "/v1/sandboxes/%s/exec" % k,
                                body={"cmd": "cat /data/f"})
        # the children hold the volume: no delete while one lives, even with the parent gone
        self.c.delete(parent)
        e = self.assertApiError(409, "volume_in_use", self.c.request, "DELETE", "/v1/volumes/" + name)
        self.assertTrue(any(k in e.body["message"] for k in kids), e.body)
        self.assertEqual(sorted(a["sandbox"] for a in self.vget(name)["attached"]), sorted(kids))
        # readers do not block a new writer once the parent is gone; the children still cannot write
        w = self.sandbox(volumes=[{"name": name, "path": "/data"}])["id"]
        self.c.sh(w, "echo new-writer > /data/f")
        self.assertEqual(self.c.sh(kids[1], "cat /data/f"), "new-writer\n")
        self.assertIn("Read-only file system", self.c.exec(kids[1], cmd="touch /data/z")["stderr"])
        self.c.delete(w)
        self.c.delete(kids[0])
        self.assertApiError(409, "volume_in_use", self.c.request, "DELETE", "/v1/volumes/" + name)
        self.c.delete(kids[1])
        self.c.request("DELETE", "/v1/volumes/" + name, expect=204)

    def test_fork_of_a_writer_with_an_open_file_is_409(self):
        """A parent's process holding a file of the volume open for writing: the children could not
        reopen it read-only, so the fork is 409 volume_attached, no child is left and the parent writes on."""
        self.need_checkpoints()
        name = self.volume()["name"]
        parent = self.sandbox(persistent=True, volumes=[{"name": name, "path": "/data"}])["id"]
        self.c.exec(parent, cmd="exec 3>>/data/log && (while :; do echo tick >&3; sleep 0.1; done) "
                                ">/dev/null 2>&1 &")
        n_before = len(self.c.request("GET", "/v1/sandboxes")[1]["sandboxes"])
        e = self.assertApiError(409, "volume_attached", self.c.request, "POST", "/v1/sandboxes/%s/fork" % parent,
                                body={"count": 2}, timeout=120)
        self.assertIn(parent, e.body["message"])
        self.assertEqual(len(self.c.request("GET", "/v1/sandboxes")[1]["sandboxes"]), n_before)
        self.assertEqual(self.vget(name)["attached"], [{"sandbox": parent, "path": "/data", "read_only": False}])
        ticks = self.vfile(name, "/log").count(b"tick")
        import time
        time.sleep(0.5)
        self.assertGreater(self.vfile(name, "/log").count(b"tick"), ticks, "the parent's writer stopped")

    def test_a_forked_child_stays_read_only_across_hibernate_and_fork(self):
        """A child's own checkpoints record its volumes read-only: woken, or forked again, it still gets EROFS."""
        self.need_checkpoints()
        name = self.volume()["name"]
        parent = self.sandbox(persistent=True, volumes=[{"name": name, "path": "/data"}])["id"]
        _, body = self.c.request("POST", "/v1/sandboxes/%s/fork" % parent, body={"count": 1}, expect=201,
                                 timeout=120)
        kid = body["sandboxes"][0]["id"]
        self.addCleanup(self._delete_quietly, self.c, kid)
        self.c.request("POST", "/v1/sandboxes/%s/hibernate" % kid, body={})
        self.c.request("POST", "/v1/sandboxes/%s/wake" % kid, body={})
        self.assertIn("Read-only file system", self.c.exec(kid, cmd="touch /data/x")["stderr"])
        _, body = self.c.request("POST", "/v1/sandboxes/%s/fork" % kid, body={"count": 1}, expect=201, timeout=120)
        grandkid = body["sandboxes"][0]["id"]
        self.addCleanup(self._delete_quietly, self.c, grandkid)
        self.assertIn("Read-only file system", self.c.exec(grandkid, cmd="touch /data/x")["stderr"])
        self.c.sh(parent, "echo still > /data/p")
        self.assertEqual(self.c.sh(grandkid, "cat /data/p"), "still\n")

    def test_explore_branches_read_the_volume(self):
        """explore's branches are fork children: they read the parent's volume, a write is EROFS."""
        self.need_checkpoints()
        name = self.volume()["name"]
        parent = self.sandbox(persistent=True, volumes=[{"name": name, "path": "/data"}])["id"]
        self.c.sh(parent, "echo input > /data/in")
        _, r = self.c.request("POST", "/v1/sandboxes/%s/explore" % parent, timeout=180, body={
            "keep": "best", "branches": [{"cmd": "echo out > /data/out"}, {"cmd": "cat /data/in"}]})
        out = r["outcomes"]
        for o in out:
            self.addCleanup(self._delete_quietly, self.c, o["sandbox_id"])
        self.assertNotEqual(out[0]["exit_code"], 0, out[0])
        self.assertIn("Read-only file system", out[0]["stderr_tail"])
        self.assertEqual((out[1]["exit_code"], out[1]["stdout_tail"]), (0, "input\n"), out[1])
        for o in out:
            self.assertEqual(self.c.get(o["sandbox_id"])["volumes"],
                             [{"name": name, "path": "/data", "read_only": True}])
        self.assertApiError(404, "not_found", self.vfile, name, "/out")
        att = sorted((a["sandbox"], a["read_only"]) for a in self.vget(name)["attached"])
        self.assertEqual(att, sorted([(parent, False)] + [(o["sandbox_id"], True) for o in out]))
        self.c.sh(parent, "echo still-writes > /data/out")

    def test_snapshot_and_rollback_keep_the_volume_as_it_is(self):
        """A snapshot records the sandbox's volume mounts, not their data: a rollback mounts them again as
        they are now (a file written after the snapshot stays) and the sandbox stays their writer;
        from_snapshot of that snapshot is 400 (its volumes are restored only into their own sandbox)."""
        self.need_checkpoints()
        name = self.volume()["name"]
        sid = self.sandbox(persistent=True, volumes=[{"name": name, "path": "/data"}])["id"]
        self.c.sh(sid, "echo at-snapshot > /data/a; echo disk-at-snapshot > /root/d")
        _, snap = self.c.request("POST", "/v1/sandboxes/%s/snapshots" % sid, body={}, expect=201, timeout=120)
        self.addCleanup(self._delete_snapshot_quietly, snap["id"])
        self.c.sh(sid, "echo after-snapshot > /data/a; echo later > /data/b; echo disk-later > /root/d")
        e = self.assertApiError(400, "invalid_request", self.c.create, from_snapshot=snap["id"])
        self.assertIn("volume", e.body["message"])
        self.c.request("POST", "/v1/sandboxes/%s/rollback" % sid, body={"snapshot_id": snap["id"]}, timeout=120)
        self.assertEqual(self.c.sh(sid, "cat /root/d /data/a /data/b"), "disk-at-snapshot\nafter-snapshot\nlater\n")
        self.c.sh(sid, "echo after-rollback > /data/c")
        self.assertEqual(self.vfile(name, "/c"), b"after-rollback\n")
        self.assertEqual(self.vget(name)["attached"], [{"sandbox": sid, "path": "/data", "read_only": False}])
        self.assertApiError(409, "volume_in_use", self.c.create, volumes=[{"name": name, "path": "/data"}])

    def _delete_snapshot_quietly(self, snap_id):
        try:
            self.c.request("DELETE", "/v1/snapshots/" + snap_id, expect=(204, 404), timeout=60)
        except Exception:
            pass

    def test_hibernate_and_wake_keep_the_volume(self):
        """A hibernated sandbox keeps its volume: still its writer (a second one is 409), the files API
        works meanwhile, and at wake the volume is mounted again as it is then; a process with its
        cwd and an open file in the volume runs on."""
        if not self.c.healthz()["checkpoints"]["available"]:
            self.skipTest("no working CRIU on this host")
        name = self.volume()["name"]
        ro = self.volume()["name"]
        self.vput(ro, "/r", b"read-only one")
        sid = self.sandbox(persistent=True, volumes=[{"name": name, "path": "/data"},
                                                      {"name": ro, "path": "/mnt//ro/", "read_only": True}])["id"]
        self.c.sh(sid, "echo before > /data/f")
        self.c.exec(sid, cmd="cd /data && exec 3>>/data/log && (while :; do echo tick >&3; sleep 0.2; done) "
                             ">/dev/null 2>&1 &")
        # The writer runs in the background: hibernate only once it has written (under load it may
        # not have opened /data/log yet when the exec answers).
        self.c.sh(sid, "for i in $(seq 200); do [ -s /data/log ] && exit 0; sleep 0.05; done; exit 1")
        self.c.request("POST", "/v1/sandboxes/%s/hibernate" % sid, body={})
        self.assertEqual(self.c.get(sid)["state"], "hibernated")
        att = self.vget(name)["attached"]
        self.assertEqual(att, [{"sandbox": sid, "path": "/data", "read_only": False}])
        self.assertApiError(409, "volume_in_use", self.c.create, volumes=[{"name": name, "path": "/data"}])
        self.vput(name, "/while-hibernated", b"written meanwhile")
        ticks = self.vfile(name, "/log").count(b"tick")
        self.c.request("POST", "/v1/sandboxes/%s/wake" % sid, body={})
        self.assertEqual(self.c.get(sid)["state"], "running")
        self.assertEqual(self.c.sh(sid, "cat /data/f /data/while-hibernated; echo; cat /mnt/ro/r"),
                         "before\nwritten meanwhile\nread-only one")
        r = self.c.exec(sid, cmd="touch /mnt/ro/x")
        self.assertIn("Read-only file system", r["stderr"])
        import time
        time.sleep(1)
        self.assertGreater(self.vfile(name, "/log").count(b"tick"), ticks, "the writer in the volume stopped")
        self.assertEqual(self.c.sh(sid, "stat -c %u /data/f"), "0\n")


class VolumeRestartTest(VolumeMixin, DaemonTest):
    pool = 0

    def restart(self, kill9):
        if kill9:
            self.daemon.kill9()
        else:
            self.daemon.terminate()
        self.daemon.start()
        self.c = self.daemon.client

    def check_survives(self, kill9):
        name = self.volume()["name"]
        a = self.sandbox(volumes=[{"name": name, "path": "/data"}])["id"]
        self.c.sh(a, "echo before > /data/f")
        self.restart(kill9)
        # the sandbox runs on with its volume, and its claim holds
        self.assertEqual(self.c.get(a)["state"], "running")
        self.assertEqual(self.vget(name)["attached"], [{"sandbox": a, "path": "/data", "read_only": False}])
        self.assertApiError(409, "volume_in_use", self.c.create, volumes=[{"name": name, "path": "/data"}])
        # one file system: what a writes now (no sync) the new moatd reads at once
        self.c.sh(a, "echo after > /data/f2")
        self.assertEqual(self.vfile(name, "/f"), b"before\n")
        self.assertEqual(self.vfile(name, "/f2"), b"after\n")
        self.vput(name, "/from-host", b"h")
        self.assertEqual(self.c.sh(a, "cat /data/from-host"), "h")
        self.c.delete(a)
        b = self.sandbox(volumes=[{"name": name, "path": "/data"}])["id"]
        self.assertEqual(self.c.sh(b, "cat /data/f /data/f2"), "before\nafter\n")

    def test_survives_restart(self):
        self.check_survives(kill9=False)

    def test_survives_kill9(self):
        self.check_survives(kill9=True)

    def test_nothing_left_after_stop(self):
        """moatd's own mounts of volumes go with it: once it stops and its sandboxes are gone, no
        mount or loop device of the data dir is left (the images stay, for the next moatd)."""
        name = self.volume()["name"]
        sid = self.sandbox(volumes=[{"name": name, "path": "/data"}])["id"]
        self.c.sh(sid, "echo x > /data/x")
        self.vput(name, "/y", b"y")
        self.c.delete(sid)
        self.daemon.terminate()
        left = self.daemon.leftovers()
        self.assertEqual({k: v for k, v in left.items() if k in ("mounts", "loop_devices")}, {}, left)
        self.assertEqual(len(self.images(self.daemon)), 1)
        self.daemon.start()
        self.c = self.daemon.client
        self.assertEqual(self.vfile(name, "/x"), b"x\n")

    def test_killed_sandboxes_leave_no_attachment_rows(self):
        """A kill removes its sandbox's attachment rows, so create+kill cycles do not grow the table;
        rows of sandboxes killed before that (an older moatd's store) go at the next start."""
        name, ro = self.volume()["name"], self.volume()["name"]
        base = attachment_rows(self.daemon)
        for i in range(4):
            sid = self.sandbox(volumes=[{"name": name, "path": "/data"},
                                        {"name": ro, "path": "/ro", "read_only": True}])["id"]
            self.assertEqual(attachment_rows(self.daemon, sid), 2)
            self.c.delete(sid)
            self.assertEqual(attachment_rows(self.daemon), base, "cycle %d: rows of killed sandboxes stayed" % i)
        # a failed create (a refused mount point) leaves none either
        self.assertApiError(400, "invalid_request", self.c.create, volumes=[{"name": name, "path": "/etc/hostname"}])
        self.assertEqual(attachment_rows(self.daemon), base)
        # an older store: a killed sandbox's row and one of a sandbox the store no longer has
        sid = self.sandbox()["id"]
        self.c.delete(sid)
        self.daemon.terminate()
        import sqlite3
        db = sqlite3.connect(os.path.join(self.daemon.data_dir, "moat.db"), timeout=30)
        try:
            vid = db.execute("SELECT id FROM volumes WHERE name = ?", (name,)).fetchone()[0]
            db.executemany("INSERT INTO volume_attachments VALUES (?, ?, '/data', 0)",
                           [(vid, sid), (vid, "sb-gone0000000000000")])
            db.commit()
        finally:
            db.close()
        self.assertEqual(attachment_rows(self.daemon), base + 2)
        self.daemon.start()
        self.c = self.daemon.client
        self.assertEqual(attachment_rows(self.daemon), base)
        self.assertEqual(self.vget(name)["attached"], [])

    def test_orphan_images_removed_at_start(self):
        """An image no record names (a crash between writing it and recording it) goes at the next start."""
        name = self.volume()["name"]
        vdir = os.path.join(self.daemon.data_dir, "host", "volumes")
        for junk in ("v-orphan0000000000.img", "v-orphan0000000001.img.tmp"):
            with open(os.path.join(vdir, junk), "wb") as f:
                f.write(b"\0" * 4096)
        self.restart(kill9=True)
        left = sorted(os.path.basename(p) for p in glob.glob(os.path.join(vdir, "v-*")))
        self.assertEqual(len(left), 1, left)
        self.vput(name, "/still", b"here")
        self.assertEqual(self.vfile(name, "/still"), b"here")

    def test_no_sandbox_restart(self):
        name = self.volume()["name"]
        self.vput(name, "/x", b"kept")
        self.restart(kill9=True)
        self.assertEqual(self.vfile(name, "/x"), b"kept")
        self.assertEqual(self.vget(name)["attached"], [])


class VolumeCliTest(VolumeMixin, DaemonTest):
    pool = 0

    def moat(self, *args):
        import subprocess
        env = dict(os.environ, MOAT_API_URL="http://127.0.0.1:%d" % self.daemon.port, MOAT_API_KEY=self.c.key)
        return subprocess.run([os.path.join(moatd.BUILD, "moat")] + list(args), env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, timeout=120)

    def test_cli(self):
        name = vname()
        r = self.moat("volume", "create", name, "--size", "20")
        self.assertEqual((r.returncode, r.stdout), (0, (name + "\n").encode()), r.stderr)
        self.addCleanup(self._delete_volume_quietly, self.c, name)
        r = self.moat("volume", "create", name, "--size", "20")
        self.assertEqual(r.returncode, 1)
        self.assertIn(b"already_exists", r.stderr)
        self.assertEqual(self.moat("volume", "create", name).returncode, 2)
        r = self.moat("create", "--volume", name + ":/data")
        self.assertEqual(r.returncode, 0, r.stderr)
        w = r.stdout.decode().strip()
        self.addCleanup(self._delete_quietly, self.c, w)
        r = self.moat("create", "--volume", name + ":/ro:ro")
        self.assertEqual(r.returncode, 0, r.stderr)
        ro = r.stdout.decode().strip()
        self.addCleanup(self._delete_quietly, self.c, ro)
        r = self.moat("create", "--volume", name + ":/data")
        self.assertEqual(r.returncode, 1)
        self.assertIn(b"volume_in_use", r.stderr)
        self.assertEqual(self.moat("create", "--volume", "nocolon").returncode, 2)
        r = self.moat("volume", "ls")
        self.assertEqual(r.returncode, 0, r.stderr)
        line = [ln for ln in r.stdout.decode().splitlines() if ln.startswith(name + " ")][0]
        self.assertIn("%s:/data" % w, line)
        self.assertIn("%s:/ro:ro" % ro, line)
        self.assertEqual(self.c.exec(ro, cmd="touch /ro/x")["exit_code"] != 0, True)
        r = self.moat("volume", "rm", name)
        self.assertEqual(r.returncode, 1)
        self.assertIn(b"volume_in_use", r.stderr)
        self.c.delete(w)
        self.c.delete(ro)
        r = self.moat("volume", "rm", name)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertNotIn(name, self.moat("volume", "ls").stdout.decode())


class VolumeSdkTest(VolumeMixin, DaemonTest):
    """The Python SDK's Volume and Sandbox.create(volumes=...)."""
    pool = 0

    def test_sdk(self):
        sys.path.insert(0, os.path.join(moatd.REPO, "sdk", "python"))
        import moat
        client = moat.Client("http://127.0.0.1:%d" % self.daemon.port, self.c.key)
        name = vname()
        vol = moat.Volume.create(name, 24, client=client)
        self.addCleanup(self._delete_volume_quietly, self.c, name)
        self.assertEqual((vol.name, vol.size_mb, vol.attached), (name, 24, []))
        with self.assertRaises(moat.ConflictError):
            moat.Volume.create(name, 24, client=client)
        with self.assertRaises(ValueError):
            moat.Volume.create(name, 0, client=client)
        self.assertEqual(vol.write("/in/a.txt", "from sdk").size, 8)
        self.assertEqual(vol.read("in/a.txt"), b"from sdk")
        self.assertEqual([e.name for e in vol.list_files("/in")], ["a.txt"])
        with moat.Sandbox.create(volumes=[(vol, "/data")], client=client) as w:
            self.assertEqual(w.exec("cat /data/in/a.txt").stdout, "from sdk")
            w.exec("echo from-sandbox > /data/b")
            with self.assertRaises(moat.ConflictError) as cm:
                moat.Sandbox.create(volumes=[{"name": name, "path": "/data"}], client=client)
            self.assertEqual(cm.exception.code, "volume_in_use")
            with moat.Sandbox.create(volumes=[(name, "/ro", True)], client=client) as r:
                self.assertNotEqual(r.exec("touch /ro/x").exit_code, 0)
                self.assertEqual(r.refresh().volumes, [{"name": name, "path": "/ro", "read_only": True}])
                self.assertEqual(len(vol.refresh().attached), 2)
                if self.c.healthz()["checkpoints"]["available"]:
                    kid = w.fork()[0]
                    try:
                        self.assertEqual(kid.refresh().volumes, [{"name": name, "path": "/data", "read_only": True}])
                        self.assertIn("Read-only", kid.exec("touch /data/k").stderr)
                    finally:
                        kid.kill()
            with self.assertRaises(moat.ConflictError):
                vol.delete()
        self.assertEqual(vol.read("/b"), b"from-sandbox\n")
        vol.remove("/b")
        with self.assertRaises(moat.NotFoundError):
            vol.read("/b")
        self.assertIn(name, [v.name for v in moat.Volume.list(client=client)])
        vol.delete()
        with self.assertRaises(moat.NotFoundError) as cm:
            moat.Volume.get(name, client=client)
        self.assertEqual(cm.exception.code, "volume_not_found")


class VolumeDiskFullTest(VolumeMixin, unittest.TestCase):
    """The data dir on a small file system (test_disk_full's SmallFs), disks not overcommitted: a
    volume is backed by the data dir when made, so it takes its size at once, one the free space
    cannot back is 507 with nothing left behind, and its sandbox writes all of it with the host full."""
    assertApiError = DaemonTest.assertApiError

    def setUp(self):
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from test_disk_full import SmallFs
        self.fs = SmallFs(320)
        self.addCleanup(self.fs.remove)
        self.daemon = moatd.MoatDaemon(pool=0, data_dir=self.fs.data, disk_overcommit=False)
        self.addCleanup(self.daemon.stop)
        self.daemon.start()
        self.c = self.daemon.client

    def test_backed_by_the_data_dir(self):
        free0 = self.fs.free_mb()
        name = self.volume(size_mb=64)["name"]
        free1 = self.fs.free_mb()
        self.assertGreaterEqual(free0 - free1, 64, "a 64 MiB volume took %d MiB: not backed" % (free0 - free1))
        too_big = free1 + 16
        self.assertLess(too_big, 320)
        images = self.images(self.daemon)
        e = self.assertApiError(507, "insufficient_storage", self.c.request, "POST", "/v1/volumes",
                                body={"name": "too-big", "size_mb": too_big})
        self.assertIn("cannot hold", e.body["message"])
        self.assertEqual(self.images(self.daemon), images)
        self.assertEqual(glob.glob(os.path.join(self.fs.data, "host", "volumes", "*.tmp")), [])
        self.assertGreaterEqual(self.fs.free_mb(), free1 - 1, "the refused volume's blocks stayed")
        self.assertApiError(400, "invalid_request", self.c.request, "POST", "/v1/volumes",
                            body={"name": "bigger-than-fs", "size_mb": 100000})
        self.assertApiError(404, "volume_not_found", self.vget, "too-big")
        # the host fills up; the volume's sandbox still writes up to its size
        sid = self.c.create(volumes=[{"name": name, "path": "/data"}], disk_mb=32)["id"]
        self.addCleanup(lambda: self.c.request("DELETE", "/v1/sandboxes/" + sid, expect=(204, 404)))
        self.fs.fill(leave_kib=512)
        self.addCleanup(lambda: os.path.exists(self.fs.filler) and self.fs.unfill())
        r = self.c.exec(sid, cmd="dd if=/dev/urandom of=/data/f bs=1M count=48 conv=fsync 2>&1 && "
                                 "md5sum /data/f | cut -c1-32")
        self.assertEqual(r["exit_code"], 0, r)
        digest = r["stdout"].split()[-1]
        self.fs.unfill()
        self.c.delete(sid)
        got = self.vfile(name, "/f")
        self.assertEqual(len(got), 48 << 20)
        self.assertEqual(__import__("hashlib").md5(got).hexdigest(), digest)

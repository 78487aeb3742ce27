"""Templates from OCI image archives: POST /v1/templates/{name}/import with an oci-archive or a
docker save tarball made here by hand (two layers, a whiteout and an opaque directory, a config with
Env, WorkingDir, User, Entrypoint, Cmd and ExposedPorts), a create that starts the image's command
and waits for its exposed port, and hostile archives that must change nothing outside the image."""

import gzip
import hashlib
import io
import json
import os
import sys
import tarfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))

import probe  # noqa: E402
import sse  # noqa: E402
from moattest import DaemonTest, HTTPError  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
APP = os.path.join(HERE, "..", "lib", "oci_app.c")


def layer(entries):
    """A gzipped layer tar (bytes) of (name, kind, data_or_target, mode, uid) entries."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as t:
        for name, kind, data, mode, uid in entries:
            ti = tarfile.TarInfo(name)
            ti.mode, ti.uid, ti.gid, ti.mtime = mode, uid, uid, 1700000000
            if kind == "dir":
                ti.type = tarfile.DIRTYPE
                t.addfile(ti)
            elif kind == "symlink":
                ti.type = tarfile.SYMTYPE
                ti.linkname = data
                t.addfile(ti)
            else:
                ti.size = len(data)
                t.addfile(ti, io.BytesIO(data))
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=0) as gz:
        gz.write(raw.getvalue())
    return out.getvalue(), raw.getvalue()


def sha(b):
    return hashlib.sha256(b).hexdigest()


CONFIG = {
    "Env": ["PATH=/bin", "GREETING=hi from the image"],
    "WorkingDir": "/data",
    "User": "app",
    "Entrypoint": ["/bin/oci_app"],
    "Cmd": ["serve", "8081"],
    "ExposedPorts": {"8081/tcp": {}},
    "Labels": {"org.opencontainers.image.title": "oci-test"},
}


def image_layers(app):
    passwd = b"root:x:0:0:root:/:/bin/oci_app\napp:x:1000:1000::/home/app:/bin/oci_app\n"
    group = b"root:x:0:\napp:x:1000:\n"
    l1 = layer([
        ("bin", "dir", None, 0o755, 0), ("bin/oci_app", "file", app, 0o755, 0),
        ("etc", "dir", None, 0o755, 0), ("etc/passwd", "file", passwd, 0o644, 0),
        ("etc/group", "file", group, 0o644, 0),
        ("home", "dir", None, 0o755, 0), ("home/app", "dir", None, 0o755, 1000),
        ("tmp", "dir", None, 0o1777, 0),
        ("data", "dir", None, 0o755, 1000), ("data/old.txt", "file", b"old\n", 0o644, 1000),
        ("data/keep.txt", "file", b"keep\n", 0o644, 1000),
        ("data/dir", "dir", None, 0o755, 1000), ("data/dir/x", "file", b"x\n", 0o644, 1000),
    ])
    l2 = layer([
        ("data/.wh.old.txt", "file", b"", 0o644, 0),
        ("data/dir", "dir", None, 0o755, 1000), ("data/dir/.wh..wh..opq", "file", b"", 0o644, 0),
        ("data/dir/y", "file", b"y\n", 0o644, 1000), ("data/new.txt", "file", b"new\n", 0o640, 1000),
    ])
    return [l1, l2]


def config_blob(layers, config=None):
    return json.dumps({
        "architecture": "amd64", "os": "linux", "config": config or CONFIG,
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + sha(raw) for _, raw in layers]},
    }).encode()


def add(t, name, data):
    ti = tarfile.TarInfo(name)
    ti.size, ti.mtime = len(data), 1700000000
    t.addfile(ti, io.BytesIO(data))


def oci_archive(layers, config=None, corrupt_layer=False):
    cfg = config_blob(layers, config)
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": "sha256:" + sha(cfg),
                   "size": len(cfg)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": "sha256:" + sha(gz),
                    "size": len(gz)} for gz, _ in layers],
    }).encode()
    index = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": "sha256:" + sha(manifest),
                       "size": len(manifest), "annotations": {"org.opencontainers.image.ref.name": "latest"}}],
    }).encode()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        add(t, "oci-layout", b'{"imageLayoutVersion": "1.0.0"}')
        add(t, "index.json", index)
        add(t, "blobs/sha256/" + sha(manifest), manifest)
        add(t, "blobs/sha256/" + sha(cfg), cfg)
        for i, (gz, _) in enumerate(layers):
            add(t, "blobs/sha256/" + sha(gz), gz[:-8] + b"\0" * 8 if corrupt_layer and i == 0 else gz)
    return buf.getvalue()


def docker_save(layers):
    cfg = config_blob(layers)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        names = []
        for i, (_, raw) in enumerate(layers):
            names.append("l%d/layer.tar" % i)
            add(t, names[-1], raw)
        add(t, sha(cfg) + ".json", cfg)
        add(t, "manifest.json", json.dumps([{"Config": sha(cfg) + ".json", "RepoTags": ["app:1"],
                                             "Layers": names}]).encode())
    return buf.getvalue()


class TemplateImportTest(DaemonTest):
    pool = 0

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.app = probe.build_static(APP)

    def import_(self, name, archive, expect=201, client=None):
        r = (client or self.c).request("POST", "/v1/templates/%s/import" % name, raw=archive,
                                       headers={"Content-Type": "application/x-tar"}, expect=expect,
                                       timeout=300)[1]
        if expect == 201:
            self.addCleanup(self._delete_template, name)
        return r

    def _delete_template(self, name):
        try:
            self.c.request("DELETE", "/v1/templates/" + name, expect=(204, 404))
        except Exception:
            pass

    def check_image(self, name):
        sb = self.sandbox(template=name)
        sid = sb["id"]
        # the create waited for the exposed port: the image's server answers at once
        r = self.c.exec(sid, argv=["oci_app", "get", "8081"])
        self.assertEqual((r["exit_code"], r["stdout"]), (0, "hello from oci\n"), r)
        r = self.c.exec(sid, argv=["oci_app", "env"], user="app", cwd="/data")
        self.assertIn("uid=1000 cwd=/data", r["stdout"])
        self.assertIn("GREETING=hi from the image", r["stdout"], r)
        listing = self.c.request("GET", "/v1/sandboxes/%s/files/list" % sid, query={"path": "/data"})[1]
        names = sorted(e["name"] for e in listing["entries"])
        self.assertEqual(names, ["dir", "keep.txt", "new.txt"], listing)
        listing = self.c.request("GET", "/v1/sandboxes/%s/files/list" % sid, query={"path": "/data/dir"})[1]
        self.assertEqual([e["name"] for e in listing["entries"]], ["y"], listing)
        procs = self.c.request("GET", "/v1/sandboxes/%s/processes" % sid)[1]["processes"]
        start = [p for p in procs if p.get("tag") == "start"]
        self.assertEqual(len(start), 1, procs)
        self.assertEqual(start[0]["argv"], ["/bin/oci_app", "serve", "8081"])

    def test_oci_archive(self):
        t = self.import_("ociapp", oci_archive(image_layers(self.app)))
        self.assertEqual((t["source"], t["state"], t["usable"]), ("oci", "ready", True), t)
        self.assertTrue(t["from"].startswith("sha256:"), t)
        cfg = t["config"]
        self.assertEqual(cfg["start"], ["/bin/oci_app", "serve", "8081"])
        self.assertEqual((cfg["user"], cfg["workdir"], cfg["exposed"]), ("app", "/data", ["8081/tcp"]), cfg)
        self.assertEqual(cfg["labels"], CONFIG["Labels"])
        self.check_image("ociapp")
        # the same archive again makes no second image
        images = os.path.join(self.daemon.data_dir, "images")
        before = sorted(os.listdir(images))
        self.import_("ociapp", oci_archive(image_layers(self.app)))
        self.assertEqual(sorted(os.listdir(images)), before)

    def test_docker_save(self):
        t = self.import_("dockerapp", docker_save(image_layers(self.app)))
        self.assertEqual(t["source"], "oci")
        self.check_image("dockerapp")

    def test_build_from_an_imported_image(self):
        self.import_("ocibase", oci_archive(image_layers(self.app)))
        df = b"FROM ocibase\nCOPY extra.txt /data/extra.txt\nCMD [\"serve\", \"8082\"]\nEXPOSE 8082\n"
        ctx = io.BytesIO()
        with tarfile.open(fileobj=ctx, mode="w") as t:
            add(t, "Dockerfile", df)
            add(t, "extra.txt", b"extra\n")
        b = self.c.request("POST", "/v1/templates/ocichild", raw=ctx.getvalue(),
                           headers={"Content-Type": "application/x-tar"}, expect=202)[1]
        self.addCleanup(self._delete_template, "ocichild")

        s = sse.open(self.c, "GET", "/v1/templates/ocichild/builds/%s/logs" % b["build_id"], query={"follow": "true"})
        end = None
        try:
            while end is None:
                ev = s.next(300)
                self.assertIsNotNone(ev)
                if ev.name == "end":
                    end = ev.data
        finally:
            s.close()
        self.assertEqual(end["state"], "ready", end)
        got = self.c.request("GET", "/v1/templates/ocichild")[1]
        # ENTRYPOINT from the base image, CMD from the Dockerfile; the base's env and user are kept
        self.assertEqual(got["config"]["start"], ["/bin/oci_app", "serve", "8082"], got)
        self.assertEqual(got["config"]["user"], "app")
        sb = self.sandbox(template="ocichild")
        r = self.c.exec(sb["id"], argv=["oci_app", "get", "8082"])
        self.assertEqual(r["stdout"], "hello from oci\n", r)
        self.assertEqual(self.c.get_file(sb["id"], "/data/extra.txt"), b"extra\n")

    def test_hostile_archives(self):
        layers = image_layers(self.app)
        marker = "/moat-oci-escape-%d" % os.getpid()
        self.addCleanup(lambda: os.path.exists(marker) and os.unlink(marker))

        def refused(archive, *words):
            with self.assertRaises(HTTPError) as cm:
                self.import_("hostile", archive)
            self.assertEqual(cm.exception.status, 400, cm.exception.body)
            for w in words:
                self.assertIn(w, cm.exception.body["message"])

        refused(oci_archive(layers, corrupt_layer=True))
        refused(oci_archive([layer([("../../" + marker.lstrip("/"), "file", b"x", 0o644, 0)])] + layers), "..")
        refused(oci_archive([layer([(marker, "file", b"x", 0o644, 0)])]))
        refused(oci_archive(layers, config=dict(CONFIG)).replace(b'"amd64"', b'"s390x"'))
        refused(b"not an archive" * 100)
        self.assertFalse(os.path.exists(marker))
        # a layer plants etc -> /, the next writes through it: the file lands in the image's root
        planted = [layer([("bin", "dir", None, 0o755, 0), ("bin/oci_app", "file", self.app, 0o755, 0),
                          ("etc", "symlink", "/", 0o777, 0)]),
                   layer([("etc" + marker, "file", b"inside\n", 0o644, 0)])]
        self.import_("planted", oci_archive(planted, config={"Env": ["PATH=/bin"]}))
        self.assertFalse(os.path.exists(marker), "a layer wrote onto the host")
        sb = self.sandbox(template="planted")
        self.assertEqual(self.c.get_file(sb["id"], marker), b"inside\n")
        # an image whose /dev leads elsewhere: moatd mounts every sandbox's own /dev there, so it is refused
        hostdir = "/tmp/moat-oci-dev-%d" % os.getpid()
        os.mkdir(hostdir)
        os.chmod(hostdir, 0o777)
        self.addCleanup(lambda: __import__("shutil").rmtree(hostdir, ignore_errors=True))
        devlink = [layer([("bin", "dir", None, 0o755, 0), ("bin/oci_app", "file", self.app, 0o755, 0),
                          ("dev", "symlink", hostdir, 0o777, 0)])]
        refused(oci_archive(devlink, config={"Env": ["PATH=/bin"]}), "/dev")
        self.assertEqual(os.listdir(hostdir), [])
        names = [x["name"] for x in self.c.request("GET", "/v1/templates")[1]["templates"]]
        self.assertNotIn("hostile", names)
        # another org neither sees nor uses the imported template
        other = self.c.with_key(self.daemon.new_org_key("org-oci-b"))
        with self.assertRaises(HTTPError) as cm:
            other.request("GET", "/v1/templates/planted")
        self.assertEqual(cm.exception.status, 404)
        with self.assertRaises(HTTPError) as cm:
            other.create(template="planted")
        self.assertEqual(cm.exception.status, 400)

"""Attacks through template builds: a Dockerfile whose RUN plants links that a later COPY writes
through, an ADD whose tar replaces a mount point with a link to a host directory, and a second org
that builds the same Dockerfile to find out, from the step cache, what the first one built. Each
checks the effect outside the attacker's build: the host's directories, the other org's answers."""

import io
import os
import shutil
import sys
import tarfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))

from moattest import DaemonTest, HTTPError  # noqa: E402
from test_template_build import build, follow, tar_of  # noqa: E402


def tar_entries(entries):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for name, kind, data in entries:
            ti = tarfile.TarInfo(name)
            if kind == "symlink":
                ti.type, ti.linkname = tarfile.SYMTYPE, data
                t.addfile(ti)
            else:
                ti.size = len(data)
                t.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


class TemplateBuildAttackTest(DaemonTest):
    pool = 0

    def setUp(self):
        self.hostdir = "/tmp/moat-build-attack-%d" % os.getpid()
        os.makedirs(self.hostdir, exist_ok=True)
        os.chmod(self.hostdir, 0o777)
        self.addCleanup(shutil.rmtree, self.hostdir, True)

    def delete_later(self, client, name):
        self.addCleanup(lambda: client.request("DELETE", "/v1/templates/" + name, expect=(204, 404, 409)))

    def test_copy_through_links_a_run_planted(self):
        df = ("FROM base\n"
              "RUN ln -s %s /planted && ln -s / /etc/rootlink && mkdir -p /srv && ln -s %s/x /srv/file\n"
              "COPY payload /planted/payload\n"
              "COPY payload /etc/rootlink%s/payload2\n"
              "COPY payload /srv/file\n" % (self.hostdir, self.hostdir, self.hostdir))
        t = build(self.c, "linky", tar_of({"Dockerfile": df.encode(), "payload": b"pwned\n"}))
        self.delete_later(self.c, "linky")
        logs, end = follow(self.c, "linky", t["build_id"])
        self.assertEqual(os.listdir(self.hostdir), [], "a COPY wrote onto the host")
        if end["state"] == "ready":  # the writes land inside the image, where its own links lead
            sb = self.sandbox(template="linky")
            r = self.c.exec(sb["id"], argv=["cat", self.hostdir + "/payload", self.hostdir + "/payload2"])
            self.assertEqual(r["stdout"], "pwned\npwned\n", r)
            r = self.c.exec(sb["id"], argv=["sh", "-c", "test -L /srv/file && echo link || cat /srv/file"])
            self.assertEqual(r["stdout"], "pwned\n", r)
        self.assertEqual(os.listdir(self.hostdir), [])

    def test_add_tar_replacing_a_mount_point_with_a_link(self):
        evil = tar_entries([("run", "symlink", self.hostdir), ("dev", "symlink", self.hostdir),
                            ("proc", "symlink", self.hostdir)])
        df = b"FROM base\nADD evil.tar /\n"
        try:
            t = build(self.c, "mountlink", tar_of({"Dockerfile": df, "evil.tar": evil}))
        except HTTPError as e:  # refused outright is fine too
            self.assertEqual(e.status, 400, e.body)
            t = None
        if t:
            self.delete_later(self.c, "mountlink")
            logs, end = follow(self.c, "mountlink", t["build_id"])
            if end["state"] == "ready":
                with self.assertRaises(HTTPError) as cm:
                    self.c.create(template="mountlink")
                self.assertIn(cm.exception.status, (400, 409, 500), cm.exception.body)
        self.assertEqual(os.listdir(self.hostdir), [], "moatd mounted or wrote through the image's link")

    def test_step_cache_is_per_org(self):
        df = b"FROM base\nRUN echo secret-recipe > /recipe\nCOPY a.txt /a.txt\n"
        ctx = tar_of({"Dockerfile": df, "a.txt": b"a\n"})
        t = build(self.c, "recipe", ctx)
        self.delete_later(self.c, "recipe")
        self.assertEqual(follow(self.c, "recipe", t["build_id"])[1]["state"], "ready")
        other = self.c.with_key(self.daemon.new_org_key("org-cache-b"))
        t2 = build(other, "recipe", ctx)
        self.delete_later(other, "recipe")
        logs, end = follow(other, "recipe", t2["build_id"])
        self.assertEqual(end["state"], "ready", end)
        cached = [r for r in logs if r["text"].startswith("CACHED")]
        self.assertEqual(cached, [], "org B's build was served from org A's cache")
        # and each org's image is its own
        self.assertNotEqual(end["image"], None)
        mine = follow(self.c, "recipe", t["build_id"])[1]
        self.assertNotEqual(mine["image"], end["image"])
        # org B's build sandboxes were org B's: org A never saw them
        self.assertEqual([s for s in self.c.list() if s.get("metadata", {}).get("moat.build") == t2["build_id"]],
                         [])

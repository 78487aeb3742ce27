"""test_files.py -- the files API: round trips of binary data, list/stat/mkdir/move/remove and the
mapping of errors to statuses with JSON bodies."""

import hashlib
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
from moattest import DaemonTest  # noqa: E402


class FilesTest(DaemonTest):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.sid = cls.c.create(ttl_seconds=3600)["id"]

    def test_binary_round_trip_50mib(self):
        data = os.urandom(50 << 20)
        want = hashlib.sha256(data).hexdigest()
        r = self.c.put_file(self.sid, "/root/big/blob.bin", data)
        self.assertEqual(r["size"], len(data))
        self.assertEqual(r["path"], "/root/big/blob.bin")
        got = self.c.get_file(self.sid, "/root/big/blob.bin")
        self.assertEqual(len(got), len(data))
        self.assertEqual(hashlib.sha256(got).hexdigest(), want)
        # the sandbox sees the same bytes
        self.assertEqual(self.c.sh(self.sid, "sha256sum /root/big/blob.bin").split()[0], want)
        self.c.delete_file(self.sid, "/root/big", recursive=True)

    def test_small_and_empty_files(self):
        self.c.put_file(self.sid, "/tmp/empty", b"")
        self.assertEqual(self.c.get_file(self.sid, "/tmp/empty"), b"")
        blob = bytes(range(256))
        self.c.put_file(self.sid, "/tmp/all-bytes", blob)
        self.assertEqual(self.c.get_file(self.sid, "/tmp/all-bytes"), blob)
        # overwrite replaces the whole content
        self.c.put_file(self.sid, "/tmp/all-bytes", b"short")
        self.assertEqual(self.c.get_file(self.sid, "/tmp/all-bytes"), b"short")
        # written inside, read through the API
        self.c.sh(self.sid, "printf 'from inside' > /tmp/inside.txt")
        self.assertEqual(self.c.get_file(self.sid, "/tmp/inside.txt"), b"from inside")

    def test_mode_and_stat(self):
        self.c.put_file(self.sid, "/tmp/modes/script.sh", b"#!/bin/sh\necho run-me\n", mode="0755")
        e = self.c.stat(self.sid, "/tmp/modes/script.sh")
        self.assertEqual((e["type"], e["mode"], e["size"], e["name"], e["path"]),
                         ("file", "0755", 22, "script.sh", "/tmp/modes/script.sh"))
        self.assertEqual((e["uid"], e["gid"]), (0, 0))
        self.assertIn("mtime", e)
        self.assertEqual(self.c.sh(self.sid, "/tmp/modes/script.sh"), "run-me\n")
        self.c.put_file(self.sid, "/tmp/modes/plain", b"x")
        self.assertEqual(self.c.stat(self.sid, "/tmp/modes/plain")["mode"], "0644")
        d = self.c.stat(self.sid, "/tmp/modes")
        self.assertEqual(d["type"], "dir")
        self.c.sh(self.sid, "ln -sf /etc/hostname /tmp/modes/link")
        ln = self.c.stat(self.sid, "/tmp/modes/link")
        self.assertEqual(ln["type"], "symlink")
        self.assertEqual(ln["symlink_target"], "/etc/hostname")

    def test_list(self):
        self.c.put_file(self.sid, "/tmp/ls/a.txt", b"aaa")
        self.c.put_file(self.sid, "/tmp/ls/sub/b.txt", b"bb")
        ents = self.c.list_files(self.sid, "/tmp/ls")["entries"]
        names = sorted(e["name"] for e in ents)
        self.assertEqual(names, ["a.txt", "sub"])
        by = {e["name"]: e for e in ents}
        self.assertEqual(by["a.txt"]["size"], 3)
        self.assertEqual(by["a.txt"]["type"], "file")
        self.assertEqual(by["a.txt"]["path"], "/tmp/ls/a.txt")
        self.assertEqual(by["sub"]["type"], "dir")
        deep = self.c.list_files(self.sid, "/tmp/ls", depth=2)["entries"]
        self.assertIn("/tmp/ls/sub/b.txt", [e["path"] for e in deep])

    def test_mkdir_move_remove(self):
        e = self.c.mkdir(self.sid, "/tmp/mk/a/b/c")
        self.assertEqual((e["type"], e["path"]), ("dir", "/tmp/mk/a/b/c"))
        self.assertApiError(409, "already_exists", self.c.mkdir, self.sid, "/tmp/mk/a/b/c", parents=False)
        self.assertApiError(404, "not_found", self.c.mkdir, self.sid, "/tmp/mk/nope/x", parents=False)
        self.c.put_file(self.sid, "/tmp/mk/a/f.txt", b"move me")
        m = self.c.move(self.sid, "/tmp/mk/a/f.txt", "/tmp/mk/moved.txt")
        self.assertEqual(m["path"], "/tmp/mk/moved.txt")
        self.assertEqual(self.c.get_file(self.sid, "/tmp/mk/moved.txt"), b"move me")
        self.assertApiError(404, "not_found", self.c.get_file, self.sid, "/tmp/mk/a/f.txt")
        self.assertApiError(404, "not_found", self.c.move, self.sid, "/tmp/mk/none", "/tmp/mk/x")
        self.c.delete_file(self.sid, "/tmp/mk/moved.txt")
        self.assertApiError(404, "not_found", self.c.stat, self.sid, "/tmp/mk/moved.txt")
        self.assertApiError(404, "not_found", self.c.delete_file, self.sid, "/tmp/mk/moved.txt")
        # non-empty dir: refused without recursive, removed with it
        self.assertApiError((400, 409), None, self.c.delete_file, self.sid, "/tmp/mk")
        self.c.delete_file(self.sid, "/tmp/mk", recursive=True)
        self.assertApiError(404, "not_found", self.c.stat, self.sid, "/tmp/mk")

    def test_error_mapping(self):
        self.assertApiError(404, "not_found", self.c.get_file, self.sid, "/no/such/file")
        self.assertApiError(404, "not_found", self.c.stat, self.sid, "/no/such/file")
        self.assertApiError(404, "not_found", self.c.list_files, self.sid, "/no/such/dir")
        self.assertApiError(400, None, self.c.get_file, self.sid, "/etc")  # EISDIR
        self.c.put_file(self.sid, "/tmp/plainfile", b"x")
        self.assertApiError(400, None, self.c.put_file, self.sid, "/tmp/plainfile/child", b"y")  # ENOTDIR
        self.assertApiError(400, None, self.c.mkdir, self.sid, "/tmp/plainfile/d", parents=False)
        self.assertApiError(409, "already_exists", self.c.mkdir, self.sid, "/tmp/plainfile", parents=False)
        # the unprivileged user cannot read root's home (0700)
        self.c.put_file(self.sid, "/root/private.txt", b"secret")
        self.assertApiError(403, "forbidden", self.c.get_file, self.sid, "/root/private.txt", user="user")
        self.assertApiError(403, "forbidden", self.c.put_file, self.sid, "/root/by-user.txt", b"x", user="user")

    def test_relative_paths_and_user(self):
        self.c.put_file(self.sid, "rel.txt", b"root-rel")
        self.assertEqual(self.c.sh(self.sid, "cat /root/rel.txt"), "root-rel")
        self.c.put_file(self.sid, "rel.txt", b"user-rel", user="user")
        self.assertEqual(self.c.sh(self.sid, "cat /home/user/rel.txt; stat -c %u /home/user/rel.txt"),
                         "user-rel1000\n")
        self.assertEqual(self.c.get_file(self.sid, "rel.txt", user="user"), b"user-rel")

"""test_watch.py -- GET /v1/sandboxes/{id}/files/watch (SSE): create, write, rename and remove events,
recursive watches, bad input, and a client that goes away."""

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
import sse  # noqa: E402
from moattest import DaemonTest  # noqa: E402


class WatchTest(DaemonTest):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.sid = cls.c.create(ttl_seconds=3600)["id"]

    def watch(self, **query):
        return sse.open(self.c, "GET", "/v1/sandboxes/%s/files/watch" % self.sid, query=query)

    def collect(self, s, until, timeout=10):
        evs = []
        deadline = time.time() + timeout
        while not until(evs):
            left = deadline - time.time()
            if left <= 0:
                self.fail("events so far: %r" % [e.data for e in evs])
            ev = s.next(left)
            self.assertIsNotNone(ev, "the watch ended: %r" % evs)
            self.assertEqual(ev.name, ev.data["event"], ev)
            evs.append(ev)
        return [e.data for e in evs]

    def test_create_write_rename_remove(self):
        self.c.mkdir(self.sid, "/tmp/w1")
        s = self.watch(path="/tmp/w1")
        self.c.sh(self.sid, "touch /tmp/w1/a && echo data >> /tmp/w1/a")
        self.c.sh(self.sid, "mv /tmp/w1/a /tmp/w1/b")
        self.c.sh(self.sid, "rm /tmp/w1/b")

        def seen(evs, kind, suffix):
            return any(e.data["event"] == kind and e.data["path"].endswith(suffix) for e in evs)

        got = self.collect(s, lambda evs: seen(evs, "remove", "/b"))
        s.close()
        kinds = [(e["event"], os.path.basename(e["path"])) for e in got]
        self.assertIn(("create", "a"), kinds)
        self.assertIn(("write", "a"), kinds)
        renames = [e for e in got if e["event"] == "rename"]
        self.assertTrue(renames, got)
        self.assertTrue(renames[0]["path"].endswith("/a") and renames[0]["path2"].endswith("/b"), renames)
        self.assertLess(kinds.index(("create", "a")), kinds.index(("remove", "b")))

    def test_recursive(self):
        self.c.mkdir(self.sid, "/tmp/w2/sub/deeper")
        s = self.watch(path="/tmp/w2", recursive="true")
        self.c.sh(self.sid, "echo x > /tmp/w2/sub/deeper/f")
        got = self.collect(s, lambda evs: any(e.data["path"].endswith("/sub/deeper/f") for e in evs))
        s.close()
        self.assertTrue(any(e["event"] == "create" for e in got), got)
        # without recursive, events below the top directory are not reported
        s = self.watch(path="/tmp/w2")
        self.c.sh(self.sid, "echo y > /tmp/w2/sub/deeper/g; echo z > /tmp/w2/top")
        got = self.collect(s, lambda evs: any(e.data["path"].endswith("/top") for e in evs))
        s.close()
        self.assertFalse(any(e["path"].endswith("/g") for e in got), got)

    def test_bad_input(self):
        p = "/v1/sandboxes/%s/files/watch" % self.sid
        self.assertApiError(400, "invalid_request", sse.open, self.c, "GET", p)
        self.assertApiError(400, "invalid_request", sse.open, self.c, "GET", p, query={"path": "/tmp", "x": "1"})
        self.assertApiError(400, "invalid_request", sse.open, self.c, "GET", p,
                            query={"path": "/tmp", "recursive": "maybe"})
        self.assertApiError(404, "not_found", sse.open, self.c, "GET", p, query={"path": "/no/such/dir"})
        self.assertApiError(400, "invalid_request", sse.open, self.c, "GET", p, query={"path": "/etc/hostname"})
        self.assertApiError(404, "not_found", sse.open, self.c, "GET",
                            "/v1/sandboxes/sb-0123456789abcdefg/files/watch", query={"path": "/tmp"})

    def test_client_goes_away(self):
        self.c.mkdir(self.sid, "/tmp/w3")
        for _ in range(20):
            s = self.watch(path="/tmp/w3")
            s.close()
        s = self.watch(path="/tmp/w3")
        self.c.sh(self.sid, "touch /tmp/w3/x")
        got = self.collect(s, lambda evs: bool(evs))
        s.close()
        self.assertEqual(got[0]["event"], "create")
        self.assertAlive(self.sid)

"""test_audit.py -- GET /v1/audit: every mutating call of an org, with its time, key, method, route,
path, target and status (failures too), its own org's only, paged by an opaque cursor, filtered by
time, target and key; reads are not recorded; a key given in the query string is not kept; bad
input is 400; entries older than the retention (moatd --audit-retention-days) go."""

import os
import sqlite3
import sys
import time
import unittest
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
import moatd  # noqa: E402
from moattest import DaemonTest  # noqa: E402


class AuditTest(DaemonTest):
    pool = 1

    def setUp(self):
        self.org = "org-" + uuid.uuid4().hex[:8]
        self.admin = self.c.with_key(self.daemon.new_org_key(self.org))

    def audit(self, client=None, expect=200, **query):
        return (client or self.admin).request("GET", "/v1/audit", query=query or None, expect=expect)[1]

    def test_mutations_recorded_reads_not(self):
        t0 = int(time.time() * 1000)
        sb = self.admin.create()
        sid = sb["id"]
        self.admin.exec(sid, argv=["true"])
        self.admin.request("GET", "/v1/sandboxes/" + sid)
        self.assertApiError(400, None, self.admin.request, "POST", "/v1/sandboxes", body={"template": 42})
        self.admin.delete(sid)
        me = self.admin.request("GET", "/v1/me")[1]
        got = self.audit()["entries"]
        rows = [(e["method"], e["route"], e["target"], e["status"]) for e in got]
        self.assertEqual(rows[0], ("POST", "sandboxes.create", None, 201), got)
        self.assertIn(("POST", "exec", sid, 200), rows)
        self.assertIn(("POST", "sandboxes.create", None, 400), rows)
        self.assertIn(("DELETE", "sandbox.delete", sid, 204), rows)
        self.assertFalse([e for e in got if e["method"] == "GET"], got)
        for e in got:
            self.assertEqual(e["key_id"], me["key"]["id"])
            self.assertGreaterEqual(e["at_ms"], t0 - 1000)
            self.assertTrue(e["path"].startswith("/v1/"), e)
        # filters: target, key, time
        self.assertEqual({e["target"] for e in self.audit(target=sid)["entries"]}, {sid})
        self.assertEqual(self.audit(key="key-nosuchkey000000")["entries"], [])
        later = self.audit(**{"from": str(int(time.time() * 1000) + 60000), "to": str(int(time.time() * 1000) + 120000)})
        self.assertEqual(later["entries"], [])

    def test_other_org_sees_nothing_of_it(self):
        sid = self.admin.create()["id"]
        self.addCleanup(self._delete_quietly, self.admin, sid)
        other = self.c.with_key(self.daemon.new_org_key("org-" + uuid.uuid4().hex[:8]))
        self.assertEqual(self.audit(client=other)["entries"], [])
        self.assertEqual(self.audit(client=other, target=sid)["entries"], [])

    def test_paging(self):
        for i in range(7):
            self.admin.request("POST", "/v1/volumes", body={"name": "v%d-%s" % (i, uuid.uuid4().hex[:4]), "size_mb": 16},
                               expect=(201, 400, 507))
        seen, cursor, pages = [], None, 0
        while True:
            q = {"limit": "3"}
            if cursor:
                q["cursor"] = cursor
            page = self.audit(**q)
            seen += [e["seq"] for e in page["entries"]]
            pages += 1
            cursor = page["next"]
            if not cursor:
                break
        self.assertEqual(len(seen), 7)
        self.assertEqual(seen, sorted(seen))
        self.assertEqual(pages, 3)

    def test_query_key_not_kept(self):
        secret = self.admin.key
        sid = self.admin.create()["id"]
        self.addCleanup(self._delete_quietly, self.admin, sid)
        self.admin.request("POST", "/v1/sandboxes/%s/exec" % sid, body={"argv": ["true"]},
                           query={"api_key": secret}, expect=(200, 400))
        for e in self.audit()["entries"]:
            self.assertNotIn(secret, e["path"])
        db = sqlite3.connect("file:%s?mode=ro" % os.path.join(self.daemon.data_dir, "moat.db"), uri=True)
        try:
            dump = "\n".join(str(r) for r in db.execute("SELECT * FROM audit"))
        finally:
            db.close()
        self.assertNotIn(secret, dump)

    def test_bad_input(self):
        now = int(time.time() * 1000)
        for q in ({"from": "yesterday"}, {"to": "12:00"}, {"from": str(now), "to": str(now - 1000)},
                  {"from": str(now - 400 * 86400000), "to": str(now)}, {"limit": "0"}, {"limit": "1001"},
                  {"limit": "x"}, {"cursor": "12"}, {"cursor": "a"}, {"cursor": "a-1"}, {"target": ""},
                  {"key": "k" * 65}, {"org": "other"}):
            with self.subTest(q=q):
                self.assertApiError(400, "invalid_request", self.admin.request, "GET", "/v1/audit", query=q)


class AuditRetentionTest(unittest.TestCase):
    def test_old_entries_go(self):
        d = moatd.MoatDaemon(pool=0, extra_args=["--audit-retention-days", "1"])
        self.addCleanup(d.stop)
        d.start()
        c = d.client
        c.request("POST", "/v1/volumes", body={"name": "keep", "size_mb": 16}, expect=(201, 507))
        d.terminate()
        db = sqlite3.connect(os.path.join(d.data_dir, "moat.db"))
        try:
            db.execute("UPDATE audit SET at_ms = at_ms - 2 * 86400000")
            db.commit()
        finally:
            db.close()
        d.start()
        c = d.client
        c.request("POST", "/v1/volumes", body={"name": "new", "size_mb": 16}, expect=(201, 507))
        deadline = time.time() + 30
        while True:
            db = sqlite3.connect("file:%s?mode=ro" % os.path.join(d.data_dir, "moat.db"), uri=True)
            try:
                n = db.execute("SELECT count(*) FROM audit WHERE path LIKE '/v1/volumes%' AND at_ms < ?",
                               (int(time.time() * 1000) - 86400000,)).fetchone()[0]
            finally:
                db.close()
            if n == 0:
                break
            self.assertLess(time.time(), deadline, "the old entry is still there")
            time.sleep(0.5)
        entries = c.request("GET", "/v1/audit")[1]["entries"]
        self.assertEqual([e["path"] for e in entries if e["path"].startswith("/v1/volumes")], ["/v1/volumes"])


if __name__ == "__main__":
    unittest.main()


class AuditOffTest(DaemonTest):
    """moatd --audit off records nothing new; the log stays readable (and empty here)."""
    pool = 0
    daemon_args = ("--audit", "off")

    def test_nothing_recorded(self):
        sb = self.sandbox()
        self.c.exec(sb["id"], cmd="true")
        self.c.request("POST", "/v1/keys", body={"name": "k"}, expect=201)
        self.assertEqual(self.c.request("GET", "/v1/audit")[1]["entries"], [])

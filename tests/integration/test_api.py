"""test_api.py -- health, auth, the sandbox CRUD routes, list filters and org isolation."""

import re
import time
import uuid

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
from moattest import DaemonTest  # noqa: E402

RFC3339_MS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def parse_ts(s):
    return time.mktime(time.strptime(s[:19], "%Y-%m-%dT%H:%M:%S")) - time.timezone + int(s[20:23]) / 1000.0


class ApiTest(DaemonTest):
    def test_healthz_without_auth(self):
        st, body = self.c.request("GET", "/healthz", auth=False)
        self.assertEqual(st, 200)
        self.assertEqual(body.get("status"), "ok")
        self.assertIsInstance(body.get("version"), str)

    def test_auth_required(self):
        noauth = self.c.with_key(None)
        bad = self.c.with_key("not-a-key-" + uuid.uuid4().hex)
        for cli in (noauth, bad):
            self.assertApiError(401, "unauthorized", cli.list)
            self.assertApiError(401, "unauthorized", cli.create)
            self.assertApiError(401, "unauthorized", cli.get, "sb-doesnotexist00000")
            self.assertApiError(401, "unauthorized", cli.request, "GET", "/v1/templates")
        # X-API-Key works as well as Bearer
        st, body = self.c.request("GET", "/v1/sandboxes", auth=False, headers={"X-API-Key": self.c.key})
        self.assertEqual(st, 200)
        self.assertIn("sandboxes", body)
        self.assertApiError(401, "unauthorized", self.c.request, "GET", "/v1/sandboxes", auth=False,
                            headers={"X-API-Key": "wrong"})

    def test_create_get_list_exec_delete(self):
        t0 = time.time()
        sb = self.c.create(metadata={"who": "crud"}, ttl_seconds=600)
        self.addCleanup(self._delete_quietly, self.c, sb["id"])
        self.assertRegex(sb["id"], r"^sb-[0-9a-z]+$")
        for k in ("id", "template", "state", "created_at", "expires_at", "ttl_seconds", "persistent", "metadata",
                  "cpu", "memory_mb", "pids", "disk_mb", "ready_us", "killed_reason", "killed_at"):
            self.assertIn(k, sb)
        self.assertEqual(sb["template"], "base")
        self.assertEqual(sb["state"], "running")
        self.assertEqual(sb["metadata"], {"who": "crud"})
        self.assertEqual(sb["persistent"], False)
        self.assertEqual(sb["ttl_seconds"], 600)
        self.assertEqual((sb["cpu"], sb["memory_mb"], sb["pids"], sb["disk_mb"]), (2, 2048, 4096, 10240))
        self.assertIsNone(sb["killed_reason"])
        self.assertIsNone(sb["killed_at"])
        self.assertIsInstance(sb["ready_us"], int)
        self.assertGreater(sb["ready_us"], 0)
        self.assertRegex(sb["created_at"], RFC3339_MS)
        self.assertRegex(sb["expires_at"], RFC3339_MS)
        self.assertAlmostEqual(parse_ts(sb["created_at"]), t0, delta=30)
        self.assertAlmostEqual(parse_ts(sb["expires_at"]) - parse_ts(sb["created_at"]), 600, delta=5)

        got = self.c.get(sb["id"])
        self.assertEqual(got["id"], sb["id"])
        self.assertEqual(got["state"], "running")
        ids = [s["id"] for s in self.c.list()]
        self.assertIn(sb["id"], ids)

        r = self.c.exec(sb["id"], cmd="echo hello; echo err >&2; exit 3")
        self.assertEqual((r["stdout"], r["stderr"], r["exit_code"]), ("hello\n", "err\n", 3))

        self.assertEqual(self.c.delete(sb["id"]), 204)
        self.assertNotIn(sb["id"], [s["id"] for s in self.c.list()])
        self.assertIn(sb["id"], [s["id"] for s in self.c.list(state="killed")])
        gone = self.c.request("GET", "/v1/sandboxes/" + sb["id"], expect=(200, 404))
        if gone[0] == 200:
            self.assertEqual(gone[1]["state"], "killed")
            self.assertEqual(gone[1]["killed_reason"], "api")
        self.assertApiError(404, "not_found", self.c.exec, sb["id"], cmd="true")
        self.assertApiError(404, "not_found", self.c.delete, sb["id"])

    def test_get_unknown(self):
        self.assertApiError(404, "not_found", self.c.get, "sb-doesnotexist00000")
        self.assertApiError(404, "not_found", self.c.get, "nonsense")
        self.assertApiError(404, "not_found", self.c.exec, "sb-doesnotexist00000", cmd="true")
        self.assertApiError(404, None, self.c.request, "GET", "/v1/no-such-route")

    def test_list_filters(self):
        tag = uuid.uuid4().hex[:8]
        a = self.sandbox(metadata={"run": tag, "role": "a"})
        b = self.sandbox(metadata={"run": tag, "role": "b"})
        c = self.sandbox(metadata={"run": "other" + tag})
        ids = lambda lst: sorted(s["id"] for s in lst)  # noqa: E731
        self.assertEqual(ids(self.c.list(metadata={"run": tag})), sorted([a["id"], b["id"]]))
        self.assertEqual(ids(self.c.list(metadata={"run": tag, "role": "b"})), [b["id"]])
        self.assertEqual(ids(self.c.list(metadata={"run": tag, "role": "zzz"})), [])
        self.assertEqual(ids(self.c.list(metadata={"run": "other" + tag})), [c["id"]])
        running = ids(self.c.list(state="running", metadata={"run": tag}))
        self.assertEqual(running, sorted([a["id"], b["id"]]))
        self.c.delete(a["id"])
        self.assertEqual(ids(self.c.list(state="running", metadata={"run": tag})), [b["id"]])
        self.assertEqual(ids(self.c.list(state="killed", metadata={"run": tag})), [a["id"]])
        self.assertEqual(ids(self.c.list(metadata={"run": tag})), [b["id"]])
        self.assertApiError(400, "invalid_request", self.c.list, state="bogus")

    def test_other_org_sees_nothing(self):
        other = self.c.with_key(self.daemon.new_org_key("other"))
        sb = self.sandbox(metadata={"org": "mine"})
        sid = sb["id"]
        self.c.put_file(sid, "/root/secret.txt", b"mine")
        self.assertApiError(404, "not_found", other.get, sid)
        self.assertApiError(404, "not_found", other.exec, sid, cmd="true")
        self.assertApiError(404, "not_found", other.get_file, sid, "/root/secret.txt")
        self.assertApiError(404, "not_found", other.put_file, sid, "/root/x", b"x")
        self.assertApiError(404, "not_found", other.list_files, sid, "/")
        self.assertApiError(404, "not_found", other.stat, sid, "/")
        self.assertApiError(404, "not_found", other.mkdir, sid, "/root/d")
        self.assertApiError(404, "not_found", other.move, sid, "/root/secret.txt", "/root/y")
        self.assertApiError(404, "not_found", other.delete_file, sid, "/root/secret.txt")
        self.assertApiError(404, "not_found", other.patch, sid, ttl_seconds=5)
        self.assertApiError(404, "not_found", other.delete, sid)
        self.assertNotIn(sid, [s["id"] for s in other.list()])
        self.assertNotIn(sid, [s["id"] for s in other.list(metadata={"org": "mine"})])
        # the other org's own sandbox is invisible to us, and ours still works
        osb = other.create()
        self.addCleanup(self._delete_quietly, other, osb["id"])
        self.assertApiError(404, "not_found", self.c.get, osb["id"])
        self.assertNotIn(osb["id"], [s["id"] for s in self.c.list()])
        self.assertEqual(self.c.get_file(sid, "/root/secret.txt"), b"mine")
        self.assertEqual(self.c.get(sid)["state"], "running")

    def test_templates_listed(self):
        st, body = self.c.request("GET", "/v1/templates")
        names = {t["name"]: t for t in body["templates"]}
        self.assertIn("base", names)
        self.assertEqual(names["base"]["state"], "ready")
        self.assertApiError(404, "not_found", self.c.request, "POST", "/v1/templates/no-such-recipe/build")


class LifecycleTest(DaemonTest):
    def test_patch(self):
        sb = self.sandbox(ttl_seconds=600, metadata={"a": "1"})
        sid = sb["id"]
        p = self.c.patch(sid, ttl_seconds=1200)
        self.assertEqual(p["ttl_seconds"], 1200)
        self.assertAlmostEqual(parse_ts(p["expires_at"]) - time.time(), 1200, delta=30)
        p = self.c.patch(sid, metadata={"b": "2"})
        self.assertEqual(p["metadata"], {"b": "2"})
        self.assertEqual(self.c.get(sid)["metadata"], {"b": "2"})
        p = self.c.patch(sid, persistent=True)
        self.assertTrue(p["persistent"])
        self.assertIsNone(p["expires_at"])
        p = self.c.patch(sid, persistent=False, ttl_seconds=900)
        self.assertFalse(p["persistent"])
        self.assertAlmostEqual(parse_ts(p["expires_at"]) - time.time(), 900, delta=30)
        self.assertApiError(400, "invalid_request", self.c.patch, sid, ttl_seconds=-1)
        self.assertApiError(400, "invalid_request", self.c.patch, sid, ttl_seconds="10")
        self.assertApiError(400, "invalid_request", self.c.patch, sid, persistent="yes")
        self.assertApiError(400, "invalid_request", self.c.patch, sid, metadata={"k": 1})
        self.assertApiError(400, "invalid_request", self.c.patch, sid, cpu=1)
        self.assertEqual(self.c.get(sid)["metadata"], {"b": "2"})

    def wait_state(self, sid, state, timeout):
        deadline = time.time() + timeout
        last = None
        while time.time() < deadline:
            st, last = self.c.request("GET", "/v1/sandboxes/" + sid, expect=(200, 404))
            if st == 404:
                killed = [s for s in self.c.list(state="killed") if s["id"] == sid]
                last = killed[0] if killed else {"state": "gone"}
            if last.get("state") == state:
                return last
            time.sleep(0.25)
        self.fail("sandbox %s not %s after %ss: %r" % (sid, state, timeout, last))

    def test_ttl_expiry_reaps(self):
        sb = self.sandbox(ttl_seconds=2)
        t0 = time.time()
        k = self.wait_state(sb["id"], "killed", 12)
        self.assertGreaterEqual(time.time() - t0, 1.5)
        self.assertEqual(k["killed_reason"], "ttl")
        self.assertRegex(k["killed_at"], RFC3339_MS)
        self.assertApiError((404, 409), None, self.c.exec, sb["id"], cmd="true")

    def test_activity_refreshes_ttl(self):
        sb = self.sandbox(ttl_seconds=3)
        sid = sb["id"]
        t0 = time.time()
        while time.time() - t0 < 7:
            r = self.c.exec(sid, cmd="true")
            self.assertEqual(r["exit_code"], 0)
            time.sleep(0.7)
        self.assertEqual(self.c.get(sid)["state"], "running")
        k = self.wait_state(sid, "killed", 12)
        self.assertEqual(k["killed_reason"], "ttl")

    def test_persistent_not_reaped(self):
        sb = self.sandbox(ttl_seconds=1, persistent=True)
        self.assertIsNone(sb["expires_at"])
        time.sleep(4)
        self.assertEqual(self.c.get(sb["id"])["state"], "running")
        self.assertAlive(sb["id"])
        # no longer persistent: the TTL applies again
        self.c.patch(sb["id"], persistent=False, ttl_seconds=1)
        k = self.wait_state(sb["id"], "killed", 12)
        self.assertEqual(k["killed_reason"], "ttl")


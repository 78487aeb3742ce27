"""test_ui.py -- the web dashboard moatd serves at /ui/, against a real moatd.

Over HTTP: the built files with their Content-Type and security headers (CSP default-src 'self',
frame-ancestors 'none', X-Frame-Options DENY), paths outside the manifest refused (traversal in its
spellings), sign-in trading a key for an HttpOnly SameSite=Strict cookie with an expiry, the cookie
accepted by the v1 API for reads, mutations refused without X-Moat-UI: 1 and from another Origin, a
revoked key ending its session, sign-out, the platform key's orgs, quotas and host pages, and a moatd whose --ui-dir holds no
build answering 503.

In Debian's Chromium (tests/node/ui_driver.mjs, playwright-core): a wrong key shows the API's
message, sign-in by keyboard, the list shows the org's real sandboxes, a sandbox created and killed
from the list, filters by metadata and template and a bulk kill of the selection, the sandbox page's state and its pause, resume, hibernate, wake, snapshot, rollback and fork buttons, the CPU/memory chart drawn from the recorded
history, a terminal (xterm.js over the PTY WebSocket) that echoes, follows a resize and stops
`sleep 100` with Ctrl-C, the log as it grows, the page's cookie refused on mutations without the
header, another org's sandbox by URL shown as the API's not found, phone width without horizontal
overflow, usage grouped by a metadata key, 120 sandboxes paged 50 at a time (prev/next, the count, filters
applied, no DOM change on an unchanged poll), a database created, shown with its URL (not to a readonly key)
and deleted, a template built from a Dockerfile and a context file on the templates page with its log
shown line by line as the build runs (the API's log, in order), then offered on the sandboxes page and
usable, a failing build showing the API's error, a template deleted from its page, a readonly key's
templates without the build form or Delete, a database branched from the page, its events panel showing
the branch, its idle hibernation and the wake a connection caused as they happen, the org's quotas and the host's /healthz facts, a file uploaded and downloaded byte for byte, sign-out, and a readonly key's dashboard without kill buttons whose kill the API refuses.
Screenshots of the main pages are taken on every run, into a temporary directory; with
MOAT_UI_SCREENSHOTS=1 into docs/ui/ (how the committed ones are made), so a plain run leaves the tree
as it was."""

import http.client
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
import moatd  # noqa: E402
import sse  # noqa: E402
from moattest import DaemonTest  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
NODE_DIR = os.path.join(REPO, "tests", "node")
DOC_SHOTS = os.path.join(REPO, "docs", "ui")
CHROMIUM = "/usr/bin/chromium"
PAGING = 120  # sandboxes the paging scenario makes: three pages of 50
INTERVAL_MS = 500  # the metric sampler's period here: the chart has history within seconds


def browser_missing():
    if not os.path.exists(CHROMIUM):
        return "no %s (apt-get install chromium)" % CHROMIUM
    if not shutil.which("node") or not os.path.isdir(os.path.join(NODE_DIR, "node_modules", "playwright-core")):
        return "node or tests/node/node_modules/playwright-core missing (cd tests/node && npm ci)"
    return None


class UiTest(DaemonTest):
    daemon_args = ("--sample-interval-ms", str(INTERVAL_MS))

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.sid = cls.c.create(ttl_seconds=600, metadata={"owner": "ui-test"})["id"]
        cls.ro_key = cls.c.request("POST", "/v1/keys", body={"name": "ui-readonly", "role": "readonly"})[1]["key"]
        cls.other = cls.c.with_key(cls.daemon.new_org_key("ui-other"))
        cls.other_sid = cls.other.create(ttl_seconds=600)["id"]
        cls.bulk = [cls.c.create(ttl_seconds=600, metadata={"batch": "ui-bulk", "n": str(i)})["id"] for i in range(2)]
        cls.snap = cls.c.request("POST", "/v1/sandboxes/%s/snapshots" % cls.sid, body={})[1]["id"]
        cls.vol = cls.c.request("POST", "/v1/volumes", body={"name": "ui-vol", "size_mb": 16})[1]["name"]
        cls.platform_key = cls.daemon.new_platform_key()
        cls.driven = None

    @classmethod
    def tearDownClass(cls):
        try:
            made = cls.c.request("GET", "/v1/sandboxes", query={"metadata.batch": "ui-page"})[1]["sandboxes"]
            for sb in made:
                cls.c.request("DELETE", "/v1/sandboxes/" + sb["id"], expect=(204, 404))
            for db in cls.c.request("GET", "/v1/databases")[1]["databases"]:
                cls.c.request("DELETE", "/v1/databases/" + db["id"], expect=(204, 404, 409))
        except Exception:
            pass
        for client, path in [(cls.c, "/v1/sandboxes/" + b) for b in cls.bulk] + [(cls.c, "/v1/sandboxes/" + cls.sid), (cls.other, "/v1/sandboxes/" + cls.other_sid),
                             (cls.c, "/v1/snapshots/" + cls.snap), (cls.c, "/v1/volumes/" + cls.vol),
                             (cls.c, "/v1/templates/ui-tpl"), (cls.c, "/v1/templates/ui-tpl-bad")]:
            try:
                client.request("DELETE", path, expect=(204, 404))
            except Exception:
                pass
        super().tearDownClass()

    # -- HTTP --
    def raw(self, method, path, body=None, headers=None, port=None):
        conn = http.client.HTTPConnection("127.0.0.1", port or self.daemon.port, timeout=30)
        try:
            h = dict(headers or {})
            data = None
            if body is not None:
                data = json.dumps(body).encode()
                h["Content-Type"] = "application/json"
            conn.request(method, path, body=data, headers=h)
            resp = conn.getresponse()
            payload = resp.read()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, payload
        finally:
            conn.close()

    def sign_in(self, key):
        st, hdr, body = self.raw("POST", "/ui/session", {"key": key}, {"X-Moat-UI": "1"})
        self.assertEqual(st, 201, body)
        cookie = hdr["set-cookie"]
        token = cookie.split(";")[0]
        self.assertTrue(token.startswith("moat_ui="), cookie)
        return token, cookie, json.loads(body)

    def test_assets_and_headers(self):
        st, hdr, body = self.raw("GET", "/ui/")
        self.assertEqual(st, 200)
        self.assertTrue(hdr["content-type"].startswith("text/html"), hdr)
        self.assertIn(b'<script type="module" src="app.js">', body)
        self.assertIn("default-src 'self'", hdr["content-security-policy"])
        self.assertIn("frame-ancestors 'none'", hdr["content-security-policy"])
        self.assertEqual(hdr["x-frame-options"], "DENY")
        self.assertEqual(hdr["x-content-type-options"], "nosniff")
        for path, ctype in (("/ui/app.js", "text/javascript"), ("/ui/style.css", "text/css"),
                            ("/ui/vendor/xterm.mjs", "text/javascript"), ("/ui/vendor/xterm.css", "text/css")):
            st, hdr, body = self.raw("GET", path)
            self.assertEqual(st, 200, path)
            self.assertTrue(hdr["content-type"].startswith(ctype), (path, hdr["content-type"]))
            with open(os.path.join(REPO, "build", "ui", path[len("/ui/"):]), "rb") as f:
                self.assertEqual(body, f.read(), path)
        st, hdr, _ = self.raw("GET", "/ui")
        self.assertEqual((st, hdr.get("location")), (308, "/ui/"))

    def test_path_traversal_refused(self):
        for path in ("/ui/../api-key", "/ui/%2e%2e/api-key", "/ui/vendor/../index.html", "/ui/..%2fMANIFEST",
                     "/ui/MANIFEST", "/ui//etc/passwd", "/ui/.hidden", "/ui/vendor/", "/ui/%2fetc%2fpasswd",
                     "/ui/app.js%00.html", "/ui/nope.js"):
            st, hdr, body = self.raw("GET", path)
            self.assertIn(st, (400, 404), (path, st, body))
            j = json.loads(body)
            self.assertEqual(set(j), {"code", "message"}, (path, j))
            self.assertNotIn(b"moat_", body, path)  # never the key file

    def test_session_cookie(self):
        token, cookie, who = self.sign_in(self.daemon.client.key)
        attrs = [a.strip().lower() for a in cookie.split(";")[1:]]
        self.assertIn("httponly", attrs)
        self.assertIn("samesite=strict", attrs)
        self.assertIn("path=/", attrs)
        max_age = [int(a.split("=")[1]) for a in attrs if a.startswith("max-age=")]
        self.assertTrue(max_age and 0 < max_age[0] <= 12 * 3600, attrs)
        self.assertEqual((who["org"], who["role"]), ("default", "admin"), who)
        st, _, body = self.raw("GET", "/v1/sandboxes/" + self.sid, headers={"Cookie": token})
        self.assertEqual(st, 200, body)
        st, _, body = self.raw("GET", "/ui/session", headers={"Cookie": token})
        self.assertEqual((st, json.loads(body)["key_id"]), (200, who["key_id"]))
        # a made-up token is not a session
        st, _, body = self.raw("GET", "/v1/me", headers={"Cookie": "moat_ui=" + "0" * 64})
        self.assertEqual(st, 401, body)
        self.assertIn("sign in again", json.loads(body)["message"])
        # sign-in itself needs the header and a known key
        st, _, body = self.raw("POST", "/ui/session", {"key": self.daemon.client.key})
        self.assertEqual(st, 403, body)
        st, _, body = self.raw("POST", "/ui/session", {"key": "moat_bogus"}, {"X-Moat-UI": "1"})
        self.assertEqual(st, 401, body)
        st, _, body = self.raw("POST", "/ui/session", {"key": "x", "extra": 1}, {"X-Moat-UI": "1"})
        self.assertEqual(st, 400, body)
        # sign-out ends it
        st, hdr, body = self.raw("DELETE", "/ui/session", headers={"Cookie": token, "X-Moat-UI": "1"})
        self.assertEqual(st, 200, body)
        self.assertIn("max-age=0", hdr["set-cookie"].lower())
        st, _, _ = self.raw("GET", "/v1/me", headers={"Cookie": token})
        self.assertEqual(st, 401)

    def test_csrf_and_origin(self):
        token, _, _ = self.sign_in(self.daemon.client.key)
        path = "/v1/sandboxes/" + self.sid
        # the cookie alone cannot change anything
        st, _, body = self.raw("DELETE", path, headers={"Cookie": token})
        self.assertEqual(st, 403, body)
        self.assertIn("X-Moat-UI", json.loads(body)["message"])
        st, _, body = self.raw("POST", path + "/pause", {}, headers={"Cookie": token})
        self.assertEqual(st, 403, body)
        st, _, body = self.raw("POST", "/v1/sandboxes", {}, headers={"Cookie": token, "X-Moat-UI": "0"})
        self.assertEqual(st, 403, body)
        # another site's page: refused even for a read and even with the header
        host = "127.0.0.1:%d" % self.daemon.port
        st, _, body = self.raw("GET", path, headers={"Cookie": token, "Origin": "http://evil.example"})
        self.assertEqual(st, 403, body)
        st, _, body = self.raw("DELETE", path, headers={"Cookie": token, "X-Moat-UI": "1",
                                                        "Origin": "http://evil.example"})
        self.assertEqual(st, 403, body)
        st, _, body = self.raw("GET", path, headers={"Cookie": token, "Origin": "http://" + host})
        self.assertEqual(st, 200, body)
        self.assertEqual(self.c.get(self.sid)["state"], "running")
        # an API key wins over a cookie: a key's client needs no header
        st, _, body = self.raw("GET", path, headers={"Cookie": "moat_ui=junk",
                                                     "Authorization": "Bearer " + self.daemon.client.key})
        self.assertEqual(st, 200, body)

    def test_revoked_key_ends_session(self):
        made = self.c.request("POST", "/v1/keys", body={"name": "ui-revoke", "role": "member"})[1]
        token, _, who = self.sign_in(made["key"])
        st, _, _ = self.raw("GET", "/v1/me", headers={"Cookie": token})
        self.assertEqual(st, 200)
        self.c.request("DELETE", "/v1/keys/" + who["key_id"], expect=204)
        st, _, body = self.raw("GET", "/v1/me", headers={"Cookie": token})
        self.assertEqual(st, 401, body)
        st, _, body = self.raw("GET", "/ui/session", headers={"Cookie": token})
        self.assertEqual(st, 401, body)

    def test_readonly_session_cannot_kill(self):
        token, _, who = self.sign_in(self.ro_key)
        self.assertEqual(who["role"], "readonly")
        st, _, body = self.raw("DELETE", "/v1/sandboxes/" + self.sid, headers={"Cookie": token, "X-Moat-UI": "1"})
        self.assertEqual(st, 403, body)
        self.assertIn("readonly", json.loads(body)["message"])
        self.assertEqual(self.c.get(self.sid)["state"], "running")

    def test_no_build_is_503(self):
        empty = tempfile.mkdtemp(prefix="moat-ui-none-")
        self.addCleanup(shutil.rmtree, empty, True)
        d = moatd.MoatDaemon(pool=0, extra_args=["--ui-dir", empty])
        d.start()
        try:
            st, _, body = self.raw("GET", "/ui/", port=d.port)
            self.assertEqual(st, 503, body)
            j = json.loads(body)
            self.assertEqual(j["code"], "unavailable")
            self.assertIn("MANIFEST", j["message"])
            st, _, _ = self.raw("GET", "/healthz", port=d.port)
            self.assertEqual(st, 200)  # moatd itself runs
        finally:
            d.stop()

    # -- the browser --
    def drive(self):
        cls = type(self)
        if cls.driven is None:
            why = browser_missing()
            if why:
                self.skipTest(why)
            work = tempfile.mkdtemp(prefix="moat-ui-files-")
            cls.work = work
            type(self).addClassCleanup(shutil.rmtree, work, True)
            shots = DOC_SHOTS if os.environ.get("MOAT_UI_SCREENSHOTS") == "1" else os.path.join(work, "shots")
            os.makedirs(shots, exist_ok=True)
            cls.upload = os.path.join(work, "ui-upload.bin")
            cls.download = os.path.join(work, "downloaded.bin")
            with open(cls.upload, "wb") as f:  # every byte value, then random bytes: 300 KiB
                f.write(bytes(range(256)) * 4 + os.urandom(300 * 1024 - 1024))
            env = dict(os.environ, MOAT_UI_URL="http://127.0.0.1:%d" % self.daemon.port,
                       MOAT_UI_ADMIN_KEY=self.daemon.client.key, MOAT_UI_READONLY_KEY=self.ro_key,
                       MOAT_UI_SANDBOX=self.sid, MOAT_UI_OTHER=self.other_sid, MOAT_UI_SHOTS=shots,
                       MOAT_UI_UPLOAD=cls.upload, MOAT_UI_DOWNLOAD=cls.download, MOAT_UI_BULK=",".join(cls.bulk),
                       MOAT_UI_PAGING=str(PAGING), MOAT_UI_PLATFORM_KEY=cls.platform_key,
                       MOAT_UI_NEW_ORG="ui-made-%d" % os.getpid(), TMPDIR=work)  # playwright's profile and download artifacts: removed with work
            # the chart needs recorded history: a few samples first
            time.sleep(3 * INTERVAL_MS / 1000)
            r = subprocess.run(["node", "ui_driver.mjs"], cwd=NODE_DIR, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, timeout=240)
            lines = r.stdout.decode().strip().splitlines()
            if r.returncode != 0 or not lines:
                cls.driven = {"_failed": "driver exit %d: %s" % (r.returncode, r.stderr.decode(errors="replace")[-3000:])}
            else:
                cls.driven = json.loads(lines[-1])
                print("\nui timings: %s" % json.dumps({k: {m: v for m, v in r.items() if m.endswith("_ms") or m == "ms"}
                                                     for k, r in cls.driven.items() if isinstance(r, dict)}),
                      file=sys.stderr)
        self.assertNotIn("_failed", cls.driven, cls.driven.get("_failed"))
        return cls.driven

    def scenario(self, name):
        res = self.drive().get(name)
        self.assertIsNotNone(res, "the driver did not run %s" % name)
        self.assertTrue(res["ok"], res.get("error"))
        return res

    def test_browser_bad_key_shows_api_message(self):
        res = self.scenario("bad_key")
        self.assertIn("not valid", res["error_text"])

    def test_browser_list_real_sandboxes(self):
        res = self.scenario("list")
        # exactly the org's live sandboxes when the page showed them (the bulk pair is killed later)
        self.assertEqual(set(res["ids"]), {self.sid} | set(self.bulk))
        self.assertNotIn(self.other_sid, res["ids"])
        self.assertEqual(res["state"], "running")
        self.assertTrue(res["cookie"]["httpOnly"])
        self.assertEqual(res["cookie"]["sameSite"], "Strict")
        self.assertGreater(res["cookie"]["expires"], time.time())
        self.assertNotIn("moat_ui", res["js_cookie"])  # HttpOnly: the page's script cannot read it

    def test_browser_create_and_kill(self):
        res = self.scenario("create_kill")
        sb = self.c.get(res["created"])
        self.assertEqual(sb["metadata"].get("created_by"), "dashboard")
        self.assertEqual((sb["state"], sb["killed_reason"]), ("killed", "api"))

    def test_browser_keyboard(self):
        res = self.scenario("keyboard")
        self.assertTrue(res["on_create"], res["stops"])
        self.assertEqual([s for s in res["stops"] if not s["ring"]], [], "focus without a visible ring")
        self.assertIn("state-filter", [s["id"] for s in res["stops"]])  # the filters are on the way
        st, body = self.c.request("GET", "/v1/sandboxes/" + res["created"], expect=(200, 404))
        self.assertTrue(st == 404 or body["state"] == "killed", body)  # killed by Enter

    def test_browser_filters_and_bulk_kill(self):
        res = self.scenario("bulk")
        self.assertEqual(res["by_meta"], sorted(self.bulk))
        self.assertEqual(res["label"], "Kill selected (2)")
        self.assertIn("killed 2 of 2", res["status"])
        for sid in self.bulk:
            sb = self.c.get(sid)
            self.assertEqual((sb["state"], sb["killed_reason"]), ("killed", "api"))
        self.assertEqual(self.c.get(self.sid)["state"], "running")  # the filter kept it out of the selection

    def test_browser_sandbox_page(self):
        res = self.scenario("sandbox_page")
        self.assertEqual(res["state"], "running")
        self.assertEqual(set(res["actions"]), {"pause", "hibernate", "snapshots", "fork", "rollback", "kill"})

    def test_browser_file_upload_download(self):
        res = self.scenario("files")
        self.assertIsNone(res["failure"])
        self.assertEqual(res["suggested"], "ui-upload.bin")
        with open(self.upload, "rb") as f:
            sent = f.read()
        with open(self.download, "rb") as f:
            back = f.read()
        self.assertEqual(self.c.get_file(self.sid, "/root/ui-upload.bin"), sent)  # in the sandbox, byte for byte
        self.assertEqual(back, sent)  # and downloaded again

    def test_browser_chart_from_history(self):
        res = self.scenario("chart")
        hist = self.c.request("GET", "/v1/sandboxes/%s/metrics" % self.sid, query={"from": "0"})[1]["samples"]
        self.assertGreaterEqual(res["samples"], 2)
        self.assertLessEqual(res["samples"], len(hist))
        names = {s["series"]: s for s in res["series"]}
        self.assertEqual(set(names), {"cpu", "memory"})
        for s in names.values():
            self.assertEqual(s["n"], res["samples"])
            self.assertEqual(len(s["points"].split()), s["n"])

    def test_browser_terminal(self):
        res = self.scenario("terminal")
        self.assertTrue(res["stty_seen"])
        self.assertGreater(res["cols"], 10)
        self.assertGreater(res["rows"], 3)
        self.assertLess(res["interrupt_ms"], 8000)

    def test_browser_logs_live(self):
        res = self.scenario("logs")
        self.assertIn("ui42", res["text"])

    def test_browser_actions(self):
        res = self.scenario("actions")
        self.assertEqual(res["seen"], ["paused", "running", "hibernated", "running"])
        for st in res["statuses"]:  # each with how long it took
            self.assertRegex(st, r"^\w+: done \(\d+\.\d s\)$")
        self.assertEqual(res["disabled"], [0, 0, 0, 0])
        self.assertEqual(self.c.get(self.sid)["state"], "running")
        states = [e.get("event") for e in self.lifecycle()]
        for ev in ("paused", "resumed", "hibernated", "woken"):
            self.assertIn(ev, states)

    def lifecycle(self):
        _, body = self.c.request("GET", "/v1/sandboxes/%s/logs" % self.sid, headers={"Accept": "application/json"})
        return [e for e in body["entries"] if e.get("type") == "lifecycle"]

    def test_browser_snapshot_rollback_fork(self):
        res = self.scenario("timetravel")
        snap = self.c.request("GET", "/v1/snapshots/" + res["snapshot"])[1]
        self.assertEqual(snap["sandbox_id"], self.sid)
        self.assertEqual(self.c.get(self.sid)["from_snapshot"], res["snapshot"])
        child = self.c.get(res["child"])
        self.addCleanup(self._delete_quietly, self.c, res["child"])
        self.addCleanup(self._delete_quietly_path, "/v1/snapshots/" + res["snapshot"])
        self.assertEqual((child["forked_from"], child["state"], res["child_state"]), (self.sid, "running", "running"))

    def _delete_quietly_path(self, path):
        try:
            self.c.request("DELETE", path, expect=(204, 404))
        except Exception:
            pass

    def test_browser_cookie_without_csrf_header(self):
        res = self.scenario("csrf")
        self.assertEqual((res["del"], res["post"], res["get"]), (403, 403, 200), res)
        self.assertIn("X-Moat-UI", res["del_body"]["message"])
        self.assertEqual(self.c.get(self.sid)["state"], "running")

    def test_browser_other_org_not_found(self):
        res = self.scenario("other_org")
        _, body = self.c.request("GET", "/v1/sandboxes/" + self.other_sid, expect=404)
        self.assertEqual(res["error_text"].strip(), body["message"])
        self.assertEqual(res["details"], 0)
        self.assertEqual(self.other.get(self.other_sid)["state"], "running")

    def test_browser_list_pages(self):
        seen = self.scenario("pages")["seen"]
        self.assertEqual(seen["templates"], [t["name"] for t in self.c.request("GET", "/v1/templates")[1]["templates"]
                                             if t["name"] != "ui-tpl"])  # built by a later scenario
        self.assertIn(self.snap, seen["snapshots"])
        self.assertEqual(seen["volumes"], ["ui-vol"])
        keys = [k["id"] for k in self.c.request("GET", "/v1/keys")[1]["keys"]]
        self.assertEqual(set(seen["keys"]), set(keys))
        audit = self.c.request("GET", "/v1/audit", query={"limit": "1000"})[1]["entries"]
        self.assertTrue(seen["audit"], "the audit page shows entries")
        self.assertLessEqual(set(seen["audit"]), {str(e["seq"]) for e in audit})

    def test_browser_usage_by_metadata(self):
        res = self.scenario("usage")
        rows = dict(res["rows"])
        api = {r["key"]: r for r in self.c.request("GET", "/v1/usage", query={"group_by": "metadata.owner"})[1]}
        self.assertIn("ui-test", rows)
        self.assertEqual(set(rows) - {"(none)"}, {k for k in api if k is not None})
        # metered use only grows: what the page showed is at most what the API says now
        self.assertLessEqual(rows["ui-test"], api["ui-test"]["cpu_seconds"] + 1e-6)
        self.assertGreater(api["ui-test"]["cpu_seconds"], 0)
        # the chart: a line per group, a point per bucket of the page's range (mid-bucket), each the
        # API's value for that bucket or zero where the API leaves the bucket out
        cpu = res["cpu"]
        frm, to, bucket = int(cpu["from"]), int(cpu["to"]), int(cpu["bucket"])
        self.assertEqual(bucket, 3600)  # the default range, 24 hours, in hours
        self.assertAlmostEqual(to - frm, 86400000, delta=1)
        w = bucket * 1000
        starts = list(range(frm // w * w, to, w))
        self.assertEqual(int(cpu["buckets"]), len(starts))
        series = self.c.request("GET", "/v1/usage", query={"group_by": "metadata.owner", "from": str(frm),
                                                           "to": str(to), "bucket": str(bucket)})[1]
        import datetime

        def dense(row, field):
            by = {int(datetime.datetime.fromisoformat(p["start"].replace("Z", "+00:00")).timestamp() * 1000): p[field]
                  for p in row["series"]}
            self.assertLessEqual(set(by), set(starts), row)
            return [by.get(t, 0) for t in starts]

        for drawn, field in ((cpu, "cpu_seconds"), (res["alive"], "sandbox_seconds")):
            want = {"(none)" if r["key"] is None else r["key"]: dense(r, field) for r in series}
            lines = {ln["name"]: ln for ln in drawn["lines"]}
            self.assertEqual(set(lines), set(want), drawn)
            self.assertEqual(drawn["legend"], [ln["name"] for ln in drawn["lines"]])
            self.assertEqual(len({ln["color"] for ln in drawn["lines"]}), len(lines))
            for name, ln in lines.items():
                self.assertEqual(ln["points"], len(starts), ln)
                self.assertEqual(ln["times"], [t + w // 2 for t in starts], ln)
                for got, exp in zip(ln["values"], want[name]):
                    self.assertAlmostEqual(got, exp, delta=1e-3, msg=(name, field, ln["values"], want[name]))
            self.assertGreater(sum(lines["ui-test"]["values"]), 0, drawn)
        # the x axis names times (HH:MM, UTC), the y axis the metric
        self.assertTrue(any(len(t) == 5 and t[2] == ":" for t in cpu["ticks"]), cpu["ticks"])
        self.assertIn("Time (UTC)", cpu["ticks"])
        self.assertTrue(any(t.startswith("CPU seconds per 1 h") for t in cpu["ticks"]), cpu["ticks"])
        self.assertTrue(any(t.startswith("Sandbox seconds") for t in res["alive"]["ticks"]), res["alive"]["ticks"])
        self.assertEqual(res["keyboard"], {"after_range": "usage-metric", "after_go": "usage-svg"})
        self.assertGreater(cpu["svg_width"], 900)  # 1280 wide: the chart spans the page
        self.assertLessEqual(res["phone"]["overflow"], 0, res["phone"])
        self.assertLessEqual(res["phone"]["svg_width"], 390, res["phone"])

    def test_browser_phone_width(self):
        res = self.scenario("phone")
        self.assertLessEqual(res["overflow"], 0)

    def test_browser_sign_out(self):
        res = self.scenario("sign_out")
        self.assertEqual((res["me"], res["cookies"]), (401, 0))

    def test_browser_readonly_cannot_kill(self):
        res = self.scenario("readonly")
        self.assertEqual((res["kill_buttons"], res["create_buttons"], res["actions"]), (0, 0, 0))
        self.assertNotIn("#/keys", res["nav"])  # keys are an admin's
        self.assertEqual(res["refused"]["status"], 403)
        self.assertIn("readonly", res["refused"]["body"]["message"])
        self.assertEqual(self.c.get(self.sid)["state"], "running")

    def test_browser_paging(self):
        res = self.scenario("paging")
        made = set(res["made"])
        self.assertEqual(len(made), PAGING)
        api = {sb["id"] for sb in self.c.request("GET", "/v1/sandboxes", query={"metadata.batch": "ui-page"})[1]["sandboxes"]}
        self.assertEqual(api, made)
        self.assertEqual([len(p) for p in res["pages"]], [50, 50, 20])
        self.assertEqual(res["counts"], ["1–50 of 120", "51–100 of 120", "101–120 of 120"])
        seen = [i for p in res["pages"] for i in p]
        self.assertEqual(len(seen), len(set(seen)))  # no row on two pages
        self.assertEqual(set(seen), made)  # the metadata filter: exactly the batch, all of it
        self.assertEqual(res["back"], res["pages"][1])
        self.assertTrue(res["prev_disabled_first"])
        self.assertEqual(res["paused_rows"], [])
        self.assertEqual(res["mutations"], 0)  # two polls of an unchanged page redraw nothing
        # the server pages: every list request asks for one page of 50, the later pages by cursor
        qs = [q for q in res["list_queries"] if q.get("metadata.batch") == "ui-page"]
        self.assertTrue(qs and all(q.get("limit") == "50" for q in res["list_queries"]), res["list_queries"])
        self.assertEqual(len({q["cursor"] for q in qs if "cursor" in q}), len(res["pages"]) - 1, qs)

    def test_browser_databases(self):
        res = self.scenario("databases")
        st, body = self.c.request("GET", "/v1/databases/" + res["id"], expect=(200, 404))
        self.assertEqual(st, 404, body)  # deleted from the page
        self.assertTrue(res["url"].startswith("postgresql://db_"), res["url"])
        self.assertRegex(res["url"], r"^postgresql://db_[a-z0-9_]+:[a-z0-9]{32}@")  # with its password
        self.assertEqual((res["ro_url"], res["ro_delete"], res["ro_form"]), ("—", 0, 0))

    # -- templates built from the page, a database's branch and events --
    def _kill_quietly(self, sid):
        try:
            self.c.request("DELETE", "/v1/sandboxes/" + sid, expect=(204, 404))
        except Exception:
            pass

    def test_browser_template_build_live_log(self):
        res = self.scenario("template_build")
        self.assertEqual(res["state"], "ready", res)
        # the page's lines are the API's log of that build, in order
        s = sse.open(self.c, "GET", "/v1/templates/ui-tpl/builds/%s/logs" % res["build_id"])
        try:
            evs = list(s)
        finally:
            s.close()
        api = [[e.data["step"], e.data["stream"], e.data["text"]] for e in evs if e.name == "log"]
        self.assertEqual(res["lines"], api)
        self.assertEqual([e.data["state"] for e in evs if e.name == "end"], ["ready"])
        self.assertEqual(res["detail_lines"], api)  # the detail page's last build
        texts = [t for _, _, t in api]
        self.assertIn("ui-build-one", texts)
        self.assertIn("ui-build-two", texts)
        # shown as it arrived: the RUN's first line while the page still said building, and before its
        # second line (which the RUN prints 2 s later) was there
        seen = {t: (st, batch) for t, st, batch in res["seen"]}
        self.assertEqual(seen["ui-build-one"][0], "building")
        self.assertLess(seen["ui-build-one"][1], seen["ui-build-two"][1])
        m = re.match(r"^(\d+) s$", res["elapsed"])
        self.assertIsNotNone(m, res["elapsed"])
        self.assertLessEqual(int(m.group(1)), res["build_ms"] / 1000 + 1)  # the page's clock, from the submit
        t = self.c.request("GET", "/v1/templates/ui-tpl")[1]
        self.assertEqual((t["source"], t["state"], t["usable"], t["build_id"]), ("dockerfile", "ready", True, res["build_id"]))
        self.assertEqual((res["facts"]["state"], res["facts"]["from"], res["facts"]["build"]), ("ready", "base", res["build_id"]))
        # usable: the sandbox the page made, and one made through the API, have the RUN's and the context's files
        made = self.c.get(res["sandbox"])
        self.addCleanup(self._kill_quietly, res["sandbox"])
        self.assertEqual((made["template"], made["metadata"].get("created_by")), ("ui-tpl", "dashboard"))
        sid = self.c.create(template="ui-tpl", ttl_seconds=120)["id"]
        self.addCleanup(self._kill_quietly, sid)
        for x in (sid, res["sandbox"]):
            r = self.c.exec(x, argv=["cat", "/ui-built.txt", "/ui-greeting.txt"])
            self.assertEqual((r["exit_code"], r["stdout"]), (0, "ui-made\nhello from the page\n"), r)

    def test_browser_template_build_failure_and_delete(self):
        res = self.scenario("template_fail")
        self.assertEqual(res["state"], "failed")
        self.assertTrue(res["api_error"], res)
        self.assertEqual(res["error_text"].strip(), res["api_error"].strip())  # the API's message, as it is
        self.assertIn("false", res["api_error"])
        self.assertIn("ui-about-to-fail", res["lines"])
        self.assertEqual(res["detail_error"].strip(), res["api_error"].strip())
        self.assertNotIn("ui-tpl-bad", res["rows"])
        self.c.request("GET", "/v1/templates/ui-tpl-bad", expect=404)  # deleted from the page
        # the second tab's Delete of what is gone: the API's message, and the page stays
        _, body = self.c.request("DELETE", "/v1/templates/ui-tpl-bad", expect=404)
        self.assertEqual(res["stale_error"].strip(), body["message"])
        self.assertEqual(res["stale_hash"], "#/templates/ui-tpl-bad")
        self.assertEqual(res["base_delete"], 0)

    def test_browser_templates_readonly(self):
        res = self.scenario("templates_readonly")
        self.assertEqual((res["form"], res["delete"], res["new_sandbox"], res["branch"]), (0, 0, 0, 0))
        self.assertIn("ui-tpl", res["rows"])
        self.assertGreater(res["log_lines"], 0)  # the log is readable to it
        self.assertGreater(res["events_buttons"], 0)
        for page, over in res["overflow"].items():
            self.assertLessEqual(over, 0, page)

    def test_browser_database_branch(self):
        res = self.scenario("db_branch_events")
        listed = {d["id"]: d for d in self.c.request("GET", "/v1/databases")[1]["databases"]}
        self.assertIn(res["branch_id"], listed)
        self.assertEqual(listed[res["branch_id"]]["name"], "ui-branch")
        self.assertEqual(listed[res["branch_id"]]["size_mb"], listed[res["id"]]["size_mb"])
        self.assertIn("branched ui-src into ui-branch", res["status"])

    def test_browser_database_events_live(self):
        res = self.scenario("db_branch_events")
        types = [t for t, _ in res["events"]]
        self.assertEqual(types[0], "state")
        for want in ("branched", "hibernated", "woken"):
            self.assertIn(want, types)
        self.assertLess(types.index("branched"), types.index("hibernated"))
        self.assertLess(types.index("hibernated"), types.index("woken"))
        self.assertIn(res["branch_id"], dict(res["events"])["branched"])
        self.assertEqual(res["answered"], "R")  # the server asked the woken connection to authenticate
        self.assertIn(self.c.request("GET", "/v1/databases/" + res["id"])[1]["state"], ("running", "hibernated"))

    def test_browser_quotas_and_host(self):
        res = self.scenario("quotas_host")
        now = self.c.request("GET", "/v1/orgs/default/usage/now")[1]["usage"]
        shown = {q: (use, lim) for q, use, lim in res["quotas"]}
        self.assertEqual(set(shown), set(now))
        for q, u in now.items():
            self.assertEqual(shown[q][1], "" if u["limit"] is None else str(u["limit"]), q)
        hz = json.loads(self.raw("GET", "/healthz")[2])
        f = res["facts"]
        self.assertEqual((f["version"], f["criu"], f["uplink"]), (hz["version"], hz["checkpoints"]["criu"], hz["network"]["uplink"]))
        self.assertEqual(f["checkpoints"], "available" if hz["checkpoints"]["available"] else "unavailable")
        host = self.c.request("GET", "/v1/host")[1]
        self.assertEqual(res["scope"], "org")  # an org's key: its own sandboxes, no load
        self.assertNotIn("load", f)
        self.assertRegex(f["sandboxes"], r"^\d+ live")
        self.assertEqual(f["cpus"], str(host["capacity"]["cpus"]))

    def test_browser_platform_orgs_quotas_host(self):
        res = self.scenario("platform")
        admin = self.c.with_key(self.platform_key)
        self.assertEqual(res["nav"], ["#/orgs", "#/host"])
        self.assertEqual(set(res["orgs"]) - {res["made"]}, {o["id"] for o in admin.request("GET", "/v1/orgs")[1]["orgs"]})
        self.assertTrue(res["key"].startswith("moat_"), res["key"])
        self.assertEqual((res["saved"]["max_sandboxes"], res["saved"]["max_memory_mb"]), ("3", "2048"))
        self.assertEqual((res["quotas"]["max_sandboxes"], res["quotas"]["max_memory_mb"]), (3, 2048))
        self.assertIn("max_sandboxes", res["bad"])
        st, body = admin.request("GET", "/v1/orgs/" + res["made"], expect=(200, 404))
        self.assertEqual(st, 404, body)  # deleted from the page
        st, _ = self.c.with_key(res["key"]).request("GET", "/v1/me", expect=(200, 401))
        self.assertEqual(st, 401)  # and its key with it
        host = admin.request("GET", "/v1/host")[1]
        self.assertEqual(res["scope"], "host")
        self.assertEqual(res["facts"]["cpus"], str(host["capacity"]["cpus"]))
        self.assertEqual(len(res["facts"]["load"].split()), 3)

    def test_browser_no_console_errors(self):
        errs = self.drive().get("console_errors", [])
        # the API's refusals the scenarios provoke on purpose are logged as failed loads
        unexpected = [e for e in errs if "status of 40" not in e]
        self.assertEqual(unexpected, [])


if __name__ == "__main__":
    unittest.main()

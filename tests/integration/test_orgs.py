"""test_orgs.py -- orgs managed over the API with the platform admin key (`moatd key create --admin`):
POST/GET/DELETE /v1/orgs, who may call them (tenant keys of every role: 403; the platform key on a
tenant's routes: 403), a revoked key's open streams ending, a forced delete removing what the org had
(checked from outside: processes, cgroups, volume images), and a delete a crash cut short finished by
the next start."""

import glob
import os
import sqlite3
import subprocess
import sys
import threading
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
import moatd  # noqa: E402
import sse  # noqa: E402
import ws  # noqa: E402
from moattest import DaemonTest  # noqa: E402


def platform_key(daemon):
    return daemon.new_platform_key()


def new_org(test, admin, prefix="o"):
    name = "%s-%s" % (prefix, uuid.uuid4().hex[:8])
    _, o = admin.request("POST", "/v1/orgs", body={"name": name}, expect=201)
    test.daemon.keys.append(o["admin_key"]["key"])  # the harness's cleanup sees its sandboxes
    return o, test.c.with_key(o["admin_key"]["key"])


def pid_alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


class OrgsTest(DaemonTest):
    pool = 1

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.admin = cls.c.with_key(platform_key(cls.daemon))

    def status(self, client, method, path, body=None, query=None):
        try:
            client.request(method, path, body=body, query=query)
            return 200
        except moatd.HTTPError as e:
            self.assertIsInstance(e.body.get("message"), str, e.body)
            return e.status

    def test_platform_key_scope(self):
        _, me = self.admin.request("GET", "/v1/me")
        self.assertEqual(me["key"]["role"], "platform", me)
        # the platform key sees nothing of a tenant's
        for method, path in (("GET", "/v1/sandboxes"), ("POST", "/v1/sandboxes"), ("GET", "/v1/volumes"),
                             ("GET", "/v1/keys"), ("GET", "/v1/snapshots"), ("GET", "/v1/databases")):
            self.assertEqual(self.status(self.admin, method, path, body={} if method == "POST" else None), 403,
                             path)
        # no tenant key manages orgs, whatever its role
        o, tadmin = new_org(self, self.admin)
        _, member = tadmin.request("POST", "/v1/keys", body={"name": "m", "role": "member"}, expect=201)
        _, ro = tadmin.request("POST", "/v1/keys", body={"name": "r", "role": "readonly"}, expect=201)
        for k in (tadmin, self.c.with_key(member["key"]), self.c.with_key(ro["key"]), self.c):
            self.assertEqual(self.status(k, "GET", "/v1/orgs"), 403)
            self.assertIn(self.status(k, "POST", "/v1/orgs", body={"name": "x" + uuid.uuid4().hex[:6]}), (403,))
            self.assertEqual(self.status(k, "GET", "/v1/orgs/" + o["id"]), 403)
            self.assertEqual(self.status(k, "DELETE", "/v1/orgs/" + o["id"]), 403)
        # a key cannot be made platform through /v1/keys
        self.assertEqual(self.status(tadmin, "POST", "/v1/keys", body={"name": "p", "role": "platform"}), 400)
        # nor can a tenant org take the reserved org's name from the CLI
        r = subprocess.run([moatd.moatd_bin(), "key", "create", "--data-dir", self.daemon.data_dir, "--org",
                            "_platform"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
        self.assertNotEqual(r.returncode, 0)
        _, org = self.admin.request("GET", "/v1/orgs/" + o["id"])
        self.assertEqual(org["state"], "active")

    def test_host_info_scoped_by_key(self):
        """GET /v1/host: an org's key counts its own org's sandboxes and sees no load; the platform key
        counts every org's and sees the host's load. Checked against what the orgs hold and /proc."""
        o, a = new_org(self, self.admin, "host")
        _, b = new_org(self, self.admin, "host")
        a_ids = [a.create(ttl_seconds=120, cpu=0.5, memory_mb=128)["id"] for _ in range(2)]
        b_id = b.create(ttl_seconds=120, cpu=1, memory_mb=256)["id"]
        a.request("POST", "/v1/sandboxes/%s/pause" % a_ids[1], body={}, expect=200)
        try:
            _, ha = a.request("GET", "/v1/host")
            _, hb = b.request("GET", "/v1/host")
            _, hp = self.admin.request("GET", "/v1/host")
        finally:
            for sid in a_ids:
                a.delete(sid)
            b.delete(b_id)
        self.assertEqual((ha["scope"], ha["load"]), ("org", None))
        self.assertEqual(ha["sandboxes"]["live"], 2)
        self.assertEqual((ha["sandboxes"]["by_state"]["running"], ha["sandboxes"]["by_state"]["paused"]), (1, 1))
        self.assertAlmostEqual(ha["sandboxes"]["committed_vcpus"], 1.0)
        self.assertEqual(ha["sandboxes"]["committed_memory_mb"], 256)
        self.assertEqual((hb["sandboxes"]["live"], hb["sandboxes"]["committed_memory_mb"]), (1, 256))
        self.assertEqual(hp["scope"], "host")
        self.assertGreaterEqual(hp["sandboxes"]["live"], 3)  # every org's: this test's and the others'
        self.assertGreaterEqual(hp["sandboxes"]["committed_memory_mb"], 512)
        self.assertEqual(hp["capacity"], ha["capacity"])
        self.assertEqual(hp["capacity"]["cpus"], len(os.sched_getaffinity(0)))
        with open("/proc/meminfo") as f:
            total_mb = int(f.readline().split()[1]) // 1024
        self.assertLessEqual(abs(hp["capacity"]["memory_mb"] - total_mb), 1)
        self.assertEqual(len(hp["load"]["average"]), 3)
        self.assertTrue(0 < hp["load"]["memory_available_mb"] <= hp["capacity"]["memory_mb"])
        self.assertTrue(0 < hp["load"]["disk_free_mb"] <= hp["capacity"]["disk_mb"])
        with open("/proc/uptime") as f:
            self.assertLessEqual(abs(hp["load"]["uptime_seconds"] - float(f.read().split()[0])), 5)
        self.assertEqual(hp["checkpoints"]["criu"], ha["checkpoints"]["criu"])
        # what it answers now: nothing of this test's left
        self.assertEqual(a.request("GET", "/v1/host")[1]["sandboxes"]["live"], 0)
        self.assertEqual(self.status(a, "GET", "/v1/host", query={"x": "1"}), 400)

    def test_create_get_list_delete(self):
        o, k = new_org(self, self.admin)
        self.assertEqual(o["id"], o["name"])
        self.assertEqual(o["admin_key"]["role"], "admin")
        self.assertTrue(o["admin_key"]["key"].startswith("moat_"))
        self.assertEqual(o["quotas"]["max_sandboxes"], None)
        _, me = k.request("GET", "/v1/me")
        self.assertEqual(me["org"]["id"], o["id"])
        self.assertEqual(me["key"]["role"], "admin")
        # the first admin key works: it makes the org's other keys
        k.request("POST", "/v1/keys", body={"name": "second"}, expect=201)
        self.assertEqual(self.status(self.admin, "POST", "/v1/orgs", body={"name": o["id"]}), 409)
        for bad in ({}, {"name": 5}, {"name": ""}, {"name": "UPPER"}, {"name": "_platform"}, {"name": "a/b"},
                    {"name": "x" * 64}, {"name": "ok", "extra": 1}):
            self.assertEqual(self.status(self.admin, "POST", "/v1/orgs", body=bad), 400, bad)
        _, got = self.admin.request("GET", "/v1/orgs/" + o["id"])
        self.assertEqual(got["id"], o["id"])
        self.assertNotIn("admin_key", got)
        for missing in ("nope-" + uuid.uuid4().hex[:6], "_platform", "BAD"):
            self.assertEqual(self.status(self.admin, "GET", "/v1/orgs/" + missing), 404, missing)
        # paging: limit 1, the cursor goes on without repeats
        o2, _ = new_org(self, self.admin)
        seen, cursor = [], None
        for _ in range(100):
            q = {"limit": "1"}
            if cursor:
                q["cursor"] = cursor
            _, page = self.admin.request("GET", "/v1/orgs", query=q)
            self.assertLessEqual(len(page["orgs"]), 1)
            seen += [x["id"] for x in page["orgs"]]
            cursor = page["next"]
            if not cursor:
                break
        self.assertEqual(len(seen), len(set(seen)))
        self.assertIn(o["id"], seen)
        self.assertIn(o2["id"], seen)
        self.assertIn("default", seen)
        self.assertNotIn("_platform", seen)
        for q in ({"limit": "0"}, {"limit": "x"}, {"limit": "1001"}, {"cursor": "B@D"}, {"other": "1"}):
            self.assertEqual(self.status(self.admin, "GET", "/v1/orgs", query=q), 400, q)
        # delete: its keys fail at once, it is gone
        self.admin.request("DELETE", "/v1/orgs/" + o["id"], expect=204)
        self.assertEqual(self.status(k, "GET", "/v1/me"), 401)
        self.assertEqual(self.status(self.admin, "GET", "/v1/orgs/" + o["id"]), 404)
        self.assertEqual(self.status(self.admin, "DELETE", "/v1/orgs/" + o["id"]), 404)
        self.assertEqual(self.status(self.admin, "DELETE", "/v1/orgs/" + o2["id"], query={"force": "maybe"}), 400)
        # the name can be taken again: a new org with a new key, none of the old one's
        _, again = self.admin.request("POST", "/v1/orgs", body={"name": o["id"]}, expect=201)
        self.daemon.keys.append(again["admin_key"]["key"])
        self.assertEqual(self.status(k, "GET", "/v1/me"), 401)
        self.admin.request("DELETE", "/v1/orgs/" + o["id"], expect=204)

    def test_delete_busy_then_force(self):
        o, k = new_org(self, self.admin)
        sb = k.create(ttl_seconds=600)
        host = self.daemon.sandbox_host(sb["id"])
        self.assertTrue(pid_alive(host["pid"]))
        # the sandbox's own cgroups: not those moatd itself is in
        cgroups = sorted(set(moatd.pid_cgroup_dirs(host["pid"])) - set(moatd.pid_cgroup_dirs(self.daemon.proc.pid)))
        self.assertTrue(cgroups, "no moat cgroup of the sandbox's init")
        k.request("POST", "/v1/volumes", body={"name": "v1", "size_mb": 16}, expect=201)
        db = sqlite3.connect("file:%s?mode=ro" % os.path.join(self.daemon.data_dir, "moat.db"), uri=True,
                             timeout=30)
        vid = db.execute("SELECT id FROM volumes WHERE org = ? AND name = 'v1'", (o["id"],)).fetchone()[0]
        db.close()
        imgs = glob.glob(os.path.join(self.daemon.data_dir, "**", vid + "*"), recursive=True)
        self.assertTrue(imgs, "no storage of volume %s found" % vid)
        with self.assertRaises(moatd.HTTPError) as cm:
            self.admin.request("DELETE", "/v1/orgs/" + o["id"])
        self.assertEqual((cm.exception.status, cm.exception.code), (409, "org_not_empty"), cm.exception.body)
        self.assertIn("force=true", cm.exception.body["message"])
        # still there, still usable
        k.request("GET", "/v1/sandboxes/" + sb["id"])
        self.admin.request("DELETE", "/v1/orgs/" + o["id"], query={"force": "true"}, expect=204)
        self.assertEqual(self.status(k, "GET", "/v1/me"), 401)
        deadline = time.time() + 10
        while pid_alive(host["pid"]) and time.time() < deadline:
            time.sleep(0.1)
        self.assertFalse(pid_alive(host["pid"]), "the org's sandbox still runs")
        for d in cgroups:
            self.assertFalse(os.path.isdir(d) and moatd.cgroup_procs(d), "cgroup %s still has processes" % d)
        self.assertEqual([p for p in imgs if os.path.exists(p)], [], "the volume's storage is left")
        db = sqlite3.connect("file:%s?mode=ro" % os.path.join(self.daemon.data_dir, "moat.db"), uri=True,
                             timeout=30)
        rows = db.execute("SELECT state FROM sandboxes WHERE org = ?", (o["id"],)).fetchall()
        nvol = db.execute("SELECT count(*) FROM volumes WHERE org = ?", (o["id"],)).fetchone()[0]
        nkeys = db.execute("SELECT count(*) FROM api_keys WHERE org = ?", (o["id"],)).fetchone()[0]
        db.close()
        self.assertEqual(rows, [("killed",)])
        self.assertEqual((nvol, nkeys), (0, 0))

    def test_force_delete_with_database_and_snapshot(self):
        o, k = new_org(self, self.admin)
        _, d = k.request("POST", "/v1/databases", body={"name": "db1"}, expect=201, timeout=300)
        db = sqlite3.connect("file:%s?mode=ro" % os.path.join(self.daemon.data_dir, "moat.db"), uri=True,
                             timeout=30)
        row = db.execute("SELECT sandbox_id, volume FROM databases WHERE id = ?", (d["id"],)).fetchone()
        db.close()
        server = row[0]
        pid = self.daemon.sandbox_host(server)["pid"] if server else None
        sid = k.create(ttl_seconds=600)["id"]
        ck = self.c.healthz().get("checkpoints") or {}
        snap = None
        if ck.get("available"):
            _, snap = k.request("POST", "/v1/sandboxes/%s/snapshots" % sid, body={}, expect=201, timeout=120)
        self.admin.request("DELETE", "/v1/orgs/" + o["id"], query={"force": "true"}, expect=204, timeout=300)
        db = sqlite3.connect("file:%s?mode=ro" % os.path.join(self.daemon.data_dir, "moat.db"), uri=True,
                             timeout=30)
        left = [db.execute(q, (o["id"],)).fetchone()[0] for q in (
            "SELECT count(*) FROM databases WHERE org = ?", "SELECT count(*) FROM volumes WHERE org = ?",
            "SELECT count(*) FROM snapshots WHERE org = ?",
            "SELECT count(*) FROM sandboxes WHERE org = ? AND state != 'killed'")]
        db.close()
        self.assertEqual(left, [0, 0, 0, 0])
        if pid:
            deadline = time.time() + 10
            while pid_alive(pid) and time.time() < deadline:
                time.sleep(0.1)
            self.assertFalse(pid_alive(pid), "the database's server still runs")
        if snap:
            self.assertEqual(glob.glob(os.path.join(self.daemon.data_dir, "**", snap["id"] + "*"), recursive=True), [])

    def test_revoked_key_ends_its_streams(self):
        o, k = new_org(self, self.admin)
        _, member = k.request("POST", "/v1/keys", body={"name": "streamer", "role": "member"}, expect=201)
        mk = self.c.with_key(member["key"])
        sid = k.create(ttl_seconds=600)["id"]
        s = sse.open(mk, "POST", "/v1/sandboxes/%s/exec/stream" % sid, body={"cmd": "echo up; sleep 60"})
        self.assertEqual(s.next(10).name, "start")
        self.assertEqual(s.next(10).data["data"], "up\n")
        w = sse.open(mk, "GET", "/v1/sandboxes/%s/events" % sid)
        # another key's stream on the same sandbox stays open
        other = sse.open(k, "GET", "/v1/sandboxes/%s/events" % sid)
        time.sleep(0.5)
        k.request("DELETE", "/v1/keys/" + member["id"], expect=204)
        t0 = time.time()
        evs = s.all(timeout=10)
        t_exec = time.time() - t0
        wevs = w.all(timeout=10)
        t_events = time.time() - t0
        s.close()
        w.close()
        self.assertLess(t_exec, 2.0, "exec/stream went on %.1f s after its key was revoked" % t_exec)
        self.assertLess(t_events, 2.0, "events went on %.1f s after its key was revoked" % t_events)
        self.assertEqual(evs[-1].name, "error", evs)
        self.assertEqual(evs[-1].data["code"], "unauthorized", evs)
        self.assertEqual(wevs[-1].data["code"], "unauthorized", wevs)
        self.assertEqual(self.status(mk, "GET", "/v1/me"), 401)
        # the admin's stream did not end
        end = time.time() + 1.5
        while time.time() < end:
            try:
                ev = other.next(max(0.05, end - time.time()))
            except TimeoutError:
                break
            self.assertIsNotNone(ev, "the stream of a key that was not revoked ended")
            self.assertNotEqual(ev.name, "error", ev)
        other.close()
        sys.stderr.write("[revoked: exec/stream ended in %.2f s, events in %.2f s] " % (t_exec, t_events))

    def test_revoked_key_ends_process_watch_and_pty(self):
        o, k = new_org(self, self.admin)
        _, member = k.request("POST", "/v1/keys", body={"name": "pty", "role": "member"}, expect=201)
        mk = self.c.with_key(member["key"])
        sid = k.create(ttl_seconds=600)["id"]
        _, bg = k.request("POST", "/v1/sandboxes/%s/exec" % sid,
                          body={"cmd": "while :; do echo t; sleep 0.2; done", "background": True}, expect=201)
        ps = sse.open(mk, "GET", "/v1/sandboxes/%s/processes/%d/stream" % (sid, bg["pid"]))
        self.assertIsNotNone(ps.next(10))
        wt = sse.open(mk, "GET", "/v1/sandboxes/%s/files/watch" % sid, query={"path": "/tmp"})
        w = ws.connect(mk, "/v1/sandboxes/%s/pty" % sid)
        self.addCleanup(w.sock.close)
        w.send_binary(b"echo hi$((40+2))\r")
        w.read_until(lambda b: b"hi42" in b)
        k.request("DELETE", "/v1/keys/" + member["id"], expect=204)
        t0 = time.time()
        with self.assertRaises(ws.Closed) as cm:
            while time.time() - t0 < 10:
                w.recv(10)
        t_pty = time.time() - t0
        self.assertEqual(cm.exception.code, 1008, cm.exception)
        pevs = []
        while True:  # the process's output goes on until the stream's end
            ev = ps.next(10)
            if ev is None:
                break
            pevs.append(ev)
        t_proc = time.time() - t0
        wevs = wt.all(timeout=10)
        t_watch = time.time() - t0
        ps.close()
        wt.close()
        self.assertEqual(pevs[-1].data["code"], "unauthorized", pevs[-3:])
        self.assertEqual(wevs[-1].data["code"], "unauthorized", wevs)
        for what, t in (("pty", t_pty), ("process stream", t_proc), ("watch", t_watch)):
            self.assertLess(t, 2.0, "%s went on %.1f s after its key was revoked" % (what, t))
        sys.stderr.write("[revoked: pty closed in %.2f s, process stream %.2f s, watch %.2f s] "
                         % (t_pty, t_proc, t_watch))

    def test_org_delete_ends_streams(self):
        o, k = new_org(self, self.admin)
        sid = k.create(ttl_seconds=600)["id"]
        w = sse.open(k, "GET", "/v1/sandboxes/%s/events" % sid)
        time.sleep(0.3)
        self.admin.request("DELETE", "/v1/orgs/" + o["id"], query={"force": "true"}, expect=204)
        t0 = time.time()
        w.all(timeout=10)
        w.close()
        self.assertLess(time.time() - t0, 2.0)


class OrgDeleteCrashTest(DaemonTest):
    """A forced delete that dies after the org's keys went (org_delete.begun) is finished by the next
    start: its sandboxes are killed, its volumes gone, the org 404."""
    pool = 0

    def test_resumed_after_crash(self):
        admin = self.c.with_key(platform_key(self.daemon))
        o, k = new_org(self, admin)
        sb = k.create(ttl_seconds=600)
        pid = self.daemon.sandbox_host(sb["id"])["pid"]
        k.request("POST", "/v1/volumes", body={"name": "keep", "size_mb": 16}, expect=201)
        db = sqlite3.connect("file:%s?mode=ro" % os.path.join(self.daemon.data_dir, "moat.db"), uri=True,
                             timeout=30)
        vid = db.execute("SELECT id FROM volumes WHERE org = ?", (o["id"],)).fetchone()[0]
        db.close()
        imgs = glob.glob(os.path.join(self.daemon.data_dir, "**", vid + "*"), recursive=True)
        self.assertTrue(imgs)
        self.daemon.terminate()
        self.daemon.env["MOAT_CRASH_AT"] = "org_delete.begun"
        self.daemon.start()
        admin = self.daemon.client.with_key(admin.key)
        try:
            admin.request("DELETE", "/v1/orgs/" + o["id"], query={"force": "true"}, timeout=60)
        except Exception:
            pass
        self.assertEqual(self.daemon.proc.wait(60), -9)
        del self.daemon.env["MOAT_CRASH_AT"]
        self.assertTrue(pid_alive(pid), "the sandbox died with moatd (expected: it outlives a crash)")
        self.daemon.start()
        admin = self.daemon.client.with_key(admin.key)
        with self.assertRaises(moatd.HTTPError) as cm:
            admin.request("GET", "/v1/orgs/" + o["id"])
        self.assertEqual(cm.exception.status, 404)
        deadline = time.time() + 10
        while pid_alive(pid) and time.time() < deadline:
            time.sleep(0.1)
        self.assertFalse(pid_alive(pid))
        db = sqlite3.connect("file:%s?mode=ro" % os.path.join(self.daemon.data_dir, "moat.db"), uri=True,
                             timeout=30)
        self.assertEqual(db.execute("SELECT count(*) FROM volumes WHERE org = ?", (o["id"],)).fetchone()[0], 0)
        self.assertEqual(db.execute("SELECT count(*) FROM sandboxes WHERE org = ? AND state != 'killed'",
                                    (o["id"],)).fetchone()[0], 0)
        db.close()
        self.assertIn("finishing its delete", self.daemon.log_tail(100000))
        self.assertEqual([p for p in imgs if os.path.exists(p)], [], "the volume's storage is left")


if __name__ == "__main__":
    import unittest
    unittest.main()

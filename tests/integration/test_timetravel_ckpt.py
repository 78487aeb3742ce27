"""test_timetravel_ckpt.py -- the checkpoint flows of time travel over real sandboxes: snapshots (and a
snapshot of a restored sandbox), fork (children diverge, 16 at once), explore (first_success keeps
exactly the winner and leaves no cgroup behind; best waits for the client's choice), hibernate/wake
(explicit and transparent, across a moatd restart, idle hibernation that spares a busy sandbox),
rollback, and a kill -9 of moatd in the middle of a snapshot.

A Python process in the sandbox holds state only in memory (a random secret drawn at start and a
counter; /root/inc adds to the counter) and publishes it to /root/state every 50 ms: memory
survived when the secret is the same and the counter went on from where it was.

Every test skips, saying why, while GET /healthz reports checkpoints.available false (no CRIU that
passes `criu check` on this host)."""

import os
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
import moatd  # noqa: E402
from moattest import DaemonTest  # noqa: E402

HOLDER = r"""
import os, sys, time
d = {"secret": os.urandom(8).hex(), "n": 0}
blob = bytearray(int(sys.argv[1]) * 1048576)
for i in range(0, len(blob), 4096):
    blob[i] = 1
while True:
    try:
        with open("/root/inc") as f:
            d["n"] += int(f.read())
        os.remove("/root/inc")
    except (FileNotFoundError, ValueError):
        pass
    d["n"] += 1
    with open("/root/state.tmp", "w") as f:
        f.write("%s %d" % (d["secret"], d["n"]))
    os.rename("/root/state.tmp", "/root/state")
    time.sleep(0.05)
"""


def checkpoints(client):
    h = client.request("GET", "/healthz")[1]
    ck = h.get("checkpoints") or {}
    return bool(ck.get("available")), ck.get("criu", "no checkpoints field in /healthz")


def slot_cgroups(daemon):
    """slot-N cgroup dirs beneath the daemon's test cgroups (every hierarchy)."""
    out = []
    for top in daemon.cgroups:
        for root, dirs, _ in os.walk(top):
            out += [os.path.join(root, d) for d in dirs if d.startswith("slot-")]
    return out


def host_footprint(daemon):
    """What sandboxes hold on the host: slot cgroup dirs, mounts under the data dir, net namespaces."""
    netns = set()
    for d in daemon.cgroups:
        for pid in moatd.cgroup_procs(d):
            try:
                netns.add(os.stat("/proc/%d/ns/net" % pid).st_ino)
            except OSError:
                pass
    return set(slot_cgroups(daemon)), set(moatd.mounts_under(daemon.data_dir)), netns


class CkptTest(DaemonTest):
    pool = 1

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.available, cls.criu = checkpoints(cls.c)

    def setUp(self):
        if not self.available:
            self.skipTest("checkpoints unavailable on this host: %s" % self.criu)

    # -- helpers --
    def post(self, sid, what, body=None, expect=200, timeout=None):
        return self.c.request("POST", "/v1/sandboxes/%s/%s" % (sid, what), body=body if body is not None else {},
                              expect=expect, timeout=timeout)[1]

    def cleanup_sandbox(self, sid):
        self.addCleanup(self._delete_quietly, self.c, sid)

    def holder(self, mb=0, **spec):
        spec.setdefault("ttl_seconds", 900)
        sid = self.sandbox(**spec)["id"]
        self.c.put_file(sid, "/root/holder.py", HOLDER.encode())
        self.c.exec(sid, cmd="python3 /root/holder.py %d" % mb, background=True, expect=(200, 201))
        self.wait_state(sid, lambda s: s[1] >= 3)
        return sid

    def state(self, sid):
        out = self.c.sh(sid, "cat /root/state")
        secret, n = out.split()
        return secret, int(n)

    def wait_state(self, sid, pred, timeout=15):
        deadline = time.time() + timeout
        last = None
        while time.time() < deadline:
            try:
                last = self.state(sid)
                if pred(last):
                    return last
            except (ValueError, AssertionError, moatd.HTTPError):
                pass
            time.sleep(0.1)
        self.fail("state of %s never matched (last %r)" % (sid, last))

    def assertContinues(self, sid, secret, at_least):
        """The holder in sid has the same in-memory secret and counts on from at_least."""
        s = self.wait_state(sid, lambda s: s[1] > at_least + 2)
        self.assertEqual(s[0], secret, "memory of %s was not carried over (new secret)" % sid)

    def snapshot_dirs(self):
        return sorted(os.listdir(os.path.join(self.daemon.data_dir, "snapshots")))

    # -- snapshots --
    def test_snapshot_restore_and_snapshot_of_restored(self):
        sid = self.holder()
        self.c.put_file(sid, "/root/a.txt", b"before the snapshot")
        secret, n0 = self.state(sid)
        snap = self.post(sid, "snapshots", {"metadata": {"step": "1"}}, expect=201)
        self.assertTrue(snap["id"].startswith("snap-"), snap)
        self.assertEqual((snap["sandbox_id"], snap["metadata"], snap["template"]), (sid, {"step": "1"}, "base"))
        self.assertGreater(snap["memory_bytes"], 0)
        self.assertEqual(self.c.request("GET", "/v1/snapshots/" + snap["id"])[1]["id"], snap["id"])
        listed = self.c.request("GET", "/v1/snapshots", query={"sandbox_id": sid})[1]["snapshots"]
        self.assertEqual([s["id"] for s in listed], [snap["id"]])
        self.assertIn(snap["id"], self.snapshot_dirs())
        # the parent keeps running
        self.assertContinues(sid, secret, n0)
        # a sandbox from the snapshot: same memory and files, its own id
        r = self.c.create(from_snapshot=snap["id"], ttl_seconds=900)
        self.cleanup_sandbox(r["id"])
        self.assertEqual((r["state"], r["from_snapshot"]), ("running", snap["id"]))
        self.assertNotEqual(r["id"], sid)
        self.assertEqual(self.c.get_file(r["id"], "/root/a.txt"), b"before the snapshot")
        self.assertContinues(r["id"], secret, n0)
        # a snapshot of the restored sandbox restores too, again and again
        snap2 = self.post(r["id"], "snapshots", expect=201)
        r2 = self.c.create(from_snapshot=snap2["id"], ttl_seconds=900)
        self.cleanup_sandbox(r2["id"])
        self.assertContinues(r2["id"], secret, n0)
        self.assertEqual(self.c.get_file(r2["id"], "/root/a.txt"), b"before the snapshot")
        r3 = self.post(r2["id"], "fork", {"count": 1}, expect=201)["sandboxes"][0]
        self.cleanup_sandbox(r3["id"])
        self.assertContinues(r3["id"], secret, n0)
        # delete
        self.c.request("DELETE", "/v1/snapshots/" + snap["id"], expect=204)
        self.assertApiError(404, "not_found", self.c.request, "GET", "/v1/snapshots/" + snap["id"])
        self.assertNotIn(snap["id"], self.snapshot_dirs())
        self.assertApiError(404, "not_found", self.c.create, from_snapshot=snap["id"])
        self.c.request("DELETE", "/v1/snapshots/" + snap2["id"], expect=204)

    def test_snapshot_of_paused_sandbox_stays_paused(self):
        sid = self.holder()
        self.post(sid, "pause")
        snap = self.post(sid, "snapshots", expect=201)
        self.addCleanup(self.c.request, "DELETE", "/v1/snapshots/" + snap["id"], expect=(204, 404))
        self.assertEqual(self.c.get(sid)["state"], "paused")
        self.post(sid, "resume")
        self.assertEqual(self.c.sh(sid, "echo ok"), "ok\n")

    # -- fork --
    def test_fork_children_diverge(self):
        sid = self.holder()
        self.c.put_file(sid, "/root/a.txt", b"parent file")
        secret, n0 = self.state(sid)
        out = self.post(sid, "fork", {"count": 2, "memory": True}, expect=201)
        kids = [k["id"] for k in out["sandboxes"]]
        for k in kids:
            self.cleanup_sandbox(k)
        self.assertEqual(len(set(kids + [sid])), 3)
        for k in out["sandboxes"]:
            self.assertEqual((k["state"], k["forked_from"], k["template"]), ("running", sid, "base"))
        for k in kids:
            self.assertEqual(self.c.get_file(k, "/root/a.txt"), b"parent file")
            self.assertContinues(k, secret, n0)
        # diverge: files and memory
        self.c.put_file(kids[0], "/root/who", b"A")
        self.c.put_file(kids[0], "/root/inc", b"100000")
        self.wait_state(kids[0], lambda s: s[1] > 100000)
        self.assertLess(self.state(kids[1])[1], 100000)
        self.assertLess(self.state(sid)[1], 100000)
        self.assertApiError(404, "not_found", self.c.get_file, kids[1], "/root/who")
        self.assertApiError(404, "not_found", self.c.get_file, sid, "/root/who")
        # own namespaces: different hostnames-independent pid 1 views, separate net namespaces
        self.assertEqual(self.c.get(sid)["state"], "running")

    def test_forks_of_a_paused_sandbox_reuse_its_image_until_it_resumes(self):
        sid = self.holder()
        self.c.put_file(sid, "/root/gen.txt", b"1")
        self.post(sid, "pause")
        times = []
        for _ in range(2):
            t0 = time.monotonic()
            k = self.post(sid, "fork", {"count": 1}, expect=201)["sandboxes"][0]["id"]
            times.append(time.monotonic() - t0)
            self.cleanup_sandbox(k)
            self.assertEqual(self.c.get_file(k, "/root/gen.txt"), b"1")
        self.assertEqual(self.c.get(sid)["state"], "paused")
        with open(self.daemon.log_path, "rb") as f:
            self.assertIn(b"reused the paused sandbox's image", f.read())
        # after a resume the image is stale: the next fork sees the new state
        self.post(sid, "resume")
        self.c.put_file(sid, "/root/gen.txt", b"2")
        self.post(sid, "pause")
        k = self.post(sid, "fork", {"count": 1}, expect=201)["sandboxes"][0]["id"]
        self.cleanup_sandbox(k)
        self.assertEqual(self.c.get_file(k, "/root/gen.txt"), b"2")
        self.post(sid, "resume")
        tmp = os.path.join(self.daemon.data_dir, "checkpoints-tmp")
        self.assertEqual(os.listdir(tmp), [], "fork images left behind after the resume")
        sys.stderr.write("[paused fork %.0f ms, again from its image %.0f ms] " % (times[0] * 1000, times[1] * 1000))

    def test_sixteen_forks(self):
        sid = self.holder()
        secret, n0 = self.state(sid)
        t0 = time.monotonic()
        out = self.post(sid, "fork", {"count": 16}, expect=201, timeout=600)
        dt = time.monotonic() - t0
        kids = [k["id"] for k in out["sandboxes"]]
        for k in kids:
            self.cleanup_sandbox(k)
        self.assertEqual(len(set(kids)), 16)
        for k in kids:
            self.assertContinues(k, secret, n0)
        sys.stderr.write("[16 forks in %.2f s] " % dt)
        for k in kids:
            self.c.delete(k)

    # -- explore --
    def test_explore_first_success_keeps_only_the_winner(self):
        sid = self.holder()
        time.sleep(1)  # let the warm pool refill after the holder's create
        before = host_footprint(self.daemon)
        out = self.post(sid, "explore", {"branches": [
            {"cmd": "echo nope; echo bad >&2; exit 1"},
            {"cmd": "sleep 1; echo fixed > /root/fix.txt; echo yes; exit 0"},
            {"cmd": "sleep 60; exit 0", "timeout_ms": 120000}], "keep": "first_success"}, timeout=600)
        self.assertEqual(len(out["outcomes"]), 3)
        o = out["outcomes"]
        winner = out["winner"]
        self.assertEqual(winner, o[1]["sandbox_id"], out)
        self.cleanup_sandbox(winner)
        self.assertEqual((o[0]["exit_code"], o[0]["stdout_tail"], o[0]["stderr_tail"]), (1, "nope\n", "bad\n"))
        self.assertEqual((o[1]["exit_code"], o[1]["stdout_tail"]), (0, "yes\n"))
        self.assertIn("/root/fix.txt", o[1]["files_changed"])
        self.assertTrue(o[1]["alive"])
        self.assertFalse(o[0]["alive"] or o[2]["alive"])
        self.assertLess(o[1]["duration_ms"], 60000)
        # exactly the parent and the winner are left, and no cgroup of a loser
        live = sorted(s["id"] for s in self.c.list())
        self.assertEqual(live, sorted([sid, winner]))
        for x in (o[0]["sandbox_id"], o[2]["sandbox_id"]):
            self.assertEqual(self.c.get(x)["state"], "killed")
        self.assertEqual(self.c.get_file(winner, "/root/fix.txt"), b"fixed\n")
        self.assertEqual(self.c.get(winner)["forked_from"], sid)
        # with the winner gone too, the host holds what it held before the explore: no cgroup, mount or
        # net namespace of a branch is left
        self.c.delete(winner)
        deadline = time.time() + 15
        while time.time() < deadline:
            now = host_footprint(self.daemon)
            left = [now[0] - before[0], now[1] - before[1], now[2] - before[2]]
            if not any(left):
                break
            time.sleep(0.3)
        self.assertEqual(left, [set(), set(), set()], "branches left cgroups / mounts / net namespaces behind")

    def test_explore_none_passes(self):
        sid = self.holder()
        out = self.post(sid, "explore", {"branches": [{"cmd": "exit 3"}, {"cmd": "exit 4"}]}, timeout=600)
        self.assertIsNone(out["winner"])
        self.assertEqual([o["exit_code"] for o in out["outcomes"]], [3, 4])
        self.assertEqual([s["id"] for s in self.c.list()], [sid])

    def test_explore_best_and_choose(self):
        sid = self.holder()
        out = self.post(sid, "explore", {"branches": [{"cmd": "echo 1 > /root/score"}, {"cmd": "echo 2 > /root/score"}],
                                         "keep": "best"}, timeout=600)
        self.assertIsNone(out["winner"])
        self.assertTrue(out["explore_id"].startswith("exp-"))
        ids = [o["sandbox_id"] for o in out["outcomes"]]
        for x in ids:
            self.cleanup_sandbox(x)
        self.assertTrue(all(o["alive"] for o in out["outcomes"]))
        self.assertEqual(sorted(s["id"] for s in self.c.list()), sorted([sid] + ids))
        r = self.post(sid, "explore", {"choose": {"explore_id": out["explore_id"], "sandbox_id": ids[1]}})
        self.assertEqual(r["winner"], ids[1])
        self.assertEqual(r["sandbox"]["ttl_seconds"], 900)
        self.assertEqual(self.c.get(ids[0])["state"], "killed")
        self.assertEqual(self.c.get_file(ids[1], "/root/score"), b"2\n")
        self.assertApiError(404, "not_found", self.post, sid, "explore",
                            {"choose": {"explore_id": out["explore_id"], "sandbox_id": ids[1]}})

    # -- hibernate / wake --
    def test_hibernate_wake_explicit_and_transparent(self):
        sid = self.holder(mb=16)
        self.c.put_file(sid, "/root/a.txt", b"before hibernate")
        secret, n0 = self.state(sid)
        nslots = len(slot_cgroups(self.daemon))
        r = self.post(sid, "hibernate")
        self.assertEqual(r["state"], "hibernated", r)
        self.assertIsNotNone(r["paused_at"])
        self.assertTrue(os.path.isdir(os.path.join(self.daemon.data_dir, "hibernate", sid)))
        self.assertEqual(self.post(sid, "hibernate")["state"], "hibernated")  # idempotent
        deadline = time.time() + 10
        while time.time() < deadline and len(slot_cgroups(self.daemon)) >= nslots:
            time.sleep(0.2)
        self.assertLess(len(slot_cgroups(self.daemon)), nslots, "hibernate kept the slot (memory not released)")
        self.assertApiError(409, "conflict", self.post, sid, "pause")
        # transparent wake on a file read
        self.assertEqual(self.c.get_file(sid, "/root/a.txt"), b"before hibernate")
        self.assertEqual(self.c.get(sid)["state"], "running")
        self.assertContinues(sid, secret, n0)
        self.assertFalse(os.path.exists(os.path.join(self.daemon.data_dir, "hibernate", sid)))
        # explicit wake, then transparent wake on exec; twice over
        for _ in range(2):
            self.post(sid, "hibernate")
            self.assertEqual(self.post(sid, "wake")["state"], "running")
            self.assertEqual(self.post(sid, "wake")["state"], "running")
            self.post(sid, "hibernate")
            self.assertEqual(self.c.sh(sid, "cat /root/a.txt"), "before hibernate")
        self.assertContinues(sid, secret, n0)
        # a hibernated sandbox can be killed; its image goes
        self.post(sid, "hibernate")
        self.c.delete(sid)
        self.assertFalse(os.path.exists(os.path.join(self.daemon.data_dir, "hibernate", sid)))

    def test_checkpoints_of_a_sandbox_spawning_all_the_time(self):
        """A freeze can catch a vfork parent (posix_spawn, subprocess) whose child froze before its
        exec: that parent sits in uninterruptible sleep, which CRIU cannot seize (it timed out after
        10 s with "Unseizable non-zombie ... state D"). Snapshots and a hibernate of a sandbox that
        spawns without pause must all succeed."""
        sid = self.sandbox(ttl_seconds=900)["id"]
        spawner = ("import subprocess\n"
                   "while True:\n"
                   "    subprocess.run(['/bin/true'])\n")
        self.c.put_file(sid, "/root/spawner.py", spawner.encode())
        pid = self.c.exec(sid, argv=["python3", "/root/spawner.py"], background=True, expect=(200, 201))["pid"]
        self.c.put_file(sid, "/root/f", b"kept")
        time.sleep(0.3)
        for _ in range(8):
            snap = self.post(sid, "snapshots", expect=201, timeout=60)
            self.c.request("DELETE", "/v1/snapshots/" + snap["snapshot_id"], expect=204)
        self.assertEqual(self.post(sid, "hibernate", timeout=60)["state"], "hibernated")
        self.assertEqual(self.c.get_file(sid, "/root/f"), b"kept")
        # the same spawner runs on after the wake (its children come and go)
        self.assertIn("spawner.py", self.c.sh(sid, "tr '\\0' ' ' < /proc/%d/cmdline" % pid))

    def test_idle_hibernation_spares_a_busy_sandbox(self):
        import sse
        idle = self.sandbox(persistent=True, idle={"hibernate_after_seconds": 2})["id"]
        busy = self.sandbox(persistent=True, idle={"hibernate_after_seconds": 2})["id"]
        attached = self.sandbox(persistent=True, idle={"hibernate_after_seconds": 2})["id"]
        self.assertEqual(self.c.get(idle)["idle"], {"hibernate_after_seconds": 2})
        self.c.exec(busy, cmd="while :; do :; done", background=True, expect=(200, 201))
        # an attached stream whose command sleeps: no CPU, no API call, yet someone is there
        st = sse.open(self.c, "POST", "/v1/sandboxes/%s/exec/stream" % attached, body={"cmd": "sleep 60"})
        self.addCleanup(st.close)
        deadline = time.time() + 20
        while time.time() < deadline and self.c.get(idle)["state"] != "hibernated":
            time.sleep(0.5)
        self.assertEqual(self.c.get(idle)["state"], "hibernated")
        time.sleep(2)
        self.assertEqual(self.c.get(busy)["state"], "running", "a busy sandbox was hibernated")
        self.assertEqual(self.c.get(attached)["state"], "running", "a sandbox with an attached stream was hibernated")
        self.assertEqual(self.c.sh(idle, "echo back"), "back\n")

    # -- rollback --
    def test_rollback_restores_files_and_memory(self):
        sid = self.holder()
        self.c.put_file(sid, "/root/v.txt", b"v1")
        secret, n_snap = self.state(sid)
        snap = self.post(sid, "snapshots", expect=201)
        self.addCleanup(self.c.request, "DELETE", "/v1/snapshots/" + snap["id"], expect=(204, 404))
        self.c.put_file(sid, "/root/v.txt", b"v2")
        self.c.put_file(sid, "/root/new.txt", b"after")
        self.c.put_file(sid, "/root/inc", b"500000")
        self.wait_state(sid, lambda s: s[1] > 500000)
        r = self.post(sid, "rollback", {"snapshot_id": snap["id"]})
        self.assertEqual((r["id"], r["state"], r["from_snapshot"]), (sid, "running", snap["id"]))
        self.assertEqual(self.c.get_file(sid, "/root/v.txt"), b"v1")
        self.assertApiError(404, "not_found", self.c.get_file, sid, "/root/new.txt")
        s = self.wait_state(sid, lambda s: s[1] > n_snap)
        self.assertEqual(s[0], secret)
        self.assertLess(s[1], 500000, "the counter's memory was not rolled back")
        # a snapshot of another sandbox is refused
        other = self.holder()
        self.assertApiError(400, "invalid_request", self.post, other, "rollback", {"snapshot_id": snap["id"]})

    # -- CLI --
    def moat(self, *args):
        import subprocess
        env = dict(os.environ, MOAT_API_URL="http://127.0.0.1:%d" % self.daemon.port, MOAT_API_KEY=self.c.key)
        r = subprocess.run([os.path.join(moatd.BUILD, "moat")] + list(args), env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=300)
        return r.returncode, r.stdout.decode(), r.stderr.decode()

    def test_cli(self):
        sid = self.holder()
        self.c.put_file(sid, "/root/v.txt", b"v1")
        rc, snap, err = self.moat("snapshot", sid, "--meta", "step=1")
        self.assertEqual(rc, 0, err)
        snap = snap.strip()
        self.addCleanup(self.c.request, "DELETE", "/v1/snapshots/" + snap, expect=(204, 404))
        self.assertTrue(snap.startswith("snap-"), snap)
        rc, out, err = self.moat("snapshots", "ls", "--sandbox", sid)
        self.assertEqual(rc, 0, err)
        self.assertIn(snap, out)
        rc, out, err = self.moat("snapshots", "get", snap)
        self.assertEqual(rc, 0, err)
        self.assertIn('"step": "1"', out)
        rc, out, err = self.moat("fork", sid, "--count", "2")
        self.assertEqual(rc, 0, err)
        kids = out.split()
        self.assertEqual(len(kids), 2, out)
        for k in kids:
            self.cleanup_sandbox(k)
            self.assertEqual(self.c.get(k)["forked_from"], sid)
        self.c.put_file(sid, "/root/v.txt", b"v2")
        rc, out, err = self.moat("rollback", sid, snap)
        self.assertEqual((rc, out), (0, "%s running\n" % sid), err)
        self.assertEqual(self.c.get_file(sid, "/root/v.txt"), b"v1")
        rc, out, err = self.moat("hibernate", sid)
        self.assertEqual((rc, out), (0, "%s hibernated\n" % sid), err)
        rc, out, err = self.moat("wake", sid)
        self.assertEqual((rc, out), (0, "%s running\n" % sid), err)
        rc, out, err = self.moat("explore", sid, "exit 1", "exit 0")
        self.assertEqual(rc, 0, err)
        import json
        res = json.loads(out)
        self.assertEqual(res["winner"], res["outcomes"][1]["sandbox_id"])
        self.cleanup_sandbox(res["winner"])
        rc, out, err = self.moat("create", "--from-snapshot", snap)
        self.assertEqual(rc, 0, err)
        self.cleanup_sandbox(out.strip())
        self.assertEqual(self.c.get(out.strip())["from_snapshot"], snap)
        rc, out, err = self.moat("snapshots", "rm", snap)
        self.assertEqual(rc, 0, err)
        self.assertApiError(404, "not_found", self.c.request, "GET", "/v1/snapshots/" + snap)

    # -- crash --
    def test_kill9_during_snapshot_leaves_no_half_snapshot(self):
        sid = self.holder(mb=64)
        hits = 0
        for delay in (0.005, 0.02, 0.05, 0.1, 0.2):
            res = {}

            def snap():
                try:
                    res["r"] = self.c.request("POST", "/v1/sandboxes/%s/snapshots" % sid, body={}, timeout=60)
                except Exception as e:  # the daemon dies under it
                    res["e"] = e
            t = threading.Thread(target=snap)
            t.start()
            time.sleep(delay)
            self.daemon.kill9()
            t.join(60)
            partial = [d for d in self.snapshot_dirs() if d.endswith(".partial")]
            hits += bool(partial)
            self.daemon.start()
            type(self).c = self.c = self.daemon.client
            listed = self.c.request("GET", "/v1/snapshots")[1]["snapshots"]
            dirs = self.snapshot_dirs()
            self.assertFalse([d for d in dirs if "." in d], "partial snapshot dirs left after the restart: %r" % dirs)
            self.assertEqual(sorted(s["id"] for s in listed), dirs)
            for s in listed:  # a listed snapshot is complete: it restores
                r = self.c.create(from_snapshot=s["id"], ttl_seconds=900)
                self.assertEqual(self.c.sh(r["id"], "echo ok"), "ok\n")
                self.c.delete(r["id"])
                self.c.request("DELETE", "/v1/snapshots/" + s["id"], expect=204)
            self.assertEqual(self.c.get(sid)["state"], "running")
            self.assertEqual(self.c.sh(sid, "echo alive"), "alive\n")
        sys.stderr.write("[%d of 5 kills landed mid-snapshot] " % hits)
        self.assertGreater(hits, 0, "no kill landed while a snapshot was being written: the test proved nothing")

    def test_hibernated_survives_restart(self):
        sid = self.holder()
        secret, n0 = self.state(sid)
        self.post(sid, "hibernate")
        self.daemon.kill9()
        self.daemon.start()
        type(self).c = self.c = self.daemon.client
        self.assertEqual(self.c.get(sid)["state"], "hibernated")
        self.assertEqual(self.post(sid, "wake")["state"], "running")
        self.assertContinues(sid, secret, n0)


if __name__ == "__main__":
    unittest.main()

"""test_timetravel.py -- pause/resume over real sandboxes (cgroup freeze): a paused sandbox burns no CPU,
keeps its processes and files, answers guest calls with 409 sandbox_paused, its TTL clock stops; pause
and resume are idempotent; moatd restarted after a kill -9 adopts a paused sandbox paused. Also the
request validation of every time-travel route and /healthz's checkpoints field (these need no CRIU;
the checkpoint flows are in test_timetravel_ckpt.py)."""

import os
import sys
import time
import unittest
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
import moatd  # noqa: E402
from moattest import DaemonTest  # noqa: E402


def v2_dir(pid):
    for d in moatd.pid_cgroup_dirs(pid):
        if os.path.exists(os.path.join(d, "cgroup.freeze")):
            return d
    return None


def cgroup_cpu_us(d):
    with open(os.path.join(d, "cpu.stat")) as f:
        for line in f:
            k, v = line.split()
            if k == "usage_usec":
                return int(v)
    raise AssertionError("no usage_usec in %s/cpu.stat" % d)


def proc_cpu_ticks(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(") ", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def parse_time(s):
    # "YYYY-MM-DDTHH:MM:SS.mmmZ" -> seconds since the epoch
    import calendar
    base, frac = s.rstrip("Z").split(".")
    return calendar.timegm(time.strptime(base, "%Y-%m-%dT%H:%M:%S")) + int(frac) / 1000.0


class PauseResumeTest(DaemonTest):
    def post(self, sid, what, body=None, expect=200):
        return self.c.request("POST", "/v1/sandboxes/%s/%s" % (sid, what), body=body if body is not None else {},
                              expect=expect)[1]

    def start_busy(self, sid, tag):
        """A background busy loop tagged `tag`; returns its host pid."""
        r = self.c.exec(sid, cmd="exec sh -c 'while :; do :; done' %s" % tag, background=True, expect=(200, 201))
        self.assertIn("pid", r)
        deadline = time.time() + 5
        while time.time() < deadline:
            pids = moatd.find_pids_by_cmdline(tag)
            if pids:
                return pids[0]
            time.sleep(0.05)
        self.fail("busy loop %s not found on the host" % tag)

    def test_paused_sandbox_burns_no_cpu_and_resume_continues(self):
        sb = self.sandbox(ttl_seconds=600)
        sid = sb["id"]
        tag = "moat-tt-busy-" + uuid.uuid4().hex[:10]
        pid = self.start_busy(sid, tag)
        cg = v2_dir(pid)
        self.assertIsNotNone(cg, "no v2 cgroup for pid %d" % pid)
        time.sleep(0.3)
        t0 = time.monotonic()
        p = self.post(sid, "pause")
        pause_ms = (time.monotonic() - t0) * 1000
        self.assertEqual(p["state"], "paused", p)
        self.assertIsNotNone(p["paused_at"])
        self.assertEqual(self.c.get(sid)["state"], "paused")
        with open(os.path.join(cg, "cgroup.events")) as f:
            self.assertIn("frozen 1", f.read())
        cpu0, ticks0 = cgroup_cpu_us(cg), proc_cpu_ticks(pid)
        time.sleep(1.0)
        cpu1, ticks1 = cgroup_cpu_us(cg), proc_cpu_ticks(pid)
        self.assertLess(cpu1 - cpu0, 5000, "paused sandbox used %d us of CPU in 1 s" % (cpu1 - cpu0))
        self.assertEqual(ticks1, ticks0, "the busy loop ran while paused")
        # idempotent pause
        self.assertEqual(self.post(sid, "pause")["state"], "paused")
        r = self.post(sid, "resume")
        self.assertEqual(r["state"], "running", r)
        self.assertIsNone(r["paused_at"])
        # the same process goes on burning CPU
        self.assertIn(pid, moatd.find_pids_by_cmdline(tag))
        c0 = cgroup_cpu_us(cg)
        time.sleep(0.5)
        self.assertGreater(cgroup_cpu_us(cg) - c0, 100000, "busy loop did not continue after resume")
        self.assertEqual(self.post(sid, "resume")["state"], "running")  # idempotent
        self.assertEqual(self.c.sh(sid, "echo ok"), "ok\n")
        self.assertLess(pause_ms, 2000, "pause took %.0f ms" % pause_ms)

    def test_guest_calls_answer_409_while_paused(self):
        sid = self.sandbox(ttl_seconds=600)["id"]
        self.c.put_file(sid, "/root/before.txt", b"written before the pause")
        self.post(sid, "pause")
        self.addCleanup(lambda: self.post(sid, "resume", expect=(200, 404)))
        e = self.assertApiError(409, "sandbox_paused", self.c.exec, sid, cmd="true")
        self.assertIn("resume", e.body["message"])
        self.assertApiError(409, "sandbox_paused", self.c.get_file, sid, "/root/before.txt")
        self.assertApiError(409, "sandbox_paused", self.c.put_file, sid, "/root/x", b"x")
        self.assertApiError(409, "sandbox_paused", self.c.list_files, sid, "/root")
        self.assertApiError(409, "sandbox_paused", self.c.request, "GET", "/v1/sandboxes/%s/processes" % sid)
        self.post(sid, "resume")
        self.assertEqual(self.c.get_file(sid, "/root/before.txt"), b"written before the pause")

    def test_memory_state_continues_across_pause(self):
        sid = self.sandbox(ttl_seconds=600)["id"]
        self.c.exec(sid, cmd="i=0; while :; do i=$((i+1)); echo $i > /tmp/counter; sleep 0.02; done",
                    background=True, expect=(200, 201))
        time.sleep(0.5)
        self.post(sid, "pause")
        time.sleep(0.5)
        self.post(sid, "resume")
        before = int(self.c.sh(sid, "cat /tmp/counter").strip() or 0)
        time.sleep(0.3)
        after = int(self.c.sh(sid, "cat /tmp/counter").strip())
        self.assertGreater(before, 5)
        self.assertGreater(after, before, "the counter restarted or stopped")
        # the shell's variable kept counting from where it was: no restart from 1
        self.assertGreater(after, 10)

    def test_ttl_clock_stops_while_paused(self):
        sid = self.sandbox(ttl_seconds=3)["id"]
        exp0 = parse_time(self.c.get(sid)["expires_at"])
        self.post(sid, "pause")
        time.sleep(5)  # past the TTL: the reaper must not kill it
        sb = self.c.get(sid)
        self.assertEqual(sb["state"], "paused", sb)
        r = self.post(sid, "resume")
        exp1 = parse_time(r["expires_at"])
        self.assertGreater(exp1 - exp0, 4.0, "expires_at did not move on by the paused time")
        self.assertEqual(self.c.sh(sid, "echo alive"), "alive\n")
        # and the clock runs again afterwards
        deadline = time.time() + 15
        while time.time() < deadline and self.c.get(sid)["state"] != "killed":
            time.sleep(0.5)
        sb = self.c.get(sid)
        self.assertEqual((sb["state"], sb["killed_reason"]), ("killed", "ttl"))

    def test_ttl_patched_while_paused_counts_from_the_patch(self):
        sid = self.sandbox(ttl_seconds=600)["id"]
        self.post(sid, "pause")
        time.sleep(2)
        self.c.patch(sid, ttl_seconds=30)
        t = time.time()
        r = self.post(sid, "resume")
        left = parse_time(r["expires_at"]) - t
        self.assertTrue(29 <= left <= 31.5, "expires in %.1f s after a 30 s TTL set while paused" % left)

    def test_kill_of_paused_sandbox(self):
        sid = self.c.create(ttl_seconds=600)["id"]
        self.post(sid, "pause")
        self.c.delete(sid)
        sb = self.c.get(sid)
        self.assertEqual((sb["state"], sb["killed_reason"]), ("killed", "api"))
        self.assertApiError(404, "not_found", self.post, sid, "pause")
        self.assertApiError(404, "not_found", self.post, sid, "resume")

    def test_validation(self):
        sid = self.sandbox(ttl_seconds=600)["id"]
        nope = "sb-" + "0" * 17
        for what in ("pause", "resume", "hibernate", "wake"):
            self.assertApiError(404, "not_found", self.post, nope, what)
            self.assertApiError(400, "invalid_request", self.post, sid, what, {"bogus": 1})
        self.assertApiError(400, "invalid_json", self.c.request, "POST", "/v1/sandboxes/%s/pause" % sid,
                            raw=b"{nope")
        # snapshots
        st, body = self.c.request("GET", "/v1/snapshots")
        self.assertEqual(body, {"snapshots": []})
        self.assertApiError(400, "invalid_request", self.c.request, "GET", "/v1/snapshots",
                            query={"sandbox_id": "x"})
        self.assertApiError(400, "invalid_request", self.c.request, "GET", "/v1/snapshots", query={"bogus": "1"})
        for m in ("GET", "DELETE"):
            self.assertApiError(404, "not_found", self.c.request, m, "/v1/snapshots/snap-" + "0" * 17)
            self.assertApiError(404, "not_found", self.c.request, m, "/v1/snapshots/whatever")
        self.assertApiError(400, "invalid_request", self.post, sid, "snapshots", {"metadata": "x"})
        self.assertApiError(400, "invalid_request", self.post, sid, "snapshots", {"bogus": 1})
        # fork
        for bad in ({"count": 0}, {"count": 17}, {"count": "2"}, {"memory": False}, {"memory": 1}, {"x": 1}):
            self.assertApiError(400, "invalid_request", self.post, sid, "fork", bad)
        # explore
        for bad in ({}, {"branches": []}, {"branches": [{"cmd": "true"}] * 17}, {"branches": [{"cmd": ""}]},
                    {"branches": [{"cmd": "true", "timeout_ms": 0}]}, {"branches": [{"cmd": 1}]},
                    {"branches": ["true"]}, {"branches": [{"cmd": "true", "x": 1}]},
                    {"branches": [{"cmd": "true"}], "keep": "worst"}, {"choose": 1},
                    {"choose": {"explore_id": "exp-x", "sandbox_id": "nope"}},
                    {"choose": {"explore_id": "exp-x", "sandbox_id": sid}, "keep": "best"}):
            self.assertApiError(400, ("invalid_request", "invalid_json"), self.post, sid, "explore", bad)
        self.assertApiError(404, "not_found", self.post, sid, "explore",
                            {"choose": {"explore_id": "exp-" + "0" * 17, "sandbox_id": sid}})
        # rollback
        for bad in ({}, {"snapshot_id": 5}, {"snapshot_id": ""}, {"x": 1}):
            self.assertApiError(400, "invalid_request", self.post, sid, "rollback", bad)
        self.assertApiError(404, "not_found", self.post, sid, "rollback", {"snapshot_id": "snap-" + "0" * 17})
        # create from a snapshot that does not exist; idle needs persistent
        self.assertApiError(404, "not_found", self.c.create, from_snapshot="snap-" + "0" * 17)
        self.assertApiError(400, "invalid_request", self.c.create, idle={"hibernate_after_seconds": 5})
        self.assertApiError(400, "invalid_request", self.c.create, persistent=True, idle={"hibernate_after_seconds": 0})
        self.assertAlive(sid)

    def test_healthz_reports_checkpoints(self):
        st, h = self.c.request("GET", "/healthz")
        ck = h.get("checkpoints")
        self.assertIsInstance(ck, dict, h)
        self.assertIsInstance(ck.get("available"), bool)
        self.assertIsInstance(ck.get("criu"), str)
        self.assertTrue(ck["criu"])

    def moat(self, *args):
        import subprocess
        env = dict(os.environ, MOAT_API_URL="http://127.0.0.1:%d" % self.daemon.port, MOAT_API_KEY=self.c.key)
        return subprocess.run([os.path.join(moatd.BUILD, "moat")] + list(args), env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, timeout=120)

    def test_cli(self):
        sid = self.sandbox(ttl_seconds=600)["id"]
        r = self.moat("pause", sid)
        self.assertEqual((r.returncode, r.stdout.decode()), (0, "%s paused\n" % sid), r.stderr)
        self.assertEqual(self.c.get(sid)["state"], "paused")
        r = self.moat("exec", sid, "true")
        self.assertEqual(r.returncode, 1)
        self.assertIn(b"sandbox_paused", r.stderr)
        r = self.moat("resume", sid)
        self.assertEqual((r.returncode, r.stdout.decode()), (0, "%s running\n" % sid), r.stderr)
        r = self.moat("snapshots", "ls")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(r.stdout.startswith(b"SNAPSHOT"), r.stdout)
        r = self.moat("snapshots", "rm", "snap-" + "0" * 17)
        self.assertEqual(r.returncode, 1)
        self.assertIn(b"not_found", r.stderr)
        r = self.moat("fork", sid, "--count", "0")
        self.assertEqual(r.returncode, 1)
        self.assertIn(b"invalid_request", r.stderr)
        r = self.moat("pause")
        self.assertEqual(r.returncode, 2)


class WithoutCriuTest(unittest.TestCase):
    """A moatd whose CRIU is missing (MOAT_CRIU names no file): every checkpoint route answers 503
    checkpoints_unavailable and changes nothing, while pause/resume work."""

    def setUp(self):
        self.d = moatd.MoatDaemon(pool=0)
        self.addCleanup(self.d.stop)
        old = os.environ.get("MOAT_CRIU")
        os.environ["MOAT_CRIU"] = "/nonexistent/criu"
        try:
            self.d.start()
        finally:
            if old is None:
                del os.environ["MOAT_CRIU"]
            else:
                os.environ["MOAT_CRIU"] = old
        self.c = self.d.client

    def post(self, sid, what, body):
        return self.c.request("POST", "/v1/sandboxes/%s/%s" % (sid, what), body=body)[1]

    def test_checkpoint_routes_answer_503(self):
        ck = self.c.request("GET", "/healthz")[1]["checkpoints"]
        self.assertFalse(ck["available"], ck)
        self.assertIn("/nonexistent/criu", ck["criu"])
        sid = self.c.create(ttl_seconds=600)["id"]
        for what, body in (("snapshots", {}), ("fork", {"count": 2}), ("hibernate", {}),
                           ("explore", {"branches": [{"cmd": "true"}]})):
            with self.assertRaises(moatd.HTTPError) as cm:
                self.post(sid, what, body)
            e = cm.exception
            self.assertEqual((e.status, e.code), (503, "checkpoints_unavailable"), e.body)
            self.assertIn("/nonexistent/criu", e.body["message"])
        # nothing half-made: the sandbox still runs, no children, no snapshots, and pause works
        self.assertEqual(self.c.get(sid)["state"], "running")
        self.assertEqual([s["id"] for s in self.c.list()], [sid])
        self.assertEqual(self.c.request("GET", "/v1/snapshots")[1], {"snapshots": []})
        self.assertEqual(os.listdir(os.path.join(self.d.data_dir, "snapshots")), [])
        self.assertEqual(self.post(sid, "wake", {})["state"], "running")  # running already: no CRIU needed
        self.assertEqual(self.post(sid, "pause", {})["state"], "paused")
        self.assertEqual(self.post(sid, "resume", {})["state"], "running")
        self.assertEqual(self.c.sh(sid, "echo ok"), "ok\n")
        self.c.delete(sid)


class PausedAcrossRestartTest(unittest.TestCase):
    def setUp(self):
        self.d = moatd.MoatDaemon(pool=0)
        self.addCleanup(self.d.stop)
        self.d.start()
        self.c = self.d.client

    def test_kill9_keeps_paused_sandbox_paused(self):
        sid = self.c.create(ttl_seconds=3)["id"]
        self.c.put_file(sid, "/root/f.txt", b"kept")
        self.c.request("POST", "/v1/sandboxes/%s/pause" % sid, body={})
        self.d.kill9()
        time.sleep(3)  # past the TTL while moatd is down
        self.d.start()
        self.c = self.d.client
        sb = self.c.get(sid)
        self.assertEqual(sb["state"], "paused", sb)
        time.sleep(1.5)  # a reaper pass after the restart must not kill it either
        self.assertEqual(self.c.get(sid)["state"], "paused")
        with self.assertRaises(moatd.HTTPError) as cm:
            self.c.exec(sid, cmd="true")
        self.assertEqual((cm.exception.status, cm.exception.code), (409, "sandbox_paused"))
        r = self.c.request("POST", "/v1/sandboxes/%s/resume" % sid, body={})[1]
        self.assertEqual(r["state"], "running")
        self.assertEqual(self.c.get_file(sid, "/root/f.txt"), b"kept")
        self.c.delete(sid)


if __name__ == "__main__":
    unittest.main()

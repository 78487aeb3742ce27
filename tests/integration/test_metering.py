"""test_metering.py -- metering: CPU-seconds from the cgroup's counter (checked against the counter
read from the host side at kill time), working-set GiB-seconds, GET /v1/usage grouped by sandbox,
org, template and metadata.KEY, the per-sandbox history (GET /v1/sandboxes/{id}/metrics?from=),
per-org Prometheus counters; another org sees none of it; a hibernated sandbox accrues nothing, a
paused one memory only; bad input is 400. moatd samples every 300 ms here (--sample-interval-ms)."""

import os
import subprocess
import sys
import time
import unittest
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
import moatd  # noqa: E402
from moattest import DaemonTest  # noqa: E402
from test_metrics import parse_prometheus  # noqa: E402

INTERVAL_MS = 300
FIELDS = ("cpu_seconds", "memory_gib_seconds", "sandbox_seconds")


def iso_ms(s):
    """Unix ms of an RFC 3339 time of moatd's (UTC, "Z")."""
    import datetime
    return int(datetime.datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp() * 1000 + 0.5)


def slot_cpu_usec(daemon, slot):
    """usage_usec of the sandbox's cgroup, read by the host (the v2 slot-N dir under the daemon's)."""
    for top in daemon.cgroups:
        for root, dirs, _ in os.walk(top):
            if os.path.basename(root) == "slot-%d" % slot and os.path.exists(os.path.join(root, "cpu.stat")):
                with open(os.path.join(root, "cpu.stat")) as f:
                    for line in f:
                        k, v = line.split()
                        if k == "usage_usec":
                            return int(v)
    raise AssertionError("no cgroup slot-%d with cpu.stat under %s" % (slot, daemon.cgroups))


def samples_of(daemon, sid):
    """The sandbox's recorded samples (at_ms, slot, counter, cpu total, alive total), for failure messages."""
    import sqlite3
    db = sqlite3.connect("file:%s?mode=ro" % os.path.join(daemon.data_dir, "moat.db"), uri=True, timeout=30)
    try:
        return db.execute("SELECT at_ms, slot, cpu_counter_ns, cpu_ns, alive_ms FROM meter_samples WHERE sandbox_id = ? "
                          "ORDER BY at_ms", (sid,)).fetchall()
    finally:
        db.close()


def store_slot(daemon, sid):
    return daemon.sandbox_host(sid)["slot"]


class MeteringTest(DaemonTest):
    pool = 1

    @classmethod
    def setUpClass(cls):
        cls.daemon = moatd.MoatDaemon(pool=cls.pool, extra_args=["--sample-interval-ms", str(INTERVAL_MS)])
        try:
            cls.daemon.start()
        except Exception:
            cls.daemon.stop()
            raise
        cls.c = cls.daemon.client

    def setUp(self):
        self.org = "org-" + uuid.uuid4().hex[:8]
        self.a = self.c.with_key(self.daemon.new_org_key(self.org))

    def usage(self, client=None, expect=200, **q):
        return (client or self.a).request("GET", "/v1/usage", query=q or None, expect=expect)[1]

    def usage_of(self, sid, client=None, **q):
        rows = {r["key"]: r for r in self.usage(client, group_by="sandbox", **q)}
        return rows.get(sid)

    def burn(self, client, sid, seconds):
        client.exec(sid, cmd="timeout %d sh -c 'while :; do :; done'; true" % seconds, timeout=seconds + 60)

    def wait_samples(self, n=3):
        time.sleep(n * INTERVAL_MS / 1000 + 0.2)

    def test_cpu_agrees_with_cgroup_at_kill(self):
        sid = self.a.create(cpu=1)["id"]
        self.burn(self.a, sid, 3)
        slot = store_slot(self.daemon, sid)
        host_us = slot_cpu_usec(self.daemon, slot)  # the cgroup's counter just before the kill
        self.a.delete(sid)
        row = self.usage_of(sid)
        self.assertIsNotNone(row, self.usage())
        self.assertGreater(host_us, 1_000_000)  # 3 s of a busy loop, on a shared host
        self.assertAlmostEqual(row["cpu_seconds"], host_us / 1e6, delta=host_us / 1e6 * 0.02)
        self.assertGreater(row["memory_gib_seconds"], 0)
        self.assertGreater(row["sandbox_seconds"], 2.5)  # it lived the 3 s
        # the history: samples with the gauges, their running totals ending at the usage's
        hist = self.a.request("GET", "/v1/sandboxes/%s/metrics" % sid, query={"from": "0"})[1]
        s = hist["samples"]
        self.assertGreaterEqual(len(s), 3, hist)
        self.assertEqual([x["timestamp_ms"] for x in s], sorted(x["timestamp_ms"] for x in s))
        self.assertTrue(any(x["cpu_used_pct"] > 50 for x in s), s)
        for x in s:
            self.assertEqual(x["cpu_count"], 1)
            self.assertEqual(x["memory_limit_bytes"] > 0, True)
            self.assertGreater(x["memory_used_bytes"], 0)
        self.assertAlmostEqual(s[-1]["cpu_seconds"], row["cpu_seconds"], delta=0.01)
        # a range before the sandbox: nothing
        old = self.usage(**{"from": "2020-01-01T00:00:00Z", "to": "2020-01-02T00:00:00Z"})
        self.assertEqual(old, [])

    def test_other_org_sees_nothing(self):
        sid = self.a.create()["id"]
        self.addCleanup(self._delete_quietly, self.a, sid)
        self.burn(self.a, sid, 1)
        self.wait_samples()
        self.assertIsNotNone(self.usage_of(sid))
        b_org = "org-" + uuid.uuid4().hex[:8]
        b = self.c.with_key(self.daemon.new_org_key(b_org))
        self.assertEqual(self.usage(b), [])
        self.assertEqual(self.usage(b, group_by="org"), [])
        self.assertApiError(404, None, b.request, "GET", "/v1/sandboxes/%s/metrics" % sid, query={"from": "0"})
        self.assertApiError(404, None, b.request, "GET", "/v1/sandboxes/%s/metrics" % sid)
        _, text = b.request("GET", "/metrics")
        fams = parse_prometheus(text.decode())
        orgs = {lb.get("org") for _, lb, _ in fams.get("moat_org_cpu_seconds_total", {"samples": []})["samples"]}
        self.assertNotIn(self.org, orgs)
        self.assertNotIn(self.org, text.decode())

    def test_group_by_metadata_template_org(self):
        sids = []
        for team in ("red", "red", "blue"):
            sid = self.a.create(metadata={"team": team})["id"]
            self.addCleanup(self._delete_quietly, self.a, sid)
            sids.append(sid)
        other = self.a.create()["id"]  # no team
        self.addCleanup(self._delete_quietly, self.a, other)
        self.burn(self.a, sids[0], 1)
        self.burn(self.a, sids[2], 1)
        for sid in sids + [other]:
            self.a.delete(sid)
        to = str(int(time.time() * 1000) + 1)
        by_sb = {r["key"]: r for r in self.usage(group_by="sandbox", to=to)}
        self.assertEqual(set(by_sb), set(sids + [other]))
        by_team = {r["key"]: r for r in self.usage(group_by="metadata.team", to=to)}
        self.assertEqual(set(by_team), {"red", "blue", None})
        for key, members in (("red", sids[:2]), ("blue", sids[2:]), (None, [other])):
            for f in ("cpu_seconds", "memory_gib_seconds", "sandbox_seconds"):
                self.assertAlmostEqual(by_team[key][f], sum(by_sb[s][f] for s in members), delta=0.01)
        # the busy ones against the idle one (a shared host may give a 1 s loop far less than 1 s)
        self.assertGreater(by_team["red"]["cpu_seconds"], by_team[None]["cpu_seconds"] + 0.1)
        self.assertGreater(by_team["blue"]["cpu_seconds"], by_team[None]["cpu_seconds"] + 0.1)
        total = sum(r["cpu_seconds"] for r in by_sb.values())
        by_org = self.usage(group_by="org", to=to)
        self.assertEqual([r["key"] for r in by_org], [self.org])
        self.assertAlmostEqual(by_org[0]["cpu_seconds"], total, delta=0.01)
        by_tmpl = self.usage(group_by="template", to=to)
        self.assertEqual([r["key"] for r in by_tmpl], ["base"])
        self.assertAlmostEqual(by_tmpl[0]["cpu_seconds"], total, delta=0.01)
        # the org's Prometheus counter covers all of it
        _, text = self.a.request("GET", "/metrics")
        fams = parse_prometheus(text.decode())
        cpu = {lb["org"]: v for _, lb, v in fams["moat_org_cpu_seconds_total"]["samples"]}
        mem = {lb["org"]: v for _, lb, v in fams["moat_org_memory_gib_seconds_total"]["samples"]}
        self.assertAlmostEqual(cpu[self.org], total, delta=0.01)
        self.assertGreater(mem[self.org], 0)

    def test_hibernated_accrues_nothing_paused_memory_only(self):
        ck = self.c.healthz().get("checkpoints") or {}
        sid = self.a.create()["id"]
        self.addCleanup(self._delete_quietly, self.a, sid)
        self.burn(self.a, sid, 1)
        self.a.request("POST", "/v1/sandboxes/%s/pause" % sid, body={})
        p0 = self.usage_of(sid)
        self.wait_samples(5)
        p1 = self.usage_of(sid)
        self.assertAlmostEqual(p1["cpu_seconds"], p0["cpu_seconds"], delta=0.005)
        self.assertGreater(p1["memory_gib_seconds"], p0["memory_gib_seconds"])
        self.assertGreater(p1["sandbox_seconds"], p0["sandbox_seconds"] + 1)
        self.a.request("POST", "/v1/sandboxes/%s/resume" % sid, body={})
        if not ck.get("available"):
            self.skipTest("checkpoints unavailable on this host: %s" % ck.get("criu"))
        self.a.request("POST", "/v1/sandboxes/%s/hibernate" % sid, body={})
        h0 = self.usage_of(sid)
        n0 = len(self.a.request("GET", "/v1/sandboxes/%s/metrics" % sid, query={"from": "0"})[1]["samples"])
        self.wait_samples(6)
        h1 = self.usage_of(sid)
        n1 = len(self.a.request("GET", "/v1/sandboxes/%s/metrics" % sid, query={"from": "0"})[1]["samples"])
        self.assertEqual(h0, h1)
        self.assertEqual(n0, n1)
        # woken, it accrues again, on top of what it had
        self.a.request("POST", "/v1/sandboxes/%s/wake" % sid, body={})
        self.burn(self.a, sid, 1)
        self.wait_samples()
        w = self.usage_of(sid)
        self.assertGreater(w["cpu_seconds"], h1["cpu_seconds"] + 0.1, samples_of(self.daemon, sid))

    def check_series(self, rows, frm, to, bucket_s):
        """Every row's series: aligned to the bucket, in order, within [from, to), empty buckets left
        out, summing to the row's totals. Returns {key: [(start_ms, point)]}."""
        w = bucket_s * 1000
        out = {}
        for r in rows:
            pts = [(iso_ms(p["start"]), p) for p in r["series"]]
            starts = [t for t, _ in pts]
            self.assertEqual(starts, sorted(set(starts)), r)
            for t, p in pts:
                self.assertEqual(t % w, 0, r)
                self.assertGreater(t + w, frm, r)
                self.assertLess(t, to, r)
                self.assertTrue(any(p[f] > 0 for f in FIELDS), r)
            for f in FIELDS:
                self.assertAlmostEqual(sum(p[f] for _, p in pts), r[f], delta=0.002 + 0.0005 * len(pts), msg=(f, r))
            out[r["key"]] = pts
        return out

    def test_series_by_metadata(self):
        runs = {}
        for team in ("a", "b"):
            t0 = int(time.time() * 1000)
            sid = self.a.create(metadata={"team": team})["id"]
            self.addCleanup(self._delete_quietly, self.a, sid)
            self.burn(self.a, sid, 1)
            self.a.delete(sid)
            runs[team] = (sid, t0, int(time.time() * 1000))
            self.wait_samples(2)
        frm = runs["a"][1] - 10 * 60000
        to = int(time.time() * 1000) + 1
        q = {"from": str(frm), "to": str(to), "group_by": "metadata.team"}
        plain = {r["key"]: r for r in self.usage(**q)}
        self.assertTrue(all("series" not in r for r in plain.values()), plain)
        rows = self.usage(bucket="60", **q)
        by_key = {r["key"]: r for r in rows}
        self.assertEqual(set(by_key), {"a", "b"})
        for k in by_key:  # the totals are those without a bucket
            for f in FIELDS:
                self.assertEqual(by_key[k][f], plain[k][f], (k, f))
        series = self.check_series(rows, frm, to, 60)
        for team, (sid, t0, t1) in runs.items():
            pts = series[team]
            self.assertTrue(pts, by_key[team])
            # only the buckets the sandbox ran in (the range starts ten minutes before)
            for t, _ in pts:
                self.assertTrue(t <= t1 and t + 60000 > t0, (team, t, t0, t1, pts))
            self.assertGreater(sum(p["cpu_seconds"] for _, p in pts), 0.1, pts)
        # per sandbox: the same buckets as the sandbox's group
        sb = self.check_series(self.usage(bucket="60", **dict(q, group_by="sandbox")), frm, to, 60)
        for team, (sid, _, _) in runs.items():
            self.assertEqual([t for t, _ in sb[sid]], [t for t, _ in series[team]])
        # a range that starts inside a bucket counts from 'from' only; days start at midnight UTC
        day = self.check_series(self.usage(bucket="86400", group_by="org"), to - 86400000, to, 86400)
        days = {t // 86400000 * 86400000 for run in runs.values() for t in run[1:]}
        self.assertEqual({t for t, _ in day[self.org]}, days)
        mid = runs["b"][1]
        late = self.usage(bucket="3600", **dict(q, **{"from": str(mid)}))
        self.assertEqual([r["key"] for r in late], ["b"], late)
        self.check_series(late, mid, to, 3600)

    def test_bad_input(self):
        for q in ({"group_by": "bogus"}, {"group_by": "metadata."}, {"from": "yesterday"}, {"to": "1e9x"},
                  {"from": "2026-01-02T00:00:00Z", "to": "2026-01-01T00:00:00Z"},
                  {"from": "2024-01-01T00:00:00Z", "to": "2025-02-05T00:00:00Z"}, {"nope": "1"},
                  {"bucket": "59"}, {"bucket": "86401"}, {"bucket": "x"}, {"bucket": "600.5"}, {"bucket": ""},
                  {"bucket": "-60"}):
            self.assertApiError(400, None, self.a.request, "GET", "/v1/usage", query=q)
        # too many buckets: the answer names the arguments
        for q in ({"bucket": "60", "from": "2026-01-01T00:00:00Z", "to": "2026-01-03T00:00:00Z"},
                  {"bucket": "3600", "from": "2025-01-01T00:00:00Z", "to": "2026-01-01T00:00:00Z"}):
            e = self.assertApiError(400, "invalid_request", self.a.request, "GET", "/v1/usage", query=q)
            for name in ("'from'", "'to'", "'bucket'", "2000"):
                self.assertIn(name, e.body["message"])
        # the most there may be: 2,000 minutes; a year in days
        for q in ({"bucket": "60", "from": "2026-01-01T00:00:00Z", "to": "2026-01-02T09:20:00Z"},
                  {"bucket": "86400", "from": "2025-01-01T00:00:00Z", "to": "2026-01-01T00:00:00Z"}):
            self.assertEqual(self.usage(**q), [])
        sid = self.a.create()["id"]
        self.addCleanup(self._delete_quietly, self.a, sid)
        for q in ({"from": "bad"}, {"from": "0", "limit": "0"}, {"from": "5", "to": "1"}, {"from": "0", "x": "1"}):
            self.assertApiError(400, None, self.a.request, "GET", "/v1/sandboxes/%s/metrics" % sid, query=q)
        # without from/to the instantaneous answer is unchanged
        m = self.a.request("GET", "/v1/sandboxes/%s/metrics" % sid)[1]
        self.assertIn("cpu", m)
        self.assertIn("sampled", m)

    def test_totals_survive_crash(self):
        t0 = time.time()
        sid = self.a.create()["id"]
        self.burn(self.a, sid, 2)
        self.wait_samples()
        before = self.usage_of(sid)["cpu_seconds"]
        self.daemon.kill9()  # its sandboxes keep running: the next moatd adopts them
        self.daemon.start()
        type(self).c = self.daemon.client
        self.addCleanup(self._delete_quietly, self.a, sid)
        self.burn(self.a, sid, 1)
        slot = store_slot(self.daemon, sid)
        host_us = slot_cpu_usec(self.daemon, slot)
        self.a.delete(sid)
        row = self.usage_of(sid)
        lived = time.time() - t0
        after = row["cpu_seconds"]
        self.assertGreater(after, before + 0.1, samples_of(self.daemon, sid))
        # the time moatd was down counts: the sandbox was alive (less what was sampled, not written)
        self.assertGreater(row["sandbox_seconds"], lived - 2 * INTERVAL_MS / 1000, samples_of(self.daemon, sid))
        self.assertLessEqual(row["sandbox_seconds"], lived + 0.5)
        # one cgroup all along: the total is its counter
        self.assertAlmostEqual(after, host_us / 1e6, delta=host_us / 1e6 * 0.02)

    def test_python_sdk(self):
        sys.path.insert(0, os.path.join(moatd.REPO, "sdk", "python"))
        import moat
        cl = moat.Client("http://127.0.0.1:%d" % self.daemon.port, self.a.key)
        sb = moat.Sandbox.create(client=cl, metadata={"team": "py"})
        self.addCleanup(self._delete_quietly, self.a, sb.id)
        now = sb.metrics()
        self.assertEqual(now["sandbox_id"], sb.id)
        sb.exec("timeout 1 sh -c 'while :; do :; done'; true")
        self.wait_samples()
        hist = sb.metrics(from_=0)
        self.assertGreaterEqual(len(hist["samples"]), 2, hist)
        self.assertEqual(len(sb.metrics(from_=0, limit=1)["samples"]), 1)
        rows = {r["key"]: r for r in cl.usage(group_by="sandbox")}
        self.assertGreater(rows[sb.id]["cpu_seconds"], 0.1)
        team = {r["key"]: r for r in cl.usage(group_by="metadata.team")}
        self.assertAlmostEqual(team["py"]["cpu_seconds"], rows[sb.id]["cpu_seconds"], delta=0.05)
        frm = int(time.time() * 1000) - 3600000
        per = {r["key"]: r for r in cl.usage(from_=frm, group_by="metadata.team", bucket=300)}
        self.assertIn("py", per)
        self.assertGreaterEqual(len(self.check_series([per["py"]], frm, int(time.time() * 1000) + 1, 300)["py"]), 1)
        with self.assertRaises(ValueError):
            cl.usage(bucket=30)
        with self.assertRaises(moat.InvalidRequestError):
            cl.usage(from_=0, to=86400000 * 30, bucket=60)
        import datetime
        self.assertEqual(cl.usage(from_=datetime.datetime(2020, 1, 1), to=datetime.datetime(2020, 1, 2)), [])
        with self.assertRaises(ValueError):
            cl.usage(group_by="bogus")
        with self.assertRaises(moat.InvalidRequestError):
            cl.usage(from_="yesterday")
        other = moat.Client("http://127.0.0.1:%d" % self.daemon.port,
                            self.daemon.new_org_key("org-" + uuid.uuid4().hex[:8]))
        with self.assertRaises(moat.NotFoundError):
            moat.Sandbox({"id": sb.id, "template": "base", "state": "running"}, other).metrics(from_=0)

    def moat_cli(self, *args, check=0):
        e = dict(os.environ, MOAT_API_URL="http://127.0.0.1:%d" % self.daemon.port, MOAT_API_KEY=self.a.key)
        r = subprocess.run([os.path.join(moatd.BUILD, "moat")] + list(args), env=e, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=60, text=True)
        self.assertEqual(r.returncode, check, "moat %s: %s" % (" ".join(args), r.stderr))
        return r

    def test_cli(self):
        sid = self.a.create(metadata={"team": "cli"})["id"]
        self.addCleanup(self._delete_quietly, self.a, sid)
        self.burn(self.a, sid, 1)
        self.wait_samples()
        import json
        rows = json.loads(self.moat_cli("usage", "--group-by", "metadata.team", "--json").stdout)
        self.assertEqual([r["key"] for r in rows], ["cli"])
        self.assertGreater(rows[0]["cpu_seconds"], 0.1)
        table = self.moat_cli("usage").stdout
        self.assertIn(sid, table)
        self.assertIn("CPU_SECONDS", table)
        self.assertIn("366 days", self.moat_cli("usage", "--from", "0", check=1).stderr)
        self.assertIn("group_by", self.moat_cli("usage", "--group-by", "nope", check=1).stderr)
        per = json.loads(self.moat_cli("usage", "--group-by", "metadata.team", "--bucket", "300", "--json").stdout)
        self.assertEqual([r["key"] for r in per], ["cli"])
        pts = self.check_series(per, 0, int(time.time() * 1000) + 1, 300)["cli"]
        self.assertTrue(pts, per)
        lines = self.moat_cli("usage", "--group-by", "metadata.team", "--bucket", "300").stdout.splitlines()
        self.assertTrue(lines[1].startswith("cli "), lines)
        self.assertEqual([ln.split()[0] for ln in lines[2:]], [p["start"] for _, p in pts])
        self.assertIn("bucket", self.moat_cli("usage", "--bucket", "5", check=1).stderr)
        self.moat_cli("metrics", sid, "--bucket", "60", check=2)
        hist = json.loads(self.moat_cli("metrics", sid, "--from", "0", "--json").stdout)
        self.assertGreaterEqual(len(hist["samples"]), 2)
        lines = self.moat_cli("metrics", sid, "--from", "0").stdout.splitlines()
        self.assertTrue(lines[0].startswith("TIMESTAMP"), lines)
        self.assertGreaterEqual(len(lines) - 1, len(hist["samples"]))  # the sampler goes on meanwhile
        self.assertIn(hist["samples"][0]["timestamp"], lines[1])
        now = json.loads(self.moat_cli("metrics", sid).stdout)
        self.assertEqual(now["sandbox_id"], sid)
        self.moat_cli("metrics", check=2)
        self.moat_cli("help", "usage")
        self.moat_cli("help", "metrics")


if __name__ == "__main__":
    unittest.main()

"""test_metrics.py -- GET /v1/sandboxes/{id}/metrics, GET /metrics (Prometheus text) and E2B's getMetrics.

A busy loop raises the sandbox's CPU percent, a shell holding 64 MiB raises its memory, sleeping
processes raise its pid count; a paused sandbox still reports; another org's sandbox is 404; the
Prometheus text parses line by line with a strict parser and carries the sandbox's series. The E2B
scenario runs tests/node/e2b_metrics.mjs with the unmodified npm `e2b` SDK.
"""

import os
import re
import shutil
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
import moatd  # noqa: E402
from moattest import DaemonTest  # noqa: E402

NODE_DIR = os.path.join(moatd.REPO, "tests", "node")
NODE = shutil.which("node")
HAVE_SDK = os.path.isdir(os.path.join(NODE_DIR, "node_modules", "e2b"))
SCENARIO_TIMEOUT_S = 120
MIB = 1 << 20

# Text exposition format 0.0.4: comments, then "name{labels} value" samples (no timestamps here).
NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"'
SAMPLE_RE = re.compile(r"^(%s)(\{(?:%s(?:,%s)*)?\})? (\S+)$" % (NAME, LABEL, LABEL))
HELP_RE = re.compile(r"^# HELP (%s) (.*)$" % NAME)
TYPE_RE = re.compile(r"^# TYPE (%s) (counter|gauge|histogram|summary|untyped)$" % NAME)
LABEL_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"')


def parse_prometheus(text):
    """Returns {family: {"type": T, "samples": [(name, {label: value}, float)]}}; raises ValueError
    on any line that is not valid text format 0.0.4, a sample before its TYPE, or a repeated TYPE."""
    if not text.endswith("\n"):
        raise ValueError("text does not end with a newline")
    fams, current = {}, None
    for n, line in enumerate(text[:-1].split("\n"), 1):
        m = TYPE_RE.match(line)
        if m:
            if m.group(1) in fams:
                raise ValueError("line %d: TYPE of %s repeated" % (n, m.group(1)))
            current = m.group(1)
            fams[current] = {"type": m.group(2), "samples": []}
            continue
        if HELP_RE.match(line):
            continue
        m = SAMPLE_RE.match(line)
        if not m:
            raise ValueError("line %d is not a sample: %r" % (n, line))
        name = m.group(1)
        fam = current
        ok = fam is not None and (name == fam or (fams[fam]["type"] == "histogram" and
                                                  name in (fam + "_bucket", fam + "_sum", fam + "_count")))
        if not ok:
            raise ValueError("line %d: sample %s outside its family (%s)" % (n, name, fam))
        v = m.group(3)
        value = float("inf") if v == "+Inf" else float("-inf") if v == "-Inf" else float(v)
        labels = dict(LABEL_RE.findall(m.group(2) or ""))
        fams[fam]["samples"].append((name, labels, value))
    return fams


class MetricsTest(DaemonTest):
    def metrics(self, sid, client=None, expect=200):
        return (client or self.c).request("GET", "/v1/sandboxes/%s/metrics" % sid, expect=expect)[1]

    def bg(self, sid, cmd):
        return self.c.request("POST", "/v1/sandboxes/%s/exec" % sid, body={"cmd": cmd, "background": True},
                              expect=201)[1]

    def test_shape_and_idle(self):
        sb = self.sandbox(cpu=1, memory_mb=256, pids=64, disk_mb=256)
        m = self.metrics(sb["id"])
        self.assertEqual(m["sandbox_id"], sb["id"])
        self.assertEqual(m["state"], "running")
        self.assertTrue(m["sampled"])
        self.assertRegex(m["timestamp"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
        self.assertEqual(m["cpu"]["limit"], 1)
        self.assertGreater(m["cpu"]["usage_ns"], 0)
        self.assertGreaterEqual(m["cpu"]["window_ms"], 90)
        self.assertLess(m["cpu"]["used_pct"], 50, m)
        self.assertEqual(m["memory"]["limit_bytes"], 256 * MIB)
        self.assertGreater(m["memory"]["used_bytes"], 0)
        self.assertEqual(m["pids"]["limit"], 64)
        self.assertGreaterEqual(m["pids"]["current"], 1)
        self.assertEqual(m["oom_kills"], 0)
        self.assertIsNotNone(m["disk"], m)
        self.assertGreater(m["disk"]["total_bytes"], 128 * MIB)
        self.assertLessEqual(m["disk"]["total_bytes"], 300 * MIB)
        self.assertIn("network", m)
        # A file written into the writable layer shows in disk use.
        before = m["disk"]["used_bytes"]
        self.c.sh(sb["id"], "dd if=/dev/urandom of=/root/blob bs=1M count=32 2>/dev/null && sync")
        after = self.metrics(sb["id"])["disk"]["used_bytes"]
        self.assertGreater(after - before, 24 * MIB, (before, after))
        self.assertApiError(400, "invalid_request", self.c.request, "GET", "/v1/sandboxes/%s/metrics" % sb["id"],
                            query={"x": "1"})
        self.assertApiError(405, None, self.c.request, "POST", "/v1/sandboxes/%s/metrics" % sb["id"], body={})

    def test_busy_loop_raises_cpu(self):
        sb = self.sandbox(cpu=1)
        idle = self.metrics(sb["id"])["cpu"]["used_pct"]
        self.bg(sb["id"], "timeout 30 sh -c 'while :; do :; done'")
        time.sleep(1.0)
        best = 0
        for _ in range(10):
            m = self.metrics(sb["id"])
            best = max(best, m["cpu"]["used_pct"])
            if best >= 60:
                break
            time.sleep(0.3)
        self.assertGreaterEqual(best, 60, "busy loop under cpu=1: %s%% (idle %s%%)" % (best, idle))
        self.assertLessEqual(best, 100)

    def test_memory_and_pids(self):
        sb = self.sandbox(memory_mb=512)
        m0 = self.metrics(sb["id"])
        # A shell variable of 64 MiB, held while the shell sleeps; three sleepers besides.
        self.bg(sb["id"], "x=$(head -c 67108864 /dev/zero | tr '\\0' a); sleep 60")
        for _ in range(3):
            self.bg(sb["id"], "sleep 60")
        deadline = time.time() + 20
        m = m0
        while time.time() < deadline:
            m = self.metrics(sb["id"])
            if m["memory"]["used_bytes"] - m0["memory"]["used_bytes"] >= 60 * MIB:
                break
            time.sleep(0.3)
        self.assertGreaterEqual(m["memory"]["used_bytes"] - m0["memory"]["used_bytes"], 60 * MIB, (m0, m))
        self.assertGreaterEqual(m["pids"]["current"] - m0["pids"]["current"], 4, (m0["pids"], m["pids"]))

    def test_paused_reports(self):
        sb = self.sandbox()
        sid = sb["id"]
        self.c.request("POST", "/v1/sandboxes/%s/pause" % sid, body={})
        try:
            m = self.metrics(sid)
            self.assertEqual(m["state"], "paused")
            self.assertTrue(m["sampled"])
            self.assertGreater(m["memory"]["used_bytes"], 0)
            self.assertGreaterEqual(m["pids"]["current"], 1)
            self.assertLess(m["cpu"]["used_pct"], 5, m)
        finally:
            self.c.request("POST", "/v1/sandboxes/%s/resume" % sid, body={})
        self.assertEqual(self.metrics(sid)["state"], "running")

    def test_hibernated_reports_zero(self):
        h = self.c.healthz()
        ck = h.get("checkpoints") or {}
        if not ck.get("available"):
            self.skipTest("checkpoints unavailable on this host: %s" % ck.get("criu"))
        sb = self.sandbox()
        sid = sb["id"]
        self.c.request("POST", "/v1/sandboxes/%s/hibernate" % sid, body={})
        m = self.metrics(sid)
        self.assertEqual(m["state"], "hibernated")
        self.assertFalse(m["sampled"])
        self.assertEqual((m["memory"]["used_bytes"], m["pids"]["current"], m["cpu"]["window_ms"]), (0, 0, 0), m)
        self.assertGreater(m["memory"]["limit_bytes"], 0)
        # Reading metrics does not wake it.
        self.assertEqual(self.c.get(sid)["state"], "hibernated")
        _, text = self.c.request("GET", "/metrics")
        fams = parse_prometheus(text.decode())
        mem = {lb["sandbox"]: v for _, lb, v in fams["moat_sandbox_memory_bytes"]["samples"]}
        self.assertEqual(mem.get(sid), 0)
        states = {lb["state"]: v for _, lb, v in fams["moat_sandboxes"]["samples"]}
        self.assertGreaterEqual(states["hibernated"], 1)

    def test_other_org_and_missing(self):
        sb = self.sandbox()
        other = self.c.with_key(self.daemon.new_org_key("metrics-other"))
        self.assertApiError(404, "not_found", self.metrics, sb["id"], client=other)
        self.assertApiError(404, "not_found", self.metrics, "sb-00000000000000000")
        self.assertApiError(401, "unauthorized", self.c.request, "GET", "/v1/sandboxes/%s/metrics" % sb["id"],
                            auth=False)
        # Killed: gone.
        self.c.delete(sb["id"])
        self.assertApiError(404, "not_found", self.metrics, sb["id"])
        # /metrics of the other org does not carry this org's sandboxes.
        sb2 = self.sandbox()
        _, text = other.request("GET", "/metrics")
        fams = parse_prometheus(text.decode())
        ids = {lb.get("sandbox") for _, lb, _ in fams["moat_sandbox_memory_bytes"]["samples"]}
        self.assertNotIn(sb2["id"], ids)

    def test_prometheus(self):
        sb = self.sandbox(cpu=0.5, memory_mb=200)
        self.assertApiError(401, "unauthorized", self.c.request, "GET", "/metrics", auth=False)
        self.assertApiError(405, None, self.c.request, "POST", "/metrics", body={})
        conn_status, text = self.c.request("GET", "/metrics")
        self.assertIsInstance(text, bytes)
        fams = parse_prometheus(text.decode())
        for name, typ in [("moat_sandboxes", "gauge"), ("moat_sandboxes_created_total", "counter"),
                          ("moat_sandbox_create_seconds", "histogram"), ("moat_sandbox_cpu_seconds_total", "counter"),
                          ("moat_sandbox_memory_bytes", "gauge"), ("moat_sandbox_memory_limit_bytes", "gauge"),
                          ("moat_sandbox_pids", "gauge"), ("moat_process_resident_memory_bytes", "gauge"),
                          ("moat_process_open_fds", "gauge")]:
            self.assertIn(name, fams)
            self.assertEqual(fams[name]["type"], typ, name)
        states = {lb["state"]: v for _, lb, v in fams["moat_sandboxes"]["samples"]}
        self.assertGreaterEqual(states["running"], 1)
        self.assertGreaterEqual(fams["moat_sandboxes_created_total"]["samples"][0][2], 1)
        mine = {n: v for n, lb, v in (s for f in fams.values() for s in f["samples"]) if lb.get("sandbox") == sb["id"]}
        self.assertEqual(mine["moat_sandbox_memory_limit_bytes"], 200 * MIB)
        self.assertEqual(mine["moat_sandbox_cpu_limit"], 0.5)
        self.assertGreater(mine["moat_sandbox_memory_bytes"], 0)
        self.assertGreater(mine["moat_sandbox_cpu_seconds_total"], 0)
        # Histogram: cumulative buckets ending in +Inf = _count.
        h = fams["moat_sandbox_create_seconds"]["samples"]
        buckets = [(lb["le"], v) for n, lb, v in h if n.endswith("_bucket")]
        self.assertEqual(buckets[-1][0], "+Inf")
        vals = [v for _, v in buckets]
        self.assertEqual(vals, sorted(vals))
        count = [v for n, _, v in h if n.endswith("_count")][0]
        self.assertEqual(vals[-1], count)
        self.assertGreaterEqual(count, 1)
        rss = fams["moat_process_resident_memory_bytes"]["samples"][0][2]
        self.assertGreater(rss, MIB)
        self.assertGreater(fams["moat_process_open_fds"]["samples"][0][2], 3)

    def test_parser_is_strict(self):
        for bad in ["foo 1", "# TYPE a gauge\nb 1\n", "# TYPE a gauge\na{x=\"1} 1\n", "# TYPE a gauge\na 1 2 3\n",
                    "# TYPE a gauge\n# TYPE a gauge\n"]:
            with self.assertRaises(ValueError):
                parse_prometheus(bad)

    @unittest.skipUnless(NODE and HAVE_SDK, "node or the e2b npm package (tests/node/node_modules) is missing")
    def test_e2b_get_metrics(self):
        url = "http://127.0.0.1:%d" % self.daemon.port
        e = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
        e.update({"E2B_API_URL": url, "E2B_SANDBOX_URL": url, "E2B_API_KEY": "e2b_" + self.c.key[5:], "MOAT_URL": url})
        try:
            p = subprocess.run([NODE, os.path.join(NODE_DIR, "e2b_metrics.mjs"), "get_metrics"], cwd=NODE_DIR, env=e,
                               capture_output=True, text=True, timeout=SCENARIO_TIMEOUT_S)
        except subprocess.TimeoutExpired as x:
            self.fail("e2b_metrics.mjs hung\nstdout: %s\nstderr: %s\nmoatd log:\n%s" % (
                x.stdout, x.stderr, self.daemon.log_tail(40)))
        if p.returncode != 0 or "ok get_metrics" not in p.stdout:
            self.fail("e2b_metrics.mjs exited %d\nstdout: %s\nstderr: %s\nmoatd log:\n%s" % (
                p.returncode, p.stdout, p.stderr[-6000:], self.daemon.log_tail(40)))


if __name__ == "__main__":
    unittest.main()

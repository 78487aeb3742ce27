"""test_oom.py -- an OOM kill is reported: exec's oom_killed, the exec/stream exit event's oom_killed,
an `oom` event on GET .../events naming the command, and the sandbox's oom_kills in its metrics and in
/metrics. A command that exits 137 or is SIGKILLed by someone else is not an OOM kill, also right
after a real one.

A sandbox of memory_mb=512 runs python3 writing 700 MB: the kernel OOM-kills it inside the
sandbox's memory cgroup; the sandbox itself (its moat-guest) runs on.
"""

import os
import re
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tests", "lib"))
sys.path.insert(0, os.path.join(REPO, "sdk", "python"))
import moat  # noqa: E402
import sse  # noqa: E402
from moattest import DaemonTest  # noqa: E402

# Writes every page (b"x" * n), so the memory is charged at once; 700 MB > memory_mb 512.
HOG = ["python3", "-c", "b = b'x' * (700 << 20); print(len(b))"]


class OomTest(DaemonTest):
    pool = 0

    def metrics(self, sid):
        return self.c.request("GET", "/v1/sandboxes/%s/metrics" % sid)[1]

    def events(self, sid):
        """The events stream, subscribed (moatd subscribes before it answers the headers)."""
        s = sse.open(self.c, "GET", "/v1/sandboxes/%s/events" % sid)
        self.addCleanup(s.close)
        return s

    def next_oom(self, s, timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                ev = s.next(timeout=max(0.1, deadline - time.time()))
            except TimeoutError:
                break
            if ev is None:
                break
            if ev.name == "oom":
                return ev.data
        return None

    def test_exec_oom_killed(self):
        sid = self.sandbox(memory_mb=512, cpu=1)["id"]
        s = self.events(sid)
        r = self.c.exec(sid, argv=HOG, timeout=120)
        self.assertEqual((r["signal"], r["exit_code"]), (9, -1), r)
        self.assertIs(r["oom_killed"], True, r)
        ev = self.next_oom(s)
        self.assertIsNotNone(ev, "no oom event")
        self.assertEqual(ev["pid"], r["pid"], ev)
        self.assertEqual(ev["argv"], HOG, ev)
        self.assertEqual(ev["cmd"], " ".join(HOG), ev)
        self.assertIsNone(ev["tag"], ev)
        self.assertGreaterEqual(ev["kills"], 1, ev)
        self.assertRegex(ev["at"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
        m = self.metrics(sid)
        self.assertGreaterEqual(m["oom_kills"], 1, m)
        text = self.c.request("GET", "/metrics")[1]
        text = text.decode() if isinstance(text, bytes) else text
        got = re.findall(r'^moat_sandbox_oom_kills_total\{[^}]*sandbox="%s"[^}]*\} (\S+)$' % sid, text, re.M)
        self.assertEqual(len(got), 1, text[-2000:])
        self.assertGreaterEqual(float(got[0]), 1)
        # the sandbox runs on
        self.assertEqual(self.c.sh(sid, "echo alive").strip(), "alive")
        # exits that look like an OOM kill but are not, after the count rose: no oom_killed, no event
        for cmd in ("exit 137", "kill -9 $$", "sleep 5 & kill -9 $!; wait $!"):
            r = self.c.exec(sid, cmd=cmd)
            self.assertIs(r["oom_killed"], False, (cmd, r))
        self.assertEqual(self.c.exec(sid, cmd="true")["oom_killed"], False)
        self.assertIsNone(self.next_oom(s, timeout=2.5), "an oom event without an OOM kill")

    def test_python_sdk(self):
        sb = self.sandbox(memory_mb=512, cpu=1)
        client = moat.Client("http://127.0.0.1:%d" % self.daemon.port, self.c.key)
        s = moat.Sandbox(sb, client)
        self.assertIs(s.exec(HOG).oom_killed, True)
        self.assertIs(s.exec("exit 137").oom_killed, False)

    def test_shell_child_oom_killed(self):
        """A shell whose child the kernel killed exits 137: that is reported as the OOM kill it is."""
        sid = self.sandbox(memory_mb=512, cpu=1)["id"]
        r = self.c.exec(sid, cmd="python3 -c \"b = b'x' * (700 << 20)\"; exit $?", timeout=120)
        self.assertEqual((r["signal"], r["exit_code"]), (0, 137), r)
        self.assertIs(r["oom_killed"], True, r)

    def test_stream_oom_killed(self):
        sid = self.sandbox(memory_mb=512, cpu=1)["id"]
        s = self.events(sid)
        st = sse.open(self.c, "POST", "/v1/sandboxes/%s/exec/stream" % sid, body={"argv": HOG, "tag": "hog"},
                      timeout=120)
        self.addCleanup(st.close)
        evs = st.all(timeout=120)
        start = [e for e in evs if e.name == "start"]
        end = [e for e in evs if e.name == "exit"]
        self.assertEqual(len(end), 1, evs)
        self.assertEqual(end[0].data["signal"], 9, end)
        self.assertIs(end[0].data["oom_killed"], True, end)
        ev = self.next_oom(s)
        self.assertIsNotNone(ev, "no oom event")
        self.assertEqual((ev["pid"], ev["tag"]), (start[0].data["pid"], "hog"), ev)
        st2 = sse.open(self.c, "POST", "/v1/sandboxes/%s/exec/stream" % sid, body={"cmd": "exit 137"})
        self.addCleanup(st2.close)
        end = [e for e in st2.all(timeout=60) if e.name == "exit"]
        self.assertEqual((end[0].data["exit_code"], end[0].data["oom_killed"]), (137, False), end)

    def test_background_oom_event(self):
        """A background process's OOM kill has no exec to claim it: the event comes without a pid."""
        sid = self.sandbox(memory_mb=512, cpu=1)["id"]
        s = self.events(sid)
        self.c.request("POST", "/v1/sandboxes/%s/exec" % sid, body={"argv": HOG, "background": True},
                       expect=201)
        ev = self.next_oom(s, timeout=60)
        self.assertIsNotNone(ev, "no oom event")
        self.assertEqual((ev["pid"], ev["cmd"]), (None, None), ev)
        self.assertGreaterEqual(ev["oom_kills"], 1, ev)

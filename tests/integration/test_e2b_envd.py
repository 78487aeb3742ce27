"""test_e2b_envd.py -- E2B's in-sandbox daemon protocol (envd, port 49983) against a real moatd.

The unmodified npm `e2b` SDK (tests/node/e2b_envd.mjs) runs commands (foreground, callbacks,
background + wait, stdin, kill, timeouts, CommandExitError), files (write/read/list/exists/
makeDir/rename/remove/getInfo, streamed uploads), watchDir and bad input, with the two environment
variables an E2B user sets to switch to moat. Raw HTTP checks cover the Connect wire format itself
(envelopes, end-of-stream errors, error codes and statuses) and the polling watchers the JS SDK
does not use. Every scenario runs under a timeout, so a hang is a failure.
"""

import base64
import gzip
import json
import os
import shutil
import struct
import subprocess
import sys
import threading
import time
import unittest
import urllib.error
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
import moatd  # noqa: E402
from moattest import DaemonTest  # noqa: E402

NODE_DIR = os.path.join(moatd.REPO, "tests", "node")
NODE = shutil.which("node")
HAVE_SDK = os.path.isdir(os.path.join(NODE_DIR, "node_modules", "e2b"))
SCENARIO_TIMEOUT_S = 180


# moatd closes connections idle this long (--idle-timeout; default 60 s): long_silence stays silent
# past it, so the shorter it is here, the sooner that test ends.
IDLE_TIMEOUT_S = 10


class EnvdTest(DaemonTest):
    daemon_args = ("--idle-timeout", str(IDLE_TIMEOUT_S))

    def scenario(self, name):
        if not (NODE and HAVE_SDK):
            self.skipTest("node or the e2b npm package (tests/node/node_modules) is missing; scripts/deps.sh installs it")
        url = "http://127.0.0.1:%d" % self.daemon.port
        e = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
        e.update({"E2B_API_URL": url, "E2B_SANDBOX_URL": url, "E2B_API_KEY": "e2b_" + self.c.key[5:],
                  "MOAT_SILENCE_S": str(IDLE_TIMEOUT_S * 2 + 5)})
        try:
            p = subprocess.run([NODE, os.path.join(NODE_DIR, "e2b_envd.mjs"), name], cwd=NODE_DIR, env=e,
                               capture_output=True, text=True, timeout=SCENARIO_TIMEOUT_S)
        except subprocess.TimeoutExpired as x:
            self.fail("e2b_envd.mjs %s hung for %d s\nstdout: %s\nstderr: %s\nmoatd log:\n%s" % (
                name, SCENARIO_TIMEOUT_S, x.stdout, x.stderr, self.daemon.log_tail(40)))
        if p.returncode != 0 or ("ok " + name) not in p.stdout:
            self.fail("e2b_envd.mjs %s exited %d\nstdout: %s\nstderr: %s\nmoatd log:\n%s" % (
                name, p.returncode, p.stdout, p.stderr[-6000:], self.daemon.log_tail(40)))

    # ---- the SDK ----

    def test_run_foreground(self):
        self.scenario("run_foreground")

    def test_exit_error(self):
        self.scenario("exit_error")

    def test_envs_cwd(self):
        self.scenario("envs_cwd")

    def test_background(self):
        self.scenario("background")

    def test_stdin(self):
        self.scenario("stdin")

    def test_kill(self):
        self.scenario("kill")

    def test_timeout(self):
        self.scenario("timeout")

    def test_files(self):
        self.scenario("files")

    def test_watch(self):
        self.scenario("watch")

    def test_bad_input(self):
        self.scenario("bad_input")

    def test_reconnect(self):
        self.scenario("reconnect")

    def test_sandbox_killed(self):
        self.scenario("sandbox_killed")

    def test_concurrent(self):
        self.scenario("concurrent")

    def test_pty(self):
        self.scenario("pty")

    def test_long_silence(self):
        # Silent for twice moatd's connection timeout, and then some.
        self.scenario("long_silence")

    # ---- raw wire checks ----

    def envd(self, path, body=b"", ctype="application/json", headers=None, sid=None, method="POST", token=True):
        """One call to the sandbox's envd through moatd. Returns (status, headers, body bytes)."""
        h = {"E2b-Sandbox-Id": sid or self.sid, "E2b-Sandbox-Port": "49983"}
        if token:
            h["X-Access-Token"] = self.token
        if ctype:
            h["Content-Type"] = ctype
        h.update(headers or {})
        req = urllib.request.Request("http://127.0.0.1:%d%s" % (self.daemon.port, path),
                                     data=body if method != "GET" else None, headers=h, method=method)
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, r.headers, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.headers, e.read()

    def rpc(self, method, msg, **kw):
        st, _, body = self.envd("/" + method, json.dumps(msg).encode(), **kw)
        return st, json.loads(body) if body else None

    def stream(self, method, msg, headers=None):
        """A server-streaming call: returns the list of (flags, message) envelopes."""
        data = json.dumps(msg).encode()
        st, h, body = self.envd("/" + method, struct.pack(">BI", 0, len(data)) + data,
                                ctype="application/connect+json", headers=headers)
        self.assertEqual(st, 200, body)
        self.assertEqual(h["Content-Type"], "application/connect+json")
        out, i = [], 0
        while i < len(body):
            flags, n = struct.unpack(">BI", body[i:i + 5])
            out.append((flags, json.loads(body[i + 5:i + 5 + n])))
            i += 5 + n
        self.assertEqual(out[-1][0], 2, out)
        return out

    def setUp(self):
        if not hasattr(self, "token"):
            # A sandbox made through E2B's control plane, for its envd access token.
            st, body = self.control("POST", "/v2/sandboxes", {"templateID": "base", "timeout": 600})
            self.assertEqual(st, 201, body)
            type(self).sid, type(self).token = body["sandboxID"], body["envdAccessToken"]

    def control(self, method, path, body=None):
        req = urllib.request.Request("http://127.0.0.1:%d%s" % (self.daemon.port, path),
                                     data=json.dumps(body).encode() if body is not None else None,
                                     headers={"X-API-KEY": self.c.key, "Content-Type": "application/json"},
                                     method=method)
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                data = r.read()
                return r.status, json.loads(data) if data else None
        except urllib.error.HTTPError as e:
            data = e.read()
            return e.code, json.loads(data) if data else None

    def test_wire_unary_and_errors(self):
        st, _, body = self.envd("/health", method="GET", ctype=None)
        self.assertEqual((st, body), (204, b""))
        st, m = self.rpc("filesystem.Filesystem/Stat", {"path": "/etc/hostname"})
        self.assertEqual(st, 200, m)
        e = m["entry"]
        self.assertEqual((e["name"], e["type"], e["path"], e["owner"]), ("hostname", "FILE_TYPE_FILE", "/etc/hostname", "root"))
        self.assertIsInstance(e["size"], str)  # int64 in protobuf JSON
        self.assertRegex(e["modifiedTime"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")
        self.assertEqual(self.rpc("filesystem.Filesystem/Stat", {"path": "/nope"})[0], 404)
        st, m = self.rpc("filesystem.Filesystem/Stat", {"path": "/nope"})
        self.assertEqual(m["code"], "not_found")
        st, m = self.rpc("filesystem.Filesystem/Stat", {})
        self.assertEqual((st, m["code"]), (400, "invalid_argument"))
        st, m = self.rpc("filesystem.Filesystem/Stat", {"path": 3})
        self.assertEqual((st, m["code"]), (400, "invalid_argument"))
        st, _, body = self.envd("/filesystem.Filesystem/Stat", b"{not json")
        self.assertEqual((st, json.loads(body)["code"]), (400, "invalid_argument"))
        st, m = self.rpc("filesystem.Filesystem/NoSuch", {})
        self.assertEqual((st, m["code"]), (404, "unimplemented"))
        st, m = self.rpc("process.Process/StreamInput", {})
        self.assertEqual((st, m["code"]), (501, "unimplemented"))
        st, _, _ = self.envd("/filesystem.Filesystem/Stat", b"{}", ctype="text/plain")
        self.assertEqual(st, 415)
        st, m = self.rpc("filesystem.Filesystem/Stat", {"path": "/"}, token=False)
        self.assertEqual(st, 401)
        st, m = self.rpc("filesystem.Filesystem/MakeDir", {"path": "/tmp/wire-d"})
        self.assertEqual(st, 200, m)
        st, m = self.rpc("filesystem.Filesystem/MakeDir", {"path": "/tmp/wire-d"})
        self.assertEqual((st, m["code"]), (409, "already_exists"))
        st, m = self.rpc("process.Process/SendSignal", {"process": {"pid": 4000000}, "signal": "SIGNAL_SIGKILL"})
        self.assertEqual((st, m["code"]), (404, "not_found"))
        st, m = self.rpc("process.Process/SendSignal", {"process": {"pid": 1}, "signal": "SIGNAL_SIGHUP"})
        self.assertEqual((st, m["code"]), (400, "invalid_argument"))
        # The user comes from Basic auth: root may stat /root's content, "user" may not list it.
        st, m = self.rpc("filesystem.Filesystem/ListDir", {"path": "/root"},
                         headers={"Authorization": "Basic " + base64.b64encode(b"root:").decode()})
        self.assertEqual(st, 200, m)
        st, m = self.rpc("filesystem.Filesystem/ListDir", {"path": "/root"})
        self.assertEqual((st, m["code"]), (403, "permission_denied"))
        ghost = {"Authorization": "Basic " + base64.b64encode(b"ghost:").decode()}
        st, m = self.rpc("filesystem.Filesystem/ListDir", {"path": "/"}, headers=ghost)
        self.assertEqual((st, m["code"]), (401, "unauthenticated"))
        self.assertIn("invalid username", m["message"])
        self.assertEqual(self.rpc("process.Process/List", {}, headers=ghost)[0], 401)

    def test_wire_stream(self):
        env = self.stream("process.Process/Start", {
            "process": {"cmd": "/bin/bash", "args": ["-l", "-c", "printf out; printf err >&2; exit 4"], "envs": {}},
            "stdin": False})
        self.assertIn("start", env[0][1]["event"])
        self.assertGreater(env[0][1]["event"]["start"]["pid"], 0)
        data = {"stdout": b"", "stderr": b""}
        for flags, m in env[1:-2]:
            d = m["event"]["data"]
            for k in d:
                data[k] += base64.b64decode(d[k])
        self.assertEqual(data, {"stdout": b"out", "stderr": b"err"})
        end = env[-2][1]["event"]["end"]
        self.assertEqual((end["exitCode"], end["exited"], end["status"]), (4, True, "exit status 4"))
        self.assertEqual(env[-1][1], {})
        # Killed by a signal: Go's os/exec wording.
        env = self.stream("process.Process/Start", {"process": {"cmd": "/bin/sh", "args": ["-c", "kill -SEGV $$"]}})
        end = env[-2][1]["event"]["end"]
        self.assertEqual((end["exitCode"], end.get("exited", False), end["status"], end["error"]),
                         (-1, False, "signal: segmentation fault", "signal: segmentation fault"))
        # Errors in a stream: HTTP 200 and an end-of-stream envelope with the error.
        env = self.stream("process.Process/Start", {"process": {"cmd": "/bin/true", "cwd": "/no/such"}})
        self.assertEqual(len(env), 1)
        self.assertEqual(env[0][1]["error"]["code"], "invalid_argument")
        env = self.stream("process.Process/Connect", {"process": {"pid": 4000000}})
        self.assertEqual(env[0][1]["error"]["code"], "not_found")
        env = self.stream("filesystem.Filesystem/WatchDir", {"path": "/no/such/dir"})
        self.assertEqual(env[0][1]["error"]["code"], "not_found")
        # Connect-Timeout-Ms ends the stream with deadline_exceeded and kills the command.
        t0 = time.time()
        env = self.stream("process.Process/Start", {"process": {"cmd": "/bin/sleep", "args": ["30"]}},
                          headers={"Connect-Timeout-Ms": "800"})
        self.assertLess(time.time() - t0, 5)
        self.assertEqual(env[-1][1]["error"]["code"], "deadline_exceeded")
        # Keepalive messages after Keepalive-Ping-Interval seconds of silence.
        env = self.stream("process.Process/Start", {"process": {"cmd": "/bin/sleep", "args": ["2.5"]}},
                          headers={"Keepalive-Ping-Interval": "1"})
        kinds = [list(m["event"])[0] for f, m in env[:-1]]
        self.assertEqual(kinds[0], "start")
        self.assertEqual(kinds[-1], "end")
        self.assertGreaterEqual(kinds.count("keepalive"), 2, kinds)
        self.assertEqual(env[-1][1], {})
        # A body that is not one envelope.
        st, _, body = self.envd("/process.Process/Start", b"{}", ctype="application/connect+json")
        self.assertEqual(st, 200)
        self.assertIn(b"invalid_argument", body)

    def test_wire_stdin_and_replay(self):
        # StartRequest without "stdin" keeps stdin open (envd's default for older clients); input by tag.
        out = {}
        t = threading.Thread(target=lambda: out.update(env=self.stream(
            "process.Process/Start", {"process": {"cmd": "/bin/cat"}, "tag": "catty"})))
        t.start()
        for _ in range(100):
            st, m = self.rpc("process.Process/List", {})
            if any(p.get("tag") == "catty" for p in m.get("processes", [])):
                break
            time.sleep(0.05)
        sel = {"process": {"tag": "catty"}}
        st, m = self.rpc("process.Process/SendInput", dict(sel, input={"stdin": base64.b64encode(b"hi\n").decode()}))
        self.assertEqual(st, 200, m)
        self.assertEqual(self.rpc("process.Process/CloseStdin", sel)[0], 200)
        t.join(30)
        self.assertFalse(t.is_alive())
        data = b"".join(base64.b64decode(m["event"]["data"]["stdout"]) for f, m in out["env"][1:-2])
        self.assertEqual(data, b"hi\n")
        # The exited process is gone for input, as in envd.
        pid = out["env"][0][1]["event"]["start"]["pid"]
        st, m = self.rpc("process.Process/SendInput", {"process": {"pid": pid}, "input": {"stdin": "eA=="}})
        self.assertEqual((st, m["code"]), (404, "not_found"))
        # stdin: false -> EOF at once; SendInput then is refused while the process runs.
        env = self.stream("process.Process/Start", {"process": {"cmd": "/bin/sh", "args": ["-c", "cat; echo eof"]},
                                                    "stdin": False})
        self.assertEqual(base64.b64decode(env[1][1]["event"]["data"]["stdout"]), b"eof\n")
        # Connect with replay (newer envd) sees output from before it attached; without, only what follows.
        out2 = {}
        t = threading.Thread(target=lambda: out2.update(env=self.stream(
            "process.Process/Start", {"process": {"cmd": "/bin/sh", "args": ["-c", "echo early; sleep 1.5; echo late"]},
                                      "tag": "rep", "stdin": False})))
        t.start()
        time.sleep(0.7)
        got = {}

        def attach(replay):
            env = self.stream("process.Process/Connect", {"process": {"tag": "rep"}, "replay": replay})
            got[replay] = b"".join(base64.b64decode(m["event"]["data"]["stdout"]) for f, m in env
                                   if "data" in m.get("event", {}))
        ts = [threading.Thread(target=attach, args=(r,)) for r in (True, False)]
        for x in ts:
            x.start()
        for x in ts + [t]:
            x.join(30)
        self.assertEqual(got[True], b"early\nlate\n")
        self.assertEqual(got[False], b"late\n")

    def test_wire_watchers(self):
        self.assertEqual(self.rpc("filesystem.Filesystem/MakeDir", {"path": "/tmp/pw"})[0], 200)
        st, m = self.rpc("filesystem.Filesystem/CreateWatcher", {"path": "/tmp/pw", "recursive": True})
        self.assertEqual(st, 200, m)
        wid = m["watcherId"]
        st, m = self.rpc("filesystem.Filesystem/GetWatcherEvents", {"watcherId": wid})
        self.assertEqual((st, m.get("events", [])), (200, []))
        st, _, body = self.envd("/files?path=/tmp/pw/f.txt", b"hi", ctype="application/octet-stream")
        self.assertEqual(st, 200, body)
        self.assertEqual(json.loads(body)[0]["path"], "/tmp/pw/f.txt")
        events = []
        for _ in range(50):
            st, m = self.rpc("filesystem.Filesystem/GetWatcherEvents", {"watcherId": wid})
            self.assertEqual(st, 200, m)
            events += m.get("events", [])
            if any(e["type"] == "EVENT_TYPE_CREATE" for e in events):
                break
            time.sleep(0.1)
        self.assertIn({"name": "f.txt", "type": "EVENT_TYPE_CREATE"}, events)
        # includeEntry: create/write events carry the entry
        st, m = self.rpc("filesystem.Filesystem/CreateWatcher", {"path": "/tmp/pw", "includeEntry": True})
        wid2 = m["watcherId"]
        self.assertEqual(self.envd("/files?path=/tmp/pw/g.txt", b"hello", ctype="application/octet-stream")[0], 200)
        ev2 = []
        for _ in range(50):
            ev2 += self.rpc("filesystem.Filesystem/GetWatcherEvents", {"watcherId": wid2})[1].get("events", [])
            if any(e["name"] == "g.txt" and "entry" in e for e in ev2):
                break
            time.sleep(0.1)
        withe = [e for e in ev2 if e["name"] == "g.txt" and "entry" in e]
        self.assertTrue(withe, ev2)
        self.assertEqual(withe[-1]["entry"]["path"], "/tmp/pw/g.txt")
        self.assertEqual(self.rpc("filesystem.Filesystem/RemoveWatcher", {"watcherId": wid2})[0], 200)
        self.assertEqual(self.rpc("filesystem.Filesystem/RemoveWatcher", {"watcherId": wid})[0], 200)
        st, m = self.rpc("filesystem.Filesystem/GetWatcherEvents", {"watcherId": wid})
        self.assertEqual((st, m["code"]), (404, "not_found"))

    def test_wire_watchers_freed_with_sandbox(self):
        # Watchers of a killed sandbox give their guest connections back at the next watcher call.
        st, body = self.control("POST", "/v2/sandboxes", {"templateID": "base", "timeout": 600})
        self.assertEqual(st, 201, body)
        sid, tok = body["sandboxID"], body["envdAccessToken"]
        fds = lambda: len(os.listdir("/proc/%d/fd" % self.daemon.proc.pid))  # noqa: E731
        for i in range(16):
            st, m = self.rpc("filesystem.Filesystem/CreateWatcher", {"path": "/tmp"}, sid=sid,
                             headers={"X-Access-Token": tok})
            self.assertEqual(st, 200, m)
        held = fds()
        self.assertEqual(self.control("DELETE", "/sandboxes/" + sid)[0], 204)
        time.sleep(0.5)
        st, m = self.rpc("filesystem.Filesystem/GetWatcherEvents", {"watcherId": "0" * 32})
        self.assertEqual((st, m["code"]), (404, "not_found"))
        self.assertLessEqual(fds(), held - 14)

    def test_wire_v1_sandbox_and_host_routing(self):
        # A sandbox made through moat's v1 API is served by envd too (with the API key), and a
        # "49983-ID.DOMAIN" Host routes like the E2b-Sandbox-Id header.
        sb = self.sandbox()
        self.c.put_file(sb["id"], "/tmp/from-v1", b"v1 data")
        st, _, body = self.envd("/files?path=/tmp/from-v1", method="GET", ctype=None, sid=sb["id"], token=False,
                                headers={"X-API-KEY": self.c.key})
        self.assertEqual((st, body), (200, b"v1 data"))
        env = self.stream("process.Process/Start", {"process": {"cmd": "/bin/sleep", "args": ["30"]}, "tag": "slp"},
                          headers={"Connect-Timeout-Ms": "1500"})
        pid = env[0][1]["event"]["start"]["pid"]
        self.assertEqual(env[-1][1]["error"]["code"], "deadline_exceeded")
        h = {"Host": "49983-%s.moat.test" % self.sid, "X-Access-Token": self.token}
        req = urllib.request.Request("http://127.0.0.1:%d/health" % self.daemon.port, headers=h)
        with urllib.request.urlopen(req, timeout=30) as r:
            self.assertEqual(r.status, 204)
        req = urllib.request.Request("http://127.0.0.1:%d/filesystem.Filesystem/Stat" % self.daemon.port,
                                     data=b'{"path": "/etc/hostname"}', method="POST",
                                     headers=dict(h, **{"Content-Type": "application/json"}))
        with urllib.request.urlopen(req, timeout=30) as r:
            self.assertEqual(json.loads(r.read())["entry"]["name"], "hostname")
        # The process started through envd, killed at its timeout, is in v1's process list as exited.
        st, procs = self.c.request("GET", "/v1/sandboxes/%s/processes" % self.sid, expect=200)
        mine = [p for p in procs["processes"] if p["pid"] == pid]
        self.assertEqual(len(mine), 1, procs)
        self.assertFalse(mine[0]["running"])

    def test_wire_files_rest(self):
        # multipart with two files; the second part's filename is its path
        b = "----moatb"
        body = ("--%s\r\nContent-Disposition: form-data; name=\"file\"; filename=\"/tmp/r1\"\r\n"
                "Content-Type: application/octet-stream\r\n\r\none\r\n"
                "--%s\r\nContent-Disposition: form-data; name=\"file\"; filename=\"r2\"\r\n\r\n"
                "two\r\n--%s--\r\n" % (b, b, b)).encode()
        st, _, out = self.envd("/files", body, ctype="multipart/form-data; boundary=" + b)
        self.assertEqual(st, 200, out)
        got = json.loads(out)
        self.assertEqual([(f["name"], f["path"], f["type"]) for f in got],
                         [("r1", "/tmp/r1", "file"), ("r2", "/home/user/r2", "file")])
        st, _, out = self.envd("/files?path=/tmp/r1", method="GET", ctype=None)
        self.assertEqual((st, out), (200, b"one"))
        st, _, out = self.envd("/files?path=/tmp/none", method="GET", ctype=None)
        self.assertEqual(st, 404)
        self.assertEqual(json.loads(out)["code"], 404)
        st, _, out = self.envd("/files?path=/tmp/x", b"--x--", ctype="multipart/form-data")
        self.assertEqual(st, 400, out)
        st, _, out = self.envd("/files?path=/tmp/x", b"--zz\r\nContent-Disposition: form-data; name=\"file\"\r\n\r\nabc",
                               ctype="multipart/form-data; boundary=zz")
        self.assertEqual(st, 400, out)  # no closing boundary
        st, _, out = self.envd("/files?path=/tmp/x&username=root", b"x", ctype="application/octet-stream",
                               headers={"X-Metadata-Foo": "bar"})
        self.assertEqual(st, 400, out)
        # gzip bodies: two members in a row are one file; corrupt or truncated ones are 400
        gz = gzip.compress(b"first ") + gzip.compress(b"second")
        st, _, out = self.envd("/files?path=/tmp/gz", gz, ctype="application/octet-stream",
                               headers={"Content-Encoding": "gzip"})
        self.assertEqual(st, 200, out)
        self.assertEqual(self.envd("/files?path=/tmp/gz", method="GET", ctype=None)[2], b"first second")
        st, _, out = self.envd("/files?path=/tmp/gz2", gzip.compress(b"x" * 100000)[:-12], ctype="application/octet-stream",
                               headers={"Content-Encoding": "gzip"})
        self.assertEqual(st, 400, out)
        st, _, out = self.envd("/files?path=/tmp/gz3", b"not gzip at all", ctype="application/octet-stream",
                               headers={"Content-Encoding": "gzip"})
        self.assertEqual(st, 400, out)
        self.assertEqual(self.envd("/files?path=/tmp/gz2", method="GET", ctype=None)[0], 404)  # nothing left behind
        st, _, out = self.envd("/files?path=/tmp/x", b"x", ctype="application/octet-stream", headers={"Content-Encoding": "br"})
        self.assertEqual(st, 400, out)
        st, _, out = self.envd("/files?path=/tmp/x&username=no-such-user", b"x", ctype="application/octet-stream")
        self.assertEqual(st, 401, out)


if __name__ == "__main__":
    unittest.main()

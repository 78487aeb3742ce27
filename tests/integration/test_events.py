"""test_events.py -- GET /v1/sandboxes/{id}/events (SSE): replay of the recorded transitions after a
create, a pause/resume seen live in order, a kill ending the stream with reason api, a killed
sandbox's stream (its kill, then the end), another org's sandbox 404, bad parameters 400, a client
that goes away freeing its connection, and (moatd with an uplink into a fake internet) a connection
from inside the sandbox arriving as a `connection` event."""

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
import sse  # noqa: E402
from moattest import DaemonTest  # noqa: E402
from nettest import NetDaemonTest, skip_unless_root  # noqa: E402


def events_path(sid):
    return "/v1/sandboxes/%s/events" % sid


class EventsTest(DaemonTest):
    def open(self, sid, client=None, **query):
        s = sse.open(client or self.c, "GET", events_path(sid), query=query or None)
        self.addCleanup(s.close)
        return s

    def post(self, sid, what):
        return self.c.request("POST", "/v1/sandboxes/%s/%s" % (sid, what), body={}, expect=200)[1]

    def states_until(self, s, want, timeout=30):
        """Events up to and including the state event `want` (a list of them: states in order)."""
        out = []
        deadline = time.time() + timeout
        while time.time() < deadline:
            ev = s.next(timeout=max(0.1, deadline - time.time()))
            self.assertIsNotNone(ev, "stream ended before %s: %r" % (want, out))
            out.append(ev)
            if ev.name == "state" and ev.data["state"] == want:
                return out
        self.fail("no %s within %ss: %r" % (want, timeout, out))

    def test_replay_after_create(self):
        sid = self.sandbox()["id"]
        s = self.open(sid, replay="true")
        self.assertEqual(s.headers["Content-Type"], "text/event-stream")
        evs = self.states_until(s, "running")
        states = [e.data["state"] for e in evs if e.name == "state"]
        self.assertEqual(states, ["creating", "running"], evs)
        first = evs[0].data
        self.assertEqual((first["reason"], first.get("from")), ("api", None), first)
        self.assertRegex(first["at"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
        self.assertLessEqual(evs[0].data["at_ms"], evs[1].data["at_ms"])
        self.assertEqual(evs[1].data["from"], "creating")
        self.assertEqual([e.data["event"] for e in evs], ["created", "running"])
        self.assertNotIn("forked_from", first)
        self.assertIn("subscribed", s.comments)
        # since= in both forms: from the running event's millisecond on (creating is left out unless it
        # happened in the same millisecond)
        at = evs[1].data["at_ms"]
        want = [e.data["state"] for e in evs if e.data["at_ms"] >= at]
        for since in (str(at), evs[1].data["at"]):
            s2 = self.open(sid, since=since)
            got = [s2.next(timeout=10) for _ in want]
            self.assertEqual([(e.name, e.data["state"]) for e in got], [("state", w) for w in want], since)
            s2.close()
        # a time after every event: nothing replayed, the stream stays open
        s3 = self.open(sid, since=str(evs[-1].data["at_ms"] + 1))
        self.assertRaises(TimeoutError, s3.next, 1)

    def test_pause_resume_live_then_kill_ends(self):
        sid = self.sandbox()["id"]
        s = self.open(sid)  # live only: nothing of the past
        self.post(sid, "pause")
        self.post(sid, "resume")
        evs = self.states_until(s, "running", timeout=20)
        states = [(e.data["from"], e.data["state"]) for e in evs if e.name == "state"]
        self.assertEqual(states, [("running", "paused"), ("paused", "running")], evs)
        self.assertEqual([(e.data["event"], e.data["reason"]) for e in evs if e.name == "state"],
                         [("paused", "api"), ("resumed", "api")])
        self.c.delete(sid)
        rest = s.all(timeout=20)  # the stream ends after the kill
        self.assertEqual([(e.name, e.data["state"], e.data["reason"]) for e in rest], [("state", "killed", "api")])
        # a killed sandbox: its kill, then the end (with replay: the whole history first)
        tail = self.open(sid).all(timeout=20)
        self.assertEqual([e.data["state"] for e in tail], ["killed"])
        hist = self.open(sid, replay="true").all(timeout=20)
        self.assertEqual([e.data["state"] for e in hist], ["creating", "running", "paused", "running", "killed"])

    def test_other_org_and_bad_input(self):
        sid = self.sandbox()["id"]
        other = self.c.with_key(self.daemon.new_org_key("events-other"))
        self.assertApiError(404, None, sse.open, other, "GET", events_path(sid))
        self.assertApiError(404, None, sse.open, self.c, "GET", events_path("sb-0123456789abcdefg"))
        for bad in ("yesterday", "2026-13-01T00:00:00Z", "2026-01-01T00:00:00", "-5", "12abc", ""):
            self.assertApiError(400, "invalid_request", sse.open, self.c, "GET", events_path(sid),
                                query={"since": bad})
        self.assertApiError(400, "invalid_request", sse.open, self.c, "GET", events_path(sid),
                            query={"replay": "maybe"})
        self.assertApiError(400, "invalid_request", sse.open, self.c, "GET", events_path(sid),
                            query={"nope": "1"})
        self.assertApiError(405, None, self.c.request, "POST", events_path(sid), body={})

    def test_time_travel_transitions(self):
        h = self.c.request("GET", "/healthz")[1]
        ck = h.get("checkpoints") or {}
        if not ck.get("available"):
            self.skipTest("no checkpoints on this host: %s" % ck.get("criu", "no checkpoints field in /healthz"))
        sid = self.sandbox()["id"]
        s = self.open(sid)
        self.c.request("POST", "/v1/sandboxes/%s/hibernate" % sid, body={}, expect=200, timeout=300)
        self.c.request("POST", "/v1/sandboxes/%s/wake" % sid, body={}, expect=200, timeout=300)
        snap = self.c.request("POST", "/v1/sandboxes/%s/snapshots" % sid, body={}, expect=201, timeout=300)[1]
        self.addCleanup(self.c.request, "DELETE", "/v1/snapshots/" + snap["id"], expect=(204, 404))
        self.c.request("POST", "/v1/sandboxes/%s/rollback" % sid, body={"snapshot_id": snap["id"]}, expect=200,
                       timeout=300)
        evs = self.states_until(s, "running", timeout=60)
        while [e.data["event"] for e in evs if e.name == "state"][-1] != "rolled_back":
            evs += self.states_until(s, "running", timeout=60)
        seen = [(e.data["event"], e.data["state"]) for e in evs if e.name == "state"]
        self.assertEqual(seen[0], ("hibernated", "hibernated"), seen)
        self.assertEqual(seen[1], ("woken", "running"), seen)
        self.assertEqual(seen[-1], ("rolled_back", "running"), seen)
        kid = self.c.request("POST", "/v1/sandboxes/%s/fork" % sid, body={"count": 1}, expect=201,
                             timeout=300)[1]["sandboxes"][0]["id"]
        self.addCleanup(self._delete_quietly, self.c, kid)
        first = self.open(kid, replay="true").next(timeout=10)
        self.assertEqual((first.data["event"], first.data["reason"], first.data.get("forked_from")),
                         ("created", "fork", sid), first)

    def test_disconnect_frees_everything(self):
        sid = self.sandbox()["id"]
        fds = lambda: len(os.listdir("/proc/%d/fd" % self.daemon.proc.pid))  # noqa: E731
        self.open(sid, replay="true").close()  # warm up (lazy fds)
        time.sleep(1.5)
        base = fds()
        streams = [self.open(sid, replay="true") for _ in range(8)]
        for s in streams:
            self.assertEqual(s.next(timeout=10).data["state"], "creating")
        self.assertGreaterEqual(fds(), base + 8)
        for s in streams:
            s.close()
        deadline = time.time() + 10
        while fds() > base and time.time() < deadline:
            time.sleep(0.2)
        self.assertLessEqual(fds(), base, "moatd kept the fds of streams whose clients went away")
        self.assertAlive(sid)


@skip_unless_root()
class EventsNetTest(NetDaemonTest):
    def test_connection_event(self):
        sid = self.sandbox()["id"]
        s = sse.open(self.c, "GET", events_path(sid))
        self.addCleanup(s.close)
        self.assertTrue(self.connects(sid, "198.51.100.12"))
        deadline = time.time() + 10
        got = None
        while time.time() < deadline and got is None:
            ev = s.next(timeout=max(0.1, deadline - time.time()))
            if ev.name == "connection" and ev.data["dst"] == "198.51.100.12":
                got = ev.data
        self.assertIsNotNone(got, "no connection event")
        self.assertEqual((got["port"], got["proto"], got["verdict"]), (80, "tcp", "allowed"), got)
        self.assertIn("reason", got)
        self.assertRegex(got["at"], r"^\d{4}-\d\d-\d\dT")
        # replay carries the buffered connection too
        r = sse.open(self.c, "GET", events_path(sid), query={"replay": "true"})
        self.addCleanup(r.close)
        names = []
        deadline = time.time() + 10
        while time.time() < deadline:
            ev = r.next(timeout=max(0.1, deadline - time.time()))
            names.append(ev.name)
            if ev.name == "connection" and ev.data["dst"] == "198.51.100.12":
                break
        self.assertEqual(names[:2], ["state", "state"], names)
        self.assertEqual(names[-1], "connection", names)

    def test_connection_after_wake(self):
        """A wake gives the sandbox a fresh network slot whose log starts over: the stream follows it."""
        ck = self.c.request("GET", "/healthz")[1].get("checkpoints") or {}
        if not ck.get("available"):
            self.skipTest("no checkpoints on this host: %s" % ck.get("criu", "no checkpoints field in /healthz"))
        sid = self.sandbox()["id"]
        s = sse.open(self.c, "GET", events_path(sid))
        self.addCleanup(s.close)
        self.assertTrue(self.connects(sid, "198.51.100.12"))
        self.c.request("POST", "/v1/sandboxes/%s/hibernate" % sid, body={}, expect=200, timeout=300)
        self.c.request("POST", "/v1/sandboxes/%s/wake" % sid, body={}, expect=200, timeout=300)
        self.assertTrue(self.connects(sid, "198.51.100.14"))
        seen = []
        deadline = time.time() + 15
        while time.time() < deadline:
            ev = s.next(timeout=max(0.1, deadline - time.time()))
            seen.append((ev.name, ev.data.get("event") if ev.name == "state" else ev.data.get("dst")))
            if seen[-1] == ("connection", "198.51.100.14"):
                break
        self.assertEqual(seen[-1], ("connection", "198.51.100.14"), seen)
        i = seen.index(("state", "woken"))
        self.assertIn(("connection", "198.51.100.12"), seen[:i], seen)
        self.assertNotIn(("dropped", None), seen, seen)

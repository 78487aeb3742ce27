"""test_database_events.py -- what GET /v1/databases/{id}/events and GET /metrics say about databases.

The events stream starts with the database's state, then carries each connection opened and closed
(with the count), the idle hibernation, the wake a connection caused (with its time), a branch, and
ends with "deleted". /metrics carries the databases by state, each of the caller's databases' open
connections (never another org's), and the proxy's connection and wake counters with the wake
histogram; they move as the events say. Another org's key gets 404 for the stream."""

import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
import sse  # noqa: E402
from moattest import DaemonTest  # noqa: E402
from test_databases import CREATE_TIMEOUT, DatabaseMixin, dbname  # noqa: E402
from test_metrics import parse_prometheus  # noqa: E402


def samples(fams, name, **labels):
    """The values of the samples called name (a family's, or a histogram's _bucket/_count) with labels."""
    family = name if name in fams else name.rsplit("_", 1)[0]
    return [v for (n, lab, v) in fams[family]["samples"]
            if n == name and all(lab.get(k) == x for k, x in labels.items())]


class DatabaseEventsTest(DatabaseMixin, DaemonTest):
    pool = 0

    def metrics(self, client=None):
        _, text = (client or self.c).request("GET", "/metrics")
        return parse_prometheus(text.decode())

    def next_of(self, stream, name, timeout=120):
        """The next event named name (others before it are returned too, as a list)."""
        seen = []
        deadline = time.time() + timeout
        while True:
            ev = stream.next(timeout=max(1, deadline - time.time()))
            self.assertIsNotNone(ev, "stream ended before %s; saw %r" % (name, seen))
            seen.append(ev)
            if ev.name == name:
                return ev, seen

    def test_events_and_metrics(self):
        d = self.database(idle_seconds=2)
        path = "/v1/databases/%s/events" % d["id"]
        other = self.daemon.client.with_key(self.daemon.new_org_key("other-" + dbname()))
        self.assertApiError(404, "not_found", sse.open, other, "GET", path)
        self.assertApiError(404, "not_found", sse.open, self.c, "GET", "/v1/databases/db-nosuchdatabase00/events")
        m0 = self.metrics()
        s = sse.open(self.c, "GET", path)
        self.addCleanup(s.close)
        first = s.next(timeout=30)
        self.assertEqual((first.name, first.data["state"], first.data["connections"]), ("state", "running", 0))

        # a connection held open: counted in the gauge (this org only) and in the events
        p = subprocess.Popen(["psql", "-X", d["connection"]["url"], "-v", "ON_ERROR_STOP=1"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
        try:
            p.stdin.write("SELECT 'up';\n")
            p.stdin.flush()
            self.assertIn("up", p.stdout.readline() + p.stdout.readline() + p.stdout.readline())
            ev, _ = self.next_of(s, "connection")
            self.assertEqual((ev.data["opened"], ev.data["connections"]), (True, 1))
            m = self.metrics()
            self.assertEqual(samples(m, "moat_database_connections", database=d["id"]), [1.0])
            self.assertEqual(samples(self.metrics(other), "moat_database_connections", database=d["id"]), [])
            self.assertGreaterEqual(samples(m, "moat_databases", state="running")[0], 1)
            self.assertEqual(samples(m, "moat_database_connections_total")[0],
                             samples(m0, "moat_database_connections_total")[0] + 1)
        finally:
            p.stdin.close()
            p.wait(60)
        ev, _ = self.next_of(s, "connection")
        self.assertEqual((ev.data["opened"], ev.data["connections"]), (False, 0))

        # idle: hibernated; the next connection wakes it, and says how long that took
        self.next_of(s, "hibernated", timeout=120)
        self.assertGreaterEqual(samples(self.metrics(), "moat_databases", state="hibernated")[0], 1)
        wakes0 = samples(self.metrics(), "moat_database_wakes_total")[0]
        self.host_psql(d, "SELECT 1")
        ev, _ = self.next_of(s, "woken")
        self.assertGreater(ev.data["wake_ms"], 0)
        self.assertLess(ev.data["wake_ms"], 60000)
        m = self.metrics()
        self.assertEqual(samples(m, "moat_database_wakes_total")[0], wakes0 + 1)
        self.assertEqual(samples(m, "moat_database_wake_seconds_count")[0], wakes0 + 1)
        self.assertEqual(samples(m, "moat_database_wake_seconds_bucket", le="+Inf")[0], wakes0 + 1)

        # a branch, then the delete ends the stream
        _, b = self.c.request("POST", "/v1/databases/%s/branch" % d["id"], body={"name": dbname()}, expect=201,
                              timeout=CREATE_TIMEOUT)
        self.addCleanup(self._delete_db_quietly, False, b["id"])
        ev, _ = self.next_of(s, "branched")
        self.assertEqual(ev.data["branch_id"], b["id"])
        self.c.request("DELETE", "/v1/databases/" + d["id"], expect=204, timeout=120)
        ev, _ = self.next_of(s, "deleted")
        self.assertEqual(ev.data["database_id"], d["id"])
        self.assertIsNone(s.next(timeout=30))

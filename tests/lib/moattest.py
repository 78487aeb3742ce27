"""moattest.py -- unittest base classes for tests that drive a real moatd.

DaemonTest starts one moatd per test class (setUpClass) and stops it in tearDownClass, deleting
every sandbox first; sandbox() creates one and registers its deletion with addCleanup, so that a
failing test leaves nothing behind either.
"""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import moatd  # noqa: E402
import probe  # noqa: E402
from moatd import HTTPError  # noqa: E402,F401


class DaemonTest(unittest.TestCase):
    pool = 2
    daemon_args = ()  # extra moatd flags for the class's daemon
    daemon = None
    c = None

    @classmethod
    def setUpClass(cls):
        cls.daemon = moatd.MoatDaemon(pool=cls.pool, extra_args=cls.daemon_args)
        try:
            cls.daemon.start()
        except Exception:
            cls.daemon.stop()
            raise
        cls.c = cls.daemon.client

    @classmethod
    def tearDownClass(cls):
        if cls.daemon is not None:
            cls.daemon.stop()

    def sandbox(self, client=None, **spec):
        """Creates a sandbox (201 asserted) that is deleted when the test ends."""
        client = client or self.c
        sb = client.create(**spec)
        self.assertEqual(sb["state"], "running", sb)
        self.addCleanup(self._delete_quietly, client, sb["id"])
        return sb

    @staticmethod
    def _delete_quietly(client, sid):
        try:
            client.request("DELETE", "/v1/sandboxes/" + sid, expect=(204, 404), timeout=120)
        except Exception:
            pass

    def with_probe(self, **spec):
        sb = self.sandbox(**spec)
        probe.install(self.c, sb["id"])
        return sb["id"]

    def probe(self, sid, *args, **kw):
        return probe.run(self.c, sid, *args, **kw)

    def assertApiError(self, status, code, fn, *args, **kw):
        """Calls fn expecting HTTPError with the given status and JSON code (code None: any JSON
        error body with a code and a message). Returns the error."""
        with self.assertRaises(HTTPError) as cm:
            fn(*args, **kw)
        e = cm.exception
        statuses = status if isinstance(status, (tuple, list, set)) else (status,)
        self.assertIn(e.status, statuses, "want %s got %d %r" % (statuses, e.status, e.body))
        self.assertIsInstance(e.body, dict, "error body is not JSON: %r" % (e.body,))
        self.assertIsInstance(e.body.get("code"), str, e.body)
        self.assertIsInstance(e.body.get("message"), str, e.body)
        if code is not None:
            codes = code if isinstance(code, (tuple, list, set)) else (code,)
            self.assertIn(e.body["code"], codes, e.body)
        return e

    def assertAlive(self, sid):
        """The daemon is healthy and sandbox sid still runs commands."""
        self.c.healthz()
        r = self.c.exec(sid, argv=["echo", "alive"])
        self.assertEqual((r["exit_code"], r["stdout"]), (0, "alive\n"), r)

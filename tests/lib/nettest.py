"""nettest.py -- a moatd whose uplink is a fake internet of the test's own (fakenet.py), and helpers
that try connections from inside a sandbox with bash's /dev/tcp.

Every packet goes only to namespaces the test made: moatd's routing namespace and the fake internet.
tearDownClass stops moatd (its routing namespace goes when no sandbox is left on it; a leftover of
a crash is removed too) and deletes the fake internet.
"""
import os
import shlex
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fakenet  # noqa: E402
import moatd  # noqa: E402
from moattest import DaemonTest  # noqa: E402


class NetDaemonTest(DaemonTest):
    pool = 2
    extra = ()

    @classmethod
    def setUpClass(cls):
        cls.fi = fakenet.FakeInternet()
        cls.fi.start()
        cls.daemon = moatd.MoatDaemon(pool=cls.pool, extra_args=cls.net_args(cls.fi) + list(cls.extra))
        try:
            cls.daemon.start()
        except Exception:
            cls.cleanup_net()
            raise
        cls.c = cls.daemon.client

    @staticmethod
    def net_args(fi):
        return ["--net-uplink", "netns:" + fi.path, "--net-dns-upstream", fakenet.DNS, "--net-warm", "4"]

    @classmethod
    def cleanup_net(cls):
        d = cls.daemon
        try:
            if d is not None:
                d.stop(keep_data=True)
                fakenet.remove_routing_ns(d.data_dir)
                d.force_cleanup()
        finally:
            cls.fi.stop()

    @classmethod
    def tearDownClass(cls):
        cls.cleanup_net()

    # -- from inside a sandbox --
    def bash(self, sid, script, timeout_ms=30000):
        return self.c.exec(sid, argv=["bash", "-c", script], timeout_ms=timeout_ms)

    def connects(self, sid, host, port=80, wait_s=2):
        """True when a TCP connection from sid to host:port is established within wait_s."""
        r = self.bash(sid, "timeout %d bash -c %s && echo OPEN || echo CLOSED" %
                      (wait_s, shlex.quote("exec 3<>/dev/tcp/%s/%d" % (host, port))))
        self.assertIn(r["stdout"].strip().splitlines()[-1], ("OPEN", "CLOSED"), r)
        return r["stdout"].strip().endswith("OPEN")

    def connected(self, sid, targets, wait_s=1):
        """Of targets [(host, port)...], those a TCP connection from sid reaches within wait_s, all
        tried at once (one bash job each), so a list of dropped targets costs wait_s, not its length."""
        jobs = " ".join("(timeout %d bash -c %s && echo OPEN %s %d) &" % (
            wait_s, shlex.quote("exec 3<>/dev/tcp/%s/%d" % (h, p)), h, p) for h, p in targets)
        r = self.bash(sid, jobs + " wait; echo DONE")
        self.assertEqual(r["stdout"].strip().splitlines()[-1], "DONE", r)
        return sorted((ln.split()[1], int(ln.split()[2])) for ln in r["stdout"].splitlines() if ln.startswith("OPEN "))

    def http_get(self, sid, host, port=80, wait_s=3):
        """The body of GET / from host:port, or None."""
        script = ("exec 3<>/dev/tcp/%s/%d && printf 'GET / HTTP/1.0\\r\\nHost: x\\r\\n\\r\\n' >&3 && cat <&3"
                  % (host, port))
        r = self.bash(sid, "timeout %d bash -c %s" % (wait_s, shlex.quote(script)))
        if r["exit_code"] != 0:
            return None
        return r["stdout"].split("\r\n\r\n", 1)[-1]

    def resolve(self, sid, name):
        """Addresses getent finds for name inside sid ([] when it does not resolve)."""
        r = self.bash(sid, "getent ahostsv4 %s | awk '{print $1}' | sort -u" % shlex.quote(name))
        return r["stdout"].split()

    def network(self, sid):
        return self.c.request("GET", "/v1/sandboxes/%s/network" % sid)[1]

    def put_network(self, sid, policy, expect=200):
        return self.c.request("PUT", "/v1/sandboxes/%s/network" % sid, body=policy, expect=expect)[1]

    def net_log(self, sid, since=None):
        q = {"since": str(since)} if since is not None else None
        return self.c.request("GET", "/v1/sandboxes/%s/network/log" % sid, query=q)[1]["connections"]

    def wait_log(self, sid, pred, timeout=5):
        """The log once some entry satisfies pred (NFLOG delivers asynchronously)."""
        deadline = time.time() + timeout
        while True:
            log = self.net_log(sid)
            if any(pred(e) for e in log) or time.time() > deadline:
                return log
            time.sleep(0.1)


def skip_unless_root():
    return unittest.skipUnless(os.geteuid() == 0, "needs root (network namespaces)")

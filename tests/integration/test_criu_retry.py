"""test_criu_retry.py -- a `criu check` that fails once at start-up (as a transient "Too many open
files" did) does not disable checkpoints until a restart: moatd probes again with a bounded backoff,
/healthz says so meanwhile, and once a probe passes checkpoints work."""

import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
import moatd  # noqa: E402

REAL_CRIU = os.environ.get("MOAT_CRIU") or "/var/lib/moat/criu/criu"

# Fails the first `criu check` the way CRIU does when it runs out of fds, then is CRIU.
WRAPPER = """#!/bin/sh
if [ "$1" = check ] && mkdir "%(dir)s/failed-once" 2>/dev/null; then
    echo "Error (criu/kerndat.c:1): Too many open files" >&2
    exit 1
fi
exec %(real)s "$@"
"""


class CriuRetryTest(unittest.TestCase):
    def test_failed_probe_is_retried(self):
        try:
            ok = subprocess.run([REAL_CRIU, "check"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                timeout=60).returncode == 0
        except OSError:
            ok = False
        if not ok:
            self.skipTest("no CRIU passing `criu check` at %s" % REAL_CRIU)
        tmp = tempfile.mkdtemp(prefix="moat-criu-retry-", dir="/var/tmp")
        self.addCleanup(shutil.rmtree, tmp, True)
        wrapper = os.path.join(tmp, "criu")
        with open(wrapper, "w") as f:
            f.write(WRAPPER % {"dir": tmp, "real": REAL_CRIU})
        os.chmod(wrapper, 0o755)
        # a restore runs CRIU as the new sandbox's root (a user namespace of its own): the wrapper must
        # be reachable by that uid, as /var/lib/moat/criu is
        os.chmod(tmp, 0o755)

        d = moatd.MoatDaemon(pool=0, env={"MOAT_CRIU": wrapper})
        self.addCleanup(d.stop)
        d.start()
        c = d.client
        first = c.healthz()["checkpoints"]
        self.assertFalse(first["available"], first)
        self.assertIn("Too many open files", first["criu"])
        self.assertTrue(os.path.isdir(os.path.join(tmp, "failed-once")))
        sid = c.create(ttl_seconds=600)["id"]
        st, body = c.request("POST", "/v1/sandboxes/%s/hibernate" % sid, body={}, expect=503)
        self.assertEqual(body["code"], "checkpoints_unavailable", body)

        deadline = time.time() + 20
        seen = [first]
        while time.time() < deadline:
            ck = c.healthz()["checkpoints"]
            if ck != seen[-1]:
                seen.append(ck)
            if ck["available"]:
                break
            time.sleep(0.2)
        self.assertTrue(seen[-1]["available"], "checkpoints still unavailable 20 s after one failed probe: %r" % seen)
        self.assertEqual(c.request("POST", "/v1/sandboxes/%s/hibernate" % sid, body={})[1]["state"], "hibernated")
        self.assertEqual(c.request("POST", "/v1/sandboxes/%s/wake" % sid, body={})[1]["state"], "running")
        self.assertEqual(c.sh(sid, "echo ok"), "ok\n")
        c.delete(sid)

"""test_guest_timeout.py -- what must not be taken for a hung guest (moatd --guest-timeout): a command
that runs quietly for longer than the timeout, and a sandbox paused for longer than it. (A guest that
really hangs: attack/test_guest.py, which runs alone since it bounds how long others wait.)"""

import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
from moattest import DaemonTest  # noqa: E402

GUEST_TIMEOUT_S = 9  # the daemon's --guest-timeout below: the least moatd accepts (default 15 s)


class GuestTimeoutTest(DaemonTest):
    daemon_args = ("--guest-timeout", str(GUEST_TIMEOUT_S * 1000))

    def test_quiet_long_command_is_not_a_hung_guest(self):
        sid = self.sandbox()["id"]
        t0 = time.time()
        r = self.c.exec(sid, cmd="sleep %d; echo done" % (GUEST_TIMEOUT_S + 5))
        self.assertEqual((r["exit_code"], r["stdout"]), (0, "done\n"))
        self.assertGreaterEqual(time.time() - t0, GUEST_TIMEOUT_S + 5)
        self.assertEqual(self.c.get(sid)["state"], "running")

    def test_paused_sandbox_is_not_a_hung_guest(self):
        sid = self.sandbox()["id"]
        box = {}

        def run():
            box["r"] = self.c.exec(sid, cmd="sleep 1; echo through")

        t = threading.Thread(target=run)
        t.start()
        time.sleep(0.3)
        self.c.request("POST", "/v1/sandboxes/%s/pause" % sid, body={})
        time.sleep(GUEST_TIMEOUT_S + 3)
        self.c.request("POST", "/v1/sandboxes/%s/resume" % sid, body={})
        t.join(30)
        self.assertEqual(box.get("r", {}).get("stdout"), "through\n", box)
        self.assertEqual(self.c.get(sid)["state"], "running")

"""test_e2b_internet.py -- E2B's allow_internet_access on create (POST /sandboxes and /v2/sandboxes)
against a moatd whose uplink is a fake internet of the test's own (nettest.py), and against one
without an uplink.

true or absent: what a v1 create without 'network' gets (the internet through the uplink); false:
loopback only; anything else: 400. Without an uplink, true (which the SDKs send by default) still
creates the sandbox, with loopback only, as the operator chose."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
import moatd  # noqa: E402
from moattest import DaemonTest  # noqa: E402
from nettest import NetDaemonTest  # noqa: E402


def e2b_create(t, path="/v2/sandboxes", **body):
    st, sb = t.c.request("POST", path, body=dict({"templateID": "base", "timeout": 120}, **body), auth=False,
                         headers={"X-API-KEY": "e2b_" + t.c.key[5:]}, expect=201)
    t.addCleanup(t._delete_quietly, t.c, sb["sandboxID"])
    return sb["sandboxID"]


def info(t, sid):
    return t.c.request("GET", "/sandboxes/" + sid, auth=False, headers={"X-API-KEY": t.c.key}, expect=200)[1]


def bad_values(t):
    for bad in ("yes", 1, 0, [], {}, "false"):
        with t.assertRaises(moatd.HTTPError) as cm:
            t.c.request("POST", "/sandboxes", body={"templateID": "base", "allow_internet_access": bad},
                        auth=False, headers={"X-API-KEY": t.c.key})
        t.assertEqual(cm.exception.status, 400, bad)
        t.assertEqual(cm.exception.body["code"], 400)
        t.assertIn("allow_internet_access", cm.exception.body["message"])


class E2BInternetTest(NetDaemonTest):
    def test_true_and_absent_reach_the_internet(self):
        for path, body in (("/v2/sandboxes", {"allow_internet_access": True}), ("/sandboxes", {}),
                           ("/sandboxes", {"allow_internet_access": None})):
            sid = e2b_create(self, path, **body)
            self.assertTrue(self.network(sid)["policy"]["internet"], (path, body))
            self.assertEqual(self.http_get(sid, "allowed.test"), "hello from 198.51.100.10\n", (path, body))
            self.assertIs(info(self, sid)["allowInternetAccess"], True)

    def test_false_is_loopback_only(self):
        sid = e2b_create(self, "/sandboxes", allow_internet_access=False)
        self.assertFalse(self.network(sid)["policy"]["internet"])
        self.assertFalse(self.connects(sid, "198.51.100.10"))
        self.assertEqual(self.resolve(sid, "allowed.test"), [])
        self.assertIs(info(self, sid)["allowInternetAccess"], False)

    def test_network_allow_public_traffic_false(self):
        """E2B's secure sandboxes send network: {allowPublicTraffic: false}: moat's sandbox URLs always
        need the token, so that is accepted; anything else in 'network' stays 400."""
        sid = e2b_create(self, "/sandboxes", network={"allowPublicTraffic": False}, secure=True)
        self.assertEqual(info(self, sid)["sandboxID"], sid)
        for bad in ({"allowPublicTraffic": True}, {"allowOut": ["1.1.1.1"]},
                    {"allowPublicTraffic": False, "denyOut": ["0.0.0.0/0"]}, {"allowPublicTraffic": "no"}):
            with self.assertRaises(moatd.HTTPError) as cm:
                self.c.request("POST", "/sandboxes", body={"templateID": "base", "network": bad}, auth=False,
                               headers={"X-API-KEY": self.c.key})
            self.assertEqual(cm.exception.status, 400, bad)

    def test_bad_values(self):
        bad_values(self)


class E2BNoUplinkTest(DaemonTest):
    pool = 0

    def test_true_creates_with_loopback_only(self):
        for v in (True, None, False):
            sid = e2b_create(self, "/sandboxes", allow_internet_access=v)
            net = self.c.request("GET", "/v1/sandboxes/%s/network" % sid)[1]
            self.assertFalse(net["policy"]["internet"], v)
            self.assertIs(info(self, sid)["allowInternetAccess"], False)
            r = self.c.exec(sid, argv=["cat", "/proc/net/dev"])
            self.assertEqual([ln.split(":")[0].strip() for ln in r["stdout"].splitlines()[2:]], ["lo"])
        bad_values(self)

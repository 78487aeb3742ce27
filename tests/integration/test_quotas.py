"""test_quotas.py -- quotas per org (GET/PUT /v1/orgs/{id}/quotas, GET /v1/orgs/{id}/usage/now): who
may read and set them, what a bad value is, and that they hold: 200 concurrent creates against
max_sandboxes 50 give exactly 50 sandboxes and 150 429 quota_exceeded, creates_per_hour likewise,
and the aggregate, TTL, volume and E2B create checks."""

import os
import sys
import threading
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
import moatd  # noqa: E402
import unittest  # noqa: E402

QUOTAS = ("max_sandboxes", "creates_per_hour", "max_vcpus", "max_memory_mb", "max_ttl_seconds",
          "max_snapshot_bytes", "max_volumes", "max_volume_bytes", "max_databases", "max_database_bytes")


def platform_key(daemon):
    return daemon.new_platform_key()


class QuotasTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # the per-org cap on requests in flight (fair.h) must not answer for the quota
        cls.daemon = moatd.MoatDaemon(pool=1, extra_args=["--max-requests-per-org", "1000"])
        try:
            cls.daemon.start()
        except Exception:
            cls.daemon.stop()
            raise
        cls.c = cls.daemon.client
        cls.admin = cls.c.with_key(platform_key(cls.daemon))

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()

    def org(self, **quotas):
        name = "q-" + uuid.uuid4().hex[:8]
        _, o = self.admin.request("POST", "/v1/orgs", body={"name": name}, expect=201)
        key = o["admin_key"]["key"]
        self.daemon.keys.append(key)
        k = self.c.with_key(key)
        self.addCleanup(self.drop, name, k)
        if quotas:
            self.admin.request("PUT", "/v1/orgs/%s/quotas" % name, body=quotas, expect=200)
        return name, k

    def drop(self, name, k):
        try:
            self.admin.request("DELETE", "/v1/orgs/" + name, query={"force": "true"}, expect=(204, 404),
                               timeout=300)
        except Exception:
            pass

    def status(self, client, method, path, body=None):
        try:
            client.request(method, path, body=body)
            return 200
        except moatd.HTTPError as e:
            return e.status

    def assertQuota(self, fn, quota, limit, use=None):
        with self.assertRaises(moatd.HTTPError) as cm:
            fn()
        b = cm.exception.body
        self.assertEqual((cm.exception.status, b.get("code")), (429, "quota_exceeded"), b)
        self.assertEqual((b["quota"], b["limit"]), (quota, limit), b)
        if use is not None:
            self.assertEqual(b["use"], use, b)
        self.assertIn(quota, b["message"])
        return b

    def usage(self, name, client=None):
        return (client or self.admin).request("GET", "/v1/orgs/%s/usage/now" % name)[1]["usage"]

    def test_get_put_and_validation(self):
        name, k = self.org()
        _, q = self.admin.request("GET", "/v1/orgs/%s/quotas" % name)
        self.assertEqual(sorted(q), sorted(QUOTAS))
        self.assertTrue(all(v is None for v in q.values()), q)
        _, q = self.admin.request("PUT", "/v1/orgs/%s/quotas" % name,
                                  body={"max_sandboxes": 3, "max_ttl_seconds": None, "max_volume_bytes": 2 ** 53})
        self.assertEqual((q["max_sandboxes"], q["max_ttl_seconds"], q["max_volume_bytes"]), (3, None, 2 ** 53))
        _, again = self.admin.request("GET", "/v1/orgs/%s/quotas" % name)
        self.assertEqual(again, q)
        # the org's own keys of every role read them; only the platform key sets them
        _, member = k.request("POST", "/v1/keys", body={"name": "m", "role": "member"}, expect=201)
        _, ro = k.request("POST", "/v1/keys", body={"name": "r", "role": "readonly"}, expect=201)
        for key in (k, self.c.with_key(member["key"]), self.c.with_key(ro["key"])):
            self.assertEqual(key.request("GET", "/v1/orgs/%s/quotas" % name)[1], q)
            self.assertEqual(self.usage(name, key)["max_sandboxes"], {"use": 0, "limit": 3})
            self.assertEqual(self.status(key, "PUT", "/v1/orgs/%s/quotas" % name, body={}), 403)
        # another org's key: 404 for its quotas and usage, whatever exists
        other, ok = self.org()
        for path in ("/v1/orgs/%s/quotas" % name, "/v1/orgs/%s/usage/now" % name, "/v1/orgs/nope/quotas"):
            self.assertEqual(self.status(ok, "GET", path), 404, path)
        self.assertEqual(self.status(ok, "PUT", "/v1/orgs/%s/quotas" % name, body={}), 403)
        for bad in ({"max_sandboxes": -1}, {"max_sandboxes": 1.5}, {"max_sandboxes": "5"},
                    {"max_sandboxes": True}, {"max_sandboxes": 2 ** 53 + 1}, {"max_sandboxes": 2 ** 63 - 1},
                    {"unknown": 1}, {"max_sandboxes": [1]}):
            st = self.status(self.admin, "PUT", "/v1/orgs/%s/quotas" % name, body=bad)
            self.assertEqual(st, 400, bad)
        self.assertEqual(self.admin.request("GET", "/v1/orgs/%s/quotas" % name)[1], q, "a refused PUT changed them")
        self.assertEqual(self.status(self.admin, "PUT", "/v1/orgs/nope-x/quotas", body={}), 404)
        st, body = self.admin.request("PUT", "/v1/orgs/%s/quotas" % name, raw=b"[1]",
                                      headers={"Content-Type": "application/json"}, expect=(400,))
        # PUT replaces: what is absent is unlimited again
        _, q = self.admin.request("PUT", "/v1/orgs/%s/quotas" % name, body={"max_volumes": 1})
        self.assertEqual((q["max_sandboxes"], q["max_volumes"]), (None, 1))

    def concurrent_creates(self, k, n):
        results = [None] * n
        go = threading.Event()

        def one(i):
            go.wait()
            try:
                _, sb = k.request("POST", "/v1/sandboxes", body={"ttl_seconds": 600}, timeout=600)
                results[i] = ("ok", sb["id"])
            except moatd.HTTPError as e:
                results[i] = (e.status, e.body)
            except Exception as e:  # noqa: BLE001
                results[i] = ("exc", repr(e))

        threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        t0 = time.time()
        go.set()
        for t in threads:
            t.join(900)
        return results, time.time() - t0

    def test_max_sandboxes_200_concurrent(self):
        name, k = self.org(max_sandboxes=50)
        results, took = self.concurrent_creates(k, 200)
        ok = [r[1] for r in results if r[0] == "ok"]
        refused = [r[1] for r in results if r[0] == 429]
        other = [r for r in results if r[0] not in ("ok", 429)]
        self.assertEqual(other, [])
        self.assertEqual(len(ok), 50, "created %d" % len(ok))
        self.assertEqual(len(refused), 150)
        for b in refused:
            self.assertEqual((b["code"], b["quota"], b["limit"]), ("quota_exceeded", "max_sandboxes", 50), b)
            self.assertLessEqual(b["use"], 50)
        self.assertEqual(self.usage(name)["max_sandboxes"], {"use": 50, "limit": 50})
        self.assertEqual(len([s for s in k.list() if s["state"] == "running"]), 50)
        sys.stderr.write("[200 concurrent creates against 50: %.1f s] " % took)
        # a kill gives the place back
        k.delete(ok[0])
        self.assertEqual(self.usage(name)["max_sandboxes"]["use"], 49)
        ok[0] = k.create(ttl_seconds=600)["id"]
        self.assertQuota(lambda: k.create(ttl_seconds=600), "max_sandboxes", 50, 50)
        for sid in ok:
            k.delete(sid)
        self.assertEqual(self.usage(name)["max_sandboxes"]["use"], 0)

    def test_creates_per_hour(self):
        name, k = self.org(creates_per_hour=5)
        results, _ = self.concurrent_creates(k, 20)
        ok = [r[1] for r in results if r[0] == "ok"]
        refused = [r[1] for r in results if r[0] == 429]
        self.assertEqual((len(ok), len(refused)), (5, 15), results)
        for b in refused:
            self.assertEqual(b["quota"], "creates_per_hour", b)
        for sid in ok:
            k.delete(sid)
        # deletes do not give creates back: the window is an hour
        self.assertQuota(lambda: k.create(ttl_seconds=60), "creates_per_hour", 5, 5)
        self.assertEqual(self.usage(name)["creates_per_hour"], {"use": 5, "limit": 5})
        # a failed create (a bad template) takes nothing
        self.admin.request("PUT", "/v1/orgs/%s/quotas" % name, body={"creates_per_hour": 6})
        k.request("POST", "/v1/sandboxes", body={"template": "no-such-template"}, expect=(400, 404))
        self.assertEqual(self.usage(name)["creates_per_hour"]["use"], 5)
        k.delete(k.create(ttl_seconds=60)["id"])

    def test_memory_vcpus_ttl(self):
        name, k = self.org(max_memory_mb=768, max_vcpus=1, max_ttl_seconds=300)
        a = k.create(ttl_seconds=60, memory_mb=512, cpu=0.5)["id"]
        self.assertQuota(lambda: k.create(ttl_seconds=60, memory_mb=512, cpu=0.5), "max_memory_mb",
                         768, 512)
        self.assertQuota(lambda: k.create(ttl_seconds=60, memory_mb=128, cpu=1), "max_vcpus", 1)
        b = k.create(ttl_seconds=60, memory_mb=256, cpu=0.5)["id"]
        u = self.usage(name)
        self.assertEqual((u["max_memory_mb"]["use"], u["max_vcpus"]["use"]), (768, 1), u)
        self.assertQuota(lambda: k.create(ttl_seconds=301), "max_ttl_seconds", 300, 301)
        self.assertQuota(lambda: k.patch(a, ttl_seconds=301), "max_ttl_seconds", 300)
        k.patch(a, ttl_seconds=300)
        self.assertEqual(self.usage(name)["max_ttl_seconds"]["use"], 300)
        k.delete(a)
        k.delete(b)

    def test_volumes(self):
        name, k = self.org(max_volumes=1, max_volume_bytes=64 << 20)
        self.assertQuota(lambda: k.request("POST", "/v1/volumes", body={"name": "big", "size_mb": 65}),
                         "max_volume_bytes", 64 << 20, 0)
        k.request("POST", "/v1/volumes", body={"name": "v1", "size_mb": 32}, expect=201)
        self.assertQuota(lambda: k.request("POST", "/v1/volumes", body={"name": "v2", "size_mb": 16}), "max_volumes",
                         1, 1)
        u = self.usage(name)
        self.assertEqual((u["max_volumes"], u["max_volume_bytes"]["use"]), ({"use": 1, "limit": 1}, 32 << 20))
        k.request("DELETE", "/v1/volumes/v1", expect=204)
        k.request("POST", "/v1/volumes", body={"name": "v2", "size_mb": 16}, expect=201)

    def test_databases_and_snapshots(self):
        name, k = self.org(max_databases=0, max_snapshot_bytes=0)
        self.assertQuota(lambda: k.request("POST", "/v1/databases", body={"name": "d1"}, timeout=120),
                         "max_databases", 0, 0)
        self.admin.request("PUT", "/v1/orgs/%s/quotas" % name, body={"max_database_bytes": 100 << 20,
                                                                      "max_snapshot_bytes": 0})
        self.assertQuota(lambda: k.request("POST", "/v1/databases", body={"name": "d1", "size_mb": 200},
                                           timeout=120), "max_database_bytes", 100 << 20, 0)
        sid = k.create(ttl_seconds=120)["id"]
        self.assertQuota(lambda: k.request("POST", "/v1/sandboxes/%s/snapshots" % sid, body={}, timeout=120),
                         "max_snapshot_bytes", 0, 0)
        self.assertEqual(k.request("GET", "/v1/snapshots")[1]["snapshots"], [])
        k.delete(sid)

    def test_fork_counts_children(self):
        ck = self.c.healthz().get("checkpoints") or {}
        if not ck.get("available"):
            self.skipTest("checkpoints unavailable: %s" % ck.get("criu"))
        name, k = self.org(max_sandboxes=3)
        sid = k.create(ttl_seconds=300)["id"]
        self.assertQuota(lambda: k.request("POST", "/v1/sandboxes/%s/fork" % sid, body={"count": 3}, timeout=120),
                         "max_sandboxes", 3, 1)
        _, forked = k.request("POST", "/v1/sandboxes/%s/fork" % sid, body={"count": 2}, timeout=120)
        self.assertEqual(self.usage(name)["max_sandboxes"]["use"], 3)
        self.assertQuota(lambda: k.request("POST", "/v1/sandboxes/%s/fork" % sid, body={"count": 1}, timeout=120),
                         "max_sandboxes", 3, 3)
        # a hibernated sandbox holds no place; its wake needs one
        k.request("POST", "/v1/sandboxes/%s/hibernate" % sid, body={}, timeout=120)
        self.assertEqual(self.usage(name)["max_sandboxes"]["use"], 2)
        c = k.create(ttl_seconds=300)["id"]
        self.assertQuota(lambda: k.request("POST", "/v1/sandboxes/%s/wake" % sid, body={}, timeout=120),
                         "max_sandboxes", 3, 3)
        k.delete(c)
        k.request("POST", "/v1/sandboxes/%s/wake" % sid, body={}, timeout=120)
        self.assertEqual(self.usage(name)["max_sandboxes"]["use"], 3)

    def test_metrics_gauges(self):
        name, k = self.org(max_sandboxes=4)
        sid = k.create(ttl_seconds=120)["id"]
        other, ok = self.org(max_volumes=3)
        use = 'moat_org_quota_use{org="%s",quota="max_sandboxes"} 1' % name
        lim = 'moat_org_quota_limit{org="%s",quota="max_sandboxes"} 4' % name
        _, text = k.request("GET", "/metrics")
        text = text.decode() if isinstance(text, bytes) else text
        self.assertIn(use, text)
        self.assertIn(lim, text)
        self.assertNotIn('org="%s"' % other, text)  # only the caller's org
        _, text = self.admin.request("GET", "/metrics")
        text = text.decode() if isinstance(text, bytes) else text
        self.assertIn(use, text)
        self.assertIn('moat_org_quota_limit{org="%s",quota="max_volumes"} 3' % other, text)
        self.assertNotIn("moat_sandbox_cpu_limit", text)  # nothing of a tenant's sandboxes
        k.delete(sid)

    def test_e2b_create_over_quota(self):
        name, k = self.org(max_sandboxes=1)
        key = {"X-API-KEY": "e2b_" + k.key[5:]}
        _, sb = self.c.request("POST", "/sandboxes", body={"templateID": "base", "timeout": 120}, auth=False,
                               headers=key, expect=201)
        with self.assertRaises(moatd.HTTPError) as cm:
            self.c.request("POST", "/sandboxes", body={"templateID": "base", "timeout": 120}, auth=False,
                           headers=key)
        self.assertEqual(cm.exception.status, 429)
        self.assertEqual(cm.exception.body["code"], 429, cm.exception.body)  # E2B's error shape
        self.assertIn("max_sandboxes", cm.exception.body["message"])
        k.delete(sb["sandboxID"])


if __name__ == "__main__":
    unittest.main()

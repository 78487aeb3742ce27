"""test_list_paging.py -- GET /v1/sandboxes in pages (limit, cursor, next, total) over 1,000 live
sandboxes of one org, and `moat ls` over them.

setUpClass creates the sandboxes concurrently through the API and tearDownClass kills them (also when
setUpClass fails half-way). cls.live tracks which of them are alive, so that the tests that kill some
keep the others' expectations right whatever order they run in.
"""

import concurrent.futures
import http.client
import json
import os
import subprocess
import sys
import time
import urllib.parse
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
import moatd  # noqa: E402
from moattest import DaemonTest  # noqa: E402

N = 1000
WORKERS = 16


def page_walk(client, limit, query=None, between=None):
    """Every page of the list with this limit: (ids in order, the pages' totals, page lengths).
    between(i, page) runs after page i is read."""
    ids, totals, sizes = [], [], []
    cursor = None
    for i in range(10 * N):
        q = dict(query or {}, limit=str(limit))
        if cursor:
            q["cursor"] = cursor
        body = client.request("GET", "/v1/sandboxes", query=q)[1]
        ids += [s["id"] for s in body["sandboxes"]]
        totals.append(body["total"])
        sizes.append(len(body["sandboxes"]))
        if between:
            between(i, body)
        cursor = body["next"]
        if cursor is None:
            return ids, totals, sizes
    raise AssertionError("the walk never ended")


class ListPagingTest(DaemonTest):
    pool = 4
    live = None  # id -> metadata of the class's sandboxes that are alive

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.live = {}
        cls.tag = "paging-" + uuid.uuid4().hex[:8]
        t0 = time.monotonic()
        try:
            with concurrent.futures.ThreadPoolExecutor(WORKERS) as ex:
                futs = [ex.submit(cls.make, i) for i in range(N)]
                for f in futs:
                    f.result()
        except BaseException:
            cls.tearDownClass()
            raise
        sys.stderr.write("    created %d sandboxes in %.1f s (%d at a time)\n" % (N, time.monotonic() - t0, WORKERS))

    @classmethod
    def make(cls, i):
        meta = {"suite": cls.tag, "par": str(i % 2), "i": str(i)}
        sb = cls.c.create(metadata=meta, ttl_seconds=3600)
        cls.live[sb["id"]] = meta
        return sb["id"]

    @classmethod
    def kill(cls, sid):
        cls.live.pop(sid, None)
        cls.c.request("DELETE", "/v1/sandboxes/" + sid, expect=(204, 404), timeout=120)

    @classmethod
    def tearDownClass(cls):
        try:
            t0 = time.monotonic()
            with concurrent.futures.ThreadPoolExecutor(WORKERS) as ex:
                for f in [ex.submit(cls.kill, sid) for sid in list(cls.live or {})]:
                    try:
                        f.result()
                    except Exception as e:  # the daemon's stop deletes what is left
                        sys.stderr.write("    kill: %s\n" % e)
            sys.stderr.write("    killed them in %.1f s\n" % (time.monotonic() - t0))
        finally:
            super().tearDownClass()

    def unpaged(self, query=None):
        body = self.c.request("GET", "/v1/sandboxes", query=query)[1]
        self.assertIsNone(body["next"])
        self.assertEqual(body["total"], len(body["sandboxes"]))
        return [s["id"] for s in body["sandboxes"]]

    def test_unpaged_lists_every_one_in_order(self):
        ids = self.unpaged()
        self.assertEqual(sorted(ids), sorted(self.live))
        body = self.c.request("GET", "/v1/sandboxes")[1]
        keys = [(s["created_at"], s["id"]) for s in body["sandboxes"]]
        self.assertEqual(keys, sorted(keys), "oldest first, then by id")

    def test_walk_every_page(self):
        whole = self.unpaged()
        for limit in (50, 137, 1000):
            ids, totals, sizes = page_walk(self.c, limit)
            self.assertEqual(ids, whole, "limit %d: the pages in order are the whole list" % limit)
            self.assertEqual(len(set(ids)), len(ids))
            self.assertEqual(set(totals), {len(self.live)}, "limit %d" % limit)
            self.assertTrue(all(n == limit for n in sizes[:-1]), (limit, sizes))
            self.assertTrue(0 < sizes[-1] <= limit, (limit, sizes))
            self.assertEqual(len(sizes), (len(whole) + limit - 1) // limit)

    def test_creates_and_kills_between_pages(self):
        """While a walk goes, sandboxes already seen, not yet seen and new ones are killed and made:
        no id comes twice, and every sandbox alive for the whole walk is seen once."""
        before = list(self.unpaged())
        extra = []
        killed = set()

        def between(i, page):
            if i % 2 == 0 and page["sandboxes"]:
                seen = page["sandboxes"][0]["id"]  # behind the cursor
                self.kill(seen)
                killed.add(seen)
            ahead = before[-1 - i]  # ahead of the cursor, until the walk gets there
            if ahead not in killed:
                self.kill(ahead)
                killed.add(ahead)
            extra.append(self.make(N + i))

        ids, totals, _ = page_walk(self.c, 50, between=between)
        self.assertEqual(len(ids), len(set(ids)), "an id came twice")
        stayed = [sid for sid in before if sid not in killed]
        self.assertTrue(set(stayed) <= set(ids), "sandboxes alive for the whole walk were missed")
        self.assertEqual([sid for sid in ids if sid in set(stayed)], stayed, "in list order")
        self.assertEqual(sorted(self.unpaged()), sorted(self.live))
        self.assertGreater(len(killed), 20)
        self.assertGreater(len(extra), 10)

    def test_filters_apply_before_paging(self):
        odd = self.unpaged({"metadata.par": "1"})
        self.assertEqual(sorted(odd), sorted(s for s, m in self.live.items() if m["par"] == "1"))
        ids, totals, _ = page_walk(self.c, 137, {"metadata.par": "1"})
        self.assertEqual((ids, set(totals)), (odd, {len(odd)}))
        ids, totals, _ = page_walk(self.c, 50, {"metadata.par": "0", "metadata.suite": self.tag, "state": "running"})
        self.assertEqual(sorted(ids), sorted(s for s, m in self.live.items() if m["par"] == "0"))
        self.assertEqual(set(totals), {len(ids)})
        one = next(iter(self.live.values()))
        ids, totals, _ = page_walk(self.c, 1, {"metadata.i": one["i"]})
        self.assertEqual((len(ids), totals), (1, [1]))
        ids, totals, _ = page_walk(self.c, 3, {"metadata.i": "no such"})
        self.assertEqual((ids, totals), ([], [0]))
        ids, totals, _ = page_walk(self.c, 137, {"template": "base"})
        self.assertEqual((ids, set(totals)), (self.unpaged(), {len(self.live)}))
        ids, totals, _ = page_walk(self.c, 50, {"template": "code-interpreter", "metadata.par": "1"})
        self.assertEqual((ids, totals), ([], [0]))
        # killed ones: only with state=killed, paged the same way
        victim = next(iter(self.live))
        self.kill(victim)
        dead = self.unpaged({"state": "killed"})
        self.assertIn(victim, dead)
        ids, totals, _ = page_walk(self.c, 7, {"state": "killed"})
        self.assertEqual((ids, set(totals)), (dead, {len(dead)}))
        self.assertNotIn(victim, self.unpaged())

    def test_another_org_sees_none(self):
        other = self.c.with_key(self.daemon.new_org_key("org-" + uuid.uuid4().hex[:8]))
        mine = self.c.request("GET", "/v1/sandboxes", query={"limit": "5"})[1]
        for q in ({}, {"limit": "50"}, {"limit": "1000"}, {"limit": "5", "cursor": mine["next"]},
                  {"metadata.suite": self.tag}, {"state": "killed", "limit": "10"}):
            body = other.request("GET", "/v1/sandboxes", query=q)[1]
            self.assertEqual(body, {"sandboxes": [], "next": None, "total": 0}, q)

    def test_bad_arguments(self):
        first = self.c.request("GET", "/v1/sandboxes", query={"limit": "2"})[1]
        good = first["next"]
        self.assertIsInstance(good, str)
        for arg, q in (("limit", "limit=0"), ("limit", "limit=1001"), ("limit", "limit=-1"), ("limit", "limit=abc"),
                       ("limit", "limit="), ("limit", "limit=1.5"), ("limit", "limit=5x"), ("limit", "limit=%2B5"), ("limit", "limit=%205"),
                       ("limit", "limit=5&limit=6"), ("cursor", "cursor="), ("cursor", "cursor=junk"),
                       ("cursor", "cursor=c123"), ("cursor", "cursor=c.sb-aaaaaaaaaaaaaaaaa"),
                       ("cursor", "cursor=a5"), ("cursor", "cursor=" + good + "x"),
                       ("cursor", "cursor=c99999999999999999999999." + good.split(".", 1)[1]),
                       ("cursor", "cursor=" + good + "&cursor=" + good)):
            e = self.assertApiError(400, "invalid_request", self.c.request, "GET", "/v1/sandboxes?" + q)
            self.assertIn(arg, e.body["message"], q)
        for arg, q in (("template", "template=Bad!"), ("template", "template="), ("page", "page=2")):
            e = self.assertApiError(400, "invalid_request", self.c.request, "GET", "/v1/sandboxes?" + q)
            self.assertIn(arg, e.body["message"], q)

    def e2b_walk(self, limit, **q):
        """Every page of E2B's GET /v2/sandboxes (nextToken in a header): the ids in order."""
        key = {"X-API-KEY": self.c.key}
        ids, token = [], None
        for _ in range(10 * N):
            args = dict(q, limit=str(limit))
            if token:
                args["nextToken"] = token
            conn = http.client.HTTPConnection("127.0.0.1", self.daemon.port, timeout=60)
            try:
                conn.request("GET", "/v2/sandboxes?" + urllib.parse.urlencode(args), headers=key)
                resp = conn.getresponse()
                page = json.loads(resp.read())
                token = resp.getheader("x-next-token")
            finally:
                conn.close()
            self.assertEqual(resp.status, 200, page)
            self.assertLessEqual(len(page), limit)
            ids += [s["sandboxID"] for s in page]
            if not token:
                return ids
        raise AssertionError("the walk never ended")

    def test_e2b_list_pages(self):
        """E2B's list reads the same pages from the store, newest first by default, and filters what
        the store does not (its running/paused) while it pages."""
        whole = self.unpaged()
        self.assertEqual(self.e2b_walk(100), whole[::-1])
        self.assertEqual(self.e2b_walk(37, order="asc"), whole)
        sid = whole[len(whole) // 2]
        self.c.request("POST", "/v1/sandboxes/%s/pause" % sid, expect=200)
        try:
            self.assertEqual(self.e2b_walk(100, state="paused"), [sid])
            self.assertEqual(self.e2b_walk(100, state="running", order="asc"), [x for x in whole if x != sid])
        finally:
            self.c.request("POST", "/v1/sandboxes/%s/resume" % sid, expect=200)
        self.assertEqual(self.e2b_walk(100, metadata="par=1"), [x for x in whole[::-1] if self.live[x]["par"] == "1"])
        self.assertEqual(self.e2b_walk(100, template="code-interpreter-v1"), [])

    def moat(self, *args, check=0):
        e = dict(os.environ, MOAT_API_URL="http://127.0.0.1:%d" % self.daemon.port, MOAT_API_KEY=self.c.key)
        r = subprocess.run([os.path.join(moatd.BUILD, "moat")] + list(args), env=e, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=120, text=True)
        self.assertEqual(r.returncode, check, "moat %s: %s%s" % (" ".join(args), r.stdout[-2000:], r.stderr))
        return r

    def test_cli_ls(self):
        whole = self.unpaged()
        page = json.loads(self.moat("ls", "--limit", "50", "--json").stdout)
        self.assertEqual([s["id"] for s in page["sandboxes"]], whole[:50])
        self.assertEqual(page["total"], len(whole))
        r = self.moat("ls", "--limit", "50", "--cursor", page["next"], "--json")
        self.assertEqual([s["id"] for s in json.loads(r.stdout)["sandboxes"]], whole[50:100])
        self.assertRegex(r.stderr, r"^next: \S+\n$")
        walked = json.loads(self.moat("ls", "--all", "--limit", "300", "--json").stdout)
        self.assertEqual(([s["id"] for s in walked["sandboxes"]], walked["next"]), (whole, None))
        table = self.moat("ls").stdout.splitlines()
        self.assertEqual([ln.split()[0] for ln in table[1:]], whole, "without --limit: every page")
        table = self.moat("ls", "--limit", "7", "--meta", "par=1")
        self.assertEqual(len(table.stdout.splitlines()), 8)
        self.assertTrue(table.stderr.startswith("next: "), table.stderr)
        for bad in (("--limit", "0"), ("--limit", "1001"), ("--limit", "x")):
            self.moat("ls", *bad, check=2)
        self.assertIn("cursor", self.moat("ls", "--cursor", "junk", check=1).stderr)

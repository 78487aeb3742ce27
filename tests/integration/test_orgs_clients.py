"""test_orgs_clients.py -- the clients of /v1/orgs, quotas and usage against a real moatd: the Python
SDK's moat.Admin, the TypeScript SDK's Admin and the CLI's moat org/quota/usage, each method and
command once, with the platform admin key, and a quota each sets refusing a create."""

import json
import os
import subprocess
import sys
import textwrap
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
import moatd  # noqa: E402
from moattest import DaemonTest  # noqa: E402
from test_orgs import platform_key  # noqa: E402
from test_sdk_typescript import SDK, build_sdk  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "sdk", "python"))
import moat  # noqa: E402


class OrgClientsTest(DaemonTest):
    pool = 1

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.pkey = platform_key(cls.daemon)
        cls.url = "http://127.0.0.1:%d" % cls.daemon.port

    def name(self):
        return "c-" + uuid.uuid4().hex[:8]

    def assertQuotaRefused(self, key):
        with self.assertRaises(moatd.HTTPError) as cm:
            self.c.with_key(key).create(ttl_seconds=60)
        self.assertEqual((cm.exception.status, cm.exception.body["quota"]), (429, "max_sandboxes"))

    def test_python_admin(self):
        a = moat.Admin(api_url=self.url, api_key=self.pkey)
        n = self.name()
        o = a.create_org(n)
        self.daemon.keys.append(o["admin_key"]["key"])
        self.assertEqual(o["id"], n)
        self.assertIn(n, [x["id"] for x in a.list_orgs(limit=1)])
        self.assertEqual(a.get_org(n)["state"], "active")
        q = a.set_quotas(n, max_sandboxes=0, max_volumes=2)
        self.assertEqual((q["max_sandboxes"], q["max_volumes"]), (0, 2))
        self.assertEqual(a.get_quotas(n), q)
        # the org's own key reads them
        own = moat.Admin(api_url=self.url, api_key=o["admin_key"]["key"])
        self.assertEqual(own.get_quotas(n), q)
        self.assertEqual(own.usage_now(n)["max_sandboxes"], {"use": 0, "limit": 0})
        self.assertQuotaRefused(o["admin_key"]["key"])
        with self.assertRaises(moat.MoatError) as cm:
            own.set_quotas(n, max_sandboxes=5)
        self.assertEqual(cm.exception.status, 403)
        with self.assertRaises(ValueError):
            a.set_quotas(n, bogus=1)
        with self.assertRaises(moat.MoatError) as cm:
            moat.Sandbox.create(api_url=self.url, api_key=o["admin_key"]["key"])
        self.assertEqual((cm.exception.status, cm.exception.code), (429, "quota_exceeded"))
        a.delete_org(n, force=True)
        with self.assertRaises(moat.NotFoundError):
            a.get_org(n)

    def test_typescript_admin(self):
        build_sdk()
        n = self.name()
        script = textwrap.dedent("""
            import { Admin } from '%s/dist/index.js';
            const a = new Admin();
            const name = process.argv[2];
            const out = {};
            const o = await a.createOrg(name);
            out.created = o.id; out.key = o.adminKey.key;
            out.listed = (await a.listOrgs({ limit: 1 })).some((x) => x.id === name);
            out.state = (await a.getOrg(name)).state;
            out.set = await a.setQuotas(name, { max_sandboxes: 0, max_databases: 1 });
            out.got = await a.getQuotas(name);
            out.usage = (await a.usageNow(name)).max_sandboxes;
            try { await a.setQuotas(name, { max_sandboxes: -1 }); out.bad = 'accepted'; } catch (e) { out.bad = e.constructor.name; }
            try {
              await fetch(process.env.MOAT_API_URL + '/v1/sandboxes', { method: 'POST', headers: { authorization: 'Bearer ' + o.adminKey.key, 'content-type': 'application/json' }, body: '{}' }).then(async (r) => { out.create = [r.status, (await r.json()).quota]; });
            } catch (e) { out.create = String(e); }
            await a.deleteOrg(name, { force: true });
            try { await a.getOrg(name); out.after = 'found'; } catch (e) { out.after = e.status; }
            console.log(JSON.stringify(out));
            """ % SDK)
        path = os.path.join(SDK, "orgs-test-%s.mjs" % uuid.uuid4().hex[:6])
        with open(path, "w") as f:
            f.write(script)
        self.addCleanup(os.unlink, path)
        env = dict(os.environ, MOAT_API_URL=self.url, MOAT_API_KEY=self.pkey)
        r = subprocess.run(["node", path, n], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr.decode(errors="replace"))
        out = json.loads(r.stdout.decode().strip().splitlines()[-1])
        self.daemon.keys.append(out["key"])
        self.assertEqual((out["created"], out["listed"], out["state"]), (n, True, "active"))
        self.assertEqual(out["set"], out["got"])
        self.assertEqual((out["set"]["max_sandboxes"], out["set"]["max_databases"]), (0, 1))
        self.assertEqual(out["usage"], {"use": 0, "limit": 0})
        self.assertNotEqual(out["bad"], "accepted")
        self.assertEqual(out["create"], [429, "max_sandboxes"])
        self.assertEqual(out["after"], 404)

    def cli(self, *args, key=None, check=0):
        env = dict(os.environ, MOAT_API_URL=self.url, MOAT_API_KEY=key or self.pkey)
        r = subprocess.run([os.path.join(REPO, os.environ.get("MOAT_BUILD", "build"), "moat")] + list(args),
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
        if check is not None:
            self.assertEqual(r.returncode, check, (args, r.stdout, r.stderr))
        return r.stdout.decode()

    def test_cli(self):
        n = self.name()
        key = self.cli("org", "create", n).strip()
        self.daemon.keys.append(key)
        self.assertTrue(key.startswith("moat_"), key)
        self.assertIn(n, self.cli("org", "ls"))
        self.assertEqual(json.loads(self.cli("org", "get", n))["id"], n)
        q = json.loads(self.cli("quota", "set", n, "max_sandboxes=0", "max_ttl_seconds=600"))
        self.assertEqual((q["max_sandboxes"], q["max_ttl_seconds"]), (0, 600))
        self.assertEqual(json.loads(self.cli("quota", "get", n, key=key)), q)
        self.assertIn("max_sandboxes", self.cli("usage", "now", n, key=key))
        self.assertEqual(json.loads(self.cli("usage", "now", n, "--json"))["max_ttl_seconds"]["limit"], 600)
        self.assertQuotaRefused(key)
        self.cli("quota", "set", n, "max_sandboxes=-3", check=1)
        self.cli("quota", "set", n, "max_sandboxes", check=2)
        self.cli("org", "ls", key=key, check=1)  # a tenant key: 403
        sid = self.c.with_key(key)
        self.cli("quota", "set", n)  # all unlimited again
        sb = sid.create(ttl_seconds=60)
        self.cli("org", "rm", n, check=1)  # 409: it has a sandbox
        self.cli("org", "rm", n, "--force")
        self.cli("org", "get", n, check=1)
        import sqlite3
        db = sqlite3.connect("file:%s?mode=ro" % os.path.join(self.daemon.data_dir, "moat.db"), uri=True, timeout=30)
        state = db.execute("SELECT state, killed_reason FROM sandboxes WHERE id = ?", (sb["id"],)).fetchone()
        db.close()
        self.assertEqual(state, ("killed", "org_deleted"))


if __name__ == "__main__":
    import unittest
    unittest.main()

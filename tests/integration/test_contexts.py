"""test_contexts.py -- code contexts (/v1/sandboxes/{id}/contexts): Python in a code-interpreter sandbox
(a DataFrame kept across three runs, a matplotlib PNG, the last expression's value, prints, exceptions,
cwd, hung runs interrupted at their timeout with the state intact, restart, delete), a streamed run
(SSE), bash and node contexts, a Python context in a `base` sandbox (python3-minimal), and bad input."""

import base64
import os
import re
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
import moatd  # noqa: E402
import sse  # noqa: E402
from moattest import DaemonTest  # noqa: E402

RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


class ContextsTest(DaemonTest):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        moatd.ensure_template("code-interpreter")
        cls.sid = cls.c.create(template="code-interpreter", ttl_seconds=3600)["id"]

    def url(self, *parts, sid=None):
        return "/v1/sandboxes/%s/%s" % (sid or self.sid, "/".join(parts))

    def new_ctx(self, expect=201, sid=None, **body):
        return self.c.request("POST", self.url("contexts", sid=sid), body=body, expect=expect)[1]

    def run_code(self, cid, code, expect=200, sid=None, **kw):
        kw["code"] = code
        return self.c.request("POST", self.url("contexts", cid, "run", sid=sid), body=kw, expect=expect)[1]

    def main_text(self, r):
        mains = [x for x in r["results"] if x["is_main_result"]]
        return mains[0]["text"] if mains else None

    def test_display_and_pil_images(self):
        """display() as IPython's; PIL's Image.show() and Image.save(path) display the image (E2B's code
        interpreter does both), a save to a file object does not."""
        cid = self.new_ctx(language="python")["id"]
        r = self.run_code(cid, "display(41, [1, 2])\n'main'")
        self.assertIsNone(r["error"], r)
        side = [x["text"] for x in r["results"] if not x["is_main_result"]]
        self.assertEqual(side, ["41", "[1, 2]"], r["results"])
        r = self.run_code(cid, "import numpy\nfrom PIL import Image\n"
                               "img = Image.fromarray((numpy.random.rand(16, 16, 3) * 255).astype('uint8')).convert('RGBA')\n"
                               "img.show()\nprint('shown')")
        self.assertIsNone(r["error"], r)
        self.assertEqual(r["stdout"], "shown\n")
        pngs = [x["png"] for x in r["results"] if x["png"]]
        self.assertEqual(len(pngs), 1, r["results"])
        self.assertEqual(base64.b64decode(pngs[0])[:8], b"\x89PNG\r\n\x1a\n")
        r = self.run_code(cid, "img.save('/tmp/saved.png')\nprint(open('/tmp/saved.png', 'rb').read(4))")
        self.assertIsNone(r["error"], r)
        self.assertEqual(r["stdout"], "b'\\x89PNG'\n")
        self.assertEqual(len([x for x in r["results"] if x["png"]]), 1, r["results"])
        r = self.run_code(cid, "import io\nimg.save(io.BytesIO(), format='PNG')\nNone")
        self.assertIsNone(r["error"], r)
        self.assertEqual([x for x in r["results"] if x["png"]], [])

    def test_python_dataframe_plot_values_errors(self):
        ctx = self.new_ctx(language="python")
        self.assertRegex(ctx["id"], r"^[a-z0-9]{16}$")
        self.assertEqual(ctx["language"], "python")
        self.assertRegex(ctx["created_at"], RFC3339)
        cid = ctx["id"]
        listed = self.c.request("GET", self.url("contexts"))[1]["contexts"]
        self.assertIn(cid, [x["id"] for x in listed])

        r = self.run_code(cid, "import pandas as pd\ndf = pd.DataFrame({'a': [1, 2, 3], 'b': [4, 5, 6]})\nprint('rows', len(df))")
        self.assertIsNone(r["error"], r)
        self.assertEqual(r["stdout"], "rows 3\n")
        self.assertEqual(r["results"], [])
        r = self.run_code(cid, "df['c'] = df.a * df.b\ndf")
        self.assertIsNone(r["error"], r)
        main = [x for x in r["results"] if x["is_main_result"]][0]
        self.assertIn("18", main["text"])
        self.assertIn("<table", main["html"] or "")
        r = self.run_code(cid, "int(df.c.sum())")
        self.assertEqual(self.main_text(r), "32")
        self.assertEqual(r["execution_count"], 3)

        r = self.run_code(cid, "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [3, 1, 2])\nplt.title('t')\nNone")
        self.assertIsNone(r["error"], r)
        pngs = [x["png"] for x in r["results"] if x["png"]]
        self.assertEqual(len(pngs), 1, r["results"])
        self.assertEqual(base64.b64decode(pngs[0])[:8], b"\x89PNG\r\n\x1a\n")
        # Figures are closed after each run: the next run has none.
        r = self.run_code(cid, "len(plt.get_fignums())")
        self.assertEqual(self.main_text(r), "0")
        self.assertFalse([x for x in r["results"] if x["png"]])

        r = self.run_code(cid, "x = 6 * 7\nprint('hi')\nimport sys; print('oops', file=sys.stderr)\nx")
        self.assertEqual(r["stdout"], "hi\n")
        self.assertEqual(r["stderr"], "oops\n")
        self.assertEqual(self.main_text(r), "42")
        r = self.run_code(cid, "import subprocess\nsubprocess.run(['echo', 'from child'])\nNone")
        self.assertIn("from child", r["stdout"])

        r = self.run_code(cid, "def f():\n    raise ValueError('bad value')\nf()")
        self.assertEqual(r["error"]["name"], "ValueError")
        self.assertEqual(r["error"]["value"], "bad value")
        tb = "\n".join(r["error"]["traceback"])
        self.assertIn("in f", tb)
        self.assertNotIn("kernel.py", tb)
        r = self.run_code(cid, "def g(:\n  pass")
        self.assertEqual(r["error"]["name"], "SyntaxError")
        self.assertEqual(self.main_text(self.run_code(cid, "x")), "42")

        self.run_code(cid, "import os\nos.makedirs('/tmp/wd', exist_ok=True)\nos.chdir('/tmp/wd')")
        self.assertEqual(self.main_text(self.run_code(cid, "os.getcwd()")), "'/tmp/wd'")

    def test_python_timeout_keeps_state(self):
        cid = self.new_ctx()["id"]
        self.run_code(cid, "keep = [1, 2, 3]")
        for code in ("while True: pass", "import time\ntime.sleep(100)"):
            t0 = time.time()
            r = self.run_code(cid, code, timeout_ms=1000)
            dt = time.time() - t0
            self.assertLess(dt, 4.0, code)
            self.assertGreaterEqual(dt, 0.9, code)
            self.assertTrue(r["timed_out"], r)
            self.assertFalse(r["restarted"], r)
            self.assertEqual(r["error"]["name"], "KeyboardInterrupt", r)
            self.assertEqual(self.main_text(self.run_code(cid, "keep")), "[1, 2, 3]")

    def test_python_restart_and_delete(self):
        cid = self.new_ctx(cwd="/tmp")["id"]
        self.assertEqual(self.main_text(self.run_code(cid, "import os\nv = 1\nos.getcwd()")), "'/tmp'")
        ctx = self.c.request("POST", self.url("contexts", cid, "restart"), body={})[1]
        self.assertEqual(ctx["id"], cid)
        self.assertEqual(ctx["cwd"], "/tmp")
        r = self.run_code(cid, "v")
        self.assertEqual(r["error"]["name"], "NameError")
        self.assertEqual(r["execution_count"], 1)
        # A kernel that exits is started again and says so.
        r = self.run_code(cid, "import os\nos._exit(3)")
        self.assertTrue(r["restarted"])
        self.assertEqual(r["error"]["name"], "ContextExited")
        self.assertEqual(self.main_text(self.run_code(cid, "1+1")), "2")
        self.c.request("DELETE", self.url("contexts", cid), expect=204)
        self.assertEqual(self.run_code(cid, "1", expect=404)["code"], "context_not_found")
        self.assertEqual(self.c.request("DELETE", self.url("contexts", cid), expect=404)[1]["code"], "context_not_found")
        listed = self.c.request("GET", self.url("contexts"))[1]["contexts"]
        self.assertNotIn(cid, [x["id"] for x in listed])

    def test_stream_and_busy(self):
        cid = self.new_ctx()["id"]
        s = sse.open(self.c, "POST", self.url("contexts", cid, "run"),
                     body={"code": "import time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.3)\n7"},
                     headers={"Accept": "text/event-stream"})
        first = s.next(timeout=10)
        self.assertEqual(first.name, "stdout")
        # While it runs, a second run of the same context is refused.
        b = self.run_code(cid, "1", expect=409)
        self.assertEqual(b["code"], "context_busy")
        events = [first] + s.all(timeout=30)
        s.close()
        names = [e.name for e in events]
        self.assertEqual(names[-1], "end", names)
        self.assertEqual("".join(e.data["text"] for e in events if e.name == "stdout"), "0\n1\n2\n")
        res = [e.data for e in events if e.name == "result"]
        self.assertEqual(res[0]["text"], "7")
        self.assertFalse(events[-1].data["timed_out"])
        # stream: true in the body does the same.
        s = sse.open(self.c, "POST", self.url("contexts", cid, "run"), body={"code": "1/0", "stream": True})
        events = s.all(timeout=30)
        s.close()
        self.assertEqual([e.name for e in events], ["error", "end"])
        self.assertEqual(events[0].data["name"], "ZeroDivisionError")

    def test_bash_context(self):
        cid = self.new_ctx(language="bash")["id"]
        r = self.run_code(cid, "X=hello; cd /tmp; echo $X")
        self.assertEqual(r["stdout"], "hello\n")
        self.assertEqual(r["exit_code"], 0)
        r = self.run_code(cid, "echo $X $PWD; ls /nonexistent")
        self.assertEqual(r["stdout"], "hello /tmp\n")
        self.assertIn("nonexistent", r["stderr"])
        self.assertEqual(r["exit_code"], 2)
        r = self.run_code(cid, "sleep 100", timeout_ms=500)
        self.assertTrue(r["timed_out"])
        self.assertFalse(r["restarted"])
        self.assertEqual(self.run_code(cid, "printf %s $X")["stdout"], "hello")

    def test_node_context(self):
        cid = self.new_ctx(language="node")["id"]
        self.assertEqual(self.main_text(self.run_code(cid, "let n = 20; console.log('hi'); n + 1")), "21")
        r = self.run_code(cid, "n * 2")
        self.assertEqual(self.main_text(r), "40")
        r = self.run_code(cid, "throw new TypeError('nope')")
        self.assertEqual(r["error"]["name"], "TypeError")
        self.assertEqual(r["error"]["value"], "nope")
        r = self.run_code(cid, "while (true) {}", timeout_ms=500)
        self.assertTrue(r["timed_out"])
        self.assertEqual(self.main_text(self.run_code(cid, "n")), "20")

    def test_base_template_python_minimal(self):
        sid = self.c.create(ttl_seconds=600)["id"]
        cid = self.new_ctx(sid=sid)["id"]
        r = self.run_code(cid, "d = {'k': [1, 'two']}\nprint('out')\nd", sid=sid)
        self.assertIsNone(r["error"], r)
        self.assertEqual(r["stdout"], "out\n")
        self.assertEqual(self.main_text(r), "{'k': [1, 'two']}")
        r = self.run_code(cid, "import pandas", sid=sid)
        self.assertEqual(r["error"]["name"], "ModuleNotFoundError")
        # base has no node: a clear 400.
        e = self.new_ctx(expect=400, sid=sid, language="node")
        self.assertIn("code-interpreter", e["message"])
        self.c.delete(sid)

    def test_bad_input(self):
        self.assertEqual(self.new_ctx(expect=400, language="cobol")["code"], "invalid_request")
        self.assertEqual(self.new_ctx(expect=400, language=3)["code"], "invalid_request")
        self.assertEqual(self.new_ctx(expect=400, cwd="relative")["code"], "invalid_request")
        self.assertEqual(self.new_ctx(expect=400, bogus=1)["code"], "invalid_request")
        self.assertEqual(self.new_ctx(expect=400, cwd="/nonexistent/dir")["code"], "invalid_request")
        cid = self.new_ctx()["id"]
        self.assertEqual(self.run_code(cid, 5, expect=400)["code"], "invalid_request")
        self.assertEqual(self.run_code(cid, "1", expect=400, timeout_ms=0)["code"], "invalid_request")
        self.assertEqual(self.run_code(cid, "1", expect=400, timeout_ms="1")["code"], "invalid_request")
        self.assertEqual(self.run_code(cid, "1", expect=400, extra=True)["code"], "invalid_request")
        self.assertEqual(self.c.request("POST", self.url("contexts", cid, "run"), body={}, expect=400)[1]["code"],
                         "invalid_request")
        for bad in ("zzzzzzzzzzzzzzzz", "short", "UPPER"):
            self.assertEqual(self.run_code(bad, "1", expect=404)["code"], "context_not_found")
        self.c.request("GET", self.url("contexts", cid), expect=405)
        # Another org cannot see this sandbox's contexts.
        other = self.c.with_key(self.daemon.new_org_key("other-org"))
        other.request("GET", self.url("contexts"), expect=404)
        self.c.request("GET", self.url("contexts"), expect=401, auth=False)
        # The context still works.
        self.assertEqual(self.main_text(self.run_code(cid, "2**10")), "1024")


if __name__ == "__main__":
    import unittest

    unittest.main()

"""test_concurrency.py -- 20 clients create, exec in and delete sandboxes at the same time."""

import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
from moattest import DaemonTest  # noqa: E402


class ConcurrencyTest(DaemonTest):
    def test_20_parallel_creates_and_execs(self):
        n = 20
        results = [None] * n
        created = []
        lock = threading.Lock()
        start = threading.Barrier(n)

        def worker(i):
            try:
                start.wait(30)
                sb = self.c.create(metadata={"worker": str(i), "suite": "concurrency"})
                with lock:
                    created.append(sb["id"])
                outs = []
                for j in range(3):
                    r = self.c.exec(sb["id"], cmd="echo %d-%d; echo $$ > /tmp/me" % (i, j))
                    outs.append((r["exit_code"], r["stdout"]))
                self.c.put_file(sb["id"], "/tmp/worker", str(i).encode())
                mine = self.c.get_file(sb["id"], "/tmp/worker")
                results[i] = (sb["id"], outs, mine)
            except Exception as e:  # checked below, with the worker's index
                results[i] = e

        t0 = time.time()
        ts = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(300)
        for sid in created:
            self.addCleanup(self._delete_quietly, self.c, sid)
        dt = time.time() - t0
        ids = set()
        for i, r in enumerate(results):
            self.assertIsInstance(r, tuple, "worker %d: %r" % (i, r))
            sid, outs, mine = r
            ids.add(sid)
            self.assertEqual(outs, [(0, "%d-%d\n" % (i, j)) for j in range(3)])
            self.assertEqual(mine, str(i).encode())
        self.assertEqual(len(ids), n, "sandbox ids were reused")
        listed = {s["id"] for s in self.c.list(metadata={"suite": "concurrency"})}
        self.assertEqual(listed, ids)
        # delete in parallel too
        errs = []

        def rm(sid):
            try:
                self.c.delete(sid)
            except Exception as e:
                errs.append(e)
        ts = [threading.Thread(target=rm, args=(sid,)) for sid in ids]
        for t in ts:
            t.start()
        for t in ts:
            t.join(120)
        self.assertEqual(errs, [])
        self.assertEqual(self.c.list(state="running", metadata={"suite": "concurrency"}), [])
        self.assertLess(dt, 120)

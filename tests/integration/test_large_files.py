"""test_large_files.py -- a 1 GiB file goes into a sandbox and comes back through PUT/GET /files
streamed end to end: the test never holds it (a generator uploads it, the download is hashed as it
arrives) and moatd's resident memory (VmRSS of its main process, sampled every 20 ms) stays flat."""

import hashlib
import http.client
import os
import sys
import threading
import time
import urllib.parse

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
from moattest import DaemonTest  # noqa: E402

CHUNK = 1 << 20
SIZE = 1 << 30  # 1 GiB
RSS_LIMIT = 64 << 20  # moatd's VmRSS must stay under this throughout the transfer


def chunk(i):
    """Chunk i of the file: zeros with its index and a marker at the start and end, so that a
    reordered, repeated or dropped chunk changes the hash."""
    b = bytearray(CHUNK)
    tag = b"moat-chunk-%08d|" % i
    b[0:len(tag)] = tag
    b[CHUNK - len(tag):] = tag
    return bytes(b)


def vm_rss(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class RssSampler(threading.Thread):
    def __init__(self, pid):
        super().__init__(daemon=True)
        self.pid, self.max, self.samples = pid, 0, 0
        self.stop_ev = threading.Event()

    def run(self):
        while not self.stop_ev.is_set():
            try:
                self.max = max(self.max, vm_rss(self.pid))
                self.samples += 1
            except OSError:
                return
            time.sleep(0.02)

    def stop(self):
        self.stop_ev.set()
        self.join()


class LargeFilesTest(DaemonTest):
    pool = 1

    def _conn(self):
        return http.client.HTTPConnection("127.0.0.1", self.daemon.port, timeout=300)

    def _path(self, sid, path):
        return "/v1/sandboxes/%s/files?%s" % (sid, urllib.parse.urlencode({"path": path}))

    def test_1gib_round_trip_streams(self):
        sb = self.sandbox(disk_mb=4096)
        sid = sb["id"]
        pid = self.daemon.proc.pid
        base = vm_rss(pid)
        n = SIZE // CHUNK
        want = hashlib.sha256()

        def body():
            for i in range(n):
                c = chunk(i)
                want.update(c)
                yield c

        sampler = RssSampler(pid)
        sampler.start()
        t0 = time.time()
        try:
            conn = self._conn()
            conn.request("PUT", self._path(sid, "/root/big.bin"), body=body(),
                         headers={"Authorization": "Bearer " + self.c.key, "Content-Length": str(SIZE),
                                  "Content-Type": "application/octet-stream"})
            r = conn.getresponse()
            payload = r.read()
            conn.close()
            self.assertEqual(r.status, 200, payload[:300])
            t_up = time.time() - t0
            up_max = sampler.max
            self.assertEqual(self.c.stat(sid, "/root/big.bin")["size"], SIZE)

            t1 = time.time()
            conn = self._conn()
            conn.request("GET", self._path(sid, "/root/big.bin"), headers={"Authorization": "Bearer " + self.c.key})
            r = conn.getresponse()
            self.assertEqual(r.status, 200)
            self.assertEqual(r.getheader("Content-Length"), str(SIZE))
            got, total = hashlib.sha256(), 0
            while True:
                b = r.read(CHUNK)
                if not b:
                    break
                got.update(b)
                total += len(b)
            conn.close()
            t_down = time.time() - t1
        finally:
            sampler.stop()
        self.assertEqual(total, SIZE)
        self.assertEqual(got.hexdigest(), want.hexdigest())
        self.assertGreater(sampler.samples, 10)
        sys.stderr.write("\n  1 GiB up %.1f s (%.0f MiB/s), down %.1f s (%.0f MiB/s); moatd VmRSS %.1f MiB before, "
                         "max %.1f MiB during upload, %.1f MiB overall (%d samples)\n"
                         % (t_up, 1024 / t_up, t_down, 1024 / t_down, base / 2**20, up_max / 2**20,
                            sampler.max / 2**20, sampler.samples))
        self.assertLess(sampler.max, RSS_LIMIT, "moatd's VmRSS reached %.1f MiB" % (sampler.max / 2**20))
        # the sandbox and the daemon carry on
        self.c.delete_file(sid, "/root/big.bin")
        self.assertAlive(sid)


if __name__ == "__main__":
    import unittest
    unittest.main()

"""test_resources.py -- a sandbox tries to exhaust the host: fork bomb, disk, memory and CPU. Each
limit must hold inside the sandbox, the host must not notice, and the sandbox must still answer."""

import os
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
from moattest import DaemonTest  # noqa: E402


def host_threads():
    with open("/proc/loadavg") as f:
        return int(f.read().split()[3].split("/")[1])


def host_spawn_ms():
    t0 = time.time()
    subprocess.run(["/bin/true"], check=True, timeout=30)
    return (time.time() - t0) * 1000


class ResourceTest(DaemonTest):
    def wait_answers(self, sid, timeout=20):
        deadline = time.time() + timeout
        last = None
        while time.time() < deadline:
            try:
                r = self.c.exec(sid, argv=["echo", "alive"], timeout_ms=5000)
                if r["exit_code"] == 0 and r["stdout"] == "alive\n":
                    return
                last = r
            except Exception as e:  # the guest may refuse while the pids limit is full
                last = e
            time.sleep(0.5)
        self.fail("sandbox %s does not answer after %ss: %r" % (sid, timeout, last))

    def test_fork_bomb(self):
        sid = self.with_probe(pids=64)
        base_threads = host_threads()
        r = self.probe(sid, "forkcount", 1000)
        self.assertEqual(r.errno, "EAGAIN", r)
        self.assertLess(int(r.fields["forked"]), 64)
        # a real bomb, stopped by the exec timeout; meanwhile the host carries on
        peak = [0]
        spawn = []
        stop = threading.Event()

        def watch():
            while not stop.is_set():
                peak[0] = max(peak[0], host_threads())
                spawn.append(host_spawn_ms())
                time.sleep(0.1)
        w = threading.Thread(target=watch)
        w.start()
        try:
            res = self.c.exec(sid, cmd="bomb() { bomb | bomb & }; bomb; sleep 5", timeout_ms=4000,
                              expect=(200, 409, 503), timeout=120)
        finally:
            stop.set()
            w.join()
        self.assertLess(peak[0] - base_threads, 400, "the host's thread count grew by %d" % (peak[0] - base_threads))
        self.assertLess(max(spawn), 2000, "host spawns slowed to %.0f ms during the bomb" % max(spawn))
        self.wait_answers(sid)
        # the bomb's survivors may hold every pid again: the guest cannot clone (503) until a kill lands
        deadline = time.time() + 30
        while True:
            st, _ = self.c.request("POST", "/v1/sandboxes/%s/exec" % sid,
                                   body={"cmd": "kill -9 -1 2>/dev/null; true"}, expect=(200, 502, 503))
            if st != 503 or time.time() > deadline:
                break
            time.sleep(0.2)
        self.assertNotEqual(st, 503, "the sandbox's pids stayed full for 30 s")
        self.wait_answers(sid)
        r = self.probe(sid, "forkcount", 10)
        self.assertTrue(r.ok, r)
        self.assertIsInstance(res, dict)

    def test_fill_disk(self):
        sid = self.with_probe(disk_mb=64)
        keep = b"precious old content\n" * 100
        self.c.put_file(sid, "/root/keep.txt", keep)
        st0 = os.statvfs(self.daemon.data_dir)
        r = self.probe(sid, "fill", "/root/fill.bin", timeout_ms=120000)
        self.assertIn(r.errno, ("ENOSPC", "EDQUOT"), r)
        written = int(r.fields["written"])
        self.assertLessEqual(written, 64 << 20)
        st1 = os.statvfs(self.daemon.data_dir)
        used = (st0.f_bavail - st1.f_bavail) * st0.f_frsize
        self.assertLess(used, 200 << 20, "host free space dropped by %d MiB" % (used >> 20))
        # the files API reports the full disk, and the old file survives the failed overwrite
        e = self.assertApiError(507, "insufficient_storage", self.c.put_file, sid, "/root/keep.txt",
                                os.urandom(16 << 20))
        self.assertTrue(e)
        self.assertEqual(self.c.get_file(sid, "/root/keep.txt"), keep)
        self.assertApiError(507, "insufficient_storage", self.c.put_file, sid, "/root/new.bin", os.urandom(16 << 20))
        self.assertAlive(sid)
        self.c.delete_file(sid, "/root/fill.bin")
        self.c.put_file(sid, "/root/new.bin", b"fits again")
        self.assertEqual(self.c.get_file(sid, "/root/new.bin"), b"fits again")

    def test_memory_hog(self):
        sid = self.with_probe(memory_mb=64)
        t0 = time.time()
        r = self.probe(sid, "alloc", 256, timeout_ms=120000)
        self.assertFalse(r.ok, r)
        self.assertEqual((r.raw["exit_code"], r.raw["signal"]), (-1, 9), r)
        self.assertLess(time.time() - t0, 60)
        self.assertAlive(sid)
        self.assertEqual(self.c.get(sid)["state"], "running")
        r = self.probe(sid, "alloc", 16)
        self.assertTrue(r.ok, r)
        self.assertLess(host_spawn_ms(), 2000)

    def test_cpu_hog(self):
        sid = self.with_probe(cpu=0.5)
        r = self.probe(sid, "burn", 2, 4, timeout_ms=60000)
        self.assertTrue(r.ok, r)
        cpu, wall = float(r.fields["cpu_s"]), float(r.fields["wall_s"])
        self.assertLessEqual(cpu / wall, 0.6, r)
        self.assertGreater(cpu / wall, 0.1, r)
        self.assertAlive(sid)

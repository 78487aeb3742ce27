"""probe.py -- build tests/lib/probe.c statically on the host, upload it into sandboxes, run it.

The probe prints one line per operation, "OK [k=v ...]" or "ERR ENAME [k=v ...]"; run() parses it
into a Result so that tests can assert the errno name an attack failed with.
"""

import hashlib
import os
import subprocess
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "probe.c")
SANDBOX_PATH = "/tmp/moat-probe"
_lock = threading.Lock()
_built = {}


def build_static(src_path):
    """Compiles a C file statically once per source version (cached under /var/tmp) and returns the
    binary's bytes."""
    with _lock:
        if src_path in _built:
            return _built[src_path]
        with open(src_path, "rb") as f:
            src = f.read()
        digest = hashlib.sha256(src).hexdigest()[:16]
        name = os.path.splitext(os.path.basename(src_path))[0]
        out = "/var/tmp/moat-test-%s-%s" % (name, digest)
        if not os.path.exists(out):
            tmp = out + ".tmp%d" % os.getpid()
            subprocess.run(["cc", "-static", "-O2", "-Wall", "-o", tmp, src_path], check=True)
            os.rename(tmp, out)
        with open(out, "rb") as f:
            _built[src_path] = f.read()
        return _built[src_path]


def build():
    """The probe's static binary (bytes)."""
    return build_static(SRC)


class Result:
    def __init__(self, exec_result):
        self.raw = exec_result
        out = exec_result.get("stdout", "")
        self.line = out.splitlines()[0] if out else ""
        parts = self.line.split()
        self.ok = bool(parts) and parts[0] == "OK"
        self.errno = parts[1] if parts and parts[0] == "ERR" and len(parts) > 1 else None
        self.fields = {}
        for p in parts[1:]:
            if "=" in p:
                k, v = p.split("=", 1)
                self.fields[k] = v
        self.rest = out[len(self.line) + 1:] if out else ""

    def __repr__(self):
        return "Probe(%r, exit=%r, signal=%r, stderr=%r)" % (self.line, self.raw.get("exit_code"),
                                                             self.raw.get("signal"), self.raw.get("stderr", "")[:200])


def host_path():
    """The probe's path on the host (built by build()), for checks run by host root."""
    build()
    with open(SRC, "rb") as f:
        return "/var/tmp/moat-test-probe-%s" % hashlib.sha256(f.read()).hexdigest()[:16]


def install(client, sid):
    client.put_file(sid, SANDBOX_PATH, build(), mode="0755")


def run(client, sid, *args, **kw):
    """Runs the probe in sandbox sid (install() first) and returns a Result."""
    r = client.exec(sid, argv=[SANDBOX_PATH] + [str(a) for a in args], **kw)
    return Result(r)

"""guest_attack.py -- tests/lib/guest_attack.c, built statically: the ways into a sandbox's PID 1, run
from inside a sandbox (install + reach) or from the host against a sandbox's init (host_*)."""

import os
import subprocess
import tempfile

import probe

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "guest_attack.c")
SANDBOX_PATH = "/tmp/guest-attack"


def binary():
    return probe.build_static(SRC)


def install(client, sid):
    client.put_file(sid, SANDBOX_PATH, binary(), mode="0755")


def parse_reach(stdout):
    """{way: "OK" | errno name} from the output of `reach`."""
    out = {}
    for ln in stdout.splitlines():
        parts = ln.split()
        if len(parts) >= 2:
            out[parts[0]] = parts[1] if parts[1] == "OK" else (parts[2] if len(parts) > 2 else "ERR")
    return out


def reach(client, sid, pid):
    r = client.exec(sid, argv=[SANDBOX_PATH, "reach", str(pid)])
    return parse_reach(r["stdout"])


def host_binary_path():
    """The binary as a file on the host (for running it there)."""
    data = binary()
    fd, path = tempfile.mkstemp(prefix="moat-guest-attack-", dir="/var/tmp")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(path, 0o755)
    return path


def host_hijack(pid, directory):
    """From the host: makes the process pid chroot(directory) and pause for ever. Returns the line."""
    path = host_binary_path()
    try:
        return subprocess.run([path, "hijack", str(pid), directory], capture_output=True, text=True,
                              timeout=30).stdout.strip()
    finally:
        os.unlink(path)

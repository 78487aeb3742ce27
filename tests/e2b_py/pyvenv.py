"""pyvenv.py -- the virtualenv holding the pinned Python E2B SDKs (requirements.txt), made once per
requirements file and Python version under /var/tmp (or $MOAT_E2B_PY_VENV_DIR) and reused.

ensure() returns the venv's python, or raises Unavailable (no venv module, PyPI unreachable) with
the reason. Concurrent callers wait on a lock file; a half-made venv is never used (the "ready"
marker is written last)."""

import fcntl
import hashlib
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REQUIREMENTS = os.path.join(HERE, "requirements.txt")
PIP_TIMEOUT_S = 600


class Unavailable(Exception):
    pass


def venv_dir():
    with open(REQUIREMENTS, "rb") as f:
        h = hashlib.sha256(f.read() + sys.version.encode()).hexdigest()[:16]
    base = os.environ.get("MOAT_E2B_PY_VENV_DIR", "/var/tmp")
    return os.path.join(base, "moat-e2b-py-" + h)


def ensure():
    d = venv_dir()
    py = os.path.join(d, "bin", "python")
    ready = os.path.join(d, "ready")
    if os.path.exists(ready):
        return py
    os.makedirs(os.path.dirname(d), exist_ok=True)
    with open(d + ".lock", "w") as lk:
        fcntl.flock(lk, fcntl.LOCK_EX)
        if os.path.exists(ready):
            return py
        subprocess.run(["rm", "-rf", d], check=True)
        r = subprocess.run([sys.executable, "-m", "venv", d], capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise Unavailable("python -m venv failed (Debian: apt-get install python3-venv): " + r.stderr[-500:])
        r = subprocess.run([py, "-m", "pip", "install", "--disable-pip-version-check", "-q", "-r", REQUIREMENTS],
                           capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
        if r.returncode != 0:
            subprocess.run(["rm", "-rf", d])
            raise Unavailable("pip install -r tests/e2b_py/requirements.txt failed: " + r.stderr[-800:])
        with open(ready, "w") as f:
            f.write("ok\n")
    return py


if __name__ == "__main__":
    print(ensure())

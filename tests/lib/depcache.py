"""depcache.py -- pinned third-party packages installed once under /var/tmp and reused: a Python
virtualenv made from a requirements file, or a node_modules made by `npm ci` from a package.json and
its package-lock.json.

Each is kept in a directory named by a hash of what pins it (and the Python or node version), so a
changed pin makes a new one. Concurrent callers wait on a lock file; a half-made directory is never
used (its "ready" marker is written last). A failed install (no venv module, registry unreachable)
raises Unavailable with the installer's reason, for the caller to report as a skip."""

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys

INSTALL_TIMEOUT_S = 900


class Unavailable(Exception):
    pass


def _cache_dir(prefix, blobs):
    h = hashlib.sha256()
    for b in blobs:
        h.update(b)
        h.update(b"\0")
    base = os.environ.get("MOAT_DEP_CACHE_DIR", "/var/tmp")
    return os.path.join(base, "%s-%s" % (prefix, h.hexdigest()[:16]))


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def _locked_build(d, build):
    """Runs build(d) under d.lock unless d is ready; returns d."""
    ready = os.path.join(d, "ready")
    if os.path.exists(ready):
        return d
    os.makedirs(os.path.dirname(d), exist_ok=True)
    with open(d + ".lock", "w") as lk:
        fcntl.flock(lk, fcntl.LOCK_EX)
        if os.path.exists(ready):
            return d
        shutil.rmtree(d, ignore_errors=True)
        try:
            build(d)
        except BaseException:
            shutil.rmtree(d, ignore_errors=True)
            raise
        with open(ready, "w") as f:
            f.write("ok\n")
    return d


def python_venv(requirements, prefix):
    """The python of a venv holding requirements (a requirements.txt path)."""
    d = _cache_dir(prefix, [_read(requirements), sys.version.encode()])

    def build(d):
        r = subprocess.run([sys.executable, "-m", "venv", d], capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise Unavailable("python -m venv failed (Debian: apt-get install python3-venv): " + r.stderr[-500:])
        try:
            r = subprocess.run([os.path.join(d, "bin", "python"), "-m", "pip", "install", "--disable-pip-version-check",
                                "-q", "-r", requirements], capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise Unavailable("pip install -r %s ran past %d s" % (requirements, INSTALL_TIMEOUT_S))
        if r.returncode != 0:
            raise Unavailable("pip install -r %s failed: %s" % (requirements, r.stderr[-800:]))

    return os.path.join(_locked_build(d, build), "bin", "python")


def node_modules(project, prefix):
    """The node_modules directory `npm ci` makes for project (a directory with package.json and
    package-lock.json)."""
    if not shutil.which("npm"):
        raise Unavailable("npm is missing (scripts/deps.sh installs Debian's nodejs and npm)")
    pkg, lock = os.path.join(project, "package.json"), os.path.join(project, "package-lock.json")
    node = subprocess.run(["node", "--version"], capture_output=True, text=True).stdout.strip()
    d = _cache_dir(prefix, [_read(pkg), _read(lock), node.encode()])

    def build(d):
        os.makedirs(d)
        shutil.copy(pkg, d)
        shutil.copy(lock, d)
        try:
            r = subprocess.run(["npm", "ci", "--ignore-scripts", "--no-audit", "--no-fund"], cwd=d,
                               capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise Unavailable("npm ci for %s ran past %d s" % (project, INSTALL_TIMEOUT_S))
        if r.returncode != 0:
            raise Unavailable("npm ci for %s failed: %s" % (project, (r.stdout + r.stderr)[-800:]))

    return os.path.join(_locked_build(d, build), "node_modules")

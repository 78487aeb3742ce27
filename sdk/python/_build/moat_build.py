"""moat_build.py -- the PEP 517 build backend of the moat SDK: standard library only, no build
requirements, so that `pip install ./sdk/python` works on a machine that reaches no package index
(pip's isolated build environment has nothing to download).

It builds a pure-Python wheel (moat/*.py and py.typed plus the .dist-info), an sdist, and an
editable wheel (a .pth file naming this source tree) for `pip install -e`. Name, version, summary
and requires-python come from pyproject.toml's [project] table; the long description is README.md.
"""

import base64
import hashlib
import io
import os
import re
import tarfile
import time
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "moat"


def _project():
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
        text = f.read()
    m = re.search(r"^\[project\]\s*$(.*?)(^\[|\Z)", text, re.M | re.S)
    table = m.group(1) if m else ""

    def field(name):
        fm = re.search(r'^%s\s*=\s*"([^"]*)"' % re.escape(name), table, re.M)
        if not fm:
            raise RuntimeError("pyproject.toml: [project] has no %s" % name)
        return fm.group(1)
    return {"name": field("name"), "version": field("version"), "summary": field("description"),
            "requires_python": field("requires-python")}


def _metadata():
    p = _project()
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    head = ("Metadata-Version: 2.1\nName: %s\nVersion: %s\nSummary: %s\nRequires-Python: %s\n"
            "Classifier: Programming Language :: Python :: 3\nClassifier: Typing :: Typed\n"
            "Description-Content-Type: text/markdown\n\n" % (p["name"], p["version"], p["summary"],
                                                             p["requires_python"]))
    return p, head + readme


def _package_files():
    out = []
    pkg = os.path.join(ROOT, PACKAGE)
    for name in sorted(os.listdir(pkg)):
        if name.endswith(".py") or name == "py.typed":
            out.append((PACKAGE + "/" + name, os.path.join(pkg, name)))
    return out


def _digest(data):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _write_wheel(wheel_directory, files):
    """files: list of (archive name, bytes). Adds the dist-info and returns the wheel's file name."""
    p, metadata = _metadata()
    dist = "%s-%s" % (p["name"], p["version"])
    info = dist + ".dist-info"
    files = list(files) + [
        (info + "/METADATA", metadata.encode("utf-8")),
        (info + "/WHEEL", b"Wheel-Version: 1.0\nGenerator: moat_build\nRoot-Is-Purelib: true\nTag: py3-none-any\n"),
        (info + "/top_level.txt", (PACKAGE + "\n").encode()),
    ]
    record = "".join("%s,%s,%d\n" % (n, _digest(d), len(d)) for n, d in files) + info + "/RECORD,,\n"
    files.append((info + "/RECORD", record.encode()))
    name = dist + "-py3-none-any.whl"
    stamp = time.gmtime(int(os.environ.get("SOURCE_DATE_EPOCH", "315532800")))[:6]
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        for n, d in files:
            zi = zipfile.ZipInfo(n, stamp)
            zi.external_attr = 0o644 << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, d)
    return name


def _read(path):
    with open(path, "rb") as f:
        return f.read()


# ---- PEP 517 hooks ----

def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _write_wheel(wheel_directory, [(n, _read(p)) for n, p in _package_files()])


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    return _write_wheel(wheel_directory, [(PACKAGE + "_editable.pth", (ROOT + "\n").encode())])


def build_sdist(sdist_directory, config_settings=None):
    p, metadata = _metadata()
    dist = "%s-%s" % (p["name"], p["version"])
    name = dist + ".tar.gz"
    members = [("pyproject.toml", os.path.join(ROOT, "pyproject.toml")), ("README.md", os.path.join(ROOT, "README.md")),
               ("_build/moat_build.py", os.path.abspath(__file__))] + _package_files()
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz", format=tarfile.PAX_FORMAT) as t:
        for arc, path in members + [("PKG-INFO", None)]:
            data = metadata.encode("utf-8") if path is None else _read(path)
            ti = tarfile.TarInfo(dist + "/" + arc)
            ti.size, ti.mode, ti.mtime = len(data), 0o644, 315532800
            t.addfile(ti, io.BytesIO(data))
    return name

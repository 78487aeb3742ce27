"""oci_archive.py -- a small OCI image archive made by hand for import tests: oci-layout, index.json,
a manifest, a config and one gzipped layer tar, each blob under its sha256 digest."""

import gzip
import hashlib
import io
import json
import os
import tarfile


def _arch():
    m = os.uname().machine
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(m, m)


def _tar(entries, gz=False):
    """A tar (bytes) of [(name, bytes)] (a name ending in '/' is a directory), fixed times, root-owned."""
    buf = io.BytesIO()
    out = gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) if gz else buf
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as t:
        for name, data in entries:
            ti = tarfile.TarInfo(name.rstrip("/"))
            ti.mtime = 1700000000
            if name.endswith("/"):
                ti.type, ti.mode = tarfile.DIRTYPE, 0o755
                t.addfile(ti)
                continue
            ti.size, ti.mode = len(data), 0o644
            t.addfile(ti, io.BytesIO(data))
    if gz:
        out.close()
    return buf.getvalue()



def make(files, env=None, workdir=None, cmd=None, ref="latest"):
    """The archive (bytes) of an image whose one layer holds only files ({path: bytes}, a path
    ending in '/' a directory: no /proc, /dev, ... of its own) and whose config has env (["K=V"]),
    workdir and cmd."""
    layer = _tar(sorted(files.items()), gz=True)
    diff_id = "sha256:" + hashlib.sha256(_tar(sorted(files.items()))).hexdigest()
    blobs = []

    def blob(data, media):
        d = hashlib.sha256(data).hexdigest()
        blobs.append(("blobs/sha256/" + d, data))
        return {"mediaType": media, "digest": "sha256:" + d, "size": len(data)}

    cfg = {}
    if env:
        cfg["Env"] = list(env)
    if workdir:
        cfg["WorkingDir"] = workdir
    if cmd:
        cfg["Cmd"] = list(cmd)
    config = {"architecture": _arch(), "os": "linux", "config": cfg,
              "rootfs": {"type": "layers", "diff_ids": [diff_id]}}
    ld = blob(layer, "application/vnd.oci.image.layer.v1.tar+gzip")
    cd = blob(json.dumps(config, sort_keys=True).encode(), "application/vnd.oci.image.config.v1+json")
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json", "config": cd,
                "layers": [ld]}
    md = blob(json.dumps(manifest, sort_keys=True).encode(), "application/vnd.oci.image.manifest.v1+json")
    md["annotations"] = {"org.opencontainers.image.ref.name": ref}
    index = {"schemaVersion": 2, "manifests": [md]}
    entries = [("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')] + blobs + \
        [("index.json", json.dumps(index).encode())]
    return _tar(entries)

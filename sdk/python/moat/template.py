"""template.py -- an organisation's templates: built from a Dockerfile and a build context, or
imported from an OCI image archive (``client.templates``).

    import moat

    client = moat.Client()
    t = client.templates.build("webapp", path="./app", on_log=lambda l: print(l.step, l.text))
    with moat.Sandbox.create("webapp", client=client) as sb:   # its CMD runs, its HEALTHCHECK passed
        print(sb.exec("curl -s localhost:8080").stdout)
"""

import io
import os
import re
import stat
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from typing import IO, Any, Callable, Dict, Iterator, List, Mapping, Optional, Tuple, Union
from urllib.parse import quote

from . import _check, errors
from ._http import SSEStream

_IGNORE_MAX_BYTES = 1 << 20


@dataclass
class Template:
    """A template (``source``: "builtin" for moatd's own, "dockerfile" or "oci" for an
    organisation's). ``state`` is building, ready or failed (moatd's own: also missing);
    ``usable``: a create can use it (some build of it was ready: a rebuild keeps serving the previous
    one); ``build_id``: its last build (``templates.logs``); ``from_``: its FROM, or the imported
    image's reference; ``config``: env, workdir, user, start, ready, exposed, labels, entrypoint,
    cmd, stopsignal; ``raw``: every field moatd sent."""
    name: str
    source: str
    state: str
    usable: bool = False
    build_id: Optional[str] = None
    from_: Optional[str] = None
    error: Optional[str] = None
    size_bytes: int = 0
    created_at: Optional[str] = None
    updated_at: Optional[str] = None
    built_at: Optional[str] = None
    config: Dict[str, Any] = field(default_factory=dict)
    raw: Dict[str, Any] = field(repr=False, default_factory=dict)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Template":
        usable = d.get("usable")
        if usable is None:  # moatd's own templates: usable once built
            usable = d.get("state") == "ready"
        return cls(name=d.get("name", ""), source=d.get("source", ""), state=d.get("state", ""), usable=bool(usable),
                   build_id=d.get("build_id"), from_=d.get("from"), error=d.get("error"),
                   size_bytes=int(d.get("size_bytes") or 0), created_at=d.get("created_at"),
                   updated_at=d.get("updated_at"), built_at=d.get("built_at"), config=dict(d.get("config") or {}),
                   raw=d)


@dataclass
class BuildLogLine:
    """One line of a build's log: the step (1 = FROM) and Dockerfile line it belongs to, its
    instruction, ``stream`` (stdout or stderr of a RUN, or "moat" for the builder's own lines such
    as ``CACHED ...``), the text, and ``time_ms`` since the build started."""
    step: int
    line: int
    instruction: str
    stream: str
    text: str
    time_ms: Optional[int] = None

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "BuildLogLine":
        return cls(step=int(d.get("step") or 0), line=int(d.get("line") or 0), instruction=d.get("instruction") or "",
                   stream=d.get("stream") or "", text=d.get("text") or "", time_ms=d.get("time_ms"))


@dataclass
class BuildEnd:
    """How a build ended: ``state`` ready or failed, with ``error`` naming the step when failed."""
    state: str
    error: Optional[str] = None
    image: Optional[str] = None
    size_bytes: Optional[int] = None

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "BuildEnd":
        return cls(state=d.get("state") or "", error=d.get("error"), image=d.get("image"),
                   size_bytes=d.get("size_bytes"))


class BuildLogs:
    """The log of one build (``templates.logs``): iterate for its ``BuildLogLine`` s; ``end`` is the
    ``BuildEnd`` once the stream has passed it (None while the build runs, or when the stream was
    not followed to the end). Close it (or use ``with``) to stop early: the build goes on."""

    def __init__(self, stream: SSEStream, follow: bool):
        self._s = stream
        self._follow = follow
        self.end: Optional[BuildEnd] = None

    def __iter__(self) -> Iterator[BuildLogLine]:
        try:
            while self.end is None:
                ev = self._s.next()
                if ev is None:
                    if self._follow:
                        raise self._s.lost("the build's end")
                    return
                if ev.name == "log" and isinstance(ev.data, dict):
                    yield BuildLogLine.from_json(ev.data)
                elif ev.name == "end" and isinstance(ev.data, dict):
                    self.end = BuildEnd.from_json(ev.data)
                elif ev.name == "error":
                    raise errors.error_from_event(ev.data, "build log")
        finally:
            if self.end is not None:
                self._s.close()

    def close(self) -> None:
        self._s.close()

    def __enter__(self) -> "BuildLogs":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# ---- the build context ----

def _ignore_rules(root: str) -> List[Tuple["re.Pattern[str]", bool]]:
    try:
        fd = os.open(os.path.join(root, ".dockerignore"), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return []
    with os.fdopen(fd, "rb") as f:
        text = f.read(_IGNORE_MAX_BYTES + 1)
    if len(text) > _IGNORE_MAX_BYTES:
        raise ValueError(".dockerignore is over %d bytes" % _IGNORE_MAX_BYTES)
    rules = []
    for line in text.decode("utf-8", "replace").splitlines():
        p = line.strip()
        if not p or p.startswith("#"):
            continue
        negate = p.startswith("!")
        if negate:
            p = p[1:]
        while p.startswith("/") or p.startswith("./"):
            p = p[1:] if p.startswith("/") else p[2:]
        p = p.rstrip("/")
        if p:
            rules.append((_pattern(p), negate))
    return rules


def _pattern(p: str) -> "re.Pattern[str]":
    """A .dockerignore pattern as a regex: '*' and '?' stop at '/', except in a pattern with "**",
    where every '*' crosses directories (as the CLI's); [...] is a class ([!...] negated)."""
    star = ".*" if "**" in p else "[^/]*"
    out, i = [], 0
    while i < len(p):
        c = p[i]
        if c == "*":
            while i + 1 < len(p) and p[i + 1] == "*":
                i += 1
            out.append(star)
        elif c == "?":
            out.append("[^/]")
        elif c == "[" and "]" in p[i + 2:]:
            j = p.index("]", i + 2)
            body = p[i + 1:j]
            if body.startswith("!"):
                body = "^" + body[1:]
            out.append("[" + body.replace("\\", "\\\\") + "]")
            i = j
        elif c == "\\" and i + 1 < len(p):
            i += 1
            out.append(re.escape(p[i]))
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out), re.S)


def _excluded(rules: List[Tuple["re.Pattern[str]", bool]], rel: str) -> bool:
    out = False
    parts = rel.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(len(parts), 0, -1)]
    for rx, negate in rules:  # the last rule that matches decides
        if any(rx.fullmatch(x) for x in prefixes):
            out = not negate
    return out


def context_tar(path: str, out: IO[bytes], keep: Tuple[str, ...] = ("Dockerfile",)) -> Tuple[int, int]:
    """Writes directory path as a tar to out: files, directories and symbolic links, sorted by name,
    without owners. A link is stored as a link and never followed (moatd refuses one that leads out
    of the context); a file is opened without following links and must be the file listed. Paths
    that path's .dockerignore excludes are left out (one pattern a line, '#' comments, '!'
    re-includes, the last matching line decides, a pattern matching a directory excludes what is
    beneath it), except ``keep`` and .dockerignore itself. Returns (files, bytes) sent."""
    root = os.path.abspath(path)
    if not os.path.isdir(root):
        raise ValueError("path %r is not a directory" % path)
    rules = _ignore_rules(root)
    kept = set(keep) | {".dockerignore"}
    any_negate = any(n for _, n in rules)
    counts = [0, 0]

    def info(rel: str, st: os.stat_result, kind: bytes) -> tarfile.TarInfo:
        ti = tarfile.TarInfo(rel)
        ti.type = kind
        ti.mode = stat.S_IMODE(st.st_mode)
        ti.mtime = int(st.st_mtime)
        ti.uid = ti.gid = 0
        ti.uname = ti.gname = ""
        return ti

    def walk(t: tarfile.TarFile, d: str, rel: str) -> None:
        for name in sorted(os.listdir(d)):
            full = os.path.join(d, name)
            child = rel + "/" + name if rel else name
            st = os.lstat(full)
            skip = child not in kept and _excluded(rules, child)
            if stat.S_ISDIR(st.st_mode):
                if skip and not any_negate and not any(k.startswith(child + "/") for k in kept):
                    continue
                if not skip:
                    t.addfile(info(child, st, tarfile.DIRTYPE))
                walk(t, full, child)
            elif skip:
                continue
            elif stat.S_ISREG(st.st_mode):
                fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
                with os.fdopen(fd, "rb") as f:
                    fst = os.fstat(fd)
                    if not stat.S_ISREG(fst.st_mode) or (fst.st_ino, fst.st_dev) != (st.st_ino, st.st_dev):
                        raise ValueError("%s changed while it was read" % child)
                    ti = info(child, fst, tarfile.REGTYPE)
                    ti.size = fst.st_size
                    t.addfile(ti, f)
                counts[0] += 1
                counts[1] += ti.size
            elif stat.S_ISLNK(st.st_mode):
                ti = info(child, st, tarfile.SYMTYPE)
                ti.linkname = os.readlink(full)
                t.addfile(ti)

    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as t:
        walk(t, root, "")
    return counts[0], counts[1]


def _size_of(f: Any) -> Optional[int]:
    try:
        pos = f.tell()
        end = f.seek(0, io.SEEK_END)
        f.seek(pos)
        return int(end - pos)
    except (AttributeError, OSError, ValueError):
        return None


class Templates:
    """``client.templates``: build, import, get, list, delete and read the logs of the
    organisation's templates (and list moatd's own). Errors are the SDK's typed ones with moatd's
    code: InvalidRequestError for a Dockerfile syntax error (the message names the line), an unknown
    FROM, a missing COPY source or a context with .., absolute paths or links leading out of it
    (also a context over moatd's limit, HTTP 413); ConflictError ``template_building`` while a build
    of that name runs, ``already_exists`` for a name of moatd's own; NotFoundError for a template
    the organisation does not have. A build that fails raises BuildError."""

    def __init__(self, client: Any):
        self._c = client

    @staticmethod
    def _path(name: str, suffix: str = "") -> str:
        return "/v1/templates/" + quote(name, safe="") + suffix

    def get(self, name: str) -> Template:
        """The template (NotFoundError when none of that name)."""
        _check.string("name", name)
        return Template.from_json(self._c._t.request("GET", self._path(name))[1])

    def list(self) -> List[Template]:
        """moatd's own templates, then the organisation's."""
        return [Template.from_json(t) for t in self._c._t.request("GET", "/v1/templates")[1].get("templates", [])]

    def delete(self, name: str) -> None:
        """Deletes the organisation's template: sandboxes made from it keep running (SandboxError
        ``forbidden`` for moatd's own, ConflictError ``template_building`` while it builds)."""
        _check.string("name", name)
        self._c._t.request("DELETE", self._path(name), timeout=self._c.lifecycle_timeout)

    def logs(self, name: str, build_id: str, follow: bool = False) -> BuildLogs:
        """The log of build build_id of template name (``Template.build_id``): what it has so far,
        or with follow=True everything up to the build's end (then ``BuildLogs.end`` tells how it
        ended). NotFoundError for a build that is not this template's."""
        _check.string("name", name)
        _check.string("build_id", build_id)
        _check.boolean("follow", follow, optional=False)
        s = self._c._t.stream("GET", self._path(name, "/builds/%s/logs" % quote(build_id, safe="")),
                              query={"follow": "true"} if follow else None)
        return BuildLogs(s, follow)

    def build(self, name: str, path: str = ".", dockerfile: Optional[str] = None,
              build_args: Optional[Mapping[str, str]] = None, on_log: Optional[Callable[[BuildLogLine], Any]] = None,
              wait: bool = True, timeout: Optional[float] = None) -> Template:
        """Builds template name ([a-z0-9][a-z0-9._-]{0,62}) from the directory path (the build
        context, sent as a tar: see ``context_tar``; links are sent as links, never followed) and
        its Dockerfile (``dockerfile``: its path inside path, default "Dockerfile"), with
        ``build_args`` for its ARGs. With wait (the default), follows the build's log, calling
        on_log for each line, and returns the ready template, or raises BuildError (its ``error``
        names the failed step and its last output lines) when the build failed; ``timeout``
        seconds bound the wait (TimeoutError; the build goes on). With wait=False, returns at
        once (state "building"; follow it with ``logs(name, t.build_id, follow=True)``)."""
        _check.string("name", name)
        _check.string("path", path)
        _check.string("dockerfile", dockerfile, optional=True)
        _check.boolean("wait", wait, optional=False)
        _check.number("timeout", timeout, lo=0)
        if on_log is not None and not callable(on_log):
            raise TypeError("on_log must be callable, got %s" % type(on_log).__name__)
        query: Dict[str, Any] = {}
        if dockerfile is not None:
            query["dockerfile"] = dockerfile
        if build_args is not None:
            if not isinstance(build_args, Mapping):
                raise TypeError("build_args must be a mapping, got %s" % type(build_args).__name__)
            for k, v in build_args.items():
                _check.string("build_args key", k)
                _check.string("build_args[%r]" % k, v, empty=True)
                query["build_arg." + k] = v
        with tempfile.TemporaryFile() as tar:
            context_tar(path, tar, keep=(dockerfile or "Dockerfile",))
            size = tar.tell()
            tar.seek(0)
            d = self._c._t.request("POST", self._path(name), body=tar, query=query,
                                   headers={"Content-Type": "application/x-tar", "Content-Length": str(size)},
                                   timeout=self._c.lifecycle_timeout)[1]
        t = Template.from_json(d)
        if not wait:
            return t
        logs = self.logs(name, t.build_id or "", follow=True)
        if timeout is not None:
            logs._s.deadline = time.monotonic() + timeout
        with logs:
            for line in logs:
                if on_log is not None:
                    on_log(line)
        end = logs.end
        if end is None or end.state != "ready":
            raise errors.BuildError("template %s: build %s failed: %s" % (name, t.build_id, end.error if end else "?"),
                                    template=name, build_id=t.build_id, error=end.error if end else None)
        return self.get(name)

    def rebuild(self, name: str) -> Template:
        """Rebuilds one of moatd's own templates (base, code-interpreter) from its recipe and returns
        it once built (NotFoundError for a name without a recipe)."""
        _check.string("name", name)
        return Template.from_json(self._c._t.request("POST", self._path(name, "/build"), timeout=None)[1])

    def import_image(self, name: str, path_or_fileobj: Union[str, "os.PathLike[str]", IO[bytes]]) -> Template:
        """Imports an OCI image archive (oci-archive, or ``docker save``'s tar) as template name:
        its layers in order with whiteouts, and its config's Env, WorkingDir, User and
        Entrypoint/Cmd. path_or_fileobj is a file's path or a binary file object read from where
        it is. InvalidRequestError for an archive that is not one, or whose layer leads out of the
        root."""
        _check.string("name", name)
        if isinstance(path_or_fileobj, (str, os.PathLike)):
            with open(path_or_fileobj, "rb") as f:
                return self._import(name, f)
        if not hasattr(path_or_fileobj, "read"):
            raise TypeError("path_or_fileobj must be a path or a binary file object, got %s"
                            % type(path_or_fileobj).__name__)
        return self._import(name, path_or_fileobj)

    def _import(self, name: str, f: IO[bytes]) -> Template:
        size = _size_of(f)
        body: Any = f
        if size is None:
            body = f.read()
            size = len(body)
        d = self._c._t.request("POST", self._path(name, "/import"), body=body,
                               headers={"Content-Type": "application/x-tar", "Content-Length": str(size)},
                               timeout=self._c.lifecycle_timeout)[1]
        return Template.from_json(d)

"""Templates from a Dockerfile: POST /v1/templates/{name} with a tar of the build context, the
build's log as SSE, creates that start the template's server and wait for its HEALTHCHECK, the
step cache, bad input, another org's key, DELETE while a sandbox runs, and a moatd restart."""

import gzip
import io
import os
import sys
import tarfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))

import moatd  # noqa: E402
import sse  # noqa: E402
from moattest import DaemonTest, HTTPError  # noqa: E402

SERVER = r'''
import http.server, os, sys
port = int(sys.argv[sys.argv.index("--port") + 1])
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/health":
            body = b"ok"
        elif self.path == "/greeting":
            body = open("/srv/app/greeting.txt", "rb").read()
        elif self.path == "/whoami":
            body = ("%d %s %s" % (os.getuid(), os.getcwd(), os.environ.get("APP_HOME", ""))).encode()
        else:
            self.send_response(404); self.end_headers(); return
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
'''

DOCKERFILE = '''# syntax=docker/dockerfile:1
ARG BASE=base
FROM ${BASE}
ARG GREETING=hello
ENV APP_HOME=/srv/app PORT=8080
LABEL team="agents" version="1"
WORKDIR /srv/app
COPY app/ ./
COPY --chown=user:user --chmod=0640 secret.txt /home/user/secret.txt
ADD data.tar.gz /srv/data/
RUN echo "$GREETING from $(whoami)" > /srv/app/greeting.txt && echo built-line-1 && echo to-stderr >&2
RUN ["/bin/sh", "-c", "mkdir -p /srv/run && echo exec-form > /srv/run/form && rm -f /etc/motd"]
USER user
EXPOSE 8080
HEALTHCHECK --interval=1s CMD curl -fsS http://127.0.0.1:8080/health
ENTRYPOINT ["python3", "/srv/app/server.py"]
CMD ["--port", "8080"]
'''


def tar_of(files):
    """A tar (bytes) of {name: bytes | (bytes, mode) | ("symlink", target)}."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for name, v in files.items():
            ti = tarfile.TarInfo(name)
            ti.mtime = 1700000000
            if isinstance(v, tuple) and v[0] == "symlink":
                ti.type = tarfile.SYMTYPE
                ti.linkname = v[1]
                t.addfile(ti)
                continue
            data, mode = v if isinstance(v, tuple) else (v, 0o644)
            ti.size, ti.mode = len(data), mode
            t.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def targz_of(files):
    """A .tar.gz with fixed times (gzip's header too), so that the same files give the same bytes."""
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz:
        with tarfile.open(fileobj=gz, mode="w") as t:
            for name, data in files.items():
                ti = tarfile.TarInfo(name)
                ti.size, ti.mtime = len(data), 1700000000
                t.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def context(dockerfile=DOCKERFILE, greeting_file=b"v1\n"):
    return tar_of({
        "Dockerfile": dockerfile.encode(),
        "app/server.py": SERVER.encode(),
        "app/VERSION": greeting_file,
        "secret.txt": b"s3cret\n",
        "data.tar.gz": targz_of({"inner/a.txt": b"from the tar\n"}),
    })


def build(client, name, ctx, query=None, expect=202):
    return client.request("POST", "/v1/templates/" + name, raw=ctx, query=query,
                          headers={"Content-Type": "application/x-tar"}, expect=expect, timeout=120)[1]


def follow(client, name, build_id, timeout=900):
    """The build's log events until its end event: (log records, end record)."""
    s = sse.open(client, "GET", "/v1/templates/%s/builds/%s/logs" % (name, build_id),
                 query={"follow": "true"})
    logs, end = [], None
    deadline = time.time() + timeout
    try:
        while end is None:
            ev = s.next(max(1, deadline - time.time()))
            if ev is None:
                break
            if ev.name == "end":
                end = ev.data
            elif ev.name == "log":
                logs.append(ev.data)
            else:
                raise AssertionError("unexpected event %r" % (ev,))
    finally:
        s.close()
    return logs, end


class TemplateBuildTest(DaemonTest):
    pool = 0

    def build_ok(self, name, ctx, **kw):
        t = build(self.c, name, ctx, **kw)
        self.assertEqual(t["state"], "building", t)
        self.assertTrue(t["build_id"].startswith("bd-"), t)
        logs, end = follow(self.c, name, t["build_id"])
        self.assertIsNotNone(end, logs[-20:])
        self.assertEqual(end["state"], "ready", (end, logs[-20:]))
        self.addCleanup(self._delete_template, name)
        return t, logs

    def _delete_template(self, name):
        try:
            self.c.request("DELETE", "/v1/templates/" + name, expect=(204, 404))
        except Exception:
            pass

    def test_every_instruction_cache_and_start(self):
        t, logs = self.build_ok("webapp", context())
        texts = [(r["step"], r["stream"], r["text"]) for r in logs]
        self.assertTrue(any(s == "stdout" and x == "built-line-1" for _, s, x in texts), texts)
        self.assertTrue(any(s == "stderr" and x == "to-stderr" for _, s, x in texts), texts)
        run_step = [st for st, s, x in texts if x == "built-line-1"][0]
        self.assertEqual(run_step, 9, "the RUN is the 9th instruction (the ARG before FROM is none)")

        got = self.c.request("GET", "/v1/templates/webapp")[1]
        self.assertEqual(got["state"], "ready", got)
        self.assertEqual(got["source"], "dockerfile")
        self.assertEqual(got["from"], "base")
        self.assertGreater(got["size_bytes"], 1 << 20)
        cfg = got["config"]
        self.assertEqual(cfg["start"], ["python3", "/srv/app/server.py", "--port", "8080"], cfg)
        self.assertEqual(cfg["user"], "user")
        self.assertEqual(cfg["workdir"], "/srv/app")
        self.assertIn("APP_HOME=/srv/app", cfg["env"])
        self.assertEqual(cfg["labels"], {"team": "agents", "version": "1"})
        self.assertEqual(cfg["exposed"], ["8080/tcp"])
        self.assertEqual(cfg["ready"]["argv"][:2], ["/bin/sh", "-c"])
        names = [x["name"] for x in self.c.request("GET", "/v1/templates")[1]["templates"]]
        self.assertIn("webapp", names)
        self.assertIn("base", names)

        # create waits for the HEALTHCHECK: the server answers at once
        sb = self.sandbox(template="webapp")
        self.assertEqual(sb["template"], "webapp")
        sid = sb["id"]
        r = self.c.exec(sid, argv=["curl", "-fsS", "http://127.0.0.1:8080/greeting"])
        self.assertEqual(r["exit_code"], 0, r)
        self.assertEqual(r["stdout"], "hello from root\n")
        r = self.c.exec(sid, argv=["curl", "-fsS", "http://127.0.0.1:8080/whoami"])
        self.assertEqual(r["stdout"], "1000 /srv/app /srv/app", r)
        r = self.c.exec(sid, argv=["sh", "-c", "stat -c '%U:%G %a' /home/user/secret.txt; cat /srv/data/inner/a.txt; "
                              "cat /srv/run/form; cat /srv/app/VERSION; test -e /etc/motd || echo no-motd; "
                              "echo $APP_HOME $PORT"])
        self.assertEqual(r["stdout"], "user:user 640\nfrom the tar\nexec-form\nv1\nno-motd\n/srv/app 8080\n", r)
        # an exec naming no user or cwd gets the image's USER and WORKDIR, as docker exec does
        r = self.c.exec(sid, argv=["sh", "-c", "id -un; pwd; cat VERSION"])
        self.assertEqual(r["stdout"], "user\n/srv/app\nv1\n", r)
        r = self.c.exec(sid, argv=["sh", "-c", "id -un; pwd"], user="root")
        self.assertEqual(r["stdout"], "root\n/srv/app\n", r)
        r = self.c.exec(sid, argv=["pwd"], cwd="/tmp")
        self.assertEqual(r["stdout"], "/tmp\n", r)
        r = self.c.exec(sid, argv=["id", "-u"], user="1000")
        self.assertEqual(r["stdout"], "1000\n", r)
        procs = self.c.request("GET", "/v1/sandboxes/%s/processes" % sid)[1]
        self.assertTrue(any(p.get("tag") == "start" for p in procs["processes"]), procs)
        # no build sandbox is left behind
        left = [s for s in self.c.list() if s.get("metadata", {}).get("moat.build")]
        self.assertEqual(left, [])

        # a rebuild with only the last line changed runs no step again
        t2, logs2 = self.build_ok("webapp", context(DOCKERFILE.replace('"8080"]', '"8080", "--x"]')))
        self.assertNotEqual(t2["build_id"], t["build_id"])
        cached = [r["step"] for r in logs2 if r["text"].startswith("CACHED ")]
        self.assertEqual(cached, [5, 6, 7, 8, 9, 10], [r["text"] for r in logs2])
        # a changed file in the context rebuilds its COPY and what follows, not what precedes
        t3, logs3 = self.build_ok("webapp", context(greeting_file=b"v2\n"))
        cached = [r["step"] for r in logs3 if r["text"].startswith("CACHED ")]
        self.assertEqual(cached, [5], [r["text"] for r in logs3])
        sb3 = self.sandbox(template="webapp")
        r = self.c.exec(sb3["id"], argv=["cat", "/srv/app/VERSION"])
        self.assertEqual(r["stdout"], "v2\n")
        # the sandbox made from the first build still has its own files
        r = self.c.exec(sid, argv=["cat", "/srv/app/VERSION"])
        self.assertEqual(r["stdout"], "v1\n")

    def test_failing_run_names_the_step_and_keeps_the_last_build(self):
        df = "FROM base\nRUN echo first > /f\nRUN echo about-to-fail; exit 3\n"
        t = build(self.c, "failing", tar_of({"Dockerfile": df.encode()}))
        self.addCleanup(self._delete_template, "failing")
        logs, end = follow(self.c, "failing", t["build_id"])
        self.assertEqual(end["state"], "failed", end)
        self.assertIn("step 3", end["error"])
        self.assertIn("exited 3", end["error"])
        self.assertIn("about-to-fail", end["error"])
        got = self.c.request("GET", "/v1/templates/failing")[1]
        self.assertEqual(got["state"], "failed")
        self.assertFalse(got["usable"])
        with self.assertRaises(HTTPError) as cm:
            self.c.create(template="failing")
        self.assertEqual(cm.exception.status, 409, cm.exception.body)
        self.assertEqual(cm.exception.body["code"], "template_not_ready")
        self.assertEqual([s for s in self.c.list() if s.get("metadata", {}).get("moat.build")], [])

    def test_bad_input(self):
        def bad(ctx, status=400, **kw):
            with self.assertRaises(HTTPError) as cm:
                build(self.c, kw.pop("name", "badone"), ctx, **kw)
            self.assertEqual(cm.exception.status, status, cm.exception.body)
            return cm.exception.body["message"]

        msg = bad(tar_of({"Dockerfile": b"FROM base\nRUN true\nFROBNICATE x\n"}))
        self.assertIn("line 3", msg)
        msg = bad(tar_of({"Dockerfile": b"FROM python:3.12\n"}))
        self.assertIn("FROM python:3.12", msg)
        msg = bad(tar_of({"Dockerfile": b"FROM base\n", "../escape": b"x"}))
        self.assertIn("..", msg)
        msg = bad(tar_of({"Dockerfile": b"FROM base\n", "/abs": b"x"}))
        bad(tar_of({"Dockerfile": b"FROM base\n", "link": ("symlink", "/etc/passwd")}))
        bad(tar_of({"Dockerfile": b"FROM base\n", "link": ("symlink", "../../x")}))
        msg = bad(tar_of({"Other": b"FROM base\n"}))
        self.assertIn("Dockerfile", msg)
        bad(tar_of({"Dockerfile": b"FROM base\n"}), name="base", status=409)
        bad(tar_of({"Dockerfile": b"FROM base\n"}), name="Bad_Name", status=404)  # the router: not a name
        bad(tar_of({"Dockerfile": b"FROM base\n"}), query={"nope": "1"})
        bad(b"this is not a tar archive at all" * 40)
        # COPY of a source the context does not have fails the build, naming it
        msg = bad(tar_of({"Dockerfile": b"FROM base\nCOPY missing.txt /x\n"}))
        self.assertIn("missing.txt", msg)
        # nothing was recorded for any of them
        names = [x["name"] for x in self.c.request("GET", "/v1/templates")[1]["templates"]]
        self.assertNotIn("badone", names)
        with self.assertRaises(HTTPError) as cm:
            self.c.request("GET", "/v1/templates/badone")
        self.assertEqual(cm.exception.status, 404)

    def test_other_org_and_delete_while_used(self):
        df = "FROM base\nRUN echo mine > /owner\n"
        self.build_ok("privy", tar_of({"Dockerfile": df.encode()}))
        other = self.c.with_key(self.daemon.new_org_key("org-b"))
        for method, path in (("GET", "/v1/templates/privy"), ("DELETE", "/v1/templates/privy")):
            with self.assertRaises(HTTPError) as cm:
                other.request(method, path)
            self.assertEqual(cm.exception.status, 404, (method, cm.exception.body))
        with self.assertRaises(HTTPError) as cm:
            other.create(template="privy")
        self.assertEqual(cm.exception.status, 400, cm.exception.body)
        self.assertNotIn("privy", [x["name"] for x in other.request("GET", "/v1/templates")[1]["templates"]])
        # the other org cannot build FROM it either
        with self.assertRaises(HTTPError) as cm:
            build(other, "copycat", tar_of({"Dockerfile": b"FROM privy\n"}))
        self.assertEqual(cm.exception.status, 400, cm.exception.body)

        sb = self.sandbox(template="privy")
        images = os.path.join(self.daemon.data_dir, "images")
        before = set(os.listdir(images))
        self.c.request("DELETE", "/v1/templates/privy", expect=204)
        with self.assertRaises(HTTPError) as cm:
            self.c.request("GET", "/v1/templates/privy")
        self.assertEqual(cm.exception.status, 404)
        r = self.c.exec(sb["id"], argv=["cat", "/owner"])
        self.assertEqual(r["stdout"], "mine\n")
        self.assertEqual(set(os.listdir(images)), before, "an image a live sandbox uses was removed")
        self.c.request("DELETE", "/v1/sandboxes/" + sb["id"], expect=204)
        # the next removal of unused images (a delete, a build's end, a restart) takes it
        self.c.request("DELETE", "/v1/templates/privy", expect=404)
        self.daemon.stop(keep_data=True)
        self.daemon.start()
        self.assertEqual([x for x in os.listdir(images) if x in before and not x.endswith(".tmp")], [],
                         os.listdir(images))


class TemplateRestartTest(DaemonTest):
    pool = 0

    def test_template_survives_restart_and_kill9(self):
        t = build(self.c, "durable", tar_of({"Dockerfile": b"FROM base\nRUN echo kept > /kept\n"}))
        logs, end = follow(self.c, "durable", t["build_id"])
        self.assertEqual(end["state"], "ready", end)
        self.daemon.kill9()
        self.daemon.start()
        got = self.c.request("GET", "/v1/templates/durable")[1]
        self.assertEqual(got["state"], "ready", got)
        sb = self.sandbox(template="durable")
        self.assertEqual(self.c.exec(sb["id"], argv=["cat", "/kept"])["stdout"], "kept\n")
        # the log of the last build is still served after the restart
        logs2, end2 = follow(self.c, "durable", t["build_id"])
        self.assertEqual(end2["state"], "ready")
        # a build cut short by a crash is failed at the next start, with nothing half made
        t2 = build(self.c, "cutshort", tar_of({"Dockerfile": b"FROM base\nRUN sleep 30\n"}))
        time.sleep(2)
        self.daemon.kill9()
        self.daemon.start()
        got = self.c.request("GET", "/v1/templates/cutshort")[1]
        self.assertEqual(got["state"], "failed", got)
        self.assertIn("moatd stopped", got["error"])
        images = os.path.join(self.daemon.data_dir, "images")
        self.assertEqual([x for x in os.listdir(images) if ".tmp-" in x], [])
        self.assertNotEqual(t2["build_id"], t["build_id"])


BAKE_DOCKERFILE = '''FROM base
COPY server.py /srv/app/server.py
RUN echo baked > /srv/app/greeting.txt
EXPOSE 8080
HEALTHCHECK CMD curl -fsS http://127.0.0.1:8080/health
CMD ["sh", "-c", "od -An -N8 -tx8 /dev/urandom > /tmp/boot; exec python3 /srv/app/server.py --port 8080"]
'''


class TemplateBakeTest(DaemonTest):
    """The first create of a template with a start command bakes its ready state into a checkpoint;
    later creates that ask for nothing it depends on restore it (the server already listening)."""
    pool = 0

    def test_second_create_restores_the_first_ones_ready_state(self):
        from test_timetravel_ckpt import checkpoints
        available, why = checkpoints(self.c)
        if not available:
            self.skipTest("checkpoints unavailable on this host: %s" % why)
        ctx = tar_of({"Dockerfile": BAKE_DOCKERFILE.encode(), "server.py": SERVER.encode()})
        t = build(self.c, "baked", ctx)
        self.addCleanup(lambda: self.c.request("DELETE", "/v1/templates/baked", expect=(204, 404)))
        self.assertEqual(follow(self.c, "baked", t["build_id"])[1]["state"], "ready")

        def boot(sid):
            r = self.c.exec(sid, argv=["cat", "/tmp/boot"])
            self.assertEqual(r["exit_code"], 0, r)
            return r["stdout"]

        first = self.sandbox(template="baked")["id"]
        second = self.sandbox(template="baked")["id"]
        # the second is the first's start state restored: the same boot token, the server answering
        self.assertEqual(boot(first), boot(second), "not restored from the baked state; moatd's log:\n" +
                         "\n".join(ln for ln in self.daemon.log_tail(200).splitlines() if "template" in ln))
        r = self.c.exec(second, argv=["curl", "-fsS", "http://127.0.0.1:8080/greeting"])
        self.assertEqual(r["stdout"], "baked\n", r)
        sb = self.c.request("GET", "/v1/sandboxes/" + second)[1]
        self.assertEqual(sb["template"], "baked")
        # the two run apart from there on
        self.c.exec(second, argv=["sh", "-c", "echo mine > /tmp/own"])
        self.assertNotEqual(self.c.exec(first, argv=["cat", "/tmp/own"])["exit_code"], 0)
        # a create with env of its own starts the command afresh
        third = self.sandbox(template="baked", env={"MODE": "x"})["id"]
        self.assertNotEqual(boot(third), boot(first))
        self.assertEqual(self.c.exec(third, argv=["sh", "-c", "echo $MODE"])["stdout"], "x\n")
        # a rebuild with another start command is not served from the old state
        ctx2 = tar_of({"Dockerfile": BAKE_DOCKERFILE.replace("/tmp/boot;", "/tmp/boot; echo v2 > /tmp/v;").encode(),
                       "server.py": SERVER.encode()})
        t2 = build(self.c, "baked", ctx2)
        self.assertEqual(follow(self.c, "baked", t2["build_id"])[1]["state"], "ready")
        fourth = self.sandbox(template="baked")["id"]
        self.assertNotEqual(boot(fourth), boot(first))
        self.assertEqual(self.c.exec(fourth, argv=["cat", "/tmp/v"])["stdout"], "v2\n")


class TemplateLimitsTest(DaemonTest):
    """--build-context-max-mb bounds a context's file data (413, nothing recorded); a build that fails
    leaves a build running beside it unaffected."""
    pool = 0

    @classmethod
    def setUpClass(cls):
        cls.daemon = moatd.MoatDaemon(pool=0, extra_args=["--build-context-max-mb", "1"])
        try:
            cls.daemon.start()
        except Exception:
            cls.daemon.stop()
            raise
        cls.c = cls.daemon.client

    def test_context_limit(self):
        big = os.urandom(3 << 20)  # 3 MiB of file data in a 3 MiB tar: under the upload's bound, over the data's
        builds = os.path.join(self.daemon.data_dir, "builds")
        before = sorted(os.listdir(builds)) if os.path.isdir(builds) else []
        with self.assertRaises(HTTPError) as cm:
            build(self.c, "toobig", tar_of({"Dockerfile": b"FROM base\n", "big.bin": big}))
        self.assertEqual(cm.exception.status, 413, cm.exception.body)
        with self.assertRaises(HTTPError) as cm:
            self.c.request("GET", "/v1/templates/toobig")
        self.assertEqual(cm.exception.status, 404)
        self.assertEqual(sorted(os.listdir(builds)) if os.path.isdir(builds) else [], before)

    def test_a_failing_build_beside_a_good_one(self):
        good = build(self.c, "good", tar_of({"Dockerfile": b"FROM base\nRUN sleep 1 && echo ok > /ok\n"}))
        bad = build(self.c, "bad", tar_of({"Dockerfile": b"FROM base\nRUN exit 7\n"}))
        self.addCleanup(lambda: self.c.request("DELETE", "/v1/templates/good", expect=(204, 404)))
        self.addCleanup(lambda: self.c.request("DELETE", "/v1/templates/bad", expect=(204, 404)))
        self.assertEqual(follow(self.c, "bad", bad["build_id"])[1]["state"], "failed")
        self.assertEqual(follow(self.c, "good", good["build_id"])[1]["state"], "ready")
        sb = self.sandbox(template="good")
        self.assertEqual(self.c.exec(sb["id"], argv=["cat", "/ok"])["stdout"], "ok\n")
        # a second build of a template while one runs is refused, and the first goes on
        again = build(self.c, "good", tar_of({"Dockerfile": b"FROM base\nRUN sleep 2\n"}))
        with self.assertRaises(HTTPError) as cm:
            build(self.c, "good", tar_of({"Dockerfile": b"FROM base\n"}))
        self.assertEqual((cm.exception.status, cm.exception.body["code"]), (409, "template_building"))
        with self.assertRaises(HTTPError) as cm:
            self.c.request("DELETE", "/v1/templates/good")
        self.assertEqual(cm.exception.status, 409)
        self.assertEqual(follow(self.c, "good", again["build_id"])[1]["state"], "ready")

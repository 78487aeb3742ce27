"""e2b_scenarios.py -- the unmodified Python E2B SDKs (PyPI `e2b`, `e2b-code-interpreter`, pinned in
requirements.txt) against moatd.

Usage: PYTHON e2b_scenarios.py SCENARIO, run with the venv's python and only E2B_API_URL,
E2B_SANDBOX_URL and E2B_API_KEY set (tests/integration/test_e2b_python.py does that; MOAT_URL is
moatd's v1 base for cross-checks). Prints "ok SCENARIO" and exits 0, or the failure and exits 1.
Every sandbox a scenario makes is killed at the end, also when it fails."""

import asyncio
import json
import os
import sys
import time
import urllib.request

made = []


def v1(method, path, body=None):
    req = urllib.request.Request(os.environ["MOAT_URL"] + path, method=method,
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Authorization": "Bearer " + os.environ["E2B_API_KEY"],
                                          "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read() or b"null")


def track(sbx):
    made.append(sbx.sandbox_id)
    return sbx


def control():
    from e2b import Sandbox, SandboxQuery, NotFoundException
    tag = "py-%d" % os.getpid()
    a = track(Sandbox.create("base", timeout=120, metadata={"suite": tag, "n": "0"}, envs={"GREETING": "hi py"}))
    time.sleep(0.01)
    b = track(Sandbox.create("base", timeout=120, metadata={"suite": tag, "n": "1"}, allow_internet_access=False))
    info = a.get_info()
    assert info.sandbox_id == a.sandbox_id and info.template_id == "base", info
    assert info.metadata == {"suite": tag, "n": "0"}, info.metadata
    assert a.is_running()
    # allow_internet_access=False: loopback only (v1 shows the policy)
    assert v1("GET", "/v1/sandboxes/%s/network" % b.sandbox_id)["policy"]["internet"] is False
    # list: newest first, paging by next_token, the metadata filter
    pager = Sandbox.list(query=SandboxQuery(metadata={"suite": tag}), limit=1)
    ids = []
    while pager.has_next:
        ids += [s.sandbox_id for s in pager.next_items()]
        assert len(ids) <= 2, ids
    assert ids == [b.sandbox_id, a.sandbox_id], ids
    m = a.get_metrics()
    assert m and m[-1].cpu_count >= 1 and m[-1].mem_total > 0, m
    a.set_timeout(200)
    c = Sandbox.connect(a.sandbox_id)
    assert c.commands.run("echo $GREETING").stdout == "hi py\n"
    assert Sandbox.kill(b.sandbox_id) is True
    assert Sandbox.kill(b.sandbox_id) is False
    try:
        Sandbox.connect(b.sandbox_id)
        raise AssertionError("connected to a killed sandbox")
    except NotFoundException:
        pass


def envd():
    from e2b import Sandbox, CommandExitException
    sbx = track(Sandbox.create("base", timeout=120))
    r = sbx.commands.run("echo out; echo err >&2; id -un")
    assert (r.exit_code, r.stdout, r.stderr) == (0, "out\nuser\n", "err\n"), r
    try:
        sbx.commands.run("exit 3")
        raise AssertionError("no CommandExitException")
    except CommandExitException as e:
        assert e.exit_code == 3
    seen = []
    r = sbx.commands.run("for i in 1 2 3; do echo line$i; done", on_stdout=seen.append)
    assert "".join(seen) == "line1\nline2\nline3\n", seen
    # files: write (missing parents made), read, list, exists, remove
    sbx.files.write("/home/user/deep/er/hello.txt", "hello py\n")
    assert sbx.files.read("/home/user/deep/er/hello.txt") == "hello py\n"
    names = [e.name for e in sbx.files.list("/home/user/deep/er")]
    assert names == ["hello.txt"], names
    assert sbx.files.exists("/home/user/deep/er/hello.txt")
    sbx.files.remove("/home/user/deep")
    assert not sbx.files.exists("/home/user/deep")
    # watch_dir (the sync SDK polls GetWatcherEvents): a write is envd's create, chmod, write
    from e2b import FilesystemEventType as T
    sbx.files.make_dir("/home/user/w/sub")
    wh = sbx.files.watch_dir("/home/user/w", recursive=True)
    sbx.files.write("/home/user/w/sub/f.txt", "watched")
    events, deadline = [], time.time() + 10
    while len(events) < 3 and time.time() < deadline:
        events += [(e.type, e.name) for e in wh.get_new_events()]
        time.sleep(0.05)
    wh.stop()
    assert events == [(T.CREATE, "sub/f.txt"), (T.CHMOD, "sub/f.txt"), (T.WRITE, "sub/f.txt")], events
    h = sbx.commands.run("sleep 60", background=True)
    assert h.pid > 0
    assert sbx.commands.kill(h.pid)
    # a pty outlives its stream: after a disconnect the shell lives on with its input open (the
    # guest once took the dropped connection for end of input and sent the shell ^D)
    from e2b.sandbox.commands.command_handle import PtySize
    t = sbx.pty.create(PtySize(80, 24), envs={"FOO": "bar"})
    sbx.pty.send_stdin(t.pid, b"echo $FOO\n")
    t.disconnect()
    time.sleep(1)
    assert t.pid in [p.pid for p in sbx.commands.list()], "the pty's shell ended with its stream"
    again = sbx.pty.connect(t.pid)
    sbx.pty.send_stdin(t.pid, b"echo again-$FOO\nexit\n")
    out = []
    end = again.wait(on_pty=lambda d: out.append(d.decode(errors="replace")))
    assert end.exit_code == 0 and "again-bar" in "".join(out), (end, out)
    # a command whose sandbox is killed: the stream is reset (as E2B's proxy resets the HTTP/2
    # stream), the SDK's health probe finds the sandbox gone and says so
    from e2b import TimeoutException
    gone = track(Sandbox.create("base", timeout=120))
    h = gone.commands.run("sleep 60", background=True)
    gone.kill()
    try:
        h.wait()
        raise AssertionError("wait() on a killed sandbox's command returned")
    except TimeoutException as e:
        assert "sandbox was killed or reached its end of life" in str(e), str(e)


def interp():
    from e2b_code_interpreter import Sandbox
    sbx = track(Sandbox.create(timeout=300))
    e = sbx.run_code("x = 41\nx + 1")
    assert e.text == "42" and e.error is None, e
    e = sbx.run_code('import os; os.getenv("HOME")')
    assert e.text == "/home/user", e.text
    e = sbx.run_code("\n    if x:\n        y = 1\n    x + y\n")
    assert e.text == "42", e
    e = sbx.run_code("!echo shell $((6 * 7))")
    assert e.logs.stdout == ["shell 42\n"], e.logs
    seen = []
    e = sbx.run_code('import sys; print("cb"); print("eb", file=sys.stderr)', on_stdout=seen.append,
                     on_stderr=seen.append)
    assert [(m.line, m.error) for m in seen] == [("cb\n", False), ("eb\n", True)], seen
    assert all(m.timestamp for m in seen), seen
    e = sbx.run_code("1 / 0")
    assert e.error and e.error.name == "ZeroDivisionError", e.error
    ctx = sbx.create_code_context(language="javascript")
    e = sbx.run_code("await Promise.resolve('from js')", context=ctx)
    assert e.text == "from js", e


async def interp_async():
    from e2b_code_interpreter import AsyncSandbox
    sbx = await AsyncSandbox.create(timeout=300)
    made.append(sbx.sandbox_id)
    e = await sbx.run_code("sum(range(10))")
    assert e.text == "45", e
    r = await sbx.commands.run("echo async")
    assert r.stdout == "async\n"


SCENARIOS = {"control": control, "envd": envd, "interp": interp, "interp_async": lambda: asyncio.run(interp_async())}


def main():
    name = sys.argv[1]
    from e2b import Sandbox
    try:
        SCENARIOS[name]()
    except Exception as e:
        import traceback
        traceback.print_exc()
        print("FAIL %s: %r" % (name, e), file=sys.stderr)
        return 1
    finally:
        for sid in made:
            try:
                Sandbox.kill(sid)
            except Exception:
                pass
    print("ok " + name)
    return 0


if __name__ == "__main__":
    sys.exit(main())

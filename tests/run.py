#!/usr/bin/env python3
"""run.py -- runs the integration and attack tests against a real moatd.

  MOAT_BUILD=build python3 tests/run.py [-j N] [PATTERN...]

Discovers tests/integration/test_*.py and tests/attack/test_*.py, keeps the tests whose id
(e.g. integration.test_exec.ExecTest.test_stdin) contains one of the PATTERNs, builds the `base`
and `code-interpreter` templates once into the shared template dir (MOAT_TEST_TEMPLATE_DIR), runs them with unittest,
prints one line per test and ends with exactly one line "N passed, N failed[, N skipped]".
Exits 1 if any test failed or errored.

-j N (or MOAT_TEST_JOBS=N) runs up to N test modules at once, each in a run.py of its own, and
prints each module's lines when it ends. Modules in SERIAL (they load the whole host, or assert
that others are served within a few seconds while they do) run afterwards, one at a time.
Modules start longest first, by the durations the last run wrote to build/test-durations.json.
"""

import json
import re
import os
import subprocess
import sys
import threading
import time
import traceback
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "lib"))
sys.path.insert(0, HERE)

import moatd  # noqa: E402

# Modules that must run alone: they take host-wide resources or bound how long other work may wait.
SERIAL = (
    "attack.test_exhaustion",
    "attack.test_fairness",
    "attack.test_guest",
    "attack.test_resources",
    "integration.test_disk_full",
    "integration.test_http_framing",
)
DURATIONS = os.path.join(os.path.dirname(HERE), "build", "test-durations.json")
SUMMARY = re.compile(r"^(\d+) passed, (\d+) failed(?:, (\d+) skipped)?$", re.M)


class LineResult(unittest.TextTestResult):
    """Prints `ok|FAIL|ERROR|skip  test-id  (seconds)` as each test ends."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.passed = 0
        self._t0 = {}

    def startTest(self, test):
        self._t0[test.id()] = time.time()
        unittest.TestResult.startTest(self, test)

    def _line(self, word, test, extra=""):
        dt = time.time() - self._t0.get(test.id(), time.time())
        self.stream.write("%-5s %s (%.1fs)%s\n" % (word, test.id(), dt, extra))
        self.stream.flush()

    def addSuccess(self, test):
        unittest.TestResult.addSuccess(self, test)
        self.passed += 1
        self._line("ok", test)

    def addFailure(self, test, err):
        unittest.TestResult.addFailure(self, test, err)
        self._line("FAIL", test)
        self.stream.write(self.failures[-1][1] + "\n")

    def addError(self, test, err):
        unittest.TestResult.addError(self, test, err)
        self._line("ERROR", test)
        self.stream.write(self.errors[-1][1] + "\n")

    def addSkip(self, test, reason):
        unittest.TestResult.addSkip(self, test, reason)
        self._line("skip", test, " -- " + reason)

    def addSubTest(self, test, subtest, err):
        # A failing subtest counts as a failure of its test; print it at once.
        if err is not None:
            self._t0.setdefault(subtest.id(), self._t0.get(test.id(), time.time()))
        super().addSubTest(test, subtest, err)
        if err is not None:
            self._line("FAIL", subtest)
            entry = (self.failures if issubclass(err[0], test.failureException) else self.errors)[-1]
            self.stream.write(entry[1] + "\n")


def flatten(suite):
    for t in suite:
        if isinstance(t, unittest.TestSuite):
            yield from flatten(t)
        else:
            yield t


def module_of(test):
    return ".".join(test.id().split(".")[:2])


def run_parallel(tests, patterns, jobs, stream):
    """Runs each module of tests in a child run.py, up to jobs at once, SERIAL ones after the rest;
    prints each child's output when it ends and the summary over all of them. Returns the exit code."""
    modules = sorted({module_of(t) for t in tests})
    try:
        with open(DURATIONS) as f:
            known = json.load(f)
    except (OSError, ValueError):
        known = {}
    count = {m: sum(1 for t in tests if module_of(t) == m) for m in modules}
    # unknown modules first (by test count), then the longest
    order = sorted(modules, key=lambda m: (m in known, -known.get(m, count[m])))
    totals = [0, 0, 0]
    durations = dict(known)
    lock = threading.Lock()

    def run_module(m):
        t0 = time.time()
        argv = [sys.executable, os.path.abspath(__file__), "--module", m] + patterns
        env = dict(os.environ, MOAT_TEST_TEMPLATES_READY="1")
        p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
        out = p.stdout.decode("utf-8", "replace")
        found = SUMMARY.findall(out)
        with lock:
            durations[m] = round(time.time() - t0, 1)
            body = re.sub(r"^\(\d+s\)\n", "", SUMMARY.sub("", out), flags=re.M).rstrip("\n")
            stream.write("--- %s (%.0fs)\n%s\n" % (m, time.time() - t0, body))
            if found and p.returncode in (0, 1):
                pa, fa, sk = found[-1]
                totals[0] += int(pa)
                totals[1] += int(fa)
                totals[2] += int(sk or 0)
            else:  # a child that died without its summary
                stream.write("ERROR %s (run.py exited %d without a summary)\n" % (m, p.returncode))
                totals[1] += 1
            stream.flush()

    queue = [m for m in order if m not in SERIAL]

    def worker():
        while True:
            with lock:
                if not queue:
                    return
                m = queue.pop(0)
            run_module(m)

    t0 = time.time()
    threads = [threading.Thread(target=worker) for _ in range(max(1, jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for m in order:
        if m in SERIAL:
            run_module(m)
    try:
        os.makedirs(os.path.dirname(DURATIONS), exist_ok=True)
        with open(DURATIONS, "w") as f:
            json.dump(durations, f, indent=1, sort_keys=True)
    except OSError:
        pass
    line = "%d passed, %d failed" % (totals[0], totals[1])
    if totals[2]:
        line += ", %d skipped" % totals[2]
    stream.write("(%.0fs, %d at once)\n" % (time.time() - t0, jobs))
    stream.write(line + "\n")
    return 1 if totals[1] else 0


def main():
    args = sys.argv[1:]
    jobs = int(os.environ.get("MOAT_TEST_JOBS", "1") or 1)
    only_module = None
    while args and args[0] in ("-j", "--module"):
        if len(args) < 2:
            sys.exit("run.py: %s needs a value" % args[0])
        if args[0] == "-j":
            jobs = int(args[1])
        else:
            only_module = args[1]
        args = args[2:]
    patterns = args
    loader = unittest.TestLoader()
    tests = []
    for sub in ("integration", "attack"):
        d = os.path.join(HERE, sub)
        if os.path.isdir(d):
            tests.extend(flatten(loader.discover(d, pattern="test_*.py", top_level_dir=HERE)))
    if patterns:
        tests = [t for t in tests if any(p in t.id() for p in patterns)]
    if only_module:
        tests = [t for t in tests if module_of(t) == only_module]
    suite = unittest.TestSuite(tests)

    stream = sys.stdout
    pre_error = None
    if not os.access(moatd.moatd_bin(), os.X_OK):
        pre_error = "no moatd at %s (build it first: make)" % moatd.moatd_bin()
    elif not os.environ.get("MOAT_TEST_TEMPLATES_READY"):
        t0 = time.time()
        for name in ("base", "code-interpreter", "postgres"):  # test_contexts.py, test_databases.py
            try:
                moatd.ensure_template(name)
                stream.write("template %s ready in %s (%.1fs)\n" % (name, moatd.TEMPLATE_DIR, time.time() - t0))
            except Exception:
                pre_error = "building template %s failed:\n" % name + traceback.format_exc()
                break

    if pre_error:
        stream.write(pre_error + "\n")
        for t in tests:
            stream.write("ERROR %s (not run)\n" % t.id())
        stream.write("0 passed, %d failed\n" % len(tests))
        return 1

    if jobs > 1 and not only_module:
        return run_parallel(tests, patterns, jobs, stream)

    t0 = time.time()
    result = LineResult(stream, True, 0)
    suite.run(result)
    failed = len(result.failures) + len(result.errors) + len(result.unexpectedSuccesses)
    line = "%d passed, %d failed" % (result.passed, failed)
    if result.skipped:
        line += ", %d skipped" % len(result.skipped)
    stream.write("(%.0fs)\n" % (time.time() - t0))
    stream.write(line + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

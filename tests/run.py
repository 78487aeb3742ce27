#!/usr/bin/env python3
"""run.py -- runs the integration and attack tests against a real moatd.

  MOAT_BUILD=build python3 tests/run.py [PATTERN...]

Discovers tests/integration/test_*.py and tests/attack/test_*.py, keeps the tests whose id
(e.g. integration.test_exec.ExecTest.test_stdin) contains one of the PATTERNs, builds the `base`
and `code-interpreter` templates once into the shared template dir (MOAT_TEST_TEMPLATE_DIR), runs them with unittest,
prints one line per test and ends with exactly one line "N passed, N failed[, N skipped]".
Exits 1 if any test failed or errored.
"""

import os
import sys
import time
import traceback
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "lib"))
sys.path.insert(0, HERE)

import moatd  # noqa: E402


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


def main():
    patterns = sys.argv[1:]
    loader = unittest.TestLoader()
    tests = []
    for sub in ("integration", "attack"):
        d = os.path.join(HERE, sub)
        if os.path.isdir(d):
            tests.extend(flatten(loader.discover(d, pattern="test_*.py", top_level_dir=HERE)))
    if patterns:
        tests = [t for t in tests if any(p in t.id() for p in patterns)]
    suite = unittest.TestSuite(tests)

    stream = sys.stdout
    pre_error = None
    if not os.access(moatd.moatd_bin(), os.X_OK):
        pre_error = "no moatd at %s (build it first: make)" % moatd.moatd_bin()
    else:
        t0 = time.time()
        for name in ("base", "code-interpreter"):  # code-interpreter: tests/integration/test_contexts.py
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

#!/usr/bin/env python3
"""best_of_n_explore.py -- best-of-N with moat's explore: try N candidate fixes in N forks at once
and keep the fork whose fix scores best.

A sandbox holds a small project with a failing test. The "model" proposes three candidate patches;
``Sandbox.explore`` forks the sandbox once per candidate (memory and disk, in one checkpoint), runs
each candidate's command (apply the patch, run the tests) in its own fork concurrently, and the SDK
scores each outcome with ``score_fn`` (tests passed, from the tail of the output) and keeps the best
fork; moatd kills the rest. The original sandbox is untouched.

THE MODEL IS STUBBED: no LLM is called. ``CANDIDATES`` is the fixed list of patches a model proposed
in one recorded session (one wrong, one partial, one right).

    MOAT_API_URL=http://127.0.0.1:7070 MOAT_API_KEY=... python3 examples/python/best_of_n_explore.py

Needs a moatd whose host can checkpoint (GET /healthz: checkpoints.available); elsewhere explore
raises moat.NotSupportedError and the example says so and exits 2. Exits 0 when the kept fork is
the right candidate.
"""

import os
import re
import sys

try:
    import moat
except ImportError:  # running from a checkout without `pip install ./sdk/python`
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "sdk", "python"))
    import moat

# python3 -B: the candidates' patches keep calc.py's size and may land within the same second as the
# first test run, so a cached .pyc would look current and hide the patch.
PROJECT = {
    "/root/proj/calc.py": "def add(a, b):\n    return a - b\n\ndef mul(a, b):\n    return a + b\n",
    "/root/proj/test_calc.sh": (
        "cd /root/proj; pass=0; total=0\n"
        "check() { total=$((total+1)); if [ \"$(python3 -B -c \"import calc; print($1)\")\" = \"$2\" ]; "
        "then pass=$((pass+1)); fi; }\n"
        "check 'calc.add(2, 3)' 5\ncheck 'calc.add(-1, 1)' 0\ncheck 'calc.mul(2, 3)' 6\ncheck 'calc.mul(0, 5)' 0\n"
        "echo \"passed $pass/$total\"; [ $pass -eq $total ]\n"),
}

# The stubbed model's N candidate patches (sed scripts), each applied and tested in its own fork.
CANDIDATES = [
    "sed -i 's/a - b/b - a/' calc.py",                                    # wrong
    "sed -i 's/a - b/a + b/' calc.py",                                    # fixes add only
    "printf 'def add(a, b):\\n    return a + b\\n\\ndef mul(a, b):\\n    return a * b\\n' > calc.py",  # both
]


def tests_passed(outcome: moat.ExploreOutcome) -> float:
    """score_fn: the number of tests the candidate passes, read from its output's tail."""
    m = re.search(r"passed (\d+)/(\d+)", outcome.stdout_tail)
    return float(m.group(1)) if m else -1.0


def main() -> int:
    with moat.Sandbox.create(ttl_seconds=900, metadata={"example": "best-of-n"}) as sb:
        for path, text in PROJECT.items():
            sb.files.write(path, text)
        print("before:", sb.exec("sh /root/proj/test_calc.sh").stdout.strip())
        commands = ["cd /root/proj && (%s) && sh test_calc.sh" % c for c in CANDIDATES]
        try:
            res = sb.explore(commands, score_fn=tests_passed, timeout=120)
        except moat.NotSupportedError as e:
            print("explore is not available on this moatd: %s" % e)
            return 2
        try:
            for i, o in enumerate(res.outcomes):
                print("candidate %d: exit %s, score %s, %s" % (i, o.exit_code, o.score, o.stdout_tail.strip()))
            if res.winner is None:
                print("no candidate could run")
                return 1
            print("kept fork", res.winner.id)
            final = res.winner.exec("sh /root/proj/test_calc.sh")
            print("kept fork's tests:", final.stdout.strip())
            print("original still:", sb.exec("sh /root/proj/test_calc.sh").stdout.strip())
            ok = final.exit_code == 0 and res.winner.id == res.outcomes[2].sandbox_id
        finally:
            if res.winner is not None:
                res.winner.kill()
    print("example ok" if ok else "example FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

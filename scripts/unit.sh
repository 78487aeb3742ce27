#!/usr/bin/env bash
# unit.sh O -- runs every unit test binary O/tests/test_*, prints each one's TAP output and ends with
# one line "N passed, N failed, N skipped" summing their "ok" / "not ok" / "ok N # SKIP" lines. A
# binary that exits 77 counts as one skip; one that crashes or exits non-zero without a "not ok" line
# counts as one failure, and so does a sanitizer's report in its output (a forked child's report does
# not change the binary's exit status). Exits 1 when anything failed.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${1:-build}
passed=0 failed=0 skipped=0 skipped_bins=0
shopt -s nullglob
bins=()
for b in "$O"/tests/test_*; do
  [ -f "$b" ] && [ -x "$b" ] && bins+=("$b")
done
if [ ${#bins[@]} -eq 0 ]; then
  echo "unit.sh: no test binaries in $O/tests (run make first)" >&2
  echo "0 passed, 1 failed, 0 skipped"
  exit 1
fi
for b in "${bins[@]}"; do
  echo "# $b"
  out=$(mktemp)
  timeout --kill-after=10 600 "$b" >"$out" 2>&1 </dev/null
  rc=$?
  cat "$out"
  if [ $rc -eq 77 ]; then
    echo "# $b: skipped"
    skipped=$((skipped + 1)) skipped_bins=$((skipped_bins + 1))
    rm -f "$out"
    continue
  fi
  p=$(grep -E '^ok( |$)' "$out" | grep -cviE '^ok [0-9]* *# *skip' || true)
  s=$(grep -ciE '^ok [0-9]* *# *skip' "$out" || true)
  f=$(grep -cE '^not ok( |$)' "$out" || true)
  reports=$(grep -cE '^(WARNING: ThreadSanitizer|==[0-9]+==ERROR: (Address|Leak)Sanitizer)|runtime error: ' "$out" || true)
  rm -f "$out"
  if [ "$reports" -gt 0 ]; then
    echo "not ok - $b: $reports sanitizer reports"
    f=$((f + 1))
  fi
  passed=$((passed + p))
  skipped=$((skipped + s))
  failed=$((failed + f))
  if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then why="timed out"
    elif [ $rc -gt 128 ]; then why="crashed (signal $((rc - 128)))"
    else why="exited $rc"; fi
    echo "not ok - $b $why"
    failed=$((failed + 1))
  fi
done
[ $skipped_bins -gt 0 ] && echo "# $skipped_bins test binaries skipped (exit 77)"
echo "$passed passed, $failed failed, $skipped skipped"
[ $failed -eq 0 ]

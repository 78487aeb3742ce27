#!/usr/bin/env bash
# test.sh -- what `make test` runs: build, unit tests, integration + attack tests; then all of it
# again built with ASan+UBSan (build/san). Ends with one line "N passed, N failed" over everything
# and exits non-zero if any step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
passed=0 failed=0 steps_failed=() times=()

# step NAME CMD...: runs CMD, echoing its output, and adds its final "N passed, N failed" line.
step() {
  local name=$1
  shift
  echo "=== $name: $*"
  local log t0=$SECONDS
  log=$(mktemp)
  "$@" 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  times+=("$name: $((SECONDS - t0)) s")
  local line
  line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1 || true)
  rm -f "$log"
  if [ -n "$line" ]; then
    local p f
    p=$(echo "$line" | sed -E 's/^([0-9]+) passed.*/\1/')
    f=$(echo "$line" | sed -E 's/^[0-9]+ passed, ([0-9]+) failed.*/\1/')
    passed=$((passed + p))
    failed=$((failed + f))
  else
    failed=$((failed + 1)) # a runner that ended without its summary line
  fi
  if [ "$rc" -ne 0 ] || [ -z "$line" ]; then
    steps_failed+=("$name (exit $rc)")
  fi
}

# build NAME CMD...: a build step; returns non-zero (and records it) when the build fails.
build() {
  local name=$1
  shift
  echo "=== $name: $*"
  local t0=$SECONDS rc=0
  "$@" || rc=$?
  times+=("$name: $((SECONDS - t0)) s")
  if [ "$rc" -ne 0 ]; then
    steps_failed+=("$name")
    failed=$((failed + 1))
    return 1
  fi
}

suite() { # suite O MAKE-ARGS...
  local o=$1
  shift
  if build "build $o" make -j2 "$@" all; then
    step "unit $o" scripts/unit.sh "$o"
    if [ -f tests/run.py ]; then
      step "integration $o" env MOAT_BUILD="$o" python3 tests/run.py
    fi
  fi
}

suite build
suite build/san SANITIZE=1

echo "==="
printf 'wall time: %s\n' "${times[@]}"
echo "wall time: total $SECONDS s"
if [ ${#steps_failed[@]} -gt 0 ]; then
  echo "failed steps: ${steps_failed[*]}"
fi
echo "$passed passed, $failed failed"
[ ${#steps_failed[@]} -eq 0 ] && [ "$failed" -eq 0 ]

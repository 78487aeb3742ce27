#!/usr/bin/env bash
# test.sh -- what `make test` runs: build, unit tests, integration + attack tests; then all of it
# again built with ASan+UBSan (build/san); then the unit tests built with ThreadSanitizer
# (build/tsan), and every libFuzzer target for FUZZ_SECONDS (here default 3) over its corpus
# (scripts/fuzz.sh, build/fuzz). Prints each step's wall time against the budget
# (MOAT_TEST_BUDGET_S, default 1800 s: the 30 minutes the suite must fit on 2 cores) and ends with
# one line "N passed, N failed, N skipped" over everything; exits non-zero if any step failed. Going
# over the budget is reported, not failed: the machine's load is not the code's fault.
set -uo pipefail
cd "$(dirname "$0")/.."
budget=${MOAT_TEST_BUDGET_S:-1800}
passed=0 failed=0 skipped=0 steps_failed=() times=()

# step NAME CMD...: runs CMD, echoing its output, and adds its final "N passed, N failed[, N skipped]"
# line.
step() {
  local name=$1
  shift
  echo "=== $name: $*"
  local log t0=$SECONDS
  log=$(mktemp)
  "$@" 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  times+=("$name $((SECONDS - t0))")
  local line
  line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1 || true)
  rm -f "$log"
  if [ -n "$line" ]; then
    local p f
    p=$(echo "$line" | sed -E 's/^([0-9]+) passed.*/\1/')
    f=$(echo "$line" | sed -E 's/^[0-9]+ passed, ([0-9]+) failed.*/\1/')
    s=$(echo "$line" | sed -nE 's/^[0-9]+ passed, [0-9]+ failed, ([0-9]+) skipped.*/\1/p')
    passed=$((passed + p))
    failed=$((failed + f))
    skipped=$((skipped + ${s:-0}))
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
  times+=("$name $((SECONDS - t0))")
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
      step "integration $o" env MOAT_BUILD="$o" python3 tests/run.py -j "${MOAT_TEST_JOBS:-2}"
    fi
  fi
}

step "check-format" make -s check-format
suite build
suite build/san SANITIZE=1
# The fuzzers (each one process on one core for FUZZ_SECONDS) run beside the ThreadSanitizer build
# and unit tests, which mostly keep one core busy too; the fuzz step's output follows theirs.
fuzz_log=$(mktemp)
fuzz_t0=$SECONDS
(env FUZZ_SECONDS="${FUZZ_SECONDS:-3}" scripts/fuzz.sh build/fuzz >"$fuzz_log" 2>&1
  echo "$?" >"$fuzz_log.rc"
  echo "$((SECONDS - fuzz_t0))" >"$fuzz_log.s") &
fuzz_pid=$!
# ThreadSanitizer: the unit tests (control, host and store with their threads); a report fails the
# binary (unit.sh). test_control_moatd skips here: it runs build/tsan/moatd, which is not built.
if build "build build/tsan" make -s -j2 TSAN=1 units; then
  step "unit build/tsan" env TSAN_OPTIONS="halt_on_error=0 second_deadlock_stack=1" scripts/unit.sh build/tsan
fi
wait "$fuzz_pid"
# the fuzz step, as step() would have run it: its output, its summary line, its wall time
step "fuzz build/fuzz" sh -c 'cat "$1"; exit "$(cat "$1.rc")"' sh "$fuzz_log"
times[${#times[@]} - 1]="fuzz build/fuzz (beside tsan) $(cat "$fuzz_log.s")"
rm -f "$fuzz_log" "$fuzz_log.rc" "$fuzz_log.s"

echo "==="
for t in "${times[@]}"; do
  printf 'wall time: %-28s %5d s  %3d%% of the %d s budget\n' "${t% *}" "${t##* }" $((${t##* } * 100 / budget)) "$budget"
done
printf 'wall time: %-28s %5d s  %3d%% of the %d s budget\n' total "$SECONDS" $((SECONDS * 100 / budget)) "$budget"
if [ "$SECONDS" -gt "$budget" ]; then
  echo "wall time: OVER BUDGET by $((SECONDS - budget)) s"
fi
if [ ${#steps_failed[@]} -gt 0 ]; then
  echo "failed steps: ${steps_failed[*]}"
fi
echo "$passed passed, $failed failed, $skipped skipped"
[ ${#steps_failed[@]} -eq 0 ] && [ "$failed" -eq 0 ]

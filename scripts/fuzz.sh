#!/usr/bin/env bash
# fuzz.sh [O] -- runs every libFuzzer target (tests/fuzz/fuzz_*.c, built by `make FUZZ=1 fuzzers`
# with clang into O/fuzz, O defaulting to build/fuzz) for FUZZ_SECONDS each (default 5). A target
# first runs every input of its seed corpus tests/fuzz/corpus/NAME (the inputs of bugs found are
# kept there, so each one is a regression test), then mutates for the rest of its time, writing what
# it finds to O/corpus/NAME (never into the tree). Prints each target's executions and wall time,
# where a failing input was saved (O/crash/NAME-*), and ends with "N passed, N failed" (one per
# target). Exits 1 when a target failed.
#
# FUZZ_MERGE=1 scripts/fuzz.sh: instead merges what O/corpus/NAME found into the seed corpus,
# keeping only inputs that add coverage (then review and commit tests/fuzz/corpus).
# FUZZ_ONLY=name1,name2: only those targets.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${1:-build/fuzz}
secs=${FUZZ_SECONDS:-5}
if ! make -s -j2 FUZZ=1 O="$O" fuzzers; then
  echo "fuzz: build failed (clang and libclang-rt: scripts/deps.sh installs them)"
  echo "0 passed, 1 failed"
  exit 1
fi
passed=0 failed=0
mkdir -p "$O/crash" "$O/logs"
for src in tests/fuzz/fuzz_*.c; do
  name=$(basename "$src" .c)
  if [ -n "${FUZZ_ONLY:-}" ] && [[ ",$FUZZ_ONLY," != *",$name,"* ]]; then
    continue
  fi
  seeds=tests/fuzz/corpus/$name
  work=$O/corpus/$name
  log=$O/logs/$name.log
  mkdir -p "$work"
  if [ ! -d "$seeds" ] || [ -z "$(ls -A "$seeds" 2>/dev/null)" ]; then
    echo "not ok - fuzz $name: no seed corpus in $seeds"
    failed=$((failed + 1))
    continue
  fi
  if [ "${FUZZ_MERGE:-0}" = 1 ]; then
    before=$(ls "$seeds" | wc -l)
    "$O/fuzz/$name" -merge=1 "$seeds" "$work" >"$log" 2>&1
    echo "# fuzz $name: seed corpus $before -> $(ls "$seeds" | wc -l) inputs"
    continue
  fi
  t0=$(date +%s%N)
  # -timeout: one input running 10 s is a hang; -rss_limit_mb: a parser whose memory is not
  # bounded by its input fails here; -use_value_profile: comparisons guide the mutations.
  "$O/fuzz/$name" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -use_value_profile=1 \
    -print_final_stats=1 -artifact_prefix="$O/crash/$name-" "$work" "$seeds" >"$log" 2>&1
  rc=$?
  ms=$((($(date +%s%N) - t0) / 1000000))
  t=$((ms / 1000)).$((ms % 1000 / 100))
  runs=$(sed -nE 's/^stat::number_of_executed_units: *([0-9]+)/\1/p' "$log" | tail -n 1)
  rss=$(sed -nE 's/^stat::peak_rss_mb: *([0-9]+)/\1/p' "$log" | tail -n 1)
  nseeds=$(ls "$seeds" | wc -l)
  if [ $rc -eq 0 ]; then
    printf 'ok - fuzz %s: %s runs over %d seeds in %s s (peak %s MB)\n' "$name" "${runs:-?}" "$nseeds" "$t" "${rss:-?}"
    passed=$((passed + 1))
  else
    printf 'not ok - fuzz %s: exit %d after %s s, see %s\n' "$name" "$rc" "$t" "$log"
    grep -E "^==[0-9]+==ERROR|^SUMMARY|Test unit written to|^#[0-9]+ *(in|on) " "$log" | head -n 8 | sed 's/^/#   /'
    failed=$((failed + 1))
  fi
done
[ "${FUZZ_MERGE:-0}" = 1 ] && exit 0
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]

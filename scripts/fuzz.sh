#!/usr/bin/env bash
# fuzz.sh -- builds every tests/fuzz/fuzz_*.c with libFuzzer (clang) and runs each for
# FUZZ_SECONDS (default 60). Not part of `make test`: run by hand or in a nightly job.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v clang >/dev/null; then
  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q clang
fi
secs=${FUZZ_SECONDS:-60}
out=build/fuzz
mkdir -p "$out"
common="src/common/util.c src/common/error.c src/common/log.c src/common/codec.c src/proto/proto.c"
flags="-g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -D_GNU_SOURCE -D_FILE_OFFSET_BITS=64 -Isrc"
status=0
for src in tests/fuzz/fuzz_*.c; do
  name=$(basename "$src" .c)
  case "$name" in
    fuzz_json_body) extra="src/api/http/json.c src/api/http/codec.c src/api/http/route.c -ljansson" ;;
    fuzz_e2b_multipart) extra="src/api/e2b/multipart.c src/common/buf.c" ;;
    fuzz_framing) extra="src/api/http/framing.c" ;;
    *) extra="" ;;
  esac
  # shellcheck disable=SC2086
  clang $flags -o "$out/$name" "$src" $common $extra
  mkdir -p "$out/$name.corpus"
  echo "fuzz: $name for ${secs}s"
  if ! "$out/$name" -max_total_time="$secs" -print_final_stats=1 "$out/$name.corpus" 2>"$out/$name.log"; then
    echo "fuzz: $name FAILED, see $out/$name.log"
    status=1
  fi
  grep -E "stat::number_of_executed_units|stat::peak_rss" "$out/$name.log" || true
done
exit $status

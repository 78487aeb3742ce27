#!/bin/sh
# bench.sh -- `make bench`: builds the C timing helpers and runs bench/bench.py (see docs/benchmarks.md).
# Extra arguments go to bench.py (e.g. --creates 500 --idle 1000). MOAT_BUILD picks the build dir.
set -eu
cd "$(dirname "$0")/.."
B="${MOAT_BUILD:-build}"
mkdir -p build/bench
${CC:-cc} -O2 -Wall -Wextra -Werror -o build/bench/spawn_time bench/spawn_time.c
command -v bwrap >/dev/null 2>&1 || { echo "bench: bwrap is missing (apt-get install bubblewrap)" >&2; exit 1; }
env MOAT_BUILD="$B" python3 bench/timetravel.py --out build/bench/timetravel.md || echo "bench: timetravel.py failed" >&2
env MOAT_BUILD="$B" python3 bench/sdk_python.py || echo "bench: sdk_python.py failed" >&2
env MOAT_BUILD="$B" node bench/sdk_ts.mjs || echo "bench: sdk_ts.mjs failed" >&2
env MOAT_BUILD="$B" node bench/e2b.mjs || echo "bench: e2b.mjs failed" >&2
env MOAT_BUILD="$B" python3 bench/ports.py || echo "bench: ports.py failed" >&2
env MOAT_BUILD="$B" python3 bench/pg_proxy.py > build/bench/pg_proxy.md || echo "bench: pg_proxy.py failed" >&2
env MOAT_BUILD="$B" python3 bench/databases.py > build/bench/databases.md || echo "bench: databases.py failed" >&2
env MOAT_BUILD="$B" python3 bench/events.py > build/bench/events.md || echo "bench: events.py failed" >&2
env MOAT_BUILD="$B" python3 bench/tenancy.py > build/bench/tenancy.md || echo "bench: tenancy.py failed" >&2
env MOAT_BUILD="$B" python3 bench/usage.py > build/bench/usage.md || echo "bench: usage.py failed" >&2
env MOAT_BUILD="$B" python3 bench/list_paging.py > build/bench/list_paging.md || echo "bench: list_paging.py failed" >&2
env MOAT_BUILD="$B" python3 bench/network.py --out build/bench/network.md || echo "bench: network.py failed" >&2
env MOAT_BUILD="$B" python3 bench/fairness.py --out build/bench/fairness.md || echo "bench: fairness.py failed" >&2
env MOAT_BUILD="$B" python3 bench/own_computer.py > build/bench/own_computer.txt || echo "bench: own_computer.py failed" >&2
env MOAT_BUILD="$B" python3 bench/volumes.py > build/bench/volumes.txt || echo "bench: volumes.py failed" >&2
env MOAT_BUILD="$B" python3 bench/templates.py > build/bench/templates.txt || echo "bench: templates.py failed" >&2
env MOAT_BUILD="$B" python3 bench/logs.py > build/bench/logs.md || echo "bench: logs.py failed" >&2
exec env MOAT_BUILD="$B" python3 bench/bench.py --spawn-time build/bench/spawn_time "$@"

#!/usr/bin/env bash
# deps.sh -- installs (apt-get) the Debian packages moat needs that are not installed yet.
# Checks each with dpkg-query first; runs `apt-get update` only when something is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

# Build tools, the runtime's helpers and what the tests and benchmark use.
pkgs=(
  build-essential make pkg-config   # gcc, libc6-dev (static libc for moat-guest), make
  debootstrap                       # builds template root images
  e2fsprogs util-linux procps       # mkfs.ext4 (sandbox disks), mount/losetup, ps
  python3                           # integration and attack tests
  python3-pip python3-venv          # pip install ./sdk/python into a venv (test_sdk_python.py)
  curl                              # scripts/run.sh checks moatd's /healthz with it
  lxcfs                             # make run: sandboxes' own /proc/meminfo, stat, uptime, loadavg
  bubblewrap                        # the benchmark's peer
  umoci                             # tests build OCI image archives to import (test_template_import)
  nodejs                            # E2B SDK, MCP client and TypeScript SDK tests (tests/node)
  clang-14 libclang-rt-14-dev       # the libFuzzer targets (make FUZZ=1, scripts/fuzz.sh)
  clang-format-14                   # make format / make check-format (a step of make test)
  llvm-14                           # llvm-symbolizer: fuzz and sanitizer reports name their lines
  chromium                          # the web dashboard's tests drive it (tests/integration/test_ui.py)
)
# Development packages for every library the Makefile links (-lNAME).
lib_pkg() {
  case "$1" in
    microhttpd) echo libmicrohttpd-dev ;;
    jansson) echo libjansson-dev ;;
    sqlite3) echo libsqlite3-dev ;;
    seccomp) echo libseccomp-dev ;;
    curl) echo libcurl4-openssl-dev ;;
    mnl) echo libmnl-dev ;;
    nl-3 | nl-route-3 | nl-genl-3) echo "libnl-3-dev libnl-route-3-dev libnl-genl-3-dev" ;;
    nftables) echo libnftables-dev ;;
    cap) echo libcap-dev ;;
    ssl | crypto) echo libssl-dev ;;
    z) echo zlib1g-dev ;;
    archive) echo libarchive-dev ;;
    uring) echo liburing-dev ;;
    wslay) echo libwslay-dev ;;
    pq) echo libpq-dev ;;
    pthread | m | dl | rt | c | util) ;; # part of libc6-dev
    *) echo "deps.sh: no package known for -l$1; add it to scripts/deps.sh" >&2 ;;
  esac
}
# shellcheck disable=SC2013
for lib in $(grep -oE -- '(^|[[:space:]])-l[A-Za-z0-9_+.-]+' Makefile | sed 's/^[[:space:]]*-l//' | sort -u); do
  # shellcheck disable=SC2207
  pkgs+=($(lib_pkg "$lib"))
done

missing=()
for p in "${pkgs[@]}"; do
  if [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)" != "install ok installed" ]; then
    missing+=("$p")
  fi
done
# The npm packages the tests drive (pinned in tests/node/package-lock.json), installed once.
node_packages() {
  if ! command -v npm >/dev/null 2>&1; then
    echo "deps.sh: npm is missing; installing Debian's npm"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends npm
  fi
  if [ ! -f tests/node/node_modules/.package-lock.json ] ||
    [ tests/node/package-lock.json -nt tests/node/node_modules/.package-lock.json ]; then
    echo "deps.sh: npm ci in tests/node"
    (cd tests/node && npm ci --no-audit --no-fund --loglevel=error)
  fi
}
scripts/criu.sh # CRIU for checkpoints: the system's if it passes `criu check`, else trixie's in a private prefix
if [ ${#missing[@]} -eq 0 ]; then
  node_packages
  exit 0
fi
mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
echo "deps.sh: installing ${missing[*]}"
if [ "$(id -u)" -ne 0 ]; then
  echo "deps.sh: missing packages and not root: run as root, or: apt-get install ${missing[*]}" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${missing[@]}"
node_packages

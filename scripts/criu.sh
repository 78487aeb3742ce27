#!/usr/bin/env bash
# criu.sh -- picks a CRIU that works on this host and installs it where moatd looks for it.
#
# moatd runs /var/lib/moat/criu/criu (override: MOAT_CRIU). This script makes that path one of:
#   1. the system's criu (Debian 12's package, installed if absent) when `criu check` passes;
#   2. otherwise trixie's criu 4.1.1, fetched with `apt-get download` through a private apt
#      configuration (the host's apt sources, lists and cache are not touched), unpacked with
#      `dpkg -x` into /var/lib/moat/criu/root with its own libraries (its libc too), and
#      patchelf'ed to run through that prefix's dynamic loader.
# Then it runs `criu check` on the result and writes /var/lib/moat/criu/CHOICE, one line saying
# which CRIU was chosen and why (moatd reports it). Idempotent: when CHOICE was written for this
# kernel and the binary still passes its check, it only says so. Runs as root.
set -euo pipefail

PREFIX=${MOAT_CRIU_PREFIX:-/var/lib/moat/criu}
LINK=$PREFIX/criu
CHOICE=$PREFIX/CHOICE
KERNEL=$(uname -r)
TRIXIE_MIRROR=${MOAT_CRIU_MIRROR:-http://deb.debian.org/debian}

say() { echo "criu.sh: $*"; }

check() { # check BINARY: 0 when `criu check` says it works on this kernel
  "$1" check >/dev/null 2>&1
}

if [ "$(id -u)" -ne 0 ]; then
  say "not root: cannot install CRIU (checkpoints will be unavailable)" >&2
  exit 0
fi
mkdir -p "$PREFIX"

# Fast path: already chosen for this kernel and still working.
if [ -x "$LINK" ] && [ -f "$CHOICE" ] && grep -q "kernel $KERNEL)" "$CHOICE" && check "$LINK"; then
  say "already installed: $(cat "$CHOICE")"
  exit 0
fi
rm -f "$LINK" "$CHOICE"

export DEBIAN_FRONTEND=noninteractive
# 1. The system's criu.
if ! command -v criu >/dev/null 2>&1 && [ ! -x /usr/sbin/criu ]; then
  say "installing the system's criu package"
  apt-get install -y -q --no-install-recommends criu >/dev/null ||
    { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends criu >/dev/null; } ||
    say "could not install the system's criu"
fi
sys=$(command -v criu || echo /usr/sbin/criu)
sys_err=""
if [ -x "$sys" ]; then
  sys_ver=$("$sys" --version 2>/dev/null | awk '/Version/ {print $2}')
  if check "$sys"; then
    ln -sfn "$sys" "$LINK"
    echo "criu $sys_ver from $sys (the system's; criu check passes on kernel $KERNEL)" >"$CHOICE"
    say "chose: $(cat "$CHOICE")"
    exit 0
  fi
  sys_out=$("$sys" check 2>&1 || true)
  sys_err=$(echo "$sys_out" | grep -m1 -i 'vdso' || echo "$sys_out" | grep -i error | tail -1 || true)
  sys_err=${sys_err#*): }
  say "the system's criu $sys_ver fails criu check on kernel $KERNEL: ${sys_err:-no detail}"
fi

# 2. trixie's criu in a private prefix.
APT=$PREFIX/apt
ROOT=$PREFIX/root
mkdir -p "$APT/etc/apt.conf.d" "$APT/etc/preferences.d" "$APT/etc/sources.list.d" \
  "$APT/state/lists/partial" "$APT/cache/archives/partial" "$APT/debs"
echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $TRIXIE_MIRROR trixie main" \
  >"$APT/etc/sources.list"
: >"$APT/status"
aptopts=(-o "Dir::Etc=$APT/etc" -o "Dir::Etc::SourceList=$APT/etc/sources.list"
  -o "Dir::Etc::SourceParts=$APT/etc/sources.list.d" -o "Dir::Etc::Parts=$APT/etc/apt.conf.d"
  -o "Dir::Etc::PreferencesParts=$APT/etc/preferences.d" -o "Dir::State=$APT/state"
  -o "Dir::State::status=$APT/status" -o "Dir::Cache=$APT/cache" -o "APT::Architecture=amd64"
  -o "Debug::NoLocking=1" -o "APT::Sandbox::User=root")
say "fetching trixie's package lists into $APT (the host's apt is untouched)"
apt-get "${aptopts[@]}" update -q >/dev/null
# criu and every library package it needs, recursively (libc6 included; no tools or data).
mapfile -t pkgs < <(apt-cache "${aptopts[@]}" depends --recurse --no-recommends --no-suggests \
  --no-conflicts --no-breaks --no-replaces --no-enhances --no-pre-depends criu |
  grep -v '^ ' | grep -v '^<' | sort -u | grep -E '^(criu|lib[^ ]*)$' | grep -v -E -- '-(dev|data|bin|common)$' |
  grep -v -E '^(libc-bin|libc-l10n|libpython.*|libperl.*|libgcc-s1-.*)$')
say "downloading ${#pkgs[@]} packages: ${pkgs[*]}"
(cd "$APT/debs" && rm -f ./*.deb && apt-get "${aptopts[@]}" download "${pkgs[@]}" >/dev/null)
rm -rf "$ROOT.new"
mkdir -p "$ROOT.new"
for d in "$APT/debs"/*.deb; do dpkg -x "$d" "$ROOT.new"; done
rm -rf "$ROOT"
mv "$ROOT.new" "$ROOT"

if ! command -v patchelf >/dev/null 2>&1; then
  say "installing patchelf (Debian 12)"
  apt-get install -y -q --no-install-recommends patchelf >/dev/null
fi
libdirs="$ROOT/usr/lib/x86_64-linux-gnu:$ROOT/lib/x86_64-linux-gnu:$ROOT/usr/lib:$ROOT/lib"
loader=""
for l in "$ROOT"/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 "$ROOT"/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2; do
  [ -e "$l" ] && { loader=$l; break; }
done
[ -n "$loader" ] || { say "no dynamic loader in trixie's libc6" >&2; exit 1; }
bin=$ROOT/usr/sbin/criu
cp "$bin" "$PREFIX/criu.bin"
patchelf --set-interpreter "$loader" --set-rpath "$libdirs" --force-rpath "$PREFIX/criu.bin"
# A DT_RPATH (not RUNPATH) on the executable also serves its libraries' own dependencies, so
# none of them falls back to the host's copies.
ver=$("$PREFIX/criu.bin" --version 2>/dev/null | awk '/Version/ {print $2}')
if ! out=$("$PREFIX/criu.bin" check 2>&1); then
  say "trixie's criu $ver fails criu check too: $(echo "$out" | tail -3)" >&2
  echo "none: the system's criu fails criu check (${sys_err:-not installable}) and so does trixie's $ver (kernel $KERNEL)" >"$CHOICE"
  exit 0
fi
ln -sfn "$PREFIX/criu.bin" "$LINK"
echo "criu $ver from $ROOT (trixie's, own libc via $loader; the system's ${sys_ver:-criu} fails criu check: ${sys_err:-not installed}) (kernel $KERNEL)" >"$CHOICE"
# keep the tree small: the .debs are not needed any more
rm -rf "$APT/debs" "$APT/cache"
say "chose: $(cat "$CHOICE")"

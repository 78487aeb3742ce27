#!/usr/bin/env bash
# criu.sh -- picks a CRIU that works on this host and installs it where moatd looks for it.
#
# moatd runs /var/lib/moat/criu/criu (override: MOAT_CRIU). This script makes that path one of:
#   1. the system's criu (Debian 12's package, installed if absent) when `criu check` passes and
#      it is 4.2 or newer; one that passes but is older is kept only as the fallback of step 2
#      (sid's only; MOAT_CRIU_SYSTEM_ONLY=1 keeps it outright);
#   2. otherwise a newer Debian criu, fetched with `apt-get download` through a private apt
#      configuration (the host's apt sources, lists and cache are not touched) from Debian's
#      archive, unpacked with `dpkg -x` into /var/lib/moat/criu/SUITE/root with its own
#      libraries (its libc too) and patchelf'ed to run through that prefix's dynamic loader.
#      Suites are tried in order (MOAT_CRIU_SUITES, default "sid trixie"): sid's 4.2.1 first,
#      because trixie's 4.1.1 passes `criu check` on kernels >= 6.13 but cannot restore a
#      named unix socket when a process group's leader has exited (CRIU issue #2687, fixed in
#      4.2): every sandbox where a command ran `cmd &` from a shell. trixie's is the fallback.
# Then it runs `criu check` on the result and writes /var/lib/moat/criu/CHOICE, one line saying
# which CRIU was chosen and why (moatd reports it). Idempotent: when CHOICE was written for this
# kernel and the binary still passes its check, it only says so. Runs as root.
set -euo pipefail

PREFIX=${MOAT_CRIU_PREFIX:-/var/lib/moat/criu}
LINK=$PREFIX/criu
CHOICE=$PREFIX/CHOICE
KERNEL=$(uname -r)
MIRROR=${MOAT_CRIU_MIRROR:-http://deb.debian.org/debian}
SUITES=${MOAT_CRIU_SUITES:-sid trixie}

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
    if [ "$(printf '%s\n4.2\n' "$sys_ver" | sort -V | head -1)" = 4.2 ] || [ -n "${MOAT_CRIU_SYSTEM_ONLY:-}" ]; then
      ln -sfn "$sys" "$LINK"
      echo "criu $sys_ver from $sys (the system's; criu check passes) (kernel $KERNEL)" >"$CHOICE"
      say "chose: $(cat "$CHOICE")"
      exit 0
    fi
    # It works, but before 4.2 it cannot restore a sandbox's named unix socket (the guest's
    # listener) once a process group's leader has exited (CRIU #2687): try sid's first, and keep
    # the system's as the fallback.
    say "the system's criu $sys_ver passes criu check but predates 4.2 (CRIU #2687); trying sid's"
    SUITES=sid
    sys_ok=1
  else
    sys_out=$("$sys" check 2>&1 || true)
    sys_err=$(echo "$sys_out" | grep -m1 -i 'vdso' || echo "$sys_out" | grep -i error | tail -1 || true)
    sys_err=${sys_err#*): }
    say "the system's criu $sys_ver fails criu check on kernel $KERNEL: ${sys_err:-no detail}"
  fi
fi

# 2. A newer Debian criu in a private prefix, suite by suite.
fetch_suite() { # fetch_suite SUITE: installs $PREFIX/SUITE/root and $PREFIX/criu-SUITE; 0 when it passes criu check
  local suite=$1 apt=$PREFIX/$1/apt root=$PREFIX/$1/root
  mkdir -p "$apt/etc/apt.conf.d" "$apt/etc/preferences.d" "$apt/etc/sources.list.d" \
    "$apt/state/lists/partial" "$apt/cache/archives/partial" "$apt/debs"
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $MIRROR $suite main" >"$apt/etc/sources.list"
  : >"$apt/status"
  local aptopts=(-o "Dir::Etc=$apt/etc" -o "Dir::Etc::SourceList=$apt/etc/sources.list"
    -o "Dir::Etc::SourceParts=$apt/etc/sources.list.d" -o "Dir::Etc::Parts=$apt/etc/apt.conf.d"
    -o "Dir::Etc::PreferencesParts=$apt/etc/preferences.d" -o "Dir::State=$apt/state"
    -o "Dir::State::status=$apt/status" -o "Dir::Cache=$apt/cache" -o "APT::Architecture=amd64"
    -o "Debug::NoLocking=1" -o "APT::Sandbox::User=root")
  say "fetching $suite's package lists into $apt (the host's apt is untouched)"
  apt-get "${aptopts[@]}" update -q >/dev/null || return 1
  # criu and every library package it needs, recursively (libc6 included; no tools or data).
  local pkgs
  mapfile -t pkgs < <(apt-cache "${aptopts[@]}" depends --recurse --no-recommends --no-suggests \
    --no-conflicts --no-breaks --no-replaces --no-enhances --no-pre-depends criu |
    grep -v '^ ' | grep -v '^<' | sort -u | grep -E '^(criu|lib[^ ]*)$' | grep -v -E -- '-(dev|data|bin|common)$' |
    grep -v -E '^(libc-bin|libc-l10n|libpython.*|libperl.*|libgcc-s1-.*)$')
  say "downloading ${#pkgs[@]} packages from $suite: ${pkgs[*]}"
  (cd "$apt/debs" && rm -f ./*.deb && apt-get "${aptopts[@]}" download "${pkgs[@]}" >/dev/null) || return 1
  rm -rf "$root.new"
  mkdir -p "$root.new"
  for d in "$apt/debs"/*.deb; do dpkg -x "$d" "$root.new"; done
  rm -rf "$root" "$apt/debs" "$apt/cache"
  mv "$root.new" "$root"
  local libdirs="$root/usr/lib/x86_64-linux-gnu:$root/lib/x86_64-linux-gnu:$root/usr/lib:$root/lib" loader="" l
  for l in "$root"/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 "$root"/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2; do
    [ -e "$l" ] && { loader=$l; break; }
  done
  [ -n "$loader" ] || { say "no dynamic loader in $suite's libc6" >&2; return 1; }
  cp "$root/usr/sbin/criu" "$PREFIX/criu-$suite"
  # A DT_RPATH (not RUNPATH) on the executable also serves its libraries' own dependencies, so
  # none of them falls back to the host's copies.
  patchelf --set-interpreter "$loader" --set-rpath "$libdirs" --force-rpath "$PREFIX/criu-$suite"
  ver=$("$PREFIX/criu-$suite" --version 2>/dev/null | awk '/Version/ {print $2}')
  local out
  if ! out=$("$PREFIX/criu-$suite" check 2>&1); then
    say "$suite's criu $ver fails criu check: $(echo "$out" | tail -1)" >&2
    tried="$tried, $suite's $ver fails criu check"
    return 1
  fi
  CHOSEN_LOADER=$loader
  return 0
}

if ! command -v patchelf >/dev/null 2>&1; then
  say "installing patchelf (Debian 12)"
  apt-get install -y -q --no-install-recommends patchelf >/dev/null ||
    { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends patchelf >/dev/null; }
fi
tried=""
for suite in $SUITES; do
  if fetch_suite "$suite"; then
    ln -sfn "$PREFIX/criu-$suite" "$LINK"
    why=""
    [ "$suite" = trixie ] && why="; restores of sandboxes whose process-group leader exited fail (CRIU #2687, fixed in 4.2)"
    if [ -n "${sys_ok:-}" ]; then
      sys_why="the system's $sys_ver passes criu check but predates 4.2 (CRIU #2687)"
    else
      sys_why="the system's ${sys_ver:-criu} fails criu check: ${sys_err:-not installed}"
    fi
    echo "criu $ver from $PREFIX/$suite/root ($suite's, own libc via $CHOSEN_LOADER; $sys_why$tried$why) (kernel $KERNEL)" >"$CHOICE"
    say "chose: $(cat "$CHOICE")"
    exit 0
  fi
  tried="$tried, $suite's could not be fetched or fails criu check"
done
if [ -n "${sys_ok:-}" ]; then
  ln -sfn "$sys" "$LINK"
  echo "criu $sys_ver from $sys (the system's; criu check passes; older than 4.2: restores of sandboxes whose process-group leader exited fail (CRIU #2687)$tried) (kernel $KERNEL)" >"$CHOICE"
  say "chose: $(cat "$CHOICE")"
  exit 0
fi
echo "none: the system's criu fails criu check (${sys_err:-not installable})$tried (kernel $KERNEL)" >"$CHOICE"
say "no working CRIU: $(cat "$CHOICE")" >&2
exit 0

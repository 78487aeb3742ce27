#!/bin/sh
# build_ui.sh OUT -- the web dashboard's assets into OUT (build/ui): ui/src as is, plus the vendored
# npm packages of ui/package-lock.json copied from ui/node_modules, and OUT/MANIFEST naming every file
# moatd may serve. No bundler; nothing is fetched at run time. Without node and npm the step is
# skipped (moatd then answers /ui/ with 503) and make goes on.
set -eu
out=${1:-build/ui}
here=$(cd "$(dirname "$0")/.." && pwd)
ui="$here/ui"
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "build_ui.sh: node/npm not found: the web dashboard is skipped (moatd answers /ui/ with 503)" >&2
  rm -f "$out/MANIFEST"
  exit 0
fi
# npm ci only when the lock changed since the last install
stamp="$ui/node_modules/.moat-lock"
if [ ! -f "$stamp" ] || ! cmp -s "$ui/package-lock.json" "$stamp"; then
  (cd "$ui" && npm ci --no-audit --no-fund --loglevel=error)
  cp "$ui/package-lock.json" "$stamp"
fi
tmp="$out.tmp"
rm -rf "$tmp"
mkdir -p "$tmp/vendor"
cp "$ui"/src/*.html "$ui"/src/*.js "$ui"/src/*.css "$tmp/"
cp "$ui/node_modules/@xterm/xterm/lib/xterm.mjs" "$ui/node_modules/@xterm/xterm/css/xterm.css" \
  "$ui/node_modules/@xterm/addon-fit/lib/addon-fit.mjs" "$tmp/vendor/"
cp "$ui/node_modules/@xterm/xterm/LICENSE" "$tmp/vendor/xterm-LICENSE.txt"
(cd "$tmp" && find . -type f ! -name MANIFEST | sed 's|^\./||' | sort > MANIFEST)
rm -rf "$out"
mv "$tmp" "$out"
echo "build_ui.sh: $(wc -l < "$out/MANIFEST") files in $out"

#!/usr/bin/env bash
# Build the Jaeger UI (https://github.com/jaegertracing/jaeger-ui, Apache-2.0) at the version of the
# Jaeger of build.sh, for the docs' screenshot only (e2e/jaeger/screenshot.py): the jaeger binary
# built from the Go module serves no UI assets, and neither the tests nor CI need them (they read
# Jaeger's query API). Cached under
#   ${XDG_CACHE_HOME:-~/.cache}/agentrun/jaeger-ui/<version>/build
# A cached build makes this a no-op. Prints the build directory on stdout.
#
# Needs git (or JAEGER_UI_SRC: an unpacked jaeger-ui source tree of that version), Node.js and npm
# (the UI declares node >= 24; it builds with node 20.19+ as well, so the engine check is relaxed).
# Env: JAEGER_UI_CACHE (cache root), JAEGER_UI_SRC.
set -euo pipefail

version="v1.75.0"  # jaeger-ui's tag of the Jaeger release build.sh pins (v1.75.0)
repo="https://github.com/jaegertracing/jaeger-ui"

cache_root="${JAEGER_UI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/agentrun/jaeger-ui}"
out="$cache_root/$version/build"
if [[ -f "$out/index.html" ]]; then
    echo "$out"
    exit 0
fi
command -v npm >/dev/null || { echo "jaeger/build-ui.sh: npm is not installed" >&2; exit 1; }

src="${JAEGER_UI_SRC:-$cache_root/$version/src}"
if [[ ! -f "$src/package.json" ]]; then
    echo "jaeger/build-ui.sh: fetching jaeger-ui $version ..." >&2
    rm -rf "$src"
    git clone --quiet --depth 1 --branch "$version" "$repo" "$src"
fi
echo "jaeger/build-ui.sh: building jaeger-ui $version (a few minutes) ..." >&2
start=$(date +%s)
(
    cd "$src"
    nice -n 10 npm ci --no-audit --no-fund --engine-strict=false >&2
    cd packages/jaeger-ui
    nice -n 10 npm run build >&2
)
mkdir -p "$(dirname "$out")"
rm -rf "$out.tmp.$$"
cp -r "$src/packages/jaeger-ui/build" "$out.tmp.$$"
mv "$out.tmp.$$" "$out"
echo "jaeger/build-ui.sh: built $out in $(( $(date +%s) - start ))s" >&2
echo "$out"

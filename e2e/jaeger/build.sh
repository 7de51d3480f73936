#!/usr/bin/env bash
# Build Jaeger (https://github.com/jaegertracing/jaeger, Apache-2.0) all-in-one, the real OTLP
# receiver of the tracing e2e test (tests/e2e/test_traces.py, started by e2e/jaeger_server.py).
# Built from the Go module proxy at the version pinned by this folder's go.mod/go.sum (made with
# `go get -tool github.com/jaegertracing/jaeger/cmd/jaeger@v1.75.0`: Jaeger's own go.mod cannot be
# `go install`ed by version) and cached under
#   ${XDG_CACHE_HOME:-~/.cache}/agentrun/jaeger/<hash>/jaeger
# where <hash> covers go.mod, go.sum and this script. A cached binary makes this a no-op.
# Prints the binary's path on stdout.
#
# Env: JAEGER_CACHE (cache root), GOMODCACHE/GOCACHE as usual.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
version="v1.75.0"
pkg="github.com/jaegertracing/jaeger/cmd/jaeger"

cache_root="${JAEGER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/agentrun/jaeger}"
hash="$(cd "$here" && cat go.mod go.sum build.sh | sha256sum | cut -c1-16)"
out_dir="$cache_root/$hash"
bin="$out_dir/jaeger"

if [[ -x "$bin" ]]; then
    echo "$bin"
    exit 0
fi

command -v go >/dev/null || { echo "jaeger/build.sh: go is not installed (need Go >= 1.26)" >&2; exit 1; }

mkdir -p "$out_dir"
tmp="$out_dir/jaeger.tmp.$$"
trap 'rm -f "$tmp"' EXIT

echo "jaeger/build.sh: building jaeger $version (several minutes on a cold cache) ..." >&2
start=$(date +%s)
(
    cd "$here"
    CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false" \
        nice -n 10 go build -trimpath -ldflags "-s -w" -o "$tmp" "$pkg"
)
mv -f "$tmp" "$bin"
trap - EXIT
echo "jaeger/build.sh: built $bin in $(( $(date +%s) - start ))s" >&2
echo "$bin"

#!/usr/bin/env bash
# Build versitygw (https://github.com/versity/versitygw, Apache-2.0), an independent
# S3 server in Go, used as the second S3 implementation (besides moto) in the
# checkpoint store's integration tests. Built from the Go module proxy at a pinned
# version with that module's own go.sum (`go install pkg@version`), cached under
#   ${XDG_CACHE_HOME:-~/.cache}/agentrun/versitygw/<hash>/versitygw
# where <hash> covers this script (and so the pinned version). A cached binary
# makes this a no-op. Prints the binary's path on stdout.
#
# Env: VERSITYGW_CACHE (cache root), GOMODCACHE/GOCACHE as usual.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
version="v1.8.0"
pkg="github.com/versity/versitygw/cmd/versitygw"

cache_root="${VERSITYGW_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/agentrun/versitygw}"
hash="$(cat "$here/build.sh" | sha256sum | cut -c1-16)"
out_dir="$cache_root/$hash"
bin="$out_dir/versitygw"

if [[ -x "$bin" ]]; then
    echo "$bin"
    exit 0
fi

command -v go >/dev/null || { echo "versitygw/build.sh: go is not installed (need Go >= 1.25)" >&2; exit 1; }

mkdir -p "$out_dir"
gobin="$(mktemp -d "$out_dir/gobin.XXXXXX")"
trap 'rm -rf "$gobin"' EXIT

echo "versitygw/build.sh: building versitygw $version (a few minutes on a cold cache) ..." >&2
start=$(date +%s)
GOBIN="$gobin" CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false" \
    go install -trimpath -ldflags "-s -w -X main.Version=$version" "$pkg@$version"
mv -f "$gobin/versitygw" "$bin"
echo "versitygw/build.sh: built $bin in $(( $(date +%s) - start ))s" >&2
echo "$bin"

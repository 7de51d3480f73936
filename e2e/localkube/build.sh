#!/usr/bin/env bash
# Build the localkube binary (etcd + kube-apiserver + kube-controller-manager +
# kubectl in one executable) and cache it under
#   ${XDG_CACHE_HOME:-~/.cache}/agentrun/localkube/<hash>/localkube
# where <hash> covers go.mod, go.sum, the Go sources and this script.
# A cached binary makes this a no-op. Prints the binary's path on stdout.
#
# Env: LOCALKUBE_CACHE (cache root), GOMODCACHE/GOCACHE as usual.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
k8s_version="v1.36.3"

cache_root="${LOCALKUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/agentrun/localkube}"
hash="$(cd "$here" && cat go.mod go.sum build.sh $(ls *.go | sort) | sha256sum | cut -c1-16)"
out_dir="$cache_root/$hash"
bin="$out_dir/localkube"

if [[ -x "$bin" ]]; then
    echo "$bin"
    exit 0
fi

command -v go >/dev/null || { echo "build.sh: go is not installed (need Go >= 1.26)" >&2; exit 1; }

mkdir -p "$out_dir"
tmp="$out_dir/localkube.tmp.$$"
trap 'rm -f "$tmp"' EXIT

major="${k8s_version#v}"; major="${major%%.*}"
minor="${k8s_version#v*.}"; minor="${minor%%.*}"
pkg="k8s.io/component-base/version"
ldflags="-s -w \
 -X $pkg.gitVersion=$k8s_version \
 -X $pkg.gitMajor=$major \
 -X $pkg.gitMinor=$minor \
 -X $pkg.gitTreeState=clean \
 -X $pkg.gitCommit=localkube-$hash \
 -X $pkg.buildDate=1970-01-01T00:00:00Z"

echo "build.sh: building localkube $k8s_version (this takes a while on a cold cache) ..." >&2
start=$(date +%s)
(
    cd "$here"
    CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false" \
        go build -trimpath -ldflags "$ldflags" -o "$tmp" .
)
mv -f "$tmp" "$bin"
trap - EXIT
echo "build.sh: built $bin in $(( $(date +%s) - start ))s" >&2
echo "$bin"

#!/usr/bin/env bash
# Build Kueue's controller manager (https://github.com/kubernetes-sigs/kueue, Apache-2.0)
# for the e2e tests that admit lap Jobs through the real Kueue (tests/e2e/test_kueue_cluster.py,
# started by e2e/kueue_server.py). Built from the Go module proxy at a pinned version with
# that module's own go.sum (`go install pkg@version`), and cached together with the module's
# CRDs and webhook manifests under
#   ${XDG_CACHE_HOME:-~/.cache}/agentrun/kueue/<hash>/{kueue,crds/*.yaml,webhook/manifests.yaml}
# where <hash> covers this script (and so the pinned version). A cached build makes this a
# no-op. Prints the cache directory on stdout.
#
# Env: KUEUE_CACHE (cache root), GOMODCACHE/GOCACHE as usual.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
version="v0.17.0"   # its go.mod says go 1.25.0: builds with the machine's Go (GOTOOLCHAIN=local)
module="sigs.k8s.io/kueue"
pkg="$module/cmd/kueue"

cache_root="${KUEUE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/agentrun/kueue}"
hash="$(sha256sum < "$here/build.sh" | cut -c1-16)"
out_dir="$cache_root/$hash"

if [[ -x "$out_dir/kueue" && -f "$out_dir/complete" ]]; then
    echo "$out_dir"
    exit 0
fi

command -v go >/dev/null || { echo "kueue/build.sh: go is not installed (need Go >= 1.25)" >&2; exit 1; }

mkdir -p "$out_dir"
tmp="$(mktemp -d "$out_dir/tmp.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

echo "kueue/build.sh: building kueue $version (minutes on a cold cache) ..." >&2
start=$(date +%s)
export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false"
GOBIN="$tmp/bin" nice -n 10 go install -trimpath \
    -ldflags "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$version" "$pkg@$version"

# The manifests come from the same module version, as the go command downloaded it.
src="$(go mod download -json "$module@$version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
[[ -d "$src/config/components/crd/bases" ]] || { echo "kueue/build.sh: no CRDs in $src" >&2; exit 1; }
mkdir -p "$tmp/crds" "$tmp/webhook"
cp "$src"/config/components/crd/bases/*.yaml "$tmp/crds/"
cp "$src/config/components/webhook/manifests.yaml" "$tmp/webhook/manifests.yaml"
chmod -R u+w "$tmp/crds" "$tmp/webhook"

rm -rf "$out_dir/crds" "$out_dir/webhook"
mv "$tmp/crds" "$tmp/webhook" "$out_dir/"
mv -f "$tmp/bin/kueue" "$out_dir/kueue"
echo "$version" > "$out_dir/complete"
echo "kueue/build.sh: built $out_dir/kueue in $(( $(date +%s) - start ))s" >&2
echo "$out_dir"

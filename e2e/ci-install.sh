#!/usr/bin/env bash
# Install what the e2e control plane needs on a fresh Debian machine and build
# (or reuse the cached) localkube, versitygw and kueue binaries. Called by .ci/run. Idempotent.
#
# Needs: Go >= 1.26 on PATH (the Go module proxy must be reachable on a cold
# module cache), Python >= 3.11 with pip. No Docker, no container runtime.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PYTHON="${PYTHON:-python3}"

# procps (ps/pgrep for debugging) and coreutils; the tests' pods run sh/sleep.
if ! command -v ps >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && apt-get install -y -qq procps >/dev/null
fi

"$PYTHON" -m pip install -q 'kubernetes>=30' 'moto[server]>=5' boto3 PyYAML pytest pytest-timeout

if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
    export PATH="/usr/local/go/bin:$PATH"
fi
if ! command -v go >/dev/null 2>&1; then
    echo "ci-install: Go is not installed; localkube needs Go >= 1.26 (e.g. the machine's /usr/local/go)" >&2
    exit 1
fi
gov="$(go env GOVERSION)"
case "$gov" in
    go1.2[6-9]*|go1.[3-9]*) ;;
    *) echo "ci-install: $gov is too old; localkube needs Go >= 1.26" >&2; exit 1 ;;
esac

start=$(date +%s)
bin="$("$here/localkube/build.sh")"
echo "ci-install: localkube ready in $(( $(date +%s) - start ))s: $bin ($("$bin" version))" >&2

# versitygw: the second S3 implementation of the checkpoint store's tests (tests/checkpoint),
# built from the Go module proxy and cached like localkube.
start=$(date +%s)
vgw="$("$here/versitygw/build.sh")"
echo "ci-install: versitygw ready in $(( $(date +%s) - start ))s: $vgw" >&2

# Kueue: the real queueing controller of tests/e2e/test_kueue_cluster.py (e2e/kueue_server.py),
# built from the Go module proxy and cached with its CRDs and webhook manifests.
start=$(date +%s)
kq="$("$here/kueue/build.sh")"
echo "ci-install: kueue ready in $(( $(date +%s) - start ))s: $kq" >&2
# Jaeger: the real OTLP receiver of the traces test (tests/e2e/test_traces.py), built from the Go
# module proxy and cached like localkube.
start=$(date +%s)
jgr="$("$here/jaeger/build.sh")"
echo "ci-install: jaeger ready in $(( $(date +%s) - start ))s: $jgr" >&2

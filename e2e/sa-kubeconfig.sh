#!/usr/bin/env bash
# Write a kubeconfig for a ServiceAccount using a TokenRequest token (kubectl create token).
# usage: e2e/sa-kubeconfig.sh NAMESPACE SA OUT   (cluster dir: $LOCALKUBE_DIR or .localkube)
set -euo pipefail
if [[ $# -ne 3 ]]; then echo "usage: $0 NAMESPACE SA OUT" >&2; exit 2; fi
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec "${PYTHON:-python3}" "$here/cluster.py" sa-kubeconfig --dir "${LOCALKUBE_DIR:-.localkube}" "$1" "$2" "$3"

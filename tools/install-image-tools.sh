#!/usr/bin/env bash
# Install what `make image` and the runc node need: mmdebstrap (Debian base rootfs), buildah (OCI
# image writer, no daemon), runc (runs the lap/operator containers of AGENTRUN_NODE=runc).
# Idempotent: does nothing when all three are on PATH. Debian/Ubuntu (apt-get), as root.
set -euo pipefail
need=()
for t in mmdebstrap buildah runc; do command -v "$t" >/dev/null 2>&1 || need+=("$t"); done
if [ ${#need[@]} -eq 0 ]; then
  echo "image tools present: $(runc --version | head -1); $(buildah --version); $(mmdebstrap --version)"
  exit 0
fi
command -v apt-get >/dev/null || { echo "install ${need[*]} with your package manager (no apt-get here)" >&2; exit 1; }
SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# uidmap/fuse-overlayfs are recommends of buildah that a root vfs build does not use
$SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
echo "installed ${need[*]}"

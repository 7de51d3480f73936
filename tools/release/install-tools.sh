#!/usr/bin/env bash
# Install what `make release` and its e2e test need beyond `make image`'s tools: skopeo (pushes the
# image's oci-archive to a registry) and Debian's docker-registry (the CNCF distribution registry,
# the local OCI registry of tests/e2e/test_release.py, started by e2e/registry_server.py with its own
# config). Idempotent: does nothing when both are on PATH. Debian/Ubuntu (apt-get), as root.
# The package's own service (port 5000) is not started by the install (policy-rc.d) and not used.
set -euo pipefail
need=()
command -v skopeo >/dev/null 2>&1 || need+=(skopeo)
command -v docker-registry >/dev/null 2>&1 || need+=(docker-registry)
if [ ${#need[@]} -eq 0 ]; then
  echo "release tools present: $(skopeo --version); $(docker-registry --version | head -1)"
  exit 0
fi
command -v apt-get >/dev/null || { echo "install ${need[*]} with your package manager (no apt-get here)" >&2; exit 1; }
SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
policy=""
if [ ! -e /usr/sbin/policy-rc.d ]; then  # no service start during the install
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
  $SUDO chmod 755 /usr/sbin/policy-rc.d
  policy=1
fi
trap '[ -z "$policy" ] || $SUDO rm -f /usr/sbin/policy-rc.d' EXIT
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
echo "installed ${need[*]}"

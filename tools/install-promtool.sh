#!/usr/bin/env bash
# Make promtool available (Debian's prometheus package) and print its path. Idempotent.
set -euo pipefail
if command -v promtool >/dev/null 2>&1; then command -v promtool; exit 0; fi
SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >&2
$SUDO apt-get install -y -qq --no-install-recommends prometheus >&2
# the package starts nothing we need; stop the server if the init system started it
command -v promtool

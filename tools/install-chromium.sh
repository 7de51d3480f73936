#!/usr/bin/env bash
# Install Debian's chromium for the inbox's browser tests (tests/e2e/test_inbox_browser.py drives it
# with Playwright from PyPI, executable_path=/usr/bin/chromium; Playwright's own browser download
# is never used). Idempotent: does nothing when chromium is on PATH. Prints its path.
set -euo pipefail
if path=$(command -v chromium || command -v chromium-browser); then
  echo "$path"; exit 0
fi
if [ "$(id -u)" != 0 ]; then SUDO=sudo; else SUDO=; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >&2
# the .debs are kept under ~/.cache (the browser is the heaviest download of a cold CI run)
archives="${XDG_CACHE_HOME:-$HOME/.cache}/agentrun/apt-archives"
mkdir -p "$archives/partial"
$SUDO apt-get install -y -qq --no-install-recommends -o Dir::Cache::Archives="$archives" chromium >&2
command -v chromium

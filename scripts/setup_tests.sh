#!/usr/bin/env bash
# Installs what the test suite needs on a fresh machine: the test extras and Debian's Chromium
# (the viewer and report tests drive a real headless browser through Playwright).
set -euo pipefail
python3 -m pip install -q torch==2.13.0
python3 -m pip install -q -e ".[test]"
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
fi

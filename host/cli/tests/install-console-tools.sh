#!/usr/bin/env bash
# Installs what the console's browser test (host/cli/tests/console.rs) drives: Debian's headless
# Chromium and its WebDriver server, chromedriver (the test talks WebDriver to it through the
# `fantoccini` crate). Quick and silent when both are there.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
source "$root/scripts/lib.sh"
apt_install chromium chromium-driver fonts-dejavu-core
chromedriver --version

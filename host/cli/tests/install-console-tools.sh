#!/usr/bin/env bash
# Installs what the console's browser test (host/cli/tests/slow/console/mod.rs) drives: Debian's headless
# Chromium and its WebDriver server, chromedriver (the test talks WebDriver to it directly), and
# the axe-core accessibility engine from npm (into target/node-tools/console/), which the test
# runs in the page. Quick and silent when all are there.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
source "$root/scripts/lib.sh"
apt_install chromium chromium-driver fonts-dejavu-core
chromedriver --version

axe="4.14.1"
prefix="$root/target/node-tools/console"
stamp="$prefix/.installed"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "axe-core=$axe" ]; then
    mkdir -p "$prefix"
    npm install --prefix "$prefix" --no-audit --no-fund --loglevel=error "axe-core@$axe"
    echo "axe-core=$axe" > "$stamp"
    echo "axe-core installed in $prefix"
fi

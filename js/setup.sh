#!/usr/bin/env bash
# Makes the JS host usable from this checkout: installs the pinned packages (npm ci, skipped when
# node_modules is already installed from this package-lock.json by this Node) and transpiles the
# guest with jco into gen/. Used by test.sh and scripts/bench.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

die() { echo "js/setup.sh: $*" >&2; exit 1; }
command -v node >/dev/null 2>&1 || die "node is not installed: Node.js 20 or newer is needed"
command -v npm >/dev/null 2>&1 || die "npm is not installed (it comes with Node.js)"
[ "$(node -p 'process.versions.node.split(".")[0]')" -ge 20 ] || die "Node.js $(node --version) is too old: 20 or newer is needed"

stamp="node_modules/.corral-stamp"
want="$(node -p 'process.version') $(sha256sum package-lock.json | cut -c1-16)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  npm ci --no-audit --no-fund --loglevel=error >/dev/null || die "npm ci failed"
  echo "$want" > "$stamp"
fi

node scripts/build.mjs


#!/usr/bin/env bash
# The JS host's tests (issue 8): installs the pinned packages (npm ci, skipped when node_modules
# is already installed from this package-lock.json by this Node), transpiles the guest with jco,
# and runs test/*.test.mjs with node:test: the corpus under the JS host, concurrency, deadline,
# fresh instances after traps, deny-all, validation, the component's imports, the README example
# and the types under `tsc --strict`. Quiet on success; on failure prints the test output.
# With CORRAL_BIN=path/to/corral, test/cross-host.test.mjs also runs each corpus script through
# `corral exec` (wasmtime) and compares the two reports.
# Exit status: 0 when every test passed, 1 otherwise.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

die() { echo "js/test.sh: $*" >&2; exit 1; }
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

log="$(mktemp)"
trap 'rm -f "$log"' EXIT
if ! node --test --test-concurrency=2 test/ >"$log" 2>&1; then
  grep -v '^# Subtest\|^ok ' "$log" >&2 || true
  die "tests failed"
fi

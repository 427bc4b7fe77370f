#!/usr/bin/env bash
# The JS host's tests: installs the pinned packages (npm ci, skipped when node_modules
# is already installed from this package-lock.json by this Node), transpiles the guest with jco,
# and runs test/*.test.mjs with node:test: the corpus under the JS host, concurrency, deadline,
# fresh instances after traps, deny-all, validation, the component's imports, the README example
# and the types under `tsc --strict`. Quiet on success; on failure prints the test output.
# With CORRAL_BIN=path/to/corral, test/cross-host.test.mjs also runs each corpus script through
# `corral exec` (wasmtime) and compares the two reports.
# Exit status: 0 when every test passed, 1 otherwise.
set -euo pipefail
die() { echo "js/test.sh: $*" >&2; exit 1; }
# CORRAL_BIN may be relative to where this was started from.
if [ -n "${CORRAL_BIN:-}" ]; then
  [ -x "$CORRAL_BIN" ] || die "CORRAL_BIN=$CORRAL_BIN is not an executable corral binary"
  CORRAL_BIN="$(realpath "$CORRAL_BIN")"
  export CORRAL_BIN
fi
cd "$(dirname "${BASH_SOURCE[0]}")"

bash ./setup.sh

log="$(mktemp)"
trap 'rm -f "$log"' EXIT
if ! node --test --test-concurrency=2 test/ >"$log" 2>&1; then
  grep -v '^# Subtest\|^ok ' "$log" >&2 || true
  die "tests failed"
fi

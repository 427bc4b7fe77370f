#!/usr/bin/env bash
# Installs the TypeScript compiler that corral-catalog's tests run (`tsc --strict --noEmit` on the
# rendered declarations) into target/node-tools/ at the repository root, from npm. Quick and
# silent when the pinned version is already there.
set -euo pipefail

version="5.9.3"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
prefix="$root/target/node-tools"
tsc="$prefix/node_modules/.bin/tsc"

if [ -x "$tsc" ] && [ "$("$tsc" --version 2>/dev/null)" = "Version $version" ]; then
    exit 0
fi
mkdir -p "$prefix"
npm install --prefix "$prefix" --no-audit --no-fund --loglevel=error "typescript@$version"
"$tsc" --version

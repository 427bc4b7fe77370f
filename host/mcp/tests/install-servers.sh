#!/usr/bin/env bash
# Installs the MCP servers corral-mcp's tests run against, from npm, into
# target/node-tools/mcp/ at the repository root: the reference servers `server-everything` and
# `server-filesystem`, and the TypeScript SDK the small test servers in tests/servers/ use.
# Quick and silent when the pinned versions are already there.
set -euo pipefail

everything="2026.8.31"
filesystem="2026.8.31"
sdk="1.32.2"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
prefix="$root/target/node-tools/mcp"
stamp="$prefix/.installed"
want="everything=$everything filesystem=$filesystem sdk=$sdk"

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    exit 0
fi
mkdir -p "$prefix"
npm install --prefix "$prefix" --no-audit --no-fund --loglevel=error \
    "@modelcontextprotocol/server-everything@$everything" \
    "@modelcontextprotocol/server-filesystem@$filesystem" \
    "@modelcontextprotocol/sdk@$sdk"
echo "$want" > "$stamp"
echo "MCP test servers installed in $prefix"
